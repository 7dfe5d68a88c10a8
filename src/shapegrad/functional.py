"""Composite ops written once against Tensor: they run eagerly and compile unchanged.

Names and argument orders follow NumPy/PyTorch. Every function here is built
from the primitives in ``ops/prims.py``; none touches NumPy data directly.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from shapegrad._fused import eager_kernel
from shapegrad.dtypes import (
    DType,
    DTypeError,
    DTypeLike,
    Int32OverflowError,
    int32,
    int32_overflow,
    int64,
    uint8,
)
from shapegrad.ops import prims as p
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, describe_caller, fmt, normalize_axes, normalize_axis
from shapegrad.tensor import Tensor

Axis = int | Sequence[int] | None
TensorLike = Tensor | float | int


def _t(x: Any) -> Tensor:
    if isinstance(x, Tensor):
        return x
    from shapegrad.ops.eager import tensor

    return tensor(x)


# --- elementwise ------------------------------------------------------------------


def exp(x: Tensor) -> Tensor:
    """Elementwise e**x."""
    return p.unary(Prim.EXP, _t(x))


def log(x: Tensor) -> Tensor:
    """Elementwise natural logarithm."""
    return p.unary(Prim.LOG, _t(x))


def sqrt(x: Tensor) -> Tensor:
    """Elementwise square root."""
    return p.unary(Prim.SQRT, _t(x))


def sin(x: Tensor) -> Tensor:
    """Elementwise sine."""
    return p.unary(Prim.SIN, _t(x))


def cos(x: Tensor) -> Tensor:
    """Elementwise cosine."""
    return p.unary(Prim.COS, _t(x))


def tanh(x: Tensor) -> Tensor:
    """Elementwise hyperbolic tangent."""
    return p.unary(Prim.TANH, _t(x))


def erf(x: Tensor) -> Tensor:
    """Elementwise error function ``2 / sqrt(pi) * integral_0^x exp(-t**2) dt``.

    Example:
        >>> round(sg.erf(sg.tensor(0.5)).item(), 6)
        0.5205
    """
    return p.unary(Prim.ERF, _t(x))


def abs(x: Tensor) -> Tensor:
    """Elementwise absolute value (gradient 0 at 0)."""
    return p.unary(Prim.ABS, _t(x))


def neg(x: Tensor) -> Tensor:
    """Elementwise negation."""
    return p.unary(Prim.NEG, _t(x))


def sigmoid(x: Tensor) -> Tensor:
    """Logistic function, computed as 0.5 * (tanh(x / 2) + 1) so it never overflows."""
    x = _t(x)
    return (tanh(x * 0.5) + 1.0) * 0.5


def relu(x: Tensor) -> Tensor:
    """max(x, 0); the gradient at exactly 0 is 0.5 (the tie rule of ``maximum``)."""
    x = _t(x)
    return maximum(x, 0.0 if x.dtype.is_float else 0)


def _arrays(*values: Any) -> list[Any]:
    """NumPy arrays among ``values`` as tensors; scalars stay weak (they take the dtype of
    the tensor operand)."""
    return [_t(v) if isinstance(v, np.ndarray | list) else v for v in values]


def maximum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise maximum with broadcasting; ties share the gradient."""
    return p.binary(Prim.MAX, *_arrays(a, b))


def minimum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise minimum with broadcasting; ties share the gradient."""
    return p.binary(Prim.MIN, *_arrays(a, b))


def pow(x: TensorLike, y: TensorLike) -> Tensor:
    """x ** y. Integer exponents 0..4 expand to multiplications (exact for negative x)."""
    x, y = _arrays(x, y)
    if isinstance(x, Tensor) and isinstance(y, int | float) and not isinstance(y, bool):
        if y == 0:
            return p.ones_like(x)
        if y == 1:
            return x
        if y == 2:
            return x * x
        if y == 3:
            return x * x * x
        if y == 0.5:
            return sqrt(x)
        if y == -1:
            return 1.0 / x
    return p.binary(Prim.POW, x, y)


def where(cond: Tensor, a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise select: ``a`` where ``cond`` is true, else ``b`` (broadcasting)."""
    cond, a, b = _arrays(cond, a, b)
    return p.where(_t(cond), a, b)


def stop_gradient(x: Tensor) -> Tensor:
    """Identity whose gradient is zero."""
    return p.stop_gradient(x)


# --- layout -----------------------------------------------------------------


def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    """Reshape (one dimension may be -1)."""
    from shapegrad.shapes import resolve_reshape

    return p.reshape(x, resolve_reshape("reshape", x.shape, shape))


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """Permute axes; reverses them when ``axes`` is None (``x.T``)."""
    x = _t(x)
    perm = (
        tuple(reversed(range(x.ndim)))
        if axes is None
        else tuple(normalize_axis("transpose", a, x.ndim) for a in axes)
    )
    if sorted(perm) != list(range(x.ndim)):
        raise ShapeError(
            "transpose", f"axes {tuple(axes or ())} are not a permutation of the {x.ndim} axes of {fmt(x.shape)}"
        )
    return p.permute(x, perm)


# --- reductions -------------------------------------------------------------------
# NumPy's ``axis=``/``keepdims=`` are the names; PyTorch's ``dim=``/``keepdim=`` are accepted
# as aliases where they mean the same thing, and refused with the shapegrad spelling where
# PyTorch's meaning differs (``max(dim=)`` returns (values, indices) there; ``var(dim=)`` is
# unbiased there).


def _torch_axis(op: str, axis: Any, dim: Any, default: Any = None) -> Any:
    """``axis``, or PyTorch's ``dim`` given in its place (not both)."""
    if dim is None:
        return axis
    if axis != default:
        raise TypeError(f"{op}: got both axis={axis!r} and PyTorch's dim={dim!r}; give one")
    return dim


def _torch_keep(op: str, keepdims: bool, keepdim: bool | None) -> bool:
    """``keepdims``, or PyTorch's ``keepdim`` given in its place (not both)."""
    if keepdim is None:
        return keepdims
    if keepdims:
        raise TypeError(f"{op}: got both keepdims=True and PyTorch's keepdim={keepdim!r}; give one")
    return bool(keepdim)


def _no_torch_dim(op: str, dim: Any, instead: str) -> None:
    if dim is not None:
        raise TypeError(f"{op}(dim={dim!r}) means something else in PyTorch; {instead}")


def _keep(x: Tensor, reduced: Tensor, axes: tuple[int, ...], keepdims: bool) -> Tensor:
    if not keepdims:
        return reduced
    return p.reshape(reduced, [1 if i in axes else d for i, d in enumerate(x.shape)])


def sum(
    x: Tensor,
    axis: Axis = None,
    keepdims: bool = False,
    *,
    dim: Axis = None,
    keepdim: bool | None = None,
) -> Tensor:
    """Sum over ``axis`` (all axes when None; PyTorch's ``dim=``/``keepdim=`` also work).

    An int32 sum stays int32 and never wraps: it is accumulated exactly (in float64) and
    a total outside the int32 range raises :class:`~shapegrad.dtypes.Int32OverflowError`
    eagerly, an IndexError with the same message from compiled code (the error-flag
    contract); cast to int64 or float64 for big totals. An int64 sum is exact in int64
    (wrapping at 2**64 like NumPy's, unchecked); a uint8 sum is refused (it would wrap at
    256: cast first).
    """
    axis, keepdims = _torch_axis("sum", axis, dim), _torch_keep("sum", keepdims, keepdim)
    axes = normalize_axes("sum", axis, x.ndim)
    if x.dtype == uint8:
        raise DTypeError(
            f"sum: a uint8 total would wrap at 256 (uint8{fmt(x.shape)}); sum "
            "x.astype(sg.int32) or x.float() instead"
        )
    if x.dtype == int32 and axes:
        return _keep(x, _int32_sum(x, axes), axes, keepdims)
    return _keep(x, p.reduce_sum(x, axes), axes, keepdims)


_INT32_SUM_OVERFLOW = (
    "sum: an int32 total is outside -2147483648..2147483647 (int32 sums never wrap); "
    "sum x.astype(sg.float64) instead"
)


def _int32_sum(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    """An int32 sum checked for overflow (exact in float64 below 2**53 in magnitude)."""
    from shapegrad.dtypes import float64

    total = p.reduce_sum(p.cast(x, float64), axes)
    fits = where(total >= -2147483648.0, total <= 2147483647.0, False)
    if not x.is_traced:
        if fits.size and not bool(fits.all()):
            raise Int32OverflowError(f"{_INT32_SUM_OVERFLOW}{describe_caller()}")
        return p.cast(total, int32)
    # A graph cannot branch on data: a gather from a one-entry table, indexed 1 where the
    # total does not fit, fails at run time with this message (see ``_labels_checked``).
    flag = p.cast(p.binary(Prim.EQ, fits, False), int32)
    table = p.full([1], 0, int32, like=x)
    return p.cast(total, int32) + p.gather(table, flag, 0, what=_INT32_SUM_OVERFLOW)


def mean(
    x: Tensor,
    axis: Axis = None,
    keepdims: bool = False,
    *,
    dim: Axis = None,
    keepdim: bool | None = None,
) -> Tensor:
    """Arithmetic mean over ``axis`` (PyTorch's ``dim=``/``keepdim=`` also work)."""
    axis, keepdims = _torch_axis("mean", axis, dim), _torch_keep("mean", keepdims, keepdim)
    axes = normalize_axes("mean", axis, x.ndim)
    count = 1
    for a in axes:
        count *= x.shape[a]
    total = sum(x, axis=axes, keepdims=keepdims)
    if count == 0:  # NumPy/PyTorch: the mean of nothing is NaN (the empty sum is 0)
        return total + math.nan
    return total / float(count)


_VALUES_ONLY = (
    "it returns (values, indices) there; shapegrad's {op} returns the values only: use "
    "x.{op}(axis={dim!r}) (sg.{op}(x, axis={dim!r})) and {index} for the indices"
)


def max(
    x: Tensor, axis: Axis = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None
) -> Tensor:
    """Maximum over ``axis``; tied maxima share the gradient evenly.

    ``keepdim=`` is accepted for ``keepdims=``; PyTorch's ``dim=`` is refused (there it
    returns values and indices), with the shapegrad spelling in the message.
    """
    if dim is not None:
        _no_torch_dim("max", dim, _VALUES_ONLY.format(op="max", dim=dim, index=f"x.argmax(axis={dim!r})"))
    keepdims = _torch_keep("max", keepdims, keepdim)
    axes = normalize_axes("max", axis, x.ndim)
    return _keep(x, p.reduce_max(x, axes), axes, keepdims)


def min(
    x: Tensor, axis: Axis = None, keepdims: bool = False, *, dim: Any = None, keepdim: bool | None = None
) -> Tensor:
    """Minimum over ``axis`` (as -max(-x), for integers -1 - max(-1 - x)); ``dim=`` is
    refused as in :func:`max`."""
    if dim is not None:
        _no_torch_dim("min", dim, _VALUES_ONLY.format(op="min", dim=dim, index=f"(-x).argmax(axis={dim!r})"))
    keepdims = _torch_keep("min", keepdims, keepdim)
    if x.dtype == uint8:  # -x wraps modulo 256; 255 - x reverses the order exactly
        return 255 - max(255 - x, axis=axis, keepdims=keepdims)
    if x.dtype in (int32, int64):  # -x wraps at the most negative value; -1 - x (~x) cannot
        return -1 - max(-1 - x, axis=axis, keepdims=keepdims)
    return -max(-x, axis=axis, keepdims=keepdims)


def var(
    x: Tensor,
    axis: Axis = None,
    keepdims: bool = False,
    ddof: int | None = None,
    *,
    dim: Axis = None,
    keepdim: bool | None = None,
    correction: int | None = None,
) -> Tensor:
    """Variance over ``axis`` (population variance unless ``ddof``).

    PyTorch's ``correction=`` is ``ddof``; its ``dim=``/``keepdim=`` are accepted, but
    ``dim=`` only with an explicit ``ddof=``/``correction=``: PyTorch's default is the
    unbiased (n - 1) estimate and NumPy's (shapegrad's) the population one.
    """
    if correction is not None:
        if ddof is not None:
            raise TypeError(f"var: got both ddof={ddof!r} and PyTorch's correction={correction!r}")
        ddof = correction
    if dim is not None and ddof is None:
        _no_torch_dim(
            "var",
            dim,
            "PyTorch's default there is the unbiased (n - 1) estimate and shapegrad's the "
            f"population one: write var(x, axis={dim!r}, ddof=1) for PyTorch's value "
            f"or ddof=0 for NumPy's",
        )
    axis, keepdims = _torch_axis("var", axis, dim), _torch_keep("var", keepdims, keepdim)
    ddof = 0 if ddof is None else ddof
    axes = normalize_axes("var", axis, x.ndim)
    count = 1
    for a in axes:
        count *= x.shape[a]
    centered = x - mean(x, axis=axes, keepdims=True)
    return sum(centered * centered, axis=axes, keepdims=keepdims) / float(count - ddof)


@eager_kernel("logsumexp")
def logsumexp(
    x: Tensor,
    axis: Axis = None,
    keepdims: bool = False,
    *,
    dim: Axis = None,
    keepdim: bool | None = None,
) -> Tensor:
    """log(sum(exp(x))) computed stably by subtracting the (gradient-free) max.

    An infinite max is not subtracted (``inf - inf`` is NaN): a row holding ``+inf`` gives
    ``+inf`` and a row of only ``-inf`` gives ``-inf``, as in PyTorch.
    """
    axis = _torch_axis("logsumexp", axis, dim)
    keepdims = _torch_keep("logsumexp", keepdims, keepdim)
    return _logsumexp(x, axis, keepdims, finite_shift=True)


def _logsumexp(x: Tensor, axis: Axis, keepdims: bool, finite_shift: bool) -> Tensor:
    """``finite_shift``: shift by the max only where it is finite (logsumexp); without it
    a row with an infinity is NaN, the form log_softmax keeps (PyTorch's there)."""
    axes = normalize_axes("logsumexp", axis, x.ndim)
    if any(x.shape[a] == 0 for a in axes):  # log(0): there is no max to shift by
        return sum(x, axis=axes, keepdims=keepdims) - math.inf
    shift = stop_gradient(max(x, axis=axes, keepdims=True))
    if finite_shift:
        shift = where(abs(shift) < math.inf, shift, 0.0)
    total = sum(exp(x - shift), axis=axes, keepdims=True)
    return _keep(
        x,
        p.reshape(log(total) + shift, [d for i, d in enumerate(x.shape) if i not in axes]),
        axes,
        keepdims,
    )


@eager_kernel("softmax")
def softmax(x: Tensor, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (or PyTorch's ``dim``), stable for large magnitudes."""
    axis = _torch_axis("softmax", axis, dim, default=-1)
    if x.shape[normalize_axis("softmax", axis, x.ndim)] == 0:
        return x + 0.0  # empty along the axis: an empty result, no max to shift by
    shift = stop_gradient(max(x, axis=axis, keepdims=True))
    e = exp(x - shift)
    return e / sum(e, axis=axis, keepdims=True)


@eager_kernel("log_softmax")
def log_softmax(x: Tensor, axis: int = -1, *, dim: int | None = None) -> Tensor:
    """x - logsumexp(x) along ``axis`` (or ``dim``); a row holding an infinity is NaN, as in PyTorch."""
    axis = _torch_axis("log_softmax", axis, dim, default=-1)
    return x - _logsumexp(x, axis, True, finite_shift=False)


def argmax(
    x: Tensor,
    axis: int = -1,
    keepdims: bool = False,
    *,
    dim: int | None = None,
    keepdim: bool | None = None,
    dtype: DTypeLike = "int32",
) -> Tensor:
    """Index of the first maximum along ``axis`` (int32, or ``dtype=sg.int64``; not
    differentiable).

    PyTorch's ``dim=``/``keepdim=`` are accepted for ``axis=``/``keepdims=``.
    """
    axis = normalize_axis("argmax", _torch_axis("argmax", axis, dim, default=-1), x.ndim)
    if _torch_keep("argmax", keepdims, keepdim):
        return expand_dims(argmax(x, axis, dtype=dtype), axis)
    n = x.shape[axis]
    best = stop_gradient(max(x, axis=axis, keepdims=True))
    positions = p.iota(x.shape, axis, index_dtype("argmax", dtype), like=x)
    candidates = where(x == best, positions, n)
    return min(candidates, axis=axis)


# --- contraction ------------------------------------------------------------------------


@eager_kernel("matmul")
def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with NumPy semantics: vectors, batch dims broadcast."""
    a, b = _t(a), _t(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(
            "matmul", f"operands must be at least 1-d, got {fmt(a.shape)} and {fmt(b.shape)}"
        )
    if a.dtype != b.dtype:
        raise DTypeError(f"matmul: operands are {a.dtype} and {b.dtype}; cast one with .astype()")
    k_a = a.shape[-1]
    k_b = b.shape[0] if b.ndim == 1 else b.shape[-2]
    if k_a != k_b:
        raise ShapeError(
            "matmul",
            f"inner dimensions disagree: {fmt(a.shape)} @ {fmt(b.shape)} ({k_a} != {k_b})",
        )
    if a.ndim <= 2 and b.ndim <= 2:
        spec_a = "ij"[-a.ndim :] if a.ndim == 2 else "j"
        spec_b = "jk" if b.ndim == 2 else "j"
        out = ("i" if a.ndim == 2 else "") + ("k" if b.ndim == 2 else "")
        return p.einsum(f"{spec_a},{spec_b}->{out}", a, b)
    a2 = a if a.ndim > 1 else p.reshape(a, (1, k_a))
    b2 = b if b.ndim > 1 else p.reshape(b, (k_b, 1))
    from shapegrad.shapes import broadcast_shapes

    batch = broadcast_shapes("matmul", a2.shape[:-2], b2.shape[:-2])
    a2 = p.broadcast_to(a2, batch + a2.shape[-2:], "matmul")
    b2 = p.broadcast_to(b2, batch + b2.shape[-2:], "matmul")
    letters = "abcdefgh"[: len(batch)]
    product = p.einsum(f"{letters}ij,{letters}jk->{letters}ik", a2, b2)
    if a.ndim == 1:
        product = p.reshape(product, (*batch, product.shape[-1]))
    if b.ndim == 1:
        product = p.reshape(product, product.shape[:-1])
    return product


@eager_kernel("gelu")
def gelu(x: Tensor, approximate: str = "tanh") -> Tensor:
    """GELU activation; by default the **tanh approximation** (PyTorch's
    ``approximate="tanh"``; shapegrad's default since before ``erf`` existed).

    ``approximate="tanh"``: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``;
    ``approximate="none"``: the exact ``0.5 * x * (1 + erf(x / sqrt(2)))`` (PyTorch's
    default).
    Example:
        >>> round(sg.gelu(sg.tensor(1.0)).item(), 4)
        0.8412
        >>> round(sg.gelu(sg.tensor(1.0), approximate="none").item(), 4)
        0.8413
    """
    x = _t(x)
    if approximate == "none":
        return x * (erf(x * (1.0 / math.sqrt(2.0))) + 1.0) * 0.5
    if approximate != "tanh":
        raise ValueError(f"gelu: approximate must be 'tanh' or 'none', got {approximate!r}")
    inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
    return x * (tanh(inner) + 1.0) * 0.5


# --- joining, padding, slicing, indexing ---------------------------------------------


def concat(tensors: Sequence[Tensor], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Join tensors along an existing ``axis`` (``np.concatenate``; ``torch.cat``'s ``dim=``).

    Example:
        >>> sg.concat([sg.ones((2, 3)), sg.zeros((1, 3))], axis=0).shape
        (3, 3)
    """
    axis = _torch_axis("concat", axis, dim, default=0)
    xs = [_t(x) for x in tensors]
    if not xs:
        raise ValueError("concat: needs at least one tensor")
    rank = xs[0].ndim
    if rank == 0:
        raise ShapeError("concat", "cannot concatenate 0-d tensors; use stack")
    for x in xs[1:]:
        if x.ndim != rank:
            shown = ", ".join(fmt(t.shape) for t in xs)
            raise ShapeError("concat", f"all inputs need rank {rank}, got {shown}")
    return p.concat(xs, normalize_axis("concat", axis, rank))


def stack(tensors: Sequence[Tensor], axis: int = 0, *, dim: int | None = None) -> Tensor:
    """Join equally shaped tensors along a new ``axis`` (``np.stack``; ``torch.stack``'s ``dim=``).

    Example:
        >>> sg.stack([sg.ones(3), sg.zeros(3)], axis=1).shape
        (3, 2)
    """
    axis = _torch_axis("stack", axis, dim, default=0)
    xs = [_t(x) for x in tensors]
    if not xs:
        raise ValueError("stack: needs at least one tensor")
    for x in xs[1:]:
        if x.shape != xs[0].shape:
            shown = ", ".join(fmt(t.shape) for t in xs)
            raise ShapeError("stack", f"all inputs need the same shape, got {shown}")
    axis = normalize_axis("stack", axis, xs[0].ndim + 1)
    shape = list(xs[0].shape)
    shape.insert(axis, 1)
    return p.concat([p.reshape(x, shape) for x in xs], axis)


PadWidth = int | Sequence[int] | Sequence[Sequence[int]]


def _pad_pairs(pad_width: PadWidth, rank: int) -> list[tuple[int, int]]:
    """Expand NumPy's ``pad_width`` forms (n, (b, a), ((b0, a0), ...)) to one pair per axis."""
    if isinstance(pad_width, int):
        return [(pad_width, pad_width)] * rank
    items: list[Any] = list(pad_width)
    if all(isinstance(v, int) for v in items) and len(items) in (1, 2):
        return [(int(items[0]), int(items[-1]))] * rank
    pairs: list[tuple[Any, ...]] = [tuple(v) for v in items]
    if len(pairs) != rank or any(len(pair) != 2 for pair in pairs):
        raise ShapeError("pad", f"pad_width {pad_width!r} needs {rank} (before, after) pairs")
    return [(int(a), int(b)) for a, b in pairs]


def pad(
    x: Tensor, pad_width: PadWidth, mode: str = "constant", constant_values: float = 0.0
) -> Tensor:
    """Constant padding with NumPy's ``np.pad`` argument form.

    ``pad_width`` is an int (all sides), a ``(before, after)`` pair for every
    axis, or one pair per axis ``((before_0, after_0), ...)``. (This is
    NumPy's layout, not PyTorch's reversed flat list.)
    Example:
        >>> sg.pad(sg.ones((2, 3)), ((1, 1), (0, 2))).shape
        (4, 5)
    """
    if mode != "constant":
        raise ValueError(f"pad: only mode='constant' is supported, got {mode!r}")
    x = _t(x)
    pairs = _pad_pairs(pad_width, x.ndim)
    if any(a < 0 or b < 0 for a, b in pairs):
        raise ShapeError("pad", f"negative pad_width {pad_width!r} for {fmt(x.shape)}")
    return p.pad(x, [a for a, _ in pairs], [b for _, b in pairs], value=constant_values)


def slice(
    x: Tensor, start: int | None = None, stop: int | None = None, step: int = 1, axis: int = 0
) -> Tensor:
    """``x[..., start:stop:step, ...]`` on one ``axis`` (Python slice rules, positive step).

    Example:
        >>> sg.slice(sg.arange(10), 2, 8, 3).tolist()
        [2, 5]
    """
    x = _t(x)
    axis = normalize_axis("slice", axis, x.ndim)
    if step < 1:
        raise ValueError(f"slice: step must be positive, got {step}")
    lo, hi, st = builtins.slice(start, stop, step).indices(x.shape[axis])
    starts = [lo if a == axis else 0 for a in range(x.ndim)]
    stops = [builtins.max(hi, lo) if a == axis else d for a, d in enumerate(x.shape)]
    steps = [st if a == axis else 1 for a in range(x.ndim)]
    return p.slice_(x, starts, stops, steps)


def index_dtype(op: str, dtype: DTypeLike) -> DType:
    """``dtype`` as the dtype of indices ``op`` returns: int32 or int64."""
    from shapegrad.dtypes import as_dtype

    target = as_dtype(dtype)
    if target != int32 and target != int64:
        raise DTypeError(f"{op}: indices are int32 or int64, got dtype={target}")
    return target


def _indices(op: str, indices: Any, like: Tensor) -> Tensor:
    if not isinstance(indices, Tensor):
        _check_integers(op, "indices", indices)
    idx = indices if isinstance(indices, Tensor) else p.constant(indices, int32, like=like)
    if idx.dtype != int32 and idx.dtype != int64:
        raise DTypeError(
            f"{op}: indices must be int32, got {idx.dtype} (or int64 for indices beyond 2**31)"
        )
    return idx


def _check_integers(op: str, what: str, value: Any) -> None:
    """Host-side ``indices``/``labels`` must be integers that fit int32: a float or bool
    array would be truncated and 2**32 + 1 would wrap to 1, silently reading another row."""
    array = np.asarray(value)
    if array.dtype.kind not in "iu" and array.size:
        raise DTypeError(f"{op}: {what} must be integers, got a {array.dtype} array")
    bad = int32_overflow(array)
    if bad is not None:
        raise Int32OverflowError(
            f"{op}: {what} value {bad} is out of range (it does not fit in int32)"
            f"{describe_caller()}"
        )


def take(x: Tensor, indices: Any, axis: int | None = None) -> Tensor:
    """``np.take``: pick entries of ``x`` along ``axis`` (flattened ``x`` when None).

    The result has shape ``x.shape[:axis] + indices.shape + x.shape[axis + 1:]``;
    negative indices count from the end. Example:
        >>> sg.take(sg.tensor([[1, 2], [3, 4]]), [1, 0], axis=1).tolist()
        [[2, 1], [4, 3]]
    """
    x = _t(x)
    if axis is None:
        x, axis = p.reshape(x, [x.size]), 0
    idx = _indices("take", indices, x)
    return p.gather(x, idx, normalize_axis("take", axis, x.ndim))


def gather(x: Tensor, indices: Any, axis: int) -> Tensor:
    """Gather slices of ``x`` along ``axis`` (TensorFlow's ``gather``; same as ``take``)."""
    return take(x, indices, axis)


@eager_kernel("embedding")
def embedding(table: Tensor, ids: Any) -> Tensor:
    """Rows of ``table [V, D]`` for integer ``ids`` of any shape: ``ids.shape + [D]``.

    Example:
        >>> sg.embedding(sg.eye(3), [[2, 0]]).shape
        (1, 2, 3)
    """
    if table.ndim != 2:
        raise ShapeError("embedding", f"table must be [V, D], got {fmt(table.shape)}")
    return p.gather(table, _indices("embedding", ids, table), 0)


def one_hot(labels: Tensor, num_classes: int, dtype: Any = "float32") -> Tensor:
    """``[..., num_classes]`` with a 1 at each label (all zeros for out-of-range labels)."""
    from shapegrad.dtypes import as_dtype

    labels = _t(labels)
    if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 0:
        raise ValueError(f"one_hot: num_classes must be an integer >= 0, got {num_classes!r}")
    shape = (*labels.shape, num_classes)
    kind = int64 if labels.dtype == int64 else int32  # labels and classes compare in one dtype
    classes = p.iota(shape, len(shape) - 1, kind, like=labels)
    spread = p.broadcast_in_dim(labels, shape, tuple(range(labels.ndim)))
    return p.cast(p.binary(Prim.EQ, spread, classes), as_dtype(dtype))


# --- losses and normalisation ------------------------------------------------------------


@eager_kernel("cross_entropy")
def cross_entropy(logits: Tensor, labels: Tensor, axis: int = -1) -> Tensor:
    """Mean softmax cross-entropy of ``logits [b, c]``, or of N-d logits with classes on
    ``axis`` (PyTorch's ``[N, C, d1, ...]`` layout is ``axis=1``; the default is the last).

    ``labels`` are either int32 class indices ``[b]`` (the logits' shape without ``axis``)
    or float targets shaped like the logits (one-hot or probabilities). The mean is over
    every position, as PyTorch's ``reduction="mean"``. An out-of-range class index raises
    IndexError, eagerly and in compiled code (checked when the program runs).
    Example:
        >>> x = sg.tensor([[0.0, 0.0]])
        >>> round(sg.cross_entropy(x, sg.tensor([1])).item(), 4)
        0.6931
        >>> sg.cross_entropy(sg.zeros((2, 3, 4, 4)), sg.zeros((2, 4, 4), "int32"), axis=1).shape
        ()
    """
    if not isinstance(labels, Tensor) and np.asarray(labels).dtype.kind in "iu":
        _check_integers("cross_entropy", "labels", labels)
    logits, labels = _t(logits), _t(labels)
    if logits.ndim < 2:
        raise ShapeError(
            "cross_entropy",
            f"logits must be [b, c], got {fmt(logits.shape)} (or [N, C, d1, ...] with axis=1)",
        )
    class_axis = normalize_axis("cross_entropy", axis, logits.ndim)
    if logits.ndim != 2 or class_axis != 1:
        logits, labels = _classes_last(logits, labels, class_axis)
    b, c = logits.shape
    logp = log_softmax(logits, axis=-1)
    if labels.dtype.is_float and labels.shape == (b,):
        raise DTypeError(
            f"cross_entropy: labels must be integer class indices (int32), got {labels.dtype} "
            f"labels {fmt(labels.shape)}; cast them with .astype('int32'), or pass float "
            f"targets shaped like the logits {fmt(logits.shape)}"
        )
    if labels.dtype.is_float:
        if labels.shape != logits.shape:
            raise ShapeError(
                "cross_entropy",
                f"float targets must match logits: {fmt(labels.shape)} vs {fmt(logits.shape)}",
            )
        # 0 * log p = 0 even where p = 0 (a -inf logit, the masking pattern): never NaN.
        return -mean(sum(labels * where(labels != 0.0, logp, 0.0), axis=-1))
    if labels.shape != (b,):
        raise ShapeError(
            "cross_entropy",
            f"integer labels must be [{b}] for logits {fmt(logits.shape)}, got {fmt(labels.shape)}",
        )
    if labels.dtype != int32 and labels.dtype != int64:
        raise DTypeError(
            f"cross_entropy: labels must be int32 or float, got {labels.dtype} (int64 also "
            "works); cast them with .int()"
        )
    valid = where(labels >= 0, labels < c, False)
    if not labels.is_traced and labels.size and not bool(valid.all()):
        raise IndexError(f"cross_entropy: labels must lie in [0, {c}), got {labels.tolist()}")
    # Select, never multiply: one_hot * logp is 0 * -inf = NaN for a masked (-inf) logit.
    picked = sum(where(one_hot(labels, c, "bool"), logp, 0.0), axis=-1)
    if labels.is_traced:  # a bad label raises IndexError when the compiled code runs
        picked = where(valid, picked + _labels_checked(labels, c, logits), math.nan)
    return -mean(picked)


def _classes_last(logits: Tensor, labels: Tensor, axis: int) -> tuple[Tensor, Tensor]:
    """``logits [..., C at axis, ...]`` as ``[M, C]`` and labels as ``[M]`` (indices) or
    ``[M, C]`` (targets shaped like the logits), M the product of the other axes."""
    c = logits.shape[axis]
    rest = tuple(d for i, d in enumerate(logits.shape) if i != axis)
    perm = [i for i in range(logits.ndim) if i != axis] + [axis]
    m = 1
    for d in rest:
        m *= d
    flat = p.reshape(p.permute(logits, perm), [m, c])
    if labels.shape == logits.shape:
        return flat, p.reshape(p.permute(labels, perm), [m, c])
    if labels.shape == rest:
        return flat, p.reshape(labels, [m])
    raise ShapeError(
        "cross_entropy",
        f"labels {fmt(labels.shape)} must be class indices {fmt(rest)} or targets "
        f"{fmt(logits.shape)} for logits {fmt(logits.shape)} with classes on axis {axis}",
    )


def _labels_checked(labels: Tensor, c: int, like: Tensor) -> Tensor:
    """Zeros ``[b]`` whose computation fails with IndexError when a label is outside ``[0, c)``.

    A graph cannot branch on data; gathers can fail (the error-flag contract of the loop
    IR: the program stops and the caller raises). A gather from a length-``c`` table
    checks ``[-c, c)``; one indexed by ``labels - c`` checks ``[0, 2c)``: together exactly
    ``[0, c)`` (``labels - c`` wraps only below ``-c``, which the first one rejects).
    """
    message = f"cross_entropy: labels must lie in [0, {c})"
    table = p.full([c], 0, like.dtype, like=like)
    low = p.gather(table, labels, 0, what=message)
    high = p.gather(table, labels - c, 0, what=message)
    return low + high


@eager_kernel("mse")
def mse(pred: Tensor, target: Tensor) -> Tensor:
    """Mean squared error ``mean((pred - target) ** 2)``; shapes must match exactly."""
    pred, target = _t(pred), _t(target)
    if pred.shape != target.shape:
        raise ShapeError("mse", f"pred {fmt(pred.shape)} and target {fmt(target.shape)} differ")
    diff = pred - target
    return mean(diff * diff)


def hinge(scores: Tensor, labels: Tensor) -> Tensor:
    """Mean hinge loss ``mean(relu(1 - labels * scores))`` with labels in {-1, +1}."""
    scores, labels = _t(scores), _t(labels)
    if scores.shape != labels.shape:
        raise ShapeError(
            "hinge", f"scores {fmt(scores.shape)} and labels {fmt(labels.shape)} differ"
        )
    return mean(relu(1.0 - labels.astype(scores.dtype) * scores))


def clip(x: TensorLike, a_min: TensorLike | None = None, a_max: TensorLike | None = None) -> Tensor:
    """Limit values to ``[a_min, a_max]`` (``np.clip``; either bound may be None).

    Example:
        >>> sg.clip(sg.tensor([-2.0, 0.5, 3.0]), 0.0, 1.0).tolist()
        [0.0, 0.5, 1.0]
    """
    y = _t(x)
    if a_min is not None:
        y = maximum(y, a_min)
    if a_max is not None:
        y = minimum(y, a_max)
    return y


def squeeze(x: Tensor, axis: Axis = None, *, dim: Axis = None) -> Tensor:
    """Remove size-1 axes (all of them when ``axis`` is None), like ``np.squeeze``.

    PyTorch's ``dim=`` is accepted; unlike PyTorch, squeezing an axis whose size is not 1
    is an error rather than a silent no-op.
    """
    axis = _torch_axis("squeeze", axis, dim)
    x = _t(x)
    axes = (
        tuple(a for a, d in enumerate(x.shape) if d == 1)
        if axis is None
        else normalize_axes("squeeze", axis, x.ndim)
    )
    for a in axes:
        if x.shape[a] != 1:
            raise ShapeError(
                "squeeze", f"cannot squeeze axis {a} of size {x.shape[a]} in {fmt(x.shape)}"
            )
    return p.reshape(x, [d for a, d in enumerate(x.shape) if a not in axes])


def expand_dims(x: Tensor, axis: int | Sequence[int]) -> Tensor:
    """Insert size-1 axes at ``axis`` (positions in the result), like ``np.expand_dims``."""
    x = _t(x)
    wanted = (axis,) if isinstance(axis, int) else tuple(axis)
    rank = x.ndim + len(wanted)
    positions = normalize_axes("expand_dims", wanted, rank)
    if len(set(positions)) != len(positions):
        raise ValueError(f"expand_dims: repeated axis in {axis!r}")
    dims = iter(x.shape)
    return p.reshape(x, [1 if a in positions else next(dims) for a in range(rank)])


def unsqueeze(x: Tensor, dim: int) -> Tensor:
    """PyTorch's name for :func:`expand_dims` with one axis."""
    return expand_dims(x, dim)


cat = concat  # PyTorch's name
concatenate = concat  # NumPy's name


from shapegrad._conv import avg_pool2d, conv2d, max_pool2d  # noqa: E402
from shapegrad._creation import (  # noqa: E402
    arange,
    dropout,
    eye,
    full,
    ones,
    ones_like,
    rand,
    randn,
    zeros,
    zeros_like,
)
from shapegrad._einsum import einsum  # noqa: E402
from shapegrad._norms import batch_norm, group_norm, layer_norm  # noqa: E402

__all__ = [
    "abs",
    "arange",
    "argmax",
    "avg_pool2d",
    "batch_norm",
    "cat",
    "clip",
    "concat",
    "concatenate",
    "conv2d",
    "cos",
    "cross_entropy",
    "dropout",
    "einsum",
    "embedding",
    "erf",
    "exp",
    "expand_dims",
    "eye",
    "full",
    "gather",
    "gelu",
    "group_norm",
    "hinge",
    "layer_norm",
    "log",
    "log_softmax",
    "logsumexp",
    "matmul",
    "max",
    "max_pool2d",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mse",
    "neg",
    "one_hot",
    "ones",
    "ones_like",
    "pad",
    "pow",
    "rand",
    "randn",
    "relu",
    "reshape",
    "sigmoid",
    "sin",
    "slice",
    "softmax",
    "sqrt",
    "squeeze",
    "stack",
    "stop_gradient",
    "sum",
    "take",
    "tanh",
    "transpose",
    "unsqueeze",
    "var",
    "where",
    "zeros",
    "zeros_like",
]
