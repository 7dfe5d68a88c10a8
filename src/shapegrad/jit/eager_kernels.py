"""Native kernels for the eager interpreter: the provider behind ``ops/kernels.py``.

A composite marked ``_fused.eager_kernel`` asks, per call, for its kernel at the call's
key (composite, static arguments, operand shapes and dtypes). The kernel is the
composite itself through ``sg.compile(backend="c")``: traced into a graph, optimized,
lowered to the loop IR and rendered by the C backend, so it is the same code a compiled
model runs, and its artifact is cached on disk under the C backend's rules (keyed by
content; a later process traces and loads it, no C compiler run). The VJP is compiled the
same way (``sg.vjp`` of the composite, only the operands that need a cotangent; the
passes drop what the VJP does not use) the first time a backward pass asks for it.

Costs and policy: a cold compile is 0.3-1.2 s per kernel on the 2-core AMD EPYC dev box
(cc dominates; a warm one is a trace plus a manifest hit, tens of ms), so a key is compiled
only once it has been seen :data:`COMPILE_AFTER` times: a training loop's ops repeat every
step, a one-off call never pays. A key whose compile fails (a composite the C backend
cannot lower, a bad argument that the composite itself rejects) is declined for good and
runs on NumPy; no C compiler at all declines every key.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from shapegrad import autodiff, tree
from shapegrad.backends.base import Array, BackendUnavailable
from shapegrad.compiler.graphkey import Unkeyable, canonical_text
from shapegrad.ir import freeze_attrs
from shapegrad.jit import compile as sg_compile
from shapegrad.ops import kernels, prims
from shapegrad.ops.protocol import Attrs, AVal, Prim

# The n-th sighting of a key compiles it (earlier ones run on NumPy).
COMPILE_AFTER = 2
# Kernels kept at once; beyond it the oldest go (each holds a loaded library and its arena,
# tens of MB for a large convolution's patches). A training loop uses tens of keys.
MAX_ENTRIES = 256
_DECLINED = "declined"


def _ready(array: Any) -> Array:
    """``array`` as the C-contiguous NumPy array a compiled call takes (views copied)."""
    a = np.asarray(array)
    return a if a.flags.c_contiguous else a.copy(order="C")


class _Kernel:
    """One composite at one key: its forward executable and its VJPs by ``needs``."""

    def __init__(
        self, fn: Callable[..., Any], avals: Sequence[AVal], lowered: Any, name: str
    ) -> None:
        self.fn = fn
        self.name = name
        self.avals = list(avals)
        forward = lowered.executable
        outputs = forward.graph.outputs
        self.single = len(outputs) == 1 and lowered.out_treedef.kind == "leaf"
        self.out: AVal = outputs[0].aval
        self.rebuild = tree.unflattener(lowered.out_treedef)
        self._forward = forward
        self._backward: dict[tuple[bool, ...], Any | None] = {}
        self._lock = threading.Lock()  # an executable's I/O table is not reentrant

    def forward(self, arrays: Sequence[Any]) -> list[Any]:
        inputs = [_ready(a) for a in arrays]
        with self._lock:
            outs: list[Any] = self._forward.run_validated(inputs)
        return outs

    def backward(
        self, arrays: Sequence[Any], cotangent: Any, needs: tuple[bool, ...]
    ) -> list[Any] | None:
        if needs not in self._backward:  # None: declined (the caller differentiates in Python)
            self._backward[needs] = _compile_vjp(self.fn, self.avals, self.out, needs, self.name)
        exe = self._backward[needs]
        if exe is None:
            return None
        inputs = [_ready(a) for a in arrays] + [_ready(cotangent)]
        with self._lock:
            outs = iter(exe.run_validated(inputs))
        return [next(outs) if need else None for need in needs]


def _lower(fn: Callable[..., Any], avals: Sequence[AVal], name: str) -> Any:
    """The C ``Lowered`` of ``fn`` at ``avals`` (traced from zeros of those types)."""
    examples = [np.zeros(a.shape, a.dtype.numpy) for a in avals]
    return sg_compile(fn, backend="c", name=name).lower(*examples)


def _compile_vjp(
    fn: Callable[..., Any], avals: Sequence[AVal], out: AVal, needs: tuple[bool, ...], name: str
) -> Any | None:
    """The executable of ``(operands..., cotangent) -> cotangents of the needed operands``."""
    wanted = [i for i, need in enumerate(needs) if need]
    if not wanted:
        return None
    n = len(avals)

    def vjp_of(*args: Any) -> tuple[Any, ...]:
        operands, ct = list(args[:n]), args[n]

        def part(*needed: Any) -> Any:
            full = list(operands)
            for i, t in zip(wanted, needed, strict=True):
                full[i] = t
            return fn(*full)

        _, pull = autodiff.vjp(part, *[operands[i] for i in wanted])
        return tuple(pull(ct))

    try:
        return _lower(vjp_of, [*avals, out], f"{name}_vjp").executable
    except Exception:  # a VJP the backend cannot build: differentiate in Python instead
        return None


class CKernels:
    """The C backend as the eager interpreter's kernel provider (``kernels.install``)."""

    def __init__(self, compile_after: int = COMPILE_AFTER) -> None:
        self.compile_after = compile_after
        self._seen: dict[Hashable, int] = {}
        self._entries: dict[Hashable, _Kernel | str] = {}
        self._lock = threading.Lock()
        self.unavailable: str | None = None  # why the C backend cannot run, once known
        self.compiles = 0  # kernels built (forward ones), for tests and benchmarks
        self.calls = 0  # forward calls answered with a kernel
        # why keys were declined ("name: error"), the latest few: a silent NumPy fallback
        # is only slower, so this is where to look when eager code is unexpectedly slow
        self.declined: list[str] = []

    def composite(
        self, key: Hashable, fn: Callable[..., Any], inputs: Sequence[AVal], name: str
    ) -> _Kernel | None:
        entry = self._entries.get(key)
        if entry is None:
            if self.unavailable is not None:
                return None
            with self._lock:
                seen = self._seen[key] = self._seen.get(key, 0) + 1
                if seen < self.compile_after:
                    if len(self._seen) > 4 * MAX_ENTRIES:
                        self._seen.clear()
                    return None
                entry = self._build(fn, inputs, name)
                while len(self._entries) >= MAX_ENTRIES:  # the oldest first (insertion order)
                    del self._entries[next(iter(self._entries))]
                self._entries[key] = entry
        if type(entry) is str:
            return None
        self.calls += 1
        return entry  # type: ignore[return-value]

    def primitive(self, prim: Prim, inputs: Sequence[AVal], attrs: Attrs) -> _Kernel | None:
        try:  # by content: a SCAN's body is a new object at every trace of the loop
            text = canonical_text(freeze_attrs(attrs))
        except Unkeyable:
            return None
        key = ("primitive", prim.value, text, tuple((a.shape, a.dtype.name) for a in inputs))

        def one_op(*operands: Any) -> Any:
            return prims.bind(prim, list(operands), None, **attrs)

        return self.composite(key, one_op, inputs, prim.value)

    def _build(self, fn: Callable[..., Any], inputs: Sequence[AVal], name: str) -> _Kernel | str:
        try:
            lowered = _lower(fn, inputs, name)
        except BackendUnavailable as exc:
            self.unavailable = str(exc)
            return self._decline(name, exc)
        except Exception as exc:  # anything the composite or backend raises: the NumPy
            return self._decline(name, exc)  # path runs it and raises the user-facing error
        if not lowered.executable.graph.outputs:
            return self._decline(name, ValueError("no outputs"))
        self.compiles += 1
        return _Kernel(fn, inputs, lowered, name)


    def _decline(self, name: str, exc: BaseException) -> str:
        self.declined = [*self.declined[-15:], f"{name}: {type(exc).__name__}: {exc}"]
        return _DECLINED


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
