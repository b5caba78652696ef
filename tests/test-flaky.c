/* The failing-device test backend (tests/flaky-module.c), loaded from the
 * test's folder: its two devices train as the host does (to test-dp's
 * tolerance: their GEMM is a loop of its own) until armed; an
 * armed device fails its call and every later one with CH_ERR_DRIVER,
 * naming itself, and data parallelism over it fails the step naming it
 * (until elastic data parallelism takes such a device out); armed to
 * hang, its call blocks until the device is reset; reset, it works again. */
#include "config.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../nn/nn.h" /* chi_dp_abandoned */
#include "tap.h"

enum {
    STEPS = 4,
    BATCH = 12
};

static void (*arm)(int, long, int);
static void (*reset)(int);
static long (*calls)(int);

static ch_dp_options options(void)
{
    ch_dp_options o = tap_mnist_dp_options(3);
    o.split = CH_DP_SPLIT_EQUAL;
    return o;
}

/* STEPS steps of the smooth cnn over devs; its parameters into out. */
static ch_status train(ch_module *out, ch_device **devs, int n, const tap_mnist_batches *bs)
{
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 3);
    ch_dp_options o = options();
    ch_dp *dp = NULL;
    float loss;
    ch_status st = ch_dp_new(&dp, m, devs, n, &o);
    for (int s = 0; st == CH_OK && s < STEPS; s++)
        st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, out);
    ch_dp_free(dp);
    ch_module_free(m);
    return st;
}

typedef struct hung_call {
    ch_device *dev;
    ch_status st;
    volatile int done;
} hung_call;

static void *alloc_on(void *arg)
{
    hung_call *h = arg;
    ch_tensor *t = NULL;
    int64_t shape[1] = {16};
    h->st = ch_tensor_new(&t, h->dev, CH_F32, 1, shape);
    ch_tensor_free(t);
    h->done = 1;
    return NULL;
}

/* Elastic data parallelism over the same devices: flaky:1 lost halfway
 * through a step costs that step, not the run; reset, it rejoins; armed
 * to hang, it is dropped after the timeout, and its silent thread frees
 * what it held once the device lets it go. */
static void test_elastic(ch_device **three, const tap_mnist_batches *bs)
{
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 3);
    ch_dp_options o = options();
    o.elastic = 1;
    o.elastic_timeout = 0.5;
    ch_dp *dp = NULL;
    float loss;
    ch_status st = ch_dp_new(&dp, m, three, 3, &o);
    long per_step = calls(1);
    if (st == CH_OK)
        st = ch_dp_step(dp, &loss, &bs->b[0], 0.05f);
    per_step = calls(1) - per_step;
    arm(1, per_step / 2 > 0 ? per_step / 2 : 1, 0);
    for (int s = 1; st == CH_OK && s < STEPS; s++)
        st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
    ch_dp_change ch[4];
    int nch = dp ? ch_dp_changes(dp, ch, 4) : 0;
    tap_status_ok(st, "elastic: flaky:1 lost halfway through step 2, all %d steps succeed", STEPS);
    tap_ok(nch == 1 && ch[0].step == 2 && strcmp(ch[0].device, "flaky:1") == 0 &&
               strstr(ch[0].cause, "flaky:1: the device was lost") && ch_dp_replica_count(dp) == 2,
           "... flaky:1 is removed in step 2, its backend's message kept (\"%s\")",
           nch ? ch[0].cause : "");
    reset(1);
    int back = 0;
    st = ch_dp_rejoin(dp, &back);
    if (st == CH_OK)
        st = ch_dp_step(dp, &loss, &bs->b[0], 0.05f);
    tap_ok(st == CH_OK && back == 1 && ch_dp_replica_count(dp) == 3,
           "... reset, it rejoins, and a step runs over the three (%s)",
           st == CH_OK ? "ok" : ch_last_error());
    arm(1, per_step / 2 > 0 ? per_step / 2 : 1, 1);
    double t0 = ch_clock_seconds();
    if (st == CH_OK)
        st = ch_dp_step(dp, &loss, &bs->b[1], 0.05f);
    double secs = ch_clock_seconds() - t0;
    nch = dp ? ch_dp_changes(dp, ch, 4) : 0;
    tap_ok(st == CH_OK && nch == 3 && strstr(ch[2].cause, "no answer within 0.5 s") &&
               ch_dp_replica_count(dp) == 2 && secs < 10.0,
           "... armed to hang, it is dropped after the 0.5 s timeout and the step made again "
           "(%.2f s; \"%s\")",
           secs, nch == 3 ? ch[2].cause : ch_last_error());
    ch_dp_free(dp);
    reset(1);
    for (int i = 0; i < 500 && chi_dp_abandoned() > 0; i++)
        usleep(10 * 1000);
    tap_ok(chi_dp_abandoned() == 0, "... reset, its thread returns and frees what it held");
    ch_module_free(m);
}

int main(void)
{
    const char *dir = getenv("CHORUS_TEST_FLAKY_DIR");
    if (!dir) {
        tap_skip_all("CHORUS_TEST_FLAKY_DIR is not set (make check sets it)");
        return 0;
    }
    char path[4096];
    const char *old = getenv("CHORUS_BACKEND_PATH");
    snprintf(path, sizeof path, "%s%s%s", dir, old && *old ? ":" : "", old && *old ? old : "");
    setenv("CHORUS_BACKEND_PATH", path, 1);
    setenv("CHORUS_DEVICES", "host,flaky:0,flaky:1", 1);
    setenv("CHORUS_QUIET_FALLBACK", "1", 1);
    unsetenv("CHORUS_FLAKY");
    if (!tap_status_ok(ch_init(), "ch_init with the flaky module on the backend path"))
        return tap_done();
    ch_device *host, *f0, *f1;
    int found = ch_device_by_name(&host, "host") == CH_OK &&
                ch_device_by_name(&f0, "flaky:0") == CH_OK &&
                ch_device_by_name(&f1, "flaky:1") == CH_OK;
    snprintf(path, sizeof path, "%s/chorus-flaky.so", dir);
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (lib) {
        *(void **)&arm = dlsym(lib, "chorus_flaky_arm");
        *(void **)&reset = dlsym(lib, "chorus_flaky_reset");
        *(void **)&calls = dlsym(lib, "chorus_flaky_calls");
    }
    if (!tap_ok(found && arm && reset && calls,
                "flaky:0 and flaky:1 are devices, and the loaded module's controls are found "
                "(%s)",
                path)) {
        ch_shutdown();
        return tap_done();
    }

    tap_mnist_batches bs;
    tap_mnist_batches_make(&bs, host, 11, STEPS, BATCH);
    ch_device *three[3] = {host, f0, f1}, *alone[1] = {host};
    ch_module *a = tap_smooth_cnn(0), *b = tap_smooth_cnn(0);
    long before = calls(1);
    ch_status sa = train(a, three, 3, &bs), sb = train(b, alone, 1, &bs);
    double err = sa == CH_OK && sb == CH_OK ? tap_params_max_rel(a, b) : INFINITY;
    tap_ok(calls(1) > before && err < 1e-5,
           "unarmed, %d steps over host,flaky:0,flaky:1 train as the host alone (max rel err "
           "%.2e, want < 1e-5; %ld calls on flaky:1)",
           STEPS, err, calls(1) - before);

    /* Lost in the middle of a step: the step fails naming the device. */
    ch_module *m = tap_smooth_cnn(0);
    ch_module_init(m, 3);
    ch_dp_options o = options();
    ch_dp *dp = NULL;
    float loss;
    ch_status st = ch_dp_new(&dp, m, three, 3, &o);
    if (st == CH_OK)
        st = ch_dp_step(dp, &loss, &bs.b[0], 0.05f);
    long per_step = calls(1);
    if (st == CH_OK)
        st = ch_dp_step(dp, &loss, &bs.b[1], 0.05f);
    per_step = calls(1) - per_step;
    arm(1, per_step / 2 > 0 ? per_step / 2 : 1, 0);
    ch_status lost = st == CH_OK ? ch_dp_step(dp, &loss, &bs.b[2], 0.05f) : st;
    tap_status_is(lost, CH_ERR_DRIVER, "flaky:1: the device was lost",
                  "flaky:1 lost halfway through a step (%ld calls a step): the step fails naming "
                  "it",
                  per_step);
    tap_status_is(ch_dp_step(dp, &loss, &bs.b[3], 0.05f), CH_ERR_DRIVER, "flaky:1",
                  "... and so does the next: the device stays lost");
    ch_tensor *t = NULL;
    int64_t shape[1] = {4};
    tap_status_is(ch_tensor_new(&t, f1, CH_F32, 1, shape), CH_ERR_DRIVER, "flaky:1",
                  "... as does a tensor made on it");
    ch_dp_free(dp);
    ch_module_free(m);
    reset(1);
    st = ch_tensor_new(&t, f1, CH_F32, 1, shape);
    tap_status_ok(st, "reset, flaky:1 makes a tensor again");
    ch_tensor_free(t);

    /* Armed to hang: the call blocks until the device is reset, then fails. */
    hung_call h = {f0, CH_OK, 0};
    arm(0, 1, 1);
    pthread_t th;
    int started = pthread_create(&th, NULL, alloc_on, &h) == 0;
    usleep(300 * 1000);
    int blocked = started && !h.done;
    reset(0);
    if (started)
        pthread_join(th, NULL);
    tap_ok(blocked && h.done && h.st == CH_OK,
           "armed to hang, a call on flaky:0 blocks (still waiting after 0.3 s) until the device "
           "is reset (then status %d)",
           (int)h.st);

    test_elastic(three, &bs);

    ch_module_free(a);
    ch_module_free(b);
    tap_mnist_batches_free(&bs);
    ch_shutdown();
    return tap_done();
}
