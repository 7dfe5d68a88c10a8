"""Result shapes of small helpers annotated with a plain ``Tensor``, evaluated at the call site.

``def up(x: Tensor) -> Tensor`` tells mypy nothing about shapes, so a call to it
would be unknown. When such a helper's body is straight-line code (assignments,
``B, C, H, W = x.shape`` and one final ``return``), its return expression is
evaluated here with the *caller's* argument shapes, by the same op rules. A
helper with branches, loops, comprehensions or calls the rules do not know
stays unknown; a mismatch inside it is not reported (the caller's check of the
result is what matters) and also makes the result unknown.
"""

from __future__ import annotations

from mypy.argmap import map_actuals_to_formals
from mypy.nodes import (
    ARG_POS,
    AssignmentStmt,
    CallExpr,
    Expression,
    FuncDef,
    IndexExpr,
    MemberExpr,
    NameExpr,
    OpExpr,
    ReturnStmt,
    TupleExpr,
    UnaryExpr,
    Var,
)
from mypy.types import AnyType, CallableType, Instance, Type, TypeOfAny, get_proper_type

from . import algebra as A
from .algebra import Mismatch, Operand
from .call import Call
from .env import Env
from .intsize import size_of
from .literals import label
from .optable import OP_FULLNAMES
from .spec import Item, TShape

_MAX_DEPTH = 3
_OPERATORS = {
    "+": "__add__", "-": "__sub__", "*": "__mul__", "/": "__truediv__", "**": "__pow__",
    "@": "__matmul__", "<": "__lt__", ">": "__gt__", "<=": "__le__", ">=": "__ge__",
}  # fmt: skip
_SCALARS = ("builtins.int", "builtins.float", "builtins.bool")


class Unknown(Exception):
    """The helper does something this evaluator does not follow."""


class InlineEnv(Env):
    """An :class:`Env` whose operands are the helper's locals, in the caller's terms."""

    def __init__(self, outer: Env, func: FuncDef, depth: int) -> None:
        super().__init__(outer.api)
        self.outer = outer
        self.func = func
        self.depth = depth
        self.tensors: dict[Var, TShape] = {}
        self.ints = {}  # the helper's int locals (`B, C, H, W = x.shape`)

    # --- what the rules ask for ------------------------------------------------------

    def operand(self, expr: Expression | None, typ: Type | None) -> Operand | None:
        if expr is None:
            return None
        proper = get_proper_type(self.type_of(expr))
        if isinstance(proper, Instance) and proper.type.fullname in _SCALARS:
            return Operand(label(expr), TShape((), None), proper.type.fullname.split(".")[1])
        try:
            shape = self.evaluate(expr)
        except (Unknown, Mismatch):
            return None
        return None if shape is None else Operand(label(expr), shape)

    def dims_of(self, expr: Expression) -> tuple[Item, ...] | None:
        found = self.operand(expr, None)
        return found.shape.dims if found is not None and found.shape.fixed else None

    def size(self, expr: Expression | None) -> Item:
        if isinstance(expr, NameExpr) and isinstance(expr.node, Var) and expr.node not in self.ints:
            return None  # another local or parameter of the helper: not followed
        return size_of(self, expr)

    # --- the helper's body ---------------------------------------------------------------

    def run(self) -> TShape | None:
        *body, last = self.func.body.body
        for stmt in body:
            if not isinstance(stmt, AssignmentStmt) or len(stmt.lvalues) != 1:
                raise Unknown
            self.assign(stmt.lvalues[0], stmt.rvalue)
        if not isinstance(last, ReturnStmt) or last.expr is None:
            raise Unknown
        return self.evaluate(last.expr)

    def assign(self, target: Expression, value: Expression) -> None:
        if isinstance(target, NameExpr) and isinstance(target.node, Var):
            if _is_int(self.type_of(value)):
                self.ints[target.node] = self.size(value)
            else:
                shape = self.evaluate(value)
                if shape is None:
                    raise Unknown
                self.tensors[target.node] = shape
            return
        if (
            isinstance(target, TupleExpr)
            and isinstance(value, MemberExpr)
            and value.name == "shape"
            and all(isinstance(t, NameExpr) and isinstance(t.node, Var) for t in target.items)
        ):
            dims = self.dims_of(value.expr)
            if dims is None or len(dims) != len(target.items):
                raise Unknown
            for t, d in zip(target.items, dims, strict=True):
                assert isinstance(t, NameExpr) and isinstance(t.node, Var)
                self.ints[t.node] = d
            return
        raise Unknown

    def evaluate(self, expr: Expression) -> TShape | None:
        """The shape of a tensor expression inside the helper (None: unknown)."""
        if isinstance(expr, NameExpr) and isinstance(expr.node, Var):
            if expr.node not in self.tensors:
                raise Unknown
            return self.tensors[expr.node]
        if isinstance(expr, OpExpr) and expr.op in _OPERATORS:
            return self._method(_OPERATORS[expr.op], expr.left, ["other"], [[expr.right]])
        if isinstance(expr, UnaryExpr) and expr.op == "-":
            return self._method("__neg__", expr.expr, [], [])
        if isinstance(expr, IndexExpr):
            return self._method("__getitem__", expr.base, ["index"], [[expr.index]])
        if isinstance(expr, MemberExpr) and expr.name == "T":
            x = self.operand(expr.expr, None)
            return None if x is None else A.transpose("T", x, None)
        if isinstance(expr, CallExpr):
            return self._call(expr)
        raise Unknown

    def _method(
        self, name: str, receiver: Expression, formals: list[str], args: list[list[Expression]]
    ) -> TShape | None:
        from .rules import METHOD_RULES

        rule = METHOD_RULES.get(name)
        x = self.operand(receiver, None)
        if rule is None or x is None or x.scalar is not None:
            raise Unknown
        types = [[self.type_of(e) or _ANY for e in group] for group in args]
        names: list[str | None] = list(formals)
        return rule(Call(self, names, args, types, x))

    def _call(self, expr: CallExpr) -> TShape | None:
        from .rules import FUNCTION_RULES, METHOD_RULES

        callee = get_proper_type(self.type_of(expr.callee))
        if not isinstance(callee, CallableType):
            raise Unknown
        formals, args, types = self._layout(expr, callee)
        if isinstance(expr.callee, MemberExpr) and expr.callee.name in METHOD_RULES:
            receiver = self.operand(expr.callee.expr, None)
            if receiver is not None and receiver.scalar is None:
                return METHOD_RULES[expr.callee.name](Call(self, formals, args, types, receiver))
        fullname = expr.callee.fullname if isinstance(expr.callee, NameExpr | MemberExpr) else None
        op = OP_FULLNAMES.get(fullname or "")
        if op is not None:
            return FUNCTION_RULES[op](Call(self, formals, args, types, None))
        definition = callee.definition
        if isinstance(definition, FuncDef) and self.depth < _MAX_DEPTH:
            arguments = [self.operand(group[0], None) if group else None for group in args]
            return helper_result(self, definition, callee, arguments, self.depth + 1)
        raise Unknown

    def _layout(
        self, expr: CallExpr, callee: CallableType
    ) -> tuple[list[str | None], list[list[Expression]], list[list[Type]]]:
        mapping = map_actuals_to_formals(
            expr.arg_kinds,
            expr.arg_names,
            callee.arg_kinds,
            callee.arg_names,
            lambda i: self.type_of(expr.args[i]) or _ANY,
        )
        args = [[expr.args[i] for i in actuals] for actuals in mapping]
        types = [[self.type_of(e) or _ANY for e in group] for group in args]
        return list(callee.arg_names), args, types


def _is_int(typ: Type | None) -> bool:
    proper = get_proper_type(typ) if typ is not None else None
    return isinstance(proper, Instance) and proper.type.fullname == "builtins.int"


def helper_result(
    env: Env,
    func: FuncDef,
    callee: CallableType,
    arguments: list[Operand | None],
    depth: int = 0,
) -> TShape | None:
    """The result shape of ``func`` called with ``arguments`` (per formal), or None."""
    if not func.body.body or len(func.arguments) != len(arguments):
        return None
    inner = InlineEnv(env if not isinstance(env, InlineEnv) else env.outer, func, depth)
    for arg, given, kind in zip(func.arguments, arguments, callee.arg_kinds, strict=False):
        if kind != ARG_POS and given is None:
            continue
        if given is not None and given.scalar is None:
            inner.tensors[arg.variable] = given.shape
    try:
        return inner.run()
    except (Unknown, Mismatch):
        return None


_ANY: Type = AnyType(TypeOfAny.special_form)
