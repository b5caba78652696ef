/* The gradient element of the fused softmax + cross-entropy (ops.h,
 * ch_softmax_xent_backward) for every backend (prelude.h says how this
 * file is compiled in C, CUDA and OpenCL C): dlogits = k (probs - onehot),
 * k = scale / rows, in chk_acc and rounded once; and the online softmax a
 * row read once for its max and sum takes (ch_softmax_xent_fused on
 * CUDA). */
#ifndef CHORUS_LIB_KERNELS_XENT_H
#define CHORUS_LIB_KERNELS_XENT_H

#ifndef __OPENCL_VERSION__
#include "kernels/prelude.h"
#endif

/* k: the loss's scale over the rows the mean loss divided by. */
CHK_FN chk_acc chk_xent_scale(float scale, chk_acc rows)
{
    return (chk_acc)scale / rows;
}

/* One element: is_label is 1 in the label's column, 0 elsewhere. */
CHK_FN float chk_xent_grad(float prob, int is_label, chk_acc k)
{
    return (float)(k * ((chk_acc)prob - (chk_acc)is_label));
}

/* A part of a row as (m, s): its largest element m and the sum s of
 * exp(x - m) over it; (-inf, 0) for none. One more element x: */
CHK_FN void chk_xent_online_add(float *m, float *s, float x)
{
    if (x > *m) {
        *s = *s * CHK_EXPF(*m - x) + 1.0f;
        *m = x;
    } else if (*m != -INFINITY) { /* -inf after -inf adds nothing */
        *s += CHK_EXPF(x - *m);
    }
}

/* Two parts as one: each sum moved to the larger max. */
CHK_FN void chk_xent_online_merge(float *m, float *s, float m2, float s2)
{
    float mx = *m > m2 ? *m : m2;
    if (mx == -INFINITY)
        return;
    *s = *s * CHK_EXPF(*m - mx) + s2 * CHK_EXPF(m2 - mx);
    *m = mx;
}

#endif
