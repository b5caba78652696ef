/* The trace recorder: events in the Chrome trace-event JSON format, kept
 * in a buffer and streamed to the file whenever it passes flush_bytes.
 *
 * An event is formatted in the caller's own small buffer, outside the
 * lock, and appended under it; a write to the file (when the buffer is
 * full) happens under the lock too. The events' times are relative to the
 * trace's origin, read outside the lock: ch_trace_start stores the origin
 * before it moves `generation` on, and an event formatted with one
 * generation's origin is dropped unless that generation still records
 * when it is appended. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chorus/clock.h>

#include "error.h"
#include "trace.h"

#define DEFAULT_FLUSH_BYTES ((size_t)1 << 20)

atomic_int chi_trace_on;

typedef struct track {
    char *name;
    int sort_index;
} track;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint generation; /* moves on at every ch_trace_start */
static _Atomic double origin;  /* ch_clock_seconds at the start */
static atomic_int pid;         /* this process's, set at every start */
/* The rest under `lock`. */
static FILE *file; /* NULL: no trace runs */
static char *path;
static unsigned recording; /* the generation `file` belongs to */
static char *buf;          /* waiting to be written */
static size_t len, cap, flush_bytes;
static int nevents;       /* written so far: a comma before the next */
static ch_status failure; /* the first error, CH_OK while none */
static char failure_msg[1024];
static track *tracks; /* id = index + 1 (tid 0 holds the process_name event) */
static char pname[128]; /* the process's name on the trace */
static int ntracks, tracks_cap;

/* ---- Text of one event ---- */

/* A string being built: in `local` while it fits, then on the heap; `oom`
 * once an allocation failed (the text is then incomplete). */
typedef struct text {
    char *p;
    size_t len, cap;
    int oom;
    char local[512];
} text;

static void text_init(text *t)
{
    t->p = t->local;
    t->len = 0;
    t->cap = sizeof t->local;
    t->oom = 0;
    t->local[0] = '\0';
}

static void text_free(text *t)
{
    if (t->p != t->local)
        free(t->p);
}

/* Room for `more` bytes and the terminating NUL. */
static int text_reserve(text *t, size_t more)
{
    if (t->oom)
        return 0;
    if (t->len + more + 1 <= t->cap)
        return 1;
    size_t ncap = t->cap * 2;
    while (ncap < t->len + more + 1)
        ncap *= 2;
    char *np = t->p == t->local ? malloc(ncap) : realloc(t->p, ncap);
    if (!np) {
        t->oom = 1;
        return 0;
    }
    if (t->p == t->local)
        memcpy(np, t->local, t->len + 1);
    t->p = np;
    t->cap = ncap;
    return 1;
}

static void text_add(text *t, const char *s, size_t n)
{
    if (!text_reserve(t, n))
        return;
    memcpy(t->p + t->len, s, n);
    t->len += n;
    t->p[t->len] = '\0';
}

static void text_str(text *t, const char *s)
{
    text_add(t, s, strlen(s));
}

static void text_fmt(text *t, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void text_fmt(text *t, const char *fmt, ...)
{
    char small[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        t->oom = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        text_add(t, small, (size_t)n);
        return;
    }
    if (!text_reserve(t, (size_t)n))
        return;
    va_start(ap, fmt);
    vsnprintf(t->p + t->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    t->len += (size_t)n;
}

/* `s` as a JSON string, quotes included (NULL: ""). Bytes from 0x80 up
 * pass unchanged (UTF-8 stays UTF-8). */
static void text_json_str(text *t, const char *s)
{
    text_add(t, "\"", 1);
    for (const char *p = s ? s : ""; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"')
            text_add(t, "\\\"", 2);
        else if (c == '\\')
            text_add(t, "\\\\", 2);
        else if (c == '\n')
            text_add(t, "\\n", 2);
        else if (c == '\t')
            text_add(t, "\\t", 2);
        else if (c == '\r')
            text_add(t, "\\r", 2);
        else if (c < 0x20)
            text_fmt(t, "\\u%04x", c);
        else
            text_add(t, (const char *)p, 1);
    }
    text_add(t, "\"", 1);
}

/* The fields every event starts with: name, cat (when given), ph, pid,
 * tid. */
static void text_head(text *t, const char *name, const char *cat, const char *ph, int tid)
{
    text_str(t, "{\"name\":");
    text_json_str(t, name);
    if (cat) {
        text_str(t, ",\"cat\":");
        text_json_str(t, cat);
    }
    text_fmt(t, ",\"ph\":\"%s\",\"pid\":%d,\"tid\":%d", ph,
             atomic_load_explicit(&pid, memory_order_relaxed), tid);
}

/* Microseconds from the origin, to the nanosecond. */
static void text_time(text *t, const char *key, double us)
{
    text_fmt(t, ",\"%s\":%.3f", key, us);
}

/* ---- The buffer and the file (under `lock`) ---- */

/* Remember the first error; every later event is dropped. */
static void fail_locked(ch_status st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void fail_locked(ch_status st, const char *fmt, ...)
{
    if (failure != CH_OK)
        return;
    failure = st;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(failure_msg, sizeof failure_msg, fmt, ap);
    va_end(ap);
    len = 0;
}

/* Write the buffer to the file and flush it. */
static void write_locked(void)
{
    if (failure != CH_OK || len == 0) {
        len = 0;
        return;
    }
    errno = 0;
    if (fwrite(buf, 1, len, file) != len || fflush(file) != 0) {
        int e = errno;
        fail_locked(CH_ERR_IO, "ch_trace: writing %s: %s", path, e ? strerror(e) : "short write");
    }
    len = 0;
}

/* Append bytes to the buffer (growing it when an event is larger than the
 * room left), then write the buffer out when it passed flush_bytes. */
static void append_locked(const char *s, size_t n)
{
    if (failure != CH_OK)
        return;
    if (len + n > cap) {
        size_t ncap = cap ? cap : 4096;
        while (ncap < len + n)
            ncap *= 2;
        char *nb = realloc(buf, ncap);
        if (!nb) {
            fail_locked(CH_ERR_OUT_OF_MEMORY, "ch_trace: no memory for %zu bytes of %s's events",
                        ncap, path);
            return;
        }
        buf = nb;
        cap = ncap;
    }
    memcpy(buf + len, s, n);
    len += n;
    if (len >= flush_bytes)
        write_locked();
}

/* One event's text, with the comma that separates it from the one before. */
static void event_locked(const text *t)
{
    if (failure != CH_OK)
        return;
    if (t->oom) {
        fail_locked(CH_ERR_OUT_OF_MEMORY, "ch_trace: no memory to format an event of %s", path);
        return;
    }
    if (nevents++ > 0)
        append_locked(",\n", 2);
    append_locked(t->p, t->len);
}

/* A metadata event: `what` ("process_name", "thread_sort_index", ...) with
 * a string or a number as its argument. */
static void meta_locked(const char *what, int tid, const char *name, int number)
{
    text t;
    text_init(&t);
    text_head(&t, what, NULL, "M", tid);
    if (name) {
        text_str(&t, ",\"args\":{\"name\":");
        text_json_str(&t, name);
        text_str(&t, "}}");
    } else {
        text_fmt(&t, ",\"args\":{\"sort_index\":%d}}", number);
    }
    event_locked(&t);
    text_free(&t);
}

static void track_meta_locked(int id)
{
    meta_locked("thread_name", id, tracks[id - 1].name, 0);
    meta_locked("thread_sort_index", id, NULL, tracks[id - 1].sort_index);
}

/* ---- The public calls ---- */

ch_status ch_trace_start(const char *trace_path, const ch_trace_options *opts)
{
    if (!trace_path || !*trace_path)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_trace_start: path is %s",
                         trace_path ? "empty" : "NULL");
    pthread_mutex_lock(&lock);
    if (file) {
        ch_status st = chi_error(CH_ERR_STATE,
                                 "ch_trace_start: a trace is already running (to %s); "
                                 "ch_trace_stop it first",
                                 path);
        pthread_mutex_unlock(&lock);
        return st;
    }
    char *copy = strdup(trace_path);
    if (!copy) {
        pthread_mutex_unlock(&lock);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_trace_start: no memory for the path %s",
                         trace_path);
    }
    FILE *f = fopen(trace_path, "w");
    if (!f) {
        int e = errno;
        free(copy);
        pthread_mutex_unlock(&lock);
        return chi_error(CH_ERR_IO, "ch_trace_start: cannot open %s for writing: %s", trace_path,
                         strerror(e));
    }
    file = f;
    path = copy;
    len = 0;
    nevents = 0;
    failure = CH_OK;
    failure_msg[0] = '\0';
    flush_bytes = opts && opts->flush_bytes ? opts->flush_bytes : DEFAULT_FLUSH_BYTES;
    atomic_store(&pid, (int)getpid());
    /* The origin before the generation: an event that saw this generation
     * reads this origin (both sequentially consistent). */
    atomic_store(&origin, ch_clock_seconds());
    recording = atomic_fetch_add(&generation, 1) + 1;
    static const char opening[] = "{\"traceEvents\":[\n";
    append_locked(opening, sizeof opening - 1);
    char name[64];
    const char *given = opts ? opts->process_name : NULL;
    if (!given) {
        snprintf(name, sizeof name, "chorus %d", atomic_load(&pid));
        given = name;
    }
    snprintf(pname, sizeof pname, "%s", given);
    meta_locked("process_name", 0, pname, 0);
    for (int i = 0; i < ntracks; i++)
        track_meta_locked(i + 1);
    atomic_store(&chi_trace_on, 1);
    pthread_mutex_unlock(&lock);
    return CH_OK;
}

/* Close the running trace and return its status, with the message set. */
static ch_status stop_locked(void)
{
    atomic_store(&chi_trace_on, 0);
    static const char closing[] = "\n],\"displayTimeUnit\":\"ms\"}\n";
    if (failure == CH_OK) {
        /* Always written, whatever flush_bytes is. */
        size_t keep = flush_bytes;
        flush_bytes = 0;
        append_locked(closing, sizeof closing - 1);
        write_locked();
        flush_bytes = keep;
    }
    errno = 0;
    if (fclose(file) != 0) {
        int e = errno;
        fail_locked(CH_ERR_IO, "ch_trace_stop: closing %s: %s", path,
                    e ? strerror(e) : "fclose failed");
    }
    file = NULL;
    free(path);
    path = NULL;
    free(buf);
    buf = NULL;
    len = cap = 0;
    ch_status st = failure;
    failure = CH_OK;
    return st == CH_OK ? CH_OK : chi_error(st, "%s", failure_msg);
}

ch_status ch_trace_stop(void)
{
    pthread_mutex_lock(&lock);
    ch_status st =
        file ? stop_locked() : chi_error(CH_ERR_STATE, "ch_trace_stop: no trace is running");
    pthread_mutex_unlock(&lock);
    return st;
}

int ch_trace_running(void)
{
    return chi_tracing();
}

ch_status chi_trace_shutdown(void)
{
    pthread_mutex_lock(&lock);
    ch_status st = file ? stop_locked() : CH_OK;
    for (int i = 0; i < ntracks; i++)
        free(tracks[i].name);
    free(tracks);
    tracks = NULL;
    ntracks = tracks_cap = 0;
    pthread_mutex_unlock(&lock);
    return st;
}

int chi_trace_track(const char *name, int sort_index)
{
    if (!chi_tracing() || !name)
        return -1;
    pthread_mutex_lock(&lock);
    int id = -1;
    for (int i = 0; i < ntracks && id < 0; i++)
        if (strcmp(tracks[i].name, name) == 0)
            id = i + 1;
    if (id < 0 && file) {
        if (ntracks == tracks_cap) {
            int ncap = tracks_cap ? 2 * tracks_cap : 16;
            track *nt = realloc(tracks, (size_t)ncap * sizeof *nt);
            if (!nt) {
                fail_locked(CH_ERR_OUT_OF_MEMORY, "ch_trace: no memory for the track %s", name);
                goto out;
            }
            tracks = nt;
            tracks_cap = ncap;
        }
        char *copy = strdup(name);
        if (!copy) {
            fail_locked(CH_ERR_OUT_OF_MEMORY, "ch_trace: no memory for the track %s", name);
            goto out;
        }
        tracks[ntracks].name = copy;
        tracks[ntracks].sort_index = sort_index;
        id = ++ntracks;
        track_meta_locked(id);
    }
out:
    pthread_mutex_unlock(&lock);
    return id;
}

unsigned chi_trace_generation(void)
{
    return atomic_load(&generation);
}

double chi_trace_now(void)
{
    return chi_tracing() ? ch_clock_seconds() : 0.0;
}

/* Start an event's text in *t (name, cat, ph, pid, tid, ts), with the
 * generation it is formatted for in *gen; 0, with nothing to free, when it
 * is dropped: a track below 0, or a time before the trace's origin. */
static int begin_event(text *t, unsigned *gen, int track, const char *name, const char *cat,
                       const char *ph, double when)
{
    if (track < 0)
        return 0;
    *gen = atomic_load(&generation);
    double o = atomic_load(&origin);
    if (!(when >= o))
        return 0;
    text_init(t);
    text_head(t, name, cat, ph, track);
    text_time(t, "ts", (when - o) * 1e6);
    return 1;
}

/* Append the event unless its trace has stopped since it was begun. */
static void end_event(text *t, unsigned gen)
{
    pthread_mutex_lock(&lock);
    if (file && recording == gen)
        event_locked(t);
    pthread_mutex_unlock(&lock);
    text_free(t);
}

static void text_args(text *t, const char *args_json)
{
    if (args_json) {
        text_str(t, ",\"args\":");
        text_str(t, args_json);
    }
}

void chi_trace_slice(int track, const char *name, const char *cat, double t0, double t1,
                     const char *args_json)
{
    text t;
    unsigned gen;
    if (!chi_tracing() || !begin_event(&t, &gen, track, name, cat, "X", t0))
        return;
    text_time(&t, "dur", t1 > t0 ? (t1 - t0) * 1e6 : 0.0);
    text_args(&t, args_json);
    text_add(&t, "}", 1);
    end_event(&t, gen);
}

void chi_trace_instant(int track, const char *name, const char *cat, double when,
                       const char *args_json)
{
    text t;
    unsigned gen;
    if (!chi_tracing() || !begin_event(&t, &gen, track, name, cat, "i", when))
        return;
    text_str(&t, ",\"s\":\"t\"");
    text_args(&t, args_json);
    text_add(&t, "}", 1);
    end_event(&t, gen);
}

void chi_trace_flow(int track, unsigned long long id, int end, const char *name, const char *cat,
                    double when)
{
    text t;
    unsigned gen;
    if (!chi_tracing() || !begin_event(&t, &gen, track, name, cat, end ? "f" : "s", when))
        return;
    text_fmt(&t, ",\"id\":%llu", id);
    if (end)
        text_str(&t, ",\"bp\":\"e\"");
    text_add(&t, "}", 1);
    end_event(&t, gen);
}

void chi_trace_counter(int track, const char *name, double when, const char *series, double value)
{
    text t;
    unsigned gen;
    if (!chi_tracing() || !isfinite(value) || !begin_event(&t, &gen, track, name, NULL, "C", when))
        return;
    text_str(&t, ",\"args\":{");
    text_json_str(&t, series);
    text_fmt(&t, ":%.17g}}", value);
    end_event(&t, gen);
}

double chi_trace_origin(void)
{
    return chi_tracing() ? atomic_load(&origin) : 0.0;
}

void chi_trace_align(double new_origin, double offset, double uncertainty, int rank, int ranks,
                     const char *host)
{
    if (!chi_tracing())
        return;
    pthread_mutex_lock(&lock);
    if (file) {
        atomic_store(&origin, new_origin);
        char name[256];
        snprintf(name, sizeof name, "%s, rank %d of %d on %s", pname, rank, ranks,
                 host ? host : "?");
        meta_locked("process_name", 0, name, 0);
        meta_locked("process_sort_index", 0, NULL, rank);
    }
    pthread_mutex_unlock(&lock);
    char args[160];
    snprintf(args, sizeof args, "{\"rank\":%d,\"offset_s\":%.9f,\"uncertainty_s\":%.9f}", rank,
             offset, uncertainty);
    chi_trace_instant(chi_trace_track("steps", 0), "clock aligned to rank 0", "trace",
                      ch_clock_seconds(), args);
}
