/* Error mapping, per-stream scratch and launch shapes for the CUDA backend. */
#include "common.cuh"

static ch_status chcu_status_of(cudaError_t err)
{
    switch (err) {
    case cudaErrorMemoryAllocation:
        return CH_ERR_DEVICE_OUT_OF_MEMORY;
    case cudaErrorInvalidConfiguration:
    case cudaErrorLaunchOutOfResources:
        return CH_ERR_LIMIT;
    case cudaErrorInsufficientDriver:
    case cudaErrorNoDevice:
        return CH_ERR_UNAVAILABLE;
    default:
        return CH_ERR_DRIVER;
    }
}

ch_status chcu_fail(ch_status status, cudaError_t err, const char *call)
{
    /* A failed call that is not sticky stays as this thread's last error
     * and the next launch check would report it again: forget it. */
    (void)cudaGetLastError();
    return chi_error(status, "%s: %s (%s)", call, cudaGetErrorString(err),
                     cudaGetErrorName(err));
}

ch_status chcu_check(cudaError_t err, const char *call)
{
    if (err == cudaSuccess)
        return CH_OK;
    return chcu_fail(chcu_status_of(err), err, call);
}

ch_status chcu_blas_check(cublasStatus_t st, const char *call)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return CH_OK;
    ch_status status = st == CUBLAS_STATUS_ALLOC_FAILED ? CH_ERR_DEVICE_OUT_OF_MEMORY
                                                        : CH_ERR_DRIVER;
    return chi_error(status, "%s: %s (%s)", call, cublasGetStatusName(st),
                     cublasGetStatusString(st));
}

unsigned long long chcu_launch_counts[CHCU_MAX_DEVICES];

/* The device this thread last entered (chcu_enter): every slot enters its
 * device before it launches, so a launch is counted for it without
 * asking the runtime again. */
static __thread int entered = -1;

void chcu_count_launch(int index)
{
    if (index >= 0 && index < CHCU_MAX_DEVICES)
        __atomic_fetch_add(&chcu_launch_counts[index], 1ull, __ATOMIC_RELAXED);
}

ch_status chcu_launched(const char *kernel)
{
    chcu_count_launch(entered);
    return chcu_check(cudaGetLastError(), kernel);
}

ch_status chcu_enter(const chcu_device *dev)
{
    /* cudaGetDevice reads the runtime's thread state; cudaSetDevice costs
     * more, and every slot enters its device. The current device is asked
     * each time, not remembered here: code of the caller's may switch it. */
    int current = -1;
    entered = dev->index;
    if (cudaGetDevice(&current) == cudaSuccess && current == dev->index)
        return CH_OK;
    return chcu_check(cudaSetDevice(dev->index), "cudaSetDevice");
}

int chcu_current(void)
{
    int index = -1;
    if (cudaGetDevice(&index) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return index;
}

void chcu_restore(int index)
{
    if (index >= 0 && cudaSetDevice(index) != cudaSuccess)
        (void)cudaGetLastError();
}

ch_status chcu_scratch_free(chcu_stream *s)
{
    if (!s->scratch)
        return CH_OK;
    ch_status st = chcu_check(cudaFree(s->scratch), "cudaFree(scratch)");
    chi_workspace_release(s->dev, s->scratch_bytes);
    s->scratch = NULL;
    s->scratch_bytes = 0;
    return st;
}

/* Entered here, not by the caller: the all-reduce acquires the first
 * stream's scratch while another device of its group is current, and
 * cudaMalloc allocates on the current device. The scratch is the device's
 * workspace (chi_workspace_reserve): counted, and under its memory limit. */
static ch_status chcu_scratch_grow(chcu_stream *s, size_t bytes)
{
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    if (s->scratch) {
        /* Work queued earlier may still read the old buffer. */
        st = chcu_check(cudaStreamSynchronize(s->s), "cudaStreamSynchronize(scratch)");
        if (st)
            return st;
        st = chcu_scratch_free(s);
        if (st)
            return st;
    }
    st = chi_workspace_reserve(s->dev, bytes, "cuda scratch");
    if (st)
        return st;
    cudaError_t err = cudaMalloc(&s->scratch, bytes);
    if (err != cudaSuccess) {
        s->scratch = NULL;
        chi_workspace_release(s->dev, bytes);
        return chcu_check(err, "cudaMalloc(scratch)");
    }
    s->scratch_bytes = bytes;
    return CH_OK;
}

ch_status chcu_scratch_acquire(chcu_stream *s, size_t bytes, void **ptr)
{
    pthread_mutex_lock(&s->scratch_lock);
    if (bytes > s->scratch_bytes) {
        ch_status st = chcu_scratch_grow(s, bytes);
        if (st) {
            pthread_mutex_unlock(&s->scratch_lock);
            return st;
        }
    }
    *ptr = s->scratch;
    return CH_OK;
}

void chcu_scratch_release(chcu_stream *s)
{
    pthread_mutex_unlock(&s->scratch_lock);
}

static int64_t chcu_min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

unsigned chcu_grid(const chcu_device *dev, int64_t n)
{
    int64_t want = (n + CHCU_THREADS - 1) / CHCU_THREADS;
    int64_t cap = (int64_t)dev->sm_count * CHCU_BLOCKS_PER_SM;
    return (unsigned)chcu_min64(want, cap);
}

chcu_shape2 chcu_rows(const chcu_device *dev, int64_t rows, int64_t cols)
{
    unsigned bx = 32;
    while (bx < CHCU_THREADS && (int64_t)bx < cols)
        bx *= 2;
    unsigned by = CHCU_THREADS / bx;
    int64_t cap = (int64_t)dev->sm_count * CHCU_BLOCKS_PER_SM;
    int64_t gx = chcu_min64((cols + bx - 1) / bx, cap);
    /* gridDim.y is limited to 65535. */
    int64_t gy = chcu_min64(chcu_min64((rows + by - 1) / by, cap / gx + 1), 65535);
    chcu_shape2 sh;
    sh.grid = dim3((unsigned)gx, (unsigned)gy, 1);
    sh.block = dim3(bx, by, 1);
    return sh;
}
