/* chorus-train's state while it trains: the trainer, which the driver
 * (utils/chorus-train.c) fills and steps and its reports
 * (utils/report.c) read, and the process's place in an MPI job. */
#ifndef CHORUS_TRAIN_TRAINER_H
#define CHORUS_TRAIN_TRAINER_H

#include <chorus.h>
#include <stdint.h>
#include <stdio.h>

#include "train-options.h"

/* Under mpirun: this process's rank and the job's size (0 and 1 alone).
 * Rank 0 alone reports usage errors, progress and results, and writes the
 * log and the checkpoints. Set by main (utils/chorus-train.c). */
extern int g_rank, g_ranks;

typedef struct trainer {
    const train_options *o;
    ch_device *dev;      /* the first device: pinned buffers */
    ch_device *devs[64]; /* a device listed twice holds two replicas */
    int ndev;
    char label[64][48]; /* each replica's device, numbered when replicas share it */
    int sharing[64];    /* replicas on each one's device */
    ch_dp *dp;          /* a replica per entry of --devices, a single one included */
    ch_module *model;   /* the initialised (or resumed) model the replicas copy */
    ch_dataset *train, *test;
    ch_dataset *full;       /* the whole training set when --limit takes its head */
    ch_idx_options norm;    /* the inputs' normalisation, for both sets */
    ch_train_state resumed; /* where --resume goes on from */
    ch_loader *loader;
    ch_tokens *tok_train, *tok_val;   /* gpt */
    ch_host_buffer *tok_in, *tok_out; /* a batch of windows and their targets */
    ch_batch lm_batch;
    /* Batches per epoch; the next one to assemble and its epoch (kept
     * here: validation fills lm_batch with epoch 0's windows). */
    int64_t lm_batches, lm_next, lm_epoch;
    double val_loss; /* the last validation loss, NAN before */
    float last_loss; /* the last training batch's */
    FILE *log;
    int tty;
    int shown;      /* columns of the progress line on the screen */
    int signalled;  /* SIGINT or SIGTERM stopped training (0: none) */
    int bad_reduce; /* ch_dp_new refused --reduce, --elastic or --device-memory here */
    /* --device-memory's devices this process trains on (NULL: another
     * process's), in the order of its entries. */
    ch_device *limited[TRAIN_MAX_LIMITS];
    /* Each device once, in --devices' order, and its memory over training
     * (the peaks since training started). */
    ch_device *mem_devs[64];
    ch_memory_stats mem[64];
    int nmem;
    int64_t step;
    ch_lr_schedule lr;       /* by optimizer step, over all the epochs */
    ch_optimizer_options oo; /* the replicas' optimizer */
    /* --elastic: the changes ch_dp_changes has that were told, the
     * devices each left (gone[i]: t->devs[i] is lost), where the dp's
     * steps start (a resumed run's dp counts from 1 again), and the
     * changes' JSON records for --json's result. */
    struct {
        int told;
        unsigned char gone[64];
        int64_t base;
        char *json;
        size_t len, cap;
    } el;
    struct {                      /* where the steps' time went, summed (ch_dp_last_breakdown) */
        ch_dp_breakdown last[64]; /* by replica now (replicas_now) */
        double compute[64], wait[64], update[64];
        double step, exposed, stall, last_stall;
        int64_t calls;
        int said_bucket; /* --bucket-mb auto's choice was told */
    } bd;
} trainer;

/* The replicas now: their count (below t->ndev once --elastic lost a
 * device) and in map[i] the index in t->devs (and t->label, t->sharing)
 * of replica i, the index the per-replica ch_dp_* queries use. The dp
 * keeps --devices' order without the lost devices. */
static inline int replicas_now(const trainer *t, int *map)
{
    int n = ch_dp_replica_count(t->dp);
    if (n > t->ndev)
        n = t->ndev;
    for (int i = 0, j = 0; i < n; i++, j++) {
        const ch_device *d = ch_dp_device(t->dp, i);
        int k = j;
        while (k < t->ndev && t->devs[k] != d)
            k++;
        j = k < t->ndev ? k : i; /* not found: cannot be, keep the order */
        map[i] = j;
    }
    return n;
}

#endif
