/* shapegrad's own float32 matrix product (backends/c/sgemm.h, chosen per product by
   gemm_kernel.py): sg_sgemm has cblas_sgemm's signature, row-major only (order 101, the
   only order the generated code passes). Where the target has AVX-512F it is a BLIS-style
   product: op(b) packed in panels of KC x 48 (a 16 x 16 register transpose when op(b) is
   b^T), op(a) in panels of 8 x KC, an 8 x 48 register block of 24 zmm accumulators.
   op(b) = b is read in place, unpacked, when its rows are an odd number of cache lines
   apart (sg_gemm_b_in_place: a convolution's 784-pixel im2col or output gradient); column
   tails of 16 or 32 run on 1- or 2-vector blocks. sg_gemm_abt_dot computes c = a @ b^T
   from operands that both hold the summed axis contiguously, as dot products (a summed
   weight gradient). Elsewhere sg_sgemm is the library's cblas_sgemm and sg_gemm_abt_dot
   the same library call, so AVX2 and other CPUs run what they ran before. Rounding: each k-block of KC terms is summed in order into the accumulator
   and added to c (as OpenBLAS does), so results match the library to float32 GEMM
   tolerance, not bit for bit. Packing buffers live on the calling thread's stack (~225
   KiB): no allocation, no sharing between the team's threads. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define SG_GEMM_MR 8
#define SG_GEMM_NV 3
#define SG_GEMM_NR (16 * SG_GEMM_NV)
#define SG_GEMM_KC 256
#define SG_GEMM_MC 128
#define SG_LO_PD(x, y) _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)))
#define SG_HI_PD(x, y) _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)))
/* r[i][j] -> r[j][i] for a 16 x 16 block held in 16 registers */
static inline void sg_transpose16(__m512 r[16]) {
    __m512 t[16];
#pragma GCC unroll 16
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 16
    for (int i = 0; i < 4; ++i) {
        r[4 * i] = SG_LO_PD(t[4 * i], t[4 * i + 2]);
        r[4 * i + 1] = SG_HI_PD(t[4 * i], t[4 * i + 2]);
        r[4 * i + 2] = SG_LO_PD(t[4 * i + 1], t[4 * i + 3]);
        r[4 * i + 3] = SG_HI_PD(t[4 * i + 1], t[4 * i + 3]);
    }
#pragma GCC unroll 16
    for (int h = 0; h < 2; ++h)
#pragma GCC unroll 16
        for (int i = 0; i < 4; ++i) {
            t[8 * h + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0x88);
            t[8 * h + 4 + i] = _mm512_shuffle_f32x4(r[8 * h + i], r[8 * h + 4 + i], 0xdd);
        }
#pragma GCC unroll 16
    for (int i = 0; i < 8; ++i) {
        r[i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0x88);
        r[8 + i] = _mm512_shuffle_f32x4(t[i], t[8 + i], 0xdd);
    }
}
/* dst[k * MR + r] = op(a)[i0 + r, k0 + k] for r < rows, 0 for rows <= r < MR */
static void sg_gemm_pack_a(float *restrict dst, const float *restrict a, int ta, int64_t lda,
                           int64_t i0, int rows, int64_t k0, int kc) {
    const int mr = SG_GEMM_MR;
    if (ta) { /* op(a)[i, k] = a[k * lda + i]: each k's rows are contiguous */
        const __mmask16 m = (__mmask16)((1u << rows) - 1u);
        for (int k = 0; k < kc; ++k)
            _mm256_store_ps(dst + k * mr, _mm512_castps512_ps256(
                _mm512_maskz_loadu_ps(m, a + (k0 + k) * lda + i0)));
        return;
    }
    int k = 0; /* op(a)[i, k] = a[i * lda + k]: 16 k of each row, transposed */
    for (; k + 16 <= kc; k += 16) {
        __m512 r[16];
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q)
            r[q] = q < rows ? _mm512_loadu_ps(a + (i0 + q) * lda + k0 + k) : _mm512_setzero_ps();
        sg_transpose16(r);
#pragma GCC unroll 16
        for (int q = 0; q < 16; ++q) _mm256_store_ps(dst + (k + q) * mr, _mm512_castps512_ps256(r[q]));
    }
    for (; k < kc; ++k)
        for (int q = 0; q < mr; ++q) dst[k * mr + q] = q < rows ? a[(i0 + q) * lda + k0 + k] : 0.0f;
}
/* dst[k * NR + c] = op(b)[k0 + k, j0 + c] for c < cols, 0 for cols <= c < NR */
static void sg_gemm_pack_b(float *restrict dst, const float *restrict b, int tb, int64_t ldb,
                           int64_t j0, int cols, int64_t k0, int kc) {
    const int nr = SG_GEMM_NR;
    if (!tb) { /* op(b)[k, j] = b[k * ldb + j]: rows of the panel are contiguous */
        for (int k = 0; k < kc; ++k) {
            const float *src = b + (k0 + k) * ldb + j0;
#pragma GCC unroll 4
            for (int v = 0; v < SG_GEMM_NV; ++v) {
                const int left = cols - 16 * v;
                const __mmask16 m = left >= 16 ? (__mmask16)0xffff
                                  : left > 0 ? (__mmask16)((1u << left) - 1u) : (__mmask16)0;
                _mm512_store_ps(dst + k * nr + 16 * v, _mm512_maskz_loadu_ps(m, src + 16 * v));
            }
        }
        return;
    }
    for (int c0 = 0; c0 < nr; c0 += 16) { /* op(b)[k, j] = b[j * ldb + k]: 16 x 16 transposes */
        int k = 0;
        for (; k + 16 <= kc; k += 16) {
            __m512 r[16];
#pragma GCC unroll 16
            for (int q = 0; q < 16; ++q)
                r[q] = c0 + q < cols ? _mm512_loadu_ps(b + (j0 + c0 + q) * ldb + k0 + k)
                                     : _mm512_setzero_ps();
            sg_transpose16(r);
#pragma GCC unroll 16
            for (int q = 0; q < 16; ++q) _mm512_store_ps(dst + (k + q) * nr + c0, r[q]);
        }
        for (; k < kc; ++k)
            for (int q = 0; q < 16; ++q)
                dst[k * nr + c0 + q] = c0 + q < cols ? b[(j0 + c0 + q) * ldb + k0 + k] : 0.0f;
    }
}
/* The next panel of op(b) = b (not transposed), packed by the blocks that multiply the
   current one, each a share of its rows between its multiplications: the loads of b,
   usually from L3 or DRAM, then wait while the block's FMAs run instead of in a packing
   pass of their own. (Where op(b) = b^T the same with a 16 x 16 register transpose per
   unit read 5-15% slower alone: the block's accumulators spill around it.) Alone, one
   thread, b in L3 / DRAM (benchmarks/sgemm_cold.py, AMD EPYC Zen 5, 2026-11-27):
   128 x 1024 x 1024 1244 -> 1083 / 1365 -> 1144 us, 128 x 512 x 784 with b's rows 1024
   floats apart 474 -> 429 / 525 -> 437. */
typedef struct {
    float *dst;       /* the next panel's buffer */
    const float *src; /* op(b)[0, 0] of the next panel in b */
    int64_t ldb;
    int cols;         /* the panel's columns, at most SG_GEMM_NR */
    int kc;           /* its rows */
    int r0, r1;       /* the rows this block packs */
} sg_gemm_ahead;
/* Rows are prefetched this many rows before they are packed: b's rows are usually on pages
   of their own, where the hardware prefetchers stop, and a load that waits for DRAM would
   stall the block (alone, b flushed from L3: 2.5x slower without). */
#define SG_GEMM_AHEAD 8
static inline __attribute__((always_inline)) void sg_gemm_prefetch_row(const sg_gemm_ahead *ahead,
                                                                       int r) {
    const char *src = (const char *)(ahead->src + r * ahead->ldb);
#pragma GCC unroll 4
    for (int v = 0; v < SG_GEMM_NV; ++v) _mm_prefetch(src + 64 * v, _MM_HINT_T0);
    _mm_prefetch(src + 4 * SG_GEMM_NR - 4, _MM_HINT_T0); /* a row not 64-byte aligned */
}
static inline __attribute__((always_inline)) void sg_gemm_pack_row(const sg_gemm_ahead *ahead,
                                                                   int r) {
    if (r + SG_GEMM_AHEAD < ahead->kc) sg_gemm_prefetch_row(ahead, r + SG_GEMM_AHEAD);
    const float *src = ahead->src + r * ahead->ldb;
    float *dst = ahead->dst + r * SG_GEMM_NR;
#pragma GCC unroll 4
    for (int v = 0; v < SG_GEMM_NV; ++v) {
        const int left = ahead->cols - 16 * v;
        const __mmask16 m = left >= 16 ? (__mmask16)0xffff
                          : left > 0 ? (__mmask16)((1u << left) - 1u) : (__mmask16)0;
        _mm512_store_ps(dst + 16 * v, _mm512_maskz_loadu_ps(m, src + 16 * v));
    }
}
/* c[:rows, :cols] = alpha * (ap @ bp) + beta * c (c not read when beta == 0), for a block of
   16 * nv columns (nv a constant where it is inlined); row k of bp starts at bp + k * bs
   (bs = SG_GEMM_NR for a packed panel, ldb for op(b) read in place). With ahead (else NULL)
   it also packs those rows of the next panel, one row per kc / (r1 - r0) multiplications. */
static inline __attribute__((always_inline)) void sg_gemm_block(
    const int nv, const float *restrict ap, const float *restrict bp, int64_t bs, int kc,
    float *restrict c, int64_t ldc, int rows, int cols, float alpha, float beta,
    const sg_gemm_ahead *ahead) {
    __m512 acc[SG_GEMM_MR][SG_GEMM_NV];
    /* c is read at the end when beta is not 0 (an update folded in, a later k-block): fetch
       it while the block multiplies. W -= lr * x^T @ dh alone, k 128, caches flushed between
       calls, 1 thread, own / library: 512x512 1.16 -> 1.01, 784x1024 1.40 -> 1.05
       (2026-11-27); inside SGD steps still 1.03-1.07 (benchmarks/gemm_in_step.py), so
       gemm_kernel.py leaves those products to the library. */
    if (beta != 0.0f)
#pragma GCC unroll 8
        for (int r = 0; r < SG_GEMM_MR; ++r)
#pragma GCC unroll 4
            for (int v = 0; v < nv; ++v)
                if (r < rows) _mm_prefetch((const char *)(c + r * ldc + 16 * v), _MM_HINT_T0);
#pragma GCC unroll 8
    for (int r = 0; r < SG_GEMM_MR; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) acc[r][v] = _mm512_setzero_ps();
/* acc += the outer product of column k of the a panel and row k of the b panel */
#define SG_GEMM_MULTIPLY(k)                                                                  \
    do {                                                                                     \
        __m512 bv[SG_GEMM_NV];                                                               \
        _Pragma("GCC unroll 4") for (int v = 0; v < nv; ++v)                                 \
            bv[v] = _mm512_loadu_ps(bp + (k) * bs + 16 * v);                                 \
        _Pragma("GCC unroll 8") for (int r = 0; r < SG_GEMM_MR; ++r) {                       \
            const __m512 av = _mm512_set1_ps(ap[(k) * SG_GEMM_MR + r]);                      \
            _Pragma("GCC unroll 4") for (int v = 0; v < nv; ++v)                             \
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);                           \
        }                                                                                    \
    } while (0)
    int k = 0;
    if (ahead) {
        const int n_rows = ahead->r1 - ahead->r0;
        if (ahead->r0 == 0)
            for (int r = 0; r < SG_GEMM_AHEAD && r < ahead->kc; ++r) sg_gemm_prefetch_row(ahead, r);
        for (int q = 0; q < n_rows; ++q) {
            sg_gemm_pack_row(ahead, ahead->r0 + q);
            const int k_end = (int)((int64_t)(q + 1) * kc / n_rows);
#pragma GCC unroll 4
            for (; k < k_end; ++k) SG_GEMM_MULTIPLY(k);
        }
    }
#pragma GCC unroll 4
    for (; k < kc; ++k) SG_GEMM_MULTIPLY(k);
#undef SG_GEMM_MULTIPLY
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
    for (int r = 0; r < SG_GEMM_MR; ++r) {
        if (r >= rows) break;
        float *cr = c + r * ldc;
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) {
            const int left = cols - 16 * v;
            if (left <= 0) break;
            const __mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            __m512 x = _mm512_mul_ps(va, acc[r][v]);
            if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cr + 16 * v), x);
            _mm512_mask_storeu_ps(cr + 16 * v, m, x);
        }
    }
}
static void sg_gemm_block3(const float *restrict ap, const float *restrict bp, int64_t bs, int kc,
                           float *restrict c, int64_t ldc, int rows, int cols, float alpha,
                           float beta, const sg_gemm_ahead *ahead) {
    sg_gemm_block(3, ap, bp, bs, kc, c, ldc, rows, cols, alpha, beta, ahead);
}
static void sg_gemm_block2(const float *restrict ap, const float *restrict bp, int64_t bs, int kc,
                           float *restrict c, int64_t ldc, int rows, int cols, float alpha,
                           float beta, const sg_gemm_ahead *ahead) {
    sg_gemm_block(2, ap, bp, bs, kc, c, ldc, rows, cols, alpha, beta, ahead);
}
static void sg_gemm_block1(const float *restrict ap, const float *restrict bp, int64_t bs, int kc,
                           float *restrict c, int64_t ldc, int rows, int cols, float alpha,
                           float beta, const sg_gemm_ahead *ahead) {
    sg_gemm_block(1, ap, bp, bs, kc, c, ldc, rows, cols, alpha, beta, ahead);
}
/* the full-width block on a packed panel (kept for callers of the first version) */
static inline void __attribute__((unused)) sg_gemm_micro(
    const float *restrict ap, const float *restrict bp, int kc, float *restrict c, int64_t ldc,
    int rows, int cols, float alpha, float beta) {
    sg_gemm_block3(ap, bp, SG_GEMM_NR, kc, c, ldc, rows, cols, alpha, beta, 0);
}
/* Whether op(b) = b (not transposed) is read in place instead of packed: its rows are then
   ldb floats apart, and a panel's KC rows must spread over the L1 sets (an odd number of
   64-byte lines apart: 784 floats, a 28 x 28 convolution's columns, is 49 lines). */
static inline int sg_gemm_b_in_place(int tb, int64_t ldb, int n) {
    return !tb && n >= SG_GEMM_NR && ldb % 16 == 0 && (ldb / 16) % 2 == 1;
}
/* c = alpha * a @ b^T + beta * c where both operands hold the summed axis contiguously
   (a is m x k, b is n x k, row-major): each c[i, j] is a dot product, computed 16 terms at
   a time in a block of SG_DOT_MR rows of a x SG_DOT_NR rows of b (24 zmm accumulators; measured
   against 4 x 6, 6 x 4 and 3 x 8 on the CNN's weight gradient: the fastest)
   whose lanes are added at the end. Nothing is packed, so a sum of many such products into
   a small output (a convolution's weight gradient: b is the image's im2col) reads each
   operand in place, once per block row. c[i, j] is at c + i * csi + j * csj. Rounding:
   lane l sums the terms k = l (mod 16) in order, then the lanes are added. */
#define SG_DOT_MR 8
#define SG_DOT_NR 3
/* the 8 sums of the 16 lanes of acc[r][q], r = 0..7, in one ymm (a transpose-and-add tree:
   24 operations where 8 separate lane sums take 64) */
static inline __m256 sg_sum8(const __m512 acc[SG_DOT_MR][SG_DOT_NR], int q) {
    __m512 a[4], b[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i)
        a[i] = _mm512_add_ps(_mm512_unpacklo_ps(acc[2 * i][q], acc[2 * i + 1][q]),
                             _mm512_unpackhi_ps(acc[2 * i][q], acc[2 * i + 1][q]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; ++i)
        b[i] = _mm512_add_ps(SG_LO_PD(a[2 * i], a[2 * i + 1]), SG_HI_PD(a[2 * i], a[2 * i + 1]));
    /* lane l of b[i] holds rows 4i..4i+3 summed over 128-bit lane l; add the four lanes */
    const __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(b[0], b[1], 0x88),
                                   _mm512_shuffle_f32x4(b[0], b[1], 0xdd));
    const __m512 d = _mm512_add_ps(c, _mm512_shuffle_f32x4(c, c, 0xb1));
    return _mm512_castps512_ps256(_mm512_shuffle_f32x4(d, d, 0x08));
}
static void sg_gemm_dot_blocks(int m, int n, int k, float alpha, const float *a, int64_t lda,
                               const float *b, int64_t ldb, float beta, float *c, int64_t csi,
                               int64_t csj) {
    const int kv = k & ~15;
    const __mmask16 tail = (__mmask16)((1u << (k - kv)) - 1u);
    for (int i0 = 0; i0 < m; i0 += SG_DOT_MR) {
        const float *ar[SG_DOT_MR];
#pragma GCC unroll 8
        for (int r = 0; r < SG_DOT_MR; ++r) ar[r] = a + (int64_t)(i0 + r < m ? i0 + r : m - 1) * lda;
        for (int j0 = 0; j0 < n; j0 += SG_DOT_NR) {
            const float *br[SG_DOT_NR];
#pragma GCC unroll 8
            for (int q = 0; q < SG_DOT_NR; ++q)
                br[q] = b + (int64_t)(j0 + q < n ? j0 + q : n - 1) * ldb;
            __m512 acc[SG_DOT_MR][SG_DOT_NR];
#pragma GCC unroll 8
            for (int r = 0; r < SG_DOT_MR; ++r)
#pragma GCC unroll 8
                for (int q = 0; q < SG_DOT_NR; ++q) acc[r][q] = _mm512_setzero_ps();
            for (int kk = 0; kk < kv; kk += 16) {
                __m512 bv[SG_DOT_NR];
#pragma GCC unroll 8
                for (int q = 0; q < SG_DOT_NR; ++q) bv[q] = _mm512_loadu_ps(br[q] + kk);
#pragma GCC unroll 8
                for (int r = 0; r < SG_DOT_MR; ++r) {
                    __m512 av = _mm512_loadu_ps(ar[r] + kk);
                    __asm__("" : "+v"(av)); /* one load, not one per FMA (gcc folds it) */
#pragma GCC unroll 8
                    for (int q = 0; q < SG_DOT_NR; ++q) acc[r][q] = _mm512_fmadd_ps(av, bv[q], acc[r][q]);
                }
            }
            if (tail) {
                __m512 bv[SG_DOT_NR];
#pragma GCC unroll 8
                for (int q = 0; q < SG_DOT_NR; ++q) bv[q] = _mm512_maskz_loadu_ps(tail, br[q] + kv);
#pragma GCC unroll 8
                for (int r = 0; r < SG_DOT_MR; ++r) {
                    const __m512 av = _mm512_maskz_loadu_ps(tail, ar[r] + kv);
#pragma GCC unroll 8
                    for (int q = 0; q < SG_DOT_NR; ++q) acc[r][q] = _mm512_fmadd_ps(av, bv[q], acc[r][q]);
                }
            }
            const int rows = m - i0 < SG_DOT_MR ? m - i0 : SG_DOT_MR;
#pragma GCC unroll 8
            for (int q = 0; q < SG_DOT_NR; ++q) {
                if (j0 + q >= n) break;
                float *cq = c + (int64_t)i0 * csi + (int64_t)(j0 + q) * csj;
                const __m256 x = _mm256_mul_ps(_mm256_set1_ps(alpha), sg_sum8(acc, q));
                if (csi == 1) { /* the rows' results are adjacent in c */
                    const __mmask8 mk = (__mmask8)((1u << rows) - 1u);
                    const __m256 y = beta == 0.0f ? x : _mm256_fmadd_ps(
                        _mm256_set1_ps(beta), _mm256_maskz_loadu_ps(mk, cq), x);
                    _mm256_mask_storeu_ps(cq, mk, y);
                } else {
                    float t[8];
                    _mm256_storeu_ps(t, x);
                    for (int r = 0; r < rows; ++r)
                        cq[r * csi] = beta == 0.0f ? t[r] : t[r] + beta * cq[r * csi];
                }
            }
        }
    }
}
/* c (m x n, rows ldc apart) = alpha * a @ b^T + beta * c, a m x k and b n x k row-major:
   the call cblas_sgemm(101, 111, 112, m, n, k, ...) makes, by dot products. The roles of
   a and b are swapped when that wastes fewer lanes of the SG_DOT_MR x SG_DOT_NR block. */
static void __attribute__((unused)) sg_gemm_abt_dot(int m, int n, int k, float alpha,
                                                    const float *a, int lda, const float *b,
                                                    int ldb, float beta, float *c, int ldc) {
    if (m <= 0 || n <= 0) return;
    const int64_t mr = SG_DOT_MR, nr = SG_DOT_NR;
    const int64_t as_is = (m + mr - 1) / mr * mr * ((n + nr - 1) / nr * nr);
    const int64_t swapped = (n + mr - 1) / mr * mr * ((m + nr - 1) / nr * nr);
    if (swapped < as_is) sg_gemm_dot_blocks(n, m, k, alpha, b, ldb, a, lda, beta, c, 1, ldc);
    else sg_gemm_dot_blocks(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, 1);
}
static void __attribute__((unused)) sg_sgemm(int order, int trans_a, int trans_b, int m, int n,
                                             int k, float alpha, const float *a, int lda,
                                             const float *b, int ldb, float beta, float *c,
                                             int ldc) {
    (void)order; /* 101: row-major */
    if (m <= 0 || n <= 0) return;
    if (k <= 0 || alpha == 0.0f) { /* c = beta * c, as the library (beta 0: c not read) */
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    const int ta = trans_a == 112, tb = trans_b == 112;
    const int in_place = sg_gemm_b_in_place(tb, ldb, n);
    float apack[SG_GEMM_MC * SG_GEMM_KC] __attribute__((aligned(64)));
    /* two panels of op(b): the one multiplied and the next, packed meanwhile; 1 KB apart
       more than their size, so that the two are not 4 KB-aliased row for row */
    float bpacks[2 * SG_GEMM_KC * SG_GEMM_NR + 256] __attribute__((aligned(64)));
    float *const panel[2] = {bpacks, bpacks + SG_GEMM_KC * SG_GEMM_NR + 256};
    int now = 0, ready = 0; /* ready: panel[now] was packed by the previous panel's blocks */
    for (int i0 = 0; i0 < m; i0 += SG_GEMM_MC) {
        const int mc = m - i0 < SG_GEMM_MC ? m - i0 : SG_GEMM_MC;
        const int panels = (mc + SG_GEMM_MR - 1) / SG_GEMM_MR;
        for (int k0 = 0; k0 < k; k0 += SG_GEMM_KC) {
            const int kc = k - k0 < SG_GEMM_KC ? k - k0 : SG_GEMM_KC;
            const float bk = k0 == 0 ? beta : 1.0f; /* later k-blocks add to c */
            for (int p = 0; p < panels; ++p) {
                const int rows = mc - p * SG_GEMM_MR < SG_GEMM_MR ? mc - p * SG_GEMM_MR : SG_GEMM_MR;
                sg_gemm_pack_a(apack + p * SG_GEMM_MR * kc, a, ta, lda, i0 + p * SG_GEMM_MR, rows,
                               k0, kc);
            }
            for (int j0 = 0; j0 < n; j0 += SG_GEMM_NR) {
                const int cols = n - j0 < SG_GEMM_NR ? n - j0 : SG_GEMM_NR;
                const int nv = (cols + 15) / 16;
                const float *bp = panel[now];
                int64_t bs = SG_GEMM_NR;
                if (in_place && cols == SG_GEMM_NR) {
                    bp = b + (int64_t)k0 * ldb + j0;
                    bs = ldb;
                } else if (!ready) {
                    sg_gemm_pack_b(panel[now], b, tb, ldb, j0, cols, k0, kc);
                }
                /* the next panel (the next columns, else the next k-block's first) is packed
                   by this panel's blocks where op(b) = b and it is not read in place */
                const int64_t j_next = j0 + SG_GEMM_NR < n ? j0 + SG_GEMM_NR : 0;
                const int64_t k_next = j0 + SG_GEMM_NR < n ? k0 : k0 + SG_GEMM_KC;
                const int cols_next = n - j_next < SG_GEMM_NR ? (int)(n - j_next) : SG_GEMM_NR;
                const int kc_next = k - k_next < SG_GEMM_KC ? (int)(k - k_next) : SG_GEMM_KC;
                ready = !tb && k_next < k && !(in_place && cols_next == SG_GEMM_NR);
                sg_gemm_ahead ahead = {panel[now ^ 1], b, ldb, cols_next, kc_next, 0, 0};
                if (ready) ahead.src = b + k_next * ldb + j_next;
                for (int p = 0; p < panels; ++p) {
                    const int r0 = p * SG_GEMM_MR;
                    const int rows = mc - r0 < SG_GEMM_MR ? mc - r0 : SG_GEMM_MR;
                    const float *ap = apack + r0 * kc;
                    float *cp = c + (int64_t)(i0 + r0) * ldc + j0;
                    ahead.r0 = p * kc_next / panels;
                    ahead.r1 = (p + 1) * kc_next / panels;
                    const sg_gemm_ahead *next = ready ? &ahead : 0;
                    if (nv == 3) sg_gemm_block3(ap, bp, bs, kc, cp, ldc, rows, cols, alpha, bk, next);
                    else if (nv == 2) sg_gemm_block2(ap, bp, bs, kc, cp, ldc, rows, cols, alpha, bk, next);
                    else sg_gemm_block1(ap, bp, bs, kc, cp, ldc, rows, cols, alpha, bk, next);
                }
                if (ready) now ^= 1;
            }
        }
    }
}
#define SG_OWN_GEMM 1
#else
#define sg_sgemm scipy_cblas_sgemm
/* the same call as the library's c = a @ b^T */
#define sg_gemm_abt_dot(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) \
    scipy_cblas_sgemm(101, 111, 112, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)
#define SG_OWN_GEMM 0
#endif
