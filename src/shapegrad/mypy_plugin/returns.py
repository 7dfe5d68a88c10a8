"""Checks that need a whole function body: returned values and annotated assignments.

mypy has no plugin hook for ``return`` statements, so once a module's first
checking pass is done this walks every function and compares the types mypy
recorded for returned / assigned expressions with the declared annotations.
"""

from __future__ import annotations

from collections.abc import Iterator

from mypy.checker import TypeChecker
from mypy.nodes import (
    AssignmentStmt,
    Block,
    ClassDef,
    ConditionalExpr,
    Decorator,
    Expression,
    ForStmt,
    FuncDef,
    IfStmt,
    ListExpr,
    MypyFile,
    NameExpr,
    OperatorAssignmentStmt,
    ReturnStmt,
    StarExpr,
    Statement,
    TempNode,
    TryStmt,
    TupleExpr,
    Var,
    WhileStmt,
    WithStmt,
)
from mypy.types import CallableType, TupleType, Type, get_proper_type

from .algebra import with_hint
from .carrier import owner_key, rigid_names, tensor_items
from .env import SHAPE_ERROR
from .literals import label
from .spec import Rigid, add_rigid, restrict, show
from .unify import compare


def check_module(api: TypeChecker, tree: MypyFile) -> None:
    """Check returns and annotated assignments of every function in ``tree``."""
    for func, rigid in _functions(tree.defs, {}):
        sig = func.type
        if not isinstance(sig, CallableType):
            continue
        declared: set[Var] = set()  # names annotated without a value: `w: Float[...]`
        merged = _merged_vars(func.body)
        for stmt in _statements(func.body):
            if isinstance(stmt, ReturnStmt) and stmt.expr is not None:
                if _is_merged(stmt.expr, merged):
                    continue
                got = api.lookup_type_or_none(stmt.expr)
                _report(api, rigid, got, sig.ret_type, "return value", label(stmt.expr), stmt)
            elif isinstance(stmt, AssignmentStmt) and isinstance(stmt.rvalue, TempNode):
                declared |= {
                    t.node
                    for t in stmt.lvalues
                    if isinstance(t, NameExpr) and isinstance(t.node, Var)
                }
            elif isinstance(stmt, AssignmentStmt):
                _check_assignment(api, rigid, stmt, declared, merged)


def _merged_vars(body: Block) -> set[Var]:
    """Variables assigned inside a branch or loop, or from a conditional expression.

    Where control flow merges, mypy joins their types (dropping shapes that differ)
    and then reads the variable as the meet with its *first* type, which brings the
    first shape back; the type it recorded there cannot be trusted.
    """
    out: set[Var] = set()

    def visit(block: Block, inside: bool) -> None:
        for stmt in block.body:
            if isinstance(stmt, AssignmentStmt) and (
                inside or isinstance(stmt.rvalue, ConditionalExpr)
            ):
                for target in stmt.lvalues:
                    out.update(_names(target))
            elif isinstance(stmt, OperatorAssignmentStmt) and inside:
                out.update(_names(stmt.lvalue))
            if isinstance(stmt, ForStmt):
                out.update(_names(stmt.index))
            for child in _child_blocks(stmt):
                visit(child, True)

    visit(body, False)
    return out


def _names(target: Expression) -> list[Var]:
    if isinstance(target, NameExpr) and isinstance(target.node, Var):
        return [target.node]
    if isinstance(target, TupleExpr | ListExpr):
        return [v for item in target.items for v in _names(item)]
    if isinstance(target, StarExpr):
        return _names(target.expr)
    return []


def _is_merged(expr: Expression, merged: set[Var]) -> bool:
    if isinstance(expr, NameExpr):
        return isinstance(expr.node, Var) and expr.node in merged
    if isinstance(expr, TupleExpr):
        return any(_is_merged(e, merged) for e in expr.items)
    return False


def _child_blocks(stmt: Statement) -> list[Block]:
    blocks: list[Block | None] = []
    if isinstance(stmt, IfStmt):
        blocks = [*stmt.body, stmt.else_body]
    elif isinstance(stmt, ForStmt | WhileStmt):
        blocks = [stmt.body, stmt.else_body]
    elif isinstance(stmt, WithStmt):
        blocks = [stmt.body]
    elif isinstance(stmt, TryStmt):
        blocks = [stmt.body, *stmt.handlers, stmt.else_body, stmt.finally_body]
    return [b for b in blocks if b is not None]


def _functions(defs: list[Statement], outer: Rigid) -> Iterator[tuple[FuncDef, Rigid]]:
    for stmt in defs:
        func = stmt.func if isinstance(stmt, Decorator) else stmt
        if isinstance(func, FuncDef):
            rigid = add_rigid(outer, owner_key(func), rigid_names(func))
            yield func, rigid
            yield from _functions(func.body.body, rigid)
        elif isinstance(stmt, ClassDef):
            yield from _functions(stmt.defs.body, outer)


def _statements(block: Block) -> Iterator[Statement]:
    """Statements of a function body, into compound statements but not nested defs."""
    for stmt in block.body:
        yield stmt
        for b in _child_blocks(stmt):
            yield from _statements(b)


def _check_assignment(
    api: TypeChecker, rigid: Rigid, stmt: AssignmentStmt, declared: set[Var], merged: set[Var]
) -> None:
    """``y: Float[...] = value``, and ``w, b = params`` into names declared as ``w: Float[...]``.

    A plain rebinding (``x = x.reshape(...)`` of an annotated parameter) is not checked:
    like jaxtyping, an annotation constrains the value it is written on.
    """
    got = api.lookup_type_or_none(stmt.rvalue)
    if _is_merged(stmt.rvalue, merged):
        return
    if stmt.type is not None and len(stmt.lvalues) == 1:
        _check_target(api, rigid, stmt.lvalues[0], got, stmt, None)
    elif declared:
        for target in stmt.lvalues:
            if isinstance(target, TupleExpr):
                _check_target(api, rigid, target, got, stmt, declared)


def _check_target(
    api: TypeChecker,
    rigid: Rigid,
    target: Expression,
    got: Type | None,
    stmt: AssignmentStmt,
    only: set[Var] | None,
) -> None:
    """Compare one assignment target's annotation with the assigned type (``only``: names allowed)."""
    if isinstance(target, TupleExpr):
        proper = get_proper_type(got) if got is not None else None
        if isinstance(proper, TupleType) and len(proper.items) == len(target.items):
            for item, item_type in zip(target.items, proper.items, strict=True):
                _check_target(api, rigid, item, item_type, stmt, only)
        return
    if (
        isinstance(target, NameExpr)
        and isinstance(target.node, Var)
        and not target.node.is_inferred
        and (only is None or target.node in only)
    ):
        want = target.node.type
        if want is not None:
            _report(api, rigid, got, want, f"assignment to {target.name}:", "value", stmt)


def _report(
    api: TypeChecker,
    rigid: Rigid,
    got: Type | None,
    want: Type,
    what: str,
    name: str,
    stmt: Statement,
) -> None:
    if got is None:
        return
    actual = dict(tensor_items(got))
    for path, declared in tensor_items(want):
        value = actual.get(path)
        if value is None:
            continue
        value = restrict(value, rigid)
        reason = compare(value, restrict(declared, rigid))
        if reason is not None:
            subject = f"{what} {name}{path}".strip() if name else f"{what}{path}"
            if reason.startswith("dtype"):
                message = f"{subject} is {value.dtype}, but the annotation says {declared.dtype}"
            else:
                message = (
                    f"{subject} has shape {show(value.dims)}, but the annotation says "
                    f"{show(declared.dims)} ({reason})"
                )
            api.fail(with_hint(message), stmt, code=SHAPE_ERROR)
