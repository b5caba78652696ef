/* The containers: Sequential, which runs its children one after the
 * other, each on its own device, and Residual, main(x) + shortcut(x). The
 * tree they belong to (names, parameters, the passes) is nn/module.c's. */
#include "config.h"

#include <string.h>

#include "nn.h"

/* ---- Sequential ------------------------------------------------------------------ */

/* The device a child runs on: its own, or where its input is. */
static ch_device *run_device(const ch_module *c, const ch_tensor *x)
{
    return c->dev ? c->dev : ch_tensor_device(x);
}

/* `t` on `dev`: itself, or a copy kept in *slot. */
static ch_status on_device(ch_tensor **slot, const ch_tensor *t, ch_device *dev,
                           const ch_tensor **out)
{
    if (ch_tensor_device(t) == dev) {
        *out = t;
        return CH_OK;
    }
    int64_t shape[CH_MAX_DIMS];
    nn_shape(t, shape);
    TRY(nn_ensure(slot, dev, ch_tensor_dtype(t), ch_tensor_ndim(t), shape));
    TRY(ch_copy(*slot, t));
    *out = *slot;
    return CH_OK;
}

static ch_status seq_forward(ch_module *m, const ch_tensor *x)
{
    const ch_tensor *cur = x;
    for (int i = 0; i < m->nchild; i++) {
        ch_module *c = m->child[i];
        TRY(on_device(&m->moved[i], cur, run_device(c, cur), &cur));
        TRY(nn_forward(c, cur));
        cur = c->y;
    }
    return nn_view_of(&m->y, cur);
}

static ch_status seq_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    /* Child i's input gradient is needed when the caller wants dx or a
     * child before it has parameters; otherwise (the first Linear of an
     * mlp, behind a Flatten) it would be computed for nothing. */
    int first = 0;
    while (first < m->nchild && ch_module_param_count(m->child[first]) == 0)
        first++;
    const ch_tensor *g = dy;
    for (int i = m->nchild - 1; i >= 0; i--) {
        ch_module *c = m->child[i];
        TRY(on_device(&m->moved_grad[i], g, ch_tensor_device(c->y), &g));
        int need = want_dx || i > first;
        TRY(nn_backward(c, g, need));
        if (i + 1 < m->nchild) /* the next child's input gradient is read */
            nn_release(&m->child[i + 1]->dx);
        if (!need)
            return CH_OK;
        g = c->dx;
    }
    /* dx on the input's device, as the caller expects: a view, which
     * keeps the first child's gradient when it is that. */
    if (m->nchild == 0 || !want_dx)
        return CH_OK;
    const ch_tensor *out = NULL;
    TRY(on_device(&m->moved_grad[m->nchild], g, ch_tensor_device(m->x), &out));
    TRY(nn_view_of(&m->dx, out));
    nn_release(&m->child[0]->dx);
    return CH_OK;
}

/* ---- Residual ----------------------------------------------------------------------
 * y = main(x) + shortcut(x), the shortcut the identity when absent; both
 * branches on the input's device. */

static ch_status residual_forward(ch_module *m, const ch_tensor *x)
{
    ch_module *main_ = m->child[0];
    TRY(nn_forward(main_, x));
    const ch_tensor *s = x;
    if (m->nchild > 1) {
        TRY(nn_forward(m->child[1], x));
        s = m->child[1]->y;
    }
    if (ch_tensor_numel(s) != ch_tensor_numel(main_->y))
        return chi_error(CH_ERR_SHAPE,
                         "ch_module_forward: Residual: the main branch gives %lld "
                         "elements, the shortcut %lld",
                         (long long)ch_tensor_numel(main_->y), (long long)ch_tensor_numel(s));
    int64_t shape[CH_MAX_DIMS];
    nn_shape(main_->y, shape);
    /* The sum in f32 where either term is (a GPT's residual stream, with
     * a branch's half output under mixed precision), else in the terms'
     * format. */
    ch_dtype dt = ch_tensor_dtype(main_->y);
    if (ch_tensor_dtype(s) != dt)
        dt = CH_F32;
    TRY(nn_ensure(&m->y, ch_tensor_device(x), dt, ch_tensor_ndim(main_->y), shape));
    return ch_add(m->y, main_->y, s);
}

static ch_status residual_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    /* The shortcut's parameters come after the main branch's: its
     * gradients first, in reverse order like the rest of backward. */
    if (m->nchild > 1)
        TRY(nn_backward(m->child[1], dy, want_dx));
    TRY(nn_backward(m->child[0], dy, want_dx));
    if (!want_dx)
        return CH_OK;
    int64_t shape[CH_MAX_DIMS];
    nn_shape(m->x, shape);
    TRY(nn_ensure(&m->dx, ch_tensor_device(m->x), ch_tensor_dtype(m->x), ch_tensor_ndim(m->x),
                  shape));
    TRY(ch_add(m->dx, m->child[0]->dx, m->nchild > 1 ? m->child[1]->dx : dy));
    for (int i = 0; i < m->nchild; i++)
        nn_release(&m->child[i]->dx);
    return CH_OK;
}

const nn_ops nn_seq_ops = {"Sequential", seq_forward, seq_backward, CH_F32, 1, NULL, 1};
static const nn_ops residual_ops = {
    "Residual", residual_forward, residual_backward, CH_F32, 1, NULL, 1};

ch_status ch_nn_sequential(ch_module **out)
{
    return nn_module_new(out, &nn_seq_ops);
}

static ch_status check_seq(const char *fn, ch_module *seq, ch_module *child)
{
    if (!seq || !child) {
        ch_module_free(child);
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !seq ? "seq" : "child");
    }
    if (seq->ops != &nn_seq_ops) {
        ch_module_free(child);
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: seq is a %s, not a Sequential", fn,
                         seq->ops->kind);
    }
    if (child->parent) /* not freed: it belongs to its parent */
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: child already belongs to a %s", fn,
                         child->parent->ops->kind);
    return CH_OK;
}

ch_status ch_nn_sequential_add(ch_module *seq, ch_module *child)
{
    TRY(check_seq("ch_nn_sequential_add", seq, child));
    return nn_add_child(seq, child, NULL);
}

ch_status ch_nn_sequential_add_named(ch_module *seq, const char *name, ch_module *child)
{
    TRY(check_seq("ch_nn_sequential_add_named", seq, child));
    if (!name || strchr(name, '.')) {
        ch_module_free(child);
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_nn_sequential_add_named: name %s%s%s: "
                         "expected a name without a dot",
                         name ? "\"" : "", name ? name : "NULL", name ? "\"" : "");
    }
    return nn_add_child(seq, child, name);
}

ch_status ch_nn_residual(ch_module **out, ch_module *main_branch, ch_module *shortcut)
{
    ch_status st = CH_OK;
    if (!main_branch)
        st = chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_residual: main_branch is NULL");
    else if (main_branch->parent || (shortcut && shortcut->parent))
        st = chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_residual: a branch already belongs to "
                                                "another module");
    if (st == CH_OK)
        st = nn_module_new(out, &residual_ops);
    if (st != CH_OK) {
        if (out)
            *out = NULL;
        if (!main_branch || !main_branch->parent)
            ch_module_free(main_branch);
        if (shortcut && !shortcut->parent)
            ch_module_free(shortcut);
        return st;
    }
    st = nn_add_child(*out, main_branch, "");
    if (st != CH_OK) {
        ch_module_free(shortcut);
    } else if (shortcut) {
        st = nn_add_child(*out, shortcut, shortcut->named ? NULL : "shortcut");
    }
    if (st != CH_OK) {
        ch_module_free(*out);
        *out = NULL;
    }
    return st;
}
