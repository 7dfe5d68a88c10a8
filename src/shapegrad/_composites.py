"""More composite ops (issue 25): activations, boolean and norm reductions, triangles and
array rearrangements, written once against the primitives and ``functional``.

Every op here runs eagerly and compiles unchanged (C, CUDA, NumPy, ANE) because it only
binds existing primitives; gradients come from their VJP rules. Index tables (flip,
repeat, roll) are host constants computed from static shapes, so nothing here branches on
data.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence

import numpy as np

from shapegrad import functional as F
from shapegrad._fused import eager_kernel
from shapegrad.dtypes import DTypeError, DTypeLike, bfloat16, bool_, float16, float32, int32, uint8
from shapegrad.ops import prims as p
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt, normalize_axes, normalize_axis
from shapegrad.tensor import Tensor

Axis = int | Sequence[int] | None


def _float(op: str, x: Tensor) -> Tensor:
    x = p.as_tensor(x, op)
    if not x.dtype.is_float:
        raise DTypeError(f"{op}: needs a float tensor, got {x.dtype}; cast it with .astype()")
    return x


def _number(op: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise ValueError(f"{op}: {name} must be a number, got {value!r}")
    return float(value)


# --- activations ----------------------------------------------------------------------


@eager_kernel("silu")
def silu(x: Tensor) -> Tensor:
    """SiLU (swish): ``x * sigmoid(x)``.

    Example:
        >>> round(sg.silu(sg.tensor(1.0)).item(), 4)
        0.7311
    """
    x = _float("silu", x)
    # sg.sigmoid's tanh form rounds to 0 below about -17 in float32; exp(-|x|) / (1 + ...)
    # keeps the left tail (silu(-30) = -2.8e-12, as in PyTorch) and never overflows.
    e = F.exp(-F.abs(x))
    return x * F.where(x >= 0.0, 1.0 / (e + 1.0), e / (e + 1.0))


def _log1p(u: Tensor) -> Tensor:
    """log(1 + u) for ``u >= 0``, accurate for tiny ``u`` (Goldberg: ``log(1+u) * u / ((1+u) - 1)``
    cancels the rounding of ``1 + u``); ``u`` itself where ``1 + u`` rounds to 1."""
    one_plus = u + 1.0
    rounded = one_plus - 1.0
    exact = rounded == 0.0
    ratio = u / F.where(exact, 1.0, rounded)
    return F.where(exact, u, F.log(one_plus) * ratio)


def softplus(x: Tensor, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, PyTorch's semantics: linear (``x``) where
    ``beta * x > threshold``. Computed as ``max(z, 0) + log1p(exp(-|z|))``: no overflow.

    Example:
        >>> round(sg.softplus(sg.tensor(0.0)).item(), 4)
        0.6931
    """
    x = _float("softplus", x)
    beta = _number("softplus", "beta", beta)
    threshold = _number("softplus", "threshold", threshold)
    if beta == 0.0:
        raise ValueError("softplus: beta must be non-zero, got 0")
    z = x * beta
    smooth = (F.maximum(z, 0.0) + _log1p(F.exp(-F.abs(z)))) / beta
    return F.where(z > threshold, x, smooth)


def elu(x: Tensor, alpha: float = 1.0) -> Tensor:
    """ELU: ``x`` where ``x > 0``, else ``alpha * (exp(x) - 1)``.

    Example:
        >>> round(sg.elu(sg.tensor(-1.0)).item(), 4)
        -0.6321
    """
    x = _float("elu", x)
    alpha = _number("elu", "alpha", alpha)
    # exp of min(x, 0): the unused branch never overflows (an inf there would make the
    # where's gradient NaN).
    return F.where(x > 0.0, x, (F.exp(F.minimum(x, 0.0)) - 1.0) * alpha)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """``x`` where ``x > 0``, else ``negative_slope * x`` (gradient ``negative_slope`` at 0,
    as in PyTorch).

    Example:
        >>> sg.leaky_relu(sg.tensor([-2.0, 3.0]), 0.5).tolist()
        [-1.0, 3.0]
    """
    x = _float("leaky_relu", x)
    slope = _number("leaky_relu", "negative_slope", negative_slope)
    return F.where(x > 0.0, x, x * slope)


# --- reductions -----------------------------------------------------------------------


def argmin(x: Tensor, axis: int = -1, *, dtype: DTypeLike = "int32") -> Tensor:
    """Index of the first minimum along ``axis`` (int32, or ``dtype=sg.int64``; not
    differentiable).

    Example:
        >>> sg.argmin(sg.tensor([[3.0, 1.0, 1.0], [0.0, 2.0, -1.0]]), axis=1).tolist()
        [1, 2]
    """
    x = p.as_tensor(x, "argmin")
    axis = normalize_axis("argmin", axis, x.ndim)
    n = x.shape[axis]
    if n == 0:
        raise ShapeError("argmin", f"axis {axis} of {fmt(x.shape)} is empty: no minimum")
    best = F.stop_gradient(F.min(x, axis=axis, keepdims=True))
    positions = p.iota(x.shape, axis, F.index_dtype("argmin", dtype), like=x)
    candidates = F.where(x == best, positions, n)
    return F.min(candidates, axis=axis)


def _truth(op: str, x: Tensor) -> Tensor:
    x = p.as_tensor(x, op)
    return x if x.dtype == bool_ else p.binary(Prim.NE, x, 0.0 if x.dtype.is_float else 0)


def _bool_reduce(op: str, x: Tensor, axis: Axis, keepdims: bool, empty: bool) -> Tensor:
    truth = _truth(op, x)
    axes = normalize_axes(op, axis, truth.ndim)
    kept = [1 if i in axes else d for i, d in enumerate(truth.shape)]
    shape = kept if keepdims else [d for i, d in enumerate(truth.shape) if i not in axes]
    if builtins.any(truth.shape[a] == 0 for a in axes):  # NumPy: any([]) False, all([]) True
        return p.full(shape, empty, bool_, like=truth)
    flags = p.cast(truth if op == "any" else p.binary(Prim.EQ, truth, False), int32)
    # any: some flag of ``truth`` is 1; all: no flag of ``not truth`` is 1.
    result = p.binary(Prim.EQ, p.reduce_max(flags, axes), 1 if op == "any" else 0)
    return p.reshape(result, shape)


def all(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """True where every element along ``axis`` is true (non-zero); ``np.all``.

    Example:
        >>> sg.all(sg.tensor([[True, False], [True, True]]), axis=1).tolist()
        [False, True]
    """
    return _bool_reduce("all", x, axis, keepdims, True)


def any(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """True where some element along ``axis`` is true (non-zero); ``np.any``.

    Example:
        >>> sg.any(sg.tensor([[0.0, 0.0], [0.0, 2.0]]), axis=1).tolist()
        [False, True]
    """
    return _bool_reduce("any", x, axis, keepdims, False)


def norm(
    x: Tensor, ord: float | str | None = None, axis: Axis = None, keepdims: bool = False
) -> Tensor:
    """Vector p-norm over ``axis`` (all axes when None), or the Frobenius norm.

    ``ord``: None or 2 (Euclidean; ``"fro"`` over two axes or all), 1, any ``p > 0``,
    ``inf``/``-inf`` (max/min of ``|x|``) or 0 (count of non-zeros), as
    ``torch.linalg.vector_norm``; with ``axis=None`` the tensor is flattened. Matrix norms
    other than Frobenius (nuclear, spectral, induced 1/inf) are not supported.
    Example:
        >>> sg.norm(sg.tensor([[3.0, 4.0], [6.0, 8.0]]), axis=1).tolist()
        [5.0, 10.0]
    """
    x = _float("norm", x)
    axes = normalize_axes("norm", axis, x.ndim)
    if ord == "fro":
        if axis is not None and len(axes) != 2:
            raise ValueError(f"norm: ord='fro' needs two axes, got axis={axis!r}")
        ord = None
    if isinstance(ord, str) or (
        ord is not None and _number("norm", "ord", ord) < 0 and ord != -math.inf
    ):
        raise ValueError(
            f"norm: ord must be None, 'fro', inf, -inf, 0 or a number > 0, got {ord!r}"
        )
    if ord is None or ord == 2:
        return _root(F.sum(x * x, axis=axes, keepdims=keepdims), 2.0)
    if ord == 1:
        return F.sum(F.abs(x), axis=axes, keepdims=keepdims)
    if ord == math.inf:
        return F.max(F.abs(x), axis=axes, keepdims=keepdims)
    if ord == -math.inf:
        return F.min(F.abs(x), axis=axes, keepdims=keepdims)
    if ord == 0:
        return F.sum(p.cast(x != 0.0, x.dtype), axis=axes, keepdims=keepdims)
    power = float(ord)
    return _root(F.sum(F.pow(F.abs(x), power), axis=axes, keepdims=keepdims), power)


def _root(total: Tensor, power: float) -> Tensor:
    """``total ** (1 / power)`` whose gradient is 0 (PyTorch's) where ``total`` is 0: the
    root's derivative is infinite there, and inf * 0 would make the norm of a zero vector
    a NaN gradient (gradient clipping of all-zero gradients)."""
    positive = total > 0.0
    safe = F.where(positive, total, 1.0)
    root = F.sqrt(safe) if power == 2.0 else F.pow(safe, 1.0 / power)
    return F.where(positive, root, 0.0)


# --- triangles and rearrangements ------------------------------------------------------


def _zero(x: Tensor) -> float | int | bool:
    return False if x.dtype == bool_ else (0.0 if x.dtype.is_float else 0)


def _triangle(op: str, x: Tensor, k: int) -> Tensor:
    x = p.as_tensor(x, op)
    if x.ndim < 2:
        raise ShapeError(
            op, f"needs a tensor of rank >= 2 (a matrix or a batch), got {fmt(x.shape)}"
        )
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"{op}: diagonal offset k must be an int, got {k!r}")
    rows = p.iota(x.shape, x.ndim - 2, int32, like=x)
    cols = p.iota(x.shape, x.ndim - 1, int32, like=x)
    offset = cols - rows
    keep = offset <= k if op == "tril" else offset >= k
    return F.where(keep, x, _zero(x))


def tril(x: Tensor, k: int = 0) -> Tensor:
    """Lower triangle of the last two axes (entries with ``col - row <= k``); ``np.tril``.

    Example:
        >>> sg.tril(sg.ones((2, 3)), k=1).tolist()
        [[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    """
    return _triangle("tril", x, k)


def triu(x: Tensor, k: int = 0) -> Tensor:
    """Upper triangle of the last two axes (entries with ``col - row >= k``); ``np.triu``.

    Example:
        >>> sg.triu(sg.ones((2, 3)), k=1).tolist()
        [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0]]
    """
    return _triangle("triu", x, k)


def _take(x: Tensor, index: np.ndarray, axis: int) -> Tensor:
    return p.gather(x, p.constant(index.astype(np.int32), int32, like=x), axis)


def flip(x: Tensor, axis: Axis = None) -> Tensor:
    """Reverse the order along ``axis`` (all axes when None); ``np.flip``.

    Example:
        >>> sg.flip(sg.tensor([[1, 2], [3, 4]]), axis=1).tolist()
        [[2, 1], [4, 3]]
    """
    x = p.as_tensor(x, "flip")
    for a in normalize_axes("flip", axis, x.ndim):
        if x.shape[a] > 1:
            x = _take(x, np.arange(x.shape[a] - 1, -1, -1), a)
    return x


def _ints(op: str, name: str, value: int | Sequence[int]) -> tuple[int, ...]:
    items = (value,) if isinstance(value, int) else tuple(value)
    if builtins.any(isinstance(v, bool) or not isinstance(v, int | np.integer) for v in items):
        raise ValueError(f"{op}: {name} must be an int or a sequence of ints, got {value!r}")
    return tuple(int(v) for v in items)


def roll(x: Tensor, shift: int | Sequence[int], axis: int | Sequence[int] | None = None) -> Tensor:
    """Shift elements along ``axis`` cyclically (flattened when None); ``np.roll``.

    Example:
        >>> sg.roll(sg.tensor([1, 2, 3, 4]), 1).tolist()
        [4, 1, 2, 3]
    """
    x = p.as_tensor(x, "roll")
    shifts = _ints("roll", "shift", shift)
    if axis is None:
        if len(shifts) != 1:
            raise ValueError(f"roll: one shift needs axis=None, got shift={shift!r}")
        flat = p.reshape(x, [x.size])
        return p.reshape(roll(flat, shifts[0], 0), x.shape)
    axes = [normalize_axis("roll", a, x.ndim) for a in _ints("roll", "axis", axis)]
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: shift {shift!r} and axis {axis!r} differ in length")
    for s, a in zip(shifts, axes, strict=True):
        n = x.shape[a]
        if n and s % n:
            x = _take(x, (np.arange(n) - s) % n, a)
    return x


def repeat(x: Tensor, repeats: int | Sequence[int], axis: int | None = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``axis`` (flattened when None);
    ``np.repeat`` (``torch.repeat_interleave``). ``repeats`` is an int or one per element.

    Example:
        >>> sg.repeat(sg.tensor([1, 2]), 2).tolist()
        [1, 1, 2, 2]
    """
    x = p.as_tensor(x, "repeat")
    if axis is None:
        x, axis = p.reshape(x, [x.size]), 0
    axis = normalize_axis("repeat", axis, x.ndim)
    counts = _ints("repeat", "repeats", repeats)
    n = x.shape[axis]
    if len(counts) not in (1, n) or builtins.any(c < 0 for c in counts):
        raise ValueError(
            f"repeat: repeats must be one int >= 0 or {n} of them (axis {axis} of "
            f"{fmt(x.shape)}), got {repeats!r}"
        )
    return _take(x, np.repeat(np.arange(n), counts if len(counts) == n else counts[0]), axis)


def tile(x: Tensor, reps: int | Sequence[int]) -> Tensor:
    """Repeat the whole tensor ``reps`` times per axis; ``np.tile`` (``torch.Tensor.tile``).

    Example:
        >>> sg.tile(sg.tensor([1, 2]), (2, 2)).tolist()
        [[1, 2, 1, 2], [1, 2, 1, 2]]
    """
    x = p.as_tensor(x, "tile")
    counts = _ints("tile", "reps", reps)
    if builtins.any(c < 0 for c in counts):
        raise ValueError(f"tile: reps must be >= 0, got {reps!r}")
    rank = builtins.max(len(counts), x.ndim)
    counts = (1,) * (rank - len(counts)) + counts
    dims = (1,) * (rank - x.ndim) + x.shape
    # [r0, d0, r1, d1, ...] by broadcasting, then merge each (r, d) pair.
    spread = tuple(v for pair in zip(counts, dims, strict=True) for v in pair)
    lifted = p.broadcast_in_dim(p.reshape(x, dims), spread, tuple(range(1, 2 * rank, 2)))
    return p.reshape(lifted, [c * d for c, d in zip(counts, dims, strict=True)])


def cumsum(x: Tensor, axis: int | None = None) -> Tensor:
    """Cumulative sum along ``axis`` (flattened when None); ``np.cumsum``/``torch.cumsum``.

    A log-step (Hillis-Steele) scan: ``ceil(log2(n))`` shifted adds, each a pad of a
    slice, so it compiles everywhere and differentiates exactly (its VJP is the reversed
    cumulative sum). Float results may differ from a sequential sum by rounding; float16
    and bfloat16 accumulate in float32 and round once; int32 sums wrap like NumPy's int32
    ``cumsum``.
    Example:
        >>> sg.cumsum(sg.tensor([1, 2, 3, 4])).tolist()
        [1, 3, 6, 10]
    """
    x = p.as_tensor(x, "cumsum")
    if x.dtype == bool_:
        raise DTypeError("cumsum: bool tensors have no sum; cast with .astype('int32')")
    if x.dtype == uint8:
        raise DTypeError("cumsum: uint8 sums would wrap at 256; cast with .astype('int32')")
    if x.dtype in (float16, bfloat16):  # low-precision floats accumulate in float32
        return p.cast(cumsum(p.cast(x, float32), axis), x.dtype)
    if axis is None:
        x, axis = p.reshape(x, [x.size]), 0
    axis = normalize_axis("cumsum", axis, x.ndim)
    n = x.shape[axis]
    shift = 1
    while shift < n:
        stops = [n - shift if a == axis else d for a, d in enumerate(x.shape)]
        head = p.slice_(x, [0] * x.ndim, stops, [1] * x.ndim)
        low = [shift if a == axis else 0 for a in range(x.ndim)]
        x = x + p.pad(head, low, [0] * x.ndim)
        shift *= 2
    return x
