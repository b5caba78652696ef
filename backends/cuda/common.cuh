/* The CUDA backend's private structures and helpers, shared by its .cu files.
 *
 * Contexts: the backend context (chcu_backend) holds what init learnt about
 * every device; a device context (chcu_device) its peer flags; a stream
 * (chcu_stream) its cuBLAS handle and scratch, and knows its device, so
 * every slot can make that device current first (threads may have switched
 * it). Anything that creates device-bound state (memory, streams, events,
 * cuBLAS handles) runs with its device current. */
#ifndef CHORUS_CUDA_COMMON_CUH
#define CHORUS_CUDA_COMMON_CUH

#include <pthread.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include "backend.h"

/* Peer flags are kept per device pair in a fixed table. */
#define CHCU_MAX_DEVICES 64
/* Blocks per multiprocessor for grid-stride kernels: enough resident warps
 * to hide memory latency on every supported architecture. */
#define CHCU_BLOCKS_PER_SM 16
#define CHCU_THREADS 256

typedef struct chcu_dev_info {
    char name[128];
    uint64_t memory_bytes;
    int sm_count;
    int major, minor;
    char pci_bus_id[32];
} chcu_dev_info;

typedef struct chcu_comm chcu_comm;

/* How the all-reduce uses NCCL, from CHORUS_CUDA_NCCL at init: "on" (the
 * default: wherever the module has it), "off" (peer copies always), or
 * "fail" (as if no communicator could be made: test builds only, see
 * allreduce.cu). */
typedef enum chcu_nccl_mode { CHCU_NCCL_ON, CHCU_NCCL_OFF, CHCU_NCCL_FAIL } chcu_nccl_mode;

typedef struct chcu_backend {
    int ndevices;
    chcu_dev_info *info;
    chcu_nccl_mode nccl;
    pthread_mutex_t lock;   /* guards comms */
    chcu_comm *comms;       /* all-reduce communicators, by device list */
} chcu_backend;

typedef struct chcu_device {
    chcu_backend *be;
    int index;
    int sm_count;
    uint64_t memory_bytes;
    pthread_mutex_t lock;   /* guards peer[] */
    /* peer[i]: 0 not asked yet, 1 this device reads cuda:i directly, 2 not */
    unsigned char peer[CHCU_MAX_DEVICES];
} chcu_device;

typedef struct chcu_stream {
    chcu_device *dev;
    cudaStream_t s;
    /* Its own cuBLAS handle, made at the first GEMM and bound to `s` for
     * good: cuBLAS promises the same bits run after run only with one
     * active stream per handle (and workspace), and replicas that share a
     * device must stay identical. No two threads may use a handle at once:
     * blas_lock is held from its creation to the end of each call. */
    pthread_mutex_t blas_lock;
    cublasHandle_t blas;
    /* Device scratch for ops that need temporaries (row losses, partial
     * sums). Held from acquire until the work using it is queued; work
     * queued later on the same stream runs after, so it may then reuse it. */
    pthread_mutex_t scratch_lock;
    void *scratch;
    size_t scratch_bytes;
} chcu_stream;

typedef struct chcu_event {
    chcu_device *dev;
    cudaEvent_t e;
} chcu_event;

/* ---- errors ---- */

/* CH_OK, or a status and the message "call: error string (error name)". */
ch_status chcu_check(cudaError_t err, const char *call);
/* Like chcu_check, with the status chosen by the caller. */
ch_status chcu_fail(ch_status status, cudaError_t err, const char *call);
ch_status chcu_blas_check(cublasStatus_t st, const char *call);
/* After a kernel launch: CH_OK or the launch error named after `kernel`. */
ch_status chcu_launched(const char *kernel);
ch_status chcu_enter(const chcu_device *dev);
/* The calling thread's current device (-1 when it cannot be read), and
 * back to it: slots that enter several devices, or that open and close
 * them, leave the caller's CUDA code on the device it had chosen. */
int chcu_current(void);
void chcu_restore(int index);

/* ---- scratch ---- */
ch_status chcu_scratch_acquire(chcu_stream *s, size_t bytes, void **ptr);
void chcu_scratch_release(chcu_stream *s);

/* ---- launch shapes ---- */

/* Blocks of CHCU_THREADS for a grid-stride loop over n items. */
unsigned chcu_grid(const chcu_device *dev, int64_t n);

/* A 2-D launch over `rows` rows of `cols` contiguous items: threads along
 * a row are consecutive (coalesced); short rows stack several per block. */
typedef struct chcu_shape2 {
    dim3 grid, block;
} chcu_shape2;
chcu_shape2 chcu_rows(const chcu_device *dev, int64_t rows, int64_t cols);

/* Grid-stride loops over the 2-D launch of chcu_rows. */
#define CHCU_FOR_ROWS(r, rows)                                                   \
    for (int64_t r = blockIdx.y * (int64_t)blockDim.y + threadIdx.y; r < (rows); \
         r += (int64_t)gridDim.y * blockDim.y)
#define CHCU_FOR_COLS(j, cols)                                                   \
    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < (cols); \
         j += (int64_t)gridDim.x * blockDim.x)
#define CHCU_FOR_EACH(i, n)                                                      \
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < (n);    \
         i += (int64_t)gridDim.x * blockDim.x)

/* ---- warp reductions ---- */

#define CHCU_WARP 32

__device__ static inline float chcu_warp_max(float v)
{
    for (int o = CHCU_WARP / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* A butterfly: every lane ends with the same sum, added in the same order
 * on every run. */
__device__ static inline float chcu_warp_sum(float v)
{
    for (int o = CHCU_WARP / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* A softmax row's statistics, by one warp: *m the largest of x[0, w) and
 * *sum the sum of expf(x[j] - *m), the same in every lane. */
__device__ static inline void chcu_row_max_expsum(const float *x, int64_t w, int lane,
                                                  float *m, float *sum)
{
    float mx = -INFINITY;
    for (int64_t j = lane; j < w; j += CHCU_WARP)
        mx = fmaxf(mx, x[j]);
    mx = chcu_warp_max(mx);
    float s = 0.0f;
    for (int64_t j = lane; j < w; j += CHCU_WARP)
        s += expf(x[j] - mx);
    *m = mx;
    *sum = chcu_warp_sum(s);
}

/* ---- out-of-range flags (softmax.cu) ---- */

/* A kernel lowers the flag word (atomicMin) to the first position whose
 * label or index is out of range. chcu_flag_reset queues setting it to
 * CHCU_NO_ROW; chcu_flag_read waits for it: *pos is that position and
 * *value the i32 there in `values` (device memory), or *pos is -1. */
#define CHCU_NO_ROW 0xffffffffu
ch_status chcu_flag_reset(const chcu_stream *s, unsigned *flag);
/* Enter the stream's device, take its scratch for a flag and queue the
 * flag's reset; on success the caller gives the scratch back
 * (chcu_scratch_release) once it has read the flag. */
ch_status chcu_flag_acquire(chcu_stream *s, unsigned **flag);
ch_status chcu_flag_read(const chcu_stream *s, const unsigned *flag, const int32_t *values,
                         int64_t *pos, int32_t *value);

template <typename T> static inline T *chcu_at(ch_bmem m)
{
    return (T *)((char *)m.ptr + m.off);
}

/* ---- deterministic sums along an axis (sum.cu) ---- */

/* y[o, i] = sum over k < n of x[o, k, i] / divisor (+ beta * y[o, i] when
 * beta != 0) for x seen as [outer, n, inner]. Summed in double, in an order
 * fixed by the shape alone. `work` holds chcu_sum_into_work() bytes. */
ch_status chcu_sum_into(chcu_stream *s, float *y, const float *x, int64_t outer,
                        int64_t n, int64_t inner, double divisor, float beta, void *work);
size_t chcu_sum_into_work(int64_t outer, int64_t n, int64_t inner);

/* ---- slots (lib/backend.h's list) ----
 * chcu_<slot> for every slot but the device ones (backend.cu's statics).
 * The slots the table leaves NULL (the convolution) are declared and not
 * defined; the span slots are defined only with NCCL. */
#define CHCU_SLOT_DEVICE(ret, name, params)
#define CHCU_SLOT_MEMORY(ret, name, params) CH_SLOT_PROTOTYPE(chcu_, ret, name, params)
#define CHCU_SLOT_STREAM(ret, name, params) CH_SLOT_PROTOTYPE(chcu_, ret, name, params)
#define CHCU_SLOT_TRANSFER(ret, name, params) CH_SLOT_PROTOTYPE(chcu_, ret, name, params)
#define CHCU_SLOT_OP(ret, name, params) CH_SLOT_PROTOTYPE(chcu_, ret, name, params)
#define CHCU_SLOT_COLLECTIVE(ret, name, params) CH_SLOT_PROTOTYPE(chcu_, ret, name, params)
#define CHCU_SLOT(group, kind, ret, name, params) CHCU_SLOT_##group(ret, name, params)
CH_BACKEND_SLOTS(CHCU_SLOT)

/* Communicators across processes (NCCL), the span slots; without NCCL
 * chcu_span_id_bytes is 0 and the slots are not filled. */
extern const size_t chcu_span_id_bytes;
/* The mode CHORUS_CUDA_NCCL asks for, or an error naming a bad value. */
ch_status chcu_nccl_mode_of_env(chcu_nccl_mode *mode);
void chcu_comms_free(chcu_backend *be);

#endif
