/* Fused softmax + cross-entropy, forward (mean loss) and backward, both in
 * one pass in place (softmax_xent_fused), and the deferred checks of
 * labels and embedding indices.
 *
 * Labels out of range: both kernels lower a check word to the first row
 * whose label is outside [0, c) and that label (atomicMin: the same row
 * whatever the order). The slot does not wait for it: the word is copied
 * to pinned host memory behind the kernel, and read where the stream is
 * waited for anyway (stream_sync, a blocking download or upload), which
 * then answers CH_ERR_INVALID_ARGUMENT as the host does (ops.h). A training
 * step waits once, to read its loss; reading each check on its own would
 * add three or four waits a step. The embedding's indices are checked the
 * same way (attention.cu). */
#include <math.h>
#include "common.cuh"
#include "kernels/half_bits.h"
#include "kernels/xent.h"

/* ---- deferred label and index checks ---- */

/* The words on the device are workspace, their pinned copies staging
 * (chi_workspace_reserve, chi_staging_add). */
static ch_status checks_alloc(chcu_stream *s)
{
    const size_t bytes = CHCU_CHECK_BYTES;
    void *dev = NULL, *host = NULL;
    ch_status st = chi_workspace_reserve(s->dev, bytes, "cuda label checks");
    if (st)
        return st;
    st = chcu_check(cudaMalloc(&dev, bytes), "cudaMalloc(checks)");
    if (st) {
        chi_workspace_release(s->dev, bytes);
        return st;
    }
    st = chcu_check(cudaHostAlloc(&host, bytes, cudaHostAllocDefault), "cudaHostAlloc(checks)");
    if (st) {
        /* The allocation's error is the one to report. */
        if (cudaFree(dev) != cudaSuccess)
            (void)cudaGetLastError();
        chi_workspace_release(s->dev, bytes);
        return st;
    }
    chi_staging_add(s->dev, bytes);
    s->check_dev = (unsigned long long *)dev;
    s->check_host = (unsigned long long *)host;
    return CH_OK;
}

ch_status chcu_check_begin(chcu_stream *s, int64_t positions, unsigned long long **word)
{
    if (positions > CHCU_CHECK_MAX_POS)
        return chi_error(CH_ERR_LIMIT,
                         "cuda: %lld labels or indices, more than a check word "
                         "can name (%lld)",
                         (long long)positions, (long long)CHCU_CHECK_MAX_POS);
    pthread_mutex_lock(&s->check_lock);
    ch_status st = s->check_dev ? CH_OK : checks_alloc(s);
    if (!st && s->npending == CHCU_CHECKS) {
        /* Full: the one place a check waits on its own. */
        st = chcu_check(cudaStreamSynchronize(s->s), "cudaStreamSynchronize(checks)");
        if (!st)
            st = chcu_checks_read_locked(s);
    }
    unsigned long long *w = s->check_dev + s->npending;
    if (!st)
        st = chcu_check(cudaMemsetAsync(w, 0xff, sizeof *w, s->s), "cudaMemsetAsync(check)");
    if (st) {
        pthread_mutex_unlock(&s->check_lock);
        return st;
    }
    *word = w;
    return CH_OK;
}

ch_status chcu_check_end(chcu_stream *s, ch_status launched, const char *fn, int index,
                         int64_t limit)
{
    int i = s->npending;
    ch_status st = launched;
    if (!st)
        st = chcu_check(cudaMemcpyAsync(s->check_host + i, s->check_dev + i, sizeof *s->check_host,
                                        cudaMemcpyDeviceToHost, s->s),
                        "cudaMemcpyAsync(check)");
    if (!st) {
        s->pending[i].fn = fn;
        s->pending[i].index = index;
        s->pending[i].limit = limit;
        s->npending = i + 1;
    }
    pthread_mutex_unlock(&s->check_lock);
    return st;
}

ch_status chcu_checks_read_locked(chcu_stream *s)
{
    ch_status st = CH_OK;
    for (int i = 0; i < s->npending && !st; i++) {
        unsigned long long w = s->check_host[i];
        if (w == CHCU_CHECK_NONE)
            continue;
        const chcu_pending_check *p = &s->pending[i];
        int64_t pos = (int64_t)(w >> 32);
        int32_t value = (int32_t)(uint32_t)(w & 0xffffffffu);
        st = p->index ? chi_bad_index(p->fn, pos, value, p->limit)
                      : chi_bad_label(p->fn, pos, value, p->limit);
    }
    s->npending = 0;
    return st;
}

ch_status chcu_stream_wait(chcu_stream *s, const char *what)
{
    /* Held across the wait: a check queued meanwhile by another thread
     * would have a host word not written yet. */
    pthread_mutex_lock(&s->check_lock);
    ch_status st = chcu_check(cudaStreamSynchronize(s->s), what);
    if (!st)
        st = chcu_checks_read_locked(s);
    pthread_mutex_unlock(&s->check_lock);
    return st;
}

void chcu_checks_free(chcu_stream *s)
{
    if (s->check_dev) {
        (void)chcu_check(cudaFree(s->check_dev), "cudaFree(checks)");
        chi_workspace_release(s->dev, CHCU_CHECK_BYTES);
    }
    if (s->check_host) {
        (void)chcu_check(cudaFreeHost(s->check_host), "cudaFreeHost(checks)");
        chi_staging_remove(s->dev, CHCU_CHECK_BYTES);
    }
    s->check_dev = s->check_host = NULL;
    s->npending = 0;
}

/* One warp per row: probs = softmax(row); rowloss = log(sum) - (x[label] -
 * max), which is -log probs[label] without rounding probs first. A label
 * out of range gives NaN and lowers *bad to its row's check word. */
__global__ void softmax_xent_kernel(float *probs, float *rowloss, const float *logits,
                                    const int32_t *labels, int64_t n, int64_t c,
                                    unsigned long long *bad)
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
                atomicMin(bad, chcu_check_word(r, l));
            }
        }
    }
}

/* What both forward slots share: scratch for the row losses (rounded up
 * to 8 bytes, to keep the sum's doubles aligned) and the sum's workspace,
 * the label check around launch(rowloss, bad), which queues the kernel
 * writing the row losses, then their mean into loss. */
template <typename Launch>
static ch_status xent_rows(chcu_stream *s, int64_t n, int64_t c, ch_bmem loss, const char *op,
                           const char *kernel, Launch launch)
{
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    size_t rows_bytes = ((size_t)n * sizeof(float) + 7) / 8 * 8;
    void *work;
    st = chcu_scratch_acquire(s, rows_bytes + chcu_sum_into_work(1, n, 1), &work);
    if (st)
        return st;
    float *rowloss = (float *)work;
    unsigned long long *bad = NULL;
    st = chcu_check_begin(s, n, &bad);
    if (!st) {
        launch(rowloss, bad);
        st = chcu_check_end(s, chcu_launched(kernel), op, 0, c);
    }
    if (!st)
        st = chcu_sum_into(s, chcu_at<float>(loss), rowloss, 1, n, 1, (double)n, 0.0f,
                           (char *)work + rows_bytes);
    chcu_scratch_release(s);
    return st;
}

ch_status chcu_softmax_xent(void *stream, int64_t n, int64_t c, ch_bmem loss, ch_bmem probs,
                            ch_bmem logits, ch_bmem labels)
{
    chcu_stream *s = (chcu_stream *)stream;
    return xent_rows(
        s, n, c, loss, "ch_softmax_xent", "softmax_xent_kernel",
        [&](float *rowloss, unsigned long long *bad) {
            softmax_xent_kernel<<<chcu_grid(s->dev, n * CHCU_WARP), CHCU_THREADS, 0, s->s>>>(
                chcu_at<float>(probs), rowloss, chcu_at<float>(logits), chcu_at<int32_t>(labels), n,
                c, bad);
        });
}

/* dlogits[r, j] = (probs[r, j] - (j == label[r])) * scale / n; the threads
 * of column 0 lower *bad to the check word of a row whose label is out of
 * range. */
__global__ void softmax_xent_backward_kernel(float *dl, const float *probs, const int32_t *labels,
                                             int64_t n, int64_t c, float scale,
                                             unsigned long long *bad)
{
    CHCU_FOR_ROWS(r, n)
    {
        int32_t l = labels[r];
        if (blockIdx.x == 0 && threadIdx.x == 0 && (l < 0 || l >= c))
            atomicMin(bad, chcu_check_word(r, l));
        chk_acc k = chk_xent_scale(scale, (chk_acc)n);
        CHCU_FOR_COLS(j, c)
        dl[r * c + j] = chk_xent_grad(probs[r * c + j], j == l, k);
    }
}

ch_status chcu_softmax_xent_backward(void *stream, int64_t n, int64_t c, ch_bmem dlogits,
                                     ch_bmem probs, ch_bmem labels, float scale)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    unsigned long long *bad = NULL;
    if (!st)
        st = chcu_check_begin(s, n, &bad);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, n, c);
    softmax_xent_backward_kernel<<<sh.grid, sh.block, 0, s->s>>>(
        chcu_at<float>(dlogits), chcu_at<float>(probs), chcu_at<int32_t>(labels), n, c, scale, bad);
    return chcu_check_end(s, chcu_launched("softmax_xent_backward_kernel"),
                          "ch_softmax_xent_backward", 0, c);
}

/* ---- softmax_xent_fused: a block per row, the row read twice, written once ---- */

/* A logit widened to f32, and a gradient rounded to the tensor's format. */
__device__ static inline float fused_load(const float *x, int64_t j, int)
{
    return x[j];
}
__device__ static inline float fused_load(const uint16_t *x, int64_t j, int bf16)
{
    return chk_bits_f32(bf16 ? chk_bf16_to_f32(x[j]) : chk_f16_to_f32(x[j]));
}
__device__ static inline void fused_store(float *x, int64_t j, float v, int)
{
    x[j] = v;
}
__device__ static inline void fused_store(uint16_t *x, int64_t j, float v, int bf16)
{
    x[j] = bf16 ? chk_f32_to_bf16(chk_f32_bits(v)) : chk_f32_to_f16(chk_f32_bits(v));
}

/* Rows [blockIdx.x, n) by gridDim.x: each thread's share of the row read
 * once for its running max and sum (xent.h's online softmax), the block's merged
 * through the warps and shared memory; then each element read again and
 * overwritten by its gradient, chk_xent_grad of expf(x - max) / sum. */
template <typename T>
__global__ void softmax_xent_fused_kernel(T *logits, float *rowloss, const int32_t *labels,
                                          int64_t n, int64_t c, float scale, int bf16,
                                          unsigned long long *bad)
{
    __shared__ float sm[32], ss[32];
    const int lane = threadIdx.x % CHCU_WARP, warp = threadIdx.x / CHCU_WARP;
    const int warps = blockDim.x / CHCU_WARP;
    chk_acc k = chk_xent_scale(scale, (chk_acc)n);
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        T *x = logits + r * c;
        float m = -INFINITY, s = 0.0f;
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
            chk_xent_online_add(&m, &s, fused_load(x, j, bf16));
        for (int o = CHCU_WARP / 2; o > 0; o /= 2) {
            float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            chk_xent_online_merge(&m, &s, m2, s2);
        }
        if (lane == 0) {
            sm[warp] = m;
            ss[warp] = s;
        }
        __syncthreads();
        m = sm[0];
        s = ss[0];
        for (int w = 1; w < warps; w++)
            chk_xent_online_merge(&m, &s, sm[w], ss[w]);
        int32_t l = labels[r];
        int good = l >= 0 && l < c;
        if (threadIdx.x == 0) {
            if (good) {
                rowloss[r] = logf(s) - (fused_load(x, l, bf16) - m);
            } else {
                rowloss[r] = NAN;
                atomicMin(bad, chcu_check_word(r, l));
            }
        }
        /* The label's logit is read above before any thread writes it. */
        __syncthreads();
        for (int64_t j = threadIdx.x; j < c; j += blockDim.x)
            fused_store(x, j, chk_xent_grad(expf(fused_load(x, j, bf16) - m) / s, j == l, k), bf16);
    }
}

ch_status chcu_softmax_xent_fused(void *stream, int64_t n, int64_t c, ch_dtype dt, float scale,
                                  ch_bmem loss, ch_bmem logits, ch_bmem labels)
{
    if (dt != CH_F32 && dt != CH_BF16 && dt != CH_F16)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda softmax_xent_fused: dtype %d", (int)dt);
    chcu_stream *s = (chcu_stream *)stream;
    /* A warp for short rows, 512 threads (at most 32 warps: sm, ss) for a
     * vocabulary. */
    int threads = c <= 1024 ? CHCU_WARP : 512;
    unsigned grid = (unsigned)(n < 65535 * 16 ? n : 65535 * 16);
    return xent_rows(s, n, c, loss, "ch_softmax_xent_fused", "softmax_xent_fused_kernel",
                     [&](float *rowloss, unsigned long long *bad) {
                         if (dt == CH_F32)
                             softmax_xent_fused_kernel<float><<<grid, threads, 0, s->s>>>(
                                 chcu_at<float>(logits), rowloss, chcu_at<int32_t>(labels), n, c,
                                 scale, 0, bad);
                         else
                             softmax_xent_fused_kernel<uint16_t><<<grid, threads, 0, s->s>>>(
                                 chcu_at<uint16_t>(logits), rowloss, chcu_at<int32_t>(labels), n, c,
                                 scale, dt == CH_BF16, bad);
                     });
}
