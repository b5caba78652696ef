/* Fused softmax and cross-entropy. The forward pass writes each row's loss
 * to a scratch buffer, then one work-group takes their mean in a fixed
 * order, so the loss has the same bits on every run. A label outside
 * [0, c) lowers the stream's check word bad[bo] to its row (atomic_min:
 * the first such row wins whatever the order); check_value then notes the
 * label, and the stream's next wait reports it (stream.c). */

#pragma OPENCL FP_CONTRACT OFF

/* One work-group per row of logits [rows, c]: probs = softmax(row),
 * rowloss = logsumexp(row) - row[label], NaN for a label out of range. */
__kernel void softmax_rows(__global float *probs, ulong po, __global float *rowloss,
                           __global const float *logits, ulong lo,
                           __global const int *labels, ulong lbo, int c,
                           __global uint *bad, ulong bo, __local float *tmp)
{
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    __global const float *x = logits + lo + (long)r * c;
    __global float *p = probs + po + (long)r * c;

    float mx, s;
    row_max_expsum(x, c, tmp, &mx, &s);

    for (int j = t; j < c; j += step)
        p[j] = exp(x[j] - mx) / s;
    if (t == 0) {
        int lab = labels[lbo + r];
        if (lab >= 0 && lab < c) {
            rowloss[r] = log(s) - (x[lab] - mx);
        } else {
            rowloss[r] = NAN;
            atomic_min(bad + bo, (uint)r);
        }
    }
}

/* y[0] = mean of x[0 .. n), one work-group. */
__kernel void mean(__global float *y, ulong yo, __global const float *x, int n,
                   __local float *tmp)
{
    int t = get_local_id(0), step = get_local_size(0);
    float s = 0.0f;
    for (int j = t; j < n; j += step)
        s += x[j];
    tmp[t] = s;
    tree_sum(tmp);
    if (t == 0)
        y[yo] = tmp[0] / (float)n;
}

/* dlogits (xent.h's chk_xent_grad). */
__kernel void softmax_backward(__global float *dl, ulong dlo, __global const float *probs,
                               ulong po, __global const int *labels, ulong lbo,
                               int total, int c, float scale, float rows,
                               __global uint *bad, ulong bo)
{
    int i = get_global_id(0);
    if (i >= total)
        return;
    int lab = labels[lbo + i / c];
    if (i % c == 0 && (lab < 0 || lab >= c))
        atomic_min(bad + bo, (uint)(i / c));
    dl[dlo + i] = chk_xent_grad(probs[po + i], lab == i % c, chk_xent_scale(scale, rows));
}

/* One work-item, queued right after a kernel that checks: the value at
 * the position its word names, into the word after it (stream.c), while
 * the values are still the ones the kernel read. */
__kernel void check_value(__global uint *word, ulong wo, __global const int *values, ulong vo)
{
    uint pos = word[wo];
    if (pos != 0xffffffffu)
        word[wo + 1] = (uint)values[vo + pos];
}
