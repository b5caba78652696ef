/* No training step on a GPU leaves the GPU (docs/DESIGN.md, "The GPU
 * step"): a GPT step (f32 and bf16, the attention fused), a ResNet step
 * and a step of a GPT whose head size (260) is past the fused kernels' on
 * CUDA and OpenCL (its attention composed there), each forward, loss,
 * backward and an AdamW step, in f32 and bf16, on every visible device,
 * then ch_fallback_get's list for that device, which must be empty: on
 * the host, on CUDA and on OpenCL devices alike. Without a CUDA device the
 * CUDA case says so (tests/gpu/check.sh runs it on the GPU). Each step
 * also checks that its loss is finite. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

#define MAX_DEVICES 16

/* The ops ch_fallback_get lists for dev, joined into buf. */
static int fallbacks_of(const ch_device *dev, char *buf, size_t cap)
{
    int n = 0;
    buf[0] = '\0';
    for (int i = 0; i < ch_fallback_count(); i++) {
        ch_fallback_info f;
        if (ch_fallback_get(i, &f) != CH_OK || strcmp(f.device, ch_device_id(dev)) != 0)
            continue;
        size_t used = strlen(buf);
        snprintf(buf + used, cap - used, "%s%s", n ? ", " : "", f.op);
        n++;
    }
    return n;
}

/* One training step of `m` (already on dev) on input x and labels y;
 * *loss the loss's value. */
static ch_status step(ch_module *m, const ch_tensor *x, const ch_tensor *y, float *loss)
{
    ch_loss *lf = NULL;
    ch_optimizer *opt = NULL;
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, 1e-3f);
    ch_status st = ch_loss_new(&lf, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = ch_optimizer_new(&opt, m, &o);
    ch_tensor *pred = NULL, *value = NULL, *dpred = NULL, *dx = NULL;
    if (st == CH_OK)
        st = ch_module_zero_grad(m);
    if (st == CH_OK)
        st = ch_module_forward(m, &pred, x);
    if (st == CH_OK)
        st = ch_loss_forward(lf, &value, pred, y);
    if (st == CH_OK)
        st = ch_loss_backward(lf, &dpred, 1.0f);
    if (st == CH_OK)
        st = ch_module_backward(m, &dx, dpred);
    if (st == CH_OK)
        st = ch_optimizer_step(opt, 1e-3f);
    if (st == CH_OK)
        st = ch_tensor_download(value, loss, sizeof *loss);
    ch_optimizer_free(opt);
    ch_loss_free(lf);
    return st;
}

/* The model of `kind` on dev in `precision`, one step on random data. */
static ch_status train_once(ch_device *dev, const char *kind, ch_dtype precision, float *loss)
{
    ch_device *host = NULL;
    ch_status st = ch_device_get(&host, 0);
    ch_module *m = NULL;
    ch_tensor *x = NULL, *y = NULL;
    int wide = strcmp(kind, "gpt-wide") == 0, gpt = wide || strcmp(kind, "gpt") == 0;
    int64_t batch = 4, t = 32, n = gpt ? batch * t : batch;
    tap_rng rng = {42};
    if (st == CH_OK) {
        if (gpt) {
            ch_gpt_config c = ch_gpt_defaults();
            c.layers = wide ? 1 : 2;
            c.context = t;
            if (wide) {
                c.heads = 1;
                c.dim = 260;
            }
            st = ch_nn_gpt(&m, &c);
        } else {
            st = ch_nn_resnet(&m, 8, 8, 1, 10);
        }
    }
    if (st == CH_OK)
        st = ch_module_init(m, 7);
    if (st == CH_OK)
        st = ch_module_to(m, dev);
    if (st == CH_OK && precision != CH_F32)
        st = ch_module_set_precision(m, precision);
    int32_t *labels = malloc((size_t)n * sizeof *labels);
    float *images = malloc((size_t)batch * 28 * 28 * sizeof *images);
    if (!labels || !images)
        st = CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK) {
        for (int64_t i = 0; i < n; i++)
            labels[i] = (int32_t)(tap_rng_next(&rng) % (gpt ? 256 : 10));
        for (int64_t i = 0; i < batch * 28 * 28; i++)
            images[i] = tap_rng_uniform(&rng, -1, 1);
        int64_t tokens[2] = {batch, t}, img[4] = {batch, 1, 28, 28}, lab[1] = {n};
        st = gpt ? ch_tensor_new(&x, dev, CH_I32, 2, tokens)
                 : ch_tensor_new(&x, dev, CH_F32, 4, img);
        if (st == CH_OK)
            st = gpt ? ch_tensor_upload(x, labels, (size_t)n * sizeof *labels)
                     : ch_tensor_upload(x, images, (size_t)batch * 28 * 28 * sizeof *images);
        if (st == CH_OK)
            st = ch_tensor_new(&y, dev, CH_I32, 1, lab);
        if (st == CH_OK)
            st = ch_tensor_upload(y, labels, (size_t)n * sizeof *labels);
    }
    if (st == CH_OK)
        st = step(m, x, y, loss);
    free(labels);
    free(images);
    ch_tensor_free(x);
    ch_tensor_free(y);
    ch_module_free(m);
    return st;
}

int main(void)
{
    setenv("CHORUS_QUIET_FALLBACK", "1", 1);
    if (ch_init() != CH_OK) {
        tap_skip_all("ch_init: %s", ch_last_error());
        return 0;
    }
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES), cuda = 0;
    static const char *const kinds[] = {"gpt", "resnet", "gpt-wide"};
    static const ch_dtype precisions[] = {CH_F32, CH_BF16};
    for (int d = 0; d < ndev; d++) {
        ch_device_info info;
        if (!tap_status_ok(ch_device_get_info(devs[d], &info), "%s: ch_device_get_info",
                           ch_device_id(devs[d])))
            continue;
        cuda += strcmp(info.backend, "cuda") == 0;
        for (int k = 0; k < (int)(sizeof kinds / sizeof kinds[0]); k++)
            for (int p = 0; p < 2; p++) {
                float loss = NAN;
                ch_status st = train_once(devs[d], kinds[k], precisions[p], &loss);
                tap_ok(st == CH_OK && isfinite(loss), "%s: a %s %s step: %s, loss %g",
                       ch_device_id(devs[d]), ch_dtype_name(precisions[p]), kinds[k],
                       st == CH_OK ? "ran" : ch_last_error(), (double)loss);
            }
        char ops[1024];
        int n = fallbacks_of(devs[d], ops, sizeof ops);
        tap_ok(n == 0, "%s: no op of the steps ran on the host (ch_fallback_get: %d%s%s)",
               ch_device_id(devs[d]), n, n ? ": " : "", ops);
    }
    if (!cuda)
        tap_skip("no CUDA device: the steps on a GPU run in tests/gpu/check.sh");
    ch_shutdown();
    return tap_done();
}
