"""Which OpenBLAS kernel set the C backend's products run on.

The scipy-openblas32 wheel is a ``DYNAMIC_ARCH`` build: when the library is loaded it picks
one kernel set (``Haswell``, ``SkylakeX``, ...) from the CPU's family and model, or takes
the one named by ``OPENBLAS_CORETYPE``. That variable is process-wide and often set for
another, older OpenBLAS (some machines set ``OPENBLAS_CORETYPE=Haswell`` because old builds
crash on their CPU); on an AVX-512 CPU it halves the products' speed. Measured with
``benchmarks/gemm_rate.py`` (AMD EPYC family 26 model 2 = Zen 5, AVX-512 with 512-bit
vectors, one thread, both kernel sets loaded in one process, interleaved, fastest call,
2 cores shared with other jobs at load average 7.8-9.4): sgemm 128x784x512 135 GFLOP/s
(Haswell) vs 240 (SkylakeX), 784x128x512 (weight gradient) 137 vs 258, 128x1024x1024 132
vs 210; XLA (JAX) 250, 255, 243; MKL (PyTorch, and the mkl wheel) 105-120. Without the
variable the wheel (0.3.34) picks ``SkylakeX`` on that CPU by itself.

``SHAPEGRAD_BLAS_CORETYPE`` chooses the kernel set of shapegrad's own OpenBLAS (the
scipy-openblas32 wheel) without touching the process's other OpenBLAS libraries (NumPy's
and SciPy's are separate copies):

* unset or empty (the default): the user's ``OPENBLAS_CORETYPE`` when set; else the
  set for the CPU's flags, as under ``auto`` (an older wheel that the requirement
  ``scipy-openblas32>=0.3.27`` allows may not know a new CPU and fall back to AVX2);
* ``auto``: from the CPU's flags, whatever ``OPENBLAS_CORETYPE`` says: ``SkylakeX``
  (OpenBLAS's AVX-512 single/double GEMM kernels) when the CPU and the OS support the
  AVX-512 subset those kernels use (F, DQ, CD, BW, VL); otherwise OpenBLAS's own detection
  (every AVX2-only CPU, other architectures, flags that cannot be read: no
  ``/proc/cpuinfo`` on macOS or Windows). Linux clears the ``avx512*`` flags when the
  kernel does not save the AVX-512 register state, so the flags also say the OS supports
  them;
* any other value: that OpenBLAS core name (``Haswell``, ``SkylakeX``, ``Zen``, ...).

OpenBLAS reads ``OPENBLAS_CORETYPE`` once, when it is loaded, so the choice is put there
just for the import of the wheel (which loads the library) and the previous value is
restored afterwards: child processes and libraries loaded later see the user's
environment. :func:`loaded_core` tells which set is running.
"""

from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import Iterator, Mapping, Set
from contextlib import contextmanager

# The AVX-512 subset OpenBLAS's SkylakeX kernels are compiled for (-march=skylake-avx512).
SKYLAKEX_FLAGS = frozenset({"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"})
AVX512_CORE = "SkylakeX"
_X86_64 = ("x86_64", "AMD64", "amd64")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The CPU's feature flags as Linux reports them (empty when they cannot be read)."""
    try:
        with open(cpuinfo, encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def choose_core(
    request: str, flags: Set[str], machine: str, environ: Mapping[str, str]
) -> str | None:
    """The ``OPENBLAS_CORETYPE`` for shapegrad's OpenBLAS: a name, ``""`` for OpenBLAS's
    own detection, or None to leave ``environ`` as it is. ``request`` is the value of
    ``SHAPEGRAD_BLAS_CORETYPE`` (see the module docstring for the rule)."""
    request = request.strip()
    user_set = bool(environ.get("OPENBLAS_CORETYPE", "").strip())
    if request and request.lower() != "auto":
        return request
    if not request and user_set:
        return None  # the default defers to the user's process-wide choice
    if machine in _X86_64 and flags >= SKYLAKEX_FLAGS:
        return AVX512_CORE
    return "" if user_set else None


@contextmanager
def core_for_load() -> Iterator[str | None]:
    """Within the block, ``OPENBLAS_CORETYPE`` holds the choice for shapegrad's OpenBLAS
    (removed for OpenBLAS's own detection); the previous value is restored on exit. Yields
    the choice (None: the environment is left alone)."""
    core = choose_core(
        os.environ.get("SHAPEGRAD_BLAS_CORETYPE", ""), cpu_flags(), platform.machine(), os.environ
    )
    if core is None:
        yield None
        return
    before = os.environ.get("OPENBLAS_CORETYPE")
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core
    else:
        os.environ.pop("OPENBLAS_CORETYPE", None)
    try:
        yield core
    finally:
        if before is None:
            os.environ.pop("OPENBLAS_CORETYPE", None)
        else:
            os.environ["OPENBLAS_CORETYPE"] = before


def loaded_core(library: str) -> str:
    """The kernel set of the OpenBLAS at path ``library`` as loaded in this process
    (``openblas_get_corename``; loads it when it is not loaded yet). The scipy-openblas
    wheels prefix their symbols with ``scipy_``."""
    lib = ctypes.CDLL(library)
    for name in ("scipy_openblas_get_corename", "openblas_get_corename"):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            return str(fn().decode())
    raise OSError(f"{library}: no openblas_get_corename (not an OpenBLAS library?)")
