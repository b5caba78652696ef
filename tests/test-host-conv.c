/* The host convolution through oneDNN (builds with oneDNN): every shape the
 * ResNet and the op tests use is taken by oneDNN's primitives (not left to
 * the im2col fallback), and the forward, the input gradient and the weight
 * gradient (with beta 0, 0.5 and 1) match a double-precision loop. Also the
 * errors it can give: too small a workspace. Without oneDNN the test has
 * nothing to check and says so (the im2col convolution is checked by
 * test-ops in every build). */
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

static void fill(float *x, size_t n, tap_rng *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
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

static void run_case(const conv_case *t, tap_rng *rng)
{
    ch_conv_geom g = geom_of(t);
    int64_t nx = (int64_t)t->n * t->c * t->h * t->w, nw = (int64_t)t->o * t->c * t->kh * t->kw,
            ny = (int64_t)t->n * t->o * g.oh * g.ow;
    float *x = malloc(sizeof(float) * nx), *w = malloc(sizeof(float) * nw),
          *y = malloc(sizeof(float) * ny), *dy = malloc(sizeof(float) * ny),
          *dx = malloc(sizeof(float) * nx), *dw = malloc(sizeof(float) * nw),
          *dw0 = malloc(sizeof(float) * nw);
    double *wy = calloc(ny, sizeof *wy), *my = calloc(ny, sizeof *my),
           *wdx = calloc(nx, sizeof *wdx), *mdx = calloc(nx, sizeof *mdx),
           *wdw = calloc(nw, sizeof *wdw), *mdw = calloc(nw, sizeof *mdw);
    if (!x || !w || !y || !dy || !dx || !dw || !dw0 || !wy || !my || !wdx || !mdx || !wdw ||
        !mdw) {
        tap_ok(0, "%s: malloc", t->what);
        goto out;
    }
    fill(x, nx, rng);
    fill(w, nw, rng);
    fill(dy, ny, rng);
    fill(dw0, nw, rng);
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
    int taken = chi_host_dnnl_conv_workspace(&g, t->o, 0, 0, &bytes);
    tap_ok(taken, "%s: oneDNN takes the forward", t->what);
    void *ws = bytes ? malloc(bytes) : NULL;
    ch_status st = chi_host_dnnl_conv_forward(&g, t->o, y, x, w, ws, bytes);
    double worst = 0.0;
    for (int64_t i = 0; i < ny; i++)
        worst = fmax(worst, rel(y[i], wy[i], my[i]));
    tap_ok(st == CH_OK && worst <= 1e-5, "%s: forward, relative error %.2g (want <= 1e-5)",
           t->what, worst);
    free(ws);

    static const float betas[3] = {0.0f, 0.5f, 1.0f};
    for (int want = 1; want <= 3; want++) {
        float beta = betas[want - 1];
        bytes = 0;
        taken = chi_host_dnnl_conv_workspace(&g, t->o, 1, want, &bytes);
        ws = bytes ? malloc(bytes) : NULL;
        memcpy(dw, dw0, sizeof(float) * nw);
        memset(dx, 0xff, sizeof(float) * nx); /* NaN: every element must be written */
        st = chi_host_dnnl_conv_backward(&g, t->o, want & 1 ? dx : NULL, want & 2 ? dw : NULL,
                                         beta, dy, x, w, ws, bytes);
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
               "%s: backward want %d beta %g taken by oneDNN, dx error %.2g, dw error %.2g "
               "(want <= 1e-5)",
               t->what, want, beta, edx, edw);
        if (want == 3 && bytes > 0) {
            st = chi_host_dnnl_conv_backward(&g, t->o, dx, dw, beta, dy, x, w, ws, bytes - 1);
            tap_status_is(st, CH_ERR_INVALID_ARGUMENT, "workspace",
                          "%s: a workspace a byte short is refused", t->what);
        }
        free(ws);
    }
out:
    free(x), free(w), free(y), free(dy), free(dx), free(dw), free(dw0);
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
    tap_plan(n * 6);
    tap_rng rng = {20261201};
    for (int i = 0; i < n; i++)
        run_case(&cases[i], &rng);
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
