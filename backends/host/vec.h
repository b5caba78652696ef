/* The host's vector code that several files share. First GCC's generic
 * vectors (SSE2, AVX, NEON or plain C, whatever the build and its clones
 * compile them to) and the exponential of x <= 0 on them; then, on x86
 * with GCC, AVX-512 pieces in intrinsics (the fused attention's row
 * passes, the AMX packers). */
#ifndef CHI_HOST_VEC_H
#define CHI_HOST_VEC_H

#include <stdint.h>

#include "bf16_sum.h" /* CHI_INLINE */

/* A function that returns a 32-byte vector and is built without AVX
 * draws GCC's warning that such vectors are returned differently there.
 * The functions here are always inlined, into builds with AVX where it
 * matters, so it does not apply: off for the rest of every file that
 * includes this one. */
#pragma GCC diagnostic ignored "-Wpsabi"

/* Four floats, four i32 and four doubles at once; eight floats and eight
 * i32 (the fused attention's tiles: 256-bit vectors, whose compares give
 * lane masks with AVX2 and AVX-512 alike; GCC turns a 512-bit compare
 * into a mask vector lane by lane without AVX-512DQ). */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* exp(x) for x <= 0, a vector VF of floats at a time (VI: as many i32)
 * and without a call (a call to expf per element costs several times the
 * rest of the softmax). x = n ln 2 + r with |r| <= ln 2 / 2 (n rounded by
 * adding and subtracting 1.5 * 2^23; ln 2 split so that n ln2_hi is
 * exact), e^r by its Taylor series to r^7 (the next term is below 6e-9
 * relative), times 2^n through the exponent bits. Checked against exp in
 * double for every float in [-87.34, 0]: within 1.22 ulp. Below -87.34
 * the result would not be a normal float and is 0 (-inf included); NaN
 * stays NaN. Each lane's operations are the same whatever the width, so
 * four, eight and sixteen lanes give the same bits. */
/* clang-format off */
#define CHI_DEFINE_EXP_NONPOSITIVE(NAME, VF, VI)                                              \
    CHI_INLINE VF NAME(VF x)                                                                  \
    {                                                                                         \
        const float log2e = 1.44269504088896341f, round = 12582912.0f;                        \
        const float ln2_hi = 0.693145751953125f, ln2_lo = 1.428606765330187e-06f;            \
        VI in_range = x >= -88.0f, nan = x != x, tiny = x < -87.33654f;                       \
        /* Out of range (and NaN) inputs go through as -88: n stays an int. */                \
        VF xc = (VF)(((VI)x & in_range) | ((VI)((VF){0} - 88.0f) & ~in_range));              \
        VF n = (xc * log2e + round) - round;                                                  \
        VF r = (xc - n * ln2_hi) - n * ln2_lo;                                                \
        VF p = (VF){0} + 1.0f / 5040;                                                         \
        p = p * r + 1.0f / 720;                                                               \
        p = p * r + 1.0f / 120;                                                               \
        p = p * r + 1.0f / 24;                                                                \
        p = p * r + 1.0f / 6;                                                                 \
        p = p * r + 0.5f;                                                                     \
        p = p * r + 1.0f;                                                                     \
        p = p * r + 1.0f;                                                                     \
        VI scale = (__builtin_convertvector(n, VI) + 127) * (1 << 23);                        \
        VF e = p * (VF)scale;                                                                 \
        return (VF)(((VI)e & ~tiny & ~nan) | ((VI)x & nan));                                  \
    }
/* clang-format on */

CHI_DEFINE_EXP_NONPOSITIVE(chi_exp4_nonpositive, v4f, v4i)
CHI_DEFINE_EXP_NONPOSITIVE(chi_exp8_nonpositive, v8f, v8i)

#if defined(__x86_64__) && defined(__GNUC__)
#define CHI_HAVE_AVX512 1
#include <immintrin.h>

/* The first `count` of sixteen lanes (none for count <= 0, all from 16). */
#define CHI_LANES16(count)                                                                         \
    ((count) <= 0    ? (__mmask16)0                                                                \
     : (count) >= 16 ? (__mmask16)0xffff                                                           \
                     : (__mmask16)((1u << (count)) - 1u))

/* a and b (16 floats each) rounded to bf16 (VCVTNEPS2BF16) and
 * interleaved a0 b0 a1 b1 ...: a pair row of the AMX products' B layout. */
__attribute__((target("avx512f,avx512bw,avx512bf16"), always_inline)) static inline __m512i
chi_bf16_pair16(__m512 a, __m512 b)
{
    static const uint16_t mix[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                     8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(a)),
                                      (__m256i)_mm512_cvtneps_pbh(b), 1);
    return _mm512_permutexvar_epi16(_mm512_loadu_si512(mix), both);
}
#endif

#endif
