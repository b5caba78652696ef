/* The ResNet and the GPT against PyTorch, number for number: the fixtures
 * in tests/fixtures/ (written by docs/pytorch/make_fixtures.py) hold a tiny
 * model's PyTorch parameters, one batch, PyTorch's logits, loss, every
 * gradient, the parameters after one AdamW step and the evaluation-mode
 * logits after it. Each is loaded by name into Chorus on every device and
 * compared. Then data parallelism: ten steps of each over host, opencl:0
 * and opencl:1 with an uneven split against host alone. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tap.h"

#define MAX_DEVICES 16
#define TOL_OUT 1e-4   /* logits and loss (f32, other summation orders) */
#define TOL_GRAD 1e-3  /* gradients and stepped parameters */
#define TOL_DP 1e-5    /* ten data-parallel steps against one device */

#define TRY_CHECK(call)                  \
    do {                                 \
        ch_status s_ = (call);           \
        if (s_ != CH_OK)                 \
            return s_;                   \
    } while (0)

/* ---- A safetensors fixture -------------------------------------------------- */

typedef struct fixture {
    const char *path;
    json_t *header;
    unsigned char *data;
    size_t size;
} fixture;

static int fixture_open(fixture *f, const char *name)
{
    static char path[1024];
    const char *src = getenv("CHORUS_TEST_SRCDIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/%s", src ? src : ".", name);
    memset(f, 0, sizeof *f);
    f->path = path;
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return 0;
    unsigned char len[8];
    uint64_t hlen = 0;
    int ok = fread(len, 1, 8, fp) == 8;
    for (int i = 0; i < 8; i++)
        hlen |= (uint64_t)len[i] << (8 * i);
    char *text = ok && hlen < (1u << 24) ? malloc(hlen + 1) : NULL;
    ok = text && fread(text, 1, hlen, fp) == hlen;
    json_error_t err;
    if (ok)
        f->header = json_loadb(text, hlen, 0, &err);
    free(text);
    long start = 8 + (long)hlen;
    ok = ok && f->header && fseek(fp, 0, SEEK_END) == 0;
    long end = ok ? ftell(fp) : -1;
    f->size = end > start ? (size_t)(end - start) : 0;
    f->data = ok && f->size ? malloc(f->size) : NULL;
    ok = f->data && fseek(fp, start, SEEK_SET) == 0 && fread(f->data, 1, f->size, fp) == f->size;
    fclose(fp);
    return ok;
}

static void fixture_close(fixture *f)
{
    json_decref(f->header);
    free(f->data);
}

static const char *fixture_meta(const fixture *f, const char *key)
{
    return json_string_value(json_object_get(json_object_get(f->header, "__metadata__"), key));
}

static int64_t meta_int(const fixture *f, const char *key)
{
    const char *s = fixture_meta(f, key);
    return s ? strtoll(s, NULL, 10) : -1;
}

static double meta_num(const fixture *f, const char *key)
{
    const char *s = fixture_meta(f, key);
    return s ? strtod(s, NULL) : NAN;
}

/* The data of tensor `name`: its bytes, element count and dtype ("F32",
 * "I32", "I64"); NULL when absent or out of the file. */
static const void *fixture_get(const fixture *f, const char *name, int64_t *numel,
                               const char **dtype)
{
    json_t *e = json_object_get(f->header, name);
    if (!e)
        return NULL;
    json_t *shape = json_object_get(e, "shape"), *offs = json_object_get(e, "data_offsets");
    int64_t n = 1;
    for (size_t i = 0; i < json_array_size(shape); i++)
        n *= json_integer_value(json_array_get(shape, i));
    json_int_t b = json_integer_value(json_array_get(offs, 0));
    json_int_t end = json_integer_value(json_array_get(offs, 1));
    *dtype = json_string_value(json_object_get(e, "dtype"));
    if (!*dtype || b < 0 || (size_t)end > f->size || end - b != n * (strcmp(*dtype, "I64") ? 4 : 8))
        return NULL;
    *numel = n;
    return f->data + b;
}

/* ---- Comparisons --------------------------------------------------------------- */

/* max |got - want| / max |want| (NaN anywhere: infinity). */
static double rel_err(const float *got, const float *want, int64_t n)
{
    double err = 0, scale = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(got[i]) || isnan(want[i]))
            return INFINITY;
        double d = fabs((double)got[i] - want[i]);
        err = d > err ? d : err;
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
    }
    return err / (scale > 0 ? scale : 1e-30);
}

/* The tensor `t` against fixture entry `key`; the error, or INFINITY when
 * it cannot be compared (the reason in *why). */
static double compare(const fixture *f, const char *key, const ch_tensor *t, char *why,
                      size_t cap)
{
    int64_t n = 0;
    const char *dtype = NULL;
    const float *want = fixture_get(f, key, &n, &dtype);
    if (!want || strcmp(dtype, "F32") != 0 || n != ch_tensor_numel(t)) {
        snprintf(why, cap, "%s: missing, not F32, or %lld elements where Chorus has %lld", key,
                 (long long)n, (long long)ch_tensor_numel(t));
        return INFINITY;
    }
    float *got = malloc((size_t)n * sizeof *got);
    ch_status st = got ? ch_tensor_download(t, got, (size_t)n * sizeof *got) : CH_ERR_OUT_OF_MEMORY;
    double e = st == CH_OK ? rel_err(got, want, n) : INFINITY;
    if (st != CH_OK)
        snprintf(why, cap, "%s: download failed: %s", key, ch_last_error());
    free(got);
    return e;
}

/* ---- The models ---------------------------------------------------------------- */

/* The fixture's model; a gpt with `dropout` when it is >= 0. */
static ch_status build_with(const fixture *f, ch_module **m, float dropout)
{
    const char *kind = fixture_meta(f, "model");
    if (kind && strcmp(kind, "gpt") == 0) {
        ch_gpt_config c = {(int)meta_int(f, "layers"), (int)meta_int(f, "heads"),
                           meta_int(f, "dim"), meta_int(f, "context"), meta_int(f, "vocab"),
                           dropout >= 0 ? dropout : (float)meta_num(f, "dropout")};
        return ch_nn_gpt(m, &c);
    }
    return ch_nn_resnet(m, (int)meta_int(f, "depth"), (int)meta_int(f, "width"),
                        (int)meta_int(f, "in_channels"), (int)meta_int(f, "classes"));
}

static ch_status build(const fixture *f, ch_module **m) { return build_with(f, m, -1.0f); }

/* Every "<prefix><name>" of the fixture names a parameter (buffers: a
 * buffer) of m and the other way round. */
static void check_names(const fixture *f, const ch_module *m, int buffers, const char *what)
{
    const char *prefix = buffers ? "buffer/" : "param/";
    size_t plen = strlen(prefix);
    int n = buffers ? ch_module_buffer_count(m) : ch_module_param_count(m), in_fixture = 0;
    char missing[256] = "", extra[256] = "";
    for (int i = 0; i < n; i++) {
        const char *name = NULL;
        if (buffers)
            ch_module_buffer(m, i, &name, NULL, NULL);
        else
            ch_module_param(m, i, &name, NULL, NULL);
        char key[256];
        snprintf(key, sizeof key, "%s%s", prefix, name);
        if (!json_object_get(f->header, key) && !missing[0])
            snprintf(missing, sizeof missing, "%s", name);
    }
    const char *key;
    json_t *v;
    json_object_foreach(f->header, key, v) {
        if (strncmp(key, prefix, plen) != 0)
            continue;
        in_fixture++;
        int found = 0;
        for (int i = 0; i < n && !found; i++) {
            const char *name = NULL;
            if (buffers)
                ch_module_buffer(m, i, &name, NULL, NULL);
            else
                ch_module_param(m, i, &name, NULL, NULL);
            found = strcmp(name, key + plen) == 0;
        }
        if (!found && !extra[0])
            snprintf(extra, sizeof extra, "%s", key + plen);
    }
    tap_ok(!missing[0] && !extra[0] && in_fixture == n,
           "%s: the %s %s in Chorus and in PyTorch are the same (%d and %d; Chorus-only: %s; "
           "PyTorch-only: %s)", what, buffers ? "buffers" : "parameters",
           buffers ? "names" : "names", n, in_fixture, missing[0] ? missing : "none",
           extra[0] ? extra : "none");
}

/* Parameters and buffers from "param/" and "buffer/" entries. */
static ch_status load(const fixture *f, ch_module *m)
{
    for (int i = 0; i < ch_module_param_count(m); i++) {
        const char *name, *dtype;
        ch_tensor *t;
        TRY_CHECK(ch_module_param(m, i, &name, &t, NULL));
        char key[256];
        snprintf(key, sizeof key, "param/%s", name);
        int64_t n = 0;
        const void *d = fixture_get(f, key, &n, &dtype);
        if (!d || n != ch_tensor_numel(t))
            return CH_ERR_NOT_FOUND;
        TRY_CHECK(ch_tensor_upload(t, d, (size_t)n * 4));
    }
    for (int i = 0; i < ch_module_buffer_count(m); i++) {
        const char *name, *dtype;
        ch_tensor *t;
        int64_t *counter;
        TRY_CHECK(ch_module_buffer(m, i, &name, &t, &counter));
        char key[256];
        snprintf(key, sizeof key, "buffer/%s", name);
        int64_t n = 0;
        const void *d = fixture_get(f, key, &n, &dtype);
        if (!d || (t && n != ch_tensor_numel(t)) || (!t && strcmp(dtype, "I64") != 0))
            return CH_ERR_NOT_FOUND;
        if (t)
            TRY_CHECK(ch_tensor_upload(t, d, (size_t)n * 4));
        else
            memcpy(counter, d, sizeof *counter);
    }
    return CH_OK;
}

/* The fixture's input and target as tensors on dev. */
static ch_status inputs(const fixture *f, ch_device *dev, ch_tensor **x, ch_tensor **y)
{
    const char *xd, *yd;
    int64_t nx = 0, ny = 0;
    const void *xv = fixture_get(f, "input", &nx, &xd);
    const void *yv = fixture_get(f, "target", &ny, &yd);
    if (!xv || !yv || strcmp(yd, "I32") != 0)
        return CH_ERR_NOT_FOUND;
    json_t *shape = json_object_get(json_object_get(f->header, "input"), "shape");
    int64_t xs[CH_MAX_DIMS];
    int nd = (int)json_array_size(shape);
    for (int i = 0; i < nd; i++)
        xs[i] = json_integer_value(json_array_get(shape, (size_t)i));
    int tokens = strcmp(xd, "I32") == 0;
    TRY_CHECK(ch_tensor_new(x, dev, tokens ? CH_I32 : CH_F32, nd, xs));
    TRY_CHECK(ch_tensor_upload(*x, xv, (size_t)nx * 4));
    TRY_CHECK(ch_tensor_new(y, dev, CH_I32, 1, &ny));
    return ch_tensor_upload(*y, yv, (size_t)ny * 4);
}

/* Stepped parameter `key` ("step/<name>") against the fixture, leaving out
 * the entries whose PyTorch gradient is rounding noise (below 1e-6 of the
 * tensor's largest): AdamW divides a gradient by its own size, so noise
 * (the key bias's gradient, zero in exact arithmetic) steps by up to lr
 * in either direction. *skipped counts them. */
static double compare_step(const fixture *f, const char *name, const ch_tensor *t,
                           int64_t *skipped, char *why, size_t cap)
{
    char key[256], gkey[256];
    snprintf(key, sizeof key, "step/%s", name);
    snprintf(gkey, sizeof gkey, "grad/%s", name);
    int64_t n = 0, ng = 0;
    const char *dt, *gdt;
    const float *want = fixture_get(f, key, &n, &dt), *g = fixture_get(f, gkey, &ng, &gdt);
    if (!want || !g || ng != n || n != ch_tensor_numel(t)) {
        snprintf(why, cap, "%s: missing or of another size", key);
        return INFINITY;
    }
    float *got = malloc((size_t)n * sizeof *got);
    if (!got || ch_tensor_download(t, got, (size_t)n * sizeof *got) != CH_OK) {
        free(got);
        snprintf(why, cap, "%s: download failed", key);
        return INFINITY;
    }
    double gmax = 0, err = 0, scale = 0;
    for (int64_t i = 0; i < n; i++)
        gmax = fabs(g[i]) > gmax ? fabs(g[i]) : gmax;
    for (int64_t i = 0; i < n; i++) {
        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
        if (fabs(g[i]) < 1e-6 * gmax) {
            ++*skipped;
            continue;
        }
        double d = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]);
        err = d > err ? d : err;
    }
    free(got);
    return err / (scale > 0 ? scale : 1e-30);
}

/* Every parameter's (what = "grad/": gradient, "step/": value) or
 * buffer's ("buffer_after/") error against the fixture: the largest, and
 * the name it comes from. */
static double worst(const fixture *f, const ch_module *m, const char *what, char *name_out,
                    size_t cap, int64_t *skipped)
{
    int buffers = strcmp(what, "buffer_after/") == 0;
    int n = buffers ? ch_module_buffer_count(m) : ch_module_param_count(m);
    double w = 0;
    snprintf(name_out, cap, "none");
    for (int i = 0; i < n; i++) {
        const char *name;
        ch_tensor *value = NULL, *grad = NULL;
        int64_t *counter = NULL;
        if (buffers)
            ch_module_buffer(m, i, &name, &value, &counter);
        else
            ch_module_param(m, i, &name, &value, &grad);
        char key[256], why[512] = "";
        snprintf(key, sizeof key, "%s%s", what, name);
        double e;
        if (counter) {
            int64_t n1 = 0;
            const char *dt;
            const int64_t *want = fixture_get(f, key, &n1, &dt);
            e = want && *want == *counter ? 0.0 : INFINITY;
        } else if (strcmp(what, "step/") == 0) {
            e = compare_step(f, name, value, skipped, why, sizeof why);
        } else {
            e = compare(f, key, strcmp(what, "grad/") == 0 ? grad : value, why, sizeof why);
        }
        if (e > w || isnan(e)) {
            w = e;
            snprintf(name_out, cap, "%s%s%s", name, why[0] ? ": " : "", why);
        }
    }
    return w;
}

static ch_optimizer_options adamw_of(const fixture *f)
{
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, (float)meta_num(f, "lr"));
    o.beta1 = (float)meta_num(f, "beta1");
    o.beta2 = (float)meta_num(f, "beta2");
    o.eps = (float)meta_num(f, "eps");
    o.weight_decay = (float)meta_num(f, "weight_decay");
    return o;
}

/* One training step of the fixture's model on dev, every result compared. */
static void against_pytorch(const fixture *f, ch_device *dev, const char *kind)
{
    const char *id = ch_device_id(dev);
    ch_module *m = NULL;
    ch_loss *loss = NULL;
    ch_optimizer *opt = NULL;
    ch_tensor *x = NULL, *target = NULL, *y = NULL, *lv = NULL, *dy = NULL;
    char name[768], why[512] = "";
    ch_status st = build(f, &m);
    if (st == CH_OK)
        st = load(f, m);
    if (st == CH_OK)
        st = ch_module_to(m, dev);
    if (st == CH_OK)
        st = inputs(f, dev, &x, &target);
    if (!tap_status_ok(st, "%s on %s: the model built, loaded from the fixture and moved", kind,
                       id))
        goto out;
    st = ch_module_forward(m, &y, x);
    if (st == CH_OK)
        st = ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = ch_loss_forward(loss, &lv, y, target);
    if (!tap_status_ok(st, "%s on %s: forward and loss", kind, id))
        goto out;
    double e = compare(f, "logits", y, why, sizeof why);
    tap_ok(e < TOL_OUT, "%s on %s: logits match PyTorch's (relative error %.3g, want < %g) %s",
           kind, id, e, TOL_OUT, why);
    e = compare(f, "loss", lv, why, sizeof why);
    tap_ok(e < TOL_OUT, "%s on %s: the loss matches PyTorch's (relative error %.3g, want < %g) %s",
           kind, id, e, TOL_OUT, why);
    st = ch_loss_backward(loss, &dy, 1.0f);
    if (st == CH_OK)
        st = ch_module_backward(m, NULL, dy);
    if (!tap_status_ok(st, "%s on %s: backward", kind, id))
        goto out;
    int64_t skipped = 0;
    e = worst(f, m, "grad/", name, sizeof name, &skipped);
    tap_ok(e < TOL_GRAD, "%s on %s: every gradient matches PyTorch's (worst %.3g in %s, want "
           "< %g)", kind, id, e, name, TOL_GRAD);
    if (ch_module_buffer_count(m) > 0) {
        e = worst(f, m, "buffer_after/", name, sizeof name, &skipped);
        tap_ok(e < TOL_OUT, "%s on %s: the running statistics after the forward match "
               "PyTorch's (worst %.3g in %s, want < %g)", kind, id, e, name, TOL_OUT);
    }
    ch_optimizer_options oo = adamw_of(f);
    st = ch_optimizer_new(&opt, m, &oo);
    if (st == CH_OK)
        st = ch_optimizer_step(opt, oo.lr);
    if (!tap_status_ok(st, "%s on %s: one AdamW step", kind, id))
        goto out;
    skipped = 0;
    e = worst(f, m, "step/", name, sizeof name, &skipped);
    tap_ok(e < TOL_GRAD, "%s on %s: the parameters after one AdamW step match PyTorch's (worst "
           "%.3g in %s, want < %g; %lld entries with a gradient of rounding noise left out)",
           kind, id, e, name, TOL_GRAD, (long long)skipped);
    ch_module_train(m, 0);
    st = ch_module_forward(m, &y, x);
    if (tap_status_ok(st, "%s on %s: forward in evaluation mode", kind, id)) {
        e = compare(f, "eval_logits", y, why, sizeof why);
        tap_ok(e < TOL_GRAD, "%s on %s: evaluation-mode logits after the step match PyTorch's "
               "(relative error %.3g, want < %g) %s", kind, id, e, TOL_GRAD, why);
    }
out:
    ch_optimizer_free(opt);
    ch_loss_free(loss);
    ch_tensor_free(x);
    ch_tensor_free(target);
    ch_module_free(m);
}

static void fixture_tests(const char *file, ch_device **devs, int ndev)
{
    fixture f;
    int opened = fixture_open(&f, file);
    if (!tap_ok(opened, "the fixture %s opens and parses", f.path)) {
        fixture_close(&f);
        return;
    }
    const char *kind = fixture_meta(&f, "model");
    ch_module *m = NULL;
    if (tap_status_ok(build(&f, &m), "a %s of the fixture's shape", kind ? kind : "(no model)")) {
        check_names(&f, m, 0, kind);
        check_names(&f, m, 1, kind);
    }
    ch_module_free(m);
    for (int i = 0; i < ndev; i++)
        against_pytorch(&f, devs[i], kind ? kind : "?");
    fixture_close(&f);
}

/* ---- Data parallelism ------------------------------------------------------------ */

#define DP_STEPS 10
#define DP_BATCH 7

typedef struct dp_data {
    ch_host_buffer *x[DP_STEPS], *y[DP_STEPS];
} dp_data;

/* Ten batches of random images (or tokens) and labels for the fixture's model. */
static ch_status dp_batches(const fixture *f, ch_device *pin, dp_data *d)
{
    int gpt = strcmp(fixture_meta(f, "model"), "gpt") == 0;
    int64_t ctx = gpt ? meta_int(f, "context") : 0, side = meta_int(f, "image_size");
    int64_t classes = gpt ? meta_int(f, "vocab") : meta_int(f, "classes");
    int64_t per_sample = gpt ? ctx : meta_int(f, "in_channels") * side * side;
    int64_t labels_per = gpt ? ctx : 1;
    tap_rng rng = {77};
    for (int s = 0; s < DP_STEPS; s++) {
        TRY_CHECK(ch_host_buffer_new(&d->x[s], pin, (size_t)(DP_BATCH * per_sample) * 4));
        TRY_CHECK(ch_host_buffer_new(&d->y[s], pin, (size_t)(DP_BATCH * labels_per) * 4));
        float *x = ch_host_buffer_data(d->x[s]);
        int32_t *xi = ch_host_buffer_data(d->x[s]), *y = ch_host_buffer_data(d->y[s]);
        for (int64_t i = 0; i < DP_BATCH * per_sample; i++) {
            if (gpt)
                xi[i] = (int32_t)(tap_rng_next(&rng) % (uint64_t)classes);
            else
                x[i] = tap_rng_uniform(&rng, -2.0f, 2.0f);
        }
        for (int64_t i = 0; i < DP_BATCH * labels_per; i++)
            y[i] = (int32_t)(tap_rng_next(&rng) % (uint64_t)classes);
    }
    return CH_OK;
}

static void dp_free(dp_data *d)
{
    for (int s = 0; s < DP_STEPS; s++) {
        ch_host_buffer_free(d->x[s]);
        ch_host_buffer_free(d->y[s]);
    }
}

static double model_diff(const ch_module *a, const ch_module *b, char *where, size_t cap);

/* Train a fresh model (seed 5) for DP_STEPS over devs; the result in *out
 * (replica 0's parameters and buffers, on the host); *spread: how far the
 * last replica's parameters and running statistics are from replica 0's
 * as ch_dp_replica hands it out. */
static ch_status dp_train(const fixture *f, ch_device **devs, int n, int local, float dropout,
                          const dp_data *d, ch_module **out, double *spread)
{
    int gpt = strcmp(fixture_meta(f, "model"), "gpt") == 0;
    int64_t side = meta_int(f, "image_size");
    static const float weights[3] = {1, 2, 3};
    ch_dp_options o = {0};
    o.split = n > 1 ? CH_DP_SPLIT_WEIGHTS : CH_DP_SPLIT_EQUAL;
    o.weights = weights;
    o.nweights = n;
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_SGD, 0.05f);
    o.optimizer.momentum = 0.9f;
    o.sample_ndim = gpt ? 1 : 3;
    if (gpt) {
        o.sample_shape[0] = meta_int(f, "context");
    } else {
        o.sample_shape[0] = meta_int(f, "in_channels");
        o.sample_shape[1] = o.sample_shape[2] = side;
    }
    o.sample_dtype = gpt ? CH_I32 : CH_F32;
    o.labels_per_sample = gpt ? meta_int(f, "context") : 1;
    o.batchnorm_local = local;
    o.seed = 9;
    o.no_bind = 1;
    ch_module *m = NULL;
    ch_dp *dp = NULL;
    TRY_CHECK(build_with(f, &m, dropout));
    ch_status st = ch_module_init(m, 5);
    if (st == CH_OK)
        st = ch_dp_new(&dp, m, devs, n, &o);
    for (int s = 0; st == CH_OK && s < DP_STEPS; s++) {
        ch_batch b = {d->x[s], d->y[s], NULL, DP_BATCH, 0, s};
        float loss;
        st = ch_dp_step(dp, &loss, &b, 0.05f);
    }
    if (st == CH_OK)
        st = ch_dp_sync_to(dp, m);
    if (st == CH_OK && spread) {
        char where[256];
        ch_module *last = ch_dp_replica(dp, n - 1);
        *spread = last ? model_diff(last, ch_dp_replica(dp, 0), where, sizeof where) : INFINITY;
    }
    ch_dp_free(dp);
    if (st != CH_OK) {
        ch_module_free(m);
        return st;
    }
    *out = m;
    return CH_OK;
}

/* The largest relative difference between the parameters and tensor
 * buffers of a and b (same structure, on the host). */
static double model_diff(const ch_module *a, const ch_module *b, char *where, size_t cap)
{
    double w = 0;
    int np = ch_module_param_count(a), nb = ch_module_buffer_count(a);
    for (int i = 0; i < np + nb; i++) {
        const char *name;
        ch_tensor *ta = NULL, *tb = NULL;
        if (i < np) {
            ch_module_param(a, i, &name, &ta, NULL);
            ch_module_param(b, i, NULL, &tb, NULL);
        } else {
            ch_module_buffer(a, i - np, &name, &ta, NULL);
            ch_module_buffer(b, i - np, NULL, &tb, NULL);
        }
        if (!ta)
            continue;
        int64_t n = ch_tensor_numel(ta);
        float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
        double e = INFINITY;
        if (x && y && ch_tensor_download(ta, x, (size_t)n * 4) == CH_OK &&
            ch_tensor_download(tb, y, (size_t)n * 4) == CH_OK)
            e = rel_err(x, y, n);
        free(x);
        free(y);
        if (e > w || isnan(e)) {
            w = e;
            snprintf(where, cap, "%s", name);
        }
    }
    return w;
}

static void dp_tests(const char *file)
{
    ch_device *host = NULL, *cl0 = NULL, *cl1 = NULL;
    ch_device_by_name(&host, "host");
    if (ch_device_by_name(&cl0, "opencl:0") != CH_OK ||
        ch_device_by_name(&cl1, "opencl:1") != CH_OK) {
        tap_skip("%s data parallel over host,opencl:0,opencl:1: no two OpenCL devices here",
                 file);
        return;
    }
    fixture f;
    if (!fixture_open(&f, file)) {
        tap_ok(0, "the fixture %s opens", f.path);
        fixture_close(&f);
        return;
    }
    const char *kind = fixture_meta(&f, "model");
    dp_data d = {{0}, {0}};
    ch_device *three[3] = {host, cl0, cl1};
    ch_module *one = NULL, *many = NULL, *local = NULL;
    ch_status st = dp_batches(&f, host, &d);
    if (st == CH_OK)
        st = dp_train(&f, three, 1, 0, -1.0f, &d, &one, NULL);
    if (st == CH_OK)
        st = dp_train(&f, three, 3, 0, -1.0f, &d, &many, NULL);
    if (tap_status_ok(st, "%s: %d steps on host, and over host,opencl:0,opencl:1 split 1:2:3",
                      kind, DP_STEPS)) {
        char where[256] = "";
        double e = model_diff(many, one, where, sizeof where);
        tap_ok(e < TOL_DP, "%s: %d data-parallel steps (batch %d split 1:2:3, BatchNorm "
               "synchronised) equal the steps on host alone (worst relative difference %.3g in "
               "%s, want < %g)", kind, DP_STEPS, DP_BATCH, e, where, TOL_DP);
    }
    if (st == CH_OK && strcmp(kind, "gpt") == 0) {
        /* Dropout draws by the sample's place in the whole batch: the
         * same masks whatever the split. */
        ch_module *one_d = NULL, *many_d = NULL;
        st = dp_train(&f, three, 1, 0, 0.2f, &d, &one_d, NULL);
        if (st == CH_OK)
            st = dp_train(&f, three, 3, 0, 0.2f, &d, &many_d, NULL);
        if (tap_status_ok(st, "gpt with dropout 0.2: on host, and over three devices")) {
            char where[256] = "";
            double e = model_diff(many_d, one_d, where, sizeof where);
            double moved = model_diff(one_d, one, where, sizeof where);
            tap_ok(e < TOL_DP && moved > 100 * TOL_DP, "gpt with dropout 0.2: %d data-parallel "
                   "steps equal host alone (worst %.3g, want < %g), and dropout changed the "
                   "training (%.3g from the run without)", DP_STEPS, e, TOL_DP, moved);
        }
        ch_module_free(one_d);
        ch_module_free(many_d);
    }
    if (st == CH_OK && ch_module_buffer_count(one) > 0) {
        double spread = INFINITY;
        st = dp_train(&f, three, 3, 1, -1.0f, &d, &local, &spread);
        if (tap_status_ok(st, "%s: the same with per-replica BatchNorm statistics", kind)) {
            tap_ok(spread == 0.0, "%s: opencl:1's replica, as ch_dp_replica gives it, holds "
                   "replica 0's parameters and running statistics (difference %g)", kind,
                   spread);
            char where[256] = "";
            double e = model_diff(local, one, where, sizeof where);
            tap_ok(e > 100 * TOL_DP, "%s: with per-replica statistics the steps differ from "
                   "host alone (relative difference %.3g in %s, want > %g): the synchronised "
                   "statistics are what makes them equal", kind, e, where, 100 * TOL_DP);
        }
    }
    ch_module_free(one);
    ch_module_free(many);
    ch_module_free(local);
    dp_free(&d);
    fixture_close(&f);
}

/* ---- The module tree and its errors -------------------------------------------- */

static int has_param(const ch_module *m, const char *want)
{
    for (int i = 0; i < ch_module_param_count(m); i++) {
        const char *name;
        ch_module_param(m, i, &name, NULL, NULL);
        if (strcmp(name, want) == 0)
            return 1;
    }
    return 0;
}

static void preset_names(void)
{
    ch_module *r = NULL, *g = NULL;
    if (tap_status_ok(ch_nn_preset(&r, "resnet"), "the resnet preset (depth %d)",
                      CH_RESNET_DEPTH)) {
        int n = (CH_RESNET_DEPTH - 2) / 6, convs = 1 + 6 * n + 2, bns = convs;
        tap_ok(ch_module_param_count(r) == convs + 2 * bns + 2,
               "resnet-%d has %d parameters (%d convolutions without bias, %d BatchNorms, fc), "
               "got %d", CH_RESNET_DEPTH, convs + 2 * bns + 2, convs, bns,
               ch_module_param_count(r));
        tap_ok(ch_module_buffer_count(r) == 3 * bns, "resnet-%d has 3 buffers per BatchNorm "
               "(%d), got %d", CH_RESNET_DEPTH, 3 * bns, ch_module_buffer_count(r));
        static const char *const want[] = {"conv1.weight", "bn1.bias", "layer1.0.conv1.weight",
                                           "layer2.0.downsample.0.weight",
                                           "layer3.0.downsample.1.weight", "fc.bias"};
        for (size_t i = 0; i < sizeof want / sizeof *want; i++)
            tap_ok(has_param(r, want[i]), "resnet names a parameter %s, as torchvision does",
                   want[i]);
        tap_ok(!has_param(r, "conv1.bias"), "resnet's convolutions have no bias");
    }
    if (tap_status_ok(ch_nn_preset(&g, "gpt"), "the gpt preset")) {
        static const char *const want[] = {"transformer.wte.weight", "transformer.wpe.weight",
                                           "transformer.h.0.ln_1.weight",
                                           "transformer.h.0.attn.c_attn.bias",
                                           "transformer.h.3.mlp.c_proj.weight",
                                           "transformer.ln_f.bias"};
        for (size_t i = 0; i < sizeof want / sizeof *want; i++)
            tap_ok(has_param(g, want[i]), "gpt names a parameter %s, as nanoGPT does", want[i]);
        tap_ok(!has_param(g, "lm_head.weight") && ch_module_param_count(g) == 2 + 4 * 12 + 2,
               "gpt holds the tied output weight once, as transformer.wte.weight (%d "
               "parameters, want %d)", ch_module_param_count(g), 2 + 4 * 12 + 2);
    }
    ch_module_free(r);
    ch_module_free(g);
}

static void construction_errors(void)
{
    ch_module *m = (ch_module *)1, *c = NULL;
    tap_status_is(ch_nn_resnet(&m, 9, 16, 1, 10), CH_ERR_INVALID_ARGUMENT, "6n + 2",
                  "ch_nn_resnet refuses depth 9");
    tap_ok(m == NULL, "a refused ch_nn_resnet leaves *out NULL");
    ch_gpt_config gc = ch_gpt_defaults();
    gc.heads = 3;
    tap_status_is(ch_nn_gpt(&m, &gc), CH_ERR_INVALID_ARGUMENT, "dividing",
                  "ch_nn_gpt refuses 3 heads for dim 128");
    tap_status_is(ch_nn_gpt(&m, NULL), CH_ERR_INVALID_ARGUMENT, "NULL", "ch_nn_gpt(NULL config)");
    tap_status_is(ch_nn_causal_self_attention(&m, 10, 4, 0.0f), CH_ERR_INVALID_ARGUMENT,
                  "dividing", "attention refuses 4 heads for dim 10");
    tap_status_is(ch_nn_batchnorm2d(&m, 4, 0.0f, 0.1f), CH_ERR_INVALID_ARGUMENT, "eps",
                  "BatchNorm2d refuses eps 0");
    tap_status_is(ch_nn_batchnorm2d(&m, 4, 1e-5f, 1.5f), CH_ERR_INVALID_ARGUMENT, "momentum",
                  "BatchNorm2d refuses momentum 1.5");
    tap_status_is(ch_nn_layernorm(&m, 0, 1e-5f), CH_ERR_INVALID_ARGUMENT, "features",
                  "LayerNorm refuses 0 features");
    tap_status_is(ch_nn_embedding(&m, 0, 4), CH_ERR_INVALID_ARGUMENT, "rows",
                  "Embedding refuses 0 rows");
    tap_status_is(ch_nn_residual(&m, NULL, NULL), CH_ERR_INVALID_ARGUMENT, "main_branch",
                  "ch_nn_residual refuses a NULL main branch");
    ch_module *seq = NULL;
    if (tap_status_ok(ch_nn_sequential(&seq), "a Sequential")) {
        ch_nn_flatten(&c);
        tap_status_is(ch_nn_sequential_add_named(seq, "a.b", c), CH_ERR_INVALID_ARGUMENT, "dot",
                      "a child name with a dot is refused");
        ch_nn_linear(&c, 2, 3);
        tap_status_ok(ch_nn_sequential_add_named(seq, "proj", c), "a named child");
        tap_status_is(ch_module_set_name(c, "x.y"), CH_ERR_INVALID_ARGUMENT, "dot",
                      "ch_module_set_name refuses a dot");
        const char *name = NULL;
        ch_module_param(seq, 0, &name, NULL, NULL);
        tap_ok(name && strcmp(name, "proj.weight") == 0, "the child's weight is \"proj.weight\", "
               "got \"%s\"", name ? name : "(null)");
        tap_status_ok(ch_module_set_name(c, "out"), "renaming the child");
        ch_module_param(seq, 0, &name, NULL, NULL);
        tap_ok(name && strcmp(name, "out.weight") == 0, "after the rename it is \"out.weight\", "
               "got \"%s\"", name ? name : "(null)");
        tap_status_is(ch_nn_sequential_add(seq, c), CH_ERR_INVALID_ARGUMENT, "already",
                      "a child cannot be added twice");
    }
    ch_module_free(seq);
}

static void forward_errors(void)
{
    ch_device *host = NULL;
    ch_device_by_name(&host, "host");
    ch_gpt_config gc = {1, 2, 8, 4, 16, 0.0f};
    ch_module *g = NULL, *bn = NULL, *ln = NULL;
    ch_tensor *tok = NULL, *img = NULL, *y = NULL;
    int64_t ts[2] = {1, 5}, is[4] = {2, 3, 2, 2};
    if (!tap_status_ok(ch_nn_gpt(&g, &gc), "a tiny gpt") ||
        !tap_status_ok(ch_tensor_new(&tok, host, CH_I32, 2, ts), "tokens [1, 5]"))
        goto out;
    int32_t ids[5] = {1, 2, 3, 4, 5};
    ch_tensor_upload(tok, ids, sizeof ids);
    tap_status_is(ch_module_forward(g, &y, tok), CH_ERR_SHAPE, "context",
                  "5 tokens into a gpt of context 4");
    ch_tensor *four = NULL;
    ch_tensor_view(&four, tok, 0, 1);
    ch_tensor_free(four);
    int64_t t4[2] = {1, 4};
    ch_tensor_free(tok);
    tok = NULL;
    ch_tensor_new(&tok, host, CH_I32, 2, t4);
    int32_t bad[4] = {1, 2, 16, 3};
    ch_tensor_upload(tok, bad, sizeof bad);
    tap_status_is(ch_module_forward(g, &y, tok), CH_ERR_INVALID_ARGUMENT, "16",
                  "token 16 into a gpt of vocabulary 16");
    ch_tensor_new(&img, host, CH_F32, 4, is);
    ch_fill(img, 1.0);
    tap_status_is(ch_module_forward(g, &y, img), CH_ERR_DTYPE, "i32",
                  "f32 inputs into a gpt");
    if (tap_status_ok(ch_nn_batchnorm2d(&bn, 3, 1e-5f, 0.1f), "a BatchNorm2d(3)")) {
        ch_module_train(bn, 0);
        tap_status_ok(ch_module_forward(bn, &y, img), "BatchNorm2d forward in evaluation mode");
        tap_status_is(ch_module_backward(bn, NULL, y), CH_ERR_STATE, "training",
                      "BatchNorm2d backward after an evaluation-mode forward");
    }
    if (tap_status_ok(ch_nn_layernorm(&ln, 3, 1e-5f), "a LayerNorm(3)"))
        tap_status_is(ch_module_forward(ln, &y, img), CH_ERR_SHAPE, "last dimension",
                      "LayerNorm(3) on [2, 3, 2, 2]");
out:
    ch_tensor_free(tok);
    ch_tensor_free(img);
    ch_module_free(g);
    ch_module_free(bn);
    ch_module_free(ln);
}

/* A resnet's checkpoint holds its buffers (num_batches_tracked as an I64
 * scalar, as PyTorch saves it) and gives them back. */
static void checkpoint_buffers(void)
{
    ch_device *host = NULL;
    ch_device_by_name(&host, "host");
    char path[] = "/tmp/chorus-test-models-XXXXXX";
    int fd = mkstemp(path);
    if (!tap_ok(fd >= 0, "a temporary file"))
        return;
    close(fd);
    ch_module *a = NULL, *b = NULL;
    ch_tensor *x = NULL, *y = NULL;
    int64_t xs[4] = {4, 1, 8, 8};
    ch_status st = ch_nn_resnet(&a, 8, 2, 1, 3);
    if (st == CH_OK)
        st = ch_module_init(a, 1);
    if (st == CH_OK)
        st = ch_tensor_new(&x, host, CH_F32, 4, xs);
    if (st == CH_OK)
        st = ch_rand_normal(x, 3, 0, 0.5f, 2.0f);
    for (int i = 0; st == CH_OK && i < 2; i++)
        st = ch_module_forward(a, &y, x);
    if (st == CH_OK)
        st = ch_checkpoint_save(path, a, NULL, NULL);
    if (st == CH_OK)
        st = ch_nn_resnet(&b, 8, 2, 1, 3);
    if (st == CH_OK)
        st = ch_checkpoint_load(path, b, NULL, NULL);
    if (tap_status_ok(st, "a resnet after two training forwards saved and loaded")) {
        char where[256] = "";
        double e = model_diff(b, a, where, sizeof where);
        int64_t *ca = NULL, *cb = NULL;
        ch_module_buffer(a, 2, NULL, NULL, &ca);
        ch_module_buffer(b, 2, NULL, NULL, &cb);
        tap_ok(e == 0.0 && ca && cb && *ca == 2 && *cb == 2, "parameters, running statistics "
               "and num_batches_tracked come back (difference %g in %s; counter %lld, want 2)",
               e, where, cb ? (long long)*cb : -1LL);
    }
    /* The counter saved as F32 instead: refused by name. */
    FILE *fp = fopen(path, "r+b");
    char head[4096] = "";
    size_t got = fp ? fread(head, 1, sizeof head - 1, fp) : 0;
    char *i64 = got > 8 ? strstr(head + 8, "\"I64\"") : NULL;
    if (tap_ok(fp && i64, "the checkpoint's header names an I64 counter")) {
        memcpy(i64, "\"F32\"", 5);
        fseek(fp, 0, SEEK_SET);
        fwrite(head, 1, got, fp);
    }
    if (fp)
        fclose(fp);
    tap_status_is(ch_checkpoint_load(path, b, NULL, NULL), CH_ERR_FORMAT, "I64",
                  "a num_batches_tracked that is not an I64 scalar is refused");
    remove(path);
    ch_tensor_free(x);
    ch_module_free(a);
    ch_module_free(b);
}

int main(void)
{
    if (ch_init() != CH_OK)
        tap_skip_all("ch_init: %s", ch_last_error());
    ch_device *devs[MAX_DEVICES];
    int n = tap_devices(devs, MAX_DEVICES);
    preset_names();
    construction_errors();
    forward_errors();
    checkpoint_buffers();
    fixture_tests("gpt-tiny.safetensors", devs, n);
    fixture_tests("resnet-tiny.safetensors", devs, n);
    dp_tests("gpt-tiny.safetensors");
    dp_tests("resnet-tiny.safetensors");
    ch_shutdown();
    return tap_done();
}
