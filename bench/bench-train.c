/* bench-train: training samples/s of the mlp, the cnn, the resnet and the
 * gpt (tokens/s too) on each device, and, on the host, the share of the
 * step spent in GEMM (mlp, cnn, gpt): the rate the step's GEMMs alone would
 * allow at the host GEMM library's speed (the same shapes as the host runs
 * them, timed with oneDNN's or OpenBLAS's sgemm in the same run: the convolutions one sample at a time
 * and attention's small matrices shared out among the threads, each GEMM on
 * one) against the measured rate. With --precision the same GEMMs with
 * half inputs and f32 outputs (oneDNN's matmul, as the host's gemm_half
 * runs them), for the mlp and the gpt.
 *
 * The data are random images or tokens in device memory: this measures the
 * training step (forward, loss, backward, optimizer), not the loader. Each
 * row also gives the device's peak memory over the model's run (from
 * ch_device_reset_peak before the model is made: its parameters, optimizer
 * state, batch, activations, gradients and the backend's workspace).
 *
 * --recompute runs each model twice, without and with recomputed
 * activations (ch_module_set_recompute), their steps interleaved, and
 * gives the device's peak memory for each.
 *
 * The gpt's rows give its model FLOP rate and MFU as llm.c counts them:
 * 6 N + 6 L C T FLOP per token (N every parameter, the tied embedding
 * once; L layers, C width, T context) against the device's listed peak
 * for the step's arithmetic (bf16 dense tensor, TF32 dense tensor or
 * plain f32; a table keyed by the device's name, the same as
 * docs/pytorch/bench_train.py's). Every row gives how many ops ran on the
 * host for its device so far (ch_fallback_get): on a GPU a nonzero count
 * means part of the step left the device.
 *
 * --tf32 lets f32 GEMMs use TF32 (ch_math_set(CH_MATH_TF32)); without it
 * the mode is set to CH_MATH_DEFAULT, whatever CHORUS_TF32 says, as
 * bench_train.py sets PyTorch's allow_tf32 both ways.
 *
 * --attention-only times the fused causal attention alone instead of
 * training: ch_attention_packed_mixed and its backward on qkv [batch,
 * context, 3 dim] with --heads heads, in --precision's products. */
#include "config.h"

#include <chorus.h>

#include "bench.h"
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "refgemm.h"

/* The models' shapes: the resnet's depth, the gpt's configuration. */
typedef struct shapes {
    int depth;
    ch_gpt_config gpt;
} shapes;

static void make_model(ch_module **m, const char *model, const shapes *sh)
{
    if (strcmp(model, "resnet") == 0)
        BENCH_CHECK(ch_nn_resnet(m, sh->depth, 16, 1, 10));
    else if (strcmp(model, "gpt") == 0)
        BENCH_CHECK(ch_nn_gpt(m, &sh->gpt));
    else
        BENCH_CHECK(ch_nn_preset(m, model));
}

/* A batch of random images (or token windows) and labels on dev. */
static void make_batch(ch_tensor **x, ch_tensor **labels, ch_device *dev, const char *model,
                       int batch, const shapes *sh)
{
    int gpt = strcmp(model, "gpt") == 0;
    int64_t ctx = sh->gpt.context, xs[4] = {batch, 1, 28, 28};
    int64_t rows = gpt ? batch * ctx : batch, classes = gpt ? sh->gpt.vocab : 10;
    if (gpt) {
        int64_t ts[2] = {batch, ctx};
        BENCH_CHECK(ch_tensor_new(x, dev, CH_I32, 2, ts));
    } else {
        BENCH_CHECK(ch_tensor_new(x, dev, CH_F32, 4, xs));
        BENCH_CHECK(ch_rand_normal(*x, 7, 0, 0.0f, 1.0f));
    }
    BENCH_CHECK(ch_tensor_new(labels, dev, CH_I32, 1, &rows));
    int32_t *lab = malloc(sizeof *lab * (size_t)rows);
    if (!lab) {
        fprintf(stderr, "bench-train: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < rows; i++)
        lab[i] = (int32_t)((i * 7919) % classes);
    BENCH_CHECK(ch_tensor_upload(*labels, lab, sizeof *lab * (size_t)rows));
    if (gpt)
        BENCH_CHECK(ch_tensor_upload(*x, lab, sizeof *lab * (size_t)rows));
    free(lab);
}

/* --precision: mixed precision's format for every model (CH_F32: off). */
static ch_dtype precision = CH_F32;
/* --optimizer: Adam (the default) or AdamW (weight decay 0.01, PyTorch's
 * default). */
static ch_optimizer_kind optimizer = CH_OPT_ADAM;
/* --unfused: the step as it ran before its fusions, for before-and-after
 * rows in one run: the loss's forward and backward apart (probabilities
 * and gradient in tensors of their own), Adam a call per parameter. */
static int unfused = 0;

/* A model on dev with its loss and Adam. */
typedef struct trainer {
    ch_module *m;
    ch_loss *loss;
    ch_optimizer *opt;
} trainer;

static void trainer_new(trainer *t, const char *model, const shapes *sh, ch_device *dev,
                        int recompute)
{
    *t = (trainer){NULL, NULL, NULL};
    make_model(&t->m, model, sh);
    BENCH_CHECK(ch_module_init(t->m, 1));
    BENCH_CHECK(ch_module_set_precision(t->m, precision));
    BENCH_CHECK(ch_module_set_recompute(t->m, recompute));
    BENCH_CHECK(ch_module_to(t->m, dev));
    BENCH_CHECK(ch_loss_new(&t->loss, CH_LOSS_CROSS_ENTROPY));
    ch_optimizer_options oo = ch_optimizer_defaults(optimizer, 1e-3f);
    BENCH_CHECK(ch_optimizer_new(&t->opt, t->m, &oo));
    BENCH_CHECK(ch_optimizer_set_one_by_one(t->opt, unfused));
}

static void trainer_free(trainer *t)
{
    ch_optimizer_free(t->opt);
    ch_loss_free(t->loss);
    ch_module_free(t->m);
}

/* One training step, the device synchronised after it: its seconds. */
static double trainer_step(trainer *t, ch_device *dev, const ch_tensor *x, const ch_tensor *labels)
{
    ch_tensor *y, *lv, *dy;
    double t0 = ch_clock_seconds();
    BENCH_CHECK(ch_module_zero_grad(t->m));
    BENCH_CHECK(ch_module_forward(t->m, &y, x));
    /* The loss's gradient in the logits' place (every model here ends in
     * a Linear or the GPT's output layer, whose backward does not read
     * its output), as ch_dp does. */
    if (unfused) {
        BENCH_CHECK(ch_loss_forward(t->loss, &lv, y, labels));
        BENCH_CHECK(ch_loss_backward(t->loss, &dy, 1.0f));
    } else {
        BENCH_CHECK(ch_loss_forward_backward(t->loss, &lv, &dy, y, labels, 1.0f));
    }
    BENCH_CHECK(ch_module_backward(t->m, NULL, dy));
    BENCH_CHECK(ch_optimizer_step(t->opt, 1e-3f));
    BENCH_CHECK(ch_device_sync(dev));
    return ch_clock_seconds() - t0;
}

/* Median of `steps` timed training steps of `model` on `dev` after warm-up:
 * samples per second; *peak: the device's peak bytes in use meanwhile;
 * *params: the model's parameter count (a tied tensor once). */
/* Where the device counts its work (ch_device_counters: CUDA): what one
 * step launches, and the share of three steps' time inside their GEMMs,
 * each between two events (timed apart from the rate). -1 elsewhere. */
typedef struct step_counts {
    double launches, gemms, gemm_share;
} step_counts;

static void count_step(trainer *t, ch_device *dev, const ch_tensor *x, const ch_tensor *labels,
                       step_counts *c)
{
    *c = (step_counts){-1, -1, -1};
    if (ch_device_counters_start(dev, 0) != CH_OK) {
        ch_clear_error(); /* the device does not count */
        return;
    }
    ch_device_counters k;
    trainer_step(t, dev, x, labels);
    BENCH_CHECK(ch_device_counters_read(dev, &k));
    c->launches = (double)k.launches;
    c->gemms = (double)k.gemms;
    BENCH_CHECK(ch_device_counters_start(dev, 1));
    double wall = 0;
    for (int i = 0; i < 3; i++)
        wall += trainer_step(t, dev, x, labels);
    BENCH_CHECK(ch_device_counters_read(dev, &k));
    c->gemm_share = k.gemm_seconds >= 0 ? k.gemm_seconds / wall : -1;
}

static double train_rate(const char *model, const shapes *sh, ch_device *dev, int batch, int steps,
                         uint64_t *peak, int64_t *params, step_counts *counts)
{
    BENCH_CHECK(ch_device_sync(dev));
    BENCH_CHECK(ch_device_reset_peak(dev));
    trainer t;
    trainer_new(&t, model, sh, dev, 0);
    *params = ch_module_param_numel(t.m);
    ch_tensor *x = NULL, *labels = NULL;
    make_batch(&x, &labels, dev, model, batch, sh);
    double *times = malloc(sizeof *times * (size_t)steps);
    if (!times) {
        fprintf(stderr, "bench-train: out of memory\n");
        exit(1);
    }
    for (int s = -3; s < steps; s++) {
        double dt = trainer_step(&t, dev, x, labels);
        if (s >= 0)
            times[s] = dt;
    }
    double median = bench_median(times, steps);
    free(times);
    ch_memory_stats ms;
    BENCH_CHECK(ch_device_memory_stats(dev, &ms));
    *peak = ms.peak_bytes;
    count_step(&t, dev, x, labels, counts);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    trainer_free(&t);
    return batch / median;
}

/* --recompute: index 0 without recomputed activations, 1 with. */
typedef struct recompute_result {
    double rate[2];     /* samples per second */
    double peak_mib[2]; /* the device's peak memory less what was in use before the model */
    int upper_bound[2]; /* the run did not raise the device's peak: at most that */
} recompute_result;

/* The model without and with recomputation on dev. Memory first: each
 * model made and its first step run (which makes every tensor of
 * training: parameters, gradients, Adam's moments, activations), the
 * recomputing one first, so that the other's higher peak raises the
 * device's and measures its own. Then `steps` timed steps of each, the
 * two alternating (which goes first swapped every step), after three
 * more warm-up steps each. */
static void compare_recompute(recompute_result *r, const char *model, const shapes *sh,
                              ch_device *dev, int batch, int steps)
{
    trainer t[2];
    ch_tensor *x = NULL, *labels = NULL;
    make_batch(&x, &labels, dev, model, batch, sh);
    for (int k = 1; k >= 0; k--) {
        ch_memory_stats before, after;
        BENCH_CHECK(ch_device_memory_stats(dev, &before));
        trainer_new(&t[k], model, sh, dev, k);
        trainer_step(&t[k], dev, x, labels);
        BENCH_CHECK(ch_device_memory_stats(dev, &after));
        r->peak_mib[k] = (double)(after.peak_bytes - before.in_use_bytes) / 1048576.0;
        r->upper_bound[k] = after.peak_bytes <= before.peak_bytes;
    }
    double *times = malloc(sizeof *times * 2 * (size_t)steps);
    if (!times) {
        fprintf(stderr, "bench-train: out of memory\n");
        exit(1);
    }
    for (int s = -3; s < steps; s++)
        for (int j = 0; j < 2; j++) {
            int k = (j + s + 3) % 2;
            double dt = trainer_step(&t[k], dev, x, labels);
            if (s >= 0)
                times[k * steps + s] = dt;
        }
    for (int k = 0; k < 2; k++)
        r->rate[k] = batch / bench_median(times + k * steps, steps);
    free(times);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    trainer_free(&t[0]);
    trainer_free(&t[1]);
}

#ifdef HAVE_REF_GEMM
/* One GEMM of a training step, row-major: C[M,N] = op(A) op(B) (+ C). */
typedef struct gemm_shape {
    int ta, tb, m, n, k, accumulate;
    int count; /* 0 or 1: one GEMM; more: a batched GEMM of count matrices */
    int per_thread; /* the count matrices shared out among the threads */
} gemm_shape;

#define MAX_GEMMS 512

/* A Linear layer's GEMMs: forward y = x W^T, backward dW += dy^T x and,
 * unless it is the first layer with parameters, dx = dy W. */
static int linear_gemms(gemm_shape *g, int batch, int in, int out, int want_dx)
{
    int n = 0;
    g[n++] = (gemm_shape){0, 1, batch, out, in, 0, 0, 0};
    g[n++] = (gemm_shape){1, 0, out, in, batch, 1, 0, 0};
    if (want_dx)
        g[n++] = (gemm_shape){0, 0, batch, in, out, 0, 0, 0};
    return n;
}

/* A convolution with `ckk` = C*kh*kw inputs per output over `pixels`
 * output positions per sample as the host's ch_conv2d runs it, one sample
 * at a time: forward y = W col, backward dW += dy col^T and, unless it is
 * the first layer, dcol = W^T dy, each `batch` times (per_thread: shared
 * out among the threads, each GEMM on one, as the host does). */
static int conv_gemms(gemm_shape *g, int batch, int ckk, int out, int pixels, int want_dx)
{
    int n = 0;
    g[n++] = (gemm_shape){0, 0, out, pixels, ckk, 0, batch, 1};
    g[n++] = (gemm_shape){0, 1, out, ckk, pixels, 1, batch, 1};
    if (want_dx)
        g[n++] = (gemm_shape){1, 0, ckk, pixels, out, 0, batch, 1};
    return n;
}

/* The GEMMs of one training step of the preset `model`, read off the
 * model itself: its layers run one by one on the host, each Linear and
 * Conv2d giving its shapes (a convolution's output plane from its output). */
/* The gpt's, from its configuration: per block the four Linear layers
 * (c_attn, c_proj, c_fc, the MLP's c_proj) and the attention's batched
 * GEMMs (q k^T, a v; backward dA, dv, dq, dk over batch * heads matrices),
 * and the tied output (logits, its weight's gradient, dh). */
static int gpt_gemms(gemm_shape *g, const ch_gpt_config *c, int batch)
{
    int r = batch * (int)c->context, d = (int)c->dim, t = (int)c->context, v = (int)c->vocab;
    int bh = batch * c->heads, hd = d / c->heads, n = 0;
    if (c->layers * 18 + 3 > MAX_GEMMS) {
        fprintf(stderr, "bench-train: the gpt has more than %d GEMMs\n", MAX_GEMMS);
        exit(1);
    }
    for (int l = 0; l < c->layers; l++) {
        n += linear_gemms(g + n, r, d, 3 * d, 1);
        g[n++] = (gemm_shape){0, 1, t, t, hd, 0, bh, 1};
        g[n++] = (gemm_shape){0, 0, t, hd, t, 0, bh, 1};
        g[n++] = (gemm_shape){0, 1, t, t, hd, 0, bh, 1};
        g[n++] = (gemm_shape){1, 0, t, hd, t, 0, bh, 1};
        g[n++] = (gemm_shape){0, 0, t, hd, t, 0, bh, 1};
        g[n++] = (gemm_shape){1, 0, t, hd, t, 0, bh, 1};
        n += linear_gemms(g + n, r, d, d, 1);
        n += linear_gemms(g + n, r, d, 4 * d, 1);
        n += linear_gemms(g + n, r, 4 * d, d, 1);
    }
    g[n++] = (gemm_shape){0, 1, r, v, d, 0, 0, 0};
    g[n++] = (gemm_shape){1, 0, v, d, r, 1, 0, 0};
    g[n++] = (gemm_shape){0, 0, r, d, v, 0, 0, 0};
    return n;
}

static int step_gemms(gemm_shape *g, const char *model, int batch)
{
    ch_device *host;
    ch_module *m = NULL;
    ch_tensor *x = NULL;
    int64_t xs[4] = {batch, 1, 28, 28};
    BENCH_CHECK(ch_device_by_name(&host, "host"));
    BENCH_CHECK(ch_nn_preset(&m, model));
    BENCH_CHECK(ch_tensor_new(&x, host, CH_F32, 4, xs));
    BENCH_CHECK(ch_fill(x, 0.5));
    const ch_tensor *in = x;
    int n = 0, first = 1;
    for (int i = 0; i < ch_module_child_count(m); i++) {
        ch_module *c = ch_module_child(m, i);
        ch_tensor *y, *w;
        BENCH_CHECK(ch_module_forward(c, &y, in));
        in = y;
        if (ch_module_param_count(c) == 0)
            continue;
        if (n + 3 > MAX_GEMMS) {
            fprintf(stderr, "bench-train: %s has more than %d GEMMs\n", model, MAX_GEMMS);
            exit(1);
        }
        BENCH_CHECK(ch_module_param(c, 0, NULL, &w, NULL));
        int out = (int)ch_tensor_dim(w, 0), fan_in = (int)(ch_tensor_numel(w) / out);
        if (strcmp(ch_module_kind(c), "Conv2d") == 0)
            n += conv_gemms(g + n, batch, fan_in, out,
                            (int)(ch_tensor_dim(y, 2) * ch_tensor_dim(y, 3)), !first);
        else
            n += linear_gemms(g + n, batch, fan_in, out, !first);
        first = 0;
    }
    ch_tensor_free(x);
    ch_module_free(m);
    return n;
}

/* The b-th matrix of GEMM g, on its own operands. */
static void one_gemm(const gemm_shape *g, float *const buf[3], int b, int lda, int ldb,
                     size_t sa, size_t sb, size_t sc)
{
    ref_sgemm(g->ta, g->tb, g->m, g->n, g->k, 1.0f, buf[0] + b * sa, lda, buf[1] + b * sb, ldb,
              g->accumulate ? 1.0f : 0.0f, buf[2] + b * sc, g->n);
}

/* Seconds for a step's GEMMs at the GEMM library's speed: median of `reps` runs
 * of the whole set. */
static double gemm_seconds(const char *model, const shapes *sh, int batch, int reps)
{
    static gemm_shape g[MAX_GEMMS];
    int n = strcmp(model, "gpt") == 0 ? gpt_gemms(g, &sh->gpt, batch)
                                      : step_gemms(g, model, batch);
    /* Each GEMM gets operands of its own, as in the model (weights,
     * activations and gradients are different memory): one shared set would
     * stay in cache and flatter the bound. */
    static float *buf[MAX_GEMMS][3];
    for (int i = 0; i < n; i++) {
        size_t count = g[i].count > 1 ? (size_t)g[i].count : 1;
        size_t sizes[3] = {count * g[i].m * g[i].k, count * g[i].k * g[i].n,
                           count * g[i].m * g[i].n};
        for (int j = 0; j < 3; j++) {
            buf[i][j] = malloc(sizeof(float) * sizes[j]);
            if (!buf[i][j]) {
                fprintf(stderr, "bench-train: out of memory\n");
                exit(1);
            }
            for (size_t e = 0; e < sizes[j]; e++)
                buf[i][j][e] = 0.001f * (float)(e % 1000);
        }
    }
    double *t = malloc(sizeof *t * (size_t)reps);
    for (int r = -3; r < reps; r++) {
        double t0 = ch_clock_seconds();
        for (int i = 0; i < n; i++) {
            int lda = g[i].ta ? g[i].m : g[i].k, ldb = g[i].tb ? g[i].k : g[i].n;
            size_t sa = (size_t)g[i].m * g[i].k, sb = (size_t)g[i].k * g[i].n,
                   sc = (size_t)g[i].m * g[i].n;
            int count = g[i].count > 1 ? g[i].count : 1;
            /* Not one loop with an if clause: a GEMM library inside an inactive
             * region runs many times slower. */
            if (g[i].per_thread) {
#pragma omp parallel for schedule(static)
                for (int b = 0; b < count; b++)
                    one_gemm(&g[i], buf[i], b, lda, ldb, sa, sb, sc);
            } else {
                for (int b = 0; b < count; b++)
                    one_gemm(&g[i], buf[i], b, lda, ldb, sa, sb, sc);
            }
        }
        if (r >= 0)
            t[r] = ch_clock_seconds() - t0;
    }
    double median = bench_median(t, reps);
    free(t);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 3; j++)
            free(buf[i][j]);
    return median;
}
#endif

#ifdef HAVE_REF_GEMM_HALF
/* The same for mixed precision: the step's GEMMs with inputs in the half
 * format `dt` and f32 outputs, as the host's gemm_half runs them (oneDNN's
 * matmul; the attention's products one batched call each). -1 when oneDNN
 * does not take one of them. */
static double gemm_half_seconds(const char *model, const shapes *sh, int batch, int reps,
                                ch_dtype dt)
{
    static gemm_shape g[MAX_GEMMS];
    static ref_matmul mm[MAX_GEMMS];
    static void *buf[MAX_GEMMS][3];
    int n = strcmp(model, "gpt") == 0 ? gpt_gemms(g, &sh->gpt, batch) : step_gemms(g, model, batch);
    dnnl_engine_t eng;
    dnnl_stream_t st;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&st, eng, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "bench-train: oneDNN's engine or stream could not be made\n");
        exit(1);
    }
    int made = 0, ok = 1;
    for (; made < n && ok; made++) {
        size_t count = g[made].count > 1 ? (size_t)g[made].count : 1;
        size_t sizes[3] = {count * g[made].m * g[made].k, count * g[made].k * g[made].n,
                           count * g[made].m * g[made].n};
        for (int j = 0; j < 3; j++) {
            buf[made][j] = malloc((j < 2 ? sizeof(uint16_t) : sizeof(float)) * sizes[j]);
            if (!buf[made][j]) {
                fprintf(stderr, "bench-train: out of memory\n");
                exit(1);
            }
            /* Small finite values in both bf16 and f16 (0x3800: 2^-15 and 0.5). */
            for (size_t e = 0; e < sizes[j]; e++)
                if (j < 2)
                    ((uint16_t *)buf[made][j])[e] = (uint16_t)(0x3800 + e % 256);
                else
                    ((float *)buf[made][j])[e] = 0.0f;
        }
        ok = ref_matmul_make(&mm[made], eng, dt == CH_F16, g[made].ta, g[made].tb, (int)count,
                             g[made].m, g[made].n, g[made].k, g[made].accumulate, buf[made][0],
                             buf[made][1], buf[made][2]);
    }
    double median = -1;
    if (ok) {
        double *t = malloc(sizeof *t * (size_t)reps);
        for (int r = -3; r < reps; r++) {
            double t0 = ch_clock_seconds();
            for (int i = 0; i < n; i++)
                ref_matmul_run(&mm[i], st);
            if (r >= 0)
                t[r] = ch_clock_seconds() - t0;
        }
        median = bench_median(t, reps);
        free(t);
    }
    for (int i = 0; i < made; i++) {
        ref_matmul_free(&mm[i]);
        for (int j = 0; j < 3; j++)
            free(buf[i][j]);
    }
    dnnl_stream_destroy(st);
    dnnl_engine_destroy(eng);
    return median;
}
#endif

/* ---- Model FLOP rate and MFU -------------------------------------------------
 * The peaks are the vendors' listed dense rates in TFLOP/s, by device name
 * (the first row whose key the name contains): bf16 on tensor cores, TF32
 * on tensor cores, plain f32; -1 where not listed here (then no MFU). The
 * same table as docs/pytorch/bench_train.py's PEAKS: change both. */
typedef struct peak_row {
    const char *key, *label;
    double bf16, tf32, f32;
} peak_row;

static const peak_row peaks[] = {
    {"H100 PCIe", "H100 PCIe", 756.0, -1, -1},
    {"H100 NVL", "H100 NVL", -1, -1, -1},
    {"GH200", "GH200", -1, -1, -1},
    {"H200 NVL", "H200 NVL", -1, -1, -1},
    {"H200", "H200", 989.4, 494.7, 66.9},
    {"H100", "H100 SXM", 989.4, 494.7, 66.9},
    {"A100", "A100", 312.0, 156.0, 19.5},
};

/* The step's arithmetic on a device of `backend`: "bf16" (or "fp16")
 * under mixed precision, "tf32" with f32 GEMMs on TF32 (CUDA's: the other
 * backends compute in f32 either way), else "f32". */
static const char *math_kind(const char *backend)
{
    if (precision == CH_BF16)
        return "bf16";
    if (precision == CH_F16)
        return "fp16";
    return (ch_math_get() & CH_MATH_TF32) && strcmp(backend, "cuda") == 0 ? "tf32" : "f32";
}

/* The listed peak of the device for the step's arithmetic in TFLOP/s, or
 * -1; *label: the table's row ("H100 SXM"), or "" when none matched. */
static double device_peak(const ch_device_info *info, const char **label)
{
    *label = "";
    for (size_t i = 0; i < sizeof peaks / sizeof peaks[0]; i++) {
        if (!strstr(info->name, peaks[i].key))
            continue;
        *label = peaks[i].label;
        const char *k = math_kind(info->backend);
        return strcmp(k, "bf16") == 0   ? peaks[i].bf16
               : strcmp(k, "tf32") == 0 ? peaks[i].tf32
               : strcmp(k, "f32") == 0  ? peaks[i].f32
                                        : -1;
    }
    return -1;
}

/* llm.c's count of a GPT's training FLOP per token: 6 N + 6 L C T. */
static double gpt_flop_per_token(int64_t params, const ch_gpt_config *c)
{
    return 6.0 * (double)params + 6.0 * c->layers * (double)c->dim * (double)c->context;
}

/* ---- Ops run on the host --------------------------------------------------- */

/* How many (device, op) pairs ran on the host for `id` since ch_init, and
 * their ops as a JSON list of strings into buf (empty when none). */
static int fallbacks_of(const char *id, char *buf, size_t size)
{
    int n = 0;
    size_t used = 0;
    buf[0] = '\0';
    for (int i = 0; i < ch_fallback_count(); i++) {
        ch_fallback_info fi;
        BENCH_CHECK(ch_fallback_get(i, &fi));
        if (strcmp(fi.device, id) != 0)
            continue;
        int w = snprintf(buf + used, size - used, "%s\"%s\"", n ? "," : "", fi.op);
        if (w > 0 && (size_t)w < size - used)
            used += (size_t)w;
        n++;
    }
    return n;
}

/* ---- --attention-only -------------------------------------------------------- */

typedef struct attn_result {
    double forward_ms, backward_ms, step_ms; /* medians; step: forward + backward */
    double flop;                             /* of one forward + backward */
    uint64_t peak;                           /* the device's peak bytes meanwhile */
} attn_result;

/* Causal attention forward and backward at [batch, context, 3 dim] with
 * `heads` heads on dev, `steps` timed repetitions after 3 of warm-up, the
 * device synchronised around each call. The FLOP count is the causal
 * half of the products: forward q k^T and p v, 2 B H T^2 hd; backward
 * five products, 5 B H T^2 hd. */
static void attention_rate(attn_result *r, ch_device *dev, int batch, const ch_gpt_config *c,
                           int steps)
{
    int64_t d = c->dim, t = c->context, h = c->heads, hd = d / h;
    int64_t qs[3] = {batch, t, 3 * d}, os[3] = {batch, t, d}, ls[3] = {batch, h, t};
    float scale = 1.0f / sqrtf((float)hd);
    ch_dtype half = precision;
    BENCH_CHECK(ch_device_sync(dev));
    BENCH_CHECK(ch_device_reset_peak(dev));
    ch_tensor *qkv, *o, *lse, *dout, *dqkv;
    BENCH_CHECK(ch_tensor_new(&qkv, dev, CH_F32, 3, qs));
    BENCH_CHECK(ch_tensor_new(&dqkv, dev, CH_F32, 3, qs));
    BENCH_CHECK(ch_tensor_new(&o, dev, CH_F32, 3, os));
    BENCH_CHECK(ch_tensor_new(&dout, dev, CH_F32, 3, os));
    BENCH_CHECK(ch_tensor_new(&lse, dev, CH_F32, 3, ls));
    BENCH_CHECK(ch_rand_normal(qkv, 11, 0, 0.0f, 1.0f));
    BENCH_CHECK(ch_rand_normal(dout, 12, 0, 0.0f, 1.0f));
    double *f = malloc(sizeof *f * (size_t)steps), *b = malloc(sizeof *b * (size_t)steps),
           *s = malloc(sizeof *s * (size_t)steps);
    if (!f || !b || !s) {
        fprintf(stderr, "bench-train: out of memory\n");
        exit(1);
    }
    BENCH_CHECK(ch_device_sync(dev));
    for (int i = -3; i < steps; i++) {
        double t0 = ch_clock_seconds();
        BENCH_CHECK(ch_attention_packed_mixed(o, lse, qkv, (int)h, scale, half));
        BENCH_CHECK(ch_device_sync(dev));
        double t1 = ch_clock_seconds();
        BENCH_CHECK(
            ch_attention_packed_mixed_backward(dqkv, dout, qkv, o, lse, (int)h, scale, half));
        BENCH_CHECK(ch_device_sync(dev));
        double t2 = ch_clock_seconds();
        if (i >= 0) {
            f[i] = t1 - t0;
            b[i] = t2 - t1;
            s[i] = t2 - t0;
        }
    }
    r->forward_ms = 1e3 * bench_median(f, steps);
    r->backward_ms = 1e3 * bench_median(b, steps);
    r->step_ms = 1e3 * bench_median(s, steps);
    r->flop = 7.0 * batch * (double)h * (double)t * (double)t * (double)hd;
    ch_memory_stats ms;
    BENCH_CHECK(ch_device_memory_stats(dev, &ms));
    r->peak = ms.peak_bytes;
    free(f);
    free(b);
    free(s);
    ch_tensor_free(qkv);
    ch_tensor_free(dqkv);
    ch_tensor_free(o);
    ch_tensor_free(dout);
    ch_tensor_free(lse);
}

static void print_attention(const attn_result *r, ch_device *dev, int batch, const ch_gpt_config *c,
                            int json, int first)
{
    const char *id = ch_device_id(dev), *label;
    ch_device_info info;
    BENCH_CHECK(ch_device_get_info(dev, &info));
    double peak = device_peak(&info, &label);
    double tflops = r->flop / (r->step_ms * 1e-3) / 1e12;
    char ops[2048];
    int fb = fallbacks_of(id, ops, sizeof ops);
    if (json) {
        printf("%s{\"device\":\"%s\",\"device_name\":\"%s\",\"attention_only\":true,"
               "\"batch\":%d,\"heads\":%d,\"context\":%lld,\"head_dim\":%lld,"
               "\"precision\":\"%s\",\"forward_ms\":%.4f,\"backward_ms\":%.4f,"
               "\"step_ms\":%.4f,\"flop\":%.0f,\"tflops\":%.3f",
               first ? "" : ",", id, info.name, batch, c->heads, (long long)c->context,
               (long long)(c->dim / c->heads), ch_dtype_name(precision), r->forward_ms,
               r->backward_ms, r->step_ms, r->flop, tflops);
        if (peak > 0)
            printf(",\"peak_tflops\":%.1f,\"peak_of\":\"%s %s\",\"mfu\":%.4f", peak, label,
                   math_kind(info.backend), tflops / peak);
        printf(",\"peak_bytes\":%llu,\"fallbacks\":%d,\"fallback_ops\":[%s]}",
               (unsigned long long)r->peak, fb, ops);
        return;
    }
    printf("%-10s attention B %d, H %d, T %lld, hd %lld, %s products: forward %.3f ms, "
           "backward %.3f ms, both %.3f ms, %.2f TFLOP/s",
           id, batch, c->heads, (long long)c->context, (long long)(c->dim / c->heads),
           ch_dtype_name(precision), r->forward_ms, r->backward_ms, r->step_ms, tflops);
    if (peak > 0)
        printf(" (%.1f%% of %s %s's %.1f)", 100.0 * tflops / peak, label, math_kind(info.backend),
               peak);
    printf(", peak %.1f MiB", (double)r->peak / 1048576.0);
    if (strcmp(info.backend, "host") != 0)
        printf("; ops on the host: %d%s%s", fb, fb ? " " : "", ops);
    printf("\n");
}

/* The two rows of --recompute (context: the gpt's tokens per sample, or
 * 0), and in text the cost in time and the memory saved. */
static void print_recompute(const recompute_result *r, const char *id, const char *model, int batch,
                            int64_t context, int json, int first)
{
    for (int k = 0; k < 2; k++) {
        if (json) {
            printf("%s{\"device\":\"%s\",\"model\":\"%s\",\"batch\":%d,\"recompute\":%d,"
                   "\"samples_per_s\":%.1f",
                   first && k == 0 ? "" : ",", id, model, batch, k, r->rate[k]);
            if (context)
                printf(",\"tokens_per_s\":%.1f", r->rate[k] * (double)context);
            printf(",\"peak_mib\":%.2f,\"peak_upper_bound\":%s", r->peak_mib[k],
                   r->upper_bound[k] ? "true" : "false");
            if (precision != CH_F32)
                printf(",\"precision\":\"%s\"", ch_dtype_name(precision));
            printf("}");
            continue;
        }
        char tokens[32] = "-";
        if (context)
            snprintf(tokens, sizeof tokens, "%.1f", r->rate[k] * (double)context);
        printf("%-10s %-6s %6d %9s %14.1f %14s %s%11.2f\n", id, model, batch, k ? "yes" : "no",
               r->rate[k], tokens, r->upper_bound[k] ? "<" : " ", r->peak_mib[k]);
    }
    if (!json)
        printf("%-10s %-6s %6d  recompute: step time x%.3f, peak memory x%.3f\n", id, model, batch,
               r->rate[0] / r->rate[1], r->peak_mib[1] / r->peak_mib[0]);
}

int main(int argc, char **argv)
{
    const char *devices = NULL, *only = NULL;
    int batch = 64, steps = 20, json = 0, recompute = 0, tf32 = 0, attention_only = 0;
    shapes sh = {CH_RESNET_DEPTH, ch_gpt_defaults()};
    static const struct option longs[] = {{"devices", required_argument, 0, 'd'},
                                          {"device", required_argument, 0, 'd'},
                                          {"batch", required_argument, 0, 'b'},
                                          {"steps", required_argument, 0, 's'},
                                          {"model", required_argument, 0, 'm'},
                                          {"json", no_argument, 0, 'j'},
                                          {"depth", required_argument, 0, 'D'},
                                          {"layers", required_argument, 0, 'L'},
                                          {"heads", required_argument, 0, 'H'},
                                          {"dim", required_argument, 0, 'E'},
                                          {"context", required_argument, 0, 'T'},
                                          {"vocab", required_argument, 0, 'V'},
                                          {"precision", required_argument, 0, 'P'},
                                          {"recompute", no_argument, 0, 'R'},
                                          {"tf32", no_argument, 0, 'F'},
                                          {"optimizer", required_argument, 0, 'O'},
                                          {"attention-only", no_argument, 0, 'A'},
                                          {"unfused", no_argument, 0, 'U'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'd': devices = optarg; break;
        case 'b': batch = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'm': only = optarg; break;
        case 'j': json = 1; break;
        case 'R': recompute = 1; break;
        case 'F': tf32 = 1; break;
        case 'A': attention_only = 1; break;
        case 'U': unfused = 1; break;
        case 'O':
            if (strcmp(optarg, "adam") == 0)
                optimizer = CH_OPT_ADAM;
            else if (strcmp(optarg, "adamw") == 0)
                optimizer = CH_OPT_ADAMW;
            else {
                fprintf(stderr, "bench-train: --optimizer is adam or adamw\n");
                return 2;
            }
            break;
        case 'D': sh.depth = atoi(optarg); break;
        case 'L': sh.gpt.layers = atoi(optarg); break;
        case 'H': sh.gpt.heads = atoi(optarg); break;
        case 'E': sh.gpt.dim = atoi(optarg); break;
        case 'T': sh.gpt.context = atoi(optarg); break;
        case 'V': sh.gpt.vocab = atoi(optarg); break;
        case 'P':
            if (strcmp(optarg, "f32") == 0)
                precision = CH_F32;
            else if (strcmp(optarg, "bf16") == 0)
                precision = CH_BF16;
            else if (strcmp(optarg, "fp16") == 0)
                precision = CH_F16;
            else {
                fprintf(stderr, "bench-train: --precision is f32, bf16 or fp16\n");
                return 2;
            }
            break;
        case 'h':
            printf("usage: bench-train [--devices LIST | --device LIST] "
                   "[--model mlp|cnn|resnet|gpt] [--batch N] "
                   "[--steps N] [--depth N] [--layers N] [--heads N] [--dim N] [--context N] "
                   "[--vocab N] [--precision f32|bf16|fp16] [--tf32] [--optimizer adam|adamw] "
                   "[--recompute] [--attention-only] [--unfused] [--json]\n"
                   "without --model: the mlp and the cnn; --precision: mixed precision "
                   "(ch_module_set_precision), no loss scaling; --tf32: f32 GEMMs on TF32 "
                   "(ch_math_set(CH_MATH_TF32); without it CH_MATH_DEFAULT, whatever "
                   "CHORUS_TF32 says); --optimizer: Adam (default) or AdamW (weight decay "
                   "0.01); --recompute: each model "
                   "without and with recomputed activations (ch_module_set_recompute), "
                   "interleaved, with the peak memory of each; --attention-only: the fused "
                   "causal attention alone (ch_attention_packed_mixed and its backward, "
                   "products in --precision) on qkv [batch, context, 3 dim], --heads heads; "
                   "--unfused: the loss's forward and backward apart and Adam a call per "
                   "parameter (ch_optimizer_set_one_by_one), the step before its fusions\n"
                   "the gpt's rows give its model TFLOP/s and MFU (6N + 6LCT FLOP a token, "
                   "llm.c's count) against the device's listed peak, every row the ops that "
                   "ran on the host for its device\n");
            return 0;
        default: fprintf(stderr, "bench-train: bad option (see --help)\n"); return 2;
        }
    }
    if (batch < 1 || steps < 1) {
        fprintf(stderr, "bench-train: --batch and --steps must be >= 1\n");
        return 2;
    }
    if (attention_only && (only || recompute)) {
        fprintf(stderr, "bench-train: --attention-only takes no --model and no --recompute\n");
        return 2;
    }
    if (attention_only && (sh.gpt.heads < 1 || sh.gpt.dim < 1 || sh.gpt.context < 1 ||
                           sh.gpt.dim % sh.gpt.heads != 0)) {
        fprintf(stderr, "bench-train: --attention-only needs --heads, --dim and --context "
                        ">= 1, --dim a multiple of --heads\n");
        return 2;
    }
    if (only && strcmp(only, "mlp") && strcmp(only, "cnn") && strcmp(only, "resnet") &&
        strcmp(only, "gpt")) {
        fprintf(stderr, "bench-train: --model is mlp, cnn, resnet or gpt\n");
        return 2;
    }
    BENCH_CHECK(ch_init());
    BENCH_CHECK(ch_math_set(tf32 ? CH_MATH_TF32 : CH_MATH_DEFAULT));
    ch_device *devs[64];
    int n = 0;
    if (devices)
        BENCH_CHECK(ch_device_list_parse(devs, 64, &n, devices));
    else
        for (int i = 0; i < ch_device_count() && n < 64; i++)
            BENCH_CHECK(ch_device_get(&devs[n++], i));
    const char *models[4] = {"mlp", "cnn", "resnet", "gpt"};
    if (attention_only) {
        if (json)
            printf("[");
        for (int d = 0; d < n; d++) {
            attn_result r;
            attention_rate(&r, devs[d], batch, &sh.gpt, steps);
            print_attention(&r, devs[d], batch, &sh.gpt, json, d == 0);
        }
        if (json)
            printf("]\n");
        ch_shutdown();
        return 0;
    }
    if (json)
        printf("[");
    else if (recompute)
        printf("%-10s %-6s %6s %9s %14s %14s %12s\n", "device", "model", "batch", "recompute",
               "samples/s", "tokens/s", "peak MiB");
    else
        printf("%-10s %-6s %6s %14s %14s %10s\n", "device", "model", "batch", "samples/s",
               "tokens/s", "peak MiB");
    int first = 1;
    for (int d = 0; d < n; d++) {
        for (int mi = 0; mi < 4; mi++) {
            if (only ? strcmp(only, models[mi]) != 0 : mi >= 2)
                continue;
            int gpt = mi == 3;
            if (recompute) {
                recompute_result r;
                compare_recompute(&r, models[mi], &sh, devs[d], batch, steps);
                print_recompute(&r, ch_device_id(devs[d]), models[mi], batch,
                                gpt ? sh.gpt.context : 0, json, first);
                first = 0;
                continue;
            }
            uint64_t peak = 0;
            int64_t params = 0;
            step_counts counts;
            double rate =
                train_rate(models[mi], &sh, devs[d], batch, steps, &peak, &params, &counts);
            double peak_mib = (double)peak / (1024.0 * 1024.0);
            /* The process's peak resident memory so far (Linux: KiB), read
             * before the GEMM share's own operands are made: what the
             * training took, libraries included, as bench_train.py reads
             * PyTorch's. */
            struct rusage ru;
            double rss_mib = getrusage(RUSAGE_SELF, &ru) == 0 ? (double)ru.ru_maxrss / 1024.0 : -1;
            const char *id = ch_device_id(devs[d]);
            double share = -1, bound = -1;
#ifdef HAVE_REF_GEMM
            if (strcmp(id, "host") == 0 && mi != 2 && precision == CH_F32) {
                bound = batch / gemm_seconds(models[mi], &sh, batch, steps);
                share = rate / bound;
            }
#endif
#ifdef HAVE_REF_GEMM_HALF
            /* In mixed precision the same GEMMs in the half format, for the
             * models whose layers are Linear (the cnn's convolutions run as
             * oneDNN's convolutions, not GEMMs). */
            if (strcmp(id, "host") == 0 && (mi == 0 || gpt) && precision != CH_F32) {
                double secs = gemm_half_seconds(models[mi], &sh, batch, steps, precision);
                if (secs > 0) {
                    bound = batch / secs;
                    share = rate / bound;
                }
            }
#endif
            /* The gpt's model FLOP rate and MFU; for every model the ops
             * run on the host for this device so far. */
            ch_device_info info;
            BENCH_CHECK(ch_device_get_info(devs[d], &info));
            const char *label = "";
            double dev_peak = device_peak(&info, &label), fpt = 0, tflops = 0;
            if (gpt) {
                fpt = gpt_flop_per_token(params, &sh.gpt);
                tflops = fpt * rate * (double)sh.gpt.context / 1e12;
            }
            char ops[2048];
            int fb = fallbacks_of(id, ops, sizeof ops);
            if (json) {
                printf("%s{\"device\":\"%s\",\"model\":\"%s\",\"batch\":%d,\"samples_per_s\":%.1f",
                       first ? "" : ",", id, models[mi], batch, rate);
                if (gpt)
                    printf(",\"tokens_per_s\":%.1f,\"context\":%lld,\"flop_per_token\":%.0f,"
                           "\"tflops\":%.3f",
                           rate * (double)sh.gpt.context, (long long)sh.gpt.context, fpt, tflops);
                if (gpt && dev_peak > 0)
                    printf(",\"peak_tflops\":%.1f,\"peak_of\":\"%s %s\",\"mfu\":%.4f", dev_peak,
                           label, math_kind(info.backend), tflops / dev_peak);
                printf(",\"params\":%lld,\"device_name\":\"%s\",\"math\":\"%s\","
                       "\"optimizer\":\"%s\",\"fallbacks\":%d,\"fallback_ops\":[%s]",
                       (long long)params, info.name, math_kind(info.backend),
                       optimizer == CH_OPT_ADAMW ? "adamw" : "adam", fb, ops);
                if (share >= 0)
                    printf(",\"gemm_bound_samples_per_s\":%.1f,\"gemm_share\":%.3f", bound, share);
                if (precision != CH_F32)
                    printf(",\"precision\":\"%s\"", ch_dtype_name(precision));
                if (unfused)
                    printf(",\"unfused\":true");
                if (counts.launches >= 0)
                    printf(",\"launches_per_step\":%.0f,\"gemms_per_step\":%.0f", counts.launches,
                           counts.gemms);
                if (counts.gemm_share >= 0)
                    printf(",\"gemm_time_share\":%.4f", counts.gemm_share);
                printf(",\"peak_bytes\":%llu", (unsigned long long)peak);
                if (rss_mib >= 0)
                    printf(",\"max_rss_mib\":%.1f", rss_mib);
                printf("}");
            } else {
                if (gpt)
                    printf("%-10s %-6s %6d %14.1f %14.1f %10.1f\n", id, models[mi], batch, rate,
                           rate * (double)sh.gpt.context, peak_mib);
                else
                    printf("%-10s %-6s %6d %14.1f %14s %10.1f\n", id, models[mi], batch, rate, "-",
                           peak_mib);
                if (gpt) {
                    printf("%-10s %-6s %6d  %lld parameters, %.4g FLOP a token (6N + 6LCT): "
                           "%.2f TFLOP/s",
                           id, models[mi], batch, (long long)params, fpt, tflops);
                    if (dev_peak > 0)
                        printf(", MFU %.1f%% of %.1f (%s, %s)", 100.0 * tflops / dev_peak, dev_peak,
                               label, math_kind(info.backend));
                    else
                        printf(", MFU -: no listed %s peak for \"%s\"", math_kind(info.backend),
                               info.name);
                    printf("\n");
                }
                if (strcmp(info.backend, "host") != 0)
                    printf("%-10s %-6s %6d  ops run on the host for %s so far: %d%s%s\n", id,
                           models[mi], batch, id, fb, fb ? " " : "", ops);
                if (counts.launches >= 0)
                    printf("%-10s %-6s %6d  a step launches %.0f (%.0f GEMMs); their time: %.1f%% "
                           "of the step (device events)\n",
                           id, models[mi], batch, counts.launches, counts.gemms,
                           100.0 * counts.gemm_share);
                if (share >= 0)
                    printf("%-10s %-6s %6d %14.1f  GEMM-bound rate at " REF_GEMM_LIB " speed%s; "
                           "GEMM share %.3f\n",
                           id, models[mi], batch, bound,
                           precision == CH_BF16  ? " in bf16"
                           : precision == CH_F16 ? " in f16"
                                                 : "",
                           share);
            }
            first = 0;
        }
    }
    if (json)
        printf("]\n");
    ch_shutdown();
    return 0;
}
