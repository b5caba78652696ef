/* Streams, events and pinned host buffers. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core.h"

/* The calling thread's current stream per device index. `gen` ties the
 * entry to one ch_init, so a stream of an earlier initialisation is never
 * used after ch_shutdown. */
typedef struct current_entry {
    unsigned gen;
    ch_stream *stream;
} current_entry;
static _Thread_local current_entry current[CH_MAX_DEVICES];

ch_status chi_stream_create(ch_stream **out, ch_device *dev, int is_default)
{
    ch_stream *s = calloc(1, sizeof *s);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_stream_new: out of memory");
    ch_status st = CHI_INJECT("stream creation", CH_ERR_DRIVER,
                              dev->be->iface->stream_new(dev->dev, &s->handle));
    if (st != CH_OK) {
        free(s);
        return st;
    }
    s->dev = dev;
    s->is_default = is_default;
    pthread_mutex_lock(&dev->streams_lock);
    s->next = dev->streams;
    dev->streams = s;
    pthread_mutex_unlock(&dev->streams_lock);
    *out = s;
    return CH_OK;
}

void chi_stream_destroy(ch_stream *s)
{
    if (!s)
        return;
    ch_device *dev = s->dev;
    pthread_mutex_lock(&dev->streams_lock);
    for (ch_stream **p = &dev->streams; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    pthread_mutex_unlock(&dev->streams_lock);
    dev->be->iface->stream_free(s->handle);
    free(s);
}

ch_status chi_stream_sync_all(ch_device *dev)
{
    ch_status st = CH_OK;
    pthread_mutex_lock(&dev->streams_lock);
    for (ch_stream *s = dev->streams; s && st == CH_OK; s = s->next)
        st = dev->be->iface->stream_sync(s->handle);
    pthread_mutex_unlock(&dev->streams_lock);
    return st;
}

static ch_stream *current_of(ch_device *dev)
{
    current_entry *e = &current[dev->index];
    if (e->stream && e->gen == chi_generation())
        return e->stream;
    return dev->default_stream;
}

void *chi_current_stream(ch_device *dev) { return current_of(dev)->handle; }

#define CHECK_INIT(fn)                                                           \
    do {                                                                         \
        if (!chi_initialized())                                                  \
            return chi_error(CH_ERR_STATE, fn ": call ch_init first");           \
    } while (0)

ch_status ch_stream_new(ch_stream **out, ch_device *dev)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_stream_new: out is NULL");
    *out = NULL;
    CHECK_INIT("ch_stream_new");
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_stream_new: dev is NULL");
    return chi_stream_create(out, dev, 0);
}

void ch_stream_free(ch_stream *stream)
{
    if (!stream || stream->is_default)
        return;
    current_entry *e = &current[stream->dev->index];
    if (e->stream == stream)
        e->stream = NULL;
    chi_stream_destroy(stream);
}

ch_status ch_stream_sync(ch_stream *stream)
{
    CHECK_INIT("ch_stream_sync");
    if (!stream)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_stream_sync: stream is NULL");
    return stream->dev->be->iface->stream_sync(stream->handle);
}

ch_device *ch_stream_device(const ch_stream *stream) { return stream ? stream->dev : NULL; }

ch_status ch_device_default_stream(ch_stream **out, ch_device *dev)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_default_stream: out is NULL");
    *out = NULL;
    CHECK_INIT("ch_device_default_stream");
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_default_stream: dev is NULL");
    *out = dev->default_stream;
    return CH_OK;
}

ch_status ch_stream_set_current(ch_stream *stream)
{
    CHECK_INIT("ch_stream_set_current");
    if (!stream)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_stream_set_current: stream is NULL (use ch_stream_reset_current)");
    current[stream->dev->index] = (current_entry){chi_generation(), stream};
    return CH_OK;
}

ch_status ch_stream_reset_current(ch_device *dev)
{
    CHECK_INIT("ch_stream_reset_current");
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_stream_reset_current: dev is NULL");
    current[dev->index].stream = NULL;
    return CH_OK;
}

ch_status ch_stream_get_current(ch_stream **out, ch_device *dev)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_stream_get_current: out is NULL");
    *out = NULL;
    CHECK_INIT("ch_stream_get_current");
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_stream_get_current: dev is NULL");
    *out = current_of(dev);
    return CH_OK;
}

/* ---- Events ---------------------------------------------------------------- */

ch_status ch_event_new(ch_event **out, ch_device *dev)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_event_new: out is NULL");
    *out = NULL;
    CHECK_INIT("ch_event_new");
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_event_new: dev is NULL");
    ch_event *e = calloc(1, sizeof *e);
    if (!e)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_event_new: out of memory");
    ch_status st = CHI_INJECT("event creation", CH_ERR_DRIVER,
                              dev->be->iface->event_new(dev->dev, &e->handle));
    if (st != CH_OK) {
        free(e);
        return st;
    }
    e->dev = dev;
    *out = e;
    return CH_OK;
}

void ch_event_free(ch_event *event)
{
    if (!event)
        return;
    event->dev->be->iface->event_free(event->handle);
    free(event);
}

ch_status ch_event_record(ch_event *event, ch_stream *stream)
{
    CHECK_INIT("ch_event_record");
    if (!event || !stream)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_event_record: %s is NULL",
                         !event ? "event" : "stream");
    if (event->dev != stream->dev)
        return chi_error(CH_ERR_DEVICE_MISMATCH,
                         "ch_event_record: event is on %s but stream is on %s", event->dev->id,
                         stream->dev->id);
    return event->dev->be->iface->event_record(event->handle, stream->handle);
}

ch_status ch_event_wait(ch_stream *stream, ch_event *event)
{
    CHECK_INIT("ch_event_wait");
    if (!event || !stream)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_event_wait: %s is NULL",
                         !stream ? "stream" : "event");
    /* Streams of two backends cannot wait on each other's events: the host
     * waits instead, which orders them just as well. */
    if (event->dev->be != stream->dev->be)
        return event->dev->be->iface->event_sync(event->handle);
    return stream->dev->be->iface->event_wait(stream->handle, event->handle);
}

ch_status ch_event_sync(ch_event *event)
{
    CHECK_INIT("ch_event_sync");
    if (!event)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_event_sync: event is NULL");
    return event->dev->be->iface->event_sync(event->handle);
}

/* ---- Pinned host buffers ---------------------------------------------------- */

ch_status ch_host_buffer_new(ch_host_buffer **out, ch_device *dev, size_t bytes)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_host_buffer_new: out is NULL");
    *out = NULL;
    CHECK_INIT("ch_host_buffer_new");
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_host_buffer_new: dev is NULL");
    if (bytes == 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_host_buffer_new: bytes is 0");
    ch_host_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_host_buffer_new: out of memory");
    b->dev = dev;
    b->bytes = bytes;
    const ch_backend_i *be = dev->be->iface;
    if (be->host_alloc) {
        ch_status st = CHI_INJECT("pinned allocation", CH_ERR_OUT_OF_MEMORY,
                                  be->host_alloc(dev->dev, bytes, &b->ptr));
        if (st != CH_OK) {
            free(b);
            return st;
        }
        b->pinned = 1;
    } else if (posix_memalign(&b->ptr, 64, bytes) != 0) {
        free(b);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_host_buffer_new: cannot allocate %zu bytes",
                         bytes);
    }
    chi_alloc_staging(dev, bytes, 1);
    *out = b;
    return CH_OK;
}

void ch_host_buffer_free(ch_host_buffer *buf)
{
    if (!buf)
        return;
    if (chi_initialized())
        chi_alloc_staging(buf->dev, buf->bytes, 0);
    if (buf->pinned)
        buf->dev->be->iface->host_free(buf->dev->dev, buf->ptr);
    else
        free(buf->ptr);
    free(buf);
}

void *ch_host_buffer_data(const ch_host_buffer *buf) { return buf ? buf->ptr : NULL; }

size_t ch_host_buffer_size(const ch_host_buffer *buf) { return buf ? buf->bytes : 0; }
