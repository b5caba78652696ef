/* 2-D max pooling, forward and backward. */
#include "common.cuh"

/* One launch row per (n, c) plane. The first maximum in window order wins;
 * padding is skipped, so it never wins. */
__global__ void maxpool_forward_kernel(float *y, int32_t *idx, const float *x, ch_conv_geom g)
{
    const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
    CHCU_FOR_ROWS(r, g.n * g.c)
    {
        const float *src = x + r * in_plane;
        CHCU_FOR_COLS(q, out_plane)
        {
            int64_t h0 = (q / g.ow) * g.sh - g.ph, w0 = (q % g.ow) * g.sw - g.pw;
            float best = 0.0f;
            int64_t at = -1;
            for (int ki = 0; ki < g.kh; ki++) {
                int64_t h = h0 + ki;
                if (h < 0 || h >= g.h)
                    continue;
                for (int kj = 0; kj < g.kw; kj++) {
                    int64_t w = w0 + kj;
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
    maxpool_forward_kernel<<<sh.grid, sh.block, 0, s->s>>>(
        chcu_at<float>(y), chcu_at<int32_t>(idx), chcu_at<float>(x), *g);
    return chcu_launched("maxpool_forward_kernel");
}

/* The gather form: each input position sums dy over the windows that
 * cover it and chose it, windows in increasing (oh, ow) order as a scatter
 * would add them. */
__global__ void maxpool_backward_kernel(float *dx, const float *dy, const int32_t *idx,
                                        ch_conv_geom g)
{
    const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
    CHCU_FOR_ROWS(r, g.n * g.c)
    {
        const float *d = dy + r * out_plane;
        const int32_t *at = idx + r * out_plane;
        CHCU_FOR_COLS(p, in_plane)
        {
            int64_t h = p / g.w, w = p % g.w;
            /* Windows oh with oh*sh - ph <= h <= oh*sh - ph + kh - 1. */
            int64_t lo_h = h + g.ph - g.kh + 1, lo_w = w + g.pw - g.kw + 1;
            int64_t oh0 = lo_h <= 0 ? 0 : (lo_h + g.sh - 1) / g.sh;
            int64_t ow0 = lo_w <= 0 ? 0 : (lo_w + g.sw - 1) / g.sw;
            int64_t oh1 = (h + g.ph) / g.sh, ow1 = (w + g.pw) / g.sw;
            if (oh1 >= g.oh)
                oh1 = g.oh - 1;
            if (ow1 >= g.ow)
                ow1 = g.ow - 1;
            float sum = 0.0f;
            for (int64_t oh = oh0; oh <= oh1; oh++)
                for (int64_t ow = ow0; ow <= ow1; ow++)
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
    maxpool_backward_kernel<<<sh.grid, sh.block, 0, s->s>>>(
        chcu_at<float>(dx), chcu_at<float>(dy), chcu_at<int32_t>(idx), *g);
    return chcu_launched("maxpool_backward_kernel");
}
