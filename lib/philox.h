/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11) and the streams of include/chorus/ops.h built on it: the one
 * definition every backend compiles. The host backend and the tests include
 * it as C, the CUDA kernels as CUDA (the same functions on the device), and
 * the OpenCL module embeds this very file in its rand program's source
 * (backends/opencl/Makefile.mk), so it is also valid OpenCL C 1.2: the few
 * words that differ between the three are the macros below. */
#ifndef CHORUS_LIB_PHILOX_H
#define CHORUS_LIB_PHILOX_H

#ifdef __OPENCL_VERSION__
/* No fused multiply-adds: they would change the bits of a + b * u. */
#pragma OPENCL FP_CONTRACT OFF
typedef uint chi_philox_u32;
typedef ulong chi_philox_u64;
#define CHI_PHILOX_FN
#define CHI_PHILOX_SQRT sqrt
#define CHI_PHILOX_LOG log
#define CHI_PHILOX_COS cos
#else
#include <math.h>
#include <stdint.h>
typedef uint32_t chi_philox_u32;
typedef uint64_t chi_philox_u64;
#ifdef __CUDACC__
#define CHI_PHILOX_FN __host__ __device__ static inline
#else
#define CHI_PHILOX_FN static inline
#endif
#define CHI_PHILOX_SQRT sqrtf
#define CHI_PHILOX_LOG logf
#define CHI_PHILOX_COS cosf
#endif

#define CHI_PHILOX_M0 0xD2511F53u
#define CHI_PHILOX_M1 0xCD9E8D57u
#define CHI_PHILOX_W0 0x9E3779B9u
#define CHI_PHILOX_W1 0xBB67AE85u

CHI_PHILOX_FN void chi_philox4x32_10(chi_philox_u32 ctr[4], chi_philox_u32 k0, chi_philox_u32 k1)
{
    for (int r = 0; r < 10; r++) {
        chi_philox_u64 p0 = (chi_philox_u64)CHI_PHILOX_M0 * ctr[0];
        chi_philox_u64 p1 = (chi_philox_u64)CHI_PHILOX_M1 * ctr[2];
        chi_philox_u32 hi0 = (chi_philox_u32)(p0 >> 32), lo0 = (chi_philox_u32)p0;
        chi_philox_u32 hi1 = (chi_philox_u32)(p1 >> 32), lo1 = (chi_philox_u32)p1;
        chi_philox_u32 c0 = hi1 ^ ctr[1] ^ k0;
        chi_philox_u32 c2 = hi0 ^ ctr[3] ^ k1;
        ctr[0] = c0;
        ctr[1] = lo1;
        ctr[2] = c2;
        ctr[3] = lo0;
        k0 += CHI_PHILOX_W0;
        k1 += CHI_PHILOX_W1;
    }
}

/* The two words element `index` of a stream draws from: the counter
 * (index low, index high, 0, 0) under the key (seed low, seed high). */
CHI_PHILOX_FN void chi_philox_words(chi_philox_u64 seed, chi_philox_u64 index, chi_philox_u32 *w0,
                                  chi_philox_u32 *w1)
{
    chi_philox_u32 ctr[4] = {(chi_philox_u32)index, (chi_philox_u32)(index >> 32), 0u, 0u};
    chi_philox4x32_10(ctr, (chi_philox_u32)seed, (chi_philox_u32)(seed >> 32));
    *w0 = ctr[0];
    *w1 = ctr[1];
}

CHI_PHILOX_FN float chi_philox_unit(chi_philox_u32 w) /* [0, 1) */
{
    return (float)(w >> 8) * (1.0f / 16777216.0f);
}

/* ---- One element of each stream of ops.h, in float ----------------------- */

/* lo + (hi - lo) u: the same bits on every backend. */
CHI_PHILOX_FN float chi_philox_uniform(chi_philox_u64 seed, chi_philox_u64 index, float lo, float hi)
{
    chi_philox_u32 w0, w1;
    chi_philox_words(seed, index, &w0, &w1);
    return lo + (hi - lo) * chi_philox_unit(w0);
}

/* u >= p ? keep : 0, keep = 1 / (1 - p) computed once by the caller in
 * float: the same bits on every backend. */
CHI_PHILOX_FN float chi_philox_dropout(chi_philox_u64 seed, chi_philox_u64 index, float p,
                                     float keep)
{
    chi_philox_u32 w0, w1;
    chi_philox_words(seed, index, &w0, &w1);
    return chi_philox_unit(w0) >= p ? keep : 0.0f;
}

/* mean + std z, z = sqrt(-2 ln u1) cos(2 pi u2) with u1 in (0, 1] (never 0,
 * so the log is finite) and u2 in [0, 1): the same u1 and u2 everywhere,
 * but sqrt, log and cos are each device's own. */
CHI_PHILOX_FN float chi_philox_normal(chi_philox_u64 seed, chi_philox_u64 index, float mean,
                                    float std)
{
    chi_philox_u32 w0, w1;
    chi_philox_words(seed, index, &w0, &w1);
    float u1 = (float)((w0 >> 8) + 1u) * (1.0f / 16777216.0f);
    float u2 = chi_philox_unit(w1);
    float z = CHI_PHILOX_SQRT(-2.0f * CHI_PHILOX_LOG(u1)) *
              CHI_PHILOX_COS(6.28318530717958647692f * u2);
    return mean + std * z;
}

#endif
