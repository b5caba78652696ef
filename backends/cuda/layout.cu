/* Data layout: transpose of the first two dimensions, im2col and col2im. */
#include "common.cuh"

#define TILE 32
#define TILE_ROWS 8

/* [a, b] -> [b, a] through a shared tile, so that both the reads and the
 * writes are coalesced; the extra column avoids bank conflicts. Elements
 * are moved as 32-bit words (f32 and i32 alike). */
__global__ void transpose_tile_kernel(uint32_t *y, const uint32_t *x, int64_t a, int64_t b)
{
    __shared__ uint32_t tile[TILE][TILE + 1];
    for (int64_t ti = (int64_t)blockIdx.y * TILE; ti < a; ti += (int64_t)gridDim.y * TILE)
        for (int64_t tj = (int64_t)blockIdx.x * TILE; tj < b; tj += (int64_t)gridDim.x * TILE) {
            for (int r = threadIdx.y; r < TILE; r += TILE_ROWS) {
                int64_t i = ti + r, j = tj + threadIdx.x;
                if (i < a && j < b)
                    tile[r][threadIdx.x] = x[i * b + j];
            }
            __syncthreads();
            for (int r = threadIdx.y; r < TILE; r += TILE_ROWS) {
                int64_t j = tj + r, i = ti + threadIdx.x;
                if (i < a && j < b)
                    y[j * a + i] = tile[threadIdx.x][r];
            }
            __syncthreads();
        }
}

/* [a, b, inner] -> [b, a, inner], inner > 1: one output row (j, i) of
 * `inner` contiguous words per row of the launch. */
__global__ void transpose_rows_kernel(uint32_t *y, const uint32_t *x, int64_t a, int64_t b,
                                      int64_t inner)
{
    CHCU_FOR_ROWS(r, a * b)
    {
        int64_t j = r / a, i = r % a;
        const uint32_t *src = x + (i * b + j) * inner;
        CHCU_FOR_COLS(k, inner)
        y[r * inner + k] = src[k];
    }
}

static unsigned chcu_tiles(int64_t n, int64_t cap)
{
    int64_t t = (n + TILE - 1) / TILE;
    return (unsigned)(t < cap ? t : cap);
}

ch_status chcu_transpose01(void *stream, int64_t a, int64_t b, int64_t inner, ch_bmem y,
                           ch_bmem x)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    if (inner == 1) {
        dim3 grid(chcu_tiles(b, 4096), chcu_tiles(a, 65535));
        transpose_tile_kernel<<<grid, dim3(TILE, TILE_ROWS), 0, s->s>>>(
            chcu_at<uint32_t>(y), chcu_at<uint32_t>(x), a, b);
    } else {
        chcu_shape2 sh = chcu_rows(s->dev, a * b, inner);
        transpose_rows_kernel<<<sh.grid, sh.block, 0, s->s>>>(
            chcu_at<uint32_t>(y), chcu_at<uint32_t>(x), a, b, inner);
    }
    return chcu_launched("transpose_kernel");
}

/* col [C*kh*kw, N*OH*OW] is, in memory, [C, kh, kw, N] rows of OH*OW:
 * one launch row per (c, ki, kj, n) and one item per output position. The
 * index math is lib/kernels/index.h's, in I (its width rule, chosen per
 * launch). */
template <typename I> __global__ void im2col_kernel(float *col, const float *x, ch_conv_geom geom)
{
    const chcu_window<I> g = chcu_window_of<I>(geom);
    const I plane = g.oh * g.ow;
    CHCU_FOR_ROWS_AS(I, r, g.c * g.kh * g.kw * g.n)
    {
        I n = r % g.n, t = r / g.n;
        I kj = t % g.kw;
        t /= g.kw;
        I ki = t % g.kh, c = t / g.kh;
        const float *src = x + (n * g.c + c) * g.h * g.w;
        CHCU_FOR_COLS_AS(I, q, plane)
        {
            I h = chk_tap_in(q / g.ow, g.sh, g.ph, ki), w = chk_tap_in(q % g.ow, g.sw, g.pw, kj);
            col[r * plane + q] = h >= 0 && h < g.h && w >= 0 && w < g.w ? src[h * g.w + w] : 0.0f;
        }
    }
}

ch_status chcu_im2col(void *stream, const ch_conv_geom *g, ch_bmem col, ch_bmem x)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, g->c * g->kh * g->kw * g->n, g->oh * g->ow);
    CHCU_LAUNCH_INDEXED(chcu_window_is_32(g), im2col_kernel, (sh.grid, sh.block, 0, s->s),
                        chcu_at<float>(col), chcu_at<float>(x), *g);
    return chcu_launched("im2col_kernel");
}

/* The gather form of the adjoint: each dx element sums the col entries
 * taken from it, window offsets (ki, kj) in increasing order as a scatter
 * over col's rows would add them. */
template <typename I> __global__ void col2im_kernel(float *dx, const float *col, ch_conv_geom geom)
{
    const chcu_window<I> g = chcu_window_of<I>(geom);
    const I plane = g.h * g.w, cols = g.n * g.oh * g.ow;
    CHCU_FOR_ROWS_AS(I, r, g.n * g.c)
    {
        I n = r / g.c, c = r % g.c;
        CHCU_FOR_COLS_AS(I, p, plane)
        {
            I h = p / g.w, w = p % g.w;
            float sum = 0.0f;
            for (I ki = 0; ki < g.kh; ki++) {
                I oh = chk_tap_out(h, g.sh, g.ph, ki, g.oh);
                if (oh < 0)
                    continue;
                for (I kj = 0; kj < g.kw; kj++) {
                    I ow = chk_tap_out(w, g.sw, g.pw, kj, g.ow);
                    if (ow < 0)
                        continue;
                    I row = (c * g.kh + ki) * g.kw + kj;
                    sum += col[row * cols + (n * g.oh + oh) * g.ow + ow];
                }
            }
            dx[r * plane + p] = sum;
        }
    }
}

ch_status chcu_col2im(void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem col)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, g->n * g->c, g->h * g->w);
    CHCU_LAUNCH_INDEXED(chcu_window_is_32(g), col2im_kernel, (sh.grid, sh.block, 0, s->s),
                        chcu_at<float>(dx), chcu_at<float>(col), *g);
    return chcu_launched("col2im_kernel");
}
