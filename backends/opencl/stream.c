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
    cl_int err;
    s->dev = d;
    s->profiling = chi_tracing();
    cl_command_queue_properties props = s->profiling ? CL_QUEUE_PROFILING_ENABLE : 0;
    s->queue = clCreateCommandQueue(d->plat->ctx, d->id, props, &err);
    if (err != CL_SUCCESS) {
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
    if (s->flag)
        chcl_workspace_free(s->dev, s->flag, sizeof(cl_uint));
    chcl_scratch_drop(s);
    clReleaseCommandQueue(s->queue);
    pthread_mutex_destroy(&s->scratch_lock);
    free(s);
}

ch_status chcl_stream_sync(void *stream)
{
    cl_int err = clFinish(((chcl_stream *)stream)->queue);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clFinish");
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
