/* The fused attention's tile products (attention.c) in registers.
 *
 * A 64 x 64 x 64 product is a few microseconds of arithmetic, and the
 * general GEMM's packing and dispatch around it cost as much again: the
 * host's fused attention spent more time in them than in its exponentials
 * (measured at a small GPT's shape, 64 by 64 tiles of head size 32). Here
 * a product is the plain loop over its depth with C's block in registers:
 * B's row p, up to 64 columns of it, in vectors, each of A's four rows'
 * element p broadcast and multiplied in with FMA. B is read along its
 * rows, A element by element at any strides, so a transposed A costs
 * nothing and a transposed B is copied first (attention.c does, into its
 * thread's tiles).
 *
 * Each element of C is one sum in increasing p, rounded at each FMA, then
 * times alpha, then plus beta C: the same bits whatever the rows and
 * columns around it, for one instruction set; the AVX-512 and AVX2 builds
 * give the same bits as each other (the same FMAs in the same order). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>

#include "host.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_TILE_KERNELS 1
#include <immintrin.h>
#endif

#ifdef HAVE_TILE_KERNELS
/* Rows of C per block. */
#define TM_ROWS 4

/* One block of AVX-512: `rows` rows of C by nv vectors of 16 columns, the
 * last vector's columns those in `last`. */
__attribute__((target("avx512f"), always_inline)) static inline void tm512_block(
    int rows, int nv, __mmask16 last, int64_t k, float alpha, const float *a, int64_t ars,
    int64_t acs, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    __m512 acc[TM_ROWS][4];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            acc[r][v] = _mm512_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m512 bv[4];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] =
                _mm512_maskz_loadu_ps(v == nv - 1 ? last : (__mmask16)0xffff, b + p * ldb + 16 * v);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            __m512 av = _mm512_set1_ps(a[r * ars + p * acs]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = _mm512_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            __mmask16 m = v == nv - 1 ? last : (__mmask16)0xffff;
            float *cp = c + r * ldc + 16 * v;
            __m512 out = _mm512_mul_ps(acc[r][v], va);
            if (beta != 0.0f)
                out = _mm512_add_ps(out, _mm512_mul_ps(vb, _mm512_maskz_loadu_ps(m, cp)));
            _mm512_mask_storeu_ps(cp, m, out);
        }
}

/* The block's shapes as constants, so that the accumulators stay in
 * registers. */
#define TM512_CASES(rows)                                                                          \
    switch (nv) {                                                                                  \
    case 1: tm512_block(rows, 1, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc); break;    \
    case 2: tm512_block(rows, 2, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc); break;    \
    case 3: tm512_block(rows, 3, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc); break;    \
    default: tm512_block(rows, 4, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc); break;   \
    }

__attribute__((target("avx512f"))) static void tm512(int64_t m, int64_t n, int64_t k, float alpha,
                                                     const float *a, int64_t ars, int64_t acs,
                                                     const float *b, int64_t ldb, float beta,
                                                     float *c, int64_t ldc)
{
    for (int64_t j0 = 0; j0 < n; j0 += 64) {
        int64_t w = n - j0 < 64 ? n - j0 : 64;
        int nv = (int)((w + 15) / 16);
        __mmask16 last = (__mmask16)((1u << (w - 16 * (nv - 1))) - 1u);
        const float *bj = b + j0;
        int64_t i = 0;
        for (; i + TM_ROWS <= m; i += TM_ROWS) {
            const float *ai = a + i * ars;
            float *cij = c + i * ldc + j0;
            TM512_CASES(TM_ROWS)
        }
        for (; i < m; i++) {
            const float *ai = a + i * ars;
            float *cij = c + i * ldc + j0;
            TM512_CASES(1)
        }
    }
}

/* The same in AVX2 with FMA: `rows` rows by nv vectors of 8 columns (up
 * to 16), the last vector's columns those `last` has set. */
__attribute__((target("avx2,fma"), always_inline)) static inline void tm256_block(
    int rows, int nv, __m256i last, int64_t k, float alpha, const float *a, int64_t ars,
    int64_t acs, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    __m256i all = _mm256_set1_epi32(-1);
    __m256 acc[TM_ROWS][2];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            acc[r][v] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k; p++) {
        __m256 bv[2];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++)
            bv[v] = _mm256_maskload_ps(b + p * ldb + 8 * v, v == nv - 1 ? last : all);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            __m256 av = _mm256_set1_ps(a[r * ars + p * acs]);
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++)
                acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
    __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            __m256i m = v == nv - 1 ? last : all;
            float *cp = c + r * ldc + 8 * v;
            __m256 out = _mm256_mul_ps(acc[r][v], va);
            if (beta != 0.0f)
                out = _mm256_add_ps(out, _mm256_mul_ps(vb, _mm256_maskload_ps(cp, m)));
            _mm256_maskstore_ps(cp, m, out);
        }
}

__attribute__((target("avx2,fma"))) static void tm256(int64_t m, int64_t n, int64_t k, float alpha,
                                                      const float *a, int64_t ars, int64_t acs,
                                                      const float *b, int64_t ldb, float beta,
                                                      float *c, int64_t ldc)
{
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        int64_t w = n - j0 < 16 ? n - j0 : 16;
        int nv = (int)((w + 7) / 8);
        int tail = (int)(w - 8 * (nv - 1));
        __m256i last =
            _mm256_cmpgt_epi32(_mm256_set1_epi32(tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const float *bj = b + j0;
        int64_t i = 0;
        for (; i + TM_ROWS <= m; i += TM_ROWS) {
            const float *ai = a + i * ars;
            float *cij = c + i * ldc + j0;
            if (nv == 1)
                tm256_block(TM_ROWS, 1, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc);
            else
                tm256_block(TM_ROWS, 2, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc);
        }
        for (; i < m; i++) {
            const float *ai = a + i * ars;
            float *cij = c + i * ldc + j0;
            if (nv == 1)
                tm256_block(1, 1, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc);
            else
                tm256_block(1, 2, last, k, alpha, ai, ars, acs, bj, ldb, beta, cij, ldc);
        }
    }
}
#endif

int chi_host_tile_isa(int isa)
{
#ifdef HAVE_TILE_KERNELS
    __builtin_cpu_init();
    int has512 = __builtin_cpu_supports("avx512f");
    int has256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (isa == CHI_TILE_AUTO)
        return has512 ? CHI_TILE_AVX512 : has256 ? CHI_TILE_AVX2 : CHI_TILE_NONE;
    if (isa == CHI_TILE_AVX512)
        return has512 ? isa : CHI_TILE_NONE;
    if (isa == CHI_TILE_AVX2)
        return has256 ? isa : CHI_TILE_NONE;
#else
    (void)isa;
#endif
    return CHI_TILE_NONE;
}

int chi_host_tile_mm(int isa, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t ars, int64_t acs, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc)
{
#ifdef HAVE_TILE_KERNELS
    if (isa == CHI_TILE_AVX512) {
        tm512(m, n, k, alpha, a, ars, acs, b, ldb, beta, c, ldc);
        return 1;
    }
    if (isa == CHI_TILE_AVX2) {
        tm256(m, n, k, alpha, a, ars, acs, b, ldb, beta, c, ldc);
        return 1;
    }
#else
    (void)m, (void)n, (void)k, (void)alpha, (void)a, (void)ars, (void)acs, (void)b, (void)ldb;
    (void)beta, (void)c, (void)ldc;
#endif
    (void)isa;
    return 0;
}
