"""Native kernels for the eager interpreter: the provider behind ``ops/kernels.py``.

A composite marked ``_fused.eager_kernel`` asks, per call, for its kernel at the call's
key (composite, static arguments, operand shapes and dtypes). The kernel is the
composite itself through ``sg.compile(backend="c")``: traced into a graph, optimized,
lowered to the loop IR and rendered by the C backend, so it is the same code a compiled
model runs, and its artifact is cached on disk under the C backend's rules (keyed by
content; a later process traces and loads it, no C compiler run). The VJP is compiled the
same way (``sg.vjp`` of the composite, only the operands that need a cotangent; the
passes drop what the VJP does not use) the first time a backward pass asks for it.

Costs and policy: a cold compile is 0.2-0.5 s per kernel on the 2-core AMD EPYC dev box
(the C compiler is 95% of it; a warm one is a trace plus a manifest hit, a few ms), so:

* a key is compiled only once it has been seen :data:`COMPILE_AFTER` times: a training
  loop's ops repeat every step, a one-off call never pays;
* then the call traces the composite (well under a millisecond to a few ms) and asks the
  disk cache (``Lowered.cached``): a hit is loaded at once and this call runs it; a miss
  is compiled in the background by a few daemon threads (:mod:`shapegrad.jit.background`,
  :func:`default_workers` of them, a queue of :data:`MAX_QUEUED`), while the op keeps
  running on NumPy; the first call after the compile finished runs the kernel. A VJP
  likewise: the backward that finds it missing differentiates the composite in Python
  until its kernel is ready. So eager code never waits for a C compiler, and its results
  switch from NumPy's to the kernel's (equal to the op table's tolerances) at a point that
  depends on timing; ``SHAPEGRAD_EAGER_KERNELS=sync`` (or ``CKernels(background=False)``)
  compiles in the foreground instead, and :meth:`CKernels.drain` waits for the pending
  compiles;
* a key whose compile fails (a composite the C backend cannot lower, a bad argument that
  the composite itself rejects) is declined for good and runs on NumPy, the reason in
  :attr:`CKernels.declined`; no C compiler at all declines every key;
* at most :data:`MAX_ENTRIES` kernels (ready, pending or declined) are kept.

Threads: ``composite`` and the kernels' calls may come from several Python threads at once
(a key is compiled once; an executable runs one call at a time). A forked child forgets
the compiles its parent had pending (they are requested again on the next sighting).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from shapegrad import autodiff, tree
from shapegrad.backends.base import Array, BackendUnavailable
from shapegrad.compiler.graphkey import Unkeyable, canonical_text
from shapegrad.ir import freeze_attrs
from shapegrad.jit import compile as sg_compile
from shapegrad.jit.background import Pool
from shapegrad.jit.stages import Lowered
from shapegrad.ops import kernels, prims
from shapegrad.ops.protocol import Attrs, AVal, Prim

# The n-th sighting of a key compiles it (earlier ones run on NumPy).
COMPILE_AFTER = 2
# Kernels kept at once; beyond it the oldest go (each holds a loaded library and its arena,
# tens of MB for a large convolution's patches). A training loop uses tens of keys.
MAX_ENTRIES = 256
# Compiles waiting for a worker; a key that finds the queue full stays on NumPy and asks
# again at its next sighting. A training loop's tens of keys fit; shapes that change at
# every step cannot pile up more work than this.
MAX_QUEUED = 64
# Background compiles run this much nicer than the process (Linux: the worker threads and
# the compiler processes they start), so that on a busy machine they take idle CPU rather
# than the user's (measured on the loaded 2-core box: a CNN step at 0.32 s while a compiler
# ran beside it at nice 0, 0.13 s at nice 10; NumPy alone 0.10 s). The price: there, the
# compiles take several times longer. ``SHAPEGRAD_EAGER_COMPILE_NICE`` overrides it.
NICE = 10
NICE_ENV = "SHAPEGRAD_EAGER_COMPILE_NICE"
_DECLINED = "declined"


def default_workers() -> int:
    """Background compiles at once: one per 4 CPUs this process may use, 1 to 4. Users'
    machines are busy, and each compile is a C compiler process beside their work."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus // 4))


def _nice() -> int:
    value = os.environ.get(NICE_ENV, "").strip()
    if not value:
        return NICE
    try:
        return max(0, int(value))
    except ValueError:
        raise ValueError(
            f"{NICE_ENV}={value!r}: expected a whole number, how much nicer than the process "
            f"background compiles run (0 to 19; default {NICE})"
        ) from None


class _Pending:
    """The entry of a key (or VJP) whose compile is queued or running."""

    __slots__ = ()


_PENDING = _Pending()
_MISSING = object()


def _ready(array: Any) -> Array:
    """``array`` as the C-contiguous NumPy array a compiled call takes (views copied)."""
    a = np.asarray(array)
    return a if a.flags.c_contiguous else a.copy(order="C")


class _Kernel:
    """One composite at one key: its forward executable and its VJPs by ``needs``."""

    def __init__(
        self,
        provider: CKernels,
        fn: Callable[..., Any],
        avals: Sequence[AVal],
        lowered: Lowered,
        name: str,
    ) -> None:
        self.provider = provider
        self.fn = fn
        self.name = name
        self.avals = list(avals)
        forward = lowered.executable
        outputs = forward.graph.outputs
        self.single = len(outputs) == 1 and lowered.out_treedef.kind == "leaf"
        self.out: AVal = outputs[0].aval
        self.rebuild = tree.unflattener(lowered.out_treedef)
        self._forward = forward
        # needs -> executable, None (declined: differentiate in Python) or _PENDING
        self._backward: dict[tuple[bool, ...], Any] = {}
        self._lock = threading.Lock()  # an executable's I/O table is not reentrant
        self.calls = 0  # forward calls run (counted under the lock: exact with threads)
        self.vjp_calls = 0  # backward calls run by a VJP kernel

    def forward(self, arrays: Sequence[Any]) -> list[Any]:
        inputs = [_ready(a) for a in arrays]
        with self._lock:
            outs: list[Any] = self._forward.run_validated(inputs)
            self.calls += 1
        return outs

    def backward(
        self, arrays: Sequence[Any], cotangent: Any, needs: tuple[bool, ...]
    ) -> list[Any] | None:
        exe = self._backward.get(needs, _MISSING)
        if exe is _MISSING:
            exe = self.provider._vjp(self, needs)
        if exe is None or exe is _PENDING:  # the caller differentiates in Python
            return None
        inputs = [_ready(a) for a in arrays] + [_ready(cotangent)]
        with self._lock:
            outs = iter(exe.run_validated(inputs))
            self.vjp_calls += 1
        return [next(outs) if need else None for need in needs]

    def _after_fork(self) -> None:
        self._lock = threading.Lock()
        for needs in [k for k, v in self._backward.items() if v is _PENDING]:
            del self._backward[needs]


def _trace(fn: Callable[..., Any], avals: Sequence[AVal], name: str) -> Lowered:
    """The C ``Lowered`` of ``fn`` at ``avals`` (traced from zeros of those types), not
    compiled yet."""
    examples = [np.zeros(a.shape, a.dtype.numpy) for a in avals]
    lowered: Lowered = sg_compile(fn, backend="c", name=name).trace(*examples).lower()
    return lowered


def _vjp_function(
    fn: Callable[..., Any], n: int, needs: tuple[bool, ...]
) -> Callable[..., tuple[Any, ...]]:
    """``(operands..., cotangent) -> cotangents of the needed operands`` of ``fn``."""
    wanted = [i for i, need in enumerate(needs) if need]

    def vjp_of(*args: Any) -> tuple[Any, ...]:
        operands, ct = list(args[:n]), args[n]

        def part(*needed: Any) -> Any:
            full = list(operands)
            for i, t in zip(wanted, needed, strict=True):
                full[i] = t
            return fn(*full)

        _, pull = autodiff.vjp(part, *[operands[i] for i in wanted])
        return tuple(pull(ct))

    return vjp_of


class CKernels:
    """The C backend as the eager interpreter's kernel provider (``kernels.install``).

    ``background`` (default: unless ``SHAPEGRAD_EAGER_KERNELS=sync``) compiles cache misses
    on ``workers`` daemon threads (default :func:`default_workers`) while the op runs on
    NumPy; False compiles them in the calling thread, which then runs the kernel.
    """

    def __init__(
        self,
        compile_after: int = COMPILE_AFTER,
        *,
        background: bool | None = None,
        workers: int | None = None,
    ) -> None:
        self.compile_after = compile_after
        self.background = not kernels.synchronous() if background is None else background
        self._seen: dict[Hashable, int] = {}
        self._entries: dict[Hashable, _Kernel | _Pending | str] = {}
        self._lock = threading.Lock()
        self._pool = Pool(
            workers or default_workers(), MAX_QUEUED, "sg-eager-cc", self._escaped, _nice()
        )
        self.unavailable: str | None = None  # why the C backend cannot run, once known
        self.compiles = 0  # kernels built (forward ones, here or in the background)
        self.cache_loads = 0  # of those, loaded from the disk cache (no C compiler run)
        self._retired = [0, 0]  # calls and vjp_calls of kernels dropped (MAX_ENTRIES)
        # why keys were declined ("name: error"), the latest few: a silent NumPy fallback
        # is only slower, so this is where to look when eager code is unexpectedly slow
        self.declined: list[str] = []
        _PROVIDERS.add(self)

    # --- the provider protocol ------------------------------------------------------------

    def composite(
        self,
        key: Hashable,
        fn: Callable[..., Any],
        inputs: Sequence[AVal],
        name: str,
        needs: tuple[bool, ...] | None = None,
    ) -> _Kernel | None:
        entry = self._entries.get(key)
        if type(entry) is _Kernel:
            return self._answer(entry, needs)
        if entry is not None or self.unavailable is not None:
            return None  # declined, or compiling in the background
        with self._lock:
            if key in self._entries:  # another thread got here first
                return None
            seen = self._seen[key] = self._seen.get(key, 0) + 1
            if seen < self.compile_after:
                if len(self._seen) > 4 * MAX_ENTRIES:
                    self._seen.clear()
                return None
            self._store(key, _PENDING)
        kernel = self._start(key, fn, inputs, name, needs)
        return None if kernel is None else self._answer(kernel, needs)

    def compiling(self, key: Hashable, needs: tuple[bool, ...] | None = None) -> bool:
        entry = self._entries.get(key)
        if type(entry) is _Kernel:
            return needs is not None and entry._backward.get(needs) is _PENDING
        return entry is _PENDING

    def _answer(self, kernel: _Kernel, needs: tuple[bool, ...] | None) -> _Kernel | None:
        """``kernel`` (counted) when it can serve the call: an untracked one, or one whose
        VJP for ``needs`` is ready (or declined: the Python VJP). While that VJP compiles
        the call runs as written: the kernel's forward plus the composite's Python VJP
        (which runs the forward again) would cost more than the NumPy path."""
        if needs is not None and kernel.single:  # (several outputs: no tape node, no VJP)
            exe = kernel._backward.get(needs, _MISSING)
            if exe is _MISSING:
                exe = self._vjp(kernel, needs)
            if exe is _PENDING:
                return None
        return kernel

    def primitive(self, prim: Prim, inputs: Sequence[AVal], attrs: Attrs) -> _Kernel | None:
        try:  # by content: a SCAN's body is a new object at every trace of the loop
            text = canonical_text(freeze_attrs(attrs))
        except Unkeyable:
            return None
        key = ("primitive", prim.value, text, tuple((a.shape, a.dtype.name) for a in inputs))

        def one_op(*operands: Any) -> Any:
            return prims.bind(prim, list(operands), None, **attrs)

        return self.composite(key, one_op, inputs, prim.value)

    # --- counters (tests, benchmarks) and waiting for the background ------------------------

    @property
    def calls(self) -> int:
        """Forward calls run by a kernel."""
        return self._retired[0] + sum(k.calls for k in self._kernels())

    @property
    def vjp_calls(self) -> int:
        """Backward calls run by a VJP kernel."""
        return self._retired[1] + sum(k.vjp_calls for k in self._kernels())

    def _kernels(self) -> list[_Kernel]:
        with self._lock:
            return [e for e in self._entries.values() if type(e) is _Kernel]

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until no compile is queued or running (then the next call of each compiled
        key runs its kernel); False when ``timeout`` seconds passed first."""
        return self._pool.drain(timeout)

    def pending(self) -> int:
        """Compiles queued or running in the background."""
        return self._pool.pending()

    # --- building -------------------------------------------------------------------------

    def _start(
        self,
        key: Hashable,
        fn: Callable[..., Any],
        inputs: Sequence[AVal],
        name: str,
        needs: tuple[bool, ...] | None,
    ) -> _Kernel | None:
        """Trace ``fn`` and load its kernel from the disk cache, or compile it (here or in
        the background, with its VJP for ``needs`` when the call is tracked: the kernel is
        published with it); the kernel when it is ready now."""
        lowered = self._traced(fn, inputs, name)
        if lowered is None:
            self._settle(key, _PENDING, _DECLINED)
            return None

        def finish(with_vjp: bool) -> _Kernel | None:
            entry = self._build(lowered, fn, inputs, name)
            if type(entry) is _Kernel and with_vjp and needs is not None:
                self._vjp(entry, needs, here=True)
            self._settle(key, _PENDING, entry)
            return entry if type(entry) is _Kernel else None

        if lowered.from_cache or not self.background:
            return finish(with_vjp=False)  # the caller asks for the VJP (the cache may hold it)
        if not self._pool.submit(lambda: finish(with_vjp=True)):  # full: ask again later
            self._settle(key, _PENDING, None)
        return None

    def _vjp(self, kernel: _Kernel, needs: tuple[bool, ...], here: bool = False) -> Any:
        """The VJP executable of ``kernel`` for ``needs`` when it is ready now (from the
        disk cache, or compiled in this thread: synchronous mode or ``here``), else None
        (declined: the caller differentiates in Python) or ``_PENDING`` (compiling)."""
        if not any(needs) or self.unavailable is not None:
            kernel._backward[needs] = None
            return None
        with self._lock:
            if needs in kernel._backward:  # another thread got here first
                return kernel._backward[needs]
            kernel._backward[needs] = _PENDING
        n = len(kernel.avals)
        name = f"{kernel.name}_vjp"
        vjp_of = _vjp_function(kernel.fn, n, needs)
        lowered = self._traced(vjp_of, [*kernel.avals, kernel.out], name)

        def finish() -> Any:
            exe = None
            if lowered is not None:
                try:
                    exe = lowered.compile()
                except Exception as exc:  # a VJP the backend cannot build: differentiate
                    self._decline(name, exc)  # in Python instead
            kernel._backward[needs] = exe
            return exe

        if lowered is None or lowered.from_cache or not self.background or here:
            return finish()
        if not self._pool.submit(finish):  # full: ask again later
            del kernel._backward[needs]
        return _PENDING

    def _traced(
        self, fn: Callable[..., Any], inputs: Sequence[AVal], name: str
    ) -> Lowered | None:
        """``fn`` traced at ``inputs``, with its executable loaded when the disk cache holds
        it; None (the reason recorded) when that fails."""
        try:
            lowered = _trace(fn, inputs, name)
            lowered.cached()
        except BackendUnavailable as exc:
            self.unavailable = str(exc)
            self._decline(name, exc)
            return None
        except Exception as exc:  # anything the composite or backend raises: the NumPy
            self._decline(name, exc)  # path runs it and raises the user-facing error
            return None
        return lowered

    def _build(
        self, lowered: Lowered, fn: Callable[..., Any], inputs: Sequence[AVal], name: str
    ) -> _Kernel | str:
        """The kernel of a traced composite (compiled now unless loaded from the cache)."""
        try:
            exe = lowered.compile()
        except BackendUnavailable as exc:
            self.unavailable = str(exc)
            return self._decline(name, exc)
        except Exception as exc:
            return self._decline(name, exc)
        if not exe.graph.outputs:
            return self._decline(name, ValueError("no outputs"))
        with self._lock:
            self.compiles += 1
            self.cache_loads += lowered.from_cache
        return _Kernel(self, fn, inputs, lowered, name)

    def _store(self, key: Hashable, entry: _Kernel | _Pending | str) -> None:
        """Set ``key``'s entry, dropping the oldest beyond ``MAX_ENTRIES`` (lock held)."""
        if key not in self._entries:
            while len(self._entries) >= MAX_ENTRIES:  # the oldest first (insertion order)
                old = self._entries.pop(next(iter(self._entries)))
                if type(old) is _Kernel:
                    self._retired[0] += old.calls
                    self._retired[1] += old.vjp_calls
        self._entries[key] = entry

    def _settle(self, key: Hashable, was: _Pending, entry: _Kernel | str | None) -> None:
        """``key``'s compile ended: its entry becomes ``entry`` (None: forget the key and its
        sightings), unless it was dropped meanwhile (then the result is dropped too)."""
        with self._lock:
            if self._entries.get(key) is not was:
                return
            if entry is None:
                del self._entries[key]
                self._seen.pop(key, None)
            else:
                self._entries[key] = entry

    def _decline(self, name: str, exc: BaseException) -> str:
        with self._lock:
            self.declined = [*self.declined[-15:], f"{name}: {type(exc).__name__}: {exc}"]
        return _DECLINED

    def _escaped(self, exc: BaseException) -> None:
        """A background job's exception that its own handlers missed (a bug): recorded."""
        self._decline("background compile", exc)

    def _after_fork(self) -> None:
        """In a forked child: the parent's pending compiles are gone (their keys are asked
        again at their next sighting); locks held by parent threads at the fork are new."""
        self._lock = threading.Lock()
        for key in [k for k, v in self._entries.items() if v is _PENDING]:
            del self._entries[key]
        for entry in self._entries.values():
            if type(entry) is _Kernel:
                entry._after_fork()


_PROVIDERS: weakref.WeakSet[CKernels] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for provider in list(_PROVIDERS):
        provider._after_fork()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)

_PROVIDER: list[CKernels] = []


def install() -> CKernels:
    """Install a fresh C provider (no cost now: a missing C compiler is found by the first
    compile, which then declines every key)."""
    provider = CKernels()
    _PROVIDER[:] = [provider]
    kernels.install(provider)
    return provider


def installed() -> CKernels | None:
    """The installed C provider (None when none was installed)."""
    return _PROVIDER[0] if _PROVIDER else None
