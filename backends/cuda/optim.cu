/* Fused optimizer updates: PyTorch's SGD (momentum, dampening, weight decay,
 * nesterov) and Adam / AdamW, one pass over each parameter. */
#include <math.h>
#include "common.cuh"
#include "optim_consts.h"

/* lib/kernels/optim_step.h's steps, with the scalars of lib/optim_consts.h:
 * --fmad=false keeps every multiply and add rounded on its own, and nvcc's
 * defaults (-prec-div=true, -prec-sqrt=true) round division and square
 * root correctly, so the bits are those the host and OpenCL compute. m is
 * NULL without momentum. */
__global__ void sgd_kernel(float *p, float *m, const float *g, int64_t n, chk_sgd_consts k)
{
    CHCU_FOR_EACH(i, n)
    {
        chk_sgd_state s = {p[i], m && !k.first_step ? m[i] : 0.0f};
        s = chk_sgd_step(k, s, g[i]);
        p[i] = s.p;
        if (m)
            m[i] = s.m;
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
        chcu_at<float>(p), pm, chcu_at<float>(g), n, chi_sgd_consts_of(params, first_step));
    return chcu_launched("sgd_kernel");
}

__global__ void adam_kernel(float *p, float *m, float *v, const float *g, int64_t n,
                            chk_adam_consts k)
{
    CHCU_FOR_EACH(i, n)
    {
        chk_adam_state s = {p[i], m[i], v[i]};
        s = chk_adam_step(k, s, g[i]);
        p[i] = s.p;
        m[i] = s.m;
        v[i] = s.v;
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
