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

/* Item (k, j) of chunks x d: part[k, 0, j] = the sum of dy xhat and
 * part[k, 1, j] of dy over the rows of chunk k, in row order. */
__global__ void layernorm_param_part_kernel(chk_acc *part, const float *dy, const float *x,
                                            const float *mean, const float *rstd, int64_t rows,
                                            int64_t d, int64_t chunks)
{
    CHCU_FOR_EACH(i, chunks * d)
    {
        int64_t k = i / d, j = i % d;
        int64_t end = (k + 1) * LN_CHUNK_ROWS < rows ? (k + 1) * LN_CHUNK_ROWS : rows;
        chk_acc g = 0.0, b = 0.0;
        for (int64_t r = k * LN_CHUNK_ROWS; r < end; r++) {
            chk_acc v = dy[r * d + j];
            g += v * chk_norm_xhat(x[r * d + j], mean[r], rstd[r]);
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
                                  float *dbeta, const float *dy, const float *x,
                                  const float *mean, const float *rstd)
{
    int64_t chunks = (rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    void *work;
    ch_status st = chcu_scratch_acquire(s, (size_t)(chunks * 2 * d) * sizeof(chk_acc), &work);
    if (st)
        return st;
    chk_acc *part = (chk_acc *)work;
    layernorm_param_part_kernel<<<chcu_grid(s->dev, chunks * d), CHCU_THREADS, 0, s->s>>>(
        part, dy, x, mean, rstd, rows, d, chunks);
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
                            chcu_at<float>(dy), chcu_at<float>(x), chcu_at<float>(mean),
                            chcu_at<float>(rstd));
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
