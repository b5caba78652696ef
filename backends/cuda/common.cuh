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
#include <cublasLt.h>
#include "backend.h"
#include "kernels/index.h"

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
    /* The zero of event_seconds' clock (stream.cu): an event with timing,
     * recorded and waited for when the device's first timed event is made,
     * kept until the device closes; NULL until then. */
    pthread_mutex_t clock_lock; /* guards clock_zero */
    cudaEvent_t clock_zero;
    /* Untimed events given back by event_free, kept for the next
     * event_new (the core makes one for every block it frees): a list of
     * at most CHCU_SPARE_EVENTS, emptied at device_close. */
    pthread_mutex_t event_lock;
    struct chcu_event *spare;
    int nspare;
    /* ch_device_counters (gemm.cu): GEMM calls since the start (atomic)
     * and, with time_gemms, under `lock`, an event pair around each
     * (gemm_events, 2 a GEMM), summed into gemm_seconds at the next read.
     * Launches are counted by CUDA index, chcu_launch_counts. */
    unsigned long long gemms;
    int time_gemms;
    cudaEvent_t *gemm_events;
    int ngemm_events, gemm_events_cap;
    double gemm_seconds;
} chcu_device;

/* Kernel launches and cuBLAS calls per CUDA device index, counted by
 * chcu_launched and the GEMM slots (common.cu). */
extern unsigned long long chcu_launch_counts[CHCU_MAX_DEVICES];
/* The counts of the device of CUDA index `index`, one more. */
void chcu_count_launch(int index);
/* Its GEMM events, destroyed (device_close). */
void chcu_counters_release(chcu_device *d);
/* The counters slot (gemm.cu). */
ch_status chcu_counters(void *dev, int start, int time_gemms, uint64_t *launches, uint64_t *gemms,
                        double *gemm_seconds);

#define CHCU_SPARE_EVENTS 4096

/* A label or index check queued on a stream and not read yet (softmax.cu). */
typedef struct chcu_pending_check {
    const char *fn; /* the op, for the message */
    int index;      /* 1: an embedding index (chi_bad_index); 0: a label */
    int64_t limit;  /* classes, or the table's rows */
} chcu_pending_check;

/* Checks a stream holds before it waits on its own to read them. */
#define CHCU_CHECKS 32
/* Their words' bytes, on the device and pinned on the host. */
#define CHCU_CHECK_BYTES (CHCU_CHECKS * sizeof(unsigned long long))

/* One answer of cuBLASLt's heuristic (gemm.cu), for the product its key
 * names: the problem and every alignment the heuristic was told or read
 * from the descriptor's pointers (the key is zeroed first: compared whole
 * with memcmp). found 0: it had none, and the core composes the op. */
typedef struct chcu_lt_key {
    int64_t m, n, k, lda, ldb, ldc, ldaux;
    int trans_a, trans_b, ab, cd;
    unsigned epilogue;
    unsigned align_a, align_b, align_c, align_bias, align_aux;
} chcu_lt_key;

typedef struct chcu_lt_plan {
    chcu_lt_key key;
    int found;
    cublasStatus_t why; /* found 0: the status that said so, or SUCCESS */
    cublasLtMatmulAlgo_t algo;
} chcu_lt_plan;

/* Heuristic answers a stream keeps (a model's fused products: a few
 * shapes per layer kind); the oldest goes first. */
#define CHCU_LT_PLANS 32

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
    int blas_tf32; /* the handle's math mode: 1 TF32, 0 FP32, -1 not set yet */
    /* cuBLASLt, for the fused epilogues (gemm.cu), under blas_lock too:
     * its handle, made at the first fused product with the workspace the
     * products use (lt_ws_bytes, the device's workspace, counted with
     * chi_workspace_reserve; none, 0 bytes, where the device had no room
     * for it), and the heuristic's answers for the last CHCU_LT_PLANS
     * products (lt_nplans of them; lt_next the one replaced next). */
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    chcu_lt_plan lt_plans[CHCU_LT_PLANS];
    int lt_nplans, lt_next;
    /* Device scratch for ops that need temporaries (row losses, partial
     * sums). Held from acquire until the work using it is queued; work
     * queued later on the same stream runs after, so it may then reuse it. */
    pthread_mutex_t scratch_lock;
    void *scratch;
    size_t scratch_bytes;
    /* The label and index checks of the loss and embedding slots, read
     * where the stream is waited for anyway (softmax.cu): check_dev[i] is
     * the word the i-th pending check's kernel lowers, check_host[i] its
     * pinned copy, queued after the kernel; both made at the first check. */
    pthread_mutex_t check_lock;
    unsigned long long *check_dev;
    unsigned long long *check_host;
    chcu_pending_check pending[CHCU_CHECKS];
    int npending;
} chcu_stream;

typedef struct chcu_event {
    chcu_device *dev;
    cudaEvent_t e;
    int timed;    /* made with timing (while a trace ran) */
    int recorded; /* recorded at least once */
    struct chcu_event *next; /* in the device's spare list */
} chcu_event;

/* ---- errors ---- */

/* CH_OK, or a status and the message "call: error string (error name)". */
ch_status chcu_check(cudaError_t err, const char *call);
/* Like chcu_check, with the status chosen by the caller. */
ch_status chcu_fail(ch_status status, cudaError_t err, const char *call);
ch_status chcu_blas_check(cublasStatus_t st, const char *call);
/* After a kernel launch: CH_OK or the launch error named after `kernel`. */
ch_status chcu_launched(const char *kernel);
/* Makes dev the calling thread's current device, calling cudaSetDevice
 * only when another one is current. */
ch_status chcu_enter(const chcu_device *dev);
/* The calling thread's current device (-1 when it cannot be read), and
 * back to it: slots that enter several devices, or that open and close
 * them, leave the caller's CUDA code on the device it had chosen. */
int chcu_current(void);
void chcu_restore(int index);

/* ---- the clock of event_seconds (stream.cu) ---- */
/* At device_close: the device's clock_zero event goes (no-op without one). */
void chcu_clock_release(chcu_device *dev);
/* At device_close: the spare events go. */
void chcu_events_release(chcu_device *dev);

/* ---- scratch ----
 * The stream's scratch and check words are the device's workspace, told
 * to the core (chi_workspace_reserve): counted in its ch_memory_stats and
 * held under its memory limit. */
ch_status chcu_scratch_acquire(chcu_stream *s, size_t bytes, void **ptr);
void chcu_scratch_release(chcu_stream *s);
/* Frees the scratch (the stream is going, or it grows), with its device
 * current; it leaves the workspace even when cudaFree fails. */
ch_status chcu_scratch_free(chcu_stream *s);

/* ---- cuBLASLt (gemm.cu) ---- */
/* The stream's cuBLASLt handle and workspace go (the stream is being
 * destroyed; its device current): the workspace leaves the device's
 * workspace even when cudaFree fails. */
void chcu_lt_free(chcu_stream *s);

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
/* The same over an index type I of the launch's width (lib/kernels/index.h's
 * rule leaves room for the step past the end in 32 bits). */
/* clang-format off */
#define CHCU_FOR_ROWS_AS(I, r, rows)                                              \
    for (I r = (I)(blockIdx.y * blockDim.y + threadIdx.y); r < (I)(rows);        \
         r += (I)(gridDim.y * blockDim.y))
#define CHCU_FOR_COLS_AS(I, j, cols)                                              \
    for (I j = (I)(blockIdx.x * blockDim.x + threadIdx.x); j < (I)(cols);        \
         j += (I)(gridDim.x * blockDim.x))
/* clang-format on */
#define CHCU_FOR_EACH_AS(I, i, n) CHCU_FOR_COLS_AS(I, i, n)

/* Launches kernel<int32_t> where is32 (lib/kernels/index.h's rule, chosen
 * once per launch), kernel<int64_t> otherwise, with the launch
 * configuration cfg (parenthesised) and the same arguments: the kernels
 * narrow their sizes to I themselves. */
#define CHCU_CFG(...) __VA_ARGS__
/* clang-format off */
#define CHCU_LAUNCH_INDEXED(is32, kernel, cfg, ...)          \
    do {                                                     \
        if (is32)                                            \
            kernel<int32_t><<<CHCU_CFG cfg>>>(__VA_ARGS__);  \
        else                                                 \
            kernel<int64_t><<<CHCU_CFG cfg>>>(__VA_ARGS__);  \
    } while (0)
/* clang-format on */

/* A window op's geometry (ch_conv_geom) in a kernel's index type I, and
 * whether that is 32 bits: layout.cu's im2col and col2im, pool.cu's max
 * pooling. */
template <typename I> struct chcu_window {
    I n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
};
template <typename I> __device__ static inline chcu_window<I> chcu_window_of(const ch_conv_geom &g)
{
    return chcu_window<I>{(I)g.n,  (I)g.c,  (I)g.h,  (I)g.w,  (I)g.oh, (I)g.ow,
                          (I)g.kh, (I)g.kw, (I)g.sh, (I)g.sw, (I)g.ph, (I)g.pw};
}
static inline int chcu_window_is_32(const ch_conv_geom *g)
{
    return chk_index_is_32(chk_window_largest(g->n, g->c, g->h, g->w, g->oh, g->ow, g->kh, g->kw));
}

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

/* ---- deferred label and index checks (softmax.cu) ---- */

/* A kernel that finds labels or indices out of range lowers a check word
 * (atomicMin) to chcu_check_word(position, value) of the first such
 * position: the position in the high half orders the words, the value
 * rides along in the low half, so one word names both and no later read
 * of the labels (which may have changed by then) is needed. A word still
 * CHCU_CHECK_NONE found nothing. */
#define CHCU_CHECK_NONE 0xffffffffffffffffull
/* Positions must stay below this for the word to hold them. */
#define CHCU_CHECK_MAX_POS 0xffffffffll
__host__ __device__ static inline unsigned long long chcu_check_word(int64_t pos, int32_t value)
{
    return (unsigned long long)pos << 32 | (uint32_t)value;
}

/* A slot that checks: chcu_check_begin (after entering the device) takes
 * the stream's next check word, holding the stream's check lock; the
 * caller launches its kernel with it and ends with chcu_check_end, which
 * queues the word's copy to the host (when `launched` is CH_OK), records
 * the check, releases the lock and returns `launched` or the copy's error.
 * When the stream already holds CHCU_CHECKS unread checks, begin first
 * waits for the stream and reads them, and returns the error they hold. */
ch_status chcu_check_begin(chcu_stream *s, int64_t positions, unsigned long long **word);
ch_status chcu_check_end(chcu_stream *s, ch_status launched, const char *fn, int index,
                         int64_t limit);
/* Waits for the stream (cudaStreamSynchronize, `what` naming it in an
 * error), then reads and forgets the checks queued before: the first that
 * found a bad value, in the order of the calls, is returned as
 * chi_bad_label or chi_bad_index. Every wait on a stream that the core
 * asks for (stream_sync, blocking transfers) goes through here. */
ch_status chcu_stream_wait(chcu_stream *s, const char *what);
/* The same reading, by a caller that holds the check lock and has waited. */
ch_status chcu_checks_read_locked(chcu_stream *s);
/* Frees the check words (the stream is being destroyed). */
void chcu_checks_free(chcu_stream *s);

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
