/* Data parallelism: training over several replicas matches training on one
 * device with the same global batch, whatever the split, the reduction, the
 * buckets, dropout or gradient accumulation; host reduction is bit-for-bit
 * repeatable; evaluation over the replicas matches one model; a failing
 * replica ends the step quickly; bad options are errors; more than 64
 * replicas, and a replica whose share of the batch is zero. Mixed
 * precision: bf16 over the replicas against host alone, fp16's dynamic
 * loss scale. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "../nn/nn.h" /* chi_dp_fail_next, the fault-injection hook */

enum { BATCH = 24, HALF = BATCH / 2, STEPS = 20 };

/* ocl0 and ocl1: two OpenCL devices, of two platforms (two vendors'
 * drivers) where there are two, else of one; peer0 and peer1: two that
 * share a context, for peer reduction; cross: one of each of two
 * platforms. Chosen by platform, not by index (the ICD loader orders the
 * platforms). */
static ch_device *host, *ocl0, *ocl1, *peer0, *peer1, *cross0, *cross1;

/* A fixed sequence of random batches in pinned host memory, and the same
 * data cut into two micro-batches per step. */
typedef struct batches {
    ch_host_buffer *images[STEPS], *labels[STEPS];
    ch_host_buffer *mimages[STEPS][2], *mlabels[STEPS][2];
    ch_batch b[STEPS];
    ch_batch micro[STEPS][2];
} batches;

static void make_batches(batches *bs)
{
    tap_rng rng = {99};
    for (int s = 0; s < STEPS; s++) {
        bs->b[s] = tap_mnist_batch(host, &rng, BATCH, s, &bs->images[s], &bs->labels[s]);
        const float *x = ch_host_buffer_data(bs->images[s]);
        const int32_t *l = ch_host_buffer_data(bs->labels[s]);
        for (int h = 0; h < 2; h++) {
            ch_host_buffer_new(&bs->mimages[s][h], host, sizeof(float) * HALF * 784);
            ch_host_buffer_new(&bs->mlabels[s][h], host, sizeof(int32_t) * HALF);
            memcpy(ch_host_buffer_data(bs->mimages[s][h]), x + h * HALF * 784,
                   sizeof(float) * HALF * 784);
            memcpy(ch_host_buffer_data(bs->mlabels[s][h]), l + h * HALF,
                   sizeof(int32_t) * HALF);
            bs->micro[s][h] =
                (ch_batch){bs->mimages[s][h], bs->mlabels[s][h], NULL, HALF, 0, 2 * s + h};
        }
    }
}

static void free_batches(batches *bs)
{
    for (int s = 0; s < STEPS; s++) {
        ch_host_buffer_free(bs->images[s]);
        ch_host_buffer_free(bs->labels[s]);
        for (int h = 0; h < 2; h++) {
            ch_host_buffer_free(bs->mimages[s][h]);
            ch_host_buffer_free(bs->mlabels[s][h]);
        }
    }
}

static ch_dp_options options(void) { return tap_mnist_dp_options(5); }

static ch_module *make_model(int dropout)
{
    return tap_smooth_cnn(dropout);
}

typedef struct run {
    int dropout;        /* the dropout net instead of the cnn */
    int accumulate;     /* two micro-batches per step */
} run;

/* Train for STEPS steps over `devs` with options `o`; the parameters end in
 * `out` (a host model of the same kind). Returns the last loss, NAN on
 * failure. */
static int nsteps = STEPS;
static float train(ch_module *out, ch_device **devs, int n, ch_dp_options o, run how,
                   const batches *bs)
{
    ch_module *model = make_model(how.dropout);
    ch_module_init(model, 3);
    ch_dp *dp = NULL;
    float loss = NAN;
    if (how.accumulate)
        o.accumulate = 2;
    ch_status st = ch_dp_new(&dp, model, devs, n, &o);
    for (int s = 0; st == CH_OK && s < nsteps; s++) {
        if (!how.accumulate) {
            /* The cnn's last batch is short, in buffers made for a full
             * one, as a loader's last batch of an epoch is. */
            ch_batch b = bs->b[s];
            if (!how.dropout && s == STEPS - 1)
                b.count = BATCH - 7;
            st = ch_dp_step(dp, &loss, &b, 0.05f);
            continue;
        }
        st = ch_dp_step(dp, &loss, &bs->micro[s][0], 0.05f);
        if (st == CH_OK && ch_dp_pending(dp) != 1)
            st = chi_error(CH_ERR_INTERNAL, "%d micro-batches pending after the first, want 1",
                           ch_dp_pending(dp));
        if (st == CH_OK)
            st = ch_dp_step(dp, &loss, &bs->micro[s][1], 0.05f);
        if (st == CH_OK && ch_dp_pending(dp) != 0)
            st = chi_error(CH_ERR_INTERNAL, "%d micro-batches pending after the update",
                           ch_dp_pending(dp));
    }
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

/* One equivalence check: a dp run against the host-alone reference. */
static void equivalent(const char *what, ch_device **devs, int n, const char *names,
                       ch_dp_options o, run how, ch_module *reference, float ref_loss,
                       const batches *bs)
{
    ch_module *m = make_model(how.dropout);
    float l = train(m, devs, n, o, how, bs);
    int bitwise;
    double err = max_rel(m, reference, &bitwise);
    tap_ok(isfinite(l) && err < 1e-5,
           "%s over %s: parameters after %d steps match host alone "
           "(max rel err %.2e, want < 1e-5; loss %.4f vs %.4f)",
           what, names, STEPS, err, l, ref_loss);
    ch_module_free(m);
}

/* A failure must end the step at once, not after a timeout or never; the
 * bound is loose enough for a loaded machine (the step itself takes
 * milliseconds). */
#define PROMPT_SECONDS 10.0

/* A replica that fails mid-step: the step returns its error promptly, and
 * the next step and the teardown neither hang nor fail. */
static void test_fault(ch_module *model, ch_device **devs, int n, const char *names,
                       ch_dp_options o, const char *what, const batches *bs)
{
    ch_dp *dp = NULL;
    if (!tap_status_ok(ch_dp_new(&dp, model, devs, n, &o), "a dp over %s (%s)", names, what))
        return;
    float loss = 0;
    chi_dp_fail_next(dp, 1);
    double t0 = ch_clock_seconds();
    ch_status st = ch_dp_step(dp, &loss, &bs->b[0], 0.05f);
    double secs = ch_clock_seconds() - t0;
    tap_status_is(st, CH_ERR_INTERNAL, "replica 1", "%s: a failing replica's error is "
                  "returned, naming it", what);
    tap_ok(secs < PROMPT_SECONDS, "%s: ... promptly (%.3f s, want < %.0f)", what, secs,
           PROMPT_SECONDS);
    /* The reducer thread failing instead: the workers stop waiting for it. */
    chi_dp_fail_reduce_next(dp);
    t0 = ch_clock_seconds();
    st = ch_dp_step(dp, &loss, &bs->b[0], 0.05f);
    if (st == CH_OK && o.accumulate > 1) /* a micro-batch reduces nothing: the next does */
        st = ch_dp_step(dp, &loss, &bs->b[0], 0.05f);
    secs = ch_clock_seconds() - t0;
    tap_status_is(st, CH_ERR_INTERNAL, "reducing gradients", "%s: a failing reduction's "
                  "error is returned, naming it", what);
    tap_ok(secs < PROMPT_SECONDS, "%s: ... promptly (%.3f s, want < %.0f)", what, secs,
           PROMPT_SECONDS);
    st = ch_dp_step(dp, &loss, &bs->b[1], 0.05f);
    tap_status_ok(st, "%s: the next step runs", what);
    tap_ok(loss > 0.0f && loss < 4.0f, "%s: ... with a finite, positive loss (%.4f)", what,
           loss);
    /* A replica failing in its update itself, when the others may have
     * updated: the replicas may differ, so every later call is refused
     * (a failure before the update, for want of memory, leaves them all
     * as they were: tests/test-fault.c). */
    chi_dp_fail_update_next(dp, 1);
    st = ch_dp_step(dp, &loss, &bs->b[2], 0.05f);
    if (st == CH_OK && o.accumulate > 1)
        st = ch_dp_step(dp, &loss, &bs->b[2], 0.05f);
    tap_status_is(st, CH_ERR_INTERNAL, "replica 1", "%s: a replica failing in its update: "
                  "its error is returned", what);
    st = ch_dp_step(dp, &loss, &bs->b[3], 0.05f);
    tap_status_is(st, CH_ERR_STATE, "may differ", "%s: ... and the next step is refused", what);
    ch_tensor *out = NULL;
    int64_t shape[2] = {BATCH, 10};
    ch_tensor_new(&out, devs[0], CH_F32, 2, shape);
    tap_status_is(ch_dp_predict(dp, out, &bs->b[3]), CH_ERR_STATE, "may differ",
                  "%s: ... and so is a prediction", what);
    ch_tensor_free(out);
    t0 = ch_clock_seconds();
    ch_dp_free(dp);
    secs = ch_clock_seconds() - t0;
    tap_ok(secs < PROMPT_SECONDS, "%s: teardown after a failure returns promptly (%.3f s)", what,
           secs);
}

/* Outputs and accuracy over the replicas against one model. */
static void test_evaluate(ch_module *model, ch_device **devs, int n, const char *names,
                          const batches *bs)
{
    ch_dp_options o = options();
    o.split = CH_DP_SPLIT_WEIGHTS;
    const float w[3] = {1, 2, 5};
    o.weights = w;
    o.nweights = n;
    ch_dp *dp = NULL;
    if (!tap_status_ok(ch_dp_new(&dp, model, devs, n, &o), "a dp over %s to evaluate", names))
        return;
    const ch_batch *b = &bs->b[3];
    int64_t xs[4] = {BATCH, 1, 28, 28}, os[2] = {BATCH, 10};
    ch_tensor *x = NULL, *out = NULL, *y = NULL;
    ch_tensor_new(&x, host, CH_F32, 4, xs);
    ch_tensor_upload(x, ch_host_buffer_data(b->images), sizeof(float) * BATCH * 784);
    ch_module_train(model, 0);
    ch_module_forward(model, &y, x);
    ch_module_train(model, 1);
    float want[BATCH * 10], got[BATCH * 10];
    ch_tensor_download(y, want, sizeof want);
    const int32_t *labels = ch_host_buffer_data(b->labels);
    int64_t want_right = 0;
    double want_loss = 0;
    for (int i = 0; i < BATCH; i++) {
        int best = 0;
        double mx = want[i * 10], se = 0;
        for (int k = 1; k < 10; k++) {
            if (want[i * 10 + k] > want[i * 10 + best])
                best = k;
            mx = fmax(mx, want[i * 10 + k]);
        }
        for (int k = 0; k < 10; k++)
            se += exp(want[i * 10 + k] - mx);
        want_loss += (log(se) + mx - want[i * 10 + labels[i]]) / BATCH;
        want_right += best == labels[i];
    }
    /* The outputs gathered on the last device, then on the host. */
    ch_device *where[2] = {devs[n - 1], host};
    for (int k = 0; k < 2; k++) {
        ch_tensor_new(&out, where[k], CH_F32, 2, os);
        ch_status st = ch_dp_predict(dp, out, b);
        double worst = 0;
        if (st == CH_OK)
            st = ch_tensor_download(out, got, sizeof got);
        for (int i = 0; st == CH_OK && i < BATCH * 10; i++)
            worst = fmax(worst, fabs(got[i] - want[i]) / (1.0 + fabs(want[i])));
        tap_ok(st == CH_OK && worst < 1e-5, "ch_dp_predict over %s gathered on %s matches one "
               "model (max err %.2e)", names, ch_device_id(where[k]), worst);
        ch_tensor_free(out);
        out = NULL;
    }
    float loss = 0;
    int64_t right = -1;
    ch_status st = ch_dp_evaluate(dp, &loss, &right, b);
    tap_ok(st == CH_OK && right == want_right && fabs(loss - want_loss) < 1e-5 * (1 + want_loss),
           "ch_dp_evaluate over %s: loss %.6f (want %.6f), %lld correct (want %lld)", names,
           loss, want_loss, (long long)right, (long long)want_right);
    int64_t bad_shape[2] = {BATCH - 1, 10};
    ch_tensor_new(&out, host, CH_F32, 2, bad_shape);
    tap_status_is(ch_dp_predict(dp, out, b), CH_ERR_SHAPE, "rows",
                  "predicting into an output with the wrong number of rows");
    ch_tensor_free(out);
    ch_tensor_free(x);
    ch_dp_free(dp);
}

static void test_accumulate_errors(ch_module *model, ch_device **devs, int n,
                                   const batches *bs)
{
    ch_dp_options o = options();
    o.accumulate = 3;
    ch_dp *dp = NULL;
    if (!tap_status_ok(ch_dp_new(&dp, model, devs, n, &o), "a dp accumulating 3 micro-batches"))
        return;
    float loss;
    tap_status_ok(ch_dp_flush(dp, 0.05f), "flushing with nothing pending is a no-op");
    ch_dp_step(dp, &loss, &bs->micro[0][0], 0.05f);
    int64_t os[2] = {HALF, 10};
    ch_tensor *out = NULL;
    ch_tensor_new(&out, host, CH_F32, 2, os);
    tap_status_is(ch_dp_predict(dp, out, &bs->micro[0][1]), CH_ERR_STATE, "accumulated",
                  "predicting with micro-batches pending is an error");
    tap_status_is(ch_dp_evaluate(dp, NULL, NULL, &bs->micro[0][1]), CH_ERR_STATE, "flush",
                  "evaluating with micro-batches pending is an error");
    tap_ok(ch_dp_pending(dp) == 1, "one micro-batch pending (%d)", ch_dp_pending(dp));
    tap_status_ok(ch_dp_flush(dp, 0.05f), "flushing one of three micro-batches");
    tap_ok(ch_dp_pending(dp) == 0, "nothing pending after the flush");
    tap_status_ok(ch_dp_predict(dp, out, &bs->micro[0][1]), "predicting after the flush");
    tap_status_is(ch_dp_flush(dp, -1.0f), CH_ERR_INVALID_ARGUMENT, "lr", "a negative lr");
    ch_tensor_free(out);
    ch_dp_free(dp);
}

static void test_errors(ch_module *model, ch_device **three, int n, const batches *bs)
{
    ch_dp *dp = NULL;
    ch_dp_options o = options();
    o.check_every = -1;
    tap_status_is(ch_dp_new(&dp, model, three, n, &o), CH_ERR_INVALID_ARGUMENT, "check_every",
                  "a negative check_every is an error");
    o = options();
    tap_status_is(ch_dp_new(&dp, model, three, 0, &o), CH_ERR_INVALID_ARGUMENT, "device",
                  "zero devices is an error");
    const float bad[3] = {1, 0, 2};
    o.split = CH_DP_SPLIT_WEIGHTS;
    o.weights = bad;
    o.nweights = 3;
    tap_status_is(ch_dp_new(&dp, model, three, 3, &o), CH_ERR_INVALID_ARGUMENT, "weights[1]",
                  "a zero weight is an error naming it");
    const float two[2] = {1, 2};
    o.weights = two;
    o.nweights = 2;
    tap_status_is(ch_dp_new(&dp, model, three, 3, &o), CH_ERR_INVALID_ARGUMENT,
                  "2 weights for 3 devices", "a split with the wrong number of weights");
    o.weights = NULL;
    tap_status_is(ch_dp_new(&dp, model, three, 3, &o), CH_ERR_INVALID_ARGUMENT, "NULL",
                  "a weighted split without weights");
    o = options();
    o.split = (ch_dp_split)9;
    tap_status_is(ch_dp_new(&dp, model, three, 3, &o), CH_ERR_INVALID_ARGUMENT, "split",
                  "an unknown split");
    o = options();
    o.reduce = (ch_reduce_mode)7;
    tap_status_is(ch_dp_new(&dp, model, three, 3, &o), CH_ERR_INVALID_ARGUMENT, "reduce",
                  "an unknown reduction is an error");
    o = options();
    o.accumulate = -2;
    tap_status_is(ch_dp_new(&dp, model, three, 3, &o), CH_ERR_INVALID_ARGUMENT, "accumulate",
                  "a negative accumulate");
    if (ocl0) {
        ch_device *mixed[2] = {host, ocl0};
        o = options();
        o.reduce = CH_REDUCE_PEER;
        tap_status_is(ch_dp_new(&dp, model, mixed, 2, &o), CH_ERR_UNSUPPORTED, "opencl:0",
                      "peer reduction between host and opencl:0 is an error naming them");
        tap_ok(strstr(ch_last_error(), "host") != NULL, "... the message names host too: %s",
               ch_last_error());
    } else {
        tap_skip("no opencl:0: peer reduction across two backends not tried");
        tap_skip("no opencl:0");
    }
    tap_ok(dp == NULL, "a failed ch_dp_new leaves *out NULL");
    o = options();
    if (tap_status_ok(ch_dp_new(&dp, model, three, n, &o), "a dp for bad calls")) {
        float loss;
        tap_status_is(ch_dp_step(dp, &loss, &bs->b[0], NAN), CH_ERR_INVALID_ARGUMENT, "lr",
                      "a step with lr NaN");
        ch_batch empty = bs->b[0];
        empty.count = 0;
        tap_status_is(ch_dp_step(dp, &loss, &empty, 0.1f), CH_ERR_INVALID_ARGUMENT, "0 samples",
                      "an empty batch");
        ch_batch big = bs->b[0];
        big.count = 2 * BATCH;
        tap_status_is(ch_dp_step(dp, &loss, &big, 0.1f), CH_ERR_SHAPE, "images",
                      "a batch larger than its buffers");
        tap_status_is(ch_dp_evaluate(NULL, NULL, NULL, &bs->b[0]), CH_ERR_INVALID_ARGUMENT,
                      "dp", "evaluating a NULL dp");
        tap_status_is(ch_dp_predict(dp, NULL, &bs->b[0]), CH_ERR_INVALID_ARGUMENT, "out",
                      "predicting into NULL");
        tap_status_is(ch_dp_last_compute(dp, NULL, n + 1), CH_ERR_INVALID_ARGUMENT,
                      "number of replicas", "dp_last_compute with the wrong count");
        ch_dp_free(dp);
    }
    tap_status_is(ch_device_bind_thread(NULL), CH_ERR_INVALID_ARGUMENT, "dev",
                  "binding to a NULL device");
}

/* A flat linear model over the 28x28 samples: cheap enough for many
 * replicas. */
/* Mixed precision. bf16 changes the numbers (not f32's bits) and trains
 * as f32 does; over three devices it matches host alone to BF16_TOL after
 * BF16_STEPS steps, and two runs of STEPS steps are bit-identical.
 *
 * Why BF16_TOL, not f32's 1e-5: every replica rounds activations, weights
 * and gradients to bf16 before each GEMM and convolution. The f32 sums
 * before that rounding differ across devices in their last bits (other
 * summation orders), and a value within those bits of a rounding midpoint
 * lands one bf16 ulp (2^-8 relative) away on one device and not on the
 * other; training then amplifies such a flip as it amplifies any
 * perturbation. Measured on the cnn at lr 0.05 with momentum: 1.7e-7
 * after 4 steps, 6.8e-7 after 8, 5.3e-4 after 16. 1e-3 after 4 steps
 * leaves room for flips on other machines. That it ran in bf16 at all:
 * on the smooth net bf16 against f32 differ by 4e-4 after 4 steps, and
 * the replicas must agree with host alone ten times better than that
 * (1.2e-7 here), which a replica that ran in f32, or rounded to f16,
 * cannot. */
#define BF16_TOL 1e-3
#define BF16_STEPS 4

static void test_precision(ch_device **three, const char *names, ch_module *f32_single,
                           float f32_loss, const batches *bs)
{
    run plain = {0, 0};
    ch_device *one[1] = {host};
    ch_dp_options o = options();
    o.precision = CH_BF16;
    ch_module *single = make_model(0), *multi = make_model(0), *again = make_model(0);
    float l1 = train(single, one, 1, o, plain, bs);
    int bitwise;
    max_rel(single, f32_single, &bitwise);
    tap_ok(isfinite(l1) && !bitwise && fabsf(l1 - f32_loss) < 0.1f,
           "bf16 on host alone trains as f32 does over %d steps: last loss %.4f (f32: %.4f), "
           "other parameters", STEPS, l1, f32_loss);
    ch_module *ref = make_model(0);
    nsteps = BF16_STEPS;
    train(ref, one, 1, o, plain, bs);
    ch_module *f32_ref = make_model(0);
    ch_dp_options of = options();
    train(f32_ref, one, 1, of, plain, bs);
    o.split = CH_DP_SPLIT_WEIGHTS;
    const float uneven[3] = {1, 2, 5};
    o.weights = uneven;
    o.nweights = 3;
    float l3 = train(multi, three, 3, o, plain, bs);
    double err = max_rel(multi, ref, &bitwise);
    double gap = max_rel(ref, f32_ref, &bitwise);
    tap_ok(isfinite(l3) && err < BF16_TOL && gap > 1e-5 && gap > 10 * err,
           "bf16 over %s, split 1:2:5: parameters after %d steps match host alone (max rel "
           "err %.2e, want < %g and a tenth of bf16 against f32: %.2e)", names, BF16_STEPS, err, BF16_TOL,
           gap);
    nsteps = STEPS;
    train(multi, three, 3, o, plain, bs);
    train(again, three, 3, o, plain, bs);
    max_rel(again, multi, &bitwise);
    tap_ok(bitwise, "bf16 over %s: two runs of %d steps give bit-identical parameters", names,
           STEPS);
    ch_module_free(single);
    ch_module_free(multi);
    ch_module_free(again);
    ch_module_free(ref);
    ch_module_free(f32_ref);

    /* fp16's dynamic loss scale, started far too high (2^24: the loss's
     * gradient, about scale / batch per logit, overflows fp16's 65504) and
     * growing after every 2 clean steps: each overflowing step is skipped
     * with the parameters untouched and halves the scale; each clean one
     * moves them, and every second in a row doubles the scale. */
    o = options();
    o.precision = CH_F16;
    o.loss_scale = 16777216.0f;
    o.loss_scale_interval = 2;
    ch_dp *dp = NULL;
    ch_module *before = make_model(0), *after = make_model(0);
    ch_status st = ch_dp_new(&dp, f32_single, three, 3, &o);
    int skips = 0, grows = 0, broken = 0, s = 0;
    char why[256] = "";
    for (; st == CH_OK && s < STEPS && !broken; s++) {
        float scale0, scale1, loss;
        int clean0, clean1;
        int64_t skipped0, skipped1;
        st = ch_dp_loss_scale(dp, &scale0, &clean0, &skipped0);
        if (st == CH_OK)
            st = ch_dp_sync_to(dp, before);
        if (st == CH_OK)
            st = ch_dp_step(dp, &loss, &bs->b[s], 0.05f);
        if (st == CH_OK)
            st = ch_dp_sync_to(dp, after);
        if (st == CH_OK)
            st = ch_dp_loss_scale(dp, &scale1, &clean1, &skipped1);
        if (st != CH_OK)
            break;
        max_rel(after, before, &bitwise);
        if (skipped1 == skipped0 + 1) {
            skips++;
            if (!bitwise || scale1 != scale0 * 0.5f || clean1 != 0) {
                broken = 1;
                snprintf(why, sizeof why, "step %d skipped: parameters %s, scale %g -> %g, "
                         "clean %d", s, bitwise ? "kept" : "CHANGED", scale0, scale1, clean1);
            }
        } else if (skipped1 == skipped0) {
            int grew = clean0 + 1 == 2;
            grows += grew;
            if (bitwise || scale1 != (grew ? scale0 * 2.0f : scale0) ||
                clean1 != (grew ? 0 : clean0 + 1)) {
                broken = 1;
                snprintf(why, sizeof why, "step %d clean: parameters %s, scale %g -> %g, "
                         "clean %d -> %d", s, bitwise ? "UNCHANGED" : "moved", scale0, scale1,
                         clean0, clean1);
            }
        } else {
            broken = 1;
            snprintf(why, sizeof why, "step %d: skipped count %lld -> %lld", s,
                     (long long)skipped0, (long long)skipped1);
        }
    }
    if (tap_status_ok(st, "fp16 over %s with a first loss scale of 2^24: %d steps", names, s))
        tap_ok(!broken && skips >= 2 && grows >= 1,
               "... %d skipped (parameters untouched, scale halved), %d growths after 2 clean "
               "steps%s%s", skips, grows, why[0] ? ": " : "", why);
    ch_dp_free(dp);
    dp = NULL;
    ch_module_free(before);
    ch_module_free(after);

    /* Gradients reduced in bf16 through the host: training goes as with
     * f32 (the gradients lose bits, the step does not change course in
     * 20 steps), and two runs give the same bits. */
    o = options();
    o.reduce_dtype = CH_BF16;
    ch_module *rb = make_model(0), *rb2 = make_model(0);
    float lr1 = train(rb, three, 3, o, plain, bs);
    train(rb2, three, 3, o, plain, bs);
    max_rel(rb2, rb, &bitwise);
    int differs;
    max_rel(rb, f32_single, &differs);
    tap_ok(isfinite(lr1) && fabsf(lr1 - f32_loss) < 0.1f && bitwise && !differs,
           "bf16 reduction over %s: trains as f32 does (last loss %.4f, f32 %.4f), other bits "
           "than f32's, the same bits twice", names, lr1, f32_loss);
    ch_module_free(rb);
    ch_module_free(rb2);
    o.reduce_dtype = CH_F16;
    tap_status_is(ch_dp_new(&dp, f32_single, three, 3, &o), CH_ERR_DTYPE, "reduce_dtype",
                  "an f16 reduction is refused");

    /* The errors a caller can make. */
    o = options();
    o.precision = CH_I32;
    tap_status_is(ch_dp_new(&dp, f32_single, three, 3, &o), CH_ERR_DTYPE, "precision",
                  "a dp in i32 precision is refused");
    o = options();
    o.precision = CH_F16;
    o.loss_scale = -1.0f;
    tap_status_is(ch_dp_new(&dp, f32_single, three, 3, &o), CH_ERR_INVALID_ARGUMENT,
                  "loss_scale", "a negative loss scale is refused");
    o.loss_scale = 0.0f;
    o.loss_scale_interval = -3;
    tap_status_is(ch_dp_new(&dp, f32_single, three, 3, &o), CH_ERR_INVALID_ARGUMENT,
                  "loss_scale_interval", "a negative growth interval is refused");
    o.loss_scale_interval = 0;
    if (tap_status_ok(ch_dp_new(&dp, f32_single, one, 1, &o), "an fp16 dp on host")) {
        float scale = 0;
        ch_dp_loss_scale(dp, &scale, NULL, NULL);
        tap_ok(scale == 65536.0f, "its first loss scale is GradScaler's 65536 (got %g)", scale);
        tap_status_is(ch_dp_set_loss_scale(dp, INFINITY, 0), CH_ERR_INVALID_ARGUMENT, "scale",
                      "an infinite loss scale is refused");
        tap_status_is(ch_dp_set_loss_scale(dp, 8.0f, -1), CH_ERR_INVALID_ARGUMENT, "clean",
                      "a negative clean-step count is refused");
        tap_status_ok(ch_dp_set_loss_scale(dp, 8.0f, 3), "a checkpoint's scale is restored");
        int clean = 0;
        ch_dp_loss_scale(dp, &scale, &clean, NULL);
        tap_ok(scale == 8.0f && clean == 3, "... and read back (%g, %d)", scale, clean);
        ch_dp_free(dp);
        dp = NULL;
    }
    o.precision = CH_BF16;
    if (tap_status_ok(ch_dp_new(&dp, f32_single, one, 1, &o), "a bf16 dp on host")) {
        tap_status_is(ch_dp_set_loss_scale(dp, 8.0f, 0), CH_ERR_STATE, "only f16",
                      "bf16 has no loss scale to set");
        ch_dp_free(dp);
    }
    ch_module *m = make_model(0);
    tap_status_is(ch_module_set_precision(m, CH_I32), CH_ERR_DTYPE, "expected f32, bf16 or f16",
                  "ch_module_set_precision refuses i32");
    tap_ok(ch_module_set_precision(m, CH_F16) == CH_OK && ch_module_precision(m) == CH_F16,
           "ch_module_set_precision sets f16 and ch_module_precision reads it");
    ch_module_free(m);
}

static ch_module *linear_model(void)
{
    ch_module *m[2] = {NULL};
    ch_nn_flatten(&m[0]);
    ch_nn_linear(&m[1], 784, 10);
    ch_module *seq = tap_sequential(2, m);
    if (seq)
        ch_module_init(seq, 3);
    return seq;
}

/* The linear model trained over `devs`, one step per batch of `b`; the
 * parameters end in `out`, the last step's samples per replica in
 * `counts` (NULL: not wanted). */
static ch_status train_linear(ch_module *out, ch_device **devs, int n, const ch_batch *b,
                              int steps, int *counts)
{
    ch_module *model = linear_model();
    ch_dp_options o = options();
    ch_dp *dp = NULL;
    float loss;
    ch_status st = model ? ch_dp_new(&dp, model, devs, n, &o) : CH_ERR_OUT_OF_MEMORY;
    for (int s = 0; st == CH_OK && s < steps; s++)
        st = ch_dp_step(dp, &loss, &b[s], 0.05f);
    if (st == CH_OK && counts)
        st = ch_dp_last_step(dp, counts, NULL, n);
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, out);
    ch_dp_free(dp);
    ch_module_free(model);
    return st;
}

/* More replicas than the 64 the split once had room for: every one gets
 * its share, and training matches the host alone. */
static void test_many_replicas(const batches *bs)
{
    enum { N = 65, PER = 2, COUNT = N * PER, STEPS3 = 3 };
    ch_host_buffer *images = NULL, *labels = NULL;
    ch_host_buffer_new(&images, host, sizeof(float) * COUNT * 784);
    ch_host_buffer_new(&labels, host, sizeof(int32_t) * COUNT);
    ch_device *devs[N];
    int counts[N];
    for (int i = 0; i < N; i++)
        devs[i] = host;
    for (int k = 0; images && labels && k < COUNT; k++) {
        int s = k / BATCH, j = k % BATCH;
        memcpy((float *)ch_host_buffer_data(images) + k * 784,
               (const float *)ch_host_buffer_data(bs->images[s]) + j * 784, sizeof(float) * 784);
        ((int32_t *)ch_host_buffer_data(labels))[k] =
            ((const int32_t *)ch_host_buffer_data(bs->labels[s]))[j];
    }
    ch_batch b[STEPS3];
    for (int s = 0; s < STEPS3; s++)
        b[s] = (ch_batch){images, labels, NULL, COUNT, 0, s};
    ch_module *ref = linear_model(), *got = linear_model();
    ch_device *one[1] = {host};
    ch_status st = images && labels && ref && got ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = train_linear(ref, one, 1, b, STEPS3, NULL);
    if (st == CH_OK)
        st = train_linear(got, devs, N, b, STEPS3, counts);
    if (tap_status_ok(st, "%d steps of %d samples over %d host replicas", STEPS3, COUNT, N)) {
        int bad = 0;
        while (bad < N && counts[bad] == PER)
            bad++;
        tap_ok(bad == N, "... every replica got %d samples (replica %d has %d)", PER,
               bad < N ? bad : N - 1, counts[bad < N ? bad : N - 1]);
        int bitwise;
        double err = max_rel(got, ref, &bitwise);
        tap_ok(err < 1e-5, "... parameters match host alone (max rel err %.2e, want < 1e-5)",
               err);
    } else {
        tap_skip("no run: no counts to check");
        tap_skip("no run: no parameters to compare");
    }
    ch_module_free(got);
    ch_module_free(ref);
    ch_host_buffer_free(labels);
    ch_host_buffer_free(images);
}

/* A batch smaller than the replica count: the last replica gets no
 * sample, runs nothing through the model (a zero-row tensor would be an
 * error) and its gradient counts as zero, even right after a step that
 * gave it samples (its buffers then hold that step's gradient). */
static void test_zero_share(ch_device **devs, int n, const char *names, const batches *bs)
{
    enum { STEPS5 = 5 };
    ch_batch b[STEPS5];
    for (int s = 0; s < STEPS5; s++) {
        b[s] = bs->b[s];
        if (s > 0)
            b[s].count = n - 1;
    }
    int counts[8] = {0};
    ch_module *ref = linear_model(), *got = linear_model();
    ch_device *one[1] = {host};
    ch_status st = ref && got ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = train_linear(ref, one, 1, b, STEPS5, NULL);
    if (st == CH_OK)
        st = train_linear(got, devs, n, b, STEPS5, counts);
    if (tap_status_ok(st, "a step of %d samples, then %d of %d over %s", BATCH, STEPS5 - 1,
                      n - 1, names)) {
        tap_ok(counts[n - 1] == 0 && counts[0] == 1,
               "... the last replica got no sample (counts %d, %d, %d)", counts[0], counts[1],
               counts[n - 1]);
        int bitwise;
        double err = max_rel(got, ref, &bitwise);
        tap_ok(err < 1e-5, "... its gradient counts as zero: parameters match host alone "
               "(max rel err %.2e, want < 1e-5)", err);
    } else {
        tap_skip("no run: no counts to check");
        tap_skip("no run: no parameters to compare");
    }
    /* Evaluation and prediction of a short batch not trained on, over the
     * replicas against one replica. */
    ch_batch e = bs->b[STEPS - 1];
    e.count = n - 1;
    ch_dp_options o = options();
    ch_dp *dp = NULL, *dp1 = NULL;
    float loss = 0, loss1 = 0;
    int64_t right = -1, right1 = -2;
    int64_t os[2] = {n - 1, 10};
    ch_tensor *out = NULL, *out1 = NULL;
    float y[80], y1[80];
    st = got ? ch_dp_new(&dp, got, devs, n, &o) : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_dp_new(&dp1, got, one, 1, &o);
    if (st == CH_OK)
        st = ch_dp_evaluate(dp, &loss, &right, &e);
    if (st == CH_OK)
        st = ch_dp_evaluate(dp1, &loss1, &right1, &e);
    tap_ok(st == CH_OK && right == right1 && fabsf(loss - loss1) < 1e-5f * (1 + loss1),
           "ch_dp_evaluate of %d samples over %s: loss %.6f, %lld correct (one replica: %.6f, "
           "%lld)", n - 1, names, loss, (long long)right, loss1, (long long)right1);
    if (st == CH_OK)
        st = ch_tensor_new(&out, host, CH_F32, 2, os);
    if (st == CH_OK)
        st = ch_tensor_new(&out1, host, CH_F32, 2, os);
    if (st == CH_OK)
        st = ch_dp_predict(dp, out, &e);
    if (st == CH_OK)
        st = ch_dp_predict(dp1, out1, &e);
    if (st == CH_OK)
        st = ch_tensor_download(out, y, sizeof(float) * (size_t)(n - 1) * 10);
    if (st == CH_OK)
        st = ch_tensor_download(out1, y1, sizeof(float) * (size_t)(n - 1) * 10);
    double worst = 0;
    for (int i = 0; st == CH_OK && i < (n - 1) * 10; i++)
        worst = fmax(worst, fabs(y[i] - y1[i]) / (1.0 + fabs(y1[i])));
    tap_ok(st == CH_OK && worst < 1e-5, "ch_dp_predict of %d samples over %s matches one "
           "replica (max err %.2e; %s)", n - 1, names, worst, ch_status_str(st));
    ch_tensor_free(out);
    ch_tensor_free(out1);
    ch_dp_free(dp);
    ch_dp_free(dp1);
    ch_module_free(got);
    ch_module_free(ref);
}

/* Workers are bound near their devices when the library knows where that is. */
static void test_binding(ch_module *model, ch_device **devs, int n, const char *names)
{
    ch_dp_options o = options();
    ch_dp *dp = NULL;
    if (!tap_status_ok(ch_dp_new(&dp, model, devs, n, &o), "a dp over %s", names))
        return;
    for (int i = 0; i < n; i++) {
        ch_device_info info;
        ch_device_get_info(devs[i], &info);
        ch_status can = ch_device_bind_thread(devs[i]);
        if (can == CH_OK)
            tap_ok(ch_dp_bound(dp, i), "worker %d is bound to the CPUs of %s (%s)", i,
                   info.id, info.cpuset);
        else
            tap_ok(!ch_dp_bound(dp, i), "worker %d is not bound: %s", i, ch_last_error());
    }
    ch_dp_free(dp);
    o.no_bind = 1;
    if (tap_status_ok(ch_dp_new(&dp, model, devs, n, &o), "a dp with binding off"))
        tap_ok(!ch_dp_bound(dp, 1), "no_bind leaves the workers unbound");
    ch_dp_free(dp);
}

/* Peer reduction needs one backend: "cuda:0" and "cuda:1" share one. */
static int same_backend(const ch_device *a, const ch_device *b)
{
    const char *x = ch_device_id(a), *y = ch_device_id(b);
    size_t n = strcspn(x, ":");
    return n == strcspn(y, ":") && strncmp(x, y, n) == 0;
}

/* CHORUS_TEST_DEVICES (the GPU check sets "cuda:0,cuda:0") replaces the
 * three replicas of most checks: its entries, repeated to three; the peer
 * checks take its first two, or the first twice where the second is of
 * another backend. 0 when it is not set or names no device here. */
static int env_devices(ch_device **three, char *names, size_t size)
{
    ch_device *devs[8];
    int n = tap_env_devices(devs, 8);
    if (n < 1)
        return 0;
    for (int i = 0; i < 3; i++)
        three[i] = devs[i % n];
    snprintf(names, size, "%s,%s,%s", ch_device_id(three[0]), ch_device_id(three[1]),
             ch_device_id(three[2]));
    tap_diag("CHORUS_TEST_DEVICES: replicas on %s", names);
    return 1;
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    ch_device_by_name(&host, "host");
    if (!tap_peer_pair(&peer0, &peer1))
        peer0 = peer1 = NULL;
    if (!tap_cross_pair(&cross0, &cross1))
        cross0 = cross1 = NULL;
    ocl0 = cross0 ? cross0 : peer0;
    ocl1 = cross0 ? cross1 : peer1;
    batches bs;
    make_batches(&bs);

    ch_module *single = make_model(0), *single_drop = make_model(1);
    ch_device *one[1] = {host};
    run plain = {0, 0}, drop = {1, 0};
    float l1 = train(single, one, 1, options(), plain, &bs);
    tap_ok(isfinite(l1) && l1 < 2.2f, "20 steps on host alone train (last loss %.4f)", l1);
    float l1d = train(single_drop, one, 1, options(), drop, &bs);
    tap_ok(isfinite(l1d) && l1d < 2.3f, "20 steps of the dropout net on host alone (loss %.4f)",
           l1d);

    ch_device *three[3] = {host, host, host};
    const char *names = "host,host,host";
    char env_names[2][64], ocl_names[2][64];
    if (env_devices(three, env_names[0], sizeof env_names[0])) {
        names = env_names[0];
    } else if (ocl0) {
        three[1] = ocl0;
        three[2] = ocl1;
        snprintf(ocl_names[0], sizeof ocl_names[0], "host,%s,%s", ch_device_id(ocl0),
                 ch_device_id(ocl1));
        names = ocl_names[0];
        tap_diag("replicas on %s (%s)", names,
                 cross0 ? "two OpenCL platforms" : "one OpenCL platform");
    } else {
        tap_diag("no two OpenCL devices: three replicas on host instead");
    }
    ch_device *pair[2] = {peer0 ? peer0 : host, peer1 ? peer1 : host};
    const char *pair_names = "host,host";
    if (peer0) {
        snprintf(ocl_names[1], sizeof ocl_names[1], "%s,%s", ch_device_id(peer0),
                 ch_device_id(peer1));
        pair_names = ocl_names[1];
    }
    if (names == env_names[0]) {
        pair[0] = three[0];
        pair[1] = same_backend(three[0], three[1]) ? three[1] : three[0];
        snprintf(env_names[1], sizeof env_names[1], "%s,%s", ch_device_id(pair[0]),
                 ch_device_id(pair[1]));
        pair_names = env_names[1];
    }
    ch_device *hosts[3] = {host, host, host};

    const float uneven[3] = {1, 2, 5};
    ch_dp_options o = options();
    equivalent("equal split, host reduction", three, 3, names, o, plain, single, l1, &bs);
    o.split = CH_DP_SPLIT_WEIGHTS;
    o.weights = uneven;
    o.nweights = 3;
    equivalent("split 1:2:5", three, 3, names, o, plain, single, l1, &bs);
    o = options();
    o.split = CH_DP_SPLIT_AUTO;
    equivalent("automatic split", three, 3, names, o, plain, single, l1, &bs);
    o = options();
    o.bucket_bytes = 16 << 10;
    equivalent("16 KiB buckets", three, 3, names, o, plain, single, l1, &bs);
    o = options();
    o.reduce = CH_REDUCE_AUTO;
    o.bucket_bytes = 64 << 10;
    equivalent("auto reduction, 64 KiB buckets", three, 3, names, o, plain, single, l1, &bs);
    o = options();
    o.reduce = CH_REDUCE_PEER;
    equivalent("peer reduction", pair, 2, pair_names, o, plain, single, l1, &bs);
    equivalent("peer reduction", hosts, 3, "host,host,host", o, plain, single, l1, &bs);
    /* Two platforms: peer reduction across them is refused, naming both;
     * auto groups every device by platform (two in one context reduce
     * peer to peer) and stages between the groups through the host. */
    if (cross0) {
        ch_device *xpair[2] = {cross0, cross1};
        ch_dp *dp = NULL;
        tap_status_is(ch_dp_new(&dp, single, xpair, 2, &o), CH_ERR_UNSUPPORTED,
                      ch_device_id(cross1), "peer reduction over %s and %s (two platforms) "
                      "is refused, naming them", ch_device_id(cross0), ch_device_id(cross1));
        /* Every OpenCL device once: two groups, or three with a pair that
         * shares a context. */
        ch_device *every[5] = {host, cross0, cross1};
        int ne = 3;
        if (peer0 && peer0 != cross0 && peer0 != cross1)
            every[ne++] = peer0;
        if (peer1 && peer1 != cross0 && peer1 != cross1)
            every[ne++] = peer1;
        char every_names[96] = "host";
        for (int i = 1; i < ne; i++)
            snprintf(every_names + strlen(every_names), sizeof every_names - strlen(every_names),
                     ",%s", ch_device_id(every[i]));
        o = options();
        o.reduce = CH_REDUCE_AUTO;
        o.split = CH_DP_SPLIT_AUTO;
        equivalent("auto reduction and split over two platforms", every, ne, every_names, o,
                   plain, single, l1, &bs);
    } else {
        tap_skip("no two OpenCL platforms (./bootstrap installs Intel's CPU runtime beside "
                 "PoCL): reduction across platforms not tried");
        tap_skip("no two OpenCL platforms: auto reduction over both not tried");
    }
    /* CUDA, when there is a GPU: two replicas on one GPU reduce peer to
     * peer (summed on the GPU, then NCCL's one-rank communicator where the
     * module has NCCL), and a GPU beside the host and OpenCL reduces with
     * auto. */
    ch_device *gpu = NULL;
    if (ch_device_by_name(&gpu, "cuda:0") == CH_OK) {
        ch_device *gpus[2] = {gpu, gpu}, *mixed[3] = {gpu, host, ocl0 ? ocl0 : host};
        o = options();
        o.reduce = CH_REDUCE_PEER;
        equivalent("peer reduction", gpus, 2, "cuda:0,cuda:0", o, plain, single, l1, &bs);
        o.reduce = CH_REDUCE_AUTO;
        equivalent("auto reduction", mixed, 3, "cuda:0,host,...", o, plain, single, l1, &bs);
    } else {
        tap_skip("no cuda:0: peer reduction over two replicas on one GPU not tried");
        tap_skip("no cuda:0: auto reduction with a GPU not tried");
    }
    o = options();
    equivalent("dropout on", three, 3, names, o, drop, single_drop, l1d, &bs);
    run acc = {1, 1};
    o.split = CH_DP_SPLIT_WEIGHTS;
    o.weights = uneven;
    o.nweights = 3;
    equivalent("two accumulated micro-batches, dropout on, 1:2:5", three, 3, names, o, acc,
               single_drop, l1d, &bs);

    ch_module *a = make_model(0), *b = make_model(0);
    o = options();
    o.split = CH_DP_SPLIT_WEIGHTS;
    o.weights = uneven;
    o.nweights = 3;
    o.bucket_bytes = 16 << 10;
    train(a, three, 3, o, plain, &bs);
    train(b, three, 3, o, plain, &bs);
    int bitwise;
    max_rel(a, b, &bitwise);
    tap_ok(bitwise, "two runs over %s with host reduction give bit-identical parameters", names);
    ch_module_free(a);
    ch_module_free(b);

    o = options();
    test_fault(single, three, 3, names, o, "host reduction", &bs);
    o.reduce = CH_REDUCE_AUTO;
    o.bucket_bytes = 16 << 10;
    test_fault(single, three, 3, names, o, "auto reduction, small buckets", &bs);
    o = options();
    o.accumulate = 2;
    test_fault(single, three, 3, names, o, "accumulating", &bs);
    /* The sharded optimizer: a failure before the update leaves every
     * part where it was, and the gather after a good step still meets. */
    o = options();
    o.shard_optimizer = 1;
    o.bucket_bytes = 16 << 10;
    test_fault(single, three, 3, names, o, "sharded optimizer, small buckets", &bs);

    /* Small buckets: the first ones are reduced while backward still runs
     * on the earlier layers of some replica. */
    o = options();
    o.bucket_bytes = 16 << 10;
    ch_dp *ov = NULL;
    if (tap_status_ok(ch_dp_new(&ov, single, three, 3, &o), "a dp with 16 KiB buckets")) {
        double most = 0;
        float loss;
        ch_status st = CH_OK;
        for (int s = 0; st == CH_OK && s < STEPS; s++) {
            st = ch_dp_step(ov, &loss, &bs.b[s], 0.05f);
            most = fmax(most, ch_dp_last_overlap(ov));
        }
        tap_ok(st == CH_OK && ch_dp_bucket_count(ov) > 2 && most > 0.0,
               "%d buckets; reduction overlapped backward by up to %.2f ms in %d steps",
               ch_dp_bucket_count(ov), 1e3 * most, STEPS);
        ch_dp_free(ov);
    }

    /* Replicas on different backends apply the same reduced gradient with
     * the same arithmetic (lib/optim_consts.h): their parameters stay
     * bit-identical, step after step, with SGD and with AdamW. */
    ch_dp *dp = NULL;
    for (int k = 0; k < 2; k++) {
        o = options();
        o.check_every = 1;
        if (k == 1) {
            o.optimizer = ch_optimizer_defaults(CH_OPT_ADAMW, 1e-3f);
            o.optimizer.weight_decay = 0.01f;
        }
        ch_status st = ch_dp_new(&dp, single, three, 3, &o);
        float loss = 0;
        int s = 0;
        for (; st == CH_OK && s < STEPS; s++)
            st = ch_dp_step(dp, &loss, &bs.b[s], k ? 1e-3f : 0.05f);
        tap_status_ok(st, "%s over %s: replicas bit-identical after each of %d steps (%d ran)",
                      k ? "AdamW" : "SGD with momentum", names, STEPS, s);
        ch_dp_free(dp);
        dp = NULL;
    }

    /* The replica checksum: fine while they agree, an error naming the
     * replica once one of them is changed behind the wrapper's back. */
    o = options();
    o.check_every = 1;
    if (tap_status_ok(ch_dp_new(&dp, single, three, 3, &o), "a dp checking replicas every step")) {
        float loss = 0;
        tap_status_ok(ch_dp_step(dp, &loss, &bs.b[0], 0.05f), "replicas agree after a step");
        ch_tensor *w;
        ch_module_param(ch_dp_replica(dp, 2), 0, NULL, &w, NULL);
        ch_fill(w, 0.5);
        ch_device_sync(ch_tensor_device(w));
        tap_status_is(ch_dp_step(dp, &loss, &bs.b[1], 0.05f), CH_ERR_INTERNAL, "replica 2",
                      "a replica whose parameters diverged is named");
        ch_dp_free(dp);
        dp = NULL;
    }

    test_precision(three, names, single, l1, &bs);
    test_evaluate(single, three, 3, names, &bs);
    test_accumulate_errors(single, three, 3, &bs);
    test_errors(single, three, 3, &bs);
    test_binding(single, three, 3, names);
    test_many_replicas(&bs);
    test_zero_share(three, 3, names, &bs);

    ch_module_free(single);
    ch_module_free(single_drop);
    free_batches(&bs);
    ch_shutdown();
    return tap_done();
}
