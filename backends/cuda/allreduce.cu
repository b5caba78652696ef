/* In-place all-reduce (sum) over a group of CUDA devices of this process:
 * NCCL when the module is built with it and every device is listed once
 * (ncclCommInitAll refuses a device twice); otherwise peer copies into the
 * first device, a sum there in list order, and copies back
 * (cudaMemcpyPeerAsync works within one device too). */
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

#ifdef CH_HAVE_NCCL
#include <nccl.h>

/* Communicators for one ordered list of devices, made once and kept until
 * shutdown: ncclCommInitAll is far too slow to repeat per call. */
struct chcu_comm {
    int count;
    int devs[CHCU_MAX_DEVICES];
    ncclComm_t comms[CHCU_MAX_DEVICES];
    chcu_comm *next;
};

static ch_status chcu_nccl_check(ncclResult_t r, const char *call)
{
    if (r == ncclSuccess)
        return CH_OK;
    return chi_error(CH_ERR_DRIVER, "%s: %s", call, ncclGetErrorString(r));
}

void chcu_comms_free(chcu_backend *be)
{
    while (be->comms) {
        chcu_comm *c = be->comms;
        be->comms = c->next;
        for (int i = 0; i < c->count; i++)
            (void)chcu_nccl_check(ncclCommDestroy(c->comms[i]), "ncclCommDestroy");
        free(c);
    }
}

static chcu_comm *chcu_comm_find(chcu_backend *be, int count, const int *devs)
{
    for (chcu_comm *c = be->comms; c; c = c->next)
        if (c->count == count && memcmp(c->devs, devs, (size_t)count * sizeof *devs) == 0)
            return c;
    return NULL;
}

static ch_status chcu_comm_get(chcu_backend *be, int count, const int *devs, chcu_comm **out)
{
    pthread_mutex_lock(&be->lock);
    chcu_comm *c = chcu_comm_find(be, count, devs);
    ch_status st = CH_OK;
    if (!c) {
        c = (chcu_comm *)calloc(1, sizeof *c);
        if (!c)
            st = chi_error(CH_ERR_OUT_OF_MEMORY, "cuda allreduce: out of host memory");
        else
            st = chcu_nccl_check(ncclCommInitAll(c->comms, count, devs), "ncclCommInitAll");
        if (!st) {
            c->count = count;
            memcpy(c->devs, devs, (size_t)count * sizeof *devs);
            c->next = be->comms;
            be->comms = c;
        } else {
            free(c);
            c = NULL;
        }
    }
    pthread_mutex_unlock(&be->lock);
    *out = c;
    return st;
}

static ch_status chcu_nccl_allreduce(int count, void *const *streams, const ch_bmem *bufs,
                                     int64_t n, const int *devs)
{
    chcu_comm *c;
    ch_status st = chcu_comm_get(((chcu_stream *)streams[0])->dev->be, count, devs, &c);
    if (st)
        return st;
    st = chcu_nccl_check(ncclGroupStart(), "ncclGroupStart");
    if (st)
        return st;
    for (int i = 0; i < count && !st; i++) {
        float *p = chcu_at<float>(bufs[i]);
        st = chcu_nccl_check(ncclAllReduce(p, p, (size_t)n, ncclFloat, ncclSum, c->comms[i],
                                           ((chcu_stream *)streams[i])->s),
                             "ncclAllReduce");
    }
    /* The group must be closed even when a call in it failed. */
    ch_status end = chcu_nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    return st ? st : end;
}

#else

void chcu_comms_free(chcu_backend *be)
{
    (void)be;
}

#endif

/* ---- the peer-copy path ---- */

typedef struct chcu_group {
    int count;
    chcu_stream *s[CHCU_MAX_DEVICES];
    cudaEvent_t ev[CHCU_MAX_DEVICES];
} chcu_group;

static ch_status chcu_group_events(chcu_group *g)
{
    for (int i = 0; i < g->count; i++) {
        ch_status st = chcu_enter(g->s[i]->dev);
        if (!st)
            st = chcu_check(cudaEventCreateWithFlags(&g->ev[i], cudaEventDisableTiming),
                            "cudaEventCreateWithFlags");
        if (st)
            return st;
    }
    return CH_OK;
}

static void chcu_group_free(chcu_group *g)
{
    for (int i = 0; i < g->count; i++)
        if (g->ev[i] && chcu_enter(g->s[i]->dev) == CH_OK)
            (void)chcu_check(cudaEventDestroy(g->ev[i]), "cudaEventDestroy");
}

/* `to` waits for the work queued so far on `from`. */
static ch_status chcu_group_order(chcu_group *g, int from, int to)
{
    ch_status st = chcu_enter(g->s[from]->dev);
    if (!st)
        st = chcu_check(cudaEventRecord(g->ev[from], g->s[from]->s), "cudaEventRecord");
    if (!st)
        st = chcu_enter(g->s[to]->dev);
    if (!st)
        st = chcu_check(cudaStreamWaitEvent(g->s[to]->s, g->ev[from], 0), "cudaStreamWaitEvent");
    return st;
}

/* buf[0] = buf[0] + buf[1] + ... in that order, through `tmp` on device 0. */
static ch_status chcu_group_sum(chcu_group *g, const ch_bmem *bufs, int64_t n, void *tmp)
{
    chcu_stream *s0 = g->s[0];
    size_t bytes = (size_t)n * sizeof(float);
    ch_bmem t = {tmp, 0};
    for (int i = 1; i < g->count; i++) {
        /* The same device listed again: its buffer is read in place. */
        int same = g->s[i]->dev->index == s0->dev->index;
        ch_status st = chcu_group_order(g, i, 0);
        if (!st)
            st = chcu_enter(s0->dev);
        if (!st && !same)
            st = chcu_check(cudaMemcpyPeerAsync(tmp, s0->dev->index, chcu_at<char>(bufs[i]),
                                                g->s[i]->dev->index, bytes, s0->s),
                            "cudaMemcpyPeerAsync");
        if (!st)
            st = chcu_binary(s0, CH_BIN_ADD, n, bufs[0], bufs[0], same ? bufs[i] : t);
        if (st)
            return st;
    }
    return CH_OK;
}

/* Every other buffer gets the sum; device 0's stream then waits for those
 * copies so that later work there cannot overwrite the sum under them. */
static ch_status chcu_group_scatter(chcu_group *g, const ch_bmem *bufs, int64_t n)
{
    size_t bytes = (size_t)n * sizeof(float);
    for (int i = 1; i < g->count; i++) {
        ch_status st = chcu_group_order(g, 0, i);
        if (!st)
            st = chcu_check(cudaMemcpyPeerAsync(chcu_at<char>(bufs[i]), g->s[i]->dev->index,
                                                chcu_at<char>(bufs[0]), g->s[0]->dev->index,
                                                bytes, g->s[i]->s),
                            "cudaMemcpyPeerAsync");
        if (!st)
            st = chcu_group_order(g, i, 0);
        if (st)
            return st;
    }
    return CH_OK;
}

static ch_status chcu_peer_allreduce(int count, void *const *streams, const ch_bmem *bufs,
                                     int64_t n)
{
    chcu_group g;
    memset(&g, 0, sizeof g);
    g.count = count;
    for (int i = 0; i < count; i++)
        g.s[i] = (chcu_stream *)streams[i];
    void *tmp;
    ch_status st = chcu_scratch_acquire(g.s[0], (size_t)n * sizeof(float), &tmp);
    if (st)
        return st;
    st = chcu_group_events(&g);
    if (!st)
        st = chcu_group_sum(&g, bufs, n, tmp);
    if (!st)
        st = chcu_group_scatter(&g, bufs, n);
    chcu_scratch_release(g.s[0]);
    chcu_group_free(&g);
    return st;
}

static ch_status chcu_allreduce_on(int count, void *const *streams, const ch_bmem *bufs,
                                   int64_t n)
{
#ifdef CH_HAVE_NCCL
    int devs[CHCU_MAX_DEVICES];
    int repeated = 0;
    for (int i = 0; i < count; i++) {
        devs[i] = ((chcu_stream *)streams[i])->dev->index;
        for (int j = 0; j < i; j++)
            repeated |= devs[j] == devs[i];
    }
    if (!repeated)
        return chcu_nccl_allreduce(count, streams, bufs, n, devs);
#endif
    return chcu_peer_allreduce(count, streams, bufs, n);
}

ch_status chcu_allreduce_sum(int count, void *const *streams, const ch_bmem *bufs, int64_t n)
{
    if (count > CHCU_MAX_DEVICES)
        return chi_error(CH_ERR_LIMIT, "cuda allreduce: %d devices, at most %d", count,
                         CHCU_MAX_DEVICES);
    if (count < 2)
        return CH_OK;
    int caller = chcu_current();
    ch_status st = chcu_allreduce_on(count, streams, bufs, n);
    chcu_restore(caller);
    return st;
}

/* NCCL, or peer copies (staged by the driver where the devices have no
 * peer access), take any CUDA devices of the process. */
int chcu_can_allreduce(void *dev_a, void *dev_b)
{
    (void)dev_a;
    (void)dev_b;
    return 1;
}
