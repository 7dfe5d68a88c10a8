"""Result shapes of small helpers annotated with a plain ``Tensor``, evaluated at the call site.

``def up(x: Tensor) -> Tensor`` tells mypy nothing about shapes, so a call to it
would be unknown. When such a helper's body is straight-line code (assignments,
``B, C, H, W = x.shape`` and one final ``return``), its return expression is
evaluated here with the *caller's* argument shapes, by the same op rules. A
helper with branches, loops, comprehensions or calls the rules do not know
stays unknown. A mismatch inside the body with the caller's shapes is reported at
the call (every line of a straight-line body runs).
"""

from __future__ import annotations

from mypy.argmap import map_actuals_to_formals
from mypy.nodes import (
    ARG_POS,
    AssignmentStmt,
    CallExpr,
    ComparisonExpr,
    Decorator,
    DictExpr,
    Expression,
    FuncDef,
    IndexExpr,
    IntExpr,
    ListComprehension,
    MemberExpr,
    NameExpr,
    OpExpr,
    ReturnStmt,
    StrExpr,
    TupleExpr,
    TypeInfo,
    UnaryExpr,
    Var,
)
from mypy.types import AnyType, CallableType, Instance, Type, TypeOfAny, get_proper_type

from . import algebra as A
from . import sizes
from .algebra import Operand
from .call import Call
from .carrier import tensor_items
from .env import Env
from .intsize import size_of
from .literals import label
from .optable import OP_FULLNAMES
from .rules import FUNCTION_RULES, METHOD_RULES
from .spec import Expr, Item, Sym, TShape, restrict

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
        self.self_var: Var | None = None  # a method's `self`, whose fields are `fields`
        self.fields: dict[str, TShape] = {}

    # --- what the rules ask for ------------------------------------------------------

    def operand(self, expr: Expression | None, typ: Type | None) -> Operand | None:
        if expr is None:
            return None
        proper = get_proper_type(self.type_of(expr))
        if isinstance(proper, Instance) and proper.type.fullname in _SCALARS:
            return Operand(label(expr), TShape((), None), proper.type.fullname.split(".")[1])
        try:
            shape = self.evaluate(expr)
        except Unknown:
            return None
        return None if shape is None else Operand(label(expr), shape)

    def dims_of(self, expr: Expression) -> tuple[Item, ...] | None:
        found = self.operand(expr, None)
        return found.shape.dims if found is not None and found.shape.fixed else None

    def shape_dims(self, member: MemberExpr) -> tuple[Item, ...] | None:
        return self.dims_of(member.expr)  # the helper's locals, as evaluated here

    def size(self, expr: Expression | None) -> Item:
        if (
            isinstance(expr, NameExpr)
            and isinstance(expr.node, Var)
            and expr.node not in self.ints
            and "." not in expr.node.fullname  # a module-level constant (`P = 4`) is followed
        ):
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
            and target.items
            and isinstance(value, ListComprehension)
            and len(value.generator.indices) == 1
            and not any(value.generator.condlists)
        ):  # `q, k, v = [x @ w[:, i * C : (i + 1) * C] for i in range(3)]`: each element
            # is the expression with the loop variable unknown (it runs once per target)
            for t in target.items:
                if not isinstance(t, NameExpr) or not isinstance(t.node, Var):
                    raise Unknown
                shape = self.evaluate(value.generator.left_expr)
                if shape is None:
                    raise Unknown
                self.tensors[t.node] = shape
            return
        if (
            isinstance(target, TupleExpr)
            and isinstance(value, TupleExpr)
            and len(target.items) == len(value.items)
        ):  # `gh, gw = H // P, W // P`
            for t, v in zip(target.items, value.items, strict=True):
                self.assign(t, v)
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
        if (
            isinstance(expr, ComparisonExpr)
            and len(expr.operators) == 1
            and expr.operators[0] in _OPERATORS
        ):
            method = _OPERATORS[expr.operators[0]]
            return self._method(method, expr.operands[0], ["other"], [[expr.operands[1]]])
        if isinstance(expr, UnaryExpr) and expr.op == "-":
            return self._method("__neg__", expr.expr, [], [])
        if isinstance(expr, IndexExpr):
            return self._method("__getitem__", expr.base, ["index"], [[expr.index]])
        if (
            isinstance(expr, MemberExpr)
            and isinstance(expr.expr, NameExpr)
            and expr.expr.node is not None
            and expr.expr.node is self.self_var
        ):
            if expr.name not in self.fields:
                raise Unknown
            return self.fields[expr.name]
        if isinstance(expr, MemberExpr) and expr.name == "T":
            x = self.operand(expr.expr, None)
            return None if x is None else A.transpose("T", x, None)
        if isinstance(expr, CallExpr):
            return self._call(expr)
        raise Unknown

    def _method(
        self, name: str, receiver: Expression, formals: list[str], args: list[list[Expression]]
    ) -> TShape | None:
        rule = METHOD_RULES.get(name)
        x = self.operand(receiver, None)
        if rule is None or x is None or x.scalar is not None:
            raise Unknown
        types = [[self.type_of(e) or _ANY for e in group] for group in args]
        names: list[str | None] = list(formals)
        return rule(Call(self, names, args, types, x))

    def _call(self, expr: CallExpr) -> TShape | None:
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
        if isinstance(definition, Decorator) and len(definition.decorators) == 1:
            definition = definition.func
        tree = getattr(self.api, "tree", None)
        if (
            isinstance(definition, FuncDef)
            and tree is not None
            and definition.fullname.startswith(tree.fullname + ".")  # see calls._through_helper
            and self.depth < _MAX_DEPTH
        ):
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
    fields: dict[str, TShape] | None = None,
) -> TShape | None:
    """The result shape of ``func`` called with ``arguments`` (per formal), or None.

    For a method called on an object, ``fields`` are the shapes of the object's
    tensor fields in the caller's terms (``self.w`` in the body reads them).
    Raises :class:`Mismatch` when the body certainly fails with these shapes: a
    straight-line body runs every line, so the call itself is the bug.
    """
    params = list(func.arguments)
    inner = InlineEnv(env if not isinstance(env, InlineEnv) else env.outer, func, depth)
    if fields is not None and len(params) == len(arguments) + 1:
        inner.self_var, inner.fields = params[0].variable, fields
        params = params[1:]
    if not func.body.body or len(params) != len(arguments):
        return None
    for arg, given, kind in zip(params, arguments, callee.arg_kinds, strict=False):
        if kind != ARG_POS and given is None:
            continue
        if given is not None and given.scalar is None:
            inner.tensors[arg.variable] = given.shape
    try:
        return inner.run()
    except Unknown:
        return None


_ANY: Type = AnyType(TypeOfAny.special_form)


def receiver_fields(env: Env, receiver: Expression, info: TypeInfo) -> dict[str, TShape]:
    """Shapes of the tensor fields of the object ``receiver``, in the caller's terms.

    Reached as a field of a Module declared ``qkv: Linear = field(dims={"d_in": "d",
    "d_out": "3*d"})``, the sub-module's dim names are renamed as the mapping says
    (unmapped names are unknown); otherwise the fields keep their declared names,
    which are known where the class's names are (its own methods, functions taking it).
    """
    mapping = dims_mapping(env, receiver)
    out: dict[str, TShape] = {}
    for klass in info.mro:
        for name, sym in klass.names.items():
            node = sym.node
            if name in out or not isinstance(node, Var) or node.type is None:
                continue
            items = tensor_items(node.type)
            if len(items) != 1 or items[0][0]:
                continue
            shape = items[0][1]
            if mapping is None:
                restricted = env.shape(node.type)
                if restricted is not None:
                    out[name] = restricted
                continue
            out[name] = shape.with_dims(
                [
                    sizes.substitute(d, lambda s: mapping.get(s.name))
                    if isinstance(d, Sym | Expr)
                    else d
                    for d in shape.dims
                ]
            )
    return out


def dims_mapping(env: Env, receiver: Expression) -> dict[str, Item] | None:
    """``field(dims={...})`` of the attribute ``receiver`` (``self.qkv``), in the caller's terms."""
    if not isinstance(receiver, MemberExpr):
        return None
    owner = get_proper_type(env.type_of(receiver.expr))
    if not isinstance(owner, Instance):
        return None
    for klass in owner.type.mro:
        for stmt in klass.defn.defs.body:
            if (
                isinstance(stmt, AssignmentStmt)
                and isinstance(stmt.lvalues[0], NameExpr)
                and stmt.lvalues[0].name == receiver.name
                and isinstance(stmt.rvalue, CallExpr)
                and "dims" in stmt.rvalue.arg_names
            ):
                dims = stmt.rvalue.args[stmt.rvalue.arg_names.index("dims")]
                if not isinstance(dims, DictExpr):
                    return None
                mapping: dict[str, Item] = {}
                for key, value in dims.items:
                    if isinstance(key, StrExpr) and isinstance(value, IntExpr):
                        mapping[key.value] = value.value
                    elif isinstance(key, StrExpr) and isinstance(value, StrExpr):
                        parsed = sizes.parse(value.value, "")
                        mapping[key.value] = restrict(TShape((parsed,)), env.rigid).dims[0]
                return mapping
    return None
