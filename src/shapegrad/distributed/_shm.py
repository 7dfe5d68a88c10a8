"""Memory shared by the processes of one node, for the generated C's all-reduce.

A compiled program whose communicator says ``allreduce == "shm"`` runs its all-reduces
through a segment per process that every process of the node maps
(``backends/c/collectives.py`` has the protocol). This module finds whether the whole
communicator is on one node and allocates the segments: ``MPI_Comm_split_type``
(``MPI_COMM_TYPE_SHARED``) gives the processes that can share memory, and
``MPI_Win_allocate_shared`` (through mpi4py) the memory, so MPI maps it into every process
and releases it with the job; nothing is left in ``/dev/shm`` by a crashed run.

When the communicator spans several nodes there is no shared segment and the program
keeps MPI's all-reduce (``SharedSegments`` is None). ``SHAPEGRAD_FAKE_NODES=k`` (testing
only) pretends the ranks are spread over ``k`` nodes (consecutive blocks of ranks), so
that fallback is testable on one machine.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any

# The transports an MPICommunicator's compiled all-reduces may use.
ALLREDUCE_TRANSPORTS = ("shm", "mpi")
# Most processes of one node the generated C addresses (its table of segment pointers).
MAX_NODE_RANKS = 256


@dataclass(frozen=True)
class SharedSegments:
    """One segment of ``nbytes`` per process of the communicator, mapped in this process:
    ``addresses[r]`` is rank ``r``'s (communicator ranks); ``window`` keeps the mapping."""

    addresses: tuple[int, ...]
    nbytes: int
    window: Any


def allreduce_transport(value: str | None) -> str:
    """``value``, else ``$SHAPEGRAD_ALLREDUCE``, else ``"shm"``; checked."""
    chosen = value if value is not None else os.environ.get("SHAPEGRAD_ALLREDUCE") or "shm"
    if chosen not in ALLREDUCE_TRANSPORTS:
        source = "allreduce" if value is not None else "SHAPEGRAD_ALLREDUCE"
        raise ValueError(
            f"{source} must be one of {', '.join(map(repr, ALLREDUCE_TRANSPORTS))} (shared "
            f"memory within a node, else MPI; or MPI always), got {chosen!r}"
        )
    return chosen


def node_communicator(mpi: Any, comm: Any) -> Any:
    """The processes of ``comm`` that share this process's memory node (ranks in ``comm``'s
    order), split further by ``SHAPEGRAD_FAKE_NODES`` when set (collective over ``comm``)."""
    node = comm.Split_type(mpi.COMM_TYPE_SHARED, key=comm.Get_rank())
    fake = os.environ.get("SHAPEGRAD_FAKE_NODES")
    if fake:
        if not fake.isdigit() or int(fake) < 1:
            raise ValueError(f"SHAPEGRAD_FAKE_NODES must be a count of nodes >= 1, got {fake!r}")
        rank, size = comm.Get_rank(), comm.Get_size()
        split = node.Split(rank * int(fake) // size, key=rank)
        node.Free()
        node = split
    return node


def allocate(mpi: Any, comm: Any, node: Any, nbytes: int) -> SharedSegments | None:
    """Segments of ``nbytes`` for every process of ``comm``, or None when ``comm`` is not all
    on one node (or has more than ``MAX_NODE_RANKS`` processes). Collective over ``node``.

    The memory MPI hands out is not zeroed: each process clears its own segment's head (the
    flags of the protocol) and the processes meet at a barrier before any exchange."""
    size = comm.Get_size()
    if node.Get_size() != size or size > MAX_NODE_RANKS:
        return None
    window: Any = None
    addresses = []
    try:  # an MPI without shared-memory windows: MPI's all-reduce, on every rank alike
        window = mpi.Win.Allocate_shared(nbytes, 1, comm=node)
        for r in range(size):
            buffer, _ = window.Shared_query(r)
            addresses.append(int(buffer.address))
    except mpi.Exception:
        window = None
    if not node.allreduce(window is not None, op=mpi.LAND):
        return None
    ctypes.memset(addresses[node.Get_rank()], 0, nbytes)
    node.Barrier()
    return SharedSegments(tuple(addresses), nbytes, window)


def allocate_block(mpi: Any, node: Any, nbytes: int) -> SharedSegments:
    """One block of ``nbytes`` that every process of ``node`` maps, held by its first
    process (``addresses`` has that one address): state a compiled program keeps once per
    node (``backends/c/shmshard.py``). Collective over ``node``; not zeroed."""
    window = mpi.Win.Allocate_shared(nbytes if node.Get_rank() == 0 else 0, 1, comm=node)
    buffer, _ = window.Shared_query(0)
    return SharedSegments((int(buffer.address),), nbytes, window)
