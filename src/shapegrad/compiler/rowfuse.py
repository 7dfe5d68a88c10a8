"""Row fusion: a run of kernels that each work on the rows of one row space becomes one
loop over the rows, each row's statements run back to back.

A softmax is four kernels as fusion leaves them: the row maximum, ``exp(x - max)``, the
row sum and the division, each a pass over the whole ``[b, h, t, t]`` array. LayerNorm's
forward (centre, mean, variance, normalise, scale) and the backward of both are the same
shape. :func:`fuse_row_kernels` merges such kernels when they are adjacent and share
their outer parallel loops (the *rows*; a reduction kernel's loops are exactly its rows):
the merged kernel loops over the rows once and runs, per row, every kernel's statements
for that row in the original kernel order (each reduction at the rows' level, over a
row of at least ``Tuning.row_fuse_min_row`` terms: not a pooling window). A row (a few hundred bytes) then stays in the
first-level cache from the max to the division instead of crossing memory four times.

The merge is exact (the same statements, each element's operations in the same order)
when every buffer a merged kernel writes is *row-local*: all its accesses in the group
use the same coefficients on the row variables, and the elements one row touches lie
below the next row's (checked from the index bounds). Then row ``p`` of a later kernel
reads only what earlier kernels wrote in row ``p``, which is final by then, and no row
touches another row's elements. Loads of buffers the group does not write may use any
index. Kernels over the rows flattened into one loop (``t41[i]`` over ``b*t``) join too.
"""

from __future__ import annotations

import math

from shapegrad.compiler import loops as L
from shapegrad.compiler.loopfuse import rebind
from shapegrad.compiler.target import Tuning

_DEFAULT = Tuning()


def _chain(kernel: L.Kernel) -> tuple[list[L.Var], tuple[L.Stmt, ...]] | None:
    """(outer parallel loop variables, the body inside them) of a plain loop nest whose
    statements are loops, reductions and plain stores only; None otherwise."""
    if len(kernel.body) != 1 or not isinstance(kernel.body[0], L.Loop):
        return None
    vars_: list[L.Var] = []
    body: tuple[L.Stmt, ...] = kernel.body
    while len(body) == 1 and isinstance(body[0], L.Loop) and body[0].kind == "parallel":
        loop = body[0]
        if loop.start != 0 or loop.stop is not None:
            return None
        vars_.append(loop.var)
        body = loop.body
    for s in L.walk(body):
        if isinstance(s, L.Store) and s.accumulate is None:
            continue
        if isinstance(s, L.Reduce) or (
            isinstance(s, L.Loop) and s.start == 0 and s.stop is None and s.kind == "parallel"
        ):
            continue
        return None
    return vars_, body


def _rows(vars_: list[L.Var], body: tuple[L.Stmt, ...], depth: int) -> tuple[L.Stmt, ...]:
    """The statements of one row: ``body`` inside the loops ``vars_[depth:]``."""
    for v in reversed(vars_[depth:]):
        body = (L.Loop(v, "parallel", body),)
    return body


def _aligned(
    space: list[L.Var], vars_: list[L.Var], body: tuple[L.Stmt, ...]
) -> tuple[L.Stmt, ...] | None:
    """One row of a kernel (loops ``vars_`` around ``body``) over the rows ``space``."""
    extents = [v.extent for v in space]
    if [v.extent for v in vars_[: len(space)]] == extents:
        mapping = {o: L.var(v) for o, v in zip(vars_, space, strict=False)}
        return rebind(_rows(vars_, body, len(space)), mapping)
    if len(vars_) == 1 and vars_[0].extent == math.prod(extents) and len(space) > 1:
        flat = L.flatten(tuple(L.var(v) for v in space), tuple(extents))
        return rebind(body, {vars_[0]: flat})
    return None



def _row_local(space: list[L.Var], body: tuple[L.Stmt, ...]) -> bool:
    """Every buffer ``body`` writes is accessed row-locally (module docstring)."""
    written = {s.buffer for s in L.walk(body) if isinstance(s, L.Store)}
    accesses = [(s.buffer, s.index) for s in L.walk(body) if isinstance(s, L.Store)]
    accesses += [(ld.buffer, ld.index) for ld in L.loads_in(body)]
    rows = [v for v in space if v.extent > 1]
    seen: dict[str, tuple[tuple[int, ...], int, int]] = {}
    for buffer, index in accesses:
        if buffer not in written:
            continue
        if any(not isinstance(a, L.Var) for a in index.atoms()):
            return False
        coefs = tuple(index.coef(v) for v in rows)
        inner = index
        for v, c in zip(rows, coefs, strict=True):
            inner = inner + L.var(v) * (-c)
        lo, hi = inner.bounds()
        if buffer in seen:
            known, k_lo, k_hi = seen[buffer]
            if known != coefs:
                return False
            lo, hi = min(lo, k_lo), max(hi, k_hi)
        seen[buffer] = (coefs, lo, hi)
    for coefs, lo, hi in seen.values():
        cover = hi - lo + 1  # elements one row spans, then the rows below each variable
        for c, v in sorted(zip(coefs, rows, strict=True), key=lambda p: p[0]):
            if c < cover:
                return False
            cover += (v.extent - 1) * c
    return True


def _merge(a: L.Kernel, b: L.Kernel, tuning: Tuning) -> L.Kernel | None:
    max_nodes, min_row = tuning.row_forward_max_nodes, tuning.row_fuse_min_row
    chain_a, chain_b = _chain(a), _chain(b)
    if chain_a is None or chain_b is None:
        return None
    (vars_a, body_a), (vars_b, body_b) = chain_a, chain_b
    space = _space(vars_a, vars_b)
    if space is None:
        return None
    if len(vars_a) == len(vars_b) == len(space) and not _has_reduce(body_a + body_b):
        return None  # same space, elementwise only: fuse_elementwise_kernels' case
    mine = _aligned(space, vars_a, body_a)
    moved = _aligned(space, vars_b, body_b)
    rows = None if mine is None or moved is None else mine + moved
    if rows is None or not _row_reductions(rows, min_row) or not _row_local(space, rows):
        return None
    inlined = a.inlined + [n for n in b.inlined if n not in a.inlined]
    body = _rows(space, _forward_scalars(rows, max_nodes), 0)
    return L.Kernel(a.name, body, a.work + b.work, f"{a.root} + {b.root}", inlined)


def _space(vars_a: list[L.Var], vars_b: list[L.Var]) -> list[L.Var] | None:
    """The rows two kernels share: their common leading loops, or the leading loops of one
    whose extents multiply to the other's single (flattened) loop."""
    for flat, nest in ((vars_a, vars_b), (vars_b, vars_a)):
        if len(flat) == 1 and len(nest) > 1:
            size = 1
            for d, v in enumerate(nest):
                size *= v.extent
                if size == flat[0].extent and d >= 1:
                    return nest[: d + 1]
    depth = min(len(vars_a), len(vars_b))
    return vars_a[:depth] if depth else None


def _forward_scalars(rows: tuple[L.Stmt, ...], max_nodes: int) -> tuple[L.Stmt, ...]:
    """Later reads of a value the row stored once per row (``t[row] = acc`` after a
    reduction, ``t[row] = sqrt(acc / n + eps)``) read the stored expression instead, when
    it reads nothing the group writes: the value stays in a register (the C compiler
    hoists it out of the loops that use it), and those loops vectorize (GCC 12 leaves a
    loop unvectorized when it reloads a scalar the row has just stored)."""
    written = {s.buffer for s in L.walk(rows) if isinstance(s, L.Store)}
    known: dict[tuple[str, L.Affine], L.Expr] = {}

    def expr(e: L.Expr) -> L.Expr:
        if isinstance(e, L.Load):
            found = known.get((e.buffer, e.index))
            # same type only: a float16 store rounds a float32 accumulator
            return found if found is not None and found.dtype == e.dtype else e
        return e

    out: list[L.Stmt] = []
    for s in rows:
        s = L.map_stmt(s, expr)
        for w in L.writes((s,)):  # a rewrite of the buffer ends what was known of it
            known = {k: v for k, v in known.items() if k[0] != w}
        if (
            isinstance(s, L.Store)
            and s.accumulate is None
            and not any(ld.buffer in written for ld in L.loads_in((s,)))
            and sum(1 for _ in L.walk_expr(s.value)) <= max_nodes
        ):
            known[(s.buffer, s.index)] = s.value
        out.append(s)
    return tuple(out)


def _row_reductions(rows: tuple[L.Stmt, ...], min_row: int) -> bool:
    """Every reduction is over a row: at the rows' level (not inside a loop of the row) and
    of at least ``min_row`` terms. A pooling window (a few terms per output) is not, and
    the renderer's row-of-accumulators form for it needs its own nest."""
    for s in rows:
        inside = L.walk(s.body) if isinstance(s, L.Loop) else ()
        if any(isinstance(x, L.Reduce) for x in inside):
            return False
        if isinstance(s, L.Reduce) and math.prod([v.extent for v in s.vars]) < min_row:
            return False
    return True


def _has_reduce(body: tuple[L.Stmt, ...]) -> bool:
    return any(isinstance(s, L.Reduce) for s in L.walk(body))


def fuse_row_kernels(program: L.Program, tuning: Tuning = _DEFAULT) -> L.Program:
    """Merge runs of adjacent kernels over the same rows (module docstring); at most
    ``tuning.row_fuse_max_group`` kernels per merged loop.

    Example:
        >>> fuse_row_kernels(program)   # softmax: max, exp, sum, divide -> one loop
    """
    fused: list[L.Kernel] = []
    group = 0
    for kernel in program.kernels:
        ok = fused and 0 < group < tuning.row_fuse_max_group
        merged = _merge(fused[-1], kernel, tuning) if ok else None
        if merged is not None:
            fused[-1] = merged
            group += 1
        else:
            fused.append(kernel)
            group = 1 if _chain(kernel) is not None else 0
    program.kernels = fused
    return program
