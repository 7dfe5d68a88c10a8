"""Integer index expressions of the loop IR: affine sums over loop variables.

An :class:`Affine` is ``c0 + c1*v1 + ...`` over *atoms*: loop variables
(:class:`Var`), and ``floordiv``/``mod`` of an affine (:class:`DivMod`; only
reshapes of non-contiguous views need those, and :func:`floordiv`/:func:`mod`
remove them whenever a variable's range makes them redundant). Re-exported by
``compiler/loops.py``, where the rest of the loop IR lives.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

# ---------------------------------------------------------------------------
# Integer index expressions
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Var:
    """A loop variable ranging over ``[0, extent)``."""

    name: str
    extent: int

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class DivMod:
    """``inner // divisor`` (``is_mod=False``) or ``inner % divisor`` (``is_mod=True``)."""

    inner: Affine
    divisor: int
    is_mod: bool

    def __str__(self) -> str:
        return f"(({self.inner}) {'%' if self.is_mod else '/'} {self.divisor})"


Atom = Var | DivMod


@dataclass(frozen=True)
class Affine:
    """``const + sum(coef * atom)``; terms are kept sorted and free of zero coefficients."""

    terms: tuple[tuple[Atom, int], ...] = ()
    const: int = 0

    @staticmethod
    def of(atom: Atom, coef: int = 1) -> Affine:
        return Affine(((atom, coef),), 0) if coef else Affine()

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, int):
            return Affine(self.terms, self.const + other)
        coefs: dict[Atom, int] = dict(self.terms)
        for atom, coef in other.terms:
            coefs[atom] = coefs.get(atom, 0) + coef
        return _make(coefs, self.const + other.const)

    def __mul__(self, k: int) -> Affine:
        if k == 0:
            return Affine()
        return Affine(tuple((a, c * k) for a, c in self.terms), self.const * k)

    def bounds(self) -> tuple[int, int]:
        """Inclusive ``(min, max)`` over all loop-variable values."""
        lo = hi = self.const
        for atom, coef in self.terms:
            a_lo, a_hi = _atom_bounds(atom)
            lo += min(coef * a_lo, coef * a_hi)
            hi += max(coef * a_lo, coef * a_hi)
        return lo, hi

    def coef(self, var: Var) -> int:
        """Coefficient of ``var`` as a direct term (0 when absent or only inside div/mod)."""
        return dict(self.terms).get(var, 0)

    def atoms(self) -> Iterator[Atom]:
        return (a for a, _ in self.terms)

    def __str__(self) -> str:
        parts = [str(a) if c == 1 else f"{c}*{a}" for a, c in self.terms]
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts)


def _key(atom: Atom) -> str:
    return str(atom)


def _make(coefs: dict[Atom, int], const: int) -> Affine:
    terms = tuple(sorted(((a, c) for a, c in coefs.items() if c), key=lambda t: _key(t[0])))
    return Affine(terms, const)


def _atom_bounds(atom: Atom) -> tuple[int, int]:
    if isinstance(atom, Var):
        return 0, max(atom.extent - 1, 0)
    lo, hi = atom.inner.bounds()
    if atom.is_mod:
        return (0, atom.divisor - 1) if lo < 0 or hi >= atom.divisor else (lo, hi)
    return lo // atom.divisor, hi // atom.divisor


def var(v: Var) -> Affine:
    """The affine expression ``v``."""
    return Affine.of(v)


def const(c: int) -> Affine:
    """The constant affine expression ``c``."""
    return Affine((), c)


def floordiv(a: Affine, d: int) -> Affine:
    """``a // d`` simplified: terms divisible by ``d`` come out when the rest stays in ``[0, d)``."""
    if d == 1:
        return a
    whole, rest = _split(a, d)
    lo, hi = rest.bounds()
    if lo >= 0 and hi < d:
        return whole
    return whole + Affine.of(DivMod(rest, d, False))


def mod(a: Affine, d: int) -> Affine:
    """``a % d`` simplified the same way as :func:`floordiv`."""
    if d == 1:
        return Affine()
    _, rest = _split(a, d)
    lo, hi = rest.bounds()
    if lo >= 0 and hi < d:
        return rest
    return Affine.of(DivMod(rest, d, True))


def _split(a: Affine, d: int) -> tuple[Affine, Affine]:
    """``a = d*whole + rest`` with every coefficient of ``whole`` integral."""
    whole: dict[Atom, int] = {}
    rest: dict[Atom, int] = {}
    for atom, coef in a.terms:
        if coef % d == 0:
            whole[atom] = coef // d
        else:
            rest[atom] = coef
    c_whole = a.const // d
    return _make(whole, c_whole), _make(rest, a.const - c_whole * d)


def flatten(index: tuple[Affine, ...], shape: tuple[int, ...]) -> Affine:
    """Row-major flat offset of a multi-index."""
    flat = Affine()
    stride = 1
    for ix, size in zip(reversed(index), reversed(shape), strict=True):
        flat = flat + ix * stride
        stride *= size
    return flat


def unflatten(flat: Affine, shape: tuple[int, ...]) -> tuple[Affine, ...]:
    """Row-major multi-index of a flat offset (div/mod simplified away where possible)."""
    if 0 in shape:  # an empty tensor: no element is ever addressed
        return tuple(const(0) for _ in shape)
    out: list[Affine] = []
    stride = 1
    strides = []
    for size in reversed(shape):
        strides.append(stride)
        stride *= size
    for size, st in zip(shape, reversed(strides), strict=True):
        out.append(mod(floordiv(flat, st), size) if size > 1 else const(0))
    return tuple(out)


def substitute(a: Affine, var: Var, value: int | Affine) -> Affine:
    """``a`` with ``var`` replaced by ``value`` (a constant or an affine expression, e.g.
    ``2*outer + inner`` when a loop is split), div/mod atoms re-simplified."""
    value = const(value) if isinstance(value, int) else value
    out = Affine((), a.const)
    for atom, coef in a.terms:
        if atom == var:
            out = out + value * coef
        elif isinstance(atom, DivMod):
            inner = substitute(atom.inner, var, value)
            part = mod(inner, atom.divisor) if atom.is_mod else floordiv(inner, atom.divisor)
            out = out + part * coef
        else:
            out = out + Affine.of(atom, coef)
    return out


def divmods_of(a: Affine) -> Iterator[DivMod]:
    """Every floordiv/mod atom in ``a``, nested ones included."""
    for atom in a.atoms():
        if isinstance(atom, DivMod):
            yield atom
            yield from divmods_of(atom.inner)


def mentions(a: Affine, v: Var) -> bool:
    """Whether ``v`` occurs in ``a``, directly or inside a floordiv/mod."""
    return any(
        atom == v or (isinstance(atom, DivMod) and mentions(atom.inner, v)) for atom in a.atoms()
    )


def resolve(a: Affine, v: Var, lo: int, hi: int) -> Affine:
    """``a`` for ``lo <= v < hi`` only (a segment of ``v``'s loop): every floordiv/mod whose
    quotient is constant there (its operand's bounds, with ``v`` restricted, stay within
    one multiple of the divisor) is replaced by an affine expression; innermost first."""
    out = Affine((), a.const)
    for atom, coef in a.terms:
        if not isinstance(atom, DivMod):
            out = out + Affine.of(atom, coef)
            continue
        inner, d = resolve(atom.inner, v, lo, hi), atom.divisor
        whole, rest = _split(inner, d)
        r_lo, r_hi = _bounds_in(rest, v, lo, hi)
        if r_lo // d == r_hi // d:
            q = r_lo // d
            part = rest + (-d * q) if atom.is_mod else whole + q
        else:
            part = mod(inner, d) if atom.is_mod else floordiv(inner, d)
        out = out + part * coef
    return out


def _bounds_in(a: Affine, v: Var, lo: int, hi: int) -> tuple[int, int]:
    """Inclusive bounds of ``a`` with ``v`` in ``[lo, hi)`` and other variables in full."""
    b_lo = b_hi = a.const
    for atom, coef in a.terms:
        if atom == v:
            x_lo, x_hi = lo, hi - 1
        elif isinstance(atom, DivMod):
            i_lo, i_hi = _bounds_in(atom.inner, v, lo, hi)
            if atom.is_mod:
                in_one = i_lo >= 0 and i_hi < atom.divisor
                x_lo, x_hi = (i_lo, i_hi) if in_one else (0, atom.divisor - 1)
            else:
                x_lo, x_hi = i_lo // atom.divisor, i_hi // atom.divisor
        else:
            x_lo, x_hi = _atom_bounds(atom)
        b_lo += min(coef * x_lo, coef * x_hi)
        b_hi += max(coef * x_lo, coef * x_hi)
    return b_lo, b_hi
