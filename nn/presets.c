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

ch_status ch_nn_preset(ch_module **out, const char *name)
{
    if (!out || !name)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_preset: %s is NULL",
                         !out ? "out" : "name");
    *out = NULL;
    int is_mlp = strcmp(name, "mlp") == 0;
    if (!is_mlp && strcmp(name, "cnn") != 0)
        return chi_error(CH_ERR_NOT_FOUND, "ch_nn_preset: no preset named \"%s\" (mlp or cnn)",
                         name);
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
