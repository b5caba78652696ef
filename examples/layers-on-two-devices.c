/* Model parallelism: the convolutions on one device, the classifier on
 * another; the Sequential moves activations and gradients across.
 *   layers-on-two-devices [DEVICE_A] [DEVICE_B] */
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
    ch_device *a, *b;
    ch_module *model;
    CHECK(ch_init());
    CHECK(ch_device_by_name(&a, argc > 1 ? argv[1] : "host"));
    CHECK(ch_device_by_name(&b, argc > 2 ? argv[2] : "host"));
    CHECK(ch_nn_preset(&model, "cnn"));
    CHECK(ch_module_init(model, 7));
    CHECK(ch_module_to(model, a));
    /* Layers 7..9 (Linear, ReLU, Linear) go to the second device. */
    for (int i = 7; i < ch_module_child_count(model); i++)
        CHECK(ch_module_to(ch_module_child(model, i), b));

    int64_t xs[4] = {8, 1, 28, 28}, ls[1] = {8};
    int32_t lab[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    ch_tensor *x, *labels, *y, *lv, *dy;
    ch_loss *loss;
    CHECK(ch_tensor_new(&x, a, CH_F32, 4, xs));
    CHECK(ch_rand_normal(x, 1, 0, 0.0f, 1.0f));
    CHECK(ch_tensor_new(&labels, b, CH_I32, 1, ls));
    CHECK(ch_tensor_upload(labels, lab, sizeof lab));
    CHECK(ch_loss_new(&loss, CH_LOSS_CROSS_ENTROPY));
    CHECK(ch_module_forward(model, &y, x)); /* x on a, y on b */
    CHECK(ch_loss_forward(loss, &lv, y, labels));
    CHECK(ch_loss_backward(loss, &dy, 1.0f));
    CHECK(ch_module_backward(model, NULL, dy));
    float l;
    CHECK(ch_tensor_download(lv, &l, sizeof l));
    printf("input on %s, logits on %s, loss %.4f; gradients flowed back across\n",
           ch_device_id(a), ch_device_id(ch_tensor_device(y)), l);
    ch_loss_free(loss);
    ch_tensor_free(x);
    ch_tensor_free(labels);
    ch_module_free(model);
    ch_shutdown();
    return 0;
}
