/* Data parallelism (nn/dp.c): the sharded optimizer, ZeRO stage 1
 * (ch_dp_options.shard_optimizer), and the optimizer's state as a whole
 * (ch_dp_optimizer_get, ch_dp_optimizer_set).
 *
 * The parameters' elements, concatenated in parameter order, are cut into
 * one contiguous part per replica of the job, in the job's replica order
 * (the lower ranks' first), sized in proportion to each device's memory
 * limit. A replica's optimizer keeps the state of its part only
 * (nn_optimizer_set_range). The gradients are reduced as without
 * sharding; after the barrier each replica updates its part, puts it in
 * the host's copy of the parameters (`host`), and once every replica of
 * the process has (a barrier), the process's parts go to every process
 * (an allgather of each process's contiguous run of parts), and each
 * replica takes the others' parts from the host copy (another barrier).
 * The updates are the same elementwise kernels on the same reduced
 * gradients as without sharding, on the owner's device: every backend
 * computes them alike (lib/kernels/), so the parameters are those of an
 * unsharded run, bit for bit. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp_impl.h"

/* A device's limit (ch_device_set_memory_limit), 0 when it has none. */
static uint64_t device_limit(ch_device *dev)
{
    ch_memory_stats ms;
    return ch_device_memory_stats(dev, &ms) == CH_OK ? ms.limit_bytes : 0;
}

static uint64_t device_memory(ch_device *dev)
{
    ch_device_info info;
    return ch_device_get_info(dev, &info) == CH_OK ? info.memory_bytes : 0;
}

/* Each job replica's weight for its part: [nall] pairs (limit, memory) of
 * its device, its share of them when the process lists the device more
 * than once. */
static ch_status gather_sizes(ch_dp *dp, double *sizes)
{
    int nmax = dp->procs.ranks > 1 ? dp->procs.nmax : dp->n;
    double *mine = calloc((size_t)nmax * 2, sizeof *mine);
    double *all = calloc((size_t)nmax * 2 * (size_t)dp->procs.ranks, sizeof *all);
    if (!mine || !all) {
        free(mine);
        free(all);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    }
    for (int i = 0; i < dp->n; i++) {
        int sharing = 0;
        for (int j = 0; j < dp->n; j++)
            sharing += dp->r[j].dev == dp->r[i].dev;
        mine[2 * i] = (double)device_limit(dp->r[i].dev) / sharing;
        mine[2 * i + 1] = (double)device_memory(dp->r[i].dev) / sharing;
    }
    ch_status st = CH_OK;
    if (dp->procs.ranks > 1)
        st = nn_comm_allgather(dp->procs.ctl, mine, all, (size_t)nmax * 2 * sizeof *mine,
                               "ch_dp_new: the devices' memory limits");
    else
        memcpy(all, mine, (size_t)nmax * 2 * sizeof *mine);
    for (int k = 0; st == CH_OK && k < dp->procs.ranks; k++)
        for (int i = 0; i < dp->procs.rank_n[k]; i++) {
            int job = dp->procs.rank_first[k] + i;
            sizes[2 * job] = all[(size_t)k * (size_t)nmax * 2 + 2 * (size_t)i];
            sizes[2 * job + 1] = all[(size_t)k * (size_t)nmax * 2 + 2 * (size_t)i + 1];
        }
    free(mine);
    free(all);
    return st;
}

/* Job replica k's weight: its limit when any device has one (its memory
 * when it has none), else 1; 0 when it is left out. */
static double part_weight(const ch_dp *dp, const double *sizes, int limited, int k)
{
    double w = !limited ? 1.0 : sizes[2 * k] > 0.0 ? sizes[2 * k] : sizes[2 * k + 1];
    return dp->split.out[k] ? 0.0 : w > 0.0 ? w : 1.0;
}

/* The parts: in proportion to the limits when any device has one (a
 * device without one weighs its memory), else equal. */
static void cut_parts(ch_dp *dp, const double *sizes)
{
    int nall = dp->procs.nall, limited = 0;
    for (int k = 0; k < nall; k++)
        limited |= sizes[2 * k] > 0.0;
    double total = 0.0;
    for (int k = 0; k < nall; k++)
        total += part_weight(dp, sizes, limited, k);
    double cum = 0.0;
    dp->sh.lo[0] = 0;
    for (int k = 0; k < nall; k++) {
        cum += part_weight(dp, sizes, limited, k);
        dp->sh.lo[k + 1] = k + 1 == nall ? dp->numel : (int64_t)((double)dp->numel * (cum / total));
        if (dp->sh.lo[k + 1] < dp->sh.lo[k])
            dp->sh.lo[k + 1] = dp->sh.lo[k];
    }
}

ch_status dp_shard_recut(ch_dp *dp)
{
    if (!dp->sh.on) {
        /* Without sharding, the lead holds the whole state (the source of
         * ch_dp_optimizer_get). */
        int lead = dp->procs.first + dp_lead(dp);
        for (int k = 0; k <= dp->procs.nall; k++)
            dp->sh.lo[k] = k <= lead ? 0 : dp->numel;
        return CH_OK;
    }
    double *sizes = calloc((size_t)dp->procs.nall * 2, sizeof *sizes);
    if (!sizes)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "out of memory");
    ch_status st = gather_sizes(dp, sizes);
    if (st == CH_OK)
        cut_parts(dp, sizes);
    free(sizes);
    for (int i = 0; st == CH_OK && i < dp->n; i++) {
        int job = dp->procs.first + i;
        st = nn_optimizer_set_range(dp->r[i].opt, dp->sh.lo[job], dp->sh.lo[job + 1]);
    }
    return st;
}

/* A process's run of parts: [lo, hi) of the elements. */
static void rank_run(const ch_dp *dp, int k, int64_t *lo, int64_t *hi)
{
    *lo = dp->sh.lo[dp->procs.rank_first[k]];
    *hi = dp->sh.lo[dp->procs.rank_first[k] + dp->procs.rank_n[k]];
}

/* Room for the exchanges: the host's copy of every element, and across
 * processes the allgather's buffers (the longest run, and a word for the
 * sender's state). */
static ch_status make_buffers(ch_dp *dp)
{
    int64_t most = 0;
    for (int k = 0; k < dp->procs.ranks; k++) {
        int64_t lo, hi;
        rank_run(dp, k, &lo, &hi);
        most = hi - lo > most ? hi - lo : most;
    }
    dp->sh.most = most;
    dp->sh.wfirst = calloc((size_t)dp->n, sizeof *dp->sh.wfirst);
    dp->sh.wcount = calloc((size_t)dp->n, sizeof *dp->sh.wcount);
    if (!dp->sh.wfirst || !dp->sh.wcount)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    dp->sh.host = malloc((size_t)dp->numel * sizeof *dp->sh.host);
    if (dp->sh.host && dp->procs.ranks > 1) {
        dp->sh.mine = malloc(((size_t)most + 1) * sizeof *dp->sh.mine);
        dp->sh.all = malloc(((size_t)most + 1) * (size_t)dp->procs.ranks * sizeof *dp->sh.all);
        dp->sh.rfirst = calloc((size_t)dp->procs.ranks, sizeof *dp->sh.rfirst);
        dp->sh.rcount = calloc((size_t)dp->procs.ranks, sizeof *dp->sh.rcount);
    }
    if (!dp->sh.host ||
        (dp->procs.ranks > 1 && (!dp->sh.mine || !dp->sh.all || !dp->sh.rfirst || !dp->sh.rcount)))
        return chi_error(CH_ERR_OUT_OF_MEMORY,
                         "ch_dp_new: out of memory for the parameters' "
                         "host copy (%lld elements)",
                         (long long)dp->numel);
    return CH_OK;
}

static ch_status param_offsets(ch_dp *dp)
{
    int np = ch_module_param_count(dp->r[0].model);
    dp->sh.np = np;
    dp->sh.off = calloc((size_t)np + 1, sizeof *dp->sh.off);
    if (!dp->sh.off)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    for (int i = 0; i < np; i++) {
        ch_tensor *p;
        TRY(ch_module_param(dp->r[0].model, i, NULL, &p, NULL));
        dp->sh.off[i + 1] = dp->sh.off[i] + ch_tensor_numel(p);
    }
    return CH_OK;
}

ch_status dp_shard_init(ch_dp *dp)
{
    dp->sh.lo = calloc((size_t)dp->procs.nall + 1, sizeof *dp->sh.lo);
    if (!dp->sh.lo)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dp_new: out of memory");
    TRY(param_offsets(dp));
    dp->sh.on = dp->o.shard_optimizer && dp->procs.nall > 1;
    ch_status st = dp_shard_recut(dp);
    if (st != CH_OK)
        return chi_error(st, "ch_dp_new: %s", ch_last_error());
    return make_buffers(dp);
}

void dp_shard_free(ch_dp *dp)
{
    free(dp->sh.lo);
    free(dp->sh.off);
    free(dp->sh.host);
    free(dp->sh.mine);
    free(dp->sh.all);
    free(dp->sh.wfirst);
    free(dp->sh.wcount);
    free(dp->sh.rfirst);
    free(dp->sh.rcount);
}

/* The elements [lo, hi) as a window of bucket b's: from its first element. */
static void window(const ch_dp *dp, int b, int64_t lo, int64_t hi, int64_t *first, int64_t *count)
{
    const bucket *bk = &dp->bk.list[b];
    int64_t at = dp->sh.off[bk->p_lo], end = at + bk->count;
    lo = lo > at ? lo : at;
    hi = hi < end ? hi : end;
    *first = hi > lo ? lo - at : 0;
    *count = hi > lo ? hi - lo : 0;
}

int dp_shard_windows(ch_dp *dp, int b)
{
    if (!dp->sh.on || dp->o.precision == CH_F16)
        return 0;
    for (int i = 0; i < dp->n; i++) {
        int64_t lo, hi;
        dp_shard_part(dp, i, &lo, &hi);
        window(dp, b, lo, hi, &dp->sh.wfirst[i], &dp->sh.wcount[i]);
    }
    return 1;
}

void dp_shard_rank_windows(ch_dp *dp, int b)
{
    for (int k = 0; k < dp->procs.ranks; k++) {
        int64_t lo, hi;
        rank_run(dp, k, &lo, &hi);
        window(dp, b, lo, hi, &dp->sh.rfirst[k], &dp->sh.rcount[k]);
    }
}

void dp_shard_part(const ch_dp *dp, int index, int64_t *lo, int64_t *hi)
{
    int job = dp->procs.first + index;
    *lo = dp->sh.lo[job];
    *hi = dp->sh.lo[job + 1];
}

/* ---- Moving parts between a device's tensors and the host's copy ------------- */

/* Elements [a, b) of the concatenation that fall in parameter i: its
 * flat [*first, *first + *count). */
static int64_t overlap(const ch_dp *dp, int i, int64_t a, int64_t b, int64_t *first)
{
    int64_t lo = dp->sh.off[i] > a ? dp->sh.off[i] : a;
    int64_t hi = dp->sh.off[i + 1] < b ? dp->sh.off[i + 1] : b;
    *first = lo - dp->sh.off[i];
    return hi > lo ? hi - lo : 0;
}

/* Elements [a, b) of parameter i's tensor t (whole-shaped, or 1-D of
 * [base, base + its numel) when `base` >= 0) into or out of host[]. */
static ch_status move(ch_dp *dp, ch_tensor *t, int i, int64_t a, int64_t b, int64_t base, int down)
{
    int64_t first, count = overlap(dp, i, a, b, &first);
    if (count == 0)
        return CH_OK;
    float *at = dp->sh.host + dp->sh.off[i] + first;
    ch_tensor *v = NULL;
    TRY(nn_flat_view(&v, t, base >= 0 ? first - base : first, count));
    size_t bytes = (size_t)count * sizeof(float);
    ch_status st = down ? ch_tensor_download(v, at, bytes) : ch_tensor_upload(v, at, bytes);
    ch_tensor_free(v);
    return st;
}

/* Every parameter's elements in [a, b) of replica r, down to the host's
 * copy or up from it. */
static ch_status move_params(replica *r, int64_t a, int64_t b, int down)
{
    ch_dp *dp = r->dp;
    for (int i = 0; i < dp->sh.np; i++) {
        if (dp->sh.off[i + 1] <= a || dp->sh.off[i] >= b)
            continue;
        ch_tensor *p;
        TRY(ch_module_param(r->model, i, NULL, &p, NULL));
        TRY(move(dp, p, i, a, b, -1, down));
    }
    return CH_OK;
}

ch_status dp_shard_publish(replica *r)
{
    int64_t lo, hi;
    dp_shard_part(r->dp, r->index, &lo, &hi);
    return move_params(r, lo, hi, 1);
}

ch_status dp_shard_fetch(replica *r)
{
    int64_t lo, hi;
    dp_shard_part(r->dp, r->index, &lo, &hi);
    TRY(move_params(r, 0, lo, 0));
    return move_params(r, hi, r->dp->numel, 0);
}

/* Across processes: each process's run of the host copy to every
 * process, with `flag` (nonzero: this process failed, or has no such
 * state) in the word after it; *any_flag gets whether some process
 * raised its flag. A collective on `comm`. */
static ch_status exchange(ch_dp *dp, nn_comm *comm, int flag, int *any_flag, const char *what)
{
    int64_t most = dp->sh.most, lo, hi;
    rank_run(dp, dp->procs.rank, &lo, &hi);
    memcpy(dp->sh.mine, dp->sh.host + lo, (size_t)(hi - lo) * sizeof(float));
    memset(dp->sh.mine + (hi - lo), 0, (size_t)(most - (hi - lo) + 1) * sizeof(float));
    dp->sh.mine[most] = flag ? 1.0f : 0.0f;
    TRY(nn_comm_allgather(comm, dp->sh.mine, dp->sh.all, ((size_t)most + 1) * sizeof(float), what));
    *any_flag = 0;
    for (int k = 0; k < dp->procs.ranks; k++) {
        const float *run = dp->sh.all + (size_t)k * ((size_t)most + 1);
        *any_flag |= run[most] != 0.0f;
        rank_run(dp, k, &lo, &hi);
        if (k != dp->procs.rank)
            memcpy(dp->sh.host + lo, run, (size_t)(hi - lo) * sizeof(float));
    }
    return CH_OK;
}

ch_status dp_shard_exchange(ch_dp *dp, int failed, int *other_failed)
{
    *other_failed = 0;
    if (dp->procs.ranks < 2)
        return CH_OK;
    int any = 0;
    TRY(exchange(dp, dp->red.comm, failed, &any, "gathering the updated parameters"));
    *other_failed = any && !failed;
    return CH_OK;
}

/* ---- The optimizer's state as a whole ------------------------------------------ */

static ch_status check_like(const ch_dp *dp, const ch_optimizer *opt, const char *fn)
{
    if (!dp || !opt)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !dp ? "dp" : "opt");
    if (nn_optimizer_ranged(opt))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: opt holds a part of a state itself (a "
                         "sharded replica's); give a whole one",
                         fn);
    const ch_optimizer *mine = dp->r[0].opt;
    if (nn_optimizer_kind(opt) != nn_optimizer_kind(mine))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: opt is of another kind (%d) than the "
                         "dp's (%d)",
                         fn, (int)nn_optimizer_kind(opt), (int)nn_optimizer_kind(mine));
    if (ch_optimizer_state_count(opt) != ch_optimizer_state_count(mine))
        return chi_error(CH_ERR_SHAPE, "%s: opt has %d state tensors, the dp's %d", fn,
                         ch_optimizer_state_count(opt), ch_optimizer_state_count(mine));
    for (int i = 0; i < dp->sh.np; i++) {
        ch_tensor **slot, *p;
        TRY(nn_optimizer_state_slot((ch_optimizer *)opt,
                                    i * (ch_optimizer_state_count(opt) / dp->sh.np), &slot, &p, 0));
        if (ch_tensor_numel(p) != dp->sh.off[i + 1] - dp->sh.off[i])
            return chi_error(CH_ERR_SHAPE,
                             "%s: opt's parameter %d has %lld elements, the dp's "
                             "%lld",
                             fn, i, (long long)ch_tensor_numel(p),
                             (long long)(dp->sh.off[i + 1] - dp->sh.off[i]));
    }
    return CH_OK;
}

/* State `j` of every parameter of this process's replicas' parts into
 * the host copy; *absent: the state was never made (no step taken). */
static ch_status publish_state(ch_dp *dp, int j, int *absent)
{
    int per = ch_optimizer_state_count(dp->r[0].opt) / dp->sh.np;
    *absent = 0;
    for (int r = 0; r < dp->n; r++) {
        int64_t lo, hi;
        dp_shard_part(dp, r, &lo, &hi);
        for (int i = 0; i < dp->sh.np; i++) {
            int64_t first, count = overlap(dp, i, lo, hi, &first);
            if (count == 0)
                continue;
            ch_tensor **slot, *p;
            TRY(nn_optimizer_state_slot(dp->r[r].opt, i * per + j, &slot, &p, 0));
            if (!*slot) {
                *absent = 1;
                continue;
            }
            /* A sharded replica's state is 1-D from its first element. */
            TRY(move(dp, *slot, i, lo, hi, dp->sh.on ? first : -1, 1));
        }
    }
    return CH_OK;
}

ch_status ch_dp_optimizer_get(ch_dp *dp, ch_optimizer *opt)
{
    dp = dp_live(dp);
    TRY(check_like(dp, opt, "ch_dp_optimizer_get"));
    int ns = ch_optimizer_state_count(opt), per = ns / dp->sh.np;
    ch_status st = CH_OK;
    for (int j = 0; j < per && st == CH_OK; j++) {
        int absent = 0, any = 0;
        st = publish_state(dp, j, &absent);
        if (dp->procs.ranks > 1) {
            /* Every process takes part, a failure of its own included. */
            ch_status ex =
                exchange(dp, dp->procs.ctl, st != CH_OK ? 2 : absent, &any, "ch_dp_optimizer_get");
            st = st != CH_OK ? st : ex;
            if (st == CH_OK) {
                for (int k = 0; k < dp->procs.ranks; k++)
                    if (dp->sh.all[(size_t)k * ((size_t)dp->sh.most + 1) + (size_t)dp->sh.most] >
                        1.5f)
                        st = chi_error(CH_ERR_REMOTE, "ch_dp_optimizer_get: process %d failed", k);
                absent |= any;
            }
        }
        for (int i = 0; st == CH_OK && i < dp->sh.np; i++) {
            if (absent) {
                /* No step was taken: opt has none of this state either. */
                ch_tensor **slot, *p;
                st = nn_optimizer_state_slot(opt, i * per + j, &slot, &p, 1);
                if (st == CH_OK) {
                    ch_tensor_free(*slot);
                    *slot = NULL;
                }
                continue;
            }
            ch_tensor *t;
            st = nn_optimizer_state_make(opt, i * per + j, &t);
            if (st == CH_OK)
                st = ch_tensor_upload(t, dp->sh.host + dp->sh.off[i], ch_tensor_nbytes(t));
        }
    }
    if (st == CH_OK)
        st = ch_optimizer_set_steps(opt, ch_optimizer_steps(dp->r[0].opt));
    return st == CH_OK ? CH_OK : chi_error(st, "%s", ch_last_error());
}

ch_status ch_dp_optimizer_set(ch_dp *dp, const ch_optimizer *opt)
{
    dp = dp_live(dp);
    TRY(check_like(dp, opt, "ch_dp_optimizer_set"));
    int ns = ch_optimizer_state_count(opt), per = ns / dp->sh.np;
    /* Every replica's state made first: a failure for want of memory
     * leaves them as they were. */
    for (int r = 0; r < dp->n; r++)
        if (!dp->r[r].mb.out)
            TRY(nn_optimizer_prepare(dp->r[r].opt));
    for (int i = 0; i < dp->sh.np; i++) {
        for (int j = 0; j < per; j++) {
            ch_tensor **src, *p;
            TRY(nn_optimizer_state_slot((ch_optimizer *)opt, i * per + j, &src, &p, 0));
            if (!*src)
                continue; /* none in opt: the replicas keep theirs */
            TRY(ch_tensor_download(*src, dp->sh.host + dp->sh.off[i], ch_tensor_nbytes(*src)));
            for (int r = 0; r < dp->n; r++) {
                int64_t lo, hi, first;
                dp_shard_part(dp, r, &lo, &hi);
                if (!dp->sh.on) {
                    lo = 0;
                    hi = dp->numel;
                }
                if (dp->r[r].mb.out || overlap(dp, i, lo, hi, &first) == 0)
                    continue;
                ch_tensor **slot, *rp;
                TRY(nn_optimizer_state_slot(dp->r[r].opt, i * per + j, &slot, &rp, 1));
                TRY(move(dp, *slot, i, lo, hi, dp->sh.on ? first : -1, 0));
            }
        }
    }
    for (int r = 0; r < dp->n; r++)
        TRY(ch_optimizer_set_steps(dp->r[r].opt, ch_optimizer_steps(opt)));
    return CH_OK;
}
