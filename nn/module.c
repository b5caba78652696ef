/* Modules: Linear, Conv2d, activations, MaxPool2d, Flatten, Dropout and
 * Sequential, each an explicit forward and backward over the core's ops. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"

static int same_shape(const ch_tensor *t, ch_device *dev, ch_dtype dtype, int ndim,
                      const int64_t *shape)
{
    if (!t || ch_tensor_device(t) != dev || ch_tensor_dtype(t) != dtype ||
        ch_tensor_ndim(t) != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (ch_tensor_dim(t, i) != shape[i])
            return 0;
    return 1;
}

ch_status nn_ensure(ch_tensor **t, ch_device *dev, ch_dtype dtype, int ndim,
                    const int64_t *shape)
{
    if (same_shape(*t, dev, dtype, ndim, shape))
        return CH_OK;
    ch_tensor_free(*t);
    *t = NULL;
    return ch_tensor_new(t, dev, dtype, ndim, shape);
}

ch_status nn_view(ch_tensor **out, const ch_tensor *t, int ndim, const int64_t *shape)
{
    /* A reshape only reads the layout; the const is dropped for the API. */
    return ch_tensor_reshape(out, (ch_tensor *)t, ndim, shape);
}

static void shape_of(const ch_tensor *t, int64_t *shape)
{
    for (int i = 0; i < ch_tensor_ndim(t); i++)
        shape[i] = ch_tensor_dim(t, i);
}

static ch_status need_ndim(const ch_module *m, const ch_tensor *x, int ndim)
{
    if (ch_tensor_ndim(x) != ndim)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: %s expects %d dimensions, got %d",
                         m->ops->kind, ndim, ch_tensor_ndim(x));
    return CH_OK;
}

/* ---- Linear -------------------------------------------------------------- */

static ch_status linear_forward(ch_module *m, const ch_tensor *x)
{
    TRY(need_ndim(m, x, 2));
    if (ch_tensor_dim(x, 1) != m->in)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: Linear(%lld, %lld) got %lld features",
                         (long long)m->in, (long long)m->out, (long long)ch_tensor_dim(x, 1));
    int64_t shape[2] = {ch_tensor_dim(x, 0), m->out};
    TRY(nn_ensure(&m->y, m->dev, CH_F32, 2, shape));
    TRY(ch_gemm(m->y, 0, 1, 1.0f, x, m->params[0].value, 0.0f));
    return ch_bias_add(m->y, m->y, m->params[1].value, 1);
}

static ch_status linear_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    TRY(ch_gemm(m->params[0].grad, 1, 0, 1.0f, dy, m->x, 1.0f));
    TRY(ch_bias_grad(m->params[1].grad, dy, 1, 1.0f));
    if (!want_dx)
        return CH_OK;
    int64_t shape[2] = {ch_tensor_dim(dy, 0), m->in};
    TRY(nn_ensure(&m->dx, m->dev, CH_F32, 2, shape));
    return ch_gemm(m->dx, 0, 0, 1.0f, dy, m->params[0].value, 0.0f);
}

/* ---- Conv2d ----------------------------------------------------------------
 * im2col, one GEMM for the whole batch, and a transpose from [O, N, P] to
 * [N, O, P]; backward is the same in reverse. */

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
    int64_t oh = (h + 2 * m->padding - m->kernel) / m->stride + 1;
    int64_t ow = (w + 2 * m->padding - m->kernel) / m->stride + 1;
    if (h + 2 * m->padding < m->kernel || w + 2 * m->padding < m->kernel)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: Conv2d kernel %d is larger than the "
                         "padded input %lldx%lld", m->kernel, (long long)(h + 2 * m->padding),
                         (long long)(w + 2 * m->padding));
    int64_t ckk = m->in * m->kernel * m->kernel, p = oh * ow;
    int64_t col_shape[2] = {ckk, n * p}, yt_shape[2] = {m->out, n * p};
    int64_t y_shape[4] = {n, m->out, oh, ow};
    ch_window2d win = conv_window(m);
    TRY(nn_ensure(&m->aux, m->dev, CH_F32, 2, col_shape));
    TRY(nn_ensure(&m->aux2, m->dev, CH_F32, 2, yt_shape));
    TRY(nn_ensure(&m->y, m->dev, CH_F32, 4, y_shape));
    TRY(ch_im2col(m->aux, x, &win));
    int64_t w2[2] = {m->out, ckk}, yt3[3] = {m->out, n, p}, y3[3] = {n, m->out, p};
    ch_tensor *wv = NULL, *ytv = NULL, *yv = NULL;
    ch_status st = nn_view(&wv, m->params[0].value, 2, w2);
    if (st == CH_OK)
        st = ch_gemm(m->aux2, 0, 0, 1.0f, wv, m->aux, 0.0f);
    if (st == CH_OK)
        st = nn_view(&ytv, m->aux2, 3, yt3);
    if (st == CH_OK)
        st = nn_view(&yv, m->y, 3, y3);
    if (st == CH_OK)
        st = ch_transpose01(yv, ytv);
    if (st == CH_OK)
        st = ch_bias_add(m->y, m->y, m->params[1].value, 1);
    ch_tensor_free(wv);
    ch_tensor_free(ytv);
    ch_tensor_free(yv);
    return st;
}

static ch_status conv_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    int64_t n = ch_tensor_dim(dy, 0), p = ch_tensor_dim(dy, 2) * ch_tensor_dim(dy, 3);
    int64_t ckk = m->in * m->kernel * m->kernel;
    int64_t dy3[3] = {n, m->out, p}, dyt3[3] = {m->out, n, p}, w2[2] = {m->out, ckk};
    ch_tensor *dyv = NULL, *dytv = NULL, *wv = NULL, *gwv = NULL;
    TRY(ch_bias_grad(m->params[1].grad, dy, 1, 1.0f));
    ch_status st = nn_view(&dyv, dy, 3, dy3);
    if (st == CH_OK)
        st = nn_view(&dytv, m->aux2, 3, dyt3);
    if (st == CH_OK)
        st = ch_transpose01(dytv, dyv); /* aux2 now holds dy as [O, N*P] */
    if (st == CH_OK)
        st = nn_view(&gwv, m->params[0].grad, 2, w2);
    if (st == CH_OK)
        st = ch_gemm(gwv, 0, 1, 1.0f, m->aux2, m->aux, 1.0f);
    if (st == CH_OK && want_dx) {
        /* The columns are not needed any more: the input gradient's
         * columns overwrite them. */
        st = nn_view(&wv, m->params[0].value, 2, w2);
        if (st == CH_OK)
            st = ch_gemm(m->aux, 1, 0, 1.0f, wv, m->aux2, 0.0f);
        int64_t x_shape[4];
        shape_of(m->x, x_shape);
        if (st == CH_OK)
            st = nn_ensure(&m->dx, m->dev, CH_F32, 4, x_shape);
        ch_window2d win = conv_window(m);
        if (st == CH_OK)
            st = ch_col2im(m->dx, m->aux, &win);
    }
    ch_tensor_free(dyv);
    ch_tensor_free(dytv);
    ch_tensor_free(wv);
    ch_tensor_free(gwv);
    return st;
}

/* ---- Activations ------------------------------------------------------------ */

static ch_status act_forward(ch_module *m, const ch_tensor *x)
{
    int64_t shape[CH_MAX_DIMS];
    shape_of(x, shape);
    TRY(nn_ensure(&m->y, m->dev, CH_F32, ch_tensor_ndim(x), shape));
    return ch_activation_forward(m->y, x, m->act);
}

static ch_status act_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!want_dx)
        return CH_OK;
    int64_t shape[CH_MAX_DIMS];
    shape_of(dy, shape);
    TRY(nn_ensure(&m->dx, m->dev, CH_F32, ch_tensor_ndim(dy), shape));
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
    shape_of(m->x, shape);
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
    shape_of(m->x, shape);
    ch_tensor_free(m->dx);
    m->dx = NULL;
    return nn_view(&m->dx, dy, ch_tensor_ndim(m->x), shape);
}

/* ---- Dropout ------------------------------------------------------------------ */

/* Each (seed, step, layer) gets a stream of its own. */
static uint64_t dropout_key(const ch_module *m)
{
    uint64_t k = m->seed ^ 0x9E3779B97F4A7C15ull * (uint64_t)(m->step + 1);
    return k ^ ((uint64_t)(m->layer + 1) << 48);
}

static ch_status dropout_forward(ch_module *m, const ch_tensor *x)
{
    int64_t shape[CH_MAX_DIMS];
    shape_of(x, shape);
    int ndim = ch_tensor_ndim(x);
    TRY(nn_ensure(&m->y, m->dev, CH_F32, ndim, shape));
    if (!m->training || m->p == 0.0f)
        return ch_copy(m->y, x);
    int64_t per_sample = ch_tensor_numel(x) / shape[0];
    TRY(nn_ensure(&m->aux, m->dev, CH_F32, ndim, shape));
    TRY(ch_dropout_mask(m->aux, dropout_key(m), (uint64_t)(m->first_sample * per_sample), m->p));
    return ch_mul(m->y, x, m->aux);
}

static ch_status dropout_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!want_dx)
        return CH_OK;
    int64_t shape[CH_MAX_DIMS];
    shape_of(dy, shape);
    TRY(nn_ensure(&m->dx, m->dev, CH_F32, ch_tensor_ndim(dy), shape));
    if (!m->training || m->p == 0.0f)
        return ch_copy(m->dx, dy);
    return ch_mul(m->dx, dy, m->aux);
}

/* ---- Sequential ---------------------------------------------------------------- */

/* The device a child runs on: its own, or where its input is. */
static ch_device *run_device(const ch_module *c, const ch_tensor *x)
{
    return c->dev ? c->dev : ch_tensor_device(x);
}

/* `t` on `dev`: itself, or a copy kept in *slot. */
static ch_status on_device(ch_tensor **slot, const ch_tensor *t, ch_device *dev,
                           const ch_tensor **out)
{
    if (ch_tensor_device(t) == dev) {
        *out = t;
        return CH_OK;
    }
    int64_t shape[CH_MAX_DIMS];
    shape_of(t, shape);
    TRY(nn_ensure(slot, dev, ch_tensor_dtype(t), ch_tensor_ndim(t), shape));
    TRY(ch_copy(*slot, t));
    *out = *slot;
    return CH_OK;
}

static int count_params(const ch_module *m);
static ch_status module_forward(ch_module *m, const ch_tensor *x);
static ch_status module_backward(ch_module *m, const ch_tensor *dy, int want_dx);

static ch_status seq_forward(ch_module *m, const ch_tensor *x)
{
    const ch_tensor *cur = x;
    for (int i = 0; i < m->nchild; i++) {
        ch_module *c = m->child[i];
        TRY(on_device(&m->moved[i], cur, run_device(c, cur), &cur));
        TRY(module_forward(c, cur));
        cur = c->y;
    }
    /* The Sequential's output is its last child's; y is a view of it. */
    int64_t shape[CH_MAX_DIMS];
    shape_of(cur, shape);
    ch_tensor_free(m->y);
    m->y = NULL;
    return nn_view(&m->y, cur, ch_tensor_ndim(cur), shape);
}

static ch_status seq_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    /* Child i's input gradient is needed when the caller wants dx or a
     * child before it has parameters; otherwise (the first Linear of an
     * mlp, behind a Flatten) it would be computed for nothing. */
    int first = 0;
    while (first < m->nchild && ch_module_param_count(m->child[first]) == 0)
        first++;
    const ch_tensor *g = dy;
    int after = m->hook ? count_params(m) : 0; /* parameters past child i */
    for (int i = m->nchild - 1; i >= 0; i--) {
        ch_module *c = m->child[i];
        TRY(on_device(&m->moved_grad[i], g, ch_tensor_device(c->y), &g));
        int need = want_dx || i > first;
        TRY(module_backward(c, g, need));
        int np = m->hook ? count_params(c) : 0;
        after -= np;
        if (np > 0)
            TRY(m->hook(m->hook_user, after, np));
        if (!need)
            return CH_OK;
        g = c->dx;
    }
    /* dx on the input's device, as the caller expects. */
    if (m->nchild == 0 || !want_dx)
        return CH_OK;
    const ch_tensor *out = NULL;
    TRY(on_device(&m->moved_grad[m->nchild], g, ch_tensor_device(m->x), &out));
    int64_t shape[CH_MAX_DIMS];
    shape_of(out, shape);
    ch_tensor_free(m->dx);
    m->dx = NULL;
    return nn_view(&m->dx, out, ch_tensor_ndim(out), shape);
}

/* ---- Common ---------------------------------------------------------------------- */

static const nn_ops linear_ops = {"Linear", linear_forward, linear_backward};
static const nn_ops conv_ops = {"Conv2d", conv_forward, conv_backward};
static const nn_ops relu_ops = {"ReLU", act_forward, act_backward};
static const nn_ops gelu_ops = {"GELU", act_forward, act_backward};
static const nn_ops tanh_ops = {"Tanh", act_forward, act_backward};
static const nn_ops sigmoid_ops = {"Sigmoid", act_forward, act_backward};
static const nn_ops pool_ops = {"MaxPool2d", pool_forward, pool_backward};
static const nn_ops flatten_ops = {"Flatten", flatten_forward, flatten_backward};
static const nn_ops dropout_ops = {"Dropout", dropout_forward, dropout_backward};
static const nn_ops seq_ops = {"Sequential", seq_forward, seq_backward};

static ch_status module_forward(ch_module *m, const ch_tensor *x)
{
    if (!m->dev)
        m->dev = ch_tensor_device(x);
    if (ch_tensor_device(x) != m->dev && m->ops != &seq_ops)
        return chi_error(CH_ERR_DEVICE_MISMATCH, "ch_module_forward: %s is on %s but x is on %s",
                         m->ops->kind, ch_device_id(m->dev), ch_device_id(ch_tensor_device(x)));
    if (ch_tensor_dtype(x) != CH_F32)
        return chi_error(CH_ERR_DTYPE, "ch_module_forward: x is %s, expected f32",
                         ch_dtype_name(ch_tensor_dtype(x)));
    m->x = x;
    return m->ops->forward(m, x);
}

static ch_status module_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!m->x || !m->y)
        return chi_error(CH_ERR_STATE, "ch_module_backward: %s has no forward pass to go back "
                         "through", m->ops->kind);
    if (ch_tensor_numel(dy) != ch_tensor_numel(m->y) || ch_tensor_dtype(dy) != CH_F32)
        return chi_error(CH_ERR_SHAPE, "ch_module_backward: dy has %lld elements, the output "
                         "had %lld", (long long)ch_tensor_numel(dy),
                         (long long)ch_tensor_numel(m->y));
    if (ch_tensor_device(dy) != ch_tensor_device(m->y))
        return chi_error(CH_ERR_DEVICE_MISMATCH, "ch_module_backward: dy is on %s but the "
                         "output is on %s", ch_device_id(ch_tensor_device(dy)),
                         ch_device_id(ch_tensor_device(m->y)));
    return m->ops->backward(m, dy, want_dx);
}

ch_status ch_module_forward(ch_module *m, ch_tensor **y, const ch_tensor *x)
{
    if (!m || !y || !x)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_forward: %s is NULL",
                         !m ? "m" : !y ? "y" : "x");
    *y = NULL;
    TRY(module_forward(m, x));
    *y = m->y;
    return CH_OK;
}

ch_status ch_module_backward(ch_module *m, ch_tensor **dx, const ch_tensor *dy)
{
    if (!m || !dy)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_backward: %s is NULL",
                         !m ? "m" : "dy");
    if (dx)
        *dx = NULL;
    TRY(module_backward(m, dy, dx != NULL));
    if (dx)
        *dx = m->dx;
    return CH_OK;
}

static ch_status module_alloc(ch_module **out, const nn_ops *ops)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_%s: out is NULL", ops->kind);
    *out = calloc(1, sizeof **out);
    if (!*out)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_nn_%s: out of memory", ops->kind);
    (*out)->ops = ops;
    (*out)->training = 1;
    return CH_OK;
}

/* Weight and bias on the host, zero gradients beside them. */
static ch_status add_params(ch_module *m, int wdim, const int64_t *wshape)
{
    ch_device *host = NULL;
    TRY(ch_device_by_name(&host, "host"));
    int64_t bshape[1] = {m->out};
    const int64_t *shapes[2] = {wshape, bshape};
    int dims[2] = {wdim, 1};
    const char *names[2] = {"weight", "bias"};
    for (int i = 0; i < 2; i++) {
        nn_param *p = &m->params[i];
        snprintf(p->name, sizeof p->name, "%s", names[i]);
        TRY(ch_tensor_new(&p->value, host, CH_F32, dims[i], shapes[i]));
        TRY(ch_tensor_new(&p->grad, host, CH_F32, dims[i], shapes[i]));
        TRY(ch_fill(p->value, 0.0));
        TRY(ch_fill(p->grad, 0.0));
        m->nparams++;
    }
    m->dev = host;
    return CH_OK;
}

ch_status ch_nn_linear(ch_module **out, int64_t in_features, int64_t out_features)
{
    TRY(module_alloc(out, &linear_ops));
    ch_module *m = *out;
    if (in_features < 1 || out_features < 1) {
        ch_module_free(m);
        *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_nn_linear: %lld in and %lld out features, expected both >= 1",
                         (long long)in_features, (long long)out_features);
    }
    m->in = in_features;
    m->out = out_features;
    int64_t w[2] = {out_features, in_features};
    ch_status st = add_params(m, 2, w);
    if (st != CH_OK) {
        ch_module_free(m);
        *out = NULL;
    }
    return st;
}

ch_status ch_nn_conv2d(ch_module **out, int64_t in_channels, int64_t out_channels, int kernel,
                       int stride, int padding)
{
    TRY(module_alloc(out, &conv_ops));
    ch_module *m = *out;
    if (in_channels < 1 || out_channels < 1 || kernel < 1 || stride < 1 || padding < 0) {
        ch_module_free(m);
        *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_nn_conv2d: channels %lld -> %lld, kernel %d, stride %d, padding %d: "
                         "expected channels, kernel, stride >= 1 and padding >= 0",
                         (long long)in_channels, (long long)out_channels, kernel, stride, padding);
    }
    m->in = in_channels;
    m->out = out_channels;
    m->kernel = kernel;
    m->stride = stride;
    m->padding = padding;
    int64_t w[4] = {out_channels, in_channels, kernel, kernel};
    ch_status st = add_params(m, 4, w);
    if (st != CH_OK) {
        ch_module_free(m);
        *out = NULL;
    }
    return st;
}

ch_status ch_nn_activation(ch_module **out, ch_activation act)
{
    static const nn_ops *const by_act[] = {&relu_ops, &gelu_ops, &tanh_ops, &sigmoid_ops};
    _Static_assert(sizeof by_act / sizeof *by_act == CH_ACT_COUNT,
                   "a module for every ch_activation");
    if ((int)act < 0 || act >= CH_ACT_COUNT) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_activation: act %d is not a "
                         "ch_activation", (int)act);
    }
    TRY(module_alloc(out, by_act[act]));
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
    TRY(module_alloc(out, &pool_ops));
    (*out)->kernel = kernel;
    (*out)->stride = stride;
    return CH_OK;
}

ch_status ch_nn_flatten(ch_module **out) { return module_alloc(out, &flatten_ops); }

ch_status ch_nn_dropout(ch_module **out, float p)
{
    if (!(p >= 0.0f && p < 1.0f)) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_dropout: p %g, expected 0 <= p < 1", p);
    }
    TRY(module_alloc(out, &dropout_ops));
    (*out)->p = p;
    return CH_OK;
}

ch_status ch_nn_sequential(ch_module **out) { return module_alloc(out, &seq_ops); }

/* Give every parameter its state_dict name under `prefix`. */
static void name_params(ch_module *m, const char *prefix)
{
    static const char *const names[2] = {"weight", "bias"};
    for (int i = 0; i < m->nparams; i++)
        snprintf(m->params[i].name, sizeof m->params[i].name, "%s%s", prefix, names[i]);
    for (int i = 0; i < m->nchild; i++) {
        char p[64];
        snprintf(p, sizeof p, "%s%d.", prefix, i);
        m->child[i]->layer = i;
        name_params(m->child[i], p);
    }
}

ch_status ch_nn_sequential_add(ch_module *seq, ch_module *child)
{
    if (!seq || !child) {
        ch_module_free(child);
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_sequential_add: %s is NULL",
                         !seq ? "seq" : "child");
    }
    if (seq->ops != &seq_ops) {
        ch_module_free(child);
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_sequential_add: seq is a %s, not a "
                         "Sequential", seq->ops->kind);
    }
    int n = seq->nchild + 1;
    ch_module **c = realloc(seq->child, (size_t)n * sizeof *c);
    ch_tensor **mv = realloc(seq->moved, (size_t)n * sizeof *mv);
    if (mv)
        seq->moved = mv;
    ch_tensor **mg = mv ? realloc(seq->moved_grad, (size_t)(n + 1) * sizeof *mg) : NULL;
    if (c)
        seq->child = c;
    if (mg)
        seq->moved_grad = mg;
    if (!c || !mv || !mg) {
        ch_module_free(child);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_nn_sequential_add: out of memory");
    }
    seq->child[seq->nchild] = child;
    seq->moved[seq->nchild] = NULL;
    seq->moved_grad[seq->nchild] = NULL;
    seq->moved_grad[n] = NULL;
    seq->nchild = n;
    name_params(seq, "");
    return CH_OK;
}

static void free_buffers(ch_module *m)
{
    ch_tensor **ts[] = {&m->y, &m->dx, &m->aux, &m->aux2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        ch_tensor_free(*ts[i]);
        *ts[i] = NULL;
    }
    for (int i = 0; m->moved && i < m->nchild; i++) {
        ch_tensor_free(m->moved[i]);
        m->moved[i] = NULL;
    }
    for (int i = 0; m->moved_grad && i <= m->nchild; i++) {
        ch_tensor_free(m->moved_grad[i]);
        m->moved_grad[i] = NULL;
    }
    m->x = NULL;
}

void ch_module_free(ch_module *m)
{
    if (!m)
        return;
    /* Outer views first: a Sequential's y is a view of a child's. */
    free_buffers(m);
    for (int i = 0; i < m->nchild; i++)
        ch_module_free(m->child[i]);
    for (int i = 0; i < m->nparams; i++) {
        ch_tensor_free(m->params[i].value);
        ch_tensor_free(m->params[i].grad);
    }
    free(m->child);
    free(m->moved);
    free(m->moved_grad);
    free(m);
}

const char *ch_module_kind(const ch_module *m) { return m ? m->ops->kind : "(null)"; }
int ch_module_child_count(const ch_module *m) { return m ? m->nchild : 0; }
ch_module *ch_module_child(const ch_module *m, int i)
{
    return m && i >= 0 && i < m->nchild ? m->child[i] : NULL;
}

/* Parameters of the tree, in state_dict order: own, then each child's. */
static int count_params(const ch_module *m)
{
    int n = m->nparams;
    for (int i = 0; i < m->nchild; i++)
        n += count_params(m->child[i]);
    return n;
}

int ch_module_param_count(const ch_module *m) { return m ? count_params(m) : 0; }

/* Parameter *index of the tree in state_dict order, found without an
 * allocation (the optimizer asks for every parameter on every step);
 * *index is what is left past m's parameters when m has too few. */
static nn_param *find_param(const ch_module *m, int *index)
{
    if (*index < m->nparams)
        return (nn_param *)&m->params[*index];
    *index -= m->nparams;
    for (int i = 0; i < m->nchild; i++) {
        nn_param *p = find_param(m->child[i], index);
        if (p)
            return p;
    }
    return NULL;
}

static nn_param *param_at(const ch_module *m, int index)
{
    if (index < 0)
        return NULL;
    return find_param(m, &index);
}

ch_status ch_module_param(const ch_module *m, int index, const char **name, ch_tensor **value,
                          ch_tensor **grad)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_param: m is NULL");
    nn_param *p = param_at(m, index);
    if (!p)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_param: index %d out of range "
                         "(%d parameters)", index, ch_module_param_count(m));
    if (name)
        *name = p->name;
    if (value)
        *value = p->value;
    if (grad)
        *grad = p->grad;
    return CH_OK;
}

int64_t ch_module_param_numel(const ch_module *m)
{
    int64_t n = 0;
    for (int i = 0; m && i < m->nparams; i++)
        n += ch_tensor_numel(m->params[i].value);
    for (int i = 0; m && i < m->nchild; i++)
        n += ch_module_param_numel(m->child[i]);
    return n;
}

/* PyTorch's default: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias
 * (kaiming_uniform with a = sqrt(5) reduces to that bound for weights). */
static ch_status init_params(ch_module *m, uint64_t seed, uint64_t *offset)
{
    if (m->nparams) {
        int64_t fan_in = ch_tensor_numel(m->params[0].value) / m->out;
        float bound = (float)(1.0 / sqrt((double)fan_in));
        for (int i = 0; i < m->nparams; i++) {
            TRY(ch_rand_uniform(m->params[i].value, seed, *offset, -bound, bound));
            *offset += (uint64_t)ch_tensor_numel(m->params[i].value);
        }
    }
    for (int i = 0; i < m->nchild; i++)
        TRY(init_params(m->child[i], seed, offset));
    return CH_OK;
}

ch_status ch_module_init(ch_module *m, uint64_t seed)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_init: m is NULL");
    uint64_t offset = 0;
    return init_params(m, seed, &offset);
}

static ch_status move_tensor(ch_tensor **t, ch_device *dev)
{
    if (!*t || ch_tensor_device(*t) == dev)
        return CH_OK;
    ch_tensor *moved = NULL;
    TRY(ch_tensor_to(&moved, *t, dev));
    ch_tensor_free(*t);
    *t = moved;
    return CH_OK;
}

ch_status ch_module_to(ch_module *m, ch_device *dev)
{
    if (!m || !dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_to: %s is NULL", !m ? "m" : "dev");
    free_buffers(m);
    for (int i = 0; i < m->nparams; i++) {
        TRY(move_tensor(&m->params[i].value, dev));
        TRY(move_tensor(&m->params[i].grad, dev));
    }
    for (int i = 0; i < m->nchild; i++)
        TRY(ch_module_to(m->child[i], dev));
    m->dev = dev;
    return CH_OK;
}

ch_device *ch_module_device(const ch_module *m) { return m ? m->dev : NULL; }

static ch_status clone_into(ch_module **out, const ch_module *m, ch_device *dev)
{
    TRY(module_alloc(out, m->ops));
    ch_module *c = *out;
    c->in = m->in;
    c->out = m->out;
    c->kernel = m->kernel;
    c->stride = m->stride;
    c->padding = m->padding;
    c->act = m->act;
    c->p = m->p;
    c->training = m->training;
    c->layer = m->layer;
    c->dev = m->nparams || m->dev ? dev : NULL;
    for (int i = 0; i < m->nparams; i++) {
        c->params[i] = m->params[i];
        c->params[i].value = c->params[i].grad = NULL;
        c->nparams++;
        TRY(ch_tensor_to(&c->params[i].value, m->params[i].value, dev));
        TRY(ch_tensor_to(&c->params[i].grad, m->params[i].grad, dev));
    }
    for (int i = 0; i < m->nchild; i++) {
        ch_module *child = NULL;
        ch_status st = clone_into(&child, m->child[i], dev);
        TRY(ch_nn_sequential_add(c, child));
        TRY(st);
    }
    return CH_OK;
}

ch_status ch_module_clone(ch_module **out, const ch_module *m, ch_device *dev)
{
    if (!out || !m || !dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_clone: %s is NULL",
                         !out ? "out" : !m ? "m" : "dev");
    *out = NULL;
    ch_module *c = NULL;
    ch_status st = clone_into(&c, m, dev);
    if (st != CH_OK) {
        ch_module_free(c);
        return st;
    }
    *out = c;
    return CH_OK;
}

void ch_module_train(ch_module *m, int training)
{
    if (!m)
        return;
    m->training = training != 0;
    for (int i = 0; i < m->nchild; i++)
        ch_module_train(m->child[i], training);
}

void ch_module_set_rng(ch_module *m, uint64_t seed, int64_t step, int64_t first_sample)
{
    if (!m)
        return;
    m->seed = seed;
    m->step = step;
    m->first_sample = first_sample;
    for (int i = 0; i < m->nchild; i++)
        ch_module_set_rng(m->child[i], seed, step, first_sample);
}

void nn_set_grad_hook(ch_module *m, nn_grad_hook fn, void *user)
{
    if (m && m->ops == &seq_ops) {
        m->hook = fn;
        m->hook_user = user;
    }
}

/* The gradient of parameter p becomes a view of buf at *off. */
static ch_status grad_into(nn_param *p, ch_tensor *buf, int64_t *off)
{
    int64_t shape[CH_MAX_DIMS], n = ch_tensor_numel(p->grad);
    shape_of(p->grad, shape);
    ch_tensor *rows = NULL, *view = NULL;
    TRY(ch_tensor_view(&rows, buf, *off, n));
    ch_status st = ch_tensor_reshape(&view, rows, ch_tensor_ndim(p->grad), shape);
    ch_tensor_free(rows);
    if (st == CH_OK)
        st = ch_copy(view, p->grad);
    if (st != CH_OK) {
        ch_tensor_free(view);
        return st;
    }
    ch_tensor_free(p->grad);
    p->grad = view;
    *off += n;
    return CH_OK;
}

ch_status nn_grads_into(ch_module *m, int first, int count, ch_tensor *buf)
{
    int64_t need = 0, off = 0;
    for (int i = first; i < first + count; i++) {
        nn_param *p = param_at(m, i);
        if (!p)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "nn_grads_into: parameter %d out of "
                             "range (%d parameters)", i, count_params(m));
        need += ch_tensor_numel(p->grad);
    }
    if (ch_tensor_ndim(buf) != 1 || ch_tensor_numel(buf) != need)
        return chi_error(CH_ERR_SHAPE, "nn_grads_into: buf has %lld elements in %d dims, the "
                         "gradients %lld in 1", (long long)ch_tensor_numel(buf),
                         ch_tensor_ndim(buf), (long long)need);
    for (int i = first; i < first + count; i++)
        TRY(grad_into(param_at(m, i), buf, &off));
    return CH_OK;
}

ch_status ch_module_zero_grad(ch_module *m)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_zero_grad: m is NULL");
    for (int i = 0; i < m->nparams; i++)
        TRY(ch_fill(m->params[i].grad, 0.0));
    for (int i = 0; i < m->nchild; i++)
        TRY(ch_module_zero_grad(m->child[i]));
    return CH_OK;
}
