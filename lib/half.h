/* The conversions between f32 and bf16 or f16 that every backend computes
 * (lib/backend.h, the f32_to_bf16 ... slots), on the bits: round to
 * nearest, ties to even; infinities, signed zeros and subnormals as IEEE
 * 754 says; a NaN narrowed becomes a quiet NaN with its sign and the top
 * bits of its payload, and widening is exact (a signalling NaN stays
 * signalling). The CUDA kernels (backends/cuda/elementwise.cu) call these
 * functions; the OpenCL kernels (backends/opencl/elementwise.cl) spell out
 * the same steps in OpenCL C. */
#ifndef CHORUS_LIB_HALF_H
#define CHORUS_LIB_HALF_H

#include <stdint.h>

#ifdef __CUDACC__
#define CHI_HALF_FN static inline __host__ __device__
#else
#define CHI_HALF_FN static inline
#endif

/* Both results computed and one chosen, without a branch: loops over
 * arrays of these vectorise. */
CHI_HALF_FN uint16_t chi_f32_to_bf16(uint32_t u)
{
    uint16_t nan = (uint16_t)((u >> 16) | 0x0040u);
    uint16_t rounded = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

CHI_HALF_FN uint32_t chi_bf16_to_f32(uint16_t h) { return (uint32_t)h << 16; }

/* chi_bf16_to_f32(chi_f32_to_bf16(u)) in 32-bit lanes, without narrowing
 * and widening: u rounded to bf16's precision, kept as f32 bits (the
 * host's bf16 sums, lib/sum_spread.c). A finite u stays below 2^32 - 2^15,
 * so the addition cannot wrap. */
CHI_HALF_FN uint32_t chi_f32_round_bf16(uint32_t u)
{
    uint32_t nan = (u & 0xffff0000u) | 0x00400000u;
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

CHI_HALF_FN uint16_t chi_f32_to_f16(uint32_t u)
{
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and up round to infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: a subnormal f16, or zero */
        if (a <= 0x33000000u) /* up to 2^-25, the tie with the smallest: zero */
            return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint32_t h = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (uint16_t)(sign | h);
}

CHI_HALF_FN uint32_t chi_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return sign | 0x7f800000u | (m << 13);
    if (e == 0) {
        if (m == 0)
            return sign;
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        return sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    return sign | ((e + 112u) << 23) | (m << 13);
}

#endif
