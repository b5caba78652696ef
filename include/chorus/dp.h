/* Chorus: data parallelism, one model replicated over a list of devices. */
#ifndef CHORUS_DP_H
#define CHORUS_DP_H

#include <chorus/data.h>
#include <chorus/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_dp ch_dp;

typedef enum ch_dp_reduce {
    CH_DP_REDUCE_HOST = 0  /* pinned host buffers, summed in a fixed order */
} ch_dp_reduce;

typedef struct ch_dp_options {
    ch_dp_reduce reduce;
    /* Share of the batch per replica: NULL for equal shares, otherwise n
     * positive weights (the batch is split in proportion, every replica
     * getting at least one sample when the batch allows). */
    const float *weights;
    ch_loss_kind loss;
    ch_optimizer_options optimizer;
    /* Shape of one input sample ([1, 28, 28] for the IDX images): see
     * ch_dataset_sample_shape. */
    int sample_ndim;
    int64_t sample_shape[CH_MAX_DIMS];
    uint64_t seed;         /* the dropout stream */
    /* Every check_every steps (0: never), compare a checksum of every
     * replica's parameters with replica 0's: a divergence fails the step
     * with an error naming the replica. */
    int check_every;
} ch_dp_options;

/* Replicas of `model` on each of the n devices (a device may appear more
 * than once), with the parameters of `model` copied to all of them, and one
 * worker thread per replica. `model` stays the caller's and is not changed
 * by training: ch_dp_sync_to copies the trained parameters back. */
CH_API ch_status ch_dp_new(ch_dp **out, const ch_module *model, ch_device *const *devices,
                           int n, const ch_dp_options *options);
/* Stops the workers and frees the replicas. NULL: no-op. */
CH_API void ch_dp_free(ch_dp *dp);

/* One training step on a batch of images [count, C, H, W] (f32) and labels
 * (i32) in host memory: split across the replicas, forward, loss, backward
 * in parallel, gradients weighted by each replica's share so that their sum
 * is the gradient of the whole batch's mean loss, reduced, and the same
 * optimizer update on every replica at learning rate `lr`. *loss gets the
 * whole batch's mean loss. A failure on any replica ends the step on all of
 * them and is returned. */
CH_API ch_status ch_dp_step(ch_dp *dp, const ch_batch *batch, float lr, float *loss);

/* How the last step went: samples per replica and each replica's seconds
 * (its whole step, waiting included); either array may be NULL. */
CH_API ch_status ch_dp_last_step(const ch_dp *dp, int *counts, double *seconds, int n);

/* The optimizer of replica `index` (for checkpoints: every replica's state
 * is the same). */
CH_API ch_optimizer *ch_dp_optimizer(const ch_dp *dp, int index);

/* Copy the parameters of replica 0 into `model` (same structure). */
CH_API ch_status ch_dp_sync_to(const ch_dp *dp, ch_module *model);

/* The replica on devices[index]. */
CH_API ch_module *ch_dp_replica(const ch_dp *dp, int index);

#ifdef __cplusplus
}
#endif

#endif
