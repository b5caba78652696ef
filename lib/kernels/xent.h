/* The gradient element of the fused softmax + cross-entropy (ops.h,
 * ch_softmax_xent_backward) for every backend (prelude.h says how this
 * file is compiled in C, CUDA and OpenCL C): dlogits = k (probs - onehot),
 * k = scale / rows, in chk_acc and rounded once. */
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

#endif
