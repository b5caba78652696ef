/* Every backward op on every device checked against the function it is the
 * derivative of: central differences in double of the device's own f32
 * forward ops, or, for the linear ops, the adjoint identity
 * <A x, y> == <x, A^T y> evaluated in double. */
#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "ref.h"
#include "tap.h"

#define MAX_DEVICES 16

/* Finite differences of f32 forwards with a step h = 1e-2, relative to the
 * largest derivative: the truncation error (h^2 / 6 times the third
 * derivative) and the f32 rounding of the forward divided by the step, about
 * 1e-5 each, come to 4.4e-5 at most here (softmax, on PoCL). Adjoint
 * identities suffer only the rounding of the f32 outputs and of the
 * device's own sums (4e-9 at most here). */
#define TOL_FD 5e-4
#define TOL_ADJOINT 1e-6

/* ---- Activations: elementwise, so one perturbation of every element ----- */

static void grad_activation(ch_device *dev, ch_activation act)
{
    const int64_t n = 257;
    const float h = 1e-2f;
    tcase c;
    tc_begin(&c, dev, "%s backward vs central differences, h %g", ref_act_name(act), h);
    float *x = tc_random(&c, n, -3, 3);
    for (int64_t i = 0; i < n; i++)
        if (fabsf(x[i]) < 0.1f) /* away from relu's kink */
            x[i] += x[i] < 0 ? -0.1f : 0.1f;
    float *dy = tc_random(&c, n, -1, 1);
    float *xp = tc_floats(&c, n), *xm = tc_floats(&c, n);
    for (int64_t i = 0; i < n; i++) {
        xp[i] = x[i] + h;
        xm[i] = x[i] - h;
    }
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n), NULL);
    TC(&c, ch_activation_forward(ty, tx, act));
    TC(&c, ch_activation_backward(tdx, tdy, tx, ty, act));
    double *got = tc_widen(&c, tc_fetch(&c, tdx, n), n);
    tc_upload(&c, tx, xp);
    TC(&c, ch_activation_forward(ty, tx, act));
    float *yp = tc_fetch(&c, ty, n);
    tc_upload(&c, tx, xm);
    TC(&c, ch_activation_forward(ty, tx, act));
    float *ym = tc_fetch(&c, ty, n);
    double *want = tc_doubles(&c, n);
    for (int64_t i = 0; i < n; i++)
        want[i] = dy[i] * ((double)yp[i] - ym[i]) / ((double)xp[i] - xm[i]);
    tc_end_err(&c, ref_err_scaled(got, want, n, 1e-6), TOL_FD);
}

/* ---- Softmax cross-entropy: the loss is a scalar of every logit ---------- */

typedef struct xent_setup {
    ch_tensor *loss, *probs;
    const ch_tensor *labels;
} xent_setup;

/* The loss for logits = values. */
static double xent_loss(tcase *c, const void *sv, ch_tensor *logits, const float *values)
{
    const xent_setup *s = sv;
    float value = 0.0f;
    tc_upload(c, logits, values);
    TC(c, ch_softmax_xent(s->loss, s->probs, logits, s->labels));
    tc_download(c, s->loss, &value, 1);
    return value;
}

static void grad_softmax_xent(ch_device *dev, float scale)
{
    const int64_t n = 4, classes = 6, nl = n * classes;
    const float h = 1e-2f;
    tcase c;
    tc_begin(&c, dev, "softmax_xent_backward scale %g vs central differences, h %g", scale, h);
    float *logits = tc_random(&c, nl, -2, 2);
    int32_t *labels = tc_ints(&c, n);
    for (int64_t i = 0; i < n; i++)
        labels[i] = (int32_t)(tap_rng_next(&c.rng) % (uint64_t)classes);
    ch_tensor *tl = tc_tensor(&c, CH_F32, SHAPE(n, classes), logits);
    ch_tensor *tlab = tc_tensor(&c, CH_I32, SHAPE(n), labels);
    ch_tensor *tp = tc_tensor(&c, CH_F32, SHAPE(n, classes), NULL);
    ch_tensor *tloss = tc_tensor(&c, CH_F32, SHAPE(1), NULL);
    ch_tensor *td = tc_tensor(&c, CH_F32, SHAPE(n, classes), NULL);
    TC(&c, ch_softmax_xent(tloss, tp, tl, tlab));
    TC(&c, ch_softmax_xent_backward(td, tp, tlab, scale));
    double *got = tc_widen(&c, tc_fetch(&c, td, nl), nl);
    double *want = tc_doubles(&c, nl);
    xent_setup s = {tloss, tp, tlab};
    tc_central_diff(&c, xent_loss, &s, tl, logits, nl, h, want);
    for (int64_t i = 0; i < nl; i++)
        want[i] *= scale;
    tc_end_err(&c, ref_err_scaled(got, want, nl, 1e-6), TOL_FD);
}

/* ---- bias_grad is the adjoint of bias_add (with x = 0) ------------------- */

static void grad_bias(ch_device *dev, int ndim, const int64_t *shape, int axis)
{
    char s[64];
    tcase c;
    ref_shape_str(s, sizeof s, ndim, shape);
    tc_begin(&c, dev, "bias_grad adjoint of bias_add %s axis %d", s, axis);
    int64_t n = ref_numel(ndim, shape), ch = shape[axis];
    float *bias = tc_random(&c, ch, -1, 1);
    float *dy = tc_random(&c, n, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, ndim, shape, tc_floats(&c, n));
    ch_tensor *ty = tc_tensor(&c, CH_F32, ndim, shape, NULL);
    ch_tensor *tb = tc_tensor(&c, CH_F32, SHAPE(ch), bias);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, ndim, shape, dy);
    ch_tensor *tdb = tc_tensor(&c, CH_F32, SHAPE(ch), NULL);
    TC(&c, ch_bias_add(ty, tx, tb, axis));
    TC(&c, ch_bias_grad(tdb, tdy, axis, 0.0f));
    float *y = tc_fetch(&c, ty, n), *db = tc_fetch(&c, tdb, ch);
    tc_end_adjoint(&c, ref_dot(y, dy, n), ref_dot(bias, db, ch),
                   ref_dot_abs(y, dy, n), TOL_ADJOINT);
}

/* ---- col2im is the adjoint of im2col ------------------------------------- */

static void grad_col2im(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                        const ch_window2d *win)
{
    tcase c;
    tc_begin(&c, dev, "col2im adjoint of im2col x [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64
             "] k%dx%d s%dx%d p%dx%d", n, ch, h, w, win->kh, win->kw, win->sh, win->sw, win->ph,
             win->pw);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t rows = ch * win->kh * win->kw, cols = n * g.oh * g.ow;
    int64_t nx = n * ch * h * w, ncol = rows * cols;
    float *x = tc_random(&c, nx, -1, 1);
    float *col = tc_random(&c, ncol, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *tcol = tc_tensor(&c, CH_F32, SHAPE(rows, cols), col);
    ch_tensor *tix = tc_tensor(&c, CH_F32, SHAPE(rows, cols), NULL);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), NULL);
    TC(&c, ch_im2col(tix, tx, win));
    TC(&c, ch_col2im(tdx, tcol, win));
    float *ix = tc_fetch(&c, tix, ncol), *dx = tc_fetch(&c, tdx, nx);
    tc_end_adjoint(&c, ref_dot(ix, col, ncol), ref_dot(x, dx, nx),
                   ref_dot_abs(ix, col, ncol), TOL_ADJOINT);
}

/* ---- conv2d's backward is its adjoint, in x and in w ------------------------
 * y = conv(x, w) is linear in each: dy . y = dx . x = dw . w. */

static void grad_conv2d(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w, int64_t o,
                        const ch_window2d *win, int in_w)
{
    tcase c;
    tc_begin(&c, dev, "conv2d backward adjoint in %s x [%" PRId64 ",%" PRId64 ",%" PRId64
             ",%" PRId64 "] to %" PRId64 " k%dx%d s%dx%d p%dx%d", in_w ? "w" : "x", n, ch, h, w,
             o, win->kh, win->kw, win->sh, win->sw, win->ph, win->pw);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t nx = n * ch * h * w, nw = o * ch * win->kh * win->kw, ny = n * o * g.oh * g.ow;
    float *x = tc_random(&c, nx, -1, 1), *wt = tc_random(&c, nw, -1, 1);
    float *dy = tc_random(&c, ny, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *tw = tc_tensor(&c, CH_F32, SHAPE(o, ch, win->kh, win->kw), wt);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, o, g.oh, g.ow), dy);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, o, g.oh, g.ow), NULL);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), NULL);
    ch_tensor *tdw = tc_tensor(&c, CH_F32, SHAPE(o, ch, win->kh, win->kw), NULL);
    TC(&c, ch_conv2d(ty, tx, tw, win));
    TC(&c, ch_conv2d_backward(in_w ? NULL : tdx, in_w ? tdw : NULL, tdy, tx, tw, win, 0.0f));
    float *y = tc_fetch(&c, ty, ny);
    if (in_w)
        tc_end_adjoint(&c, ref_dot(y, dy, ny), ref_dot(wt, tc_fetch(&c, tdw, nw), nw),
                       ref_dot_abs(y, dy, ny), TOL_ADJOINT);
    else
        tc_end_adjoint(&c, ref_dot(y, dy, ny), ref_dot(x, tc_fetch(&c, tdx, nx), nx),
                       ref_dot_abs(y, dy, ny), TOL_ADJOINT);
}

/* ---- transpose01 is its own adjoint (with the first two axes swapped) ---- */

static void grad_transpose01(ch_device *dev, int64_t a, int64_t b, int64_t inner)
{
    tcase c;
    tc_begin(&c, dev, "transpose01 adjoint [%" PRId64 ",%" PRId64 ",%" PRId64 "]", a, b, inner);
    int64_t n = a * b * inner;
    float *x = tc_random(&c, n, -1, 1);
    float *y = tc_random(&c, n, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(a, b, inner), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(b, a, inner), y);
    ch_tensor *ttx = tc_tensor(&c, CH_F32, SHAPE(b, a, inner), NULL);
    ch_tensor *tty = tc_tensor(&c, CH_F32, SHAPE(a, b, inner), NULL);
    TC(&c, ch_transpose01(ttx, tx));
    TC(&c, ch_transpose01(tty, ty));
    float *tx_host = tc_fetch(&c, ttx, n), *ty_host = tc_fetch(&c, tty, n);
    tc_end_adjoint(&c, ref_dot(tx_host, y, n), ref_dot(x, ty_host, n),
                   ref_dot_abs(tx_host, y, n), TOL_ADJOINT);
}

/* ---- Max-pool: numeric derivative of <maxpool(x), dy> -------------------- */

/* Distinct values 0.05 apart, shuffled, half of them negative (so padding
 * would win if it were allowed to): a step of 1e-3 changes no argmax. */
static float *distinct_values(tcase *c, int64_t n)
{
    float *x = tc_floats(c, n);
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.05f * (float)(i - n / 2);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(tap_rng_next(&c->rng) % (uint64_t)(i + 1));
        float t = x[i];
        x[i] = x[j];
        x[j] = t;
    }
    return x;
}

typedef struct pool_setup {
    ch_tensor *ty, *tidx;
    const ch_window2d *win;
    const float *dy;
    float *y; /* scratch for the pooled values */
    int64_t ny;
} pool_setup;

/* <maxpool(x), dy> for x = values. */
static double pool_objective(tcase *c, const void *sv, ch_tensor *tx, const float *x)
{
    const pool_setup *s = sv;
    tc_upload(c, tx, x);
    TC(c, ch_maxpool2d(s->ty, s->tidx, tx, s->win));
    tc_download(c, s->ty, s->y, s->ny);
    return ref_dot(s->y, s->dy, s->ny);
}

static void grad_maxpool(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                         const ch_window2d *win)
{
    const float step = 1e-3f;
    tcase c;
    tc_begin(&c, dev, "maxpool2d_backward vs central differences x [%" PRId64 ",%" PRId64
             ",%" PRId64 ",%" PRId64 "] k%dx%d s%dx%d p%dx%d", n, ch, h, w, win->kh, win->kw,
             win->sh, win->sw, win->ph, win->pw);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t nx = n * ch * h * w, ny = n * ch * g.oh * g.ow;
    float *x = distinct_values(&c, nx);
    float *dy = tc_random(&c, ny, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, ch, g.oh, g.ow), NULL);
    ch_tensor *tidx = tc_tensor(&c, CH_I32, SHAPE(n, ch, g.oh, g.ow), NULL);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, ch, g.oh, g.ow), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), NULL);
    TC(&c, ch_maxpool2d(ty, tidx, tx, win));
    TC(&c, ch_maxpool2d_backward(tdx, tdy, tidx, win));
    double *got = tc_widen(&c, tc_fetch(&c, tdx, nx), nx);
    double *want = tc_doubles(&c, nx);
    pool_setup s = {ty, tidx, win, dy, tc_floats(&c, ny), ny};
    tc_central_diff(&c, pool_objective, &s, tx, x, nx, step, want);
    tc_end_err(&c, ref_err_scaled(got, want, nx, 1e-6), TOL_FD);
}

/* The backward routes each dy to the input its window chose, so
 * <maxpool_backward(dy), x> == <dy, maxpool(x)>: a check that scales to
 * inputs too large for finite differences. */
static void grad_maxpool_route(ch_device *dev, int64_t n, int64_t ch, int64_t h, int64_t w,
                               const ch_window2d *win)
{
    tcase c;
    tc_begin(&c, dev, "maxpool2d_backward routes dy to the max: <dx,x> == <dy,y> x [%" PRId64
             ",%" PRId64 ",%" PRId64 ",%" PRId64 "] k%dx%d s%dx%d p%dx%d", n, ch, h, w, win->kh,
             win->kw, win->sh, win->sw, win->ph, win->pw);
    ref_geom g = ref_geom_make(n, ch, h, w, win);
    int64_t nx = n * ch * h * w, ny = n * ch * g.oh * g.ow;
    float *x = tc_random(&c, nx, -1, 1);
    float *dy = tc_random(&c, ny, -1, 1);
    ch_tensor *tx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), x);
    ch_tensor *ty = tc_tensor(&c, CH_F32, SHAPE(n, ch, g.oh, g.ow), NULL);
    ch_tensor *tidx = tc_tensor(&c, CH_I32, SHAPE(n, ch, g.oh, g.ow), NULL);
    ch_tensor *tdy = tc_tensor(&c, CH_F32, SHAPE(n, ch, g.oh, g.ow), dy);
    ch_tensor *tdx = tc_tensor(&c, CH_F32, SHAPE(n, ch, h, w), tc_random(&c, nx, 5, 9));
    TC(&c, ch_maxpool2d(ty, tidx, tx, win));
    TC(&c, ch_maxpool2d_backward(tdx, tdy, tidx, win));
    float *y = tc_fetch(&c, ty, ny), *dx = tc_fetch(&c, tdx, nx);
    tc_end_adjoint(&c, ref_dot(dx, x, nx), ref_dot(dy, y, ny),
                   ref_dot_abs(dx, x, nx), TOL_ADJOINT);
}

/* ---- GEMM: gradients of L = <alpha op(A) op(B), G> ----------------------- */

typedef struct gemm_setup {
    int ta, tb;
    int64_t m, n, k;
    float alpha;
    ch_tensor *a, *b, *c, *g;
    const float *gh;
    float *ch;  /* scratch for c */
} gemm_setup;

static double gemm_objective(tcase *c, const void *sv, ch_tensor *t, const float *values)
{
    const gemm_setup *s = sv;
    tc_upload(c, t, values);
    TC(c, ch_gemm(s->c, s->ta, s->tb, s->alpha, s->a, s->b, 0.0f));
    tc_download(c, s->c, s->ch, s->m * s->n);
    return ref_dot(s->ch, s->gh, s->m * s->n);
}

/* The gradients the way a linear layer's backward computes them:
 * dop(A) = alpha G op(B)^T and dop(B) = alpha op(A)^T G, transposed back
 * when A or B was used transposed. */
static void gemm_analytic(tcase *c, const gemm_setup *s, ch_tensor *da, ch_tensor *db)
{
    if (!s->ta)
        TC(c, ch_gemm(da, 0, !s->tb, s->alpha, s->g, s->b, 0.0f));
    else
        TC(c, ch_gemm(da, s->tb, 1, s->alpha, s->b, s->g, 0.0f));
    if (!s->tb)
        TC(c, ch_gemm(db, !s->ta, 0, s->alpha, s->a, s->g, 0.0f));
    else
        TC(c, ch_gemm(db, 1, s->ta, s->alpha, s->g, s->a, 0.0f));
}

static void grad_gemm(ch_device *dev, int ta, int tb)
{
    tcase c;
    gemm_setup s = {.ta = ta, .tb = tb, .m = 3, .n = 4, .k = 5, .alpha = 0.7f};
    tc_begin(&c, dev, "gemm %c%c gradients of <alpha op(A) op(B), G> vs central differences",
             ta ? 'T' : 'N', tb ? 'T' : 'N');
    int64_t na = s.m * s.k, nb = s.k * s.n;
    float *a = tc_random(&c, na, -1, 1), *b = tc_random(&c, nb, -1, 1);
    float *g = tc_random(&c, s.m * s.n, -1, 1);
    s.gh = g;
    s.ch = tc_floats(&c, s.m * s.n);
    s.a = ta ? tc_tensor(&c, CH_F32, SHAPE(s.k, s.m), a)
             : tc_tensor(&c, CH_F32, SHAPE(s.m, s.k), a);
    s.b = tb ? tc_tensor(&c, CH_F32, SHAPE(s.n, s.k), b)
             : tc_tensor(&c, CH_F32, SHAPE(s.k, s.n), b);
    s.c = tc_tensor(&c, CH_F32, SHAPE(s.m, s.n), NULL);
    s.g = tc_tensor(&c, CH_F32, SHAPE(s.m, s.n), g);
    ch_tensor *da = ta ? tc_tensor(&c, CH_F32, SHAPE(s.k, s.m), NULL)
                       : tc_tensor(&c, CH_F32, SHAPE(s.m, s.k), NULL);
    ch_tensor *db = tb ? tc_tensor(&c, CH_F32, SHAPE(s.n, s.k), NULL)
                       : tc_tensor(&c, CH_F32, SHAPE(s.k, s.n), NULL);
    gemm_analytic(&c, &s, da, db);
    double *got = tc_doubles(&c, na + nb), *want = tc_doubles(&c, na + nb);
    const float *gda = tc_fetch(&c, da, na), *gdb = tc_fetch(&c, db, nb);
    for (int64_t i = 0; i < na + nb; i++)
        got[i] = i < na ? gda[i] : gdb[i - na];
    tc_central_diff(&c, gemm_objective, &s, s.a, a, na, 1e-2f, want);
    tc_central_diff(&c, gemm_objective, &s, s.b, b, nb, 1e-2f, want + na);
    tc_end_err(&c, ref_err_scaled(got, want, na + nb, 1e-6), TOL_FD);
}

/* ---- Main ---------------------------------------------------------------- */

static void test_device(ch_device *dev)
{
    static const ch_window2d windows[] = {
        {3, 3, 1, 1, 0, 0}, {3, 3, 1, 1, 1, 1}, {3, 3, 2, 2, 1, 1},
        {2, 2, 2, 2, 0, 0}, {5, 5, 2, 2, 2, 2}, {3, 2, 2, 1, 1, 0}, {3, 5, 1, 1, 0, 2},
    };
    static const ch_window2d k2s2 = {2, 2, 2, 2, 0, 0}, k3s2p1 = {3, 3, 2, 2, 1, 1};
    for (int act = 0; act < CH_ACT_COUNT; act++)
        grad_activation(dev, act);
    grad_softmax_xent(dev, 1.0f);
    grad_softmax_xent(dev, 2.5f);
    grad_bias(dev, SHAPE(17, 33), 1);
    grad_bias(dev, SHAPE(3, 5, 7, 9), 1);
    grad_bias(dev, SHAPE(2, 3, 4, 5), 3);
    grad_bias(dev, SHAPE(17, 33), 0);
    /* Small sizes (CHORUS_TEST_SIZES) leave out the cases sized for the
     * host's threads; the ones before them cover the same kernels. */
    int full = !tc_small();
    if (full)
        grad_bias(dev, SHAPE(5, 33, 29, 31), 1);
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++)
        grad_col2im(dev, 2, 3, 7, 8, &windows[i]);
    for (size_t i = 0; i < sizeof windows / sizeof windows[0]; i++) {
        grad_conv2d(dev, 2, 3, 7, 8, 4, &windows[i], 0);
        grad_conv2d(dev, 2, 3, 7, 8, 4, &windows[i], 1);
    }
    if (full) {
        grad_conv2d(dev, 5, 16, 14, 14, 16, &windows[1], 0);
        grad_conv2d(dev, 5, 16, 14, 14, 16, &windows[1], 1);
    }
    grad_transpose01(dev, 17, 31, 1);
    grad_transpose01(dev, 5, 7, 3);
    grad_maxpool(dev, 1, 2, 6, 6, &k2s2);
    grad_maxpool(dev, 1, 2, 7, 5, &k3s2p1);
    /* Past the host's threshold for threads (131072 elements), odd sizes. */
    if (full) {
        grad_col2im(dev, 3, 7, 29, 31, &windows[1]);
        grad_col2im(dev, 5, 3, 61, 63, &windows[2]);
    }
    grad_maxpool_route(dev, 1, 2, 7, 9, &k2s2);
    if (full) {
        grad_maxpool_route(dev, 5, 7, 62, 65, &k2s2);
        grad_maxpool_route(dev, 5, 7, 61, 64, &k3s2p1);
    } else {
        grad_maxpool_route(dev, 3, 5, 21, 23, &k3s2p1);
    }
    for (int t = 0; t < 4; t++)
        grad_gemm(dev, t >> 1, t & 1);
}

int main(void)
{
    tc_small();
    ch_status st = ch_init();
    if (!tap_status_ok(st, "ch_init"))
        return tap_done();
    tc_skip_missing_backends();
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES);
    for (int i = 0; i < ndev; i++)
        test_device(devs[i]);
    ch_shutdown();
    return tap_done();
}
