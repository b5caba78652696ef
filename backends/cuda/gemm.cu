/* GEMM through cuBLAS.
 *
 * cuBLAS is column-major. A row-major matrix with row stride ld is, read
 * column-major, its transpose with the same ld. So row-major
 * C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: B goes first, A
 * second, each keeping its own transpose flag and stride, and the shape is
 * N x M (times K). */
#include <limits.h>
#include <string.h>
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

/* ---- cuBLASLt: a product and its epilogue in one kernel ----
 *
 * The same row-major trick: cuBLASLt's D (n x m, column-major, stride ldc)
 * is op(B)^T op(A)^T, our B its first operand. So our column index is
 * D's row index, which is what the epilogues' bias vector follows (its
 * length is D's row count), and the GELU input they keep (aux, our pre)
 * is laid out like D. */

/* Bytes of the workspace each stream gives cuBLASLt: what its split-K
 * and stream-K algorithms ask for on the largest GPUs we target. */
#define CHCU_LT_WORKSPACE ((size_t)32 << 20)

/* The largest power of two that divides the address, at most 256 (what
 * cuBLASLt's heuristic assumes unless told less). */
static unsigned chcu_align_of(ch_bmem m)
{
    uintptr_t u = (uintptr_t)chcu_at<char>(m);
    unsigned a = 1;
    while (a < 256 && !(u & a))
        a <<= 1;
    return a;
}

void chcu_lt_free(chcu_stream *s)
{
    if (s->lt)
        (void)chcu_blas_check(cublasLtDestroy(s->lt), "cublasLtDestroy");
    s->lt = NULL;
    if (s->lt_ws) {
        (void)chcu_check(cudaFree(s->lt_ws), "cudaFree(cuBLASLt workspace)");
        chi_workspace_release(s->dev, s->lt_ws_bytes);
    }
    s->lt_ws = NULL;
    s->lt_ws_bytes = 0;
    s->lt_nplans = s->lt_next = 0;
}

/* The stream's cuBLASLt handle and workspace, made on first use (blas_lock
 * held, the device current). A device without room for the workspace
 * (CH_ERR_DEVICE_OUT_OF_MEMORY, or its memory limit) gets none, for good:
 * cuBLASLt then picks among the algorithms that need none. */
static ch_status chcu_lt_ready(chcu_stream *s)
{
    if (s->lt)
        return CH_OK;
    cublasLtHandle_t h;
    ch_status st = chcu_blas_check(cublasLtCreate(&h), "cublasLtCreate");
    if (st)
        return st;
    void *ws = NULL;
    st = chi_workspace_reserve(s->dev, CHCU_LT_WORKSPACE, "cuda cuBLASLt workspace");
    if (!st) {
        st = chcu_check(cudaMalloc(&ws, CHCU_LT_WORKSPACE), "cudaMalloc(cuBLASLt workspace)");
        if (st) {
            ws = NULL;
            chi_workspace_release(s->dev, CHCU_LT_WORKSPACE);
        }
    }
    if (st == CH_ERR_DEVICE_OUT_OF_MEMORY)
        st = CH_OK;
    if (st) {
        (void)cublasLtDestroy(h);
        return st;
    }
    s->lt = h;
    s->lt_ws = ws;
    s->lt_ws_bytes = ws ? CHCU_LT_WORKSPACE : 0;
    s->lt_nplans = s->lt_next = 0;
    return CH_OK;
}

/* Sets one attribute of a descriptor, the call and the attribute named in
 * the message of a failure. */
#define CHCU_LT_SET(st, fn, obj, attr, value)                                                      \
    do {                                                                                           \
        if (!(st))                                                                                 \
            (st) = chcu_blas_check(fn((obj), (attr), &(value), sizeof(value)), #fn "(" #attr ")"); \
    } while (0)

/* The plan for `key`, from the stream's list or from the heuristic (then
 * kept, found or not); blas_lock held. */
static ch_status chcu_lt_plan_for(chcu_stream *s, const chcu_lt_key *key, cublasLtMatmulDesc_t desc,
                                  cublasLtMatrixLayout_t la, cublasLtMatrixLayout_t lb,
                                  cublasLtMatrixLayout_t lc, chcu_lt_plan **out)
{
    for (int i = 0; i < s->lt_nplans; i++)
        if (memcmp(&s->lt_plans[i].key, key, sizeof *key) == 0) {
            *out = &s->lt_plans[i];
            return CH_OK;
        }
    cublasLtMatmulPreferenceOpaque_t pref_mem;
    cublasLtMatmulPreference_t pref = &pref_mem;
    ch_status st =
        chcu_blas_check(cublasLtMatmulPreferenceInit(pref), "cublasLtMatmulPreferenceInit");
    uint64_t ws = s->lt_ws_bytes;
    /* Split-K sums in f32 only (no partial sums added in a half D's
     * format, as chcu_blas_math asks of cuBLAS); an f32 D's own are f32. */
    uint32_t schemes = key->cd == CH_F32 ? (uint32_t)CUBLASLT_REDUCTION_SCHEME_MASK
                                         : (uint32_t)CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    uint32_t align_a = key->align_b, align_b = key->align_a, align_c = key->align_c;
    CHCU_LT_SET(st, cublasLtMatmulPreferenceSetAttribute, pref,
                CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, ws);
    CHCU_LT_SET(st, cublasLtMatmulPreferenceSetAttribute, pref,
                CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, schemes);
    /* cuBLASLt's A is our b, its B our a; C is D. */
    CHCU_LT_SET(st, cublasLtMatmulPreferenceSetAttribute, pref,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
    CHCU_LT_SET(st, cublasLtMatmulPreferenceSetAttribute, pref,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
    CHCU_LT_SET(st, cublasLtMatmulPreferenceSetAttribute, pref,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_c);
    CHCU_LT_SET(st, cublasLtMatmulPreferenceSetAttribute, pref,
                CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_c);
    if (st)
        return st;
    cublasLtMatmulHeuristicResult_t res;
    memset(&res, 0, sizeof res);
    int found = 0;
    cublasStatus_t bst =
        cublasLtMatmulAlgoGetHeuristic(s->lt, desc, la, lb, lc, lc, pref, 1, &res, &found);
    /* No algorithm for this problem: NOT_SUPPORTED, or (a GPU or a
     * cuBLASLt without this combination of types and epilogue)
     * ARCH_MISMATCH and INVALID_VALUE. The core composes the op then;
     * tests/test-cuda.c counts the launches of the products that must
     * fuse, so a fallback there does not pass unseen. */
    int none = bst == CUBLAS_STATUS_NOT_SUPPORTED || bst == CUBLAS_STATUS_ARCH_MISMATCH ||
               bst == CUBLAS_STATUS_INVALID_VALUE;
    if (!none) {
        st = chcu_blas_check(bst, "cublasLtMatmulAlgoGetHeuristic");
        if (st)
            return st;
    }
    chcu_lt_plan *p;
    if (s->lt_nplans < CHCU_LT_PLANS) {
        p = &s->lt_plans[s->lt_nplans++];
    } else {
        p = &s->lt_plans[s->lt_next];
        s->lt_next = (s->lt_next + 1) % CHCU_LT_PLANS;
    }
    memset(p, 0, sizeof *p);
    memcpy(&p->key, key, sizeof *key); /* padding too: keys compare whole */
    p->found = bst == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    p->why = bst;
    if (p->found)
        p->algo = res.algo;
    *out = p;
    return CH_OK;
}

/* D = epilogue(alpha op(a) op(b) + bias), a and b in `ab` (CH_BF16 or
 * CH_F16), D = c in `cd` (CH_F32 or ab), bias f32 [n]; with aux.ptr, the
 * GELU epilogues' input into aux (cd, row stride ldc). CH_ERR_UNSUPPORTED
 * (the core composes the op) where cuBLASLt has no algorithm for it. */
static ch_status chcu_lt_gemm(chcu_stream *s, int ab, int cd, cublasLtEpilogue_t epilogue,
                              int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                              float alpha, ch_bmem a, int64_t lda, ch_bmem b, int64_t ldb,
                              ch_bmem c, int64_t ldc, ch_bmem bias, ch_bmem aux)
{
    const char *half = ab == CH_BF16 ? "bf16" : "f16";
    /* The GELU input's stride, in elements: a multiple of 8 (cuBLASLt). */
    if (aux.ptr && ldc % 8 != 0)
        return chi_error(CH_ERR_UNSUPPORTED,
                         "cuda gemm_bias_act: cuBLASLt keeps the GELU input only with rows of "
                         "a multiple of 8 elements (n %lld)",
                         (long long)n);
    cudaDataType_t in = ab == CH_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    cudaDataType_t out = cd == CH_F32 ? CUDA_R_32F : in;
    chcu_lt_key key;
    memset(&key, 0, sizeof key);
    key.m = m, key.n = n, key.k = k, key.lda = lda, key.ldb = ldb, key.ldc = ldc;
    key.ldaux = aux.ptr ? ldc : 0;
    key.trans_a = trans_a != 0, key.trans_b = trans_b != 0, key.ab = ab, key.cd = cd;
    key.epilogue = (unsigned)epilogue;
    key.align_a = chcu_align_of(a), key.align_b = chcu_align_of(b), key.align_c = chcu_align_of(c);
    key.align_bias = chcu_align_of(bias);
    key.align_aux = aux.ptr ? chcu_align_of(aux) : 0;

    /* Descriptors in our own memory (the Init calls): nothing allocated,
     * nothing to destroy. */
    cublasLtMatmulDescOpaque_t desc_mem;
    cublasLtMatrixLayoutOpaque_t la_mem, lb_mem, lc_mem;
    cublasLtMatmulDesc_t desc = &desc_mem;
    cublasLtMatrixLayout_t la = &la_mem, lb = &lb_mem, lc = &lc_mem;
    ch_status st = chcu_blas_check(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                                   "cublasLtMatmulDescInit");
    int32_t opa = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, opb = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    uint32_t epi = (uint32_t)epilogue;
    const void *bias_ptr = chcu_at<void>(bias);
    /* f32, said explicitly: cuBLASLt's default is D's type, bf16 or f16 for
     * a half D */
    int32_t bias_type = CUDA_R_32F;
    CHCU_LT_SET(st, cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_TRANSA, opa);
    CHCU_LT_SET(st, cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_TRANSB, opb);
    CHCU_LT_SET(st, cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_EPILOGUE, epi);
    CHCU_LT_SET(st, cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                bias_ptr);
    CHCU_LT_SET(st, cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                bias_type);
    if (aux.ptr) {
        /* In D's type (cuBLASLt's default, not set: the GELU input is
         * stored in another type only by the fp8 kernels), row stride
         * ldc like D's. */
        void *aux_ptr = chcu_at<void>(aux);
        int64_t aux_ld = ldc;
        CHCU_LT_SET(st, cublasLtMatmulDescSetAttribute, desc,
                    CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_ptr);
        CHCU_LT_SET(st, cublasLtMatmulDescSetAttribute, desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD,
                    aux_ld);
    }
    /* cuBLASLt's A: our b, (trans_b ? k x n : n x k) as stored; its B: our
     * a, (trans_a ? m x k : k x m); C and D: n x m. */
    if (!st)
        st = chcu_blas_check(cublasLtMatrixLayoutInit(la, in, (uint64_t)(trans_b ? k : n),
                                                      (uint64_t)(trans_b ? n : k), ldb),
                             "cublasLtMatrixLayoutInit(A)");
    if (!st)
        st = chcu_blas_check(cublasLtMatrixLayoutInit(lb, in, (uint64_t)(trans_a ? m : k),
                                                      (uint64_t)(trans_a ? k : m), lda),
                             "cublasLtMatrixLayoutInit(B)");
    if (!st)
        st = chcu_blas_check(cublasLtMatrixLayoutInit(lc, out, (uint64_t)n, (uint64_t)m, ldc),
                             "cublasLtMatrixLayoutInit(D)");
    if (st)
        return st;

    st = chcu_enter(s->dev);
    if (st)
        return st;
    pthread_mutex_lock(&s->blas_lock);
    st = chcu_lt_ready(s);
    chcu_lt_plan *plan = NULL;
    if (!st)
        st = chcu_lt_plan_for(s, &key, desc, la, lb, lc, &plan);
    if (!st && !plan->found)
        st = chi_error(CH_ERR_UNSUPPORTED,
                       "cublasLtMatmulAlgoGetHeuristic: no algorithm for %s inputs, a %s "
                       "output and epilogue %u (m %lld, n %lld, k %lld%s%s)",
                       half, cd == CH_F32 ? "f32" : half, epi, (long long)m, (long long)n,
                       (long long)k, plan->why ? ": " : "",
                       plan->why ? cublasGetStatusName(plan->why) : "");
    if (st) {
        pthread_mutex_unlock(&s->blas_lock);
        return st;
    }
    float beta = 0.0f;
    gemm_mark(s, 0);
    cublasStatus_t bst = cublasLtMatmul(s->lt, desc, &alpha, chcu_at<void>(b), la, chcu_at<void>(a),
                                        lb, &beta, chcu_at<void>(c), lc, chcu_at<void>(c), lc,
                                        &plan->algo, s->lt_ws, s->lt_ws_bytes, s->s);
    if (bst == CUBLAS_STATUS_NOT_SUPPORTED || bst == CUBLAS_STATUS_ARCH_MISMATCH) {
        /* Not again for this key: the core composes the op from now on. */
        plan->found = 0;
        plan->why = bst;
        chcu_blas_end(s);
        return chi_error(CH_ERR_UNSUPPORTED, "cublasLtMatmul with %s inputs, epilogue %u: %s", half,
                         epi, cublasGetStatusName(bst));
    }
    chcu_blas_end(s);
    return chcu_blas_check(bst, "cublasLtMatmul");
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
    if (bias.ptr) {
        /* ch_gemm_bias: cuBLASLt's bias epilogue, or the core adds it
         * with bias_add. */
        if (count != 1 || beta != 0.0f)
            return chi_error(CH_ERR_UNSUPPORTED, "cuda gemm_half: a bias only on one product, "
                                                 "beta 0");
        ch_bmem none = {NULL, 0};
        return chcu_lt_gemm((chcu_stream *)stream, ab, cd, CUBLASLT_EPILOGUE_BIAS, trans_a, trans_b,
                            m, n, k, alpha, a, lda, b, ldb, c, ldc, bias, none);
    }
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

/* ch_gemm_bias_act: cuBLASLt's GELU epilogues, which compute GELU's tanh
 * approximation, so for CH_ACT_GELU_TANH alone (never the exact
 * CH_ACT_GELU), with half inputs; pre, when wanted, is the epilogue's aux
 * output (GELU's input, in C's type). Anything else: CH_ERR_UNSUPPORTED,
 * and the core composes ch_gemm_bias and ch_activation_forward. */
ch_status chcu_gemm_bias_act(void *stream, int ab, int cd, ch_activation act, int trans_a,
                             int trans_b, int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a,
                             int64_t lda, ch_bmem b, int64_t ldb, ch_bmem c, int64_t ldc,
                             ch_bmem pre, ch_bmem bias)
{
    if (!chi_enum_known((int)act, CH_ACT_COUNT))
        return chi_unknown_enum("cuda", "gemm_bias_act", "ch_activation", (int)act, CH_ACT_COUNT);
    if (act != CH_ACT_GELU_TANH)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda gemm_bias_act: no fused activation %d",
                         (int)act);
    if ((ab != CH_BF16 && ab != CH_F16) || (cd != CH_F32 && cd != ab))
        return chi_error(CH_ERR_UNSUPPORTED, "cuda gemm_bias_act: inputs %d, output %d", ab, cd);
    return chcu_lt_gemm((chcu_stream *)stream, ab, cd,
                        pre.ptr ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_BIAS,
                        trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, c, ldc, bias, pre);
}
