/* The trace recorder's calls for the library (chorus/trace.h starts and
 * stops a trace): tracks, slices, instants, flows and counters in the
 * Chrome trace-event format. While no trace runs each call costs one
 * relaxed atomic load and returns: no allocation, no clock, no lock. They
 * are safe from any thread. Not installed. The installed library exports
 * chi_trace_on alone, for the backend modules' chi_tracing(); the rest is
 * CHI_TEST_API, exported by the test build of the library for the tests
 * and the copy of nn/ built for them (tests/test-exports.sh). */
#ifndef CHORUS_LIB_TRACE_H
#define CHORUS_LIB_TRACE_H

/* The CUDA module's C++ reads the same flag: std::atomic<int> is C11's
 * atomic_int in layout and in the operations used here (GCC's and
 * Clang's; C++23 makes <stdatomic.h> say so itself). */
#ifdef __cplusplus
#include <atomic>
using std::atomic_int;
using std::memory_order_relaxed;
#else
#include <stdatomic.h>
#endif

#include <chorus/device.h>
#include <chorus/reduce.h>
#include <chorus/stream.h>
#include <chorus/trace.h>

#include "error.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 while a trace runs. Read with chi_tracing(). */
CH_API extern atomic_int chi_trace_on;

/* Whether a trace runs: skip the work of preparing events when not. */
static inline int chi_tracing(void)
{
    return atomic_load_explicit(&chi_trace_on, memory_order_relaxed);
}

/* The track (a "tid" in this process's group) named `name`, made the first
 * time the name is asked for and the same id after that (until
 * ch_shutdown), with its name and sort_index (lower: shown higher) written
 * to the trace. -1 while no trace runs, or when there was no memory for a
 * new track (ch_trace_stop then reports it). Names the library uses:
 * "host", "opencl:0", "cuda:0", "reducer", "loader",
 * "link opencl:0 -> host". */
CHI_TEST_API int chi_trace_track(const char *name, int sort_index);

/* Seconds on ch_clock_seconds' clock, the clock every event's time is on;
 * 0, without reading the clock, while no trace runs. */
CHI_TEST_API double chi_trace_now(void);

/* The events. Times are seconds on ch_clock_seconds' clock (a device's
 * timings converted to it fit); the file holds microseconds from the
 * trace's start. An event with a track below 0, or starting before the
 * trace did (a time taken while no trace ran), is dropped. Strings are
 * escaped for JSON; `args_json` is NULL or the text of a JSON object,
 * copied as it is. */
/* Work from t0 to t1 (a complete, "X", event; t1 before t0 is a slice of
 * length 0). Slices of one track nest: each one inside another or apart. */
CHI_TEST_API void chi_trace_slice(int track, const char *name, const char *cat, double t0,
                                  double t1, const char *args_json);
/* A moment ("i", scoped to the track). */
CHI_TEST_API void chi_trace_instant(int track, const char *name, const char *cat, double t,
                                    const char *args_json);
/* One end of an arrow between slices: its start (end 0, "s") or its end
 * (end 1, "f", bound to the slice that encloses t on `track`). The two
 * ends share `id`, `name` and `cat`. */
CHI_TEST_API void chi_trace_flow(int track, unsigned long long id, int end, const char *name,
                                 const char *cat, double t);
/* The value of `series` in the counter `name` from t on ("C"). A value
 * that is not finite has no JSON number: the event is dropped. */
CHI_TEST_API void chi_trace_counter(int track, const char *name, double t, const char *series,
                                    double value);

/* Across processes (data parallelism under mpirun): this trace's times
 * from now on count from `origin` on this process's clock (rank 0's
 * origin, moved to this clock), the process is named for its rank and
 * host, and the offset to rank 0's clock and its uncertainty are written
 * as an instant on the "steps" track. chi_trace_origin: the origin now, 0
 * while no trace runs. */
CHI_TEST_API double chi_trace_origin(void);
CHI_TEST_API void chi_trace_align(double origin, double offset, double uncertainty, int rank,
                                  int ranks, const char *host);

/* The name the reducer's next calls give their stages on the trace
 * ("bucket 3" makes "bucket 3 d2h", ...); "" or NULL: none. */
CHI_TEST_API void chi_trace_reducer_label(ch_reducer *r, const char *label);

/* Device time (lib/trace_clock.c). The time at which the event's stream
 * reached `event` (recorded, and completed: ch_event_sync it first), on
 * ch_clock_seconds' clock: the backend's own reading of the event
 * (event_seconds in lib/backend.h) plus its device's clock offset, which
 * is measured once per device and trace, on first use. CH_ERR_STATE when
 * no trace runs; CH_ERR_UNSUPPORTED when the backend or the event cannot
 * tell: an event recorded while no trace ran, or on an OpenCL stream made
 * before the trace started (its queue does not profile). */
CHI_TEST_API ch_status chi_trace_event_seconds(ch_event *event, double *t);
/* `dev`'s clock offset (device seconds + offset = ch_clock_seconds) for the
 * running trace, measured now if it was not yet, and how far it may be off
 * either way (*uncertainty; 0 on the host, whose clock is this one). The
 * first measurement of each trace is written to it as a "clock calibrated"
 * instant on the device's track. Errors as chi_trace_event_seconds. */
CHI_TEST_API ch_status chi_trace_clock(ch_device *dev, double *offset, double *uncertainty);

/* Which trace runs: moves on at every ch_trace_start (0 before the first),
 * so a value kept for a trace is known to be stale in the next. */
unsigned chi_trace_generation(void);

/* At ch_shutdown: stop a running trace (its status, CH_OK when none ran)
 * and forget the tracks. */
ch_status chi_trace_shutdown(void);

#ifdef __cplusplus
}
#endif

#endif
