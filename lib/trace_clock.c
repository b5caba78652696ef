/* Device time for the trace: a backend's reading of an event
 * (event_seconds) moved onto ch_clock_seconds' clock by an offset per
 * device.
 *
 * The offset is measured once per device and trace, when first asked
 * for: on a stream of its own, an event recorded on the empty stream and
 * waited for, with the host's clock read just before the record (h0) and
 * just after the wait (h1). The stream reached the event in between, at
 * device time d, so the true offset lies in [h0 - d, h1 - d]. Of
 * CLOCK_TRIES tries the narrowest interval is kept: its midpoint is the
 * offset, half its width the uncertainty. The host backend's times are
 * ch_clock_seconds readings already: its offset is 0, exactly.
 *
 * A device clock that ticks at another rate drifts from the offset as the
 * trace goes on: a GPU's timer, or PoCL's CLOCK_MONOTONIC_RAW, which NTP
 * does not slew as it slews CLOCK_MONOTONIC (0.2 ppm on our test machine,
 * under a millisecond an hour). */
#include "config.h"

#include <math.h>
#include <stdio.h>

#include <chorus/clock.h>

#include "core.h"
#include "trace.h"

#define CLOCK_TRIES 3

/* Measure dev's offset now (a trace runs, so the stream and the event
 * made here can tell their time). */
static ch_status measure(ch_device *dev, double *offset, double *uncertainty)
{
    const ch_backend_i *be = dev->be->iface;
    ch_stream *s = NULL;
    void *ev = NULL;
    ch_status st = chi_stream_create(&s, dev, 0);
    if (st == CH_OK)
        st = be->event_new(dev->dev, &ev);
    double width = INFINITY;
    for (int i = 0; i < CLOCK_TRIES && st == CH_OK; i++) {
        double d = 0.0, h0 = ch_clock_seconds();
        st = be->event_record(ev, s->handle);
        if (st == CH_OK)
            st = be->event_sync(ev);
        double h1 = ch_clock_seconds();
        if (st == CH_OK)
            st = be->event_seconds(ev, &d);
        if (st == CH_OK && h1 - h0 < width) {
            width = h1 - h0;
            *offset = 0.5 * (h0 + h1) - d;
            *uncertainty = 0.5 * width;
        }
    }
    if (ev)
        be->event_free(ev);
    chi_stream_destroy(s);
    return st;
}

static ch_status untimed(const char *fn, const ch_device *dev)
{
    return chi_error(CH_ERR_UNSUPPORTED, "%s: %s: the %s backend cannot time events", fn, dev->id,
                     dev->be->name);
}

/* dev's offset for the running trace, measured (and written to the trace)
 * the first time this trace asks. `fn` names the caller in errors. */
static ch_status clock_of(const char *fn, ch_device *dev, double *offset, double *uncertainty)
{
    if (!dev->be->iface->event_seconds)
        return untimed(fn, dev);
    chi_clock *c = &dev->clock;
    pthread_mutex_lock(&c->lock);
    unsigned gen = chi_trace_generation();
    ch_status st = CH_OK;
    if (c->generation != gen) {
        double off = 0.0, unc = 0.0;
        if (dev->be->iface != chi_host_backend())
            st = measure(dev, &off, &unc);
        if (st == CH_OK) {
            c->generation = gen;
            c->offset = off;
            c->uncertainty = unc;
            char args[96];
            snprintf(args, sizeof args, "{\"offset_s\":%.17g,\"uncertainty_s\":%.17g}", off, unc);
            chi_trace_instant(chi_trace_track(dev->id, dev->index), "clock calibrated", "clock",
                              ch_clock_seconds(), args);
        } else {
            st = chi_error(st, "%s: measuring %s's clock: %s", fn, dev->id, ch_last_error());
        }
    }
    if (st == CH_OK) {
        *offset = c->offset;
        *uncertainty = c->uncertainty;
    }
    pthread_mutex_unlock(&c->lock);
    return st;
}

static ch_status no_trace(const char *fn)
{
    return chi_error(CH_ERR_STATE, "%s: no trace is running (ch_trace_start first)", fn);
}

ch_status chi_trace_clock(ch_device *dev, double *offset, double *uncertainty)
{
    static const char fn[] = "chi_trace_clock";
    if (!dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: dev is NULL", fn);
    if (!offset || !uncertainty)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !offset ? "offset" : "uncertainty");
    *offset = *uncertainty = 0.0;
    if (!chi_tracing())
        return no_trace(fn);
    return clock_of(fn, dev, offset, uncertainty);
}

ch_status chi_trace_event_seconds(ch_event *event, double *t)
{
    static const char fn[] = "chi_trace_event_seconds";
    if (!event || !t)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !event ? "event" : "t");
    *t = 0.0;
    if (!chi_tracing())
        return no_trace(fn);
    ch_device *dev = event->dev;
    const ch_backend_i *be = dev->be->iface;
    if (!be->event_seconds)
        return untimed(fn, dev);
    double d = 0.0, offset, uncertainty;
    ch_status st = be->event_seconds(event->handle, &d);
    if (st != CH_OK)
        return chi_error(st, "%s: %s: %s", fn, dev->id, ch_last_error());
    st = clock_of(fn, dev, &offset, &uncertainty);
    if (st == CH_OK)
        *t = d + offset;
    return st;
}
