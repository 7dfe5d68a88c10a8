"""nvcc invocation for the CUDA backend: compile checks and the cached host-launcher library.

* Compiler: ``$NVCC`` (default ``nvcc`` on ``PATH``, else ``$CUDA_HOME/bin/nvcc``).
  Architecture: the device's compute capability (``sm_90`` for an H100), or
  ``$SHAPEGRAD_CUDA_ARCH``; :func:`compile_check` defaults to ``sm_90``.
* The launcher library (``nvcc -shared``, the CUDA runtime linked statically, cuBLAS
  from NVIDIA's ``nvidia-cublas`` wheel when the program has products) goes into the
  C backend's disk cache with the same discipline: the key hashes the source, nvcc's
  ``--version``, the flags, the architecture and the package version; the library
  and its checksum are written atomically; the key is compiled in (``sg_key``) and
  checked after loading.

Flags: ``-O3`` for the host launcher and device code; no ``--use_fast_math`` (keeps
``log(0) = -inf``, NaN-propagating max and IEEE division, as the C backend does).
"""

from __future__ import annotations

import glob
import importlib
import os
import shutil
import subprocess
import tempfile

from shapegrad.backends.c.toolchain import BuildSpec, library_for

CUDA_FLAGS = ("-O3", "-std=c++17", "-x", "cu")
DEFAULT_ARCH = "sm_90"


class NvccNotFound(RuntimeError):
    """No nvcc: the CUDA toolkit is not installed (or not on PATH / CUDA_HOME)."""


class NvccError(RuntimeError):
    """nvcc rejected generated source; the message names the kept file and nvcc's output."""


def nvcc() -> str | None:
    """Path of nvcc, or None."""
    explicit = os.environ.get("NVCC", "").strip()
    if explicit:
        return shutil.which(explicit) or (explicit if os.path.exists(explicit) else None)
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    candidate = os.path.join(home, "bin", "nvcc")
    return candidate if os.path.exists(candidate) else None


def require_nvcc() -> str:
    path = nvcc()
    if path is None:
        raise NvccNotFound(
            "CUDA backend: nvcc not found (install the CUDA toolkit, or set $NVCC / $CUDA_HOME)"
        )
    return path


def compile_check(source: str, arch: str = DEFAULT_ARCH, timeout: float = 900) -> None:
    """Compile ``source``'s device code to a cubin (no GPU needed); raises :class:`NvccError`.

    Example:
        >>> compile_check(render_cuda(program))          # nvcc -cubin -arch=sm_90
    """
    path = require_nvcc()
    with tempfile.TemporaryDirectory() as folder:
        src = os.path.join(folder, "program.cu")
        with open(src, "w", encoding="utf-8") as handle:
            handle.write(source)
        cmd = [path, "-cubin", f"-arch={arch}", "-std=c++17", src, "-o", src + ".cubin"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            kept = os.path.join(tempfile.gettempdir(), f"shapegrad-failed-{os.getpid()}.cu")
            shutil.copyfile(src, kept)
            raise NvccError(
                f"nvcc -cubin -arch={arch} failed on {kept} (exit {proc.returncode}):\n"
                f"{proc.stderr.strip()[-4000:]}"
            )


def cublas_library() -> str | None:
    """Path of libcublas from the ``nvidia-cublas`` wheel (or ``$CUDA_HOME/lib64``), or None."""
    candidates: list[str] = []
    try:
        package = importlib.import_module("nvidia.cublas")  # untyped third-party namespace
        for root in list(getattr(package, "__path__", [])):
            candidates += sorted(glob.glob(os.path.join(root, "lib", "libcublas.so*")))
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    candidates += sorted(glob.glob(os.path.join(home, "lib64", "libcublas.so*")))
    libs = [c for c in candidates if "Lt" not in os.path.basename(c)]
    return libs[0] if libs else None


def make_spec(source: str, arch: str, uses_cublas: bool) -> BuildSpec:
    """The C toolchain's build spec for a launcher library (same cache, same trust rules)."""
    link: tuple[str, ...] = ()
    if uses_cublas:
        lib = cublas_library()
        if lib is None:
            raise NvccNotFound(
                "CUDA backend: this program multiplies matrices with cuBLAS, which was not found "
                "(pip install nvidia-cublas, or install the CUDA toolkit's cuBLAS)"
            )
        link = (lib, f"-Xlinker=-rpath,{os.path.dirname(lib)}")
    return BuildSpec(
        source,
        require_nvcc(),
        (*CUDA_FLAGS, f"-arch={arch}"),
        link,
        suffix=".cu",
        shared_flags=("-Xcompiler", "-fPIC", "-shared"),
        key_decl='extern "C" const char sg_key[]',
    )


def build_launcher(spec: BuildSpec) -> str:
    """The launcher library for ``spec``: a verified cached one, else a fresh nvcc build."""
    return library_for(spec)[0]
