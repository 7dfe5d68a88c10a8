"""Backend ``"c"``: loop IR rendered to C, compiled by the system compiler, loaded with cffi.

Pipeline: ``compiler.pipeline.lower_program`` with :data:`C_TARGET` (the loop
stages) -> ``render_c`` -> compile into the disk cache (``toolchain``) ->
``dlopen`` -> :class:`CExecutable`. ``SHAPEGRAD_DEBUG=<dir>`` (via
``CompileOptions.debug_dir``) receives the program after every loop stage
(``<name>.loopNN_<stage>.txt``), the final ``<name>.loops.txt``, the threading plan
(``<name>.schedule.txt``, ``schedule.plan_region``) and ``<name>.c``.

Backend options (``CompileOptions.extra``): ``target`` (a
:class:`~shapegrad.compiler.target.Target` replacing :data:`C_TARGET`),
``contract_min`` (smallest matrix product, in multiply-adds, sent to BLAS) and
``fuse_epilogues`` (bool) as shorthands for those target fields, ``vector_math`` (bool,
default: where libmvec exists), ``profile``
(bool: per-kernel wall time, read with ``CExecutable.profile()``), ``flush_denormals``
(bool, default False: run each call with denormal floats flushed to zero on every thread,
restoring the caller's floating-point mode after; see ``render_c``), ``unit_lines`` and
``split_min_lines`` (ints: how the C is split into translation units, see
``render.render_c_units``; defaults ``CTuning.unit_lines`` / ``CTuning.split_min_lines``
of the target).

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
from dataclasses import dataclass
from typing import Any

from shapegrad._names import safe_name
from shapegrad.backends.base import BackendUnavailable, CompileOptions, register_backend
from shapegrad.backends.c import collectives, manifest, render, units
from shapegrad.backends.c.executable import (
    BoundStep,
    CExecutable,
    NativeError,
    ffi,
    load_library,
)
from shapegrad.backends.c.manifest import RuntimeInfo
from shapegrad.backends.c.render import render_c, render_c_units, uses_blas
from shapegrad.backends.c.toolchain import (
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
from shapegrad.compiler import loops as L
from shapegrad.compiler.debug import write_dump
from shapegrad.compiler.graphkey import Unkeyable, canonical_text
from shapegrad.compiler.passes import optimize
from shapegrad.compiler.pipeline import dump_program, lower_program, stage_dumper
from shapegrad.compiler.target import C_TARGET, CTuning, Target
from shapegrad.ir import Graph

__all__ = [
    "BoundStep",
    "CBackend",
    "CExecutable",
    "CompileError",
    "CompilerNotFound",
    "NativeError",
    "generate",
]


def c_target(options: CompileOptions) -> Target:
    """The target for one compilation: ``C_TARGET`` with the options' overrides."""
    target = options.get("target", C_TARGET)
    if not isinstance(target, Target):
        raise TypeError(f"backend option 'target' must be a Target, got {type(target).__name__}")
    if options.get("contract_min") is not None:
        target = target.replace(contract_min_macs=int(options.get("contract_min")))
    if options.get("fuse_epilogues") is not None:
        target = target.replace(fuse_epilogues=bool(options.get("fuse_epilogues")))
    return target


def generate(graph: Graph, options: CompileOptions | None = None) -> tuple[L.Program, str]:
    """Run the loop pipeline and render ``graph``; returns (program, C source as one unit).

    Example:
        >>> program, source = generate(graph); print(source)
    """
    options = options or CompileOptions()
    program = lower(graph, options)
    profile, flush = bool(options.get("profile", False)), _flush(options)
    tuning = render.c_tuning(c_target(options))
    return program, render_c(program, profile, _vector_math(options), flush, tuning)


def lower(graph: Graph, options: CompileOptions) -> L.Program:
    """The loop pipeline for ``graph`` under ``options`` (dumped when debugging)."""
    hook = stage_dumper(options.debug_dir, options.name) if options.debug_dir else None
    program, _stats = lower_program(graph, c_target(options), safe_name(options.name), hook)
    return program


def _vector_math(options: CompileOptions) -> bool:
    return bool(options.get("vector_math", has_vector_math()))


def _flush(options: CompileOptions) -> bool:
    return bool(options.get("flush_denormals", False))


def _unit_sizes(options: CompileOptions, tuning: CTuning) -> tuple[int, int]:
    """(unit_lines, split_min_lines): the options', else the target tuning's."""
    return (
        int(options.get("unit_lines", tuning.unit_lines)),
        int(options.get("split_min_lines", tuning.split_min_lines)),
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


@dataclass
class Built:
    """A loaded library: cffi handle, path, key, the source compiled (for debug dumps) and
    seconds per phase (``render``, ``cc``: compile and link or cache lookup, ``load``)."""

    lib: Any
    path: str
    key: str
    source: str
    seconds: dict[str, float]


def build(program: L.Program, options: CompileOptions) -> Built:
    """Render, compile (or fetch from the cache) and load ``program``."""
    t0 = time.perf_counter()
    profile, vector_math = bool(options.get("profile", False)), _vector_math(options)
    tuning = render.c_tuning(c_target(options))
    rendered = render_c_units(
        program,
        profile,
        vector_math,
        *_unit_sizes(options, tuning),
        _flush(options),
        tuning,
    )
    t1 = time.perf_counter()
    blas = uses_blas(program)
    try:
        spec = make_spec(rendered[0].source, blas, vector_math)
        if len(rendered) == 1:
            path, _cached = library_for(spec)
            key, source = spec.key, full_source(spec)
        else:
            link = LinkSpec(
                tuple(UnitSpec(u.name, u.source, spec.flags) for u in rendered),
                spec.cc,
                spec.link,
                (*spec.flags, "-fPIC", "-shared"),
            )
            path, _cached = units.library_for(link)
            key, source = link.key, link.sources()
        t2 = time.perf_counter()
        try:
            lib = load_library(path, key)
        except OSError:  # corrupt but checksum-matching: rebuild once
            if len(rendered) == 1:
                path = build_library(spec)
            else:
                units.remove_library(link.key)
                path, _cached = units.library_for(link)
            lib = load_library(path, key)
    except CompilerNotFound as exc:
        raise BackendUnavailable(str(exc)) from exc
    seconds = {"render": t1 - t0, "cc": t2 - t1, "load": time.perf_counter() - t2}
    return Built(lib, path, key, source, seconds)


def _toolchain_identity(options: CompileOptions) -> tuple[str, ...]:
    """What the C backend adds to a traced graph's key: everything besides the graph that
    decides the program, its source and its library (without running the compiler)."""
    cc = compiler()
    blas = ""
    with contextlib.suppress(ImportError):
        blas = "|".join(blas_paths())
    return (
        canonical_text(c_target(options)),  # not repr: it shows frozensets unordered
        cc,
        compiler_version(cc),
        " ".join(cflags()),
        cpu_identity(),
        str(_vector_math(options)),
        blas,
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
        t0 = time.perf_counter()
        program = lower(graph, options)
        lowered = time.perf_counter() - t0
        collectives.check_program(program)  # every process runs the same exchanges
        built = build(program, options)
        if options.debug_dir:
            dump_program(options.debug_dir, options.name, program, built.source, ".c")
            tuning = render.c_tuning(c_target(options))
            plan = render.schedule_text(
                program, tuning, bool(options.get("profile", False)), *_unit_sizes(options, tuning)
            )
            write_dump(options.debug_dir, options.name + ".schedule.txt", plan)
        collectives.bind(built.lib, ffi(), program)
        info = RuntimeInfo.of(program, built.key)
        if options.cache_key is not None and not program.communicators:
            # Collectives are never stored: binding them needs the communicator objects,
            # and every process must check its exchanges with the others (check_program).
            mkey = self._manifest_key(options.cache_key, options)
            if mkey is not None:
                manifest.write(mkey, info, graph)
        exe = CExecutable(graph, info, built.lib, built.path, program)
        exe.phase_seconds = {"lower": lowered, **built.seconds}
        return exe

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


register_backend("c", CBackend)
