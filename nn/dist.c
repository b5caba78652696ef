/* The job's processes (chorus/dist.h) and nn's collectives across them
 * (nn/dist.h): the checks, the answers for a group of one, and the state
 * both builds share. The transport is the build's: nn/dist_mpi.c with
 * MPI, nn/dist_local.c without (nn/dist_impl.h). */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dist_impl.h"

#define DEFAULT_TIMEOUT 60.0

static ch_dist world;
static int joined;

int ch_dist_launched(void)
{
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
                                       "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v)
            return 1;
    }
    return 0;
}

/* CHORUS_DIST_TIMEOUT, or the default. */
static ch_status timeout_from_env(double *out)
{
    *out = DEFAULT_TIMEOUT;
    const char *env = getenv("CHORUS_DIST_TIMEOUT");
    if (!env || !*env)
        return CH_OK;
    char *end;
    errno = 0;
    double v = strtod(env, &end);
    if (errno || *end || !(v > 0.0) || v > 1e9)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dist_init: CHORUS_DIST_TIMEOUT is "
                         "\"%.32s\", expected a number of seconds > 0", env);
    *out = v;
    return CH_OK;
}

ch_status ch_dist_init(int *argc, char ***argv)
{
    if (joined)
        return chi_error(CH_ERR_STATE, "ch_dist_init: the job was joined already; call "
                         "ch_dist_finalize first");
    double timeout;
    TRY(timeout_from_env(&timeout));
    TRY(dist_join(&world, argc, argv, timeout));
    joined = 1;
    return CH_OK;
}

ch_status ch_dist_finalize(void)
{
    if (!joined)
        return CH_OK;
    joined = 0;
    ch_status st = dist_leave(&world);
    free(world.scratch.mem);
    world.scratch = (dist_scratch){0};
    return st;
}

ch_status ch_dist_barrier(ch_dist *d)
{
    if (ch_dist_size(d) == 1)
        return CH_OK;
    return dist_barrier_on(d, "ch_dist_barrier");
}

ch_status nn_comm_new(nn_comm **out, ch_dist *d)
{
    nn_comm *c = calloc(1, sizeof *c);
    if (!c)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "out of memory for a communicator");
    c->d = d;
    ch_status st = dist_comm_open(c);
    if (st != CH_OK) {
        free(c);
        return st;
    }
    *out = c;
    return CH_OK;
}

void nn_comm_free(nn_comm *c)
{
    if (!c)
        return;
    dist_comm_close(c);
    free(c->scratch.mem);
    free(c);
}

/* ---- The collectives: a group of one needs no transport -------------------- */

ch_status ch_dist_broadcast(ch_dist *d, void *data, size_t bytes, int root)
{
    if (root < 0 || root >= ch_dist_size(d))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dist_broadcast: root is %d, expected a "
                         "rank from 0 to %d", root, ch_dist_size(d) - 1);
    if (!data && bytes)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dist_broadcast: data is NULL");
    if (ch_dist_size(d) == 1 || bytes == 0)
        return CH_OK;
    return dist_bcast_on(d, d->comm, data, bytes, root, "ch_dist_broadcast");
}

/* The checks of ch_dist_sum, ch_dist_sum_f32 and ch_dist_sum_bf16. */
static ch_status sum_args(const char *fn, const void *values, int64_t n)
{
    if (n < 0 || (!values && n))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s", fn,
                         n < 0 ? "n is negative" : "values is NULL");
    return CH_OK;
}

ch_status ch_dist_sum(ch_dist *d, double *values, int n)
{
    TRY(sum_args("ch_dist_sum", values, n));
    if (ch_dist_size(d) == 1 || n == 0)
        return CH_OK;
    return dist_sum_on(d, d->comm, values, n, 1, "ch_dist_sum");
}

ch_status ch_dist_sum_f32(ch_dist *d, float *values, int64_t n)
{
    TRY(sum_args("ch_dist_sum_f32", values, n));
    if (ch_dist_size(d) == 1 || n == 0)
        return CH_OK;
    return dist_sum_on(d, d->comm, values, n, 0, "ch_dist_sum_f32");
}

ch_status ch_dist_sum_bf16(ch_dist *d, uint16_t *values, int64_t n)
{
    TRY(sum_args("ch_dist_sum_bf16", values, n));
    if (ch_dist_size(d) == 1 || n == 0)
        return CH_OK;
    return dist_sum_bf16_on(d, d->comm, &d->scratch, values, n, "ch_dist_sum_bf16");
}

ch_status nn_comm_sum_f32(nn_comm *c, float *values, int64_t n, const char *what)
{
    if (nn_comm_size(c) == 1 || n == 0)
        return CH_OK;
    return dist_sum_on(c->d, c->comm, values, n, 0, what);
}

ch_status nn_comm_sum_bf16(nn_comm *c, uint16_t *values, int64_t n, const char *what)
{
    if (nn_comm_size(c) == 1 || n == 0)
        return CH_OK;
    return dist_sum_bf16_on(c->d, c->comm, &c->scratch, values, n, what);
}

ch_status nn_comm_sum_f64(nn_comm *c, double *values, int64_t n, const char *what)
{
    if (nn_comm_size(c) == 1 || n == 0)
        return CH_OK;
    return dist_sum_on(c->d, c->comm, values, n, 1, what);
}

ch_status nn_comm_reduce_scatter_f32(nn_comm *c, float *values, const int64_t *first,
                                     const int64_t *count, const char *what)
{
    if (nn_comm_size(c) == 1)
        return CH_OK;
    return dist_reduce_scatter_on(c->d, c->comm, &c->scratch, values, first, count, what);
}

ch_status nn_comm_bcast(nn_comm *c, void *data, size_t bytes, int root, const char *what)
{
    if (nn_comm_size(c) == 1 || bytes == 0)
        return CH_OK;
    return dist_bcast_on(c->d, c->comm, data, bytes, root, what);
}

ch_status nn_comm_allgather(nn_comm *c, const void *mine, void *all, size_t bytes,
                            const char *what)
{
    if (nn_comm_size(c) == 1) {
        memmove(all, mine, bytes);
        return CH_OK;
    }
    return dist_gather_on(c->d, c->comm, mine, all, bytes, what);
}

ch_dist *ch_dist_world(void) { return joined ? &world : NULL; }

int ch_dist_rank(const ch_dist *d) { return d ? d->rank : 0; }
int ch_dist_size(const ch_dist *d) { return d ? d->size : 1; }
int ch_dist_local_rank(const ch_dist *d) { return d ? d->local_rank : 0; }
int ch_dist_local_size(const ch_dist *d) { return d ? d->local_size : 1; }

ch_status ch_dist_set_timeout(ch_dist *d, double seconds)
{
    if (!d)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dist_set_timeout: d is NULL");
    if (!(seconds > 0.0) || seconds > 1e9)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dist_set_timeout: seconds is %g, "
                         "expected a number > 0", seconds);
    d->timeout = seconds;
    return CH_OK;
}

double ch_dist_timeout(const ch_dist *d) { return d ? d->timeout : DEFAULT_TIMEOUT; }

int nn_comm_size(const nn_comm *c) { return c ? ch_dist_size(c->d) : 1; }
