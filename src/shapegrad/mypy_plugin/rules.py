"""Shape rules of shapegrad's functional ops and Tensor methods, keyed by name.

Each rule takes a :class:`Call` and returns the result shape (None: unknown)
or raises :class:`Mismatch`. Arguments that are not literal make the result
unknown instead of guessing.
"""

from __future__ import annotations

from collections.abc import Callable

from mypy.nodes import (
    Expression,
    IndexExpr,
    ListExpr,
    MemberExpr,
    NameExpr,
    OpExpr,
    SliceExpr,
    StarExpr,
    TupleExpr,
)
from mypy.types import Instance, get_proper_type

from . import algebra as A
from . import composite_rules as CR
from . import layers as L
from . import sizes
from .algebra import Operand
from .call import Call
from .literals import (
    DYNAMIC,
    bool_of,
    index_items,
    int_of,
    ints_of,
    is_none,
    pair_of,
    str_of,
)
from .spec import Dim, Expr, Sym, TShape, Var, show_item

Rule = Callable[[Call], TShape | None]

_UNARY = [
    "exp",
    "log",
    "sqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "relu",
    "gelu",
    "abs",
    "neg",
    "stop_gradient",
    "detach",
    "dropout",
    "zeros_like",
    "ones_like",
    "__neg__",
    "__pos__",
    "__abs__",
    "__invert__",
]
_ARITH = {
    "__add__": "add",
    "__sub__": "sub",
    "__mul__": "mul",
    "__truediv__": "div",
    "__pow__": "pow",
}
_COMPARE = {
    "__lt__": "lt",
    "__le__": "le",
    "__gt__": "gt",
    "__ge__": "ge",
    "__eq__": "eq",
    "__ne__": "ne",
}
_REDUCE = ("sum", "mean", "max", "min", "var", "logsumexp")


def _x(call: Call) -> Operand | None:
    """The main tensor: ``self`` for methods, else the first argument."""
    return call.self_operand if call.self_operand is not None else call.operand("x", 0)


def _arith_dtype(op: str, a: Operand, b: Operand) -> str | None:
    """Result dtype kind when certain: comparisons give bool; ``int`` + ``0.5`` is unknown."""
    if op in ("lt", "le", "gt", "ge", "eq", "ne"):
        return "bool"
    kinds = [o.shape.dtype for o in (a, b) if o.scalar is None]
    dtype = A.join_dtype(*kinds) if kinds else None
    for o in (a, b):
        if o.scalar is not None and not (o.scalar == "int" or dtype == "float"):
            return None  # a float or bool Python number may promote or reject the tensor dtype
    if op == "div":
        return "float" if dtype == "float" else None
    return None if dtype == "bool" else dtype


def _binary(op: str, reverse: bool) -> Rule:
    def rule(call: Call) -> TShape | None:
        a, b = call.self_operand, call.operand("other", 0)
        if a is None or b is None:
            return None
        left, right = (b, a) if reverse else (a, b)
        return A.broadcast(op, [left, right], _arith_dtype(op, left, right))

    return rule


def _unary(call: Call) -> TShape | None:
    x = _x(call)
    if x is None or x.scalar is not None:
        return None  # a Python number passed where a tensor is expected: leave it to run time
    keeps_dtype = is_none(call.expr("dtype", 99))
    return x.shape if keeps_dtype else TShape(x.shape.dims, None)


def _softmax(call: Call) -> TShape | None:
    x = _x(call)
    axis = call.expr("axis", 0 if call.self_operand else 1)
    if x is not None and (a := int_of(axis) if axis is not None else -1) is not None:
        A.resolve_axis("softmax", x, a)
    return x.shape if x is not None else None


def _reduction(name: str) -> Rule:
    def rule(call: Call) -> TShape | None:
        x = _x(call)
        base = 0 if call.self_operand else 1
        axis_expr = call.expr("axis", base)
        keep = bool_of(call.expr("keepdims", base + 1), False)
        if x is None or keep is None:
            return None
        axes = None if is_none(axis_expr) else ints_of(axis_expr)
        if axes is None and not is_none(axis_expr):
            return None
        dtype = x.shape.dtype if name in ("max", "min") or x.shape.dtype == "float" else None
        return A.reduce(name, x, axes, keep, dtype)

    return rule


def _argmax(call: Call) -> TShape | None:
    x = _x(call)
    axis_expr = call.expr("axis", 0 if call.self_operand else 1)
    axis = -1 if axis_expr is None else int_of(axis_expr)
    if x is None or axis is None:
        return None
    return A.reduce("argmax", x, [axis], False, "int")


def sizes_of(call: Call, exprs: list[Expression]) -> list[Dim] | None:
    """Sizes from ``f(2, b)``, ``f((2, t - 1))``, ``f(y.shape)``, ``f(*y.shape[:-1], h, -1)``
    or ``f(y.shape[:-1] + (k,))`` arguments (see :mod:`intsize`); None if not understood."""
    if len(exprs) == 1 and not _is_int(call, exprs[0]):
        return size_sequence(call, exprs[0])
    out: list[Dim] = []
    for e in exprs:
        if not _is_int(call, e):  # `*y.shape[:-1]`: mypy passes the unstarred tuple
            run = size_sequence(call, e)
            if run is None:
                return None
            out.extend(run)
            continue
        size = call.env.size(e)
        out.append(size if not isinstance(size, Var) else None)
    return out


def size_sequence(call: Call, expr: Expression) -> list[Dim] | None:
    """The sizes a tuple expression holds: ``(2, t)``, ``[b, *y.shape[1:]]``, ``y.shape``,
    ``y.shape[:-1]`` (literal slice bounds), ``a + b``; None when not understood (a tuple
    held in a variable is not followed)."""
    env = call.env
    if isinstance(expr, TupleExpr | ListExpr):
        out: list[Dim] = []
        for e in expr.items:
            if isinstance(e, StarExpr):
                run = size_sequence(call, e.expr)
                if run is None:
                    return None
                out.extend(run)
                continue
            size = env.size(e)
            out.append(size if not isinstance(size, Var) else None)
        return out
    if isinstance(expr, OpExpr) and expr.op == "+":
        left, right = size_sequence(call, expr.left), size_sequence(call, expr.right)
        return None if left is None or right is None else left + right
    window = slice(None)
    if isinstance(expr, IndexExpr) and isinstance(expr.index, SliceExpr):
        bounds = [expr.index.begin_index, expr.index.end_index, expr.index.stride]
        ints = [None if b is None else int_of(b) for b in bounds]
        if any(i is None and b is not None for i, b in zip(ints, bounds, strict=True)):
            return None
        window, expr = slice(*ints), expr.base
    if isinstance(expr, MemberExpr) and expr.name == "shape":
        dims = env.dims_of(expr.expr)
        if dims is None or not all(isinstance(d, int | Sym | Expr) for d in dims):
            return None
        return [d for d in dims[window] if isinstance(d, int | Sym | Expr)]
    return None


def _is_int(call: Call, expr: Expression) -> bool:
    typ = call.env.type_of(expr)
    proper = get_proper_type(typ) if typ is not None else None
    return isinstance(proper, Instance) and proper.type.fullname in (
        "builtins.int",
        "builtins.bool",
    )


def _reshape(call: Call) -> TShape | None:
    x = _x(call)
    exprs = call.all_exprs("shape", 0 if call.self_operand else 1)
    sizes = sizes_of(call, exprs)
    if x is None or sizes is None:
        return None
    return A.reshape(x, sizes)


def _flatten(call: Call) -> TShape | None:
    """``x.flatten()`` (NumPy) or PyTorch's ``x.flatten(start_dim, end_dim)`` (literal axes)."""
    x = _x(call)
    start_expr, end_expr = call.expr("start_dim", 0), call.expr("end_dim", 1)
    if x is None or x.scalar is not None:
        return None
    if start_expr is None and end_expr is None:
        return A.reshape(x, [-1])
    start = 0 if start_expr is None else int_of(start_expr)
    end = -1 if end_expr is None else int_of(end_expr)
    if start is None or end is None or not x.shape.fixed or not x.shape.dims:
        return None
    a, b = A.resolve_axis("flatten", x, start), A.resolve_axis("flatten", x, end)
    if a is None or b is None or a > b:
        return None  # start after end: the library's own error at run time
    dims = x.shape.dims
    return x.shape.with_dims([*dims[:a], sizes.product(dims[a : b + 1]), *dims[b + 1 :]])


def _expand(call: Call) -> TShape | None:
    """PyTorch's ``x.expand(*sizes)``: ``broadcast_to`` where ``-1`` keeps ``x``'s size."""
    x = _x(call)
    target = sizes_of(call, call.all_exprs("sizes", 0))
    if x is None or target is None or x.scalar is not None or not x.shape.fixed:
        return None
    lead = len(target) - len(x.shape.dims)
    if lead < 0 or any(s == -1 for s in target[:lead]):
        return None  # the library's own error at run time
    out = [x.shape.dims[i - lead] if s == -1 and i >= lead else s for i, s in enumerate(target)]
    A.broadcast("expand", [x, Operand("", TShape(tuple(out)))])
    return TShape(tuple(out), x.shape.dtype)


def _take(call: Call) -> TShape | None:
    """``take(x, indices, axis)`` / ``gather``: ``x.shape[:axis] + indices.shape +
    x.shape[axis + 1:]`` for a literal axis and shaped int indices (flattened ``x``: the
    indices' shape)."""
    x = _x(call)
    base = 0 if call.self_operand is not None else 1
    idx = call.operand("indices", base) or call.operand("idx", base)
    axis_expr = call.expr("axis", base + 1)
    if x is None or idx is None or idx.scalar is not None or x.scalar is not None:
        return None
    if idx.shape.dtype not in ("int", None):
        return None
    if is_none(axis_expr):
        return TShape(idx.shape.dims, x.shape.dtype)
    axis = int_of(axis_expr) if axis_expr is not None else None
    if axis is None or not x.shape.fixed:
        return None
    pos = A.resolve_axis("take", x, axis)
    if pos is None:
        return None
    dims = x.shape.dims
    return L.prepend(TShape(dims[:pos]), (*idx.shape.dims, *dims[pos + 1 :]), x.shape.dtype)


def _transpose(call: Call) -> TShape | None:
    x = _x(call)
    if x is None:
        return None
    if call.self_operand is not None:
        exprs = call.all_exprs("axes", 0)
        perm = [int_of(e) for e in exprs]
        if len(exprs) == 1 and isinstance(exprs[0], TupleExpr | ListExpr):
            perm = [int_of(e) for e in exprs[0].items]
    else:
        axes = call.expr("axes", 1)
        perm = None if is_none(axes) else ints_of(axes)  # type: ignore[assignment]
        if perm is None and not is_none(axes):
            return None
    if perm is not None and any(p is None for p in perm):
        return None
    return A.transpose("transpose", x, None if not perm else [p for p in perm if p is not None])


def _permute(call: Call) -> TShape | None:
    x = _x(call)
    exprs = call.all_exprs("axes", 0)
    if len(exprs) == 1 and isinstance(exprs[0], TupleExpr | ListExpr):
        exprs = list(exprs[0].items)  # x.permute((0, 2, 1)), as x.permute(0, 2, 1)
    perm = [int_of(e) for e in exprs]
    if x is None or any(p is None for p in perm):
        return None
    return A.transpose("permute", x, [p for p in perm if p is not None])


def _swapaxes(call: Call) -> TShape | None:
    x = call.self_operand
    a = int_of(call.expr("axis1", 0))
    b = int_of(call.expr("axis2", 1))
    if x is None or x.scalar is not None or a is None or b is None:
        return None
    return A.swapaxes(x, a, b)


def _join(name: str) -> Rule:
    def rule(call: Call) -> TShape | None:
        seq = call.expr("tensors", 0)
        axis_expr = call.expr("axis", 1)
        axis = 0 if axis_expr is None else int_of(axis_expr)
        if not isinstance(seq, ListExpr | TupleExpr) or axis is None:
            return None
        xs = [call.env.operand(e, call.env.type_of(e)) for e in seq.items]
        if any(o is None or o.scalar is not None for o in xs):
            return None
        return A.concat(name, [o for o in xs if o is not None], axis, new_axis=name == "stack")

    return rule


def _matmul(call: Call) -> TShape | None:
    a: Operand | None = call.self_operand
    b: Operand | None = call.operand("other", 0)
    if a is None:
        a, b = call.operand("a", 0), call.operand("b", 1)
    return None if a is None or b is None else A.matmul(a, b)


def _rmatmul(call: Call) -> TShape | None:
    a, b = call.operand("other", 0), call.self_operand
    return None if a is None or b is None else A.matmul(a, b)


def _einsum(call: Call) -> TShape | None:
    spec = str_of(call.expr("spec", 0))
    operands = call.operands("operands", 1)
    if spec is None or not operands or any(o is None for o in operands):
        return None
    return A.einsum(spec, [o for o in operands if o is not None])


def _where(call: Call) -> TShape | None:
    ops = [call.operand("cond", 0), call.operand("a", 1), call.operand("b", 2)]
    if any(o is None for o in ops):
        return None
    cond, a, b = (o for o in ops if o is not None)
    dtype = _arith_dtype("where", a, b)
    return A.broadcast("where", [cond, a, b], None if dtype == "bool" else dtype)


def _elementwise2(name: str) -> Rule:
    def rule(call: Call) -> TShape | None:
        a, b = (
            call.operand("a", 0) or call.operand("x", 0),
            call.operand("b", 1) or call.operand("y", 1),
        )
        if a is None or b is None:
            return None
        return A.broadcast(name, [a, b], _arith_dtype(name, a, b))

    return rule


def _index(call: Call) -> TShape | None:
    """Basic indexing, and one integer tensor among the indices (``table[ids]``,
    ``x[:, steps]``): its dims replace the axis it indexes, as in NumPy. Two or more
    index tensors (broadcast together, maybe moved to the front) and masks: unknown."""
    x = call.self_operand
    expr = call.expr("index", 0)
    if x is None or expr is None:
        return None
    parts = list(expr.items) if isinstance(expr, TupleExpr) else [expr]
    picked = [(k, o) for k, p in enumerate(parts) if (o := _int_tensor(call, p)) is not None]
    if len(picked) > 1:
        return None
    gather = picked[0][1] if picked else None
    at = picked[0][0] if picked else len(parts)
    index = parts[at] if picked else None
    items = index_items(expr, call.env.size, lambda e: _is_int(call, e) or e is index)
    shape = None if items is None else L.index(x, items)
    if shape is None or gather is None or items is None:
        return shape
    if any(isinstance(i, int) or i is DYNAMIC for k, i in enumerate(items) if k != at):
        return None  # an int beside an index tensor is one more advanced index (NumPy)
    before = items[:at]
    real = [i for i in items if i is not None and i is not Ellipsis]
    pos = sum(1 for i in before if i is None or isinstance(i, slice))
    if Ellipsis in before:
        pos += len(x.shape.dims) - len(real)
    return shape.with_dims([*shape.dims[:pos], *gather.shape.dims, *shape.dims[pos:]])


def _int_tensor(call: Call, expr: Expression) -> Operand | None:
    """An index that is an integer tensor of known rank (a bool mask is not one)."""
    if isinstance(expr, SliceExpr) or is_none(expr):
        return None
    o = call.env.operand(expr, call.env.type_of(expr))
    if o is None or o.scalar is not None or not o.shape.fixed or o.shape.dtype != "int":
        return None
    return o


def _conv2d(call: Call) -> TShape | None:
    x, w = call.operand("x", 0), call.operand("w", 1)
    bias = call.operand("bias", 2)
    if x is None or w is None:
        return None
    return L.conv2d(
        x,
        w,
        bias,
        pair_of(call.expr("stride", 3), (1, 1)),
        pair_of(call.expr("padding", 4), (0, 0)),
    )


def _pool(name: str) -> Rule:
    def rule(call: Call) -> TShape | None:
        x = call.operand("x", 0)
        kernel = pair_of(call.expr("kernel_size", 1), None)
        stride_expr = call.expr("stride", 2)
        stride = kernel if is_none(stride_expr) else pair_of(stride_expr, None)
        return (
            None
            if x is None
            else L.pool2d(name, x, kernel, stride, pair_of(call.expr("padding", 3), (0, 0)))
        )

    return rule


def _same_shape(name: str) -> Rule:
    def rule(call: Call) -> TShape | None:
        a, b = (
            call.operand("pred", 0) or call.operand("scores", 0),
            call.operand("target", 1) or call.operand("labels", 1),
        )
        return None if a is None or b is None else L.same_shape(name, a, b)

    return rule


def _layer_norm(call: Call) -> TShape | None:
    x = call.operand("x", 0)
    if x is None:
        return None
    params = [p for p in (call.operand("weight", 1), call.operand("bias", 2)) if p is not None]
    axis_expr = call.expr("axis", 4)
    axes = [-1] if axis_expr is None else ints_of(axis_expr)
    return L.layer_norm(x, params, axes)


def _one_hot(call: Call) -> TShape | None:
    labels = call.operand("labels", 0)
    n = call.env.size(call.expr("num_classes", 1))
    if labels is None:
        return None
    return L.prepend(labels.shape, (n,), "float" if call.expr("dtype", 2) is None else None)


def _embedding(call: Call) -> TShape | None:
    table, ids = call.operand("table", 0), call.operand("ids", 1)
    if table is None or ids is None or not table.shape.fixed or len(table.shape.dims) != 2:
        return None
    return L.prepend(ids.shape, table.shape.dims[1:], table.shape.dtype)


def _creation(call: Call) -> TShape | None:
    sizes = sizes_of(call, call.all_exprs("shape", 0)[:1])
    dtype_given = call.given("dtype", 99)
    return None if sizes is None else TShape(tuple(sizes), None if dtype_given else "float")


def _arange(call: Call) -> TShape | None:
    """``arange(n)`` is ``[n]``; ``arange(a, b)`` is ``[b - a]`` (unit step, sizes as ints)."""
    env = call.env
    start, stop = call.expr("start", 0), call.expr("stop", 1)
    if call.given("step", 2) or start is None:
        return None
    length = env.size(start) if is_none(stop) else sizes.sub(env.size(stop), env.size(start))
    dtype = None if call.given("dtype", 3) else _arange_dtype(call, [start, stop])
    return TShape((length,), dtype)


def _arange_dtype(call: Call, exprs: list[Expression | None]) -> str | None:
    return "int" if all(e is None or _is_int(call, e) for e in exprs) else None


def _eye(call: Call) -> TShape | None:
    n = call.env.size(call.expr("n", 0))
    m_expr = call.expr("m", 1)
    m = n if is_none(m_expr) else call.env.size(m_expr)
    return TShape((n, m), None if call.given("dtype", 3) else "float")


def _astype(call: Call) -> TShape | None:
    x = _x(call)
    dtype = call.expr("dtype", 0)
    # "int64", or sg.int64 / np.uint8 (the attribute's name)
    name = str_of(dtype) or (dtype.name if isinstance(dtype, MemberExpr | NameExpr) else "")
    kind = (
        "float"
        if name.startswith(("float", "bfloat"))
        else "int"
        if name.startswith(("int", "uint"))
        else "bool"
        if name in ("bool", "bool_")
        else None
    )
    return None if x is None else TShape(x.shape.dims, kind)


def _cast_to(kind: str) -> Rule:
    """PyTorch's cast methods (``x.float()``, ``x.long()``, ``x.byte()``, ...): the shape
    kept, the element kind the method names."""

    def rule(call: Call) -> TShape | None:
        x = _x(call)
        return None if x is None else TShape(x.shape.dims, kind)

    return rule


# Tensor's cast methods and the element kind each gives (uint8 is an "int", as UInt8 is).
_CASTS = {
    "float": "float",
    "double": "float",
    "half": "float",
    "bfloat16": "float",
    "int": "int",
    "long": "int",
    "byte": "int",
    "bool": "bool",
}


def _broadcast_to(call: Call) -> TShape | None:
    x = _x(call)
    sizes = sizes_of(call, call.all_exprs("shape", 0))
    if x is None or sizes is None:
        return None
    A.broadcast("broadcast_to", [x, Operand("", TShape(tuple(sizes)))])
    return TShape(tuple(sizes), x.shape.dtype)


def _linear(call: Call) -> TShape | None:
    x, w = call.operand("x", 0), call.operand("w", 1)
    b = call.operand("b", 2)
    if x is None or w is None or x.scalar is not None:
        return None
    return L.linear(x, w, b if b is not None and b.scalar is None else None)


def _mlp(call: Call) -> TShape | None:
    """``sg.nn.mlp(params, x)``: ``linear`` over (weight, bias) pairs of a ParamList/tuple."""
    x = call.operand("x", 1)
    items = call.tuple_operands("params", 0)
    if x is None or items is None or len(items) % 2 or x.scalar is not None:
        return None
    h: Operand | None = x
    for i in range(0, len(items), 2):
        w, b = items[i], items[i + 1]
        if h is None or w is None:
            return None
        shape = L.linear(h, w, b, f"mlp layer {i // 2 + 1}")
        h = None if shape is None else Operand("", shape)
    return None if h is None else h.shape


def _squeeze(call: Call) -> TShape | None:
    """``squeeze(x, axis)``: literal axes of size 1 removed (all known 1s for ``axis=None``)."""
    x = _x(call)
    axis_expr = call.expr("axis", 0 if call.self_operand else 1)
    if x is None or not x.shape.fixed:
        return None
    dims = x.shape.dims
    if is_none(axis_expr):
        if any(d is None or isinstance(d, Sym | Expr) for d in dims):
            return None  # a dim of unknown size may be 1
        return x.shape.with_dims([d for d in dims if d != 1])
    axes = ints_of(axis_expr)
    if axes is None:
        return None
    positions = {A.resolve_axis("squeeze", x, a) for a in axes}
    for pos in positions:
        if pos is not None and A.differ(dims[pos], 1):
            raise A.Mismatch(
                f"squeeze: cannot squeeze axis {pos} of size {show_item(dims[pos])} "
                f"in {x.describe()}"
            )
    return x.shape.with_dims([d for i, d in enumerate(dims) if i not in positions])


def _expand_dims(name: str) -> Rule:
    def rule(call: Call) -> TShape | None:
        x = _x(call)
        formal = "dim" if name == "unsqueeze" else "axis"
        axes = ints_of(call.expr(formal, 0 if call.self_operand else 1))
        if x is None or axes is None or not x.shape.fixed or x.scalar is not None:
            return None
        rank = len(x.shape.dims) + len(axes)
        target = Operand("", TShape((None,) * rank))
        positions = {A.resolve_axis(name, target, a) for a in axes}
        if len(positions) != len(axes):
            raise A.Mismatch(f"{name}: repeated axis in {tuple(axes)}")
        rest = iter(x.shape.dims)
        return x.shape.with_dims([1 if i in positions else next(rest) for i in range(rank)])

    return rule


FUNCTION_RULES: dict[str, Rule] = {
    "squeeze": _squeeze,
    "expand_dims": _expand_dims("expand_dims"),
    "unsqueeze": _expand_dims("unsqueeze"),
    "linear": _linear,
    "mlp": _mlp,
    **dict.fromkeys(_UNARY, _unary),
    **{name: _reduction(name) for name in _REDUCE},
    "softmax": _softmax,
    "log_softmax": _softmax,
    "argmax": _argmax,
    "maximum": _elementwise2("maximum"),
    "minimum": _elementwise2("minimum"),
    "pow": _elementwise2("pow"),
    "where": _where,
    "matmul": _matmul,
    "einsum": _einsum,
    "reshape": _reshape,
    "transpose": _transpose,
    "concat": _join("concat"),
    "stack": _join("stack"),
    "conv2d": _conv2d,
    "max_pool2d": _pool("max_pool2d"),
    "avg_pool2d": _pool("avg_pool2d"),
    "cross_entropy": CR.cross_entropy,
    "mse": _same_shape("mse"),
    "hinge": _same_shape("hinge"),
    "layer_norm": _layer_norm,
    "one_hot": _one_hot,
    "embedding": _embedding,
    **dict.fromkeys(("zeros", "ones", "rand", "randn", "full"), _creation),
    "eye": _eye,
    "arange": _arange,
    "clip": _unary,
    "take": _take,
    "gather": _take,
    # issue 25's composites
    **dict.fromkeys(("silu", "softplus", "elu", "leaky_relu", "erf", "flip", "roll"), _unary),
    "argmin": CR.argmin,
    "all": CR.bool_reduction("all"),
    "any": CR.bool_reduction("any"),
    "norm": CR.norm,
    "tril": CR.matrix_like("tril"),
    "triu": CR.matrix_like("triu"),
    "tile": CR.tile,
    "repeat": CR.repeat,
    "conv1d": CR.conv1d,
    "conv_transpose2d": CR.conv_transpose2d,
    "cumsum": CR.cumsum,
    "interpolate": CR.interpolate,
    "sort": CR.sort_like("sort"),
    "argsort": CR.sort_like("argsort"),
}

METHOD_RULES: dict[str, Rule] = {
    "squeeze": _squeeze,
    "expand_dims": _expand_dims("expand_dims"),
    "unsqueeze": _expand_dims("unsqueeze"),
    **dict.fromkeys(_UNARY, _unary),
    **{name: _reduction(name) for name in _REDUCE},
    **{m: _binary(op, False) for m, op in {**_ARITH, **_COMPARE}.items()},
    **{"__r" + m[2:]: _binary(op, True) for m, op in _ARITH.items()},
    "softmax": _softmax,
    "log_softmax": _softmax,
    "argmax": _argmax,
    "__matmul__": _matmul,
    "__rmatmul__": _rmatmul,
    "__getitem__": _index,
    "reshape": _reshape,
    "flatten": _flatten,
    "view": _reshape,
    "expand": _expand,
    "clamp": _unary,
    "clip": _unary,
    "take": _take,
    "transpose": _transpose,
    "permute": _permute,
    "swapaxes": _swapaxes,
    "astype": _astype,
    "broadcast_to": _broadcast_to,
    "sort": CR.sort_like("sort"),
    "argsort": CR.sort_like("argsort"),
    **{name: _cast_to(kind) for name, kind in _CASTS.items()},
}
