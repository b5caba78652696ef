/* Chorus: a timeline of the library's work, written as a trace in the
 * Chrome trace-event JSON format (Perfetto and chrome://tracing open it). */
#ifndef CHORUS_TRACE_H
#define CHORUS_TRACE_H

#include <stddef.h>
#include <chorus/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Zero-initialised, every field takes its default. */
typedef struct ch_trace_options {
    /* Events are kept in memory and written to the file whenever more than
     * this many bytes are waiting (0: 1 MiB), so a long run's trace costs
     * about this much memory however long it grows. */
    size_t flush_bytes;
    /* The name of this process's group of tracks (NULL: "chorus" and the
     * process id, "chorus 1234"). Copied. */
    const char *process_name;
} ch_trace_options;

/* Start recording the library's work into a new trace at `path` (created,
 * or truncated), with `opts` (NULL: the defaults). One trace at a time:
 * CH_ERR_STATE, naming the running trace's file, while one runs. Fails
 * with CH_ERR_IO when the file cannot be opened. The events' times are
 * microseconds from this call. Safe to call before ch_init and from any
 * thread. */
CH_API ch_status ch_trace_start(const char *path, const ch_trace_options *opts);
/* Write what is still in memory, close the JSON text and the file. Returns
 * the first error met while recording (a write that failed, after which
 * every later event was dropped: CH_ERR_IO naming the file; memory for a
 * new track: CH_ERR_OUT_OF_MEMORY), or CH_OK; CH_ERR_STATE when no trace
 * runs. The file is closed either way. ch_shutdown stops a running trace. */
CH_API ch_status ch_trace_stop(void);
/* 1 while a trace runs (between ch_trace_start and ch_trace_stop), else 0. */
CH_API int ch_trace_running(void);

#ifdef __cplusplus
}
#endif

#endif
