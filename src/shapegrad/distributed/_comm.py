"""The communicator abstraction: what collectives, the trainer and the backends ask of one.

A :class:`Communicator` is a group of ``size`` processes, this one being ``rank``.
Collective primitives carry it in their attributes; the NumPy paths (eager, the
``numpy`` backend) call its host methods on NumPy arrays, and native backends ask
it for what their generated code needs (``native()``: MPI entry points and
handles for the C backend). A device communicator (NCCL) would add its own
``native`` description; a CUDA step can stage through host memory with the host
methods meanwhile, which is why every method takes and returns host arrays.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Array = npt.NDArray[Any]


class DistributedError(RuntimeError):
    """A collective could not run (another process failed, MPI reported an error)."""


class RankMismatchError(DistributedError):
    """Processes disagree about something that must be identical (shapes, dtypes, ...)."""


@dataclass(frozen=True)
class NativeMPI:
    """What generated C needs to call the MPI library the process already loaded.

    ``handle_type`` is the C spelling of an MPI handle of this MPI ABI (``int`` for
    MPICH, ``void *`` for Open MPI); ``functions`` are addresses of the MPI entry points
    by name; ``handles`` are handle values (communicator, datatypes, ops) by name;
    ``in_place`` is the value of ``MPI_IN_PLACE``.
    """

    handle_type: str
    functions: dict[str, int]
    handles: dict[str, int]
    in_place: int


@runtime_checkable
class Communicator(Protocol):
    """A group of processes that run the same program (SPMD).

    ``key`` names the group in generated code and cache keys (``"world"`` for every
    process of the job), so equal keys must mean equal groups.
    """

    rank: int
    size: int
    key: str

    def all_reduce(self, x: Array, op: str, root: int | None = None) -> Array:
        """Elementwise ``op`` ("sum" | "mean" | "max") over the processes; with ``root``,
        the sum on that rank and zeros on the others."""
        ...

    def all_gather(self, x: Array) -> Array:
        """Every process's ``x`` concatenated along the leading axis, in rank order."""
        ...

    def reduce_scatter(self, x: Array) -> Array:
        """The sum over processes of ``x``, of which this rank keeps leading-axis block ``rank``."""
        ...

    def broadcast(self, x: Array, root: int) -> Array:
        """``root``'s ``x`` on every process (same shape and dtype everywhere)."""
        ...

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every process's picklable ``obj``, in rank order."""
        ...

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """``root``'s picklable ``obj`` on every process."""
        ...

    def barrier(self) -> None: ...

    def abort(self, code: int = 1) -> None:
        """End every process of the job (a failure one process cannot recover from)."""
        ...

    def native(self) -> NativeMPI | None:
        """The MPI entry points for generated code, or None (no native exchange needed)."""
        ...


class LocalCommunicator:
    """The group of this process alone: every collective is the identity (no MPI needed)."""

    rank = 0
    size = 1
    key = "local"

    def all_reduce(self, x: Array, op: str, root: int | None = None) -> Array:
        return np.array(x, copy=True)

    def all_gather(self, x: Array) -> Array:
        return np.array(x, copy=True)

    def reduce_scatter(self, x: Array) -> Array:
        return np.array(x, copy=True)

    def broadcast(self, x: Array, root: int) -> Array:
        return np.array(x, copy=True)

    def gather_objects(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        return obj

    def barrier(self) -> None:
        return None

    def abort(self, code: int = 1) -> None:
        raise SystemExit(code)

    def native(self) -> NativeMPI | None:
        return None

    def __repr__(self) -> str:
        return "<local communicator>"


def fingerprint(description: Any) -> int:
    """A 63-bit digest of ``repr(description)``: equal on every process iff the reprs are."""
    digest = hashlib.blake2b(repr(description).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_same(comm: Communicator, what: str, description: Any) -> None:
    """Raise :class:`RankMismatchError` on every process unless all give an equal
    ``description`` (compared by ``repr``). The message names the ranks that differ.

    One small all-gather of a digest when they agree; the full descriptions are
    exchanged only to write the message.
    """
    if comm.size == 1:
        return
    prints = comm.gather_objects(fingerprint(description))
    if all(x == prints[0] for x in prints):
        return
    shown = comm.gather_objects(repr(description))
    groups: dict[str, list[int]] = {}
    for r, text in enumerate(shown):
        groups.setdefault(text, []).append(r)
    lines = [
        f"  rank{'s' if len(rs) > 1 else ''} {_ranks(rs)}: {text}" for text, rs in groups.items()
    ]
    raise RankMismatchError(
        f"{what} differs between processes (they must all be equal):\n" + "\n".join(lines)
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)
