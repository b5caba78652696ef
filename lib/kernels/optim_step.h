/* The optimizers' update of one element, for every backend: the host
 * loops over it (backends/host/optim.c), OpenCL work-items and CUDA
 * threads call it (elementwise.cl, backends/cuda/optim.cu). The scalars
 * are prepared once on the host (lib/optim_consts.h). Data-parallel
 * replicas on different backends apply the same reduced gradient and must
 * end with the same bits, so every backend evaluates exactly these
 * operations in this order, each rounded on its own: no fused
 * multiply-add (prelude.h), and correctly rounded division and square
 * root (C and CUDA's defaults; OpenCL builds with
 * -cl-fp32-correctly-rounded-divide-sqrt where every device offers it,
 * backends/opencl/program.c). In the C subset of lib/kernels/prelude.h. */
#ifndef CHORUS_LIB_KERNELS_OPTIM_STEP_H
#define CHORUS_LIB_KERNELS_OPTIM_STEP_H

#ifndef __OPENCL_VERSION__
#include "prelude.h"
#endif

/* ---- SGD (torch.optim.SGD) ---------------------------------------------- */

typedef struct chk_sgd_consts {
    float lr, momentum, weight_decay;
    float damp;       /* 1 - dampening */
    int has_momentum; /* momentum != 0: m is read (unless first_step) and written */
    int nesterov, first_step;
} chk_sgd_consts;

typedef struct chk_sgd_state {
    float p, m; /* m only where has_momentum */
} chk_sgd_state;

/*   gi = g + weight_decay * p
 *   momentum == 0:  p = p - lr * gi
 *   otherwise:      mi = first_step ? gi : momentum * m + damp * gi;  m = mi
 *                   d = nesterov ? gi + momentum * mi : mi;  p = p - lr * d */
CHK_FN chk_sgd_state chk_sgd_step(chk_sgd_consts k, chk_sgd_state s, float g)
{
    float gi = g + k.weight_decay * s.p;
    float d = gi;
    if (k.has_momentum) {
        s.m = k.first_step ? gi : k.momentum * s.m + k.damp * gi;
        d = k.nesterov ? gi + k.momentum * s.m : s.m;
    }
    s.p = s.p - k.lr * d;
    return s;
}

/* ---- Adam and AdamW (torch.optim.Adam, AdamW) ------------------------------- */

typedef struct chk_adam_consts {
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size; /* lr / (1 - beta1^step), in double, then rounded */
    float bc2_sqrt;  /* sqrt(1 - beta2^step), in double, then rounded */
    float eps;
    float decay; /* AdamW: 1 - lr * weight_decay; Adam: 1 */
    float l2;    /* Adam: weight_decay; AdamW: 0 */
} chk_adam_consts;

typedef struct chk_adam_state {
    float p, m, v;
} chk_adam_state;

/*   gi = g + l2 * p;  pi = p * decay
 *   m = beta1 * m + one_minus_beta1 * gi
 *   v = beta2 * v + (one_minus_beta2 * gi) * gi
 *   p = pi - (step_size * m) / (sqrt(v) / bc2_sqrt + eps)
 * A macro over the type T, with SQRT its square root, so that the host
 * also runs it on GCC vectors of floats (backends/host/optim.c): the same
 * operators, so the same bits. p, m and v are lvalues, updated. */
/* clang-format off */
#define CHK_ADAM_UPDATE(T, SQRT, k, p, m, v, g)                                             \
    do {                                                                                  \
        T gi_ = (g) + (k).l2 * (p);                                                       \
        T pi_ = (p) * (k).decay;                                                          \
        (m) = (k).beta1 * (m) + (k).one_minus_beta1 * gi_;                                \
        (v) = (k).beta2 * (v) + (k).one_minus_beta2 * gi_ * gi_;                          \
        (p) = pi_ - (k).step_size * (m) / (SQRT(v) / (k).bc2_sqrt + (k).eps);             \
    } while (0)
/* clang-format on */

CHK_FN chk_adam_state chk_adam_step(chk_adam_consts k, chk_adam_state s, float g)
{
    CHK_ADAM_UPDATE(float, CHK_SQRTF, k, s.p, s.m, s.v, g);
    return s;
}

#endif
