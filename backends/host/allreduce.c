/* The host backend's all-reduce slot: the core's summing kernel
 * (chi_sum_spread) over buffers that are all plain memory. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdlib.h>

#include "host.h"

/* Host streams are synchronous: the sum is done when this returns. */
ch_status chi_host_allreduce_sum(int count, void *const *streams, const ch_bmem *bufs,
                                 int64_t n)
{
    (void)streams;
    if (count < 2 || n < 1)
        return CH_OK;
    const float **src = malloc(sizeof *src * (size_t)count);
    float **copies = malloc(sizeof *copies * (size_t)count);
    if (!src || !copies) {
        free(src);
        free(copies);
        return chi_error(CH_ERR_OUT_OF_MEMORY,
                         "host allreduce_sum: out of host memory for %d pointers", count);
    }
    for (int i = 0; i < count; i++) {
        src[i] = chi_host_f32(bufs[i]);
        copies[i] = chi_host_f32(bufs[i]);
    }
    chi_sum_spread(n, copies[0], count, src, count - 1, copies + 1);
    free(src);
    free(copies);
    return CH_OK;
}

/* Every buffer is plain memory of this process. */
int chi_host_can_allreduce(void *dev_a, void *dev_b)
{
    (void)dev_a;
    (void)dev_b;
    return 1;
}
