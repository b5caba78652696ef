/* Fused optimizer updates: PyTorch's SGD (momentum, dampening, weight decay,
 * nesterov) and Adam / AdamW, one pass over each parameter. */
#include <math.h>
#include "common.cuh"

__global__ void sgd_kernel(float *p, float *m, const float *g, int64_t n, ch_sgd_params hp,
                           int first_step)
{
    CHCU_FOR_EACH(i, n)
    {
        float gi = g[i] + hp.weight_decay * p[i];
        float d = gi;
        if (m) {
            float mi = first_step ? gi : hp.momentum * m[i] + (1.0f - hp.dampening) * gi;
            m[i] = mi;
            d = hp.nesterov ? gi + hp.momentum * mi : mi;
        }
        p[i] -= hp.lr * d;
    }
}

ch_status chcu_sgd_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,
                        const ch_sgd_params *params, int first_step)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    float *pm = params->momentum != 0.0f && m.ptr ? chcu_at<float>(m) : NULL;
    sgd_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(p), pm, chcu_at<float>(g), n, *params, first_step);
    return chcu_launched("sgd_kernel");
}

/* The bias corrections, computed once on the host in double. */
typedef struct adam_consts {
    float lr, beta1, beta2, eps, weight_decay;
    float bc1;      /* 1 - beta1^step */
    float sqrt_bc2; /* sqrt(1 - beta2^step) */
    int decoupled;
} adam_consts;

__global__ void adam_kernel(float *p, float *m, float *v, const float *g, int64_t n,
                            adam_consts k)
{
    CHCU_FOR_EACH(i, n)
    {
        float pi = p[i], gi = g[i];
        if (k.decoupled)
            pi *= 1.0f - k.lr * k.weight_decay;
        else
            gi += k.weight_decay * pi;
        float mi = k.beta1 * m[i] + (1.0f - k.beta1) * gi;
        float vi = k.beta2 * v[i] + (1.0f - k.beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / k.sqrt_bc2 + k.eps;
        p[i] = pi - (k.lr / k.bc1) * mi / denom;
    }
}

ch_status chcu_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                         const ch_adam_params *params)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    adam_consts k;
    k.lr = params->lr;
    k.beta1 = params->beta1;
    k.beta2 = params->beta2;
    k.eps = params->eps;
    k.weight_decay = params->weight_decay;
    k.decoupled = params->decoupled;
    k.bc1 = (float)(1.0 - pow((double)params->beta1, (double)params->step));
    k.sqrt_bc2 = (float)sqrt(1.0 - pow((double)params->beta2, (double)params->step));
    adam_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(p), chcu_at<float>(m), chcu_at<float>(v), chcu_at<float>(g), n, k);
    return chcu_launched("adam_kernel");
}
