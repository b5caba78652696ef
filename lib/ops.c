/* Op dispatch: every argument is checked here, once, so that backends only
 * ever see valid shapes, dtypes and devices. */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opcheck.h"
#include "stamp.h"

/* ---- Data movement ------------------------------------------------------- */

ch_status ch_fill(ch_tensor *y, double value)
{
    static const char fn[] = "ch_fill";
    arg a[] = {{"y", y, ANY, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    if (y->dtype != CH_F32 && y->dtype != CH_I32)
        return chi_error(CH_ERR_DTYPE, "%s: y is %s, expected f32 or i32", fn,
                         ch_dtype_name(y->dtype));
    if (y->dtype == CH_I32 && (value != floor(value) || value < INT32_MIN || value > INT32_MAX))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: value %g is not an i32", fn, value);
    uint32_t word;
    if (y->dtype == CH_I32) {
        word = (uint32_t)(int32_t)value;
    } else {
        float f = (float)value;
        memcpy(&word, &f, sizeof word);
    }
    SLOT_OR_HOST(fn, y, fill, ch_fill(on_host[0], value), FB_OUT(y));
    return BE(y)->fill(STREAM(y), chi_mem(y), y->numel, word);
}

ch_status ch_copy(ch_tensor *y, const ch_tensor *x)
{
    static const char fn[] = "ch_copy";
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "%s: call ch_init first", fn);
    if (!y || !x)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, !y ? "y" : "x");
    if (y->dtype != x->dtype)
        return chi_error(CH_ERR_DTYPE, "%s: y is %s but x is %s", fn, ch_dtype_name(y->dtype),
                         ch_dtype_name(x->dtype));
    TRY(same_numel(fn, "y", y, "x", x));
    if (y->dev != x->dev)
        return chi_copy_across(y, x);
    if (y->buf == x->buf && y->off == x->off)
        return CH_OK;
    TRY(no_alias(fn, "y", y, "x", x));
    return BE(y)->copy(STREAM(y), chi_mem(y), chi_mem(x), ch_tensor_nbytes(x));
}

ch_status ch_transpose01(ch_tensor *y, const ch_tensor *x)
{
    static const char fn[] = "ch_transpose01";
    arg a[] = {{"y", y, ANY, 0}, {"x", x, ANY, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    if (y->dtype != x->dtype || ch_dtype_size(x->dtype) != 4)
        return chi_error(CH_ERR_DTYPE, "%s: y is %s and x is %s, expected both f32 or both i32",
                         fn, ch_dtype_name(y->dtype), ch_dtype_name(x->dtype));
    if (x->ndim < 2 || y->ndim != x->ndim)
        return chi_error(CH_ERR_SHAPE, "%s: x has %d dimensions and y %d, expected the same, >= 2",
                         fn, x->ndim, y->ndim);
    int ok = y->shape[0] == x->shape[1] && y->shape[1] == x->shape[0];
    for (int i = 2; i < x->ndim; i++)
        ok = ok && y->shape[i] == x->shape[i];
    if (!ok)
        return chi_error(CH_ERR_SHAPE, "%s: y's shape is not x's with the first two swapped", fn);
    TRY(no_alias(fn, "y", y, "x", x));
    SLOT_OR_HOST(fn, y, transpose01, ch_transpose01(on_host[0], on_host[1]), FB_OUT(y), FB_IN(x));
    return BE(y)->transpose01(STREAM(y), x->shape[0], x->shape[1],
                              x->numel / (x->shape[0] * x->shape[1]), chi_mem(y), chi_mem(x));
}

/* ---- GEMM ------------------------------------------------------------------- */

/* ch_gemm's and ch_gemm_batched's dtypes: a and b alike (f32, bf16 or
 * f16), c f32 or a's dtype. */
ch_status chi_gemm_dtypes(const char *fn, const ch_tensor *c, const ch_tensor *a,
                          const ch_tensor *b)
{
    if (a->dtype != CH_F32 && a->dtype != CH_BF16 && a->dtype != CH_F16)
        return chi_error(CH_ERR_DTYPE, "%s: a is %s, expected f32, bf16 or f16", fn,
                         ch_dtype_name(a->dtype));
    if (b->dtype != a->dtype)
        return chi_error(CH_ERR_DTYPE, "%s: a is %s but b is %s, expected the same dtype", fn,
                         ch_dtype_name(a->dtype), ch_dtype_name(b->dtype));
    if (c->dtype != CH_F32 && c->dtype != a->dtype)
        return chi_error(CH_ERR_DTYPE, "%s: c is %s, expected f32 or a's %s", fn,
                         ch_dtype_name(c->dtype), ch_dtype_name(a->dtype));
    return CH_OK;
}

/* x as f32: x itself when it is f32, else *tmp, a new f32 copy (with x's
 * values when `fill`), for the caller to free. */
ch_status chi_widened(const ch_tensor *x, int fill, ch_tensor **tmp, ch_tensor **out)
{
    *tmp = NULL;
    if (x->dtype == CH_F32) {
        *out = (ch_tensor *)x;
        return CH_OK;
    }
    TRY(ch_tensor_new(tmp, x->dev, CH_F32, x->ndim, x->shape));
    ch_status st = fill ? ch_cast(*tmp, x) : CH_OK;
    if (st != CH_OK) {
        ch_tensor_free(*tmp);
        *tmp = NULL;
        return st;
    }
    *out = *tmp;
    return CH_OK;
}

/* The product when a tensor is half (shapes checked, sizes m, n, k over
 * `count` matrices; count 0: ch_gemm's one 2-D product): the backend's
 * gemm_half, or a and b widened to f32 and the f32 GEMM into c or, when c
 * is half, into an f32 copy of it narrowed afterwards. */
ch_status chi_gemm_half(const char *fn, ch_tensor *c, int trans_a, int trans_b, float alpha,
                        const ch_tensor *a, const ch_tensor *b, float beta, int64_t count,
                        int64_t m, int64_t n, int64_t k)
{
    const ch_backend_i *be = BE(c);
    int last = a->ndim - 1;
    if (be->gemm_half) {
        ch_status st = be->gemm_half(STREAM(c), a->dtype, c->dtype, trans_a != 0, trans_b != 0,
                                     count ? count : 1, m, n, k, alpha, chi_mem(a), a->shape[last],
                                     count ? a->shape[1] * a->shape[2] : 0, chi_mem(b),
                                     b->shape[last], count ? b->shape[1] * b->shape[2] : 0, beta,
                                     chi_mem(c), n, count ? m * n : 0, (ch_bmem){0});
        if (st != CH_ERR_UNSUPPORTED)
            return st;
    }
    ch_tensor *ta = NULL, *tb = NULL, *tc = NULL, *a32, *b32, *c32;
    ch_status st = chi_widened(a, 1, &ta, &a32);
    if (st == CH_OK)
        st = chi_widened(b, 1, &tb, &b32);
    if (st == CH_OK)
        st = chi_widened(c, beta != 0.0f, &tc, &c32);
    if (st == CH_OK)
        st = count ? ch_gemm_batched(c32, trans_a, trans_b, alpha, a32, b32, beta)
                   : ch_gemm(c32, trans_a, trans_b, alpha, a32, b32, beta);
    if (st == CH_OK && tc)
        st = ch_cast(c, tc);
    ch_tensor_free(ta);
    ch_tensor_free(tb);
    ch_tensor_free(tc);
    if (st != CH_OK)
        return chi_error(st, "%s (%s inputs, %s output): %s", fn, ch_dtype_name(a->dtype),
                         ch_dtype_name(c->dtype), ch_last_error());
    return CH_OK;
}

/* ch_gemm's checks; *m, *n, *k set. */
static ch_status gemm_check(const char *fn, ch_tensor *c, int trans_a, int trans_b, float alpha,
                            const ch_tensor *a, const ch_tensor *b, int64_t *m, int64_t *n,
                            int64_t *k)
{
    arg args[] = {{"c", c, ANY, 0}, {"a", a, ANY, 0}, {"b", b, ANY, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(chi_gemm_dtypes(fn, c, a, b));
    if (a->ndim != 2 || b->ndim != 2 || c->ndim != 2)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %d dimensions, expected 2", fn,
                         a->ndim != 2 ? "a" : b->ndim != 2 ? "b" : "c",
                         a->ndim != 2 ? a->ndim : b->ndim != 2 ? b->ndim : c->ndim);
    TRY(check_finite(fn, "alpha", alpha));
    *m = trans_a ? a->shape[1] : a->shape[0];
    *k = trans_a ? a->shape[0] : a->shape[1];
    int64_t kb = trans_b ? b->shape[1] : b->shape[0];
    *n = trans_b ? b->shape[0] : b->shape[1];
    if (*k != kb)
        return chi_error(CH_ERR_SHAPE, "%s: op(a) has %lld columns but op(b) has %lld rows", fn,
                         (long long)*k, (long long)kb);
    if (c->shape[0] != *m || c->shape[1] != *n)
        return chi_error(CH_ERR_SHAPE, "%s: c is [%lld, %lld], expected [%lld, %lld]", fn,
                         (long long)c->shape[0], (long long)c->shape[1], (long long)*m,
                         (long long)*n);
    TRY(no_alias(fn, "c", c, "a", a));
    return no_alias(fn, "c", c, "b", b);
}

/* The product once checked: the half path or the f32 slot. */
static ch_status gemm_run(const char *fn, ch_tensor *c, int trans_a, int trans_b, float alpha,
                          const ch_tensor *a, const ch_tensor *b, float beta, int64_t m, int64_t n,
                          int64_t k)
{
    if (a->dtype != CH_F32 || c->dtype != CH_F32)
        return chi_gemm_half(fn, c, trans_a, trans_b, alpha, a, b, beta, 0, m, n, k);
    /* gemm is a required slot: the registry refused a backend without it. */
    return BE(c)->gemm(STREAM(c), trans_a != 0, trans_b != 0, m, n, k, alpha, chi_mem(a),
                       a->shape[1], chi_mem(b), b->shape[1], beta, chi_mem(c), n);
}

ch_status ch_gemm(ch_tensor *c, int trans_a, int trans_b, float alpha, const ch_tensor *a,
                  const ch_tensor *b, float beta)
{
    static const char fn[] = "ch_gemm";
    int64_t m, n, k;
    TRY(gemm_check(fn, c, trans_a, trans_b, alpha, a, b, &m, &n, &k));
    TRY(check_finite(fn, "beta", beta));
    return gemm_run(fn, c, trans_a, trans_b, alpha, a, b, beta, m, n, k);
}

/* ch_gemm_bias's checks past gemm_check's: bias f32 [n], on c's device,
 * apart from c (c's dtype: gemm_check's, f32 or a's). */
static ch_status gemm_bias_check(const char *fn, const ch_tensor *c, const ch_tensor *bias,
                                 int64_t n)
{
    arg args[] = {{"c", c, ANY, 0}, {"bias", bias, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    if (bias->ndim != 1 || bias->shape[0] != n)
        return chi_error(CH_ERR_SHAPE, "%s: bias has %d dimensions (%lld, ...), expected [%lld]",
                         fn, bias->ndim, (long long)bias->shape[0], (long long)n);
    return no_alias(fn, "c", c, "bias", bias);
}

ch_status ch_gemm_bias(ch_tensor *c, int trans_a, int trans_b, float alpha, const ch_tensor *a,
                       const ch_tensor *b, const ch_tensor *bias)
{
    static const char fn[] = "ch_gemm_bias";
    int64_t m, n, k;
    TRY(gemm_check(fn, c, trans_a, trans_b, alpha, a, b, &m, &n, &k));
    TRY(gemm_bias_check(fn, c, bias, n));
    const ch_backend_i *be = BE(c);
    /* c f32 or, by gemm_check, a's half dtype */
    if (a->dtype != CH_F32 && be->gemm_half) {
        ch_status st = be->gemm_half(STREAM(c), a->dtype, c->dtype, trans_a != 0, trans_b != 0, 1,
                                     m, n, k, alpha, chi_mem(a), a->shape[1], 0, chi_mem(b),
                                     b->shape[1], 0, 0.0f, chi_mem(c), n, 0, chi_mem(bias));
        if (st != CH_ERR_UNSUPPORTED)
            return st;
    }
    if (c->dtype == CH_F32) {
        TRY(gemm_run(fn, c, trans_a, trans_b, alpha, a, b, 0.0f, m, n, k));
        return ch_bias_add(c, c, bias, 1);
    }
    /* A half c apart: the product in f32 on the device, then the bias
     * added and the sum rounded into c once, as the fused pass rounds it
     * (the product rounded first, then its sum with the bias, would round
     * twice). */
    ch_tensor *wide = NULL;
    TRY(ch_tensor_new(&wide, c->dev, CH_F32, c->ndim, c->shape));
    ch_status st = gemm_run(fn, wide, trans_a, trans_b, alpha, a, b, 0.0f, m, n, k);
    if (st == CH_OK)
        st = ch_bias_add(c, wide, bias, 1);
    ch_tensor_free(wide);
    return st;
}

/* act's check (ch_activation_forward's, below). */
static ch_status check_act(const char *fn, ch_activation act);

ch_status ch_gemm_bias_act(ch_tensor *c, ch_tensor *pre, int trans_a, int trans_b, float alpha,
                           const ch_tensor *a, const ch_tensor *b, const ch_tensor *bias,
                           ch_activation act)
{
    static const char fn[] = "ch_gemm_bias_act";
    int64_t m, n, k;
    TRY(gemm_check(fn, c, trans_a, trans_b, alpha, a, b, &m, &n, &k));
    TRY(gemm_bias_check(fn, c, bias, n));
    TRY(check_act(fn, act));
    if (pre) {
        arg args[] = {{"c", c, ANY, 0}, {"pre", pre, c->dtype, 0}};
        TRY(check_args(fn, args, NARGS(args)));
        TRY(same_shape(fn, "pre", pre, "c", c));
        TRY(no_alias(fn, "pre", pre, "c", c));
        TRY(no_alias(fn, "pre", pre, "a", a));
        TRY(no_alias(fn, "pre", pre, "b", b));
        TRY(no_alias(fn, "pre", pre, "bias", bias));
    }
    const ch_backend_i *be = BE(c);
    if (be->gemm_bias_act) {
        ch_bmem none = {NULL, 0};
        ch_status st =
            be->gemm_bias_act(STREAM(c), a->dtype, c->dtype, act, trans_a != 0, trans_b != 0, m, n,
                              k, alpha, chi_mem(a), a->shape[1], chi_mem(b), b->shape[1],
                              chi_mem(c), n, pre ? chi_mem(pre) : none, chi_mem(bias));
        if (st != CH_ERR_UNSUPPORTED)
            return st;
    }
    /* Composed: the product and bias into pre (or c), then the activation
     * from there into c. */
    ch_tensor *z = pre ? pre : c;
    TRY(ch_gemm_bias(z, trans_a, trans_b, alpha, a, b, bias));
    return ch_activation_forward(c, z, act);
}

/* ---- Elementwise ------------------------------------------------------------ */

typedef struct binary_ctx {
    const char *fn;
    ch_binary_op op;
} binary_ctx;

static ch_status binary(const char *fn, ch_binary_op op, ch_tensor *y, const ch_tensor *a,
                        const ch_tensor *b);

static ch_status binary_f32(const void *c, ch_tensor *const *t)
{
    const binary_ctx *x = c;
    return binary(x->fn, x->op, t[0], t[1], t[2]);
}

static ch_status binary(const char *fn, ch_binary_op op, ch_tensor *y, const ch_tensor *a,
                        const ch_tensor *b)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN, CHI_HALF_IN};
    binary_ctx ctx = {fn, op};
    CHI_HALF_ENTRY(roles, binary_f32, &ctx, y, CHI_T(a), CHI_T(b));
    arg args[] = {{"y", y, CH_F32, 0}, {"a", a, CH_F32, 0}, {"b", b, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(same_numel(fn, "y", y, "a", a));
    TRY(same_numel(fn, "y", y, "b", b));
    TRY(same_or_apart(fn, "y", y, "a", a));
    TRY(same_or_apart(fn, "y", y, "b", b));
    SLOT_OR_HOST(fn, y, binary, binary(fn, op, on_host[0], on_host[1], on_host[2]), FB_OUT(y),
                 FB_IN(a), FB_IN(b));
    return BE(y)->binary(STREAM(y), op, y->numel, chi_mem(y), chi_mem(a), chi_mem(b));
}

ch_status ch_add(ch_tensor *y, const ch_tensor *a, const ch_tensor *b)
{
    return binary("ch_add", CH_BIN_ADD, y, a, b);
}

ch_status ch_sub(ch_tensor *y, const ch_tensor *a, const ch_tensor *b)
{
    return binary("ch_sub", CH_BIN_SUB, y, a, b);
}

ch_status ch_mul(ch_tensor *y, const ch_tensor *a, const ch_tensor *b)
{
    return binary("ch_mul", CH_BIN_MUL, y, a, b);
}

typedef struct axpby_ctx {
    const char *fn;
    float alpha, beta;
} axpby_ctx;

static ch_status axpby(const char *fn, ch_tensor *y, float alpha, const ch_tensor *x,
                       float beta);

static ch_status axpby_f32(const void *c, ch_tensor *const *t)
{
    const axpby_ctx *a = c;
    return axpby(a->fn, t[0], a->alpha, t[1], a->beta);
}

static ch_status axpby(const char *fn, ch_tensor *y, float alpha, const ch_tensor *x,
                       float beta)
{
    static const int read_y[] = {CHI_IO, CHI_HALF_IN}, write_y[] = {CHI_HALF_OUT, CHI_HALF_IN};
    axpby_ctx ctx = {fn, alpha, beta};
    CHI_HALF_ENTRY(beta != 0.0f ? read_y : write_y, axpby_f32, &ctx, y, CHI_T(x));
    arg args[] = {{"y", y, CH_F32, 0}, {"x", x, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_finite(fn, "alpha", alpha));
    TRY(same_numel(fn, "y", y, "x", x));
    TRY(same_or_apart(fn, "y", y, "x", x));
    SLOT_OR_HOST(fn, y, axpby, axpby(fn, on_host[0], alpha, on_host[1], beta),
                 FB_OUT_READ_IF(y, beta != 0.0f), FB_IN(x));
    return BE(y)->axpby(STREAM(y), y->numel, chi_mem(y), alpha, chi_mem(x), beta);
}

ch_status ch_scale(ch_tensor *y, const ch_tensor *x, float alpha)
{
    return axpby("ch_scale", y, alpha, x, 0.0f);
}

ch_status ch_axpy(ch_tensor *y, float alpha, const ch_tensor *x)
{
    return axpby("ch_axpy", y, alpha, x, 1.0f);
}

static ch_status check_act(const char *fn, ch_activation act)
{
    if (!chi_enum_known((int)act, CH_ACT_COUNT))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: act %d is not a ch_activation (0 to CH_ACT_COUNT - 1 = %d)", fn,
                         (int)act, CH_ACT_COUNT - 1);
    return CH_OK;
}

static ch_status act_forward_f32(const void *c, ch_tensor *const *t)
{
    return ch_activation_forward(t[0], t[1], *(const ch_activation *)c);
}

ch_status ch_activation_forward(ch_tensor *y, const ch_tensor *x, ch_activation act)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, act_forward_f32, &act, y, CHI_T(x));
    static const char fn[] = "ch_activation_forward";
    arg args[] = {{"y", y, CH_F32, 0}, {"x", x, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_act(fn, act));
    TRY(same_numel(fn, "y", y, "x", x));
    TRY(same_or_apart(fn, "y", y, "x", x));
    SLOT_OR_HOST(fn, y, act_forward, ch_activation_forward(on_host[0], on_host[1], act), FB_OUT(y),
                 FB_IN(x));
    return BE(y)->act_forward(STREAM(y), act, y->numel, chi_mem(y), chi_mem(x));
}

static ch_status act_backward_f32(const void *c, ch_tensor *const *t)
{
    return ch_activation_backward(t[0], t[1], t[2], t[3], *(const ch_activation *)c);
}

ch_status ch_activation_backward(ch_tensor *dx, const ch_tensor *dy, const ch_tensor *x,
                                 const ch_tensor *y, ch_activation act)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN, CHI_HALF_IN, CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, act_backward_f32, &act, dx, CHI_T(dy), CHI_T(x), CHI_T(y));
    static const char fn[] = "ch_activation_backward";
    TRY(check_act(fn, act));
    int reads_x = act == CH_ACT_RELU || act == CH_ACT_GELU || act == CH_ACT_GELU_TANH;
    arg args[] = {{"dx", dx, CH_F32, 0},
                  {"dy", dy, CH_F32, 0},
                  {"x", x, CH_F32, !reads_x},
                  {"y", y, CH_F32, reads_x}};
    TRY(check_args(fn, args, NARGS(args)));
    const ch_tensor *in = reads_x ? x : y;
    TRY(same_numel(fn, "dx", dx, "dy", dy));
    TRY(same_numel(fn, "dx", dx, reads_x ? "x" : "y", in));
    TRY(same_or_apart(fn, "dx", dx, "dy", dy));
    TRY(same_or_apart(fn, "dx", dx, reads_x ? "x" : "y", in));
    ch_bmem none = {NULL, 0};
    SLOT_OR_HOST(fn, dx, act_backward,
                 ch_activation_backward(on_host[0], on_host[1], on_host[2], on_host[3], act),
                 FB_OUT(dx), FB_IN(dy), FB_IN(x), FB_IN(y));
    return BE(dx)->act_backward(STREAM(dx), act, dx->numel, chi_mem(dx), chi_mem(dy),
                                reads_x ? chi_mem(x) : none, reads_x ? none : chi_mem(y));
}

/* ---- Bias ----------------------------------------------------------------- */

static ch_status bias_add_f32(const void *c, ch_tensor *const *t)
{
    return ch_bias_add(t[0], t[1], t[2], *(const int *)c);
}

ch_status ch_bias_add(ch_tensor *y, const ch_tensor *x, const ch_tensor *bias, int axis)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN, CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, bias_add_f32, &axis, y, CHI_T(x), CHI_T(bias));
    static const char fn[] = "ch_bias_add";
    arg args[] = {{"y", y, CH_F32, 0}, {"x", x, CH_F32, 0}, {"bias", bias, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_axis(fn, x, &axis));
    TRY(same_numel(fn, "y", y, "x", x));
    TRY(same_or_apart(fn, "y", y, "x", x));
    TRY(no_alias(fn, "y", y, "bias", bias));
    int64_t outer, c, inner;
    split_at(x, axis, &outer, &c, &inner);
    if (bias->numel != c)
        return chi_error(CH_ERR_SHAPE, "%s: bias has %lld elements, x has %lld on axis %d", fn,
                         (long long)bias->numel, (long long)c, axis);
    SLOT_OR_HOST(fn, y, bias_add, ch_bias_add(on_host[0], on_host[1], on_host[2], axis), FB_OUT(y),
                 FB_IN(x), FB_IN(bias));
    return BE(y)->bias_add(STREAM(y), outer, c, inner, chi_mem(y), chi_mem(x), chi_mem(bias));
}

typedef struct bias_grad_ctx {
    int axis;
    float beta;
} bias_grad_ctx;

static ch_status bias_grad_f32(const void *c, ch_tensor *const *t)
{
    const bias_grad_ctx *b = c;
    return ch_bias_grad(t[0], t[1], b->axis, b->beta);
}

ch_status ch_bias_grad(ch_tensor *db, const ch_tensor *dy, int axis, float beta)
{
    static const int read_db[] = {CHI_IO, CHI_HALF_IN}, write_db[] = {CHI_HALF_OUT, CHI_HALF_IN};
    bias_grad_ctx ctx = {axis, beta};
    CHI_HALF_ENTRY(beta != 0.0f ? read_db : write_db, bias_grad_f32, &ctx, db, CHI_T(dy));
    static const char fn[] = "ch_bias_grad";
    arg args[] = {{"db", db, CH_F32, 0}, {"dy", dy, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_axis(fn, dy, &axis));
    TRY(check_finite(fn, "beta", beta));
    TRY(no_alias(fn, "db", db, "dy", dy));
    int64_t outer, c, inner;
    split_at(dy, axis, &outer, &c, &inner);
    if (db->numel != c)
        return chi_error(CH_ERR_SHAPE, "%s: db has %lld elements, dy has %lld on axis %d", fn,
                         (long long)db->numel, (long long)c, axis);
    SLOT_OR_HOST(fn, db, bias_grad, ch_bias_grad(on_host[0], on_host[1], axis, beta),
                 FB_OUT_READ_IF(db, beta != 0.0f), FB_IN(dy));
    return BE(db)->bias_grad(STREAM(db), outer, c, inner, chi_mem(db), chi_mem(dy), beta);
}

/* ---- Loss ----------------------------------------------------------------- */

static ch_status check_xent(const char *fn, const char *pn, const ch_tensor *probs,
                            const ch_tensor *labels, int64_t *n, int64_t *c)
{
    if (probs->ndim != 2)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %d dimensions, expected 2 ([N, C])", fn, pn,
                         probs->ndim);
    *n = probs->shape[0];
    *c = probs->shape[1];
    if (labels->numel != *n)
        return chi_error(CH_ERR_SHAPE, "%s: labels has %lld elements, expected N = %lld", fn,
                         (long long)labels->numel, (long long)*n);
    return CH_OK;
}

ch_status ch_softmax_xent(ch_tensor *loss, ch_tensor *probs, const ch_tensor *logits,
                          const ch_tensor *labels)
{
    static const char fn[] = "ch_softmax_xent";
    arg args[] = {{"loss", loss, CH_F32, 0},
                  {"probs", probs, CH_F32, 0},
                  {"logits", logits, CH_F32, 0},
                  {"labels", labels, CH_I32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    int64_t n = 0, c = 0;
    TRY(check_xent(fn, "logits", logits, labels, &n, &c));
    TRY(same_numel(fn, "probs", probs, "logits", logits));
    if (loss->numel != 1)
        return chi_error(CH_ERR_SHAPE, "%s: loss has %lld elements, expected 1", fn,
                         (long long)loss->numel);
    TRY(same_or_apart(fn, "probs", probs, "logits", logits));
    TRY(no_alias(fn, "loss", loss, "probs", probs));
    TRY(no_alias(fn, "loss", loss, "logits", logits));
    SLOT_OR_HOST(fn, loss, softmax_xent,
                 ch_softmax_xent(on_host[0], on_host[1], on_host[2], on_host[3]), FB_OUT(loss),
                 FB_OUT(probs), FB_IN(logits), FB_IN(labels));
    return BE(loss)->softmax_xent(STREAM(loss), n, c, chi_mem(loss), chi_mem(probs),
                                  chi_mem(logits), chi_mem(labels));
}

ch_status ch_softmax_xent_backward(ch_tensor *dlogits, const ch_tensor *probs,
                                   const ch_tensor *labels, float scale)
{
    static const char fn[] = "ch_softmax_xent_backward";
    arg args[] = {{"dlogits", dlogits, CH_F32, 0},
                  {"probs", probs, CH_F32, 0},
                  {"labels", labels, CH_I32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    int64_t n = 0, c = 0;
    TRY(check_xent(fn, "probs", probs, labels, &n, &c));
    TRY(same_numel(fn, "dlogits", dlogits, "probs", probs));
    TRY(check_finite(fn, "scale", scale));
    TRY(same_or_apart(fn, "dlogits", dlogits, "probs", probs));
    SLOT_OR_HOST(fn, dlogits, softmax_xent_backward,
                 ch_softmax_xent_backward(on_host[0], on_host[1], on_host[2], scale),
                 FB_OUT(dlogits), FB_IN(probs), FB_IN(labels));
    return BE(dlogits)->softmax_xent_backward(STREAM(dlogits), n, c, chi_mem(dlogits),
                                              chi_mem(probs), chi_mem(labels), scale);
}

ch_status ch_softmax_xent_fused(ch_tensor *loss, ch_tensor *logits, const ch_tensor *labels,
                                float scale)
{
    static const char fn[] = "ch_softmax_xent_fused";
    arg args[] = {
        {"loss", loss, CH_F32, 0}, {"logits", logits, ANY, 0}, {"labels", labels, CH_I32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    ch_dtype dt = logits->dtype;
    if (dt != CH_F32 && dt != CH_BF16 && dt != CH_F16)
        return chi_error(CH_ERR_DTYPE, "%s: logits is %s, expected f32, bf16 or f16", fn,
                         ch_dtype_name(dt));
    int64_t n = 0, c = 0;
    TRY(check_xent(fn, "logits", logits, labels, &n, &c));
    if (loss->numel != 1)
        return chi_error(CH_ERR_SHAPE, "%s: loss has %lld elements, expected 1", fn,
                         (long long)loss->numel);
    TRY(check_finite(fn, "scale", scale));
    TRY(no_alias(fn, "loss", loss, "logits", logits));
    TRY(no_alias(fn, "loss", loss, "labels", labels));
    TRY(no_alias(fn, "logits", logits, "labels", labels));
    SLOT_OR_HOST(fn, loss, softmax_xent_fused,
                 ch_softmax_xent_fused(on_host[0], on_host[1], on_host[2], scale), FB_OUT(loss),
                 FB_IO(logits), FB_IN(labels));
    return BE(loss)->softmax_xent_fused(STREAM(loss), n, c, dt, scale, chi_mem(loss),
                                        chi_mem(logits), chi_mem(labels));
}

/* ---- Reductions ------------------------------------------------------------ */

static ch_status reduction(const char *fn, ch_tensor *y, const ch_tensor *x, int axis,
                           ch_dtype ydtype, int64_t *outer, int64_t *n, int64_t *inner)
{
    arg args[] = {{"y", y, ydtype, 0}, {"x", x, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_axis(fn, x, &axis));
    split_at(x, axis, outer, n, inner);
    if (y->numel != *outer * *inner)
        return chi_error(CH_ERR_SHAPE, "%s: y has %lld elements, expected %lld (x without axis %d)",
                         fn, (long long)y->numel, (long long)(*outer * *inner), axis);
    return no_alias(fn, "y", y, "x", x);
}

typedef struct sum_ctx {
    const char *fn;
    ch_axis_op op;
    int axis;
} sum_ctx;

static ch_status sum_axis(const char *fn, ch_axis_op op, ch_tensor *y, const ch_tensor *x,
                          int axis);

static ch_status sum_f32(const void *c, ch_tensor *const *t)
{
    const sum_ctx *x = c;
    return sum_axis(x->fn, x->op, t[0], t[1], x->axis);
}

static ch_status sum_axis(const char *fn, ch_axis_op op, ch_tensor *y, const ch_tensor *x,
                          int axis)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN};
    sum_ctx ctx = {fn, op, axis};
    CHI_HALF_ENTRY(roles, sum_f32, &ctx, y, CHI_T(x));
    int64_t outer, n, inner;
    TRY(reduction(fn, y, x, axis, CH_F32, &outer, &n, &inner));
    SLOT_OR_HOST(fn, y, sum_axis, sum_axis(fn, op, on_host[0], on_host[1], axis), FB_OUT(y),
                 FB_IN(x));
    return BE(y)->sum_axis(STREAM(y), op, outer, n, inner, chi_mem(y), chi_mem(x));
}

ch_status ch_sum(ch_tensor *y, const ch_tensor *x, int axis)
{
    return sum_axis("ch_sum", CH_AXIS_SUM, y, x, axis);
}

ch_status ch_mean(ch_tensor *y, const ch_tensor *x, int axis)
{
    return sum_axis("ch_mean", CH_AXIS_MEAN, y, x, axis);
}

ch_status ch_argmax(ch_tensor *y, const ch_tensor *x, int axis)
{
    static const char fn[] = "ch_argmax";
    int64_t outer, n, inner;
    TRY(reduction(fn, y, x, axis, CH_I32, &outer, &n, &inner));
    SLOT_OR_HOST(fn, y, argmax, ch_argmax(on_host[0], on_host[1], axis), FB_OUT(y), FB_IN(x));
    return BE(y)->argmax(STREAM(y), outer, n, inner, chi_mem(y), chi_mem(x));
}

/* ---- Conversions ------------------------------------------------------------ */

ch_status ch_cast(ch_tensor *y, const ch_tensor *x)
{
    static const char fn[] = "ch_cast";
    arg args[] = {{"y", y, ANY, 0}, {"x", x, ANY, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(same_numel(fn, "y", y, "x", x));
    TRY(no_alias(fn, "y", y, "x", x));
    ch_dtype to = y->dtype, from = x->dtype;
    ch_status (*slot)(void *, int64_t, ch_bmem, ch_bmem) = NULL;
    const ch_backend_i *be = BE(y);
    if (from == CH_F32 && to == CH_BF16)
        slot = be->f32_to_bf16;
    else if (from == CH_BF16 && to == CH_F32)
        slot = be->bf16_to_f32;
    else if (from == CH_F32 && to == CH_F16)
        slot = be->f32_to_f16;
    else if (from == CH_F16 && to == CH_F32)
        slot = be->f16_to_f32;
    else
        return chi_error(CH_ERR_DTYPE, "%s: from %s to %s: expected f32 to bf16 or f16, or "
                         "bf16 or f16 to f32", fn, ch_dtype_name(from), ch_dtype_name(to));
    const char *name = from == CH_F32 ? (to == CH_BF16 ? "f32_to_bf16" : "f32_to_f16")
                                      : (from == CH_BF16 ? "bf16_to_f32" : "f16_to_f32");
    ON_HOST_IF(!slot, fn, y->dev, name, ch_cast(on_host[0], on_host[1]), FB_OUT(y), FB_IN(x));
    return slot(STREAM(y), y->numel, chi_mem(y), chi_mem(x));
}

/* ---- Optimizers ------------------------------------------------------------- */

static ch_status check_param_set(const char *fn, const ch_tensor *p, const char *const *names,
                                 const ch_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++) {
        if (ts[i]) {
            TRY(same_numel(fn, "p", p, names[i], ts[i]));
            TRY(no_alias(fn, "p", p, names[i], ts[i]));
        }
    }
    return CH_OK;
}

ch_status ch_sgd_step(ch_tensor *p, ch_tensor *m, const ch_tensor *g,
                      const ch_sgd_params *params, int first_step)
{
    static const char fn[] = "ch_sgd_step";
    if (!params)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    int has_m = params->momentum != 0.0f;
    arg args[] = {{"p", p, CH_F32, 0}, {"m", m, CH_F32, !has_m}, {"g", g, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_finite(fn, "params->lr", params->lr));
    TRY(check_finite(fn, "params->momentum", params->momentum));
    TRY(check_finite(fn, "params->dampening", params->dampening));
    TRY(check_finite(fn, "params->weight_decay", params->weight_decay));
    if (params->lr < 0 || params->momentum < 0 || params->weight_decay < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: lr %g, momentum %g, weight_decay %g: expected all >= 0", fn,
                         params->lr, params->momentum, params->weight_decay);
    if (params->nesterov && (!has_m || params->dampening != 0.0f))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: nesterov needs momentum > 0 and dampening 0 (got %g and %g)", fn,
                         params->momentum, params->dampening);
    const char *names[] = {"m", "g"};
    const ch_tensor *ts[] = {has_m ? m : NULL, g};
    TRY(check_param_set(fn, p, names, ts, 2));
    if (has_m)
        TRY(no_alias(fn, "m", m, "g", g));
    SLOT_OR_HOST(fn, p, sgd_step,
                 ch_sgd_step(on_host[0], on_host[1], on_host[2], params, first_step), FB_IO(p),
                 FB_IO(m), FB_IN(g));
    ch_bmem none = {NULL, 0};
    return BE(p)->sgd_step(STREAM(p), p->numel, chi_mem(p), has_m ? chi_mem(m) : none,
                           chi_mem(g), params, first_step != 0);
}

static ch_status adam_checks(const char *fn, ch_tensor *p, ch_tensor *m, ch_tensor *v,
                             const ch_tensor *g, const ch_adam_params *params)
{
    if (!params)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: params is NULL", fn);
    arg args[] = {{"p", p, CH_F32, 0}, {"m", m, CH_F32, 0}, {"v", v, CH_F32, 0},
                  {"g", g, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_finite(fn, "params->lr", params->lr));
    TRY(check_finite(fn, "params->weight_decay", params->weight_decay));
    TRY(check_finite(fn, "params->eps", params->eps));
    if (!(params->beta1 >= 0 && params->beta1 < 1 && params->beta2 >= 0 && params->beta2 < 1))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: params->beta1 %g and beta2 %g, expected both in [0, 1)", fn,
                         params->beta1, params->beta2);
    if (params->lr < 0 || params->weight_decay < 0 || params->eps <= 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: lr %g, weight_decay %g, eps %g: expected lr, weight_decay >= 0 "
                         "and eps > 0", fn, params->lr, params->weight_decay, params->eps);
    if (params->step < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: params->step is %lld, expected >= 1", fn,
                         (long long)params->step);
    const char *names[] = {"m", "v", "g"};
    const ch_tensor *ts[] = {m, v, g};
    TRY(check_param_set(fn, p, names, ts, 3));
    TRY(no_alias(fn, "m", m, "v", v));
    TRY(no_alias(fn, "m", m, "g", g));
    return no_alias(fn, "v", v, "g", g);
}

ch_status ch_adam_step(ch_tensor *p, ch_tensor *m, ch_tensor *v, const ch_tensor *g,
                       const ch_adam_params *params)
{
    static const char fn[] = "ch_adam_step";
    TRY(adam_checks(fn, p, m, v, g, params));
    SLOT_OR_HOST(fn, p, adam_step,
                 ch_adam_step(on_host[0], on_host[1], on_host[2], on_host[3], params), FB_IO(p),
                 FB_IO(m), FB_IO(v), FB_IN(g));
    return BE(p)->adam_step(STREAM(p), p->numel, chi_mem(p), chi_mem(m), chi_mem(v), chi_mem(g),
                            params);
}

int chi_adam_half_fused(const ch_tensor *p, const ch_tensor *ph)
{
    return p && ph && p->dev == ph->dev && BE(p)->adam_step_half && p->numel == ph->numel &&
           (ph->dtype == CH_BF16 || ph->dtype == CH_F16);
}

ch_status chi_adam_step_half(ch_tensor *p, ch_tensor *m, ch_tensor *v, const ch_tensor *g,
                             const ch_adam_params *params, ch_tensor *ph)
{
    static const char fn[] = "chi_adam_step_half";
    TRY(adam_checks(fn, p, m, v, g, params));
    if (!chi_adam_half_fused(p, ph))
        return chi_error(CH_ERR_UNSUPPORTED, "%s: %s", fn,
                         !ph ? "ph is NULL"
                         : !BE(p)->adam_step_half
                             ? "the backend does not round in its Adam step"
                             : "ph is not a bf16 or f16 tensor of p's size on p's device");
    TRY(no_alias(fn, "ph", ph, "p", p));
    TRY(no_alias(fn, "ph", ph, "m", m));
    TRY(no_alias(fn, "ph", ph, "v", v));
    TRY(no_alias(fn, "ph", ph, "g", g));
    return BE(p)->adam_step_half(STREAM(p), p->numel, chi_mem(p), chi_mem(m), chi_mem(v),
                                 chi_mem(g), params, ph->dtype, chi_mem(ph));
}

/* A range of memory that one of chi_adam_step_multi's parameters uses:
 * t[i]'s `what` (0 p, 1 m, 2 v, 3 g, 4 ph). */
typedef struct adam_range {
    const void *buf;
    size_t lo, hi;
    int i, what;
} adam_range;

static int adam_range_cmp(const void *a, const void *b)
{
    const adam_range *x = a, *y = b;
    if (x->buf != y->buf)
        return (uintptr_t)x->buf < (uintptr_t)y->buf ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* No memory two parameters share, but where both only read (gradients):
 * the ranges sorted, each against those that start before it ends. */
static ch_status adam_apart(const char *fn, int count, const chi_adam_tensors *t)
{
    static const char *const names[] = {"p", "m", "v", "g", "ph"};
    adam_range *r = malloc((size_t)count * 5 * sizeof *r);
    if (!r)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    size_t n = 0;
    for (int i = 0; i < count; i++) {
        const ch_tensor *ts[5] = {t[i].p, t[i].m, t[i].v, t[i].g, t[i].ph};
        for (int w = 0; w < 5; w++)
            if (ts[w])
                r[n++] = (adam_range){ts[w]->buf, ts[w]->off, ts[w]->off + ch_tensor_nbytes(ts[w]),
                                      i, w};
    }
    qsort(r, n, sizeof *r, adam_range_cmp);
    ch_status st = CH_OK;
    for (size_t a = 0; a < n && st == CH_OK; a++)
        for (size_t b = a + 1; b < n && r[b].buf == r[a].buf && r[b].lo < r[a].hi; b++)
            if (r[a].i != r[b].i && !(r[a].what == 3 && r[b].what == 3)) {
                st = chi_error(CH_ERR_INVALID_ARGUMENT,
                               "%s: parameter %d's %s overlaps parameter %d's %s in memory", fn,
                               r[a].i, names[r[a].what], r[b].i, names[r[b].what]);
                break;
            }
    free(r);
    return st;
}

ch_status chi_adam_step_one(const chi_adam_tensors *t, const ch_adam_params *params)
{
    return chi_adam_half_fused(t->p, t->ph)
               ? chi_adam_step_half(t->p, t->m, t->v, t->g, params, t->ph)
               : ch_adam_step(t->p, t->m, t->v, t->g, params);
}

ch_status chi_adam_step_multi(int count, const chi_adam_tensors *t, const ch_adam_params *params)
{
    static const char fn[] = "chi_adam_step_multi";
    if (count < 0 || (count > 0 && !t))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: count %d, t %s", fn, count,
                         t ? "given" : "NULL");
    for (int i = 0; i < count; i++) {
        TRY(adam_checks(fn, t[i].p, t[i].m, t[i].v, t[i].g, params));
        if (t[i].p->dev != t[0].p->dev)
            return chi_error(CH_ERR_DEVICE_MISMATCH, "%s: parameter %d is on %s, parameter 0 on %s",
                             fn, i, t[i].p->dev->id, t[0].p->dev->id);
        if (t[i].ph) {
            TRY(no_alias(fn, "ph", t[i].ph, "p", t[i].p));
            TRY(no_alias(fn, "ph", t[i].ph, "m", t[i].m));
            TRY(no_alias(fn, "ph", t[i].ph, "v", t[i].v));
            TRY(no_alias(fn, "ph", t[i].ph, "g", t[i].g));
        }
    }
    if (count == 0)
        return CH_OK;
    TRY(adam_apart(fn, count, t));
    if (!BE(t[0].p)->adam_step_multi) {
        for (int i = 0; i < count; i++)
            TRY(chi_adam_step_one(&t[i], params));
        return CH_OK;
    }
    ch_adam_segment *segs = malloc((size_t)count * sizeof *segs);
    if (!segs)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: out of memory", fn);
    for (int i = 0; i < count; i++) {
        int half = chi_adam_half_fused(t[i].p, t[i].ph);
        segs[i] = (ch_adam_segment){t[i].p->numel,
                                    chi_mem(t[i].p),
                                    chi_mem(t[i].m),
                                    chi_mem(t[i].v),
                                    chi_mem(t[i].g),
                                    half ? chi_mem(t[i].ph) : (ch_bmem){NULL, 0},
                                    half ? t[i].ph->dtype : CH_F32};
    }
    ch_status st = BE(t[0].p)->adam_step_multi(STREAM(t[0].p), count, segs, params);
    free(segs);
    return st;
}

/* ---- Random numbers --------------------------------------------------------- */

static ch_status rand_op(const char *fn, ch_rand_kind kind, ch_tensor *y, uint64_t seed,
                         uint64_t offset, const char *an, float a, const char *bn, float b)
{
    arg args[] = {{"y", y, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(check_finite(fn, an, a));
    TRY(check_finite(fn, bn, b));
    SLOT_OR_HOST(fn, y, rand, rand_op(fn, kind, on_host[0], seed, offset, an, a, bn, b), FB_OUT(y));
    return BE(y)->rand(STREAM(y), kind, y->numel, chi_mem(y), seed, offset, a, b);
}

ch_status ch_rand_uniform(ch_tensor *y, uint64_t seed, uint64_t offset, float lo, float hi)
{
    if (lo > hi)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_rand_uniform: lo %g is above hi %g", lo, hi);
    return rand_op("ch_rand_uniform", CH_RAND_UNIFORM, y, seed, offset, "lo", lo, "hi", hi);
}

ch_status ch_rand_normal(ch_tensor *y, uint64_t seed, uint64_t offset, float mean, float std)
{
    if (std < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_rand_normal: std %g, expected >= 0", std);
    return rand_op("ch_rand_normal", CH_RAND_NORMAL, y, seed, offset, "mean", mean, "std", std);
}

ch_status ch_dropout_mask(ch_tensor *y, uint64_t seed, uint64_t offset, float p)
{
    if (!(p >= 0 && p < 1))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dropout_mask: p %g, expected 0 <= p < 1", p);
    return rand_op("ch_dropout_mask", CH_RAND_DROPOUT, y, seed, offset, "p", p, "p", 0.0f);
}
