"""Backend ``"c"``: loop IR rendered to C, compiled by the system compiler, loaded with cffi.

Pipeline: ``compiler.pipeline.lower_program`` with :data:`C_TARGET` (the loop
stages) -> ``render_c`` -> compile into the disk cache (``toolchain``) ->
``dlopen`` -> :class:`CExecutable`. ``SHAPEGRAD_DEBUG=<dir>`` (via
``CompileOptions.debug_dir``) receives the program after every loop stage
(``<name>.loopNN_<stage>.txt``), the final ``<name>.loops.txt``, the threading plan
(``<name>.schedule.txt``, ``schedule.plan_region``) and ``<name>.c``.

Backend options: :class:`~shapegrad.backends.c.options.COptions` (``target``,
``contract_min``, ``fuse_epilogues``, ``vector_math``, ``denormals``, ``profile``,
``cflags``, ``unit_lines``, ``split_min_lines``), validated by ``sg.compile`` and read
here through ``CompileOptions.of(COptions)``.

Staged use (``sg.compile(f).trace(*args).lower()``): :meth:`CBackend.generate` lowers
and renders (no compiler runs), :meth:`CBackend.compile_generated` builds and loads
what it made, and :meth:`CBackend.build` builds and caches the library without loading
it (returns its path).

Caching, two levels (both in ``$XDG_CACHE_HOME/shapegrad``, private to the user):

* the library, keyed by its source, compiler, flags and link line (``toolchain``); a big
  program is several translation units compiled in parallel, each object cached by its
  own content (``units``);
* a manifest keyed *before* lowering (``manifest``): ``sg.compile`` hands
  :meth:`CBackend.load_keyed` the traced graph's key (``compiler/graphkey.py``), and a
  fresh process with a warm cache loads the library without running the graph passes,
  the loop pipeline or the renderer.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shapegrad._names import safe_name
from shapegrad.backends.base import (
    BackendUnavailable,
    CompileOptions,
    Generated,
    register_backend,
)
from shapegrad.backends.c import batch_gemm, collectives, gemm_kernel, manifest, render, units
from shapegrad.backends.c.executable import (
    BoundStep,
    CExecutable,
    NativeError,
    ffi,
    load_library,
)
from shapegrad.backends.c.manifest import RuntimeInfo
from shapegrad.backends.c.options import COptions
from shapegrad.backends.c.render import CUnit, render_c, render_c_units, uses_blas
from shapegrad.backends.c.toolchain import (
    BuildSpec,
    CompileError,
    CompilerNotFound,
    blas_paths,
    build_library,
    cached_library_by_key,
    cflags,
    compiler,
    compiler_version,
    cpu_identity,
    full_source,
    has_vector_math,
    library_for,
    make_spec,
    missing_compiler_message,
)
from shapegrad.backends.c.units import LinkSpec, UnitSpec
from shapegrad.backends.native import cache_entry
from shapegrad.compiler import loops as L
from shapegrad.compiler.debug import write_dump
from shapegrad.compiler.graphkey import Unkeyable, canonical_text
from shapegrad.compiler.passes import optimize
from shapegrad.compiler.pipeline import dump_program, lower_program, stage_dumper
from shapegrad.compiler.target import CTuning, Target
from shapegrad.ir import Graph

__all__ = [
    "BoundStep",
    "CBackend",
    "CExecutable",
    "COptions",
    "CompileError",
    "CompilerNotFound",
    "NativeError",
    "generate",
]


def c_target(options: CompileOptions) -> Target:
    """The target for one compilation: ``C_TARGET`` with the options' overrides."""
    return options.of(COptions).resolved_target()


def generate(graph: Graph, options: CompileOptions | None = None) -> tuple[L.Program, str]:
    """Run the loop pipeline and render ``graph``; returns (program, C source as one unit).

    Example:
        >>> program, source = generate(graph); print(source)
    """
    options = options or CompileOptions()
    opts = options.of(COptions)
    program = lower(graph, options)
    tuning = render.c_tuning(c_target(options))
    return program, render_c(program, opts.profile, _vector_math(opts), opts.flush, tuning)


def lower(graph: Graph, options: CompileOptions) -> L.Program:
    """The loop pipeline for ``graph`` under ``options`` (dumped when debugging)."""
    hook = stage_dumper(options.debug_dir, options.name) if options.debug_dir else None
    program, _stats = lower_program(graph, c_target(options), safe_name(options.name), hook)
    return program


def _vector_math(opts: COptions) -> bool:
    return has_vector_math() if opts.vector_math is None else opts.vector_math


def _flags(opts: COptions) -> tuple[str, ...]:
    """The compiler flags: the ``cflags`` option, else ``$SHAPEGRAD_CFLAGS`` or the defaults."""
    return tuple(cflags()) if opts.cflags is None else opts.cflags


def _unit_sizes(opts: COptions, tuning: CTuning) -> tuple[int, int]:
    """(unit_lines, split_min_lines): the options', else the target tuning's."""
    return (
        tuning.unit_lines if opts.unit_lines is None else opts.unit_lines,
        tuning.split_min_lines if opts.split_min_lines is None else opts.split_min_lines,
    )


# Per-unit flags: every unit gets the same flags (DEFAULT_CFLAGS, -O2), by measurement on
# the 2-core box (gcc 12, 1 thread, load average 5-6, so only ratios within one run count):
# * `gcc -c` of one ~1500-line kernel unit, wall seconds: 64-layer MLP step -O2 0.49-0.62,
#   -O2 -fno-peel-loops 0.45, -O1 0.38-0.58, -O0 0.26; GPT step -O2 1.11, -O2
#   -fno-peel-loops 1.22, -O1 1.19, -O2 -fno-tree-vectorize 1.04.
# * whole programs, -O2 vs -O1 (SHAPEGRAD_CFLAGS), interleaved in one process: 64-layer MLP
#   value_and_grad compile 4.3 vs 3.3 s, step 8.8 vs 11.4 ms (-O1 1.3x slower); GPT
#   value_and_grad compile 6.7 vs 6.1 s, step 154 vs 164 ms.
# -O1 saves 10-25% of compile time and costs 6-30% of every step, so no unit gets it.


def render_units(program: L.Program, opts: COptions, target: Target) -> list[CUnit]:
    """``program`` rendered as the translation units the library is built from."""
    tuning = render.c_tuning(target)
    return render_c_units(
        program, opts.profile, _vector_math(opts), *_unit_sizes(opts, tuning), opts.flush, tuning
    )


@dataclass(frozen=True)
class Library:
    """A compiled library in the cache: its path (to ``dlopen``), key and source."""

    path: str
    key: str
    source: str
    spec: BuildSpec | LinkSpec


def compile_units(
    rendered: Sequence[tuple[str, str]], program: L.Program, opts: COptions
) -> Library:
    """Compile the ``(name, source)`` units of ``program`` (or find the library in the
    cache); nothing is loaded.

    Raises:
        BackendUnavailable: no C compiler.
        CompileError / CacheError: see ``toolchain.build_library``.
    """
    vector_math = _vector_math(opts)
    try:
        spec = make_spec(rendered[0][1], uses_blas(program), vector_math)
        spec = BuildSpec(spec.source, spec.cc, _flags(opts), spec.link)
        if len(rendered) == 1:
            path, _cached = library_for(spec)
            return Library(path, spec.key, full_source(spec), spec)
        link = LinkSpec(
            tuple(UnitSpec(name, source, spec.flags) for name, source in rendered),
            spec.cc,
            spec.link,
            (*spec.flags, "-fPIC", "-shared"),
        )
        path, _cached = units.library_for(link)
        return Library(path, link.key, link.sources(), link)
    except CompilerNotFound as exc:
        raise BackendUnavailable(str(exc)) from exc


def load(library: Library) -> Any:
    """``dlopen`` a compiled library (rebuilt once when the cached file is corrupt but
    matches its checksum)."""
    try:
        return load_library(library.path, library.key)
    except OSError:
        if isinstance(library.spec, BuildSpec):
            path = build_library(library.spec)
        else:
            units.remove_library(library.key)
            path, _cached = units.library_for(library.spec)
        return load_library(path, library.key)


def _toolchain_identity(options: CompileOptions) -> tuple[str, ...]:
    """What the C backend adds to a traced graph's key: everything besides the graph that
    decides the program, its source and its library (without running the compiler; the
    graph key already holds the options' canonical text)."""
    opts = options.of(COptions)
    cc = compiler()
    blas = ""
    with contextlib.suppress(ImportError):
        blas = "|".join(blas_paths())
    return (
        canonical_text(c_target(options)),  # not repr: it shows frozensets unordered
        cc,
        compiler_version(cc),
        " ".join(_flags(opts)),
        cpu_identity(),
        str(_vector_math(opts)),
        blas,
        # the product kernels' switches, read when a program is rendered
        f"gemm={gemm_kernel.gemm_mode()},batch_gemm={batch_gemm.batch_gemm_mode()}",
    )  # the unit sizes are part of the target's tuning, keyed above


class CBackend:
    """Compiles graphs to native code; see the module docstring."""

    name = "c"
    binds_state = True  # CExecutable.bind: state kept in the executable

    def is_available(self) -> tuple[bool, str]:
        cc = compiler()
        if shutil.which(shlex.split(cc)[0] if cc else "cc") is None:
            return False, missing_compiler_message(cc)
        return True, ""

    def compile(self, graph: Graph, options: CompileOptions) -> CExecutable:
        return self.compile_generated(graph, self.generate(graph, options), options)

    def generate(self, graph: Graph, options: CompileOptions) -> Generated:
        """Lower and render ``graph`` into its translation units (no compiler runs)."""
        t0 = time.perf_counter()
        program = lower(graph, options)
        t1 = time.perf_counter()
        rendered = render_units(program, options.of(COptions), c_target(options))
        seconds = {"lower": t1 - t0, "render": time.perf_counter() - t1}
        source = "".join(f"/* ===== unit {u.name} ===== */\n{u.source}" for u in rendered)
        return Generated(
            program,
            rendered[0].source if len(rendered) == 1 else source,
            "c",
            tuple((u.name, u.source) for u in rendered),
            seconds,
        )

    def compile_generated(
        self, graph: Graph, generated: Generated, options: CompileOptions
    ) -> CExecutable:
        """Build (or fetch), load and wrap what :meth:`generate` made of ``graph``."""
        program = generated.program
        assert isinstance(program, L.Program)
        collectives.check_program(program)  # every process runs the same exchanges
        t0 = time.perf_counter()
        library = compile_units(generated.units, program, options.of(COptions))
        t1 = time.perf_counter()
        lib = load(library)
        t2 = time.perf_counter()
        if options.debug_dir:
            dump_program(options.debug_dir, options.name, program, library.source, ".c")
            opts = options.of(COptions)
            tuning = render.c_tuning(c_target(options))
            plan = render.schedule_text(program, tuning, opts.profile, *_unit_sizes(opts, tuning))
            write_dump(options.debug_dir, options.name + ".schedule.txt", plan)
        node_shared = collectives.bind(lib, ffi(), program)
        info = self._store_manifest(graph, program, library, options)
        exe = CExecutable(graph, info, lib, library.path, program)
        if info.shard_flag >= 0 and 0 in node_shared:  # its state may live once per node
            exe.node_comm = program.communicators[0]
        exe.phase_seconds = {**generated.seconds, "cc": t1 - t0, "load": t2 - t1}
        return exe

    def build(self, graph: Graph, options: CompileOptions) -> str:
        """Lower, render and compile ``graph`` into the cache without loading it; returns
        the library's path in the cache. A later ``compile`` finds the library there, and
        with ``options.cache_key`` set (``Lowered.build``) a new process finds its manifest
        too (no lowering)."""
        return self.build_generated(graph, self.generate(graph, options), options)

    def build_generated(self, graph: Graph, generated: Generated, options: CompileOptions) -> str:
        """:meth:`build` for what :meth:`generate` made of ``graph``."""
        program = generated.program
        assert isinstance(program, L.Program)
        library = compile_units(generated.units, program, options.of(COptions))
        self._store_manifest(graph, program, library, options)
        return cache_entry(library.path)

    def _store_manifest(
        self, graph: Graph, program: L.Program, library: Library, options: CompileOptions
    ) -> RuntimeInfo:
        """What calls need to know of ``program``; stored as the manifest of
        ``options.cache_key`` when there is one."""
        info = RuntimeInfo.of(program, library.key)
        if options.cache_key is not None and not program.communicators:
            # Collectives are never stored: binding them needs the communicator objects,
            # and every process must check its exchanges with the others (check_program).
            mkey = self._manifest_key(options.cache_key, options)
            if mkey is not None:
                manifest.write(mkey, info, graph)
        return info

    def load_keyed(self, key: str, traced: Graph, options: CompileOptions) -> CExecutable | None:
        """The executable a manifest stored under ``key`` describes, without lowering; None
        when there is no usable manifest or its library is not in the cache."""
        t0 = time.perf_counter()
        mkey = self._manifest_key(key, options)
        info = None if mkey is None else manifest.read(mkey, traced)
        if info is None:
            return None
        path = cached_library_by_key(info.library_key)
        if path is None:
            return None
        t1 = time.perf_counter()
        try:
            lib = load_library(path, info.library_key)
        except OSError:
            return None

        def relower() -> L.Program:  # only for exe.program introspection
            return lower(optimize(traced)[0], options)

        exe = CExecutable(traced, info, lib, path, relower)
        exe.phase_seconds = {"manifest": t1 - t0, "load": time.perf_counter() - t1}
        return exe

    def _manifest_key(self, graph_key: str, options: CompileOptions) -> str | None:
        """The manifest's file key; None without a compiler or for an unkeyable target."""
        try:
            return manifest.manifest_key(graph_key, *_toolchain_identity(options))
        except (CompilerNotFound, Unkeyable):
            return None


register_backend("c", CBackend, options=COptions)
