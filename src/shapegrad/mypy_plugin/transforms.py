"""Calls through function transforms: ``sg.value_and_grad(loss)(params, x, y)`` and friends.

The runtime signatures are ``Callable[..., Any]``, which would hide the loss's
annotations exactly where features and labels meet. Here the transforms keep
the wrapped function's signature: ``value_and_grad(f)`` is ``f``'s parameters
returning ``(f's result, d/d argnums)``, ``grad(f)`` returns the gradients,
``compile(f)`` is a :class:`Compiled` instance remembering ``f`` (its ``.graph``
and ``.stats`` still type-check), and ``ScalarTrainer(loss, params)`` remembers
``loss``, so ``trainer.step(x, y)`` is checked against ``loss``'s inputs.
``vmap(f)`` is ``f``'s signature with a batch dim on each batched argument and
output, ``jvp``/``linearize`` return ``f``'s result (checked on literal primals),
``custom_vjp(f)``/``custom_jvp(f)`` remember ``f``, and ``jacrev(f)``/``jacfwd(f)`` return
the output's dims then the argument's (``hessian``: the argument's twice). Whatever is not a literal
(axes in a variable, pytrees of axes, ``*args``) keeps the plain runtime type.
"""

from __future__ import annotations

from mypy.nodes import (
    ARG_POS,
    ARG_STAR,
    ARG_STAR2,
    Expression,
    NameExpr,
    StarExpr,
    TempNode,
    TupleExpr,
    TypeInfo,
)
from mypy.plugin import FunctionContext, FunctionSigContext, MethodContext
from mypy.types import (
    AnyType,
    CallableType,
    FunctionLike,
    Instance,
    NoneType,
    TupleType,
    Type,
    TypeOfAny,
    get_proper_type,
)

from .calls import check_call, positional
from .carrier import attach, attach_fn, is_tensor, shape_of, tensor_items, wrapped_fn
from .env import Env
from .literals import bool_of, int_of
from .spec import Item, Sym, TShape, names_in, restrict, show
from .unify import compare

VALUE_AND_GRAD = "shapegrad.autodiff.value_and_grad"
GRAD = "shapegrad.autodiff.grad"
COMPILE = "shapegrad.jit.compile"
COMPILED_CALL = "shapegrad.jit.Compiled.__call__"
TRAINER = "shapegrad.train.trainer.ScalarTrainer"
SCAN = "shapegrad.control.scan"
CHECKPOINT = "shapegrad.control.checkpoint"
# Trainer methods whose ``*inputs`` are the loss's arguments after ``params``.
TRAINER_METHODS = frozenset(
    f"{TRAINER}.{m}" for m in ("step", "forward", "backward", "adam_step", "adamw_step")
)


def _arg(ctx: FunctionContext, name: str, position: int) -> int | None:
    names = list(ctx.callee_arg_names)
    slot = names.index(name) if name in names else position
    return slot if slot < len(ctx.args) and ctx.args[slot] else None


def _fn_type(ctx: FunctionContext) -> CallableType | None:
    return _fn_type_at(ctx, "fn", 0)


def differentiate(ctx: FunctionContext, with_value: bool) -> Type:
    """``value_and_grad(fn, argnums, has_aux)`` / ``grad(...)``: ``fn``'s signature, new result."""
    fn = _fn_type(ctx)
    if fn is None:
        return ctx.default_return_type
    argnums_slot = _arg(ctx, "argnums", 1)
    expr = ctx.args[argnums_slot][0] if argnums_slot is not None else None
    nums: list[int] | None = [0] if expr is None else None
    if expr is not None and (single := int_of(expr)) is not None:
        nums = [single]
    elif isinstance(expr, TupleExpr):
        values = [int_of(e) for e in expr.items]
        nums = None if any(v is None for v in values) else [v for v in values if v is not None]
    aux_slot = _arg(ctx, "has_aux", 2)
    has_aux = bool_of(ctx.args[aux_slot][0] if aux_slot is not None else None, False)
    anything = AnyType(TypeOfAny.special_form)
    fallback = ctx.api.named_generic_type("builtins.tuple", [anything])
    grads: Type = anything
    if nums is not None and all(-len(fn.arg_types) <= n < len(fn.arg_types) for n in nums):
        picked = [fn.arg_types[n] for n in nums]
        single_num = expr is None or int_of(expr) is not None
        grads = picked[0] if single_num else TupleType(picked, fallback)
    if has_aux is None:
        return ctx.default_return_type
    if has_aux:
        if not with_value:
            aux = _second(fn.ret_type)
            result: Type = TupleType([grads, aux], fallback) if aux is not None else anything
        else:
            result = TupleType([fn.ret_type, grads], fallback)
    else:
        result = TupleType([fn.ret_type, grads], fallback) if with_value else grads
    return fn.copy_modified(ret_type=result)


def _second(typ: Type) -> Type | None:
    proper = get_proper_type(typ)
    return proper.items[1] if isinstance(proper, TupleType) and len(proper.items) == 2 else None


def compile_fn(ctx: FunctionContext) -> Type:
    """``sg.compile(fn, ...)``: a ``Compiled`` that remembers ``fn``."""
    fn = _fn_type(ctx)
    compiled = _instance(ctx, "shapegrad.jit", "Compiled")
    return ctx.default_return_type if fn is None or compiled is None else attach_fn(compiled, fn)


def _instance(ctx: FunctionContext, module: str, name: str) -> Instance | None:
    """An instance of class ``module.name`` if mypy loaded that module."""
    tree = getattr(ctx.api, "modules", {}).get(module)
    node = tree.names.get(name) if tree is not None else None
    info = node.node if node is not None else None
    return Instance(info, []) if isinstance(info, TypeInfo) else None


def make_trainer(ctx: FunctionContext) -> Type:
    """``ScalarTrainer(loss, params, ...)``: check ``params`` against ``loss``; remember ``loss``."""
    fn = _fn_type_at(ctx, "loss_fn", 0)
    if fn is None:
        return ctx.default_return_type
    slot = _arg(ctx, "params", 1)
    if slot is not None and fn.arg_types:
        laid = positional(fn, [ctx.args[slot][0]], [ctx.arg_types[slot][0]], 0)
        if laid is not None:
            name = (fn.name or "loss").split(" of ")[0]
            check_call(Env(ctx.api), ctx.context, fn, *laid, ctx.default_return_type, name)
    return attach_fn(ctx.default_return_type, fn)


def trainer_signature(ctx: FunctionSigContext) -> FunctionLike:
    """``ScalarTrainer(loss, ...)`` also takes a loss returning ``(loss, new_params)``.

    The runtime annotation says ``Callable[..., Tensor]``; the documented BatchNorm
    pattern returns the updated state too, so the loss parameter accepts any callable
    (its inputs are still checked, see :func:`make_trainer`).
    """
    sig = ctx.default_signature
    if "loss_fn" not in sig.arg_names:
        return sig
    anything = AnyType(TypeOfAny.special_form)
    loose = CallableType(
        [anything, anything],
        [ARG_STAR, ARG_STAR2],
        [None, None],
        anything,
        ctx.api.named_generic_type("builtins.function", []),
    )
    slot = sig.arg_names.index("loss_fn")
    return sig.copy_modified(arg_types=[*sig.arg_types[:slot], loose, *sig.arg_types[slot + 1 :]])


def _fn_type_at(ctx: FunctionContext, name: str, position: int) -> CallableType | None:
    slot = _arg(ctx, name, position)
    if slot is None:
        return None
    fn = get_proper_type(ctx.arg_types[slot][0])
    if isinstance(fn, CallableType) and not fn.is_type_obj():
        return fn
    return wrapped_fn(fn)


def call_wrapped(ctx: MethodContext, skip: int) -> Type:
    """``compiled(*args)`` / ``trainer.step(*inputs)``: check against the wrapped function."""
    fn = wrapped_fn(ctx.type)
    # Keyword arguments of a compiled call go to fn (not followed); a trainer's are its own (lr=).
    if fn is None or not ctx.args or (skip == 0 and any(ctx.args[1:])):
        return ctx.default_return_type
    laid = positional(fn, ctx.args[0], ctx.arg_types[0], skip)
    if laid is None:
        return ctx.default_return_type
    name = (fn.name or "call").split(" of ")[0]
    result = check_call(Env(ctx.api), ctx.context, fn, *laid, fn.ret_type, name)
    return result if skip == 0 else ctx.default_return_type


# --- control flow: sg.checkpoint / sg.scan ----------------------------------------------------


def checkpoint(ctx: FunctionContext) -> Type:
    """``sg.checkpoint(fn)`` calls ``fn``: it has ``fn``'s signature (and its shape checks)."""
    fn = _fn_type(ctx)
    return ctx.default_return_type if fn is None else fn


def scan(ctx: FunctionContext) -> Type:
    """``sg.scan(f, init, xs)``: ``f`` checked on (carry, one slice of xs); ``(carry, stacked ys)``.

    The final carry has ``init``'s type (scan keeps the carry's structure and shapes,
    and the body returning another carry shape is reported); each tensor of the
    body's ``y`` gains the leading length of ``xs`` (or ``length``).
    """
    default = get_proper_type(ctx.default_return_type)
    fn = _fn_type_at(ctx, "f", 0)
    init_slot, xs_slot = _arg(ctx, "init", 1), _arg(ctx, "xs", 2)
    if fn is None or init_slot is None or not isinstance(default, TupleType):
        return ctx.default_return_type
    env = Env(ctx.api)
    init_expr = ctx.args[init_slot][0]
    init_type = env.flow_type(init_expr, ctx.arg_types[init_slot][0]) or AnyType(
        TypeOfAny.special_form
    )
    slice_type: Type = NoneType()
    length: Item = None
    if xs_slot is not None:
        xs_expr = ctx.args[xs_slot][0]
        xs_type = env.flow_type(xs_expr, ctx.arg_types[xs_slot][0])
        sliced = _slice(env, xs_type) if xs_type is not None else None
        if sliced is None:
            return ctx.default_return_type
        slice_type, length = sliced
    length_slot = _arg(ctx, "length", 3)
    if length is None and length_slot is not None:
        length = env.size(ctx.args[length_slot][0])
    nodes = [TempNode(t, context=init_expr) for t in (init_type, slice_type)]
    laid = positional(fn, list(nodes), [init_type, slice_type], 0)
    if laid is None:
        return ctx.default_return_type
    name = (fn.name or "body").split(" of ")[0]
    result = get_proper_type(check_call(env, ctx.context, fn, *laid, fn.ret_type, name))
    if not isinstance(result, TupleType) or len(result.items) != 2:
        return ctx.default_return_type
    _check_carry(env, ctx, name, init_type, result.items[0])
    # Fresh instances: mypy's union simplification of a tuple's items may erase the
    # extra attributes of the very instance it keeps, which would be the init variable's.
    carry = _stacked(env, init_type if tensor_items(init_type) else result.items[0], None, False)
    ys = _stacked(env, result.items[1], length)
    return default.copy_modified(items=[carry, ys])


def _slice(env: Env, typ: Type) -> tuple[Type, Item] | None:
    """One layer's slice of ``xs`` (leading dim dropped) and that length; None if not tensors."""
    proper = get_proper_type(typ)
    if isinstance(proper, TupleType):
        parts = [_slice(env, item) for item in proper.items]
        if any(p is None for p in parts):
            return None
        lengths = [p[1] for p in parts if p is not None and p[1] is not None]
        items = [p[0] for p in parts if p is not None]
        return proper.copy_modified(items=items), lengths[0] if lengths else None
    if not is_tensor(proper):
        return None
    shape = env.shape(proper)
    if shape is None or not shape.fixed or not shape.dims:
        return attach(proper, None, env.str_type()), None
    lead = shape.dims[0]
    return attach(proper, shape.with_dims(shape.dims[1:]), env.str_type()), lead


def _stacked(env: Env, typ: Type, length: Item, stack: bool = True) -> Type:
    """``typ`` with each tensor's shape given a leading ``length`` (a copy when not ``stack``)."""
    proper = get_proper_type(typ)
    if isinstance(proper, TupleType):
        return proper.copy_modified(items=[_stacked(env, t, length, stack) for t in proper.items])
    if not is_tensor(proper):
        return typ
    shape = env.shape(proper)
    if shape is not None and stack:
        shape = shape.with_dims((length, *shape.dims))
    return attach(proper, shape, env.str_type())


def _check_carry(env: Env, ctx: FunctionContext, name: str, init: Type, out: Type) -> None:
    """The body's returned carry certainly has another shape than ``init``: an error."""
    got = dict(tensor_items(out))
    for path, want in tensor_items(init):
        have = got.get(path)
        if have is None:
            continue
        reason = compare(restrict(have, env.rigid), restrict(want, env.rigid))
        if reason is not None:
            env.fail(
                f"scan: {name} returns carry{path} of shape {show(have.dims)} but init{path} "
                f"is {show(want.dims)} ({reason}); the carry must keep its shape",
                ctx.context,
            )
            return


# --- sg.vmap / sg.jvp / sg.custom_vjp / sg.custom_jvp -----------------------------------------

VMAP = "shapegrad._batching.vmap"
JVP = "shapegrad.transforms.jvp"
LINEARIZE = "shapegrad.transforms.linearize"
CUSTOM_VJP = "shapegrad._custom_vjp.custom_vjp"
CUSTOM_JVP = "shapegrad._custom_jvp.custom_jvp"
JACREV = "shapegrad.transforms.jacrev"
JACFWD = "shapegrad.transforms.jacfwd"
HESSIAN = "shapegrad.transforms.hessian"
CUSTOM_CALLS = frozenset({f"{CUSTOM_VJP}.__call__", f"{CUSTOM_JVP}.__call__"})
BATCH_DIM = "vmap_batch"  # the batch dim vmap adds, named in the messages


def vmap(ctx: FunctionContext) -> Type:
    """``sg.vmap(f, in_axes, out_axes)``: ``f``'s signature with a batch dim per batched argument.

    The batch dim is one named dim of the new signature, so two arguments of different
    batch sizes are reported at the call, and the outputs gain it at ``out_axes``.
    Only literal axes are followed (an int, or a tuple of ints and None); anything
    else, or an argument whose shapes sit where the batch dim cannot be placed (a
    ``ParamList``), leaves the plain ``Callable`` (a false positive is worse than a miss).
    """
    fn = _fn_type(ctx)
    if fn is None or any(k != ARG_POS for k in fn.arg_kinds):
        return ctx.default_return_type
    n = len(fn.arg_types)
    in_slot, out_slot = _arg(ctx, "in_axes", 1), _arg(ctx, "out_axes", 2)
    in_axes = _axes(ctx.args[in_slot][0] if in_slot is not None else None, n)
    out_expr = ctx.args[out_slot][0] if out_slot is not None else None
    # One int for every output; per-output tuples and None (unbatched outputs) not followed.
    out_axis = 0 if out_expr is None else int_of(out_expr)
    if in_axes is None or out_axis is None:
        return ctx.default_return_type
    env = Env(ctx.api)
    dim = Sym(_unused_name(fn), _scope(fn))
    params = [
        _batched(env, t, dim, axis) if axis is not None else t
        for t, axis in zip(fn.arg_types, in_axes, strict=True)
    ]
    ret = _batched(env, fn.ret_type, dim, out_axis)
    if ret is None or any(p is None for p in params) or all(a is None for a in in_axes):
        return ctx.default_return_type
    # No definition: the body is written for one example and must not be re-read with
    # batched arguments (calls.py infers an unannotated result from a helper's body).
    return fn.copy_modified(
        arg_types=[p for p in params if p is not None], ret_type=ret, definition=None
    )


def _axes(expr: Expression | None, n: int) -> list[int | None] | None:
    """``in_axes`` per argument: absent 0, an int literal, None, or a literal tuple of those."""
    if expr is None:
        return [0] * n
    if _is_none(expr):
        return [None] * n
    if (single := int_of(expr)) is not None:
        return [single] * n
    if isinstance(expr, TupleExpr) and len(expr.items) == n:
        out: list[int | None] = []
        for item in expr.items:
            value = None if _is_none(item) else int_of(item)
            if value is None and not _is_none(item):
                return None  # a pytree of axes, or a name: not followed
            out.append(value)
        return out
    return None


def _is_none(expr: Expression) -> bool:
    return isinstance(expr, NameExpr) and expr.fullname == "builtins.None"


def _unused_name(fn: CallableType) -> str:
    taken = {
        n.name
        for t in [*fn.arg_types, fn.ret_type]
        for _, s in tensor_items(t)
        for n in names_in(s)
        if isinstance(n, Sym)
    } | {a for a in fn.arg_names if a}
    name, k = BATCH_DIM, 1
    while name in taken:
        name, k = f"{BATCH_DIM}{k}", k + 1
    return name


def _scope(fn: CallableType) -> str:
    """The scope of ``fn``'s own named dims (where its annotations were written)."""
    for t in [*fn.arg_types, fn.ret_type]:
        for _, shape in tensor_items(t):
            for n in names_in(shape):
                if isinstance(n, Sym):
                    return n.scope
    return fn.name or ""


def _batched(env: Env, typ: Type, dim: Sym, axis: int) -> Type | None:
    """``typ`` with ``dim`` inserted at ``axis`` of each tensor; None where that is unsure."""
    proper = get_proper_type(typ)
    if isinstance(proper, TupleType):
        if proper.partial_fallback.type.fullname != "builtins.tuple":
            return None  # a ParamList or NamedTuple checks its own shapes: not batched there
        items = [_batched(env, t, dim, axis) for t in proper.items]
        if any(i is None for i in items):
            return None
        return proper.copy_modified(items=[i for i in items if i is not None])
    if not is_tensor(proper):
        # An int or a list batched is a Tensor per example: f's annotation would not hold.
        return AnyType(TypeOfAny.special_form) if not tensor_items(proper) else None
    shape = shape_of(proper)  # the callee's own names, not restricted to the caller's
    if shape is None:
        return attach(proper, None, env.str_type())
    if axis != 0 and not (shape.fixed and -len(shape.dims) - 1 <= axis <= len(shape.dims)):
        return attach(proper, None, env.str_type())  # unknown rank: the place is unknown
    at = axis if axis >= 0 else len(shape.dims) + 1 + axis
    dims = (*shape.dims[:at], dim, *shape.dims[at:])
    return attach(proper, shape.with_dims(dims), env.str_type())


def jvp(ctx: FunctionContext) -> Type:
    """``sg.jvp(f, primals, tangents)``: ``(out, out)`` with ``out`` what ``f(*primals)`` returns.

    Literal tuples of primals and tangents are each checked against ``f``'s parameters.
    """
    fn = _fn_type(ctx)
    p_slot, t_slot = _arg(ctx, "primals", 1), _arg(ctx, "tangents", 2)
    default = get_proper_type(ctx.default_return_type)
    if fn is None or p_slot is None or not isinstance(default, TupleType):
        return ctx.default_return_type
    env = Env(ctx.api)
    name = (fn.name or "fn").split(" of ")[0]
    out: Type | None = None
    for slot in (p_slot, t_slot):
        expr = ctx.args[slot][0] if slot is not None else None
        if not isinstance(expr, TupleExpr) or any(isinstance(e, StarExpr) for e in expr.items):
            continue
        types = [env.type_of(e) or AnyType(TypeOfAny.special_form) for e in expr.items]
        laid = positional(fn, list(expr.items), types, 0)
        if laid is None or len(expr.items) != len(fn.arg_types):
            continue
        result = check_call(env, ctx.context, fn, *laid, fn.ret_type, name)
        out = result if out is None else out
    if out is None:
        return ctx.default_return_type
    return default.copy_modified(items=[out, out])


def custom_rule(ctx: FunctionContext) -> Type:
    """``sg.custom_vjp(f)`` / ``sg.custom_jvp(f)``: the instance remembers ``f``'s signature."""
    fn = _fn_type(ctx)
    return ctx.default_return_type if fn is None else attach_fn(ctx.default_return_type, fn)


def linearize(ctx: FunctionContext) -> Type:
    """``sg.linearize(f, *primals)``: ``(f(*primals), f_jvp)``; the primals checked against ``f``.

    ``f_jvp`` stays the plain ``Callable`` (its tangents are not followed).
    """
    fn = _fn_type(ctx)
    slot = _arg(ctx, "primals", 1)
    default = get_proper_type(ctx.default_return_type)
    if fn is None or slot is None or not isinstance(default, TupleType):
        return ctx.default_return_type
    exprs, types = ctx.args[slot], ctx.arg_types[slot]
    if len(exprs) != len(fn.arg_types) or any(k != ARG_POS for k in ctx.arg_kinds[slot]):
        return ctx.default_return_type  # a *splat, or another count: not followed
    laid = positional(fn, list(exprs), list(types), 0)
    if laid is None:
        return ctx.default_return_type
    name = (fn.name or "fn").split(" of ")[0]
    out = check_call(Env(ctx.api), ctx.context, fn, *laid, fn.ret_type, name)
    return default.copy_modified(items=[out, *default.items[1:]])


def jacobian(ctx: FunctionContext, order: int) -> Type:
    """``sg.jacrev/jacfwd(f, argnums)`` (``order`` 1), ``sg.hessian`` (2): ``f``'s signature
    returning, per differentiated argument, ``f``'s output dims followed by the argument's
    (``[b a]`` for ``f: [a] -> [b]``; ``[.. a a]`` for the Hessian, ``[.. a_i a_j]`` blocks for
    a tuple of argnums, as tuples like the runtime's).

    Followed only for a literal ``argnums`` (an int or a tuple of ints), a Tensor output and
    Tensor arguments of known rank; anything else keeps the plain ``Callable``.
    """
    fn = _fn_type(ctx)
    if fn is None or any(k != ARG_POS for k in fn.arg_kinds):
        return ctx.default_return_type
    slot = _arg(ctx, "argnums", 1)
    expr = ctx.args[slot][0] if slot is not None else None
    nums = _argnums(expr, len(fn.arg_types))
    out = get_proper_type(fn.ret_type)
    out_shape = shape_of(out) if is_tensor(out) else None
    ins = [shape_of(fn.arg_types[n]) if is_tensor(fn.arg_types[n]) else None for n in nums or []]
    if nums is None or out_shape is None or not out_shape.fixed:
        return ctx.default_return_type
    if any(s is None or not s.fixed for s in ins):
        return ctx.default_return_type
    str_type = Env(ctx.api).str_type()
    fallback = ctx.api.named_generic_type("builtins.tuple", [AnyType(TypeOfAny.special_form)])

    def block(*parts: TShape | None) -> Type:
        dims = [d for part in parts if part is not None for d in part.dims]
        return attach(out, out_shape.with_dims([*out_shape.dims, *dims]), str_type)

    single = expr is None or int_of(expr) is not None
    if order == 1:
        blocks = [block(s) for s in ins]
        ret: Type = blocks[0] if single else TupleType(blocks, fallback)
    else:
        rows = [[block(a, b) for b in ins] for a in ins]
        ret = rows[0][0] if single else TupleType([TupleType(r, fallback) for r in rows], fallback)
    return fn.copy_modified(ret_type=ret, definition=None)


def _argnums(expr: Expression | None, n: int) -> list[int] | None:
    """``argnums`` as argument positions: absent 0, an int literal or a tuple of them."""
    if expr is None:
        values: list[int | None] = [0]
    elif (single := int_of(expr)) is not None:
        values = [single]
    elif isinstance(expr, TupleExpr) and expr.items:
        values = [int_of(e) for e in expr.items]
    else:
        return None
    if any(v is None or not -n <= v < n for v in values):
        return None
    return [v % n for v in values if v is not None]
