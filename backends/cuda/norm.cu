/* LayerNorm and BatchNorm (ops.h, "Normalisation"): the formulas are
 * lib/kernels/normalize.h's, in its chk_acc (double here).
 *
 * Sums run in chk_acc, in an order fixed by the shape alone (no atomics),
 * so a run repeats to the bit; a double sum of n terms errs by at most
 * n 2^-53 of their magnitudes, below f32's rounding for any n < 2^29.
 * LayerNorm: a block per row for the row's statistics; its parameter
 * gradients as partial sums over chunks of rows, then the chunks in order.
 * BatchNorm's channel sums: a block per (channel, split), then the splits
 * in order. Blocks are CHCU_THREADS wide (a power of two) throughout. */
#include "common.cuh"
#include "kernels/normalize.h"

/* LayerNorm's parameter gradients: rows per partial sum. */
#define LN_CHUNK_ROWS 32
/* A channel's sums are cut into splits of at least this many elements, at
 * most SUMS_SPLITS_MAX of them, a block each. */
#define SUMS_SPLIT_MIN 4096
#define SUMS_SPLITS_MAX 64

/* The block's sum of v, the same order on every run; every thread gets it.
 * sh holds CHCU_THREADS chk_acc. */
__device__ static chk_acc block_sum(chk_acc v, chk_acc *sh)
{
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
        if (t < h)
            sh[t] += sh[t + h];
        __syncthreads();
    }
    chk_acc r = sh[0];
    __syncthreads();
    return r;
}

/* A block per row, over the rows in turn. */
static unsigned row_blocks(const chcu_device *dev, int64_t rows)
{
    return chcu_grid(dev, rows * CHCU_THREADS);
}

/* ---- LayerNorm ------------------------------------------------------------ */

__global__ void layernorm_kernel(float *y, float *mean, float *rstd, const float *x,
                                 const float *gamma, const float *beta, int64_t rows,
                                 int64_t d, float eps)
{
    __shared__ chk_acc sh[CHCU_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *px = x + r * d;
        chk_acc s = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            s += px[j];
        chk_acc m = block_sum(s, sh) / (chk_acc)d, v = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            v += ((chk_acc)px[j] - m) * ((chk_acc)px[j] - m);
        chk_acc rs = chk_norm_rstd(block_sum(v, sh) / (chk_acc)d, eps);
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            y[r * d + j] = chk_norm_affine(px[j], m, rs, gamma[j], beta[j]);
        if (threadIdx.x == 0) {
            mean[r] = (float)m;
            rstd[r] = (float)rs;
        }
    }
}

ch_status chcu_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_bmem y,
                         ch_bmem mean, ch_bmem rstd, ch_bmem x, ch_bmem gamma, ch_bmem beta)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    layernorm_kernel<<<row_blocks(s->dev, rows), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(y), chcu_at<float>(mean), chcu_at<float>(rstd), chcu_at<float>(x),
        chcu_at<float>(gamma), chcu_at<float>(beta), rows, d, eps);
    return chcu_launched("layernorm_kernel");
}

/* dx (chk_ln_dx): a block per row. */
__global__ void layernorm_dx_kernel(float *dx, const float *dy, const float *x,
                                    const float *mean, const float *rstd, const float *gamma,
                                    int64_t rows, int64_t d)
{
    __shared__ chk_acc sh[CHCU_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *pdy = dy + r * d, *px = x + r * d;
        chk_acc m = mean[r], rs = rstd[r], s1 = 0.0, s2 = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            chk_acc g = chk_ln_g(pdy[j], gamma[j]);
            s1 += g;
            s2 += g * chk_norm_xhat(px[j], m, rs);
        }
        chk_acc k1 = block_sum(s1, sh) / (chk_acc)d, k2 = block_sum(s2, sh) / (chk_acc)d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            dx[r * d + j] = chk_ln_dx(pdy[j], gamma[j], px[j], m, rs, k1, k2);
    }
}

/* Element i of a tensor in format fmt (lib/kernels/normalize.h's
 * CHK_FMT_*) as f32: f32 as it is, a half format widened. */
__device__ static inline float fmt_load1(const void *p, int fmt, int64_t i)
{
    if (fmt == CHK_FMT_F32)
        return ((const float *)p)[i];
    return chk_fmt_widen(((const chk_u16 *)p)[i], fmt);
}

/* Item (k, j) of chunks x d: part[k, 0, j] = the sum of dy xhat and
 * part[k, 1, j] of dy over the rows of chunk k, in row order. dy and x in
 * formats dyf and xf (ch_layernorm_backward's f32, ch_layernorm_backward_add's
 * any). */
__global__ void layernorm_param_part_kernel(chk_acc *part, const void *dy, int dyf, const void *x,
                                            int xf, const float *mean, const float *rstd,
                                            int64_t rows, int64_t d, int64_t chunks)
{
    CHCU_FOR_EACH(i, chunks * d)
    {
        int64_t k = i / d, j = i % d;
        int64_t end = (k + 1) * LN_CHUNK_ROWS < rows ? (k + 1) * LN_CHUNK_ROWS : rows;
        chk_acc g = 0.0, b = 0.0;
        for (int64_t r = k * LN_CHUNK_ROWS; r < end; r++) {
            chk_acc v = fmt_load1(dy, dyf, r * d + j);
            g += v * chk_norm_xhat(fmt_load1(x, xf, r * d + j), mean[r], rstd[r]);
            b += v;
        }
        part[k * 2 * d + j] = g;
        part[k * 2 * d + d + j] = b;
    }
}

__global__ void layernorm_param_sum_kernel(float *dgamma, float *dbeta, const chk_acc *part,
                                           int64_t chunks, int64_t d)
{
    CHCU_FOR_EACH(j, d)
    {
        chk_acc g = 0.0, b = 0.0;
        for (int64_t k = 0; k < chunks; k++) {
            g += part[k * 2 * d + j];
            b += part[k * 2 * d + d + j];
        }
        dgamma[j] = (float)(dgamma[j] + g);
        dbeta[j] = (float)(dbeta[j] + b);
    }
}

static ch_status layernorm_params(chcu_stream *s, int64_t rows, int64_t d, float *dgamma,
                                  float *dbeta, const void *dy, int dyf, const void *x, int xf,
                                  const float *mean, const float *rstd)
{
    int64_t chunks = (rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    void *work;
    ch_status st = chcu_scratch_acquire(s, (size_t)(chunks * 2 * d) * sizeof(chk_acc), &work);
    if (st)
        return st;
    chk_acc *part = (chk_acc *)work;
    layernorm_param_part_kernel<<<chcu_grid(s->dev, chunks * d), CHCU_THREADS, 0, s->s>>>(
        part, dy, dyf, x, xf, mean, rstd, rows, d, chunks);
    st = chcu_launched("layernorm_param_part_kernel");
    if (!st) {
        layernorm_param_sum_kernel<<<chcu_grid(s->dev, d), CHCU_THREADS, 0, s->s>>>(
            dgamma, dbeta, part, chunks, d);
        st = chcu_launched("layernorm_param_sum_kernel");
    }
    chcu_scratch_release(s);
    return st;
}

ch_status chcu_layernorm_backward(void *stream, int64_t rows, int64_t d, ch_bmem dx,
                                  ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x,
                                  ch_bmem mean, ch_bmem rstd, ch_bmem gamma)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    if (dx.ptr) {
        layernorm_dx_kernel<<<row_blocks(s->dev, rows), CHCU_THREADS, 0, s->s>>>(
            chcu_at<float>(dx), chcu_at<float>(dy), chcu_at<float>(x), chcu_at<float>(mean),
            chcu_at<float>(rstd), chcu_at<float>(gamma), rows, d);
        st = chcu_launched("layernorm_dx_kernel");
        if (st)
            return st;
    }
    return layernorm_params(s, rows, d, chcu_at<float>(dgamma), chcu_at<float>(dbeta),
                            chcu_at<float>(dy), CHK_FMT_F32, chcu_at<float>(x), CHK_FMT_F32,
                            chcu_at<float>(mean), chcu_at<float>(rstd));
}

/* ---- The residual stream's add beside LayerNorm ---------------------------
 * ch_add_layernorm and ch_layernorm_backward_add: a block per row, as
 * above, each thread taking V consecutive elements at a time: V = 8
 * (128-bit loads: one of eight half elements, two of eight f32) where
 * d % 8 == 0 and every row tensor starts 16-byte aligned, V = 4 (one
 * 128-bit load) where moreover every row tensor is f32 and d % 4 == 0,
 * V = 1 (a scalar path) otherwise. Tensors are in normalize.h's formats.
 * A thread sums its elements in its order, then the block in block_sum's:
 * not the unfused kernels' order (theirs stride by element), so the
 * results are theirs within a rounding of each f32 result, not to the
 * bit. Each thread reads back only elements it wrote itself (the sum, dx
 * over dres), so in place each element is read before it is written. */

/* The formats of a dtype the core passed; -1 for one this module does
 * not know. */
static int fmt_of(ch_dtype dt)
{
    return dt == CH_F32    ? CHK_FMT_F32
           : dt == CH_BF16 ? CHK_FMT_BF16
           : dt == CH_F16  ? CHK_FMT_F16
                           : -1;
}

/* V elements of format fmt from element i (a multiple of V; for V > 1
 * the address is 16-byte aligned) into v, as f32. */
template <int V> __device__ static inline void fmt_load(const void *p, int fmt, int64_t i, float *v)
{
    if (fmt == CHK_FMT_F32) {
        const float *f = (const float *)p + i;
        if constexpr (V == 1) {
            v[0] = f[0];
        } else {
#pragma unroll
            for (int k = 0; k < V; k += 4) {
                float4 q = *(const float4 *)(f + k);
                v[k] = q.x;
                v[k + 1] = q.y;
                v[k + 2] = q.z;
                v[k + 3] = q.w;
            }
        }
        return;
    }
    const chk_u16 *h = (const chk_u16 *)p + i;
    if constexpr (V == 1) {
        v[0] = chk_fmt_widen(h[0], fmt);
    } else {
        /* V / 2 words of two elements each, the first in the low half */
        unsigned w[V / 2];
        if constexpr (V == 8) {
            uint4 q = *(const uint4 *)h;
            w[0] = q.x;
            w[1] = q.y;
            w[2] = q.z;
            w[3] = q.w;
        } else {
            uint2 q = *(const uint2 *)h;
            w[0] = q.x;
            w[1] = q.y;
        }
#pragma unroll
        for (int k = 0; k < V / 2; k++) {
            v[2 * k] = chk_fmt_widen((chk_u16)(w[k] & 0xffffu), fmt);
            v[2 * k + 1] = chk_fmt_widen((chk_u16)(w[k] >> 16), fmt);
        }
    }
}

/* V f32 values stored from element i in format fmt, rounded once where
 * it is half. */
template <int V>
__device__ static inline void fmt_store(void *p, int fmt, int64_t i, const float *v)
{
    if (fmt == CHK_FMT_F32) {
        float *f = (float *)p + i;
        if constexpr (V == 1) {
            f[0] = v[0];
        } else {
#pragma unroll
            for (int k = 0; k < V; k += 4)
                *(float4 *)(f + k) = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
        }
        return;
    }
    chk_u16 *h = (chk_u16 *)p + i;
    if constexpr (V == 1) {
        h[0] = chk_fmt_narrow(v[0], fmt);
    } else {
        unsigned w[V / 2];
#pragma unroll
        for (int k = 0; k < V / 2; k++)
            w[k] = (unsigned)chk_fmt_narrow(v[2 * k], fmt) |
                   (unsigned)chk_fmt_narrow(v[2 * k + 1], fmt) << 16;
        if constexpr (V == 8)
            *(uint4 *)h = make_uint4(w[0], w[1], w[2], w[3]);
        else
            *(uint2 *)h = make_uint2(w[0], w[1]);
    }
}

/* The formats of add_layernorm's row tensors. */
struct ln_add_fmts {
    int sum, y, a, b;
};

template <int V>
__global__ void add_layernorm_kernel(void *sum, void *y, float *mean, float *rstd, const void *a,
                                     const void *b, const float *gamma, const float *beta,
                                     ln_add_fmts f, int64_t rows, int64_t d, float eps)
{
    __shared__ chk_acc sh[CHCU_THREADS];
    const int64_t step = (int64_t)blockDim.x * V;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t at = r * d;
        chk_acc s = 0.0;
        for (int64_t j = threadIdx.x * (int64_t)V; j < d; j += step) {
            float va[V], vb[V];
            fmt_load<V>(a, f.a, at + j, va);
            fmt_load<V>(b, f.b, at + j, vb);
#pragma unroll
            for (int k = 0; k < V; k++)
                va[k] = chk_res_sum(va[k], vb[k]);
            fmt_store<V>(sum, f.sum, at + j, va);
#pragma unroll
            for (int k = 0; k < V; k++)
                s += chk_fmt_round(va[k], f.sum);
        }
        chk_acc m = block_sum(s, sh) / (chk_acc)d, var = 0.0;
        for (int64_t j = threadIdx.x * (int64_t)V; j < d; j += step) {
            float x[V];
            fmt_load<V>(sum, f.sum, at + j, x);
#pragma unroll
            for (int k = 0; k < V; k++)
                var += ((chk_acc)x[k] - m) * ((chk_acc)x[k] - m);
        }
        chk_acc rs = chk_norm_rstd(block_sum(var, sh) / (chk_acc)d, eps);
        for (int64_t j = threadIdx.x * (int64_t)V; j < d; j += step) {
            float x[V], g[V], be[V];
            fmt_load<V>(sum, f.sum, at + j, x);
            fmt_load<V>(gamma, CHK_FMT_F32, j, g);
            fmt_load<V>(beta, CHK_FMT_F32, j, be);
#pragma unroll
            for (int k = 0; k < V; k++)
                x[k] = chk_norm_affine(x[k], m, rs, g[k], be[k]);
            fmt_store<V>(y, f.y, at + j, x);
        }
        if (threadIdx.x == 0) {
            mean[r] = (float)m;
            rstd[r] = (float)rs;
        }
    }
}

/* The widest V (8, 4, 1) the row tensors allow: rows of d elements in
 * the formats fmts[i] at ptrs[i] (16-byte aligned rows for V > 1). */
static int ln_width(int64_t d, int n, const void *const *ptrs, const int *fmts)
{
    int aligned = 1, all_f32 = 1;
    for (int i = 0; i < n; i++) {
        aligned &= (uintptr_t)ptrs[i] % 16 == 0;
        all_f32 &= fmts[i] == CHK_FMT_F32;
    }
    if (aligned && d % 8 == 0)
        return 8;
    if (aligned && all_f32 && d % 4 == 0)
        return 4;
    return 1;
}

/* kernel<V><<<launch>>>(args) for the V chosen at run time. */
#define LN_LAUNCH_WIDTH(v, kernel, launch, ...)                                                    \
    do {                                                                                           \
        if ((v) == 8)                                                                              \
            kernel<8><<<CHCU_CFG launch>>>(__VA_ARGS__);                                           \
        else if ((v) == 4)                                                                         \
            kernel<4><<<CHCU_CFG launch>>>(__VA_ARGS__);                                           \
        else                                                                                       \
            kernel<1><<<CHCU_CFG launch>>>(__VA_ARGS__);                                           \
    } while (0)

ch_status chcu_add_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_dtype sum_dt,
                             ch_dtype y_dt, ch_dtype a_dt, ch_dtype b_dt, ch_bmem sum, ch_bmem y,
                             ch_bmem mean, ch_bmem rstd, ch_bmem a, ch_bmem b, ch_bmem gamma,
                             ch_bmem beta)
{
    ln_add_fmts f = {fmt_of(sum_dt), fmt_of(y_dt), fmt_of(a_dt), fmt_of(b_dt)};
    if (f.sum < 0 || f.y < 0 || f.a < 0 || f.b < 0)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda add_layernorm: dtypes %d, %d, %d, %d",
                         (int)sum_dt, (int)y_dt, (int)a_dt, (int)b_dt);
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    void *ps = chcu_at<char>(sum), *py = chcu_at<char>(y);
    const void *pa = chcu_at<char>(a), *pb = chcu_at<char>(b);
    const float *pg = chcu_at<float>(gamma), *pbe = chcu_at<float>(beta);
    const void *ptrs[] = {ps, py, pa, pb, pg, pbe};
    const int fmts[] = {f.sum, f.y, f.a, f.b, CHK_FMT_F32, CHK_FMT_F32};
    LN_LAUNCH_WIDTH(ln_width(d, 6, ptrs, fmts), add_layernorm_kernel,
                    (row_blocks(s->dev, rows), CHCU_THREADS, 0, s->s), ps, py, chcu_at<float>(mean),
                    chcu_at<float>(rstd), pa, pb, pg, pbe, f, rows, d, eps);
    return chcu_launched("add_layernorm_kernel");
}

/* The formats of layernorm_backward_add's row tensors (res: dres's, any
 * when there is none). */
struct ln_back_fmts {
    int dx, dy, res, x;
};

/* layernorm_dx_kernel's row, plus dres (NULL: none), stored in dx's
 * format. */
template <int V>
__global__ void layernorm_dx_add_kernel(void *dx, const void *dy, const void *dres, const void *x,
                                        const float *mean, const float *rstd, const float *gamma,
                                        ln_back_fmts f, int64_t rows, int64_t d)
{
    __shared__ chk_acc sh[CHCU_THREADS];
    const int64_t step = (int64_t)blockDim.x * V;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const int64_t at = r * d;
        chk_acc m = mean[r], rs = rstd[r], s1 = 0.0, s2 = 0.0;
        for (int64_t j = threadIdx.x * (int64_t)V; j < d; j += step) {
            float vdy[V], vx[V], g[V];
            fmt_load<V>(dy, f.dy, at + j, vdy);
            fmt_load<V>(x, f.x, at + j, vx);
            fmt_load<V>(gamma, CHK_FMT_F32, j, g);
#pragma unroll
            for (int k = 0; k < V; k++) {
                chk_acc gk = chk_ln_g(vdy[k], g[k]);
                s1 += gk;
                s2 += gk * chk_norm_xhat(vx[k], m, rs);
            }
        }
        chk_acc k1 = block_sum(s1, sh) / (chk_acc)d, k2 = block_sum(s2, sh) / (chk_acc)d;
        for (int64_t j = threadIdx.x * (int64_t)V; j < d; j += step) {
            float vdy[V], vx[V], g[V], out[V];
            fmt_load<V>(dy, f.dy, at + j, vdy);
            fmt_load<V>(x, f.x, at + j, vx);
            fmt_load<V>(gamma, CHK_FMT_F32, j, g);
#pragma unroll
            for (int k = 0; k < V; k++)
                out[k] = chk_ln_dx(vdy[k], g[k], vx[k], m, rs, k1, k2);
            if (dres) {
                float vr[V];
                fmt_load<V>(dres, f.res, at + j, vr);
#pragma unroll
                for (int k = 0; k < V; k++)
                    out[k] = chk_ln_dx_res(out[k], vr[k]);
            }
            fmt_store<V>(dx, f.dx, at + j, out);
        }
    }
}

ch_status chcu_layernorm_backward_add(void *stream, int64_t rows, int64_t d, ch_dtype dx_dt,
                                      ch_dtype dy_dt, ch_dtype dres_dt, ch_dtype x_dt, ch_bmem dx,
                                      ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem dres,
                                      ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma)
{
    ln_back_fmts f = {fmt_of(dx_dt), fmt_of(dy_dt), dres.ptr ? fmt_of(dres_dt) : CHK_FMT_F32,
                      fmt_of(x_dt)};
    if (f.dx < 0 || f.dy < 0 || f.res < 0 || f.x < 0)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda layernorm_backward_add: dtypes %d, %d, %d, %d",
                         (int)dx_dt, (int)dy_dt, (int)dres_dt, (int)x_dt);
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    void *pdx = chcu_at<char>(dx);
    const void *pdy = chcu_at<char>(dy), *px = chcu_at<char>(x);
    const void *pres = dres.ptr ? (const void *)chcu_at<char>(dres) : NULL;
    const float *pg = chcu_at<float>(gamma);
    /* an absent dres: dx stands in for the alignment, never read */
    const void *ptrs[] = {pdx, pdy, pres ? pres : pdx, px, pg};
    const int fmts[] = {f.dx, f.dy, f.res, f.x, CHK_FMT_F32};
    LN_LAUNCH_WIDTH(ln_width(d, 5, ptrs, fmts), layernorm_dx_add_kernel,
                    (row_blocks(s->dev, rows), CHCU_THREADS, 0, s->s), pdx, pdy, pres, px,
                    chcu_at<float>(mean), chcu_at<float>(rstd), pg, f, rows, d);
    st = chcu_launched("layernorm_dx_add_kernel");
    if (st)
        return st;
    return layernorm_params(s, rows, d, chcu_at<float>(dgamma), chcu_at<float>(dbeta), pdy, f.dy,
                            px, f.x, chcu_at<float>(mean), chcu_at<float>(rstd));
}

/* ---- BatchNorm ------------------------------------------------------------ */

/* The splits of a channel of `count` elements: a function of the shape
 * alone, so the order of the sums is too. */
static int64_t sums_splits(int64_t count)
{
    int64_t splits = count / SUMS_SPLIT_MIN;
    return splits < 1 ? 1 : splits > SUMS_SPLITS_MAX ? SUMS_SPLITS_MAX : splits;
}

/* Block (channel, split): over its share of the channel's count = outer *
 * inner elements, the sums of a' and a' b' (primes: minus the centre, a
 * NULL centre being 0) into part[2 (ch splits + sp) ..]. Elements indexed
 * in I (lib/kernels/index.h's width rule). */
template <typename I>
__global__ void channel_sums_part_kernel(chk_acc *part, const float *a, const float *ac,
                                         const float *b, const float *bc, int64_t c, int64_t inner,
                                         int64_t count, int64_t splits)
{
    __shared__ chk_acc sh[CHCU_THREADS];
    const I cc = (I)c, in = (I)inner;
    int64_t chunk = (count + splits - 1) / splits;
    for (int64_t g = blockIdx.x; g < c * splits; g += gridDim.x) {
        int64_t ch = g / splits, begin = (g % splits) * chunk;
        int64_t end = begin + chunk < count ? begin + chunk : count;
        chk_acc ca = ac ? ac[ch] : 0.0, cb = bc ? bc[ch] : 0.0, s1 = 0.0, s2 = 0.0;
        for (I e = (I)(begin + threadIdx.x); e < (I)end; e += (I)blockDim.x) {
            I at = ((e / in) * cc + (I)ch) * in + e % in;
            chk_acc da = (chk_acc)a[at] - ca;
            s1 += da;
            s2 += da * ((chk_acc)b[at] - cb);
        }
        s1 = block_sum(s1, sh);
        s2 = block_sum(s2, sh);
        if (threadIdx.x == 0) {
            part[2 * g] = s1;
            part[2 * g + 1] = s2;
        }
    }
}

/* A thread per channel: its splits in order; channel 0's also writes the
 * count. */
__global__ void channel_sums_finish_kernel(float *sums, const chk_acc *part, int64_t c,
                                           int64_t splits, int64_t count)
{
    CHCU_FOR_EACH(ch, c)
    {
        chk_acc s1 = 0.0, s2 = 0.0;
        for (int64_t sp = 0; sp < splits; sp++) {
            s1 += part[2 * (ch * splits + sp)];
            s2 += part[2 * (ch * splits + sp) + 1];
        }
        sums[ch] = (float)s1;
        sums[c + ch] = (float)s2;
        if (ch == 0)
            sums[2 * c] = (float)count;
    }
}

ch_status chcu_channel_sums(void *stream, int64_t outer, int64_t c, int64_t inner,
                            ch_bmem sums, ch_bmem a, ch_bmem a_center, ch_bmem b,
                            ch_bmem b_center)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    int64_t count = outer * inner, splits = sums_splits(count);
    void *work;
    st = chcu_scratch_acquire(s, (size_t)(2 * c * splits) * sizeof(chk_acc), &work);
    if (st)
        return st;
    chk_acc *part = (chk_acc *)work;
    const float *ac = a_center.ptr ? chcu_at<float>(a_center) : NULL;
    const float *bc = b_center.ptr ? chcu_at<float>(b_center) : NULL;
    CHCU_LAUNCH_INDEXED(chk_index_is_32(outer * c * inner), channel_sums_part_kernel,
                        (row_blocks(s->dev, c * splits), CHCU_THREADS, 0, s->s), part,
                        chcu_at<float>(a), ac, chcu_at<float>(b), bc, c, inner, count, splits);
    st = chcu_launched("channel_sums_part_kernel");
    if (!st) {
        channel_sums_finish_kernel<<<chcu_grid(s->dev, c), CHCU_THREADS, 0, s->s>>>(
            chcu_at<float>(sums), part, c, splits, count);
        st = chcu_launched("channel_sums_finish_kernel");
    }
    chcu_scratch_release(s);
    return st;
}

/* A thread per channel. sums NULL: evaluation, from the running
 * statistics; running NULL: not updated. */
__global__ void batchnorm_stats_kernel(float *mean, float *rstd, float *rmean, float *rvar,
                                       const float *sums, const float *center, int64_t c,
                                       float momentum, float eps)
{
    CHCU_FOR_EACH(ch, c)
    {
        if (!sums) {
            mean[ch] = rmean[ch];
            rstd[ch] = (float)chk_norm_rstd(rvar[ch], eps);
            continue;
        }
        float count = sums[2 * c];
        chk_acc m = chk_bn_mean(center ? center[ch] : 0.0f, sums[ch], count);
        chk_acc v = chk_bn_var(sums[ch], sums[c + ch], count);
        mean[ch] = (float)m;
        rstd[ch] = (float)chk_norm_rstd(v, eps);
        if (!rmean)
            continue;
        rmean[ch] = chk_bn_running(rmean[ch], momentum, m);
        rvar[ch] = chk_bn_running(rvar[ch], momentum, chk_bn_unbiased(v, count));
    }
}

static float *f32_or_null(ch_bmem m)
{
    return m.ptr ? chcu_at<float>(m) : NULL;
}

ch_status chcu_batchnorm_stats(void *stream, int64_t c, float momentum, float eps,
                               ch_bmem mean, ch_bmem rstd, ch_bmem running_mean,
                               ch_bmem running_var, ch_bmem sums, ch_bmem center)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    batchnorm_stats_kernel<<<chcu_grid(s->dev, c), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(mean), chcu_at<float>(rstd), f32_or_null(running_mean),
        f32_or_null(running_var), f32_or_null(sums), f32_or_null(center), c, momentum, eps);
    return chcu_launched("batchnorm_stats_kernel");
}

/* The element kernels index in I, index.h's width rule chosen per launch. */
template <typename I>
__global__ void batchnorm_forward_kernel(float *y, const float *x, const float *mean,
                                         const float *rstd, const float *gamma, const float *beta,
                                         int64_t n, int64_t c, int64_t inner)
{
    CHCU_FOR_EACH_AS(I, i, n)
    {
        I ch = chk_channel_of(i, (I)c, (I)inner);
        y[i] = chk_norm_affine(x[i], mean[ch], rstd[ch], gamma[ch], beta[ch]);
    }
}

ch_status chcu_batchnorm_forward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                 ch_bmem y, ch_bmem x, ch_bmem mean, ch_bmem rstd,
                                 ch_bmem gamma, ch_bmem beta)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    int64_t n = outer * c * inner;
    CHCU_LAUNCH_INDEXED(chk_index_is_32(n), batchnorm_forward_kernel,
                        (chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s), chcu_at<float>(y),
                        chcu_at<float>(x), chcu_at<float>(mean), chcu_at<float>(rstd),
                        chcu_at<float>(gamma), chcu_at<float>(beta), n, c, inner);
    return chcu_launched("batchnorm_forward_kernel");
}

/* dgamma += rstd local[c + ch], dbeta += local[ch]. */
__global__ void batchnorm_param_grads_kernel(float *dgamma, float *dbeta, const float *rstd,
                                             const float *local, int64_t c)
{
    CHCU_FOR_EACH(ch, c)
    {
        dgamma[ch] = chk_bn_dgamma(dgamma[ch], rstd[ch], local[c + ch]);
        dbeta[ch] = chk_bn_dbeta(dbeta[ch], local[ch]);
    }
}

/* dx (chk_bn_dx) from the total sums. */
template <typename I>
__global__ void batchnorm_dx_kernel(float *dx, const float *dy, const float *x, const float *mean,
                                    const float *rstd, const float *gamma, const float *total,
                                    int64_t n, int64_t c, int64_t inner)
{
    CHCU_FOR_EACH_AS(I, i, n)
    {
        I ch = chk_channel_of(i, (I)c, (I)inner);
        dx[i] = chk_bn_dx(dy[i], x[i], mean[ch], rstd[ch], gamma[ch], total[ch], total[c + ch],
                          total[2 * c]);
    }
}

ch_status chcu_batchnorm_backward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                  ch_bmem dx, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy,
                                  ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma,
                                  ch_bmem local, ch_bmem total)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    batchnorm_param_grads_kernel<<<chcu_grid(s->dev, c), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(dgamma), chcu_at<float>(dbeta), chcu_at<float>(rstd),
        chcu_at<float>(local), c);
    st = chcu_launched("batchnorm_param_grads_kernel");
    if (st || !dx.ptr)
        return st;
    int64_t n = outer * c * inner;
    CHCU_LAUNCH_INDEXED(
        chk_index_is_32(n), batchnorm_dx_kernel, (chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s),
        chcu_at<float>(dx), chcu_at<float>(dy), chcu_at<float>(x), chcu_at<float>(mean),
        chcu_at<float>(rstd), chcu_at<float>(gamma), chcu_at<float>(total), n, c, inner);
    return chcu_launched("batchnorm_dx_kernel");
}
