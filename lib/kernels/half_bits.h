/* The conversions between f32 and bf16 or f16 that every backend computes
 * (lib/backend.h, the f32_to_bf16 ... slots), on the bits: round to
 * nearest, ties to even; infinities, signed zeros and subnormals as IEEE
 * 754 says; a NaN narrowed becomes a quiet NaN with its sign and the top
 * bits of its payload, and widening is exact (a signalling NaN stays
 * signalling). The host loops over them (backends/host/elementwise.c, and
 * lib/bf16_sum.h's sums), CUDA threads and OpenCL work-items call them
 * (elementwise.cu, elementwise.cl): one copy of the steps, in the C subset
 * of lib/kernels/prelude.h. */
#ifndef CHORUS_LIB_KERNELS_HALF_BITS_H
#define CHORUS_LIB_KERNELS_HALF_BITS_H

#ifndef __OPENCL_VERSION__
#include "prelude.h"
#endif

/* Both results computed and one chosen, without a branch: the host's loops
 * over arrays of these vectorise. */
CHK_FN chk_u16 chk_f32_to_bf16(chk_u32 u)
{
    chk_u16 nan = (chk_u16)((u >> 16) | 0x0040u);
    chk_u16 rounded = (chk_u16)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

CHK_FN chk_u32 chk_bf16_to_f32(chk_u16 h)
{
    return (chk_u32)h << 16;
}

/* chk_bf16_to_f32(chk_f32_to_bf16(u)) in 32-bit lanes, without narrowing
 * and widening: u rounded to bf16's precision, kept as f32 bits (the
 * host's bf16 sums, lib/sum_spread.c). A finite u stays below 2^32 - 2^15,
 * so the addition cannot wrap. */
CHK_FN chk_u32 chk_f32_round_bf16(chk_u32 u)
{
    chk_u32 nan = (u & 0xffff0000u) | 0x00400000u;
    chk_u32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

CHK_FN chk_u16 chk_f32_to_f16(chk_u32 u)
{
    chk_u32 sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN */
        return (chk_u16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) /* 65520 and up round to infinity */
        return (chk_u16)(sign | 0x7c00u);
    if (a < 0x38800000u) {    /* below 2^-14: a subnormal f16, or zero */
        if (a <= 0x33000000u) /* up to 2^-25, the tie with the smallest: zero */
            return (chk_u16)sign;
        chk_u32 e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        chk_u32 h = m >> shift, rem = m & ((1u << shift) - 1u), tie = 1u << (shift - 1u);
        if (rem > tie || (rem == tie && (h & 1u)))
            h++;
        return (chk_u16)(sign | h);
    }
    chk_u32 h = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++;
    return (chk_u16)(sign | h);
}

CHK_FN chk_u32 chk_f16_to_f32(chk_u16 h16)
{
    /* The exponent field tested in place, not shifted down: from
     * (h >> 10) & 0x1f, clang makes a switch on h >> 10 truncated to 5
     * bits, which oclgrind 21.10 runs with the sign bit still above them
     * (it keeps narrow integers in whole bytes, unmasked), sending -0, the
     * negative subnormals and -inf and NaNs to the normal numbers' branch
     * (tests/oclgrind.sh). Here nothing is set above the field. */
    chk_u32 h = h16;
    chk_u32 sign = (h & 0x8000u) << 16, field = h & 0x7c00u, m = h & 0x3ffu;
    if (field == 0x7c00u)
        return sign | 0x7f800000u | (m << 13);
    if (field == 0u) {
        if (m == 0u)
            return sign;
        chk_u32 e = 113u;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        return sign | (e << 23) | ((m & 0x3ffu) << 13);
    }
    return sign | (((field >> 10) + 112u) << 23) | (m << 13);
}

#endif
