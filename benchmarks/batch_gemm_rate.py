"""GFLOP/s of attention's batched products (``L.Contract`` with a two-level strided batch)
on this machine: shapegrad's one-call ``sg_sgemm_batch`` against what the C backend called
before and against other libraries, 1 and 2 threads.

Run: ``PYTHONPATH=src python benchmarks/batch_gemm_rate.py [--threads 1,2] [--rounds 7]``
(benchmark with ``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE``: what a user gets).

The shapes are the products of ``train_step.py --gpt`` (context 64, 4 heads of 32, batch
32: 128 products per call), with the operands' real strides (head views of the ``[b, t,
3, h, d]`` qkv buffer, heads merged into ``[b, t, h*d]``). Columns, interleaved per round
(each round times every column once per shape; the cell is the fastest call of all rounds):

* ``own``: ``sg_sgemm_batch`` (``backends/c/sgemm_batch.h``), one call, its products shared
  across the OpenMP team inside the call;
* ``OB loop``: one ``cblas_sgemm`` per product on the same strided views, products shared
  across the team (``#pragma omp for schedule(dynamic, 1)``, OpenBLAS at one thread): the
  C backend's path before ``sg_sgemm_batch`` (``teamsplit.contract``, ``kind == "batch"``);
* ``OB strided``: one ``cblas_sgemm_batch_strided`` call (OpenBLAS's threads set to the
  count) on packed copies of the heads (it takes one stride per operand);
* ``torch``: ``torch.bmm`` on contiguous ``[128, ...]`` tensors (transposed views for the
  transposed forms), ``torch.set_num_threads``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from shapegrad.backends import native
from shapegrad.backends.c import batch_gemm, gemm_kernel
from shapegrad.backends.c.toolchain import blas_paths, cflags, compiler

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import cpu_description  # after the path entry

_HARNESS = r"""
#include <stdint.h>
#include <time.h>
void scipy_openblas_set_num_threads(int);
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
void scipy_cblas_sgemm_batch_strided(int, int, int, int, int, int, float, const float *, int,
                                     int, const float *, int, int, float, float *, int, int,
                                     int);
{kernels}
static double now(void) {{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}}
int own_kernel(void) {{ return SG_OWN_BATCH_GEMM; }}
/* write a buffer larger than L2, so the next call finds its operands outside L1 and L2 */
void evict(float *x, int64_t n) {{
    for (int64_t i = 0; i < n; ++i) x[i] += 1.0f;
}}
/* seconds of one call; kind 0: sg_sgemm_batch, 1: a loop of cblas_sgemm */
double run(int kind, int nt, int ta, int tb, int m, int n, int k, const float *a, int64_t lda,
           const float *b, int64_t ldb, float *c, int64_t ldc, int64_t batch, int64_t inner,
           int64_t sa, int64_t sb, int64_t sc, int64_t isa, int64_t isb, int64_t isc) {{
    scipy_openblas_set_num_threads(1);
    const double t0 = now();
    if (kind == 0) {{
#pragma omp parallel num_threads(nt)
        sg_sgemm_batch(nt > 1, ta, tb, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc, batch,
                       inner, sa, sb, sc, isa, isb, isc);
    }} else {{
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
        for (int64_t bi = 0; bi < batch; ++bi)
            scipy_cblas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f,
                              a + (bi / inner) * sa + (bi % inner) * isa, (int)lda,
                              b + (bi / inner) * sb + (bi % inner) * isb, (int)ldb, 0.0f,
                              c + (bi / inner) * sc + (bi % inner) * isc, (int)ldc);
    }}
    return now() - t0;
}}
double run_strided(int nt, int ta, int tb, int m, int n, int k, const float *a, int lda,
                   int sa, const float *b, int ldb, int sb, float *c, int ldc, int sc,
                   int batch) {{
    scipy_openblas_set_num_threads(nt);
    const double t0 = now();
    scipy_cblas_sgemm_batch_strided(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a,
                                    lda, sa, b, ldb, sb, 0.0f, c, ldc, sc, batch);
    const double t = now() - t0;
    scipy_openblas_set_num_threads(1);
    return t;
}}
"""


@dataclass(frozen=True)
class Product:
    """One batched product of the GPT step as the C backend sees it (``L.Contract``)."""

    label: str
    m: int
    n: int
    k: int
    ta: bool
    tb: bool
    lda: int
    ldb: int
    ldc: int
    sa: int
    sb: int
    sc: int
    isa: int
    isb: int
    isc: int
    batch: int = 128
    inner: int = 4

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


# train_step.py --gpt: every batched Contract of the step (strides as rendered)
PRODUCTS = [
    Product("q k^T (scores)", 64, 64, 32, False, True, 384, 384, 64, 24576, 24576, 16384, 32, 32, 4096),
    Product("p v", 64, 32, 64, False, False, 64, 384, 128, 16384, 24576, 8192, 4096, 32, 32),
    Product("do v^T (dp)", 64, 64, 32, False, True, 128, 384, 64, 8192, 24576, 16384, 32, 32, 4096),
    Product("p^T do (dv)", 64, 32, 64, True, False, 64, 128, 128, 16384, 8192, 8192, 4096, 32, 32),
    Product("ds^T q (dk)", 64, 32, 64, True, False, 64, 384, 128, 16384, 24576, 8192, 4096, 32, 32),
]  # fmt: skip


def packed(m: int, n: int, k: int, ta: bool, tb: bool, batch: int) -> Product:
    """A batch of products stored back to back (``--sizes``: where the rule's limits lie)."""
    lda, ldb = (m if ta else k), (k if tb else n)
    form = ("a^T" if ta else "a") + (" b^T" if tb else " b")
    return Product(form, m, n, k, ta, tb, lda, ldb, n, m * k, k * n, m * n, 0, 0, 0, batch, 1)


SIZES = [
    packed(128, 128, 64, False, True, 32),
    packed(128, 128, 128, False, False, 32),
    packed(256, 256, 64, False, True, 8),
    packed(256, 256, 256, False, False, 4),
    packed(256, 256, 256, True, False, 4),
    packed(64, 64, 512, False, True, 32),
]


def harness() -> ctypes.CDLL:
    """The benchmark's C functions, built with the C backend's flags and library."""
    libdir, libname = blas_paths()
    source = _HARNESS.format(kernels=gemm_kernel.SOURCE + batch_gemm.SOURCE)
    spec = native.BuildSpec(
        source,
        compiler(),
        (*cflags(), "-fopenmp"),
        (f"-L{libdir}", f"-l{libname}", f"-Wl,-rpath,{libdir}", "-fopenmp"),
    )
    lib = ctypes.CDLL(native.load_path(native.build_library(spec)))
    p, i, i64 = ctypes.POINTER(ctypes.c_float), ctypes.c_int, ctypes.c_int64
    lib.run.argtypes = [i, i, i, i, i, i, i, p, i64, p, i64, p, i64, *[i64] * 8]
    lib.run.restype = ctypes.c_double
    lib.run_strided.argtypes = [i, i, i, i, i, i, p, i, i, p, i, i, p, i, i, i]
    lib.run_strided.restype = ctypes.c_double
    lib.own_kernel.restype = i
    lib.evict.argtypes = [p, i64]
    return lib


def _ptr(x: np.ndarray) -> Any:
    return x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _extent(ld: int, rows: int, cols: int, s: int, inner_s: int, batch: int, inner: int) -> int:
    """Elements spanned by a strided operand (rows x cols, rows ``ld`` apart)."""
    return (batch // inner - 1) * s + (inner - 1) * inner_s + (rows - 1) * ld + cols


class Case:
    """Operands of one product in its strided layout and packed per product."""

    def __init__(self, p: Product, rng: np.random.Generator) -> None:
        self.p = p
        ar, ac = (p.k, p.m) if p.ta else (p.m, p.k)
        br, bc = (p.n, p.k) if p.tb else (p.k, p.n)
        size_a = _extent(p.lda, ar, ac, p.sa, p.isa, p.batch, p.inner)
        size_b = _extent(p.ldb, br, bc, p.sb, p.isb, p.batch, p.inner)
        size_c = _extent(p.ldc, p.m, p.n, p.sc, p.isc, p.batch, p.inner)
        self.a = rng.standard_normal(size_a).astype(np.float32)
        self.b = rng.standard_normal(size_b).astype(np.float32)
        self.c = np.zeros(size_c, np.float32)
        self.pa = np.stack(
            [self._mat(self.a, i, ar, ac, p.lda, p.sa, p.isa) for i in range(p.batch)]
        )
        self.pb = np.stack(
            [self._mat(self.b, i, br, bc, p.ldb, p.sb, p.isb) for i in range(p.batch)]
        )
        self.pc = np.zeros((p.batch, p.m, p.n), np.float32)

    def _mat(
        self, x: np.ndarray, i: int, r: int, c: int, ld: int, s: int, inner_s: int
    ) -> np.ndarray:
        start = (i // self.p.inner) * s + (i % self.p.inner) * inner_s
        return np.lib.stride_tricks.as_strided(x[start:], (r, c), (4 * ld, 4)).copy()

    def reference(self) -> np.ndarray:
        a = self.pa.transpose(0, 2, 1) if self.p.ta else self.pa
        b = self.pb.transpose(0, 2, 1) if self.p.tb else self.pb
        return np.einsum("bij,bjk->bik", a.astype(np.float64), b.astype(np.float64))

    def result(self) -> np.ndarray:
        p = self.p
        return np.stack(
            [self._mat(self.c, i, p.m, p.n, p.ldc, p.sc, p.isc) for i in range(p.batch)]
        )


def timers(lib: ctypes.CDLL, case: Case, nt: int) -> dict[str, Any]:
    """One zero-argument timer per column for ``case`` at ``nt`` threads."""
    p = case.p
    args = (p.ta, p.tb, p.m, p.n, p.k, _ptr(case.a), p.lda, _ptr(case.b), p.ldb, _ptr(case.c))
    rest = (p.ldc, p.batch, p.inner, p.sa, p.sb, p.sc, p.isa, p.isb, p.isc)
    ar, ac = case.pa.shape[1:]
    br, bc = case.pb.shape[1:]
    out: dict[str, Any] = {
        "own": lambda: lib.run(0, nt, *args, *rest),
        "OB loop": lambda: lib.run(1, nt, *args, *rest),
        "OB strided": lambda: lib.run_strided(
            nt, p.ta, p.tb, p.m, p.n, p.k, _ptr(case.pa), ac, ar * ac, _ptr(case.pb), bc,
            br * bc, _ptr(case.pc), p.n, p.m * p.n, p.batch,
        ),
    }  # fmt: skip
    try:
        import torch
    except ImportError:
        return out
    ta, tb = torch.from_numpy(case.pa), torch.from_numpy(case.pb)
    ta = ta.transpose(1, 2) if p.ta else ta
    tb = tb.transpose(1, 2) if p.tb else tb
    tc = torch.from_numpy(case.pc)

    def bmm() -> float:
        torch.set_num_threads(nt)
        t0 = time.perf_counter()
        torch.bmm(ta, tb, out=tc)
        return time.perf_counter() - t0

    out["torch"] = bmm
    return out


def check(lib: ctypes.CDLL, case: Case) -> float:
    """Largest error of ``own`` against float64 NumPy, relative to the largest entry."""
    p = case.p
    case.c[:] = np.nan
    lib.run(0, 1, p.ta, p.tb, p.m, p.n, p.k, _ptr(case.a), p.lda, _ptr(case.b), p.ldb,
            _ptr(case.c), p.ldc, p.batch, p.inner, p.sa, p.sb, p.sc, p.isa, p.isb, p.isc)  # fmt: skip
    ref = case.reference()
    return float(np.max(np.abs(case.result() - ref)) / np.max(np.abs(ref)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--reps", type=int, default=20, help="calls per cell per round")
    parser.add_argument(
        "--warm", action="store_true", help="operands stay in cache between calls (default: "
        "a 4 MiB buffer is written before each call, as in a step where kernels in between "
        "move other data through the caches)",
    )  # fmt: skip
    parser.add_argument(
        "--sizes", action="store_true", help="larger products stored back to back instead "
        "(where the rule's limits, batch_gemm.MAX_*, lie)",
    )  # fmt: skip
    args = parser.parse_args()
    junk = np.zeros(1 << 20, np.float32)
    lib = harness()
    rng = np.random.default_rng(0)
    cases = [Case(p, rng) for p in (SIZES if args.sizes else PRODUCTS)]
    print(cpu_description())
    kernel = "AVX-512 register blocks" if lib.own_kernel() else "cblas_sgemm per product"
    print(f"own = sg_sgemm_batch ({kernel}); load average {os.getloadavg()[0]:.2f}")
    for case in cases:
        err = check(lib, case)
        assert err < 1e-5, f"{case.p.label}: own differs from float64 NumPy by {err:.2e}"
    for nt in (int(t) for t in args.threads.split(",")):
        best: dict[tuple[int, str], float] = {}
        for _ in range(args.rounds):
            for index, case in enumerate(cases):
                for column, fn in timers(lib, case, nt).items():
                    time.sleep(0.002)
                    for _ in range(args.reps):
                        if not args.warm:
                            lib.evict(_ptr(junk), junk.size)
                        t = fn()
                        key = (index, column)
                        best[key] = min(best.get(key, float("inf")), t)
        columns = list(dict.fromkeys(c for _, c in best))
        caches = "warm" if args.warm else "cold (L2 evicted)"
        print(f"\n{nt} thread(s), GFLOP/s (fastest call of {args.rounds} x {args.reps}, {caches})")
        print("batch: " + ", ".join(f"{c.p.label} {c.p.batch}" for c in cases))
        print(f"{'product':26}" + "".join(f"{c:>12}" for c in columns))
        for index, case in enumerate(cases):
            cells = "".join(f"{case.p.flops / best[(index, c)] / 1e9:12.1f}" for c in columns)
            print(f"{case.p.label + f' {case.p.m}x{case.p.n}x{case.p.k}':26}{cells}")
    print(f"\nload average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
