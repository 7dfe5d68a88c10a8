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

from typing import TYPE_CHECKING

from shapegrad.backends.base import BackendUnavailable, CompileOptions, register_backend
from shapegrad.backends.c.toolchain import full_source
from shapegrad.backends.cuda.options import CudaOptions
from shapegrad.backends.cuda.render import render_cuda
from shapegrad.backends.cuda.toolchain import NvccNotFound, build_launcher, make_spec, nvcc
from shapegrad.compiler import loops as L
from shapegrad.compiler.pipeline import dump_program, lower_program, stage_dumper
from shapegrad.compiler.target import Target
from shapegrad.ir import Graph

if TYPE_CHECKING:
    from shapegrad.backends.cuda.executable import CudaExecutable

__all__ = ["CudaBackend", "generate"]


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
        from shapegrad.backends.cuda.executable import CudaExecutable
        from shapegrad.backends.cuda.launcher import load_launcher

        opts = options.of(CudaOptions)
        device = device_context(opts.device)
        arch = str(opts.resolved_arch(device.info.arch))
        program, source = generate(graph, options)
        uses_cublas = any(
            isinstance(s, L.Contract) for k in program.kernels for s in L.walk(k.body)
        )
        try:
            spec = make_spec(source, arch, uses_cublas)
            path = build_launcher(spec)
        except NvccNotFound as exc:
            raise BackendUnavailable(str(exc)) from exc
        if options.debug_dir:
            dump_program(options.debug_dir, options.name, program, full_source(spec), ".cu")
        launches = source.count(">>>(") + source.count("cublasGemmStridedBatchedEx(blas")
        lib = load_launcher(path, spec.key)
        return CudaExecutable(graph, program, lib, path, device, launches)


register_backend("cuda", CudaBackend, options=CudaOptions)
