/* Attention's ops: permute, the row softmax with its causal mask and its
 * backward, the embedding gather and its backward (the batched GEMM is
 * gemm.cu's). No atomics in any sum: each output is summed by one thread
 * or one warp in an order fixed by the shape, so results are the same bits
 * on every run. (The embedding's out-of-range flag is an atomicMin, which
 * only picks the first bad position.) */
#include <math.h>
#include "common.cuh"

/* ---- permute ---------------------------------------------------------------- */

/* y's shape and the stride in x of each of y's dimensions. */
struct chcu_perm {
    int ndim;
    int64_t shape[CH_MAX_DIMS];
    int64_t stride[CH_MAX_DIMS];
};

/* Indexed in I, narrowed once per thread. */
template <typename I> __global__ void permute_kernel(uint32_t *y, const uint32_t *x, int64_t n,
                                                     chcu_perm p)
{
    I shape[CH_MAX_DIMS], stride[CH_MAX_DIMS];
    for (int d = 0; d < p.ndim; d++) {
        shape[d] = (I)p.shape[d];
        stride[d] = (I)p.stride[d];
    }
    CHCU_FOR_EACH_AS(I, i, n)
    y[i] = x[chk_permute_src(i, p.ndim, shape, stride)];
}

ch_status chcu_permute(void *stream, int ndim, const int64_t *xshape, const int *perm,
                       ch_bmem y, ch_bmem x)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    chcu_perm p = {};
    p.ndim = ndim;
    int64_t n = chk_permute_plan(ndim, xshape, perm, p.shape, p.stride);
    /* Every offset into x or y is below n. */
    CHCU_LAUNCH_INDEXED(chk_index_is_32(n), permute_kernel,
                        (chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s), chcu_at<uint32_t>(y),
                        chcu_at<uint32_t>(x), n, p);
    return chcu_launched("permute_kernel");
}

/* ---- softmax ---------------------------------------------------------------- */

/* The rows of a grid-stride loop that gives each warp one row at a time. */
#define FOR_WARP_ROWS(r, lane, rows)                                                      \
    const int lane = threadIdx.x % CHCU_WARP;                                             \
    for (int64_t r = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / CHCU_WARP;        \
         r < (rows); r += (int64_t)gridDim.x * blockDim.x / CHCU_WARP)

/* One warp per row of s: y = softmax of the row's first w columns (w = s,
 * or with the causal mask its position in its matrix of rpm rows plus
 * s - rpm + 1), 0 beyond. y may be x: each element is read by the lane
 * that writes it, and the reductions read before they write. */
__global__ void softmax_masked_kernel(float *y, const float *x, int64_t rows, int64_t s,
                                      int causal, int64_t rpm)
{
    FOR_WARP_ROWS(r, lane, rows)
    {
        int64_t w = causal ? r % rpm + s - rpm + 1 : s;
        const float *xr = x + r * s;
        float *yr = y + r * s;
        float m, sum;
        chcu_row_max_expsum(xr, w, lane, &m, &sum);
        for (int64_t j = lane; j < s; j += CHCU_WARP)
            yr[j] = j < w ? expf(xr[j] - m) / sum : 0.0f;
    }
}

ch_status chcu_softmax(void *stream, int64_t rows, int64_t s, int causal,
                       int64_t rows_per_matrix, ch_bmem y, ch_bmem x)
{
    chcu_stream *cs = (chcu_stream *)stream;
    ch_status st = chcu_enter(cs->dev);
    if (st)
        return st;
    softmax_masked_kernel<<<chcu_grid(cs->dev, rows * CHCU_WARP), CHCU_THREADS, 0, cs->s>>>(
        chcu_at<float>(y), chcu_at<float>(x), rows, s, causal, rows_per_matrix);
    return chcu_launched("softmax_masked_kernel");
}

/* One warp per row: dx = y (dy - <dy, y>); dx may be dy. */
__global__ void softmax_masked_backward_kernel(float *dx, const float *dy, const float *y,
                                               int64_t rows, int64_t s)
{
    FOR_WARP_ROWS(r, lane, rows)
    {
        const float *g = dy + r * s, *p = y + r * s;
        float *out = dx + r * s;
        float dot = 0.0f;
        for (int64_t j = lane; j < s; j += CHCU_WARP)
            dot += g[j] * p[j];
        dot = chcu_warp_sum(dot);
        for (int64_t j = lane; j < s; j += CHCU_WARP)
            out[j] = p[j] * (g[j] - dot);
    }
}

ch_status chcu_softmax_backward(void *stream, int64_t rows, int64_t s, ch_bmem dx, ch_bmem dy,
                                ch_bmem y)
{
    chcu_stream *cs = (chcu_stream *)stream;
    ch_status st = chcu_enter(cs->dev);
    if (st)
        return st;
    softmax_masked_backward_kernel<<<chcu_grid(cs->dev, rows * CHCU_WARP), CHCU_THREADS, 0,
                                     cs->s>>>(chcu_at<float>(dx), chcu_at<float>(dy),
                                               chcu_at<float>(y), rows, s);
    return chcu_launched("softmax_masked_backward_kernel");
}

/* ---- embedding ---------------------------------------------------------------- */

/* y[i, :] = table[idx[i], :], 0 for an index outside [0, v), whose
 * position lowers *bad. */
__global__ void embedding_kernel(float *y, const float *table, const int32_t *idx, int64_t n,
                                 int64_t v, int64_t d, unsigned *bad)
{
    CHCU_FOR_ROWS(i, n)
    {
        int32_t row = idx[i];
        int ok = row >= 0 && row < v;
        if (!ok && blockIdx.x == 0 && threadIdx.x == 0)
            atomicMin(bad, (unsigned)i);
        CHCU_FOR_COLS(j, d)
        y[i * d + j] = ok ? table[row * d + j] : 0.0f;
    }
}

ch_status chcu_embedding(void *stream, int64_t n, int64_t v, int64_t d, ch_bmem y,
                         ch_bmem table, ch_bmem idx)
{
    chcu_stream *s = (chcu_stream *)stream;
    unsigned *flag = NULL;
    ch_status st = chcu_flag_acquire(s, &flag);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, n, d);
    embedding_kernel<<<sh.grid, sh.block, 0, s->s>>>(
        chcu_at<float>(y), chcu_at<float>(table), chcu_at<int32_t>(idx), n, v, d, flag);
    st = chcu_launched("embedding_kernel");
    int64_t pos = -1;
    int32_t index = 0;
    if (!st)
        st = chcu_flag_read(s, flag, chcu_at<int32_t>(idx), &pos, &index);
    chcu_scratch_release(s);
    if (!st && pos >= 0)
        st = chi_bad_index("ch_embedding", pos, index, v);
    return st;
}

/* The positions of each table row as a chain, one thread per position i:
 * head[r] = the first position whose index is r (head is -1 before),
 * next[i] = the next position with the same index as i, or -1. */
__global__ void embedding_chain_kernel(int64_t *head, int64_t *next, const int32_t *idx,
                                       int64_t n, int64_t v)
{
    CHCU_FOR_EACH(i, n)
    {
        int32_t row = idx[i];
        if (row < 0 || row >= v)
            continue;
        int first = 1;
        int64_t after = -1;
        for (int64_t j = 0; j < i && first; j++)
            first = idx[j] != row;
        for (int64_t j = i + 1; j < n && after < 0; j++)
            if (idx[j] == row)
                after = j;
        next[i] = after;
        if (first)
            head[row] = i;
    }
}

/* One thread per element of dtable [v, d]: the dy rows of its row's chain
 * summed in increasing position, then added. */
__global__ void embedding_backward_kernel(float *dtable, const float *dy, const int64_t *head,
                                          const int64_t *next, int64_t v, int64_t d)
{
    CHCU_FOR_ROWS(r, v)
    {
        CHCU_FOR_COLS(j, d)
        {
            int64_t i = head[r];
            if (i < 0)
                continue;
            float sum = 0.0f;
            for (; i >= 0; i = next[i])
                sum += dy[i * d + j];
            dtable[r * d + j] += sum;
        }
    }
}

ch_status chcu_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d,
                                  ch_bmem dtable, ch_bmem dy, ch_bmem idx)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    void *work;
    st = chcu_scratch_acquire(s, (size_t)(v + n) * sizeof(int64_t), &work);
    if (st)
        return st;
    int64_t *head = (int64_t *)work, *next = head + v;
    st = chcu_check(cudaMemsetAsync(head, 0xff, (size_t)v * sizeof *head, s->s),
                    "cudaMemsetAsync");
    if (!st) {
        embedding_chain_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
            head, next, chcu_at<int32_t>(idx), n, v);
        st = chcu_launched("embedding_chain_kernel");
    }
    if (!st) {
        chcu_shape2 sh = chcu_rows(s->dev, v, d);
        embedding_backward_kernel<<<sh.grid, sh.block, 0, s->s>>>(
            chcu_at<float>(dtable), chcu_at<float>(dy), head, next, v, d);
        st = chcu_launched("embedding_backward_kernel");
    }
    chcu_scratch_release(s);
    return st;
}
