/* The fused attention's tile products in bf16 on AMX (attention_amx.c, in
 * mixed precision with CH_BF16).
 *
 * Sapphire Rapids and later run a 16 x 16 x 32 bf16 product, summed in
 * f32, per tile instruction: a tile product several times as fast as in
 * f32 FMA (tile_mm.c). The operands
 * are bf16: A row by row (its depth along a row), B in pairs of rows
 * ("VNNI": pair row p holds B[2p][j], B[2p + 1][j] side by side for each
 * column j), C f32. The packers here round f32 to bf16 into those
 * layouts, zeros around, with VCVTNEPS2BF16: to nearest, ties to even,
 * NaN kept, but subnormal floats to zero (which the tile products would
 * read as zero anyway), where ch_cast keeps them.
 *
 * Linux hands the tile registers to a process that asks for them
 * (arch_prctl ARCH_REQ_XCOMP_PERM); chi_host_amx_bf16 asks once and says
 * whether the products can run here. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "host.h"
#include "vec.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__) && __GNUC__ >= 11
#define HAVE_AMX_KERNELS 1
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef HAVE_AMX_KERNELS
#define AMX_TARGET "avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"

/* -1 not asked yet, 0 no, 1 yes */
static atomic_int amx_state = -1;
#ifdef CHI_TEST_HOOKS
static atomic_int amx_refused;
void chi_host_amx_prefer(int on)
{
    atomic_store(&amx_refused, !on);
}
#endif

static int amx_ask(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    int tiles = (d >> 24) & 1, bf16 = (d >> 22) & 1;
    if (!tiles || !bf16 || !__builtin_cpu_supports("avx512f") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl") ||
        !__builtin_cpu_supports("avx512bf16"))
        return 0;
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA: refused by kernels
     * before 5.16 and where the tile state is off; then no products here */
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
}

int chi_host_amx_bf16(void)
{
#ifdef CHI_TEST_HOOKS
    if (atomic_load(&amx_refused))
        return 0;
#endif
    int s = atomic_load(&amx_state);
    if (s < 0) {
        s = amx_ask();
        atomic_store(&amx_state, s);
    }
    return s;
}

/* Palette 1, the eight tiles 16 rows of 64 bytes. */
typedef struct amx_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_config;

__attribute__((target(AMX_TARGET))) void chi_host_amx_start(void)
{
    amx_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.rows[i] = 16;
        cfg.colsb[i] = 64;
    }
    /* not _tile_loadconfig: GCC 12's tells the compiler that it reads 8
     * bytes of the configuration, which then drops the stores to the rest */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

__attribute__((target(AMX_TARGET))) void chi_host_amx_stop(void)
{
    _tile_release();
}

/* C in blocks of 32 x 32 (tiles 0-3), A's two row tiles 4-5, B's two
 * column tiles 6-7, over the depth 32 at a time. */
__attribute__((target(AMX_TARGET))) void chi_host_amx_mm(int64_t m, int64_t n, int64_t k,
                                                         const uint16_t *a, int64_t lda,
                                                         const uint16_t *b, int64_t ldb, float *c,
                                                         int64_t ldc, int add)
{
    const int64_t sa = lda * 2, sb = ldb * 2, sc = ldc * 4;
    for (int64_t i = 0; i < m; i += 32)
        for (int64_t j = 0; j < n; j += 32) {
            float *c00 = c + i * ldc + j, *c10 = c00 + 16 * ldc;
            if (add) {
                _tile_loadd(0, c00, sc);
                _tile_loadd(1, c00 + 16, sc);
                _tile_loadd(2, c10, sc);
                _tile_loadd(3, c10 + 16, sc);
            } else {
                _tile_zero(0);
                _tile_zero(1);
                _tile_zero(2);
                _tile_zero(3);
            }
            for (int64_t p = 0; p < k; p += 32) {
                _tile_loadd(4, a + i * lda + p, sa);
                _tile_loadd(5, a + (i + 16) * lda + p, sa);
                _tile_loadd(6, b + p / 2 * ldb + 2 * j, sb);
                _tile_loadd(7, b + p / 2 * ldb + 2 * (j + 16), sb);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, c00, sc);
            _tile_stored(1, c00 + 16, sc);
            _tile_stored(2, c10, sc);
            _tile_stored(3, c10 + 16, sc);
        }
}

/* 16 floats (the first `w` of x, 0 after) rounded to bf16. */
__attribute__((target(AMX_TARGET), always_inline)) static inline __m256i amx_round16(const float *x,
                                                                                     int64_t w)
{
    __m512 v = _mm512_maskz_loadu_ps(CHI_LANES16(w), x);
    return (__m256i)_mm512_cvtneps_pbh(v);
}

__attribute__((target(AMX_TARGET))) void chi_host_bf16_rows(int64_t rows, int64_t cols,
                                                            const float *x, int64_t ldx,
                                                            uint16_t *y, int64_t ldy,
                                                            int64_t rows_pad, int64_t cols_pad)
{
    for (int64_t r = 0; r < rows_pad; r++) {
        uint16_t *out = y + r * ldy;
        if (r >= rows) {
            memset(out, 0, (size_t)cols_pad * sizeof *out);
            continue;
        }
        for (int64_t c = 0; c < cols_pad; c += 16) {
            int64_t w = c < cols ? cols - c : 0;
            __m256i h = w ? amx_round16(x + r * ldx + c, w) : _mm256_setzero_si256();
            int64_t keep = cols_pad - c < 16 ? cols_pad - c : 16;
            _mm256_mask_storeu_epi16(out + c, CHI_LANES16(keep), h);
        }
    }
}

__attribute__((target(AMX_TARGET))) void chi_host_bf16_pairs(int64_t rows, int64_t cols,
                                                             const float *x, int64_t ldx,
                                                             uint16_t *y, int64_t ldy,
                                                             int64_t rows_pad, int64_t cols_pad)
{
    for (int64_t r = 0; r < rows_pad; r += 2) {
        uint16_t *out = y + r / 2 * ldy;
        for (int64_t c = 0; c < cols_pad; c += 16) {
            int64_t w = c < cols ? cols - c : 0;
            /* rows past `rows` and columns past `cols`: zeros */
            __m512 lo = _mm512_maskz_loadu_ps(r < rows ? CHI_LANES16(w) : 0, x + r * ldx + c);
            __m512 hi =
                _mm512_maskz_loadu_ps(r + 1 < rows ? CHI_LANES16(w) : 0, x + (r + 1) * ldx + c);
            __m512i pairs = chi_bf16_pair16(lo, hi);
            int64_t keep = cols_pad - c < 16 ? cols_pad - c : 16;
            _mm512_mask_storeu_epi32(out + 2 * c, CHI_LANES16(keep), pairs);
        }
    }
}

/* dst[c * ldd + r] = src[r * lds + c] for 32-bit elements (floats, or
 * pairs of bf16: the shuffles move bits): blocks of 16 x 16 in AVX-512
 * registers (pairs of rows interleaved, then quads, then the 128-bit
 * lanes of four registers transposed), the edges one at a time. */
__attribute__((target(AMX_TARGET))) void chi_host_transpose32(int64_t rows, int64_t cols,
                                                              const void *src, int64_t lds,
                                                              void *dst, int64_t ldd)
{
    const uint32_t *x = src;
    uint32_t *y = dst;
    int64_t r16 = rows / 16 * 16, c16 = cols / 16 * 16;
    for (int64_t r = 0; r < r16; r += 16)
        for (int64_t c = 0; c < c16; c += 16) {
            /* u[g][j], lane L: column 4L + j of rows 4g .. 4g + 3 (a group
             * at a time: 16 registers live, no spills) */
            __m512i u[4][4];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const uint32_t *row = x + (r + 4 * g) * lds + c;
                __m512i a0 = _mm512_loadu_si512(row), a1 = _mm512_loadu_si512(row + lds),
                        a2 = _mm512_loadu_si512(row + 2 * lds),
                        a3 = _mm512_loadu_si512(row + 3 * lds);
                __m512i b0 = _mm512_unpacklo_epi32(a0, a1), b1 = _mm512_unpackhi_epi32(a0, a1),
                        b2 = _mm512_unpacklo_epi32(a2, a3), b3 = _mm512_unpackhi_epi32(a2, a3);
                u[g][0] = _mm512_unpacklo_epi64(b0, b2);
                u[g][1] = _mm512_unpackhi_epi64(b0, b2);
                u[g][2] = _mm512_unpacklo_epi64(b1, b3);
                u[g][3] = _mm512_unpackhi_epi64(b1, b3);
            }
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                __m512i v0 = _mm512_shuffle_i32x4(u[0][j], u[1][j], 0x44),
                        v1 = _mm512_shuffle_i32x4(u[0][j], u[1][j], 0xee),
                        v2 = _mm512_shuffle_i32x4(u[2][j], u[3][j], 0x44),
                        v3 = _mm512_shuffle_i32x4(u[2][j], u[3][j], 0xee);
                _mm512_storeu_si512(y + (c + j) * ldd + r, _mm512_shuffle_i32x4(v0, v2, 0x88));
                _mm512_storeu_si512(y + (c + 4 + j) * ldd + r, _mm512_shuffle_i32x4(v0, v2, 0xdd));
                _mm512_storeu_si512(y + (c + 8 + j) * ldd + r, _mm512_shuffle_i32x4(v1, v3, 0x88));
                _mm512_storeu_si512(y + (c + 12 + j) * ldd + r, _mm512_shuffle_i32x4(v1, v3, 0xdd));
            }
        }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = r < r16 ? c16 : 0; c < cols; c++)
            memcpy(y + c * ldd + r, x + r * lds + c, sizeof *y);
}

/* Rounded row by row into tmp [rows_pad, cols_pad], then its 32-bit
 * words (element pairs) transposed. */
__attribute__((target(AMX_TARGET))) void chi_host_bf16_pairs_t(int64_t rows, int64_t cols,
                                                               const float *x, int64_t ldx,
                                                               uint16_t *y, int64_t ldy,
                                                               int64_t rows_pad, int64_t cols_pad,
                                                               uint16_t *tmp)
{
    chi_host_bf16_rows(rows, cols, x, ldx, tmp, cols_pad, rows_pad, cols_pad);
    chi_host_transpose32(rows_pad, cols_pad / 2, tmp, cols_pad / 2, y, ldy / 2);
}

/* pairs_t into tmp, whose pair row p then splits into rows 2p (the low
 * halves) and 2p + 1 (the high); rows_pad a multiple of 32. */
__attribute__((target(AMX_TARGET))) void chi_host_bf16_trans(int64_t rows, int64_t cols,
                                                             const float *x, int64_t ldx,
                                                             uint16_t *y, int64_t ldy,
                                                             int64_t rows_pad, int64_t cols_pad,
                                                             uint16_t *tmp)
{
    uint16_t *pairs = tmp + rows_pad * cols_pad;
    chi_host_bf16_pairs_t(rows, cols, x, ldx, pairs, 2 * rows_pad, rows_pad, cols_pad, tmp);
    uint16_t even[32], odd[32];
    for (int i = 0; i < 32; i++) {
        even[i] = (uint16_t)(2 * i);
        odd[i] = (uint16_t)(2 * i + 1);
    }
    const __m512i ie = _mm512_loadu_si512(even), io = _mm512_loadu_si512(odd);
    for (int64_t p = 0; p < cols_pad / 2; p++) {
        const uint16_t *w = pairs + p * 2 * rows_pad;
        for (int64_t r = 0; r < rows_pad; r += 32) {
            __m512i a = _mm512_loadu_si512(w + 2 * r), b = _mm512_loadu_si512(w + 2 * r + 32);
            _mm512_storeu_si512(y + 2 * p * ldy + r, _mm512_permutex2var_epi16(a, ie, b));
            _mm512_storeu_si512(y + (2 * p + 1) * ldy + r, _mm512_permutex2var_epi16(a, io, b));
        }
    }
}

#else /* no AMX build */

int chi_host_amx_bf16(void)
{
    return 0;
}
#ifdef CHI_TEST_HOOKS
void chi_host_amx_prefer(int on)
{
    (void)on;
}
#endif
void chi_host_amx_start(void)
{
}
void chi_host_amx_stop(void)
{
}
void chi_host_amx_mm(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                     const uint16_t *b, int64_t ldb, float *c, int64_t ldc, int add)
{
    (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)c, (void)ldc,
        (void)add;
}
#define AMX_NO_PACK(name)                                                                          \
    void name(int64_t rows, int64_t cols, const float *x, int64_t ldx, uint16_t *y, int64_t ldy,   \
              int64_t rows_pad, int64_t cols_pad)                                                  \
    {                                                                                              \
        (void)rows, (void)cols, (void)x, (void)ldx, (void)y, (void)ldy, (void)rows_pad,            \
            (void)cols_pad;                                                                        \
    }
AMX_NO_PACK(chi_host_bf16_rows)
AMX_NO_PACK(chi_host_bf16_pairs)
#define AMX_NO_PACK_T(name)                                                                        \
    void name(int64_t rows, int64_t cols, const float *x, int64_t ldx, uint16_t *y, int64_t ldy,   \
              int64_t rows_pad, int64_t cols_pad, uint16_t *tmp)                                   \
    {                                                                                              \
        (void)rows, (void)cols, (void)x, (void)ldx, (void)y, (void)ldy, (void)rows_pad,            \
            (void)cols_pad, (void)tmp;                                                             \
    }
void chi_host_transpose32(int64_t rows, int64_t cols, const void *src, int64_t lds, void *dst,
                          int64_t ldd)
{
    (void)rows, (void)cols, (void)src, (void)lds, (void)dst, (void)ldd;
}
AMX_NO_PACK_T(chi_host_bf16_pairs_t)
AMX_NO_PACK_T(chi_host_bf16_trans)
#endif
