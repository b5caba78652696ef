/* Data parallelism: training over several replicas matches training on one
 * device with the same global batch, any split gives the same result, host
 * reduction is bit-for-bit repeatable, bad options are errors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "../nn/nn.h" /* chi_dp_fail_next, the fault-injection hook */
#include <time.h>

enum { BATCH = 24, STEPS = 20 };

static ch_device *host;

/* A fixed sequence of random batches in pinned host memory. */
typedef struct batches {
    ch_host_buffer *images[STEPS], *labels[STEPS];
    ch_batch b[STEPS];
} batches;

static void make_batches(batches *bs)
{
    tap_rng rng = {99};
    for (int s = 0; s < STEPS; s++) {
        ch_host_buffer_new(&bs->images[s], host, sizeof(float) * BATCH * 28 * 28);
        ch_host_buffer_new(&bs->labels[s], host, sizeof(int32_t) * BATCH);
        float *x = ch_host_buffer_data(bs->images[s]);
        int32_t *l = ch_host_buffer_data(bs->labels[s]);
        for (int i = 0; i < BATCH * 28 * 28; i++)
            x[i] = tap_rng_uniform(&rng, -1, 1);
        for (int i = 0; i < BATCH; i++) {
            l[i] = (int32_t)(tap_rng_next(&rng) % 10);
            /* A little signal so the loss moves: brighten a class's row. */
            for (int j = 0; j < 28; j++)
                x[i * 784 + l[i] * 28 + j] += 1.5f;
        }
        bs->b[s] = (ch_batch){bs->images[s], bs->labels[s], NULL, BATCH, 0, s};
    }
}

static void free_batches(batches *bs)
{
    for (int s = 0; s < STEPS; s++) {
        ch_host_buffer_free(bs->images[s]);
        ch_host_buffer_free(bs->labels[s]);
    }
}

static ch_dp_options options(const float *weights)
{
    ch_dp_options o = {0};
    o.reduce = CH_DP_REDUCE_HOST;
    o.weights = weights;
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_SGD, 0.05f);
    o.optimizer.momentum = 0.9f;
    o.sample_ndim = 3;
    o.sample_shape[0] = 1;
    o.sample_shape[1] = 28;
    o.sample_shape[2] = 28;
    o.seed = 5;
    return o;
}

/* Train the cnn for STEPS steps over `devs`; the parameters end in `out`
 * (a host model). Returns the last loss, NAN on failure. */
static float train(ch_module *out, ch_device **devs, int n, const float *weights,
                   const batches *bs)
{
    ch_module *model = NULL;
    ch_nn_preset(&model, "cnn");
    ch_module_init(model, 3);
    ch_dp_options o = options(weights);
    ch_dp *dp = NULL;
    float loss = NAN;
    ch_status st = ch_dp_new(&dp, model, devs, n, &o);
    for (int s = 0; st == CH_OK && s < STEPS; s++)
        st = ch_dp_step(dp, &bs->b[s], 0.05f, &loss);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, out);
    if (st != CH_OK) {
        tap_diag("training failed: %s", ch_last_error());
        loss = NAN;
    }
    ch_dp_free(dp);
    ch_module_free(model);
    return loss;
}

/* Over every parameter tensor, the largest max|a - b| / max|b|. */
static double max_rel(ch_module *a, ch_module *b, int *bitwise)
{
    double worst = 0;
    *bitwise = 1;
    for (int i = 0; i < ch_module_param_count(a); i++) {
        ch_tensor *ta, *tb;
        ch_module_param(a, i, NULL, &ta, NULL);
        ch_module_param(b, i, NULL, &tb, NULL);
        size_t n = (size_t)ch_tensor_numel(ta);
        float *va = malloc(n * sizeof *va), *vb = malloc(n * sizeof *vb);
        ch_tensor_download(ta, va, n * sizeof *va);
        ch_tensor_download(tb, vb, n * sizeof *vb);
        double scale = 0;
        for (size_t k = 0; k < n; k++)
            scale = fmax(scale, fabs(vb[k]));
        double diff = 0;
        for (size_t k = 0; k < n; k++) {
            diff = fmax(diff, fabs(va[k] - vb[k]));
            *bitwise = *bitwise && va[k] == vb[k];
        }
        worst = fmax(worst, diff / scale);
        free(va);
        free(vb);
    }
    return worst;
}

static ch_module *host_cnn(void)
{
    ch_module *m = NULL;
    ch_nn_preset(&m, "cnn");
    return m;
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    ch_device_by_name(&host, "host");
    batches bs;
    make_batches(&bs);

    ch_module *single = host_cnn();
    ch_device *one[1] = {host};
    float l1 = train(single, one, 1, NULL, &bs);
    tap_ok(isfinite(l1) && l1 < 2.2f, "20 steps on host alone train (last loss %.4f)", l1);

    ch_device *three[3] = {host, host, host};
    const char *names = "host,host,host";
    ch_device *ocl0 = NULL, *ocl1 = NULL;
    if (ch_device_by_name(&ocl0, "opencl:0") == CH_OK &&
        ch_device_by_name(&ocl1, "opencl:1") == CH_OK) {
        three[1] = ocl0;
        three[2] = ocl1;
        names = "host,opencl:0,opencl:1";
    } else {
        tap_diag("no opencl:0 and opencl:1: three replicas on host instead");
    }
    const float uneven[3] = {1, 2, 5};
    const struct {
        const char *what;
        const float *w;
    } splits[2] = {{"equal split", NULL}, {"split 1:2:5", uneven}};
    for (int k = 0; k < 2; k++) {
        ch_module *dp = host_cnn();
        float l = train(dp, three, 3, splits[k].w, &bs);
        int bitwise;
        double err = max_rel(dp, single, &bitwise);
        tap_ok(isfinite(l) && err < 1e-5,
               "%s over %s: parameters after %d steps match host alone "
               "(max rel err %.2e, want < 1e-5; loss %.4f vs %.4f)",
               splits[k].what, names, STEPS, err, l, l1);
        ch_module_free(dp);
    }

    ch_module *a = host_cnn(), *b = host_cnn();
    train(a, three, 3, uneven, &bs);
    train(b, three, 3, uneven, &bs);
    int bitwise;
    max_rel(a, b, &bitwise);
    tap_ok(bitwise, "two runs over %s with host reduction give bit-identical parameters", names);
    ch_module_free(a);
    ch_module_free(b);

    /* A replica that fails mid-step: the step returns its error quickly, and
     * the next step and the teardown neither hang nor fail. */
    ch_dp *dp = NULL;
    ch_dp_options o = options(NULL);
    if (tap_status_ok(ch_dp_new(&dp, single, three, 3, &o), "a dp over %s", names)) {
        float loss = 0;
        struct timespec t0, t1;
        chi_dp_fail_next(dp, 1);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        ch_status st = ch_dp_step(dp, &bs.b[0], 0.05f, &loss);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double secs = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        tap_status_is(st, CH_ERR_INTERNAL, "replica 1", "a failing replica's error is returned, "
                      "naming it");
        tap_ok(secs < 1.0, "... within a second (%.3f s)", secs);
        st = ch_dp_step(dp, &bs.b[1], 0.05f, &loss);
        tap_status_ok(st, "the next step runs");
        tap_ok(loss > 0.0f && loss < 4.0f, "... with a finite, positive loss (%.4f)", loss);
        ch_dp_free(dp);
        tap_ok(1, "teardown after a failure returns");
        dp = NULL;
    }
    /* The replica checksum: fine while they agree, an error naming the
     * replica once one of them is changed behind the wrapper's back. */
    o.check_every = 1;
    if (tap_status_ok(ch_dp_new(&dp, single, three, 3, &o), "a dp checking replicas every step")) {
        float loss = 0;
        tap_status_ok(ch_dp_step(dp, &bs.b[0], 0.05f, &loss), "replicas agree after a step");
        ch_tensor *w;
        ch_module_param(ch_dp_replica(dp, 2), 0, NULL, &w, NULL);
        ch_fill(w, 0.5);
        ch_device_sync(ch_tensor_device(w));
        tap_status_is(ch_dp_step(dp, &bs.b[1], 0.05f, &loss), CH_ERR_INTERNAL, "replica 2",
                      "a replica whose parameters diverged is named");
        ch_dp_free(dp);
        dp = NULL;
    }
    o.check_every = -1;
    tap_status_is(ch_dp_new(&dp, single, three, 3, &o), CH_ERR_INVALID_ARGUMENT, "check_every",
                  "a negative check_every is an error");
    o = options(NULL);
    tap_status_is(ch_dp_new(&dp, single, three, 0, &o), CH_ERR_INVALID_ARGUMENT, "device",
                  "zero devices is an error");
    const float bad[3] = {1, 0, 2};
    o.weights = bad;
    tap_status_is(ch_dp_new(&dp, single, three, 3, &o), CH_ERR_INVALID_ARGUMENT, "weights[1]",
                  "a zero weight is an error naming it");
    o = options(NULL);
    o.reduce = (ch_dp_reduce)7;
    tap_status_is(ch_dp_new(&dp, single, three, 3, &o), CH_ERR_UNSUPPORTED, "reduce",
                  "an unknown reduction is an error");
    tap_ok(dp == NULL, "a failed ch_dp_new leaves *out NULL");

    ch_module_free(single);
    free_batches(&bs);
    ch_shutdown();
    return tap_done();
}
