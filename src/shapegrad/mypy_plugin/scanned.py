"""Parameters that receive one step's slice of ``sg.scan``'s ``xs`` (or one member of
an argument that ``sg.vmap`` maps over axis 0).

``sg.scan(step, x, stack)`` over a Module whose fields all carry a leading layer dim
(``w: Float[Tensor, "layers d d"]``) calls ``step`` with one layer's slice: an object of
the same class whose fields have lost that dim. Code annotates the step's parameter with
the class (``def layer(x, p: Layers)``, or ``lambda x, w: (self.block(x, w), None)``), so
inside it the declared field shapes are one dim too long. This module finds those
parameters (by the scan calls of the module being checked); :mod:`attributes` drops the
leading dim of a field read through one.
"""

from __future__ import annotations

from collections.abc import Iterator

from mypy.nodes import (
    AssignmentStmt,
    Block,
    CallExpr,
    ClassDef,
    ConditionalExpr,
    Decorator,
    Expression,
    ExpressionStmt,
    ForStmt,
    FuncDef,
    IfStmt,
    IndexExpr,
    LambdaExpr,
    ListExpr,
    MemberExpr,
    MypyFile,
    NameExpr,
    OperatorAssignmentStmt,
    OpExpr,
    RefExpr,
    ReturnStmt,
    StarExpr,
    Statement,
    TupleExpr,
    TypeInfo,
    UnaryExpr,
    Var,
    WhileStmt,
    WithStmt,
)
from mypy.types import Instance, get_proper_type

from .intsize import module_index
from .literals import int_of

SCAN = "shapegrad.control.scan"
VMAP = "shapegrad._batching.vmap"

_CACHE: dict[str, tuple[MypyFile, frozenset[Var]]] = {}
Located = tuple[CallExpr, TypeInfo | None]


def sliced_params(tree: MypyFile) -> frozenset[Var]:
    """The parameters of ``tree``'s functions (and lambdas) that get a scan step's slice."""
    cached = _CACHE.get(tree.fullname)
    if cached is None or cached[0] is not tree:
        found: set[Var] = set()
        for call, owner in _calls(tree.defs):
            _scan_call(tree, call, owner, found)
            _vmapped_call(call, owner, found)
        cached = _CACHE[tree.fullname] = (tree, frozenset(found))
    return cached[1]


def _scan_call(tree: MypyFile, call: CallExpr, owner: TypeInfo | None, found: set[Var]) -> None:
    if not (isinstance(call.callee, RefExpr) and call.callee.fullname == SCAN):
        return
    body, xs = _argument(call, "f", 0), _argument(call, "xs", 2)
    stacked = _declared_class(xs, owner)
    if stacked is None or body is None:
        return  # only a stack whose class is known: a per-step class of its own keeps its shapes
    if isinstance(body, NameExpr) and isinstance(body.node, Var):  # `step = lambda x, w: ...`
        sources = module_index(tree).sources.get(body.node, [])
        if len(sources) == 1 and sources[0] is not None and sources[0][1] is None:
            body = sources[0][0]
    if isinstance(body, LambdaExpr):
        if len(body.arguments) < 2:
            return
        step = body.arguments[1].variable
        for inner, _ in _calls(body.body.body):  # `self.block(x, w)`: w passed on
            for i, (arg, name) in enumerate(zip(inner.args, inner.arg_names, strict=True)):
                if isinstance(arg, NameExpr) and arg.node is step and name is None:
                    _add(found, _positional_param(inner.callee, i, owner), stacked)
    else:
        _add(found, _positional_param(body, 1, owner), stacked)


def _vmapped_call(call: CallExpr, owner: TypeInfo | None, found: set[Var]) -> None:
    """``sg.vmap(f, in_axes=(0, None))(stack, x)``: ``f``'s parameters mapped over axis 0
    get one member's slice (an ensemble of Modules)."""
    inner = call.callee
    if not (
        isinstance(inner, CallExpr)
        and isinstance(inner.callee, RefExpr)
        and inner.callee.fullname == VMAP
    ):
        return
    fn, in_axes = _argument(inner, "fn", 0), _argument(inner, "in_axes", 1)
    if fn is None:
        return
    for i, (arg, name) in enumerate(zip(call.args, call.arg_names, strict=True)):
        stacked = _declared_class(arg, owner)
        if name is None and stacked is not None and _axis(in_axes, i) == 0:
            _add(found, _positional_param(fn, i, owner), stacked)


def _axis(in_axes: Expression | None, i: int) -> int | None:
    """Argument ``i``'s literal mapped axis (None: not mapped, or not a literal)."""
    if in_axes is None:
        return 0
    if isinstance(in_axes, TupleExpr | ListExpr):
        return int_of(in_axes.items[i]) if i < len(in_axes.items) else None
    return int_of(in_axes)


def _add(found: set[Var], param: Var | None, stacked: str) -> None:
    """Record ``param`` when it is declared with the stack's own class."""
    declared = get_proper_type(param.type) if param is not None else None
    if param is not None and isinstance(declared, Instance) and declared.type.fullname == stacked:
        found.add(param)


def _declared_class(expr: Expression | None, owner: TypeInfo | None) -> str | None:
    """The declared class of ``xs``: a parameter or variable (``stack``), or a field of
    the enclosing class (``self.blocks``); None when it is not declared so."""
    node: object = None
    if isinstance(expr, NameExpr):
        node = expr.node
    elif (
        isinstance(expr, MemberExpr)
        and isinstance(expr.expr, NameExpr)
        and expr.expr.name == "self"
        and owner is not None
    ):
        sym = owner.get(expr.name)
        node = sym.node if sym is not None else None
    declared = get_proper_type(node.type) if isinstance(node, Var) else None
    return declared.type.fullname if isinstance(declared, Instance) else None


def _calls(nodes: list[Statement], owner: TypeInfo | None = None) -> Iterator[Located]:
    """Every call expression in some statements (the forms model code uses), with the
    class whose body holds it (to resolve ``self.method``)."""
    stack: list[tuple[object, TypeInfo | None]] = [(n, owner) for n in nodes]
    while stack:
        node, info = stack.pop()
        if isinstance(node, CallExpr):
            yield node, info
            stack.extend((c, info) for c in [node.callee, *node.args])
        if isinstance(node, ClassDef):
            info = node.info
        stack.extend((c, info) for c in _children(node) if c is not None)


def _children(node: object) -> list[object]:
    if isinstance(node, Block):
        return list(node.body)
    if isinstance(node, AssignmentStmt | OperatorAssignmentStmt):
        return [node.rvalue]
    if isinstance(node, ExpressionStmt | ReturnStmt):
        return [node.expr] if node.expr is not None else []
    if isinstance(node, IfStmt):
        return [*node.expr, *node.body, node.else_body]
    if isinstance(node, ForStmt | WhileStmt):
        return [node.expr, node.body, node.else_body]
    if isinstance(node, WithStmt):
        return [*node.expr, node.body]
    if isinstance(node, Decorator):
        return [node.func]
    if isinstance(node, FuncDef | LambdaExpr):
        return [node.body]
    if isinstance(node, ClassDef):
        return [node.defs]
    if isinstance(node, TupleExpr | ListExpr):
        return list(node.items)
    if isinstance(node, OpExpr):
        return [node.left, node.right]
    if isinstance(node, MemberExpr | StarExpr | UnaryExpr):
        return [node.expr]
    if isinstance(node, IndexExpr):
        return [node.base, node.index]
    if isinstance(node, ConditionalExpr):
        return [node.cond, node.if_expr, node.else_expr]
    return []


def _argument(call: CallExpr, name: str, position: int) -> Expression | None:
    if name in call.arg_names:
        return call.args[call.arg_names.index(name)]
    positional = [a for a, n in zip(call.args, call.arg_names, strict=True) if n is None]
    return positional[position] if position < len(positional) else None


def _positional_param(callee: Expression, position: int, owner: TypeInfo | None) -> Var | None:
    """The parameter of a named function (a method through ``self.m``) at ``position``."""
    if not isinstance(callee, RefExpr):
        return None
    node: object = callee.node
    if (
        node is None
        and isinstance(callee, MemberExpr)
        and isinstance(callee.expr, NameExpr)
        and callee.expr.name == "self"
        and owner is not None
    ):
        node = owner.get_method(callee.name)
    func = node.func if isinstance(node, Decorator) else node
    if not isinstance(func, FuncDef):
        return None
    bound = isinstance(callee, MemberExpr) and func.info is not None and not func.is_static
    index = position + (1 if bound else 0)
    return func.arguments[index].variable if index < len(func.arguments) else None
