"""The staged objects of ``sg.compile``, as in JAX: ``trace`` -> :class:`Traced`,
``.lower()`` -> :class:`Lowered`, ``.compile()`` -> the executable (``.build()``: the
native artifact, not loaded)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from shapegrad import tree
from shapegrad.backends.base import (
    BuildsArtifacts,
    CompileOptions,
    Executable,
    Generated,
    GeneratesSource,
    KeyedBackend,
    get_backend,
)
from shapegrad.compiler.debug import GraphDumper, debug_root
from shapegrad.compiler.graphkey import graph_key as graph_key_of
from shapegrad.compiler.passes import PassStat, count_nodes, optimize
from shapegrad.ir import Graph


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
        t0 = time.perf_counter()
        found = self.cached()
        if found is not None:
            return found
        lookup = time.perf_counter() - t0
        backend = get_backend(self.stage.backend)
        key = self._graph_key(backend)
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

    def cached(self) -> Executable | None:
        """The executable when it is built already or the backend's keyed cache holds this
        traced graph (a manifest and a library load: no passes, no compiler), else None;
        :meth:`compile` then builds it. The eager kernel provider loads cache hits at once
        and compiles misses in the background."""
        if self._executable is not None:
            return self._executable
        backend = get_backend(self.stage.backend)
        t0 = time.perf_counter()
        key = self._graph_key(backend)
        if key is None or not isinstance(backend, KeyedBackend) or self._dumper is not None:
            return None  # a debug run takes the full path so that every stage is dumped
        found = backend.load_keyed(key, self.traced, self.stage.options)
        if found is not None:
            self.from_cache = True
            self.backend_seconds = time.perf_counter() - t0
            self._executable = found
        return found

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


__all__ = ["Lowered", "Traced"]
