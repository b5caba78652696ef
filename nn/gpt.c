/* The language-model layers: Embedding, the GPT's token and position
 * embeddings, causal multi-head self-attention, and the GPT itself (a
 * transformer under "transformer" and an output projection tied to the
 * token embedding). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"

/* Dropout masks of one module, told apart by their salt. */
enum { SALT_EMBED = 1, SALT_ATTN = 2, SALT_RESID = 3 };

/* Normal(0, 1) as nn.Embedding, or normal(0, init_std) (GPT-2). */
static ch_status embedding_init(ch_module *m, uint64_t seed, uint64_t *offset)
{
    float std = m->init == NN_INIT_NORMAL ? m->init_std : 1.0f;
    for (int i = 0; i < m->nparams; i++) {
        TRY(ch_rand_normal(m->params[i].value, seed, *offset, 0.0f, std));
        *offset += (uint64_t)ch_tensor_numel(m->params[i].value);
    }
    return CH_OK;
}

/* y [..., D] for idx [...]. */
static ch_status gather(ch_module *m, const ch_tensor *idx)
{
    int nd = ch_tensor_ndim(idx);
    if (nd >= CH_MAX_DIMS)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: %s takes at most %d dimensions",
                         m->ops->kind, CH_MAX_DIMS - 1);
    int64_t shape[CH_MAX_DIMS];
    nn_shape(idx, shape);
    shape[nd] = m->out;
    TRY(nn_ensure(&m->y, m->dev, CH_F32, nd + 1, shape));
    return ch_embedding(m->y, m->params[0].value, idx);
}

static ch_status embedding_forward(ch_module *m, const ch_tensor *idx) { return gather(m, idx); }

static ch_status embedding_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    (void)want_dx; /* indices have no gradient */
    TRY(nn_grad_settle(&m->params[0])); /* added to row by row */
    return ch_embedding_backward(m->params[0].grad, dy, m->x);
}

/* ---- The GPT's embeddings: wte(idx) + wpe(position), then dropout ------------ */

/* Rows [0, t) of a [rows, D] table, seen as one vector of t * D. */
static ch_status first_rows(ch_tensor **out, ch_tensor *table, int64_t t)
{
    ch_tensor *rows = NULL;
    TRY(ch_tensor_view(&rows, table, 0, t));
    int64_t n = ch_tensor_numel(rows);
    ch_status st = ch_tensor_reshape(out, rows, 1, &n);
    ch_tensor_free(rows);
    return st;
}

/* [B, T, D] seen as [B, T * D]. */
static ch_status per_sample(ch_tensor **out, const ch_tensor *t)
{
    int64_t shape[2] = {ch_tensor_dim(t, 0), ch_tensor_numel(t) / ch_tensor_dim(t, 0)};
    return nn_view(out, t, 2, shape);
}

/* Dropout of `t` in place with mask *mask (made here), the mask of sample
 * s at offset (first_sample + s) * (numel / samples) of the module's
 * stream `salt`: independent of how the batch is split. */
static ch_status dropout_in_place(ch_module *m, ch_tensor *t, ch_tensor **mask, int64_t samples,
                                  uint64_t salt)
{
    int64_t shape[CH_MAX_DIMS];
    nn_shape(t, shape);
    TRY(nn_ensure(mask, m->dev, CH_F32, ch_tensor_ndim(t), shape));
    uint64_t offset = (uint64_t)(m->first_sample * (ch_tensor_numel(t) / samples));
    TRY(ch_dropout_mask(*mask, nn_dropout_key(m, salt), offset, m->p));
    return ch_mul(t, t, *mask);
}

static int dropping(const ch_module *m) { return m->training && m->p > 0.0f; }

static ch_status gpt_embed_forward(ch_module *m, const ch_tensor *idx)
{
    if (ch_tensor_ndim(idx) != 2)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: the GPT takes tokens [B, T], got %d "
                         "dimensions", ch_tensor_ndim(idx));
    int64_t t = ch_tensor_dim(idx, 1);
    if (t > m->positions)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: %lld tokens, the context is %lld",
                         (long long)t, (long long)m->positions);
    TRY(gather(m, idx));
    ch_tensor *pos = NULL, *y2 = NULL;
    ch_status st = first_rows(&pos, m->params[1].value, t);
    if (st == CH_OK)
        st = per_sample(&y2, m->y);
    if (st == CH_OK)
        st = ch_bias_add(y2, y2, pos, 1);
    ch_tensor_free(pos);
    ch_tensor_free(y2);
    if (st == CH_OK && dropping(m))
        st = dropout_in_place(m, m->y, &m->aux, ch_tensor_dim(idx, 0), SALT_EMBED);
    return st;
}

static ch_status gpt_embed_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    (void)want_dx;
    if (dropping(m)) {
        int64_t shape[CH_MAX_DIMS];
        nn_shape(dy, shape);
        TRY(nn_ensure(&m->tmp[0], m->dev, CH_F32, ch_tensor_ndim(dy), shape));
        TRY(ch_mul(m->tmp[0], dy, m->aux));
        dy = m->tmp[0];
    }
    /* Both are added to in part: wpe's first T rows, wte's rows by index
     * (after the output layer's share of it, which wrote it whole). */
    TRY(nn_grad_settle(&m->params[0]));
    TRY(nn_grad_settle(&m->params[1]));
    ch_tensor *pos = NULL, *dy2 = NULL;
    ch_status st = first_rows(&pos, m->params[1].grad, ch_tensor_dim(m->x, 1));
    if (st == CH_OK)
        st = per_sample(&dy2, dy);
    if (st == CH_OK)
        st = ch_bias_grad(pos, dy2, 1, 1.0f);
    ch_tensor_free(pos);
    ch_tensor_free(dy2);
    TRY(st);
    return ch_embedding_backward(m->params[0].grad, dy, m->x);
}

/* ---- Causal self-attention ----------------------------------------------------
 * x [B, T, D] -> c_attn -> q, k, v as [B*H, T, hd] -> softmax(q k^T / sqrt(hd))
 * with the causal mask -> attention dropout -> @ v -> heads joined back to
 * [B, T, D] -> c_proj -> residual dropout. */

enum {
    AT_QKV,   /* [3, B, H, T, hd]: q, k, v, each [B*H, T, hd] */
    AT_P,     /* [B*H, T, T] the attention probabilities */
    AT_MASK,  /* its dropout mask */
    AT_A,     /* the probabilities after dropout */
    AT_O,     /* [B*H, T, hd] = A v */
    AT_OY,    /* [B, T, D]: O with the heads joined, c_proj's input */
    AT_RMASK, /* the residual dropout's mask */
    AT_DPROJ, /* dL/d c_proj's output */
    AT_DO,    /* [B*H, T, hd] */
    AT_DA,    /* [B*H, T, T] */
    AT_DQKV,  /* [3, B, H, T, hd] */
    AT_DX5,   /* [B, T, 3D]: c_attn's output gradient */
    /* Mixed precision: the batched products' inputs rounded to the half
     * format (ch_module_set_precision), as autocast does for bmm. */
    AT_QKVH,  /* AT_QKV */
    AT_AH,    /* the probabilities A (after dropout) */
    AT_DOH,   /* AT_DO */
    AT_DAH,   /* dS, softmax's input gradient */
    AT_LSE    /* [B, H, T]: fused attention's row log-sum-exps (ch_attention_packed) */
};

typedef struct attn_dims {
    int64_t b, t, d, h, hd;
} attn_dims;

static ch_status part(ch_tensor **out, ch_tensor *qkv, int i, const attn_dims *a)
{
    ch_tensor *rows = NULL;
    TRY(ch_tensor_view(&rows, qkv, i, 1));
    int64_t shape[3] = {a->b * a->h, a->t, a->hd};
    ch_status st = ch_tensor_reshape(out, rows, 3, shape);
    ch_tensor_free(rows);
    return st;
}

/* The three parts of a [3, B, H, T, hd] tensor. */
static ch_status parts(ch_tensor *out[3], ch_tensor *qkv, const attn_dims *a)
{
    for (int i = 0; i < 3; i++)
        TRY(part(&out[i], qkv, i, a));
    return CH_OK;
}

static void free_parts(ch_tensor *t[3])
{
    for (int i = 0; i < 3; i++) {
        ch_tensor_free(t[i]);
        t[i] = NULL;
    }
}

static ch_status ensure(ch_module *m, int slot, int ndim, const int64_t *shape)
{
    return nn_ensure(&m->tmp[slot], m->dev, CH_F32, ndim, shape);
}

/* y = x with dimensions permuted, both seen with the given shapes. */
static ch_status permute_as(ch_tensor *y, int yn, const int64_t *yshape, const ch_tensor *x,
                            int xn, const int64_t *xshape, const int *perm)
{
    ch_tensor *yv = NULL, *xv = NULL;
    ch_status st = nn_view(&yv, y, yn, yshape);
    if (st == CH_OK)
        st = nn_view(&xv, x, xn, xshape);
    if (st == CH_OK)
        st = ch_permute(yv, xv, perm);
    ch_tensor_free(yv);
    ch_tensor_free(xv);
    return st;
}

static ch_status attn_dims_of(const ch_module *m, const ch_tensor *x, attn_dims *a)
{
    if (ch_tensor_ndim(x) != 3 || ch_tensor_dim(x, 2) != m->in)
        return chi_error(CH_ERR_SHAPE, "ch_module_forward: CausalSelfAttention(%lld) takes "
                         "[B, T, %lld]", (long long)m->in, (long long)m->in);
    *a = (attn_dims){ch_tensor_dim(x, 0), ch_tensor_dim(x, 1), m->in, m->heads,
                     m->in / m->heads};
    return CH_OK;
}

static float attn_scale(const attn_dims *a) { return (float)(1.0 / sqrt((double)a->hd)); }

/* Whether attention runs fused (ch_attention_packed: no [T, T]
 * probabilities stored, q, k and v read in c_attn's output): on the host,
 * CUDA and OpenCL backends, which have the kernel, without attention
 * dropout, unless CHORUS_FUSED_ATTENTION=0. In mixed precision too, in
 * a fraction of the composed path's memory: with bf16 on a CPU with AMX
 * its tile products round q, k, v and the probabilities as autocast does
 * (ch_attention_packed_mixed); elsewhere (CUDA's and OpenCL's kernels
 * among them) it sums in f32 on c_attn's f32 output (autocast's rounding
 * is then the composed path's alone). Forward decides (m->fused), and
 * composes where the backend's kernel does not take the shape
 * (CH_ERR_UNSUPPORTED: a head size past 256 on CUDA and OpenCL);
 * backward follows it. */
static int attn_fused(const ch_module *m)
{
    if (dropping(m))
        return 0;
    const char *env = getenv("CHORUS_FUSED_ATTENTION");
    if (env && strcmp(env, "0") == 0)
        return 0;
    ch_device_info info;
    return ch_device_get_info(m->dev, &info) == CH_OK &&
           (strcmp(info.backend, "host") == 0 || strcmp(info.backend, "cuda") == 0 ||
            strcmp(info.backend, "opencl") == 0);
}

static ch_status attn_join(ch_module *m, const attn_dims *a)
{
    int64_t oy[3] = {a->b, a->t, a->d}, bthd[4] = {a->b, a->t, a->h, a->hd},
            bhtd[4] = {a->b, a->h, a->t, a->hd};
    static const int join[4] = {0, 2, 1, 3};
    TRY(ensure(m, AT_OY, 3, oy));
    return permute_as(m->tmp[AT_OY], 4, bthd, m->tmp[AT_O], 4, bhtd, join);
}

/* Attention core forward, composed: AT_QKV holds q, k, v; leaves AT_OY. In
 * mixed precision both products take half inputs (q, k, v and A rounded)
 * and sum in f32; the scores, softmax and A stay f32. */
static ch_status attn_core(ch_module *m, const attn_dims *a)
{
    int64_t bh = a->b * a->h, att[3] = {bh, a->t, a->t}, o[3] = {bh, a->t, a->hd};
    TRY(ensure(m, AT_O, 3, o));
    TRY(ensure(m, AT_P, 3, att));
    const ch_tensor *rounded;
    TRY(nn_half(&m->tmp[AT_QKVH], m, m->tmp[AT_QKV], &rounded));
    ch_tensor *qkv[3] = {NULL, NULL, NULL};
    ch_status st = parts(qkv, m->precision != CH_F32 ? m->tmp[AT_QKVH] : m->tmp[AT_QKV], a);
    if (st == CH_OK)
        st = ch_gemm_batched(m->tmp[AT_P], 0, 1, attn_scale(a), qkv[0], qkv[1], 0.0f);
    if (st == CH_OK)
        st = ch_softmax(m->tmp[AT_P], m->tmp[AT_P], 1);
    const ch_tensor *prob = m->tmp[AT_P];
    if (st == CH_OK && dropping(m)) {
        st = ensure(m, AT_A, 3, att);
        if (st == CH_OK)
            st = ch_copy(m->tmp[AT_A], m->tmp[AT_P]);
        if (st == CH_OK)
            st = dropout_in_place(m, m->tmp[AT_A], &m->tmp[AT_MASK], a->b, SALT_ATTN);
        prob = m->tmp[AT_A];
    }
    if (st == CH_OK)
        st = nn_half(&m->tmp[AT_AH], m, prob, &prob);
    if (st == CH_OK)
        st = ch_gemm_batched(m->tmp[AT_O], 0, 0, 1.0f, prob, qkv[2], 0.0f);
    free_parts(qkv);
    TRY(st);
    return attn_join(m, a);
}

static ch_status attn_forward(ch_module *m, const ch_tensor *x)
{
    attn_dims a;
    TRY(attn_dims_of(m, x, &a));
    ch_module *c_attn = m->child[0], *c_proj = m->child[1];
    TRY(nn_forward(c_attn, x));
    m->fused = attn_fused(m);
    if (m->fused) {
        /* q, k and v read where c_attn wrote them, o written where c_proj
         * reads it */
        int64_t oy[3] = {a.b, a.t, a.d}, rows[3] = {a.b, a.h, a.t};
        TRY(ensure(m, AT_OY, 3, oy));
        TRY(ensure(m, AT_LSE, 3, rows));
        ch_status st = ch_attention_packed_mixed(m->tmp[AT_OY], m->tmp[AT_LSE], c_attn->y, (int)a.h,
                                                 attn_scale(&a), m->precision);
        if (st != CH_ERR_UNSUPPORTED)
            TRY(st);
        m->fused = st == CH_OK;
    }
    if (!m->fused) {
        int64_t qkv5[5] = {3, a.b, a.h, a.t, a.hd}, bt3hd[5] = {a.b, a.t, 3, a.h, a.hd};
        static const int split[5] = {2, 0, 3, 1, 4};
        TRY(ensure(m, AT_QKV, 5, qkv5));
        TRY(permute_as(m->tmp[AT_QKV], 5, qkv5, c_attn->y, 5, bt3hd, split));
        TRY(attn_core(m, &a));
    }
    TRY(nn_forward(c_proj, m->tmp[AT_OY]));
    if (dropping(m))
        TRY(dropout_in_place(m, c_proj->y, &m->tmp[AT_RMASK], a.b, SALT_RESID));
    return nn_view_of(&m->y, c_proj->y);
}

/* From dL/dOY (c_proj's input gradient) to dL/dqkv in AT_DQKV. In mixed
 * precision the products take the rounded q, k, v and A of forward and dO
 * and dS rounded here; softmax's backward stays f32. */
static ch_status attn_core_backward(ch_module *m, const ch_tensor *doy, const attn_dims *a)
{
    int64_t bh = a->b * a->h, att[3] = {bh, a->t, a->t}, o[3] = {bh, a->t, a->hd};
    int64_t qkv5[5] = {3, a->b, a->h, a->t, a->hd};
    int64_t bthd[4] = {a->b, a->t, a->h, a->hd}, bhtd[4] = {a->b, a->h, a->t, a->hd};
    static const int split_heads[4] = {0, 2, 1, 3};
    int half = m->precision != CH_F32;
    TRY(ensure(m, AT_DO, 3, o));
    TRY(ensure(m, AT_DQKV, 5, qkv5));
    TRY(permute_as(m->tmp[AT_DO], 4, bhtd, doy, 4, bthd, split_heads));
    TRY(ensure(m, AT_DA, 3, att));
    const ch_tensor *prob = half ? m->tmp[AT_AH] : dropping(m) ? m->tmp[AT_A] : m->tmp[AT_P];
    const ch_tensor *dout, *ds;
    TRY(nn_half(&m->tmp[AT_DOH], m, m->tmp[AT_DO], &dout));
    ch_tensor *qkv[3] = {NULL, NULL, NULL}, *d[3] = {NULL, NULL, NULL};
    ch_status st = parts(qkv, half ? m->tmp[AT_QKVH] : m->tmp[AT_QKV], a);
    if (st == CH_OK)
        st = parts(d, m->tmp[AT_DQKV], a);
    if (st == CH_OK) /* dA = dO v^T, dv = A^T dO */
        st = ch_gemm_batched(m->tmp[AT_DA], 0, 1, 1.0f, dout, qkv[2], 0.0f);
    if (st == CH_OK)
        st = ch_gemm_batched(d[2], 1, 0, 1.0f, prob, dout, 0.0f);
    if (st == CH_OK && dropping(m))
        st = ch_mul(m->tmp[AT_DA], m->tmp[AT_DA], m->tmp[AT_MASK]);
    if (st == CH_OK)
        st = ch_softmax_backward(m->tmp[AT_DA], m->tmp[AT_DA], m->tmp[AT_P]);
    if (st == CH_OK)
        st = nn_half(&m->tmp[AT_DAH], m, m->tmp[AT_DA], &ds);
    if (st == CH_OK) /* dq = dS k scale, dk = dS^T q scale */
        st = ch_gemm_batched(d[0], 0, 0, attn_scale(a), ds, qkv[1], 0.0f);
    if (st == CH_OK)
        st = ch_gemm_batched(d[1], 1, 0, attn_scale(a), ds, qkv[0], 0.0f);
    free_parts(qkv);
    free_parts(d);
    return st;
}

static ch_status attn_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    attn_dims a;
    TRY(attn_dims_of(m, m->x, &a));
    ch_module *c_attn = m->child[0], *c_proj = m->child[1];
    if (dropping(m)) {
        int64_t shape[3] = {a.b, a.t, a.d};
        TRY(nn_ensure(&m->tmp[AT_DPROJ], m->dev, ch_tensor_dtype(dy), 3, shape));
        TRY(ch_mul(m->tmp[AT_DPROJ], dy, m->tmp[AT_RMASK]));
        dy = m->tmp[AT_DPROJ];
    }
    TRY(nn_backward(c_proj, dy, 1));
    int64_t bt3d[3] = {a.b, a.t, 3 * a.d};
    TRY(ensure(m, AT_DX5, 3, bt3d));
    if (m->fused) {
        TRY(ch_attention_packed_mixed_backward(m->tmp[AT_DX5], c_proj->dx, c_attn->y, m->tmp[AT_OY],
                                               m->tmp[AT_LSE], (int)a.h, attn_scale(&a),
                                               m->precision));
    } else {
        int64_t qkv5[5] = {3, a.b, a.h, a.t, a.hd}, bt3hd[5] = {a.b, a.t, 3, a.h, a.hd};
        static const int join[5] = {1, 3, 0, 2, 4};
        TRY(attn_core_backward(m, c_proj->dx, &a));
        TRY(permute_as(m->tmp[AT_DX5], 5, bt3hd, m->tmp[AT_DQKV], 5, qkv5, join));
        static const int spent[] = {AT_DO, AT_DA, AT_DQKV, AT_DOH, AT_DAH};
        for (size_t i = 0; i < sizeof spent / sizeof spent[0]; i++)
            nn_release(&m->tmp[spent[i]]);
    }
    /* The gradients of the pass, read: back to the allocator. */
    nn_release(&c_proj->dx);
    nn_release(&m->tmp[AT_DPROJ]);
    TRY(nn_backward(c_attn, m->tmp[AT_DX5], want_dx));
    nn_release(&m->tmp[AT_DX5]);
    if (!want_dx)
        return CH_OK;
    TRY(nn_view_of(&m->dx, c_attn->dx));
    nn_release(&c_attn->dx);
    return CH_OK;
}

/* ---- The GPT: logits = transformer(idx) @ wte^T --------------------------------- */

static nn_param *tied_weight(const ch_module *m)
{
    return &m->child[0]->child[0]->params[0]; /* transformer.wte.weight */
}

/* [B, T, D] seen as [B*T, D]. */
static ch_status token_rows(ch_tensor **out, const ch_tensor *t)
{
    int64_t shape[2] = {ch_tensor_numel(t) / ch_tensor_dim(t, -1), ch_tensor_dim(t, -1)};
    return nn_view(out, t, 2, shape);
}

static ch_status gpt_forward(ch_module *m, const ch_tensor *idx)
{
    ch_module *tr = m->child[0];
    TRY(nn_forward(tr, idx));
    nn_param *w = tied_weight(m);
    int64_t shape[2] = {ch_tensor_numel(idx), ch_tensor_dim(w->value, 0)};
    /* Mixed precision: the hidden states and the tied weight rounded to
     * the half format (tmp[1], kept for backward, and tmp[2]), and the
     * logits in it too (as autocast's): [B*T, vocabulary] at half the
     * bytes, which the fused cross-entropy reads as they are. */
    TRY(nn_ensure(&m->y, m->dev, nn_gemm_out(m), 2, shape));
    const ch_tensor *hh, *wh;
    TRY(nn_half(&m->tmp[1], m, tr->y, &hh));
    TRY(nn_half(&m->tmp[2], m, w->value, &wh));
    ch_tensor *h = NULL;
    TRY(token_rows(&h, hh));
    ch_status st = ch_gemm(m->y, 0, 1, 1.0f, h, wh, 0.0f);
    ch_tensor_free(h);
    return st;
}

static ch_status gpt_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    (void)want_dx;
    ch_module *tr = m->child[0];
    nn_param *w = tied_weight(m);
    int64_t shape[CH_MAX_DIMS];
    nn_shape(tr->y, shape);
    TRY(nn_ensure(&m->tmp[0], m->dev, CH_F32, ch_tensor_ndim(tr->y), shape));
    int half = m->precision != CH_F32;
    const ch_tensor *dyh;
    TRY(nn_half(&m->tmp[3], m, dy, &dyh));
    ch_tensor *h = NULL, *dh = NULL;
    ch_status st = token_rows(&h, half ? m->tmp[1] : tr->y);
    if (st == CH_OK)
        st = token_rows(&dh, m->tmp[0]);
    if (st == CH_OK) /* the output's share of the tied gradient */
        st = ch_gemm(w->grad, 1, 0, 1.0f, dyh, h, nn_grad_beta(w));
    if (st == CH_OK)
        st = ch_gemm(dh, 0, 0, 1.0f, dyh, half ? m->tmp[2] : w->value, 0.0f);
    ch_tensor_free(h);
    ch_tensor_free(dh);
    TRY(st);
    nn_release(&m->tmp[3]);
    TRY(nn_backward(tr, m->tmp[0], 0));
    nn_release(&m->tmp[0]);
    return CH_OK;
}

static const nn_ops embedding_ops = {
    "Embedding", embedding_forward, embedding_backward, CH_I32, 0, embedding_init, 0};
static const nn_ops gpt_embed_ops = {
    "GPTEmbedding", gpt_embed_forward, gpt_embed_backward, CH_I32, 0, embedding_init, 0};
static const nn_ops attn_ops = {
    "CausalSelfAttention", attn_forward, attn_backward, CH_F32, 1, NULL, 1};
static const nn_ops gpt_ops = {"GPT", gpt_forward, gpt_backward, CH_I32, 0, NULL, 0};

ch_status ch_nn_embedding(ch_module **out, int64_t num, int64_t dim)
{
    if (num < 1 || dim < 1) {
        if (out)
            *out = NULL;
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_embedding: %lld rows of %lld, expected "
                         "both >= 1", (long long)num, (long long)dim);
    }
    TRY(nn_module_new(out, &embedding_ops));
    ch_module *m = *out;
    m->in = num;
    m->out = dim;
    int64_t shape[2] = {num, dim};
    return nn_made(out, nn_add_param(m, "weight", 2, shape));
}

ch_status ch_nn_causal_self_attention(ch_module **out, int64_t dim, int heads, float dropout)
{
    if (out)
        *out = NULL;
    if (dim < 1 || heads < 1 || dim % heads != 0 || !(dropout >= 0.0f && dropout < 1.0f))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_causal_self_attention: dim %lld, heads "
                         "%d, dropout %g: expected heads >= 1 dividing dim, 0 <= dropout < 1",
                         (long long)dim, heads, dropout);
    TRY(nn_module_new(out, &attn_ops));
    ch_module *m = *out, *c = NULL;
    m->in = m->out = dim;
    m->heads = heads;
    m->p = dropout;
    ch_status st = ch_nn_linear(&c, dim, 3 * dim);
    if (st == CH_OK)
        st = nn_add_child(m, c, "c_attn");
    if (st == CH_OK)
        st = ch_nn_linear(&c, dim, dim);
    if (st == CH_OK)
        st = nn_add_child(m, c, "c_proj");
    return nn_made(out, st);
}

/* ---- The GPT-2 of nanoGPT --------------------------------------------------------- */

/* Weights normal(0, 0.02), biases 0, c_proj's weights 0.02 / sqrt(2 layers). */
static void gpt2_init(ch_module *m, int layers)
{
    if (m->ops == &embedding_ops || m->ops == &gpt_embed_ops || m->nparams) {
        m->init = NN_INIT_NORMAL;
        m->init_std = 0.02f;
        if (strcmp(m->cname, "c_proj") == 0)
            m->init_std = (float)(0.02 / sqrt(2.0 * layers));
    }
    for (int i = 0; i < m->nchild; i++)
        gpt2_init(m->child[i], layers);
}

static ch_status mlp(ch_module **out, int64_t dim, float dropout)
{
    ch_module *c = NULL;
    TRY(ch_nn_sequential(out));
    ch_status st = ch_nn_linear(&c, dim, 4 * dim);
    if (st == CH_OK)
        st = ch_nn_sequential_add_named(*out, "c_fc", c);
    if (st == CH_OK)
        st = ch_nn_activation(&c, CH_ACT_GELU);
    if (st == CH_OK)
        st = ch_nn_sequential_add_named(*out, "gelu", c);
    if (st == CH_OK)
        st = ch_nn_linear(&c, 4 * dim, dim);
    if (st == CH_OK)
        st = ch_nn_sequential_add_named(*out, "c_proj", c);
    if (st == CH_OK)
        st = ch_nn_dropout(&c, dropout);
    if (st == CH_OK)
        st = ch_nn_sequential_add_named(*out, "dropout", c);
    return nn_made(out, st);
}

/* ---- A block: x + attn(ln_1(x)) = r, then r + mlp(ln_2(r)) ---------------------------
 * Its children ln_1, attn, ln_2 and mlp, so its parameters' names and
 * order are those of nanoGPT's Block (h.N.ln_1.weight, ..., h.N.mlp.c_proj.bias).
 * The first residual add and ln_2 run as one pass (ch_add_layernorm:
 * ln_2 is given the residual, r kept in its aux), and in backward each
 * LayerNorm's input gradient joins the residual's in one pass
 * (ch_layernorm_backward_add): dr = dy + ln_2's, dx = dr + ln_1's. */

enum {
    BL_LN1,
    BL_ATTN,
    BL_LN2,
    BL_MLP
};

static ch_status block_forward(ch_module *m, const ch_tensor *x)
{
    ch_module *ln1 = m->child[BL_LN1], *attn = m->child[BL_ATTN], *ln2 = m->child[BL_LN2],
              *mlp = m->child[BL_MLP];
    TRY(nn_forward(ln1, x));
    TRY(nn_forward(attn, ln1->y));
    ln2->res = x;
    ch_status st = nn_forward(ln2, attn->y);
    ln2->res = NULL;
    TRY(st);
    const ch_tensor *r = ln2->aux;
    TRY(nn_forward(mlp, ln2->y));
    if (ch_tensor_numel(mlp->y) != ch_tensor_numel(r))
        return chi_error(CH_ERR_SHAPE,
                         "ch_module_forward: a GPT block's mlp gives %lld "
                         "elements, the residual has %lld",
                         (long long)ch_tensor_numel(mlp->y), (long long)ch_tensor_numel(r));
    int64_t shape[CH_MAX_DIMS];
    nn_shape(r, shape);
    TRY(nn_ensure(&m->y, ch_tensor_device(x), CH_F32, ch_tensor_ndim(r), shape));
    return ch_add(m->y, r, mlp->y);
}

static ch_status block_backward(ch_module *m, const ch_tensor *dy, int want_dx)
{
    ch_module *ln1 = m->child[BL_LN1], *attn = m->child[BL_ATTN], *ln2 = m->child[BL_LN2],
              *mlp = m->child[BL_MLP];
    TRY(nn_backward(mlp, dy, 1));
    ln2->dres = dy; /* dr = dy + ln_2's input gradient */
    ch_status st = nn_backward(ln2, mlp->dx, 1);
    ln2->dres = NULL;
    TRY(st);
    nn_release(&mlp->dx);
    TRY(nn_backward(attn, ln2->dx, 1));
    ln1->dres = ln2->dx; /* dx = dr + ln_1's */
    st = nn_backward(ln1, attn->dx, 1);
    ln1->dres = NULL;
    TRY(st);
    nn_release(&attn->dx);
    nn_release(&ln2->dx);
    if (!want_dx) {
        nn_release(&ln1->dx);
        return CH_OK;
    }
    TRY(nn_view_of(&m->dx, ln1->dx));
    nn_release(&ln1->dx);
    return CH_OK;
}

static const nn_ops block_ops = {"Block", block_forward, block_backward, CH_F32, 1, NULL, 1};

static ch_status block(ch_module **out, const ch_gpt_config *c)
{
    ch_module *ch = NULL;
    TRY(nn_module_new(out, &block_ops));
    ch_module *m = *out;
    m->in = m->out = c->dim;
    ch_status st = ch_nn_layernorm(&ch, c->dim, 1e-5f);
    if (st == CH_OK)
        st = nn_add_child(m, ch, "ln_1");
    if (st == CH_OK)
        st = ch_nn_causal_self_attention(&ch, c->dim, c->heads, c->dropout);
    if (st == CH_OK)
        st = nn_add_child(m, ch, "attn");
    if (st == CH_OK)
        st = ch_nn_layernorm(&ch, c->dim, 1e-5f);
    if (st == CH_OK)
        st = nn_add_child(m, ch, "ln_2");
    if (st == CH_OK)
        st = mlp(&ch, c->dim, c->dropout);
    if (st == CH_OK)
        st = nn_add_child(m, ch, "mlp");
    if (st == CH_OK)
        m->segment = 1; /* what ch_module_set_recompute recomputes */
    return nn_made(out, st);
}

static ch_status transformer(ch_module **out, const ch_gpt_config *c)
{
    ch_module *emb = NULL, *h = NULL, *b = NULL, *ln = NULL;
    TRY(ch_nn_sequential(out));
    ch_status st = nn_module_new(&emb, &gpt_embed_ops);
    if (st == CH_OK) {
        emb->in = c->vocab;
        emb->out = c->dim;
        emb->positions = c->context;
        emb->p = c->dropout;
        int64_t wte[2] = {c->vocab, c->dim}, wpe[2] = {c->context, c->dim};
        st = nn_add_param(emb, "wte.weight", 2, wte);
        if (st == CH_OK)
            st = nn_add_param(emb, "wpe.weight", 2, wpe);
        if (st == CH_OK) {
            st = ch_nn_sequential_add_named(*out, "", emb);
            emb = NULL;
        }
    }
    ch_module_free(emb);
    if (st == CH_OK)
        st = ch_nn_sequential(&h);
    for (int i = 0; st == CH_OK && i < c->layers; i++) {
        st = block(&b, c);
        if (st == CH_OK)
            st = ch_nn_sequential_add(h, b);
    }
    if (st == CH_OK) {
        st = ch_nn_sequential_add_named(*out, "h", h);
        h = NULL;
    }
    ch_module_free(h);
    if (st == CH_OK)
        st = ch_nn_layernorm(&ln, c->dim, 1e-5f);
    if (st == CH_OK)
        st = ch_nn_sequential_add_named(*out, "ln_f", ln);
    return nn_made(out, st);
}

ch_status ch_nn_gpt(ch_module **out, const ch_gpt_config *config)
{
    if (out)
        *out = NULL;
    if (!out || !config)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_gpt: %s is NULL",
                         !out ? "out" : "config");
    const ch_gpt_config *c = config;
    if (c->layers < 1 || c->heads < 1 || c->dim < 1 || c->dim % c->heads != 0 ||
        c->context < 1 || c->vocab < 1 || !(c->dropout >= 0.0f && c->dropout < 1.0f))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_nn_gpt: layers %d, heads %d, dim %lld, "
                         "context %lld, vocab %lld, dropout %g: expected each >= 1, heads "
                         "dividing dim, 0 <= dropout < 1", c->layers, c->heads,
                         (long long)c->dim, (long long)c->context, (long long)c->vocab,
                         c->dropout);
    TRY(nn_module_new(out, &gpt_ops));
    ch_module *tr = NULL;
    (*out)->half_out = 1; /* the logits */
    ch_status st = transformer(&tr, c);
    if (st == CH_OK)
        st = nn_add_child(*out, tr, "transformer");
    if (st == CH_OK)
        gpt2_init(*out, c->layers);
    return nn_made(out, st);
}
