/* What nn/dist.c (the checks and the calls both builds share) and the
 * build's transport share: nn/dist_mpi.c with MPI, nn/dist_local.c without
 * (a job of this process alone). Automake builds one of the two
 * (nn/Makefile.mk, HAVE_MPI). Private to those files.
 *
 * The shared file checks arguments and returns early for a group of one,
 * so the transport's calls below run only with two or more processes. */
#ifndef CHORUS_NN_DIST_IMPL_H
#define CHORUS_NN_DIST_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "dist.h"
#include "nn.h"

/* The communicator handle: MPI's with MPI, a placeholder without (every
 * group has one process and no collective reaches a transport). The one
 * place the build's choice shows outside the transport's file. */
#ifdef HAVE_MPI
#include <mpi.h>
typedef MPI_Comm dist_comm_t;
#else
typedef int dist_comm_t;
#endif

/* What the bf16 sum across processes keeps between calls. */
typedef struct dist_scratch {
    void *mem;
    size_t bytes;
} dist_scratch;

struct ch_dist {
    dist_comm_t comm; /* the calls of ch_dist_* */
    int rank, size, local_rank, local_size;
    double timeout;
    dist_scratch scratch;
};

struct nn_comm {
    ch_dist *d;
    dist_comm_t comm;
    dist_scratch scratch;
};

/* ---- The transport (nn/dist_mpi.c or nn/dist_local.c) ---------------------- */

/* Joins the job into *world (rank, sizes, its communicator), the
 * watchdog's `timeout` given; on failure nothing is left joined. */
ch_status dist_join(ch_dist *world, int *argc, char ***argv, double timeout);
/* Leaves the job joined by dist_join. */
ch_status dist_leave(ch_dist *world);
/* A communicator of its own for `c` (c->d set), over c->d's group. */
ch_status dist_comm_open(nn_comm *c);
void dist_comm_close(nn_comm *c);

/* The collectives on `comm` over d's group, within d's watchdog; `what`
 * names the call in the messages. */
ch_status dist_barrier_on(const ch_dist *d, const char *what);
ch_status dist_bcast_on(const ch_dist *d, dist_comm_t comm, void *data, size_t bytes, int root,
                        const char *what);
/* The sum in place, f64 when `f64`, else f32. */
ch_status dist_sum_on(const ch_dist *d, dist_comm_t comm, void *values, int64_t n, int f64,
                      const char *what);
/* The bf16 sum in place, every process getting the same bits; `s` is
 * scratch the call may grow and keeps. */
ch_status dist_sum_bf16_on(const ch_dist *d, dist_comm_t comm, dist_scratch *s, uint16_t *values,
                           int64_t n, const char *what);
/* nn_comm_reduce_scatter_f32's exchange and rank-ordered sum, `s` as
 * above. */
ch_status dist_reduce_scatter_on(const ch_dist *d, dist_comm_t comm, dist_scratch *s, float *values,
                                 const int64_t *first, const int64_t *count, const char *what);
ch_status dist_gather_on(const ch_dist *d, dist_comm_t comm, const void *mine, void *all,
                         size_t bytes, const char *what);

#endif
