"""Backend ``"cuda"``: the loop IR rendered as CUDA kernels, run through pycuda on NVIDIA GPUs.

Pipeline: ``compiler.pipeline.lower_program`` with :data:`CUDA_TARGET` (the same
loop stages as the C backend; a GPU schedule is a Target setting) ->
``render_cuda`` (``__global__`` kernels + a host launcher) -> ``nvcc -shared``
into the disk cache -> ``dlopen`` -> :class:`CudaExecutable` on a device's
stream, with parameters and optimizer state resident on the GPU.

Backend options (``CompileOptions.extra``): ``device`` (GPU number, default 0),
``target`` (a :class:`~shapegrad.compiler.target.Target` replacing
:data:`CUDA_TARGET`), ``arch`` (e.g. ``"sm_90"``; default: the device's).

Needs pycuda, an NVIDIA driver with a GPU, and nvcc (the CUDA toolkit); cuBLAS comes
from the ``nvidia-cublas`` wheel (``pip install 'shapegrad[cuda]'``). Without them,
``sg.compile(..., backend="cuda")`` raises :class:`BackendUnavailable` naming what is
missing; ``import shapegrad`` never touches CUDA. The generated source can still be
produced and compile-checked anywhere nvcc exists (:func:`generate`,
``toolchain.compile_check``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shapegrad.backends.base import BackendUnavailable, CompileOptions, register_backend
from shapegrad.backends.c import collectives
from shapegrad.backends.c.toolchain import BuildSpec, full_source
from shapegrad.backends.cuda.render import launches_per_step, render_cuda, uses_cublas
from shapegrad.backends.cuda.toolchain import (
    DEFAULT_ARCH,
    NvccNotFound,
    build_launcher,
    make_spec,
    nvcc,
)
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import dump_program, lower_program, stage_dumper
from shapegrad.compiler.target import CUDA_TARGET, Target
from shapegrad.ir import Graph

if TYPE_CHECKING:
    from shapegrad.backends.cuda.executable import CudaExecutable

__all__ = ["BuiltProgram", "CudaBackend", "build_program", "generate"]


def cuda_target(options: CompileOptions) -> Target:
    target = options.get("target", CUDA_TARGET)
    if not isinstance(target, Target):
        raise TypeError(f"backend option 'target' must be a Target, got {type(target).__name__}")
    return target


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
        from shapegrad.backends.cuda.executable import CudaExecutable
        from shapegrad.backends.cuda.launcher import ffi, load_launcher

        device = device_context(int(options.get("device", 0)))
        built = build_program(graph, options, default_arch=device.info.arch)
        collectives.check_program(built.program)  # every process runs the same exchanges
        lib = load_launcher(built.path, built.spec.key)
        collectives.bind(lib, ffi(), built.program)
        return CudaExecutable(graph, built.program, lib, built.path, device, built.launches)

    def build(self, graph: Graph, options: CompileOptions) -> str:
        """Generate, nvcc-compile and cache the launcher library without loading it.

        Needs nvcc (and cuBLAS for a program with products) but no GPU, driver or pycuda,
        so launchers can be prebuilt (CI, a login node); the architecture is the ``arch``
        option, else ``$SHAPEGRAD_CUDA_ARCH``, else ``sm_90``.
        """
        return build_program(graph, options, default_arch=DEFAULT_ARCH).path


@dataclass(frozen=True)
class BuiltProgram:
    """A launcher library in the cache and what it was built from."""

    program: L.Program
    spec: BuildSpec
    path: str
    launches: int  # kernels + cuBLAS calls per step (counted in the generated source)


def build_program(graph: Graph, options: CompileOptions, default_arch: str) -> BuiltProgram:
    """Lower, render and build ``graph``'s launcher (a verified cached one when present)."""
    arch = str(options.get("arch", os.environ.get("SHAPEGRAD_CUDA_ARCH") or default_arch))
    program, source = generate(graph, options)
    try:
        spec = make_spec(source, arch, uses_cublas(program))
        path = build_launcher(spec)
    except NvccNotFound as exc:
        raise BackendUnavailable(str(exc)) from exc
    if options.debug_dir:
        dump_program(options.debug_dir, options.name, program, full_source(spec), ".cu")
    return BuiltProgram(program, spec, path, launches_per_step(program))


register_backend("cuda", CudaBackend)
