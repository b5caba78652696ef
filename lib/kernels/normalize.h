/* LayerNorm's and BatchNorm's formulas (ops.h, "Normalisation"), one
 * element or one channel at a time, for every backend (prelude.h says how
 * this file is compiled in C, CUDA and OpenCL C).
 *
 * Every formula computes in chk_acc (double where the device has it,
 * prelude.h) from the f32 values and rounds once on the way out, and the
 * sums the backends form across threads are of the terms given here, in
 * chk_acc too. What stays each backend's own: the order of those sums (a
 * fixed one, so a run repeats to the bit) and the thread mapping.
 *
 * Names: m the mean, r = 1 / sqrt(var + eps) (rstd), xhat = (x - m) r,
 * g = dy gamma; a BatchNorm channel's sums over its M = count elements are
 * s1 = the sum of x - centre and s2 = the sum of (x - centre)^2 for the
 * statistics (of dy and of dy (x - m) for the backward). */
#ifndef CHORUS_LIB_KERNELS_NORMALIZE_H
#define CHORUS_LIB_KERNELS_NORMALIZE_H

#ifndef __OPENCL_VERSION__
#include "kernels/prelude.h"
#include "kernels/half_bits.h"
#endif

/* ---- both ------------------------------------------------------------------ */

/* r from a variance. */
CHK_FN chk_acc chk_norm_rstd(chk_acc var, float eps)
{
    return (chk_acc)1 / CHK_SQRT(var + (chk_acc)eps);
}

/* The formulas on values already in chk_acc (or on vectors of them, as
 * the host's LayerNorm takes them eight at a time): the forward element,
 * xhat, and LayerNorm's dx from g and xhat. */
#define CHK_NORM_AFFINE_OF(x, m, r, gamma, beta) (((x) - (m)) * (r) * (gamma) + (beta))
#define CHK_NORM_XHAT_OF(x, m, r) (((x) - (m)) * (r))
#define CHK_LN_DX_OF(g, xhat, r, k1, k2) ((r) * ((g) - (k1) - (xhat) * (k2)))

/* The forward element: (x - m) r gamma + beta. */
CHK_FN float chk_norm_affine(float x, chk_acc m, chk_acc r, float gamma, float beta)
{
    return (float)CHK_NORM_AFFINE_OF((chk_acc)x, m, r, (chk_acc)gamma, (chk_acc)beta);
}

/* xhat, and LayerNorm's dgamma term dy xhat. */
CHK_FN chk_acc chk_norm_xhat(float x, chk_acc m, chk_acc r)
{
    return CHK_NORM_XHAT_OF((chk_acc)x, m, r);
}

/* ---- LayerNorm --------------------------------------------------------------
 * A row of d: m = the sum of x / d, var = the sum of (x - m)^2 / d; the
 * backward's row sums are of g (chk_ln_g) and g xhat, k1 and k2 their
 * means. */

CHK_FN chk_acc chk_ln_g(float dy, float gamma)
{
    return (chk_acc)dy * (chk_acc)gamma;
}

/* dx = r (g - k1 - xhat k2). */
CHK_FN float chk_ln_dx(float dy, float gamma, float x, chk_acc m, chk_acc r, chk_acc k1, chk_acc k2)
{
    return (float)CHK_LN_DX_OF(chk_ln_g(dy, gamma), chk_norm_xhat(x, m, r), r, k1, k2);
}

/* ---- The residual stream's add beside LayerNorm ------------------------------
 * ch_add_layernorm and ch_layernorm_backward_add: their half-capable
 * tensors are each in a format (CHK_FMT_*, the backends' codes for f32,
 * bf16 and f16, whatever the core's ch_dtype values), read widened to f32
 * (exactly) and written rounded once to nearest even (half_bits.h's
 * steps, which OpenCL programs list before this file). */
#define CHK_FMT_F32 0
#define CHK_FMT_BF16 1
#define CHK_FMT_F16 2

/* A half element's value (fmt CHK_FMT_BF16 or CHK_FMT_F16). */
CHK_FN float chk_fmt_widen(chk_u16 h, int fmt)
{
    return CHK_BITS_F32(fmt == CHK_FMT_BF16 ? chk_bf16_to_f32(h) : chk_f16_to_f32(h));
}

/* v rounded to a half format: the bits to store. */
CHK_FN chk_u16 chk_fmt_narrow(float v, int fmt)
{
    chk_u32 u = CHK_F32_BITS(v);
    return fmt == CHK_FMT_BF16 ? chk_f32_to_bf16(u) : chk_f32_to_f16(u);
}

/* What an element of format fmt holds once v is stored in it: v itself
 * in f32, v rounded in a half format. */
CHK_FN float chk_fmt_round(float v, int fmt)
{
    return fmt == CHK_FMT_F32 ? v : chk_fmt_widen(chk_fmt_narrow(v, fmt), fmt);
}

/* The forward's sum a + b, as ch_add forms it: in f32, then rounded to the
 * sum's format (chk_fmt_narrow), the value the LayerNorm then reads
 * (chk_fmt_round). For a and b of the sum's format, f32's rounding first
 * changes nothing: rounding a sum twice gives the exact sum rounded once
 * where the first format has at least 2p + 2 bits for the second's p, and
 * f32's 24 are that for bf16 (8) and f16 (11). */
CHK_FN float chk_res_sum(float a, float b)
{
    return a + b;
}

/* The backward's dx before it is stored: LayerNorm's dx (chk_ln_dx, an
 * f32) plus the residual's gradient dres, in f32 as ch_add adds them. */
CHK_FN float chk_ln_dx_res(float dx, float dres)
{
    return dx + dres;
}

/* ---- BatchNorm --------------------------------------------------------------
 * Training: the statistics from a channel's sums around a centre (an
 * earlier mean, or 0), which keeps s2 / M - (s1 / M)^2 from cancelling. */

/* The mean: centre + s1 / M. */
CHK_FN chk_acc chk_bn_mean(float center, float s1, float count)
{
    return (chk_acc)center + (chk_acc)s1 / (chk_acc)count;
}

/* The biased variance s2 / M - (s1 / M)^2, never below 0. */
CHK_FN chk_acc chk_bn_var(float s1, float s2, float count)
{
    chk_acc d = (chk_acc)s1 / (chk_acc)count;
    chk_acc v = (chk_acc)s2 / (chk_acc)count - d * d;
    return v > (chk_acc)0 ? v : (chk_acc)0;
}

/* A running statistic moved towards the batch's: (1 - k) run + k stat.
 * The running variance takes the unbiased variance (PyTorch's rule),
 * except for M = 1 where it has none: there the biased one, 0. */
CHK_FN float chk_bn_running(float run, float momentum, chk_acc stat)
{
    chk_acc k = momentum;
    return (float)(((chk_acc)1 - k) * (chk_acc)run + k * stat);
}

CHK_FN chk_acc chk_bn_unbiased(chk_acc var, float count)
{
    chk_acc n = count;
    return n > (chk_acc)1 ? var * n / (n - (chk_acc)1) : var;
}

/* The parameter gradients from this replica's sums (local):
 * dgamma += r s2, dbeta += s1. */
CHK_FN float chk_bn_dgamma(float dgamma, float r, float s2)
{
    return (float)((chk_acc)dgamma + (chk_acc)r * (chk_acc)s2);
}

CHK_FN float chk_bn_dbeta(float dbeta, float s1)
{
    return (float)((chk_acc)dbeta + (chk_acc)s1);
}

/* dx from every replica's sums (total):
 * gamma r (dy - s1 / M - (x - m) r^2 s2 / M). */
CHK_FN float chk_bn_dx(float dy, float x, float m, float r, float gamma, float s1, float s2,
                       float count)
{
    chk_acc rr = r, n = count;
    chk_acc mean_dy = (chk_acc)s1 / n, slope = rr * rr * (chk_acc)s2 / n;
    return (float)((chk_acc)gamma * rr *
                   ((chk_acc)dy - mean_dy - ((chk_acc)x - (chk_acc)m) * slope));
}

#endif
