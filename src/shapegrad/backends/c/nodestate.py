"""A bound data-parallel step's state kept once per node (``shmshard`` plans which).

``place`` moves the executable's shareable state arrays into one block that every rank
of the node maps (``MPICommunicator.shared_block``), points the program's state slots at
it and sets the arena flag that turns the sharded updates on; from then on each rank
updates its chunk of those arrays in place and reads everyone's. ``write`` installs new
values (the first rank's, as a broadcast would: the ranks must agree anyway) and
``unplace`` goes back to a private copy per rank (an unbound call of the same
executable, which copies its own state in on every rank).

Everything here is collective over the node, as binding a data-parallel step is: every
rank binds the same steps in the same order.
"""

from __future__ import annotations

import ctypes
from typing import Any, Protocol

import numpy as np

from shapegrad.backends.c.manifest import RuntimeInfo

Array = np.ndarray[Any, Any]


class CExecutable(Protocol):
    """What this module uses of ``executable.CExecutable`` (which calls it)."""

    info: RuntimeInfo
    arena: Array
    state: dict[int, Array]
    node_comm: Any
    node_block: tuple[Any, dict[int, Array]] | None

    def _set(self, slot: int, array: Array) -> None: ...


def shareable(exe: CExecutable) -> bool:
    """Whether ``exe``'s program keeps state once per node and its ranks share memory."""
    return exe.node_comm is not None and exe.info.shard_flag >= 0


def placed(exe: CExecutable) -> bool:
    """Whether ``exe``'s shareable state lives in the node's block now (sharding on)."""
    at = exe.info.shard_flag
    return at >= 0 and bool(exe.arena[at : at + 4].view(np.int32)[0])


def place(exe: CExecutable) -> None:
    """Keep ``exe``'s shareable state in the node's block (allocated on first use) with
    the first rank's current values, and turn the sharded updates on. Collective."""
    if not shareable(exe) or placed(exe):
        return
    slots = exe.info.shared_slots
    if exe.node_block is None:
        offsets, at = [], 0
        for slot in slots:
            offsets.append(at)
            at += -(-exe.state[slot].nbytes // 64) * 64
        block = exe.node_comm.shared_block(max(at, 64))
        base = block.addresses[0]
        views = {}
        for slot, offset in zip(slots, offsets, strict=True):
            a = exe.state[slot]
            raw = (ctypes.c_char * a.nbytes).from_address(base + offset)
            views[slot] = np.frombuffer(memoryview(raw), a.dtype).reshape(a.shape)
        exe.node_block = (block, views)
    _, views = exe.node_block
    first = exe.node_comm.rank == 0
    for slot in slots:
        if first:
            np.copyto(views[slot], exe.state[slot])
        exe.state[slot] = views[slot]
        exe._set(slot, views[slot])
    exe.node_comm.barrier()  # every rank sees the values before any step reads them
    _flag(exe, 1)


def write(exe: CExecutable, values: dict[int, Array]) -> None:
    """Install ``values`` (slot -> checked array) into the placed state: the first rank
    writes the shared arrays, every rank its private ones. Collective."""
    shared = set(exe.info.shared_slots)
    first = exe.node_comm.rank == 0
    for slot, value in values.items():
        if slot not in shared or first:
            np.copyto(exe.state[slot], value, casting="same_kind")
    exe.node_comm.barrier()


def unplace(exe: CExecutable) -> None:
    """A private copy of the shared state on every rank, sharding off (the same code then
    updates every element on every rank)."""
    if not placed(exe):
        return
    _flag(exe, 0)
    for slot in exe.info.shared_slots:
        exe.state[slot] = np.array(exe.state[slot], copy=True)
        exe._set(slot, exe.state[slot])


def _flag(exe: CExecutable, value: int) -> None:
    at = exe.info.shard_flag
    exe.arena[at : at + 4].view(np.int32)[0] = value
