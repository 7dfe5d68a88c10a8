"""Backend ``"c"``: loop IR rendered to C, compiled by the system compiler, loaded with cffi.

Pipeline: ``lower_to_loops`` (fusion, memory plan) -> ``render_c`` -> compile
into the disk cache (``toolchain``) -> ``dlopen`` -> :class:`CExecutable`.
``SHAPEGRAD_DEBUG=<dir>`` (via ``CompileOptions.debug_dir``) receives
``<name>.loops.txt`` and ``<name>.c``.

Backend options (``CompileOptions.extra``): ``contract_min`` (smallest
matrix product, in multiply-adds, sent to BLAS), ``fuse_epilogues`` (bool),
``profile`` (bool: per-kernel wall time, read with ``CExecutable.profile()``).
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import replace

from shapegrad._names import safe_name
from shapegrad.backends.base import BackendUnavailable, CompileOptions, register_backend
from shapegrad.backends.c.executable import BoundStep, CExecutable, NativeError, load_library
from shapegrad.backends.c.render import render_c, uses_blas
from shapegrad.backends.c.toolchain import (
    CompileError,
    CompilerNotFound,
    build_library,
    compiler,
    full_source,
    library_for,
    make_spec,
    missing_compiler_message,
)
from shapegrad.compiler import loops as L
from shapegrad.compiler.fusion import plan_fusion
from shapegrad.compiler.lower import Lowered, lower_to_loops
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


def assign_slots(lowered: Lowered) -> int:
    """Number the I/O table: inputs (graph order), then outputs, then constants."""
    buffers = lowered.program.buffers
    slot = 0
    order = list(dict.fromkeys(lowered.input_buffers))
    order += [b.name for b in buffers.values() if b.kind == "output"]
    order += [b.name for b in buffers.values() if b.kind == "const"]
    for name in order:
        buffers[name] = replace(buffers[name], slot=slot)
        slot += 1
    return slot


def generate(graph: Graph, options: CompileOptions | None = None) -> tuple[Lowered, str]:
    """Lower and render ``graph``; returns (lowered program, C source).

    Example:
        >>> lowered, source = generate(graph); print(source)
    """
    options = options or CompileOptions()
    plan = plan_fusion(graph, fuse_epilogues=bool(options.get("fuse_epilogues", True)))
    lowered = lower_to_loops(graph, safe_name(options.name), plan, options.get("contract_min"))
    n_slots = assign_slots(lowered)
    profile = bool(options.get("profile", False))
    return lowered, render_c(lowered.program, n_slots, profile)


class CBackend:
    """Compiles graphs to native code; see the module docstring."""

    name = "c"

    def is_available(self) -> tuple[bool, str]:
        cc = compiler()
        if shutil.which(shlex.split(cc)[0] if cc else "cc") is None:
            return False, missing_compiler_message(cc)
        return True, ""

    def compile(self, graph: Graph, options: CompileOptions) -> CExecutable:
        lowered, source = generate(graph, options)
        try:
            spec = make_spec(source, uses_blas(lowered.program))
            path, _cached = library_for(spec)
            try:
                lib = load_library(path, spec.key)
            except OSError:
                path = build_library(spec)  # corrupt but checksum-matching: rebuild once
                lib = load_library(path, spec.key)
        except CompilerNotFound as exc:
            raise BackendUnavailable(str(exc)) from exc
        if options.debug_dir:
            _dump(options.debug_dir, options.name, lowered.program, full_source(spec))
        return CExecutable(graph, lowered, lib, path)


def _dump(folder: str, name: str, program: L.Program, source: str) -> None:
    os.makedirs(folder, exist_ok=True)
    for suffix, text in ((".loops.txt", program.format() + "\n"), (".c", source)):
        path = os.path.join(folder, name + suffix)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)


register_backend("c", CBackend)
