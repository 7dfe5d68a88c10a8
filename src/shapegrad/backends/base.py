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
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from shapegrad.dtypes import DTypeError
from shapegrad.ir import Graph
from shapegrad.shapes import ShapeError, fmt

Array = npt.NDArray[Any]


@dataclass(frozen=True)
class CompileOptions:
    """Settings passed from ``sg.compile`` to a backend.

    Attributes:
        name: a readable name for the compiled function (used in dumps and cache keys).
        debug_dir: where to write debug dumps (IR, generated source), or None.
        extra: backend-specific settings (e.g. ``{"cflags": [...]}``); must be hashable values.
    """

    name: str = "fn"
    debug_dir: str | None = None
    extra: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    def get(self, key: str, default: Any = None) -> Any:
        """The value of backend-specific setting ``key`` (``default`` when absent)."""
        return dict(self.extra).get(key, default)


class Executable(Protocol):
    """A compiled graph. ``__call__`` takes inputs in ``graph.inputs`` order.

    The caller (``sg.compile``) has already validated the inputs; the result is
    one freshly allocated array per ``graph.outputs`` entry. A backend may use
    ``graph.aliases`` to update input buffers in place, but must still return
    the outputs.
    """

    graph: Graph

    def __call__(self, inputs: Sequence[Array]) -> list[Array]: ...


class Backend(Protocol):
    """Compiles graphs into executables."""

    name: str

    def compile(self, graph: Graph, options: CompileOptions) -> Executable:
        """Build an executable for ``graph`` (may write/read an on-disk cache)."""
        ...

    def is_available(self) -> tuple[bool, str]:
        """``(True, "")`` when usable on this machine, else ``(False, reason)``."""
        ...


class BackendUnavailable(RuntimeError):
    """The requested backend cannot run here (missing compiler, GPU, OS...)."""


BackendFactory = Callable[[], Backend]

_FACTORIES: dict[str, BackendFactory] = {}
_INSTANCES: dict[str, Backend] = {}
# Backends that live in their own module and register themselves on import.
_MODULES = {
    "numpy": "shapegrad.backends.numpy_ref",
    "c": "shapegrad.backends.c",
    "cuda": "shapegrad.backends.cuda",
    "ane": "shapegrad.backends.ane",
}


def register_backend(name: str, factory: BackendFactory) -> None:
    """Make ``factory()`` the backend used for ``sg.compile(..., backend=name)``.

    Example:
        >>> register_backend("numpy", NumpyBackend)
    """
    _FACTORIES[name] = factory
    _INSTANCES.pop(name, None)


def available_backends() -> list[str]:
    """Names ``get_backend`` knows (registered or importable by convention)."""
    return sorted(set(_FACTORIES) | set(_MODULES))


def get_backend(name: str) -> Backend:
    """The backend registered as ``name``, importing its module on first use.

    Raises:
        ValueError: unknown name.
        BackendUnavailable: the backend exists but cannot run here (message says why).
    """
    if name in _INSTANCES:
        return _INSTANCES[name]
    if name not in _FACTORIES and name in _MODULES:
        try:
            importlib.import_module(_MODULES[name])
        except ImportError as exc:
            raise BackendUnavailable(f"backend {name!r} could not be imported: {exc}") from exc
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
