/* Tensors: creation, views, and moving data between host and devices. */
#include "config.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "stamp.h"

#define STAGING_BYTES ((size_t)4 << 20)

const char *ch_dtype_name(ch_dtype dtype)
{
    switch (dtype) {
    case CH_F32: return "f32";
    case CH_I32: return "i32";
    case CH_BF16: return "bf16";
    case CH_F16: return "f16";
    }
    return "unknown";
}

size_t ch_dtype_size(ch_dtype dtype)
{
    switch (dtype) {
    case CH_F32:
    case CH_I32: return 4;
    case CH_BF16:
    case CH_F16: return 2;
    }
    return 0;
}

static atomic_uint_least64_t stamps;

static void stamp(chi_buffer *buf)
{
    atomic_store_explicit(&buf->stamp,
                          atomic_fetch_add_explicit(&stamps, 1, memory_order_relaxed) + 1,
                          memory_order_relaxed);
}

void chi_touch(const ch_tensor *t)
{
    stamp(t->buf);
}

ch_bmem chi_mem(const ch_tensor *t)
{
    stamp(t->buf);
    return (ch_bmem){t->buf->ptr, t->off};
}

uint64_t chi_tensor_stamp(const ch_tensor *t)
{
    return atomic_load_explicit(&t->buf->stamp, memory_order_relaxed);
}

/* Shape checks shared by new and reshape; *numel gets the product. */
static ch_status check_shape(const char *fn, int ndim, const int64_t *shape, size_t elem,
                             int64_t *numel)
{
    if (ndim < 1 || ndim > CH_MAX_DIMS)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: ndim is %d, expected 1 to %d", fn, ndim,
                         CH_MAX_DIMS);
    if (!shape)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: shape is NULL", fn);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 1)
            return chi_error(CH_ERR_INVALID_ARGUMENT,
                             "%s: shape[%d] is %lld, expected at least 1 (no zero-size tensors)",
                             fn, i, (long long)shape[i]);
        if (n > INT64_MAX / shape[i] || n * shape[i] > (int64_t)(SIZE_MAX / 2 / elem))
            return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: the shape's size overflows", fn);
        n *= shape[i];
    }
    *numel = n;
    return CH_OK;
}

static ch_tensor *tensor_alloc(ch_device *dev, ch_dtype dtype, int ndim, const int64_t *shape,
                               int64_t numel)
{
    ch_tensor *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->dev = dev;
    t->dtype = dtype;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->numel = numel;
    return t;
}

ch_status ch_tensor_new(ch_tensor **out, ch_device *dev, ch_dtype dtype, int ndim,
                        const int64_t *shape)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_new: out is NULL");
    *out = NULL;
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_tensor_new: call ch_init first");
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_new: dev is NULL");
    size_t elem = ch_dtype_size(dtype);
    if (elem == 0)
        return chi_error(CH_ERR_DTYPE, "ch_tensor_new: dtype %d is not a ch_dtype", (int)dtype);
    int64_t numel;
    ch_status st = check_shape("ch_tensor_new", ndim, shape, elem, &numel);
    if (st != CH_OK)
        return st;
    size_t bytes = (size_t)numel * elem;
    if (bytes > dev->info.max_alloc_bytes && dev->info.max_alloc_bytes)
        return chi_error(CH_ERR_LIMIT,
                         "ch_tensor_new: %zu bytes exceed %s's largest allocation (%llu bytes)",
                         bytes, dev->id, (unsigned long long)dev->info.max_alloc_bytes);
    chi_buffer *buf = calloc(1, sizeof *buf);
    ch_tensor *t = tensor_alloc(dev, dtype, ndim, shape, numel);
    if (!buf || !t) {
        free(buf);
        free(t);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_tensor_new: out of host memory");
    }
    buf->dev = dev;
    buf->bytes = chi_alloc_round(bytes);
    /* A size class above the device's largest allocation would turn a valid
     * request into a failure: such a block is allocated exactly (and not
     * cached). */
    if (dev->info.max_alloc_bytes && buf->bytes > dev->info.max_alloc_bytes)
        buf->bytes = bytes;
    st = chi_alloc(dev, buf->bytes, &buf->ptr);
    if (st != CH_OK) {
        free(buf);
        free(t);
        return st;
    }
    buf->asked = bytes;
    chi_alloc_note_tensor(dev, bytes, 0);
    atomic_init(&buf->refs, 1);
    stamp(buf);
    t->buf = buf;
    *out = t;
    return CH_OK;
}

void ch_tensor_free(ch_tensor *t)
{
    if (!t)
        return;
    chi_buffer *buf = t->buf;
    if (atomic_fetch_sub(&buf->refs, 1) == 1) {
        if (chi_initialized()) {
            chi_alloc_note_tensor(buf->dev, buf->asked, 1);
            chi_free(buf->dev, buf->ptr, buf->bytes);
        }
        free(buf);
    }
    free(t);
}

static ch_status new_view(ch_tensor **out, ch_tensor *src, size_t off, int ndim,
                          const int64_t *shape, int64_t numel, const char *fn)
{
    ch_tensor *v = tensor_alloc(src->dev, src->dtype, ndim, shape, numel);
    if (!v)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    v->buf = src->buf;
    v->off = off;
    atomic_fetch_add(&src->buf->refs, 1);
    *out = v;
    return CH_OK;
}

ch_status ch_tensor_view(ch_tensor **out, ch_tensor *src, int64_t start, int64_t count)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_view: out is NULL");
    *out = NULL;
    if (!src)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_view: src is NULL");
    if (start < 0 || count < 1 || start > src->shape[0] - count)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_tensor_view: %lld rows from row %lld are out of range for a first "
                         "dimension of %lld (expected count >= 1 inside it)",
                         (long long)count, (long long)start, (long long)src->shape[0]);
    int64_t row = src->numel / src->shape[0];
    int64_t shape[CH_MAX_DIMS];
    memcpy(shape, src->shape, sizeof shape);
    shape[0] = count;
    size_t off = src->off + (size_t)(start * row) * ch_dtype_size(src->dtype);
    return new_view(out, src, off, src->ndim, shape, count * row, "ch_tensor_view");
}

ch_status ch_tensor_reshape(ch_tensor **out, ch_tensor *src, int ndim, const int64_t *shape)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_reshape: out is NULL");
    *out = NULL;
    if (!src)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_reshape: src is NULL");
    int64_t numel;
    ch_status st = check_shape("ch_tensor_reshape", ndim, shape, ch_dtype_size(src->dtype),
                               &numel);
    if (st != CH_OK)
        return st;
    if (numel != src->numel)
        return chi_error(CH_ERR_SHAPE,
                         "ch_tensor_reshape: the new shape has %lld elements, src has %lld",
                         (long long)numel, (long long)src->numel);
    return new_view(out, src, src->off, ndim, shape, numel, "ch_tensor_reshape");
}

ch_device *ch_tensor_device(const ch_tensor *t) { return t ? t->dev : NULL; }
ch_dtype ch_tensor_dtype(const ch_tensor *t) { return t ? t->dtype : CH_F32; }
int ch_tensor_ndim(const ch_tensor *t) { return t ? t->ndim : 0; }
int64_t ch_tensor_numel(const ch_tensor *t) { return t ? t->numel : 0; }
size_t ch_tensor_nbytes(const ch_tensor *t)
{
    return t ? (size_t)t->numel * ch_dtype_size(t->dtype) : 0;
}

int64_t ch_tensor_dim(const ch_tensor *t, int dim)
{
    if (!t)
        return 0;
    if (dim < 0)
        dim += t->ndim;
    return dim >= 0 && dim < t->ndim ? t->shape[dim] : 0;
}

/* ---- Host <-> device ------------------------------------------------------- */

static ch_status check_transfer(const char *fn, const ch_tensor *t, const void *host,
                                const char *host_name, size_t bytes)
{
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "%s: call ch_init first", fn);
    if (!t)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: t is NULL", fn);
    if (!host)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, host_name);
    if (bytes != ch_tensor_nbytes(t))
        return chi_error(CH_ERR_SHAPE, "%s: bytes is %zu, the tensor holds %zu", fn, bytes,
                         ch_tensor_nbytes(t));
    return CH_OK;
}

ch_status ch_tensor_upload(ch_tensor *t, const void *src, size_t bytes)
{
    ch_status st = check_transfer("ch_tensor_upload", t, src, "src", bytes);
    if (st != CH_OK)
        return st;
    return t->dev->be->iface->upload(chi_current_stream(t->dev), chi_mem(t), src, bytes, 1);
}

ch_status ch_tensor_download(const ch_tensor *t, void *dst, size_t bytes)
{
    ch_status st = check_transfer("ch_tensor_download", t, dst, "dst", bytes);
    if (st != CH_OK)
        return st;
    return t->dev->be->iface->download(chi_current_stream(t->dev), dst, chi_mem(t), bytes, 1);
}

static ch_status check_async(const char *fn, const ch_tensor *t, const ch_host_buffer *hb,
                             const char *hb_name, size_t offset)
{
    ch_status st = check_transfer(fn, t, hb, hb_name, ch_tensor_nbytes(t));
    if (st != CH_OK)
        return st;
    if (offset > hb->bytes || hb->bytes - offset < ch_tensor_nbytes(t))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: %s holds %zu bytes, too few for %zu bytes from offset %zu", fn,
                         hb_name, hb->bytes, ch_tensor_nbytes(t), offset);
    return CH_OK;
}

ch_status ch_tensor_upload_async(ch_tensor *t, const ch_host_buffer *src, size_t offset)
{
    ch_status st = check_async("ch_tensor_upload_async", t, src, "src", offset);
    if (st != CH_OK)
        return st;
    /* Memory pinned for another backend is only plain memory to this one. */
    int async = src->pinned && src->dev->be == t->dev->be;
    return t->dev->be->iface->upload(chi_current_stream(t->dev), chi_mem(t),
                                     (const char *)src->ptr + offset, ch_tensor_nbytes(t),
                                     !async);
}

ch_status ch_tensor_download_async(const ch_tensor *t, ch_host_buffer *dst, size_t offset)
{
    ch_status st = check_async("ch_tensor_download_async", t, dst, "dst", offset);
    if (st != CH_OK)
        return st;
    int async = dst->pinned && dst->dev->be == t->dev->be;
    return t->dev->be->iface->download(chi_current_stream(t->dev), (char *)dst->ptr + offset,
                                       chi_mem(t), ch_tensor_nbytes(t), !async);
}

/* ---- Device <-> device -------------------------------------------------------- */

/* `waiter` (a stream of `be`) waits for what `producer`, a stream of
 * `dev`, holds now. */
static ch_status stream_after(const ch_backend_i *be, void *waiter, ch_device *dev,
                              void *producer)
{
    void *ev = NULL;
    ch_status st = CHI_INJECT("event creation", CH_ERR_DRIVER, be->event_new(dev->dev, &ev));
    if (st == CH_OK)
        st = be->event_record(ev, producer);
    if (st == CH_OK)
        st = be->event_wait(waiter, ev);
    if (ev)
        be->event_free(ev);
    return st;
}

/* The copy is queued on dst's stream and reads src there. Both streams
 * order it: dst's waits for src's producers, and src's waits for the copy,
 * so neither src's next writer nor the allocator (which marks a freed
 * block's last use on that stream) can overwrite src while the copy still
 * reads it. */
static ch_status copy_peer(ch_tensor *dst, const ch_tensor *src, size_t bytes)
{
    const ch_backend_i *be = dst->dev->be->iface;
    void *dst_stream = chi_current_stream(dst->dev);
    void *src_stream = chi_current_stream(src->dev);
    ch_status st = stream_after(be, dst_stream, src->dev, src_stream);
    if (st == CH_OK)
        st = be->peer_copy(dst_stream, chi_mem(dst), src->dev->dev, chi_mem(src), bytes);
    if (st != CH_OK)
        return st;
    /* When src's stream cannot wait for the copy, the host does; the copy
     * then succeeded, so the failed wait's message does not stay behind. */
    if (stream_after(be, src_stream, dst->dev, dst_stream) != CH_OK) {
        ch_clear_error();
        return be->stream_sync(dst_stream);
    }
    return CH_OK;
}

static ch_status staging_buffer(ch_device *dev, void **ptr)
{
    if (dev->staging) {
        *ptr = dev->staging;
        return CH_OK;
    }
    const ch_backend_i *be = dev->be->iface;
    if (be->host_alloc) {
        ch_status st = CHI_INJECT("pinned allocation", CH_ERR_OUT_OF_MEMORY,
                                  be->host_alloc(dev->dev, STAGING_BYTES, &dev->staging));
        if (st != CH_OK)
            return st;
    } else if (posix_memalign(&dev->staging, 64, STAGING_BYTES) != 0) {
        dev->staging = NULL;
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_copy: cannot allocate a staging buffer");
    }
    dev->staging_bytes = STAGING_BYTES;
    chi_alloc_staging(dev, STAGING_BYTES, 1);
    *ptr = dev->staging;
    return CH_OK;
}

/* Through host memory: directly when one side is host memory, otherwise in
 * chunks through the source device's pinned staging buffer. */
static ch_status copy_staged(ch_tensor *dst, const ch_tensor *src, size_t bytes)
{
    const ch_backend_i *sb = src->dev->be->iface, *db = dst->dev->be->iface;
    void *ss = chi_current_stream(src->dev), *ds = chi_current_stream(dst->dev);
    ch_status st;
    if (src->dev->be->host_memory) {
        chi_touch(src);
        st = db->upload(ds, chi_mem(dst), (const char *)src->buf->ptr + src->off, bytes, 1);
    } else if (dst->dev->be->host_memory) {
        chi_touch(dst);
        st = sb->download(ss, (char *)dst->buf->ptr + dst->off, chi_mem(src), bytes, 1);
    } else {
        void *stage = NULL;
        pthread_mutex_lock(&src->dev->staging_lock);
        st = staging_buffer(src->dev, &stage);
        for (size_t done = 0; st == CH_OK && done < bytes; done += STAGING_BYTES) {
            size_t n = bytes - done < STAGING_BYTES ? bytes - done : STAGING_BYTES;
            ch_bmem s = chi_mem(src), d = chi_mem(dst);
            s.off += done;
            d.off += done;
            st = sb->download(ss, stage, s, n, 1);
            if (st == CH_OK)
                st = db->upload(ds, d, stage, n, 1);
        }
        pthread_mutex_unlock(&src->dev->staging_lock);
    }
    return st;
}

ch_status chi_copy_across(ch_tensor *dst, const ch_tensor *src)
{
    size_t bytes = ch_tensor_nbytes(src);
    int peer = ch_device_can_peer(src->dev, dst->dev) && dst->dev->be->iface->peer_copy;
    ch_status st = peer ? copy_peer(dst, src, bytes) : copy_staged(dst, src, bytes);
    if (st == CH_OK) {
        chi_transfers *t = &dst->dev->transfers;
        atomic_fetch_add(peer ? &t->peer_copies : &t->staged_copies, 1);
        atomic_fetch_add(peer ? &t->peer_bytes : &t->staged_bytes, bytes);
    }
    return st;
}

ch_status ch_tensor_to(ch_tensor **out, const ch_tensor *src, ch_device *dev)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_to: out is NULL");
    *out = NULL;
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_tensor_to: call ch_init first");
    if (!src || !dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_tensor_to: %s is NULL",
                         !src ? "src" : "dev");
    ch_tensor *t;
    ch_status st = ch_tensor_new(&t, dev, src->dtype, src->ndim, src->shape);
    if (st != CH_OK)
        return st;
    st = ch_copy(t, src);
    if (st != CH_OK) {
        ch_tensor_free(t);
        return st;
    }
    *out = t;
    return CH_OK;
}
