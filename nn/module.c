/* The module tree: construction, names, parameters and buffers, moving,
 * cloning and the passes. The containers Sequential and Residual are in
 * nn/containers.c. */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"
#include "stamp.h"

static int same_shape(const ch_tensor *t, ch_device *dev, ch_dtype dtype, int ndim,
                      const int64_t *shape)
{
    if (!t || ch_tensor_device(t) != dev || ch_tensor_dtype(t) != dtype ||
        ch_tensor_ndim(t) != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (ch_tensor_dim(t, i) != shape[i])
            return 0;
    return 1;
}

void nn_release(ch_tensor **t)
{
    ch_tensor_free(*t);
    *t = NULL;
}

ch_status nn_ensure(ch_tensor **t, ch_device *dev, ch_dtype dtype, int ndim, const int64_t *shape)
{
    if (same_shape(*t, dev, dtype, ndim, shape))
        return CH_OK;
    nn_release(t);
    return ch_tensor_new(t, dev, dtype, ndim, shape);
}

ch_status nn_view(ch_tensor **out, const ch_tensor *t, int ndim, const int64_t *shape)
{
    /* A reshape only reads the layout; the const is dropped for the API. */
    return ch_tensor_reshape(out, (ch_tensor *)t, ndim, shape);
}

ch_status nn_flat_view(ch_tensor **out, const ch_tensor *t, int64_t first, int64_t count)
{
    int64_t all[1] = {ch_tensor_numel(t)};
    ch_tensor *flat = NULL;
    TRY(nn_view(&flat, t, 1, all));
    ch_status st = ch_tensor_view(out, flat, first, count);
    ch_tensor_free(flat);
    return st;
}

void nn_shape(const ch_tensor *t, int64_t *shape)
{
    for (int i = 0; i < ch_tensor_ndim(t); i++)
        shape[i] = ch_tensor_dim(t, i);
}

ch_status nn_view_of(ch_tensor **slot, const ch_tensor *t)
{
    int64_t shape[CH_MAX_DIMS];
    nn_shape(t, shape);
    nn_release(slot);
    return nn_view(slot, t, ch_tensor_ndim(t), shape);
}

ch_status nn_made(ch_module **out, ch_status st)
{
    if (st != CH_OK) {
        ch_module_free(*out);
        *out = NULL;
    }
    return st;
}

ch_status nn_module_new(ch_module **out, const nn_ops *ops)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_%s: out is NULL", ops->kind);
    *out = calloc(1, sizeof **out);
    if (!*out)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_nn_%s: out of memory", ops->kind);
    (*out)->ops = ops;
    (*out)->training = 1;
    (*out)->layer = -1;
    return CH_OK;
}

static ch_status host_device(ch_device **host)
{
    return ch_device_by_name(host, "host");
}

ch_status nn_add_param(ch_module *m, const char *local, int ndim, const int64_t *shape)
{
    ch_device *host = NULL;
    TRY(host_device(&host));
    nn_param *p = &m->params[m->nparams];
    p->local = local;
    snprintf(p->name, sizeof p->name, "%s", local);
    TRY(ch_tensor_new(&p->value, host, CH_F32, ndim, shape));
    m->nparams++; /* counted from here on: freed with the module */
    TRY(ch_tensor_new(&p->grad, host, CH_F32, ndim, shape));
    TRY(ch_fill(p->value, 0.0));
    TRY(ch_fill(p->grad, 0.0));
    m->dev = host;
    return CH_OK;
}

ch_status nn_add_buffer(ch_module *m, const char *local, int64_t n, double value)
{
    nn_buffer *b = &m->bufs[m->nbufs];
    b->local = local;
    snprintf(b->name, sizeof b->name, "%s", local);
    if (n == 0) { /* the counter */
        b->counter = &m->batches;
        m->nbufs++;
        return CH_OK;
    }
    ch_device *host = NULL;
    TRY(host_device(&host));
    TRY(ch_tensor_new(&b->value, host, CH_F32, 1, &n));
    m->nbufs++;
    TRY(ch_fill(b->value, value));
    m->dev = host;
    return CH_OK;
}

/* ---- Names ------------------------------------------------------------------
 * A parameter's name is the names of the modules from the root down, each
 * followed by a dot, then its own ("weight"); a module named "" adds no
 * level (a Residual's main branch, a transparent wrapper). The names, the
 * parameter numbering and the dropout streams' layer numbers are all given
 * from the root, whenever the tree changes. */

static ch_module *root_of(ch_module *m)
{
    while (m->parent)
        m = m->parent;
    return m;
}

static ch_status name_into(char *dst, const char *prefix, const char *local)
{
    int n = snprintf(dst, NN_NAME, "%s%s", prefix, local);
    if (n < 0 || n >= NN_NAME)
        return chi_error(CH_ERR_LIMIT, "the parameter name \"%s%s\" is longer than %d bytes",
                         prefix, local, NN_NAME - 1);
    return CH_OK;
}

static ch_status rename_tree(ch_module *m, const char *prefix, int *pindex, int *layer)
{
    m->layer = (*layer)++;
    m->pfirst = *pindex;
    *pindex += m->nparams;
    for (int i = 0; i < m->nparams; i++)
        TRY(name_into(m->params[i].name, prefix, m->params[i].local));
    for (int i = 0; i < m->nbufs; i++)
        TRY(name_into(m->bufs[i].name, prefix, m->bufs[i].local));
    for (int i = 0; i < m->nchild; i++) {
        ch_module *c = m->child[i];
        if (!c->named)
            snprintf(c->cname, sizeof c->cname, "%d", i);
        char p[NN_NAME];
        int n = snprintf(p, sizeof p, "%s%s%s", prefix, c->cname, c->cname[0] ? "." : "");
        if (n < 0 || n >= NN_NAME)
            return chi_error(CH_ERR_LIMIT, "the module path \"%s%s\" is longer than %d bytes",
                             prefix, c->cname, NN_NAME - 1);
        TRY(rename_tree(c, p, pindex, layer));
    }
    return CH_OK;
}

static ch_status rename_all(ch_module *m)
{
    int pindex = 0, layer = -1;
    return rename_tree(root_of(m), "", &pindex, &layer);
}

ch_status nn_add_child(ch_module *m, ch_module *c, const char *name)
{
    if (name && strlen(name) >= sizeof c->cname) {
        ch_module_free(c);
        return chi_error(CH_ERR_LIMIT, "the module name \"%s\" is longer than %zu bytes", name,
                         sizeof c->cname - 1);
    }
    int n = m->nchild + 1;
    ch_module **cs = realloc(m->child, (size_t)n * sizeof *cs);
    if (cs)
        m->child = cs;
    ch_tensor **mv = cs ? realloc(m->moved, (size_t)n * sizeof *mv) : NULL;
    if (mv)
        m->moved = mv;
    ch_tensor **mg = mv ? realloc(m->moved_grad, (size_t)(n + 1) * sizeof *mg) : NULL;
    if (mg)
        m->moved_grad = mg;
    if (!cs || !mv || !mg) {
        ch_module_free(c);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "adding a child to a %s: out of memory",
                         m->ops->kind);
    }
    m->child[m->nchild] = c;
    m->moved[m->nchild] = NULL;
    m->moved_grad[m->nchild] = NULL;
    m->moved_grad[n] = NULL;
    m->nchild = n;
    c->parent = m;
    if (name) { /* otherwise a name set before stays, or the index is given */
        c->named = 1;
        snprintf(c->cname, sizeof c->cname, "%s", name);
    }
    return rename_all(m);
}

ch_status ch_module_set_name(ch_module *m, const char *name)
{
    if (!m || !name)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_set_name: %s is NULL",
                         !m ? "m" : "name");
    if (strlen(name) >= sizeof m->cname || strchr(name, '.'))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_set_name: \"%s\": a name is at "
                         "most %zu bytes and has no dot", name, sizeof m->cname - 1);
    snprintf(m->cname, sizeof m->cname, "%s", name);
    m->named = 1;
    return rename_all(m);
}

const char *ch_module_name(const ch_module *m) { return m ? m->cname : "(null)"; }

/* ---- The passes ---------------------------------------------------------------- */

/* The forward and backward state of m (outputs, input gradients, the
 * intermediate tensors) freed, but for the tmp[] slots in `keep`. */
static void release_state(ch_module *m, unsigned keep)
{
    ch_tensor **ts[] = {&m->y, &m->dx, &m->aux, &m->aux2, &m->dy_cast};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        nn_release(ts[i]);
    for (int i = 0; i < NN_TEMPS; i++)
        if (!(keep & (1u << i)))
            nn_release(&m->tmp[i]);
    for (int i = 0; m->moved && i < m->nchild; i++)
        nn_release(&m->moved[i]);
    for (int i = 0; m->moved_grad && i <= m->nchild; i++)
        nn_release(&m->moved_grad[i]);
    m->x = NULL;
    m->dropped = 0;
}

static void free_state(ch_module *m)
{
    release_state(m, 0);
}

/* A recomputing segment, its forward (or backward) done: the state of
 * every module below it goes back to the allocator, where the next
 * segment finds the blocks. What the segment itself holds stays: its
 * output (a Sequential's is a view, which keeps its memory), its input
 * gradient, and the input its caller keeps. */
static void drop_below(ch_module *m)
{
    for (int i = 0; i < m->nchild; i++) {
        drop_below(m->child[i]);
        release_state(m->child[i], m->child[i]->keep);
    }
}

static void set_replaying(ch_module *m, int on)
{
    for (int i = 0; i < m->nchild; i++) {
        m->child[i]->replaying = on;
        set_replaying(m->child[i], on);
    }
}

/* A dropped segment's forward again, from the input it kept, before its
 * backward: the same ops on the same values give the same bits, dropout
 * draws the same masks (its stream depends on the seed, step, layer and
 * sample alone) and BatchNorm reuses its batch statistics (replaying).
 * No gradient hook runs in a forward. The output the caller holds stays
 * the segment's; the copy computed again is let go. */
static ch_status replay(ch_module *m)
{
    ch_tensor *y = m->y;
    m->y = NULL;
    set_replaying(m, 1);
    if (m->pass)
        m->pass(m->pass_user, m, 0, 0);
    ch_status st = m->ops->forward(m, m->x);
    if (m->pass)
        m->pass(m->pass_user, m, 0, 1);
    set_replaying(m, 0);
    ch_tensor_free(m->y);
    m->y = y;
    if (st == CH_OK)
        m->dropped = 0;
    return st;
}

ch_status nn_forward(ch_module *m, const ch_tensor *x)
{
    if (!m->dev)
        m->dev = ch_tensor_device(x);
    if (ch_tensor_device(x) != m->dev && m->ops != &nn_seq_ops)
        return chi_error(CH_ERR_DEVICE_MISMATCH, "ch_module_forward: %s is on %s but x is on %s",
                         m->ops->kind, ch_device_id(m->dev), ch_device_id(ch_tensor_device(x)));
    ch_dtype xt = ch_tensor_dtype(x);
    if (!m->ops->container && xt != m->ops->input && !(m->ops->half_in && nn_is_half(xt)))
        return chi_error(CH_ERR_DTYPE, "ch_module_forward: %s takes %s%s, x is %s", m->ops->kind,
                         ch_dtype_name(m->ops->input), m->ops->half_in ? ", bf16 or f16" : "",
                         ch_dtype_name(xt));
    m->x = x;
    ch_status st;
    if (!m->pass) {
        st = m->ops->forward(m, x);
    } else {
        m->pass(m->pass_user, m, 0, 0);
        st = m->ops->forward(m, x);
        m->pass(m->pass_user, m, 0, 1);
    }
    if (m->recompute) {
        drop_below(m);
        m->dropped = st == CH_OK;
    }
    return st;
}

ch_status nn_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    if (!m->x || !m->y)
        return chi_error(CH_ERR_STATE, "ch_module_backward: %s has no forward pass to go back "
                         "through", m->ops->kind);
    if (ch_tensor_numel(dy) != ch_tensor_numel(m->y))
        return chi_error(CH_ERR_SHAPE, "ch_module_backward: dy has %lld elements, the output "
                         "had %lld", (long long)ch_tensor_numel(dy),
                         (long long)ch_tensor_numel(m->y));
    ch_dtype dt = ch_tensor_dtype(dy), yt = ch_tensor_dtype(m->y);
    if (dt != CH_F32 && !nn_is_half(dt))
        return chi_error(CH_ERR_DTYPE,
                         "ch_module_backward: dy is %s, expected f32 or the "
                         "output's %s",
                         ch_dtype_name(dt), ch_dtype_name(yt));
    if (ch_tensor_device(dy) != ch_tensor_device(m->y))
        return chi_error(CH_ERR_DEVICE_MISMATCH, "ch_module_backward: dy is on %s but the "
                         "output is on %s", ch_device_id(ch_tensor_device(dy)),
                         ch_device_id(ch_tensor_device(m->y)));
    /* A gradient in another format than the output's (f32 from a loss for
     * half logits, f32 from a residual sum for a half branch): rounded or
     * widened to it, as autocast's backward casts it, so that each
     * backward reads dy in its output's format. */
    if (dt != yt) {
        int64_t shape[CH_MAX_DIMS];
        nn_shape(m->y, shape);
        if (dt != CH_F32 && yt != CH_F32)
            return chi_error(CH_ERR_DTYPE,
                             "ch_module_backward: dy is %s, expected f32 or the "
                             "output's %s",
                             ch_dtype_name(dt), ch_dtype_name(yt));
        TRY(nn_ensure(&m->dy_cast, ch_tensor_device(dy), yt, ch_tensor_ndim(m->y), shape));
        ch_tensor *flat = NULL;
        TRY(nn_view(&flat, dy, ch_tensor_ndim(m->y), shape));
        ch_status st = ch_cast(m->dy_cast, flat);
        ch_tensor_free(flat);
        TRY(st);
        dy = m->dy_cast;
    }
    /* Inputs without a gradient (token indices) are never asked for one. */
    if (ch_tensor_dtype(m->x) != CH_F32 && !nn_is_half(ch_tensor_dtype(m->x)))
        want_dx = 0;
    if (m->pass)
        m->pass(m->pass_user, m, 1, 0);
    ch_status st = m->dropped ? replay(m) : CH_OK;
    if (st == CH_OK)
        st = m->ops->backward(m, dy, want_dx);
    nn_release(&m->dy_cast); /* read */
    if (st == CH_OK && m->hook && m->nparams > 0)
        st = m->hook(m->hook_user, m->pfirst, m->nparams);
    if (m->recompute) { /* its input stays: another backward can run it again */
        drop_below(m);
        m->dropped = 1;
    }
    if (m->pass)
        m->pass(m->pass_user, m, 1, 1);
    return st;
}

ch_status ch_module_forward(ch_module *m, ch_tensor **y, const ch_tensor *x)
{
    if (!m || !y || !x)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_forward: %s is NULL",
                         !m ? "m" : !y ? "y" : "x");
    *y = NULL;
    TRY(nn_forward(m, x));
    *y = m->y;
    return CH_OK;
}

ch_status ch_module_backward(ch_module *m, ch_tensor **dx, const ch_tensor *dy)
{
    if (!m || !dy)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_backward: %s is NULL",
                         !m ? "m" : "dy");
    if (dx)
        *dx = NULL;
    TRY(nn_backward(m, dy, dx != NULL));
    if (dx)
        *dx = m->dx;
    return CH_OK;
}

/* ---- The tree's contents ------------------------------------------------------------ */

void ch_module_free(ch_module *m)
{
    if (!m)
        return;
    /* Outer views first: a Sequential's y is a view of a child's. */
    free_state(m);
    for (int i = 0; i < m->nchild; i++)
        ch_module_free(m->child[i]);
    for (int i = 0; i < m->nparams; i++) {
        ch_tensor_free(m->params[i].value);
        ch_tensor_free(m->params[i].grad);
    }
    for (int i = 0; i < m->nbufs; i++)
        ch_tensor_free(m->bufs[i].value);
    free(m->child);
    free(m->moved);
    free(m->moved_grad);
    free(m);
}

const char *ch_module_kind(const ch_module *m) { return m ? m->ops->kind : "(null)"; }
int ch_module_child_count(const ch_module *m) { return m ? m->nchild : 0; }
ch_module *ch_module_child(const ch_module *m, int i)
{
    return m && i >= 0 && i < m->nchild ? m->child[i] : NULL;
}

/* Parameters of the tree, in state_dict order: own, then each child's. */
static int count_params(const ch_module *m)
{
    int n = m->nparams;
    for (int i = 0; i < m->nchild; i++)
        n += count_params(m->child[i]);
    return n;
}

int ch_module_param_count(const ch_module *m) { return m ? count_params(m) : 0; }

/* Parameter *index of the tree in state_dict order, found without an
 * allocation (the optimizer asks for every parameter on every step);
 * *index is what is left past m's parameters when m has too few. */
static nn_param *find_param(const ch_module *m, int *index)
{
    if (*index < m->nparams)
        return (nn_param *)&m->params[*index];
    *index -= m->nparams;
    for (int i = 0; i < m->nchild; i++) {
        nn_param *p = find_param(m->child[i], index);
        if (p)
            return p;
    }
    return NULL;
}

nn_param *nn_param_at(const ch_module *m, int index)
{
    if (index < 0)
        return NULL;
    return find_param(m, &index);
}

ch_status ch_module_param(const ch_module *m, int index, const char **name, ch_tensor **value,
                          ch_tensor **grad)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_param: m is NULL");
    nn_param *p = nn_param_at(m, index);
    if (!p)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_param: index %d out of range "
                         "(%d parameters)", index, ch_module_param_count(m));
    if (name)
        *name = p->name;
    if (value)
        *value = p->value;
    if (grad) {
        TRY(nn_grad_settle(p)); /* what the caller reads or adds to is zeros */
        *grad = p->grad;
    }
    return CH_OK;
}

float nn_grad_beta(nn_param *p)
{
    if (!p->zero)
        return 1.0f;
    p->zero = 0;
    return 0.0f;
}

ch_status nn_grad_settle(nn_param *p)
{
    if (p->zero) {
        TRY(ch_fill(p->grad, 0.0));
        p->zero = 0;
    }
    return CH_OK;
}

int64_t ch_module_param_numel(const ch_module *m)
{
    int64_t n = 0;
    for (int i = 0; m && i < m->nparams; i++)
        n += ch_tensor_numel(m->params[i].value);
    for (int i = 0; m && i < m->nchild; i++)
        n += ch_module_param_numel(m->child[i]);
    return n;
}

static int count_buffers(const ch_module *m)
{
    int n = m->nbufs;
    for (int i = 0; i < m->nchild; i++)
        n += count_buffers(m->child[i]);
    return n;
}

int ch_module_buffer_count(const ch_module *m) { return m ? count_buffers(m) : 0; }

static nn_buffer *find_buffer(const ch_module *m, int *index)
{
    if (*index < m->nbufs)
        return (nn_buffer *)&m->bufs[*index];
    *index -= m->nbufs;
    for (int i = 0; i < m->nchild; i++) {
        nn_buffer *b = find_buffer(m->child[i], index);
        if (b)
            return b;
    }
    return NULL;
}

ch_status ch_module_buffer(const ch_module *m, int index, const char **name, ch_tensor **value,
                           int64_t **counter)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_buffer: m is NULL");
    int i = index;
    nn_buffer *b = index >= 0 ? find_buffer(m, &i) : NULL;
    if (!b)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_buffer: index %d out of range "
                         "(%d buffers)", index, ch_module_buffer_count(m));
    if (name)
        *name = b->name;
    if (value)
        *value = b->value;
    if (counter)
        *counter = b->counter;
    return CH_OK;
}

/* ---- Initialisation ---------------------------------------------------------------
 * Every parameter takes the next numel numbers of one Philox stream, in
 * state_dict order, whatever it draws: the same seed gives the same model
 * on every backend. */

static ch_status draw(nn_param *p, uint64_t seed, uint64_t *offset, int normal, float a, float b)
{
    ch_status st = normal ? ch_rand_normal(p->value, seed, *offset, a, b)
                          : ch_rand_uniform(p->value, seed, *offset, a, b);
    *offset += (uint64_t)ch_tensor_numel(p->value);
    return st;
}

static ch_status init_module(ch_module *m, uint64_t seed, uint64_t *offset)
{
    if (m->ops->init)
        return m->ops->init(m, seed, offset);
    if (!m->nparams)
        return CH_OK;
    nn_param *w = &m->params[0];
    int64_t fan_in = ch_tensor_numel(w->value) / m->out;
    int64_t fan_out = ch_tensor_numel(w->value) / m->in;
    for (int i = 0; i < m->nparams; i++) {
        nn_param *p = &m->params[i];
        if (m->init == NN_INIT_DEFAULT) {
            /* kaiming_uniform with a = sqrt(5) reduces to this bound */
            float bound = (float)(1.0 / sqrt((double)fan_in));
            TRY(draw(p, seed, offset, 0, -bound, bound));
        } else if (i > 0) {
            TRY(ch_fill(p->value, 0.0));
            *offset += (uint64_t)ch_tensor_numel(p->value);
        } else {
            float std = m->init == NN_INIT_NORMAL ? m->init_std
                                                  : (float)sqrt(2.0 / (double)fan_out);
            TRY(draw(p, seed, offset, 1, 0.0f, std));
        }
    }
    return CH_OK;
}

static ch_status init_tree(ch_module *m, uint64_t seed, uint64_t *offset)
{
    TRY(init_module(m, seed, offset));
    for (int i = 0; i < m->nchild; i++)
        TRY(init_tree(m->child[i], seed, offset));
    return CH_OK;
}

ch_status ch_module_init(ch_module *m, uint64_t seed)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_init: m is NULL");
    uint64_t offset = 0;
    return init_tree(m, seed, &offset);
}

/* ---- Devices and copies -------------------------------------------------------------- */

static ch_status move_tensor(ch_tensor **t, ch_device *dev)
{
    if (!*t || ch_tensor_device(*t) == dev)
        return CH_OK;
    ch_tensor *moved = NULL;
    TRY(ch_tensor_to(&moved, *t, dev));
    ch_tensor_free(*t);
    *t = moved;
    return CH_OK;
}

ch_status ch_module_to(ch_module *m, ch_device *dev)
{
    if (!m || !dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_to: %s is NULL", !m ? "m" : "dev");
    free_state(m);
    for (int i = 0; i < m->nparams; i++) {
        TRY(move_tensor(&m->params[i].value, dev));
        TRY(move_tensor(&m->params[i].grad, dev));
    }
    for (int i = 0; i < m->nbufs; i++)
        TRY(move_tensor(&m->bufs[i].value, dev));
    for (int i = 0; i < m->nchild; i++)
        TRY(ch_module_to(m->child[i], dev));
    m->dev = dev;
    return CH_OK;
}

ch_device *ch_module_device(const ch_module *m) { return m ? m->dev : NULL; }

/* The same module on `dev`: configuration, names and values; no forward
 * state, hooks or parent. */
static ch_status clone_into(ch_module **out, const ch_module *m, ch_device *dev)
{
    ch_module *c = malloc(sizeof *c);
    *out = c;
    if (!c)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_module_clone: out of memory");
    *c = *m;
    c->parent = NULL;
    c->child = NULL;
    c->nchild = 0;
    c->moved = c->moved_grad = NULL;
    c->x = NULL;
    c->y = c->dx = c->aux = c->aux2 = c->dy_cast = NULL;
    c->res = c->dres = NULL;
    memset(c->tmp, 0, sizeof c->tmp);
    c->hook = NULL;
    c->sync = NULL;
    c->dropped = c->replaying = 0;
    c->dev = m->nparams || m->nbufs || m->dev ? dev : NULL;
    c->nparams = c->nbufs = 0;
    for (int i = 0; i < m->nparams; i++) {
        c->params[i].value = c->params[i].grad = NULL;
        c->params[i].flat = 0; /* its own gradient, not a view (zero: as m's) */
        c->params[i].half = NULL; /* m's slot; the clone's forward names its own */
        c->params[i].half_stamps[0] = c->params[i].half_stamps[1] = 0;
        c->nparams++;
        TRY(ch_tensor_to(&c->params[i].value, m->params[i].value, dev));
        TRY(ch_tensor_to(&c->params[i].grad, m->params[i].grad, dev));
    }
    for (int i = 0; i < m->nbufs; i++) {
        c->bufs[i].value = NULL;
        c->bufs[i].counter = m->bufs[i].counter ? &c->batches : NULL;
        c->nbufs++;
        if (m->bufs[i].value)
            TRY(ch_tensor_to(&c->bufs[i].value, m->bufs[i].value, dev));
    }
    for (int i = 0; i < m->nchild; i++) {
        ch_module *child = NULL;
        ch_status st = clone_into(&child, m->child[i], dev);
        if (st != CH_OK) {
            ch_module_free(child);
            return st;
        }
        TRY(nn_add_child(c, child, m->child[i]->named ? m->child[i]->cname : NULL));
    }
    return CH_OK;
}

ch_status ch_module_clone(ch_module **out, const ch_module *m, ch_device *dev)
{
    if (!out || !m || !dev)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_clone: %s is NULL",
                         !out ? "out" : !m ? "m" : "dev");
    *out = NULL;
    ch_module *c = NULL;
    ch_status st = clone_into(&c, m, dev);
    if (st != CH_OK) {
        ch_module_free(c);
        return st;
    }
    *out = c;
    return CH_OK;
}

void ch_module_train(ch_module *m, int training)
{
    if (!m)
        return;
    m->training = training != 0;
    for (int i = 0; i < m->nchild; i++)
        ch_module_train(m->child[i], training);
}

ch_status ch_module_set_precision(ch_module *m, ch_dtype dtype)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_set_precision: m is NULL");
    if (dtype != CH_F32 && dtype != CH_BF16 && dtype != CH_F16)
        return chi_error(CH_ERR_DTYPE,
                         "ch_module_set_precision: %s, expected f32, bf16 or f16",
                         ch_dtype_name(dtype));
    m->precision = dtype;
    for (int i = 0; i < m->nchild; i++)
        ch_module_set_precision(m->child[i], dtype);
    return CH_OK;
}

ch_dtype ch_module_precision(const ch_module *m)
{
    return m ? m->precision : CH_F32;
}

ch_status ch_module_set_recompute(ch_module *m, int on)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_set_recompute: m is NULL");
    if (m->segment)
        m->recompute = on != 0;
    for (int i = 0; i < m->nchild; i++)
        TRY(ch_module_set_recompute(m->child[i], on));
    return CH_OK;
}

int ch_module_recompute(const ch_module *m)
{
    if (!m)
        return 0;
    if (m->recompute)
        return 1;
    for (int i = 0; i < m->nchild; i++)
        if (ch_module_recompute(m->child[i]))
            return 1;
    return 0;
}

ch_status nn_half(ch_tensor **slot, const ch_module *m, const ch_tensor *t,
                  const ch_tensor **out)
{
    if (m->precision == CH_F32 || ch_tensor_dtype(t) == m->precision) {
        *out = t;
        return CH_OK;
    }
    int64_t shape[CH_MAX_DIMS];
    nn_shape(t, shape);
    TRY(nn_ensure(slot, ch_tensor_device(t), m->precision, ch_tensor_ndim(t), shape));
    TRY(ch_cast(*slot, t));
    *out = *slot;
    return CH_OK;
}

int nn_is_half(ch_dtype dt)
{
    return dt == CH_BF16 || dt == CH_F16;
}

ch_dtype nn_gemm_out(const ch_module *m)
{
    return m->half_out ? m->precision : CH_F32;
}

ch_status nn_half_weight(ch_tensor **slot, const ch_module *m, nn_param *p, const ch_tensor **out)
{
    if (m->precision != CH_F32 && p->half == slot && *slot &&
        ch_tensor_dtype(*slot) == m->precision && chi_tensor_stamp(p->value) == p->half_stamps[0] &&
        chi_tensor_stamp(*slot) == p->half_stamps[1]) {
        *out = *slot; /* the optimizer's rounding of the value as it stands */
        return CH_OK;
    }
    p->half = m->precision != CH_F32 ? slot : NULL;
    p->half_stamps[0] = p->half_stamps[1] = 0;
    return nn_half(slot, m, p->value, out);
}

void ch_module_set_rng(ch_module *m, uint64_t seed, int64_t step, int64_t first_sample)
{
    if (!m)
        return;
    m->seed = seed;
    m->step = step;
    m->first_sample = first_sample;
    for (int i = 0; i < m->nchild; i++)
        ch_module_set_rng(m->child[i], seed, step, first_sample);
}

void nn_set_grad_hook(ch_module *m, nn_grad_hook fn, void *user)
{
    if (!m)
        return;
    m->hook = fn;
    m->hook_user = user;
    for (int i = 0; i < m->nchild; i++)
        nn_set_grad_hook(m->child[i], fn, user);
}

void nn_set_sync(ch_module *m, nn_sync_fn fn, void *user)
{
    if (!m)
        return;
    m->sync = fn;
    m->sync_user = user;
    for (int i = 0; i < m->nchild; i++)
        nn_set_sync(m->child[i], fn, user);
}

/* The gradient of parameter p becomes a view of buf at *off. */
/* Parameter p's gradient becomes a view of buf from *off: its old
 * gradient's values copied in, or zeros where it has none (nn_drop_grads). */
static ch_status grad_into(nn_param *p, ch_tensor *buf, int64_t *off)
{
    const ch_tensor *like = p->grad ? p->grad : p->value;
    int64_t shape[CH_MAX_DIMS], n = ch_tensor_numel(like);
    nn_shape(like, shape);
    ch_tensor *rows = NULL, *view = NULL;
    TRY(ch_tensor_view(&rows, buf, *off, n));
    ch_status st = ch_tensor_reshape(&view, rows, ch_tensor_ndim(like), shape);
    ch_tensor_free(rows);
    if (st == CH_OK)
        st = p->grad && !p->zero ? ch_copy(view, p->grad) : ch_fill(view, 0.0);
    if (st != CH_OK) {
        ch_tensor_free(view);
        return st;
    }
    ch_tensor_free(p->grad);
    p->grad = view;
    p->zero = 0;
    p->flat = 1;
    *off += n;
    return CH_OK;
}

ch_status nn_grads_into(ch_module *m, int first, int count, ch_tensor *buf)
{
    int64_t need = 0, off = 0;
    for (int i = first; i < first + count; i++) {
        nn_param *p = nn_param_at(m, i);
        if (!p)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "nn_grads_into: parameter %d out of "
                             "range (%d parameters)", i, count_params(m));
        need += ch_tensor_numel(p->value);
    }
    if (ch_tensor_ndim(buf) != 1 || ch_tensor_numel(buf) != need)
        return chi_error(CH_ERR_SHAPE, "nn_grads_into: buf has %lld elements in %d dims, the "
                         "gradients %lld in 1", (long long)ch_tensor_numel(buf),
                         ch_tensor_ndim(buf), (long long)need);
    for (int i = first; i < first + count; i++)
        TRY(grad_into(nn_param_at(m, i), buf, &off));
    return CH_OK;
}

void nn_drop_grads(ch_module *m)
{
    for (int i = 0; i < m->nparams; i++) {
        ch_tensor_free(m->params[i].grad);
        m->params[i].grad = NULL;
        m->params[i].zero = 0;
    }
    for (int i = 0; i < m->nchild; i++)
        nn_drop_grads(m->child[i]);
}

ch_status ch_module_zero_grad(ch_module *m)
{
    if (!m)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_module_zero_grad: m is NULL");
    for (int i = 0; i < m->nparams; i++) {
        nn_param *p = &m->params[i];
        if (p->flat) /* a bucket's: reduced as a whole, written now */
            TRY(ch_fill(p->grad, 0.0));
        else
            p->zero = 1;
    }
    for (int i = 0; i < m->nchild; i++)
        TRY(ch_module_zero_grad(m->child[i]));
    return CH_OK;
}

int nn_output_spare(const ch_module *m)
{
    static const char *const spare[] = {"Linear", "Conv2d", "GPT"};
    /* A module recomputed in backward would write its output again. */
    while (m->ops == &nn_seq_ops && m->nchild > 0 && !m->recompute)
        m = m->child[m->nchild - 1];
    if (m->recompute)
        return 0;
    for (size_t i = 0; i < sizeof spare / sizeof spare[0]; i++)
        if (strcmp(m->ops->kind, spare[i]) == 0)
            return 1;
    return 0;
}
