"""shapegrad's own float32 matrix product, and which library products it takes.

``sgemm.h`` (packaged C, inlined into every unit of a program that calls the library, like
``runtime.h``) defines ``sg_sgemm`` with ``cblas_sgemm``'s signature: where the C compiler
targets AVX-512F, a BLIS-style product (packed panels, an 8 x 48 block of zmm
accumulators); elsewhere a macro naming the library's ``scipy_cblas_sgemm``. Likewise
``sg_gemm_abt_dot`` (``c = a @ b^T`` as dot products) or the library call
``cblas_sgemm(101, 111, 112, ...)`` it replaces. So the choice made here changes only
AVX-512 builds: AVX2 (``-march`` without AVX-512, or ``SHAPEGRAD_CFLAGS``) and other CPUs
call OpenBLAS exactly as before.

The choice is per product form, by measurement (``benchmarks/gemm_rate.py``, fastest
call of interleaved rounds, AMD EPYC Zen 5, OpenBLAS 0.3.34 SkylakeX kernels, load 3.7-5,
GFLOP/s, OpenBLAS vs own; at 2 threads both split by columns as the C backend does):

* ``c = a @ b`` (forward products): 1 thread 128x1024x1024 202 vs 230, 128x784x1024 204
  vs 230; 2 threads 374 vs 423, 382 vs 443. Taken.
* ``c = a @ b^T`` (backward products through a weight, ``dh = dz @ W^T``): 1 thread
  128x1024x1024 204 vs 218; 2 threads 410 vs 438. Taken.
* ``c = a^T @ b`` (weight gradients, m = 512 to 1024, k = 128): 1 thread 235-246 vs
  227-241, 2 threads 416-449 vs 414-437 alone; but see below: written (beta 0), taken.
* the same forms with more rows than one row block of the kernel (``MAX_ROWS``: the
  kernel packs ``op(b)`` again per block), fewer columns (``MIN_COLS``; at 2 threads each
  call gets half) or a short sum (``MIN_DEPTH``), 1 thread: 2048x128x512 224 vs 191,
  2048x128x384 b^T 217 vs 188, 2048x384x128 230 vs 232, 64x64x64 b^T 166 vs 132,
  256x256x64 232 vs 216, 37x53x71 153 vs 94: the library.

Inside a training step the products read cold operands and write cold results, and
there the rule differs from the calls alone (2026-11-27, per-kernel timers of the
compiled step, ``profile=True``; MLP 784-512-512-10, batch 128, same process, variants
interleaved; AMD EPYC Zen 5, 2 cores, AVX-512):

* ``c = a^T @ b`` written, not added to (``written_gradient``: a gradient that an Adam
  update or a data-parallel all-reduce reads; beta 0): the library first zeroes c in a
  pass of its own, then adds the product into it. 784x512x128 at 1 thread, 2 ranks of
  a data-parallel step: 513-549 us vs 430-444 own (512x512x128: 335-355 vs 285-293); an
  Adam step at 2 threads, 232-256 vs 218-234. Alone, caches flushed between calls
  (``k = 128``, own / library): 256 to 768 columns 0.88-0.98 at 1 and 2 threads (m 512
  to 1536 at 512 columns: 0.87-0.96); 1024 and 2048 columns 1.04-1.11 at 1 thread (c's
  rows 4 KB apart), 0.69-1.13 at 2. Taken from 256 to 768 columns at first
  (``MIN_COLS_GRADIENT``, ``MAX_COLS_GRADIENT``). With beta 1 (an SGD update folded into the product) the
  library stays: 449-457 vs 468-557. Since ``sgemm.h`` packs the next panel of ``b``
  while the current one multiplies (2026-11-27), w1024's 1024-column gradients in its
  Adam step (784 x 1024 and 1024 x 1024, k 128): whole step 0.973 at 2 threads, 0.988 at
  1 (in-process A/B, 15 rounds). Taken up to 1024 columns. SGD's updates folded in
  (beta 1) on the own product still lose there: w1024 step 1.025 at 2 threads, 1.040 at 1.
* the MLP's products with 512 columns (``MIN_COLS``): 128x784x512 at 1 thread 464-587
  vs 438-512, 2 threads 241-328 vs 232-272; 128x512x512 and its ``b^T`` form likewise.
  Taken. Whole steps (``new/old``, median of per-round ratios, in one process): MLP SGD
  0.908 at 2 threads, 0.960 at 1; MLP Adam 0.955; 784-1024-1024-10 Adam 0.979; the CNN
  and the charlm GPT step unchanged (0.99-1.01). ``compare_revisions.py`` (a fresh
  process per cell, 5 rounds): MLP 0.90 and 0.97 at 2 threads, 0.96 at 1; w1024 and
  the CNN 0.98-1.03 (their steps' products did not change).

Convolutions (the CNN of ``train_step.py``, per image of a batch of 64, 1 thread, CPU
time of the 64 calls, load 2-4, GFLOP/s OpenBLAS vs own; ``backends/c/sgemm.h``):

* ``W @ im2col``, 32x784x144, and ``W^T @ dy``, 144x784x32 (``op(b)`` is 784 columns wide,
  rows 49 cache lines apart: ``sg_sgemm`` reads it in place, ``reads_b_in_place``):
  185-188 vs 257-263 and 197-212 vs 241-249. Taken (``takes``).
* the weight gradient ``dy @ im2col^T`` summed over images (32x144, 784 terms; the library
  runs it transposed, 144x32, its faster form): 182-193 vs 238-239 as dot products
  (``sg_gemm_abt_dot``; 156 packed by ``sg_sgemm``). Taken (``takes_dot``); the first
  layer's 16x9 gradient runs alike (0.076 vs 0.080 ms).
* The whole step at 1 thread (``conv_kernels.py --ab blas,auto``, CPU time, 9 rounds, load
  4.9-5.5): 12.17 -> 10.17 ms.

``$SHAPEGRAD_GEMM`` overrides for tests and measurements: ``auto`` (the rule above, the
default), ``blas`` (always the library), ``own`` (every float32 product rendered as one
call per block, whatever its form, and every summed ``a @ b^T`` as dot products). The
variable is read when a program is rendered, so it is part of the source and therefore of
the library's cache key; the C backend adds it to the manifest key too (a new process
would otherwise load the library built under another mode).
"""

from __future__ import annotations

import os
from importlib import resources
from typing import Final

from shapegrad.compiler import loops as L

SOURCE: Final = (
    resources.files("shapegrad.backends.c").joinpath("sgemm.h").read_text(encoding="utf-8")
)
ENV = "SHAPEGRAD_GEMM"  # a plain assignment: tests/test_options.py finds the name
MODES: Final = ("auto", "blas", "own")
# The products the rule sends to the own product (measured: the module docstring): rows
# m in [MIN_ROWS, MAX_ROWS] (one row block of the kernel, ``SG_GEMM_MC``), at least MIN_COLS
# columns and MIN_DEPTH summed terms.
MIN_ROWS: Final = 64
MAX_ROWS: Final = 128
MIN_COLS: Final = 512
MIN_DEPTH: Final = 256
# Weight gradients ``c = a^T @ b`` written, not added to (beta 0: the product a data-parallel
# all-reduce or an Adam update reads; the library zeroes c in a pass of its own first):
# MIN_ROWS to MAX_ROWS_GRADIENT rows, MIN_COLS_GRADIENT to MAX_COLS_GRADIENT columns (1024:
# w1024's, measured inside Adam steps; wider ones were not) and at least MIN_DEPTH_GRADIENT
# summed terms (the batch). The measured range; see the module docstring.
MAX_ROWS_GRADIENT: Final = 1536
MIN_COLS_GRADIENT: Final = 256
MAX_COLS_GRADIENT: Final = 1024
MIN_DEPTH_GRADIENT: Final = 128
# Products reading op(b) in place (``reads_b_in_place``; a convolution's per-image forward
# and input-gradient products, ``b`` an im2col or an output gradient of 28 x 28 = 784
# columns): at least MIN_DEPTH_IN_PLACE summed terms (a shorter sum stores c more often
# than it multiplies) and at most MAX_ROWS_IN_PLACE rows (two row blocks).
PANEL_COLS: Final = 48
MIN_DEPTH_IN_PLACE: Final = 32
MAX_ROWS_IN_PLACE: Final = 256
# The dot-product form of a summed ``a @ b^T`` (``takes_dot``): at least this many terms
# per dot product, so the final adds of each accumulator's 16 lanes are a small share.
MIN_DEPTH_DOT: Final = 256


def checked_mode(env: str, value: str) -> str:
    """``value`` of ``$env`` as one of ``MODES`` (``auto`` when empty); an unknown value is
    an error naming the valid ones. The product switches (``SHAPEGRAD_GEMM``,
    ``SHAPEGRAD_BATCH_GEMM``; each module reads its own, where tests/test_options.py
    finds it)."""
    mode = value.strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"${env}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


def gemm_mode() -> str:
    """``$SHAPEGRAD_GEMM``: see :func:`checked_mode`."""
    return checked_mode(ENV, os.environ.get(ENV, ""))


def reads_b_in_place(s: L.Contract) -> bool:
    """Whether ``sg_sgemm`` reads ``op(b) = b`` in place for ``s`` (``sg_gemm_b_in_place``
    in ``sgemm.h``): not transposed, at least one 48-column panel wide, its rows an odd
    number of 64-byte lines apart (so a panel's rows spread over the L1 sets)."""
    return not s.trans_b and s.n >= PANEL_COLS and s.ldb % 16 == 0 and (s.ldb // 16) % 2 == 1


def takes(s: L.Contract) -> bool:
    """Whether the float32 product ``s`` is rendered as a call of ``sg_sgemm``."""
    if s.dtype.name != "float32":
        return False
    mode = gemm_mode()
    if mode != "auto":
        return mode == "own"
    fits = MIN_ROWS <= s.m <= MAX_ROWS and s.n >= MIN_COLS and s.k >= MIN_DEPTH
    in_place = reads_b_in_place(s) and s.k >= MIN_DEPTH_IN_PLACE and s.m <= MAX_ROWS_IN_PLACE
    return (fits and not s.trans_a) or in_place or written_gradient(s)


def written_gradient(s: L.Contract) -> bool:
    """Whether ``s`` is a weight gradient ``c = a^T @ b`` that the own product takes: c is
    written (beta 0), not updated in place (an SGD update folded into the product, beta 1,
    stays with the library), with enough rows, columns and summed terms."""
    return (
        s.trans_a
        and not s.trans_b
        and s.beta == 0.0
        and MIN_ROWS <= s.m <= MAX_ROWS_GRADIENT
        and MIN_COLS_GRADIENT <= s.n <= MAX_COLS_GRADIENT
        and s.k >= MIN_DEPTH_GRADIENT
    )


def takes_dot(s: L.Contract) -> bool:
    """Whether the float32 partial product ``c = a @ b^T`` of a summed product (both
    operands hold the summed axis contiguously: a convolution's weight gradient) is
    rendered as ``sg_gemm_abt_dot`` (the same library call where the build has no
    AVX-512)."""
    if s.dtype.name != "float32" or s.trans_a or not s.trans_b:
        return False
    mode = gemm_mode()
    if mode != "auto":
        return mode == "own"
    return s.k >= MIN_DEPTH_DOT


def library_function(s: L.Contract) -> str:
    """The library's C function for ``s``'s dtype (the products ``takes`` never gets: the
    summed split and batch-fused forms, and float64)."""
    return "scipy_cblas_sgemm" if s.dtype.name == "float32" else "scipy_cblas_dgemm"


def uses_own(s: L.Stmt) -> bool:
    """Whether statement ``s`` (a product, or a batch-fused product) is rendered with a
    function of ``sgemm.h`` (so the program's source must include it)."""
    c = s.contract if isinstance(s, L.BatchFused) else s
    if not isinstance(c, L.Contract):
        return False
    return takes(c) or (c.sum_batch > 1 and takes_dot(c))


def function(s: L.Contract) -> str:
    """The C function computing ``s``: ``sg_sgemm`` or the library's."""
    return "sg_sgemm" if takes(s) else library_function(s)


__all__ = [
    "ENV",
    "MAX_COLS_GRADIENT",
    "MAX_ROWS",
    "MAX_ROWS_GRADIENT",
    "MAX_ROWS_IN_PLACE",
    "MIN_COLS",
    "MIN_COLS_GRADIENT",
    "MIN_DEPTH",
    "MIN_DEPTH_DOT",
    "MIN_DEPTH_GRADIENT",
    "MIN_DEPTH_IN_PLACE",
    "MIN_ROWS",
    "MODES",
    "PANEL_COLS",
    "SOURCE",
    "function",
    "gemm_mode",
    "library_function",
    "reads_b_in_place",
    "takes",
    "takes_dot",
    "uses_own",
    "written_gradient",
]
