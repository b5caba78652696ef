/* BatchNorm2d and LayerNorm. BatchNorm's statistics go through the tree's
 * sync function when data parallelism set one (nn_set_sync): the sums of
 * every replica are added before they are used, so that a data-parallel
 * step normalises with the whole batch's statistics. */
#include "config.h"

#include <stdio.h>

#include "nn.h"

enum { BN_S0, BN_M0, BN_R0, BN_S, BN_MEAN, BN_RSTD, BN_G, BN_GT };

/* Weights 1, biases 0, running mean 0, running variance 1, no batches. */
static ch_status norm_init(ch_module *m, uint64_t seed, uint64_t *offset)
{
    (void)seed;
    for (int i = 0; i < m->nparams; i++) {
        TRY(ch_fill(m->params[i].value, i == 0 ? 1.0 : 0.0));
        *offset += (uint64_t)ch_tensor_numel(m->params[i].value);
    }
    for (int i = 0; i < m->nbufs; i++)
        if (m->bufs[i].value)
            TRY(ch_fill(m->bufs[i].value, i == 0 ? 0.0 : 1.0));
    m->batches = 0;
    return CH_OK;
}

static ch_status channels(ch_tensor **t, ch_module *m, int64_t n)
{
    return nn_ensure(t, m->dev, CH_F32, 1, &n);
}

/* Sum `t` over the replicas, when there are. */
static ch_status sync_sums(ch_module *m, ch_tensor *t)
{
    return m->sync ? m->sync(m->sync_user, t) : CH_OK;
}

/* The batch's mean and rstd, in two passes: a first mean, then the spread
 * around it, which keeps the variance of channels with a large mean. */
static ch_status bn_batch_stats(ch_module *m, const ch_tensor *x)
{
    ch_tensor **t = m->tmp;
    int64_t c = m->in;
    for (int i = BN_S0; i <= BN_RSTD; i++)
        TRY(channels(&t[i], m, i == BN_S0 || i == BN_S ? 2 * c + 1 : c));
    TRY(ch_channel_sums(t[BN_S0], x, NULL, x, NULL));
    TRY(sync_sums(m, t[BN_S0]));
    TRY(ch_batchnorm_stats(t[BN_M0], t[BN_R0], NULL, NULL, t[BN_S0], NULL, m->momentum, m->eps));
    TRY(ch_channel_sums(t[BN_S], x, t[BN_M0], x, t[BN_M0]));
    TRY(sync_sums(m, t[BN_S]));
    TRY(ch_batchnorm_stats(t[BN_MEAN], t[BN_RSTD], m->bufs[0].value, m->bufs[1].value, t[BN_S],
                           t[BN_M0], m->momentum, m->eps));
    m->batches++;
    return CH_OK;
}

static ch_status bn_forward(ch_module *m, const ch_tensor *x)
{
    int nd = ch_tensor_ndim(x);
    if (nd < 2 || ch_tensor_dim(x, 1) != m->in)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: BatchNorm2d(%lld) got %d dimensions "
                         "with %lld channels", (long long)m->in, nd,
                         (long long)(nd >= 2 ? ch_tensor_dim(x, 1) : 0));
    if (m->training && m->replaying) {
        /* A recomputing segment's forward again: the statistics of its
         * first forward, kept (m->keep), are the ones backward needs;
         * taking them again would exchange them across the replicas again
         * and move the running statistics twice. */
        if (!m->tmp[BN_MEAN] || !m->tmp[BN_RSTD])
            return chi_error(CH_ERR_STATE,
                             "ch_module_backward: BatchNorm2d kept no batch statistics to reuse");
    } else if (m->training) {
        TRY(bn_batch_stats(m, x));
    } else {
        TRY(channels(&m->tmp[BN_MEAN], m, m->in));
        TRY(channels(&m->tmp[BN_RSTD], m, m->in));
        TRY(ch_batchnorm_stats(m->tmp[BN_MEAN], m->tmp[BN_RSTD], m->bufs[0].value,
                               m->bufs[1].value, NULL, NULL, m->momentum, m->eps));
    }
    int64_t shape[CH_MAX_DIMS];
    nn_shape(x, shape);
    TRY(nn_ensure(&m->y, m->dev, CH_F32, nd, shape));
    return ch_batchnorm_forward(m->y, x, m->tmp[BN_MEAN], m->tmp[BN_RSTD], m->params[0].value,
                                m->params[1].value);
}

static ch_status bn_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!m->training)
        return chi_error(CH_ERR_STATE, "ch_module_backward: BatchNorm2d's backward needs the "
                         "batch statistics of a forward in training mode");
    ch_tensor **t = m->tmp;
    TRY(channels(&t[BN_G], m, 2 * m->in + 1));
    TRY(ch_channel_sums(t[BN_G], dy, NULL, m->x, t[BN_MEAN]));
    const ch_tensor *total = t[BN_G];
    if (m->sync) {
        TRY(channels(&t[BN_GT], m, 2 * m->in + 1));
        TRY(ch_copy(t[BN_GT], t[BN_G]));
        TRY(sync_sums(m, t[BN_GT]));
        total = t[BN_GT];
    }
    if (want_dx) {
        int64_t shape[CH_MAX_DIMS];
        nn_shape(m->x, shape);
        TRY(nn_ensure(&m->dx, m->dev, CH_F32, ch_tensor_ndim(m->x), shape));
    }
    TRY(nn_grad_settle(&m->params[0])); /* accumulated into */
    TRY(nn_grad_settle(&m->params[1]));
    return ch_batchnorm_backward(want_dx ? m->dx : NULL, m->params[0].grad, m->params[1].grad,
                                 dy, m->x, t[BN_MEAN], t[BN_RSTD], m->params[0].value, t[BN_G],
                                 total);
}

static ch_status ln_forward(ch_module *m, const ch_tensor *x)
{
    int nd = ch_tensor_ndim(x);
    if (ch_tensor_dim(x, -1) != m->in)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: LayerNorm(%lld) got a last dimension "
                         "of %lld", (long long)m->in, (long long)ch_tensor_dim(x, -1));
    int64_t shape[CH_MAX_DIMS], rows = ch_tensor_numel(x) / m->in;
    nn_shape(x, shape);
    TRY(nn_ensure(&m->y, m->dev, CH_F32, nd, shape));
    TRY(channels(&m->tmp[0], m, rows));
    TRY(channels(&m->tmp[1], m, rows));
    if (m->res) { /* a GPT block's: the residual's add first, in one pass */
        if (ch_tensor_numel(m->res) != ch_tensor_numel(x))
            return chi_error(CH_ERR_SHAPE,
                             "ch_module_forward: LayerNorm(%lld): the residual "
                             "has %lld elements, x %lld",
                             (long long)m->in, (long long)ch_tensor_numel(m->res),
                             (long long)ch_tensor_numel(x));
        TRY(nn_ensure(&m->aux, m->dev, CH_F32, nd, shape));
        return ch_add_layernorm(m->aux, m->y, m->tmp[0], m->tmp[1], m->res, x, m->params[0].value,
                                m->params[1].value, m->eps);
    }
    nn_release(&m->aux);
    return ch_layernorm(m->y, m->tmp[0], m->tmp[1], x, m->params[0].value, m->params[1].value,
                        m->eps);
}

static ch_status ln_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    /* The input forward normalised: x, or the sum it made (aux). dx in
     * its format; with dres, the sum's gradient: dres + the norm's. */
    const ch_tensor *in = m->aux ? m->aux : m->x;
    if (want_dx || m->dres) {
        int64_t shape[CH_MAX_DIMS];
        nn_shape(in, shape);
        TRY(nn_ensure(&m->dx, m->dev, ch_tensor_dtype(in), ch_tensor_ndim(in), shape));
    }
    TRY(nn_grad_settle(&m->params[0])); /* accumulated into */
    TRY(nn_grad_settle(&m->params[1]));
    if (m->dres)
        return ch_layernorm_backward_add(m->dx, m->params[0].grad, m->params[1].grad, dy, m->dres,
                                         in, m->tmp[0], m->tmp[1], m->params[0].value);
    return ch_layernorm_backward(want_dx ? m->dx : NULL, m->params[0].grad, m->params[1].grad, dy,
                                 in, m->tmp[0], m->tmp[1], m->params[0].value);
}

static const nn_ops bn_ops = {"BatchNorm2d", bn_forward, bn_backward, CH_F32, 0, norm_init, 0};
/* LayerNorm takes x in a half format too (its y stays f32, as autocast's
 * layer_norm gives it; dx in x's format). */
static const nn_ops ln_ops = {"LayerNorm", ln_forward, ln_backward, CH_F32, 0, norm_init, 1};

static ch_status check_norm(const char *fn, ch_module **out, int64_t n, float eps)
{
    if (out)
        *out = NULL;
    if (n < 1 || !(eps > 0.0f))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %lld features, eps %g: expected >= 1 "
                         "and > 0", fn, (long long)n, eps);
    return CH_OK;
}

ch_status ch_nn_batchnorm2d(ch_module **out, int64_t channels_, float eps, float momentum)
{
    TRY(check_norm("ch_nn_batchnorm2d", out, channels_, eps));
    if (!(momentum >= 0.0f && momentum <= 1.0f))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_batchnorm2d: momentum %g, expected "
                         "0 <= momentum <= 1", momentum);
    TRY(nn_module_new(out, &bn_ops));
    ch_module *m = *out;
    m->in = m->out = channels_;
    m->eps = eps;
    m->momentum = momentum;
    m->keep = 1u << BN_MEAN | 1u << BN_RSTD;
    ch_status st = nn_add_param(m, "weight", 1, &m->in);
    if (st == CH_OK)
        st = nn_add_param(m, "bias", 1, &m->in);
    if (st == CH_OK)
        st = nn_add_buffer(m, "running_mean", m->in, 0.0);
    if (st == CH_OK)
        st = nn_add_buffer(m, "running_var", m->in, 1.0);
    if (st == CH_OK)
        st = nn_add_buffer(m, "num_batches_tracked", 0, 0.0);
    if (st == CH_OK)
        st = norm_init(m, 0, &(uint64_t){0});
    return nn_made(out, st);
}

ch_status ch_nn_layernorm(ch_module **out, int64_t features, float eps)
{
    TRY(check_norm("ch_nn_layernorm", out, features, eps));
    TRY(nn_module_new(out, &ln_ops));
    ch_module *m = *out;
    m->in = m->out = features;
    m->eps = eps;
    ch_status st = nn_add_param(m, "weight", 1, &m->in);
    if (st == CH_OK)
        st = nn_add_param(m, "bias", 1, &m->in);
    if (st == CH_OK)
        st = norm_init(m, 0, &(uint64_t){0});
    return nn_made(out, st);
}
