"""Backend ``"cuda"``: the loop IR rendered as CUDA kernels, run through pycuda on NVIDIA GPUs.

Pipeline: ``compiler.pipeline.lower_program`` with :data:`CUDA_TARGET` (the same
loop stages as the C backend; a GPU schedule is a Target setting) ->
``render_cuda`` (``__global__`` kernels + a host launcher) -> ``nvcc -shared``
into the disk cache -> ``dlopen`` -> :class:`CudaExecutable` on a device's
stream, with parameters and optimizer state resident on the GPU.

Backend options (:class:`~shapegrad.backends.cuda.options.CudaOptions`): ``device``
(GPU number, default 0), ``target`` (a :class:`~shapegrad.compiler.target.Target`
replacing :data:`CUDA_TARGET`), ``arch`` (e.g. ``"sm_90"``; default
``$SHAPEGRAD_CUDA_ARCH``, else the device's).

Needs pycuda, an NVIDIA driver with a GPU, and nvcc (the CUDA toolkit); cuBLAS comes
from the ``nvidia-cublas`` wheel (``pip install 'shapegrad[cuda]'``). Without them,
``sg.compile(..., backend="cuda")`` raises :class:`BackendUnavailable` naming what is
missing; ``import shapegrad`` never touches CUDA. The generated source can still be
produced and compile-checked anywhere nvcc exists (:func:`generate`,
``toolchain.compile_check``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shapegrad.backends.base import (
    BackendUnavailable,
    CompileOptions,
    Generated,
    register_backend,
)
from shapegrad.backends.c import collectives
from shapegrad.backends.cuda.options import CudaOptions
from shapegrad.backends.cuda.render import launches_per_step, render_cuda, uses_cublas
from shapegrad.backends.cuda.toolchain import (
    DEFAULT_ARCH,
    NvccNotFound,
    build_launcher,
    make_spec,
    nvcc,
)
from shapegrad.backends.native import BuildSpec, cache_entry, full_source
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import dump_program, lower_program, stage_dumper
from shapegrad.compiler.target import Target
from shapegrad.ir import Graph

if TYPE_CHECKING:
    from shapegrad.backends.cuda.executable import CudaExecutable

__all__ = ["BuiltProgram", "CudaBackend", "build_program", "generate"]


def cuda_target(options: CompileOptions) -> Target:
    return options.of(CudaOptions).resolved_target()


def generate(graph: Graph, options: CompileOptions | None = None) -> tuple[L.Program, str]:
    """Run the loop pipeline for the GPU and render ``graph``; returns (program, CUDA source).

    Needs no GPU. Example:
        >>> program, source = generate(graph); compile_check(source)
    """
    options = options or CompileOptions()
    hook = stage_dumper(options.debug_dir, options.name) if options.debug_dir else None
    program, _stats = lower_program(graph, cuda_target(options), options.name, hook)
    return program, render_cuda(program)


class CudaBackend:
    """Compiles graphs to CUDA; see the module docstring."""

    name = "cuda"
    binds_state = True

    def is_available(self) -> tuple[bool, str]:
        from shapegrad.backends.cuda.driver import availability

        ok, reason = availability()
        if not ok:
            return ok, reason
        if nvcc() is None:
            return False, "CUDA backend: nvcc not found (install the CUDA toolkit or set $NVCC)"
        return True, ""

    def compile(self, graph: Graph, options: CompileOptions) -> CudaExecutable:
        from shapegrad.backends.cuda.driver import device_context

        opts = options.of(CudaOptions)
        device = device_context(opts.device)
        arch = opts.resolved_arch(device.info.arch) or DEFAULT_ARCH
        generated = self.generate(graph, options)
        built = build_generated(generated, options, arch)
        return load_built(graph, built, device)

    def generate(self, graph: Graph, options: CompileOptions) -> Generated:
        """Lower and render ``graph`` (no compiler runs, no GPU needed)."""
        t0 = time.perf_counter()
        program, source = generate(graph, options)
        return Generated(program, source, "cuda", (), {"lower+render": time.perf_counter() - t0})

    def compile_generated(
        self, graph: Graph, generated: Generated, options: CompileOptions
    ) -> CudaExecutable:
        """Build (or fetch) and load what :meth:`generate` made of ``graph``."""
        from shapegrad.backends.cuda.driver import device_context

        opts = options.of(CudaOptions)
        device = device_context(opts.device)
        arch = opts.resolved_arch(device.info.arch) or DEFAULT_ARCH
        return load_built(graph, build_generated(generated, options, arch), device)

    def build(self, graph: Graph, options: CompileOptions) -> str:
        """Generate, nvcc-compile and cache the launcher library without loading it.

        Needs nvcc (and cuBLAS for a program with products) but no GPU, driver or pycuda,
        so launchers can be prebuilt (CI, a login node); the architecture is the ``arch``
        option, else ``$SHAPEGRAD_CUDA_ARCH``, else ``sm_90`` (part of the cache key: a GPU
        of another architecture builds its own).
        """
        return cache_entry(build_program(graph, options, DEFAULT_ARCH).path)


@dataclass(frozen=True)
class BuiltProgram:
    """A launcher library in the cache and what it was built from."""

    program: L.Program
    spec: BuildSpec
    path: str
    launches: int  # kernels + cuBLAS calls per step (a layer body counted per layer)


def build_program(graph: Graph, options: CompileOptions, default_arch: str) -> BuiltProgram:
    """Lower, render and build ``graph``'s launcher (a verified cached one when present)."""
    program, source = generate(graph, options)
    generated = Generated(program, source, "cuda")
    arch = options.of(CudaOptions).resolved_arch(None) or default_arch
    return build_generated(generated, options, arch)


def build_generated(generated: Generated, options: CompileOptions, arch: str) -> BuiltProgram:
    """nvcc-build the launcher of a generated program into the cache (or find it there)."""
    program = generated.program
    assert isinstance(program, L.Program)
    try:
        spec = make_spec(generated.source, arch, uses_cublas(program))
        path = build_launcher(spec)
    except NvccNotFound as exc:
        raise BackendUnavailable(str(exc)) from exc
    if options.debug_dir:
        dump_program(options.debug_dir, options.name, program, full_source(spec), ".cu")
    return BuiltProgram(program, spec, path, launches_per_step(program))


def load_built(graph: Graph, built: BuiltProgram, device: Any) -> CudaExecutable:
    """``dlopen`` a built launcher, hand it MPI when it exchanges, wrap it for ``device``."""
    from shapegrad.backends.cuda.executable import CudaExecutable
    from shapegrad.backends.cuda.launcher import ffi, load_launcher

    collectives.check_program(built.program)  # every process runs the same exchanges
    lib = load_launcher(built.path, built.spec.key)
    collectives.bind(lib, ffi(), built.program)
    return CudaExecutable(graph, built.program, lib, built.path, device, built.launches)


register_backend("cuda", CudaBackend, options=CudaOptions)
