/* The timeline and the step's breakdown (chorus/trace.h, ch_dp): a short
 * data-parallel run over host and every OpenCL device writes a trace that
 * is read back and checked: valid trace-event JSON, a track per device
 * with its phases, slices that nest and do not overlap within a track,
 * every bucket reduced once per step, flows that join slices, steps as
 * long as the caller measured them; the breakdown's parts add up to the
 * step; CH_DP_BUCKET_AUTO chooses a size and trains the same bits as a
 * fixed one with host reduction.
 *
 * Under mpirun (tests/test-timeline.sh), each rank writes its own trace
 * (DIR/trace.rankK.json) and rank 0 checks both: each rank's tracks, one
 * time base (the ranks' steps end together), the clock's alignment. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

enum {
    BATCH = 96,
    STEPS = 5,
    MAXDEV = 8,
    AUTO_STEPS = 14
};

/* ---- Reading a trace ----------------------------------------------------------- */

typedef struct slice {
    double ts, end;
    const char *name, *cat;
    json_t *args;
} slice;

typedef struct track {
    int pid, tid;
    char name[128];
    slice *s;
    int n, cap;
} track;

typedef struct trace {
    json_t *docs[4];
    int ndocs;
    track *t;
    int n, cap;
    json_t **events; /* every event of every file */
    size_t nevents;
} trace;

static track *track_of(trace *tr, int pid, int tid)
{
    for (int i = 0; i < tr->n; i++)
        if (tr->t[i].pid == pid && tr->t[i].tid == tid)
            return &tr->t[i];
    if (tr->n == tr->cap) {
        tr->cap = tr->cap ? 2 * tr->cap : 16;
        tr->t = realloc(tr->t, (size_t)tr->cap * sizeof *tr->t);
    }
    track *t = &tr->t[tr->n++];
    memset(t, 0, sizeof *t);
    t->pid = pid;
    t->tid = tid;
    return t;
}

static const track *track_named(const trace *tr, int pid, const char *name)
{
    for (int i = 0; i < tr->n; i++)
        if ((pid < 0 || tr->t[i].pid == pid) && strcmp(tr->t[i].name, name) == 0)
            return &tr->t[i];
    return NULL;
}

/* Loads the files; 0 with a failing TAP line when one is not a trace. */
static int load(trace *tr, int nfiles, char **files)
{
    memset(tr, 0, sizeof *tr);
    int good = 1;
    for (int f = 0; f < nfiles && f < 4; f++) {
        json_error_t err;
        json_t *doc = json_load_file(files[f], 0, &err);
        json_t *evs = doc ? json_object_get(doc, "traceEvents") : NULL;
        good &= tap_ok(evs && json_is_array(evs), "%s is JSON with a traceEvents array (%s)",
                       files[f], doc ? "" : err.text);
        if (!evs) {
            json_decref(doc);
            continue;
        }
        tr->docs[tr->ndocs++] = doc;
        size_t i;
        json_t *e;
        int fields = 1;
        json_array_foreach(evs, i, e) {
            const char *ph = json_string_value(json_object_get(e, "ph"));
            json_t *pid = json_object_get(e, "pid"), *tid = json_object_get(e, "tid");
            const char *name = json_string_value(json_object_get(e, "name"));
            if (!ph || !name || !json_is_integer(pid) || !json_is_integer(tid)) {
                fields = 0;
                continue;
            }
            tr->events = realloc(tr->events, (tr->nevents + 1) * sizeof *tr->events);
            tr->events[tr->nevents++] = e;
            track *t = track_of(tr, (int)json_integer_value(pid), (int)json_integer_value(tid));
            if (strcmp(ph, "M") == 0 && strcmp(name, "thread_name") == 0)
                snprintf(t->name, sizeof t->name, "%s",
                         json_string_value(json_object_get(json_object_get(e, "args"), "name")));
            if (strcmp(ph, "X") != 0)
                continue;
            json_t *ts = json_object_get(e, "ts"), *dur = json_object_get(e, "dur");
            if (!json_is_number(ts) || !json_is_number(dur) || json_number_value(dur) < 0) {
                fields = 0;
                continue;
            }
            if (t->n == t->cap) {
                t->cap = t->cap ? 2 * t->cap : 64;
                t->s = realloc(t->s, (size_t)t->cap * sizeof *t->s);
            }
            double b = json_number_value(ts);
            t->s[t->n++] =
                (slice){b, b + json_number_value(dur), name,
                        json_string_value(json_object_get(e, "cat")), json_object_get(e, "args")};
        }
        good &= tap_ok(fields,
                       "%s: every event has ph, name, an integer pid and tid; every "
                       "slice a time and a duration >= 0",
                       files[f]);
    }
    return good;
}

static void unload(trace *tr)
{
    for (int i = 0; i < tr->n; i++)
        free(tr->t[i].s);
    free(tr->t);
    free(tr->events);
    for (int d = 0; d < tr->ndocs; d++)
        json_decref(tr->docs[d]);
}

static int by_start(const void *a, const void *b)
{
    const slice *x = a, *y = b;
    if (x->ts != y->ts)
        return x->ts < y->ts ? -1 : 1;
    if (x->end != y->end)
        return x->end > y->end ? -1 : 1; /* the enclosing one first */
    return 0;
}

/* Times are written in microseconds with three decimals. */
#define EPS 0.01

/* Within each track, slices nest: each inside another or apart. */
static void check_nesting(trace *tr)
{
    int bad = 0;
    char first[256] = "";
    for (int i = 0; i < tr->n; i++) {
        track *t = &tr->t[i];
        if (t->n > 1)
            qsort(t->s, (size_t)t->n, sizeof *t->s, by_start);
        const slice *stack[64];
        int depth = 0;
        for (int k = 0; k < t->n; k++) {
            const slice *s = &t->s[k];
            while (depth > 0 && s->ts >= stack[depth - 1]->end - EPS)
                depth--;
            if (depth > 0 && s->end > stack[depth - 1]->end + EPS) {
                if (!bad++)
                    snprintf(first, sizeof first, "on %s, %s [%.3f, %.3f] overlaps %s [%.3f, %.3f]",
                             t->name, s->name, s->ts, s->end, stack[depth - 1]->name,
                             stack[depth - 1]->ts, stack[depth - 1]->end);
                continue;
            }
            if (depth < 64)
                stack[depth++] = s;
        }
    }
    tap_ok(bad == 0, "slices nest and do not overlap within every track (%d do%s%s)", bad,
           bad ? ": " : "", first);
}

/* Every flow has one start and one end, each inside a slice of its
 * track. */
static void check_flows(trace *tr)
{
    int n = 0, outside = 0, unpaired = 0;
    char first[200] = "";
    for (size_t i = 0; i < tr->nevents; i++) {
        json_t *e = tr->events[i];
        const char *ph = json_string_value(json_object_get(e, "ph"));
        if (strcmp(ph, "s") != 0 && strcmp(ph, "f") != 0)
            continue;
        n++;
        json_int_t id = json_integer_value(json_object_get(e, "id"));
        int pairs = 0;
        for (size_t j = 0; j < tr->nevents; j++) {
            json_t *o = tr->events[j];
            const char *oph = json_string_value(json_object_get(o, "ph"));
            if (j != i && json_integer_value(json_object_get(o, "id")) == id &&
                (strcmp(oph, "s") == 0 || strcmp(oph, "f") == 0) && strcmp(oph, ph) != 0)
                pairs++;
        }
        unpaired += pairs != 1;
        track *t = track_of(tr, (int)json_integer_value(json_object_get(e, "pid")),
                            (int)json_integer_value(json_object_get(e, "tid")));
        double ts = json_number_value(json_object_get(e, "ts"));
        int in = 0;
        for (int k = 0; k < t->n && !in; k++)
            in = t->s[k].ts - EPS <= ts && ts <= t->s[k].end + EPS;
        if (!in && !outside++)
            snprintf(first, sizeof first, "%s %lld at %.3f on %s", ph, (long long)id, ts, t->name);
    }
    tap_ok(n > 0, "the trace has flow arrows (%d ends)", n);
    tap_ok(unpaired == 0, "every flow has one start and one end (%d do not)", unpaired);
    tap_ok(outside == 0, "every flow's end lies in a slice of its track (%d do not%s%s)", outside,
           outside ? ": " : "", first);
}

/* Each of steps [1, steps] holds every bucket's reduction once on the
 * reducer's track of process `pid`. */
static void check_buckets(const trace *tr, int pid, int steps, int buckets, const char *who)
{
    const track *red = track_named(tr, pid, "reducer");
    if (!tap_ok(red != NULL, "%s: a reducer track", who))
        return;
    int wrong = 0;
    for (int s = 1; s <= steps; s++)
        for (int b = 0; b < buckets; b++) {
            int seen = 0;
            for (int k = 0; k < red->n; k++) {
                json_t *a = red->s[k].args;
                seen += a && strncmp(red->s[k].name, "bucket ", 7) == 0 &&
                        !strchr(red->s[k].name + 7, ' ') &&
                        json_integer_value(json_object_get(a, "step")) == s &&
                        json_integer_value(json_object_get(a, "bucket")) == b;
            }
            wrong += seen != 1;
        }
    tap_ok(wrong == 0, "%s: each of %d buckets reduced once in each of %d steps (%d not)", who,
           buckets, steps, wrong);
}

/* A track per device label of process `pid`, with its phases. */
static void check_device(const trace *tr, int pid, const char *label)
{
    const track *t = track_named(tr, pid, label);
    int fwd = 0, bwd = 0, mod = 0, upd = 0;
    for (int k = 0; t && k < t->n; k++) {
        fwd += strcmp(t->s[k].name, "forward") == 0;
        bwd += strcmp(t->s[k].name, "backward") == 0;
        mod += strncmp(t->s[k].name, "backward ", 9) == 0;
        upd += strcmp(t->s[k].name, "update") == 0;
    }
    tap_ok(t && fwd > 0 && bwd > 0 && mod > 0 && upd > 0,
           "%s has its track with forward (%d), backward (%d), per-module backward (%d) and "
           "update (%d) slices",
           label, fwd, bwd, mod, upd);
    /* Its worker thread's waits for the device, on the host's clock. */
    char thread[80];
    snprintf(thread, sizeof thread, "%s thread", label);
    const track *w = track_named(tr, pid, thread);
    int waits = 0;
    for (int k = 0; w && k < w->n; k++)
        waits += strncmp(w->s[k].name, "wait for the device", 19) == 0;
    tap_ok(waits >= STEPS, "%s: its thread's waits for the device (%d)", thread, waits);
}

/* ---- The run in one process ------------------------------------------------------ */

/* An MLP of 1.3 M parameters (5.3 MB): three candidates for the automatic
 * bucket size. */
static ch_module *wide_mlp(void)
{
    ch_module *m[6] = {NULL};
    int k = 0;
    ch_nn_flatten(&m[k++]);
    ch_nn_linear(&m[k++], 784, 1024);
    ch_nn_activation(&m[k++], CH_ACT_TANH);
    ch_nn_linear(&m[k++], 1024, 512);
    ch_nn_activation(&m[k++], CH_ACT_TANH);
    ch_nn_linear(&m[k++], 512, 10);
    return tap_sequential(k, m);
}

static ch_batch make_batch(ch_device *host, int seed)
{
    ch_host_buffer *x = NULL, *l = NULL;
    ch_host_buffer_new(&x, host, sizeof(float) * BATCH * 784);
    ch_host_buffer_new(&l, host, sizeof(int32_t) * BATCH);
    tap_rng rng = {(uint64_t)seed + 7};
    float *xp = ch_host_buffer_data(x);
    int32_t *lp = ch_host_buffer_data(l);
    for (int i = 0; i < BATCH * 784; i++)
        xp[i] = tap_rng_uniform(&rng, -1, 1);
    for (int i = 0; i < BATCH; i++)
        lp[i] = (int32_t)(tap_rng_next(&rng) % 10);
    return (ch_batch){x, l, NULL, BATCH, 0, seed};
}

static void free_batch(ch_batch *b)
{
    ch_host_buffer_free(b->images);
    ch_host_buffer_free(b->labels);
}

/* Host and up to three other devices: every OpenCL device here (both
 * vendors' where both are), a GPU where there is one. */
static int pick_devices(ch_device **devs, char labels[][48])
{
    ch_device *all[MAXDEV];
    int n = tap_devices(all, MAXDEV), k = 0;
    for (int i = 0; i < n && k < 4; i++)
        devs[k++] = all[i];
    if (k < 3) { /* no two OpenCL devices: replicas on host too */
        ch_device *host = NULL;
        ch_device_by_name(&host, "host");
        while (k < 3)
            devs[k++] = host;
    }
    for (int i = 0; i < k; i++) {
        int same = 0, before = 0;
        for (int j = 0; j < k; j++) {
            same += devs[j] == devs[i];
            before += j < i && devs[j] == devs[i];
        }
        if (same > 1)
            snprintf(labels[i], 48, "%s#%d", ch_device_id(devs[i]), before + 1);
        else
            snprintf(labels[i], 48, "%s", ch_device_id(devs[i]));
    }
    return k;
}

static void test_one_process(const char *dir)
{
    ch_device *devs[MAXDEV], *host = NULL;
    char labels[MAXDEV][48], names[512] = "";
    int n = pick_devices(devs, labels);
    for (int i = 0; i < n; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", i ? "," : "",
                 labels[i]);
    ch_device_by_name(&host, "host");
    char path[512];
    snprintf(path, sizeof path, "%s/trace.json", dir);
    ch_module *model = tap_smooth_cnn(0);
    ch_module_init(model, 3);
    ch_dp_options o = tap_mnist_dp_options(5);
    o.bucket_bytes = 16 << 10; /* several buckets */
    o.reduce = CH_REDUCE_AUTO;
    tap_status_ok(ch_trace_start(path, NULL), "ch_trace_start(%s)", path);
    ch_dp *dp = NULL;
    if (!tap_status_ok(ch_dp_new(&dp, model, devs, n, &o), "a dp over %s", names)) {
        ch_trace_stop();
        ch_module_free(model);
        return;
    }
    int buckets = ch_dp_bucket_count(dp);
    tap_ok(buckets > 1, "%d buckets of at most 16 KiB", buckets);
    double measured[STEPS + 1] = {0};
    int parts_ok = 1;
    char parts_first[512] = "";
    for (int s = 1; s <= STEPS; s++) {
        ch_batch b = make_batch(host, s);
        float loss = 0;
        double t0 = ch_clock_seconds();
        ch_status st = ch_dp_step(dp, &loss, &b, 0.05f);
        measured[s] = ch_clock_seconds() - t0;
        free_batch(&b);
        if (!tap_status_ok(st, "step %d over %s (loss %.4f, %.1f ms)", s, names, loss,
                           1e3 * measured[s]))
            break;
        ch_dp_breakdown bd[MAXDEV];
        tap_status_ok(ch_dp_last_breakdown(dp, bd, n), "ch_dp_last_breakdown after step %d", s);
        for (int i = 0; i < n; i++) {
            double sum = bd[i].compute + bd[i].wait + bd[i].exposed + bd[i].update;
            tap_diag("step %d %s: step %.2f ms = compute %.2f + wait %.2f + exposed %.2f + "
                     "update %.2f (+ %.2f)%s",
                     s, labels[i], 1e3 * bd[i].step, 1e3 * bd[i].compute, 1e3 * bd[i].wait,
                     1e3 * bd[i].exposed, 1e3 * bd[i].update, 1e3 * (bd[i].step - sum),
                     bd[i].slowest ? ", the slowest" : "");
            /* The first step compiles the devices' kernels: from the
             * second on. */
            int negative =
                bd[i].compute <= 0 || bd[i].wait < 0 || bd[i].exposed < 0 || bd[i].update < 0;
            if (negative && parts_ok) {
                parts_ok = 0;
                snprintf(parts_first, sizeof parts_first, "step %d on %s: a part below 0", s,
                         labels[i]);
            }
            if (s > 1 && fabs(sum - bd[i].step) > 0.05 * bd[i].step && parts_ok) {
                parts_ok = 0;
                snprintf(parts_first, sizeof parts_first, "step %d on %s: %.2f ms of %.2f ms", s,
                         labels[i], 1e3 * sum, 1e3 * bd[i].step);
            }
            if (s > 1 && fabs(bd[i].step - measured[s]) > 0.05 * measured[s] && parts_ok) {
                parts_ok = 0;
                snprintf(parts_first, sizeof parts_first,
                         "step %d: the breakdown's step %.2f ms, the caller's %.2f ms", s,
                         1e3 * bd[i].step, 1e3 * measured[s]);
            }
        }
    }
    tap_ok(parts_ok,
           "the breakdown's parts (compute > 0, the others >= 0) add up to the step within 5%%, "
           "and the step to the caller's measure, on every replica, steps 2 to %d%s%s",
           STEPS, parts_ok ? "" : ": ", parts_first);
    int64_t slow[MAXDEV] = {0}, calls = 0, sum_slow = 0;
    tap_status_ok(ch_dp_slowest_counts(dp, slow, n, &calls), "ch_dp_slowest_counts");
    for (int i = 0; i < n; i++)
        sum_slow += slow[i];
    tap_ok(calls == STEPS && sum_slow == STEPS,
           "%lld calls measured, one replica the slowest of each (%lld in all)", (long long)calls,
           (long long)sum_slow);
    ch_dp_breakdown bd[MAXDEV];
    tap_status_is(ch_dp_last_breakdown(dp, bd, n + 1), CH_ERR_INVALID_ARGUMENT, "n is not",
                  "ch_dp_last_breakdown with another n");
    tap_status_is(ch_dp_last_breakdown(NULL, bd, n), CH_ERR_INVALID_ARGUMENT, "dp is NULL",
                  "ch_dp_last_breakdown(NULL)");
    tap_status_is(ch_dp_last_breakdown(dp, NULL, n), CH_ERR_INVALID_ARGUMENT, "out is NULL",
                  "ch_dp_last_breakdown with out NULL");
    tap_status_is(ch_dp_slowest_counts(dp, slow, n - 1, NULL), CH_ERR_INVALID_ARGUMENT, "n is not",
                  "ch_dp_slowest_counts with another n");
    tap_status_is(ch_dp_slowest_counts(NULL, slow, n, NULL), CH_ERR_INVALID_ARGUMENT, "dp is NULL",
                  "ch_dp_slowest_counts(NULL)");
    int tuning = -1;
    size_t none = ch_dp_bucket_bytes(NULL, &tuning);
    tap_ok(none == 0 && tuning == 0, "ch_dp_bucket_bytes(NULL): 0, not tuning (%zu, %d)", none,
           tuning);
    tap_ok(ch_dp_bucket_bytes(dp, NULL) == 16u << 10,
           "ch_dp_bucket_bytes: the 16 KiB asked for (%zu)", ch_dp_bucket_bytes(dp, NULL));
    tap_status_ok(ch_trace_stop(), "ch_trace_stop");
    /* No trace runs: a step writes nothing more. */
    long before = -1, after = -2;
    FILE *f = fopen(path, "r");
    if (f && fseek(f, 0, SEEK_END) == 0)
        before = ftell(f);
    if (f)
        fclose(f);
    ch_batch b = make_batch(host, 99);
    float loss;
    tap_status_ok(ch_dp_step(dp, &loss, &b, 0.05f), "a step after ch_trace_stop");
    free_batch(&b);
    f = fopen(path, "r");
    if (f && fseek(f, 0, SEEK_END) == 0)
        after = ftell(f);
    if (f)
        fclose(f);
    tap_ok(before > 0 && before == after, "the trace file stays as it was (%ld bytes, then %ld)",
           before, after);
    ch_dp_free(dp);
    ch_module_free(model);

    trace tr;
    char *files[1] = {path};
    if (load(&tr, 1, files)) {
        for (int i = 0; i < n; i++)
            check_device(&tr, -1, labels[i]);
        check_nesting(&tr);
        check_flows(&tr);
        check_buckets(&tr, -1, STEPS, buckets, "one process");
        const track *steps = track_named(&tr, -1, "steps");
        int agree = 1, found = 0;
        char first[160] = "";
        for (int k = 0; steps && k < steps->n; k++) {
            int s = (int)json_integer_value(json_object_get(steps->s[k].args, "step"));
            if (strncmp(steps->s[k].name, "step ", 5) != 0 || s < 1 || s > STEPS)
                continue;
            found++;
            double dur = (steps->s[k].end - steps->s[k].ts) * 1e-6;
            if (fabs(dur - measured[s]) > 0.05 * measured[s] && agree) {
                agree = 0;
                snprintf(first, sizeof first,
                         ": step %d lasts %.2f ms in the trace, %.2f ms "
                         "measured",
                         s, 1e3 * dur, 1e3 * measured[s]);
            }
        }
        tap_ok(found == STEPS && agree,
               "the %d steps' durations in the trace (%d found) agree with the times measured "
               "around ch_dp_step within 5%%%s",
               STEPS, found, first);
        /* Device work timed on the device: the other devices' clocks
         * were calibrated against the host's. */
        for (int i = 0; i < n; i++) {
            if (strcmp(labels[i], "host") == 0 || strncmp(labels[i], "host#", 5) == 0)
                continue;
            const track *t = track_named(&tr, -1, labels[i]);
            int calibrated = 0;
            for (size_t e = 0; t && e < tr.nevents; e++) {
                json_t *ev = tr.events[e];
                calibrated +=
                    json_integer_value(json_object_get(ev, "tid")) == t->tid &&
                    strcmp(json_string_value(json_object_get(ev, "name")), "clock calibrated") == 0;
            }
            tap_ok(calibrated > 0, "%s's clock was calibrated against the host's (%d)", labels[i],
                   calibrated);
        }
        const track *link = NULL;
        for (int i = 0; i < tr.n && !link; i++)
            if (strncmp(tr.t[i].name, "link ", 5) == 0 && tr.t[i].n > 0)
                link = &tr.t[i];
        int devices = 0;
        for (int i = 0; i < n; i++)
            devices += strcmp(ch_device_id(devs[i]), "host") != 0;
        if (devices > 0)
            tap_ok(link != NULL, "the reduction's stages are on the links' tracks (%s)",
                   link ? link->name : "none");
        else
            tap_skip("every replica on the host: no link to a device");
    }
    unload(&tr);
}

/* CH_DP_BUCKET_AUTO: a size chosen, the same bits as a fixed size. */
static void test_auto_buckets(void)
{
    ch_device *devs[MAXDEV], *host = NULL;
    char labels[MAXDEV][48];
    int n = pick_devices(devs, labels);
    if (n > 3)
        n = 3;
    ch_device_by_name(&host, "host");
    float *params[2] = {NULL, NULL};
    int64_t numel = 0;
    size_t chosen = 0;
    int counts_seen[8], ncounts = 0, tuning = 1;
    for (int run = 0; run < 2; run++) {
        ch_module *model = wide_mlp();
        ch_module_init(model, 11);
        ch_dp_options o = tap_mnist_dp_options(5);
        o.reduce = CH_REDUCE_HOST;
        o.bucket_bytes = run ? CH_DP_BUCKET_AUTO : 0;
        ch_dp *dp = NULL;
        ch_status st = ch_dp_new(&dp, model, devs, n, &o);
        if (!tap_status_ok(st, "a dp with bucket_bytes %s", run ? "CH_DP_BUCKET_AUTO" : "0")) {
            ch_module_free(model);
            return;
        }
        for (int s = 0; st == CH_OK && s < AUTO_STEPS; s++) {
            ch_batch b = make_batch(host, 100 + s);
            float loss;
            st = ch_dp_step(dp, &loss, &b, 0.05f);
            free_batch(&b);
            int c = ch_dp_bucket_count(dp), seen = 0;
            for (int k = 0; k < ncounts; k++)
                seen |= counts_seen[k] == c;
            if (run && !seen && ncounts < 8)
                counts_seen[ncounts++] = c;
        }
        tap_status_ok(st, "%d steps with bucket_bytes %s", AUTO_STEPS,
                      run ? "CH_DP_BUCKET_AUTO" : "0");
        if (run)
            chosen = ch_dp_bucket_bytes(dp, &tuning);
        numel = ch_module_param_numel(model);
        params[run] = calloc((size_t)numel, sizeof(float));
        ch_module *host_model = wide_mlp();
        if (ch_dp_sync_to(dp, host_model) == CH_OK) {
            int64_t off = 0;
            for (int p = 0; p < ch_module_param_count(host_model); p++) {
                ch_tensor *v;
                ch_module_param(host_model, p, NULL, &v, NULL);
                ch_tensor_download(v, params[run] + off, ch_tensor_nbytes(v));
                off += ch_tensor_numel(v);
            }
        }
        ch_module_free(host_model);
        ch_dp_free(dp);
        ch_module_free(model);
    }
    tap_ok(!tuning && (chosen == 1u << 20 || chosen == 4u << 20 || chosen == 16u << 20),
           "the automatic bucket size chose %zu MiB after %d steps (still measuring: %d)",
           chosen >> 20, AUTO_STEPS, tuning);
    tap_ok(ncounts >= 2, "it tried %d ways to cut the model into buckets", ncounts);
    int64_t differ = 0;
    for (int64_t i = 0; params[0] && params[1] && i < numel; i++)
        differ += memcmp(&params[0][i], &params[1][i], sizeof(float)) != 0;
    tap_ok(params[0] && params[1] && differ == 0,
           "host reduction: %d steps with the automatic size train the same bits as 25 MiB "
           "buckets (%lld of %lld parameters differ)",
           AUTO_STEPS, (long long)differ, (long long)numel);
    free(params[0]);
    free(params[1]);
}

/* ---- Under mpirun ---------------------------------------------------------------- */

static void test_ranks(const char *dir, const char *all_lists, const char *devices)
{
    ch_dist *world = ch_dist_world();
    int rank = ch_dist_rank(world), ranks = ch_dist_size(world);
    ch_device *devs[MAXDEV], *host = NULL;
    int n = 0;
    ch_device_by_name(&host, "host");
    if (ch_device_list_parse_replicas(devs, MAXDEV, &n, devices) != CH_OK) {
        devs[0] = host;
        n = 1;
    }
    char path[512];
    snprintf(path, sizeof path, "%s/trace.rank%d.json", dir, rank);
    ch_module *model = tap_smooth_cnn(0);
    ch_module_init(model, 3);
    ch_dp_options o = tap_mnist_dp_options(5);
    o.bucket_bytes = 16 << 10;
    o.dist = world;
    ch_status st = ch_trace_start(path, NULL);
    ch_dp *dp = NULL;
    if (st == CH_OK)
        st = ch_dp_new(&dp, model, devs, n, &o);
    int buckets = dp ? ch_dp_bucket_count(dp) : 0;
    for (int s = 1; st == CH_OK && s <= STEPS; s++) {
        ch_batch b = make_batch(host, s);
        float loss;
        st = ch_dp_step(dp, &loss, &b, 0.05f);
        free_batch(&b);
    }
    ch_status stopped = ch_trace_stop();
    ch_dp_free(dp);
    ch_module_free(model);
    double bad = st != CH_OK || stopped != CH_OK;
    ch_dist_sum(world, &bad, 1);
    if (rank != 0)
        return;
    tap_ok(bad == 0, "%d ranks trained %d steps with a trace each", ranks, STEPS);
    char names[4][512];
    char *files[4];
    for (int k = 0; k < ranks && k < 4; k++) {
        snprintf(names[k], sizeof names[k], "%s/trace.rank%d.json", dir, k);
        files[k] = names[k];
    }
    trace tr;
    if (load(&tr, ranks < 4 ? ranks : 4, files)) {
        /* One process group per rank, named for it. */
        int named = 0;
        int pids[4] = {-1, -1, -1, -1};
        for (size_t e = 0; e < tr.nevents; e++) {
            json_t *ev = tr.events[e];
            if (strcmp(json_string_value(json_object_get(ev, "name")), "process_name") != 0)
                continue;
            const char *pn =
                json_string_value(json_object_get(json_object_get(ev, "args"), "name"));
            for (int k = 0; pn && k < ranks && k < 4; k++) {
                char want[32];
                snprintf(want, sizeof want, "rank %d of %d", k, ranks);
                if (strstr(pn, want)) {
                    named |= 1 << k;
                    pids[k] = (int)json_integer_value(json_object_get(ev, "pid"));
                }
            }
        }
        tap_ok(named == (1 << ranks) - 1, "every rank's process is named for its rank (%#x)",
               named);
        for (int k = 0; k < ranks && k < 4; k++) {
            char who[32];
            snprintf(who, sizeof who, "rank %d", k);
            check_buckets(&tr, pids[k], STEPS, buckets, who);
            /* Its devices' tracks: its part of the lists (one device each
             * here). */
            const char *p = all_lists;
            for (int j = 0; j < k && strchr(p, ';'); j++)
                p = strchr(p, ';') + 1;
            char label[64];
            snprintf(label, sizeof label, "%.*s", (int)strcspn(p, ";,"), p);
            check_device(&tr, pids[k], label);
            const track *steps = track_named(&tr, pids[k], "steps");
            tap_ok(steps && steps->n >= STEPS, "rank %d has its steps' track (%d slices)", k,
                   steps ? steps->n : 0);
        }
        check_nesting(&tr);
        check_flows(&tr);
        /* One time base: the ranks' steps end together (each step ends
         * with a collective), to within a few milliseconds. */
        const track *s0 = track_named(&tr, pids[0], "steps"),
                    *s1 = track_named(&tr, pids[1], "steps");
        double worst = 0.0;
        int compared = 0;
        for (int a = 0; s0 && s1 && a < s0->n; a++)
            for (int b = 0; b < s1->n; b++)
                if (strcmp(s0->s[a].name, s1->s[b].name) == 0 &&
                    strncmp(s0->s[a].name, "step ", 5) == 0) {
                    compared++;
                    worst = fmax(worst, fabs(s0->s[a].end - s1->s[b].end));
                }
        tap_ok(compared == STEPS && worst < 20e3,
               "on one time base, rank 1's steps end within %.3f ms of rank 0's (%d compared)",
               worst * 1e-3, compared);
    }
    unload(&tr);
}

int main(int argc, char **argv)
{
    /* test-timeline [DIR] (in one process) or, under mpirun,
     * test-timeline --ranks DIR DEVICES (devices: this rank's part of
     * LIST;LIST, by rank). */
    int ranks = argc > 1 && strcmp(argv[1], "--ranks") == 0;
    if (ranks && ch_dist_launched() && ch_dist_init(&argc, &argv) != CH_OK)
        tap_skip_all("ch_dist_init: %s", ch_last_error());
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    char dir[256];
    if (ranks) {
        snprintf(dir, sizeof dir, "%s", argc > 2 ? argv[2] : ".");
        char mine[128] = "host";
        const char *list = argc > 3 ? argv[3] : "host";
        int want = ch_dist_rank(ch_dist_world());
        for (int k = 0; k < want && strchr(list, ';'); k++)
            list = strchr(list, ';') + 1;
        snprintf(mine, sizeof mine, "%.*s", (int)strcspn(list, ";"), list);
        test_ranks(dir, argc > 3 ? argv[3] : "host", mine);
        int rc = ch_dist_rank(ch_dist_world()) == 0 ? tap_done() : 0;
        ch_shutdown();
        ch_dist_finalize();
        return rc;
    }
    snprintf(dir, sizeof dir, "%s/test-timeline.%d", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    char cmd[300];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0)
        tap_skip_all("cannot make %s", dir);
    test_one_process(dir);
    test_auto_buckets();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        tap_diag("could not remove %s", dir);
    ch_shutdown();
    return tap_done();
}
