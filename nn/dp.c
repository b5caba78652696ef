/* Data parallelism: replicas of one model, a persistent worker thread per
 * replica, the batch split by share, gradients weighted by share and
 * reduced in buckets while backward runs, one identical optimizer step on
 * every replica.
 *
 * The parameters are cut into buckets in reverse order, and every
 * replica's gradients are views of one buffer per bucket (nn_grads_into):
 * a bucket is reduced as a whole, and no buffer is read by the reduction
 * while backward still writes into it (OpenCL leaves concurrent access to
 * one buffer from two queues undefined; no single allocation has to hold
 * every gradient of a large model either).
 * When backward has produced a bucket's gradients, the worker records an
 * event on its stream and posts the bucket. A reducer thread takes the
 * buckets in order, each once every replica has posted it, and all-reduces
 * that bucket's buffers on the replicas' communication streams
 * (chorus/reduce.h: host-staged, peer or both), while the workers' backward
 * goes on with the earlier layers.
 *
 * A training call runs in phases separated by a barrier that every worker
 * reaches whatever happened before, so a failure on one replica cannot
 * leave the others waiting: compute (forward, backward, posting buckets,
 * then waiting until the reducer is done with the step or has given up
 * because something failed), update (the optimizer, the checksum).
 *
 * Across streams (docs/DESIGN.md, Streams): a communication stream reads
 * and writes a bucket only after the event its compute stream recorded;
 * the compute stream touches the bucket again only once the reducer has
 * drained its streams (the update comes after dp_wait_reduced); every call
 * returns with each replica's stream drained (run_call).
 *
 * This file holds the object and its calls; the queries, the workers, the
 * buckets and the reducer, BatchNorm's exchange and the join across
 * processes have files of their own (nn/dp_impl.h lists them and what they
 * share). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_impl.h"

/* ---- Failures injected by tests ----------------------------------------------
 * The hooks tests call (nn/nn.h); dp_impl.h has the checks. */

#ifdef CHI_TEST_HOOKS
void chi_dp_fail_next(ch_dp *dp, int replica)
{
    dp = dp_live(dp);
    if (dp)
        dp->inject.replica = replica;
}

void chi_dp_fail_update_next(ch_dp *dp, int replica)
{
    dp = dp_live(dp);
    if (dp)
        dp->inject.update = replica;
}

void chi_dp_fail_reduce_next(ch_dp *dp)
{
    dp = dp_live(dp);
    if (dp)
        dp->inject.reduce = 1;
}
#endif

/* ---- Setting up --------------------------------------------------------------------- */

static ch_status check_options(const ch_dp_options *o, int n)
{
    if (o->reduce != CH_REDUCE_HOST && o->reduce != CH_REDUCE_PEER &&
        o->reduce != CH_REDUCE_AUTO)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->reduce is %d, expected "
                         "CH_REDUCE_HOST, CH_REDUCE_PEER or CH_REDUCE_AUTO", (int)o->reduce);
    if (o->split != CH_DP_SPLIT_EQUAL && o->split != CH_DP_SPLIT_WEIGHTS &&
        o->split != CH_DP_SPLIT_AUTO)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->split is %d, expected "
                         "CH_DP_SPLIT_EQUAL, CH_DP_SPLIT_WEIGHTS or CH_DP_SPLIT_AUTO",
                         (int)o->split);
    if (o->split == CH_DP_SPLIT_WEIGHTS && !o->weights)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->split is "
                         "CH_DP_SPLIT_WEIGHTS but options->weights is NULL");
    if (o->split == CH_DP_SPLIT_WEIGHTS && o->nweights != n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: %d weights for %d devices; give "
                         "one weight per device", o->nweights, n);
    for (int i = 0; o->split == CH_DP_SPLIT_WEIGHTS && i < n; i++)
        if (!(o->weights[i] > 0.0f) || o->weights[i] > 1e30f)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->weights[%d] is %g, "
                             "expected a positive number", i, o->weights[i]);
    if (o->accumulate < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->accumulate is %d, "
                         "expected >= 0", o->accumulate);
    if (o->check_every < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->check_every is %d, "
                         "expected >= 0", o->check_every);
    if (o->sample_dtype != CH_F32 && o->sample_dtype != CH_I32)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->sample_dtype is %s, "
                         "expected f32 or i32", ch_dtype_name(o->sample_dtype));
    if (o->labels_per_sample < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->labels_per_sample is "
                         "%lld, expected >= 0", (long long)o->labels_per_sample);
    if (o->sample_ndim < 1 || o->sample_ndim > CH_MAX_DIMS - 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->sample_ndim is %d, "
                         "expected 1 to %d", o->sample_ndim, CH_MAX_DIMS - 1);
    if (o->precision != CH_F32 && o->precision != CH_BF16 && o->precision != CH_F16)
        return chi_error(CH_ERR_DTYPE, "ch_dp_new: options->precision is %s, expected f32, "
                         "bf16 or f16", ch_dtype_name(o->precision));
    if (!(o->loss_scale >= 0.0f) || !isfinite(o->loss_scale))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->loss_scale is %g, "
                         "expected a finite number >= 0 (0: 65536)", o->loss_scale);
    if (o->reduce_dtype != CH_F32 && o->reduce_dtype != CH_BF16)
        return chi_error(CH_ERR_DTYPE, "ch_dp_new: options->reduce_dtype is %s, expected f32 "
                         "or bf16", ch_dtype_name(o->reduce_dtype));
    if (o->memory_limits && o->nmemory_limits != n)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_dp_new: %d memory limits for %d devices; "
                         "give one per device (0: none)",
                         o->nmemory_limits, n);
    if (o->loss_scale_interval < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->loss_scale_interval "
                         "is %d, expected >= 0 (0: 2000)", o->loss_scale_interval);
    return CH_OK;
}

/* options->memory_limits onto the devices: a device listed twice takes
 * the larger of its limits. */
static ch_status apply_limits(const ch_dp_options *o, ch_device *const *devices, int n)
{
    for (int i = 0; o->memory_limits && i < n; i++) {
        uint64_t most = o->memory_limits[i];
        for (int j = 0; j < n; j++)
            if (devices[j] == devices[i] && o->memory_limits[j] > most)
                most = o->memory_limits[j];
        if (most > 0)
            TRY(ch_device_set_memory_limit(devices[i], most));
    }
    return CH_OK;
}

/* Micro-batches by memory: a limited device holds one replica (the peaks
 * that size them are the device's), and BatchNorm's statistics, exchanged
 * once a pass, are each replica's own. */
static ch_status check_limited(ch_dp *dp, const ch_module *model, ch_device *const *devices, int n)
{
    int sync_bn = dp->threaded && !dp->o.batchnorm_local && ch_module_buffer_count(model) > 0;
    for (int i = 0; i < n; i++) {
        ch_memory_stats ms;
        TRY(ch_device_memory_stats(devices[i], &ms));
        if (ms.limit_bytes == 0)
            continue;
        for (int j = 0; j < n; j++)
            if (j != i && devices[j] == devices[i])
                return chi_error(CH_ERR_UNSUPPORTED,
                                 "ch_dp_new: %s has a memory limit and "
                                 "holds two replicas; a limited device holds one (its "
                                 "micro-batches are sized from its peaks)",
                                 ch_device_id(devices[i]));
        if (sync_bn)
            return chi_error(CH_ERR_UNSUPPORTED,
                             "ch_dp_new: %s has a memory limit, so its "
                             "share may be cut into micro-batches, which BatchNorm's "
                             "statistics synchronised over the whole batch cannot be; "
                             "set options->batchnorm_local",
                             ch_device_id(devices[i]));
        dp->r[i].mb.limit = ms.limit_bytes;
    }
    return CH_OK;
}

static ch_status make_replica(ch_dp *dp, int i, const ch_module *model, ch_device *dev)
{
    replica *r = &dp->r[i];
    r->dp = dp;
    r->index = i;
    r->dev = dev;
    TRY(ch_stream_new(&r->stream, dev));
    TRY(ch_stream_new(&r->comm, dev));
    /* The clone is made on this thread; its ops go to the replica's stream. */
    TRY(ch_module_clone(&r->model, model, dev));
    TRY(ch_module_set_precision(r->model, dp->o.precision));
    if (dp->o.recompute)
        TRY(ch_module_set_recompute(r->model, 1));
    r->bk.grads = calloc((size_t)dp->bk.count, sizeof *r->bk.grads);
    if (!r->bk.grads)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    /* The clone's gradients go before the buckets come (every call zeroes
     * the buckets first): the device holds the parameters and one copy
     * of the gradients, not two. */
    nn_drop_grads(r->model);
    for (int b = 0; b < dp->bk.count; b++) {
        int64_t shape[1] = {dp->bk.list[b].count};
        TRY(ch_tensor_new(&r->bk.grads[b], dev, CH_F32, 1, shape));
        TRY(nn_grads_into(r->model, dp->bk.list[b].p_lo, dp->bk.list[b].p_hi - dp->bk.list[b].p_lo,
                          r->bk.grads[b]));
    }
    nn_set_grad_hook(r->model, dp_on_grads, r);
    TRY(dp_trace_hook(r));
    if (dp->threaded && !dp->o.batchnorm_local)
        nn_set_sync(r->model, dp_exchange_sums, r);
    TRY(ch_loss_new(&r->loss, dp->o.loss));
    TRY(ch_optimizer_new(&r->opt, r->model, &dp->o.optimizer));
    r->bk.ready = calloc((size_t)(dp->bk.count ? dp->bk.count : 1), sizeof *r->bk.ready);
    r->bk.missing = calloc((size_t)(dp->bk.count ? dp->bk.count : 1), sizeof *r->bk.missing);
    if (!r->bk.ready || !r->bk.missing)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    for (int b = 0; b < dp->bk.count; b++)
        TRY(ch_event_new(&r->bk.ready[b], dev));
    return ch_device_sync(dev);
}

static ch_status start_threads(ch_dp *dp)
{
    /* One replica in one process: the calling thread runs it, nothing to
     * hand over. */
    if (!dp->threaded)
        return CH_OK;
    for (int i = 0; i < dp->n; i++) {
        int e = pthread_create(&dp->r[i].thread, NULL, dp_worker, &dp->r[i]);
        if (e != 0)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: pthread_create: %s", strerror(e));
        dp->r[i].started = 1;
    }
    int e = pthread_create(&dp->red.thread, NULL, dp_reducer_main, dp);
    if (e != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: pthread_create: %s", strerror(e));
    dp->red.started = 1;
    /* Every worker bound and waiting before the first call. */
    pthread_mutex_lock(&dp->w.lock);
    while (dp->w.finished < dp->n)
        pthread_cond_wait(&dp->w.done, &dp->w.lock);
    pthread_mutex_unlock(&dp->w.lock);
    return CH_OK;
}

static ch_status init_sync(ch_dp *dp)
{
    if (pthread_mutex_init(&dp->w.lock, NULL) != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: pthread_mutex_init failed");
    if (pthread_cond_init(&dp->w.go, NULL) != 0 || pthread_cond_init(&dp->w.done, NULL) != 0 ||
        pthread_cond_init(&dp->red.posted, NULL) != 0 ||
        pthread_cond_init(&dp->bn.exchanged, NULL) != 0 || pthread_cond_init(&dp->w.bar, NULL) != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: cannot make the workers' "
                         "condition variables and barrier");
    return CH_OK;
}

ch_status dp_create(ch_dp **out, const ch_module *model, ch_device *const *devices, int n,
                    const ch_dp_options *options)
{
    if (!out || !model || !devices || !options)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: %s is NULL",
                         !out ? "out" : !model ? "model" : !devices ? "devices" : "options");
    *out = NULL;
    if (n < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: n is %d, expected at least one "
                         "device", n);
    for (int i = 0; i < n; i++)
        if (!devices[i])
            return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: devices[%d] is NULL", i);
    TRY(check_options(options, n));
    TRY(apply_limits(options, devices, n));
    ch_dp *dp = calloc(1, sizeof *dp);
    if (!dp)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    ch_status st = init_sync(dp);
    if (st != CH_OK) {
        free(dp);
        return st;
    }
    dp->n = n;
    dp->o = *options;
    dp->o.weights = NULL; /* the caller's array may go away: the split has its own */
    dp->o.memory_limits = NULL; /* applied to the devices */
    dp->procs.dist = options->dist;
    dp->procs.ranks = ch_dist_size(dp->procs.dist);
    dp->procs.rank = ch_dist_rank(dp->procs.dist);
    /* Elastic: threads for two replicas or more, so that the calling
     * thread can give up on one that stops answering. */
    dp->threaded = n > 1 || dp->procs.ranks > 1;
    dp->bn.expected = -1;
    dp->procs.nall = n;
    dp_injected_clear(dp, 1);
    dp->call.grad_rescale = 1.0f;
    dp->tr.scaler = options->precision != CH_F16 ? 1.0f
                    : options->loss_scale > 0.0f ? options->loss_scale
                                                 : 65536.0f;
    dp->numel = ch_module_param_numel(model);
    dp->r = calloc((size_t)n, sizeof *dp->r);
    st = dp->r ? CH_OK : chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    /* Across processes the communicators come first, so that a process
     * that fails below still meets the others in dp_join(). */
    int comms = 0;
    if (st == CH_OK && dp->procs.ranks > 1) {
        st = dp_make_comms(dp);
        comms = st == CH_OK;
    }
    if (st == CH_OK && dp->numel == 0)
        st = chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: the model has no parameters");
    if (options->bucket_bytes == CH_DP_BUCKET_AUTO)
        dp_tune_init(dp);
    if (st == CH_OK)
        st = check_limited(dp, model, devices, n);
    if (st == CH_OK)
        st = dp_make_buckets(dp, model);
    for (int i = 0; st == CH_OK && i < n; i++)
        st = make_replica(dp, i, model, devices[i]);
    if (st == CH_OK)
        st = dp_trace_init(dp);
    if (st == CH_OK)
        st = dp_make_reducer(dp);
    float *weights = NULL;
    if (comms) {
        st = dp_join(dp, st, options, &weights);
    } else if (st == CH_OK) {
        dp->procs.rank_n = calloc(1, sizeof *dp->procs.rank_n);
        dp->procs.rank_first = calloc(1, sizeof *dp->procs.rank_first);
        if (!dp->procs.rank_n || !dp->procs.rank_first)
            st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
        else
            dp->procs.rank_n[0] = n;
    }
    if (st == CH_OK) {
        st = nn_split_init(&dp->split, dp->procs.nall, options->split,
                           weights ? weights : options->weights);
        if (st != CH_OK)
            st = chi_error(st, "ch_dp_new: %s", ch_last_error());
    }
    free(weights);
    if (st == CH_OK)
        st = dp_shard_init(dp);
    if (st == CH_OK && dp->procs.ranks > 1) {
        st = dp_bcast_state(dp, 1, "ch_dp_new: rank 0's parameters and buffers");
        if (st == CH_OK)
            st = dp_check_same_start(dp);
        if (st == CH_OK)
            st = dp_try_span(dp);
        if (st == CH_OK)
            st = dp_trace_align(dp);
    }
    if (st == CH_OK)
        st = start_threads(dp);
    if (st != CH_OK) {
        dp_destroy(dp);
        return st;
    }
    *out = dp;
    return CH_OK;
}

/* What elastic data parallelism cannot work with (nn/dp_elastic.c). */
static ch_status check_elastic(const ch_dp_options *o)
{
    if (!o->elastic)
        return CH_OK;
    if (ch_dist_size(o->dist) > 1)
        return chi_error(CH_ERR_UNSUPPORTED,
                         "ch_dp_new: options->elastic works inside one process; across "
                         "processes a lost process is restarted from a checkpoint "
                         "(chorus-elastic, docs/DATA_PARALLEL.md)");
    if (o->shard_optimizer)
        return chi_error(CH_ERR_UNSUPPORTED,
                         "ch_dp_new: options->elastic needs every replica to hold the whole "
                         "optimizer state (a lost replica's part of a sharded state is lost "
                         "with it); leave shard_optimizer off");
    if (o->accumulate > 1)
        return chi_error(CH_ERR_UNSUPPORTED,
                         "ch_dp_new: options->elastic with accumulate %d: a lost device would "
                         "lose the micro-batches accumulated before it; use accumulate 1",
                         o->accumulate);
    if (!(o->elastic_timeout >= 0.0) || !isfinite(o->elastic_timeout))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_dp_new: options->elastic_timeout is %g, expected a finite "
                         "number of seconds >= 0 (0: 60)",
                         o->elastic_timeout);
    return CH_OK;
}

ch_status ch_dp_new(ch_dp **out, const ch_module *model, ch_device *const *devices, int n,
                    const ch_dp_options *options)
{
    if (!out || !model || !devices || !options)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: %s is NULL",
                         !out       ? "out"
                         : !model   ? "model"
                         : !devices ? "devices"
                                    : "options");
    *out = NULL;
    TRY(check_elastic(options));
    ch_dp *dp = NULL;
    TRY(dp_create(&dp, model, devices, n, options));
    if (!options->elastic) {
        *out = dp;
        return CH_OK;
    }
    ch_status st = dp_elastic_wrap(out, dp, devices, n, options);
    if (st != CH_OK)
        dp_destroy(dp);
    return st;
}

void ch_dp_free(ch_dp *dp)
{
    if (dp && dp->el.on)
        dp_elastic_free(dp);
    else
        dp_destroy(dp);
}

void dp_destroy(ch_dp *dp)
{
    if (!dp)
        return;
    pthread_mutex_lock(&dp->w.lock);
    dp->w.quit = 1;
    pthread_cond_broadcast(&dp->w.go);
    pthread_mutex_unlock(&dp->w.lock);
    if (dp->red.started)
        pthread_join(dp->red.thread, NULL);
    for (int i = 0; dp->r && i < dp->n; i++)
        if (dp->r[i].started)
            pthread_join(dp->r[i].thread, NULL);
    ch_reducer_free(dp->red.reducer);
    dp_trace_free(dp);
    dp_shard_free(dp);
    for (int i = 0; dp->r && i < dp->n; i++) {
        replica *r = &dp->r[i];
        if (r->stream)
            (void)ch_stream_sync(r->stream);
        ch_tensor_free(r->x);
        ch_tensor_free(r->labels);
        ch_tensor_free(r->pred);
        ch_tensor_free(r->wide);
        ch_tensor_free(r->fp16.finite);
        free(r->fp16.finite_host);
        free(r->pred_host);
        free(r->bn.buf);
        free(r->bn.sum);
        ch_optimizer_free(r->opt);
        ch_loss_free(r->loss);
        ch_module_free(r->model);
        for (int b = 0; r->bk.grads && b < dp->bk.count; b++)
            ch_tensor_free(r->bk.grads[b]);
        free(r->bk.grads);
        for (int b = 0; r->bk.ready && b < dp->bk.count; b++)
            ch_event_free(r->bk.ready[b]);
        free(r->bk.ready);
        free(r->bk.missing);
        ch_stream_free(r->comm);
        ch_stream_free(r->stream);
    }
    pthread_cond_destroy(&dp->w.bar);
    pthread_cond_destroy(&dp->w.go);
    pthread_cond_destroy(&dp->w.done);
    pthread_cond_destroy(&dp->red.posted);
    pthread_cond_destroy(&dp->bn.exchanged);
    pthread_mutex_destroy(&dp->w.lock);
    free(dp->r);
    nn_comm_free(dp->bn.comm);
    nn_comm_free(dp->red.comm);
    nn_comm_free(dp->procs.ctl);
    free(dp->procs.rank_n);
    free(dp->procs.rank_first);
    free(dp->procs.reports);
    free(dp->bn.total);
    free(dp->bn.counts);
    nn_split_free(&dp->split);
    free(dp->bk.list);
    free(dp->bk.of_param);
    free(dp->bk.posted);
    free(dp->red.bufs);
    free(dp);
}

/* ---- A call ------------------------------------------------------------------------- */

/* Share the batch out over the job's replicas: each local replica's count
 * and start. */
static void split(ch_dp *dp, int total)
{
    nn_split_batch(&dp->split, total);
    for (int i = 0; i < dp->n; i++) {
        dp->r[i].count = dp->split.count[dp->procs.first + i];
        dp->r[i].start = dp->split.start[dp->procs.first + i];
    }
}

/* Auto split: the replicas' compute times of the call just made, every
 * process's (from the reports) when there are several. */
static void measure(ch_dp *dp)
{
    for (int i = 0; i < dp->n; i++)
        dp->split.seconds[dp->procs.first + i] = dp->r[i].compute_seconds;
    for (int k = 0; dp->procs.ranks > 1 && k < dp->procs.ranks; k++)
        for (int i = 0; k != dp->procs.rank && i < dp->procs.rank_n[k]; i++)
            dp->split.seconds[dp->procs.rank_first[k] + i] =
                dp_report_seconds(dp_report_of(dp, k))[i];
    nn_split_measure(&dp->split);
}

/* The first error of the call: a replica's, else the reducer's. */
static ch_status call_status(ch_dp *dp, const char *fn)
{
    for (int i = 0; i < dp->n; i++)
        if (dp->r[i].st != CH_OK)
            return chi_error(dp->r[i].st, "%s: %s", fn, dp->r[i].error);
    if (dp->red.st != CH_OK)
        return chi_error(dp->red.st, "%s: %s", fn, dp->red.error);
    return CH_OK;
}

static ch_status check_batch(const ch_dp *dp, const ch_batch *batch, const char *fn,
                             int labels)
{
    if (batch->count < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: the batch has %d samples", fn,
                         batch->count);
    if (!batch->images || (labels && !batch->labels))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: the batch has no %s", fn,
                         !batch->images ? "images" : "labels");
    size_t sample = dp_sample_bytes(dp);
    if (ch_host_buffer_size(batch->images) < sample * (size_t)batch->count)
        return chi_error(CH_ERR_SHAPE, "%s: the images buffer holds %zu bytes, %d samples "
                         "need %zu", fn, ch_host_buffer_size(batch->images), batch->count,
                         sample * (size_t)batch->count);
    size_t lb = dp_label_bytes(dp) * (size_t)batch->count;
    if (labels && ch_host_buffer_size(batch->labels) < lb)
        return chi_error(CH_ERR_SHAPE, "%s: the labels buffer holds %zu bytes, the labels of "
                         "%d samples need %zu", fn, ch_host_buffer_size(batch->labels),
                         batch->count, lb);
    return CH_OK;
}

/* After a checked step: every replica of this process holds replica 0's
 * parameters. */
static ch_status check_replicas(const ch_dp *dp, const char *fn, int64_t step)
{
    int lead = dp_lead(dp);
    for (int i = 0; i < dp->n; i++)
        if (!dp->r[i].mb.out && dp->r[i].checksum != dp->r[lead].checksum)
            return chi_error(CH_ERR_INTERNAL,
                             "%s: replica %d on %s holds other parameters "
                             "than replica 0 after step %lld (checksum %016llx, want %016llx)",
                             fn, i, ch_device_id(dp->r[i].dev), (long long)step,
                             (unsigned long long)dp->r[i].checksum,
                             (unsigned long long)dp->r[lead].checksum);
    return CH_OK;
}

/* After a replica failed during its update, the replicas may hold
 * different parameters: every later call fails. */
static ch_status check_parted(const ch_dp *dp, const char *fn)
{
    if (!atomic_load(&dp->w.parted))
        return CH_OK;
    return chi_error(CH_ERR_STATE,
                     "%s: an earlier step failed while the replicas were updating "
                     "their parameters, so they may differ (%.900s): free this dp and make a new "
                     "one, from a checkpoint",
                     fn, dp->w.parted_error);
}

/* A training call: micro-batch `batch` (NULL: flush), reducing and
 * updating when `sync`. */
static ch_status train_call(ch_dp *dp, const ch_batch *batch, float lr, int sync,
                            float *loss)
{
    const char *fn = batch ? "ch_dp_step" : "ch_dp_flush";
    TRY(check_parted(dp, fn));
    dp->tb.call_start = ch_clock_seconds();
    dp->tb.traced_step = dp->tr.step + 1;
    ch_status tuned = dp_tune_before(dp);
    if (tuned != CH_OK)
        return chi_error(tuned, "%s: choosing the bucket size: %s", fn, ch_last_error());
    int k = dp->o.accumulate > 1 ? dp->o.accumulate : 1;
    dp->call.job = JOB_TRAIN;
    dp->call.batch = batch;
    dp->call.lr = lr;
    dp->call.sync = sync;
    dp->call.loss_scale = dp->tr.scaler / (float)k;
    dp->call.grad_rescale = batch ? 1.0f : (float)k / (float)dp->tr.micro;
    if (batch) {
        split(dp, batch->count);
        TRY(dp_check_every_rank_has_samples(dp, fn, batch->count));
    } else {
        for (int i = 0; i < dp->n; i++)
            dp->r[i].count = 0;
    }
    dp_run_all(dp);
    dp_injected_clear(dp, sync);
    dp->call.grad_rescale = 1.0f;
    ch_status st = call_status(dp, fn);
    if (atomic_load(&dp->w.parted) && !dp->w.parted_error[0])
        snprintf(dp->w.parted_error, sizeof dp->w.parted_error, "%s", ch_last_error());
    int checked = sync && dp->o.check_every > 0 && (dp->tr.step + 1) % dp->o.check_every == 0;
    if (st == CH_OK && checked)
        st = check_replicas(dp, fn, dp->tr.step + 1);
    double part = 0;
    for (int i = 0; batch && i < dp->n; i++)
        part += (double)dp->r[i].loss_value * dp->r[i].count / batch->count;
    st = dp_share_outcome(dp, st, fn, part, 0, checked, dp->tr.step + 1);
    if (st == CH_OK && batch)
        measure(dp);
    dp->tb.call_end = ch_clock_seconds();
    dp_trace_call_end(dp, st, sync, batch ? batch->count : 0);
    if (st != CH_OK) {
        /* What was accumulated is gone with the failed call. */
        dp->tr.micro = 0;
        dp->tr.micro_samples = 0;
        return st;
    }
    if (batch)
        dp->bn.expected = dp->bn.done;
    double total = part;
    if (dp->procs.ranks > 1) {
        total = 0;
        for (int r = 0; r < dp->procs.ranks; r++)
            total += dp_report_of(dp, r)->loss;
    }
    if (loss)
        *loss = (float)total;
    if (!sync) {
        dp->tr.micro++;
        dp->tr.micro_samples += batch->count;
        return CH_OK;
    }
    dp->tr.micro = 0;
    dp->tr.micro_samples = 0;
    dp->tr.step++;
    dp_rescale(dp);
    int buffers = ch_module_buffer_count(dp->r[0].model) > 0;
    dp->tr.buffers_stale = dp->n > 1 && buffers;
    dp->tr.ranks_stale = dp->procs.ranks > 1 && dp->o.batchnorm_local && buffers;
    return CH_OK;
}

/* Replica r (local) is left out: the note says so. */
static void note_left_out(ch_dp *dp, const replica *r)
{
    snprintf(dp->mb.note, sizeof dp->mb.note,
             "%s is left out: one sample does not fit in "
             "its memory limit of %.1f MiB (ch_device_set_memory_limit)",
             ch_device_id(r->dev), (double)r->mb.limit / 1048576.0);
}

/* After a failed training call in one process: leave out every replica
 * whose first pass of one sample did not fit its device's limit. Returns
 * whether one was. */
static int leave_out_here(ch_dp *dp)
{
    int any = 0;
    for (int i = 0; i < dp->n; i++) {
        replica *r = &dp->r[i];
        if (!r->mb.too_small)
            continue;
        r->mb.too_small = 0;
        if (!nn_split_leave_out(&dp->split, dp->procs.first + i))
            continue;
        r->mb.out = 1;
        if (dp_shard_recut(dp) != CH_OK) {
            /* Its part cannot move (a state was set already): it stays. */
            r->mb.out = 0;
            dp->split.out[dp->procs.first + i] = 0;
            continue;
        }
        note_left_out(dp, r);
        any = 1;
    }
    return any;
}

/* The same across processes, after a call that failed on every process
 * because some replica of the job could not fit one sample
 * (dp->red.small, the same everywhere): every process learns which (a
 * collective), and leaves out the same replicas of the job's split, each
 * only while its process keeps another replica (a process with none
 * would have nothing to train or update: the call's message then says
 * so) and while no optimizer of the job has its state yet (a sharded part
 * cannot move after that). When one is, the parts are cut again (a
 * collective). */
static int leave_out_across(ch_dp *dp)
{
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ch_last_error());
    int nmax = dp->procs.nmax, ranks = dp->procs.ranks;
    int *mine = calloc((size_t)nmax + 1, sizeof *mine);
    int *all = calloc(((size_t)nmax + 1) * (size_t)ranks, sizeof *all);
    ch_status st = mine && all ? CH_OK : chi_error(CH_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; mine && i < dp->n; i++) {
        int made = 0;
        (void)nn_optimizer_state_bytes(dp->r[i].opt, &made);
        mine[i] = dp->r[i].mb.too_small;
        mine[nmax] |= made && dp->sh.on;
        dp->r[i].mb.too_small = 0;
    }
    /* Every process takes part, one that could not allocate too. */
    if (st == CH_OK)
        st = nn_comm_allgather(dp->procs.ctl, mine, all, ((size_t)nmax + 1) * sizeof *mine,
                               "leaving out a device too small for one sample");
    int any = 0, fixed = 0;
    for (int k = 0; st == CH_OK && k < ranks; k++)
        fixed |= all[(size_t)k * ((size_t)nmax + 1) + (size_t)nmax];
    for (int k = 0; st == CH_OK && !fixed && k < ranks; k++) {
        int first = dp->procs.rank_first[k], n = dp->procs.rank_n[k], in = 0;
        for (int i = 0; i < n; i++)
            in += !dp->split.out[first + i];
        for (int i = 0; i < n; i++) {
            if (!all[(size_t)k * ((size_t)nmax + 1) + (size_t)i])
                continue;
            if (in < 2 && k == dp->procs.rank)
                (void)chi_error(CH_ERR_DEVICE_OUT_OF_MEMORY,
                                "%s; %s is not left out: it is its process's only replica", msg,
                                ch_device_id(dp->r[i].dev));
            if (in < 2 || !nn_split_leave_out(&dp->split, first + i))
                continue;
            in--;
            any = 1;
            if (k == dp->procs.rank) {
                dp->r[i].mb.out = 1;
                note_left_out(dp, &dp->r[i]);
            }
        }
    }
    free(mine);
    free(all);
    /* Every process cuts the parts again (the sharded cut is a collective). */
    return any && dp_shard_recut(dp) == CH_OK;
}

/* After a failed training call: leave out every replica of the job whose
 * first pass of one sample did not fit its device's limit. Returns
 * whether one was. */
static int leave_out_small(ch_dp *dp)
{
    if (dp->procs.ranks < 2)
        return leave_out_here(dp);
    return dp->red.small ? leave_out_across(dp) : 0;
}

ch_status ch_dp_step(ch_dp *dp, float *loss, const ch_batch *batch, float lr)
{
    if (!dp || !batch || !loss)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_step: %s is NULL",
                         !dp ? "dp" : !batch ? "batch" : "loss");
    TRY(check_batch(dp, batch, "ch_dp_step", 1));
    if (dp->el.on)
        return dp_elastic_train(dp, loss, batch, lr);
    return dp_step_now(dp, loss, batch, lr);
}

ch_status dp_step_now(ch_dp *dp, float *loss, const ch_batch *batch, float lr)
{
    if (!isfinite(lr) || lr < 0.0f)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_step: lr is %g, expected a finite "
                         "number >= 0", lr);
    int k = dp->o.accumulate > 1 ? dp->o.accumulate : 1, first = dp->tr.micro == 0;
    ch_status st = train_call(dp, batch, lr, dp->tr.micro + 1 >= k, loss);
    /* A device too small for one sample under its limit is left out, and
     * the call made again without it (when it began an accumulation:
     * nothing earlier was lost with the failure). */
    while (st != CH_OK && leave_out_small(dp) && first)
        st = train_call(dp, batch, lr, dp->tr.micro + 1 >= k, loss);
    return st;
}

ch_status ch_dp_loss_scale(const ch_dp *dp, float *scale, int *clean_steps, int64_t *skipped)
{
    dp = dp_live(dp);
    if (!dp)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_loss_scale: dp is NULL");
    if (scale)
        *scale = dp->tr.scaler;
    if (clean_steps)
        *clean_steps = dp->tr.scaler_clean;
    if (skipped)
        *skipped = dp->tr.skipped;
    return CH_OK;
}

ch_status ch_dp_set_loss_scale(ch_dp *dp, float scale, int clean_steps)
{
    dp = dp_live(dp);
    if (!dp)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_set_loss_scale: dp is NULL");
    if (dp->o.precision != CH_F16)
        return chi_error(CH_ERR_STATE, "ch_dp_set_loss_scale: the dp trains in %s; only f16 "
                         "scales its loss", ch_dtype_name(dp->o.precision));
    if (!(scale > 0.0f) || !isfinite(scale) || clean_steps < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_set_loss_scale: scale %g, clean "
                         "steps %d: expected a positive finite scale and a count >= 0",
                         scale, clean_steps);
    dp->tr.scaler = scale;
    dp->tr.scaler_clean = clean_steps;
    return CH_OK;
}

ch_status ch_dp_flush(ch_dp *dp, float lr)
{
    if (!dp)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_flush: dp is NULL");
    if (!isfinite(lr) || lr < 0.0f)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_flush: lr is %g, expected a finite "
                         "number >= 0", lr);
    /* Elastic: accumulate is 1, nothing is ever pending. */
    if (dp->el.on || dp->tr.micro == 0)
        return CH_OK;
    return train_call(dp, NULL, lr, 1, NULL);
}

static ch_status infer_call(ch_dp *dp, job j, const ch_batch *batch, ch_tensor *out)
{
    const char *fn = j == JOB_PREDICT ? "ch_dp_predict" : "ch_dp_evaluate";
    TRY(check_parted(dp, fn));
    if (dp->tr.ranks_stale) {
        /* Per-process BatchNorm statistics: rank 0's are the ones kept. */
        ch_status st = dp_bcast_state(dp, 0, "rank 0's running statistics");
        if (st != CH_OK)
            return chi_error(st, "%s: %s", fn, ch_last_error());
        dp->tr.ranks_stale = 0;
    }
    ch_status st = dp_broadcast_buffers(dp);
    if (st != CH_OK)
        return chi_error(st, "%s: copying replica 0's running statistics: %s", fn,
                         ch_last_error());
    dp->call.job = j;
    dp->call.batch = batch;
    dp->call.out = out;
    dp->call.sync = 0;
    split(dp, batch->count);
    dp_run_all(dp);
    dp_injected_clear(dp, 0);
    dp->call.out = NULL;
    st = call_status(dp, fn);
    double loss = 0;
    int64_t correct = 0;
    for (int i = 0; i < dp->n; i++) {
        loss += (double)dp->r[i].loss_value * dp->r[i].count / batch->count;
        correct += dp->r[i].correct;
    }
    TRY(dp_share_outcome(dp, st, fn, loss, correct, 0, dp->tr.step));
    if (dp->procs.ranks > 1) {
        loss = 0;
        correct = 0;
        for (int k = 0; k < dp->procs.ranks; k++) {
            loss += dp_report_of(dp, k)->loss;
            correct += dp_report_of(dp, k)->correct;
        }
    }
    dp->call.eval_loss = loss;
    dp->call.eval_correct = correct;
    if (j == JOB_PREDICT && dp->procs.ranks > 1)
        TRY(dp_gather_rows(dp, out, batch->count));
    return CH_OK;
}

ch_status ch_dp_predict(ch_dp *dp, ch_tensor *out, const ch_batch *batch)
{
    if (!dp || !batch || !out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_predict: %s is NULL",
                         !dp ? "dp" : !batch ? "batch" : "out");
    TRY(check_batch(dp, batch, "ch_dp_predict", 0));
    if (ch_tensor_dtype(out) != CH_F32 || ch_tensor_ndim(out) < 1 ||
        ch_tensor_dim(out, 0) != batch->count)
        return chi_error(CH_ERR_SHAPE, "ch_dp_predict: out must be f32 with %d rows (one per "
                         "sample), it is %s with %lld", batch->count,
                         ch_dtype_name(ch_tensor_dtype(out)),
                         (long long)(ch_tensor_ndim(out) ? ch_tensor_dim(out, 0) : 0));
    if (dp->el.on)
        return dp_elastic_infer(dp, out, NULL, NULL, batch);
    return dp_predict_now(dp, out, batch);
}

ch_status dp_predict_now(ch_dp *dp, ch_tensor *out, const ch_batch *batch)
{
    if (dp->tr.micro > 0)
        return chi_error(CH_ERR_STATE,
                         "ch_dp_predict: %d micro-batches are accumulated; "
                         "call ch_dp_step or ch_dp_flush first",
                         dp->tr.micro);
    return infer_call(dp, JOB_PREDICT, batch, out);
}

ch_status ch_dp_evaluate(ch_dp *dp, float *loss, int64_t *correct, const ch_batch *batch)
{
    if (!dp || !batch)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_evaluate: %s is NULL",
                         !dp ? "dp" : "batch");
    TRY(check_batch(dp, batch, "ch_dp_evaluate", 1));
    if (dp->el.on)
        return dp_elastic_infer(dp, NULL, loss, correct, batch);
    return dp_evaluate_now(dp, loss, correct, batch);
}

ch_status dp_evaluate_now(ch_dp *dp, float *loss, int64_t *correct, const ch_batch *batch)
{
    if (dp->tr.micro > 0)
        return chi_error(CH_ERR_STATE,
                         "ch_dp_evaluate: %d micro-batches are accumulated; "
                         "call ch_dp_step or ch_dp_flush first",
                         dp->tr.micro);
    TRY(infer_call(dp, JOB_EVALUATE, batch, NULL));
    if (loss)
        *loss = (float)dp->call.eval_loss;
    if (correct)
        *correct = dp->call.eval_correct;
    return CH_OK;
}
