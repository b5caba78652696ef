/* Fused softmax + cross-entropy, forward (mean loss) and backward. */
#include <math.h>
#include "common.cuh"

#define WARP 32

__device__ static float warp_max(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* A butterfly: every lane ends with the same sum, added in the same order
 * on every run. */
__device__ static float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* One warp per row: probs = softmax(row); rowloss = log(sum) - (x[label] -
 * max), which is -log probs[label] without rounding probs first. A label
 * out of range gives NaN. */
__global__ void softmax_xent_kernel(float *probs, float *rowloss, const float *logits,
                                    const int32_t *labels, int64_t n, int64_t c)
{
    const int lane = threadIdx.x % WARP;
    const int64_t warps = (int64_t)gridDim.x * blockDim.x / WARP;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / WARP; r < n; r += warps) {
        const float *x = logits + r * c;
        float *p = probs + r * c;
        float m = -INFINITY;
        for (int64_t j = lane; j < c; j += WARP)
            m = fmaxf(m, x[j]);
        m = warp_max(m);
        float sum = 0.0f;
        for (int64_t j = lane; j < c; j += WARP)
            sum += expf(x[j] - m);
        sum = warp_sum(sum);
        for (int64_t j = lane; j < c; j += WARP)
            p[j] = expf(x[j] - m) / sum;
        if (lane == 0) {
            int32_t l = labels[r];
            rowloss[r] = l >= 0 && l < c ? logf(sum) - (x[l] - m) : NAN;
        }
    }
}

ch_status chcu_softmax_xent(void *stream, int64_t n, int64_t c, ch_bmem loss, ch_bmem probs,
                            ch_bmem logits, ch_bmem labels)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    size_t rows_bytes = ((size_t)n * sizeof(float) + 7) / 8 * 8;
    void *work;
    st = chcu_scratch_acquire(s, rows_bytes + chcu_sum_into_work(1, n, 1), &work);
    if (st)
        return st;
    float *rowloss = (float *)work;
    softmax_xent_kernel<<<chcu_grid(s->dev, n * WARP), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(probs), rowloss, chcu_at<float>(logits), chcu_at<int32_t>(labels), n, c);
    st = chcu_launched("softmax_xent_kernel");
    if (!st)
        st = chcu_sum_into(s, chcu_at<float>(loss), rowloss, 1, n, 1, (double)n, 0.0f,
                           (char *)work + rows_bytes);
    chcu_scratch_release(s);
    return st;
}

/* dlogits[r, j] = (probs[r, j] - (j == label[r])) * scale / n */
__global__ void softmax_xent_backward_kernel(float *dl, const float *probs,
                                             const int32_t *labels, int64_t n, int64_t c,
                                             float k)
{
    CHCU_FOR_ROWS(r, n)
    {
        int32_t l = labels[r];
        CHCU_FOR_COLS(j, c)
        {
            float t = j == l ? 1.0f : 0.0f;
            dl[r * c + j] = (probs[r * c + j] - t) * k;
        }
    }
}

ch_status chcu_softmax_xent_backward(void *stream, int64_t n, int64_t c, ch_bmem dlogits,
                                     ch_bmem probs, ch_bmem labels, float scale)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, n, c);
    softmax_xent_backward_kernel<<<sh.grid, sh.block, 0, s->s>>>(
        chcu_at<float>(dlogits), chcu_at<float>(probs), chcu_at<int32_t>(labels), n, c,
        scale / (float)n);
    return chcu_launched("softmax_xent_backward_kernel");
}
