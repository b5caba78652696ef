/* Streams and events.
 *
 * Events only order work, without timing (cheaper), unless they are made
 * while a trace runs: those are made with timing, and event_seconds is
 * their time after the device's clock_zero event, which is recorded and
 * waited for once, when the device's first timed event is made. */
#include <stdlib.h>
#include "common.cuh"
#include "trace.h"

ch_status chcu_stream_new(void *dev, void **stream)
{
    chcu_device *d = (chcu_device *)dev;
    ch_status st = chcu_enter(d);
    if (st)
        return st;
    chcu_stream *s = (chcu_stream *)calloc(1, sizeof *s);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "cuda stream_new: out of host memory");
    if (pthread_mutex_init(&s->scratch_lock, NULL) != 0) {
        free(s);
        return chi_error(CH_ERR_INTERNAL, "cuda stream_new: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&s->blas_lock, NULL) != 0) {
        pthread_mutex_destroy(&s->scratch_lock);
        free(s);
        return chi_error(CH_ERR_INTERNAL, "cuda stream_new: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&s->check_lock, NULL) != 0) {
        pthread_mutex_destroy(&s->blas_lock);
        pthread_mutex_destroy(&s->scratch_lock);
        free(s);
        return chi_error(CH_ERR_INTERNAL, "cuda stream_new: pthread_mutex_init failed");
    }
    s->dev = d;
    /* Non-blocking: never serialised with the legacy default stream that
     * other code in the process may use. */
    st = chcu_check(cudaStreamCreateWithFlags(&s->s, cudaStreamNonBlocking),
                    "cudaStreamCreateWithFlags");
    if (st) {
        pthread_mutex_destroy(&s->check_lock);
        pthread_mutex_destroy(&s->blas_lock);
        pthread_mutex_destroy(&s->scratch_lock);
        free(s);
        return st;
    }
    *stream = s;
    return CH_OK;
}

void chcu_stream_free(void *stream)
{
    chcu_stream *s = (chcu_stream *)stream;
    if (!s)
        return;
    if (chcu_enter(s->dev) == CH_OK) {
        /* The handle first: it is bound to the stream. */
        if (s->blas)
            (void)chcu_blas_check(cublasDestroy(s->blas), "cublasDestroy");
        chcu_lt_free(s);
        (void)chcu_check(cudaStreamDestroy(s->s), "cudaStreamDestroy");
        (void)chcu_scratch_free(s);
        /* Checks not read yet are dropped with the stream. */
        chcu_checks_free(s);
    }
    /* Not freed (the device would not be entered): no longer counted. */
    if (s->scratch)
        chi_workspace_release(s->dev, s->scratch_bytes);
    if (s->lt_ws)
        chi_workspace_release(s->dev, s->lt_ws_bytes);
    if (s->check_dev) {
        chi_workspace_release(s->dev, CHCU_CHECK_BYTES);
        chi_staging_remove(s->dev, CHCU_CHECK_BYTES);
    }
    pthread_mutex_destroy(&s->check_lock);
    pthread_mutex_destroy(&s->blas_lock);
    pthread_mutex_destroy(&s->scratch_lock);
    free(s);
}

ch_status chcu_stream_sync(void *stream)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    /* An op's queued label or index check answers here at the latest. */
    return chcu_stream_wait(s, "cudaStreamSynchronize");
}

/* Record dev's clock_zero unless it has one (dev is current). */
static ch_status clock_zero_ensure(chcu_device *d)
{
    pthread_mutex_lock(&d->clock_lock);
    ch_status st = CH_OK;
    if (!d->clock_zero) {
        cudaEvent_t z = NULL;
        st = chcu_check(cudaEventCreateWithFlags(&z, cudaEventDefault),
                        "cudaEventCreateWithFlags(clock zero)");
        if (st == CH_OK)
            st = chcu_check(cudaEventRecord(z, 0), "cudaEventRecord(clock zero)");
        if (st == CH_OK)
            st = chcu_check(cudaEventSynchronize(z), "cudaEventSynchronize(clock zero)");
        if (st == CH_OK)
            d->clock_zero = z;
        else if (z)
            (void)cudaEventDestroy(z); /* the first error is the one to report */
    }
    pthread_mutex_unlock(&d->clock_lock);
    return st;
}

void chcu_clock_release(chcu_device *d)
{
    if (!d->clock_zero)
        return;
    int caller = chcu_current();
    if (chcu_enter(d) == CH_OK)
        (void)chcu_check(cudaEventDestroy(d->clock_zero), "cudaEventDestroy(clock zero)");
    chcu_restore(caller);
    d->clock_zero = NULL;
}

ch_status chcu_event_new(void *dev, void **event)
{
    chcu_device *d = (chcu_device *)dev;
    int timed = chi_tracing();
    /* A spare needs no driver call: the device is entered only to make a
     * new one. */
    if (!timed) {
        pthread_mutex_lock(&d->event_lock);
        chcu_event *e = d->spare;
        if (e) {
            d->spare = e->next;
            d->nspare--;
        }
        pthread_mutex_unlock(&d->event_lock);
        if (e) {
            e->next = NULL;
            e->recorded = 0;
            *event = e;
            return CH_OK;
        }
    }
    ch_status st = chcu_enter(d);
    if (st)
        return st;
    if (timed) {
        st = clock_zero_ensure(d);
        if (st)
            return st;
    }
    chcu_event *e = (chcu_event *)calloc(1, sizeof *e);
    if (!e)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "cuda event_new: out of host memory");
    e->dev = d;
    e->timed = timed;
    /* Events only order work here, unless a trace wants their times:
     * timing would make them slower. */
    unsigned flags = timed ? cudaEventDefault : cudaEventDisableTiming;
    st = chcu_check(cudaEventCreateWithFlags(&e->e, flags), "cudaEventCreateWithFlags");
    if (st) {
        free(e);
        return st;
    }
    *event = e;
    return CH_OK;
}

void chcu_event_free(void *event)
{
    chcu_event *e = (chcu_event *)event;
    if (!e)
        return;
    /* An untimed event goes back to its device's spares: recording it
     * again later does not disturb the waits queued on it before
     * (cudaStreamWaitEvent waits for the record it saw). */
    chcu_device *d = e->dev;
    if (!e->timed) {
        pthread_mutex_lock(&d->event_lock);
        int keep = d->nspare < CHCU_SPARE_EVENTS;
        if (keep) {
            e->next = d->spare;
            d->spare = e;
            d->nspare++;
        }
        pthread_mutex_unlock(&d->event_lock);
        if (keep)
            return;
    }
    if (chcu_enter(e->dev) == CH_OK)
        (void)chcu_check(cudaEventDestroy(e->e), "cudaEventDestroy");
    free(e);
}

ch_status chcu_event_record(void *event, void *stream)
{
    chcu_event *e = (chcu_event *)event;
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    st = chcu_check(cudaEventRecord(e->e, s->s), "cudaEventRecord");
    if (st == CH_OK)
        e->recorded = 1;
    return st;
}

ch_status chcu_event_wait(void *stream, void *event)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    return chcu_check(cudaStreamWaitEvent(s->s, ((chcu_event *)event)->e, 0),
                      "cudaStreamWaitEvent");
}

ch_status chcu_event_sync(void *event)
{
    chcu_event *e = (chcu_event *)event;
    ch_status st = chcu_enter(e->dev);
    if (st)
        return st;
    return chcu_check(cudaEventSynchronize(e->e), "cudaEventSynchronize");
}

/* cudaEventElapsedTime gives float milliseconds, to about half a
 * microsecond; its 24-bit mantissa also costs 2^-24 of the time since
 * clock_zero (60 us after 1000 s). */
ch_status chcu_event_seconds(void *event, double *seconds)
{
    chcu_event *e = (chcu_event *)event;
    if (!e->timed)
        return chi_error(CH_ERR_UNSUPPORTED,
                         "cuda event_seconds: the event was made without timing (while no "
                         "trace ran)");
    if (!e->recorded)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda event_seconds: the event was never recorded");
    ch_status st = chcu_enter(e->dev);
    if (st)
        return st;
    pthread_mutex_lock(&e->dev->clock_lock);
    cudaEvent_t zero = e->dev->clock_zero;
    pthread_mutex_unlock(&e->dev->clock_lock);
    float ms = 0.0f;
    st = chcu_check(cudaEventElapsedTime(&ms, zero, e->e), "cudaEventElapsedTime");
    if (st == CH_OK)
        *seconds = 1e-3 * (double)ms;
    return st;
}

void chcu_events_release(chcu_device *d)
{
    pthread_mutex_lock(&d->event_lock);
    chcu_event *e = d->spare;
    d->spare = NULL;
    d->nspare = 0;
    pthread_mutex_unlock(&d->event_lock);
    int caller = chcu_current();
    int entered = e && chcu_enter(d) == CH_OK;
    while (e) {
        chcu_event *next = e->next;
        if (entered)
            (void)chcu_check(cudaEventDestroy(e->e), "cudaEventDestroy");
        free(e);
        e = next;
    }
    if (entered)
        chcu_restore(caller);
}
