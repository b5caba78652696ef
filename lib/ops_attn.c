/* Op dispatch for the attention family (batched GEMM, permute, softmax,
 * embedding) and global average pooling, which is built from other ops.
 * The checks are lib/ops.c's, from lib/opcheck.h. */
#include "config.h"

#include <string.h>

#include "opcheck.h"

/* ---- Batched GEMM ------------------------------------------------------------ */

static ch_status check_3d(const char *fn, const char *name, const ch_tensor *t)
{
    if (t->ndim != 3)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %d dimensions, expected 3 ([B, rows, cols])",
                         fn, name, t->ndim);
    return CH_OK;
}

ch_status ch_gemm_batched(ch_tensor *c, int trans_a, int trans_b, float alpha,
                          const ch_tensor *a, const ch_tensor *b, float beta)
{
    static const char fn[] = "ch_gemm_batched";
    arg args[] = {{"c", c, ANY, 0}, {"a", a, ANY, 0}, {"b", b, ANY, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(chi_gemm_dtypes(fn, c, a, b));
    TRY(check_3d(fn, "c", c));
    TRY(check_3d(fn, "a", a));
    TRY(check_3d(fn, "b", b));
    TRY(check_finite(fn, "alpha", alpha));
    TRY(check_finite(fn, "beta", beta));
    int64_t batch = c->shape[0];
    if (a->shape[0] != batch || b->shape[0] != batch)
        return chi_error(CH_ERR_SHAPE, "%s: a, b and c hold %lld, %lld and %lld matrices, "
                         "expected the same count", fn, (long long)a->shape[0],
                         (long long)b->shape[0], (long long)batch);
    int64_t m = trans_a ? a->shape[2] : a->shape[1], k = trans_a ? a->shape[1] : a->shape[2];
    int64_t kb = trans_b ? b->shape[2] : b->shape[1], n = trans_b ? b->shape[1] : b->shape[2];
    if (k != kb)
        return chi_error(CH_ERR_SHAPE, "%s: op(a) has %lld columns but op(b) has %lld rows", fn,
                         (long long)k, (long long)kb);
    if (c->shape[1] != m || c->shape[2] != n)
        return chi_error(CH_ERR_SHAPE, "%s: c is [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                         fn, (long long)batch, (long long)c->shape[1], (long long)c->shape[2],
                         (long long)batch, (long long)m, (long long)n);
    TRY(no_alias(fn, "c", c, "a", a));
    TRY(no_alias(fn, "c", c, "b", b));
    if (a->dtype != CH_F32 || c->dtype != CH_F32)
        return chi_gemm_half(fn, c, trans_a, trans_b, alpha, a, b, beta, batch, m, n, k);
    SLOT_OR_HOST(fn, c, gemm_batched,
                 ch_gemm_batched(on_host[0], trans_a, trans_b, alpha, on_host[1], on_host[2], beta),
                 FB_OUT_READ_IF(c, beta != 0.0f), FB_IN(a), FB_IN(b));
    return BE(c)->gemm_batched(STREAM(c), trans_a != 0, trans_b != 0, batch, m, n, k, alpha,
                               chi_mem(a), a->shape[2], a->shape[1] * a->shape[2], chi_mem(b),
                               b->shape[2], b->shape[1] * b->shape[2], beta, chi_mem(c), n,
                               m * n);
}

/* ---- Permute ------------------------------------------------------------------- */

static ch_status check_perm(const char *fn, const ch_tensor *y, const ch_tensor *x,
                            const int *perm)
{
    if (!perm)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: perm is NULL", fn);
    if (y->ndim != x->ndim)
        return chi_error(CH_ERR_SHAPE, "%s: y has %d dimensions but x has %d", fn, y->ndim,
                         x->ndim);
    int seen[CH_MAX_DIMS] = {0};
    for (int i = 0; i < x->ndim; i++) {
        if (perm[i] < 0 || perm[i] >= x->ndim || seen[perm[i]])
            return chi_error(CH_ERR_INVALID_ARGUMENT,
                             "%s: perm[%d] = %d, expected each of 0 to %d once", fn, i, perm[i],
                             x->ndim - 1);
        seen[perm[i]] = 1;
    }
    for (int i = 0; i < x->ndim; i++)
        if (y->shape[i] != x->shape[perm[i]])
            return chi_error(CH_ERR_SHAPE, "%s: y's dimension %d is %lld, x's dimension "
                             "perm[%d] = %d is %lld", fn, i, (long long)y->shape[i], i, perm[i],
                             (long long)x->shape[perm[i]]);
    return CH_OK;
}

/* The same permutation with fewer dimensions, so that backends walk long
 * runs: dimensions of size 1 go, and dimensions of x that stay neighbours,
 * in order, in y become one. Returns the new count (1: a plain copy). */
static int permute_simplify(int ndim, const int64_t *shape, const int *perm,
                            int64_t *out_shape, int *out_perm)
{
    int keep[CH_MAX_DIMS], nk = 0, rank[CH_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        rank[d] = shape[d] > 1 ? nk++ : -1;
    int p[CH_MAX_DIMS], np = 0;
    for (int i = 0; i < ndim; i++)
        if (rank[perm[i]] >= 0)
            p[np++] = rank[perm[i]];
    int64_t s[CH_MAX_DIMS];
    for (int d = 0; d < ndim; d++)
        if (rank[d] >= 0)
            s[rank[d]] = shape[d];
    /* Runs of y's dimensions that are consecutive in x: run r starts at
     * x's dimension p[start[r]]. */
    int start[CH_MAX_DIMS], nr = 0;
    for (int i = 0; i < np; i++)
        if (i == 0 || p[i] != p[i - 1] + 1)
            start[nr++] = i;
    /* x's new dimensions are the runs in x's order. */
    for (int d = 0, r_x = 0; d < nk; d++)
        for (int r = 0; r < nr; r++)
            if (p[start[r]] == d)
                keep[r] = r_x++;
    for (int r = 0; r < nr; r++) {
        int end = r + 1 < nr ? start[r + 1] : np;
        int64_t size = 1;
        for (int i = start[r]; i < end; i++)
            size *= s[p[i]];
        out_shape[keep[r]] = size;
        out_perm[r] = keep[r];
    }
    if (nr == 0) {
        out_shape[0] = 1;
        out_perm[0] = 0;
        return 1;
    }
    return nr;
}

ch_status ch_permute(ch_tensor *y, const ch_tensor *x, const int *perm)
{
    static const char fn[] = "ch_permute";
    arg a[] = {{"y", y, ANY, 0}, {"x", x, ANY, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    if (y->dtype != x->dtype || ch_dtype_size(x->dtype) != 4)
        return chi_error(CH_ERR_DTYPE, "%s: y is %s and x is %s, expected both f32 or both i32",
                         fn, ch_dtype_name(y->dtype), ch_dtype_name(x->dtype));
    TRY(check_perm(fn, y, x, perm));
    TRY(no_alias(fn, "y", y, "x", x));
    int64_t shape[CH_MAX_DIMS];
    int p[CH_MAX_DIMS];
    int ndim = permute_simplify(x->ndim, x->shape, perm, shape, p);
    if (ndim == 1)
        return BE(y)->copy(STREAM(y), chi_mem(y), chi_mem(x), ch_tensor_nbytes(x));
    SLOT_OR_HOST(fn, y, permute, ch_permute(on_host[0], on_host[1], perm), FB_OUT(y), FB_IN(x));
    return BE(y)->permute(STREAM(y), ndim, shape, p, chi_mem(y), chi_mem(x));
}

/* ---- Softmax ------------------------------------------------------------------- */

static ch_status softmax_f32(const void *c, ch_tensor *const *t)
{
    return ch_softmax(t[0], t[1], *(const int *)c);
}

ch_status ch_softmax(ch_tensor *y, const ch_tensor *x, int causal)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, softmax_f32, &causal, y, CHI_T(x));
    static const char fn[] = "ch_softmax";
    arg a[] = {{"y", y, CH_F32, 0}, {"x", x, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(same_numel(fn, "y", y, "x", x));
    TRY(same_or_apart(fn, "y", y, "x", x));
    int64_t s = x->shape[x->ndim - 1], t = x->ndim >= 2 ? x->shape[x->ndim - 2] : 1;
    if (causal && x->ndim < 2)
        return chi_error(CH_ERR_SHAPE, "%s: a causal x needs 2 dimensions or more ([..., T, S]), "
                         "x has 1", fn);
    if (causal && s < t)
        return chi_error(CH_ERR_SHAPE, "%s: a causal x [..., T, S] needs S >= T, x has T %lld "
                         "and S %lld (a row would see no column)", fn, (long long)t,
                         (long long)s);
    SLOT_OR_HOST(fn, y, softmax, ch_softmax(on_host[0], on_host[1], causal), FB_OUT(y), FB_IN(x));
    return BE(y)->softmax(STREAM(y), x->numel / s, s, causal != 0, t, chi_mem(y), chi_mem(x));
}

static ch_status softmax_backward_f32(const void *c, ch_tensor *const *t)
{
    (void)c;
    return ch_softmax_backward(t[0], t[1], t[2]);
}

ch_status ch_softmax_backward(ch_tensor *dx, const ch_tensor *dy, const ch_tensor *y)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN, CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, softmax_backward_f32, NULL, dx, CHI_T(dy), CHI_T(y));
    static const char fn[] = "ch_softmax_backward";
    arg a[] = {{"dx", dx, CH_F32, 0}, {"dy", dy, CH_F32, 0}, {"y", y, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(same_numel(fn, "dy", dy, "y", y));
    TRY(same_numel(fn, "dx", dx, "y", y));
    TRY(same_or_apart(fn, "dx", dx, "dy", dy));
    TRY(no_alias(fn, "dx", dx, "y", y));
    int64_t s = y->shape[y->ndim - 1];
    SLOT_OR_HOST(fn, dx, softmax_backward, ch_softmax_backward(on_host[0], on_host[1], on_host[2]),
                 FB_OUT(dx), FB_IN(dy), FB_IN(y));
    return BE(dx)->softmax_backward(STREAM(dx), y->numel / s, s, chi_mem(dx), chi_mem(dy),
                                    chi_mem(y));
}

/* ---- Fused causal attention ----------------------------------------------------- */

/* q [B, T, hd] (each of names[] the same shape) and lse [B, T]. */
static ch_status check_attention(const char *fn, const ch_tensor *lse, const ch_tensor *const *t,
                                 const char *const *names, int n)
{
    TRY(check_3d(fn, names[0], t[0]));
    for (int i = 1; i < n; i++)
        TRY(same_shape(fn, names[i], t[i], names[0], t[0]));
    if (lse->ndim != 2 || lse->shape[0] != t[0]->shape[0] || lse->shape[1] != t[0]->shape[1])
        return chi_error(CH_ERR_SHAPE,
                         "%s: lse has %d dimensions (%lld, ...), expected [%lld, "
                         "%lld] ([B, T] of q)",
                         fn, lse->ndim, (long long)lse->shape[0], (long long)t[0]->shape[0],
                         (long long)t[0]->shape[1]);
    return CH_OK;
}

ch_status ch_attention(ch_tensor *o, ch_tensor *lse, const ch_tensor *q, const ch_tensor *k,
                       const ch_tensor *v, float scale)
{
    static const char fn[] = "ch_attention";
    arg a[] = {{"o", o, CH_F32, 0},
               {"lse", lse, CH_F32, 0},
               {"q", q, CH_F32, 0},
               {"k", k, CH_F32, 0},
               {"v", v, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    const ch_tensor *t[] = {q, k, v, o};
    static const char *const names[] = {"q", "k", "v", "o"};
    TRY(check_attention(fn, lse, t, names, 4));
    TRY(check_finite(fn, "scale", scale));
    for (int i = 0; i < 3; i++) {
        TRY(no_alias(fn, "o", o, names[i], t[i]));
        TRY(no_alias(fn, "lse", lse, names[i], t[i]));
    }
    TRY(no_alias(fn, "o", o, "lse", lse));
    SLOT_OR_HOST(fn, o, attention,
                 ch_attention(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4], scale),
                 FB_OUT(o), FB_OUT(lse), FB_IN(q), FB_IN(k), FB_IN(v));
    int64_t hd = q->shape[2];
    return BE(o)->attention(STREAM(o), q->shape[0], 1, q->shape[1], hd, scale, CH_F32, chi_mem(o),
                            hd, chi_mem(lse), chi_mem(q), chi_mem(k), chi_mem(v), hd);
}

ch_status ch_attention_backward(ch_tensor *dq, ch_tensor *dk, ch_tensor *dv, const ch_tensor *dout,
                                const ch_tensor *q, const ch_tensor *k, const ch_tensor *v,
                                const ch_tensor *o, const ch_tensor *lse, float scale)
{
    static const char fn[] = "ch_attention_backward";
    arg a[] = {{"dq", dq, CH_F32, 0},     {"dk", dk, CH_F32, 0}, {"dv", dv, CH_F32, 0},
               {"dout", dout, CH_F32, 0}, {"q", q, CH_F32, 0},   {"k", k, CH_F32, 0},
               {"v", v, CH_F32, 0},       {"o", o, CH_F32, 0},   {"lse", lse, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    const ch_tensor *t[] = {q, k, v, o, dout, dq, dk, dv};
    static const char *const names[] = {"q", "k", "v", "o", "dout", "dq", "dk", "dv"};
    TRY(check_attention(fn, lse, t, names, 8));
    TRY(check_finite(fn, "scale", scale));
    /* The outputs apart from each other and from every input. */
    const ch_tensor *all[] = {q, k, v, o, dout, lse};
    static const char *const in_names[] = {"q", "k", "v", "o", "dout", "lse"};
    for (int i = 5; i < 8; i++) {
        for (int j = 0; j < 6; j++)
            TRY(no_alias(fn, names[i], t[i], in_names[j], all[j]));
        for (int j = i + 1; j < 8; j++)
            TRY(no_alias(fn, names[i], t[i], names[j], t[j]));
    }
    SLOT_OR_HOST(fn, dq, attention_backward,
                 ch_attention_backward(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4],
                                       on_host[5], on_host[6], on_host[7], on_host[8], scale),
                 FB_OUT(dq), FB_OUT(dk), FB_OUT(dv), FB_IN(dout), FB_IN(q), FB_IN(k), FB_IN(v),
                 FB_IN(o), FB_IN(lse));
    int64_t hd = q->shape[2];
    return BE(dq)->attention_backward(STREAM(dq), q->shape[0], 1, q->shape[1], hd, scale, CH_F32,
                                      chi_mem(dq), chi_mem(dk), chi_mem(dv), chi_mem(q), chi_mem(k),
                                      chi_mem(v), hd, chi_mem(dout), chi_mem(o), hd, chi_mem(lse));
}

/* qkv [B, T, 3 D] (D = heads * hd) and each of names[] [B, T, D], lse
 * [B, heads, T]; *hd set. */
static ch_status check_packed(const char *fn, const ch_tensor *qkv, const ch_tensor *lse,
                              const ch_tensor *const *t, const char *const *names, int n, int heads,
                              int64_t *hd)
{
    TRY(check_3d(fn, "qkv", qkv));
    int64_t b = qkv->shape[0], tt = qkv->shape[1], d = qkv->shape[2] / 3;
    if (heads < 1 || qkv->shape[2] % 3 != 0 || d % heads != 0)
        return chi_error(heads < 1 ? CH_ERR_INVALID_ARGUMENT : CH_ERR_SHAPE,
                         "%s: qkv's last dimension %lld and %d heads: expected heads >= 1 and "
                         "3 * heads * hd",
                         fn, (long long)qkv->shape[2], heads);
    for (int i = 0; i < n; i++)
        if (t[i]->ndim != 3 || t[i]->shape[0] != b || t[i]->shape[1] != tt || t[i]->shape[2] != d)
            return chi_error(CH_ERR_SHAPE,
                             "%s: %s has %d dimensions (%lld, ...), expected "
                             "[%lld, %lld, %lld] ([B, T, D] of qkv [B, T, 3 D])",
                             fn, names[i], t[i]->ndim, (long long)t[i]->shape[0], (long long)b,
                             (long long)tt, (long long)d);
    if (lse->ndim != 3 || lse->shape[0] != b || lse->shape[1] != heads || lse->shape[2] != tt)
        return chi_error(CH_ERR_SHAPE,
                         "%s: lse has %d dimensions (%lld, ...), expected [%lld, "
                         "%d, %lld] ([B, heads, T])",
                         fn, lse->ndim, (long long)lse->shape[0], (long long)b, heads,
                         (long long)tt);
    *hd = d / heads;
    return CH_OK;
}

/* Part i (0 q, 1 k, 2 v) of a packed [B, T, 3 D] tensor: its start. */
static ch_bmem packed_part(const ch_tensor *qkv, int i)
{
    ch_bmem m = chi_mem(qkv);
    m.off += (size_t)(i * (qkv->shape[2] / 3)) * sizeof(float);
    return m;
}

/* The products' format of ch_attention_packed_mixed: f32, bf16 or f16. */
static ch_status check_products(const char *fn, ch_dtype half)
{
    if (half != CH_F32 && half != CH_BF16 && half != CH_F16)
        return chi_error(CH_ERR_DTYPE, "%s: the products' format is %s, expected f32, bf16 or f16",
                         fn, ch_dtype_name(half));
    return CH_OK;
}

static ch_status packed_forward(const char *fn, ch_tensor *o, ch_tensor *lse, const ch_tensor *qkv,
                                int heads, float scale, ch_dtype half)
{
    arg a[] = {{"o", o, CH_F32, 0}, {"lse", lse, CH_F32, 0}, {"qkv", qkv, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(check_products(fn, half));
    int64_t hd;
    const ch_tensor *t[] = {o};
    static const char *const names[] = {"o"};
    TRY(check_packed(fn, qkv, lse, t, names, 1, heads, &hd));
    TRY(check_finite(fn, "scale", scale));
    TRY(no_alias(fn, "o", o, "qkv", qkv));
    TRY(no_alias(fn, "lse", lse, "qkv", qkv));
    TRY(no_alias(fn, "o", o, "lse", lse));
    SLOT_OR_HOST(fn, o, attention,
                 ch_attention_packed_mixed(on_host[0], on_host[1], on_host[2], heads, scale, half),
                 FB_OUT(o), FB_OUT(lse), FB_IN(qkv));
    int64_t d = o->shape[2];
    return BE(o)->attention(STREAM(o), qkv->shape[0], heads, qkv->shape[1], hd, scale, half,
                            chi_mem(o), d, chi_mem(lse), packed_part(qkv, 0), packed_part(qkv, 1),
                            packed_part(qkv, 2), 3 * d);
}

ch_status ch_attention_packed_mixed(ch_tensor *o, ch_tensor *lse, const ch_tensor *qkv, int heads,
                                    float scale, ch_dtype half)
{
    return packed_forward("ch_attention_packed_mixed", o, lse, qkv, heads, scale, half);
}

ch_status ch_attention_packed(ch_tensor *o, ch_tensor *lse, const ch_tensor *qkv, int heads,
                              float scale)
{
    return packed_forward("ch_attention_packed", o, lse, qkv, heads, scale, CH_F32);
}

static ch_status packed_backward(const char *fn, ch_tensor *dqkv, const ch_tensor *dout,
                                 const ch_tensor *qkv, const ch_tensor *o, const ch_tensor *lse,
                                 int heads, float scale, ch_dtype half)
{
    arg a[] = {{"dqkv", dqkv, CH_F32, 0},
               {"dout", dout, CH_F32, 0},
               {"qkv", qkv, CH_F32, 0},
               {"o", o, CH_F32, 0},
               {"lse", lse, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(check_products(fn, half));
    int64_t hd;
    const ch_tensor *t[] = {o, dout};
    static const char *const names[] = {"o", "dout"};
    TRY(check_packed(fn, qkv, lse, t, names, 2, heads, &hd));
    TRY(same_shape(fn, "dqkv", dqkv, "qkv", qkv));
    TRY(check_finite(fn, "scale", scale));
    const ch_tensor *in[] = {qkv, o, dout, lse};
    static const char *const in_names[] = {"qkv", "o", "dout", "lse"};
    for (int i = 0; i < 4; i++)
        TRY(no_alias(fn, "dqkv", dqkv, in_names[i], in[i]));
    SLOT_OR_HOST(fn, dqkv, attention_backward,
                 ch_attention_packed_mixed_backward(on_host[0], on_host[1], on_host[2], on_host[3],
                                                    on_host[4], heads, scale, half),
                 FB_OUT(dqkv), FB_IN(dout), FB_IN(qkv), FB_IN(o), FB_IN(lse));
    int64_t d = o->shape[2];
    return BE(dqkv)->attention_backward(
        STREAM(dqkv), qkv->shape[0], heads, qkv->shape[1], hd, scale, half, packed_part(dqkv, 0),
        packed_part(dqkv, 1), packed_part(dqkv, 2), packed_part(qkv, 0), packed_part(qkv, 1),
        packed_part(qkv, 2), 3 * d, chi_mem(dout), chi_mem(o), d, chi_mem(lse));
}

ch_status ch_attention_packed_mixed_backward(ch_tensor *dqkv, const ch_tensor *dout,
                                             const ch_tensor *qkv, const ch_tensor *o,
                                             const ch_tensor *lse, int heads, float scale,
                                             ch_dtype half)
{
    return packed_backward("ch_attention_packed_mixed_backward", dqkv, dout, qkv, o, lse, heads,
                           scale, half);
}

ch_status ch_attention_packed_backward(ch_tensor *dqkv, const ch_tensor *dout, const ch_tensor *qkv,
                                       const ch_tensor *o, const ch_tensor *lse, int heads,
                                       float scale)
{
    return packed_backward("ch_attention_packed_backward", dqkv, dout, qkv, o, lse, heads, scale,
                           CH_F32);
}

/* ---- Embedding ----------------------------------------------------------------- */

/* table (or dtable) [V, D]; the rows of y (or dy) one per index. */
static ch_status check_embedding(const char *fn, const char *tn, const ch_tensor *table,
                                 const char *yn, const ch_tensor *y, const ch_tensor *idx)
{
    if (table->ndim != 2)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %d dimensions, expected 2 ([V, D])", fn, tn,
                         table->ndim);
    if (y->numel != idx->numel * table->shape[1])
        return chi_error(CH_ERR_SHAPE, "%s: %s has %lld elements, expected %lld (idx's %lld "
                         "times D = %lld)", fn, yn, (long long)y->numel,
                         (long long)(idx->numel * table->shape[1]), (long long)idx->numel,
                         (long long)table->shape[1]);
    return CH_OK;
}

ch_status ch_embedding(ch_tensor *y, const ch_tensor *table, const ch_tensor *idx)
{
    static const char fn[] = "ch_embedding";
    arg a[] = {{"y", y, CH_F32, 0}, {"table", table, CH_F32, 0}, {"idx", idx, CH_I32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(check_embedding(fn, "table", table, "y", y, idx));
    TRY(no_alias(fn, "y", y, "table", table));
    TRY(no_alias(fn, "y", y, "idx", idx));
    SLOT_OR_HOST(fn, y, embedding, ch_embedding(on_host[0], on_host[1], on_host[2]), FB_OUT(y),
                 FB_IN(table), FB_IN(idx));
    return BE(y)->embedding(STREAM(y), idx->numel, table->shape[0], table->shape[1], chi_mem(y),
                            chi_mem(table), chi_mem(idx));
}

ch_status ch_embedding_backward(ch_tensor *dtable, const ch_tensor *dy, const ch_tensor *idx)
{
    static const char fn[] = "ch_embedding_backward";
    arg a[] = {{"dtable", dtable, CH_F32, 0}, {"dy", dy, CH_F32, 0}, {"idx", idx, CH_I32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(check_embedding(fn, "dtable", dtable, "dy", dy, idx));
    TRY(no_alias(fn, "dtable", dtable, "dy", dy));
    TRY(no_alias(fn, "dtable", dtable, "idx", idx));
    SLOT_OR_HOST(fn, dtable, embedding_backward,
                 ch_embedding_backward(on_host[0], on_host[1], on_host[2]), FB_IO(dtable),
                 FB_IN(dy), FB_IN(idx));
    return BE(dtable)->embedding_backward(STREAM(dtable), idx->numel, dtable->shape[0],
                                          dtable->shape[1], chi_mem(dtable), chi_mem(dy),
                                          chi_mem(idx));
}

/* ---- Global average pooling ------------------------------------------------------ */

/* x (or dx) [N, C, H, W]; y (or dy) [N, C] or [N, C, 1, 1]. */
static ch_status check_avgpool(const char *fn, const char *xn, const ch_tensor *x,
                               const char *yn, const ch_tensor *y)
{
    if (x->ndim != 4)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %d dimensions, expected 4 ([N, C, H, W])", fn,
                         xn, x->ndim);
    int ok = (y->ndim == 2 || (y->ndim == 4 && y->shape[2] == 1 && y->shape[3] == 1)) &&
             y->shape[0] == x->shape[0] && y->shape[1] == x->shape[1];
    if (!ok)
        return chi_error(CH_ERR_SHAPE, "%s: %s must be [%lld, %lld] (or [%lld, %lld, 1, 1])", fn,
                         yn, (long long)x->shape[0], (long long)x->shape[1],
                         (long long)x->shape[0], (long long)x->shape[1]);
    return no_alias(fn, yn, y, xn, x);
}

/* x [N, C, H, W] seen as [N * C, H * W] (the caller frees the view). */
static ch_status planes(ch_tensor **out, const ch_tensor *x)
{
    int64_t shape[2] = {x->shape[0] * x->shape[1], x->shape[2] * x->shape[3]};
    return read_view(out, x, 2, shape);
}

ch_status ch_avgpool_global(ch_tensor *y, const ch_tensor *x)
{
    static const char fn[] = "ch_avgpool_global";
    arg a[] = {{"y", y, CH_F32, 0}, {"x", x, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(check_avgpool(fn, "x", x, "y", y));
    ch_tensor *xv = NULL;
    TRY(planes(&xv, x));
    ch_status st = ch_mean(y, xv, 1);
    ch_tensor_free(xv);
    return st;
}

ch_status ch_avgpool_global_backward(ch_tensor *dx, const ch_tensor *dy)
{
    static const char fn[] = "ch_avgpool_global_backward";
    arg a[] = {{"dx", dx, CH_F32, 0}, {"dy", dy, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(check_avgpool(fn, "dx", dx, "dy", dy));
    ch_tensor *dxv = NULL;
    TRY(planes(&dxv, dx));
    /* dx = 0, plus dy broadcast along each plane, times 1 / (H W). */
    ch_status st = ch_fill(dxv, 0.0);
    if (st == CH_OK)
        st = ch_bias_add(dxv, dxv, dy, 0);
    if (st == CH_OK)
        st = ch_scale(dxv, dxv, (float)(1.0 / (double)dxv->shape[1]));
    ch_tensor_free(dxv);
    return st;
}
