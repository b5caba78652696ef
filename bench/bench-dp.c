/* bench-dp: training samples/s through the data-parallel wrapper with 1, 2
 * and 3 replicas, and the wrapper on one device against plain single-device
 * training of the same model and batch, in the same run. Random images in
 * pinned host memory: the loader is not measured. */
#include "config.h"

#include <chorus.h>

#include "bench.h"
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static ch_optimizer_options adam(void) { return ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f); }

/* Median samples/s of plain training on one device: upload, forward, loss,
 * backward, step, as chorus-train does on one device. */
static double plain_rate(const char *model, ch_device *dev, const ch_batch *b, int steps)
{
    ch_module *m;
    ch_loss *loss;
    ch_optimizer *opt;
    ch_optimizer_options oo = adam();
    BENCH_CHECK(ch_nn_preset(&m, model));
    BENCH_CHECK(ch_module_init(m, 1));
    BENCH_CHECK(ch_module_to(m, dev));
    BENCH_CHECK(ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY));
    BENCH_CHECK(ch_optimizer_new(&opt, m, &oo));
    int64_t xs[4] = {b->count, 1, 28, 28}, ls[1] = {b->count};
    ch_tensor *x, *labels, *y, *lv, *dy;
    BENCH_CHECK(ch_tensor_new(&x, dev, CH_F32, 4, xs));
    BENCH_CHECK(ch_tensor_new(&labels, dev, CH_I32, 1, ls));
    double *t = malloc(sizeof *t * (size_t)steps);
    for (int s = -3; s < steps; s++) {
        float l;
        double t0 = bench_now();
        BENCH_CHECK(ch_tensor_upload_async(x, b->images, 0));
        BENCH_CHECK(ch_tensor_upload_async(labels, b->labels, 0));
        BENCH_CHECK(ch_module_zero_grad(m));
        BENCH_CHECK(ch_module_forward(m, &y, x));
        BENCH_CHECK(ch_loss_forward(loss, &lv, y, labels));
        BENCH_CHECK(ch_loss_backward(loss, &dy, 1.0f));
        BENCH_CHECK(ch_module_backward(m, NULL, dy));
        BENCH_CHECK(ch_optimizer_step(opt, 1e-3f));
        BENCH_CHECK(ch_tensor_download(lv, &l, sizeof l));
        if (s >= 0)
            t[s] = bench_now() - t0;
    }
    double rate = b->count / bench_median(t, steps);
    free(t);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    ch_optimizer_free(opt);
    ch_loss_free(loss);
    ch_module_free(m);
    return rate;
}

static double dp_rate(const char *model, ch_device **devs, int n, const ch_batch *b, int steps)
{
    ch_module *m;
    BENCH_CHECK(ch_nn_preset(&m, model));
    BENCH_CHECK(ch_module_init(m, 1));
    ch_dp_options o = {0};
    o.reduce = CH_DP_REDUCE_HOST;
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = adam();
    o.sample_ndim = 3;
    o.sample_shape[0] = 1;
    o.sample_shape[1] = o.sample_shape[2] = 28;
    ch_dp *dp;
    BENCH_CHECK(ch_dp_new(&dp, m, devs, n, &o));
    double *t = malloc(sizeof *t * (size_t)steps);
    for (int s = -3; s < steps; s++) {
        float l;
        double t0 = bench_now();
        BENCH_CHECK(ch_dp_step(dp, b, 1e-3f, &l));
        if (s >= 0)
            t[s] = bench_now() - t0;
    }
    double rate = b->count / bench_median(t, steps);
    free(t);
    ch_dp_free(dp);
    ch_module_free(m);
    return rate;
}

int main(int argc, char **argv)
{
    const char *devices = "host", *model = "mlp";
    int batch = 64, steps = 20;
    static const struct option longs[] = {{"devices", required_argument, 0, 'd'},
                                          {"model", required_argument, 0, 'm'},
                                          {"batch", required_argument, 0, 'b'},
                                          {"steps", required_argument, 0, 's'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'd': devices = optarg; break;
        case 'm': model = optarg; break;
        case 'b': batch = atoi(optarg); break;
        case 's': steps = atoi(optarg); break;
        case 'h':
            printf("usage: bench-dp [--devices LIST (up to 3, default host)] [--model mlp|cnn] "
                   "[--batch N] [--steps N]\n");
            return 0;
        default: fprintf(stderr, "bench-dp: bad option (see --help)\n"); return 2;
        }
    }
    if (batch < 3 || steps < 1) {
        fprintf(stderr, "bench-dp: --batch must be >= 3 and --steps >= 1\n");
        return 2;
    }
    BENCH_CHECK(ch_init());
    ch_device *devs[3];
    int n = 0;
    BENCH_CHECK(ch_device_list_parse(devs, 3, &n, devices));
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

    printf("%-28s %-5s %6s %12s\n", "devices", "model", "batch", "samples/s");
    double plain = plain_rate(model, devs[0], &b, steps);
    double one = dp_rate(model, devs, 1, &b, steps);
    printf("%-28s %-5s %6d %12.1f  plain training\n", ch_device_id(devs[0]), model, batch, plain);
    printf("%-28s %-5s %6d %12.1f  data-parallel wrapper, 1 replica: %.1f%% %s\n",
           ch_device_id(devs[0]), model, batch, one, 100.0 * (plain - one) / plain,
           one <= plain ? "slower" : "faster (noise)");
    for (int k = 2; k <= n; k++) {
        char ids[128] = "";
        for (int i = 0; i < k; i++) {
            size_t len = strlen(ids);
            snprintf(ids + len, sizeof ids - len, "%s%s", i ? "," : "", ch_device_id(devs[i]));
        }
        printf("%-28s %-5s %6d %12.1f  %d replicas\n", ids, model, batch,
               dp_rate(model, devs, k, &b, steps), k);
    }
    ch_host_buffer_free(images);
    ch_host_buffer_free(labels);
    ch_shutdown();
    return 0;
}
