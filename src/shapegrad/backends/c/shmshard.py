"""Which state a data-parallel C program keeps once per node, updated in shards.

With every rank of a node holding its own copy of the parameters, each rank runs the
whole optimizer update: it loads the gradient's sum over the ranks and writes every
parameter, the same bits as every other rank (``shmplan.ReaderSum``). ``shard_plan``
finds the state that can instead live **once per node**, in memory the ranks share
(``BoundStep`` places it there at bind time): each rank then updates only its chunk of
every such buffer (``sg_shm_chunk``: the count split in whole cache lines), so the
update's memory traffic per rank drops by the number of ranks, and no copy of the
result is needed. Two barriers keep it exact:

* ``read``: a rank posts it after its last kernel that reads shared state outside the
  updates (the forward and backward products read the weights) and waits for every
  rank's before its first update kernel: no rank writes a parameter another still reads;
* ``updated``: posted after the last update kernel, waited for at once: no rank's next
  step (or the trainer reading the state back) sees a half-updated parameter.

A state buffer qualifies when every kernel that writes it is an *update kernel*: only
one-level parallel loops over whole buffers (``for i in [0, n)``), every store a plain
``s[i] = ...`` into qualifying state, every load of qualifying state at exactly ``i``
(another rank's chunk may be changing), nothing else but the progress of exchanges; and
every other kernel that names it runs before the first update kernel. Anything else (a
counter the update reads at index 0, a parameter read after the updates, e.g. a norm of
the new weights) stays private to each rank, updated whole as before: the plan shrinks
to a fixed point.

Whether a bound step actually shards is decided at run time by a flag in its arena
(``ShardPlan.flag``), set only once its state lies in shared memory: after an unbound
call, or on a communicator spanning several nodes, it is 0 and the same code updates
every element on every rank. ``SHAPEGRAD_SHM_SHARD=0`` at compile time renders no plan
at all (a copy per rank, for A/B).

Measured (docs/DESIGN.md, debt 7): at 2 ranks about equal to a copy per rank (the
weights' cache lines moving between cores take back what the half update saves); at 4,
8 and 16 ranks on a 16-core Xeon, 4-14%, 9-13% and 25-38% less time per step.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from shapegrad.backends.c.shmplan import shareable, switch, transport
from shapegrad.compiler import loops as L
from shapegrad.compiler.index import Affine

# Bytes reserved after the program's arena for the shard flag (one int32, a cache line).
FLAG_BYTES = 64


@dataclass(frozen=True)
class ShardPlan:
    """The state of ``program`` kept once per node and the kernels that update it in shards.

    Attributes:
        comm: the communicator whose node shares the state.
        buffers: the shared state buffers, in program order of their slots.
        kernels: names of the update kernels (their loops run this rank's chunk).
        release_after: the kernel after which a rank posts ``read`` (None: at the start).
        first_update / last_update: names of the first and last update kernels.
        code: the error code a timed-out barrier returns (an exchange's on ``comm``).
        flag: arena offset of the int32 that turns sharding on (``FLAG_BYTES`` reserved).
    """

    comm: int
    buffers: tuple[str, ...]
    kernels: frozenset[str]
    release_after: str | None
    first_update: str
    last_update: str
    code: int
    flag: int


def sharding_enabled() -> bool:
    """Unless ``SHAPEGRAD_SHM_SHARD=0`` (every rank updates all of its own copy, for A/B)."""
    return switch(
        "SHAPEGRAD_SHM_SHARD",
        os.environ.get("SHAPEGRAD_SHM_SHARD"),
        "keep the optimizer state once per node and update it in shards",
        "a copy per rank",
    )


def shard_plan(program: L.Program) -> ShardPlan | None:
    """The plan for ``program`` (a top-level program with one shared-memory communicator),
    or None when no state qualifies (see the module docstring)."""
    if len(program.communicators) != 1 or transport(program.communicators[0]) != "shm":
        return None
    if not sharding_enabled() or program.communicators[0].size < 2:
        return None
    kernels = program.kernels
    if any(isinstance(s, L.LayerLoop) for k in kernels for s in L.walk(k.body)):
        return None
    written = {n for k in kernels for n in _writes(k)}
    shared = {n for n, b in program.buffers.items() if b.kind == "state" and n in written}
    while True:
        dropped = _unqualified(kernels, shared, program)
        if not dropped:
            break
        shared -= dropped
    updates = [k for k in kernels if _writes(k) & shared]
    if not updates:
        return None
    first = kernels.index(updates[0])
    readers = [n for n, k in enumerate(kernels) if k not in updates and _names(k) & shared]
    codes = [s.code for k in kernels for s in L.walk(k.body) if isinstance(s, L.Collective)]
    if not codes or any(n > first for n in readers):
        return None
    return ShardPlan(
        comm=0,
        buffers=tuple(sorted(shared, key=lambda n: program.buffers[n].slot)),
        kernels=frozenset(k.name for k in updates),
        release_after=kernels[max(readers)].name if readers else None,
        first_update=updates[0].name,
        last_update=updates[-1].name,
        code=codes[0],
        flag=program.arena_bytes,
    )


def _unqualified(kernels: list[L.Kernel], shared: set[str], program: L.Program) -> set[str]:
    """Buffers to drop from ``shared`` this round (empty: a fixed point)."""
    dropped: set[str] = set()
    updates = [k for k in kernels if _writes(k) & shared]
    for k in updates:
        dropped |= _update_culprits(k, shared, program)
    if dropped:
        return dropped
    if updates:  # a kernel naming shared state after the first update: keep it private
        first = kernels.index(updates[0])
        for n, k in enumerate(kernels):
            if n > first and k not in updates:
                dropped |= _names(k) & shared
    return dropped


def _update_culprits(k: L.Kernel, shared: set[str], program: L.Program) -> set[str]:
    """Why kernel ``k`` (which writes shared state) cannot update in shards: the shared
    buffers to drop (a shared buffer loaded off its own element; else all it writes)."""
    whole = _writes(k) & shared
    for s in k.body:
        if isinstance(s, L.Collective) and s.phase == "test" and shareable(s):
            continue
        if not (isinstance(s, L.Loop) and s.kind == "parallel" and s.start == 0):
            return whole
        if s.stop is not None and s.stop != s.var.extent:
            return whole
        own = Affine.of(s.var)
        for x in s.body:
            if not (isinstance(x, L.Store) and x.accumulate is None and x.buffer in shared):
                return whole
            if x.index != own or program.buffers[x.buffer].size != s.var.extent:
                return whole
            off = {
                e.buffer
                for e in L.walk_expr(x.value)
                if isinstance(e, L.Load) and e.buffer in shared and e.index != own
            }
            if off:
                return off
            if any(
                isinstance(e, L.Load)
                and e.buffer in shared
                and program.buffers[e.buffer].size != s.var.extent
                for e in L.walk_expr(x.value)
            ):
                return whole
    return set()


def _writes(k: L.Kernel) -> set[str]:
    return L.writes(k.body)


def _names(k: L.Kernel) -> set[str]:
    """Every buffer kernel ``k`` reads or writes (loads, products, exchanges)."""
    return L.reads(k.body) | L.writes(k.body)




class ShardText:
    """The C a kernel of a sharded program adds: the flag, its loops' ranges, the barriers.

    ``regions``: the ``read`` and ``updated`` barrier regions (``shm.shard_regions``);
    ``fail``: the renderer's failure statement for an error code."""

    def __init__(self, plan: ShardPlan, regions: tuple[int, int], fail: str) -> None:
        self.plan = plan
        self.read, self.updated = regions
        self.fail = fail

    def touches(self, kernel: L.Kernel) -> bool:
        """Whether ``kernel`` needs the flag (it shards its loops or runs a barrier)."""
        p = self.plan
        return kernel.name in p.kernels or kernel.name == p.release_after

    def enter(self, kernel: L.Kernel) -> tuple[list[str], set[str]]:
        """(lines at the top of ``kernel``'s block, names of the loop variables that run
        this rank's chunk: ``sg_lo_<v>`` to ``sg_hi_<v>``)."""
        p, c = self.plan, self.plan.comm
        if not self.touches(kernel):
            return [], set()
        lines = [f"const int sg_shard = sg_shm_n[{c}] && *(const int32_t *)(arena + {p.flag});"]
        if kernel.name == p.first_update:
            if p.release_after is None:
                lines.append(f"if (sg_shard) sg_shm_post({c}, {self.read}, 0);")
            lines.append(f"if (sg_shard && sg_shm_wait({c}, {self.read})) {self.fail}")
        sharded: set[str] = set()
        if kernel.name in p.kernels:
            for s in kernel.body:
                if isinstance(s, L.Loop):
                    v = s.var.name
                    lines.append(f"int64_t sg_lo_{v}, sg_hi_{v};")
                    lines.append(
                        f"sg_shard_range({c}, sg_shard, {s.var.extent}, &sg_lo_{v}, &sg_hi_{v});"
                    )
                    sharded.add(v)
        return lines, sharded

    def leave(self, kernel: L.Kernel) -> list[str]:
        """Lines at the end of ``kernel``'s block (a barrier's post, and its wait)."""
        p, c = self.plan, self.plan.comm
        lines = []
        if kernel.name == p.release_after:
            lines.append(f"if (sg_shard) sg_shm_post({c}, {self.read}, 0);")
        if kernel.name == p.last_update:
            lines.append(f"if (sg_shard) sg_shm_post({c}, {self.updated}, 0);")
            lines.append(f"if (sg_shard && sg_shm_wait({c}, {self.updated})) {self.fail}")
        return lines


__all__ = ["FLAG_BYTES", "ShardPlan", "ShardText", "shard_plan", "sharding_enabled"]
