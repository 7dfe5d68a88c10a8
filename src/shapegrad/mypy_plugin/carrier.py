"""Where shapes live inside mypy's types.

A shaped annotation becomes mypy's ordinary ``Instance`` of ``Tensor`` plus one
entry in ``Instance.extra_attrs``: a ``Literal`` string holding the encoded
shape (see :func:`shapegrad.mypy_plugin.spec.encode`). mypy copies that field
through assignments, calls, tuples and its incremental cache, and ignores it
when it checks subtyping, so without this plugin the same code is plain
``Tensor`` code and mypy never reports a shape.
"""

from __future__ import annotations

from mypy.nodes import AssignmentStmt, CallExpr, Decorator, DictExpr, FuncItem, StrExpr, TypeInfo
from mypy.nodes import Var as MypyVar
from mypy.types import (
    CallableType,
    ExtraAttrs,
    Instance,
    LiteralType,
    ProperType,
    TupleType,
    Type,
    UnionType,
    get_proper_type,
)

from .sizes import parse
from .spec import Sym, TShape, Var, decode, encode, names_in

TENSOR = "shapegrad.tensor.Tensor"
KEY = "__shapegrad_shape__"
FN_KEY = "__shapegrad_fn__"
# A Tensor whose shape is not known carries this marker rather than nothing: when a
# variable is reassigned, mypy keeps its *first* type's extra attributes if the new
# type has none (meet_types), so an unmarked Tensor would bring back a stale shape.
UNKNOWN = TShape((Var(None, ""),), None)


def is_tensor(typ: Type) -> bool:
    """True for ``Tensor`` and its subclasses."""
    proper = get_proper_type(typ)
    return isinstance(proper, Instance) and proper.type.has_base(TENSOR)


def shape_of(typ: Type | None) -> TShape | None:
    """The static shape carried by ``typ``, or None (a plain or non-tensor type)."""
    if typ is None:
        return None
    proper = get_proper_type(typ)
    if not isinstance(proper, Instance) or proper.extra_attrs is None:
        return None
    literal = proper.extra_attrs.attrs.get(KEY)
    if not isinstance(literal, LiteralType) or not isinstance(literal.value, str):
        return None
    return decode(literal.value)


def attach(typ: Type, shape: TShape | None, str_type: Instance) -> Type:
    """``typ`` (a Tensor instance) carrying ``shape`` (None: :data:`UNKNOWN`); others unchanged."""
    proper = get_proper_type(typ)
    if not isinstance(proper, Instance) or not is_tensor(proper):
        return typ
    text = encode(shape or UNKNOWN)
    attrs = ExtraAttrs({KEY: LiteralType(text, str_type)})
    made = Instance(
        proper.type,
        proper.args,
        proper.line,
        proper.column,
        last_known_value=proper.last_known_value,
        extra_attrs=attrs,
    )
    if len(_ATTACHED) > 1 << 19:
        _ATTACHED.clear()
    _ATTACHED[id(made)] = (made, text)
    return made


# Every Instance made by `attach`, with its shape. mypy's union simplification sets
# `extra_attrs = None` on the instance it keeps when the items' extras differ (a
# tuple's fallback is the union of its items): that instance may be a variable's own
# type, whose shape is then lost everywhere. `erased_shape` reads it back.
_ATTACHED: dict[int, tuple[Instance, str]] = {}


def erased_shape(typ: Type | None) -> TShape | None:
    """The shape :func:`attach` gave ``typ`` if mypy has since erased it in place, else None.

    Only for a variable whose type is its own (a parameter, or assigned once):
    a merged variable may share the erased instance, and for it erasure is right.
    """
    proper = get_proper_type(typ) if typ is not None else None
    if not isinstance(proper, Instance) or proper.extra_attrs is not None:
        return None
    found = _ATTACHED.get(id(proper))
    if found is None or found[0] is not proper:
        return None
    return decode(found[1])


def attach_all(typ: Type, shapes: tuple[TShape | None, ...], str_type: Instance) -> Type:
    """``typ`` with ``shapes`` attached: to a tensor, or to a tuple's tensor items in order."""
    proper = get_proper_type(typ)
    if isinstance(proper, TupleType):
        items = list(proper.items)
        tensors = [i for i, item in enumerate(items) if is_tensor(item)]
        for k, i in enumerate(tensors):
            items[i] = attach(items[i], shapes[k] if k < len(shapes) else None, str_type)
        return proper.copy_modified(items=items)
    return attach(typ, shapes[0] if shapes else None, str_type)


def tensor_items(typ: Type | None) -> list[tuple[str, TShape]]:
    """Every shaped tensor in ``typ`` with its path: ``""``, ``"[0]"``, ``"[1][0]"`` ..."""
    if typ is None:
        return []
    proper: ProperType = get_proper_type(typ)
    shape = shape_of(proper)
    if shape is not None:
        return [("", shape)]
    if isinstance(proper, TupleType):
        return [
            (f"[{i}]{path}", s)
            for i, item in enumerate(proper.items)
            for path, s in tensor_items(item)
        ]
    return []


SIGNATURE = "s"  # the source tag of a function's own parameter annotations


def signature_names(types: list[Type]) -> frozenset[Sym | Var]:
    """The named dims in some annotations (a function signature: its rigid names)."""
    return frozenset(signature_sources(types))


def signature_sources(types: list[Type]) -> dict[Sym | Var, frozenset[str]]:
    """The named dims of some annotations, each with the sources that declare it.

    A source is :data:`SIGNATURE` for the annotations themselves (a tuple's or
    ParamList's elements included: ``sg.typechecked`` binds them with the other
    arguments), or a class's fullname for the shaped fields and properties of a
    parameter's class (a Module, a dataclass of weights; ``self`` too), which are
    bound apart, when the object was built. Within one signature one letter is one
    dim; two *different* letters are only known to differ when one source declares
    both (a Module's ``d_in`` and a function's ``i`` may be the same size), and a
    name only a class declares is not known to differ from a literal.
    """
    out: dict[Sym | Var, set[str]] = {}

    def add(names: set[Sym | Var] | frozenset[Sym | Var], source: str) -> None:
        for n in names:
            out.setdefault(n, set()).add(source)

    for typ in types:
        proper = get_proper_type(typ)
        if isinstance(proper, UnionType):
            for n, sources in signature_sources(list(proper.items)).items():
                out.setdefault(n, set()).update(sources)
            continue
        info = _class_of(proper)
        own: set[Sym | Var] = set()
        for _, shape in tensor_items(proper):
            own |= names_in(shape)
        add(own, SIGNATURE)  # a ParamList's elements too: sg.typechecked binds them with the rest
        if info is not None:
            fields, returned = member_names(info)
            add(fields, info.fullname)
            declared = {n.name for n in own | fields}
            add({n for n in returned if n.name in declared}, info.fullname)
    return {n: frozenset(s) for n, s in out.items()}


def _class_of(proper: ProperType) -> TypeInfo | None:
    if isinstance(proper, TupleType):
        return proper.partial_fallback.type
    if isinstance(proper, Instance) and not is_tensor(proper):
        return proper.type
    return None


Names = frozenset[Sym | Var]
_RIGID_CACHE: dict[int, tuple[FuncItem, dict[Sym | Var, frozenset[str]]]] = {}
_MEMBER_CACHE: dict[int, tuple[TypeInfo, tuple[Names, Names]]] = {}
_LIBRARY = ("builtins.", "typing.", "shapegrad.", "numpy.", "collections.", "abc.")


def member_names(info: TypeInfo) -> tuple[Names, Names]:
    """Named dims of a user class's shaped attributes, and of its properties' results.

    A property's result shares the names of the elements and attributes; a name
    only a property's result uses is bound by that result (as jaxtyping binds it).
    """
    cached = _MEMBER_CACHE.get(id(info))
    if cached is not None and cached[0] is info:
        return cached[1]
    names: set[Sym | Var] = set()
    returned: set[Sym | Var] = set()  # property results: their own names are bound by the result
    for klass in info.mro:
        if klass.fullname.startswith(_LIBRARY):
            continue
        names |= _renamed_dims(klass)
        for sym in klass.names.values():
            node = sym.node
            if isinstance(node, MypyVar):
                for _, shape in tensor_items(node.type):
                    names |= names_in(shape)
            elif isinstance(node, Decorator) and node.func.is_property:
                sig = node.func.type
                for _, shape in tensor_items(
                    sig.ret_type if isinstance(sig, CallableType) else None
                ):
                    returned |= names_in(shape)
    result = (frozenset(names), frozenset(returned))
    _MEMBER_CACHE[id(info)] = (info, result)
    return result


def _renamed_dims(klass: TypeInfo) -> set[Sym | Var]:
    """Names a class gives its sub-modules' dims: ``field(dims={"d_in": "d", "d_out": "4*d"})``."""
    out: set[Sym | Var] = set()
    for stmt in klass.defn.defs.body:
        if not isinstance(stmt, AssignmentStmt) or not isinstance(stmt.rvalue, CallExpr):
            continue
        call = stmt.rvalue
        if "dims" not in call.arg_names:
            continue
        mapping = call.args[call.arg_names.index("dims")]
        if isinstance(mapping, DictExpr):
            for _, value in mapping.items:
                if isinstance(value, StrExpr):
                    out |= names_in(TShape((parse(value.value, ""),)))
    return out


def attach_fn(typ: Type, fn: CallableType) -> Type:
    """An instance (``Compiled``, ``ScalarTrainer``) remembering the function it wraps."""
    proper = get_proper_type(typ)
    if not isinstance(proper, Instance):
        return typ
    attrs = ExtraAttrs({FN_KEY: fn})
    return Instance(
        proper.type,
        proper.args,
        proper.line,
        proper.column,
        last_known_value=proper.last_known_value,
        extra_attrs=attrs,
    )


def wrapped_fn(typ: Type | None) -> CallableType | None:
    """The function an instance made by :func:`attach_fn` wraps."""
    proper = get_proper_type(typ) if typ is not None else None
    if not isinstance(proper, Instance) or proper.extra_attrs is None:
        return None
    fn = get_proper_type(proper.extra_attrs.attrs.get(FN_KEY))
    return fn if isinstance(fn, CallableType) else None


def tuple_items(typ: Type | None) -> list[Type] | None:
    """Item types of a tuple type or a ParamList/TList subclass instance."""
    proper = get_proper_type(typ) if typ is not None else None
    if isinstance(proper, Instance) and proper.type.tuple_type is not None:
        proper = proper.type.tuple_type
    return list(proper.items) if isinstance(proper, TupleType) else None


def rigid_names(func: FuncItem) -> dict[Sym | Var, frozenset[str]]:
    """The named dims of ``func``'s parameters (cached per function object).

    A name written only in the return annotation is bound by the returned value
    (as jaxtyping does), so it is not rigid, unless an ``int`` parameter of that
    name gives its size (``def causal_mask(t: int) -> Bool[Tensor, "t t"]``).
    """
    cached = _RIGID_CACHE.get(id(func))
    if cached is not None and cached[0] is func:
        return cached[1]
    sig = func.type
    names: dict[Sym | Var, frozenset[str]] = {}
    if isinstance(sig, CallableType):
        sized = {
            name
            for name, typ in zip(sig.arg_names, sig.arg_types, strict=True)
            if name and _is_int(typ)
        }
        names = signature_sources(list(sig.arg_types))
        for n in signature_names([sig.ret_type]):
            if n.name in sized:
                names[n] = names.get(n, frozenset()) | {SIGNATURE}
    _RIGID_CACHE[id(func)] = (func, names)
    return names


def sizes_an_int(func: FuncItem, name: str) -> bool:
    """Whether ``func``'s ``int`` parameter ``name`` is the dim of that name: only when no
    tensor parameter declares the dim (``def causal_mask(t: int) -> Bool[Tensor, "t t"]``).

    Beside ``x: [b, t]``, ``t: int`` is any int (a cut point: ``x[:, t:]``), since
    jaxtyping never compares an int argument with a dim.
    """
    cached = _PARAM_DIMS_CACHE.get(id(func))
    if cached is None or cached[0] is not func:
        sig = func.type
        types = list(sig.arg_types) if isinstance(sig, CallableType) else []
        cached = _PARAM_DIMS_CACHE[id(func)] = (func, {n.name for n in signature_names(types)})
    return name not in cached[1]


_PARAM_DIMS_CACHE: dict[int, tuple[FuncItem, set[str | None]]] = {}


def _is_int(typ: Type) -> bool:
    proper = get_proper_type(typ)
    return isinstance(proper, Instance) and proper.type.fullname == "builtins.int"


def owner_key(func: FuncItem) -> str:
    """A stable name for a function as the owner of its rigid dims."""
    return f"{func.fullname or func.name}:{func.line}"
