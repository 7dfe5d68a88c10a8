"""Shapes written in *expressions*: type aliases (``Params = ParamList[Float[...], ...]``), casts.

mypy turns ``Annotated[X, meta]`` into plain ``X`` when it reads a type out of
an expression (``mypy/exprtotype.py``), so for aliases the spec string never
reaches :func:`analyze_annotated`. What does reach the plugin is the analysis
of the bare ``Tensor`` left behind, at the same source position as the
``Tensor`` inside ``Float[Tensor, "..."]``. This module indexes a module's
``Float[Tensor, "spec"]`` expressions by that position so the shape can be
put back.
"""

from __future__ import annotations

from mypy.nodes import (
    AssignmentStmt,
    CallExpr,
    ClassDef,
    Expression,
    IfStmt,
    IndexExpr,
    ListExpr,
    MemberExpr,
    MypyFile,
    NameExpr,
    OpExpr,
    Statement,
    StrExpr,
    TupleExpr,
)

from .spec import dtype_of_annotation

Position = tuple[int, int]
Found = tuple[str, str]  # (annotation name such as "Float", spec string)

_ANNOTATION_NAMES = {
    "Float", "Float16", "Float32", "Float64", "BFloat16", "Inexact", "Int", "Int8", "Int16",
    "Int32", "Int64", "UInt", "UInt8", "UInt16", "UInt32", "UInt64", "Integer", "Bool",
    "Shaped", "Num", "Real",
}  # fmt: skip


def _find_in_expr(expr: Expression, found: dict[Position, Found]) -> None:
    """Record every ``Name[Tensor, "spec"]`` inside one expression."""
    if isinstance(expr, IndexExpr):
        base = expr.base
        name = base.name if isinstance(base, NameExpr | MemberExpr) else ""
        index = expr.index
        if name in _ANNOTATION_NAMES and isinstance(index, TupleExpr) and len(index.items) >= 2:
            first, spec = index.items[0], index.items[1]
            if isinstance(spec, StrExpr):
                found[(first.line, first.column)] = (name, spec.value)
        _find_in_expr(base, found)
        _find_in_expr(index, found)
    elif isinstance(expr, TupleExpr | ListExpr):
        for item in expr.items:
            _find_in_expr(item, found)
    elif isinstance(expr, OpExpr):
        _find_in_expr(expr.left, found)
        _find_in_expr(expr.right, found)
    elif isinstance(expr, CallExpr):
        for arg in expr.args:
            _find_in_expr(arg, found)


# ``X = Float[Tensor, "b 784"]`` becomes ``X = Tensor``, an alias that mypy expands eagerly
# to a fresh Instance (dropping any shape), so such aliases are looked up by name instead.
_SIMPLE_ALIASES: dict[str, tuple[str | None, str]] = {}


def _find_in_block(body: list[Statement], found: dict[Position, Found], module: str | None) -> None:
    """Aliases live at module or class level, possibly under ``if TYPE_CHECKING:``."""
    for stmt in body:
        if isinstance(stmt, AssignmentStmt):
            before = len(found)
            _find_in_expr(stmt.rvalue, found)
            target = stmt.lvalues[0] if len(stmt.lvalues) == 1 else None
            rvalue = stmt.rvalue
            if (
                module
                and isinstance(target, NameExpr)
                and len(found) == before + 1
                and isinstance(rvalue, IndexExpr)
                and isinstance(rvalue.index, TupleExpr)
                and rvalue.index.items
            ):
                first = rvalue.index.items[0]
                hit = found.get((first.line, first.column))
                if hit is not None:
                    _SIMPLE_ALIASES[f"{module}.{target.name}"] = (
                        dtype_of_annotation(hit[0]),
                        hit[1],
                    )
        elif isinstance(stmt, ClassDef):
            # `class MLP(ParamList[Float[Tensor, "h 2"], ...])`: bases are expressions too.
            for base in stmt.base_type_exprs:
                _find_in_expr(base, found)
            _find_in_block(stmt.defs.body, found, None)
        elif isinstance(stmt, IfStmt):
            for block in [*stmt.body, stmt.else_body]:
                if block is not None:
                    _find_in_block(block.body, found, module)


def simple_alias(fullname: str) -> tuple[str | None, str] | None:
    """``(dtype kind, spec)`` when ``fullname`` is an alias such as ``X = Float[Tensor, "b"]``."""
    return _SIMPLE_ALIASES.get(fullname)


_INDEX: dict[str, tuple[MypyFile, dict[Position, Found]]] = {}


def spec_at(tree: MypyFile, line: int, column: int) -> tuple[str | None, str] | None:
    """``(dtype kind, spec)`` of the ``Float[Tensor, spec]`` whose ``Tensor`` sits at line:column."""
    cached = _INDEX.get(tree.fullname)
    if cached is None or cached[0] is not tree:
        found: dict[Position, Found] = {}
        _find_in_block(tree.defs, found, tree.fullname)
        cached = (tree, found)
        _INDEX[tree.fullname] = cached
    hit = cached[1].get((line, column))
    return None if hit is None else (dtype_of_annotation(hit[0]), hit[1])
