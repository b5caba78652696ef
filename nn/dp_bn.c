/* Data parallelism (nn/dp.c): BatchNorm's statistics over the replicas
 * (the model's sync hook, nn_set_sync) and, across processes, over the
 * job; replica 0's running statistics into the other replicas.
 *
 * Every replica with samples in the call deposits its sums in host memory,
 * waits for the others, and adds all deposits in replica order, so every
 * replica gets the same bits; a second wait keeps the deposits until all
 * have read them. A failing replica wakes the others (fail() in
 * nn/dp_worker.c). */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>

#include "dp_impl.h"

/* With dp->w.lock held: wait until every active replica has arrived. */
static ch_status rendezvous(ch_dp *dp)
{
    int64_t round = dp->bn.round;
    if (++dp->bn.arrived == dp->bn.active) {
        dp->bn.arrived = 0;
        dp->bn.round++;
        pthread_cond_broadcast(&dp->bn.exchanged);
    }
    while (dp->bn.round == round && !atomic_load(&dp->w.failed))
        pthread_cond_wait(&dp->bn.exchanged, &dp->w.lock);
    if (dp->bn.round == round)
        return chi_error(CH_ERR_STATE, "BatchNorm statistics: another replica failed");
    return CH_OK;
}

/* Across processes, on the leader replica, between the two rendezvous:
 * the process's sums (every active replica's deposit, in replica order)
 * summed over the processes, and a flag that a process failed. A leader
 * whose process failed before the exchange still takes part, with the
 * flag, so that the other processes stop here instead of waiting. */
static ch_status exchange_across(ch_dp *dp, int64_t n, int failed)
{
    if (n + 1 > dp->bn.total_cap) {
        double *grown = realloc(dp->bn.total, (size_t)(n + 1) * sizeof *grown);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "BatchNorm statistics: out of memory");
        dp->bn.total = grown;
        dp->bn.total_cap = n + 1;
    }
    for (int64_t k = 0; k < n; k++)
        dp->bn.total[k] = 0.0;
    for (int i = 0; !failed && i < dp->n; i++) {
        const replica *o = &dp->r[i];
        for (int64_t k = 0; o->count > 0 && k < n; k++)
            dp->bn.total[k] += o->bn.buf[k];
    }
    dp->bn.total[n] = failed ? 1.0 : 0.0;
    if (dp->bn.done >= dp->bn.counts_cap) {
        int cap = dp->bn.counts_cap ? 2 * dp->bn.counts_cap : 16;
        int64_t *grown = realloc(dp->bn.counts, (size_t)cap * sizeof *grown);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "BatchNorm statistics: out of memory");
        dp->bn.counts = grown;
        dp->bn.counts_cap = cap;
    }
    dp->bn.counts[dp->bn.done++] = n;
    TRY(nn_comm_sum_f64(dp->bn.comm, dp->bn.total, n + 1, "BatchNorm statistics across processes"));
    if (dp->bn.total[n] > 0.0 && !failed) {
        /* The process that failed has told everyone: nothing to flag. */
        pthread_mutex_lock(&dp->w.lock);
        dp->bn.flagged = 1;
        pthread_mutex_unlock(&dp->w.lock);
        return chi_error(CH_ERR_REMOTE, "BatchNorm statistics: another process of the job "
                                        "failed in this step");
    }
    return CH_OK;
}

ch_status dp_exchange_sums(void *user, ch_tensor *t)
{
    replica *r = user;
    ch_dp *dp = r->dp;
    int64_t n = ch_tensor_numel(t);
    if (n > r->bn.cap) {
        float *b = realloc(r->bn.buf, (size_t)n * sizeof *b);
        if (b)
            r->bn.buf = b;
        double *d = b ? realloc(r->bn.sum, (size_t)n * sizeof *d) : NULL;
        if (d)
            r->bn.sum = d;
        if (!b || !d)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "BatchNorm statistics: out of memory");
        r->bn.cap = n;
    }
    TRY(ch_tensor_download(t, r->bn.buf, (size_t)n * sizeof(float)));
    double w0 = ch_clock_seconds();
    pthread_mutex_lock(&dp->w.lock);
    ch_status st = rendezvous(dp);
    pthread_mutex_unlock(&dp->w.lock);
    r->bn.wait += ch_clock_seconds() - w0;
    /* Across processes the leader exchanges; after a failure here, the
     * first replica to see it exchanges the flag instead. */
    int across = 0;
    if (dp->procs.ranks > 1) {
        pthread_mutex_lock(&dp->w.lock);
        if (st == CH_OK)
            across = r->index == dp->bn.leader;
        else if (!dp->bn.flagged)
            across = dp->bn.flagged = 1;
        pthread_mutex_unlock(&dp->w.lock);
    }
    if (across) {
        char why[512] = "";
        if (st != CH_OK)
            snprintf(why, sizeof why, "%s", ch_last_error());
        ch_status got = exchange_across(dp, n, st != CH_OK);
        if (st != CH_OK)
            return chi_error(st, "%s", why);
        TRY(got);
    }
    TRY(st);
    if (dp->procs.ranks == 1) {
        for (int64_t k = 0; k < n; k++)
            r->bn.sum[k] = 0.0;
        for (int i = 0; i < dp->n; i++) {
            const replica *o = &dp->r[i];
            for (int64_t k = 0; o->count > 0 && k < n; k++)
                r->bn.sum[k] += o->bn.buf[k];
        }
    }
    w0 = ch_clock_seconds();
    pthread_mutex_lock(&dp->w.lock);
    st = rendezvous(dp);
    pthread_mutex_unlock(&dp->w.lock);
    r->bn.wait += ch_clock_seconds() - w0;
    TRY(st);
    /* The job's total, which the leader wrote before the second rendezvous. */
    const double *total = dp->procs.ranks > 1 ? dp->bn.total : r->bn.sum;
    for (int64_t k = 0; k < n; k++)
        r->bn.buf[k] = (float)total[k];
    return ch_tensor_upload(t, r->bn.buf, (size_t)n * sizeof(float));
}

/* Across processes, after this replica failed in its forward or
 * backward: when the other processes may be waiting in one of BatchNorm's
 * exchanges that this process will now never reach (fewer exchanges done
 * than a training call makes), the next one is made with the flag that
 * this process failed, so that they stop there. Once per call; the
 * exchange's size is the one the last good call had at that point. */
void dp_flag_exchange(ch_dp *dp)
{
    if (dp->procs.ranks == 1)
        return;
    pthread_mutex_lock(&dp->w.lock);
    int k = dp->bn.done, go = !dp->bn.flagged && k < dp->bn.expected;
    if (go)
        dp->bn.flagged = 1;
    pthread_mutex_unlock(&dp->w.lock);
    if (!go)
        return;
    int64_t n = dp->bn.counts[k];
    double *flag = calloc((size_t)n + 1, sizeof *flag);
    if (!flag)
        return; /* the others' watchdog ends it */
    flag[n] = 1.0;
    /* The replica's message is kept already (fail()); a failure here
     * leaves the others to their watchdog. */
    (void)nn_comm_sum_f64(dp->bn.comm, flag, n + 1, "BatchNorm statistics across processes");
    free(flag);
}

/* Replica 0's buffers (running statistics) into the others', after the
 * call drained every replica's stream. Training reads them only to move
 * them (replica 0's are the ones kept), so this waits until an evaluation
 * or a copy out needs them. */
ch_status dp_broadcast_buffers(ch_dp *dp)
{
    if (!dp->tr.buffers_stale)
        return CH_OK;
    int lead = dp_lead(dp), nb = ch_module_buffer_count(dp->r[lead].model);
    for (int i = 0; i < dp->n; i++) {
        for (int k = 0; i != lead && k < nb; k++) {
            ch_tensor *src, *dst;
            int64_t *csrc, *cdst;
            TRY(ch_module_buffer(dp->r[lead].model, k, NULL, &src, &csrc));
            TRY(ch_module_buffer(dp->r[i].model, k, NULL, &dst, &cdst));
            if (src)
                TRY(ch_copy(dst, src));
            else
                *cdst = *csrc;
        }
        if (nb > 0 && i != lead)
            TRY(ch_device_sync(dp->r[i].dev));
    }
    dp->tr.buffers_stale = 0;
    return CH_OK;
}
