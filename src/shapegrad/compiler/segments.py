"""Index-set splitting: run a loop as segments on which its range tests are constant.

Pads and the col2im sums of a convolution's input gradient test ``lo <= v + c < hi``
per element. A renderer can instead run ``v`` over the segments between the tests'
break points, with each test replaced by its (constant) value on the segment: the body
then has no per-element branches and no conditional loads, so it vectorizes. Values are
unchanged: a select with a constant condition is exactly the branch it picks.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from shapegrad.compiler import loops as L

# More segments than this are not worth the code size.
MAX_SEGMENTS = 6
# Loops this short whose variable appears in range tests together with other variables
# (``3*kh + kw`` of a convolution's patch index) run as one copy per value instead.
MAX_UNROLL = 8


def segments(loop: L.Loop) -> list[tuple[int, int]] | None:
    """``[(lo, hi), ...]`` covering ``[0, extent)`` split at the break points of the range
    tests on ``loop.var`` inside ``loop``, or None when there are none (or too many)."""
    n = loop.var.extent
    points = {0, n}
    for e in L.all_expressions(loop.body):
        for x in L.walk_expr(e):
            if isinstance(x, L.InRange) and x.index.terms == ((loop.var, 1),):
                points |= {min(max(b - x.index.const, 0), n) for b in (x.lo, x.hi)}
    if len(points) <= 2 or len(points) - 1 > MAX_SEGMENTS:
        return None
    ordered = sorted(points)
    return list(itertools.pairwise(ordered))


def unrolls(loop: L.Loop) -> bool:
    """Whether ``loop`` should run as one copy of its body per value (see
    :func:`substitute_var`): it is short and its variable meets another one in a range test,
    which then becomes a test on that other variable alone (split by :func:`segments`)."""
    if loop.var.extent > MAX_UNROLL or loop.var.extent < 2:
        return False
    for e in L.all_expressions(loop.body):
        for x in L.walk_expr(e):
            if isinstance(x, L.InRange) and x.index.coef(loop.var) and len(x.index.terms) > 1:
                return True
    return False


def substitute_var(body: tuple[L.Stmt, ...], var: L.Var, value: int) -> tuple[L.Stmt, ...]:
    """``body`` with ``var`` fixed to ``value`` in every index, and the range tests and
    selects that become constant folded."""

    def index(a: L.Affine) -> L.Affine:
        return L.substitute(a, var, value) if any(t == var for t in _vars(a)) else a

    def expr(e: L.Expr) -> L.Expr:
        if isinstance(e, L.Load | L.IndexValue | L.InRange):
            e = replace(e, index=index(e.index))
        elif isinstance(e, L.Random):
            e = replace(e, counter=index(e.counter))
        return _fold(e, None, 0, 0)

    def stmt(s: L.Stmt) -> L.Stmt:
        if isinstance(s, L.Store | L.IndexLoad):
            return replace(s, index=index(s.index))
        return s

    return L.map_body(body, expr, stmt)


def _vars(a: L.Affine) -> list[L.Var]:
    out: list[L.Var] = []
    for atom in a.atoms():
        out.extend([atom] if isinstance(atom, L.Var) else _vars(atom.inner))
    return out


def specialize(body: tuple[L.Stmt, ...], var: L.Var, lo: int, hi: int) -> tuple[L.Stmt, ...]:
    """``body`` with every range test on ``var`` folded for ``lo <= var < hi``."""
    return L.map_body(body, lambda e: _fold(e, var, lo, hi))


def _truth(e: L.Expr) -> bool | None:
    return bool(e.value) if isinstance(e, L.Const) and e.dtype.name == "bool" else None


def _fold(e: L.Expr, var: L.Var | None, lo: int, hi: int) -> L.Expr:
    """One bottom-up folding step (children are already folded)."""
    if isinstance(e, L.InRange) and not e.index.terms:
        return L.bool_const(e.lo <= e.index.const < e.hi)
    if var is not None and isinstance(e, L.InRange) and e.index.terms == ((var, 1),):
        first, last = lo + e.index.const, hi - 1 + e.index.const
        if e.lo <= first and last < e.hi:
            return L.bool_const(True)
        if last < e.lo or first >= e.hi:
            return L.bool_const(False)
        return e
    if isinstance(e, L.Select):
        known = _truth(e.cond)
        if known is not None:
            return e.a if known else e.b
        return e
    if isinstance(e, L.Binary) and e.op == "and":
        ta, tb = _truth(e.a), _truth(e.b)
        if ta is False or tb is False:
            return L.bool_const(False)
        if ta is True:
            return e.b
        if tb is True:
            return e.a
    return e
