/* The optimizers' scalars, prepared once on the host for every backend's
 * per-element update (lib/kernels/optim_step.h holds the formulas and
 * says why every backend must evaluate them exactly as written). */
#ifndef CHORUS_LIB_OPTIM_CONSTS_H
#define CHORUS_LIB_OPTIM_CONSTS_H

#include <math.h>
#include <chorus/ops.h>

#include "kernels/optim_step.h"

static inline chk_adam_consts chi_adam_consts_of(const ch_adam_params *a)
{
    double t = (double)a->step;
    chk_adam_consts k;
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

/* SGD's scalars, 1 - dampening rounded once here. */
static inline chk_sgd_consts chi_sgd_consts_of(const ch_sgd_params *s, int first_step)
{
    chk_sgd_consts k;
    k.lr = s->lr;
    k.momentum = s->momentum;
    k.weight_decay = s->weight_decay;
    k.damp = 1.0f - s->dampening;
    k.has_momentum = s->momentum != 0.0f;
    k.nesterov = s->nesterov != 0;
    k.first_step = first_step != 0;
    return k;
}

#endif
