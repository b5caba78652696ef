/* Philox-4x32-10 random numbers through lib/philox.h's own functions, the
 * ones the host and the OpenCL kernels run. */
#include <math.h>
#include "common.cuh"
#include "philox.h"

template <ch_rand_kind K>
__global__ void rand_kernel(float *y, int64_t n, uint64_t seed, uint64_t offset, float a, float b)
{
    static_assert(K >= CH_RAND_UNIFORM && K <= CH_RAND_DROPOUT, "a kind this file draws");
    CHCU_FOR_EACH(i, n)
    {
        uint64_t index = offset + (uint64_t)i;
        if (K == CH_RAND_UNIFORM)
            y[i] = chi_philox_uniform(seed, index, a, b);
        else if (K == CH_RAND_NORMAL)
            y[i] = chi_philox_normal(seed, index, a, b);
        else
            y[i] = chi_philox_dropout(seed, index, a, b); /* b = 1 / (1 - p) */
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
    switch (kind) {
    case CH_RAND_UNIFORM:
        rand_kernel<CH_RAND_UNIFORM><<<grid, CHCU_THREADS, 0, s->s>>>(py, n, seed, offset, a, b);
        break;
    case CH_RAND_NORMAL:
        rand_kernel<CH_RAND_NORMAL><<<grid, CHCU_THREADS, 0, s->s>>>(py, n, seed, offset, a, b);
        break;
    case CH_RAND_DROPOUT:
        rand_kernel<CH_RAND_DROPOUT><<<grid, CHCU_THREADS, 0, s->s>>>(py, n, seed, offset, a,
                                                                      1.0f / (1.0f - a));
        break;
    default:
        return chi_unknown_enum("cuda", "rand", "ch_rand_kind", (int)kind, CH_RAND_COUNT);
    }
    return chcu_launched("rand_kernel");
}
