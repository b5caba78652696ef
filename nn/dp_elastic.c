/* Elastic data parallelism inside one process (ch_dp_options.elastic).
 *
 * The caller's handle holds no replicas: every call goes to the object
 * that does (el.live, made by dp_create). When a training or evaluation
 * call fails, every device of the replicas is probed (a small stream, a
 * one-element fill and download, in a thread of its own given a second to
 * answer); a device that fails the probe, or does not answer it, is lost.
 * The state the replicas share is then taken from the first replica left
 * (its parameters and buffers cloned to the host, its optimizer's state
 * copied beside them, the step counts, the loss scale), the old object is
 * freed, and a new one made over ch_dp_new's devices without the lost
 * ones, from that state: the same as a run that had only those devices
 * from this step on. The call is then made again, except after a failure
 * inside the optimizer's update that every replica left had completed:
 * the step held on them, and is counted.
 *
 * A replica whose device stops answering holds its worker thread (or the
 * reducer's) inside the backend: the calling thread waits for a call at
 * most elastic_timeout seconds before it probes the devices, and gives
 * the call up when a busy replica's device does not answer (the workers'
 * barrier broken, the waits woken). The old object is then left to the
 * threads that did not come back: the last of them frees it when the
 * device lets it go (chi_dp_abandoned counts those objects).
 *
 * ch_dp_rejoin probes the lost devices and makes a new object over every
 * device that answers, before freeing the old one, so that a failure
 * leaves the dp as it was. */
#include "config.h"

#include <errno.h>
#include <math.h>
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

static atomic_int abandoned;

/* ---- Failures injected by tests ------------------------------------------------ */

#ifdef CHI_TEST_HOOKS
static pthread_mutex_t lose_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t lose_cond = PTHREAD_COND_INITIALIZER;
static struct {
    ch_device *dev;
    int at, hang, armed, lost;
    int64_t step;
} losing[4];

void chi_dp_lose(ch_device *dev, int at, int64_t step, int hang)
{
    pthread_mutex_lock(&lose_lock);
    for (int i = 0; i < 4; i++)
        if (!losing[i].dev || losing[i].dev == dev) {
            losing[i].dev = dev;
            losing[i].at = at;
            losing[i].step = step;
            losing[i].hang = hang;
            losing[i].armed = 1;
            losing[i].lost = 0;
            break;
        }
    pthread_mutex_unlock(&lose_lock);
}

void chi_dp_found(ch_device *dev)
{
    pthread_mutex_lock(&lose_lock);
    for (int i = 0; i < 4; i++)
        if (losing[i].dev == dev)
            memset(&losing[i], 0, sizeof losing[i]);
    pthread_cond_broadcast(&lose_cond);
    pthread_mutex_unlock(&lose_lock);
}

ch_status dp_lose_here(ch_device *dev, int at, int64_t step)
{
    pthread_mutex_lock(&lose_lock);
    int hit = -1;
    for (int i = 0; i < 4; i++)
        if (losing[i].dev == dev &&
            (losing[i].lost || (losing[i].armed && losing[i].at == at && losing[i].step == step)))
            hit = i;
    if (hit >= 0 && losing[hit].armed) {
        losing[hit].armed = 0;
        losing[hit].lost = 1;
        while (losing[hit].hang && losing[hit].dev == dev)
            pthread_cond_wait(&lose_cond, &lose_lock);
    }
    pthread_mutex_unlock(&lose_lock);
    if (hit < 0)
        return CH_OK;
    static const char *const where[] = {"forward", "backward", "the reduction", "the update"};
    return chi_error(CH_ERR_DRIVER, "%s: the device was lost in %s of step %lld (a test's failure)",
                     ch_device_id(dev), where[at & 3], (long long)step);
}

int dp_lost_by_test(ch_device *dev)
{
    pthread_mutex_lock(&lose_lock);
    int lost = 0;
    for (int i = 0; i < 4; i++)
        lost |= losing[i].dev == dev && losing[i].lost;
    pthread_mutex_unlock(&lose_lock);
    return lost;
}

int chi_dp_abandoned(void)
{
    return atomic_load(&abandoned);
}
#endif

/* ---- The workers' barrier ------------------------------------------------------ */

void dp_barrier_wait(ch_dp *dp)
{
    pthread_mutex_lock(&dp->w.lock);
    if (dp->w.broken) {
        dp->w.bar_failed = 1;
    } else {
        int64_t gen = dp->w.bar_gen;
        if (++dp->w.bar_count == dp->n) {
            dp->w.bar_count = 0;
            dp->w.bar_failed = atomic_load(&dp->w.failed) != 0;
            dp->w.bar_gen++;
            pthread_cond_broadcast(&dp->w.bar);
        } else {
            while (gen == dp->w.bar_gen && !dp->w.broken)
                pthread_cond_wait(&dp->w.bar, &dp->w.lock);
            if (gen == dp->w.bar_gen)
                dp->w.bar_failed = 1; /* broken while waiting */
        }
    }
    pthread_mutex_unlock(&dp->w.lock);
}

/* ---- Probes -------------------------------------------------------------------- */

typedef struct probe {
    ch_device *dev;
    ch_status st;
    int done, refs;
} probe;

static pthread_mutex_t probe_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t probe_cond = PTHREAD_COND_INITIALIZER;

/* A small piece of work on a stream of its own: a fill and a download. */
static ch_status probe_device(ch_device *dev)
{
    if (dp_lost_by_test(dev))
        return chi_error(CH_ERR_DRIVER, "%s: lost (a test's failure)", ch_device_id(dev));
    ch_stream *s = NULL;
    TRY(ch_stream_new(&s, dev));
    ch_stream_set_current(s);
    ch_tensor *t = NULL;
    int64_t one = 1;
    float v = 0.0f;
    ch_status st = ch_tensor_new(&t, dev, CH_F32, 1, &one);
    if (st == CH_OK)
        st = ch_fill(t, 3.0);
    if (st == CH_OK)
        st = ch_tensor_download(t, &v, sizeof v);
    if (st == CH_OK && v != 3.0f)
        st = chi_error(CH_ERR_DRIVER, "%s: a probe read back %g, not 3", ch_device_id(dev), v);
    ch_tensor_free(t);
    ch_stream_free(s);
    return st;
}

static void *probe_main(void *arg)
{
    probe *p = arg;
    ch_status st = probe_device(p->dev);
    pthread_mutex_lock(&probe_lock);
    p->st = st;
    p->done = 1;
    pthread_cond_broadcast(&probe_cond);
    int last = --p->refs == 0;
    pthread_mutex_unlock(&probe_lock);
    if (last)
        free(p);
    return NULL;
}

/* Whether a probe's status says the device is gone (not merely short of
 * memory, which says it answered). */
static int gone_status(ch_status st)
{
    return st == CH_ERR_DRIVER || st == CH_ERR_UNAVAILABLE;
}

/* Probe devs[0, n) at once; ok[i]: it answered within `limit` seconds,
 * without a driver or unavailable error (a probe that could not be made,
 * for want of memory or a thread, says nothing against its device). A
 * probe that does not answer is left running (it frees itself when its
 * device lets it go). */
static void probe_once(ch_device *const *devs, int n, double limit, int *ok, int *silent)
{
    probe **ps = calloc((size_t)n, sizeof *ps);
    for (int i = 0; i < n; i++) {
        ok[i] = 1;
        silent[i] = 0;
        probe *p = ps ? calloc(1, sizeof *p) : NULL;
        if (!p)
            continue; /* no memory: counted as not answering */
        p->dev = devs[i];
        p->refs = 2;
        pthread_t t;
        if (pthread_create(&t, NULL, probe_main, p) != 0) {
            free(p);
            continue;
        }
        pthread_detach(t);
        ps[i] = p;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double end = (double)until.tv_sec + until.tv_nsec * 1e-9 + limit;
    until.tv_sec = (time_t)end;
    until.tv_nsec = (long)((end - (double)until.tv_sec) * 1e9);
    pthread_mutex_lock(&probe_lock);
    for (int i = 0; ps && i < n; i++) {
        while (ps[i] && !ps[i]->done)
            if (pthread_cond_timedwait(&probe_cond, &probe_lock, &until) == ETIMEDOUT)
                break;
    }
    for (int i = 0; ps && i < n; i++) {
        if (!ps[i])
            continue;
        ok[i] = ps[i]->done && !gone_status(ps[i]->st);
        silent[i] = !ps[i]->done;
        if (--ps[i]->refs == 0)
            free(ps[i]);
    }
    pthread_mutex_unlock(&probe_lock);
    free(ps);
}

/* probe_once, and a device that answered with an error probed once more:
 * lost only when it fails twice (one failing call of a device that works,
 * such as a stream it could not make once, does not remove it). */
static void probe_all(ch_device *const *devs, int n, double limit, int *ok)
{
    int *silent = calloc((size_t)n * 3, sizeof *silent);
    ch_device **again = calloc((size_t)n, sizeof *again);
    if (!silent || !again) {
        for (int i = 0; i < n; i++)
            ok[i] = 1; /* no memory to tell: keep them */
        free(silent);
        free(again);
        return;
    }
    int *ok2 = silent + n, *silent2 = silent + 2 * n, m = 0;
    probe_once(devs, n, limit, ok, silent);
    for (int i = 0; i < n; i++)
        if (!ok[i] && !silent[i])
            again[m++] = devs[i];
    if (m > 0)
        probe_once(again, m, limit, ok2, silent2);
    for (int i = 0, k = 0; i < n; i++)
        if (!ok[i] && !silent[i])
            ok[i] = ok2[k++];
    free(silent);
    free(again);
}

/* ---- The calling thread waiting for a call --------------------------------------- */

static double timeout_of(const ch_dp *dp)
{
    return dp->o.elastic_timeout > 0.0 ? dp->o.elastic_timeout : 60.0;
}

/* With w.lock held: wait for the call's workers until `deadline` (host
 * clock); whether they all finished. */
static int wait_until(ch_dp *dp, double deadline)
{
    while (dp->w.finished < dp->n) {
        double left = deadline - ch_clock_seconds();
        if (left <= 0.0)
            return 0;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        double end = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + (left < 0.25 ? left : 0.25);
        ts.tv_sec = (time_t)end;
        ts.tv_nsec = (long)((end - (double)ts.tv_sec) * 1e9);
        pthread_cond_timedwait(&dp->w.done, &dp->w.lock, &ts);
    }
    return 1;
}

void dp_wait_call(ch_dp *dp)
{
    double limit = timeout_of(dp);
    while (!wait_until(dp, ch_clock_seconds() + limit)) {
        /* A call past the timeout: is a busy replica's device answering? */
        ch_device **devs = malloc((size_t)dp->n * sizeof *devs);
        int *ok = malloc((size_t)dp->n * sizeof *ok);
        if (!devs || !ok) {
            free(devs);
            free(ok);
            continue;
        }
        for (int i = 0; i < dp->n; i++)
            devs[i] = dp->r[i].dev;
        pthread_mutex_unlock(&dp->w.lock);
        probe_all(devs, dp->n, limit < 1.0 ? limit : 1.0, ok);
        pthread_mutex_lock(&dp->w.lock);
        int hung = 0;
        for (int i = 0; i < dp->n; i++) {
            replica *r = &dp->r[i];
            if (!r->busy || ok[i])
                continue;
            r->hung = 1;
            if (r->st == CH_OK) {
                r->st = CH_ERR_UNAVAILABLE;
                snprintf(r->error, sizeof r->error,
                         "replica %d on %s: no answer within %g s, and the device did not "
                         "answer a probe either",
                         i, ch_device_id(r->dev), limit);
            }
            hung++;
        }
        free(devs);
        free(ok);
        if (hung == 0)
            continue; /* a long call on devices that answer: wait on */
        /* Give the call up: the others stop waiting for the silent ones. */
        atomic_store(&dp->w.failed, 1);
        dp->w.broken = 1;
        pthread_cond_broadcast(&dp->w.bar);
        pthread_cond_broadcast(&dp->red.posted);
        pthread_cond_broadcast(&dp->bn.exchanged);
        /* The others come back; one that does not is silent too. */
        if (!wait_until(dp, ch_clock_seconds() + (limit < 5.0 ? limit : 5.0)))
            for (int i = 0; i < dp->n; i++)
                if (dp->r[i].busy)
                    dp->r[i].hung = 1;
        return;
    }
}

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
 * host (on its own device where no host device is visible). */
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
        ch_tensor *src = NULL, **slot = NULL, *p = NULL;
        st = ch_optimizer_state(r->opt, i, NULL, &src);
        if (st != CH_OK || !src)
            continue;
        st = nn_optimizer_state_slot(s->opt, i, &slot, &p, 1);
        if (st == CH_OK && !*slot) {
            int64_t shape[CH_MAX_DIMS];
            for (int d = 0; d < ch_tensor_ndim(src); d++)
                shape[d] = ch_tensor_dim(src, d);
            st = ch_tensor_new(slot, home, CH_F32, ch_tensor_ndim(src), shape);
        }
        if (st == CH_OK)
            st = ch_copy(*slot, src);
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
    probe_all(devs, c->n, 1.0, ok);
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
    probe_all(devs, n, 1.0, ok);
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
