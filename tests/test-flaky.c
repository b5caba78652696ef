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

    ch_module_free(a);
    ch_module_free(b);
    tap_mnist_batches_free(&bs);
    ch_shutdown();
    return tap_done();
}
