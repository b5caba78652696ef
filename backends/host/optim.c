/* Host optimizer updates, one fused pass per parameter tensor, with
 * PyTorch's formulas in PyTorch's order (torch.optim.SGD and Adam/AdamW,
 * single-tensor path), in float as PyTorch computes them. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>

#include "host.h"

/* The momentum buffer's new value; m is unused when momentum is 0. */
static float sgd_direction(float g, float *m, const ch_sgd_params *s, int first_step)
{
    if (s->momentum == 0.0f)
        return g;
    *m = first_step ? g : s->momentum * *m + (1.0f - s->dampening) * g;
    return s->nesterov ? g + s->momentum * *m : *m;
}

ch_status chi_host_sgd_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,
                            const ch_sgd_params *params, int first_step)
{
    (void)stream;
    ch_sgd_params s = *params;
    float *pp = chi_host_f32(p);
    float *pm = s.momentum != 0.0f ? chi_host_f32(m) : NULL;
    const float *pg = chi_host_f32(g);
    CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
    for (int64_t i = 0; i < n; i++) {
        float gi = pg[i] + s.weight_decay * pp[i];
        float d = sgd_direction(gi, pm ? pm + i : NULL, &s, first_step);
        pp[i] -= s.lr * d;
    }
    return CH_OK;
}

ch_status chi_host_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v,
                             ch_bmem g, const ch_adam_params *params)
{
    (void)stream;
    ch_adam_params a = *params;
    double t = (double)a.step;
    float step_size = (float)(a.lr / (1.0 - pow(a.beta1, t)));
    float bc2_sqrt = (float)sqrt(1.0 - pow(a.beta2, t));
    float decay = a.decoupled ? 1.0f - a.lr * a.weight_decay : 1.0f;
    float l2 = a.decoupled ? 0.0f : a.weight_decay;
    float *pp = chi_host_f32(p), *pm = chi_host_f32(m), *pv = chi_host_f32(v);
    const float *pg = chi_host_f32(g);
    CHI_OMP(omp parallel for simd if (parallel: n > CHI_HOST_PAR_MIN))
    for (int64_t i = 0; i < n; i++) {
        float gi = pg[i] + l2 * pp[i];
        float pi = pp[i] * decay;
        pm[i] = a.beta1 * pm[i] + (1.0f - a.beta1) * gi;
        pv[i] = a.beta2 * pv[i] + (1.0f - a.beta2) * gi * gi;
        float denom = sqrtf(pv[i]) / bc2_sqrt + a.eps;
        pp[i] = pi - step_size * pm[i] / denom;
    }
    return CH_OK;
}
