/* Streams and events. */
#include <stdlib.h>
#include "common.cuh"

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
        (void)chcu_check(cudaStreamDestroy(s->s), "cudaStreamDestroy");
        if (s->scratch)
            (void)chcu_check(cudaFree(s->scratch), "cudaFree(scratch)");
        /* Checks not read yet are dropped with the stream. */
        chcu_checks_free(s);
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

ch_status chcu_event_new(void *dev, void **event)
{
    chcu_device *d = (chcu_device *)dev;
    ch_status st = chcu_enter(d);
    if (st)
        return st;
    chcu_event *e = (chcu_event *)calloc(1, sizeof *e);
    if (!e)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "cuda event_new: out of host memory");
    e->dev = d;
    /* Events only order work here; timing would make them slower. */
    st = chcu_check(cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming),
                    "cudaEventCreateWithFlags");
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
    return chcu_check(cudaEventRecord(e->e, s->s), "cudaEventRecord");
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
