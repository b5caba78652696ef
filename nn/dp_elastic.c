/* Elastic data parallelism inside one process (ch_dp_options.elastic).
 *
 * The caller's handle holds no replicas: every call goes to the object
 * that does (el.live, made by dp_create). When a training or evaluation
 * call fails, every device of the replicas is probed (nn/dp_watchdog.c: a
 * small stream, a one-element fill and download, in a thread of its own
 * given a second to answer); a device that does not answer, or fails the
 * probe twice, is lost. The state the replicas share is then taken from
 * the first replica left (its parameters and buffers cloned to the host,
 * its optimizer's state copied beside them, the step counts, the loss
 * scale), the old object is freed, and a new one made over ch_dp_new's
 * devices without the lost ones, from that state: the same as a run that
 * had only those devices from this step on. The call is then made again,
 * except after a failure inside the optimizer's update that every replica
 * left had completed: the step held on them, and is counted.
 *
 * A replica whose device stops answering holds its worker thread (or the
 * reducer's) inside the backend: the calling thread waits for a call at
 * most elastic_timeout seconds before it probes the devices, and gives
 * the call up when a busy replica's device does not answer (dp_wait_call,
 * nn/dp_watchdog.c). The old object is then left to the threads that did
 * not come back: the last of them frees it when the device lets it go
 * (chi_dp_abandoned counts those objects).
 *
 * ch_dp_rejoin probes the lost devices and makes a new object over every
 * device that answers, before freeing the old one, so that a failure
 * leaves the dp as it was. */
#include "config.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp_impl.h"

/* What a new object of replicas starts from. */
struct el_state {
    ch_module *model;  /* parameters and buffers */
    ch_optimizer *opt; /* the optimizer's state and step count */
    int64_t step;
    float scaler;
    int scaler_clean;
    int64_t skipped;
    size_t bucket; /* the bucket size chosen, 0: as options say */
};

/* Objects given up with a thread that did not come back, not freed yet. */
static atomic_int abandoned;

#ifdef CHI_TEST_HOOKS
int chi_dp_abandoned(void)
{
    return atomic_load(&abandoned);
}
#endif

/* ---- Freeing an object of replicas ------------------------------------------------- */

void dp_thread_exit(ch_dp *dp, int *exited)
{
    pthread_mutex_lock(&dp->w.lock);
    *exited = 1;
    int last = dp->el.abandoned && dp->red.exited;
    for (int i = 0; last && i < dp->n; i++)
        last = dp->r[i].exited || !dp->r[i].started;
    pthread_mutex_unlock(&dp->w.lock);
    if (last) {
        /* Every thread is detached: nothing to join. */
        for (int i = 0; i < dp->n; i++)
            dp->r[i].started = 0;
        dp->red.started = 0;
        dp_destroy(dp);
        atomic_fetch_sub(&abandoned, 1);
    }
}

/* The object `c` goes: freed, or, when a thread did not come back from a
 * call given up, left to that thread. */
static void retire(ch_dp *c)
{
    int silent = 0;
    for (int i = 0; i < c->n; i++)
        silent |= c->r[i].hung;
    if (!silent || !c->threaded) {
        dp_destroy(c);
        return;
    }
    pthread_mutex_lock(&c->w.lock);
    c->w.quit = 1;
    pthread_cond_broadcast(&c->w.go);
    /* The threads that came back from the call return now. */
    double deadline = ch_clock_seconds() + 2.0;
    for (;;) {
        int waiting = !c->red.exited && c->red.done;
        for (int i = 0; i < c->n; i++)
            waiting |= !c->r[i].exited && !c->r[i].busy;
        if (!waiting || ch_clock_seconds() > deadline)
            break;
        pthread_mutex_unlock(&c->w.lock);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
        pthread_mutex_lock(&c->w.lock);
    }
    int all = c->red.exited;
    for (int i = 0; i < c->n; i++)
        all &= c->r[i].exited;
    if (!all) {
        c->el.abandoned = 1;
        atomic_fetch_add(&abandoned, 1);
    }
    pthread_mutex_unlock(&c->w.lock);
    if (all) {
        dp_destroy(c); /* every thread returned after all: joined there */
        return;
    }
    /* Join the threads that returned, leave the others detached: the last
     * of them frees the object (dp_thread_exit). */
    for (int i = 0; i < c->n; i++) {
        if (c->r[i].started && c->r[i].exited)
            pthread_join(c->r[i].thread, NULL);
        else if (c->r[i].started)
            pthread_detach(c->r[i].thread);
    }
    if (c->red.started && c->red.exited)
        pthread_join(c->red.thread, NULL);
    else if (c->red.started)
        pthread_detach(c->red.thread);
    /* Nothing more is freed here: the silent threads still read the
     * object (the reducer every replica's gradients). */
}

/* ---- The state a new object starts from -------------------------------------------- */

static void state_free(struct el_state *s)
{
    if (!s)
        return;
    ch_optimizer_free(s->opt);
    ch_module_free(s->model);
    free(s);
}

/* Replica `lead` of `c`'s parameters, buffers and optimizer state, on the
 * host (on its own device where no host device is visible): the model
 * cloned there, the optimizer's state made beside its parameters. */
static ch_status capture(ch_dp *c, int lead, struct el_state **out)
{
    *out = NULL;
    struct el_state *s = calloc(1, sizeof *s);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "out of memory");
    replica *r = &c->r[lead];
    ch_device *home = NULL;
    if (ch_device_by_name(&home, "host") != CH_OK)
        home = r->dev;
    ch_clear_error();
    ch_status st = ch_module_clone(&s->model, r->model, home);
    if (st == CH_OK)
        st = ch_dp_sync_to(c, s->model); /* buffers too, from the lead */
    if (st == CH_OK)
        st = ch_optimizer_new(&s->opt, s->model, &c->o.optimizer);
    int ns = st == CH_OK ? ch_optimizer_state_count(r->opt) : 0;
    for (int i = 0; st == CH_OK && i < ns; i++) {
        ch_tensor *src = NULL, *dst = NULL;
        st = ch_optimizer_state(r->opt, i, NULL, &src);
        if (st != CH_OK || !src)
            continue;
        /* A whole state (elastic refuses shard_optimizer): the parameter's
         * shape, on `home` with the clone's parameters. */
        st = nn_optimizer_state_make(s->opt, i, &dst);
        if (st == CH_OK)
            st = ch_copy(dst, src);
    }
    if (st == CH_OK)
        st = ch_optimizer_set_steps(s->opt, ch_optimizer_steps(r->opt));
    if (st != CH_OK) {
        state_free(s);
        return st;
    }
    s->step = c->tr.step;
    s->scaler = c->tr.scaler;
    s->scaler_clean = c->tr.scaler_clean;
    s->skipped = c->tr.skipped;
    s->bucket = c->tune.on ? 0 : c->tune.chosen;
    *out = s;
    return CH_OK;
}

/* A new object of replicas over the handle's devices that are not gone,
 * from state s. */
static ch_status make_live(ch_dp *h, const struct el_state *s, ch_dp **out)
{
    *out = NULL;
    int n = 0;
    ch_device **devs = malloc((size_t)h->el.nall * sizeof *devs);
    float *w = h->el.weights ? malloc((size_t)h->el.nall * sizeof *w) : NULL;
    if (!devs || (h->el.weights && !w)) {
        free(devs);
        free(w);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "out of memory");
    }
    for (int i = 0; i < h->el.nall; i++)
        if (!h->el.gone[i]) {
            if (w)
                w[n] = h->el.weights[i];
            devs[n++] = h->el.devs[i];
        }
    ch_dp_options o = h->o;
    o.weights = w;
    o.nweights = w ? n : 0;
    if (s->bucket)
        o.bucket_bytes = s->bucket;
    ch_dp *c = NULL;
    ch_status st = n > 0 ? dp_create(&c, s->model, devs, n, &o)
                         : chi_error(CH_ERR_UNAVAILABLE, "no device is left");
    free(devs);
    free(w);
    if (st == CH_OK)
        c->el.handle = h;
    if (st == CH_OK && ch_optimizer_steps(s->opt) > 0)
        st = ch_dp_optimizer_set(c, s->opt);
    if (st != CH_OK) {
        dp_destroy(c);
        return st;
    }
    c->tr.step = s->step;
    c->tr.scaler = s->scaler;
    c->tr.scaler_clean = s->scaler_clean;
    c->tr.skipped = s->skipped;
    *out = c;
    return CH_OK;
}

/* The handle's object of replicas, made again from the pending state if
 * an earlier attempt failed. */
static ch_status ensure_live(ch_dp *h, const char *fn)
{
    if (h->el.live)
        return CH_OK;
    if (!h->el.pending)
        return chi_error(CH_ERR_STATE, "%s: the dp has no replicas", fn);
    ch_dp *c = NULL;
    ch_status st = make_live(h, h->el.pending, &c);
    if (st != CH_OK)
        return chi_error(st, "%s: making the replicas again over the devices left: %s", fn,
                         ch_last_error());
    state_free(h->el.pending);
    h->el.pending = NULL;
    h->el.live = c;
    return CH_OK;
}

/* ---- What was lost ------------------------------------------------------------------ */

static ch_dp_change *log_add(ch_dp *h)
{
    if (h->el.nlog == h->el.caplog) {
        int cap = h->el.caplog ? 2 * h->el.caplog : 8;
        ch_dp_change *g = realloc(h->el.log, (size_t)cap * sizeof *g);
        if (!g)
            return NULL;
        h->el.log = g;
        h->el.caplog = cap;
    }
    ch_dp_change *e = &h->el.log[h->el.nlog++];
    memset(e, 0, sizeof *e);
    return e;
}

static int remaining(const ch_dp *h)
{
    int n = 0;
    for (int i = 0; i < h->el.nall; i++)
        n += !h->el.gone[i];
    return n;
}

/* The names of the devices not gone, "host, opencl:0". */
static void names_left(const ch_dp *h, char *buf, size_t cap)
{
    buf[0] = '\0';
    size_t len = 0;
    for (int i = 0; i < h->el.nall && len < cap; i++)
        if (!h->el.gone[i])
            len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? ", " : "",
                                    ch_device_id(h->el.devs[i]));
}

/* After a failed call on c: which replicas' devices are lost (lost[i]),
 * and how many. A replica that stopped answering is lost; the others'
 * devices are probed. */
static int find_lost(ch_dp *c, int *lost)
{
    ch_device **devs = malloc((size_t)c->n * sizeof *devs);
    int *ok = malloc((size_t)c->n * sizeof *ok);
    if (!devs || !ok) {
        free(devs);
        free(ok);
        return 0;
    }
    for (int i = 0; i < c->n; i++)
        devs[i] = c->r[i].dev;
    dp_probe_all(devs, c->n, 1.0, ok);
    int n = 0;
    for (int i = 0; i < c->n; i++) {
        lost[i] = c->r[i].hung || !ok[i];
        n += lost[i];
    }
    free(devs);
    free(ok);
    return n;
}

/* Replace h's object c, whose replicas lost[] are lost, by one over the
 * devices left. `held`: the step's update held on every replica left
 * (counted in the state). `why`: the call's failure. */
static ch_status replace(ch_dp *h, ch_dp *c, const int *lost, int held, double t0, const char *why,
                         const char *fn)
{
    int lead = -1;
    for (int i = 0; i < c->n && lead < 0; i++)
        if (!lost[i])
            lead = i;
    for (int i = 0; i < c->n; i++)
        c->r[i].mb.out = lost[i]; /* ch_dp_sync_to reads the lead */
    struct el_state *s = NULL;
    ch_status st = capture(c, lead, &s);
    for (int i = 0; i < c->n; i++)
        c->r[i].mb.out = 0;
    if (st != CH_OK)
        return chi_error(st, "%s: %s; keeping the replicas left: %s", fn, why, ch_last_error());
    s->step += held;
    int64_t step = c->tr.step + 1;
    int first = h->el.nlog;
    for (int i = 0; i < c->n; i++) {
        if (!lost[i])
            continue;
        int fresh = 0;
        for (int k = 0; k < h->el.nall; k++)
            if (h->el.devs[k] == c->r[i].dev && !h->el.gone[k])
                fresh = h->el.gone[k] = 1;
        if (!fresh)
            continue; /* a second replica on the same device */
        ch_dp_change *e = log_add(h);
        if (!e)
            continue;
        e->step = step;
        snprintf(e->device, sizeof e->device, "%s", ch_device_id(c->r[i].dev));
        snprintf(e->cause, sizeof e->cause, "%.500s", c->r[i].st != CH_OK ? c->r[i].error : why);
    }
    h->el.live = NULL;
    retire(c);
    h->el.pending = s;
    st = ensure_live(h, fn);
    double cost = ch_clock_seconds() - t0;
    char left[256];
    names_left(h, left, sizeof left);
    for (int k = first; k < h->el.nlog; k++) {
        h->el.log[k].replicas = remaining(h);
        h->el.log[k].seconds = cost;
    }
    if (h->el.nlog > first)
        snprintf(h->el.note, sizeof h->el.note,
                 "%s was lost in step %lld (%.200s); %d replica%s "
                 "now: %.150s (%.2f s)",
                 h->el.log[first].device, (long long)step, h->el.log[first].cause, remaining(h),
                 remaining(h) == 1 ? "" : "s", left, cost);
    return st;
}

/* A failed call on c: lost devices handled (CH_OK: make the call again,
 * or *held: the step held), else the failure returned. */
static ch_status after_failure(ch_dp *h, ch_dp *c, ch_status st, double t0, int training, int *held,
                               const char *fn)
{
    char why[1024];
    snprintf(why, sizeof why, "%s", ch_last_error());
    *held = 0;
    int *lost = calloc((size_t)c->n, sizeof *lost);
    if (!lost)
        return chi_error(st, "%s", why);
    int n = find_lost(c, lost);
    if (n == 0) {
        free(lost);
        return chi_error(st, "%s", why);
    }
    if (n == c->n) {
        free(lost);
        return chi_error(st, "%s; every device of the dp is lost", why);
    }
    int updated = 0, left = 0;
    for (int i = 0; i < c->n; i++)
        if (!lost[i]) {
            left++;
            updated += training && c->call.sync && c->r[i].updated;
        }
    if (updated > 0 && updated < left) {
        /* Some replicas left updated, others did not: they differ. */
        free(lost);
        return chi_error(st, "%s", why);
    }
    *held = updated > 0;
    if (*held)
        dp_rescale(c);
    ch_status rs = replace(h, c, lost, *held, t0, why, fn);
    free(lost);
    return rs;
}

ch_status dp_elastic_train(ch_dp *h, float *loss, const ch_batch *batch, float lr)
{
    for (;;) {
        TRY(ensure_live(h, "ch_dp_step"));
        ch_dp *c = h->el.live;
        double t0 = ch_clock_seconds();
        ch_status st = dp_step_now(c, loss, batch, lr);
        if (st == CH_OK)
            return CH_OK;
        /* The loss of a step that held: every replica computed its part. */
        double part = 0.0;
        for (int i = 0; i < c->n; i++)
            part += (double)c->r[i].loss_value * c->r[i].count / batch->count;
        int held = 0;
        TRY(after_failure(h, c, st, t0, 1, &held, "ch_dp_step"));
        if (held) {
            *loss = (float)part;
            return CH_OK;
        }
    }
}

ch_status dp_elastic_infer(ch_dp *h, ch_tensor *out, float *loss, int64_t *correct,
                           const ch_batch *batch)
{
    const char *fn = out ? "ch_dp_predict" : "ch_dp_evaluate";
    for (;;) {
        TRY(ensure_live(h, fn));
        ch_dp *c = h->el.live;
        double t0 = ch_clock_seconds();
        ch_status st =
            out ? dp_predict_now(c, out, batch) : dp_evaluate_now(c, loss, correct, batch);
        if (st == CH_OK)
            return CH_OK;
        int held = 0;
        TRY(after_failure(h, c, st, t0, 0, &held, fn));
    }
}

/* ---- The handle ---------------------------------------------------------------------- */

ch_status dp_elastic_wrap(ch_dp **out, ch_dp *live, ch_device *const *devices, int n,
                          const ch_dp_options *o)
{
    ch_dp *h = calloc(1, sizeof *h);
    if (!h)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    h->el.on = 1;
    h->el.nall = n;
    h->o = *o;
    h->o.memory_limits = NULL; /* applied to the devices */
    h->o.nmemory_limits = 0;
    h->o.weights = NULL;
    h->el.devs = malloc((size_t)n * sizeof *h->el.devs);
    h->el.gone = calloc((size_t)n, 1);
    if (o->split == CH_DP_SPLIT_WEIGHTS)
        h->el.weights = malloc((size_t)n * sizeof *h->el.weights);
    if (!h->el.devs || !h->el.gone || (o->split == CH_DP_SPLIT_WEIGHTS && !h->el.weights)) {
        dp_elastic_free(h);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    memcpy(h->el.devs, devices, (size_t)n * sizeof *devices);
    if (h->el.weights)
        memcpy(h->el.weights, o->weights, (size_t)n * sizeof *o->weights);
    h->el.live = live;
    live->el.handle = h;
    *out = h;
    return CH_OK;
}

void dp_elastic_free(ch_dp *h)
{
    if (h->el.live)
        retire(h->el.live);
    state_free(h->el.pending);
    free(h->el.devs);
    free(h->el.weights);
    free(h->el.gone);
    free(h->el.log);
    free(h);
}

int ch_dp_replica_count(const ch_dp *dp)
{
    dp = dp_live(dp);
    return dp ? dp->n : 0;
}

ch_device *ch_dp_device(const ch_dp *dp, int index)
{
    dp = dp_live(dp);
    return dp && index >= 0 && index < dp->n ? dp->r[index].dev : NULL;
}

int ch_dp_changes(const ch_dp *dp, ch_dp_change *out, int cap)
{
    if (!dp || !dp->el.on)
        return 0;
    for (int i = 0; out && i < cap && i < dp->el.nlog; i++)
        out[i] = dp->el.log[i];
    return dp->el.nlog;
}

ch_status ch_dp_rejoin(ch_dp *h, int *rejoined)
{
    if (rejoined)
        *rejoined = 0;
    if (!h)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_rejoin: dp is NULL");
    if (!h->el.on)
        return chi_error(CH_ERR_STATE, "ch_dp_rejoin: the dp is not elastic "
                                       "(ch_dp_options.elastic)");
    TRY(ensure_live(h, "ch_dp_rejoin"));
    ch_dp *c = h->el.live;
    if (c->tr.micro > 0)
        return chi_error(CH_ERR_STATE, "ch_dp_rejoin: micro-batches are accumulated");
    int n = 0;
    ch_device **devs = malloc((size_t)h->el.nall * sizeof *devs);
    int *ok = malloc((size_t)h->el.nall * sizeof *ok);
    unsigned char *was = malloc((size_t)h->el.nall);
    if (!devs || !ok || !was) {
        free(devs);
        free(ok);
        free(was);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_rejoin: out of memory");
    }
    memcpy(was, h->el.gone, (size_t)h->el.nall);
    for (int i = 0; i < h->el.nall; i++)
        if (h->el.gone[i])
            devs[n++] = h->el.devs[i];
    dp_probe_all(devs, n, 1.0, ok);
    int back = 0;
    for (int i = 0, k = 0; i < h->el.nall; i++)
        if (was[i] && ok[k++]) {
            h->el.gone[i] = 0;
            back++;
        }
    free(devs);
    free(ok);
    ch_status st = CH_OK;
    if (back > 0) {
        double t0 = ch_clock_seconds();
        struct el_state *s = NULL;
        ch_dp *fresh = NULL;
        st = capture(c, 0, &s);
        if (st == CH_OK)
            st = make_live(h, s, &fresh);
        state_free(s);
        if (st != CH_OK) {
            memcpy(h->el.gone, was, (size_t)h->el.nall);
            free(was);
            return chi_error(st, "ch_dp_rejoin: %s", ch_last_error());
        }
        retire(c);
        h->el.live = fresh;
        double cost = ch_clock_seconds() - t0;
        char left[256];
        names_left(h, left, sizeof left);
        for (int i = 0; i < h->el.nall; i++) {
            if (!was[i] || h->el.gone[i])
                continue;
            int dup = 0; /* a device listed twice rejoins once */
            for (int k = 0; k < i; k++)
                dup |= was[k] && h->el.devs[k] == h->el.devs[i];
            ch_dp_change *e = dup ? NULL : log_add(h);
            if (!e)
                continue;
            e->step = fresh->tr.step + 1;
            e->rejoined = 1;
            e->replicas = fresh->n;
            e->seconds = cost;
            snprintf(e->device, sizeof e->device, "%s", ch_device_id(h->el.devs[i]));
        }
        snprintf(h->el.note, sizeof h->el.note,
                 "%d device%s rejoined before step %lld; %d "
                 "replicas now: %.200s",
                 back, back == 1 ? "" : "s", (long long)(fresh->tr.step + 1), fresh->n, left);
    }
    free(was);
    if (rejoined)
        *rejoined = back;
    return st;
}
