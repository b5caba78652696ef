/* The activations (ch_activation) and their derivatives, one element at a
 * time, for every backend: the host loops over them
 * (backends/host/elementwise.c), OpenCL work-items and CUDA threads call
 * them (elementwise.cl, elementwise.cu). In the C subset of
 * lib/kernels/prelude.h; the CH_ACT_* values come from chorus/ops.h in C
 * and CUDA and from the build options in OpenCL C (program.c).
 *
 * Error, relative to the exact function of the float input (tests/ref.c's
 * double reference; tests/test-ops.c holds every device to ACT_TOL):
 * - relu: exact.
 * - tanh, sigmoid and their derivatives: computed in chk_acc. Where that is
 *   double (C, CUDA, OpenCL with cl_khr_fp64), the float result is the
 *   double one rounded once: 1 ulp at most. On an OpenCL device without
 *   fp64 they are the float formulas, whose bound is the device's: OpenCL
 *   1.2 allows tanh 5 ulp, so tanh 5; sigmoid exp's 3, the addition's 0.5
 *   and a division's 2.5 (0.5 where -cl-fp32-correctly-rounded-divide-sqrt
 *   is on), so 6.
 * - gelu and its derivative: one float formula on every device, float
 *   erfc and exp with the corrections below, the same with or without
 *   fp64: 2.2 ulp over a sweep of [-9, 9] with glibc's erfcf and expf
 *   (tests/test-act-math.c), 3.2 seen with libmvec's vector ones (the
 *   host's AVX2 path), plus whatever a device's own erfc and exp lose
 *   beyond glibc's (OpenCL 1.2 allows erfc 16 ulp and exp 3; CUDA
 *   documents erfcf 4 and expf 2). PoCL and Intel's CPU runtime come to
 *   1.9 ulp in tests/test-ops.c. The one exception: the host with
 *   AVX-512 computes GELU by a faster formula of its own, one exponential
 *   and a polynomial (backends/host/elementwise.c), 3.8 ulp over a sweep
 *   of [-12.5, 12.5] (tests/test-ops.c).
 * - gelu_tanh (GELU's tanh approximation) and its derivative: computed in
 *   chk_acc from exp alone (below): where that is double, 1 ulp at most,
 *   like tanh. On an OpenCL device without fp64, the float formula: exp's
 *   3 ulp, plus, for x < 0, the rounding of u magnified 2|u| times by
 *   exp(-2|u|) (about 25 times at x = -6, where the result is 1e-11 of
 *   x), so tens of ulp there; such a device is not among those tested.
 * ulp here: the error relative to the result in units of 2^-23. */
#ifndef CHORUS_LIB_KERNELS_ACT_H
#define CHORUS_LIB_KERNELS_ACT_H

#ifndef __OPENCL_VERSION__
#include <chorus/ops.h>
#include "prelude.h"
#endif

#define CHK_SQRT1_2F 0.70710678118654752440f
/* sqrt(1/2) - 0.70703125, the part of sqrt(1/2) below its top 12 bits. */
#define CHK_SQRT1_2F_LO 7.553118654752440e-05f
#define CHK_INV_SQRT_2PIF 0.39894228040143267794f
#define CHK_TWO_OVER_SQRT_PIF 1.12837916709551257390f

/* GELU, x Phi(x) with Phi(x) = erfc(z) / 2 at z = -x / sqrt(2), and its
 * derivative Phi(x) + x phi(x). erfc rather than 1 + erf, so that large
 * negative x keeps its precision; and two corrections, because z and x^2
 * are rounded to float before erfc and exp see them, which costs 2 z^2
 * ulp of the result (50 at x = -9): erfc(z + dz) = erfc(z) - 2/sqrt(pi)
 * exp(-z^2) dz, with dz the rounding of z (x split into halves of 12 bits
 * whose products by a 12-bit sqrt(1/2) are exact), and exp(-x^2/2) times
 * 1 - lo/2, with lo the rounding of x^2 (Dekker's product). Each multiply
 * and add rounded on its own (prelude.h turns contraction off).
 *
 * A macro over the type T so that the host also runs it on GCC vectors of
 * floats with vector erfc and exp (backends/host/elementwise.c): the same
 * operators, the same formula. xc is x clamped to [-64, 64], beyond which
 * exp(-x^2/2) is 0 and the corrections are too. Sets e = erfc(z) and
 * gauss = exp(-x^2/2). */
/* clang-format off */
#define CHK_GELU_PIECES(T, x, xc, ERFC, EXP, e, gauss)                                       \
    do {                                                                                   \
        T z_ = -(x) * CHK_SQRT1_2F;                                                        \
        T c_ = (xc) * 4097.0f, xh_ = c_ - (c_ - (xc)), xl_ = (xc) - xh_;                   \
        T dz_ = ((-xh_ * 0.70703125f - z_) - xl_ * 0.70703125f) - (xc) * CHK_SQRT1_2F_LO;  \
        T sq_ = (xc) * (xc);                                                               \
        T lo_ = ((xh_ * xh_ - sq_) + 2.0f * xh_ * xl_) + xl_ * xl_;                        \
        T g_ = EXP(-0.5f * sq_);                                                           \
        (e) = ERFC(z_) - CHK_TWO_OVER_SQRT_PIF * g_ * dz_;                                 \
        (gauss) = g_ * (1.0f - 0.5f * lo_);                                                \
    } while (0)
/* clang-format on */

/* GELU and its derivative from CHK_GELU_PIECES' e and gauss. */
#define CHK_GELU_OF(x, e) (0.5f * (x) * (e))
/* clang-format off */
#define CHK_GELU_GRAD_OF(x, e, gauss) (0.5f * (e) + (x) * CHK_INV_SQRT_2PIF * (gauss))
/* clang-format on */

/* x clamped to [-64, 64] (a NaN stays NaN, and so does the result). */
CHK_FN float chk_gelu_clamp(float x)
{
    return x < -64.0f ? -64.0f : x > 64.0f ? 64.0f : x;
}

/* CHK_GELU_PIECES on a float. */
typedef struct chk_gelu_parts {
    float e, gauss;
} chk_gelu_parts;

CHK_FN chk_gelu_parts chk_gelu_parts_of(float x)
{
    float xc = chk_gelu_clamp(x);
    chk_gelu_parts r;
    CHK_GELU_PIECES(float, x, xc, CHK_ERFCF, CHK_EXPF, r.e, r.gauss);
    return r;
}

CHK_FN float chk_gelu(float x)
{
    return CHK_GELU_OF(x, chk_gelu_parts_of(x).e);
}

CHK_FN float chk_gelu_grad(float x)
{
    chk_gelu_parts r = chk_gelu_parts_of(x);
    return CHK_GELU_GRAD_OF(x, r.e, r.gauss);
}

/* A constant of chk_acc's precision: double where chk_acc is, float
 * otherwise (an OpenCL device without fp64 refuses a double literal). */
#if CHK_ACC_IS_DOUBLE
#define CHK_ACC_LIT(x) x
#else
#define CHK_ACC_LIT(x) x##f
#endif

/* GELU's tanh approximation, x (1 + tanh(u)) / 2 with u = sqrt(2 / pi)
 * (x + 0.044715 x^3) (GPT-2's; cuBLASLt's GELU epilogues compute it), as
 * x s(2u), s the logistic function (1 + tanh(u) = 2 s(2u)), and its
 * derivative s(2u) + x s(2u) s(-2u) 2u' with u' = sqrt(2 / pi) (1 + 3
 * 0.044715 x^2). Both from t = exp(-2|u|), which is at most 1 and never
 * overflows: s(2|u|) = 1 / (1 + t) and s(-2|u|) = t / (1 + t), so nothing
 * cancels (1 + tanh(u) in float is 0 from x = -5.2 down, where the result
 * is still 1e-8 of x, with only a few bits right well above that). In
 * chk_acc; u from x clamped to [-64, 64], beyond which t is 0 in float
 * and in double, so the results are x or -0 and the derivative 1 or 0
 * (and the derivative's x u' stays finite). */
#define CHK_SQRT_2_OVER_PI CHK_ACC_LIT(0.79788456080286535588)
#define CHK_GELU_TANH_C CHK_ACC_LIT(0.044715)

typedef struct chk_gelu_tanh_parts {
    chk_acc xc; /* x clamped */
    chk_acc s;  /* s(2u) */
    chk_acc sn; /* s(-2u) = 1 - s(2u) */
} chk_gelu_tanh_parts;

CHK_FN chk_gelu_tanh_parts chk_gelu_tanh_parts_of(float x)
{
    chk_gelu_tanh_parts r;
    r.xc = (chk_acc)chk_gelu_clamp(x);
    chk_acc u = CHK_SQRT_2_OVER_PI * (r.xc + CHK_GELU_TANH_C * (r.xc * r.xc * r.xc));
    chk_acc t = CHK_EXP((chk_acc)-2 * (u < (chk_acc)0 ? -u : u));
    chk_acc big = (chk_acc)1 / ((chk_acc)1 + t), small = t * big;
    /* u NaN: both NaN (t is) */
    r.s = u < (chk_acc)0 ? small : big;
    r.sn = u < (chk_acc)0 ? big : small;
    return r;
}

CHK_FN float chk_gelu_tanh(float x)
{
    return (float)((chk_acc)x * chk_gelu_tanh_parts_of(x).s);
}

/* dy gelu_tanh'(x), rounded once. */
CHK_FN float chk_gelu_tanh_grad(float dy, float x)
{
    chk_gelu_tanh_parts r = chk_gelu_tanh_parts_of(x);
    chk_acc du = (chk_acc)2 * CHK_SQRT_2_OVER_PI *
                 ((chk_acc)1 + (chk_acc)3 * CHK_GELU_TANH_C * (r.xc * r.xc));
    return (float)((chk_acc)dy * (r.s + r.xc * du * (r.s * r.sn)));
}

/* tanh and sigmoid in float alone: what chk_act uses where chk_acc is
 * float (bounds above), and what tests/test-half.c measures in C. */
CHK_FN float chk_tanh_f32(float x)
{
    return CHK_TANHF(x);
}

CHK_FN float chk_sigmoid_f32(float x)
{
    return 1.0f / (1.0f + CHK_EXPF(-x));
}

/* y = act(x). Integer literals cast to chk_acc: a bare 1.0 is a double,
 * which an OpenCL device without fp64 refuses. */
CHK_FN float chk_act(int act, float x)
{
    if (act == CH_ACT_RELU)
        return x > 0.0f ? x : 0.0f;
    if (act == CH_ACT_GELU)
        return chk_gelu(x);
    if (act == CH_ACT_GELU_TANH)
        return chk_gelu_tanh(x);
#if CHK_ACC_IS_DOUBLE
    if (act == CH_ACT_TANH)
        return (float)CHK_TANH((chk_acc)x);
    if (act == CH_ACT_SIGMOID)
        return (float)((chk_acc)1 / ((chk_acc)1 + CHK_EXP(-(chk_acc)x)));
#else
    if (act == CH_ACT_TANH)
        return chk_tanh_f32(x);
    if (act == CH_ACT_SIGMOID)
        return chk_sigmoid_f32(x);
#endif
    return NAN; /* ops.c refuses other values before a backend sees them */
}

/* 1 when act's derivative reads the forward input x, 0 when it reads the
 * output y: the other may be absent, and must not be read. */
CHK_FN int chk_act_reads_x(int act)
{
    return act == CH_ACT_RELU || act == CH_ACT_GELU || act == CH_ACT_GELU_TANH;
}

/* dx = dy act'(x), with x or y as chk_act_reads_x says (the other is
 * ignored). tanh' = (1 - y)(1 + y) rather than 1 - y^2, which cancels
 * near |y| = 1 in float. */
CHK_FN float chk_act_grad(int act, float dy, float x, float y)
{
    if (act == CH_ACT_RELU)
        return x > 0.0f ? dy : 0.0f;
    if (act == CH_ACT_GELU)
        return dy * chk_gelu_grad(x);
    if (act == CH_ACT_GELU_TANH)
        return chk_gelu_tanh_grad(dy, x);
    chk_acc d = (chk_acc)dy, t = (chk_acc)y;
    if (act == CH_ACT_TANH)
        return (float)(d * (((chk_acc)1 - t) * ((chk_acc)1 + t)));
    if (act == CH_ACT_SIGMOID)
        return (float)(d * (t * ((chk_acc)1 - t)));
    return NAN;
}

#endif
