/* The host's vector code that several files share. First GCC's generic
 * vectors (SSE2, AVX, NEON or plain C, whatever the build and its clones
 * compile them to): the exponential of x <= 0, loads of a row's lanes,
 * the lanes' maximum, a row's maximum and the order in which the lanes
 * of a sum are added. Then, on x86 with GCC, AVX-512 pieces in
 * intrinsics: the same exponential sixteen lanes wide, a faster one with
 * FMA for code that only AVX-512 runs, lane masks and the AMX packers'
 * bf16 pairs. */
#ifndef CHI_HOST_VEC_H
#define CHI_HOST_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

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
 * into a mask vector lane by lane without AVX-512DQ); eight doubles. */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));
typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef double v8d __attribute__((vector_size(64)));

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

/* Four floats from x[0..count), `fill` in the lanes past count; nothing
 * past x[count - 1] is read (the tail of a row of a tensor). Inlined as
 * GCC chooses: forced, it changed the code of the softmax rows around it. */
static inline v4f chi_load4(const float *x, int64_t count, float fill)
{
    v4f v;
    if (count >= 4) {
        memcpy(&v, x, sizeof v);
        return v;
    }
    v = (v4f){0} + fill;
    for (int64_t l = 0; l < count; l++)
        v[l] = x[l];
    return v;
}

/* The eight floats at x, `fill` in the lanes from count on, which are
 * read and not used (a row padded to a multiple of eight: the fused
 * attention's tiles). */
CHI_INLINE v8f chi_load8(const float *x, int64_t count, float fill)
{
    const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    v8f v;
    memcpy(&v, x, sizeof v);
    v8i keep = lane < (int32_t)count;
    return (v8f)(((v8i)v & keep) | ((v8i)((v8f){0} + fill) & ~keep));
}

/* The larger of a and b in each lane: b's where b > a, so a NaN in b is
 * left out. */
#define CHI_DEFINE_MAX(NAME, VF, VI)                                                               \
    CHI_INLINE VF NAME(VF a, VF b)                                                                 \
    {                                                                                              \
        VI take_b = b > a;                                                                         \
        return (VF)(((VI)b & take_b) | ((VI)a & ~take_b));                                         \
    }
CHI_DEFINE_MAX(chi_max4, v4f, v4i)
CHI_DEFINE_MAX(chi_max8, v8f, v8i)

/* The largest of x[0..w), NaN left out (-inf where nothing is left):
 * LOAD's vectors folded in by MAX, then the lanes pairwise (lane l takes
 * lane l + h for h = half the lanes, ..., 1, one lane at a time: GCC's
 * __builtin_shuffle with lane indices made at run time has no clang
 * spelling). chi_row_max4 reads x[0..w) only; chi_row_max8 whole
 * vectors, as chi_load8 does. */
#define CHI_DEFINE_ROW_MAX(NAME, VF, LOAD, MAX)                                                    \
    CHI_INLINE float NAME(const float *x, int64_t w)                                               \
    {                                                                                              \
        const int lanes = sizeof(VF) / sizeof(float);                                              \
        VF m = (VF){0} - INFINITY;                                                                 \
        for (int64_t j = 0; j < w; j += lanes)                                                     \
            m = MAX(m, LOAD(x + j, w - j, -INFINITY));                                             \
        for (int h = lanes / 2; h > 0; h /= 2)                                                     \
            for (int l = 0; l < h; l++)                                                            \
                m[l] = m[l + h] > m[l] ? m[l + h] : m[l];                                          \
        return m[0];                                                                               \
    }
CHI_DEFINE_ROW_MAX(chi_row_max4, v4f, chi_load4, chi_max4)
CHI_DEFINE_ROW_MAX(chi_row_max8, v8f, chi_load8, chi_max8)

/* A long sum runs in CHI_LANES interleaved accumulators (lane l takes
 * the elements l, l + CHI_LANES, ... in increasing order, a tail of
 * fewer than CHI_LANES into the first lanes), so that its additions do
 * not wait on one another and vectorise; the lanes are then added
 * pairwise, lane l taking lane l + h for h = CHI_LANES / 2, ..., 1. The
 * same operations on every lane whatever the vectors' width: the same
 * bits in every build. */
#define CHI_LANES 8

/* The n lanes of v (an array or a vector; n a power of two) added
 * pairwise in place, lane l taking lane l + h for h = n / 2, ..., 1;
 * the total, v[0]. A macro, in place: as an inline function taking the
 * vector by value, it changed GCC 12's code for the loops around it. */
#define CHI_LANES_TOTAL(v, n)                                                                      \
    __extension__({                                                                                \
        for (int h_ = (n) / 2; h_ > 0; h_ /= 2)                                                    \
            for (int l_ = 0; l_ < h_; l_++)                                                        \
                (v)[l_] += (v)[l_ + h_];                                                           \
        (v)[0];                                                                                    \
    })

/* The same for CHI_LANES doubles in an array. */
static inline double chi_lanes_total(double *l)
{
    return CHI_LANES_TOTAL(l, CHI_LANES);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define CHI_HAVE_AVX512 1
#include <immintrin.h>

/* Inlined into the caller, which is built for AVX-512 (with more, for
 * the AMX kernels). */
#define CHI_AVX512_INLINE __attribute__((target("avx512f"), always_inline)) static inline

/* CHI_DEFINE_EXP_NONPOSITIVE's kernel sixteen lanes wide, in intrinsics
 * (GCC's generic 512-bit compares become lane-by-lane code without
 * AVX-512DQ): per lane the same operations, in the same order (no FMA),
 * so the same bits as the four- and eight-lane builds. */
CHI_AVX512_INLINE __m512 chi_exp16_nonpositive(__m512 x)
{
    __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-88.0f), _CMP_GE_OQ);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_mask_mov_ps(_mm512_set1_ps(-88.0f), in_range, x);
    __m512 round = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_sub_ps(
        _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), round), round);
    __m512 r =
        _mm512_sub_ps(_mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f))),
                      _mm512_mul_ps(n, _mm512_set1_ps(1.428606765330187e-06f)));
    static const float coef[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    for (int c = 0; c < 7; c++)
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(coef[c]));
    __m512i scale =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 e = _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_mul_ps(p, _mm512_castsi512_ps(scale)));
    return _mm512_mask_mov_ps(e, nan, x);
}

/* exp(x) for x <= 0 with FMA, for code that only AVX-512 runs: x = n ln 2
 * + r with |r| <= ln 2 / 2 (n by VRNDSCALEPS), e^r by its Taylor series
 * to r^degree, times 2^n by VSCALEFPS, which rounds once into the
 * subnormals; x below `lowest` is taken as lowest; NaN stays NaN. Not the
 * kernel above, which must give the AVX2 and baseline builds' bits (no
 * FMA there, nor VSCALEFPS) and flushes results below the normal floats
 * to 0. Its two callers, two settings: GELU's (elementwise.c: degree 7,
 * lowest -104, as its tail needs the results near the smallest normal
 * float and below) and the AMX attention's probabilities
 * (attention_amx.c: degree 6, relative error below 2e-7, as they are
 * rounded to bf16 next; lowest -100). */
CHI_AVX512_INLINE __m512 chi_exp16_fma(__m512 x, int degree, float lowest)
{
    static const float taylor[] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24,
                                   1.0f / 6,    0.5f,       1.0f,       1.0f};
    x = _mm512_max_ps(_mm512_set1_ps(lowest), x); /* NaN, the second operand, kept */
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f),
                                _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x));
    __m512 p = _mm512_set1_ps(taylor[7 - degree]);
    for (int c = 8 - degree; c < 8; c++)
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(taylor[c]));
    return _mm512_scalef_ps(p, n);
}

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
