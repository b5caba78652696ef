/* Train the reference cnn on Fashion-MNIST data parallel over a list of
 * devices for one epoch, then evaluate over the same replicas: PyTorch's
 * DistributedDataParallel, any mix of devices, in one process or, under
 * mpirun, in every process of the job (each on its own DEVICES, the batch
 * being the whole job's; rank 0 prints).
 *   train-data-parallel [DEVICES] [DATA_DIR]      (DEVICES default "all")
 *   mpirun -np 2 train-data-parallel host */
#include <chorus.h>
#include <stdio.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        if ((call) != CH_OK) {                                                   \
            fprintf(stderr, "%s: %s\n", #call, ch_last_error());                 \
            return 1;                                                            \
        }                                                                        \
    } while (0)

/* One pass of a loader over the dp: training steps, or evaluation. */
static int rank; /* this process's in an MPI job, 0 alone */

static int run_epoch(ch_dp *dp, ch_loader *loader, int train, int64_t *correct, int64_t *seen)
{
    ch_batch *b;
    CHECK(ch_loader_start(loader, 0, 0));
    for (;;) {
        CHECK(ch_loader_next(loader, &b));
        if (!b)
            return 0;
        float loss = 0;
        int64_t right = 0;
        if (train)
            CHECK(ch_dp_step(dp, &loss, b, 1e-3f)); /* split, forward, backward, reduce, step */
        else
            CHECK(ch_dp_evaluate(dp, &loss, &right, b));
        *correct += right;
        *seen += b->count;
        if (train && b->number % 200 == 0 && rank == 0)
            printf("batch %4lld  loss %.4f\n", (long long)b->number, loss);
        ch_loader_release(loader, b);
    }
}

int main(int argc, char **argv)
{
    const char *list = argc > 1 ? argv[1] : "all";
    const char *data = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
    ch_device *devs[16];
    int n = 0;
    ch_dataset *train, *test;
    ch_module *model;
    /* Started by mpirun: join the job (alone, the job is this process). */
    if (ch_dist_launched())
        CHECK(ch_dist_init(&argc, &argv));
    rank = ch_dist_rank(ch_dist_world());
    CHECK(ch_init());
    CHECK(ch_device_list_parse(devs, 16, &n, list));
    CHECK(ch_dataset_mnist_open(&train, data, 1, NULL));
    CHECK(ch_dataset_mnist_open(&test, data, 0, NULL));

    CHECK(ch_nn_preset(&model, "cnn"));
    CHECK(ch_module_init(model, 42));
    ch_dp_options o = {0};
    o.reduce = CH_REDUCE_AUTO;      /* peer inside each backend, host across */
    o.split = CH_DP_SPLIT_AUTO;     /* shares follow each device's measured speed */
    o.loss = CH_LOSS_CROSS_ENTROPY;
    o.optimizer = ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f);
    o.sample_ndim = ch_dataset_sample_shape(train, o.sample_shape);
    o.seed = 42;
    o.dist = ch_dist_world();       /* NULL alone; under mpirun, every process's replicas */
    ch_dp *dp;
    CHECK(ch_dp_new(&dp, model, devs, n, &o)); /* a replica and a worker per device */

    ch_loader_options lo = {.batch_size = 64, .shuffle = 1, .seed = 42, .workers = 2,
                            .prefetch = 4, .world = 1, .pin_for = devs[0]};
    ch_loader *loader;
    int64_t correct = 0, seen = 0;
    CHECK(ch_loader_new(&loader, train, &lo));
    if (run_epoch(dp, loader, 1, &correct, &seen))
        return 1;
    ch_loader_free(loader);

    int counts[16];
    CHECK(ch_dp_last_step(dp, counts, NULL, n));
    for (int i = 0; i < n; i++)
        printf("rank %d: %s took %d samples of the last batch\n", rank, ch_device_id(devs[i]),
               counts[i]);

    lo.batch_size = 256;
    lo.shuffle = 0;
    CHECK(ch_loader_new(&loader, test, &lo));
    correct = seen = 0;
    if (run_epoch(dp, loader, 0, &correct, &seen))
        return 1;
    if (rank == 0) /* the counts of the whole job */
        printf("test accuracy %.4f over %lld images\n", (double)correct / (double)seen,
               (long long)seen);

    CHECK(ch_dp_sync_to(dp, model)); /* the trained parameters back into `model` */
    ch_loader_free(loader);
    ch_dp_free(dp);
    ch_module_free(model);
    ch_dataset_free(train);
    ch_dataset_free(test);
    ch_shutdown();
    ch_dist_finalize();
    return 0;
}
