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

/* The positions of each table row as a chain, one work-item per position
 * i, in `chains`: head = chains[0 .. v), next = chains[v .. v + n).
 * head[r] = the first position whose index is r (head is -1 before),
 * next[i] = the next position with the same index as i, or -1. */
__kernel void embedding_chain(__global int *chains, __global const int *idx, ulong io, int n,
                              int v)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    int row = idx[io + i], first = 1, after = -1;
    if (row < 0 || row >= v)
        return;
    for (int j = 0; j < i && first; j++)
        first = idx[io + j] != row;
    for (int j = i + 1; j < n && after < 0; j++)
        if (idx[io + j] == row)
            after = j;
    chains[v + i] = after;
    if (first)
        chains[row] = i;
}

/* One work-item per element of dtable [v, d]: the dy rows of its row's
 * chain summed in increasing position, then added. */
__kernel void embedding_backward(__global float *dtable, ulong dto, __global const float *dy,
                                 ulong dyo, __global const int *chains, int v, int d)
{
    int e = get_global_id(0);
    if (e >= v * d)
        return;
    __global const int *next = chains + v;
    int row = e / d, j = e % d, i = chains[row];
    if (i < 0)
        return;
    float sum = 0.0f;
    for (; i >= 0; i = next[i])
        sum += dy[dyo + (long)i * d + j];
    dtable[dto + e] += sum;
}
