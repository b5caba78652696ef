/* The host convolution through oneDNN's convolution primitives, when the
 * build has oneDNN: f32 inputs (conv.c's convolution tries it first), or
 * bf16/f16 inputs with f32 outputs and sums (the conv2d_half slots, at the
 * end). The engine and the streams are dnnl.c's (dnnl_impl.h).
 *
 * These are the direct convolutions PyTorch runs on the CPU, with no
 * column matrix. The tensors stay NCHW / OIHW; each primitive takes the
 * layouts it runs fastest on (blocked channels on AVX-512), so the plain
 * inputs are reordered into the workspace the core passes and the outputs
 * reordered back, as PyTorch does for its plain tensors.
 *
 * A primitive is made once per shape (the geometry, the output channels
 * and, backward, the gradients wanted) and kept in a small cache until the
 * backend shuts down; its scratchpad is the caller's (user mode), so
 * replicas on several threads run the same primitive at once. A shape
 * oneDNN does not take is remembered too, and goes to the im2col
 * convolution (conv.c) every time (in half: the core's widened f32
 * convolution), so the workspace asked for and the call made always
 * agree. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include "host.h"

#ifdef HAVE_ONEDNN

#include "dnnl_impl.h"

#include <stdlib.h>
#include <string.h>

/* One argument of a primitive: its plain layout, the one the primitive
 * wants, and when they differ the reorder between them (into the
 * primitive for an input, out of it for an output) and where in the
 * workspace the reordered copy lives. */
typedef struct dn_arg {
    int arg; /* DNNL_ARG_SRC, ... */
    int out;
    dnnl_memory_desc_t plain, want;
    dnnl_primitive_t reorder; /* NULL: the primitive takes the plain layout */
    size_t off, bytes;
} dn_arg;

typedef struct dn_op {
    dnnl_primitive_t prim;
    dn_arg args[3];
} dn_op;

typedef struct dn_entry {
    ch_conv_geom g;
    int64_t o;
    int dt;             /* the inputs' ch_dtype (x, w; backward dy too); outputs f32 */
    int backward, want; /* backward: the gradients wanted, bit 0 dx, bit 1 dw */
    int ok;             /* 0: oneDNN does not take this shape */
    dn_op ops[2];
    int nops;
    size_t dw_off;      /* backward with dw: the plain weight gradient */
    size_t scratch_off; /* the primitives' scratchpad */
    size_t bytes;       /* the workspace in all */
    struct dn_entry *next;
} dn_entry;

/* The shapes met so far (chi_host_dnnl_lock guards it). */
static struct {
    dn_entry *entries;
    int count;
} cache;

static void op_free(dn_op *op)
{
    if (op->prim)
        dnnl_primitive_destroy(op->prim);
    for (int i = 0; i < 3; i++)
        if (op->args[i].reorder)
            dnnl_primitive_destroy(op->args[i].reorder);
    memset(op, 0, sizeof *op);
}

static void entry_free(dn_entry *e)
{
    for (int i = 0; i < e->nops; i++)
        op_free(&e->ops[i]);
    free(e);
}

void chi_host_dnnl_conv_clear_locked(void)
{
    while (cache.entries) {
        dn_entry *e = cache.entries;
        cache.entries = e->next;
        entry_free(e);
    }
    cache.count = 0;
}

/* Argument `a` of an op made from `pd`: the layout pd chose for `what`,
 * and a reorder from or to `plain` when it is another. The workspace it
 * needs is counted in *bytes, the reorder's scratchpad in *scratch. */
static int arg_init(dn_arg *a, const_dnnl_primitive_desc_t pd, dnnl_query_t what, int arg, int out,
                    const dnnl_memory_desc_t *plain, dnnl_primitive_attr_t attr, size_t *bytes,
                    size_t *scratch)
{
    const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, what, 0);
    if (!want)
        return 0;
    a->arg = arg;
    a->out = out;
    a->plain = *plain;
    a->want = *want;
    if (dnnl_memory_desc_equal(plain, want))
        return 1;
    dnnl_primitive_desc_t rpd = NULL;
    if (dnnl_reorder_primitive_desc_create(&rpd, out ? want : plain, chi_host_dnnl_engine,
                                           out ? plain : want, chi_host_dnnl_engine,
                                           attr) != dnnl_success)
        return 0;
    size_t s = chi_host_dnnl_scratch_of(rpd);
    int made = dnnl_primitive_create(&a->reorder, rpd) == dnnl_success;
    dnnl_primitive_desc_destroy(rpd);
    if (!made) {
        a->reorder = NULL;
        return 0;
    }
    if (s > *scratch)
        *scratch = s;
    a->off = *bytes;
    a->bytes = dnnl_memory_desc_get_size(want);
    *bytes += chi_host_dnnl_align_up(a->bytes);
    return 1;
}

/* The primitive of `pd` with its three arguments. */
static int op_init(dn_op *op, const_dnnl_primitive_desc_t pd, const dnnl_query_t what[3],
                   const int arg[3], const int out[3], const dnnl_memory_desc_t *plain[3],
                   dnnl_primitive_attr_t attr, size_t *bytes, size_t *scratch)
{
    size_t s = chi_host_dnnl_scratch_of(pd);
    if (s > *scratch)
        *scratch = s;
    for (int i = 0; i < 3; i++)
        if (!arg_init(&op->args[i], pd, what[i], arg[i], out[i], plain[i], attr, bytes, scratch))
            return 0;
    return dnnl_primitive_create(&op->prim, pd) == dnnl_success;
}

/* A tensor's plain layout (tag) and the "any" layout a primitive chooses
 * from, in type t; 0 when oneDNN refuses them. */
static int descs(dnnl_memory_desc_t *plain, dnnl_memory_desc_t *any, const dnnl_dims_t d,
                 dnnl_data_type_t t, dnnl_format_tag_t tag)
{
    return dnnl_memory_desc_init_by_tag(plain, 4, d, t, tag) == dnnl_success &&
           dnnl_memory_desc_init_by_tag(any, 4, d, t, dnnl_format_tag_any) == dnnl_success;
}

/* Makes the primitives of e (its key set); e->ok says whether it worked.
 * The inputs of each op are in e->dt (x and w forward, dy and w for dx,
 * x and dy for dw), its output in f32: the suffix h names the first, f the
 * second (the same descriptors when e->dt is f32). */
static void entry_build(dn_entry *e)
{
    const ch_conv_geom *g = &e->g;
    dnnl_dims_t xd = {g->n, g->c, g->h, g->w}, wd = {e->o, g->c, g->kh, g->kw},
                yd = {g->n, e->o, g->oh, g->ow};
    dnnl_dims_t strides = {g->sh, g->sw}, pad_l = {g->ph, g->pw},
                pad_r = {(g->oh - 1) * g->sh + g->kh - g->h - g->ph,
                         (g->ow - 1) * g->sw + g->kw - g->w - g->pw};
    dnnl_data_type_t in = e->dt == CH_BF16 ? dnnl_bf16 : e->dt == CH_F16 ? dnnl_f16 : dnnl_f32;
    dnnl_memory_desc_t xh, wh, yh, xha, wha, yha, xf, wf, yf, xfa, wfa, yfa;
    dnnl_primitive_attr_t attr = chi_host_dnnl_user_scratch_attr();
    dnnl_primitive_desc_t fwd = NULL, pd = NULL;
    dnnl_convolution_desc_t cd;
    size_t bytes = 0, scratch = 0;
    e->ok = 0;
    if (!attr)
        return;
    if (!descs(&xh, &xha, xd, in, dnnl_nchw) || !descs(&wh, &wha, wd, in, dnnl_oihw) ||
        !descs(&yh, &yha, yd, in, dnnl_nchw) || !descs(&xf, &xfa, xd, dnnl_f32, dnnl_nchw) ||
        !descs(&wf, &wfa, wd, dnnl_f32, dnnl_oihw) || !descs(&yf, &yfa, yd, dnnl_f32, dnnl_nchw))
        goto done;
    if (dnnl_convolution_forward_desc_init(&cd, dnnl_forward_training, dnnl_convolution_direct,
                                           &xha, &wha, NULL, &yfa, strides, pad_l,
                                           pad_r) != dnnl_success ||
        dnnl_primitive_desc_create(&fwd, &cd, attr, chi_host_dnnl_engine, NULL) != dnnl_success)
        goto done;
    if (!e->backward) {
        const dnnl_memory_desc_t *plain[3] = {&xh, &wh, &yf};
        if (!op_init(&e->ops[e->nops++], fwd,
                     (const dnnl_query_t[3]){dnnl_query_src_md, dnnl_query_weights_md,
                                             dnnl_query_dst_md},
                     (const int[3]){DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST},
                     (const int[3]){0, 0, 1}, plain, attr, &bytes, &scratch))
            goto done;
    }
    if (e->backward && (e->want & 1)) {
        const dnnl_memory_desc_t *plain[3] = {&yh, &wh, &xf};
        if (dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &xfa, &wha, &yha,
                                                     strides, pad_l, pad_r) != dnnl_success ||
            dnnl_primitive_desc_create(&pd, &cd, attr, chi_host_dnnl_engine, fwd) != dnnl_success ||
            !op_init(&e->ops[e->nops++], pd,
                     (const dnnl_query_t[3]){dnnl_query_diff_dst_md, dnnl_query_weights_md,
                                             dnnl_query_diff_src_md},
                     (const int[3]){DNNL_ARG_DIFF_DST, DNNL_ARG_WEIGHTS, DNNL_ARG_DIFF_SRC},
                     (const int[3]){0, 0, 1}, plain, attr, &bytes, &scratch))
            goto done;
        dnnl_primitive_desc_destroy(pd);
        pd = NULL;
    }
    if (e->backward && (e->want & 2)) {
        /* The weight gradient always goes through the workspace (dw is
         * beta * dw + it): a plain copy when the primitive writes plain. */
        const dnnl_memory_desc_t *plain[3] = {&xh, &yh, &wf};
        dn_op *op = &e->ops[e->nops++];
        if (dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &xha, &wfa,
                                                        NULL, &yha, strides, pad_l,
                                                        pad_r) != dnnl_success ||
            dnnl_primitive_desc_create(&pd, &cd, attr, chi_host_dnnl_engine, fwd) != dnnl_success ||
            !op_init(op, pd,
                     (const dnnl_query_t[3]){dnnl_query_src_md, dnnl_query_diff_dst_md,
                                             dnnl_query_diff_weights_md},
                     (const int[3]){DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS},
                     (const int[3]){0, 0, 1}, plain, attr, &bytes, &scratch))
            goto done;
        /* The plain weight gradient, before dw = beta * dw + it. */
        e->dw_off = bytes;
        bytes += chi_host_dnnl_align_up(dnnl_memory_desc_get_size(&wf));
    }
    e->scratch_off = bytes;
    e->bytes = bytes + chi_host_dnnl_align_up(scratch);
    e->ok = 1;
done:
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (fwd)
        dnnl_primitive_desc_destroy(fwd);
    dnnl_primitive_attr_destroy(attr);
    if (!e->ok) {
        for (int i = 0; i < e->nops; i++)
            op_free(&e->ops[i]);
        e->nops = 0;
    }
}

static int geom_equal(const ch_conv_geom *a, const ch_conv_geom *b)
{
    return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->oh == b->oh &&
           a->ow == b->ow && a->kh == b->kh && a->kw == b->kw && a->sh == b->sh && a->sw == b->sw &&
           a->ph == b->ph && a->pw == b->pw;
}

/* The primitives for this call, made on its shape's first call; NULL when
 * oneDNN does not take the shape (or its engine could not be made, or the
 * cache is full and the shape is new): the im2col convolution does it. */
static const dn_entry *lookup(const ch_conv_geom *g, int64_t o, int dt, int backward, int want)
{
    const dn_entry *found = NULL;
    pthread_mutex_lock(&chi_host_dnnl_lock);
    if (!chi_host_dnnl_engine_locked())
        goto out;
    for (dn_entry *e = cache.entries; e; e = e->next)
        if (geom_equal(&e->g, g) && e->o == o && e->dt == dt && e->backward == backward &&
            (!backward || e->want == want)) {
            found = e->ok ? e : NULL;
            goto out;
        }
    if (cache.count >= CHI_HOST_DNNL_MAX_ENTRIES)
        goto out;
    dn_entry *e = calloc(1, sizeof *e);
    if (!e)
        goto out;
    e->g = *g;
    e->o = o;
    e->dt = dt;
    e->backward = backward;
    e->want = backward ? want : 0;
    entry_build(e);
    e->next = cache.entries;
    cache.entries = e;
    cache.count++;
    found = e->ok ? e : NULL;
out:
    pthread_mutex_unlock(&chi_host_dnnl_lock);
    return found;
}

static dnnl_status_t exec2(dnnl_primitive_t p, dnnl_stream_t st, int a0, dnnl_memory_t m0, int a1,
                           dnnl_memory_t m1, dnnl_memory_t scratch)
{
    dnnl_exec_arg_t args[3] = {{a0, m0}, {a1, m1}, {DNNL_ARG_SCRATCHPAD, scratch}};
    return dnnl_primitive_execute(p, st, scratch ? 3 : 2, args);
}

/* One op: reorder its plain inputs into the workspace where the primitive
 * wants another layout, run it, reorder its output back. */
static ch_status run_op(const dn_op *op, dnnl_stream_t st, void *const ptr[3], char *ws,
                        dnnl_memory_t scratch, const char *slot)
{
    dnnl_memory_t plain[3] = {NULL, NULL, NULL}, inner[3] = {NULL, NULL, NULL};
    dnnl_status_t s = dnnl_success;
    const char *what = "dnnl_memory_create";
    for (int i = 0; i < 3 && s == dnnl_success; i++) {
        const dn_arg *a = &op->args[i];
        s = dnnl_memory_create(&plain[i], &a->plain, chi_host_dnnl_engine, ptr[i]);
        if (s == dnnl_success && a->reorder)
            s = dnnl_memory_create(&inner[i], &a->want, chi_host_dnnl_engine, ws + a->off);
    }
    for (int i = 0; i < 3 && s == dnnl_success; i++)
        if (op->args[i].reorder && !op->args[i].out) {
            what = "a reorder into the primitive's layout";
            s = exec2(op->args[i].reorder, st, DNNL_ARG_FROM, plain[i], DNNL_ARG_TO, inner[i],
                      scratch);
        }
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[4];
        int n = 0;
        for (int i = 0; i < 3; i++)
            args[n++] = (dnnl_exec_arg_t){op->args[i].arg, inner[i] ? inner[i] : plain[i]};
        if (scratch)
            args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, scratch};
        what = "the convolution";
        s = dnnl_primitive_execute(op->prim, st, n, args);
    }
    for (int i = 0; i < 3 && s == dnnl_success; i++)
        if (op->args[i].reorder && op->args[i].out) {
            what = "a reorder out of the primitive's layout";
            s = exec2(op->args[i].reorder, st, DNNL_ARG_FROM, inner[i], DNNL_ARG_TO, plain[i],
                      scratch);
        }
    if (s == dnnl_success) {
        what = "dnnl_stream_wait";
        s = dnnl_stream_wait(st);
    }
    for (int i = 0; i < 3; i++) {
        if (plain[i])
            dnnl_memory_destroy(plain[i]);
        if (inner[i])
            dnnl_memory_destroy(inner[i]);
    }
    return s == dnnl_success ? CH_OK : chi_host_dnnl_fail(s, slot, what);
}

/* Runs e's ops on the argument pointers of each (ptr[op][arg]). */
static ch_status run_entry(const dn_entry *e, void *const ptr[2][3], char *ws, size_t ws_bytes,
                           const char *slot)
{
    if (ws_bytes < e->bytes || (e->bytes && !ws))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "host %s: %zu bytes of workspace, less than the %zu it needs", slot,
                         ws_bytes, e->bytes);
    chi_host_dnnl_ctx *c = NULL;
    dnnl_memory_t scratch = NULL;
    ch_status r = chi_host_dnnl_ctx_take(&c, 0, slot);
    size_t sbytes = e->bytes - e->scratch_off;
    if (r == CH_OK && sbytes) {
        dnnl_memory_desc_t md;
        dnnl_dims_t d = {(dnnl_dim_t)sbytes};
        dnnl_status_t s = dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_a);
        if (s == dnnl_success)
            s = dnnl_memory_create(&scratch, &md, chi_host_dnnl_engine, ws + e->scratch_off);
        if (s != dnnl_success)
            r = chi_host_dnnl_fail(s, slot, "the scratchpad's dnnl_memory_create");
    }
    for (int i = 0; i < e->nops && r == CH_OK; i++)
        r = run_op(&e->ops[i], c->stream, ptr[i], ws, scratch, slot);
    if (scratch)
        dnnl_memory_destroy(scratch);
    chi_host_dnnl_ctx_give(c);
    return r;
}

int chi_host_dnnl_conv_workspace(const ch_conv_geom *g, int64_t out_channels, int dt, int backward,
                                 int want, size_t *bytes)
{
    const dn_entry *e = lookup(g, out_channels, dt, backward, want);
    if (!e)
        return 0;
    *bytes = e->bytes;
    return 1;
}

ch_status chi_host_dnnl_conv_forward(const ch_conv_geom *g, int64_t out_channels, int dt, float *y,
                                     const void *x, const void *w, void *ws, size_t ws_bytes)
{
    const dn_entry *e = lookup(g, out_channels, dt, 0, 0);
    if (!e)
        return CH_ERR_UNSUPPORTED;
    void *const ptr[2][3] = {{(void *)x, (void *)w, y}, {NULL, NULL, NULL}};
    return run_entry(e, ptr, ws, ws_bytes, "conv2d_forward");
}

ch_status chi_host_dnnl_conv_backward(const ch_conv_geom *g, int64_t out_channels, int dt,
                                      float *dx, float *dw, float beta, const void *dy,
                                      const void *x, const void *w, void *ws, size_t ws_bytes)
{
    int want = (dx ? 1 : 0) | (dw ? 2 : 0);
    if (!want)
        return CH_OK;
    const dn_entry *e = lookup(g, out_channels, dt, 1, want);
    if (!e)
        return CH_ERR_UNSUPPORTED;
    char *wsb = ws;
    float *plain_dw = dw ? (float *)(wsb + e->dw_off) : NULL;
    void *const ptr[2][3] = {
        {dx ? (void *)dy : (void *)x, dx ? (void *)w : (void *)dy, dx ? (void *)dx : plain_dw},
        {(void *)x, (void *)dy, plain_dw}};
    TRY(run_entry(e, ptr, ws, ws_bytes, "conv2d_backward"));
    if (dw) {
        int64_t n = out_channels * g->c * g->kh * g->kw;
        for (int64_t i = 0; i < n; i++)
            dw[i] = beta == 0.0f ? plain_dw[i] : beta * dw[i] + plain_dw[i];
    }
    return CH_OK;
}

/* ---- the convolution slots with half inputs ------------------------------ */

static ch_status half_refused(const char *slot, const ch_conv_geom *g, int64_t out_channels, int dt)
{
    if (dt != CH_BF16 && dt != CH_F16)
        return chi_error(CH_ERR_UNSUPPORTED, "host %s: dtype %d is not bf16 or f16", slot, dt);
    return chi_error(CH_ERR_UNSUPPORTED,
                     "host %s: oneDNN has no %s convolution for x [%lld, %lld, %lld, %lld] and "
                     "%lld outputs of %dx%d on this CPU",
                     slot, ch_dtype_name((ch_dtype)dt), (long long)g->n, (long long)g->c,
                     (long long)g->h, (long long)g->w, (long long)out_channels, g->kh, g->kw);
}

static int is_half(int dt)
{
    return dt == CH_BF16 || dt == CH_F16;
}

ch_status chi_host_conv2d_half_workspace(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                         int dt, int backward, int want, size_t *bytes)
{
    (void)stream;
    if (!is_half(dt) || !chi_host_dnnl_conv_workspace(g, out_channels, dt, backward, want, bytes))
        return half_refused("conv2d_half_workspace", g, out_channels, dt);
    return CH_OK;
}

ch_status chi_host_conv2d_half_forward(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                       int dt, ch_bmem y, ch_bmem x, ch_bmem w, ch_bmem ws,
                                       size_t ws_bytes)
{
    (void)stream;
    ch_status st = is_half(dt) ? chi_host_dnnl_conv_forward(g, out_channels, dt, chi_host_f32(y),
                                                            (char *)x.ptr + x.off,
                                                            (char *)w.ptr + w.off, ws.ptr, ws_bytes)
                               : CH_ERR_UNSUPPORTED;
    return st == CH_ERR_UNSUPPORTED ? half_refused("conv2d_half_forward", g, out_channels, dt) : st;
}

ch_status chi_host_conv2d_half_backward(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                        int dt, ch_bmem dx, ch_bmem dw, float beta, ch_bmem dy,
                                        ch_bmem x, ch_bmem w, ch_bmem ws, size_t ws_bytes)
{
    (void)stream;
    ch_status st = is_half(dt)
                       ? chi_host_dnnl_conv_backward(
                             g, out_channels, dt, dx.ptr ? chi_host_f32(dx) : NULL,
                             dw.ptr ? chi_host_f32(dw) : NULL, beta, (char *)dy.ptr + dy.off,
                             (char *)x.ptr + x.off, (char *)w.ptr + w.off, ws.ptr, ws_bytes)
                       : CH_ERR_UNSUPPORTED;
    return st == CH_ERR_UNSUPPORTED ? half_refused("conv2d_half_backward", g, out_channels, dt)
                                    : st;
}

#endif /* HAVE_ONEDNN */
