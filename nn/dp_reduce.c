/* Data parallelism (nn/dp.c): the buckets and the reducer thread.
 *
 * The parameters are cut into buckets in reverse order, the order
 * backward produces their gradients in; every replica's gradients are
 * views of one buffer per bucket (nn_grads_into). When backward has
 * produced a bucket's gradients, the worker records an event on its stream
 * and posts the bucket (the model's hook, dp_on_grads). The reducer thread
 * takes the buckets in order, each once every replica has posted it, and
 * all-reduces that bucket's buffers on the replicas' communication streams
 * (chorus/reduce.h), across processes too (its stage), while the workers'
 * backward goes on with the earlier layers. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "dp_impl.h"
#include "trace.h"

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

/* Bucket b is complete on this replica: mark the point on its stream and
 * hand it to the reducer. */
static ch_status post(replica *r, int b)
{
    ch_dp *dp = r->dp;
    r->bk.missing[b] = -1;
    TRY(ch_event_record(r->bk.ready[b], r->stream));
    dp_mark_here(r, PH_READY, 0, b);
    pthread_mutex_lock(&dp->w.lock);
    dp->bk.posted[b]++;
    pthread_cond_broadcast(&dp->red.posted);
    pthread_mutex_unlock(&dp->w.lock);
    return CH_OK;
}

/* The model's hook: gradients of parameters [first, first + count) are done. */
ch_status dp_on_grads(void *user, int first, int count)
{
    replica *r = user;
    if (!r->bk.posting)
        return CH_OK;
    for (int p = first; p < first + count; p++) {
        int b = r->dp->bk.of_param[p];
        if (r->bk.missing[b] > 0 && --r->bk.missing[b] == 0)
            TRY(post(r, b));
    }
    return CH_OK;
}

ch_status dp_post_rest(replica *r)
{
    for (int b = 0; b < r->dp->bk.count; b++)
        if (r->bk.missing[b] >= 0)
            TRY(post(r, b));
    return CH_OK;
}

/* Buckets of about bucket_bytes from the last parameter backwards: the
 * order backward produces the gradients in. */
ch_status dp_make_buckets(ch_dp *dp, const ch_module *model)
{
    int np = ch_module_param_count(model);
    size_t limit = dp->o.bucket_bytes == CH_DP_BUCKET_AUTO ? dp->tune.sizes[0]
                   : dp->o.bucket_bytes                    ? dp->o.bucket_bytes
                                                           : DEFAULT_BUCKET_BYTES;
    dp->tune.chosen = limit;
    int64_t *offs = calloc((size_t)np + 1, sizeof *offs);
    dp->bk.of_param = calloc((size_t)(np ? np : 1), sizeof *dp->bk.of_param);
    dp->bk.list = calloc((size_t)(np ? np : 1), sizeof *dp->bk.list);
    if (!offs || !dp->bk.of_param || !dp->bk.list) {
        free(offs);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    for (int i = 0; i < np; i++) {
        ch_tensor *v;
        ch_status st = ch_module_param(model, i, NULL, &v, NULL);
        if (st != CH_OK) {
            free(offs);
            return st;
        }
        offs[i + 1] = offs[i] + ch_tensor_numel(v);
    }
    int hi = np;
    while (hi > 0) {
        int lo = hi - 1;
        while (lo > 0 && (size_t)(offs[hi] - offs[lo - 1]) * sizeof(float) <= limit)
            lo--;
        bucket *b = &dp->bk.list[dp->bk.count];
        *b = (bucket){lo, hi, offs[hi] - offs[lo]};
        for (int p = lo; p < hi; p++)
            dp->bk.of_param[p] = dp->bk.count;
        dp->bk.count++;
        hi = lo;
    }
    free(offs);
    dp->bk.posted = calloc((size_t)(dp->bk.count ? dp->bk.count : 1), sizeof *dp->bk.posted);
    return dp->bk.posted ? CH_OK : chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
}

/* With dp->w.lock held: wait for the next call (*generation moving past
 * *seen); 0 when the dp is shutting down instead. */
int dp_next_call(ch_dp *dp, const int64_t *generation, int64_t *seen)
{
    while (!dp->w.quit && *generation == *seen)
        pthread_cond_wait(&dp->w.go, &dp->w.lock);
    if (dp->w.quit)
        return 0;
    *seen = *generation;
    return 1;
}

static ch_status reduce_bucket(ch_dp *dp, int b, ch_tensor **bufs)
{
    TRY(dp_injected(dp, -1));
    if (chi_tracing()) {
        char label[32];
        snprintf(label, sizeof label, "bucket %d", b);
        chi_trace_reducer_label(dp->red.reducer, label);
    }
    for (int i = 0; i < dp->n; i++) {
        TRY(dp_lose_here(dp->r[i].dev, DP_AT_REDUCE, dp->tr.step + 1));
        TRY(ch_event_wait(dp->r[i].comm, dp->r[i].bk.ready[b]));
        bufs[i] = dp->r[i].bk.grads[b];
    }
    /* The sharded optimizer's owners need their parts of the sum only:
     * in the process (the reducer's windows) and across processes (the
     * stage's). */
    dp->red.bucket = b;
    if (dp_shard_windows(dp, b)) {
        dp->red.scatter = dp->procs.ranks > 1;
        ch_status st = ch_reducer_reduce_scatter(dp->red.reducer, bufs, 0, dp->bk.list[b].count,
                                                 dp->sh.wfirst, dp->sh.wcount);
        dp->red.scatter = 0;
        return st;
    }
    return ch_reducer_allreduce(dp->red.reducer, bufs, 0, dp->bk.list[b].count);
}

/* The reducer's stage across processes: the process's total of a bucket
 * becomes the job's (chorus/reduce.h); under the sharded optimizer, in
 * this process's window of the bucket only (its replicas' parts), the
 * rest staying the process's total, which no replica reads. */
static ch_status sum_across(void *user, float *total, int64_t count)
{
    ch_dp *dp = user;
    const char *what = "reducing gradients across processes";
    if (dp->red.scatter) {
        dp_shard_rank_windows(dp, dp->red.bucket);
        return nn_comm_reduce_scatter_f32(dp->red.comm, total, dp->sh.rfirst, dp->sh.rcount, what);
    }
    return nn_comm_sum_f32(dp->red.comm, total, count, what);
}

/* The same in bf16 (reduce_dtype bf16): half the bytes cross. */
static ch_status sum_across_bf16(void *user, uint16_t *total, int64_t count)
{
    ch_dp *dp = user;
    return nn_comm_sum_bf16(dp->red.comm, total, count, "reducing gradients across processes");
}

/* Across processes, before each bucket: whether every process is still
 * in the step. A process that failed says so once, at the bucket it was
 * to reduce next, and every process stops there: no process is left
 * waiting for a bucket that will never come. It says too whether a
 * replica of its failed for want of memory for one sample (dp->red.small,
 * then the same on every process: ch_dp_step leaves such replicas out). */
static ch_status all_in(ch_dp *dp, int failed)
{
    double flag[2] = {failed ? 1.0 : 0.0, 0.0};
    for (int i = 0; failed && i < dp->n; i++)
        flag[1] += dp->r[i].mb.too_small;
    TRY(nn_comm_sum_f64(dp->red.comm, flag, 2, "reducing gradients across processes"));
    dp->red.small = flag[1] > 0.0;
    if (flag[0] > 0.0 && !failed)
        return chi_error(CH_ERR_REMOTE, "another process of the job failed in this step");
    return CH_OK;
}

/* With dp->w.lock held: the reducer failed; the workers stop too. */
static void reducer_failed(ch_dp *dp, ch_status st)
{
    dp->red.st = st;
    snprintf(dp->red.error, sizeof dp->red.error, "reducing gradients (%s): %s",
             ch_reduce_mode_name(dp->o.reduce), ch_last_error());
    atomic_store(&dp->w.failed, 1);
}

void *dp_reducer_main(void *arg)
{
    ch_dp *dp = arg;
    int64_t seen = 0;
    ch_tensor **bufs = dp->red.bufs;
    pthread_mutex_lock(&dp->w.lock);
    while (dp_next_call(dp, &dp->red.generation, &seen)) {
        int b;
        dp->red.small = 0;
        for (b = 0; b < dp->bk.count; b++) {
            while (dp->bk.posted[b] < dp->n && !atomic_load(&dp->w.failed))
                pthread_cond_wait(&dp->red.posted, &dp->w.lock);
            int failed = atomic_load(&dp->w.failed);
            if (dp->procs.ranks > 1) {
                pthread_mutex_unlock(&dp->w.lock);
                ch_clear_error();
                ch_status st = all_in(dp, failed);
                pthread_mutex_lock(&dp->w.lock);
                if (st != CH_OK && !atomic_load(&dp->w.failed))
                    reducer_failed(dp, st);
                if (st != CH_OK)
                    break;
            }
            if (failed)
                break;
            pthread_mutex_unlock(&dp->w.lock);
            double t0 = ch_clock_seconds();
            if (b == 0)
                dp->red.start = t0;
            ch_clear_error();
            ch_status st = reduce_bucket(dp, b, bufs);
            double t1 = ch_clock_seconds();
            dp->red.end = t1;
            if (st == CH_OK)
                dp_trace_bucket(dp, b, t0, t1);
            pthread_mutex_lock(&dp->w.lock);
            if (st != CH_OK) {
                reducer_failed(dp, st);
                break;
            }
        }
        dp->red.complete = b == dp->bk.count && !atomic_load(&dp->w.failed);
        dp->red.done = 1;
        pthread_cond_broadcast(&dp->red.posted);
    }
    pthread_mutex_unlock(&dp->w.lock);
    dp_thread_exit(dp, &dp->red.exited);
    return NULL;
}

void dp_wait_reduced(ch_dp *dp)
{
    pthread_mutex_lock(&dp->w.lock);
    while (!dp->red.done && !dp->w.broken)
        pthread_cond_wait(&dp->red.posted, &dp->w.lock);
    pthread_mutex_unlock(&dp->w.lock);
}

ch_status dp_make_reducer(ch_dp *dp)
{
    if (!dp->threaded)
        return CH_OK;
    /* Made here, not by the thread: a thread that could not allocate would
     * fail every step to come. */
    dp->red.bufs = malloc((size_t)dp->n * sizeof *dp->red.bufs);
    ch_stream **comms = malloc((size_t)dp->n * sizeof *comms);
    if (!comms || !dp->red.bufs) {
        free(comms);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    for (int i = 0; i < dp->n; i++)
        comms[i] = dp->r[i].comm;
    int64_t largest = 0;
    for (int b = 0; b < dp->bk.count; b++)
        if (dp->bk.list[b].count > largest)
            largest = dp->bk.list[b].count;
    /* CH_DP_BUCKET_AUTO: room for the largest candidate's buckets, so that
     * the reducer stays when they change (dp_rebucket): at most the
     * candidate's bytes or one parameter, whichever is larger. */
    if (dp->tune.on) {
        int64_t most = (int64_t)(dp->tune.sizes[dp->tune.ncand - 1] / sizeof(float));
        int np = ch_module_param_count(dp->r[0].model);
        for (int i = 0; i < np; i++) {
            ch_tensor *v;
            if (ch_module_param(dp->r[0].model, i, NULL, &v, NULL) == CH_OK &&
                ch_tensor_numel(v) > most)
                most = ch_tensor_numel(v);
        }
        if (most > dp->numel)
            most = dp->numel;
        if (most > largest)
            largest = most;
    }
    ch_status st = ch_reducer_new(&dp->red.reducer, comms, dp->n, largest, dp->o.reduce);
    free(comms);
    if (st == CH_OK && dp->procs.ranks > 1)
        st = ch_reducer_set_stage(dp->red.reducer, sum_across, dp);
    if (st == CH_OK && dp->procs.ranks > 1)
        st = ch_reducer_set_stage_bf16(dp->red.reducer, sum_across_bf16, dp);
    if (st == CH_OK && dp->o.reduce_dtype == CH_BF16)
        st = ch_reducer_set_dtype(dp->red.reducer, CH_BF16);
    if (st != CH_OK)
        return chi_error(st, "ch_dp_new: %s", ch_last_error());
    return CH_OK;
}
