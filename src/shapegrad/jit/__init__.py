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
list the argument in ``static_argnums`` to bake it in (static arguments are keyed by
value: a list or array mutated between calls retraces; an unhashable object that is
not a container or array is rejected).

Backend options are checked when ``sg.compile`` is called (``backends/options.py``).
The stages can be taken one at a time (``stages.py``): ``Compiled.trace(*args)`` ->
:class:`Traced`, ``.lower()`` -> :class:`Lowered`, ``.compile()`` -> the executable,
``.build()`` -> the native artifact's path. The per-call fast path is ``fastpath.py``.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from shapegrad import tree
from shapegrad._names import safe_name
from shapegrad.backends.base import (
    Array,
    CompileOptions,
    get_backend,
    known_backends,
    options_type,
    validate_inputs,
)
from shapegrad.compiler.budget import CompileStats
from shapegrad.dtypes import DType, bool_, dtype_of_array, float32, int32, to_numpy
from shapegrad.ir import Graph
from shapegrad.jit.buckets import Bucketed, BucketPlan
from shapegrad.jit.fastpath import SCALARS, FastEntry, fast_entry, fast_key, ready_array
from shapegrad.jit.stages import Lowered, Traced
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


class RetraceWarning(UserWarning):
    """A compiled function was traced again and again for new argument shapes."""


RETRACE_WARNING_AT = 5  # retraces (traces after the first) before the one warning


def _retrace_message(name: str, signatures: list[dict[str, AVal]]) -> str:
    """Which inputs changed type across ``signatures`` (input path -> its AVal)."""
    paths = list(dict.fromkeys(p for sig in signatures for p in sig))
    changed = []
    varying: dict[str, list[AVal]] = {}
    for path in paths:
        seen = list(dict.fromkeys(str(sig.get(path, "absent")) for sig in signatures))
        if len(seen) > 1:
            changed.append(f"{path}: {', '.join(seen)}")
            varying[path] = [sig[path] for sig in signatures if path in sig]
    return (
        f"sg.compile({name}) traced and compiled {len(signatures)} times, once per new "
        f"argument shape; the inputs that changed: {'; '.join(changed) or 'structure only'}. "
        "Each new shape compiles a new program; "
        + (_bucket_hint(varying) or "pad the inputs to a few fixed shapes to reuse them")
    )


def _bucket_hint(varying: dict[str, list[AVal]]) -> str | None:
    """``buckets=`` advice when every changed input is a whole argument whose shapes differ
    in one axis only and all those axes share one length (a sequence length, say)."""
    keys: list[str] = []
    lengths: set[tuple[int, ...]] = set()
    for path, avals in varying.items():
        ranks = {len(a.shape) for a in avals}
        dtypes = {a.dtype for a in avals}
        if not path.isidentifier() or len(ranks) != 1 or len(dtypes) != 1:
            return None
        axes = [k for k in range(ranks.pop()) if len({a.shape[k] for a in avals}) > 1]
        if len(axes) != 1:
            return None
        keys.append(f"({path!r}, {axes[0]})")
        lengths.add(tuple(a.shape[axes[0]] for a in avals))
    if not keys or len(lengths) != 1:
        return None
    top = max(lengths.pop())
    cap = 1 << max(0, (top - 1).bit_length())  # the power of two holding the longest seen
    sizes = sorted({max(1, cap // 4), max(1, cap // 2), cap})
    spec = ", ".join(f"{key}: {tuple(sizes)}" for key in keys)
    return (
        f"if only that length varies, pass buckets={{{spec}}} to sg.compile to pad it to the "
        "next bucket and compile once per bucket (see sg.compile's buckets, length_arg, out_axis)"
    )


class Compiled:
    """A compiled function (see :func:`compile`). Call it like the original.

    The fifth retrace (a sixth argument signature) warns once with a
    :class:`RetraceWarning` naming the inputs whose shapes changed, as JAX and PyTorch do.
    """

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
        self._signatures: list[dict[str, AVal]] = []  # input path -> type, per trace
        self._fast: dict[Any, FastEntry] = {}  # exact argument structure -> ready call
        try:
            self._param_names = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            self._param_names = []

    # --- public -------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raw: list[Any] = []
        parts: list[Any] = []
        exact = None
        if not self.static_argnums and fast_key((args, kwargs), raw, parts):
            exact = tuple(parts)
            entry = self._fast.get(exact)
            if entry is not None:
                return self._run_fast(entry, raw)
        leaves, td, key = self._signature(args, kwargs)
        if any(isinstance(leaf, Tensor) and leaf.is_traced for leaf in leaves):
            return self.fn(*args, **kwargs)  # called inside another trace: inline it
        lowered = self._lower(leaves, td, key, args, kwargs)
        graph = lowered.executable.graph  # the optimized graph's inputs and outputs
        arrays = [_to_array(leaf, n.aval) for leaf, n in zip(leaves, graph.inputs, strict=True)]
        validate_inputs(graph, arrays)
        entry = fast_entry(lowered, raw) if exact is not None else None
        results = entry.run(arrays) if entry is not None else lowered.executable(arrays)
        if entry is not None:
            self._fast[exact] = entry  # only after a successful call
        tensors = [
            Tensor(EAGER, a, AVal(tuple(a.shape), n.aval.dtype))
            for a, n in zip(results, graph.outputs, strict=True)
        ]
        return tree.unflatten(lowered.out_treedef, tensors)

    def _run_fast(self, entry: FastEntry, leaves: list[Any]) -> Any:
        """Run a call whose fast key matched: the key already validated every leaf."""
        for k, dtype in entry.convert:
            leaves[k] = ready_array(leaves[k], dtype)
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
        self._note_signature(td, leaves)
        return lowered

    def _note_signature(self, td: tree.TreeDef, leaves: list[Any]) -> None:
        """Remember this trace's input types; warn once at the ``RETRACE_WARNING_AT``-th retrace."""
        if len(self._signatures) > RETRACE_WARNING_AT:
            return  # warned already: keep no more
        names = self._input_names(td)
        avals = _leaf_avals(leaves)
        self._signatures.append(dict(zip(names, avals, strict=True)))
        if len(self._signatures) == RETRACE_WARNING_AT + 1:
            name = getattr(self.fn, "__name__", "function")
            warnings.warn(_retrace_message(name, self._signatures), RetraceWarning, stacklevel=4)

    def _trace(self, leaves: list[Any], td: tree.TreeDef, key: Any) -> Traced:
        self.trace_count += 1
        t0 = time.perf_counter()
        ops = GraphOps()
        names = self._input_names(td)
        avals = _leaf_avals(leaves)
        weak = [type(leaf) in SCALARS for leaf in leaves]  # weakly typed, as eagerly
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
    buckets: Mapping[Any, Sequence[int]] | None = None,
    length_arg: str | None = None,
    out_axis: int | None = None,
    **backend_options: Any,
) -> Any:
    """Compile ``fn`` (written against Tensor) into a cached, optimized executable.

    Args:
        fn: the function; may return a tensor or a nested tuple/list/dict of tensors
            (``None`` entries are allowed and returned as ``None``).
        backend: ``"numpy"`` (reference), ``"c"``, ``"cuda"`` or ``"ane"``.
        static_argnums: positional arguments baked into the trace (retrace when their value
            changes: lists, tuples, dicts, sets and arrays are compared by value, anything
            else must be hashable).
        donate_argnums: positional arguments whose buffers the backend may overwrite with
            their updated values (``graph.aliases``); the returned output with the same
            structure and types is taken as the new value. Donated eager tensors must not
            be used after the call (the NumPy backend never overwrites; the C backend may).
        name: readable name for debug dumps (defaults to ``fn.__name__``).
        buckets: shape buckets for ONE varying length (``jit/buckets.py`` states the
            contract): ``{"t": (64, 128, 256)}`` (a dim name of ``fn``'s jaxtyping
            annotations) or ``{("ids", 1): (64, 128, 256)}`` (argument, axis). Those axes are
            padded with zeros at the end to the next bucket, so ``fn`` compiles at most once
            per bucket; exact for functions causal along the dim, otherwise mask with
            ``length_arg``. A length above the largest bucket raises ``ValueError``.
        length_arg: with ``buckets``: the keyword parameter of ``fn`` that receives the true
            length (an int32 scalar tensor) for masking.
        out_axis: with ``buckets``: slice every output back to the true length along this
            axis (``None``: outputs keep the bucket's size).
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

    if buckets is None and (length_arg is not None or out_axis is not None):
        raise TypeError("sg.compile: length_arg and out_axis only apply with buckets=...")

    def make(f: Callable[..., Any]) -> Any:
        label = safe_name(name or str(getattr(f, "__name__", "fn")))
        options = CompileOptions(name=label, backend_options=chosen)
        compiled = Compiled(f, backend, nums, options, donate)
        if buckets is None:
            return compiled
        return Bucketed(compiled, BucketPlan(f, buckets, length_arg, out_axis))

    return make if fn is None else make(fn)


__all__ = ["Bucketed", "Compiled", "Lowered", "RetraceWarning", "Traced", "compile"]
