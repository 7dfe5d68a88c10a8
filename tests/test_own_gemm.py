"""shapegrad's own float32 product (``backends/c/sgemm.h``, chosen by ``gemm_kernel.py``).

The C function is built into a small harness library twice: with the backend's flags
(the AVX-512 product where the CPU has it) and with ``-march=x86-64-v3`` (no AVX-512: the
fallback, which must be the library's ``cblas_sgemm``). Both are checked against a
float64 NumPy product on odd shapes crossing every block edge (8-row panels, 48-column
panels, 256-term k-blocks, 128-row blocks; the next panel packed while the current one multiplies), all four transposes, padded leading
dimensions, alpha and beta (beta 0 must not read c: it holds NaN). The bound is the
classic one for a float32 dot product of k terms, ``k * eps * (|alpha| |op(a)| |op(b)| +
|beta c|)``: far below any misplaced or missing term. Then a compiled training step with
the product taken (``$SHAPEGRAD_GEMM``) against NumPy.
"""

from __future__ import annotations

import ctypes
import platform
from dataclasses import replace

import numpy as np
import pytest

import shapegrad as sg
import shapegrad.functional as F
from shapegrad.backends import native
from shapegrad.backends.c import gemm_kernel
from shapegrad.backends.c.blascore import cpu_flags
from shapegrad.backends.c.toolchain import blas_paths, cflags, compiler
from shapegrad.compiler import loops as L
from shapegrad.dtypes import DType, float32, float64

X86 = platform.machine() in ("x86_64", "AMD64")
HAS_AVX512 = X86 and "avx512f" in cpu_flags()

_HARNESS = r"""
#include <stdint.h>
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
{kernel}
int sg_own(void) {{ return SG_OWN_GEMM; }}
void sg_call(int ta, int tb, int m, int n, int k, float alpha, const float *a, int lda,
             const float *b, int ldb, float beta, float *c, int ldc) {{
    sg_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}}
void sg_dot(int m, int n, int k, float alpha, const float *a, int lda, const float *b, int ldb,
            float beta, float *c, int ldc) {{
    sg_gemm_abt_dot(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}}
"""


def _harness(flags: tuple[str, ...]) -> ctypes.CDLL:
    libdir, libname = blas_paths()
    spec = native.BuildSpec(
        _HARNESS.format(kernel=gemm_kernel.SOURCE),
        compiler(),
        flags,
        (f"-L{libdir}", f"-l{libname}", f"-Wl,-rpath,{libdir}"),
    )
    lib = ctypes.CDLL(native.load_path(native.build_library(spec)))
    f = ctypes.c_float
    p = ctypes.POINTER(ctypes.c_float)
    i = ctypes.c_int
    lib.sg_call.argtypes = [i, i, i, i, i, f, p, i, p, i, f, p, i]
    lib.sg_dot.argtypes = [i, i, i, f, p, i, p, i, f, p, i]
    lib.sg_own.restype = i
    return lib


def _no_avx512_flags() -> tuple[str, ...]:
    return tuple(f for f in cflags() if not f.startswith("-march")) + ("-march=x86-64-v3",)


SHAPES = [
    (1, 1, 1),
    (7, 5, 3),
    (8, 48, 16),
    (9, 49, 17),
    (37, 53, 71),
    (64, 96, 256),
    (130, 97, 520),  # a second 128-row block, three k-blocks
    (5, 200, 300),
    (200, 3, 40),
    # the next panel packed by the current one's blocks: 21 panels with a 40-column tail,
    # three k-blocks (the last of 88 terms); whole panels and k-blocks, 17 row panels
    (20, 1000, 600),
    (136, 144, 256),
]


# (m, n, k, pad of b's rows): op(b) = b read in place where its rows are an odd number of
# 64-byte lines apart (sgemm.h's sg_gemm_b_in_place): a convolution's 784 columns, a
# 48-column tail packed after in-place panels, two 128-row blocks, k-blocks of 256
IN_PLACE_SHAPES = [
    (32, 784, 144, 0),
    (144, 784, 32, 0),
    (37, 200, 50, 8),
    (130, 208, 300, 0),
    (8, 48, 16, 0),
]
# (m, n, k) of sg_gemm_abt_dot: both orientations (n < m swaps the roles), k tails of 0-15
# terms, row and column block edges
DOT_SHAPES = [(1, 1, 1), (32, 144, 784), (144, 32, 784), (9, 4, 17), (17, 7, 300), (3, 25, 15)]


def _ptr(x: np.ndarray) -> ctypes._Pointer[ctypes.c_float]:
    return x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def _cases(rng: np.random.Generator) -> list[tuple[int, int, int, int, int, int]]:
    """(m, n, k, ta, tb, pad): every transpose of SHAPES with a random pad, and the in-place
    shapes (b not transposed, its pad fixed)."""
    out = [
        (m, n, k, ta, tb, int(rng.integers(0, 5)))
        for m, n, k in SHAPES
        for ta in (0, 1)
        for tb in (0, 1)
    ]
    return out + [(m, n, k, ta, 0, pad) for m, n, k, pad in IN_PLACE_SHAPES for ta in (0, 1)]


def _check(lib: ctypes.CDLL, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for m, n, k, ta, tb, pad in _cases(rng):
        for alpha, beta in ((1.0, 0.0), (-0.05, 1.0), (2.5, 0.5)):
            a_rows, a_cols = (k, m) if ta else (m, k)
            b_rows, b_cols = (n, k) if tb else (k, n)
            a = rng.standard_normal((a_rows, a_cols + pad)).astype(np.float32)
            b = rng.standard_normal((b_rows, b_cols + pad)).astype(np.float32)
            c = rng.standard_normal((m, n + pad)).astype(np.float32)
            if beta == 0.0:
                c[:] = np.nan  # must not be read
            opa = a[:, :a_cols].astype(np.float64)
            opb = b[:, :b_cols].astype(np.float64)
            opa, opb = (opa.T if ta else opa), (opb.T if tb else opb)
            c0 = np.where(np.isnan(c), 0.0, c).astype(np.float64)[:, :n]
            want = alpha * (opa @ opb) + (beta * c0 if beta else 0.0)
            scale = abs(alpha) * (np.abs(opa) @ np.abs(opb)) + abs(beta) * np.abs(c0)
            got = c.copy()
            lda, ldb, ldc = a.shape[1], b.shape[1], got.shape[1]
            args = (
                ta,
                tb,
                m,
                n,
                k,
                alpha,
                _ptr(a),
                lda,
                _ptr(b),
                ldb,
                beta,
                _ptr(got),
                ldc,
            )
            lib.sg_call(*args)
            where = f"m={m} n={n} k={k} ta={ta} tb={tb} alpha={alpha} beta={beta}"
            bound = (k + 2) * np.finfo(np.float32).eps * scale + 1e-30
            assert np.all(np.abs(got[:, :n] - want) <= bound), where
            # the padding columns of c are never written
            assert np.array_equal(got[:, n:], c[:, n:], equal_nan=True), where


def _check_dot(lib: ctypes.CDLL, seed: int) -> None:
    """``sg_gemm_abt_dot`` (c = alpha a b^T + beta c, a m x k, b n x k) against float64."""
    rng = np.random.default_rng(seed)
    for m, n, k in DOT_SHAPES:
        for alpha, beta in ((1.0, 0.0), (-0.05, 1.0), (2.5, 0.5)):
            pa, pb, pc = (int(x) for x in rng.integers(0, 5, 3))
            a = rng.standard_normal((m, k + pa)).astype(np.float32)
            b = rng.standard_normal((n, k + pb)).astype(np.float32)
            c = rng.standard_normal((m, n + pc)).astype(np.float32)
            if beta == 0.0:
                c[:] = np.nan  # must not be read
            opa, opb = a[:, :k].astype(np.float64), b[:, :k].astype(np.float64)
            c0 = np.where(np.isnan(c), 0.0, c).astype(np.float64)[:, :n]
            want = alpha * (opa @ opb.T) + (beta * c0 if beta else 0.0)
            scale = abs(alpha) * (np.abs(opa) @ np.abs(opb.T)) + abs(beta) * np.abs(c0)
            got = c.copy()
            lib.sg_dot(
                m, n, k, alpha, _ptr(a), a.shape[1], _ptr(b), b.shape[1], beta, _ptr(got),
                got.shape[1],
            )  # fmt: skip
            where = f"dot m={m} n={n} k={k} alpha={alpha} beta={beta}"
            bound = (k + 2) * np.finfo(np.float32).eps * scale + 1e-30
            assert np.all(np.abs(got[:, :n] - want) <= bound), where
            assert np.array_equal(got[:, n:], c[:, n:], equal_nan=True), where


@pytest.mark.skipif(not HAS_AVX512, reason="needs an x86-64 CPU with AVX-512F")
def test_avx512_product_matches_numpy_on_odd_shapes() -> None:
    lib = _harness(tuple(cflags()))
    if lib.sg_own() != 1:
        pytest.skip("the backend's flags do not target AVX-512 here ($SHAPEGRAD_CFLAGS)")
    _check(lib, 0)
    _check_dot(lib, 2)


@pytest.mark.skipif(not X86, reason="the fallback build needs an x86-64 -march")
def test_without_avx512_the_library_product_runs() -> None:
    lib = _harness(_no_avx512_flags())
    assert lib.sg_own() == 0  # sg_sgemm is cblas_sgemm, sg_gemm_abt_dot the same call
    _check(lib, 1)
    _check_dot(lib, 3)


def _contract(m: int, n: int, k: int, ta: bool, tb: bool, dtype: DType = float32) -> L.Contract:
    return L.Contract(
        a="a", b="b", c="c", m=m, n=n, k=k, trans_a=ta, trans_b=tb, lda=m if ta else k,
        ldb=k if tb else n, offset_a=0, offset_b=0, batch=1, stride_a=0, stride_b=0,
        stride_c=0, dtype=dtype,
    )  # fmt: skip


def test_rule_takes_large_products_and_written_weight_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(gemm_kernel.ENV, raising=False)
    assert gemm_kernel.takes(_contract(128, 1024, 1024, False, True))
    assert gemm_kernel.takes(_contract(128, 1024, 784, False, False))
    assert gemm_kernel.takes(_contract(128, 512, 512, False, False))
    gradient = _contract(784, 512, 128, True, False)  # c = a^T @ b, written (beta 0)
    assert gemm_kernel.written_gradient(gradient) and gemm_kernel.takes(gradient)
    assert gemm_kernel.takes(_contract(1536, 256, 128, True, False))
    assert not gemm_kernel.takes(replace(gradient, beta=1.0))  # an SGD update folded in
    assert not gemm_kernel.takes(replace(gradient, m=2048))  # many rows
    assert not gemm_kernel.takes(replace(gradient, k=64))  # a small batch
    assert not gemm_kernel.takes(replace(gradient, n=128))  # few columns
    assert gemm_kernel.takes(replace(gradient, n=1024))  # w1024's, in a step
    assert not gemm_kernel.takes(replace(gradient, n=2048))  # not measured inside a step
    assert not gemm_kernel.takes(_contract(128, 10, 1024, False, True))  # thin
    assert not gemm_kernel.takes(_contract(2048, 1024, 512, False, False))  # many rows
    assert not gemm_kernel.takes(_contract(128, 256, 512, False, False))  # few columns
    assert not gemm_kernel.takes(_contract(128, 1024, 128, False, True))  # short sum
    assert not gemm_kernel.takes(_contract(128, 1024, 1024, False, True, float64))
    monkeypatch.setenv(gemm_kernel.ENV, "own")
    assert gemm_kernel.takes(_contract(3, 4, 5, True, False))
    assert gemm_kernel.function(_contract(3, 4, 5, True, False, float64)) == "scipy_cblas_dgemm"
    monkeypatch.setenv(gemm_kernel.ENV, "blas")
    assert gemm_kernel.function(_contract(128, 1024, 1024, False, True)) == "scipy_cblas_sgemm"
    monkeypatch.setenv(gemm_kernel.ENV, "fast")
    with pytest.raises(ValueError, match="SHAPEGRAD_GEMM='fast': expected one of auto, blas, own"):
        gemm_kernel.takes(_contract(128, 1024, 1024, False, True))


def test_rule_takes_convolution_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """b read in place (rows an odd number of 64-byte lines apart) and summed a @ b^T."""
    monkeypatch.delenv(gemm_kernel.ENV, raising=False)
    fwd = _contract(32, 784, 144, False, False)  # W @ im2col, 784 = 49 lines
    assert gemm_kernel.reads_b_in_place(fwd) and gemm_kernel.takes(fwd)
    assert gemm_kernel.takes(_contract(144, 784, 32, True, False))  # W^T @ dy
    assert not gemm_kernel.takes(_contract(144, 784, 16, True, False))  # short sum
    assert not gemm_kernel.takes(_contract(512, 784, 144, False, False))  # many rows
    assert not gemm_kernel.reads_b_in_place(_contract(32, 1024, 144, False, False))  # 64 lines
    assert not gemm_kernel.reads_b_in_place(_contract(32, 784, 144, False, True))
    wgrad = replace(_contract(32, 144, 784, False, True), sum_batch=64)
    assert gemm_kernel.takes_dot(wgrad) and gemm_kernel.uses_own(wgrad)
    assert not gemm_kernel.takes_dot(replace(wgrad, k=64))  # short dot products
    assert not gemm_kernel.takes_dot(replace(wgrad, trans_a=True))
    assert not gemm_kernel.takes_dot(replace(wgrad, dtype=float64))
    monkeypatch.setenv(gemm_kernel.ENV, "blas")
    assert not gemm_kernel.takes(fwd) and not gemm_kernel.takes_dot(wgrad)


def _mlp_step(params: list[sg.Tensor], x: sg.Tensor, y: sg.Tensor) -> sg.Tensor:
    h = sg.relu(x @ params[0])
    return F.cross_entropy(h @ params[1], y)


@pytest.mark.parametrize("mode", ["auto", "own"])
def test_compiled_training_step_with_own_products(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(gemm_kernel.ENV, mode)
    rng = np.random.default_rng(3)
    w1 = (rng.standard_normal((100, 130)) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((130, 70)) * 0.1).astype(np.float32)
    x = rng.standard_normal((67, 100)).astype(np.float32)
    y = rng.integers(0, 70, 67).astype(np.int32)
    grad = sg.compile(sg.grad(_mlp_step), backend="c", name=f"own_gemm_{mode}")
    source = grad.lower([w1, w2], x, y).source
    assert source is not None
    assert ("sg_sgemm(101, 111, 112," in source) == (mode == "own")  # dh = dz @ w2^T
    g1, g2 = grad([w1, w2], x, y)
    # NumPy reference in float64
    z1 = x.astype(np.float64) @ w1
    h = np.maximum(z1, 0.0)
    z = h @ w2
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    p[np.arange(67), y] -= 1.0
    dz = p / 67
    want2 = h.T @ dz
    want1 = x.T.astype(np.float64) @ ((dz @ w2.T) * (z1 > 0))
    np.testing.assert_allclose(np.asarray(g2), want2, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(np.asarray(g1), want1, rtol=1e-4, atol=1e-6)


def test_products_split_across_two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Column blocks of one product run concurrently (each thread packs on its own stack),
    the forward product and the written weight gradient alike."""
    monkeypatch.setenv(gemm_kernel.ENV, "auto")
    monkeypatch.setenv("SHAPEGRAD_NUM_THREADS", "2")
    monkeypatch.setenv("SHAPEGRAD_ADAPTIVE_THREADS", "0")  # always the full team
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((300, 700)) * 0.05).astype(np.float32)
    x = rng.standard_normal((128, 300)).astype(np.float32)

    def loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return (sg.relu(x @ w) ** 2).sum()

    step = sg.compile(sg.value_and_grad(loss), backend="c", name="own_gemm_two_threads")
    source = step.lower(w, x).source
    assert source is not None and "sg_sgemm(101, 111, 111, 128, (int)(p1 - p0)" in source
    # the weight gradient x^T @ dz is written (beta 0): the own product, split by columns
    assert "sg_sgemm(101, 112, 111, 300, (int)(p1 - p0), 128," in source
    value, g = step(w, x)
    z = x.astype(np.float64) @ w
    np.testing.assert_allclose(float(value), (np.maximum(z, 0.0) ** 2).sum(), rtol=1e-5)
    want = x.T.astype(np.float64) @ (2.0 * np.maximum(z, 0.0))
    np.testing.assert_allclose(np.asarray(g), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("m", "n", "k"), [(301, 517, 133), (1536, 256, 128), (64, 768, 200), (784, 1024, 128)]
)
def test_written_weight_gradients_of_odd_sizes(
    m: int, n: int, k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weight gradient the own product takes (beta 0, at the edges of the rule's range and
    at odd sizes), cut across two threads, against float64 NumPy."""
    monkeypatch.setenv(gemm_kernel.ENV, "auto")
    monkeypatch.setenv("SHAPEGRAD_NUM_THREADS", "2")
    monkeypatch.setenv("SHAPEGRAD_ADAPTIVE_THREADS", "0")
    rng = np.random.default_rng(m + n + k)
    w = (rng.standard_normal((m, n)) * 0.05).astype(np.float32)
    x = rng.standard_normal((k, m)).astype(np.float32)

    def loss(w: sg.Tensor, x: sg.Tensor) -> sg.Tensor:
        return (sg.tanh(x @ w) ** 2).sum()

    grad = sg.compile(sg.grad(loss), backend="c", name=f"own_gemm_wgrad_{m}_{n}_{k}")
    source = grad.lower(w, x).source
    assert source is not None
    assert gemm_kernel.written_gradient(_contract(m, n, k, True, False))
    assert "sg_sgemm(101, 112, 111," in source
    z = np.tanh(x.astype(np.float64) @ w)
    want = x.T.astype(np.float64) @ (2.0 * z * (1.0 - z * z))
    np.testing.assert_allclose(np.asarray(grad(w, x)), want, rtol=1e-4, atol=1e-4)
