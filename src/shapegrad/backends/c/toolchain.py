"""The C backend's compiler, flags and link line (the build, cache and loading rules are
``backends/native.py``'s, shared with CUDA).

* Compiler: ``$CC`` (default ``cc``). Flags: :data:`DEFAULT_CFLAGS`, replaced
  by ``$SHAPEGRAD_CFLAGS`` when set (e.g. ``-O1 -g -fsanitize=address,undefined``);
  ``-fPIC -shared`` (and the BLAS link line when the program calls it) are always added.
* BLAS: the scipy-openblas32 wheel (:func:`blas_paths`). Its kernel set comes from the
  CPU's flags (AVX-512 kernels where the CPU has them) unless ``$OPENBLAS_CORETYPE`` is
  set; ``$SHAPEGRAD_BLAS_CORETYPE`` (``auto`` or a core name) overrides both, for
  shapegrad's OpenBLAS alone (``blascore``).
* Cache: ``$XDG_CACHE_HOME/shapegrad`` (default ``~/.cache/shapegrad``). The key
  hashes the generated source, the compiler's ``--version``, the flags, the CPU
  (``-march=native`` code is CPU-specific) and the shapegrad version. The library
  is ``<key>.so`` with its SHA-256 in ``<key>.sha256``; both are published atomically
  (``_cache.publish``), so concurrent processes never load half a library. A library
  whose checksum does not match (truncated, corrupted) is rebuilt. The key is also
  compiled into the library (``sg_key``) and checked after ``dlopen``.
* Loading: a cached library is opened once and checked through that descriptor (ours
  alone, checksum, complete ELF); what ``dlopen`` receives is a private name for that
  same file (a hard link whose inode is the checked one, else a copy of the checked
  bytes) in this process's ``.load-*`` directory, so swapping the cache entry after the
  check changes nothing. A cache on a read-only disk is read as it is; new libraries
  then go to the private fallback cache.

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
``-fvect-cost-model=dynamic`` (``-O3``'s model; ``-O2`` uses "very cheap"): a loop that
calls a vector ``tanhf`` and then evaluates a long expression (GELU's merged backward loop
in the transformer's layer loop) stays scalar under the very-cheap model; with it the
charlm layer-loop step went from 98 to 67 ms CPU per step, the unrolled one unchanged,
compile CPU time within 2%.
"""

from __future__ import annotations

import importlib
import os
import platform
import shlex
import warnings
from functools import lru_cache

from shapegrad.backends.c.blascore import core_for_load, loaded_core
from shapegrad.backends.native import (
    VERSION,
    BuildSpec,
    CacheError,
    CacheWarning,
    CompileError,
    CompilerNotFound,
    build_library,
    cache_dir,
    cached_library,
    cached_library_by_key,
    compile_time_limit,
    compiler_version,
    cpu_identity,
    full_source,
    is_temp,
    library_dir,
    library_dirs,
    library_for,
    library_is_complete,
    load_path,
    missing_compiler_message,
    pinned_path,
    publish,
    verified_bytes,
)

# Names of the shared build module that C-backend code and tests reach through here.
__all__ = [
    "DEFAULT_CFLAGS",
    "VERSION",
    "BuildSpec",
    "CacheError",
    "CacheWarning",
    "CompileError",
    "CompilerNotFound",
    "blas_core",
    "blas_paths",
    "build_library",
    "cache_dir",
    "cached_library",
    "cached_library_by_key",
    "cflags",
    "compile_time_limit",
    "compiler",
    "compiler_version",
    "cpu_identity",
    "full_source",
    "has_vector_math",
    "is_temp",
    "library_dir",
    "library_dirs",
    "library_for",
    "library_is_complete",
    "load_path",
    "make_spec",
    "missing_compiler_message",
    "pinned_path",
    "publish",
    "verified_bytes",
]

DEFAULT_CFLAGS = (
    "-O2 -ftree-vectorize -fpeel-loops -march=native -fopenmp -fno-math-errno -fno-trapping-math "
    "-fno-signed-zeros -fassociative-math -fno-semantic-interposition -fvect-cost-model=dynamic"
)


def compiler() -> str:
    """The compiler command from ``$CC`` (default ``cc``)."""
    return os.environ.get("CC", "").strip() or "cc"


def cflags() -> list[str]:
    """Optimisation/sanitizer flags: ``$SHAPEGRAD_CFLAGS`` or :data:`DEFAULT_CFLAGS`."""
    override = os.environ.get("SHAPEGRAD_CFLAGS")
    return shlex.split(override if override is not None else DEFAULT_CFLAGS)


@lru_cache(maxsize=1)
def blas_paths() -> tuple[str, str]:
    """(library directory, library name) of the scipy-openblas32 wheel.

    Importing the wheel's module loads OpenBLAS, which then keeps its kernel set: the import
    runs under ``$SHAPEGRAD_BLAS_CORETYPE``'s choice (``blascore``). A warning says when
    the set running is not the one chosen (an unknown name, or the library was loaded
    before shapegrad chose).
    """
    with core_for_load() as chosen:
        blas = importlib.import_module("scipy_openblas32")  # untyped third-party module
    libdir = str(blas.get_lib_dir())
    if chosen:
        running = loaded_core(os.path.join(libdir, str(blas.get_library(fullname=True))))
        if running.lower() != chosen.lower():
            warnings.warn(
                f"OpenBLAS runs its {running} kernels, not the {chosen} kernels chosen for "
                "shapegrad (SHAPEGRAD_BLAS_CORETYPE, see backends/c/blascore.py): the name "
                "is unknown to this OpenBLAS or the library was loaded before shapegrad "
                "chose",
                RuntimeWarning,
                stacklevel=2,
            )
    return libdir, str(blas.get_library())


def blas_core() -> str:
    """The OpenBLAS kernel set (``Haswell``, ``SkylakeX``, ...) products run on in this
    process; benchmarks print it next to their figures."""
    libdir, _ = blas_paths()
    blas = importlib.import_module("scipy_openblas32")
    return loaded_core(os.path.join(libdir, str(blas.get_library(fullname=True))))


@lru_cache(maxsize=1)
def has_vector_math() -> bool:
    """Whether glibc's vector math library can be linked (Linux x86-64 with glibc >= 2.22)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    import ctypes.util

    return ctypes.util.find_library("mvec") is not None


def make_spec(source: str, blas: bool, vector_math: bool = False) -> BuildSpec:
    link: tuple[str, ...] = ()
    if blas:
        libdir, libname = blas_paths()
        link = (f"-L{libdir}", f"-l{libname}", f"-Wl,-rpath,{libdir}")
    if vector_math:
        link += ("-lmvec",)
    return BuildSpec(
        source, compiler(), tuple(cflags()), link, time_limit=compile_time_limit(600.0)
    )
