"""Machinery of the op-comparison harness: the Case record, input generators and the checks.

A :class:`Case` is one row of the table in ``tests/test_ops.py``: a function
of tensors, a generator of NumPy inputs, an independent NumPy reference and
which inputs are differentiable. The checks run a case through any
:class:`modes.Runner`:

* ``check_forward``: the mode's outputs equal the reference (float32 and
  float64 inputs, with dtype preservation).
* ``check_gradient``: the mode's gradient of ``sum(f(x) * ct)`` (``ct`` a fixed
  random cotangent, passed as an input) equals central finite differences of
  the *NumPy reference* in float64: every element for small inputs, random
  directional derivatives for large ones.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import shapegrad as sg
from modes import Runner

Gen = Callable[[np.random.Generator], np.ndarray]

# Above this many differentiable elements, use directional derivatives instead of full FD.
FULL_FD_LIMIT = 64
N_DIRECTIONS = 3


@dataclass(frozen=True)
class Case:
    """One row of the op table.

    Attributes:
        name: unique test id.
        fn: function of tensors returning one Tensor.
        inputs: one generator per argument (float generators give float64 arrays).
        ref: NumPy reference, called with float64 (or int/bool) arrays.
        covers: primitive values (``"add"``) and public op names (``"conv2d"``) exercised.
        diff: which inputs are differentiated; None means every float input.
        grad: run the gradient check at all (False at non-differentiable points).
        rtol32 / atol32: forward tolerance in float32 (atol scaled by max |ref|).
        fd_step: finite-difference step (raise it for piecewise-linear-in-rounding ops).
        keeps_dtype: float outputs have the float inputs' dtype.
        skip_modes: mode name -> reason, for a mode that cannot run this case yet.
        ane_error: a pattern of the AneLoweringError the ANE lowering must raise (a dtype
            Core ML has no type for), or None: the ANE table tests compare values.
    """

    name: str
    fn: Callable[..., Any]
    inputs: Sequence[Gen]
    ref: Callable[..., Any]
    covers: tuple[str, ...]
    diff: tuple[bool, ...] | None = None
    grad: bool = True
    rtol32: float = 2e-4
    atol32: float = 2e-5
    fd_step: float = 1e-6
    keeps_dtype: bool = True
    skip_modes: Mapping[str, str] = field(default_factory=dict)
    ane_error: str | None = None

    def arrays(self) -> list[np.ndarray]:
        """The inputs, reproducible per case name."""
        rng = np.random.default_rng(zlib.crc32(self.name.encode()))
        return [np.asarray(gen(rng)) for gen in self.inputs]

    def diff_positions(self, arrays: Sequence[np.ndarray]) -> tuple[int, ...]:
        flags = self.diff if self.diff is not None else (True,) * len(arrays)
        return tuple(
            i
            for i, (a, f) in enumerate(zip(arrays, flags, strict=True))
            if f and a.dtype.kind == "f"
        )


# --- input generators -----------------------------------------------------------------


def normal(*shape: int) -> Gen:
    return lambda rng: rng.standard_normal(shape)


def uniform(lo: float, hi: float, *shape: int) -> Gen:
    return lambda rng: rng.uniform(lo, hi, shape)


def ints(lo: int, hi: int, *shape: int) -> Gen:
    return lambda rng: rng.integers(lo, hi, shape).astype(np.int32)


def bytes_(*shape: int) -> Gen:
    """uint8 values over the whole range 0..255."""
    return lambda rng: rng.integers(0, 256, shape).astype(np.uint8)


def nonzero_ints(*shape: int) -> Gen:
    """int32 values in -9..9 without 0 (divisors)."""
    return lambda rng: (rng.integers(1, 10, shape) * rng.choice([-1, 1], shape)).astype(np.int32)


def bools(*shape: int) -> Gen:
    return lambda rng: rng.random(shape) < 0.5


def fixed(value: Any) -> Gen:
    return lambda rng: np.array(value, dtype=np.float64)


def transposed(*shape: int) -> Gen:
    """A non-contiguous (transposed) array of ``shape``."""
    return lambda rng: rng.standard_normal(shape[::-1]).T


def strided(*shape: int) -> Gen:
    """A non-contiguous (every other element of the last axis) array of ``shape``."""
    return lambda rng: rng.standard_normal((*shape[:-1], 2 * shape[-1]))[..., ::2]


def signs(*shape: int) -> Gen:
    return lambda rng: np.where(rng.random(shape) < 0.5, -1.0, 1.0)


def distinct(*shape: int) -> Gen:
    """Normal values with no ties (a random permutation of a spread-out grid)."""

    def gen(rng: np.random.Generator) -> np.ndarray:
        n = int(np.prod(shape))
        return (rng.permutation(n) * 0.37 - n * 0.15 + rng.uniform(0, 0.01)).reshape(shape)

    return gen


# --- checks ---------------------------------------------------------------------------


def _cast_floats(arrays: Sequence[np.ndarray], dtype: type) -> list[np.ndarray]:
    return [a.astype(dtype) if a.dtype.kind == "f" else a for a in arrays]


def check_forward(case: Case, runner: Runner, dtype: type) -> None:
    """Outputs of ``case`` under ``runner`` with float inputs in ``dtype`` vs the reference."""
    arrays = _cast_floats(case.arrays(), dtype)
    (got,) = runner.call(case.fn, arrays)
    want = np.asarray(case.ref(*_cast_floats(arrays, np.float64)))
    assert got.shape == want.shape, f"{case.name}: shape {got.shape} != reference {want.shape}"
    if want.dtype.kind == "b" or want.dtype.kind in "iu":
        assert got.dtype == want.dtype, f"{case.name}: dtype {got.dtype} != reference {want.dtype}"
        np.testing.assert_array_equal(got, want)
        return
    if case.keeps_dtype:
        assert got.dtype == np.dtype(dtype), f"{case.name}: dtype {got.dtype} != {dtype}"
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    if dtype == np.float64:
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11 * scale)
    else:
        np.testing.assert_allclose(got, want, rtol=case.rtol32, atol=case.atol32 * scale)


def cotangent_for(case: Case, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """A fixed random cotangent shaped like the reference output."""
    shape = np.shape(case.ref(*arrays))
    rng = np.random.default_rng(zlib.crc32(case.name.encode()) + 1)
    return rng.standard_normal(shape)


def _objective(case: Case, arrays: Sequence[np.ndarray], ct: np.ndarray) -> Callable[..., float]:
    def value(*xs: np.ndarray) -> float:
        return float(np.sum(np.asarray(case.ref(*xs), dtype=np.float64) * ct))

    return value


def _numeric_grad(
    f: Callable[..., float], arrays: list[np.ndarray], pos: int, step: float
) -> np.ndarray:
    """Central differences of ``f`` in every element of ``arrays[pos]``."""
    base = arrays[pos]
    result = np.zeros(base.shape)
    for index in np.ndindex(base.shape):
        hi, lo = base.copy(), base.copy()
        hi[index] += step
        lo[index] -= step
        args_hi = [hi if i == pos else a for i, a in enumerate(arrays)]
        args_lo = [lo if i == pos else a for i, a in enumerate(arrays)]
        result[index] = (f(*args_hi) - f(*args_lo)) / (2 * step)
    return result


def _directional(
    f: Callable[..., float], arrays: list[np.ndarray], dirs: dict[int, np.ndarray], step: float
) -> float:
    hi = [a + step * dirs[i] if i in dirs else a for i, a in enumerate(arrays)]
    lo = [a - step * dirs[i] if i in dirs else a for i, a in enumerate(arrays)]
    return (f(*hi) - f(*lo)) / (2 * step)


def analytic_grads(
    case: Case, runner: Runner, arrays: list[np.ndarray], ct: np.ndarray, argnums: tuple[int, ...]
) -> list[np.ndarray]:
    """The mode's gradient of ``sum(case.fn(*xs) * ct)`` (``ct`` passed as the last input)."""

    def scalar(*args: sg.Tensor) -> sg.Tensor:
        *xs, cot = args
        return sg.sum(case.fn(*xs) * cot)

    return runner.grad(scalar, [*arrays, ct], argnums)


def check_gradient(case: Case, runner: Runner) -> None:
    """Gradients under ``runner`` vs float64 central differences of the NumPy reference."""
    arrays = _cast_floats(case.arrays(), np.float64)
    argnums = case.diff_positions(arrays)
    assert argnums, f"{case.name}: no differentiable input; set grad=False"
    ct = cotangent_for(case, arrays)
    got = analytic_grads(case, runner, arrays, ct, argnums)
    f = _objective(case, arrays, ct)
    for g, pos in zip(got, argnums, strict=True):
        assert g.shape == arrays[pos].shape, f"{case.name}: grad shape {g.shape} for input {pos}"
        assert g.dtype == np.float64, f"{case.name}: grad dtype {g.dtype}"
    n_elements = sum(arrays[pos].size for pos in argnums)
    if n_elements <= FULL_FD_LIMIT:
        for g, pos in zip(got, argnums, strict=True):
            want = _numeric_grad(f, arrays, pos, case.fd_step)
            scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
            np.testing.assert_allclose(
                g, want, rtol=1e-5, atol=1e-6 * scale, err_msg=f"{case.name}: input {pos}"
            )
        return
    rng = np.random.default_rng(7)
    for _ in range(N_DIRECTIONS):
        dirs = {pos: rng.standard_normal(arrays[pos].shape) for pos in argnums}
        want = _directional(f, arrays, dirs, case.fd_step)
        have = sum(float(np.sum(g * dirs[pos])) for g, pos in zip(got, argnums, strict=True))
        assert np.isclose(have, want, rtol=1e-5, atol=1e-6 * max(1.0, abs(want))), (
            f"{case.name}: directional derivative {have} != finite difference {want}"
        )
