/* Data parallelism (nn/dp.c): its part of the trace (chorus/trace.h), the
 * step's breakdown, and the automatic bucket size.
 *
 * The trace. While a trace runs, each replica marks the points of its
 * stream where its phases begin and end (the upload, forward and backward
 * and each top-level module's share of them, the loss, the update) and
 * where a bucket's gradients are ready: an event recorded on its stream
 * and the host's clock. Once the stream has passed them they are resolved
 * to device times (chi_trace_event_seconds: OpenCL profiling, CUDA
 * events; the host's clock at the mark where the device cannot tell) and
 * written as slices on the replica's track, with the gaps where the
 * device waited for the others and for the reduction. The reducer writes
 * each bucket's reduction on its track (and lib/reduce_trace.c its stages on
 * the links'), the calling thread the step. Flow arrows go from each
 * replica's bucket being ready to its reduction, and from the reduction
 * to the replica's update. While no trace runs none of this happens: one
 * relaxed load per call and per mark.
 *
 * The breakdown is taken on the host's clock on every training call, from
 * times the workers read anyway. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dp_impl.h"
#include "trace.h"

#define TRACK_STEPS 0
#define TRACK_REPLICA 10
#define TRACK_REDUCER 100

/* ---- Setting up ------------------------------------------------------------ */

/* The modules whose passes show on the trace: the children of the first
 * module from the root down that has other than one child, a Sequential
 * among them giving its own children instead (a Sequential's layers; a
 * GPT's embeddings, blocks and final norm; a ResNet's stem, blocks and
 * head). Into `out` (NULL: only counted); how many. */
static ch_module *top_parent(ch_module *m)
{
    while (m->nchild == 1)
        m = m->child[0];
    return m;
}

static int is_sequential(const ch_module *m)
{
    return m->nchild > 0 && strcmp(m->ops->kind, "Sequential") == 0;
}

static int top_modules(ch_module *root, ch_module **out)
{
    ch_module *p = top_parent(root);
    int n = 0;
    for (int i = 0; i < p->nchild; i++) {
        ch_module *c = p->child[i];
        if (is_sequential(c)) {
            for (int j = 0; j < c->nchild; j++, n++)
                if (out)
                    out[n] = c->child[j];
        } else {
            if (out)
                out[n] = c;
            n++;
        }
    }
    return n;
}

static void module_path(const ch_module *m, char *out, size_t cap)
{
    char parts[8][32];
    int n = 0;
    for (const ch_module *p = m; p && p->parent && n < 8; p = p->parent)
        if (p->cname[0])
            snprintf(parts[n++], sizeof parts[0], "%s", p->cname);
    size_t len = 0;
    out[0] = '\0';
    for (int i = n - 1; i >= 0 && len < cap; i--) {
        snprintf(out + len, cap - len, "%s%s", i == n - 1 ? "" : ".", parts[i]);
        len += strlen(out + len);
    }
}

ch_status dp_trace_init(ch_dp *dp)
{
    int n = top_modules(dp->r[0].model, NULL);
    dp->tb.last = calloc((size_t)dp->n, sizeof *dp->tb.last);
    dp->tb.slowest = calloc((size_t)dp->n, sizeof *dp->tb.slowest);
    dp->tb.top = calloc((size_t)(n ? n : 1), sizeof *dp->tb.top);
    dp->tb.names = calloc((size_t)(n ? n : 1), sizeof *dp->tb.names);
    if (!dp->tb.last || !dp->tb.slowest || !dp->tb.top || !dp->tb.names)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    dp->tb.ntop = top_modules(dp->r[0].model, dp->tb.top);
    for (int i = 0; i < n; i++) {
        ch_module *c = dp->tb.top[i];
        char path[48];
        module_path(c, path, sizeof path);
        dp->tb.top[i] = c;
        /* "transformer.h.0", "0 (Conv2d)": a Sequential says no more than
         * its path. */
        if (strcmp(c->ops->kind, "Sequential") == 0 && path[0])
            snprintf(dp->tb.names[i], sizeof dp->tb.names[0], "%s", path);
        else
            snprintf(dp->tb.names[i], sizeof dp->tb.names[0], "%s (%s)", path, c->ops->kind);
    }
    for (int i = 0; i < dp->n; i++) {
        replica *r = &dp->r[i];
        int same = 0, before = 0;
        for (int j = 0; j < dp->n; j++) {
            same += dp->r[j].dev == r->dev;
            before += j < i && dp->r[j].dev == r->dev;
        }
        if (same > 1)
            snprintf(r->trace.label, sizeof r->trace.label, "%s#%d", ch_device_id(r->dev),
                     before + 1);
        else
            snprintf(r->trace.label, sizeof r->trace.label, "%s", ch_device_id(r->dev));
        r->trace.flow = calloc((size_t)(dp->bk.count ? dp->bk.count : 1), 1);
        if (!r->trace.flow)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
        r->trace.module = -1;
    }
    return CH_OK;
}

void dp_trace_free(ch_dp *dp)
{
    for (int i = 0; dp->r && i < dp->n; i++) {
        replica *r = &dp->r[i];
        for (int k = 0; k < r->trace.cap; k++)
            ch_event_free(r->trace.marks[k].ev);
        free(r->trace.marks);
        free(r->trace.flow);
        free(r->trace.top);
    }
    free(dp->tb.top);
    free(dp->tb.names);
    free(dp->tb.last);
    free(dp->tb.slowest);
}

/* The top-level module `m` of replica r's model: its index, or -1 (the
 * hook is set on those alone). */
static int top_index(const replica *r, const ch_module *m)
{
    for (int i = 0; i < r->trace.ntop; i++)
        if (r->trace.top[i] == m)
            return i;
    return -1;
}

static void on_pass(void *user, ch_module *m, int backward, int end)
{
    replica *r = user;
    if (!r->trace.on)
        return;
    int i = top_index(r, m);
    if (i < 0)
        return;
    if (backward)
        r->trace.module = end ? -1 : i;
    dp_mark_here(r, backward ? PH_MODULE_B : PH_MODULE_F, end, i);
}

ch_status dp_trace_hook(replica *r)
{
    int n = top_modules(r->model, NULL);
    r->trace.top = calloc((size_t)(n ? n : 1), sizeof *r->trace.top);
    if (!r->trace.top)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    r->trace.ntop = top_modules(r->model, r->trace.top);
    for (int i = 0; i < r->trace.ntop; i++) {
        r->trace.top[i]->pass = on_pass;
        r->trace.top[i]->pass_user = r;
    }
    return CH_OK;
}

/* ---- A replica's marks ------------------------------------------------------ */

void dp_trace_begin(replica *r)
{
    r->trace.on = chi_tracing();
    r->trace.nmarks = 0;
    r->trace.dropped = 0;
    r->trace.module = -1;
    r->trace.bwd_end = 0.0;
    r->trace.nwaits = 0;
    if (r->trace.on)
        memset(r->trace.flow, 0, (size_t)(r->dp->bk.count ? r->dp->bk.count : 1));
}

/* A mark cannot fail the step: one that cannot be recorded is counted and
 * left out. */
void dp_mark_here(replica *r, dp_phase phase, int end, int arg)
{
    if (!r->trace.on)
        return;
    if (r->trace.nmarks == r->trace.cap) {
        int ncap = r->trace.cap ? 2 * r->trace.cap : 64;
        dp_mark *grown = realloc(r->trace.marks, (size_t)ncap * sizeof *grown);
        if (!grown) {
            r->trace.dropped++;
            return;
        }
        r->trace.marks = grown;
        for (int k = r->trace.cap; k < ncap; k++) {
            grown[k].ev = NULL;
            if (ch_event_new(&grown[k].ev, r->dev) != CH_OK)
                grown[k].ev = NULL;
        }
        r->trace.cap = ncap;
    }
    dp_mark *m = &r->trace.marks[r->trace.nmarks];
    if (!m->ev || ch_event_record(m->ev, r->stream) != CH_OK) {
        r->trace.dropped++;
        return;
    }
    m->host = ch_clock_seconds();
    m->t = 0.0;
    m->phase = (int)phase;
    m->end = end;
    m->arg = arg;
    if (phase == PH_READY && arg >= 0 && arg < r->dp->bk.count)
        r->trace.flow[arg] = r->trace.module >= 0;
    r->trace.nmarks++;
}

void dp_trace_wait(replica *r, const char *what, double t0)
{
    if (!r->trace.on || t0 <= 0.0 ||
        r->trace.nwaits == (int)(sizeof r->trace.waits / sizeof r->trace.waits[0]))
        return;
    r->trace.waits[r->trace.nwaits].what = what;
    r->trace.waits[r->trace.nwaits].t0 = t0;
    r->trace.waits[r->trace.nwaits].t1 = ch_clock_seconds();
    r->trace.nwaits++;
}

/* Marks [from, nmarks) to times, in order (a mark the device cannot time
 * takes the host's clock, never earlier than the mark before). */
static void resolve(replica *r, int from)
{
    double prev = from > 0 ? r->trace.marks[from - 1].t : 0.0;
    for (int k = from; k < r->trace.nmarks; k++) {
        dp_mark *m = &r->trace.marks[k];
        if (m->t > 0.0) {
            prev = m->t;
            continue;
        }
        double t;
        if (chi_trace_event_seconds(m->ev, &t) != CH_OK)
            t = m->host;
        m->t = t > prev ? t : prev;
        prev = m->t;
    }
}

void dp_trace_compute_done(replica *r)
{
    if (!r->trace.on)
        return;
    resolve(r, 0);
    for (int k = r->trace.nmarks - 1; k >= 0; k--)
        if (r->trace.marks[k].phase == PH_BACKWARD && r->trace.marks[k].end) {
            r->trace.bwd_end = r->trace.marks[k].t;
            break;
        }
}

static unsigned long long flow_id(const ch_dp *dp, int b, int i, int use)
{
    uint64_t k = ((uint64_t)dp->tb.traced_step * (uint64_t)dp->bk.count + (uint64_t)b) *
                     (uint64_t)dp->procs.nall +
                 (uint64_t)(dp->procs.first + i);
    return (unsigned long long)(k * 2 + (uint64_t)use + 1);
}

static const char *phase_name(const ch_dp *dp, const dp_mark *m, char *buf, size_t cap)
{
    switch ((dp_phase)m->phase) {
    case PH_UPLOAD: return "upload";
    case PH_FORWARD: return "forward";
    case PH_LOSS: return "loss";
    case PH_BACKWARD: return "backward";
    case PH_UPDATE: return "update";
    case PH_READY: return "ready";
    case PH_MODULE_F:
    case PH_MODULE_B:
        snprintf(buf, cap, "%s %s", m->phase == PH_MODULE_F ? "forward" : "backward",
                 m->arg >= 0 && m->arg < dp->tb.ntop ? dp->tb.names[m->arg] : "?");
        return buf;
    }
    return "?";
}

static const char *phase_cat(int phase)
{
    return phase == PH_UPDATE ? "update" : "compute";
}

void dp_trace_replica_end(replica *r)
{
    ch_dp *dp = r->dp;
    if (!r->trace.on || r->st != CH_OK)
        return;
    resolve(r, 0);
    int track = chi_trace_track(r->trace.label, TRACK_REPLICA + 2 * (dp->procs.first + r->index));
    /* Its worker thread's waits, on a track of its own: the host's clock,
     * beside the device's. */
    char thread[64];
    snprintf(thread, sizeof thread, "%s thread", r->trace.label);
    int ttrack = chi_trace_track(thread, TRACK_REPLICA + 2 * (dp->procs.first + r->index) + 1);
    for (int k = 0; k < r->trace.nwaits; k++)
        chi_trace_slice(ttrack, r->trace.waits[k].what, "wait", r->trace.waits[k].t0,
                        r->trace.waits[k].t1, NULL);
    /* The phases: each begin is matched by the next end of its phase
     * (they nest), a stack of at most a few levels. */
    int open[16], depth = 0;
    double upd_b = 0.0, upd_e = 0.0;
    double mod_b[2] = {0.0, 0.0}; /* the open top-level backward's bounds */
    char name[96];
    for (int k = 0; k < r->trace.nmarks; k++) {
        dp_mark *m = &r->trace.marks[k];
        if (m->phase == PH_READY) {
            if (m->arg >= 0 && m->arg < dp->bk.count && r->trace.flow[m->arg])
                chi_trace_flow(track, flow_id(dp, m->arg, r->index, 0), 0, "gradients", "reduce",
                               mod_b[0] + 0.5 * (m->t - mod_b[0]));
            continue;
        }
        if (!m->end) {
            if (depth < 16)
                open[depth++] = k;
            if (m->phase == PH_MODULE_B)
                mod_b[0] = m->t;
            if (m->phase == PH_UPDATE)
                upd_b = m->t;
            continue;
        }
        while (depth > 0 && r->trace.marks[open[depth - 1]].phase != m->phase)
            depth--; /* a begin left open by a failure: not written */
        if (depth == 0)
            continue;
        const dp_mark *b = &r->trace.marks[open[--depth]];
        chi_trace_slice(track, phase_name(dp, b, name, sizeof name), phase_cat(b->phase), b->t,
                        m->t, NULL);
        if (m->phase == PH_UPDATE)
            upd_e = m->t;
    }
    /* The device's gaps after backward: waiting for the slowest replica,
     * then for the reduction (on the device's time, so that it fits
     * between its slices). */
    if (dp->call.sync && r->trace.bwd_end > 0.0 && upd_b > 0.0) {
        double last = r->trace.bwd_end;
        for (int j = 0; j < dp->n; j++)
            if (dp->r[j].trace.bwd_end > last)
                last = dp->r[j].trace.bwd_end;
        if (last > upd_b)
            last = upd_b;
        if (last > r->trace.bwd_end)
            chi_trace_slice(track, "wait for the others", "wait", r->trace.bwd_end, last, NULL);
        if (upd_b > last && dp->threaded)
            chi_trace_slice(track, "wait for the reduction", "wait", last, upd_b, NULL);
        /* The reduced gradients are used by the update. */
        for (int b = 0; upd_e > upd_b && b < dp->bk.count; b++)
            chi_trace_flow(track, flow_id(dp, b, r->index, 1), 1, "reduced", "reduce",
                           0.5 * (upd_b + upd_e));
    }
    if (r->trace.dropped > 0) {
        char args[64];
        snprintf(args, sizeof args, "{\"marks\":%d}", r->trace.dropped);
        chi_trace_instant(track, "marks dropped", "trace", ch_clock_seconds(), args);
    }
}

/* ---- The reducer and the calling thread -------------------------------------- */

void dp_trace_bucket(ch_dp *dp, int b, double t0, double t1)
{
    if (!chi_tracing())
        return;
    int track = chi_trace_track("reducer", TRACK_REDUCER);
    char name[48], args[96];
    snprintf(name, sizeof name, "bucket %d", b);
    snprintf(args, sizeof args, "{\"step\":%lld,\"bucket\":%d,\"elements\":%lld}",
             (long long)dp->tb.traced_step, b, (long long)dp->bk.list[b].count);
    chi_trace_slice(track, name, "reduce", t0, t1, args);
    double mid = 0.5 * (t0 + t1);
    for (int i = 0; i < dp->n; i++) {
        replica *r = &dp->r[i];
        if (!r->trace.on)
            continue;
        if (r->trace.flow[b])
            chi_trace_flow(track, flow_id(dp, b, i, 0), 1, "gradients", "reduce", mid);
        chi_trace_flow(track, flow_id(dp, b, i, 1), 0, "reduced", "reduce", mid);
    }
}

static void tune_after(ch_dp *dp, double exposed);

/* The breakdown of the call just made, on the host's clock. */
static void breakdown(ch_dp *dp, int sync)
{
    double last = 0.0, slowest_s = -1.0;
    int slowest = -1;
    for (int i = 0; i < dp->n; i++)
        if (dp->r[i].compute_end > last)
            last = dp->r[i].compute_end;
    /* The slowest: the longest compute of the job's replicas. */
    for (int k = 0; k < dp->procs.nall; k++)
        if (dp->split.seconds[k] > slowest_s) {
            slowest_s = dp->split.seconds[k];
            slowest = k;
        }
    double step = dp->tb.call_end - dp->tb.call_start;
    double exposed = 0.0;
    if (sync && dp->threaded && dp->red.end > last)
        exposed = dp->red.end - last;
    for (int i = 0; i < dp->n; i++) {
        replica *r = &dp->r[i];
        ch_dp_breakdown *b = &dp->tb.last[i];
        b->step = step;
        b->compute = r->compute_seconds;
        /* Idle: until its worker began the call (the host's threads
         * scheduled late), until the last replica's backward ended, and
         * inside BatchNorm's exchanges. */
        double late = r->t_start > dp->tb.call_start ? r->t_start - dp->tb.call_start : 0.0;
        b->wait = late + (last - r->compute_end) + r->bn.wait;
        b->exposed = exposed;
        /* From the end of the reduction (of the last backward, when it
         * was hidden) to the call's return: the optimizer, the checksum,
         * the last sync, the results shared, the caller woken. The parts
         * partition the call. */
        double from = last + exposed;
        b->update = dp->tb.call_end > from ? dp->tb.call_end - from : 0.0;
        b->slowest = slowest == dp->procs.first + i;
        dp->tb.slowest[i] += b->slowest;
    }
    dp->tb.calls++;
}

void dp_trace_call_end(ch_dp *dp, ch_status st, int sync, int samples)
{
    if (st == CH_OK && dp->call.batch)
        breakdown(dp, sync);
    if (st == CH_OK && sync)
        tune_after(dp, dp->call.batch ? dp->tb.last[0].exposed : 0.0);
    if (!chi_tracing())
        return;
    int track = chi_trace_track("steps", TRACK_STEPS);
    char name[48], args[160];
    if (sync)
        snprintf(name, sizeof name, "step %lld", (long long)dp->tb.traced_step);
    else
        snprintf(name, sizeof name, "micro-batch");
    snprintf(args, sizeof args, "{\"step\":%lld,\"samples\":%d,\"ok\":%s}",
             (long long)dp->tb.traced_step, samples, st == CH_OK ? "true" : "false");
    chi_trace_slice(track, name, "step", dp->tb.call_start, dp->tb.call_end, args);
}

/* ---- The automatic bucket size ---------------------------------------------- */

ch_status dp_rebucket(ch_dp *dp, size_t bytes)
{
    int old_count = dp->bk.count;
    bucket *old_list = dp->bk.list;
    int *old_of = dp->bk.of_param, *old_posted = dp->bk.posted;
    dp->bk.list = NULL;
    dp->bk.of_param = NULL;
    dp->bk.posted = NULL;
    dp->bk.count = 0;
    size_t keep = dp->o.bucket_bytes;
    dp->o.bucket_bytes = bytes;
    ch_status st = dp_make_buckets(dp, dp->r[0].model);
    dp->o.bucket_bytes = keep;
    /* Every replica's gradients move into the new buckets' buffers. */
    ch_tensor ***grads = calloc((size_t)dp->n, sizeof *grads);
    if (st == CH_OK && !grads)
        st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_step: out of memory");
    for (int i = 0; st == CH_OK && i < dp->n; i++) {
        replica *r = &dp->r[i];
        grads[i] = calloc((size_t)dp->bk.count, sizeof *grads[i]);
        if (!grads[i]) {
            st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_step: out of memory");
            break;
        }
        for (int b = 0; st == CH_OK && b < dp->bk.count; b++) {
            int64_t shape[1] = {dp->bk.list[b].count};
            st = ch_tensor_new(&grads[i][b], r->dev, CH_F32, 1, shape);
            if (st == CH_OK)
                st = nn_grads_into(r->model, dp->bk.list[b].p_lo,
                                   dp->bk.list[b].p_hi - dp->bk.list[b].p_lo, grads[i][b]);
        }
        /* The gradients were copied on this thread's stream: done before
         * the worker's stream zeroes them. */
        if (st == CH_OK)
            st = ch_device_sync(r->dev);
    }
    ch_event ***ready = calloc((size_t)dp->n, sizeof *ready);
    int **missing = calloc((size_t)dp->n, sizeof *missing);
    unsigned char **flow = calloc((size_t)dp->n, sizeof *flow);
    if (st == CH_OK && (!ready || !missing || !flow))
        st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_step: out of memory");
    for (int i = 0; st == CH_OK && i < dp->n; i++) {
        size_t nb = (size_t)(dp->bk.count ? dp->bk.count : 1);
        ready[i] = calloc(nb, sizeof *ready[i]);
        missing[i] = calloc(nb, sizeof *missing[i]);
        flow[i] = calloc(nb, 1);
        if (!ready[i] || !missing[i] || !flow[i]) {
            st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_step: out of memory");
            break;
        }
        for (int b = 0; st == CH_OK && b < dp->bk.count; b++)
            st = ch_event_new(&ready[i][b], dp->r[i].dev);
    }
    /* The reducer was made for the largest candidate's buckets
     * (dp_make_reducer): it stays. */
    if (st != CH_OK) {
        /* Back to the old buckets: the gradients' views of them again. */
        for (int i = 0; i < dp->n; i++) {
            replica *r = &dp->r[i];
            for (int b = 0; b < old_count; b++)
                (void)nn_grads_into(r->model, old_list[b].p_lo, old_list[b].p_hi - old_list[b].p_lo,
                                    r->bk.grads[b]);
            (void)ch_device_sync(r->dev);
        }
        for (int i = 0; i < dp->n; i++) {
            for (int b = 0; grads && grads[i] && b < dp->bk.count; b++)
                ch_tensor_free(grads[i][b]);
            for (int b = 0; ready && ready[i] && b < dp->bk.count; b++)
                ch_event_free(ready[i][b]);
            if (grads)
                free(grads[i]);
            if (ready)
                free(ready[i]);
            if (missing)
                free(missing[i]);
            if (flow)
                free(flow[i]);
        }
        free(dp->bk.list);
        free(dp->bk.of_param);
        free(dp->bk.posted);
        dp->bk.list = old_list;
        dp->bk.of_param = old_of;
        dp->bk.posted = old_posted;
        dp->bk.count = old_count;
        free(grads);
        free(ready);
        free(missing);
        free(flow);
        return st;
    }
    for (int i = 0; i < dp->n; i++) {
        replica *r = &dp->r[i];
        for (int b = 0; b < old_count; b++) {
            ch_tensor_free(r->bk.grads[b]);
            ch_event_free(r->bk.ready[b]);
        }
        free(r->bk.grads);
        free(r->bk.ready);
        free(r->bk.missing);
        free(r->trace.flow);
        r->bk.grads = grads[i];
        r->bk.ready = ready[i];
        r->bk.missing = missing[i];
        r->trace.flow = flow[i];
        /* fp16's per-bucket sums are made again for the new count. */
        ch_tensor_free(r->fp16.finite);
        r->fp16.finite = NULL;
        free(r->fp16.finite_host);
        r->fp16.finite_host = NULL;
    }
    free(grads);
    free(ready);
    free(missing);
    free(flow);
    free(old_list);
    free(old_of);
    free(old_posted);
    dp->tune.chosen = bytes;
    return CH_OK;
}

/* Calls measured per candidate, after one that warms it up. */
#define TUNE_CALLS 3

/* The candidates that cut the model differently, smallest first. */
void dp_tune_init(ch_dp *dp)
{
    static const size_t mib[] = {1, 4, 16, 64};
    int64_t total = dp->numel * (int64_t)sizeof(float);
    dp->tune.ncand = 0;
    for (size_t k = 0; k < sizeof mib / sizeof mib[0]; k++) {
        size_t bytes = mib[k] << 20;
        dp->tune.sizes[dp->tune.ncand++] = bytes;
        if ((int64_t)bytes >= total)
            break; /* one bucket already: larger ones cut it alike */
    }
    dp->tune.cand = 0;
    dp->tune.calls = -1; /* the first call of a candidate warms it up */
    for (int k = 0; k < dp->tune.ncand; k++)
        dp->tune.score[k] = 0.0;
    dp->tune.on = dp->tune.ncand > 1 && dp->threaded;
}

/* After a training call that reduced: its exposed reduction counts for the
 * candidate measured (not the call that warms it up). */
static void tune_after(ch_dp *dp, double exposed)
{
    if (!dp->tune.on)
        return;
    if (dp->tune.calls >= 0)
        dp->tune.score[dp->tune.cand] += exposed;
    dp->tune.calls++;
}

ch_status dp_tune_before(ch_dp *dp)
{
    if (!dp->tune.on || dp->tr.micro != 0)
        return CH_OK;
    if (dp->tune.calls < TUNE_CALLS && dp->tune.chosen == dp->tune.sizes[dp->tune.cand])
        return CH_OK;
    if (dp->tune.calls >= TUNE_CALLS) {
        dp->tune.cand++;
        dp->tune.calls = -1;
    }
    if (dp->tune.cand < dp->tune.ncand)
        return dp_rebucket(dp, dp->tune.sizes[dp->tune.cand]);
    /* Measured them all: the least exposed reduction, summed over the
     * processes (every process chooses alike). */
    if (dp->procs.ranks > 1)
        TRY(nn_comm_sum_f64(dp->procs.ctl, dp->tune.score, dp->tune.ncand,
                            "choosing the bucket size"));
    int best = 0;
    for (int k = 1; k < dp->tune.ncand; k++)
        if (dp->tune.score[k] < dp->tune.score[best])
            best = k;
    dp->tune.on = 0;
    if (dp->tune.chosen == dp->tune.sizes[best])
        return CH_OK;
    return dp_rebucket(dp, dp->tune.sizes[best]);
}

/* ---- Across processes: one time base ---------------------------------------- */

#define ALIGN_ROUNDS 8

/* Rank 0's clock against this process's: in every round each process
 * reads its clock before (b) and after (a) a sum over the job, which ends
 * for all of them only after the last one entered; at that moment each
 * clock read between its b and a, so rank 0's clock minus this one's lies
 * in [b0 - a, a0 - b]. The rounds' intervals intersect; the offset is the
 * middle of what is left, its uncertainty half its width. The trace then
 * counts from rank 0's origin. */
ch_status dp_trace_align(ch_dp *dp)
{
    if (dp->procs.ranks < 2)
        return CH_OK;
    /* Every process takes part when any traces: the collectives match. */
    double tracing = chi_tracing() ? 1.0 : 0.0;
    TRY(nn_comm_sum_f64(dp->procs.ctl, &tracing, 1, "ch_dp_new: aligning the ranks' traces"));
    if (tracing == 0.0)
        return CH_OK;
    int per = 1 + 2 * ALIGN_ROUNDS;
    double mine[1 + 2 * ALIGN_ROUNDS];
    double *all = calloc((size_t)dp->procs.ranks * (size_t)per, sizeof *all);
    if (!all)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    mine[0] = chi_trace_origin();
    ch_status st = CH_OK;
    for (int k = 0; st == CH_OK && k < ALIGN_ROUNDS; k++) {
        double one = 0.0;
        mine[1 + 2 * k] = ch_clock_seconds();
        st = nn_comm_sum_f64(dp->procs.ctl, &one, 1, "ch_dp_new: aligning the ranks' traces");
        mine[2 + 2 * k] = ch_clock_seconds();
    }
    if (st == CH_OK)
        st = nn_comm_allgather(dp->procs.ctl, mine, all, sizeof mine,
                               "ch_dp_new: aligning the ranks' traces");
    if (st != CH_OK) {
        free(all);
        return st;
    }
    double lo = -INFINITY, hi = INFINITY, best = INFINITY, mid = 0.0;
    for (int k = 0; k < ALIGN_ROUNDS; k++) {
        double b0 = all[1 + 2 * k], a0 = all[2 + 2 * k];
        double b = mine[1 + 2 * k], a = mine[2 + 2 * k];
        lo = fmax(lo, b0 - a);
        hi = fmin(hi, a0 - b);
        if ((a0 - b0) + (a - b) < best) {
            best = (a0 - b0) + (a - b);
            mid = 0.5 * ((b0 - a) + (a0 - b));
        }
    }
    /* Clocks that drift apart between rounds leave no intersection: the
     * narrowest round's interval then. */
    double offset = lo <= hi ? 0.5 * (lo + hi) : mid;
    double unc = lo <= hi ? 0.5 * (hi - lo) : 0.5 * best;
    if (dp->procs.rank == 0) {
        offset = 0.0;
        unc = 0.0;
    }
    char host[256] = "?";
    if (gethostname(host, sizeof host) != 0)
        snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    chi_trace_align(all[0] - offset, offset, unc, dp->procs.rank, dp->procs.ranks, host);
    free(all);
    return CH_OK;
}
