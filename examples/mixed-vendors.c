/* The first thing to run on a machine with cards of two vendors (an AMD
 * and an NVIDIA GPU, say): which platforms and devices Chorus sees, which
 * pairs of devices can copy device to device (those of one OpenCL
 * platform share a context; nothing spans two platforms), then a small
 * MLP trained on Fashion-MNIST over all of them at once, with the
 * automatic split and the automatic reduction.
 *   mixed-vendors [DEVICES] [DATA_DIR]
 * DEVICES defaults to every device, the host and the OpenCL CPU devices
 * included (which "all" leaves out); a list such as "host,opencl:0,opencl:2"
 * picks some, and a device named twice holds two replicas. */
#include <chorus.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        if ((call) != CH_OK) {                                                   \
            fprintf(stderr, "%s: %s\n", #call, ch_last_error());                 \
            return 1;                                                            \
        }                                                                        \
    } while (0)

#define MAX_DEVICES 64
#define BATCH 64
#define STEPS 200      /* 12800 training images, a fifth of an epoch */
#define REPORT 25      /* print the loss every REPORT steps */

/* What a platform is called in the listing: OpenCL names its own; the host
 * and CUDA have none (ch_device_info.platform is ""). */
static const char *platform_of(const ch_device_info *info)
{
    if (info->platform[0])
        return info->platform;
    return strcmp(info->backend, "host") == 0 ? "(host memory)" : "(CUDA driver)";
}

static int same_platform(const ch_device_info *a, const ch_device_info *b)
{
    return strcmp(a->backend, b->backend) == 0 && strcmp(a->platform, b->platform) == 0;
}

/* Each device's share of the last batch and its time: what the automatic
 * split balances (compute time, without the waits for the others). */
static int print_shares(const ch_dp *dp, ch_device *const *devs, int n)
{
    int counts[MAX_DEVICES];
    double seconds[MAX_DEVICES], compute[MAX_DEVICES];
    CHECK(ch_dp_last_step(dp, counts, seconds, n));
    CHECK(ch_dp_last_compute(dp, compute, n));
    int total = 0;
    for (int i = 0; i < n; i++)
        total += counts[i];
    for (int i = 0; i < n; i++)
        printf("    %-10s %3d samples (%5.1f%%)  step %7.2f ms  compute %7.2f ms\n",
               ch_device_id(devs[i]), counts[i], total ? 100.0 * counts[i] / total : 0.0,
               1e3 * seconds[i], 1e3 * compute[i]);
    return 0;
}

int main(int argc, char **argv)
{
    const char *list = argc > 1 ? argv[1] : NULL;
    const char *data = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
    CHECK(ch_init());

    /* ---- Backends: a missing OpenCL loader or CUDA driver is not an error,
     * the backend is only unavailable, and says why. */
    int opencl = 0;
    printf("Backends\n");
    for (int b = 0; b < ch_backend_count(); b++) {
        ch_backend_info bi;
        CHECK(ch_backend_get_info(b, &bi));
        if (bi.available)
            printf("  %-7s %d device%s (%s)\n", bi.name, bi.device_count,
                   bi.device_count == 1 ? "" : "s", bi.detail);
        else
            printf("  %-7s unavailable: %s\n", bi.name, bi.detail);
        if (strcmp(bi.name, "opencl") == 0 && bi.available && bi.device_count > 0)
            opencl = 1;
    }
    if (!opencl)
        printf("  no OpenCL device: training on the devices there are\n");

    /* ---- Platforms and their devices. Every vendor's OpenCL runtime is a
     * platform of its own (AMD's, Intel's, NVIDIA's, PoCL); the devices of
     * one platform share a context. Only platforms with a device appear. */
    int count = ch_device_count();
    ch_device_info info[MAX_DEVICES];
    if (count > MAX_DEVICES)
        count = MAX_DEVICES;
    for (int i = 0; i < count; i++) {
        ch_device *dev;
        CHECK(ch_device_get(&dev, i));
        CHECK(ch_device_get_info(dev, &info[i]));
    }
    printf("\nPlatforms and devices\n");
    for (int i = 0; i < count; i++) {
        int seen = 0; /* this platform was listed with an earlier device */
        for (int j = 0; j < i; j++)
            seen |= same_platform(&info[i], &info[j]);
        if (seen)
            continue;
        printf("  %s: %s\n", info[i].backend, platform_of(&info[i]));
        for (int j = i; j < count; j++)
            if (same_platform(&info[i], &info[j]))
                printf("    %-10s %-52.52s %-22.22s %6.1f GiB%s\n", info[j].id, info[j].name,
                       info[j].vendor, (double)info[j].memory_bytes / (1 << 30),
                       info[j].in_all ? "" : "  (not in \"all\")");
    }

    /* ---- Which pairs copy device to device: "yes" inside a platform (one
     * context), "no" across platforms and backends (through host memory). */
    printf("\nPeer access (device to device, one context)\n  %-10s", "from \\ to");
    for (int j = 0; j < count; j++)
        printf(j + 1 < count ? " %-9s" : " %s", info[j].id);
    printf("\n");
    for (int i = 0; i < count; i++) {
        ch_device *a;
        CHECK(ch_device_get(&a, i));
        printf("  %-10s", info[i].id);
        for (int j = 0; j < count; j++) {
            ch_device *b;
            CHECK(ch_device_get(&b, j));
            printf(j + 1 < count ? " %-9s" : " %s",
                   i == j ? "-" : ch_device_can_peer(a, b) ? "yes" : "no");
        }
        printf("\n");
    }

    /* ---- The devices to train on: every device by index (ch_device_get),
     * since "all" leaves out the OpenCL CPU devices, or the list given. */
    ch_device *devs[MAX_DEVICES];
    int n = 0;
    if (list) {
        CHECK(ch_device_list_parse_replicas(devs, MAX_DEVICES, &n, list));
    } else {
        for (n = 0; n < count; n++)
            CHECK(ch_device_get(&devs[n], n));
    }

    /* ---- How the automatic reduction groups them. ch_dp makes its reducer
     * (chorus/reduce.h) over the same devices with the same mode, so one of
     * our own, over the devices' default streams and with no capacity (no
     * staging allocated), shows its groups: peer reduction inside each
     * group, the groups' first members summed in pinned host memory. */
    ch_stream *streams[MAX_DEVICES];
    for (int i = 0; i < n; i++)
        CHECK(ch_device_default_stream(&streams[i], devs[i]));
    ch_reducer *grouping;
    CHECK(ch_reducer_new(&grouping, streams, n, 0, CH_REDUCE_AUTO));
    int ngroups = ch_reducer_group_count(grouping);
    printf("\nTraining on %d device%s; reduction %s: %d group%s\n", n, n == 1 ? "" : "s",
           ch_reduce_mode_name(ch_reducer_mode(grouping)), ngroups, ngroups == 1 ? "" : "s");
    for (int g = 0; g < ngroups; g++) {
        printf("  group %d:", g);
        for (int i = 0; i < n; i++)
            if (ch_reducer_group(grouping, i) == g)
                printf(" %s", ch_device_id(devs[i]));
        printf("\n");
    }
    if (n == 1)
        printf("  one device: nothing to reduce\n");
    else if (ngroups == 1)
        printf("  one group: device to device only, no host staging\n");
    else
        printf("  device to device inside each group, through pinned host memory between\n");
    ch_reducer_free(grouping);

    /* ---- Data: the first STEPS batches' worth of Fashion-MNIST. */
    ch_dataset *full, *train, *full_test, *test;
    CHECK(ch_dataset_mnist_open(&full, data, 1, NULL));
    CHECK(ch_dataset_mnist_open(&full_test, data, 0, NULL));
    CHECK(ch_dataset_head(&train, full, (int64_t)STEPS * BATCH));
    CHECK(ch_dataset_head(&test, full_test, 2000));

    /* ---- A small MLP: Flatten, Linear(784, 256), ReLU, Linear(256, 10). */
    ch_module *model, *layer;
    CHECK(ch_nn_sequential(&model));
    CHECK(ch_nn_flatten(&layer));
    CHECK(ch_nn_sequential_add(model, layer));
    CHECK(ch_nn_linear(&layer, 784, 256));
    CHECK(ch_nn_sequential_add(model, layer));
    CHECK(ch_nn_activation(&layer, CH_ACT_RELU));
    CHECK(ch_nn_sequential_add(model, layer));
    CHECK(ch_nn_linear(&layer, 256, 10));
    CHECK(ch_nn_sequential_add(model, layer));
    CHECK(ch_module_init(model, 42));

    ch_dp_options o = {0};
    o.reduce = CH_REDUCE_AUTO;     /* peer inside each platform, host between */
    o.split = CH_DP_SPLIT_AUTO;    /* shares follow each device's measured speed */
    o.bucket_bytes = 256 << 10;    /* small buckets: reduced while backward runs */
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f);
    o.sample_ndim = ch_dataset_sample_shape(train, o.sample_shape);
    o.seed = 42;
    ch_dp *dp;
    CHECK(ch_dp_new(&dp, model, devs, n, &o)); /* a replica and a worker per device */
    printf("  ch_dp: reduction %s, %d gradient bucket%s\n",
           ch_reduce_mode_name(ch_dp_reduce_mode(dp)), ch_dp_bucket_count(dp),
           ch_dp_bucket_count(dp) == 1 ? "" : "s");

    /* Batches in host memory pinned for the first device that is not the
     * host (the one most uploads go to); any device can read them. */
    ch_loader_options lo = {.batch_size = BATCH, .shuffle = 1, .seed = 42, .workers = 2,
                            .prefetch = 4, .world = 1, .pin_for = devs[0]};
    for (int i = 0; i < n; i++)
        if (strcmp(ch_device_id(devs[i]), "host") != 0) {
            lo.pin_for = devs[i];
            break;
        }
    ch_loader *loader;
    CHECK(ch_loader_new(&loader, train, &lo));
    CHECK(ch_loader_start(loader, 0, 0));

    /* ---- Training: the loss averaged over every REPORT steps goes down;
     * the shares settle after the first steps (the first is not measured:
     * it compiles kernels). */
    printf("\nTraining %d steps of %d images\n", STEPS, BATCH);
    double start = ch_clock_seconds(), since = start, sum = 0;
    int steps = 0;
    for (;;) {
        ch_batch *b;
        CHECK(ch_loader_next(loader, &b));
        if (!b)
            break;
        float loss;
        CHECK(ch_dp_step(dp, &loss, b, 1e-3f)); /* split, forward, backward, reduce, step */
        ch_loader_release(loader, b);
        sum += loss;
        steps++;
        if (steps % REPORT == 0) {
            double now = ch_clock_seconds();
            printf("  step %4d  loss %.4f  %6.0f images/s\n", steps, sum / REPORT,
                   REPORT * BATCH / (now - since));
            sum = 0;
            since = now;
        }
        if (steps == REPORT) {
            printf("  shares of step %d:\n", steps);
            if (print_shares(dp, devs, n))
                return 1;
        }
    }
    printf("  shares of the last step:\n");
    if (print_shares(dp, devs, n))
        return 1;
    ch_loader_free(loader);

    /* ---- Evaluation over the same replicas. */
    lo.batch_size = 250;
    lo.shuffle = 0;
    CHECK(ch_loader_new(&loader, test, &lo));
    CHECK(ch_loader_start(loader, 0, 0));
    int64_t correct = 0, seen = 0;
    for (;;) {
        ch_batch *b;
        CHECK(ch_loader_next(loader, &b));
        if (!b)
            break;
        int64_t right;
        CHECK(ch_dp_evaluate(dp, NULL, &right, b));
        correct += right;
        seen += b->count;
        ch_loader_release(loader, b);
    }
    printf("test accuracy %.4f over %lld images, %.1f s in all\n",
           (double)correct / (double)seen, (long long)seen, ch_clock_seconds() - start);

    ch_loader_free(loader);
    ch_dp_free(dp);
    ch_module_free(model);
    ch_dataset_free(train);
    ch_dataset_free(test);
    ch_dataset_free(full);
    ch_dataset_free(full_test);
    ch_shutdown();
    return 0;
}
