/* Streams are in-order command queues; events are markers. Markers and
 * barriers with wait lists are OpenCL 1.2. */
#include "config.h"

#include <stdlib.h>

#include "opencl.h"

ch_status chcl_stream_new(void *dev, void **stream)
{
    chcl_device *d = dev;
    chcl_stream *s = calloc(1, sizeof *s);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl stream_new: %zu bytes", sizeof *s);
    cl_int err;
    s->dev = d;
    s->queue = clCreateCommandQueue(d->plat->ctx, d->id, 0, &err);
    if (err != CL_SUCCESS) {
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
        clReleaseMemObject(s->flag);
    clReleaseCommandQueue(s->queue);
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

ch_status chcl_stream_after(chcl_stream *waiter, chcl_stream *producer)
{
    if (waiter == producer)
        return CH_OK;
    chcl_event e = {producer->dev, NULL};
    ch_status st = chcl_event_record(&e, producer);
    if (st == CH_OK)
        st = chcl_event_wait(waiter, &e);
    if (e.ev)
        clReleaseEvent(e.ev);
    return st;
}
