"""Static shapes: dims, jaxtyping spec parsing, and the compact text form stored in mypy types.

A static shape is a tuple of items. An item is a literal ``int``, a named dim
(:class:`Sym`), ``None`` (a single dim whose size is unknown) or a variadic
segment (:class:`Var`, from ``*batch`` or ``...``) of unknown length.

Named dims carry the *scope* where they were written (the function whose
signature or body holds the annotation, ``""`` at module level) so that the
``b`` of one function never gets confused with the ``b`` of another.

Parsing a spec string is :mod:`shapegrad.mypy_plugin.parsing`'s job (it needs the
size algebra of :mod:`sizes`, which builds on this module).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
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


Atom = tuple[Sym, int]  # a named dim and its (possibly negative) power
Term = tuple[tuple[Atom, ...], Fraction]  # sorted atoms, coefficient


@dataclass(frozen=True)
class Expr:
    """A size computed from named dims: a sum of ``coefficient * product of powers``.

    Built by :mod:`shapegrad.mypy_plugin.sizes` in normal form (terms sorted, no
    zero coefficients), so two equal sizes are equal objects: ``b * t``, ``c // 4``,
    ``t - 1``. A :class:`Sym` whose scope starts with ``~`` is *opaque*: an int
    whose value is unknown but fixed (``cfg.n_embd``); it never makes sizes differ.
    """

    terms: tuple[Term, ...]


Dim = int | Sym | Expr | None
Item = int | Sym | Expr | Var | None


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


# --- compact text form (what mypy stores in its types and caches) -------------------------


def _encode_term(term: Term) -> str:
    atoms, coef = term
    return f"{coef}*" + ",".join(f"{s.name}@{s.scope}^{p}" for s, p in atoms)


def _decode_term(text: str) -> Term:
    coef, _, body = text.partition("*")
    atoms: list[Atom] = []
    for piece in filter(None, body.split(",")):
        sym, _, power = piece.rpartition("^")
        name, _, scope = sym.partition("@")
        atoms.append((Sym(name, scope), int(power)))
    return tuple(atoms), Fraction(coef)


def _encode_item(item: Item) -> str:
    if item is None:
        return "?"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, Sym):
        return f"{item.name}@{item.scope}"
    if isinstance(item, Expr):
        return "{" + ";".join(_encode_term(t) for t in item.terms) + "}"
    return "..." if item.name is None else f"*{item.name}@{item.scope}"


def _decode_item(token: str) -> Item:
    if token == "?":
        return None
    if token.startswith("{"):
        return Expr(tuple(_decode_term(t) for t in token[1:-1].split(";") if t))
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
    except (ValueError, ZeroDivisionError):
        return None
    return TShape(items, None if dtype == "-" else dtype)


# --- for people -------------------------------------------------------------------------------


def _show_term(atoms: tuple[Atom, ...], coef: Fraction) -> str:
    num = [s.name if p == 1 else f"{s.name}**{p}" for s, p in atoms if p > 0]
    den = [s.name if p == -1 else f"{s.name}**{-p}" for s, p in atoms if p < 0]
    if coef.numerator != 1 or not num:
        num.insert(0, str(coef.numerator))
    text = " * ".join(num)
    for d in [*den, *([str(coef.denominator)] if coef.denominator != 1 else [])]:
        text = f"{text} // {d}"
    return text


def show_item(item: Item) -> str:
    """A dim as a person reads it: ``784``, ``b``, ``?``, ``*batch``, ``...``, ``b * t``."""
    if item is None:
        return "?"
    if isinstance(item, int):
        return str(item)
    if isinstance(item, Sym):
        return item.name
    if isinstance(item, Expr):
        text = ""
        for atoms, coef in item.terms:
            sign = "-" if coef < 0 else "+"
            body = _show_term(atoms, abs(coef))
            text = (
                f"-{body}"
                if not text and sign == "-"
                else (body if not text else f"{text} {sign} {body}")
            )
        return text
    return "..." if item.name is None else f"*{item.name}"


def show(dims: Sequence[Item]) -> str:
    """``[b, 784]``; ``[]`` for a scalar."""
    return "[" + ", ".join(show_item(d) for d in dims) + "]"


# --- which names are rigid where ---------------------------------------------------------------


def names_in(shape: TShape) -> set[Sym | Var]:
    """The named dims and named variadics of ``shape`` (inside size expressions too)."""
    out: set[Sym | Var] = set()
    for d in shape.dims:
        if isinstance(d, Sym) or (isinstance(d, Var) and d.name):
            out.add(d)
        elif isinstance(d, Expr):
            out.update(sym for atoms, _ in d.terms for sym, _ in atoms if not is_opaque(sym))
    return out


def is_opaque(sym: Sym) -> bool:
    """An int of unknown but fixed value (``cfg.n_embd``), not a signature name."""
    return sym.scope.startswith("~")


def _restrict_sym(sym: Sym, rigid: Rigid) -> Sym | None:
    if is_opaque(sym):
        return sym
    canonical = rigid.get((sym.name, sym.scope, False))
    return canonical if isinstance(canonical, Sym) else None


def _restrict_expr(expr: Expr, rigid: Rigid) -> Expr | None:
    terms: list[Term] = []
    for atoms, coef in expr.terms:
        mapped: list[Atom] = []
        for sym, power in atoms:
            canonical = _restrict_sym(sym, rigid)
            if canonical is None:
                return None
            mapped.append((canonical, power))
        terms.append((tuple(sorted(mapped, key=_atom_key)), coef))
    return Expr(tuple(sorted(terms, key=_term_key)))


def _atom_key(atom: Atom) -> tuple[str, str, int]:
    return (atom[0].name, atom[0].scope, atom[1])


def _term_key(term: Term) -> tuple[int, tuple[tuple[str, str, int], ...]]:
    atoms = term[0]
    return (-sum(abs(p) for _, p in atoms), tuple(_atom_key(a) for a in atoms))


Rigid = dict[tuple[str, str, bool], Sym | Var]  # (name, scope, variadic) -> canonical name


def add_rigid(rigid: Rigid, owner: str, names: Mapping[Sym | Var, frozenset[str]]) -> Rigid:
    """``rigid`` plus the signature names of one more (inner) function ``owner``.

    Within one signature a name means one dim whether it was written there or came
    from a module-level alias (scope ``""``), so both spellings map to one
    canonical name owned by the function. An inner function's name that the enclosing
    function also declares is the same dim (closures such as ``sg.scan`` bodies are
    written in their enclosing function's dims).
    ``names`` maps each name to the sources declaring it (see ``carrier.signature_sources``);
    the canonical name's scope records them (``owner#s+pkg.Linear``) so that
    :func:`sources` can tell whether two names are known to be different dims.
    """
    out = dict(rigid)
    scopes = {n.scope for n in names} | {""}
    tags: dict[str, set[str]] = {}
    for n, found in names.items():
        if n.name is not None and isinstance(n, Sym):
            tags.setdefault(n.name, set()).update(found)
    for n in names:
        if n.name is None:
            continue
        variadic = isinstance(n, Var)
        outer = rigid.get((n.name, "", variadic))
        canonical: Sym | Var = (
            outer  # a closure's `b` is its enclosing function's `b` (a scan body's carry dims)
            if outer is not None
            else Var(n.name, owner)
            if variadic
            else Sym(n.name, f"{owner}#{'+'.join(sorted(tags[n.name])) or 's'}")
        )
        for scope in (*scopes, owner, canonical.scope):
            out[(n.name, scope, variadic)] = canonical
    return out


def sources(sym: Sym) -> frozenset[tuple[str, str]]:
    """The ``(owner, source)`` pairs that declare a rigid name (see :func:`add_rigid`)."""
    owner, sep, tags = sym.scope.partition("#")
    if not sep:
        return frozenset({(sym.scope, "s")})
    return frozenset((owner, tag) for tag in tags.split("+"))


def restrict(shape: TShape, rigid: Rigid) -> TShape:
    """Names in their canonical rigid form; names not rigid here become unknown.

    Names are rigid inside the function whose signature declares them (like type
    variables); a name seen only in a body annotation, or one that leaked from
    another function, says nothing about sizes here, so it must never cause an error.
    """
    if not any(isinstance(d, Sym | Var | Expr) for d in shape.dims):
        return shape
    out: list[Item] = []
    for d in shape.dims:
        if isinstance(d, Sym):
            out.append(_restrict_sym(d, rigid))
        elif isinstance(d, Expr):
            out.append(_restrict_expr(d, rigid))
        elif isinstance(d, Var) and d.name is not None:
            out.append(rigid.get((d.name, d.scope, True), Var(None, "")))
        else:
            out.append(d)
    return shape.with_dims(out)
