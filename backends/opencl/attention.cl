/* Attention's ops: the row softmax with its causal mask and its backward,
 * the embedding gather and its backward (permute is permute.cl). No atomics in any sum:
 * each output is summed by one work-item or one work-group in a fixed
 * order, so results are the same bits on every run. (The embedding's
 * check word is lowered with atomic_min, which only picks the first bad
 * position.) Placed after common.cl (tree_sum, tree_max). */

#pragma OPENCL FP_CONTRACT OFF

/* One work-group per row of s: y = softmax of the row's first w columns
 * (w = s, or with the causal mask the row's position in its matrix of
 * `rpm` rows plus s - rpm + 1), 0 beyond. y may be x: every element is
 * read by the work-item that writes it, and the reads of the two
 * reductions end at their barriers. */
__kernel void softmax_masked(__global float *y, ulong yo, __global const float *x, ulong xo,
                             int s, int causal, int rpm, __local float *tmp)
{
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    int w = causal ? r % rpm + s - rpm + 1 : s;
    __global const float *xr = x + xo + (long)r * s;
    __global float *yr = y + yo + (long)r * s;

    float mx, sum;
    row_max_expsum(xr, w, tmp, &mx, &sum);

    for (int j = t; j < s; j += step)
        yr[j] = j < w ? exp(xr[j] - mx) / sum : 0.0f;
}

/* One work-group per row: dx = y (dy - <dy, y>); dx may be dy. */
__kernel void softmax_masked_backward(__global float *dx, ulong dxo, __global const float *dy,
                                      ulong dyo, __global const float *y, ulong yo, int s,
                                      __local float *tmp)
{
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    __global const float *g = dy + dyo + (long)r * s, *p = y + yo + (long)r * s;
    __global float *out = dx + dxo + (long)r * s;
    float dot = 0.0f;
    for (int j = t; j < s; j += step)
        dot += g[j] * p[j];
    tmp[t] = dot;
    tree_sum(tmp);
    dot = tmp[0];
    for (int j = t; j < s; j += step)
        out[j] = p[j] * (g[j] - dot);
}

/* One work-item per element of y [n, d]: y[i, j] = table[idx[i], j], 0 for
 * an index outside [0, v), whose position lowers the check word bad[bo]. */
__kernel void embedding(__global float *y, ulong yo, __global const float *table, ulong to,
                        __global const int *idx, ulong io, int total, int v, int d,
                        __global uint *bad, ulong bo)
{
    int e = get_global_id(0);
    if (e >= total)
        return;
    int i = e / d, j = e % d, row = idx[io + i];
    if (row >= 0 && row < v) {
        y[yo + e] = table[to + row * d + j];
    } else {
        y[yo + e] = 0.0f;
        if (j == 0)
            atomic_min(bad + bo, (uint)i);
    }
}

/* ---- The embedding's backward ----------------------------------------------
 * ops.h promises dtable[v, :] += the sum of dy[i, :] over the positions i
 * with idx[i] == v, added in increasing i starting from 0. As CUDA does it
 * (backends/cuda/embedding_order.h), in work proportional to the batch:
 * each position becomes the word key << 32 | i, key = idx[i], or v for an
 * index outside [0, v) so that those sort after every row; sorting the
 * words (bitonic, over a power of two n2 >= n, the words past n all ones)
 * puts each row's positions together in increasing order, a run; then
 * the first position of each run sums the run's dy rows in that order. */

__kernel void embedding_keys(__global ulong *words, __global const int *idx, ulong io, int n,
                             int n2, int v)
{
    int i = get_global_id(0);
    if (i >= n2)
        return;
    ulong w = ~(ulong)0;
    if (i < n) {
        int r = idx[io + i];
        uint key = r >= 0 && r < v ? (uint)r : (uint)v;
        w = (ulong)key << 32 | (uint)i;
    }
    words[i] = w;
}

/* The bitonic sort's compare-exchange in stage k, stride j, of work-item
 * t of the pairs: lo and lo + j put in ascending order where lo & k is 0
 * (lo counted from the start of the words), descending elsewhere. */
int bitonic_lo(int t, int j)
{
    return 2 * j * (t / j) + t % j;
}

#define BITONIC_EXCHANGE(a, lo, j, up)         \
    do {                                       \
        ulong x = (a)[lo], y = (a)[(lo) + (j)]; \
        if ((x > y) == (up)) {                 \
            (a)[lo] = y;                       \
            (a)[(lo) + (j)] = x;               \
        }                                      \
    } while (0)

/* One stride j of stage k over the whole array: a work-item per pair. */
__kernel void bitonic_global(__global ulong *a, int pairs, int k, int j)
{
    int t = get_global_id(0);
    if (t >= pairs)
        return;
    int lo = bitonic_lo(t, j);
    BITONIC_EXCHANGE(a, lo, j, (lo & k) == 0);
}

/* A work-group of L work-items takes a chunk of 2 L words into local
 * memory: stage 0 sorts it (every stage up to 2 L, alternating directions
 * as the whole sort needs); stage k > 2 L does that stage's strides below
 * 2 L. tmp holds 2 L words. */
__kernel void bitonic_local(__global ulong *a, int stage, __local ulong *tmp)
{
    int t = get_local_id(0), l = get_local_size(0), base = get_group_id(0) * 2 * l;
    tmp[t] = a[base + t];
    tmp[t + l] = a[base + t + l];
    int last = stage ? stage : 2 * l;
    for (int k = stage ? stage : 2; k <= last; k *= 2)
        for (int j = stage ? l : k / 2; j > 0; j /= 2) {
            barrier(CLK_LOCAL_MEM_FENCE);
            int lo = bitonic_lo(t, j);
            BITONIC_EXCHANGE(tmp, lo, j, ((base + lo) & k) == 0);
        }
    barrier(CLK_LOCAL_MEM_FENCE);
    a[base + t] = tmp[t];
    a[base + t + l] = tmp[t + l];
}

/* One work-item per (sorted position k, column j) of n x d: the first of a
 * run sums the run's dy rows in increasing position and adds the sum to
 * its row; the others return at once. */
__kernel void embedding_backward(__global float *dtable, ulong dto, __global const float *dy,
                                 ulong dyo, __global const ulong *words, int n, int v, int d)
{
    int e = get_global_id(0);
    if (e >= n * d)
        return;
    int k = e / d, j = e % d;
    uint key = (uint)(words[k] >> 32);
    if (key >= (uint)v || (k > 0 && (uint)(words[k - 1] >> 32) == key))
        return;
    float sum = 0.0f;
    for (int m = k; m < n && (uint)(words[m] >> 32) == key; m++)
        sum += dy[dyo + (long)(uint)words[m] * d + j];
    dtable[dto + (long)key * d + j] += sum;
}
