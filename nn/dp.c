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
 * when backward has produced a bucket's gradients, the worker records an
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
 * drained its streams (the update comes after wait_reduced); every call
 * returns with each replica's stream drained (run_call). */
#include "config.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist.h"
#include "nn.h"
#include "split.h"
#include <chorus/dp.h>

#define DEFAULT_BUCKET_BYTES ((size_t)25 << 20)

typedef enum job { JOB_TRAIN, JOB_PREDICT, JOB_EVALUATE } job;

/* What a process tells the others at the end of every call (across
 * processes): its status, its share of the loss and of the right answers,
 * replica 0's checksum, and its replicas' compute seconds (the automatic
 * split), `nmax` of them after the fixed part. */
typedef struct report {
    int32_t st;
    int32_t checked;
    double loss;              /* sum over its replicas of mean loss x samples */
    int64_t correct;
    uint64_t checksum;
    char error[400];
} report;

typedef struct bucket {
    int p_lo, p_hi;           /* parameters [p_lo, p_hi) */
    int64_t count;            /* their elements */
} bucket;

typedef struct replica {
    ch_dp *dp;
    int index;
    ch_device *dev;
    ch_stream *stream;        /* forward, backward, the optimizer */
    ch_stream *comm;          /* the reducer's work on this replica */
    ch_module *model;
    ch_loss *loss;
    ch_optimizer *opt;
    ch_tensor *x, *labels, *pred;
    int32_t *pred_host;       /* evaluation: the predictions, downloaded */
    int64_t pred_cap;
    ch_tensor **grads;        /* per bucket: its gradients; the parameters' are views */
    ch_event **ready;         /* per bucket: its gradients are complete */
    int *missing;             /* per bucket: parameters still to come, -1 once posted */
    int posting;              /* this backward posts buckets */
    pthread_t thread;
    int started, bound;
    int start, count;         /* its slice of the batch */
    float loss_value;
    int64_t correct;
    double seconds, compute_seconds;
    double compute_end;       /* when its forward and backward ended */
    double xwait;             /* of its compute, seconds spent waiting for the
                                 other replicas' BatchNorm sums */
    uint64_t checksum;
    int overflow;             /* fp16: its reduced gradients were not finite */
    ch_tensor *finite;        /* fp16: each bucket's sum, for the check */
    float *finite_host;       /* fp16: the sums read back */
    float *xbuf;              /* BatchNorm's sums, exchanged through the host */
    double *xsum;
    int64_t xcap;
    ch_status st;
    char error[1024];
} replica;

struct ch_dp {
    int n;
    replica *r;
    ch_dp_options o;
    nn_split split;           /* the batch's shares (nn/split.h) */
    int64_t numel;            /* all parameters */
    bucket *buckets;
    int nbuckets;
    int *param_bucket;        /* parameter index -> bucket */
    ch_reducer *reducer;      /* n > 1 */
    ch_tensor **reduce_bufs;  /* [n] the reducer thread's view of a bucket */
    pthread_t reducer_thread;
    int reducer_started;

    pthread_mutex_t lock;
    pthread_cond_t go, done, posted;
    pthread_cond_t exchanged;  /* BatchNorm's sums: a round of the exchange ended */
    int x_active;             /* replicas with samples in this call: they exchange */
    int x_arrived;
    int64_t x_round;
    pthread_barrier_t barrier;
    int64_t generation;       /* bumped for every call the workers run */
    int64_t reduce_generation; /* bumped for every call the reducer runs */
    int finished;
    int quit;
    atomic_int failed;
    atomic_int parted;        /* a replica failed during its update */
    char parted_error[1200];  /* then every later call fails with this */

    /* the call in flight */
    job job;
    int sync;                 /* this call reduces and updates */
    int *posted_count;        /* per bucket: replicas that posted it */
    int reducer_done;
    double reduce_start;      /* when the first bucket's reduction began, 0: none */
    ch_status reduce_st;
    char reduce_error[1024];
    const ch_batch *batch;
    ch_tensor *out;           /* predict */
    float lr;
    float loss_scale;         /* the loss's gradient factor: scaler / accumulate */
    float scaler;             /* fp16's dynamic loss scale (1 otherwise) */
    int scaler_clean;         /* clean steps since it last changed */
    int64_t skipped;          /* steps skipped for an overflow */
    float grad_rescale;       /* flush: accumulate / micro-batches there are */

    int64_t step;             /* updates so far */
    int buffers_stale;        /* replicas 1.. hold older running statistics than 0 */
    int micro;                /* micro-batches accumulated since the last update */
    int64_t micro_samples;    /* their samples: the random stream's offset */

    /* Across processes (options.dist with two or more): this process's
     * replicas are replicas [first, first + n) of the job's nall, the
     * split is the job's. */
    ch_dist *dist;
    int ranks, rank;
    int threaded;             /* worker threads and a reducer: n > 1 or ranks > 1 */
    int nall, first, nmax;
    int *rank_n, *rank_first; /* [ranks] */
    nn_comm *ctl;             /* the calling thread's collectives */
    nn_comm *grad;            /* the reducer thread's */
    nn_comm *bn;              /* BatchNorm's exchanges (their leader replica's) */
    int x_leader;             /* the replica that exchanges for the process */
    int x_flagged;            /* this call's failure was told to the others */
    int x_done;               /* exchanges across processes in this call */
    int x_expected;           /* in a training call (-1 until one succeeded) */
    int64_t *x_counts;        /* [x_counts_cap] the values of each of them */
    int x_counts_cap;
    double *xtotal;           /* BatchNorm: the process's sums, then the job's */
    int64_t xtcap;
    size_t report_bytes;      /* sizeof(report) + nmax doubles */
    unsigned char *reports;   /* [ranks] reports, then this process's own */
    int ranks_stale;          /* ranks other than 0 hold other running statistics */
    int span_all;             /* every process's reducer can span processes (NCCL) */
    double eval_loss;         /* the last evaluation's, over the job */
    int64_t eval_correct;
#ifdef CHI_TEST_HOOKS
    int fail_replica;         /* this replica fails its next call */
    int fail_update;          /* this replica fails its next update, past the barrier */
    int fail_reduce;          /* the next reduction fails */
#endif
};

/* ---- Failures injected by tests ---------------------------------------------- */

/* Only in the copy of nn/ that tests link (tests/Makefile.mk): the
 * installed library has no hook. */
#ifdef CHI_TEST_HOOKS
static ch_status injected(const ch_dp *dp, int replica)
{
    int fails = replica < 0 ? dp->fail_reduce : dp->fail_replica == replica;
    return fails ? chi_error(CH_ERR_INTERNAL, "failure injected by a test") : CH_OK;
}

/* After a call: a replica's failure is for one call, the reducer's for one
 * step (reset once the step synchronises). */
static void injected_clear(ch_dp *dp, int step_done)
{
    dp->fail_replica = -1;
    if (step_done) {
        dp->fail_update = -1;
        dp->fail_reduce = 0;
    }
}

void chi_dp_fail_next(ch_dp *dp, int replica)
{
    if (dp)
        dp->fail_replica = replica;
}

void chi_dp_fail_update_next(ch_dp *dp, int replica)
{
    if (dp)
        dp->fail_update = replica;
}

static ch_status injected_update(const ch_dp *dp, int replica)
{
    return dp->fail_update == replica ? chi_error(CH_ERR_INTERNAL, "failure injected by a test")
                                      : CH_OK;
}

void chi_dp_fail_reduce_next(ch_dp *dp)
{
    if (dp)
        dp->fail_reduce = 1;
}
#else
#define injected(dp, replica) CH_OK
#define injected_clear(dp, step_done) ((void)0)
#define injected_update(dp, replica) CH_OK
#endif

/* ---- Helpers ------------------------------------------------------------------- */

static ch_status fail(replica *r, ch_status st)
{
    if (st != CH_OK && r->st == CH_OK) {
        r->st = st;
        snprintf(r->error, sizeof r->error, "replica %d on %s: %s", r->index,
                 ch_device_id(r->dev), ch_last_error());
        ch_dp *dp = r->dp;
        pthread_mutex_lock(&dp->lock);
        atomic_store(&dp->failed, 1);
        pthread_cond_broadcast(&dp->posted);
        pthread_cond_broadcast(&dp->exchanged);
        pthread_mutex_unlock(&dp->lock);
    }
    return st;
}

static int64_t labels_per_sample(const ch_dp *dp)
{
    return dp->o.labels_per_sample > 1 ? dp->o.labels_per_sample : 1;
}

static ch_status batch_tensors(replica *r, int labels)
{
    const ch_dp_options *o = &r->dp->o;
    if (!r->x || ch_tensor_dim(r->x, 0) != r->count) {
        ch_tensor_free(r->x);
        r->x = NULL;
        int64_t xs[CH_MAX_DIMS];
        xs[0] = r->count;
        for (int i = 0; i < o->sample_ndim; i++)
            xs[i + 1] = o->sample_shape[i];
        TRY(ch_tensor_new(&r->x, r->dev, o->sample_dtype, o->sample_ndim + 1, xs));
    }
    int64_t per = labels_per_sample(r->dp);
    if (labels && (!r->labels || ch_tensor_dim(r->labels, 0) != r->count)) {
        ch_tensor_free(r->labels);
        r->labels = NULL;
        int64_t ls[2] = {r->count, per};
        TRY(ch_tensor_new(&r->labels, r->dev, CH_I32, per > 1 ? 2 : 1, ls));
    }
    return CH_OK;
}

/* Bytes of one input sample. */
static size_t sample_bytes(const ch_dp *dp)
{
    size_t bytes = ch_dtype_size(dp->o.sample_dtype);
    for (int i = 0; i < dp->o.sample_ndim; i++)
        bytes *= (size_t)dp->o.sample_shape[i];
    return bytes;
}

static size_t label_bytes(const ch_dp *dp)
{
    return sizeof(int32_t) * (size_t)labels_per_sample(dp);
}

static ch_status upload_slice(replica *r, int labels)
{
    const ch_batch *b = r->dp->batch;
    /* Not the buffer's size over the count: a short last batch comes in a
     * buffer made for a full one. */
    size_t sample = sample_bytes(r->dp);
    TRY(batch_tensors(r, labels));
    TRY(ch_tensor_upload_async(r->x, b->images, (size_t)r->start * sample));
    if (labels)
        TRY(ch_tensor_upload_async(r->labels, b->labels, (size_t)r->start * label_bytes(r->dp)));
    return CH_OK;
}

/* ---- Buckets --------------------------------------------------------------------- */

/* Bucket b is complete on this replica: mark the point on its stream and
 * hand it to the reducer. */
static ch_status post(replica *r, int b)
{
    ch_dp *dp = r->dp;
    r->missing[b] = -1;
    TRY(ch_event_record(r->ready[b], r->stream));
    pthread_mutex_lock(&dp->lock);
    dp->posted_count[b]++;
    pthread_cond_broadcast(&dp->posted);
    pthread_mutex_unlock(&dp->lock);
    return CH_OK;
}

/* The model's hook: gradients of parameters [first, first + count) are done. */
static ch_status on_grads(void *user, int first, int count)
{
    replica *r = user;
    if (!r->posting)
        return CH_OK;
    for (int p = first; p < first + count; p++) {
        int b = r->dp->param_bucket[p];
        if (r->missing[b] > 0 && --r->missing[b] == 0)
            TRY(post(r, b));
    }
    return CH_OK;
}

static ch_status post_rest(replica *r)
{
    for (int b = 0; b < r->dp->nbuckets; b++)
        if (r->missing[b] >= 0)
            TRY(post(r, b));
    return CH_OK;
}

/* Buckets of about bucket_bytes from the last parameter backwards: the
 * order backward produces the gradients in. */
static ch_status make_buckets(ch_dp *dp, const ch_module *model)
{
    int np = ch_module_param_count(model);
    size_t limit = dp->o.bucket_bytes ? dp->o.bucket_bytes : DEFAULT_BUCKET_BYTES;
    int64_t *offs = calloc((size_t)np + 1, sizeof *offs);
    dp->param_bucket = calloc((size_t)(np ? np : 1), sizeof *dp->param_bucket);
    dp->buckets = calloc((size_t)(np ? np : 1), sizeof *dp->buckets);
    if (!offs || !dp->param_bucket || !dp->buckets) {
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
        bucket *b = &dp->buckets[dp->nbuckets];
        *b = (bucket){lo, hi, offs[hi] - offs[lo]};
        for (int p = lo; p < hi; p++)
            dp->param_bucket[p] = dp->nbuckets;
        dp->nbuckets++;
        hi = lo;
    }
    free(offs);
    dp->posted_count = calloc((size_t)(dp->nbuckets ? dp->nbuckets : 1),
                              sizeof *dp->posted_count);
    return dp->posted_count ? CH_OK
                            : chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
}

/* With dp->lock held: wait for the next call (*generation moving past
 * *seen); 0 when the dp is shutting down instead. */
static int next_call(ch_dp *dp, const int64_t *generation, int64_t *seen)
{
    while (!dp->quit && *generation == *seen)
        pthread_cond_wait(&dp->go, &dp->lock);
    if (dp->quit)
        return 0;
    *seen = *generation;
    return 1;
}

/* ---- The reducer thread ------------------------------------------------------------ */

static ch_status reduce_bucket(ch_dp *dp, int b, ch_tensor **bufs)
{
    TRY(injected(dp, -1));
    for (int i = 0; i < dp->n; i++) {
        TRY(ch_event_wait(dp->r[i].comm, dp->r[i].ready[b]));
        bufs[i] = dp->r[i].grads[b];
    }
    return ch_reducer_allreduce(dp->reducer, bufs, 0, dp->buckets[b].count);
}

/* The reducer's stage across processes: the process's total of a bucket
 * becomes the job's (chorus/reduce.h). */
static ch_status sum_across(void *user, float *total, int64_t count)
{
    ch_dp *dp = user;
    return nn_comm_sum_f32(dp->grad, total, count, "reducing gradients across processes");
}

/* The same in bf16 (reduce_dtype bf16): half the bytes cross. */
static ch_status sum_across_bf16(void *user, uint16_t *total, int64_t count)
{
    ch_dp *dp = user;
    return nn_comm_sum_bf16(dp->grad, total, count, "reducing gradients across processes");
}

/* Across processes, before each bucket: whether every process is still
 * in the step. A process that failed says so once, at the bucket it was
 * to reduce next, and every process stops there: no process is left
 * waiting for a bucket that will never come. */
static ch_status all_in(ch_dp *dp, int failed)
{
    double flag = failed ? 1.0 : 0.0;
    TRY(nn_comm_sum_f64(dp->grad, &flag, 1, "reducing gradients across processes"));
    if (flag > 0.0 && !failed)
        return chi_error(CH_ERR_REMOTE, "another process of the job failed in this step");
    return CH_OK;
}

/* With dp->lock held: the reducer failed; the workers stop too. */
static void reducer_failed(ch_dp *dp, ch_status st)
{
    dp->reduce_st = st;
    snprintf(dp->reduce_error, sizeof dp->reduce_error, "reducing gradients (%s): %s",
             ch_reduce_mode_name(dp->o.reduce), ch_last_error());
    atomic_store(&dp->failed, 1);
}

static void *reducer_main(void *arg)
{
    ch_dp *dp = arg;
    int64_t seen = 0;
    ch_tensor **bufs = dp->reduce_bufs;
    pthread_mutex_lock(&dp->lock);
    while (next_call(dp, &dp->reduce_generation, &seen)) {
        for (int b = 0; b < dp->nbuckets; b++) {
            while (dp->posted_count[b] < dp->n && !atomic_load(&dp->failed))
                pthread_cond_wait(&dp->posted, &dp->lock);
            int failed = atomic_load(&dp->failed);
            if (dp->ranks > 1) {
                pthread_mutex_unlock(&dp->lock);
                ch_clear_error();
                ch_status st = all_in(dp, failed);
                pthread_mutex_lock(&dp->lock);
                if (st != CH_OK && !atomic_load(&dp->failed))
                    reducer_failed(dp, st);
                if (st != CH_OK)
                    break;
            }
            if (failed)
                break;
            pthread_mutex_unlock(&dp->lock);
            if (b == 0)
                dp->reduce_start = ch_clock_seconds();
            ch_clear_error();
            ch_status st = reduce_bucket(dp, b, bufs);
            pthread_mutex_lock(&dp->lock);
            if (st != CH_OK) {
                reducer_failed(dp, st);
                break;
            }
        }
        dp->reducer_done = 1;
        pthread_cond_broadcast(&dp->posted);
    }
    pthread_mutex_unlock(&dp->lock);
    return NULL;
}

static void wait_reduced(ch_dp *dp)
{
    pthread_mutex_lock(&dp->lock);
    while (!dp->reducer_done)
        pthread_cond_wait(&dp->posted, &dp->lock);
    pthread_mutex_unlock(&dp->lock);
}

/* ---- BatchNorm's statistics over the replicas ------------------------------------
 * Every replica with samples in the call deposits its sums in host memory,
 * waits for the others, and adds all deposits in replica order, so every
 * replica gets the same bits; a second wait keeps the deposits until all
 * have read them. A failing replica wakes the others (fail()). */

/* With dp->lock held: wait until every active replica has arrived. */
static ch_status rendezvous(ch_dp *dp)
{
    int64_t round = dp->x_round;
    if (++dp->x_arrived == dp->x_active) {
        dp->x_arrived = 0;
        dp->x_round++;
        pthread_cond_broadcast(&dp->exchanged);
    }
    while (dp->x_round == round && !atomic_load(&dp->failed))
        pthread_cond_wait(&dp->exchanged, &dp->lock);
    if (dp->x_round == round)
        return chi_error(CH_ERR_STATE, "BatchNorm statistics: another replica failed");
    return CH_OK;
}

/* Across processes, on the leader replica, between the two rendezvous:
 * the process's sums (every active replica's deposit, in replica order)
 * summed over the processes, and a flag that a process failed. A leader
 * whose process failed before the exchange still takes part, with the
 * flag, so that the other processes stop here instead of waiting. */
static ch_status exchange_across(ch_dp *dp, int64_t n, int failed)
{
    if (n + 1 > dp->xtcap) {
        double *grown = realloc(dp->xtotal, (size_t)(n + 1) * sizeof *grown);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "BatchNorm statistics: out of memory");
        dp->xtotal = grown;
        dp->xtcap = n + 1;
    }
    for (int64_t k = 0; k < n; k++)
        dp->xtotal[k] = 0.0;
    for (int i = 0; !failed && i < dp->n; i++) {
        const replica *o = &dp->r[i];
        for (int64_t k = 0; o->count > 0 && k < n; k++)
            dp->xtotal[k] += o->xbuf[k];
    }
    dp->xtotal[n] = failed ? 1.0 : 0.0;
    if (dp->x_done >= dp->x_counts_cap) {
        int cap = dp->x_counts_cap ? 2 * dp->x_counts_cap : 16;
        int64_t *grown = realloc(dp->x_counts, (size_t)cap * sizeof *grown);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "BatchNorm statistics: out of memory");
        dp->x_counts = grown;
        dp->x_counts_cap = cap;
    }
    dp->x_counts[dp->x_done++] = n;
    TRY(nn_comm_sum_f64(dp->bn, dp->xtotal, n + 1, "BatchNorm statistics across processes"));
    if (dp->xtotal[n] > 0.0 && !failed) {
        /* The process that failed has told everyone: nothing to flag. */
        pthread_mutex_lock(&dp->lock);
        dp->x_flagged = 1;
        pthread_mutex_unlock(&dp->lock);
        return chi_error(CH_ERR_REMOTE, "BatchNorm statistics: another process of the job "
                         "failed in this step");
    }
    return CH_OK;
}

static ch_status exchange_sums(void *user, ch_tensor *t)
{
    replica *r = user;
    ch_dp *dp = r->dp;
    int64_t n = ch_tensor_numel(t);
    if (n > r->xcap) {
        float *b = realloc(r->xbuf, (size_t)n * sizeof *b);
        if (b)
            r->xbuf = b;
        double *d = b ? realloc(r->xsum, (size_t)n * sizeof *d) : NULL;
        if (d)
            r->xsum = d;
        if (!b || !d)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "BatchNorm statistics: out of memory");
        r->xcap = n;
    }
    TRY(ch_tensor_download(t, r->xbuf, (size_t)n * sizeof(float)));
    double w0 = ch_clock_seconds();
    pthread_mutex_lock(&dp->lock);
    ch_status st = rendezvous(dp);
    pthread_mutex_unlock(&dp->lock);
    r->xwait += ch_clock_seconds() - w0;
    /* Across processes the leader exchanges; after a failure here, the
     * first replica to see it exchanges the flag instead. */
    int across = 0;
    if (dp->ranks > 1) {
        pthread_mutex_lock(&dp->lock);
        if (st == CH_OK)
            across = r->index == dp->x_leader;
        else if (!dp->x_flagged)
            across = dp->x_flagged = 1;
        pthread_mutex_unlock(&dp->lock);
    }
    if (across) {
        char why[512] = "";
        if (st != CH_OK)
            snprintf(why, sizeof why, "%s", ch_last_error());
        ch_status got = exchange_across(dp, n, st != CH_OK);
        if (st != CH_OK)
            return chi_error(st, "%s", why);
        TRY(got);
    }
    TRY(st);
    if (dp->ranks == 1) {
        for (int64_t k = 0; k < n; k++)
            r->xsum[k] = 0.0;
        for (int i = 0; i < dp->n; i++) {
            const replica *o = &dp->r[i];
            for (int64_t k = 0; o->count > 0 && k < n; k++)
                r->xsum[k] += o->xbuf[k];
        }
    }
    w0 = ch_clock_seconds();
    pthread_mutex_lock(&dp->lock);
    st = rendezvous(dp);
    pthread_mutex_unlock(&dp->lock);
    r->xwait += ch_clock_seconds() - w0;
    TRY(st);
    /* The job's total, which the leader wrote before the second rendezvous. */
    const double *total = dp->ranks > 1 ? dp->xtotal : r->xsum;
    for (int64_t k = 0; k < n; k++)
        r->xbuf[k] = (float)total[k];
    return ch_tensor_upload(t, r->xbuf, (size_t)n * sizeof(float));
}

/* Replica 0's buffers (running statistics) into the others', after the
 * call drained every replica's stream. Training reads them only to move
 * them (replica 0's are the ones kept), so this waits until an evaluation
 * or a copy out needs them. */
static ch_status broadcast_buffers(ch_dp *dp)
{
    if (!dp->buffers_stale)
        return CH_OK;
    int nb = ch_module_buffer_count(dp->r[0].model);
    for (int i = 1; i < dp->n; i++) {
        for (int k = 0; k < nb; k++) {
            ch_tensor *src, *dst;
            int64_t *csrc, *cdst;
            TRY(ch_module_buffer(dp->r[0].model, k, NULL, &src, &csrc));
            TRY(ch_module_buffer(dp->r[i].model, k, NULL, &dst, &cdst));
            if (src)
                TRY(ch_copy(dst, src));
            else
                *cdst = *csrc;
        }
        if (nb > 0)
            TRY(ch_device_sync(dp->r[i].dev));
    }
    dp->buffers_stale = 0;
    return CH_OK;
}

/* ---- What each worker does --------------------------------------------------------- */

/* Forward, loss, backward on this replica's slice; the gradient adds to
 * what earlier micro-batches left. */
static ch_status compute(replica *r)
{
    ch_dp *dp = r->dp;
    const ch_batch *b = dp->batch;
    for (int b = 0; dp->micro == 0 && b < dp->nbuckets; b++)
        TRY(ch_fill(r->grads[b], 0.0));
    r->loss_value = 0.0f;
    if (r->count == 0)
        return CH_OK;
    TRY(upload_slice(r, 1));
    TRY(injected(dp, r->index));
    ch_tensor *y, *lv, *dy;
    /* Dropout draws by the optimizer step (restored with a checkpoint) and
     * the sample's position in the batch (in the whole accumulation),
     * whatever the split. */
    ch_module_set_rng(r->model, dp->o.seed, ch_optimizer_steps(r->opt),
                      dp->micro_samples + r->start);
    TRY(ch_module_forward(r->model, &y, r->x));
    TRY(ch_loss_forward(r->loss, &lv, y, r->labels));
    /* Each replica's mean loss weighted by its share: the shares' gradients
     * add up to the gradient of the whole batch's mean. */
    TRY(ch_loss_backward(r->loss, &dy,
                         dp->loss_scale * (float)r->count / (float)b->count));
    TRY(ch_module_backward(r->model, NULL, dy));
    return ch_tensor_download(lv, &r->loss_value, sizeof r->loss_value);
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

/* fp16: whether every reduced gradient is finite, through each bucket's
 * sum (an infinity or a NaN anywhere makes it one), the sums side by side
 * and read back in one download. The buckets hold the same bits on every
 * replica of the job, so every replica decides alike. */
static ch_status grads_finite(replica *r, int *finite)
{
    ch_dp *dp = r->dp;
    int64_t nb = dp->nbuckets;
    *finite = 1;
    if (!r->finite_host) {
        r->finite_host = malloc(sizeof(float) * (size_t)nb);
        if (!r->finite_host)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_step: out of memory");
    }
    if (!r->finite)
        TRY(ch_tensor_new(&r->finite, r->dev, CH_F32, 1, &nb));
    ch_status st = CH_OK;
    for (int b = 0; st == CH_OK && b < dp->nbuckets; b++) {
        ch_tensor *slot = NULL;
        st = ch_tensor_view(&slot, r->finite, b, 1);
        if (st == CH_OK)
            st = ch_sum(slot, r->grads[b], 0);
        ch_tensor_free(slot);
    }
    if (st == CH_OK)
        st = ch_tensor_download(r->finite, r->finite_host, sizeof(float) * (size_t)nb);
    for (int64_t b = 0; st == CH_OK && b < nb; b++)
        *finite = *finite && isfinite(r->finite_host[b]);
    return st;
}

/* What an update needs that can fail for want of memory, before the
 * barrier: the mean over the micro-batches and fp16's loss scale undone,
 * fp16's overflow check, the optimizer's state made. When one replica
 * fails here, none updates. */
static ch_status pre_update(replica *r)
{
    ch_dp *dp = r->dp;
    float unscale = dp->grad_rescale / dp->scaler;
    for (int b = 0; unscale != 1.0f && b < dp->nbuckets; b++)
        TRY(ch_scale(r->grads[b], r->grads[b], unscale));
    r->overflow = 0;
    if (dp->o.precision == CH_F16) {
        int finite;
        TRY(grads_finite(r, &finite));
        r->overflow = !finite;
        if (r->overflow)
            return CH_OK; /* skipped: parameters and optimizer untouched */
    }
    return nn_optimizer_prepare(r->opt);
}

/* After the barrier: the update itself, the same on every replica. */
static ch_status update(replica *r)
{
    if (r->overflow)
        return CH_OK;
    TRY(injected_update(r->dp, r->index));
    return ch_optimizer_step(r->opt, r->dp->lr);
}

/* fp16, after an update: GradScaler's rule for the next step's scale. */
static void rescale(ch_dp *dp)
{
    if (dp->o.precision != CH_F16)
        return;
    int overflow = 0;
    for (int i = 0; i < dp->n; i++)
        overflow |= dp->r[i].overflow;
    if (overflow) {
        dp->scaler *= 0.5f;
        dp->scaler_clean = 0;
        dp->skipped++;
        return;
    }
    int interval = dp->o.loss_scale_interval > 0 ? dp->o.loss_scale_interval : 2000;
    if (++dp->scaler_clean >= interval) {
        float grown = dp->scaler * 2.0f;
        if (isfinite(grown))
            dp->scaler = grown;
        dp->scaler_clean = 0;
    }
}

/* Across processes, after this replica failed in its forward or
 * backward: when the other processes may be waiting in one of BatchNorm's
 * exchanges that this process will now never reach (fewer exchanges done
 * than a training call makes), the next one is made with the flag that
 * this process failed, so that they stop there. Once per call; the
 * exchange's size is the one the last good call had at that point. */
static void flag_exchange(ch_dp *dp)
{
    if (dp->ranks == 1)
        return;
    pthread_mutex_lock(&dp->lock);
    int k = dp->x_done, go = !dp->x_flagged && k < dp->x_expected;
    if (go)
        dp->x_flagged = 1;
    pthread_mutex_unlock(&dp->lock);
    if (!go)
        return;
    int64_t n = dp->x_counts[k];
    double *flag = calloc((size_t)n + 1, sizeof *flag);
    if (!flag)
        return; /* the others' watchdog ends it */
    flag[n] = 1.0;
    /* The replica's message is kept already (fail()); a failure here
     * leaves the others to their watchdog. */
    (void)nn_comm_sum_f64(dp->bn, flag, n + 1, "BatchNorm statistics across processes");
    free(flag);
}

static void train(replica *r)
{
    ch_dp *dp = r->dp;
    int reducing = dp->sync && dp->threaded;
    double t0 = ch_clock_seconds();
    if (reducing)
        for (int b = 0; b < dp->nbuckets; b++)
            r->missing[b] = dp->buckets[b].p_hi - dp->buckets[b].p_lo;
    r->posting = reducing;
    r->xwait = 0.0;
    /* A failure of this process's own (not one heard from another). */
    ch_status st = dp->batch ? fail(r, compute(r)) : CH_OK;
    if (st != CH_OK && st != CH_ERR_REMOTE)
        flag_exchange(dp);
    r->compute_end = ch_clock_seconds();
    /* The balancer wants each replica's own work: waiting for the others
     * at BatchNorm's exchanges would make every replica look as slow as
     * the slowest. */
    r->compute_seconds = r->compute_end - t0 - r->xwait;
    r->posting = 0;
    if (reducing) {
        if (r->st == CH_OK)
            fail(r, post_rest(r));
        wait_reduced(dp);
    }
    if (dp->sync && !atomic_load(&dp->failed))
        fail(r, pre_update(r));
    if (dp->threaded)
        pthread_barrier_wait(&dp->barrier);
    if (dp->sync && !atomic_load(&dp->failed)) {
        /* Past the barrier nothing allocates; a device failing now may
         * leave this replica's parameters apart from the others'. */
        ch_status st = update(r);
        if (st != CH_OK)
            atomic_store(&dp->parted, 1);
        fail(r, st);
    }
    if (dp->sync && !atomic_load(&dp->failed) && dp->o.check_every > 0 &&
        (dp->step + 1) % dp->o.check_every == 0)
        fail(r, param_checksum(r));
}

/* Evaluation mode on this replica's slice: its outputs into the rows of
 * dp->out, or its loss and number of correct answers. */
static ch_status infer(replica *r)
{
    ch_dp *dp = r->dp;
    const ch_batch *b = dp->batch;
    r->loss_value = 0.0f;
    r->correct = 0;
    if (r->count == 0)
        return CH_OK;
    int evaluate = dp->job == JOB_EVALUATE;
    TRY(upload_slice(r, evaluate));
    TRY(injected(dp, r->index));
    ch_tensor *y;
    ch_module_train(r->model, 0);
    ch_status st = ch_module_forward(r->model, &y, r->x);
    ch_module_train(r->model, 1);
    TRY(st);
    if (!evaluate) {
        ch_tensor *rows = NULL;
        TRY(ch_tensor_view(&rows, dp->out, r->start, r->count));
        st = ch_copy(rows, y);
        ch_tensor_free(rows);
        /* A peer copy runs on the other device's stream, but this one
         * waits for it (lib/tensor.c): run_call drains this one only. */
        return st;
    }
    ch_tensor *lv;
    TRY(ch_loss_forward(r->loss, &lv, y, r->labels));
    TRY(ch_tensor_download(lv, &r->loss_value, sizeof r->loss_value));
    int64_t per = labels_per_sample(dp), rows = r->count * per;
    TRY(nn_ensure(&r->pred, r->dev, CH_I32, 1, &rows));
    TRY(ch_argmax(r->pred, y, 1));
    if (rows > r->pred_cap) {
        int32_t *grown = realloc(r->pred_host, (size_t)rows * sizeof *grown);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_evaluate: out of memory");
        r->pred_host = grown;
        r->pred_cap = rows;
    }
    TRY(ch_tensor_download(r->pred, r->pred_host, (size_t)rows * sizeof(int32_t)));
    const int32_t *truth = (const int32_t *)ch_host_buffer_data(b->labels) + r->start * per;
    for (int64_t i = 0; i < rows; i++)
        r->correct += r->pred_host[i] == truth[i];
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
    ch_clear_error();
    double t0 = ch_clock_seconds();
    if (r->dp->job == JOB_TRAIN)
        train(r);
    else
        fail(r, infer(r));
    fail(r, ch_stream_sync(r->stream));
    r->seconds = ch_clock_seconds() - t0;
    if (r->dp->job != JOB_TRAIN)
        r->compute_seconds = r->seconds;
}

static void *worker(void *arg)
{
    replica *r = arg;
    ch_dp *dp = r->dp;
    int64_t seen = 0;
    /* Near the device's memory; a failure to bind only costs speed. */
    if (!dp->o.no_bind)
        r->bound = ch_device_bind_thread(r->dev) == CH_OK;
    /* Ops of this thread on this device go to the replica's own stream. */
    ch_stream_set_current(r->stream);
    pthread_mutex_lock(&dp->lock);
    /* Ready: ch_dp_new waits for every worker to get here. */
    if (++dp->finished == dp->n)
        pthread_cond_signal(&dp->done);
    while (next_call(dp, &dp->generation, &seen)) {
        pthread_mutex_unlock(&dp->lock);
        run_call(r);
        pthread_mutex_lock(&dp->lock);
        if (++dp->finished == dp->n)
            pthread_cond_signal(&dp->done);
    }
    pthread_mutex_unlock(&dp->lock);
    return NULL;
}

/* ---- Setting up ------------------------------------------------------------------ */

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
    if (o->loss_scale_interval < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: options->loss_scale_interval "
                         "is %d, expected >= 0 (0: 2000)", o->loss_scale_interval);
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
    r->grads = calloc((size_t)dp->nbuckets, sizeof *r->grads);
    if (!r->grads)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    for (int b = 0; b < dp->nbuckets; b++) {
        int64_t shape[1] = {dp->buckets[b].count};
        TRY(ch_tensor_new(&r->grads[b], dev, CH_F32, 1, shape));
        TRY(nn_grads_into(r->model, dp->buckets[b].p_lo,
                          dp->buckets[b].p_hi - dp->buckets[b].p_lo, r->grads[b]));
    }
    nn_set_grad_hook(r->model, on_grads, r);
    if (dp->threaded && !dp->o.batchnorm_local)
        nn_set_sync(r->model, exchange_sums, r);
    TRY(ch_loss_new(&r->loss, dp->o.loss));
    TRY(ch_optimizer_new(&r->opt, r->model, &dp->o.optimizer));
    r->ready = calloc((size_t)(dp->nbuckets ? dp->nbuckets : 1), sizeof *r->ready);
    r->missing = calloc((size_t)(dp->nbuckets ? dp->nbuckets : 1), sizeof *r->missing);
    if (!r->ready || !r->missing)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    for (int b = 0; b < dp->nbuckets; b++)
        TRY(ch_event_new(&r->ready[b], dev));
    return ch_device_sync(dev);
}

static ch_status start_threads(ch_dp *dp)
{
    /* One replica in one process: the calling thread runs it, nothing to
     * hand over. */
    if (!dp->threaded)
        return CH_OK;
    for (int i = 0; i < dp->n; i++) {
        int e = pthread_create(&dp->r[i].thread, NULL, worker, &dp->r[i]);
        if (e != 0)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: pthread_create: %s", strerror(e));
        dp->r[i].started = 1;
    }
    int e = pthread_create(&dp->reducer_thread, NULL, reducer_main, dp);
    if (e != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: pthread_create: %s", strerror(e));
    dp->reducer_started = 1;
    /* Every worker bound and waiting before the first call. */
    pthread_mutex_lock(&dp->lock);
    while (dp->finished < dp->n)
        pthread_cond_wait(&dp->done, &dp->lock);
    pthread_mutex_unlock(&dp->lock);
    return CH_OK;
}

static ch_status make_reducer(ch_dp *dp)
{
    if (!dp->threaded)
        return CH_OK;
    /* Made here, not by the thread: a thread that could not allocate would
     * fail every step to come. */
    dp->reduce_bufs = malloc((size_t)dp->n * sizeof *dp->reduce_bufs);
    ch_stream **comms = malloc((size_t)dp->n * sizeof *comms);
    if (!comms || !dp->reduce_bufs) {
        free(comms);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    for (int i = 0; i < dp->n; i++)
        comms[i] = dp->r[i].comm;
    int64_t largest = 0;
    for (int b = 0; b < dp->nbuckets; b++)
        if (dp->buckets[b].count > largest)
            largest = dp->buckets[b].count;
    ch_status st = ch_reducer_new(&dp->reducer, comms, dp->n, largest, dp->o.reduce);
    free(comms);
    if (st == CH_OK && dp->ranks > 1)
        st = ch_reducer_set_stage(dp->reducer, sum_across, dp);
    if (st == CH_OK && dp->ranks > 1)
        st = ch_reducer_set_stage_bf16(dp->reducer, sum_across_bf16, dp);
    if (st == CH_OK && dp->o.reduce_dtype == CH_BF16)
        st = ch_reducer_set_dtype(dp->reducer, CH_BF16);
    if (st != CH_OK)
        return chi_error(st, "ch_dp_new: %s", ch_last_error());
    return CH_OK;
}

static ch_status init_sync(ch_dp *dp, int n)
{
    if (pthread_mutex_init(&dp->lock, NULL) != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: pthread_mutex_init failed");
    if (pthread_cond_init(&dp->go, NULL) != 0 || pthread_cond_init(&dp->done, NULL) != 0 ||
        pthread_cond_init(&dp->posted, NULL) != 0 ||
        pthread_cond_init(&dp->exchanged, NULL) != 0 ||
        pthread_barrier_init(&dp->barrier, NULL, (unsigned)n) != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: cannot make the workers' "
                         "condition variables and barrier");
    return CH_OK;
}

static ch_status bcast_state(ch_dp *dp, int params, const char *what);

/* Across processes, what each process brings to ch_dp_new: its status so
 * far and what must agree for the processes' collectives to match. */
typedef struct joining {
    int32_t st, n;
    int64_t numel;
    int32_t nparams, nbuckets, nbuffers, split;
    int32_t accumulate, batchnorm_local, sample_dtype, sample_ndim;
    int32_t precision, loss_scale_interval, reduce_dtype;
    float loss_scale;
    int64_t sample_shape[CH_MAX_DIMS];
    int64_t labels_per_sample;
    uint64_t span_bytes;      /* ch_reducer_span_bytes: 0 when it cannot span */
    char error[400];
} joining;

/* The fields of `a` that differ from rank 0's `z`, as words for a message;
 * NULL when none. */
static const char *disagreement(const joining *a, const joining *z)
{
    if (a->numel != z->numel || a->nparams != z->nparams || a->nbuffers != z->nbuffers)
        return "the model (its parameters or buffers)";
    if (a->nbuckets != z->nbuckets)
        return "the buckets (options->bucket_bytes)";
    if (a->split != z->split)
        return "options->split";
    if (a->accumulate != z->accumulate)
        return "options->accumulate";
    if (a->batchnorm_local != z->batchnorm_local)
        return "options->batchnorm_local";
    if (a->precision != z->precision || a->loss_scale != z->loss_scale ||
        a->loss_scale_interval != z->loss_scale_interval || a->reduce_dtype != z->reduce_dtype)
        return "the precision (options->precision, loss_scale, loss_scale_interval or "
               "reduce_dtype)";
    if (a->sample_dtype != z->sample_dtype || a->sample_ndim != z->sample_ndim ||
        memcmp(a->sample_shape, z->sample_shape, sizeof a->sample_shape) != 0 ||
        a->labels_per_sample != z->labels_per_sample)
        return "the samples (options->sample_shape, sample_dtype or labels_per_sample)";
    return NULL;
}

/* Across processes, in ch_dp_new whatever happened before (`st`): every
 * process learns every other's replicas and weights, and fails when one
 * failed or brings another model or other options. */
static ch_status join(ch_dp *dp, ch_status st, const ch_dp_options *o, float **weights)
{
    char why[512] = "";
    if (st != CH_OK)
        snprintf(why, sizeof why, "%s", ch_last_error());
    joining mine = {.st = st, .n = dp->n};
    mine.numel = dp->numel;
    mine.nparams = dp->r[0].model ? ch_module_param_count(dp->r[0].model) : -1;
    mine.nbuffers = dp->r[0].model ? ch_module_buffer_count(dp->r[0].model) : -1;
    mine.nbuckets = dp->nbuckets;
    mine.split = o->split;
    mine.accumulate = o->accumulate > 1 ? o->accumulate : 1;
    mine.batchnorm_local = o->batchnorm_local != 0;
    mine.precision = o->precision;
    mine.loss_scale = o->loss_scale;
    mine.loss_scale_interval = o->loss_scale_interval;
    mine.reduce_dtype = o->reduce_dtype;
    mine.sample_dtype = o->sample_dtype;
    mine.sample_ndim = o->sample_ndim;
    memcpy(mine.sample_shape, o->sample_shape, sizeof mine.sample_shape);
    mine.labels_per_sample = o->labels_per_sample > 1 ? o->labels_per_sample : 1;
    mine.span_bytes = dp->reducer ? ch_reducer_span_bytes(dp->reducer) : 0;
    snprintf(mine.error, sizeof mine.error, "%s", why);
    joining *all = calloc((size_t)dp->ranks, sizeof *all);
    dp->rank_n = calloc((size_t)dp->ranks, sizeof *dp->rank_n);
    dp->rank_first = calloc((size_t)dp->ranks, sizeof *dp->rank_first);
    if (!all || !dp->rank_n || !dp->rank_first) {
        free(all);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    ch_status got = nn_comm_allgather(dp->ctl, &mine, all, sizeof mine,
                                      "ch_dp_new: joining the processes");
    if (st == CH_OK && got != CH_OK)
        st = got;
    for (int k = 0; st == CH_OK && k < dp->ranks; k++) {
        const char *what = disagreement(&all[k], &all[0]);
        if (all[k].st != CH_OK)
            st = chi_error((ch_status)all[k].st, "ch_dp_new: rank %d failed: %.400s", k,
                           all[k].error);
        else if (what)
            st = chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: rank %d brings other %s than "
                           "rank 0: every process must make its dp with the same model and "
                           "options", k, what);
    }
    if (st != CH_OK) {
        free(all);
        return why[0] && mine.st != CH_OK ? chi_error((ch_status)mine.st, "%s", why) : st;
    }
    dp->nall = 0;
    dp->nmax = 0;
    /* bf16 reduction goes through the host: no span (which sums f32). */
    dp->span_all = o->reduce_dtype == CH_F32;
    for (int k = 0; k < dp->ranks; k++)
        dp->span_all = dp->span_all && all[k].span_bytes > 0 &&
                       all[k].span_bytes == all[0].span_bytes;
    for (int k = 0; k < dp->ranks; k++) {
        dp->rank_first[k] = dp->nall;
        dp->rank_n[k] = all[k].n;
        dp->nall += all[k].n;
        if (all[k].n > dp->nmax)
            dp->nmax = all[k].n;
    }
    free(all);
    dp->first = dp->rank_first[dp->rank];
    dp->report_bytes = sizeof(report) + (size_t)dp->nmax * sizeof(double);
    dp->reports = calloc((size_t)dp->ranks + 1, dp->report_bytes);
    if (!dp->reports)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    if (o->split != CH_DP_SPLIT_WEIGHTS)
        return CH_OK;
    /* Every process's weights, in rank order. */
    float *padded = calloc((size_t)dp->nmax * (size_t)(dp->ranks + 1), sizeof *padded);
    *weights = calloc((size_t)dp->nall, sizeof **weights);
    if (!padded || !*weights) {
        free(padded);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    float *own = padded + (size_t)dp->nmax * (size_t)dp->ranks;
    memcpy(own, o->weights, (size_t)dp->n * sizeof *own);
    st = nn_comm_allgather(dp->ctl, own, padded, (size_t)dp->nmax * sizeof *own,
                           "ch_dp_new: the weights of every process");
    for (int k = 0; st == CH_OK && k < dp->ranks; k++)
        memcpy(*weights + dp->rank_first[k], padded + (size_t)k * (size_t)dp->nmax,
               (size_t)dp->rank_n[k] * sizeof **weights);
    free(padded);
    return st;
}

/* Across processes, after rank 0's state went to every process: replica
 * 0 of every process holds rank 0's bits. */
static ch_status check_same_start(ch_dp *dp)
{
    TRY(param_checksum(&dp->r[0]));
    uint64_t *all = calloc((size_t)dp->ranks, sizeof *all);
    if (!all)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    ch_status st = nn_comm_allgather(dp->ctl, &dp->r[0].checksum, all, sizeof *all,
                                     "ch_dp_new: the parameters' checksums");
    for (int k = 1; st == CH_OK && k < dp->ranks; k++)
        if (all[k] != all[0])
            st = chi_error(CH_ERR_INTERNAL, "ch_dp_new: rank %d holds other parameters than "
                           "rank 0 after the broadcast (checksum %016llx, want %016llx)", k,
                           (unsigned long long)all[k], (unsigned long long)all[0]);
    free(all);
    return st;
}

/* Across processes, when every replica of the job is a CUDA device (each
 * once) and the reduction may go device to device: one NCCL communicator
 * over all of them instead of the host stage. Rank 0 makes the id, MPI
 * carries it, every process joins; a failure anywhere fails ch_dp_new on
 * every process. */
static ch_status try_span(ch_dp *dp)
{
    if (dp->ranks == 1 || !dp->span_all)
        return CH_OK;
    struct {
        int32_t st;
        unsigned char id[512];
        char error[400];
    } msg;
    memset(&msg, 0, sizeof msg);
    if (ch_reducer_span_bytes(dp->reducer) > sizeof msg.id)
        return CH_OK; /* the same size on every process: all take the host stage */
    if (dp->rank == 0) {
        msg.st = ch_reducer_span_id(dp->reducer, msg.id);
        if (msg.st != CH_OK)
            snprintf(msg.error, sizeof msg.error, "%s", ch_last_error());
    }
    TRY(nn_comm_bcast(dp->ctl, &msg, sizeof msg, 0, "ch_dp_new: the NCCL id"));
    if (msg.st != CH_OK)
        return chi_error((ch_status)msg.st, "ch_dp_new: rank 0 could not make the id of a "
                         "communicator across processes: %.400s", msg.error);
    ch_status st = ch_reducer_span(dp->reducer, msg.id, dp->first, dp->nall);
    char why[400] = "";
    if (st != CH_OK)
        snprintf(why, sizeof why, "%s", ch_last_error());
    int32_t mine = (int32_t)st, *all = calloc((size_t)dp->ranks, sizeof *all);
    if (!all)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    ch_status got = nn_comm_allgather(dp->ctl, &mine, all, sizeof mine,
                                      "ch_dp_new: joining the communicator across processes");
    for (int k = 0; got == CH_OK && st == CH_OK && k < dp->ranks; k++)
        if (all[k] != CH_OK)
            st = chi_error((ch_status)all[k], "ch_dp_new: rank %d could not join the "
                           "communicator across processes", k);
    free(all);
    if (why[0])
        return chi_error(st, "ch_dp_new: %s", why);
    return got != CH_OK ? got : st;
}

/* Across processes: the communicators, made by every process in the same
 * order. */
static ch_status make_comms(ch_dp *dp)
{
    TRY(nn_comm_new(&dp->ctl, dp->dist));
    TRY(nn_comm_new(&dp->grad, dp->dist));
    return nn_comm_new(&dp->bn, dp->dist);
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
    ch_status st = init_sync(dp, n);
    if (st != CH_OK) {
        free(dp);
        return st;
    }
    dp->n = n;
    dp->o = *options;
    dp->o.weights = NULL; /* the caller's array may go away: the split has its own */
    dp->dist = options->dist;
    dp->ranks = ch_dist_size(dp->dist);
    dp->rank = ch_dist_rank(dp->dist);
    dp->threaded = n > 1 || dp->ranks > 1;
    dp->x_expected = -1;
    dp->nall = n;
    injected_clear(dp, 1);
    dp->grad_rescale = 1.0f;
    dp->scaler = options->precision != CH_F16 ? 1.0f
                 : options->loss_scale > 0.0f ? options->loss_scale
                                              : 65536.0f;
    dp->numel = ch_module_param_numel(model);
    dp->r = calloc((size_t)n, sizeof *dp->r);
    st = dp->r ? CH_OK : chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    /* Across processes the communicators come first, so that a process
     * that fails below still meets the others in join(). */
    int comms = 0;
    if (st == CH_OK && dp->ranks > 1) {
        st = make_comms(dp);
        comms = st == CH_OK;
    }
    if (st == CH_OK && dp->numel == 0)
        st = chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_new: the model has no parameters");
    if (st == CH_OK)
        st = make_buckets(dp, model);
    for (int i = 0; st == CH_OK && i < n; i++)
        st = make_replica(dp, i, model, devices[i]);
    if (st == CH_OK)
        st = make_reducer(dp);
    float *weights = NULL;
    if (comms) {
        st = join(dp, st, options, &weights);
    } else if (st == CH_OK) {
        dp->rank_n = calloc(1, sizeof *dp->rank_n);
        dp->rank_first = calloc(1, sizeof *dp->rank_first);
        if (!dp->rank_n || !dp->rank_first)
            st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
        else
            dp->rank_n[0] = n;
    }
    if (st == CH_OK) {
        st = nn_split_init(&dp->split, dp->nall, options->split,
                           weights ? weights : options->weights);
        if (st != CH_OK)
            st = chi_error(st, "ch_dp_new: %s", ch_last_error());
    }
    free(weights);
    if (st == CH_OK && dp->ranks > 1) {
        st = bcast_state(dp, 1, "ch_dp_new: rank 0's parameters and buffers");
        if (st == CH_OK)
            st = check_same_start(dp);
        if (st == CH_OK)
            st = try_span(dp);
    }
    if (st == CH_OK)
        st = start_threads(dp);
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
    if (dp->reducer_started)
        pthread_join(dp->reducer_thread, NULL);
    for (int i = 0; dp->r && i < dp->n; i++)
        if (dp->r[i].started)
            pthread_join(dp->r[i].thread, NULL);
    ch_reducer_free(dp->reducer);
    for (int i = 0; dp->r && i < dp->n; i++) {
        replica *r = &dp->r[i];
        if (r->stream)
            (void)ch_stream_sync(r->stream);
        ch_tensor_free(r->x);
        ch_tensor_free(r->labels);
        ch_tensor_free(r->pred);
        ch_tensor_free(r->finite);
        free(r->finite_host);
        free(r->pred_host);
        free(r->xbuf);
        free(r->xsum);
        ch_optimizer_free(r->opt);
        ch_loss_free(r->loss);
        ch_module_free(r->model);
        for (int b = 0; r->grads && b < dp->nbuckets; b++)
            ch_tensor_free(r->grads[b]);
        free(r->grads);
        for (int b = 0; r->ready && b < dp->nbuckets; b++)
            ch_event_free(r->ready[b]);
        free(r->ready);
        free(r->missing);
        ch_stream_free(r->comm);
        ch_stream_free(r->stream);
    }
    pthread_barrier_destroy(&dp->barrier);
    pthread_cond_destroy(&dp->go);
    pthread_cond_destroy(&dp->done);
    pthread_cond_destroy(&dp->posted);
    pthread_cond_destroy(&dp->exchanged);
    pthread_mutex_destroy(&dp->lock);
    free(dp->r);
    nn_comm_free(dp->bn);
    nn_comm_free(dp->grad);
    nn_comm_free(dp->ctl);
    free(dp->rank_n);
    free(dp->rank_first);
    free(dp->reports);
    free(dp->xtotal);
    free(dp->x_counts);
    nn_split_free(&dp->split);
    free(dp->buckets);
    free(dp->param_bucket);
    free(dp->posted_count);
    free(dp->reduce_bufs);
    free(dp);
}

/* ---- A call ---------------------------------------------------------------------- */

/* Share the batch out over the job's replicas: each local replica's count
 * and start. */
static void split(ch_dp *dp, int total)
{
    nn_split_batch(&dp->split, total);
    for (int i = 0; i < dp->n; i++) {
        dp->r[i].count = dp->split.count[dp->first + i];
        dp->r[i].start = dp->split.start[dp->first + i];
    }
}

/* The samples of rank k's replicas in the last split. */
static int rank_count(const ch_dp *dp, int k)
{
    int c = 0;
    for (int i = 0; i < dp->rank_n[k]; i++)
        c += dp->split.count[dp->rank_first[k] + i];
    return c;
}

static report *report_of(const ch_dp *dp, int k)
{
    return (report *)(dp->reports + (size_t)k * dp->report_bytes);
}

static double *report_seconds(report *p) { return (double *)(p + 1); }

/* Auto split: the replicas' compute times of the call just made, every
 * process's (from the reports) when there are several. */
static void measure(ch_dp *dp)
{
    for (int i = 0; i < dp->n; i++)
        dp->split.seconds[dp->first + i] = dp->r[i].compute_seconds;
    for (int k = 0; dp->ranks > 1 && k < dp->ranks; k++)
        for (int i = 0; k != dp->rank && i < dp->rank_n[k]; i++)
            dp->split.seconds[dp->rank_first[k] + i] = report_seconds(report_of(dp, k))[i];
    nn_split_measure(&dp->split);
}

/* Run the call set up in dp on every replica and wait for all of them. */
static void run_all(ch_dp *dp)
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
    pthread_mutex_lock(&dp->lock);
    dp->finished = 0;
    atomic_store(&dp->failed, 0);
    dp->reducer_done = 0;
    dp->x_active = 0;
    dp->x_arrived = 0;
    dp->x_leader = -1;
    dp->x_flagged = 0;
    dp->x_done = 0;
    for (int i = 0; i < dp->n; i++) {
        if (dp->r[i].count > 0 && dp->x_leader < 0)
            dp->x_leader = i;
        dp->x_active += dp->r[i].count > 0;
    }
    dp->reduce_start = 0.0;
    dp->reduce_st = CH_OK;
    if (dp->job == JOB_TRAIN && dp->sync) {
        for (int b = 0; b < dp->nbuckets; b++)
            dp->posted_count[b] = 0;
        dp->reduce_generation++;
    }
    dp->generation++;
    pthread_cond_broadcast(&dp->go);
    while (dp->finished < dp->n)
        pthread_cond_wait(&dp->done, &dp->lock);
    pthread_mutex_unlock(&dp->lock);
}

/* The first error of the call: a replica's, else the reducer's. */
static ch_status call_status(ch_dp *dp, const char *fn)
{
    for (int i = 0; i < dp->n; i++)
        if (dp->r[i].st != CH_OK)
            return chi_error(dp->r[i].st, "%s: %s", fn, dp->r[i].error);
    if (dp->reduce_st != CH_OK)
        return chi_error(dp->reduce_st, "%s: %s", fn, dp->reduce_error);
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
    size_t sample = sample_bytes(dp);
    if (ch_host_buffer_size(batch->images) < sample * (size_t)batch->count)
        return chi_error(CH_ERR_SHAPE, "%s: the images buffer holds %zu bytes, %d samples "
                         "need %zu", fn, ch_host_buffer_size(batch->images), batch->count,
                         sample * (size_t)batch->count);
    size_t lb = label_bytes(dp) * (size_t)batch->count;
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
    for (int i = 1; i < dp->n; i++)
        if (dp->r[i].checksum != dp->r[0].checksum)
            return chi_error(CH_ERR_INTERNAL, "%s: replica %d on %s holds other parameters "
                             "than replica 0 after step %lld (checksum %016llx, want %016llx)",
                             fn, i, ch_device_id(dp->r[i].dev), (long long)step,
                             (unsigned long long)dp->r[i].checksum,
                             (unsigned long long)dp->r[0].checksum);
    return CH_OK;
}

/* Across processes, at the end of every call: each process's report to
 * all. The call fails on every process when it failed on one: with its own
 * message where it failed, else naming the first process that failed with
 * that process's message. Then, for a checked step, every process's
 * replica 0 against rank 0's. */
static ch_status share_outcome(ch_dp *dp, ch_status st, const char *fn, double loss,
                               int64_t correct, int checked, int64_t step)
{
    if (dp->ranks == 1)
        return st;
    char why[512] = "";
    if (st != CH_OK)
        snprintf(why, sizeof why, "%s", ch_last_error());
    report *mine = report_of(dp, dp->ranks);
    memset(mine, 0, dp->report_bytes);
    mine->st = (int32_t)st;
    snprintf(mine->error, sizeof mine->error, "%s", why);
    mine->loss = loss;
    mine->correct = correct;
    mine->checked = checked;
    mine->checksum = dp->r[0].checksum;
    for (int i = 0; i < dp->n; i++)
        report_seconds(mine)[i] = dp->r[i].compute_seconds;
    ch_status got = nn_comm_allgather(dp->ctl, mine, dp->reports, dp->report_bytes, fn);
    if (st != CH_OK && (st != CH_ERR_REMOTE || got != CH_OK))
        return chi_error(st, "%s", why);
    if (got != CH_OK)
        return got;
    /* The first process that failed on its own, before those that only
     * heard of it. */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < dp->ranks; k++) {
            const report *p = report_of(dp, k);
            if (p->st == CH_OK || (pass == 0 && p->st == CH_ERR_REMOTE))
                continue;
            if (k == dp->rank)
                return chi_error(st, "%s", why);
            return chi_error((ch_status)p->st, "%s: rank %d failed: %.400s", fn, k, p->error);
        }
    const report *root = report_of(dp, 0);
    for (int k = 1; checked && k < dp->ranks; k++)
        if (report_of(dp, k)->checksum != root->checksum)
            return chi_error(CH_ERR_INTERNAL, "%s: rank %d holds other parameters than rank 0 "
                             "after step %lld (checksum %016llx, want %016llx)", fn, k,
                             (long long)step,
                             (unsigned long long)report_of(dp, k)->checksum,
                             (unsigned long long)root->checksum);
    return CH_OK;
}

/* Across processes with synchronised BatchNorm, every process takes part
 * in every exchange of a training call: each needs samples. */
static ch_status check_every_rank_has_samples(const ch_dp *dp, const char *fn, int total)
{
    if (dp->ranks == 1 || dp->o.batchnorm_local ||
        ch_module_buffer_count(dp->r[0].model) == 0)
        return CH_OK;
    for (int k = 0; k < dp->ranks; k++)
        if (rank_count(dp, k) == 0)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: the batch of %d samples leaves "
                             "rank %d without any, and synchronised BatchNorm needs every "
                             "process in every step: give at least %d samples", fn, total, k,
                             dp->nall);
    return CH_OK;
}

/* After a replica failed during its update, the replicas may hold
 * different parameters: every later call fails. */
static ch_status check_parted(const ch_dp *dp, const char *fn)
{
    if (!atomic_load(&dp->parted))
        return CH_OK;
    return chi_error(CH_ERR_STATE, "%s: an earlier step failed while the replicas were updating "
                     "their parameters, so they may differ (%.900s): free this dp and make a new "
                     "one, from a checkpoint", fn, dp->parted_error);
}

/* A training call: micro-batch `batch` (NULL: flush), reducing and
 * updating when `sync`. */
static ch_status train_call(ch_dp *dp, const ch_batch *batch, float lr, int sync,
                            float *loss)
{
    const char *fn = batch ? "ch_dp_step" : "ch_dp_flush";
    TRY(check_parted(dp, fn));
    int k = dp->o.accumulate > 1 ? dp->o.accumulate : 1;
    dp->job = JOB_TRAIN;
    dp->batch = batch;
    dp->lr = lr;
    dp->sync = sync;
    dp->loss_scale = dp->scaler / (float)k;
    dp->grad_rescale = batch ? 1.0f : (float)k / (float)dp->micro;
    if (batch) {
        split(dp, batch->count);
        TRY(check_every_rank_has_samples(dp, fn, batch->count));
    } else {
        for (int i = 0; i < dp->n; i++)
            dp->r[i].count = 0;
    }
    run_all(dp);
    injected_clear(dp, sync);
    dp->grad_rescale = 1.0f;
    ch_status st = call_status(dp, fn);
    if (atomic_load(&dp->parted) && !dp->parted_error[0])
        snprintf(dp->parted_error, sizeof dp->parted_error, "%s", ch_last_error());
    int checked = sync && dp->o.check_every > 0 && (dp->step + 1) % dp->o.check_every == 0;
    if (st == CH_OK && checked)
        st = check_replicas(dp, fn, dp->step + 1);
    double part = 0;
    for (int i = 0; batch && i < dp->n; i++)
        part += (double)dp->r[i].loss_value * dp->r[i].count / batch->count;
    st = share_outcome(dp, st, fn, part, 0, checked, dp->step + 1);
    if (st != CH_OK) {
        /* What was accumulated is gone with the failed call. */
        dp->micro = 0;
        dp->micro_samples = 0;
        return st;
    }
    if (batch) {
        measure(dp);
        dp->x_expected = dp->x_done;
    }
    double total = part;
    if (dp->ranks > 1) {
        total = 0;
        for (int r = 0; r < dp->ranks; r++)
            total += report_of(dp, r)->loss;
    }
    if (loss)
        *loss = (float)total;
    if (!sync) {
        dp->micro++;
        dp->micro_samples += batch->count;
        return CH_OK;
    }
    dp->micro = 0;
    dp->micro_samples = 0;
    dp->step++;
    rescale(dp);
    int buffers = ch_module_buffer_count(dp->r[0].model) > 0;
    dp->buffers_stale = dp->n > 1 && buffers;
    dp->ranks_stale = dp->ranks > 1 && dp->o.batchnorm_local && buffers;
    return CH_OK;
}

ch_status ch_dp_step(ch_dp *dp, float *loss, const ch_batch *batch, float lr)
{
    if (!dp || !batch || !loss)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_step: %s is NULL",
                         !dp ? "dp" : !batch ? "batch" : "loss");
    TRY(check_batch(dp, batch, "ch_dp_step", 1));
    if (!isfinite(lr) || lr < 0.0f)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_step: lr is %g, expected a finite "
                         "number >= 0", lr);
    int k = dp->o.accumulate > 1 ? dp->o.accumulate : 1;
    return train_call(dp, batch, lr, dp->micro + 1 >= k, loss);
}

int ch_dp_pending(const ch_dp *dp) { return dp ? dp->micro : 0; }

ch_status ch_dp_loss_scale(const ch_dp *dp, float *scale, int *clean_steps, int64_t *skipped)
{
    if (!dp)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_loss_scale: dp is NULL");
    if (scale)
        *scale = dp->scaler;
    if (clean_steps)
        *clean_steps = dp->scaler_clean;
    if (skipped)
        *skipped = dp->skipped;
    return CH_OK;
}

ch_status ch_dp_set_loss_scale(ch_dp *dp, float scale, int clean_steps)
{
    if (!dp)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_set_loss_scale: dp is NULL");
    if (dp->o.precision != CH_F16)
        return chi_error(CH_ERR_STATE, "ch_dp_set_loss_scale: the dp trains in %s; only f16 "
                         "scales its loss", ch_dtype_name(dp->o.precision));
    if (!(scale > 0.0f) || !isfinite(scale) || clean_steps < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_set_loss_scale: scale %g, clean "
                         "steps %d: expected a positive finite scale and a count >= 0",
                         scale, clean_steps);
    dp->scaler = scale;
    dp->scaler_clean = clean_steps;
    return CH_OK;
}

ch_status ch_dp_flush(ch_dp *dp, float lr)
{
    if (!dp)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_flush: dp is NULL");
    if (!isfinite(lr) || lr < 0.0f)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_flush: lr is %g, expected a finite "
                         "number >= 0", lr);
    if (dp->micro == 0)
        return CH_OK;
    return train_call(dp, NULL, lr, 1, NULL);
}

/* Across processes: rank 0's copy of `t` into every process's `t`,
 * through the host buffer *scratch (grown as needed). */
static ch_status bcast_tensor(ch_dp *dp, ch_tensor *t, void **scratch, size_t *cap,
                              const char *what)
{
    size_t bytes = ch_tensor_nbytes(t);
    if (bytes > *cap) {
        void *grown = realloc(*scratch, bytes);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
        *scratch = grown;
        *cap = bytes;
    }
    if (dp->rank == 0)
        TRY(ch_tensor_download(t, *scratch, bytes));
    TRY(nn_comm_bcast(dp->ctl, *scratch, bytes, 0, what));
    return dp->rank == 0 ? CH_OK : ch_tensor_upload(t, *scratch, bytes);
}

/* Across processes: rank 0's replica 0 parameters (when `params`) and
 * buffers into every process's replica 0, then into its other replicas. */
static ch_status bcast_state(ch_dp *dp, int params, const char *what)
{
    ch_module *m = dp->r[0].model;
    void *scratch = NULL;
    size_t cap = 0;
    ch_status st = CH_OK;
    int np = params ? ch_module_param_count(m) : 0;
    for (int i = 0; st == CH_OK && i < np; i++) {
        ch_tensor *v;
        st = ch_module_param(m, i, NULL, &v, NULL);
        if (st == CH_OK)
            st = bcast_tensor(dp, v, &scratch, &cap, what);
        for (int k = 1; st == CH_OK && k < dp->n; k++) {
            ch_tensor *w;
            st = ch_module_param(dp->r[k].model, i, NULL, &w, NULL);
            if (st == CH_OK)
                st = ch_copy(w, v);
        }
    }
    int nb = ch_module_buffer_count(m);
    for (int i = 0; st == CH_OK && i < nb; i++) {
        ch_tensor *v;
        int64_t *counter;
        st = ch_module_buffer(m, i, NULL, &v, &counter);
        if (st == CH_OK && v)
            st = bcast_tensor(dp, v, &scratch, &cap, what);
        else if (st == CH_OK)
            st = nn_comm_bcast(dp->ctl, counter, sizeof *counter, 0, what);
    }
    free(scratch);
    for (int k = 0; st == CH_OK && k < dp->n; k++)
        st = ch_device_sync(dp->r[k].dev);
    if (st == CH_OK && nb > 0)
        dp->buffers_stale = dp->n > 1;
    return st;
}

/* Across processes, after a prediction: every process's rows to all. */
static ch_status gather_rows(ch_dp *dp, ch_tensor *out, int total)
{
    size_t bytes = ch_tensor_nbytes(out), row = bytes / (size_t)total;
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_predict: out of memory");
    ch_status st = ch_tensor_download(out, buf, bytes);
    for (int k = 0; st == CH_OK && k < dp->ranks; k++) {
        int start = dp->split.start[dp->rank_first[k]];
        st = nn_comm_bcast(dp->ctl, buf + (size_t)start * row, (size_t)rank_count(dp, k) * row,
                           k, "ch_dp_predict: the outputs of every process");
    }
    if (st == CH_OK)
        st = ch_tensor_upload(out, buf, bytes);
    free(buf);
    return st;
}

static ch_status infer_call(ch_dp *dp, job j, const ch_batch *batch, ch_tensor *out)
{
    const char *fn = j == JOB_PREDICT ? "ch_dp_predict" : "ch_dp_evaluate";
    TRY(check_parted(dp, fn));
    if (dp->ranks_stale) {
        /* Per-process BatchNorm statistics: rank 0's are the ones kept. */
        ch_status st = bcast_state(dp, 0, "rank 0's running statistics");
        if (st != CH_OK)
            return chi_error(st, "%s: %s", fn, ch_last_error());
        dp->ranks_stale = 0;
    }
    ch_status st = broadcast_buffers(dp);
    if (st != CH_OK)
        return chi_error(st, "%s: copying replica 0's running statistics: %s", fn,
                         ch_last_error());
    dp->job = j;
    dp->batch = batch;
    dp->out = out;
    dp->sync = 0;
    split(dp, batch->count);
    run_all(dp);
    injected_clear(dp, 0);
    dp->out = NULL;
    st = call_status(dp, fn);
    double loss = 0;
    int64_t correct = 0;
    for (int i = 0; i < dp->n; i++) {
        loss += (double)dp->r[i].loss_value * dp->r[i].count / batch->count;
        correct += dp->r[i].correct;
    }
    TRY(share_outcome(dp, st, fn, loss, correct, 0, dp->step));
    if (dp->ranks > 1) {
        loss = 0;
        correct = 0;
        for (int k = 0; k < dp->ranks; k++) {
            loss += report_of(dp, k)->loss;
            correct += report_of(dp, k)->correct;
        }
    }
    dp->eval_loss = loss;
    dp->eval_correct = correct;
    if (j == JOB_PREDICT && dp->ranks > 1)
        TRY(gather_rows(dp, out, batch->count));
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
    if (dp->micro > 0)
        return chi_error(CH_ERR_STATE, "ch_dp_predict: %d micro-batches are accumulated; "
                         "call ch_dp_step or ch_dp_flush first", dp->micro);
    return infer_call(dp, JOB_PREDICT, batch, out);
}

ch_status ch_dp_evaluate(ch_dp *dp, float *loss, int64_t *correct, const ch_batch *batch)
{
    if (!dp || !batch)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_evaluate: %s is NULL",
                         !dp ? "dp" : "batch");
    TRY(check_batch(dp, batch, "ch_dp_evaluate", 1));
    if (dp->micro > 0)
        return chi_error(CH_ERR_STATE, "ch_dp_evaluate: %d micro-batches are accumulated; "
                         "call ch_dp_step or ch_dp_flush first", dp->micro);
    TRY(infer_call(dp, JOB_EVALUATE, batch, NULL));
    if (loss)
        *loss = (float)dp->eval_loss;
    if (correct)
        *correct = dp->eval_correct;
    return CH_OK;
}

/* ---- Queries ---------------------------------------------------------------------- */

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

ch_status ch_dp_last_compute(const ch_dp *dp, double *seconds, int n)
{
    if (!dp || n != dp->n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dp_last_compute: %s",
                         !dp ? "dp is NULL" : "n is not the number of replicas");
    for (int i = 0; seconds && i < n; i++)
        seconds[i] = dp->r[i].compute_seconds;
    return CH_OK;
}

double ch_dp_last_overlap(const ch_dp *dp)
{
    if (!dp || !(dp->reduce_start > 0.0))
        return 0.0;
    double last = 0.0;
    for (int i = 0; i < dp->n; i++)
        if (dp->r[i].compute_end > last)
            last = dp->r[i].compute_end;
    return last > dp->reduce_start ? last - dp->reduce_start : 0.0;
}

ch_reduce_mode ch_dp_reduce_mode(const ch_dp *dp) { return dp ? dp->o.reduce : CH_REDUCE_HOST; }
int ch_dp_bucket_count(const ch_dp *dp) { return dp ? dp->nbuckets : 0; }
int ch_dp_bound(const ch_dp *dp, int index)
{
    return dp && index >= 0 && index < dp->n ? dp->r[index].bound : 0;
}

ch_optimizer *ch_dp_optimizer(const ch_dp *dp, int index)
{
    return dp && index >= 0 && index < dp->n ? dp->r[index].opt : NULL;
}

ch_module *ch_dp_replica(const ch_dp *dp, int index)
{
    if (!dp || index < 0 || index >= dp->n)
        return NULL;
    /* Whoever looks at a replica sees replica 0's running statistics. */
    if (index > 0 && broadcast_buffers((ch_dp *)dp) != CH_OK)
        return NULL;
    return dp->r[index].model;
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
