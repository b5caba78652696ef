/* The host's batched GEMM (one GEMM per matrix: small ones shared out
 * among the threads, larger ones one after the other, each on every
 * thread) and permute (a copy of rows in the order of the output). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>

#include "host.h"
#include "kernels/index.h"

/* ---- batched GEMM ------------------------------------------------------------ */

/* Matrices of fewer multiply-adds than this are shared out among the
 * threads, each multiplied on one thread; larger ones go one after the
 * other, each using every thread. OpenBLAS multiplies products below
 * about this size on a single thread anyway, so in turn they would keep
 * one core busy; attention's (T x T x head size, 64 x 64 x 32 in a small
 * GPT) are far below. */
#define BATCH_PAR_MAX_FLOPS (128 * 128 * 64)

typedef struct batch_gemm {
    int trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    ch_bmem a, b, c;
    int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
} batch_gemm;

/* Matrix i: each on one thread inside the shared-out loop (`serial`), with
 * every thread one after the other. */
static ch_status batch_gemm_one(const batch_gemm *g, int64_t i, int serial)
{
    ch_bmem a = {g->a.ptr, g->a.off + (size_t)(i * g->stride_a) * sizeof(float)};
    ch_bmem b = {g->b.ptr, g->b.off + (size_t)(i * g->stride_b) * sizeof(float)};
    ch_bmem c = {g->c.ptr, g->c.off + (size_t)(i * g->stride_c) * sizeof(float)};
    if (serial)
        return chi_host_gemm_serial(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha,
                                    chi_host_f32(a), g->lda, chi_host_f32(b), g->ldb, g->beta,
                                    chi_host_f32(c), g->ldc);
    return chi_host_gemm(NULL, g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, a, g->lda, b,
                         g->ldb, g->beta, c, g->ldc);
}

/* The matrices shared out. A failure's message is the failing thread's:
 * it is kept for the caller's. */
static ch_status batch_gemm_shared(const batch_gemm *g, int64_t count)
{
    ch_status st = CH_OK;
    char why[512] = "";
    CHI_OMP(omp parallel for schedule(static))
    for (int64_t i = 0; i < count; i++) {
        ch_status sti = batch_gemm_one(g, i, 1);
        if (sti != CH_OK) {
            CHI_OMP(omp critical)
            {
                st = sti;
                snprintf(why, sizeof why, "%s", ch_last_error());
            }
        }
    }
    return st == CH_OK ? CH_OK : chi_error(st, "%s", why);
}

ch_status chi_host_gemm_batched(void *stream, int trans_a, int trans_b, int64_t count, int64_t m,
                                int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                                int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b,
                                float beta, ch_bmem c, int64_t ldc, int64_t stride_c)
{
    (void)stream;
    /* clang-format off */
    batch_gemm g = {trans_a, trans_b, m, n, k, alpha, beta, a, b, c,
                    lda, ldb, ldc, stride_a, stride_b, stride_c};
    /* clang-format on */
    if (count > 1 && (double)m * n * k < BATCH_PAR_MAX_FLOPS)
        return batch_gemm_shared(&g, count);
    /* A plain loop, not a parallel region with an if clause: OpenBLAS
     * called inside an inactive region runs many times slower. */
    for (int64_t i = 0; i < count; i++)
        TRY(batch_gemm_one(&g, i, 0));
    return CH_OK;
}

/* ---- permute ------------------------------------------------------------------- */

/* y walked in order, as rows of its last dimension: row r's first element
 * comes from x at the offset its index names, and the row from x's
 * elements `step` apart (1 when the last dimension stays last, as in the
 * attention's permutes: one memcpy per row). */
ch_status chi_host_permute(void *stream, int ndim, const int64_t *xshape, const int *perm,
                           ch_bmem y, ch_bmem x)
{
    (void)stream;
    int64_t shape[CH_MAX_DIMS], stride[CH_MAX_DIMS];
    int64_t numel = chk_permute_plan(ndim, xshape, perm, shape, stride);
    int64_t len = shape[ndim - 1], step = stride[ndim - 1], rows = numel / len;
    uint32_t *py = (uint32_t *)chi_host_f32(y);
    const uint32_t *px = (const uint32_t *)chi_host_f32(x);
    /* Each thread takes a run of rows: the first row's offset in x is
     * index.h's chk_permute_src, the next ones are counted (an odometer
     * over the outer dimensions); the rows are short (a head's 32 or 64
     * floats), so they are copied inline rather than by a memcpy call
     * each. */
    CHI_OMP(omp parallel if (numel > CHI_HOST_PAR_MIN))
    {
        int nt = chi_omp_threads(), t = chi_omp_thread();
        int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
        int64_t idx[CH_MAX_DIMS] = {0}, off = chk_permute_src_64(r0 * len, ndim, shape, stride);
        for (int64_t d = ndim - 2, rest = r0; d >= 0; d--) {
            idx[d] = rest % shape[d];
            rest /= shape[d];
        }
        for (int64_t r = r0; r < r1; r++) {
            uint32_t *restrict dst = py + r * len;
            const uint32_t *restrict src = px + off;
            if (step == 1) {
                CHI_OMP(omp simd)
                for (int64_t j = 0; j < len; j++)
                    dst[j] = src[j];
            } else {
                for (int64_t j = 0; j < len; j++)
                    dst[j] = src[j * step];
            }
            for (int d = ndim - 2; d >= 0; d--) {
                off += stride[d];
                if (++idx[d] < shape[d])
                    break;
                off -= idx[d] * stride[d];
                idx[d] = 0;
            }
        }
    }
    return CH_OK;
}
