/* Streams are in-order command queues; events are markers. Markers and
 * barriers with wait lists are OpenCL 1.2.
 *
 * A queue made while a trace runs profiles (CL_QUEUE_PROFILING_ENABLE),
 * so that its markers tell when the queue reached them; one made while
 * none runs does not, as profiling costs every command a little. */
#include "config.h"

#include <stdlib.h>

#include "opencl.h"
#include "trace.h"

ch_status chcl_stream_new(void *dev, void **stream)
{
    chcl_device *d = dev;
    chcl_stream *s = calloc(1, sizeof *s);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl stream_new: %zu bytes", sizeof *s);
    if (pthread_mutex_init(&s->scratch_lock, NULL) != 0) {
        free(s);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl stream_new: pthread_mutex_init");
    }
    if (pthread_mutex_init(&s->check_lock, NULL) != 0) {
        pthread_mutex_destroy(&s->scratch_lock);
        free(s);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl stream_new: pthread_mutex_init");
    }
    cl_int err;
    s->dev = d;
    s->profiling = chi_tracing();
    cl_command_queue_properties props = s->profiling ? CL_QUEUE_PROFILING_ENABLE : 0;
    s->queue = clCreateCommandQueue(d->plat->ctx, d->id, props, &err);
    if (err != CL_SUCCESS) {
        pthread_mutex_destroy(&s->check_lock);
        pthread_mutex_destroy(&s->scratch_lock);
        free(s);
        return chcl_err(err, "clCreateCommandQueue");
    }
    *stream = s;
    return CH_OK;
}

void chcl_stream_free(void *stream)
{
    chcl_stream *s = stream;
    if (!s)
        return;
    /* Commands still queued finish first, then the queue goes. */
    clFinish(s->queue);
    chcl_checks_drop(s);
    chcl_scratch_drop(s);
    clReleaseCommandQueue(s->queue);
    pthread_mutex_destroy(&s->check_lock);
    pthread_mutex_destroy(&s->scratch_lock);
    free(s);
}

ch_status chcl_stream_sync(void *stream)
{
    chcl_stream *s = stream;
    ch_status st = chcl_wait_begin(s);
    if (st == CH_OK) {
        cl_int err = clFinish(s->queue);
        st = err == CL_SUCCESS ? CH_OK : chcl_err(err, "clFinish");
    }
    return chcl_wait_end(s, st);
}

/* ---- deferred label and index checks ----------------------------------------
 * The loss and embedding slots do not wait for their checks: each check's
 * pair of words is read behind the work queued before the stream's next
 * wait (stream_sync, a blocking download or upload), which then answers
 * CH_ERR_INVALID_ARGUMENT as the host does (ops.h). A training step waits
 * once, to read its loss; reading each check on its own would add three
 * host waits a step. */

/* The pair of check words of pending check i. */
static chcl_ref check_word(const chcl_stream *s, int i)
{
    return (chcl_ref){s->checks, (cl_ulong)(2 * i)};
}

/* Reads the pending checks' words into check_host once the queue gets
 * there; the caller holds the check lock and waits next. */
static ch_status checks_queue_read(chcl_stream *s)
{
    if (s->npending == 0)
        return CH_OK;
    cl_int err = clEnqueueReadBuffer(s->queue, s->checks, CL_FALSE, 0,
                                     (size_t)(2 * s->npending) * sizeof(cl_uint), s->check_host, 0,
                                     NULL, NULL);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clEnqueueReadBuffer(checks)");
}

/* The first pending check that found a bad value, in the order of the
 * calls; all are forgotten. The caller holds the lock and has waited. */
static ch_status checks_report(chcl_stream *s)
{
    ch_status st = CH_OK;
    for (int i = 0; i < s->npending && st == CH_OK; i++) {
        cl_uint pos = s->check_host[2 * i];
        if (pos == CHCL_CHECK_NONE)
            continue;
        const chcl_pending_check *p = &s->pending[i];
        int32_t value = (int32_t)s->check_host[2 * i + 1];
        st = p->index ? chi_bad_index(p->fn, pos, value, p->limit)
                      : chi_bad_label(p->fn, pos, value, p->limit);
    }
    s->npending = 0;
    return st;
}

ch_status chcl_wait_begin(chcl_stream *s)
{
    /* Held across the wait: a check queued meanwhile by another thread
     * would not be in the words read. */
    pthread_mutex_lock(&s->check_lock);
    return checks_queue_read(s);
}

ch_status chcl_wait_end(chcl_stream *s, ch_status waited)
{
    ch_status st = waited == CH_OK ? checks_report(s) : waited;
    pthread_mutex_unlock(&s->check_lock);
    return st;
}

/* The words are the device's workspace, counted and under its limit. */
ch_status chcl_check_begin(chcl_stream *s, chcl_ref *word)
{
    pthread_mutex_lock(&s->check_lock);
    ch_status st = CH_OK;
    if (!s->checks)
        st = chcl_workspace_new(s->dev, "label checks", 2 * CHCL_CHECKS * sizeof(cl_uint),
                                &s->checks);
    if (st == CH_OK && s->npending == CHCL_CHECKS) {
        /* Full: the one place a check waits on its own. */
        st = checks_queue_read(s);
        if (st == CH_OK) {
            cl_int err = clFinish(s->queue);
            st = err == CL_SUCCESS ? checks_report(s) : chcl_err(err, "clFinish(checks)");
        }
    }
    chcl_ref w = check_word(s, s->npending);
    if (st == CH_OK) {
        cl_uint none[2] = {CHCL_CHECK_NONE, 0};
        cl_int err =
            clEnqueueFillBuffer(s->queue, w.mem, none, sizeof none, (size_t)w.off * sizeof(cl_uint),
                                sizeof none, 0, NULL, NULL);
        if (err != CL_SUCCESS)
            st = chcl_err(err, "clEnqueueFillBuffer(check)");
    }
    if (st != CH_OK) {
        pthread_mutex_unlock(&s->check_lock);
        return st;
    }
    *word = w;
    return CH_OK;
}

ch_status chcl_check_end(chcl_stream *s, ch_status launched, chcl_ref word, ch_bmem values,
                         const char *fn, int index, int64_t limit)
{
    ch_status st = launched;
    if (st == CH_OK) {
        chcl_ref V = chcl_ref_of(values);
        chcl_arg args[] = {CHCL_REF(word), CHCL_REF(V)};
        size_t one = 1;
        st = chcl_launch(s, CHCL_K_CHECK_VALUE, CHCL_COUNT_OF(args), args, 1, &one, &one);
    }
    if (st == CH_OK) {
        chcl_pending_check *p = &s->pending[s->npending++];
        p->fn = fn;
        p->index = index;
        p->limit = limit;
    }
    pthread_mutex_unlock(&s->check_lock);
    return st;
}

void chcl_checks_drop(chcl_stream *s)
{
    if (s->checks)
        chcl_workspace_free(s->dev, s->checks, 2 * CHCL_CHECKS * sizeof(cl_uint));
    s->checks = NULL;
    s->npending = 0;
}

ch_status chcl_event_new(void *dev, void **event)
{
    chcl_event *e = malloc(sizeof *e);
    if (!e)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl event_new: %zu bytes", sizeof *e);
    e->dev = dev;
    e->ev = NULL;
    e->profiling = 0;
    *event = e;
    return CH_OK;
}

void chcl_event_free(void *event)
{
    chcl_event *e = event;
    if (!e)
        return;
    if (e->ev)
        clReleaseEvent(e->ev);
    free(e);
}

ch_status chcl_event_record(void *event, void *stream)
{
    chcl_event *e = event;
    chcl_stream *s = stream;
    cl_event ev;
    cl_int err = clEnqueueMarkerWithWaitList(s->queue, 0, NULL, &ev);
    if (err != CL_SUCCESS)
        return chcl_err(err, "clEnqueueMarkerWithWaitList");
    /* A queue waiting on this event from another queue only makes progress
     * once this one is submitted: flush it now. */
    err = clFlush(s->queue);
    if (err != CL_SUCCESS) {
        clReleaseEvent(ev);
        return chcl_err(err, "clFlush");
    }
    if (e->ev)
        clReleaseEvent(e->ev);
    e->ev = ev;
    e->dev = s->dev;
    e->profiling = s->profiling;
    return CH_OK;
}

/* Events of another context cannot enter a wait list: the host waits. */
ch_status chcl_event_wait(void *stream, void *event)
{
    chcl_stream *s = stream;
    chcl_event *e = event;
    if (!e->ev)
        return CH_OK;
    cl_int err;
    if (e->dev->plat != s->dev->plat) {
        err = clWaitForEvents(1, &e->ev);
        return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clWaitForEvents");
    }
    err = clEnqueueBarrierWithWaitList(s->queue, 1, &e->ev, NULL);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clEnqueueBarrierWithWaitList");
}

ch_status chcl_event_sync(void *event)
{
    chcl_event *e = event;
    if (!e->ev)
        return CH_OK;
    cl_int err = clWaitForEvents(1, &e->ev);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clWaitForEvents");
}

/* A marker's CL_PROFILING_COMMAND_END: when the queue reached it. Both
 * runtimes we test give markers their profiling info (measured with PoCL
 * 3.1 and Intel's CPU runtime 2026.22: START, END and COMPLETE are set,
 * END equal to COMPLETE; Intel's leaves a marker's QUEUED at 0, so that
 * one is no time to read). The timer is the runtime's own (PoCL 3.1's
 * reads CLOCK_MONOTONIC_RAW, Intel's CLOCK_MONOTONIC): the core measures
 * the offset to ch_clock_seconds. A runtime that does not profile markers
 * answers CL_PROFILING_INFO_NOT_AVAILABLE, as it does for a command not
 * completed: CH_ERR_UNSUPPORTED. */
ch_status chcl_event_seconds(void *event, double *seconds)
{
    const chcl_event *e = event;
    if (!e->ev)
        return chi_error(CH_ERR_UNSUPPORTED, "opencl event_seconds: the event was never recorded");
    if (!e->profiling)
        return chi_error(CH_ERR_UNSUPPORTED,
                         "opencl event_seconds: the event was recorded on a queue that does not "
                         "profile (a stream made while no trace ran)");
    cl_ulong ns = 0;
    cl_int err = clGetEventProfilingInfo(e->ev, CL_PROFILING_COMMAND_END, sizeof ns, &ns, NULL);
    if (err != CL_SUCCESS) {
        ch_status st = chcl_err(err, "clGetEventProfilingInfo(CL_PROFILING_COMMAND_END)");
        return err == CL_PROFILING_INFO_NOT_AVAILABLE ? CH_ERR_UNSUPPORTED : st;
    }
    *seconds = 1e-9 * (double)ns;
    return CH_OK;
}

ch_status chcl_stream_after(chcl_stream *waiter, chcl_stream *producer)
{
    if (waiter == producer)
        return CH_OK;
    chcl_event e = {.dev = producer->dev, .ev = NULL};
    ch_status st = chcl_event_record(&e, producer);
    if (st == CH_OK)
        st = chcl_event_wait(waiter, &e);
    if (e.ev)
        clReleaseEvent(e.ev);
    return st;
}
