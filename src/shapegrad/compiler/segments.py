"""Index-set splitting: run a loop as segments on which its range tests are constant.

Pads and the col2im sums of a convolution's input gradient test ``lo <= v + c < hi``
per element. The loop can instead run ``v`` over the segments between the tests'
break points, with each test replaced by its (constant) value on the segment: the body
then has no per-element branches and no conditional loads, so it vectorizes. Values are
unchanged: a select with a constant condition is exactly the branch it picks.

Reshapes between tiled and flat layouts (a pooling window's gradient spread back over
its pixels) index with ``v // d`` and ``v % d``; :func:`div_split` runs such a loop as
``v = d*outer + r`` with one body copy per ``r`` (:func:`split_var`), which makes the
indices affine again. Where a quotient ``(v + c) // d`` only changes a few times over
the loop, :func:`segments` also breaks there and :func:`specialize` resolves it on each
segment; :func:`presplit` does this from the innermost loop of a nest outwards, since
resolving an inner quotient (a strided slice's gradient: zeros interleaved through
reshapes and pads) is what exposes plain range tests on the outer variables.
Iterations keep their order, so results are identical.

These are the primitives; the ``split_index_sets`` loop stage (``compiler/splitting.py``)
applies them to a program, so the ``SHAPEGRAD_DEBUG`` dumps show the loops that run.
The limits are fields of the target's :class:`~shapegrad.compiler.target.Tuning`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from shapegrad.compiler import loops as L
from shapegrad.compiler.target import Tuning

_DEFAULT = Tuning()  # the limits when no target's are given (tests, tools)


def segments(loop: L.Loop, tuning: Tuning = _DEFAULT) -> list[tuple[int, int]] | None:
    """``[(lo, hi), ...]`` covering ``[0, extent)`` split at the break points of the range
    tests on ``loop.var`` inside ``loop`` (and, while the count allows, where a
    ``(var + c) // d`` changes value), or None when there are none (or too many)."""
    n = loop.var.extent
    points = {0, n}
    for e in L.all_expressions(loop.body):
        for x in L.walk_expr(e):
            c = _coef(x, loop.var)
            if c and isinstance(x, L.InRange):  # c*v + k crosses lo and hi at these v
                points |= {min(max(-((x.index.const - b) // c), 0), n) for b in (x.lo, x.hi)}
    if len(points) - 1 > tuning.max_segments:
        return None
    for index in L.indices_in(loop.body):
        for dm in L.divmods_of(index):
            if dm.inner.terms != ((loop.var, 1),):
                continue
            c, d = dm.inner.const, dm.divisor
            first = (c // d + 1) * d  # the first multiple of d above c
            more = {m - c for m in range(first, c + n, d)}
            if len(points | more) - 1 <= tuning.max_segments:
                points |= more
    if len(points) <= 2:
        return None
    ordered = sorted(points)
    return list(itertools.pairwise(ordered))


def unrolls(loop: L.Loop, tuning: Tuning = _DEFAULT) -> bool:
    """Whether ``loop`` should run as one copy of its body per value (see
    :func:`substitute_var`): it is short and its variable meets another one in a range test,
    which then becomes a test on that other variable alone (split by :func:`segments`)."""
    if loop.var.extent > tuning.max_unroll or loop.var.extent < 2:
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
    """``body`` for ``lo <= var < hi``: every range test on ``var`` folded, and every
    ``(var + c) // d`` constant there replaced (see :func:`loops.resolve`)."""

    def index(a: L.Affine) -> L.Affine:
        return L.resolve(a, var, lo, hi) if any(True for _ in L.divmods_of(a)) else a

    def expr(e: L.Expr) -> L.Expr:
        if isinstance(e, L.Load | L.IndexValue | L.InRange):
            e = replace(e, index=index(e.index))
        elif isinstance(e, L.Random):
            e = replace(e, counter=index(e.counter))
        return _fold(e, var, lo, hi)

    def stmt(s: L.Stmt) -> L.Stmt:
        if isinstance(s, L.Store | L.IndexLoad):
            return replace(s, index=index(s.index))
        return s

    return L.map_body(body, expr, stmt)


def rebase(
    body: tuple[L.Stmt, ...], var: L.Var, lo: int, hi: int, tuning: Tuning = _DEFAULT
) -> L.Loop | None:
    """The segment ``lo <= var < hi`` of a loop as a loop of its own over a fresh variable
    from 0, when that loop can be run by :func:`div_split` (the segment's start aligned
    with the remaining ``var % d``), else None."""
    fresh = L.Var(f"{var.name}_s{lo}", hi - lo)
    loop = L.Loop(fresh, "parallel", split_var(body, var, fresh, 1, lo))
    return loop if div_split(loop, tuning) is not None else None


def _truth(e: L.Expr) -> bool | None:
    return bool(e.value) if isinstance(e, L.Const) and e.dtype.name == "bool" else None


def _fold(e: L.Expr, var: L.Var | None, lo: int, hi: int) -> L.Expr:
    """One bottom-up folding step (children are already folded)."""
    if isinstance(e, L.InRange) and not e.index.terms:
        return L.bool_const(e.lo <= e.index.const < e.hi)
    if var is not None and isinstance(e, L.InRange) and (c := _coef(e, var)):
        first, last = c * lo + e.index.const, c * (hi - 1) + e.index.const
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


def div_split(loop: L.Loop, tuning: Tuning = _DEFAULT) -> int | None:
    """The factor ``d`` (``2 <= d <= tuning.max_unroll``, dividing the extent) such that writing
    ``loop.var`` as ``d*outer + r`` removes every floordiv/mod of it from the body's
    indices, or None (no such div/mod, no such ``d``, or a statement that is not plain
    loops, stores and reductions)."""
    v = loop.var
    if any(not isinstance(s, L.Loop | L.Store | L.Reduce | L.Local) for s in L.walk(loop.body)):
        return None
    factors = set()
    for index in L.indices_in(loop.body):
        for dm in L.divmods_of(index):
            c = dm.inner.coef(v)
            if c:
                factors.add(dm.divisor // math.gcd(dm.divisor, abs(c)))
            elif L.mentions(dm.inner, v):
                return None  # v only under a nested div/mod: leave it
    if not factors:
        return None
    d = math.lcm(*factors)
    if d < 2 or d > tuning.max_unroll or d >= v.extent or v.extent % d:
        return None
    outer = L.Var(f"{v.name}_{d}", v.extent // d)
    for r in range(d):
        value = L.var(outer) * d + r
        for index in L.indices_in(loop.body):
            if not L.mentions(index, v):
                continue
            split = L.substitute(index, v, value)
            if any(L.mentions(dm.inner, outer) for dm in L.divmods_of(split)):
                return None
    return d


def split_var(
    body: tuple[L.Stmt, ...], var: L.Var, outer: L.Var, d: int, r: int
) -> tuple[L.Stmt, ...]:
    """``body`` with ``var`` replaced by ``d*outer + r`` in every index (see :func:`div_split`)."""
    value = L.var(outer) * d + r

    def index(a: L.Affine) -> L.Affine:
        return L.substitute(a, var, value) if L.mentions(a, var) else a

    def expr(e: L.Expr) -> L.Expr:
        if isinstance(e, L.Load | L.IndexValue | L.InRange):
            e = replace(e, index=index(e.index))
        elif isinstance(e, L.Random):
            e = replace(e, counter=index(e.counter))
        return _fold(e, None, 0, 0)  # r is a constant now: tests on it fold

    def stmt(s: L.Stmt) -> L.Stmt:
        if isinstance(s, L.Store | L.IndexLoad):
            return replace(s, index=index(s.index))
        return s

    return L.map_body(body, expr, stmt)


def _coef(e: L.Expr, var: L.Var) -> int:
    """``c`` when ``e`` is a range test on ``c*var + k`` with ``c > 0``, else 0."""
    if not isinstance(e, L.InRange) or len(e.index.terms) != 1:
        return 0
    ((atom, c),) = e.index.terms
    return c if atom == var and c > 0 else 0


def presplit(loop: L.Loop, tuning: Tuning = _DEFAULT) -> tuple[L.Stmt, ...] | None:
    """Index-set splitting of a nest from the inside out, for nests indexed through
    floordiv/mod (a strided convolution's input gradient): each loop over ``v`` whose
    indices divide ``v`` is cut into :func:`segments`, each a loop of its own over a fresh
    ``v_s<lo>`` from 0, with its div/mod resolved (:func:`specialize`). Resolving an inner
    loop's div/mod exposes plain range tests on the outer variables, so the outer loops
    split in turn. Iterations keep their order. None when nothing splits."""
    out, changed = _presplit(loop, tuning)
    if not changed or _size(out) > tuning.presplit_growth * _size((loop,)):
        return None
    return out


def _size(body: tuple[L.Stmt, ...]) -> int:
    return sum(1 for _ in L.walk(body))


def is_presplit(var: L.Var) -> bool:
    """Whether ``var`` is a segment variable made by :func:`presplit` (split once only)."""
    head, _, tail = var.name.rpartition("_s")
    return bool(head) and tail.isdigit()


def _presplit(s: L.Stmt, tuning: Tuning) -> tuple[tuple[L.Stmt, ...], bool]:
    if not isinstance(s, L.Loop):
        return (s,), False
    body: list[L.Stmt] = []
    changed = False
    for x in s.body:
        parts, c = _presplit(x, tuning)
        body.extend(parts)
        changed |= c
    loop = replace(s, body=tuple(body))
    divides = any(
        L.mentions(dm.inner, s.var) for ix in L.indices_in(loop.body) for dm in L.divmods_of(ix)
    )
    if not divides or div_split(loop, tuning) is not None:
        return (loop,), changed  # nothing to resolve, or the d*outer + r split does it
    segs = segments(loop, tuning)
    if segs is None:
        return (loop,), changed
    out: list[L.Stmt] = []
    for lo, hi in segs:
        fresh = L.Var(f"{s.var.name}_s{lo}", hi - lo)
        seg = split_var(specialize(loop.body, s.var, lo, hi), s.var, fresh, 1, lo)
        out.append(L.Loop(fresh, s.kind, seg))
    return tuple(out), True


def window_rows(loop: L.Loop, tuning: Tuning = _DEFAULT) -> L.Reduce | None:
    """The reduction of ``for v: acc = reduce(...); dst[..v..] = f(acc)`` when it is a small
    window (at most ``tuning.max_unroll`` terms, a pooling window) that a renderer runs
    as a row: ``row[v] = init; for window: for v: row[v] = op(row[v], value)``, then the
    stores. Each output still combines its terms in the same order, and the inner loop
    runs over outputs, so it vectorizes. None when the body is anything else, the row is
    long, or the window reads what the stores write."""
    if len(loop.body) != 2 or not 1 < loop.var.extent <= tuning.window_row_max:
        return None
    if loop.start != 0 or loop.stop is not None:  # a segment: rows run over the whole range
        return None
    red, store = loop.body
    if not isinstance(red, L.Reduce) or not isinstance(store, L.Store) or store.accumulate:
        return None
    if math.prod(v.extent for v in red.vars) > tuning.max_unroll or len(red.vars) == 0:
        return None
    if any(ld.buffer == store.buffer for ld in L.loads_in((L.Store("_", L.const(0), red.value),))):
        return None
    return red
