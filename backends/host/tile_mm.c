/* The fused attention's tile products (attention.c) in registers.
 *
 * A 64 x 64 x 64 product is a few microseconds of arithmetic, and the
 * general GEMM's packing and dispatch around it cost as much again, more
 * than the fused attention's exponentials at a small GPT's shape. Here
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

/* The kernel, once for each instruction set: NAME(m, n, k, ...) walks C
 * by blocks of TM_ROWS rows (then single rows) and up to NV vectors of W
 * columns, or of R2 rows where the block is one or two vectors wide (R2
 * > TM_ROWS: as many accumulators as a full-width block has, so that the
 * FMAs' chains still hide their latency), or of R3 rows where it is
 * three or more (R3 > TM_ROWS: B's vectors loaded once for more rows);
 * NAME_block does one block of `rows` rows by nv vectors, the
 * last vector's columns those its mask `last` keeps. VT is the vector
 * type and MT the mask's; ZERO, SET1, LOAD (masked, 0 elsewhere), FMA, MUL,
 * ADD and STORE (masked) the operations; MASK(w) the mask of the first w
 * columns. The blocks' shapes are constants in each call, so that the
 * accumulators stay in registers. */
/* clang-format off */
#define DEFINE_TILE_KERNEL(NAME, TARGET, VT, MT, W, NV, R2, R3, ZERO, SET1, LOAD, FMA, MUL, ADD, STORE, MASK) \
    __attribute__((target(TARGET), always_inline)) static inline void NAME##_block(             \
        int rows, int nv, MT last, int64_t k, float alpha, const float *a, int64_t ars,            \
        int64_t acs, const float *b, int64_t ldb, float beta, float *c, int64_t ldc)               \
    {                                                                                              \
        const MT all = MASK(W);                                                                    \
        VT acc[R2 > R3 ? R2 : R3][NV];                                                   \
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)                                     \
            _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++)                                   \
                acc[r][v] = ZERO();                                                                \
        for (int64_t p = 0; p < k; p++) {                                                          \
            VT bv[NV];                                                                             \
            _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++)                                   \
                bv[v] = LOAD(b + p * ldb + W * v, v == nv - 1 ? last : all);                       \
            _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++) {                               \
                VT av = SET1(a[r * ars + p * acs]);                                                \
                _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++)                               \
                    acc[r][v] = FMA(av, bv[v], acc[r][v]);                                         \
            }                                                                                      \
        }                                                                                          \
        VT va = SET1(alpha), vb = SET1(beta);                                                      \
        _Pragma("GCC unroll 8") for (int r = 0; r < rows; r++)                                     \
            _Pragma("GCC unroll 4") for (int v = 0; v < nv; v++) {                                 \
                MT mk = v == nv - 1 ? last : all;                                                  \
                float *cp = c + r * ldc + W * v;                                                   \
                VT out = MUL(acc[r][v], va);                                                       \
                if (beta != 0.0f)                                                                  \
                    out = ADD(out, MUL(vb, LOAD(cp, mk)));                                         \
                STORE(cp, mk, out);                                                                \
            }                                                                                      \
    }                                                                                              \
                                                                                                   \
    __attribute__((target(TARGET))) static void NAME(int64_t m, int64_t n, int64_t k, float alpha, \
                                                     const float *a, int64_t ars, int64_t acs,     \
                                                     const float *b, int64_t ldb, float beta,      \
                                                     float *c, int64_t ldc)                        \
    {                                                                                              \
        for (int64_t j0 = 0; j0 < n; j0 += W * NV) {                                               \
            int64_t w = n - j0 < W * NV ? n - j0 : W * NV;                                         \
            int nv = (int)((w + W - 1) / W);                                                       \
            MT last = MASK((int)(w - W * (nv - 1)));                                               \
            for (int64_t i = 0; i < m;) {                                                          \
                int64_t left = m - i;                                                              \
                int wide = nv <= 2 && R2 > TM_ROWS && left >= R2;                                  \
                int tall = nv > 2 && R3 > TM_ROWS && left >= R3 && left != 2 * TM_ROWS &&          \
                           left != 2 * TM_ROWS + 1;                                                \
                int rows = wide ? R2 : tall ? R3 : left >= TM_ROWS ? TM_ROWS : 1;                  \
                const float *ai = a + i * ars;                                                     \
                float *cij = c + i * ldc + j0;                                                     \
                if (wide && nv == 1)                                                               \
                    NAME##_block(R2, 1, last, k, alpha, ai, ars, acs, b + j0, ldb, beta, cij, ldc); \
                else if (wide)                                                                     \
                    NAME##_block(R2, 2, last, k, alpha, ai, ars, acs, b + j0, ldb, beta, cij, ldc); \
                else if (tall && nv == 3)                                                          \
                    NAME##_block(R3, NV > 2 ? 3 : 2, last, k, alpha, ai, ars, acs, b + j0, ldb,    \
                                 beta, cij, ldc);                                                  \
                else if (tall)                                                                     \
                    NAME##_block(R3, NV, last, k, alpha, ai, ars, acs, b + j0, ldb, beta, cij, ldc); \
                else if (rows == TM_ROWS)                                                          \
                    switch (nv) {                                                                  \
                    case 1: NAME##_block(TM_ROWS, 1, last, k, alpha, ai, ars, acs, b + j0, ldb,    \
                                         beta, cij, ldc); break;                                   \
                    case 2: NAME##_block(TM_ROWS, 2, last, k, alpha, ai, ars, acs, b + j0, ldb,    \
                                         beta, cij, ldc); break;                                   \
                    case 3: NAME##_block(TM_ROWS, NV > 2 ? 3 : 2, last, k, alpha, ai, ars, acs,    \
                                         b + j0, ldb, beta, cij, ldc); break;                      \
                    default: NAME##_block(TM_ROWS, NV, last, k, alpha, ai, ars, acs, b + j0, ldb,  \
                                          beta, cij, ldc); break;                                  \
                    }                                                                              \
                else                                                                               \
                    switch (nv) {                                                                  \
                    case 1: NAME##_block(1, 1, last, k, alpha, ai, ars, acs, b + j0, ldb, beta,    \
                                         cij, ldc); break;                                         \
                    case 2: NAME##_block(1, 2, last, k, alpha, ai, ars, acs, b + j0, ldb, beta,    \
                                         cij, ldc); break;                                         \
                    case 3: NAME##_block(1, NV > 2 ? 3 : 2, last, k, alpha, ai, ars, acs, b + j0,  \
                                         ldb, beta, cij, ldc); break;                              \
                    default: NAME##_block(1, NV, last, k, alpha, ai, ars, acs, b + j0, ldb, beta,  \
                                          cij, ldc); break;                                        \
                    }                                                                              \
                i += rows;                                                                         \
            }                                                                                      \
        }                                                                                          \
    }
/* clang-format on */

/* AVX-512: 16 columns a vector, three or four vectors (up to 64 columns)
 * by six rows (24 accumulators, four of B and A's broadcast: 29 of the 32
 * registers), or up to two by eight. */
#define M512_MASK(w) ((__mmask16)((1u << (w)) - 1u))
#define M512_LOAD(p, mk) _mm512_maskz_loadu_ps(mk, p)
DEFINE_TILE_KERNEL(tm512, "avx512f", __m512, __mmask16, 16, 4, 8, 6, _mm512_setzero_ps,
                   _mm512_set1_ps, M512_LOAD, _mm512_fmadd_ps, _mm512_mul_ps, _mm512_add_ps,
                   _mm512_mask_storeu_ps, M512_MASK)

/* AVX2 with FMA: 8 columns a vector, two vectors by four rows: eight
 * accumulators of the 16 registers. A mask is a lane's -1 or 0. */
#define M256_MASK(w)                                                                               \
    _mm256_cmpgt_epi32(_mm256_set1_epi32(w), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
#define M256_LOAD(p, mk) _mm256_maskload_ps(p, mk)
DEFINE_TILE_KERNEL(tm256, "avx2,fma", __m256, __m256i, 8, 2, 4, TM_ROWS, _mm256_setzero_ps,
                   _mm256_set1_ps, M256_LOAD, _mm256_fmadd_ps, _mm256_mul_ps, _mm256_add_ps,
                   _mm256_maskstore_ps, M256_MASK)
#endif

#ifdef HAVE_TILE_KERNELS
/* dst[c, r] = src[r, c] by blocks of 8 x 8 in AVX registers (unpack the
 * row pairs, shuffle the quads, swap the 128-bit halves), the edges one
 * element at a time. */
__attribute__((target("avx"))) static void transpose_avx(int64_t rows, int64_t cols,
                                                         const float *src, int64_t lds, float *dst,
                                                         int64_t ldd)
{
    int64_t r8 = rows / 8 * 8, c8 = cols / 8 * 8;
    for (int64_t r = 0; r < r8; r += 8)
        for (int64_t c = 0; c < c8; c += 8) {
            __m256 x[8], u[8], q[8];
            for (int i = 0; i < 8; i++)
                x[i] = _mm256_loadu_ps(src + (r + i) * lds + c);
            for (int i = 0; i < 8; i += 2) {
                u[i] = _mm256_unpacklo_ps(x[i], x[i + 1]);
                u[i + 1] = _mm256_unpackhi_ps(x[i], x[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                q[i] = _mm256_shuffle_ps(u[i], u[i + 2], 0x44);
                q[i + 1] = _mm256_shuffle_ps(u[i], u[i + 2], 0xee);
                q[i + 2] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0x44);
                q[i + 3] = _mm256_shuffle_ps(u[i + 1], u[i + 3], 0xee);
            }
            for (int i = 0; i < 4; i++) {
                _mm256_storeu_ps(dst + (c + i) * ldd + r,
                                 _mm256_permute2f128_ps(q[i], q[i + 4], 0x20));
                _mm256_storeu_ps(dst + (c + i + 4) * ldd + r,
                                 _mm256_permute2f128_ps(q[i], q[i + 4], 0x31));
            }
        }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = r < r8 ? c8 : 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}
#endif

void chi_host_tile_transpose(int isa, int64_t rows, int64_t cols, const float *src, int64_t lds,
                             float *dst, int64_t ldd)
{
#ifdef HAVE_TILE_KERNELS
    if (isa == CHI_TILE_AVX512 || isa == CHI_TILE_AVX2) {
        transpose_avx(rows, cols, src, lds, dst, ldd);
        return;
    }
#endif
    (void)isa;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

#ifdef CHI_TEST_HOOKS
static int tile_preferred = CHI_TILE_AUTO;

void chi_host_tile_prefer(int isa)
{
    tile_preferred = isa;
}
#endif

int chi_host_tile_isa(int isa)
{
#ifdef CHI_TEST_HOOKS
    if (isa == CHI_TILE_AUTO && tile_preferred != CHI_TILE_AUTO)
        isa = tile_preferred;
#endif
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
