"""Shape-typed annotations and containers: ``Float[Tensor, "b 784"]``, ``TList``, ``ParamList``.

``Float``/``Int``/``Bool``/``Shaped`` are jaxtyping's; they work on :class:`Tensor`
(its dtype names are the ones jaxtyping checks). ``TList[...]`` and
``ParamList[...]`` are immutable tuples of tensors typed element by element:

    >>> Params = ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"]]
    >>> params = Params.init(sg.nn.init.kaiming, seed=0, h=16)
    >>> [p.shape for p in params]
    [(16, 2), (16,)]

Statically (mypy) both are plain variadic generic tuples, so indexing and
``w, b = params`` type-check; shapegrad's mypy plugin reads the element
annotations. At run time ``ParamList[...]`` returns a cached subclass that
remembers them, so construction validates every element (named dims bound
consistently across elements) and ``Params.init`` can build the shapes.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self, TypeVar, TypeVarTuple, Unpack

import numpy as np
from jaxtyping import Bool, Float, Int, Shaped

from shapegrad import _specs
from shapegrad.dtypes import DTypeLike, as_dtype, float32
from shapegrad.ops.eager import tensor
from shapegrad.shapes import Shape, ShapeError, fmt
from shapegrad.tensor import Tensor

__all__ = ["Bool", "Float", "InitFn", "Int", "ParamList", "Shaped", "TList", "reveal_shape"]

Ts = TypeVarTuple("Ts")
_T = TypeVar("_T")


def reveal_shape(x: _T) -> _T:
    """Returns ``x``; under mypy with shapegrad's plugin, prints the shape it infers for ``x``.

    Like ``reveal_type``: ``sg.reveal_shape(h)`` makes mypy note
    ``Revealed shape is "float[b, 16]"`` (``unknown`` where the plugin does not know).
    """
    return x


class InitFn(Protocol):
    """Makes one tensor: ``init(shape, seed=..., dtype=...)``; see :mod:`shapegrad.nn.init`.

    ``seed`` is an int or a tuple of ints (``ParamList.init`` passes ``(seed, index)``).
    The result may be a Tensor or a NumPy array.
    """

    def __call__(
        self, shape: Shape, seed: int | tuple[int, ...] = 0, dtype: DTypeLike = float32
    ) -> Tensor | np.ndarray[Any, Any]: ...


_SUBSCRIPT_CACHE: dict[tuple[type, tuple[Any, ...]], Any] = {}


def _is_type_parameter(arg: Any) -> bool:
    """TypeVarTuple / *Ts / TypeVar: generic subclassing, not element annotations."""
    return (
        hasattr(arg, "__typing_subst__")
        or getattr(arg, "__origin__", None) is Unpack
        or (type(arg).__name__ in ("TypeVarTuple", "TypeVar", "ParamSpec"))
    )


def _subscript(cls: type[TList[*tuple[Any, ...]]], args: Any) -> Any:
    """``TList[A, B]``: a cached subclass of ``cls`` whose ``__sg_specs__`` are A, B."""
    items = args if isinstance(args, tuple) else (args,)
    if any(_is_type_parameter(a) for a in items):  # `class ParamList(TList[Unpack[Ts]])`
        return types.GenericAlias(cls, args)
    if cls.__sg_specs__ is not None:
        raise TypeError(f"{cls.__name__} is already subscripted; subclass it instead")
    specs = tuple(_specs.parse_annotation(a) for a in items)
    # jaxtyping makes a new class per `Float[Tensor, "h"]`; key by content so that equal
    # annotations written in two places give the same (isinstance-compatible) class.
    key = (cls, tuple(s.key() for s in specs))
    cached = _SUBSCRIPT_CACHE.get(key)
    if cached is not None:
        return cached
    name = f"{cls.__name__}[{', '.join(s.describe() for s in specs)}]"
    namespace = {"__sg_specs__": specs, "__module__": cls.__module__, "__qualname__": name}
    made = type(name, (cls,), namespace)
    _SUBSCRIPT_CACHE[key] = made
    return made


class TList(tuple[*Ts]):
    """An immutable tuple of tensors typed element by element (``TList[Float[Tensor, "b"], ...]``).

    ``TList[...](tensors)`` validates each element against its annotation with
    one set of dim bindings and raises :class:`~shapegrad.ShapeError` naming the
    element, the spec, the actual shape and the bindings so far. NumPy arrays
    are converted to tensors. The unsubscripted ``TList(tensors)`` checks nothing.
    """

    __sg_specs__: ClassVar[tuple[_specs.TensorSpec, ...] | None] = None

    if not TYPE_CHECKING:  # mypy sees a plain generic tuple; see _subscript
        __class_getitem__ = classmethod(_subscript)

    def __new__(cls, tensors: Iterable[Any]) -> Self:
        self = tuple.__new__(cls, (_as_tensor(t) for t in tensors))
        self._sg_validate()
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is immutable; build a new one instead")

    # --- validation ----------------------------------------------------------------

    def _element_label(self, index: int) -> str:
        return f"element {index}"

    def _sg_validate(self) -> _specs.Bindings:
        """Check every element against ``__sg_specs__``; returns the dim bindings."""
        specs = self.__sg_specs__
        bindings = _specs.Bindings()
        if specs is None:
            return bindings
        where = type(self).__name__
        if len(self) != len(specs):
            raise ShapeError(where, f"expected {len(specs)} tensors, got {len(self)}")
        # Two passes: symbolic dims ('h+1') may refer to dims bound by later elements.
        for symbolic in (False, True):
            for i, (spec, value) in enumerate(zip(specs, self._tensors(), strict=True)):
                before = bindings.copy()
                reason = _specs.match(spec, value, bindings, symbolic=symbolic)
                if reason is not None:
                    raise ShapeError(
                        where,
                        f"{self._element_label(i)} expected {spec.describe()}, got "
                        f"{_specs.describe_value(value)}: {reason} "
                        f"(dim bindings so far: {before.describe()})",
                    )
        return bindings

    def dims(self) -> dict[str, int | Shape]:
        """The named dims bound by the elements, e.g. ``{"h": 16}`` (``*batch`` dims as tuples)."""
        bindings = self._sg_validate()
        return {**bindings.single, **bindings.variadic}

    # --- conveniences ------------------------------------------------------------------

    def numpy(self) -> list[np.ndarray[Any, Any]]:
        """The elements as NumPy arrays (eager tensors only)."""
        return [t.numpy() for t in self._tensors()]

    def _tensors(self) -> tuple[Tensor, ...]:
        return tuple(self)  # type: ignore[arg-type]

    def map(self, fn: Callable[..., Tensor], *others: Sequence[Any]) -> Self:
        """``fn`` applied element-wise (zipped with ``others``); same type and flags.

        Example:
            >>> new = params.map(lambda p, g: p - 0.1 * g, grads)
        """
        for other in others:
            if len(other) != len(self):
                raise ValueError(
                    f"{type(self).__name__}.map: got a sequence of length {len(other)} "
                    f"for {len(self)} elements"
                )
        results = [fn(t, *(o[i] for o in others)) for i, t in enumerate(self._tensors())]
        for i, r in enumerate(results):
            if not isinstance(r, Tensor):
                raise TypeError(
                    f"{type(self).__name__}.map: fn returned {type(r).__name__} for "
                    f"{self._element_label(i)}; it must return Tensors"
                )
        return self._sg_rebuild(results)  # type: ignore[no-any-return]

    def _sg_rebuild(self, children: list[Any]) -> Any:
        """Rebuild with new leaves (sg.grad, tree_map, tracing). Non-tensor leaves give a tuple."""
        if not all(isinstance(c, Tensor) for c in children):
            return tuple(children)
        return type(self)(children)

    def __repr__(self) -> str:
        body = ", ".join(
            f"{self._element_label(i).split(' ', 1)[-1]}: {_short(t)}"
            for i, t in enumerate(self._tensors())
        )
        return f"{type(self).__name__.split('[')[0]}({body})"


class _Names:
    """``names``: the instance's names, or on the class the declared default (or None)."""

    def __get__(self, obj: Any, owner: type) -> tuple[str, ...] | None:
        if obj is None:
            declared: tuple[str, ...] | None = getattr(owner, "_sg_class_names", None)
            return declared
        names: tuple[str, ...] = obj._sg_names
        return names


class ParamList(TList[*Ts]):
    """Model parameters: a typed tuple of tensors plus per-element ``requires_grad`` flags and names.

    Args (construction ``Params(tensors, requires_grad=None, names=None)``):
        tensors: one tensor (or NumPy array) per annotation.
        requires_grad: a bool for all, or one bool per element (a frozen parameter
            or persistent buffer has False). Default: True for floating-point
            elements, False for int/bool buffers. A wrong length is a ValueError.
        names: one name per element (default: the class attribute ``names`` or
            ``p0, p1, ...``); checkpoints use them.
    Example:
        >>> class MLP(ParamList[Float[Tensor, "h 2"], Float[Tensor, "h"]]):
        ...     names = ("w1", "b1")
        >>> p = MLP.init(sg.nn.init.kaiming, seed=0, h=8)
        >>> p.names, p.requires_grad
        (('w1', 'b1'), (True, True))

    ``sg.grad`` with respect to a ParamList returns the same type (flags and
    names kept). Flags are metadata for trainers/optimizers; ``sg.grad`` itself
    differentiates every element.
    """

    if TYPE_CHECKING:
        names: tuple[str, ...]
        _sg_flags: tuple[bool, ...]
        _sg_names: tuple[str, ...]
    else:
        names = _Names()  # a subclass may assign a tuple; __init_subclass__ keeps it as default

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("names")
        if declared is not None:
            names = tuple(declared)
            specs = cls.__sg_specs__
            if specs is not None and len(names) != len(specs):
                raise ValueError(
                    f"{cls.__name__}.names has {len(names)} names for {len(specs)} parameters"
                )
            type.__setattr__(cls, "_sg_class_names", names)
            type.__setattr__(cls, "names", _Names())

    def __new__(
        cls,
        tensors: Iterable[Any],
        requires_grad: bool | Sequence[bool] | None = None,
        names: Sequence[str] | None = None,
    ) -> Self:
        self = tuple.__new__(cls, (_as_tensor(t) for t in tensors))
        object.__setattr__(self, "_sg_names", _resolve_names(len(self), names, cls))
        self._sg_validate()
        object.__setattr__(self, "_sg_flags", _resolve_flags(self._tensors(), requires_grad, cls))
        return self

    def _element_label(self, index: int) -> str:
        names = self._sg_names
        return f"element {index} ('{names[index]}')" if index < len(names) else f"element {index}"

    # --- flags ----------------------------------------------------------------------

    @property
    def requires_grad(self) -> tuple[bool, ...]:
        """One flag per element: True for trainable parameters."""
        return self._sg_flags

    def trainable(self) -> tuple[Tensor, ...]:
        """The elements whose flag is True."""
        return tuple(t for t, f in zip(self._tensors(), self._sg_flags, strict=True) if f)

    def trainable_indices(self) -> tuple[int, ...]:
        """Indices of the elements whose flag is True."""
        return tuple(i for i, f in enumerate(self._sg_flags) if f)

    def with_requires_grad(self, requires_grad: bool | Sequence[bool]) -> Self:
        """The same tensors with new flags."""
        return type(self)(self, requires_grad=requires_grad, names=self._sg_names)

    def freeze(self, *which: int | str) -> Self:
        """A copy with the given elements (indices or names) marked ``requires_grad=False``."""
        targets = {self._index_of(w) for w in which}
        flags = [f and i not in targets for i, f in enumerate(self._sg_flags)]
        return self.with_requires_grad(flags)

    def _index_of(self, which: int | str) -> int:
        if isinstance(which, int):
            if not -len(self) <= which < len(self):
                raise IndexError(f"parameter index {which} out of range for {len(self)}")
            return which % len(self)
        if which not in self._sg_names:
            raise KeyError(f"no parameter named {which!r}; names are {self._sg_names}")
        return self._sg_names.index(which)

    def named(self) -> dict[str, Tensor]:
        """``{name: tensor}`` in order."""
        return dict(zip(self._sg_names, self._tensors(), strict=True))

    def __getattr__(self, name: str) -> Tensor:
        """``params.w1``: the element called ``name`` (see ``names``)."""
        if name.startswith("_"):  # internals looked up before they are set
            raise AttributeError(name)
        names: tuple[str, ...] = self.__dict__.get("_sg_names", ())
        if name in names:
            return self._tensors()[names.index(name)]
        raise AttributeError(
            f"{type(self).__name__.split('[')[0]} has no attribute or parameter {name!r}; "
            f"parameter names are {names}"
        )

    def _sg_rebuild(self, children: list[Any]) -> Any:
        if not all(isinstance(c, Tensor) for c in children):
            return tuple(children)
        return type(self)(children, requires_grad=self._sg_flags, names=self._sg_names)

    # --- construction from the annotations --------------------------------------------

    @classmethod
    def init(
        cls,
        initializer: InitFn | Sequence[InitFn],
        seed: int = 0,
        dtype: DTypeLike = float32,
        requires_grad: bool | Sequence[bool] | None = None,
        names: Sequence[str] | None = None,
        dims: Mapping[str, int | Sequence[int]] | None = None,
        **dim_kwargs: int | Sequence[int],
    ) -> Self:
        """Create parameters whose shapes come from the annotations.

        Args:
            initializer: one initializer for all elements, or one per element
                (e.g. ``sg.nn.init.kaiming``; see :mod:`shapegrad.nn.init`).
            seed: element ``i`` gets the seed ``(seed, i)``, so results are reproducible.
                With one initializer, rank-0/1 elements whose name marks a norm gain
                (``gain``, ``gamma``, ``scale``, ``g`` or ending in ``_g``, ``_gain``...)
                get ones, as :class:`shapegrad.nn.Module` fields do.
            dtype: element dtype where the annotation allows it (``Int[...]`` gives int32).
            requires_grad, names: as for the constructor.
            dims / **dim_kwargs: sizes of the named dims (``h=16``, ``batch=(2, 3)``);
                ``dims`` serves names that clash with this method's arguments.
        Returns:
            A validated instance of ``cls``.
        Raises:
            ValueError naming a missing dim, an unknown dim, or a dim given twice with
            different values; TypeError for an unsubscripted class or anonymous dims.
        Example:
            >>> Params.init(sg.nn.init.kaiming, seed=0, h=16)
        """
        specs = cls.__sg_specs__
        where = f"{cls.__name__}.init"
        if specs is None:
            raise TypeError(f"{where}: subscript the class with annotations first")
        sizes = _merge_dims(specs, dims or {}, dim_kwargs, where)
        inits = _per_element(initializer, len(specs), where)
        single = not isinstance(initializer, Sequence)
        element_names = _resolve_names(len(specs), names, cls)
        base_dtype = as_dtype(dtype)
        tensors = []
        for i, (spec, init) in enumerate(zip(specs, inits, strict=True)):
            shape = _specs.build_shape(spec, sizes, f"{where} (element {i})")
            element_dtype = _specs.pick_dtype(spec, base_dtype, where)
            if single and _specs.infer_role(element_names[i], shape) == "gain":
                # One initializer for all: a norm gain (named ln_g, gamma, scale...) gets
                # ones, as in sg.nn.Module, not the zeros a weight initializer gives biases.
                tensors.append(tensor(np.ones(shape, element_dtype.numpy), element_dtype))
                continue
            tensors.append(_as_tensor(init(shape, seed=(seed, i), dtype=element_dtype)))
        return cls(tensors, requires_grad=requires_grad, names=names)

    def __repr__(self) -> str:
        body = ", ".join(
            f"{n}: {_short(t)}" for n, t in zip(self._sg_names, self._tensors(), strict=True)
        )
        frozen = "" if all(self._sg_flags) else f", requires_grad={self._sg_flags}"
        return f"{type(self).__name__.split('[')[0]}({body}{frozen})"


# --- helpers -------------------------------------------------------------------------------


def _as_tensor(value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.ndarray):
        return tensor(value)
    raise TypeError(f"expected a Tensor or NumPy array, got {type(value).__name__}")


def _short(t: Any) -> str:
    return f"{t.dtype.name}{fmt(t.shape)}" if isinstance(t, Tensor) else type(t).__name__


def _resolve_flags(
    tensors: tuple[Tensor, ...], requires_grad: bool | Sequence[bool] | None, cls: type
) -> tuple[bool, ...]:
    if requires_grad is None:
        return tuple(t.dtype.is_float for t in tensors)
    if isinstance(requires_grad, bool):
        return (requires_grad,) * len(tensors)
    flags = tuple(requires_grad)
    if len(flags) != len(tensors):
        raise ValueError(
            f"{cls.__name__}: requires_grad has {len(flags)} flags but there are "
            f"{len(tensors)} parameters"
        )
    if not all(isinstance(f, bool | np.bool_) for f in flags):
        raise TypeError(f"{cls.__name__}: requires_grad flags must be bools, got {flags}")
    return tuple(bool(f) for f in flags)


def _resolve_names(count: int, names: Sequence[str] | None, cls: type) -> tuple[str, ...]:
    if names is None:
        names = getattr(cls, "_sg_class_names", None)
    if names is None:
        return tuple(f"p{i}" for i in range(count))
    resolved = tuple(str(n) for n in names)
    if len(resolved) != count:
        raise ValueError(f"{cls.__name__}: {len(resolved)} names for {count} parameters")
    if len(set(resolved)) != count:
        raise ValueError(f"{cls.__name__}: parameter names must be unique, got {resolved}")
    return resolved


def _merge_dims(
    specs: Sequence[_specs.TensorSpec],
    dims: Mapping[str, Any],
    dim_kwargs: Mapping[str, Any],
    where: str,
) -> dict[str, int | Shape]:
    """One mapping of dim sizes; a dim given twice with different sizes, or unknown, is an error."""
    a = _specs.check_dim_values(dims)
    b = _specs.check_dim_values(dim_kwargs)
    for name in a.keys() & b.keys():
        if a[name] != b[name]:
            raise ValueError(
                f"{where}: conflicting values for dim '{name}': {a[name]} and {b[name]}"
            )
    merged = a | b
    known = {n for s in specs for n in s.dim_names()}
    unknown = sorted(n for n in merged if n not in known)
    if unknown:
        raise ValueError(
            f"{where}: unknown dim '{unknown[0]}'; the annotations name {sorted(known) or 'no dims'}"
        )
    return merged


def _per_element(initializer: InitFn | Sequence[InitFn], count: int, where: str) -> list[InitFn]:
    if isinstance(initializer, Sequence):
        inits = list(initializer)
        if len(inits) != count:
            raise ValueError(f"{where}: {len(inits)} initializers for {count} parameters")
        return inits
    return [initializer] * count
