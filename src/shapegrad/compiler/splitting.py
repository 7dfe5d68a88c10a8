"""The ``split_index_sets`` loop stage: unrolling, index-set splitting and div-splitting
(``compiler/segments.py``) applied to a program, so the loop IR shows the loops that run.

Every loop is examined as the C renderer used to do at print time, in this order:

1. a short loop whose variable meets another in a range test (:func:`segments.unrolls`)
   becomes one :class:`~shapegrad.compiler.loops.Block` per value;
2. a nest indexed through floordiv/mod is split from the inside out
   (:func:`segments.presplit`);
3. a small pooling window (:func:`segments.window_rows`) is left to the renderer, which
   runs it as a row of accumulators;
4. a loop whose ``v // d``, ``v % d`` vanish under ``v = d*outer + r``
   (:func:`segments.div_split`) becomes a loop over ``outer`` of ``d`` Blocks;
5. otherwise a loop with range tests becomes segments (loops over ``[start, stop)``)
   on which every test is constant (:func:`segments.segments`).

The bodies of the results are examined in turn. Loops a backend runs across threads
stay whole at their own level (their bodies are split): :func:`team_statement` is the
rule of the C renderer's OpenMP team (a large parallel loop is work-shared; a large
reduction over rows is split over the row), shared with ``backends/c/schedule.py``.
Iterations keep their order and every test is replaced by its value on its segment, so
results are identical.
"""

from __future__ import annotations

import math
from dataclasses import replace

from shapegrad.compiler import loops as L
from shapegrad.compiler.segments import (
    div_split,
    is_presplit,
    presplit,
    rebase,
    segments,
    specialize,
    split_var,
    substitute_var,
    unrolls,
    window_rows,
)
from shapegrad.compiler.sorting import row_work
from shapegrad.compiler.target import CTuning, Target, Tuning


def estimate_work(s: L.Stmt) -> int:
    """Scalar operations of a statement, as the schedule counts them to decide whether
    splitting a loop across threads pays: one per element stored, two per element reduced
    (load + combine), ``2mnk`` per product."""
    if isinstance(s, L.Loop):
        return s.trips * max(1, sum(estimate_work(x) for x in s.body))
    if isinstance(s, L.Block):  # one iteration of the loop it came from
        return max(1, sum(estimate_work(x) for x in s.body))
    if isinstance(s, L.Reduce):
        return 2 * math.prod(v.extent for v in s.vars)
    if isinstance(s, L.Contract):
        return 2 * s.m * s.n * s.k * s.batch * s.sum_batch
    if isinstance(s, L.CheckBounds):
        return s.size
    if isinstance(s, L.SortRow):
        return row_work(s.n, s.method)
    return 1 if isinstance(s, L.Store) else 0


def row_of(nest: L.Loop) -> L.Loop | None:
    """The row loop of ``for r1.. (reduction): for j (parallel): stores``, when every store
    in it addresses memory by j (and outer, fixed variables) but never by a reduced one,
    so blocks of j are independent across all r. None otherwise."""
    reduced = []
    s: L.Stmt = nest
    while isinstance(s, L.Loop) and s.kind == "reduction" and len(s.body) == 1:
        reduced.append(s.var)
        s = s.body[0]
    if not (isinstance(s, L.Loop) and s.kind == "parallel" and s.trips > 1 and reduced):
        return None
    stores = [x for x in L.walk(s.body) if isinstance(x, L.Store)]
    if not stores or any(isinstance(x, L.Loop | L.Reduce | L.Contract) for x in L.walk(s.body)):
        return None
    for store in stores:
        if store.index.coef(s.var) == 0 or any(store.index.coef(r) for r in reduced):
            return None
        if any(isinstance(a, L.DivMod) for a in store.index.atoms()):
            return None
    return s


def team_loop(s: L.Stmt, may_split: bool) -> str | None:
    """How a renderer allowed to split ``s`` across threads (``may_split``) does it:
    ``"loop"`` (a parallel loop work-shared), ``"rows"`` (a reduction over rows split over
    the row), or None (``s`` runs on one thread, as far as loops go)."""
    if not may_split or not isinstance(s, L.Loop):
        return None
    if s.kind == "parallel" and s.trips > 1:
        return "loop"
    if s.kind == "reduction" and row_of(s) is not None:
        return "rows"
    return None


def team_statement(s: L.Stmt, tuning: CTuning) -> bool:
    """Whether a top-level statement is large enough for the C renderer to split its loop
    across the team (``CTuning.omp_min_work`` / ``region_min_work`` scalar ops).

    This is the fork-mode rule (``schedule.fork_parallel``), which the region's rule
    (``schedule.shareable``) refines: inside the step's one region a kernel that declares
    a C name (a scalar reduction, a scratch array) or can fail a bounds check runs on one
    thread, so its large loop stays whole here although nothing splits it across
    threads. The stage cannot tell those apart: whether a function gets a region at all
    depends on its other kernels (its translation unit), and a layer body runs its own
    pipeline without knowing it is one (fork mode). The benchmark steps' C is the same
    as when the renderer split loops at print time (``benchmarks/codegen_diff.py``)."""
    return estimate_work(s) >= min(tuning.omp_min_work, tuning.region_min_work)


def split_loop(s: L.Loop, tuning: Tuning, may_split: bool = False) -> tuple[L.Stmt, ...]:
    """``s`` unrolled, presplit, div-split or cut into segments (module docstring), with
    the same done to every loop inside; ``may_split``: the renderer may still split ``s``
    across threads (then ``s`` itself has extent 1 or is left to the renderer)."""
    if team_loop(s, may_split) == "loop":
        return (replace(s, body=split_body(s.body, tuning, False)),)
    if team_loop(s, may_split) == "rows":
        return (s,)  # the row is cut into per-thread blocks; nothing inside to split
    inner = may_split and s.var.extent <= 1  # what the renderer passes to the body
    v = s.var.name
    if unrolls(s, tuning):  # one copy per value: tests on several variables become one-variable
        return tuple(
            L.Block(f"{v} = {value}", split_body(substitute_var(s.body, s.var, value), tuning))
            for value in range(s.var.extent)
        )
    if not is_presplit(s.var) and (parts := presplit(s, tuning)) is not None:
        return split_body(parts, tuning, inner)  # div/mod indexing resolved inside out
    if window_rows(s, tuning) is not None:
        return (s,)  # run as a row of accumulators by the renderer
    d = div_split(s, tuning)
    if d is not None:  # v // d and v % d in the indices: run v as d*outer + r, r unrolled
        outer = L.Var(f"{v}_{d}", s.var.extent // d)
        copies = tuple(
            L.Block(
                f"{v} = {d}*{outer.name} + {r}",
                split_body(split_var(s.body, s.var, outer, d, r), tuning),
            )
            for r in range(d)
        )
        return (L.Loop(outer, s.kind, copies),)
    segs = segments(s, tuning)
    if segs is None:
        return (replace(s, body=split_body(s.body, tuning, inner)),)
    out: list[L.Stmt] = []
    for lo, hi in segs:
        body = specialize(s.body, s.var, lo, hi)
        sub = rebase(body, s.var, lo, hi, tuning)
        if sub is not None:  # a v % d left on this segment: split it from its start
            out.extend(split_loop(replace(sub, kind=s.kind), tuning))
            continue
        out.append(L.Loop(s.var, s.kind, split_body(body, tuning), start=lo, stop=hi))
    return tuple(out)


def split_body(
    body: tuple[L.Stmt, ...], tuning: Tuning, may_split: bool = False
) -> tuple[L.Stmt, ...]:
    """:func:`split_stmt` over a statement list."""
    return tuple(x for s in body for x in split_stmt(s, tuning, may_split))


def split_stmt(s: L.Stmt, tuning: Tuning, may_split: bool = False) -> tuple[L.Stmt, ...]:
    """``s`` with its loops split (a loop may become several statements)."""
    if isinstance(s, L.Loop):
        return split_loop(s, tuning, may_split)
    if isinstance(s, L.BatchFused):  # the nests run per batch index: split their bodies
        producer = tuple(replace(n, body=split_body(n.body, tuning)) for n in s.producer)
        consumer = tuple(replace(n, body=split_body(n.body, tuning)) for n in s.consumer)
        return (replace(s, producer=producer, consumer=consumer),)
    if isinstance(s, L.LayerLoop):  # the body program ran the loop pipeline on its own
        return (replace(s, after=split_body(s.after, tuning)),)
    return (s,)


def split_index_sets(program: L.Program, target: Target) -> L.Program:
    """The loop stage: every kernel's loops split (module docstring). Top-level statements
    large enough for the C renderer's team keep their threaded loop whole; a target
    without a :class:`CTuning` threads nothing (``may_split`` False everywhere)."""
    tuning = target.tuning
    for kernel in program.kernels:
        body: list[L.Stmt] = []
        for s in kernel.body:
            team = isinstance(tuning, CTuning) and team_statement(s, tuning)
            body.extend(split_stmt(s, tuning, team))
        kernel.body = tuple(body)
    return program
