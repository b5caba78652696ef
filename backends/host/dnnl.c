/* oneDNN on the host, when the build has oneDNN: what its convolution
 * (dnnl_conv.c) and its half-precision GEMM (dnnl_matmul.c) share, that
 * is the CPU engine, the pool of streams and scratchpads the calls take
 * one from, the helpers that make primitives, and the shutdown that frees
 * it all with both caches of primitives (dnnl_impl.h says what each is). */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "host.h"

#ifdef HAVE_ONEDNN

#include "dnnl_impl.h"

#include <stdlib.h>

pthread_mutex_t chi_host_dnnl_lock = PTHREAD_MUTEX_INITIALIZER;
dnnl_engine_t chi_host_dnnl_engine;
static int engine_failed;
static chi_host_dnnl_ctx *ctxs; /* the pool's idle ones */

void chi_host_dnnl_shutdown(void)
{
    pthread_mutex_lock(&chi_host_dnnl_lock);
    chi_host_dnnl_conv_clear_locked();
    chi_host_dnnl_matmul_clear_locked();
    while (ctxs) {
        chi_host_dnnl_ctx *c = ctxs;
        ctxs = c->next;
        dnnl_stream_destroy(c->stream);
        free(c->scratch);
        free(c);
    }
    if (chi_host_dnnl_engine)
        dnnl_engine_destroy(chi_host_dnnl_engine);
    chi_host_dnnl_engine = NULL;
    engine_failed = 0;
    pthread_mutex_unlock(&chi_host_dnnl_lock);
}

dnnl_primitive_attr_t chi_host_dnnl_user_scratch_attr(void)
{
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return NULL;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) !=
        dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

size_t chi_host_dnnl_scratch_of(const_dnnl_primitive_desc_t pd)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

dnnl_engine_t chi_host_dnnl_engine_locked(void)
{
    if (!chi_host_dnnl_engine && !engine_failed &&
        dnnl_engine_create(&chi_host_dnnl_engine, dnnl_cpu, 0) != dnnl_success) {
        chi_host_dnnl_engine = NULL;
        engine_failed = 1;
    }
    return chi_host_dnnl_engine;
}

ch_status chi_host_dnnl_fail(dnnl_status_t s, const char *slot, const char *what)
{
    return chi_error(s == dnnl_out_of_memory ? CH_ERR_OUT_OF_MEMORY : CH_ERR_INTERNAL,
                     "host %s (oneDNN): %s failed with oneDNN status %d", slot, what, (int)s);
}

ch_status chi_host_dnnl_ctx_take(chi_host_dnnl_ctx **out, size_t scratch, const char *slot)
{
    pthread_mutex_lock(&chi_host_dnnl_lock);
    chi_host_dnnl_ctx *c = ctxs;
    if (c)
        ctxs = c->next;
    pthread_mutex_unlock(&chi_host_dnnl_lock);
    if (!c) {
        if (!(c = calloc(1, sizeof *c)))
            return chi_error(CH_ERR_OUT_OF_MEMORY, "host %s: out of host memory", slot);
        dnnl_status_t s =
            dnnl_stream_create(&c->stream, chi_host_dnnl_engine, dnnl_stream_default_flags);
        if (s != dnnl_success) {
            free(c);
            return chi_host_dnnl_fail(s, slot, "dnnl_stream_create");
        }
    }
    if (scratch > c->scratch_bytes) {
        void *p = NULL;
        if (posix_memalign(&p, CHI_HOST_DNNL_ALIGN, scratch) != 0) {
            *out = c;
            return chi_error(CH_ERR_OUT_OF_MEMORY,
                             "host %s: %zu bytes for oneDNN's scratchpad "
                             "could not be allocated",
                             slot, scratch);
        }
        free(c->scratch);
        c->scratch = p;
        c->scratch_bytes = scratch;
    }
    *out = c;
    return CH_OK;
}

void chi_host_dnnl_ctx_give(chi_host_dnnl_ctx *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&chi_host_dnnl_lock);
    c->next = ctxs;
    ctxs = c;
    pthread_mutex_unlock(&chi_host_dnnl_lock);
}

#endif /* HAVE_ONEDNN */
