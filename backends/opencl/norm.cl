/* LayerNorm and BatchNorm (ops.h, "Normalisation"): the formulas are
 * lib/kernels/normalize.h's (placed before this file with prelude.h and
 * common.cl), every sum in chk_acc (double where the device has it). No
 * atomics: every sum has an order fixed by the shape, so a run repeats to
 * the bit. LayerNorm takes a work-group per row for the row's statistics,
 * and its parameter gradients in two steps (partial sums over chunks of
 * rows, then the chunks in order). A channel's BatchNorm sums are also
 * compensated (each sum carried as a pair hi + lo, TwoSum at every
 * addition): where chk_acc is float, that keeps their error a few units of
 * f32 rounding however many elements a channel has. The host sizes every
 * temporary for doubles, the larger chk_acc. */

DEFINE_TREE_SUM(acc_tree_sum, chk_acc)

/* ---- LayerNorm ------------------------------------------------------------ */

/* One work-group per row of x [rows, d]. */
__kernel void layernorm(__global float *y, ulong yo, __global float *mean, ulong mo,
                        __global float *rstd, ulong ro, __global const float *x, ulong xo,
                        __global const float *gamma, ulong go, __global const float *beta,
                        ulong bo, int d, float eps, __local chk_acc *tmp)
{
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    __global const float *px = x + xo + (long)r * d;
    chk_acc s = 0;
    for (int j = t; j < d; j += step)
        s += px[j];
    tmp[t] = s;
    acc_tree_sum(tmp);
    chk_acc m = tmp[0] / (chk_acc)d;
    barrier(CLK_LOCAL_MEM_FENCE);
    chk_acc v = 0;
    for (int j = t; j < d; j += step) {
        chk_acc u = (chk_acc)px[j] - m;
        v += u * u;
    }
    tmp[t] = v;
    acc_tree_sum(tmp);
    chk_acc rs = chk_norm_rstd(tmp[0] / (chk_acc)d, eps);
    __global float *py = y + yo + (long)r * d;
    for (int j = t; j < d; j += step)
        py[j] = chk_norm_affine(px[j], m, rs, gamma[go + j], beta[bo + j]);
    if (t == 0) {
        mean[mo + r] = (float)m;
        rstd[ro + r] = (float)rs;
    }
}

/* dx of one row per work-group (chk_ln_dx). tmp holds two sums per
 * work-item. */
__kernel void layernorm_dx(__global float *dx, ulong dxo, __global const float *dy, ulong dyo,
                           __global const float *x, ulong xo, __global const float *mean,
                           ulong mo, __global const float *rstd, ulong ro,
                           __global const float *gamma, ulong go, int d, __local chk_acc *tmp)
{
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    long at = (long)r * d;
    chk_acc m = mean[mo + r], rs = rstd[ro + r];
    chk_acc s1 = 0, s2 = 0;
    for (int j = t; j < d; j += step) {
        chk_acc g = chk_ln_g(dy[dyo + at + j], gamma[go + j]);
        s1 += g;
        s2 += g * chk_norm_xhat(x[xo + at + j], m, rs);
    }
    __local chk_acc *tmp2 = tmp + step;
    tmp[t] = s1;
    tmp2[t] = s2;
    acc_tree_sum(tmp);
    acc_tree_sum(tmp2);
    chk_acc k1 = tmp[0] / (chk_acc)d, k2 = tmp2[0] / (chk_acc)d;
    for (int j = t; j < d; j += step)
        dx[dxo + at + j] = chk_ln_dx(dy[dyo + at + j], gamma[go + j], x[xo + at + j], m, rs, k1,
                                     k2);
}

/* Element i (offset included) of a tensor in format fmt
 * (lib/kernels/normalize.h's CHK_FMT_*), passed as bytes with its offset
 * in elements of its own size: f32 as it is, a half format widened. */
float fmt_load(__global const uchar *p, ulong i, int fmt)
{
    if (fmt == CHK_FMT_F32)
        return ((__global const float *)p)[i];
    return chk_fmt_widen(((__global const ushort *)p)[i], fmt);
}

/* v stored there, rounded once where the format is half. */
void fmt_store(__global uchar *p, ulong i, int fmt, float v)
{
    if (fmt == CHK_FMT_F32)
        ((__global float *)p)[i] = v;
    else
        ((__global ushort *)p)[i] = chk_fmt_narrow(v, fmt);
}

/* Work-item (k, j) of chunks x d: part[k, 0, j] = the sum of dy xhat and
 * part[k, 1, j] the sum of dy over the rows of chunk k, in row order. dy
 * and x in formats dyf and xf (ch_layernorm_backward's f32;
 * ch_layernorm_backward_add's any). */
__kernel void layernorm_param_part(__global chk_acc *part, __global const uchar *dy, ulong dyo,
                                   __global const uchar *x, ulong xo,
                                   __global const float *mean, ulong mo,
                                   __global const float *rstd, ulong ro, int rows, int d,
                                   int chunk_rows, int items, int dyf, int xf)
{
    int i = get_global_id(0);
    if (i >= items)
        return;
    int k = i / d, j = i % d;
    int end = min(rows, (k + 1) * chunk_rows);
    chk_acc g = 0, b = 0;
    for (int r = k * chunk_rows; r < end; r++) {
        long at = (long)r * d + j;
        float v = fmt_load(dy, dyo + at, dyf);
        g += v * chk_norm_xhat(fmt_load(x, xo + at, xf), mean[mo + r], rstd[ro + r]);
        b += v;
    }
    part[(long)k * 2 * d + j] = g;
    part[(long)k * 2 * d + d + j] = b;
}

/* dgamma[j] += the chunks' sums in order, dbeta[j] likewise. */
__kernel void layernorm_param_sum(__global float *dgamma, ulong dgo, __global float *dbeta,
                                  ulong dbo, __global const chk_acc *part, int chunks, int d)
{
    int j = get_global_id(0);
    if (j >= d)
        return;
    chk_acc g = 0, b = 0;
    for (int k = 0; k < chunks; k++) {
        g += part[(long)k * 2 * d + j];
        b += part[(long)k * 2 * d + d + j];
    }
    dgamma[dgo + j] = (float)(dgamma[dgo + j] + g);
    dbeta[dbo + j] = (float)(dbeta[dbo + j] + b);
}

/* ---- The residual stream's add beside LayerNorm ---------------------------
 * ch_add_layernorm and ch_layernorm_backward_add: the kernels above with
 * their tensors in formats (fmt_load, fmt_store) and the residual's add;
 * the sums in the same order as theirs, so the results are the unfused
 * ops' where the work-groups are of one size. */

/* One work-group per row: sum = a + b rounded to its format (each
 * work-item reads back only the elements it wrote, so in place, sum over
 * a or b, each is read before it is written), then layernorm's statistics
 * and y of the sum as stored. */
__kernel void add_layernorm(__global uchar *sum, ulong so, __global uchar *y, ulong yo,
                            __global float *mean, ulong mo, __global float *rstd, ulong ro,
                            __global const uchar *a, ulong ao, __global const uchar *b, ulong bo,
                            __global const float *gamma, ulong go, __global const float *beta,
                            ulong beo, int sf, int yf, int af, int bf, int d, float eps,
                            __local chk_acc *tmp)
{
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    ulong at = (ulong)r * (ulong)d;
    chk_acc s = 0;
    for (int j = t; j < d; j += step) {
        float v = chk_res_sum(fmt_load(a, ao + at + j, af), fmt_load(b, bo + at + j, bf));
        fmt_store(sum, so + at + j, sf, v);
        s += chk_fmt_round(v, sf);
    }
    tmp[t] = s;
    acc_tree_sum(tmp);
    chk_acc m = tmp[0] / (chk_acc)d;
    barrier(CLK_LOCAL_MEM_FENCE);
    chk_acc v = 0;
    for (int j = t; j < d; j += step) {
        chk_acc u = (chk_acc)fmt_load(sum, so + at + j, sf) - m;
        v += u * u;
    }
    tmp[t] = v;
    acc_tree_sum(tmp);
    chk_acc rs = chk_norm_rstd(tmp[0] / (chk_acc)d, eps);
    for (int j = t; j < d; j += step)
        fmt_store(y, yo + at + j, yf,
                  chk_norm_affine(fmt_load(sum, so + at + j, sf), m, rs, gamma[go + j],
                                  beta[beo + j]));
    if (t == 0) {
        mean[mo + r] = (float)m;
        rstd[ro + r] = (float)rs;
    }
}

/* layernorm_dx's row, plus dres (has_res 0: none; it may be dx, each
 * element read before the same work-item writes it), stored in dx's
 * format. tmp holds two sums per work-item. */
__kernel void layernorm_dx_add(__global uchar *dx, ulong dxo, __global const uchar *dy, ulong dyo,
                               __global const uchar *dres, ulong dro, __global const uchar *x,
                               ulong xo, __global const float *mean, ulong mo,
                               __global const float *rstd, ulong ro, __global const float *gamma,
                               ulong go, int dxf, int dyf, int rf, int xf, int has_res, int d,
                               __local chk_acc *tmp)
{
    int r = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    ulong at = (ulong)r * (ulong)d;
    chk_acc m = mean[mo + r], rs = rstd[ro + r];
    chk_acc s1 = 0, s2 = 0;
    for (int j = t; j < d; j += step) {
        chk_acc g = chk_ln_g(fmt_load(dy, dyo + at + j, dyf), gamma[go + j]);
        s1 += g;
        s2 += g * chk_norm_xhat(fmt_load(x, xo + at + j, xf), m, rs);
    }
    __local chk_acc *tmp2 = tmp + step;
    tmp[t] = s1;
    tmp2[t] = s2;
    acc_tree_sum(tmp);
    acc_tree_sum(tmp2);
    chk_acc k1 = tmp[0] / (chk_acc)d, k2 = tmp2[0] / (chk_acc)d;
    for (int j = t; j < d; j += step) {
        float v = chk_ln_dx(fmt_load(dy, dyo + at + j, dyf), gamma[go + j],
                            fmt_load(x, xo + at + j, xf), m, rs, k1, k2);
        if (has_res)
            v = chk_ln_dx_res(v, fmt_load(dres, dro + at + j, rf));
        fmt_store(dx, dxo + at + j, dxf, v);
    }
}

/* ---- BatchNorm ------------------------------------------------------------ */

/* (*hi, *lo) += v: TwoSum gives the rounding error of hi + v exactly, and
 * lo collects those errors. */
void pair_add(chk_acc *hi, chk_acc *lo, chk_acc v)
{
    chk_acc s = *hi + v;
    chk_acc bv = s - *hi;
    *lo += (*hi - (s - bv)) + (v - bv);
    *hi = s;
}

/* `pairs` trees side by side: p holds `pairs` arrays of one pair per
 * work-item, work-item t's pair of array q at p[2 (q L + t)] (hi, then
 * lo), L the group size; each array's total ends in its first pair. */
void pair_tree(__local chk_acc *p, int pairs)
{
    int t = get_local_id(0);
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int h = get_local_size(0) / 2; h > 0; h >>= 1) {
        if (t < h)
            for (int q = 0; q < pairs; q++) {
                __local chk_acc *me = p + 2 * (q * get_local_size(0) + t);
                __local chk_acc *other = me + 2 * h;
                chk_acc hi = me[0], lo = me[1] + other[1];
                pair_add(&hi, &lo, other[0]);
                me[0] = hi;
                me[1] = lo;
            }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
}

/* Work-group g = (channel, split) of c x splits: over its `chunk` of the
 * channel's count = outer * inner elements, the sums of a' and a' b'
 * (primes: minus the centre; centres absent when has_* is 0) as pairs in
 * part[4 g ..]. Element e of a channel is (o, i) = (e / inner, e % inner),
 * followed along the work-item's stride without a division per element.
 * tmp holds 4 chk_acc per work-item. */
__kernel void channel_sums_part(__global chk_acc *part, __global const float *a, ulong ao,
                                __global const float *ac, ulong aco, __global const float *b,
                                ulong bo, __global const float *bc, ulong bco, int has_ac,
                                int has_bc, int c, int inner, int count, int splits,
                                int chunk, __local chk_acc *tmp)
{
    int g = get_group_id(0), t = get_local_id(0), step = get_local_size(0);
    int ch = g / splits;
    long begin = (long)(g % splits) * chunk + t, end = min((long)count, begin - t + chunk);
    int o = (int)(begin / inner), i = (int)(begin % inner);
    int step_o = step / inner, step_i = step % inner;
    chk_acc ca = has_ac ? ac[aco + ch] : 0.0f, cb = has_bc ? bc[bco + ch] : 0.0f;
    chk_acc h1 = 0, l1 = 0, h2 = 0, l2 = 0;
    for (long e = begin; e < end; e += step) {
        long at = ((long)o * c + ch) * inner + i;
        chk_acc da = (chk_acc)a[ao + at] - ca;
        pair_add(&h1, &l1, da);
        pair_add(&h2, &l2, da * ((chk_acc)b[bo + at] - cb));
        o += step_o;
        i += step_i;
        if (i >= inner) {
            i -= inner;
            o++;
        }
    }
    tmp[2 * t] = h1;
    tmp[2 * t + 1] = l1;
    tmp[2 * (step + t)] = h2;
    tmp[2 * (step + t) + 1] = l2;
    pair_tree(tmp, 2);
    if (t == 0) {
        part[4 * (long)g] = tmp[0];
        part[4 * (long)g + 1] = tmp[1];
        part[4 * (long)g + 2] = tmp[2 * step];
        part[4 * (long)g + 3] = tmp[2 * step + 1];
    }
}

/* One work-item per channel: its splits' pairs in order, then the sums;
 * the first also writes the count. */
__kernel void channel_sums_finish(__global float *sums, ulong so,
                                  __global const chk_acc *part, int c, int splits, int count)
{
    int ch = get_global_id(0);
    if (ch >= c)
        return;
    chk_acc h1 = 0, l1 = 0, h2 = 0, l2 = 0;
    for (int sp = 0; sp < splits; sp++) {
        __global const chk_acc *p = part + 4 * ((long)ch * splits + sp);
        l1 += p[1];
        pair_add(&h1, &l1, p[0]);
        l2 += p[3];
        pair_add(&h2, &l2, p[2]);
    }
    sums[so + ch] = (float)(h1 + l1);
    sums[so + c + ch] = (float)(h2 + l2);
    if (ch == 0)
        sums[so + 2 * c] = (float)count;
}

/* One work-item per channel. has_sums 0: evaluation, from the running
 * statistics. has_running 0: they are not updated. */
__kernel void batchnorm_stats(__global float *mean, ulong mo, __global float *rstd, ulong ro,
                              __global float *rmean, ulong rmo, __global float *rvar,
                              ulong rvo, __global const float *sums, ulong so,
                              __global const float *center, ulong co, int has_running,
                              int has_sums, int has_center, int c, float momentum, float eps)
{
    int ch = get_global_id(0);
    if (ch >= c)
        return;
    if (!has_sums) {
        mean[mo + ch] = rmean[rmo + ch];
        rstd[ro + ch] = (float)chk_norm_rstd(rvar[rvo + ch], eps);
        return;
    }
    float count = sums[so + 2 * c], s1 = sums[so + ch], s2 = sums[so + c + ch];
    chk_acc m = chk_bn_mean(has_center ? center[co + ch] : 0.0f, s1, count);
    chk_acc v = chk_bn_var(s1, s2, count);
    mean[mo + ch] = (float)m;
    rstd[ro + ch] = (float)chk_norm_rstd(v, eps);
    if (!has_running)
        return;
    rmean[rmo + ch] = chk_bn_running(rmean[rmo + ch], momentum, m);
    rvar[rvo + ch] = chk_bn_running(rvar[rvo + ch], momentum, chk_bn_unbiased(v, count));
}

/* x, y [outer, c, inner], one work-item per element. The index is an int
 * whatever lib/kernels/index.h's rule says: norm.c holds these launches
 * below 2^31 work-items, and a work-item takes no step past its own. */
__kernel void batchnorm_forward(__global float *y, ulong yo, __global const float *x, ulong xo,
                                __global const float *mean, ulong mo,
                                __global const float *rstd, ulong ro,
                                __global const float *gamma, ulong go,
                                __global const float *beta, ulong bo, int n, int c, int inner)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    int ch = chk_channel_of_32(i, c, inner);
    y[yo + i] = chk_norm_affine(x[xo + i], mean[mo + ch], rstd[ro + ch], gamma[go + ch],
                                beta[bo + ch]);
}

/* dgamma += rstd local[c + ch], dbeta += local[ch]: one work-item per
 * channel. */
__kernel void batchnorm_param_grads(__global float *dgamma, ulong dgo, __global float *dbeta,
                                    ulong dbo, __global const float *rstd, ulong ro,
                                    __global const float *local_sums, ulong lo, int c)
{
    int ch = get_global_id(0);
    if (ch >= c)
        return;
    dgamma[dgo + ch] = chk_bn_dgamma(dgamma[dgo + ch], rstd[ro + ch], local_sums[lo + c + ch]);
    dbeta[dbo + ch] = chk_bn_dbeta(dbeta[dbo + ch], local_sums[lo + ch]);
}

/* dx (chk_bn_dx) from the total sums, one work-item per element. */
__kernel void batchnorm_dx(__global float *dx, ulong dxo, __global const float *dy, ulong dyo,
                           __global const float *x, ulong xo, __global const float *mean,
                           ulong mo, __global const float *rstd, ulong ro,
                           __global const float *gamma, ulong go, __global const float *total,
                           ulong to, int n, int c, int inner)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    int ch = chk_channel_of_32(i, c, inner);
    dx[dxo + i] = chk_bn_dx(dy[dyo + i], x[xo + i], mean[mo + ch], rstd[ro + ch], gamma[go + ch],
                            total[to + ch], total[to + c + ch], total[to + 2 * c]);
}
