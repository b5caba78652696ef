/* What the host's oneDNN files share (builds with oneDNN): the CPU engine
 * and the lock that guards it, the pool of streams with their scratchpads
 * (dnnl.c), and the small helpers that the convolution (dnnl_conv.c) and
 * the half-precision GEMM (dnnl_matmul.c) both use to make and run their
 * primitives. Each of those two keeps its own cache of primitives, under
 * the same lock, and empties it when the backend shuts down. */
#ifndef CHORUS_HOST_DNNL_IMPL_H
#define CHORUS_HOST_DNNL_IMPL_H

#include "host.h"

#ifdef HAVE_ONEDNN

#include <dnnl.h>
#include <pthread.h>

#define CHI_HOST_DNNL_MAX_ENTRIES 512 /* shapes each cache holds */
#define CHI_HOST_DNNL_ALIGN 64

/* Guards the engine, the pool and both caches. */
extern pthread_mutex_t chi_host_dnnl_lock;
/* The CPU engine: set by chi_host_dnnl_engine_locked, read unlocked by a
 * call whose lookup made it. */
extern dnnl_engine_t chi_host_dnnl_engine;

static inline size_t chi_host_dnnl_align_up(size_t x)
{
    return (x + CHI_HOST_DNNL_ALIGN - 1) / CHI_HOST_DNNL_ALIGN * CHI_HOST_DNNL_ALIGN;
}

/* The CPU engine, made on first use (the lock held); NULL, for good, when
 * oneDNN cannot make one. */
dnnl_engine_t chi_host_dnnl_engine_locked(void);

/* A user-mode scratchpad attribute (NULL when oneDNN cannot make one). */
dnnl_primitive_attr_t chi_host_dnnl_user_scratch_attr(void);

/* The scratchpad a primitive made from pd needs, in bytes. */
size_t chi_host_dnnl_scratch_of(const_dnnl_primitive_desc_t pd);

/* The error of a oneDNN call `what` that failed with s in host slot `slot`. */
ch_status chi_host_dnnl_fail(dnnl_status_t s, const char *slot, const char *what);

/* A stream and a matmul scratchpad for one call at a time: a call takes
 * one from the pool and gives it back, so the pool holds as many as calls
 * ran at once (one per thread running them) and a step's thousands of
 * calls make none. Freed when the backend shuts down. */
typedef struct chi_host_dnnl_ctx {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
    struct chi_host_dnnl_ctx *next;
} chi_host_dnnl_ctx;

/* A stream (with at least `scratch` bytes of scratchpad) for one call:
 * the pool's, or a new one. The engine exists: the call's lookup made it.
 * On an error *out may still hold one, to give back. */
ch_status chi_host_dnnl_ctx_take(chi_host_dnnl_ctx **out, size_t scratch, const char *slot);

/* Back to the pool (c may be NULL). */
void chi_host_dnnl_ctx_give(chi_host_dnnl_ctx *c);

/* Empty the convolution's cache and the matmul's (the lock held). */
void chi_host_dnnl_conv_clear_locked(void);
void chi_host_dnnl_matmul_clear_locked(void);

#endif

#endif
