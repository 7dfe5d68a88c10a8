"""shapegrad's batched float32 product, and which batched products it takes.

``sgemm_batch.h`` (packaged C, inlined after ``sgemm.h`` into every unit of a program that
uses it) defines ``sg_sgemm_batch``: every product of an ``L.Contract`` batch (both levels of
a two-level strided batch, any transposes, alpha, beta, rows of ``c`` ``ldc`` apart) in one
call, its products shared across the caller's OpenMP team inside the call. Where the C
compiler targets AVX-512F the products are computed by register blocks that broadcast
op(a) where it lies and read op(b) from a small panel gathered (transposed for ``b^T``) 64
columns at a time; elsewhere each product is the library's ``cblas_sgemm``, as it was before, so AVX2 builds
and other CPUs compute what they computed before.

The rule, by measurement (``benchmarks/batch_gemm_rate.py``, fastest call of 7 x 10 rounds
with L2 evicted before each call, AMD EPYC Zen 5, OpenBLAS 0.3.34 SkylakeX kernels, load
3.9-4.6; GFLOP/s of 128 products on the GPT step's real head-view strides, own vs one
``cblas_sgemm`` per product, which is what the C backend ran before):

* ``q k^T`` (64x64x32, ``b^T``): 1 thread 207 vs 148, 2 threads 345 vs 251; ``do v^T``
  213 vs 148, 372 vs 225 (the library packs each small ``b^T`` the slow way);
* ``p v``, ``p^T do``, ``ds^T q`` (64x32x64): 1 thread 225-240 vs 241-246, 2 threads
  367-394 vs 384-443: within a few percent, and in the step no slower (per-kernel
  profile, ``benchmarks/gpt_profile.py``; reading the strided head views of ``b`` in the
  tiles instead of gathering them first made these kernels 25% slower there);
* larger batches (``--sizes``, 1 thread): 128x128x64 ``b^T`` 198 vs 183, 256x256x256 254
  vs 231, ``a^T b`` 243 vs 231, 64x64x512 ``b^T`` 152 vs 155.

So every float32 batch (``batch > 1``, no summed batch) of products of at most
``MAX_ROWS`` rows, ``MAX_COLS`` columns and ``MAX_DEPTH`` summed terms is taken: one call
per batched product of a layer (attention's six: scores and weights @ v, four in the
backward). Larger products are left to the library.

``$SHAPEGRAD_BATCH_GEMM`` overrides for tests and measurements: ``auto`` (the rule, the
default), ``blas`` (never), ``own`` (every float32 product of a batch, ``batch > 1`` and no
summed batch). The variable is read when a program is rendered, so it is part of the source
and therefore of the library's cache key; the C backend adds it (and ``$SHAPEGRAD_GEMM``)
to the manifest key, so a warm cache never serves a library rendered under another value.
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Final

from shapegrad.backends.c import gemm_kernel
from shapegrad.compiler import loops as L

SOURCE: Final = (
    resources.files("shapegrad.backends.c").joinpath("sgemm_batch.h").read_text(encoding="utf-8")
)
ENV = "SHAPEGRAD_BATCH_GEMM"  # a plain assignment: tests/test_options.py finds the name
MODES: Final = gemm_kernel.MODES
MAX_ROWS: Final = 256
MAX_COLS: Final = 256
MAX_DEPTH: Final = 256


def batch_gemm_mode() -> str:
    """``$SHAPEGRAD_BATCH_GEMM`` (``auto`` when unset); an unknown value is an error naming
    the valid ones (:func:`gemm_kernel.checked_mode`)."""
    return gemm_kernel.checked_mode(ENV, os.environ.get(ENV, ""))


def takes(s: L.Contract) -> bool:
    """Whether the batched product ``s`` is rendered as one call of ``sg_sgemm_batch``."""
    if s.dtype.name != "float32" or s.batch < 2 or s.sum_batch != 1:
        return False
    mode = batch_gemm_mode()
    if mode != "auto":
        return mode == "own"
    return s.m <= MAX_ROWS and s.n <= MAX_COLS and s.k <= MAX_DEPTH


def call(s: L.Contract, split: bool, alpha: str) -> str:
    """The C statement computing all of ``s`` (``alpha``: its C expression); ``split``:
    share the products across the team (inside an OpenMP region, or serial outside one)."""
    return (
        f"sg_sgemm_batch({int(split)}, {int(s.trans_a)}, {int(s.trans_b)}, "
        f"{s.m}, {s.n}, {s.k}, {alpha}, {s.a} + {s.offset_a}, {s.lda}, "
        f"{s.b} + {s.offset_b}, {s.ldb}, {s.beta!r}f, {s.c}, {s.row_c}, {s.batch}, {s.inner}, "
        f"{s.stride_a}, {s.stride_b}, {s.stride_c}, "
        f"{s.inner_stride_a}, {s.inner_stride_b}, {s.inner_stride_c});"
    )


__all__ = [
    "ENV",
    "MAX_COLS",
    "MAX_DEPTH",
    "MAX_ROWS",
    "MODES",
    "SOURCE",
    "batch_gemm_mode",
    "call",
    "takes",
]
