/* The reference networks of chorus-train, the examples and the benchmarks. */
#include "config.h"

#include <string.h>

#include "nn.h"

static ch_status append(ch_module *seq, ch_status st, ch_status made, ch_module *m)
{
    if (st != CH_OK) {
        ch_module_free(m);
        return st;
    }
    return made == CH_OK ? ch_nn_sequential_add(seq, m) : made;
}

/* Each ADD makes one layer and appends it, unless an earlier one failed. */
#define ADD(call)                                                                \
    do {                                                                         \
        ch_module *m_ = NULL;                                                    \
        ch_status made_ = st == CH_OK ? (call) : st;                             \
        st = append(seq, st, made_, m_);                                         \
    } while (0)

static ch_status mlp(ch_module *seq)
{
    ch_status st = CH_OK;
    ADD(ch_nn_flatten(&m_));
    ADD(ch_nn_linear(&m_, 784, 512));
    ADD(ch_nn_activation(&m_, CH_ACT_RELU));
    ADD(ch_nn_linear(&m_, 512, 512));
    ADD(ch_nn_activation(&m_, CH_ACT_RELU));
    ADD(ch_nn_linear(&m_, 512, 10));
    return st;
}

static ch_status cnn(ch_module *seq)
{
    ch_status st = CH_OK;
    ADD(ch_nn_conv2d(&m_, 1, 32, 3, 1, 1));
    ADD(ch_nn_activation(&m_, CH_ACT_RELU));
    ADD(ch_nn_maxpool2d(&m_, 2, 2));
    ADD(ch_nn_conv2d(&m_, 32, 64, 3, 1, 1));
    ADD(ch_nn_activation(&m_, CH_ACT_RELU));
    ADD(ch_nn_maxpool2d(&m_, 2, 2));
    ADD(ch_nn_flatten(&m_));
    ADD(ch_nn_linear(&m_, 3136, 128));
    ADD(ch_nn_activation(&m_, CH_ACT_RELU));
    ADD(ch_nn_linear(&m_, 128, 10));
    return st;
}

/* Append `m` under `name` unless st already failed (m is freed then). */
static ch_status add_named(ch_module *seq, ch_status st, const char *name, ch_module *m)
{
    if (st != CH_OK) {
        ch_module_free(m);
        return st;
    }
    return ch_nn_sequential_add_named(seq, name, m);
}

static ch_status conv_bn(ch_module *seq, const char *conv_name, const char *bn_name,
                         int64_t in, int64_t out, int kernel, int stride)
{
    ch_module *c = NULL, *bn = NULL;
    ch_status st = ch_nn_conv2d_nobias(&c, in, out, kernel, stride, kernel / 2);
    if (st == CH_OK)
        c->init = NN_INIT_KAIMING_OUT;
    st = add_named(seq, st, conv_name, c);
    ch_status made = st == CH_OK ? ch_nn_batchnorm2d(&bn, out, 1e-5f, 0.1f) : st;
    return add_named(seq, made, bn_name, bn);
}

/* A BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the
 * shortcut a 1x1 conv and BatchNorm ("downsample") when the shape changes. */
static ch_status basic_block(ch_module **out, int64_t in, int64_t width, int stride)
{
    ch_module *main_ = NULL, *down = NULL, *res = NULL, *relu = NULL;
    TRY(ch_nn_sequential(out));
    ch_status st = ch_nn_sequential(&main_);
    if (st == CH_OK)
        st = conv_bn(main_, "conv1", "bn1", in, width, 3, stride);
    if (st == CH_OK)
        st = ch_nn_activation(&relu, CH_ACT_RELU);
    st = add_named(main_, st, "relu", relu);
    if (st == CH_OK)
        st = conv_bn(main_, "conv2", "bn2", width, width, 3, 1);
    if (st == CH_OK && (stride != 1 || in != width)) {
        st = ch_nn_sequential(&down);
        if (st == CH_OK)
            st = conv_bn(down, "0", "1", in, width, 1, stride);
        if (st == CH_OK)
            st = ch_module_set_name(down, "downsample");
    }
    if (st == CH_OK) {
        st = ch_nn_residual(&res, main_, down);
        main_ = down = NULL;
    }
    ch_module_free(main_);
    ch_module_free(down);
    st = add_named(*out, st, "", res);
    relu = NULL;
    if (st == CH_OK)
        st = ch_nn_activation(&relu, CH_ACT_RELU);
    st = add_named(*out, st, "relu", relu);
    return nn_made(out, st);
}

static ch_status stage(ch_module *net, const char *name, int blocks, int64_t *in,
                       int64_t width, int stride)
{
    ch_module *layer = NULL, *b = NULL;
    TRY(ch_nn_sequential(&layer));
    layer->segment = 1; /* what ch_module_set_recompute recomputes */
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < blocks; i++) {
        st = basic_block(&b, *in, width, i == 0 ? stride : 1);
        if (st == CH_OK)
            st = ch_nn_sequential_add(layer, b);
        *in = width;
    }
    return add_named(net, st, name, layer);
}

ch_status ch_nn_resnet(ch_module **out, int depth, int width, int in_channels, int classes)
{
    if (out)
        *out = NULL;
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_resnet: out is NULL");
    if (depth < 8 || (depth - 2) % 6 != 0 || width < 1 || in_channels < 1 || classes < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_resnet: depth %d, width %d, %d input "
                         "channels, %d classes: expected a depth 6n + 2 >= 8 (8, 14, 20, ...) "
                         "and the others >= 1", depth, width, in_channels, classes);
    int n = (depth - 2) / 6;
    ch_module *net = NULL, *m = NULL;
    TRY(ch_nn_sequential(&net));
    int64_t in = width;
    ch_status st = conv_bn(net, "conv1", "bn1", in_channels, width, 3, 1);
    if (st == CH_OK)
        st = ch_nn_activation(&m, CH_ACT_RELU);
    st = add_named(net, st, "relu", m);
    if (st == CH_OK)
        st = stage(net, "layer1", n, &in, width, 1);
    if (st == CH_OK)
        st = stage(net, "layer2", n, &in, 2 * (int64_t)width, 2);
    if (st == CH_OK)
        st = stage(net, "layer3", n, &in, 4 * (int64_t)width, 2);
    m = NULL;
    if (st == CH_OK)
        st = ch_nn_avgpool_global(&m);
    st = add_named(net, st, "avgpool", m);
    m = NULL;
    if (st == CH_OK)
        st = ch_nn_flatten(&m);
    st = add_named(net, st, "flatten", m);
    m = NULL;
    if (st == CH_OK)
        st = ch_nn_linear(&m, 4 * (int64_t)width, classes);
    st = add_named(net, st, "fc", m);
    if (st != CH_OK) {
        ch_module_free(net);
        return st;
    }
    *out = net;
    return CH_OK;
}

ch_gpt_config ch_gpt_defaults(void)
{
    return (ch_gpt_config){.layers = 4, .heads = 4, .dim = 128, .context = 64, .vocab = 256,
                           .dropout = 0.0f};
}

ch_status ch_nn_preset(ch_module **out, const char *name)
{
    if (!out || !name)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_preset: %s is NULL",
                         !out ? "out" : "name");
    *out = NULL;
    if (strcmp(name, "resnet") == 0)
        return ch_nn_resnet(out, CH_RESNET_DEPTH, 16, 1, 10);
    if (strcmp(name, "gpt") == 0) {
        ch_gpt_config c = ch_gpt_defaults();
        return ch_nn_gpt(out, &c);
    }
    int is_mlp = strcmp(name, "mlp") == 0;
    if (!is_mlp && strcmp(name, "cnn") != 0)
        return chi_error(CH_ERR_NOT_FOUND, "ch_nn_preset: no preset named \"%s\" (mlp, cnn, "
                         "resnet or gpt)", name);
    ch_module *seq = NULL;
    TRY(ch_nn_sequential(&seq));
    ch_status st = is_mlp ? mlp(seq) : cnn(seq);
    if (st != CH_OK) {
        ch_module_free(seq);
        return st;
    }
    *out = seq;
    return CH_OK;
}
