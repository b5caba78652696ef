/* The backend interface: what a backend (host, OpenCL, CUDA) fills in.
 *
 * A backend is a table of function pointers (ch_backend_i) plus the contexts
 * its functions return. The core owns validation: an op slot is only called
 * with shapes, dtypes and devices already checked, sizes >= 1, and every
 * buffer large enough.
 *
 * Which slots may be NULL: CH_BACKEND_SLOTS below lists every slot with
 * its kind (REQUIRED, OPTIONAL, OP). A new backend starts with the
 * required ones (the device, memory, stream and transfer slots and gemm)
 * and grows: every op slot it leaves NULL runs on the host backend. The
 * registry also refuses host_alloc without host_free (or the reverse),
 * peer_copy without can_peer, and one or two of the three conv2d slots.
 *
 * Handles:
 *   backend context  returned by init, passed to device_props/device_open
 *   device context   returned by device_open ("dev" below)
 *   stream           returned by stream_new; every op is queued on one and
 *                    the backend finds the device through it
 *   memory           ch_bmem: the allocation alloc returned plus a byte
 *                    offset into it (views share an allocation)
 *
 * Errors: a failing slot returns a status and sets the message with
 * chi_error() ("clEnqueueNDRangeKernel(gemm): CL_OUT_OF_RESOURCES").
 *
 * A loadable backend module exports one symbol, CH_BACKEND_ENTRY_SYMBOL, a
 * function returning its table; the core checks abi_version before use. */
#ifndef CHORUS_LIB_BACKEND_H
#define CHORUS_LIB_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <chorus.h>
#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Changes whenever the table below, an enum a slot takes or what a module
 * must tell the core changes (12: the workspace and staging it allocates
 * itself, chi_workspace_reserve; 13: the attention slots; 14: their
 * layout arguments, ch_attention_packed; 15: their products' format,
 * ch_attention_packed_mixed, and gemm_half's bias, ch_gemm_bias; 16:
 * adam_step_half; 17: chi_math_flags, which modules call; 18:
 * softmax_xent_fused, adam_step_multi, counters, gemm_bias_act,
 * CH_ACT_GELU_TANH, add_layernorm and layernorm_backward_add): a module
 * of another version is refused at load. */
#define CH_BACKEND_ABI_VERSION 18
#define CH_BACKEND_ENTRY_SYMBOL "chorus_backend_entry"

typedef struct ch_bmem {
    void *ptr;   /* what alloc returned */
    size_t off;  /* in bytes */
} ch_bmem;

/* What a backend tells the core about one of its devices. */
typedef struct ch_bdev_props {
    char name[128];
    char vendor[64];
    ch_device_kind kind;
    uint64_t memory_bytes;
    uint64_t max_alloc_bytes;
    int compute_units;
    char pci_bus_id[32];   /* "dddd:bb:dd.f" lower case, "" when unknown */
    char detail[96];       /* "sm_90", "OpenCL 3.0 PoCL 3.1", ... */
    char platform[64];     /* the driver platform (OpenCL's CL_PLATFORM_NAME), ""
                              when the backend has none */
} ch_bdev_props;

/* The enums slots take (and ch_activation, from ops.h). Each ends with a
 * _COUNT; a backend answers a value at or beyond the count it was built
 * with (a newer core's) with CH_ERR_UNSUPPORTED (chi_unknown_enum), never
 * with a default. One enumerator a line, each line starting with its name:
 * backends/opencl/Makefile.mk reads the names from here to hand the values
 * to the kernels. */
typedef enum ch_binary_op {
    CH_BIN_ADD = 0,
    CH_BIN_SUB = 1,
    CH_BIN_MUL = 2,
    CH_BIN_COUNT
} ch_binary_op;

typedef enum ch_rand_kind {
    CH_RAND_UNIFORM = 0,
    CH_RAND_NORMAL = 1,
    CH_RAND_DROPOUT = 2,
    CH_RAND_COUNT
} ch_rand_kind;

/* What sum_axis leaves in each output: the sum, or the sum divided by n. */
typedef enum ch_axis_op {
    CH_AXIS_SUM = 0,
    CH_AXIS_MEAN = 1,
    CH_AXIS_COUNT
} ch_axis_op;

/* One parameter of adam_step_multi: its n elements in p, m, v and g, and
 * (half CH_BF16 or CH_F16) the rounded copy ph, or (half CH_F32) none. */
typedef struct ch_adam_segment {
    int64_t n;
    ch_bmem p, m, v, g, ph;
    ch_dtype half;
} ch_adam_segment;

/* Convolution geometry for im2col/col2im/maxpool, resolved by the core. */
typedef struct ch_conv_geom {
    int64_t n, c, h, w;    /* input [N, C, H, W] */
    int64_t oh, ow;        /* output plane */
    int kh, kw, sh, sw, ph, pw;
} ch_conv_geom;

/* Every slot of the table, once, in the table's order: X(group, kind,
 * return type, name, (parameters)). From this list come the table's
 * members (below), each backend's prototypes (CH_SLOT_PROTOTYPE) and the
 * registry's check of the required slots (lib/registry.c).
 *
 * group: what the slot acts on: DEVICE (the backend and its devices),
 * MEMORY, STREAM (streams and events), TRANSFER, OP, COLLECTIVE. A
 * backend's header declares the groups it names <prefix><slot>.
 *
 * kind: REQUIRED: ch_init refuses a module that leaves it NULL, naming
 * it; OPTIONAL: may be NULL, the core does without (each says how); OP:
 * may be NULL, the core then runs the op on the host backend, staging the
 * tensors through host memory, and says so once per op and device
 * (lib/ops_fallback.c). */
/* clang-format off */
#define CH_BACKEND_SLOTS(X)                                                                        \
    /* ---- device and memory ---- */                                                              \
    /* Find the devices. A backend with no usable driver fails here with                           \
     * CH_ERR_UNAVAILABLE and a message saying why. Leaves nothing sticky. */                      \
    X(DEVICE, REQUIRED, ch_status, init, (void **ctx, int *ndevices))                              \
    X(DEVICE, REQUIRED, void, shutdown, (void *ctx))                                               \
    X(DEVICE, REQUIRED, ch_status, device_props, (void *ctx, int index, ch_bdev_props *props))     \
    X(DEVICE, REQUIRED, ch_status, device_open, (void *ctx, int index, void **dev))                \
    X(DEVICE, REQUIRED, void, device_close, (void *dev))                                           \
    /* optional: free and total bytes now (ch_device_memory reports unavailable                    \
     * without it) */                                                                              \
    X(DEVICE, OPTIONAL, ch_status, mem_info, (void *dev, uint64_t *free_bytes,                     \
        uint64_t *total_bytes))                                                                    \
    /* optional: ch_device_counters. start 1: from zero (time_gemms: time                           \
     * every GEMM from now); start 0: the counts since (gemm_seconds < 0                           \
     * where not timed). Without it the core answers CH_ERR_UNSUPPORTED. */                        \
    X(DEVICE, OPTIONAL, ch_status, counters, (void *dev, int start, int time_gemms,               \
        uint64_t *launches, uint64_t *gemms, double *gemm_seconds))                                \
    /* CH_ERR_DEVICE_OUT_OF_MEMORY when the device is full (the core then                          \
     * empties its cache and tries once more), CH_ERR_LIMIT when `bytes` is                        \
     * beyond what the device can allocate at once. */                                             \
    X(MEMORY, REQUIRED, ch_status, alloc, (void *dev, size_t bytes, void **ptr))                   \
    X(MEMORY, REQUIRED, void, free, (void *dev, void *ptr))                                        \
    /* optional, both or neither: page-locked host memory (without them pinned                     \
     * buffers are plain malloc'ed memory) */                                                      \
    X(MEMORY, OPTIONAL, ch_status, host_alloc, (void *dev, size_t bytes, void **ptr))              \
    X(MEMORY, OPTIONAL, void, host_free, (void *dev, void *ptr))                                   \
    /* ---- streams and transfers ---- */                                                          \
    X(STREAM, REQUIRED, ch_status, stream_new, (void *dev, void **stream))                         \
    X(STREAM, REQUIRED, void, stream_free, (void *stream))                                         \
    X(STREAM, REQUIRED, ch_status, stream_sync, (void *stream))                                    \
    X(STREAM, REQUIRED, ch_status, event_new, (void *dev, void **event))                           \
    X(STREAM, REQUIRED, void, event_free, (void *event))                                           \
    X(STREAM, REQUIRED, ch_status, event_record, (void *event, void *stream))                      \
    /* The stream waits for an event of the same backend (may be another device). */               \
    X(STREAM, REQUIRED, ch_status, event_wait, (void *stream, void *event))                        \
    X(STREAM, REQUIRED, ch_status, event_sync, (void *event))                                      \
    /* optional: the time at which the stream reached the recorded and                             \
     * completed event, in seconds on a clock of the backend's own (any                            \
     * epoch, the same for every event of one device); CH_ERR_UNSUPPORTED                          \
     * when this event cannot tell (an OpenCL queue made without profiling,                        \
     * a CUDA event made without timing, an event never recorded). Events                          \
     * and streams made while a trace runs (chi_tracing()) can tell. Without                       \
     * the slot, chi_trace_event_seconds says the backend cannot. */                               \
    X(STREAM, OPTIONAL, ch_status, event_seconds, (void *event, double *seconds))                  \
    /* blocking = 1: return when the transfer has run: the device buffer                           \
     * holds the data for every stream (upload), the host memory holds it                          \
     * (download). Not merely when `host` may be reused, which is all a                            \
     * blocking clEnqueueWriteBuffer promises. blocking = 0: `host` is pinned                      \
     * memory from host_alloc of this backend (maybe of another device or                          \
     * OpenCL platform) and stays untouched until the stream is                                    \
     * synchronised. */                                                                            \
    X(TRANSFER, REQUIRED, ch_status, upload, (void *stream, ch_bmem dst, const void *host,         \
        size_t bytes, int blocking))                                                               \
    X(TRANSFER, REQUIRED, ch_status, download, (void *stream, void *host, ch_bmem src,             \
        size_t bytes, int blocking))                                                               \
    /* Same device. Regions do not overlap. */                                                     \
    X(TRANSFER, REQUIRED, ch_status, copy, (void *stream, ch_bmem dst, ch_bmem src, size_t bytes)) \
    /* optional: 1 when peer_copy can move data from src_dev to dst_dev                            \
     * (without them copies between devices go through host memory) */                             \
    X(TRANSFER, OPTIONAL, int, can_peer, (void *src_dev, void *dst_dev))                           \
    /* optional, needs can_peer: queued on `stream` (of dst's device) after the                    \
     * core made it wait for src's producers. */                                                   \
    X(TRANSFER, OPTIONAL, ch_status, peer_copy, (void *stream, ch_bmem dst, void *src_dev,         \
        ch_bmem src, size_t bytes))                                                                \
    /* ---- ops (f32 unless said; an OP slot left NULL runs on the host) ---- */                   \
    /* y as n 4-byte words, each set to `word` (the core turns an f32 or                           \
     * i32 value into its bits: no slot takes a ch_dtype). */                                      \
    X(OP, OP, ch_status, fill, (void *stream, ch_bmem y, int64_t n, uint32_t word))                \
    /* Row-major: C[M,N] = alpha op(A) op(B) + beta C, lda/ldb/ldc are row                         \
     * strides of A, B, C as stored. Required: the one op every backend has. */                    \
    X(OP, REQUIRED, ch_status, gemm, (void *stream, int trans_a, int trans_b, int64_t m,           \
        int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda, ch_bmem b, int64_t ldb,         \
        float beta, ch_bmem c, int64_t ldc))                                                       \
    X(OP, OP, ch_status, binary, (void *stream, ch_binary_op op, int64_t n, ch_bmem y, ch_bmem a,  \
        ch_bmem b))                                                                                \
    /* y = alpha * x + beta * y (beta 0: y is not read) */                                         \
    X(OP, OP, ch_status, axpby, (void *stream, int64_t n, ch_bmem y, float alpha, ch_bmem x,       \
        float beta))                                                                               \
    X(OP, OP, ch_status, act_forward, (void *stream, ch_activation act, int64_t n, ch_bmem y,      \
        ch_bmem x))                                                                                \
    /* x or y may have ptr NULL when the activation does not read it */                            \
    X(OP, OP, ch_status, act_backward, (void *stream, ch_activation act, int64_t n, ch_bmem dx,    \
        ch_bmem dy, ch_bmem x, ch_bmem y))                                                         \
    /* x, y seen as [outer, c, inner]: y = x + bias[c] */                                          \
    X(OP, OP, ch_status, bias_add, (void *stream, int64_t outer, int64_t c, int64_t inner,         \
        ch_bmem y, ch_bmem x, ch_bmem bias))                                                       \
    /* db[c] = beta db[c] + sum over outer, inner of dy[outer, c, inner] */                        \
    X(OP, OP, ch_status, bias_grad, (void *stream, int64_t outer, int64_t c, int64_t inner,        \
        ch_bmem db, ch_bmem dy, float beta))                                                       \
    /* labels i32; the first row with a label outside [0, c) is reported                           \
     * with chi_bad_label, by the call or, if the backend defers the check                         \
     * (CUDA, OpenCL), by the stream's next stream_sync or blocking transfer */                    \
    X(OP, OP, ch_status, softmax_xent, (void *stream, int64_t n, int64_t c, ch_bmem loss,          \
        ch_bmem probs, ch_bmem logits, ch_bmem labels))                                            \
    X(OP, OP, ch_status, softmax_xent_backward, (void *stream, int64_t n, int64_t c,               \
        ch_bmem dlogits, ch_bmem probs, ch_bmem labels, float scale))                              \
    /* ch_softmax_xent_fused: loss (f32 [1]) = the mean over the n rows of                         \
     * -log softmax(logits)[label], and logits [n, c] (`dt`: CH_F32, CH_BF16                       \
     * or CH_F16) overwritten by scale * (softmax - onehot) / n in their own                       \
     * format, in one pass over each row; labels checked as softmax_xent's */                      \
    X(OP, OP, ch_status, softmax_xent_fused, (void *stream, int64_t n, int64_t c, ch_dtype dt,    \
        float scale, ch_bmem loss, ch_bmem logits, ch_bmem labels))                                \
    /* [a, b, inner] -> [b, a, inner]; dtype size 4 */                                             \
    X(OP, OP, ch_status, transpose01, (void *stream, int64_t a, int64_t b, int64_t inner,          \
        ch_bmem y, ch_bmem x))                                                                     \
    X(OP, OP, ch_status, im2col, (void *stream, const ch_conv_geom *g, ch_bmem col, ch_bmem x))    \
    X(OP, OP, ch_status, col2im, (void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem col))   \
    /* idx i32 */                                                                                  \
    X(OP, OP, ch_status, maxpool_forward, (void *stream, const ch_conv_geom *g, ch_bmem y,         \
        ch_bmem idx, ch_bmem x))                                                                   \
    X(OP, OP, ch_status, maxpool_backward, (void *stream, const ch_conv_geom *g, ch_bmem dx,       \
        ch_bmem dy, ch_bmem idx))                                                                  \
    /* x as [outer, n, inner] -> y [outer, inner], summed over n */                                \
    X(OP, OP, ch_status, sum_axis, (void *stream, ch_axis_op op, int64_t outer, int64_t n,         \
        int64_t inner, ch_bmem y, ch_bmem x))                                                      \
    /* y i32 */                                                                                    \
    X(OP, OP, ch_status, argmax, (void *stream, int64_t outer, int64_t n, int64_t inner,           \
        ch_bmem y, ch_bmem x))                                                                     \
    /* m.ptr NULL when momentum is 0 */                                                            \
    X(OP, OP, ch_status, sgd_step, (void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,      \
        const ch_sgd_params *params, int first_step))                                              \
    X(OP, OP, ch_status, adam_step, (void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v,     \
        ch_bmem g, const ch_adam_params *params))                                                  \
    /* optional: adam_step, then ph (`half`: CH_BF16 or CH_F16, n elements)                        \
     * = the new p rounded as f32_to_bf16 or f32_to_f16 round it, in the same                      \
     * pass (lib/stamp.h's chi_adam_step_half: the copy of a weight the next                       \
     * forward's half products read). Without it the optimizer steps with                          \
     * adam_step and the forward rounds the weight. */                                             \
    X(OP, OPTIONAL, ch_status, adam_step_half, (void *stream, int64_t n, ch_bmem p, ch_bmem m,     \
        ch_bmem v, ch_bmem g, const ch_adam_params *params, int half, ch_bmem ph))                 \
    /* optional: adam_step_half over `count` parameters of one device in one                       \
     * launch or a few (segs[i]: n elements; ph.ptr NULL where half is CH_F32,                     \
     * no rounded copy), each element's step the same bits as adam_step's;                         \
     * no two segments share memory but their g. Without it the core steps                        \
     * them one by one. */                                                                         \
    X(OP, OPTIONAL, ch_status, adam_step_multi, (void *stream, int count,                          \
        const ch_adam_segment *segs, const ch_adam_params *params))                                \
    /* a, b: (lo, hi), (mean, std) or (p, unused) */                                               \
    X(OP, OP, ch_status, rand, (void *stream, ch_rand_kind kind, int64_t n, ch_bmem y,             \
        uint64_t seed, uint64_t offset, float a, float b))                                         \
    /* gemm's, for `count` matrices: the i-th of A at a + i * stride_a                             \
     * elements, of B and C likewise */                                                            \
    X(OP, OP, ch_status, gemm_batched, (void *stream, int trans_a, int trans_b, int64_t count,     \
        int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda, int64_t stride_a,    \
        ch_bmem b, int64_t ldb, int64_t stride_b, float beta, ch_bmem c, int64_t ldc,              \
        int64_t stride_c))                                                                         \
    /* 4-byte elements; xshape[0..ndim) is x's shape, y's dimension i is x's                       \
     * perm[i]; 2 <= ndim <= CH_MAX_DIMS. The core passes the fewest                               \
     * dimensions that describe the move: none of size 1, and no two of x                          \
     * that stay neighbours, in order, in y (a plain copy never comes here) */                     \
    X(OP, OP, ch_status, permute, (void *stream, int ndim, const int64_t *xshape, const int *perm, \
        ch_bmem y, ch_bmem x))                                                                     \
    /* rows of length s; with causal, row r (t = r % rows_per_matrix) keeps                        \
     * columns j <= t + s - rows_per_matrix */                                                     \
    X(OP, OP, ch_status, softmax, (void *stream, int64_t rows, int64_t s, int causal,              \
        int64_t rows_per_matrix, ch_bmem y, ch_bmem x))                                            \
    X(OP, OP, ch_status, softmax_backward, (void *stream, int64_t rows, int64_t s, ch_bmem dx,     \
        ch_bmem dy, ch_bmem y))                                                                    \
    /* causal attention (ch_attention, ch_attention_packed) over b * heads                        \
     * matrices [t, hd], f32: matrix (n, h) starts at row n * t, column                          \
     * h * hd of q, k, v (and dq, dk, dv), whose rows are ld floats apart,                       \
     * and of o (and dout), rows ldo apart; lse [b * heads, t]. Its                               \
     * backward writes dq, dk and dv (the rows' other columns untouched);                         \
     * half: CH_F32, or the format the tile products may round their                              \
     * inputs to (ch_attention_packed_mixed) */                                                    \
    X(OP, OP, ch_status, attention, (void *stream, int64_t b, int64_t heads, int64_t t,            \
        int64_t hd, float scale, ch_dtype half, ch_bmem o, int64_t ldo, ch_bmem lse, ch_bmem q,    \
        ch_bmem k, ch_bmem v, int64_t ld))                                                         \
    X(OP, OP, ch_status, attention_backward, (void *stream, int64_t b, int64_t heads, int64_t t,   \
        int64_t hd, float scale, ch_dtype half, ch_bmem dq, ch_bmem dk, ch_bmem dv, ch_bmem q,     \
        ch_bmem k, ch_bmem v, int64_t ld, ch_bmem dout, ch_bmem o, int64_t ldo, ch_bmem lse))      \
    /* idx i32 [n]; the first index outside [0, v) is reported with                                \
     * chi_bad_index (like chi_bad_label, and as late), its row of y set to 0 */                   \
    X(OP, OP, ch_status, embedding, (void *stream, int64_t n, int64_t v, int64_t d, ch_bmem y,     \
        ch_bmem table, ch_bmem idx))                                                               \
    X(OP, OP, ch_status, embedding_backward, (void *stream, int64_t n, int64_t v, int64_t d,       \
        ch_bmem dtable, ch_bmem dy, ch_bmem idx))                                                  \
    X(OP, OP, ch_status, layernorm, (void *stream, int64_t rows, int64_t d, float eps, ch_bmem y,  \
        ch_bmem mean, ch_bmem rstd, ch_bmem x, ch_bmem gamma, ch_bmem beta))                       \
    /* dx.ptr NULL: not wanted */                                                                  \
    X(OP, OP, ch_status, layernorm_backward, (void *stream, int64_t rows, int64_t d, ch_bmem dx,   \
        ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x, ch_bmem mean, ch_bmem rstd,          \
        ch_bmem gamma))                                                                            \
    /* optional: ch_add_layernorm in one pass: sum = a + b (each in its                            \
     * ch_dtype, *_dt: CH_F32, CH_BF16 or CH_F16; a + b in f32, rounded to                         \
     * sum_dt), then layernorm's y (in y_dt), mean and rstd of the sum as                          \
     * stored; sum may be a or b (the same memory and format, in place).                           \
     * CH_ERR_UNSUPPORTED (a format it does not take): the core runs ch_add                        \
     * and ch_layernorm. Without it the core does the same. */                                     \
    X(OP, OPTIONAL, ch_status, add_layernorm, (void *stream, int64_t rows, int64_t d, float eps,   \
        ch_dtype sum_dt, ch_dtype y_dt, ch_dtype a_dt, ch_dtype b_dt, ch_bmem sum, ch_bmem y,      \
        ch_bmem mean, ch_bmem rstd, ch_bmem a, ch_bmem b, ch_bmem gamma, ch_bmem beta))            \
    /* optional: ch_layernorm_backward_add: layernorm_backward's dgamma and                        \
     * dbeta, and dx (dx_dt) = its dx as f32 + dres (dres_dt; ptr NULL: none)                      \
     * in f32, rounded once; dy in dy_dt, x in x_dt. dres may be dx (the same                      \
     * memory and format). CH_ERR_UNSUPPORTED, or a NULL slot: the core runs                       \
     * layernorm_backward into an f32 temporary and ch_add (or ch_cast). */                        \
    X(OP, OPTIONAL, ch_status, layernorm_backward_add, (void *stream, int64_t rows, int64_t d,     \
        ch_dtype dx_dt, ch_dtype dy_dt, ch_dtype dres_dt, ch_dtype x_dt, ch_bmem dx,               \
        ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem dres, ch_bmem x, ch_bmem mean,          \
        ch_bmem rstd, ch_bmem gamma))                                                              \
    /* a, b seen as [outer, c, inner]; sums [2c + 1]; a centre's ptr NULL: 0 */                    \
    X(OP, OP, ch_status, channel_sums, (void *stream, int64_t outer, int64_t c, int64_t inner,     \
        ch_bmem sums, ch_bmem a, ch_bmem a_center, ch_bmem b, ch_bmem b_center))                   \
    /* sums.ptr NULL: evaluation (from the running statistics); running_*.ptr                      \
     * NULL: not updated */                                                                        \
    X(OP, OP, ch_status, batchnorm_stats, (void *stream, int64_t c, float momentum, float eps,     \
        ch_bmem mean, ch_bmem rstd, ch_bmem running_mean, ch_bmem running_var, ch_bmem sums,       \
        ch_bmem center))                                                                           \
    X(OP, OP, ch_status, batchnorm_forward, (void *stream, int64_t outer, int64_t c,               \
        int64_t inner, ch_bmem y, ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma,            \
        ch_bmem beta))                                                                             \
    /* dx.ptr NULL: not wanted */                                                                  \
    X(OP, OP, ch_status, batchnorm_backward, (void *stream, int64_t outer, int64_t c,              \
        int64_t inner, ch_bmem dx, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x,           \
        ch_bmem mean, ch_bmem rstd, ch_bmem gamma, ch_bmem local, ch_bmem total))                  \
    /* Conversions between f32 and the half formats: n elements of x into y,                       \
     * y and x apart: round to nearest, ties to even; infinities and signed                        \
     * zeros kept; a NaN narrowed becomes a quiet NaN with its sign and the top                    \
     * bits of its payload, widened it keeps its bits; f32 subnormals and the                      \
     * formats' own subnormals as IEEE 754 says. The bits are those of                             \
     * lib/kernels/half_bits.h's functions, the same on every backend. */                          \
    X(OP, OP, ch_status, f32_to_bf16, (void *stream, int64_t n, ch_bmem y, ch_bmem x))             \
    X(OP, OP, ch_status, bf16_to_f32, (void *stream, int64_t n, ch_bmem y, ch_bmem x))             \
    X(OP, OP, ch_status, f32_to_f16, (void *stream, int64_t n, ch_bmem y, ch_bmem x))              \
    X(OP, OP, ch_status, f16_to_f32, (void *stream, int64_t n, ch_bmem y, ch_bmem x))              \
    /* optional, all three or none: a backend's own 2-D convolution: x [N, C,                      \
     * H, W] by w [O, C, kh, kw] (out_channels = O) into y [N, O, OH, OW], no                      \
     * bias. When these slots are NULL the core composes im2col, gemm and                          \
     * transpose01 (what the OpenCL and CUDA backends get); a backend that can                     \
     * do better, such as the host working one sample at a time in its cache,                      \
     * or a backend on cuDNN or MIOpen, fills all three. conv2d_workspace says                     \
     * how many bytes of scratch the next call on this thread needs (backward:                     \
     * for conv2d_backward with the gradients `want` names, bit 0 dx, bit 1                        \
     * dw); the core passes that much device memory as ws (ptr NULL when 0). */                    \
    X(OP, OPTIONAL, ch_status, conv2d_workspace, (void *stream, const ch_conv_geom *g,             \
        int64_t out_channels, int backward, int want, size_t *bytes))                              \
    X(OP, OPTIONAL, ch_status, conv2d_forward, (void *stream, const ch_conv_geom *g,               \
        int64_t out_channels, ch_bmem y, ch_bmem x, ch_bmem w, ch_bmem ws, size_t ws_bytes))       \
    /* dx = the input gradient (dx.ptr NULL: not wanted); dw = beta * dw +                         \
     * the weight gradient (dw.ptr NULL: not wanted; beta 0 does not read dw) */                   \
    X(OP, OPTIONAL, ch_status, conv2d_backward, (void *stream, const ch_conv_geom *g,              \
        int64_t out_channels, ch_bmem dx, ch_bmem dw, float beta, ch_bmem dy, ch_bmem x,           \
        ch_bmem w, ch_bmem ws, size_t ws_bytes))                                                   \
    /* optional: gemm_batched's product (count matrices; count 1 is one GEMM                       \
     * and the strides are then not used) with A and B in `ab` (CH_BF16 or                         \
     * CH_F16) and C in `cd` (CH_F32 or ab), the products summed in f32 (tensor                    \
     * cores where there are some). A combination the backend does not run                         \
     * returns CH_ERR_UNSUPPORTED: the core then widens A and B to f32 (the                        \
     * conversion slots above) and runs gemm or gemm_batched, so every backend                     \
     * multiplies half tensors, this slot only faster. bias (ptr NULL: none;                      \
     * count 1, beta 0, C f32 or ab): f32 [n] added to every row of C before                       \
     * a half C is rounded (ch_gemm_bias); CH_ERR_UNSUPPORTED where the                            \
     * backend does not fuse it and the core adds it apart. */                                     \
    X(OP, OPTIONAL, ch_status, gemm_half, (void *stream, int ab, int cd, int trans_a, int trans_b, \
        int64_t count, int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,       \
        int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b, float beta, ch_bmem c,         \
        int64_t ldc, int64_t stride_c, ch_bmem bias))                                              \
    /* optional: C = act(alpha op(A) op(B) + bias) of one product                                  \
     * (ch_gemm_bias_act), A and B in `ab` (CH_F32, CH_BF16 or CH_F16), C in                       \
     * `cd` (CH_F32 or ab), bias f32 [n]; pre (ptr NULL: not wanted) gets                          \
     * alpha op(A) op(B) + bias in cd, row stride ldc like C's. No two of C,                       \
     * pre and the inputs overlap. CH_ERR_UNSUPPORTED for what the backend                         \
     * does not fuse: the core then runs ch_gemm_bias into pre (or C) and                          \
     * ch_activation_forward into C. */                                                            \
    X(OP, OPTIONAL, ch_status, gemm_bias_act, (void *stream, int ab, int cd, ch_activation act,    \
        int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a,         \
        int64_t lda, ch_bmem b, int64_t ldb, ch_bmem c, int64_t ldc, ch_bmem pre, ch_bmem bias))   \
    /* optional: the three convolution slots above with their inputs in `dt`                       \
     * (CH_BF16 or CH_F16): forward x and w; backward dy, x and w. The outputs                     \
     * (y; dx, dw) stay f32 and the products are summed in f32. When the                           \
     * workspace query returns CH_ERR_UNSUPPORTED (a format or shape the                           \
     * backend does not run) the core widens the inputs on the device and runs                     \
     * the f32 convolution, so every backend takes half inputs, this only                          \
     * faster. */                                                                                  \
    X(OP, OPTIONAL, ch_status, conv2d_half_workspace, (void *stream, const ch_conv_geom *g,        \
        int64_t out_channels, int dt, int backward, int want, size_t *bytes))                      \
    X(OP, OPTIONAL, ch_status, conv2d_half_forward, (void *stream, const ch_conv_geom *g,          \
        int64_t out_channels, int dt, ch_bmem y, ch_bmem x, ch_bmem w, ch_bmem ws,                 \
        size_t ws_bytes))                                                                          \
    X(OP, OPTIONAL, ch_status, conv2d_half_backward, (void *stream, const ch_conv_geom *g,         \
        int64_t out_channels, int dt, ch_bmem dx, ch_bmem dw, float beta, ch_bmem dy, ch_bmem x,   \
        ch_bmem w, ch_bmem ws, size_t ws_bytes))                                                   \
    /* ---- collectives (optional) ---- */                                                         \
    /* In-place sum of `n` floats over `count` buffers of this backend:                            \
     * bufs[i] lives on the device of streams[i] and the work is queued on                         \
     * streams[i], after what each stream already holds; every buffer ends                         \
     * with the sum. Called with count >= 2, n >= 1, buffers that do not                           \
     * overlap, and devices can_allreduce accepted; a device may be listed                         \
     * more than once (on distinct streams). Used by ch_reducer (peer mode;                        \
     * NCCL for CUDA). Without it peer reduction is refused for the backend                        \
     * and host-staged reduction works. */                                                         \
    X(COLLECTIVE, OPTIONAL, ch_status, allreduce_sum, (int count, void *const *streams,            \
        const ch_bmem *bufs, int64_t n))                                                           \
    /* 1 when allreduce_sum may take a buffer on dev_a and one on dev_b in the                     \
     * same call, 0 otherwise. The same device twice is always allowed; when                       \
     * this slot is NULL, only that. */                                                            \
    X(COLLECTIVE, OPTIONAL, int, can_allreduce, (void *dev_a, void *dev_b))                        \
    /* A communicator that spans the processes of a job (NCCL's, between CUDA                      \
     * devices of several processes and machines). One process makes an id of                      \
     * span_id_bytes bytes (span_id) and every process gets a copy (over MPI,                      \
     * by the caller); then each process makes the communicators of its                            \
     * `count` participants (span_new: devs[i] takes rank ranks[i] of the                          \
     * job's `nranks`, every device at most once in the job), which waits                          \
     * until every process has called it. span_allreduce sums, in place, the                       \
     * buffers of every participant of every process: each process passes its                      \
     * own participants' streams and buffers, in the order of span_new, the                        \
     * work queued on those streams. */                                                            \
    X(COLLECTIVE, OPTIONAL, ch_status, span_id, (void *id))                                        \
    X(COLLECTIVE, OPTIONAL, ch_status, span_new, (void **span, int count, void *const *devs,       \
        const int *ranks, int nranks, const void *id))                                             \
    X(COLLECTIVE, OPTIONAL, ch_status, span_allreduce, (void *span, int count,                     \
        void *const *streams, const ch_bmem *bufs, int64_t n))                                     \
    X(COLLECTIVE, OPTIONAL, void, span_free, (void *span))
/* clang-format on */

/* Which kind a slot is, as 0 or 1, for code generated from the list:
 * CH_SLOT_IS_##kind##_REQUIRED and CH_SLOT_IS_##kind##_OP. */
#define CH_SLOT_IS_REQUIRED_REQUIRED 1
#define CH_SLOT_IS_OPTIONAL_REQUIRED 0
#define CH_SLOT_IS_OP_REQUIRED 0
#define CH_SLOT_IS_REQUIRED_OP 0
#define CH_SLOT_IS_OPTIONAL_OP 0
#define CH_SLOT_IS_OP_OP 1

/* `ret prefix##name params;`: a backend header's prototype of its
 * function for one slot. A header picks the groups its functions follow
 * the naming for, e.g. (backends/host/host.h):
 *   #define CHI_HOST_OP(ret, name, params) CH_SLOT_PROTOTYPE(chi_host_, ret, name, params)
 *   #define CHI_HOST_DEVICE(ret, name, params)
 *   ...
 *   #define CHI_HOST_SLOT(group, kind, ret, name, params) CHI_HOST_##group(ret, name, params)
 *   CH_BACKEND_SLOTS(CHI_HOST_SLOT)
 * A slot the backend leaves NULL is declared and never defined, which C
 * allows as long as nothing takes its address. */
#define CH_SLOT_PROTOTYPE(prefix, ret, name, params) ret prefix##name params;

#define CH_SLOT_MEMBER(group, kind, ret, name, params) ret(*name) params;

typedef struct ch_backend_i {
    uint32_t abi_version; /* CH_BACKEND_ABI_VERSION */
    const char *name;     /* "host", "opencl", "cuda": the device ids' prefix */
    /* Which backend keeps a device that two backends expose (the same PCI
     * bus id, e.g. an NVIDIA GPU through CUDA and through OpenCL): the
     * higher priority; the other is hidden as a duplicate. It also orders
     * the device list (host first, then by priority, then by name). The
     * built-in ones: host 100, cuda 50, opencl 10. A backend that drives a
     * device through its vendor's own API should rank above one through a
     * portable API. */
    int priority;
    /* The size of span_id's id, 0 when the backend has no span slots. */
    size_t span_id_bytes;
    CH_BACKEND_SLOTS(CH_SLOT_MEMBER)
} ch_backend_i;

typedef const ch_backend_i *(*ch_backend_entry_fn)(void);

/* ---- Services the core offers to backends -------------------------------- */

/* A backend's answer to an enum value it does not know: `value` of enum
 * `what` at or beyond the `count` the module was built with. */
static inline ch_status chi_unknown_enum(const char *backend, const char *slot,
                                         const char *what, int value, int count)
{
    return chi_error(CH_ERR_UNSUPPORTED,
                     "%s %s: %s %d is unknown to this module (it knows 0 to %d; backend "
                     "ABI version %d)",
                     backend, slot, what, value, count - 1, CH_BACKEND_ABI_VERSION);
}

/* What every backend answers for a label outside [0, classes) in the
 * softmax-cross-entropy slots: `row` is the first row that has one. */
static inline ch_status chi_bad_label(const char *fn, int64_t row, int64_t label,
                                      int64_t classes)
{
    return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: labels[%lld] = %lld is out of [0, %lld)", fn,
                     (long long)row, (long long)label, (long long)classes);
}

/* What every backend answers for an embedding index outside [0, rows):
 * `i` is the first position that has one. */
static inline ch_status chi_bad_index(const char *fn, int64_t i, int64_t index, int64_t rows)
{
    return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: idx[%lld] = %lld is out of [0, %lld)", fn,
                     (long long)i, (long long)index, (long long)rows);
}

/* Memory a backend allocates for one of its devices by itself, outside
 * the core's allocator (the alloc slot), told to the core so that
 * ch_device_memory_stats counts it and ch_device_set_memory_limit holds
 * it. `dev` is the device context device_open returned.
 *
 * Workspace (device memory: scratch, check words): reserve before the
 * driver's allocation, release after its free (or after a failed
 * allocation) with the same byte count. A reservation that would take
 * the device beyond its limit empties the allocator's cache, and fails
 * with CH_ERR_DEVICE_OUT_OF_MEMORY and the limit's message when that is
 * not enough; `what` names the request in it ("scratch"). Reserved bytes
 * count as in use. Staging (page-locked host memory kept for the
 * device's transfers) is only counted, never refused. Exported for the
 * backend modules, which call them once device_open has returned (the
 * core does not know the context before: nothing would be counted). */
CH_API ch_status chi_workspace_reserve(void *dev, size_t bytes, const char *what);
CH_API void chi_workspace_release(void *dev, size_t bytes);
CH_API void chi_staging_add(void *dev, size_t bytes);
CH_API void chi_staging_remove(void *dev, size_t bytes);

/* The process's math mode, ch_math_set's flags (CH_MATH_TF32), read by a
 * backend at each product it runs: a change applies from the next one. */
CH_API unsigned chi_math_flags(void);

/* Whether `value` is one of the `count` values of its enum. */
static inline int chi_enum_known(int value, int count)
{
    return value >= 0 && value < count;
}

/* The host backend's table (built into libchorus). */
const ch_backend_i *chi_host_backend(void);

/* The summing kernel of the core's host-staged all-reduce (lib/sum_spread.c),
 * for the host backend's allreduce_sum too (not exported: the host backend
 * is built into libchorus): dst[i] = src[0][i] + src[1][i] + ... +
 * src[nsrc - 1][i], added left to right (the same bits on every run and
 * thread count), then copies[c][i] = dst[i], for i < n; in parallel over
 * fixed chunks. dst may be src[0] or a copy; nothing else may overlap. */
void chi_sum_spread(int64_t n, float *dst, int nsrc, const float *const *src, int ncopies,
                    float *const *copies);
/* The bf16 all-reduce's (lib/reduce.c), over elements [from, from + n) of
 * every array: each source bf16 (is_bf16[k]) or f32 rounded to bf16
 * first, summed left to right in f32 into t32 (may be NULL), that sum
 * rounded to bf16 into t16 (may be NULL) and into the f32 copies
 * (rounded, then widened), tile by tile while in cache (a copy may be a
 * source). The same chunks as chi_sum_spread. */
void chi_sum_bf16(int64_t from, int64_t n, int nsrc, const void *const *src,
                  const int *is_bf16, float *t32, uint16_t *t16, int ncopies,
                  float *const *copies);

#ifdef __cplusplus
}
#endif

#endif
