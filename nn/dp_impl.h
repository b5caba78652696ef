/* What the files of data parallelism (chorus/dp.h) share. Private to them:
 *
 * - nn/dp.c: the object and its calls (ch_dp_new, ch_dp_free, the step,
 *   prediction and evaluation calls);
 * - nn/dp_query.c: the queries, which read an object's state after its
 *   calls (the last step's times, the buckets, a replica's model);
 * - nn/dp_worker.c: what each replica's worker thread does in a call, and
 *   the workers' barrier;
 * - nn/dp_reduce.c: the buckets and the reducer thread;
 * - nn/dp_bn.c: BatchNorm's statistics exchanged between replicas;
 * - nn/dp_join.c: across processes, joining them in ch_dp_new and the
 *   report every process gives the others at the end of every call;
 * - nn/dp_shard.c: the sharded optimizer (ZeRO stage 1) and the
 *   optimizer's state as a whole;
 * - nn/dp_trace.c: its part of the trace, the step's breakdown and the
 *   automatic bucket size;
 * - nn/dp_elastic.c: elastic data parallelism inside one process: lost
 *   devices removed, replacement objects, rejoining, retiring objects
 *   whose threads hung;
 * - nn/dp_watchdog.c: elastic's device probes and the watchdog over a call;
 * - nn/dp_lose.c: devices that tests lose (only in the tests' copy of nn/).
 *
 * The design (replicas, buckets, the phases of a call) is described at the
 * top of nn/dp.c. */
#ifndef CHORUS_NN_DP_IMPL_H
#define CHORUS_NN_DP_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "dist.h"
#include "nn.h"
#include "split.h"
#include <chorus/dp.h>

typedef enum job {
    JOB_TRAIN,
    JOB_PREDICT,
    JOB_EVALUATE
} job;

/* What a process tells the others at the end of every call (across
 * processes): its status, its share of the loss and of the right answers,
 * replica 0's checksum, and its replicas' compute seconds (the automatic
 * split), `nmax` of them after the fixed part. */
typedef struct report {
    int32_t st;
    int32_t checked;
    double loss; /* sum over its replicas of mean loss x samples */
    int64_t correct;
    uint64_t checksum;
    char error[400];
} report;

/* A point of a replica's stream on the trace (nn/dp_trace.c): the
 * beginning or end of a phase, or a bucket's gradients being ready. */
typedef enum dp_phase {
    PH_UPLOAD,
    PH_FORWARD,
    PH_MODULE_F, /* a top-level module's forward (arg: its index) */
    PH_LOSS,
    PH_BACKWARD,
    PH_MODULE_B, /* a top-level module's backward */
    PH_READY,    /* bucket arg's gradients are ready (a point) */
    PH_UPDATE
} dp_phase;

typedef struct dp_mark {
    ch_event *ev; /* made while a trace ran, so that it can tell its device time */
    double host;  /* the host's clock when it was recorded */
    double t;     /* its time, once resolved */
    int phase, end, arg;
} dp_mark;

typedef struct bucket {
    int p_lo, p_hi; /* parameters [p_lo, p_hi) */
    int64_t count;  /* their elements */
} bucket;

typedef struct replica {
    ch_dp *dp;
    int index;
    ch_device *dev;
    ch_stream *stream; /* forward, backward, the optimizer */
    ch_stream *comm;   /* the reducer's work on this replica */
    ch_module *model;
    ch_loss *loss;
    ch_optimizer *opt;
    ch_tensor *x, *labels, *pred;
    ch_tensor *wide;    /* evaluation: half outputs widened for argmax */
    int32_t *pred_host; /* evaluation: the predictions, downloaded */
    int64_t pred_cap;
    pthread_t thread;
    int started, bound;
    int start, count; /* its slice of the batch */
    float loss_value;
    int64_t correct;
    double seconds, compute_seconds;
    double compute_end; /* when its forward and backward ended */
    uint64_t checksum;
    ch_status st;
    char error[1024];
    int updated; /* its update of this call ran (elastic: the step held on it) */
    int hung;    /* elastic: it did not answer within the timeout */
    int busy;    /* its worker is in a call */
    int exited;  /* its worker thread returned */

    struct {               /* its gradients in buckets (nn/dp_reduce.c) */
        ch_tensor **grads; /* per bucket: its gradients; the parameters' are views */
        ch_event **ready;  /* per bucket: its gradients are complete */
        int *missing;      /* per bucket: parameters still to come, -1 once posted */
        int posting;       /* this backward posts buckets */
    } bk;
    struct { /* BatchNorm's sums, exchanged through the host (nn/dp_bn.c) */
        float *buf;
        double *sum;
        int64_t cap;
        double wait; /* of its compute, seconds spent waiting for the
                                 other replicas' sums */
    } bn;
    struct {            /* its part of the trace (nn/dp_trace.c) */
        int on;         /* this call is traced */
        char label[48]; /* its track: the device, "#k" when replicas share it */
        dp_mark *marks;
        int nmarks, cap;     /* cap: marks with an event made */
        int module;          /* the top-level module in backward, -1 */
        int dropped;         /* marks that could not be recorded in this call */
        double bwd_end;      /* device time of the end of backward, 0: none */
        unsigned char *flow; /* per bucket: its ready point starts a flow */
        ch_module **top;     /* [ntop] its model's top-level modules */
        int ntop;
        struct { /* its thread waiting, on the host's clock */
            const char *what;
            double t0, t1;
        } waits[6];
        int nwaits;
    } trace;
    /* The step's breakdown on the host's clock (ch_dp_last_breakdown). */
    double t_start, t_update, t_end;
    struct {                        /* micro-batches sized by its device's memory limit */
        uint64_t limit;             /* the device's limit at ch_dp_new, 0: none (one pass) */
        int size;                   /* samples per micro-batch once measured, 0: not yet */
        int count;                  /* micro-batches in its last training call */
        int last;                   /* samples in its last training call */
        int too_small;              /* its last call could not fit one sample */
        int out;                    /* left out: no samples, no update (ch_dp_micro_batches) */
        uint64_t per_sample, fixed; /* measured: bytes a sample adds, and a pass's own */
    } mb;
    struct {                /* fp16's check of the reduced gradients */
        int overflow;       /* they were not finite */
        ch_tensor *finite;  /* each bucket's sum, for the check */
        float *finite_host; /* the sums read back */
    } fp16;
} replica;

struct ch_dp {
    int n; /* this process's replicas */
    replica *r;
    ch_dp_options o;
    nn_split split; /* the batch's shares (nn/split.h) */
    int64_t numel;  /* all parameters */
    int threaded;   /* worker threads and a reducer: n > 1 or ranks > 1 */

    struct { /* the threads and what they meet on */
        pthread_mutex_t lock;
        pthread_cond_t go, done;
        /* The workers' barrier (nn/dp_worker.c), on `lock`: a call given
         * up for a replica that stopped answering breaks it for good. */
        pthread_cond_t bar;
        int bar_count;
        int64_t bar_gen;
        int broken;
        int bar_failed;     /* the call had failed when the barrier last opened */
        int64_t generation; /* bumped for every call the workers run */
        int finished;       /* workers done with the call (ready, before the first) */
        int quit;
        atomic_int failed;       /* something failed in this call */
        atomic_int parted;       /* a replica failed during its update */
        char parted_error[1200]; /* then every later call fails with this */
    } w;

    struct { /* the buckets (nn/dp_reduce.c) */
        bucket *list;
        int count;
        int *of_param; /* parameter index -> bucket */
        int *posted;   /* per bucket: replicas that posted it in this call */
    } bk;

    struct {                 /* the reducer thread (nn/dp_reduce.c) */
        ch_reducer *reducer; /* n > 1 */
        ch_tensor **bufs;    /* [n] the reducer thread's view of a bucket */
        pthread_t thread;
        int started;
        pthread_cond_t posted; /* a bucket was posted, the reducer is done, or a failure */
        int64_t generation;    /* bumped for every call the reducer runs */
        int done;              /* with this call */
        int complete;          /* every bucket of this call was reduced */
        double start;          /* when the first bucket's reduction began, 0: none */
        double end;            /* when the last one's ended, 0: none */
        ch_status st;
        char error[1024];
        nn_comm *comm; /* its collectives across processes */
        int bucket;    /* the bucket being reduced */
        int small;     /* across processes: in this call a replica of the job could not
                        * fit one sample (the same on every process) */
        int scatter;   /* reduce-scattered: its stage sums the process's window only */
        int exited;    /* the thread returned */
    } red;

    struct {                      /* BatchNorm's statistics exchange (nn/dp_bn.c) */
        pthread_cond_t exchanged; /* a round of the exchange ended */
        int active;               /* replicas with samples in this call: they exchange */
        int arrived;
        int64_t round;
        int leader;      /* the replica that exchanges for the process */
        int flagged;     /* this call's failure was told to the others */
        int done;        /* exchanges across processes in this call */
        int expected;    /* in a training call (-1 until one succeeded) */
        int64_t *counts; /* [counts_cap] the values of each of them */
        int counts_cap;
        double *total; /* the process's sums, then the job's */
        int64_t total_cap;
        nn_comm *comm; /* its collectives across processes (the leader's) */
    } bn;

    struct { /* the call in flight */
        job job;
        int sync; /* this call reduces and updates */
        const ch_batch *batch;
        ch_tensor *out; /* predict */
        float lr;
        float loss_scale;   /* the loss's gradient factor: scaler / accumulate */
        float grad_rescale; /* flush: accumulate / micro-batches there are */
        double eval_loss;   /* the last evaluation's, over the job */
        int64_t eval_correct;
    } call;

    struct {                   /* training's state from call to call */
        int64_t step;          /* updates so far */
        int buffers_stale;     /* replicas 1.. hold older running statistics than 0 */
        int ranks_stale;       /* ranks other than 0 hold other running statistics */
        int micro;             /* micro-batches accumulated since the last update */
        int64_t micro_samples; /* their samples: the random stream's offset */
        float scaler;          /* fp16's dynamic loss scale (1 otherwise) */
        int scaler_clean;      /* clean steps since it last changed */
        int64_t skipped;       /* steps skipped for an overflow */
    } tr;

    /* Across processes (options.dist with two or more): this process's
     * replicas are replicas [first, first + n) of the job's nall, the
     * split is the job's (nn/dp_join.c). */
    struct {
        ch_dist *dist;
        int ranks, rank;
        int nall, first, nmax;
        int *rank_n, *rank_first; /* [ranks] */
        nn_comm *ctl;             /* the calling thread's collectives */
        size_t report_bytes;      /* sizeof(report) + nmax doubles */
        unsigned char *reports;   /* [ranks] reports, then this process's own */
        int span_all;             /* every process's reducer can span processes (NCCL) */
    } procs;

    struct {               /* the trace and the step's breakdown (nn/dp_trace.c) */
        ch_module **top;   /* [ntop] replica 0's top-level modules */
        char (*names)[64]; /* [ntop] their names on the trace */
        int ntop;
        int64_t traced_step; /* the step the traced call belongs to */
        double call_start, call_end;
        ch_dp_breakdown *last; /* [n] the last training call's */
        int64_t *slowest;      /* [n] training calls each replica was the slowest of */
        int64_t calls;         /* training calls measured */
    } tb;

    struct {             /* --bucket-mb auto (nn/dp_trace.c) */
        int on;          /* still choosing */
        int cand, ncand; /* the candidate being measured, of ncand */
        size_t sizes[8];
        double score[8]; /* the sum of their calls' exposed reduction */
        int calls;       /* measured calls of this candidate */
        size_t chosen;   /* bytes per bucket now */
    } tune;

    struct {            /* micro-batches by memory: replicas left out */
        char note[256]; /* the last one's message */
    } mb;

    struct {          /* the sharded optimizer (nn/dp_shard.c) */
        int on;       /* shard_optimizer, and more than one replica in the job */
        int64_t *lo;  /* [nall + 1]: job replica k's part is [lo[k], lo[k + 1]) */
        int64_t *off; /* [np + 1]: each parameter's first element */
        int np;
        float *host;      /* [numel] the host's copy the parts meet in */
        float *mine;      /* across processes: [most + 1] this process's run */
        float *all;       /* [ranks * (most + 1)] every process's */
        int64_t most;     /* the longest process's run of parts */
        int64_t *wfirst, *wcount; /* [n] a bucket's windows: each replica's part in it */
        int64_t *rfirst, *rcount; /* [ranks] its windows across processes: each run in it */
    } sh;

    /* Elastic data parallelism (nn/dp_elastic.c). With options.elastic the
     * caller's handle holds no replicas: `live` is the object that does,
     * made again over the devices left when one is lost (the handle keeps
     * the history); every call goes to it (dp_live). */
    struct {
        ch_dp *live;         /* the handle: the replicas' object now (NULL: made again at
                                 the next call, after a failure to make it) */
        ch_dp *handle;       /* the replicas' object: the caller's handle */
        int on;              /* the handle of an elastic dp */
        int nall;            /* the devices it was made with */
        ch_device **devs;    /* [nall] */
        float *weights;      /* [nall] CH_DP_SPLIT_WEIGHTS, else NULL */
        unsigned char *gone; /* [nall] lost and not rejoined */
        ch_dp_change *log;   /* what was lost and rejoined */
        int nlog, caplog;
        struct el_state *pending; /* the state a new object starts from */
        char note[512];
        int abandoned; /* an object given up with a hung thread: it frees itself */
    } el;

#ifdef CHI_TEST_HOOKS
    struct {
        int replica; /* this replica fails its next call */
        int update;  /* this replica fails its next update, past the barrier */
        int reduce;  /* the next reduction fails */
    } inject;
#endif
};

/* ---- Failures injected by tests ----------------------------------------------
 * Only in the copy of nn/ that tests link (tests/Makefile.mk): the
 * installed library has no hook. */
#ifdef CHI_TEST_HOOKS
/* The failure injected for `replica` (-1: the reducer), if any. */
static inline ch_status dp_injected(const ch_dp *dp, int replica)
{
    int fails = replica < 0 ? dp->inject.reduce : dp->inject.replica == replica;
    return fails ? chi_error(CH_ERR_INTERNAL, "failure injected by a test") : CH_OK;
}

static inline ch_status dp_injected_update(const ch_dp *dp, int replica)
{
    return dp->inject.update == replica ? chi_error(CH_ERR_INTERNAL, "failure injected by a test")
                                        : CH_OK;
}

/* After a call: a replica's failure is for one call, the reducer's for one
 * step (reset once the step synchronises). */
static inline void dp_injected_clear(ch_dp *dp, int step_done)
{
    dp->inject.replica = -1;
    if (step_done) {
        dp->inject.update = -1;
        dp->inject.reduce = 0;
    }
}
#else
#define dp_injected(dp, replica) CH_OK
#define dp_injected_clear(dp, step_done) ((void)0)
#define dp_injected_update(dp, replica) CH_OK
#endif

/* The first replica not left out: the one whose parameters and running
 * statistics are the others' reference. */
static inline int dp_lead(const ch_dp *dp)
{
    for (int i = 0; i < dp->n; i++)
        if (!dp->r[i].mb.out)
            return i;
    return 0;
}

/* The object holding the replicas behind a caller's handle. */
static inline ch_dp *dp_live(const ch_dp *dp)
{
    return dp && dp->el.on ? dp->el.live : (ch_dp *)dp;
}

/* Where a test makes a device fail (chi_dp_lose, nn/dp_lose.c). */
enum {
    DP_AT_FORWARD,
    DP_AT_BACKWARD,
    DP_AT_REDUCE,
    DP_AT_UPDATE
};
#ifdef CHI_TEST_HOOKS
/* CH_ERR_DRIVER (or a hang until chi_dp_found) when a test lost `dev` at
 * point `at` of training step `step`. */
ch_status dp_lose_here(ch_device *dev, int at, int64_t step);
/* The test lost `dev` for good: every probe of it fails. */
int dp_lost_by_test(ch_device *dev);
#else
#define dp_lose_here(dev, at, step) CH_OK
#define dp_lost_by_test(dev) 0
#endif

/* ---- nn/dp_watchdog.c ----------------------------------------------------------- */

/* The calling thread, elastic: wait for the workers of a call, and give
 * it up when one stops answering for options.elastic_timeout. */
void dp_wait_call(ch_dp *dp);
/* Probe devs[0, n) at once; ok[i]: devs[i] answered within `limit`
 * seconds, and a device that answered with an error answered a second
 * probe (one failing call of a device that works, such as a stream it
 * could not make once, does not remove it). */
void dp_probe_all(ch_device *const *devs, int n, double limit, int *ok);

/* ---- nn/dp_elastic.c ------------------------------------------------------------ */

/* ch_dp_new's elastic handle around the object `live`. */
ch_status dp_elastic_wrap(ch_dp **out, ch_dp *live, ch_device *const *devices, int n,
                          const ch_dp_options *o);
/* A training call on an elastic handle (batch NULL: flush). */
ch_status dp_elastic_train(ch_dp *h, float *loss, const ch_batch *batch, float lr);
/* An evaluation call (predict or evaluate) on an elastic handle. */
ch_status dp_elastic_infer(ch_dp *h, ch_tensor *out, float *loss, int64_t *correct,
                           const ch_batch *batch);
void dp_elastic_free(ch_dp *h);
/* A thread of an object that was given up returns: the last one frees it. */
void dp_thread_exit(ch_dp *dp, int *exited);

/* ---- nn/dp.c -------------------------------------------------------------------- */

/* ch_dp_new's work, options checked. */
ch_status dp_create(ch_dp **out, const ch_module *model, ch_device *const *devices, int n,
                    const ch_dp_options *options);
/* ch_dp_free's work on an object of replicas, its memory too. */
void dp_destroy(ch_dp *dp);
/* The calls on an object of replicas. */
ch_status dp_step_now(ch_dp *dp, float *loss, const ch_batch *batch, float lr);
ch_status dp_predict_now(ch_dp *dp, ch_tensor *out, const ch_batch *batch);
ch_status dp_evaluate_now(ch_dp *dp, float *loss, int64_t *correct, const ch_batch *batch);

/* ---- nn/dp_worker.c ------------------------------------------------------------- */

int64_t dp_labels_per_sample(const ch_dp *dp);
/* Bytes of one input sample, of one sample's labels. */
size_t dp_sample_bytes(const ch_dp *dp);
size_t dp_label_bytes(const ch_dp *dp);
/* Replica r's checksum of its parameters (r->checksum). */
ch_status dp_param_checksum(replica *r);
/* fp16, after an update: the loss scale for the next step. */
void dp_rescale(ch_dp *dp);
/* Runs the call set up in dp->call on every replica; returns when all are
 * done. */
void dp_run_all(ch_dp *dp);
/* A replica's worker thread (arg: the replica). */
void *dp_worker(void *arg);

/* ---- nn/dp_reduce.c ------------------------------------------------------------- */

ch_status dp_make_buckets(ch_dp *dp, const ch_module *model);
/* The model's hook (nn_set_grad_hook; user: the replica). */
ch_status dp_on_grads(void *user, int first, int count);
/* Posts the buckets this replica has not posted yet. */
ch_status dp_post_rest(replica *r);
ch_status dp_make_reducer(ch_dp *dp);
void *dp_reducer_main(void *arg);
void dp_wait_reduced(ch_dp *dp);
/* With w.lock held: wait for the next call (*generation moving past
 * *seen); 0 when the dp is shutting down instead. */
int dp_next_call(ch_dp *dp, const int64_t *generation, int64_t *seen);

/* ---- nn/dp_bn.c ----------------------------------------------------------------- */

/* The model's BatchNorm hook (nn_set_sync; user: the replica). */
ch_status dp_exchange_sums(void *user, ch_tensor *t);
void dp_flag_exchange(ch_dp *dp);
ch_status dp_broadcast_buffers(ch_dp *dp);

/* ---- nn/dp_trace.c -------------------------------------------------------------- */

/* At ch_dp_new: the top-level modules and the replicas' tracks. */
ch_status dp_trace_init(ch_dp *dp);
void dp_trace_free(ch_dp *dp);
/* Set up replica r's model: the pass hook of its top-level modules. */
ch_status dp_trace_hook(replica *r);
/* A replica's call: whether it is traced (at its start), a mark. */
void dp_trace_begin(replica *r);
void dp_mark_here(replica *r, dp_phase phase, int end, int arg);
/* Its worker thread waited for `what` from t0 (chi_trace_now() before,
 * 0 while no trace ran) to now. */
void dp_trace_wait(replica *r, const char *what, double t0);
/* After forward, loss and backward succeeded: their marks' times. */
void dp_trace_compute_done(replica *r);
/* At the end of its call, the stream drained: its slices. */
void dp_trace_replica_end(replica *r);
/* The reducer: bucket b was reduced from t0 to t1 (host clock). */
void dp_trace_bucket(ch_dp *dp, int b, double t0, double t1);
/* The calling thread, after a training call: the breakdown, the step's
 * slice; `st` the call's status. */
void dp_trace_call_end(ch_dp *dp, ch_status st, int sync, int samples);
/* CH_DP_BUCKET_AUTO, at ch_dp_new: the candidates (the first one's
 * buckets are made first). */
void dp_tune_init(ch_dp *dp);
/* --bucket-mb auto: before a call, maybe a new bucket size. */
ch_status dp_tune_before(ch_dp *dp);
/* Across processes, while a trace runs: every rank's trace on rank 0's
 * clock (a collective of every process, in ch_dp_new). */
ch_status dp_trace_align(ch_dp *dp);
/* Rebuild the buckets at `bytes` each (between steps, nothing accumulated). */
ch_status dp_rebucket(ch_dp *dp, size_t bytes);

/* ---- nn/dp_shard.c -------------------------------------------------------------- */

/* At ch_dp_new, after the join: the parts, the replicas' optimizers'
 * ranges, the host copy. */
ch_status dp_shard_init(ch_dp *dp);
void dp_shard_free(ch_dp *dp);
/* Local replica `index`'s part of the elements. */
void dp_shard_part(const ch_dp *dp, int index, int64_t *lo, int64_t *hi);
/* After its update: replica r's part into the host copy. */
ch_status dp_shard_publish(replica *r);
/* One worker, between the barriers: across processes, the other
 * processes' parts into the host copy; *other_failed: another process
 * could not update. */
ch_status dp_shard_exchange(ch_dp *dp, int failed, int *other_failed);
/* The other replicas' parts into r's parameters. */
ch_status dp_shard_fetch(replica *r);
/* Bucket b's windows (sh.wfirst, sh.wcount): each local replica's part of
 * its elements; 0 when the reduction gives every replica the whole sum
 * (no sharding, or fp16, whose check of the sums reads all of them). */
int dp_shard_windows(ch_dp *dp, int b);
/* Bucket b's windows across processes (sh.rfirst, sh.rcount): each
 * process's run of parts in it, from the bucket's first element. */
void dp_shard_rank_windows(ch_dp *dp, int b);
/* The parts cut again with the replicas left out given none (before the
 * optimizers' state exists). */
ch_status dp_shard_recut(ch_dp *dp);

/* ---- nn/dp_join.c --------------------------------------------------------------- */

ch_status dp_make_comms(ch_dp *dp);
ch_status dp_join(ch_dp *dp, ch_status st, const ch_dp_options *o, float **weights);
ch_status dp_check_same_start(ch_dp *dp);
ch_status dp_try_span(ch_dp *dp);
ch_status dp_bcast_state(ch_dp *dp, int params, const char *what);
ch_status dp_share_outcome(ch_dp *dp, ch_status st, const char *fn, double loss, int64_t correct,
                           int checked, int64_t step);
ch_status dp_check_every_rank_has_samples(const ch_dp *dp, const char *fn, int total);
ch_status dp_gather_rows(ch_dp *dp, ch_tensor *out, int total);
report *dp_report_of(const ch_dp *dp, int k);
double *dp_report_seconds(report *p);

#endif
