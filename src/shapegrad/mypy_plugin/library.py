"""Shape rules of shapegrad's own layers, whose runtime annotations are plain ``Tensor``.

Keyed by definition site like :mod:`optable`: attention (``split_heads``,
``merge_heads``, ``scaled_dot_product_attention``, ``multi_head_attention``),
transformer blocks and stacks, ``batch_norm``/``group_norm``, sampling from
``sg.random`` and the ``__call__`` of ``sg.nn`` Modules (``Linear``, ``LayerNorm``,
``BatchNorm``, ``GroupNorm``), whose parameters are the module's fields in the
caller's terms (known when the module is a field declared with
``field(dims=...)``, or inside the module's own methods).

A rule returns one shape per tensor of the result (a tuple result such as
``batch_norm``'s ``(y, mean, var)`` gets one per item), or raises
:class:`Mismatch` when the call certainly fails.
"""

from __future__ import annotations

from collections.abc import Callable

from . import algebra as A
from . import composite_rules as CR
from . import layers as L
from . import sizes
from .algebra import Mismatch, Operand, differ
from .call import Call
from .rules import sizes_of
from .spec import Item, TShape, show_item

Shapes = tuple[TShape | None, ...]
LibraryRule = Callable[[Call], Shapes]
# A Module's __call__: the call, and the module's tensor fields in the caller's terms.
ModuleRule = Callable[[Call, dict[str, TShape]], Shapes]


def _rank(op: str, x: Operand, rank: int, what: str) -> tuple[Item, ...] | None:
    """``x``'s dims if its rank is known and ``rank``; raises when it is known and not."""
    if not x.shape.fixed:
        return None
    if len(x.shape.dims) != rank:
        raise Mismatch(f"{op}: needs {what}, got {x.describe()}")
    return x.shape.dims


def _split_heads(call: Call) -> Shapes:
    x = call.operand("x", 0)
    heads = call.env.size(call.expr("heads", 1))
    if x is None or x.scalar is not None:
        return (None,)
    dims = _rank("split_heads", x, 3, "[batch, time, d]")
    if dims is None:
        return (None,)
    b, t, d = dims
    if isinstance(d, int) and isinstance(heads, int) and heads > 0 and d % heads:
        raise Mismatch(f"split_heads: d = {d} of {x.describe()} is not divisible by {heads} heads")
    return (TShape((b, heads, t, sizes.floordiv(d, heads)), x.shape.dtype),)


def _merge_heads(call: Call) -> Shapes:
    x = call.operand("x", 0)
    if x is None or x.scalar is not None:
        return (None,)
    dims = _rank("merge_heads", x, 4, "[batch, heads, time, dh]")
    if dims is None:
        return (None,)
    b, h, t, dh = dims
    return (TShape((b, t, sizes.mul(h, dh)), x.shape.dtype),)


def _attention(call: Call) -> Shapes:
    q, k, v = call.operand("q", 0), call.operand("k", 1), call.operand("v", 2)
    if q is None or k is None or v is None or not (q.shape.fixed and k.shape.fixed):
        return (None,)
    op = "scaled_dot_product_attention"
    dq, dk = q.shape.dims, k.shape.dims
    if len(dq) < 2 or len(dk) != len(dq):
        raise Mismatch(f"{op}: q, k, v need one rank >= 2, got {q.describe()}, {k.describe()}")
    _same(op, "leading dims", q, k, dq[:-2], dk[:-2])
    if differ(dq[-1], dk[-1]):
        raise Mismatch(
            f"{op}: k's last dim must equal q's: {q.describe()}, {k.describe()} "
            f"({show_item(dq[-1])} != {show_item(dk[-1])})"
        )
    if not v.shape.fixed:
        return (None,)
    dv = v.shape.dims
    if len(dv) != len(dq):
        raise Mismatch(f"{op}: q, k, v need one rank, got {q.describe()}, {v.describe()}")
    _same(op, "leading dims", q, v, dq[:-2], dv[:-2])
    if differ(dk[-2], dv[-2]):
        raise Mismatch(
            f"{op}: k has {show_item(dk[-2])} keys but v has {show_item(dv[-2])} values "
            f"({k.describe()}, {v.describe()})"
        )
    return (TShape((*dq[:-1], dv[-1]), A.join_dtype(q.shape.dtype, v.shape.dtype)),)


def _same(
    op: str, what: str, a: Operand, b: Operand, da: tuple[Item, ...], db: tuple[Item, ...]
) -> None:
    for x, y in zip(da, db, strict=True):
        if differ(x, y):
            raise Mismatch(
                f"{op}: {what} disagree: {a.describe()}, {b.describe()} "
                f"({show_item(x)} != {show_item(y)})"
            )


def _qkv_check(op: str, x: Operand, w_qkv: Operand | None, stacked: bool) -> None:
    """``w_qkv`` is ``[3*d, d]`` (``[layers, 3*d, d]`` when ``stacked``) for ``x [b, t, d]``."""
    if w_qkv is None or not w_qkv.shape.fixed or not x.shape.fixed or not x.shape.dims:
        return
    dims = w_qkv.shape.dims[1:] if stacked else w_qkv.shape.dims
    d = x.shape.dims[-1]
    if len(dims) == 2 and (differ(dims[1], d) or differ(dims[0], sizes.mul(3, d))):
        raise Mismatch(
            f"{op}: x {x.describe()} needs w_qkv [3 * {show_item(d)}, {show_item(d)}], "
            f"got {w_qkv.describe()}"
        )


def _blocks(name: str, qkv_index: int, stacked: bool) -> LibraryRule:
    """``multi_head_attention`` / ``transformer_block`` / ``transformer_stack``: ``[b, t, d]`` kept."""

    def rule(call: Call) -> Shapes:
        x = call.operand("x", 1)
        if x is None or x.scalar is not None:
            return (None,)
        if x.shape.fixed and len(x.shape.dims) != 3:
            raise Mismatch(f"{name}: x needs [batch, time, d], got {x.describe()}")
        items = call.tuple_operands("params", 0)
        if items is not None and len(items) > qkv_index:
            _qkv_check(name, x, items[qkv_index], stacked)
        return (x.shape,)

    return rule


def _batch_norm(call: Call) -> Shapes:
    x = call.operand("x", 0)
    if x is None or x.scalar is not None or not x.shape.fixed or len(x.shape.dims) < 2:
        return (None, None, None)
    c = x.shape.dims[1]
    for name, pos in (("weight", 1), ("bias", 2), ("running_mean", 3), ("running_var", 4)):
        _channel_check("batch_norm", x, call.operand(name, pos), name)
    stat = TShape((c,), x.shape.dtype)
    return (x.shape, stat, stat)


def _channel_check(op: str, x: Operand, p: Operand | None, name: str) -> None:
    if p is None or p.scalar is not None or not p.shape.fixed or not x.shape.fixed:
        return
    c = x.shape.dims[1] if len(x.shape.dims) > 1 else None
    if len(p.shape.dims) != 1 or differ(p.shape.dims[0], c):
        raise Mismatch(
            f"{op}: {name} {p.describe()} should be [{show_item(c)}] (the channels of {x.describe()})"
        )


def _group_norm(call: Call) -> Shapes:
    x = call.operand("x", 0)
    if x is None or x.scalar is not None:
        return (None,)
    for name, pos in (("weight", 2), ("bias", 3)):
        _channel_check("group_norm", x, call.operand(name, pos), name)
    return (x.shape,)


def _sample(dtype: str | None, shape_position: int) -> LibraryRule:
    """``sg.random.normal/uniform(key, shape)``, ``bernoulli(key, p, shape)``."""

    def rule(call: Call) -> Shapes:
        expr = call.expr("shape", shape_position)
        if expr is None:
            return (TShape((), dtype),)
        found = sizes_of(call, [expr])
        given_dtype = call.given("dtype", 2) if dtype == "float" else False
        return (None if found is None else TShape(tuple(found), None if given_dtype else dtype),)

    return rule


LIBRARY_FUNCTIONS: dict[str, LibraryRule] = {
    "shapegrad.nn.attention.split_heads": _split_heads,
    "shapegrad.nn.attention.merge_heads": _merge_heads,
    "shapegrad.nn.attention.scaled_dot_product_attention": _attention,
    "shapegrad.nn.attention.multi_head_attention": _blocks("multi_head_attention", 0, False),
    "shapegrad.nn.transformer.transformer_block": _blocks("transformer_block", 2, False),
    "shapegrad.nn.transformer.transformer_stack": _blocks("transformer_stack", 2, True),
    "shapegrad._norms.batch_norm": _batch_norm,
    "shapegrad._norms.group_norm": _group_norm,
    "shapegrad.random.normal": _sample("float", 1),
    "shapegrad.random.uniform": _sample("float", 1),
    "shapegrad.random.bernoulli": _sample("bool", 2),
    "shapegrad._sorting.topk": CR.topk,
}

# Tensor methods whose result is a tuple of tensors (one shape per item, the receiver is x).
LIBRARY_METHODS: dict[str, LibraryRule] = {"topk": CR.topk}


# --- Modules ----------------------------------------------------------------------------------


def _field(fields: dict[str, TShape], name: str, owner: str) -> Operand | None:
    shape = fields.get(name)
    return None if shape is None else Operand(f"{owner}.{name}", shape)


def _linear_module(call: Call, fields: dict[str, TShape]) -> Shapes:
    x = call.operand("x", 0)
    if x is None or x.scalar is not None:
        return (None,)
    w, b = _field(fields, "w", call.self_label), _field(fields, "b", call.self_label)
    if w is None:
        w = Operand("w", TShape((None, None)))
    shape = L.linear(x, w, b, "Linear")
    if shape is None and x.shape.fixed and x.shape.dims:
        return (TShape((*x.shape.dims[:-1], None), x.shape.dtype),)
    return (shape,)


def _layer_norm_module(call: Call, fields: dict[str, TShape]) -> Shapes:
    x = call.operand("x", 0)
    if x is None or x.scalar is not None:
        return (None,)
    params = [
        p for p in (_field(fields, n, call.self_label) for n in ("weight", "bias")) if p is not None
    ]
    return (L.layer_norm(x, params, [-1]),)


def _channel_module(op: str, tuple_result: bool) -> ModuleRule:
    def rule(call: Call, fields: dict[str, TShape]) -> Shapes:
        x = call.operand("x", 0)
        if x is None or x.scalar is not None:
            return (None, None) if tuple_result else (None,)
        if x.shape.fixed and len(x.shape.dims) < 2:
            raise Mismatch(f"{op}: needs [N, c, *spatial], got {x.describe()}")
        for name in ("weight", "bias", "running_mean", "running_var"):
            _channel_check(op, x, _field(fields, name, call.self_label), name)
        return (x.shape, None) if tuple_result else (x.shape,)

    return rule


MODULE_CALLS: dict[str, ModuleRule] = {
    "shapegrad.nn.layers.Linear": _linear_module,
    "shapegrad.nn.norms.LayerNorm": _layer_norm_module,
    "shapegrad.nn.norms.BatchNorm": _channel_module("BatchNorm", True),
    "shapegrad.nn.norms.GroupNorm": _channel_module("GroupNorm", False),
}
