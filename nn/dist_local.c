/* nn/dist.c's transport in a build without MPI (nn/dist_impl.h): a job of
 * this process alone. nn/dist.c answers every collective of a group of
 * one before it reaches a transport, so the collectives here are never
 * called; they fail, in case that ever changes. */
#include "config.h"

#include "dist_impl.h"

int ch_dist_built(void)
{
    return 0;
}

ch_status dist_join(ch_dist *world, int *argc, char ***argv, double timeout)
{
    (void)argc;
    (void)argv;
    *world = (ch_dist){.rank = 0, .size = 1, .local_rank = 0, .local_size = 1, .timeout = timeout};
    return CH_OK;
}

ch_status dist_leave(ch_dist *world)
{
    (void)world;
    return CH_OK;
}

ch_status dist_comm_open(nn_comm *c)
{
    (void)c;
    return CH_OK;
}

void dist_comm_close(nn_comm *c)
{
    (void)c;
}

/* Never reached: a group of one returns before any of these. */
static ch_status no_mpi(const char *what)
{
    return chi_error(CH_ERR_INTERNAL,
                     "%s: a collective across processes in a build without "
                     "MPI",
                     what);
}

ch_status dist_barrier_on(const ch_dist *d, const char *what)
{
    (void)d;
    return no_mpi(what);
}

ch_status dist_bcast_on(const ch_dist *d, dist_comm_t comm, void *data, size_t bytes, int root,
                        const char *what)
{
    (void)d, (void)comm, (void)data, (void)bytes, (void)root;
    return no_mpi(what);
}

ch_status dist_sum_on(const ch_dist *d, dist_comm_t comm, void *values, int64_t n, int f64,
                      const char *what)
{
    (void)d, (void)comm, (void)values, (void)n, (void)f64;
    return no_mpi(what);
}

ch_status dist_sum_bf16_on(const ch_dist *d, dist_comm_t comm, dist_scratch *s, uint16_t *values,
                           int64_t n, const char *what)
{
    (void)d, (void)comm, (void)s, (void)values, (void)n;
    return no_mpi(what);
}

ch_status dist_reduce_scatter_on(const ch_dist *d, dist_comm_t comm, dist_scratch *s, float *values,
                                 const int64_t *first, const int64_t *count, const char *what)
{
    (void)d, (void)comm, (void)s, (void)values, (void)first, (void)count;
    return no_mpi(what);
}

ch_status dist_gather_on(const ch_dist *d, dist_comm_t comm, const void *mine, void *all,
                         size_t bytes, const char *what)
{
    (void)d, (void)comm, (void)mine, (void)all, (void)bytes;
    return no_mpi(what);
}
