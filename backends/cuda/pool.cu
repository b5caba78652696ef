/* 2-D max pooling, forward and backward. The index math is
 * lib/kernels/index.h's, in I (its width rule, chosen per launch). */
#include "common.cuh"

/* One launch row per (n, c) plane. The first maximum in window order wins;
 * padding is skipped, so it never wins. */
template <typename I>
__global__ void maxpool_forward_kernel(float *y, int32_t *idx, const float *x, ch_conv_geom geom)
{
    const chcu_window<I> g = chcu_window_of<I>(geom);
    const I in_plane = g.h * g.w, out_plane = g.oh * g.ow;
    CHCU_FOR_ROWS_AS(I, r, g.n * g.c)
    {
        const float *src = x + r * in_plane;
        CHCU_FOR_COLS_AS(I, q, out_plane)
        {
            I oh = q / g.ow, ow = q % g.ow;
            float best = 0.0f;
            I at = -1;
            for (I ki = 0; ki < g.kh; ki++) {
                I h = chk_tap_in(oh, g.sh, g.ph, ki);
                if (h < 0 || h >= g.h)
                    continue;
                for (I kj = 0; kj < g.kw; kj++) {
                    I w = chk_tap_in(ow, g.sw, g.pw, kj);
                    if (w < 0 || w >= g.w)
                        continue;
                    float v = src[h * g.w + w];
                    if (at < 0 || v > best) {
                        best = v;
                        at = h * g.w + w;
                    }
                }
            }
            y[r * out_plane + q] = best;
            idx[r * out_plane + q] = (int32_t)at;
        }
    }
}

ch_status chcu_maxpool_forward(void *stream, const ch_conv_geom *g, ch_bmem y, ch_bmem idx,
                               ch_bmem x)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, g->n * g->c, g->oh * g->ow);
    CHCU_LAUNCH_INDEXED(chcu_window_is_32(g), maxpool_forward_kernel, (sh.grid, sh.block, 0, s->s),
                        chcu_at<float>(y), chcu_at<int32_t>(idx), chcu_at<float>(x), *g);
    return chcu_launched("maxpool_forward_kernel");
}

/* The gather form: each input position sums dy over the windows that
 * cover it and chose it, windows in increasing (oh, ow) order as a scatter
 * would add them. */
template <typename I>
__global__ void maxpool_backward_kernel(float *dx, const float *dy, const int32_t *idx,
                                        ch_conv_geom geom)
{
    const chcu_window<I> g = chcu_window_of<I>(geom);
    const I in_plane = g.h * g.w, out_plane = g.oh * g.ow;
    CHCU_FOR_ROWS_AS(I, r, g.n * g.c)
    {
        const float *d = dy + r * out_plane;
        const int32_t *at = idx + r * out_plane;
        CHCU_FOR_COLS_AS(I, p, in_plane)
        {
            I h = p / g.w, w = p % g.w;
            I oh1 = chk_cover_hi(h, g.sh, g.ph, g.oh), ow1 = chk_cover_hi(w, g.sw, g.pw, g.ow);
            float sum = 0.0f;
            for (I oh = chk_cover_lo(h, g.sh, g.ph, g.kh); oh < oh1; oh++)
                for (I ow = chk_cover_lo(w, g.sw, g.pw, g.kw); ow < ow1; ow++)
                    if (at[oh * g.ow + ow] == p)
                        sum += d[oh * g.ow + ow];
            dx[r * in_plane + p] = sum;
        }
    }
}

ch_status chcu_maxpool_backward(void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem dy,
                                ch_bmem idx)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, g->n * g->c, g->h * g->w);
    CHCU_LAUNCH_INDEXED(chcu_window_is_32(g), maxpool_backward_kernel, (sh.grid, sh.block, 0, s->s),
                        chcu_at<float>(dx), chcu_at<float>(dy), chcu_at<int32_t>(idx), *g);
    return chcu_launched("maxpool_backward_kernel");
}
