/* Data parallelism: replicas of one model, a persistent worker thread per
 * replica, the batch split by share, gradients weighted by share and reduced
 * through pinned host memory in a fixed order, one identical optimizer step
 * on every replica.
 *
 * A step runs in three phases separated by barriers that every worker
 * reaches whatever happened before, so a failure on one replica cannot leave
 * the others waiting: compute (forward, backward, gradients to host), reduce
 * (each worker sums its chunk of the gradient over all replicas in replica
 * order, so the result has the same bits on every run), update (the sum back
 * to the device, the optimizer). */
#include "config.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "nn.h"
#include <chorus/dp.h>

typedef struct replica {
    ch_dp *dp;
    int index;
    ch_device *dev;
    ch_stream *stream;
    ch_module *model;
    ch_loss *loss;
    ch_optimizer *opt;
    ch_tensor *x, *labels;
    ch_host_buffer *grads;    /* this replica's gradients, flat */
    pthread_t thread;
    int started;
    int start, count;         /* its slice of the batch */
    float loss_value;
    double seconds;           /* its last step */
    uint64_t checksum;        /* of its parameters, when checked */
    ch_status st;
    char error[1024];
} replica;

struct ch_dp {
    int n;
    replica *r;
    ch_dp_options o;
    float *weights;
    int64_t numel;            /* all parameters */
    float *sum;               /* the reduced gradient */
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    pthread_barrier_t barrier;
    int64_t generation;       /* bumped for every step */
    int finished;
    int quit;
    atomic_int failed;
    const ch_batch *batch;
    float lr;
    int64_t step;
    int fail_replica;         /* test hook: this replica fails its next step */
};

/* ---- Phases run by each worker --------------------------------------------------- */

static ch_status fail(replica *r, ch_status st)
{
    if (st != CH_OK && r->st == CH_OK) {
        r->st = st;
        snprintf(r->error, sizeof r->error, "replica %d on %s: %s", r->index,
                 ch_device_id(r->dev), ch_last_error());
        atomic_store(&r->dp->failed, 1);
    }
    return st;
}

static ch_status batch_tensors(replica *r)
{
    const ch_dp_options *o = &r->dp->o;
    if (r->x && ch_tensor_dim(r->x, 0) == r->count)
        return CH_OK;
    ch_tensor_free(r->x);
    ch_tensor_free(r->labels);
    r->x = r->labels = NULL;
    int64_t xs[CH_MAX_DIMS], ls[1] = {r->count};
    xs[0] = r->count;
    for (int i = 0; i < o->sample_ndim; i++)
        xs[i + 1] = o->sample_shape[i];
    TRY(ch_tensor_new(&r->x, r->dev, CH_F32, o->sample_ndim + 1, xs));
    return ch_tensor_new(&r->labels, r->dev, CH_I32, 1, ls);
}

/* Gradients into the pinned buffer, parameter after parameter. */
static ch_status grads_to_host(replica *r)
{
    size_t off = 0;
    int np = ch_module_param_count(r->model);
    for (int i = 0; i < np; i++) {
        ch_tensor *g;
        TRY(ch_module_param(r->model, i, NULL, NULL, &g));
        TRY(ch_tensor_download_async(g, r->grads, off));
        off += ch_tensor_nbytes(g);
    }
    return ch_stream_sync(r->stream);
}

static ch_status compute(replica *r)
{
    ch_dp *dp = r->dp;
    const ch_batch *b = dp->batch;
    if (r->count == 0) {
        memset(ch_host_buffer_data(r->grads), 0, (size_t)dp->numel * sizeof(float));
        r->loss_value = 0.0f;
        return CH_OK;
    }
    size_t sample = ch_host_buffer_size(b->images) / (size_t)b->count;
    ch_tensor *y, *lv, *dy;
    TRY(batch_tensors(r));
    if (dp->fail_replica == r->index)
        return chi_error(CH_ERR_INTERNAL, "failure injected by a test");
    TRY(ch_tensor_upload_async(r->x, b->images, (size_t)r->start * sample));
    TRY(ch_tensor_upload_async(r->labels, b->labels, (size_t)r->start * sizeof(int32_t)));
    TRY(ch_module_zero_grad(r->model));
    /* Dropout draws by the sample's position in the batch, whatever the split. */
    ch_module_set_rng(r->model, dp->o.seed, dp->step, r->start);
    TRY(ch_module_forward(r->model, &y, r->x));
    TRY(ch_loss_forward(r->loss, &lv, y, r->labels));
    /* Each replica's mean loss weighted by its share: the shares' gradients
     * add up to the gradient of the whole batch's mean. */
    TRY(ch_loss_backward(r->loss, &dy, (float)r->count / (float)b->count));
    TRY(ch_module_backward(r->model, NULL, dy));
    TRY(ch_tensor_download(lv, &r->loss_value, sizeof r->loss_value));
    /* One replica holds the whole gradient already: nothing to reduce. */
    return dp->n > 1 ? grads_to_host(r) : CH_OK;
}

/* Sum elements [lo, hi) over the replicas, always in replica order. */
static void reduce_chunk(replica *r)
{
    ch_dp *dp = r->dp;
    int64_t per = (dp->numel + dp->n - 1) / dp->n;
    int64_t lo = per * r->index, hi = lo + per < dp->numel ? lo + per : dp->numel;
    if (lo >= hi)
        return;
    const float *first = ch_host_buffer_data(dp->r[0].grads);
    memcpy(dp->sum + lo, first + lo, (size_t)(hi - lo) * sizeof(float));
    for (int k = 1; k < dp->n; k++) {
        const float *g = ch_host_buffer_data(dp->r[k].grads);
        for (int64_t i = lo; i < hi; i++)
            dp->sum[i] += g[i];
    }
}

/* FNV-1a over the bits of every parameter: replicas that took the same
 * steps hold the same bits. */
static ch_status param_checksum(replica *r)
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

static ch_status update(replica *r)
{
    ch_dp *dp = r->dp;
    size_t off = 0;
    int np = dp->n > 1 ? ch_module_param_count(r->model) : 0;
    for (int i = 0; i < np; i++) {
        ch_tensor *g;
        TRY(ch_module_param(r->model, i, NULL, NULL, &g));
        TRY(ch_tensor_upload(g, (const char *)dp->sum + off, ch_tensor_nbytes(g)));
        off += ch_tensor_nbytes(g);
    }
    TRY(ch_optimizer_step(r->opt, dp->lr));
    return ch_stream_sync(r->stream);
}

/* ---- The workers ----------------------------------------------------------------- */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void run_step(replica *r)
{
    ch_dp *dp = r->dp;
    double t0 = now();
    r->st = CH_OK;
    r->error[0] = '\0';
    ch_clear_error();
    fail(r, compute(r));
    pthread_barrier_wait(&dp->barrier);
    if (!atomic_load(&dp->failed) && dp->n > 1)
        reduce_chunk(r);
    pthread_barrier_wait(&dp->barrier);
    if (!atomic_load(&dp->failed))
        fail(r, update(r));
    if (!atomic_load(&dp->failed) && dp->o.check_every > 0 &&
        (dp->step + 1) % dp->o.check_every == 0)
        fail(r, param_checksum(r));
    r->seconds = now() - t0;
}

static void *worker(void *arg)
{
    replica *r = arg;
    ch_dp *dp = r->dp;
    int64_t seen = 0;
    /* Ops of this thread on this device go to the replica's own stream. */
    ch_stream_set_current(r->stream);
    pthread_mutex_lock(&dp->lock);
    for (;;) {
        while (!dp->quit && dp->generation == seen)
            pthread_cond_wait(&dp->go, &dp->lock);
        if (dp->quit)
            break;
        seen = dp->generation;
        pthread_mutex_unlock(&dp->lock);
        run_step(r);
        pthread_mutex_lock(&dp->lock);
        if (++dp->finished == dp->n)
            pthread_cond_signal(&dp->done);
    }
    pthread_mutex_unlock(&dp->lock);
    return NULL;
}

/* ---- Setting up ----------------------------------------------------------------- */

static ch_status check_options(const ch_dp_options *o, int n)
{
    if (o->reduce != CH_DP_REDUCE_HOST)
        return chi_error(CH_ERR_UNSUPPORTED, "ch_dp_new: options->reduce %d is not supported "
                         "(CH_DP_REDUCE_HOST)", (int)o->reduce);
    if (o->check_every < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->check_every is %d, "
                         "expected >= 0", o->check_every);
    if (o->sample_ndim < 1 || o->sample_ndim > CH_MAX_DIMS - 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->sample_ndim is %d, "
                         "expected 1 to %d", o->sample_ndim, CH_MAX_DIMS - 1);
    for (int i = 0; o->weights && i < n; i++)
        if (!(o->weights[i] > 0.0f) || o->weights[i] > 1e30f)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->weights[%d] is %g, "
                             "expected a positive number", i, o->weights[i]);
    return CH_OK;
}

static ch_status make_replica(ch_dp *dp, int i, const ch_module *model, ch_device *dev)
{
    replica *r = &dp->r[i];
    r->dp = dp;
    r->index = i;
    r->dev = dev;
    TRY(ch_stream_new(&r->stream, dev));
    TRY(ch_module_clone(&r->model, model, dev));
    TRY(ch_loss_new(&r->loss, dp->o.loss));
    TRY(ch_optimizer_new(&r->opt, r->model, &dp->o.optimizer));
    return ch_host_buffer_new(&r->grads, dev, (size_t)dp->numel * sizeof(float));
}

static ch_status start_workers(ch_dp *dp)
{
    for (int i = 0; i < dp->n; i++) {
        int e = pthread_create(&dp->r[i].thread, NULL, worker, &dp->r[i]);
        if (e != 0)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: pthread_create: %s", strerror(e));
        dp->r[i].started = 1;
    }
    return CH_OK;
}

ch_status ch_dp_new(ch_dp **out, const ch_module *model, ch_device *const *devices, int n,
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
    ch_dp *dp = calloc(1, sizeof *dp);
    if (!dp)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    dp->n = n;
    dp->o = *options;
    dp->fail_replica = -1;
    dp->numel = ch_module_param_numel(model);
    dp->r = calloc((size_t)n, sizeof *dp->r);
    dp->weights = calloc((size_t)n, sizeof *dp->weights);
    dp->sum = malloc((size_t)(dp->numel ? dp->numel : 1) * sizeof(float));
    pthread_mutex_init(&dp->lock, NULL);
    pthread_cond_init(&dp->go, NULL);
    pthread_cond_init(&dp->done, NULL);
    pthread_barrier_init(&dp->barrier, NULL, (unsigned)n);
    ch_status st = dp->r && dp->weights && dp->sum
                       ? CH_OK
                       : chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    for (int i = 0; st == CH_OK && i < n; i++) {
        dp->weights[i] = options->weights ? options->weights[i] : 1.0f;
        st = make_replica(dp, i, model, devices[i]);
    }
    dp->o.weights = NULL; /* the caller's array may go away: ours is dp->weights */
    if (st == CH_OK)
        st = start_workers(dp);
    if (st != CH_OK) {
        ch_dp_free(dp);
        return st;
    }
    *out = dp;
    return CH_OK;
}

void ch_dp_free(ch_dp *dp)
{
    if (!dp)
        return;
    pthread_mutex_lock(&dp->lock);
    dp->quit = 1;
    pthread_cond_broadcast(&dp->go);
    pthread_mutex_unlock(&dp->lock);
    for (int i = 0; dp->r && i < dp->n; i++) {
        replica *r = &dp->r[i];
        if (r->started)
            pthread_join(r->thread, NULL);
        ch_tensor_free(r->x);
        ch_tensor_free(r->labels);
        ch_host_buffer_free(r->grads);
        ch_optimizer_free(r->opt);
        ch_loss_free(r->loss);
        ch_module_free(r->model);
        ch_stream_free(r->stream);
    }
    pthread_barrier_destroy(&dp->barrier);
    pthread_cond_destroy(&dp->go);
    pthread_cond_destroy(&dp->done);
    pthread_mutex_destroy(&dp->lock);
    free(dp->r);
    free(dp->weights);
    free(dp->sum);
    free(dp);
}

/* ---- A step ---------------------------------------------------------------------- */

/* Shares in proportion to the weights; the rounding remainder goes to the
 * replicas in order, so the counts add up to the batch. */
static void split(ch_dp *dp, int total)
{
    double wsum = 0;
    for (int i = 0; i < dp->n; i++)
        wsum += dp->weights[i];
    int given = 0;
    for (int i = 0; i < dp->n; i++) {
        dp->r[i].count = (int)((double)total * dp->weights[i] / wsum);
        given += dp->r[i].count;
    }
    for (int i = 0; given < total; i = (i + 1) % dp->n, given++)
        dp->r[i].count++;
    int start = 0;
    for (int i = 0; i < dp->n; i++) {
        dp->r[i].start = start;
        start += dp->r[i].count;
    }
}

ch_status ch_dp_step(ch_dp *dp, const ch_batch *batch, float lr, float *loss)
{
    if (!dp || !batch || !loss)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_step: %s is NULL",
                         !dp ? "dp" : !batch ? "batch" : "loss");
    if (batch->count < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_step: the batch has %d samples",
                         batch->count);
    split(dp, batch->count);
    pthread_mutex_lock(&dp->lock);
    dp->batch = batch;
    dp->lr = lr;
    dp->finished = 0;
    atomic_store(&dp->failed, 0);
    dp->generation++;
    pthread_cond_broadcast(&dp->go);
    while (dp->finished < dp->n)
        pthread_cond_wait(&dp->done, &dp->lock);
    pthread_mutex_unlock(&dp->lock);
    dp->step++;
    dp->fail_replica = -1;
    double total = 0;
    for (int i = 0; i < dp->n; i++) {
        replica *r = &dp->r[i];
        if (r->st != CH_OK)
            return chi_error(r->st, "ch_dp_step: %s", r->error);
        total += (double)r->loss_value * r->count / batch->count;
    }
    int checked = dp->o.check_every > 0 && dp->step % dp->o.check_every == 0;
    for (int i = 1; checked && i < dp->n; i++)
        if (dp->r[i].checksum != dp->r[0].checksum)
            return chi_error(CH_ERR_INTERNAL, "ch_dp_step: replica %d on %s holds other "
                             "parameters than replica 0 after step %lld (checksum %016llx, "
                             "want %016llx)", i, ch_device_id(dp->r[i].dev),
                             (long long)dp->step, (unsigned long long)dp->r[i].checksum,
                             (unsigned long long)dp->r[0].checksum);
    *loss = (float)total;
    return CH_OK;
}

ch_status ch_dp_last_step(const ch_dp *dp, int *counts, double *seconds, int n)
{
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

ch_optimizer *ch_dp_optimizer(const ch_dp *dp, int index)
{
    return dp && index >= 0 && index < dp->n ? dp->r[index].opt : NULL;
}

ch_module *ch_dp_replica(const ch_dp *dp, int index)
{
    return dp && index >= 0 && index < dp->n ? dp->r[index].model : NULL;
}

ch_status ch_dp_sync_to(const ch_dp *dp, ch_module *model)
{
    if (!dp || !model)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_sync_to: %s is NULL",
                         !dp ? "dp" : "model");
    const ch_module *src = dp->r[0].model;
    int np = ch_module_param_count(src);
    if (ch_module_param_count(model) != np)
        return chi_error(CH_ERR_SHAPE, "ch_dp_sync_to: model has %d parameters, the replicas "
                         "%d", ch_module_param_count(model), np);
    for (int i = 0; i < np; i++) {
        ch_tensor *a, *b;
        TRY(ch_module_param(src, i, NULL, &a, NULL));
        TRY(ch_module_param(model, i, NULL, &b, NULL));
        TRY(ch_copy(b, a));
    }
    return CH_OK;
}

void chi_dp_fail_next(ch_dp *dp, int replica)
{
    if (dp)
        dp->fail_replica = replica;
}
