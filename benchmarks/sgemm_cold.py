"""The own product (``backends/c/sgemm.h``) alone with cold operands, two versions and OpenBLAS.

``gemm_rate.py`` times products with their operands hot in cache; inside a training step a
product's ``b`` (a weight) was last touched a kernel or a step earlier, in L3 or DRAM. This
script builds ``sg_sgemm`` from the working tree's ``sgemm.h`` and from another version
(``--base``, a git revision or a file) into one harness library each, and times single
calls at one thread, each after touching ``--flush`` MiB of other memory (8: ``b`` is then
in L3, out of the 2 MiB L2 of the machine it was written on; 64: out of L3 too). Every
round times every variant once per shape, interleaved; printed: the median of the rounds
in microseconds and ``new / base``. ``OB`` is the C backend's OpenBLAS (its kernel set as
shapegrad loads it: ``OPENBLAS_CORETYPE`` / ``SHAPEGRAD_BLAS_CORETYPE``).

Shapes ``m x n x k`` with the form (``a b``, ``a b^T``, ``a^T b``) and, after ``/``, the
leading dimension of ``b`` and ``c`` when it is wider than ``n`` (a 2-thread column cut of
a 1024-wide product). Run: ``python benchmarks/sgemm_cold.py --base HEAD~1 [--flush 8,64]
[--rounds 100]``.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics

import numpy as np
import sgemm_ab  # benchmarks/: the other header's text
import train_step  # benchmarks/: the CPU's description

from shapegrad.backends import native
from shapegrad.backends.c import gemm_kernel
from shapegrad.backends.c.toolchain import blas_core, blas_paths, cflags, compiler

HARNESS = r"""
#include <stdint.h>
#include <time.h>
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
{kernel}
static double sg_now(void) {{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}}
/* seconds of one call after touching n floats of junk (the caches' other contents) */
double sg_cold_call(int lib, int ta, int tb, int m, int n, int k, const float *a, int lda,
                    const float *b, int ldb, float beta, float *c, int ldc, float *junk,
                    int64_t n_junk) {{
    volatile float sink = 0.0f;
    for (int64_t i = 0; i < n_junk; i += 16) {{ junk[i] += 1.0f; sink += junk[i]; }}
    const double t0 = sg_now();
    if (lib) scipy_cblas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a, lda,
                               b, ldb, beta, c, ldc);
    else sg_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, 1.0f, a, lda, b, ldb, beta,
                  c, ldc);
    return sg_now() - t0;
}}
"""
SHAPES = [
    (128, 1024, 784, "a b", 1024),
    (128, 1024, 1024, "a b", 1024),
    (128, 512, 784, "a b", 1024),
    (128, 512, 512, "a b", 512),
    (128, 1024, 1024, "a b^T", 1024),
    (128, 512, 512, "a b^T", 512),
    (784, 1024, 128, "a^T b", 1024),
    (512, 512, 128, "a^T b", 512),
]


def harness(source: str) -> ctypes.CDLL:
    libdir, libname = blas_paths()
    spec = native.BuildSpec(
        HARNESS.format(kernel=source), compiler(), tuple(cflags()),
        (f"-L{libdir}", f"-l{libname}", f"-Wl,-rpath,{libdir}"),
    )  # fmt: skip
    lib = ctypes.CDLL(native.load_path(native.build_library(spec)))
    p, i, f = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    lib.sg_cold_call.argtypes = [i, i, i, i, i, i, p, i, p, i, f, p, i, p, ctypes.c_int64]
    lib.sg_cold_call.restype = ctypes.c_double
    return lib


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision or file of the other sgemm.h")
    parser.add_argument("--flush", default="8,64", help="MiB touched before each call")
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # read when OpenBLAS loads
    libs = {"base": harness(sgemm_ab.base_source(args.base)), "new": harness(gemm_kernel.SOURCE)}
    print(train_step.cpu_description())
    print(f"one thread; sgemm.h: working tree (new) vs {args.base} (base); OB: OpenBLAS "
          f"{blas_core()}; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    rng = np.random.default_rng(0)
    for mib in (int(x) for x in args.flush.split(",")):
        junk = np.zeros(mib << 18, np.float32)
        print(f"\n{mib} MiB touched before each call; median us of {args.rounds} calls")
        print(f"  {'product':28s}{'base':>9s}{'new':>9s}{'OB':>9s}{'new/base':>10s}{'new/OB':>8s}")
        for m, n, k, form, ld in SHAPES:
            ta, tb = form.startswith("a^T"), form.endswith("b^T")
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
            b = rng.standard_normal((ld, k) if tb else (k, ld)).astype(np.float32)
            c = np.zeros((m, ld), np.float32)
            beta = 1.0 if ta else 0.0  # a weight gradient with the SGD update folded in
            lda, ldb = a.shape[1], b.shape[1]
            times: dict[str, list[float]] = {"base": [], "new": [], "OB": []}
            for _ in range(args.rounds):
                for name, lib, use_lib in (
                    ("base", libs["base"], 0), ("new", libs["new"], 0), ("OB", libs["new"], 1)
                ):  # fmt: skip
                    times[name].append(lib.sg_cold_call(
                        use_lib, int(ta), int(tb), m, n, k, a.ctypes.data, lda, b.ctypes.data,
                        ldb, beta, c.ctypes.data, c.shape[1], junk.ctypes.data, junk.size,
                    ))  # fmt: skip
            med = {name: statistics.median(v) * 1e6 for name, v in times.items()}
            label = f"{m}x{n}x{k} {form}" + (f" /{ld}" if ld != n else "")
            print(f"  {label:28s}{med['base']:9.1f}{med['new']:9.1f}{med['OB']:9.1f}"
                  f"{med['new'] / med['base']:10.3f}{med['new'] / med['OB']:8.3f}", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
