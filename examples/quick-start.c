/* The README's example: the reference cnn's forward pass over a batch of 64
 * blank 28x28 images on one device. Every call returns a ch_status, CH_OK
 * (0) on success; ch_last_error() names the call that failed, its argument
 * and the problem.
 *   quick-start [DEVICE]   (default host; opencl:0, cuda:0, ...) */
#include <chorus.h>
#include <stdio.h>

int main(int argc, char **argv)
{
    static float images[64 * 28 * 28], logits[64 * 10];
    int64_t shape[4] = {64, 1, 28, 28};
    ch_device *dev;
    ch_module *model = NULL;
    ch_tensor *x = NULL, *y;
    if (ch_init() || ch_device_by_name(&dev, argc > 1 ? argv[1] : "host") ||
        ch_nn_preset(&model, "cnn") || ch_module_init(model, 42) || ch_module_to(model, dev) ||
        ch_tensor_new(&x, dev, CH_F32, 4, shape) || ch_tensor_upload(x, images, sizeof images) ||
        ch_module_forward(model, &y, x) || ch_tensor_download(y, logits, sizeof logits)) {
        fprintf(stderr, "quick-start: %s\n", ch_last_error());
        return 1;
    }
    printf("cnn on %s: logits %lldx%lld, the first %.6f\n", ch_device_id(dev),
           (long long)ch_tensor_dim(y, 0), (long long)ch_tensor_dim(y, 1), logits[0]);
    ch_tensor_free(x);
    ch_module_free(model);
    ch_shutdown();
    return 0;
}
