/* The reducer across processes without the host (lib/reduce.c says what
 * the reducer does). Where every participant is on one backend with the
 * span slots (lib/backend.h; CUDA's, over NCCL), each device once, one
 * process makes an id (ch_reducer_span_id), the caller hands it to every
 * process, and ch_reducer_span makes the backend's communicator over every
 * participant of the job from it; each call is then one call of the
 * backend over all of them (ch_reducer_allreduce), summing in f32. */
#include "config.h"

#include <stdlib.h>

#include "reduce_impl.h"

/* The backend every participant is on when it can span processes, every
 * device once, and the mode allows it; else NULL. */
static const ch_backend_i *span_backend(const ch_reducer *r)
{
    if (!r || r->mode == CH_REDUCE_HOST)
        return NULL;
    const ch_device *d0 = r->streams[0]->dev;
    const ch_backend_i *be = d0->be->iface;
    if (!be->span_id || !be->span_new || !be->span_allreduce || !be->span_free ||
        be->span_id_bytes == 0)
        return NULL;
    for (int i = 0; i < r->n; i++) {
        if (r->streams[i]->dev->be != d0->be)
            return NULL;
        for (int j = 0; j < i; j++)
            if (r->streams[j]->dev == r->streams[i]->dev)
                return NULL;
    }
    return be;
}

size_t ch_reducer_span_bytes(const ch_reducer *r)
{
    const ch_backend_i *be = span_backend(r);
    return be ? be->span_id_bytes : 0;
}

/* The arguments of `fn`; *be the backend that spans. */
static ch_status span_args(const char *fn, const ch_reducer *r, const void *id,
                           const ch_backend_i **be)
{
    if (!r || !id)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !r ? "r" : "id");
    *be = span_backend(r);
    if (!*be)
        return chi_error(CH_ERR_UNSUPPORTED,
                         "%s: these participants cannot reduce across "
                         "processes without the host (ch_reducer_span_bytes is 0)",
                         fn);
    return CH_OK;
}

ch_status ch_reducer_span_id(ch_reducer *r, void *id)
{
    const ch_backend_i *be;
    TRY(span_args("ch_reducer_span_id", r, id, &be));
    return be->span_id(id);
}

ch_status ch_reducer_span(ch_reducer *r, const void *id, int first, int total)
{
    const ch_backend_i *be;
    TRY(span_args("ch_reducer_span", r, id, &be));
    if (r->span)
        return chi_error(CH_ERR_STATE, "ch_reducer_span: the reducer spans processes "
                                       "already");
    if (r->dtype != CH_F32)
        return chi_error(CH_ERR_STATE,
                         "ch_reducer_span: the reducer sums in %s on the host; "
                         "a span sums in f32",
                         ch_dtype_name(r->dtype));
    if (first < 0 || total < 1 || first > total - r->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_reducer_span: participants %d to %d of "
                         "%d: expected 0 <= first and first + %d <= total",
                         first, first + r->n - 1, total, r->n);
    for (int i = 0; i < r->n; i++)
        r->handles[i] = r->streams[i]->dev->dev;
    int *ranks = calloc((size_t)r->n, sizeof *ranks);
    if (!ranks)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_reducer_span: out of host memory");
    for (int i = 0; i < r->n; i++)
        ranks[i] = first + i;
    ch_status st = CHI_INJECT("span creation", CH_ERR_DRIVER,
                              be->span_new(&r->span, r->n, r->handles, ranks, total, id));
    free(ranks);
    if (st != CH_OK) {
        r->span = NULL;
        return st;
    }
    r->span_be = be;
    return CH_OK;
}

int ch_reducer_spans(const ch_reducer *r)
{
    return r && r->span;
}
