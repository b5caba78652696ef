/* Host convolution helpers and pooling: im2col and its adjoint col2im,
 * the convolution itself (sample by sample, below), max-pooling forward
 * and backward.
 *
 * Every pass works one [H, W] plane at a time, so a thread owns whole
 * planes of its output: the backward passes clear a plane and add into it
 * (the plane stays in L1), with no races and a fixed order of the sums.
 * The bounds of each kernel tap are worked out once per row, never per
 * element, so the inner loops are plain copies, adds and compares; for
 * stride 1 and an output as wide as the input, once per plane (below). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host.h"
#include "kernels/index.h"

/* The index math is lib/kernels/index.h's, 64-bit (the host works it out
 * once per row or window, never per element, so its width costs nothing). */

/* The outputs [*lo, *hi) along one axis whose tap k reads inside the input:
 * 0 <= chk_tap_in(o) < in, clipped to [0, out). */
static void tap_range(int64_t in, int64_t out, int s, int p, int k, int64_t *lo, int64_t *hi)
{
    *lo = chk_out_lo_64(p - k, s);
    *hi = chk_out_hi_64(in - 1 + p - k, s, out);
    if (*lo > *hi)
        *lo = *hi;
}

/* The input rows [*lo, *hi) that output row o's window covers. */
static void window_range(int64_t o, int s, int p, int k, int64_t in, int64_t *lo, int64_t *hi)
{
    int64_t first = chk_tap_in_64(o, s, p, 0);
    *lo = first < 0 ? 0 : first;
    *hi = first + k < in ? first + k : in;
}

/* ---- stride 1, output as wide as the input ----------------------------------
 * The "same" convolutions of the cnn: tap (ki, kj) then moves the whole
 * plane by one offset, (ki - ph) * w + (kj - pw), so each tap is one loop
 * over the plane rather than one short loop per row (14 or 28 elements
 * here, where the loop overhead cost more than the copy). The entries
 * whose column falls in the padding wrap to the next or previous row under
 * that offset; a mask per kj (one byte per output position) drops them.
 * The masks live on the stack, up to SHIFT_MASK_BYTES: larger planes have
 * rows long enough for the per-row loops. */

#define SHIFT_MASK_BYTES 16384

static int shift_applies(const ch_conv_geom *g)
{
    return g->sh == 1 && g->sw == 1 && g->ow == g->w &&
           g->kw * g->oh * g->ow <= SHIFT_MASK_BYTES;
}

/* mask[kj * OH*OW + q] = 1 where output position q's tap kj reads inside
 * the row. */
static void shift_masks(const ch_conv_geom *g, unsigned char *mask)
{
    int64_t plane_out = g->oh * g->ow;
    for (int kj = 0; kj < g->kw; kj++) {
        int64_t x0, x1;
        tap_range(g->w, g->ow, g->sw, g->pw, kj, &x0, &x1);
        for (int64_t q = 0; q < plane_out; q++)
            mask[kj * plane_out + q] = q % g->ow >= x0 && q % g->ow < x1;
    }
}

/* Tap (ki, kj) reads output positions [*begin, *end) at plane index
 * q + *shift; outside them (and where the mask is 0) it reads padding.
 * Every index q + shift of the range lies inside the plane. */
static void shift_span(const ch_conv_geom *g, int ki, int kj, int64_t *begin, int64_t *end,
                       int64_t *shift)
{
    int64_t y0, y1, x0, x1;
    tap_range(g->h, g->oh, 1, g->ph, ki, &y0, &y1);
    tap_range(g->w, g->ow, 1, g->pw, kj, &x0, &x1);
    *begin = y0 * g->ow + x0;
    *end = y0 < y1 && x0 < x1 ? (y1 - 1) * g->ow + x1 : *begin;
    *shift = (int64_t)(ki - g->ph) * g->w + (kj - g->pw);
}

CHI_CLONES static void im2col_shift(float *restrict dst, const float *restrict plane,
                         const unsigned char *restrict mask, const ch_conv_geom *g, int ki,
                         int kj)
{
    int64_t begin, end, shift, plane_out = g->oh * g->ow;
    shift_span(g, ki, kj, &begin, &end, &shift);
    const unsigned char *m = mask + kj * plane_out;
    memset(dst, 0, (size_t)begin * sizeof *dst);
    CHI_OMP(omp simd)
    for (int64_t q = begin; q < end; q++) {
        float v = plane[q + shift];
        dst[q] = m[q] ? v : 0.0f;
    }
    memset(dst + end, 0, (size_t)(plane_out - end) * sizeof *dst);
}

CHI_CLONES static void col2im_shift(float *restrict plane, const float *restrict src,
                         const unsigned char *restrict mask, const ch_conv_geom *g, int ki,
                         int kj)
{
    int64_t begin, end, shift;
    shift_span(g, ki, kj, &begin, &end, &shift);
    const unsigned char *m = mask + kj * g->oh * g->ow;
    CHI_OMP(omp simd)
    for (int64_t q = begin; q < end; q++) {
        float v = src[q];
        plane[q + shift] += m[q] ? v : 0.0f;
    }
}

/* ---- any geometry -------------------------------------------------------- */

/* The OH*OW entries of one col row: tap (ki, kj) of every window over one
 * input plane, zero where the tap falls in the padding. */
static void im2col_row(float *restrict dst, const float *restrict plane, const ch_conv_geom *g,
                       int ki, int kj)
{
    int64_t y0, y1, x0, x1;
    tap_range(g->h, g->oh, g->sh, g->ph, ki, &y0, &y1);
    tap_range(g->w, g->ow, g->sw, g->pw, kj, &x0, &x1);
    memset(dst, 0, (size_t)(y0 * g->ow) * sizeof *dst);
    for (int64_t oy = y0; oy < y1; oy++) {
        float *out = dst + oy * g->ow;
        const float *in = plane + (oy * g->sh - g->ph + ki) * g->w;
        int64_t ix0 = x0 * g->sw - g->pw + kj; /* >= 0 by tap_range */
        memset(out, 0, (size_t)x0 * sizeof *out);
        if (g->sw == 1)
            memcpy(out + x0, in + ix0, (size_t)(x1 - x0) * sizeof *out);
        else
            for (int64_t ox = x0; ox < x1; ox++)
                out[ox] = in[ix0 + (ox - x0) * g->sw];
        memset(out + x1, 0, (size_t)(g->ow - x1) * sizeof *out);
    }
    memset(dst + y1 * g->ow, 0, (size_t)((g->oh - y1) * g->ow) * sizeof *dst);
}

ch_status chi_host_im2col(void *stream, const ch_conv_geom *g, ch_bmem col, ch_bmem x)
{
    (void)stream;
    float *pc = chi_host_f32(col);
    const float *px = chi_host_f32(x);
    int64_t taps = g->kh * g->kw, rows = g->c * taps, plane_out = g->oh * g->ow;
    int64_t row_len = g->n * plane_out;
    unsigned char masks[SHIFT_MASK_BYTES], *mask = shift_applies(g) ? masks : NULL;
    if (mask)
        shift_masks(g, mask);
    CHI_OMP(omp parallel for collapse(2) schedule(static) if (rows * row_len > CHI_HOST_PAR_MIN))
    for (int64_t r = 0; r < rows; r++)
        for (int64_t nn = 0; nn < g->n; nn++) {
            float *dst = pc + r * row_len + nn * plane_out;
            const float *plane = px + (nn * g->c + r / taps) * g->h * g->w;
            int ki = (int)(r % taps / g->kw), kj = (int)(r % g->kw);
            if (mask)
                im2col_shift(dst, plane, mask, g, ki, kj);
            else
                im2col_row(dst, plane, g, ki, kj);
        }
    return CH_OK;
}

/* Adds one col row (tap (ki, kj) of every window of the plane) back into
 * the input plane it was taken from. */
static void col2im_row(float *restrict plane, const float *restrict src, const ch_conv_geom *g,
                       int ki, int kj)
{
    int64_t y0, y1, x0, x1;
    tap_range(g->h, g->oh, g->sh, g->ph, ki, &y0, &y1);
    tap_range(g->w, g->ow, g->sw, g->pw, kj, &x0, &x1);
    for (int64_t oy = y0; oy < y1; oy++) {
        float *out = plane + (oy * g->sh - g->ph + ki) * g->w + (x0 * g->sw - g->pw + kj);
        const float *in = src + oy * g->ow + x0;
        if (g->sw == 1)
            for (int64_t i = 0; i < x1 - x0; i++)
                out[i] += in[i];
        else
            for (int64_t i = 0; i < x1 - x0; i++)
                out[i * g->sw] += in[i];
    }
}

/* dx[nn, ci] = the sum over the taps, in tap order, of the col entries
 * taken from each position. */
ch_status chi_host_col2im(void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem col)
{
    (void)stream;
    float *pdx = chi_host_f32(dx);
    const float *pc = chi_host_f32(col);
    int64_t plane = g->h * g->w, plane_out = g->oh * g->ow, row_len = g->n * plane_out;
    int64_t work = g->n * g->c * g->kh * g->kw * plane_out;
    (void)work; /* read by the OpenMP pragma alone */
    unsigned char masks[SHIFT_MASK_BYTES], *mask = shift_applies(g) ? masks : NULL;
    if (mask)
        shift_masks(g, mask);
    /* Channel-major, so that the col rows of one channel stream in order. */
    CHI_OMP(omp parallel for collapse(2) schedule(static) if (work > CHI_HOST_PAR_MIN))
    for (int64_t ci = 0; ci < g->c; ci++)
        for (int64_t nn = 0; nn < g->n; nn++) {
            float *out = pdx + (nn * g->c + ci) * plane;
            memset(out, 0, (size_t)plane * sizeof *out);
            for (int ki = 0; ki < g->kh; ki++)
                for (int kj = 0; kj < g->kw; kj++) {
                    int64_t r = (ci * g->kh + ki) * g->kw + kj;
                    const float *src = pc + r * row_len + nn * plane_out;
                    if (mask)
                        col2im_shift(out, src, mask, g, ki, kj);
                    else
                        col2im_row(out, src, g, ki, kj);
                }
        }
    return CH_OK;
}

/* ---- the convolution, one sample at a time ------------------------------
 * Each thread takes whole samples: their im2col columns [C*kh*kw, OH*OW]
 * (a few hundred KiB for the ResNet's 16 to 64 channels) stay in its
 * cache between being written and being multiplied, and W @ col is the
 * sample's [O, OH*OW] output as it is stored, so nothing is transposed.
 * The whole-batch im2col streamed tens of MiB through memory per layer,
 * and OpenBLAS cleared and refilled a C of that size. Backward takes each
 * sample's dy as it is stored: dw gets dy col^T (each thread into a
 * partial of its own, summed after the loop in thread order, so a given
 * thread count always gives the same bits), dx the col2im of W^T dy. */

static void im2col_one(float *restrict col, const float *restrict x, const ch_conv_geom *g,
                       const unsigned char *mask)
{
    int64_t taps = g->kh * g->kw, p = g->oh * g->ow, plane = g->h * g->w;
    for (int64_t r = 0; r < g->c * taps; r++) {
        int ki = (int)(r % taps / g->kw), kj = (int)(r % g->kw);
        const float *src = x + r / taps * plane;
        if (mask)
            im2col_shift(col + r * p, src, mask, g, ki, kj);
        else
            im2col_row(col + r * p, src, g, ki, kj);
    }
}

static void col2im_one(float *restrict dx, const float *restrict col, const ch_conv_geom *g,
                       const unsigned char *mask)
{
    int64_t taps = g->kh * g->kw, p = g->oh * g->ow, plane = g->h * g->w;
    memset(dx, 0, (size_t)(g->c * plane) * sizeof *dx);
    for (int64_t r = 0; r < g->c * taps; r++) {
        int ki = (int)(r % taps / g->kw), kj = (int)(r % g->kw);
        float *out = dx + r / taps * plane;
        if (mask)
            col2im_shift(out, col + r * p, mask, g, ki, kj);
        else
            col2im_row(out, col + r * p, g, ki, kj);
    }
}

/* Floats per thread: the columns, then (for dw) its partial weight
 * gradient, each rounded to 64 bytes. */
static int64_t round16(int64_t floats)
{
    return (floats + 15) / 16 * 16;
}

static int64_t conv_cols(const ch_conv_geom *g)
{
    return round16(g->c * g->kh * g->kw * g->oh * g->ow);
}

static int conv_threads(const ch_conv_geom *g)
{
    int t = chi_omp_max_threads();
    return t < 1 ? 1 : g->n < t ? (int)g->n : t;
}

ch_status chi_host_conv2d_workspace(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                    int backward, int want, size_t *bytes)
{
    (void)stream;
#ifdef HAVE_ONEDNN
    if (chi_host_dnnl_conv_workspace(g, out_channels, CH_F32, backward, want, bytes))
        return CH_OK;
#endif
    int64_t per = conv_cols(g);
    if (backward && (want & 2))
        per += round16(out_channels * g->c * g->kh * g->kw);
    *bytes = (size_t)conv_threads(g) * (size_t)per * sizeof(float);
    return CH_OK;
}

/* How many threads' scratch of `per` floats `bytes` holds (the core passes
 * what conv2d_workspace asked for, so at least one), and the tap masks
 * when the whole-plane shifts apply (*mask NULL otherwise). */
static ch_status conv_begin(const char *slot, const ch_conv_geom *g, int64_t per,
                           const float *scratch, size_t bytes, int *slots,
                           unsigned char *masks, unsigned char **mask)
{
    size_t fit = bytes / ((size_t)per * sizeof(float));
    int t = conv_threads(g);
    *slots = fit < (size_t)t ? (int)fit : t;
    if (!scratch || *slots < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "host %s: %zu bytes of scratch, less than one thread's %zu", slot,
                         bytes, (size_t)per * sizeof(float));
    *mask = shift_applies(g) ? masks : NULL;
    if (*mask)
        shift_masks(g, *mask);
    return CH_OK;
}

/* What every sample of one call shares. */
typedef struct conv_job {
    const ch_conv_geom *g;
    int64_t o, k, p;          /* out channels, C*kh*kw, OH*OW */
    int64_t cols;             /* floats of a thread's columns (its partial dw follows) */
    const unsigned char *mask;
    const float *x, *w, *dy;
    float *y, *dx, *dw;       /* the outputs this call writes (dw: partials) */
} conv_job;

static ch_status forward_one(const conv_job *j, int64_t s, float *col)
{
    const ch_conv_geom *g = j->g;
    im2col_one(col, j->x + s * g->c * g->h * g->w, g, j->mask);
    return chi_host_gemm_serial(0, 0, j->o, j->p, j->k, 1.0f, j->w, j->k, col, j->p, 0.0f,
                                j->y + s * j->o * j->p, j->p);
}

static ch_status backward_one(const conv_job *j, int64_t s, float *col)
{
    const ch_conv_geom *g = j->g;
    const float *dys = j->dy + s * j->o * j->p;
    ch_status st = CH_OK;
    if (j->dw) {
        im2col_one(col, j->x + s * g->c * g->h * g->w, g, j->mask);
        st = chi_host_gemm_serial(0, 1, j->o, j->k, j->p, 1.0f, dys, j->p, col, j->p, 1.0f,
                                  col + j->cols, j->k);
    }
    if (st == CH_OK && j->dx) {
        st = chi_host_gemm_serial(1, 0, j->k, j->p, j->o, 1.0f, j->w, j->k, dys, j->p, 0.0f, col,
                                  j->p);
        if (st == CH_OK)
            col2im_one(j->dx + s * g->c * g->h * g->w, col, g, j->mask);
    }
    return st;
}

/* Every sample through `one`, shared out among `slots` threads, each with
 * its scratch of `per` floats; with one slot a plain loop, not an inactive
 * region (OpenBLAS called inside one runs many times slower: batched.c).
 * A failure's message is the failing thread's, kept for the caller's. */
static ch_status conv_samples(const conv_job *j, ch_status (*one)(const conv_job *, int64_t,
                                                                   float *),
                              float *scratch, int64_t per, int slots)
{
    if (slots < 2) {
        for (int64_t s = 0; s < j->g->n; s++)
            TRY(one(j, s, scratch));
        return CH_OK;
    }
    ch_status st = CH_OK;
    char why[512] = "";
    CHI_OMP(omp parallel num_threads(slots))
    {
        float *mine = scratch + (int64_t)chi_omp_thread() * per;
        CHI_OMP(omp for schedule(static))
        for (int64_t s = 0; s < j->g->n; s++) {
            ch_status sts = one(j, s, mine);
            if (sts != CH_OK) {
                CHI_OMP(omp critical)
                {
                    st = sts;
                    snprintf(why, sizeof why, "%s", ch_last_error());
                }
            }
        }
    }
    return st == CH_OK ? CH_OK : chi_error(st, "%s", why);
}

ch_status chi_host_conv2d_forward(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                  ch_bmem y, ch_bmem x, ch_bmem w, ch_bmem ws, size_t ws_bytes)
{
    (void)stream;
#ifdef HAVE_ONEDNN
    ch_status dst = chi_host_dnnl_conv_forward(g, out_channels, CH_F32, chi_host_f32(y),
                                               chi_host_f32(x), chi_host_f32(w), ws.ptr,
                                               ws_bytes);
    if (dst != CH_ERR_UNSUPPORTED)
        return dst;
#endif
    float *scratch = chi_host_f32(ws);
    int64_t per = conv_cols(g);
    int slots;
    unsigned char masks[SHIFT_MASK_BYTES], *mask;
    TRY(conv_begin("conv2d_forward", g, per, scratch, ws_bytes, &slots, masks, &mask));
    conv_job j = {g, out_channels, g->c * g->kh * g->kw, g->oh * g->ow, per, mask,
                  chi_host_f32(x), chi_host_f32(w), NULL, chi_host_f32(y), NULL, NULL};
    return conv_samples(&j, forward_one, scratch, per, slots);
}

ch_status chi_host_conv2d_backward(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                   ch_bmem dx, ch_bmem dw, float beta, ch_bmem dy, ch_bmem x,
                                   ch_bmem w, ch_bmem ws, size_t ws_bytes)
{
    (void)stream;
    float *pdw = dw.ptr ? chi_host_f32(dw) : NULL, *scratch = chi_host_f32(ws);
#ifdef HAVE_ONEDNN
    ch_status dst = chi_host_dnnl_conv_backward(
        g, out_channels, CH_F32, dx.ptr ? chi_host_f32(dx) : NULL, pdw, beta, chi_host_f32(dy),
        chi_host_f32(x), chi_host_f32(w), ws.ptr, ws_bytes);
    if (dst != CH_ERR_UNSUPPORTED)
        return dst;
#endif
    int64_t o = out_channels, k = g->c * g->kh * g->kw;
    int64_t cols = conv_cols(g), per = cols + (pdw ? round16(o * k) : 0);
    int slots;
    unsigned char masks[SHIFT_MASK_BYTES], *mask;
    TRY(conv_begin("conv2d_backward", g, per, scratch, ws_bytes, &slots, masks, &mask));
    for (int t = 0; pdw && t < slots; t++)
        memset(scratch + t * per + cols, 0, (size_t)(o * k) * sizeof(float));
    conv_job j = {g, o, k, g->oh * g->ow, cols, mask, chi_host_f32(x), chi_host_f32(w),
                  chi_host_f32(dy), NULL, dx.ptr ? chi_host_f32(dx) : NULL, pdw};
    TRY(conv_samples(&j, backward_one, scratch, per, slots));
    if (pdw)
        for (int64_t i = 0; i < o * k; i++) {
            float sum = beta == 0.0f ? 0.0f : beta * pdw[i];
            for (int t = 0; t < slots; t++)
                sum += scratch[t * per + cols + i];
            pdw[i] = sum;
        }
    return CH_OK;
}

/* The max of one window, scanning it row by row: padding never wins and a
 * tie keeps the first position. A window lying wholly in the padding has
 * no max: -inf at index -1. */
static void pool_window(const float *plane, const ch_conv_geom *g, int64_t oy, int64_t ox,
                        float *y, int32_t *idx)
{
    int64_t y0, y1, x0, x1;
    window_range(oy, g->sh, g->ph, g->kh, g->h, &y0, &y1);
    window_range(ox, g->sw, g->pw, g->kw, g->w, &x0, &x1);
    float best = -INFINITY;
    int64_t at = -1;
    for (int64_t iy = y0; iy < y1; iy++)
        for (int64_t ix = x0; ix < x1; ix++) {
            float v = plane[iy * g->w + ix];
            if (at < 0 || v > best) {
                best = v;
                at = iy * g->w + ix;
            }
        }
    *y = best;
    *idx = (int32_t)at;
}

/* Takes v (at position i) over *best (at *at) if it is larger: selects
 * written as masks, so that neither the vector loop nor its scalar tail
 * branches (on real data the comparison is a coin flip to a predictor). */
static inline void pool_take(float v, int32_t i, float *best, int32_t *at)
{
    int32_t gt = -(int32_t)(v > *best);
    *at = (*at & ~gt) | (i & gt);
    *best = v > *best ? v : *best;
}

/* The common 2x2 window with stride 2 and no padding, one output row: the
 * same scan order and tie rule as pool_window, without bounds. */
static void pool_row_2x2(const float *restrict plane, int64_t w, int64_t oy, int64_t ow,
                         float *restrict y, int32_t *restrict idx)
{
    const float *r0 = plane + 2 * oy * w, *r1 = r0 + w;
    int32_t top = (int32_t)(2 * oy * w), bottom = (int32_t)((2 * oy + 1) * w);
    CHI_OMP(omp simd)
    for (int64_t ox = 0; ox < ow; ox++) {
        int32_t x = 2 * (int32_t)ox;
        float best = r0[x];
        int32_t at = top + x;
        pool_take(r0[x + 1], top + x + 1, &best, &at);
        pool_take(r1[x], bottom + x, &best, &at);
        pool_take(r1[x + 1], bottom + x + 1, &best, &at);
        y[ox] = best;
        idx[ox] = at;
    }
}

static int pool_is_2x2(const ch_conv_geom *g)
{
    return g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->ph == 0 && g->pw == 0;
}

static void pool_plane(const float *plane, const ch_conv_geom *g, float *y, int32_t *idx)
{
    int fast = pool_is_2x2(g);
    for (int64_t oy = 0; oy < g->oh; oy++) {
        float *yr = y + oy * g->ow;
        int32_t *ir = idx + oy * g->ow;
        if (fast)
            pool_row_2x2(plane, g->w, oy, g->ow, yr, ir);
        else
            for (int64_t ox = 0; ox < g->ow; ox++)
                pool_window(plane, g, oy, ox, yr + ox, ir + ox);
    }
}

ch_status chi_host_maxpool_forward(void *stream, const ch_conv_geom *g, ch_bmem y,
                                   ch_bmem idx, ch_bmem x)
{
    (void)stream;
    float *py = chi_host_f32(y);
    int32_t *pi = chi_host_i32(idx);
    const float *px = chi_host_f32(x);
    int64_t planes = g->n * g->c, plane_in = g->h * g->w, plane_out = g->oh * g->ow;
    CHI_OMP(omp parallel for schedule(static) if (planes * plane_in > CHI_HOST_PAR_MIN))
    for (int64_t p = 0; p < planes; p++)
        pool_plane(px + p * plane_in, g, py + p * plane_out, pi + p * plane_out);
    return CH_OK;
}

/* Adds dy[o] at idx[o] where that lies in output o's window: rows
 * [y0, y1) and columns [x0, x1) of the plane. The device backends gather
 * dx from the windows that cover each position, so an index outside its
 * own window (never one ch_maxpool2d writes) is skipped here too, and
 * nothing is written outside the plane. */
static inline void unpool_one(float *dx, float dy, int32_t at, int64_t w, int64_t y0, int64_t y1,
                              int64_t x0, int64_t x1)
{
    int64_t rel = at - (y0 * w + x0); /* (r, c) of the window as r * w + c */
    int in = 0;
    for (int64_t r = 0; r < y1 - y0; r++)
        in |= (uint64_t)(rel - r * w) < (uint64_t)(x1 - x0);
    if (in)
        dx[at] += dy;
}

/* dx = 0, then each output's dy added at the position it chose, in output
 * order: a position chosen by several overlapping windows gets their sum. */
static void unpool_plane(float *restrict dx, const float *restrict dy, const int32_t *restrict idx,
                         const ch_conv_geom *g)
{
    memset(dx, 0, (size_t)(g->h * g->w) * sizeof *dx);
    for (int64_t oy = 0; oy < g->oh; oy++) {
        int64_t y0, y1;
        window_range(oy, g->sh, g->ph, g->kh, g->h, &y0, &y1);
        for (int64_t ox = 0; ox < g->ow; ox++) {
            int64_t x0, x1, o = oy * g->ow + ox;
            window_range(ox, g->sw, g->pw, g->kw, g->w, &x0, &x1);
            unpool_one(dx, dy[o], idx[o], g->w, y0, y1, x0, x1);
        }
    }
}

/* The same for the 2x2 stride-2 window without padding, given each
 * output's window corner: the window test is then one vector loop over the
 * plane, and only the scatter is scalar. */
#define UNPOOL_MAX_PLANE 4096

static void unpool_plane_2x2(float *restrict dx, const float *restrict dy,
                             const int32_t *restrict idx, const int32_t *restrict corner,
                             const ch_conv_geom *g)
{
    int32_t at[UNPOOL_MAX_PLANE], w = (int32_t)g->w;
    int64_t plane_out = g->oh * g->ow;
    CHI_OMP(omp simd)
    for (int64_t o = 0; o < plane_out; o++) {
        /* Unsigned: an index anywhere in int32's range (INT32_MIN too) is
         * only compared, never overflowed. */
        uint32_t rel = (uint32_t)idx[o] - (uint32_t)corner[o];
        int32_t in = -(int32_t)((rel < 2u) | (rel - (uint32_t)w < 2u));
        at[o] = (idx[o] & in) | ~in; /* -1 where skipped */
    }
    memset(dx, 0, (size_t)(g->h * g->w) * sizeof *dx);
    for (int64_t o = 0; o < plane_out; o++)
        if (at[o] >= 0)
            dx[at[o]] += dy[o];
}

ch_status chi_host_maxpool_backward(void *stream, const ch_conv_geom *g, ch_bmem dx,
                                    ch_bmem dy, ch_bmem idx)
{
    (void)stream;
    float *pdx = chi_host_f32(dx);
    const float *pdy = chi_host_f32(dy);
    const int32_t *pi = chi_host_i32(idx);
    int64_t planes = g->n * g->c, plane_in = g->h * g->w, plane_out = g->oh * g->ow;
    int32_t corners[UNPOOL_MAX_PLANE];
    int fast = pool_is_2x2(g) && plane_out <= UNPOOL_MAX_PLANE;
    for (int64_t o = 0; fast && o < plane_out; o++)
        corners[o] = (int32_t)(2 * (o / g->ow) * g->w + 2 * (o % g->ow));
    CHI_OMP(omp parallel for schedule(static) if (planes * plane_in > CHI_HOST_PAR_MIN))
    for (int64_t p = 0; p < planes; p++) {
        float *out = pdx + p * plane_in;
        const float *d = pdy + p * plane_out;
        const int32_t *at = pi + p * plane_out;
        if (fast)
            unpool_plane_2x2(out, d, at, corners, g);
        else
            unpool_plane(out, d, at, g);
    }
    return CH_OK;
}
