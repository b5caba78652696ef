/* The optimizer formulas every backend computes, with the scalars prepared
 * once on the host. Data-parallel replicas on different backends apply the
 * same reduced gradient and must end with the same bits, so each backend
 * evaluates exactly these operations in this order, every one rounded on
 * its own (no fused multiply-add: OpenCL kernels turn FP_CONTRACT off and
 * build with correctly rounded divide and sqrt where the devices offer it;
 * CUDA kernels use the _rn intrinsics; the host uses plain SSE/AVX or C).
 *
 * SGD, with damp = 1 - dampening:
 *   gi = g + weight_decay * p
 *   momentum == 0:  p = p - lr * gi
 *   otherwise:      mi = first_step ? gi : momentum * m + damp * gi;  m = mi
 *                   d = nesterov ? gi + momentum * mi : mi;  p = p - lr * d
 *
 * Adam / AdamW, with the chi_adam_consts below:
 *   gi = g + l2 * p;  pi = p * decay
 *   mi = beta1 * m + one_minus_beta1 * gi
 *   vi = beta2 * v + (one_minus_beta2 * gi) * gi;  m = mi;  v = vi
 *   p = pi - (step_size * mi) / (sqrt(vi) / bc2_sqrt + eps)
 */
#ifndef CHORUS_LIB_OPTIM_CONSTS_H
#define CHORUS_LIB_OPTIM_CONSTS_H

#include <math.h>
#include <chorus/ops.h>

typedef struct chi_adam_consts {
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size;   /* lr / (1 - beta1^step), in double, then rounded */
    float bc2_sqrt;    /* sqrt(1 - beta2^step), in double, then rounded */
    float eps;
    float decay;       /* AdamW: 1 - lr * weight_decay; Adam: 1 */
    float l2;          /* Adam: weight_decay; AdamW: 0 */
} chi_adam_consts;

static inline chi_adam_consts chi_adam_consts_of(const ch_adam_params *a)
{
    double t = (double)a->step;
    chi_adam_consts k;
    k.beta1 = a->beta1;
    k.one_minus_beta1 = 1.0f - a->beta1;
    k.beta2 = a->beta2;
    k.one_minus_beta2 = 1.0f - a->beta2;
    k.step_size = (float)((double)a->lr / (1.0 - pow((double)a->beta1, t)));
    k.bc2_sqrt = (float)sqrt(1.0 - pow((double)a->beta2, t));
    k.eps = a->eps;
    float lr_wd = a->lr * a->weight_decay;
    k.decay = a->decoupled ? 1.0f - lr_wd : 1.0f;
    k.l2 = a->decoupled ? 0.0f : a->weight_decay;
    return k;
}

/* SGD's 1 - dampening, rounded once on the host. */
static inline float chi_sgd_damp(const ch_sgd_params *s) { return 1.0f - s->dampening; }

#endif
