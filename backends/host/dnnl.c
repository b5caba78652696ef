/* oneDNN's primitives for the host, when the build has oneDNN: the
 * convolution (f32, or bf16/f16 inputs with f32 outputs and sums) and the
 * half-precision GEMM (matmul, below).
 *
 * The convolution through oneDNN's convolution primitives: the direct convolutions PyTorch runs on the CPU, with
 * no column matrix. The tensors stay NCHW / OIHW; each primitive takes the
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

#include <dnnl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ENTRIES 512
#define ALIGN 64

/* One argument of a primitive: its plain layout, the one the primitive
 * wants, and when they differ the reorder between them (into the
 * primitive for an input, out of it for an output) and where in the
 * workspace the reordered copy lives. */
typedef struct dn_arg {
    int arg;                 /* DNNL_ARG_SRC, ... */
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
    int ok;   /* 0: oneDNN does not take this shape */
    dn_op ops[2];
    int nops;
    size_t dw_off;      /* backward with dw: the plain weight gradient */
    size_t scratch_off; /* the primitives' scratchpad */
    size_t bytes;       /* the workspace in all */
    struct dn_entry *next;
} dn_entry;

/* A matmul for one shape of the gemm_half slot. */
typedef struct mm_entry {
    int ab, cd, ta, tb, bias; /* bias: f32 [n] added to every row of C */
    int64_t count, m, n, k, lda, ldb, ldc, sa, sb, sc;
    float alpha, beta;
    int ok;
    dnnl_primitive_t prim;
    dnnl_memory_desc_t md[4]; /* a, b, c, bias */
    /* A single product's B in the layout the matmul chose (b_want, b_bytes
     * of it at the start of the scratch memory), reordered from md[1]
     * before each call; NULL: the matmul reads B as stored. */
    dnnl_primitive_t reorder_b;
    dnnl_memory_desc_t b_want;
    size_t b_bytes;
    int b_padded;   /* b_want pads k or n: the padding must read as zeros */
    size_t scratch; /* in all: B reordered, then the scratchpad */
    char why[160];  /* when not ok: what oneDNN refused */
    struct mm_entry *next;
} mm_entry;

/* A stream and a matmul scratchpad for one call at a time: a call takes
 * one from the pool and gives it back, so the pool holds as many as calls
 * ran at once (one per thread running them) and a step's thousands of
 * calls make none. Freed when the backend shuts down. */
typedef struct dn_ctx {
    dnnl_stream_t stream;
    void *scratch;
    size_t scratch_bytes;
    struct dn_ctx *next;
} dn_ctx;

static struct {
    pthread_mutex_t lock;
    dnnl_engine_t engine;
    int engine_failed;
    dn_entry *entries;
    int count;
    mm_entry *matmuls;
    int nmatmuls;
    dn_ctx *ctxs; /* the pool's idle ones */
} dn = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, NULL, 0, NULL, 0, NULL};

static size_t align_up(size_t x)
{
    return (x + ALIGN - 1) / ALIGN * ALIGN;
}

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

void chi_host_dnnl_shutdown(void)
{
    pthread_mutex_lock(&dn.lock);
    while (dn.entries) {
        dn_entry *e = dn.entries;
        dn.entries = e->next;
        entry_free(e);
    }
    dn.count = 0;
    while (dn.matmuls) {
        mm_entry *e = dn.matmuls;
        dn.matmuls = e->next;
        if (e->prim)
            dnnl_primitive_destroy(e->prim);
        if (e->reorder_b)
            dnnl_primitive_destroy(e->reorder_b);
        free(e);
    }
    dn.nmatmuls = 0;
    while (dn.ctxs) {
        dn_ctx *c = dn.ctxs;
        dn.ctxs = c->next;
        dnnl_stream_destroy(c->stream);
        free(c->scratch);
        free(c);
    }
    if (dn.engine)
        dnnl_engine_destroy(dn.engine);
    dn.engine = NULL;
    dn.engine_failed = 0;
    pthread_mutex_unlock(&dn.lock);
}

/* A user-mode scratchpad attribute (NULL when oneDNN cannot make one). */
static dnnl_primitive_attr_t user_scratch_attr(void)
{
    dnnl_primitive_attr_t attr = NULL;
    if (dnnl_primitive_attr_create(&attr) != dnnl_success)
        return NULL;
    if (dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) !=
        dnnl_success) {
        dnnl_primitive_attr_destroy(attr);
        return NULL;
    }
    return attr;
}

static size_t scratch_of(const_dnnl_primitive_desc_t pd)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

/* Argument `a` of an op made from `pd`: the layout pd chose for `what`,
 * and a reorder from or to `plain` when it is another. The workspace it
 * needs is counted in *bytes, the reorder's scratchpad in *scratch. */
static int arg_init(dn_arg *a, const_dnnl_primitive_desc_t pd, dnnl_query_t what, int arg,
                    int out, const dnnl_memory_desc_t *plain, dnnl_primitive_attr_t attr,
                    size_t *bytes, size_t *scratch)
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
    if (dnnl_reorder_primitive_desc_create(&rpd, out ? want : plain, dn.engine,
                                           out ? plain : want, dn.engine, attr) != dnnl_success)
        return 0;
    size_t s = scratch_of(rpd);
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
    *bytes += align_up(a->bytes);
    return 1;
}

/* The primitive of `pd` with its three arguments. */
static int op_init(dn_op *op, const_dnnl_primitive_desc_t pd, const dnnl_query_t what[3],
                   const int arg[3], const int out[3], const dnnl_memory_desc_t *plain[3],
                   dnnl_primitive_attr_t attr, size_t *bytes, size_t *scratch)
{
    size_t s = scratch_of(pd);
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
    dnnl_primitive_attr_t attr = user_scratch_attr();
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
                                           &xha, &wha, NULL, &yfa, strides, pad_l, pad_r) !=
            dnnl_success ||
        dnnl_primitive_desc_create(&fwd, &cd, attr, dn.engine, NULL) != dnnl_success)
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
        if (dnnl_convolution_backward_data_desc_init(&cd, dnnl_convolution_direct, &xfa, &wha,
                                                     &yha, strides, pad_l, pad_r) !=
                dnnl_success ||
            dnnl_primitive_desc_create(&pd, &cd, attr, dn.engine, fwd) != dnnl_success ||
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
        if (dnnl_convolution_backward_weights_desc_init(&cd, dnnl_convolution_direct, &xha,
                                                        &wfa, NULL, &yha, strides, pad_l,
                                                        pad_r) !=
                dnnl_success ||
            dnnl_primitive_desc_create(&pd, &cd, attr, dn.engine, fwd) != dnnl_success ||
            !op_init(op, pd,
                     (const dnnl_query_t[3]){dnnl_query_src_md, dnnl_query_diff_dst_md,
                                             dnnl_query_diff_weights_md},
                     (const int[3]){DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_WEIGHTS},
                     (const int[3]){0, 0, 1}, plain, attr, &bytes, &scratch))
            goto done;
        /* The plain weight gradient, before dw = beta * dw + it. */
        e->dw_off = bytes;
        bytes += align_up(dnnl_memory_desc_get_size(&wf));
    }
    e->scratch_off = bytes;
    e->bytes = bytes + align_up(scratch);
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

/* The CPU engine, made on first use (dn.lock held); NULL, for good, when
 * oneDNN cannot make one. */
static dnnl_engine_t engine_locked(void)
{
    if (!dn.engine && !dn.engine_failed &&
        dnnl_engine_create(&dn.engine, dnnl_cpu, 0) != dnnl_success) {
        dn.engine = NULL;
        dn.engine_failed = 1;
    }
    return dn.engine;
}

static ch_status dn_fail(dnnl_status_t s, const char *slot, const char *what)
{
    return chi_error(s == dnnl_out_of_memory ? CH_ERR_OUT_OF_MEMORY : CH_ERR_INTERNAL,
                     "host %s (oneDNN): %s failed with oneDNN status %d", slot, what, (int)s);
}

/* A stream (with at least `scratch` bytes of scratchpad) for one call:
 * the pool's, or a new one. The engine exists: the call's lookup made it. */
static ch_status ctx_take(dn_ctx **out, size_t scratch, const char *slot)
{
    pthread_mutex_lock(&dn.lock);
    dn_ctx *c = dn.ctxs;
    if (c)
        dn.ctxs = c->next;
    pthread_mutex_unlock(&dn.lock);
    if (!c) {
        if (!(c = calloc(1, sizeof *c)))
            return chi_error(CH_ERR_OUT_OF_MEMORY, "host %s: out of host memory", slot);
        dnnl_status_t s = dnnl_stream_create(&c->stream, dn.engine, dnnl_stream_default_flags);
        if (s != dnnl_success) {
            free(c);
            return dn_fail(s, slot, "dnnl_stream_create");
        }
    }
    if (scratch > c->scratch_bytes) {
        void *p = NULL;
        if (posix_memalign(&p, ALIGN, scratch) != 0) {
            *out = c;
            return chi_error(CH_ERR_OUT_OF_MEMORY,
                             "host %s: %zu bytes for oneDNN's scratchpad "
                             "could not be allocated",
                             slot, scratch);
        }
        free(c->scratch);
        c->scratch = p;
        c->scratch_bytes = scratch;
    }
    *out = c;
    return CH_OK;
}

/* Back to the pool (c may be NULL). */
static void ctx_give(dn_ctx *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&dn.lock);
    c->next = dn.ctxs;
    dn.ctxs = c;
    pthread_mutex_unlock(&dn.lock);
}

static int geom_equal(const ch_conv_geom *a, const ch_conv_geom *b)
{
    return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->oh == b->oh &&
           a->ow == b->ow && a->kh == b->kh && a->kw == b->kw && a->sh == b->sh &&
           a->sw == b->sw && a->ph == b->ph && a->pw == b->pw;
}

/* The primitives for this call, made on its shape's first call; NULL when
 * oneDNN does not take the shape (or its engine could not be made, or the
 * cache is full and the shape is new): the im2col convolution does it. */
static const dn_entry *lookup(const ch_conv_geom *g, int64_t o, int dt, int backward, int want)
{
    const dn_entry *found = NULL;
    pthread_mutex_lock(&dn.lock);
    if (!engine_locked())
        goto out;
    for (dn_entry *e = dn.entries; e; e = e->next)
        if (geom_equal(&e->g, g) && e->o == o && e->dt == dt && e->backward == backward &&
            (!backward || e->want == want)) {
            found = e->ok ? e : NULL;
            goto out;
        }
    if (dn.count >= MAX_ENTRIES)
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
    e->next = dn.entries;
    dn.entries = e;
    dn.count++;
    found = e->ok ? e : NULL;
out:
    pthread_mutex_unlock(&dn.lock);
    return found;
}

static dnnl_status_t exec2(dnnl_primitive_t p, dnnl_stream_t st, int a0, dnnl_memory_t m0,
                           int a1, dnnl_memory_t m1, dnnl_memory_t scratch)
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
        s = dnnl_memory_create(&plain[i], &a->plain, dn.engine, ptr[i]);
        if (s == dnnl_success && a->reorder)
            s = dnnl_memory_create(&inner[i], &a->want, dn.engine, ws + a->off);
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
    return s == dnnl_success ? CH_OK : dn_fail(s, slot, what);
}

/* Runs e's ops on the argument pointers of each (ptr[op][arg]). */
static ch_status run_entry(const dn_entry *e, void *const ptr[2][3], char *ws, size_t ws_bytes,
                           const char *slot)
{
    if (ws_bytes < e->bytes || (e->bytes && !ws))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "host %s: %zu bytes of workspace, less than the %zu it needs", slot,
                         ws_bytes, e->bytes);
    dn_ctx *c = NULL;
    dnnl_memory_t scratch = NULL;
    ch_status r = ctx_take(&c, 0, slot);
    size_t sbytes = e->bytes - e->scratch_off;
    if (r == CH_OK && sbytes) {
        dnnl_memory_desc_t md;
        dnnl_dims_t d = {(dnnl_dim_t)sbytes};
        dnnl_status_t s = dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_a);
        if (s == dnnl_success)
            s = dnnl_memory_create(&scratch, &md, dn.engine, ws + e->scratch_off);
        if (s != dnnl_success)
            r = dn_fail(s, slot, "the scratchpad's dnnl_memory_create");
    }
    for (int i = 0; i < e->nops && r == CH_OK; i++)
        r = run_op(&e->ops[i], c->stream, ptr[i], ws, scratch, slot);
    if (scratch)
        dnnl_memory_destroy(scratch);
    ctx_give(c);
    return r;
}

int chi_host_dnnl_conv_workspace(const ch_conv_geom *g, int64_t out_channels, int dt,
                                 int backward, int want, size_t *bytes)
{
    const dn_entry *e = lookup(g, out_channels, dt, backward, want);
    if (!e)
        return 0;
    *bytes = e->bytes;
    return 1;
}

ch_status chi_host_dnnl_conv_forward(const ch_conv_geom *g, int64_t out_channels, int dt,
                                     float *y, const void *x, const void *w, void *ws,
                                     size_t ws_bytes)
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

static ch_status half_refused(const char *slot, const ch_conv_geom *g, int64_t out_channels,
                              int dt)
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

ch_status chi_host_conv2d_half_workspace(void *stream, const ch_conv_geom *g,
                                         int64_t out_channels, int dt, int backward, int want,
                                         size_t *bytes)
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
    ch_status st = is_half(dt) ? chi_host_dnnl_conv_forward(
                                     g, out_channels, dt, chi_host_f32(y),
                                     (char *)x.ptr + x.off, (char *)w.ptr + w.off, ws.ptr,
                                     ws_bytes)
                               : CH_ERR_UNSUPPORTED;
    return st == CH_ERR_UNSUPPORTED ? half_refused("conv2d_half_forward", g, out_channels, dt)
                                    : st;
}

ch_status chi_host_conv2d_half_backward(void *stream, const ch_conv_geom *g,
                                        int64_t out_channels, int dt, ch_bmem dx, ch_bmem dw,
                                        float beta, ch_bmem dy, ch_bmem x, ch_bmem w,
                                        ch_bmem ws, size_t ws_bytes)
{
    (void)stream;
    ch_status st =
        is_half(dt)
            ? chi_host_dnnl_conv_backward(g, out_channels, dt, dx.ptr ? chi_host_f32(dx) : NULL,
                                          dw.ptr ? chi_host_f32(dw) : NULL, beta,
                                          (char *)dy.ptr + dy.off, (char *)x.ptr + x.off,
                                          (char *)w.ptr + w.off, ws.ptr, ws_bytes)
            : CH_ERR_UNSUPPORTED;
    return st == CH_ERR_UNSUPPORTED ? half_refused("conv2d_half_backward", g, out_channels, dt)
                                    : st;
}

/* ---- the half-precision GEMM ------------------------------------------- */

static void mm_build(mm_entry *e)
{
    dnnl_data_type_t in = e->ab == CH_BF16 ? dnnl_bf16 : dnnl_f16;
    dnnl_data_type_t out = e->cd == CH_F32 ? dnnl_f32 : in;
    int nd = e->count > 1 ? 3 : 2, o = nd - 2;
    dnnl_dims_t da = {e->count, e->m, e->k}, db = {e->count, e->k, e->n},
                dc = {e->count, e->m, e->n};
    dnnl_dims_t sa = {e->sa, e->ta ? 1 : e->lda, e->ta ? e->lda : 1},
                sb = {e->sb, e->tb ? 1 : e->ldb, e->tb ? e->ldb : 1}, sc = {e->sc, e->ldc, 1};
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_attr_t attr = user_scratch_attr();
    const char *what = "dnnl_memory_desc_init_by_strides";
    dnnl_status_t s = attr ? dnnl_success : dnnl_out_of_memory;
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&e->md[0], nd, da + (1 - o), in, sa + (1 - o));
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&e->md[1], nd, db + (1 - o), in, sb + (1 - o));
    if (s == dnnl_success)
        s = dnnl_memory_desc_init_by_strides(&e->md[2], nd, dc + (1 - o), out, sc + (1 - o));
    dnnl_dims_t dbias = {1, e->n};
    if (s == dnnl_success && e->bias)
        s = dnnl_memory_desc_init_by_tag(&e->md[3], 2, dbias, dnnl_f32, dnnl_ab);
    if (s == dnnl_success && e->alpha != 1.0f) {
        what = "dnnl_primitive_attr_set_output_scales";
        s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &e->alpha);
    }
    if (s == dnnl_success && e->beta != 0.0f) {
        what = "the sum post-op";
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success)
            s = dnnl_post_ops_append_sum(po, e->beta);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    /* Where B is stored transposed (x W^T, a Linear's forward), k is at
     * most 768 and n an odd multiple of 256, the matmul chooses B's layout
     * ("any") and B is reordered into it each call: oneDNN 2.6's AMX
     * matmul read such a B as stored at 0.9 to 1.1 TFLOP/s in calls one
     * after another ([1024, 768] by [768, 256], [768, 768] and [768,
     * 2304]; [512, 768]; 1.5 within GPT-2 small's bf16 step) and ran the
     * same products from its own layout at 1.8 to 2.3 (Sapphire Rapids, 2
     * cores), while for the other shapes measured (k 1024 to 4096, n a
     * multiple of 512, n 640 or 1280) the reorder cost more than it saved
     * (7 to 30%). A rule of the shape, not a timing: the same layout, and
     * the same bits, on every run. */
    dnnl_memory_desc_t b_any;
    dnnl_dims_t dkn = {e->k, e->n};
    int any = nd == 2 && e->tb && e->k <= 768 && e->n % 512 == 256 && s == dnnl_success &&
              dnnl_memory_desc_init_by_tag(&b_any, 2, dkn, in, dnnl_format_tag_any) == dnnl_success;
    if (s == dnnl_success) {
        what = "dnnl_matmul_desc_init";
        s = dnnl_matmul_desc_init(&d, &e->md[0], any ? &b_any : &e->md[1],
                                  e->bias ? &e->md[3] : NULL, &e->md[2]);
    }
    if (s == dnnl_success) {
        what = "dnnl_primitive_desc_create (matmul)";
        s = dnnl_primitive_desc_create(&pd, &d, attr, dn.engine, NULL);
    }
    size_t reorder_scratch = 0;
    if (s == dnnl_success && any) {
        const dnnl_memory_desc_t *want = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        what = "the reorder of B (matmul)";
        s = want ? dnnl_success : dnnl_runtime_error;
        if (s == dnnl_success && !dnnl_memory_desc_equal(want, &e->md[1])) {
            dnnl_primitive_desc_t rpd = NULL;
            e->b_want = *want;
            e->b_bytes = dnnl_memory_desc_get_size(want);
            e->b_padded = e->b_bytes > (size_t)(e->k * e->n) * 2; /* bf16, f16 */
            s = dnnl_reorder_primitive_desc_create(&rpd, &e->md[1], dn.engine, want, dn.engine,
                                                   attr);
            if (s == dnnl_success) {
                reorder_scratch = scratch_of(rpd);
                s = dnnl_primitive_create(&e->reorder_b, rpd);
                dnnl_primitive_desc_destroy(rpd);
            }
            if (s != dnnl_success)
                e->reorder_b = NULL;
        }
    }
    if (s == dnnl_success) {
        size_t mm_scratch = scratch_of(pd);
        e->scratch = (e->reorder_b ? align_up(e->b_bytes) : 0) +
                     (mm_scratch > reorder_scratch ? mm_scratch : reorder_scratch);
        what = "dnnl_primitive_create (matmul)";
        s = dnnl_primitive_create(&e->prim, pd);
    }
    e->ok = s == dnnl_success;
    if (!e->ok) {
        e->prim = NULL;
        if (e->reorder_b)
            dnnl_primitive_destroy(e->reorder_b);
        e->reorder_b = NULL;
        snprintf(e->why, sizeof e->why, "%s: oneDNN status %d", what, (int)s);
    }
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
}

/* The matmul for this call's shape, made on first use (NULL with *why
 * when oneDNN cannot run it; the cache's failure too). */
static const mm_entry *mm_lookup(const mm_entry *key, const char **why)
{
    const mm_entry *found = NULL;
    *why = "the oneDNN engine could not be made";
    pthread_mutex_lock(&dn.lock);
    if (!engine_locked())
        goto out;
    for (mm_entry *e = dn.matmuls; e; e = e->next)
        if (e->ab == key->ab && e->cd == key->cd && e->ta == key->ta && e->tb == key->tb &&
            e->bias == key->bias && e->count == key->count && e->m == key->m && e->n == key->n &&
            e->k == key->k && e->lda == key->lda && e->ldb == key->ldb && e->ldc == key->ldc &&
            e->sa == key->sa && e->sb == key->sb && e->sc == key->sc && e->alpha == key->alpha &&
            e->beta == key->beta) {
            found = e;
            goto out;
        }
    *why = "more shapes than the cache holds";
    if (dn.nmatmuls >= MAX_ENTRIES)
        goto out;
    mm_entry *e = malloc(sizeof *e);
    *why = "out of host memory";
    if (!e)
        goto out;
    *e = *key;
    e->next = NULL;
    mm_build(e);
    e->next = dn.matmuls;
    dn.matmuls = e;
    dn.nmatmuls++;
    found = e;
out:
    pthread_mutex_unlock(&dn.lock);
    if (found && !found->ok) {
        *why = found->why;
        return NULL;
    }
    return found;
}

ch_status chi_host_gemm_half(void *stream, int ab, int cd, int trans_a, int trans_b, int64_t count,
                             int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                             int64_t stride_a, ch_bmem b, int64_t ldb, int64_t stride_b, float beta,
                             ch_bmem c, int64_t ldc, int64_t stride_c, ch_bmem bias)
{
    (void)stream;
    if (bias.ptr && (count != 1 || beta != 0.0f || cd != CH_F32))
        return chi_error(CH_ERR_UNSUPPORTED, "host gemm_half: a bias only on one product into f32 "
                                             "with beta 0");
    if (m == 0 || n == 0 || count == 0)
        return CH_OK;
    mm_entry key = {.ab = ab,
                    .cd = cd,
                    .ta = trans_a != 0,
                    .tb = trans_b != 0,
                    .count = count,
                    .m = m,
                    .n = n,
                    .k = k,
                    .lda = lda,
                    .ldb = ldb,
                    .ldc = ldc,
                    .sa = count > 1 ? stride_a : 0,
                    .sb = count > 1 ? stride_b : 0,
                    .sc = count > 1 ? stride_c : 0,
                    .alpha = alpha,
                    .beta = beta,
                    .bias = bias.ptr != NULL};
    const char *why;
    const mm_entry *e = k > 0 ? mm_lookup(&key, &why) : NULL;
    if (!e)
        return chi_error(CH_ERR_UNSUPPORTED, "host gemm_half (oneDNN matmul): %s",
                         k > 0 ? why : "k is 0");
    dn_ctx *ctx = NULL;
    ch_status r = ctx_take(&ctx, e->scratch, "gemm_half");
    if (r != CH_OK) {
        ctx_give(ctx);
        return r;
    }
    void *ptr[3] = {(char *)a.ptr + a.off, (char *)b.ptr + b.off, (char *)c.ptr + c.off};
    /* mem: a, b, c, the scratchpad, b reordered, the bias */
    dnnl_memory_t mem[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    size_t pad_off = e->reorder_b ? align_up(e->b_bytes) : 0;
    dnnl_status_t s = dnnl_success;
    for (int i = 0; i < 3 && s == dnnl_success; i++)
        s = dnnl_memory_create(&mem[i], &e->md[i], dn.engine, ptr[i]);
    if (s == dnnl_success && e->bias)
        s = dnnl_memory_create(&mem[5], &e->md[3], dn.engine, (char *)bias.ptr + bias.off);
    if (s == dnnl_success && e->scratch > pad_off) {
        dnnl_memory_desc_t md;
        dnnl_dims_t d = {(dnnl_dim_t)(e->scratch - pad_off)};
        s = dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_a);
        if (s == dnnl_success)
            s = dnnl_memory_create(&mem[3], &md, dn.engine, (char *)ctx->scratch + pad_off);
    }
    if (s == dnnl_success && e->reorder_b) {
        /* A layout that pads k or n: the reorder leaves the padding as it
         * finds it, the matmul reads it as zeros, and the memory held
         * another call's B before. */
        if (e->b_padded)
            memset(ctx->scratch, 0, e->b_bytes);
        s = dnnl_memory_create(&mem[4], &e->b_want, dn.engine, ctx->scratch);
        dnnl_exec_arg_t rargs[3] = {
            {DNNL_ARG_FROM, mem[1]}, {DNNL_ARG_TO, mem[4]}, {DNNL_ARG_SCRATCHPAD, mem[3]}};
        if (s == dnnl_success)
            s = dnnl_primitive_execute(e->reorder_b, ctx->stream, mem[3] ? 3 : 2, rargs);
    }
    if (s == dnnl_success) {
        dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, mem[0]},
                                   {DNNL_ARG_WEIGHTS, e->reorder_b ? mem[4] : mem[1]},
                                   {DNNL_ARG_DST, mem[2]}};
        int nargs = 3;
        if (mem[3])
            args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[3]};
        if (mem[5])
            args[nargs++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, mem[5]};
        s = dnnl_primitive_execute(e->prim, ctx->stream, nargs, args);
    }
    if (s == dnnl_success)
        s = dnnl_stream_wait(ctx->stream);
    for (int i = 0; i < 6; i++)
        if (mem[i])
            dnnl_memory_destroy(mem[i]);
    ctx_give(ctx);
    return s == dnnl_success ? CH_OK : dn_fail(s, "gemm_half", "the matmul");
}

#endif /* HAVE_ONEDNN */
