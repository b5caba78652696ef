/* The OpenCL backend's private structures and the helpers its files share.
 *
 * Object graph: one backend context (chcl_backend) holds one chcl_platform per
 * OpenCL platform, each with one cl_context over all of its devices and the
 * programs built for that context. device_open gives a chcl_device (its limits,
 * an internal queue, its kernel objects); every stream is an in-order queue
 * on one device. */
#ifndef CHORUS_BACKENDS_OPENCL_H
#define CHORUS_BACKENDS_OPENCL_H

/* Stay on the OpenCL 1.2 API so older Intel and AMD drivers work, and so the
 * headers do not flag the 1.2 calls as deprecated. */
#define CL_TARGET_OPENCL_VERSION 120

#include <pthread.h>
#include <stdatomic.h>
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include "backend.h"

/* The programs, one per .cl file, each built once per context on first use. */
typedef enum chcl_prog_id {
    CHCL_P_ELEMENTWISE,
    CHCL_P_GEMM,
    CHCL_P_SUM,
    CHCL_P_SOFTMAX,
    CHCL_P_CONV,
    CHCL_P_RAND,
    CHCL_P_ATTENTION,
    CHCL_P_NORM,
    CHCL_P_PERMUTE,
    CHCL_P_FLASH,
    CHCL_P_COUNT
} chcl_prog_id;

/* Every kernel, each created once per device on first use. */
typedef enum chcl_kern_id {
    CHCL_K_BINARY,
    CHCL_K_AXPBY,
    CHCL_K_ACT_FORWARD,
    CHCL_K_ACT_BACKWARD,
    CHCL_K_BIAS_ADD,
    CHCL_K_TRANSPOSE01,
    CHCL_K_SGD_STEP,
    CHCL_K_ADAM_STEP,
    CHCL_K_GEMM,
    CHCL_K_GEMM_WG8,
    CHCL_K_GEMM_WG4,
    CHCL_K_GEMM_SIMPLE,
    CHCL_K_SUM_ITEM,
    CHCL_K_SUM_GROUP,
    CHCL_K_ARGMAX_ITEM,
    CHCL_K_ARGMAX_GROUP,
    CHCL_K_BIAS_GRAD,
    CHCL_K_SOFTMAX_ROWS,
    CHCL_K_MEAN,
    CHCL_K_SOFTMAX_BACKWARD,
    CHCL_K_XENT_FUSED,
    CHCL_K_XENT_FUSED_HALF,
    CHCL_K_IM2COL,
    CHCL_K_COL2IM,
    CHCL_K_MAXPOOL_FORWARD,
    CHCL_K_MAXPOOL_BACKWARD,
    CHCL_K_IM2COL_64,
    CHCL_K_COL2IM_64,
    CHCL_K_MAXPOOL_FORWARD_64,
    CHCL_K_MAXPOOL_BACKWARD_64,
    CHCL_K_RAND,
    CHCL_K_PERMUTE,
    CHCL_K_PERMUTE_64,
    CHCL_K_SOFTMAX_MASKED,
    CHCL_K_SOFTMAX_MASKED_BACKWARD,
    CHCL_K_EMBEDDING,
    CHCL_K_EMBEDDING_KEYS,
    CHCL_K_EMBEDDING_BACKWARD,
    CHCL_K_LAYERNORM,
    CHCL_K_LAYERNORM_DX,
    CHCL_K_LAYERNORM_PARAM_PART,
    CHCL_K_LAYERNORM_PARAM_SUM,
    CHCL_K_ADD_LAYERNORM,
    CHCL_K_LAYERNORM_DX_ADD,
    CHCL_K_CHANNEL_SUMS_PART,
    CHCL_K_CHANNEL_SUMS_FINISH,
    CHCL_K_BATCHNORM_STATS,
    CHCL_K_BATCHNORM_FORWARD,
    CHCL_K_BATCHNORM_PARAM_GRADS,
    CHCL_K_BATCHNORM_DX,
    CHCL_K_F32_TO_BF16,
    CHCL_K_BF16_TO_F32,
    CHCL_K_F32_TO_F16,
    CHCL_K_F16_TO_F32,
    CHCL_K_BIAS_GRAD_ROWS,
    CHCL_K_BIAS_GRAD_FINISH,
    CHCL_K_CHECK_VALUE,
    CHCL_K_BITONIC_GLOBAL,
    CHCL_K_BITONIC_LOCAL,
    /* flash.cl: the backward's first pass, then each kernel in its
     * variants in flash.c's order (head size 16, 32, 64, 128, any; any
     * without local memory) */
    CHCL_K_FLASH_D,
    CHCL_K_FLASH_FORWARD_16,
    CHCL_K_FLASH_FORWARD_32,
    CHCL_K_FLASH_FORWARD_64,
    CHCL_K_FLASH_FORWARD_128,
    CHCL_K_FLASH_FORWARD_ANY,
    CHCL_K_FLASH_FORWARD_GLOBAL,
    CHCL_K_FLASH_DQ_16,
    CHCL_K_FLASH_DQ_32,
    CHCL_K_FLASH_DQ_64,
    CHCL_K_FLASH_DQ_128,
    CHCL_K_FLASH_DQ_ANY,
    CHCL_K_FLASH_DQ_GLOBAL,
    CHCL_K_FLASH_DKV_16,
    CHCL_K_FLASH_DKV_32,
    CHCL_K_FLASH_DKV_64,
    CHCL_K_FLASH_DKV_128,
    CHCL_K_FLASH_DKV_ANY,
    CHCL_K_FLASH_DKV_GLOBAL,
    CHCL_K_COUNT
} chcl_kern_id;

/* The tiled GEMM kernels' work-groups (gemm.cl): WG x WG work-items, each
 * computing CHCL_GEMM_WPT x CHCL_GEMM_WPT outputs of a tile of
 * (WG * CHCL_GEMM_WPT)^2, for WG 16 (gemm), 8 (gemm_wg8) and 4 (gemm_wg4);
 * gemm_simple, one work-item per output and no local memory, is the
 * fallback for a device that runs none of them. */
#define CHCL_GEMM_WPT 4

/* Which GEMM the gemm slot uses (CHORUS_OPENCL_GEMM). */
typedef enum chcl_gemm_mode {
    CHCL_GEMM_AUTO,  /* CLBlast when built with it, ours where it refuses */
    CHCL_GEMM_OWN,
    CHCL_GEMM_CLBLAST
} chcl_gemm_mode;

typedef struct chcl_platform {
    cl_platform_id id;
    cl_context ctx;
    pthread_mutex_t lock;          /* guards progs */
    cl_program progs[CHCL_P_COUNT];
} chcl_platform;

/* Limits a test may impose on every device, below the device's own
 * (CHORUS_OPENCL_MAX_WORK_GROUP, CHORUS_OPENCL_LOCAL_MEM; 0: none), read
 * at init: the kernels then run as on a smaller device. */
typedef struct chcl_caps {
    size_t max_wg;
    cl_ulong local_mem;
} chcl_caps;

typedef struct chcl_backend {
    int nplatforms;
    chcl_platform *platforms;
    int ndevices;
    cl_device_id *devices;         /* backend index order */
    chcl_platform **device_platform;  /* the platform of each device */
    chcl_gemm_mode gemm_mode;
    chcl_caps caps;
} chcl_backend;

typedef struct chcl_pinned {
    void *host;
    cl_mem mem;
    struct chcl_pinned *next;
} chcl_pinned;

typedef struct chcl_device {
    chcl_backend *be;
    chcl_platform *plat;
    cl_device_id id;
    char name[128];
    cl_ulong max_alloc;
    cl_ulong global_mem;
    /* The limits every launch keeps to: the device's, lowered by the
     * backend's caps. */
    size_t max_wg;                 /* CL_DEVICE_MAX_WORK_GROUP_SIZE */
    size_t max_item[3];            /* CL_DEVICE_MAX_WORK_ITEM_SIZES, first 3 */
    cl_ulong local_mem;            /* CL_DEVICE_LOCAL_MEM_SIZE */
    /* cl_khr_fp64. No kernel uses double; one that does must check this
     * and keep a float path for the devices without it. */
    int has_fp64;
    cl_command_queue queue;        /* for mapping pinned memory */
    atomic_ullong allocated;       /* bytes in live buffers of this module */
    pthread_mutex_t lock;          /* guards kernels and their arguments, pinned */
    cl_kernel kernels[CHCL_K_COUNT];
    /* Per kernel, once created: CL_KERNEL_WORK_GROUP_SIZE (capped by
     * max_wg), CL_KERNEL_LOCAL_MEM_SIZE before any argument is set (its
     * __local variables), CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE. */
    size_t kernel_wg[CHCL_K_COUNT];
    cl_ulong kernel_local[CHCL_K_COUNT];
    size_t kernel_multiple[CHCL_K_COUNT];
    chcl_pinned *pinned;
} chcl_device;

/* A label or index check queued on a stream and not read yet (stream.c). */
typedef struct chcl_pending_check {
    const char *fn; /* the op, for the message */
    int index;      /* 1: an embedding index (chi_bad_index); 0: a label */
    int64_t limit;  /* classes, or the table's rows */
} chcl_pending_check;

/* Checks a stream holds before it waits on its own to read them. */
#define CHCL_CHECKS 32

typedef struct chcl_stream {
    chcl_device *dev;
    cl_command_queue queue;
    int profiling;                 /* CL_QUEUE_PROFILING_ENABLE: made while a trace ran */
    /* Device scratch for ops that need temporaries (row losses, partial
     * sums), one buffer grown to the largest request (memory.c). Held from
     * acquire until the op's commands that use it are queued: commands
     * queued later on this in-order queue run after them, so the next op
     * may reuse it. */
    pthread_mutex_t scratch_lock;
    cl_mem scratch; /* NULL until the first op needs one */
    size_t scratch_bytes;
    /* The label and index checks of the loss and embedding slots, read
     * where the stream is waited for anyway (stream.c): `checks` holds
     * CHCL_CHECKS pairs of words, the i-th pending check's at 2 i (the
     * position its kernel lowers, then the value found there), made at
     * the first check; a wait reads the pending pairs into check_host. */
    pthread_mutex_t check_lock;
    cl_mem checks;
    cl_uint check_host[2 * CHCL_CHECKS];
    chcl_pending_check pending[CHCL_CHECKS];
    int npending;
} chcl_stream;

typedef struct chcl_event {
    chcl_device *dev;
    cl_event ev;                   /* NULL until recorded */
    int profiling;                 /* ev's queue profiles: event_seconds can read it */
} chcl_event;

/* ---- error.c ---- */
const char *chcl_err_name(cl_int err);
/* chi_error with "<call>: <CL error name>" and the right status. */
ch_status chcl_err(cl_int err, const char *call);
/* The same naming what the call was on: "clCreateKernel(gemm): ...". */
ch_status chcl_err_on(cl_int err, const char *call, const char *what);
/* CH_ERR_LIMIT when a kernel would index `count` elements, beyond int. */
ch_status chcl_check_count(const char *op, int64_t count);

/* ---- program.c ---- */
/* One kernel argument: its size and where its value is (value NULL with a
 * size: that many bytes of local memory). */
typedef struct chcl_arg {
    size_t size;
    const void *value;
} chcl_arg;
#define CHCL_ARG(x) ((chcl_arg){sizeof(x), &(x)})
#define CHCL_LOCAL(bytes) ((chcl_arg){(bytes), NULL})

/* The largest power-of-two work-group size, at most `cap`, the kernel
 * allows on the stream's device with `per_item` bytes of local memory per
 * work-item beside its own __local variables (for tree reductions);
 * CH_ERR_LIMIT when not even one work-item fits in the local memory. */
ch_status chcl_group_size(chcl_stream *s, chcl_kern_id k, size_t cap, size_t per_item,
                          size_t *out);
/* The work-group of a reduction over `count` elements a group: the same
 * with the cap from the device rather than a constant: a power of two
 * giving each work-item at least 16 elements, but never below the kernel's
 * preferred multiple (a GPU's warp or wavefront), and as large as the
 * kernel, the device and local memory allow for long rows. */
ch_status chcl_reduce_group(chcl_stream *s, chcl_kern_id k, int64_t count, size_t per_item,
                            size_t *out);
/* Kernel `k`'s limits on the stream's device (built first if need be):
 * the most work-items of a work-group (CL_KERNEL_WORK_GROUP_SIZE under the
 * device's limits), per dimension (max_item), the local memory left
 * beside its own __local variables, and its preferred multiple
 * (CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE: a GPU's warp or
 * wavefront). */
typedef struct chcl_limits {
    size_t group;
    size_t item[3];
    cl_ulong local_room;
    size_t multiple;
} chcl_limits;
ch_status chcl_limits_of(chcl_stream *s, chcl_kern_id k, chcl_limits *out);
/* Whether the device runs kernel `k` in work-groups of local[0] x local[1]
 * x local[2] work-items with its __local variables (and no more): *fits 1
 * or 0; an error only when the kernel cannot be built. */
ch_status chcl_group_fits(chcl_stream *s, chcl_kern_id k, const size_t local[3], int *fits);
/* Set the arguments and enqueue `k` on the stream: `dims` dimensions of
 * `global` work-items, rounded up to multiples of `local` (local NULL: one
 * chosen by us, 1-D only). A work-group beyond the kernel's or the
 * device's limits, or local memory beyond the device's, is CH_ERR_LIMIT
 * naming the kernel, before anything is queued. */
ch_status chcl_launch(chcl_stream *s, chcl_kern_id k, int nargs, const chcl_arg *args,
                      int dims, const size_t *global, const size_t *local);
/* 1-D launch of n work-items. */
ch_status chcl_launch1(chcl_stream *s, chcl_kern_id k, int nargs, const chcl_arg *args,
                       int64_t n);
/* `groups` work-groups of `group` work-items (a size from chcl_group_size). */
ch_status chcl_launch_groups(chcl_stream *s, chcl_kern_id k, int nargs,
                             const chcl_arg *args, int64_t groups, size_t group);
void chcl_programs_release(chcl_platform *p);
void chcl_kernels_release(chcl_device *d);

/* A buffer as kernels take it: the cl_mem and an offset in 4-byte elements
 * (the kernels' f32 and i32 alike). CHCL_REF gives its two arguments. */
typedef struct chcl_ref {
    cl_mem mem;
    cl_ulong off;
} chcl_ref;
#define CHCL_REF(r) CHCL_ARG((r).mem), CHCL_ARG((r).off)

static inline cl_mem chcl_buf(ch_bmem m) { return (cl_mem)m.ptr; }
static inline chcl_ref chcl_ref_of(ch_bmem m)
{
    return (chcl_ref){(cl_mem)m.ptr, (cl_ulong)(m.off / 4)};
}

#define CHCL_COUNT_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The largest power of two at most n (n >= 1; 0 for 0), and the smallest
 * at least n (1 for n <= 1). */
static inline size_t chcl_pow2_floor(size_t n)
{
    size_t p = 1;
    if (n == 0)
        return 0;
    while (p <= n / 2)
        p *= 2;
    return p;
}
static inline size_t chcl_pow2_cover(int64_t n)
{
    size_t p = 1;
    while ((int64_t)p < n)
        p *= 2;
    return p;
}

/* How many spans, a work-group each, a reduction over `count` elements
 * takes: one per `each` elements, at least 1 and at most `most`. A
 * function of the shape alone, so the order of the sums is too. */
static inline int64_t chcl_spans(int64_t count, int64_t each, int64_t most)
{
    int64_t spans = count / each;
    return spans < 1 ? 1 : spans > most ? most : spans;
}

/* Labels and indices out of range, checked without waiting (stream.c).
 * A slot that checks calls chcl_check_begin, which takes the stream's next
 * check word and resets it to CHCL_CHECK_NONE, holding the stream's check
 * lock; its kernel lowers the word (atomic_min) to the first position
 * whose value is out of range; chcl_check_end queues check_value (the
 * value at that position, read now, before the buffer can change, into
 * the word after it), records the check, releases the lock and returns
 * `launched` or its own error. When the stream already holds CHCL_CHECKS
 * unread checks, begin first waits for the stream and reads them, and
 * returns the error they hold. */
#define CHCL_CHECK_NONE 0xffffffffu
ch_status chcl_check_begin(chcl_stream *s, chcl_ref *word);
ch_status chcl_check_end(chcl_stream *s, ch_status launched, chcl_ref word, ch_bmem values,
                         const char *fn, int index, int64_t limit);
/* Every wait on a stream that the core asks for (stream_sync, blocking
 * transfers) goes between these: chcl_wait_begin takes the check lock and
 * queues the pending checks' read; the caller queues its wait and hands
 * its status to chcl_wait_end, which (the queue runs in order: the read is
 * done too) reports the first check, in the order of the calls, that
 * found a bad value, with chi_bad_label or chi_bad_index, forgets them and
 * releases the lock. */
ch_status chcl_wait_begin(chcl_stream *s);
ch_status chcl_wait_end(chcl_stream *s, ch_status waited);
/* The stream is going: its check words too. */
void chcl_checks_drop(chcl_stream *s);

/* ---- The table's slots (lib/backend.h's list) ----
 * chcl_<slot> for every slot but the device ones (backend.c's statics), in
 * the file of its family: memory.c (memory and transfers), stream.c, ops.c
 * (elementwise, conversions, reductions, optimizers, random numbers),
 * conv.c (im2col, col2im, max pooling), gemm.c (with gemm_batched),
 * attention.c, flash.c (the fused attention), norm.c, allreduce.c. The
 * slots the table leaves NULL (the convolution, gemm_half, span_*) are
 * declared and not defined. */
#define CHCL_SLOT_DEVICE(ret, name, params)
#define CHCL_SLOT_MEMORY(ret, name, params) CH_SLOT_PROTOTYPE(chcl_, ret, name, params)
#define CHCL_SLOT_STREAM(ret, name, params) CH_SLOT_PROTOTYPE(chcl_, ret, name, params)
#define CHCL_SLOT_TRANSFER(ret, name, params) CH_SLOT_PROTOTYPE(chcl_, ret, name, params)
#define CHCL_SLOT_OP(ret, name, params) CH_SLOT_PROTOTYPE(chcl_, ret, name, params)
#define CHCL_SLOT_COLLECTIVE(ret, name, params) CH_SLOT_PROTOTYPE(chcl_, ret, name, params)
#define CHCL_SLOT(group, kind, ret, name, params) CHCL_SLOT_##group(ret, name, params)
CH_BACKEND_SLOTS(CHCL_SLOT)

/* Helpers beside the slots. */

/* memory.c */
/* A device buffer the backend keeps for itself, named `what` in a refusal
 * ("label check"): the device's workspace (chi_workspace_reserve), counted
 * and under its memory limit, until chcl_workspace_free (the same byte
 * count; OpenCL keeps the buffer alive until the commands queued on it
 * have run). */
ch_status chcl_workspace_new(chcl_device *d, const char *what, size_t bytes, cl_mem *out);
void chcl_workspace_free(chcl_device *d, cl_mem mem, size_t bytes);
/* The stream's scratch, at least `bytes` of it, for op `op`: *out is the
 * stream's one scratch buffer, grown first when it is smaller (never a
 * buffer per call). The caller holds it, and the stream's scratch lock,
 * until chcl_scratch_release, once the last command that uses it is
 * queued; on error nothing is held. */
ch_status chcl_scratch_acquire(chcl_stream *s, const char *op, size_t bytes, cl_mem *out);
void chcl_scratch_release(chcl_stream *s);
/* The stream is going: its scratch too. */
void chcl_scratch_drop(chcl_stream *s);

/* stream.c */
/* Makes `waiter` wait for everything queued on `producer` so far. */
ch_status chcl_stream_after(chcl_stream *waiter, chcl_stream *producer);

/* gemm.c */
/* CHORUS_OPENCL_GEMM: NULL or "" (auto), "own" or "clblast". */
ch_status chcl_gemm_mode_parse(const char *value, chcl_gemm_mode *mode);

/* ---- kernels.c (generated by Makefile.mk) ---- */

/* The enumerators that cross the backend ABI (read from ops.h and
 * backend.h), with the values this module was compiled with: program.c
 * hands them to every program as -D options, so the kernels name them as
 * the C code does. */
typedef struct chcl_enum_value {
    const char *name;
    int value;
} chcl_enum_value;
extern const chcl_enum_value chcl_enum_values[];
extern const int chcl_enum_count;

/* The sources: each .cl file, lib/philox.h and lib/kernels/' headers. */
extern const char chcl_src_common[];
extern const char chcl_src_elementwise[];
extern const char chcl_src_gemm[];
extern const char chcl_src_sum[];
extern const char chcl_src_softmax[];
extern const char chcl_src_conv[];
extern const char chcl_src_rand[];
extern const char chcl_src_attention[];
extern const char chcl_src_norm[];
extern const char chcl_src_philox[];
extern const char chcl_src_prelude[];
extern const char chcl_src_act[];
extern const char chcl_src_half_bits[];
extern const char chcl_src_optim_step[];
extern const char chcl_src_normalize[];
extern const char chcl_src_xent[];
extern const char chcl_src_index[];
extern const char chcl_src_permute[];
extern const char chcl_src_attn[];
extern const char chcl_src_flash[];

#endif
