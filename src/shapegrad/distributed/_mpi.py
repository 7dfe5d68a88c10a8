"""The MPI communicator (through ``mpi4py``), the job's world, and failing the whole job.

``world()`` is the group of every process that ``mpiexec`` started. A process not
started by a launcher gets a :class:`~shapegrad.distributed._comm.LocalCommunicator`
without importing MPI at all, so single-process users never pay for it.

Failure policy: a process that raises prints its traceback (prefixed by its rank)
and calls ``MPI_Abort``, which makes the launcher end every other process at once
instead of leaving them blocked in their next collective. A process killed by a
signal is noticed by the launcher (MPICH's hydra, Open MPI's mpirun) the same way.
A process that neither dies nor raises but stops taking part (stuck, or an exception
swallowed by a framework around it) is caught by the opt-in watchdog:
``SHAPEGRAD_COLLECTIVE_TIMEOUT=<seconds>`` makes a process that has waited that long
inside a collective or a data-parallel step abort the job with a message saying so.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import numpy as np

from shapegrad.distributed import _shm
from shapegrad.distributed._comm import (
    Array,
    Communicator,
    DistributedError,
    LocalCommunicator,
    NativeMPI,
    check_same,
)
from shapegrad.dtypes import bfloat16

_LAUNCHER_SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")
# The entry points generated C calls (see backends/c/collectives.py).
MPI_FUNCTIONS = (
    "MPI_Allreduce",
    "MPI_Allgather",
    "MPI_Reduce_scatter_block",
    "MPI_Bcast",
    "MPI_Comm_rank",
    "MPI_Iallreduce",
    "MPI_Test",
    "MPI_Wait",
)


def launched_size() -> int:
    """The process count a launcher (mpiexec/mpirun/srun with PMI) announced, else 1."""
    for name in _LAUNCHER_SIZE_VARS:
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 1


def _mpi() -> Any:
    try:
        from mpi4py import MPI  # untyped third-party module
    except ImportError as exc:
        raise DistributedError(
            f"this process was started by an MPI launcher with {launched_size()} processes, "
            "but mpi4py is not importable; install the MPI extra: pip install 'shapegrad[mpi]' "
            f"({exc})"
        ) from exc
    return MPI


class MPICommunicator:
    """A communicator over an ``mpi4py`` communicator (default: ``MPI.COMM_WORLD``).

    ``allreduce`` says how the all-reduces of compiled C programs exchange: ``"shm"``
    (the default; ``$SHAPEGRAD_ALLREDUCE`` sets it for :func:`world`) through memory
    shared by the processes when they are all on one node, else MPI; ``"mpi"`` through
    MPI always (``backends/c/collectives.py``).

    Host collectives run on NumPy arrays with mpi4py's buffer interface: float16 is
    reduced in float32 and bool as bytes (``max`` is logical or); gathers and broadcasts
    move raw bytes, so every dtype works. Every host collective first checks that all
    processes pass the same shape and dtype (one 8-byte all-gather), so a mismatch is a
    :class:`RankMismatchError` naming the ranks instead of a hang or corrupt data.

    Example:
        >>> comm = sg.distributed.world()
        >>> total = comm.all_reduce(np.ones(3), "sum")    # == comm.size everywhere
    """

    def __init__(
        self, comm: Any = None, key: str | None = None, allreduce: str | None = None
    ) -> None:
        MPI = _mpi()
        self.mpi = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())
        self.key = key if key is not None else ("world" if comm is None else f"comm{id(comm)}")
        self._native: NativeMPI | None = None
        # how compiled all-reduces exchange (see ``distributed/_shm.py``)
        self.allreduce = _shm.allreduce_transport(allreduce)
        self._node: Any = None
        self._segments: dict[str, _shm.SharedSegments | None] = {}
        self.watchdog: Watchdog | None = None
        limit = os.environ.get("SHAPEGRAD_COLLECTIVE_TIMEOUT")
        if limit and self.size > 1:
            self.watchdog = Watchdog(self, float(limit))

    def __repr__(self) -> str:
        return f"<MPI communicator {self.key}: rank {self.rank} of {self.size}>"

    # --- host collectives ----------------------------------------------------------------
    def _check(self, what: str, x: Array, *extra: Any) -> None:
        check_same(self, f"{what}: the operand (shape, dtype)", (x.shape, x.dtype.str, *extra))

    def watch(self, what: str) -> contextlib.AbstractContextManager[None]:
        """A block during which this process waits for the others (see :class:`Watchdog`)."""
        return self.watchdog.watch(what) if self.watchdog is not None else contextlib.nullcontext()

    def all_reduce(self, x: Array, op: str, root: int | None = None) -> Array:
        self._check("all_reduce", x, op, root)
        work = _staged(x)
        out = np.empty_like(work)
        mpi_op = self.mpi.MAX if op == "max" else self.mpi.SUM
        with self.watch("all_reduce"):
            self.comm.Allreduce(np.ascontiguousarray(work), out, op=mpi_op)
        if op == "mean":
            out = out / np.asarray(self.size, out.dtype)
        if root is not None and self.rank != root:
            out[...] = 0
        return out.astype(x.dtype, copy=False)

    def all_gather(self, x: Array) -> Array:
        self._check("all_gather", x)
        x = np.ascontiguousarray(x)
        out = np.empty((self.size * x.shape[0], *x.shape[1:]), x.dtype)
        with self.watch("all_gather"):
            self.comm.Allgather(_bytes(x), _bytes(out))
        return out

    def reduce_scatter(self, x: Array) -> Array:
        self._check("reduce_scatter", x)
        work = np.ascontiguousarray(_staged(x))
        out = np.empty((x.shape[0] // self.size, *x.shape[1:]), work.dtype)
        with self.watch("reduce_scatter"):
            self.comm.Reduce_scatter_block(work, out, op=self.mpi.SUM)
        return out.astype(x.dtype, copy=False)

    def broadcast(self, x: Array, root: int) -> Array:
        self._check("broadcast", x, root)
        out = np.array(x, copy=True, order="C")
        with self.watch("broadcast"):
            self.comm.Bcast(_bytes(out), root=root)
        return out

    def gather_objects(self, obj: Any) -> list[Any]:
        with self.watch("an exchange of descriptions"):
            return list(self.comm.allgather(obj))

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        with self.watch("broadcast"):
            return self.comm.bcast(obj, root=root)

    def barrier(self) -> None:
        with self.watch("barrier"):
            self.comm.Barrier()

    def abort(self, code: int = 1) -> None:
        self.comm.Abort(code)

    # --- native --------------------------------------------------------------------------
    def shared_segments(self, tag: str, nbytes: int) -> _shm.SharedSegments | None:
        """One segment of ``nbytes`` per process, all mapped here, for the compiled program
        ``tag`` (its library key: a program reuses its segments when bound again), or None
        when the processes are not all on one node or ``allreduce`` is ``"mpi"``.
        Collective: every process asks for the same tags in the same order (they bind the
        same programs, ``check_program`` compares them first)."""
        if self.allreduce != "shm":
            return None
        if tag not in self._segments:
            if self._node is None:
                self._node = _shm.node_communicator(self.mpi, self.comm)
            self._segments[tag] = _shm.allocate(self.mpi, self.comm, self._node, nbytes)
        found = self._segments[tag]
        if found is not None and found.nbytes < nbytes:
            raise DistributedError(
                f"{self!r}: program {tag} was bound with {found.nbytes}-byte shared segments "
                f"and now asks for {nbytes}"
            )
        return found

    def shared_block(self, nbytes: int) -> _shm.SharedSegments:
        """A new block of ``nbytes`` mapped by every process (all on this node: call it
        only where ``shared_segments`` gave segments). Collective; it lives as long as the
        returned object."""
        if self._node is None:
            self._node = _shm.node_communicator(self.mpi, self.comm)
        return _shm.allocate_block(self.mpi, self._node, nbytes)

    def native(self) -> NativeMPI:
        """MPI entry points of the library mpi4py loaded (no second MPI in the process)."""
        if self._native is None:
            MPI = self.mpi
            lib = ctypes.CDLL(_loaded_libmpi(), mode=getattr(os, "RTLD_NOLOAD", 0) | os.RTLD_LAZY)
            functions = {
                name: int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0)
                for name in MPI_FUNCTIONS
            }
            handles = {
                "comm": MPI._handleof(self.comm),
                "float32": MPI._handleof(MPI.FLOAT),
                "float64": MPI._handleof(MPI.DOUBLE),
                "int32": MPI._handleof(MPI.INT32_T),
                "byte": MPI._handleof(MPI.BYTE),
                "sum": MPI._handleof(MPI.SUM),
                "max": MPI._handleof(MPI.MAX),
            }
            handle_type = "int" if MPI._sizeof(MPI.Comm) == 4 else "void *"
            self._native = NativeMPI(handle_type, functions, handles, int(MPI.IN_PLACE))
        return self._native


class Watchdog:
    """Ends the job when this process has waited longer than ``seconds`` in a watched block
    (a collective, a data-parallel step): another process is then stuck, or failed in a
    way that did not end the job. A daemon thread checks once a second; MPI was started
    with thread support, so it may call ``MPI_Abort`` while the main thread is blocked.
    """

    def __init__(self, comm: Communicator, seconds: float) -> None:
        if not seconds > 0:
            raise ValueError(f"SHAPEGRAD_COLLECTIVE_TIMEOUT must be > 0 seconds, got {seconds}")
        self.comm = comm
        self.seconds = seconds
        self._since: float | None = None
        self._what = ""
        threading.Thread(target=self._run, name="shapegrad-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def watch(self, what: str) -> Iterator[None]:
        outer = self._since is not None  # nested blocks: the outermost one is timed
        if not outer:
            self._what, self._since = what, time.monotonic()
        try:
            yield
        finally:
            if not outer:
                self._since = None

    def _run(self) -> None:
        while True:
            time.sleep(min(1.0, self.seconds / 4))
            since = self._since
            if since is not None and time.monotonic() - since > self.seconds:
                comm = self.comm
                sys.stderr.write(
                    f"[rank {comm.rank}/{comm.size}] shapegrad: {self._what} waited more than "
                    f"{self.seconds:g} s for the other processes (SHAPEGRAD_COLLECTIVE_TIMEOUT): "
                    f"one is stuck or failed without ending the job; aborting all "
                    f"{comm.size} processes\n"
                )
                _abort_after_output(comm)
                return


def watch(comm: Communicator | None, what: str) -> contextlib.AbstractContextManager[None]:
    """``comm.watch(what)`` where the communicator has a watchdog, else a no-op block."""
    method = getattr(comm, "watch", None)
    return method(what) if method is not None else contextlib.nullcontext()


def _staged(x: Array) -> Array:
    """The array as MPI reduces it: float16 and bfloat16 in float32, bool as unsigned bytes."""
    if x.dtype == np.float16 or x.dtype == bfloat16.numpy:
        return x.astype(np.float32)
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    return x


def _bytes(x: Array) -> Array:
    return x.reshape(-1).view(np.uint8)


def _loaded_libmpi() -> str:
    """Path of the MPI library already mapped into this process (mpi4py's)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line and "/" in line}
    except OSError:
        paths = set()
    for path in sorted(paths):
        name = os.path.basename(path)
        if name.startswith(("libmpi.so", "libmpi.dylib")):
            return path
    raise DistributedError(
        "the C backend calls MPI from generated code and looks for the libmpi that mpi4py "
        "loaded in /proc/self/maps, but found none; use backend='numpy' for collectives here"
    )


_WORLD: Communicator | None = None
_LOCK = threading.Lock()


def world() -> Communicator:
    """Every process of this job (``MPI.COMM_WORLD``), or this process alone when no launcher
    started it. The first call with more than one process installs the failure policy
    (a raising process aborts the job; see the module docstring).

    Example:
        >>> comm = sg.distributed.world(); comm.rank, comm.size
        (0, 1)
    """
    global _WORLD
    with _LOCK:
        if _WORLD is None:
            if launched_size() > 1 or os.environ.get("SHAPEGRAD_FORCE_MPI"):
                mpi_comm = MPICommunicator()
                if mpi_comm.size > 1:
                    install_abort_on_error(mpi_comm)
                _WORLD = mpi_comm
            else:
                _WORLD = LocalCommunicator()
        return _WORLD


def rank() -> int:
    """This process's rank in :func:`world`."""
    return world().rank


def size() -> int:
    """The number of processes in :func:`world`."""
    return world().size


def is_main() -> bool:
    """True on rank 0 (the process that prints, plots and writes checkpoints)."""
    return world().rank == 0


def install_abort_on_error(comm: Communicator) -> None:
    """Make an uncaught exception in this process end the whole job (``MPI_Abort``).

    Without this, the other processes would wait forever in their next collective.
    The traceback is printed first, prefixed by the rank, so the job's output says
    which process failed and why.
    """
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)
            return
        text = "".join(traceback.format_exception(kind, value, tb))
        prefix = f"[rank {comm.rank}/{comm.size}] "
        sys.stderr.write("".join(prefix + line + "\n" for line in text.rstrip().splitlines()))
        sys.stderr.write(
            f"{prefix}shapegrad: rank {comm.rank} failed; aborting all {comm.size} processes\n"
        )
        _abort_after_output(comm)

    sys.excepthook = hook


def _abort_after_output(comm: Communicator) -> None:
    """``MPI_Abort`` once the message is out: the launcher forwards each process's output
    through its own pipes and tears them down on abort, so give it a moment first."""
    sys.stdout.flush()
    sys.stderr.flush()
    time.sleep(0.5)
    comm.abort(1)
