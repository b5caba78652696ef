/* The host's rounding of f32 to bf16 with AVX512-BF16's VCVTNEPS2BF16
 * (chi_host_f32_to_bf16 in elementwise.c takes it where the CPU has it):
 * the same bits as lib/kernels/half_bits.h's chk_f32_to_bf16, which the
 * plain loop and every other backend compute. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdint.h>
#include <string.h>

#include "host.h"
#include "kernels/half_bits.h"

#if defined(__x86_64__) && defined(__GNUC__) && __GNUC__ >= 11
#include <immintrin.h>

/* f32 to bf16 with AVX512-BF16's VCVTNEPS2BF16, sixteen at a time: to
 * nearest with ties to even and NaN quietened as chk_f32_to_bf16 does,
 * but a subnormal float to zero, so the lanes holding one (rare) are
 * done again by chk_f32_to_bf16. The same bits as the plain loop, and
 * faster than its AVX-512 build. */
__attribute__((target("avx512f,avx512bf16"))) static void cvtne_run(uint16_t *py,
                                                                    const uint32_t *px, int64_t n)
{
    const __m512i exponent = _mm512_set1_epi32(0x7f800000), mantissa = _mm512_set1_epi32(0x7fffff);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i u = _mm512_loadu_si512(px + i);
        __m256bh h = _mm512_cvtneps_pbh(_mm512_castsi512_ps(u));
        __m256i out;
        memcpy(&out, &h, sizeof out);
        _mm256_storeu_si256((__m256i *)(py + i), out);
        __mmask16 sub =
            _mm512_mask_test_epi32_mask(_mm512_testn_epi32_mask(u, exponent), u, mantissa);
        for (int k = 0; sub; k++, sub >>= 1)
            if (sub & 1)
                py[i + k] = chk_f32_to_bf16(px[i + k]);
    }
    for (; i < n; i++)
        py[i] = chk_f32_to_bf16(px[i]);
}
#define HAVE_CVTNE 1
#endif

chi_host_round_fn *chi_host_f32_to_bf16_fast(void)
{
#ifdef HAVE_CVTNE
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"))
        return cvtne_run;
#endif
    return NULL;
}
