"""Compiler invocation and the on-disk artifact cache of the C backend.

* Compiler: ``$CC`` (default ``cc``). Flags: :data:`DEFAULT_CFLAGS`, replaced
  by ``$SHAPEGRAD_CFLAGS`` when set (e.g. ``-O1 -g -fsanitize=address,undefined``);
  ``-fPIC -shared`` (and the BLAS link line when the program calls it) are always added.
* Cache: ``$XDG_CACHE_HOME/shapegrad`` (default ``~/.cache/shapegrad``). The key
  hashes the generated source, the compiler's ``--version``, the flags, the CPU
  (``-march=native`` code is CPU-specific) and the shapegrad version. The library
  is ``<key>.so`` with its SHA-256 in ``<key>.sha256``; both are written to temp
  files and ``os.replace``d (atomic), so concurrent processes never load half a
  library. A library whose checksum does not match (truncated, corrupted) is
  rebuilt. The key is also compiled into the library (``sg_key``) and checked
  after ``dlopen``.

Flag choice (measured on the 2-core dev box with benchmarks/train_step.py and
``gcc -ftime-report``; gcc 12): ``-O2 -ftree-vectorize -fpeel-loops -march=native``.
Against ``-O3`` it runs the moons step as fast (0.46 vs 0.45 µs/step at batch 10,
9.7 vs 10.3 µs at batch 256, K-step calls) and compiles in half the CPU time
(0.24 s vs 0.47 s for the moons step): ``-fpeel-loops`` (complete unrolling of the
many short constant-trip loops) is the part of ``-O3`` that matters here; plain
``-O2`` was 30-50% slower on the moons step. We do not use ``-ffast-math``: it
implies ``-ffinite-math-only``, which lets the compiler assume no NaN/Inf and
breaks ``log(0) = -inf``, the NaN-propagating ``maximum`` and NaN checks that
tests and users rely on. We keep the parts that are safe for those semantics
and let reductions vectorize: ``-fno-math-errno -fno-trapping-math
-fno-signed-zeros -fassociative-math`` (reassociation changes summation order,
as NumPy's pairwise sums do). FMA contraction is GCC's default (``-ffp-contract=fast``).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache

from shapegrad._version import __version__

DEFAULT_CFLAGS = (
    "-O2 -ftree-vectorize -fpeel-loops -march=native -fopenmp -fno-math-errno -fno-trapping-math "
    "-fno-signed-zeros -fassociative-math -fno-semantic-interposition"
)
_VERSION = __version__

# Counts compiler runs in this process (tests check cache hits with it).
compile_count = 0


class CompilerNotFound(RuntimeError):
    """No C compiler could be run."""


class CompileError(RuntimeError):
    """The C compiler rejected generated source; the message names the file."""


def compiler() -> str:
    """The compiler command from ``$CC`` (default ``cc``)."""
    return os.environ.get("CC", "").strip() or "cc"


def cflags() -> list[str]:
    """Optimisation/sanitizer flags: ``$SHAPEGRAD_CFLAGS`` or :data:`DEFAULT_CFLAGS`."""
    override = os.environ.get("SHAPEGRAD_CFLAGS")
    return shlex.split(override if override is not None else DEFAULT_CFLAGS)


def missing_compiler_message(cc: str) -> str:
    return (
        f"C backend: no C compiler found (tried {cc!r}; set $CC to choose one). "
        "Install one (Debian/Ubuntu: `apt install gcc`; Fedora: `dnf install gcc`; "
        "macOS: `xcode-select --install`), or compile with backend='numpy', which needs none."
    )


@lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """First line of ``cc --version`` (part of the cache key).

    Memoised on disk by the compiler binary's path, size and mtime, so a process that
    only loads cached libraries never runs the compiler.
    """
    exe = shutil.which(shlex.split(cc)[0]) if cc else None
    if exe is None:
        raise CompilerNotFound(missing_compiler_message(cc))
    st = os.stat(exe)
    ident = f"{cc}|{os.path.realpath(exe)}|{st.st_size}|{st.st_mtime_ns}"
    memo = os.path.join(cache_dir(), "cc-" + hashlib.sha256(ident.encode()).hexdigest()[:24])
    try:
        with open(memo, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        pass
    try:
        out = subprocess.run(
            [*shlex.split(cc), "--version"], capture_output=True, text=True, timeout=30
        )
    except OSError as exc:
        raise CompilerNotFound(missing_compiler_message(cc)) from exc
    text = out.stdout or out.stderr
    version = text.splitlines()[0] if text else cc
    _atomic_write(memo, version)
    return version


def _atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temp file and ``os.replace`` (best effort)."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError:
        pass


@lru_cache(maxsize=1)
def _cpu_identity() -> str:
    model = platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith(("model name", "flags")):
                    model += "|" + line.strip()
    except OSError:
        pass
    return model


@lru_cache(maxsize=1)
def blas_paths() -> tuple[str, str]:
    """(library directory, library name) of the scipy-openblas32 wheel."""
    blas = importlib.import_module("scipy_openblas32")  # untyped third-party module
    return str(blas.get_lib_dir()), str(blas.get_library())


def cache_dir() -> str:
    """``$XDG_CACHE_HOME/shapegrad`` (default ``~/.cache/shapegrad``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "shapegrad")


@dataclass(frozen=True)
class BuildSpec:
    """Everything that determines a library: source, compiler, flags, link line."""

    source: str
    cc: str
    flags: tuple[str, ...]
    link: tuple[str, ...]

    @property
    def key(self) -> str:
        h = hashlib.sha256()
        for part in (
            self.source,
            compiler_version(self.cc),
            self.cc,
            " ".join(self.flags),
            " ".join(self.link),
            _cpu_identity(),
            _VERSION,
        ):
            h.update(part.encode())
            h.update(b"\0")
        return h.hexdigest()[:32]


def make_spec(source: str, blas: bool, vector_math: bool = False) -> BuildSpec:
    link: tuple[str, ...] = ()
    if blas:
        libdir, libname = blas_paths()
        link = (f"-L{libdir}", f"-l{libname}", f"-Wl,-rpath,{libdir}")
    if vector_math:
        link += ("-lmvec",)
    return BuildSpec(source, compiler(), tuple(cflags()), link)


@lru_cache(maxsize=1)
def has_vector_math() -> bool:
    """Whether glibc's vector math library can be linked (Linux x86-64 with glibc >= 2.22)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    import ctypes.util

    return ctypes.util.find_library("mvec") is not None


def _digest(path: str) -> str:
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def cached_library(spec: BuildSpec) -> str | None:
    """Path of a verified cached library for ``spec``, or None (missing or corrupt)."""
    path = os.path.join(cache_dir(), spec.key + ".so")
    try:
        with open(path + ".sha256", encoding="ascii") as handle:
            expected = handle.read().strip()
        return path if _digest(path) == expected else None
    except OSError:
        return None


def full_source(spec: BuildSpec) -> str:
    """The source actually compiled: the program plus its cache key symbol."""
    return spec.source + f'\nconst char sg_key[] = "{spec.key}";\n'


def build_library(spec: BuildSpec) -> str:
    """Compile ``spec`` into the cache (atomically) and return the library path.

    Raises:
        CompilerNotFound: no compiler.
        CompileError: the compiler failed; the message has the source path and its output.
    """
    global compile_count
    folder = cache_dir()
    os.makedirs(folder, exist_ok=True)
    key = spec.key
    final = os.path.join(folder, key + ".so")
    fd, tmp_c = tempfile.mkstemp(prefix=f"{key}-", suffix=".c", dir=folder)
    tmp_so = tmp_c[:-2] + ".so"
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(full_source(spec))
    cmd = [*shlex.split(spec.cc), *spec.flags, "-fPIC", "-shared", tmp_c, "-o", tmp_so, *spec.link]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except OSError as exc:
        os.unlink(tmp_c)
        raise CompilerNotFound(missing_compiler_message(spec.cc)) from exc
    compile_count += 1
    if proc.returncode != 0:
        kept = os.path.join(folder, key + ".failed.c")
        os.replace(tmp_c, kept)
        raise CompileError(
            f"C backend: {' '.join(cmd[:1])} failed on {kept} (exit {proc.returncode}):\n"
            f"{proc.stderr.strip()[-4000:]}"
        )
    os.unlink(tmp_c)
    digest = _digest(tmp_so)
    fd, tmp_sum = tempfile.mkstemp(prefix=f"{key}-", suffix=".sha256", dir=folder)
    with os.fdopen(fd, "w", encoding="ascii") as handle:
        handle.write(digest)
    # Library first, checksum second: a reader that sees the new checksum sees the new library.
    os.replace(tmp_so, final)
    os.replace(tmp_sum, final + ".sha256")
    return final


def library_for(spec: BuildSpec) -> tuple[str, bool]:
    """(path, was_cached): a verified cached library, else a fresh build."""
    found = cached_library(spec)
    if found is not None:
        return found, True
    return build_library(spec), False
