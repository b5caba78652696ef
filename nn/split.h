/* The data-parallel split policy (nn/dp.c): how many samples of a batch
 * each replica gets. Private to nn/; tests/test-split.c builds nn/split.c
 * into itself, so nothing here is exported.
 *
 * A split hands out `total` samples in proportion to one weight per
 * replica: 1 each (equal), the caller's weights, or, once measured, each
 * replica's rate in samples per second of compute (auto). The counts are
 * rounded so that they add up to the total, and every replica gets at
 * least one sample whenever the total allows. An automatic split keeps the
 * previous counts when a new split would move only a few samples. */
#ifndef CHORUS_NN_SPLIT_H
#define CHORUS_NN_SPLIT_H

#include <stdint.h>
#include <chorus.h>

typedef struct nn_split {
    int n;                /* replicas */
    ch_dp_split mode;
    int *count;           /* [n] samples of each replica in the last split */
    int *start;           /* [n] its first sample in the batch */
    double *seconds;      /* [n] the caller's: each replica's compute time for
                             its count, read by nn_split_measure */
    /* private */
    double *weight;       /* [n] fixed shares: the weights, or 1 each */
    double *rate;         /* [n] auto: smoothed samples per second, 0 until measured */
    double *w;            /* [n] scratch: the weights of a split being made */
    int *fresh;           /* [n] scratch: the counts of a split being made */
    int *out;             /* [n] left out (nn_split_leave_out): no samples */
    int64_t measures;     /* nn_split_measure calls so far */
    void *mem;            /* the one allocation behind every array */
} nn_split;

/* A split of `n` replicas; `weights` ([n], each positive and finite) for
 * CH_DP_SPLIT_WEIGHTS, ignored otherwise. Every count starts at 0.
 * CH_ERR_INVALID_ARGUMENT for n < 1, an unknown mode or missing weights,
 * CH_ERR_OUT_OF_MEMORY; *s is then empty (nn_split_free is a no-op on it). */
ch_status nn_split_init(nn_split *s, int n, ch_dp_split mode, const float *weights);
void nn_split_free(nn_split *s);

/* Share out `total` >= 0 samples: s->count and s->start. Never fails. */
void nn_split_batch(nn_split *s, int total);

/* Replica i gets no samples from the next split on (a device too small
 * for one); returns 0 (and changes nothing) when it is out already, out
 * of range or the last replica in. */
int nn_split_leave_out(nn_split *s, int i);

/* Auto: replica i took s->seconds[i] of compute for its s->count[i]
 * samples of the last split; its rate follows, smoothed over calls. The
 * first call is not a measure (kernels compile, caches fill); a replica
 * without samples or time keeps its rate, and one never measured gets the
 * mean of the others. No-op for fixed modes. */
void nn_split_measure(nn_split *s);

#endif
