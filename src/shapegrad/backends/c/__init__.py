"""Backend ``"c"``: loop IR rendered to C, compiled by the system compiler, loaded with cffi.

Pipeline: ``compiler.pipeline.lower_program`` with :data:`C_TARGET` (the loop
stages) -> ``render_c`` -> compile into the disk cache (``toolchain``) ->
``dlopen`` -> :class:`CExecutable`. ``SHAPEGRAD_DEBUG=<dir>`` (via
``CompileOptions.debug_dir``) receives the program after every loop stage
(``<name>.loopNN_<stage>.txt``), the final ``<name>.loops.txt`` and ``<name>.c``.

Backend options (``CompileOptions.extra``): ``target`` (a
:class:`~shapegrad.compiler.target.Target` replacing :data:`C_TARGET`),
``contract_min`` (smallest matrix product, in multiply-adds, sent to BLAS) and
``fuse_epilogues`` (bool) as shorthands for those target fields, ``vector_math`` (bool,
default: where libmvec exists), ``profile``
(bool: per-kernel wall time, read with ``CExecutable.profile()``), ``flush_denormals``
(bool, default False: run each call with denormal floats flushed to zero on every thread,
restoring the caller's floating-point mode after; see ``render_c``).
"""

from __future__ import annotations

import shlex
import shutil

from shapegrad._names import safe_name
from shapegrad.backends.base import BackendUnavailable, CompileOptions, register_backend
from shapegrad.backends.c import collectives
from shapegrad.backends.c.executable import (
    BoundStep,
    CExecutable,
    NativeError,
    ffi,
    load_library,
)
from shapegrad.backends.c.render import render_c, uses_blas
from shapegrad.backends.c.toolchain import (
    CompileError,
    CompilerNotFound,
    build_library,
    compiler,
    full_source,
    has_vector_math,
    library_for,
    make_spec,
    missing_compiler_message,
)
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import dump_program, lower_program, stage_dumper
from shapegrad.compiler.target import C_TARGET, Target
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
    """Run the loop pipeline and render ``graph``; returns (program, C source).

    Example:
        >>> program, source = generate(graph); print(source)
    """
    options = options or CompileOptions()
    hook = stage_dumper(options.debug_dir, options.name) if options.debug_dir else None
    program, _stats = lower_program(graph, c_target(options), safe_name(options.name), hook)
    vector_math = bool(options.get("vector_math", has_vector_math()))
    flush = bool(options.get("flush_denormals", False))
    return program, render_c(program, bool(options.get("profile", False)), vector_math, flush)


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
        program, source = generate(graph, options)
        collectives.check_program(program)  # every process runs the same exchanges
        try:
            spec = make_spec(source, uses_blas(program), "omp declare simd" in source)
            path, _cached = library_for(spec)
            try:
                lib = load_library(path, spec.key)
            except OSError:
                path = build_library(spec)  # corrupt but checksum-matching: rebuild once
                lib = load_library(path, spec.key)
        except CompilerNotFound as exc:
            raise BackendUnavailable(str(exc)) from exc
        if options.debug_dir:
            dump_program(options.debug_dir, options.name, program, full_source(spec), ".c")
        collectives.bind(lib, ffi(), program)
        return CExecutable(graph, program, lib, path)


register_backend("c", CBackend)
