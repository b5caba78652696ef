/* Sums along an axis, argmax and the bias gradient. Every output is
 * computed in a fixed order, so the same inputs give the same bits on every
 * run: either one work-item per output summing
 * sequentially, or one work-group per output where each work-item sums a
 * fixed stride and a tree in local memory combines the partial sums. */

#pragma OPENCL FP_CONTRACT OFF

/* x as [outer, n, inner] -> y [outer, inner]: one work-item per output. */
__kernel void sum_item(__global float *y, ulong yo, __global const float *x, ulong xo,
                       int outputs, int n, int inner, int mean)
{
    int i = get_global_id(0);
    if (i >= outputs)
        return;
    __global const float *p = x + xo + (i / inner) * n * inner + i % inner;
    float s = 0.0f;
    for (int j = 0; j < n; j++)
        s += p[j * inner];
    y[yo + i] = mean ? s / (float)n : s;
}

/* The same with one work-group per output, for long reductions. */
__kernel void sum_group(__global float *y, ulong yo, __global const float *x, ulong xo,
                        int n, int inner, int mean, __local float *tmp)
{
    int g = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    __global const float *p = x + xo + (g / inner) * n * inner + g % inner;
    float s = 0.0f;
    for (int j = t; j < n; j += step)
        s += p[j * inner];
    tmp[t] = s;
    tree_sum(tmp);
    if (t == 0)
        y[yo + g] = mean ? tmp[0] / (float)n : tmp[0];
}

/* argmax along n follows ops.h: the first NaN, else the first maximum.
 * (v2 at index k2) beats (v1 at k1): a NaN beats any number, and the lower
 * index wins between two NaNs or two equal numbers. k = INT_MAX: no value. */
int argmax_better(float v2, int k2, float v1, int k1)
{
    if (k2 == INT_MAX)
        return 0;
    if (k1 == INT_MAX)
        return 1;
    if (isnan(v2))
        return !isnan(v1) || k2 < k1;
    return !isnan(v1) && (v2 > v1 || (v2 == v1 && k2 < k1));
}

/* One work-item per output, as an index into n. */
__kernel void argmax_item(__global int *y, ulong yo, __global const float *x, ulong xo,
                          int outputs, int n, int inner)
{
    int i = get_global_id(0);
    if (i >= outputs)
        return;
    __global const float *p = x + xo + (i / inner) * n * inner + i % inner;
    float best = p[0];
    int bi = 0;
    for (int j = 1; j < n; j++) {
        float v = p[j * inner];
        if (argmax_better(v, j, best, bi)) {
            best = v;
            bi = j;
        }
    }
    y[yo + i] = bi;
}

__kernel void argmax_group(__global int *y, ulong yo, __global const float *x,
                           ulong xo, int n, int inner, __local float *val,
                           __local int *idx)
{
    int g = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    __global const float *p = x + xo + (g / inner) * n * inner + g % inner;
    /* A work-item with no element holds index INT_MAX: it loses every
     * comparison. */
    float best = 0.0f;
    int bi = INT_MAX;
    for (int j = t; j < n; j += step) {
        float v = p[j * inner];
        if (argmax_better(v, j, best, bi)) {
            best = v;
            bi = j;
        }
    }
    val[t] = best;
    idx[t] = bi;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = step / 2; h > 0; h >>= 1) {
        if (t < h) {
            float v = val[t + h];
            int vi = idx[t + h];
            if (argmax_better(v, vi, val[t], idx[t])) {
                val[t] = v;
                idx[t] = vi;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0)
        y[yo + g] = idx[0];
}

/* db[ch] = beta db[ch] + sum over outer and inner of dy[outer, ch, inner]:
 * one work-group per channel. db is not read when beta is 0. */
__kernel void bias_grad(__global float *db, ulong dbo, __global const float *dy,
                        ulong dyo, int outer, int c, int inner, float beta,
                        __local float *tmp)
{
    int ch = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    int count = outer * inner;
    float s = 0.0f;
    for (int j = t; j < count; j += step)
        s += dy[dyo + ((j / inner) * c + ch) * inner + j % inner];
    tmp[t] = s;
    tree_sum(tmp);
    if (t == 0) {
        float r = tmp[0];
        if (beta != 0.0f)
            r = beta * db[dbo + ch] + r;
        db[dbo + ch] = r;
    }
}
