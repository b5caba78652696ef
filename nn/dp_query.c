/* Data parallelism (nn/dp.c): the queries, which read what an object of
 * replicas holds after its calls: the last call's split, times and
 * breakdown, its note, the micro-batches pending, the buckets, each
 * replica's optimizer, shard and model, and the model copied out. */
#include "config.h"

#include <string.h>

#include "dp_impl.h"

ch_status ch_dp_micro_batches(const ch_dp *dp, int *size, int *count, int *left_out, int n)
{
    dp = dp_live(dp);
    if (!dp)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_micro_batches: dp is NULL");
    if (n < 0 || n > dp->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_dp_micro_batches: n is %d, the dp has %d "
                         "replicas here",
                         n, dp->n);
    for (int i = 0; i < n; i++) {
        const replica *r = &dp->r[i];
        if (size)
            size[i] = r->mb.limit == 0 ? 0 : r->mb.size;
        if (count)
            count[i] = r->mb.count;
        if (left_out)
            left_out[i] = dp->split.out[dp->procs.first + i];
    }
    return CH_OK;
}

const char *ch_dp_note(const ch_dp *dp)
{
    if (dp && dp->el.on && dp->el.note[0])
        return dp->el.note;
    dp = dp_live(dp);
    return dp ? dp->mb.note : "";
}

int ch_dp_pending(const ch_dp *dp)
{
    dp = dp_live(dp);
    return dp ? dp->tr.micro : 0;
}

ch_status ch_dp_last_step(const ch_dp *dp, int *counts, double *seconds, int n)
{
    dp = dp_live(dp);
    if (!dp || n != dp->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_last_step: %s",
                         !dp ? "dp is NULL" : "n is not the number of replicas");
    for (int i = 0; i < n; i++) {
        if (counts)
            counts[i] = dp->r[i].count;
        if (seconds)
            seconds[i] = dp->r[i].seconds;
    }
    return CH_OK;
}

ch_status ch_dp_last_compute(const ch_dp *dp, double *seconds, int n)
{
    dp = dp_live(dp);
    if (!dp || n != dp->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_last_compute: %s",
                         !dp ? "dp is NULL" : "n is not the number of replicas");
    for (int i = 0; seconds && i < n; i++)
        seconds[i] = dp->r[i].compute_seconds;
    return CH_OK;
}

double ch_dp_last_overlap(const ch_dp *dp)
{
    dp = dp_live(dp);
    if (!dp || !(dp->red.start > 0.0))
        return 0.0;
    double last = 0.0;
    for (int i = 0; i < dp->n; i++)
        if (dp->r[i].compute_end > last)
            last = dp->r[i].compute_end;
    return last > dp->red.start ? last - dp->red.start : 0.0;
}

ch_status ch_dp_last_breakdown(const ch_dp *dp, ch_dp_breakdown *out, int n)
{
    dp = dp_live(dp);
    if (!dp || !out || n != dp->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_last_breakdown: %s",
                         !dp    ? "dp is NULL"
                         : !out ? "out is NULL"
                                : "n is not the number of replicas");
    memcpy(out, dp->tb.last, (size_t)n * sizeof *out);
    return CH_OK;
}

ch_status ch_dp_slowest_counts(const ch_dp *dp, int64_t *counts, int n, int64_t *calls)
{
    dp = dp_live(dp);
    if (!dp || n != dp->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_slowest_counts: %s",
                         !dp ? "dp is NULL" : "n is not the number of replicas");
    for (int i = 0; counts && i < n; i++)
        counts[i] = dp->tb.slowest[i];
    if (calls)
        *calls = dp->tb.calls;
    return CH_OK;
}

size_t ch_dp_bucket_bytes(const ch_dp *dp, int *tuning)
{
    dp = dp_live(dp);
    if (tuning)
        *tuning = dp ? dp->tune.on : 0;
    return dp ? dp->tune.chosen : 0;
}

ch_reduce_mode ch_dp_reduce_mode(const ch_dp *dp)
{
    dp = dp_live(dp);
    return dp ? dp->o.reduce : CH_REDUCE_HOST;
}

int ch_dp_bucket_count(const ch_dp *dp)
{
    dp = dp_live(dp);
    return dp ? dp->bk.count : 0;
}

int ch_dp_bound(const ch_dp *dp, int index)
{
    dp = dp_live(dp);
    return dp && index >= 0 && index < dp->n ? dp->r[index].bound : 0;
}

ch_optimizer *ch_dp_optimizer(const ch_dp *dp, int index)
{
    dp = dp_live(dp);
    return dp && index >= 0 && index < dp->n ? dp->r[index].opt : NULL;
}

ch_status ch_dp_shard(const ch_dp *dp, int index, int64_t *first, int64_t *count)
{
    dp = dp_live(dp);
    if (!dp || index < 0 || index >= dp->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_shard: %s",
                         !dp ? "dp is NULL" : "index out of range");
    int64_t lo = 0, hi = dp->numel;
    if (dp->sh.on)
        dp_shard_part(dp, index, &lo, &hi);
    if (first)
        *first = lo;
    if (count)
        *count = hi - lo;
    return CH_OK;
}

ch_module *ch_dp_replica(const ch_dp *dp, int index)
{
    dp = dp_live(dp);
    if (!dp || index < 0 || index >= dp->n)
        return NULL;
    /* Whoever looks at a replica sees the lead's running statistics, and
     * a replica left out the lead's parameters. */
    if (index != dp_lead(dp) && dp_broadcast_buffers((ch_dp *)dp) != CH_OK)
        return NULL;
    if (dp->r[index].mb.out && ch_dp_sync_to(dp, dp->r[index].model) != CH_OK)
        return NULL;
    return dp->r[index].model;
}

ch_status ch_dp_sync_to(const ch_dp *dp, ch_module *model)
{
    dp = dp_live(dp);
    if (!dp || !model)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_sync_to: %s is NULL",
                         !dp ? "dp" : "model");
    const ch_module *src = dp->r[dp_lead(dp)].model;
    int np = ch_module_param_count(src);
    if (ch_module_param_count(model) != np)
        return chi_error(CH_ERR_SHAPE,
                         "ch_dp_sync_to: model has %d parameters, the replicas "
                         "%d",
                         ch_module_param_count(model), np);
    for (int i = 0; i < np; i++) {
        ch_tensor *a, *b;
        TRY(ch_module_param(src, i, NULL, &a, NULL));
        TRY(ch_module_param(model, i, NULL, &b, NULL));
        TRY(ch_copy(b, a));
    }
    int nb = ch_module_buffer_count(src);
    if (ch_module_buffer_count(model) != nb)
        return chi_error(CH_ERR_SHAPE, "ch_dp_sync_to: model has %d buffers, the replicas %d",
                         ch_module_buffer_count(model), nb);
    for (int i = 0; i < nb; i++) {
        ch_tensor *a, *b;
        int64_t *ca, *cb;
        TRY(ch_module_buffer(src, i, NULL, &a, &ca));
        TRY(ch_module_buffer(model, i, NULL, &b, &cb));
        if (!a != !b)
            return chi_error(CH_ERR_SHAPE, "ch_dp_sync_to: buffer %d differs in kind", i);
        if (a)
            TRY(ch_copy(b, a));
        else
            *cb = *ca;
    }
    return CH_OK;
}
