/* AVX-512 pieces that the fused attention's row passes (attention.c) and
 * the AMX packers (tile_amx.c) share; x86 with GCC only, after
 * <immintrin.h>. */
#ifndef CHI_HOST_LANES_H
#define CHI_HOST_LANES_H

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
