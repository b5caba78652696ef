/* bench-train: training samples/s of the mlp and the cnn on each device,
 * and, on the host, the share of the step spent in GEMM: the rate the
 * step's GEMMs alone would allow at OpenBLAS's speed (the same shapes,
 * timed with cblas_sgemm in the same run) against the measured rate.
 *
 * The data are random images in device memory: this measures the training
 * step (forward, loss, backward, optimizer), not the loader. */
#include "config.h"

#include <chorus.h>

#include "bench.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef HAVE_BLAS
#include <cblas.h>
#endif

/* Median of `steps` timed training steps of `model` on `dev` after warm-up:
 * samples per second. */
static double train_rate(const char *model, ch_device *dev, int batch, int steps)
{
    ch_module *m = NULL;
    ch_loss *loss = NULL;
    ch_optimizer *opt = NULL;
    BENCH_CHECK(ch_nn_preset(&m, model));
    BENCH_CHECK(ch_module_init(m, 1));
    BENCH_CHECK(ch_module_to(m, dev));
    BENCH_CHECK(ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY));
    ch_optimizer_options oo = ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f);
    BENCH_CHECK(ch_optimizer_new(&opt, m, &oo));
    int64_t xs[4] = {batch, 1, 28, 28}, ls[1] = {batch};
    ch_tensor *x = NULL, *labels = NULL, *y, *lv, *dy;
    BENCH_CHECK(ch_tensor_new(&x, dev, CH_F32, 4, xs));
    BENCH_CHECK(ch_tensor_new(&labels, dev, CH_I32, 1, ls));
    BENCH_CHECK(ch_rand_normal(x, 7, 0, 0.0f, 1.0f));
    int32_t *lab = malloc(sizeof *lab * (size_t)batch);
    for (int i = 0; i < batch; i++)
        lab[i] = i % 10;
    BENCH_CHECK(ch_tensor_upload(labels, lab, sizeof *lab * (size_t)batch));
    free(lab);
    double *t = malloc(sizeof *t * (size_t)steps);
    for (int s = -3; s < steps; s++) {
        double t0 = ch_clock_seconds();
        BENCH_CHECK(ch_module_zero_grad(m));
        BENCH_CHECK(ch_module_forward(m, &y, x));
        BENCH_CHECK(ch_loss_forward(loss, &lv, y, labels));
        BENCH_CHECK(ch_loss_backward(loss, &dy, 1.0f));
        BENCH_CHECK(ch_module_backward(m, NULL, dy));
        BENCH_CHECK(ch_optimizer_step(opt, 1e-3f));
        BENCH_CHECK(ch_device_sync(dev));
        if (s >= 0)
            t[s] = ch_clock_seconds() - t0;
    }
    double median = bench_median(t, steps);
    free(t);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    ch_optimizer_free(opt);
    ch_loss_free(loss);
    ch_module_free(m);
    return batch / median;
}

#ifdef HAVE_BLAS
/* One GEMM of a training step, row-major: C[M,N] = op(A) op(B) (+ C). */
typedef struct gemm_shape {
    int ta, tb, m, n, k, accumulate;
} gemm_shape;

#define MAX_GEMMS 16

/* A Linear layer's GEMMs: forward y = x W^T, backward dW += dy^T x and,
 * unless it is the first layer with parameters, dx = dy W. */
static int linear_gemms(gemm_shape *g, int batch, int in, int out, int want_dx)
{
    int n = 0;
    g[n++] = (gemm_shape){0, 1, batch, out, in, 0};
    g[n++] = (gemm_shape){1, 0, out, in, batch, 1};
    if (want_dx)
        g[n++] = (gemm_shape){0, 0, batch, in, out, 0};
    return n;
}

/* A convolution with `ckk` = C*kh*kw inputs per output over `pixels`
 * output positions per sample as the Conv2d module runs it: forward
 * y = W col, backward dW += dy col^T and, unless it is the first layer,
 * dcol = W^T dy. */
static int conv_gemms(gemm_shape *g, int batch, int ckk, int out, int pixels, int want_dx)
{
    int n = 0, cols = batch * pixels;
    g[n++] = (gemm_shape){0, 0, out, cols, ckk, 0};
    g[n++] = (gemm_shape){0, 1, out, ckk, cols, 1};
    if (want_dx)
        g[n++] = (gemm_shape){1, 0, ckk, cols, out, 0};
    return n;
}

/* The GEMMs of one training step of the preset `model`, read off the
 * model itself: its layers run one by one on the host, each Linear and
 * Conv2d giving its shapes (a convolution's output plane from its output). */
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

/* Seconds for a step's GEMMs at OpenBLAS's speed: median of `reps` runs
 * of the whole set. */
static double gemm_seconds(const char *model, int batch, int reps)
{
    gemm_shape g[MAX_GEMMS];
    int n = step_gemms(g, model, batch);
    /* Each GEMM gets operands of its own, as in the model (weights,
     * activations and gradients are different memory): one shared set would
     * stay in cache and flatter the bound. */
    float *buf[MAX_GEMMS][3];
    for (int i = 0; i < n; i++) {
        size_t sizes[3] = {(size_t)g[i].m * g[i].k, (size_t)g[i].k * g[i].n,
                           (size_t)g[i].m * g[i].n};
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
            cblas_sgemm(CblasRowMajor, g[i].ta ? CblasTrans : CblasNoTrans,
                        g[i].tb ? CblasTrans : CblasNoTrans, g[i].m, g[i].n, g[i].k, 1.0f,
                        buf[i][0], lda, buf[i][1], ldb, g[i].accumulate ? 1.0f : 0.0f,
                        buf[i][2], g[i].n);
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

int main(int argc, char **argv)
{
    const char *devices = NULL, *only = NULL;
    int batch = 64, steps = 20, json = 0;
    static const struct option longs[] = {{"devices", required_argument, 0, 'd'},
                                          {"batch", required_argument, 0, 'b'},
                                          {"steps", required_argument, 0, 's'},
                                          {"model", required_argument, 0, 'm'},
                                          {"json", no_argument, 0, 'j'},
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
        case 'h':
            printf("usage: bench-train [--devices LIST] [--model mlp|cnn] [--batch N] [--steps N] "
                   "[--json]\n");
            return 0;
        default: fprintf(stderr, "bench-train: bad option (see --help)\n"); return 2;
        }
    }
    if (batch < 1 || steps < 1) {
        fprintf(stderr, "bench-train: --batch and --steps must be >= 1\n");
        return 2;
    }
    BENCH_CHECK(ch_init());
    ch_device *devs[64];
    int n = 0;
    if (devices)
        BENCH_CHECK(ch_device_list_parse(devs, 64, &n, devices));
    else
        for (int i = 0; i < ch_device_count() && n < 64; i++)
            BENCH_CHECK(ch_device_get(&devs[n++], i));
    const char *models[2] = {"mlp", "cnn"};
    if (json)
        printf("[");
    else
        printf("%-10s %-5s %6s %14s\n", "device", "model", "batch", "samples/s");
    int first = 1;
    for (int d = 0; d < n; d++) {
        for (int mi = 0; mi < 2; mi++) {
            if (only && strcmp(only, models[mi]) != 0)
                continue;
            double rate = train_rate(models[mi], devs[d], batch, steps);
            const char *id = ch_device_id(devs[d]);
            double share = -1, bound = -1;
#ifdef HAVE_BLAS
            if (strcmp(id, "host") == 0) {
                bound = batch / gemm_seconds(models[mi], batch, steps);
                share = rate / bound;
            }
#endif
            if (json) {
                printf("%s{\"device\":\"%s\",\"model\":\"%s\",\"batch\":%d,\"samples_per_s\":%.1f",
                       first ? "" : ",", id, models[mi], batch, rate);
                if (share >= 0)
                    printf(",\"gemm_bound_samples_per_s\":%.1f,\"gemm_share\":%.3f", bound, share);
                printf("}");
            } else {
                printf("%-10s %-5s %6d %14.1f\n", id, models[mi], batch, rate);
                if (share >= 0)
                    printf("%-10s %-5s %6d %14.1f  GEMM-bound rate at OpenBLAS speed; "
                           "GEMM share %.3f\n",
                           id, models[mi], batch, bound, share);
            }
            first = 0;
        }
    }
    if (json)
        printf("]\n");
    ch_shutdown();
    return 0;
}
