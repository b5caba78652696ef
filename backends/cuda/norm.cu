/* LayerNorm and BatchNorm (ops.h, "Normalisation").
 *
 * Sums run in double, in an order fixed by the shape alone (no atomics),
 * so a run repeats to the bit; a double sum of n terms errs by at most
 * n 2^-53 of their magnitudes, below f32's rounding for any n < 2^29.
 * LayerNorm: a block per row for the row's statistics; its parameter
 * gradients as partial sums over chunks of rows, then the chunks in order.
 * BatchNorm's channel sums: a block per (channel, split), then the splits
 * in order. Blocks are CHCU_THREADS wide (a power of two) throughout. */
#include "common.cuh"

/* LayerNorm's parameter gradients: rows per partial sum. */
#define LN_CHUNK_ROWS 32
/* A channel's sums are cut into splits of at least this many elements, at
 * most SUMS_SPLITS_MAX of them, a block each. */
#define SUMS_SPLIT_MIN 4096
#define SUMS_SPLITS_MAX 64

/* The block's sum of v, the same order on every run; every thread gets it.
 * sh holds CHCU_THREADS doubles. */
__device__ static double block_sum(double v, double *sh)
{
    const unsigned t = threadIdx.x;
    sh[t] = v;
    __syncthreads();
    for (unsigned h = blockDim.x / 2; h > 0; h /= 2) {
        if (t < h)
            sh[t] += sh[t + h];
        __syncthreads();
    }
    double r = sh[0];
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
    __shared__ double sh[CHCU_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *px = x + r * d;
        double s = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            s += px[j];
        double m = block_sum(s, sh) / (double)d, v = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            v += ((double)px[j] - m) * ((double)px[j] - m);
        double rs = 1.0 / sqrt(block_sum(v, sh) / (double)d + (double)eps);
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x)
            y[r * d + j] = (float)(((double)px[j] - m) * rs * gamma[j] + beta[j]);
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

/* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma: a block per row. */
__global__ void layernorm_dx_kernel(float *dx, const float *dy, const float *x,
                                    const float *mean, const float *rstd, const float *gamma,
                                    int64_t rows, int64_t d)
{
    __shared__ double sh[CHCU_THREADS];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *pdy = dy + r * d, *px = x + r * d;
        double m = mean[r], rs = rstd[r], s1 = 0.0, s2 = 0.0;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            double g = (double)pdy[j] * gamma[j];
            s1 += g;
            s2 += g * (((double)px[j] - m) * rs);
        }
        double k1 = block_sum(s1, sh) / (double)d, k2 = block_sum(s2, sh) / (double)d;
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            double g = (double)pdy[j] * gamma[j], xhat = ((double)px[j] - m) * rs;
            dx[r * d + j] = (float)(rs * (g - k1 - xhat * k2));
        }
    }
}

/* Item (k, j) of chunks x d: part[k, 0, j] = the sum of dy xhat and
 * part[k, 1, j] of dy over the rows of chunk k, in row order. */
__global__ void layernorm_param_part_kernel(double *part, const float *dy, const float *x,
                                            const float *mean, const float *rstd, int64_t rows,
                                            int64_t d, int64_t chunks)
{
    CHCU_FOR_EACH(i, chunks * d)
    {
        int64_t k = i / d, j = i % d;
        int64_t end = (k + 1) * LN_CHUNK_ROWS < rows ? (k + 1) * LN_CHUNK_ROWS : rows;
        double g = 0.0, b = 0.0;
        for (int64_t r = k * LN_CHUNK_ROWS; r < end; r++) {
            double v = dy[r * d + j];
            g += v * (((double)x[r * d + j] - mean[r]) * rstd[r]);
            b += v;
        }
        part[k * 2 * d + j] = g;
        part[k * 2 * d + d + j] = b;
    }
}

__global__ void layernorm_param_sum_kernel(float *dgamma, float *dbeta, const double *part,
                                           int64_t chunks, int64_t d)
{
    CHCU_FOR_EACH(j, d)
    {
        double g = 0.0, b = 0.0;
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
    ch_status st = chcu_scratch_acquire(s, (size_t)(chunks * 2 * d) * sizeof(double), &work);
    if (st)
        return st;
    double *part = (double *)work;
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
 * NULL centre being 0) into part[2 (ch splits + sp) ..]. */
__global__ void channel_sums_part_kernel(double *part, const float *a, const float *ac,
                                         const float *b, const float *bc, int64_t c,
                                         int64_t inner, int64_t count, int64_t splits)
{
    __shared__ double sh[CHCU_THREADS];
    int64_t chunk = (count + splits - 1) / splits;
    for (int64_t g = blockIdx.x; g < c * splits; g += gridDim.x) {
        int64_t ch = g / splits, begin = (g % splits) * chunk;
        int64_t end = begin + chunk < count ? begin + chunk : count;
        double ca = ac ? ac[ch] : 0.0, cb = bc ? bc[ch] : 0.0, s1 = 0.0, s2 = 0.0;
        for (int64_t e = begin + threadIdx.x; e < end; e += blockDim.x) {
            int64_t at = ((e / inner) * c + ch) * inner + e % inner;
            double da = (double)a[at] - ca;
            s1 += da;
            s2 += da * ((double)b[at] - cb);
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
__global__ void channel_sums_finish_kernel(float *sums, const double *part, int64_t c,
                                           int64_t splits, int64_t count)
{
    CHCU_FOR_EACH(ch, c)
    {
        double s1 = 0.0, s2 = 0.0;
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
    st = chcu_scratch_acquire(s, (size_t)(2 * c * splits) * sizeof(double), &work);
    if (st)
        return st;
    double *part = (double *)work;
    const float *ac = a_center.ptr ? chcu_at<float>(a_center) : NULL;
    const float *bc = b_center.ptr ? chcu_at<float>(b_center) : NULL;
    channel_sums_part_kernel<<<row_blocks(s->dev, c * splits), CHCU_THREADS, 0, s->s>>>(
        part, chcu_at<float>(a), ac, chcu_at<float>(b), bc, c, inner, count, splits);
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
 * statistics; running NULL: not updated. A count of 1 has no unbiased
 * variance: the biased one (0) is taken. */
__global__ void batchnorm_stats_kernel(float *mean, float *rstd, float *rmean, float *rvar,
                                       const float *sums, const float *center, int64_t c,
                                       float momentum, float eps)
{
    CHCU_FOR_EACH(ch, c)
    {
        if (!sums) {
            mean[ch] = rmean[ch];
            rstd[ch] = (float)(1.0 / sqrt((double)rvar[ch] + (double)eps));
            continue;
        }
        double count = sums[2 * c], d = sums[ch] / count;
        double m = (center ? center[ch] : 0.0) + d;
        double v = fmax(sums[c + ch] / count - d * d, 0.0);
        mean[ch] = (float)m;
        rstd[ch] = (float)(1.0 / sqrt(v + (double)eps));
        if (!rmean)
            continue;
        double k = momentum, unbiased = count > 1.0 ? v * count / (count - 1.0) : v;
        rmean[ch] = (float)((1.0 - k) * rmean[ch] + k * m);
        rvar[ch] = (float)((1.0 - k) * rvar[ch] + k * unbiased);
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

__global__ void batchnorm_forward_kernel(float *y, const float *x, const float *mean,
                                         const float *rstd, const float *gamma,
                                         const float *beta, int64_t n, int64_t c,
                                         int64_t inner)
{
    CHCU_FOR_EACH(i, n)
    {
        int64_t ch = (i / inner) % c;
        y[i] = (x[i] - mean[ch]) * rstd[ch] * gamma[ch] + beta[ch];
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
    batchnorm_forward_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(y), chcu_at<float>(x), chcu_at<float>(mean), chcu_at<float>(rstd),
        chcu_at<float>(gamma), chcu_at<float>(beta), n, c, inner);
    return chcu_launched("batchnorm_forward_kernel");
}

/* dgamma += rstd local[c + ch], dbeta += local[ch]. */
__global__ void batchnorm_param_grads_kernel(float *dgamma, float *dbeta, const float *rstd,
                                             const float *local, int64_t c)
{
    CHCU_FOR_EACH(ch, c)
    {
        dgamma[ch] = (float)(dgamma[ch] + (double)rstd[ch] * local[c + ch]);
        dbeta[ch] = (float)((double)dbeta[ch] + local[ch]);
    }
}

/* dx = gamma rstd (dy - total[ch] / M - (x - mean) rstd^2 total[c + ch] / M). */
__global__ void batchnorm_dx_kernel(float *dx, const float *dy, const float *x,
                                    const float *mean, const float *rstd, const float *gamma,
                                    const float *total, int64_t n, int64_t c, int64_t inner)
{
    CHCU_FOR_EACH(i, n)
    {
        int64_t ch = (i / inner) % c;
        float count = total[2 * c], rs = rstd[ch];
        float mean_dy = total[ch] / count, slope = rs * rs * total[c + ch] / count;
        dx[i] = gamma[ch] * rs * (dy[i] - mean_dy - (x[i] - mean[ch]) * slope);
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
    batchnorm_dx_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(dx), chcu_at<float>(dy), chcu_at<float>(x), chcu_at<float>(mean),
        chcu_at<float>(rstd), chcu_at<float>(gamma), chcu_at<float>(total), n, c, inner);
    return chcu_launched("batchnorm_dx_kernel");
}
