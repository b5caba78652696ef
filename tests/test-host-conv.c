/* The host convolution through oneDNN (builds with oneDNN): every shape the
 * ResNet and the op tests use is taken by oneDNN's primitives (not left to
 * the im2col fallback), and the forward, the input gradient and the weight
 * gradient (with beta 0, 0.5 and 1) match a double-precision loop. Also the
 * errors it can give: too small a workspace. The same with bf16 inputs
 * (the conv2d_half slots: x, w and dy bf16, outputs f32), which oneDNN
 * must take on a CPU with AVX512-BF16, and f16 inputs, taken or refused
 * with CH_ERR_UNSUPPORTED (the core then widens them; test-half checks
 * that path). Without oneDNN the test has nothing to check and says so
 * (the im2col convolution is checked by test-ops in every build). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "host.h"

#ifdef HAVE_ONEDNN

typedef struct conv_case {
    int n, c, h, w, o, kh, kw, sh, sw, ph, pw;
    const char *what;
} conv_case;

static ch_conv_geom geom_of(const conv_case *t)
{
    ch_conv_geom g = {t->n, t->c, t->h, t->w, (t->h + 2 * t->ph - t->kh) / t->sh + 1,
                      (t->w + 2 * t->pw - t->kw) / t->sw + 1, t->kh, t->kw, t->sh, t->sw,
                      t->ph, t->pw};
    return g;
}

/* Uniform in [-1, 1), rounded to the inputs' format (mant: its mantissa
 * bits, 23 for f32) with its bits in h when it is half. */
static void fill(float *x, uint16_t *h, size_t n, int mant, tap_rng *rng)
{
    for (size_t i = 0; i < n; i++) {
        x[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
        if (mant < 23) {
            h[i] = tap_half_narrow(mant, x[i]);
            x[i] = tap_float_of(tap_half_widen(mant, h[i]));
        }
    }
}

/* The input element a tap reads, or -1 in the padding. */
static int64_t tap_at(const ch_conv_geom *g, int64_t s, int64_t ci, int64_t oy, int64_t ox,
                      int ky, int kx)
{
    int64_t iy = oy * g->sh - g->ph + ky, ix = ox * g->sw - g->pw + kx;
    if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
        return -1;
    return ((s * g->c + ci) * g->h + iy) * g->w + ix;
}

/* Relative error of got against want, each element against the sum of the
 * magnitudes of its terms. */
static double rel(double got, double want, double mag)
{
    return fabs(got - want) / (mag + 1e-30);
}

/* The three half slots refuse dtype dt for g, each with CH_ERR_UNSUPPORTED
 * and a message holding `needle`; the backward is asked for dx (into
 * `dx`: with neither dx nor dw it has nothing to do and succeeds). They
 * refuse before reading or writing any element. */
static void refused(const ch_conv_geom *g, int64_t o, int dt, float *dx, const char *needle,
                    const char *what)
{
    size_t bytes = 0;
    ch_bmem none = {NULL, 0}, bdx = {dx, 0};
    tap_status_is(chi_host_conv2d_half_workspace(NULL, g, o, dt, 0, 0, &bytes),
                  CH_ERR_UNSUPPORTED, needle, "%s, dtype %d: the workspace query refuses it",
                  what, dt);
    tap_status_is(chi_host_conv2d_half_forward(NULL, g, o, dt, none, none, none, none, 0),
                  CH_ERR_UNSUPPORTED, needle, "%s, dtype %d: the forward refuses it", what, dt);
    tap_status_is(chi_host_conv2d_half_backward(NULL, g, o, dt, bdx, none, 0.0f, none, none,
                                                none, none, 0),
                  CH_ERR_UNSUPPORTED, needle, "%s, dtype %d: the backward refuses it", what, dt);
}

/* Checks of one case with inputs in dt: 6 for f32 and bf16; for f16 6
 * when oneDNN takes it, else 3 (each slot refuses it). */
static void run_case(const conv_case *t, ch_dtype dt, tap_rng *rng)
{
    ch_conv_geom g = geom_of(t);
    int mant = dt == CH_BF16 ? 7 : dt == CH_F16 ? 10 : 23;
    const char *dn = ch_dtype_name(dt);
    int64_t nx = (int64_t)t->n * t->c * t->h * t->w, nw = (int64_t)t->o * t->c * t->kh * t->kw,
            ny = (int64_t)t->n * t->o * g.oh * g.ow;
    float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw),
          *y = malloc(sizeof(float) * ny), *dy = malloc(sizeof(float) * ny),
          *dx = malloc(sizeof(float) * nx), *dw = malloc(sizeof(float) * nw),
          *dw0 = malloc(sizeof(float) * nw);
    uint16_t *hx = malloc(sizeof(uint16_t) * nx), *hw = malloc(sizeof(uint16_t) * nw),
             *hdy = malloc(sizeof(uint16_t) * ny);
    double *wy = calloc(ny, sizeof *wy), *my = calloc(ny, sizeof *my),
           *wdx = calloc(nx, sizeof *wdx), *mdx = calloc(nx, sizeof *mdx),
           *wdw = calloc(nw, sizeof *wdw), *mdw = calloc(nw, sizeof *mdw);
    if (!x || !w || !y || !dy || !dx || !dw || !dw0 || !hx || !hw || !hdy || !wy || !my ||
        !wdx || !mdx || !wdw || !mdw) {
        tap_ok(0, "%s: malloc", t->what);
        goto out;
    }
    fill(x, hx, nx, mant, rng);
    fill(w, hw, nw, mant, rng);
    fill(dy, hdy, ny, mant, rng);
    fill(dw0, NULL, nw, 23, rng);
    /* What the calls read: the floats, or their half bits. */
    const void *in_x = dt == CH_F32 ? (void *)x : hx, *in_w = dt == CH_F32 ? (void *)w : hw,
               *in_dy = dt == CH_F32 ? (void *)dy : hdy;
    for (int64_t s = 0; s < t->n; s++)
        for (int64_t oc = 0; oc < t->o; oc++)
            for (int64_t oy = 0; oy < g.oh; oy++)
                for (int64_t ox = 0; ox < g.ow; ox++) {
                    int64_t yi = ((s * t->o + oc) * g.oh + oy) * g.ow + ox;
                    for (int64_t ci = 0; ci < t->c; ci++)
                        for (int ky = 0; ky < t->kh; ky++)
                            for (int kx = 0; kx < t->kw; kx++) {
                                int64_t xi = tap_at(&g, s, ci, oy, ox, ky, kx);
                                if (xi < 0)
                                    continue;
                                int64_t wi = ((oc * t->c + ci) * t->kh + ky) * t->kw + kx;
                                wy[yi] += (double)w[wi] * x[xi];
                                my[yi] += fabs((double)w[wi] * x[xi]);
                                wdx[xi] += (double)w[wi] * dy[yi];
                                mdx[xi] += fabs((double)w[wi] * dy[yi]);
                                wdw[wi] += (double)dy[yi] * x[xi];
                                mdw[wi] += fabs((double)dy[yi] * x[xi]);
                            }
                }

    size_t bytes = 0;
    int taken = chi_host_dnnl_conv_workspace(&g, t->o, dt, 0, 0, &bytes);
    if (dt == CH_F16 && !taken) {
        /* The slots say so, with a message, and the core widens instead. */
        refused(&g, t->o, dt, dx, "f16", t->what);
        goto out;
    }
    tap_ok(taken, "%s, %s: oneDNN takes the forward", t->what, dn);
    void *ws = bytes ? malloc(bytes) : NULL;
    ch_status st = chi_host_dnnl_conv_forward(&g, t->o, dt, y, in_x, in_w, ws, bytes);
    double worst = 0.0;
    for (int64_t i = 0; i < ny; i++)
        worst = fmax(worst, rel(y[i], wy[i], my[i]));
    tap_ok(st == CH_OK && worst <= 1e-5, "%s, %s: forward, relative error %.2g (want <= 1e-5)",
           t->what, dn, worst);
    free(ws);

    static const float betas[3] = {0.0f, 0.5f, 1.0f};
    for (int want = 1; want <= 3; want++) {
        float beta = betas[want - 1];
        bytes = 0;
        taken = chi_host_dnnl_conv_workspace(&g, t->o, dt, 1, want, &bytes);
        ws = bytes ? malloc(bytes) : NULL;
        memcpy(dw, dw0, sizeof(float) * nw);
        memset(dx, 0xff, sizeof(float) * nx); /* NaN: every element must be written */
        st = chi_host_dnnl_conv_backward(&g, t->o, dt, want & 1 ? dx : NULL,
                                         want & 2 ? dw : NULL, beta, in_dy, in_x, in_w, ws,
                                         bytes);
        double edx = 0.0, edw = 0.0;
        for (int64_t i = 0; (want & 1) && i < nx; i++) {
            double e = rel(dx[i], wdx[i], mdx[i]);
            edx = e == e ? fmax(edx, e) : INFINITY;
        }
        for (int64_t i = 0; (want & 2) && i < nw; i++) {
            double old = beta != 0.0f ? (double)beta * dw0[i] : 0.0;
            edw = fmax(edw, rel(dw[i], wdw[i] + old, mdw[i] + fabs(old)));
        }
        tap_ok(taken && st == CH_OK && edx <= 1e-5 && edw <= 1e-5,
               "%s, %s: backward want %d beta %g taken by oneDNN, dx error %.2g, dw error "
               "%.2g (want <= 1e-5)",
               t->what, dn, want, beta, edx, edw);
        if (want == 3 && bytes > 0) {
            st = chi_host_dnnl_conv_backward(&g, t->o, dt, dx, dw, beta, in_dy, in_x, in_w, ws,
                                             bytes - 1);
            tap_status_is(st, CH_ERR_INVALID_ARGUMENT, "workspace",
                          "%s, %s: a workspace a byte short is refused", t->what, dn);
        }
        free(ws);
    }
out:
    free(x), free(w), free(y), free(dy), free(dx), free(dw), free(dw0);
    free(hx), free(hw), free(hdy);
    free(wy), free(my), free(wdx), free(mdx), free(wdw), free(mdw);
}

int main(void)
{
    static const conv_case cases[] = {
        {4, 1, 28, 28, 16, 3, 3, 1, 1, 1, 1, "resnet conv1 (1 to 16 channels, 3x3 same)"},
        {4, 16, 28, 28, 16, 3, 3, 1, 1, 1, 1, "resnet stage 1 (16 channels, 3x3 same)"},
        {4, 16, 28, 28, 32, 3, 3, 2, 2, 1, 1, "resnet stage 2 entry (3x3 stride 2)"},
        {4, 16, 28, 28, 32, 1, 1, 2, 2, 0, 0, "resnet projection (1x1 stride 2)"},
        {3, 32, 7, 7, 64, 3, 3, 1, 1, 1, 1, "resnet stage 3 on a 7x7 plane"},
        {2, 3, 7, 8, 4, 5, 3, 2, 1, 0, 2, "5x3 window, stride 2x1, rows cut off"},
        {2, 3, 8, 9, 4, 3, 3, 2, 2, 0, 0, "3x3 stride 2, the last row and column unread"},
        {2, 2, 75, 80, 3, 3, 3, 1, 1, 1, 1, "a wide plane"},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    tap_rng rng = {20261201};
    /* bf16 convolutions are oneDNN's on CPUs with AVX512-BF16 (and AMX);
     * without, oneDNN 2.x may refuse them, and the test says so. */
    int bf16_cpu = __builtin_cpu_supports("avx512bf16");
    for (int i = 0; i < n; i++)
        run_case(&cases[i], CH_F32, &rng);
    for (int i = 0; i < n; i++) {
        ch_conv_geom g = geom_of(&cases[i]);
        size_t bytes;
        if (bf16_cpu || chi_host_dnnl_conv_workspace(&g, cases[i].o, CH_BF16, 0, 0, &bytes))
            run_case(&cases[i], CH_BF16, &rng);
        else
            tap_skip("%s, bf16: this CPU has no AVX512-BF16 and oneDNN refuses it",
                     cases[i].what);
    }
    for (int i = 0; i < n; i++)
        run_case(&cases[i], CH_F16, &rng);
    /* What a newer core could pass: a dtype that is not a half format. */
    ch_conv_geom g = geom_of(&cases[0]);
    static const int bad[2] = {CH_F32, 99};
    float unused;
    for (int i = 0; i < 2; i++)
        refused(&g, cases[0].o, bad[i], &unused, "not bf16 or f16", "not a half format");
    chi_host_dnnl_shutdown();
    return tap_done();
}

#else

int main(void)
{
    tap_skip_all("this build has no oneDNN (the im2col convolution is checked by test-ops)");
    return 0;
}

#endif
