/* The trace recorder (chorus/trace.h, lib/trace.h): its errors, a trace
 * recorded by three threads at once through a tiny buffer, read back with
 * jansson and checked against the trace-event format and against what was
 * recorded, a failing file, and ch_shutdown stopping a trace. */
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tap.h"
#include "../lib/trace.h"

#define NTHREADS 3
#define ITERS 60

static const char *const track_names[NTHREADS] = {"host", "opencl:0", "link opencl:0 -> host"};
static const char tricky[] = "quote \" backslash \\ newline \n tab \t bell \x07 unit \x1f \xc3\xa9";

static int track_ids[NTHREADS], shared_ids[NTHREADS];

/* Thread i: on its own track, ITERS times: an outer slice holding an
 * instant, an inner slice, a flow's start, a counter; the flow ends on the
 * next thread's track. Every thread also asks for the shared "reducer"
 * track at once. */
static void *worker(void *arg)
{
    int i = (int)(intptr_t)arg;
    int me = chi_trace_track(track_names[i], i);
    track_ids[i] = me;
    shared_ids[i] = chi_trace_track("reducer", 10);
    int next = chi_trace_track(track_names[(i + 1) % NTHREADS], (i + 1) % NTHREADS);
    for (int k = 0; k < ITERS; k++) {
        double a = chi_trace_now();
        char args[64];
        snprintf(args, sizeof args, "{\"k\":%d}", k);
        chi_trace_instant(me, "tick", "test", chi_trace_now(), args);
        double b = chi_trace_now();
        double c = chi_trace_now();
        chi_trace_slice(me, "inner", "test", b, c, NULL);
        unsigned long long id = (unsigned long long)i * 1000 + (unsigned long long)k;
        chi_trace_flow(me, id, 0, "hand", "flow", chi_trace_now());
        chi_trace_flow(next, id, 1, "hand", "flow", chi_trace_now());
        chi_trace_counter(me, "queue", chi_trace_now(), "depth", k);
        chi_trace_slice(me, "outer", "test", a, chi_trace_now(), args);
    }
    return NULL;
}

static long file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int has_number(json_t *ev, const char *key, int nonneg)
{
    json_t *v = json_object_get(ev, key);
    return json_is_number(v) && (!nonneg || json_number_value(v) >= 0);
}

static const char *str_of(json_t *ev, const char *key)
{
    json_t *v = json_object_get(ev, key);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

/* The fields each phase needs; a message for the first one missing, else
 * NULL. */
static const char *event_problem(json_t *ev)
{
    if (!json_is_object(ev))
        return "not an object";
    const char *ph = str_of(ev, "ph");
    if (!str_of(ev, "name") || !ph || !json_is_integer(json_object_get(ev, "pid")) ||
        !json_is_integer(json_object_get(ev, "tid")))
        return "name, ph, pid or tid missing";
    if (strcmp(ph, "M") == 0)
        return json_is_object(json_object_get(ev, "args")) ? NULL : "M without args";
    if (!has_number(ev, "ts", 1))
        return "ts missing or negative";
    if (strcmp(ph, "X") == 0)
        return has_number(ev, "dur", 1) && str_of(ev, "cat") ? NULL : "X without dur or cat";
    if (strcmp(ph, "i") == 0)
        return str_of(ev, "s") ? NULL : "i without s";
    if (strcmp(ph, "s") == 0 || strcmp(ph, "f") == 0) {
        if (!json_is_integer(json_object_get(ev, "id")) || !str_of(ev, "cat"))
            return "flow without id or cat";
        const char *bp = str_of(ev, "bp");
        return strcmp(ph, "s") == 0 || (bp && strcmp(bp, "e") == 0) ? NULL : "f without bp e";
    }
    if (strcmp(ph, "C") == 0)
        return json_is_object(json_object_get(ev, "args")) ? NULL : "C without args";
    return "unknown phase";
}

/* The trace's events, or NULL after a failing TAP line. */
static json_t *load_trace(const char *path, json_t **root)
{
    json_error_t err;
    *root = json_load_file(path, 0, &err);
    if (!tap_ok(*root != NULL, "%s is valid JSON (%s at line %d)", path, *root ? "ok" : err.text,
                *root ? 0 : err.line))
        return NULL;
    json_t *events = json_object_get(*root, "traceEvents");
    const char *unit = str_of(*root, "displayTimeUnit");
    if (!tap_ok(json_is_array(events) && unit && strcmp(unit, "ms") == 0,
                "%s: traceEvents is an array, displayTimeUnit \"ms\"", path))
        return NULL;
    return events;
}

/* How many events of phase ph (NULL: any) and name (NULL: any) on tid
 * (-1: any). */
static int count(json_t *events, const char *ph, const char *name, int tid)
{
    int n = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        const char *p = str_of(ev, "ph"), *nm = str_of(ev, "name");
        if ((!ph || (p && strcmp(p, ph) == 0)) && (!name || (nm && strcmp(nm, name) == 0)) &&
            (tid < 0 || json_integer_value(json_object_get(ev, "tid")) == tid))
            n++;
    }
    return n;
}

/* The number of thread_name events on tid naming `name`. */
static int thread_names(json_t *events, int tid, const char *name)
{
    int n = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        const char *nm = str_of(ev, "name");
        if (!nm || strcmp(nm, "thread_name") != 0 ||
            json_integer_value(json_object_get(ev, "tid")) != tid)
            continue;
        const char *arg = str_of(json_object_get(ev, "args"), "name");
        n += arg && strcmp(arg, name) == 0;
    }
    return n;
}

typedef struct span {
    double ts, end;
} span;

static int by_start(const void *pa, const void *pb)
{
    const span *a = pa, *b = pb;
    if (a->ts != b->ts)
        return a->ts < b->ts ? -1 : 1;
    return a->end > b->end ? -1 : a->end < b->end; /* the longer first */
}

/* The X slices of tid nest: each inside another or apart (to the
 * nanosecond the file's times are rounded to). Returns the number of
 * partial overlaps. */
static int partial_overlaps(json_t *events, int tid)
{
    span *s = malloc(json_array_size(events) * sizeof *s + 1);
    span *stack = malloc(json_array_size(events) * sizeof *stack + 1);
    if (!s || !stack) {
        free(s);
        free(stack);
        return -1;
    }
    int n = 0, bad = 0;
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        const char *p = str_of(ev, "ph");
        if (p && strcmp(p, "X") == 0 && json_integer_value(json_object_get(ev, "tid")) == tid) {
            double ts = json_number_value(json_object_get(ev, "ts"));
            s[n].ts = ts;
            s[n++].end = ts + json_number_value(json_object_get(ev, "dur"));
        }
    }
    qsort(s, (size_t)n, sizeof *s, by_start);
    int depth = 0;
    const double eps = 0.002;
    for (int k = 0; k < n; k++) {
        while (depth > 0 && stack[depth - 1].end <= s[k].ts + eps)
            depth--;
        if (depth > 0 && s[k].end > stack[depth - 1].end + eps)
            bad++;
        stack[depth++] = s[k];
    }
    free(s);
    free(stack);
    return bad;
}

/* Along the file, on tid, the times of the events of phase ph and name
 * (for X: their ends) never go back. */
static int in_order(json_t *events, const char *ph, const char *name, int tid)
{
    double last = -1;
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        const char *p = str_of(ev, "ph"), *nm = str_of(ev, "name");
        if (!p || strcmp(p, ph) != 0 || !nm || strcmp(nm, name) != 0 ||
            json_integer_value(json_object_get(ev, "tid")) != tid)
            continue;
        double t = json_number_value(json_object_get(ev, "ts"));
        if (strcmp(ph, "X") == 0)
            t += json_number_value(json_object_get(ev, "dur"));
        if (t < last - 0.002)
            return 0;
        last = t;
    }
    return 1;
}

static void check_main_trace(const char *path, int ghost_sent)
{
    json_t *root, *events = load_trace(path, &root);
    if (!events) {
        json_decref(root);
        return;
    }
    size_t i;
    json_t *ev;
    int bad = 0;
    const char *why = NULL;
    json_array_foreach(events, i, ev) {
        const char *p = event_problem(ev);
        if (p) {
            bad++;
            why = p;
        }
    }
    tap_ok(bad == 0, "every one of %zu events has the fields its phase needs (%d without: %s)",
           json_array_size(events), bad, why ? why : "none");

    int pname = 0, pname_ok = 0;
    json_array_foreach(events, i, ev) {
        const char *nm = str_of(ev, "name");
        if (nm && strcmp(nm, "process_name") == 0) {
            pname++;
            const char *arg = str_of(json_object_get(ev, "args"), "name");
            pname_ok = arg && strcmp(arg, "test \"process\"") == 0;
        }
    }
    tap_ok(pname == 1 && pname_ok, "process_name once (%d), with its quotes read back", pname);

    for (int t = 0; t < NTHREADS; t++) {
        int tid = track_ids[t];
        tap_ok(thread_names(events, tid, track_names[t]) == 1 &&
                   count(events, "M", "thread_name", tid) == 1 &&
                   count(events, "M", "thread_sort_index", tid) == 1,
               "track %s (tid %d): thread_name and thread_sort_index exactly once", track_names[t],
               tid);
        int slices = count(events, "X", NULL, tid);
        int overl = partial_overlaps(events, tid);
        tap_ok(overl == 0 && slices == 2 * ITERS + (t == 0),
               "track %s: %d slices (want %d), %d partial overlaps", track_names[t], slices,
               2 * ITERS + (t == 0), overl);
        int n_tick = count(events, "i", "tick", tid), n_s = count(events, "s", "hand", tid);
        int n_f = count(events, "f", "hand", tid), n_c = count(events, "C", "queue", tid);
        tap_ok(n_tick == ITERS && n_s == ITERS && n_f == ITERS && n_c == ITERS,
               "track %s: %d instants, %d flow starts, %d flow ends, %d counters (want %d each)",
               track_names[t], n_tick, n_s, n_f, n_c, ITERS);
        tap_ok(in_order(events, "i", "tick", tid) && in_order(events, "C", "queue", tid) &&
                   in_order(events, "s", "hand", tid) && in_order(events, "X", "outer", tid),
               "track %s: instants, counters, flow starts and outer slices' ends in the order "
               "recorded",
               track_names[t]);
    }
    int rtid = shared_ids[0];
    tap_ok(shared_ids[1] == rtid && shared_ids[2] == rtid && rtid > 0 &&
               thread_names(events, rtid, "reducer") == 1,
           "three threads asking for \"reducer\" at once got one track (%d %d %d), named once",
           shared_ids[0], shared_ids[1], shared_ids[2]);
    tap_ok(track_ids[0] != track_ids[1] && track_ids[1] != track_ids[2] &&
               track_ids[0] != track_ids[2] && track_ids[0] > 0,
           "the three tracks are distinct (%d %d %d)", track_ids[0], track_ids[1], track_ids[2]);

    /* Every flow id has one start and one end. */
    int starts[NTHREADS][ITERS] = {{0}}, ends[NTHREADS][ITERS] = {{0}}, stray = 0;
    json_array_foreach(events, i, ev) {
        const char *p = str_of(ev, "ph");
        if (!p || (strcmp(p, "s") != 0 && strcmp(p, "f") != 0))
            continue;
        long long id = json_integer_value(json_object_get(ev, "id"));
        if (id < 0 || id / 1000 >= NTHREADS || id % 1000 >= ITERS) {
            stray++;
            continue;
        }
        (*p == 's' ? starts : ends)[id / 1000][id % 1000]++;
    }
    int unmatched = 0;
    for (int t = 0; t < NTHREADS; t++)
        for (int k = 0; k < ITERS; k++)
            unmatched += starts[t][k] != 1 || ends[t][k] != 1;
    tap_ok(stray == 0 && unmatched == 0,
           "each of %d flow ids has one start and one end (%d not, %d unknown ids)",
           NTHREADS * ITERS, unmatched, stray);

    int tricky_found = 0;
    json_array_foreach(events, i, ev) {
        const char *nm = str_of(ev, "name"), *cat = str_of(ev, "cat");
        const char *arg = str_of(json_object_get(ev, "args"), "note");
        if (nm && strcmp(nm, tricky) == 0 && cat && strcmp(cat, tricky) == 0 && arg &&
            strcmp(arg, "a \"quoted\" arg") == 0)
            tricky_found++;
    }
    tap_ok(tricky_found == 1,
           "a name and a category with quotes, backslashes and control characters read back "
           "unchanged (%d found)",
           tricky_found);
    tap_ok(count(events, NULL, "ghost", -1) == 0 && count(events, NULL, "early", -1) == 0,
           "events sent while no trace ran (%d), on no track, or from before the start are "
           "absent",
           ghost_sent);
    int total = (int)json_array_size(events);
    /* process_name, 4 tracks x 2 metadata, 6 events x ITERS x threads, the tricky one. */
    int want = 1 + 2 * (NTHREADS + 1) + 6 * ITERS * NTHREADS + 1;
    tap_ok(total == want, "%d events in all, want %d", total, want);
    json_decref(root);
}

int main(void)
{
    char dir[] = "/tmp/chorus-test-trace-XXXXXX";
    if (!mkdtemp(dir)) {
        tap_ok(0, "mkdtemp %s", dir);
        return tap_done();
    }
    char path[256], path2[256], path3[256], bad[300];
    snprintf(path, sizeof path, "%s/main.json", dir);
    snprintf(path2, sizeof path2, "%s/again.json", dir);
    snprintf(path3, sizeof path3, "%s/shutdown.json", dir);
    snprintf(bad, sizeof bad, "%s/no-such-dir/t.json", dir);

    /* ---- errors, and events while no trace runs ---- */
    tap_status_is(ch_trace_stop(), CH_ERR_STATE, "no trace", "stop with no trace running");
    tap_status_is(ch_trace_start(NULL, NULL), CH_ERR_INVALID_ARGUMENT, "path", "start(NULL)");
    tap_status_is(ch_trace_start(bad, NULL), CH_ERR_IO, bad,
                  "start on a path in a missing folder names it");
    tap_ok(!ch_trace_running(), "no trace runs after the failed starts");
    int ghost_sent = 0;
    tap_ok(chi_trace_track("ghost", 0) == -1 && chi_trace_now() == 0,
           "with no trace, chi_trace_track is -1 and chi_trace_now 0");
    for (int tr = 0; tr < 4; tr++, ghost_sent += 4) {
        chi_trace_slice(tr, "ghost", "ghost", 1, 2, NULL);
        chi_trace_instant(tr, "ghost", "ghost", 1, NULL);
        chi_trace_flow(tr, 7, tr & 1, "ghost", "ghost", 1);
        chi_trace_counter(tr, "ghost", 1, "ghost", 1);
    }

    /* ---- three threads through a 256-byte buffer ---- */
    ch_trace_options opts = {.flush_bytes = 256, .process_name = "test \"process\""};
    tap_status_ok(ch_trace_start(path, &opts), "start %s with flush_bytes 256", path);
    tap_ok(ch_trace_running(), "a trace runs");
    tap_status_is(ch_trace_start(path2, NULL), CH_ERR_STATE, path,
                  "a second start names the running trace's file");
    double early = chi_trace_now() - 1.0;
    pthread_t th[NTHREADS];
    int started = 0;
    for (int i = 0; i < NTHREADS; i++)
        started += pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i) == 0;
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    tap_ok(started == NTHREADS, "%d threads recorded", started);
    chi_trace_slice(-1, "ghost", "ghost", chi_trace_now(), chi_trace_now(), NULL);
    chi_trace_slice(track_ids[0], "early", "test", early, chi_trace_now(), NULL);
    double t = chi_trace_now();
    chi_trace_slice(track_ids[0], tricky, tricky, t, t, "{\"note\":\"a \\\"quoted\\\" arg\"}");
    long before = file_size(path);
    tap_status_ok(ch_trace_stop(), "stop");
    long after = file_size(path);
    tap_ok(before > 0 && after - before < 2048,
           "the events were streamed while recording (%ld bytes before stop, %ld after)", before,
           after);
    tap_ok(!ch_trace_running(), "no trace runs after stop");
    check_main_trace(path, ghost_sent);

    /* ---- a second trace names the tracks made in the first again ---- */
    tap_status_ok(ch_trace_start(path2, NULL), "start %s with the defaults", path2);
    int host = chi_trace_track("host", 0);
    t = chi_trace_now();
    chi_trace_slice(host, "again", "test", t, t + 1e-6, NULL);
    tap_status_ok(ch_trace_stop(), "stop %s", path2);
    json_t *root, *events = load_trace(path2, &root);
    if (events) {
        char pname[64];
        snprintf(pname, sizeof pname, "chorus %d", (int)getpid());
        int pn = 0;
        size_t i;
        json_t *ev;
        json_array_foreach(events, i, ev) {
            const char *arg = str_of(json_object_get(ev, "args"), "name");
            pn += arg && strcmp(arg, pname) == 0;
        }
        tap_ok(host == track_ids[0] && thread_names(events, host, "host") == 1 &&
                   count(events, "X", "again", host) == 1 && pn == 1 &&
                   count(events, "M", "thread_name", -1) == NTHREADS + 1,
               "the second trace: \"host\" keeps id %d (got %d), each track named once, "
               "the default process name \"%s\" (%d)",
               track_ids[0], host, pname, pn);
    }
    json_decref(root);

    /* ---- a file that fails its writes ---- */
    if (access("/dev/full", W_OK) == 0) {
        ch_trace_options small = {.flush_bytes = 64};
        tap_status_ok(ch_trace_start("/dev/full", &small), "start /dev/full");
        int tr = chi_trace_track("host", 0);
        for (int k = 0; k < 100; k++) {
            t = chi_trace_now();
            chi_trace_slice(tr, "lost", "test", t, t, NULL);
        }
        tap_status_is(ch_trace_stop(), CH_ERR_IO, "/dev/full",
                      "stop reports the failed writes, naming the file");
        tap_ok(!ch_trace_running(), "and the trace is stopped");
    } else {
        tap_skip("/dev/full is not writable here");
    }

    /* ---- ch_shutdown stops a running trace ---- */
    tap_status_ok(ch_trace_start(path3, NULL), "start %s", path3);
    int tr = chi_trace_track("host", 0);
    t = chi_trace_now();
    chi_trace_slice(tr, "last", "test", t, t, NULL);
    ch_shutdown();
    tap_ok(!ch_trace_running(), "ch_shutdown stopped the trace");
    events = load_trace(path3, &root);
    if (events)
        tap_ok(count(events, "X", "last", -1) == 1, "its last slice was written");
    json_decref(root);

    remove(path);
    remove(path2);
    remove(path3);
    rmdir(dir);
    return tap_done();
}
