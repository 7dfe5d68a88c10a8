"""shapegrad's batched float32 product (``backends/c/sgemm_batch.h``, chosen by
``batch_gemm.py``): a whole ``L.Contract`` batch in one call.

The C function is built into a small harness library twice: with the backend's flags (the
AVX-512 kernel where the CPU has it) and with ``-march=x86-64-v3`` (no AVX-512: one
``cblas_sgemm`` per product, as before). Both are checked against a float64 NumPy product
on odd shapes crossing every block edge of the kernel (8- and 6-row tiles and their 4, 2,
1-row tails, 16-column vectors, 64-column blocks, 256-term k-blocks), all four transposes,
two-level batches laid out back to back and as interleaved head views (heads of a ``[b, t,
h*d]`` buffer, rows of ``c`` wider than ``n``), alpha and beta (beta 0 must not read ``c``:
it holds NaN; alpha 0 scales ``c`` by beta, once whatever the team), at 1 and 2 threads
(the products shared across the team inside the call: the same bits as one thread).
Elements of the buffers that no product owns stay as they were. The bound is the one of
``test_own_gemm.py``: ``(k + 2) eps (|alpha| |op(a)| |op(b)| + |beta c|)``. Then compiled
attention (forward and gradients) with the kernel taken or not (``$SHAPEGRAD_BATCH_GEMM``),
and built without AVX-512, against NumPy in float64.
"""

from __future__ import annotations

import ctypes
import platform

import numpy as np
import pytest

import shapegrad as sg
from shapegrad.backends import native
from shapegrad.backends.c import batch_gemm, gemm_kernel
from shapegrad.backends.c.blascore import cpu_flags
from shapegrad.backends.c.toolchain import blas_paths, cflags, compiler
from shapegrad.compiler import loops as L
from shapegrad.dtypes import float32, float64
from shapegrad.nn.attention import merge_heads, split_heads

X86 = platform.machine() in ("x86_64", "AMD64")
HAS_AVX512 = X86 and "avx512f" in cpu_flags()

_HARNESS = r"""
#include <stdint.h>
void scipy_cblas_sgemm(int, int, int, int, int, int, float, const float *, int,
                       const float *, int, float, float *, int);
{kernels}
int sg_own(void) {{ return SG_OWN_BATCH_GEMM; }}
void sg_call(int nt, int ta, int tb, int m, int n, int k, float alpha, const float *a,
             int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc,
             int64_t batch, int64_t inner, int64_t sa, int64_t sb, int64_t sc, int64_t isa,
             int64_t isb, int64_t isc) {{
#pragma omp parallel num_threads(nt)
    sg_sgemm_batch(nt > 1, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, batch, inner,
                   sa, sb, sc, isa, isb, isc);
}}
"""


def _harness(flags: tuple[str, ...]) -> ctypes.CDLL:
    libdir, libname = blas_paths()
    spec = native.BuildSpec(
        _HARNESS.format(kernels=gemm_kernel.SOURCE + batch_gemm.SOURCE),
        compiler(),
        (*flags, "-fopenmp"),
        (f"-L{libdir}", f"-l{libname}", f"-Wl,-rpath,{libdir}", "-fopenmp"),
    )
    lib = ctypes.CDLL(native.load_path(native.build_library(spec)))
    f, i, i64 = ctypes.c_float, ctypes.c_int, ctypes.c_int64
    p = ctypes.POINTER(ctypes.c_float)
    lib.sg_call.argtypes = [i, i, i, i, i, i, f, p, i64, p, i64, f, p, i64, *[i64] * 8]
    lib.sg_own.restype = i
    return lib


def _no_avx512_flags() -> tuple[str, ...]:
    return tuple(f for f in cflags() if not f.startswith("-march")) + ("-march=x86-64-v3",)


def _ptr(x: np.ndarray) -> ctypes._Pointer[ctypes.c_float]:
    return x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


class Operand:
    """A batch of ``rows x cols`` matrices in one flat buffer: product ``(bo, bh)`` starts
    at ``bo * s + bh * inner_s``, rows ``ld`` apart. ``heads``: the inner products
    interleave as head views (``[outer, rows, inner * cols]``); else back to back."""

    def __init__(self, rows: int, cols: int, outer: int, inner: int, heads: bool, pad: int) -> None:
        self.rows, self.cols, self.outer, self.inner = rows, cols, outer, inner
        if heads:
            self.ld = inner * cols + pad
            self.inner_s, self.s = cols, rows * self.ld + pad
        else:
            self.ld = cols + pad
            self.inner_s = rows * self.ld + pad
            self.s = inner * self.inner_s + 2 * pad
        self.size = (outer - 1) * self.s + (inner - 1) * self.inner_s + (rows - 1) * self.ld
        self.size += cols + pad

    def index(self, bi: int) -> np.ndarray:
        """Flat indices of product ``bi``'s matrix, ``rows x cols``."""
        bo, bh = divmod(bi, self.inner)
        start = bo * self.s + bh * self.inner_s
        return start + np.arange(self.rows)[:, None] * self.ld + np.arange(self.cols)[None, :]


SHAPES = [  # m, n, k: tiles of 8/6 rows, tails, 1-4 vectors, 64-column blocks, k-blocks
    (1, 1, 1),
    (3, 17, 5),
    (13, 33, 31),
    (12, 64, 32),
    (64, 64, 32),
    (64, 32, 64),
    (27, 49, 16),
    (7, 130, 19),
    (20, 70, 300),
]


def _check(lib: ctypes.CDLL, seed: int) -> None:
    rng = np.random.default_rng(seed)
    eps = np.finfo(np.float32).eps
    for m, n, k in SHAPES:
        for ta in (0, 1):
            for tb in (0, 1):
                for outer, inner, heads in ((3, 1, False), (2, 3, False), (2, 3, True)):
                    pick = 3 if (m, n, k) == (3, 17, 5) else int(rng.integers(3))  # 3: alpha 0
                    alpha, beta = [(1.0, 0.0), (-0.5, 1.0), (2.5, 0.25), (0.0, 0.5)][pick]
                    pad = int(rng.integers(0, 4))
                    oa = Operand(*((k, m) if ta else (m, k)), outer, inner, heads, pad)
                    ob = Operand(*((n, k) if tb else (k, n)), outer, inner, heads, pad)
                    oc = Operand(m, n, outer, inner, heads, pad)
                    a = rng.standard_normal(oa.size).astype(np.float32)
                    b = rng.standard_normal(ob.size).astype(np.float32)
                    c = rng.standard_normal(oc.size).astype(np.float32)
                    if beta == 0.0:
                        c[:] = np.nan  # must not be read
                    batch = outer * inner
                    args = (ta, tb, m, n, k, alpha, _ptr(a), oa.ld, _ptr(b), ob.ld, beta)
                    rest = (oc.ld, batch, inner, oa.s, ob.s, oc.s)
                    got = {}
                    for nt in (1, 2):
                        out = c.copy()
                        lib.sg_call(nt, *args, _ptr(out), *rest, oa.inner_s, ob.inner_s, oc.inner_s)
                        got[nt] = out
                    where = f"m={m} n={n} k={k} ta={ta} tb={tb} {outer}x{inner} heads={heads}"
                    assert np.array_equal(got[1], got[2], equal_nan=True), where
                    owned = np.zeros(oc.size, bool)
                    for bi in range(batch):
                        opa = a[oa.index(bi)].astype(np.float64)
                        opb = b[ob.index(bi)].astype(np.float64)
                        opa, opb = (opa.T if ta else opa), (opb.T if tb else opb)
                        ci = oc.index(bi)
                        c0 = np.nan_to_num(c[ci].astype(np.float64)) if beta else 0.0
                        want = alpha * (opa @ opb) + beta * c0
                        scale = abs(alpha) * (np.abs(opa) @ np.abs(opb)) + abs(beta) * np.abs(c0)
                        bound = (k + 2) * eps * scale + 1e-30
                        assert np.all(np.abs(got[1][ci] - want) <= bound), f"{where} product {bi}"
                        owned[ci] = True
                    # what no product owns (padding, gaps between products) is never written
                    assert np.array_equal(got[1][~owned], c[~owned], equal_nan=True), where


@pytest.mark.skipif(not HAS_AVX512, reason="needs an x86-64 CPU with AVX-512F")
def test_avx512_batched_product_matches_numpy_on_odd_shapes() -> None:
    lib = _harness(tuple(cflags()))
    if lib.sg_own() != 1:
        pytest.skip("the backend's flags do not target AVX-512 here ($SHAPEGRAD_CFLAGS)")
    _check(lib, 0)


@pytest.mark.skipif(not X86, reason="the fallback build needs an x86-64 -march")
def test_without_avx512_each_product_is_a_library_call() -> None:
    lib = _harness(_no_avx512_flags())
    assert lib.sg_own() == 0  # one cblas_sgemm per product, as before
    _check(lib, 1)


def _contract(m: int, n: int, k: int, batch: int, sum_batch: int = 1, dtype=float32) -> L.Contract:  # type: ignore[no-untyped-def]
    return L.Contract(
        a="a", b="b", c="c", m=m, n=n, k=k, trans_a=False, trans_b=True, lda=k, ldb=k,
        offset_a=0, offset_b=0, batch=batch, stride_a=m * k, stride_b=n * k, stride_c=m * n,
        dtype=dtype, sum_batch=sum_batch,
    )  # fmt: skip


def test_rule_takes_small_batched_float32_products(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(batch_gemm.ENV, raising=False)
    assert batch_gemm.takes(_contract(64, 64, 32, 128))  # attention's scores
    assert not batch_gemm.takes(_contract(64, 64, 32, 1))  # one product: not a batch
    assert not batch_gemm.takes(_contract(64, 64, 32, 128, dtype=float64))
    assert not batch_gemm.takes(_contract(64, 64, 32, 4, sum_batch=2))  # a sum of products
    assert not batch_gemm.takes(_contract(512, 512, 512, 4))  # large: the library
    monkeypatch.setenv(batch_gemm.ENV, "own")
    assert batch_gemm.takes(_contract(512, 512, 512, 4))
    monkeypatch.setenv(batch_gemm.ENV, "blas")
    assert not batch_gemm.takes(_contract(64, 64, 32, 128))
    monkeypatch.setenv(batch_gemm.ENV, "fast")
    with pytest.raises(ValueError, match="SHAPEGRAD_BATCH_GEMM='fast': expected one of auto"):
        batch_gemm.takes(_contract(64, 64, 32, 128))


B, T, H, D = 3, 70, 3, 33  # 9 products of 70x70x33: above the split threshold (1M MACs)


def _attention(x: sg.Tensor, w: sg.Tensor) -> sg.Tensor:
    d = H * D
    q, k, v = (split_heads(x[:, :, i * d : (i + 1) * d], H) for i in range(3))
    weights = sg.softmax(sg.einsum("bhqd,bhkd->bhqk", q, k) * 0.2, axis=-1)
    out = merge_heads(sg.einsum("bhqk,bhkd->bhqd", weights, v)) @ w
    return (out * out).sum()


def _attention_np(x: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    """The loss and its gradient with respect to ``x`` (float64, by hand)."""
    q, k, v = x.astype(np.float64).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * 0.2
    e = np.exp(s - s.max(-1, keepdims=True))
    p = e / e.sum(-1, keepdims=True)
    o = np.einsum("bhqk,bhkd->bhqd", p, v).transpose(0, 2, 1, 3).reshape(B, T, H * D)
    out = o @ w
    do = (2 * out @ w.T).reshape(B, T, H, D).transpose(0, 2, 1, 3)
    dp = np.einsum("bhqd,bhkd->bhqk", do, v)
    dv = np.einsum("bhqk,bhqd->bhkd", p, do)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) * 0.2
    dq = np.einsum("bhqk,bhkd->bhqd", ds, k)
    dk = np.einsum("bhqk,bhqd->bhkd", ds, q)
    grads = np.stack([dq, dk, dv]).transpose(1, 3, 0, 2, 4).reshape(B, T, 3 * H * D)
    return float((out * out).sum()), grads


@pytest.mark.parametrize(
    "mode, threads, avx2",
    [
        ("auto", 1, False),
        ("auto", 2, False),
        ("own", 1, False),
        ("own", 2, False),
        ("blas", 2, False),
        pytest.param("auto", 2, True, marks=pytest.mark.skipif(not X86, reason="x86-64 -march")),
    ],
)
def test_compiled_attention_and_gradients_match_numpy(
    mode: str, threads: int, avx2: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``avx2``: built without AVX-512 (``$SHAPEGRAD_CFLAGS``), the one call runs one
    library product per product, as before."""
    monkeypatch.setenv(batch_gemm.ENV, mode)
    monkeypatch.setenv("SHAPEGRAD_NUM_THREADS", str(threads))
    if avx2:
        monkeypatch.setenv("SHAPEGRAD_CFLAGS", " ".join(_no_avx512_flags()))
    rng = np.random.default_rng(5)
    x = rng.standard_normal((B, T, 3 * H * D)).astype(np.float32)
    w = (rng.standard_normal((H * D, 20)) * 0.2).astype(np.float32)
    name = f"batch_gemm_{mode}{'_avx2' if avx2 else ''}"
    fn = sg.compile(sg.value_and_grad(_attention), backend="c", name=name)
    source = fn.lower(x, w).source
    assert source is not None
    calls = source.count("sg_sgemm_batch(")
    assert (calls >= 6) == (mode != "blas"), calls  # scores, weights @ v and 4 in backward
    loss, gx = fn(x, w)
    want_loss, want_gx = _attention_np(x, w)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-4)
    np.testing.assert_allclose(gx, want_gx, rtol=2e-3, atol=2e-3 * np.abs(want_gx).max())
