/* GEMM through cuBLAS.
 *
 * cuBLAS is column-major. A row-major matrix with row stride ld is, read
 * column-major, its transpose with the same ld. So row-major
 * C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first, A
 * second, each keeping its own transpose flag and stride, and the shape is
 * N x M (times K). */
#include <limits.h>
#include "common.cuh"

static int chcu_fits_int(int64_t v)
{
    return v <= INT_MAX;
}

/* The stream's handle, made on first use; called with blas_lock held and
 * the stream's device current (cublasCreate binds the handle to it). */
static ch_status chcu_stream_blas(chcu_stream *s)
{
    if (s->blas)
        return CH_OK;
    cublasHandle_t h;
    ch_status st = chcu_blas_check(cublasCreate(&h), "cublasCreate");
    if (st)
        return st;
    st = chcu_blas_check(cublasSetStream(h, s->s), "cublasSetStream");
    if (st) {
        (void)cublasDestroy(h);
        return st;
    }
    s->blas = h;
    s->blas_tf32 = -1; /* no mode set yet: chcu_blas_math sets it */
    return CH_OK;
}

/* The handle's math mode as ch_math_set asks now, set when it changed
 * (blas_lock held). Sums in f32 even where C is bf16 or f16: by default
 * cuBLAS may add a split-K GEMM's partial sums in C's format. f32's stay
 * plain FP32 unless CH_MATH_TF32: then cublasSgemm may round A and B to
 * TF32 on tensor cores (the half GEMMs are not affected). */
static ch_status chcu_blas_math(chcu_stream *s)
{
    int tf32 = (chi_math_flags() & CH_MATH_TF32) != 0;
    if (tf32 == s->blas_tf32)
        return CH_OK;
    unsigned mode = (tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                    CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    ch_status st =
        chcu_blas_check(cublasSetMathMode(s->blas, (cublasMath_t)mode), "cublasSetMathMode");
    if (!st)
        s->blas_tf32 = tf32;
    return st;
}

/* ---- ch_device_counters: GEMM calls, and their time where asked ---- */

/* With time_gemms, an event recorded on s now, kept for the next read:
 * before a GEMM (end 0) and after it (end 1). A failure to make or record
 * one stops the timing (gemm_seconds then reads < 0), never the GEMM. */
static void gemm_mark(chcu_stream *s, int end)
{
    chcu_device *d = s->dev;
    if (end)
        __atomic_fetch_add(&d->gemms, 1ull, __ATOMIC_RELAXED);
    /* Untimed, a GEMM takes no lock here. */
    if (!__atomic_load_n(&d->time_gemms, __ATOMIC_RELAXED))
        return;
    pthread_mutex_lock(&d->lock);
    if (__atomic_load_n(&d->time_gemms, __ATOMIC_RELAXED) &&
        d->ngemm_events == d->gemm_events_cap) {
        int cap = d->gemm_events_cap ? 2 * d->gemm_events_cap : 256;
        cudaEvent_t *grown = (cudaEvent_t *)realloc(d->gemm_events, (size_t)cap * sizeof *grown);
        if (grown) {
            d->gemm_events = grown;
            d->gemm_events_cap = cap;
        } else {
            __atomic_store_n(&d->time_gemms, 0, __ATOMIC_RELAXED);
        }
    }
    /* Pairs only: an end with no start is not kept. */
    if (__atomic_load_n(&d->time_gemms, __ATOMIC_RELAXED) &&
        (d->ngemm_events % 2 == 1) == (end == 1)) {
        cudaEvent_t e;
        if (cudaEventCreate(&e) == cudaSuccess) {
            if (cudaEventRecord(e, s->s) == cudaSuccess)
                d->gemm_events[d->ngemm_events++] = e;
            else
                (void)cudaEventDestroy(e);
        }
        if (d->ngemm_events % 2 == 1 && end) /* the end failed: drop its start */
            (void)cudaEventDestroy(d->gemm_events[--d->ngemm_events]);
        (void)cudaGetLastError();
    }
    pthread_mutex_unlock(&d->lock);
}

/* The events' times into gemm_seconds, the events destroyed (lock held). */
static ch_status gemm_events_sum(chcu_device *d)
{
    ch_status st = CH_OK;
    int n = d->ngemm_events - d->ngemm_events % 2;
    for (int i = 0; i < n; i += 2) {
        float ms = 0.0f;
        if (!st)
            st = chcu_check(cudaEventSynchronize(d->gemm_events[i + 1]), "cudaEventSynchronize");
        if (!st)
            st = chcu_check(cudaEventElapsedTime(&ms, d->gemm_events[i], d->gemm_events[i + 1]),
                            "cudaEventElapsedTime");
        if (!st)
            d->gemm_seconds += ms / 1000.0;
    }
    for (int i = 0; i < d->ngemm_events; i++)
        (void)cudaEventDestroy(d->gemm_events[i]);
    d->ngemm_events = 0;
    return st;
}

void chcu_counters_release(chcu_device *d)
{
    if (chcu_enter(d) == CH_OK) {
        for (int i = 0; i < d->ngemm_events; i++)
            (void)cudaEventDestroy(d->gemm_events[i]);
    }
    free(d->gemm_events);
    d->gemm_events = NULL;
    d->ngemm_events = d->gemm_events_cap = 0;
}

ch_status chcu_counters(void *dev, int start, int time_gemms, uint64_t *launches, uint64_t *gemms,
                        double *gemm_seconds)
{
    chcu_device *d = (chcu_device *)dev;
    ch_status st = chcu_enter(d);
    if (st)
        return st;
    pthread_mutex_lock(&d->lock);
    if (start) {
        for (int i = 0; i < d->ngemm_events; i++)
            (void)cudaEventDestroy(d->gemm_events[i]);
        d->ngemm_events = 0;
        __atomic_store_n(&d->gemms, 0ull, __ATOMIC_RELAXED);
        d->gemm_seconds = 0.0;
        __atomic_store_n(&d->time_gemms, time_gemms, __ATOMIC_RELAXED);
        __atomic_store_n(&chcu_launch_counts[d->index], 0ull, __ATOMIC_RELAXED);
    } else {
        if (__atomic_load_n(&d->time_gemms, __ATOMIC_RELAXED))
            st = gemm_events_sum(d);
        *launches = __atomic_load_n(&chcu_launch_counts[d->index], __ATOMIC_RELAXED);
        *gemms = __atomic_load_n(&d->gemms, __ATOMIC_RELAXED);
        *gemm_seconds = __atomic_load_n(&d->time_gemms, __ATOMIC_RELAXED) ? d->gemm_seconds : -1.0;
    }
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* The stream's device made current, its BLAS lock taken and its handle
 * made, a GEMM's start marked; on failure the lock is not held. */
static ch_status chcu_blas_begin(chcu_stream *s)
{
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    pthread_mutex_lock(&s->blas_lock);
    st = chcu_stream_blas(s);
    if (!st)
        st = chcu_blas_math(s);
    if (st)
        pthread_mutex_unlock(&s->blas_lock);
    else
        gemm_mark(s, 0);
    return st;
}

/* After the cuBLAS call: counted, its end marked, the lock let go. */
static void chcu_blas_end(chcu_stream *s)
{
    chcu_count_launch(s->dev->index);
    gemm_mark(s, 1);
    pthread_mutex_unlock(&s->blas_lock);
}

ch_status chcu_gemm(void *stream, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                    float alpha, ch_bmem a, int64_t lda, ch_bmem b, int64_t ldb, float beta,
                    ch_bmem c, int64_t ldc)
{
    if (!chcu_fits_int(m) || !chcu_fits_int(n) || !chcu_fits_int(k) || !chcu_fits_int(lda) ||
        !chcu_fits_int(ldb) || !chcu_fits_int(ldc))
        return chi_error(CH_ERR_LIMIT,
                         "cublasSgemm: a size or stride beyond INT_MAX (m %lld, n %lld, k %lld)",
                         (long long)m, (long long)n, (long long)k);
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_blas_begin(s);
    if (st)
        return st;
    st = chcu_blas_check(cublasSgemm(s->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                     &alpha, chcu_at<float>(b), (int)ldb, chcu_at<float>(a),
                                     (int)lda, &beta, chcu_at<float>(c), (int)ldc),
                         "cublasSgemm");
    chcu_blas_end(s);
    return st;
}

/* The same trick for every matrix of the batch: cuBLAS's strides between
 * matrices are ours, B's going first. */
ch_status chcu_gemm_batched(void *stream, int trans_a, int trans_b, int64_t count, int64_t m,
                            int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                            int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b,
                            float beta, ch_bmem c, int64_t ldc, int64_t stride_c)
{
    if (!chcu_fits_int(count) || !chcu_fits_int(m) || !chcu_fits_int(n) || !chcu_fits_int(k) ||
        !chcu_fits_int(lda) || !chcu_fits_int(ldb) || !chcu_fits_int(ldc))
        return chi_error(CH_ERR_LIMIT,
                         "cublasSgemmStridedBatched: a size or stride beyond INT_MAX (%lld "
                         "matrices, m %lld, n %lld, k %lld)",
                         (long long)count, (long long)m, (long long)n, (long long)k);
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_blas_begin(s);
    if (st)
        return st;
    st = chcu_blas_check(
        cublasSgemmStridedBatched(s->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                  &alpha, chcu_at<float>(b), (int)ldb, (long long)stride_b,
                                  chcu_at<float>(a), (int)lda, (long long)stride_a, &beta,
                                  chcu_at<float>(c), (int)ldc, (long long)stride_c, (int)count),
        "cublasSgemmStridedBatched");
    chcu_blas_end(s);
    return st;
}

/* Half inputs, f32 sums (CUBLAS_COMPUTE_32F: tensor cores), C in f32 or
 * the inputs' format, through cublasGemmEx / cublasGemmStridedBatchedEx
 * with the same row-major trick. */
ch_status chcu_gemm_half(void *stream, int ab, int cd, int trans_a, int trans_b, int64_t count,
                         int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                         int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b, float beta,
                         ch_bmem c, int64_t ldc, int64_t stride_c, ch_bmem bias)
{
    if ((ab != CH_BF16 && ab != CH_F16) || (cd != CH_F32 && cd != ab))
        return chi_error(CH_ERR_UNSUPPORTED, "cuda gemm_half: inputs %d, output %d", ab, cd);
    if (bias.ptr) /* the core adds it with bias_add */
        return chi_error(CH_ERR_UNSUPPORTED, "cuda gemm_half: no fused bias");
    if (!chcu_fits_int(count) || !chcu_fits_int(m) || !chcu_fits_int(n) || !chcu_fits_int(k) ||
        !chcu_fits_int(lda) || !chcu_fits_int(ldb) || !chcu_fits_int(ldc))
        return chi_error(CH_ERR_LIMIT,
                         "cublasGemmEx: a size or stride beyond INT_MAX (%lld matrices, m %lld, "
                         "n %lld, k %lld)",
                         (long long)count, (long long)m, (long long)n, (long long)k);
    cudaDataType_t in = ab == CH_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cudaDataType_t out = cd == CH_F32 ? CUDA_R_32F : in;
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_blas_begin(s);
    if (st)
        return st;
    cublasOperation_t opa = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                      opb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasStatus_t bst =
        count == 1
            ? cublasGemmEx(s->blas, opb, opa, (int)n, (int)m, (int)k, &alpha, chcu_at<void>(b), in,
                           (int)ldb, chcu_at<void>(a), in, (int)lda, &beta, chcu_at<void>(c),
                           out, (int)ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
            : cublasGemmStridedBatchedEx(s->blas, opb, opa, (int)n, (int)m, (int)k, &alpha,
                                         chcu_at<void>(b), in, (int)ldb, (long long)stride_b,
                                         chcu_at<void>(a), in, (int)lda, (long long)stride_a,
                                         &beta, chcu_at<void>(c), out, (int)ldc,
                                         (long long)stride_c, (int)count, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT);
    chcu_blas_end(s);
    const char *call = count == 1 ? "cublasGemmEx" : "cublasGemmStridedBatchedEx";
    /* A GPU or a cuBLAS without these types: CH_ERR_UNSUPPORTED, and the
     * core widens the inputs to f32 instead. */
    if (bst == CUBLAS_STATUS_NOT_SUPPORTED || bst == CUBLAS_STATUS_ARCH_MISMATCH)
        return chi_error(CH_ERR_UNSUPPORTED, "%s with %s inputs: %s", call,
                         ab == CH_BF16 ? "bf16" : "f16", cublasGetStatusName(bst));
    return chcu_blas_check(bst, call);
}
