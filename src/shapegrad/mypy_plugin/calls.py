"""Calls to the user's own annotated functions: instantiate the callee's named dims.

Like solving type variables: each argument's shape is matched against the
parameter's annotation, binding the callee's names (``b``, ``h``, ``*batch``)
to the caller's dims; an ``int`` argument for a parameter named like a dim
(``def causal_mask(t: int) -> Bool[Tensor, "t t"]``) binds that dim to the
argument's size. A conflict is an error; the declared return shape is then
rewritten in the caller's terms. The same check serves calls through
``sg.value_and_grad``/``sg.grad``/``sg.compile`` and ``ScalarTrainer.step``,
whose wrapped function is known (see :mod:`shapegrad.mypy_plugin.transforms`).
"""

from __future__ import annotations

from mypy.nodes import (
    ARG_POS,
    ARG_STAR,
    ARG_STAR2,
    CallExpr,
    Context,
    Decorator,
    Expression,
    FakeInfo,
    FuncDef,
    MemberExpr,
)
from mypy.typeops import bind_self
from mypy.types import CallableType, Instance, TupleType, Type, get_proper_type

from .algebra import Mismatch
from .carrier import attach, shape_of, tensor_items
from .env import Env
from .inline import dims_mapping, helper_result, receiver_fields
from .literals import label
from .spec import Item, Sym, Var, names_in
from .unify import Binder


def _callee_name(context: Context, callee: CallableType) -> str:
    if isinstance(context, CallExpr) and not isinstance(context.callee, CallExpr):
        text = label(context.callee)
        if text:
            return text
    return (callee.name or "call").split(" of ")[0]


def instantiate(
    env: Env,
    context: Context,
    formal_names: list[str | None],
    arg_types: list[list[Type]],
    args: list[list[Expression]],
    default_return: Type,
) -> Type:
    """Check one call against the callee's shaped parameters; return its return type in caller terms."""
    if not isinstance(context, CallExpr):
        return default_return
    callee = get_proper_type(env.type_of(context.callee))
    receiver: Expression | None = None
    if isinstance(callee, Instance):  # calling an object: its __call__ (a Module layer)
        method = callee.type.get_method("__call__")
        if not isinstance(method, FuncDef) or not isinstance(method.type, CallableType):
            return default_return
        receiver, callee = context.callee, bind_self(method.type, callee)
    elif isinstance(callee, CallableType) and isinstance(callee.definition, FuncDef):
        if callee.definition.name == "__call__":  # `self.qkv(x)`: the object is the callee
            receiver = context.callee
        elif isinstance(context.callee, MemberExpr):  # `obj.method(x)`
            receiver = context.callee.expr
    if not isinstance(callee, CallableType) or len(callee.arg_types) != len(arg_types):
        return default_return
    del formal_names
    return check_call(env, context, callee, args, arg_types, default_return, receiver=receiver)


def positional(
    callee: CallableType, exprs: list[Expression], types: list[Type], skip: int
) -> tuple[list[list[Expression]], list[list[Type]]] | None:
    """Positional arguments laid out per formal of ``callee``, starting at formal ``skip``."""
    n = len(callee.arg_types)
    if skip + len(exprs) > n or any(k != ARG_POS for k in callee.arg_kinds[: skip + len(exprs)]):
        return None
    args: list[list[Expression]] = [[] for _ in range(n)]
    arg_types: list[list[Type]] = [[] for _ in range(n)]
    for i, (e, t) in enumerate(zip(exprs, types, strict=True)):
        args[skip + i], arg_types[skip + i] = [e], [t]
    return args, arg_types


def check_call(
    env: Env,
    context: Context,
    callee: CallableType,
    args: list[list[Expression]],
    arg_types: list[list[Type]],
    default_return: Type,
    name: str | None = None,
    receiver: Expression | None = None,
) -> Type:
    """Match arguments (laid out per formal of ``callee``) and rewrite ``callee``'s return.

    ``receiver`` is the object a method is called on (its fields matter to a helper body).
    """
    wants = [dict(tensor_items(t)) for t in callee.arg_types]
    ret_items = tensor_items(callee.ret_type)
    dim_names = {
        n.name
        for shapes in [*wants, dict(ret_items)]
        for shape in shapes.values()
        for n in names_in(shape)
        if isinstance(n, Sym)
    }
    param_dims = {
        n.name
        for shapes in wants
        for shape in shapes.values()
        for n in names_in(shape)
        if isinstance(n, Sym)
    }
    # An int parameter sizes a dim only when no tensor parameter declares it (see
    # carrier.sizes_an_int): jaxtyping never compares ``k=2`` with ``logits: [b, k]``.
    sized = [
        i
        for i, formal in enumerate(callee.arg_names)
        if formal in dim_names and formal not in param_dims and _is_int(callee.arg_types[i])
    ]
    if not any(wants) and not ret_items:
        return _through_helper(env, context, callee, args, arg_types, default_return, receiver)
    fresh = f"~{env.owner}@{context.line}:{context.column}"  # opaque: see spec.is_opaque
    binder = Binder(name or _callee_name(context, callee), fresh)
    mapping = dims_mapping(env, receiver) if receiver is not None else None
    try:
        for dim, size in (mapping or {}).items():  # a sub-module's dims, renamed by its field
            binder.bind_size(dim, size, label(receiver))
        for i, want in enumerate(wants):
            if not want or not arg_types[i] or callee.arg_kinds[i] in (ARG_STAR, ARG_STAR2):
                continue
            expr = args[i][0]
            got_type = env.flow_type(expr, arg_types[i][0])
            got = {path: env.shape(_at(got_type, path)) for path in want}
            base = label(expr) or (callee.arg_names[i] or f"#{i + 1}")
            for path, shape in want.items():
                actual = got.get(path)
                if actual is not None:
                    formal = callee.arg_names[i]
                    binder.match(base + path, actual, shape, formal and formal + path)
        for i in sized:
            formal = callee.arg_names[i]
            if args[i] and formal is not None and formal not in binder.dims:
                binder.bind_size(formal, env.size(args[i][0]), label(args[i][0]) or formal)
    except Mismatch as err:
        env.fail(str(err), context)
        return default_return
    result = _rewrite(default_return, binder, env)
    return _through_helper(env, context, callee, args, arg_types, result, receiver, fresh)


def _through_helper(
    env: Env,
    context: Context,
    callee: CallableType,
    args: list[list[Expression]],
    arg_types: list[list[Type]],
    result: Type,
    receiver: Expression | None,
    fresh: str | None = None,
) -> Type:
    """A plain-``Tensor`` result of a small helper: its shape from the helper's body.

    Also the dims of an annotated result that no argument binds (``-> Float[Tensor,
    "b n p"]`` where only ``b`` is a parameter's): the body's value fills them in.
    """
    shape = shape_of(result)
    definition = callee.definition
    if isinstance(definition, Decorator) and len(definition.decorators) == 1:
        definition = definition.func  # `@sg.typechecked def helper(...)`: keeps the signature
    tree = getattr(env.api, "tree", None)
    if (
        tree is None
        # Only helpers of the module being checked: another module's function bodies are
        # not loaded when it comes from mypy's cache, and a result must not depend on that.
        or not isinstance(definition, FuncDef)
        or not definition.fullname.startswith(tree.fullname + ".")
        or shape is None
        or (shape.fixed and not any(_open(d, fresh) for d in shape.dims))
        or any(isinstance(d, Var) and d.name for d in shape.dims)
        or (not shape.fixed and len(shape.dims) != 1)
    ):
        return result  # known, or a variadic the body would not make more precise
    operands = [
        env.operand(group[0], types[0]) if group else None
        for group, types in zip(args, arg_types, strict=True)
    ]
    fields = None
    if (
        receiver is not None
        and not isinstance(definition.info, FakeInfo)
        and not definition.is_static
    ):
        fields = receiver_fields(env, receiver, definition.info)
    try:
        inferred = helper_result(env, definition, callee, operands, fields=fields)
    except Mismatch as err:
        if not shape.fixed:  # an annotated body is checked on its own; only fill dims in
            env.fail(f"{_callee_name(context, callee)}(...) fails inside: {err}", context)
        return result
    if inferred is None:
        return result
    if shape.fixed:  # dims the return annotation names but no argument binds: from the body
        if not inferred.fixed or len(inferred.dims) != len(shape.dims):
            return result
        inferred = shape.with_dims(
            [i if _open(d, fresh) else d for d, i in zip(shape.dims, inferred.dims, strict=True)]
        )
    return attach(result, inferred, env.str_type())


def _open(dim: Item, fresh: str | None) -> bool:
    """A result dim the body may tell: unknown, or a fresh dim of this call."""
    return dim is None or (isinstance(dim, Sym) and fresh is not None and dim.scope == fresh)


def _is_int(typ: Type) -> bool:
    proper = get_proper_type(typ)
    return isinstance(proper, Instance) and proper.type.fullname == "builtins.int"


def _at(typ: Type | None, path: str) -> Type | None:
    """The item of a (nested) tuple type at ``path`` such as ``"[1][0]"``."""
    current: Type | None = typ
    for piece in filter(None, path.replace("]", "").split("[")):
        proper = get_proper_type(current) if current is not None else None
        if not isinstance(proper, TupleType) or int(piece) >= len(proper.items):
            return None
        current = proper.items[int(piece)]
    return current


def _rewrite(typ: Type, binder: Binder, env: Env) -> Type:
    proper = get_proper_type(typ)
    shape = shape_of(proper)
    if shape is not None and isinstance(proper, Instance):
        return attach(proper, binder.substitute(shape), env.str_type())
    if isinstance(proper, TupleType):
        return proper.copy_modified(items=[_rewrite(t, binder, env) for t in proper.items])
    return typ
