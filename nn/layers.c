/* The plain layers: Linear, Conv2d, activations, MaxPool2d, global average
 * pooling, Flatten and Dropout, each an explicit forward and backward over
 * the core's ops. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"

static ch_status need_ndim(const ch_module *m, const ch_tensor *x, int ndim)
{
    if (ch_tensor_ndim(x) != ndim)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: %s expects %d dimensions, got %d",
                         m->ops->kind, ndim, ch_tensor_ndim(x));
    return CH_OK;
}

/* ---- Linear -------------------------------------------------------------- */

/* x [..., in] -> y [..., out]: the leading dimensions are rows. */
static ch_status rows_view(ch_tensor **out, const ch_tensor *t, int64_t cols)
{
    int64_t shape[2] = {ch_tensor_numel(t) / cols, cols};
    return nn_view(out, t, 2, shape);
}

static ch_status linear_forward(ch_module *m, const ch_tensor *x)
{
    int nd = ch_tensor_ndim(x);
    if (nd < 2)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: Linear expects at least 2 "
                         "dimensions, got %d", nd);
    if (ch_tensor_dim(x, -1) != m->in)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: Linear(%lld, %lld) got %lld features",
                         (long long)m->in, (long long)m->out, (long long)ch_tensor_dim(x, -1));
    int64_t shape[CH_MAX_DIMS];
    nn_shape(x, shape);
    shape[nd - 1] = m->out;
    /* Mixed precision: x (unless the module before wrote it so) and the
     * weight rounded to the half format (tmp[0], kept for backward, and
     * tmp[1]); y in f32 (nn_gemm_out). */
    TRY(nn_ensure(&m->y, m->dev, nn_gemm_out(m), nd, shape));
    const ch_tensor *xh, *wh;
    TRY(nn_half(&m->tmp[0], m, x, &xh));
    TRY(nn_half_weight(&m->tmp[1], m, &m->params[0], &wh));
    ch_tensor *x2 = NULL, *y2 = NULL;
    ch_status st = rows_view(&x2, xh, m->in);
    if (st == CH_OK)
        st = rows_view(&y2, m->y, m->out);
    if (st == CH_OK)
        st = m->nparams > 1 ? ch_gemm_bias(y2, 0, 1, 1.0f, x2, wh, m->params[1].value)
                            : ch_gemm(y2, 0, 1, 1.0f, x2, wh, 0.0f);
    ch_tensor_free(x2);
    ch_tensor_free(y2);
    return st;
}

static ch_status linear_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    /* Mixed precision: the GEMMs take forward's rounded x and weight and
     * dy rounded (tmp[2]: unless it came in the half format, as it does
     * for a half output); the bias gradient sums dy in f32. dx in x's
     * format. */
    const ch_tensor *xh = m->precision == CH_F32 || ch_tensor_dtype(m->x) == m->precision
                              ? m->x
                              : m->tmp[0],
                    *wh = m->precision == CH_F32 ? m->params[0].value : m->tmp[1], *dyh;
    TRY(nn_half(&m->tmp[2], m, dy, &dyh));
    ch_tensor *x2 = NULL, *dy2 = NULL, *dyh2 = NULL, *dx2 = NULL;
    ch_status st = rows_view(&x2, xh, m->in);
    if (st == CH_OK)
        st = rows_view(&dy2, dy, m->out);
    if (st == CH_OK)
        st = rows_view(&dyh2, dyh, m->out);
    if (st == CH_OK)
        st = ch_gemm(m->params[0].grad, 1, 0, 1.0f, dyh2, x2, nn_grad_beta(&m->params[0]));
    if (st == CH_OK && m->nparams > 1)
        st = ch_bias_grad(m->params[1].grad, dy2, 1, nn_grad_beta(&m->params[1]));
    if (st == CH_OK && want_dx) {
        int64_t shape[CH_MAX_DIMS];
        nn_shape(m->x, shape);
        st = nn_ensure(&m->dx, m->dev, ch_tensor_dtype(m->x), ch_tensor_ndim(m->x), shape);
        if (st == CH_OK)
            st = rows_view(&dx2, m->dx, m->in);
        if (st == CH_OK)
            st = ch_gemm(dx2, 0, 0, 1.0f, dyh2, wh, 0.0f);
    }
    ch_tensor_free(x2);
    ch_tensor_free(dy2);
    ch_tensor_free(dyh2);
    ch_tensor_free(dx2);
    nn_release(&m->tmp[2]); /* dy rounded: read */
    return st;
}

/* ---- Conv2d ----------------------------------------------------------------
 * ch_conv2d and its backward: the backend's own convolution where it has
 * one (the host's, sample by sample), im2col and a GEMM otherwise. */

static ch_window2d conv_window(const ch_module *m)
{
    return (ch_window2d){m->kernel, m->kernel, m->stride, m->stride, m->padding, m->padding};
}

static ch_status conv_forward(ch_module *m, const ch_tensor *x)
{
    TRY(need_ndim(m, x, 4));
    if (ch_tensor_dim(x, 1) != m->in)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: Conv2d(%lld, %lld) got %lld channels",
                         (long long)m->in, (long long)m->out, (long long)ch_tensor_dim(x, 1));
    int64_t n = ch_tensor_dim(x, 0), h = ch_tensor_dim(x, 2), w = ch_tensor_dim(x, 3);
    if (h + 2 * m->padding < m->kernel || w + 2 * m->padding < m->kernel)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: Conv2d kernel %d is larger than the "
                         "padded input %lldx%lld", m->kernel, (long long)(h + 2 * m->padding),
                         (long long)(w + 2 * m->padding));
    int64_t oh = (h + 2 * m->padding - m->kernel) / m->stride + 1;
    int64_t ow = (w + 2 * m->padding - m->kernel) / m->stride + 1;
    int64_t y_shape[4] = {n, m->out, oh, ow};
    ch_window2d win = conv_window(m);
    TRY(nn_ensure(&m->y, m->dev, CH_F32, 4, y_shape));
    /* Mixed precision: x and the weight rounded to the half format (tmp[0]
     * and tmp[1], kept for backward), f32 sums into an f32 y. */
    const ch_tensor *xh, *wh;
    TRY(nn_half(&m->tmp[0], m, x, &xh));
    TRY(nn_half_weight(&m->tmp[1], m, &m->params[0], &wh));
    TRY(ch_conv2d(m->y, xh, wh, &win));
    if (m->nparams > 1)
        TRY(ch_bias_add(m->y, m->y, m->params[1].value, 1));
    return CH_OK;
}

static ch_status conv_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (m->nparams > 1)
        TRY(ch_bias_grad(m->params[1].grad, dy, 1, nn_grad_beta(&m->params[1])));
    if (want_dx) {
        int64_t x_shape[4];
        nn_shape(m->x, x_shape);
        TRY(nn_ensure(&m->dx, m->dev, CH_F32, 4, x_shape)); /* the convolution's */
    }
    ch_window2d win = conv_window(m);
    int half = m->precision != CH_F32;
    const ch_tensor *xh = !half || ch_tensor_dtype(m->x) == m->precision ? m->x : m->tmp[0];
    const ch_tensor *dyh;
    TRY(nn_half(&m->tmp[2], m, dy, &dyh));
    ch_status st = ch_conv2d_backward(want_dx ? m->dx : NULL, m->params[0].grad, dyh, xh,
                                      half ? m->tmp[1] : m->params[0].value, &win,
                                      nn_grad_beta(&m->params[0]));
    nn_release(&m->tmp[2]); /* dy rounded: read */
    return st;
}

/* ---- Activations ------------------------------------------------------------ */

static ch_status act_forward(ch_module *m, const ch_tensor *x)
{
    int64_t shape[CH_MAX_DIMS];
    nn_shape(x, shape);
    /* y, and dx, in x's format (autocast's activations keep theirs) */
    TRY(nn_ensure(&m->y, m->dev, ch_tensor_dtype(x), ch_tensor_ndim(x), shape));
    return ch_activation_forward(m->y, x, m->act);
}

static ch_status act_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!want_dx)
        return CH_OK;
    int64_t shape[CH_MAX_DIMS];
    nn_shape(dy, shape);
    TRY(nn_ensure(&m->dx, m->dev, ch_tensor_dtype(m->x), ch_tensor_ndim(dy), shape));
    return ch_activation_backward(m->dx, dy, m->x, m->y, m->act);
}

/* ---- MaxPool2d ---------------------------------------------------------------- */

static ch_status pool_forward(ch_module *m, const ch_tensor *x)
{
    TRY(need_ndim(m, x, 4));
    int64_t h = ch_tensor_dim(x, 2), w = ch_tensor_dim(x, 3);
    if (h < m->kernel || w < m->kernel)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: MaxPool2d kernel %d is larger than "
                         "the input %lldx%lld", m->kernel, (long long)h, (long long)w);
    int64_t shape[4] = {ch_tensor_dim(x, 0), ch_tensor_dim(x, 1), (h - m->kernel) / m->stride + 1,
                        (w - m->kernel) / m->stride + 1};
    ch_window2d win = {m->kernel, m->kernel, m->stride, m->stride, 0, 0};
    TRY(nn_ensure(&m->y, m->dev, CH_F32, 4, shape));
    TRY(nn_ensure(&m->aux, m->dev, CH_I32, 4, shape));
    return ch_maxpool2d(m->y, m->aux, x, &win);
}

static ch_status pool_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!want_dx)
        return CH_OK;
    int64_t shape[4];
    nn_shape(m->x, shape);
    ch_window2d win = {m->kernel, m->kernel, m->stride, m->stride, 0, 0};
    TRY(nn_ensure(&m->dx, m->dev, CH_F32, 4, shape));
    return ch_maxpool2d_backward(m->dx, dy, m->aux, &win);
}

/* ---- Flatten ----------------------------------------------------------------- */

static ch_status flatten_forward(ch_module *m, const ch_tensor *x)
{
    int64_t shape[2] = {ch_tensor_dim(x, 0), ch_tensor_numel(x) / ch_tensor_dim(x, 0)};
    ch_tensor_free(m->y);
    m->y = NULL;
    return nn_view(&m->y, x, 2, shape);
}

static ch_status flatten_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!want_dx)
        return CH_OK;
    int64_t shape[CH_MAX_DIMS];
    nn_shape(m->x, shape);
    ch_tensor_free(m->dx);
    m->dx = NULL;
    return nn_view(&m->dx, dy, ch_tensor_ndim(m->x), shape);
}

/* ---- Dropout ------------------------------------------------------------------ */

/* Each (seed, step, layer) gets a stream of its own. */
uint64_t nn_dropout_key(const ch_module *m, uint64_t salt)
{
    uint64_t k = m->seed ^ 0x9E3779B97F4A7C15ull * (uint64_t)(m->step + 1);
    return k ^ ((uint64_t)(m->layer + 1) << 48) ^ (salt << 40);
}

/* With p 0 or in evaluation the identity: y a view of x and dx of dy, as
 * Flatten's, no copy (a GPT's copies of [B, T, C] ran on one thread, two
 * a layer a step); otherwise y and dx of their own (views left from such
 * a pass let go first, never written into). */
static ch_status dropout_forward(ch_module *m, const ch_tensor *x)
{
    int64_t shape[CH_MAX_DIMS];
    nn_shape(x, shape);
    int ndim = ch_tensor_ndim(x);
    int pass = !m->training || m->p == 0.0f;
    if (pass || m->passed) {
        nn_release(&m->y);
        nn_release(&m->dx);
    }
    m->passed = pass;
    if (pass)
        return nn_view(&m->y, x, ndim, shape);
    TRY(nn_ensure(&m->y, m->dev, ch_tensor_dtype(x), ndim, shape)); /* x's format */
    int64_t per_sample = ch_tensor_numel(x) / shape[0];
    TRY(nn_ensure(&m->aux, m->dev, CH_F32, ndim, shape));
    TRY(ch_dropout_mask(m->aux, nn_dropout_key(m, 0), (uint64_t)(m->first_sample * per_sample), m->p));
    return ch_mul(m->y, x, m->aux);
}

static ch_status dropout_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!want_dx)
        return CH_OK;
    int64_t shape[CH_MAX_DIMS];
    nn_shape(dy, shape);
    if (m->passed) {
        nn_release(&m->dx);
        return nn_view(&m->dx, dy, ch_tensor_ndim(dy), shape);
    }
    TRY(nn_ensure(&m->dx, m->dev, ch_tensor_dtype(m->x), ch_tensor_ndim(dy), shape));
    return ch_mul(m->dx, dy, m->aux);
}

/* ---- Global average pooling ------------------------------------------------ */

/* [N, C, H, W] -> [N, C, 1, 1], as AdaptiveAvgPool2d(1). */
static ch_status avgpool_forward(ch_module *m, const ch_tensor *x)
{
    TRY(need_ndim(m, x, 4));
    int64_t shape[4] = {ch_tensor_dim(x, 0), ch_tensor_dim(x, 1), 1, 1};
    TRY(nn_ensure(&m->y, m->dev, CH_F32, 4, shape));
    return ch_avgpool_global(m->y, x);
}

static ch_status avgpool_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!want_dx)
        return CH_OK;
    int64_t shape[4];
    nn_shape(m->x, shape);
    TRY(nn_ensure(&m->dx, m->dev, CH_F32, 4, shape));
    return ch_avgpool_global_backward(m->dx, dy);
}

/* ---- Construction ---------------------------------------------------------- */

static const nn_ops linear_ops = {"Linear", linear_forward, linear_backward, CH_F32, 0, NULL, 1};
static const nn_ops conv_ops = {"Conv2d", conv_forward, conv_backward, CH_F32, 0, NULL, 1};
static const nn_ops relu_ops = {"ReLU", act_forward, act_backward, CH_F32, 0, NULL, 1};
static const nn_ops gelu_ops = {"GELU", act_forward, act_backward, CH_F32, 0, NULL, 1};
static const nn_ops tanh_ops = {"Tanh", act_forward, act_backward, CH_F32, 0, NULL, 1};
static const nn_ops sigmoid_ops = {"Sigmoid", act_forward, act_backward, CH_F32, 0, NULL, 1};
/* PyTorch's GELU(approximate='tanh'): the same class, so the same kind */
static const nn_ops gelu_tanh_ops = {"GELU", act_forward, act_backward, CH_F32, 0, NULL, 1};
static const nn_ops pool_ops = {"MaxPool2d", pool_forward, pool_backward, CH_F32, 0, NULL, 0};
static const nn_ops avgpool_ops = {
    "AdaptiveAvgPool2d", avgpool_forward, avgpool_backward, CH_F32, 0, NULL, 0};
static const nn_ops flatten_ops = {"Flatten", flatten_forward, flatten_backward, CH_F32, 0, NULL,
                                   1};
static const nn_ops dropout_ops = {"Dropout", dropout_forward, dropout_backward, CH_F32, 0, NULL,
                                   1};

ch_status ch_nn_linear(ch_module **out, int64_t in_features, int64_t out_features)
{
    if (in_features < 1 || out_features < 1) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_nn_linear: %lld in and %lld out features, expected both >= 1",
                         (long long)in_features, (long long)out_features);
    }
    TRY(nn_module_new(out, &linear_ops));
    ch_module *m = *out;
    m->in = in_features;
    m->out = out_features;
    int64_t w[2] = {out_features, in_features};
    ch_status st = nn_add_param(m, "weight", 2, w);
    if (st == CH_OK)
        st = nn_add_param(m, "bias", 1, &m->out);
    return nn_made(out, st);
}

static ch_status conv2d(ch_module **out, int64_t in_channels, int64_t out_channels, int kernel,
                        int stride, int padding, int bias)
{
    if (in_channels < 1 || out_channels < 1 || kernel < 1 || stride < 1 || padding < 0) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_nn_conv2d: channels %lld -> %lld, kernel %d, stride %d, padding %d: "
                         "expected channels, kernel, stride >= 1 and padding >= 0",
                         (long long)in_channels, (long long)out_channels, kernel, stride, padding);
    }
    TRY(nn_module_new(out, &conv_ops));
    ch_module *m = *out;
    m->in = in_channels;
    m->out = out_channels;
    m->kernel = kernel;
    m->stride = stride;
    m->padding = padding;
    int64_t w[4] = {out_channels, in_channels, kernel, kernel};
    ch_status st = nn_add_param(m, "weight", 4, w);
    if (st == CH_OK && bias)
        st = nn_add_param(m, "bias", 1, &m->out);
    return nn_made(out, st);
}

ch_status ch_nn_conv2d(ch_module **out, int64_t in_channels, int64_t out_channels, int kernel,
                       int stride, int padding)
{
    return conv2d(out, in_channels, out_channels, kernel, stride, padding, 1);
}

ch_status ch_nn_conv2d_nobias(ch_module **out, int64_t in_channels, int64_t out_channels,
                              int kernel, int stride, int padding)
{
    return conv2d(out, in_channels, out_channels, kernel, stride, padding, 0);
}

ch_status ch_nn_activation(ch_module **out, ch_activation act)
{
    static const nn_ops *const by_act[] = {&relu_ops, &gelu_ops, &tanh_ops, &sigmoid_ops,
                                           &gelu_tanh_ops};
    _Static_assert(sizeof by_act / sizeof *by_act == CH_ACT_COUNT,
                   "a module for every ch_activation");
    if ((int)act < 0 || act >= CH_ACT_COUNT) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_activation: act %d is not a "
                         "ch_activation", (int)act);
    }
    TRY(nn_module_new(out, by_act[act]));
    (*out)->act = act;
    return CH_OK;
}

ch_status ch_nn_maxpool2d(ch_module **out, int kernel, int stride)
{
    if (kernel < 1 || stride < 1) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_nn_maxpool2d: kernel %d, stride %d, expected both >= 1", kernel,
                         stride);
    }
    TRY(nn_module_new(out, &pool_ops));
    (*out)->kernel = kernel;
    (*out)->stride = stride;
    return CH_OK;
}

ch_status ch_nn_avgpool_global(ch_module **out) { return nn_module_new(out, &avgpool_ops); }

ch_status ch_nn_flatten(ch_module **out) { return nn_module_new(out, &flatten_ops); }

ch_status ch_nn_dropout(ch_module **out, float p)
{
    if (!(p >= 0.0f && p < 1.0f)) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_dropout: p %g, expected 0 <= p < 1", p);
    }
    TRY(nn_module_new(out, &dropout_ops));
    (*out)->p = p;
    return CH_OK;
}
