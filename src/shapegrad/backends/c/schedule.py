"""How one step's kernels share a single OpenMP team (the C renderer's threading plan).

A step opens **one** ``#pragma omp parallel`` region (``render.CRenderer.body``) instead
of one region per large kernel: a fork/join costs a few microseconds and, on a busy
machine, waits for every thread of the team to be scheduled again. Inside the region the
program is a sequence of :class:`Unit`:

* a *shared* unit is one top-level statement that the team splits (a large parallel
  loop, a row-split reduction, a large library product, a batch-fused product) with an
  orphaned work-sharing construct (``#pragma omp for ... nowait``), so the same code
  works when a kernel lives in its own function or translation unit;
* a *serial* unit is everything else; consecutive serial units run back to back under
  one ``#pragma omp single nowait``.

Every construct ends ``nowait``; :func:`needs_barrier` puts a ``#pragma omp barrier``
only before a unit that touches memory an earlier, not yet synchronized unit writes
(or writes memory it reads). Temps that share arena bytes count as the same memory.
A group that can fail a bounds check is always followed by a barrier and a test of its
own flag, so every thread leaves the region at the same point (see ``kernel_render.py``).

Programs with layer loops or collectives keep one region per large loop (``fork``
mode): a layer body is a function called per layer, and MPI calls belong to one thread.

:func:`plan_region` is the whole decision as a pure function of the kernels (a
:class:`Region`: groups, barriers, failure flags, team size, or fork mode with each
statement's "may split" flag); the renderer prints what it says, and ``SHAPEGRAD_DEBUG``
dumps it (``<name>.schedule.txt``, :meth:`Region.format`). The thresholds are the
target's :class:`~shapegrad.compiler.target.CTuning`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from shapegrad.backends.c.teamsplit import split_kind
from shapegrad.compiler import loops as L
from shapegrad.compiler.splitting import estimate_work, row_of
from shapegrad.compiler.target import CTuning


@dataclass(frozen=True)
class Unit:
    """Statements of one kernel run either by one thread or split across the team.

    Attributes:
        kernel: the kernel number (``sg_profile`` index) and the kernel itself.
        body: the statements (one statement when ``shared``).
        shared: split across the team (one work-sharing construct).
        fails: contains a bounds check (error-flag contract).
    """

    number: int
    kernel: L.Kernel
    body: tuple[L.Stmt, ...]
    shared: bool
    fails: bool

    @property
    def reads(self) -> set[str]:
        return L.reads(self.body)

    @property
    def writes(self) -> set[str]:
        return L.writes(self.body)


def fork_only(program: L.Program) -> bool:
    """Whether ``program`` must keep one region per large loop (layer loops: the body is a
    function with its own regions; collectives: MPI calls stay on the calling thread)."""
    return any(
        isinstance(s, L.LayerLoop | L.Collective) for k in program.kernels for s in L.walk(k.body)
    )


def split_units(
    kernels: list[L.Kernel], shareable: Callable[[L.Stmt], bool], first: int = 0
) -> list[Unit]:
    """The kernels as units in program order. A kernel whose top level declares a C name
    used by later statements (a scalar reduction, a scratch array, a loaded index) stays
    one serial unit; otherwise each statement that ``shareable`` accepts is its own shared
    unit and the statements between them form serial units. Kernels are numbered from
    ``first`` (their ``sg_profile`` index in the whole program)."""
    out: list[Unit] = []
    for number, k in enumerate(kernels, first):
        declares = any(isinstance(s, L.Reduce | L.Local | L.IndexLoad) for s in k.body)
        run: list[L.Stmt] = []
        for s in k.body:
            if not declares and shareable(s) and not _can_fail((s,)):
                if run:
                    out.append(Unit(number, k, tuple(run), False, _can_fail(run)))
                    run = []
                out.append(Unit(number, k, (s,), True, False))
            else:
                run.append(s)
        if run:
            out.append(Unit(number, k, tuple(run), False, _can_fail(run)))
    return out


def _can_fail(body: list[L.Stmt] | tuple[L.Stmt, ...]) -> bool:
    return any(isinstance(s, L.CheckBounds) for s in L.walk(body))


class Tracker:
    """The memory touched since the last barrier, to decide where the next one goes.

    Buffers are compared by name, and temps also by their arena bytes (two temps of
    different kernels may share them).
    """

    def __init__(self, program: L.Program) -> None:
        self.program = program
        self.read: set[str] = set()
        self.written: set[str] = set()

    def needs_barrier(self, reads: set[str], writes: set[str]) -> bool:
        """True when code reading ``reads`` and writing ``writes`` reads what a pending
        unit writes, or writes what a pending unit reads or writes."""
        return self._overlap(reads, self.written) or self._overlap(writes, self.written | self.read)

    def add(self, reads: set[str], writes: set[str]) -> None:
        self.read |= reads
        self.written |= writes

    def clear(self) -> None:
        self.read.clear()
        self.written.clear()

    def _overlap(self, a: set[str], b: set[str]) -> bool:
        if a & b:
            return True
        spans_a = [r for r in map(self._span, a) if r is not None]
        spans_b = [r for r in map(self._span, b) if r is not None]
        return any(lo < hi2 and lo2 < hi for lo, hi in spans_a for lo2, hi2 in spans_b)

    def _span(self, name: str) -> tuple[int, int] | None:
        spec = self.program.buffers.get(name)
        if spec is None or spec.kind != "temp":
            return None
        return spec.offset, spec.offset + spec.size * spec.dtype.numpy.itemsize


def chunk_size(loop: L.Loop, tuning: CTuning) -> int:
    """Iterations per dynamic chunk of ``loop`` (at least 1, at most a
    ``tuning.min_chunks``-th of it): about ``tuning.chunk_work`` scalar ops each."""
    per_iteration = max(1, sum(estimate_work(s) for s in loop.body))
    chunk = math.ceil(tuning.chunk_work / per_iteration)
    return max(1, min(chunk, loop.trips // tuning.min_chunks))


def shareable(s: L.Stmt, tuning: CTuning) -> bool:
    """Whether the team splits top-level statement ``s`` inside the step's region (the
    same splits ``render.CRenderer`` makes in fork mode): a batch-fused product, a product
    ``teamsplit.split_kind`` splits, or a loop of at least ``tuning.region_min_work``
    scalar ops that is parallel or a reduction over rows (``splitting.row_of``)."""
    if isinstance(s, L.BatchFused):
        return True
    if isinstance(s, L.Contract):
        return split_kind(s, tuning) is not None
    if isinstance(s, L.Loop) and estimate_work(s) >= tuning.region_min_work:
        if s.kind == "parallel" and s.trips > 1:
            return True
        return s.kind == "reduction" and row_of(s) is not None
    return False


@dataclass(frozen=True)
class Group:
    """Units run back to back: one shared unit, or serial units under one ``omp single``.

    Attributes:
        units: the units, in program order.
        barrier: a ``#pragma omp barrier`` stands before the group.
        flag: the group's ``sg_fail`` index when it can fail a bounds check, else -1.
    """

    units: tuple[Unit, ...]
    barrier: bool
    flag: int

    @property
    def shared(self) -> bool:
        return self.units[0].shared


@dataclass(frozen=True)
class Region:
    """The threading plan of one C function (``sg_body`` or a kernel unit's function).

    Attributes:
        first: the ``sg_profile`` number of the first kernel.
        kernels: the function's kernels.
        groups: the step's one region, in order; empty: fork mode (each kernel a block of
            its own, a large statement opening its own ``parallel for``).
        parallel: fork mode only: per kernel, per top-level statement, whether it may be
            split across threads (at least ``CTuning.omp_min_work`` scalar ops).
        team: the region's ``num_threads`` expression.
        failing: how many groups can fail (the size of ``sg_fail``).
        forks: fork mode only: some statement of the kernels, or of a layer body they
            run, opens a team of its own; each call of the function then picks that team
            (the full team or one thread, ``runtime.h``'s adaptive choice) and is timed.
    """

    first: int
    kernels: tuple[L.Kernel, ...]
    groups: tuple[Group, ...]
    parallel: tuple[tuple[bool, ...], ...]
    team: str
    failing: int
    forks: bool = False

    def format(self, tuning: CTuning) -> str:
        """The plan as text (the ``SHAPEGRAD_DEBUG`` dump)."""
        if not self.groups:
            adaptive = ", adaptive team per call" if self.forks else ""
            lines = [f"fork mode: {len(self.kernels)} kernels from k#{self.first}{adaptive}"]
            for k, flags in zip(self.kernels, self.parallel, strict=True):
                split = [n for n, ok in enumerate(flags) if ok]
                lines.append(
                    f"  {k.name}: " + (f"statements {split} may split" if split else "serial")
                )
            return "\n".join(lines)
        lines = [f"one region, team {self.team}, {self.failing} failure flags"]
        for g in self.groups:
            if g.barrier:
                lines.append("  barrier")
            where = "shared" if g.shared else "single"
            fail = f" (fails to sg_fail[{g.flag}], then barrier)" if g.flag >= 0 else ""
            lines.append(f"  {where}{fail}:")
            for u in g.units:
                lines.append(f"    {u.kernel.name}: {_describe(u, tuning)}")
        return "\n".join(lines)


def _describe(u: Unit, tuning: CTuning) -> str:
    if not u.shared:
        return f"{len(u.body)} statements"
    s = u.body[0]
    if isinstance(s, L.BatchFused):
        return f"batch-fused product, {s.slots} slots"
    if isinstance(s, L.Contract):
        return f"product split by {split_kind(s, tuning)}"
    assert isinstance(s, L.Loop)
    if s.kind == "reduction":
        return f"reduction over rows of {s.var.name}, row split"
    return f"loop over {s.var.name} ({s.trips}), dynamic chunks of {chunk_size(s, tuning)}"


def fork_parallel(kernel: L.Kernel, tuning: CTuning) -> tuple[bool, ...]:
    """Fork mode: per top-level statement of ``kernel``, whether it is large enough to open
    its own ``parallel for`` (each loop nest, a library call and its epilogue, judged on
    its own estimated work: at least ``tuning.omp_min_work`` scalar ops)."""
    return tuple(estimate_work(s) >= tuning.omp_min_work for s in kernel.body)


def plan_region(
    program: L.Program,
    kernels: list[L.Kernel] | tuple[L.Kernel, ...],
    tuning: CTuning,
    first: int = 0,
    profile: bool = False,
    nested: bool = False,
) -> Region:
    """The threading plan of a function running ``kernels`` of ``program`` (numbered from
    ``first``): one region when anything is worth splitting (``tuning.one_region``, no
    layer loop or collective in the program, not a layer body: ``nested``), else fork
    mode. With ``profile`` every group is preceded by a barrier (each kernel timed alone).
    """
    one = tuning.one_region and not nested and not fork_only(program)
    units = split_units(list(kernels), lambda s: shareable(s, tuning), first) if one else []
    kernels = tuple(kernels)
    if not any(u.shared for u in units):
        parallel = tuple(fork_parallel(k, tuning) for k in kernels)
        # a layer body runs with the team its caller picked
        forks = not nested and (any(map(any, parallel)) or _layer_bodies_fork(kernels, tuning))
        return Region(first, kernels, (), parallel, "sg_threads", 0, forks)
    runs: list[list[Unit]] = []
    for u in units:
        if u.shared or not runs or runs[-1][0].shared:
            runs.append([u])
        else:
            runs[-1].append(u)
    groups: list[Group] = []
    pending = Tracker(program)
    failing = 0
    for run in runs:
        reads = set().union(*(u.reads for u in run))
        writes = set().union(*(u.writes for u in run))
        barrier = pending.needs_barrier(reads, writes) or profile
        if barrier:
            pending.clear()
        pending.add(reads, writes)
        flag = -1
        if not run[0].shared and any(u.fails for u in run):
            flag, failing = failing, failing + 1
            pending.clear()  # the barrier after a failing group
        groups.append(Group(tuple(run), barrier, flag))
    return Region(first, kernels, tuple(groups), (), _team_size(kernels), failing)


def _layer_bodies_fork(kernels: tuple[L.Kernel, ...], tuning: CTuning) -> bool:
    """Whether a statement of a layer body that ``kernels`` run (at any depth) opens a team
    (``render.CRenderer.layer_loop`` renders bodies in fork mode)."""
    bodies = [s.body for k in kernels for s in L.walk(k.body) if isinstance(s, L.LayerLoop)]
    return any(
        any(fork_parallel(k, tuning))
        for body in bodies
        for program in L.nested_programs(body)
        for k in program.kernels
    )


def _team_size(kernels: tuple[L.Kernel, ...]) -> str:
    """The region's team: ``sg_threads``, at most the scratch slices of any batch-fused
    product (each thread of the team owns one)."""
    slots = [s.slots for k in kernels for s in L.walk(k.body) if isinstance(s, L.BatchFused)]
    if not slots:
        return "sg_threads"
    return f"(sg_threads < {min(slots)} ? sg_threads : {min(slots)})"
