/* Causal attention's per-element formulas in FlashAttention's scheme (ops.h,
 * ch_attention) for the backends' tiled kernels (prelude.h says how this
 * file is compiled in C, CUDA and OpenCL C). A row's scores s = scale q.k
 * are seen once each, in order: m the largest so far, l the sum of
 * exp(s - m); o = the sum of p v / l, lse = m + log l. The backward
 * rebuilds p = exp(s - lse) and takes D = dout.o per query row. */
#ifndef CHORUS_LIB_KERNELS_ATTN_H
#define CHORUS_LIB_KERNELS_ATTN_H

#ifndef __OPENCL_VERSION__
#include "kernels/prelude.h"
#endif

/* The factor that moves sums taken against the maximum m_old onto m_new
 * (>= m_old): 0 while nothing was summed (m_old -inf). */
CHK_FN float chk_attn_rescale(float m_old, float m_new)
{
    return m_old == -INFINITY ? 0.0f : CHK_EXPF(m_old - m_new);
}

/* A score's weight against the maximum m (forward) or its probability
 * against the row's log-sum-exp (backward). */
CHK_FN float chk_attn_p(float s, float m)
{
    return CHK_EXPF(s - m);
}

CHK_FN float chk_attn_lse(float m, float l)
{
    return m + CHK_LOGF(l);
}

/* The score's gradient (before the scale): p (dp - D), dp = dout.v. */
CHK_FN float chk_attn_ds(float p, float dp, float d)
{
    return p * (dp - d);
}

#endif
