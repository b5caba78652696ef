/* Philox-4x32-10 random numbers through lib/philox.h's own functions, so
 * each element's bits match the host's. */
#include <math.h>
#include "common.cuh"
#include "philox.h"

#define CHCU_TWO_PI 6.28318530717958647692f

template <ch_rand_kind K>
__global__ void rand_kernel(float *y, int64_t n, uint64_t seed, uint64_t offset, float a, float b)
{
    CHCU_FOR_EACH(i, n)
    {
        uint32_t w0, w1;
        ch_philox_words(seed, offset + (uint64_t)i, &w0, &w1);
        if (K == CH_RAND_UNIFORM) {
            y[i] = a + (b - a) * ch_philox_unit(w0);
        } else if (K == CH_RAND_NORMAL) {
            float u1 = (float)((w0 >> 8) + 1u) * (1.0f / 16777216.0f);
            float u2 = ch_philox_unit(w1);
            y[i] = a + b * (sqrtf(-2.0f * logf(u1)) * cosf(CHCU_TWO_PI * u2));
        } else {
            /* b is 1 / (1 - p), computed once on the host. */
            y[i] = ch_philox_unit(w0) >= a ? b : 0.0f;
        }
    }
}

ch_status chcu_rand(void *stream, ch_rand_kind kind, int64_t n, ch_bmem y, uint64_t seed,
                    uint64_t offset, float a, float b)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    unsigned grid = chcu_grid(s->dev, n);
    float *py = chcu_at<float>(y);
    if (kind == CH_RAND_UNIFORM)
        rand_kernel<CH_RAND_UNIFORM><<<grid, CHCU_THREADS, 0, s->s>>>(py, n, seed, offset, a, b);
    else if (kind == CH_RAND_NORMAL)
        rand_kernel<CH_RAND_NORMAL><<<grid, CHCU_THREADS, 0, s->s>>>(py, n, seed, offset, a, b);
    else
        rand_kernel<CH_RAND_DROPOUT><<<grid, CHCU_THREADS, 0, s->s>>>(py, n, seed, offset, a,
                                                                      1.0f / (1.0f - a));
    return chcu_launched("rand_kernel");
}
