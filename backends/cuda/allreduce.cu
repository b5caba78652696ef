/* In-place all-reduce (sum) over a group of streams of CUDA devices of this
 * process.
 *
 * NCCL (when the module has it): each device's buffers are first summed
 * into the first of them, in list order; NCCL sums those over the distinct
 * devices (ncclCommInitAll refuses a device twice, so two replicas on one
 * GPU make a one-rank communicator); the total is then copied back to the
 * device's other buffers.
 *
 * Peer copies (without NCCL, with CHORUS_CUDA_NCCL=off, or where NCCL
 * cannot make a communicator, as in a VM without peer access or shared
 * memory): every buffer is summed into the first one, in list order,
 * through a copy on the first device (cudaMemcpyPeerAsync, staged by the
 * driver where the devices have no peer access; the same device is read
 * in place); the total is copied back.
 *
 * Every buffer ends with the same bits: one sum, copied. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

/* The streams and buffers of one call; lead[i] is the member whose buffer
 * receives member i's: itself for a leader. */
typedef struct chcu_group {
    int count;
    chcu_stream *s[CHCU_MAX_DEVICES];
    ch_bmem buf[CHCU_MAX_DEVICES];
    int lead[CHCU_MAX_DEVICES];
    cudaEvent_t ev[CHCU_MAX_DEVICES];
} chcu_group;

static int chcu_group_dev(const chcu_group *g, int i)
{
    return g->s[i]->dev->index;
}

/* "fail" (act as if NCCL could make no communicator) exists only in test
 * builds (CHI_TEST_HOOKS, as tests/gpu/check.sh builds the module): it is
 * how test-cuda reaches the fallback on a machine where NCCL works. */
#ifdef CHI_TEST_HOOKS
#define CHCU_NCCL_WORDS "on, off or fail"
#else
#define CHCU_NCCL_WORDS "on or off"
#endif

ch_status chcu_nccl_mode_of_env(chcu_nccl_mode *mode)
{
    const char *v = getenv("CHORUS_CUDA_NCCL");
    *mode = CHCU_NCCL_ON;
    if (!v || !*v || strcmp(v, "on") == 0)
        return CH_OK;
    if (strcmp(v, "off") == 0) {
        *mode = CHCU_NCCL_OFF;
        return CH_OK;
    }
#ifdef CHI_TEST_HOOKS
    if (strcmp(v, "fail") == 0) {
        *mode = CHCU_NCCL_FAIL;
        return CH_OK;
    }
#endif
    return chi_error(CH_ERR_INVALID_ARGUMENT,
                     "CHORUS_CUDA_NCCL is \"%.32s\": expected " CHCU_NCCL_WORDS, v);
}

#ifdef CH_HAVE_NCCL
#include <nccl.h>

/* Communicators for one ordered list of devices, made once and kept until
 * shutdown (ncclCommInitAll is far too slow to repeat per call); or, where
 * they could not be made, a note that this list takes the peer path. */
struct chcu_comm {
    int count;
    int failed;
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
        for (int i = 0; i < c->count && !c->failed; i++)
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

/* Said once per device list, on stderr: a run that falls back is slower,
 * not wrong, and its user should know why. */
static void chcu_comm_note(const chcu_comm *c, const char *why)
{
    char list[8 * CHCU_MAX_DEVICES + 1] = "";
    for (int i = 0; i < c->count; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%scuda:%d", i ? "," : "", c->devs[i]);
    }
    fprintf(stderr,
            "chorus: cuda: no NCCL communicator for %s (%s); the all-reduce uses peer copies "
            "instead\n",
            list, why);
}

static void chcu_comm_init(const chcu_backend *be, chcu_comm *c)
{
#ifdef CHI_TEST_HOOKS
    if (be->nccl == CHCU_NCCL_FAIL) {
        c->failed = 1;
        chcu_comm_note(c, "CHORUS_CUDA_NCCL=fail");
        return;
    }
#else
    (void)be;
#endif
    ncclResult_t r = ncclCommInitAll(c->comms, c->count, c->devs);
    if (r == ncclSuccess)
        return;
    /* A failed init may leave a CUDA error behind for the next launch check. */
    (void)cudaGetLastError();
    c->failed = 1;
    char why[160];
    snprintf(why, sizeof why, "ncclCommInitAll: %s", ncclGetErrorString(r));
    chcu_comm_note(c, why);
}

/* The communicators for `devs`, made on first use: *out is NULL where NCCL
 * cannot serve this list (the caller takes the peer path). */
static ch_status chcu_comm_get(chcu_backend *be, int count, const int *devs, chcu_comm **out)
{
    pthread_mutex_lock(&be->lock);
    chcu_comm *c = chcu_comm_find(be, count, devs);
    if (!c && (c = (chcu_comm *)calloc(1, sizeof *c)) != NULL) {
        c->count = count;
        memcpy(c->devs, devs, (size_t)count * sizeof *devs);
        chcu_comm_init(be, c);
        c->next = be->comms;
        be->comms = c;
    }
    pthread_mutex_unlock(&be->lock);
    *out = c && !c->failed ? c : NULL;
    return c ? CH_OK : chi_error(CH_ERR_OUT_OF_MEMORY, "cuda allreduce: out of host memory");
}

/* ---- across processes: communicators over a whole MPI job ---- */

struct chcu_span {
    int count;
    ncclComm_t comms[CHCU_MAX_DEVICES];
};

const size_t chcu_span_id_bytes = sizeof(ncclUniqueId);

ch_status chcu_span_id(void *id)
{
    ncclUniqueId u;
    ch_status st = chcu_nccl_check(ncclGetUniqueId(&u), "ncclGetUniqueId");
    if (!st)
        memcpy(id, &u, sizeof u);
    return st;
}

/* Every process's ncclCommInitRank waits for the others: the caller's
 * processes all come here with the same id. Several devices of this
 * process join inside one NCCL group, each with its device current. */
ch_status chcu_span_new(void **span, int count, void *const *devs, const int *ranks,
                        int nranks, const void *id)
{
    *span = NULL;
    if (count < 1 || count > CHCU_MAX_DEVICES)
        return chi_error(CH_ERR_LIMIT, "cuda: %d devices in one process for NCCL across "
                         "processes, expected 1 to %d", count, CHCU_MAX_DEVICES);
    chcu_span *sp = (chcu_span *)calloc(1, sizeof *sp);
    if (!sp)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "cuda: out of host memory");
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ch_status st = chcu_nccl_check(ncclGroupStart(), "ncclGroupStart");
    int begun = 0;
    for (int i = 0; i < count && !st; i++) {
        st = chcu_enter((const chcu_device *)devs[i]);
        if (!st)
            st = chcu_nccl_check(ncclCommInitRank(&sp->comms[i], nranks, u, ranks[i]),
                                 "ncclCommInitRank");
        if (!st)
            begun = i + 1;
    }
    /* The group must be closed even when a call in it failed. */
    ch_status end = chcu_nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    if (!st)
        st = end;
    if (st) {
        for (int i = 0; i < begun && end == CH_OK; i++)
            (void)ncclCommDestroy(sp->comms[i]);
        (void)cudaGetLastError();
        free(sp);
        return st;
    }
    sp->count = count;
    *span = sp;
    return CH_OK;
}

ch_status chcu_span_allreduce(void *span, int count, void *const *streams,
                              const ch_bmem *bufs, int64_t n)
{
    chcu_span *sp = (chcu_span *)span;
    if (count != sp->count)
        return chi_error(CH_ERR_INTERNAL, "cuda: %d buffers for a span of %d devices", count,
                         sp->count);
    ch_status st = chcu_nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (int i = 0; i < count && !st; i++) {
        chcu_stream *s = (chcu_stream *)streams[i];
        float *p = chcu_at<float>(bufs[i]);
        st = chcu_nccl_check(ncclAllReduce(p, p, (size_t)n, ncclFloat, ncclSum, sp->comms[i],
                                           s->s),
                             "ncclAllReduce");
    }
    ch_status end = chcu_nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    return st ? st : end;
}

void chcu_span_free(void *span)
{
    chcu_span *sp = (chcu_span *)span;
    if (!sp)
        return;
    for (int i = 0; i < sp->count; i++)
        (void)chcu_nccl_check(ncclCommDestroy(sp->comms[i]), "ncclCommDestroy");
    free(sp);
}

#else

void chcu_comms_free(chcu_backend *be)
{
    (void)be;
}

const size_t chcu_span_id_bytes = 0;

#endif

/* ---- ordering and copies inside a group ---- */

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

/* Mark the work queued so far on member i's stream. */
static ch_status chcu_group_mark(chcu_group *g, int i)
{
    ch_status st = chcu_enter(g->s[i]->dev);
    if (!st)
        st = chcu_check(cudaEventRecord(g->ev[i], g->s[i]->s), "cudaEventRecord");
    return st;
}

/* `to` waits for the last mark of `from`. */
static ch_status chcu_group_wait(chcu_group *g, int from, int to)
{
    ch_status st = chcu_enter(g->s[to]->dev);
    if (!st)
        st = chcu_check(cudaStreamWaitEvent(g->s[to]->s, g->ev[from], 0), "cudaStreamWaitEvent");
    return st;
}

/* buf[lead[i]] += buf[i] for every member, in list order, on the leader's
 * stream. A member on another device than its leader goes through `tmp`,
 * on the leader's device. */
static ch_status chcu_group_gather(chcu_group *g, int64_t n, void *tmp)
{
    size_t bytes = (size_t)n * sizeof(float);
    ch_bmem t = {tmp, 0};
    for (int i = 0; i < g->count; i++) {
        int l = g->lead[i];
        if (l == i)
            continue;
        int same = chcu_group_dev(g, i) == chcu_group_dev(g, l);
        ch_status st = chcu_group_mark(g, i);
        if (!st)
            st = chcu_group_wait(g, i, l);
        if (!st && !same)
            st = chcu_check(cudaMemcpyPeerAsync(tmp, chcu_group_dev(g, l), chcu_at<char>(g->buf[i]),
                                                chcu_group_dev(g, i), bytes, g->s[l]->s),
                            "cudaMemcpyPeerAsync");
        if (!st)
            st = chcu_binary(g->s[l], CH_BIN_ADD, n, g->buf[l], g->buf[l], same ? g->buf[i] : t);
        if (st)
            return st;
    }
    return CH_OK;
}

/* buf[i] = buf[lead[i]] for every member; each leader's stream then waits
 * for those copies, so that later work there cannot overwrite the total
 * under them. The copies of one leader run side by side. */
static ch_status chcu_group_scatter(chcu_group *g, int64_t n)
{
    size_t bytes = (size_t)n * sizeof(float);
    for (int i = 0; i < g->count; i++) {
        ch_status st = g->lead[i] == i ? chcu_group_mark(g, i) : CH_OK;
        if (st)
            return st;
    }
    for (int i = 0; i < g->count; i++) {
        int l = g->lead[i];
        if (l == i)
            continue;
        ch_status st = chcu_group_wait(g, l, i);
        if (!st)
            st = chcu_check(cudaMemcpyPeerAsync(chcu_at<char>(g->buf[i]), chcu_group_dev(g, i),
                                                chcu_at<char>(g->buf[l]), chcu_group_dev(g, l),
                                                bytes, g->s[i]->s),
                            "cudaMemcpyPeerAsync");
        if (!st)
            st = chcu_group_mark(g, i);
        if (!st)
            st = chcu_group_wait(g, i, l);
        if (st)
            return st;
    }
    return CH_OK;
}

/* ---- the two paths ---- */

static ch_status chcu_peer_allreduce(chcu_group *g, int64_t n)
{
    int remote = 0;
    for (int i = 0; i < g->count; i++) {
        g->lead[i] = 0;
        remote |= chcu_group_dev(g, i) != chcu_group_dev(g, 0);
    }
    void *tmp = NULL;
    if (remote) {
        ch_status st = chcu_scratch_acquire(g->s[0], (size_t)n * sizeof(float), &tmp);
        if (st)
            return st;
    }
    ch_status st = chcu_group_gather(g, n, tmp);
    if (!st)
        st = chcu_group_scatter(g, n);
    if (remote)
        chcu_scratch_release(g->s[0]);
    return st;
}

#ifdef CH_HAVE_NCCL

/* Each member's leader: the first member on its device. The leaders'
 * devices, in list order, go to `devs`; returns how many. */
static int chcu_group_leaders(chcu_group *g, int *devs)
{
    int nleaders = 0;
    for (int i = 0; i < g->count; i++) {
        g->lead[i] = i;
        for (int j = 0; j < i && g->lead[i] == i; j++)
            if (chcu_group_dev(g, j) == chcu_group_dev(g, i))
                g->lead[i] = g->lead[j];
        if (g->lead[i] == i)
            devs[nleaders++] = chcu_group_dev(g, i);
    }
    return nleaders;
}

static ch_status chcu_nccl_sum(chcu_group *g, int64_t n, const chcu_comm *c)
{
    ch_status st = chcu_nccl_check(ncclGroupStart(), "ncclGroupStart");
    if (st)
        return st;
    for (int i = 0, k = 0; i < g->count && !st; i++) {
        if (g->lead[i] != i)
            continue;
        float *p = chcu_at<float>(g->buf[i]);
        st = chcu_nccl_check(ncclAllReduce(p, p, (size_t)n, ncclFloat, ncclSum, c->comms[k++],
                                           g->s[i]->s),
                             "ncclAllReduce");
    }
    /* The group must be closed even when a call in it failed. */
    ch_status end = chcu_nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    return st ? st : end;
}

/* CH_OK with *done 0 where NCCL cannot serve these devices. */
static ch_status chcu_nccl_allreduce(chcu_group *g, int64_t n, int *done)
{
    int devs[CHCU_MAX_DEVICES];
    int nleaders = chcu_group_leaders(g, devs);
    chcu_comm *c;
    *done = 0;
    ch_status st = chcu_comm_get(g->s[0]->dev->be, nleaders, devs, &c);
    if (st || !c)
        return st;
    *done = 1;
    /* Distinct devices (the usual case): NCCL alone, no event to order. */
    if (nleaders == g->count)
        return chcu_nccl_sum(g, n, c);
    st = chcu_group_events(g);
    if (!st)
        st = chcu_group_gather(g, n, NULL);
    if (!st)
        st = chcu_nccl_sum(g, n, c);
    if (!st)
        st = chcu_group_scatter(g, n);
    return st;
}

#endif

static ch_status chcu_allreduce_on(chcu_group *g, int64_t n)
{
#ifdef CH_HAVE_NCCL
    if (g->s[0]->dev->be->nccl != CHCU_NCCL_OFF) {
        int done;
        ch_status st = chcu_nccl_allreduce(g, n, &done);
        if (st || done)
            return st;
    }
#endif
    ch_status st = chcu_group_events(g);
    return st ? st : chcu_peer_allreduce(g, n);
}

ch_status chcu_allreduce_sum(int count, void *const *streams, const ch_bmem *bufs, int64_t n)
{
    if (count > CHCU_MAX_DEVICES)
        return chi_error(CH_ERR_LIMIT, "cuda allreduce: %d devices, at most %d", count,
                         CHCU_MAX_DEVICES);
    if (count < 2)
        return CH_OK;
    chcu_group g;
    memset(&g, 0, sizeof g);
    g.count = count;
    for (int i = 0; i < count; i++) {
        g.s[i] = (chcu_stream *)streams[i];
        g.buf[i] = bufs[i];
    }
    int caller = chcu_current();
    ch_status st = chcu_allreduce_on(&g, n);
    chcu_group_free(&g);
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
