"""In-run GEMM rate (GFLOP/s) of every product library on this machine, for the products
of ``train_step.py``'s MLP, w1024 and CNN steps.

Run: ``.venv/bin/python benchmarks/gemm_rate.py [--threads 1,2] [--mkl-dir DIR] [--quick]
[--only cnn,w1024]``

Libraries, measured in one process per thread count, interleaved (each round times every
library once per shape, so a burst of load from other processes hits them all alike):

* ``OB <core>``: the scipy-openblas32 wheel that the C backend links, once per OpenBLAS
  kernel set this CPU can run (``Haswell`` = AVX2; ``SkylakeX`` = AVX-512 when the CPU has
  it). Each set is a private copy of the wheel's library loaded with that
  ``OPENBLAS_CORETYPE``, so the sets run side by side in one process;
* ``OB shapegrad``: the wheel's library as shapegrad loads it (``SHAPEGRAD_BLAS_CORETYPE``
  and ``OPENBLAS_CORETYPE`` as set in the environment); the header names its kernel set;
* ``torch``: ``torch.mm`` (MKL/oneDNN inside PyTorch), ``torch.set_num_threads``;
* ``jax``: ``jax.jit`` of the product (XLA), ``intra_op_parallelism_threads``; the
  process is pinned to as many CPUs as threads (XLA's pool otherwise takes every CPU);
* ``mkl``: oneMKL's ``cblas_sgemm`` from the ``mkl`` wheel's ``libmkl_rt.so.3`` in
  ``--mkl-dir`` (``pip download mkl`` and unzip its ``.so`` files there);
* ``blis``: ``blis.py.gemm`` of the ``blis`` wheel (cython-blis) when importable (one
  thread only);
* ``sg own`` / ``own cols``: shapegrad's own product (``backends/c/sgemm.h``: AVX-512
  where the C backend's flags target it, else OpenBLAS under that name), one call at one
  thread, split by columns across the team at more (as the C backend calls it);
  ``sg dot``: the same, but ``a @ b^T`` as dot products (``sg_gemm_abt_dot``: the CNN's
  summed weight gradient ``cnn dW``), one thread.

OpenBLAS and MKL run their own thread pools at 2 threads; shapegrad instead splits a
product into blocks of rows or columns, one single-threaded call per OpenMP thread
(``CTuning.contract_split_macs``, ``column_split``): columns ``OB sg rows`` and ``OB sg
cols`` measure that split of the same library. Each library's block of calls is preceded by a short
sleep, so the spinning threads of the library before have gone to sleep.

The header names the CPU, its vector width and the 1-minute load average (before and
after); the machine is shared, so the figure per cell is the fastest single call of all
rounds (the one that ran undisturbed).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_step import cpu_description  # after the path entry

Array = np.ndarray
ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112


@dataclass(frozen=True)
class Shape:
    """``c[m, n] = op(a)[m, k] @ op(b)[k, n]``; ``ta``/``tb``: the operand is stored
    transposed (``a`` as ``[k, m]``, ``b`` as ``[n, k]``)."""

    label: str
    m: int
    k: int
    n: int
    ta: bool = False
    tb: bool = False

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.k * self.n


SHAPES = [
    # MLP 784-512-512-10, batch 128: forward, weight gradients (x^T dy), input gradient
    Shape("mlp fwd 1", 128, 784, 512),
    Shape("mlp fwd 2", 128, 512, 512),
    Shape("mlp dW1", 784, 128, 512, ta=True),
    Shape("mlp dW2", 512, 128, 512, ta=True),
    Shape("mlp dx2", 128, 512, 512, tb=True),
    # MLP 784-1024-1024-10 (w1024), batch 128
    Shape("w1024 fwd 1", 128, 784, 1024),
    Shape("w1024 fwd 2", 128, 1024, 1024),
    Shape("w1024 dW2", 1024, 128, 1024, ta=True),
    Shape("w1024 dx2", 128, 1024, 1024, tb=True),
    # CNN b64, conv 16 -> 32 3x3 on 28x28 as im2col, one image per call (as the C step
    # calls it): forward w[32,144] @ cols[144,784], weight gradient dy @ cols^T, and the
    # columns' gradient w^T @ dy
    Shape("cnn fwd", 32, 144, 784),
    Shape("cnn dW", 32, 784, 144, tb=True),
    Shape("cnn dcols", 144, 32, 784, ta=True),
]
QUICK = ["mlp fwd 1", "mlp dW1", "w1024 fwd 2", "w1024 dx2", "cnn fwd"]


# --- the machine ---------------------------------------------------------------------------


def has_avx512() -> bool:
    from shapegrad.backends.c.blascore import SKYLAKEX_FLAGS, cpu_flags

    return cpu_flags() >= SKYLAKEX_FLAGS


# --- libraries: each returns run(shape) -> callable doing one product ----------------------


Runner = Callable[[Shape], Callable[[], Any]]
FP = ctypes.POINTER(ctypes.c_float)


def operands(s: Shape) -> tuple[Array, Array, Array]:
    rng = np.random.default_rng(0)
    a = rng.random((s.k, s.m) if s.ta else (s.m, s.k), dtype=np.float32)
    b = rng.random((s.n, s.k) if s.tb else (s.k, s.n), dtype=np.float32)
    return a, b, np.zeros((s.m, s.n), np.float32)


def reference(s: Shape, a: Array, b: Array) -> Array:
    return (a.T if s.ta else a) @ (b.T if s.tb else b)


def cblas_runner(sgemm: Any) -> Runner:
    """Runner over a ``cblas_sgemm`` function pointer (ctypes)."""

    def run(s: Shape) -> Callable[[], Any]:
        a, b, c = operands(s)
        lda, ldb = (s.m if s.ta else s.k), (s.k if s.tb else s.n)
        args = (
            ROW_MAJOR,
            TRANS if s.ta else NO_TRANS,
            TRANS if s.tb else NO_TRANS,
            s.m,
            s.n,
            s.k,
            ctypes.c_float(1.0),
            a.ctypes.data_as(FP),
            lda,
            b.ctypes.data_as(FP),
            ldb,
            ctypes.c_float(0.0),
            c.ctypes.data_as(FP),
            s.n,
        )
        sgemm(*args)
        check(s, c, reference(s, a, b))
        return lambda: sgemm(*args)

    return run


def check(s: Shape, got: Array, want: Array) -> None:
    if not np.allclose(got, want, rtol=1e-4, atol=1e-3):
        raise AssertionError(f"{s.label}: product differs from NumPy's")


def openblas_copy(core: str, threads: int, tmp: str) -> tuple[Runner, str]:
    """A private copy of the wheel's OpenBLAS loaded with ``OPENBLAS_CORETYPE=core``.

    ``RTLD_DEEPBIND``: the copy's calls and data references stay inside the copy (without
    it they bind to the instance shapegrad loads with ``RTLD_GLOBAL``, whose thread count
    and kernel table the copy would then use)."""
    spec = importlib.util.find_spec("scipy_openblas32")  # importing it loads the library
    if spec is None or spec.origin is None:
        raise ImportError("scipy_openblas32 is not installed")
    libdir = os.path.join(os.path.dirname(spec.origin), "lib")
    name = next(f for f in sorted(os.listdir(libdir)) if f.startswith("libscipy_openblas"))
    path = os.path.join(tmp, f"openblas_{core}.so")
    shutil.copy(os.path.join(libdir, name), path)
    before = os.environ.get("OPENBLAS_CORETYPE")
    os.environ["OPENBLAS_CORETYPE"] = core
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_DEEPBIND)
    finally:
        if before is None:
            del os.environ["OPENBLAS_CORETYPE"]
        else:
            os.environ["OPENBLAS_CORETYPE"] = before
    lib.scipy_openblas_set_num_threads(threads)
    lib.scipy_openblas_get_corename.restype = ctypes.c_char_p
    return cblas_runner(lib.scipy_cblas_sgemm), lib.scipy_openblas_get_corename().decode()


def openblas_shapegrad(threads: int) -> tuple[Runner, str]:
    """The wheel's library as the C backend loads it (its kernel choice applied)."""
    from shapegrad.backends.c import toolchain

    libdir, _ = toolchain.blas_paths()
    core = toolchain.blas_core()
    import scipy_openblas32 as wheel  # type: ignore[import-untyped]

    lib = ctypes.CDLL(os.path.join(libdir, wheel.get_library(fullname=True)))
    lib.scipy_openblas_set_num_threads(threads)
    return cblas_runner(lib.scipy_cblas_sgemm), core


_SPLIT_C = r"""
#include <omp.h>
void scipy_openblas_set_num_threads(int);
int scipy_openblas_get_num_threads(void);
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
#if defined(SG_OWN) && defined(SG_DOT) /* c = a @ b^T as dot products (sg_gemm_abt_dot) */
#include SG_OWN
#define GEMM(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc) \
    ((ta) == 111 && (tb) == 112 ? sg_gemm_abt_dot(m, n, k, al, a, lda, b, ldb, be, c, ldc) \
                                : sg_sgemm(o, ta, tb, m, n, k, al, a, lda, b, ldb, be, c, ldc))
#elif defined(SG_OWN)
#include SG_OWN /* shapegrad's own product (backends/c/sgemm.h) */
#define GEMM sg_sgemm
#else
#define GEMM scipy_cblas_sgemm
#endif
/* c = op(a) @ op(b), row-major, cut into `threads` blocks of rows (cols = 0) or columns
   (cols = 1), one single-threaded OpenBLAS call per OpenMP thread: the C backend's split. */
void split_sgemm(int threads, int cols, int ta, int tb, int m, int n, int k, const float *a,
                 const float *b, float *c) {
    int before = scipy_openblas_get_num_threads(); /* "OB shapegrad" shares the library */
    scipy_openblas_set_num_threads(1);
    int lda = ta ? m : k, ldb = tb ? k : n;
    #pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        if (cols) {
            int n0 = t * n / nt, n1 = (t + 1) * n / nt;
            const float *bb = tb ? b + (long)n0 * k : b + n0;
            GEMM(101, ta ? 112 : 111, tb ? 112 : 111, m, n1 - n0, k, 1.0f, a,
                              lda, bb, ldb, 0.0f, c + n0, n);
        } else {
            int m0 = t * m / nt, m1 = (t + 1) * m / nt;
            const float *aa = ta ? a + m0 : a + (long)m0 * k;
            GEMM(101, ta ? 112 : 111, tb ? 112 : 111, m1 - m0, n, k, 1.0f, aa,
                              lda, b, ldb, 0.0f, c + (long)m0 * n, n);
        }
    }
    scipy_openblas_set_num_threads(before);
}
"""


def openblas_split(
    threads: int, cols: bool, tmp: str, own: bool = False, dot: bool = False
) -> Runner:
    """The shapegrad instance of OpenBLAS split as the C backend splits a product (see
    ``CTuning.column_split``): ``threads`` single-threaded calls on blocks of rows or
    columns, in one OpenMP region (built here with the C backend's compiler). ``own``:
    shapegrad's own product (``backends/c/sgemm.h``, the C backend's flags) instead of
    OpenBLAS in each block; ``dot``: with ``own``, ``a @ b^T`` as dot products
    (``sg_gemm_abt_dot``, the form a convolution's summed weight gradient runs)."""
    from shapegrad.backends.c import gemm_kernel, toolchain

    libdir, libname = toolchain.blas_paths()
    path = os.path.join(tmp, "split_dot.so" if dot else "split_own.so" if own else "split.so")
    if not os.path.exists(path):
        source = os.path.join(tmp, "split.c")
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(_SPLIT_C)
        flags = ["-O2", "-fopenmp"]
        if own:
            header = os.path.join(tmp, "sgemm.h")
            with open(header, "w", encoding="utf-8") as handle:
                handle.write(gemm_kernel.SOURCE)
            flags = [*toolchain.cflags(), f'-DSG_OWN="{header}"', *(["-DSG_DOT"] if dot else [])]
        cmd = [toolchain.compiler(), *flags, "-fPIC", "-shared", source, "-o", path]
        cmd += [f"-L{libdir}", f"-l{libname}", f"-Wl,-rpath,{libdir}"]
        subprocess.run(cmd, check=True)
    split = ctypes.CDLL(path).split_sgemm

    def run(s: Shape) -> Callable[[], Any]:
        a, b, c = operands(s)
        args = (threads, int(cols), int(s.ta), int(s.tb), s.m, s.n, s.k)
        ptrs = (a.ctypes.data_as(FP), b.ctypes.data_as(FP), c.ctypes.data_as(FP))
        split(*args, *ptrs)
        check(s, c, reference(s, a, b))
        return lambda: split(*args, *ptrs)

    return run


def mkl(threads: int, directory: str) -> Runner:
    os.environ["MKL_THREADING_LAYER"] = "SEQUENTIAL" if threads == 1 else "GNU"
    lib = ctypes.CDLL(os.path.join(directory, "libmkl_rt.so.3"))
    lib.MKL_Set_Num_Threads(threads)
    return cblas_runner(lib.cblas_sgemm)


def torch_runner(threads: int) -> Runner:
    import torch

    torch.set_num_threads(threads)

    def run(s: Shape) -> Callable[[], Any]:
        a, b, c = operands(s)
        ta, tb, tc = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(c)
        opa, opb = (ta.t() if s.ta else ta), (tb.t() if s.tb else tb)
        torch.mm(opa, opb, out=tc)
        check(s, c, reference(s, a, b))
        return lambda: torch.mm(opa, opb, out=tc)

    return run


def jax_runner() -> Runner:
    import jax
    import jax.numpy as jnp

    def run(s: Shape) -> Callable[[], Any]:
        a, b, _ = operands(s)
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        f = jax.jit(lambda x, y: (x.T if s.ta else x) @ (y.T if s.tb else y))
        check(s, np.asarray(f(ja, jb)), reference(s, a, b))
        return lambda: f(ja, jb).block_until_ready()

    return run


def blis_runner() -> Runner:
    from blis.py import gemm  # type: ignore[import-not-found]

    def run(s: Shape) -> Callable[[], Any]:
        a, b, c = operands(s)
        gemm(a, b, out=c, trans1=s.ta, trans2=s.tb, beta=0.0)
        check(s, c, reference(s, a, b))
        return lambda: gemm(a, b, out=c, trans1=s.ta, trans2=s.tb, beta=0.0)

    return run


# --- measuring -------------------------------------------------------------------------------


def fastest_call(fn: Callable[[], Any], budget: float) -> float:
    """The fastest of the single calls made in about ``budget`` seconds (seconds): on a
    shared machine a call is often descheduled for tens of milliseconds, and the fastest
    call is the one that ran undisturbed."""
    best = float("inf")
    end = time.perf_counter() + budget
    while True:
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        best = min(best, t1 - t0)
        if t1 > end:
            return best


def libraries(threads: int, mkl_dir: str | None, tmp: str) -> tuple[dict[str, Runner], list[str]]:
    libs: dict[str, Runner] = {}
    notes: list[str] = []
    cores = ["Haswell", "SkylakeX"] if has_avx512() else ["Haswell"]
    if platform.machine() not in ("x86_64", "AMD64"):
        cores = []
    for core in cores:
        run, got = openblas_copy(core, threads, tmp)
        libs[f"OB {got}"] = run
    run, got = openblas_shapegrad(threads)
    libs["OB shapegrad"] = run
    if threads > 1:
        libs["OB sg rows"] = openblas_split(threads, False, tmp)
        libs["OB sg cols"] = openblas_split(threads, True, tmp)
    # shapegrad's own product (one call, or the column split at several threads)
    libs["sg own" if threads == 1 else "own cols"] = openblas_split(threads, True, tmp, own=True)
    if threads == 1:
        libs["sg dot"] = openblas_split(1, True, tmp, own=True, dot=True)
    notes.append(
        f"OB shapegrad runs the {got} kernels (OPENBLAS_CORETYPE="
        f"{os.environ.get('OPENBLAS_CORETYPE')!r}, SHAPEGRAD_BLAS_CORETYPE="
        f"{os.environ.get('SHAPEGRAD_BLAS_CORETYPE')!r})"
    )
    for name, make in (("torch", lambda: torch_runner(threads)), ("jax", jax_runner)):
        try:
            libs[name] = make()
        except ImportError as exc:
            notes.append(f"{name}: not installed ({exc})")
    if mkl_dir:
        libs["mkl"] = mkl(threads, mkl_dir)
    if threads == 1:
        try:
            libs["blis"] = blis_runner()
        except ImportError:
            notes.append("blis: not installed (pip install blis)")
    return libs, notes


def measure(threads: int, shapes: list[Shape], rounds: int, mkl_dir: str | None) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        libs, notes = libraries(threads, mkl_dir, tmp)
        for note in notes:
            print(f"  {note}")
        names = list(libs)
        print(f"  {'GFLOP/s':14s}" + "".join(f"{n:>13s}" for n in names))
        pause = 0.02 if threads == 1 else 0.2  # let the previous library's threads sleep
        for s in shapes:
            calls = {n: libs[n](s) for n in names}
            best = dict.fromkeys(names, float("inf"))
            for _ in range(rounds):
                for n in names:
                    time.sleep(pause)
                    best[n] = min(best[n], fastest_call(calls[n], 0.05))
            row = "".join(f"{s.flops / best[n] / 1e9:13.0f}" for n in names)
            dims = f"{s.m}x{s.k}x{s.n}{' T' if s.ta else ''}{' T' if s.tb else ''}"
            print(f"  {s.label:14s}{row}   ({dims})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", default="1,2", help="thread counts (comma separated)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="four shapes, three rounds")
    parser.add_argument("--mkl-dir", help="directory holding the mkl wheel's libmkl_rt.so.3")
    parser.add_argument("--only", help="shape labels starting so (comma separated, e.g. cnn)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = [s for s in SHAPES if not args.quick or s.label in QUICK]
    if args.only:
        shapes = [s for s in shapes if s.label.startswith(tuple(args.only.split(",")))]
    rounds = 3 if args.quick else args.rounds
    if args.child:
        if hasattr(os, "sched_setaffinity"):  # XLA sizes its pool by the CPUs it may use
            cpus = sorted(os.sched_getaffinity(0))[: args.child]
            os.sched_setaffinity(0, set(cpus))
        measure(args.child, shapes, rounds, args.mkl_dir)
        return
    print(f"CPU: {cpu_description()}")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    for threads in (int(t) for t in args.threads.split(",")):
        print(f"{threads} thread(s):", flush=True)
        env = dict(os.environ)
        # XLA reads its thread count once, at start-up: one process per thread count
        env["XLA_FLAGS"] = (
            env.get("XLA_FLAGS", "") + f" --xla_cpu_multi_thread_eigen={str(threads > 1).lower()}"
            f" intra_op_parallelism_threads={threads}"
        )
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(threads)]
        cmd += ["--rounds", str(rounds)] + (["--quick"] if args.quick else [])
        cmd += ["--mkl-dir", args.mkl_dir] if args.mkl_dir else []
        cmd += ["--only", args.only] if args.only else []
        subprocess.run(cmd, env=env, check=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
