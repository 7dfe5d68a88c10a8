/* shapegrad's batched float32 product (backends/c/sgemm_batch.h, chosen per product by
   batch_gemm.py): sg_sgemm_batch computes every product of an L.Contract batch in one call,
   c[bi] = alpha * op(a[bi]) @ op(b[bi]) + beta * c[bi], where product bi = bo * inner + bh
   starts bo * s_x + bh * is_x into each operand (a two-level strided batch: attention's
   head views). With split != 0 the products are shared across the calling OpenMP team (an
   orphaned work-sharing loop, dynamic, 1, nowait: the caller places barriers, as for the
   other team-split products); each product is computed whole by one thread, so the result
   does not depend on the team. Where the target has AVX-512F each product is computed by
   register blocks of MR rows x 16 * NV columns of c (NV <= 4 zmm; MR 8, or 6 when NV is 4;
   tails of 4, 2 and 1 rows; masked tail columns) that broadcast op(a) where it lies
   (no packing) and read op(b) from a KC x 64 panel on the stack, gathered per 64 columns
   (transposed by 16 x 16 register transposes when op(b) = b^T: sg_transpose16 of sgemm.h,
   which is included before this header). Each k-block of up to KC = 256 terms is summed in
   order into one accumulator and added to c (beta 0: c is not read; later blocks add), so
   results match the library to float32 GEMM tolerance, not bit for bit. Elsewhere each
   product is one call of the library's cblas_sgemm, as before. */
#if defined(__AVX512F__)
#define SG_BATCH_KC 256 /* the op(b) panel's depth; a longer sum is done in KC-term blocks */

/* c[:mr, :16*nv] (last zmm masked by `last`) = alpha * sum_p op(a)[r, p] op(b)[p, :] + beta c;
   op(a)[r, p] = a[r * lda + p] (ta 0) or a[p * lda + r] (ta 1); op(b)[p, :] at b + p * 64
   (the panel, zero past the last column) */
static inline __attribute__((always_inline)) void sg_batch_tile(
    const int mr, const int nv, const int ta, int kk, const float *restrict a, int64_t lda,
    const float *restrict b, __mmask16 last, float *restrict c, int64_t ldc, float alpha,
    float beta) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int r = 0; r < mr; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) acc[r][v] = _mm512_setzero_ps();
    for (int p = 0; p < kk; ++p) {
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) bv[v] = _mm512_load_ps(b + p * 64 + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < mr; ++r) {
            const __m512 av = _mm512_set1_ps(ta ? a[p * lda + r] : a[r * lda + p]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; ++v) acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 8
    for (int r = 0; r < mr; ++r)
#pragma GCC unroll 4
        for (int v = 0; v < nv; ++v) {
            const __mmask16 m = v == nv - 1 ? last : (__mmask16)0xffff;
            float *cr = c + r * ldc + 16 * v;
            __m512 x = alpha == 1.0f ? acc[r][v] : _mm512_mul_ps(va, acc[r][v]);
            if (beta != 0.0f) x = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m, cr), x);
            _mm512_mask_storeu_ps(cr, m, x);
        }
}

/* rows [0, m) of one 16 * nv column block: MR-row tiles, then tails of 4, 2, 1 rows
   (MR is at most 8, so they cover any rest) */
#define SG_BATCH_ROWS(NV, MR, TA)                                                              \
    do {                                                                                       \
        int i = 0;                                                                             \
        for (; i + (MR) <= m; i += (MR)) {                                                     \
            sg_batch_tile(MR, NV, TA, kk, a + i * a_row, lda, b, last, c + i * ldc, ldc,       \
                          alpha, beta);                                                        \
        }                                                                                      \
        if (i + 4 <= m) {                                                                      \
            sg_batch_tile(4, NV, TA, kk, a + i * a_row, lda, b, last, c + i * ldc, ldc,        \
                          alpha, beta);                                                        \
            i += 4;                                                                            \
        }                                                                                      \
        if (i + 2 <= m) {                                                                      \
            sg_batch_tile(2, NV, TA, kk, a + i * a_row, lda, b, last, c + i * ldc, ldc,        \
                          alpha, beta);                                                        \
            i += 2;                                                                            \
        }                                                                                      \
        if (i < m)                                                                             \
            sg_batch_tile(1, NV, TA, kk, a + i * a_row, lda, b, last, c + i * ldc, ldc,        \
                          alpha, beta);                                                        \
    } while (0)

/* c[:m, :cols] (+)= alpha * op(a)[:m, :kk] @ op(b)[:kk, :cols], cols <= 64, op(b)
   in the panel b (rows 64 apart) */
static void sg_batch_block(int ta, int m, int cols, int kk, float alpha, const float *a,
                           int64_t lda, const float *b, float beta, float *c, int64_t ldc) {
    const int nv = (cols + 15) / 16;
    const __mmask16 last = (__mmask16)(0xffffu >> (16 * nv - cols));
    const int64_t a_row = ta ? 1 : lda; /* op(a)[i + 1, 0] - op(a)[i, 0] */
    if (ta) {
        switch (nv) {
        case 1: SG_BATCH_ROWS(1, 8, 1); break;
        case 2: SG_BATCH_ROWS(2, 8, 1); break;
        case 3: SG_BATCH_ROWS(3, 8, 1); break;
        default: SG_BATCH_ROWS(4, 6, 1); break;
        }
    } else {
        switch (nv) {
        case 1: SG_BATCH_ROWS(1, 8, 0); break;
        case 2: SG_BATCH_ROWS(2, 8, 0); break;
        case 3: SG_BATCH_ROWS(3, 8, 0); break;
        default: SG_BATCH_ROWS(4, 6, 0); break;
        }
    }
}

/* dst[p * 64 + q] = b[(k0 + p) * ldb + j0 + q] for q < cols, p < kc: the rows of op(b) = b,
   gathered so that the tiles read one contiguous panel (its loads are issued together,
   where reading b's strided rows in the tiles waited on each: attention's head views of
   ``[b, t, 3, h, d]`` ran 25% slower in the step so) */
static void sg_batch_pack_b(float *restrict dst, const float *restrict b, int64_t ldb,
                            int64_t j0, int cols, int64_t k0, int kc) {
    for (int p = 0; p < kc; ++p)
        for (int c0 = 0; c0 < cols; c0 += 16) {
            const __mmask16 m = cols - c0 >= 16 ? (__mmask16)0xffff
                                                : (__mmask16)(0xffffu >> (16 - (cols - c0)));
            _mm512_store_ps(dst + p * 64 + c0,
                            _mm512_maskz_loadu_ps(m, b + (k0 + p) * ldb + j0 + c0));
        }
}

/* dst[p * 64 + q] = b[(j0 + q) * ldb + k0 + p] for q < cols, p < kc: op(b) = b^T */
static void sg_batch_pack_bt(float *restrict dst, const float *restrict b, int64_t ldb,
                             int64_t j0, int cols, int64_t k0, int kc) {
    for (int c0 = 0; c0 < cols; c0 += 16)
        for (int p0 = 0; p0 < kc; p0 += 16) {
            const int kr = kc - p0 < 16 ? kc - p0 : 16;
            const __mmask16 m = (__mmask16)(0xffffu >> (16 - kr));
            __m512 r[16];
#pragma GCC unroll 16
            for (int q = 0; q < 16; ++q)
                r[q] = c0 + q < cols ? _mm512_maskz_loadu_ps(m, b + (j0 + c0 + q) * ldb + k0 + p0)
                                     : _mm512_setzero_ps();
            sg_transpose16(r);
            for (int q = 0; q < kr; ++q) _mm512_store_ps(dst + (p0 + q) * 64 + c0, r[q]);
        }
}

static void sg_batch_one(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                         int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                         int64_t ldc) {
    if (k <= 0 || alpha == 0.0f) { /* as the library: c = beta * c (beta 0: c not read) */
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j)
                c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
        return;
    }
    float panel[SG_BATCH_KC * 64] __attribute__((aligned(64)));
    for (int j0 = 0; j0 < n; j0 += 64) {
        const int cols = n - j0 < 64 ? n - j0 : 64;
        for (int k0 = 0; k0 < k; k0 += SG_BATCH_KC) { /* later k-blocks add to c */
            const int kc = k - k0 < SG_BATCH_KC ? k - k0 : SG_BATCH_KC;
            const float bk = k0 == 0 ? beta : 1.0f;
            const float *ak = a + (ta ? k0 * lda : k0);
            if (tb)
                sg_batch_pack_bt(panel, b, ldb, j0, cols, k0, kc);
            else
                sg_batch_pack_b(panel, b, ldb, j0, cols, k0, kc);
            sg_batch_block(ta, m, cols, kc, alpha, ak, lda, panel, bk, c + j0, ldc);
        }
    }
}
#define SG_OWN_BATCH_GEMM 1
#else
static void sg_batch_one(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                         int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                         int64_t ldc) {
    scipy_cblas_sgemm(101, ta ? 112 : 111, tb ? 112 : 111, m, n, k, alpha, a, (int)lda, b,
                      (int)ldb, beta, c, (int)ldc);
}
#define SG_OWN_BATCH_GEMM 0
#endif

static void __attribute__((unused)) sg_sgemm_batch(
    int split, int ta, int tb, int m, int n, int k, float alpha, const float *a, int64_t lda,
    const float *b, int64_t ldb, float beta, float *c, int64_t ldc, int64_t batch,
    int64_t inner, int64_t sa, int64_t sb, int64_t sc, int64_t isa, int64_t isb, int64_t isc) {
    if (m <= 0 || n <= 0) return;
#define SG_BATCH_PRODUCT(bi)                                                                  \
    sg_batch_one(ta, tb, m, n, k, alpha, a + ((bi) / inner) * sa + ((bi) % inner) * isa, lda, \
                 b + ((bi) / inner) * sb + ((bi) % inner) * isb, ldb, beta,                   \
                 c + ((bi) / inner) * sc + ((bi) % inner) * isc, ldc)
    if (split) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1) nowait
#endif
        for (int64_t bi = 0; bi < batch; ++bi) SG_BATCH_PRODUCT(bi);
    } else {
        for (int64_t bi = 0; bi < batch; ++bi) SG_BATCH_PRODUCT(bi);
    }
#undef SG_BATCH_PRODUCT
}
