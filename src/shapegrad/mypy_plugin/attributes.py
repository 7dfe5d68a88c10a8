"""Shapes of attributes: a sub-module's fields (``m.head.w``) and ParamList names (``params.w2``).

``m.head.w`` is declared on the sub-module's class (``w: Float[Tensor, "d_out d_in"]``),
whose names mean nothing where it is used; when ``head`` is declared
``head: Linear = field(dims={"d_in": "d", "d_out": "vocab"})`` the field's shape is
renamed into the outer module's dims (``[vocab, d]``), unmapped names unknown.

``params.w2`` on a ParamList subclass with ``names = ("w1", "b1", "w2", "b2")``
is its element ``params[2]`` (the runtime's ``__getattr__``), with that element's shape.
"""

from __future__ import annotations

from mypy.nodes import (
    AssignmentStmt,
    Expression,
    MemberExpr,
    NameExpr,
    Statement,
    StrExpr,
    TupleExpr,
    Var,
)
from mypy.plugin import AttributeContext
from mypy.types import Instance, TupleType, Type, get_proper_type

from . import sizes
from .carrier import attach, shape_of, tuple_items
from .env import Env
from .inline import dims_mapping
from .scanned import sliced_params
from .spec import Expr, Sym, TShape

PARAMLIST_ATTRIBUTE = "shapegrad.typing.ParamList."


def module_field(ctx: AttributeContext) -> Type:
    """A tensor field read through a sub-module field with ``dims=``: in the outer dims."""
    default = ctx.default_attr_type
    context = ctx.context
    shape = shape_of(default)
    if shape is None or not isinstance(context, MemberExpr):
        return default
    if not isinstance(context.expr, MemberExpr):
        # `self.w` / `m.w`: the class's own names, known where they are rigid
        stepped = _one_step(Env(ctx.api), context, shape)
        return default if stepped is shape else attach(default, stepped, Env(ctx.api).str_type())
    env = Env(ctx.api)
    mapping = dims_mapping(env, context.expr)
    if mapping is None:
        return default
    renamed = _one_step(env, context, shape).with_dims(
        [
            sizes.substitute(d, lambda s: mapping.get(s.name)) if isinstance(d, Sym | Expr) else d
            for d in shape.dims
        ]
    )
    return attach(default, renamed, env.str_type())


def _one_step(env: Env, member: MemberExpr, shape: TShape) -> TShape:
    """``shape`` without its leading dim when read through a parameter that gets one
    step's slice of ``sg.scan``'s ``xs`` (``p.w`` in ``def layer(h, p: Layers)``)."""
    root: Expression = member.expr
    while isinstance(root, MemberExpr):
        root = root.expr
    tree = getattr(env.api, "tree", None)
    if not isinstance(root, NameExpr) or not isinstance(root.node, Var) or tree is None:
        return shape
    if root.node not in sliced_params(tree) or not shape.fixed or not shape.dims:
        return shape
    return shape.with_dims(shape.dims[1:])


def paramlist_name(ctx: AttributeContext) -> Type:
    """``params.w2``: the element the class's ``names`` give that name."""
    name = ctx.context.name if isinstance(ctx.context, MemberExpr) else None
    proper = get_proper_type(ctx.type)
    info = (
        proper.partial_fallback.type
        if isinstance(proper, TupleType)
        else proper.type
        if isinstance(proper, Instance)
        else None
    )
    items = tuple_items(proper)
    if name is None or info is None or items is None:
        return ctx.default_attr_type
    for klass in info.mro:
        names = _declared_names(klass.defn.defs.body)
        if names is not None:
            if name in names and names.index(name) < len(items):
                return items[names.index(name)]
            return ctx.default_attr_type
    return ctx.default_attr_type


def _declared_names(body: list[Statement]) -> list[str] | None:
    """``names = ("w1", "b1", ...)`` in a class body (literal strings only)."""
    for stmt in body:
        if (
            isinstance(stmt, AssignmentStmt)
            and len(stmt.lvalues) == 1
            and isinstance(stmt.lvalues[0], NameExpr)
            and stmt.lvalues[0].name == "names"
        ):
            value = stmt.rvalue
            if isinstance(value, TupleExpr) and all(isinstance(e, StrExpr) for e in value.items):
                return [e.value for e in value.items if isinstance(e, StrExpr)]
            return None
    return None
