/* Data parallelism (nn/dp.c): what each replica's worker thread does in
 * a call, and the calling thread's side of handing a call to the workers.
 *
 * A training call runs in phases separated by a barrier that every worker
 * reaches whatever happened before (train()), so a failure on one replica
 * cannot leave the others waiting. A call returns with every replica's
 * stream drained (run_call). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_impl.h"

static ch_status fail(replica *r, ch_status st)
{
    if (st != CH_OK && r->st == CH_OK) {
        r->st = st;
        snprintf(r->error, sizeof r->error, "replica %d on %s: %s", r->index, ch_device_id(r->dev),
                 ch_last_error());
        ch_dp *dp = r->dp;
        pthread_mutex_lock(&dp->w.lock);
        atomic_store(&dp->w.failed, 1);
        pthread_cond_broadcast(&dp->red.posted);
        pthread_cond_broadcast(&dp->bn.exchanged);
        pthread_mutex_unlock(&dp->w.lock);
    }
    return st;
}

int64_t dp_labels_per_sample(const ch_dp *dp)
{
    return dp->o.labels_per_sample > 1 ? dp->o.labels_per_sample : 1;
}

/* Input and label tensors of `rows` samples. */
static ch_status batch_tensors(replica *r, int rows, int labels)
{
    const ch_dp_options *o = &r->dp->o;
    if (!r->x || ch_tensor_dim(r->x, 0) != rows) {
        ch_tensor_free(r->x);
        r->x = NULL;
        int64_t xs[CH_MAX_DIMS];
        xs[0] = rows;
        for (int i = 0; i < o->sample_ndim; i++)
            xs[i + 1] = o->sample_shape[i];
        TRY(ch_tensor_new(&r->x, r->dev, o->sample_dtype, o->sample_ndim + 1, xs));
    }
    int64_t per = dp_labels_per_sample(r->dp);
    if (labels && (!r->labels || ch_tensor_dim(r->labels, 0) != rows)) {
        ch_tensor_free(r->labels);
        r->labels = NULL;
        int64_t ls[2] = {rows, per};
        TRY(ch_tensor_new(&r->labels, r->dev, CH_I32, per > 1 ? 2 : 1, ls));
    }
    return CH_OK;
}

/* Bytes of one input sample. */
size_t dp_sample_bytes(const ch_dp *dp)
{
    size_t bytes = ch_dtype_size(dp->o.sample_dtype);
    for (int i = 0; i < dp->o.sample_ndim; i++)
        bytes *= (size_t)dp->o.sample_shape[i];
    return bytes;
}

size_t dp_label_bytes(const ch_dp *dp)
{
    return sizeof(int32_t) * (size_t)dp_labels_per_sample(dp);
}

/* Samples [first, first + rows) of the batch to the device. */
static ch_status upload_rows(replica *r, int first, int rows, int labels)
{
    const ch_batch *b = r->dp->call.batch;
    /* Not the buffer's size over the count: a short last batch comes in a
     * buffer made for a full one. */
    size_t sample = dp_sample_bytes(r->dp);
    TRY(batch_tensors(r, rows, labels));
    dp_mark_here(r, PH_UPLOAD, 0, 0);
    TRY(ch_tensor_upload_async(r->x, b->images, (size_t)first * sample));
    if (labels)
        TRY(ch_tensor_upload_async(r->labels, b->labels, (size_t)first * dp_label_bytes(r->dp)));
    dp_mark_here(r, PH_UPLOAD, 1, 0);
    return CH_OK;
}

/* Forward, loss, backward on samples [first, first + rows) of the
 * replica's slice; the gradient adds to what is there. *loss gets their
 * mean loss. */
static ch_status pass(replica *r, int first, int rows, float *loss)
{
    ch_dp *dp = r->dp;
    const ch_batch *b = dp->call.batch;
    TRY(upload_rows(r, r->start + first, rows, 1));
    ch_tensor *y, *lv, *dy;
    /* Dropout draws by the optimizer step (restored with a checkpoint) and
     * the sample's position in the batch (in the whole accumulation),
     * whatever the split and the micro-batches. */
    ch_module_set_rng(r->model, dp->o.seed, ch_optimizer_steps(r->opt),
                      dp->tr.micro_samples + r->start + first);
    dp_mark_here(r, PH_FORWARD, 0, 0);
    TRY(dp_lose_here(r->dev, DP_AT_FORWARD, dp->tr.step + 1));
    TRY(ch_module_forward(r->model, &y, r->x));
    dp_mark_here(r, PH_FORWARD, 1, 0);
    dp_mark_here(r, PH_LOSS, 0, 0);
    /* Each pass's mean loss weighted by its share of the batch: the
     * gradients add up to the gradient of the whole batch's mean. Where
     * the model's backward does not read its output, the gradient takes
     * its place (one [N, C] tensor instead of three). */
    float scale = dp->call.loss_scale * (float)rows / (float)b->count;
    if (nn_output_spare(r->model)) {
        TRY(ch_loss_forward_backward(r->loss, &lv, &dy, y, r->labels, scale));
    } else {
        TRY(ch_loss_forward(r->loss, &lv, y, r->labels));
        TRY(ch_loss_backward(r->loss, &dy, scale));
    }
    dp_mark_here(r, PH_LOSS, 1, 0);
    dp_mark_here(r, PH_BACKWARD, 0, 0);
    TRY(dp_lose_here(r->dev, DP_AT_BACKWARD, dp->tr.step + 1));
    TRY(ch_module_backward(r->model, NULL, dy));
    dp_mark_here(r, PH_BACKWARD, 1, 0);
    /* Waits for backward: the marks so far have their times. */
    double w0 = r->trace.on ? ch_clock_seconds() : 0.0;
    TRY(ch_tensor_download(lv, loss, sizeof *loss));
    dp_trace_wait(r, "wait for the device (the loss)", w0);
    return CH_OK;
}

/* Micro-batches sized by memory: after the first passes of 1 and 2
 * samples under the device's limit, the bytes a sample adds (the peaks'
 * difference) and those a pass takes whatever its size; the size that
 * fits what the limit leaves, with the optimizer's state still to come
 * and a tenth to spare. */
/* Bytes the optimizer's state will take when it is not made yet (the
 * allocator rounds a block up by a quarter at most). */
static uint64_t state_to_come(const replica *r)
{
    int made = 0;
    int64_t state = nn_optimizer_state_bytes(r->opt, &made);
    return made ? 0 : (uint64_t)state + (uint64_t)state / 4;
}

static void size_passes(replica *r, uint64_t base, uint64_t peak1, uint64_t peak2)
{
    uint64_t one = peak1 > base ? peak1 - base : 1;
    uint64_t per = peak2 > peak1 ? peak2 - peak1 : one;
    r->mb.per_sample = per;
    r->mb.fixed = one > per ? one - per : 0;
    uint64_t used = base + state_to_come(r) + r->mb.fixed;
    double room = r->mb.limit > used ? 0.9 * (double)(r->mb.limit - used) : 0.0;
    double size = room / (double)per;
    r->mb.size = size >= 1.0 ? (size > 1e9 ? 1000000000 : (int)size) : 1;
}

/* A pass of `rows` from `first`, its peak measured when `peak` is not
 * NULL; the first pass under a limit failing for want of memory marks the
 * replica too small. */
static ch_status measured_pass(replica *r, int first, int rows, float *loss, uint64_t *peak)
{
    if (peak)
        (void)ch_device_reset_peak(r->dev);
    ch_status st = pass(r, first, rows, loss);
    if (st == CH_ERR_DEVICE_OUT_OF_MEMORY && first == 0 && r->mb.limit > 0 && r->mb.size == 0)
        r->mb.too_small = 1;
    if (st == CH_OK && peak) {
        ch_memory_stats ms;
        st = ch_stream_sync(r->stream);
        if (st == CH_OK)
            st = ch_device_memory_stats(r->dev, &ms);
        *peak = st == CH_OK ? ms.peak_bytes : 0;
    }
    return st;
}

/* Forward, loss, backward on this replica's slice, in micro-batches that
 * fit its device's limit; the gradient adds to what earlier calls'
 * micro-batches left. Only the last pass posts the buckets. */
static ch_status compute(replica *r)
{
    ch_dp *dp = r->dp;
    for (int b = 0; dp->tr.micro == 0 && b < dp->bk.count; b++)
        TRY(ch_fill(r->bk.grads[b], 0.0));
    r->loss_value = 0.0f;
    r->mb.count = 0;
    r->mb.last = r->count;
    if (r->count == 0)
        return CH_OK;
    TRY(dp_injected(dp, r->index));
    int posting = r->bk.posting, probing = r->mb.limit > 0 && r->mb.size == 0;
    uint64_t base = 0, peak1 = 0, peak2 = 0;
    if (probing) {
        ch_memory_stats ms;
        TRY(ch_stream_sync(r->stream));
        TRY(ch_device_memory_stats(r->dev, &ms));
        base = ms.in_use_bytes;
    }
    double sum = 0.0;
    int done = 0;
    while (done < r->count) {
        int rest = r->count - done;
        int rows = r->mb.limit == 0 ? rest : probing ? (done == 0 ? 1 : 2) : r->mb.size;
        rows = rows < rest ? rows : rest;
        r->bk.posting = posting && rows == rest;
        float loss = 0.0f;
        uint64_t *peak = !probing ? NULL : done == 0 ? &peak1 : &peak2;
        ch_status st = measured_pass(r, done, rows, &loss, peak);
        r->bk.posting = posting;
        TRY(st);
        sum += (double)loss * rows;
        done += rows;
        r->mb.count++;
        /* Sized after the passes of 1 and 2 (or all there was), or after
         * the first alone when a pass of 2 would not fit by its measure. */
        uint64_t two = base + 2 * (peak1 > base ? peak1 - base : 0) + state_to_come(r);
        if (probing && (done == 3 || done == r->count ||
                        (done == 1 && (double)two > 0.9 * (double)r->mb.limit))) {
            size_passes(r, base, peak1, done == 3 ? peak2 : peak1);
            probing = 0;
        }
    }
    r->loss_value = (float)(sum / r->count);
    dp_trace_compute_done(r);
    return CH_OK;
}

/* FNV-1a over the bits of every parameter: replicas that took the same
 * steps hold the same bits. */
ch_status dp_param_checksum(replica *r)
{
    uint64_t h = 0xcbf29ce484222325ull;
    int np = ch_module_param_count(r->model);
    float *buf = NULL;
    size_t cap = 0;
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < np; i++) {
        ch_tensor *p;
        st = ch_module_param(r->model, i, NULL, &p, NULL);
        size_t bytes = st == CH_OK ? ch_tensor_nbytes(p) : 0;
        if (st == CH_OK && bytes > cap) {
            float *grown = realloc(buf, bytes);
            if (!grown) {
                st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_step: out of memory");
                break;
            }
            buf = grown;
            cap = bytes;
        }
        if (st == CH_OK)
            st = ch_tensor_download(p, buf, bytes);
        for (size_t k = 0; st == CH_OK && k < bytes; k++)
            h = (h ^ ((const unsigned char *)buf)[k]) * 0x100000001b3ull;
    }
    free(buf);
    r->checksum = h;
    return st;
}

/* fp16: whether every reduced gradient is finite, through each bucket's
 * sum (an infinity or a NaN anywhere makes it one), the sums side by side
 * and read back in one download. The buckets hold the same bits on every
 * replica of the job, so every replica decides alike. */
static ch_status grads_finite(replica *r, int *finite)
{
    ch_dp *dp = r->dp;
    int64_t nb = dp->bk.count;
    *finite = 1;
    if (!r->fp16.finite_host) {
        r->fp16.finite_host = malloc(sizeof(float) * (size_t)nb);
        if (!r->fp16.finite_host)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_step: out of memory");
    }
    if (!r->fp16.finite)
        TRY(ch_tensor_new(&r->fp16.finite, r->dev, CH_F32, 1, &nb));
    ch_status st = CH_OK;
    for (int b = 0; st == CH_OK && b < dp->bk.count; b++) {
        ch_tensor *slot = NULL;
        st = ch_tensor_view(&slot, r->fp16.finite, b, 1);
        if (st == CH_OK)
            st = ch_sum(slot, r->bk.grads[b], 0);
        ch_tensor_free(slot);
    }
    if (st == CH_OK)
        st = ch_tensor_download(r->fp16.finite, r->fp16.finite_host, sizeof(float) * (size_t)nb);
    for (int64_t b = 0; st == CH_OK && b < nb; b++)
        *finite = *finite && isfinite(r->fp16.finite_host[b]);
    return st;
}

/* What an update needs that can fail for want of memory, before the
 * barrier: the mean over the micro-batches and fp16's loss scale undone,
 * fp16's overflow check, the optimizer's state made. When one replica
 * fails here, none updates. */
static ch_status pre_update(replica *r)
{
    ch_dp *dp = r->dp;
    float unscale = dp->call.grad_rescale / dp->tr.scaler;
    for (int b = 0; unscale != 1.0f && b < dp->bk.count; b++)
        TRY(ch_scale(r->bk.grads[b], r->bk.grads[b], unscale));
    r->fp16.overflow = 0;
    if (dp->o.precision == CH_F16) {
        int finite;
        TRY(grads_finite(r, &finite));
        r->fp16.overflow = !finite;
        if (r->fp16.overflow)
            return CH_OK; /* skipped: parameters and optimizer untouched */
    }
    ch_status st = nn_optimizer_prepare(r->opt);
    if (st == CH_ERR_DEVICE_OUT_OF_MEMORY) {
        int made = 0;
        double mib = (double)nn_optimizer_state_bytes(r->opt, &made) / 1048576.0;
        return chi_error(st, "the optimizer's state (%.1f MiB) does not fit: %s%s", mib,
                         ch_last_error(),
                         r->dp->sh.on ? ""
                                      : "; a sharded optimizer "
                                        "(shard_optimizer) keeps a part of it on each replica");
    }
    return st;
}

/* After the barrier: the update itself, the same on every replica. */
static ch_status update(replica *r)
{
    if (r->fp16.overflow)
        return CH_OK;
    TRY(dp_injected_update(r->dp, r->index));
    TRY(dp_lose_here(r->dev, DP_AT_UPDATE, r->dp->tr.step + 1));
    return ch_optimizer_step(r->opt, r->dp->call.lr);
}

/* fp16, after an update: GradScaler's rule for the next step's scale. */
void dp_rescale(ch_dp *dp)
{
    if (dp->o.precision != CH_F16)
        return;
    int overflow = 0;
    for (int i = 0; i < dp->n; i++)
        overflow |= dp->r[i].fp16.overflow;
    if (overflow) {
        dp->tr.scaler *= 0.5f;
        dp->tr.scaler_clean = 0;
        dp->tr.skipped++;
        return;
    }
    int interval = dp->o.loss_scale_interval > 0 ? dp->o.loss_scale_interval : 2000;
    if (++dp->tr.scaler_clean >= interval) {
        float grown = dp->tr.scaler * 2.0f;
        if (isfinite(grown))
            dp->tr.scaler = grown;
        dp->tr.scaler_clean = 0;
    }
}

/* The workers' barrier: every worker of the call waits there for the
 * others; w.bar_failed then says whether the call had failed when it
 * opened. Once broken (a call given up for a replica that stopped
 * answering, nn/dp_watchdog.c) it returns at once, as failed. */
static void barrier_wait(ch_dp *dp)
{
    pthread_mutex_lock(&dp->w.lock);
    if (dp->w.broken) {
        dp->w.bar_failed = 1;
    } else {
        int64_t gen = dp->w.bar_gen;
        if (++dp->w.bar_count == dp->n) {
            dp->w.bar_count = 0;
            dp->w.bar_failed = atomic_load(&dp->w.failed) != 0;
            dp->w.bar_gen++;
            pthread_cond_broadcast(&dp->w.bar);
        } else {
            while (gen == dp->w.bar_gen && !dp->w.broken)
                pthread_cond_wait(&dp->w.bar, &dp->w.lock);
            if (gen == dp->w.bar_gen)
                dp->w.bar_failed = 1; /* broken while waiting */
        }
    }
    pthread_mutex_unlock(&dp->w.lock);
}

/* The sharded optimizer, after the updates: every replica takes the
 * others' parts (nn/dp_shard.c). Every worker of a call whose reduction
 * completed comes here, whatever failed since, so that all of them meet
 * at the barriers; across processes, every process exchanges. */
static void gather(replica *r)
{
    ch_dp *dp = r->dp;
    double w0 = r->trace.on ? ch_clock_seconds() : 0.0;
    barrier_wait(dp);
    dp_trace_wait(r, "wait for the others' parts", w0);
    /* Every update of this process is over: w.failed holds still. */
    if (r->index == 0) {
        int failed = atomic_load(&dp->w.failed) != 0, other = 0;
        ch_status st = r->fp16.overflow ? CH_OK : dp_shard_exchange(dp, failed, &other);
        if (st == CH_OK && other)
            st = chi_error(CH_ERR_REMOTE, "another process of the job failed to update its "
                                          "part of the parameters");
        if (st != CH_OK) {
            atomic_store(&dp->w.parted, 1);
            fail(r, st);
        }
    }
    w0 = r->trace.on ? ch_clock_seconds() : 0.0;
    barrier_wait(dp);
    dp_trace_wait(r, "wait for the others' parts", w0);
    if (!atomic_load(&dp->w.failed) && !r->fp16.overflow && !r->mb.out) {
        ch_status st = dp_shard_fetch(r);
        if (st != CH_OK)
            atomic_store(&dp->w.parted, 1);
        fail(r, st);
    }
}

static void train(replica *r)
{
    ch_dp *dp = r->dp;
    int reducing = dp->call.sync && dp->threaded;
    double t0 = r->t_start;
    if (reducing)
        for (int b = 0; b < dp->bk.count; b++)
            r->bk.missing[b] = dp->bk.list[b].p_hi - dp->bk.list[b].p_lo;
    r->bk.posting = reducing;
    r->bn.wait = 0.0;
    /* A failure of this process's own (not one heard from another). */
    ch_status st = dp->call.batch ? fail(r, compute(r)) : CH_OK;
    if (st != CH_OK && st != CH_ERR_REMOTE)
        dp_flag_exchange(dp);
    r->compute_end = ch_clock_seconds();
    /* The balancer wants each replica's own work: waiting for the others
     * at BatchNorm's exchanges would make every replica look as slow as
     * the slowest. */
    r->compute_seconds = r->compute_end - t0 - r->bn.wait;
    r->bk.posting = 0;
    if (reducing) {
        if (r->st == CH_OK)
            fail(r, dp_post_rest(r));
        double w0 = r->trace.on ? ch_clock_seconds() : 0.0;
        dp_wait_reduced(dp);
        dp_trace_wait(r, "wait for the reduction", w0);
    }
    r->t_update = dp->call.sync ? ch_clock_seconds() : 0.0;
    /* A replica left out takes no part in updates from then on. */
    int updating = dp->call.sync && !r->mb.out;
    if (updating && !atomic_load(&dp->w.failed)) {
        dp_mark_here(r, PH_UPDATE, 0, 0);
        fail(r, pre_update(r));
    }
    /* Whether the update goes ahead: decided when the last replica came
     * to the barrier (a replica failing inside its update must not stop
     * the others': the update is all or nothing over the replicas left). */
    int go = !atomic_load(&dp->w.failed);
    if (dp->threaded) {
        double w0 = r->trace.on ? ch_clock_seconds() : 0.0;
        barrier_wait(dp);
        go = !dp->w.bar_failed;
        dp_trace_wait(r, "wait for the others", w0);
    }
    int updated = 0;
    if (updating && go) {
        /* Past the barrier nothing allocates; a device failing now may
         * leave this replica's parameters apart from the others'. */
        ch_status st = update(r);
        if (st == CH_OK && dp->sh.on && !r->fp16.overflow)
            st = dp_shard_publish(r);
        if (st != CH_OK)
            atomic_store(&dp->w.parted, 1);
        fail(r, st);
        updated = 1;
        r->updated = st == CH_OK;
    }
    if (dp->call.sync && dp->sh.on && dp->red.complete)
        gather(r);
    if (updated)
        dp_mark_here(r, PH_UPDATE, 1, 0);
    if (updating && !atomic_load(&dp->w.failed) && dp->o.check_every > 0 &&
        (dp->tr.step + 1) % dp->o.check_every == 0)
        fail(r, dp_param_checksum(r));
}

/* Evaluation mode on this replica's slice: its outputs into the rows of
 * dp->call.out, or its loss and number of correct answers. */
/* Evaluation mode on rows [first, first + rows) of the replica's slice:
 * their outputs into dp->call.out, or their mean loss into *loss and their
 * right answers added to r->correct. */
static ch_status infer_rows(replica *r, int first, int rows, float *loss)
{
    ch_dp *dp = r->dp;
    const ch_batch *b = dp->call.batch;
    int evaluate = dp->call.job == JOB_EVALUATE;
    TRY(upload_rows(r, r->start + first, rows, evaluate));
    ch_tensor *y;
    ch_module_train(r->model, 0);
    ch_status st = ch_module_forward(r->model, &y, r->x);
    ch_module_train(r->model, 1);
    TRY(st);
    if (!evaluate) {
        ch_tensor *out = NULL;
        TRY(ch_tensor_view(&out, dp->call.out, r->start + first, rows));
        /* A mixed-precision model's half output widened to out's f32. */
        st = ch_tensor_dtype(y) == ch_tensor_dtype(out) ? ch_copy(out, y) : ch_cast(out, y);
        ch_tensor_free(out);
        /* A peer copy runs on the other device's stream, but this one
         * waits for it (lib/tensor.c): run_call drains this one only. */
        return st;
    }
    ch_tensor *lv;
    TRY(ch_loss_forward(r->loss, &lv, y, r->labels));
    TRY(ch_tensor_download(lv, loss, sizeof *loss));
    int64_t per = dp_labels_per_sample(dp), n = (int64_t)rows * per;
    TRY(nn_ensure(&r->pred, r->dev, CH_I32, 1, &n));
    if (ch_tensor_dtype(y) != CH_F32) { /* half logits: argmax on them widened */
        int64_t shape[CH_MAX_DIMS];
        nn_shape(y, shape);
        TRY(nn_ensure(&r->wide, r->dev, CH_F32, ch_tensor_ndim(y), shape));
        TRY(ch_cast(r->wide, y));
        y = r->wide;
    }
    TRY(ch_argmax(r->pred, y, 1));
    if (n > r->pred_cap) {
        int32_t *grown = realloc(r->pred_host, (size_t)n * sizeof *grown);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_evaluate: out of memory");
        r->pred_host = grown;
        r->pred_cap = n;
    }
    TRY(ch_tensor_download(r->pred, r->pred_host, (size_t)n * sizeof(int32_t)));
    const int32_t *truth =
        (const int32_t *)ch_host_buffer_data(b->labels) + (int64_t)(r->start + first) * per;
    for (int64_t i = 0; i < n; i++)
        r->correct += r->pred_host[i] == truth[i];
    return CH_OK;
}

/* Evaluation mode on this replica's slice, under its device's limit in
 * micro-batches of the size training measured (1 before it has). */
static ch_status infer(replica *r)
{
    r->loss_value = 0.0f;
    r->correct = 0;
    if (r->count == 0)
        return CH_OK;
    TRY(dp_injected(r->dp, r->index));
    int size = r->mb.limit == 0 ? r->count : r->mb.size > 0 ? r->mb.size : 1;
    double sum = 0.0;
    for (int done = 0; done < r->count;) {
        int rows = r->count - done < size ? r->count - done : size;
        float loss = 0.0f;
        TRY(infer_rows(r, done, rows, &loss));
        sum += (double)loss * rows;
        done += rows;
    }
    r->loss_value = (float)(sum / r->count);
    return CH_OK;
}

/* A call returns with the replica's stream drained, after a failure too:
 * the caller may then refill or free the batch's pinned buffers (the
 * loader does once a batch is released), which an upload may still read,
 * and use the results on any stream. */
static void run_call(replica *r)
{
    r->st = CH_OK;
    r->error[0] = '\0';
    r->updated = 0;
    ch_clear_error();
    double t0 = ch_clock_seconds();
    r->t_start = t0;
    int job = r->dp->call.job;
    if (job == JOB_TRAIN) {
        dp_trace_begin(r);
        train(r);
    } else {
        fail(r, infer(r));
    }
    double w0 = job == JOB_TRAIN && r->trace.on ? ch_clock_seconds() : 0.0;
    fail(r, ch_stream_sync(r->stream));
    if (job == JOB_TRAIN)
        dp_trace_wait(r, "wait for the device", w0);
    r->t_end = ch_clock_seconds();
    r->seconds = r->t_end - t0;
    if (job == JOB_TRAIN)
        dp_trace_replica_end(r);
    if (r->dp->call.job != JOB_TRAIN)
        r->compute_seconds = r->seconds;
}

void *dp_worker(void *arg)
{
    replica *r = arg;
    ch_dp *dp = r->dp;
    int64_t seen = 0;
    /* Near the device's memory; a failure to bind only costs speed. */
    if (!dp->o.no_bind)
        r->bound = ch_device_bind_thread(r->dev) == CH_OK;
    /* Ops of this thread on this device go to the replica's own stream. */
    ch_stream_set_current(r->stream);
    pthread_mutex_lock(&dp->w.lock);
    /* Ready: ch_dp_new waits for every worker to get here. */
    if (++dp->w.finished == dp->n)
        pthread_cond_signal(&dp->w.done);
    while (dp_next_call(dp, &dp->w.generation, &seen)) {
        pthread_mutex_unlock(&dp->w.lock);
        run_call(r);
        pthread_mutex_lock(&dp->w.lock);
        r->busy = 0;
        if (++dp->w.finished == dp->n)
            pthread_cond_signal(&dp->w.done);
    }
    pthread_mutex_unlock(&dp->w.lock);
    dp_thread_exit(dp, &r->exited);
    return NULL;
}

/* Run the call set up in dp on every replica and wait for all of them. */
void dp_run_all(ch_dp *dp)
{
    if (!dp->threaded) {
        /* The calling thread does the work, on the replica's stream. */
        replica *r = &dp->r[0];
        ch_stream *prev = NULL;
        ch_status got = ch_stream_get_current(&prev, r->dev);
        ch_stream_set_current(r->stream);
        run_call(r);
        if (got == CH_OK && prev)
            ch_stream_set_current(prev);
        return;
    }
    pthread_mutex_lock(&dp->w.lock);
    dp->w.finished = 0;
    atomic_store(&dp->w.failed, 0);
    dp->red.done = 0;
    dp->bn.active = 0;
    dp->bn.arrived = 0;
    dp->bn.leader = -1;
    dp->bn.flagged = 0;
    dp->bn.done = 0;
    for (int i = 0; i < dp->n; i++) {
        if (dp->r[i].count > 0 && dp->bn.leader < 0)
            dp->bn.leader = i;
        dp->bn.active += dp->r[i].count > 0;
    }
    dp->red.start = 0.0;
    dp->red.end = 0.0;
    dp->red.complete = 0;
    dp->red.st = CH_OK;
    if (dp->call.job == JOB_TRAIN && dp->call.sync) {
        for (int b = 0; b < dp->bk.count; b++)
            dp->bk.posted[b] = 0;
        dp->red.generation++;
    }
    for (int i = 0; i < dp->n; i++)
        dp->r[i].busy = 1;
    dp->w.generation++;
    pthread_cond_broadcast(&dp->w.go);
    if (dp->el.handle)
        dp_wait_call(dp);
    while (dp->w.finished < dp->n && !dp->w.broken)
        pthread_cond_wait(&dp->w.done, &dp->w.lock);
    pthread_mutex_unlock(&dp->w.lock);
}
