"""Static shapes: dims, jaxtyping spec parsing, and the compact text form stored in mypy types.

A static shape is a tuple of items. An item is a literal ``int``, a named dim
(:class:`Sym`), ``None`` (a single dim whose size is unknown) or a variadic
segment (:class:`Var`, from ``*batch`` or ``...``) of unknown length.

Named dims carry the *scope* where they were written (the function whose
signature or body holds the annotation, ``""`` at module level) so that the
``b`` of one function never gets confused with the ``b`` of another.

Example:
    >>> parse_spec("b 784", "float", "m.f").dims
    (Sym(name='b', scope='m.f'), 784)
    >>> show(parse_spec("*batch c", None, "m.f").dims)
    '[*batch, c]'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Sym:
    """A named dim such as ``b``, bound per call of the function that declares it."""

    name: str
    scope: str


@dataclass(frozen=True)
class Var:
    """A variadic run of dims: ``*name`` (named) or ``...`` (``name`` is None)."""

    name: str | None
    scope: str


Dim = int | Sym | None
Item = int | Sym | Var | None


@dataclass(frozen=True)
class TShape:
    """A tensor's static shape and dtype kind (``"float"``, ``"int"``, ``"bool"`` or None)."""

    dims: tuple[Item, ...]
    dtype: str | None = None

    @property
    def fixed(self) -> bool:
        """True when the rank is known (no variadic segment)."""
        return not any(isinstance(d, Var) for d in self.dims)

    def with_dims(self, dims: Sequence[Item]) -> TShape:
        return TShape(tuple(dims), self.dtype)


_DTYPE_OF_ANNOTATION = {
    "Float": "float",
    "Float16": "float",
    "Float32": "float",
    "Float64": "float",
    "BFloat16": "float",
    "Inexact": "float",
    "Int": "int",
    "Int8": "int",
    "Int16": "int",
    "Int32": "int",
    "Int64": "int",
    "UInt": "int",
    "UInt8": "int",
    "UInt16": "int",
    "UInt32": "int",
    "UInt64": "int",
    "Integer": "int",
    "Bool": "bool",
}


def dtype_of_annotation(name: str) -> str | None:
    """``"Float"`` or ``"sg.Float32"`` -> ``"float"``; ``Shaped``/``Num``/unknown -> None."""
    return _DTYPE_OF_ANNOTATION.get(name.rsplit(".", 1)[-1])


def _parse_token(token: str, scope: str) -> Item:
    """One whitespace-separated piece of a jaxtyping spec."""
    if token == "...":
        return Var(None, scope)
    if token.startswith("*"):
        rest = token[1:]
        named = rest.isidentifier() and not rest.startswith("_")
        return Var(rest if named else None, scope)
    if token.lstrip("-").isdigit():
        return int(token)
    if token.isidentifier() and not token.startswith("_"):
        return Sym(token, scope)
    # `_`, `_name` (unchecked), `#name` (broadcastable), `?b`, `b+1`, `name=...`: unknown size.
    return None


@lru_cache(maxsize=4096)
def parse_spec(spec: str, dtype: str | None, scope: str) -> TShape | None:
    """The static shape of a jaxtyping spec string, or None when it cannot be read.

    Example:
        >>> parse_spec("", "float", "m.f")
        TShape(dims=(), dtype='float')
    """
    items = tuple(_parse_token(tok, scope) for tok in spec.split())
    if sum(isinstance(i, Var) for i in items) > 1:
        return None  # jaxtyping allows one variadic per spec; anything else is not ours to judge
    return TShape(items, dtype)


# --- compact text form (what mypy stores in its types and caches) -------------------------


def _encode_item(item: Item) -> str:
    if item is None:
        return "?"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, Sym):
        return f"{item.name}@{item.scope}"
    return "..." if item.name is None else f"*{item.name}@{item.scope}"


def _decode_item(token: str) -> Item:
    if token == "?":
        return None
    if token == "...":
        return Var(None, "")
    if token.startswith("*"):
        name, _, scope = token[1:].partition("@")
        return Var(name, scope)
    if "@" in token:
        name, _, scope = token.partition("@")
        return Sym(name, scope)
    return int(token)


def encode(shape: TShape) -> str:
    """``TShape`` -> ``"float|b@m.f 784"`` (see :func:`decode`)."""
    return f"{shape.dtype or '-'}|" + " ".join(_encode_item(i) for i in shape.dims)


@lru_cache(maxsize=8192)
def decode(text: str) -> TShape | None:
    """Inverse of :func:`encode`; None for text that is not an encoded shape."""
    dtype, sep, body = text.partition("|")
    if not sep:
        return None
    try:
        items = tuple(_decode_item(tok) for tok in body.split())
    except ValueError:
        return None
    return TShape(items, None if dtype == "-" else dtype)


# --- for people -------------------------------------------------------------------------------


def show_item(item: Item) -> str:
    """A dim as a person reads it: ``784``, ``b``, ``?``, ``*batch``, ``...``."""
    if item is None:
        return "?"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, Sym):
        return item.name
    return "..." if item.name is None else f"*{item.name}"


def show(dims: Sequence[Item]) -> str:
    """``[b, 784]``; ``[]`` for a scalar."""
    return "[" + ", ".join(show_item(d) for d in dims) + "]"


# --- which names are rigid where ---------------------------------------------------------------


def names_in(shape: TShape) -> set[Sym | Var]:
    """The named dims and named variadics of ``shape``."""
    return {d for d in shape.dims if isinstance(d, Sym) or (isinstance(d, Var) and d.name)}


Rigid = dict[tuple[str, str, bool], Sym | Var]  # (name, scope, variadic) -> canonical name


def add_rigid(rigid: Rigid, owner: str, names: frozenset[Sym | Var]) -> Rigid:
    """``rigid`` plus the signature names of one more (inner) function ``owner``.

    Within one signature a name means one dim whether it was written there or came
    from a module-level alias (scope ``""``), so both spellings map to one
    canonical name owned by the function; an inner function's names shadow outer ones.
    """
    out = dict(rigid)
    scopes = {n.scope for n in names} | {""}
    for n in names:
        if n.name is None:
            continue
        variadic = isinstance(n, Var)
        canonical: Sym | Var = Var(n.name, owner) if variadic else Sym(n.name, owner)
        for scope in (*scopes, owner):
            out[(n.name, scope, variadic)] = canonical
    return out


def restrict(shape: TShape, rigid: Rigid) -> TShape:
    """Names in their canonical rigid form; names not rigid here become unknown.

    Names are rigid inside the function whose signature declares them (like type
    variables); a name seen only in a body annotation, or one that leaked from
    another function, says nothing about sizes here, so it must never cause an error.
    """
    if not any(isinstance(d, Sym | Var) for d in shape.dims):
        return shape
    out: list[Item] = []
    for d in shape.dims:
        if isinstance(d, Sym):
            canonical = rigid.get((d.name, d.scope, False))
            out.append(canonical if isinstance(canonical, Sym) else None)
        elif isinstance(d, Var) and d.name is not None:
            out.append(rigid.get((d.name, d.scope, True), Var(None, "")))
        else:
            out.append(d)
    return shape.with_dims(out)
