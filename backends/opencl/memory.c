/* Device buffers, pinned host memory and transfers. ch_bmem.ptr is a cl_mem;
 * its byte offset goes straight into the enqueue calls. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "opencl.h"

static ch_status buffer_new(chcl_device *d, cl_mem_flags flags, size_t bytes,
                            const char *what, cl_mem *out)
{
    /* Beyond the device's largest allocation the driver would refuse, or
     * worse, accept and fail later: say it now, without a driver call. */
    if (bytes > d->max_alloc)
        return chi_error(CH_ERR_LIMIT,
                         "opencl %s: %zu bytes on %s, beyond its largest allocation "
                         "(CL_DEVICE_MAX_MEM_ALLOC_SIZE = %llu bytes)",
                         what, bytes, d->name, (unsigned long long)d->max_alloc);
    cl_int err;
    cl_mem mem = clCreateBuffer(d->plat->ctx, flags, bytes, NULL, &err);
    if (err != CL_SUCCESS) {
        char size[160];
        snprintf(size, sizeof size, "%zu bytes on %s", bytes, d->name);
        return chcl_err_on(err, "clCreateBuffer", size);
    }
    *out = mem;
    return CH_OK;
}

ch_status chcl_alloc(void *dev, size_t bytes, void **ptr)
{
    chcl_device *d = dev;
    cl_mem mem = NULL;
    ch_status st = buffer_new(d, CL_MEM_READ_WRITE, bytes, "alloc", &mem);
    if (st != CH_OK)
        return st;
    atomic_fetch_add(&d->allocated, bytes);
    *ptr = mem;
    return CH_OK;
}

void chcl_free(void *dev, void *ptr)
{
    chcl_device *d = dev;
    size_t bytes = 0;
    if (clGetMemObjectInfo(ptr, CL_MEM_SIZE, sizeof bytes, &bytes, NULL) == CL_SUCCESS)
        atomic_fetch_sub(&d->allocated, bytes);
    clReleaseMemObject(ptr);
}

ch_status chcl_workspace_new(chcl_device *d, const char *what, size_t bytes, cl_mem *out)
{
    ch_status st = chi_workspace_reserve(d, bytes, what);
    if (st != CH_OK)
        return st;
    st = buffer_new(d, CL_MEM_READ_WRITE, bytes, what, out);
    if (st != CH_OK)
        chi_workspace_release(d, bytes);
    return st;
}

void chcl_workspace_free(chcl_device *d, cl_mem mem, size_t bytes)
{
    clReleaseMemObject(mem);
    chi_workspace_release(d, bytes);
}

void chcl_scratch_drop(chcl_stream *s)
{
    if (s->scratch)
        chcl_workspace_free(s->dev, s->scratch, s->scratch_bytes);
    s->scratch = NULL;
    s->scratch_bytes = 0;
}

/* The old buffer goes first, so that the new one fits where the two would
 * not; released, it lives on until the commands queued on it have run, so
 * growing waits for nothing. */
static ch_status scratch_grow(chcl_stream *s, const char *op, size_t bytes)
{
    char what[64];
    snprintf(what, sizeof what, "%s's scratch", op);
    chcl_scratch_drop(s);
    ch_status st = chcl_workspace_new(s->dev, what, bytes, &s->scratch);
    if (st != CH_OK)
        s->scratch = NULL;
    else
        s->scratch_bytes = bytes;
    return st;
}

ch_status chcl_scratch_acquire(chcl_stream *s, const char *op, size_t bytes, cl_mem *out)
{
    pthread_mutex_lock(&s->scratch_lock);
    /* A buffer is never empty (CL_INVALID_BUFFER_SIZE). */
    size_t need = bytes ? bytes : 1;
    ch_status st = need > s->scratch_bytes ? scratch_grow(s, op, need) : CH_OK;
    if (st != CH_OK) {
        pthread_mutex_unlock(&s->scratch_lock);
        return st;
    }
    *out = s->scratch;
    return CH_OK;
}

void chcl_scratch_release(chcl_stream *s)
{
    pthread_mutex_unlock(&s->scratch_lock);
}

/* Pinned memory: a buffer the driver places in host memory, mapped once for
 * the whole of its life; the mapped pointer is what the core sees. */
ch_status chcl_host_alloc(void *dev, size_t bytes, void **ptr)
{
    chcl_device *d = dev;
    chcl_pinned *p = malloc(sizeof *p);
    if (!p)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl host_alloc: %zu bytes", sizeof *p);
    ch_status st = buffer_new(d, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, bytes,
                              "host_alloc", &p->mem);
    if (st != CH_OK) {
        free(p);
        return st;
    }
    cl_int err;
    p->host = clEnqueueMapBuffer(d->queue, p->mem, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                 bytes, 0, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        clReleaseMemObject(p->mem);
        free(p);
        return chcl_err(err, "clEnqueueMapBuffer");
    }
    pthread_mutex_lock(&d->lock);
    p->next = d->pinned;
    d->pinned = p;
    pthread_mutex_unlock(&d->lock);
    *ptr = p->host;
    return CH_OK;
}

static chcl_pinned *pinned_take(chcl_device *d, void *host)
{
    pthread_mutex_lock(&d->lock);
    chcl_pinned **link = &d->pinned;
    while (*link && (*link)->host != host)
        link = &(*link)->next;
    chcl_pinned *p = *link;
    if (p)
        *link = p->next;
    pthread_mutex_unlock(&d->lock);
    return p;
}

void chcl_host_free(void *dev, void *ptr)
{
    chcl_device *d = dev;
    chcl_pinned *p = pinned_take(d, ptr);
    if (!p)
        return;
    /* Unmapping is queued; wait for it so the buffer is released unmapped. */
    if (clEnqueueUnmapMemObject(d->queue, p->mem, p->host, 0, NULL, NULL) == CL_SUCCESS)
        clFinish(d->queue);
    clReleaseMemObject(p->mem);
    free(p);
}

/* Blocking means done: the data is in the buffer, for every queue, when
 * this returns. OpenCL promises less for a blocking write: only that `host`
 * may be reused, and Intel's CPU runtime returns from writes of up to a few
 * hundred bytes once it has copied them aside, before the write has run;
 * a queue that reads the buffer next then sees the old bytes. So the
 * write's own event is waited for (docs/DESIGN.md, Streams). */
static ch_status upload(chcl_stream *s, ch_bmem dst, const void *host, size_t bytes, int blocking)
{
    cl_event done = NULL;
    cl_int err = clEnqueueWriteBuffer(s->queue, chcl_buf(dst), blocking ? CL_TRUE : CL_FALSE,
                                      dst.off, bytes, host, 0, NULL, blocking ? &done : NULL);
    if (err != CL_SUCCESS)
        return chcl_err(err, "clEnqueueWriteBuffer");
    if (!blocking)
        return CH_OK;
    err = clWaitForEvents(1, &done);
    clReleaseEvent(done);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clWaitForEvents(upload)");
}

/* A blocking transfer waits for the stream: the checks queued before it
 * are read there (reading the loss reports its labels). */
ch_status chcl_upload(void *stream, ch_bmem dst, const void *host, size_t bytes, int blocking)
{
    chcl_stream *s = stream;
    if (!blocking)
        return upload(s, dst, host, bytes, 0);
    ch_status st = chcl_wait_begin(s);
    if (st == CH_OK)
        st = upload(s, dst, host, bytes, 1);
    return chcl_wait_end(s, st);
}

ch_status chcl_download(void *stream, void *host, ch_bmem src, size_t bytes, int blocking)
{
    chcl_stream *s = stream;
    ch_status st = blocking ? chcl_wait_begin(s) : CH_OK;
    if (st == CH_OK) {
        cl_int err = clEnqueueReadBuffer(s->queue, chcl_buf(src), blocking ? CL_TRUE : CL_FALSE,
                                         src.off, bytes, host, 0, NULL, NULL);
        st = err == CL_SUCCESS ? CH_OK : chcl_err(err, "clEnqueueReadBuffer");
    }
    return blocking ? chcl_wait_end(s, st) : st;
}

static ch_status buffer_copy(chcl_stream *s, ch_bmem dst, ch_bmem src, size_t bytes)
{
    cl_int err = clEnqueueCopyBuffer(s->queue, chcl_buf(src), chcl_buf(dst), src.off,
                                     dst.off, bytes, 0, NULL, NULL);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clEnqueueCopyBuffer");
}

ch_status chcl_copy(void *stream, ch_bmem dst, ch_bmem src, size_t bytes)
{
    return buffer_copy(stream, dst, src, bytes);
}

/* Buffers belong to a context, not a device: inside one context the
 * runtime moves them between devices itself. */
int chcl_can_peer(void *src_dev, void *dst_dev)
{
    return ((chcl_device *)src_dev)->plat == ((chcl_device *)dst_dev)->plat;
}

ch_status chcl_peer_copy(void *stream, ch_bmem dst, void *src_dev, ch_bmem src,
                         size_t bytes)
{
    chcl_stream *s = stream;
    if (!chcl_can_peer(src_dev, s->dev))
        return chi_error(CH_ERR_INTERNAL,
                         "opencl peer_copy: %s and %s are in different platforms",
                         ((chcl_device *)src_dev)->name, s->dev->name);
    return buffer_copy(s, dst, src, bytes);
}
