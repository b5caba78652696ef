/* Every primitive op on every visible device against the double-precision
 * references of ref.c, on fresh random inputs. The host backend is checked
 * like any other. Where the backends share a formula (lib/kernels/: the
 * activations, the optimizers' steps, the random streams), each device's
 * result is also compared with the host backend's on the same inputs, to
 * the formula's stated bound. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"
#include "ref.h"
#include "stamp.h"
#include "tap.h"

/* Error bounds, relative to each element (ref_err), in units of f32's
 * epsilon, 2^-23 (what a step of one ulp costs at most):
 * - TOL_ROUND: the result of one to a few correctly rounded operations
 *   (arithmetic, bias, the optimizer updates);
 * - TOL_FN: a device's own exp, log, tanh and erfc (OpenCL 1.2 allows erfc
 *   16 ulp, tanh 5, exp and log 3);
 * - ACT_TOL: the activations and their derivatives, lib/kernels/act.h's
 *   formulas on every device: relu exact, tanh and sigmoid 1 ulp (in
 *   double), gelu 2.2 ulp with glibc's erfcf and expf (tests/test-act-math)
 *   and 3.2 measured here with libmvec's (the host's AVX2 path), 3.8 by
 *   the host's own AVX-512 formula (test_gelu_sweep), the rest of the 8
 *   for what a device's own erfc and exp lose beyond those;
 * - TOL_SUM: sums of up to a few thousand terms in another order than the
 *   reference's (GEMM, reductions, softmax), relative to the sum of |terms|.
 * Results that must not be rounded at all (copies, im2col, pooling, the
 * uniform and dropout streams) are compared bit for bit. */
#define ULP 1.1920928955078125e-07
#define TOL_ROUND (4 * ULP)
#define TOL_FN (64 * ULP)
#define ACT_TOL (8 * ULP)
#define TOL_SUM (64 * ULP)
/* Against the host backend's result on the same inputs (tc_vs_host), for
 * the ops whose formulas and order of sums every backend takes from
 * lib/kernels/ (the cross-entropy gradient element in chk_acc, double on
 * every device tested here, rounded once; col2im's and pooling's gathers
 * in index.h's order): the same bits. */
#define TOL_SAME 0.0

#define MAX_DEVICES 16

/* A reference that holds f32 values only (copies, selections), as f32 for a
 * bit for bit comparison. */
static float *narrow(tcase *c, const double *x, int64_t n)
{
    float *f = tc_floats(c, n);
    for (int64_t i = 0; i < n; i++)
        f[i] = (float)x[i];
    return f;
}

/* ---- Philox known answers (Random123's kat_vectors) ---------------------- */

static void philox_kat(const uint32_t in[4], uint32_t k0, uint32_t k1, const uint32_t want[4])
{
    uint32_t ctr[4] = {in[0], in[1], in[2], in[3]};
    chi_philox4x32_10(ctr, k0, k1);
    tap_ok(memcmp(ctr, want, sizeof ctr) == 0,
           "philox4x32-10 KAT ctr %08x %08x %08x %08x key %08x %08x: got %08x %08x %08x "
           "%08x, want %08x %08x %08x %08x",
           in[0], in[1], in[2], in[3], k0, k1, ctr[0], ctr[1], ctr[2], ctr[3], want[0],
           want[1], want[2], want[3]);
}

static void test_philox_kat(void)
{
    philox_kat((uint32_t[]){0, 0, 0, 0}, 0, 0,
               (uint32_t[]){0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
    philox_kat((uint32_t[]){0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, 0xffffffff,
               0xffffffff, (uint32_t[]){0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
    philox_kat((uint32_t[]){0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, 0xa4093822,
               0x299f31d0, (uint32_t[]){0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

/* ---- Data movement ------------------------------------------------------- */

static void test_fill(ch_device *dev, ch_dtype dtype, int ndim, const int64_t *shape,
                      double value)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "fill %s %s value %g", ch_dtype_name(dtype), s, value);
    int64_t n = ref_numel(ndim, shape);
    ch_tensor *y = tc_tensor(&c, dtype, ndim, shape, tc_random(&c, n, -9, 9));
    TC(&c, ch_fill(y, value));
    void *got = tc_fetch(&c, y, n);
    void *want = tc_alloc(&c, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        if (dtype == CH_F32)
            ((float *)want)[i] = (float)value;
        else
            ((int32_t *)want)[i] = (int32_t)value;
    }
    tc_end_words(&c, got, want, n, dtype == CH_F32);
}

static void test_copy(ch_device *dev, ch_dtype dtype, int ndim, const int64_t *shape)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "copy %s %s", ch_dtype_name(dtype), s);
    int64_t n = ref_numel(ndim, shape);
    float *x = tc_random(&c, n, -100, 100);
    ch_tensor *tx = tc_tensor(&c, dtype, ndim, shape, x);
    ch_tensor *ty = tc_tensor(&c, dtype, ndim, shape, NULL);
    TC(&c, ch_copy(ty, tx));
    tc_end_words(&c, tc_fetch(&c, ty, n), x, n, dtype == CH_F32);
}

static void test_transpose01(ch_device *dev, int ndim, const int64_t *shape)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "transpose01 %s", s);
    int64_t n = ref_numel(ndim, shape), inner = n / (shape[0] * shape[1]);
    int64_t yshape[CH_MAX_DIMS];
    memcpy(yshape, shape, (size_t)ndim * sizeof *shape);
    yshape[0] = shape[1];
    yshape[1] = shape[0];
    float *x = tc_random(&c, n, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, ndim, yshape, NULL);
    TC(&c, ch_transpose01(ty, tx));
    float *want = tc_floats(&c, n);
    ref_transpose01(want, shape[0], shape[1], inner, x);
    tc_end_words(&c, tc_fetch(&c, ty, n), want, n, 1);
}

static void test_data_movement(ch_device *dev)
{
    test_fill(dev, CH_F32, SHAPE(1), 0.0);
    test_fill(dev, CH_F32, SHAPE(17, 31), -2.5);
    test_fill(dev, CH_F32, SHAPE(3, 5, 7, 11), 1e30);
    test_fill(dev, CH_I32, SHAPE(1), -7);
    test_fill(dev, CH_I32, SHAPE(129, 33), 123456789);
    test_copy(dev, CH_F32, SHAPE(1));
    test_copy(dev, CH_F32, SHAPE(257, 129));
    test_copy(dev, CH_I32, SHAPE(3, 5, 7));
    test_transpose01(dev, SHAPE(1, 1));
    test_transpose01(dev, SHAPE(17, 31));
    test_transpose01(dev, SHAPE(33, 1));
    test_transpose01(dev, SHAPE(65, 129));
    test_transpose01(dev, SHAPE(5, 7, 3));
    test_transpose01(dev, SHAPE(4, 3, 2, 5));
}

/* ---- GEMM ---------------------------------------------------------------- */

static void test_gemm(ch_device *dev, int trans_a, int trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, float beta)
{
    tcase c;
    tc_begin(&c, dev, "gemm %c%c m %" PRId64 " n %" PRId64 " k %" PRId64 " alpha %g beta %g%s",
             trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, beta,
             beta == 0.0f ? " (c NaN before)" : "");
    float *a = tc_random(&c, m * k, -1, 1);
    float *b = tc_random(&c, k * n, -1, 1);
    float *c0 = tc_random(&c, m * n, -1, 1);
    for (int64_t i = 0; beta == 0.0f && i < m * n; i++)
        c0[i] = NAN;
    ch_tensor *ta = trans_a ? tc_tensor(&c, CH_F32, SHAPE(k, m), a)
                            : tc_tensor(&c, CH_F32, SHAPE(m, k), a);
    ch_tensor *tb = trans_b ? tc_tensor(&c, CH_F32, SHAPE(n, k), b)
                            : tc_tensor(&c, CH_F32, SHAPE(k, n), b);
    ch_tensor *tcc = tc_tensor(&c, CH_F32, SHAPE(m, n), c0);
    TC(&c, ch_gemm(tcc, trans_a, trans_b, alpha, ta, tb, beta));
    double *want = tc_doubles(&c, m * n), *mag = tc_doubles(&c, m * n);
    ref_gemm(want, trans_a, trans_b, m, n, k, alpha, a, b, beta, c0);
    ref_gemm(mag, trans_a, trans_b, m, n, k, fabsf(alpha), tc_abs(&c, a, m * k),
             tc_abs(&c, b, k * n), fabsf(beta), tc_abs(&c, c0, m * n));
    tc_end_err(&c, ref_err(tc_fetch(&c, tcc, m * n), want, mag, m * n), TOL_SUM);
}

static void test_gemms(ch_device *dev)
{
    static const int64_t sizes[][3] = {
        {1, 1, 1}, {17, 31, 33}, {65, 3, 129}, {7, 257, 13}, {127, 129, 65},
    };
    static const float ab[][2] = {{1, 0}, {0.5f, 1}, {-1.25f, 0.5f}, {2, 0}, {1, 1}};
    /* Small sizes: the last, two tiles of 64 each way, with a shorter k. */
    static const int64_t small_last[3] = {66, 65, 20};
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            const int64_t *sz = tc_small() && i == 4 ? small_last : sizes[i];
            test_gemm(dev, t >> 1, t & 1, sz[0], sz[1], sz[2], ab[i][0], ab[i][1]);
        }
}

/* ---- GEMM, bias and activation (ch_gemm_bias_act) -------------------------- */

/* The largest |act'| anywhere: how much an error of the activation's input
 * can move its output. */
static double act_lipschitz(ch_activation act)
{
    if (act == CH_ACT_GELU || act == CH_ACT_GELU_TANH)
        return 1.13; /* 1.129 at x = 1.5 */
    return act == CH_ACT_SIGMOID ? 0.25 : 1.0;
}

/* x (n floats) in `dt` on the case's device: an f32 tensor holding x, then
 * for a half dt, x rounded to it (the tensor returned) and the exact
 * values of the rounded x written back into x. */
static ch_tensor *half_input(tcase *c, ch_dtype dt, int ndim, const int64_t *shape, float *x,
                             int64_t n)
{
    ch_tensor *t32 = tc_tensor(c, CH_F32, ndim, shape, x);
    if (dt == CH_F32)
        return t32;
    ch_tensor *t = tc_tensor(c, dt, ndim, shape, NULL);
    TC(c, ch_cast(t, t32));
    TC(c, ch_cast(t32, t));
    tc_download(c, t32, x, n);
    return t;
}

/* t's n values as f32 (widened on the device where t is half). */
static float *values_f32(tcase *c, ch_tensor *t, int ndim, const int64_t *shape, int64_t n)
{
    if (!t || ch_tensor_dtype(t) == CH_F32)
        return tc_fetch(c, t, n);
    ch_tensor *w = tc_tensor(c, CH_F32, ndim, shape, NULL);
    TC(c, ch_cast(w, t));
    return tc_fetch(c, w, n);
}

/* ch_gemm_bias_act into c of `cd` (pre too, when asked for) with a and b
 * in `ab`, against a double reference on the same (rounded) inputs: z =
 * alpha op(a) op(b) + bias, want = act(z). pre must be within e_z = u
 * (|z| + |z - bias|) + TOL_SUM sum|terms| of z (the composition rounds a
 * half pre twice: the product, then its sum with the bias; fused, once),
 * and c within u |want| + ACT_TOL |want| + L e_z of want, u half an ulp of
 * the output's format (0 for f32), L act's largest slope: pre's error
 * carried through the activation, then the activation's own error and
 * c's rounding (on CUDA, cuBLASLt's GELU's own error besides: below).
 * The line reports the largest error in units of that bound. */
static void test_gemm_bias_act(ch_device *dev, ch_dtype ab, ch_dtype cd, ch_activation act,
                               int want_pre, int ta, int tb, int64_t m, int64_t n, int64_t k,
                               float alpha)
{
    tcase c;
    tc_begin(&c, dev,
             "gemm_bias_act %s %s x %s -> %s%s %c%c m %" PRId64 " n %" PRId64 " k %" PRId64
             " alpha %g (error / bound)",
             ref_act_name(act), ch_dtype_name(ab), ch_dtype_name(ab), ch_dtype_name(cd),
             want_pre ? " and pre" : "", ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha);
    float *a = tc_random(&c, m * k, -1, 1), *b = tc_random(&c, k * n, -1, 1);
    float *bias = tc_random(&c, n, -1, 1);
    int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n}, sc[2] = {m, n};
    ch_tensor *tA = half_input(&c, ab, 2, sa, a, m * k);
    ch_tensor *tB = half_input(&c, ab, 2, sb, b, k * n);
    ch_tensor *tbias = tc_tensor(&c, CH_F32, SHAPE(n), bias);
    ch_tensor *tcc = tc_tensor(&c, cd, 2, sc, NULL);
    ch_tensor *tpre = want_pre ? tc_tensor(&c, cd, 2, sc, NULL) : NULL;
    TC(&c, ch_gemm_bias_act(tcc, tpre, ta, tb, alpha, tA, tB, tbias, act));
    float *got = values_f32(&c, tcc, 2, sc, m * n);
    float *got_pre = want_pre ? values_f32(&c, tpre, 2, sc, m * n) : NULL;
    double *z = tc_doubles(&c, m * n), *mag = tc_doubles(&c, m * n);
    ref_gemm(z, ta, tb, m, n, k, alpha, a, b, 0.0, NULL);
    ref_gemm(mag, ta, tb, m, n, k, fabsf(alpha), tc_abs(&c, a, m * k), tc_abs(&c, b, k * n), 0.0,
             NULL);
    int mant = cd == CH_BF16 ? 7 : 10;
    double u = cd == CH_F32 ? 0.0 : ldexp(1.0, -(mant + 1)), L = act_lipschitz(act), worst = 0.0;
    /* CUDA's fused gelu_tanh is cuBLASLt's GELU epilogue, of a precision
     * NVIDIA does not state: allowed an approximate tanh's (PTX's
     * tanh.approx.f32, 2^-10.7 relative), times |z| / 2. */
    double lt =
        strncmp(ch_device_id(dev), "cuda", 4) == 0 && act == CH_ACT_GELU_TANH && ab != CH_F32
            ? ldexp(1.0, -11)
            : 0.0;
    for (int64_t i = 0; c.st == CH_OK && i < m * n; i++) {
        z[i] += bias[i % n];
        mag[i] += fabs(bias[i % n]);
        double want = ref_act(act, z[i]);
        /* pre's rounding: once fused, twice composed (ch_gemm_bias into
         * a half tensor rounds the product, then its sum with the bias) */
        double ez = u * (fabs(z[i]) + fabs(z[i] - bias[i % n])) + TOL_SUM * mag[i] + REF_TINY;
        double bound = u * fabs(want) + ACT_TOL * fabs(want) + L * ez + lt * fabs(z[i]);
        double r = fabs(got[i] - want) / bound;
        if (!(r <= worst))
            worst = r;
        if (want_pre && !(fabs(got_pre[i] - z[i]) / ez <= worst))
            worst = fabs(got_pre[i] - z[i]) / ez;
    }
    tc_end_err(&c, worst, 1.0);
}

static void test_gemm_bias_acts(ch_device *dev)
{
    static const ch_dtype fmts[] = {CH_F32, CH_BF16, CH_F16};
    for (int act = 0; act < CH_ACT_COUNT; act++)
        for (int f = 0; f < 3; f++) {
            /* x W^T + b, a Linear's forward, n a multiple of 8 (what
             * cuBLASLt's epilogue needs to keep pre), f32 c then c in the
             * inputs' format, pre or not */
            test_gemm_bias_act(dev, fmts[f], CH_F32, act, 1, 0, 1, 33, 64, 40, 1.0f);
            test_gemm_bias_act(dev, fmts[f], fmts[f], act, 0, 0, 1, 33, 64, 40, 1.0f);
            test_gemm_bias_act(dev, fmts[f], fmts[f], act, 1, 0, 1, 17, 48, 72, 0.5f);
            /* odd sizes, the other layouts */
            test_gemm_bias_act(dev, fmts[f], fmts[f], act, 1, 1, 0, 19, 29, 31, -1.25f);
            test_gemm_bias_act(dev, fmts[f], CH_F32, act, 0, 1, 1, 7, 13, 5, 2.0f);
        }
}

/* ---- Elementwise --------------------------------------------------------- */

typedef enum alias_mode { SEPARATE, Y_IS_A, Y_IS_B, A_IS_B } alias_mode;

/* The public call of each ch_binary_op. */
static ch_status run_binary(tcase *c, ch_binary_op op, ch_tensor *y, const ch_tensor *a,
                            const ch_tensor *b)
{
    switch (op) {
    case CH_BIN_ADD: return ch_add(y, a, b);
    case CH_BIN_SUB: return ch_sub(y, a, b);
    case CH_BIN_MUL: return ch_mul(y, a, b);
    case CH_BIN_COUNT: break;
    }
    tc_fail(c, "no public call for ch_binary_op %d", (int)op);
    return CH_OK;
}

static void test_binary(ch_device *dev, ch_binary_op op, int ndim, const int64_t *shape,
                        alias_mode mode)
{
    static const char *modes[] = {"", " in place y=a", " in place y=b", " a=b"};
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "%s %s%s", ref_binary_name(op), s, modes[mode]);
    int64_t n = ref_numel(ndim, shape);
    float *a = tc_random(&c, n, -2, 2);
    float *b = mode == A_IS_B ? a : tc_random(&c, n, -2, 2);
    ch_tensor *ta = tc_tensor(&c, CH_F32, ndim, shape, a);
    ch_tensor *tb = mode == A_IS_B ? ta : tc_tensor(&c, CH_F32, ndim, shape, b);
    ch_tensor *ty = mode == Y_IS_A ? ta : mode == Y_IS_B ? tb
                                        : tc_tensor(&c, CH_F32, ndim, shape, NULL);
    TC(&c, run_binary(&c, op, ty, ta, tb));
    double *want = tc_doubles(&c, n);
    ref_binary(want, op, n, a, b);
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, n), want, NULL, n), TOL_ROUND);
}

static void test_scale(ch_device *dev, int64_t n, float alpha, int in_place)
{
    tcase c;
    tc_begin(&c, dev, "scale n %" PRId64 " alpha %g%s", n, alpha, in_place ? " in place" : "");
    float *x = tc_random(&c, n, -3, 3);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n), x);
    ch_tensor *ty = in_place ? tx : tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_scale(ty, tx, alpha));
    double *want = tc_doubles(&c, n);
    ref_axpby(want, n, alpha, x, 0.0, NULL);
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, n), want, NULL, n), TOL_ROUND);
}

static void test_axpy(ch_device *dev, int64_t n, float alpha, int in_place)
{
    tcase c;
    tc_begin(&c, dev, "axpy n %" PRId64 " alpha %g%s", n, alpha, in_place ? " x=y" : "");
    float *x = tc_random(&c, n, -3, 3);
    float *y0 = in_place ? x : tc_random(&c, n, -3, 3);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n), y0);
    ch_tensor *tx = in_place ? ty : tc_tensor(&c, CH_F32, SHAPE(n), x);
    TC(&c, ch_axpy(ty, alpha, tx));
    double *want = tc_doubles(&c, n), *mag = tc_doubles(&c, n);
    ref_axpby(want, n, alpha, x, 1.0, y0);
    ref_axpby(mag, n, fabsf(alpha), tc_abs(&c, x, n), 1.0, tc_abs(&c, y0, n));
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, n), want, mag, n), TOL_ROUND);
}

static void test_elementwise(ch_device *dev)
{
    for (int op = 0; op < CH_BIN_COUNT; op++) {
        test_binary(dev, op, SHAPE(1), SEPARATE);
        test_binary(dev, op, SHAPE(17), SEPARATE);
        test_binary(dev, op, SHAPE(31, 33), SEPARATE);
        test_binary(dev, op, SHAPE(3, 5, 7, 129), SEPARATE);
        test_binary(dev, op, SHAPE(257), Y_IS_A);
        test_binary(dev, op, SHAPE(65), Y_IS_B);
        test_binary(dev, op, SHAPE(127), A_IS_B);
    }
    test_scale(dev, 1, -1.5f, 0);
    test_scale(dev, 4099, 0.3f, 0);
    test_scale(dev, 129, 0.0f, 0);
    test_scale(dev, 257, -2.0f, 1);
    test_axpy(dev, 1, 0.75f, 0);
    test_axpy(dev, 4099, -1.25f, 0);
    test_axpy(dev, 65, 0.5f, 1);
}

/* ---- Activations --------------------------------------------------------- */

static void test_act_forward(ch_device *dev, ch_activation act, int64_t n, int in_place,
                             float range, double tol)
{
    tcase c;
    tc_begin(&c, dev, "%s forward n %" PRId64 "%s x in [-%g, %g)", ref_act_name(act), n,
             in_place ? " in place" : "", range, range);
    float *x = tc_random(&c, n, -range, range);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n), x);
    ch_tensor *ty = in_place ? tx : tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_activation_forward(ty, tx, act));
    double *want = tc_doubles(&c, n);
    ref_act_forward(want, act, n, x);
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, n), want, NULL, n), tol);
}

/* relu and gelu get x only, tanh and sigmoid y only: ops.h lets the
 * unused one be NULL. */
static void test_act_backward(ch_device *dev, ch_activation act, int64_t n, float range,
                              double tol)
{
    tcase c;
    int reads_x = ref_act_reads_x(act);
    tc_begin(&c, dev, "%s backward n %" PRId64 " (%s NULL) x in [-%g, %g)", ref_act_name(act),
             n, reads_x ? "y" : "x", range, range);
    float *x = tc_random(&c, n, -range, range);
    float *y = tc_floats(&c, n);
    float *dy = tc_random(&c, n, -2, 2);
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)ref_act(act, x[i]);
    ch_tensor *tx = reads_x ? tc_tensor(&c, CH_F32, SHAPE(n), x) : NULL;
    ch_tensor *ty = reads_x ? NULL : tc_tensor(&c, CH_F32, SHAPE(n), y);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_activation_backward(tdx, tdy, tx, ty, act));
    double *want = tc_doubles(&c, n), *mag = tc_doubles(&c, n);
    ref_act_backward(want, act, n, dy, reads_x ? x : NULL, reads_x ? NULL : y);
    ref_act_backward_mag(mag, act, n, dy, reads_x ? x : NULL, reads_x ? NULL : y);
    tc_end_err(&c, ref_err(tc_fetch(&c, tdx, n), want, mag, n), tol);
}

/* Every device to the same ACT_TOL, over [-6, 6) and for GELU over
 * [-9, 9) too, where x^2 is large: erfcf(-x / sqrt(2)) there loses 2 z^2
 * ulp (up to 81) to the rounding of z unless corrected, as
 * lib/kernels/act.h does on every backend. */
static void test_activations(ch_device *dev)
{
    for (int act = 0; act < CH_ACT_COUNT; act++) {
        test_act_forward(dev, act, 1, 0, 6, ACT_TOL);
        test_act_forward(dev, act, 4099, 0, 6, ACT_TOL);
        test_act_forward(dev, act, 129, 1, 6, ACT_TOL);
        test_act_backward(dev, act, 1, 6, ACT_TOL);
        test_act_backward(dev, act, 4099, 6, ACT_TOL);
    }
    test_act_forward(dev, CH_ACT_GELU, 4099, 0, 9, ACT_TOL);
    test_act_backward(dev, CH_ACT_GELU, 4099, 9, ACT_TOL);
}

/* The host's GELU and its derivative over a sweep of the floats in [-16,
 * 16] (every 2048th, both signs: a million), as
 * backends/host/elementwise.c states its error: with AVX-512, its own
 * formula, 4 ulp within [-12.5, 12.5] (3.8 measured); elsewhere
 * libmvec's or glibc's functions through lib/kernels/act.h. Everywhere
 * ACT_TOL, out to 16 (results below REF_TINY are held to it absolutely). */
static void test_gelu_sweep(ch_device *host, float limit, double tol)
{
    tcase c;
    tc_begin(&c, host, "gelu forward and backward over the floats in [-%g, %g] (every 2048th)",
             limit, limit);
    int64_t half = 0;
    while (tap_float_of((uint32_t)half * 2048u) <= limit)
        half++;
    int64_t n = 2 * half;
    float *x = tc_floats(&c, n), *dy = tc_floats(&c, n);
    for (int64_t i = 0; i < half; i++) {
        x[2 * i] = tap_float_of((uint32_t)i * 2048u);
        x[2 * i + 1] = -x[2 * i];
        dy[2 * i] = dy[2 * i + 1] = 1.0f;
    }
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_activation_forward(ty, tx, CH_ACT_GELU));
    TC(&c, ch_activation_backward(tdx, tdy, tx, NULL, CH_ACT_GELU));
    double *want = tc_doubles(&c, n), *mag = tc_doubles(&c, n);
    ref_act_forward(want, CH_ACT_GELU, n, x);
    double err = ref_err(tc_fetch(&c, ty, n), want, NULL, n);
    ref_act_backward(want, CH_ACT_GELU, n, dy, x, NULL);
    ref_act_backward_mag(mag, CH_ACT_GELU, n, dy, x, NULL);
    double err_grad = ref_err(tc_fetch(&c, tdx, n), want, mag, n);
    tc_end_err(&c, err > err_grad ? err : err_grad, tol);
}

static void test_gelu_sweeps(ch_device *host)
{
    int wide = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    wide = __builtin_cpu_supports("avx512f");
#endif
    test_gelu_sweep(host, 12.5f, wide ? 4 * ULP : ACT_TOL);
    test_gelu_sweep(host, 16.0f, ACT_TOL);
}

/* ---- Bias ---------------------------------------------------------------- */

static void split_axis(int ndim, const int64_t *shape, int axis, int64_t *outer, int64_t *inner)
{
    *outer = ref_numel(axis, shape);
    *inner = ref_numel(ndim - axis - 1, shape + axis + 1);
}

static void test_bias_add(ch_device *dev, int ndim, const int64_t *shape, int axis, int in_place)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "bias_add %s axis %d%s", s, axis, in_place ? " in place" : "");
    int64_t n = ref_numel(ndim, shape), outer, inner, ch = shape[axis];
    split_axis(ndim, shape, axis, &outer, &inner);
    float *x = tc_random(&c, n, -2, 2);
    float *bias = tc_random(&c, ch, -2, 2);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *tb = tc_tensor(&c, CH_F32, SHAPE(ch), bias);
    ch_tensor *ty = in_place ? tx : tc_tensor(&c, CH_F32, ndim, shape, NULL);
    TC(&c, ch_bias_add(ty, tx, tb, axis));
    double *want = tc_doubles(&c, n);
    ref_bias_add(want, outer, ch, inner, x, bias);
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, n), want, NULL, n), TOL_ROUND);
}

/* beta 0 must not read db: it starts as NaN, like an unwritten gradient. */
static void test_bias_grad(ch_device *dev, int ndim, const int64_t *shape, int axis, float beta)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "bias_grad %s axis %d beta %g%s", s, axis, beta,
             beta == 0.0f ? " (db NaN before)" : "");
    int64_t n = ref_numel(ndim, shape), outer, inner, ch = shape[axis];
    split_axis(ndim, shape, axis, &outer, &inner);
    float *dy = tc_random(&c, n, -2, 2);
    float *db0 = tc_random(&c, ch, -2, 2);
    for (int64_t i = 0; beta == 0.0f && i < ch; i++)
        db0[i] = NAN;
    ch_tensor *tdy = tc_tensor(&c, CH_F32, ndim, shape, dy);
    ch_tensor *tdb = tc_tensor(&c, CH_F32, SHAPE(ch), db0);
    TC(&c, ch_bias_grad(tdb, tdy, axis, beta));
    double *want = tc_doubles(&c, ch), *mag = tc_doubles(&c, ch);
    ref_bias_grad(want, outer, ch, inner, dy, beta, db0);
    ref_bias_grad(mag, outer, ch, inner, tc_abs(&c, dy, n), fabsf(beta), tc_abs(&c, db0, ch));
    tc_end_err(&c, ref_err(tc_fetch(&c, tdb, ch), want, mag, ch), TOL_SUM);
}

/* Twice on the same dy, beta 0: the same bits (a fixed order of sums,
 * however the device cuts the work). */
static void test_bias_grad_repeats(ch_device *dev, int ndim, const int64_t *shape)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "bias_grad %s axis 1 twice: the same bits", s);
    int64_t n = ref_numel(ndim, shape), ch = shape[1];
    ch_tensor *tdy = tc_tensor(&c, CH_F32, ndim, shape, tc_random(&c, n, -2, 2));
    ch_tensor *tdb = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    TC(&c, ch_bias_grad(tdb, tdy, 1, 0.0f));
    float *first = tc_fetch(&c, tdb, ch);
    TC(&c, ch_bias_grad(tdb, tdy, 1, 0.0f));
    tc_end_words(&c, tc_fetch(&c, tdb, ch), first, ch, 1);
}

static void test_bias(ch_device *dev)
{
    test_bias_add(dev, SHAPE(17, 33), 1, 0);
    test_bias_add(dev, SHAPE(1, 1), 1, 0);
    test_bias_add(dev, SHAPE(3, 5, 7, 9), 1, 0);
    test_bias_add(dev, SHAPE(2, 3, 4, 5), 3, 0);
    test_bias_add(dev, SHAPE(17, 33), 0, 0);
    test_bias_add(dev, SHAPE(31, 65), 1, 1);
    for (int beta = 0; beta <= 1; beta++) {
        test_bias_grad(dev, SHAPE(17, 33), 1, (float)beta);
        test_bias_grad(dev, SHAPE(257, 3), 1, (float)beta);
        test_bias_grad(dev, SHAPE(3, 5, 7, 9), 1, (float)beta);
    }
    test_bias_grad(dev, SHAPE(2, 3, 4, 5), 3, 0.0f);
    test_bias_grad(dev, SHAPE(17, 33), 0, 1.0f);
    /* A convolution's layout past the host's threshold for threads
     * (131072 elements), an odd channel count; small sizes: still more
     * than a work-group of elements per channel. */
    if (tc_small())
        test_bias_grad(dev, SHAPE(2, 33, 5, 31), 1, 1.0f);
    else
        test_bias_grad(dev, SHAPE(5, 33, 29, 31), 1, 1.0f);
    /* Several spans of rows, or of a channel's elements, each summed by
     * work-groups of their own and then added in order (the OpenCL
     * backend's bias_grad cuts at 256 rows and 4096 elements). */
    test_bias_grad(dev, SHAPE(600, 45), 1, 1.0f);
    test_bias_grad(dev, SHAPE(3, 3, 50, 60), 1, 0.0f);
    if (!tc_small())
        test_bias_grad(dev, SHAPE(100003, 3), 1, 0.5f);
    test_bias_grad_repeats(dev, SHAPE(600, 45));
    test_bias_grad_repeats(dev, SHAPE(3, 3, 50, 60));
}

/* ---- Softmax cross-entropy ----------------------------------------------- */

static void random_labels(tcase *c, int32_t *labels, int64_t n, int64_t classes)
{
    for (int64_t i = 0; i < n; i++)
        labels[i] = (int32_t)(tap_rng_next(&c->rng) % (uint64_t)classes);
}

static void test_softmax_xent(ch_device *dev, int64_t n, int64_t classes, float lo, float hi)
{
    tcase c;
    tc_begin(&c, dev, "softmax_xent n %" PRId64 " c %" PRId64 " logits in [%g, %g)", n,
             classes, lo, hi);
    float *logits = tc_random(&c, n * classes, lo, hi);
    int32_t *labels = tc_ints(&c, n);
    random_labels(&c, labels, n, classes);
    ch_tensor *tl = tc_tensor(&c, CH_F32, SHAPE(n, classes), logits);
    ch_tensor *tlab = tc_tensor(&c, CH_I32, SHAPE(n), labels);
    ch_tensor *tp = tc_tensor(&c, CH_F32, SHAPE(n, classes), NULL);
    ch_tensor *tloss = tc_tensor(&c, CH_F32, SHAPE(1), NULL);
    TC(&c, ch_softmax_xent(tloss, tp, tl, tlab));
    double *want = tc_doubles(&c, n * classes + 1), *mag = tc_doubles(&c, n * classes + 1);
    want[n * classes] = ref_softmax_xent(want, n, classes, logits, labels);
    mag[n * classes] = ref_softmax_xent_mag(mag, n, classes, logits, labels);
    float *got = tc_floats(&c, n * classes + 1);
    memcpy(got, tc_fetch(&c, tp, n * classes), (size_t)(n * classes) * sizeof *got);
    memcpy(got + n * classes, tc_fetch(&c, tloss, 1), sizeof *got);
    double e_loss = ref_err(got + n * classes, want + n * classes, mag + n * classes, 1);
    double e_probs = ref_err(got, want, mag, n * classes);
    tc_append(&c, " (loss got %.7g want %.7g, probs err %.3g)", got[n * classes],
              want[n * classes], e_probs);
    tc_end_err(&c, fmax(e_loss, e_probs), TOL_SUM);
}

static void test_softmax_backward(ch_device *dev, int64_t n, int64_t classes, float scale)
{
    tcase c;
    tc_begin(&c, dev, "softmax_xent_backward n %" PRId64 " c %" PRId64 " scale %g", n, classes,
             scale);
    float *logits = tc_random(&c, n * classes, -4, 4);
    int32_t *labels = tc_ints(&c, n);
    random_labels(&c, labels, n, classes);
    double *p = tc_doubles(&c, n * classes);
    ref_softmax_xent(p, n, classes, logits, labels);
    float *probs = tc_floats(&c, n * classes);
    for (int64_t i = 0; i < n * classes; i++)
        probs[i] = (float)p[i];
    ch_tensor *tp = tc_tensor(&c, CH_F32, SHAPE(n, classes), probs);
    ch_tensor *tlab = tc_tensor(&c, CH_I32, SHAPE(n), labels);
    ch_tensor *td = tc_tensor(&c, CH_F32, SHAPE(n, classes), NULL);
    TC(&c, ch_softmax_xent_backward(td, tp, tlab, scale));
    double *want = tc_doubles(&c, n * classes);
    ref_softmax_xent_backward(want, n, classes, probs, labels, scale);
    float *got = tc_fetch(&c, td, n * classes);
    tc_vs_host(&c, got, NULL, n * classes, TOL_SAME);
    tc_end_err(&c, ref_err(got, want, NULL, n * classes), TOL_ROUND);
}

/* ch_softmax_xent_fused on logits in `dt`: the loss, and the gradient it
 * leaves in their place, against the double reference on the logits as
 * rounded to dt. Each gradient element's error scale is k (p_mag + onehot),
 * p_mag the probability's (ref_softmax_xent_mag); a half format adds its
 * one rounding, 2^-8 (bf16) or 2^-11 (f16) of the element (f16 an absolute
 * 2^-25 below its normal range). */
static void test_softmax_xent_fused(ch_device *dev, ch_dtype dt, int64_t n, int64_t classes,
                                    float lo, float hi, float scale)
{
    tcase c;
    tc_begin(&c, dev,
             "softmax_xent_fused %s n %" PRId64 " c %" PRId64 " logits in [%g, %g)"
             " scale %g",
             ch_dtype_name(dt), n, classes, lo, hi, scale);
    int64_t nc = n * classes;
    float *logits = tc_random(&c, nc, lo, hi);
    int32_t *labels = tc_ints(&c, n);
    random_labels(&c, labels, n, classes);
    ch_tensor *tf = tc_tensor(&c, CH_F32, SHAPE(n, classes), logits);
    ch_tensor *tlab = tc_tensor(&c, CH_I32, SHAPE(n), labels);
    ch_tensor *tloss = tc_tensor(&c, CH_F32, SHAPE(1), NULL);
    ch_tensor *tx = tf;
    if (dt != CH_F32) {
        tx = tc_tensor(&c, dt, SHAPE(n, classes), NULL);
        TC(&c, ch_cast(tx, tf));
        TC(&c, ch_cast(tf, tx));
        logits = tc_fetch(&c, tf, nc); /* as rounded */
    }
    TC(&c, ch_softmax_xent_fused(tloss, tx, tlab, scale));
    if (dt != CH_F32)
        TC(&c, ch_cast(tf, tx));
    float *got = tc_floats(&c, nc + 1);
    memcpy(got, tc_fetch(&c, tf, nc), (size_t)nc * sizeof *got);
    memcpy(got + nc, tc_fetch(&c, tloss, 1), sizeof *got);
    double *want = tc_doubles(&c, nc + 1), *mag = tc_doubles(&c, nc + 1);
    want[nc] = ref_softmax_xent(want, n, classes, logits, labels);
    mag[nc] = ref_softmax_xent_mag(mag, n, classes, logits, labels);
    double k = fabs((double)scale) / (double)n;
    double tol = dt == CH_BF16 ? 0x1p-8 + TOL_SUM : dt == CH_F16 ? 0x1p-11 + TOL_SUM : TOL_SUM;
    /* f16's subnormals: an error of up to half its smallest, 2^-25, on
     * any element, whatever its size. */
    double floor = dt == CH_F16 ? 0x1p-25 / tol : 0.0;
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < classes; j++) {
            double onehot = j == labels[r], *w = want + r * classes + j;
            *w = scale * (*w - onehot) / (double)n;
            mag[r * classes + j] = k * (mag[r * classes + j] + onehot) + floor;
        }
    double e_loss = ref_err(got + nc, want + nc, mag + nc, 1);
    double e_grad = ref_err(got, want, mag, nc);
    tc_append(&c, " (loss got %.7g want %.7g, gradient err %.3g)", got[nc], want[nc], e_grad);
    /* The loss is held to TOL_SUM: both sides start from the rounded logits. */
    tc_end_err(&c, fmax(e_loss / TOL_SUM * tol, e_grad), tol);
}

static void test_softmax(ch_device *dev)
{
    test_softmax_xent(dev, 1, 1, -1, 1);
    test_softmax_xent(dev, 1, 7, -3, 3);
    test_softmax_xent(dev, 13, 10, -5, 5);
    test_softmax_xent(dev, 33, 129, -8, 8);
    test_softmax_xent(dev, 5, 17, 70, 90);
    test_softmax_xent(dev, 3, 5, -80, 80);
    test_softmax_backward(dev, 1, 1, 1.0f);
    test_softmax_backward(dev, 13, 10, 1.0f);
    test_softmax_backward(dev, 33, 129, 0.5f);
    static const ch_dtype fused[] = {CH_F32, CH_BF16, CH_F16};
    for (size_t i = 0; i < sizeof fused / sizeof fused[0]; i++) {
        ch_dtype dt = fused[i];
        test_softmax_xent_fused(dev, dt, 1, 1, -1, 1, 1.0f);
        test_softmax_xent_fused(dev, dt, 13, 10, -5, 5, 1.0f);
        test_softmax_xent_fused(dev, dt, 33, 129, -8, 8, 0.5f);
        test_softmax_xent_fused(dev, dt, 5, 17, 70, 90, 2.0f);
        /* Rows longer than a work-group or a CUDA block: each item or
         * thread takes several columns. */
        test_softmax_xent_fused(dev, dt, 7, tc_small() ? 2049 : 50257, -10, 10, 1.0f);
    }
}

/* ---- Labels out of range: an error on every backend (ops.h) -------------- */

/* `st` is CH_ERR_INVALID_ARGUMENT naming labels[row] = label; the detail
 * says what came instead. */
static int names_label(ch_status st, int64_t row, int32_t label, char *detail, size_t len)
{
    char want[64];
    snprintf(want, sizeof want, "labels[%" PRId64 "] = %d", row, (int)label);
    const char *err = ch_last_error();
    int ok = st == CH_ERR_INVALID_ARGUMENT && strstr(err, want) != NULL;
    snprintf(detail, len, "got %s \"%s\", want %s naming \"%s\"", ch_status_str(st), err,
             ch_status_str(CH_ERR_INVALID_ARGUMENT), want);
    return ok;
}

/* labels[row] = bad (and labels[row2] = bad2 after it when row2 >= 0): the
 * forward, the backward and the fused op each refuse them, naming the first, from the
 * call or the stream's next wait (tap_settled); a good call on the same
 * tensors then succeeds, and so does the wait after it (the error is told
 * once). */
static void test_bad_label(ch_device *dev, int64_t n, int64_t classes, int64_t row, int32_t bad,
                           int64_t row2, int32_t bad2)
{
    char detail[1024] = "";
    tcase c;
    tc_begin(&c, dev,
             "softmax_xent, its backward and fused, %" PRId64 " rows of %" PRId64
             " classes, labels[%" PRId64 "] = %d%s",
             n, classes, row, (int)bad, row2 >= 0 ? " and a later one" : "");
    float *logits = tc_random(&c, n * classes, -3, 3);
    int32_t *labels = tc_ints(&c, n);
    random_labels(&c, labels, n, classes);
    labels[row] = bad;
    if (row2 >= 0)
        labels[row2] = bad2;
    ch_tensor *tl = tc_tensor(&c, CH_F32, SHAPE(n, classes), logits);
    ch_tensor *tlab = tc_tensor(&c, CH_I32, SHAPE(n), labels);
    ch_tensor *tp = tc_tensor(&c, CH_F32, SHAPE(n, classes), NULL);
    ch_tensor *tloss = tc_tensor(&c, CH_F32, SHAPE(1), NULL);
    ch_tensor *td = tc_tensor(&c, CH_F32, SHAPE(n, classes), NULL);
    const char *failed = NULL;
    if (c.st == CH_OK) {
        ch_clear_error();
        if (!names_label(tap_settled(ch_softmax_xent(tloss, tp, tl, tlab), tloss), row, bad, detail,
                         sizeof detail))
            failed = "forward";
    }
    if (c.st == CH_OK && !failed) {
        ch_clear_error();
        if (!names_label(tap_settled(ch_softmax_xent_backward(td, tp, tlab, 1.0f), td), row, bad,
                         detail, sizeof detail))
            failed = "backward";
    }
    if (c.st == CH_OK && !failed) {
        ch_clear_error();
        if (!names_label(tap_settled(ch_softmax_xent_fused(tloss, td, tlab, 1.0f), td), row, bad,
                         detail, sizeof detail))
            failed = "fused";
    }
    random_labels(&c, labels, n, classes);
    tc_upload(&c, tlab, labels);
    TC(&c, ch_softmax_xent_fused(tloss, td, tlab, 1.0f));
    TC(&c, ch_softmax_xent(tloss, tp, tl, tlab));
    TC(&c, ch_softmax_xent_backward(td, tp, tlab, 1.0f));
    /* Nothing left to report: a deferred error is told once. */
    TC(&c, ch_device_sync(dev));
    if (failed)
        tc_append(&c, " (the %s)", failed);
    else
        snprintf(detail, sizeof detail, "all three refused, naming it; then good labels pass");
    tc_end_exact(&c, !failed, detail);
}

static void test_bad_labels(ch_device *dev)
{
    const int64_t n = 13, classes = 10;
    const int64_t rows[] = {0, n / 2, n - 1};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        test_bad_label(dev, n, classes, rows[i], -1, -1, 0);
        test_bad_label(dev, n, classes, rows[i], (int32_t)classes, -1, 0);
    }
    test_bad_label(dev, n, classes, 4, (int32_t)classes, 9, -1);
    test_bad_label(dev, 1031, 3, 1030, 3, -1, 0);
    test_bad_label(dev, 1031, 3, 700, INT32_MIN, 1000, INT32_MAX);
}

/* ---- Convolution helpers and pooling ------------------------------------- */

static void window_str(char *out, size_t len, const ch_window2d *w)
{
    snprintf(out, len, "k%dx%d s%dx%d p%dx%d", w->kh, w->kw, w->sh, w->sw, w->ph, w->pw);
}

static void test_im2col(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                        const ch_window2d *win)
{
    char ws[64];
    tcase c;
    window_str(ws, sizeof ws, win);
    tc_begin(&c, dev, "im2col x [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] %s", n, ch, h,
             w, ws);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t rows = ch * win->kh * win->kw, cols = n * g.oh * g.ow;
    float *x = tc_random(&c, n * ch * h * w, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *tcol = tc_tensor(&c, CH_F32, SHAPE(rows, cols), tc_random(&c, rows * cols, 5, 9));
    TC(&c, ch_im2col(tcol, tx, win));
    double *want = tc_doubles(&c, rows * cols);
    ref_im2col(want, &g, x);
    tc_end_words(&c, tc_fetch(&c, tcol, rows * cols), narrow(&c, want, rows * cols), rows * cols,
                 1);
}

static void test_col2im(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                        const ch_window2d *win)
{
    char ws[64];
    tcase c;
    window_str(ws, sizeof ws, win);
    tc_begin(&c, dev, "col2im dx [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] %s", n, ch,
             h, w, ws);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t rows = ch * win->kh * win->kw, cols = n * g.oh * g.ow, nx = n * ch * h * w;
    float *col = tc_random(&c, rows * cols, -1, 1);
    ch_tensor *tcol = tc_tensor(&c, CH_F32, SHAPE(rows, cols), col);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), tc_random(&c, nx, 5, 9));
    TC(&c, ch_col2im(tdx, tcol, win));
    double *want = tc_doubles(&c, nx), *mag = tc_doubles(&c, nx);
    ref_col2im(want, &g, col);
    ref_col2im(mag, &g, tc_abs(&c, col, rows * cols));
    float *got = tc_fetch(&c, tdx, nx);
    tc_vs_host(&c, got, mag, nx, TOL_SAME);
    tc_end_err(&c, ref_err(got, want, mag, nx), TOL_ROUND);
}

static const ch_window2d conv_windows[] = {
    {3, 3, 1, 1, 0, 0}, {3, 3, 1, 1, 1, 1}, {3, 3, 2, 2, 1, 1}, {2, 2, 2, 2, 0, 0},
    {1, 1, 1, 1, 0, 0}, {5, 5, 2, 2, 2, 2}, {3, 2, 2, 1, 1, 0}, {3, 5, 1, 1, 0, 2},
};

static void test_conv(ch_device *dev)
{
    for (size_t i = 0; i < sizeof conv_windows / sizeof conv_windows[0]; i++) {
        test_im2col(dev, 2, 3, 7, 8, &conv_windows[i]);
        test_col2im(dev, 2, 3, 7, 8, &conv_windows[i]);
    }
    test_im2col(dev, 1, 2, 17, 31, &conv_windows[2]);
    test_col2im(dev, 1, 2, 17, 31, &conv_windows[2]);
    if (tc_small())
        return;
    /* Past the host's threshold for threads (131072 elements), in odd
     * counts of planes, so the work is cut between threads mid-batch. */
    test_im2col(dev, 3, 7, 29, 31, &conv_windows[1]);
    test_col2im(dev, 3, 7, 29, 31, &conv_windows[1]);
    test_im2col(dev, 5, 3, 61, 63, &conv_windows[2]);
    test_col2im(dev, 5, 3, 61, 63, &conv_windows[2]);
    /* Stride 1 and as wide as the input, but a plane too large for the
     * host's whole-plane shifts (16 KiB of tap masks): its per-row loops. */
    test_im2col(dev, 1, 2, 75, 80, &conv_windows[1]);
    test_col2im(dev, 1, 2, 75, 80, &conv_windows[1]);
}

/* ch_conv2d against the direct double-precision sum, y filled with junk
 * first. */
static void test_conv2d(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w, int64_t o,
                        const ch_window2d *win)
{
    char ws[64];
    tcase c;
    window_str(ws, sizeof ws, win);
    tc_begin(&c, dev, "conv2d x [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] to %" PRId64
             " channels %s", n, ch, h, w, o, ws);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t nx = n * ch * h * w, nw = o * ch * win->kh * win->kw, ny = n * o * g.oh * g.ow;
    float *x = tc_random(&c, nx, -1, 1), *wt = tc_random(&c, nw, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *tw = tc_tensor(&c, CH_F32, SHAPE(o, ch, win->kh, win->kw), wt);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, o, g.oh, g.ow), tc_random(&c, ny, 5, 9));
    TC(&c, ch_conv2d(ty, tx, tw, win));
    double *want = tc_doubles(&c, ny), *mag = tc_doubles(&c, ny);
    ref_conv2d(want, &g, o, x, wt);
    ref_conv2d(mag, &g, o, tc_abs(&c, x, nx), tc_abs(&c, wt, nw));
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, ny), want, mag, ny), TOL_SUM);
}

/* Its backward with the gradients `want` names (1 dx, 2 dw, 3 both); dx
 * holds junk before, dw NaN when beta is 0 (it must not be read). */
static void test_conv2d_backward(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                                 int64_t o, const ch_window2d *win, int want, float beta)
{
    static const char *what[] = {"", "dx", "dw", "dx and dw"};
    char ws[64];
    tcase c;
    window_str(ws, sizeof ws, win);
    tc_begin(&c, dev, "conv2d backward %s x [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
             "] to %" PRId64 " channels %s beta %g", what[want], n, ch, h, w, o, ws, beta);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t nx = n * ch * h * w, nw = o * ch * win->kh * win->kw, ny = n * o * g.oh * g.ow;
    float *x = tc_random(&c, nx, -1, 1), *wt = tc_random(&c, nw, -1, 1);
    float *dy = tc_random(&c, ny, -1, 1), *dw0 = tc_random(&c, nw, -1, 1);
    for (int64_t i = 0; beta == 0.0f && i < nw; i++)
        dw0[i] = NAN;
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *tw = tc_tensor(&c, CH_F32, SHAPE(o, ch, win->kh, win->kw), wt);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, o, g.oh, g.ow), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), tc_random(&c, nx, 5, 9));
    ch_tensor *tdw = tc_tensor(&c, CH_F32, SHAPE(o, ch, win->kh, win->kw), dw0);
    TC(&c, ch_conv2d_backward(want & 1 ? tdx : NULL, want & 2 ? tdw : NULL, tdy, tx, tw, win,
                              beta));
    double *wdx = tc_doubles(&c, nx), *mdx = tc_doubles(&c, nx);
    double *wdw = tc_doubles(&c, nw), *mdw = tc_doubles(&c, nw);
    ref_conv2d_backward(wdx, wdw, &g, o, dy, x, wt, beta, dw0);
    ref_conv2d_backward(mdx, mdw, &g, o, tc_abs(&c, dy, ny), tc_abs(&c, x, nx),
                        tc_abs(&c, wt, nw), fabs(beta), tc_abs(&c, dw0, nw));
    double err = 0.0;
    if (want & 1)
        err = fmax(err, ref_err(tc_fetch(&c, tdx, nx), wdx, mdx, nx));
    if (want & 2)
        err = fmax(err, ref_err(tc_fetch(&c, tdw, nw), wdw, mdw, nw));
    tc_end_err(&c, err, TOL_SUM);
}

/* The ResNet's steps on c channels: a 3x3 "same" convolution of n_same
 * samples on hw_same planes (backward in every mode), then the stride-2
 * step to 2c channels and its 1x1 projection on n_down samples of hw_down
 * planes. */
static void test_conv2d_resnet(ch_device *dev, int64_t n_same, int64_t n_down, int64_t c,
                               int64_t hw_same, int64_t hw_down)
{
    static const ch_window2d k1s2 = {1, 1, 2, 2, 0, 0};
    test_conv2d(dev, n_same, c, hw_same, hw_same, c, &conv_windows[1]);
    test_conv2d_backward(dev, n_same, c, hw_same, hw_same, c, &conv_windows[1], 3, 0.0f);
    test_conv2d_backward(dev, n_same, c, hw_same, hw_same, c, &conv_windows[1], 1, 0.0f);
    test_conv2d_backward(dev, n_same, c, hw_same, hw_same, c, &conv_windows[1], 2, 0.5f);
    test_conv2d(dev, n_down, c, hw_down, hw_down, 2 * c, &conv_windows[2]);
    test_conv2d_backward(dev, n_down, c, hw_down, hw_down, 2 * c, &conv_windows[2], 3, 1.0f);
    test_conv2d(dev, n_down, c, hw_down, hw_down, 2 * c, &k1s2);
    test_conv2d_backward(dev, n_down, c, hw_down, hw_down, 2 * c, &k1s2, 2, 1.0f);
}

static void test_conv2ds(ch_device *dev)
{
    for (size_t i = 0; i < sizeof conv_windows / sizeof conv_windows[0]; i++) {
        test_conv2d(dev, 2, 3, 7, 8, 4, &conv_windows[i]);
        test_conv2d_backward(dev, 2, 3, 7, 8, 4, &conv_windows[i], 3, 1.0f);
    }
    /* One sample (one thread on the host), then an odd batch split between
     * threads; the ResNet's shapes: 16 channels "same", the stride-2 step
     * to 32 and its 1x1 projection. */
    test_conv2d(dev, 1, 2, 9, 9, 3, &conv_windows[1]);
    test_conv2d_backward(dev, 1, 2, 9, 9, 3, &conv_windows[1], 3, 0.0f);
    /* Smaller under CHORUS_TEST_SIZES=small: fewer channels and planes. */
    if (tc_small()) {
        test_conv2d_resnet(dev, 2, 2, 8, 10, 10);
        return;
    }
    test_conv2d_resnet(dev, 5, 3, 16, 12, 14);
    /* A plane too large for the host's whole-plane shifts. */
    test_conv2d(dev, 2, 2, 75, 80, 3, &conv_windows[1]);
    test_conv2d_backward(dev, 2, 2, 75, 80, 3, &conv_windows[1], 3, 1.0f);
}

static void test_maxpool(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                         const ch_window2d *win)
{
    char ws[64], detail[256], ydetail[256];
    tcase c;
    window_str(ws, sizeof ws, win);
    tc_begin(&c, dev, "maxpool2d x [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "] %s", n, ch,
             h, w, ws);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t ny = n * ch * g.oh * g.ow;
    float *x = tc_random(&c, n * ch * h * w, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, ch, g.oh, g.ow), NULL);
    ch_tensor *tidx = tc_tensor(&c, CH_I32, SHAPE(n, ch, g.oh, g.ow), NULL);
    TC(&c, ch_maxpool2d(ty, tidx, tx, win));
    double *want = tc_doubles(&c, ny);
    int32_t *want_idx = tc_ints(&c, ny);
    ref_maxpool(want, want_idx, &g, x);
    int64_t bad = ref_diff_words(tc_fetch(&c, tidx, ny), want_idx, ny, 0, detail, sizeof detail);
    int64_t ybad = ref_diff_words(tc_fetch(&c, ty, ny), narrow(&c, want, ny), ny, 1, ydetail,
                                  sizeof ydetail);
    tc_append(&c, " (y: %s)", ydetail);
    tc_end_exact(&c, bad == 0 && ybad == 0, detail);
}

/* The backward gets the reference's indices, so it is checked on its own. */
static void test_maxpool_backward(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                                  const ch_window2d *win)
{
    char ws[64];
    tcase c;
    window_str(ws, sizeof ws, win);
    tc_begin(&c, dev, "maxpool2d_backward dx [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
             "] %s", n, ch, h, w, ws);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t ny = n * ch * g.oh * g.ow, nx = n * ch * h * w;
    float *x = tc_random(&c, nx, -1, 1);
    float *dy = tc_random(&c, ny, -1, 1);
    int32_t *idx = tc_ints(&c, ny);
    ref_maxpool(tc_doubles(&c, ny), idx, &g, x);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, ch, g.oh, g.ow), dy);
    ch_tensor *tidx = tc_tensor(&c, CH_I32, SHAPE(n, ch, g.oh, g.ow), idx);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), tc_random(&c, nx, 5, 9));
    TC(&c, ch_maxpool2d_backward(tdx, tdy, tidx, win));
    double *want = tc_doubles(&c, nx), *mag = tc_doubles(&c, nx);
    ref_maxpool_backward(want, &g, dy, idx);
    ref_maxpool_backward(mag, &g, tc_abs(&c, dy, ny), idx);
    float *got = tc_fetch(&c, tdx, nx);
    tc_vs_host(&c, got, mag, nx, TOL_SAME);
    tc_end_err(&c, ref_err(got, want, mag, nx), TOL_ROUND);
}

/* Indices that no forward writes: outside the plane, or a position in
 * another output's window. Every backend skips them (the host scatters dy
 * to idx, the devices gather from the windows covering each position), so
 * dx is the reference with those outputs' dy left out. */
static void test_maxpool_backward_stray(ch_device *dev, int64_t h, int64_t w,
                                        const ch_window2d *win)
{
    char ws[64];
    tcase c;
    window_str(ws, sizeof ws, win);
    tc_begin(&c, dev, "maxpool2d_backward skips indices outside their window, dx [2,3,%" PRId64
             ",%" PRId64 "] %s", h, w, ws);
    ref_geom g = ref_geom_make(2, 3, h, w, win);
    int64_t plane_out = g.oh * g.ow, ny = 6 * plane_out, nx = 6 * h * w;
    float *x = tc_random(&c, nx, -1, 1);
    float *dy = tc_random(&c, ny, -1, 1);
    int32_t *idx = tc_ints(&c, ny), *stray = tc_ints(&c, ny);
    ref_maxpool(tc_doubles(&c, ny), idx, &g, x);
    memcpy(stray, idx, (size_t)ny * sizeof *idx);
    float *dy_kept = tc_floats(&c, ny);
    memcpy(dy_kept, dy, (size_t)ny * sizeof *dy);
    /* Plane 1: below the plane, far below, past it, far past it, and the
     * last output's choice given to the first output (whose window it is
     * not). */
    const int32_t bad[5] = {-1, INT32_MIN, (int32_t)(h * w), INT32_MAX, idx[2 * plane_out - 1]};
    for (int i = 0; i < 5; i++) {
        stray[plane_out + i] = bad[i];
        dy_kept[plane_out + i] = 0.0f;
    }
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(2, 3, g.oh, g.ow), dy);
    ch_tensor *tidx = tc_tensor(&c, CH_I32, SHAPE(2, 3, g.oh, g.ow), stray);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(2, 3, h, w), tc_random(&c, nx, 5, 9));
    TC(&c, ch_maxpool2d_backward(tdx, tdy, tidx, win));
    double *want = tc_doubles(&c, nx), *mag = tc_doubles(&c, nx);
    ref_maxpool_backward(want, &g, dy_kept, idx);
    ref_maxpool_backward(mag, &g, tc_abs(&c, dy_kept, ny), idx);
    tc_end_err(&c, ref_err(tc_fetch(&c, tdx, nx), want, mag, nx), TOL_ROUND);
}

static void test_pooling(ch_device *dev)
{
    static const ch_window2d k2s2 = {2, 2, 2, 2, 0, 0}, k3s2p1 = {3, 3, 2, 2, 1, 1};
    test_maxpool(dev, 2, 3, 8, 8, &k2s2);
    test_maxpool(dev, 1, 2, 7, 9, &k2s2);
    test_maxpool(dev, 2, 3, 9, 9, &k3s2p1);
    test_maxpool(dev, 1, 2, 6, 7, &k3s2p1);
    test_maxpool_backward(dev, 2, 3, 8, 8, &k2s2);
    test_maxpool_backward(dev, 1, 2, 7, 9, &k2s2);
    test_maxpool_backward(dev, 2, 3, 9, 9, &k3s2p1);
    test_maxpool_backward(dev, 1, 2, 6, 7, &k3s2p1);
    test_maxpool_backward_stray(dev, 8, 10, &k2s2);
    test_maxpool_backward_stray(dev, 9, 11, &k3s2p1);
    if (tc_small()) {
        /* Several work-groups with a partial last one. */
        test_maxpool(dev, 3, 5, 21, 23, &k2s2);
        test_maxpool(dev, 3, 5, 21, 23, &k3s2p1);
        test_maxpool_backward(dev, 3, 5, 21, 23, &k2s2);
        test_maxpool_backward(dev, 3, 5, 21, 23, &k3s2p1);
        return;
    }
    /* Enough planes for the host's threads, an odd count, odd widths. */
    test_maxpool(dev, 5, 7, 62, 65, &k2s2);
    test_maxpool(dev, 5, 7, 61, 64, &k3s2p1);
    test_maxpool_backward(dev, 5, 7, 62, 65, &k2s2);
    test_maxpool_backward(dev, 5, 7, 61, 64, &k3s2p1);
}

/* ---- Reductions ---------------------------------------------------------- */

/* The reductions: each ch_axis_op, then argmax as the value after them. */
#define RED_ARGMAX CH_AXIS_COUNT

/* y's shape: x's without `axis` ([1] for a 1-D x), or with it as 1. */
static int reduced_shape(int64_t *y, int ndim, const int64_t *x, int axis, int keep)
{
    int k = 0;
    for (int i = 0; i < ndim; i++)
        if (i != axis || keep)
            y[k++] = i == axis ? 1 : x[i];
    if (k == 0)
        y[k++] = 1;
    return k;
}

/* The public call of each ch_axis_op. */
static ch_status run_axis(tcase *c, ch_axis_op op, ch_tensor *y, const ch_tensor *x, int axis)
{
    switch (op) {
    case CH_AXIS_SUM: return ch_sum(y, x, axis);
    case CH_AXIS_MEAN: return ch_mean(y, x, axis);
    case CH_AXIS_COUNT: break;
    }
    tc_fail(c, "no public call for ch_axis_op %d", (int)op);
    return CH_OK;
}

static void test_reduce(ch_device *dev, int kind, int ndim, const int64_t *shape, int axis,
                        int keep, int constant)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "%s %s axis %d%s%s", kind == RED_ARGMAX ? "argmax" : ref_axis_name(kind),
             s, axis, keep ? " keepdim" : "", constant ? " (all equal: first wins)" : "");
    int64_t n = ref_numel(ndim, shape), outer, inner, yshape[CH_MAX_DIMS];
    split_axis(ndim, shape, axis, &outer, &inner);
    int yndim = reduced_shape(yshape, ndim, shape, axis, keep);
    int64_t ny = outer * inner;
    float *x = tc_random(&c, n, -1, 1);
    for (int64_t i = 0; constant && i < n; i++)
        x[i] = 0.25f;
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *ty = tc_tensor(&c, kind == RED_ARGMAX ? CH_I32 : CH_F32, yndim, yshape, NULL);
    if (kind == RED_ARGMAX) {
        TC(&c, ch_argmax(ty, tx, axis));
        int32_t *want = tc_ints(&c, ny);
        ref_argmax(want, outer, shape[axis], inner, x);
        tc_end_words(&c, tc_fetch(&c, ty, ny), want, ny, 0);
        return;
    }
    TC(&c, run_axis(&c, kind, ty, tx, axis));
    double *want = tc_doubles(&c, ny), *mag = tc_doubles(&c, ny);
    ref_sum_axis(want, kind, outer, shape[axis], inner, x);
    ref_sum_axis(mag, kind, outer, shape[axis], inner, tc_abs(&c, x, n));
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, ny), want, mag, ny), TOL_SUM);
}

static void test_reductions(ch_device *dev)
{
    for (int kind = 0; kind <= RED_ARGMAX; kind++) {
        for (int axis = 0; axis < 3; axis++)
            test_reduce(dev, kind, SHAPE(3, 17, 33), axis, 0, 0);
        test_reduce(dev, kind, SHAPE(1, 129, 2), 1, 0, 0);
        test_reduce(dev, kind, SHAPE(1031), 0, 0, 0);
        test_reduce(dev, kind, SHAPE(5, 1, 7), 1, 0, 0);
        test_reduce(dev, kind, SHAPE(3, 17, 33), 1, 1, 0);
    }
    test_reduce(dev, RED_ARGMAX, SHAPE(2, 4, 3), 1, 0, 1);
    test_reduce(dev, RED_ARGMAX, SHAPE(2, 4, 3), 2, 0, 1);
}

/* ---- argmax and NaN (ops.h: the first NaN, else the first maximum) ------- */

typedef enum nan_case {
    NAN_FIRST, NAN_MIDDLE, NAN_LAST, NAN_ALL, NAN_TWO, TIE, NAN_AND_INF, NAN_CASES
} nan_case;

static const char *const nan_case_names[NAN_CASES] = {
    "NaN first", "NaN in the middle", "NaN last", "all NaN", "two NaNs",
    "a tie of maxima, no NaN", "NaN after +inf",
};

/* One row of n values in [-1, 1) with the case's NaNs and maxima; returns
 * the index ops.h's rule picks, found from the case, not by a scan. */
static int32_t nan_row(tcase *c, nan_case k, float *row, int64_t n)
{
    for (int64_t j = 0; j < n; j++)
        row[j] = k == NAN_ALL ? NAN : tap_rng_uniform(&c->rng, -1, 1);
    switch (k) {
    case NAN_FIRST: row[0] = NAN; return 0;
    case NAN_MIDDLE: row[n / 2] = NAN; return (int32_t)(n / 2);
    case NAN_LAST: row[n - 1] = NAN; return (int32_t)(n - 1);
    case NAN_ALL: return 0;
    case NAN_TWO:
        row[n / 3] = row[2 * n / 3] = NAN;
        return (int32_t)(n / 3);
    case TIE:
        row[n / 4] = row[3 * n / 4] = 2.0f;
        return (int32_t)(n / 4);
    case NAN_AND_INF:
        row[1] = INFINITY;
        row[n - 2] = NAN;
        return (int32_t)(n - 2);
    case NAN_CASES: break;
    }
    return -1;
}

/* x [outer, n, inner] along axis 1, every (outer, inner) column the same
 * case (its values drawn apart); the reference must agree too. */
static void test_argmax_nan(ch_device *dev, nan_case k, int64_t outer, int64_t n, int64_t inner)
{
    tcase c;
    tc_begin(&c, dev, "argmax [%" PRId64 ",%" PRId64 ",%" PRId64 "] axis 1, %s", outer, n, inner,
             nan_case_names[k]);
    int64_t ny = outer * inner;
    float *x = tc_floats(&c, outer * n * inner), *row = tc_floats(&c, n);
    int32_t *want = tc_ints(&c, ny), *ref = tc_ints(&c, ny);
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            want[o * inner + i] = nan_row(&c, k, row, n);
            for (int64_t j = 0; j < n; j++)
                x[(o * n + j) * inner + i] = row[j];
        }
    ref_argmax(ref, outer, n, inner, x);
    if (memcmp(ref, want, (size_t)ny * sizeof *ref) != 0)
        tc_fail(&c, "ref_argmax disagrees with the case (index %d, want %d)", ref[0], want[0]);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(outer, n, inner), x);
    ch_tensor *ty = tc_tensor(&c, CH_I32, SHAPE(outer, inner), NULL);
    TC(&c, ch_argmax(ty, tx, 1));
    tc_end_words(&c, tc_fetch(&c, ty, ny), want, ny, 0);
}

/* Short rows and long ones (one work-item or a work-group per output on
 * OpenCL), contiguous and strided. */
static void test_argmax_nans(ch_device *dev)
{
    for (int k = 0; k < NAN_CASES; k++) {
        test_argmax_nan(dev, k, 3, 5, 1);
        test_argmax_nan(dev, k, 2, 7, 3);
        test_argmax_nan(dev, k, 1, 1031, 1);
        test_argmax_nan(dev, k, 2, 1031, 2);
    }
}

/* ---- Optimizer updates --------------------------------------------------- */

static void test_sgd(ch_device *dev, const ch_sgd_params *prm, int first_step)
{
    tcase c;
    const int64_t n = 1031;
    tc_begin(&c, dev, "sgd_step lr %g momentum %g dampening %g wd %g nesterov %d first %d%s",
             prm->lr, prm->momentum, prm->dampening, prm->weight_decay, prm->nesterov,
             first_step, first_step ? " (m NaN before)" : "");
    float *p0 = tc_random(&c, n, -1, 1);
    float *g = tc_random(&c, n, -1, 1);
    float *m0 = tc_random(&c, n, -1, 1);
    for (int64_t i = 0; first_step && i < n; i++)
        m0[i] = NAN;
    int has_m = prm->momentum != 0.0f;
    ch_tensor *tp = tc_tensor(&c, CH_F32, SHAPE(n), p0);
    ch_tensor *tm = has_m ? tc_tensor(&c, CH_F32, SHAPE(n), m0) : NULL;
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(n), g);
    TC(&c, ch_sgd_step(tp, tm, tg, prm, first_step));
    double *want_p = tc_doubles(&c, n), *want_m = tc_doubles(&c, n);
    double *mag_p = tc_doubles(&c, n), *mag_m = tc_doubles(&c, n);
    ref_sgd_step(want_p, want_m, n, p0, m0, g, prm, first_step);
    /* The same step over |p0|, |m0|, |g| with -lr: every term added. */
    ch_sgd_params added = *prm;
    added.lr = -prm->lr;
    ref_sgd_step(mag_p, mag_m, n, tc_abs(&c, p0, n), tc_abs(&c, m0, n), tc_abs(&c, g, n), &added,
                 first_step);
    double err = ref_err(tc_fetch(&c, tp, n), want_p, mag_p, n);
    if (has_m)
        err = fmax(err, ref_err(tc_fetch(&c, tm, n), want_m, mag_m, n));
    tc_end_err(&c, err, TOL_ROUND);
}

static void test_adam(ch_device *dev, const ch_adam_params *prm)
{
    tcase c;
    const int64_t n = 1031;
    tc_begin(&c, dev, "adam_step %s lr %g wd %g step %" PRId64, prm->decoupled ? "AdamW" : "Adam",
             prm->lr, prm->weight_decay, prm->step);
    float *p0 = tc_random(&c, n, -1, 1);
    float *g = tc_random(&c, n, -1, 1);
    float *m0 = tc_random(&c, n, -0.5f, 0.5f);
    float *v0 = tc_random(&c, n, 0, 0.5f);
    for (int64_t i = 0; prm->step == 1 && i < n; i++)
        m0[i] = v0[i] = 0.0f;
    ch_tensor *tp = tc_tensor(&c, CH_F32, SHAPE(n), p0);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(n), m0);
    ch_tensor *tv = tc_tensor(&c, CH_F32, SHAPE(n), v0);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(n), g);
    TC(&c, ch_adam_step(tp, tm, tv, tg, prm));
    double *wp = tc_doubles(&c, n), *wm = tc_doubles(&c, n), *wv = tc_doubles(&c, n);
    double *mp = tc_doubles(&c, n), *mm = tc_doubles(&c, n), *mv = tc_doubles(&c, n);
    ref_adam_step(wp, wm, wv, n, p0, m0, v0, g, prm);
    /* The same step over |p0|, |m0|, |g| with -lr: every term added. */
    ch_adam_params added = *prm;
    added.lr = -prm->lr;
    ref_adam_step(mp, mm, mv, n, tc_abs(&c, p0, n), tc_abs(&c, m0, n), v0, tc_abs(&c, g, n),
                  &added);
    double err = ref_err(tc_fetch(&c, tp, n), wp, mp, n);
    err = fmax(err, ref_err(tc_fetch(&c, tm, n), wm, mm, n));
    err = fmax(err, ref_err(tc_fetch(&c, tv, n), wv, mv, n));
    tc_end_err(&c, err, TOL_ROUND);
}

/* chi_adam_step_half (lib/stamp.h, the optimizer's step for a weight whose
 * half copy the forward keeps): where the backend fuses it, p, m and v
 * bit for bit those of ch_adam_step, and ph those of ch_cast of the new
 * p, over tails, several blocks and both threads; elsewhere refused with
 * CH_ERR_UNSUPPORTED. */
static void test_adam_half(ch_device *dev, ch_dtype half, int64_t n)
{
    tcase c;
    tc_begin(&c, dev, "chi_adam_step_half to %s, n %" PRId64, ch_dtype_name(half), n);
    ch_adam_params prm = {.lr = 0.01f,
                          .beta1 = 0.9f,
                          .beta2 = 0.999f,
                          .eps = 1e-8f,
                          .weight_decay = 0.1f,
                          .decoupled = 1,
                          .step = 3};
    float *p0 = tc_random(&c, n, -2, 2), *g = tc_random(&c, n, -1, 1);
    float *m0 = tc_random(&c, n, -0.5f, 0.5f), *v0 = tc_random(&c, n, 0, 0.5f);
    ch_tensor *t[8];
    const float *init[4] = {p0, m0, v0, g};
    for (int k = 0; k < 8; k++)
        t[k] = tc_tensor(&c, CH_F32, SHAPE(n), init[k % 4]);
    ch_tensor *ph = tc_tensor(&c, half, SHAPE(n), NULL), *hc = tc_tensor(&c, half, SHAPE(n), NULL);
    if (c.st == CH_OK && !chi_adam_half_fused(t[4], ph)) {
        ch_status st = chi_adam_step_half(t[4], t[5], t[6], t[7], &prm, ph);
        tc_end_exact(&c, st == CH_ERR_UNSUPPORTED, "no fused step here: refused");
        return;
    }
    TC(&c, ch_adam_step(t[0], t[1], t[2], t[3], &prm));
    TC(&c, ch_cast(hc, t[0]));
    TC(&c, chi_adam_step_half(t[4], t[5], t[6], t[7], &prm, ph));
    int64_t bad = 0;
    for (int k = 0; k < 3 && c.st == CH_OK; k++)
        bad += memcmp(tc_fetch(&c, t[k], n), tc_fetch(&c, t[4 + k], n), (size_t)n * 4) != 0;
    uint16_t *a = tc_alloc(&c, (size_t)n * 2), *b = tc_alloc(&c, (size_t)n * 2);
    TC(&c, ch_tensor_download(hc, a, (size_t)n * 2));
    TC(&c, ch_tensor_download(ph, b, (size_t)n * 2));
    int64_t hbad = 0;
    for (int64_t i = 0; i < n; i++)
        hbad += a[i] != b[i];
    char detail[160];
    snprintf(detail, sizeof detail,
             "p, m, v: %" PRId64 " of 3 differ from ch_adam_step's; "
             "%" PRId64 " of ph's %" PRId64 " from ch_cast's",
             bad, hbad, n);
    tc_end_exact(&c, bad == 0 && hbad == 0, detail);
}

/* Its refusals, and the stamps (lib/stamp.h) the kept copies rest on. */
static void test_adam_half_errors(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    int64_t n[1] = {64}, n2[1] = {65};
    ch_tensor *p = NULL, *m = NULL, *v = NULL, *g = NULL, *bf = NULL, *f = NULL, *odd = NULL;
    ch_tensor *view = NULL;
    ch_status st = CH_OK;
    ch_tensor **ts[] = {&p, &m, &v, &g, &f};
    for (int k = 0; k < 5 && st == CH_OK; k++)
        st = ch_tensor_new(ts[k], dev, CH_F32, 1, n);
    for (int k = 0; k < 5 && st == CH_OK; k++)
        st = ch_fill(*ts[k], 0.25);
    if (st == CH_OK)
        st = ch_tensor_new(&bf, dev, CH_BF16, 1, n);
    if (st == CH_OK)
        st = ch_tensor_new(&odd, dev, CH_BF16, 1, n2);
    if (st != CH_OK) {
        tap_ok(0, "%s: chi_adam_step_half's tensors: %s", id, ch_last_error());
        goto out;
    }
    ch_adam_params prm = {.lr = 0.01f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 1};
    tap_ok(chi_adam_step_half(p, m, v, g, &prm, f) == CH_ERR_UNSUPPORTED &&
               chi_adam_step_half(p, m, v, g, &prm, odd) == CH_ERR_UNSUPPORTED &&
               chi_adam_step_half(p, m, v, g, &prm, NULL) == CH_ERR_UNSUPPORTED &&
               !chi_adam_half_fused(p, f) && !chi_adam_half_fused(p, odd),
           "%s: chi_adam_step_half refuses an f32 copy, one of another size and none (%s)", id,
           ch_last_error());
    prm.step = 0;
    tap_ok(chi_adam_step_half(p, m, v, g, &prm, bf) == CH_ERR_INVALID_ARGUMENT,
           "%s: chi_adam_step_half checks what ch_adam_step checks: step 0 (%s)", id,
           ch_last_error());
    prm.step = 1;
    tap_ok(chi_adam_step_half(p, m, v, p, &prm, bf) == CH_ERR_INVALID_ARGUMENT,
           "%s: chi_adam_step_half refuses g aliasing p, before asking whether it fuses (%s)", id,
           ch_last_error());
    /* Stamps: the same while nothing uses the buffer, new after a use
     * through the tensor or a view of it, never another buffer's. */
    uint64_t s0 = chi_tensor_stamp(p), s1 = chi_tensor_stamp(p);
    float host[64];
    int same = s0 == s1 && s0 != chi_tensor_stamp(m) && s0 != 0;
    st = ch_tensor_download(p, host, sizeof host);
    uint64_t s2 = chi_tensor_stamp(p);
    if (st == CH_OK)
        st = ch_tensor_view(&view, p, 8, 8);
    uint64_t s3 = chi_tensor_stamp(p);
    if (st == CH_OK)
        st = ch_fill(view, 1.0);
    uint64_t s4 = chi_tensor_stamp(p);
    if (st == CH_OK)
        st = ch_add(f, m, v);
    uint64_t s5 = chi_tensor_stamp(p), s6 = chi_tensor_stamp(m);
    tap_ok(st == CH_OK && same && s2 != s1 && s3 == s2 && s4 != s3 && s5 == s4 && s6 != s0 &&
               s6 != s4,
           "%s: a buffer's stamp stays while unused (views made and other tensors used) and "
           "moves with a download, an op on a view of it, an op reading it",
           id);
out:
    ch_tensor_free(view);
    for (int k = 0; k < 5; k++)
        ch_tensor_free(*ts[k]);
    ch_tensor_free(bf);
    ch_tensor_free(odd);
}

/* A tensor of n elements holding `data` (NULL: unset) that the caller
 * frees: a case holds fewer tensors than test_adam_multi makes. */
static ch_tensor *own_tensor(tcase *c, ch_tensor **list, int *count, ch_dtype dt, int64_t n,
                             const float *data)
{
    ch_tensor *t = NULL;
    if (c->st != CH_OK)
        return NULL;
    TC(c, ch_tensor_new(&t, c->dev, dt, 1, &n));
    if (t)
        list[(*count)++] = t;
    if (t && data)
        TC(c, ch_tensor_upload(t, data, (size_t)n * sizeof *data));
    return t;
}

/* chi_adam_step_multi over `count` parameters of sizes from `sizes`
 * (cycled), every third with a bf16 copy and every third after it an f16
 * one: p, m, v and the copies the same bits as ch_adam_step on each and
 * ch_cast of the result (the copies only where the backend fuses them). */
static void test_adam_multi(ch_device *dev, int count, const int64_t *sizes, int nsizes)
{
    enum {
        MAXP = 60
    };
    tcase c;
    tc_begin(&c, dev, "chi_adam_step_multi over %d parameters", count);
    ch_adam_params prm = {.lr = 0.02f,
                          .beta1 = 0.9f,
                          .beta2 = 0.95f,
                          .eps = 1e-8f,
                          .weight_decay = 0.1f,
                          .decoupled = 1,
                          .step = 2};
    chi_adam_tensors a[MAXP], b[MAXP];
    ch_tensor *hc[MAXP], *own[MAXP * 11];
    int64_t n[MAXP], most = 0;
    int nown = 0;
    count = count < MAXP ? count : MAXP;
    for (int i = 0; i < nsizes; i++)
        most = sizes[i] > most ? sizes[i] : most;
    /* Each parameter's values start its own stretch of these. */
    float *p0 = tc_random(&c, most + count, -2, 2), *g = tc_random(&c, most + count, -1, 1);
    float *m0 = tc_random(&c, most + count, -0.5f, 0.5f),
          *v0 = tc_random(&c, most + count, 0, 0.5f);
    for (int i = 0; i < count; i++) {
        n[i] = sizes[i % nsizes];
        ch_dtype half = i % 3 == 1 ? CH_BF16 : i % 3 == 2 ? CH_F16 : CH_F32;
        chi_adam_tensors *t[2] = {&a[i], &b[i]};
        for (int k = 0; k < 2; k++) {
            t[k]->p = own_tensor(&c, own, &nown, CH_F32, n[i], p0 + i);
            t[k]->m = own_tensor(&c, own, &nown, CH_F32, n[i], m0 + i);
            t[k]->v = own_tensor(&c, own, &nown, CH_F32, n[i], v0 + i);
            t[k]->g = own_tensor(&c, own, &nown, CH_F32, n[i], g + i);
            t[k]->ph = half == CH_F32 ? NULL : own_tensor(&c, own, &nown, half, n[i], NULL);
        }
        hc[i] = half == CH_F32 ? NULL : own_tensor(&c, own, &nown, half, n[i], NULL);
    }
    for (int i = 0; i < count; i++) {
        TC(&c, ch_adam_step(a[i].p, a[i].m, a[i].v, a[i].g, &prm));
        if (hc[i])
            TC(&c, ch_cast(hc[i], a[i].p));
    }
    TC(&c, chi_adam_step_multi(count, b, &prm));
    int64_t bad = 0, hbad = 0, fused = 0;
    float *x = tc_floats(&c, most), *y = tc_floats(&c, most);
    uint16_t *u = tc_alloc(&c, (size_t)most * 2), *w = tc_alloc(&c, (size_t)most * 2);
    for (int i = 0; i < count && c.st == CH_OK; i++) {
        ch_tensor *ta[3] = {a[i].p, a[i].m, a[i].v}, *tb[3] = {b[i].p, b[i].m, b[i].v};
        for (int k = 0; k < 3; k++) {
            tc_download(&c, ta[k], x, n[i]);
            tc_download(&c, tb[k], y, n[i]);
            bad += memcmp(x, y, (size_t)n[i] * 4) != 0;
        }
        if (hc[i] && chi_adam_half_fused(b[i].p, b[i].ph)) {
            TC(&c, ch_tensor_download(hc[i], u, (size_t)n[i] * 2));
            TC(&c, ch_tensor_download(b[i].ph, w, (size_t)n[i] * 2));
            hbad += memcmp(u, w, (size_t)n[i] * 2) != 0;
            fused++;
        }
    }
    for (int i = 0; i < nown; i++)
        ch_tensor_free(own[i]);
    char detail[160];
    snprintf(detail, sizeof detail,
             "p, m, v: %" PRId64 " of %d tensors differ from ch_adam_step's; %" PRId64
             " of %" PRId64 " rounded copies from ch_cast's",
             bad, 3 * count, hbad, fused);
    tc_end_exact(&c, bad == 0 && hbad == 0, detail);
}

/* Its refusals: parameters sharing memory, on two devices, a bad step. */
static void test_adam_multi_errors(ch_device *dev, ch_device *other)
{
    const char *id = ch_device_id(dev);
    int64_t n[1] = {64};
    ch_tensor *t[9] = {NULL};
    ch_status st = CH_OK;
    for (int k = 0; k < 8 && st == CH_OK; k++)
        st = ch_tensor_new(&t[k], dev, CH_F32, 1, n);
    for (int k = 0; k < 8 && st == CH_OK; k++)
        st = ch_fill(t[k], 0.25);
    if (st == CH_OK && other)
        st = ch_tensor_new(&t[8], other, CH_F32, 1, n);
    if (!tap_status_ok(st, "%s: tensors for chi_adam_step_multi's refusals", id))
        goto out;
    ch_adam_params prm = {.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .step = 1};
    chi_adam_tensors two[2] = {{t[0], t[1], t[2], t[3], NULL}, {t[4], t[5], t[1], t[7], NULL}};
    tap_status_is(chi_adam_step_multi(2, two, &prm), CH_ERR_INVALID_ARGUMENT,
                  "parameter 0's m overlaps parameter 1's v",
                  "%s: chi_adam_step_multi refuses two parameters sharing a state", id);
    two[1].v = t[6];
    two[1].g = t[3];
    tap_status_ok(chi_adam_step_multi(2, two, &prm),
                  "%s: chi_adam_step_multi takes one gradient read by two parameters", id);
    two[1].g = t[0];
    tap_status_is(chi_adam_step_multi(2, two, &prm), CH_ERR_INVALID_ARGUMENT, "overlaps",
                  "%s: chi_adam_step_multi refuses a gradient that is another's parameter", id);
    two[1].g = t[7];
    /* One rounded copy for two parameters: each would write it. */
    ch_tensor *hb = NULL;
    if (tap_status_ok(ch_tensor_new(&hb, dev, CH_BF16, 1, n), "%s: a bf16 copy", id)) {
        two[0].ph = two[1].ph = hb;
        tap_status_is(chi_adam_step_multi(2, two, &prm), CH_ERR_INVALID_ARGUMENT,
                      "parameter 0's ph overlaps parameter 1's ph",
                      "%s: chi_adam_step_multi refuses one rounded copy for two parameters", id);
        two[0].ph = two[1].ph = NULL;
    }
    ch_tensor_free(hb);
    prm.step = 0;
    tap_status_is(chi_adam_step_multi(2, two, &prm), CH_ERR_INVALID_ARGUMENT, "step",
                  "%s: chi_adam_step_multi checks each parameter as ch_adam_step does", id);
    prm.step = 1;
    tap_status_is(chi_adam_step_multi(1, NULL, &prm), CH_ERR_INVALID_ARGUMENT, "NULL",
                  "%s: chi_adam_step_multi refuses a NULL table", id);
    tap_status_ok(chi_adam_step_multi(0, NULL, &prm), "%s: chi_adam_step_multi of nothing", id);
    if (t[8]) {
        ch_tensor *m2 = NULL, *v2 = NULL, *g2 = NULL;
        st = ch_tensor_new(&m2, other, CH_F32, 1, n);
        if (st == CH_OK)
            st = ch_tensor_new(&v2, other, CH_F32, 1, n);
        if (st == CH_OK)
            st = ch_tensor_new(&g2, other, CH_F32, 1, n);
        chi_adam_tensors mixed[2] = {two[0], {t[8], m2, v2, g2, NULL}};
        if (tap_status_ok(st, "%s: a parameter on %s", id, ch_device_id(other)))
            tap_status_is(chi_adam_step_multi(2, mixed, &prm), CH_ERR_DEVICE_MISMATCH,
                          "parameter 1", "%s: chi_adam_step_multi refuses two devices", id);
        ch_tensor_free(m2);
        ch_tensor_free(v2);
        ch_tensor_free(g2);
    }
out:
    for (int k = 0; k < 9; k++)
        ch_tensor_free(t[k]);
}

static void test_optimizers(ch_device *dev)
{
    test_sgd(dev, &(ch_sgd_params){.lr = 0.1f}, 0);
    test_sgd(dev, &(ch_sgd_params){.lr = 0.1f, .weight_decay = 0.05f}, 0);
    test_sgd(dev, &(ch_sgd_params){.lr = 0.1f, .momentum = 0.9f}, 1);
    test_sgd(dev, &(ch_sgd_params){.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f}, 0);
    test_sgd(dev, &(ch_sgd_params){.lr = 0.05f, .momentum = 0.9f, .nesterov = 1}, 0);
    test_sgd(dev, &(ch_sgd_params){.lr = 0.1f, .momentum = 0.5f, .weight_decay = 0.01f}, 0);
    test_sgd(dev, &(ch_sgd_params){.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f,
                                   .nesterov = 1}, 1);
    for (int decoupled = 0; decoupled <= 1; decoupled++)
        for (int step = 1; step <= 5; step += 4)
            test_adam(dev, &(ch_adam_params){.lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f,
                                             .eps = 1e-8f, .weight_decay = 0.1f,
                                             .decoupled = decoupled, .step = step});
    for (int h = 0; h < 2; h++)
        for (int64_t n = 1031; n <= 200003; n += 198972)
            test_adam_half(dev, h ? CH_F16 : CH_BF16, n);
    test_adam_half_errors(dev);
    /* Chunks of 4096 (CUDA) cut inside and at the edges of parameters;
     * more than the 48 of one CUDA launch. */
    const int64_t sizes[] = {1, 4095, 4096, 4097, tc_small() ? 5001 : 30001, 768, 3};
    test_adam_multi(dev, 7, sizes, 7);
    test_adam_multi(dev, 53, sizes, 7);
}

/* ---- Random numbers ------------------------------------------------------ */

static void test_uniform(ch_device *dev, int64_t n, uint64_t seed, uint64_t offset, float lo,
                         float hi)
{
    tcase c;
    tc_begin(&c, dev, "rand_uniform n %" PRId64 " seed %#" PRIx64 " offset %#" PRIx64
             " [%g, %g) bit-exact", n, seed, offset, lo, hi);
    ch_tensor *y = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_rand_uniform(y, seed, offset, lo, hi));
    float *want = tc_floats(&c, n);
    ref_rand_uniform(want, n, seed, offset, lo, hi);
    tc_end_words(&c, tc_fetch(&c, y, n), want, n, 1);
}

static void test_normal(ch_device *dev, int64_t n, uint64_t seed, uint64_t offset, float mean,
                        float std)
{
    tcase c;
    tc_begin(&c, dev, "rand_normal n %" PRId64 " seed %#" PRIx64 " offset %#" PRIx64
             " mean %g std %g", n, seed, offset, mean, std);
    ch_tensor *y = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_rand_normal(y, seed, offset, mean, std));
    double *want = tc_doubles(&c, n), *mag = tc_doubles(&c, n);
    ref_rand_normal(want, n, seed, offset, mean, std);
    ref_rand_normal_mag(mag, n, seed, offset, mean, std);
    tc_end_err(&c, ref_err(tc_fetch(&c, y, n), want, mag, n), TOL_FN);
}

static void test_dropout(ch_device *dev, int64_t n, uint64_t seed, uint64_t offset, float p)
{
    tcase c;
    tc_begin(&c, dev, "dropout_mask n %" PRId64 " seed %#" PRIx64 " offset %#" PRIx64 " p %g",
             n, seed, offset, p);
    ch_tensor *y = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_dropout_mask(y, seed, offset, p));
    float *want = tc_floats(&c, n);
    ref_dropout_mask(want, n, seed, offset, p);
    tc_end_words(&c, tc_fetch(&c, y, n), want, n, 1);
}

/* Each ch_rand_kind through its public call; counters that cross into the
 * high word included. */
static void test_rand_kind(ch_device *dev, ch_rand_kind kind)
{
    const uint64_t wrap = (1ull << 32) - 5;
    switch (kind) {
    case CH_RAND_UNIFORM:
        test_uniform(dev, 1031, 42, 0, 0.0f, 1.0f);
        test_uniform(dev, 17, 0x123456789abcdef0ull, wrap, -1.0f, 1.0f);
        test_uniform(dev, 1, 3, 0, 0.0f, 1.0f);
        test_uniform(dev, 257, 7, 1000, -0.1f, 0.3f);
        return;
    case CH_RAND_NORMAL:
        test_normal(dev, 1031, 42, 0, 0.0f, 1.0f);
        test_normal(dev, 33, 0xdeadbeefcafef00dull, wrap, 0.5f, 2.0f);
        return;
    case CH_RAND_DROPOUT:
        test_dropout(dev, 1031, 9, 0, 0.5f);
        test_dropout(dev, 257, 11, 77, 0.3f);
        test_dropout(dev, 17, 0xffffffffffffffffull, wrap, 0.0f);
        return;
    case CH_RAND_COUNT:
        break;
    }
    tap_ok(0, "%s: no test for ch_rand_kind %d", ch_device_id(dev), (int)kind);
}

static void test_random(ch_device *dev)
{
    for (int kind = 0; kind < CH_RAND_COUNT; kind++)
        test_rand_kind(dev, kind);
}

/* ---- Views: ops on rows [3, 10) of a 16-row tensor ----------------------- */

#define VROWS 16
#define VSTART 3
#define VCOUNT 7
#define VCOLS 33

/* Checks the rows of `got` outside the view against `before` (unchanged) and
 * those inside against `want` (error scales `mag`, see ref_err). */
static void end_view_case(tcase *c, const float *got, const float *before, const double *want,
                          const double *mag)
{
    int64_t inside = VSTART * VCOLS, end = (VSTART + VCOUNT) * VCOLS, touched = 0;
    for (int64_t i = 0; i < VROWS * VCOLS; i++)
        if ((i < inside || i >= end) && memcmp(&got[i], &before[i], sizeof *got) != 0)
            touched++;
    double err = ref_err(got + inside, want, mag, VCOUNT * VCOLS);
    tc_append(c, " (%" PRId64 " elements outside the view changed)", touched);
    tc_end_err(c, touched ? INFINITY : err, TOL_FN);
}

typedef enum view_op { V_FILL, V_ADD, V_GEMM, V_UNIFORM, V_ACT, V_SGD } view_op;

/* Runs `op` on the view; fills want and the error scales mag. */
static void run_view_op(tcase *c, view_op op, ch_tensor *view, const float *inside, double *want,
                        double *mag)
{
    const int64_t n = VCOUNT * VCOLS;
    float *other = tc_random(c, n, -1, 1);
    ch_tensor *t = tc_tensor(c, CH_F32, SHAPE(VCOUNT, VCOLS), other);
    switch (op) {
    case V_FILL:
        TC(c, ch_fill(view, 2.5));
        for (int64_t i = 0; i < n; i++)
            want[i] = 2.5;
        break;
    case V_ADD:
        TC(c, ch_add(view, view, t));
        ref_binary(want, CH_BIN_ADD, n, inside, other);
        break;
    case V_GEMM: {
        float *a = tc_random(c, VCOUNT * VCOUNT, -1, 1);
        ch_tensor *ta = tc_tensor(c, CH_F32, SHAPE(VCOUNT, VCOUNT), a);
        TC(c, ch_gemm(view, 0, 0, 0.5f, ta, t, 1.0f));
        ref_gemm(want, 0, 0, VCOUNT, VCOLS, VCOUNT, 0.5, a, other, 1.0, inside);
        ref_gemm(mag, 0, 0, VCOUNT, VCOLS, VCOUNT, 0.5, tc_abs(c, a, VCOUNT * VCOUNT),
                 tc_abs(c, other, n), 1.0, tc_abs(c, inside, n));
        return;
    }
    case V_UNIFORM: {
        float *full = tc_floats(c, VROWS * VCOLS);
        TC(c, ch_rand_uniform(view, 5, VSTART * VCOLS, -1.0f, 1.0f));
        ref_rand_uniform(full, VROWS * VCOLS, 5, 0, -1.0f, 1.0f);
        for (int64_t i = 0; i < n; i++)
            want[i] = full[VSTART * VCOLS + i];
        break;
    }
    case V_ACT:
        TC(c, ch_activation_forward(view, view, CH_ACT_TANH));
        ref_act_forward(want, CH_ACT_TANH, n, inside);
        break;
    case V_SGD: {
        ch_sgd_params prm = {.lr = 0.5f};
        TC(c, ch_sgd_step(view, NULL, t, &prm, 0));
        ref_sgd_step(want, NULL, n, inside, NULL, other, &prm, 0);
        prm.lr = -prm.lr;
        ref_sgd_step(mag, NULL, n, tc_abs(c, inside, n), NULL, tc_abs(c, other, n), &prm, 0);
        return;
    }
    }
    for (int64_t i = 0; i < n; i++)
        mag[i] = fabs(want[i]);
}

static void test_view_output(ch_device *dev, view_op op)
{
    static const char *names[] = {"fill", "add in place", "gemm beta 1", "rand_uniform",
                                  "tanh in place", "sgd_step"};
    tcase c;
    tc_begin(&c, dev, "view rows [%d, %d) of %d as output: %s", VSTART, VSTART + VCOUNT, VROWS,
             names[op]);
    float *before = tc_random(&c, VROWS * VCOLS, -1, 1);
    ch_tensor *base = tc_tensor(&c, CH_F32, SHAPE(VROWS, VCOLS), before);
    ch_tensor *view = tc_view(&c, base, VSTART, VCOUNT);
    double *want = tc_doubles(&c, VCOUNT * VCOLS), *mag = tc_doubles(&c, VCOUNT * VCOLS);
    run_view_op(&c, op, view, before + VSTART * VCOLS, want, mag);
    end_view_case(&c, tc_fetch(&c, base, VROWS * VCOLS), before, want, mag);
}

/* A view as an input: copy, a reduction and GEMM must read the right rows. */
static void test_view_input(ch_device *dev)
{
    tcase c;
    tc_begin(&c, dev, "view rows [%d, %d) of %d as input: copy, sum axis 0, gemm", VSTART,
             VSTART + VCOUNT, VROWS);
    float *x = tc_random(&c, VROWS * VCOLS, -1, 1);
    const float *inside = x + VSTART * VCOLS;
    ch_tensor *base = tc_tensor(&c, CH_F32, SHAPE(VROWS, VCOLS), x);
    ch_tensor *view = tc_view(&c, base, VSTART, VCOUNT);
    ch_tensor *copy = tc_tensor(&c, CH_F32, SHAPE(VCOUNT, VCOLS), NULL);
    ch_tensor *sum = tc_tensor(&c, CH_F32, SHAPE(VCOLS), NULL);
    ch_tensor *gram = tc_tensor(&c, CH_F32, SHAPE(VCOUNT, VCOUNT), NULL);
    TC(&c, ch_copy(copy, view));
    TC(&c, ch_sum(sum, view, 0));
    TC(&c, ch_gemm(gram, 0, 1, 1.0f, view, view, 0.0f));
    const float *abs_inside = tc_abs(&c, inside, VCOUNT * VCOLS);
    double *want_sum = tc_doubles(&c, VCOLS), *mag_sum = tc_doubles(&c, VCOLS);
    double *want_gram = tc_doubles(&c, VCOUNT * VCOUNT);
    double *mag_gram = tc_doubles(&c, VCOUNT * VCOUNT);
    ref_sum_axis(want_sum, CH_AXIS_SUM, 1, VCOUNT, VCOLS, inside);
    ref_sum_axis(mag_sum, CH_AXIS_SUM, 1, VCOUNT, VCOLS, abs_inside);
    ref_gemm(want_gram, 0, 1, VCOUNT, VCOUNT, VCOLS, 1.0, inside, inside, 0.0, NULL);
    ref_gemm(mag_gram, 0, 1, VCOUNT, VCOUNT, VCOLS, 1.0, abs_inside, abs_inside, 0.0, NULL);
    const float *got_copy = tc_fetch(&c, copy, VCOUNT * VCOLS);
    int copied = memcmp(got_copy, inside, VCOUNT * VCOLS * sizeof *inside) == 0;
    double err = ref_err(tc_fetch(&c, sum, VCOLS), want_sum, mag_sum, VCOLS);
    err = fmax(err, ref_err(tc_fetch(&c, gram, VCOUNT * VCOUNT), want_gram, mag_gram,
                            VCOUNT * VCOUNT));
    tc_append(&c, " (copy %s)", copied ? "exact" : "differs");
    tc_end_err(&c, copied ? err : INFINITY, TOL_SUM);
}

static void test_views(ch_device *dev)
{
    for (int op = V_FILL; op <= V_SGD; op++)
        test_view_output(dev, op);
    test_view_input(dev);
}

/* ---- Copies between devices ---------------------------------------------- */

static void test_cross_copy(ch_device *src, ch_device *dst, ch_dtype dtype, int64_t n, int use_to)
{
    tcase c;
    tc_begin(&c, src, "-> %s %s %s n %" PRId64, ch_device_id(dst),
             use_to ? "ch_tensor_to" : "ch_copy", ch_dtype_name(dtype), n);
    float *x = tc_random(&c, n, -1000, 1000);
    ch_tensor *tx = tc_tensor(&c, dtype, SHAPE(n), x);
    ch_tensor *ty = NULL;
    if (use_to) {
        TC(&c, ch_tensor_to(&ty, tx, dst));
        if (ty)
            tc_track(&c, ty);
        if (c.st == CH_OK && ch_tensor_device(ty) != dst)
            tc_fail(&c, "the copy is on %s, want %s", ch_device_id(ch_tensor_device(ty)),
                    ch_device_id(dst));
    } else if (c.st == CH_OK) {
        TC(&c, ch_tensor_new(&ty, dst, dtype, SHAPE(n)));
        if (ty)
            tc_track(&c, ty);
        TC(&c, ch_copy(ty, tx));
    }
    tc_end_words(&c, tc_fetch(&c, ty, n), x, n, dtype == CH_F32);
}

static void test_cross_device(ch_device **devs, int ndev)
{
    if (ndev < 2) {
        tap_skip("copies between devices: only %d device visible", ndev);
        return;
    }
    for (int i = 0; i < ndev; i++)
        for (int j = 0; j < ndev; j++) {
            if (i == j)
                continue;
            for (int use_to = 0; use_to <= 1; use_to++) {
                test_cross_copy(devs[i], devs[j], CH_F32, 1, use_to);
                test_cross_copy(devs[i], devs[j], CH_F32, 100003, use_to);
                test_cross_copy(devs[i], devs[j], CH_I32, 12345, use_to);
            }
        }
}

/* ---- Random numbers against the host's (ops.h) --------------------------- */

/* The bound ops.h gives a normal drawn elsewhere than on the host. */
#define NORMAL_ACROSS 1.52587890625e-05 /* 2^-16 */

/* Draws kind on `t` (n elements); a, b as ch_rand's slot takes them. */
static ch_status draw(tcase *c, ch_rand_kind kind, ch_tensor *t, uint64_t seed, uint64_t offset,
                      float a, float b)
{
    switch (kind) {
    case CH_RAND_UNIFORM: return ch_rand_uniform(t, seed, offset, a, b);
    case CH_RAND_NORMAL: return ch_rand_normal(t, seed, offset, a, b);
    case CH_RAND_DROPOUT: return ch_dropout_mask(t, seed, offset, a);
    case CH_RAND_COUNT: break;
    }
    tc_fail(c, "no public call for ch_rand_kind %d", (int)kind);
    return CH_OK;
}

static const char *rand_name(ch_rand_kind kind)
{
    static const char *const names[CH_RAND_COUNT] = {"rand_uniform", "rand_normal",
                                                     "dropout_mask"};
    return kind >= 0 && kind < CH_RAND_COUNT ? names[kind] : "unknown";
}

/* The largest |got - want| / (|mean| + std) of a normal. */
static double normal_gap(const float *got, const float *want, int64_t n, float mean, float std)
{
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs((double)got[i] - want[i]) / (fabs(mean) + std));
    return worst;
}

/* The same draw on `dev` and on the host: bit for bit, or for normals to
 * NORMAL_ACROSS. */
static void test_rand_vs_host(ch_device *dev, ch_device *host, ch_rand_kind kind, int64_t n,
                              uint64_t seed, uint64_t offset, float a, float b)
{
    tcase c;
    tc_begin(&c, dev, "%s n %" PRId64 " seed %#" PRIx64 " offset %#" PRIx64 " (%g, %g) "
             "against the host's", rand_name(kind), n, seed, offset, a, b);
    ch_tensor *y = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    ch_tensor *yh = NULL;
    TC(&c, ch_tensor_new(&yh, host, CH_F32, SHAPE(n)));
    if (yh)
        tc_track(&c, yh);
    TC(&c, draw(&c, kind, y, seed, offset, a, b));
    TC(&c, draw(&c, kind, yh, seed, offset, a, b));
    float *got = tc_fetch(&c, y, n), *want = tc_fetch(&c, yh, n);
    if (kind != CH_RAND_NORMAL) {
        tc_end_words(&c, got, want, n, 1);
        return;
    }
    tc_end_err(&c, normal_gap(got, want, n, a, b), NORMAL_ACROSS);
}

static void test_random_vs_host(ch_device *dev, ch_device *host)
{
    const uint64_t wrap = (1ull << 32) - 5;
    static const float args[CH_RAND_COUNT][2][2] = {
        [CH_RAND_UNIFORM] = {{0.0f, 1.0f}, {-0.1f, 0.3f}},
        [CH_RAND_NORMAL] = {{0.0f, 1.0f}, {-3.0f, 0.25f}},
        [CH_RAND_DROPOUT] = {{0.5f, 0.0f}, {0.1f, 0.0f}},
    };
    for (int kind = 0; kind < CH_RAND_COUNT; kind++) {
        test_rand_vs_host(dev, host, kind, tc_small() ? 4099 : 65537, 42, 0, args[kind][0][0],
                          args[kind][0][1]);
        test_rand_vs_host(dev, host, kind, 1031, 0xdeadbeefcafef00dull, wrap, args[kind][1][0],
                          args[kind][1][1]);
    }
}

/* ---- Shared formulas against the host's -------------------------------- */

/* An f32 tensor of n elements on `dev`, holding `data` unless NULL, freed
 * with the case. */
static ch_tensor *tensor_on(tcase *c, ch_device *dev, int64_t n, const float *data)
{
    ch_tensor *t = NULL;
    TC(c, ch_tensor_new(&t, dev, CH_F32, SHAPE(n)));
    if (t) {
        tc_track(c, t);
        if (data)
            tc_upload(c, t, data);
    }
    return t;
}

/* act forward (dy NULL) or backward on one device's tensors: y, x and dy
 * as ops.h's calls take them (relu and gelu read x, tanh and sigmoid y). */
static ch_status act_run(ch_activation act, ch_tensor *out, ch_tensor *dy, ch_tensor *x,
                         ch_tensor *y)
{
    if (!dy)
        return ch_activation_forward(out, x, act);
    return ref_act_reads_x(act) ? ch_activation_backward(out, dy, x, NULL, act)
                                : ch_activation_backward(out, dy, NULL, y, act);
}

/* The activation on `dev` and on the host, same inputs: each is within
 * ACT_TOL of the exact value, so the two within 2 ACT_TOL of each other
 * (relative to the result, or for the backward to |dy act'|). A device
 * whose result drifts from the shared formula fails here even where the
 * double reference's bound would still let it pass. */
static void test_act_vs_host(ch_device *dev, ch_device *host, ch_activation act, int backward,
                             float range)
{
    tcase c;
    const int64_t n = 4099;
    tc_begin(&c, dev, "%s %s n %" PRId64 " x in [-%g, %g) against the host's", ref_act_name(act),
             backward ? "backward" : "forward", n, range, range);
    float *x = tc_random(&c, n, -range, range);
    float *dy = tc_random(&c, n, -2, 2);
    float *y = tc_floats(&c, n);
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)ref_act(act, x[i]);
    ch_tensor *out[2];
    ch_device *on[2] = {dev, host};
    for (int k = 0; k < 2; k++) {
        out[k] = tensor_on(&c, on[k], n, NULL);
        ch_tensor *tx = tensor_on(&c, on[k], n, x), *ty = tensor_on(&c, on[k], n, y);
        ch_tensor *tdy = backward ? tensor_on(&c, on[k], n, dy) : NULL;
        TC(&c, act_run(act, out[k], tdy, tx, ty));
    }
    float *got = tc_fetch(&c, out[0], n);
    double *want = tc_widen(&c, tc_fetch(&c, out[1], n), n);
    double *mag = NULL;
    if (backward) {
        mag = tc_doubles(&c, n);
        int reads_x = ref_act_reads_x(act);
        ref_act_backward_mag(mag, act, n, dy, reads_x ? x : NULL, reads_x ? NULL : y);
    }
    tc_end_err(&c, ref_err(got, want, mag, n), 2 * ACT_TOL);
}

/* SGD and Adam on `dev` and on the host from the same state: the very same
 * operations (lib/kernels/optim_step.h), so the same bits, which
 * data-parallel replicas on different backends rely on. */
static void test_optim_vs_host(ch_device *dev, ch_device *host, int adam, int variant)
{
    tcase c;
    const int64_t n = 1031;
    ch_sgd_params sp = {.lr = 0.1f,
                        .momentum = 0.9f,
                        .dampening = variant ? 0.0f : 0.1f,
                        .weight_decay = 0.01f,
                        .nesterov = variant};
    ch_adam_params ap = {.lr = 0.01f,
                         .beta1 = 0.9f,
                         .beta2 = 0.999f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f,
                         .step = 3,
                         .decoupled = variant};
    tc_begin(&c, dev, "%s step against the host's, bit for bit",
             adam ? (variant ? "AdamW" : "Adam") : (variant ? "nesterov sgd" : "sgd"));
    float *p0 = tc_random(&c, n, -1, 1);
    float *g = tc_random(&c, n, -1, 1);
    float *m0 = tc_random(&c, n, -0.5f, 0.5f);
    float *v0 = tc_random(&c, n, 0, 0.5f);
    ch_tensor *p[2], *m[2], *v[2];
    ch_device *on[2] = {dev, host};
    for (int k = 0; k < 2; k++) {
        p[k] = tensor_on(&c, on[k], n, p0);
        m[k] = tensor_on(&c, on[k], n, m0);
        v[k] = tensor_on(&c, on[k], n, v0);
        ch_tensor *tg = tensor_on(&c, on[k], n, g);
        TC(&c,
           adam ? ch_adam_step(p[k], m[k], v[k], tg, &ap) : ch_sgd_step(p[k], m[k], tg, &sp, 0));
    }
    int64_t words = adam ? 3 * n : 2 * n;
    float *got = tc_floats(&c, words), *want = tc_floats(&c, words);
    ch_tensor **state[3] = {p, m, v};
    for (int s = 0; s < (adam ? 3 : 2); s++) {
        tc_download(&c, state[s][0], got + s * n, n);
        tc_download(&c, state[s][1], want + s * n, n);
    }
    tc_end_words(&c, got, want, words, 1);
}

static void test_shared_vs_host(ch_device *dev, ch_device *host)
{
    for (int act = 0; act < CH_ACT_COUNT; act++)
        for (int backward = 0; backward <= 1; backward++)
            test_act_vs_host(dev, host, act, backward, act == CH_ACT_GELU ? 9 : 6);
    for (int adam = 0; adam <= 1; adam++)
        for (int variant = 0; variant <= 1; variant++)
            test_optim_vs_host(dev, host, adam, variant);
}

/* ---- Main ---------------------------------------------------------------- */

static void test_device(ch_device *dev)
{
    double t0 = ch_clock_seconds();
    test_data_movement(dev);
    test_gemms(dev);
    test_gemm_bias_acts(dev);
    test_elementwise(dev);
    test_activations(dev);
    test_bias(dev);
    test_softmax(dev);
    test_bad_labels(dev);
    test_conv(dev);
    test_conv2ds(dev);
    test_pooling(dev);
    test_reductions(dev);
    test_argmax_nans(dev);
    test_optimizers(dev);
    test_random(dev);
    test_views(dev);
    tap_diag("%s: %.1f s", ch_device_id(dev), ch_clock_seconds() - t0);
}

int main(void)
{
    tc_small();
    test_philox_kat();
    ch_status st = ch_init();
    if (!tap_status_ok(st, "ch_init"))
        return tap_done();
    tc_skip_missing_backends();
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES);
    for (int i = 0; i < ndev; i++)
        test_device(devs[i]);
    test_cross_device(devs, ndev);
    ch_device *host = NULL;
    st = ch_device_by_name(&host, "host");
    if (st == CH_ERR_NOT_FOUND && getenv("CHORUS_DEVICES"))
        tap_skip("the random streams and the shared formulas against the host: "
                 "CHORUS_DEVICES=%s leaves the host out",
                 getenv("CHORUS_DEVICES"));
    else if (tap_status_ok(st, "the host device, for the random "
                               "streams and the shared formulas of the others")) {
        test_gelu_sweeps(host);
        for (int i = 0; i < ndev; i++)
            if (devs[i] != host) {
                test_random_vs_host(devs[i], host);
                test_shared_vs_host(devs[i], host);
            }
        for (int i = 0; i < ndev; i++)
            test_adam_multi_errors(devs[i], devs[i] != host ? host : ndev > 1 ? devs[1] : NULL);
    }
    ch_shutdown();
    return tap_done();
}
