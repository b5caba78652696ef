/* Host convolution helpers and pooling: im2col and its adjoint col2im,
 * max-pooling forward and backward. The backward passes are gathers: each
 * input element is computed by one thread from every output that reads it,
 * so there are no races and the sums run in a fixed order. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <string.h>

#include "host.h"

/* The output rows [lo, hi] whose window (stride s, padding p, size k)
 * covers input row i, clipped to [0, out). Empty when lo > hi. */
static void covering(int64_t i, int s, int p, int k, int64_t out, int64_t *lo,
                     int64_t *hi)
{
    int64_t first = i + p - k + 1;
    *lo = first <= 0 ? 0 : (first + s - 1) / s;
    *hi = (i + p) / s;
    if (*hi > out - 1)
        *hi = out - 1;
}

/* One row of col: entry (ci, ki, kj) of every window of image nn. */
static void im2col_row(float *dst, const float *plane, const ch_conv_geom *g, int ki,
                       int kj)
{
    for (int64_t oy = 0; oy < g->oh; oy++) {
        int64_t iy = oy * g->sh - g->ph + ki;
        float *out = dst + oy * g->ow;
        if (iy < 0 || iy >= g->h) {
            memset(out, 0, (size_t)g->ow * sizeof *out);
            continue;
        }
        for (int64_t ox = 0; ox < g->ow; ox++) {
            int64_t ix = ox * g->sw - g->pw + kj;
            out[ox] = ix >= 0 && ix < g->w ? plane[iy * g->w + ix] : 0.0f;
        }
    }
}

ch_status chi_host_im2col(void *stream, const ch_conv_geom *g, ch_bmem col, ch_bmem x)
{
    (void)stream;
    float *pc = chi_host_f32(col);
    const float *px = chi_host_f32(x);
    int64_t rows = g->c * g->kh * g->kw, plane_out = g->oh * g->ow;
    int64_t row_len = g->n * plane_out;
    CHI_OMP(omp parallel for collapse(2) if (rows * row_len > CHI_HOST_PAR_MIN))
    for (int64_t r = 0; r < rows; r++)
        for (int64_t nn = 0; nn < g->n; nn++) {
            int64_t ci = r / (g->kh * g->kw);
            int ki = (int)(r / g->kw % g->kh), kj = (int)(r % g->kw);
            im2col_row(pc + r * row_len + nn * plane_out,
                       px + (nn * g->c + ci) * g->h * g->w, g, ki, kj);
        }
    return CH_OK;
}

/* dx[nn, ci, iy, ix]: the sum of every col entry taken from there. */
static float col2im_one(const float *pc, const ch_conv_geom *g, int64_t nn,
                        int64_t ci, int64_t iy, int64_t ix)
{
    int64_t row_len = g->n * g->oh * g->ow;
    double s = 0.0;
    for (int ki = 0; ki < g->kh; ki++) {
        int64_t ty = iy + g->ph - ki;
        if (ty < 0 || ty % g->sh != 0 || ty / g->sh >= g->oh)
            continue;
        for (int kj = 0; kj < g->kw; kj++) {
            int64_t tx = ix + g->pw - kj;
            if (tx < 0 || tx % g->sw != 0 || tx / g->sw >= g->ow)
                continue;
            int64_t r = (ci * g->kh + ki) * g->kw + kj;
            int64_t q = (nn * g->oh + ty / g->sh) * g->ow + tx / g->sw;
            s += pc[r * row_len + q];
        }
    }
    return (float)s;
}

ch_status chi_host_col2im(void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem col)
{
    (void)stream;
    float *pdx = chi_host_f32(dx);
    const float *pc = chi_host_f32(col);
    int64_t plane = g->h * g->w;
    CHI_OMP(omp parallel for collapse(2) if (g->n * g->c * plane > CHI_HOST_PAR_MIN / 16))
    for (int64_t nn = 0; nn < g->n; nn++)
        for (int64_t ci = 0; ci < g->c; ci++) {
            float *out = pdx + (nn * g->c + ci) * plane;
            for (int64_t iy = 0; iy < g->h; iy++)
                for (int64_t ix = 0; ix < g->w; ix++)
                    out[iy * g->w + ix] = col2im_one(pc, g, nn, ci, iy, ix);
        }
    return CH_OK;
}

/* The max of one window, scanning it row by row: padding never wins and a
 * tie keeps the first position. A window lying wholly in the padding has
 * no max: -inf at index -1. */
static void pool_window(const float *plane, const ch_conv_geom *g, int64_t oy,
                        int64_t ox, float *y, int32_t *idx)
{
    float best = -INFINITY;
    int64_t at = -1;
    for (int ki = 0; ki < g->kh; ki++) {
        int64_t iy = oy * g->sh - g->ph + ki;
        if (iy < 0 || iy >= g->h)
            continue;
        for (int kj = 0; kj < g->kw; kj++) {
            int64_t ix = ox * g->sw - g->pw + kj;
            if (ix < 0 || ix >= g->w)
                continue;
            float v = plane[iy * g->w + ix];
            if (at < 0 || v > best) {
                best = v;
                at = iy * g->w + ix;
            }
        }
    }
    *y = best;
    *idx = (int32_t)at;
}

ch_status chi_host_maxpool_forward(void *stream, const ch_conv_geom *g, ch_bmem y,
                                   ch_bmem idx, ch_bmem x)
{
    (void)stream;
    float *py = chi_host_f32(y);
    int32_t *pi = chi_host_i32(idx);
    const float *px = chi_host_f32(x);
    int64_t plane_in = g->h * g->w, plane_out = g->oh * g->ow;
    CHI_OMP(omp parallel for collapse(2) if (g->n * g->c * plane_out > CHI_HOST_PAR_MIN / 16))
    for (int64_t nn = 0; nn < g->n; nn++)
        for (int64_t ci = 0; ci < g->c; ci++) {
            int64_t p = nn * g->c + ci;
            for (int64_t oy = 0; oy < g->oh; oy++)
                for (int64_t ox = 0; ox < g->ow; ox++)
                    pool_window(px + p * plane_in, g, oy, ox,
                                py + p * plane_out + oy * g->ow + ox,
                                pi + p * plane_out + oy * g->ow + ox);
        }
    return CH_OK;
}

/* dx at (iy, ix): the dy of every window that covers it and chose it. */
static float unpool_one(const float *dy, const int32_t *idx, const ch_conv_geom *g,
                        int64_t iy, int64_t ix)
{
    int64_t ylo, yhi, xlo, xhi;
    covering(iy, g->sh, g->ph, g->kh, g->oh, &ylo, &yhi);
    covering(ix, g->sw, g->pw, g->kw, g->ow, &xlo, &xhi);
    int64_t self = iy * g->w + ix;
    double s = 0.0;
    for (int64_t oy = ylo; oy <= yhi; oy++)
        for (int64_t ox = xlo; ox <= xhi; ox++)
            if (idx[oy * g->ow + ox] == self)
                s += dy[oy * g->ow + ox];
    return (float)s;
}

ch_status chi_host_maxpool_backward(void *stream, const ch_conv_geom *g, ch_bmem dx,
                                    ch_bmem dy, ch_bmem idx)
{
    (void)stream;
    float *pdx = chi_host_f32(dx);
    const float *pdy = chi_host_f32(dy);
    const int32_t *pi = chi_host_i32(idx);
    int64_t plane_in = g->h * g->w, plane_out = g->oh * g->ow;
    CHI_OMP(omp parallel for collapse(2) if (g->n * g->c * plane_in > CHI_HOST_PAR_MIN / 16))
    for (int64_t nn = 0; nn < g->n; nn++)
        for (int64_t ci = 0; ci < g->c; ci++) {
            int64_t p = nn * g->c + ci;
            for (int64_t iy = 0; iy < g->h; iy++)
                for (int64_t ix = 0; ix < g->w; ix++)
                    pdx[p * plane_in + iy * g->w + ix] =
                        unpool_one(pdy + p * plane_out, pi + p * plane_out, g, iy, ix);
        }
    return CH_OK;
}
