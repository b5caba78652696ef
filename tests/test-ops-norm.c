/* The normalisation ops (ops.h, "Normalisation") on every visible device:
 * each against a double-precision reference written here, the backward
 * ops against central differences of the composed training forward, the
 * data-parallel split of BatchNorm (two halves of a batch, their sums
 * added, give the whole batch's gradients), PyTorch's running statistics,
 * evaluation mode, the variance of channels whose mean is large beside
 * their spread, sums whose accuracy must not fall as a channel grows,
 * repeatability to the bit, and every bad argument. The residual add
 * fused with LayerNorm (ch_add_layernorm, ch_layernorm_backward_add) also
 * against the unfused ops, on every device and on a backend without the
 * fused slots (the minimal test module, where make check provides it). */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/half_bits.h"
#include "ref.h"
#include "tap.h"

#define MAX_DEVICES 16

/* Error bounds, relative to the size of the terms each result is made of
 * (ref_err's magnitudes), in units of f32's epsilon, the same on every
 * device:
 * - TOL_SUM: every backend computes lib/kernels/normalize.h's formulas in
 *   its chk_acc, double where the device has it (the host, CUDA, OpenCL
 *   with cl_khr_fp64: every device tested here), so what remains is the
 *   rounding of each f32 result and of the f32 statistics the later steps
 *   read (measured: 0.52 ulp at most, host, PoCL and Intel alike); a
 *   device whose chk_acc is float sums in float and fails this bound;
 * - TOL_ACCURATE: a channel's sums of 2^22 equal terms, where plain f32
 *   sums in the OpenCL kernel's order err by 20 ulp (measured here), and
 *   compensated or double sums stay within one rounding of the result and
 *   one of the products, 1 ulp. */
#define ULP 1.1920928955078125e-07
#define TOL_SUM (4 * ULP)
#define TOL_ACCURATE (2 * ULP)
/* Every device against the host backend's result on the same inputs: the
 * same formulas in the same accumulator, so only the order of the sums
 * differs, which a double sum carries to the f32 result only as one
 * rounding more, of the result or of a statistic later steps read
 * (measured: no difference at all on PoCL and Intel). */
#define TOL_HOST (4 * ULP)

/* Central differences of f32 forwards with h = 1e-2, relative to the
 * largest derivative, as tests/test-ops-grad.c: the truncation error
 * (h^2 / 6 of the third derivative) and the forward's rounding over the
 * step stay near 1e-5 each for inputs of unit spread. */
#define TOL_FD 5e-4
#define FD_STEP 1e-2f

/* The data-parallel split against the whole batch, on the same device:
 * the same formulas over sums added in another order, so the results
 * differ by the sums' rounding (a few ulp of the terms) carried through
 * the statistics into dx; relative to the largest value. */
#define TOL_SPLIT (64 * ULP)

/* The variance of channels of mean 100 and standard deviation 0.01 by
 * ops.h's two-pass recipe, relative to the exact variance of the same f32
 * inputs. The first mean m0 is within a few ulp of the true one, so x - m0
 * is exact (Sterbenz: both are near 100) and the sums around it hold the
 * spread itself: what remains is a few f32 roundings of the spread-sized
 * quantities (the sums, the quotient by M, the difference with d^2 where
 * d = mean - m0 ~ 1e-5 is negligible, the unbiased scaling), about 1e-6
 * in all, and OpenCL's 2.5-ulp divide (measured: 4e-8 on the host and on
 * PoCL). 1e-5 leaves ten times the estimate. Without the centre the sum
 * of squares is 1e4 M, and its f32 rounding alone moves the mean square
 * by up to 5e-4, five times the variance: TOL_ONE_PASS_LOST is what the
 * test demands the one-pass recipe to miss by, to prove that the centre is
 * what keeps the variance. */
#define TOL_VARIANCE 1e-5
#define TOL_ONE_PASS_LOST 1e-2

static double dot(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static double *widen(tcase *c, const float *x, int64_t n)
{
    double *d = tc_doubles(c, n);
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

/* The floats of several tensors one after the other, for one ref_err. */
static float *fetch_all(tcase *c, int n, ch_tensor *const *t, const int64_t *count)
{
    int64_t total = 0;
    for (int i = 0; i < n; i++)
        total += count[i];
    float *out = tc_floats(c, total);
    for (int64_t i = 0, at = 0; i < n; at += count[i], i++)
        tc_download(c, t[i], out + at, count[i]);
    return out;
}

/* x [N, C, ...] as [outer, c, inner]. */
static void channel_split(int ndim, const int64_t *shape, int64_t *outer, int64_t *c,
                          int64_t *inner)
{
    *outer = shape[0];
    *c = shape[1];
    *inner = ref_numel(ndim, shape) / (shape[0] * shape[1]);
}

/* ---- LayerNorm references ------------------------------------------------ */

/* The mean, the reciprocal standard deviation and the mean magnitude of a
 * row, in double. */
static void row_stats(const float *x, int64_t d, double eps, double *m, double *r,
                      double *mabs)
{
    double s = 0.0, a = 0.0, v = 0.0;
    for (int64_t j = 0; j < d; j++) {
        s += x[j];
        a += fabs((double)x[j]);
    }
    *m = s / (double)d;
    for (int64_t j = 0; j < d; j++)
        v += ((double)x[j] - *m) * ((double)x[j] - *m);
    *r = 1.0 / sqrt(v / (double)d + eps);
    *mabs = a / (double)d;
}

/* y, mean, rstd one after the other in `want` (n + 2 rows) with the sizes
 * of their terms in `mag`: x - mean errs by the rounding of both. */
static void ref_layernorm(double *want, double *mag, int64_t rows, int64_t d, const float *x,
                          const float *gamma, const float *beta, double eps)
{
    int64_t n = rows * d;
    for (int64_t r = 0; r < rows; r++) {
        double m, rs, mabs;
        row_stats(x + r * d, d, eps, &m, &rs, &mabs);
        for (int64_t j = 0; j < d; j++) {
            double u = (double)x[r * d + j] - m;
            want[r * d + j] = u * rs * gamma[j] + beta[j];
            mag[r * d + j] = (fabs(u) + mabs) * rs * fabs(gamma[j]) + fabs(beta[j]);
        }
        want[n + r] = m;
        mag[n + r] = mabs;
        want[n + rows + r] = mag[n + rows + r] = rs;
    }
}

typedef struct ln_grads {
    double *dx, *dxmag;   /* [rows, d] */
    double *dg, *dgmag;   /* [d] */
    double *db, *dbmag;   /* [d] */
} ln_grads;

static void ref_layernorm_row_backward(const ln_grads *o, int64_t r, int64_t d,
                                       const float *dy, const float *x, const float *gamma,
                                       double eps)
{
    double m, rs, mabs, s1 = 0.0, s2 = 0.0, a1 = 0.0, a2 = 0.0;
    row_stats(x, d, eps, &m, &rs, &mabs);
    for (int64_t j = 0; j < d; j++) {
        double xhat = ((double)x[j] - m) * rs, g = (double)dy[j] * gamma[j];
        s1 += g;
        s2 += g * xhat;
        a1 += fabs(g);
        a2 += fabs(g * xhat);
        o->dg[j] += dy[j] * xhat;
        o->dgmag[j] += fabs(dy[j]) * (fabs((double)x[j] - m) + mabs) * rs;
        o->db[j] += dy[j];
        o->dbmag[j] += fabs(dy[j]);
    }
    for (int64_t j = 0; j < d; j++) {
        double u = (double)x[j] - m, g = (double)dy[j] * gamma[j];
        o->dx[r * d + j] = rs * (g - s1 / (double)d - u * rs * s2 / (double)d);
        o->dxmag[r * d + j] =
            rs * (fabs(g) + a1 / (double)d + (fabs(u) + mabs) * rs * a2 / (double)d);
    }
}

/* dgamma and dbeta start from dg0 and db0 (they accumulate). */
static void ref_layernorm_backward(const ln_grads *o, int64_t rows, int64_t d, const float *dy,
                                   const float *x, const float *gamma, const float *dg0,
                                   const float *db0, double eps)
{
    for (int64_t j = 0; j < d; j++) {
        o->dg[j] = dg0[j];
        o->dgmag[j] = fabs(dg0[j]);
        o->db[j] = db0[j];
        o->dbmag[j] = fabs(db0[j]);
    }
    for (int64_t r = 0; r < rows; r++)
        ref_layernorm_row_backward(o, r, d, dy + r * d, x + r * d, gamma, eps);
}

/* ---- LayerNorm against the reference ------------------------------------- */

static void test_layernorm(ch_device *dev, int ndim, const int64_t *shape, float eps)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "layernorm x %s eps %g: y, mean, rstd", s, eps);
    int64_t n = ref_numel(ndim, shape), d = shape[ndim - 1], rows = n / d;
    float *x = tc_random(&c, n, -2, 3);
    float *gamma = tc_random(&c, d, 0.5f, 1.5f), *beta = tc_random(&c, d, -1, 1);
    ch_tensor *t[] = {tc_tensor(&c, CH_F32, ndim, shape, NULL),
                      tc_tensor(&c, CH_F32, SHAPE(rows), NULL),
                      tc_tensor(&c, CH_F32, SHAPE(rows), NULL)};
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(d), gamma);
    ch_tensor *tb = tc_tensor(&c, CH_F32, SHAPE(d), beta);
    TC(&c, ch_layernorm(t[0], t[1], t[2], tx, tg, tb, eps));
    double *want = tc_doubles(&c, n + 2 * rows), *mag = tc_doubles(&c, n + 2 * rows);
    ref_layernorm(want, mag, rows, d, x, gamma, beta, eps);
    float *got = fetch_all(&c, 3, t, (int64_t[]){n, rows, rows});
    tc_vs_host(&c, got, mag, n + 2 * rows, TOL_HOST);
    tc_end_err(&c, ref_err(got, want, mag, n + 2 * rows), TOL_SUM);
}

static void test_layernorm_backward(ch_device *dev, int ndim, const int64_t *shape,
                                    int want_dx)
{
    const float eps = 1e-5f;
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "layernorm_backward x %s%s: dgamma, dbeta accumulate", s,
             want_dx ? ", dx" : " (dx NULL)");
    int64_t n = ref_numel(ndim, shape), d = shape[ndim - 1], rows = n / d;
    float *x = tc_random(&c, n, -2, 3), *dy = tc_random(&c, n, -1, 1);
    float *gamma = tc_random(&c, d, 0.5f, 1.5f);
    float *dg0 = tc_random(&c, d, -1, 1), *db0 = tc_random(&c, d, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, ndim, shape, dy);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(d), gamma);
    ch_tensor *tbeta = tc_tensor(&c, CH_F32, SHAPE(d), tc_floats(&c, d));
    ch_tensor *ty = tc_tensor(&c, CH_F32, ndim, shape, NULL);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    ch_tensor *out[] = {tc_tensor(&c, CH_F32, SHAPE(d), dg0), tc_tensor(&c, CH_F32, SHAPE(d), db0),
                        want_dx ? tc_tensor(&c, CH_F32, ndim, shape, NULL) : NULL};
    TC(&c, ch_layernorm(ty, tm, tr, tx, tg, tbeta, eps));
    TC(&c, ch_layernorm_backward(out[2], out[0], out[1], tdy, tx, tm, tr, tg));
    int64_t total = 2 * d + (want_dx ? n : 0);
    double *want = tc_doubles(&c, 2 * d + n), *mag = tc_doubles(&c, 2 * d + n);
    ln_grads o = {want + 2 * d, mag + 2 * d, want, mag, want + d, mag + d};
    ref_layernorm_backward(&o, rows, d, dy, x, gamma, dg0, db0, eps);
    float *got = fetch_all(&c, want_dx ? 3 : 2, out, (int64_t[]){d, d, n});
    tc_vs_host(&c, got, mag, total, TOL_HOST);
    tc_end_err(&c, ref_err(got, want, mag, total), TOL_SUM);
}

/* ---- LayerNorm against central differences ------------------------------- */

typedef struct ln_fd {
    ch_tensor *y, *mean, *rstd, *x, *gamma, *beta;
    const float *p;   /* the projection: L = <y, p> */
    float *yh;        /* scratch for y */
    int64_t n;
    float eps;
} ln_fd;

static double ln_objective(tcase *c, const void *sv, ch_tensor *t, const float *values)
{
    const ln_fd *s = sv;
    tc_upload(c, t, values);
    TC(c, ch_layernorm(s->y, s->mean, s->rstd, s->x, s->gamma, s->beta, s->eps));
    tc_download(c, s->y, s->yh, s->n);
    return dot(s->yh, s->p, s->n);
}

static void grad_layernorm(ch_device *dev, int64_t rows, int64_t d)
{
    tcase c;
    tc_begin(&c, dev, "layernorm_backward vs central differences of <layernorm(x), P> "
             "[%" PRId64 ",%" PRId64 "], h %g", rows, d, FD_STEP);
    int64_t n = rows * d;
    float *x = tc_random(&c, n, -2, 2), *p = tc_random(&c, n, -1, 1);
    float *gamma = tc_random(&c, d, 0.5f, 1.5f), *beta = tc_random(&c, d, -1, 1);
    ln_fd s = {.p = p, .yh = tc_floats(&c, n), .n = n, .eps = 1e-5f};
    s.y = tc_tensor(&c, CH_F32, SHAPE(rows, d), NULL);
    s.mean = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    s.rstd = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    s.x = tc_tensor(&c, CH_F32, SHAPE(rows, d), x);
    s.gamma = tc_tensor(&c, CH_F32, SHAPE(d), gamma);
    s.beta = tc_tensor(&c, CH_F32, SHAPE(d), beta);
    ch_tensor *tp = tc_tensor(&c, CH_F32, SHAPE(rows, d), p);
    ch_tensor *out[] = {tc_tensor(&c, CH_F32, SHAPE(rows, d), NULL),
                        tc_tensor(&c, CH_F32, SHAPE(d), tc_floats(&c, d)),
                        tc_tensor(&c, CH_F32, SHAPE(d), tc_floats(&c, d))};
    TC(&c, ch_layernorm(s.y, s.mean, s.rstd, s.x, s.gamma, s.beta, s.eps));
    TC(&c, ch_layernorm_backward(out[0], out[1], out[2], tp, s.x, s.mean, s.rstd, s.gamma));
    double *got = widen(&c, fetch_all(&c, 3, out, (int64_t[]){n, d, d}), n + 2 * d);
    double *want = tc_doubles(&c, n + 2 * d);
    tc_central_diff(&c, ln_objective, &s, s.x, x, n, FD_STEP, want);
    tc_central_diff(&c, ln_objective, &s, s.gamma, gamma, d, FD_STEP, want + n);
    tc_central_diff(&c, ln_objective, &s, s.beta, beta, d, FD_STEP, want + n + d);
    tc_end_err(&c, ref_err_scaled(got, want, n + 2 * d, 1e-6), TOL_FD);
}

/* ---- The residual stream's add beside LayerNorm -------------------------- */

/* ch_add_layernorm and ch_layernorm_backward_add: against the reference
 * above (the sum rounded as ch_add rounds it, which must be exact), and
 * against the unfused ops on the same device. Their bounds: an f32
 * output as TOL_SUM; a bf16 or f16 output one rounding of its format
 * more (u, relative to the size of its terms). Against the unfused ops:
 * the same bits on the host (the fused slot runs the unfused ops' row
 * functions) and on a backend without the slots (the core composes the
 * unfused ops, the test's minimal module); on another device the fused
 * kernel may sum a row in another order: TOL_HOST, plus one rounding of
 * a half format (a result one f32 ulp apart may round the other way). */

/* A format's unit roundoff: 0 for f32 (TOL_SUM covers it). */
static double fmt_u(ch_dtype dt)
{
    return dt == CH_BF16 ? 0x1p-8 : dt == CH_F16 ? 0x1p-11 : 0.0;
}

/* v rounded to dt's precision (f32 as it is), as the conversions round. */
static float fmt_round(float v, ch_dtype dt)
{
    chk_u32 u = chk_f32_bits(v);
    if (dt == CH_BF16)
        return chk_bits_f32(chk_bf16_to_f32(chk_f32_to_bf16(u)));
    if (dt == CH_F16)
        return chk_bits_f32(chk_f16_to_f32(chk_f32_to_f16(u)));
    return v;
}

/* n random values of [lo, hi) that dt holds exactly. */
static float *fmt_random(tcase *c, ch_dtype dt, int64_t n, float lo, float hi)
{
    float *v = tc_random(c, n, lo, hi);
    for (int64_t i = 0; i < n; i++)
        v[i] = fmt_round(v[i], dt);
    return v;
}

/* A tensor of dtype dt holding the values v (which dt holds exactly). */
static ch_tensor *fmt_tensor(tcase *c, ch_dtype dt, int ndim, const int64_t *shape, const float *v)
{
    if (dt == CH_F32)
        return tc_tensor(c, dt, ndim, shape, v);
    int64_t n = ref_numel(ndim, shape);
    uint16_t *h = tc_alloc(c, (size_t)n * sizeof *h);
    for (int64_t i = 0; i < n; i++)
        h[i] = dt == CH_BF16 ? chk_f32_to_bf16(chk_f32_bits(v[i]))
                             : chk_f32_to_f16(chk_f32_bits(v[i]));
    return tc_tensor(c, dt, ndim, shape, h);
}

/* n elements of t, whatever its float dtype, widened into out. */
static void fmt_fetch_into(tcase *c, const ch_tensor *t, float *out, int64_t n)
{
    if (!t || c->st != CH_OK)
        return;
    ch_dtype dt = ch_tensor_dtype(t);
    if (dt == CH_F32) {
        tc_download(c, t, out, n);
        return;
    }
    uint16_t *h = tc_alloc(c, (size_t)n * sizeof *h);
    TC(c, ch_tensor_download(t, h, (size_t)n * sizeof *h));
    for (int64_t i = 0; i < n; i++)
        out[i] = chk_bits_f32(dt == CH_BF16 ? chk_bf16_to_f32(h[i]) : chk_f16_to_f32(h[i]));
}

/* One output of a case: its tensor, element count, dtype and reference. */
typedef struct ln_out {
    const char *name;
    ch_tensor *t;
    int64_t n;
    const double *want, *mag;
} ln_out;

/* The outputs of a case one after the other as floats. */
static float *fetch_outs(tcase *c, const ln_out *o, int count, int64_t *total)
{
    int64_t n = 0;
    for (int i = 0; i < count; i++)
        n += o[i].n;
    float *v = tc_floats(c, n);
    for (int i = 0, at = 0; i < count; at += (int)o[i].n, i++)
        fmt_fetch_into(c, o[i].t, v + at, o[i].n);
    *total = n;
    return v;
}

/* The largest error of got against o's references: f32 outputs relative
 * to their terms (*f32), half ones (*half) likewise; each bound. */
static int outs_within(tcase *c, const ln_out *o, int count, const float *got, double *f32,
                       double *half, double *half_tol)
{
    *f32 = *half = 0.0;
    *half_tol = TOL_SUM;
    for (int i = 0, at = 0; i < count; at += (int)o[i].n, i++) {
        double e = ref_err(got + at, o[i].want, o[i].mag, o[i].n);
        ch_dtype dt = ch_tensor_dtype(o[i].t);
        if (dt == CH_F32) {
            *f32 = fmax(*f32, e);
        } else {
            *half = fmax(*half, e);
            *half_tol = fmax(*half_tol, TOL_SUM + fmt_u(dt));
        }
    }
    (void)c;
    return *f32 <= TOL_SUM && *half <= *half_tol;
}

/* Whether `dev`'s results must be the unfused ops' bits: the host's, and
 * a backend's without the fused slots (the minimal module's). */
static int fused_exact_on(ch_device *dev)
{
    ch_device_info info;
    if (ch_device_get_info(dev, &info) != CH_OK)
        return 0;
    return strcmp(info.backend, "host") == 0 || strcmp(info.backend, "minimal") == 0;
}

/* The fused outputs `got` against the unfused ones `ref` (n floats, their
 * sizes in mag): the same bits, or within TOL_HOST plus u of the
 * format (half_u). One TAP line. */
static void fused_vs_unfused(ch_device *dev, const char *what, const float *got, const float *ref,
                             const double *mag, int64_t n, double half_u)
{
    char detail[256];
    int64_t bad = ref_diff_words(got, ref, n, 1, detail, sizeof detail);
    if (fused_exact_on(dev)) {
        tap_ok(bad == 0, "%s %s: the unfused ops' bits: %s", ch_device_id(dev), what, detail);
        return;
    }
    double err = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]), m = fmax(mag[i], REF_TINY);
        err = fmax(err, isnan(got[i]) != isnan(ref[i]) ? INFINITY : isnan(got[i]) ? 0.0 : d / m);
    }
    tap_ok(err <= TOL_HOST + half_u, "%s %s: the unfused ops' within %.2g: err %.3g (%s)",
           ch_device_id(dev), what, TOL_HOST + half_u, err, detail);
}

/* The dtypes of a forward case: a, b, sum, y. */
typedef struct fwd_fmts {
    ch_dtype a, b, sum, y;
} fwd_fmts;

static void test_add_layernorm(ch_device *dev, int64_t rows, int64_t d, fwd_fmts f, int in_place)
{
    const float eps = 1e-5f;
    tcase c;
    tc_begin(&c, dev, "add_layernorm [%" PRId64 ",%" PRId64 "] a %s + b %s -> sum %s%s, y %s", rows,
             d, ch_dtype_name(f.a), ch_dtype_name(f.b), ch_dtype_name(f.sum),
             in_place ? " (in place over a)" : "", ch_dtype_name(f.y));
    int64_t n = rows * d;
    if (in_place)
        f.sum = f.a;
    float *a = fmt_random(&c, f.a, n, -2, 3), *b = fmt_random(&c, f.b, n, -1, 1);
    float *gamma = tc_random(&c, d, 0.5f, 1.5f), *beta = tc_random(&c, d, -1, 1);
    /* The sum as ch_add gives it: an f32 addition rounded to sum's dtype. */
    float *x = tc_floats(&c, n);
    for (int64_t i = 0; i < n; i++)
        x[i] = fmt_round(a[i] + b[i], f.sum);
    ch_tensor *ta = fmt_tensor(&c, f.a, SHAPE(rows, d), a);
    ch_tensor *tb = fmt_tensor(&c, f.b, SHAPE(rows, d), b);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(d), gamma);
    ch_tensor *tbeta = tc_tensor(&c, CH_F32, SHAPE(d), beta);
    ch_tensor *tsum = in_place ? ta : tc_tensor(&c, f.sum, SHAPE(rows, d), NULL);
    ch_tensor *ty = tc_tensor(&c, f.y, SHAPE(rows, d), NULL);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    TC(&c, ch_add_layernorm(tsum, ty, tm, tr, ta, tb, tg, tbeta, eps));
    double *want = tc_doubles(&c, 2 * n + 2 * rows), *mag = tc_doubles(&c, 2 * n + 2 * rows);
    ref_layernorm(want + n, mag + n, rows, d, x, gamma, beta, eps);
    for (int64_t i = 0; i < n; i++) {
        want[i] = x[i];
        mag[i] = fabs(x[i]);
    }
    ln_out o[] = {{"sum", tsum, n, want, mag},
                  {"y", ty, n, want + n, mag + n},
                  {"mean", tm, rows, want + 2 * n, mag + 2 * n},
                  {"rstd", tr, rows, want + 2 * n + rows, mag + 2 * n + rows}};
    int64_t total;
    float *got = fetch_outs(&c, o, 4, &total);
    /* The unfused ops on the same device, from the same inputs. */
    ch_tensor *ua = in_place ? fmt_tensor(&c, f.a, SHAPE(rows, d), a) : ta;
    ch_tensor *usum = in_place ? ua : tc_tensor(&c, f.sum, SHAPE(rows, d), NULL);
    ln_out u[] = {{"sum", usum, n, NULL, NULL},
                  {"y", tc_tensor(&c, f.y, SHAPE(rows, d), NULL), n, NULL, NULL},
                  {"mean", tc_tensor(&c, CH_F32, SHAPE(rows), NULL), rows, NULL, NULL},
                  {"rstd", tc_tensor(&c, CH_F32, SHAPE(rows), NULL), rows, NULL, NULL}};
    TC(&c, ch_add(u[0].t, ua, tb));
    TC(&c, ch_layernorm(u[1].t, u[2].t, u[3].t, u[0].t, tg, tbeta, eps));
    float *unfused = fetch_outs(&c, u, 4, &total);
    if (c.st != CH_OK) {
        tc_end_exact(&c, 0, "");
        return;
    }
    /* The sum exactly; the rest within its bounds. */
    char detail[200];
    int64_t sum_bad = ref_diff_words(got, x, n, 1, detail, sizeof detail);
    double e32, eh, th;
    int ok = outs_within(&c, o + 1, 3, got + n, &e32, &eh, &th);
    fused_vs_unfused(dev, c.name, got, unfused, mag, total, fmt_u(f.sum) + fmt_u(f.y));
    /* Against the host: the f32 statistics (the same inputs on every
     * device, from the case's name). */
    tc_vs_host(&c, got + 2 * n, mag + 2 * n, 2 * rows, TOL_HOST);
    tc_append(&c, ": sum %s; f32 outputs err %.3g (<= %.2g)", sum_bad ? detail : "exact", e32,
              TOL_SUM);
    if (f.y != CH_F32)
        tc_append(&c, ", %s y err %.3g (<= %.2g)", ch_dtype_name(f.y), eh, th);
    tc_end_exact(&c, ok && sum_bad == 0, "against the double reference");
}

/* The dtypes of a backward case: dy, dres (its x too: the residual's
 * stream), dx, and x. */
typedef struct back_fmts {
    ch_dtype dy, dres, dx, x;
} back_fmts;

typedef enum res_mode {
    RES_NONE,
    RES_APART,
    RES_IN_PLACE
} res_mode;

static void test_layernorm_backward_add(ch_device *dev, int64_t rows, int64_t d, back_fmts f,
                                        res_mode res)
{
    static const char *modes[] = {"dres NULL", "dres ", "dres == dx "};
    const float eps = 1e-5f;
    tcase c;
    if (res == RES_IN_PLACE)
        f.dres = f.dx;
    tc_begin(&c, dev, "layernorm_backward_add [%" PRId64 ",%" PRId64 "] dy %s, x %s, %s%s -> dx %s",
             rows, d, ch_dtype_name(f.dy), ch_dtype_name(f.x), modes[res],
             res == RES_NONE ? "" : ch_dtype_name(f.dres), ch_dtype_name(f.dx));
    int64_t n = rows * d;
    float *x = fmt_random(&c, f.x, n, -2, 3), *dy = fmt_random(&c, f.dy, n, -1, 1);
    float *dres = fmt_random(&c, f.dres, n, -1, 1);
    float *gamma = tc_random(&c, d, 0.5f, 1.5f);
    float *dg0 = tc_random(&c, d, -1, 1), *db0 = tc_random(&c, d, -1, 1);
    ch_tensor *tx = fmt_tensor(&c, f.x, SHAPE(rows, d), x);
    ch_tensor *tdy = fmt_tensor(&c, f.dy, SHAPE(rows, d), dy);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(d), gamma);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    /* mean and rstd from the forward */
    TC(&c, ch_layernorm(tc_tensor(&c, CH_F32, SHAPE(rows, d), NULL), tm, tr, tx, tg,
                        tc_tensor(&c, CH_F32, SHAPE(d), tc_floats(&c, d)), eps));
    ch_tensor *tres = res == RES_NONE ? NULL : fmt_tensor(&c, f.dres, SHAPE(rows, d), dres);
    ch_tensor *tdx = res == RES_IN_PLACE ? tres : tc_tensor(&c, f.dx, SHAPE(rows, d), NULL);
    ch_tensor *tdg = tc_tensor(&c, CH_F32, SHAPE(d), dg0);
    ch_tensor *tdb = tc_tensor(&c, CH_F32, SHAPE(d), db0);
    TC(&c, ch_layernorm_backward_add(tdx, tdg, tdb, tdy, tres, tx, tm, tr, tg));
    double *want = tc_doubles(&c, 2 * d + n), *mag = tc_doubles(&c, 2 * d + n);
    ln_grads g = {want + 2 * d, mag + 2 * d, want, mag, want + d, mag + d};
    ref_layernorm_backward(&g, rows, d, dy, x, gamma, dg0, db0, eps);
    for (int64_t i = 0; res != RES_NONE && i < n; i++) {
        g.dx[i] += dres[i];
        g.dxmag[i] += fabs(dres[i]);
    }
    ln_out o[] = {{"dgamma", tdg, d, want, mag},
                  {"dbeta", tdb, d, want + d, mag + d},
                  {"dx", tdx, n, want + 2 * d, mag + 2 * d}};
    int64_t total;
    float *got = fetch_outs(&c, o, 3, &total);
    /* The unfused ops: LayerNorm's dx into an f32 tensor, then dres added
     * (or the dx rounded). */
    ch_tensor *tmp = tc_tensor(&c, CH_F32, SHAPE(rows, d), NULL);
    ch_tensor *ures = res == RES_NONE ? NULL : fmt_tensor(&c, f.dres, SHAPE(rows, d), dres);
    ln_out u[] = {{"dgamma", tc_tensor(&c, CH_F32, SHAPE(d), dg0), d, NULL, NULL},
                  {"dbeta", tc_tensor(&c, CH_F32, SHAPE(d), db0), d, NULL, NULL},
                  {"dx", res == RES_IN_PLACE ? ures : tc_tensor(&c, f.dx, SHAPE(rows, d), NULL), n,
                   NULL, NULL}};
    TC(&c, ch_layernorm_backward(tmp, u[0].t, u[1].t, tdy, tx, tm, tr, tg));
    if (ures)
        TC(&c, ch_add(u[2].t, tmp, ures));
    else if (f.dx == CH_F32)
        TC(&c, ch_copy(u[2].t, tmp));
    else
        TC(&c, ch_cast(u[2].t, tmp));
    float *unfused = fetch_outs(&c, u, 3, &total);
    if (c.st != CH_OK) {
        tc_end_exact(&c, 0, "");
        return;
    }
    double e32, eh, th;
    int ok = outs_within(&c, o, 3, got, &e32, &eh, &th);
    fused_vs_unfused(dev, c.name, got, unfused, mag, total, fmt_u(f.dx));
    tc_vs_host(&c, got, mag, 2 * d, TOL_HOST);
    tc_append(&c, ": f32 outputs err %.3g (<= %.2g)", e32, TOL_SUM);
    if (f.dx != CH_F32)
        tc_append(&c, ", %s dx err %.3g (<= %.2g)", ch_dtype_name(f.dx), eh, th);
    tc_end_exact(&c, ok, "against the double reference");
}

/* The cases of both ops on one device (all: the shapes beside the
 * formats; the minimal module's device takes the first few alone). */
static void test_residual_layernorms(ch_device *dev, int all)
{
    const ch_dtype F = CH_F32, B = CH_BF16, H = CH_F16;
    /* GPT-2's d; an odd d (no vector path, a partial work-group); one row;
     * more rows than a chunk of the parameter gradients' sums (32). */
    int64_t rows768 = tc_small() ? 2 : 8, many = tc_small() ? 33 : 70;
    test_add_layernorm(dev, rows768, 768, (fwd_fmts){F, F, F, F}, 0);
    test_add_layernorm(dev, rows768, 768, (fwd_fmts){B, B, B, B}, 0);
    test_add_layernorm(dev, 3, 771, (fwd_fmts){F, F, F, F}, 1);
    test_add_layernorm(dev, 3, 771, (fwd_fmts){B, B, B, B}, 1);
    test_layernorm_backward_add(dev, rows768, 768, (back_fmts){F, F, F, F}, RES_APART);
    test_layernorm_backward_add(dev, rows768, 768, (back_fmts){B, B, B, B}, RES_IN_PLACE);
    test_layernorm_backward_add(dev, 3, 771, (back_fmts){H, H, H, H}, RES_NONE);
    if (!all)
        return;
    test_add_layernorm(dev, rows768, 768, (fwd_fmts){H, H, H, H}, 0);
    test_add_layernorm(dev, 1, 768, (fwd_fmts){F, F, F, F}, 1);
    test_add_layernorm(dev, 1, 5, (fwd_fmts){F, F, F, F}, 0);
    test_add_layernorm(dev, 1, 5, (fwd_fmts){H, H, H, H}, 1);
    test_add_layernorm(dev, 3, 771, (fwd_fmts){H, H, H, H}, 0);
    test_add_layernorm(dev, many, 256, (fwd_fmts){B, B, B, B}, 1);
    /* mixed: an f32 residual stream, a bf16 branch, bf16 into the block */
    test_add_layernorm(dev, rows768, 768, (fwd_fmts){F, B, F, B}, 1);
    test_add_layernorm(dev, 3, 771, (fwd_fmts){F, B, B, F}, 0);
    test_layernorm_backward_add(dev, rows768, 768, (back_fmts){F, F, F, F}, RES_NONE);
    test_layernorm_backward_add(dev, rows768, 768, (back_fmts){F, F, F, F}, RES_IN_PLACE);
    test_layernorm_backward_add(dev, rows768, 768, (back_fmts){B, B, B, B}, RES_APART);
    test_layernorm_backward_add(dev, rows768, 768, (back_fmts){H, H, H, H}, RES_IN_PLACE);
    test_layernorm_backward_add(dev, 1, 768, (back_fmts){B, B, B, B}, RES_NONE);
    test_layernorm_backward_add(dev, 1, 5, (back_fmts){F, F, F, F}, RES_IN_PLACE);
    test_layernorm_backward_add(dev, 1, 5, (back_fmts){B, B, B, B}, RES_APART);
    test_layernorm_backward_add(dev, 3, 771, (back_fmts){F, F, F, F}, RES_APART);
    test_layernorm_backward_add(dev, 3, 771, (back_fmts){B, B, B, B}, RES_IN_PLACE);
    test_layernorm_backward_add(dev, many, 256, (back_fmts){F, F, F, F}, RES_IN_PLACE);
    test_layernorm_backward_add(dev, many, 256, (back_fmts){B, B, B, B}, RES_APART);
    /* mixed: f32 dx and residual gradient, bf16 dy and x */
    test_layernorm_backward_add(dev, rows768, 768, (back_fmts){B, F, F, B}, RES_IN_PLACE);
    test_layernorm_backward_add(dev, 3, 771, (back_fmts){B, F, B, F}, RES_APART);
}

/* ---- BatchNorm references ------------------------------------------------ */

/* ops.h's sums [2C + 1] with the sizes of their terms. */
static void ref_channel_sums(double *s, double *mag, int64_t outer, int64_t c, int64_t inner,
                             const float *a, const float *ac, const float *b, const float *bc)
{
    for (int64_t ch = 0; ch < c; ch++) {
        double ca = ac ? ac[ch] : 0.0, cb = bc ? bc[ch] : 0.0;
        double s1 = 0.0, s2 = 0.0, m1 = 0.0, m2 = 0.0;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t at = (o * c + ch) * inner + i;
                double da = (double)a[at] - ca, db = (double)b[at] - cb;
                s1 += da;
                s2 += da * db;
                m1 += fabs(da);
                m2 += fabs(da * db);
            }
        s[ch] = s1;
        s[c + ch] = s2;
        mag[ch] = m1;
        mag[c + ch] = m2;
    }
    s[2 * c] = mag[2 * c] = (double)(outer * inner);
}

/* The batch statistics and the running ones moved towards them, in double
 * from the f32 sums (PyTorch's update; M = 1: the biased variance). */
typedef struct bn_stats_ref {
    double *mean, *rstd, *rm, *rv;   /* [c] each */
    double *mmag, *rmag, *rmmag, *rvmag;
} bn_stats_ref;

static void ref_batchnorm_stats(const bn_stats_ref *o, int64_t c, const float *sums,
                                const float *center, const float *rm0, const float *rv0,
                                double momentum, double eps)
{
    double count = sums[2 * c];
    for (int64_t ch = 0; ch < c; ch++) {
        double d = sums[ch] / count, ctr = center ? center[ch] : 0.0;
        double sq = sums[c + ch] / count, v = fmax(sq - d * d, 0.0);
        double unbiased = count > 1 ? v * count / (count - 1) : v;
        double sq_unbiased = count > 1 ? (sq + d * d) * count / (count - 1) : sq + d * d;
        o->mean[ch] = ctr + d;
        o->mmag[ch] = fabs(ctr) + fabs(d);
        o->rstd[ch] = 1.0 / sqrt(v + eps);
        /* rstd errs relatively as the variance does: by the rounding of
         * the terms sq and d^2 it is the difference of. */
        o->rmag[ch] = o->rstd[ch] * (sq + d * d + eps) / (v + eps);
        if (!rm0)
            continue;
        o->rm[ch] = (1 - momentum) * rm0[ch] + momentum * o->mean[ch];
        o->rmmag[ch] = (1 - momentum) * fabs(rm0[ch]) + momentum * o->mmag[ch];
        o->rv[ch] = (1 - momentum) * rv0[ch] + momentum * unbiased;
        o->rvmag[ch] = (1 - momentum) * fabs(rv0[ch]) + momentum * sq_unbiased;
    }
}

/* ---- channel_sums -------------------------------------------------------- */

typedef enum sums_kind { SUMS_X_X, SUMS_X_X_CENTRED, SUMS_DY_X_MEAN } sums_kind;

static void test_channel_sums(ch_device *dev, int ndim, const int64_t *shape, sums_kind kind)
{
    static const char *kinds[] = {"(x, x)", "(x - centre, x - centre)", "(dy, x - mean)"};
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "channel_sums %s of %s", kinds[kind], s);
    int64_t outer, ch, inner, n = ref_numel(ndim, shape);
    channel_split(ndim, shape, &outer, &ch, &inner);
    float *x = tc_random(&c, n, -2, 3), *dy = tc_random(&c, n, -1, 1);
    float *ctr = kind == SUMS_X_X ? NULL : tc_random(&c, ch, 0, 1);
    const float *a = kind == SUMS_DY_X_MEAN ? dy : x;
    const float *ac = kind == SUMS_X_X_CENTRED ? ctr : NULL;
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *ta = kind == SUMS_DY_X_MEAN ? tc_tensor(&c, CH_F32, ndim, shape, dy) : tx;
    ch_tensor *tctr = ctr ? tc_tensor(&c, CH_F32, SHAPE(ch), ctr) : NULL;
    ch_tensor *tsum = tc_tensor(&c, CH_F32, SHAPE(2 * ch + 1), NULL);
    TC(&c, ch_channel_sums(tsum, ta, kind == SUMS_X_X_CENTRED ? tctr : NULL, tx, tctr));
    double *want = tc_doubles(&c, 2 * ch + 1), *mag = tc_doubles(&c, 2 * ch + 1);
    ref_channel_sums(want, mag, outer, ch, inner, a, ac, x, ctr);
    float *got = tc_fetch(&c, tsum, 2 * ch + 1);
    tc_vs_host(&c, got, mag, 2 * ch + 1, TOL_HOST);
    tc_end_err(&c, ref_err(got, want, mag, 2 * ch + 1), TOL_SUM);
}

/* 2^22 equal terms in a channel: a plain f32 sum drifts, these must not
 * (small sizes: 2^16, 16 splits). */
static void test_channel_sums_accuracy(ch_device *dev)
{
    const int log2n = tc_small() ? 16 : 22;
    const int64_t n = (int64_t)1 << log2n;
    tcase c;
    tc_begin(&c, dev, "channel_sums accuracy: 2^%d elements of 1.1 in one channel, within "
             "%.1f ulp of the sums of |terms|", log2n, TOL_ACCURATE / ULP);
    float *x = tc_floats(&c, n);
    for (int64_t i = 0; i < n; i++)
        x[i] = 1.1f;
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(4, 1, n / 4096, 1024), x);
    ch_tensor *tsum = tc_tensor(&c, CH_F32, SHAPE(3), NULL);
    TC(&c, ch_channel_sums(tsum, tx, NULL, tx, NULL));
    double want[3], mag[3];
    ref_channel_sums(want, mag, 4, 1, n / 4, x, NULL, x, NULL);
    float *got = tc_fetch(&c, tsum, 3);
    tc_append(&c, " (sum %.9g, want %.9g)", got[0], want[0]);
    tc_end_err(&c, ref_err(got, want, mag, 3), TOL_ACCURATE);
}

/* ---- batchnorm_stats ----------------------------------------------------- */

/* Sums as channel_sums gives them (rounded to f32) of x around ctr. */
static float *sums_of(tcase *c, int64_t outer, int64_t ch, int64_t inner, const float *x,
                      const float *ctr)
{
    double *s = tc_doubles(c, 2 * ch + 1), *mag = tc_doubles(c, 2 * ch + 1);
    ref_channel_sums(s, mag, outer, ch, inner, x, ctr, x, ctr);
    float *f = tc_floats(c, 2 * ch + 1);
    for (int64_t i = 0; i < 2 * ch + 1; i++)
        f[i] = (float)s[i];
    return f;
}

static void test_batchnorm_stats(ch_device *dev, int64_t outer, int64_t ch, int64_t inner,
                                 int centred, int running, float momentum)
{
    const float eps = 1e-5f;
    tcase c;
    tc_begin(&c, dev, "batchnorm_stats [%" PRId64 ",%" PRId64 ",%" PRId64 "]%s%s momentum %g",
             outer, ch, inner, centred ? " centred" : "", running ? " running stats" : "",
             momentum);
    int64_t n = outer * ch * inner;
    float *x = tc_random(&c, n, -1, 1);
    for (int64_t i = 0; i < n; i++)   /* channel k has mean near k */
        x[i] += (float)((i / inner) % ch);
    float *ctr = NULL;
    if (centred) {
        ctr = tc_random(&c, ch, -0.1f, 0.1f);
        for (int64_t k = 0; k < ch; k++)
            ctr[k] += (float)k;
    }
    float *sums = sums_of(&c, outer, ch, inner, x, ctr);
    float *rm0 = tc_random(&c, ch, -1, 1), *rv0 = tc_random(&c, ch, 0.5f, 2);
    ch_tensor *out[] = {tc_tensor(&c, CH_F32, SHAPE(ch), NULL),
                        tc_tensor(&c, CH_F32, SHAPE(ch), NULL),
                        running ? tc_tensor(&c, CH_F32, SHAPE(ch), rm0) : NULL,
                        running ? tc_tensor(&c, CH_F32, SHAPE(ch), rv0) : NULL};
    ch_tensor *ts = tc_tensor(&c, CH_F32, SHAPE(2 * ch + 1), sums);
    ch_tensor *tctr = centred ? tc_tensor(&c, CH_F32, SHAPE(ch), ctr) : NULL;
    TC(&c, ch_batchnorm_stats(out[0], out[1], out[2], out[3], ts, tctr, momentum, eps));
    double *want = tc_doubles(&c, 4 * ch), *mag = tc_doubles(&c, 4 * ch);
    bn_stats_ref o = {want, want + ch, want + 2 * ch, want + 3 * ch,
                      mag,  mag + ch,  mag + 2 * ch,  mag + 3 * ch};
    ref_batchnorm_stats(&o, ch, sums, ctr, running ? rm0 : NULL, rv0, momentum, eps);
    int k = running ? 4 : 2;
    float *got = fetch_all(&c, k, out, (int64_t[]){ch, ch, ch, ch});
    tc_vs_host(&c, got, mag, k * ch, TOL_HOST);
    tc_end_err(&c, ref_err(got, want, mag, k * ch), TOL_SUM);
}

/* A channel of one element (M = 1): PyTorch's unbiased variance would be
 * 0 / 0; the biased one, 0, is taken, so the running variance decays. */
static void test_batchnorm_stats_single(ch_device *dev)
{
    const int64_t ch = 3;
    const float momentum = 0.1f;
    tcase c;
    tc_begin(&c, dev, "batchnorm_stats of one element per channel: running_var = (1 - "
             "momentum) running_var, finite");
    float *x = tc_random(&c, ch, -1, 1), *rv0 = tc_random(&c, ch, 0.5f, 2);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(1, ch), x);
    ch_tensor *ts = tc_tensor(&c, CH_F32, SHAPE(2 * ch + 1), NULL);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *trm = tc_tensor(&c, CH_F32, SHAPE(ch), tc_floats(&c, ch));
    ch_tensor *trv = tc_tensor(&c, CH_F32, SHAPE(ch), rv0);
    TC(&c, ch_channel_sums(ts, tx, NULL, tx, NULL));
    TC(&c, ch_batchnorm_stats(tm, tr, trm, trv, ts, NULL, momentum, 1e-5f));
    float *rv = tc_fetch(&c, trv, ch);
    double err = 0.0;
    for (int64_t k = 0; k < ch; k++) {
        double want = (1.0 - momentum) * rv0[k];
        err = fmax(err, isfinite(rv[k]) ? fabs(rv[k] - want) / want : INFINITY);
    }
    tc_end_err(&c, err, TOL_SUM);
}

/* Evaluation: mean is the running mean (a copy), rstd from the running
 * variance, and neither running statistic moves. */
static void test_batchnorm_stats_eval(ch_device *dev, int64_t ch)
{
    const float eps = 1e-3f;
    tcase c;
    tc_begin(&c, dev, "batchnorm_stats evaluation (sums NULL), %" PRId64 " channels", ch);
    float *rm = tc_random(&c, ch, -3, 3), *rv = tc_random(&c, ch, 0.01f, 4);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *trm = tc_tensor(&c, CH_F32, SHAPE(ch), rm);
    ch_tensor *trv = tc_tensor(&c, CH_F32, SHAPE(ch), rv);
    TC(&c, ch_batchnorm_stats(tm, tr, trm, trv, NULL, NULL, 0.1f, eps));
    float *m = tc_fetch(&c, tm, ch), *r = tc_fetch(&c, tr, ch);
    float *rm_after = tc_fetch(&c, trm, ch), *rv_after = tc_fetch(&c, trv, ch);
    double err = 0.0;
    int same = memcmp(m, rm, (size_t)ch * 4) == 0 && memcmp(rm_after, rm, (size_t)ch * 4) == 0 &&
               memcmp(rv_after, rv, (size_t)ch * 4) == 0;
    for (int64_t k = 0; k < ch; k++) {
        double want = 1.0 / sqrt((double)rv[k] + eps);
        err = fmax(err, fabs(r[k] - want) / want);
    }
    tc_append(&c, "; mean == running_mean and running stats unchanged: %s", same ? "yes" : "NO");
    tc_end_err(&c, same ? err : INFINITY, TOL_SUM);
}

/* ---- batchnorm_forward and batchnorm_backward ---------------------------- */

static void test_batchnorm_forward(ch_device *dev, int ndim, const int64_t *shape, int in_place)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "batchnorm_forward x %s%s", s, in_place ? " in place" : "");
    int64_t outer, ch, inner, n = ref_numel(ndim, shape);
    channel_split(ndim, shape, &outer, &ch, &inner);
    float *x = tc_random(&c, n, -2, 3), *mean = tc_random(&c, ch, -1, 2);
    float *rstd = tc_random(&c, ch, 0.5f, 2), *gamma = tc_random(&c, ch, -1.5f, 1.5f);
    float *beta = tc_random(&c, ch, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, x);
    ch_tensor *ty = in_place ? tx : tc_tensor(&c, CH_F32, ndim, shape, NULL);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(ch), mean);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(ch), rstd);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(ch), gamma);
    ch_tensor *tb = tc_tensor(&c, CH_F32, SHAPE(ch), beta);
    TC(&c, ch_batchnorm_forward(ty, tx, tm, tr, tg, tb));
    double *want = tc_doubles(&c, n), *mag = tc_doubles(&c, n);
    for (int64_t i = 0; i < n; i++) {
        int64_t k = (i / inner) % ch;
        want[i] = ((double)x[i] - mean[k]) * rstd[k] * gamma[k] + beta[k];
        mag[i] = (fabs(x[i]) + fabs(mean[k])) * rstd[k] * fabs(gamma[k]) + fabs(beta[k]);
    }
    float *got = tc_fetch(&c, ty, n);
    tc_vs_host(&c, got, mag, n, TOL_HOST);
    tc_end_err(&c, ref_err(got, want, mag, n), TOL_SUM);
}

typedef struct bn_inputs {
    float *dy, *x, *mean, *rstd, *gamma, *local, *total, *dg0, *db0;
} bn_inputs;

/* dgamma, dbeta, then dx (ops.h's formulas) into want, with magnitudes. */
static void ref_batchnorm_backward(double *want, double *mag, int64_t outer, int64_t ch,
                                   int64_t inner, const bn_inputs *in)
{
    double count = in->total[2 * ch];
    for (int64_t k = 0; k < ch; k++) {
        want[k] = in->dg0[k] + (double)in->rstd[k] * in->local[ch + k];
        mag[k] = fabs(in->dg0[k]) + fabs((double)in->rstd[k] * in->local[ch + k]);
        want[ch + k] = (double)in->db0[k] + in->local[k];
        mag[ch + k] = fabs(in->db0[k]) + fabs(in->local[k]);
    }
    double *dx = want + 2 * ch, *dxmag = mag + 2 * ch;
    for (int64_t i = 0; i < outer * ch * inner; i++) {
        int64_t k = (i / inner) % ch;
        double r = in->rstd[k], g = in->gamma[k];
        double t1 = in->total[k] / count, t2 = r * r * in->total[ch + k] / count;
        dx[i] = g * r * (in->dy[i] - t1 - ((double)in->x[i] - in->mean[k]) * t2);
        dxmag[i] = fabs(g) * r *
                   (fabs(in->dy[i]) + fabs(t1) + (fabs(in->x[i]) + fabs(in->mean[k])) * fabs(t2));
    }
}

static void test_batchnorm_backward(ch_device *dev, int ndim, const int64_t *shape, int want_dx)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "batchnorm_backward x %s%s: dgamma, dbeta accumulate from local, dx "
             "from total", s, want_dx ? "" : " (dx NULL)");
    int64_t outer, ch, inner, n = ref_numel(ndim, shape);
    channel_split(ndim, shape, &outer, &ch, &inner);
    bn_inputs in = {
        .dy = tc_random(&c, n, -1, 1),           .x = tc_random(&c, n, -2, 3),
        .mean = tc_random(&c, ch, -1, 2),        .rstd = tc_random(&c, ch, 0.5f, 2),
        .gamma = tc_random(&c, ch, -1.5f, 1.5f), .local = tc_random(&c, 2 * ch + 1, -9, 9),
        .total = tc_random(&c, 2 * ch + 1, -20, 20), .dg0 = tc_random(&c, ch, -1, 1),
        .db0 = tc_random(&c, ch, -1, 1)};
    in.total[2 * ch] = (float)(outer * inner);
    ch_tensor *out[] = {tc_tensor(&c, CH_F32, SHAPE(ch), in.dg0),
                        tc_tensor(&c, CH_F32, SHAPE(ch), in.db0),
                        want_dx ? tc_tensor(&c, CH_F32, ndim, shape, NULL) : NULL};
    ch_tensor *tdy = tc_tensor(&c, CH_F32, ndim, shape, in.dy);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, in.x);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(ch), in.mean);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(ch), in.rstd);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(ch), in.gamma);
    ch_tensor *tl = tc_tensor(&c, CH_F32, SHAPE(2 * ch + 1), in.local);
    ch_tensor *tt = tc_tensor(&c, CH_F32, SHAPE(2 * ch + 1), in.total);
    TC(&c, ch_batchnorm_backward(out[2], out[0], out[1], tdy, tx, tm, tr, tg, tl, tt));
    double *want = tc_doubles(&c, 2 * ch + n), *mag = tc_doubles(&c, 2 * ch + n);
    ref_batchnorm_backward(want, mag, outer, ch, inner, &in);
    float *got = fetch_all(&c, want_dx ? 3 : 2, out, (int64_t[]){ch, ch, n});
    tc_vs_host(&c, got, mag, 2 * ch + (want_dx ? n : 0), TOL_HOST);
    tc_end_err(&c, ref_err(got, want, mag, 2 * ch + (want_dx ? n : 0)), TOL_SUM);
}

/* ---- The training step: ops.h's recipe ----------------------------------- */

/* Scratch of the two-pass statistics: the sums and the first mean. */
typedef struct bn_scratch {
    ch_tensor *sums, *m0, *r0;
} bn_scratch;

static bn_scratch bn_scratch_new(tcase *c, int64_t ch)
{
    return (bn_scratch){tc_tensor(c, CH_F32, SHAPE(2 * ch + 1), NULL),
                        tc_tensor(c, CH_F32, SHAPE(ch), NULL),
                        tc_tensor(c, CH_F32, SHAPE(ch), NULL)};
}

/* ops.h's forward recipe up to the statistics, on one device: a first
 * mean, then the sums around it. */
static void bn_stats_two_pass(tcase *c, const bn_scratch *s, ch_tensor *mean, ch_tensor *rstd,
                              ch_tensor *rm, ch_tensor *rv, const ch_tensor *x, float momentum,
                              float eps)
{
    TC(c, ch_channel_sums(s->sums, x, NULL, x, NULL));
    TC(c, ch_batchnorm_stats(s->m0, s->r0, NULL, NULL, s->sums, NULL, momentum, eps));
    TC(c, ch_channel_sums(s->sums, x, s->m0, x, s->m0));
    TC(c, ch_batchnorm_stats(mean, rstd, rm, rv, s->sums, s->m0, momentum, eps));
}

typedef struct bn_fd {
    bn_scratch s;
    ch_tensor *y, *mean, *rstd, *x, *gamma, *beta;
    const float *p;
    float *yh;
    int64_t n;
} bn_fd;

static double bn_objective(tcase *c, const void *sv, ch_tensor *t, const float *values)
{
    const bn_fd *s = sv;
    tc_upload(c, t, values);
    bn_stats_two_pass(c, &s->s, s->mean, s->rstd, NULL, NULL, s->x, 0.1f, 1e-5f);
    TC(c, ch_batchnorm_forward(s->y, s->x, s->mean, s->rstd, s->gamma, s->beta));
    tc_download(c, s->y, s->yh, s->n);
    return dot(s->yh, s->p, s->n);
}

/* The whole training-mode BatchNorm (batch statistics, then the
 * normalisation) differentiated numerically against channel_sums(dy, x -
 * mean) and batchnorm_backward with local = total. */
static void grad_batchnorm(ch_device *dev, int ndim, const int64_t *shape)
{
    char str[64];
    tcase c;
    ref_shape_str(str, sizeof str, ndim, shape);
    tc_begin(&c, dev, "batchnorm_backward vs central differences of <batchnorm(x), P> x %s, "
             "h %g", str, FD_STEP);
    int64_t outer, ch, inner, n = ref_numel(ndim, shape);
    channel_split(ndim, shape, &outer, &ch, &inner);
    float *x = tc_random(&c, n, -2, 2), *p = tc_random(&c, n, -1, 1);
    float *gamma = tc_random(&c, ch, 0.5f, 1.5f), *beta = tc_random(&c, ch, -1, 1);
    bn_fd s = {.s = bn_scratch_new(&c, ch), .p = p, .yh = tc_floats(&c, n), .n = n};
    s.y = tc_tensor(&c, CH_F32, ndim, shape, NULL);
    s.mean = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    s.rstd = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    s.x = tc_tensor(&c, CH_F32, ndim, shape, x);
    s.gamma = tc_tensor(&c, CH_F32, SHAPE(ch), gamma);
    s.beta = tc_tensor(&c, CH_F32, SHAPE(ch), beta);
    ch_tensor *tp = tc_tensor(&c, CH_F32, ndim, shape, p);
    ch_tensor *g = tc_tensor(&c, CH_F32, SHAPE(2 * ch + 1), NULL);
    ch_tensor *out[] = {tc_tensor(&c, CH_F32, ndim, shape, NULL),
                        tc_tensor(&c, CH_F32, SHAPE(ch), tc_floats(&c, ch)),
                        tc_tensor(&c, CH_F32, SHAPE(ch), tc_floats(&c, ch))};
    bn_objective(&c, &s, s.x, x);
    TC(&c, ch_channel_sums(g, tp, NULL, s.x, s.mean));
    TC(&c, ch_batchnorm_backward(out[0], out[1], out[2], tp, s.x, s.mean, s.rstd, s.gamma, g,
                                 g));
    double *got = widen(&c, fetch_all(&c, 3, out, (int64_t[]){n, ch, ch}), n + 2 * ch);
    double *want = tc_doubles(&c, n + 2 * ch);
    tc_central_diff(&c, bn_objective, &s, s.x, x, n, FD_STEP, want);
    tc_central_diff(&c, bn_objective, &s, s.gamma, gamma, ch, FD_STEP, want + n);
    tc_central_diff(&c, bn_objective, &s, s.beta, beta, ch, FD_STEP, want + n + ch);
    tc_end_err(&c, ref_err_scaled(got, want, n + 2 * ch, 1e-6), TOL_FD);
}

/* ---- Data parallelism: a batch in two halves ----------------------------- */

typedef struct bn_split {
    ch_tensor *x, *dy, *y, *dx;               /* the whole batch */
    ch_tensor *xh[2], *dyh[2], *yh[2], *dxh[2];   /* views of its halves */
    ch_tensor *gamma, *beta, *mean, *rstd;
    ch_tensor *part[2], *total;               /* per-half and added sums */
    ch_tensor *m0, *r0;
    ch_tensor *dg[2], *db[2];
    int64_t ch;
} bn_split;

/* The sums of both halves added: what the all-reduce gives a replica. */
static void split_sums(tcase *c, const bn_split *s, const ch_tensor *const *a,
                       const ch_tensor *ac, const ch_tensor *const *b, const ch_tensor *bc)
{
    for (int h = 0; h < 2; h++)
        TC(c, ch_channel_sums(s->part[h], a[h], ac, b[h], bc));
    TC(c, ch_add(s->total, s->part[0], s->part[1]));
}

/* The training step of each half with sums all-reduced between them. */
static void split_step(tcase *c, const bn_split *s)
{
    const float eps = 1e-5f;
    split_sums(c, s, (const ch_tensor *const *)s->xh, NULL, (const ch_tensor *const *)s->xh, NULL);
    TC(c, ch_batchnorm_stats(s->m0, s->r0, NULL, NULL, s->total, NULL, 0.1f, eps));
    split_sums(c, s, (const ch_tensor *const *)s->xh, s->m0, (const ch_tensor *const *)s->xh,
               s->m0);
    TC(c, ch_batchnorm_stats(s->mean, s->rstd, NULL, NULL, s->total, s->m0, 0.1f, eps));
    for (int h = 0; h < 2; h++)
        TC(c, ch_batchnorm_forward(s->yh[h], s->xh[h], s->mean, s->rstd, s->gamma, s->beta));
    split_sums(c, s, (const ch_tensor *const *)s->dyh, NULL, (const ch_tensor *const *)s->xh,
               s->mean);
    for (int h = 0; h < 2; h++)
        TC(c, ch_batchnorm_backward(s->dxh[h], s->dg[h], s->db[h], s->dyh[h], s->xh[h],
                                    s->mean, s->rstd, s->gamma, s->part[h], s->total));
}

/* The same step on the whole batch (local = total); dgamma into dg[0],
 * dbeta into db[0]. */
static void whole_step(tcase *c, const bn_split *s)
{
    bn_scratch sc = {s->total, s->m0, s->r0};
    bn_stats_two_pass(c, &sc, s->mean, s->rstd, NULL, NULL, s->x, 0.1f, 1e-5f);
    TC(c, ch_batchnorm_forward(s->y, s->x, s->mean, s->rstd, s->gamma, s->beta));
    TC(c, ch_channel_sums(s->total, s->dy, NULL, s->x, s->mean));
    TC(c, ch_batchnorm_backward(s->dx, s->dg[0], s->db[0], s->dy, s->x, s->mean, s->rstd,
                                s->gamma, s->total, s->total));
}

/* y, dx, dgamma, dbeta of a step: the halves' parameter gradients added. */
static double *step_results(tcase *c, const bn_split *s, int64_t n, int halves)
{
    double *r = tc_doubles(c, 2 * n + 2 * s->ch);
    float *f = fetch_all(c, 2, (ch_tensor *[]){s->y, s->dx}, (int64_t[]){n, n});
    for (int64_t i = 0; i < 2 * n; i++)
        r[i] = f[i];
    for (int h = 0; h < halves; h++) {
        float *g = fetch_all(c, 2, (ch_tensor *[]){s->dg[h], s->db[h]},
                             (int64_t[]){s->ch, s->ch});
        for (int64_t k = 0; k < 2 * s->ch; k++)
            r[2 * n + k] += g[k];
    }
    return r;
}

static void split_new(tcase *c, bn_split *s, int ndim, const int64_t *shape, int64_t first)
{
    int64_t n = ref_numel(ndim, shape), ch = shape[1];
    s->ch = ch;
    s->x = tc_tensor(c, CH_F32, ndim, shape, tc_random(c, n, -2, 3));
    s->dy = tc_tensor(c, CH_F32, ndim, shape, tc_random(c, n, -1, 1));
    s->y = tc_tensor(c, CH_F32, ndim, shape, NULL);
    s->dx = tc_tensor(c, CH_F32, ndim, shape, NULL);
    ch_tensor **whole[] = {&s->x, &s->dy, &s->y, &s->dx}, **halves[] = {s->xh, s->dyh, s->yh,
                                                                     s->dxh};
    for (int i = 0; i < 4; i++) {
        halves[i][0] = tc_view(c, *whole[i], 0, first);
        halves[i][1] = tc_view(c, *whole[i], first, shape[0] - first);
    }
    s->gamma = tc_tensor(c, CH_F32, SHAPE(ch), tc_random(c, ch, 0.5f, 1.5f));
    s->beta = tc_tensor(c, CH_F32, SHAPE(ch), tc_random(c, ch, -1, 1));
    s->mean = tc_tensor(c, CH_F32, SHAPE(ch), NULL);
    s->rstd = tc_tensor(c, CH_F32, SHAPE(ch), NULL);
    s->m0 = tc_tensor(c, CH_F32, SHAPE(ch), NULL);
    s->r0 = tc_tensor(c, CH_F32, SHAPE(ch), NULL);
    s->total = tc_tensor(c, CH_F32, SHAPE(2 * ch + 1), NULL);
    for (int h = 0; h < 2; h++) {
        s->part[h] = tc_tensor(c, CH_F32, SHAPE(2 * ch + 1), NULL);
        s->dg[h] = tc_tensor(c, CH_F32, SHAPE(ch), tc_floats(c, ch));
        s->db[h] = tc_tensor(c, CH_F32, SHAPE(ch), tc_floats(c, ch));
    }
}

/* What data parallelism relies on: each half with its own local sums and
 * the added total gives the whole batch's y and dx, and the halves'
 * dgamma and dbeta add up to the whole batch's. */
static void test_batchnorm_split(ch_device *dev, int ndim, const int64_t *shape, int64_t first)
{
    char str[64];
    tcase c;
    ref_shape_str(str, sizeof str, ndim, shape);
    tc_begin(&c, dev, "batchnorm split %s into %" PRId64 " + %" PRId64 " samples, sums added: "
             "y, dx, dgamma + dgamma, dbeta + dbeta equal the whole batch's", str, first,
             shape[0] - first);
    int64_t n = ref_numel(ndim, shape);
    bn_split s;
    split_new(&c, &s, ndim, shape, first);
    whole_step(&c, &s);
    double *whole = step_results(&c, &s, n, 1);
    TC(&c, ch_fill(s.dg[0], 0.0));
    TC(&c, ch_fill(s.db[0], 0.0));
    split_step(&c, &s);
    double *split = step_results(&c, &s, n, 2);
    /* Each output against the largest of its kind: y, dx, dgamma, dbeta. */
    int64_t at[] = {0, n, 2 * n, 2 * n + s.ch, 2 * n + 2 * s.ch};
    double err = 0.0;
    for (int k = 0; k < 4; k++)
        err = fmax(err, ref_err_scaled(split + at[k], whole + at[k], at[k + 1] - at[k], 1e-6));
    tc_end_err(&c, err, TOL_SPLIT);
}

/* ---- Running statistics and the variance of large means ------------------ */

/* Three training steps with momentum 0.1 from PyTorch's initial running
 * statistics (0 and 1), against PyTorch's update in double: r = (1 - m) r
 * + m stat, the variance unbiased (M / (M - 1)). */
static void test_running_stats(ch_device *dev)
{
    const int64_t outer = 6, ch = 4, inner = 5, n = outer * ch * inner;
    const float momentum = 0.1f, eps = 1e-5f;
    tcase c;
    tc_begin(&c, dev, "running statistics after 3 steps, momentum %g, x [%" PRId64
             ",%" PRId64 ",%" PRId64 "], against PyTorch's update in double", momentum, outer,
             ch, inner);
    double rm[4] = {0, 0, 0, 0}, rv[4] = {1, 1, 1, 1};
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(outer, ch, inner), NULL);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *trm = tc_tensor(&c, CH_F32, SHAPE(ch), (float[]){0, 0, 0, 0});
    ch_tensor *trv = tc_tensor(&c, CH_F32, SHAPE(ch), (float[]){1, 1, 1, 1});
    bn_scratch sc = bn_scratch_new(&c, ch);
    for (int step = 0; step < 3; step++) {
        float *x = tc_random(&c, n, 1, 3 + (float)step);
        tc_upload(&c, tx, x);
        bn_stats_two_pass(&c, &sc, tm, tr, trm, trv, tx, momentum, eps);
        for (int64_t k = 0; k < ch; k++) {
            double s = 0.0, q = 0.0;
            for (int64_t o = 0; o < outer; o++)
                for (int64_t i = 0; i < inner; i++)
                    s += x[(o * ch + k) * inner + i];
            double m = s / (double)(outer * inner);
            for (int64_t o = 0; o < outer; o++)
                for (int64_t i = 0; i < inner; i++)
                    q += ((double)x[(o * ch + k) * inner + i] - m) *
                         ((double)x[(o * ch + k) * inner + i] - m);
            rm[k] = (1 - momentum) * rm[k] + momentum * m;
            rv[k] = (1 - momentum) * rv[k] + momentum * q / (double)(outer * inner - 1);
        }
    }
    float *got = fetch_all(&c, 2, (ch_tensor *[]){trm, trv}, (int64_t[]){ch, ch});
    double want[8];
    memcpy(want, rm, sizeof rm);
    memcpy(want + 4, rv, sizeof rv);
    tc_append(&c, " (running_var[0] %.9g, want %.9g)", got[4], want[4]);
    tc_end_err(&c, ref_err(got, want, NULL, 2 * ch), TOL_SUM);
}

/* The exact biased variance of each channel of the f32 x, in double. */
static void exact_variances(double *var, int64_t outer, int64_t ch, int64_t inner,
                            const float *x)
{
    for (int64_t k = 0; k < ch; k++) {
        double s = 0.0, q = 0.0, count = (double)(outer * inner);
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++)
                s += x[(o * ch + k) * inner + i];
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++)
                q += ((double)x[(o * ch + k) * inner + i] - s / count) *
                     ((double)x[(o * ch + k) * inner + i] - s / count);
        var[k] = q / count;
    }
}

/* Channels of mean near 100 and standard deviation 0.01: the variance,
 * read from the running variance after one step of momentum 1 (which is
 * the batch's unbiased variance), by the two-pass recipe and by one pass
 * without a centre. */
static void test_large_mean(ch_device *dev, int two_pass)
{
    const int64_t outer = 16, ch = 3, inner = 256, n = outer * ch * inner;
    const double count = (double)(outer * inner);
    tcase c;
    tc_begin(&c, dev, "batchnorm variance of channels of mean 100, std 0.01, %s",
             two_pass ? "two passes (ops.h's recipe)" : "one pass without a centre");
    /* uniform of standard deviation 0.01 around these */
    static const double means[] = {100.0, 100.5, -100.0};
    float *x = tc_floats(&c, n);
    for (int64_t i = 0; i < n; i++) {
        double u = tap_rng_uniform(&c.rng, -1, 1) * sqrt(3.0) * 0.01;
        x[i] = (float)(means[(i / inner) % ch] + u);
    }
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(outer, ch, inner), x);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    ch_tensor *trm = tc_tensor(&c, CH_F32, SHAPE(ch), tc_floats(&c, ch));
    ch_tensor *trv = tc_tensor(&c, CH_F32, SHAPE(ch), tc_floats(&c, ch));
    bn_scratch sc = bn_scratch_new(&c, ch);
    if (two_pass) {
        bn_stats_two_pass(&c, &sc, tm, tr, trm, trv, tx, 1.0f, 0.0f);
    } else {
        TC(&c, ch_channel_sums(sc.sums, tx, NULL, tx, NULL));
        TC(&c, ch_batchnorm_stats(tm, tr, trm, trv, sc.sums, NULL, 1.0f, 0.0f));
    }
    float *rv = tc_fetch(&c, trv, ch);
    double var[3], err = 0.0;
    exact_variances(var, outer, ch, inner, x);
    for (int64_t k = 0; k < ch; k++)
        err = fmax(err, fabs(rv[k] * (count - 1) / count - var[k]) / var[k]);
    tc_append(&c, " (variance[0] %.7g, exact %.7g)", rv[0] * (count - 1) / count, var[0]);
    if (two_pass) {
        tc_end_err(&c, err, TOL_VARIANCE);
    } else {
        char detail[160];
        snprintf(detail, sizeof detail, "relative error %.3g, want > %g (the centre matters)",
                 err, TOL_ONE_PASS_LOST);
        tc_end_exact(&c, err > TOL_ONE_PASS_LOST, detail);
    }
}

/* ---- Repeatability ------------------------------------------------------- */

/* The same inputs twice give the same bits: no atomics, fixed orders. */
static void test_repeatable(ch_device *dev)
{
    /* Small sizes: fewer rows, and two splits per channel rather than 10. */
    const int64_t rows = tc_small() ? 40 : 300, d = 257, outer = 9, ch = 3,
                  inner = tc_small() ? 1000 : 5000;
    tcase c;
    tc_begin(&c, dev, "the same bits twice: layernorm_backward [%" PRId64 ",%" PRId64
             "], channel_sums [%" PRId64 ",%" PRId64 ",%" PRId64 "]", rows, d, outer, ch, inner);
    float *x = tc_random(&c, rows * d, -2, 3), *dy = tc_random(&c, rows * d, -1, 1);
    float *bx = tc_random(&c, outer * ch * inner, -2, 3);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(rows, d), x);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(rows, d), dy);
    ch_tensor *tg = tc_tensor(&c, CH_F32, SHAPE(d), tc_random(&c, d, 0.5f, 1.5f));
    ch_tensor *tb = tc_tensor(&c, CH_F32, SHAPE(d), tc_floats(&c, d));
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(rows, d), NULL);
    ch_tensor *tm = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    ch_tensor *tr = tc_tensor(&c, CH_F32, SHAPE(rows), NULL);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(rows, d), NULL);
    ch_tensor *tdg = tc_tensor(&c, CH_F32, SHAPE(d), NULL);
    ch_tensor *tbx = tc_tensor(&c, CH_F32, SHAPE(outer, ch, inner), bx);
    ch_tensor *ts = tc_tensor(&c, CH_F32, SHAPE(2 * ch + 1), NULL);
    int64_t words = rows * d + 2 * d + 2 * ch + 1;
    float *run[2];
    TC(&c, ch_layernorm(ty, tm, tr, tx, tg, tb, 1e-5f));
    for (int k = 0; k < 2; k++) {
        TC(&c, ch_fill(tdg, 0.0));
        TC(&c, ch_fill(tb, 0.0));
        TC(&c, ch_layernorm_backward(tdx, tdg, tb, tdy, tx, tm, tr, tg));
        TC(&c, ch_channel_sums(ts, tbx, NULL, tbx, NULL));
        run[k] = fetch_all(&c, 4, (ch_tensor *[]){tdx, tdg, tb, ts},
                           (int64_t[]){rows * d, d, d, 2 * ch + 1});
    }
    tc_end_words(&c, run[1], run[0], words, 1);
}

/* ---- Bad arguments ------------------------------------------------------- */

#define EXPECT(call, want, needle, ...) \
    (ch_clear_error(), tap_status_is((call), (want), (needle), __VA_ARGS__))

static void test_before_init(void)
{
    EXPECT(ch_layernorm(NULL, NULL, NULL, NULL, NULL, NULL, 1e-5f), CH_ERR_STATE,
           "ch_layernorm: call ch_init first", "ch_layernorm before ch_init");
    EXPECT(ch_layernorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL), CH_ERR_STATE,
           "ch_layernorm_backward: call ch_init first", "ch_layernorm_backward before ch_init");
    EXPECT(ch_channel_sums(NULL, NULL, NULL, NULL, NULL), CH_ERR_STATE,
           "ch_channel_sums: call ch_init first", "ch_channel_sums before ch_init");
    EXPECT(ch_batchnorm_stats(NULL, NULL, NULL, NULL, NULL, NULL, 0.1f, 1e-5f), CH_ERR_STATE,
           "ch_batchnorm_stats: call ch_init first", "ch_batchnorm_stats before ch_init");
    EXPECT(ch_batchnorm_forward(NULL, NULL, NULL, NULL, NULL, NULL), CH_ERR_STATE,
           "ch_batchnorm_forward: call ch_init first", "ch_batchnorm_forward before ch_init");
    EXPECT(ch_batchnorm_backward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
           CH_ERR_STATE, "ch_batchnorm_backward: call ch_init first",
           "ch_batchnorm_backward before ch_init");
}

/* Tensors for the bad-argument calls: x [4, 3, 5] (LayerNorm: rows 12,
 * D 5; BatchNorm: C 3), the right sizes for every other argument, and
 * a few wrong ones. */
typedef struct bad_args {
    ch_tensor *x, *y, *dy, *rows, *rows2, *d, *d2, *d3, *c, *c2, *c3, *c4, *sums, *sums2;
    ch_tensor *xi32, *flat, *x_t, *big_lo, *big_hi, *c_other;
    /* one buffer seen as x and as small pieces inside it */
    ch_tensor *in_x, *in_sums, *in_c;
} bad_args;

static ch_tensor *bad_tensor(tcase *c, ch_device *dev, ch_dtype dt, int ndim,
                             const int64_t *shape)
{
    ch_tensor *t = NULL;
    TC(c, ch_tensor_new(&t, dev, dt, ndim, shape));
    if (t)
        tc_track(c, t);
    return t;
}

static ch_tensor *reshaped(tcase *c, ch_tensor *src, int ndim, const int64_t *shape)
{
    ch_tensor *t = NULL;
    TC(c, ch_tensor_reshape(&t, src, ndim, shape));
    if (t)
        tc_track(c, t);
    return t;
}

static void bad_args_new(tcase *c, bad_args *a, ch_device *other)
{
    ch_tensor **f32_3d[] = {&a->x, &a->y, &a->dy};
    for (size_t i = 0; i < sizeof f32_3d / sizeof f32_3d[0]; i++)
        *f32_3d[i] = tc_tensor(c, CH_F32, SHAPE(4, 3, 5), tc_floats(c, 60));
    ch_tensor **rows[] = {&a->rows, &a->rows2};
    for (size_t i = 0; i < 2; i++)
        *rows[i] = tc_tensor(c, CH_F32, SHAPE(12), tc_floats(c, 12));
    ch_tensor **d[] = {&a->d, &a->d2, &a->d3};
    for (size_t i = 0; i < 3; i++)
        *d[i] = tc_tensor(c, CH_F32, SHAPE(5), tc_floats(c, 5));
    ch_tensor **ch[] = {&a->c, &a->c2, &a->c3, &a->c4};
    for (size_t i = 0; i < 4; i++)
        *ch[i] = tc_tensor(c, CH_F32, SHAPE(3), tc_floats(c, 3));
    a->sums = tc_tensor(c, CH_F32, SHAPE(7), tc_floats(c, 7));
    a->sums2 = tc_tensor(c, CH_F32, SHAPE(7), tc_floats(c, 7));
    a->xi32 = tc_tensor(c, CH_I32, SHAPE(4, 3, 5), tc_floats(c, 60));
    a->flat = tc_tensor(c, CH_F32, SHAPE(60), tc_floats(c, 60));
    a->x_t = tc_tensor(c, CH_F32, SHAPE(3, 4, 5), tc_floats(c, 60));
    /* [8, 3, 5] seen as rows 0-3 and rows 2-5: they overlap partly. */
    ch_tensor *big = tc_tensor(c, CH_F32, SHAPE(8, 3, 5), tc_floats(c, 120));
    a->big_lo = tc_view(c, big, 0, 4);
    a->big_hi = tc_view(c, big, 2, 4);
    ch_tensor *flat = tc_tensor(c, CH_F32, SHAPE(60), tc_floats(c, 60));
    a->in_x = reshaped(c, flat, SHAPE(4, 3, 5));
    a->in_sums = tc_view(c, flat, 10, 7);
    a->in_c = tc_view(c, flat, 30, 3);
    a->c_other = other ? bad_tensor(c, other, CH_F32, SHAPE(3)) : NULL;
}

static void bad_layernorm(const bad_args *a)
{
    const float eps = 1e-5f;
    EXPECT(ch_layernorm(NULL, a->rows, a->rows2, a->x, a->d, a->d2, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm: y is NULL", "ch_layernorm: y NULL");
    EXPECT(ch_layernorm(a->y, a->rows, a->rows2, a->x, a->d, NULL, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm: beta is NULL", "ch_layernorm: beta NULL");
    EXPECT(ch_layernorm(a->y, a->rows, a->rows2, a->xi32, a->d, a->d2, eps), CH_ERR_DTYPE,
           "ch_layernorm: x is i32", "ch_layernorm: x i32");
    EXPECT(ch_layernorm(a->y, a->rows, a->rows2, a->x, a->d, a->d2, -1e-5f),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm: eps", "ch_layernorm: eps < 0");
    EXPECT(ch_layernorm(a->y, a->rows, a->rows2, a->x, a->d, a->d2, NAN),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm: eps", "ch_layernorm: eps NaN");
    EXPECT(ch_layernorm(a->sums, a->rows, a->rows2, a->x, a->d, a->d2, eps), CH_ERR_SHAPE,
           "ch_layernorm: y has 7 elements", "ch_layernorm: y the wrong size");
    EXPECT(ch_layernorm(a->y, a->d, a->rows2, a->x, a->d, a->d2, eps), CH_ERR_SHAPE,
           "ch_layernorm: mean has 5 elements, expected 12", "ch_layernorm: mean not [rows]");
    EXPECT(ch_layernorm(a->y, a->rows, a->rows2, a->x, a->c, a->d2, eps), CH_ERR_SHAPE,
           "ch_layernorm: gamma has 3 elements, expected 5", "ch_layernorm: gamma not [D]");
    EXPECT(ch_layernorm(a->x, a->rows, a->rows2, a->x, a->d, a->d2, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm: y overlaps x", "ch_layernorm: y is x");
    EXPECT(ch_layernorm(a->y, a->rows, a->rows, a->x, a->d, a->d2, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm: mean overlaps rstd",
           "ch_layernorm: mean is rstd");
    tap_status_ok(ch_layernorm(a->y, a->rows, a->rows2, a->x, a->d, a->d, eps),
                  "ch_layernorm: gamma and beta the same tensor (inputs may share)");
}

static void bad_layernorm_backward(const bad_args *a)
{
    EXPECT(ch_layernorm_backward(a->x, NULL, a->d2, a->dy, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm_backward: dgamma is NULL",
           "ch_layernorm_backward: dgamma NULL");
    EXPECT(ch_layernorm_backward(a->x, a->d, a->d2, a->dy, a->y, a->rows, NULL, a->d3),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm_backward: rstd is NULL",
           "ch_layernorm_backward: rstd NULL");
    EXPECT(ch_layernorm_backward(a->x, a->d, a->d2, a->xi32, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_DTYPE, "ch_layernorm_backward: dy is i32", "ch_layernorm_backward: dy i32");
    EXPECT(ch_layernorm_backward(a->sums, a->d, a->d2, a->dy, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_SHAPE, "ch_layernorm_backward: dx has 7 elements",
           "ch_layernorm_backward: dx the wrong size");
    EXPECT(ch_layernorm_backward(a->x, a->d, a->d2, a->sums, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_SHAPE, "ch_layernorm_backward: dy has 7 elements",
           "ch_layernorm_backward: dy the wrong size");
    EXPECT(ch_layernorm_backward(a->x, a->d, a->d2, a->dy, a->y, a->rows, a->d, a->d3),
           CH_ERR_SHAPE, "ch_layernorm_backward: rstd has 5 elements, expected 12",
           "ch_layernorm_backward: rstd not [rows]");
    EXPECT(ch_layernorm_backward(a->x, a->c, a->d2, a->dy, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_SHAPE, "ch_layernorm_backward: dgamma has 3 elements, expected 5",
           "ch_layernorm_backward: dgamma not [D]");
    EXPECT(ch_layernorm_backward(a->x, a->d, a->d, a->dy, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm_backward: dgamma overlaps dbeta",
           "ch_layernorm_backward: dgamma is dbeta");
    EXPECT(ch_layernorm_backward(a->dy, a->d, a->d2, a->dy, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm_backward: dx overlaps dy",
           "ch_layernorm_backward: dx is dy");
    EXPECT(ch_layernorm_backward(a->x, a->d3, a->d2, a->dy, a->y, a->rows, a->rows2, a->d3),
           CH_ERR_INVALID_ARGUMENT, "ch_layernorm_backward: dgamma overlaps gamma",
           "ch_layernorm_backward: dgamma is gamma");
}

static void bad_channel_sums(const bad_args *a)
{
    EXPECT(ch_channel_sums(NULL, a->x, NULL, a->x, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_channel_sums: sums is NULL", "ch_channel_sums: sums NULL");
    EXPECT(ch_channel_sums(a->sums, a->x, NULL, NULL, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_channel_sums: b is NULL", "ch_channel_sums: b NULL");
    EXPECT(ch_channel_sums(a->sums, a->x, NULL, a->xi32, NULL), CH_ERR_DTYPE,
           "ch_channel_sums: b is i32", "ch_channel_sums: b i32");
    EXPECT(ch_channel_sums(a->sums, a->flat, NULL, a->flat, NULL), CH_ERR_SHAPE,
           "ch_channel_sums: a has 1 dimension, expected at least 2",
           "ch_channel_sums: a without channels");
    EXPECT(ch_channel_sums(a->sums, a->x, NULL, a->x_t, NULL), CH_ERR_SHAPE,
           "ch_channel_sums: a and b have different shapes",
           "ch_channel_sums: b of a's size but another shape");
    EXPECT(ch_channel_sums(a->c, a->x, NULL, a->x, NULL), CH_ERR_SHAPE,
           "ch_channel_sums: sums has 3 elements, expected 7",
           "ch_channel_sums: sums not [2C + 1]");
    EXPECT(ch_channel_sums(a->sums, a->x, a->d, a->x, NULL), CH_ERR_SHAPE,
           "ch_channel_sums: a_center has 5 elements, expected 3",
           "ch_channel_sums: a_center not [C]");
    EXPECT(ch_channel_sums(a->sums, a->x, NULL, a->x, a->sums), CH_ERR_SHAPE,
           "ch_channel_sums: b_center has 7 elements, expected 3",
           "ch_channel_sums: b_center not [C]");
    EXPECT(ch_channel_sums(a->in_sums, a->in_x, NULL, a->x, NULL), CH_ERR_INVALID_ARGUMENT,
           "ch_channel_sums: sums overlaps a", "ch_channel_sums: sums inside a");
    tap_status_ok(ch_channel_sums(a->sums, a->in_x, a->in_c, a->in_x, a->in_c),
                  "ch_channel_sums: a and b the same tensor, centres inside it (inputs may share)");
}

static void bad_batchnorm_stats(const bad_args *a)
{
    const float k = 0.1f, eps = 1e-5f;
    EXPECT(ch_batchnorm_stats(NULL, a->c2, NULL, NULL, a->sums, NULL, k, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: mean is NULL",
           "ch_batchnorm_stats: mean NULL");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, a->c3, NULL, a->sums, NULL, k, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: running_var is NULL but running_mean",
           "ch_batchnorm_stats: running_mean without running_var");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, NULL, a->c4, a->sums, NULL, k, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: running_mean is NULL but running_var",
           "ch_batchnorm_stats: running_var without running_mean");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, NULL, NULL, NULL, NULL, k, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: sums is NULL (evaluation)",
           "ch_batchnorm_stats: evaluation without running statistics");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, a->c3, a->c4, NULL, a->d, k, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: center is given but sums is NULL",
           "ch_batchnorm_stats: a centre in evaluation");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, a->c3, a->c4, a->sums, NULL, 1.5f, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: momentum 1.5",
           "ch_batchnorm_stats: momentum above 1");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, a->c3, a->c4, a->sums, NULL, NAN, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: momentum is nan",
           "ch_batchnorm_stats: momentum NaN");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, a->c3, a->c4, a->sums, NULL, k, -1.0f),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: eps -1",
           "ch_batchnorm_stats: eps < 0");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, a->c3, a->c4, a->x, NULL, k, eps), CH_ERR_SHAPE,
           "ch_batchnorm_stats: sums has 60 elements, expected 7",
           "ch_batchnorm_stats: sums not [2C + 1]");
    EXPECT(ch_batchnorm_stats(a->c, a->d, NULL, NULL, a->sums, NULL, k, eps), CH_ERR_SHAPE,
           "ch_batchnorm_stats: rstd has 5 elements, expected 3",
           "ch_batchnorm_stats: rstd not [C]");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, NULL, NULL, a->sums, a->d, k, eps), CH_ERR_SHAPE,
           "ch_batchnorm_stats: center has 5 elements, expected 3",
           "ch_batchnorm_stats: center not [C]");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, a->c, a->c4, a->sums, NULL, k, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: mean overlaps running_mean",
           "ch_batchnorm_stats: mean is running_mean");
    EXPECT(ch_batchnorm_stats(a->c, a->c2, NULL, NULL, a->sums, a->c, k, eps),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_stats: mean overlaps center",
           "ch_batchnorm_stats: mean is center");
    tap_status_ok(ch_batchnorm_stats(a->c, a->c2, a->c3, a->c4, a->sums, NULL, 0.0f, 0.0f),
                  "ch_batchnorm_stats: momentum 0 and eps 0 are allowed");
}

static void bad_batchnorm_forward(const bad_args *a)
{
    EXPECT(ch_batchnorm_forward(a->y, a->x, a->c, a->c2, NULL, a->c4), CH_ERR_INVALID_ARGUMENT,
           "ch_batchnorm_forward: gamma is NULL", "ch_batchnorm_forward: gamma NULL");
    EXPECT(ch_batchnorm_forward(a->y, a->xi32, a->c, a->c2, a->c3, a->c4), CH_ERR_DTYPE,
           "ch_batchnorm_forward: x is i32", "ch_batchnorm_forward: x i32");
    EXPECT(ch_batchnorm_forward(a->flat, a->flat, a->c, a->c2, a->c3, a->c4), CH_ERR_SHAPE,
           "ch_batchnorm_forward: x has 1 dimension", "ch_batchnorm_forward: x without channels");
    EXPECT(ch_batchnorm_forward(a->sums, a->x, a->c, a->c2, a->c3, a->c4), CH_ERR_SHAPE,
           "ch_batchnorm_forward: y has 7 elements", "ch_batchnorm_forward: y the wrong size");
    EXPECT(ch_batchnorm_forward(a->y, a->x, a->c, a->d, a->c3, a->c4), CH_ERR_SHAPE,
           "ch_batchnorm_forward: rstd has 5 elements, expected 3",
           "ch_batchnorm_forward: rstd not [C]");
    EXPECT(ch_batchnorm_forward(a->big_hi, a->big_lo, a->c, a->c2, a->c3, a->c4),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_forward: y partly overlaps x",
           "ch_batchnorm_forward: y partly over x");
    EXPECT(ch_batchnorm_forward(a->in_x, a->x, a->c, a->c2, a->in_c, a->c4),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_forward: y overlaps gamma",
           "ch_batchnorm_forward: gamma inside y");
    tap_status_ok(ch_batchnorm_forward(a->y, a->x, a->c, a->c2, a->c3, a->c3),
                  "ch_batchnorm_forward: gamma and beta the same tensor (inputs may share)");
}

static void bad_batchnorm_backward(const bad_args *a)
{
    EXPECT(ch_batchnorm_backward(a->x, a->c, a->c2, a->dy, a->y, a->c3, a->c4, a->c3, a->sums,
                                 NULL),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_backward: total is NULL",
           "ch_batchnorm_backward: total NULL");
    EXPECT(ch_batchnorm_backward(a->x, a->c, a->c2, a->dy, a->xi32, a->c3, a->c4, a->c3,
                                 a->sums, a->sums2),
           CH_ERR_DTYPE, "ch_batchnorm_backward: x is i32", "ch_batchnorm_backward: x i32");
    EXPECT(ch_batchnorm_backward(a->x, a->c, a->c2, a->sums, a->y, a->c3, a->c4, a->c3,
                                 a->sums, a->sums2),
           CH_ERR_SHAPE, "ch_batchnorm_backward: dy has 7 elements",
           "ch_batchnorm_backward: dy the wrong size");
    EXPECT(ch_batchnorm_backward(a->x, a->c, a->c2, a->dy, a->y, a->c3, a->d, a->c3, a->sums,
                                 a->sums2),
           CH_ERR_SHAPE, "ch_batchnorm_backward: rstd has 5 elements, expected 3",
           "ch_batchnorm_backward: rstd not [C]");
    EXPECT(ch_batchnorm_backward(a->x, a->c, a->c2, a->dy, a->y, a->c3, a->c4, a->c3, a->c,
                                 a->sums2),
           CH_ERR_SHAPE, "ch_batchnorm_backward: local has 3 elements, expected 7",
           "ch_batchnorm_backward: local not [2C + 1]");
    EXPECT(ch_batchnorm_backward(a->x, a->c, a->c, a->dy, a->y, a->c3, a->c4, a->c3, a->sums,
                                 a->sums2),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_backward: dgamma overlaps dbeta",
           "ch_batchnorm_backward: dgamma is dbeta");
    EXPECT(ch_batchnorm_backward(a->y, a->c, a->c2, a->dy, a->y, a->c3, a->c4, a->c3, a->sums,
                                 a->sums2),
           CH_ERR_INVALID_ARGUMENT, "ch_batchnorm_backward: dx overlaps x",
           "ch_batchnorm_backward: dx is x");
    tap_status_ok(ch_batchnorm_backward(NULL, a->c, a->c2, a->dy, a->y, a->c3, a->c4, a->c3,
                                        a->sums, a->sums),
                  "ch_batchnorm_backward: dx NULL, local and total the same tensor");
}

/* Every tensor of an op must be on one device. */
static void bad_devices(const bad_args *a, ch_device *other)
{
    if (!a->c_other) {
        tap_skip("normalisation ops with tensors on two devices: only one device here");
        return;
    }
    const char *needle = ch_device_id(other);
    EXPECT(ch_layernorm(a->y, a->rows, a->rows2, a->x, a->d, a->c_other, 1e-5f),
           CH_ERR_DEVICE_MISMATCH, needle, "ch_layernorm: beta on %s", needle);
    EXPECT(ch_channel_sums(a->sums, a->x, a->c_other, a->x, NULL), CH_ERR_DEVICE_MISMATCH,
           needle, "ch_channel_sums: a_center on %s", needle);
    EXPECT(ch_batchnorm_stats(a->c, a->c2, NULL, NULL, a->sums, a->c_other, 0.1f, 1e-5f),
           CH_ERR_DEVICE_MISMATCH, needle, "ch_batchnorm_stats: center on %s", needle);
    EXPECT(ch_batchnorm_forward(a->y, a->x, a->c, a->c_other, a->c3, a->c4),
           CH_ERR_DEVICE_MISMATCH, needle, "ch_batchnorm_forward: rstd on %s", needle);
    EXPECT(ch_batchnorm_backward(a->x, a->c, a->c2, a->dy, a->y, a->c3, a->c4, a->c_other,
                                 a->sums, a->sums2),
           CH_ERR_DEVICE_MISMATCH, needle, "ch_batchnorm_backward: gamma on %s", needle);
    EXPECT(ch_layernorm_backward(a->x, a->d, a->d2, a->dy, a->y, a->rows, a->rows2, a->c_other),
           CH_ERR_DEVICE_MISMATCH, needle, "ch_layernorm_backward: gamma on %s", needle);
}

static void test_bad_args(ch_device *dev, ch_device *other)
{
    tcase c;
    bad_args a;
    tc_begin(&c, dev, "tensors for the bad-argument calls");
    bad_args_new(&c, &a, other);
    if (c.st != CH_OK) {
        tc_end_exact(&c, 0, "");
        return;
    }
    bad_layernorm(&a);
    bad_layernorm_backward(&a);
    bad_channel_sums(&a);
    bad_batchnorm_stats(&a);
    bad_batchnorm_forward(&a);
    bad_batchnorm_backward(&a);
    bad_devices(&a, other);
    tc_end_exact(&c, 1, "made and freed");
}

/* ---- Main ---------------------------------------------------------------- */

static void test_layernorms(ch_device *dev)
{
    test_layernorm(dev, SHAPE(1), 1e-5f);
    test_layernorm(dev, SHAPE(5, 1), 1e-3f);
    test_layernorm(dev, SHAPE(3, 7), 1e-5f);
    test_layernorm(dev, SHAPE(4, 3, 33), 1e-5f);
    test_layernorm(dev, SHAPE(65, 128), 1e-5f);
    test_layernorm(dev, SHAPE(2, 1031), 1e-6f);
    /* Small sizes (CHORUS_TEST_SIZES): 33 rows, the parameter gradients'
     * chunks of 32 then one. */
    int64_t rows = tc_small() ? 33 : 257;
    test_layernorm(dev, SHAPE(rows, 300), 1e-5f);
    test_layernorm_backward(dev, SHAPE(1), 1);
    test_layernorm_backward(dev, SHAPE(3, 7), 1);
    test_layernorm_backward(dev, SHAPE(4, 3, 33), 0);
    test_layernorm_backward(dev, SHAPE(65, 128), 1);
    test_layernorm_backward(dev, SHAPE(2, 1031), 1);
    test_layernorm_backward(dev, SHAPE(rows, 300), 1);
    test_layernorm_backward(dev, SHAPE(rows, 300), 0);
    grad_layernorm(dev, 3, 7);
    grad_layernorm(dev, 2, 1);
}

static void test_batchnorms(ch_device *dev)
{
    for (int k = 0; k < 3; k++) {
        test_channel_sums(dev, SHAPE(1, 1), k);
        test_channel_sums(dev, SHAPE(7, 5), k);
        test_channel_sums(dev, SHAPE(3, 2, 5, 7), k);
        test_channel_sums(dev, SHAPE(2, 17, 9, 13), k);
        /* 8 splits per channel; small sizes: 2, the last shorter. */
        if (tc_small())
            test_channel_sums(dev, SHAPE(9, 2, 31, 33), k);
        else
            test_channel_sums(dev, SHAPE(32, 3, 32, 33), k);
    }
    test_channel_sums_accuracy(dev);
    test_batchnorm_stats(dev, 7, 5, 1, 0, 0, 0.1f);
    test_batchnorm_stats(dev, 3, 4, 11, 1, 0, 0.1f);
    test_batchnorm_stats(dev, 3, 4, 11, 1, 1, 0.1f);
    test_batchnorm_stats(dev, 5, 257, 3, 0, 1, 0.01f);
    test_batchnorm_stats(dev, 2, 3, 1, 1, 1, 1.0f);
    test_batchnorm_stats_single(dev);
    test_batchnorm_stats_eval(dev, 1);
    test_batchnorm_stats_eval(dev, 300);
    test_batchnorm_forward(dev, SHAPE(1, 1), 0);
    test_batchnorm_forward(dev, SHAPE(7, 5), 0);
    test_batchnorm_forward(dev, SHAPE(3, 2, 5, 7), 0);
    test_batchnorm_forward(dev, SHAPE(2, 17, 9, 13), 1);
    test_batchnorm_backward(dev, SHAPE(1, 1), 1);
    test_batchnorm_backward(dev, SHAPE(7, 5), 1);
    test_batchnorm_backward(dev, SHAPE(3, 2, 5, 7), 0);
    test_batchnorm_backward(dev, SHAPE(2, 17, 9, 13), 1);
    grad_batchnorm(dev, SHAPE(3, 2, 2, 3));
    grad_batchnorm(dev, SHAPE(5, 3));
    test_batchnorm_split(dev, SHAPE(5, 3, 4, 3), 2);
    test_batchnorm_split(dev, SHAPE(9, 4, 7, 5), 1);
    test_running_stats(dev);
    test_large_mean(dev, 1);
    test_large_mean(dev, 0);
    test_repeatable(dev);
}

/* The module with the required slots alone (tests/minimal-module.c, which
 * make check builds and names in CHORUS_TEST_MINIMAL_DIR) on the backend
 * path: its device has no fused slots, so the core composes the unfused
 * ops there (each on the host, staged). Quietly: no line per op. */
static void add_minimal_module(void)
{
    const char *dir = getenv("CHORUS_TEST_MINIMAL_DIR"), *old = getenv("CHORUS_BACKEND_PATH");
    if (!dir || !*dir)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s%s%s", dir, old && *old ? ":" : "", old ? old : "");
    setenv("CHORUS_BACKEND_PATH", path, 1);
    setenv("CHORUS_QUIET_FALLBACK", "1", 1);
}

static int is_minimal(ch_device *dev)
{
    ch_device_info info;
    return ch_device_get_info(dev, &info) == CH_OK && strcmp(info.backend, "minimal") == 0;
}

int main(void)
{
    tc_small();
    test_before_init();
    add_minimal_module();
    ch_status st = ch_init();
    if (!tap_status_ok(st, "ch_init"))
        return tap_done();
    tc_skip_missing_backends();
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES);
    for (int i = 0; i < ndev; i++) {
        if (is_minimal(devs[i])) {
            test_residual_layernorms(devs[i], 0);
            continue;
        }
        test_layernorms(devs[i]);
        test_residual_layernorms(devs[i], 1);
        test_batchnorms(devs[i]);
    }
    if (ndev > 0)
        test_bad_args(devs[0], ndev > 1 ? devs[1] : NULL);
    ch_shutdown();
    return tap_done();
}
