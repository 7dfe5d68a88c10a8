"""shapegrad's own float32 matrix product, and which library products it takes.

``sgemm.h`` (packaged C, inlined into every unit of a program that calls the library, like
``runtime.h``) defines ``sg_sgemm`` with ``cblas_sgemm``'s signature: where the C compiler
targets AVX-512F, a BLIS-style product (packed panels, an 8 x 48 block of zmm
accumulators); elsewhere a macro naming the library's ``scipy_cblas_sgemm``. So the choice
made here changes only AVX-512 builds: AVX2 (``-march`` without AVX-512, or
``SHAPEGRAD_CFLAGS``) and other CPUs call OpenBLAS exactly as before.

The choice is per product form, by measurement (``benchmarks/gemm_rate.py``, fastest
call of interleaved rounds, AMD EPYC Zen 5, OpenBLAS 0.3.34 SkylakeX kernels, load 3.7-5,
GFLOP/s, OpenBLAS vs own; at 2 threads both split by columns as the C backend does):

* ``c = a @ b`` (forward products): 1 thread 128x1024x1024 202 vs 230, 128x784x1024 204
  vs 230, 128x784x512 230 vs 236, 128x512x512 227 vs 240; 2 threads 374 vs 423, 382 vs
  443, 427 vs 413, 428 vs 422. Taken.
* ``c = a @ b^T`` (backward products through a weight, ``dh = dz @ W^T``): 1 thread
  128x1024x1024 204 vs 218, 128x512x512 221 vs 227; 2 threads 410 vs 438, 400 vs 393.
  Taken.
* ``c = a^T @ b`` (weight gradients, m = 512 to 1024, k = 128): 1 thread 235-246 vs
  227-241, 2 threads 416-449 vs 414-437: the library.
* small or thin products (any side below ``MIN_SIDE``): the library (37x53x71: 153 vs 94).

``$SHAPEGRAD_GEMM`` overrides for tests and measurements: ``auto`` (the rule above, the
default), ``blas`` (always the library), ``own`` (every float32 product this module can
take). The variable is read when a program is rendered, so it is part of the source and
therefore of the cache key.
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Final

from shapegrad.compiler import loops as L

SOURCE: Final = (
    resources.files("shapegrad.backends.c").joinpath("sgemm.h").read_text(encoding="utf-8")
)
ENV: Final = "SHAPEGRAD_GEMM"
MODES: Final = ("auto", "blas", "own")
# The smallest side (m, n and k) the rule sends to the own product: below it packing a
# panel costs more than the library's small-matrix paths (see the module docstring).
MIN_SIDE: Final = 64


def gemm_mode() -> str:
    """``$SHAPEGRAD_GEMM`` (``auto`` when unset); an unknown value is an error naming the
    valid ones."""
    mode = os.environ.get(ENV, "").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"${ENV}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def takes(s: L.Contract) -> bool:
    """Whether the float32 product ``s`` is rendered as a call of ``sg_sgemm``."""
    if s.dtype.name != "float32":
        return False
    mode = gemm_mode()
    if mode != "auto":
        return mode == "own"
    large = min(s.m, s.n, s.k) >= MIN_SIDE
    return large and not s.trans_a


def function(s: L.Contract) -> str:
    """The C function computing ``s``: ``sg_sgemm`` or the library's."""
    if takes(s):
        return "sg_sgemm"
    return "scipy_cblas_sgemm" if s.dtype.name == "float32" else "scipy_cblas_dgemm"


__all__ = ["ENV", "MIN_SIDE", "MODES", "SOURCE", "function", "gemm_mode", "takes"]
