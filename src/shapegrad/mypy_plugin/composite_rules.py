"""Shape rules of the composite ops of issue 25 (``shapegrad._composites``/``_resample``)
and of ``cross_entropy``'s class axis; registered in :mod:`rules`.

As everywhere in the plugin: a non-literal argument makes the result unknown (None),
never a guess; :class:`Mismatch` only for a call that certainly fails at run time.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from . import algebra as A
from . import layers as L
from .algebra import Mismatch, Operand
from .call import Call
from .literals import bool_of, int_of, ints_of, is_none, pair_of
from .spec import Item, TShape, show, show_item

Rule = Callable[[Call], TShape | None]


def _x(call: Call) -> Operand | None:
    x = call.self_operand if call.self_operand is not None else call.operand("x", 0)
    return None if x is None or x.scalar is not None else x


def argmin(call: Call) -> TShape | None:
    """Like ``argmax``: the axis removed, int32."""
    x = _x(call)
    axis_expr = call.expr("axis", 1)
    axis = -1 if axis_expr is None else int_of(axis_expr)
    if x is None or axis is None:
        return None
    return A.reduce("argmin", x, [axis], False, "int")


def bool_reduction(name: str) -> Rule:
    """``all``/``any``: a reduction whose result is bool."""

    def rule(call: Call) -> TShape | None:
        x = _x(call)
        axis_expr = call.expr("axis", 1)
        keep = bool_of(call.expr("keepdims", 2), False)
        axes = None if is_none(axis_expr) else ints_of(axis_expr)
        if x is None or keep is None or (axes is None and not is_none(axis_expr)):
            return None
        return A.reduce(name, x, axes, keep, "bool")

    return rule


def norm(call: Call) -> TShape | None:
    """``norm(x, ord, axis, keepdims)``: a float reduction."""
    x = _x(call)
    axis_expr = call.expr("axis", 2)
    keep = bool_of(call.expr("keepdims", 3), False)
    axes = None if is_none(axis_expr) else ints_of(axis_expr)
    if x is None or keep is None or (axes is None and not is_none(axis_expr)):
        return None
    return A.reduce("norm", x, axes, keep, x.shape.dtype)


def matrix_like(name: str) -> Rule:
    """``tril``/``triu``: shape-preserving, rank >= 2."""

    def rule(call: Call) -> TShape | None:
        x = _x(call)
        if x is None:
            return None
        if x.shape.fixed and len(x.shape.dims) < 2:
            raise Mismatch(f"{name}: needs a tensor of rank >= 2, got {x.describe()}")
        return x.shape

    return rule


def _ints_only(dims: tuple[Item, ...]) -> list[int] | None:
    return (
        [d for d in dims if isinstance(d, int)] if all(isinstance(d, int) for d in dims) else None
    )


def _flat_size(dims: tuple[Item, ...]) -> int | None:
    """The element count of literal sizes (a flattened result's one dim), else None."""
    sizes = _ints_only(dims)
    return None if sizes is None else math.prod(sizes)


def tile(call: Call) -> TShape | None:
    """``np.tile`` with literal ``reps`` on a shape of literal sizes."""
    x = _x(call)
    reps = ints_of(call.expr("reps", 1))
    if x is None or reps is None or not x.shape.fixed:
        return None
    dims = _ints_only(x.shape.dims)
    if dims is None:
        return None
    rank = max(len(reps), len(dims))
    reps = [1] * (rank - len(reps)) + reps
    dims = [1] * (rank - len(dims)) + dims
    return x.shape.with_dims([r * d for r, d in zip(reps, dims, strict=True)])


def repeat(call: Call) -> TShape | None:
    """``np.repeat`` with one literal int ``repeats``."""
    x = _x(call)
    count = int_of(call.expr("repeats", 1))
    axis_expr = call.expr("axis", 2)
    if x is None or count is None or not x.shape.fixed:
        return None
    if is_none(axis_expr):
        size = _flat_size(x.shape.dims)
        return None if size is None else x.shape.with_dims([size * count])
    axis = int_of(axis_expr)
    pos = None if axis is None else A.resolve_axis("repeat", x, axis)
    if pos is None:
        return None
    here = x.shape.dims[pos]
    if not isinstance(here, int):
        return None
    return x.shape.with_dims([here * count if i == pos else d for i, d in enumerate(x.shape.dims)])


def interpolate(call: Call) -> TShape | None:
    """``interpolate(x, size=...)`` with literal sizes (or an int ``scale_factor`` on
    literal sizes): ``[N, C, *size]``."""
    x = _x(call)
    if x is None or not x.shape.fixed or len(x.shape.dims) < 3:
        return None
    spatial = len(x.shape.dims) - 2
    size = ints_of(call.expr("size", 1))
    if size is not None:
        sizes = size * spatial if len(size) == 1 else size
        if len(sizes) != spatial:
            raise Mismatch(
                f"interpolate: size {sizes} does not match the spatial axes of {x.describe()}"
            )
        return x.shape.with_dims([*x.shape.dims[:2], *sizes])
    factor = int_of(call.expr("scale_factor", 2))
    current = _ints_only(x.shape.dims[2:])
    if factor is None or current is None:
        return None
    return x.shape.with_dims([*x.shape.dims[:2], *(d * factor for d in current)])


def conv1d(call: Call) -> TShape | None:
    """``[N, C, L]`` with ``[O, C, K]``: ``[N, O, (L + 2p - K) // s + 1]``."""
    x, w = call.operand("x", 0), call.operand("w", 1)
    if x is None or w is None or not x.shape.fixed or not w.shape.fixed:
        return None
    if len(x.shape.dims) != 3:
        raise Mismatch(f"conv1d: input must be [N, C, L], got {x.describe()}")
    if len(w.shape.dims) != 3:
        raise Mismatch(f"conv1d: weight must be [O, C, K], got {w.describe()}")
    (n, c, length), (o, c_w, k) = x.shape.dims, w.shape.dims
    if A.differ(c, c_w):
        raise Mismatch(f"conv1d: input channels disagree: {x.describe()} and weight {w.describe()}")
    stride, padding = int_of(call.expr("stride", 3)), int_of(call.expr("padding", 4))
    stride = 1 if call.expr("stride", 3) is None else stride
    padding = 0 if call.expr("padding", 4) is None else padding
    out: Item = None
    if all(isinstance(v, int) for v in (length, k, stride, padding)):
        assert isinstance(length, int) and isinstance(k, int)
        assert stride is not None and padding is not None
        out = (length + 2 * padding - k) // stride + 1
    return TShape((n, o, out), x.shape.dtype)


def cumsum(call: Call) -> TShape | None:
    """Shape-preserving along a literal ``axis``; flattened when ``axis`` is None."""
    x = _x(call)
    axis_expr = call.expr("axis", 1)
    if x is None or not x.shape.fixed:
        return None
    if is_none(axis_expr):
        size = _flat_size(x.shape.dims)
        return None if size is None else x.shape.with_dims([size])
    axis = int_of(axis_expr)
    if axis is not None:
        A.resolve_axis("cumsum", x, axis)
    return x.shape


def conv_transpose2d(call: Call) -> TShape | None:
    """``[N, Cin, H, W]`` with ``[Cin, Cout, kh, kw]``: ``[N, Cout, (H-1)s - 2p + k + op, ...]``."""
    x, w = call.operand("x", 0), call.operand("w", 1)
    if x is None or w is None or not x.shape.fixed or not w.shape.fixed:
        return None
    if len(x.shape.dims) != 4 or len(w.shape.dims) != 4:
        raise Mismatch(
            f"conv_transpose2d: needs input [N, Cin, H, W] and weight [Cin, Cout, kh, kw], "
            f"got {x.describe()} and {w.describe()}"
        )
    (n, c, h, wd), (c_w, o, kh, kw) = x.shape.dims, w.shape.dims
    if A.differ(c, c_w):
        raise Mismatch(
            f"conv_transpose2d: input channels disagree: {x.describe()} and weight "
            f"{w.describe()} (the weight is [Cin, Cout, kh, kw])"
        )
    settings = [
        pair_of(call.expr(name, i), default)
        for name, i, default in (
            ("stride", 3, (1, 1)),
            ("padding", 4, (0, 0)),
            ("output_padding", 5, (0, 0)),
        )
    ]
    spatial: list[Item] = [None, None]
    for i, (size, k) in enumerate(((h, kh), (wd, kw))):
        if isinstance(size, int) and isinstance(k, int) and all(v is not None for v in settings):
            s, p, op = (v[i] for v in settings if v is not None)
            spatial[i] = (size - 1) * s - 2 * p + k + op
    return TShape((n, o, *spatial), x.shape.dtype)


def cross_entropy(call: Call) -> TShape | None:
    """``cross_entropy(logits, labels, axis=-1)``: the 2-d rule of :mod:`layers`, or, for
    N-d logits or a given class ``axis``, labels equal to the logits' shape with or
    without that axis; a scalar."""
    logits, labels = call.operand("logits", 0), call.operand("labels", 1)
    if logits is None or labels is None:
        return None
    axis_expr = call.expr("axis", 2)
    rank_two = logits.shape.fixed and len(logits.shape.dims) == 2
    if axis_expr is None and rank_two:
        return L.cross_entropy(logits, labels)
    axis = -1 if axis_expr is None else int_of(axis_expr)
    result = TShape((), logits.shape.dtype)
    if axis is None or not logits.shape.fixed or not labels.shape.fixed:
        return result
    pos = A.resolve_axis("cross_entropy", logits, axis)
    if pos is None:
        return result
    dims, got = logits.shape.dims, labels.shape.dims
    rest = tuple(d for i, d in enumerate(dims) if i != pos)
    for want in (rest, dims):
        if len(got) == len(want) and not any(
            A.differ(a, b) for a, b in zip(want, got, strict=True)
        ):
            return result
    raise Mismatch(
        f"cross_entropy: labels {labels.describe()} do not match logits {logits.describe()} "
        f"with classes on axis {axis} (expected {show(rest)} class indices or {show(dims)} targets)"
    )


def _sort_axis(op: str, call: Call, x: Operand) -> int | None:
    """The position of the sorted axis (``axis=``/``dim=``, default -1) when known; raises
    for a scalar or an axis out of range."""
    first = 0 if call.self_operand else 1  # the argument after x (topk's k comes first)
    axis_expr = call.expr("axis", first + (1 if op == "topk" else 0))
    axis = -1 if axis_expr is None else int_of(axis_expr)
    if x.shape.fixed and not x.shape.dims:
        raise Mismatch(f"{op}: needs a tensor with an axis to sort along, got {x.describe()}")
    return None if axis is None else A.resolve_axis(op, x, axis)


def sort_like(op: str) -> Rule:
    """``sort``: the shape of ``x``; ``argsort``: the same shape, int positions."""

    def rule(call: Call) -> TShape | None:
        x = _x(call)
        if x is None:
            return None
        _sort_axis(op, call, x)
        return x.shape if op == "sort" else TShape(x.shape.dims, "int")

    return rule


def topk(call: Call) -> tuple[TShape | None, TShape | None]:
    """``(values, indices)``: ``x``'s shape with ``k`` on the sorted axis (indices int);
    a literal ``k`` larger than a known axis size is an error."""
    x = _x(call)
    if x is None:
        return (None, None)
    pos = _sort_axis("topk", call, x)
    k_expr = call.expr("k", 0 if call.self_operand else 1)
    k = call.env.size(k_expr) if k_expr is not None else None
    if pos is None or k is None:
        return (None, None)
    size = x.shape.dims[pos]
    if isinstance(k, int) and (k < 0 or (isinstance(size, int) and k > size)):
        raise Mismatch(
            f"topk: k={k} is out of range for dimension {pos} of {x.describe()} "
            f"(0 <= k <= {show_item(size)})"
        )
    dims = list(x.shape.dims)
    dims[pos] = k
    return (x.shape.with_dims(dims), TShape(tuple(dims), "int"))


__all__ = [
    "argmin",
    "bool_reduction",
    "conv1d",
    "conv_transpose2d",
    "cross_entropy",
    "cumsum",
    "interpolate",
    "matrix_like",
    "norm",
    "repeat",
    "sort_like",
    "tile",
    "topk",
]
