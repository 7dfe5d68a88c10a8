"""Which all-reduces of a C program run over memory shared within a node, and how.

``transport`` says whether a communicator's compiled all-reduces use shared memory at
all (``backends/c/shm.py``) or MPI. Of those, ``reader_sums`` picks the ones reduced
**at their readers** (``ReaderSum``): an exchange whose result only elementwise stores
load (a gradient read by the optimizer's update) is never materialized; its producer
writes this rank's operand into its own segment, the exchange only publishes it, and
each load sums every rank's operand in rank order (``shm.reader_load``). The rest use
the chunked exchange (copy in, reduce a chunk, copy out). Decided at render time from
the final loop program: the kernel order is fixed, and CUDA (which keeps MPI) never
asks.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from shapegrad.compiler import loops as L

# Reduce at the reader (``ReaderSum``): a gradient's sum over the ranks is computed where
# the optimizer's update loads it, from every rank's slot, instead of copied in, reduced
# per chunk and copied out. MLP 784-512-512-10, 2 ranks x 1 thread: see debt 7 of
# docs/DESIGN.md. SHAPEGRAD_SHM_READER=0 renders the chunked path instead (A/B).
READER_SUMS = True
# Most ranks a reader sums in one expression (more: the chunked path).
READER_MAX_RANKS = 16


def transport(comm: Any) -> str:
    """How compiled all-reduces over ``comm`` exchange: ``"shm"`` or ``"mpi"``."""
    return (
        "shm" if getattr(type(comm), "shared_segments", None) and comm.allreduce == "shm" else "mpi"
    )


@dataclass(frozen=True)
class ReaderSum:
    """An all-reduce (sum) reduced where its result is read: ``src`` lives in this rank's
    slot of region ``region`` of communicator ``comm``'s segments, and every load of
    ``dst`` becomes the sum of the ``ranks`` slots in rank order."""

    comm: int
    region: int
    src: str
    dst: str
    count: int
    dtype: str
    ranks: int

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8


def switch(variable: str, value: str | None, on: str, off: str) -> bool:
    """An A/B switch of the shared-memory path: ``value`` (of ``$variable``) is ``1``
    (``on``, the default when unset) or ``0`` (``off``); anything else is refused."""
    value = value or "1"
    if value not in ("0", "1"):
        raise ValueError(
            f"{variable} must be '1' ({on}, the default) or '0' ({off}), got {value!r}"
        )
    return value == "1"


def reader_sums_enabled() -> bool:
    """``READER_SUMS``, unless ``SHAPEGRAD_SHM_READER=0`` (the chunked path, for A/B)."""
    return READER_SUMS and switch(
        "SHAPEGRAD_SHM_READER",
        os.environ.get("SHAPEGRAD_SHM_READER"),
        "sum a shared-memory all-reduce where the update loads it",
        "the chunked exchange",
    )


def reader_sums(program: L.Program, nrequests: int) -> list[ReaderSum]:
    """The top-level sum all-reduces of ``program`` that reduce at their readers (regions
    numbered after the chunked ones), in program order. An exchange qualifies when its
    communicator shares memory (``transport``), it sums float32 or float64 over 2 to
    ``READER_MAX_RANKS`` ranks, and nothing but its producers and the exchange touch
    ``src`` (written only by kernels before the exchange, read by none) and nothing but
    the values of elementwise stores load ``dst`` (not a reduction, a product operand,
    an index, another exchange, a layer loop; not a program input or output). The
    others, e.g. a gradient a library product or a clipping norm reads, keep the
    chunked path."""
    if not reader_sums_enabled():
        return []
    out: list[ReaderSum] = []
    kernels = program.kernels
    for n, kernel in enumerate(kernels):
        for s in kernel.body:
            if not (isinstance(s, L.Collective) and _fusable(program, s)):
                continue
            if _only_produced_before(kernels, n, s) and _only_loaded(kernels, s):
                region = nrequests + 1 + len(out)
                size = program.communicators[s.comm].size
                out.append(ReaderSum(s.comm, region, s.src, s.dst, s.count, s.dtype.name, size))
    return out


def _fusable(program: L.Program, s: L.Collective) -> bool:
    comm = program.communicators[s.comm]
    kinds = {program.buffers[s.src].kind, program.buffers[s.dst].kind}
    return (
        shareable(s)
        and s.op == "sum"
        and s.phase in ("blocking", "start")
        and s.dtype.name in ("float32", "float64")
        and transport(comm) == "shm"
        and 2 <= comm.size <= READER_MAX_RANKS
        and s.src != s.dst
        and kinds == {"temp"}
    )


def _named(s: L.Stmt) -> tuple[set[str], set[str]]:
    """(buffers statement ``s`` writes, buffers it names otherwise than by a load)."""
    if isinstance(s, L.Store):
        return {s.buffer}, set()
    if isinstance(s, L.Contract):
        return {s.c}, {s.a, s.b} | ({s.alpha_buffer} if s.alpha_buffer else set())
    if isinstance(s, L.Collective):
        return {s.dst}, {s.src}
    if isinstance(s, L.SortRow):
        return {s.dst, s.scratch}, {s.src, s.scratch}
    if isinstance(s, L.IndexLoad | L.CheckBounds):
        return set(), {s.buffer}
    if isinstance(s, L.LayerLoop):
        return set(), {x.buffer for x in s.slots} | {s.arena}
    return set(), set()


def _only_produced_before(kernels: list[L.Kernel], at: int, x: L.Collective) -> bool:
    """``x.src`` is written only by kernels before ``at`` and read by nothing but ``x``
    (an accumulating store or product reads what it adds to: a producer)."""
    for n, kernel in enumerate(kernels):
        if any(ld.buffer == x.src for ld in L.loads_in(kernel.body)):
            return False
        for s in L.walk(kernel.body):
            if isinstance(s, L.Collective) and s.src == x.src and s.dst == x.dst:
                continue
            written, named = _named(s)
            if x.src in named or (x.src in written and n >= at):
                return False
    return True


def _only_loaded(kernels: list[L.Kernel], x: L.Collective) -> bool:
    """Nothing but ``x`` writes ``x.dst`` and nothing but the values of plain
    (elementwise) stores load it: a reduction over it (a clipping norm) may be vectorized
    in another order once each term is a fenced sum, so it keeps the chunked path."""
    for kernel in kernels:
        for s in L.walk(kernel.body):
            if isinstance(s, L.Collective) and s.src == x.src and s.dst == x.dst:
                continue
            written, named = _named(s)
            if x.dst in written or x.dst in named:
                return False
            plain = isinstance(s, L.Store) and s.accumulate is None
            if not plain and any(
                isinstance(e, L.Load) and e.buffer == x.dst
                for root in L.expressions(s)
                for e in L.walk_expr(root)
            ):
                return False
    return True


def shareable(s: L.Collective) -> bool:
    """Whether the shared-memory path can run exchange ``s`` (when its communicator has it)."""
    return s.kind == "all_reduce" and s.root is None and s.op in ("sum", "max")
