/* The reducer's calls on the trace (lib/reduce.c says what the reducer
 * does): while a trace runs, an event is recorded on a participant's
 * stream before and after each of its stages (its download, its upload,
 * its peer all-reduce), and the host's stages of the call (the sum, the
 * stage across processes) are timed on the host's clock. Once every
 * stream is drained the stages become slices: a device's on the tracks
 * of the links that ran them ("link opencl:0 -> host"), the host's on the
 * "reducer" track, each named after the call's label ("bucket 3 d2h",
 * chi_trace_reducer_label). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reduce_impl.h"
#include "trace.h"

void chi_trace_reducer_label(ch_reducer *r, const char *label)
{
    if (r)
        snprintf(r->tr.label, sizeof r->tr.label, "%s", label ? label : "");
}

/* At a traced call: the marks' events, made once (while a trace runs, so
 * that the devices time them). When they cannot be made the call is not
 * traced. */
void chi_reducer_trace_begin(ch_reducer *r)
{
    r->tr.on = 0;
    if (!chi_tracing())
        return;
    size_t k = (size_t)r->n * MARKS;
    if (!r->tr.ev) {
        r->tr.ev = calloc(k, sizeof *r->tr.ev);
        r->tr.host = calloc(k, sizeof *r->tr.host);
        r->tr.set = calloc(k, 1);
        if (!r->tr.ev || !r->tr.host || !r->tr.set) {
            /* Made whole or not at all: the next traced call tries again. */
            free(r->tr.ev), free(r->tr.host), free(r->tr.set);
            r->tr.ev = NULL, r->tr.host = NULL, r->tr.set = NULL;
            return;
        }
        for (int i = 0; i < r->n; i++)
            for (int m = 0; m < MARKS; m++)
                if (!host_memory(r->streams[i]->dev) &&
                    ch_event_new(&r->tr.ev[i * MARKS + m], r->streams[i]->dev) != CH_OK)
                    r->tr.ev[i * MARKS + m] = NULL;
    }
    memset(r->tr.set, 0, k);
    r->tr.sum0 = r->tr.sum1 = r->tr.stage0 = r->tr.stage1 = 0.0;
    r->tr.on = 1;
}

/* Mark `m` of participant i on its stream (a host participant's work is
 * done when its call returns: the host's clock). A mark that cannot be
 * recorded is left out. */
void chi_reducer_trace_mark(ch_reducer *r, int i, int m)
{
    if (!r->tr.on)
        return;
    ch_event *e = r->tr.ev[i * MARKS + m];
    if (e && ch_event_record(e, r->streams[i]) != CH_OK)
        return;
    r->tr.host[i * MARKS + m] = ch_clock_seconds();
    r->tr.set[i * MARKS + m] = 1;
}

static double mark_time(const ch_reducer *r, int i, int m)
{
    double t;
    ch_event *e = r->tr.ev[i * MARKS + m];
    if (e && chi_trace_event_seconds(e, &t) == CH_OK)
        return t;
    return r->tr.host[i * MARKS + m];
}

/* A stage [m0, m1] of participant i as a slice on `track`. */
static void trace_stage(const ch_reducer *r, int i, int m0, const char *track, const char *what)
{
    if (!r->tr.set[i * MARKS + m0] || !r->tr.set[i * MARKS + m0 + 1])
        return;
    char name[96];
    snprintf(name, sizeof name, "%s%s%s", r->tr.label, r->tr.label[0] ? " " : "", what);
    double t0 = mark_time(r, i, m0), t1 = mark_time(r, i, m0 + 1);
    chi_trace_slice(chi_trace_track(track, 200 + i), name, "reduce", t0, t1 > t0 ? t1 : t0, NULL);
}

/* After the call, every stream drained: its stages, on the tracks of the
 * links that ran them (the host's, on the calling thread's "reducer"). */
void chi_reducer_trace_end(ch_reducer *r)
{
    if (!r->tr.on)
        return;
    char track[96];
    for (int i = 0; i < r->n; i++) {
        /* A device that holds several participants (host,host) gives each
         * its own tracks, "host#2": their stages overlap in time. */
        int same = 0, before = 0;
        for (int j = 0; j < r->n; j++) {
            same += r->streams[j]->dev == r->streams[i]->dev;
            before += j < i && r->streams[j]->dev == r->streams[i]->dev;
        }
        char id[64];
        if (same > 1)
            snprintf(id, sizeof id, "%s#%d", ch_device_id(r->streams[i]->dev), before + 1);
        else
            snprintf(id, sizeof id, "%s", ch_device_id(r->streams[i]->dev));
        snprintf(track, sizeof track, "link %s -> host", id);
        trace_stage(r, i, M_D2H0, track, "d2h");
        snprintf(track, sizeof track, "link host -> %s", id);
        trace_stage(r, i, M_H2D0, track, "h2d");
        snprintf(track, sizeof track, "link %s <-> %s", id, r->span ? "ranks" : "peers");
        trace_stage(r, i, M_PEER0, track, "all-reduce");
    }
    char name[96];
    if (r->tr.sum1 > 0.0) {
        snprintf(name, sizeof name, "%s%ssum", r->tr.label, r->tr.label[0] ? " " : "");
        chi_trace_slice(chi_trace_track("reducer", 100), name, "reduce", r->tr.sum0, r->tr.sum1,
                        NULL);
    }
    if (r->tr.stage1 > 0.0) {
        snprintf(name, sizeof name, "%s%sacross processes", r->tr.label, r->tr.label[0] ? " " : "");
        chi_trace_slice(chi_trace_track("link ranks", 190), name, "reduce", r->tr.stage0,
                        r->tr.stage1, NULL);
    }
    r->tr.on = 0;
}

void chi_reducer_trace_free(ch_reducer *r)
{
    for (int k = 0; r->tr.ev && k < r->n * MARKS; k++)
        ch_event_free(r->tr.ev[k]);
    free(r->tr.ev);
    free(r->tr.host);
    free(r->tr.set);
}
