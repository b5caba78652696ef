/* Data parallelism across processes (run by tests/test-dist.sh under
 * mpirun): training over the replicas of every rank matches one process
 * training the same global batch on the host alone, for the cnn, a
 * BatchNorm net with synchronised statistics, dropout, a weighted split
 * and gradient accumulation; two runs give the same bits; evaluation and
 * prediction cover the whole batch; a rank that fails fails the step on
 * every rank, naming it, and the next step works; ranks that disagree on
 * the options fail ch_dp_new. Gradients reduced in bf16 cross the
 * processes in bf16 (ch_dist_sum_bf16, checked bit for bit).
 *
 *   test-dist DEVICES-OF-RANK-0;DEVICES-OF-RANK-1;...
 *
 * Each rank takes the list at its rank (a comma-separated device list).
 * Rank 0 writes the TAP; every claim holds only if it holds on every rank. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"
#include "../nn/dist.h" /* nn_comm_reduce_scatter_f32, the sharded optimizer's */
#include "../nn/nn.h"   /* chi_dp_fail_next, the fault-injection hook */
#ifdef CHORUS_FAULT_INJECTION
#define CHI_FAULT_IMPL /* chi_fault_arm without the macros over this file's calls */
#include "fault.h"
#endif

enum { BATCH = 24, STEPS = 10, CONTEXT = 16, VOCAB = 64 };

static ch_dist *world;
static ch_device *host;

/* The claim holds on every rank. */
static int everywhere(int cond)
{
    double bad = cond ? 0.0 : 1.0;
    if (ch_dist_sum(world, &bad, 1) != CH_OK)
        return 0;
    return bad == 0.0;
}

typedef struct batches {
    ch_host_buffer *images[STEPS], *labels[STEPS];
    ch_batch b[STEPS];
    /* The tiny GPT's: windows of CONTEXT tokens and their next tokens. */
    ch_host_buffer *tokens[STEPS], *targets[STEPS];
    ch_batch t[STEPS];
} batches;

static void make_batches(batches *bs)
{
    tap_rng rng = {7};
    for (int s = 0; s < STEPS; s++) {
        bs->b[s] = tap_mnist_batch(host, &rng, BATCH, s, &bs->images[s], &bs->labels[s]);
        /* The last batch is short, in buffers made for a full one. */
        if (s == STEPS - 1)
            bs->b[s].count = BATCH - 5;
        ch_host_buffer_new(&bs->tokens[s], host, sizeof(int32_t) * BATCH * CONTEXT);
        ch_host_buffer_new(&bs->targets[s], host, sizeof(int32_t) * BATCH * CONTEXT);
        int32_t *tok = ch_host_buffer_data(bs->tokens[s]);
        int32_t *tgt = ch_host_buffer_data(bs->targets[s]);
        for (int i = 0; i < BATCH; i++) {
            /* A text that repeats with a little noise: there is something
             * to learn. */
            int32_t prev = (int32_t)(tap_rng_next(&rng) % VOCAB);
            for (int j = 0; j < CONTEXT; j++) {
                int32_t next = tap_rng_next(&rng) % 4 == 0
                                   ? (int32_t)(tap_rng_next(&rng) % VOCAB)
                                   : (prev * 7 + 3) % VOCAB;
                tok[i * CONTEXT + j] = prev;
                tgt[i * CONTEXT + j] = next;
                prev = next;
            }
        }
        bs->t[s] = (ch_batch){bs->tokens[s], bs->targets[s], NULL,
                              s == STEPS - 1 ? BATCH - 5 : BATCH, 0, s};
    }
}

static void free_batches(batches *bs)
{
    for (int s = 0; s < STEPS; s++) {
        ch_host_buffer_free(bs->images[s]);
        ch_host_buffer_free(bs->labels[s]);
        ch_host_buffer_free(bs->tokens[s]);
        ch_host_buffer_free(bs->targets[s]);
    }
}

typedef enum kind { CNN, BNNET, DROPNET, GPT } kind;

static ch_module *make_model(kind k)
{
    ch_module *m = NULL;
    if (k == CNN) {
        ch_nn_preset(&m, "cnn");
        return m;
    }
    if (k == GPT) {
        ch_gpt_config c = {2, 2, 32, CONTEXT, VOCAB, 0.1f};
        ch_nn_gpt(&m, &c);
        return m;
    }
    ch_module *c[8] = {NULL};
    int n = 0;
    ch_nn_conv2d(&c[n++], 1, 4, 3, 2, 1);
    if (k == BNNET)
        ch_nn_batchnorm2d(&c[n++], 4, 1e-5f, 0.1f);
    ch_nn_activation(&c[n++], CH_ACT_RELU);
    ch_nn_flatten(&c[n++]);
    ch_nn_linear(&c[n++], 4 * 14 * 14, 32);
    ch_nn_activation(&c[n++], CH_ACT_RELU);
    if (k == DROPNET)
        ch_nn_dropout(&c[n++], 0.3f);
    ch_nn_linear(&c[n++], 32, 10);
    return tap_sequential(n, c);
}

/* SGD (tap_mnist_dp_options): Adam turns a gradient of rounding noise
 * into a step of the learning rate, and the comparison would measure that. */
static ch_dp_options options(void)
{
    ch_dp_options o = tap_mnist_dp_options(11);
    o.check_every = 3;
    return o;
}

/* STEPS steps (with o.accumulate, each batch twice as micro-batches of a
 * step); the trained parameters and buffers end in `out`. NAN on failure,
 * the message in a diagnostic. */
static float train(ch_module *out, kind k, ch_device **devs, int n, ch_dp_options o,
                   const batches *bs)
{
    ch_module *model = make_model(k);
    ch_module_init(model, 3);
    ch_dp *dp = NULL;
    float loss = NAN;
    if (k == GPT) {
        o.sample_ndim = 1;
        o.sample_shape[0] = CONTEXT;
        o.sample_dtype = CH_I32;
        o.labels_per_sample = CONTEXT;
    }
    ch_status st = ch_dp_new(&dp, model, devs, n, &o);
    for (int s = 0; st == CH_OK && s < STEPS; s++)
        st = ch_dp_step(dp, &loss, k == GPT ? &bs->t[s] : &bs->b[s], 0.05f);
    if (st == CH_OK && ch_dp_pending(dp) > 0)
        st = ch_dp_flush(dp, 0.05f);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, out);
    if (st != CH_OK) {
        tap_diag("rank %d: training failed: %s", ch_dist_rank(world), ch_last_error());
        loss = NAN;
    }
    ch_dp_free(dp);
    ch_module_free(model);
    return loss;
}

/* max|a - b| / max|b| of two tensors of one shape (infinite when either
 * cannot be read); *bitwise stays 1 only while every element is equal;
 * *norm (when not NULL): the norm-wise ||a - b|| / ||b||. */
static double tensor_rel(ch_tensor *ta, ch_tensor *tb, int *bitwise, double *norm)
{
    size_t n = (size_t)ch_tensor_numel(ta);
    float *va = malloc(n * sizeof *va + 1), *vb = malloc(n * sizeof *vb + 1);
    int got = va && vb && ch_tensor_download(ta, va, n * sizeof *va) == CH_OK &&
              ch_tensor_download(tb, vb, n * sizeof *vb) == CH_OK;
    double scale = 1e-30, diff = got ? 0 : INFINITY, dd = 0, bb = 1e-60;
    for (size_t k = 0; got && k < n; k++) {
        double d = (double)va[k] - (double)vb[k];
        scale = fmax(scale, fabs(vb[k]));
        diff = fmax(diff, fabs(d));
        dd += d * d;
        bb += (double)vb[k] * vb[k];
        *bitwise = *bitwise && va[k] == vb[k];
    }
    *bitwise = *bitwise && got;
    if (norm)
        *norm = got ? sqrt(dd / bb) : INFINITY;
    free(va);
    free(vb);
    return diff / scale;
}

/* Over every parameter and tensor buffer, the largest max|a - b| / max|b|;
 * *bitwise: every element equal; *norm (when not NULL): the largest
 * norm-wise ||a - b|| / ||b||. With `diag`, each tensor's two are
 * diagnostics. */
static double max_rel_of(ch_module *a, ch_module *b, int *bitwise, double *norm, int diag)
{
    double worst = 0, worst_norm = 0;
    *bitwise = 1;
    int np = ch_module_param_count(a), nb = ch_module_buffer_count(a);
    for (int i = 0; i < np + nb; i++) {
        ch_tensor *ta = NULL, *tb = NULL;
        const char *name = NULL;
        if (i < np) {
            ch_module_param(a, i, &name, &ta, NULL);
            ch_module_param(b, i, NULL, &tb, NULL);
        } else {
            ch_module_buffer(a, i - np, &name, &ta, NULL);
            ch_module_buffer(b, i - np, NULL, &tb, NULL);
        }
        if (!ta || !tb)
            continue;
        double nrm, rel = tensor_rel(ta, tb, bitwise, &nrm);
        worst = fmax(worst, rel);
        worst_norm = fmax(worst_norm, nrm);
        if (diag)
            tap_diag("rank %d: %s: max rel err %.2e, norm-wise %.2e", ch_dist_rank(world),
                     name ? name : "?", rel, nrm);
    }
    if (norm)
        *norm = worst_norm;
    return worst;
}

static double max_rel(ch_module *a, ch_module *b, int *bitwise)
{
    return max_rel_of(a, b, bitwise, NULL, 0);
}

/* Rank 0's parameters, broadcast: every rank compares its own with them. */
static int same_as_rank0(ch_module *m)
{
    int same = 1;
    for (int i = 0; i < ch_module_param_count(m); i++) {
        ch_tensor *t;
        ch_module_param(m, i, NULL, &t, NULL);
        size_t bytes = ch_tensor_nbytes(t);
        float *mine = malloc(bytes), *root = malloc(bytes);
        ch_tensor_download(t, mine, bytes);
        memcpy(root, mine, bytes);
        if (ch_dist_broadcast(world, root, bytes, 0) != CH_OK)
            same = 0;
        same = same && memcmp(mine, root, bytes) == 0;
        free(mine);
        free(root);
    }
    return same;
}

static void equivalent(const char *what, kind k, ch_device **devs, int n, ch_dp_options o,
                       const batches *bs)
{
    ch_module *ref = make_model(k), *got = make_model(k);
    ch_dp_options alone = o;
    alone.dist = NULL;
    alone.split = CH_DP_SPLIT_EQUAL;
    alone.weights = NULL;
    alone.nweights = 0;
    float lref = train(ref, k, &host, 1, alone, bs);
    o.dist = world;
    float l = train(got, k, devs, n, o, bs);
    int bitwise;
    double norm, err = max_rel_of(got, ref, &bitwise, &norm, 0);
    /* Norm-wise: the sums of another split round otherwise, and where that
     * moves a max-pool's choice between two near-equal inputs (or a ReLU's
     * near 0), a few weights move by 1e-4 of the largest (the cnn on an
     * AMD EPYC, with an automatic split: 1.2e-4 max-wise, 8e-6 norm-wise).
     * One sample fewer in each batch moves them by 2e-3 to 1e-1 norm-wise. */
    int ok = isfinite(l) && isfinite(lref) && norm < 1e-4 && fabsf(l - lref) < 1e-5f * (1 + lref);
    tap_ok(everywhere(ok),
           "%s over %d ranks: parameters and buffers after %d steps match one "
           "process on the host (rank %d: norm-wise rel err %.2e, want < 1e-4; max rel err "
           "%.2e; loss %.6f vs %.6f)",
           what, ch_dist_size(world), STEPS, ch_dist_rank(world), norm, err, l, lref);
    if (!ok)
        (void)max_rel_of(got, ref, &bitwise, &norm, 1);
    tap_ok(everywhere(same_as_rank0(got)), "... every rank ends with rank 0's bits");
    ch_module_free(ref);
    ch_module_free(got);
}

static void test_repeatable(ch_device **devs, int n, const batches *bs)
{
    ch_module *a = make_model(BNNET), *b = make_model(BNNET);
    ch_dp_options o = options();
    o.dist = world;
    float la = train(a, BNNET, devs, n, o, bs);
    float lb = train(b, BNNET, devs, n, o, bs);
    int bitwise;
    (void)max_rel(a, b, &bitwise);
    tap_ok(everywhere(isfinite(la) && bitwise && la == lb),
           "two runs of the same job give the same bits (host reduction; loss %.7f, %.7f)",
           la, lb);
    ch_module_free(a);
    ch_module_free(b);
}

/* The sharded optimizer across the processes: each replica of each rank
 * keeps its part of AdamW's state; the parameters and the whole state
 * (ch_dp_optimizer_get, on every rank) are an unsharded run's bits. */
static ch_status train_state(ch_module *out, ch_optimizer **opt, kind k, ch_device **devs, int n,
                             ch_dp_options o, const batches *bs, int64_t *part)
{
    ch_module *model = make_model(k);
    ch_module_init(model, 3);
    if (k == GPT) {
        o.sample_ndim = 1;
        o.sample_shape[0] = CONTEXT;
        o.sample_dtype = CH_I32;
        o.labels_per_sample = CONTEXT;
    }
    ch_dp *dp = NULL;
    float loss;
    ch_status st = ch_dp_new(&dp, model, devs, n, &o);
    for (int s = 0; st == CH_OK && s < STEPS; s++)
        st = ch_dp_step(dp, &loss, k == GPT ? &bs->t[s] : &bs->b[s], 0.002f);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, out);
    if (st == CH_OK)
        st = ch_optimizer_new(opt, out, &o.optimizer);
    if (st == CH_OK)
        st = ch_dp_optimizer_get(dp, *opt);
    *part = 0;
    for (int i = 0; st == CH_OK && i < n; i++) {
        int64_t count;
        st = ch_dp_shard(dp, i, NULL, &count);
        *part += count;
    }
    if (st != CH_OK)
        tap_diag("rank %d: training failed: %s", ch_dist_rank(world), ch_last_error());
    ch_dp_free(dp);
    ch_module_free(model);
    return st;
}

/* Over every state tensor of two optimizers, the largest max|a - b| /
 * max|b|; *bitwise: every element equal (and both have every tensor). */
static double state_rel(ch_optimizer *a, ch_optimizer *b, int *bitwise)
{
    *bitwise = ch_optimizer_state_count(a) == ch_optimizer_state_count(b);
    if (!*bitwise)
        return INFINITY;
    /* Every tensor, past the first that differs: the measure covers all. */
    double worst = 0;
    for (int i = 0; i < ch_optimizer_state_count(a); i++) {
        ch_tensor *x = NULL, *y = NULL;
        ch_optimizer_state(a, i, NULL, &x);
        ch_optimizer_state(b, i, NULL, &y);
        if (!x || !y) {
            *bitwise = 0;
            return INFINITY;
        }
        worst = fmax(worst, tensor_rel(x, y, bitwise, NULL));
    }
    return worst;
}

static void test_sharded(const char *what, kind k, ch_device **devs, int n, const batches *bs)
{
    ch_dp_options o = options();
    o.dist = world;
    o.optimizer = ch_optimizer_defaults(CH_OPT_ADAMW, 0.002f);
    ch_module *a = make_model(k), *b = make_model(k);
    ch_optimizer *oa = NULL, *ob = NULL;
    int64_t pa, pb;
    ch_status sa = train_state(a, &oa, k, devs, n, o, bs, &pa);
    o.shard_optimizer = 1;
    ch_status sb = train_state(b, &ob, k, devs, n, o, bs, &pb);
    int bitwise = 0, state_bitwise = 0;
    double err = INFINITY, state_err = INFINITY;
    if (sa == CH_OK && sb == CH_OK) {
        err = max_rel(b, a, &bitwise);
        state_err = state_rel(ob, oa, &state_bitwise);
    }
    /* The sharded run's gradients cross the processes in a reduce-scatter
     * that adds the ranks' totals in rank order; the unsharded run's in
     * MPI's all-reduce, in MPI's order. Two ranks' sums are the same
     * bits either way (a + b = b + a). Three ranks' may differ in the
     * last bit: the state (the gradients' averages) stays within
     * test-dp's 1e-5, but AdamW divides by the root of v, and where a
     * gradient is the small sum of terms that nearly cancel, its last
     * bit moves the update by more: the parameters within 1e-3. */
    if (ch_dist_size(world) == 2)
        tap_ok(everywhere(bitwise && state_bitwise),
               "%s, AdamW sharded over 2 ranks: the parameters and the whole optimizer state of "
               "the unsharded run, bit for bit (rank %d)",
               what, ch_dist_rank(world));
    else
        tap_ok(everywhere(err < 1e-3 && state_err < 1e-5),
               "%s, AdamW sharded over %d ranks: the optimizer state and the parameters of the "
               "unsharded run (rank %d: max rel err %.2e, want < 1e-5, and %.2e, want < 1e-3)",
               what, ch_dist_size(world), ch_dist_rank(world), state_err, err);
    /* This rank's replicas keep the state of their parts only: together
     * the job's parts are every element once. */
    double parts = (double)pb;
    ch_dist_sum(world, &parts, 1);
    tap_ok(everywhere(sa == CH_OK && sb == CH_OK && pb < pa && (int64_t)parts == pa / n),
           "... rank %d's replicas keep %lld of the %lld elements' state; the ranks' parts add "
           "up to them (%.0f)",
           ch_dist_rank(world), (long long)pb, (long long)(pa / n), parts);
    tap_ok(everywhere(same_as_rank0(b)), "... every rank ends with rank 0's bits");
    ch_optimizer_free(oa);
    ch_optimizer_free(ob);
    ch_module_free(a);
    ch_module_free(b);
}

/* STEPS steps of the cnn from `devs` with `limits` (NULL: none); the
 * parameters end in `out`, the dp in *keep. */
static ch_status train_limited(ch_module *out, ch_device **devs, int n, uint64_t *limits, int shard,
                               const batches *bs, ch_dp **keep)
{
    ch_dp_options o = options();
    o.dist = world;
    o.shard_optimizer = shard;
    o.memory_limits = limits;
    o.nmemory_limits = limits ? n : 0;
    ch_module *model = make_model(CNN);
    ch_module_init(model, 3);
    float loss;
    *keep = NULL;
    ch_status st = ch_dp_new(keep, model, devs, n, &o);
    for (int s = 0; st == CH_OK && s < STEPS; s++)
        st = ch_dp_step(*keep, &loss, &bs->b[s], 0.05f);
    if (st == CH_OK)
        st = ch_dp_sync_to(*keep, out);
    ch_module_free(model);
    return st;
}

/* The limit under which device `dev` cannot hold a pass of one sample of
 * the cnn: what it holds now, and two and a half times its parameters (a
 * replica's parameters and gradients, and the size classes' rounding). */
static uint64_t too_small_limit(ch_device *dev)
{
    ch_module *probe = make_model(CNN);
    uint64_t params = (uint64_t)ch_module_param_numel(probe) * 4;
    ch_module_free(probe);
    ch_memory_stats ms = {0};
    ch_device_memory_stats(dev, &ms);
    return ms.in_use_bytes + 2 * params + params / 2;
}

/* A device too small for one sample of the job's batch, across processes.
 * On a rank that holds another device too (the last one, over 3 ranks):
 * every rank leaves that replica out of the job's split, the rank notes
 * it, and the job trains as it does without that device. As a rank's only
 * device: no process is left without a replica, so every rank's step
 * fails, that rank's naming the device and its limit. */
static void test_left_out(ch_device **devs, int n, const batches *bs)
{
    int rank = ch_dist_rank(world), size = ch_dist_size(world);
    int limited = -1;
    if (rank == size - 1 && n >= 2 && devs[n - 1] != host) {
        limited = n - 1;
        for (int i = 0; i < n - 1; i++)
            limited = devs[i] == devs[n - 1] ? -1 : limited;
    }
    double can = limited >= 0;
    ch_dist_sum(world, &can, 1);
    if (can == 0.0) {
        tap_skip("no rank holds a device beside another one to limit (rank %d)", rank);
    } else {
        ch_module *b = make_model(CNN);
        ch_dp *plain = NULL;
        ch_status sb = train_limited(b, devs, limited >= 0 ? n - 1 : n, NULL, 0, bs, &plain);
        ch_dp_free(plain);
        for (int shard = 0; shard < 2; shard++) {
            uint64_t limits[8] = {0};
            if (limited >= 0)
                limits[limited] = too_small_limit(devs[limited]);
            ch_module *a = make_model(CNN);
            ch_dp *dp = NULL;
            ch_status sa = train_limited(a, devs, n, limits, shard, bs, &dp);
            int size_of[8] = {0}, count[8] = {0}, out[8] = {0};
            if (sa == CH_OK)
                sa = ch_dp_micro_batches(dp, size_of, count, out, n);
            const char *note = dp ? ch_dp_note(dp) : "";
            int noted = 1;
            for (int i = 0; i < n; i++)
                noted = noted && out[i] == (i == limited);
            if (limited >= 0)
                noted =
                    noted && strstr(note, "left out") && strstr(note, ch_device_id(devs[limited]));
            tap_ok(everywhere(sa == CH_OK && noted),
                   "a limit too small for one sample on %s of the last rank%s: every rank trains "
                   "%d steps, that replica left out (rank %d: %s)",
                   limited >= 0 ? ch_device_id(devs[limited]) : "a device",
                   shard ? ", sharded optimizer" : "", STEPS, rank,
                   sa != CH_OK ? ch_last_error() : note);
            ch_dp_free(dp);
            if (limited >= 0)
                ch_device_set_memory_limit(devs[limited], 0);
            int bitwise = 0;
            double err = sa == CH_OK && sb == CH_OK ? max_rel(a, b, &bitwise) : INFINITY;
            tap_ok(everywhere(err < 1e-5),
                   "... as the job without that device trains (rank %d: max rel err %.2e, want < "
                   "1e-5%s)",
                   rank, err, bitwise ? "; bit for bit" : "");
            ch_module_free(a);
        }
        ch_module_free(b);
    }

    /* A rank's only device, too small: the lowest rank with one device
     * that is not the host's. */
    double alone[16] = {0};
    if (size <= 16 && n == 1 && devs[0] != host)
        alone[rank] = 1.0;
    ch_dist_sum(world, alone, size <= 16 ? size : 16);
    int victim = -1;
    for (int k = size <= 16 ? size - 1 : -1; k >= 0; k--)
        victim = alone[k] > 0.0 ? k : victim;
    if (victim < 0) {
        tap_skip("no rank has a single device other than the host (rank %d)", rank);
        return;
    }
    uint64_t limits[8] = {0};
    if (rank == victim)
        limits[0] = too_small_limit(devs[0]);
    ch_module *c = make_model(CNN);
    ch_dp *dp = NULL;
    ch_status st = train_limited(c, devs, n, limits, 0, bs, &dp);
    const char *msg = ch_last_error();
    char failed[32];
    snprintf(failed, sizeof failed, "rank %d failed", victim);
    int named = st != CH_OK && strstr(msg, "limit") &&
                (rank == victim ? st == CH_ERR_DEVICE_OUT_OF_MEMORY &&
                                      strstr(msg, ch_device_id(devs[0])) &&
                                      strstr(msg, "only replica") != NULL
                                : strstr(msg, failed) != NULL);
    tap_ok(everywhere(named),
           "a limit too small for one sample on rank %d's only device: every rank's step fails "
           "with that rank's message, naming the device and its limit, and why it stays (rank "
           "%d: %s)",
           victim, rank, msg);
    ch_dp_free(dp);
    if (rank == victim)
        ch_device_set_memory_limit(devs[0], 0);
    ch_module_free(c);
}

/* Rank r's k-th value for the reduce-scatter: every rank can make every
 * rank's; mixed signs and sizes, so that the order of the sum shows. */
static float scatter_value(int r, int64_t k)
{
    uint32_t h = (uint32_t)(k * 2654435761u) ^ (uint32_t)(r * 40503u + 17u);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    float f = ldexpf((float)(h & 0xffffu) / 65536.0f + 0.5f, (int)(h >> 16) % 24 - 12);
    return h & 0x80000000u ? -f : f;
}

/* nn_comm_reduce_scatter_f32, the sharded optimizer's gradients across
 * the processes: windows cut unevenly (one empty over 3 ranks), sizes on
 * both sides of the call's parallel threshold; each rank's window is the
 * rank-ordered f32 sum of every rank's values there, bit for bit, and the
 * rest is untouched. Then a window no MPI call can take: refused. */
static void test_reduce_scatter(void)
{
    int p = ch_dist_size(world), me = ch_dist_rank(world);
    nn_comm *c = NULL;
    ch_status st = nn_comm_new(&c, world);
    static const int64_t sizes[] = {7, 1000, 300001};
    int64_t first[8], count[8];
    int good = st == CH_OK && p <= 8;
    for (size_t t = 0; good && t < sizeof sizes / sizeof sizes[0]; t++) {
        int64_t n = sizes[t], at = 0, weights = 0;
        for (int k = 0; k < p; k++)
            weights += k == 1 && p > 2 ? 0 : k + 2;
        for (int k = 0; k < p; k++) {
            int64_t w = k == 1 && p > 2 ? 0 : k + 2;
            first[k] = at;
            count[k] = k == p - 1 ? n - at : n * w / weights;
            at += count[k];
        }
        float *v = malloc((size_t)n * sizeof *v);
        if (!v) {
            good = 0;
            break;
        }
        for (int64_t k = 0; k < n; k++)
            v[k] = scatter_value(me, k);
        st = nn_comm_reduce_scatter_f32(c, v, first, count, "test_reduce_scatter");
        int64_t bad = st == CH_OK ? 0 : n;
        for (int64_t k = 0; st == CH_OK && k < n; k++) {
            float want = scatter_value(me, k);
            if (k >= first[me] && k < first[me] + count[me]) {
                want = scatter_value(0, k);
                for (int r = 1; r < p; r++)
                    want += scatter_value(r, k);
            }
            bad += memcmp(&want, &v[k], sizeof want) != 0;
        }
        if (bad)
            tap_diag("rank %d: %lld of %lld elements wrong (%s)", me, (long long)bad, (long long)n,
                     st == CH_OK ? "" : ch_last_error());
        good = bad == 0;
        free(v);
    }
    tap_ok(everywhere(good),
           "nn_comm_reduce_scatter_f32 over %d ranks, uneven windows of 7, 1000 and 300001 "
           "elements: each rank's window holds the rank-ordered sum bit for bit, the rest its own "
           "values (rank %d)",
           p, me);
    float one = 1.0f;
    first[0] = 0;
    for (int k = 0; k < p; k++)
        count[k] = k == 0 ? (int64_t)1 << 40 : 0;
    ch_status big =
        c ? nn_comm_reduce_scatter_f32(c, &one, first, count, "test_reduce_scatter") : CH_ERR_STATE;
    tap_ok(everywhere(big == CH_ERR_INVALID_ARGUMENT && strstr(ch_last_error(), "window")),
           "... a window of 2^40 elements: CH_ERR_INVALID_ARGUMENT before any exchange (%s)",
           ch_last_error());
    nn_comm_free(c);
}

/* ---- bf16 across the processes ------------------------------------------ */

/* bf16: 7 mantissa bits (tap_half_narrow). */
static float value_of(uint16_t h) { return tap_float_of(tap_half_widen(7, h)); }

/* Rank r's k-th value: a random finite bf16 in [-4, 4) (of every
 * exponent there down to 2^-8); rank 0 holds an infinity at n / 2 and the
 * last rank a NaN at n - 1 (with n >= 3). */
static uint16_t rank_value(int r, int ranks, int64_t k, int64_t n, tap_rng *rng)
{
    if (n >= 3 && r == 0 && k == n / 2)
        return 0x7f80u;
    if (n >= 3 && r == ranks - 1 && k == n - 1)
        return 0xffc1u;
    float f = ldexpf(tap_rng_uniform(rng, 1, 2), (int)(tap_rng_next(rng) % 11) - 9);
    return tap_half_narrow(7, tap_rng_next(rng) & 1 ? -f : f);
}

/* ch_dist_sum_bf16: every rank's values summed in f32 in rank order and
 * rounded once, bit for bit against that sum taken here from every rank's
 * values, for sizes that split unevenly over the ranks (one smaller than
 * the group); then the arguments it refuses. */
static void test_sum_bf16(void)
{
    int rank = ch_dist_rank(world), ranks = ch_dist_size(world);
    static const int64_t sizes[] = {1, 2, 1001, 262147};
    for (size_t z = 0; z < sizeof sizes / sizeof sizes[0]; z++) {
        int64_t n = sizes[z];
        uint16_t *mine = malloc((size_t)n * 2), *want = malloc((size_t)n * 2);
        float *acc = malloc((size_t)n * sizeof *acc);
        if (!mine || !want || !acc) {
            tap_ok(0, "out of memory");
            return;
        }
        for (int r = 0; r < ranks; r++) {
            tap_rng rng = {1000u + (uint64_t)r};
            for (int64_t k = 0; k < n; k++) {
                uint16_t h = rank_value(r, ranks, k, n, &rng);
                acc[k] = r == 0 ? value_of(h) : acc[k] + value_of(h);
                if (r == rank)
                    mine[k] = h;
            }
        }
        for (int64_t k = 0; k < n; k++)
            want[k] = tap_half_narrow(7, acc[k]);
        ch_status st = ch_dist_sum_bf16(world, mine, n);
        int64_t bad = 0, first = -1;
        for (int64_t k = 0; st == CH_OK && k < n; k++)
            if (mine[k] != want[k] && bad++ == 0)
                first = k;
        tap_ok(everywhere(st == CH_OK && bad == 0),
               "ch_dist_sum_bf16 of %lld values over %d ranks: the f32 sum in rank order, "
               "rounded once, bit for bit (rank %d: %s; %lld differ, first at %lld)",
               (long long)n, ranks, rank, st == CH_OK ? "ok" : ch_last_error(), (long long)bad,
               (long long)first);
        free(mine);
        free(want);
        free(acc);
    }
#ifdef CHORUS_FAULT_INJECTION
    /* The blocks it receives cannot be allocated (more values than any
     * call before, so it must grow them): every rank fails alike, none is
     * left waiting, and the next call works. */
    int64_t big = (int64_t)1 << 20;
    uint16_t *v = calloc((size_t)big, sizeof *v);
    ch_status oom = CH_ERR_OUT_OF_MEMORY, next = CH_ERR_OUT_OF_MEMORY;
    if (v) {
        chi_fault_arm(CHI_FAULT_ALLOC, 1, 0);
        oom = ch_dist_sum_bf16(world, v, big);
        chi_fault_arm(CHI_FAULT_ALLOC, 0, 0);
        if (oom != CH_OK)
            next = ch_dist_sum_bf16(world, v, big);
    }
    tap_ok(everywhere(v && oom == CH_ERR_OUT_OF_MEMORY && next == CH_OK),
           "ch_dist_sum_bf16 out of memory for its blocks: CH_ERR_OUT_OF_MEMORY on every rank, "
           "then the next call works (rank %d: %s, then %s)", rank, ch_status_str(oom),
           ch_status_str(next));
    free(v);
#else
    tap_skip("ch_dist_sum_bf16 out of memory: a build with --enable-fault-injection tries it");
#endif
    uint16_t one = 0x3f80u;
    ch_status a = ch_dist_sum_bf16(world, NULL, 4), b = ch_dist_sum_bf16(world, &one, -1),
              c = ch_dist_sum_bf16(world, NULL, 0);
    tap_ok(everywhere(a == CH_ERR_INVALID_ARGUMENT && b == CH_ERR_INVALID_ARGUMENT &&
                      c == CH_OK),
           "ch_dist_sum_bf16 refuses NULL values and a negative count; 0 values do nothing");
}

/* Data parallelism with reduce_dtype bf16 across the processes: training
 * goes as in f32 on the host alone (the loss within 0.1, the parameters
 * within 1e-2 of their largest: the gradients lose bits past bf16's 8,
 * relative 2^-9, and 10 SGD steps add up a few of those), other bits than
 * f32's, the same bits twice and on every rank. */
static void test_reduce_bf16(ch_device **devs, int n, const batches *bs)
{
    ch_module *ref = make_model(CNN), *a = make_model(CNN), *b = make_model(CNN);
    ch_dp_options alone = options();
    float lref = train(ref, CNN, &host, 1, alone, bs);
    ch_dp_options o = options();
    o.dist = world;
    o.reduce_dtype = CH_BF16;
    float la = train(a, CNN, devs, n, o, bs);
    float lb = train(b, CNN, devs, n, o, bs);
    int bitwise, same_as_f32;
    double err = max_rel(a, ref, &same_as_f32);
    (void)max_rel(a, b, &bitwise);
    tap_ok(everywhere(isfinite(la) && fabsf(la - lref) < 0.1f && err < 1e-2 && !same_as_f32),
           "cnn, gradients reduced in bf16 over %d ranks: trains as f32 on the host alone "
           "does (rank %d: loss %.4f vs %.4f, max rel err %.2e, want < 1e-2), other bits",
           ch_dist_size(world), ch_dist_rank(world), la, lref, err);
    tap_ok(everywhere(bitwise && la == lb && same_as_rank0(a)),
           "... two runs give the same bits, and every rank rank 0's");
    ch_module_free(ref);
    ch_module_free(a);
    ch_module_free(b);
}

/* Evaluation and prediction over every rank's replicas equal one model's. */
static void test_evaluate(ch_device **devs, int n, const batches *bs)
{
    ch_module *model = make_model(BNNET);
    ch_module_init(model, 5);
    ch_dp_options o = options();
    ch_dp *one = NULL, *dp = NULL;
    ch_status st = ch_dp_new(&one, model, &host, 1, &o);
    o.dist = world;
    if (st == CH_OK)
        st = ch_dp_new(&dp, model, devs, n, &o);
    float loss = 0, loss1 = 0, l;
    int64_t right = -1, right1 = -2;
    /* A step first, so that the running statistics moved. */
    if (st == CH_OK)
        st = ch_dp_step(one, &l, &bs->b[0], 0.01f);
    if (st == CH_OK)
        st = ch_dp_step(dp, &l, &bs->b[0], 0.01f);
    if (st == CH_OK)
        st = ch_dp_evaluate(one, &loss1, &right1, &bs->b[1]);
    if (st == CH_OK)
        st = ch_dp_evaluate(dp, &loss, &right, &bs->b[1]);
    if (st != CH_OK)
        tap_diag("rank %d: %s", ch_dist_rank(world), ch_last_error());
    tap_ok(everywhere(st == CH_OK && right == right1 && fabsf(loss - loss1) < 1e-5f * (1 + loss1)),
           "ch_dp_evaluate over every rank equals one process (%lld right, loss %.6f; want "
           "%lld, %.6f)", (long long)right, loss, (long long)right1, loss1);
    ch_tensor *out = NULL, *out1 = NULL;
    int64_t shape[2] = {BATCH, 10};
    double worst = 1;
    if (st == CH_OK)
        st = ch_tensor_new(&out, host, CH_F32, 2, shape);
    if (st == CH_OK)
        st = ch_tensor_new(&out1, host, CH_F32, 2, shape);
    if (st == CH_OK)
        st = ch_dp_predict(one, out1, &bs->b[2]);
    if (st == CH_OK)
        st = ch_dp_predict(dp, out, &bs->b[2]);
    if (st == CH_OK) {
        float a[BATCH * 10], b[BATCH * 10];
        ch_tensor_download(out, a, sizeof a);
        ch_tensor_download(out1, b, sizeof b);
        worst = 0;
        for (int i = 0; i < BATCH * 10; i++)
            worst = fmax(worst, fabs(a[i] - b[i]) / (1 + fabs(b[i])));
    }
    tap_ok(everywhere(st == CH_OK && worst < 1e-5), "ch_dp_predict gives every rank the rows "
           "of the whole batch (max rel err %.2e, want < 1e-5)", worst);
    ch_tensor_free(out);
    ch_tensor_free(out1);
    ch_dp_free(one);
    ch_dp_free(dp);
    ch_module_free(model);
}

/* Rank 1's replica fails in a step: the step fails on every rank, rank 1
 * with its own message, the others naming rank 1; the next step works. */
static void test_fault(ch_device **devs, int n, const batches *bs, kind k)
{
    int rank = ch_dist_rank(world);
    ch_module *model = make_model(k);
    ch_module_init(model, 5);
    ch_dp_options o = options();
    o.dist = world;
    ch_dp *dp = NULL;
    float l;
    ch_status st = ch_dp_new(&dp, model, devs, n, &o);
    if (st == CH_OK)
        st = ch_dp_step(dp, &l, &bs->b[0], 0.01f);
    tap_ok(everywhere(st == CH_OK), "%s: a step before the failure",
           k == CNN ? "cnn" : "BatchNorm net");
    if (rank == 1)
        chi_dp_fail_next(dp, 0);
    double t0 = ch_clock_seconds();
    ch_status failed = dp ? ch_dp_step(dp, &l, &bs->b[1], 0.01f) : CH_ERR_STATE;
    double took = ch_clock_seconds() - t0;
    const char *msg = ch_last_error();
    int named = rank == 1 ? strstr(msg, "failure injected by a test") != NULL
                          : strstr(msg, "rank 1 failed") != NULL &&
                                strstr(msg, "failure injected by a test") != NULL;
    tap_ok(everywhere(failed == CH_ERR_INTERNAL && named && took < 10.0),
           "... rank 1 fails: the step fails on every rank within %.2f s with rank 1's error "
           "(rank %d: %s: %s)", took, rank, ch_status_str(failed), msg);
    st = dp ? ch_dp_step(dp, &l, &bs->b[2], 0.01f) : CH_ERR_STATE;
    tap_ok(everywhere(st == CH_OK && isfinite(l)), "... and the next step works on every rank "
           "(rank %d: %s)", rank, st == CH_OK ? "ok" : ch_last_error());
    ch_dp_free(dp);
    ch_module_free(model);
}

/* Rank 1's replicas drift from rank 0's (a parameter changed on all of
 * them, so that they still agree among themselves): the next checked step
 * fails on every rank, naming rank 1. */
static void test_divergence(ch_device **devs, int n, const batches *bs)
{
    int rank = ch_dist_rank(world);
    ch_module *model = make_model(CNN);
    ch_module_init(model, 5);
    ch_dp_options o = options();
    o.dist = world;
    o.check_every = 1;
    ch_dp *dp = NULL;
    float l;
    ch_status st = ch_dp_new(&dp, model, devs, n, &o);
    if (st == CH_OK)
        st = ch_dp_step(dp, &l, &bs->b[0], 0.05f);
    for (int i = 0; st == CH_OK && rank == 1 && i < n; i++) {
        ch_tensor *p;
        st = ch_module_param(ch_dp_replica(dp, i), 0, NULL, &p, NULL);
        size_t bytes = st == CH_OK ? ch_tensor_nbytes(p) : 0;
        float *v = malloc(bytes + sizeof *v);
        if (st == CH_OK)
            st = ch_tensor_download(p, v, bytes);
        v[0] += 1.0f;
        if (st == CH_OK)
            st = ch_tensor_upload(p, v, bytes);
        free(v);
        if (st == CH_OK)
            st = ch_device_sync(devs[i]);
    }
    tap_ok(everywhere(st == CH_OK), "a checked step, then rank 1's replicas changed (%s)",
           st == CH_OK ? "ok" : ch_last_error());
    ch_status got = dp ? ch_dp_step(dp, &l, &bs->b[1], 0.05f) : CH_ERR_STATE;
    const char *msg = ch_last_error();
    tap_ok(everywhere(got == CH_ERR_INTERNAL &&
                      strstr(msg, "rank 1 holds other parameters than rank 0") != NULL),
           "... the next checked step fails on every rank naming rank 1 (rank %d: %s)", rank,
           msg);
    ch_dp_free(dp);
    ch_module_free(model);
}

/* Ranks that bring other options fail ch_dp_new on every rank, naming the
 * rank and the option. */
static void test_disagreement(ch_device **devs, int n)
{
    int rank = ch_dist_rank(world);
    ch_module *model = make_model(CNN);
    ch_module_init(model, 5);
    ch_dp_options o = options();
    o.dist = world;
    o.accumulate = rank == 1 ? 2 : 1;
    ch_dp *dp = NULL;
    ch_status st = ch_dp_new(&dp, model, devs, n, &o);
    const char *msg = ch_last_error();
    tap_ok(everywhere(st == CH_ERR_INVALID_ARGUMENT && !dp &&
                      strstr(msg, "rank 1 brings other options->accumulate") != NULL),
           "ranks that disagree on options->accumulate: ch_dp_new fails on every rank "
           "(rank %d: %s)", rank, msg);
    ch_module_free(model);
}

/* The devices of this rank: the `rank`-th of the ';'-separated lists. */
static int rank_devices(const char *lists, int rank, ch_device **devs, int cap, char *names,
                        size_t size)
{
    const char *p = lists;
    for (int k = 0; k < rank && p; k++) {
        p = strchr(p, ';');
        if (p)
            p++;
    }
    if (!p)
        return 0;
    size_t len = strcspn(p, ";");
    snprintf(names, size, "%.*s", (int)len, p);
    int n = 0;
    char *save = NULL, copy[256];
    snprintf(copy, sizeof copy, "%s", names);
    for (char *t = strtok_r(copy, ",", &save); t && n < cap; t = strtok_r(NULL, ",", &save))
        if (ch_device_by_name(&devs[n], t) == CH_OK)
            n++;
        else
            return -1;
    return n;
}

int main(int argc, char **argv)
{
    if (ch_dist_init(&argc, &argv) != CH_OK) {
        printf("not ok 1 - ch_dist_init: %s\n1..1\n", ch_last_error());
        return 1;
    }
    world = ch_dist_world();
    int rank = ch_dist_rank(world), size = ch_dist_size(world);
    /* Rank 0 writes the TAP; the others' lines go to stderr. */
    if (rank != 0)
        dup2(2, 1);
    if (ch_init() != CH_OK) {
        tap_ok(0, "ch_init: %s", ch_last_error());
        ch_dist_finalize();
        return tap_done();
    }
    if (argc < 2) {
        tap_ok(0, "usage: test-dist \"DEVICES;DEVICES;...\" (one list per rank)");
        ch_dist_finalize();
        return tap_done();
    }
    tap_ok(everywhere(size >= 2 && rank >= 0 && rank < size),
           "ch_dist_init: rank %d of %d", rank, size);
    tap_ok(everywhere(ch_dist_local_size(world) == size && ch_dist_local_rank(world) == rank),
           "one machine: local rank %d of %d", ch_dist_local_rank(world),
           ch_dist_local_size(world));
    float f[2] = {(float)(rank + 1), 0.5f};
    double d = rank;
    char word[8] = "";
    if (rank == 0)
        snprintf(word, sizeof word, "chorus");
    ch_status st1 = ch_dist_sum_f32(world, f, 2), st2 = ch_dist_sum(world, &d, 1);
    ch_status st3 = ch_dist_broadcast(world, word, sizeof word, 0), st4 = ch_dist_barrier(world);
    tap_ok(everywhere(st1 == CH_OK && st2 == CH_OK && st3 == CH_OK && st4 == CH_OK &&
                      f[0] == (float)(size * (size + 1) / 2) && f[1] == 0.5f * (float)size &&
                      d == size * (size - 1) / 2.0 && strcmp(word, "chorus") == 0),
           "ch_dist_sum_f32, ch_dist_sum, ch_dist_broadcast and ch_dist_barrier over the ranks "
           "(rank %d: %g %g %g \"%s\")", rank, f[0], f[1], d, word);
    ch_device_by_name(&host, "host");
    ch_device *devs[4];
    char names[256];
    int n = rank_devices(argv[1], rank, devs, 4, names, sizeof names);
    if (!everywhere(n > 0)) {
        tap_skip("rank %d: devices \"%s\" are not all here", rank, names);
        ch_shutdown();
        ch_dist_finalize();
        return tap_done();
    }
    tap_diag("rank %d trains on %s", rank, names);
    batches bs;
    make_batches(&bs);

    ch_dp_options o = options();
    equivalent("cnn", CNN, devs, n, o, &bs);
    equivalent("BatchNorm net (synchronised statistics)", BNNET, devs, n, o, &bs);
    equivalent("dropout net", DROPNET, devs, n, o, &bs);
    equivalent("tiny GPT (2 layers, dim 32, dropout 0.1)", GPT, devs, n, o, &bs);
    float w[4] = {1.0f, 3.0f, 2.0f, 1.0f};
    o.split = CH_DP_SPLIT_WEIGHTS;
    o.weights = w + (rank % 2);
    o.nweights = n;
    equivalent("cnn, weighted split", CNN, devs, n, o, &bs);
    o = options();
    o.split = CH_DP_SPLIT_AUTO;
    equivalent("cnn, automatic split", CNN, devs, n, o, &bs);
    o = options();
    o.accumulate = 2;
    equivalent("cnn, a step every 2 batches (accumulation)", CNN, devs, n, o, &bs);
    o = options();
    o.reduce = CH_REDUCE_AUTO;
    o.bucket_bytes = 4096;
    equivalent("BatchNorm net, auto reduction, 4 KiB buckets", BNNET, devs, n, o, &bs);
    test_repeatable(devs, n, &bs);
    test_sharded("cnn", CNN, devs, n, &bs);
    test_sharded("tiny GPT", GPT, devs, n, &bs);
    test_reduce_scatter();
    test_left_out(devs, n, &bs);
    test_sum_bf16();
    test_reduce_bf16(devs, n, &bs);
    test_evaluate(devs, n, &bs);
    test_fault(devs, n, &bs, CNN);
    test_fault(devs, n, &bs, BNNET);
    test_divergence(devs, n, &bs);
    test_disagreement(devs, n);

    free_batches(&bs);
    ch_shutdown();
    ch_dist_finalize();
    return tap_done();
}
