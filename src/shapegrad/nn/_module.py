"""Typed modules: a model as a class of named, shape-annotated fields.

    >>> class Block(sg.nn.Module):
    ...     ln: sg.nn.LayerNorm
    ...     w: Float[Tensor, "d_out d"]
    ...     b: Float[Tensor, "d_out"]
    >>> class Net(sg.nn.Module):
    ...     embed: Float[Tensor, "v d"]
    ...     blocks: list[Block] = sg.nn.field(length="layers", dims={"d_out": "d"})
    >>> net = Net.init(seed=0, v=65, d=32, layers=2)
    >>> net.blocks[1].w.shape
    (32, 32)

A field annotated with a tensor annotation is a parameter (or, with
``field(role="state")``, non-trainable state such as batch-norm running
statistics); a field annotated with a Module subclass is a sub-module; a
``list[SubModule]`` field is a list of sub-modules; a field annotated with a
subscripted :class:`~shapegrad.ParamList` / ``TList`` subclass (``BlockStack``) holds
that tensor list as parameters (its ``requires_grad`` flags kept); any other
annotation is a static setting (``eps: float = 1e-5``) that is part of the
structure, not a leaf (a static field holding tensors is an error: they would
be silently frozen).

A module is a pytree node (``sg.grad`` returns gradients as the same module
type, ``sg.compile`` takes it as traced inputs, optimizers and checkpoints name
its leaves ``blocks.0.w``), immutable (``replace`` makes a changed copy) and
built from its annotations by ``init``: weights (rank >= 2) are drawn with
std = 1/sqrt(fan_in), biases are zero, norm gains (role "gain": fields named
``gain``/``gamma``/``scale``/``g``, or ``weight`` of rank 1) are one, unless a field
names its own initializer. :class:`~shapegrad.ParamList` shares the same role
defaults, leaf names and flags: it is the flat, tuple-typed form of the same
mechanism (kept because mypy types it element by element).
"""

from __future__ import annotations

import inspect
import sys
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Self, cast

from shapegrad import _specs, tree
from shapegrad._specs import Role, infer_role
from shapegrad.dtypes import DTypeLike, as_dtype, float32
from shapegrad.nn import init as _init
from shapegrad.nn._state import record_state
from shapegrad.ops.eager import tensor
from shapegrad.random import check_seed
from shapegrad.shapes import ShapeError, fmt
from shapegrad.tensor import Tensor
from shapegrad.typing import TList

__all__ = ["Module", "field", "infer_role", "role_initializer"]

_MISSING: Any = object()
_CLASS_VAR: Any = ClassVar


@dataclass(frozen=True)
class _FieldOptions:
    """What ``field(...)`` declares; see :func:`field`."""

    init: _init.Initializer | Any = None
    role: Role | None = None
    trainable: bool | None = None
    dims: Mapping[str, str | int] | None = None
    length: str | int | None = None
    default: Any = _MISSING


def field(
    *,
    init: Any = None,
    role: Role | None = None,
    trainable: bool | None = None,
    dims: Mapping[str, str | int] | None = None,
    length: str | int | None = None,
    default: Any = _MISSING,
) -> Any:
    """Options of one module field (its class-level default).

    Args:
        init: initializer for a tensor field (``sg.nn.init.normal(0.02)``); by default
            chosen from its role.
        role: "weight" (std 1/sqrt(fan_in)), "bias" (zeros), "gain" (ones) or "state"
            (non-trainable; give ``init``). Default: inferred from rank and name.
        trainable: override the ``requires_grad`` flag of a tensor field.
        dims: for a sub-module or list field, the sizes of the child's dims in terms of
            this module's dims, e.g. ``{"d_in": "d", "d_out": "4*d"}``.
        length: for a list field, its length: an int or a dim name (default: a dim
            named after the field, ``blocks=4``).
        default: for a static field, its default value.
    """
    return _FieldOptions(init, role, trainable, dims, length, default)


@dataclass(frozen=True)
class _FieldInfo:
    name: str
    kind: Literal["tensor", "module", "modules", "params", "static"]
    annotation: Any
    options: _FieldOptions
    spec: _specs.TensorSpec | None = None
    module: type[Module] | None = None
    params: type[TList[Any]] | None = None  # kind "params": the ParamList/TList class


def role_initializer(role: Role) -> Any:
    """The initializer a role gets by default."""
    if role == "weight":
        return _init.Kaiming(nonlinearity="linear")  # LeCun normal: std = 1/sqrt(fan_in)
    if role == "gain":
        return _init.ones
    return _init.zeros


class Module:
    """Base class of typed modules; see :mod:`shapegrad.nn._module` for the field kinds.

    Construct directly with every field as a keyword (values are validated against
    the annotations, NumPy arrays become tensors) or from the annotations with
    :meth:`init`.
    """

    __sg_fields__: ClassVar[tuple[_FieldInfo, ...] | None] = None
    __sg_namespace__: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__sg_fields__ = None  # resolved on first use: annotations may name later classes
        frame = sys._getframe(1)  # the class body's scope, for locally defined sub-modules
        cls.__sg_namespace__ = dict(frame.f_locals) if frame.f_code.co_name != "<module>" else {}

    # --- fields ----------------------------------------------------------------------

    @classmethod
    def _fields(cls) -> tuple[_FieldInfo, ...]:
        found: tuple[_FieldInfo, ...] | None = cls.__dict__.get("__sg_fields__")
        if found is not None:
            return found
        hints: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):  # base-class fields first, as dataclasses do
            if not (isinstance(klass, type) and issubclass(klass, Module)) or klass is Module:
                continue
            module = sys.modules.get(klass.__module__)
            globalns = dict(vars(module)) if module else {}
            for name, annotation in inspect.get_annotations(klass).items():
                hints[name] = _resolve(klass, name, annotation, globalns)
        infos = []
        for name, annotation in hints.items():
            if name.startswith("_") or typing.get_origin(annotation) is _CLASS_VAR:
                continue
            default = getattr(cls, name, _MISSING)
            options = default if isinstance(default, _FieldOptions) else _FieldOptions(default=default)
            infos.append(_classify(cls, name, annotation, options))
        cls.__sg_fields__ = tuple(infos)
        return cls.__sg_fields__

    def __init__(self, **values: Any) -> None:
        fields = self._fields()
        known = {f.name for f in fields}
        unknown = sorted(set(values) - known)
        if unknown:
            raise TypeError(
                f"{type(self).__name__}: unknown field {unknown[0]!r}; fields are {sorted(known)}"
            )
        for f in fields:
            value = values.get(f.name, f.options.default)
            if value is _MISSING:
                raise TypeError(f"{type(self).__name__}: missing field {f.name!r}")
            object.__setattr__(self, f.name, _check_field(self, f, value))
        # Two passes: symbolic dims ('3*d') may use dims bound by later fields.
        bindings = _specs.Bindings()
        for symbolic in (False, True):
            for f in fields:
                if f.kind == "tensor":
                    _match_field(self, f, getattr(self, f.name), bindings, symbolic)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"{type(self).__name__} is immutable; use .replace({name}=...) to make a changed copy"
        )

    def replace(self, **changes: Any) -> Self:
        """A validated copy with some fields replaced (like ``dataclasses.replace``)."""
        values = {f.name: getattr(self, f.name) for f in self._fields()}
        values.update(changes)
        return type(self)(**values)

    def with_state(self, **changes: Any) -> Self:
        """``replace(**changes)`` for updated state (running statistics), also recorded in
        the active :func:`shapegrad.nn.state_updates` collector (ScalarTrainer opens one
        around the loss), so callers need not thread the copy back by hand."""
        new = self.replace(**changes)
        record_state(self, new)
        return new

    # --- construction from the annotations --------------------------------------------

    @classmethod
    def init(
        cls,
        seed: int = 0,
        dtype: DTypeLike = float32,
        dims: Mapping[str, int] | None = None,
        **dim_kwargs: int,
    ) -> Self:
        """Build every parameter from the annotations; each tensor gets its own seed.

        Args:
            seed: an int in [0, 2**32); the whole tree is reproducible from it.
            dtype: dtype of floating-point fields.
            dims / **dim_kwargs: sizes of the named dims (``d=64``) and lengths of list
                fields (``blocks=4`` or the dim named by ``field(length=...)``).
        Raises:
            ValueError naming a missing or unused dim.
        Example:
            >>> net = Net.init(seed=0, v=65, d=32, layers=2)
        """
        seed = check_seed(seed, f"{cls.__name__}.init")
        sizes = _Sizes({**(dims or {}), **dim_kwargs}, cls.__name__)
        counter = iter(range(1 << 30))
        built: Self = _build(cls, sizes, seed, as_dtype(dtype), counter)
        sizes.check_all_used()
        return built

    # --- views ------------------------------------------------------------------------

    def named(self) -> dict[str, Tensor]:
        """``{path: tensor}`` for every leaf (``blocks.0.w``)."""
        leaves, _ = tree.flatten(self)
        return dict(zip(tree.leaf_paths(self), leaves, strict=True))

    @property
    def requires_grad(self) -> tuple[bool, ...]:
        """One flag per leaf: False for state fields and integer tensors."""
        flags: list[bool] = []
        for f in self._fields():
            value = getattr(self, f.name)
            if f.kind == "tensor":
                trainable = f.options.trainable
                if trainable is None:
                    is_float = not isinstance(value, Tensor) or value.dtype.is_float
                    trainable = f.options.role != "state" and is_float
                flags.append(trainable)
            elif f.kind == "module":
                flags.extend(value.requires_grad)
            elif f.kind == "modules":
                for m in value:
                    flags.extend(m.requires_grad)
            elif f.kind == "params":
                own = tree.leaf_flags(value)
                flags.extend(own if f.options.trainable is None else (f.options.trainable,) * len(own))
        return tuple(flags)

    def num_params(self, trainable_only: bool = True) -> int:
        """The number of scalar parameters (trainable ones by default)."""
        flags = self.requires_grad
        return sum(
            t.size
            for t, f in zip(self.named().values(), flags, strict=True)
            if f or not trainable_only
        )

    def summary(self) -> str:
        """A tree of fields with shapes and parameter counts, and the totals.

        Example:
            >>> print(net.summary())
            Net                                    4,256
            ├─ embed           float32[65, 32]     2,080
            ...
        """
        lines: list[tuple[str, str, str]] = [(type(self).__name__, "", f"{self.num_params():,}")]
        _summary_lines(self, "", lines)
        width = max(len(a) for a, _, _ in lines) + 2
        shape_width = max(len(b) for _, b, _ in lines) + 2
        count_width = max(len(c) for _, _, c in lines)
        body = [f"{a:<{width}}{b:<{shape_width}}{c:>{count_width}}".rstrip() for a, b, c in lines]
        trainable = self.num_params()
        total = self.num_params(trainable_only=False)
        tail = f"{trainable:,} trainable parameters"
        if total != trainable:
            tail += f", {total - trainable:,} non-trainable (state)"
        return "\n".join([*body, tail])

    def __repr__(self) -> str:
        parts = []
        for f in self._fields():
            value = getattr(self, f.name)
            if f.kind == "tensor":
                shown = _short(value)
            elif f.kind == "modules":
                shown = f"[{len(value)} x {f.module.__name__ if f.module else '?'}]"
            elif f.kind == "module":
                shown = type(value).__name__ + "(...)"
            else:  # a static setting, or a ParamList field (its repr names every element)
                shown = repr(value)
            parts.append(f"{f.name}={shown}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(
            f"{type(self).__name__} is not iterable; use .named() or access fields by name"
        )


# --- pytree protocol -------------------------------------------------------------------------


def _tree_flatten(obj: Module) -> tuple[list[Any], tuple[str, ...], Any]:
    fields = obj._fields()
    children = [f for f in fields if f.kind != "static"]
    statics = tuple((f.name, getattr(obj, f.name)) for f in fields if f.kind == "static")
    return [getattr(obj, f.name) for f in children], tuple(f.name for f in children), (
        type(obj),
        statics,
    )


def _tree_unflatten(aux: Any, children: list[Any]) -> Module:
    cls, statics = aux
    obj: Module = object.__new__(cls)  # no validation: leaves may be gradients or traced values
    names = [f.name for f in cls._fields() if f.kind != "static"]
    for name, value in zip(names, children, strict=True):
        object.__setattr__(obj, name, value)
    for name, value in statics:
        object.__setattr__(obj, name, value)
    return obj


Module.__sg_tree__ = (_tree_flatten, _tree_unflatten)  # type: ignore[attr-defined]


# --- helpers ---------------------------------------------------------------------------------


def _resolve(klass: type, name: str, annotation: Any, globalns: dict[str, Any]) -> Any:
    """Evaluate a string annotation (``from __future__ import annotations``) in its scope."""
    if not isinstance(annotation, str):
        return annotation
    scope = getattr(klass, "__sg_namespace__", {})
    try:
        return eval(annotation, globalns, dict(scope))  # the user's own annotation text
    except NameError as error:
        raise TypeError(
            f"{klass.__name__}.{name}: cannot resolve the annotation {annotation!r}: {error}"
        ) from None


def _classify(cls: type, name: str, annotation: Any, options: _FieldOptions) -> _FieldInfo:
    if _specs.is_tensor_annotation(annotation):
        return _FieldInfo(name, "tensor", annotation, options, spec=_specs.parse_annotation(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Module):
        return _FieldInfo(name, "module", annotation, options, module=annotation)
    if isinstance(annotation, type) and issubclass(annotation, TList):
        return _FieldInfo(name, "params", annotation, options, params=annotation)
    if typing.get_origin(annotation) is list:
        (arg,) = typing.get_args(annotation) or (None,)
        if isinstance(arg, type) and issubclass(arg, Module):
            return _FieldInfo(name, "modules", annotation, options, module=arg)
    if options.init is not None or options.role is not None:
        raise TypeError(
            f"{cls.__name__}.{name}: init/role need a tensor annotation such as "
            f"Float[Tensor, 'd'], got {annotation!r}"
        )
    return _FieldInfo(name, "static", annotation, options)


def _check_field(owner: Module, f: _FieldInfo, value: Any) -> Any:
    where = f"{type(owner).__name__}.{f.name}"
    if f.kind == "tensor":
        if isinstance(value, Tensor):
            return value
        try:
            return tensor(value)
        except (TypeError, ValueError):
            raise TypeError(f"{where}: expected a tensor, got {type(value).__name__}") from None
    if f.kind == "module":
        if not isinstance(value, f.module or Module):
            raise TypeError(f"{where}: expected a {f.annotation.__name__}, got {type(value).__name__}")
        return value
    if f.kind == "modules":
        items = list(value) if isinstance(value, list | tuple) else None
        if items is None or not all(isinstance(m, f.module or Module) for m in items):
            raise TypeError(f"{where}: expected a list of {f.module.__name__ if f.module else 'Module'}")
        return items
    if f.kind == "params":
        assert f.params is not None
        if isinstance(value, f.params):
            return value
        if isinstance(value, list | tuple) and not isinstance(value, TList):
            return f.params(value)  # validated against the annotations
        raise TypeError(f"{where}: expected a {f.params.__name__}, got {type(value).__name__}")
    inside = tree.tensor_inside(value)
    if inside is not None:  # it would be baked in as a constant, never trained
        found = f" (at {f.name}{inside})" if inside else ""
        raise TypeError(
            f"{where} holds a tensor but is annotated {f.annotation!r}, so it would be a "
            f"static setting, not a parameter{found}; annotate it as a tensor "
            "(Float[Tensor, 'd']), a sub-module or a ParamList subclass"
        )
    return value


def _match_field(
    owner: Module, f: _FieldInfo, value: Tensor, bindings: _specs.Bindings, symbolic: bool
) -> None:
    assert f.spec is not None
    before = bindings.copy()
    reason = _specs.match(f.spec, value, bindings, symbolic=symbolic)
    if reason is not None:
        raise ShapeError(
            f"{type(owner).__name__}.{f.name}",
            f"expected {f.spec.describe()}, got {_specs.describe_value(value)}: {reason} "
            f"(dim bindings so far: {before.describe()})",
        )


class _Sizes:
    """Dim sizes for ``init``; records which were used so unknown names are reported."""

    def __init__(self, sizes: Mapping[str, Any], owner: str) -> None:
        self.sizes = _specs.check_dim_values(sizes)
        self.owner = owner
        self.used: set[str] = set()

    def scope(self, renames: Mapping[str, str | int] | None, parent: dict[str, Any]) -> dict[str, Any]:
        if not renames:
            return parent
        scope = dict(parent)
        for child_dim, expression in renames.items():
            if isinstance(expression, int):
                scope[child_dim] = expression
                continue
            singles = {k: v for k, v in parent.items() if isinstance(v, int)}
            try:
                scope[child_dim] = int(eval(expression, {"__builtins__": {}}, singles))
            except NameError as error:
                raise ValueError(f"{self.owner}.init: dims {{{child_dim!r}: {expression!r}}}: {error}") from None
            for name in singles:
                if name in expression:
                    self.used.add(name)
        return scope

    def check_all_used(self) -> None:
        unused = sorted(set(self.sizes) - self.used)
        if unused:
            raise ValueError(
                f"{self.owner}.init: unknown dim {unused[0]!r}; the annotations name "
                f"{sorted(self.used) or 'no dims'}"
            )


def _build(cls: type[Module], sizes: _Sizes, seed: int, dtype: Any, counter: Iterator[int], scope: dict[str, Any] | None = None, path: str = "") -> Any:
    scope = sizes.sizes if scope is None else scope
    values: dict[str, Any] = {}
    for f in cls._fields():
        where = f"{cls.__name__}.init ({path}{f.name})"
        if f.kind == "tensor":
            assert f.spec is not None
            sizes.used.update(n for n in f.spec.dim_names() if n in scope)
            shape = _specs.build_shape(f.spec, scope, where)
            element_dtype = _specs.pick_dtype(f.spec, dtype, where)
            role = f.options.role or infer_role(f.name, shape)
            initializer = f.options.init or (
                role_initializer(role) if element_dtype.is_float else _init.zeros
            )
            values[f.name] = tensor(initializer(shape, seed=(seed, next(counter)), dtype=element_dtype))
        elif f.kind == "module":
            assert f.module is not None
            child_scope = sizes.scope(f.options.dims, scope)
            values[f.name] = _build(f.module, sizes, seed, dtype, counter, child_scope, f"{path}{f.name}.")
        elif f.kind == "params":
            assert f.params is not None
            values[f.name] = _build_params(f, sizes, scope, seed, dtype, counter, where)
        elif f.kind == "modules":
            assert f.module is not None
            length = f.options.length if f.options.length is not None else f.name
            if isinstance(length, str):
                if length not in scope or not isinstance(scope[length], int):
                    raise ValueError(
                        f"{where}: missing the length of list field {f.name!r}; pass {length}=N"
                    )
                sizes.used.add(length)
                length = int(cast(int, scope[length]))
            child_scope = sizes.scope(f.options.dims, scope)
            values[f.name] = [
                _build(f.module, sizes, seed, dtype, counter, child_scope, f"{path}{f.name}.{i}.")
                for i in range(length)
            ]
    return cls(**values)


def _build_params(
    f: _FieldInfo, sizes: _Sizes, scope: dict[str, Any], seed: int, dtype: Any,
    counter: Iterator[int], where: str,
) -> Any:
    """A ParamList/TList field built element by element as tensor fields are: role
    defaults by element name (``ln1_g`` is a gain), one seed per element; ``field(init=)``
    may give one initializer for all or one per element (``field(init=block_init())``)."""
    assert f.params is not None
    specs = f.params.__sg_specs__
    if specs is None:
        raise TypeError(f"{where}: {f.params.__name__} has no annotations to build from; "
                        "subscript it (ParamList[Float[Tensor, 'd'], ...])")
    names: tuple[str, ...] = getattr(f.params, "_sg_class_names", None) or tuple(
        f"p{i}" for i in range(len(specs))
    )
    given = f.options.init
    if isinstance(given, list | tuple) and len(given) != len(specs):
        raise ValueError(f"{where}: field(init=...) has {len(given)} initializers for "
                         f"{len(specs)} elements of {f.params.__name__}")
    tensors = []
    for k, (spec, name) in enumerate(zip(specs, names, strict=True)):
        sizes.used.update(n for n in spec.dim_names() if n in scope)
        shape = _specs.build_shape(spec, scope, f"{where} ({name})")
        element_dtype = _specs.pick_dtype(spec, dtype, where)
        role = f.options.role or infer_role(name, shape)
        initializer = (given[k] if isinstance(given, list | tuple) else given) or (
            role_initializer(role) if element_dtype.is_float else _init.zeros
        )
        tensors.append(tensor(initializer(shape, seed=(seed, next(counter)), dtype=element_dtype)))
    return f.params(tensors)


def _short(value: Any) -> str:
    return f"{value.dtype.name}{fmt(value.shape)}" if isinstance(value, Tensor) else type(value).__name__


def _tree_named(value: Any) -> dict[str, Tensor]:
    """``{name: tensor}`` of a ParamList/TList field (positions for a TList)."""
    leaves, _ = tree.flatten(value)
    return dict(zip(tree.leaf_paths(value), leaves, strict=True))


def _summary_lines(module: Module, indent: str, lines: list[tuple[str, str, str]]) -> None:
    fields = module._fields()
    for k, f in enumerate(fields):
        last = k == len(fields) - 1
        branch = indent + ("└─ " if last else "├─ ")
        deeper = indent + ("   " if last else "│  ")
        value = getattr(module, f.name)
        if f.kind == "tensor":
            flags_note = " (state)" if f.options.role == "state" else ""
            lines.append((branch + f.name + flags_note, _short(value), f"{value.size:,}"))
        elif f.kind == "module":
            lines.append((f"{branch}{f.name}: {type(value).__name__}", "", f"{value.num_params():,}"))
            _summary_lines(value, deeper, lines)
        elif f.kind == "params":
            trainable = tree.leaf_flags(value)
            count = sum(t.size for t, keep in zip(value, trainable, strict=True) if keep)
            lines.append((f"{branch}{f.name}: {type(value).__name__.split('[')[0]}", "", f"{count:,}"))
            named = list(_tree_named(value).items())
            for i, (name, t) in enumerate(named):
                twig = "└─ " if i == len(named) - 1 else "├─ "
                lines.append((f"{deeper}{twig}{name}", _short(t), f"{t.size:,}"))
        elif f.kind == "modules":
            total = sum(m.num_params() for m in value)
            lines.append((f"{branch}{f.name}: list[{f.module.__name__ if f.module else '?'}] x{len(value)}", "", f"{total:,}"))
            for i, m in enumerate(value):
                sub_last = i == len(value) - 1
                lines.append((deeper + ("└─ " if sub_last else "├─ ") + f"{i}: {type(m).__name__}", "", f"{m.num_params():,}"))
                _summary_lines(m, deeper + ("   " if sub_last else "│  "), lines)
        else:
            lines.append((f"{branch}{f.name} = {value!r}", "", ""))
