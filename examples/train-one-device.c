/* Train the reference cnn on Fashion-MNIST on one device for one epoch:
 * model.to(device), a data loader, loss, backward, optimizer step.
 *   train-one-device [DEVICE] [DATA_DIR] */
#include <chorus.h>
#include <stdio.h>

#define CHECK(call)                                                              \
    do {                                                                         \
        if ((call) != CH_OK) {                                                   \
            fprintf(stderr, "%s: %s\n", #call, ch_last_error());                 \
            return 1;                                                            \
        }                                                                        \
    } while (0)

int main(int argc, char **argv)
{
    const char *name = argc > 1 ? argv[1] : "host";
    const char *data = argc > 2 ? argv[2] : "/usr/share/datasets/fashion-mnist";
    ch_device *dev;
    ch_dataset *train;
    ch_module *model;
    ch_loss *loss;
    ch_optimizer *opt;
    ch_loader *loader;
    CHECK(ch_init());
    CHECK(ch_device_by_name(&dev, name));
    CHECK(ch_dataset_mnist_open(&train, data, 1, NULL));

    CHECK(ch_nn_preset(&model, "cnn"));
    CHECK(ch_module_init(model, 42));
    CHECK(ch_module_to(model, dev)); /* model.to(device) */
    CHECK(ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY));
    ch_optimizer_options oo = ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f);
    CHECK(ch_optimizer_new(&opt, model, &oo));
    ch_loader_options lo = {.batch_size = 64, .shuffle = 1, .seed = 42, .workers = 2,
                            .prefetch = 4, .world = 1, .pin_for = dev};
    CHECK(ch_loader_new(&loader, train, &lo));

    int64_t xs[4] = {64, 1, 28, 28}, ls[1] = {64};
    ch_tensor *x, *labels, *y, *lv, *dy;
    CHECK(ch_tensor_new(&x, dev, CH_F32, 4, xs));
    CHECK(ch_tensor_new(&labels, dev, CH_I32, 1, ls));
    CHECK(ch_loader_start(loader, 0, 0));
    ch_batch *b;
    float l = 0;
    for (;;) {
        CHECK(ch_loader_next(loader, &b));
        if (!b || b->count < 64) /* the short last batch is skipped here */
            break;
        CHECK(ch_tensor_upload_async(x, b->images, 0));
        CHECK(ch_tensor_upload_async(labels, b->labels, 0));
        CHECK(ch_module_zero_grad(model));
        CHECK(ch_module_forward(model, &y, x));
        CHECK(ch_loss_forward(loss, &lv, y, labels));
        CHECK(ch_loss_backward(loss, &dy, 1.0f));
        CHECK(ch_module_backward(model, NULL, dy));
        CHECK(ch_optimizer_step(opt, 1e-3f));
        if (b->number % 100 == 0) {
            CHECK(ch_tensor_download(lv, &l, sizeof l));
            printf("batch %4lld  loss %.4f\n", (long long)b->number, l);
        }
        ch_loader_release(loader, b);
    }
    if (b)
        ch_loader_release(loader, b);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    ch_loader_free(loader);
    ch_optimizer_free(opt);
    ch_loss_free(loss);
    ch_module_free(model);
    ch_dataset_free(train);
    ch_shutdown();
    return 0;
}
