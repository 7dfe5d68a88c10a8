"""The Backend protocol every executor of a Graph implements, and the backend registry.

A backend turns an optimized :class:`~shapegrad.ir.Graph` into an
:class:`Executable`: a callable taking one NumPy array per ``graph.inputs``
entry (in order) and returning one new array per ``graph.outputs`` entry.
``sg.compile`` only knows backends by name; each backend module registers a
factory here, and :func:`get_backend` imports ``shapegrad.backends.<name>``
lazily, so optional toolchains (a C compiler, pycuda, coremltools) are only
touched when asked for.

Every executable validates its buffers with :func:`validate_inputs` before
native code runs ("compiled code never trusts its caller").

Bound, stateful execution
-------------------------
A graph traced with ``donate_argnums`` carries ``graph.aliases``: outputs that
are the updated values of inputs (parameters, optimizer moments, loss-scale
counters). A backend that can keep such *state* in its own buffers across
calls offers :meth:`Executable.bind`, which returns a :class:`BoundExecutable`;
a backend that cannot (NumPy, Core ML) returns ``None`` from ``bind`` and says
so up front with ``Backend.binds_state = False``. Nobody probes attributes:
the protocol below is the whole contract. Its semantics:

* **Layout.** :class:`StateLayout` splits the graph's inputs into *state*
  (aliased, held by the binding) and *batch* (passed to every step), and its
  outputs into *state updates* (written into the state, never returned) and
  *free outputs* (returned by every step), each in graph order.
* **Bind.** ``exe.bind(state)`` copies one array per state input into the
  binding (``None`` keeps what the executable holds). An executable has at
  most one live binding: binding again, or calling the executable itself,
  invalidates earlier bindings' outputs (not their state, which is shared).
* **Step.** ``bound.step(*batch)`` validates the batch arrays (shape, dtype,
  C-contiguity: a mismatch raises ``ShapeError``/``DTypeError``/``TypeError``/
  ``ValueError`` naming the input, before any native code runs), runs one
  step that updates the state in place, and returns the free outputs.
* **K steps.** ``bound.run_steps(*stacked)`` takes every batch input stacked
  along a new first axis ``[K, ...]``, runs K steps (each sees the state the
  previous one left) and returns the free outputs stacked ``[K, ...]``. It is
  equal to K calls of ``step`` on the slices.
* **Outputs are borrowed.** The arrays ``step``/``run_steps`` return belong to
  the binding and are **valid until the next call** of ``step``, ``run_steps``,
  ``bind`` or the executable: copy what you keep.
* **State.** ``bound.state`` are the live state arrays (read them, but do not
  keep them across steps expecting old values); ``read_state()`` returns
  copies; ``write_state(arrays)`` replaces the state in place (validated).
* **Errors.** A native error (e.g. an out-of-range gather index) is recorded
  by the program and raised after the call (``IndexError`` for bad indices).
  In a K-step run the message names the failing step: the steps before it are
  complete (state updated, outputs written), later ones did not run, and the
  message says whether the failing step itself changed any state (it does not
  when the bad index is a program input, checked before any kernel).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import numpy.typing as npt

from shapegrad.backends.options import BackendOptions, NoOptions
from shapegrad.dtypes import DTypeError
from shapegrad.ir import Graph
from shapegrad.shapes import ShapeError, fmt

Array = npt.NDArray[Any]
OptionsT = TypeVar("OptionsT", bound=BackendOptions)


@dataclass(frozen=True)
class CompileOptions:
    """Settings passed from ``sg.compile`` to a backend.

    Attributes:
        name: a readable name for the compiled function (used in dumps and cache keys).
        debug_dir: where to write debug dumps (IR, generated source), or None.
        backend_options: the backend's typed options (its :class:`BackendOptions`
            subclass, e.g. ``COptions(denormals="flush")``), validated when ``sg.compile``
            was called; None means the backend's defaults.
        cache_key: the key of the traced graph being compiled (see :class:`KeyedBackend`).
    """

    name: str = "fn"
    debug_dir: str | None = None
    backend_options: BackendOptions | None = None
    # The traced graph's key (``compiler/graphkey.py``), set by ``sg.compile`` for a
    # :class:`KeyedBackend`: store what ``load_keyed`` needs to skip lowering next time.
    cache_key: str | None = None

    def of(self, kind: type[OptionsT]) -> OptionsT:
        """The backend options as ``kind`` (its defaults when none were given).

        Raises:
            TypeError: the options belong to another backend.
        """
        found = self.backend_options
        if found is None:
            return kind()
        if not isinstance(found, kind):
            raise TypeError(
                f"{kind.__name__} expected for backend {kind.backend!r}, got "
                f"{type(found).__name__} (options of backend {found.backend!r})"
            )
        return found


@dataclass(frozen=True)
class StateLayout:
    """How a bound executable splits a graph's inputs and outputs (indices in graph order).

    Attributes:
        state_inputs: inputs held by the binding (the aliased ones), ascending.
        batch_inputs: inputs passed to every step, ascending.
        state_updates: ``(output, input)`` pairs: the output is the input's new value.
        free_outputs: outputs returned by every step, ascending.
    """

    state_inputs: tuple[int, ...]
    batch_inputs: tuple[int, ...]
    state_updates: tuple[tuple[int, int], ...]
    free_outputs: tuple[int, ...]

    @classmethod
    def of(cls, graph: Graph) -> StateLayout:
        """The layout ``graph.aliases`` implies.

        Example:
            >>> StateLayout.of(graph).free_outputs   # e.g. (0, 4): the loss and the lr
        """
        updates = tuple(sorted(graph.aliases))
        state = tuple(sorted({i for _, i in updates}))
        written = {k for k, _ in updates}
        return cls(
            state,
            tuple(i for i in range(len(graph.inputs)) if i not in state),
            updates,
            tuple(k for k in range(len(graph.outputs)) if k not in written),
        )


class BoundExecutable(Protocol):
    """An executable bound to its persistent state; see "Bound, stateful execution" above."""

    @property
    def layout(self) -> StateLayout:
        """Which graph inputs are state/batch and which outputs come back."""
        ...

    @property
    def state(self) -> list[Array]:
        """The live state arrays, in ``layout.state_inputs`` order (updated in place)."""
        ...

    def step(self, *batch: Array) -> Sequence[Array]:
        """One step on the batch inputs; returns the free outputs (borrowed until the next call)."""
        ...

    def run_steps(self, *stacked: Array) -> Sequence[Array]:
        """K steps on batch inputs stacked ``[K, ...]``; returns free outputs stacked ``[K, ...]``."""
        ...

    def read_state(self) -> list[Array]:
        """Copies of the state arrays, in ``layout.state_inputs`` order."""
        ...

    def write_state(self, state: Sequence[Array]) -> None:
        """Replace the state (one array per state input; shapes checked, dtypes cast)."""
        ...


class Executable(Protocol):
    """A compiled graph. ``__call__`` takes inputs in ``graph.inputs`` order.

    The result is one freshly allocated array per ``graph.outputs`` entry. A
    backend may use ``graph.aliases`` to update input buffers in place, but must
    still return the outputs. Executables of backends without a faster path can
    inherit from this protocol to get ``run_validated = __call__`` and a ``bind``
    that returns None.
    """

    graph: Graph

    def __call__(self, inputs: Sequence[Array]) -> list[Array]:
        """Validate ``inputs`` (:func:`validate_inputs`) and run once."""
        ...

    def run_validated(self, inputs: Sequence[Array]) -> list[Array]:
        """``__call__`` for inputs the caller has already validated (``sg.compile``)."""
        return self(inputs)

    def bind(self, state: Sequence[Array] | None = None) -> BoundExecutable | None:
        """Bind the state inputs (one array each, in input order; None keeps the current
        values); None when this backend cannot keep state (``Backend.binds_state``)."""
        return None


class Backend(Protocol):
    """Compiles graphs into executables.

    ``binds_state`` says whether this backend's executables implement
    :meth:`Executable.bind` (so a trainer can choose its step strategy before
    compiling anything).
    """

    name: str
    binds_state: bool

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        """Build an executable for ``graph`` (may write/read an on-disk cache)."""
        ...

    def is_available(self) -> tuple[bool, str]:
        """``(True, "")`` when usable on this machine, else ``(False, reason)``."""
        ...


@runtime_checkable
class KeyedBackend(Backend, Protocol):
    """A backend with a cache keyed *before* optimization and lowering.

    ``sg.compile`` computes a key from the traced graph, the backend and its options
    (``compiler/graphkey.py``). It first asks :meth:`load_keyed`; on a miss it optimizes,
    and calls ``compile`` with ``options.cache_key`` set, after which the backend stores
    what the next ``load_keyed`` needs (the C backend: a manifest next to the library).
    """

    def load_keyed(self, key: str, traced: Graph, options: CompileOptions) -> Executable | None:
        """The executable stored under ``key`` for this ``traced`` graph (its inputs,
        outputs and aliases are those of the optimized graph), or None (not stored,
        damaged, untrusted, or another graph): the caller then compiles in full."""
        ...


@dataclass(frozen=True)
class Generated:
    """What a source-generating backend made of an optimized graph, before compiling it.

    Attributes:
        program: the backend's lowered program (the loop IR ``compiler.loops.Program`` for
            C and CUDA).
        source: the generated source text, as it will be compiled (all units).
        language: ``"c"``, ``"cuda"``, ...
        units: ``(name, source)`` of each translation unit when the source is compiled in
            several pieces (C), else empty.
        seconds: time per phase so far (e.g. ``lower``, ``render``).
    """

    program: Any
    source: str
    language: str
    units: tuple[tuple[str, str], ...] = ()
    seconds: dict[str, float] = field(default_factory=dict, compare=False)


@runtime_checkable
class GeneratesSource(Backend, Protocol):
    """A backend whose compile is "lower and render, then build and load" (C, CUDA).

    ``sg.compile(f).trace(*args).lower()`` shows ``generate``'s result (``.program``,
    ``.source``) and its ``.compile()`` then builds from it without lowering again.
    """

    def generate(self, graph: Graph, options: CompileOptions) -> Generated:
        """Lower and render ``graph`` (no compiler runs)."""
        ...

    def compile_generated(
        self, graph: Graph, generated: Generated, options: CompileOptions
    ) -> Executable:
        """``compile(graph, options)`` for a ``generated`` made by :meth:`generate`."""
        ...


@runtime_checkable
class BuildsArtifacts(Backend, Protocol):
    """A backend that can build its native artifact without loading it.

    ``Lowered.build()`` calls it: the artifact is generated, compiled and stored in the
    cache as ``compile`` would, but nothing is loaded, so it runs where the toolchain
    exists but the device does not (a CUDA launcher built with nvcc on a machine with no
    GPU or pycuda); a later ``compile`` on the device finds it in the cache.
    """

    def build(self, graph: Graph, options: CompileOptions) -> str:
        """Generate, compile and cache the artifact for ``graph``; return its path."""
        ...


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (missing compiler, GPU, OS...)."""


BackendFactory = Callable[[], Backend]

_FACTORIES: dict[str, BackendFactory] = {}
_OPTIONS: dict[str, type[BackendOptions]] = {}
_INSTANCES: dict[str, Backend] = {}
# Backends that live in their own module and register themselves on import.
_MODULES = {
    "numpy": "shapegrad.backends.numpy_ref",
    "c": "shapegrad.backends.c",
    "cuda": "shapegrad.backends.cuda",
    "ane": "shapegrad.backends.ane",
}


def register_backend(
    name: str, factory: BackendFactory, options: type[BackendOptions] = NoOptions
) -> None:
    """Make ``factory()`` the backend used for ``sg.compile(..., backend=name)``, with
    ``options`` the frozen dataclass of the keyword options it accepts.

    Example:
        >>> register_backend("c", CBackend, options=COptions)
    """
    _FACTORIES[name] = factory
    _OPTIONS[name] = options
    _INSTANCES.pop(name, None)


def _import_backend(name: str) -> None:
    """Import the module that registers built-in backend ``name`` (nothing for others)."""
    if name in _MODULES:
        try:
            importlib.import_module(_MODULES[name])
        except ImportError as exc:
            raise BackendUnavailable(f"backend {name!r} could not be imported: {exc}") from exc


def options_type(name: str) -> type[BackendOptions]:
    """The options dataclass of backend ``name`` (importing its module, never its toolchain).

    Raises:
        ValueError: unknown name.
        BackendUnavailable: the backend's module cannot be imported.
    """
    if name not in _OPTIONS:
        _import_backend(name)
    if name not in _OPTIONS:
        raise ValueError(f"unknown backend {name!r}; choose one of {known_backends()}")
    return _OPTIONS[name]


def known_backends() -> list[str]:
    """Names ``get_backend`` knows (registered or importable by convention), usable or not."""
    return sorted(set(_FACTORIES) | set(_MODULES))


def backend_status() -> dict[str, str]:
    """Each known backend -> ``""`` when it can compile here, else why not (e.g. ``cuda``
    without pycuda or a GPU)."""
    status = {}
    for name in known_backends():
        try:
            get_backend(name)
            status[name] = ""
        except BackendUnavailable as exc:
            status[name] = str(exc)
    return status


def available_backends() -> list[str]:
    """Backends that can compile on this machine (``ane`` builds everywhere and executes
    on macOS only; ``cuda`` needs pycuda, a driver, a GPU and nvcc)."""
    return [name for name, problem in backend_status().items() if not problem]


def get_backend(name: str, *, check: bool = True) -> Backend:
    """The backend registered as ``name``, importing its module on first use.

    ``check=False`` returns it even where it cannot run (no GPU, no pycuda): to generate
    source or build artifacts for another machine (``Lowered.source``, ``Lowered.build``).

    Raises:
        ValueError: unknown name.
        BackendUnavailable: the backend exists but cannot run here (message says why).
    """
    if name in _INSTANCES:
        return _INSTANCES[name]
    if not check:
        options_type(name)  # imports and registers it
        return _FACTORIES[name]()
    if name not in _FACTORIES:
        _import_backend(name)
    if name not in _FACTORIES:
        raise ValueError(f"unknown backend {name!r}; known: {available_backends()}")
    backend = _FACTORIES[name]()
    ok, reason = backend.is_available()
    if not ok:
        raise BackendUnavailable(f"backend {name!r} is not available: {reason}")
    _INSTANCES[name] = backend
    return backend


def validate_inputs(graph: Graph, arrays: Sequence[Any]) -> None:
    """Check count, shape, dtype and C-contiguity of every buffer against the graph's inputs.

    Args:
        graph: the graph whose ``inputs`` define the expected avals.
        arrays: one NumPy array per graph input, in order.
    Raises:
        TypeError: wrong number of buffers, or a buffer is not a NumPy array.
        ShapeError / DTypeError: naming the input, expected and actual.
        ValueError: a buffer is not C-contiguous.
    """
    if len(arrays) != len(graph.inputs):
        raise TypeError(f"compiled function expects {len(graph.inputs)} inputs, got {len(arrays)}")
    for k, (node, array) in enumerate(zip(graph.inputs, arrays, strict=True)):
        name = node.attr.get("name", f"in{k}")
        if not isinstance(array, np.ndarray):
            raise TypeError(f"input {name!r}: expected a NumPy array, got {type(array).__name__}")
        if tuple(array.shape) != node.aval.shape:
            raise ShapeError(
                "compiled call",
                f"input {name!r} has shape {fmt(array.shape)}, expected {fmt(node.aval.shape)}",
            )
        if array.dtype != node.aval.dtype.numpy:
            raise DTypeError(
                f"compiled call: input {name!r} has dtype {array.dtype}, expected {node.aval.dtype}"
            )
        if not array.flags.c_contiguous:
            raise ValueError(f"compiled call: input {name!r} must be C-contiguous")


def explain_input_mismatch(name: str, a: Any, shape: tuple[int, ...], dtype: np.dtype[Any]) -> None:
    """Raise the error that says why array ``a`` is not a valid ``shape``/``dtype`` input
    named ``name`` of a compiled step (TypeError, ShapeError, DTypeError, or ValueError for
    a non-contiguous array). Call it only once a mismatch is known."""
    if not isinstance(a, np.ndarray):
        raise TypeError(
            f"compiled step: input {name!r} must be a NumPy array, got {type(a).__name__}"
        )
    if a.shape != shape:
        raise ShapeError(
            "compiled step", f"input {name!r} has shape {fmt(a.shape)}, expected {fmt(shape)}"
        )
    if a.dtype != dtype:
        raise DTypeError(f"compiled step: input {name!r} has dtype {a.dtype}, expected {dtype}")
    raise ValueError(f"compiled step: input {name!r} must be C-contiguous")


def lazy_ffi(cdef: str) -> Callable[[], Any]:
    """A function returning one shared cffi FFI (ABI mode) for ``cdef``, made on first use
    (cffi is imported only by backends that load native code)."""
    made: list[Any] = []

    def ffi() -> Any:
        if not made:
            cffi = importlib.import_module("cffi")  # untyped third-party module
            instance = cffi.FFI()
            instance.cdef(cdef)
            made.append(instance)
        return made[0]

    return ffi
