/* chorus/dist.h in a process started alone (with or without MPI in the
 * build): a job of one process, the watchdog's setting and its errors,
 * a data-parallel job over a group of one that trains as without it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

/* Under AddressSanitizer: whole stacks for every allocation, so that the
 * suppressions of Open MPI's own leaks (tests/lsan-mpi.supp, which make
 * check hands LeakSanitizer) see the MPI frames above the components it
 * unloads. Other builds never call it. */
__attribute__((visibility("default"))) const char *__asan_default_options(void);
__attribute__((visibility("default"))) const char *__asan_default_options(void)
{
    return "fast_unwind_on_malloc=0";
}

static float one_step(ch_dist *d, ch_device *host)
{
    ch_module *m = NULL;
    ch_nn_preset(&m, "mlp");
    ch_module_init(m, 1);
    ch_dp_options o = {0};
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_SGD, 0.1f);
    o.sample_ndim = 3;
    o.sample_shape[0] = 1;
    o.sample_shape[1] = 28;
    o.sample_shape[2] = 28;
    o.dist = d;
    ch_host_buffer *x = NULL, *y = NULL;
    ch_host_buffer_new(&x, host, 8 * 784 * sizeof(float));
    ch_host_buffer_new(&y, host, 8 * sizeof(int32_t));
    tap_rng rng = {3};
    float *px = ch_host_buffer_data(x);
    int32_t *py = ch_host_buffer_data(y);
    for (int i = 0; i < 8 * 784; i++)
        px[i] = tap_rng_uniform(&rng, -1, 1);
    for (int i = 0; i < 8; i++)
        py[i] = i % 10;
    ch_batch b = {x, y, NULL, 8, 0, 0};
    ch_dp *dp = NULL;
    float loss = NAN, second = NAN;
    ch_status st = ch_dp_new(&dp, m, &host, 1, &o);
    if (st == CH_OK)
        st = ch_dp_step(dp, &loss, &b, 0.1f);
    if (st == CH_OK)
        st = ch_dp_step(dp, &second, &b, 0.1f);
    if (st != CH_OK)
        tap_diag("training failed: %s", ch_last_error());
    ch_dp_free(dp);
    ch_module_free(m);
    ch_host_buffer_free(x);
    ch_host_buffer_free(y);
    return st == CH_OK ? second : NAN;
}

int main(void)
{
    /* Started by no launcher, whatever the caller's environment says. */
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
                                       "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
    tap_ok(!ch_dist_launched(), "no launcher: ch_dist_launched is 0");
    tap_ok(ch_dist_world() == NULL && ch_dist_rank(NULL) == 0 && ch_dist_size(NULL) == 1 &&
               ch_dist_local_rank(NULL) == 0 && ch_dist_local_size(NULL) == 1,
           "before ch_dist_init: no world, and NULL is rank 0 of 1");
    tap_ok(ch_dist_timeout(NULL) == 60.0, "the watchdog's default is 60 s (%g)",
           ch_dist_timeout(NULL));
    tap_status_ok(ch_dist_finalize(), "ch_dist_finalize before ch_dist_init: a no-op");

    setenv("CHORUS_DIST_TIMEOUT", "soon", 1);
    tap_status_is(ch_dist_init(NULL, NULL), CH_ERR_INVALID_ARGUMENT, "CHORUS_DIST_TIMEOUT",
                  "CHORUS_DIST_TIMEOUT=soon: ch_dist_init fails");
    setenv("CHORUS_DIST_TIMEOUT", "-3", 1);
    tap_status_is(ch_dist_init(NULL, NULL), CH_ERR_INVALID_ARGUMENT, "expected a number",
                  "CHORUS_DIST_TIMEOUT=-3: ch_dist_init fails");
    setenv("CHORUS_DIST_TIMEOUT", "7.5", 1);
    int argc = 1;
    char arg0[] = "test-dist-local", *args[] = {arg0, NULL}, **argv = args;
    ch_status st = ch_dist_init(&argc, &argv);
    if (!tap_status_ok(st, "ch_dist_init (MPI in the build: %s)", ch_dist_built() ? "yes" : "no"))
        return tap_done();
    ch_dist *w = ch_dist_world();
    tap_ok(w && ch_dist_rank(w) == 0 && ch_dist_size(w) == 1 && ch_dist_local_rank(w) == 0 &&
               ch_dist_local_size(w) == 1,
           "alone: rank %d of %d, local rank %d of %d", ch_dist_rank(w), ch_dist_size(w),
           ch_dist_local_rank(w), ch_dist_local_size(w));
    tap_ok(ch_dist_timeout(w) == 7.5, "CHORUS_DIST_TIMEOUT=7.5 sets the watchdog (%g)",
           ch_dist_timeout(w));
    tap_status_is(ch_dist_init(NULL, NULL), CH_ERR_STATE, "joined already",
                  "ch_dist_init twice");
    tap_status_is(ch_dist_set_timeout(w, 0.0), CH_ERR_INVALID_ARGUMENT, "expected a number > 0",
                  "ch_dist_set_timeout 0");
    tap_status_is(ch_dist_set_timeout(w, NAN), CH_ERR_INVALID_ARGUMENT, "expected a number > 0",
                  "ch_dist_set_timeout NaN");
    tap_status_is(ch_dist_set_timeout(NULL, 5.0), CH_ERR_INVALID_ARGUMENT, "d is NULL",
                  "ch_dist_set_timeout(NULL)");
    tap_ok(ch_dist_set_timeout(w, 12.0) == CH_OK && ch_dist_timeout(w) == 12.0,
           "ch_dist_set_timeout 12");

    char data[8] = "chorus";
    double v[2] = {1.5, -2.0};
    tap_status_ok(ch_dist_barrier(w), "ch_dist_barrier alone");
    tap_ok(ch_dist_broadcast(w, data, sizeof data, 0) == CH_OK && strcmp(data, "chorus") == 0,
           "ch_dist_broadcast from rank 0 alone leaves the data");
    tap_status_is(ch_dist_broadcast(w, data, sizeof data, 1), CH_ERR_INVALID_ARGUMENT,
                  "root is 1", "ch_dist_broadcast from rank 1 of 1");
    tap_status_is(ch_dist_broadcast(w, NULL, 4, 0), CH_ERR_INVALID_ARGUMENT, "data is NULL",
                  "ch_dist_broadcast of NULL");
    tap_ok(ch_dist_sum(w, v, 2) == CH_OK && v[0] == 1.5 && v[1] == -2.0,
           "ch_dist_sum alone: the values themselves");
    tap_status_is(ch_dist_sum(w, v, -1), CH_ERR_INVALID_ARGUMENT, "n is negative",
                  "ch_dist_sum of -1 values");
    tap_status_is(ch_dist_sum(w, NULL, 2), CH_ERR_INVALID_ARGUMENT, "values is NULL",
                  "ch_dist_sum of NULL");
    float f[3] = {0.25f, -1.0f, 3.0f};
    tap_ok(ch_dist_sum_f32(w, f, 3) == CH_OK && f[0] == 0.25f && f[1] == -1.0f && f[2] == 3.0f,
           "ch_dist_sum_f32 alone: the values themselves");
    tap_status_is(ch_dist_sum_f32(w, f, -2), CH_ERR_INVALID_ARGUMENT, "n is negative",
                  "ch_dist_sum_f32 of -2 values");
    tap_status_is(ch_dist_sum_f32(w, NULL, 3), CH_ERR_INVALID_ARGUMENT, "values is NULL",
                  "ch_dist_sum_f32 of NULL");

    st = ch_init();
    ch_device *host = NULL;
    if (st == CH_OK)
        st = ch_device_by_name(&host, "host");
    if (tap_status_ok(st, "ch_init and the host")) {
        float with = one_step(w, host), without = one_step(NULL, host);
        tap_ok(isfinite(with) && memcmp(&with, &without, sizeof with) == 0,
               "ch_dp over a world of one process trains the bits of ch_dp without one (loss "
               "%.7f, %.7f)", with, without);
        ch_shutdown();
    }
    tap_status_ok(ch_dist_finalize(), "ch_dist_finalize");
    tap_ok(ch_dist_world() == NULL, "after ch_dist_finalize: no world");
    tap_status_ok(ch_dist_finalize(), "ch_dist_finalize again: a no-op");
    st = ch_dist_init(NULL, NULL);
    if (ch_dist_built())
        tap_status_is(st, CH_ERR_UNAVAILABLE, "finalized already",
                      "ch_dist_init after MPI was finalized");
    else
        tap_ok(st == CH_OK && ch_dist_finalize() == CH_OK,
               "without MPI, the job can be joined again");
    return tap_done();
}
