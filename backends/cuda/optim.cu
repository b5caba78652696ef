/* Fused optimizer updates: PyTorch's SGD (momentum, dampening, weight decay,
 * nesterov) and Adam / AdamW, one pass over each parameter. */
#include <math.h>
#include "common.cuh"
#include "optim_consts.h"
#include "kernels/half_bits.h"

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

/* The step, and where ph is not NULL the new p rounded to the half format
 * (bf16 when bf16, f16 otherwise) as the conversion slots round it: the
 * copy of the weight the next forward's half products read, in the same
 * pass (adam_step_half). */
__global__ void adam_kernel(float *p, float *m, float *v, const float *g, int64_t n,
                            chk_adam_consts k, int bf16, uint16_t *ph)
{
    CHCU_FOR_EACH(i, n)
    {
        chk_adam_state s = {p[i], m[i], v[i]};
        s = chk_adam_step(k, s, g[i]);
        p[i] = s.p;
        m[i] = s.m;
        v[i] = s.v;
        if (ph)
            ph[i] = bf16 ? chk_f32_to_bf16(chk_f32_bits(s.p)) : chk_f32_to_f16(chk_f32_bits(s.p));
    }
}

static ch_status adam_launch(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                             const ch_adam_params *params, int bf16, uint16_t *ph)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    adam_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(p), chcu_at<float>(m), chcu_at<float>(v), chcu_at<float>(g), n,
        chi_adam_consts_of(params), bf16, ph);
    return chcu_launched("adam_kernel");
}

ch_status chcu_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                         const ch_adam_params *params)
{
    return adam_launch(stream, n, p, m, v, g, params, 0, NULL);
}

ch_status chcu_adam_step_half(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                              const ch_adam_params *params, int half, ch_bmem ph)
{
    if (half != CH_BF16 && half != CH_F16)
        return chi_error(CH_ERR_UNSUPPORTED, "cuda adam_step_half: format %d", half);
    return adam_launch(stream, n, p, m, v, g, params, half == CH_BF16, chcu_at<uint16_t>(ph));
}
