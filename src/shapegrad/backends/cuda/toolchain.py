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
import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

from shapegrad.backends.native import BuildSpec, compile_time_limit, library_for

CUDA_FLAGS = ("-O3", "-std=c++17", "-x", "cu")
DEFAULT_ARCH = "sm_90"
# nvcc on a 2-core machine: an MLP training step's launcher builds in ~10 s, a 16-block
# transformer's in well under a minute; 5 minutes means something is wrong.
NVCC_TIME_LIMIT = 300.0


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
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            kept = os.path.join(tempfile.gettempdir(), f"shapegrad-slow-{os.getpid()}.cu")
            shutil.copyfile(src, kept)
            raise NvccError(
                f"nvcc -cubin -arch={arch} ran longer than {timeout:g} s and was stopped; "
                f"source kept at {kept}"
            ) from exc
        if proc.returncode != 0:
            kept = os.path.join(tempfile.gettempdir(), f"shapegrad-failed-{os.getpid()}.cu")
            shutil.copyfile(src, kept)
            raise NvccError(
                f"nvcc -cubin -arch={arch} failed on {kept} (exit {proc.returncode}):\n"
                f"{proc.stderr.strip()[-4000:]}"
            )


# Where cuBLAS lives: NVIDIA's wheels put it under the ``nvidia`` namespace package, in
# ``cu13/lib`` (nvidia-cublas 13.x), ``cu12/lib`` (nvidia-cublas-cu12 >= 12.8) or
# ``cublas/lib`` (older cu12 wheels); the toolkit keeps it in ``lib64`` or
# ``targets/<arch>-linux/lib``. Wheels come first: ``pip install 'shapegrad[cuda]'``
# is what the README tells users to do.
WHEEL_LIB_DIRS = ("cu13/lib", "cu12/lib", "cublas/lib")
TOOLKIT_LIB_DIRS = ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib")


def wheel_roots() -> list[str]:
    """The directories of the ``nvidia`` namespace package (one per site directory)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return [str(p) for p in spec.submodule_search_locations]


def cuda_homes() -> list[str]:
    homes = [os.environ.get(v, "") for v in ("CUDA_HOME", "CUDA_PATH")]
    found = nvcc()
    if found:  # <home>/bin/nvcc
        homes.append(os.path.dirname(os.path.dirname(os.path.realpath(found))))
    homes.append("/usr/local/cuda")
    return list(dict.fromkeys(h for h in homes if h))


def cuobjdump() -> str | None:
    """NVIDIA's disassembler (``cuobjdump``, which runs ``nvdisasm`` from its own folder):
    on ``$PATH``, in the CUDA toolkit, or from the ``nvidia-cuda-cuobjdump`` wheel (the dev
    extra: the tests read the machine code ptxas made); None when there is none."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    folders = [os.path.join(h, "bin") for h in cuda_homes()]
    folders += [os.path.join(r, sub) for r in wheel_roots() for sub in ("cu13/bin", "cu12/bin")]
    for folder in folders:
        path = os.path.join(folder, "cuobjdump")
        if os.access(path, os.X_OK):
            return path
    return None


def _cublas_in(folder: str) -> str | None:
    """The cuBLAS library file in ``folder`` (not cuBLASLt), unversioned name first."""
    names = [
        p
        for p in glob.glob(os.path.join(folder, "libcublas.so*"))
        if os.path.basename(p).startswith("libcublas.so")
    ]
    return min(names, key=lambda p: (len(os.path.basename(p)), p)) if names else None


def cublas_library(
    roots: Sequence[str] | None = None, homes: Sequence[str] | None = None
) -> str | None:
    """Path of libcublas: from NVIDIA's wheels (``nvidia/cu13/lib``, ``nvidia/cu12/lib``,
    ``nvidia/cublas/lib``), else the CUDA toolkit's; None when there is none."""
    for root in wheel_roots() if roots is None else roots:
        for sub in WHEEL_LIB_DIRS:
            found = _cublas_in(os.path.join(root, sub))
            if found:
                return found
    for home in cuda_homes() if homes is None else homes:
        for sub in TOOLKIT_LIB_DIRS:
            found = _cublas_in(os.path.join(home, sub))
            if found:
                return found
    return None


def cublas_link(lib: str) -> tuple[str, ...]:
    """Link-line arguments for the cuBLAS file ``lib``.

    Never the file itself as an input: nvcc's ``-x cu`` applies to every later input, so
    a library path after it is compiled as CUDA source (54 MB: the build never ends).
    ``-l:<file name>`` links that exact file (wheels ship only ``libcublas.so.13``, no
    unversioned name) and records its soname; the rpath finds it at load time.
    """
    folder = os.path.dirname(os.path.abspath(lib))
    return (f"-L{folder}", f"-l:{os.path.basename(lib)}", f"-Xlinker=-rpath,{folder}")


def make_spec(source: str, arch: str, uses_cublas: bool) -> BuildSpec:
    """The C toolchain's build spec for a launcher library (same cache, same trust rules)."""
    link: tuple[str, ...] = ()
    if uses_cublas:
        lib = cublas_library()
        if lib is None:
            raise NvccNotFound(
                "CUDA backend: this program multiplies matrices with cuBLAS, which was not found "
                "(pip install 'shapegrad[cuda]' for the nvidia-cublas wheel, or install the "
                "CUDA toolkit's cuBLAS)"
            )
        link = cublas_link(lib)
    return BuildSpec(
        source,
        require_nvcc(),
        (*CUDA_FLAGS, f"-arch={arch}"),
        link,
        suffix=".cu",
        shared_flags=("-Xcompiler", "-fPIC", "-shared"),
        key_decl='extern "C" const char sg_key[]',
        time_limit=compile_time_limit(NVCC_TIME_LIMIT),
    )


def build_launcher(spec: BuildSpec) -> str:
    """The launcher library for ``spec``: a verified cached one, else a fresh nvcc build."""
    return library_for(spec)[0]
