"""Sizes held in Python ints: ``B, T, C = x.shape``, ``n_head = 4``, ``C // n_head``, ``x.shape[0]``.

mypy types such ints as plain ``int``, so the size an int expression stands for
is read from the source: literals, ``Final`` constants, ``t.shape[k]`` of a
shaped tensor, arithmetic (``+ - * //``), names assigned exactly once in the
module (followed to their value, tuple unpacking included) and parameters:
an ``int`` parameter named like a dim of its function's return that no tensor
parameter declares *is* that dim (``def causal_mask(t: int) -> Bool[Tensor, "t t"]``;
beside ``x: [b, t]`` an int ``t`` may be a cut point, ``x[:, t:]``); any other int
parameter or attribute (``cfg.n_embd``) is an opaque size, equal only to itself.
Anything else (a name assigned twice, a loop variable, ``len(xs)``) is unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from mypy.nodes import (
    AssignmentStmt,
    Block,
    CallExpr,
    ClassDef,
    Decorator,
    Expression,
    ForStmt,
    FuncDef,
    FuncItem,
    IfStmt,
    IndexExpr,
    ListExpr,
    MemberExpr,
    MypyFile,
    NameExpr,
    OperatorAssignmentStmt,
    OpExpr,
    StarExpr,
    Statement,
    TryStmt,
    TupleExpr,
    UnaryExpr,
    Var,
    WhileStmt,
    WithStmt,
)
from mypy.types import Instance, Type, get_proper_type

from . import sizes
from .carrier import owner_key, sizes_an_int
from .literals import int_of, label
from .spec import Expr, Item, Rigid, Sym


class Env(Protocol):
    """What size reading needs from :class:`shapegrad.mypy_plugin.env.Env`."""

    ints: dict[Var, Item]
    rigid: Rigid
    owner: str

    def type_of(self, expr: Expression) -> Type | None: ...
    def dims_of(self, expr: Expression) -> tuple[Item, ...] | None: ...
    def shape_dims(self, member: MemberExpr) -> tuple[Item, ...] | None: ...
    def module_index(self) -> ModuleIndex | None: ...


Source = tuple[Expression, int | None]  # (right-hand side, position when unpacked from a tuple)

_MAX_DEPTH = 8


@dataclass
class ModuleIndex:
    """Where each variable of a module is assigned, and which function each parameter belongs to."""

    sources: dict[Var, list[Source | None]] = field(default_factory=dict)  # None: not followable
    params: dict[Var, FuncItem] = field(default_factory=dict)

    def add(self, target: Expression, source: Source | None) -> None:
        if isinstance(target, NameExpr) and isinstance(target.node, Var):
            self.sources.setdefault(target.node, []).append(source)
        elif isinstance(target, TupleExpr | ListExpr):
            starred = any(isinstance(t, StarExpr) for t in target.items)
            for i, item in enumerate(target.items):
                rhs = None if source is None or source[1] is not None or starred else (source[0], i)
                self.add(item.expr if isinstance(item, StarExpr) else item, rhs)

    def walk(self, body: list[Statement]) -> None:
        for stmt in body:
            if isinstance(stmt, AssignmentStmt):
                for target in stmt.lvalues:
                    self.add(target, (stmt.rvalue, None))
            elif isinstance(stmt, OperatorAssignmentStmt):
                self.add(stmt.lvalue, None)
            elif isinstance(stmt, ForStmt):
                self.add(stmt.index, None)
                self._blocks(stmt.body, stmt.else_body)
            elif isinstance(stmt, WithStmt):
                for with_target in stmt.target:
                    if with_target is not None:
                        self.add(with_target, None)
                self._blocks(stmt.body)
            elif isinstance(stmt, FuncDef | Decorator):
                func = stmt.func if isinstance(stmt, Decorator) else stmt
                for arg in func.arguments:
                    self.params[arg.variable] = func
                self._blocks(func.body)
            elif isinstance(stmt, ClassDef):
                self._blocks(stmt.defs)
            elif isinstance(stmt, IfStmt):
                self._blocks(*stmt.body, stmt.else_body)
            elif isinstance(stmt, WhileStmt):
                self._blocks(stmt.body, stmt.else_body)
            elif isinstance(stmt, TryStmt):
                for var in stmt.vars:
                    if var is not None:
                        self.add(var, None)
                self._blocks(stmt.body, *stmt.handlers, stmt.else_body, stmt.finally_body)

    def _blocks(self, *blocks: Block | None) -> None:
        for block in blocks:
            if block is not None:
                self.walk(block.body)


_INDEX: dict[str, tuple[MypyFile, ModuleIndex]] = {}


def module_index(tree: MypyFile) -> ModuleIndex:
    """The (cached) assignment index of one module."""
    cached = _INDEX.get(tree.fullname)
    if cached is None or cached[0] is not tree:
        index = ModuleIndex()
        index.walk(tree.defs)
        cached = (tree, index)
        _INDEX[tree.fullname] = cached
    return cached[1]


def _is_int(env: Env, expr: Expression) -> bool:
    typ = env.type_of(expr)
    proper = get_proper_type(typ) if typ is not None else None
    return isinstance(proper, Instance) and proper.type.fullname == "builtins.int"


def size_of(env: Env, expr: Expression | None, depth: int = 0) -> Item:
    """The size an int-valued expression stands for, or None when it is not known."""
    if expr is None or depth > _MAX_DEPTH:
        return None
    value = int_of(expr)
    if value is not None:
        return value
    if isinstance(expr, OpExpr) and expr.op in ("+", "-", "*", "//"):
        left, right = size_of(env, expr.left, depth + 1), size_of(env, expr.right, depth + 1)
        if expr.op == "+":
            return sizes.add(left, right)
        if expr.op == "-":
            return sizes.sub(left, right)
        if expr.op == "*":
            return sizes.mul(left, right)
        return sizes.floordiv(left, right)
    if isinstance(expr, UnaryExpr) and expr.op == "-":
        return sizes.neg(size_of(env, expr.expr, depth + 1))
    if isinstance(expr, IndexExpr):
        k = int_of(expr.index)
        if k is not None:
            return _item(env, expr.base, k, depth)
        return None
    if isinstance(expr, CallExpr) and isinstance(expr.callee, NameExpr):
        if expr.callee.fullname == "builtins.len" and len(expr.args) == 1:
            dims = env.dims_of(expr.args[0])
            return dims[0] if dims else None
        if expr.callee.fullname == "builtins.int" and len(expr.args) == 1:
            return size_of(env, expr.args[0], depth + 1)
        return None
    if isinstance(expr, NameExpr) and isinstance(expr.node, Var):
        if expr.node in env.ints:
            return env.ints[expr.node]
        return _name(env, expr, expr.node, depth)
    if isinstance(expr, MemberExpr) and _is_int(env, expr):
        node = expr.node
        if isinstance(node, Var) and node.is_final and isinstance(node.final_value, int):
            return node.final_value
        text = label(expr)
        return Sym(text, "~" + env.owner) if text else None
    return None


def _name(env: Env, expr: NameExpr, var: Var, depth: int) -> Item:
    index = env.module_index()
    if index is None:
        return None
    sources = index.sources.get(var, [])
    func = index.params.get(var)
    if func is not None:
        if sources or not _is_int(env, expr):
            return None  # a reassigned parameter: its value here is not the argument
        owner = owner_key(func)
        if not sizes_an_int(func, var.name):  # beside a tensor's dim of that name: told apart
            return Sym(f"int({var.name})", "~" + owner)
        canonical = env.rigid.get((var.name, owner, False))
        return canonical if isinstance(canonical, Sym) else Sym(var.name, "~" + owner)
    if len(sources) != 1 or sources[0] is None:
        return None
    rvalue, position = sources[0]
    if position is None:
        return size_of(env, rvalue, depth + 1)
    return _item(env, rvalue, position, depth)


def _item(env: Env, seq: Expression, k: int, depth: int) -> Item:
    """Item ``k`` of a sequence of sizes: ``t.shape`` or a literal tuple of sizes."""
    if isinstance(seq, TupleExpr | ListExpr):
        if -len(seq.items) <= k < len(seq.items):
            return size_of(env, seq.items[k], depth + 1)
        return None
    if isinstance(seq, MemberExpr) and seq.name == "shape":
        dims = env.shape_dims(seq)
        if dims is not None and -len(dims) <= k < len(dims):
            item = dims[k]
            return item if isinstance(item, int | Sym | Expr) else None
    return None
