"""``sg.compile``: trace a function into a typed graph, optimize it, run it on a backend.

The first call with a new *signature* (argument structure, shapes, dtypes
and static arguments) traces the function with graph tensors, runs the pass
pipeline and asks the backend for an executable; later calls with the same
signature reuse it. ``Compiled.trace_count`` counts traces (for tests).

Arguments may be eager Tensors, NumPy arrays, Python scalars and nested
tuples/lists/dicts/ParamList/TList of them. Python scalars become scalar
graph inputs (``int`` -> int32, ``bool`` -> bool, ``float`` -> the float dtype
of the array arguments when they all share one, else float32), so changing a
learning rate does not retrace. Pass ``np.float64(x)`` to force a dtype, or
list the argument in ``static_argnums`` to bake it in.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad._names import safe_name
from shapegrad.backends.base import (
    Array,
    BuildsArtifacts,
    CompileOptions,
    Executable,
    Generated,
    GeneratesSource,
    KeyedBackend,
    get_backend,
    known_backends,
    options_type,
    validate_inputs,
)
from shapegrad.compiler.budget import CompileStats
from shapegrad.compiler.debug import GraphDumper, debug_root
from shapegrad.compiler.graphkey import graph_key as graph_key_of
from shapegrad.compiler.passes import PassStat, count_nodes, optimize
from shapegrad.dtypes import DType, bool_, dtype_of_array, float32, int32, to_numpy
from shapegrad.ir import Graph
from shapegrad.ops.eager import EAGER
from shapegrad.ops.graph import GraphOps
from shapegrad.ops.protocol import AVal
from shapegrad.tensor import Tensor, TraceError


class _Static:
    """Wraps a ``static_argnums`` argument so the tree treats it as one opaque static leaf.

    It is keyed by a snapshot of its *value* taken when the call is made (:func:`_snapshot`),
    so a list or array that the caller mutates between calls retraces rather than reusing
    the program traced with its old contents.
    """

    __slots__ = ("_key", "value")
    __sg_static__ = True  # opaque to tree.flatten even when it holds tensors (baked in)

    def __init__(self, value: Any, where: str) -> None:
        self.value = value
        self._key = (type(value), _snapshot(value, where))

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self._key == other._key

    def __repr__(self) -> str:
        return f"static({self.value!r})"


def _snapshot(value: Any, where: str) -> Any:
    """A hashable copy of a static argument's value: equal snapshots, equal values.

    Containers (list, tuple, dict, set) are copied item by item, arrays and eager tensors
    by dtype, shape and a SHA-256 of their bytes; any other value must be hashable (its
    hash and ``==`` are its identity, as for ``jax.jit``'s static arguments).

    Raises:
        TypeError: an unhashable value that is none of the above (naming ``where``).
    """
    if isinstance(value, np.ndarray | np.generic):
        data = np.ascontiguousarray(value)
        digest = hashlib.sha256(data.tobytes()).hexdigest()
        return ("array", data.dtype.str, data.shape, digest)
    if isinstance(value, Tensor):
        if value.is_traced:
            return ("traced", id(value))
        return ("tensor", value.dtype.name, _snapshot(value.numpy(), where))
    if isinstance(value, tuple | list):
        return (type(value), tuple(_snapshot(v, where) for v in value))
    if isinstance(value, dict):
        return (type(value), tuple((k, _snapshot(v, where)) for k, v in value.items()))
    if isinstance(value, set | frozenset):
        return (type(value), frozenset(_snapshot(v, where) for v in value))
    if isinstance(value, bytearray):
        return (bytearray, bytes(value))
    try:
        hash(value)
    except TypeError:
        raise TypeError(
            f"{where} is a {type(value).__name__}, which is not hashable: a compiled function "
            "cannot tell whether it changed since it was traced into the program. Pass a "
            "hashable value (e.g. a frozen dataclass, a tuple) or a list/dict/tuple/set/array, "
            "which are compared by value"
        ) from None
    return value


def _is_scalar(value: Any) -> bool:
    return isinstance(value, bool | int | float | np.generic)


def _flatten_args(obj: Any) -> tuple[list[Any], tree.TreeDef]:
    """``tree.flatten`` that also makes Python/NumPy scalars leaves (they become inputs)."""
    leaves, td = tree.flatten(obj)
    out: list[Any] = []
    return out, _promote_scalars(td, iter(leaves), out)


_LEAF = tree.TreeDef("leaf")


def _promote_scalars(td: tree.TreeDef, leaves: Any, out: list[Any]) -> tree.TreeDef:
    if td.kind == "leaf":
        out.append(next(leaves))
        return td
    if td.kind == "static":
        if _is_scalar(td.static):
            out.append(td.static)
            return _LEAF
        return td
    children = tuple(_promote_scalars(c, leaves, out) for c in td.children)
    if all(a is b for a, b in zip(children, td.children, strict=True)):
        return td  # nothing promoted below: skip the (slow) dataclass copy
    return tree.TreeDef(td.kind, td.node_type, children, td.keys, td.static, td.template)


_DTYPES: dict[np.dtype[Any], DType] = {}


def _dtype_of(array: Array) -> DType:
    found = _DTYPES.get(array.dtype)
    if found is None:
        found = _DTYPES[array.dtype] = dtype_of_array(array)
    return found


def _aval_of(leaf: Any, float_dtype: DType = float32) -> AVal:
    if isinstance(leaf, Tensor):
        return leaf.aval
    kind = type(leaf)  # exact types: np.float64 subclasses float but is not weakly typed
    if kind is float:
        return AVal((), float_dtype)
    if kind is bool:
        return AVal((), bool_)
    if kind is int:
        return AVal((), int32)
    array = leaf if isinstance(leaf, np.ndarray) else np.asarray(leaf)
    return AVal(tuple(array.shape), _dtype_of(array))


def _leaf_avals(leaves: Sequence[Any]) -> list[AVal]:
    """Types of the flattened arguments; Python floats follow the arrays' float dtype.

    Python scalars are weakly typed eagerly (``params - lr * g`` keeps the params'
    dtype); as graph inputs they need one dtype, so a Python float takes the float
    dtype of the array arguments when they all agree, else float32.
    """
    avals = [_aval_of(leaf) for leaf in leaves]
    floats = {
        a.dtype
        for leaf, a in zip(leaves, avals, strict=True)
        if a.dtype.is_float and type(leaf) is not float
    }
    if len(floats) == 1 and float32 not in floats:
        (common,) = floats
        avals = [
            _aval_of(leaf, common) if type(leaf) is float else a
            for leaf, a in zip(leaves, avals, strict=True)
        ]
    return avals


def _to_array(leaf: Any, aval: AVal) -> Array:
    if isinstance(leaf, Tensor):
        leaf = leaf.numpy()
    array = to_numpy(leaf, aval.dtype.numpy, what="compiled call")
    # Not np.ascontiguousarray: it turns 0-d scalars into shape [1].
    return array if array.flags.c_contiguous else array.copy(order="C")


def _container_hints(args: Sequence[Any]) -> list[str]:
    """Notes for arguments that are lists/tuples of scalars: probably meant as arrays."""
    hints = []
    for k, arg in enumerate(args):
        if (
            isinstance(arg, list | tuple)
            and arg
            and all(isinstance(a, Tensor) and a.ndim == 0 for a in arg)
        ):
            hints.append(
                f"sg.compile: argument {k} is a {type(arg).__name__} of {len(arg)} numbers, which "
                f"is traced as a container of {len(arg)} scalar inputs (a pytree), not as an "
                "array; pass np.asarray(...) (or a list of numbers) for array data"
            )
    return hints


def _leaf_paths(td: tree.TreeDef, prefix: str, out: list[str]) -> None:
    if td.kind == "leaf":
        out.append(prefix)
    elif td.kind == "seq":
        names = getattr(td.template, "_sg_names", None)  # ParamList: params.w1, params.b1
        for i, child in enumerate(td.children):
            label = f".{names[i]}" if names is not None and i < len(names) else f"[{i}]"
            _leaf_paths(child, prefix + label, out)
    elif td.kind == "dict":
        for key, child in zip(td.keys, td.children, strict=True):
            _leaf_paths(child, f"{prefix}[{key!r}]", out)
    elif td.kind == "node":  # modules, dataclasses, registered types: their field names
        for key, child in zip(td.keys, td.children, strict=True):
            _leaf_paths(child, f"{prefix}.{key}", out)


# --- the per-call fast path ----------------------------------------------------------------
#
# A call whose arguments have exactly the structure, leaf types, shapes, dtypes and
# contiguity of an earlier call reuses that call's Lowered without re-flattening into
# TreeDefs, re-deriving signatures or re-validating: the fast key below is built in one
# cheap pass and *is* the validation (anything it does not describe exactly - static
# values it cannot hash, subclasses, traced tensors - takes the full path).

_SCALARS = (float, int, bool)


def _fast_key(obj: Any, leaves: list[Any], parts: list[Any]) -> bool:
    """Append ``obj``'s leaves (raw arrays / scalars) and key parts; False when not keyable."""
    kind = type(obj)
    if kind is np.ndarray:
        leaves.append(obj)
        parts.append((obj.shape, obj.dtype, obj.flags.c_contiguous))
        return True
    if kind is Tensor:
        payload = obj._payload
        if type(payload) is not np.ndarray:
            return False  # traced (inline it) or an unusual payload: the full path decides
        leaves.append(payload)
        # The aval's dtype name too: cheaper to hash than the AVal, and exact.
        parts.append((payload.shape, payload.dtype, payload.flags.c_contiguous, obj.dtype.name))
        return True
    if kind is list and tree.is_data_list(obj):
        return False  # a list of numbers is one array leaf (tree.flatten): the full path
    if kind is tuple or kind is list or isinstance(obj, tuple | list):  # ParamList too
        parts.append((kind, len(obj)))
        for child in obj:  # noqa: SIM110 - a loop, not all(genexpr): per-call hot path
            if not _fast_key(child, leaves, parts):
                return False
        return True
    if isinstance(obj, dict):
        parts.append((kind, tuple(obj)))
        for k in obj:  # noqa: SIM110 - as above
            if not _fast_key(obj[k], leaves, parts):
                return False
        return True
    if kind in _SCALARS or isinstance(obj, np.generic):
        leaves.append(obj)
        parts.append(kind)  # the value is an input, its type fixes the dtype
        return True
    if obj is None or kind is str:
        parts.append((kind, obj))
        return True
    node = tree.node_for(kind)  # a registered container: sg.nn.Module, a dataclass, ...
    if node is None:
        return False
    children, keys, aux = node.flatten(obj)
    try:
        parts.append((kind, tuple(keys), aux, hash(aux)))
    except TypeError:
        return False  # unhashable static data: the full path compares it
    for child in children:  # noqa: SIM110 - as above
        if not _fast_key(child, leaves, parts):
            return False
    return True


@dataclass
class _FastEntry:
    """What a fast-key hit needs: the Lowered, leaf conversions and prebuilt output avals."""

    lowered: Lowered
    convert: list[tuple[int, np.dtype[Any]]]  # leaves that are not ready-to-use arrays
    out_avals: list[AVal]
    run: Callable[[Sequence[Array]], list[Array]]
    rebuild: Callable[[list[Any]], Any]  # tree.unflatten specialised to the output tree


def _fast_entry(lowered: Lowered, leaves: list[Any]) -> _FastEntry:
    inputs = lowered.executable.graph.inputs
    convert = []
    for k, (leaf, node) in enumerate(zip(leaves, inputs, strict=True)):
        want = node.aval.dtype.numpy
        ready = (
            type(leaf) is np.ndarray and leaf.dtype == want and leaf.flags.c_contiguous
        )  # fixed by the fast key: true for every later call with this key
        if not ready:
            convert.append((k, want))
    out_avals = [AVal(tuple(n.shape), n.aval.dtype) for n in lowered.executable.graph.outputs]
    run = lowered.executable.run_validated  # the key validated: skip the executable's check
    return _FastEntry(lowered, convert, out_avals, run, tree.unflattener(lowered.out_treedef))


def _ready_array(leaf: Any, dtype: np.dtype[Any]) -> Array:
    array = to_numpy(leaf, dtype, what="compiled call")
    # Not np.ascontiguousarray: it turns 0-d scalars into shape [1].
    return array if array.flags.c_contiguous else array.copy(order="C")


class Traced:
    """Stage one of ``sg.compile(f).trace(*args)``: the function traced into a graph.

    Attributes:
        graph: the traced graph (before optimization); ``print(traced.graph)``.
        in_tree / out_tree: the argument and result structures (:class:`tree.TreeDef`).
        backend: the backend ``lower`` prepares for; options: its validated options.
        recorded_nodes: nodes the trace created (including dead ones).
        trace_seconds: how long tracing took.

    Example:
        >>> traced = sg.compile(loss, backend="c").trace(params, x, y)
        >>> lowered = traced.lower(); print(lowered.source)   # the generated C
        >>> exe = lowered.compile()                            # takes graph.inputs' arrays
    """

    def __init__(
        self,
        graph: Graph,
        in_tree: tree.TreeDef,
        out_tree: tree.TreeDef,
        backend: str,
        options: CompileOptions,
        recorded_nodes: int,
        trace_seconds: float,
        signature: Any,
    ) -> None:
        self.graph = graph
        self.in_tree = in_tree
        self.out_tree = out_tree
        self.backend = backend
        self.options = options
        self.recorded_nodes = recorded_nodes
        self.trace_seconds = trace_seconds
        self.signature = signature  # the call signature (names the debug dump folder)

    def lower(self) -> Lowered:
        """Stage two: the optimized graph, and the backend's program and source on demand."""
        return Lowered(self)


class Lowered:
    """Stage two, ``traced.lower()`` (and what ``Compiled.lower(*args)`` returns, compiled):
    the optimized graph, the backend's loop program and generated source, the executable.

    The stages run when first asked for: ``graph``/``stats`` run the graph passes;
    ``program``/``source`` run the backend's loop pipeline and renderer (C, CUDA; the MIL
    program for ANE; None for NumPy); :meth:`compile` builds and loads the executable (first
    from the backend's keyed cache, where a warm cache skips the passes, lowering and
    rendering); :meth:`build` compiles the native artifact into the cache without loading
    it and returns its path.

    Attributes:
        traced: the graph as traced (before optimization).
        graph: the optimized graph the backend compiles; ``print(lowered.graph)``. When the
            executable came from the backend's keyed cache (``from_cache``), the passes did
            not run: they run on first access of ``graph`` or ``stats``.
        stats: one :class:`PassStat` per pass application.
        executable: what runs (``compile()``); ``executable.graph`` has the inputs/outputs
            of ``graph``.
        recorded_nodes: nodes the trace created (including dead ones).
        trace_seconds / optimize_seconds / backend_seconds: where compile time went
            (``backend_seconds`` is the cache lookup and load for a cached executable).
        from_cache: whether the executable came from the keyed cache (no optimization,
            lowering or rendering happened in this process).
    """

    def __init__(self, traced: Traced) -> None:
        self.stage = traced
        self.traced = traced.graph
        self.out_treedef = traced.out_tree
        self.recorded_nodes = traced.recorded_nodes
        self.trace_seconds = traced.trace_seconds
        self.optimize_seconds = 0.0
        self.backend_seconds = 0.0
        self.from_cache = False
        self._graph: Graph | None = None
        self._stats: list[PassStat] | None = None
        self._executable: Executable | None = None
        self._generated: Generated | None = None
        self._key: tuple[str | None] | None = None
        root = debug_root()
        self._dumper = GraphDumper(root, traced.options.name, traced.signature) if root else None

    # --- the graph -----------------------------------------------------------------------

    def _optimize(self) -> None:
        t0 = time.perf_counter()
        on_pass = None
        if self._dumper is not None:
            self._dumper.dump("traced", self.traced)
            on_pass = self._dumper.on_pass
        self._graph, self._stats = optimize(self.traced, on_pass=on_pass)
        self.optimize_seconds = time.perf_counter() - t0

    @property
    def graph(self) -> Graph:
        if self._graph is None:
            self._optimize()
        assert self._graph is not None
        return self._graph

    @property
    def stats(self) -> list[PassStat]:
        if self._stats is None:
            self._optimize()
        assert self._stats is not None
        return self._stats

    # --- the backend's program and source ------------------------------------------------

    def generated(self) -> Generated | None:
        """What the backend generates from ``graph`` before compiling (None for a backend
        that generates no source, e.g. NumPy); made once."""
        if self._generated is None:
            backend = get_backend(self.stage.backend, check=False)  # no device needed
            if isinstance(backend, GeneratesSource):
                self._generated = backend.generate(self.graph, self._options())
        return self._generated

    @property
    def program(self) -> Any:
        """The backend's lowered program (the loop IR for C/CUDA, MIL for ANE), or None."""
        generated = self.generated()
        return None if generated is None else generated.program

    @property
    def source(self) -> str | None:
        """The generated source (C, CUDA, MIL text) as it will be compiled, or None."""
        generated = self.generated()
        return None if generated is None else generated.source

    # --- compiling -----------------------------------------------------------------------

    @property
    def executable(self) -> Executable:
        return self.compile()

    def compile(self) -> Executable:
        """Stage three: the executable (built and loaded once; from the backend's keyed
        cache when it holds this traced graph). It takes one NumPy array per
        ``graph.inputs`` entry, in order (``Compiled.__call__`` takes the pytrees)."""
        if self._executable is not None:
            return self._executable
        backend = get_backend(self.stage.backend)
        t0 = time.perf_counter()
        key = self._graph_key(backend)
        if key is not None and isinstance(backend, KeyedBackend) and self._dumper is None:
            # A debug run takes the full path so that every stage is dumped.
            found = backend.load_keyed(key, self.traced, self.stage.options)
            if found is not None:
                self.from_cache = True
                self.backend_seconds = time.perf_counter() - t0
                self._executable = found
                return found
        lookup = time.perf_counter() - t0
        graph = self.graph  # the passes: timed as optimize_seconds
        t1 = time.perf_counter()
        options = self._options(key)
        generated = self._generated
        if generated is not None and isinstance(backend, GeneratesSource):
            self._executable = backend.compile_generated(graph, generated, options)
        else:
            self._executable = backend.compile(graph, options)
        self.backend_seconds = lookup + (time.perf_counter() - t1)
        return self._executable

    def build(self) -> str:
        """Generate, compile and cache the backend's native artifact without loading it;
        returns its path (C: the shared library; CUDA: the launcher; ANE: the
        ``.mlpackage``). Needs the toolchain but not the device: a CUDA launcher builds
        with nvcc on a machine without a GPU or pycuda (name the ``arch`` then).

        Raises:
            TypeError: the backend builds no artifact (``numpy``).
        """
        backend = get_backend(self.stage.backend, check=False)
        if not isinstance(backend, BuildsArtifacts):
            raise TypeError(
                f"Lowered.build: backend {self.stage.backend!r} builds no native artifact "
                "(the c, cuda and ane backends do); call compile() instead"
            )
        return backend.build(self.graph, self._options(self._graph_key(backend)))

    def _graph_key(self, backend: Any) -> str | None:
        """The traced graph's key for a keyed backend (None: not keyed or unkeyable)."""
        if not isinstance(backend, KeyedBackend):
            return None
        if self._key is None:
            options = self.stage.options
            chosen = options.backend_options
            text = "" if chosen is None else chosen.canonical()
            self._key = (graph_key_of(self.traced, self.stage.backend, options.name, text),)
        return self._key[0]

    def _options(self, cache_key: str | None = None) -> CompileOptions:
        folder = self._dumper.folder if self._dumper is not None else None
        return dataclasses.replace(self.stage.options, debug_dir=folder, cache_key=cache_key)

    def summary(self) -> str:
        """Node counts and timings as a few readable lines."""
        return (
            f"recorded {self.recorded_nodes} nodes, live {count_nodes(self.traced)} after trace, "
            f"{count_nodes(self.graph)} after passes; trace {self.trace_seconds * 1e3:.1f} ms, "
            f"optimize {self.optimize_seconds * 1e3:.1f} ms, backend {self.backend_seconds * 1e3:.1f} ms"
            + (" (from the keyed cache)" if self.from_cache else "")
        )


class Compiled:
    """A compiled function (see :func:`compile`). Call it like the original."""

    def __init__(
        self,
        fn: Callable[..., Any],
        backend: str,
        static_argnums: Sequence[int],
        options: CompileOptions,
        donate_argnums: Sequence[int] = (),
    ) -> None:
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.backend = backend
        self.static_argnums = tuple(static_argnums)
        self.donate_argnums = tuple(donate_argnums)
        self.options = options
        self.trace_count = 0
        self._cache: dict[Any, Lowered] = {}
        self._fast: dict[Any, _FastEntry] = {}  # exact argument structure -> ready call
        try:
            self._param_names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self._param_names = []

    # --- public -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raw: list[Any] = []
        parts: list[Any] = []
        fast_key = None
        if not self.static_argnums and _fast_key((args, kwargs), raw, parts):
            fast_key = tuple(parts)
            entry = self._fast.get(fast_key)
            if entry is not None:
                return self._run_fast(entry, raw)
        leaves, td, key = self._signature(args, kwargs)
        if any(isinstance(leaf, Tensor) and leaf.is_traced for leaf in leaves):
            return self.fn(*args, **kwargs)  # called inside another trace: inline it
        lowered = self._lower(leaves, td, key, args, kwargs)
        graph = lowered.executable.graph  # the optimized graph's inputs and outputs
        arrays = [_to_array(leaf, n.aval) for leaf, n in zip(leaves, graph.inputs, strict=True)]
        validate_inputs(graph, arrays)
        entry = _fast_entry(lowered, raw) if fast_key is not None else None
        results = entry.run(arrays) if entry is not None else lowered.executable(arrays)
        if entry is not None:
            self._fast[fast_key] = entry  # only after a successful call
        tensors = [
            Tensor(EAGER, a, AVal(tuple(a.shape), n.aval.dtype))
            for a, n in zip(results, graph.outputs, strict=True)
        ]
        return tree.unflatten(lowered.out_treedef, tensors)

    def _run_fast(self, entry: _FastEntry, leaves: list[Any]) -> Any:
        """Run a call whose fast key matched: the key already validated every leaf."""
        for k, dtype in entry.convert:
            leaves[k] = _ready_array(leaves[k], dtype)
        results = entry.run(leaves)
        return entry.rebuild(
            [Tensor(EAGER, a, aval) for a, aval in zip(results, entry.out_avals, strict=True)]
        )

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace/optimize/compile for these arguments (or fetch from the cache) without running;
        ``.executable`` is ready."""
        leaves, td, key = self._signature(args, kwargs)
        return self._lower(leaves, td, key, args, kwargs)

    def trace(self, *args: Any, **kwargs: Any) -> Traced:
        """Stage one: trace ``fn`` for these arguments (always anew; nothing is cached or
        compiled). ``.lower()`` then ``.compile()`` continue, as in JAX.

        Example:
            >>> lowered = sg.compile(step, backend="c").trace(params, x, y).lower()
            >>> print(lowered.graph); print(lowered.source)
        """
        leaves, td, key = self._signature(args, kwargs)
        return self._trace(leaves, td, key)

    def graph(self, *args: Any, **kwargs: Any) -> Graph:
        """The optimized graph for these arguments (``print(fast.graph(params, x, y))``)."""
        return self.lower(*args, **kwargs).graph

    def stats(self, *args: Any, **kwargs: Any) -> CompileStats:
        """Per-pass node counts for these arguments, plus the compiled program's budgets
        (``.arena_bytes``, ``.kernels``, ``.layer_loops``, ``.compile_seconds``, ``.summary()``)."""
        lowered = self.lower(*args, **kwargs)
        seconds = lowered.trace_seconds + lowered.optimize_seconds + lowered.backend_seconds
        return CompileStats.of(lowered.stats, lowered.executable, seconds)

    # --- internals ----------------------------------------------------------------

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        for i in self.static_argnums:
            if not -len(args) <= i < len(args):
                raise TypeError(
                    f"static_argnums contains {i} but {self.options.name} got {len(args)} positional arguments"
                )
        statics = {i % len(args) for i in self.static_argnums}
        return (
            tuple(
                _Static(a, f"sg.compile({self.options.name}): static argument {i}")
                if i in statics
                else a
                for i, a in enumerate(args)
            ),
            kwargs,
        )

    def _signature(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[list[Any], tree.TreeDef, Any]:
        leaves, td = _flatten_args(self._split(args, kwargs))
        key = (td.signature(), tuple(_leaf_avals(leaves)))
        return leaves, td, key

    def _input_names(self, td: tree.TreeDef) -> list[str]:
        names: list[str] = []
        positional, keywords = td.children
        for i, child in enumerate(positional.children):
            base = self._param_names[i] if i < len(self._param_names) else f"arg{i}"
            _leaf_paths(child, base, names)
        for key, child in zip(keywords.keys, keywords.children, strict=True):
            _leaf_paths(child, str(key), names)
        return names

    def _lower(
        self,
        leaves: list[Any],
        td: tree.TreeDef,
        key: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Lowered:
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        get_backend(self.backend)  # unavailable: say so before tracing
        lowered = self._trace(leaves, td, key).lower()
        lowered.compile()
        self._cache[key] = lowered
        return lowered

    def _trace(self, leaves: list[Any], td: tree.TreeDef, key: Any) -> Traced:
        self.trace_count += 1
        t0 = time.perf_counter()
        ops = GraphOps()
        names = self._input_names(td)
        avals = _leaf_avals(leaves)
        inputs = [ops.add_input(n, a) for n, a in zip(names, avals, strict=True)]
        traced_args, traced_kwargs = tree.unflatten(td, inputs)
        call_args = [a.value if isinstance(a, _Static) else a for a in traced_args]
        try:
            out = self.fn(*call_args, **traced_kwargs)
        except TypeError as exc:  # e.g. list * list: say how sg.compile saw the list
            for hint in _container_hints(call_args):
                exc.add_note(hint)
            raise
        _check_not_mutated(td, inputs, (traced_args, traced_kwargs), names)
        out_leaves, out_td = tree.flatten(out)
        _check_outputs(out_td, self.options.name)
        graph = Graph(list(ops.inputs), [ops.lift_value(leaf) for leaf in out_leaves], ops.table)
        graph.aliases = _find_aliases(graph, td, out_td, self.donate_argnums)
        recorded = len(ops.table.table) + len(ops.inputs)
        seconds = time.perf_counter() - t0
        return Traced(graph, td, out_td, self.backend, self.options, recorded, seconds, key)


def _check_not_mutated(
    td: tree.TreeDef, inputs: list[Tensor], traced: Any, names: list[str]
) -> None:
    after, td_after = _flatten_args(traced)
    if td_after.signature() != td.signature() or len(after) != len(inputs):
        raise TraceError(
            "the compiled function changed the structure of an argument in place (e.g. "
            "list.append or dict assignment); compiled functions must be pure: return the "
            "new value instead"
        )
    for name, before, now in zip(names, inputs, after, strict=True):
        if now is not before:
            raise TraceError(
                f"the compiled function replaced argument element {name!r} in place; compiled "
                "functions must be pure: return the new value instead"
            )


def _find_aliases(
    graph: Graph, td: tree.TreeDef, out_td: tree.TreeDef, donated: Sequence[int]
) -> list[tuple[int, int]]:
    """``(output leaf, input leaf)`` pairs: each donated argument's updated value in the output.

    The new value of donated argument ``i`` is the first output subtree (the whole
    output or one of its top-level entries) with the same structure and types.
    """
    positional = td.children[0].children
    starts = [0]
    for child in positional:
        starts.append(starts[-1] + child.num_leaves)
    candidates = [(0, out_td)]
    offset = 0
    for child in out_td.children if out_td.kind in ("seq", "dict") else ():
        candidates.append((offset, child))
        offset += child.num_leaves
    aliases: list[tuple[int, int]] = []
    used: set[int] = set()
    for i in donated:
        arg_td, first = positional[i], starts[i]
        in_avals = [n.aval for n in graph.inputs[first : first + arg_td.num_leaves]]
        for out_first, cand in candidates:
            out_avals = [n.aval for n in graph.outputs[out_first : out_first + cand.num_leaves]]
            if out_first in used or cand.signature() != arg_td.signature() or out_avals != in_avals:
                continue
            used.add(out_first)
            aliases += [(out_first + k, first + k) for k in range(arg_td.num_leaves)]
            break
        else:
            raise TraceError(
                f"donate_argnums: no output has the structure and types of argument {i}; "
                "a donated argument must be returned updated (e.g. new params)"
            )
    return aliases


def _check_outputs(td: tree.TreeDef, fname: str) -> None:
    if td.kind == "static":
        if td.static is not None:
            raise TraceError(
                f"{fname} returned a {type(td.static).__name__} ({td.static!r}) from a compiled "
                "function; compiled functions must return tensors (or containers of tensors)"
            )
        return
    for child in td.children:
        _check_outputs(child, fname)


def compile(
    fn: Callable[..., Any] | None = None,
    *,
    backend: str = "numpy",
    static_argnums: int | Sequence[int] = (),
    donate_argnums: int | Sequence[int] = (),
    name: str | None = None,
    **backend_options: Any,
) -> Any:
    """Compile ``fn`` (written against Tensor) into a cached, optimized executable.

    Args:
        fn: the function; may return a tensor or a nested tuple/list/dict of tensors
            (``None`` entries are allowed and returned as ``None``).
        backend: ``"numpy"`` (reference), ``"c"``, ``"cuda"`` or ``"ane"``.
        static_argnums: positional arguments baked into the trace (retrace when they change;
            must be hashable to be cached by value).
        donate_argnums: positional arguments whose buffers the backend may overwrite with
            their updated values (``graph.aliases``); the returned output with the same
            structure and types is taken as the new value. Donated eager tensors must not
            be used after the call (the NumPy backend never overwrites; the C backend may).
        name: readable name for debug dumps (defaults to ``fn.__name__``).
        backend_options: the backend's options (C: ``denormals``, ``cflags``, ``target``,
            ...; CUDA: ``device``, ``arch``, ``target``; ANE: ``precision``, ``cache_dir``;
            NumPy: none), checked now against the backend's ``Options`` dataclass
            (``COptions``, ``CudaOptions``, ``AneOptions``): an unknown name raises
            ``TypeError`` listing the valid ones, a wrong type ``TypeError``, a value out
            of range ``ValueError``.
    Returns:
        A :class:`Compiled` callable returning eager tensors in ``fn``'s output structure,
        with ``.lower(*args)``, ``.graph(*args)``, ``.stats(*args)``, ``.trace_count`` and
        the staged ``.trace(*args)`` -> :class:`Traced` ``.lower()`` -> :class:`Lowered`
        ``.compile()`` (the executable) / ``.build()`` (the native artifact's path).
    Example:
        >>> fast = sg.compile(sg.value_and_grad(loss))
        >>> value, grads = fast(params, x, y)
        >>> print(fast.graph(params, x, y))   # the optimized training step
    """
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    if backend not in known_backends():
        raise ValueError(f"unknown backend {backend!r}; choose one of {known_backends()}")
    chosen = options_type(backend).from_kwargs(backend_options, backend)  # errors now, not later

    def make(f: Callable[..., Any]) -> Compiled:
        label = safe_name(name or str(getattr(f, "__name__", "fn")))
        options = CompileOptions(name=label, backend_options=chosen)
        return Compiled(f, backend, nums, options, donate)

    return make if fn is None else make(fn)


__all__ = ["Compiled", "Lowered", "Traced", "compile"]
