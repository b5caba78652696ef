/* Fused optimizer updates: PyTorch's SGD (momentum, dampening, weight decay,
 * nesterov) and Adam / AdamW, one pass over each parameter. */
#include <math.h>
#include "common.cuh"
#include "optim_consts.h"

/* Every operation rounded on its own (the _rn intrinsics are never fused
 * into FMA): the formulas of lib/optim_consts.h, bit for bit what the host
 * and OpenCL backends compute. */
__global__ void sgd_kernel(float *p, float *m, const float *g, int64_t n, ch_sgd_params hp,
                           float damp, int first_step)
{
    CHCU_FOR_EACH(i, n)
    {
        float gi = __fadd_rn(g[i], __fmul_rn(hp.weight_decay, p[i]));
        float d = gi;
        if (m) {
            float mi = first_step ? gi
                                  : __fadd_rn(__fmul_rn(hp.momentum, m[i]), __fmul_rn(damp, gi));
            m[i] = mi;
            d = hp.nesterov ? __fadd_rn(gi, __fmul_rn(hp.momentum, mi)) : mi;
        }
        p[i] = __fsub_rn(p[i], __fmul_rn(hp.lr, d));
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
        chcu_at<float>(p), pm, chcu_at<float>(g), n, *params, chi_sgd_damp(params), first_step);
    return chcu_launched("sgd_kernel");
}

__global__ void adam_kernel(float *p, float *m, float *v, const float *g, int64_t n,
                            chi_adam_consts k)
{
    CHCU_FOR_EACH(i, n)
    {
        float w = p[i];
        float gi = __fadd_rn(g[i], __fmul_rn(k.l2, w));
        float pi = __fmul_rn(w, k.decay);
        float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_minus_beta1, gi));
        float vi = __fadd_rn(__fmul_rn(k.beta2, v[i]),
                             __fmul_rn(__fmul_rn(k.one_minus_beta2, gi), gi));
        m[i] = mi;
        v[i] = vi;
        float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
        p[i] = __fsub_rn(pi, __fdiv_rn(__fmul_rn(k.step_size, mi), denom));
    }
}

ch_status chcu_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                         const ch_adam_params *params)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    adam_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(p), chcu_at<float>(m), chcu_at<float>(v), chcu_at<float>(g), n,
        chi_adam_consts_of(params));
    return chcu_launched("adam_kernel");
}
