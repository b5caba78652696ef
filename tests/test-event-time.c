/* Device time for the trace (lib/trace_clock.c, each backend's
 * event_seconds): on every device, two events around real work read back
 * on ch_clock_seconds' clock, inside the host's own readings around them
 * (give or take the measured offset's uncertainty); what each backend
 * answers for events it cannot time; the offset measured once per device
 * and trace, by several threads at once; and the "clock calibrated"
 * instants in the trace files. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "../lib/trace.h"

#define MAX_DEVICES 64
#define NTHREADS 4
/* Slack beyond the measured uncertainty: the host's clock readings are
 * taken a few calls away from the records. */
#define SLACK 1e-3

static ch_device *devs[MAX_DEVICES];
static int ndev;

static const char *backend_of(ch_device *dev)
{
    static ch_device_info info;
    return ch_device_get_info(dev, &info) == CH_OK ? info.backend : "?";
}

static int is_host(ch_device *dev)
{
    return strcmp(backend_of(dev), "host") == 0;
}

/* What the device's backend answers for an event it cannot time. */
typedef struct pre_trace {
    ch_stream *stream; /* made before the trace */
    ch_event *early;   /* made and recorded before the trace */
    ch_event *late;    /* made before the trace, recorded during it */
} pre_trace;

static void queue_work(ch_tensor *t)
{
    for (int k = 0; k < 4; k++)
        ch_fill(t, 1.0 + k);
}

/* On `dev`, inside a running trace: e1, work, e2 on a new stream. */
static void check_timing(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_stream *s = NULL;
    ch_event *e1 = NULL, *e2 = NULL;
    ch_tensor *t = NULL;
    int64_t shape[1] = {(int64_t)1 << 22}; /* 16 MiB */
    if (!tap_status_ok(ch_stream_new(&s, dev), "%s: a stream made during the trace", id) ||
        !tap_status_ok(ch_tensor_new(&t, dev, CH_F32, 1, shape), "%s: a 16 MiB tensor", id))
        goto out;
    ch_stream_set_current(s);
    /* Once before, so that building the kernel is not what is timed. */
    ch_fill(t, 0.0);
    ch_stream_sync(s);
    ch_event_new(&e1, dev);
    ch_event_new(&e2, dev);
    double h0 = ch_clock_seconds();
    tap_status_ok(ch_event_record(e1, s), "%s: record e1", id);
    queue_work(t);
    tap_status_ok(ch_event_record(e2, s), "%s: record e2 after 4 fills", id);
    tap_status_ok(ch_event_sync(e2), "%s: e2 completes", id);
    double h1 = ch_clock_seconds();
    double t1 = 0, t2 = 0, off = 0, unc = 0;
    if (!tap_status_ok(chi_trace_event_seconds(e1, &t1), "%s: e1's time", id) ||
        !tap_status_ok(chi_trace_event_seconds(e2, &t2), "%s: e2's time", id) ||
        !tap_status_ok(chi_trace_clock(dev, &off, &unc), "%s: its clock offset", id))
        goto out;
    ch_device_info info;
    ch_device_get_info(dev, &info);
    tap_diag("%s (%s%s%s): offset %.9f s, uncertainty %.3f us; e1 at h0 %+.3f us, e2 at h1 "
             "%+.3f us",
             id, info.backend, info.platform[0] ? ", " : "", info.platform, off, unc * 1e6,
             (t1 - h0) * 1e6, (t2 - h1) * 1e6);
    double lo = h0 - unc - SLACK, hi = h1 + unc + SLACK;
    tap_ok(t1 <= t2, "%s: e1 (%.9f) is not after e2 (%.9f)", id, t1, t2);
    tap_ok(t1 >= lo && t1 <= hi, "%s: e1 at %.9f within [%.9f, %.9f]", id, t1, lo, hi);
    tap_ok(t2 >= lo && t2 <= hi, "%s: e2 at %.9f within [%.9f, %.9f]", id, t2, lo, hi);
    /* 64 MiB written: a millisecond or more on every device here. */
    tap_ok(t2 - t1 > 0, "%s: the work between them took %.3f us > 0", id, (t2 - t1) * 1e6);
    tap_ok(unc >= 0 && (is_host(dev) ? unc == 0 && off == 0 : unc < 0.5 * (h1 - h0) + SLACK),
           "%s: uncertainty %.3f us is %s", id, unc * 1e6,
           is_host(dev) ? "0 with offset 0 (the host's clock is ch_clock_seconds')"
                        : "a fraction of the work's time");
out:
    ch_stream_reset_current(dev);
    ch_tensor_free(t);
    ch_event_free(e1);
    ch_event_free(e2);
    ch_stream_free(s);
}

/* Events the backend cannot time, as each backend answers them. */
static void check_untimed(ch_device *dev, const pre_trace *p)
{
    const char *id = ch_device_id(dev), *be = backend_of(dev);
    double t = 0;
    /* Recorded while no trace ran: the host read no clock, the OpenCL
     * queue did not profile, the CUDA event was made without timing. */
    tap_status_is(chi_trace_event_seconds(p->early, &t), CH_ERR_UNSUPPORTED, NULL,
                  "%s: an event recorded before the trace started cannot tell", id);
    /* Made before the trace, recorded in it on a stream made before. */
    ch_event_record(p->late, p->stream);
    ch_event_sync(p->late);
    ch_status st = chi_trace_event_seconds(p->late, &t);
    if (strcmp(be, "cuda") == 0)
        tap_status_is(st, CH_ERR_UNSUPPORTED, "without timing",
                      "%s: an event made before the trace cannot tell (made without timing)", id);
    else if (strcmp(be, "opencl") == 0)
        tap_status_is(st, CH_ERR_UNSUPPORTED, "profile",
                      "%s: an event on a stream made before the trace cannot tell (its queue "
                      "does not profile)",
                      id);
    else
        tap_status_ok(st, "%s: %s times any event recorded during the trace", id, be);
    /* Made during the trace, recorded on the stream made before it. */
    ch_event *e = NULL;
    ch_event_new(&e, dev);
    ch_event_record(e, p->stream);
    ch_event_sync(e);
    st = chi_trace_event_seconds(e, &t);
    if (strcmp(be, "opencl") == 0)
        tap_status_is(st, CH_ERR_UNSUPPORTED, "profile",
                      "%s: a new event on a stream made before the trace cannot tell", id);
    else
        tap_status_ok(st,
                      "%s: a new event on a stream made before the trace tells (%s times "
                      "events, not streams)",
                      id, be);
    ch_event_free(e);
}

/* Thread i asks every device's offset at once with the others. */
static double thread_offset[NTHREADS][MAX_DEVICES];
static ch_status thread_status[NTHREADS][MAX_DEVICES];

static void *ask_clocks(void *arg)
{
    int i = (int)(intptr_t)arg;
    for (int d = 0; d < ndev; d++) {
        double unc;
        thread_status[i][d] = chi_trace_clock(devs[d], &thread_offset[i][d], &unc);
    }
    return NULL;
}

/* The "clock calibrated" instants among `events` on the track named `track`:
 * how many, and the offset and uncertainty of the last. */
static int calibrations(json_t *events, const char *track, double *offset, double *unc)
{
    long tid = -1;
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        const char *nm = json_string_value(json_object_get(ev, "name"));
        const char *arg = json_string_value(json_object_get(json_object_get(ev, "args"), "name"));
        if (nm && arg && strcmp(nm, "thread_name") == 0 && strcmp(arg, track) == 0)
            tid = (long)json_integer_value(json_object_get(ev, "tid"));
    }
    int n = 0;
    json_array_foreach(events, i, ev) {
        const char *nm = json_string_value(json_object_get(ev, "name"));
        const char *ph = json_string_value(json_object_get(ev, "ph"));
        json_t *args = json_object_get(ev, "args");
        if (!nm || !ph || strcmp(nm, "clock calibrated") != 0 || strcmp(ph, "i") != 0 ||
            json_integer_value(json_object_get(ev, "tid")) != tid)
            continue;
        json_t *o = json_object_get(args, "offset_s"), *u = json_object_get(args, "uncertainty_s");
        if (!json_is_number(o) || !json_is_number(u))
            return -1;
        *offset = json_number_value(o);
        *unc = json_number_value(u);
        n++;
    }
    return n;
}

static json_t *load(const char *path, json_t **root)
{
    json_error_t err;
    *root = json_load_file(path, 0, &err);
    if (!tap_ok(*root != NULL, "%s is valid JSON (%s, line %d)", path, *root ? "ok" : err.text,
                *root ? 0 : err.line))
        return NULL;
    json_t *events = json_object_get(*root, "traceEvents");
    return tap_ok(json_is_array(events), "%s holds traceEvents", path) ? events : NULL;
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    ndev = tap_devices(devs, MAX_DEVICES);
    char dir[] = "/tmp/chorus-test-event-time-XXXXXX";
    if (!mkdtemp(dir))
        tap_skip_all("mkdtemp failed");
    char path1[64], path2[64];
    snprintf(path1, sizeof path1, "%s/one.json", dir);
    snprintf(path2, sizeof path2, "%s/two.json", dir);

    double t = 0, off = 0, unc = 0;
    ch_event *any = NULL;
    ch_event_new(&any, devs[0]);
    tap_status_is(chi_trace_event_seconds(any, &t), CH_ERR_STATE, "no trace",
                  "chi_trace_event_seconds before any trace: CH_ERR_STATE");

    pre_trace pre[MAX_DEVICES];
    for (int d = 0; d < ndev; d++) {
        pre[d] = (pre_trace){0};
        ch_stream_new(&pre[d].stream, devs[d]);
        ch_event_new(&pre[d].early, devs[d]);
        ch_event_new(&pre[d].late, devs[d]);
        ch_event_record(pre[d].early, pre[d].stream);
        ch_event_sync(pre[d].early);
    }

    /* The first trace: every device's events. */
    if (!tap_status_ok(ch_trace_start(path1, NULL), "start a trace to %s", path1))
        return tap_done();
    for (int d = 0; d < ndev; d++) {
        check_timing(devs[d]);
        check_untimed(devs[d], &pre[d]);
    }
    tap_status_is(chi_trace_event_seconds(NULL, &t), CH_ERR_INVALID_ARGUMENT, "event",
                  "a NULL event is refused");
    tap_status_is(chi_trace_clock(devs[0], NULL, &unc), CH_ERR_INVALID_ARGUMENT, "offset",
                  "a NULL offset is refused");
    double first[MAX_DEVICES], first_unc[MAX_DEVICES];
    for (int d = 0; d < ndev; d++)
        chi_trace_clock(devs[d], &first[d], &first_unc[d]);
    tap_status_ok(ch_trace_stop(), "stop the trace");
    tap_status_is(chi_trace_event_seconds(pre[0].early, &t), CH_ERR_STATE, "no trace",
                  "chi_trace_event_seconds with no trace running: CH_ERR_STATE");
    tap_status_is(chi_trace_clock(devs[0], &off, &unc), CH_ERR_STATE, "no trace",
                  "chi_trace_clock with no trace running: CH_ERR_STATE");

    /* The second trace: measured again, once, while NTHREADS ask at once. */
    if (!tap_status_ok(ch_trace_start(path2, NULL), "start a second trace to %s", path2))
        return tap_done();
    pthread_t th[NTHREADS];
    for (int i = 0; i < NTHREADS; i++)
        pthread_create(&th[i], NULL, ask_clocks, (void *)(intptr_t)i);
    for (int i = 0; i < NTHREADS; i++)
        pthread_join(th[i], NULL);
    tap_status_ok(ch_trace_stop(), "stop the second trace");
    for (int d = 0; d < ndev; d++) {
        int same = 1, ok = 1;
        for (int i = 0; i < NTHREADS; i++) {
            ok &= thread_status[i][d] == CH_OK;
            same &= thread_offset[i][d] == thread_offset[0][d];
        }
        tap_ok(ok && same, "%s: %d threads asking at once get one offset (%.9f)",
               ch_device_id(devs[d]), NTHREADS, thread_offset[0][d]);
    }

    /* The files. */
    json_t *root1 = NULL, *root2 = NULL;
    json_t *ev1 = load(path1, &root1), *ev2 = load(path2, &root2);
    for (int d = 0; d < ndev && ev1 && ev2; d++) {
        const char *id = ch_device_id(devs[d]);
        double o1 = 0, u1 = 0, o2 = 0, u2 = 0;
        int n1 = calibrations(ev1, id, &o1, &u1), n2 = calibrations(ev2, id, &o2, &u2);
        tap_ok(n1 == 1 && n2 == 1, "%s: one \"clock calibrated\" instant in each trace (%d, %d)",
               id, n1, n2);
        tap_ok(o1 == first[d] && u1 == first_unc[d],
               "%s: the first trace's instant holds the offset (%.9f +- %.3g, want %.9f +- %.3g)",
               id, o1, u1, first[d], first_unc[d]);
        if (!is_host(devs[d]))
            tap_diag("%s: second trace: offset %.9f s, uncertainty %.3f us", id, o2, u2 * 1e6);
        /* One clock against another over a second or so: no drift to see. */
        tap_ok(fabs(o2 - o1) <= u1 + u2 + SLACK,
               "%s: the two traces' offsets agree (%.9f, %.9f; %.3f us apart)", id, o1, o2,
               fabs(o2 - o1) * 1e6);
    }
    json_decref(root1);
    json_decref(root2);
    unlink(path1);
    unlink(path2);
    rmdir(dir);

    for (int d = 0; d < ndev; d++) {
        ch_event_free(pre[d].early);
        ch_event_free(pre[d].late);
        ch_stream_free(pre[d].stream);
    }
    ch_event_free(any);
    ch_shutdown();
    return tap_done();
}
