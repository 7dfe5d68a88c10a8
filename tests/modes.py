"""Execution modes for the op-comparison harness (tests/test_ops.py).

Interface
---------
A mode is a :class:`Runner` registered in ``MODES`` under its name. It has two
functions; both take plain NumPy arrays and return plain NumPy arrays, so the
case table never knows how a mode runs:

``call(fn, args) -> list[np.ndarray]``
    Run ``fn`` (a function of tensors returning a Tensor or a tuple of them)
    on ``args`` (NumPy arrays; each becomes a tensor of the same dtype, int64
    becoming int32) and return the outputs as a flat list of arrays.

``grad(fn, args, argnums) -> list[np.ndarray]``
    ``fn`` returns a *scalar*; return its gradient with respect to each
    argument position in ``argnums``, in that order, as arrays.

``unavailable() -> str | None`` (optional)
    A reason to skip the mode on this machine ("no C compiler"), or None.

Adding a mode is one entry, e.g. the compiled NumPy backend::

    MODES["numpy"] = Runner(
        "numpy",
        call=lambda fn, args: outputs(sg.compile(fn, backend="numpy")(*as_tensors(args))),
        grad=lambda fn, args, argnums: outputs(
            sg.compile(sg.grad(fn, argnums=argnums), backend="numpy")(*as_tensors(args))
        ),
    )

The harness builds the scalar functions it differentiates itself
(``sum(f(x) * cotangent)`` with the cotangent passed as the last argument), so
a compiled mode sees the cotangent as an input, never as a baked constant.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import shapegrad as sg

Fn = Callable[..., Any]
Arrays = list[np.ndarray]


def as_tensors(args: Sequence[np.ndarray]) -> list[sg.Tensor]:
    """Eager tensors with the dtypes of ``args`` (int64 arrays become int32)."""
    return [sg.tensor(a) for a in args]


def outputs(result: Any) -> Arrays:
    """Flatten a Tensor / tuple / list of tensors into NumPy arrays."""
    if isinstance(result, sg.Tensor):
        return [np.asarray(result.numpy())]
    if isinstance(result, tuple | list):
        return [a for item in result for a in outputs(item)]
    raise TypeError(f"expected tensors from the function, got {type(result).__name__}")


def _never() -> str | None:
    return None


@dataclass(frozen=True)
class Runner:
    """One way of executing shapegrad functions; see the module docstring."""

    name: str
    call: Callable[[Fn, Sequence[np.ndarray]], Arrays]
    grad: Callable[[Fn, Sequence[np.ndarray], tuple[int, ...]], Arrays]
    unavailable: Callable[[], str | None] = field(default=_never)


def _eager_call(fn: Fn, args: Sequence[np.ndarray]) -> Arrays:
    return outputs(fn(*as_tensors(args)))


def _eager_grad(fn: Fn, args: Sequence[np.ndarray], argnums: tuple[int, ...]) -> Arrays:
    return outputs(sg.grad(fn, argnums=argnums)(*as_tensors(args)))


MODES: dict[str, Runner] = {
    "eager": Runner("eager", call=_eager_call, grad=_eager_grad),
}

# The compiled NumPy reference backend (trace -> passes -> node-by-node NumPy).
MODES["numpy"] = Runner(
    "numpy",
    call=lambda fn, args: outputs(sg.compile(fn, backend="numpy")(*as_tensors(args))),
    grad=lambda fn, args, argnums: outputs(
        sg.compile(sg.grad(fn, argnums=argnums), backend="numpy")(*as_tensors(args))
    ),
)


def _c_unavailable() -> str | None:
    from shapegrad.backends.c import CBackend

    ok, reason = CBackend().is_available()
    return None if ok else reason


MODES["c"] = Runner(
    "c",
    call=lambda fn, args: outputs(sg.compile(fn, backend="c")(*as_tensors(args))),
    grad=lambda fn, args, argnums: outputs(
        sg.compile(sg.grad(fn, argnums=argnums), backend="c")(*as_tensors(args))
    ),
    unavailable=_c_unavailable,
)


def _c_plain() -> Any:
    """The C target with its CPU-specific stages off: a target can switch them off and
    every op still computes the same values."""
    from shapegrad.compiler.target import C_TARGET

    return C_TARGET.replace(
        batch_fusion=False,
        row_form=False,
        fuse_epilogues=False,
        skip_stages=frozenset({"hoist_bounds_checks"}),
    )


MODES["c_plain"] = Runner(
    "c_plain",
    call=lambda fn, args: outputs(
        sg.compile(fn, backend="c", target=_c_plain())(*as_tensors(args))
    ),
    grad=lambda fn, args, argnums: outputs(
        sg.compile(sg.grad(fn, argnums=argnums), backend="c", target=_c_plain())(*as_tensors(args))
    ),
    unavailable=_c_unavailable,
)


def _cuda_unavailable() -> str | None:
    from shapegrad.backends.cuda.driver import availability

    ok, reason = availability()
    return None if ok else f"no GPU: {reason}"


MODES["cuda"] = Runner(
    "cuda",
    call=lambda fn, args: outputs(sg.compile(fn, backend="cuda")(*as_tensors(args))),
    grad=lambda fn, args, argnums: outputs(
        sg.compile(sg.grad(fn, argnums=argnums), backend="cuda")(*as_tensors(args))
    ),
    unavailable=_cuda_unavailable,
)
