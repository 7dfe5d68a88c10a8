"""Loading a compiled program with cffi (ABI mode) and calling it from Python.

The I/O table (``void *io[]``) is built once: input slots first (in graph
input order), then outputs, then constants. Temps live in one arena owned by
the executable. Persistent state (inputs that an output updates, see
``Graph.aliases``) lives in buffers owned by the executable.

Two ways to call:

* ``exe(inputs)`` — the :class:`~shapegrad.backends.base.Executable` protocol:
  copies state inputs into the owned state buffers, runs once, returns fresh
  arrays (state outputs are copies). Never mutates the caller's arrays.
* ``bound = exe.bind(state)`` — the
  :class:`~shapegrad.backends.base.BoundExecutable` protocol, the fast path for
  training loops (one live binding per executable: a new ``bind`` copies new
  state in and takes over): the state is copied in once; ``bound.step(*batch)``
  (or ``bound(*batch)``) passes only the non-state inputs (pointer updates, no
  allocation) and returns the non-state outputs in **reused** arrays that the
  next call overwrites; ``bound.run_steps(*stacked)`` runs ``K`` steps in one
  native call (``sg_run_steps``) on inputs stacked ``[K, ...]`` and returns
  outputs stacked ``[K, ...]``; ``bound.state`` are the live state arrays.

An executable is not re-entrant (one arena): do not call it from two threads.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shapegrad.backends.base import (
    Array,
    StateLayout,
    explain_input_mismatch,
    lazy_ffi,
    validate_inputs,
)
from shapegrad.backends.c import nodestate
from shapegrad.backends.c.manifest import RuntimeInfo
from shapegrad.compiler import loops as L
from shapegrad.distributed import DistributedError
from shapegrad.dtypes import DTypeError
from shapegrad.ir import Graph
from shapegrad.shapes import ShapeError, fmt

_CDEF = """
int sg_run(void **io, char *arena);
int sg_run_steps(void **io, char *arena, int64_t k, const int64_t *step, int64_t *done);
extern const char sg_key[];
void sg_set_threads(int n, int adaptive);
extern double sg_profile[];
int sg_mpi_bind(void **fns, const int64_t *handles, const int64_t *comms);
int sg_shm_bind(int comm, int n, int me, void **segments, double limit);
"""

ffi = lazy_ffi(_CDEF)  # the shared cffi FFI (ABI mode)


_LIBS: dict[str, Any] = {}


def load_library(path: str, key: str) -> Any:
    """``dlopen`` ``path`` and check its embedded key; returns the cffi library."""
    if key in _LIBS:
        return _LIBS[key]
    configure_openmp_waiting()
    lib = ffi().dlopen(path)
    pin_openmp_runtime()
    found = ffi().string(lib.sg_key).decode()
    if found != key:
        raise OSError(f"{path}: key {found!r} does not match {key!r}")
    lib.sg_set_threads(num_threads(), adaptive_threads())
    _LIBS[key] = lib
    return lib


def num_threads() -> int:
    """Threads for OpenMP loops and split BLAS products: ``$SHAPEGRAD_NUM_THREADS``, else
    ``$OMP_NUM_THREADS`` (its first entry), else the CPUs this process may run on.

    OpenBLAS itself always runs single-threaded: large products are split into row
    blocks by the generated code, one block per OpenMP thread. Measured on the shared
    2-core box: OpenBLAS's own 2-thread pool made the 784-512-512-10 step 5-6x *slower*
    under load (threads spin at barriers while descheduled); the split keeps 2 threads
    at 1.3-1.8x faster than 1 on the CNN and MLP steps when the machine is quiet.
    ``SHAPEGRAD_NUM_THREADS=1`` (or ``OMP_NUM_THREADS=1``) turns threading off.
    """
    try:
        default = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        default = os.cpu_count() or 1
    for variable in ("SHAPEGRAD_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").split(",")[0].strip()
        if value:
            try:
                return max(1, int(value))
            except ValueError:
                continue
    return default


def adaptive_threads() -> int:
    """1 unless ``$SHAPEGRAD_ADAPTIVE_THREADS`` is ``0``: each step's OpenMP region then
    runs with the full team or one thread, whichever was faster over recent calls (see
    ``render.py``'s prelude). Set it to 0 to always use the full team (timing studies)."""
    return 0 if os.environ.get("SHAPEGRAD_ADAPTIVE_THREADS", "").strip() == "0" else 1


# The OpenMP runtimes a compiled library may load (gcc's, LLVM's, Intel's), by soname.
OPENMP_RUNTIMES = ("libgomp.so.1", "libomp.so", "libomp.so.5", "libiomp5.so")
_PINNED: list[tuple[str, ctypes.CDLL]] = []


def pin_openmp_runtime() -> None:
    """Keep the OpenMP runtime a compiled library loaded mapped until the process ends.

    At interpreter exit cffi closes the compiled libraries; when the last one goes, the
    dynamic linker unmaps libgomp too, while its idle worker threads may still be running
    its code: with ``OMP_WAIT_POLICY=active`` (or a large ``GOMP_SPINCOUNT``) they spin
    in it, and the process died of SIGSEGV after its last line had run. Opening the
    runtime again with ``RTLD_NOLOAD | RTLD_NODELETE`` (only if it is already loaded)
    marks it never to be unloaded. Once per runtime; a runtime that is not loaded, or a
    platform without these flags, is skipped."""
    noload, nodelete = getattr(os, "RTLD_NOLOAD", 0), getattr(os, "RTLD_NODELETE", 0)
    if not (noload and nodelete):
        return
    flags = noload | nodelete
    pinned = {name for name, _ in _PINNED}
    for name in OPENMP_RUNTIMES:
        if name in pinned:
            continue
        try:
            _PINNED.append((name, ctypes.CDLL(name, mode=flags | os.RTLD_LAZY)))
        except OSError:  # not loaded in this process
            continue


def configure_openmp_waiting() -> None:
    """Bound how long idle OpenMP threads spin before they sleep (``GOMP_SPINCOUNT=2000``,
    a few microseconds) unless the user chose a policy (``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT`` set).

    libgomp reads the policy once, when it is first loaded, so this runs before the first
    compiled library is opened; it applies to the whole process (other libraries using
    libgomp too). Why: a spinning thread that the OS deschedules stalls every parallel
    region, while a thread that sleeps at once pays a wake-up per region. Measured on the
    2-core box, MLP 784-512-512-10 b128 step (``benchmarks/train_step.py --cell "C 1-step"
    mlp``, interleaved runs): quiet, libgomp's default spinning 2.21-2.34 ms, spin count
    2000 2.47-2.65 ms, passive 2.66-3.44 ms; with two busy processes, spin count 2000
    4.2-4.3 ms, passive 3.9-5.3 ms, spin count 20000 6.4-6.5 ms, one thread 3.5-6.7 ms; with
    load average 5-6, default spinning 128-172 ms against 3.5-26 ms for bounded or passive
    waiting.
    """
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["GOMP_SPINCOUNT"] = "2000"


class NativeError(RuntimeError):
    """A compiled program reported an error code it has no better exception for."""


class NativeIndexError(IndexError):
    """A gather/scatter index was out of range (checked in C before any access)."""


def _aligned_empty(nbytes: int) -> Array:
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start : start + nbytes]


class CExecutable:
    """A compiled graph; see the module docstring for the calling conventions."""

    def __init__(
        self,
        graph: Graph,
        info: RuntimeInfo,
        lib: Any,
        source_path: str,
        program: L.Program | Callable[[], L.Program],
    ) -> None:
        """``info`` is everything the calls need; ``program`` is the lowered program, or a
        function that lowers it again when asked for (an executable loaded from a
        manifest never lowered it; only ``exe.program`` introspection needs it)."""
        self.graph = graph
        self.info = info
        self.lib = lib
        self.source_path = source_path
        # Seconds per backend phase of this executable's compile (set by the backend:
        # lower/render/cc/load, or manifest/load for a keyed-cache hit).
        self.phase_seconds: dict[str, float] = {}
        self._program = program if isinstance(program, L.Program) else None
        self._relower = None if isinstance(program, L.Program) else program
        f = ffi()
        self.n_slots = info.n_slots
        self._io = f.new("void *[]", max(self.n_slots, 1))
        self._keep: list[Any] = []
        self.arena = _aligned_empty(max(info.arena_bytes, 64))
        self._arena_ptr = f.cast("char *", self.arena.ctypes.data)
        self.layout = StateLayout.of(graph)
        if dict(self.layout.state_updates) != info.state_of_output:  # one source of truth
            raise AssertionError(f"{info.name}: lowering changed the state aliases")
        self.state_inputs = list(self.layout.state_inputs)
        # data parallel: the communicator whose node may keep the state once, and the
        # block holding it once a binding placed it there (backends/c/nodestate.py)
        self.node_comm: Any = None
        self.node_block: tuple[Any, dict[int, Array]] | None = None
        if info.shard_flag >= 0:
            self.arena[info.shard_flag : info.shard_flag + 4] = 0  # sharding off
        self.state: dict[int, Array] = {}
        for i in self.state_inputs:
            node = graph.inputs[i]
            self.state[i] = np.zeros(node.shape, node.aval.dtype.numpy)
            self._set(i, self.state[i])
        for slot, value in info.constants:
            array = np.ascontiguousarray(value)
            self._keep.append(array)
            self._set(slot, array)
        self.batch_inputs = list(self.layout.batch_inputs)
        self._bound: BoundStep | None = None  # the latest bind(); it owns the output slots
        self.free_outputs = list(self.layout.free_outputs)
        self._out_slot = {k: info.output_slots[k] for k in self.free_outputs}
        # run_validated's hot-path data: pinned buffers by slot, last input objects by index.
        self._pin = f.from_buffer
        self._in_keep: list[Any] = [None] * max(self.n_slots, 1)
        self._in_last: list[Any] = [None] * len(graph.inputs)
        self._out_specs = [
            (node.shape, node.aval.dtype.numpy, self._out_slot.get(k, -1))
            for k, node in enumerate(graph.outputs)
        ]

    @property
    def program(self) -> L.Program:
        """The lowered program (lowered again on first access when loaded from a manifest)."""
        if self._program is None:
            assert self._relower is not None
            self._program = self._relower()
        return self._program

    @property
    def budget(self) -> tuple[int, int, int]:
        """(arena bytes, kernels, layer loops) of the program (``Compiled.stats``)."""
        return self.info.budget

    def _set(self, slot: int, array: Array) -> None:
        self._io[slot] = ffi().cast("void *", array.ctypes.data)

    def _check(self, rc: int, step: int | None = None, steps: int = 1) -> None:
        """Raise the error the program recorded (the error-flag contract), if any.

        In a ``K``-step run, ``step`` is the failing step: steps before it are complete
        (state updated, outputs written); it and later steps did not happen when the bad
        index is a program input (checked before any kernel), see ``Program.errors``.
        """
        if not rc:
            return
        name = self.info.name
        known = self.info.errors.get(rc)
        text = f"compiled {name}: {known}" if known else f"compiled {name}: native error code {rc}"
        if step is not None:
            done = f"steps 0..{step - 1} were applied" if step else "no step was applied"
            text += f"; at step {step} of {steps} ({done}"
            if self._checked_first(rc):
                text += f", step {step} changed nothing)"
            else:
                text += f", step {step} may have updated part of the state)"
        if known is None:
            raise NativeError(text)
        if rc in self.info.collective_codes:
            raise DistributedError(text)  # the MPI call of a collective failed
        raise NativeIndexError(text)

    def _checked_first(self, code: int) -> bool:
        """Whether check ``code`` runs before any kernel (an input index, hoisted)."""
        return code in self.info.hoisted_codes

    def __call__(self, inputs: Sequence[Array]) -> list[Array]:
        validate_inputs(self.graph, inputs)
        return self.run_validated(inputs)

    def run_validated(self, inputs: Sequence[Array]) -> list[Array]:
        """``__call__`` for inputs the caller has already validated (``sg.compile``'s fast path).

        An input that is the same array object as in the previous call keeps its pinned
        pointer (no re-pinning); outputs are fresh arrays every call (they are returned).
        """
        if self.node_block is not None:  # every rank copies its state in: a copy each
            nodestate.unplace(self)
        for i in self.state_inputs:
            np.copyto(self.state[i], inputs[i])
        io, pin, keep, last = self._io, self._pin, self._in_keep, self._in_last
        if self._bound is not None:  # a bound step rewrites the input slots: never trust them
            last[:] = [None] * len(last)
        for i in self.batch_inputs:
            a = inputs[i]
            if a is not last[i]:
                keep[i] = pin(a)
                io[i] = keep[i]
                last[i] = a
        outs: list[Array] = []
        for shape, dtype, slot in self._out_specs:
            out = np.empty(shape, dtype)
            outs.append(out)
            if slot >= 0:
                keep[slot] = pin(out)  # the slot's pointer must outlive the call
                io[slot] = keep[slot]
        rc = self.lib.sg_run(io, self._arena_ptr)
        if self._bound is not None:
            self._bound._reattach()  # the I/O table now points at this call's arrays
        self._check(rc)
        for k, i in self.info.state_of_output.items():
            np.copyto(outs[k], self.state[i])
        return outs

    def profile(self) -> list[tuple[str, str, float]]:
        """(kernel, root, seconds) accumulated so far; needs ``profile=True`` at compile time.

        Example:
            >>> exe = sg.compile(step, backend="c", profile=True).lower(*args).executable
            >>> for name, root, seconds in exe.profile(): print(name, root, seconds)
        """
        try:
            times = self.lib.sg_profile
            return [
                (name, root, float(times[i])) for i, (name, root) in enumerate(self.info.kernels)
            ]
        except (AttributeError, ffi().error) as exc:
            raise RuntimeError("compile with profile=True to collect kernel times") from exc

    def bind(self, state: Sequence[Array] | None = None) -> BoundStep:
        """The fast calling path; ``state`` holds one array per state input (in input order).

        Example:
            >>> bound = exe.bind([w, b]); loss, = bound.step(x, y); w_new = bound.state[0]
        """
        self._bound = BoundStep(self, state)
        return self._bound


class BoundStep:
    """A :class:`CExecutable` bound to its state (the ``BoundExecutable`` protocol).

    Outputs are reused between calls: what ``step``/``run_steps`` return is valid
    until the next call of either, of ``bind`` or of the executable.
    """

    def __init__(self, exe: CExecutable, state: Sequence[Array] | None) -> None:
        self.exe = exe
        # data parallel: state kept once per node, where it can be, with the current values
        # first (a write_state refused below then loses nothing)
        nodestate.place(exe)
        if state is not None:
            self.write_state(state)
        graph = exe.graph
        self._specs = [
            (
                i,
                graph.inputs[i].shape,
                graph.inputs[i].aval.dtype.numpy,
                graph.inputs[i].attr.get("name", f"in{i}"),
            )
            for i in exe.batch_inputs
        ]
        self.outputs = [
            np.empty(graph.outputs[k].shape, graph.outputs[k].aval.dtype.numpy)
            for k in exe.free_outputs
        ]
        for k, out in zip(exe.free_outputs, self.outputs, strict=True):
            exe._set(exe._out_slot[k], out)
        self._io = exe._io
        self._arena = exe._arena_ptr
        self._run = exe.lib.sg_run
        self._cast = ffi().cast
        self._pin = ffi().from_buffer
        # ids of the arrays the program writes (reused outputs, live state): an input that is
        # one of them, or a view of one, is copied before the call (see _make_call).
        self._owned = {id(a) for a in [*self.outputs, *(exe.state[i] for i in exe.state_inputs)]}
        self._keep: list[Any] = [None] * len(self._specs)
        self._last: list[Any] = [None] * len(self._specs)
        self._call = self._make_call()
        self._stacked: dict[int, list[Array]] = {}
        self._steps = ffi().new("int64_t[]", max(exe.n_slots, 1))
        self._done = ffi().new("int64_t *")

    @property
    def layout(self) -> StateLayout:
        """State/batch inputs and free outputs of the bound graph."""
        return self.exe.layout

    def write_state(self, state: Sequence[Array]) -> None:
        """Copy one array per state input into the live state (shapes checked, dtypes cast)."""
        exe = self.exe
        if len(state) != len(exe.state_inputs):
            raise TypeError(f"expected {len(exe.state_inputs)} state arrays, got {len(state)}")
        arrays = []
        for i, value in zip(exe.state_inputs, state, strict=True):
            array = np.asarray(value)
            if array.shape != exe.graph.inputs[i].shape:
                raise ShapeError(
                    "bind",
                    f"state {i} has shape {fmt(array.shape)}, expected "
                    f"{fmt(exe.graph.inputs[i].shape)}",
                )
            if not np.can_cast(array.dtype, exe.state[i].dtype, "same_kind"):
                raise DTypeError(
                    f"bind: state {i} has dtype {array.dtype}, expected {exe.state[i].dtype}"
                )
            arrays.append(array)
        if nodestate.placed(exe):
            nodestate.write(exe, dict(zip(exe.state_inputs, arrays, strict=True)))
            return
        for i, array in zip(exe.state_inputs, arrays, strict=True):  # all checked: no half write
            np.copyto(exe.state[i], array, casting="same_kind")

    def read_state(self) -> list[Array]:
        """Copies of the live state arrays, in state-input order."""
        return [np.array(a, copy=True) for a in self.state]

    @property
    def state(self) -> list[Array]:
        """The live state arrays, in state-input order (updated in place by every call)."""
        return [self.exe.state[i] for i in self.exe.state_inputs]

    def step(self, *batch: Array) -> list[Array]:
        """One step on the non-state inputs; returns the reused non-state output arrays.

        Passing the *same* array objects again (refilled in place) skips even the pointer
        lookup; any other array is checked (shape, dtype, C-contiguity) and pinned.
        """
        try:
            result: list[Array] = self._call(*batch)
        except TypeError:
            if len(batch) != len(self._specs):  # the generated call's own arity error
                names = [name for *_, name in self._specs]
                raise TypeError(
                    f"compiled step: expected {len(names)} inputs {names}, got {len(batch)}"
                ) from None
            raise
        return result

    __call__ = step

    def _reattach(self) -> None:
        """Point the output slots back at our arrays and forget cached input pointers."""
        exe = self.exe
        for k, out in zip(exe.free_outputs, self.outputs, strict=True):
            exe._set(exe._out_slot[k], out)
        for n in range(len(self._last)):
            self._last[n] = None

    def _make_call(self) -> Any:
        """A call function unrolled over the inputs (this is the µs-scale hot path)."""
        n = len(self._specs)
        args = ", ".join(f"a{i}" for i in range(n))
        lines = [f"def call({args}):"]
        for i, (slot, _shape, _dtype, _name) in enumerate(self._specs):
            lines += [
                f"    if a{i}.__class__ is not nd or a{i}.shape != s{i} or a{i}.dtype is not d{i}"
                f" or not a{i}.flags.c_contiguous:",
                f"        slow({i}, a{i})",
                f"    if a{i} is not last[{i}]:",
                # Our own output or state fed back (`(y,) = s(x); s(y)`): the program would
                # read a buffer it writes (restrict): run on a private copy instead.
                f"        if id(a{i}) in owned or id(a{i}.base) in owned:",
                f"            a{i} = a{i}.copy()",
                f"            last[{i}] = None",
                "        else:",
                f"            last[{i}] = a{i}",
                f"        keep[{i}] = pin(a{i})",
                f"        io[{slot}] = keep[{i}]",
            ]
        lines += [
            "    rc = run(io, arena)",
            "    if rc:",
            "        check(rc)",
            "    return outputs",
        ]
        env: dict[str, Any] = {
            "nd": np.ndarray,
            "slow": self._slow_check,
            "pin": self._pin,
            "io": self._io,
            "keep": self._keep,
            "last": self._last,
            "run": self._run,
            "arena": self._arena,
            "check": self.exe._check,
            "outputs": self.outputs,
            "owned": self._owned,
        }
        for i, (_slot, shape, dtype, _name) in enumerate(self._specs):
            env[f"s{i}"], env[f"d{i}"] = shape, dtype
        exec("\n".join(lines), env)  # generated from our own specs only
        return env["call"]

    def _slow_check(self, i: int, a: Any) -> None:
        """Full validation; returns normally for an equal but non-canonical dtype object."""
        _slot, shape, dtype, name = self._specs[i]
        if (
            not isinstance(a, np.ndarray)
            or a.shape != shape
            or a.dtype != dtype
            or not a.flags.c_contiguous
        ):
            explain_input_mismatch(name, a, shape, dtype)

    def run_steps(self, *stacked: Array) -> list[Array]:
        """``K`` steps in one native call; inputs and returned outputs are stacked ``[K, ...]``.

        The returned arrays are reused by the next ``run_steps`` call with the same ``K``
        (the protocol promises them only until the next call of any kind).
        """
        if len(stacked) != len(self._specs) or not stacked:
            raise TypeError(f"expected {len(self._specs)} stacked inputs, got {len(stacked)}")
        k = int(np.shape(stacked[0])[0]) if np.ndim(stacked[0]) else -1
        exe, io, steps = self.exe, self._io, self._steps
        for s in range(exe.n_slots):
            steps[s] = 0
        held: list[Array] = []  # private copies of aliased inputs, alive until the call returns
        for (slot, shape, dtype, name), a in zip(self._specs, stacked, strict=True):
            if (
                not isinstance(a, np.ndarray)
                or a.shape != (k, *shape)
                or a.dtype != dtype
                or not a.flags.c_contiguous
            ):
                explain_input_mismatch(name, a, (k, *shape), dtype)
            if id(a) in self._owned or id(a.base) in self._owned:
                a = a.copy()  # our own (stacked) output fed back: never read what we write
                held.append(a)
            io[slot] = self._cast("void *", a.ctypes.data)
            steps[slot] = a.nbytes // max(k, 1)
        outs = self._stacked.get(k)
        if outs is None:
            graph = exe.graph
            outs = [
                np.empty((k, *graph.outputs[j].shape), graph.outputs[j].aval.dtype.numpy)
                for j in exe.free_outputs
            ]
            self._stacked[k] = outs
            self._owned.update(id(o) for o in outs)
        for j, out in zip(exe.free_outputs, outs, strict=True):
            io[exe._out_slot[j]] = self._cast("void *", out.ctypes.data)
            steps[exe._out_slot[j]] = out.nbytes // max(k, 1)
        rc = exe.lib.sg_run_steps(io, self._arena, k, steps, self._done)
        for n in range(len(self._last)):
            self._last[n] = None  # input slots now point at the stacked arrays
        for j, out in zip(exe.free_outputs, self.outputs, strict=True):
            io[exe._out_slot[j]] = self._cast("void *", out.ctypes.data)
        exe._check(rc, int(self._done[0]), k)
        return outs
