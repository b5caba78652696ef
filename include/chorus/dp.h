/* Chorus: data parallelism, one model replicated over a list of devices. */
#ifndef CHORUS_DP_H
#define CHORUS_DP_H

#include <chorus/data.h>
#include <chorus/dist.h>
#include <chorus/nn.h>
#include <chorus/reduce.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_dp ch_dp;

/* How a step splits the batch over the replicas. */
typedef enum ch_dp_split {
    CH_DP_SPLIT_EQUAL = 0,   /* equal shares (the remainder to the first replicas) */
    CH_DP_SPLIT_WEIGHTS = 1, /* in proportion to options->weights */
    CH_DP_SPLIT_AUTO = 2     /* balanced from each replica's measured time per sample,
                                so that they finish their compute together */
} ch_dp_split;

/* options->bucket_bytes: try bucket sizes of 1, 4, 16 and 64 MiB (those
 * that cut the model differently), each for a few training steps, and
 * keep the one whose reduction is the least exposed after backward (the
 * slowest process's, across processes), as Horovod's autotune does for its
 * fusion buffer. The sum of a step's gradients does not depend on the
 * buckets with host-staged reduction: the trained result is the same. */
#define CH_DP_BUCKET_AUTO ((size_t)-1)

/* Where a replica's last training step went (ch_dp_last_breakdown), in
 * seconds on the host's clock: compute + wait + exposed + update is the
 * whole call (`step`, ch_dp_step as the caller saw it), cut at the
 * replica's own points: when its worker began, when its backward ended,
 * when the last backward of the process ended, when the reduction did. */
typedef struct ch_dp_breakdown {
    double step;    /* the training call, as the caller saw it */
    double compute; /* its upload, forward, loss and backward */
    double wait;    /* idle: until its worker thread began the call, until
                       this process's last backward ended, and inside
                       BatchNorm's exchanges (waiting for other processes
                       shows in `exposed`) */
    double exposed; /* the reduction after the slowest backward ended */
    double update;  /* from the end of the reduction to the call's return:
                       the optimizer, the last sync, the results shared */
    int slowest;    /* its compute was the longest of the job's replicas */
} ch_dp_breakdown;

typedef struct ch_dp_options {
    /* Gradient reduction (chorus/reduce.h): CH_REDUCE_HOST (the default,
     * 0), CH_REDUCE_PEER or CH_REDUCE_AUTO. */
    ch_reduce_mode reduce;
    ch_dp_split split;
    /* CH_DP_SPLIT_WEIGHTS: nweights (== the number of devices) positive
     * weights; every replica gets at least one sample when the batch
     * allows. Ignored otherwise. */
    const float *weights;
    int nweights;
    /* Gradients are reduced in buckets of about this many bytes (0: 25 MiB),
     * in reverse parameter order: a bucket is reduced as soon as backward
     * has produced all of its gradients on every replica, while backward
     * goes on with the earlier layers. CH_DP_BUCKET_AUTO: measured over the
     * first training steps (ch_dp_bucket_bytes). */
    size_t bucket_bytes;
    /* Gradient accumulation: ch_dp_step reduces and updates once every
     * `accumulate` calls (0 or 1: every call); the calls in between only
     * add their micro-batch's gradient (DDP's no_sync). */
    int accumulate;
    ch_loss_kind loss;
    ch_optimizer_options optimizer;
    /* Shape of one input sample ([1, 28, 28] for the IDX images): see
     * ch_dataset_sample_shape. */
    int sample_ndim;
    int64_t sample_shape[CH_MAX_DIMS];
    /* The inputs' dtype: CH_F32 (images, the default 0) or CH_I32 (tokens:
     * a language model's windows, sample_shape [context]). */
    ch_dtype sample_dtype;
    /* Labels per sample: 0 or 1 for a class per image; a language model
     * has one per token (context). A batch's labels buffer holds count *
     * labels_per_sample i32; the loss is the mean over all of them, and
     * ch_dp_evaluate counts correct labels. */
    int64_t labels_per_sample;
    /* BatchNorm layers normalise with the statistics of the whole batch,
     * summed over the replicas inside forward and backward (0, the
     * default: a data-parallel step equals the one-device step on the
     * whole batch, to rounding), or with each replica's own (1: PyTorch
     * DDP's default, without SyncBatchNorm). Either way the running
     * statistics are replica 0's: the others get a copy before they
     * evaluate or predict, as DDP broadcasts buffers. */
    int batchnorm_local;
    uint64_t seed;         /* the dropout stream */
    /* Every check_every steps (0: never), compare a checksum of every
     * replica's parameters with replica 0's: a divergence fails the step
     * with an error naming the replica. */
    int check_every;
    /* Bind each worker thread to the CPUs near its device (hwloc); 0 binds,
     * 1 leaves the threads where the system puts them. */
    int no_bind;
    /* The processes the training spans (chorus/dist.h): NULL, or a group
     * of one process, is this process alone. Every process of the group
     * makes its dp with the same model and options (its own devices, and
     * its own weights for them), and then makes every ch_dp_* call in the
     * same order with the same batches: a batch is the job's whole batch,
     * split over the replicas of all processes in rank order (the lower
     * ranks' replicas first) by the split policy, and each process trains
     * its own replicas' slices. Gradients are reduced inside the process,
     * then across the processes on the host (ch_reducer_set_stage), and
     * BatchNorm's statistics likewise; the loss, the evaluation's counts and
     * every failure are shared by all processes at the end of each call.
     * ch_dp_new broadcasts rank 0's parameters and buffers to every
     * process. */
    ch_dist *dist;
    /* Mixed precision (ch_module_set_precision on every replica): CH_F32
     * (0, the default), CH_BF16 or CH_F16. Master weights, gradients and
     * the optimizer's state stay f32. With CH_F16 the loss is scaled
     * dynamically, as PyTorch's GradScaler does it: the loss's gradient is
     * multiplied by the scale, the reduced gradients divided by it; a step
     * whose gradients hold an infinity or a NaN is skipped (parameters and
     * optimizer untouched) and halves the scale, and every
     * loss_scale_interval clean steps in a row double it. */
    ch_dtype precision;
    float loss_scale;        /* CH_F16: the first scale (0: 65536) */
    int loss_scale_interval; /* CH_F16: clean steps before it grows (0: 2000) */
    /* The gradients' reduction through the host in bf16 (CH_BF16: half the
     * bytes moved, to and from the devices and across processes, summed in
     * f32 in a fixed order; ch_reducer_set_dtype, ch_dist_sum_bf16) or f32
     * (CH_F32, 0, the default). The master gradients stay f32. */
    ch_dtype reduce_dtype;
    /* ZeRO stage 1: each replica (of every process) keeps the optimizer's
     * state of its own part of the parameters only, a contiguous range of
     * their elements in parameter order, sized in proportion to each
     * device's memory limit (ch_device_set_memory_limit; equal parts when
     * a device has none). After the reduction each replica updates its part
     * and the updated parameters are gathered to every replica. 0 (the
     * default): every replica keeps the whole state. Checkpoints go
     * through ch_dp_optimizer_get and ch_dp_optimizer_set. */
    int shard_optimizer;
    /* Per-device memory limits in bytes, one per device in `devices`'
     * order (0: leave that device's limit as it is), set with
     * ch_device_set_memory_limit by ch_dp_new; NULL: the devices' own. A
     * device under a limit holds one replica (ch_dp_micro_batches). */
    const uint64_t *memory_limits;
    int nmemory_limits;
    /* Recompute activations (ch_module_set_recompute on every replica):
     * each GPT block and ResNet stage keeps only its input in forward and
     * runs its forward again in backward. */
    int recompute;
    /* Elastic data parallelism inside this process: when a replica's
     * device fails during a call (its backend reports CH_ERR_DRIVER or
     * CH_ERR_UNAVAILABLE, and the device then fails a small probe), or
     * stops answering (the call has run elastic_timeout seconds and the
     * device does not answer a probe within a second), the call's partial
     * work is dropped, the replica removed, and the call made again over
     * the devices left, from the parameters, buffers and optimizer state
     * of the first replica left: the step is that of a run over those
     * devices alone from this step on (the automatic split measures
     * again). A failure inside the optimizer update, after every replica
     * left has updated, keeps the update and is not made again. A lost
     * device rejoins through ch_dp_rejoin. ch_dp_changes says what was
     * lost and when. One process only (across processes, chorus-elastic
     * restarts a job from its checkpoint), without shard_optimizer and
     * with accumulate 1: ch_dp_new refuses the others with
     * CH_ERR_UNSUPPORTED. A replica that stopped answering leaves its
     * thread and its device's memory behind until the device answers. */
    int elastic;
    double elastic_timeout; /* seconds (0: 60) */
} ch_dp_options;

/* What an elastic dp lost or took back (ch_dp_changes). */
typedef struct ch_dp_change {
    int64_t step;    /* the training step it happened in (1: the first) */
    int rejoined;    /* 0: the device was lost; 1: it rejoined */
    int replicas;    /* the replicas after it */
    double seconds;  /* what it cost: from the failure seen (the timeout's
                         start for a device that stopped answering) until the
                         replicas were made again; for a rejoin, the rejoin */
    char device[64]; /* ch_device_id */
    char cause[512]; /* a loss: the failure, as the call would have returned it */
} ch_dp_change;

/* Replicas of `model` on each of the n devices (a device may appear more
 * than once), with the parameters of `model` copied to all of them, one
 * worker thread per replica and a thread that reduces the gradients (with
 * one device, the calling thread does the work and there is nothing to
 * reduce). `model` stays the caller's and is not changed by training:
 * ch_dp_sync_to copies the trained parameters back. Fails with
 * CH_ERR_UNSUPPORTED when options->reduce cannot work on these devices. */
CH_API ch_status ch_dp_new(ch_dp **out, const ch_module *model, ch_device *const *devices,
                           int n, const ch_dp_options *options);
/* Stops the workers and frees the replicas. NULL: no-op. */
CH_API void ch_dp_free(ch_dp *dp);

/* One training step on a batch of samples [count, ...] (f32) and labels
 * (i32) in host memory: split across the replicas, forward, loss, backward
 * in parallel, gradients weighted by each replica's share so that their sum
 * is the gradient of the whole batch's mean loss, reduced, and the same
 * optimizer update on every replica at learning rate `lr`. *loss gets the
 * whole batch's mean loss. A failure on any replica ends the step on all of
 * them and is returned; the gradients accumulated so far are dropped.
 *
 * With options->accumulate = k, the batch is a micro-batch: the first k - 1
 * calls add its gradient (scaled by 1/k) and return, the k-th reduces and
 * updates. Micro-batches of equal size then give the update of one step on
 * their concatenation. */
CH_API ch_status ch_dp_step(ch_dp *dp, float *loss, const ch_batch *batch, float lr);

/* Micro-batches accumulated since the last update (0 when none). */
CH_API int ch_dp_pending(const ch_dp *dp);

/* Reduce and apply what was accumulated (the end of an epoch that did not
 * fill the last accumulation), the gradient rescaled to the mean over the
 * micro-batches there are. No-op when nothing is pending. */
CH_API ch_status ch_dp_flush(ch_dp *dp, float lr);

/* Evaluation over the replicas, each on its share, in evaluation mode
 * (dropout off): `out` ([count, outputs], f32, on any device) gets the
 * model's outputs for the batch, in batch order. */
CH_API ch_status ch_dp_predict(ch_dp *dp, ch_tensor *out, const ch_batch *batch);

/* The batch's mean loss and the number of samples whose largest output is
 * the label, computed over the replicas in evaluation mode. Either output
 * may be NULL. */
CH_API ch_status ch_dp_evaluate(ch_dp *dp, float *loss, int64_t *correct,
                                const ch_batch *batch);

/* How the last step went: samples per replica, each replica's seconds
 * (its whole step, waiting included) and its compute seconds (forward and
 * backward, without the waits for the other replicas' BatchNorm
 * statistics); any array may be NULL. */
/* The dynamic loss scale (options->precision CH_F16; 1 otherwise), the
 * clean steps in a row since it last changed, and the steps skipped for an
 * overflow so far; any output may be NULL. ch_dp_set_loss_scale restores
 * the first two (a checkpoint's), so that a resumed run scales as the
 * straight one would have; CH_ERR_INVALID_ARGUMENT for a scale that is not
 * a positive finite number or a negative count, CH_ERR_STATE without
 * CH_F16. */
CH_API ch_status ch_dp_loss_scale(const ch_dp *dp, float *scale, int *clean_steps,
                                  int64_t *skipped);
CH_API ch_status ch_dp_set_loss_scale(ch_dp *dp, float scale, int clean_steps);

CH_API ch_status ch_dp_last_step(const ch_dp *dp, int *counts, double *seconds, int n);
CH_API ch_status ch_dp_last_compute(const ch_dp *dp, double *seconds, int n);

/* Seconds the last step's gradient reduction ran while a replica was
 * still in its forward or backward pass: how much of the reduction the
 * buckets hid behind backward (0 when none did, or nothing was reduced). */
CH_API double ch_dp_last_overlap(const ch_dp *dp);

/* The last training call's breakdown per replica (`n` of them: this
 * process's). Zeros before the first. */
CH_API ch_status ch_dp_last_breakdown(const ch_dp *dp, ch_dp_breakdown *out, int n);

/* For each of this process's `n` replicas, how many training calls it was
 * the slowest of (its compute the longest of the job's replicas), and in
 * *calls the training calls measured; either output may be NULL. */
CH_API ch_status ch_dp_slowest_counts(const ch_dp *dp, int64_t *counts, int n, int64_t *calls);

/* Micro-batches sized by memory. A replica whose device has a memory limit
 * (ch_device_set_memory_limit, options->memory_limits) trains its share of
 * each batch in micro-batches that fit it: its first training call runs
 * passes of 1 and 2 samples, measures the device's peak after each (what a
 * sample adds, what a pass takes), and sizes the rest to what the limit
 * leaves beside the parameters, the gradients and the optimizer's state
 * (with a tenth to spare); the passes' gradients add up before the
 * reduction, each weighted by its samples, so the step's gradient is the
 * whole batch's mean as without them. A replica whose first pass of one
 * sample does not fit is left out (it gets no samples from then on; in one
 * process only: across processes the call fails, naming the device) and
 * the call runs again without it; ch_dp_note says so. A limited device
 * holds one replica, and BatchNorm's statistics must be each replica's
 * own (options->batchnorm_local): ch_dp_new refuses others with
 * CH_ERR_UNSUPPORTED.
 *
 * For each of this process's `n` replicas: the samples per micro-batch
 * (0 without a limit, or before the first training call), the
 * micro-batches of its last training call, whether it is left out. Any
 * array may be NULL. */
CH_API ch_status ch_dp_micro_batches(const ch_dp *dp, int *size, int *count, int *left_out, int n);
/* The last thing the dp decided on its own that a user should hear of
 * (a replica left out), "" when none: for logs. NULL dp: "". */
CH_API const char *ch_dp_note(const ch_dp *dp);

/* The bucket size in bytes now, and in *tuning (may be NULL) 1 while
 * CH_DP_BUCKET_AUTO is still measuring, else 0. 0 for a NULL dp. */
CH_API size_t ch_dp_bucket_bytes(const ch_dp *dp, int *tuning);

/* What a dp was made with, after the defaults: the reduction, the groups
 * it reduces peer-to-peer in, the buckets, and whether worker `index` was
 * bound to its device's CPUs. */
CH_API ch_reduce_mode ch_dp_reduce_mode(const ch_dp *dp);
CH_API int ch_dp_bucket_count(const ch_dp *dp);
CH_API int ch_dp_bound(const ch_dp *dp, int index);

/* The optimizer of replica `index` (every replica's state is the same
 * without options->shard_optimizer; with it, each holds its part only).
 * Borrowed: it belongs to dp. For checkpoints, ch_dp_optimizer_get and
 * ch_dp_optimizer_set work either way. */
CH_API ch_optimizer *ch_dp_optimizer(const ch_dp *dp, int index);

/* The job's whole optimizer state into `opt`, an optimizer of the same
 * kind made (ch_optimizer_new) for a model of the same structure, on any
 * device (the caller's model, for ch_checkpoint_save): each part from its
 * replica, and its step count. A state no step has made yet is left out
 * (opt then has none, as ch_optimizer_state says). Across processes a
 * collective: every process calls it, and each gets the whole. */
CH_API ch_status ch_dp_optimizer_get(ch_dp *dp, ch_optimizer *opt);
/* Every replica's optimizer state from `opt` (whole, as
 * ch_checkpoint_load fills it): each replica takes its part, or the whole
 * without sharding, and the step count. A state opt does not have is left
 * as it is. Not a collective: each process gives its own copy. */
CH_API ch_status ch_dp_optimizer_set(ch_dp *dp, const ch_optimizer *opt);

/* The elements of the parameters (concatenated in parameter order) whose
 * optimizer state replica `index` keeps: [*first, *first + *count); all of
 * them without options->shard_optimizer. Either output may be NULL. */
CH_API ch_status ch_dp_shard(const ch_dp *dp, int index, int64_t *first, int64_t *count);

/* Elastic data parallelism (options->elastic). The replicas now: their
 * count (0 for a NULL dp) and the device of replica `index` (NULL out of
 * range); the indices of the other queries follow this order, which is
 * that of ch_dp_new's devices without the lost ones. */
CH_API int ch_dp_replica_count(const ch_dp *dp);
CH_API ch_device *ch_dp_device(const ch_dp *dp, int index);
/* The changes so far, oldest first: up to `cap` into out (may be NULL
 * with cap 0); returns how many there were (0 without options->elastic). */
CH_API int ch_dp_changes(const ch_dp *dp, ch_dp_change *out, int cap);
/* Between steps (at an epoch boundary): probe every lost device, and make
 * the replicas again over ch_dp_new's devices with those that answer,
 * each receiving the parameters, buffers and optimizer state of the
 * replicas that trained on. *rejoined (may be NULL) gets how many did. A
 * failure leaves the dp as it was (CH_ERR_STATE without
 * options->elastic). */
CH_API ch_status ch_dp_rejoin(ch_dp *dp, int *rejoined);

/* Copy the parameters and buffers of replica 0 into `model` (same
 * structure). */
CH_API ch_status ch_dp_sync_to(const ch_dp *dp, ch_module *model);

/* The replica on devices[index], with replica 0's running statistics
 * (copied to it first; NULL when that copy fails, or index is out of
 * range). Borrowed: it belongs to dp. */
CH_API ch_module *ch_dp_replica(const ch_dp *dp, int index);

#ifdef __cplusplus
}
#endif

#endif
