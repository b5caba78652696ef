/* GEMM, single and strided-batched: CLBlast's SGEMM (SGEMMSTRIDEDBATCHED)
 * when the module is built with it, our tiled kernels (gemm.cl) otherwise
 * and for the shapes CLBlast refuses. The environment
 * variable CHORUS_OPENCL_GEMM=own|clblast forces one of them (read at init). */
#include "config.h"

#include <pthread.h>

#include <string.h>

#include "opencl.h"

#ifdef HAVE_CLBLAST
#include <clblast_c.h>
#endif

ch_status chcl_gemm_mode_parse(const char *value, chcl_gemm_mode *mode)
{
    if (!value || !*value) {
        *mode = CHCL_GEMM_AUTO;
    } else if (strcmp(value, "own") == 0) {
        *mode = CHCL_GEMM_OWN;
    } else if (strcmp(value, "clblast") == 0) {
#ifdef HAVE_CLBLAST
        *mode = CHCL_GEMM_CLBLAST;
#else
        return chi_error(CH_ERR_UNAVAILABLE,
                         "CHORUS_OPENCL_GEMM=clblast, but the OpenCL backend was built "
                         "without CLBlast (configure --with-clblast)");
#endif
    } else {
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "CHORUS_OPENCL_GEMM=%s: expected \"own\" or \"clblast\"", value);
    }
    return CH_OK;
}

/* The elements a kernel indexes in a matrix of `rows` rows of stride ld
 * (ld >= its columns). */
static ch_status check_matrix(const char *name, int64_t rows, int64_t ld)
{
    return chcl_check_count(name, rows * ld);
}

/* `count` products, the i-th of A at a + i * stride_a elements (B and C
 * likewise): the third dimension of the launch. */
static ch_status gemm_own(chcl_stream *s, int trans_a, int trans_b, int64_t count, int64_t m,
                          int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                          int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b,
                          float beta, ch_bmem c, int64_t ldc, int64_t stride_c)
{
    ch_status st = check_matrix("gemm A", trans_a ? k : m, lda);
    if (st == CH_OK)
        st = check_matrix("gemm B", trans_b ? n : k, ldb);
    if (st == CH_OK)
        st = check_matrix("gemm C", m, ldc);
    if (st != CH_OK)
        return st;
    chcl_ref C = chcl_ref_of(c), A = chcl_ref_of(a), B = chcl_ref_of(b);
    cl_int ic = (cl_int)ldc, ia = (cl_int)lda, ib = (cl_int)ldb, im = (cl_int)m,
           in = (cl_int)n, ik = (cl_int)k, ta = trans_a != 0, tb = trans_b != 0;
    cl_ulong sa = (cl_ulong)stride_a, sb = (cl_ulong)stride_b, sc = (cl_ulong)stride_c;
    chcl_arg args[] = {CHCL_REF(C),     CHCL_ARG(ic),    CHCL_REF(A),     CHCL_ARG(ia),
                       CHCL_REF(B),     CHCL_ARG(ib),    CHCL_ARG(im),    CHCL_ARG(in),
                       CHCL_ARG(ik),    CHCL_ARG(ta),    CHCL_ARG(tb),    CHCL_ARG(alpha),
                       CHCL_ARG(beta),  CHCL_ARG(sa),    CHCL_ARG(sb),    CHCL_ARG(sc)};
    /* The tiled kernel with the smallest tile that covers C (fewer idle
     * work-items on small products, attention's above all), else the
     * largest; of those the device runs, by their work-groups and local
     * memory. None: one work-item per element. */
    static const struct {
        chcl_kern_id k;
        size_t wg;
    } tiled[] = {{CHCL_K_GEMM, 16}, {CHCL_K_GEMM_WG8, 8}, {CHCL_K_GEMM_WG4, 4}};
    int pick = -1;
    for (int v = 0; v < CHCL_COUNT_OF(tiled); v++) {
        size_t wg = tiled[v].wg, tile = wg * CHCL_GEMM_WPT;
        size_t local[3] = {wg, wg, 1};
        int fits = 0;
        st = chcl_group_fits(s, tiled[v].k, local, &fits);
        if (st != CH_OK)
            return st;
        if (fits && (pick < 0 || ((size_t)m <= tile && (size_t)n <= tile)))
            pick = v;
    }
    if (pick >= 0) {
        size_t wg = tiled[pick].wg, tile = wg * CHCL_GEMM_WPT;
        size_t local[3] = {wg, wg, 1};
        size_t global[3] = {((size_t)n + tile - 1) / tile * wg,
                            ((size_t)m + tile - 1) / tile * wg, (size_t)count};
        return chcl_launch(s, tiled[pick].k, CHCL_COUNT_OF(args), args, 3, global, local);
    }
    /* Work-groups of g work-items along a row of C (a power of two, at
     * most 64 and what the kernel allows). */
    size_t g;
    st = chcl_group_size(s, CHCL_K_GEMM_SIMPLE, 64, 0, &g);
    if (st != CH_OK)
        return st;
    size_t local[3] = {g, 1, 1};
    size_t global[3] = {(size_t)n, (size_t)m, (size_t)count};
    return chcl_launch(s, CHCL_K_GEMM_SIMPLE, CHCL_COUNT_OF(args), args, 3, global, local);
}

#ifdef HAVE_CLBLAST
static const char *clblast_name(CLBlastStatusCode code)
{
    switch (code) {
    case CLBlastNotImplemented: return "CLBlastNotImplemented";
    case CLBlastInvalidDimension: return "CLBlastInvalidDimension";
    case CLBlastInvalidLeadDimA: return "CLBlastInvalidLeadDimA";
    case CLBlastInvalidLeadDimB: return "CLBlastInvalidLeadDimB";
    case CLBlastInvalidLeadDimC: return "CLBlastInvalidLeadDimC";
    case CLBlastInsufficientMemoryA: return "CLBlastInsufficientMemoryA";
    case CLBlastInsufficientMemoryB: return "CLBlastInsufficientMemoryB";
    case CLBlastInsufficientMemoryC: return "CLBlastInsufficientMemoryC";
    case CLBlastInvalidLocalMemUsage: return "CLBlastInvalidLocalMemUsage";
    case CLBlastDatabaseError: return "CLBlastDatabaseError";
    case CLBlastUnknownError: return "CLBlastUnknownError";
    case CLBlastUnexpectedError: return "CLBlastUnexpectedError";
    default: return chcl_err_name((cl_int)code);
    }
}

/* CLBlast builds its tuning database on the first call per device without
 * a lock: two threads driving two devices crash in it (seen with two PoCL
 * devices under data parallelism). The calls only queue work, so one lock
 * around them costs little. */
static pthread_mutex_t clblast_lock = PTHREAD_MUTEX_INITIALIZER;

static CLBlastStatusCode gemm_clblast(chcl_stream *s, int trans_a, int trans_b, int64_t count,
                                      int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a,
                                      int64_t lda, int64_t stride_a, ch_bmem b, int64_t ldb,
                                      int64_t stride_b, float beta, ch_bmem c, int64_t ldc,
                                      int64_t stride_c)
{
    CLBlastTranspose ta = trans_a ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastTranspose tb = trans_b ? CLBlastTransposeYes : CLBlastTransposeNo;
    CLBlastStatusCode code;
    pthread_mutex_lock(&clblast_lock);
    if (count == 1)
        code = CLBlastSgemm(CLBlastLayoutRowMajor, ta, tb, (size_t)m, (size_t)n, (size_t)k,
                            alpha, chcl_buf(a), a.off / 4, (size_t)lda, chcl_buf(b), b.off / 4,
                            (size_t)ldb, beta, chcl_buf(c), c.off / 4, (size_t)ldc, &s->queue,
                            NULL);
    else
        code = CLBlastSgemmStridedBatched(
            CLBlastLayoutRowMajor, ta, tb, (size_t)m, (size_t)n, (size_t)k, alpha, chcl_buf(a),
            a.off / 4, (size_t)lda, (size_t)stride_a, chcl_buf(b), b.off / 4, (size_t)ldb,
            (size_t)stride_b, beta, chcl_buf(c), c.off / 4, (size_t)ldc, (size_t)stride_c,
            (size_t)count, &s->queue, NULL);
    pthread_mutex_unlock(&clblast_lock);
    return code;
}
#endif

/* The products by CLBlast or by our kernel, as the mode says. */
static ch_status gemm_any(chcl_stream *s, int trans_a, int trans_b, int64_t count, int64_t m,
                          int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                          int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b,
                          float beta, ch_bmem c, int64_t ldc, int64_t stride_c)
{
#ifdef HAVE_CLBLAST
    /* Under test caps (CHORUS_OPENCL_MAX_WORK_GROUP, _LOCAL_MEM) auto
     * takes our kernels: CLBlast reads the device's own limits, which the
     * caps pretend are lower. */
    const chcl_backend *be = s->dev->be;
    chcl_gemm_mode mode = be->gemm_mode;
    int capped = be->caps.max_wg != 0 || be->caps.local_mem != 0;
    if (mode == CHCL_GEMM_CLBLAST || (mode == CHCL_GEMM_AUTO && !capped)) {
        CLBlastStatusCode code = gemm_clblast(s, trans_a, trans_b, count, m, n, k, alpha, a,
                                              lda, stride_a, b, ldb, stride_b, beta, c, ldc,
                                              stride_c);
        if (code == CLBlastSuccess)
            return CH_OK;
        if (mode == CHCL_GEMM_CLBLAST)
            return chi_error(code == CLBlastTempBufferAllocFailure
                                 ? CH_ERR_DEVICE_OUT_OF_MEMORY
                                 : CH_ERR_DRIVER,
                             "%s(%lld x %lld x %lld, %lld matrices): %s (%d)",
                             count == 1 ? "CLBlastSgemm" : "CLBlastSgemmStridedBatched",
                             (long long)m, (long long)n, (long long)k, (long long)count,
                             clblast_name(code), (int)code);
    }
#endif
    return gemm_own(s, trans_a, trans_b, count, m, n, k, alpha, a, lda, stride_a, b, ldb,
                    stride_b, beta, c, ldc, stride_c);
}

ch_status chcl_gemm(void *stream, int trans_a, int trans_b, int64_t m, int64_t n,
                    int64_t k, float alpha, ch_bmem a, int64_t lda, ch_bmem b,
                    int64_t ldb, float beta, ch_bmem c, int64_t ldc)
{
    return gemm_any(stream, trans_a, trans_b, 1, m, n, k, alpha, a, lda, 0, b, ldb, 0, beta, c,
                    ldc, 0);
}

ch_status chcl_gemm_batched(void *stream, int trans_a, int trans_b, int64_t count, int64_t m,
                            int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                            int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b,
                            float beta, ch_bmem c, int64_t ldc, int64_t stride_c)
{
    return gemm_any(stream, trans_a, trans_b, count, m, n, k, alpha, a, lda, stride_a, b, ldb,
                    stride_b, beta, c, ldc, stride_c);
}
