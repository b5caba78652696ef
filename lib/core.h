/* The core's private structures. Backends see only backend.h. */
#ifndef CHORUS_LIB_CORE_H
#define CHORUS_LIB_CORE_H

#include <pthread.h>
#include <stdatomic.h>
#include "backend.h"

/* A device-side request that a fault-injection build (lib/fault.h) counts
 * and can make fail: CHI_INJECT(what, status, call) is `call`'s status, or
 * `status` with a message naming `what` when this is the point that fails.
 * Other builds call `call` and nothing else. */
#ifdef CHORUS_FAULT_INJECTION
#define CHI_FAULT(what) chi_fault_hit((what), __FILE__, __LINE__)
#else
#define CHI_FAULT(what) 0
#endif
#define CHI_INJECT(what, status, call)                                                   \
    (CHI_FAULT(what) ? chi_error((status), "%s failed (injected at %s:%d)", (what), __FILE__, \
                                 __LINE__)                                               \
                     : (call))

#define CH_MAX_BACKENDS 16
#define CH_MAX_DEVICES 64

typedef struct chi_backend {
    char name[16];
    const ch_backend_i *iface;  /* NULL when unavailable */
    void *ctx;
    void *dl;                   /* dlopen handle, NULL for host */
    int host_memory;            /* allocations are plain host pointers */
    int ndevices;
    char detail[512];           /* module path, or why it is unavailable */
} chi_backend;

/* A cached block of device memory. */
typedef struct chi_block {
    void *ptr;
    size_t bytes;
    void *ready;                /* event: the last use of the block, or NULL */
    struct chi_block *next;
} chi_block;

/* The per-device caching allocator: freed blocks are kept in size classes
 * (four per power of two from 512 bytes, so a block wastes under 19%) and reused.
 * `stats` holds the device's whole account and its limit (limit_bytes). */
#define CH_ALLOC_CLASSES 128
typedef struct chi_allocator {
    pthread_mutex_t lock;
    chi_block *free_list[CH_ALLOC_CLASSES];
    ch_memory_stats stats;
} chi_allocator;

/* Copies into a device from other devices, by path (ch_transfer_stats). */
typedef struct chi_transfers {
    atomic_uint_least64_t peer_copies, peer_bytes;
    atomic_uint_least64_t staged_copies, staged_bytes;
} chi_transfers;

/* A device's clock against ch_clock_seconds for the running trace
 * (lib/trace_clock.c): device seconds + offset = ch_clock_seconds, give or
 * take uncertainty. */
typedef struct chi_clock {
    pthread_mutex_t lock; /* held while measuring: other askers wait */
    unsigned generation;  /* chi_trace_generation it holds; 0: none yet */
    double offset, uncertainty;
} chi_clock;

struct ch_device {
    int index;
    char id[32];
    chi_backend *be;
    int be_index;
    void *dev;                  /* the backend's device context */
    ch_device_info info;
    ch_stream *default_stream;
    pthread_mutex_t streams_lock;
    ch_stream *streams;         /* every live stream, for ch_device_sync */
    chi_allocator alloc;
    pthread_mutex_t staging_lock; /* guards the staging buffer */
    void *staging;              /* pinned host memory for cross-device copies */
    size_t staging_bytes;
    chi_transfers transfers;
    chi_clock clock;
};

struct ch_stream {
    ch_device *dev;
    void *handle;
    int is_default;
    ch_stream *next;            /* in dev->streams */
};

struct ch_event {
    ch_device *dev;
    void *handle;
};

struct ch_host_buffer {
    ch_device *dev;
    void *ptr;
    size_t bytes;
    int pinned;                 /* 0: malloc'd (backend has no host_alloc) */
};

/* Device memory shared by a tensor and its views. */
typedef struct chi_buffer {
    ch_device *dev;
    void *ptr;
    size_t bytes;
    size_t asked; /* what the tensor asked for, before rounding */
    atomic_int refs;
    /* Set from one counter of the process at creation and at every
     * chi_mem (lib/stamp.h): equal stamps mean the same buffer, unused
     * since. */
    atomic_uint_least64_t stamp;
} chi_buffer;

struct ch_tensor {
    ch_device *dev;
    chi_buffer *buf;
    size_t off;                 /* bytes into buf */
    ch_dtype dtype;
    int ndim;
    int64_t shape[CH_MAX_DIMS];
    int64_t numel;
};

/* ---- core internals ---- */
int chi_initialized(void);
unsigned chi_generation(void);   /* changes with every ch_init */
void *chi_topology(void);        /* hwloc topology or NULL */

ch_status chi_stream_create(ch_stream **out, ch_device *dev, int is_default);
void chi_stream_destroy(ch_stream *s);
ch_status chi_stream_sync_all(ch_device *dev);
/* The backend's stream to queue work for `dev` on, for this thread. */
void *chi_current_stream(ch_device *dev);
/* t's memory for a backend call, which reads or writes it: moves t's
 * buffer's stamp. Code that reaches the memory otherwise calls chi_touch. */
ch_bmem chi_mem(const ch_tensor *t);
void chi_touch(const ch_tensor *t);

/* Half storage for the ops that compute in f32 (lib/ops_half.c): when any
 * of the n tensors (NULLs allowed) is bf16 or f16, runs op on f32 copies
 * of them (role: CHI_HALF_IN read, CHI_HALF_OUT written, or both), rounds
 * the written ones back, sets *handled and returns op's status; otherwise
 * returns CH_OK with *handled 0 and the caller goes on in f32. */
#define CHI_HALF_IN 1
#define CHI_HALF_OUT 2
typedef ch_status (*chi_f32_op)(const void *ctx, ch_tensor *const *t);
ch_status chi_half_call(int n, ch_tensor *const *t, const int *role, chi_f32_op op,
                        const void *ctx, int *handled);
/* At an op's start: the op on f32 copies when a tensor is half. */
#define CHI_HALF_ENTRY(roles, op, ctx, ...)                                              \
    do {                                                                               \
        ch_tensor *const half_t_[] = {__VA_ARGS__};                                    \
        int half_h_;                                                                   \
        ch_status half_s_ = chi_half_call((int)(sizeof half_t_ / sizeof half_t_[0]),   \
                                          half_t_, roles, op, ctx, &half_h_);          \
        if (half_h_)                                                                   \
            return half_s_;                                                            \
    } while (0)
#define CHI_T(x) ((ch_tensor *)(x))
enum { CHI_IO = CHI_HALF_IN | CHI_HALF_OUT };

/* An op on the host for a backend that leaves its slot NULL
 * (lib/ops_fallback.c; SLOT_OR_HOST in lib/opcheck.h). */
typedef struct chi_staged {
    ch_tensor *t; /* NULL: an optional tensor left out */
    int role;     /* CHI_HALF_IN, CHI_HALF_OUT or both */
} chi_staged;
/* Says once per (device, slot) that `dev` runs `slot` on the host, then
 * makes on_host[i], a host tensor of staged[i]'s dtype and shape, for
 * each tensor (arguments naming the same memory share one), with its
 * values downloaded when it is read: a blocking download, after the work
 * queued on the device's current stream. On failure nothing is left. */
ch_status chi_fallback_stage(const char *fn, const char *slot, ch_device *dev,
                             const chi_staged *staged, int n, ch_tensor **on_host);
/* After the op ran on the host with status `st`: when CH_OK, uploads the
 * outputs (blocking: done for every stream of the device when it
 * returns); frees the host tensors either way. Returns st or the upload's
 * error. */
ch_status chi_fallback_finish(ch_status st, const chi_staged *staged, int n, ch_tensor **on_host);
/* The host device for the fallback: the visible one, or one opened for
 * this alone when CHORUS_DEVICES leaves host out (lib/device.c). */
ch_device *chi_host_device(void);
/* Forget the (device, op) pairs at ch_shutdown. */
void chi_fallback_reset(void);

/* ch_gemm and ch_gemm_batched with half tensors (lib/ops.c). */
ch_status chi_gemm_dtypes(const char *fn, const ch_tensor *c, const ch_tensor *a,
                          const ch_tensor *b);
ch_status chi_gemm_half(const char *fn, ch_tensor *c, int trans_a, int trans_b, float alpha,
                        const ch_tensor *a, const ch_tensor *b, float beta, int64_t count,
                        int64_t m, int64_t n, int64_t k);
/* x as f32: x itself when it is f32, else *tmp, a new f32 copy (with x's
 * values when `fill`), for the caller to free (lib/ops.c; the half GEMM's
 * and the half convolution's). */
ch_status chi_widened(const ch_tensor *x, int fill, ch_tensor **tmp, ch_tensor **out);

ch_status chi_alloc(ch_device *dev, size_t bytes, void **ptr);
void chi_free(ch_device *dev, void *ptr, size_t bytes);
/* A tensor's own bytes (before its size class) come or go:
 * ch_memory_stats.tensor_bytes. */
void chi_alloc_note_tensor(ch_device *dev, size_t bytes, int freed);
void chi_alloc_init(chi_allocator *a);
/* The size chi_alloc really allocates for a request of `bytes`. */
size_t chi_alloc_round(size_t bytes);
void chi_alloc_release(ch_device *dev);

/* CHORUS_TF32 (0 or 1) into the math mode; at ch_init (lib/math_mode.c). */
ch_status chi_math_from_env(void);
/* ch_device_reset_peak and ch_device_set_memory_limit, under the lock. */
void chi_alloc_reset_peak(ch_device *dev);
void chi_alloc_set_limit(ch_device *dev, uint64_t bytes);
/* Host memory held (`held` 1) or given back (0) for dev's transfers:
 * ch_memory_stats.staging_bytes. */
void chi_alloc_staging(ch_device *dev, size_t bytes, int held);
/* The open device whose backend context is `bdev` (lib/device.c), NULL
 * when there is none: what the backends' chi_workspace_* and chi_staging_*
 * calls name. */
ch_device *chi_device_of(const void *bdev);

/* Copy between tensors on different devices. */
ch_status chi_copy_across(ch_tensor *dst, const ch_tensor *src);

#endif
