/* Micro-batches sized by memory: a replica whose OpenCL device has a memory
 * limit (the host's memory holds this program's own tensors too)
 * trains its share in micro-batches that fit (sized from its first call's
 * peaks), its peak stays under the limit, and the parameters after 10
 * steps are those of an unlimited run to test-dp's tolerance (the
 * gradients of the passes add up in another order); the dropout masks are
 * the same. A device too small for one sample is left out with a note, and
 * the run is then the run without it. A limit on a device holding two
 * replicas, and one beside synchronised BatchNorm, are refused. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

enum {
    BATCH = 24,
    STEPS = 10
};

static ch_device *host;

typedef tap_mnist_batches batches;

static ch_dp_options options(void)
{
    /* SGD with momentum: Adam's division by the second moment would
     * magnify the rounding of the passes' other order of summation. */
    ch_dp_options o = tap_mnist_dp_options(9);
    o.split = CH_DP_SPLIT_EQUAL;
    return o;
}

/* A run of STEPS steps of the dropout net; the parameters end in *out (a
 * host model) and the dp stays in *keep when it is not NULL. */
static ch_status run(ch_module **out, ch_device **devs, int n, ch_dp_options o, const batches *bs,
                     ch_dp **keep, float *loss)
{
    *out = tap_smooth_cnn(1);
    ch_module_init(*out, 3);
    ch_dp *dp = NULL;
    ch_status st = ch_dp_new(&dp, *out, devs, n, &o);
    for (int s = 0; st == CH_OK && s < STEPS; s++)
        st = ch_dp_step(dp, loss, &bs->b[s], 0.05f);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, *out);
    if (st != CH_OK)
        tap_diag("the run failed: %s", ch_last_error());
    if (keep && st == CH_OK)
        *keep = dp;
    else
        ch_dp_free(dp);
    return st;
}

static void test_micro(ch_device **devs, int n, const char *names, int limited, const batches *bs)
{
    ch_device *dev = devs[limited];
    /* The unlimited run's peak on the device, and what it holds before
     * the first step (parameters, gradients). */
    ch_dp_options o = options();
    ch_module *plain = NULL, *micro = NULL;
    float lp = NAN, lm = NAN;
    ch_memory_stats before, after;
    ch_device_memory_stats(dev, &before);
    ch_device_reset_peak(dev);
    ch_status st = run(&plain, devs, n, o, bs, NULL, &lp);
    ch_device_memory_stats(dev, &after);
    uint64_t peak =
        after.peak_bytes - (before.in_use_bytes < after.peak_bytes ? before.in_use_bytes : 0);
    /* The limit: what the replica holds besides its activations, and a
     * third of the activations' room: its share of 8 samples no longer
     * fits at once. */
    ch_module *probe = tap_smooth_cnn(1);
    ch_module_init(probe, 3);
    uint64_t params = (uint64_t)ch_module_param_numel(probe) * 4;
    ch_module_free(probe);
    uint64_t hold = before.in_use_bytes + 3 * params; /* parameters, gradients, momentum */
    uint64_t limit = hold + (peak + before.in_use_bytes - hold) / 3;
    uint64_t limits[3] = {0, 0, 0};
    limits[limited] = limit;
    o.memory_limits = limits;
    o.nmemory_limits = n;
    ch_dp *dp = NULL;
    /* The unlimited run's blocks kept for reuse would count in the peak
     * held from the reset on. */
    ch_device_empty_cache(dev);
    ch_device_reset_peak(dev);
    if (st == CH_OK)
        st = run(&micro, devs, n, o, bs, &dp, &lm);
    int size[3] = {0}, count[3] = {0}, out[3] = {0};
    if (st == CH_OK)
        st = ch_dp_micro_batches(dp, size, count, out, n);
    ch_device_memory_stats(dev, &after);
    double err = st == CH_OK ? tap_params_max_rel(micro, plain) : INFINITY;
    tap_ok(st == CH_OK && size[limited] >= 1 && count[limited] > 1 && out[limited] == 0,
           "%s limited to %.2f MiB over %s: its share of 8 goes in %d micro-batches of %d",
           ch_device_id(dev), (double)limit / 1048576.0, names, count[limited], size[limited]);
    tap_ok(st == CH_OK && after.peak_reserved_bytes <= limit,
           "... its peak (%.2f MiB held) stays under the limit",
           after.peak_reserved_bytes / 1048576.0);
    int others = 1;
    for (int i = 0; i < n; i++)
        others = others && (i == limited || (size[i] == 0 && count[i] == 1));
    tap_ok(others, "... the unlimited replicas run their share in one pass");
    tap_ok(st == CH_OK && err < 1e-5 && fabsf(lm - lp) < 1e-5f * (1.0f + lp),
           "... 10 steps give the unlimited run's parameters (largest relative difference %.2g) "
           "and loss (%.6f, %.6f)",
           err, lm, lp);
    ch_dp_free(dp);
    ch_module_free(micro);
    ch_device_set_memory_limit(dev, 0);

    /* Too small for one sample: left out. */
    limits[limited] = before.in_use_bytes + 2 * params;
    o.memory_limits = limits;
    dp = NULL;
    micro = NULL;
    st = run(&micro, devs, n, o, bs, &dp, &lm);
    if (st == CH_OK)
        st = ch_dp_micro_batches(dp, size, count, out, n);
    const char *note = dp ? ch_dp_note(dp) : "";
    tap_ok(st == CH_OK && out[limited] == 1 && strstr(note, ch_device_id(dev)) &&
               strstr(note, "left out"),
           "%s limited to %.2f MiB: left out, the run goes on (%s)", ch_device_id(dev),
           (double)limits[limited] / 1048576.0, note);
    ch_dp_free(dp);
    ch_device_set_memory_limit(dev, 0);
    /* ... as the run without it. */
    ch_device *rest[3];
    int m = 0;
    for (int i = 0; i < n; i++)
        if (i != limited)
            rest[m++] = devs[i];
    ch_module *without = NULL;
    float lw = NAN;
    ch_status sw = m > 0 ? run(&without, rest, m, options(), bs, NULL, &lw) : CH_ERR_STATE;
    err = st == CH_OK && sw == CH_OK ? tap_params_max_rel(micro, without) : INFINITY;
    tap_ok(err < 1e-5, "... and trains as the run without it (largest relative difference %.2g)",
           err);
    ch_module_free(without);
    ch_module_free(micro);
    ch_module_free(plain);
}

static void test_refused(ch_device **devs, int n)
{
    ch_dp_options o = options();
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 3);
    ch_dp *dp = NULL;
    ch_device *twice[2] = {devs[n - 1], devs[n - 1]};
    uint64_t limits[2] = {(uint64_t)1 << 30, 0};
    o.memory_limits = limits;
    o.nmemory_limits = 2;
    tap_status_is(ch_dp_new(&dp, m, twice, 2, &o), CH_ERR_UNSUPPORTED, "two replicas",
                  "a limited device holding two replicas is refused");
    ch_device_set_memory_limit(twice[0], 0);
    ch_module_free(m);
    /* BatchNorm synchronised over the whole batch cannot be cut. */
    ch_module *children[3] = {NULL, NULL, NULL};
    ch_nn_batchnorm2d(&children[0], 1, 1e-5f, 0.1f);
    ch_nn_flatten(&children[1]);
    ch_nn_linear(&children[2], 784, 10);
    m = tap_sequential(3, children);
    ch_device *two[2] = {host, devs[n - 1] != host ? devs[n - 1] : host};
    int nt = two[1] != host ? 2 : 1;
    if (nt == 1) {
        tap_skip("no second device: synchronised BatchNorm under a limit not tried");
    } else {
        o.nmemory_limits = 2;
        tap_status_is(ch_dp_new(&dp, m, two, 2, &o), CH_ERR_UNSUPPORTED, "batchnorm_local",
                      "a limit beside synchronised BatchNorm is refused");
        ch_device_set_memory_limit(two[0], 0);
        o.batchnorm_local = 1;
        tap_status_ok(ch_dp_new(&dp, m, two, 2, &o), "... and taken with local statistics");
        ch_dp_free(dp);
        ch_device_set_memory_limit(two[0], 0);
    }
    ch_module_free(m);
    tap_status_is(ch_dp_micro_batches(NULL, NULL, NULL, NULL, 0), CH_ERR_INVALID_ARGUMENT, "dp",
                  "ch_dp_micro_batches(NULL)");
    tap_ok(strcmp(ch_dp_note(NULL), "") == 0, "ch_dp_note(NULL) is \"\"");
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    ch_device_by_name(&host, "host");
    ch_device *ocl0 = NULL, *ocl1 = NULL;
    if (!tap_cross_pair(&ocl0, &ocl1) && !tap_peer_pair(&ocl0, &ocl1))
        ocl0 = ocl1 = NULL;
    batches bs;
    tap_mnist_batches_make(&bs, host, 5, STEPS, BATCH);
    if (ocl0) {
        ch_device *three[3] = {host, ocl0, ocl1};
        char names[96];
        snprintf(names, sizeof names, "host,%s,%s", ch_device_id(ocl0), ch_device_id(ocl1));
        test_micro(three, 3, names, 1, &bs);
        test_micro(three, 3, names, 2, &bs);
        /* Replica 0 limited: when it is left out, another leads. */
        ch_device *first[3] = {ocl0, ocl1, host};
        snprintf(names, sizeof names, "%s,%s,host", ch_device_id(ocl0), ch_device_id(ocl1));
        test_micro(first, 3, names, 0, &bs);
        test_refused(three, 3);
    } else {
        tap_diag("no two OpenCL devices: host and itself are one device");
        tap_skip("no OpenCL devices: micro-batches beside other devices not tried");
        test_refused(&host, 1);
    }
    tap_mnist_batches_free(&bs);
    ch_shutdown();
    return tap_done();
}
