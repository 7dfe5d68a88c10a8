"""Shape specs of tensor annotations (``Float[Tensor, "b *batch 784"]``): parse, match, build.

jaxtyping owns the annotation objects; this module reads their public
attributes (``dim_str``, ``dtypes``, ``array_type``) and implements the same
dimension grammar so that shapegrad can (a) validate several tensors against
one set of dim bindings with messages written for people, and (b) *build*
shapes from an annotation plus keyword dims (``Params.init(h=16)``).

Grammar of one token (as in jaxtyping): ``3`` fixed size, ``h`` named dim,
``h=3`` fixed size 3, ``_`` / ``_h`` any size, ``#h`` named dim that also
accepts size 1, ``*batch`` named run of dims, ``...`` anonymous run of dims,
anything else a symbolic expression over named dims (``h+1``, ``2*h``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import jaxtyping

from shapegrad.dtypes import ALL_DTYPES, DType, as_dtype
from shapegrad.shapes import Shape, fmt
from shapegrad.tensor import Tensor

DimKind = Literal["fixed", "named", "anon", "symbolic", "variadic", "anon_variadic"]

# Names usable inside symbolic dims besides the bound dims.
_SYMBOLIC_BUILTINS: dict[str, Any] = {"min": min, "max": max, "abs": abs, "int": int}


@dataclass(frozen=True)
class Dim:
    """One token of a shape spec."""

    kind: DimKind
    text: str  # the token as written
    name: str = ""  # named / variadic dims; the expression of a symbolic dim
    size: int = 0  # fixed dims
    broadcastable: bool = False


@dataclass(frozen=True)
class TensorSpec:
    """What one tensor annotation demands: dims (None = any shape) and dtype names (None = any)."""

    annotation: Any
    dims: tuple[Dim, ...] | None
    dtypes: tuple[str, ...] | None

    @property
    def variadic_index(self) -> int | None:
        if self.dims is None:
            return None
        for i, d in enumerate(self.dims):
            if d.kind in ("variadic", "anon_variadic"):
                return i
        return None

    def key(self) -> tuple[Any, ...]:
        """A hashable identity by content (annotation kind, array type, dims, dtypes)."""
        return (self.describe(), getattr(self.annotation, "array_type", Tensor), self.dtypes)

    def describe(self) -> str:
        """The annotation as a user wrote it, e.g. ``Float[Tensor, 'h 2']``."""
        if self.dims is None:
            return "Tensor"
        kind = getattr(getattr(self.annotation, "dtype", None), "__name__", "Shaped")
        return f"{kind}[Tensor, '{' '.join(d.text for d in self.dims)}']"

    def dim_names(self) -> tuple[str, ...]:
        """Named dims (single, variadic, and names inside symbolic dims) in order of appearance."""
        names: list[str] = []
        for d in self.dims or ():
            if d.kind in ("named", "variadic"):
                found = [d.name]
            elif d.kind == "symbolic":
                found = [
                    n for n in re.findall(r"[A-Za-z_]\w*", d.name) if n not in _SYMBOLIC_BUILTINS
                ]
            else:
                found = []
            names += [n for n in found if n not in names]
        return tuple(names)


@dataclass
class Bindings:
    """Sizes bound to named dims so far (single dims and ``*variadic`` runs)."""

    single: dict[str, int] = field(default_factory=dict)
    variadic: dict[str, Shape] = field(default_factory=dict)

    def copy(self) -> Bindings:
        return Bindings(dict(self.single), dict(self.variadic))

    def describe(self) -> str:
        """``h=16, *batch=[2, 3]``, or ``(none)``."""
        parts = [f"{k}={v}" for k, v in self.single.items()]
        parts += [f"*{k}={fmt(v)}" for k, v in self.variadic.items()]
        return ", ".join(parts) if parts else "(none)"


def _parse_token(token: str) -> Dim:
    if token == "...":
        return Dim("anon_variadic", token)
    body = token
    broadcastable = variadic = anonymous = False
    while body:
        if body[0] == "#":
            broadcastable, body = True, body[1:]
        elif body[0] == "*":
            variadic, body = True, body[1:]
        elif body[0] == "_":
            anonymous, body = True, body[1:]
        elif body[0] == "?":  # tree-path dims: no meaning outside jaxtyping pytrees
            body = body[1:]
        elif body.count("=") == 1:
            body = body.split("=")[1]
        else:
            break
    if variadic:
        if anonymous:
            return Dim("anon_variadic", token)
        return Dim("variadic", token, name=body, broadcastable=broadcastable)
    if anonymous:
        return Dim("anon", token)
    if body.isidentifier():
        return Dim("named", token, name=body, broadcastable=broadcastable)
    if body.isdigit():
        return Dim("fixed", token, size=int(body), broadcastable=broadcastable)
    return Dim("symbolic", token, name=body, broadcastable=broadcastable)


def is_tensor_annotation(annotation: Any) -> bool:
    """True for ``Tensor`` itself and for jaxtyping annotations over Tensor."""
    if annotation is Tensor:
        return True
    return (
        isinstance(annotation, type)
        and issubclass(annotation, jaxtyping.AbstractArray)
        and isinstance(annotation.array_type, type)
        and issubclass(annotation.array_type, Tensor)
    )


def parse_annotation(annotation: Any) -> TensorSpec:
    """The :class:`TensorSpec` of ``Tensor`` or ``Float[Tensor, "..."]`` (TypeError otherwise)."""
    if annotation is Tensor:
        return TensorSpec(annotation, None, None)
    if not is_tensor_annotation(annotation):
        raise TypeError(
            f"expected a tensor annotation such as Float[Tensor, 'h 2'] (or Tensor), got {annotation!r}"
        )
    dims = tuple(_parse_token(t) for t in annotation.dim_str.split())
    raw = annotation.dtypes
    dtypes = tuple(str(d) for d in raw) if isinstance(raw, tuple | list) else None
    return TensorSpec(annotation, dims, dtypes)


# --- matching ------------------------------------------------------------------------


def _eval_symbolic(dim: Dim, bindings: Bindings) -> int | None:
    """The size of a symbolic dim, or None while a name in it is still unbound."""
    scope = dict(_SYMBOLIC_BUILTINS) | bindings.single
    try:
        value = eval(dim.name, {"__builtins__": {}}, scope)  # the user's own annotation text
    except NameError:
        return None
    return int(value)


def _match_single(dim: Dim, size: int, axis: int, b: Bindings, symbolic: bool) -> str | None:
    if dim.kind == "anon" or (dim.broadcastable and size == 1):
        return None
    if dim.kind == "fixed" and size != dim.size:
        return f"dimension {axis} is {size} but the spec says {dim.size}"
    if dim.kind == "symbolic" and symbolic:
        expected = _eval_symbolic(dim, b)
        if expected is None:
            return f"dimension {axis} ('{dim.name}') uses a dim that is not bound"
        if expected != size:
            return f"dimension {axis} is {size} but '{dim.name}' = {expected}"
    if dim.kind == "named":
        bound = b.single.setdefault(dim.name, size)
        if bound != size:
            return f"dimension {axis} ('{dim.name}') is {size} but '{dim.name}' is already bound to {bound}"
    return None


def _match_run(dim: Dim, run: Shape, start: int, b: Bindings) -> str | None:
    if dim.kind == "anon_variadic":
        return None
    bound = b.variadic.setdefault(dim.name, run)
    if (
        dim.broadcastable
        and len(bound) == len(run)
        and all(x == y or 1 in (x, y) for x, y in zip(bound, run, strict=True))
    ):
        return None
    if bound != run:
        return (
            f"dimensions {start}..{start + len(run) - 1} ('*{dim.name}') are {fmt(run)} "
            f"but '*{dim.name}' is already bound to {fmt(bound)}"
        )
    return None


def _dtype_reason(spec: TensorSpec, dtype: DType) -> str | None:
    if spec.dtypes is None or dtype.name in spec.dtypes:
        return None
    allowed = [d.name for d in ALL_DTYPES if d.name in spec.dtypes]
    return f"dtype is {dtype.name} but the spec allows {', '.join(allowed) or 'none of ours'}"


def match(spec: TensorSpec, value: Any, bindings: Bindings, symbolic: bool = True) -> str | None:
    """Check ``value`` against ``spec``, binding named dims in ``bindings``.

    Returns None on success, else a short reason (and leaves ``bindings`` untouched).
    ``symbolic=False`` skips symbolic dims (for a first pass before all names are bound).
    """
    if not isinstance(value, Tensor):
        return f"expected a Tensor, got {type(value).__name__}"
    reason = _dtype_reason(spec, value.dtype)
    if reason is not None or spec.dims is None:
        return reason
    shape = value.shape
    trial = bindings.copy()
    dims = spec.dims
    v = spec.variadic_index
    if v is None:
        if len(shape) != len(dims):
            return f"rank is {len(shape)} but the spec has {len(dims)} dims"
        pairs = list(zip(dims, range(len(shape)), strict=True))
    else:
        n_after = len(dims) - v - 1
        if len(shape) < len(dims) - 1:
            return f"rank is {len(shape)} but the spec needs at least {len(dims) - 1} dims"
        stop = len(shape) - n_after
        reason = _match_run(dims[v], shape[v:stop], v, trial)
        if reason is not None:
            return reason
        pairs = list(zip(dims[:v], range(v), strict=True))
        pairs += list(zip(dims[v + 1 :], range(stop, len(shape)), strict=True))
    for dim, axis in pairs:
        reason = _match_single(dim, shape[axis], axis, trial, symbolic)
        if reason is not None:
            return reason
    bindings.single.update(trial.single)
    bindings.variadic.update(trial.variadic)
    return None


def describe_value(value: Any) -> str:
    """``float32 tensor of shape [3, 4]`` (or the Python type of a non-tensor)."""
    if isinstance(value, Tensor):
        return f"{value.dtype.name} tensor of shape {fmt(value.shape)}"
    return f"a {type(value).__name__}"


# --- building shapes from keyword dims ------------------------------------------------------


def check_dim_values(dims: Mapping[str, Any]) -> dict[str, int | Shape]:
    """Validate user-given dim sizes: ints >= 0, or tuples of them for ``*variadic`` dims."""
    clean: dict[str, int | Shape] = {}
    for name, value in dims.items():
        if isinstance(value, bool):
            raise TypeError(f"dim '{name}' must be an int, got {value!r}")
        if isinstance(value, int):
            if value < 0:
                raise ValueError(f"dim '{name}' must be >= 0, got {value}")
            clean[name] = value
        elif isinstance(value, Sequence) and all(
            isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
        ):
            clean[name] = tuple(value)
        else:
            raise TypeError(f"dim '{name}' must be an int (or a tuple of ints), got {value!r}")
    return clean


def build_shape(spec: TensorSpec, dims: Mapping[str, int | Shape], where: str) -> Shape:
    """The concrete shape of ``spec`` with named dims taken from ``dims``.

    Raises TypeError for an annotation without a shape or with anonymous dims,
    KeyError-like ValueError naming a missing dim.
    """
    if spec.dims is None:
        raise TypeError(f"{where}: a bare Tensor annotation has no shape to build from")
    shape: list[int] = []
    singles = {k: v for k, v in dims.items() if isinstance(v, int)}
    for dim in spec.dims:
        if dim.kind == "fixed":
            shape.append(dim.size)
        elif dim.kind in ("anon", "anon_variadic"):
            raise TypeError(
                f"{where}: cannot build a shape for the anonymous dim '{dim.text}' of "
                f"{spec.describe()}; name it"
            )
        elif dim.kind == "symbolic":
            value = _eval_symbolic(dim, Bindings(dict(singles)))
            if value is None:
                raise ValueError(f"{where}: '{dim.name}' in {spec.describe()} uses an unbound dim")
            shape.append(value)
        else:
            shape.extend(_lookup_dim(dim, dims, spec, where))
    return tuple(shape)


def _lookup_dim(dim: Dim, dims: Mapping[str, int | Shape], spec: TensorSpec, where: str) -> Shape:
    if dim.name not in dims:
        raise ValueError(
            f"{where}: missing dim '{dim.name}' needed by {spec.describe()}; "
            f"pass it as a keyword, e.g. {dim.name}=16"
        )
    value = dims[dim.name]
    if dim.kind == "variadic":
        return (value,) if isinstance(value, int) else value
    if not isinstance(value, int):
        raise TypeError(f"{where}: dim '{dim.name}' is a single dim; got {value!r}")
    return (value,)


def pick_dtype(spec: TensorSpec, requested: DType, where: str) -> DType:
    """``requested`` if the annotation allows it, else the first of our dtypes it allows."""
    if spec.dtypes is None or requested.name in spec.dtypes:
        return requested
    for candidate in ALL_DTYPES:
        if candidate.name in spec.dtypes:
            return as_dtype(candidate)
    raise TypeError(f"{where}: {spec.describe()} allows none of shapegrad's dtypes")


# --- parameter roles (shared by ParamList.init and sg.nn.Module.init) ----------------------

Role = Literal["weight", "bias", "gain", "state"]
_GAIN_NAMES = ("gain", "gamma", "scale", "g")


def infer_role(name: str, shape: Shape) -> Role:
    """The default role of a parameter called ``name`` of ``shape``.

    Rank >= 2: a weight. Rank 0/1: a norm gain when the name says so (``gain``,
    ``gamma``, ``scale``, ``g``, or ending in ``_gain``, ``_g``...), else a bias.
    """
    if len(shape) >= 2:
        return "weight"
    last = name.rsplit(".", 1)[-1].lower()
    if last in _GAIN_NAMES or last.endswith(tuple("_" + g for g in _GAIN_NAMES)):
        return "gain"
    return "bias"
