"""Calls to the user's own annotated functions: instantiate the callee's named dims.

Like solving type variables: each argument's shape is matched against the
parameter's annotation, binding the callee's names (``b``, ``h``, ``*batch``)
to the caller's dims. A conflict is an error; the declared return shape is
then rewritten in the caller's terms.
"""

from __future__ import annotations

from mypy.nodes import ARG_STAR, ARG_STAR2, CallExpr, Context, Expression
from mypy.types import CallableType, Instance, TupleType, Type, get_proper_type

from shapegrad.mypy_plugin.algebra import Mismatch
from shapegrad.mypy_plugin.carrier import attach, shape_of, tensor_items
from shapegrad.mypy_plugin.env import Env
from shapegrad.mypy_plugin.literals import label
from shapegrad.mypy_plugin.unify import Binder


def _callee_name(context: Context, callee: CallableType) -> str:
    if isinstance(context, CallExpr):
        text = label(context.callee)
        if text:
            return text
    return callee.name or "call"


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
    if not isinstance(callee, CallableType) or len(callee.arg_types) != len(arg_types):
        return default_return
    wants = [dict(tensor_items(t)) for t in callee.arg_types]
    if not any(wants) and not tensor_items(default_return):
        return default_return
    binder = Binder(_callee_name(context, callee))
    try:
        for i, want in enumerate(wants):
            if not want or not arg_types[i] or callee.arg_kinds[i] in (ARG_STAR, ARG_STAR2):
                continue
            expr = args[i][0]
            got = {path: env.shape(_at(arg_types[i][0], path)) for path in want}
            base = label(expr) or (formal_names[i] or f"#{i + 1}")
            for path, shape in want.items():
                actual = got.get(path)
                if actual is not None:
                    binder.match(base + path, actual, shape)
    except Mismatch as err:
        env.fail(str(err), context)
        return default_return
    return _rewrite(default_return, binder, env)


def _at(typ: Type, path: str) -> Type | None:
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
