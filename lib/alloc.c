/* The per-device caching allocator. Device allocations are slow (and on
 * some drivers synchronising), so freed blocks are kept in size classes and
 * handed out again; the cache is emptied on request and when the device
 * runs out of memory. */
#include "config.h"

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

static void account(chi_allocator *a, size_t bytes)
{
    a->stats.allocs++;
    a->stats.in_use_bytes += bytes;
    if (a->stats.in_use_bytes > a->stats.peak_bytes)
        a->stats.peak_bytes = a->stats.in_use_bytes;
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
    ch_status st = CHI_INJECT("device allocation", CH_ERR_DEVICE_OUT_OF_MEMORY,
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
