/* Fused optimizer updates: PyTorch's SGD (momentum, dampening, weight decay,
 * nesterov) and Adam / AdamW, one pass over each parameter; Adam over many
 * parameters in one launch (adam_step_multi). */
#include <math.h>
#include <string.h>
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

/* Element i's step, and with `half` (1 bf16, 2 f16; 0 none) the new p
 * rounded to that format into ph as the conversion slots round it: the
 * copy of the weight the next forward's half products read, in the same
 * pass (adam_step_half). */
__device__ static inline void adam_at(float *p, float *m, float *v, const float *g, uint16_t *ph,
                                      int half, chk_adam_consts k, int64_t i)
{
    chk_adam_state s = {p[i], m[i], v[i]};
    s = chk_adam_step(k, s, g[i]);
    p[i] = s.p;
    m[i] = s.m;
    v[i] = s.v;
    if (half)
        ph[i] = half == 1 ? chk_f32_to_bf16(chk_f32_bits(s.p)) : chk_f32_to_f16(chk_f32_bits(s.p));
}

__global__ void adam_kernel(float *p, float *m, float *v, const float *g, int64_t n,
                            chk_adam_consts k, int half, uint16_t *ph)
{
    CHCU_FOR_EACH(i, n)
    adam_at(p, m, v, g, ph, half, k, i);
}

static ch_status adam_launch(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                             const ch_adam_params *params, int half, uint16_t *ph)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    adam_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<float>(p), chcu_at<float>(m), chcu_at<float>(v), chcu_at<float>(g), n,
        chi_adam_consts_of(params), half, ph);
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
    return adam_launch(stream, n, p, m, v, g, params, half == CH_BF16 ? 1 : 2,
                       chcu_at<uint16_t>(ph));
}

/* ---- adam_step_multi: up to ADAM_MULTI segments a launch ----
 * The table travels as the kernel's argument (under the 4 KiB every
 * architecture and driver takes, and captured by value in a CUDA graph):
 * no upload before the launch. Block b takes chunk b of ADAM_CHUNK
 * elements of the concatenation, each segment starting a new chunk. */
#define ADAM_MULTI 48
#define ADAM_CHUNK 4096

struct adam_multi_args {
    float *p[ADAM_MULTI], *m[ADAM_MULTI], *v[ADAM_MULTI];
    const float *g[ADAM_MULTI];
    uint16_t *ph[ADAM_MULTI];
    int64_t n[ADAM_MULTI];
    int64_t first[ADAM_MULTI + 1];  /* each segment's first chunk; [count]: the total */
    unsigned char half[ADAM_MULTI]; /* 0 none, 1 bf16, 2 f16 */
    int count;
};

static_assert(sizeof(adam_multi_args) + sizeof(chk_adam_consts) <= 4096,
              "adam_multi_kernel's arguments within 4 KiB");

__global__ void adam_multi_kernel(adam_multi_args a, chk_adam_consts k)
{
    for (int64_t c = blockIdx.x; c < a.first[a.count]; c += gridDim.x) {
        int s = 0;
        while (c >= a.first[s + 1])
            s++;
        int64_t end = (c - a.first[s] + 1) * ADAM_CHUNK;
        if (end > a.n[s])
            end = a.n[s];
        for (int64_t i = (c - a.first[s]) * ADAM_CHUNK + threadIdx.x; i < end; i += blockDim.x)
            adam_at(a.p[s], a.m[s], a.v[s], a.g[s], a.ph[s], a.half[s], k, i);
    }
}

ch_status chcu_adam_step_multi(void *stream, int count, const ch_adam_segment *segs,
                               const ch_adam_params *params)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    chk_adam_consts k = chi_adam_consts_of(params);
    for (int at = 0; at < count && !st; at += ADAM_MULTI) {
        adam_multi_args a;
        memset(&a, 0, sizeof a);
        a.count = count - at < ADAM_MULTI ? count - at : ADAM_MULTI;
        for (int i = 0; i < a.count; i++) {
            const ch_adam_segment *g = &segs[at + i];
            if (g->half != CH_F32 && g->half != CH_BF16 && g->half != CH_F16)
                return chi_error(CH_ERR_UNSUPPORTED, "cuda adam_step_multi: format %d",
                                 (int)g->half);
            a.p[i] = chcu_at<float>(g->p);
            a.m[i] = chcu_at<float>(g->m);
            a.v[i] = chcu_at<float>(g->v);
            a.g[i] = chcu_at<float>(g->g);
            a.ph[i] = g->half == CH_F32 ? NULL : chcu_at<uint16_t>(g->ph);
            a.half[i] = g->half == CH_BF16 ? 1 : g->half == CH_F16 ? 2 : 0;
            a.n[i] = g->n;
            a.first[i + 1] = a.first[i] + (g->n + ADAM_CHUNK - 1) / ADAM_CHUNK;
        }
        int64_t chunks = a.first[a.count];
        unsigned grid = (unsigned)(chunks < (1ll << 30) ? chunks : (1ll << 30));
        adam_multi_kernel<<<grid, CHCU_THREADS, 0, s->s>>>(a, k);
        st = chcu_launched("adam_multi_kernel");
    }
    return st;
}
