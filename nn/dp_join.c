/* Data parallelism (nn/dp.c) across processes: the communicators, the
 * join in ch_dp_new (every process learns the others' replicas and checks
 * they bring the same model and options), rank 0's state to every
 * process, and the report every process gives the others at the end of
 * every call. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_impl.h"

/* Across processes: the communicators, made by every process in the same
 * order. */
ch_status dp_make_comms(ch_dp *dp)
{
    TRY(nn_comm_new(&dp->procs.ctl, dp->procs.dist));
    TRY(nn_comm_new(&dp->red.comm, dp->procs.dist));
    return nn_comm_new(&dp->bn.comm, dp->procs.dist);
}

/* Across processes, what each process brings to ch_dp_new: its status so
 * far and what must agree for the processes' collectives to match. */
typedef struct joining {
    int32_t st, n;
    int64_t numel;
    int32_t nparams, nbuckets, nbuffers, split;
    int32_t accumulate, batchnorm_local, sample_dtype, sample_ndim;
    int32_t precision, loss_scale_interval, reduce_dtype;
    float loss_scale;
    int64_t sample_shape[CH_MAX_DIMS];
    int64_t labels_per_sample;
    uint64_t span_bytes; /* ch_reducer_span_bytes: 0 when it cannot span */
    char error[400];
} joining;

/* The fields of `a` that differ from rank 0's `z`, as words for a message;
 * NULL when none. */
static const char *disagreement(const joining *a, const joining *z)
{
    if (a->numel != z->numel || a->nparams != z->nparams || a->nbuffers != z->nbuffers)
        return "the model (its parameters or buffers)";
    if (a->nbuckets != z->nbuckets)
        return "the buckets (options->bucket_bytes)";
    if (a->split != z->split)
        return "options->split";
    if (a->accumulate != z->accumulate)
        return "options->accumulate";
    if (a->batchnorm_local != z->batchnorm_local)
        return "options->batchnorm_local";
    if (a->precision != z->precision || a->loss_scale != z->loss_scale ||
        a->loss_scale_interval != z->loss_scale_interval || a->reduce_dtype != z->reduce_dtype)
        return "the precision (options->precision, loss_scale, loss_scale_interval or "
               "reduce_dtype)";
    if (a->sample_dtype != z->sample_dtype || a->sample_ndim != z->sample_ndim ||
        memcmp(a->sample_shape, z->sample_shape, sizeof a->sample_shape) != 0 ||
        a->labels_per_sample != z->labels_per_sample)
        return "the samples (options->sample_shape, sample_dtype or labels_per_sample)";
    return NULL;
}

/* Across processes, in ch_dp_new whatever happened before (`st`): every
 * process learns every other's replicas and weights, and fails when one
 * failed or brings another model or other options. */
ch_status dp_join(ch_dp *dp, ch_status st, const ch_dp_options *o, float **weights)
{
    char why[512] = "";
    if (st != CH_OK)
        snprintf(why, sizeof why, "%s", ch_last_error());
    joining mine = {.st = st, .n = dp->n};
    mine.numel = dp->numel;
    mine.nparams = dp->r[0].model ? ch_module_param_count(dp->r[0].model) : -1;
    mine.nbuffers = dp->r[0].model ? ch_module_buffer_count(dp->r[0].model) : -1;
    mine.nbuckets = dp->bk.count;
    mine.split = o->split;
    mine.accumulate = o->accumulate > 1 ? o->accumulate : 1;
    mine.batchnorm_local = o->batchnorm_local != 0;
    mine.precision = o->precision;
    mine.loss_scale = o->loss_scale;
    mine.loss_scale_interval = o->loss_scale_interval;
    mine.reduce_dtype = o->reduce_dtype;
    mine.sample_dtype = o->sample_dtype;
    mine.sample_ndim = o->sample_ndim;
    memcpy(mine.sample_shape, o->sample_shape, sizeof mine.sample_shape);
    mine.labels_per_sample = o->labels_per_sample > 1 ? o->labels_per_sample : 1;
    mine.span_bytes = dp->red.reducer ? ch_reducer_span_bytes(dp->red.reducer) : 0;
    snprintf(mine.error, sizeof mine.error, "%s", why);
    joining *all = calloc((size_t)dp->procs.ranks, sizeof *all);
    dp->procs.rank_n = calloc((size_t)dp->procs.ranks, sizeof *dp->procs.rank_n);
    dp->procs.rank_first = calloc((size_t)dp->procs.ranks, sizeof *dp->procs.rank_first);
    if (!all || !dp->procs.rank_n || !dp->procs.rank_first) {
        free(all);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    ch_status got = nn_comm_allgather(dp->procs.ctl, &mine, all, sizeof mine,
                                      "ch_dp_new: joining the processes");
    if (st == CH_OK && got != CH_OK)
        st = got;
    for (int k = 0; st == CH_OK && k < dp->procs.ranks; k++) {
        const char *what = disagreement(&all[k], &all[0]);
        if (all[k].st != CH_OK)
            st = chi_error((ch_status)all[k].st, "ch_dp_new: rank %d failed: %.400s", k,
                           all[k].error);
        else if (what)
            st = chi_error(CH_ERR_INVALID_ARGUMENT,
                           "ch_dp_new: rank %d brings other %s than "
                           "rank 0: every process must make its dp with the same model and "
                           "options",
                           k, what);
    }
    if (st != CH_OK) {
        free(all);
        return why[0] && mine.st != CH_OK ? chi_error((ch_status)mine.st, "%s", why) : st;
    }
    dp->procs.nall = 0;
    dp->procs.nmax = 0;
    /* bf16 reduction goes through the host: no span (which sums f32). */
    dp->procs.span_all = o->reduce_dtype == CH_F32;
    for (int k = 0; k < dp->procs.ranks; k++)
        dp->procs.span_all =
            dp->procs.span_all && all[k].span_bytes > 0 && all[k].span_bytes == all[0].span_bytes;
    for (int k = 0; k < dp->procs.ranks; k++) {
        dp->procs.rank_first[k] = dp->procs.nall;
        dp->procs.rank_n[k] = all[k].n;
        dp->procs.nall += all[k].n;
        if (all[k].n > dp->procs.nmax)
            dp->procs.nmax = all[k].n;
    }
    free(all);
    dp->procs.first = dp->procs.rank_first[dp->procs.rank];
    dp->procs.report_bytes = sizeof(report) + (size_t)dp->procs.nmax * sizeof(double);
    dp->procs.reports = calloc((size_t)dp->procs.ranks + 1, dp->procs.report_bytes);
    if (!dp->procs.reports)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    if (o->split != CH_DP_SPLIT_WEIGHTS)
        return CH_OK;
    /* Every process's weights, in rank order. */
    float *padded = calloc((size_t)dp->procs.nmax * (size_t)(dp->procs.ranks + 1), sizeof *padded);
    *weights = calloc((size_t)dp->procs.nall, sizeof **weights);
    if (!padded || !*weights) {
        free(padded);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    float *own = padded + (size_t)dp->procs.nmax * (size_t)dp->procs.ranks;
    memcpy(own, o->weights, (size_t)dp->n * sizeof *own);
    st = nn_comm_allgather(dp->procs.ctl, own, padded, (size_t)dp->procs.nmax * sizeof *own,
                           "ch_dp_new: the weights of every process");
    for (int k = 0; st == CH_OK && k < dp->procs.ranks; k++)
        memcpy(*weights + dp->procs.rank_first[k], padded + (size_t)k * (size_t)dp->procs.nmax,
               (size_t)dp->procs.rank_n[k] * sizeof **weights);
    free(padded);
    return st;
}

/* Across processes, after rank 0's state went to every process: replica
 * 0 of every process holds rank 0's bits. */
ch_status dp_check_same_start(ch_dp *dp)
{
    TRY(dp_param_checksum(&dp->r[0]));
    uint64_t *all = calloc((size_t)dp->procs.ranks, sizeof *all);
    if (!all)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    ch_status st = nn_comm_allgather(dp->procs.ctl, &dp->r[0].checksum, all, sizeof *all,
                                     "ch_dp_new: the parameters' checksums");
    for (int k = 1; st == CH_OK && k < dp->procs.ranks; k++)
        if (all[k] != all[0])
            st = chi_error(CH_ERR_INTERNAL,
                           "ch_dp_new: rank %d holds other parameters than "
                           "rank 0 after the broadcast (checksum %016llx, want %016llx)",
                           k, (unsigned long long)all[k], (unsigned long long)all[0]);
    free(all);
    return st;
}

/* Across processes, when every replica of the job is a CUDA device (each
 * once) and the reduction may go device to device: one NCCL communicator
 * over all of them instead of the host stage. Rank 0 makes the id, MPI
 * carries it, every process joins; a failure anywhere fails ch_dp_new on
 * every process. */
ch_status dp_try_span(ch_dp *dp)
{
    if (dp->procs.ranks == 1 || !dp->procs.span_all)
        return CH_OK;
    struct {
        int32_t st;
        unsigned char id[512];
        char error[400];
    } msg;
    memset(&msg, 0, sizeof msg);
    if (ch_reducer_span_bytes(dp->red.reducer) > sizeof msg.id)
        return CH_OK; /* the same size on every process: all take the host stage */
    if (dp->procs.rank == 0) {
        msg.st = ch_reducer_span_id(dp->red.reducer, msg.id);
        if (msg.st != CH_OK)
            snprintf(msg.error, sizeof msg.error, "%s", ch_last_error());
    }
    TRY(nn_comm_bcast(dp->procs.ctl, &msg, sizeof msg, 0, "ch_dp_new: the NCCL id"));
    if (msg.st != CH_OK)
        return chi_error((ch_status)msg.st,
                         "ch_dp_new: rank 0 could not make the id of a "
                         "communicator across processes: %.400s",
                         msg.error);
    ch_status st = ch_reducer_span(dp->red.reducer, msg.id, dp->procs.first, dp->procs.nall);
    char why[400] = "";
    if (st != CH_OK)
        snprintf(why, sizeof why, "%s", ch_last_error());
    int32_t mine = (int32_t)st, *all = calloc((size_t)dp->procs.ranks, sizeof *all);
    if (!all)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    ch_status got = nn_comm_allgather(dp->procs.ctl, &mine, all, sizeof mine,
                                      "ch_dp_new: joining the communicator across processes");
    for (int k = 0; got == CH_OK && st == CH_OK && k < dp->procs.ranks; k++)
        if (all[k] != CH_OK)
            st = chi_error((ch_status)all[k],
                           "ch_dp_new: rank %d could not join the "
                           "communicator across processes",
                           k);
    free(all);
    if (why[0])
        return chi_error(st, "ch_dp_new: %s", why);
    return got != CH_OK ? got : st;
}

/* The samples of rank k's replicas in the last split. */
static int rank_count(const ch_dp *dp, int k)
{
    int c = 0;
    for (int i = 0; i < dp->procs.rank_n[k]; i++)
        c += dp->split.count[dp->procs.rank_first[k] + i];
    return c;
}

report *dp_report_of(const ch_dp *dp, int k)
{
    return (report *)(dp->procs.reports + (size_t)k * dp->procs.report_bytes);
}

double *dp_report_seconds(report *p)
{
    return (double *)(p + 1);
}

/* Across processes, at the end of every call: each process's report to
 * all. The call fails on every process when it failed on one: with its own
 * message where it failed, else naming the first process that failed with
 * that process's message. Then, for a checked step, every process's
 * replica 0 against rank 0's. */
ch_status dp_share_outcome(ch_dp *dp, ch_status st, const char *fn, double loss, int64_t correct,
                           int checked, int64_t step)
{
    if (dp->procs.ranks == 1)
        return st;
    char why[512] = "";
    if (st != CH_OK)
        snprintf(why, sizeof why, "%s", ch_last_error());
    report *mine = dp_report_of(dp, dp->procs.ranks);
    memset(mine, 0, dp->procs.report_bytes);
    mine->st = (int32_t)st;
    snprintf(mine->error, sizeof mine->error, "%s", why);
    mine->loss = loss;
    mine->correct = correct;
    mine->checked = checked;
    mine->checksum = dp->r[0].checksum;
    for (int i = 0; i < dp->n; i++)
        dp_report_seconds(mine)[i] = dp->r[i].compute_seconds;
    ch_status got =
        nn_comm_allgather(dp->procs.ctl, mine, dp->procs.reports, dp->procs.report_bytes, fn);
    if (st != CH_OK && (st != CH_ERR_REMOTE || got != CH_OK))
        return chi_error(st, "%s", why);
    if (got != CH_OK)
        return got;
    /* The first process that failed on its own, before those that only
     * heard of it. */
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < dp->procs.ranks; k++) {
            const report *p = dp_report_of(dp, k);
            if (p->st == CH_OK || (pass == 0 && p->st == CH_ERR_REMOTE))
                continue;
            if (k == dp->procs.rank)
                return chi_error(st, "%s", why);
            return chi_error((ch_status)p->st, "%s: rank %d failed: %.400s", fn, k, p->error);
        }
    const report *root = dp_report_of(dp, 0);
    for (int k = 1; checked && k < dp->procs.ranks; k++)
        if (dp_report_of(dp, k)->checksum != root->checksum)
            return chi_error(CH_ERR_INTERNAL,
                             "%s: rank %d holds other parameters than rank 0 "
                             "after step %lld (checksum %016llx, want %016llx)",
                             fn, k, (long long)step,
                             (unsigned long long)dp_report_of(dp, k)->checksum,
                             (unsigned long long)root->checksum);
    return CH_OK;
}

/* Across processes with synchronised BatchNorm, every process takes part
 * in every exchange of a training call: each needs samples. */
ch_status dp_check_every_rank_has_samples(const ch_dp *dp, const char *fn, int total)
{
    if (dp->procs.ranks == 1 || dp->o.batchnorm_local ||
        ch_module_buffer_count(dp->r[0].model) == 0)
        return CH_OK;
    for (int k = 0; k < dp->procs.ranks; k++)
        if (rank_count(dp, k) == 0)
            return chi_error(CH_ERR_INVALID_ARGUMENT,
                             "%s: the batch of %d samples leaves "
                             "rank %d without any, and synchronised BatchNorm needs every "
                             "process in every step: give at least %d samples",
                             fn, total, k, dp->procs.nall);
    return CH_OK;
}

/* Across processes: rank 0's copy of `t` into every process's `t`,
 * through the host buffer *scratch (grown as needed). */
static ch_status bcast_tensor(ch_dp *dp, ch_tensor *t, void **scratch, size_t *cap,
                              const char *what)
{
    size_t bytes = ch_tensor_nbytes(t);
    if (bytes > *cap) {
        void *grown = realloc(*scratch, bytes);
        if (!grown)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
        *scratch = grown;
        *cap = bytes;
    }
    if (dp->procs.rank == 0)
        TRY(ch_tensor_download(t, *scratch, bytes));
    TRY(nn_comm_bcast(dp->procs.ctl, *scratch, bytes, 0, what));
    return dp->procs.rank == 0 ? CH_OK : ch_tensor_upload(t, *scratch, bytes);
}

/* Across processes: rank 0's replica 0 parameters (when `params`) and
 * buffers into every process's replica 0, then into its other replicas. */
ch_status dp_bcast_state(ch_dp *dp, int params, const char *what)
{
    ch_module *m = dp->r[0].model;
    void *scratch = NULL;
    size_t cap = 0;
    ch_status st = CH_OK;
    int np = params ? ch_module_param_count(m) : 0;
    for (int i = 0; st == CH_OK && i < np; i++) {
        ch_tensor *v;
        st = ch_module_param(m, i, NULL, &v, NULL);
        if (st == CH_OK)
            st = bcast_tensor(dp, v, &scratch, &cap, what);
        for (int k = 1; st == CH_OK && k < dp->n; k++) {
            ch_tensor *w;
            st = ch_module_param(dp->r[k].model, i, NULL, &w, NULL);
            if (st == CH_OK)
                st = ch_copy(w, v);
        }
    }
    int nb = ch_module_buffer_count(m);
    for (int i = 0; st == CH_OK && i < nb; i++) {
        ch_tensor *v;
        int64_t *counter;
        st = ch_module_buffer(m, i, NULL, &v, &counter);
        if (st == CH_OK && v)
            st = bcast_tensor(dp, v, &scratch, &cap, what);
        else if (st == CH_OK)
            st = nn_comm_bcast(dp->procs.ctl, counter, sizeof *counter, 0, what);
    }
    free(scratch);
    for (int k = 0; st == CH_OK && k < dp->n; k++)
        st = ch_device_sync(dp->r[k].dev);
    if (st == CH_OK && nb > 0)
        dp->tr.buffers_stale = dp->n > 1;
    return st;
}

/* Across processes, after a prediction: every process's rows to all. */
ch_status dp_gather_rows(ch_dp *dp, ch_tensor *out, int total)
{
    size_t bytes = ch_tensor_nbytes(out), row = bytes / (size_t)total;
    unsigned char *buf = malloc(bytes ? bytes : 1);
    if (!buf)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_predict: out of memory");
    ch_status st = ch_tensor_download(out, buf, bytes);
    for (int k = 0; st == CH_OK && k < dp->procs.ranks; k++) {
        int start = dp->split.start[dp->procs.rank_first[k]];
        st =
            nn_comm_bcast(dp->procs.ctl, buf + (size_t)start * row, (size_t)rank_count(dp, k) * row,
                          k, "ch_dp_predict: the outputs of every process");
    }
    if (st == CH_OK)
        st = ch_tensor_upload(out, buf, bytes);
    free(buf);
    return st;
}
