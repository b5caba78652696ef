/* Recomputed activations (ch_module_set_recompute): a GPT with dropout and
 * a ResNet with BatchNorm give the same losses, gradients, parameters and
 * running statistics with recomputation as without, bit for bit, over
 * several optimizer steps, in f32 and bf16, on every device; the gradient
 * hooks see the same reports in the same order and BatchNorm exchanges its
 * sums no more often; the peak memory of a step falls; the flag's API. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "../nn/nn.h" /* nn_set_grad_hook, nn_set_sync: what ch_dp sets */

#define CHECK(call)                                                                                \
    do {                                                                                           \
        ch_status st_ = (call);                                                                    \
        if (st_ != CH_OK)                                                                          \
            return st_;                                                                            \
    } while (0)

enum {
    STEPS = 3
};

typedef struct model_spec {
    const char *kind; /* "gpt" or "resnet" */
    int layers;       /* GPT layers, or the ResNet's depth */
    int64_t dim;      /* GPT width, or the ResNet's */
    int64_t context;  /* GPT context, or the images' side */
    int64_t batch;
} model_spec;

static const model_spec small_gpt = {"gpt", 3, 32, 16, 3};
static const model_spec small_resnet = {"resnet", 8, 4, 8, 4};
enum {
    VOCAB = 48,
    CLASSES = 5
};

static ch_module *make_model(const model_spec *s)
{
    ch_module *m = NULL;
    ch_status st;
    if (strcmp(s->kind, "gpt") == 0) {
        ch_gpt_config c = ch_gpt_defaults();
        c.layers = s->layers;
        c.heads = 2;
        c.dim = s->dim;
        c.context = s->context;
        c.vocab = VOCAB;
        c.dropout = 0.1f;
        st = ch_nn_gpt(&m, &c);
    } else {
        st = ch_nn_resnet(&m, s->layers, (int)s->dim, 1, CLASSES);
    }
    if (st == CH_OK)
        st = ch_module_init(m, 7);
    if (st != CH_OK) {
        tap_status_ok(st, "build the %s", s->kind);
        ch_module_free(m);
        return NULL;
    }
    return m;
}

/* Tokens [B, T] and their next tokens [B * T], or images [N, 1, H, W] and
 * one label each. */
typedef struct batch {
    ch_tensor *x, *labels;
} batch;

static void batch_free(batch *b)
{
    ch_tensor_free(b->x);
    ch_tensor_free(b->labels);
    b->x = b->labels = NULL;
}

static ch_status make_batch(batch *b, const model_spec *s, ch_device *dev, uint64_t seed)
{
    tap_rng r = {seed};
    int gpt = strcmp(s->kind, "gpt") == 0;
    int64_t n = s->batch, side = s->context;
    int64_t xshape[4] = {n, gpt ? side : 1, side, side};
    int64_t nx = gpt ? n * side : n * side * side, nl = gpt ? n * side : n;
    b->x = b->labels = NULL;
    CHECK(ch_tensor_new(&b->x, dev, gpt ? CH_I32 : CH_F32, gpt ? 2 : 4, xshape));
    CHECK(ch_tensor_new(&b->labels, dev, CH_I32, 1, &nl));
    int32_t *tok = malloc((size_t)nx * sizeof *tok);
    float *img = malloc((size_t)nx * sizeof *img);
    int32_t *lab = malloc((size_t)nl * sizeof *lab);
    ch_status st = CH_ERR_OUT_OF_MEMORY;
    if (tok && img && lab) {
        for (int64_t i = 0; i < nx; i++) {
            tok[i] = (int32_t)(tap_rng_next(&r) % VOCAB);
            img[i] = tap_rng_uniform(&r, -1.0f, 1.0f);
        }
        for (int64_t i = 0; i < nl; i++)
            lab[i] = (int32_t)(tap_rng_next(&r) % (gpt ? VOCAB : CLASSES));
        st = ch_tensor_upload(b->x, gpt ? (void *)tok : (void *)img, (size_t)nx * 4);
        if (st == CH_OK)
            st = ch_tensor_upload(b->labels, lab, (size_t)nl * sizeof *lab);
    }
    free(tok);
    free(img);
    free(lab);
    return st;
}

/* What the data-parallel object sees of a replica's backward: each
 * gradient report (first, count) in order, and BatchNorm's exchanges. */
typedef struct trail {
    int n, syncs;
    int first[512], count[512];
} trail;

static ch_status on_grads(void *user, int first, int count)
{
    trail *t = user;
    if (t->n < 512) {
        t->first[t->n] = first;
        t->count[t->n] = count;
    }
    t->n++;
    return CH_OK;
}

/* The sum over one replica: the tensor itself. */
static ch_status on_sync(void *user, ch_tensor *t)
{
    (void)t;
    ((trail *)user)->syncs++;
    return CH_OK;
}

static int trails_equal(const trail *a, const trail *b)
{
    if (a->n != b->n || a->n > 512)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (a->first[i] != b->first[i] || a->count[i] != b->count[i])
            return 0;
    return 1;
}

/* One forward, loss and backward of m on b (gradients zeroed first),
 * dropout's stream at step `step`; *loss its value. */
static ch_status train_pass(ch_module *m, ch_loss *loss, const batch *b, int64_t step, float *lv)
{
    ch_tensor *y = NULL, *l = NULL, *dy = NULL;
    ch_module_set_rng(m, 99, step, 0);
    CHECK(ch_module_zero_grad(m));
    CHECK(ch_module_forward(m, &y, b->x));
    CHECK(ch_loss_forward(loss, &l, y, b->labels));
    CHECK(ch_loss_backward(loss, &dy, 1.0f));
    CHECK(ch_module_backward(m, NULL, dy));
    return ch_tensor_download(l, lv, sizeof *lv);
}

/* Whether tensors a and b hold the same bytes; *diff the largest
 * difference between their elements (f32). */
static int same_bits(const ch_tensor *a, const ch_tensor *b, double *diff)
{
    int64_t n = ch_tensor_numel(a);
    *diff = 0.0;
    if (n != ch_tensor_numel(b))
        return 0;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    int same = x && y && ch_tensor_download(a, x, (size_t)n * 4) == CH_OK &&
               ch_tensor_download(b, y, (size_t)n * 4) == CH_OK;
    if (same) {
        same = memcmp(x, y, (size_t)n * 4) == 0;
        for (int64_t i = 0; i < n; i++) {
            double d = (double)x[i] - (double)y[i];
            d = d < 0 ? -d : d;
            if (!(d <= *diff)) /* a NaN too */
                *diff = d;
        }
    }
    free(x);
    free(y);
    return same;
}

/* The first parameter (grads: its gradient) or buffer of a that differs in
 * its bits from b's, or NULL; *worst the largest difference over all. */
static const char *first_difference(const ch_module *a, const ch_module *b, int grads,
                                    double *worst)
{
    const char *bad = NULL;
    *worst = 0.0;
    for (int i = 0; i < ch_module_param_count(a); i++) {
        const char *name = NULL;
        ch_tensor *va = NULL, *ga = NULL, *vb = NULL, *gb = NULL;
        double d;
        if (ch_module_param(a, i, &name, &va, &ga) != CH_OK ||
            ch_module_param(b, i, NULL, &vb, &gb) != CH_OK)
            return "(no parameter)";
        if (!same_bits(grads ? ga : va, grads ? gb : vb, &d) && !bad)
            bad = name;
        if (d > *worst)
            *worst = d;
    }
    for (int i = 0; !grads && i < ch_module_buffer_count(a); i++) {
        const char *name = NULL;
        ch_tensor *va = NULL, *vb = NULL;
        int64_t *ca = NULL, *cb = NULL;
        double d = 0.0;
        if (ch_module_buffer(a, i, &name, &va, &ca) != CH_OK ||
            ch_module_buffer(b, i, NULL, &vb, &cb) != CH_OK)
            return "(no buffer)";
        int same = va ? same_bits(va, vb, &d) : *ca == *cb;
        if (!same && !bad)
            bad = name;
        if (d > *worst)
            *worst = d;
    }
    return bad;
}

static const char *precision_name(ch_dtype p)
{
    return p == CH_F32 ? "f32" : ch_dtype_name(p);
}

/* A model trained STEPS steps from the same start with and without
 * recomputation: losses, gradients at each step, then parameters and
 * buffers, the gradient reports and BatchNorm's exchanges. */
static void same_training(ch_device *dev, const model_spec *s, ch_dtype precision)
{
    const char *id = ch_device_id(dev);
    const char *pn = precision_name(precision);
    ch_module *base = make_model(s), *m[2] = {NULL, NULL};
    ch_optimizer *opt[2] = {NULL, NULL};
    ch_loss *loss[2] = {NULL, NULL};
    trail *tr = calloc(2, sizeof *tr);
    batch b = {NULL, NULL};
    int gpt = strcmp(s->kind, "gpt") == 0;
    ch_optimizer_options o =
        ch_optimizer_defaults(gpt ? CH_OPT_ADAMW : CH_OPT_SGD, gpt ? 1e-3f : 0.05f);
    o.momentum = gpt ? 0.0f : 0.9f;
    ch_status st = base && tr ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    for (int k = 0; st == CH_OK && k < 2; k++) {
        st = ch_module_clone(&m[k], base, dev);
        if (st == CH_OK)
            st = ch_module_set_precision(m[k], precision);
        if (st == CH_OK)
            st = ch_module_set_recompute(m[k], k);
        if (st == CH_OK)
            st = ch_optimizer_new(&opt[k], m[k], &o);
        if (st == CH_OK)
            st = ch_loss_new(&loss[k], CH_LOSS_CROSS_ENTROPY);
        if (st == CH_OK) {
            nn_set_grad_hook(m[k], on_grads, &tr[k]);
            nn_set_sync(m[k], on_sync, &tr[k]);
        }
    }
    if (st == CH_OK)
        st = make_batch(&b, s, dev, 5);
    if (!tap_status_ok(st, "%s %s on %s: two replicas of one model", s->kind, pn, id))
        goto done;
    int losses_same = 1, grads_same = 1;
    double worst_grad = 0.0;
    float lv[2] = {0.0f, 0.0f};
    const char *bad = NULL;
    for (int step = 0; st == CH_OK && step < STEPS; step++) {
        for (int k = 0; st == CH_OK && k < 2; k++)
            st = train_pass(m[k], loss[k], &b, step, &lv[k]);
        if (st != CH_OK)
            break;
        if (tap_bits_of(lv[0]) != tap_bits_of(lv[1])) {
            losses_same = 0;
            tap_diag("step %d: loss %.9g without, %.9g with recomputation", step, lv[0], lv[1]);
        }
        double w;
        const char *g = first_difference(m[0], m[1], 1, &w);
        if (g && !bad)
            bad = g;
        grads_same = grads_same && !g;
        if (w > worst_grad)
            worst_grad = w;
        for (int k = 0; st == CH_OK && k < 2; k++)
            st = ch_optimizer_step(opt[k], o.lr);
    }
    if (!tap_status_ok(st, "%s %s on %s: %d training steps with and without recomputation", s->kind,
                       pn, id, STEPS))
        goto done;
    tap_ok(losses_same, "%s %s on %s: the losses of %d steps are the same bits (last %.6f)",
           s->kind, pn, id, STEPS, lv[1]);
    tap_ok(grads_same,
           "%s %s on %s: every gradient of every step is the same bits%s%s (worst %.3g)", s->kind,
           pn, id, bad ? ", not " : "", bad ? bad : "", worst_grad);
    double worst;
    const char *p = first_difference(m[0], m[1], 0, &worst);
    tap_ok(!p,
           "%s %s on %s: parameters%s after %d %s steps are the same bits%s%s (largest "
           "difference %.3g)",
           s->kind, pn, id, gpt ? "" : " and BatchNorm's buffers", STEPS, gpt ? "AdamW" : "SGD",
           p ? ", not " : "", p ? p : "", worst);
    tap_ok(trails_equal(&tr[0], &tr[1]),
           "%s %s on %s: %d gradient reports in the same order (%d with recomputation)", s->kind,
           pn, id, tr[0].n, tr[1].n);
    if (!gpt)
        tap_ok(tr[0].syncs == tr[1].syncs && tr[0].syncs > 0,
               "%s %s on %s: BatchNorm's sums exchanged %d times, as without recomputation "
               "(%d)",
               s->kind, pn, id, tr[1].syncs, tr[0].syncs);
done:
    batch_free(&b);
    for (int k = 0; k < 2; k++) {
        ch_optimizer_free(opt[k]);
        ch_loss_free(loss[k]);
        ch_module_free(m[k]);
    }
    ch_module_free(base);
    free(tr);
}

/* ---- Data parallelism ------------------------------------------------------- */

enum {
    DP_STEPS = 3,
    DP_BATCH = 6
};

/* DP_STEPS steps of ch_dp over devs (split 1:2:3, BatchNorm synchronised,
 * the host's reduction) of the model of spec s, recomputing or not (the
 * replicas are clones of the model: they keep its flag); the trained
 * parameters and buffers into *out; *flag: whether the last replica
 * recomputes. */
static ch_status dp_train(const model_spec *s, ch_device **devs, int n, int recompute,
                          ch_module **out, int *flag)
{
    int gpt = strcmp(s->kind, "gpt") == 0;
    static const float weights[3] = {1, 2, 3};
    ch_dp_options o = {0};
    o.split = CH_DP_SPLIT_WEIGHTS;
    o.weights = weights;
    o.nweights = n;
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_SGD, 0.05f);
    o.optimizer.momentum = 0.9f;
    o.sample_ndim = gpt ? 1 : 3;
    o.sample_shape[0] = gpt ? s->context : 1;
    o.sample_shape[1] = o.sample_shape[2] = s->context;
    o.sample_dtype = gpt ? CH_I32 : CH_F32;
    o.labels_per_sample = gpt ? s->context : 1;
    o.seed = 9;
    o.no_bind = 1;
    int64_t per_sample = gpt ? s->context : s->context * s->context;
    int64_t labels = gpt ? s->context : 1;
    ch_host_buffer *x = NULL, *y = NULL;
    ch_dp *dp = NULL;
    ch_module *m = make_model(s);
    ch_status st = m ? ch_module_set_recompute(m, recompute) : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_host_buffer_new(&x, devs[0], (size_t)(DP_BATCH * per_sample) * 4);
    if (st == CH_OK)
        st = ch_host_buffer_new(&y, devs[0], (size_t)(DP_BATCH * labels) * 4);
    if (st == CH_OK)
        st = ch_dp_new(&dp, m, devs, n, &o);
    tap_rng r = {77};
    for (int step = 0; st == CH_OK && step < DP_STEPS; step++) {
        float *xf = ch_host_buffer_data(x);
        int32_t *xi = ch_host_buffer_data(x), *yi = ch_host_buffer_data(y);
        for (int64_t i = 0; i < DP_BATCH * per_sample; i++) {
            if (gpt)
                xi[i] = (int32_t)(tap_rng_next(&r) % VOCAB);
            else
                xf[i] = tap_rng_uniform(&r, -2.0f, 2.0f);
        }
        for (int64_t i = 0; i < DP_BATCH * labels; i++)
            yi[i] = (int32_t)(tap_rng_next(&r) % (gpt ? VOCAB : CLASSES));
        ch_batch b = {x, y, NULL, DP_BATCH, 0, step};
        float loss;
        st = ch_dp_step(dp, &loss, &b, o.optimizer.lr);
    }
    if (st == CH_OK) {
        *flag = ch_module_recompute(ch_dp_replica(dp, n - 1));
        st = ch_dp_sync_to(dp, m);
    }
    ch_dp_free(dp);
    ch_host_buffer_free(x);
    ch_host_buffer_free(y);
    if (st != CH_OK) {
        ch_module_free(m);
        return st;
    }
    *out = m;
    return CH_OK;
}

/* Replicas that recompute post their gradients to the buckets and take
 * BatchNorm's statistics across the replicas as those that do not: the
 * same training, bit for bit. */
static void data_parallel(const model_spec *s)
{
    ch_device *three[3] = {NULL, NULL, NULL};
    if (ch_device_by_name(&three[0], "host") != CH_OK ||
        ch_device_by_name(&three[1], "opencl:0") != CH_OK ||
        ch_device_by_name(&three[2], "opencl:1") != CH_OK) {
        tap_skip("%s data parallel over host,opencl:0,opencl:1: no two OpenCL devices here",
                 s->kind);
        return;
    }
    ch_module *m[2] = {NULL, NULL};
    int flag[2] = {-1, -1};
    ch_status st = CH_OK;
    for (int k = 0; st == CH_OK && k < 2; k++)
        st = dp_train(s, three, 3, k, &m[k], &flag[k]);
    if (tap_status_ok(st,
                      "%s: %d data-parallel steps over host,opencl:0,opencl:1 with and "
                      "without recomputation",
                      s->kind, DP_STEPS)) {
        double worst;
        const char *bad = first_difference(m[0], m[1], 0, &worst);
        tap_ok(flag[0] == 0 && flag[1] == 1,
               "%s: the replicas of a recomputing model recompute (%d), the others not (%d)",
               s->kind, flag[1], flag[0]);
        tap_ok(!bad,
               "%s: the trained parameters%s are the same bits%s%s (largest difference "
               "%.3g)",
               s->kind, strcmp(s->kind, "gpt") ? " and running statistics" : "",
               bad ? ", not " : "", bad ? bad : "", worst);
    }
    ch_module_free(m[0]);
    ch_module_free(m[1]);
}

/* ---- Memory ---------------------------------------------------------------- */

/* The growth of dev's memory over two training steps of a model of spec s:
 * the peak less what was in use before (model and batch already there).
 * *raised: whether the steps raised the device's peak (else the figure is
 * an upper bound: the peak was set earlier). */
static ch_status step_memory(ch_device *dev, const model_spec *s, const ch_module *base,
                             int recompute, uint64_t *grown, int *raised)
{
    ch_module *m = NULL;
    ch_loss *loss = NULL;
    batch b = {NULL, NULL};
    ch_memory_stats before, after;
    float lv;
    ch_status st = ch_module_clone(&m, base, dev);
    if (st == CH_OK)
        st = ch_module_set_recompute(m, recompute);
    if (st == CH_OK)
        st = ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = make_batch(&b, s, dev, 11);
    if (st == CH_OK)
        st = ch_device_memory_stats(dev, &before);
    for (int step = 0; st == CH_OK && step < 2; step++)
        st = train_pass(m, loss, &b, step, &lv);
    if (st == CH_OK)
        st = ch_device_memory_stats(dev, &after);
    if (st == CH_OK) {
        *grown = after.peak_bytes - before.in_use_bytes;
        *raised = after.peak_bytes > before.peak_bytes;
    }
    batch_free(&b);
    ch_loss_free(loss);
    ch_module_free(m);
    return st;
}

/* A GPT and a ResNet on dev, each with and without recomputation, the
 * four runs in the order of their peaks (the GPT's with recomputation
 * is the lowest, its step without the highest), so that each raises the
 * device's peak and measures its own: a run that did not would only give
 * an upper bound, which is said; the runs without recomputation must. */
static void lower_peaks(ch_device *dev, const model_spec *gpt, const model_spec *resnet)
{
    const char *id = ch_device_id(dev);
    const model_spec *spec[2] = {gpt, resnet};
    static const int order[4][2] = {{0, 1}, {1, 1}, {1, 0}, {0, 0}}; /* (model, recompute) */
    const double at_most[2] = {0.5, 0.8};
    ch_module *base[2] = {make_model(gpt), make_model(resnet)};
    uint64_t grown[2][2] = {{0, 0}, {0, 0}};
    int raised[2][2] = {{0, 0}, {0, 0}};
    ch_status st = base[0] && base[1] ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    for (int k = 0; st == CH_OK && k < 4; k++) {
        int i = order[k][0], rc = order[k][1];
        st = step_memory(dev, spec[i], base[i], rc, &grown[i][rc], &raised[i][rc]);
    }
    ch_module_free(base[0]);
    ch_module_free(base[1]);
    if (!tap_status_ok(st,
                       "a %d-layer gpt and a resnet-%d on %s: two steps each, with and "
                       "without recomputation",
                       gpt->layers, resnet->layers, id))
        return;
    for (int i = 0; i < 2; i++) {
        const uint64_t *g = grown[i];
        double ratio = g[0] ? (double)g[1] / (double)g[0] : 1.0;
        tap_ok(raised[i][0] && g[1] < g[0] && ratio <= at_most[i],
               "%s-%d on %s: a step's peak memory is %.2f MiB with recomputation%s, %.2f MiB "
               "without (%.2f of it, want <= %.2f)%s",
               spec[i]->kind, spec[i]->layers, id, g[1] / 1048576.0, raised[i][1] ? "" : " or less",
               g[0] / 1048576.0, ratio, at_most[i],
               raised[i][0] ? "" : "; the run without did not raise the peak");
    }
}

/* ---- The flag ------------------------------------------------------------------ */

static int same_names(const ch_module *a, const ch_module *b)
{
    if (ch_module_param_count(a) != ch_module_param_count(b) ||
        ch_module_buffer_count(a) != ch_module_buffer_count(b))
        return 0;
    for (int i = 0; i < ch_module_param_count(a); i++) {
        const char *x = NULL, *y = NULL;
        if (ch_module_param(a, i, &x, NULL, NULL) != CH_OK ||
            ch_module_param(b, i, &y, NULL, NULL) != CH_OK || strcmp(x, y) != 0)
            return 0;
    }
    for (int i = 0; i < ch_module_buffer_count(a); i++) {
        const char *x = NULL, *y = NULL;
        if (ch_module_buffer(a, i, &x, NULL, NULL) != CH_OK ||
            ch_module_buffer(b, i, &y, NULL, NULL) != CH_OK || strcmp(x, y) != 0)
            return 0;
    }
    return 1;
}

static void flag_api(ch_device *host)
{
    tap_status_is(ch_module_set_recompute(NULL, 1), CH_ERR_INVALID_ARGUMENT, "m is NULL",
                  "ch_module_set_recompute(NULL) is refused");
    tap_ok(ch_module_recompute(NULL) == 0, "ch_module_recompute(NULL) is 0");
    ch_module *mlp = NULL;
    if (tap_status_ok(ch_nn_preset(&mlp, "mlp"), "the mlp preset")) {
        tap_status_ok(ch_module_set_recompute(mlp, 1), "an mlp takes the flag");
        tap_ok(ch_module_recompute(mlp) == 0, "an mlp has nothing to recompute");
    }
    ch_module_free(mlp);

    ch_module *gpt = make_model(&small_gpt), *plain = make_model(&small_gpt), *c = NULL;
    ch_module *res = make_model(&small_resnet), *rplain = make_model(&small_resnet);
    if (!gpt || !plain || !res || !rplain)
        goto done;
    tap_ok(ch_module_recompute(gpt) == 0, "a new GPT does not recompute");
    tap_status_ok(ch_module_set_recompute(gpt, 1), "ch_module_set_recompute(gpt, 1)");
    tap_status_ok(ch_module_set_recompute(res, 7), "ch_module_set_recompute(resnet, 7)");
    int blocks = 0, stages = 0;
    ch_module *h = ch_module_child(ch_module_child(gpt, 0), 1);
    for (int i = 0; i < ch_module_child_count(h); i++)
        blocks += ch_module_recompute(ch_module_child(h, i));
    for (int i = 0; i < ch_module_child_count(res); i++) {
        ch_module *l = ch_module_child(res, i);
        if (strncmp(ch_module_name(l), "layer", 5) == 0)
            stages += ch_module_recompute(l);
    }
    tap_ok(blocks == small_gpt.layers && ch_module_recompute(gpt) == 1,
           "every GPT block recomputes (%d of %d)", blocks, small_gpt.layers);
    tap_ok(stages == 3 && ch_module_recompute(res) == 1, "every ResNet stage recomputes (%d of 3)",
           stages);
    tap_ok(ch_module_recompute(ch_module_child(ch_module_child(gpt, 0), 0)) == 0,
           "the embeddings do not");
    tap_ok(same_names(gpt, plain) && same_names(res, rplain),
           "parameter and buffer names are those of the models without it");
    if (tap_status_ok(ch_module_clone(&c, gpt, host), "clone a recomputing GPT"))
        tap_ok(ch_module_recompute(c) == 1, "the clone recomputes");
    tap_status_ok(ch_module_set_recompute(gpt, 0), "ch_module_set_recompute(gpt, 0)");
    tap_ok(ch_module_recompute(gpt) == 0, "and then it does not");
done:
    ch_module_free(c);
    ch_module_free(gpt);
    ch_module_free(plain);
    ch_module_free(res);
    ch_module_free(rplain);
}

/* The flag turned off between a forward and its backward: the segments
 * whose state is gone still compute it again; evaluation gives the same
 * logits either way. */
static void flag_between(ch_device *host)
{
    ch_module *base = make_model(&small_resnet), *m[2] = {NULL, NULL};
    ch_loss *loss[2] = {NULL, NULL};
    batch b = {NULL, NULL};
    ch_tensor *y = NULL, *l = NULL, *dy = NULL;
    ch_status st = base ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    for (int k = 0; st == CH_OK && k < 2; k++) {
        st = ch_module_clone(&m[k], base, host);
        if (st == CH_OK)
            st = ch_module_set_recompute(m[k], k);
        if (st == CH_OK)
            st = ch_loss_new(&loss[k], CH_LOSS_CROSS_ENTROPY);
    }
    if (st == CH_OK)
        st = make_batch(&b, &small_resnet, host, 3);
    for (int k = 0; st == CH_OK && k < 2; k++) {
        st = ch_module_forward(m[k], &y, b.x);
        if (st == CH_OK && k == 1)
            st = ch_module_set_recompute(m[k], 0);
        if (st == CH_OK)
            st = ch_loss_forward(loss[k], &l, y, b.labels);
        if (st == CH_OK)
            st = ch_loss_backward(loss[k], &dy, 1.0f);
        if (st == CH_OK)
            st = ch_module_backward(m[k], NULL, dy);
    }
    double worst = 0.0;
    const char *bad = NULL;
    if (tap_status_ok(st, "resnet: recomputation turned off between forward and backward")) {
        bad = first_difference(m[0], m[1], 1, &worst);
        tap_ok(!bad, "its gradients are still the same bits%s%s", bad ? ", not " : "",
               bad ? bad : "");
    }
    ch_tensor *out[2] = {NULL, NULL};
    st = ch_module_set_recompute(m[1], 1);
    for (int k = 0; st == CH_OK && k < 2; k++) {
        ch_module_train(m[k], 0);
        st = ch_module_forward(m[k], &out[k], b.x);
    }
    double d = 0.0;
    if (tap_status_ok(st, "resnet: evaluation with and without recomputation"))
        tap_ok(same_bits(out[0], out[1], &d),
               "the same logits in evaluation (largest difference %.3g)", d);
    batch_free(&b);
    for (int k = 0; k < 2; k++) {
        ch_loss_free(loss[k]);
        ch_module_free(m[k]);
    }
    ch_module_free(base);
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    ch_device *devs[64], *host = NULL;
    int n = tap_devices(devs, 64);
    if (!tap_status_ok(ch_device_by_name(&host, "host"), "the host device"))
        return tap_done();
    for (int i = 0; i < n; i++) {
        ch_device_info info;
        if (ch_device_get_info(devs[i], &info) == CH_OK)
            tap_diag("%s: %s%s%s", info.id, info.name, info.platform[0] ? ", " : "", info.platform);
    }
    /* The memory first, while each device's peak is still low. */
    const model_spec gpt6 = {"gpt", 6, 64, 32, 8}, resnet20 = {"resnet", 20, 16, 16, 8};
    for (int i = 0; i < n; i++)
        lower_peaks(devs[i], &gpt6, &resnet20);
    flag_api(host);
    flag_between(host);
    data_parallel(&small_gpt);
    data_parallel(&small_resnet);
    for (int i = 0; i < n; i++) {
        same_training(devs[i], &small_gpt, CH_F32);
        same_training(devs[i], &small_resnet, CH_F32);
        same_training(devs[i], &small_gpt, CH_BF16);
        same_training(devs[i], &small_resnet, CH_BF16);
    }
    ch_shutdown();
    return tap_done();
}
