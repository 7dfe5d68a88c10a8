"""A small algebra of sizes: sums of products of named dims with rational coefficients.

Enough for what model code does with sizes: ``b * t``, ``c // n_head`` (a division
the code asserts is exact, so ``(c // 4) * 4`` is ``c``), ``4 * d``, ``t - 1``.
A size is an ``int``, a :class:`Sym`, an :class:`Expr` (the normal form, see
:func:`normal`) or None (unknown); ``differ`` answers "certainly different?".

Rigid names (a signature's dims) stand for *every* size, like type variables,
so ``b * t`` and ``b`` differ; opaque ints (``cfg.n_embd``, scope ``~...``) are
one unknown size, so ``4 * cfg.n_embd`` and ``768`` never differ.

Example:
    >>> b, t = Sym("b", "f"), Sym("t", "f")
    >>> show_item(mul(b, t)), show_item(sub(t, 1)), show_item(floordiv(mul(4, b), 4))
    ('b * t', 't - 1', 'b')
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from fractions import Fraction
from functools import lru_cache

from .spec import Atom, Expr, Item, Sym, Term, is_opaque, show_item, sources

__all__ = [
    "add", "differ", "floordiv", "mul", "neg", "normal", "parse", "product", "show_item", "sub",
    "substitute",
]  # fmt: skip

Poly = dict[tuple[Atom, ...], Fraction]


def _atom_key(atom: Atom) -> tuple[str, str, int]:
    return (atom[0].name, atom[0].scope, atom[1])


def _poly(item: Item) -> Poly | None:
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, int):
        return {(): Fraction(item)} if item else {}
    if isinstance(item, Sym):
        return {((item, 1),): Fraction(1)}
    if isinstance(item, Expr):
        return dict(item.terms)
    return None  # a variadic run is not one size


def normal(poly: Poly) -> Item:
    """The canonical item of a polynomial: an int, a Sym, or an Expr."""
    terms = [(m, c) for m, c in poly.items() if c]
    if not terms:
        return 0
    if len(terms) == 1:
        mono, coef = terms[0]
        if not mono and coef.denominator == 1:
            return int(coef)
        if coef == 1 and len(mono) == 1 and mono[0][1] == 1:
            return mono[0][0]
    ordered: list[Term] = sorted(
        terms, key=lambda t: (-sum(abs(p) for _, p in t[0]), tuple(_atom_key(a) for a in t[0]))
    )
    return Expr(tuple(ordered))


def _times(a: tuple[Atom, ...], b: tuple[Atom, ...]) -> tuple[Atom, ...]:
    powers: dict[Sym, int] = {}
    for sym, p in (*a, *b):
        powers[sym] = powers.get(sym, 0) + p
    return tuple(sorted(((s, p) for s, p in powers.items() if p), key=_atom_key))


@lru_cache(maxsize=8192)
def add(a: Item, b: Item) -> Item:
    pa, pb = _poly(a), _poly(b)
    if pa is None or pb is None:
        return None
    out = dict(pa)
    for mono, coef in pb.items():
        out[mono] = out.get(mono, Fraction(0)) + coef
    return normal(out)


@lru_cache(maxsize=8192)
def neg(a: Item) -> Item:
    pa = _poly(a)
    return None if pa is None else normal({m: -c for m, c in pa.items()})


def sub(a: Item, b: Item) -> Item:
    return add(a, neg(b))


@lru_cache(maxsize=8192)
def mul(a: Item, b: Item) -> Item:
    pa, pb = _poly(a), _poly(b)
    if pa is None or pb is None:
        return None
    out: Poly = {}
    for ma, ca in pa.items():
        for mb, cb in pb.items():
            mono = _times(ma, mb)
            out[mono] = out.get(mono, Fraction(0)) + ca * cb
    return normal(out)


@lru_cache(maxsize=8192)
def floordiv(a: Item, b: Item) -> Item:
    """``a // b`` where ``b`` is one term (``4``, ``n_head``): exact when both are ints,
    else taken as exact (model code divides sizes it knows to be multiples)."""
    if isinstance(a, int) and isinstance(b, int) and not isinstance(b, bool):
        return a // b if b else None
    pa, pb = _poly(a), _poly(b)
    if pa is None or pb is None or len(pb) != 1:
        return None
    ((mono, coef),) = pb.items()
    if not coef:
        return None
    inverse = tuple((s, -p) for s, p in mono)
    return normal({_times(m, inverse): c / coef for m, c in pa.items()})


def product(items: Iterable[Item]) -> Item:
    """The element count of dims (None if any is unknown)."""
    out: Item = 1
    for item in items:
        out = mul(out, item)
        if out is None:
            return None
    return out


@lru_cache(maxsize=8192)
def differ(a: Item, b: Item) -> bool:
    """True when ``a`` and ``b`` are certainly different sizes.

    Their difference must be nonzero and free of opaque ints; rigid names count
    as arbitrary sizes (``b`` differs from ``784`` and from ``t``) when one source
    declares them all: names a function's signature and a parameter's class (a
    Module's fields) declare apart may be one size (``i`` and ``d_in``), and a name
    only a class declares is not known to differ from a literal.
    """
    if isinstance(a, int) and isinstance(b, int):
        return a != b
    if a is None or b is None or a == b:
        return False
    diff = _poly(sub(a, b))
    if diff is None or not diff:
        return False
    syms = {sym for mono in diff for sym, _ in mono}
    if any(is_opaque(sym) for sym in syms):
        return False
    if not syms:
        return True
    common = frozenset.intersection(*(sources(sym) for sym in syms))
    if not common:
        return False
    if () in diff and not any(tag == "s" for _, tag in common):
        return False  # a Module's `d_in` against a literal of the function: may be that size
    return _unrelated(a, b, diff, syms)


def _unrelated(a: Item, b: Item, diff: Poly, syms: set[Sym]) -> bool:
    """Whether two sizes that differ as polynomials differ for every size of their names.

    Distinct names are distinct dims (``i`` vs ``o``, ``i`` vs ``3 * h``), and a product
    is not one of its factors (``b * t`` vs ``b``, ``4 * d`` vs ``d``); but a size the
    code divided equated with other names (``z2 // 2`` vs ``z``), or a sum of several
    names (``e - d // 2`` vs ``d // 2``), is a relation the code may rely on (``z2`` is
    ``2 * z``): not a proven contradiction.
    """
    pa, pb = _poly(a), _poly(b)
    if pa is None or pb is None or len(pa) != 1 or len(pb) != 1:
        return len(syms) <= 1
    ((ma, ca),) = pa.items()
    ((mb, cb),) = pb.items()
    ratio = _times(ma, tuple((s, -p) for s, p in mb))
    if not ratio:
        return ca != cb
    powers = [p for _, p in ratio]
    if all(p > 0 for p in powers) or all(p < 0 for p in powers):
        return True
    if _flattened_pair((ma, ca), (mb, cb)):
        return False
    divided = any(c.denominator != 1 or any(p < 0 for _, p in m) for m, c in ((ma, ca), (mb, cb)))
    return not divided  # `i` vs `3 * h` differ; `z` vs `z2 // 2` is a relation the code made


def _flattened_pair(a: tuple[tuple[Atom, ...], Fraction], b: tuple[tuple[Atom, ...], Fraction]) -> bool:
    """One side a lone name (``f``), the other a product of other names (``c * h * w``):
    the name may be the flattened size (a weight ``[f, k]`` applied to ``x.flatten(1)``,
    which jaxtyping accepts whenever the sizes agree), so it is not a proven mismatch."""
    for (lone, lone_coef), (prod, _) in ((a, b), (b, a)):
        lone_name = lone_coef == 1 and len(lone) == 1 and lone[0][1] == 1
        if lone_name and sum(p for _, p in prod if p > 0) >= 2:
            return True
    return False


def substitute(item: Item, value: Callable[[Sym], Item]) -> Item:
    """``item`` with each named dim replaced by ``value(name)`` (None if any is unknown)."""
    if not isinstance(item, Sym | Expr):
        return item
    if isinstance(item, Sym):
        return value(item)
    total: Item = 0
    for atoms, coef in item.terms:
        term: Item = normal({(): coef})
        for sym, power in atoms:
            v = value(sym)
            for _ in range(abs(power)):
                term = mul(term, v) if power > 0 else floordiv(term, v)
        total = add(total, term)
    return total


_TOKEN = re.compile(r"\s*(\d+|[A-Za-z]\w*|//|[-+*()])")


def parse(text: str, scope: str) -> Item:
    """A jaxtyping size expression such as ``3*c``, ``h+1``, ``c//4``, ``2*(t-1)``; None if not one."""
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None:
            return None
        tokens.append(match.group(1))
        pos = match.end()
    try:
        result, rest = _sum(tokens, scope)
    except (IndexError, ValueError):
        return None
    return None if rest else result


def _sum(tokens: list[str], scope: str) -> tuple[Item, list[str]]:
    left, tokens = _product_of(tokens, scope)
    while tokens and tokens[0] in "+-":
        op, (right, tokens) = tokens[0], _product_of(tokens[1:], scope)
        left = add(left, right) if op == "+" else sub(left, right)
    return left, tokens


def _product_of(tokens: list[str], scope: str) -> tuple[Item, list[str]]:
    left, tokens = _factor(tokens, scope)
    while tokens and tokens[0] in ("*", "//"):
        op, (right, tokens) = tokens[0], _factor(tokens[1:], scope)
        left = mul(left, right) if op == "*" else floordiv(left, right)
    return left, tokens


def _factor(tokens: list[str], scope: str) -> tuple[Item, list[str]]:
    head = tokens[0]
    if head == "(":
        inner, rest = _sum(tokens[1:], scope)
        if not rest or rest[0] != ")":
            raise ValueError("unbalanced parentheses")
        return inner, rest[1:]
    if head.isdigit():
        return int(head), tokens[1:]
    if head.isidentifier():
        return Sym(head, scope), tokens[1:]
    raise ValueError(head)
