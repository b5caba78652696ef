/* Host ops that touch each element on its own: fill, arithmetic,
 * activations, bias add, transposition and random numbers. An output is
 * either the very same array as an input (in place) or apart from it, so
 * element i only ever depends on element i: that makes `omp simd` valid
 * where the pointers cannot be restrict.
 * The activations and the half conversions are lib/kernels/' functions,
 * the very formulas the other backends compute; only the loops are this
 * file's. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <string.h>

#include "host.h"
#include "kernels/act.h"
#include "kernels/half_bits.h"
#include "philox.h"
#include "vec.h"

ch_status chi_host_fill(void *stream, ch_bmem y, int64_t n, uint32_t word)
{
    (void)stream;
    uint32_t *p = (uint32_t *)chi_host_f32(y);
    CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
    for (int64_t i = 0; i < n; i++)
        p[i] = word;
    return CH_OK;
}

ch_status chi_host_binary(void *stream, ch_binary_op op, int64_t n, ch_bmem y,
                          ch_bmem a, ch_bmem b)
{
    (void)stream;
    float *py = chi_host_f32(y);
    const float *pa = chi_host_f32(a), *pb = chi_host_f32(b);
    switch (op) {
    case CH_BIN_ADD:
        CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
        for (int64_t i = 0; i < n; i++)
            py[i] = pa[i] + pb[i];
        return CH_OK;
    case CH_BIN_SUB:
        CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
        for (int64_t i = 0; i < n; i++)
            py[i] = pa[i] - pb[i];
        return CH_OK;
    case CH_BIN_MUL:
        CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
        for (int64_t i = 0; i < n; i++)
            py[i] = pa[i] * pb[i];
        return CH_OK;
    case CH_BIN_COUNT:
        break;
    }
    return chi_unknown_enum("host", "binary", "ch_binary_op", (int)op, CH_BIN_COUNT);
}

ch_status chi_host_axpby(void *stream, int64_t n, ch_bmem y, float alpha, ch_bmem x,
                         float beta)
{
    (void)stream;
    float *py = chi_host_f32(y);
    const float *px = chi_host_f32(x);
    if (beta == 0.0f) {
        CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
        for (int64_t i = 0; i < n; i++)
            py[i] = alpha * px[i];
        return CH_OK;
    }
    CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
    for (int64_t i = 0; i < n; i++)
        py[i] = alpha * px[i] + beta * py[i];
    return CH_OK;
}

/* ---- activations ------------------------------------------------------------ */

/* The floats a parallel GELU's work-item takes: the vector loops run in
 * target functions of their own, called a span at a time from a parallel
 * loop outside them, because clang outlines an OpenMP loop's body into a
 * function that does not inherit its function's target attribute (AVX
 * there is an error); a multiple of 16, so every span but the last is
 * whole vectors, and each lane's arithmetic is the same wherever the
 * span starts. */
#define GELU_SPAN 1024

#if defined(HAVE_LIBMVEC) || defined(CHI_HAVE_AVX512)
/* span(y, dy, x, lo, hi) over [0, n) a span of GELU_SPAN at a time, the
 * spans shared among the threads. */
static void gelu_spans(void (*span)(float *, const float *, const float *, int64_t, int64_t),
                       float *y, const float *dy, const float *x, int64_t n)
{
    CHI_OMP(omp parallel for if (n > CHI_HOST_PAR_MIN / 16))
    for (int64_t lo = 0; lo < n; lo += GELU_SPAN)
        span(y, dy, x, lo, lo + GELU_SPAN < n ? lo + GELU_SPAN : n);
}
#endif

#ifdef HAVE_LIBMVEC
/* lib/kernels/act.h's GELU on glibc's vector erfcf and expf (libmvec,
 * x86-64) where the CPU has AVX2 but not AVX-512: the same
 * CHK_GELU_PIECES on eight floats in AVX2 registers (a tenth of the time
 * of the calls per element, which cost the GPT's MLP a tenth of its
 * step). fp-contract is off as everywhere here: it evaluates the
 * scalar expression, without fused multiply-adds. */
#include <immintrin.h>

__attribute__((target("avx2"))) v8f _ZGVdN8v_erfcf(v8f x);
__attribute__((target("avx2"))) v8f _ZGVdN8v_expf(v8f x);

#define CLAMP8(v)                                                                   \
    ((v8f)_mm256_min_ps(_mm256_max_ps((__m256)(v), _mm256_set1_ps(-64.0f)),          \
                        _mm256_set1_ps(64.0f)))

/* gelu8_span(y, dy, x, lo, hi): dy NULL, the forward y = gelu(x);
 * otherwise y = dy gelu'(x), eight floats at a time over [lo, hi), a
 * multiple of 8 long. */
__attribute__((target("avx2"))) static void gelu8_span(float *y, const float *dy, const float *x,
                                                       int64_t lo, int64_t hi)
{
    for (int64_t i = lo; i < hi; i += 8) {
        v8f v, d, e, gauss, out;
        memcpy(&v, x + i, sizeof v);
        v8f xc = CLAMP8(v);
        CHK_GELU_PIECES(v8f, v, xc, _ZGVdN8v_erfcf, _ZGVdN8v_expf, e, gauss);
        if (dy) {
            memcpy(&d, dy + i, sizeof d);
            out = d * CHK_GELU_GRAD_OF(v, e, gauss);
        } else {
            out = CHK_GELU_OF(v, e);
        }
        memcpy(y + i, &out, sizeof out);
    }
}

/* gelu8_span over the multiple of 8 below n; the tail of fewer than 8
 * goes through the float versions. */
static void gelu8(float *y, const float *dy, const float *x, int64_t n)
{
    int64_t body = n / 8 * 8;
    gelu_spans(gelu8_span, y, dy, x, body);
    for (int64_t i = body; i < n; i++)
        y[i] = dy ? dy[i] * chk_gelu_grad(x[i]) : chk_gelu(x[i]);
}
#endif

#ifdef CHI_HAVE_AVX512
/* GELU sixteen lanes at a time in AVX-512, a formula of the host's own
 * (faster than CHK_GELU_PIECES on libmvec's erfcf and expf, whose special
 * functions cost most of that). With a = |x|,
 * Phi(-a) = g F(a) / 2 where g = exp(-a^2 / 2) and F(a) = erfc(a / sqrt
 * 2) exp(a^2 / 2), smooth and slowly varying: so one exponential, shared
 * by the derivative's phi(x) = g / sqrt(2 pi), and F as a polynomial of
 * degree 10 in s = t - 0.375, t = 1 / (1 + 0.3 a) (docs/fit-gelu-tail.py
 * fitted it: 0.14 ulp over [0, 14.5] with its float coefficients). Then
 * e = 2 Phi(x) is g F for x <= 0 and 2 - g F above, and GELU and its
 * derivative are CHK_GELU_OF(x, e) and CHK_GELU_GRAD_OF(x, e, g). g comes
 * from the exact square a^2 = hi + lo (FMA): exp(-hi / 2) (1 - lo / 2);
 * t from a reciprocal estimate and one Newton step; s = t - 0.375 is
 * exact for t in [0.1875, 0.75] (t >= 0.187 over the fit). Error,
 * relative, in units of 2^-23 (tests/test-ops.c sweeps it): 3.8 over
 * [-12.5, 12.5] (largest near 0, where e = 2 - g F), 6.3 beyond, where
 * the results are near the smallest normal float and below. Each lane's
 * arithmetic is the same wherever the lane is: the same bits for any
 * length and thread count. */
#define GELU16_FN __attribute__((target("avx512f"), always_inline)) static inline

/* e = 2 Phi(x) and g = exp(-x^2 / 2) (above; the exponential is vec.h's
 * chi_exp16_fma to degree 7, its results below the normal floats kept).
 * a is capped at 15, past which g is 0 (a NaN x stays NaN through a,
 * min's second operand). */
GELU16_FN void gelu16_pieces(__m512 x, __m512 *e, __m512 *g)
{
    static const float f[] = {1.393579841e-01f,  5.611502528e-01f,  7.056633830e-01f,
                              6.818509102e-01f,  4.444057941e-01f,  1.030412018e-01f,
                              -1.234350428e-01f, -1.105563045e-01f, 4.003382474e-02f,
                              7.853440940e-02f,  -4.738715291e-02f};
    __m512 one = _mm512_set1_ps(1.0f);
    __m512 a = _mm512_min_ps(_mm512_set1_ps(15.0f), _mm512_abs_ps(x));
    __m512 hi = _mm512_mul_ps(a, a), lo = _mm512_fmsub_ps(a, a, hi);
    __m512 ex = chi_exp16_fma(_mm512_mul_ps(hi, _mm512_set1_ps(-0.5f)), 7, -104.0f);
    *g = _mm512_fnmadd_ps(_mm512_mul_ps(ex, _mm512_set1_ps(0.5f)), lo, ex);
    __m512 d = _mm512_fmadd_ps(a, _mm512_set1_ps(0.3f), one);
    __m512 t = _mm512_rcp14_ps(d);
    t = _mm512_fmadd_ps(t, _mm512_fnmadd_ps(d, t, one), t);
    __m512 s = _mm512_sub_ps(t, _mm512_set1_ps(0.375f));
    __m512 poly = _mm512_set1_ps(f[10]);
    for (int c = 9; c >= 0; c--)
        poly = _mm512_fmadd_ps(poly, s, _mm512_set1_ps(f[c]));
    __m512 tail = _mm512_mul_ps(*g, poly);
    __mmask16 above = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GT_OQ);
    *e = _mm512_mask_sub_ps(tail, above, _mm512_set1_ps(2.0f), tail);
}

/* gelu16_span(y, dy, x, lo, hi): dy NULL, the forward y = gelu(x);
 * otherwise y = dy gelu'(x), over [lo, hi). The last vector's missing
 * lanes are masked off. x and dy are asked for ahead (chi_host_ahead):
 * they are read cold (the backward reads the forward's input), faster
 * than the prefetchers follow. */
__attribute__((target("avx512f"))) static void gelu16_span(float *y, const float *dy,
                                                           const float *x, int64_t lo, int64_t hi)
{
    for (int64_t i = lo; i < hi; i += 16) {
        __mmask16 k = CHI_LANES16(hi - i);
        chi_host_ahead(x + i);
        if (dy)
            chi_host_ahead(dy + i);
        __m512 v = _mm512_maskz_loadu_ps(k, x + i), e, g, out;
        gelu16_pieces(v, &e, &g);
        /* act.h's formulas on the vectors (GCC's operators on __m512) */
        if (dy)
            out = _mm512_maskz_loadu_ps(k, dy + i) * CHK_GELU_GRAD_OF(v, e, g);
        else
            out = CHK_GELU_OF(v, e);
        _mm512_mask_storeu_ps(y + i, k, out);
    }
}

#endif

/* 1 when the GELU went eight or sixteen at a time. */
static int gelu_vector(float *y, const float *dy, const float *x, int64_t n)
{
#ifdef CHI_HAVE_AVX512
    if (__builtin_cpu_supports("avx512f")) {
        gelu_spans(gelu16_span, y, dy, x, n);
        return 1;
    }
#endif
#ifdef HAVE_LIBMVEC
    if (__builtin_cpu_supports("avx2")) {
        gelu8(y, dy, x, n);
        return 1;
    }
#endif
    (void)y, (void)dy, (void)x, (void)n;
    return 0;
}

ch_status chi_host_act_forward(void *stream, ch_activation act, int64_t n, ch_bmem y,
                               ch_bmem x)
{
    (void)stream;
    if (!chi_enum_known((int)act, CH_ACT_COUNT))
        return chi_unknown_enum("host", "act_forward", "ch_activation", (int)act, CH_ACT_COUNT);
    float *py = chi_host_f32(y);
    const float *px = chi_host_f32(x);
    if (act == CH_ACT_RELU) {
        /* The one activation cheap enough to be memory bound: its own loop
         * so that it vectorises. */
        CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
        for (int64_t i = 0; i < n; i++)
            py[i] = chk_act(CH_ACT_RELU, px[i]);
        return CH_OK;
    }
    if (act == CH_ACT_GELU && gelu_vector(py, NULL, px, n))
        return CH_OK;
    CHI_OMP(omp parallel for if (n > CHI_HOST_PAR_MIN / 16))
    for (int64_t i = 0; i < n; i++)
        py[i] = chk_act((int)act, px[i]);
    return CH_OK;
}

ch_status chi_host_act_backward(void *stream, ch_activation act, int64_t n, ch_bmem dx,
                                ch_bmem dy, ch_bmem x, ch_bmem y)
{
    (void)stream;
    if (!chi_enum_known((int)act, CH_ACT_COUNT))
        return chi_unknown_enum("host", "act_backward", "ch_activation", (int)act, CH_ACT_COUNT);
    float *pdx = chi_host_f32(dx);
    const float *pdy = chi_host_f32(dy);
    const float *px = x.ptr ? chi_host_f32(x) : NULL;
    const float *py = y.ptr ? chi_host_f32(y) : NULL;
    if (act == CH_ACT_RELU) {
        /* Memory bound like its forward: a loop of its own that vectorises. */
        CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
        for (int64_t i = 0; i < n; i++) {
            /* dy read unconditionally, so the select vectorises */
            pdx[i] = chk_act_grad(CH_ACT_RELU, pdy[i], px[i], 0.0f);
        }
        return CH_OK;
    }
    if (act == CH_ACT_GELU && gelu_vector(pdx, pdy, px, n))
        return CH_OK;
    /* x is read by relu and the gelus, y by tanh and sigmoid (the other may be
     * absent). */
    int reads_x = chk_act_reads_x((int)act);
    CHI_OMP(omp parallel for if (n > CHI_HOST_PAR_MIN / 16))
    for (int64_t i = 0; i < n; i++)
        pdx[i] = chk_act_grad((int)act, pdy[i], reads_x ? px[i] : 0.0f, reads_x ? 0.0f : py[i]);
    return CH_OK;
}

/* ---- bias and layout ------------------------------------------------------- */

ch_status chi_host_bias_add(void *stream, int64_t outer, int64_t c, int64_t inner,
                            ch_bmem y, ch_bmem x, ch_bmem bias)
{
    (void)stream;
    float *py = chi_host_f32(y);
    const float *px = chi_host_f32(x), *pb = chi_host_f32(bias);
    if (inner == 1) {
        /* A [outer, c] matrix plus a row vector (Linear): vectorise along
         * the row. */
        CHI_OMP(omp parallel for if (outer * c > CHI_HOST_PAR_MIN))
        for (int64_t o = 0; o < outer; o++) {
            float *yr = py + o * c;
            const float *xr = px + o * c;
            CHI_OMP(omp simd)
            for (int64_t ci = 0; ci < c; ci++)
                yr[ci] = xr[ci] + pb[ci];
        }
        return CH_OK;
    }
    CHI_OMP(omp parallel for collapse(2) if (outer * c * inner > CHI_HOST_PAR_MIN))
    for (int64_t o = 0; o < outer; o++)
        for (int64_t ci = 0; ci < c; ci++) {
            int64_t base = (o * c + ci) * inner;
            for (int64_t i = 0; i < inner; i++)
                py[base + i] = px[base + i] + pb[ci];
        }
    return CH_OK;
}

/* Elements are moved as 32-bit words (f32 or i32: the bits, untouched). */
ch_status chi_host_transpose01(void *stream, int64_t a, int64_t b, int64_t inner,
                               ch_bmem y, ch_bmem x)
{
    (void)stream;
    uint32_t *py = (uint32_t *)chi_host_f32(y);
    const uint32_t *px = (const uint32_t *)chi_host_f32(x);
    if (inner == 1) {
        /* A plain matrix transpose: element moves, not a memcpy call each. */
        CHI_OMP(omp parallel for if (a * b > CHI_HOST_PAR_MIN))
        for (int64_t j = 0; j < b; j++)
            for (int64_t i = 0; i < a; i++)
                py[j * a + i] = px[i * b + j];
        return CH_OK;
    }
    CHI_OMP(omp parallel for collapse(2) if (a * b * inner > CHI_HOST_PAR_MIN))
    for (int64_t j = 0; j < b; j++)
        for (int64_t i = 0; i < a; i++)
            memcpy(py + (j * a + i) * inner, px + (i * b + j) * inner,
                   (size_t)inner * sizeof *py);
    return CH_OK;
}

/* ---- random numbers ----------------------------------------------------- */

ch_status chi_host_rand(void *stream, ch_rand_kind kind, int64_t n, ch_bmem y,
                        uint64_t seed, uint64_t offset, float a, float b)
{
    (void)stream;
    float *py = chi_host_f32(y);
    switch (kind) {
    case CH_RAND_UNIFORM:
        CHI_OMP(omp parallel for if (n > CHI_HOST_PAR_MIN / 16))
        for (int64_t i = 0; i < n; i++)
            py[i] = chi_philox_uniform(seed, offset + (uint64_t)i, a, b);
        return CH_OK;
    case CH_RAND_NORMAL:
        CHI_OMP(omp parallel for if (n > CHI_HOST_PAR_MIN / 16))
        for (int64_t i = 0; i < n; i++)
            py[i] = chi_philox_normal(seed, offset + (uint64_t)i, a, b);
        return CH_OK;
    case CH_RAND_DROPOUT: {
        float keep = 1.0f / (1.0f - a);
        CHI_OMP(omp parallel for if (n > CHI_HOST_PAR_MIN / 16))
        for (int64_t i = 0; i < n; i++)
            py[i] = chi_philox_dropout(seed, offset + (uint64_t)i, a, keep);
        return CH_OK;
    }
    case CH_RAND_COUNT:
        break;
    }
    return chi_unknown_enum("host", "rand", "ch_rand_kind", (int)kind, CH_RAND_COUNT);
}

/* ---- f32 <-> bf16 and f16, on the bits (lib/kernels/half_bits.h) ---------------- */

/* The loop is built for AVX-512 and AVX2 as well as the baseline
 * (CHI_CLONES_WIDE: the baseline's SSE2 has no 32- to 16-bit narrowing,
 * which leaves its f32 to bf16 and f16 loops far slower than the
 * widening one); integer operations on the bits, so every build gives the same
 * bits. The threads take a contiguous share each, so the built loop runs
 * inside the parallel region (an OpenMP region's body is outlined before
 * the clones are made, and would run the baseline's). FAST, where not
 * NULL, is a loop that gives the same bits faster on this CPU. LOOP is
 * CONVERT_SIMD, or CONVERT_SCALAR for a conversion that does not
 * vectorise (f16 to f32: its subnormals are normalised in a loop, and
 * clang warns where omp simd asks for what it cannot do). */
#define CONVERT_SIMD() CHI_OMP(omp simd)
#define CONVERT_SCALAR()
#define HOST_CONVERT(name, to_t, from_t, fn, FAST, LOOP)                                           \
    CHI_CLONES_WIDE static void name##_run(to_t *py, const from_t *px, int64_t n)                  \
    {                                                                                              \
        LOOP()                                                                                     \
        for (int64_t i = 0; i < n; i++)                                                            \
            py[i] = fn(px[i]);                                                                     \
    }                                                                                              \
    ch_status name(void *stream, int64_t n, ch_bmem y, ch_bmem x)                                  \
    {                                                                                              \
        (void)stream;                                                                              \
        to_t *py = (to_t *)((char *)y.ptr + y.off);                                                \
        const from_t *px = (const from_t *)((const char *)x.ptr + x.off);                          \
        void (*run)(to_t *, const from_t *, int64_t) = FAST;                                       \
        if (!run)                                                                                  \
            run = name##_run;                                                                      \
        if (n <= CHI_HOST_PAR_MIN) {                                                               \
            run(py, px, n);                                                                        \
            return CH_OK;                                                                          \
        }                                                                                          \
        CHI_OMP(omp parallel)                                                                      \
        {                                                                                          \
            int nt = chi_omp_threads(), t = chi_omp_thread();                                      \
            int64_t lo = n * t / nt / 64 * 64, hi = t == nt - 1 ? n : n * (t + 1) / nt / 64 * 64;  \
            run(py + lo, px + lo, hi - lo);                                                        \
        }                                                                                          \
        return CH_OK;                                                                              \
    }

HOST_CONVERT(chi_host_f32_to_bf16, uint16_t, uint32_t, chk_f32_to_bf16,
             chi_host_round_loop(CH_BF16), CONVERT_SIMD)
HOST_CONVERT(chi_host_bf16_to_f32, uint32_t, uint16_t, chk_bf16_to_f32, NULL, CONVERT_SIMD)
HOST_CONVERT(chi_host_f32_to_f16, uint16_t, uint32_t, chk_f32_to_f16, chi_host_round_loop(CH_F16),
             CONVERT_SIMD)
HOST_CONVERT(chi_host_f16_to_f32, uint32_t, uint16_t, chk_f16_to_f32, NULL, CONVERT_SCALAR)

/* The one choice of the narrowing loops, for the slots above and for
 * Adam's rounding (optim.c). */
chi_host_round_fn *chi_host_round_loop(int half)
{
    if (half == CH_F16)
        return chi_host_f32_to_f16_run;
    chi_host_round_fn *fast = chi_host_f32_to_bf16_fast();
    return fast ? fast : chi_host_f32_to_bf16_run;
}
