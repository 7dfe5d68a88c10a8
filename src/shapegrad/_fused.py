"""``eager_kernel``: a composite that runs as one native call in eager mode.

A composite (``conv2d``, ``layer_norm``, ``softmax``, ...) is written once against the
primitives; eagerly, each of its primitives is one NumPy call and one tape node, and
its VJP another dozen. Marked with :func:`eager_kernel`, an eager call asks the kernel
provider (``ops/kernels.py``; filled by ``jit/eager_kernels.py``) for the composite
compiled at these operand types and static arguments: the forward is one native call and
the output one tape node, a custom-VJP marker (``autodiff.CustomVjpCall``) whose rule is
the compiled VJP, another native call. Whenever the provider declines (no provider,
kernels off, traced or batched operands, a nested ``grad`` that must record the
backward, ``check_numerics``, small operands, an op not seen often enough) the composite
runs as written: NumPy stays the reference and the semantics are the composite's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar

import numpy as np

from shapegrad.autodiff import CustomVjpCall, vjp
from shapegrad.dtypes import ALL_DTYPES, DType, bool_, float32, float64, int32
from shapegrad.ops import kernels
from shapegrad.ops.eager import EAGER, STATE
from shapegrad.ops.protocol import AVal, Prim
from shapegrad.tensor import TapeNode, Tensor

F = TypeVar("F", bound=Callable[..., Any])

# Operands of these types only: float16/bfloat16 round each primitive's result in eager
# code, which one fused kernel would not reproduce op for op.
KERNEL_DTYPES = frozenset({float32.name, float64.name, int32.name, bool_.name})
# A call whose largest operand is smaller stays on NumPy: there the composite's few
# microseconds per primitive are no worse than a native call's, and the small tensors of
# unit tests never pay a compile.
MIN_ELEMENTS = 2048
_DTYPE_OF: dict[Any, DType] = {np.dtype(d.numpy): d for d in ALL_DTYPES}
NAMES: set[str] = set()  # every composite marked eager_kernel (tests check each one)


class _Slot:
    """A tensor operand's place in the call (the template a kernel is traced from)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Seq:
    """A list or tuple argument holding tensors (an optimizer's leaves), as a template."""

    __slots__ = ("entries", "kind")

    def __init__(self, kind: type, entries: list[Any]) -> None:
        self.kind, self.entries = kind, entries


def _fill(entry: Any, operands: Sequence[Any]) -> Any:
    """A template entry with the operands in its tensors' places."""
    kind = type(entry)
    if kind is _Slot:
        return operands[entry.index]
    if kind is _Seq:
        return entry.kind(_fill(e, operands) for e in entry.entries)
    return entry


def eager_kernel(name: str) -> Callable[[F], F]:
    """Run the decorated composite as one native kernel (forward and VJP) in eager mode.

    ``name`` names the composite in the kernel cache key (with the operand types and the
    static arguments). Tensor arguments (also inside lists and tuples) become kernel
    operands; every other argument must be static data (None, bool, int, float, str, a
    hashable frozen dataclass such as an optimizer), else the call runs as written. A
    composite with several outputs (a pytree) runs as a kernel only where no tape records
    it (an optimizer update); one output is one tape node whose VJP is a kernel too.
    """

    def decorate(fn: F) -> F:
        NAMES.add(name)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            provider = kernels.provider()
            if provider is not None and STATE.grad_depth <= 1 and not STATE.check_numerics:
                out = _call(provider, name, fn, args, kwargs)
                if out is _COMPILING:  # as written, without kernels of the composites inside
                    with kernels.enabled(False):  # (they would be compiled for nothing)
                        return fn(*args, **kwargs)
                if out is not None:
                    return out
            return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


_UNKEYABLE = object()
_COMPILING = object()  # _call's answer while the call's kernel is being compiled


def _static(value: Any) -> Any:
    """A hashable, type-exact key of static argument ``value`` (``_UNKEYABLE`` if none):
    ``1``, ``1.0`` and ``True`` are equal in Python but not as arguments."""
    kind = type(value)
    if value is None or kind is int or kind is bool or kind is str:
        return (kind, value)
    if kind is float:
        return (kind, repr(value))  # NaN keys equal to themselves
    params = getattr(kind, "__dataclass_params__", None)
    if params is not None and params.frozen:  # an optimizer's settings: equal by value
        try:
            hash(value)
        except TypeError:
            return _UNKEYABLE
        return (kind, value)
    return _UNKEYABLE


def _operand(value: Any, tensors: list[Tensor], parts: list[Hashable]) -> Any:
    """``value``'s template entry (a ``_Slot`` for a tensor, a ``_Seq`` for a list or
    tuple), its key parts appended; ``_UNKEYABLE`` when the call cannot run as a kernel."""
    kind = type(value)
    if kind is Tensor:
        payload = value._payload
        if value._ops is not EAGER or type(payload) is not np.ndarray:
            return _UNKEYABLE  # traced, batched (vmap) or an unusual payload
        aval = value.aval
        if aval.dtype.name not in KERNEL_DTYPES:
            return _UNKEYABLE
        parts.append((aval.shape, aval.dtype.name))
        tensors.append(value)
        return _Slot(len(tensors) - 1)
    if kind is tuple or kind is list:
        parts.append((kind, len(value)))
        entries = []
        for item in value:
            entry = _operand(item, tensors, parts)
            if entry is _UNKEYABLE:
                return _UNKEYABLE
            entries.append(entry)
        return _Seq(kind, entries)
    key = _static(value)
    if key is _UNKEYABLE:
        return _UNKEYABLE
    parts.append(key)
    return value


def _call(
    provider: kernels.KernelProvider,
    name: str,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> Any:
    """``fn(*args, **kwargs)`` through the provider's kernel, or None (run it as written), or
    ``_COMPILING`` (run it as written with kernels off: its own is being compiled)."""
    tensors: list[Tensor] = []
    parts: list[Hashable] = [name, fn.__module__, len(args)]
    template = []
    for a in args:
        entry = _operand(a, tensors, parts)
        if entry is _UNKEYABLE:
            return None
        template.append(entry)
    kw_template = {}
    for k in sorted(kwargs):
        parts.append(k)
        entry = _operand(kwargs[k], tensors, parts)
        if entry is _UNKEYABLE:
            return None
        kw_template[k] = entry
    if not tensors or max(t.size for t in tensors) < MIN_ELEMENTS:
        return None

    def pure(*operands: Tensor) -> Any:
        """The composite as a function of its tensor operands alone (no data captured)."""
        call_args = [_fill(e, operands) for e in template]
        call_kwargs = {k: _fill(e, operands) for k, e in kw_template.items()}
        return fn(*call_args, **call_kwargs)

    tracked, needs = False, None
    if STATE.grad_enabled:
        marks = [t._leaf or t._tape is not None for t in tensors]
        if True in marks:  # needs: the operands a backward pass will likely differentiate
            tracked = True
            floats = [t._payload.dtype.kind == "f" for t in tensors]
            needs = tuple([m and f for m, f in zip(marks, floats, strict=True)])
    key = tuple(parts)
    kernel = provider.composite(key, pure, [t.aval for t in tensors], name, needs)
    if kernel is None:
        return _COMPILING if provider.compiling(key, needs) else None
    if tracked and not kernel.single:
        return None  # several outputs: one tape node cannot carry them; run it as written
    arrays = [t._payload for t in tensors]
    values = kernel.forward(arrays)
    outs = [Tensor(EAGER, v, AVal(tuple(v.shape), _DTYPE_OF[v.dtype])) for v in values]
    if not kernel.single:
        return kernel.rebuild(outs)
    (out,) = outs
    if tracked:

        def rule(ct: Tensor, needs: Sequence[bool]) -> list[Tensor | None]:
            assert kernel is not None
            if not STATE.grad_enabled and type(ct._payload) is np.ndarray:
                cts = kernel.backward(arrays, ct._payload, tuple(needs))
                if cts is not None:
                    return [
                        None if c is None else Tensor(EAGER, c, t.aval)
                        for c, t in zip(cts, tensors, strict=True)
                    ]
            return _python_vjp(pure, tensors, ct, needs)

        call = CustomVjpCall(inputs=tuple(tensors), rule=rule, name=name)
        out._tape = TapeNode(Prim.STOP_GRADIENT, tuple(tensors), {"custom_vjp": call})
    return out


def _python_vjp(
    pure: Callable[..., Any], tensors: list[Tensor], ct: Tensor, needs: Sequence[bool]
) -> list[Tensor | None]:
    """The composite's VJP primitive by primitive (recorded when an outer ``grad`` needs
    it): the forward runs again, on NumPy, from the same operands. Also the VJP of a
    kernel whose VJP kernel is still compiling (or failed to compile)."""
    wanted = [i for i, need in enumerate(needs) if need]

    def part(*needed: Tensor) -> Any:
        operands = list(tensors)
        for i, t in zip(wanted, needed, strict=True):
            operands[i] = t
        return pure(*operands)

    previous = STATE.grad_enabled
    # The forward is recorded for its pullback even in a plain backward pass (which runs
    # with recording off): unrecorded, the pullback would see constants and give zeros.
    STATE.grad_enabled = True
    try:
        with kernels.enabled(False):
            _, pull = vjp(part, *[tensors[i] for i in wanted])
    finally:
        STATE.grad_enabled = previous
    with kernels.enabled(False):
        grads = pull(ct)
    result: list[Tensor | None] = [None] * len(tensors)
    for i, g in zip(wanted, grads, strict=True):
        result[i] = g
    return result
