/* nn/dist.c's transport on MPI (nn/dist_impl.h): joining and leaving the
 * job, communicators, and the collectives for groups of two or more.
 *
 * Every collective is started non-blocking and completed by polling
 * MPI_Test against the watchdog's deadline, so that a process that crashed
 * or hangs costs the others an error after ch_dist_timeout seconds, not a
 * hang. The polls of all threads go through one mutex: MPI then needs only
 * MPI_THREAD_SERIALIZED, and no thread blocks inside MPI while another
 * waits to make progress. Errors come back as statuses: every
 * communicator has MPI_ERRORS_RETURN. */
#include "config.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "bf16_sum.h"
#include "dist_impl.h"

static int we_started_mpi;

int ch_dist_built(void)
{
    return 1;
}

static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

/* An MPI error code as a status with MPI's own words. */
static ch_status mpi_error(int code, const char *fn, const char *what)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "error %d", code);
    return chi_error(CH_ERR_REMOTE, "%s: %s failed: %s", what, fn, text);
}

/* Between two tests of a request that has waited `waited` seconds: yield
 * the CPU for the first 0.2 s (MPI progresses only inside MPI calls, and a
 * message of tens of MiB takes tens of ms), then sleep 0.1 ms, since
 * whatever is that late is waiting for another process. */
static void pause_poll(double waited)
{
    if (waited < 0.2) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 100000L};
    nanosleep(&ts, NULL);
}

/* ---- Who answers: a responder thread in every process ---------------------
 * When a collective runs out of the watchdog's time, the process asks every
 * other one, on a communicator of its own, whether it is there: a thread
 * in each process (started by ch_dist_init, asleep between 5 ms polls)
 * answers, wherever the process's other threads are. A process that does
 * not answer within PING_SECONDS is stopped, hung in the system, or gone;
 * one that answers has not reached the collective yet. */

#define TAG_PING 1  /* token >= 0; -1 from the process itself: stop */
#define TAG_PONG 16 /* + the ping's token */
#define PING_SECONDS 2.0

static MPI_Comm hb_comm;
static pthread_t hb_thread;
static int hb_started;
static int ping_token; /* under mpi_lock */

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

/* Polls `req` every `ns` nanoseconds; 1 when it completed, 0 when `limit`
 * seconds (<= 0: none) passed first or MPI failed. */
static int poll_req(MPI_Request *req, MPI_Status *status, long ns, double limit)
{
    double end = ch_clock_seconds() + limit;
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&mpi_lock);
        int e = MPI_Test(req, &done, status ? status : MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS)
            return 0;
        if (done)
            return 1;
        if (limit > 0 && ch_clock_seconds() > end)
            return 0;
        nap(ns);
    }
}

static void *responder(void *arg)
{
    (void)arg;
    for (;;) {
        int token = 0;
        MPI_Request req;
        MPI_Status status;
        pthread_mutex_lock(&mpi_lock);
        /* Pings only: the answers to this process's own pings, on
         * another tag, go to the thread that asked. */
        int e = MPI_Irecv(&token, 1, MPI_INT, MPI_ANY_SOURCE, TAG_PING, hb_comm, &req);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS || !poll_req(&req, &status, 5000000L, 0.0))
            return NULL;
        if (token < 0)
            return NULL; /* ch_dist_finalize */
        int answer = token;
        pthread_mutex_lock(&mpi_lock);
        e = MPI_Isend(&answer, 1, MPI_INT, status.MPI_SOURCE, TAG_PONG + token, hb_comm, &req);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS || !poll_req(&req, NULL, 1000000L, PING_SECONDS)) {
            pthread_mutex_lock(&mpi_lock);
            if (e == MPI_SUCCESS)
                MPI_Request_free(&req);
            pthread_mutex_unlock(&mpi_lock);
        }
    }
}

/* Into `out`: which processes did not answer a ping within PING_SECONDS. */
static void who_answers(const ch_dist *d, char *out, size_t cap)
{
    int n = d->size;
    MPI_Request *recv = calloc((size_t)n, sizeof *recv), *send = calloc((size_t)n, sizeof *send);
    int *got = calloc((size_t)n, sizeof *got), *answered = calloc((size_t)n, sizeof *answered);
    snprintf(out, cap, "%s", "");
    if (!recv || !send || !got || !answered || !hb_started) {
        free(recv), free(send), free(got), free(answered);
        return;
    }
    pthread_mutex_lock(&mpi_lock);
    int token = ping_token = (ping_token + 1) % 30000;
    for (int k = 0; k < n; k++) {
        recv[k] = send[k] = MPI_REQUEST_NULL;
        if (k == d->rank)
            continue;
        MPI_Irecv(&got[k], 1, MPI_INT, k, TAG_PONG + token, hb_comm, &recv[k]);
        MPI_Isend(&token, 1, MPI_INT, k, TAG_PING, hb_comm, &send[k]);
    }
    pthread_mutex_unlock(&mpi_lock);
    double end = ch_clock_seconds() + PING_SECONDS;
    int missing = n - 1;
    while (missing > 0 && ch_clock_seconds() < end) {
        pthread_mutex_lock(&mpi_lock);
        for (int k = 0; k < n; k++) {
            int done = 0;
            if (k != d->rank && !answered[k] &&
                MPI_Test(&recv[k], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) {
                answered[k] = 1;
                missing--;
            }
        }
        pthread_mutex_unlock(&mpi_lock);
        nap(1000000L);
    }
    size_t len = 0;
    for (int k = 0; k < n; k++) {
        if (k == d->rank || answered[k])
            continue;
        len +=
            (size_t)snprintf(out + len, len < cap ? cap - len : 0, "%s%d", len ? ", " : "rank ", k);
        if (len >= cap)
            break;
    }
    if (missing > 0 && len < cap)
        snprintf(out + len, cap - len,
                 " did not answer within %g s: stopped, hung in the "
                 "system or gone",
                 PING_SECONDS);
    else if (missing == 0)
        snprintf(out, cap,
                 "every other process answers: one of them has not reached this "
                 "call yet (still computing, or failed without telling)");
    /* Unanswered pings and their receives stay with MPI: it has no way to
     * take back a send to a process that is gone. */
    pthread_mutex_lock(&mpi_lock);
    for (int k = 0; k < n; k++) {
        if (recv[k] != MPI_REQUEST_NULL && !answered[k]) {
            MPI_Cancel(&recv[k]);
            MPI_Request_free(&recv[k]);
        }
        if (send[k] != MPI_REQUEST_NULL)
            MPI_Request_free(&send[k]);
    }
    pthread_mutex_unlock(&mpi_lock);
    free(recv), free(send), free(got), free(answered);
}

static ch_status start_responder(const ch_dist *d);

/* Completes `req`, started by the caller, within the watchdog's time. */
static ch_status finish(const ch_dist *d, MPI_Request *req, const char *fn, const char *what)
{
    double start = ch_clock_seconds(), deadline = start + d->timeout;
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&mpi_lock);
        int e = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS)
            return mpi_error(e, fn, what);
        if (done)
            return CH_OK;
        double now = ch_clock_seconds();
        if (now > deadline) {
            /* The request stays with MPI: a collective cannot be
             * cancelled, and the job cannot go on without it. */
            char who[256];
            who_answers(d, who, sizeof who);
            return chi_error(CH_ERR_REMOTE,
                             "%s: rank %d of %d waited %g s for the other "
                             "processes of the job (the watchdog, CHORUS_DIST_TIMEOUT): %s",
                             what, d->rank, d->size, d->timeout,
                             who[0] ? who : "one of them failed, was killed or hangs");
        }
        pause_poll(now - start);
    }
}

/* A duplicate of `from` whose errors return (MPI_Comm_idup: a process
 * that never comes costs the watchdog's time, not a hang). */
static ch_status dup_comm(const ch_dist *d, MPI_Comm *out, MPI_Comm from, const char *what)
{
    MPI_Request req;
    pthread_mutex_lock(&mpi_lock);
    int e = MPI_Comm_idup(from, out, &req);
    pthread_mutex_unlock(&mpi_lock);
    if (e != MPI_SUCCESS)
        return mpi_error(e, "MPI_Comm_idup", what);
    TRY(finish(d, &req, "MPI_Comm_idup", what));
    pthread_mutex_lock(&mpi_lock);
    e = MPI_Comm_set_errhandler(*out, MPI_ERRORS_RETURN);
    pthread_mutex_unlock(&mpi_lock);
    return e == MPI_SUCCESS ? CH_OK : mpi_error(e, "MPI_Comm_set_errhandler", what);
}

ch_status dist_join(ch_dist *world, int *argc, char ***argv, double timeout)
{
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (fin)
        return chi_error(CH_ERR_UNAVAILABLE, "ch_dist_init: MPI was finalized already and "
                                             "cannot start again");
    int provided = MPI_THREAD_SINGLE;
    if (!init) {
        /* Open MPI's non-blocking all-reduce picks a binomial tree for two
         * processes, which reduces a bucket of gradients well below
         * MPI_Allreduce's speed; its ring runs at MPI_Allreduce's
         * (bench/bench-allreduce; docs/PERFORMANCE_LOG.md, "2026-12-01:
         * across processes (MPI)"). A choice made by the
         * user stays theirs. */
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
        int e = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
        if (e != MPI_SUCCESS)
            return mpi_error(e, "MPI_Init_thread", "ch_dist_init");
        we_started_mpi = 1;
    } else {
        MPI_Query_thread(&provided);
    }
    ch_status st = CH_OK;
    if (provided < MPI_THREAD_SERIALIZED)
        st = chi_error(CH_ERR_UNAVAILABLE,
                       "ch_dist_init: MPI gives thread level %d, below "
                       "MPI_THREAD_SERIALIZED: data parallelism calls it from several "
                       "threads",
                       provided);
    *world = (ch_dist){.timeout = timeout};
    MPI_Comm_rank(MPI_COMM_WORLD, &world->rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world->size);
    int have_comm = 0;
    if (st == CH_OK) {
        st = dup_comm(world, &world->comm, MPI_COMM_WORLD, "ch_dist_init");
        have_comm = st == CH_OK;
    }
    MPI_Comm local = MPI_COMM_NULL;
    if (st == CH_OK) {
        int e = MPI_Comm_split_type(world->comm, MPI_COMM_TYPE_SHARED, world->rank, MPI_INFO_NULL,
                                    &local);
        if (e != MPI_SUCCESS)
            st = mpi_error(e, "MPI_Comm_split_type", "ch_dist_init");
    }
    if (st == CH_OK) {
        MPI_Comm_rank(local, &world->local_rank);
        MPI_Comm_size(local, &world->local_size);
        MPI_Comm_free(&local);
        st = start_responder(world);
    }
    if (st == CH_OK)
        return CH_OK;
    if (have_comm)
        MPI_Comm_free(&world->comm);
    if (we_started_mpi) {
        MPI_Finalize();
        we_started_mpi = 0;
    }
    return st;
}

static ch_status start_responder(const ch_dist *d)
{
    if (d->size < 2)
        return CH_OK;
    TRY(dup_comm(d, &hb_comm, d->comm, "ch_dist_init: the responder's communicator"));
    int e = pthread_create(&hb_thread, NULL, responder, NULL);
    if (e != 0) {
        MPI_Comm_free(&hb_comm);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dist_init: pthread_create: %s", strerror(e));
    }
    hb_started = 1;
    return CH_OK;
}

static void stop_responder(const ch_dist *d)
{
    if (!hb_started)
        return;
    int token = -1;
    MPI_Request req;
    pthread_mutex_lock(&mpi_lock);
    int e = MPI_Isend(&token, 1, MPI_INT, d->rank, TAG_PING, hb_comm, &req);
    pthread_mutex_unlock(&mpi_lock);
    if (e == MPI_SUCCESS && !poll_req(&req, NULL, 1000000L, PING_SECONDS)) {
        pthread_mutex_lock(&mpi_lock);
        MPI_Request_free(&req);
        pthread_mutex_unlock(&mpi_lock);
    }
    /* Whether it was listening or answering, the responder reads the
     * stop within PING_SECONDS. */
    pthread_join(hb_thread, NULL);
    hb_started = 0;
    MPI_Comm_free(&hb_comm);
}

ch_status dist_leave(ch_dist *world)
{
    stop_responder(world);
    MPI_Comm_free(&world->comm);
    if (we_started_mpi) {
        we_started_mpi = 0;
        int e = MPI_Finalize();
        if (e != MPI_SUCCESS)
            return mpi_error(e, "MPI_Finalize", "ch_dist_finalize");
    }
    return CH_OK;
}

ch_status dist_barrier_on(const ch_dist *d, const char *what)
{
    MPI_Request req;
    pthread_mutex_lock(&mpi_lock);
    int e = MPI_Ibarrier(d->comm, &req);
    pthread_mutex_unlock(&mpi_lock);
    if (e != MPI_SUCCESS)
        return mpi_error(e, "MPI_Ibarrier", what);
    return finish(d, &req, "MPI_Ibarrier", what);
}

ch_status dist_bcast_on(const ch_dist *d, dist_comm_t comm, void *data, size_t bytes, int root,
                        const char *what)
{
    const size_t chunk = (size_t)1 << 30; /* MPI counts are ints */
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t len = bytes - off < chunk ? bytes - off : chunk;
        MPI_Request req;
        pthread_mutex_lock(&mpi_lock);
        int e = MPI_Ibcast((char *)data + off, (int)len, MPI_BYTE, root, comm, &req);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS)
            return mpi_error(e, "MPI_Ibcast", what);
        TRY(finish(d, &req, "MPI_Ibcast", what));
    }
    return CH_OK;
}

ch_status dist_sum_on(const ch_dist *d, dist_comm_t comm, void *values, int64_t n, int f64,
                      const char *what)
{
    MPI_Datatype type = f64 ? MPI_DOUBLE : MPI_FLOAT;
    size_t size = f64 ? sizeof(double) : sizeof(float);
    /* In pieces of 2^22 elements (16 MiB of f32; MPI counts are ints),
     * which stay in cache between the steps of Open MPI's ring: over a
     * much larger buffer at once it runs slower (bench-allreduce;
     * docs/PERFORMANCE_LOG.md). */
    const int64_t chunk = (int64_t)1 << 22;
    for (int64_t off = 0; off < n; off += chunk) {
        int64_t len = n - off < chunk ? n - off : chunk;
        MPI_Request req;
        pthread_mutex_lock(&mpi_lock);
        int e = MPI_Iallreduce(MPI_IN_PLACE, (char *)values + (size_t)off * size, (int)len, type,
                               MPI_SUM, comm, &req);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS)
            return mpi_error(e, "MPI_Iallreduce", what);
        TRY(finish(d, &req, "MPI_Iallreduce", what));
    }
    return CH_OK;
}

/* Grows `s` to `need` bytes (its contents go). */
static ch_status scratch_at_least(dist_scratch *s, size_t need, const char *what)
{
    if (s->bytes >= need)
        return CH_OK;
    void *mem = malloc(need);
    if (!mem)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: out of host memory for %zu bytes of scratch",
                         what, need);
    free(s->mem);
    s->mem = mem;
    s->bytes = need;
    return CH_OK;
}

/* This rank's share of a bf16 sum (dist_sum_bf16_on), in f32 in rank order and
 * rounded once, built for AVX2 too. */
CHI_CLONES static void sum_blocks(int64_t len, int p, const void *const *src, const int *is_bf16,
                                  uint16_t *out)
{
    const int64_t chunk = 16384;
    CHI_OMP(omp parallel for schedule(static) if (parallel: len > 8 * chunk))
    for (int64_t lo = 0; lo < len; lo += chunk)
        chi_bf16_sum_range(lo, len - lo < chunk ? len - lo : chunk, p, src, is_bf16, NULL, out, 0,
                           NULL);
}

/* The bf16 sum across the group, in place: a reduce-scatter by
 * MPI_Ialltoallv (rank b gets block b of every rank's values), each rank
 * summing its block in f32 in rank order and rounding once, then an
 * all-gather of the blocks in place (MPI_Iallgatherv). Each rank sends and
 * receives 2 (p - 1) / p of the values' bytes, half what an f32 all-reduce
 * of the same elements moves, and every rank gets the same bits. The
 * scratch (p blocks and the call's tables) grows as needed and is kept. */
ch_status dist_sum_bf16_on(const ch_dist *d, dist_comm_t comm, dist_scratch *s, uint16_t *values,
                           int64_t n, const char *what)
{
    int p = d->size, rank = d->rank;
    const int64_t chunk = (int64_t)1 << 28; /* MPI counts are ints */
    int64_t most = n < chunk ? n : chunk;
    size_t up = (size_t)p;
    size_t block_bytes = ((size_t)(most / p) + 1) * sizeof(uint16_t);
    size_t need = up * block_bytes + 5 * up * sizeof(int) + up * sizeof(void *) + 64;
    TRY(scratch_at_least(s, need, what));
    /* The tables first (aligned), then the received blocks. */
    const void **src = s->mem;
    int *counts = (int *)(src + up), *displs = counts + up, *rcounts = displs + up;
    int *rdispls = rcounts + up, *bf16 = rdispls + up;
    uint16_t *blocks = (uint16_t *)(bf16 + up);
    for (int b = 0; b < p; b++)
        bf16[b] = 1; /* every block received is bf16 */
    for (int64_t off = 0; off < n; off += chunk) {
        int64_t len = n - off < chunk ? n - off : chunk;
        for (int b = 0; b < p; b++) {
            int64_t lo = len * b / p, hi = len * (b + 1) / p;
            displs[b] = (int)lo;
            counts[b] = (int)(hi - lo);
        }
        int mine = counts[rank];
        for (int b = 0; b < p; b++) {
            rcounts[b] = mine;
            rdispls[b] = b * mine;
        }
        uint16_t *v = values + off;
        MPI_Request req;
        pthread_mutex_lock(&mpi_lock);
        int e = MPI_Ialltoallv(v, counts, displs, MPI_UINT16_T, blocks, rcounts, rdispls,
                               MPI_UINT16_T, comm, &req);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS)
            return mpi_error(e, "MPI_Ialltoallv", what);
        TRY(finish(d, &req, "MPI_Ialltoallv", what));
        for (int b = 0; b < p; b++)
            src[b] = blocks + (size_t)b * (size_t)mine;
        sum_blocks(mine, p, src, bf16, v + displs[rank]);
        pthread_mutex_lock(&mpi_lock);
        e = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, v, counts, displs, MPI_UINT16_T,
                            comm, &req);
        pthread_mutex_unlock(&mpi_lock);
        if (e != MPI_SUCCESS)
            return mpi_error(e, "MPI_Iallgatherv", what);
        TRY(finish(d, &req, "MPI_Iallgatherv", what));
    }
    return CH_OK;
}

/* out[i] = blocks[0][i] + blocks[1][i] + ... + blocks[p - 1][i], added
 * left to right (rank order): elementwise, so the same bits at any
 * vector width, thread count or chunk size. Built for AVX2 too. */
CHI_CLONES static void sum_in_rank_order(int64_t len, int p, const float *const *blocks, float *out)
{
    const int64_t chunk = 16384;
    CHI_OMP(omp parallel for schedule(static) if (parallel: len > 8 * chunk))
    for (int64_t lo = 0; lo < len; lo += chunk) {
        int64_t m = len - lo < chunk ? len - lo : chunk;
        float *o = out + lo;
        memcpy(o, blocks[0] + lo, (size_t)m * sizeof(float));
        for (int k = 1; k < p; k++) {
            const float *b = blocks[k] + lo;
            CHI_OMP(omp simd)
            for (int64_t i = 0; i < m; i++)
                o[i] += b[i];
        }
    }
}

/* The reduce-scatter (nn_comm_reduce_scatter_f32): MPI_Ialltoallv sends
 * window k of this rank's values to rank k and brings every rank's copy
 * of this rank's window into p blocks, which sum_in_rank_order adds into
 * the window. Each rank sends the others'
 * windows and receives p - 1 copies of its own. */
ch_status dist_reduce_scatter_on(const ch_dist *d, dist_comm_t comm, dist_scratch *s, float *values,
                                 const int64_t *first, const int64_t *count, const char *what)
{
    int p = d->size, rank = d->rank;
    for (int k = 0; k < p; k++)
        if (first[k] < 0 || count[k] < 0 || first[k] > INT_MAX || count[k] > INT_MAX / p)
            return chi_error(CH_ERR_INVALID_ARGUMENT,
                             "%s: process %d's window [%lld, + %lld) is past what one MPI call "
                             "can exchange",
                             what, k, (long long)first[k], (long long)count[k]);
    size_t up = (size_t)p, mine = (size_t)count[rank];
    /* The tables first (aligned), then the received blocks. */
    size_t need = up * sizeof(float *) + 4 * up * sizeof(int) + up * mine * sizeof(float) + 64;
    TRY(scratch_at_least(s, need, what));
    const float **src = s->mem;
    int *counts = (int *)(src + up), *displs = counts + up, *rcounts = displs + up;
    int *rdispls = rcounts + up;
    float *blocks = (float *)(((uintptr_t)(rdispls + up) + 63) & ~(uintptr_t)63);
    for (int k = 0; k < p; k++) {
        counts[k] = (int)count[k];
        displs[k] = (int)first[k];
        rcounts[k] = (int)mine;
        rdispls[k] = k * (int)mine;
        src[k] = blocks + (size_t)k * mine;
    }
    MPI_Request req;
    pthread_mutex_lock(&mpi_lock);
    int e = MPI_Ialltoallv(values, counts, displs, MPI_FLOAT, blocks, rcounts, rdispls, MPI_FLOAT,
                           comm, &req);
    pthread_mutex_unlock(&mpi_lock);
    if (e != MPI_SUCCESS)
        return mpi_error(e, "MPI_Ialltoallv", what);
    TRY(finish(d, &req, "MPI_Ialltoallv", what));
    sum_in_rank_order((int64_t)mine, p, src, values + first[rank]);
    return CH_OK;
}

ch_status dist_comm_open(nn_comm *c)
{
    c->comm = MPI_COMM_NULL;
    if (ch_dist_size(c->d) == 1)
        return CH_OK;
    return dup_comm(c->d, &c->comm, c->d->comm, "making a communicator");
}

void dist_comm_close(nn_comm *c)
{
    if (c->comm != MPI_COMM_NULL) {
        pthread_mutex_lock(&mpi_lock);
        MPI_Comm_free(&c->comm);
        pthread_mutex_unlock(&mpi_lock);
    }
}

ch_status dist_gather_on(const ch_dist *d, dist_comm_t comm, const void *mine, void *all,
                         size_t bytes, const char *what)
{
    if (bytes > (size_t)INT_MAX)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: %zu bytes per process, more than one "
                         "MPI call can gather",
                         what, bytes);
    MPI_Request req;
    pthread_mutex_lock(&mpi_lock);
    int e = MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, comm, &req);
    pthread_mutex_unlock(&mpi_lock);
    if (e != MPI_SUCCESS)
        return mpi_error(e, "MPI_Iallgather", what);
    return finish(d, &req, "MPI_Iallgather", what);
}
