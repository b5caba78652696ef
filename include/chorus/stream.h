/* Chorus: streams, events and pinned host buffers. */
#ifndef CHORUS_STREAM_H
#define CHORUS_STREAM_H

#include <stddef.h>
#include <chorus/device.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A stream is an in-order queue of work on one device. Every device has a
 * default stream. Ops on a tensor run on the current stream of the tensor's
 * device for the calling thread: the default stream unless
 * ch_stream_set_current() chose another. */
typedef struct ch_stream ch_stream;
typedef struct ch_event ch_event;
typedef struct ch_host_buffer ch_host_buffer;

CH_API ch_status ch_stream_new(ch_stream **out, ch_device *dev);
CH_API void ch_stream_free(ch_stream *stream);
CH_API ch_status ch_stream_sync(ch_stream *stream);
CH_API ch_device *ch_stream_device(const ch_stream *stream);

/* The device's default stream (never freed by the user). */
CH_API ch_status ch_device_default_stream(ch_stream **out, ch_device *dev);

/* Make `stream` the calling thread's current stream for its device. Do not free
 * a stream while it is current on another thread. */
CH_API ch_status ch_stream_set_current(ch_stream *stream);
/* Back to the default stream for `dev` on this thread. */
CH_API ch_status ch_stream_reset_current(ch_device *dev);
/* Borrowed: the caller's stream, or the device's default stream. */
CH_API ch_status ch_stream_get_current(ch_stream **out, ch_device *dev);

/* Events mark a point in a stream. Waiting on an event of another device
 * orders the two streams; across backends it waits on the host. */
CH_API ch_status ch_event_new(ch_event **out, ch_device *dev);
CH_API void ch_event_free(ch_event *event);
CH_API ch_status ch_event_record(ch_event *event, ch_stream *stream);
CH_API ch_status ch_event_wait(ch_stream *stream, ch_event *event);
CH_API ch_status ch_event_sync(ch_event *event);

/* Page-locked host memory for fast, asynchronous transfers to and from
 * `dev` (plain memory where the backend has no pinned allocator). Devices
 * of the same backend transfer from and to it asynchronously too; to a
 * device of another backend it is plain memory. An asynchronous transfer
 * reads or writes it until its stream is synchronised: touch, reuse or
 * free the buffer only after that (the library does not track it). */
CH_API ch_status ch_host_buffer_new(ch_host_buffer **out, ch_device *dev, size_t bytes);
CH_API void ch_host_buffer_free(ch_host_buffer *buf);
CH_API void *ch_host_buffer_data(const ch_host_buffer *buf);
CH_API size_t ch_host_buffer_size(const ch_host_buffer *buf);

#ifdef __cplusplus
}
#endif

#endif
