"""What a hook needs from the type checker: argument access, rigid names, error reporting."""

from __future__ import annotations

from dataclasses import dataclass, field

from mypy.checker import TypeChecker
from mypy.errorcodes import ErrorCode
from mypy.literals import literal
from mypy.nodes import (
    LITERAL_TYPE,
    Context,
    Expression,
    FuncItem,
    IndexExpr,
    MemberExpr,
    NameExpr,
    TypeAlias,
)
from mypy.nodes import Var as MypyVar
from mypy.plugin import CheckerPluginInterface
from mypy.types import Instance, TupleType, Type, TypeAliasType, get_proper_type

from .algebra import Operand, with_hint
from .aliases import spec_at
from .carrier import UNKNOWN, attach, erased_shape, is_tensor, owner_key, rigid_names, shape_of
from .intsize import ModuleIndex, module_index, size_of
from .literals import label
from .parsing import parse_spec
from .spec import Item, Rigid, TShape, add_rigid, restrict, show

SHAPE_ERROR = ErrorCode("shapegrad-shape", "Tensor shapes certainly disagree", "shapegrad")

_SCALARS = ("builtins.int", "builtins.float", "builtins.bool")
# Per stack of enclosing functions (by identity): the rigid names and the owner key.
_SCOPES: dict[tuple[int, ...], tuple[tuple[FuncItem, ...], Rigid, str]] = {}
_RESTRICTED: dict[tuple[TShape, tuple[int, ...]], TShape] = {}
# `x.shape` expressions as checked: (the node, the dims of `x` there, the scope key).
_SHAPE_AT: dict[int, tuple[MemberExpr, tuple[Item, ...] | None, tuple[int, ...]]] = {}


@dataclass
class Env:
    """The checker at one hook call, with the rigid names of the enclosing functions."""

    api: CheckerPluginInterface
    rigid: Rigid = field(init=False)
    owner: str = field(init=False, default="")
    _key: tuple[int, ...] = field(init=False, default=())
    # Ints whose size is known here regardless of the module's assignments (inline.py).
    ints: dict[MypyVar, Item] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        funcs: tuple[FuncItem, ...] = ()
        if isinstance(self.api, TypeChecker):
            funcs = tuple(f for f in self.api.scope.stack if isinstance(f, FuncItem))
        self._key = tuple(id(f) for f in funcs)
        cached = _SCOPES.get(self._key)
        if cached is None or cached[0] != funcs:
            rigid: Rigid = {}
            for func in funcs:
                rigid = add_rigid(rigid, owner_key(func), rigid_names(func))
            cached = (funcs, rigid, owner_key(funcs[-1]) if funcs else "")
            _SCOPES[self._key] = cached
        self.rigid, self.owner = cached[1], cached[2]

    def shape(self, typ: Type | None) -> TShape | None:
        """The shape of ``typ`` in this function's terms (foreign names forgotten)."""
        shape = shape_of(typ)
        if shape is None:
            return None
        key = (shape, self._key)
        restricted = _RESTRICTED.get(key)
        if restricted is None:
            if len(_RESTRICTED) > 65536:
                _RESTRICTED.clear()
            restricted = _RESTRICTED[key] = restrict(shape, self.rigid)
        return restricted

    def type_of(self, expr: Expression) -> Type | None:
        """The type mypy inferred for an already-checked expression."""
        return self.api.lookup_type_or_none(expr) if isinstance(self.api, TypeChecker) else None

    def flow_type(self, expr: Expression | None, typ: Type | None) -> Type | None:
        """``typ`` as of here for a variable that was reassigned (the binder's own record).

        mypy reads a reassigned variable as the *meet* of its first type and its
        current one, and the meet keeps the first shape when the current type has
        none (a plain ``Tensor``, or a join of two shapes): a stale shape that
        would be reported on correct code. The binder holds the current type alone.
        """
        if (
            isinstance(self.api, TypeChecker)
            and isinstance(expr, NameExpr | MemberExpr | IndexExpr)
            and literal(expr) >= LITERAL_TYPE
        ):
            current = self.api.binder.get(expr)
            if current is not None:
                typ = current
        return self._unerased(expr, typ)

    def _unerased(self, expr: Expression | None, typ: Type | None) -> Type | None:
        """``typ`` with its shape back if mypy erased it in place (see ``carrier.erased_shape``)."""
        proper = get_proper_type(typ) if typ is not None else None
        items = proper.items if isinstance(proper, TupleType) else [typ]
        if typ is None or not isinstance(expr, NameExpr) or not any(map(_erased, items)):
            return typ
        var, index = expr.node, self.module_index()
        if not isinstance(var, MypyVar) or index is None:
            return typ
        sources = index.sources.get(var, [])
        if not _own(var, index):
            return typ
        # A parameter annotated with a type alias: its items are copies of the alias's,
        # read back from the alias's source text.
        alias = var.type.alias if isinstance(var.type, TypeAliasType) else None
        if isinstance(proper, TupleType):
            return proper.copy_modified(items=[self._restored(t, alias) for t in proper.items])
        restored = self._restored(typ, alias)
        source = sources[0] if len(sources) == 1 else None
        if (
            _erased(restored)
            and source is not None
            and isinstance(source[0], NameExpr)
            and isinstance(source[0].node, MypyVar)
            and _own(source[0].node, index)  # its value now is its value at the unpacking
        ):
            # `w1, w2 = params`: the item of the (restored) tuple it was unpacked from
            whole = get_proper_type(self.flow_type(source[0], self.type_of(source[0])))
            k = source[1]
            if (
                isinstance(whole, TupleType)
                and k is not None
                and -len(whole.items) <= k < len(whole.items)
            ):
                item = whole.items[k]
                if not _erased(item) and shape_of(item) is not None:
                    return attach(typ, shape_of(item), self.str_type())
        return restored

    def _restored(self, typ: Type, alias: TypeAlias | None = None) -> Type:
        shape = erased_shape(typ)
        proper = get_proper_type(typ)
        if shape is None and alias is not None and _erased(proper) and isinstance(proper, Instance):
            modules = self.api.modules if isinstance(self.api, TypeChecker) else {}
            tree = modules.get(alias.module)
            found = spec_at(tree, proper.line, proper.column) if tree is not None else None
            if found is not None:
                shape = parse_spec(found[1], found[0], alias.fullname)
        return typ if shape is None else attach(typ, shape, self.str_type())

    def dims_of(self, expr: Expression) -> tuple[Item, ...] | None:
        shape = self.shape(self.flow_type(expr, self.type_of(expr)))
        return shape.dims if shape is not None and shape.fixed else None

    def record_shape(self, member: MemberExpr) -> None:
        """Remember the dims of ``x`` where ``x.shape`` is read (its attribute hook).

        ``B, C, H, W = x.shape`` followed by ``x = ...``: a later ``W`` is the old
        ``x``'s size, so sizes unpacked from ``.shape`` are read as of that line.
        """
        if len(_SHAPE_AT) > 65536:
            _SHAPE_AT.clear()
        _SHAPE_AT[id(member)] = (member, self.dims_of(member.expr), self._key)

    def shape_dims(self, member: MemberExpr) -> tuple[Item, ...] | None:
        """The dims ``member`` (an ``x.shape`` expression) read where it was checked."""
        seen = _SHAPE_AT.get(id(member))
        if seen is None or seen[0] is not member or seen[2] != self._key:
            return None  # not checked here (yet): unknown, never a stale size
        return seen[1]

    def operand(self, expr: Expression | None, typ: Type | None) -> Operand | None:
        """A tensor with a static shape, or a Python number as a scalar ``[]``; else None."""
        typ = self.flow_type(expr, typ)
        proper = get_proper_type(typ) if typ is not None else None
        if isinstance(proper, Instance) and proper.type.fullname in _SCALARS:
            return Operand(label(expr), TShape((), None), proper.type.fullname.split(".")[1])
        shape = self.shape(typ)
        return None if shape is None else Operand(label(expr), shape)

    def size(self, expr: Expression | None) -> Item:
        """The size an int expression stands for (see :mod:`intsize`), None if unknown."""
        return size_of(self, expr)

    def module_index(self) -> ModuleIndex | None:
        return module_index(self.api.tree) if isinstance(self.api, TypeChecker) else None

    def str_type(self) -> Instance:
        return self.api.named_generic_type("builtins.str", [])

    def fail(self, message: str, context: Context) -> None:
        self.api.fail(with_hint(message), context, code=SHAPE_ERROR)


def _own(var: MypyVar, index: ModuleIndex) -> bool:
    """A parameter never reassigned, or a variable assigned once: its type is its own."""
    sources = index.sources.get(var, [])
    return (var in index.params and not sources) or (len(sources) == 1 and sources[0] is not None)


def _erased(typ: Type | None) -> bool:
    """A tensor type whose shape marker mypy removed (every attached type has one)."""
    proper = get_proper_type(typ) if typ is not None else None
    return isinstance(proper, Instance) and proper.extra_attrs is None and is_tensor(proper)


def describe(env: Env, expr: Expression | None, typ: Type | None) -> str:
    """What the plugin knows of a value, for ``sg.reveal_shape``: ``float[b, 784]``,
    ``([b, 10], [])`` for a tuple, ``unknown`` for a tensor of unknown shape."""
    typ = env.flow_type(expr, typ)
    proper = get_proper_type(typ) if typ is not None else None
    if isinstance(proper, TupleType):
        return "(" + ", ".join(describe(env, None, item) for item in proper.items) + ")"
    if proper is None or not is_tensor(proper):
        return "not a Tensor"
    shape = env.shape(typ)
    if shape is None or shape == UNKNOWN:
        return "unknown"
    return f"{shape.dtype or ''}{show(shape.dims)}"
