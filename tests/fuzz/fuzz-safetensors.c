/* The safetensors checkpoint loader, ch_checkpoint_load (nn/checkpoint.c):
 * the header length, the JSON header (names, dtypes, shapes, data offsets,
 * the metadata of the training state), the tensors.
 *
 * Input: the file. It is loaded twice: into a small CNN on the host with
 * BatchNorm (buffers and a counter) and an AdamW optimizer and a training
 * state, and into the model alone.
 *
 * Checked: a failure has a message and changes nothing (parameters,
 * buffers, the optimizer's state and step count), and the model still runs
 * forward; a success gives a sane training state (counts >= 0, a finite
 * normalisation with std > 0 or none, a loss scale >= 0), and saving what
 * was loaded and loading that into a fresh model gives the same values
 * bit for bit and the same state.
 *
 * FUZZ_WRITE_SEEDS=DIR: write the seed corpus (valid checkpoints of this
 * model: f32, bf16 and f16, with and without optimizer and state) to DIR
 * first. */
#include "config.h"

#include <chorus.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

static ch_device *host;
static char path[4096], copy_path[4096];

static ch_module *new_model(void)
{
    ch_module *seq = NULL, *m[5] = {NULL};
    FUZZ_CHECK(ch_nn_sequential(&seq) == CH_OK && ch_nn_conv2d(&m[0], 1, 2, 3, 1, 1) == CH_OK &&
                   ch_nn_batchnorm2d(&m[1], 2, 1e-5f, 0.1f) == CH_OK &&
                   ch_nn_activation(&m[2], CH_ACT_RELU) == CH_OK &&
                   ch_nn_flatten(&m[3]) == CH_OK && ch_nn_linear(&m[4], 2 * 3 * 3, 2) == CH_OK,
               "building the model: %s", ch_last_error());
    for (int i = 0; i < 5; i++)
        FUZZ_CHECK(ch_nn_sequential_add(seq, m[i]) == CH_OK, "%s", ch_last_error());
    FUZZ_CHECK(ch_module_init(seq, 1) == CH_OK && ch_module_to(seq, host) == CH_OK, "%s",
               ch_last_error());
    return seq;
}

static ch_optimizer *new_optimizer(ch_module *m)
{
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, 0.01f);
    ch_optimizer *opt = NULL;
    FUZZ_CHECK(ch_optimizer_new(&opt, m, &o) == CH_OK, "%s", ch_last_error());
    return opt;
}

/* Everything a load may change, as bytes. */
typedef struct blob {
    uint8_t *v;
    size_t n;
} blob;

static void add(blob *b, const void *p, size_t n)
{
    b->v = realloc(b->v, b->n + n);
    FUZZ_CHECK(b->v != NULL, "out of memory");
    memcpy(b->v + b->n, p, n);
    b->n += n;
}

static void add_tensor(blob *b, const ch_tensor *t)
{
    int present = t != NULL;
    add(b, &present, sizeof present);
    if (!t)
        return;
    size_t n = ch_tensor_nbytes(t);
    uint8_t *v = malloc(n);
    FUZZ_CHECK(v && ch_tensor_download(t, v, n) == CH_OK, "download: %s", ch_last_error());
    add(b, v, n);
    free(v);
}

static blob snapshot(const ch_module *m, const ch_optimizer *opt)
{
    blob b = {0};
    for (int i = 0; i < ch_module_param_count(m); i++) {
        ch_tensor *t;
        ch_module_param(m, i, NULL, &t, NULL);
        add_tensor(&b, t);
    }
    for (int i = 0; i < ch_module_buffer_count(m); i++) {
        ch_tensor *t;
        int64_t *counter;
        ch_module_buffer(m, i, NULL, &t, &counter);
        if (t)
            add_tensor(&b, t);
        else
            add(&b, counter, sizeof *counter);
    }
    for (int i = 0; opt && i < ch_optimizer_state_count(opt); i++) {
        ch_tensor *t = NULL;
        ch_optimizer_state(opt, i, NULL, &t);
        add_tensor(&b, t);
    }
    int64_t steps = opt ? ch_optimizer_steps(opt) : -1;
    add(&b, &steps, sizeof steps);
    return b;
}

static int same(const blob *a, const blob *b)
{
    return a->n == b->n && memcmp(a->v, b->v, a->n) == 0;
}

/* The model runs forward in both modes. */
static void check_forward(ch_module *m)
{
    static const float x[9] = {0.1f, -0.2f, 0.3f, 0.4f, 0.5f, -0.6f, 0.7f, 0.8f, 0.9f};
    int64_t shape[4] = {1, 1, 3, 3};
    ch_tensor *in = NULL, *out = NULL;
    FUZZ_CHECK(ch_tensor_new(&in, host, CH_F32, 4, shape) == CH_OK &&
                   ch_tensor_upload(in, x, sizeof x) == CH_OK,
               "%s", ch_last_error());
    for (int training = 0; training < 2; training++) {
        ch_module_train(m, training);
        FUZZ_CHECK(ch_module_forward(m, &out, in) == CH_OK, "forward: %s", ch_last_error());
        FUZZ_CHECK(ch_tensor_ndim(out) == 2 && ch_tensor_dim(out, 0) == 1 &&
                       ch_tensor_dim(out, 1) == 2,
                   "the output's shape"); /* out belongs to the module */
    }
    ch_tensor_free(in);
}

static void write_seeds(const char *dir)
{
    ch_module *m = new_model();
    ch_optimizer *opt = new_optimizer(m);
    /* One step, so that the optimizer has its moments. */
    int64_t shape[4] = {2, 1, 3, 3};
    ch_tensor *x = NULL, *y = NULL, *dy = NULL, *dx = NULL;
    float v[18];
    for (int i = 0; i < 18; i++)
        v[i] = (float)(i % 5) * 0.25f - 0.5f;
    ch_module_train(m, 1);
    FUZZ_CHECK(ch_tensor_new(&x, host, CH_F32, 4, shape) == CH_OK &&
                   ch_tensor_upload(x, v, sizeof v) == CH_OK &&
                   ch_module_forward(m, &y, x) == CH_OK,
               "%s", ch_last_error());
    int64_t yshape[2] = {2, 2};
    FUZZ_CHECK(ch_tensor_new(&dy, host, CH_F32, 2, yshape) == CH_OK &&
                   ch_tensor_upload(dy, v, 4 * sizeof(float)) == CH_OK &&
                   ch_module_zero_grad(m) == CH_OK && ch_module_backward(m, &dx, dy) == CH_OK &&
                   ch_optimizer_step(opt, 0.01f) == CH_OK,
               "%s", ch_last_error());
    ch_tensor_free(x); /* y and dx belong to the module */
    ch_tensor_free(dy);
    ch_train_state st = {3, 7, 42, 1234, 0.2860f, 0.3530f, 65536.0f, 17};
    static const struct {
        const char *name;
        ch_dtype dtype;
        int opt, state;
    } seeds[] = {{"seed-f32-adamw-state", CH_F32, 1, 1}, {"seed-bf16-adamw-state", CH_BF16, 1, 1},
                 {"seed-f16-adamw", CH_F16, 1, 0},       {"seed-f32-model", CH_F32, 0, 0},
                 {"seed-f32-model-state", CH_F32, 0, 1}};
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char p[8192];
        snprintf(p, sizeof p, "%s/%s", dir, seeds[i].name);
        FUZZ_CHECK(ch_checkpoint_save_as(p, m, seeds[i].opt ? opt : NULL,
                                         seeds[i].state ? &st : NULL, seeds[i].dtype) == CH_OK,
                   "%s", ch_last_error());
    }
    ch_optimizer_free(opt);
    ch_module_free(m);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("OMP_NUM_THREADS", "1", 0);
    unsetenv("CHORUS_DEVICES");
    unsetenv("CHORUS_BACKEND_PATH");
    if (ch_init() != CH_OK || ch_device_by_name(&host, "host") != CH_OK)
        fuzz_fail(__FILE__, __LINE__, "ch_init", "%s", ch_last_error());
    fuzz_path(path, sizeof path, "in.safetensors");
    fuzz_path(copy_path, sizeof copy_path, "copy.safetensors");
    const char *seeds = getenv("FUZZ_WRITE_SEEDS");
    if (seeds && *seeds)
        write_seeds(seeds);
    return 0;
}

static void check_state(const ch_train_state *s)
{
    FUZZ_CHECK(s->epoch >= 0 && s->batch >= 0 && s->step >= 0, "epoch %lld, batch %lld, step %lld",
               (long long)s->epoch, (long long)s->batch, (long long)s->step);
    FUZZ_CHECK((s->input_mean == 0.0f && s->input_std == 0.0f) ||
                   (isfinite(s->input_mean) && isfinite(s->input_std) && s->input_std > 0.0f),
               "normalisation %g, %g", s->input_mean, s->input_std);
    FUZZ_CHECK(isfinite(s->loss_scale) && s->loss_scale >= 0.0f && s->loss_scale_clean >= 0,
               "loss scale %g, %lld clean steps", s->loss_scale, (long long)s->loss_scale_clean);
}

/* Saved and loaded again into a fresh model: the same. */
static void check_round_trip(const ch_module *m, const ch_optimizer *opt,
                             const ch_train_state *s)
{
    FUZZ_CHECK(ch_checkpoint_save(copy_path, m, opt, s) == CH_OK, "saving what was loaded: %s",
               ch_last_error());
    ch_module *m2 = new_model();
    ch_optimizer *opt2 = opt ? new_optimizer(m2) : NULL;
    ch_train_state s2;
    memset(&s2, 0xa5, sizeof s2);
    FUZZ_CHECK(ch_checkpoint_load(copy_path, m2, opt2, s ? &s2 : NULL) == CH_OK,
               "loading what was saved: %s", ch_last_error());
    blob a = snapshot(m, opt), b = snapshot(m2, opt2);
    FUZZ_CHECK(same(&a, &b), "a checkpoint saved from what was loaded loads differently");
    if (s)
        FUZZ_CHECK(s2.epoch == s->epoch && s2.batch == s->batch && s2.step == s->step &&
                       s2.seed == s->seed &&
                       memcmp(&s2.input_mean, &s->input_mean, sizeof(float)) == 0 &&
                       memcmp(&s2.input_std, &s->input_std, sizeof(float)) == 0 &&
                       (s->loss_scale > 0.0f ? memcmp(&s2.loss_scale, &s->loss_scale,
                                                      sizeof(float)) == 0 &&
                                                   s2.loss_scale_clean == s->loss_scale_clean
                                             : s2.loss_scale == 0.0f),
                   "the training state differs after saving and loading it");
    free(a.v);
    free(b.v);
    ch_optimizer_free(opt2);
    ch_module_free(m2);
}

static void load(int with_opt)
{
    ch_module *m = new_model();
    ch_optimizer *opt = with_opt ? new_optimizer(m) : NULL;
    ch_train_state s;
    memset(&s, 0xa5, sizeof s);
    blob before = snapshot(m, opt);
    ch_status st = ch_checkpoint_load(path, m, opt, with_opt ? &s : NULL);
    if (st != CH_OK) {
        fuzz_check_error("ch_checkpoint_load");
        blob after = snapshot(m, opt);
        FUZZ_CHECK(same(&before, &after), "a failed load (%s) changed the model or the "
                   "optimizer", ch_last_error());
        free(after.v);
    } else {
        if (with_opt)
            check_state(&s);
        check_round_trip(m, opt, with_opt ? &s : NULL);
    }
    check_forward(m);
    free(before.v);
    ch_optimizer_free(opt);
    ch_module_free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_write(path, data, size, 0);
    load(1);
    load(0);
    return 0;
}
