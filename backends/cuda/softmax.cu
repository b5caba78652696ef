/* Fused softmax + cross-entropy, forward (mean loss) and backward.
 *
 * Labels out of range: both kernels lower a flag word to the first row
 * whose label is outside [0, c) (atomicMin: the same row whatever the
 * order), and the slot reads it back before returning so that it can answer
 * CH_ERR_INVALID_ARGUMENT as the host does (ops.h). That read is the one
 * wait of these slots: it returns when the stream has run the kernel. The
 * embedding's indices are checked the same way (attention.cu). */
#include <math.h>
#include "common.cuh"
#include "kernels/xent.h"

ch_status chcu_flag_reset(const chcu_stream *s, unsigned *flag)
{
    return chcu_check(cudaMemsetAsync(flag, 0xff, sizeof *flag, s->s), "cudaMemsetAsync");
}

ch_status chcu_flag_acquire(chcu_stream *s, unsigned **flag)
{
    ch_status st = chcu_enter(s->dev);
    void *work = NULL;
    if (!st)
        st = chcu_scratch_acquire(s, sizeof(unsigned), &work);
    if (st)
        return st;
    *flag = (unsigned *)work;
    st = chcu_flag_reset(s, *flag);
    if (st)
        chcu_scratch_release(s);
    return st;
}

/* A small read on the stream, waited for. */
static ch_status read_back(const chcu_stream *s, void *host, const void *dev, size_t bytes)
{
    ch_status st = chcu_check(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, s->s),
                              "cudaMemcpyAsync");
    return st ? st : chcu_check(cudaStreamSynchronize(s->s), "cudaStreamSynchronize");
}

ch_status chcu_flag_read(const chcu_stream *s, const unsigned *flag, const int32_t *values,
                         int64_t *pos, int32_t *value)
{
    unsigned row = CHCU_NO_ROW;
    ch_status st = read_back(s, &row, flag, sizeof row);
    *pos = row == CHCU_NO_ROW ? -1 : (int64_t)row;
    if (st || row == CHCU_NO_ROW)
        return st;
    return read_back(s, value, values + row, sizeof *value);
}

/* Waits for the flag; the error names the first bad row and its label. */
static ch_status labels_check(const chcu_stream *s, const char *fn, const unsigned *flag,
                              const int32_t *labels, int64_t c)
{
    int64_t row = -1;
    int32_t label = 0;
    ch_status st = chcu_flag_read(s, flag, labels, &row, &label);
    if (st || row < 0)
        return st;
    return chi_bad_label(fn, row, label, c);
}

/* One warp per row: probs = softmax(row); rowloss = log(sum) - (x[label] -
 * max), which is -log probs[label] without rounding probs first. A label
 * out of range gives NaN and lowers *bad to its row. */
__global__ void softmax_xent_kernel(float *probs, float *rowloss, const float *logits,
                                    const int32_t *labels, int64_t n, int64_t c, unsigned *bad)
{
    const int lane = threadIdx.x % CHCU_WARP;
    const int64_t warps = (int64_t)gridDim.x * blockDim.x / CHCU_WARP;
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / CHCU_WARP; r < n;
         r += warps) {
        const float *x = logits + r * c;
        float *p = probs + r * c;
        float m, sum;
        chcu_row_max_expsum(x, c, lane, &m, &sum);
        for (int64_t j = lane; j < c; j += CHCU_WARP)
            p[j] = expf(x[j] - m) / sum;
        if (lane == 0) {
            int32_t l = labels[r];
            if (l >= 0 && l < c) {
                rowloss[r] = logf(sum) - (x[l] - m);
            } else {
                rowloss[r] = NAN;
                atomicMin(bad, (unsigned)r);
            }
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
    /* Scratch: the row losses, the flag (8 bytes, to keep the sum's
     * doubles aligned), the sum's workspace. */
    size_t rows_bytes = ((size_t)n * sizeof(float) + 7) / 8 * 8;
    void *work;
    st = chcu_scratch_acquire(s, rows_bytes + 8 + chcu_sum_into_work(1, n, 1), &work);
    if (st)
        return st;
    float *rowloss = (float *)work;
    unsigned *flag = (unsigned *)((char *)work + rows_bytes);
    st = chcu_flag_reset(s, flag);
    if (!st) {
        softmax_xent_kernel<<<chcu_grid(s->dev, n * CHCU_WARP), CHCU_THREADS, 0, s->s>>>(
            chcu_at<float>(probs), rowloss, chcu_at<float>(logits), chcu_at<int32_t>(labels), n,
            c, flag);
        st = chcu_launched("softmax_xent_kernel");
    }
    if (!st)
        st = chcu_sum_into(s, chcu_at<float>(loss), rowloss, 1, n, 1, (double)n, 0.0f,
                           (char *)work + rows_bytes + 8);
    if (!st)
        st = labels_check(s, "ch_softmax_xent", flag, chcu_at<int32_t>(labels), c);
    chcu_scratch_release(s);
    return st;
}

/* dlogits[r, j] = (probs[r, j] - (j == label[r])) * scale / n; the threads
 * of column 0 lower *bad to a row whose label is out of range. */
__global__ void softmax_xent_backward_kernel(float *dl, const float *probs,
                                             const int32_t *labels, int64_t n, int64_t c,
                                             float scale, unsigned *bad)
{
    CHCU_FOR_ROWS(r, n)
    {
        int32_t l = labels[r];
        if (blockIdx.x == 0 && threadIdx.x == 0 && (l < 0 || l >= c))
            atomicMin(bad, (unsigned)r);
        chk_acc k = chk_xent_scale(scale, (chk_acc)n);
        CHCU_FOR_COLS(j, c)
        dl[r * c + j] = chk_xent_grad(probs[r * c + j], j == l, k);
    }
}

ch_status chcu_softmax_xent_backward(void *stream, int64_t n, int64_t c, ch_bmem dlogits,
                                     ch_bmem probs, ch_bmem labels, float scale)
{
    chcu_stream *s = (chcu_stream *)stream;
    unsigned *flag = NULL;
    ch_status st = chcu_flag_acquire(s, &flag);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, n, c);
    softmax_xent_backward_kernel<<<sh.grid, sh.block, 0, s->s>>>(
        chcu_at<float>(dlogits), chcu_at<float>(probs), chcu_at<int32_t>(labels), n, c,
        scale, flag);
    st = chcu_launched("softmax_xent_backward_kernel");
    if (!st)
        st = labels_check(s, "ch_softmax_xent_backward", flag, chcu_at<int32_t>(labels), c);
    chcu_scratch_release(s);
    return st;
}
