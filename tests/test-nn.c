/* nn modules: gradients by finite differences on every device, layers on
 * two devices, cloning, losses, optimizers, and checkpoints. */
#include <math.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

static tap_rng rng = {12345};

static ch_device *host_dev(void)
{
    ch_device *h = NULL;
    ch_device_by_name(&h, "host");
    return h;
}

static ch_tensor *tensor_from(ch_device *dev, int ndim, const int64_t *shape, const float *v)
{
    ch_tensor *t = NULL;
    if (ch_tensor_new(&t, dev, CH_F32, ndim, shape) != CH_OK)
        return NULL;
    ch_tensor_upload(t, v, ch_tensor_nbytes(t));
    return t;
}

static float *download(const ch_tensor *t)
{
    float *v = malloc(ch_tensor_nbytes(t));
    ch_tensor_download(t, v, ch_tensor_nbytes(t));
    return v;
}

static void random_fill(float *v, int64_t n, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = tap_rng_uniform(&rng, lo, hi);
}

/* L = sum(m(x) * r), evaluated in double. */
static double objective(ch_module *m, const ch_tensor *x, const float *r)
{
    ch_tensor *y = NULL;
    if (ch_module_forward(m, &y, x) != CH_OK)
        return NAN;
    float *yv = download(y);
    double s = 0;
    for (int64_t i = 0; i < ch_tensor_numel(y); i++)
        s += (double)yv[i] * r[i];
    free(yv);
    return s;
}

/* Perturb element i of tensor t by d (t's content mirrored in v). */
static void nudge(ch_tensor *t, float *v, int64_t i, float d)
{
    v[i] += d;
    ch_tensor_upload(t, v, ch_tensor_nbytes(t));
}

static double rel_err(double got, double want)
{
    return fabs(got - want) / fmax(fabs(want), 1e-1);
}

/* Check dL/dx and dL/dparams of m at x against central differences. */
static void grad_check(const char *what, ch_module *m, ch_device *dev, int ndim,
                       const int64_t *xshape, float xlo, float xhi)
{
    const char *id = ch_device_id(dev);
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= xshape[i];
    float *xv = malloc(sizeof(float) * (size_t)n);
    random_fill(xv, n, xlo, xhi);
    ch_tensor *x = tensor_from(dev, ndim, xshape, xv);
    ch_tensor *y = NULL, *dx = NULL;
    if (!tap_status_ok(ch_module_forward(m, &y, x), "%s on %s: forward", what, id)) {
        free(xv);
        ch_tensor_free(x);
        return;
    }
    int64_t ny = ch_tensor_numel(y);
    float *r = malloc(sizeof(float) * (size_t)ny);
    random_fill(r, ny, -1, 1);
    int64_t yshape[8];
    for (int i = 0; i < ch_tensor_ndim(y); i++)
        yshape[i] = ch_tensor_dim(y, i);
    ch_tensor *dy = tensor_from(ch_tensor_device(y), ch_tensor_ndim(y), yshape, r);
    ch_module_zero_grad(m);
    tap_status_ok(ch_module_backward(m, &dx, dy), "%s on %s: backward", what, id);
    float *dxv = dx ? download(dx) : NULL;
    const float h = 2e-3f; /* small enough to rarely cross a ReLU or max-pool kink */
    double worst = 0;
    for (int k = 0; dxv && k < 6; k++) {
        int64_t i = (int64_t)(tap_rng_next(&rng) % (uint64_t)n);
        nudge(x, xv, i, h);
        double lp = objective(m, x, r);
        nudge(x, xv, i, -2 * h);
        double lm = objective(m, x, r);
        nudge(x, xv, i, h);
        worst = fmax(worst, rel_err(dxv[i], (lp - lm) / (2 * h)));
    }
    tap_ok(dxv && worst < 5e-3, "%s on %s: dx matches finite differences (worst rel err %.2e)",
           what, id, worst);
    int np = ch_module_param_count(m);
    for (int p = 0; p < np; p++) {
        const char *name;
        ch_tensor *w, *g;
        ch_module_param(m, p, &name, &w, &g);
        float *wv = download(w), *gv = download(g);
        int64_t nw = ch_tensor_numel(w);
        double werr = 0;
        for (int k = 0; k < 4; k++) {
            int64_t i = (int64_t)(tap_rng_next(&rng) % (uint64_t)nw);
            nudge(w, wv, i, h);
            double lp = objective(m, x, r);
            nudge(w, wv, i, -2 * h);
            double lm = objective(m, x, r);
            nudge(w, wv, i, h);
            werr = fmax(werr, rel_err(gv[i], (lp - lm) / (2 * h)));
        }
        tap_ok(werr < 5e-3, "%s on %s: d/d%s matches finite differences (worst %.2e)", what, id,
               name, werr);
        free(wv);
        free(gv);
    }
    free(dxv);
    free(xv);
    free(r);
    ch_tensor_free(x);
    ch_tensor_free(dy);
}

static ch_module *small_cnn(void)
{
    ch_module *m[6] = {NULL};
    ch_nn_conv2d(&m[0], 2, 3, 3, 1, 1);
    ch_nn_activation(&m[1], CH_ACT_RELU);
    ch_nn_maxpool2d(&m[2], 2, 2);
    ch_nn_flatten(&m[3]);
    ch_nn_linear(&m[4], 3 * 3 * 3, 4);
    ch_nn_activation(&m[5], CH_ACT_TANH);
    return tap_sequential(6, m);
}

static void test_gradients(ch_device *dev)
{
    ch_module *m = NULL;
    int64_t x2[2] = {4, 5}, x4[4] = {2, 2, 6, 6}, x4b[4] = {2, 3, 7, 5};

    ch_nn_linear(&m, 5, 3);
    ch_module_init(m, 1);
    ch_module_to(m, dev);
    grad_check("Linear(5, 3)", m, dev, 2, x2, -1, 1);
    ch_module_free(m);

    ch_nn_conv2d(&m, 2, 3, 3, 1, 1);
    ch_module_init(m, 2);
    ch_module_to(m, dev);
    grad_check("Conv2d(2, 3, 3, pad 1)", m, dev, 4, x4, -1, 1);
    ch_module_free(m);

    ch_nn_conv2d(&m, 3, 2, 3, 2, 0);
    ch_module_init(m, 3);
    ch_module_to(m, dev);
    grad_check("Conv2d(3, 2, 3, stride 2)", m, dev, 4, x4b, -1, 1);
    ch_module_free(m);

    for (int a = 0; a < CH_ACT_COUNT; a++) {
        ch_nn_activation(&m, (ch_activation)a);
        ch_module_to(m, dev);
        grad_check(ch_module_kind(m), m, dev, 2, x2, -2, 2);
        ch_module_free(m);
    }

    ch_nn_maxpool2d(&m, 2, 2);
    ch_module_to(m, dev);
    grad_check("MaxPool2d(2)", m, dev, 4, x4, -1, 1);
    ch_module_free(m);

    m = small_cnn();
    ch_module_init(m, 4);
    ch_module_to(m, dev);
    grad_check("small cnn", m, dev, 4, x4, -1, 1);
    ch_module_free(m);
}

/* Every parameter's gradient (grad 1) or value, downloaded end to end
 * into g (n floats at most): how many, -1 on a failure. */
static int64_t all_params(ch_module *m, int grad, float *g, int64_t n)
{
    int64_t at = 0;
    for (int i = 0; i < ch_module_param_count(m); i++) {
        ch_tensor *t = NULL;
        if (ch_module_param(m, i, NULL, grad ? NULL : &t, grad ? &t : NULL) != CH_OK ||
            at + ch_tensor_numel(t) > n)
            return -1;
        ch_tensor_download(t, g + at, ch_tensor_nbytes(t));
        at += ch_tensor_numel(t);
    }
    return at;
}

/* ch_module_zero_grad's gradients read as zeros; the first backward after
 * it writes them (whatever was there, NaN included: the Linears' GEMMs
 * and bias sums overwrite, LayerNorm's sums add to zeros written first),
 * the next adds to them; an optimizer step with no backward between sees
 * zeros. */
static void test_zero_grad(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_module *c[4] = {NULL};
    ch_nn_linear(&c[0], 5, 6);
    ch_nn_layernorm(&c[1], 6, 1e-5f);
    ch_nn_activation(&c[2], CH_ACT_TANH);
    ch_nn_linear(&c[3], 6, 3);
    ch_module *m = tap_sequential(4, c);
    int64_t xs[2] = {4, 5}, ys[2] = {4, 3};
    float xv[20], dyv[12], g1[128], g2[128], gz[128];
    tap_rng own = {20261206}; /* not the file's: the other cases keep their draws */
    for (int i = 0; i < 20; i++)
        xv[i] = tap_rng_uniform(&own, -1, 1);
    for (int i = 0; i < 12; i++)
        dyv[i] = tap_rng_uniform(&own, -1, 1);
    ch_tensor *x = NULL, *dy = NULL, *y = NULL, *dx = NULL;
    ch_status st = m ? ch_module_init(m, 7) : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_module_to(m, dev);
    if (st == CH_OK) {
        x = tensor_from(dev, 2, xs, xv);
        dy = tensor_from(dev, 2, ys, dyv);
        st = x && dy ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    }
    /* NaN in every gradient, then zero_grad and one backward: g1. */
    for (int i = 0; st == CH_OK && i < ch_module_param_count(m); i++) {
        ch_tensor *g = NULL;
        st = ch_module_param(m, i, NULL, NULL, &g);
        if (st == CH_OK)
            st = ch_fill(g, NAN);
    }
    if (st == CH_OK)
        st = ch_module_zero_grad(m);
    if (st == CH_OK)
        st = ch_module_forward(m, &y, x);
    if (st == CH_OK)
        st = ch_module_backward(m, &dx, dy);
    int64_t n = st == CH_OK ? all_params(m, 1, g1, 128) : -1;
    int finite = n > 0;
    for (int64_t i = 0; i < n; i++)
        finite &= isfinite(g1[i]) != 0;
    tap_ok(finite, "zero_grad on %s: the backward after it overwrites NaN gradients (%lld floats)",
           id, (long long)n);
    /* Twice without zero_grad between: 2 g1. */
    if (st == CH_OK)
        st = ch_module_zero_grad(m);
    for (int k = 0; st == CH_OK && k < 2; k++) {
        st = ch_module_forward(m, &y, x);
        if (st == CH_OK)
            st = ch_module_backward(m, &dx, dy);
    }
    double worst = n > 0 && st == CH_OK && all_params(m, 1, g2, 128) == n ? 0.0 : INFINITY;
    for (int64_t i = 0; i < n; i++)
        worst = fmax(worst, fabs(g2[i] - 2.0 * g1[i]) / fmax(fabs(2.0 * g1[i]), 1e-3));
    tap_ok(worst <= 1e-6,
           "zero_grad on %s: two backwards after it add up to twice one "
           "(worst relative error %.2g)",
           id, worst);
    /* zero_grad alone: zeros to a reader; SGD then leaves the weights. */
    float before[128], after[128];
    if (st == CH_OK)
        st = ch_module_zero_grad(m);
    int zeros = st == CH_OK && all_params(m, 1, gz, 128) == n;
    for (int64_t i = 0; zeros && i < n; i++)
        zeros = gz[i] == 0.0f;
    tap_ok(zeros, "zero_grad on %s: the gradients read as zeros", id);
    ch_optimizer *opt = NULL;
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_SGD, 0.5f);
    if (st == CH_OK)
        st = ch_module_zero_grad(m);
    int64_t np = st == CH_OK ? all_params(m, 0, before, 128) : -1;
    if (st == CH_OK)
        st = ch_optimizer_new(&opt, m, &o);
    if (st == CH_OK)
        st = ch_optimizer_step(opt, 0.5f);
    int64_t na = st == CH_OK ? all_params(m, 0, after, 128) : -1;
    tap_ok(st == CH_OK && np == na && np > 0 && memcmp(before, after, sizeof(float) * np) == 0,
           "zero_grad on %s: an SGD step with no backward since leaves the weights (%s)", id,
           st == CH_OK ? "ok" : ch_last_error());
    ch_optimizer_free(opt);
    ch_tensor_free(x);
    ch_tensor_free(dy);
    ch_module_free(m);
}

static void test_dropout(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_module *m = NULL;
    ch_nn_dropout(&m, 0.5f);
    ch_module_to(m, dev);
    int64_t shape[2] = {8, 16};
    float xv[128];
    for (int i = 0; i < 128; i++)
        xv[i] = 1.0f + (float)i;
    ch_tensor *x = tensor_from(dev, 2, shape, xv), *y = NULL, *dx = NULL;
    ch_module_set_rng(m, 77, 3, 0);
    ch_module_forward(m, &y, x);
    float *yv = download(y);
    int zeros = 0, kept = 0;
    for (int i = 0; i < 128; i++) {
        zeros += yv[i] == 0.0f;
        kept += yv[i] == 2.0f * xv[i];
    }
    tap_ok(zeros + kept == 128 && zeros > 30 && zeros < 98,
           "Dropout(0.5) on %s: %d zeroed, %d scaled by 2", id, zeros, kept);
    ch_module_backward(m, &dx, x);
    float *dxv = download(dx);
    tap_ok(memcmp(dxv, yv, sizeof(float) * 128) == 0, "Dropout on %s: backward uses the mask",
           id);
    /* Rows 4..7 drawn alone, as a replica holding them would, see the same mask. */
    ch_tensor *half = NULL, *y2 = NULL;
    ch_tensor_view(&half, x, 4, 4);
    ch_module_set_rng(m, 77, 3, 4);
    ch_module_forward(m, &y2, half);
    float *y2v = download(y2);
    tap_ok(memcmp(y2v, yv + 64, sizeof(float) * 64) == 0,
           "Dropout on %s: a split batch sees each sample's own numbers", id);
    ch_module_train(m, 0);
    ch_module_forward(m, &y2, x);
    free(y2v);
    y2v = download(y2);
    tap_ok(memcmp(y2v, xv, sizeof xv) == 0, "Dropout on %s: identity in evaluation mode", id);
    /* In evaluation y and dx are views of x and dy; training again, the
     * mask's products go to memory of their own, x and dy unchanged. */
    ch_tensor *dy = NULL, *dx2 = NULL;
    float dyv[128];
    for (int i = 0; i < 128; i++)
        dyv[i] = -0.5f * (float)i;
    dy = tensor_from(dev, 2, shape, dyv);
    ch_module_backward(m, &dx2, dy);
    float *dx2v = download(dx2);
    tap_ok(memcmp(dx2v, dyv, sizeof dyv) == 0, "Dropout on %s: backward the identity in evaluation",
           id);
    free(dx2v);
    ch_module_train(m, 1);
    ch_module_set_rng(m, 77, 3, 0);
    ch_module_forward(m, &y2, x);
    ch_module_backward(m, &dx2, dy);
    float *xa = download(x), *dya = download(dy), *y3v = download(y2);
    dx2v = download(dx2);
    int masked = 1;
    for (int i = 0; i < 128; i++)
        masked &= dx2v[i] == (yv[i] == 0.0f ? 0.0f : 2.0f * dyv[i]);
    tap_ok(memcmp(xa, xv, sizeof xv) == 0 && memcmp(dya, dyv, sizeof dyv) == 0 &&
               memcmp(y3v, yv, sizeof xv) == 0 && masked,
           "Dropout on %s: training after evaluation: the same mask into y and dx of their own, "
           "x and dy unchanged",
           id);
    free(xa);
    free(dya);
    free(y3v);
    free(dx2v);
    ch_tensor_free(dy);
    free(yv);
    free(dxv);
    free(y2v);
    ch_tensor_free(half);
    ch_tensor_free(x);
    ch_module_free(m);
}

/* The same cnn on host, and split over two devices, gives the same result. */
static void test_model_parallel(ch_device *a, ch_device *b)
{
    ch_module *one = small_cnn(), *two = NULL;
    ch_module_init(one, 9);
    tap_status_ok(ch_module_clone(&two, one, a), "clone the cnn to %s", ch_device_id(a));
    tap_status_ok(ch_module_to(ch_module_child(two, 4), b), "move its Linear layer to %s",
                  ch_device_id(b));
    int64_t shape[4] = {2, 2, 6, 6};
    float xv[144];
    random_fill(xv, 144, -1, 1);
    ch_device *host = NULL;
    ch_device_by_name(&host, "host");
    ch_tensor *x1 = tensor_from(host, 4, shape, xv), *x2 = tensor_from(a, 4, shape, xv);
    ch_tensor *y1 = NULL, *y2 = NULL, *dx1 = NULL, *dx2 = NULL;
    ch_module_forward(one, &y1, x1);
    tap_status_ok(ch_module_forward(two, &y2, x2), "forward across %s and %s", ch_device_id(a),
                  ch_device_id(b));
    float *v1 = download(y1), *v2 = y2 ? download(y2) : NULL;
    double err = 0;
    for (int i = 0; v2 && i < 8; i++)
        err = fmax(err, fabs(v1[i] - v2[i]));
    tap_ok(v2 && err < 1e-5 && ch_tensor_device(y2) == b,
           "split model: output on %s matches the host's (max err %.2e)", ch_device_id(b), err);
    float ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    int64_t yshape[2] = {2, 4};
    ch_tensor *d1 = tensor_from(host, 2, yshape, ones), *d2 = tensor_from(b, 2, yshape, ones);
    ch_module_backward(one, &dx1, d1);
    tap_status_ok(ch_module_backward(two, &dx2, d2), "backward across devices");
    float *g1 = download(dx1), *g2 = dx2 ? download(dx2) : NULL;
    err = 0;
    for (int i = 0; g2 && i < 144; i++)
        err = fmax(err, fabs(g1[i] - g2[i]));
    tap_ok(g2 && err < 1e-5 && ch_tensor_device(dx2) == a,
           "split model: dx back on %s matches the host's (max err %.2e)", ch_device_id(a), err);
    free(v1);
    free(v2);
    free(g1);
    free(g2);
    ch_tensor_free(x1);
    ch_tensor_free(x2);
    ch_tensor_free(d1);
    ch_tensor_free(d2);
    ch_module_free(one);
    ch_module_free(two);
}

static void test_names(void)
{
    ch_module *m = small_cnn();
    const char *want[4] = {"0.weight", "0.bias", "4.weight", "4.bias"};
    int ok = ch_module_param_count(m) == 4;
    for (int i = 0; ok && i < 4; i++) {
        const char *name;
        ch_module_param(m, i, &name, NULL, NULL);
        ok = strcmp(name, want[i]) == 0;
    }
    tap_ok(ok, "parameters are named like PyTorch's state_dict (0.weight ... 4.bias)");
    ch_tensor *w;
    ch_module_param(m, 0, NULL, &w, NULL);
    tap_ok(ch_tensor_ndim(w) == 4 && ch_tensor_dim(w, 0) == 3 && ch_tensor_dim(w, 1) == 2,
           "Conv2d weight is [out, in, kh, kw]");
    ch_module_init(m, 5);
    float *v = download(w);
    double bound = 1.0 / sqrt(2 * 9), mx = 0;
    for (int i = 0; i < 54; i++)
        mx = fmax(mx, fabs(v[i]));
    tap_ok(mx <= bound && mx > bound * 0.5, "init: |w| <= 1/sqrt(fan_in) = %.4f (max %.4f)",
           bound, mx);
    free(v);
    ch_module_free(m);
}

/* Ten points per class around four corners: an MLP must learn them. */
static void test_training(ch_device *dev, ch_optimizer_kind kind)
{
    const char *id = ch_device_id(dev);
    enum { N = 64 };
    float xv[N * 2];
    int32_t lab[N];
    for (int i = 0; i < N; i++) {
        lab[i] = i % 4;
        xv[2 * i] = (lab[i] & 1 ? 1.0f : -1.0f) + tap_rng_uniform(&rng, -0.4f, 0.4f);
        xv[2 * i + 1] = (lab[i] & 2 ? 1.0f : -1.0f) + tap_rng_uniform(&rng, -0.4f, 0.4f);
    }
    ch_module *seq = NULL, *l = NULL;
    ch_nn_sequential(&seq);
    ch_nn_linear(&l, 2, 16);
    ch_nn_sequential_add(seq, l);
    ch_nn_activation(&l, CH_ACT_RELU);
    ch_nn_sequential_add(seq, l);
    ch_nn_linear(&l, 16, 4);
    ch_nn_sequential_add(seq, l);
    ch_module_init(seq, 11);
    ch_module_to(seq, dev);
    int64_t xs[2] = {N, 2}, ls[1] = {N};
    ch_tensor *x = tensor_from(dev, 2, xs, xv), *labels = NULL, *y, *loss_v, *dy;
    ch_tensor_new(&labels, dev, CH_I32, 1, ls);
    ch_tensor_upload(labels, lab, sizeof lab);
    ch_loss *loss = NULL;
    ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY);
    float lr = kind == CH_OPT_SGD ? 0.2f : 0.02f;
    ch_optimizer_options o = ch_optimizer_defaults(kind, lr);
    o.momentum = kind == CH_OPT_SGD ? 0.9f : 0.0f;
    ch_optimizer *opt = NULL;
    ch_optimizer_new(&opt, seq, &o);
    float first = 0, last = 0;
    ch_status st = CH_OK;
    for (int step = 0; st == CH_OK && step < 60; step++) {
        st = ch_module_zero_grad(seq);
        if (st == CH_OK)
            st = ch_module_forward(seq, &y, x);
        if (st == CH_OK)
            st = ch_loss_forward(loss, &loss_v, y, labels);
        if (st == CH_OK)
            st = ch_loss_backward(loss, &dy, 1.0f);
        if (st == CH_OK)
            st = ch_module_backward(seq, NULL, dy);
        if (st == CH_OK)
            st = ch_optimizer_step(opt, lr);
        if (st == CH_OK)
            ch_tensor_download(loss_v, step == 0 ? &first : &last, sizeof(float));
    }
    tap_status_ok(st, "train a 2-16-4 MLP on %s", id);
    tap_ok(last < 0.25f * first, "%s optimizer on %s: loss %.4f -> %.4f (want < 25%%)",
           kind == CH_OPT_SGD ? "SGD" : kind == CH_OPT_ADAM ? "Adam" : "AdamW", id, first, last);
    ch_optimizer_free(opt);
    ch_loss_free(loss);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    ch_module_free(seq);
}

static int params_equal(ch_module *a, ch_module *b)
{
    int n = ch_module_param_count(a);
    if (n != ch_module_param_count(b))
        return 0;
    for (int i = 0; i < n; i++) {
        ch_tensor *ta, *tb;
        ch_module_param(a, i, NULL, &ta, NULL);
        ch_module_param(b, i, NULL, &tb, NULL);
        float *va = download(ta), *vb = download(tb);
        int same = memcmp(va, vb, ch_tensor_nbytes(ta)) == 0;
        free(va);
        free(vb);
        if (!same)
            return 0;
    }
    return 1;
}

/* x rounded to `dtype` and back, as ch_cast does it: what a half
 * checkpoint holds. NULL on failure. */
static float *rounded(ch_tensor *x, ch_dtype dtype)
{
    int64_t shape[CH_MAX_DIMS];
    for (int d = 0; d < ch_tensor_ndim(x); d++)
        shape[d] = ch_tensor_dim(x, d);
    ch_tensor *h = NULL, *w = NULL;
    float *v = NULL;
    if (ch_tensor_new(&h, ch_tensor_device(x), dtype, ch_tensor_ndim(x), shape) == CH_OK &&
        ch_tensor_new(&w, ch_tensor_device(x), CH_F32, ch_tensor_ndim(x), shape) == CH_OK &&
        ch_cast(h, x) == CH_OK && ch_cast(w, h) == CH_OK)
        v = download(w);
    ch_tensor_free(h);
    ch_tensor_free(w);
    return v;
}

/* Checkpoints in bf16 and f16: half the tensor bytes, safetensors' dtype
 * names, and loading gives the values rounded to the format, bit for bit,
 * optimizer state included; f32 and a bad dtype. */
static void test_checkpoint_half(const char *dir, ch_module *a, ch_optimizer *opt)
{
    static const ch_dtype dts[] = {CH_BF16, CH_F16};
    static const char *const names[] = {"BF16", "F16"};
    /* The same in f32, with the same (no) training state in its header. */
    char f32_path[256];
    struct stat full;
    snprintf(f32_path, sizeof f32_path, "%s/f32.safetensors", dir);
    tap_status_ok(ch_checkpoint_save_as(f32_path, a, opt, NULL, CH_F32), "save as F32");
    stat(f32_path, &full);
    for (int k = 0; k < 2; k++) {
        char path[256];
        snprintf(path, sizeof path, "%s/half-%s.safetensors", dir, names[k]);
        tap_status_ok(ch_checkpoint_save_as(path, a, opt, NULL, dts[k]), "save as %s",
                      names[k]);
        struct stat half;
        /* The parameters and AdamW's two moments, 2 bytes each fewer. */
        int64_t saved = 0;
        for (int i = 0; i < ch_module_param_count(a); i++) {
            ch_tensor *p;
            ch_module_param(a, i, NULL, &p, NULL);
            saved += 3 * 2 * (int64_t)ch_tensor_numel(p);
        }
        FILE *f = fopen(path, "rb");
        char head[4096] = "";
        size_t got = f ? fread(head, 1, sizeof head - 1, f) : 0;
        head[got] = '\0';
        if (f)
            fclose(f);
        char want[32];
        snprintf(want, sizeof want, "\"dtype\":\"%s\"", names[k]);
        int64_t less = stat(path, &half) == 0 ? (int64_t)(full.st_size - half.st_size) : 0;
        tap_ok(strstr(head + 8, want) && !strstr(head + 8, "\"F32\"") && less >= saved - 256 &&
                   less <= saved + 64,
               "%s: every tensor %s, %lld bytes against %lld in f32 (%lld fewer, want about "
               "%lld)", names[k], names[k], (long long)half.st_size, (long long)full.st_size,
               (long long)less, (long long)saved);
        ch_module *b = small_cnn();
        ch_module_init(b, 99);
        ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, 0.01f);
        ch_optimizer *ob = NULL;
        ch_optimizer_new(&ob, b, &o);
        tap_status_ok(ch_checkpoint_load(path, b, ob, NULL), "load the %s file", names[k]);
        int same = 1;
        for (int i = 0; i < ch_module_param_count(a); i++) {
            ch_tensor *pa, *pb;
            ch_module_param(a, i, NULL, &pa, NULL);
            ch_module_param(b, i, NULL, &pb, NULL);
            float *want_v = rounded(pa, dts[k]), *got_v = download(pb);
            same = same && want_v && got_v &&
                   memcmp(want_v, got_v, ch_tensor_nbytes(pa)) == 0;
            free(want_v);
            free(got_v);
        }
        ch_tensor *s1 = NULL, *s2 = NULL;
        ch_optimizer_state(opt, 1, NULL, &s1);
        ch_optimizer_state(ob, 1, NULL, &s2);
        float *m1 = rounded(s1, dts[k]), *m2 = s2 ? download(s2) : NULL;
        tap_ok(same && m1 && m2 && memcmp(m1, m2, ch_tensor_nbytes(s1)) == 0,
               "%s: the parameters and moments loaded are the saved ones rounded to %s, bit "
               "for bit", names[k], names[k]);
        free(m1);
        free(m2);
        ch_optimizer_free(ob);
        ch_module_free(b);
        unlink(path);
    }
    unlink(f32_path);
    /* A tensor of a dtype checkpoints do not hold. */
    char path[256];
    snprintf(path, sizeof path, "%s/f64.safetensors", dir);
    FILE *f = fopen(path, "wb");
    char header[] = "{\"0.weight\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}";
    unsigned char len[8] = {(unsigned char)(sizeof header - 1)};
    if (f) {
        fwrite(len, 1, 8, f);
        fwrite(header, 1, sizeof header - 1, f);
        fwrite("\0\0\0\0\0\0\0\0", 1, 8, f);
        fclose(f);
    }
    ch_module *c = small_cnn();
    tap_status_is(ch_checkpoint_load(path, c, NULL, NULL), CH_ERR_FORMAT,
                  "\"0.weight\" is F64, expected F32, BF16 or F16", "a tensor in F64 is refused");
    ch_module_free(c);
    unlink(path);
    snprintf(path, sizeof path, "%s/i32.safetensors", dir);
    tap_status_is(ch_checkpoint_save_as(path, a, opt, NULL, CH_I32), CH_ERR_DTYPE,
                  "expected f32, bf16 or f16", "save as i32 is refused");
    tap_ok(access(path, F_OK) != 0, "... and writes no file");
}

/* The checkpoint buf (got bytes) written to `path` with the value "was"
 * of metadata `key` replaced by "with" (as long: the header stays valid);
 * 0 when the file does not hold that value. */
static int with_meta(const char *path, char *buf, size_t got, const char *key, const char *was,
                     const char *with)
{
    char pat[128];
    int n = snprintf(pat, sizeof pat, "\"%s\":\"%s\"", key, was);
    char *at = NULL;
    for (size_t i = 8; !at && i + (size_t)n <= got; i++)
        if (memcmp(buf + i, pat, (size_t)n) == 0)
            at = buf + i;
    char *value = at ? at + strlen(key) + 4 : NULL;
    if (at)
        memcpy(value, with, strlen(was));
    FILE *f = fopen(path, "wb");
    if (f) {
        fwrite(buf, 1, got, f);
        fclose(f);
    }
    if (at)
        memcpy(value, was, strlen(was));
    return at != NULL && strlen(was) == strlen(with);
}

static void test_checkpoint(void)
{
    char dir[] = "/tmp/chorus-test-nn-XXXXXX", path[256], bad[256];
    if (!mkdtemp(dir)) {
        tap_ok(0, "mkdtemp");
        return;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    ch_module *a = small_cnn(), *b = small_cnn();
    ch_module_init(a, 21);
    ch_module_init(b, 22);
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, 0.01f);
    ch_optimizer *opt = NULL;
    ch_optimizer_new(&opt, a, &o);
    ch_optimizer_step(opt, 0.01f);
    ch_train_state st = {3, 17, 250, 0xFFFFFFFFFFFFFFF0ull, 0.2860f, 0.25f, 0.0f, 0}, back = {0};
    tap_status_ok(ch_checkpoint_save(path, a, opt, &st), "save a checkpoint");
    tap_ok(access(path, R_OK) == 0, "the checkpoint file is there");
    ch_optimizer *opt_b = NULL;
    ch_optimizer_new(&opt_b, b, &o);
    tap_status_ok(ch_checkpoint_load(path, b, opt_b, &back), "load it into another model");
    tap_ok(params_equal(a, b), "the loaded parameters equal the saved ones");
    tap_ok(back.epoch == 3 && back.batch == 17 && back.step == 250 && back.seed == st.seed,
           "training state round-trips (epoch %lld, batch %lld, step %lld)",
           (long long)back.epoch, (long long)back.batch, (long long)back.step);
    tap_ok(memcmp(&back.input_mean, &st.input_mean, sizeof st.input_mean) == 0 &&
               memcmp(&back.input_std, &st.input_std, sizeof st.input_std) == 0,
           "the inputs' normalisation round-trips bit for bit (mean %.9g, std %.9g)",
           back.input_mean, back.input_std);
    tap_ok(ch_optimizer_steps(opt_b) == 1, "optimizer steps round-trip (%lld)",
           (long long)ch_optimizer_steps(opt_b));
    ch_tensor *s1, *s2;
    ch_optimizer_state(opt, 1, NULL, &s1);
    ch_optimizer_state(opt_b, 1, NULL, &s2);
    float *v1 = download(s1), *v2 = s2 ? download(s2) : NULL;
    tap_ok(v2 && memcmp(v1, v2, ch_tensor_nbytes(s1)) == 0, "optimizer moments round-trip");
    free(v1);
    free(v2);
    test_checkpoint_half(dir, a, opt);

    /* A model of another shape: the first mismatch is named. */
    ch_module *c = NULL, *l = NULL;
    ch_nn_sequential(&c);
    ch_nn_conv2d(&l, 2, 5, 3, 1, 1);
    ch_nn_sequential_add(c, l);
    tap_status_is(ch_checkpoint_load(path, c, NULL, NULL), CH_ERR_SHAPE, "0.weight",
                  "loading into a model of another shape names 0.weight");
    ch_module_free(c);
    ch_nn_sequential(&c);
    ch_nn_activation(&l, CH_ACT_RELU);
    ch_nn_sequential_add(c, l);
    ch_nn_conv2d(&l, 2, 3, 3, 1, 1);
    ch_nn_sequential_add(c, l);
    tap_status_is(ch_checkpoint_load(path, c, NULL, NULL), CH_ERR_FORMAT, "\"1.weight\"",
                  "a parameter missing from the file is named");
    ch_module_free(c);
    ch_optimizer *sgd = NULL;
    ch_optimizer_options so = ch_optimizer_defaults(CH_OPT_SGD, 0.1f);
    ch_optimizer_new(&sgd, b, &so);
    tap_status_is(ch_checkpoint_load(path, b, sgd, NULL), CH_ERR_FORMAT, "adamw",
                  "loading AdamW state into SGD is refused");
    ch_optimizer_free(sgd);

    tap_status_is(ch_checkpoint_load("/nonexistent/x.safetensors", b, NULL, NULL),
                  CH_ERR_NOT_FOUND, "/nonexistent/x.safetensors", "a missing file is named");
    snprintf(bad, sizeof bad, "%s/bad.safetensors", dir);
    FILE *f = fopen(bad, "wb");
    fwrite("\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":", 1, 13, f);
    fclose(f);
    tap_status_is(ch_checkpoint_load(bad, b, NULL, NULL), CH_ERR_FORMAT, "header length",
                  "a header longer than the file is refused");
    f = fopen(bad, "wb");
    fwrite("\x08\x00\x00\x00\x00\x00\x00\x00not json", 1, 16, f);
    fclose(f);
    tap_status_is(ch_checkpoint_load(bad, b, NULL, NULL), CH_ERR_FORMAT, "JSON",
                  "a header that is not JSON is refused");
    /* Truncate the real file: the data no longer fits its offsets. */
    FILE *in = fopen(path, "rb");
    fseek(in, 0, SEEK_END);
    long size = ftell(in);
    fseek(in, 0, SEEK_SET);
    char *buf = malloc((size_t)size);
    size_t got = fread(buf, 1, (size_t)size, in);
    fclose(in);
    f = fopen(bad, "wb");
    fwrite(buf, 1, got - 16, f);
    fclose(f);
    ch_module_init(b, 23);
    tap_status_is(ch_checkpoint_load(bad, b, opt_b, NULL), CH_ERR_FORMAT, "offsets",
                  "a truncated checkpoint is refused");
    tap_ok(!params_equal(a, b), "a failed load leaves the model as it was");
    /* A normalisation with a std <= 0, and metadata counts that are not
     * whole numbers >= 0 (same lengths: the header stays valid), refused
     * before the model is changed. */
    static const struct {
        const char *key, *was, *with, *says;
    } metas[] = {{"input_std", "0.25", "-1.0", "input_std \"-1.0\""},
                 {"step", "250", "-25", "step is \"-25\""},
                 {"seed", "18446744073709551600", "x8446744073709551600", "seed is \"x"},
                 {"optimizer_steps", "1", "-", "optimizer_steps is \"-\""}};
    for (size_t k = 0; k < sizeof metas / sizeof metas[0]; k++) {
        int found = with_meta(bad, buf, got, metas[k].key, metas[k].was, metas[k].with);
        tap_status_is(ch_checkpoint_load(bad, b, opt_b, &back), CH_ERR_FORMAT, metas[k].says,
                      "a recorded %s of \"%s\" is refused (%s in the header)", metas[k].key,
                      metas[k].with, found ? "found" : "NOT found");
        tap_ok(!params_equal(a, b), "... before the model is changed");
    }
    ch_train_state none = {0, 0, 0, 1, 0.0f, 0.0f, 0.0f, 0};
    back.input_std = 1.0f;
    int none_ok = ch_checkpoint_save(bad, a, NULL, &none) == CH_OK &&
                  ch_checkpoint_load(bad, b, NULL, &back) == CH_OK;
    tap_ok(none_ok && back.input_std == 0.0f,
           "input_std 0 records no normalisation, and loads back as 0 (got %g)",
           back.input_std);
    free(buf);
    ch_checkpoint_load(path, b, NULL, NULL);
    tap_status_is(ch_checkpoint_save("/nonexistent/dir/x.safetensors", a, NULL, NULL), CH_ERR_IO,
                  "/nonexistent/dir", "an unwritable path is named");
    unlink(bad);
    unlink(path);
    rmdir(dir);
    ch_optimizer_free(opt);
    ch_optimizer_free(opt_b);
    ch_module_free(a);
    ch_module_free(b);
}

/* Cross-entropy forward and backward at once (ch_loss_forward_backward)
 * against the two calls: the same loss and gradient to TOL 1e-6 relative
 * (one pass or two over each row), the gradient in pred's place, and no
 * state left for a later backward. */
static void test_xent_at_once(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    enum {
        N = 37,
        C = 301
    };
    int64_t shape[2] = {N, C}, nshape[1] = {N};
    float *x = malloc(sizeof(float) * N * C), *ga = NULL, *gb = NULL;
    int32_t lab[N];
    /* Its own numbers: the shared stream stays as the later tests expect. */
    tap_rng own = {777};
    for (int i = 0; i < N * C; i++)
        x[i] = tap_rng_uniform(&own, -6, 6);
    for (int i = 0; i < N; i++)
        lab[i] = (int32_t)(tap_rng_next(&own) % C);
    ch_tensor *pa = tensor_from(dev, 2, shape, x), *pb = tensor_from(dev, 2, shape, x);
    ch_tensor *labels = NULL, *va = NULL, *vb = NULL, *da = NULL, *db = NULL;
    ch_loss *la = NULL, *lb = NULL;
    ch_status st = ch_tensor_new(&labels, dev, CH_I32, 1, nshape);
    if (st == CH_OK)
        st = ch_tensor_upload(labels, lab, sizeof lab);
    if (st == CH_OK)
        st = ch_loss_new(&la, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = ch_loss_new(&lb, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = ch_loss_forward(la, &va, pa, labels);
    if (st == CH_OK)
        st = ch_loss_backward(la, &da, 0.5f);
    if (st == CH_OK)
        st = ch_loss_forward_backward(lb, &vb, &db, pb, labels, 0.5f);
    float lossa = 0, lossb = 0;
    double err = 0.0;
    if (st == CH_OK) {
        ch_tensor_download(va, &lossa, sizeof lossa);
        ch_tensor_download(vb, &lossb, sizeof lossb);
        ga = download(da);
        gb = download(db);
        err = fabs((double)lossa - lossb) / fabs((double)lossa);
        for (int i = 0; i < N * C; i++)
            err = fmax(err, fabs((double)ga[i] - gb[i]) / (0.5 / N));
    }
    tap_ok(st == CH_OK && db == pb && err <= 1e-6,
           "%s: cross-entropy forward_backward: loss %.7g (apart %.7g), gradient in pred's "
           "place, differences %.2g of 0.5/N (want <= 1e-6) (%s)",
           id, lossb, lossa, err, st == CH_OK ? "ok" : ch_last_error());
    ch_tensor *g = NULL;
    tap_status_is(ch_loss_backward(lb, &g, 1.0f), CH_ERR_STATE, "no forward pass",
                  "%s: no backward after forward_backward", id);
    tap_status_is(ch_loss_forward_backward(lb, &vb, &db, labels, labels, 1.0f), CH_ERR_SHAPE,
                  "2 ([N, C])", "%s: forward_backward with 1-D predictions", id);
    tap_status_is(ch_loss_forward_backward(lb, &vb, NULL, pb, labels, 1.0f),
                  CH_ERR_INVALID_ARGUMENT, "dpred", "%s: forward_backward without dpred", id);
    tap_status_is(ch_loss_forward_backward(NULL, &vb, &db, pb, labels, 1.0f),
                  CH_ERR_INVALID_ARGUMENT, "loss", "%s: forward_backward without a loss", id);
    free(x);
    free(ga);
    free(gb);
    ch_loss_free(la);
    ch_loss_free(lb);
    ch_tensor_free(pa);
    ch_tensor_free(pb);
    ch_tensor_free(labels);
}

/* A cross-entropy loss, and tokens [2, 8] and labels [16] on dev. */
static ch_status gpt_batch(ch_device *dev, const int32_t *tok, const int32_t *lab, ch_loss **loss,
                           ch_tensor **idx, ch_tensor **labels)
{
    int64_t is[2] = {2, 8}, ls[1] = {16};
    ch_status st = ch_loss_new(loss, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = ch_tensor_new(idx, dev, CH_I32, 2, is);
    if (st == CH_OK)
        st = ch_tensor_upload(*idx, tok, 16 * sizeof *tok);
    if (st == CH_OK)
        st = ch_tensor_new(labels, dev, CH_I32, 1, ls);
    if (st == CH_OK)
        st = ch_tensor_upload(*labels, lab, 16 * sizeof *lab);
    return st;
}

/* Three AdamW steps of a small GPT in bf16 mixed precision (weights kept
 * rounded by the step), once with each device's parameters in one call
 * and once a call each (ch_optimizer_set_one_by_one): the same bits in
 * every parameter. */
static void test_adam_grouped(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_gpt_config cfg = {.layers = 1, .heads = 2, .dim = 32, .context = 8, .vocab = 37};
    ch_module *m[2] = {NULL, NULL};
    ch_optimizer *opt[2] = {NULL, NULL};
    ch_loss *loss = NULL;
    ch_tensor *idx = NULL, *labels = NULL;
    int32_t tok[2 * 8], lab[2 * 8];
    tap_rng own = {4242};
    for (int i = 0; i < 16; i++) {
        tok[i] = (int32_t)(tap_rng_next(&own) % 37);
        lab[i] = (int32_t)(tap_rng_next(&own) % 37);
    }
    ch_optimizer_options oo = ch_optimizer_defaults(CH_OPT_ADAMW, 1e-2f);
    ch_status st = gpt_batch(dev, tok, lab, &loss, &idx, &labels);
    for (int k = 0; k < 2 && st == CH_OK; k++) {
        st = ch_nn_gpt(&m[k], &cfg);
        if (st == CH_OK)
            st = ch_module_init(m[k], 7);
        if (st == CH_OK)
            st = ch_module_set_precision(m[k], CH_BF16);
        if (st == CH_OK)
            st = ch_module_to(m[k], dev);
        if (st == CH_OK)
            st = ch_optimizer_new(&opt[k], m[k], &oo);
        if (st == CH_OK)
            st = ch_optimizer_set_one_by_one(opt[k], k);
        for (int step = 0; step < 3 && st == CH_OK; step++) {
            ch_tensor *y = NULL, *lv = NULL, *dy = NULL;
            st = ch_module_zero_grad(m[k]);
            if (st == CH_OK)
                st = ch_module_forward(m[k], &y, idx);
            if (st == CH_OK)
                st = ch_loss_forward_backward(loss, &lv, &dy, y, labels, 1.0f);
            if (st == CH_OK)
                st = ch_module_backward(m[k], NULL, dy);
            if (st == CH_OK)
                st = ch_optimizer_step(opt[k], 1e-2f);
        }
    }
    int differ = 0, n = st == CH_OK ? ch_module_param_count(m[0]) : 0;
    for (int i = 0; i < n && st == CH_OK; i++) {
        ch_tensor *a = NULL, *b = NULL;
        st = ch_module_param(m[0], i, NULL, &a, NULL);
        if (st == CH_OK)
            st = ch_module_param(m[1], i, NULL, &b, NULL);
        if (st == CH_OK) {
            float *va = download(a), *vb = download(b);
            differ += memcmp(va, vb, ch_tensor_nbytes(a)) != 0;
            free(va);
            free(vb);
        }
    }
    tap_ok(st == CH_OK && n > 0 && differ == 0,
           "%s: a bf16 GPT's three AdamW steps, grouped and one by one: %d of %d parameters "
           "differ (%s)",
           id, differ, n, st == CH_OK ? "ok" : ch_last_error());
    tap_status_is(ch_optimizer_set_one_by_one(NULL, 1), CH_ERR_INVALID_ARGUMENT, "opt",
                  "%s: ch_optimizer_set_one_by_one without an optimizer", id);
    for (int k = 0; k < 2; k++) {
        ch_optimizer_free(opt[k]);
        ch_module_free(m[k]);
    }
    ch_loss_free(loss);
    ch_tensor_free(idx);
    ch_tensor_free(labels);
}

/* Mixed precision's half logits, as autocast gives them (a Linear's
 * output stays f32 until the backends read and write half storage in
 * their elementwise kernels: ch_module_set_precision). On a GPT in bf16
 * and in f16: the logits' dtype; ch_loss_forward on them equal to the
 * loss on their f32 widening (the same values); backward from the loss's
 * f32 gradient and from that gradient already rounded to the logits'
 * format: the same bits in every parameter's gradient (ch_module_backward
 * rounds it so). On an MLP (Linear, GELU, Linear) in bf16: its output in
 * f32, within bf16's rounding of the f32 MLP's, and its input gradient
 * in f32 (its input's) from a bf16 dy. The dtype refusals. */
static void test_half_outputs(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    static const ch_dtype fmts[] = {CH_BF16, CH_F16};
    ch_gpt_config cfg = {.layers = 1, .heads = 2, .dim = 32, .context = 8, .vocab = 37};
    tap_rng own = {9191};
    int32_t tok[16], lab[16];
    for (int i = 0; i < 16; i++) {
        tok[i] = (int32_t)(tap_rng_next(&own) % 37);
        lab[i] = (int32_t)(tap_rng_next(&own) % 37);
    }
    int64_t ys[2] = {16, 37};
    for (int f = 0; f < 2; f++) {
        const char *fname = ch_dtype_name(fmts[f]);
        ch_module *m = NULL;
        ch_loss *loss = NULL;
        ch_tensor *idx = NULL, *labels = NULL, *wide = NULL, *dyh = NULL, *y = NULL, *lv = NULL,
                  *dy = NULL;
        float l_half = 0, l_wide = 0;
        ch_status st = gpt_batch(dev, tok, lab, &loss, &idx, &labels);
        if (st == CH_OK)
            st = ch_nn_gpt(&m, &cfg);
        if (st == CH_OK)
            st = ch_module_init(m, 3);
        if (st == CH_OK)
            st = ch_module_set_precision(m, fmts[f]);
        if (st == CH_OK)
            st = ch_module_to(m, dev);
        if (st == CH_OK)
            st = ch_module_forward(m, &y, idx);
        if (!tap_status_ok(st, "%s %s: a GPT's forward", id, fname))
            goto next;
        tap_ok(ch_tensor_dtype(y) == fmts[f], "%s %s: the GPT's logits are %s", id, fname,
               ch_dtype_name(ch_tensor_dtype(y)));
        st = ch_tensor_new(&wide, dev, CH_F32, 2, ys);
        if (st == CH_OK)
            st = ch_cast(wide, y);
        if (st == CH_OK)
            st = ch_loss_forward(loss, &lv, wide, labels);
        if (st == CH_OK)
            st = ch_tensor_download(lv, &l_wide, sizeof l_wide);
        if (st == CH_OK)
            st = ch_loss_forward(loss, &lv, y, labels);
        if (st == CH_OK)
            st = ch_tensor_download(lv, &l_half, sizeof l_half);
        if (!tap_status_ok(st, "%s %s: the loss on half logits", id, fname))
            goto next;
        tap_ok(l_half == l_wide && isfinite(l_half),
               "%s %s: the loss on the half logits (%.7f) is the loss on them widened (%.7f)", id,
               fname, l_half, l_wide);
        /* The gradients from dy in f32, then from dy rounded: the same. */
        float *g[2] = {NULL, NULL};
        int n = ch_module_param_count(m);
        size_t total = 0;
        for (int i = 0; i < n; i++) {
            ch_tensor *p = NULL;
            ch_module_param(m, i, NULL, &p, NULL);
            total += p ? (size_t)ch_tensor_numel(p) : 0;
        }
        st = ch_loss_backward(loss, &dy, 1.0f);
        if (st == CH_OK)
            st = ch_tensor_new(&dyh, dev, fmts[f], 2, ys);
        if (st == CH_OK)
            st = ch_cast(dyh, dy);
        for (int k = 0; k < 2 && st == CH_OK; k++) {
            g[k] = calloc(total ? total : 1, sizeof(float));
            st = g[k] ? ch_module_zero_grad(m) : CH_ERR_OUT_OF_MEMORY;
            if (st == CH_OK)
                st = ch_module_forward(m, &y, idx);
            if (st == CH_OK)
                st = ch_module_backward(m, NULL, k == 0 ? dy : dyh);
            size_t at = 0;
            for (int i = 0; i < n && st == CH_OK; i++) {
                ch_tensor *gr = NULL;
                st = ch_module_param(m, i, NULL, NULL, &gr);
                if (st == CH_OK)
                    st = ch_tensor_download(gr, g[k] + at, ch_tensor_nbytes(gr));
                at += st == CH_OK ? (size_t)ch_tensor_numel(gr) : 0;
            }
        }
        if (tap_status_ok(st, "%s %s: backward from an f32 and from a %s dy", id, fname, fname)) {
            int nonzero = 0;
            for (size_t i = 0; i < total; i++)
                nonzero += g[0][i] != 0.0f;
            tap_ok(memcmp(g[0], g[1], total * sizeof(float)) == 0 && nonzero > 0,
                   "%s %s: the same gradients (%zu values, %d not 0) from dy in f32 and in %s", id,
                   fname, total, nonzero, fname);
        }
        for (int w = 0; w < 2 && st == CH_OK; w++) { /* i32, the other half format */
            ch_tensor *other = NULL;
            st = ch_tensor_new(&other, dev, w ? fmts[1 - f] : CH_I32, 2, ys);
            if (st == CH_OK)
                tap_status_is(ch_module_backward(m, NULL, other), CH_ERR_DTYPE,
                              w ? "expected f32 or the output's" : "dy is i32",
                              "%s %s: backward from a dy in %s is refused", id, fname,
                              ch_dtype_name(ch_tensor_dtype(other)));
            ch_tensor_free(other);
        }
        free(g[0]);
        free(g[1]);
    next:
        ch_module_free(m);
        ch_loss_free(loss);
        ch_tensor_free(idx);
        ch_tensor_free(labels);
        ch_tensor_free(wide);
        ch_tensor_free(dyh);
    }

    /* The MLP in bf16 against f32. */
    enum {
        R = 5,
        I = 8,
        H = 16,
        O = 4
    };
    float x[R * I], y32[R * O], y16[R * O];
    for (int i = 0; i < R * I; i++)
        x[i] = tap_rng_uniform(&own, -1.0f, 1.0f);
    int64_t xs[2] = {R, I};
    ch_dtype ydt = CH_I32, dxdt = CH_I32;
    ch_status st = CH_OK;
    for (int k = 0; k < 2 && st == CH_OK; k++) {
        ch_module *c[3] = {NULL, NULL, NULL};
        ch_nn_linear(&c[0], I, H);
        ch_nn_activation(&c[1], CH_ACT_GELU);
        ch_nn_linear(&c[2], H, O);
        ch_module *mlp = tap_sequential(3, c);
        ch_tensor *tx = tensor_from(dev, 2, xs, x), *ty = NULL, *dx = NULL;
        st = mlp && tx ? ch_module_init(mlp, 5) : CH_ERR_OUT_OF_MEMORY;
        if (st == CH_OK && k == 1)
            st = ch_module_set_precision(mlp, CH_BF16);
        if (st == CH_OK)
            st = ch_module_to(mlp, dev);
        if (st == CH_OK)
            st = ch_module_forward(mlp, &ty, tx);
        if (st == CH_OK)
            st = tap_download_floats(ty, k ? y16 : y32, sizeof y32);
        if (st == CH_OK && k == 1) {
            ydt = ch_tensor_dtype(ty);
            ch_tensor *dyh = NULL; /* dy: y rounded to bf16 */
            st = ch_tensor_new(&dyh, dev, CH_BF16, 2, (int64_t[]){R, O});
            if (st == CH_OK)
                st = ch_cast(dyh, ty);
            if (st == CH_OK)
                st = ch_module_backward(mlp, &dx, dyh);
            ch_tensor_free(dyh);
            if (st == CH_OK)
                dxdt = ch_tensor_dtype(dx);
        }
        ch_tensor_free(tx);
        ch_module_free(mlp);
    }
    if (tap_status_ok(st, "%s: an MLP in f32 and in bf16", id)) {
        double err = 0, scale = 0;
        for (int i = 0; i < R * O; i++) {
            err = fmax(err, fabs((double)y16[i] - y32[i]));
            scale = fmax(scale, fabs((double)y32[i]));
        }
        tap_ok(ydt == CH_F32 && dxdt == CH_F32 && err <= 2e-2 * scale && err > 0,
               "%s: the bf16 MLP's output is %s (its input gradient %s), within %.2e of the f32 "
               "one's (largest %.2e)",
               id, ch_dtype_name(ydt), ch_dtype_name(dxdt), err, scale);
    }
    /* A max-pool takes f32 alone. */
    ch_module *pool = NULL;
    ch_tensor *hx = NULL, *py = NULL;
    int64_t ps[4] = {1, 1, 2, 2};
    st = ch_nn_maxpool2d(&pool, 2, 2);
    if (st == CH_OK)
        st = ch_tensor_new(&hx, dev, CH_BF16, 4, ps);
    if (st == CH_OK)
        tap_status_is(ch_module_forward(pool, &py, hx), CH_ERR_DTYPE, "MaxPool2d takes f32",
                      "%s: a bf16 input to a MaxPool2d is refused", id);
    else
        tap_status_ok(st, "%s: a MaxPool2d and a bf16 input", id);
    ch_tensor_free(hx);
    ch_module_free(pool);
}

/* MSE against a hand computation, and its gradient; clipping by global norm. */
static void test_mse_and_clip(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    int64_t shape[2] = {2, 3};
    float p[6] = {1, 2, 3, 4, 5, 6}, t[6] = {1, 0, 3, 2, 5, 9};
    ch_tensor *pt = tensor_from(dev, 2, shape, p), *tt = tensor_from(dev, 2, shape, t);
    ch_tensor *v = NULL, *g = NULL;
    ch_loss *loss = NULL;
    ch_loss_new(&loss, CH_LOSS_MSE);
    float got = 0, grad[6] = {0};
    tap_status_ok(ch_loss_forward(loss, &v, pt, tt), "MSE forward on %s", id);
    if (v)
        ch_tensor_download(v, &got, sizeof got);
    tap_ok(fabsf(got - (0 + 4 + 0 + 4 + 0 + 9) / 6.0f) < 1e-6f, "MSE on %s: %.6f, want %.6f", id,
           got, 17 / 6.0);
    tap_status_ok(ch_loss_backward(loss, &g, 1.0f), "MSE backward on %s", id);
    if (g)
        ch_tensor_download(g, grad, sizeof grad);
    int ok = 1;
    for (int i = 0; i < 6; i++)
        ok = ok && fabsf(grad[i] - 2.0f * (p[i] - t[i]) / 6.0f) < 1e-6f;
    tap_ok(ok, "MSE gradient on %s is 2 (p - t) / n (got %g %g %g ...)", id, grad[0], grad[1],
           grad[2]);
    /* Forward and backward at once: MSE's the same, pred left as it was. */
    ch_tensor *v2 = NULL, *g2 = NULL;
    float got2 = 0, grad2[6] = {0}, pred_after[6] = {0};
    tap_status_ok(ch_loss_forward_backward(loss, &v2, &g2, pt, tt, 1.0f),
                  "MSE forward_backward on %s", id);
    if (v2 && g2 && g2 != pt) {
        ch_tensor_download(v2, &got2, sizeof got2);
        ch_tensor_download(g2, grad2, sizeof grad2);
    }
    ch_tensor_download(pt, pred_after, sizeof pred_after);
    tap_ok(got2 == got && memcmp(grad2, grad, sizeof grad) == 0 &&
               memcmp(pred_after, p, sizeof p) == 0,
           "MSE forward_backward on %s: the same loss and gradient as forward then backward, "
           "pred untouched",
           id);
    ch_loss_free(loss);
    ch_tensor_free(pt);
    ch_tensor_free(tt);

    ch_module *m = NULL;
    ch_nn_linear(&m, 3, 2);
    ch_module_to(m, dev);
    ch_tensor *gw, *gb;
    ch_module_param(m, 0, NULL, NULL, &gw);
    ch_module_param(m, 1, NULL, NULL, &gb);
    ch_fill(gw, 2.0); /* 6 elements of 2, 2 of 2: norm sqrt(8 * 4) */
    ch_fill(gb, 2.0);
    float norm = 0, after[6];
    tap_status_ok(ch_clip_grad_norm(m, &norm, 1.0f), "clip_grad_norm on %s", id);
    ch_tensor_download(gw, after, sizeof after);
    double want = sqrt(32.0), clipped = 2.0 / want;
    tap_ok(fabs(norm - want) < 1e-5 && fabs(after[0] - clipped) < 1e-5,
           "clip_grad_norm on %s: norm %.5f (want %.5f), scaled to %.5f (want %.5f)", id, norm,
           want, after[0], clipped);
    ch_fill(gw, 0.1);
    ch_tensor_download(gw, after, sizeof after);
    ch_clip_grad_norm(m, &norm, 10.0f);
    float kept[6];
    ch_tensor_download(gw, kept, sizeof kept);
    tap_ok(memcmp(kept, after, sizeof kept) == 0, "clip_grad_norm on %s leaves a small norm (%.4f) "
           "alone", id, norm);
    ch_module_free(m);
}

/* Every error a user of nn can reach: a status and a message naming the
 * function and the problem, never a crash. */
static void test_errors(void)
{
    ch_module *m = NULL, *lin = NULL, *seq = NULL;
    tap_status_is(ch_nn_preset(&m, "vgg"), CH_ERR_NOT_FOUND, "vgg",
                  "ch_nn_preset with an unknown name names it");
    tap_ok(m == NULL, "a failed constructor leaves *out NULL");
    tap_status_is(ch_nn_linear(&m, 0, 3), CH_ERR_INVALID_ARGUMENT, "ch_nn_linear",
                  "Linear with 0 in-features");
    tap_status_is(ch_nn_conv2d(&m, 1, 2, 3, 0, 1), CH_ERR_INVALID_ARGUMENT, "stride",
                  "Conv2d with stride 0");
    tap_status_is(ch_nn_maxpool2d(&m, 0, 2), CH_ERR_INVALID_ARGUMENT, "kernel",
                  "MaxPool2d with kernel 0");
    tap_status_is(ch_nn_dropout(&m, 1.0f), CH_ERR_INVALID_ARGUMENT, "p 1",
                  "Dropout with p = 1");
    tap_status_is(ch_nn_activation(&m, CH_ACT_COUNT), CH_ERR_INVALID_ARGUMENT, NULL,
                  "an activation beyond CH_ACT_COUNT");
    tap_status_is(ch_nn_activation(&m, (ch_activation)-1), CH_ERR_INVALID_ARGUMENT, "act -1",
                  "a negative activation");
    tap_status_is(ch_nn_flatten(NULL), CH_ERR_INVALID_ARGUMENT, "out", "a NULL out");
    ch_nn_linear(&lin, 4, 2);
    ch_module *relu = NULL;
    ch_nn_activation(&relu, CH_ACT_RELU);
    tap_status_is(ch_nn_sequential_add(lin, relu), CH_ERR_INVALID_ARGUMENT, "not a Sequential",
                  "adding a child to a Linear (the child is freed)");
    tap_status_is(ch_nn_sequential_add(NULL, NULL), CH_ERR_INVALID_ARGUMENT, "seq",
                  "ch_nn_sequential_add with NULLs");

    int64_t bad_shape[2] = {3, 5}, ok_shape[2] = {3, 4}, one[1] = {3};
    ch_tensor *x5 = NULL, *x4 = NULL, *y = NULL, *dx = NULL, *labels = NULL;
    ch_tensor_new(&x5, host_dev(), CH_F32, 2, bad_shape);
    ch_tensor_new(&x4, host_dev(), CH_F32, 2, ok_shape);
    ch_tensor_new(&labels, host_dev(), CH_I32, 1, one);
    ch_fill(x5, 0.5);
    ch_fill(x4, 0.5);
    ch_fill(labels, 1.0);
    tap_status_is(ch_module_backward(lin, &dx, x4), CH_ERR_STATE, "no forward pass",
                  "backward before any forward");
    tap_status_is(ch_module_forward(lin, &y, x5), CH_ERR_SHAPE, "5 features",
                  "Linear(4, 2) given 5 features");
    tap_status_is(ch_module_forward(lin, &y, labels), CH_ERR_DTYPE, "f32",
                  "Linear given i32 input");
    tap_status_ok(ch_module_forward(lin, &y, x4), "Linear(4, 2) forward");
    tap_status_is(ch_module_backward(lin, &dx, x5), CH_ERR_SHAPE, "dy has 15 elements",
                  "backward with a dy of the wrong size");
    tap_status_is(ch_module_forward(NULL, &y, x4), CH_ERR_INVALID_ARGUMENT, "m is NULL",
                  "forward of a NULL module");
    tap_status_is(ch_module_param(lin, 2, NULL, NULL, NULL), CH_ERR_INVALID_ARGUMENT,
                  "out of range", "parameter index out of range");
    tap_status_is(ch_module_to(lin, NULL), CH_ERR_INVALID_ARGUMENT, "dev", "to a NULL device");
    tap_status_is(ch_module_clone(&m, lin, NULL), CH_ERR_INVALID_ARGUMENT, "dev",
                  "clone to a NULL device");

    ch_loss *loss = NULL;
    ch_tensor *v = NULL, *g = NULL;
    tap_status_is(ch_loss_new(&loss, (ch_loss_kind)5), CH_ERR_INVALID_ARGUMENT, "kind 5",
                  "an unknown loss");
    ch_loss_new(&loss, CH_LOSS_MSE);
    tap_status_is(ch_loss_backward(loss, &g, 1.0f), CH_ERR_STATE, "no forward pass",
                  "loss backward before forward");
    tap_status_is(ch_loss_forward(loss, &v, x4, x5), CH_ERR_SHAPE, "target has 15",
                  "MSE with a target of another size");
    ch_loss_free(loss);
    ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY);
    tap_status_is(ch_loss_forward(loss, &v, labels, labels), CH_ERR_SHAPE, "2 ([N, C])",
                  "cross-entropy with 1-D predictions");
    ch_loss_free(loss);

    ch_optimizer *opt = NULL;
    ch_optimizer_options oo = ch_optimizer_defaults(CH_OPT_SGD, 0.1f);
    oo.kind = (ch_optimizer_kind)7;
    tap_status_is(ch_optimizer_new(&opt, lin, &oo), CH_ERR_INVALID_ARGUMENT, "kind 7",
                  "an unknown optimizer");
    oo = ch_optimizer_defaults(CH_OPT_SGD, 0.1f);
    ch_optimizer_new(&opt, lin, &oo);
    tap_status_is(ch_optimizer_step(opt, -1.0f), CH_ERR_INVALID_ARGUMENT, "lr",
                  "a negative learning rate");
    tap_status_is(ch_optimizer_set_steps(opt, -3), CH_ERR_INVALID_ARGUMENT, "negative",
                  "negative optimizer steps");
    tap_status_is(ch_optimizer_state(opt, 99, NULL, NULL), CH_ERR_INVALID_ARGUMENT,
                  "out of range", "optimizer state index out of range");
    ch_optimizer_free(opt);
    ch_nn_sequential(&seq);
    ch_nn_sequential_add(seq, lin);
    ch_optimizer_new(&opt, seq, &oo);
    ch_nn_linear(&m, 2, 2);
    ch_nn_sequential_add(seq, m);
    tap_status_is(ch_optimizer_step(opt, 0.1f), CH_ERR_STATE, "parameters",
                  "stepping an optimizer whose model grew");
    ch_optimizer_free(opt);
    tap_status_is(ch_clip_grad_norm(seq, NULL, 0.0f), CH_ERR_INVALID_ARGUMENT, "max_norm",
                  "clipping to a norm of 0");
    tap_status_is(ch_checkpoint_save(NULL, seq, NULL, NULL), CH_ERR_INVALID_ARGUMENT, "path",
                  "saving to a NULL path");

    ch_dp *dp = NULL;
    ch_device *devs[1] = {host_dev()};
    ch_dp_options o = {0};
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_SGD, 0.1f);
    tap_status_is(ch_dp_new(&dp, seq, devs, 1, &o), CH_ERR_INVALID_ARGUMENT, "sample_ndim",
                  "a dp without a sample shape");
    o.sample_ndim = 1;
    o.sample_shape[0] = 4;
    tap_status_is(ch_dp_new(&dp, seq, devs, 1, NULL), CH_ERR_INVALID_ARGUMENT, "options",
                  "a dp with NULL options");
    float lossv;
    if (tap_status_ok(ch_dp_new(&dp, seq, devs, 1, &o), "a dp of one replica")) {
        tap_status_is(ch_dp_step(dp, &lossv, NULL, 0.1f), CH_ERR_INVALID_ARGUMENT, "batch",
                      "a dp step without a batch");
        tap_status_is(ch_dp_last_step(dp, NULL, NULL, 4), CH_ERR_INVALID_ARGUMENT,
                      "number of replicas", "dp_last_step with the wrong count");
        ch_module *other = NULL;
        ch_nn_linear(&other, 4, 2);
        tap_status_is(ch_dp_sync_to(dp, other), CH_ERR_SHAPE, "parameters",
                      "syncing into a model of another structure");
        ch_module_free(other);
        tap_ok(ch_dp_replica(dp, 1) == NULL && ch_dp_optimizer(dp, -1) == NULL,
               "replica and optimizer indices out of range give NULL");
    }
    ch_dp_free(dp);
    ch_tensor_free(x5);
    ch_tensor_free(x4);
    ch_tensor_free(labels);
    ch_module_free(seq);
}

static void test_schedules(void)
{
    ch_lr_schedule c = {CH_LR_COSINE, 1.0f, 10, 0, 0, 110, 0.0f};
    tap_ok(fabsf(ch_lr_at(&c, 0) - 0.1f) < 1e-6 && fabsf(ch_lr_at(&c, 9) - 1.0f) < 1e-6,
           "cosine: linear warm-up (%g, %g)", ch_lr_at(&c, 0), ch_lr_at(&c, 9));
    tap_ok(fabsf(ch_lr_at(&c, 60) - 0.5f) < 1e-6 && ch_lr_at(&c, 110) == 0.0f,
           "cosine: half way %g, end %g", ch_lr_at(&c, 60), ch_lr_at(&c, 110));
    ch_lr_schedule s = {CH_LR_STEP, 1.0f, 0, 5, 0.5f, 0, 0};
    tap_ok(ch_lr_at(&s, 4) == 1.0f && ch_lr_at(&s, 5) == 0.5f && ch_lr_at(&s, 12) == 0.25f,
           "step: x0.5 every 5 steps");
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init failed: %s", ch_last_error());
    ch_device *devs[64];
    int n = tap_devices(devs, 64);
    test_names();
    test_schedules();
    test_errors();
    for (int i = 0; i < n; i++) {
        test_gradients(devs[i]);
        test_zero_grad(devs[i]);
        test_dropout(devs[i]);
        test_mse_and_clip(devs[i]);
        test_xent_at_once(devs[i]);
        test_adam_grouped(devs[i]);
        test_half_outputs(devs[i]);
        test_training(devs[i], CH_OPT_SGD);
        test_training(devs[i], CH_OPT_ADAMW);
    }
    if (n >= 3)
        test_model_parallel(devs[1], devs[2]);
    else if (n == 2)
        test_model_parallel(devs[1], devs[0]);
    else
        tap_skip("model parallelism needs two devices (have %d)", n);
    test_checkpoint();
    ch_shutdown();
    return tap_done();
}
