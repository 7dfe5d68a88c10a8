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
    CompileOptions,
    Executable,
    KeyedBackend,
    get_backend,
    known_backends,
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
    """Wraps a ``static_argnums`` argument so the tree treats it as one opaque static leaf."""

    __slots__ = ("value",)
    __sg_static__ = True  # opaque to tree.flatten even when it holds tensors (baked in)

    def __init__(self, value: Any) -> None:
        self.value = value

    def _key(self) -> Any:
        try:
            hash(self.value)
            return (type(self.value), self.value)
        except TypeError:
            return ("id", id(self.value))

    def __hash__(self) -> int:
        return hash(self._key())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and self._key() == other._key()

    def __repr__(self) -> str:
        return f"static({self.value!r})"


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


class Lowered:
    """Everything one signature compiled to: graphs before/after the passes, stats, executable.

    Attributes:
        traced: the graph as traced (before optimization).
        graph: the optimized graph the backend compiled; ``print(lowered.graph)``. When the
            executable came from the backend's keyed cache (``from_cache``), the passes did
            not run: they run on first access of ``graph`` or ``stats``.
        stats: one :class:`PassStat` per pass application.
        executable: what runs; ``executable.graph`` has the inputs/outputs of ``graph``.
        recorded_nodes: nodes the trace created (including dead ones).
        trace_seconds / optimize_seconds / backend_seconds: where compile time went
            (``backend_seconds`` is the cache lookup and load for a cached executable).
        from_cache: whether the executable came from the keyed cache (no optimization,
            lowering or rendering happened in this process).
    """

    def __init__(
        self,
        traced: Graph,
        graph: Graph | None,
        stats: list[PassStat] | None,
        executable: Executable,
        recorded_nodes: int,
        trace_seconds: float,
        optimize_seconds: float,
        backend_seconds: float,
        out_treedef: tree.TreeDef,
        from_cache: bool = False,
    ) -> None:
        self.traced = traced
        self._graph = graph
        self._stats = stats
        self.executable = executable
        self.recorded_nodes = recorded_nodes
        self.trace_seconds = trace_seconds
        self.optimize_seconds = optimize_seconds
        self.backend_seconds = backend_seconds
        self.out_treedef = out_treedef
        self.from_cache = from_cache

    def _optimize(self) -> None:
        self._graph, self._stats = optimize(self.traced)

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
        """Trace/optimize/compile for these arguments (or fetch from the cache) without running."""
        leaves, td, key = self._signature(args, kwargs)
        return self._lower(leaves, td, key, args, kwargs)

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
        return (tuple(_Static(a) if i in statics else a for i, a in enumerate(args)), kwargs)

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
        backend = get_backend(self.backend)
        self.trace_count += 1
        t0 = time.perf_counter()
        traced, out_td, recorded = self._trace(leaves, td)
        t1 = time.perf_counter()
        root = debug_root()
        # The keyed cache (a fresh process skips the passes, lowering and rendering); a
        # debug run takes the full path so that every stage is dumped.
        graph_key = None
        if isinstance(backend, KeyedBackend):
            graph_key = graph_key_of(traced, self.backend, self.options.name, self.options.extra)
            found = (
                backend.load_keyed(graph_key, traced, self.options)
                if graph_key and not root
                else None
            )
            if found is not None:
                lowered = Lowered(
                    traced, None, None, found, recorded, t1 - t0, 0.0,
                    time.perf_counter() - t1, out_td, from_cache=True,
                )  # fmt: skip
                self._cache[key] = lowered
                return lowered
        dumper = GraphDumper(root, self.options.name, key) if root else None
        if dumper is not None:
            dumper.dump("traced", traced)
        graph, stats = optimize(traced, on_pass=dumper.on_pass if dumper else None)
        t2 = time.perf_counter()
        options = dataclasses.replace(
            self.options, debug_dir=dumper.folder if dumper else None, cache_key=graph_key
        )
        executable = backend.compile(graph, options)
        t3 = time.perf_counter()
        lowered = Lowered(
            traced, graph, stats, executable, recorded, t1 - t0, t2 - t1, t3 - t2, out_td
        )
        self._cache[key] = lowered
        return lowered

    def _trace(self, leaves: list[Any], td: tree.TreeDef) -> tuple[Graph, tree.TreeDef, int]:
        ops = GraphOps()
        names = self._input_names(td)
        avals = _leaf_avals(leaves)
        weak = [type(leaf) in _SCALARS for leaf in leaves]  # weakly typed, as eagerly
        inputs = [ops.add_input(n, a, w) for n, a, w in zip(names, avals, weak, strict=True)]
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
        return graph, out_td, len(ops.table.table) + len(ops.inputs)


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
        backend_options: backend-specific settings passed as ``CompileOptions.extra``.
    Returns:
        A :class:`Compiled` callable returning eager tensors in ``fn``'s output structure,
        with ``.lower(*args)``, ``.graph(*args)``, ``.stats(*args)`` and ``.trace_count``.
    Example:
        >>> fast = sg.compile(sg.value_and_grad(loss))
        >>> value, grads = fast(params, x, y)
        >>> print(fast.graph(params, x, y))   # the optimized training step
    """
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    if backend not in known_backends():
        raise ValueError(f"unknown backend {backend!r}; choose one of {known_backends()}")

    def make(f: Callable[..., Any]) -> Compiled:
        label = safe_name(name or str(getattr(f, "__name__", "fn")))
        options = CompileOptions(name=label, extra=tuple(sorted(backend_options.items())))
        return Compiled(f, backend, nums, options, donate)

    return make if fn is None else make(fn)


__all__ = ["Compiled", "Lowered", "compile"]
