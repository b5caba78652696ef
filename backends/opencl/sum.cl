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

/* The bias gradient, db[ch] = beta db[ch] + the sum over outer and inner
 * of dy[outer, ch, inner] (db is not read when beta is 0), in one of two
 * layouts, each cutting a channel's elements into `splits` fixed spans
 * (ops.c: a function of the shape) so that enough work-groups fill a GPU.
 * With one span the kernel writes db; with more, it writes the span's sum
 * to part[span, ch] and bias_grad_finish adds the spans in order. */

/* The sum of a span written where it goes. */
void bias_grad_store(__global float *out, ulong oo, int partial, int at, float sum, float beta)
{
    if (!partial && beta != 0.0f)
        sum = beta * out[oo + at] + sum;
    out[oo + at] = sum;
}

/* inner 1 (a linear layer's [rows, c]): work-group (tile, span) of
 * tx x ty work-items, tx consecutive channels beside each other, so each
 * row is read in one run of tx floats; work-item (x, y) sums the rows
 * y, y + ty, ... of its span, and a tree over y in local memory adds the
 * ty lanes of each channel. tmp holds tx * ty floats. */
__kernel void bias_grad_rows(__global float *out, ulong oo, __global const float *dy, ulong dyo,
                             int rows, int c, int chunk, float beta, int partial,
                             __local float *tmp)
{
    int x = get_local_id(0), y = get_local_id(1);
    int tx = get_local_size(0), ty = get_local_size(1);
    int ch = get_global_id(0), span = get_group_id(1);
    int end = min(rows, (span + 1) * chunk);
    float s = 0.0f;
    if (ch < c)
        for (int r = span * chunk + y; r < end; r += ty)
            s += dy[dyo + (long)r * c + ch];
    tmp[y * tx + x] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = ty / 2; h > 0; h >>= 1) {
        if (y < h)
            tmp[y * tx + x] += tmp[(y + h) * tx + x];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (y == 0 && ch < c)
        bias_grad_store(out, oo, partial, partial ? span * c + ch : ch, tmp[x], beta);
}

/* inner > 1 (a convolution's [n, c, positions]): work-group g is channel
 * g % c, span g / c of its count = outer * inner elements; consecutive
 * work-items read consecutive positions of a channel. */
__kernel void bias_grad(__global float *out, ulong oo, __global const float *dy, ulong dyo, int c,
                        int inner, int count, int chunk, float beta, int partial,
                        __local float *tmp)
{
    int g = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    int ch = g % c, span = g / c;
    int end = min(count, (span + 1) * chunk);
    float s = 0.0f;
    for (int j = span * chunk + t; j < end; j += step)
        s += dy[dyo + ((long)(j / inner) * c + ch) * inner + j % inner];
    tmp[t] = s;
    tree_sum(tmp);
    if (t == 0)
        bias_grad_store(out, oo, partial, partial ? span * c + ch : ch, tmp[0], beta);
}

/* One work-item per channel: the spans of part [splits, c] in order. */
__kernel void bias_grad_finish(__global float *db, ulong dbo, __global const float *part, int c,
                               int splits, float beta)
{
    int ch = get_global_id(0);
    if (ch >= c)
        return;
    float s = 0.0f;
    for (int span = 0; span < splits; span++)
        s += part[(long)span * c + ch];
    bias_grad_store(db, dbo, 0, ch, s, beta);
}
