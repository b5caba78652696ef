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
/* The same over an index type I of the launch's width (lib/kernels/index.h's
 * rule leaves room for the step past the end in 32 bits). */
#define CHCU_FOR_ROWS_AS(I, r, rows)                                              \
    for (I r = (I)(blockIdx.y * blockDim.y + threadIdx.y); r < (I)(rows);        \
         r += (I)(gridDim.y * blockDim.y))
#define CHCU_FOR_COLS_AS(I, j, cols)                                              \
    for (I j = (I)(blockIdx.x * blockDim.x + threadIdx.x); j < (I)(cols);        \
         j += (I)(gridDim.x * blockDim.x))
#define CHCU_FOR_EACH_AS(I, i, n) CHCU_FOR_COLS_AS(I, i, n)

/* Launches kernel<int32_t> where is32 (lib/kernels/index.h's rule, chosen
 * once per launch), kernel<int64_t> otherwise, with the launch
 * configuration cfg (parenthesised) and the same arguments: the kernels
 * narrow their sizes to I themselves. */
#define CHCU_CFG(...) __VA_ARGS__
#define CHCU_LAUNCH_INDEXED(is32, kernel, cfg, ...)          \
    do {                                                     \
        if (is32)                                            \
            kernel<int32_t><<<CHCU_CFG cfg>>>(__VA_ARGS__);  \
        else                                                 \
            kernel<int64_t><<<CHCU_CFG cfg>>>(__VA_ARGS__);  \
    } while (0)

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

/* ---- slots ---- */

ch_status chcu_alloc(void *dev, size_t bytes, void **ptr);
void chcu_free(void *dev, void *ptr);
ch_status chcu_host_alloc(void *dev, size_t bytes, void **ptr);
void chcu_host_free(void *dev, void *ptr);

ch_status chcu_stream_new(void *dev, void **stream);
void chcu_stream_free(void *stream);
ch_status chcu_stream_sync(void *stream);
ch_status chcu_event_new(void *dev, void **event);
void chcu_event_free(void *event);
ch_status chcu_event_record(void *event, void *stream);
ch_status chcu_event_wait(void *stream, void *event);
ch_status chcu_event_sync(void *event);

ch_status chcu_upload(void *stream, ch_bmem dst, const void *host, size_t bytes,
                      int blocking);
ch_status chcu_download(void *stream, void *host, ch_bmem src, size_t bytes,
                        int blocking);
ch_status chcu_copy(void *stream, ch_bmem dst, ch_bmem src, size_t bytes);
int chcu_can_peer(void *src_dev, void *dst_dev);
ch_status chcu_peer_copy(void *stream, ch_bmem dst, void *src_dev, ch_bmem src,
                         size_t bytes);

ch_status chcu_fill(void *stream, ch_bmem y, int64_t n, uint32_t word);
ch_status chcu_gemm(void *stream, int trans_a, int trans_b, int64_t m, int64_t n,
                    int64_t k, float alpha, ch_bmem a, int64_t lda, ch_bmem b,
                    int64_t ldb, float beta, ch_bmem c, int64_t ldc);
ch_status chcu_binary(void *stream, ch_binary_op op, int64_t n, ch_bmem y, ch_bmem a,
                      ch_bmem b);
ch_status chcu_f32_to_bf16(void *stream, int64_t n, ch_bmem y, ch_bmem x);
ch_status chcu_bf16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x);
ch_status chcu_f32_to_f16(void *stream, int64_t n, ch_bmem y, ch_bmem x);
ch_status chcu_f16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x);
ch_status chcu_axpby(void *stream, int64_t n, ch_bmem y, float alpha, ch_bmem x,
                     float beta);
ch_status chcu_act_forward(void *stream, ch_activation act, int64_t n, ch_bmem y,
                           ch_bmem x);
ch_status chcu_act_backward(void *stream, ch_activation act, int64_t n, ch_bmem dx,
                            ch_bmem dy, ch_bmem x, ch_bmem y);
ch_status chcu_bias_add(void *stream, int64_t outer, int64_t c, int64_t inner,
                        ch_bmem y, ch_bmem x, ch_bmem bias);
ch_status chcu_bias_grad(void *stream, int64_t outer, int64_t c, int64_t inner,
                         ch_bmem db, ch_bmem dy, float beta);
ch_status chcu_softmax_xent(void *stream, int64_t n, int64_t c, ch_bmem loss,
                            ch_bmem probs, ch_bmem logits, ch_bmem labels);
ch_status chcu_softmax_xent_backward(void *stream, int64_t n, int64_t c,
                                     ch_bmem dlogits, ch_bmem probs, ch_bmem labels,
                                     float scale);
ch_status chcu_transpose01(void *stream, int64_t a, int64_t b, int64_t inner,
                           ch_bmem y, ch_bmem x);
ch_status chcu_im2col(void *stream, const ch_conv_geom *g, ch_bmem col, ch_bmem x);
ch_status chcu_col2im(void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem col);
ch_status chcu_maxpool_forward(void *stream, const ch_conv_geom *g, ch_bmem y,
                               ch_bmem idx, ch_bmem x);
ch_status chcu_maxpool_backward(void *stream, const ch_conv_geom *g, ch_bmem dx,
                                ch_bmem dy, ch_bmem idx);
ch_status chcu_sum_axis(void *stream, ch_axis_op op, int64_t outer, int64_t n,
                        int64_t inner, ch_bmem y, ch_bmem x);
ch_status chcu_argmax(void *stream, int64_t outer, int64_t n, int64_t inner,
                      ch_bmem y, ch_bmem x);
ch_status chcu_sgd_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,
                        const ch_sgd_params *params, int first_step);
ch_status chcu_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v,
                         ch_bmem g, const ch_adam_params *params);
ch_status chcu_rand(void *stream, ch_rand_kind kind, int64_t n, ch_bmem y,
                    uint64_t seed, uint64_t offset, float a, float b);
ch_status chcu_gemm_batched(void *stream, int trans_a, int trans_b, int64_t count, int64_t m,
                            int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                            int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b,
                            float beta, ch_bmem c, int64_t ldc, int64_t stride_c);
ch_status chcu_gemm_half(void *stream, int ab, int cd, int trans_a, int trans_b, int64_t count,
                         int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                         int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b, float beta,
                         ch_bmem c, int64_t ldc, int64_t stride_c);
ch_status chcu_permute(void *stream, int ndim, const int64_t *xshape, const int *perm,
                       ch_bmem y, ch_bmem x);
ch_status chcu_softmax(void *stream, int64_t rows, int64_t s, int causal,
                       int64_t rows_per_matrix, ch_bmem y, ch_bmem x);
ch_status chcu_softmax_backward(void *stream, int64_t rows, int64_t s, ch_bmem dx, ch_bmem dy,
                                ch_bmem y);
ch_status chcu_embedding(void *stream, int64_t n, int64_t v, int64_t d, ch_bmem y,
                         ch_bmem table, ch_bmem idx);
ch_status chcu_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d,
                                  ch_bmem dtable, ch_bmem dy, ch_bmem idx);
ch_status chcu_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_bmem y,
                         ch_bmem mean, ch_bmem rstd, ch_bmem x, ch_bmem gamma, ch_bmem beta);
ch_status chcu_layernorm_backward(void *stream, int64_t rows, int64_t d, ch_bmem dx,
                                  ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x,
                                  ch_bmem mean, ch_bmem rstd, ch_bmem gamma);
ch_status chcu_channel_sums(void *stream, int64_t outer, int64_t c, int64_t inner,
                            ch_bmem sums, ch_bmem a, ch_bmem a_center, ch_bmem b,
                            ch_bmem b_center);
ch_status chcu_batchnorm_stats(void *stream, int64_t c, float momentum, float eps,
                               ch_bmem mean, ch_bmem rstd, ch_bmem running_mean,
                               ch_bmem running_var, ch_bmem sums, ch_bmem center);
ch_status chcu_batchnorm_forward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                 ch_bmem y, ch_bmem x, ch_bmem mean, ch_bmem rstd,
                                 ch_bmem gamma, ch_bmem beta);
ch_status chcu_batchnorm_backward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                  ch_bmem dx, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy,
                                  ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma,
                                  ch_bmem local, ch_bmem total);
ch_status chcu_allreduce_sum(int count, void *const *streams, const ch_bmem *bufs,
                             int64_t n);
int chcu_can_allreduce(void *dev_a, void *dev_b);
/* Communicators across processes (NCCL), the span slots; without NCCL
 * chcu_span_id_bytes is 0 and the slots are not filled. */
extern const size_t chcu_span_id_bytes;
ch_status chcu_span_id(void *id);
ch_status chcu_span_new(void **span, int count, void *const *devs, const int *ranks,
                        int nranks, const void *id);
ch_status chcu_span_allreduce(void *span, int count, void *const *streams,
                              const ch_bmem *bufs, int64_t n);
void chcu_span_free(void *span);
/* The mode CHORUS_CUDA_NCCL asks for, or an error naming a bad value. */
ch_status chcu_nccl_mode_of_env(chcu_nccl_mode *mode);
void chcu_comms_free(chcu_backend *be);

#endif
