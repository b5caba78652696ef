/* The host's bf16 sums, header-only: the core's bf16 all-reduce
 * (lib/sum_spread.c) and the bf16 sum across processes (nn/dist_mpi.c, which
 * links only the public API) compile the same loops. Each element is
 * src[0] + src[1] + ... in f32, left to right, every term a bf16 widened
 * or an f32 rounded to bf16 first (lib/kernels/half_bits.h's steps, bit
 * for bit). */
#ifndef CHORUS_LIB_BF16_SUM_H
#define CHORUS_LIB_BF16_SUM_H

#include <stdint.h>
#include <string.h>

#include "kernels/half_bits.h"
#include "omp.h"

/* For the host's loops (the host backend, lib/sum_spread.c, nn/dist_mpi.c): a
 * function built twice, for AVX2 and for the baseline x86-64, the one for
 * the CPU picked when the library loads (GCC's target_clones, an ifunc):
 * for the loops that vectorise, whose baseline build has 4-byte lanes in
 * 16-byte registers. AVX2 without FMA, so that both builds round alike and
 * give the same bits. Elsewhere, one build; and one under
 * ThreadSanitizer, whose instrumented ifunc resolvers would run while the
 * library is relocated, before its runtime exists. */
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__) && \
    !defined(__SANITIZE_THREAD__)
#define CHI_CLONES __attribute__((target_clones("avx2", "default")))
/* The same with an AVX-512 build too, for loops on doubles (eight lanes
 * where AVX2 has four); AVX-512F without FMA rounds as the others do. */
#define CHI_CLONES_WIDE __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CHI_CLONES
#define CHI_CLONES_WIDE
#endif

/* Inlined into the caller whatever the optimisation level says, so that
 * its build (the AVX2 clone) compiles these loops. */
#if defined(__GNUC__)
#define CHI_INLINE static inline __attribute__((always_inline))
#else
#define CHI_INLINE static inline
#endif

static inline float chi_bf16_value(uint16_t h)
{
    uint32_t u = chk_bf16_to_f32(h);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t chi_bf16_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return chk_f32_to_bf16(u);
}

/* f rounded to bf16, as a float. */
static inline float chi_bf16_rounded(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = chk_f32_round_bf16(u);
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Elements per tile: its f32 sum stays in the L1 cache while every source
 * is added in and it goes out. */
#define CHI_BF16_TILE 512

/* acc[0..m) (=, or += when `add`) each source element widened (bf16) or
 * rounded (f32). Straight loops without branches: they vectorise. */
CHI_INLINE void chi_bf16_add_source(float *acc, const void *src, int is_bf16, int add,
                                       int64_t m)
{
    const uint16_t *h = src;
    const float *f = src;
    if (is_bf16 && !add) {
        CHI_OMP(omp simd)
        for (int64_t i = 0; i < m; i++)
            acc[i] = chi_bf16_value(h[i]);
    } else if (is_bf16) {
        CHI_OMP(omp simd)
        for (int64_t i = 0; i < m; i++)
            acc[i] += chi_bf16_value(h[i]);
    } else if (!add) {
        CHI_OMP(omp simd)
        for (int64_t i = 0; i < m; i++)
            acc[i] = chi_bf16_rounded(f[i]);
    } else {
        CHI_OMP(omp simd)
        for (int64_t i = 0; i < m; i++)
            acc[i] += chi_bf16_rounded(f[i]);
    }
}

/* Elements [lo, lo + len), tile by tile in one pass: every source (nsrc
 * >= 1; is_bf16[k] says its type) added left to right in f32, the sum
 * into t32, rounded to bf16 into t16 and, as f32, into every copy, while
 * the tile is in cache (each may be NULL or 0). A copy or t16 may be a
 * source: each tile is read whole before it is written. */
CHI_INLINE void chi_bf16_sum_range(int64_t lo, int64_t len, int nsrc,
                                      const void *const *src, const int *is_bf16, float *t32,
                                      uint16_t *t16, int ncopies, float *const *copies)
{
    float acc[CHI_BF16_TILE];
    for (int64_t at = lo; at < lo + len; at += CHI_BF16_TILE) {
        int64_t m = lo + len - at < CHI_BF16_TILE ? lo + len - at : CHI_BF16_TILE;
        for (int k = 0; k < nsrc; k++) {
            size_t bytes = is_bf16[k] ? sizeof(uint16_t) : sizeof(float);
            chi_bf16_add_source(acc, (const char *)src[k] + (size_t)at * bytes, is_bf16[k],
                                k > 0, m);
        }
        if (t32)
            memcpy(t32 + at, acc, (size_t)m * sizeof(float));
        if (t16) {
            uint16_t *h = t16 + at;
            CHI_OMP(omp simd)
            for (int64_t i = 0; i < m; i++)
                h[i] = chi_bf16_of(acc[i]);
        }
        if (ncopies == 0)
            continue;
        CHI_OMP(omp simd)
        for (int64_t i = 0; i < m; i++)
            acc[i] = chi_bf16_rounded(acc[i]);
        for (int c = 0; c < ncopies; c++)
            memcpy(copies[c] + at, acc, (size_t)m * sizeof(float));
    }
}

#endif
