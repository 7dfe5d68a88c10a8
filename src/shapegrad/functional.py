"""Composite ops written once against Tensor: they run eagerly and compile unchanged.

Names and argument orders follow NumPy/PyTorch. Every function here is built
from the primitives in ``ops/prims.py``; none touches NumPy data directly.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from shapegrad.dtypes import int32
from shapegrad.ops import prims as p
from shapegrad.ops.protocol import Prim
from shapegrad.shapes import ShapeError, fmt, normalize_axes, normalize_axis
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


def maximum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise maximum with broadcasting; ties share the gradient."""
    return p.binary(Prim.MAX, a, b)


def minimum(a: TensorLike, b: TensorLike) -> Tensor:
    """Elementwise minimum with broadcasting; ties share the gradient."""
    return p.binary(Prim.MIN, a, b)


def pow(x: TensorLike, y: TensorLike) -> Tensor:
    """x ** y. Integer exponents 0..4 expand to multiplications (exact for negative x)."""
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
    return p.where(cond, a, b)


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
    perm = (
        tuple(reversed(range(x.ndim)))
        if axes is None
        else tuple(normalize_axis("transpose", a, x.ndim) for a in axes)
    )
    return p.permute(x, perm)


# --- reductions -------------------------------------------------------------------


def _keep(x: Tensor, reduced: Tensor, axes: tuple[int, ...], keepdims: bool) -> Tensor:
    if not keepdims:
        return reduced
    return p.reshape(reduced, [1 if i in axes else d for i, d in enumerate(x.shape)])


def sum(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Sum over ``axis`` (all axes when None)."""
    axes = normalize_axes("sum", axis, x.ndim)
    return _keep(x, p.reduce_sum(x, axes), axes, keepdims)


def mean(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Arithmetic mean over ``axis``."""
    axes = normalize_axes("mean", axis, x.ndim)
    count = 1
    for a in axes:
        count *= x.shape[a]
    return sum(x, axis=axes, keepdims=keepdims) / float(builtins.max(count, 1))


def max(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis``; tied maxima share the gradient evenly."""
    axes = normalize_axes("max", axis, x.ndim)
    return _keep(x, p.reduce_max(x, axes), axes, keepdims)


def min(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis`` (as -max(-x))."""
    return -max(-x, axis=axis, keepdims=keepdims)


def var(x: Tensor, axis: Axis = None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance over ``axis`` (population variance unless ``ddof``)."""
    axes = normalize_axes("var", axis, x.ndim)
    count = 1
    for a in axes:
        count *= x.shape[a]
    centered = x - mean(x, axis=axes, keepdims=True)
    return sum(centered * centered, axis=axes, keepdims=keepdims) / float(count - ddof)


def logsumexp(x: Tensor, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) computed stably by subtracting the (gradient-free) max."""
    axes = normalize_axes("logsumexp", axis, x.ndim)
    shift = stop_gradient(max(x, axis=axes, keepdims=True))
    total = sum(exp(x - shift), axis=axes, keepdims=True)
    return _keep(
        x,
        p.reshape(log(total) + shift, [d for i, d in enumerate(x.shape) if i not in axes]),
        axes,
        keepdims,
    )


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis``, stable for large magnitudes."""
    shift = stop_gradient(max(x, axis=axis, keepdims=True))
    e = exp(x - shift)
    return e / sum(e, axis=axis, keepdims=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """x - logsumexp(x) along ``axis``."""
    return x - logsumexp(x, axis=axis, keepdims=True)


def argmax(x: Tensor, axis: int = -1) -> Tensor:
    """Index of the first maximum along ``axis`` (int32, not differentiable)."""
    axis = normalize_axis("argmax", axis, x.ndim)
    n = x.shape[axis]
    best = stop_gradient(max(x, axis=axis, keepdims=True))
    positions = p.iota(x.shape, axis, int32, like=x)
    candidates = where(x == best, positions, n)
    return -max(-candidates, axis=axis)


# --- contraction ------------------------------------------------------------------------


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """Matrix product with NumPy semantics: vectors, batch dims broadcast."""
    a, b = _t(a), _t(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(
            "matmul", f"operands must be at least 1-d, got {fmt(a.shape)} and {fmt(b.shape)}"
        )
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
