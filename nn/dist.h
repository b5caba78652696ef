/* nn's collectives across the processes of a job (nn/dist.c), for data
 * parallelism. Private to nn/.
 *
 * An nn_comm is a duplicate of the job's communicator for the calls of one
 * thread at a time (the reducer's buckets, BatchNorm's statistics, the
 * calling thread's step): collectives of different threads never meet on
 * one communicator, so every process issues each communicator's calls in
 * the same order. Every call waits with the watchdog (ch_dist_timeout) and
 * fails with CH_ERR_REMOTE when it runs out; `what` names the call in the
 * messages. With a group of one process (or no MPI) they do nothing. */
#ifndef CHORUS_NN_DIST_H
#define CHORUS_NN_DIST_H

#include <stddef.h>
#include <stdint.h>

#include <chorus/dist.h>

typedef struct nn_comm nn_comm;

/* A communicator over the group `d` (NULL: this process alone). Collective:
 * every process of the group calls it, in the same order. */
ch_status nn_comm_new(nn_comm **out, ch_dist *d);
void nn_comm_free(nn_comm *c);

int nn_comm_size(const nn_comm *c);

/* In place: the sum over the processes, the same bits on each. */
ch_status nn_comm_sum_f32(nn_comm *c, float *values, int64_t n, const char *what);
ch_status nn_comm_sum_f64(nn_comm *c, double *values, int64_t n, const char *what);
/* In place, bf16 values: as ch_dist_sum_bf16. */
ch_status nn_comm_sum_bf16(nn_comm *c, uint16_t *values, int64_t n, const char *what);
/* In place: each process k's window of `values`, [first[k], + count[k])
 * (every process passes the same first[] and count[], one entry per
 * process), gets the sum over the processes of that window, taken in
 * rank order (values of rank 0 + rank 1 + ...); the rest of `values` is
 * left as it was. Each process sends the others' windows and receives
 * its own: a reduce-scatter. */
ch_status nn_comm_reduce_scatter_f32(nn_comm *c, float *values, const int64_t *first,
                                     const int64_t *count, const char *what);
/* `bytes` at `data` on `root` to every process. */
ch_status nn_comm_bcast(nn_comm *c, void *data, size_t bytes, int root, const char *what);
/* Each process's `bytes` at `mine` into all[rank * bytes]. */
ch_status nn_comm_allgather(nn_comm *c, const void *mine, void *all, size_t bytes,
                            const char *what);

#endif
