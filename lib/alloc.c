/* The per-device caching allocator. Device allocations are slow (and on
 * some drivers synchronising), so freed blocks are kept in size classes and
 * handed out again; the cache is emptied on request and when the device
 * runs out of memory, or would go beyond its limit. It also counts what
 * the backends allocate for themselves (workspace, staging): the device's
 * memory in one place, under one lock. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define MIN_SHIFT 9 /* 512 bytes */

/* Four classes per power of two: 2^k, 1.25 2^k, 1.5 2^k, 1.75 2^k. */
static size_t class_size(int c)
{
    int k = MIN_SHIFT + c / 4;
    return ((size_t)1 << k) + (size_t)(c % 4) * ((size_t)1 << (k - 2));
}

static int class_of(size_t bytes)
{
    for (int c = 0; c < CH_ALLOC_CLASSES; c++)
        if (class_size(c) >= bytes)
            return c;
    return -1;
}

void chi_alloc_init(chi_allocator *a)
{
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->lock, NULL);
}

size_t chi_alloc_round(size_t bytes)
{
    int c = class_of(bytes);
    return c < 0 ? bytes : class_size(c);
}

static void flush_locked(ch_device *dev)
{
    chi_allocator *a = &dev->alloc;
    for (int c = 0; c < CH_ALLOC_CLASSES; c++) {
        while (a->free_list[c]) {
            chi_block *b = a->free_list[c];
            a->free_list[c] = b->next;
            if (b->ready) {
                dev->be->iface->event_sync(b->ready);
                dev->be->iface->event_free(b->ready);
            }
            dev->be->iface->free(dev->dev, b->ptr);
            a->stats.cached_bytes -= b->bytes;
            free(b);
        }
    }
    a->stats.cache_flushes++;
}

void chi_alloc_release(ch_device *dev)
{
    pthread_mutex_lock(&dev->alloc.lock);
    flush_locked(dev);
    pthread_mutex_unlock(&dev->alloc.lock);
}

/* `bytes` more in use: the peaks follow. */
static void grow_locked(chi_allocator *a, size_t bytes)
{
    ch_memory_stats *m = &a->stats;
    m->in_use_bytes += bytes;
    if (m->in_use_bytes > m->peak_bytes)
        m->peak_bytes = m->in_use_bytes;
    if (m->in_use_bytes + m->cached_bytes > m->peak_reserved_bytes)
        m->peak_reserved_bytes = m->in_use_bytes + m->cached_bytes;
}

static void account(chi_allocator *a, size_t bytes)
{
    a->stats.allocs++;
    grow_locked(a, bytes);
}

/* "512 bytes", "4.0 KiB", "1020.3 MiB", "1.0 GiB". */
static void format_bytes(char *out, size_t cap, uint64_t bytes)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(out, cap, "%llu bytes", (unsigned long long)bytes);
        return;
    }
    double v = (double)bytes / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, cap, "%.1f %s", v, units[u]);
}

/* Whether the device can hold `bytes` more within its limit (or has none). */
static int fits(const ch_memory_stats *m, size_t bytes)
{
    uint64_t held = m->in_use_bytes + m->cached_bytes;
    return !m->limit_bytes || (bytes <= m->limit_bytes && held <= m->limit_bytes - bytes);
}

/* Whether `bytes` more may be allocated under the device's limit; empties
 * the cache first when that would make room. CH_OK, or
 * CH_ERR_DEVICE_OUT_OF_MEMORY with the message naming the device, the
 * request (`what`, NULL for a tensor's block), the bytes in use and the
 * limit. */
static ch_status limit_check_locked(ch_device *dev, size_t bytes, const char *what)
{
    ch_memory_stats *m = &dev->alloc.stats;
    if (fits(m, bytes))
        return CH_OK;
    if (m->cached_bytes > 0)
        flush_locked(dev);
    if (fits(m, bytes))
        return CH_OK;
    char req[32], used[32], limit[32];
    format_bytes(req, sizeof req, bytes);
    format_bytes(used, sizeof used, m->in_use_bytes);
    format_bytes(limit, sizeof limit, m->limit_bytes);
    return chi_error(CH_ERR_DEVICE_OUT_OF_MEMORY,
                     "%s: %s requested%s%s with %s of its %s limit in use "
                     "(ch_device_set_memory_limit)",
                     dev->id, req, what ? " for " : "", what ? what : "", used, limit);
}

/* `bytes` must already be rounded with chi_alloc_round. */
ch_status chi_alloc(ch_device *dev, size_t bytes, void **ptr)
{
    chi_allocator *a = &dev->alloc;
    int c = class_of(bytes);
    pthread_mutex_lock(&a->lock);
    if (c >= 0 && a->free_list[c]) {
        chi_block *b = a->free_list[c];
        a->free_list[c] = b->next;
        a->stats.cached_bytes -= b->bytes;
        a->stats.cache_hits++;
        account(a, bytes);
        pthread_mutex_unlock(&a->lock);
        *ptr = b->ptr;
        /* The block may still be read by work queued on another stream
         * before it was freed: the new owner's stream waits for that. */
        ch_status st = CH_OK;
        if (b->ready) {
            st = dev->be->iface->event_wait(chi_current_stream(dev), b->ready);
            dev->be->iface->event_free(b->ready);
        }
        free(b);
        if (st != CH_OK)
            chi_free(dev, *ptr, bytes);
        return st;
    }
    ch_status st = limit_check_locked(dev, bytes, NULL);
    if (st != CH_OK) {
        pthread_mutex_unlock(&a->lock);
        return st;
    }
    st = CHI_INJECT("device allocation", CH_ERR_DEVICE_OUT_OF_MEMORY,
                    dev->be->iface->alloc(dev->dev, bytes, ptr));
    if (st == CH_ERR_DEVICE_OUT_OF_MEMORY && a->stats.cached_bytes > 0) {
        flush_locked(dev);
        st = CHI_INJECT("device allocation", CH_ERR_DEVICE_OUT_OF_MEMORY,
                        dev->be->iface->alloc(dev->dev, bytes, ptr));
    }
    if (st == CH_OK) {
        a->stats.device_allocs++;
        account(a, bytes);
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}

/* Mark the block's last use on the current stream (work of other streams
 * that read it, peer copies, made this stream wait for it: docs/DESIGN.md,
 * Streams); NULL when the backend runs work synchronously (nothing can
 * still be pending) or on failure (the caller then synchronises). */
static void *last_use(ch_device *dev)
{
    if (dev->be->host_memory)
        return NULL;
    void *ev = NULL;
    const ch_backend_i *be = dev->be->iface;
    if (CHI_INJECT("event creation", CH_ERR_DRIVER, be->event_new(dev->dev, &ev)) != CH_OK)
        return NULL;
    if (be->event_record(ev, chi_current_stream(dev)) != CH_OK) {
        be->event_free(ev);
        return NULL;
    }
    return ev;
}

void chi_alloc_note_tensor(ch_device *dev, size_t bytes, int freed)
{
    chi_allocator *a = &dev->alloc;
    pthread_mutex_lock(&a->lock);
    if (freed)
        a->stats.tensor_bytes -= bytes;
    else
        a->stats.tensor_bytes += bytes;
    pthread_mutex_unlock(&a->lock);
}

void chi_free(ch_device *dev, void *ptr, size_t bytes)
{
    chi_allocator *a = &dev->alloc;
    chi_block *b = malloc(sizeof *b);
    void *ready = b ? last_use(dev) : NULL;
    if (b && !ready && !dev->be->host_memory)
        chi_stream_sync_all(dev);
    pthread_mutex_lock(&a->lock);
    a->stats.in_use_bytes -= bytes;
    int c = class_of(bytes);
    if (!b || c < 0 || class_size(c) != bytes) {
        /* No room to remember it, or not a class size: give it back now. */
        if (ready) {
            dev->be->iface->event_sync(ready);
            dev->be->iface->event_free(ready);
        }
        dev->be->iface->free(dev->dev, ptr);
        free(b);
    } else {
        b->ptr = ptr;
        b->bytes = bytes;
        b->ready = ready;
        b->next = a->free_list[c];
        a->free_list[c] = b;
        a->stats.cached_bytes += bytes;
    }
    pthread_mutex_unlock(&a->lock);
}

/* ---- What the backends allocate themselves (lib/backend.h) ---------------- */

ch_status chi_workspace_reserve(void *bdev, size_t bytes, const char *what)
{
    ch_device *dev = chi_device_of(bdev);
    if (!dev)
        return CH_OK;
    chi_allocator *a = &dev->alloc;
    pthread_mutex_lock(&a->lock);
    ch_status st = limit_check_locked(dev, bytes, what);
    if (st == CH_OK) {
        a->stats.workspace_bytes += bytes;
        grow_locked(a, bytes);
    }
    pthread_mutex_unlock(&a->lock);
    return st;
}

void chi_workspace_release(void *bdev, size_t bytes)
{
    ch_device *dev = chi_device_of(bdev);
    if (!dev)
        return;
    chi_allocator *a = &dev->alloc;
    pthread_mutex_lock(&a->lock);
    a->stats.workspace_bytes -= bytes;
    a->stats.in_use_bytes -= bytes;
    pthread_mutex_unlock(&a->lock);
}

void chi_alloc_staging(ch_device *dev, size_t bytes, int held)
{
    chi_allocator *a = &dev->alloc;
    pthread_mutex_lock(&a->lock);
    if (held)
        a->stats.staging_bytes += bytes;
    else
        a->stats.staging_bytes -= bytes;
    pthread_mutex_unlock(&a->lock);
}

void chi_staging_add(void *bdev, size_t bytes)
{
    ch_device *dev = chi_device_of(bdev);
    if (dev)
        chi_alloc_staging(dev, bytes, 1);
}

void chi_staging_remove(void *bdev, size_t bytes)
{
    ch_device *dev = chi_device_of(bdev);
    if (dev)
        chi_alloc_staging(dev, bytes, 0);
}

void chi_alloc_reset_peak(ch_device *dev)
{
    chi_allocator *a = &dev->alloc;
    pthread_mutex_lock(&a->lock);
    a->stats.peak_bytes = a->stats.in_use_bytes;
    a->stats.peak_reserved_bytes = a->stats.in_use_bytes + a->stats.cached_bytes;
    pthread_mutex_unlock(&a->lock);
}

void chi_alloc_set_limit(ch_device *dev, uint64_t bytes)
{
    chi_allocator *a = &dev->alloc;
    pthread_mutex_lock(&a->lock);
    a->stats.limit_bytes = bytes;
    pthread_mutex_unlock(&a->lock);
}
