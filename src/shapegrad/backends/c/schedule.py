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
own flag, so every thread leaves the region at the same point (see ``render.py``).

Programs with layer loops or collectives keep one region per large loop (``fork``
mode): a layer body is a function called per layer, and MPI calls belong to one thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from shapegrad.backends.cstyle import estimate_work
from shapegrad.compiler import loops as L


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


# Target work of one dynamically scheduled chunk of a parallel loop, in the scalar ops of
# ``cstyle.estimate_work``: small enough that a thread which keeps running takes most of
# the chunks when the other one is descheduled, large enough that taking a chunk (one
# atomic increment) stays negligible. Measured: see ``benchmarks/train_step.py`` and the
# README's threading section.
CHUNK_WORK = 1 << 15


def chunk_size(loop: L.Loop) -> int:
    """Iterations per dynamic chunk of ``loop`` (at least 1, at most an eighth of it)."""
    per_iteration = max(1, sum(estimate_work(s) for s in loop.body))
    chunk = math.ceil(CHUNK_WORK / per_iteration)
    return max(1, min(chunk, loop.var.extent // 8))
