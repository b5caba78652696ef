/* The sharded optimizer (ch_dp_options.shard_optimizer, ZeRO stage 1):
 * over host and two OpenCL devices (of two vendors' platforms where there
 * are two), 20 steps with sharding give the parameters and the optimizer
 * state of 20 steps without, bit for bit with host reduction, with AdamW
 * and SGD with momentum, with uneven splits, gradient accumulation and
 * fp16; peer reduction to its tolerance. Each replica's optimizer memory,
 * measured by the device's accounting, falls to its part. The whole state
 * comes out (ch_dp_optimizer_get) for a checkpoint that resumes on another
 * mix of devices, sharded or not, as the straight run goes on. Bad calls
 * are errors. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

enum {
    BATCH = 24,
    STEPS = 20
};

static ch_device *host, *ocl0, *ocl1;

typedef tap_mnist_batches batches;

static ch_dp_options options(ch_optimizer_kind kind)
{
    ch_dp_options o = tap_mnist_dp_options(5);
    if (kind != CH_OPT_SGD)
        o.optimizer = ch_optimizer_defaults(kind, 0.002f);
    return o;
}

/* What a run ends with: the parameters (a host model) and the whole
 * optimizer state (on the host), and the last loss. */
typedef struct result {
    ch_module *model;
    ch_optimizer *opt;
    float loss;
} result;

static void result_free(result *r)
{
    ch_optimizer_free(r->opt);
    ch_module_free(r->model);
}

/* Steps [from, to) of the batches over devs, starting from `start` (a
 * result of an earlier run, or NULL: a fresh model) and ending in *out. */
static ch_status run(result *out, ch_device **devs, int n, ch_dp_options o, const batches *bs,
                     int from, int to, const result *start)
{
    out->model = tap_smooth_cnn(0);
    out->opt = NULL;
    out->loss = NAN;
    ch_module_init(out->model, 3);
    /* A resumed run starts from start's parameters, and its state goes
     * in through ch_dp_optimizer_set. */
    ch_module *m = start ? start->model : out->model;
    ch_dp *dp = NULL;
    ch_status st = ch_dp_new(&dp, m, devs, n, &o);
    if (st == CH_OK)
        st = ch_optimizer_new(&out->opt, out->model, &o.optimizer);
    if (st == CH_OK && start)
        st = ch_dp_optimizer_set(dp, start->opt);
    for (int s = from; st == CH_OK && s < to; s++)
        st = ch_dp_step(dp, &out->loss, &bs->b[s], o.optimizer.kind == CH_OPT_SGD ? 0.05f : 0.002f);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, out->model);
    if (st == CH_OK)
        st = ch_dp_optimizer_get(dp, out->opt);
    if (st != CH_OK)
        tap_diag("the run failed: %s", ch_last_error());
    ch_dp_free(dp);
    return st;
}

/* Largest |a - b| / max|b| over the parameters and the optimizer's state
 * tensors; *bitwise: all equal bit for bit. */
static double compare(const result *a, const result *b, int *bitwise)
{
    double worst = 0.0;
    *bitwise = 1;
    int np = ch_module_param_count(a->model), ns = ch_optimizer_state_count(a->opt);
    for (int i = 0; i < np + ns; i++) {
        ch_tensor *ta = NULL, *tb = NULL;
        if (i < np) {
            ch_module_param(a->model, i, NULL, &ta, NULL);
            ch_module_param(b->model, i, NULL, &tb, NULL);
        } else {
            ch_optimizer_state(a->opt, i - np, NULL, &ta);
            ch_optimizer_state(b->opt, i - np, NULL, &tb);
        }
        if (!ta || !tb) {
            if (ta != tb) {
                *bitwise = 0;
                return INFINITY;
            }
            continue;
        }
        int64_t n = ch_tensor_numel(ta);
        float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        ch_tensor_download(ta, x, (size_t)n * 4);
        ch_tensor_download(tb, y, (size_t)n * 4);
        double scale = 0.0, diff = 0.0;
        for (int64_t k = 0; k < n; k++) {
            scale = fmax(scale, fabs(y[k]));
            diff = fmax(diff, fabs((double)x[k] - y[k]));
        }
        if (memcmp(x, y, (size_t)n * 4) != 0)
            *bitwise = 0;
        worst = fmax(worst, scale > 0 ? diff / scale : diff);
        free(x);
        free(y);
    }
    return worst;
}

static void same(const char *what, ch_device **devs, int n, const char *names, ch_dp_options o,
                 const batches *bs, int want_bitwise)
{
    result plain, sharded;
    ch_status a = run(&plain, devs, n, o, bs, 0, STEPS, NULL);
    o.shard_optimizer = 1;
    ch_status b = run(&sharded, devs, n, o, bs, 0, STEPS, NULL);
    int bitwise = 0;
    double err = a == CH_OK && b == CH_OK ? compare(&sharded, &plain, &bitwise) : INFINITY;
    if (want_bitwise)
        tap_ok(a == CH_OK && b == CH_OK && bitwise,
               "%s over %s: 20 sharded steps give the unsharded parameters and optimizer state "
               "bit for bit (loss %.5f, %.5f)",
               what, names, sharded.loss, plain.loss);
    else
        tap_ok(a == CH_OK && b == CH_OK && err < 1e-5,
               "%s over %s: 20 sharded steps give the unsharded parameters and state (worst "
               "relative difference %.2g)",
               what, names, err);
    result_free(&plain);
    result_free(&sharded);
}

/* What each device holds after the first step, minus before it: in_use
 * (the allocator's blocks) and the tensors' own bytes. */
static ch_status first_step_growth(ch_device **devs, int n, ch_dp_options o, const batches *bs,
                                   int64_t *growth, int64_t *tensors, int64_t *first,
                                   int64_t *count)
{
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 3);
    ch_dp *dp = NULL;
    ch_status st = ch_dp_new(&dp, m, devs, n, &o);
    ch_memory_stats before[3], after[3];
    for (int i = 0; st == CH_OK && i < n; i++)
        st = ch_device_memory_stats(devs[i], &before[i]);
    float loss;
    if (st == CH_OK)
        st = ch_dp_step(dp, &loss, &bs->b[0], 0.002f);
    for (int i = 0; st == CH_OK && i < n; i++) {
        st = ch_device_memory_stats(devs[i], &after[i]);
        growth[i] = (int64_t)after[i].in_use_bytes - (int64_t)before[i].in_use_bytes;
        tensors[i] = (int64_t)after[i].tensor_bytes - (int64_t)before[i].tensor_bytes;
        if (st == CH_OK)
            st = ch_dp_shard(dp, i, &first[i], &count[i]);
    }
    ch_dp_free(dp);
    ch_module_free(m);
    return st;
}

static void test_memory(ch_device **devs, int n, const char *names, const batches *bs)
{
    ch_dp_options o = options(CH_OPT_ADAMW);
    int64_t g_plain[3], g_shard[3], t_plain[3], t_shard[3], first[3], count[3], f0[3], c0[3];
    ch_status a = first_step_growth(devs, n, o, bs, g_plain, t_plain, f0, c0);
    o.shard_optimizer = 1;
    ch_status b = first_step_growth(devs, n, o, bs, g_shard, t_shard, first, count);
    if (!tap_ok(a == CH_OK && b == CH_OK, "the first step's memory over %s, sharded and not",
                names))
        return;
    int64_t numel = c0[0], covered = 0;
    for (int i = 0; i < n; i++) {
        tap_ok(f0[i] == 0 && c0[i] == numel, "unsharded, replica %d keeps every element's state",
               i);
        tap_ok(first[i] == covered && count[i] > 0,
               "sharded, replica %d's part starts where the "
               "last ended (%lld + %lld)",
               i, (long long)first[i], (long long)count[i]);
        covered += count[i];
        /* AdamW keeps two moments: 8 bytes an element. What sharding saves
         * on a device is the state of the elements it does not own; the
         * allocator rounds each tensor up to its size class (at most 25%,
         * 11% on average): the bounds allow for that. */
        double saved = (double)(g_plain[i] - g_shard[i]), want = 8.0 * (double)(numel - count[i]);
        tap_ok(saved > 0.9 * want && saved < 1.3 * want,
               "replica %d on %s: its first step takes %lld bytes sharded, %lld not: %.0f%% of "
               "the other elements' state (%lld of %lld elements are its own)",
               i, ch_device_id(devs[i]), (long long)g_shard[i], (long long)g_plain[i],
               100.0 * saved / want, (long long)count[i], (long long)numel);
        /* The tensors' own bytes, before the size classes: the state made
         * at the first step is 8 bytes for each element of its part. */
        double own = (double)t_shard[i] - ((double)t_plain[i] - 8.0 * (double)numel);
        double share = own / (8.0 * (double)numel), part = (double)count[i] / (double)numel;
        tap_ok(fabs(share - part) < 0.02 * part,
               "replica %d on %s: its optimizer state is %.2f%% of the whole (%.0f bytes of "
               "tensors), its part %.2f%% of the elements",
               i, ch_device_id(devs[i]), 100.0 * share, own, 100.0 * part);
    }
    tap_ok(covered == numel, "the parts cover the %lld elements (%lld)", (long long)numel,
           (long long)covered);
}

/* The straight run of 20 steps against 10 steps, the whole state out to a
 * checkpoint file, and 10 more steps on another mix of devices. */
static void test_resume(ch_device **devs, int n, const char *names, ch_device **other, int nother,
                        const char *other_names, int shard_after, const batches *bs)
{
    ch_dp_options o = options(CH_OPT_ADAMW);
    o.shard_optimizer = 1;
    result straight, half, resumed;
    ch_status st = run(&straight, devs, n, o, bs, 0, STEPS, NULL);
    if (st == CH_OK)
        st = run(&half, devs, n, o, bs, 0, STEPS / 2, NULL);
    char path[64];
    snprintf(path, sizeof path, "/tmp/test-dp-shard-%d.safetensors", (int)getpid());
    if (st == CH_OK)
        st = ch_checkpoint_save(path, half.model, half.opt, NULL);
    result loaded = {tap_smooth_cnn(0), NULL, 0};
    if (st == CH_OK)
        st = ch_optimizer_new(&loaded.opt, loaded.model, &o.optimizer);
    if (st == CH_OK)
        st = ch_checkpoint_load(path, loaded.model, loaded.opt, NULL);
    unlink(path);
    o.shard_optimizer = shard_after;
    if (st == CH_OK)
        st = run(&resumed, other, nother, o, bs, STEPS / 2, STEPS, &loaded);
    int bitwise = 0;
    double err = st == CH_OK ? compare(&resumed, &straight, &bitwise) : INFINITY;
    /* The same devices sum the gradients in the same order: the same bits.
     * Others sum them in another: test-dp's tolerance. */
    int same_mix = nother == n && memcmp(other, devs, (size_t)n * sizeof *devs) == 0;
    if (same_mix)
        tap_ok(st == CH_OK && bitwise,
               "sharded over %s for 10 steps, a checkpoint, 10 more steps over %s (%s) give the "
               "20 straight steps' parameters and state bit for bit",
               names, other_names, shard_after ? "sharded" : "not sharded");
    else
        tap_ok(st == CH_OK && err < 1e-5,
               "sharded over %s for 10 steps, a checkpoint, 10 more steps over %s (%s) give the "
               "20 straight steps' parameters and state (largest relative difference %.2g)",
               names, other_names, shard_after ? "sharded" : "not sharded", err);
    if (st != CH_OK)
        tap_diag("%s", ch_last_error());
    result_free(&loaded);
    if (st == CH_OK) {
        result_free(&straight);
        result_free(&half);
        result_free(&resumed);
    }
}

/* Parts in proportion to the devices' memory limits. */
static void test_limits(ch_device **devs, int n, const char *names, const batches *bs)
{
    ch_dp_options o = options(CH_OPT_ADAMW);
    const uint64_t limits[3] = {(uint64_t)3 << 30, (uint64_t)1 << 30, (uint64_t)2 << 30};
    o.memory_limits = limits;
    o.nmemory_limits = 3;
    o.shard_optimizer = 1;
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 3);
    ch_dp *dp = NULL;
    if (devs[0] == devs[1] || devs[1] == devs[2] || devs[0] == devs[2]) {
        /* A limited device holds one replica. */
        tap_skip("%s: not three devices: parts by limits not tried", names);
        tap_skip("%s: not three devices", names);
        tap_skip("%s: not three devices", names);
        o.nmemory_limits = 2;
        tap_status_is(ch_dp_new(&dp, m, devs, n, &o), CH_ERR_INVALID_ARGUMENT, "memory limits",
                      "2 memory limits for 3 devices");
        ch_module_free(m);
        return;
    }
    ch_status st = ch_dp_new(&dp, m, devs, n, &o);
    int64_t first[3] = {0}, count[3] = {0}, numel = ch_module_param_numel(m);
    for (int i = 0; st == CH_OK && i < n; i++)
        st = ch_dp_shard(dp, i, &first[i], &count[i]);
    double want[3] = {0.5, 1.0 / 6.0, 1.0 / 3.0};
    int near = 1;
    for (int i = 0; i < n; i++)
        near = near && fabs((double)count[i] / (double)numel - want[i]) < 1e-4;
    tap_ok(st == CH_OK && near && first[1] == count[0] && first[2] == first[1] + count[1],
           "limits of 3, 1 and 2 GiB over %s: parts of %lld, %lld and %lld of %lld elements", names,
           (long long)count[0], (long long)count[1], (long long)count[2], (long long)numel);
    ch_memory_stats ms;
    ch_device_memory_stats(devs[1], &ms);
    tap_ok(ms.limit_bytes == limits[1],
           "... ch_dp_new set %s's limit (%llu)", ch_device_id(devs[1]),
           (unsigned long long)ms.limit_bytes);
    ch_dp_free(dp);
    for (int i = 0; i < n; i++)
        ch_device_set_memory_limit(devs[i], 0);
    /* Still the unsharded run's bits, with uneven parts. */
    o.memory_limits = limits;
    same("AdamW, parts by memory limits", devs, n, names, o, bs, 1);
    for (int i = 0; i < n; i++)
        ch_device_set_memory_limit(devs[i], 0);
    o.nmemory_limits = 2;
    tap_status_is(ch_dp_new(&dp, m, devs, n, &o), CH_ERR_INVALID_ARGUMENT, "memory limits",
                  "2 memory limits for 3 devices");
    ch_module_free(m);
}

static void test_errors(ch_device **devs, int n, const batches *bs)
{
    ch_dp_options o = options(CH_OPT_ADAMW);
    o.shard_optimizer = 1;
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 3);
    ch_dp *dp = NULL;
    if (!tap_status_ok(ch_dp_new(&dp, m, devs, n, &o), "a sharded dp for bad calls")) {
        ch_module_free(m);
        return;
    }
    float loss;
    tap_status_ok(ch_dp_step(dp, &loss, &bs->b[0], 0.002f), "one sharded step");
    ch_optimizer *whole = NULL, *sgd = NULL;
    ch_optimizer_new(&whole, m, &o.optimizer);
    ch_optimizer_options so = ch_optimizer_defaults(CH_OPT_SGD, 0.1f);
    ch_optimizer_new(&sgd, m, &so);
    tap_status_is(ch_dp_optimizer_get(NULL, whole), CH_ERR_INVALID_ARGUMENT, "dp",
                  "ch_dp_optimizer_get(NULL, opt)");
    tap_status_is(ch_dp_optimizer_get(dp, NULL), CH_ERR_INVALID_ARGUMENT, "opt",
                  "ch_dp_optimizer_get(dp, NULL)");
    tap_status_is(ch_dp_optimizer_set(dp, NULL), CH_ERR_INVALID_ARGUMENT, "opt",
                  "ch_dp_optimizer_set(dp, NULL)");
    tap_status_is(ch_dp_optimizer_get(dp, sgd), CH_ERR_INVALID_ARGUMENT, "kind",
                  "ch_dp_optimizer_get into an optimizer of another kind");
    tap_status_is(ch_dp_optimizer_set(dp, sgd), CH_ERR_INVALID_ARGUMENT, "kind",
                  "ch_dp_optimizer_set from an optimizer of another kind");
    ch_optimizer *part = ch_dp_optimizer(dp, n - 1);
    tap_status_is(ch_dp_optimizer_get(dp, part), CH_ERR_INVALID_ARGUMENT, "part",
                  "ch_dp_optimizer_get into a sharded replica's own optimizer");
    tap_status_is(ch_checkpoint_save("/tmp/never.safetensors", ch_dp_replica(dp, 0), part, NULL),
                  CH_ERR_STATE, "ch_dp_optimizer_get",
                  "ch_checkpoint_save of a sharded replica's optimizer says what to use");
    tap_ok(access("/tmp/never.safetensors", F_OK) != 0, "... and writes nothing");
    tap_status_is(ch_checkpoint_load("/tmp/never.safetensors", ch_dp_replica(dp, 0), part, NULL),
                  CH_ERR_STATE, "ch_dp_optimizer_set",
                  "ch_checkpoint_load into a sharded replica's optimizer says what to use");
    int64_t first, count;
    tap_status_is(ch_dp_shard(NULL, 0, &first, &count), CH_ERR_INVALID_ARGUMENT, "dp",
                  "ch_dp_shard(NULL)");
    tap_status_is(ch_dp_shard(dp, n, &first, &count), CH_ERR_INVALID_ARGUMENT, "index",
                  "ch_dp_shard of a replica out of range");
    tap_status_ok(ch_dp_shard(dp, 0, NULL, NULL), "ch_dp_shard with NULL outputs");
    ch_optimizer_free(whole);
    ch_optimizer_free(sgd);
    ch_dp_free(dp);
    ch_module_free(m);
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    ch_device_by_name(&host, "host");
    ch_device *peer0 = NULL, *peer1 = NULL, *cross0 = NULL, *cross1 = NULL;
    if (!tap_peer_pair(&peer0, &peer1))
        peer0 = peer1 = NULL;
    if (!tap_cross_pair(&cross0, &cross1))
        cross0 = cross1 = NULL;
    ocl0 = cross0 ? cross0 : peer0;
    ocl1 = cross0 ? cross1 : peer1;
    batches bs;
    tap_mnist_batches_make(&bs, host, 7, STEPS, BATCH);

    ch_device *three[3] = {host, host, host};
    char names[96] = "host,host,host";
    if (ocl0) {
        three[1] = ocl0;
        three[2] = ocl1;
        snprintf(names, sizeof names, "host,%s,%s", ch_device_id(ocl0), ch_device_id(ocl1));
    } else {
        tap_diag("no two OpenCL devices: three replicas on host instead");
    }
    same("AdamW, host reduction", three, 3, names, options(CH_OPT_ADAMW), &bs, 1);
    same("SGD with momentum, host reduction", three, 3, names, options(CH_OPT_SGD), &bs, 1);
    ch_dp_options o = options(CH_OPT_ADAM);
    const float uneven[3] = {1, 2, 5};
    o.split = CH_DP_SPLIT_WEIGHTS;
    o.weights = uneven;
    o.nweights = 3;
    same("Adam, an uneven split", three, 3, names, o, &bs, 1);
    o = options(CH_OPT_ADAMW);
    o.accumulate = 2;
    same("AdamW, two micro-batches a step", three, 3, names, o, &bs, 1);
    o = options(CH_OPT_ADAMW);
    o.precision = CH_F16;
    o.loss_scale = 1e30f; /* the first steps overflow and are skipped */
    same("AdamW, fp16 with skipped steps", three, 3, names, o, &bs, 1);
    if (peer0) {
        ch_device *pair[2] = {peer0, peer1};
        char pn[64];
        snprintf(pn, sizeof pn, "%s,%s", ch_device_id(peer0), ch_device_id(peer1));
        o = options(CH_OPT_ADAMW);
        o.reduce = CH_REDUCE_PEER;
        same("AdamW, peer reduction", pair, 2, pn, o, &bs, 0);
    } else {
        tap_skip("no two OpenCL devices of one platform: peer reduction not tried");
    }
    if (ocl0) {
        test_memory(three, 3, names, &bs);
    } else {
        tap_skip("no OpenCL devices: the memory of each device's replica not measured");
    }
    test_limits(three, 3, names, &bs);
    ch_device *one[1] = {host};
    ch_device *two[2] = {ocl1 ? ocl1 : host, host};
    char two_names[64];
    snprintf(two_names, sizeof two_names, "%s,host", ch_device_id(two[0]));
    test_resume(three, 3, names, three, 3, names, 1, &bs);
    test_resume(three, 3, names, three, 3, names, 0, &bs);
    test_resume(three, 3, names, one, 1, "host", 0, &bs);
    test_resume(three, 3, names, two, 2, two_names, 1, &bs);
    test_resume(three, 3, names, two, 2, two_names, 0, &bs);
    test_errors(three, 3, &bs);
    tap_mnist_batches_free(&bs);
    ch_shutdown();
    return tap_done();
}
