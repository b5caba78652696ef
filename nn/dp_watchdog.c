/* Elastic data parallelism (nn/dp_elastic.c): whether the devices answer.
 *
 * A probe is a small piece of work on a stream of its own (a one-element
 * fill and download) in a thread of its own, given a limited time: a
 * device that does not answer, or fails the probe twice, is lost
 * (dp_probe_all). A probe that does not answer is left running; it frees
 * itself when its device lets it go.
 *
 * The watchdog (dp_wait_call): the calling thread waits for a call's
 * workers at most elastic_timeout seconds at a time. Past it the devices
 * are probed, and when a busy replica's device does not answer the call is
 * given up: the workers' barrier broken and the waits woken, so that the
 * replicas that can come back do, and the silent ones are marked hung. */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "dp_impl.h"

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

void dp_probe_all(ch_device *const *devs, int n, double limit, int *ok)
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
        dp_probe_all(devs, dp->n, limit < 1.0 ? limit : 1.0, ok);
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
