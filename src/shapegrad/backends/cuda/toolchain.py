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
import hashlib
import importlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache

from shapegrad._version import __version__
from shapegrad.backends.c import toolchain as c_toolchain

CUDA_FLAGS = ("-O3", "-std=c++17", "-x", "cu", "-Xcompiler", "-fPIC", "-shared")
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


@lru_cache(maxsize=4)
def nvcc_version(path: str) -> str:
    """The release and build lines of ``nvcc --version`` (part of the cache key)."""
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    lines = (out.stdout or out.stderr).strip().splitlines()
    return " ".join(lines[-2:]) if lines else path


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


@dataclass(frozen=True)
class LauncherSpec:
    """Everything that determines a launcher library."""

    source: str
    nvcc: str
    arch: str
    link: tuple[str, ...]

    @property
    def key(self) -> str:
        h = hashlib.sha256()
        for part in (
            self.source,
            nvcc_version(self.nvcc),
            " ".join(CUDA_FLAGS),
            self.arch,
            " ".join(self.link),
            __version__,
        ):
            h.update(part.encode())
            h.update(b"\0")
        return "cu" + h.hexdigest()[:30]

    def full_source(self) -> str:
        return self.source + f'\nextern "C" const char sg_key[] = "{self.key}";\n'


def make_spec(source: str, arch: str, uses_cublas: bool) -> LauncherSpec:
    link: tuple[str, ...] = ()
    if uses_cublas:
        lib = cublas_library()
        if lib is None:
            raise NvccNotFound(
                "CUDA backend: this program multiplies matrices with cuBLAS, which was not found "
                "(pip install nvidia-cublas, or install the CUDA toolkit's cuBLAS)"
            )
        folder = os.path.dirname(lib)
        link = (lib, f"-Xlinker=-rpath,{folder}")
    return LauncherSpec(source, require_nvcc(), arch, link)


def build_launcher(spec: LauncherSpec) -> str:
    """Compile ``spec`` into the cache (atomically) unless a verified copy is there."""
    folder = c_toolchain.cache_dir()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    final = os.path.join(folder, spec.key + ".so")
    if _verified(final):
        return final
    fd, tmp_src = tempfile.mkstemp(prefix=f"{spec.key}-", suffix=".cu", dir=folder)
    tmp_so = tmp_src[:-3] + ".so"
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(spec.full_source())
    cmd = [spec.nvcc, *CUDA_FLAGS, f"-arch={spec.arch}", tmp_src, "-o", tmp_so, *spec.link]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        kept = os.path.join(folder, spec.key + ".failed.cu")
        os.replace(tmp_src, kept)
        raise NvccError(
            f"CUDA backend: nvcc failed on {kept} (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()[-4000:]}"
        )
    os.unlink(tmp_src)
    with open(tmp_so, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    fd, tmp_sum = tempfile.mkstemp(prefix=f"{spec.key}-", suffix=".sha256", dir=folder)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(digest)
    os.replace(tmp_so, final)  # library first: a reader that sees the new checksum sees it
    os.replace(tmp_sum, final + ".sha256")
    return final


def _verified(path: str) -> bool:
    try:
        with open(path + ".sha256", encoding="ascii") as handle:
            expected = handle.read().strip()
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest() == expected
    except OSError:
        return False
