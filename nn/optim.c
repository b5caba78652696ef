/* Losses, optimizers, gradient clipping and learning-rate schedules. */
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"
#include "stamp.h"

/* ---- Losses ------------------------------------------------------------------- */

struct ch_loss {
    ch_loss_kind kind;
    ch_tensor *value;     /* [1] */
    ch_tensor *work;      /* probabilities (CE) or pred - target (MSE) */
    ch_tensor *sq;        /* MSE: squared differences */
    ch_tensor *grad;
    ch_tensor *wide; /* CE: half logits widened to f32 */
    const ch_tensor *target;
    int64_t n;
};

ch_status ch_loss_new(ch_loss **out, ch_loss_kind kind)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loss_new: out is NULL");
    *out = NULL;
    if (kind != CH_LOSS_CROSS_ENTROPY && kind != CH_LOSS_MSE)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loss_new: kind %d is not a ch_loss_kind",
                         (int)kind);
    *out = calloc(1, sizeof **out);
    if (!*out)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_loss_new: out of memory");
    (*out)->kind = kind;
    return CH_OK;
}

void ch_loss_free(ch_loss *loss)
{
    if (!loss)
        return;
    ch_tensor_free(loss->value);
    ch_tensor_free(loss->work);
    ch_tensor_free(loss->sq);
    ch_tensor_free(loss->grad);
    ch_tensor_free(loss->wide);
    free(loss);
}

static ch_status mse_forward(ch_loss *l, const ch_tensor *pred, const ch_tensor *target)
{
    ch_device *dev = ch_tensor_device(pred);
    int64_t n = ch_tensor_numel(pred), flat[2] = {1, n};
    TRY(nn_ensure(&l->work, dev, CH_F32, 2, flat));
    TRY(nn_ensure(&l->sq, dev, CH_F32, 2, flat));
    ch_tensor *p = NULL, *t = NULL;
    ch_status st = nn_view(&p, pred, 2, flat);
    if (st == CH_OK)
        st = nn_view(&t, target, 2, flat);
    if (st == CH_OK)
        st = ch_sub(l->work, p, t);
    if (st == CH_OK)
        st = ch_mul(l->sq, l->work, l->work);
    if (st == CH_OK)
        st = ch_mean(l->value, l->sq, 1);
    ch_tensor_free(p);
    ch_tensor_free(t);
    return st;
}

ch_status ch_loss_forward(ch_loss *loss, ch_tensor **value, const ch_tensor *pred,
                          const ch_tensor *target)
{
    if (!loss || !value || !pred || !target)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loss_forward: %s is NULL",
                         !loss ? "loss" : !value ? "value" : !pred ? "pred" : "target");
    *value = NULL;
    int64_t one[1] = {1};
    TRY(nn_ensure(&loss->value, ch_tensor_device(pred), CH_F32, 1, one));
    if (loss->kind == CH_LOSS_MSE) {
        if (ch_tensor_numel(target) != ch_tensor_numel(pred))
            return chi_error(CH_ERR_SHAPE, "ch_loss_forward: target has %lld elements, pred "
                             "has %lld", (long long)ch_tensor_numel(target),
                             (long long)ch_tensor_numel(pred));
        TRY(mse_forward(loss, pred, target));
    } else {
        int64_t shape[2] = {ch_tensor_dim(pred, 0), ch_tensor_dim(pred, 1)};
        if (ch_tensor_ndim(pred) != 2)
            return chi_error(CH_ERR_SHAPE, "ch_loss_forward: pred has %d dimensions, expected "
                             "2 ([N, C])", ch_tensor_ndim(pred));
        TRY(nn_ensure(&loss->work, ch_tensor_device(pred), CH_F32, 2, shape));
        if (ch_tensor_dtype(pred) != CH_F32) {
            /* Half logits (mixed precision), widened: the loss in f32, as
             * autocast's cross_entropy computes it. */
            TRY(nn_ensure(&loss->wide, ch_tensor_device(pred), CH_F32, 2, shape));
            TRY(ch_cast(loss->wide, pred));
            pred = loss->wide;
        }
        TRY(ch_softmax_xent(loss->value, loss->work, pred, target));
    }
    loss->target = target;
    loss->n = ch_tensor_numel(pred);
    *value = loss->value;
    return CH_OK;
}

ch_status ch_loss_backward(ch_loss *loss, ch_tensor **dpred, float scale)
{
    if (!loss || !dpred)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loss_backward: %s is NULL",
                         !loss ? "loss" : "dpred");
    *dpred = NULL;
    if (!loss->target)
        return chi_error(CH_ERR_STATE, "ch_loss_backward: no forward pass to go back through");
    int64_t shape[2] = {ch_tensor_dim(loss->work, 0), ch_tensor_dim(loss->work, 1)};
    TRY(nn_ensure(&loss->grad, ch_tensor_device(loss->work), CH_F32, 2, shape));
    if (loss->kind == CH_LOSS_MSE)
        TRY(ch_scale(loss->grad, loss->work, 2.0f * scale / (float)loss->n));
    else
        TRY(ch_softmax_xent_backward(loss->grad, loss->work, loss->target, scale));
    *dpred = loss->grad;
    return CH_OK;
}

ch_status ch_loss_forward_backward(ch_loss *loss, ch_tensor **value, ch_tensor **dpred,
                                   ch_tensor *pred, const ch_tensor *target, float scale)
{
    if (!loss || !value || !dpred || !pred || !target)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_loss_forward_backward: %s is NULL",
                         !loss    ? "loss"
                         : !value ? "value"
                         : !dpred ? "dpred"
                         : !pred  ? "pred"
                                  : "target");
    *value = *dpred = NULL;
    if (loss->kind == CH_LOSS_MSE) {
        TRY(ch_loss_forward(loss, value, pred, target));
        return ch_loss_backward(loss, dpred, scale);
    }
    if (ch_tensor_ndim(pred) != 2)
        return chi_error(CH_ERR_SHAPE,
                         "ch_loss_forward_backward: pred has %d dimensions, "
                         "expected 2 ([N, C])",
                         ch_tensor_ndim(pred));
    int64_t one[1] = {1};
    TRY(nn_ensure(&loss->value, ch_tensor_device(pred), CH_F32, 1, one));
    /* Nothing of an earlier forward is left for a backward to read. */
    loss->target = NULL;
    TRY(ch_softmax_xent_fused(loss->value, pred, target, scale));
    *value = loss->value;
    *dpred = pred;
    return CH_OK;
}

/* ---- Optimizers ------------------------------------------------------------------ */

struct ch_optimizer {
    ch_module *model;
    ch_optimizer_options o;
    int nparams;
    ch_tensor **m;      /* momentum or first moment, per parameter */
    ch_tensor **v;      /* second moment (Adam) */
    unsigned char *fresh; /* per parameter: its momentum was made for a step not
                           * yet taken (SGD starts it from the gradient) */
    int64_t steps;
    /* A part of the parameters (nn_optimizer_set_range): the state and the
     * updates of elements [lo, hi) of their concatenation in parameter
     * order; each parameter's state is then 1-D, its elements in that
     * range. ranged 0: all of every parameter, state shaped like it. */
    int ranged;
    int64_t lo, hi;
    int64_t *off; /* [nparams + 1]: each parameter's first element */
    int one_by_one; /* ch_optimizer_set_one_by_one */
    /* adam_all's tables, [nparams + 1] each (views: 2 nparams + 1), made
     * with the optimizer so that a step allocates nothing. */
    chi_adam_tensors *adam_t;
    nn_param **adam_np;
    ch_tensor **adam_views;
};

ch_optimizer_options ch_optimizer_defaults(ch_optimizer_kind kind, float lr)
{
    ch_optimizer_options o = {.kind = kind, .lr = lr, .beta1 = 0.9f, .beta2 = 0.999f,
                              .eps = 1e-8f};
    o.weight_decay = kind == CH_OPT_ADAMW ? 0.01f : 0.0f;
    return o;
}

ch_status ch_optimizer_new(ch_optimizer **out, ch_module *model,
                           const ch_optimizer_options *options)
{
    if (!out || !model || !options)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_optimizer_new: %s is NULL",
                         !out ? "out" : !model ? "model" : "options");
    *out = NULL;
    if (options->kind != CH_OPT_SGD && options->kind != CH_OPT_ADAM &&
        options->kind != CH_OPT_ADAMW)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_optimizer_new: options->kind %d is not a "
                         "ch_optimizer_kind", (int)options->kind);
    ch_optimizer *opt = calloc(1, sizeof *opt);
    int n = ch_module_param_count(model);
    if (opt) {
        opt->m = calloc((size_t)n + 1, sizeof *opt->m);
        opt->v = calloc((size_t)n + 1, sizeof *opt->v);
        opt->fresh = calloc((size_t)n + 1, 1);
        opt->adam_t = calloc((size_t)n + 1, sizeof *opt->adam_t);
        opt->adam_np = calloc((size_t)n + 1, sizeof *opt->adam_np);
        opt->adam_views = calloc(2 * (size_t)n + 1, sizeof *opt->adam_views);
    }
    if (!opt || !opt->m || !opt->v || !opt->fresh || !opt->adam_t || !opt->adam_np ||
        !opt->adam_views) {
        ch_optimizer_free(opt);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_optimizer_new: out of memory");
    }
    opt->model = model;
    opt->o = *options;
    opt->nparams = n;
    *out = opt;
    return CH_OK;
}

void ch_optimizer_free(ch_optimizer *opt)
{
    if (!opt)
        return;
    for (int i = 0; opt->m && i < opt->nparams; i++)
        ch_tensor_free(opt->m[i]);
    for (int i = 0; opt->v && i < opt->nparams; i++)
        ch_tensor_free(opt->v[i]);
    free(opt->m);
    free(opt->v);
    free(opt->fresh);
    free(opt->adam_t);
    free(opt->adam_np);
    free(opt->adam_views);
    free(opt->off);
    free(opt);
}

ch_status nn_optimizer_set_range(ch_optimizer *opt, int64_t lo, int64_t hi)
{
    for (int i = 0; i < opt->nparams; i++)
        if (opt->m[i] || opt->v[i])
            return chi_error(CH_ERR_STATE, "the optimizer's part is set before its first step");
    int64_t *off = calloc((size_t)opt->nparams + 1, sizeof *off);
    if (!off)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "out of memory");
    for (int i = 0; i < opt->nparams; i++) {
        ch_tensor *p = NULL;
        ch_status st = ch_module_param(opt->model, i, NULL, &p, NULL);
        if (st != CH_OK) {
            free(off);
            return st;
        }
        off[i + 1] = off[i] + ch_tensor_numel(p);
    }
    if (lo < 0 || hi < lo || hi > off[opt->nparams]) {
        int64_t all = off[opt->nparams];
        free(off);
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "the optimizer's part [%lld, %lld) is not "
                         "inside the %lld parameters",
                         (long long)lo, (long long)hi, (long long)all);
    }
    free(opt->off);
    opt->off = off;
    opt->ranged = 1;
    opt->lo = lo;
    opt->hi = hi;
    return CH_OK;
}

int nn_optimizer_ranged(const ch_optimizer *opt)
{
    return opt && opt->ranged;
}

int64_t nn_optimizer_state_bytes(const ch_optimizer *opt, int *made)
{
    int per = opt->o.kind != CH_OPT_SGD ? 2 : opt->o.momentum != 0.0f ? 1 : 0;
    int64_t bytes = 0;
    *made = 0;
    for (int i = 0; i < opt->nparams; i++) {
        int64_t first, count;
        nn_optimizer_part(opt, i, &first, &count);
        bytes += (int64_t)per * count * (int64_t)sizeof(float);
        *made |= opt->m[i] != NULL;
    }
    return bytes;
}

int nn_optimizer_part(const ch_optimizer *opt, int i, int64_t *first, int64_t *count)
{
    if (!opt->ranged) {
        ch_tensor *p = NULL;
        *first = 0;
        *count = ch_module_param(opt->model, i, NULL, &p, NULL) == CH_OK ? ch_tensor_numel(p) : 0;
        return 0;
    }
    int64_t a = opt->off[i] > opt->lo ? opt->off[i] : opt->lo;
    int64_t b = opt->off[i + 1] < opt->hi ? opt->off[i + 1] : opt->hi;
    *first = a - opt->off[i];
    *count = b > a ? b - a : 0;
    return 1;
}

/* A new state tensor (its values unset) beside `p`: p's shape, or 1-D of
 * `part` elements for a ranged optimizer (part >= 0). */
static ch_status state_new(ch_tensor **s, const ch_tensor *p, int64_t part)
{
    int64_t shape[CH_MAX_DIMS];
    for (int i = 0; i < ch_tensor_ndim(p); i++)
        shape[i] = ch_tensor_dim(p, i);
    if (part >= 0)
        shape[0] = part;
    return ch_tensor_new(s, ch_tensor_device(p), CH_F32, part >= 0 ? 1 : ch_tensor_ndim(p), shape);
}

/* A zeroed state tensor beside `p`, moved there if the model moved: p's
 * shape, or 1-D of `part` elements for a ranged optimizer (part >= 0). */
static ch_status state_for(ch_tensor **s, const ch_tensor *p, int64_t part, int *fresh)
{
    ch_device *dev = ch_tensor_device(p);
    *fresh = 0;
    if (*s && ch_tensor_device(*s) != dev) {
        ch_tensor *moved = NULL;
        TRY(ch_tensor_to(&moved, *s, dev));
        ch_tensor_free(*s);
        *s = moved;
    }
    if (*s)
        return CH_OK;
    TRY(state_new(s, p, part));
    *fresh = 1;
    return ch_fill(*s, 0.0);
}

/* Every state tensor the step needs, made or moved before any parameter
 * changes: running out of memory here leaves the model and the optimizer
 * as they were, never half a step (data-parallel replicas would part). */
ch_status nn_optimizer_prepare(ch_optimizer *opt)
{
    for (int i = 0; i < opt->nparams; i++) {
        ch_tensor *p = NULL;
        TRY(ch_module_param(opt->model, i, NULL, &p, NULL));
        int64_t first, count;
        int64_t part = nn_optimizer_part(opt, i, &first, &count) ? count : -1;
        if (part == 0)
            continue; /* none of it is this optimizer's */
        int fresh = 0;
        if (opt->o.kind != CH_OPT_SGD) {
            TRY(state_for(&opt->m[i], p, part, &fresh));
            TRY(state_for(&opt->v[i], p, part, &fresh));
        } else if (opt->o.momentum != 0.0f) {
            TRY(state_for(&opt->m[i], p, part, &fresh));
            if (fresh)
                opt->fresh[i] = 1;
        }
    }
    return CH_OK;
}

static ch_status sgd_param(ch_optimizer *opt, int i, ch_tensor *p, ch_tensor *g, float lr)
{
    ch_sgd_params sp = {lr, opt->o.momentum, opt->o.dampening, opt->o.weight_decay,
                        opt->o.nesterov};
    return ch_sgd_step(p, opt->m[i], g, &sp, opt->o.momentum != 0.0f && opt->fresh[i]);
}

/* Every parameter's Adam step: those of one device (in a row, in the
 * model's order) in one chi_adam_step_multi, one launch or a few on a
 * backend that has the slot instead of one per parameter (GPT-2 has 148);
 * with one_by_one a call each, as before. */
static ch_status adam_all(ch_optimizer *opt, float lr)
{
    ch_adam_params ap = {lr, opt->o.beta1, opt->o.beta2, opt->o.eps, opt->o.weight_decay,
                         opt->o.kind == CH_OPT_ADAMW, opt->steps + 1};
    int n = opt->nparams, used = 0;
    chi_adam_tensors *t = opt->adam_t;
    nn_param **np = opt->adam_np;
    ch_tensor **views = opt->adam_views;
    ch_status st = CH_OK;
    for (int i = 0; i < n && st == CH_OK; i++) {
        nn_param *q = nn_param_at(opt->model, i);
        st = nn_grad_settle(q); /* as ch_module_param hands it out */
        int64_t first, count;
        int ranged = nn_optimizer_part(opt, i, &first, &count);
        if (st != CH_OK || count == 0)
            continue;
        /* A ranged optimizer updates its elements only, through views;
         * the rounded copy is the whole weight's, so it is left out. */
        chi_adam_tensors *e = &t[used];
        *e = (chi_adam_tensors){q->value, opt->m[i], opt->v[i], q->grad, NULL};
        np[used] = NULL;
        if (ranged) {
            st = nn_flat_view(&views[2 * used], q->value, first, count);
            if (st == CH_OK)
                st = nn_flat_view(&views[2 * used + 1], q->grad, first, count);
            e->p = views[2 * used];
            e->g = views[2 * used + 1];
        } else {
            e->ph = q->half ? *q->half : NULL;
            np[used] = q;
        }
        used++;
    }
    for (int i = 0; opt->one_by_one && st == CH_OK && i < used; i++)
        st = chi_adam_step_one(&t[i], &ap);
    for (int a = 0, b; !opt->one_by_one && st == CH_OK && a < used; a = b) {
        for (b = a + 1; b < used && ch_tensor_device(t[b].p) == ch_tensor_device(t[a].p);)
            b++;
        st = chi_adam_step_multi(b - a, t + a, &ap);
    }
    /* The copies rounded in the step are current for the next forward. */
    for (int i = 0; st == CH_OK && i < used; i++)
        if (np[i] && chi_adam_half_fused(t[i].p, t[i].ph)) {
            np[i]->half_stamps[0] = chi_tensor_stamp(t[i].p);
            np[i]->half_stamps[1] = chi_tensor_stamp(t[i].ph);
        }
    for (int i = 0; i < 2 * used; i++) { /* the ranged ones' views; NULL elsewhere */
        ch_tensor_free(views[i]);
        views[i] = NULL;
    }
    return st;
}

/* Every parameter's SGD step, one by one. */
static ch_status sgd_all(ch_optimizer *opt, float lr)
{
    for (int i = 0; i < opt->nparams; i++) {
        nn_param *np = nn_param_at(opt->model, i); /* in range: counted by the caller */
        TRY(nn_grad_settle(np));                   /* as ch_module_param hands it out */
        ch_tensor *p = np->value, *g = np->grad;
        int64_t first, count;
        int ranged = nn_optimizer_part(opt, i, &first, &count);
        if (count == 0)
            continue;
        /* A ranged optimizer updates its elements only, through views. */
        ch_tensor *pv = NULL, *gv = NULL;
        ch_status st = CH_OK;
        if (ranged) {
            st = nn_flat_view(&pv, p, first, count);
            if (st == CH_OK)
                st = nn_flat_view(&gv, g, first, count);
        }
        if (st == CH_OK)
            st = sgd_param(opt, i, ranged ? pv : p, ranged ? gv : g, lr);
        ch_tensor_free(pv);
        ch_tensor_free(gv);
        TRY(st);
    }
    return CH_OK;
}

ch_status ch_optimizer_step(ch_optimizer *opt, float lr)
{
    if (!opt)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_optimizer_step: opt is NULL");
    if (ch_module_param_count(opt->model) != opt->nparams)
        return chi_error(CH_ERR_STATE,
                         "ch_optimizer_step: the model has %d parameters, it had %d when the "
                         "optimizer was made",
                         ch_module_param_count(opt->model), opt->nparams);
    TRY(nn_optimizer_prepare(opt));
    TRY(opt->o.kind == CH_OPT_SGD ? sgd_all(opt, lr) : adam_all(opt, lr));
    memset(opt->fresh, 0, (size_t)opt->nparams);
    opt->steps++;
    return CH_OK;
}

ch_status ch_optimizer_set_one_by_one(ch_optimizer *opt, int on)
{
    if (!opt)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_optimizer_set_one_by_one: opt is NULL");
    opt->one_by_one = on != 0;
    return CH_OK;
}

int64_t ch_optimizer_steps(const ch_optimizer *opt) { return opt ? opt->steps : 0; }

ch_status ch_optimizer_set_steps(ch_optimizer *opt, int64_t steps)
{
    if (!opt || steps < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_optimizer_set_steps: %s",
                         !opt ? "opt is NULL" : "steps is negative");
    opt->steps = steps;
    return CH_OK;
}

static int states_per_param(const ch_optimizer *opt)
{
    return opt->o.kind == CH_OPT_SGD ? 1 : 2;
}

int ch_optimizer_state_count(const ch_optimizer *opt)
{
    return opt ? opt->nparams * states_per_param(opt) : 0;
}

ch_status ch_optimizer_state(const ch_optimizer *opt, int index, const char **name,
                             ch_tensor **value)
{
    if (!opt || index < 0 || index >= ch_optimizer_state_count(opt))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_optimizer_state: %s",
                         !opt ? "opt is NULL" : "index out of range");
    int k = states_per_param(opt), i = index / k, j = index % k;
    static const char *const names[2][2] = {{"momentum", ""}, {"exp_avg", "exp_avg_sq"}};
    if (name)
        *name = names[k - 1][j];
    if (value)
        *value = j == 0 ? opt->m[i] : opt->v[i];
    return CH_OK;
}

ch_optimizer_kind nn_optimizer_kind(const ch_optimizer *opt) { return opt->o.kind; }

ch_status nn_optimizer_state_slot(ch_optimizer *opt, int index, ch_tensor ***slot,
                                  ch_tensor **param, int writing)
{
    int k = states_per_param(opt), i = index / k;
    TRY(ch_module_param(opt->model, i, NULL, param, NULL));
    *slot = index % k == 0 ? &opt->m[i] : &opt->v[i];
    if (writing)
        opt->fresh[i] = 0; /* a state that steps were taken with goes there */
    return CH_OK;
}

ch_status nn_optimizer_state_make(ch_optimizer *opt, int index, ch_tensor **out)
{
    ch_tensor **slot, *p;
    *out = NULL;
    TRY(nn_optimizer_state_slot(opt, index, &slot, &p, 1));
    if (!*slot)
        TRY(state_new(slot, p, -1));
    *out = *slot;
    return CH_OK;
}

/* ---- Gradient clipping --------------------------------------------------------- */

static ch_status sum_squares(const ch_tensor *g, double *out)
{
    ch_device *dev = ch_tensor_device(g);
    int64_t n = ch_tensor_numel(g), flat[2] = {1, n}, one[1] = {1};
    ch_tensor *gv = NULL, *sq = NULL, *s = NULL;
    ch_status st = nn_view(&gv, g, 2, flat);
    if (st == CH_OK)
        st = ch_tensor_new(&sq, dev, CH_F32, 2, flat);
    if (st == CH_OK)
        st = ch_tensor_new(&s, dev, CH_F32, 1, one);
    if (st == CH_OK)
        st = ch_mul(sq, gv, gv);
    if (st == CH_OK)
        st = ch_sum(s, sq, 1);
    float v = 0.0f;
    if (st == CH_OK)
        st = ch_tensor_download(s, &v, sizeof v);
    *out = v;
    ch_tensor_free(gv);
    ch_tensor_free(sq);
    ch_tensor_free(s);
    return st;
}

ch_status ch_clip_grad_norm(ch_module *model, float *norm, float max_norm)
{
    if (!model)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_clip_grad_norm: model is NULL");
    if (!(max_norm > 0.0f))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_clip_grad_norm: max_norm %g, expected > 0",
                         max_norm);
    double total = 0.0;
    int n = ch_module_param_count(model);
    for (int i = 0; i < n; i++) {
        ch_tensor *g = NULL;
        double s = 0.0;
        TRY(ch_module_param(model, i, NULL, NULL, &g));
        TRY(sum_squares(g, &s));
        total += s;
    }
    double nrm = sqrt(total);
    if (norm)
        *norm = (float)nrm;
    if (nrm <= max_norm)
        return CH_OK;
    float coef = (float)(max_norm / (nrm + 1e-6));
    for (int i = 0; i < n; i++) {
        ch_tensor *g = NULL;
        TRY(ch_module_param(model, i, NULL, NULL, &g));
        TRY(ch_scale(g, g, coef));
    }
    return CH_OK;
}

/* ---- Learning-rate schedules --------------------------------------------------- */

float ch_lr_at(const ch_lr_schedule *s, int64_t step)
{
    if (!s)
        return 0.0f;
    if (s->warmup_steps > 0 && step < s->warmup_steps)
        return s->base_lr * (float)(step + 1) / (float)s->warmup_steps;
    switch (s->kind) {
    case CH_LR_STEP:
        return s->step_size > 0 ? s->base_lr * powf(s->gamma, (float)(step / s->step_size))
                                : s->base_lr;
    case CH_LR_COSINE: {
        int64_t span = s->total_steps - s->warmup_steps;
        if (span <= 0 || step >= s->total_steps)
            return s->min_lr;
        double t = (double)(step - s->warmup_steps) / (double)span;
        return (float)(s->min_lr + 0.5 * (s->base_lr - s->min_lr) * (1.0 + cos(M_PI * t)));
    }
    case CH_LR_CONSTANT:
        break;
    }
    return s->base_lr;
}
