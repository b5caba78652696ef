/* Fused causal attention (lib/backend.h's attention slots): flash.h's
 * tiles, each kernel a block of CHF_THREADS threads per CHF_THREADS rows of
 * one matrix, the steps in flash.h's order (tests/test-cuda-flash.c runs
 * the same order on the CPU). A head size of 16, 32, 64 or 128 gets a
 * kernel of its own, whose rows stay in registers; any other up to
 * CHF_HD_MAX the general one. Forward: o and lse. Backward: d = dout.o,
 * then dq by query rows and dk, dv by key rows, apart, so that no sum
 * needs an atomic: the same bits on every run. */
#include "common.cuh"
#include "flash.h"

/* The geometry a kernel takes, its head size fixed where HD is not 0 (the
 * loops over a row then have a constant bound and the rows' arrays become
 * registers). */
template <int HD> __device__ static inline chf_geom chcu_flash_geom(chf_geom g)
{
    if (HD)
        g.hd = HD;
    return g;
}

#define CHCU_ROW(HD) ((HD) ? (HD) : CHF_HD_MAX)

template <int HD>
__global__ void __launch_bounds__(CHF_THREADS)
    flash_forward_kernel(chf_geom g0, float *o, float *lse, const float *q, const float *k,
                         const float *v)
{
    __shared__ float ks[CHF_TILE_FLOATS], vs[CHF_TILE_FLOATS];
    const chf_geom g = chcu_flash_geom<HD>(g0);
    const int tid = threadIdx.x;
    const int64_t blk = blockIdx.x, bh = blockIdx.y, i = blk * CHF_THREADS + tid;
    const int64_t rows = chf_tile_rows(g.hd), end = chf_keys_end(&g, blk);
    float qi[CHCU_ROW(HD)], acc[CHCU_ROW(HD)];
    chf_fwd_row st = chf_fwd_begin(&g, q, bh, i, qi, acc);
    for (int64_t j0 = 0; j0 < end; j0 += rows) {
        __syncthreads();
        chf_load(&g, k, g.ld, bh, j0, rows, tid, ks);
        chf_load(&g, v, g.ld, bh, j0, rows, tid, vs);
        __syncthreads();
        st = chf_fwd_tile(&g, i, j0, rows, st, qi, acc, ks, vs);
    }
    chf_fwd_end(&g, o, lse, bh, i, st, acc);
}

__global__ void flash_d_kernel(chf_geom g, float *d, const float *dout, const float *o,
                               int64_t rows)
{
    CHCU_FOR_EACH(r, rows)
    d[r] = chf_bwd_d(&g, dout, o, r / g.t, r % g.t);
}

template <int HD>
__global__ void __launch_bounds__(CHF_THREADS)
    flash_dq_kernel(chf_geom g0, float *dq, const float *q, const float *k, const float *v,
                    const float *dout, const float *lse, const float *d)
{
    __shared__ float ks[CHF_TILE_FLOATS], vs[CHF_TILE_FLOATS];
    const chf_geom g = chcu_flash_geom<HD>(g0);
    const int tid = threadIdx.x;
    const int64_t blk = blockIdx.x, bh = blockIdx.y, i = blk * CHF_THREADS + tid;
    const int64_t rows = chf_tile_rows(g.hd), end = chf_keys_end(&g, blk);
    float qi[CHCU_ROW(HD)], doi[CHCU_ROW(HD)], acc[CHCU_ROW(HD)];
    chf_dq_begin(&g, q, dout, bh, i, qi, doi, acc);
    const float lse_i = i < g.t ? lse[bh * g.t + i] : 0.0f, d_i = i < g.t ? d[bh * g.t + i] : 0.0f;
    for (int64_t j0 = 0; j0 < end; j0 += rows) {
        __syncthreads();
        chf_load(&g, k, g.ld, bh, j0, rows, tid, ks);
        chf_load(&g, v, g.ld, bh, j0, rows, tid, vs);
        __syncthreads();
        chf_dq_tile(&g, i, j0, rows, lse_i, d_i, qi, doi, acc, ks, vs);
    }
    chf_dq_end(&g, dq, bh, i, acc);
}

template <int HD>
__global__ void __launch_bounds__(CHF_THREADS)
    flash_dkv_kernel(chf_geom g0, float *dk, float *dv, const float *q, const float *k,
                     const float *v, const float *dout, const float *lse, const float *d)
{
    __shared__ float qs[CHF_TILE_FLOATS], dos[CHF_TILE_FLOATS], ls[CHF_THREADS], ds[CHF_THREADS];
    const chf_geom g = chcu_flash_geom<HD>(g0);
    const int tid = threadIdx.x;
    const int64_t blk = blockIdx.x, bh = blockIdx.y, j = blk * CHF_THREADS + tid;
    const int64_t rows = chf_tile_rows(g.hd);
    float kj[CHCU_ROW(HD)], vj[CHCU_ROW(HD)], gk[CHCU_ROW(HD)], gv[CHCU_ROW(HD)];
    chf_dkv_begin(&g, k, v, bh, j, kj, vj, gk, gv);
    for (int64_t i0 = chf_queries_begin(blk); i0 < g.t; i0 += rows) {
        __syncthreads();
        chf_load(&g, q, g.ld, bh, i0, rows, tid, qs);
        chf_load(&g, dout, g.ldo, bh, i0, rows, tid, dos);
        chf_load_scalars(&g, lse, bh, i0, rows, tid, ls);
        chf_load_scalars(&g, d, bh, i0, rows, tid, ds);
        __syncthreads();
        chf_dkv_tile(&g, j, i0, rows, kj, vj, gk, gv, qs, dos, ls, ds);
    }
    chf_dkv_end(&g, dk, dv, bh, j, gk, gv);
}

/* kernel<HD> for the head sizes that have their own, kernel<0> otherwise. */
#define CHCU_FLASH_LAUNCH(hd, kernel, cfg, ...)                                                    \
    do {                                                                                           \
        switch (hd) {                                                                              \
        case 16: kernel<16><<<CHCU_CFG cfg>>>(__VA_ARGS__); break;                                 \
        case 32: kernel<32><<<CHCU_CFG cfg>>>(__VA_ARGS__); break;                                 \
        case 64: kernel<64><<<CHCU_CFG cfg>>>(__VA_ARGS__); break;                                 \
        case 128: kernel<128><<<CHCU_CFG cfg>>>(__VA_ARGS__); break;                               \
        default: kernel<0><<<CHCU_CFG cfg>>>(__VA_ARGS__); break;                                  \
        }                                                                                          \
    } while (0)

/* The launch's grid, or CH_ERR_UNSUPPORTED for what the kernels do not
 * take (the core checked the rest); then the stream's device entered. */
static ch_status chcu_flash_plan(const char *slot, chcu_stream *s, int64_t b, int64_t heads,
                                 int64_t t, int64_t hd, ch_dtype half, dim3 *grid)
{
    if (half != CH_F32 && half != CH_BF16 && half != CH_F16)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda %s: products' format %d", slot, (int)half);
    if (hd > CHF_HD_MAX)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda %s: head size %lld, at most %d", slot,
                         (long long)hd, CHF_HD_MAX);
    int64_t blocks = (t + CHF_THREADS - 1) / CHF_THREADS, bh = b * heads;
    if (blocks > INT32_MAX || bh > 65535)
        return chi_error(CH_ERR_LIMIT,
                         "cuda %s: %lld matrices of %lld rows: at most 65535 matrices (b heads)",
                         slot, (long long)bh, (long long)t);
    *grid = dim3((unsigned)blocks, (unsigned)bh);
    return chcu_enter(s->dev);
}

ch_status chcu_attention(void *stream, int64_t b, int64_t heads, int64_t t, int64_t hd, float scale,
                         ch_dtype half, ch_bmem o, int64_t ldo, ch_bmem lse, ch_bmem q, ch_bmem k,
                         ch_bmem v, int64_t ld)
{
    chcu_stream *s = (chcu_stream *)stream;
    dim3 grid;
    ch_status st = chcu_flash_plan("attention", s, b, heads, t, hd, half, &grid);
    if (st)
        return st;
    chf_geom g = {t, heads, hd, ld, ldo, scale};
    CHCU_FLASH_LAUNCH(hd, flash_forward_kernel, (grid, CHF_THREADS, 0, s->s), g, chcu_at<float>(o),
                      chcu_at<float>(lse), chcu_at<float>(q), chcu_at<float>(k), chcu_at<float>(v));
    return chcu_launched("flash_forward_kernel");
}

ch_status chcu_attention_backward(void *stream, int64_t b, int64_t heads, int64_t t, int64_t hd,
                                  float scale, ch_dtype half, ch_bmem dq, ch_bmem dk, ch_bmem dv,
                                  ch_bmem q, ch_bmem k, ch_bmem v, int64_t ld, ch_bmem dout,
                                  ch_bmem o, int64_t ldo, ch_bmem lse)
{
    chcu_stream *s = (chcu_stream *)stream;
    dim3 grid;
    ch_status st = chcu_flash_plan("attention_backward", s, b, heads, t, hd, half, &grid);
    if (st)
        return st;
    int64_t rows = b * heads * t;
    void *work;
    st = chcu_scratch_acquire(s, (size_t)rows * sizeof(float), &work);
    if (st)
        return st;
    float *d = (float *)work;
    chf_geom g = {t, heads, hd, ld, ldo, scale};
    flash_d_kernel<<<chcu_grid(s->dev, rows), CHCU_THREADS, 0, s->s>>>(g, d, chcu_at<float>(dout),
                                                                       chcu_at<float>(o), rows);
    st = chcu_launched("flash_d_kernel");
    if (!st) {
        CHCU_FLASH_LAUNCH(hd, flash_dq_kernel, (grid, CHF_THREADS, 0, s->s), g, chcu_at<float>(dq),
                          chcu_at<float>(q), chcu_at<float>(k), chcu_at<float>(v),
                          chcu_at<float>(dout), chcu_at<float>(lse), d);
        st = chcu_launched("flash_dq_kernel");
    }
    if (!st) {
        CHCU_FLASH_LAUNCH(hd, flash_dkv_kernel, (grid, CHF_THREADS, 0, s->s), g, chcu_at<float>(dk),
                          chcu_at<float>(dv), chcu_at<float>(q), chcu_at<float>(k),
                          chcu_at<float>(v), chcu_at<float>(dout), chcu_at<float>(lse), d);
        st = chcu_launched("flash_dkv_kernel");
    }
    chcu_scratch_release(s);
    return st;
}
