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

/* softmax_xent_fused, in place: one work-group per row of x [rows, c],
 * read once for its max and sum (xent.h's online softmax: each work-item
 * its strided part, the parts merged in a tree in tmp, 2 floats an item),
 * then once more to be overwritten by the gradient (chk_xent_grad);
 * rowloss and the check word as softmax_rows'. LOAD(j) is element j of
 * the row widened to float, STORE(j, v) rounds v into it. */
#define XENT_FUSED_ROW(LOAD, STORE)                                                        \
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);                \
    __local float *tm = tmp, *ts = tmp + step;                                             \
    float m = -INFINITY, s = 0.0f;                                                         \
    for (int j = t; j < c; j += step)                                                      \
        chk_xent_online_add(&m, &s, LOAD(j));                                              \
    tm[t] = m;                                                                             \
    ts[t] = s;                                                                             \
    barrier(CLK_LOCAL_MEM_FENCE);                                                          \
    for (int h = step / 2; h > 0; h >>= 1) {                                               \
        if (t < h) {                                                                       \
            chk_xent_online_merge(&m, &s, tm[t + h], ts[t + h]);                           \
            tm[t] = m;                                                                     \
            ts[t] = s;                                                                     \
        }                                                                                  \
        barrier(CLK_LOCAL_MEM_FENCE);                                                      \
    }                                                                                      \
    m = tm[0];                                                                             \
    s = ts[0];                                                                             \
    int lab = labels[lbo + r];                                                             \
    if (t == 0) {                                                                          \
        if (lab >= 0 && lab < c) {                                                         \
            rowloss[r] = log(s) - (LOAD(lab) - m);                                         \
        } else {                                                                           \
            rowloss[r] = NAN;                                                              \
            atomic_min(bad + bo, (uint)r);                                                 \
        }                                                                                  \
    }                                                                                      \
    /* the label's logit is read before any work-item writes it */                         \
    barrier(CLK_GLOBAL_MEM_FENCE);                                                         \
    for (int j = t; j < c; j += step)                                                      \
        STORE(j, chk_xent_grad(exp(LOAD(j) - m) / s, lab == j, chk_xent_scale(scale, rows)));

__kernel void xent_fused(__global float *logits, ulong xo, __global float *rowloss,
                         __global const int *labels, ulong lbo, int c, float scale, float rows,
                         __global uint *bad, ulong bo, __local float *tmp)
{
    __global float *x = logits + xo + (long)get_group_id(0) * c;
#define LOAD_F32(j) x[j]
#define STORE_F32(j, v) x[j] = (v)
    XENT_FUSED_ROW(LOAD_F32, STORE_F32)
}

/* The same over bf16 (bf16 1) or f16 (0) logits. */
__kernel void xent_fused_half(__global ushort *logits, ulong xo, __global float *rowloss,
                              __global const int *labels, ulong lbo, int c, float scale,
                              float rows, __global uint *bad, ulong bo, __local float *tmp,
                              int bf16)
{
    __global ushort *x = logits + xo + (long)get_group_id(0) * c;
#define LOAD_HALF(j) as_float(bf16 ? chk_bf16_to_f32(x[j]) : chk_f16_to_f32(x[j]))
#define STORE_HALF(j, v) x[j] = bf16 ? chk_f32_to_bf16(as_uint(v)) : chk_f32_to_f16(as_uint(v))
    XENT_FUSED_ROW(LOAD_HALF, STORE_HALF)
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
