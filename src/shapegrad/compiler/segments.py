"""Index-set splitting: run a loop as segments on which its range tests are constant.

Pads and the col2im sums of a convolution's input gradient test ``lo <= v + c < hi``
per element. A renderer can instead run ``v`` over the segments between the tests'
break points, with each test replaced by its (constant) value on the segment: the body
then has no per-element branches and no conditional loads, so it vectorizes. Values are
unchanged: a select with a constant condition is exactly the branch it picks.
"""

from __future__ import annotations

import itertools

from shapegrad.compiler import loops as L

# More segments than this are not worth the code size.
MAX_SEGMENTS = 6


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


def specialize(body: tuple[L.Stmt, ...], var: L.Var, lo: int, hi: int) -> tuple[L.Stmt, ...]:
    """``body`` with every range test on ``var`` folded for ``lo <= var < hi``."""
    return L.map_body(body, lambda e: _fold(e, var, lo, hi))


def _truth(e: L.Expr) -> bool | None:
    return bool(e.value) if isinstance(e, L.Const) and e.dtype.name == "bool" else None


def _fold(e: L.Expr, var: L.Var, lo: int, hi: int) -> L.Expr:
    """One bottom-up folding step (children are already folded)."""
    if isinstance(e, L.InRange) and e.index.terms == ((var, 1),):
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
