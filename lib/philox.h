/* Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
 * 3", SC'11): the reference for every backend's random numbers. The OpenCL
 * and CUDA kernels implement the same rounds; tests compare them with this. */
#ifndef CHORUS_LIB_PHILOX_H
#define CHORUS_LIB_PHILOX_H

#include <stdint.h>

/* The CUDA kernels call these same functions on the device. */
#ifdef __CUDACC__
#define CH_PHILOX_FN __host__ __device__ static inline
#else
#define CH_PHILOX_FN static inline
#endif

#define CH_PHILOX_M0 0xD2511F53u
#define CH_PHILOX_M1 0xCD9E8D57u
#define CH_PHILOX_W0 0x9E3779B9u
#define CH_PHILOX_W1 0xBB67AE85u

CH_PHILOX_FN void ch_philox4x32_10(uint32_t ctr[4], uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        uint64_t p0 = (uint64_t)CH_PHILOX_M0 * ctr[0];
        uint64_t p1 = (uint64_t)CH_PHILOX_M1 * ctr[2];
        uint32_t hi0 = (uint32_t)(p0 >> 32), lo0 = (uint32_t)p0;
        uint32_t hi1 = (uint32_t)(p1 >> 32), lo1 = (uint32_t)p1;
        uint32_t c0 = hi1 ^ ctr[1] ^ k0;
        uint32_t c2 = hi0 ^ ctr[3] ^ k1;
        ctr[0] = c0;
        ctr[1] = lo1;
        ctr[2] = c2;
        ctr[3] = lo0;
        k0 += CH_PHILOX_W0;
        k1 += CH_PHILOX_W1;
    }
}

/* The two words element `index` of a stream draws from. */
CH_PHILOX_FN void ch_philox_words(uint64_t seed, uint64_t index, uint32_t *w0,
                                   uint32_t *w1)
{
    uint32_t ctr[4] = {(uint32_t)index, (uint32_t)(index >> 32), 0u, 0u};
    ch_philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
    *w0 = ctr[0];
    *w1 = ctr[1];
}

CH_PHILOX_FN float ch_philox_unit(uint32_t w) /* [0, 1) */
{
    return (float)(w >> 8) * (1.0f / 16777216.0f);
}

#endif
