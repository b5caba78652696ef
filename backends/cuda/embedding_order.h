/* The embedding backward's order, in the C that both CUDA and the host
 * compile, so that tests/test-embedding-order.c checks here, without a GPU,
 * the logic attention.cu runs.
 *
 * ops.h promises dtable[v, :] += the sum of dy[i, :] over the positions i
 * with idx[i] == v, added in increasing i starting from 0, then added to
 * dtable. The CUDA backend gets that order in work proportional to the
 * batch's tokens, not to the table: each position becomes a (key,
 * position) pair, key = the index, or v for an index outside [0, v) so
 * that those sort after every row and are left out; a stable sort by key
 * (CUB's radix sort is stable) puts each row's positions together in
 * increasing order, a run; then one thread per (sorted position, column)
 * that starts a run sums the run's dy rows in that order and adds the sum
 * to its row. Threads of positions that start no run return at once. */
#ifndef CHORUS_CUDA_EMBEDDING_ORDER_H
#define CHORUS_CUDA_EMBEDDING_ORDER_H

#include <stdint.h>

#ifdef __CUDACC__
#define CHEO_FN static inline __host__ __device__
#else
#define CHEO_FN static inline
#endif

/* The sort key of index `index` into a table of v rows (v < 2^32 - 1). */
CHEO_FN uint32_t cheo_key(int32_t index, int64_t v)
{
    return index >= 0 && index < v ? (uint32_t)index : (uint32_t)v;
}

/* The bits a key of a table of v rows needs (keys go up to v): the radix
 * sort looks at no more. */
CHEO_FN int cheo_key_bits(int64_t v)
{
    int bits = 1;
    while (bits < 32 && ((int64_t)1 << bits) <= v)
        bits++;
    return bits;
}

/* 1 when sorted position i begins the run of a row of the table. */
CHEO_FN int cheo_run_start(const uint32_t *keys, int64_t i, int64_t v)
{
    return keys[i] < v && (i == 0 || keys[i - 1] != keys[i]);
}

/* Column j's sum over the run that starts at sorted position i: the dy rows
 * of its positions (pos, sorted with keys) in increasing position. */
CHEO_FN float cheo_run_sum(const uint32_t *keys, const int32_t *pos, const float *dy, int64_t n,
                           int64_t d, int64_t i, int64_t j)
{
    float sum = 0.0f;
    for (int64_t k = i; k < n && keys[k] == keys[i]; k++)
        sum += dy[(int64_t)pos[k] * d + j];
    return sum;
}

#endif
