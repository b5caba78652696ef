/* Attention's ops: permute, the row softmax with its causal mask and its
 * backward, the embedding gather and its backward (the batched GEMM is
 * gemm.cu's). No atomics in any sum: each output is summed by one thread
 * or one warp in an order fixed by the shape, so results are the same bits
 * on every run. (The embedding's out-of-range check word is an atomicMin,
 * which only picks the first bad position.) */
#include <math.h>
#include <cub/device/device_radix_sort.cuh>
#include "common.cuh"
#include "embedding_order.h"

/* ---- permute ---------------------------------------------------------------- */

/* y's shape and the stride in x of each of y's dimensions. */
struct chcu_perm {
    int ndim;
    int64_t shape[CH_MAX_DIMS];
    int64_t stride[CH_MAX_DIMS];
};

/* Indexed in I, narrowed once per thread. */
template <typename I>
__global__ void permute_kernel(uint32_t *y, const uint32_t *x, int64_t n, chcu_perm p)
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

/* y[i, :] = table[idx[i], :], 0 for an index outside [0, v), which lowers
 * *bad to its position's check word (softmax.cu). */
__global__ void embedding_kernel(float *y, const float *table, const int32_t *idx, int64_t n,
                                 int64_t v, int64_t d, unsigned long long *bad)
{
    CHCU_FOR_ROWS(i, n)
    {
        int32_t row = idx[i];
        int ok = row >= 0 && row < v;
        if (!ok && blockIdx.x == 0 && threadIdx.x == 0)
            atomicMin(bad, chcu_check_word(i, row));
        CHCU_FOR_COLS(j, d)
        y[i * d + j] = ok ? table[row * d + j] : 0.0f;
    }
}

ch_status chcu_embedding(void *stream, int64_t n, int64_t v, int64_t d, ch_bmem y,
                         ch_bmem table, ch_bmem idx)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    unsigned long long *bad = NULL;
    if (!st)
        st = chcu_check_begin(s, n, &bad);
    if (st)
        return st;
    chcu_shape2 sh = chcu_rows(s->dev, n, d);
    embedding_kernel<<<sh.grid, sh.block, 0, s->s>>>(chcu_at<float>(y), chcu_at<float>(table),
                                                     chcu_at<int32_t>(idx), n, v, d, bad);
    return chcu_check_end(s, chcu_launched("embedding_kernel"), "ch_embedding", 1, v);
}

/* The (key, position) pairs of the batch's indices (embedding_order.h). */
__global__ void embedding_keys_kernel(uint32_t *keys, int32_t *pos, const int32_t *idx, int64_t n,
                                      int64_t v)
{
    CHCU_FOR_EACH(i, n)
    {
        keys[i] = cheo_key(idx[i], v);
        pos[i] = (int32_t)i;
    }
}

/* One thread per (sorted position, column of dtable): the first position
 * of each row's run sums the run's dy rows in increasing position and adds
 * the sum to the row; the others have nothing to do. */
__global__ void embedding_backward_kernel(float *dtable, const float *dy, const uint32_t *keys,
                                          const int32_t *pos, int64_t n, int64_t v, int64_t d)
{
    CHCU_FOR_ROWS(i, n)
    {
        if (!cheo_run_start(keys, i, v))
            continue;
        CHCU_FOR_COLS(j, d)
        dtable[(int64_t)keys[i] * d + j] += cheo_run_sum(keys, pos, dy, n, d, i, j);
    }
}

/* Rounded up to 256 bytes: each part of the scratch starts aligned for CUB. */
static size_t chcu_align256(size_t bytes)
{
    return (bytes + 255) / 256 * 256;
}

ch_status chcu_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d,
                                  ch_bmem dtable, ch_bmem dy, ch_bmem idx)
{
    chcu_stream *s = (chcu_stream *)stream;
    if (n > INT32_MAX || v >= (int64_t)UINT32_MAX)
        return chi_error(CH_ERR_LIMIT,
                         "cuda embedding_backward: %lld indices into %lld rows, "
                         "more than its sort takes (2^31 - 1 indices, 2^32 - 2 rows)",
                         (long long)n, (long long)v);
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    /* How much work space CUB's sort wants for n pairs (no sorting yet). */
    size_t sort_bytes = 0;
    st = chcu_check(cub::DeviceRadixSort::SortPairs(
                        NULL, sort_bytes, (const uint32_t *)NULL, (uint32_t *)NULL,
                        (const int32_t *)NULL, (int32_t *)NULL, (int)n, 0, cheo_key_bits(v), s->s),
                    "cub::DeviceRadixSort::SortPairs(size)");
    if (st)
        return st;
    /* Scratch: keys and positions, before and after the sort, then CUB's. */
    const size_t part = chcu_align256((size_t)n * sizeof(uint32_t));
    void *work;
    st = chcu_scratch_acquire(s, 4 * part + sort_bytes, &work);
    if (st)
        return st;
    char *w = (char *)work;
    uint32_t *keys_in = (uint32_t *)w, *keys = (uint32_t *)(w + part);
    int32_t *pos_in = (int32_t *)(w + 2 * part), *pos = (int32_t *)(w + 3 * part);
    embedding_keys_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        keys_in, pos_in, chcu_at<int32_t>(idx), n, v);
    st = chcu_launched("embedding_keys_kernel");
    if (!st)
        st = chcu_check(cub::DeviceRadixSort::SortPairs(w + 4 * part, sort_bytes, keys_in, keys,
                                                        pos_in, pos, (int)n, 0, cheo_key_bits(v),
                                                        s->s),
                        "cub::DeviceRadixSort::SortPairs");
    if (!st) {
        chcu_shape2 sh = chcu_rows(s->dev, n, d);
        embedding_backward_kernel<<<sh.grid, sh.block, 0, s->s>>>(
            chcu_at<float>(dtable), chcu_at<float>(dy), keys, pos, n, v, d);
        st = chcu_launched("embedding_backward_kernel");
    }
    chcu_scratch_release(s);
    return st;
}
