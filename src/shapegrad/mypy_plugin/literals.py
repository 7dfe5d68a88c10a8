"""Reading literal values out of mypy expressions: axes, sizes, spec strings, labels."""

from __future__ import annotations

from collections.abc import Callable

from mypy.nodes import (
    CallExpr,
    EllipsisExpr,
    Expression,
    IndexExpr,
    IntExpr,
    ListExpr,
    MemberExpr,
    NameExpr,
    SliceExpr,
    StrExpr,
    TupleExpr,
    UnaryExpr,
    Var,
)


def int_of(expr: Expression | None) -> int | None:
    """``3``, ``-1`` or a ``Final`` int constant; None otherwise."""
    if isinstance(expr, IntExpr):
        return expr.value
    if isinstance(expr, UnaryExpr) and expr.op == "-" and isinstance(expr.expr, IntExpr):
        return -expr.expr.value
    if isinstance(expr, NameExpr) and isinstance(expr.node, Var) and expr.node.is_final:
        value = expr.node.final_value
        return value if isinstance(value, int) and not isinstance(value, bool) else None
    return None


def ints_of(expr: Expression | None) -> list[int] | None:
    """An int or a tuple/list of ints, as a list; None when any piece is not literal."""
    single = int_of(expr)
    if single is not None:
        return [single]
    if isinstance(expr, TupleExpr | ListExpr):
        values = [int_of(e) for e in expr.items]
        return None if any(v is None for v in values) else [v for v in values if v is not None]
    return None


def pair_of(expr: Expression | None, default: tuple[int, int] | None) -> tuple[int, int] | None:
    """A conv/pool size: ``2`` -> (2, 2), ``(2, 3)`` -> (2, 3); ``default`` when absent."""
    if expr is None:
        return default
    values = ints_of(expr)
    if (
        values is None
        or len(values) not in (1, 2)
        or (isinstance(expr, ListExpr | TupleExpr) and len(values) != 2)
    ):
        return None
    return (values[0], values[-1])


def bool_of(expr: Expression | None, default: bool) -> bool | None:
    """``True``/``False``; ``default`` when the argument is absent; None when not literal."""
    if expr is None:
        return default
    if isinstance(expr, NameExpr) and expr.fullname in ("builtins.True", "builtins.False"):
        return expr.fullname == "builtins.True"
    return None


def str_of(expr: Expression | None) -> str | None:
    """A string literal's value."""
    return expr.value if isinstance(expr, StrExpr) else None


def is_none(expr: Expression | None) -> bool:
    """True for an absent argument or a literal ``None``."""
    return expr is None or (isinstance(expr, NameExpr) and expr.fullname == "builtins.None")


class Unknown:
    """A slice bound or index that is not statically known."""


UNKNOWN = Unknown()


class DynamicIndex:
    """An int index whose value is not known (it still drops its dim)."""


DYNAMIC = DynamicIndex()


def index_items(
    expr: Expression, size: Callable[[Expression], object], is_int: Callable[[Expression], bool]
) -> list[object] | None:
    """``x[0, :, None, ..., 1:t]`` as ints/slices/None/Ellipsis; None when not understood.

    Slice bounds are sizes (``int``, named or symbolic, see :mod:`intsize`) or
    :data:`UNKNOWN`; an int index of unknown value is :data:`DYNAMIC`.
    """
    parts = expr.items if isinstance(expr, TupleExpr) else [expr]
    out: list[object] = []
    for part in parts:
        if isinstance(part, EllipsisExpr):
            out.append(Ellipsis)
        elif is_none(part):
            out.append(None)
        elif isinstance(part, SliceExpr):
            bounds: list[object] = []
            for e in (part.begin_index, part.end_index, part.stride):
                value = None if e is None else size(e)
                bounds.append(UNKNOWN if e is not None and value is None else value)
            step = bounds[2]
            if isinstance(step, int) and step < 1:
                return None
            out.append(slice(*bounds))
        elif (value := int_of(part)) is not None:
            out.append(value)
        elif is_int(part):
            out.append(DYNAMIC)
        else:
            return None
    return out


def label(expr: Expression | None) -> str:
    """Short source text for messages: ``x``, ``self.w``, ``params[0]``, ``w.T``; ``""`` if long."""
    if isinstance(expr, NameExpr):
        return expr.name
    if isinstance(expr, MemberExpr):
        inner = label(expr.expr)
        return f"{inner}.{expr.name}" if inner else ""
    if isinstance(expr, IndexExpr):
        inner, idx = label(expr.base), int_of(expr.index)
        return f"{inner}[{idx}]" if inner and idx is not None else ""
    if isinstance(expr, CallExpr):
        inner = label(expr.callee)
        return f"{inner}(...)" if inner else ""
    return ""
