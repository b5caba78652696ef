/* bench-dp: training samples/s through the data-parallel wrapper with 1, 2
 * and 3 replicas, and the wrapper on one device against plain single-device
 * training of the same model and batch, in the same run. Random images in
 * pinned host memory: the loader is not measured. */
#include "config.h"

#include <chorus.h>

#include "bench.h"
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static ch_optimizer_options adam(void) { return ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f); }

/* Plain training on one device: upload, forward, loss, backward, step, as
 * chorus-train does on one device. */
typedef struct plain {
    ch_module *m;
    ch_loss *loss;
    ch_optimizer *opt;
    ch_tensor *x, *labels;
} plain;

static void plain_new(plain *p, const char *model, ch_device *dev, const ch_batch *b)
{
    ch_optimizer_options oo = adam();
    BENCH_CHECK(ch_nn_preset(&p->m, model));
    BENCH_CHECK(ch_module_init(p->m, 1));
    BENCH_CHECK(ch_module_to(p->m, dev));
    BENCH_CHECK(ch_loss_new(&p->loss, CH_LOSS_CROSS_ENTROPY));
    BENCH_CHECK(ch_optimizer_new(&p->opt, p->m, &oo));
    int64_t xs[4] = {b->count, 1, 28, 28}, ls[1] = {b->count};
    BENCH_CHECK(ch_tensor_new(&p->x, dev, CH_F32, 4, xs));
    BENCH_CHECK(ch_tensor_new(&p->labels, dev, CH_I32, 1, ls));
}

static void plain_step(plain *p, const ch_batch *b)
{
    ch_tensor *y, *lv, *dy;
    float l;
    BENCH_CHECK(ch_tensor_upload_async(p->x, b->images, 0));
    BENCH_CHECK(ch_tensor_upload_async(p->labels, b->labels, 0));
    BENCH_CHECK(ch_module_zero_grad(p->m));
    BENCH_CHECK(ch_module_forward(p->m, &y, p->x));
    BENCH_CHECK(ch_loss_forward_backward(p->loss, &lv, &dy, y, p->labels, 1.0f));
    BENCH_CHECK(ch_module_backward(p->m, NULL, dy));
    BENCH_CHECK(ch_optimizer_step(p->opt, 1e-3f));
    BENCH_CHECK(ch_tensor_download(lv, &l, sizeof l));
}

static void plain_free(plain *p)
{
    ch_tensor_free(p->x);
    ch_tensor_free(p->labels);
    ch_optimizer_free(p->opt);
    ch_loss_free(p->loss);
    ch_module_free(p->m);
}

typedef struct dp_config {
    ch_reduce_mode reduce;
    ch_dp_split split;
} dp_config;

static ch_dp *dp_make(const char *model, ch_device **devs, int n, dp_config cfg)
{
    ch_module *m;
    BENCH_CHECK(ch_nn_preset(&m, model));
    BENCH_CHECK(ch_module_init(m, 1));
    ch_dp_options o = {0};
    o.reduce = cfg.reduce;
    o.split = cfg.split;
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = adam();
    o.sample_ndim = 3;
    o.sample_shape[0] = 1;
    o.sample_shape[1] = o.sample_shape[2] = 28;
    ch_dp *dp;
    BENCH_CHECK(ch_dp_new(&dp, m, devs, n, &o));
    ch_module_free(m);
    return dp;
}

static double dp_step(ch_dp *dp, const ch_batch *b)
{
    float l;
    double t0 = ch_clock_seconds();
    BENCH_CHECK(ch_dp_step(dp, &l, b, 1e-3f));
    return ch_clock_seconds() - t0;
}

/* The wrapper on one device against plain training: both made once, then
 * rounds of `steps` steps, a plain step and a wrapped one in turn, so that
 * drift of the machine hits both alike; the medians of all their step
 * times. */
static void one_device(const char *model, ch_device *dev, const ch_batch *b, int steps,
                       int rounds, double *plain_rate, double *dp_rate)
{
    plain p;
    plain_new(&p, model, dev, b);
    ch_dp *dp = dp_make(model, &dev, 1, (dp_config){CH_REDUCE_HOST, CH_DP_SPLIT_EQUAL});
    size_t total = (size_t)steps * (size_t)rounds;
    double *tp = malloc(sizeof *tp * total), *td = malloc(sizeof *td * total);
    if (!tp || !td) {
        fprintf(stderr, "bench-dp: out of memory\n");
        exit(1);
    }
    for (int s = 0; s < 3; s++) {
        plain_step(&p, b);
        dp_step(dp, b);
    }
    /* Step by step in turn, the order swapped every round. */
    for (int r = 0; r < rounds; r++) {
        for (int s = 0; s < steps; s++) {
            size_t k = (size_t)r * (size_t)steps + (size_t)s;
            if (r % 2)
                td[k] = dp_step(dp, b);
            double t0 = ch_clock_seconds();
            plain_step(&p, b);
            tp[k] = ch_clock_seconds() - t0;
            if (r % 2 == 0)
                td[k] = dp_step(dp, b);
        }
    }
    *plain_rate = b->count / bench_median(tp, (int)total);
    *dp_rate = b->count / bench_median(td, (int)total);
    free(tp);
    free(td);
    ch_dp_free(dp);
    plain_free(&p);
}

static double dp_rate(const char *model, ch_device **devs, int n, const ch_batch *b, int steps,
                      dp_config cfg)
{
    ch_dp *dp = dp_make(model, devs, n, cfg);
    double *t = malloc(sizeof *t * (size_t)steps);
    if (!t) {
        fprintf(stderr, "bench-dp: out of memory\n");
        exit(1);
    }
    /* Warm-up, and time for an automatic split to settle. */
    for (int s = 0; s < 10; s++)
        dp_step(dp, b);
    for (int s = 0; s < steps; s++)
        t[s] = dp_step(dp, b);
    double rate = b->count / bench_median(t, steps);
    free(t);
    ch_dp_free(dp);
    return rate;
}

/* The trace's cost (--trace FILE): two dps over the same devices, one made
 * while a trace ran (its OpenCL queues profile, as chorus-train --trace
 * makes them) and traced, the other neither; rounds of `steps` steps of
 * each in turn, the order swapped every round, the trace started before
 * each traced round (FILE.K.json, K the round) and stopped after it,
 * outside the timed steps; the medians of the step times. */
static void trace_overhead(const char *model, ch_device **devs, int n, const ch_batch *b, int steps,
                           int rounds, dp_config cfg, const char *file, double *off_rate,
                           double *on_rate)
{
    char path[1024];
    snprintf(path, sizeof path, "%s.0.json", file);
    ch_dp *plain = dp_make(model, devs, n, cfg);
    BENCH_CHECK(ch_trace_start(path, NULL));
    ch_dp *traced = dp_make(model, devs, n, cfg);
    for (int s = 0; s < 10; s++)
        dp_step(traced, b);
    BENCH_CHECK(ch_trace_stop());
    for (int s = 0; s < 10; s++)
        dp_step(plain, b);
    size_t total = (size_t)steps * (size_t)rounds;
    double *toff = malloc(sizeof *toff * total), *ton = malloc(sizeof *ton * total);
    if (!toff || !ton) {
        fprintf(stderr, "bench-dp: out of memory\n");
        exit(1);
    }
    for (int r = 0; r < rounds; r++) {
        for (int half = 0; half < 2; half++) {
            int on = (half + r) % 2;
            if (on) {
                snprintf(path, sizeof path, "%s.%d.json", file, r + 1);
                BENCH_CHECK(ch_trace_start(path, NULL));
            }
            for (int s = 0; s < steps; s++) {
                size_t k = (size_t)r * (size_t)steps + (size_t)s;
                if (on)
                    ton[k] = dp_step(traced, b);
                else
                    toff[k] = dp_step(plain, b);
            }
            if (on)
                BENCH_CHECK(ch_trace_stop());
        }
    }
    *off_rate = b->count / bench_median(toff, (int)total);
    *on_rate = b->count / bench_median(ton, (int)total);
    free(toff);
    free(ton);
    ch_dp_free(traced);
    ch_dp_free(plain);
}

int main(int argc, char **argv)
{
    const char *devices = "host", *model = "mlp", *reduce = "host", *split = "equal";
    const char *trace = NULL;
    int batch = 64, steps = 20, rounds = 5;
    static const struct option longs[] = {
        {"devices", required_argument, 0, 'd'}, {"model", required_argument, 0, 'm'},
        {"batch", required_argument, 0, 'b'},   {"steps", required_argument, 0, 's'},
        {"rounds", required_argument, 0, 'r'},  {"reduce", required_argument, 0, 'R'},
        {"split", required_argument, 0, 'S'},   {"trace", required_argument, 0, 'T'},
        {"help", no_argument, 0, 'h'},          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'd': devices = optarg; break;
        case 'm': model = optarg; break;
        case 'b': batch = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'r': rounds = atoi(optarg); break;
        case 'R': reduce = optarg; break;
        case 'S': split = optarg; break;
        case 'T': trace = optarg; break;
        case 'h':
            printf("usage: bench-dp [--devices LIST (up to 8, default host)] [--model mlp|cnn] "
                   "[--batch N] [--steps N] [--rounds N] [--reduce host|peer|auto] "
                   "[--split equal|auto] [--trace FILE]\n"
                   "--trace FILE: instead, the trace's cost: the steps over all the devices "
                   "traced (into FILE.K.json) and not, in turn\n");
            return 0;
        default: fprintf(stderr, "bench-dp: bad option (see --help)\n"); return 2;
        }
    }
    dp_config cfg = {CH_REDUCE_HOST, strcmp(split, "auto") == 0 ? CH_DP_SPLIT_AUTO
                                                                : CH_DP_SPLIT_EQUAL};
    if (batch < 8 || steps < 1 || rounds < 1 || ch_reduce_mode_parse(&cfg.reduce, reduce) ||
        (strcmp(split, "auto") && strcmp(split, "equal"))) {
        fprintf(stderr, "bench-dp: --batch must be >= 8, --steps and --rounds >= 1, --reduce "
                "host, peer or auto, --split equal or auto\n");
        return 2;
    }
    BENCH_CHECK(ch_init());
    ch_device *devs[8];
    int n = 0;
    BENCH_CHECK(ch_device_list_parse_replicas(devs, 8, &n, devices));
    ch_host_buffer *images, *labels;
    BENCH_CHECK(ch_host_buffer_new(&images, devs[0], sizeof(float) * (size_t)batch * 784));
    BENCH_CHECK(ch_host_buffer_new(&labels, devs[0], sizeof(int32_t) * (size_t)batch));
    float *x = ch_host_buffer_data(images);
    int32_t *l = ch_host_buffer_data(labels);
    for (int i = 0; i < batch * 784; i++)
        x[i] = (float)((i * 7919) % 1000) / 500.0f - 1.0f;
    for (int i = 0; i < batch; i++)
        l[i] = i % 10;
    ch_batch b = {images, labels, NULL, batch, 0, 0};

    bench_header("bench-dp");
    printf("%-28s %-5s %6s %12s\n", "devices", "model", "batch", "samples/s");
    if (trace) {
        char ids[256] = "";
        for (int i = 0; i < n; i++) {
            size_t len = strlen(ids);
            snprintf(ids + len, sizeof ids - len, "%s%s", i ? "," : "", ch_device_id(devs[i]));
        }
        double off = 0, on = 0;
        trace_overhead(model, devs, n, &b, steps, rounds, cfg, trace, &off, &on);
        printf("%-28s %-5s %6d %12.1f  not traced\n", ids, model, batch, off);
        printf("%-28s %-5s %6d %12.1f  traced: %.1f%% %s\n", ids, model, batch, on,
               100.0 * fabs(off - on) / off, on <= off ? "slower" : "faster");
        ch_host_buffer_free(images);
        ch_host_buffer_free(labels);
        ch_shutdown();
        return 0;
    }
    double plain = 0, one = 0;
    one_device(model, devs[0], &b, steps, rounds, &plain, &one);
    printf("%-28s %-5s %6d %12.1f  plain training\n", ch_device_id(devs[0]), model, batch, plain);
    printf("%-28s %-5s %6d %12.1f  data-parallel wrapper, 1 replica: %.1f%% %s\n",
           ch_device_id(devs[0]), model, batch, one, 100.0 * fabs(plain - one) / plain,
           one <= plain ? "slower" : "faster");
    for (int k = 2; k <= n; k++) {
        char ids[256] = "";
        for (int i = 0; i < k; i++) {
            size_t len = strlen(ids);
            snprintf(ids + len, sizeof ids - len, "%s%s", i ? "," : "", ch_device_id(devs[i]));
        }
        printf("%-28s %-5s %6d %12.1f  %d replicas, reduce %s, split %s\n", ids, model, batch,
               dp_rate(model, devs, k, &b, steps * rounds, cfg), k, reduce, split);
    }
    ch_host_buffer_free(images);
    ch_host_buffer_free(labels);
    ch_shutdown();
    return 0;
}
