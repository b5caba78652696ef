/* The attention family of ops (batched GEMM, permute, the masked softmax,
 * the embedding) and global average pooling, on every visible device:
 * results against references written here in double (or bit for bit where
 * nothing is rounded), each backward against central differences of the
 * device's own forward or the adjoint identity, and every bad argument a
 * caller can pass. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "tap.h"

/* Error bounds, as in test-ops.c (relative to each element, ref_err) and
 * test-ops-grad.c (relative to the largest derivative, ref_err_scaled):
 * - TOL_ROUND: one to a few correctly rounded operations;
 * - TOL_SUM: sums in another order than the reference's, and a device's
 *   own exp (3 ulp in OpenCL 1.2), relative to the sum of |terms|;
 * - TOL_FD: central differences of f32 forwards, step 1e-2;
 * - TOL_ADJOINT: the rounding of f32 outputs and of the device's sums. */
#define ULP 1.1920928955078125e-07
#define TOL_ROUND (4 * ULP)
#define TOL_SUM (64 * ULP)
#define TOL_FD 5e-4
#define TOL_ADJOINT 1e-6
#define FD_STEP 1e-2f

#define MAX_DEVICES 16

/* ---- Batched GEMM ------------------------------------------------------------- */

/* Operand x of a batch of `batch` matrices [rows, cols] stored transposed
 * or not: the 3-D shape as stored. */
static ch_tensor *batch_operand(tcase *c, int trans, int64_t batch, int64_t rows, int64_t cols,
                                const float *data)
{
    return trans ? tc_tensor(c, CH_F32, SHAPE(batch, cols, rows), data)
                 : tc_tensor(c, CH_F32, SHAPE(batch, rows, cols), data);
}

static void test_gemm_batched(ch_device *dev, int ta, int tb, int64_t batch, int64_t m,
                              int64_t n, int64_t k, float alpha, float beta)
{
    tcase c;
    tc_begin(&c, dev, "gemm_batched %c%c batch %" PRId64 " m %" PRId64 " n %" PRId64
             " k %" PRId64 " alpha %g beta %g%s", ta ? 'T' : 'N', tb ? 'T' : 'N', batch, m, n,
             k, alpha, beta, beta == 0.0f ? " (c NaN before)" : "");
    int64_t na = m * k, nb = k * n, nc = m * n;
    float *a = tc_random(&c, batch * na, -1, 1), *b = tc_random(&c, batch * nb, -1, 1);
    float *c0 = tc_random(&c, batch * nc, -1, 1);
    for (int64_t i = 0; beta == 0.0f && i < batch * nc; i++)
        c0[i] = NAN;
    ch_tensor *tcc = tc_tensor(&c, CH_F32, SHAPE(batch, m, n), c0);
    TC(&c, ch_gemm_batched(tcc, ta, tb, alpha, batch_operand(&c, ta, batch, m, k, a),
                           batch_operand(&c, tb, batch, k, n, b), beta));
    const float *abs_a = tc_abs(&c, a, batch * na), *abs_b = tc_abs(&c, b, batch * nb);
    const float *abs_c = tc_abs(&c, c0, batch * nc);
    double *want = tc_doubles(&c, batch * nc), *mag = tc_doubles(&c, batch * nc);
    for (int64_t i = 0; i < batch; i++) {
        ref_gemm(want + i * nc, ta, tb, m, n, k, alpha, a + i * na, b + i * nb, beta,
                 c0 + i * nc);
        ref_gemm(mag + i * nc, ta, tb, m, n, k, fabsf(alpha), abs_a + i * na, abs_b + i * nb,
                 fabsf(beta), abs_c + i * nc);
    }
    tc_end_err(&c, ref_err(tc_fetch(&c, tcc, batch * nc), want, mag, batch * nc), TOL_SUM);
}

static void test_gemms_batched(ch_device *dev)
{
    /* batch, m, n, k: ones, primes, beyond a 64-wide tile and a work-group
     * of 256, attention's T x T x head size. */
    static const int64_t sizes[][4] = {
        {1, 1, 1, 1},   {3, 17, 31, 33}, {5, 65, 3, 129}, {2, 7, 257, 13},
        {8, 64, 64, 32}, {13, 5, 9, 1},   {1, 127, 129, 65},
    };
    static const float ab[][2] = {{1, 0}, {0.5f, 1}, {-1.25f, 0.5f}, {2, 0},
                                  {1, 1}, {0.125f, -2}, {1, 0}};
    /* Small sizes (CHORUS_TEST_SIZES), for a simulator: fewer and smaller
     * matrices that still span several tiles of 64 (with a partial one)
     * in m, in n, in both, and k in slices of 16 ending in a partial one;
     * the T x T tile exact. */
    static const int64_t small[][4] = {
        {1, 1, 1, 1},  {3, 17, 31, 33}, {2, 40, 3, 20}, {2, 7, 100, 13},
        {2, 64, 64, 16}, {13, 5, 9, 1},   {1, 66, 65, 5},
    };
    const int64_t(*sz)[4] = tc_small() ? small : sizes;
    for (int t = 0; t < 4; t++)
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
            test_gemm_batched(dev, t >> 1, t & 1, sz[i][0], sz[i][1], sz[i][2], sz[i][3],
                              ab[i][0], ab[i][1]);
}

/* L = <alpha op(A) op(B), G> over the batch, and its gradients the way
 * attention's backward computes them: dop(A) = alpha G op(B)^T and
 * dop(B) = alpha op(A)^T G, transposed back where A or B was used
 * transposed. */
typedef struct bgemm_setup {
    int ta, tb;
    int64_t batch, m, n, k;
    float alpha;
    ch_tensor *a, *b, *c, *g;
    const float *gh;
    float *ch;  /* scratch for c */
} bgemm_setup;

static double bgemm_objective(tcase *c, const void *sv, ch_tensor *t, const float *values)
{
    const bgemm_setup *s = sv;
    int64_t nc = s->batch * s->m * s->n;
    tc_upload(c, t, values);
    TC(c, ch_gemm_batched(s->c, s->ta, s->tb, s->alpha, s->a, s->b, 0.0f));
    tc_download(c, s->c, s->ch, nc);
    return ref_dot(s->ch, s->gh, nc);
}

static void bgemm_analytic(tcase *c, const bgemm_setup *s, ch_tensor *da, ch_tensor *db)
{
    if (!s->ta)
        TC(c, ch_gemm_batched(da, 0, !s->tb, s->alpha, s->g, s->b, 0.0f));
    else
        TC(c, ch_gemm_batched(da, s->tb, 1, s->alpha, s->b, s->g, 0.0f));
    if (!s->tb)
        TC(c, ch_gemm_batched(db, !s->ta, 0, s->alpha, s->a, s->g, 0.0f));
    else
        TC(c, ch_gemm_batched(db, 1, s->ta, s->alpha, s->g, s->a, 0.0f));
}

static void grad_gemm_batched(ch_device *dev, int ta, int tb)
{
    tcase c;
    bgemm_setup s = {.ta = ta, .tb = tb, .batch = 2, .m = 3, .n = 4, .k = 5, .alpha = 0.7f};
    tc_begin(&c, dev, "gemm_batched %c%c gradients of <alpha op(A) op(B), G> vs central "
             "differences", ta ? 'T' : 'N', tb ? 'T' : 'N');
    int64_t na = s.batch * s.m * s.k, nb = s.batch * s.k * s.n, nc = s.batch * s.m * s.n;
    float *a = tc_random(&c, na, -1, 1), *b = tc_random(&c, nb, -1, 1);
    float *g = tc_random(&c, nc, -1, 1);
    s.gh = g;
    s.ch = tc_floats(&c, nc);
    s.a = batch_operand(&c, ta, s.batch, s.m, s.k, a);
    s.b = batch_operand(&c, tb, s.batch, s.k, s.n, b);
    s.c = tc_tensor(&c, CH_F32, SHAPE(s.batch, s.m, s.n), NULL);
    s.g = tc_tensor(&c, CH_F32, SHAPE(s.batch, s.m, s.n), g);
    ch_tensor *da = batch_operand(&c, ta, s.batch, s.m, s.k, NULL);
    ch_tensor *db = batch_operand(&c, tb, s.batch, s.k, s.n, NULL);
    bgemm_analytic(&c, &s, da, db);
    double *got = tc_doubles(&c, na + nb), *want = tc_doubles(&c, na + nb);
    const float *gda = tc_fetch(&c, da, na), *gdb = tc_fetch(&c, db, nb);
    for (int64_t i = 0; i < na + nb; i++)
        got[i] = i < na ? gda[i] : gdb[i - na];
    tc_central_diff(&c, bgemm_objective, &s, s.a, a, na, FD_STEP, want);
    tc_central_diff(&c, bgemm_objective, &s, s.b, b, nb, FD_STEP, want + na);
    tc_end_err(&c, ref_err_scaled(got, want, na + nb, 1e-6), TOL_FD);
}

/* ---- Permute -------------------------------------------------------------------- */

/* want[i] = x at the position y's element i comes from. */
static void ref_permute(uint32_t *want, const uint32_t *x, int ndim, const int64_t *shape,
                        const int *perm)
{
    int64_t stride[CH_MAX_DIMS], n = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        stride[d] = n;
        n *= shape[d];
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t rest = i, off = 0;
        for (int d = ndim - 1; d >= 0; d--) {
            off += rest % shape[perm[d]] * stride[perm[d]];
            rest /= shape[perm[d]];
        }
        want[i] = x[off];
    }
}

static void test_permute(ch_device *dev, ch_dtype dtype, int ndim, const int64_t *shape,
                         const int *perm)
{
    char s[64], p[64];
    size_t at = 0;
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    for (int i = 0; i < ndim; i++)
        at += (size_t)snprintf(p + at, sizeof p - at, i ? ",%d" : "%d", perm[i]);
    tc_begin(&c, dev, "permute %s %s perm (%s)", ch_dtype_name(dtype), s, p);
    int64_t n = ref_numel(ndim, shape), yshape[CH_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        yshape[i] = shape[perm[i]];
    uint32_t *x = tc_alloc(&c, (size_t)n * 4), *want = tc_alloc(&c, (size_t)n * 4);
    for (int64_t i = 0; i < n; i++) {
        float f = tap_rng_uniform(&c.rng, -9, 9);
        if (dtype == CH_F32)
            memcpy(&x[i], &f, 4);
        else
            x[i] = (uint32_t)tap_rng_next(&c.rng);
    }
    ch_tensor *tx = tc_tensor(&c, dtype, ndim, shape, x);
    ch_tensor *ty = tc_tensor(&c, dtype, ndim, yshape, NULL);
    TC(&c, ch_permute(ty, tx, perm));
    ref_permute(want, x, ndim, shape, perm);
    tc_end_words(&c, tc_fetch(&c, ty, n), want, n, dtype == CH_F32);
}

#define PERM(...) (const int[]){__VA_ARGS__}

static void test_permutes(ch_device *dev)
{
    test_permute(dev, CH_F32, SHAPE(2, 3, 4), PERM(2, 0, 1));
    test_permute(dev, CH_F32, SHAPE(2, 3, 4), PERM(1, 0, 2));
    test_permute(dev, CH_F32, SHAPE(2, 3, 4), PERM(0, 2, 1));
    test_permute(dev, CH_F32, SHAPE(2, 3, 4), PERM(0, 1, 2));
    test_permute(dev, CH_F32, SHAPE(17, 31), PERM(1, 0));
    test_permute(dev, CH_F32, SHAPE(1), PERM(0));
    test_permute(dev, CH_F32, SHAPE(1, 3, 1, 5), PERM(3, 2, 1, 0));
    test_permute(dev, CH_F32, SHAPE(1, 3, 1, 5), PERM(2, 0, 1, 3));
    test_permute(dev, CH_F32, SHAPE(2, 1, 3, 2, 1, 2, 3, 2), PERM(7, 6, 5, 4, 3, 2, 1, 0));
    test_permute(dev, CH_F32, SHAPE(2, 1, 3, 2, 1, 2, 3, 2), PERM(1, 3, 5, 7, 0, 2, 4, 6));
    /* Attention: the fused projection [B, T, 3, H, hd] -> [3, B, H, T, hd]
     * (q, k, v by heads), the heads [B, H, T, hd] -> [B, T, H, hd] back
     * together, and the way there for the gradient. */
    test_permute(dev, CH_F32, SHAPE(2, 5, 3, 4, 8), PERM(2, 0, 3, 1, 4));
    test_permute(dev, CH_F32, SHAPE(2, 4, 5, 8), PERM(0, 2, 1, 3));
    test_permute(dev, CH_F32, SHAPE(3, 2, 4, 5, 8), PERM(1, 3, 0, 2, 4));
    test_permute(dev, CH_F32, SHAPE(3, 7, 1, 13, 1), PERM(2, 0, 3, 1, 4));
    /* Past the host's threshold for threads (131072 elements); small
     * sizes: a few work-groups. */
    if (tc_small()) {
        test_permute(dev, CH_F32, SHAPE(2, 16, 3, 2, 8), PERM(2, 0, 3, 1, 4));
        test_permute(dev, CH_F32, SHAPE(33, 65), PERM(1, 0));
    } else {
        test_permute(dev, CH_F32, SHAPE(8, 64, 3, 4, 32), PERM(2, 0, 3, 1, 4));
        test_permute(dev, CH_F32, SHAPE(257, 513), PERM(1, 0));
    }
    test_permute(dev, CH_I32, SHAPE(2, 5, 3, 4, 8), PERM(2, 0, 3, 1, 4));
    test_permute(dev, CH_I32, SHAPE(7, 9), PERM(1, 0));
    test_permute(dev, CH_I32, SHAPE(3, 4, 5, 6), PERM(3, 1, 2, 0));
}

/* ---- Softmax -------------------------------------------------------------------- */

/* The columns row r of x [..., t, s] keeps. */
static int64_t kept(int64_t r, int64_t s, int64_t t, int causal)
{
    return causal ? r % t + s - t + 1 : s;
}

/* y = softmax of each row's kept columns, 0 beyond; mag (may be NULL) the
 * error scale of each probability p: p (1 + |x - max|), as an f32
 * rounding of the exponent moves p that much relative to it; 0 where
 * masked, so that only an exact 0 passes there. */
static void ref_softmax(double *y, double *mag, const float *x, int64_t rows, int64_t s,
                        int64_t t, int causal)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * s;
        int64_t w = kept(r, s, t, causal);
        double max = xr[0], sum = 0.0;
        for (int64_t j = 1; j < w; j++)
            max = fmax(max, xr[j]);
        for (int64_t j = 0; j < w; j++)
            sum += exp(xr[j] - max);
        for (int64_t j = 0; j < s; j++) {
            double p = j < w ? exp(xr[j] - max) / sum : 0.0;
            y[r * s + j] = p;
            if (mag)
                mag[r * s + j] = p > 0.0 ? p * (1.0 + fabs(xr[j] - max)) : 0.0;
        }
    }
}

static void test_softmax(ch_device *dev, int ndim, const int64_t *shape, int causal, float lo,
                         float hi, int in_place)
{
    char sh[64];
    tcase c;
    ref_shape_str(sh, sizeof sh, ndim, shape);
    tc_begin(&c, dev, "softmax%s %s x in [%g, %g)%s", causal ? " causal" : "", sh, lo, hi,
             in_place ? " in place" : "");
    int64_t n = ref_numel(ndim, shape), s = shape[ndim - 1];
    int64_t t = ndim >= 2 ? shape[ndim - 2] : 1;
    float *x = tc_random(&c, n, lo, hi);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *ty = in_place ? tx : tc_tensor(&c, CH_F32, ndim, shape, tc_random(&c, n, 5, 9));
    TC(&c, ch_softmax(ty, tx, causal));
    double *want = tc_doubles(&c, n), *mag = tc_doubles(&c, n);
    ref_softmax(want, mag, x, n / s, s, t, causal);
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, n), want, mag, n), TOL_SUM);
}

/* Entries of -inf (a mask of the caller's own) get probability 0 like
 * masked ones, the others share 1; every row keeps a finite entry. */
static void test_softmax_neg_inf(ch_device *dev, int64_t rows, int64_t s, int causal)
{
    tcase c;
    tc_begin(&c, dev, "softmax%s [%" PRId64 ",%" PRId64 "] with -inf entries",
             causal ? " causal" : "", rows, s);
    float *x = tc_random(&c, rows * s, -4, 4);
    for (int64_t i = 0; i < rows * s; i++)
        if (i % s > 0 && tap_rng_next(&c.rng) % 3 == 0)
            x[i] = -INFINITY;
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(rows, s), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(rows, s), NULL);
    TC(&c, ch_softmax(ty, tx, causal));
    double *want = tc_doubles(&c, rows * s), *mag = tc_doubles(&c, rows * s);
    ref_softmax(want, mag, x, rows, s, rows, causal);
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, rows * s), want, mag, rows * s), TOL_SUM);
}

static void test_softmaxes(ch_device *dev)
{
    test_softmax(dev, SHAPE(1), 0, -1, 1, 0);
    test_softmax(dev, SHAPE(1, 1), 1, -1, 1, 0);
    test_softmax(dev, SHAPE(3, 7), 0, -3, 3, 0);
    test_softmax(dev, SHAPE(13, 10), 0, -5, 5, 1);
    test_softmax(dev, SHAPE(2, 3, 5, 5), 1, -4, 4, 0);
    test_softmax(dev, SHAPE(2, 4, 17, 17), 1, -4, 4, 1);
    /* S > T: the rows see the S - T columns before the matrix as well. */
    test_softmax(dev, SHAPE(2, 5, 9), 1, -4, 4, 0);
    test_softmax(dev, SHAPE(3, 1, 4), 1, -4, 4, 0);
    /* Rows longer than a work-group of 256; large values, both signs. */
    test_softmax(dev, SHAPE(3, 300), 0, -8, 8, 0);
    if (tc_small())
        test_softmax(dev, SHAPE(1, 3, 300), 1, -8, 8, 0);
    else
        test_softmax(dev, SHAPE(1, 260, 260), 1, -8, 8, 0);
    test_softmax(dev, SHAPE(5, 17), 0, 70, 90, 0);
    test_softmax(dev, SHAPE(4, 9, 9), 1, -80, 80, 0);
    /* A small GPT's attention: [B, H, T, T], past the host's threshold
     * (small sizes: one sample of two heads). */
    if (tc_small())
        test_softmax(dev, SHAPE(1, 2, 64, 64), 1, -6, 6, 0);
    else
        test_softmax(dev, SHAPE(8, 4, 64, 64), 1, -6, 6, 0);
    test_softmax_neg_inf(dev, 9, 13, 0);
    test_softmax_neg_inf(dev, 13, 13, 1);
}

/* x random, y its softmax (as f32, the mask's zeros included). */
static float *softmax_of(tcase *c, const float *x, int64_t rows, int64_t s, int64_t t,
                         int causal)
{
    int64_t n = rows * s;
    double *p = tc_doubles(c, n);
    float *y = tc_floats(c, n);
    ref_softmax(p, NULL, x, rows, s, t, causal);
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)p[i];
    return y;
}

static void test_softmax_backward(ch_device *dev, int ndim, const int64_t *shape, int causal,
                                  int in_place)
{
    char sh[64];
    tcase c;
    ref_shape_str(sh, sizeof sh, ndim, shape);
    tc_begin(&c, dev, "softmax_backward%s %s%s", causal ? " (causal y)" : "", sh,
             in_place ? " in place dx = dy" : "");
    int64_t n = ref_numel(ndim, shape), s = shape[ndim - 1];
    int64_t t = ndim >= 2 ? shape[ndim - 2] : 1, rows = n / s;
    float *y = softmax_of(&c, tc_random(&c, n, -4, 4), rows, s, t, causal);
    float *dy = tc_random(&c, n, -1, 1);
    ch_tensor *ty = tc_tensor(&c, CH_F32, ndim, shape, y);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, ndim, shape, dy);
    ch_tensor *tdx = in_place ? tdy : tc_tensor(&c, CH_F32, ndim, shape, tc_random(&c, n, 5, 9));
    TC(&c, ch_softmax_backward(tdx, tdy, ty));
    double *want = tc_doubles(&c, n), *mag = tc_doubles(&c, n);
    for (int64_t r = 0; r < rows; r++) {
        const float *g = dy + r * s, *p = y + r * s;
        double dot = 0.0, dot_abs = 0.0;
        for (int64_t j = 0; j < s; j++) {
            dot += (double)g[j] * p[j];
            dot_abs += fabs((double)g[j] * p[j]);
        }
        for (int64_t j = 0; j < s; j++) {
            want[r * s + j] = p[j] * (g[j] - dot);
            mag[r * s + j] = fabs(p[j]) * (fabs(g[j]) + dot_abs);
        }
    }
    tc_end_err(&c, ref_err(tc_fetch(&c, tdx, n), want, mag, n), TOL_SUM);
}

static void test_softmax_backwards(ch_device *dev)
{
    test_softmax_backward(dev, SHAPE(1), 0, 0);
    test_softmax_backward(dev, SHAPE(13, 10), 0, 0);
    test_softmax_backward(dev, SHAPE(2, 4, 17, 17), 1, 0);
    test_softmax_backward(dev, SHAPE(2, 5, 9), 1, 1);
    test_softmax_backward(dev, SHAPE(3, 300), 0, 1);
    if (tc_small())
        test_softmax_backward(dev, SHAPE(1, 2, 64, 64), 1, 0);
    else
        test_softmax_backward(dev, SHAPE(8, 4, 64, 64), 1, 0);
}

typedef struct softmax_setup {
    ch_tensor *ty;
    const float *g;
    float *y; /* scratch for softmax(x) */
    int64_t n;
    int causal;
} softmax_setup;

/* <softmax(x), g> for x = values. */
static double softmax_objective(tcase *c, const void *sv, ch_tensor *tx, const float *values)
{
    const softmax_setup *s = sv;
    tc_upload(c, tx, values);
    TC(c, ch_softmax(s->ty, tx, s->causal));
    tc_download(c, s->ty, s->y, s->n);
    return ref_dot(s->y, s->g, s->n);
}

/* ch_softmax_backward(g, y) is the gradient of <softmax(x), g>: zero
 * where the mask hides x. */
static void grad_softmax(ch_device *dev, int ndim, const int64_t *shape, int causal)
{
    char sh[64];
    tcase c;
    ref_shape_str(sh, sizeof sh, ndim, shape);
    tc_begin(&c, dev, "softmax_backward%s %s vs central differences, h %g",
             causal ? " causal" : "", sh, FD_STEP);
    int64_t n = ref_numel(ndim, shape);
    float *x = tc_random(&c, n, -2, 2), *g = tc_random(&c, n, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, ndim, shape, NULL);
    ch_tensor *tg = tc_tensor(&c, CH_F32, ndim, shape, g);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, ndim, shape, NULL);
    TC(&c, ch_softmax(ty, tx, causal));
    TC(&c, ch_softmax_backward(tdx, tg, ty));
    double *got = tc_widen(&c, tc_fetch(&c, tdx, n), n), *want = tc_doubles(&c, n);
    softmax_setup s = {ty, g, tc_floats(&c, n), n, causal};
    tc_central_diff(&c, softmax_objective, &s, tx, x, n, FD_STEP, want);
    tc_end_err(&c, ref_err_scaled(got, want, n, 1e-6), TOL_FD);
}

/* ---- Fused causal attention -------------------------------------------------- */

/* The count of the n floats of t that differ, as bits, from want. */
static int64_t bits_differ(tcase *c, const ch_tensor *t, const float *want, int64_t n)
{
    const float *got = tc_fetch(c, t, n);
    int64_t differ = 0;
    for (int64_t i = 0; i < n; i++)
        differ += memcmp(&got[i], &want[i], sizeof *got) != 0;
    return differ;
}

/* ch_attention and ch_attention_backward over b matrices [t, hd] against
 * the reference: o element by element (TOL_SUM of its error scale), lse
 * within TOL_SUM of max(1, |lse|), each gradient within TOL_SUM of its
 * largest entry (the backward takes the device's own o and lse). Run a
 * second time, both give the same bits: no sum depends on how the
 * device schedules its work (not at small sizes, which a simulator
 * runs). */
static void test_attention(ch_device *dev, int64_t b, int64_t t, int64_t hd, float lo, float hi)
{
    tcase c;
    tc_begin(&c, dev,
             "attention and its backward, %" PRId64 " matrices [%" PRId64 ", %" PRId64
             "], q, k, v in [%g, %g)",
             b, t, hd, lo, hi);
    int64_t n = b * t * hd;
    float scale = (float)(1.0 / sqrt((double)hd));
    float *q = tc_random(&c, n, lo, hi), *k = tc_random(&c, n, lo, hi);
    float *v = tc_random(&c, n, -1, 1), *dout = tc_random(&c, n, -1, 1);
    ch_tensor *tq = tc_tensor(&c, CH_F32, SHAPE(b, t, hd), q);
    ch_tensor *tk = tc_tensor(&c, CH_F32, SHAPE(b, t, hd), k);
    ch_tensor *tv = tc_tensor(&c, CH_F32, SHAPE(b, t, hd), v);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(b, t, hd), dout);
    ch_tensor *to = tc_tensor(&c, CH_F32, SHAPE(b, t, hd), tc_random(&c, n, 5, 9));
    ch_tensor *tl = tc_tensor(&c, CH_F32, SHAPE(b, t), tc_random(&c, b * t, 5, 9));
    ch_tensor *td[3];
    for (int i = 0; i < 3; i++)
        td[i] = tc_tensor(&c, CH_F32, SHAPE(b, t, hd), tc_random(&c, n, 5, 9));
    TC(&c, ch_attention(to, tl, tq, tk, tv, scale));
    TC(&c, ch_attention_backward(td[0], td[1], td[2], tg, tq, tk, tv, to, tl, scale));
    attn_ref r = {tc_doubles(&c, n), tc_doubles(&c, n), tc_doubles(&c, b * t),
                  tc_doubles(&c, n), tc_doubles(&c, n), tc_doubles(&c, n)};
    ref_attention(&r, q, k, v, dout, b, t, hd, scale, tc_doubles(&c, t * t), tc_doubles(&c, t));
    double err[3] = {ref_err(tc_fetch(&c, to, n), r.o, r.mag, n), 0.0, 0.0};
    const float *lse = tc_fetch(&c, tl, b * t);
    for (int64_t i = 0; i < b * t; i++)
        err[1] = fmax(err[1], fabs(lse[i] - r.lse[i]) / fmax(1.0, fabs(r.lse[i])));
    double *want[3] = {r.dq, r.dk, r.dv};
    for (int i = 0; i < 3; i++)
        err[2] =
            fmax(err[2], ref_err_scaled(tc_widen(&c, tc_fetch(&c, td[i], n), n), want[i], n, 1e-6));
    tap_diag("%s: o %.2e, lse %.2e, dq dk dv %.2e", ch_device_id(dev), err[0], err[1], err[2]);
    if (!tc_small()) {
        ch_tensor *again[5] = {tc_tensor(&c, CH_F32, SHAPE(b, t, hd), NULL),
                               tc_tensor(&c, CH_F32, SHAPE(b, t), NULL)};
        for (int i = 2; i < 5; i++)
            again[i] = tc_tensor(&c, CH_F32, SHAPE(b, t, hd), NULL);
        TC(&c, ch_attention(again[0], again[1], tq, tk, tv, scale));
        TC(&c, ch_attention_backward(again[2], again[3], again[4], tg, tq, tk, tv, again[0],
                                     again[1], scale));
        const ch_tensor *first[5] = {to, tl, td[0], td[1], td[2]};
        int64_t differ = 0;
        for (int i = 0; i < 5; i++) {
            int64_t count = i == 1 ? b * t : n;
            differ += bits_differ(&c, again[i], tc_fetch(&c, first[i], count), count);
        }
        tap_diag("%s: %" PRId64 " values differ on a second run", ch_device_id(dev), differ);
        if (differ)
            err[0] = INFINITY;
    }
    tc_end_err(&c, fmax(err[0], fmax(err[1], err[2])), TOL_SUM);
}

/* x [b * heads, t, hd] (matrix (n, h) = n * heads + h) into part `part`
 * of a packed [b, t, parts * heads * hd] (parts 3: qkv, 1: o or dout), or
 * back (unpack). */
static void pack_heads(float *packed, float *sep, int64_t b, int64_t heads, int64_t t, int64_t hd,
                       int parts, int part, int unpack)
{
    int64_t d = heads * hd;
    for (int64_t n = 0; n < b; n++)
        for (int64_t h = 0; h < heads; h++)
            for (int64_t r = 0; r < t; r++)
                for (int64_t e = 0; e < hd; e++) {
                    float *pk = packed + (n * t + r) * parts * d + part * d + h * hd + e;
                    float *sp = sep + ((n * heads + h) * t + r) * hd + e;
                    if (unpack)
                        *sp = *pk;
                    else
                        *pk = *sp;
                }
}

/* ch_attention_packed and its backward on qkv [b, t, 3 heads hd] against
 * the reference on the heads taken apart, held as test_attention holds
 * ch_attention (every element of dqkv written: it starts at 5 to 9), and
 * against ch_attention on the separate heads, bit for bit (the same
 * kernel: only the rows' strides differ; not at small sizes).
 * With half CH_BF16, ch_attention_packed_mixed and its backward: within
 * TOL_BF16 of the same reference, and said whether they rounded (a CPU
 * without AMX, or a head size not a multiple of 32: the f32 results,
 * bit for bit). */
#define TOL_BF16 1e-2 /* 8 bits: the products' inputs to 2^-9; seen 3e-3 to 5e-3 */
static void test_attention_packed(ch_device *dev, int64_t b, int64_t heads, int64_t t, int64_t hd,
                                  float lo, float hi, ch_dtype half)
{
    tcase c;
    tc_begin(&c, dev,
             "attention_packed%s and its backward, qkv [%" PRId64 ", %" PRId64 ", 3 x %" PRId64
             " x %" PRId64 "], q, k in [%g, %g)",
             half == CH_BF16 ? "_mixed (bf16)" : "", b, t, heads, hd, lo, hi);
    int64_t bh = b * heads, n = bh * t * hd, d = heads * hd;
    float scale = (float)(1.0 / sqrt((double)hd));
    float *sep[3] = {tc_random(&c, n, lo, hi), tc_random(&c, n, lo, hi), tc_random(&c, n, -1, 1)};
    float *dout = tc_random(&c, n, -1, 1), *qkv = tc_random(&c, 3 * n, 0, 1),
          *dpacked = tc_random(&c, n, 0, 1);
    for (int i = 0; i < 3; i++)
        pack_heads(qkv, sep[i], b, heads, t, hd, 3, i, 0);
    pack_heads(dpacked, dout, b, heads, t, hd, 1, 0, 0);
    ch_tensor *tqkv = tc_tensor(&c, CH_F32, SHAPE(b, t, 3 * d), qkv);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(b, t, d), dpacked);
    ch_tensor *to = tc_tensor(&c, CH_F32, SHAPE(b, t, d), tc_random(&c, n, 5, 9));
    ch_tensor *tl = tc_tensor(&c, CH_F32, SHAPE(b, heads, t), tc_random(&c, bh * t, 5, 9));
    ch_tensor *td = tc_tensor(&c, CH_F32, SHAPE(b, t, 3 * d), tc_random(&c, 3 * n, 5, 9));
    if (half == CH_F32) {
        TC(&c, ch_attention_packed(to, tl, tqkv, (int)heads, scale));
        TC(&c, ch_attention_packed_backward(td, tg, tqkv, to, tl, (int)heads, scale));
    } else {
        TC(&c, ch_attention_packed_mixed(to, tl, tqkv, (int)heads, scale, half));
        TC(&c, ch_attention_packed_mixed_backward(td, tg, tqkv, to, tl, (int)heads, scale, half));
    }
    attn_ref r = {tc_doubles(&c, n), tc_doubles(&c, n), tc_doubles(&c, bh * t),
                  tc_doubles(&c, n), tc_doubles(&c, n), tc_doubles(&c, n)};
    ref_attention(&r, sep[0], sep[1], sep[2], dout, bh, t, hd, scale, tc_doubles(&c, t * t),
                  tc_doubles(&c, t));
    float *o = tc_random(&c, n, 0, 1), *dsep[3];
    pack_heads(tc_fetch(&c, to, n), o, b, heads, t, hd, 1, 0, 1);
    const float *lse = tc_fetch(&c, tl, bh * t), *dqkv = tc_fetch(&c, td, 3 * n);
    double err[3] = {ref_err(o, r.o, r.mag, n), 0.0, 0.0};
    for (int64_t i = 0; i < bh * t; i++)
        err[1] = fmax(err[1], fabs(lse[i] - r.lse[i]) / fmax(1.0, fabs(r.lse[i])));
    double *want[3] = {r.dq, r.dk, r.dv};
    for (int i = 0; i < 3; i++) {
        dsep[i] = tc_random(&c, n, 0, 1);
        pack_heads((float *)dqkv, dsep[i], b, heads, t, hd, 3, i, 1);
        err[2] = fmax(err[2], ref_err_scaled(tc_widen(&c, dsep[i], n), want[i], n, 1e-6));
    }
    tap_diag("%s: o %.2e, lse %.2e, dqkv %.2e", ch_device_id(dev), err[0], err[1], err[2]);
    if (half != CH_F32) {
        /* the f32 kernel on the same inputs: the same bits, or rounded */
        ch_tensor *fo = tc_tensor(&c, CH_F32, SHAPE(b, t, d), NULL),
                  *fl = tc_tensor(&c, CH_F32, SHAPE(b, heads, t), NULL);
        TC(&c, ch_attention_packed(fo, fl, tqkv, (int)heads, scale));
        int64_t differ = bits_differ(&c, fo, tc_fetch(&c, to, n), n);
        tap_diag("%s: %s (%" PRId64 " of %" PRId64 " outputs differ from the f32 kernel's)",
                 ch_device_id(dev), differ ? "products in bf16" : "products in f32", differ, n);
        /* a head size that is not a multiple of 32: the f32 kernel, promised bit for bit */
        if (hd % 32 != 0 && differ)
            err[0] = INFINITY;
        tc_end_err(&c, fmax(err[0], fmax(err[1], err[2])), TOL_BF16);
        return;
    }
    if (!tc_small()) {
        /* The same kernel on the heads apart: the same bits. */
        ch_tensor *ts[3], *tso = tc_tensor(&c, CH_F32, SHAPE(bh, t, hd), NULL),
                          *tsl = tc_tensor(&c, CH_F32, SHAPE(bh, t), NULL), *tsd[3];
        for (int i = 0; i < 3; i++) {
            ts[i] = tc_tensor(&c, CH_F32, SHAPE(bh, t, hd), sep[i]);
            tsd[i] = tc_tensor(&c, CH_F32, SHAPE(bh, t, hd), NULL);
        }
        ch_tensor *tsg = tc_tensor(&c, CH_F32, SHAPE(bh, t, hd), dout);
        TC(&c, ch_attention(tso, tsl, ts[0], ts[1], ts[2], scale));
        TC(&c, ch_attention_backward(tsd[0], tsd[1], tsd[2], tsg, ts[0], ts[1], ts[2], tso, tsl,
                                     scale));
        int64_t differ = bits_differ(&c, tso, o, n) + bits_differ(&c, tsl, lse, bh * t);
        for (int j = 0; j < 3; j++)
            differ += bits_differ(&c, tsd[j], dsep[j], n);
        tap_diag("%s: %" PRId64 " values differ from ch_attention's on the heads apart",
                 ch_device_id(dev), differ);
        if (differ)
            err[0] = INFINITY;
    }
    tc_end_err(&c, fmax(err[0], fmax(err[1], err[2])), TOL_SUM);
}

/* Whether ch_fallback_get lists `op` run on the host for dev. */
static int fell_back(const ch_device *dev, const char *op)
{
    for (int i = 0; i < ch_fallback_count(); i++) {
        ch_fallback_info f;
        if (ch_fallback_get(i, &f) == CH_OK && strcmp(f.device, ch_device_id(dev)) == 0 &&
            strcmp(f.op, op) == 0)
            return 1;
    }
    return 0;
}

/* Shapes across the 64 by 64 tiles (130 and 129 rows: a tile of one or
 * two; 67 and 45: part of a tile), the head sizes with kernels of their
 * own on CUDA and OpenCL (16, 32, 64, 128) and others up to the largest
 * (256), a head size of 1, heads side by side in rows longer than a head
 * (qkv's rows 3 heads hd, o's heads hd), and large scores (q, k in
 * [-4, 4), scores up to 16 hd^0.5), where the running maximum moves by
 * tens from tile to tile and the sum must follow it. Small sizes (a
 * simulator runs every work-item of the device's kernels): fewer rows,
 * still across a tile of 64 or of OpenCL's 16 rows at a head size of 256,
 * and one case in bf16. */
static void test_attentions(ch_device *dev)
{
    int small = tc_small();
    int64_t t129 = small ? 70 : 129;
    test_attention(dev, 1, 1, 1, -1, 1);
    test_attention(dev, 2, 5, 3, -1, 1);
    test_attention(dev, 3, 64, 16, -1, 1);
    test_attention(dev, 2, 130, 8, -2, 2);
    test_attention(dev, 1, t129, 64, -4, 4);
    test_attention(dev, small ? 1 : 2, small ? 40 : 67, 128, -2, 2);
    test_attention(dev, 1, 3, 256, -1, 1);
    if (!small)
        test_attention(dev, 4, 256, 64, -1, 1);
    test_attention_packed(dev, 1, 1, 1, 1, -1, 1, CH_F32);
    test_attention_packed(dev, 2, 3, 5, 4, -1, 1, CH_F32);
    test_attention_packed(dev, 2, 4, 70, 16, -2, 2, CH_F32);
    test_attention_packed(dev, 2, 2, 33, 32, -2, 2, CH_F32);
    test_attention_packed(dev, 1, 2, t129, 64, -4, 4, CH_F32);
    test_attention_packed(dev, 1, small ? 2 : 3, small ? 20 : 45, 256, -1, 1, CH_F32);
    if (!small) {
        test_attention_packed(dev, 2, 2, 100, 32, -1, 1, CH_BF16);
        test_attention_packed(dev, 1, 2, 129, 64, -2, 2, CH_BF16);
    }
    test_attention_packed(dev, 1, 2, 70, 16, -1, 1, CH_BF16);
    /* Every backend has the kernel (the host, CUDA, OpenCL): a fallback
     * would be listed by ch_fallback_get (main quiets its note on
     * stderr). */
    tap_ok(!fell_back(dev, "attention") && !fell_back(dev, "attention_backward"),
           "%s: ch_attention, ch_attention_packed and their backwards ran on the backend's own "
           "kernel (no fallback listed)",
           ch_device_id(dev));
}

/* ---- Embedding ------------------------------------------------------------------ */

static int32_t *random_indices(tcase *c, int64_t n, int64_t v)
{
    int32_t *idx = tc_ints(c, n);
    for (int64_t i = 0; i < n; i++)
        idx[i] = (int32_t)(tap_rng_next(&c->rng) % (uint64_t)v);
    return idx;
}

/* want = the table's rows idx names, 0 for an index out of range. */
static float *gathered(tcase *c, const float *table, const int32_t *idx, int64_t n, int64_t v,
                       int64_t d)
{
    float *want = tc_floats(c, n * d);
    for (int64_t i = 0; i < n; i++)
        if (idx[i] >= 0 && idx[i] < v)
            memcpy(want + i * d, table + idx[i] * d, (size_t)d * sizeof *want);
    return want;
}

/* idx of shape [n] or, with rows > 1, [rows, n / rows] (a batch of
 * sequences: y [rows, n / rows, d]). */
static void test_embedding(ch_device *dev, int64_t rows, int64_t n, int64_t v, int64_t d)
{
    tcase c;
    tc_begin(&c, dev, "embedding %" PRId64 " indices (%" PRId64 " rows) of a [%" PRId64
             ", %" PRId64 "] table", n, rows, v, d);
    float *table = tc_random(&c, v * d, -1, 1);
    int32_t *idx = random_indices(&c, n, v);
    ch_tensor *tt = tc_tensor(&c, CH_F32, SHAPE(v, d), table);
    ch_tensor *ti = rows > 1 ? tc_tensor(&c, CH_I32, SHAPE(rows, n / rows), idx)
                             : tc_tensor(&c, CH_I32, SHAPE(n), idx);
    ch_tensor *ty = rows > 1 ? tc_tensor(&c, CH_F32, SHAPE(rows, n / rows, d), NULL)
                             : tc_tensor(&c, CH_F32, SHAPE(n, d), NULL);
    TC(&c, ch_embedding(ty, tt, ti));
    tc_end_words(&c, tc_fetch(&c, ty, n * d), gathered(&c, table, idx, n, v, d), n * d, 1);
}

/* `st` is CH_ERR_INVALID_ARGUMENT naming idx[pos] = index. */
static int names_index(ch_status st, int64_t pos, int32_t index, char *detail, size_t len)
{
    char want[64];
    snprintf(want, sizeof want, "idx[%" PRId64 "] = %d", pos, (int)index);
    const char *err = ch_last_error();
    int ok = st == CH_ERR_INVALID_ARGUMENT && strstr(err, want) != NULL;
    snprintf(detail, len, "got %s \"%s\", want %s naming \"%s\"", ch_status_str(st), err,
             ch_status_str(CH_ERR_INVALID_ARGUMENT), want);
    return ok;
}

/* idx[pos] = bad (and idx[pos2] = bad2 after it when pos2 >= 0): refused,
 * from the call or the stream's next wait (tap_settled), naming the first,
 * the rows of the bad indices 0 and the others gathered; good indices then
 * pass on the same tensors. */
static void test_bad_index(ch_device *dev, int64_t n, int64_t v, int64_t d, int64_t pos,
                           int32_t bad, int64_t pos2, int32_t bad2)
{
    char detail[1024] = "";
    tcase c;
    tc_begin(&c, dev, "embedding of %" PRId64 " indices into %" PRId64 " rows, idx[%" PRId64
             "] = %d%s", n, v, pos, (int)bad, pos2 >= 0 ? " and a later one" : "");
    float *table = tc_random(&c, v * d, -1, 1);
    int32_t *idx = random_indices(&c, n, v);
    idx[pos] = bad;
    if (pos2 >= 0)
        idx[pos2] = bad2;
    ch_tensor *tt = tc_tensor(&c, CH_F32, SHAPE(v, d), table);
    ch_tensor *ti = tc_tensor(&c, CH_I32, SHAPE(n), idx);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, d), tc_random(&c, n * d, 5, 9));
    int ok = 0;
    if (c.st == CH_OK) {
        ch_clear_error();
        ch_status st = tap_settled(ch_embedding(ty, tt, ti), ty);
        ok = names_index(st, pos, bad, detail, sizeof detail);
    }
    const float *got = tc_fetch(&c, ty, n * d);
    if (ok && ref_diff_words(got, gathered(&c, table, idx, n, v, d), n * d, 1, detail,
                             sizeof detail) != 0) {
        ok = 0;
        tc_append(&c, " (y: good rows gathered, bad rows 0)");
    }
    tc_upload(&c, ti, random_indices(&c, n, v));
    TC(&c, ch_embedding(ty, tt, ti));
    /* Nothing left to report: a deferred error is told once. */
    TC(&c, ch_device_sync(dev));
    if (ok)
        snprintf(detail, sizeof detail, "refused, naming it, bad rows 0; then good indices pass");
    tc_end_exact(&c, ok, detail);
}

static void test_bad_indices(ch_device *dev)
{
    const int64_t n = 13, v = 10, d = 3;
    const int64_t pos[] = {0, n / 2, n - 1};
    for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++) {
        test_bad_index(dev, n, v, d, pos[i], -1, -1, 0);
        test_bad_index(dev, n, v, d, pos[i], (int32_t)v, -1, 0);
    }
    test_bad_index(dev, n, v, d, 4, (int32_t)v, 9, -1);
    test_bad_index(dev, 1031, 3, 5, 1030, 3, -1, 0);
    test_bad_index(dev, 1031, 3, 5, 700, INT32_MIN, 1000, INT32_MAX);
}

/* dtable0 plus, for each row, the dy rows of its indices summed in f32 in
 * increasing position, then added: what ops.h promises, so every backend
 * must give these bits exactly (the sums hold additions only). */
static float *ref_embedding_backward(tcase *c, const float *dtable0, const float *dy,
                                     const int32_t *idx, int64_t n, int64_t v, int64_t d)
{
    float *want = tc_floats(c, v * d), *sum = tc_floats(c, d);
    memcpy(want, dtable0, (size_t)(v * d) * sizeof *want);
    for (int64_t r = 0; r < v; r++) {
        int any = 0;
        memset(sum, 0, (size_t)d * sizeof *sum);
        for (int64_t i = 0; i < n; i++)
            if (idx[i] == r) {
                any = 1;
                for (int64_t j = 0; j < d; j++)
                    sum[j] += dy[i * d + j];
            }
        for (int64_t j = 0; any && j < d; j++)
            want[r * d + j] += sum[j];
    }
    return want;
}

/* `bad` of the indices (spread evenly) out of range: they add nothing. */
static void test_embedding_backward(ch_device *dev, int64_t n, int64_t v, int64_t d, int64_t bad)
{
    tcase c;
    tc_begin(&c, dev, "embedding_backward %" PRId64 " indices (%" PRId64 " out of range) into "
             "[%" PRId64 ", %" PRId64 "], bit for bit: sums in increasing position", n, bad, v,
             d);
    float *dtable0 = tc_random(&c, v * d, -1, 1), *dy = tc_random(&c, n * d, -1, 1);
    int32_t *idx = random_indices(&c, n, v);
    for (int64_t b = 0; b < bad; b++)
        idx[b * n / bad] = b % 2 ? (int32_t)v : -1 - (int32_t)b;
    ch_tensor *tdt = tc_tensor(&c, CH_F32, SHAPE(v, d), dtable0);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, d), dy);
    ch_tensor *ti = tc_tensor(&c, CH_I32, SHAPE(n), idx);
    TC(&c, ch_embedding_backward(tdt, tdy, ti));
    tc_end_words(&c, tc_fetch(&c, tdt, v * d),
                 ref_embedding_backward(&c, dtable0, dy, idx, n, v, d), v * d, 1);
}

/* The backward is the gather's adjoint: <embedding(T), dy> == <T, dT>
 * with dT summed into zeros. */
static void grad_embedding(ch_device *dev, int64_t n, int64_t v, int64_t d)
{
    tcase c;
    tc_begin(&c, dev, "embedding_backward adjoint of embedding, %" PRId64 " indices into [%"
             PRId64 ", %" PRId64 "]", n, v, d);
    float *table = tc_random(&c, v * d, -1, 1), *dy = tc_random(&c, n * d, -1, 1);
    int32_t *idx = random_indices(&c, n, v);
    ch_tensor *tt = tc_tensor(&c, CH_F32, SHAPE(v, d), table);
    ch_tensor *ti = tc_tensor(&c, CH_I32, SHAPE(n), idx);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, d), NULL);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, d), dy);
    ch_tensor *tdt = tc_tensor(&c, CH_F32, SHAPE(v, d), NULL);
    TC(&c, ch_fill(tdt, 0.0));
    TC(&c, ch_embedding(ty, tt, ti));
    TC(&c, ch_embedding_backward(tdt, tdy, ti));
    float *y = tc_fetch(&c, ty, n * d), *dt = tc_fetch(&c, tdt, v * d);
    tc_end_adjoint(&c, ref_dot(y, dy, n * d), ref_dot(table, dt, v * d),
                   ref_dot_abs(y, dy, n * d), TOL_ADJOINT);
}

static void test_embeddings(ch_device *dev)
{
    test_embedding(dev, 1, 1, 1, 1);
    test_embedding(dev, 1, 17, 5, 3);
    test_embedding(dev, 1, 300, 7, 33);
    test_embedding(dev, 4, 64, 64, 300);
    if (!tc_small())
        test_embedding(dev, 32, 2048, 256, 128);
    test_bad_indices(dev);
    test_embedding_backward(dev, 1, 1, 1, 0);
    test_embedding_backward(dev, 17, 5, 3, 0);
    test_embedding_backward(dev, 300, 7, 33, 0);
    test_embedding_backward(dev, 50, 1000, 4, 0);
    test_embedding_backward(dev, 64, 9, 300, 5);
    if (tc_small())
        test_embedding_backward(dev, 300, 40, 17, 7);
    else
        test_embedding_backward(dev, 2048, 256, 65, 7);
    /* One row's run through the whole batch; runs longer than a work-group
     * (OpenCL sorts the positions, and sorts beyond a work-group's chunk
     * across work-groups). */
    test_embedding_backward(dev, 1000, 1, 3, 0);
    test_embedding_backward(dev, 5000, 3, 2, 9);
    if (!tc_small())
        test_embedding_backward(dev, 20000, 5000, 3, 11);
    grad_embedding(dev, 17, 5, 3);
    grad_embedding(dev, 300, 64, 33);
}

/* ---- Global average pooling ----------------------------------------------------- */

static void test_avgpool(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w, int y4d)
{
    tcase c;
    tc_begin(&c, dev, "avgpool_global x [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
             "] -> y %s", n, ch, h, w, y4d ? "[N,C,1,1]" : "[N,C]");
    int64_t planes = n * ch, hw = h * w;
    float *x = tc_random(&c, planes * hw, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *ty = y4d ? tc_tensor(&c, CH_F32, SHAPE(n, ch, 1, 1), NULL)
                        : tc_tensor(&c, CH_F32, SHAPE(n, ch), NULL);
    TC(&c, ch_avgpool_global(ty, tx));
    double *want = tc_doubles(&c, planes), *mag = tc_doubles(&c, planes);
    for (int64_t p = 0; p < planes; p++) {
        double s = 0.0, a = 0.0;
        for (int64_t i = 0; i < hw; i++) {
            s += x[p * hw + i];
            a += fabs(x[p * hw + i]);
        }
        want[p] = s / (double)hw;
        mag[p] = a / (double)hw;
    }
    tc_end_err(&c, ref_err(tc_fetch(&c, ty, planes), want, mag, planes), TOL_SUM);
}

/* dx = dy / (H W) over each plane (dx's old content overwritten). */
static void test_avgpool_backward(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w)
{
    tcase c;
    tc_begin(&c, dev, "avgpool_global_backward dx [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
             "]", n, ch, h, w);
    int64_t planes = n * ch, hw = h * w;
    float *dy = tc_random(&c, planes, -1, 1);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, ch), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), tc_random(&c, planes * hw, 5, 9));
    TC(&c, ch_avgpool_global_backward(tdx, tdy));
    double *want = tc_doubles(&c, planes * hw);
    for (int64_t i = 0; i < planes * hw; i++)
        want[i] = dy[i / hw] / (double)hw;
    tc_end_err(&c, ref_err(tc_fetch(&c, tdx, planes * hw), want, NULL, planes * hw), TOL_ROUND);
}

static void grad_avgpool(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w)
{
    tcase c;
    tc_begin(&c, dev, "avgpool_global_backward adjoint of avgpool_global x [%" PRId64 ",%"
             PRId64 ",%" PRId64 ",%" PRId64 "]", n, ch, h, w);
    int64_t planes = n * ch, nx = planes * h * w;
    float *x = tc_random(&c, nx, -1, 1), *dy = tc_random(&c, planes, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, ch), NULL);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, ch, 1, 1), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), NULL);
    TC(&c, ch_avgpool_global(ty, tx));
    TC(&c, ch_avgpool_global_backward(tdx, tdy));
    float *y = tc_fetch(&c, ty, planes), *dx = tc_fetch(&c, tdx, nx);
    tc_end_adjoint(&c, ref_dot(y, dy, planes), ref_dot(x, dx, nx), ref_dot_abs(y, dy, planes),
                   TOL_ADJOINT);
}

static void test_avgpools(ch_device *dev)
{
    test_avgpool(dev, 1, 1, 1, 1, 0);
    test_avgpool(dev, 2, 3, 5, 7, 0);
    test_avgpool(dev, 3, 5, 1, 1, 1);
    test_avgpool(dev, 4, 64, 8, 8, 1);
    /* Small sizes: fewer planes, as long. */
    int64_t planes_n = tc_small() ? 2 : 5, planes_c = tc_small() ? 5 : 33;
    test_avgpool(dev, planes_n, planes_c, 29, 31, 0);
    test_avgpool_backward(dev, 1, 1, 1, 1);
    test_avgpool_backward(dev, 2, 3, 5, 7);
    test_avgpool_backward(dev, planes_n, planes_c, 29, 31);
    grad_avgpool(dev, 2, 3, 5, 7);
    grad_avgpool(dev, 4, 64, 8, 8);
}

/* ---- Bad arguments ------------------------------------------------------------ */

/* The tensors the argument checks use, all on one device. */
typedef struct bad_args {
    ch_tensor *b3;    /* f32 [2, 3, 4] */
    ch_tensor *b3t;   /* f32 [2, 4, 3] */
    ch_tensor *b33;   /* f32 [2, 3, 3] */
    ch_tensor *c3;    /* f32 [3, 3, 4] */
    ch_tensor *m2;    /* f32 [3, 4] */
    ch_tensor *m4;    /* f32 [4, 4] */
    ch_tensor *i3;    /* i32 [2, 3, 4] */
    ch_tensor *idx;   /* i32 [3] */
    ch_tensor *emb;   /* f32 [3, 4]: y of idx gathered from m2 */
    ch_tensor *x4d;   /* f32 [2, 3, 5, 5] */
    ch_tensor *y2;    /* f32 [2, 3] */
    ch_tensor *row0;  /* rows [0, 3) of m4 */
    ch_tensor *row1;  /* rows [1, 4) of m4 */
} bad_args;

static int bad_args_new(bad_args *a, ch_device *dev)
{
    memset(a, 0, sizeof *a);
    struct {
        ch_tensor **t;
        ch_dtype dt;
        int ndim;
        int64_t shape[4];
    } all[] = {
        {&a->b3, CH_F32, 3, {2, 3, 4}}, {&a->b3t, CH_F32, 3, {2, 4, 3}},
        {&a->b33, CH_F32, 3, {2, 3, 3}}, {&a->c3, CH_F32, 3, {3, 3, 4}},
        {&a->m2, CH_F32, 2, {3, 4}},    {&a->m4, CH_F32, 2, {4, 4}},
        {&a->i3, CH_I32, 3, {2, 3, 4}}, {&a->idx, CH_I32, 1, {3}},
        {&a->emb, CH_F32, 2, {3, 4}},   {&a->x4d, CH_F32, 4, {2, 3, 5, 5}},
        {&a->y2, CH_F32, 2, {2, 3}},
    };
    ch_status st = CH_OK;
    for (size_t i = 0; i < sizeof all / sizeof all[0] && st == CH_OK; i++) {
        st = ch_tensor_new(all[i].t, dev, all[i].dt, all[i].ndim, all[i].shape);
        if (st == CH_OK)
            st = ch_fill(*all[i].t, 0.0);
    }
    if (st == CH_OK)
        st = ch_tensor_view(&a->row0, a->m4, 0, 3);
    if (st == CH_OK)
        st = ch_tensor_view(&a->row1, a->m4, 1, 3);
    return tap_status_ok(st, "tensors for the argument checks on %s", ch_device_id(dev));
}

static void bad_args_free(bad_args *a)
{
    ch_tensor *all[] = {a->row0, a->row1, a->b3, a->b3t, a->b33, a->c3, a->m2,
                        a->m4,   a->i3,   a->idx, a->emb, a->x4d, a->y2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ch_tensor_free(all[i]);
}

/* One claim: `call` fails with `want` and a message containing `needle`;
 * the message is cleared first so that a stale one cannot pass. */
#define REFUSED(call, want, needle, what) \
    (ch_clear_error(), tap_status_is((call), (want), (needle), "%s", (what)))

static void bad_gemm_batched(const bad_args *a)
{
    REFUSED(ch_gemm_batched(NULL, 0, 0, 1, a->b3, a->b3t, 0), CH_ERR_INVALID_ARGUMENT,
            "ch_gemm_batched: c is NULL", "ch_gemm_batched: c NULL");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, 1, NULL, a->b3t, 0), CH_ERR_INVALID_ARGUMENT,
            "ch_gemm_batched: a is NULL", "ch_gemm_batched: a NULL");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, 1, a->b3, NULL, 0), CH_ERR_INVALID_ARGUMENT,
            "ch_gemm_batched: b is NULL", "ch_gemm_batched: b NULL");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, 1, a->i3, a->b3t, 0), CH_ERR_DTYPE,
            "ch_gemm_batched: a is i32", "ch_gemm_batched: i32 a");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, 1, a->m2, a->b3t, 0), CH_ERR_SHAPE,
            "ch_gemm_batched: a has 2 dimensions", "ch_gemm_batched: 2-D a");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, 1, a->c3, a->b3t, 0), CH_ERR_SHAPE,
            "hold 3, 2 and 2 matrices", "ch_gemm_batched: 3 matrices against 2");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, 1, a->b3, a->b3, 0), CH_ERR_SHAPE,
            "op(a) has 4 columns but op(b) has 3 rows", "ch_gemm_batched: k 4 against 3");
    REFUSED(ch_gemm_batched(a->b3, 0, 0, 1, a->b3, a->b3t, 0), CH_ERR_SHAPE,
            "c is [2, 3, 4], expected [2, 3, 3]", "ch_gemm_batched: c of the wrong shape");
    REFUSED(ch_gemm_batched(a->b33, 0, 1, 1, a->b33, a->b33, 0), CH_ERR_INVALID_ARGUMENT,
            "ch_gemm_batched: c overlaps a", "ch_gemm_batched: c is a");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, NAN, a->b3, a->b3t, 0), CH_ERR_INVALID_ARGUMENT,
            "ch_gemm_batched: alpha is nan", "ch_gemm_batched: alpha NaN");
    REFUSED(ch_gemm_batched(a->b33, 0, 0, 1, a->b3, a->b3t, INFINITY), CH_ERR_INVALID_ARGUMENT,
            "ch_gemm_batched: beta is inf", "ch_gemm_batched: beta infinite");
}

static void bad_permute(const bad_args *a)
{
    const int p3[] = {0, 2, 1}, dup[] = {0, 1, 1}, out[] = {0, 3, 1}, neg[] = {-1, 0, 1};
    REFUSED(ch_permute(NULL, a->b3, p3), CH_ERR_INVALID_ARGUMENT, "ch_permute: y is NULL",
            "ch_permute: y NULL");
    REFUSED(ch_permute(a->b3t, NULL, p3), CH_ERR_INVALID_ARGUMENT, "ch_permute: x is NULL",
            "ch_permute: x NULL");
    REFUSED(ch_permute(a->b3t, a->b3, NULL), CH_ERR_INVALID_ARGUMENT, "ch_permute: perm is NULL",
            "ch_permute: perm NULL");
    REFUSED(ch_permute(a->b3t, a->i3, p3), CH_ERR_DTYPE, "y is f32 and x is i32",
            "ch_permute: f32 y, i32 x");
    REFUSED(ch_permute(a->m2, a->b3, p3), CH_ERR_SHAPE, "y has 2 dimensions but x has 3",
            "ch_permute: 2-D y, 3-D x");
    REFUSED(ch_permute(a->b3t, a->b3, dup), CH_ERR_INVALID_ARGUMENT, "perm[2] = 1",
            "ch_permute: perm (0, 1, 1)");
    REFUSED(ch_permute(a->b3t, a->b3, out), CH_ERR_INVALID_ARGUMENT, "perm[1] = 3",
            "ch_permute: perm (0, 3, 1)");
    REFUSED(ch_permute(a->b3t, a->b3, neg), CH_ERR_INVALID_ARGUMENT, "perm[0] = -1",
            "ch_permute: perm (-1, 0, 1)");
    REFUSED(ch_permute(a->b3, a->b3, p3), CH_ERR_SHAPE, "y's dimension 1 is 3",
            "ch_permute: y [2,3,4] for x [2,3,4] perm (0, 2, 1)");
    REFUSED(ch_permute(a->row0, a->row1, (const int[]){1, 0}), CH_ERR_SHAPE,
            "y's dimension 0 is 3", "ch_permute: y [3,4] for x [3,4] perm (1, 0)");
    REFUSED(ch_permute(a->row0, a->row1, (const int[]){0, 1}), CH_ERR_INVALID_ARGUMENT,
            "ch_permute: y overlaps x", "ch_permute: overlapping views");
}

static void bad_softmax(const bad_args *a)
{
    REFUSED(ch_softmax(NULL, a->b3, 0), CH_ERR_INVALID_ARGUMENT, "ch_softmax: y is NULL",
            "ch_softmax: y NULL");
    REFUSED(ch_softmax(a->b3, NULL, 0), CH_ERR_INVALID_ARGUMENT, "ch_softmax: x is NULL",
            "ch_softmax: x NULL");
    REFUSED(ch_softmax(a->i3, a->b3, 0), CH_ERR_DTYPE, "ch_softmax: y is i32",
            "ch_softmax: i32 y");
    REFUSED(ch_softmax(a->m2, a->b3, 0), CH_ERR_SHAPE, "ch_softmax: y has 12 elements",
            "ch_softmax: 12 elements for 24");
    REFUSED(ch_softmax(a->row0, a->row1, 0), CH_ERR_INVALID_ARGUMENT,
            "ch_softmax: y partly overlaps x", "ch_softmax: overlapping views");
    REFUSED(ch_softmax(a->b3, a->b3t, 1), CH_ERR_SHAPE, "needs S >= T, x has T 4 and S 3",
            "ch_softmax: causal with T 4 > S 3");
    REFUSED(ch_softmax(a->idx, a->idx, 1), CH_ERR_DTYPE, "ch_softmax: y is i32",
            "ch_softmax: i32 in place");
    tap_status_ok(ch_softmax(a->b3, a->b3, 1), "ch_softmax: causal in place, S 4 >= T 3");
}

static void bad_softmax_1d(ch_device *dev)
{
    ch_tensor *v = NULL;
    int64_t four[] = {4};
    if (!tap_status_ok(ch_tensor_new(&v, dev, CH_F32, 1, four), "a 1-D tensor"))
        return;
    REFUSED(ch_softmax(v, v, 1), CH_ERR_SHAPE, "a causal x needs 2 dimensions",
            "ch_softmax: causal over 1 dimension");
    ch_tensor_free(v);
}

static void bad_softmax_backward(const bad_args *a)
{
    REFUSED(ch_softmax_backward(NULL, a->b3, a->b3t), CH_ERR_INVALID_ARGUMENT,
            "ch_softmax_backward: dx is NULL", "ch_softmax_backward: dx NULL");
    REFUSED(ch_softmax_backward(a->b3, NULL, a->b3t), CH_ERR_INVALID_ARGUMENT,
            "ch_softmax_backward: dy is NULL", "ch_softmax_backward: dy NULL");
    REFUSED(ch_softmax_backward(a->b3, a->b3t, NULL), CH_ERR_INVALID_ARGUMENT,
            "ch_softmax_backward: y is NULL", "ch_softmax_backward: y NULL");
    REFUSED(ch_softmax_backward(a->b3, a->i3, a->b3t), CH_ERR_DTYPE,
            "ch_softmax_backward: dy is i32", "ch_softmax_backward: i32 dy");
    REFUSED(ch_softmax_backward(a->b3, a->m2, a->b3t), CH_ERR_SHAPE,
            "ch_softmax_backward: dy has 12 elements", "ch_softmax_backward: dy of 12 for 24");
    REFUSED(ch_softmax_backward(a->m2, a->b3, a->b3t), CH_ERR_SHAPE,
            "ch_softmax_backward: dx has 12 elements", "ch_softmax_backward: dx of 12 for 24");
    REFUSED(ch_softmax_backward(a->b3t, a->b3, a->b3t), CH_ERR_INVALID_ARGUMENT,
            "ch_softmax_backward: dx overlaps y", "ch_softmax_backward: dx is y");
    REFUSED(ch_softmax_backward(a->row0, a->row1, a->m2), CH_ERR_INVALID_ARGUMENT,
            "ch_softmax_backward: dx partly overlaps dy", "ch_softmax_backward: dx, dy views");
    tap_status_ok(ch_softmax_backward(a->b3, a->b3, a->b3t), "ch_softmax_backward: dx = dy");
}

static void bad_attention(ch_device *dev, const bad_args *a)
{
    ch_tensor *t[4] = {NULL};
    int64_t shape[3] = {2, 3, 4};
    ch_status st = CH_OK;
    for (int i = 0; i < 4 && st == CH_OK; i++) {
        st = ch_tensor_new(&t[i], dev, CH_F32, 3, shape);
        if (st == CH_OK)
            st = ch_fill(t[i], 0.5);
    }
    if (tap_status_ok(st, "tensors for ch_attention's argument checks")) {
        ch_tensor *q = a->b3, *o = t[0], *dq = t[1], *dk = t[2], *dv = t[3];
        REFUSED(ch_attention(NULL, a->y2, q, q, q, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention: o is NULL", "ch_attention: o NULL");
        REFUSED(ch_attention(o, NULL, q, q, q, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention: lse is NULL", "ch_attention: lse NULL");
        REFUSED(ch_attention(o, a->y2, q, NULL, q, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention: k is NULL", "ch_attention: k NULL");
        REFUSED(ch_attention(o, a->y2, a->i3, q, q, 1), CH_ERR_DTYPE, "ch_attention: q is i32",
                "ch_attention: i32 q");
        REFUSED(ch_attention(o, a->y2, a->m2, a->m2, a->m2, 1), CH_ERR_SHAPE, "q has 2 dimensions",
                "ch_attention: 2-D q");
        REFUSED(ch_attention(o, a->y2, q, a->c3, q, 1), CH_ERR_SHAPE,
                "ch_attention: k and q have different shapes",
                "ch_attention: k [3,3,4], q [2,3,4]");
        REFUSED(ch_attention(a->b3t, a->y2, q, q, q, 1), CH_ERR_SHAPE,
                "ch_attention: o and q have different shapes", "ch_attention: o [2,4,3]");
        REFUSED(ch_attention(o, a->m2, q, q, q, 1), CH_ERR_SHAPE, "expected [2, 3] ([B, T] of q)",
                "ch_attention: lse [3,4] for q [2,3,4]");
        REFUSED(ch_attention(o, a->y2, q, q, q, NAN), CH_ERR_INVALID_ARGUMENT,
                "ch_attention: scale is nan", "ch_attention: scale NaN");
        REFUSED(ch_attention(q, a->y2, q, dq, dq, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention: o overlaps q", "ch_attention: o is q");
        tap_status_ok(ch_attention(o, a->y2, q, q, q, 0.5f), "ch_attention: q = k = v allowed");
        REFUSED(ch_attention_backward(NULL, dk, dv, q, q, q, q, o, a->y2, 1),
                CH_ERR_INVALID_ARGUMENT, "ch_attention_backward: dq is NULL",
                "ch_attention_backward: dq NULL");
        REFUSED(ch_attention_backward(dq, dk, dv, q, q, q, q, o, NULL, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention_backward: lse is NULL", "ch_attention_backward: lse NULL");
        REFUSED(ch_attention_backward(dq, dk, dv, a->c3, q, q, q, o, a->y2, 1), CH_ERR_SHAPE,
                "ch_attention_backward: dout and q have different shapes",
                "ch_attention_backward: dout [3,3,4]");
        REFUSED(ch_attention_backward(dq, dq, dv, q, q, q, q, o, a->y2, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention_backward: dq overlaps dk", "ch_attention_backward: dq is dk");
        REFUSED(ch_attention_backward(dq, dk, o, q, q, q, q, o, a->y2, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention_backward: dv overlaps o", "ch_attention_backward: dv is o");
        REFUSED(ch_attention_backward(dq, dk, dv, q, q, q, q, o, a->y2, INFINITY),
                CH_ERR_INVALID_ARGUMENT, "ch_attention_backward: scale is inf",
                "ch_attention_backward: scale infinite");
        tap_status_ok(ch_attention_backward(dq, dk, dv, q, q, q, q, o, a->y2, 0.5f),
                      "ch_attention_backward: dout = q = k = v allowed");
    }
    /* The packed layout: qkv [2, 3, 12] is 2 heads of 2, o [2, 3, 4]. */
    ch_tensor *p[3] = {NULL};
    int64_t shapes[3][3] = {{2, 3, 12}, {2, 2, 3}, {2, 3, 12}};
    for (int i = 0; i < 3 && st == CH_OK; i++) {
        st = ch_tensor_new(&p[i], dev, CH_F32, 3, shapes[i]);
        if (st == CH_OK)
            st = ch_fill(p[i], 0.25);
    }
    if (tap_status_ok(st, "tensors for ch_attention_packed's argument checks")) {
        ch_tensor *qkv = p[0], *lse = p[1], *dqkv = p[2], *o = t[0], *g = t[1];
        REFUSED(ch_attention_packed(NULL, lse, qkv, 2, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention_packed: o is NULL", "ch_attention_packed: o NULL");
        REFUSED(ch_attention_packed(o, lse, a->i3, 2, 1), CH_ERR_DTYPE,
                "ch_attention_packed: qkv is i32", "ch_attention_packed: i32 qkv");
        REFUSED(ch_attention_packed(o, lse, qkv, 0, 1), CH_ERR_INVALID_ARGUMENT,
                "expected heads >= 1", "ch_attention_packed: 0 heads");
        REFUSED(ch_attention_packed(o, lse, qkv, 3, 1), CH_ERR_SHAPE,
                "expected heads >= 1 and 3 "
                "* heads * hd",
                "ch_attention_packed: 3 heads for qkv of 12");
        REFUSED(ch_attention_packed(o, lse, a->b3, 1, 1), CH_ERR_SHAPE,
                "ch_attention_packed: qkv's last dimension 4", "ch_attention_packed: qkv [2,3,4]");
        REFUSED(ch_attention_packed(qkv, lse, dqkv, 2, 1), CH_ERR_SHAPE,
                "ch_attention_packed: o has 3 dimensions (2, ...), expected [2, 3, 4]",
                "ch_attention_packed: o [2,3,12]");
        REFUSED(ch_attention_packed(o, a->y2, qkv, 2, 1), CH_ERR_SHAPE,
                "ch_attention_packed: lse has 2 dimensions", "ch_attention_packed: lse [2,3]");
        REFUSED(ch_attention_packed(o, lse, qkv, 2, NAN), CH_ERR_INVALID_ARGUMENT,
                "ch_attention_packed: scale is nan", "ch_attention_packed: scale NaN");
        tap_status_ok(ch_attention_packed(o, lse, qkv, 2, 0.5f), "ch_attention_packed: valid");
        REFUSED(ch_attention_packed_backward(NULL, g, qkv, o, lse, 2, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention_packed_backward: dqkv is NULL",
                "ch_attention_packed_backward: dqkv NULL");
        REFUSED(ch_attention_packed_backward(dqkv, g, qkv, o, lse, 3, 1), CH_ERR_SHAPE,
                "expected heads >= 1 and 3 * heads * hd",
                "ch_attention_packed_backward: 3 heads for qkv of 12");
        REFUSED(ch_attention_packed_backward(dqkv, qkv, qkv, o, lse, 2, 1), CH_ERR_SHAPE,
                "ch_attention_packed_backward: dout has 3 dimensions",
                "ch_attention_packed_backward: dout [2,3,12]");
        REFUSED(ch_attention_packed_backward(o, g, qkv, o, lse, 2, 1), CH_ERR_SHAPE,
                "ch_attention_packed_backward: dqkv and qkv have different shapes",
                "ch_attention_packed_backward: dqkv [2,3,4]");
        REFUSED(ch_attention_packed_backward(qkv, g, qkv, o, lse, 2, 1), CH_ERR_INVALID_ARGUMENT,
                "ch_attention_packed_backward: dqkv overlaps qkv",
                "ch_attention_packed_backward: dqkv is qkv");
        tap_status_ok(ch_attention_packed_backward(dqkv, g, qkv, o, lse, 2, 0.5f),
                      "ch_attention_packed_backward: valid");
        REFUSED(ch_attention_packed_mixed(o, lse, qkv, 2, 1, CH_I32), CH_ERR_DTYPE,
                "ch_attention_packed_mixed: the products' format is i32, expected f32, bf16 or "
                "f16",
                "ch_attention_packed_mixed: i32 products");
        REFUSED(ch_attention_packed_mixed(o, lse, qkv, 3, 1, CH_BF16), CH_ERR_SHAPE,
                "expected heads >= 1 and 3 * heads * hd",
                "ch_attention_packed_mixed: 3 heads for qkv of 12");
        tap_status_ok(ch_attention_packed_mixed(o, lse, qkv, 2, 0.5f, CH_F16),
                      "ch_attention_packed_mixed: f16 products (f32 on every backend)");
        REFUSED(ch_attention_packed_mixed_backward(dqkv, g, qkv, o, lse, 2, 1, (ch_dtype)99),
                CH_ERR_DTYPE, "ch_attention_packed_mixed_backward: the products' format is unknown",
                "ch_attention_packed_mixed_backward: dtype 99");
        REFUSED(ch_attention_packed_mixed_backward(qkv, g, qkv, o, lse, 2, 1, CH_BF16),
                CH_ERR_INVALID_ARGUMENT, "ch_attention_packed_mixed_backward: dqkv overlaps qkv",
                "ch_attention_packed_mixed_backward: dqkv is qkv");
        tap_status_ok(ch_attention_packed_mixed_backward(dqkv, g, qkv, o, lse, 2, 0.5f, CH_BF16),
                      "ch_attention_packed_mixed_backward: valid");
    }
    for (int i = 0; i < 3; i++)
        ch_tensor_free(p[i]);
    for (int i = 0; i < 4; i++)
        ch_tensor_free(t[i]);
}

static void bad_embedding(const bad_args *a)
{
    REFUSED(ch_embedding(NULL, a->m2, a->idx), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding: y is NULL", "ch_embedding: y NULL");
    REFUSED(ch_embedding(a->emb, NULL, a->idx), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding: table is NULL", "ch_embedding: table NULL");
    REFUSED(ch_embedding(a->emb, a->m2, NULL), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding: idx is NULL", "ch_embedding: idx NULL");
    REFUSED(ch_embedding(a->emb, a->m2, a->m2), CH_ERR_DTYPE, "ch_embedding: idx is f32",
            "ch_embedding: f32 idx");
    REFUSED(ch_embedding(a->emb, a->i3, a->idx), CH_ERR_DTYPE, "ch_embedding: table is i32",
            "ch_embedding: i32 table");
    REFUSED(ch_embedding(a->emb, a->b3, a->idx), CH_ERR_SHAPE,
            "ch_embedding: table has 3 dimensions", "ch_embedding: 3-D table");
    REFUSED(ch_embedding(a->b3, a->m2, a->idx), CH_ERR_SHAPE,
            "ch_embedding: y has 24 elements, expected 12", "ch_embedding: y of 24 for 3 x 4");
    REFUSED(ch_embedding(a->row0, a->row1, a->idx), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding: y overlaps table", "ch_embedding: y overlaps the table");
    REFUSED(ch_embedding_backward(NULL, a->emb, a->idx), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding_backward: dtable is NULL", "ch_embedding_backward: dtable NULL");
    REFUSED(ch_embedding_backward(a->m2, NULL, a->idx), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding_backward: dy is NULL", "ch_embedding_backward: dy NULL");
    REFUSED(ch_embedding_backward(a->m2, a->emb, NULL), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding_backward: idx is NULL", "ch_embedding_backward: idx NULL");
    REFUSED(ch_embedding_backward(a->m2, a->emb, a->emb), CH_ERR_DTYPE,
            "ch_embedding_backward: idx is f32", "ch_embedding_backward: f32 idx");
    REFUSED(ch_embedding_backward(a->b3, a->emb, a->idx), CH_ERR_SHAPE,
            "ch_embedding_backward: dtable has 3 dimensions", "ch_embedding_backward: 3-D dtable");
    REFUSED(ch_embedding_backward(a->m2, a->b3, a->idx), CH_ERR_SHAPE,
            "ch_embedding_backward: dy has 24 elements", "ch_embedding_backward: dy of 24");
    REFUSED(ch_embedding_backward(a->row0, a->row1, a->idx), CH_ERR_INVALID_ARGUMENT,
            "ch_embedding_backward: dtable overlaps dy", "ch_embedding_backward: dtable, dy");
}

static void bad_avgpool(const bad_args *a)
{
    REFUSED(ch_avgpool_global(NULL, a->x4d), CH_ERR_INVALID_ARGUMENT,
            "ch_avgpool_global: y is NULL", "ch_avgpool_global: y NULL");
    REFUSED(ch_avgpool_global(a->y2, NULL), CH_ERR_INVALID_ARGUMENT,
            "ch_avgpool_global: x is NULL", "ch_avgpool_global: x NULL");
    REFUSED(ch_avgpool_global(a->y2, a->b3), CH_ERR_SHAPE,
            "ch_avgpool_global: x has 3 dimensions", "ch_avgpool_global: 3-D x");
    REFUSED(ch_avgpool_global(a->m2, a->x4d), CH_ERR_SHAPE,
            "ch_avgpool_global: y must be [2, 3]", "ch_avgpool_global: y [3,4] for x [2,3,5,5]");
    REFUSED(ch_avgpool_global(a->b3, a->x4d), CH_ERR_SHAPE,
            "ch_avgpool_global: y must be [2, 3]", "ch_avgpool_global: 3-D y");
    REFUSED(ch_avgpool_global(a->i3, a->x4d), CH_ERR_DTYPE, "ch_avgpool_global: y is i32",
            "ch_avgpool_global: i32 y");
    REFUSED(ch_avgpool_global_backward(NULL, a->y2), CH_ERR_INVALID_ARGUMENT,
            "ch_avgpool_global_backward: dx is NULL", "ch_avgpool_global_backward: dx NULL");
    REFUSED(ch_avgpool_global_backward(a->x4d, NULL), CH_ERR_INVALID_ARGUMENT,
            "ch_avgpool_global_backward: dy is NULL", "ch_avgpool_global_backward: dy NULL");
    REFUSED(ch_avgpool_global_backward(a->x4d, a->m2), CH_ERR_SHAPE,
            "ch_avgpool_global_backward: dy must be [2, 3]", "ch_avgpool_global_backward: dy "
            "[3,4] for dx [2,3,5,5]");
    REFUSED(ch_avgpool_global_backward(a->m4, a->y2), CH_ERR_SHAPE,
            "ch_avgpool_global_backward: dx has 2 dimensions", "ch_avgpool_global_backward: "
            "2-D dx");
}

/* y [N, C] taken from the start of x's own memory: x and y overlap. */
static void bad_avgpool_alias(ch_device *dev)
{
    ch_tensor *x = NULL, *flat = NULL, *y = NULL;
    int64_t s4[] = {2, 3, 1, 1}, s1[] = {6}, s2[] = {2, 3};
    ch_status st = ch_tensor_new(&x, dev, CH_F32, 4, s4);
    if (st == CH_OK)
        st = ch_tensor_reshape(&flat, x, 1, s1);
    if (st == CH_OK)
        st = ch_tensor_reshape(&y, flat, 2, s2);
    if (tap_status_ok(st, "a [2, 3] view of a [2, 3, 1, 1] tensor")) {
        REFUSED(ch_avgpool_global(y, x), CH_ERR_INVALID_ARGUMENT,
                "ch_avgpool_global: y overlaps x", "ch_avgpool_global: y is x's memory");
        REFUSED(ch_avgpool_global_backward(x, y), CH_ERR_INVALID_ARGUMENT,
                "ch_avgpool_global_backward: dy overlaps dx",
                "ch_avgpool_global_backward: dy is dx's memory");
    }
    ch_tensor_free(y);
    ch_tensor_free(flat);
    ch_tensor_free(x);
}

/* One tensor of each call on the other device. */
static void bad_devices(const bad_args *h, const bad_args *o, ch_device *other)
{
    char needle[4][96];
    const char *id = ch_device_id(other);
    snprintf(needle[0], sizeof needle[0], "ch_gemm_batched: b is on %s", id);
    snprintf(needle[1], sizeof needle[1], "ch_permute: x is on %s", id);
    snprintf(needle[2], sizeof needle[2], "ch_softmax_backward: y is on %s", id);
    snprintf(needle[3], sizeof needle[3], "ch_embedding: idx is on %s", id);
    REFUSED(ch_gemm_batched(h->b33, 0, 0, 1, h->b3, o->b3t, 0), CH_ERR_DEVICE_MISMATCH,
            needle[0], "ch_gemm_batched: b on the other device");
    REFUSED(ch_permute(h->b3t, o->b3, (const int[]){0, 2, 1}), CH_ERR_DEVICE_MISMATCH,
            needle[1], "ch_permute: x on the other device");
    REFUSED(ch_softmax(o->b3, h->b3, 0), CH_ERR_DEVICE_MISMATCH, "ch_softmax: x is on host",
            "ch_softmax: y on the other device");
    REFUSED(ch_softmax_backward(h->b3, h->b3, o->b3t), CH_ERR_DEVICE_MISMATCH, needle[2],
            "ch_softmax_backward: y on the other device");
    REFUSED(ch_embedding(h->emb, h->m2, o->idx), CH_ERR_DEVICE_MISMATCH, needle[3],
            "ch_embedding: idx on the other device");
    REFUSED(ch_embedding_backward(o->m2, h->emb, h->idx), CH_ERR_DEVICE_MISMATCH,
            "ch_embedding_backward: dy is on host", "ch_embedding_backward: dtable on the other "
            "device");
    REFUSED(ch_avgpool_global(h->y2, o->x4d), CH_ERR_DEVICE_MISMATCH, "ch_avgpool_global: x is on",
            "ch_avgpool_global: x on the other device");
    REFUSED(ch_avgpool_global_backward(o->x4d, h->y2), CH_ERR_DEVICE_MISMATCH,
            "ch_avgpool_global_backward: dy is on host",
            "ch_avgpool_global_backward: dx on the other device");
    REFUSED(ch_attention(h->b33, h->y2, h->b33, o->b33, h->b33, 1), CH_ERR_DEVICE_MISMATCH,
            "ch_attention: k is on", "ch_attention: k on the other device");
}

static void test_bad_arguments(ch_device *host)
{
    bad_args h, o;
    ch_device *other = NULL;
    if (!bad_args_new(&h, host))
        return;
    bad_gemm_batched(&h);
    bad_permute(&h);
    bad_softmax(&h);
    bad_softmax_1d(host);
    bad_softmax_backward(&h);
    bad_attention(host, &h);
    bad_embedding(&h);
    bad_avgpool(&h);
    bad_avgpool_alias(host);
    if (ch_device_by_name(&other, "opencl:0") != CH_OK)
        tap_skip("tensors on two devices: no opencl:0 (%s)", ch_last_error());
    else if (bad_args_new(&o, other)) {
        bad_devices(&h, &o, other);
        bad_args_free(&o);
    }
    bad_args_free(&h);
}

/* Before ch_init every call says so, whatever its arguments. */
static void test_before_init(void)
{
    static const int perm[] = {0};
    REFUSED(ch_gemm_batched(NULL, 0, 0, 1, NULL, NULL, 0), CH_ERR_STATE,
            "ch_gemm_batched: call ch_init first", "ch_gemm_batched before ch_init");
    REFUSED(ch_permute(NULL, NULL, perm), CH_ERR_STATE, "ch_permute: call ch_init first",
            "ch_permute before ch_init");
    REFUSED(ch_softmax(NULL, NULL, 1), CH_ERR_STATE, "ch_softmax: call ch_init first",
            "ch_softmax before ch_init");
    REFUSED(ch_softmax_backward(NULL, NULL, NULL), CH_ERR_STATE,
            "ch_softmax_backward: call ch_init first", "ch_softmax_backward before ch_init");
    REFUSED(ch_embedding(NULL, NULL, NULL), CH_ERR_STATE, "ch_embedding: call ch_init first",
            "ch_embedding before ch_init");
    REFUSED(ch_embedding_backward(NULL, NULL, NULL), CH_ERR_STATE,
            "ch_embedding_backward: call ch_init first", "ch_embedding_backward before ch_init");
    REFUSED(ch_avgpool_global(NULL, NULL), CH_ERR_STATE, "ch_avgpool_global: call ch_init first",
            "ch_avgpool_global before ch_init");
    REFUSED(ch_avgpool_global_backward(NULL, NULL), CH_ERR_STATE,
            "ch_avgpool_global_backward: call ch_init first",
            "ch_avgpool_global_backward before ch_init");
}

/* ---- Main ------------------------------------------------------------------------ */

static void test_device(ch_device *dev)
{
    double t0 = ch_clock_seconds();
    test_gemms_batched(dev);
    for (int t = 0; t < 4; t++)
        grad_gemm_batched(dev, t >> 1, t & 1);
    test_permutes(dev);
    test_softmaxes(dev);
    test_softmax_backwards(dev);
    grad_softmax(dev, SHAPE(2, 3, 4), 0);
    grad_softmax(dev, SHAPE(2, 4, 4), 1);
    grad_softmax(dev, SHAPE(1, 3, 5), 1);
    grad_softmax(dev, SHAPE(2, 7), 0);
    test_attentions(dev);
    test_embeddings(dev);
    test_avgpools(dev);
    tap_diag("%s: %.1f s", ch_device_id(dev), ch_clock_seconds() - t0);
}

int main(void)
{
    tc_small();
    /* An op run on the host would say so once on stderr; test_attentions
     * checks ch_fallback_get instead, and stderr stays for what oclgrind
     * reports (tests/oclgrind.sh). */
    setenv("CHORUS_QUIET_FALLBACK", "1", 1);
    test_before_init();
    ch_status st = ch_init();
    if (!tap_status_ok(st, "ch_init"))
        return tap_done();
    tc_skip_missing_backends();
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES);
    for (int i = 0; i < ndev; i++)
        test_device(devs[i]);
    ch_device *host = NULL;
    if (tap_status_ok(ch_device_by_name(&host, "host"), "the host device, for the argument "
                      "checks"))
        test_bad_arguments(host);
    ch_shutdown();
    return tap_done();
}
