/* The argument checks every op runs before its backend sees anything
 * (lib/ops*.c): shared so that each family of ops can live in a file of
 * its own. */
#ifndef CHORUS_LIB_OPCHECK_H
#define CHORUS_LIB_OPCHECK_H

#include <math.h>

#include "core.h"

/* One tensor argument of an op: NULL is allowed only when `optional`. */
typedef struct arg {
    const char *name;
    const ch_tensor *t;
    int dtype;    /* a ch_dtype, or ANY */
    int optional;
} arg;

#define ANY (-1)
#define NARGS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* NULLs, dtypes, and every tensor on the device of the first. */
static inline ch_status check_args(const char *fn, const arg *a, int n)
{
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "%s: call ch_init first", fn);
    const ch_tensor *first = NULL;
    const char *first_name = NULL;
    for (int i = 0; i < n; i++) {
        if (!a[i].t) {
            if (a[i].optional)
                continue;
            return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn, a[i].name);
        }
        if (a[i].dtype != ANY && a[i].t->dtype != (ch_dtype)a[i].dtype)
            return chi_error(CH_ERR_DTYPE, "%s: %s is %s, expected %s", fn, a[i].name,
                             ch_dtype_name(a[i].t->dtype), ch_dtype_name((ch_dtype)a[i].dtype));
        if (!first) {
            first = a[i].t;
            first_name = a[i].name;
        } else if (a[i].t->dev != first->dev) {
            return chi_error(CH_ERR_DEVICE_MISMATCH, "%s: %s is on %s but %s is on %s", fn,
                             a[i].name, a[i].t->dev->id, first_name, first->dev->id);
        }
    }
    return CH_OK;
}

static inline ch_status same_numel(const char *fn, const char *yn, const ch_tensor *y, const char *xn,
                            const ch_tensor *x)
{
    if (y->numel != x->numel)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %lld elements but %s has %lld", fn, yn,
                         (long long)y->numel, xn, (long long)x->numel);
    return CH_OK;
}

static inline ch_status same_shape(const char *fn, const char *an, const ch_tensor *a,
                                   const char *bn, const ch_tensor *b)
{
    int same = a->ndim == b->ndim;
    for (int i = 0; same && i < a->ndim; i++)
        same = a->shape[i] == b->shape[i];
    if (!same)
        return chi_error(CH_ERR_SHAPE, "%s: %s and %s have different shapes", fn, an, bn);
    return CH_OK;
}

/* A view of a tensor an op only reads (reshape takes one it could write);
 * the caller frees it. */
static inline ch_status read_view(ch_tensor **out, const ch_tensor *t, int ndim,
                                  const int64_t *shape)
{
    return ch_tensor_reshape(out, (ch_tensor *)t, ndim, shape);
}

static inline int overlaps(const ch_tensor *a, const ch_tensor *b)
{
    if (a->buf != b->buf)
        return 0;
    size_t a_end = a->off + ch_tensor_nbytes(a), b_end = b->off + ch_tensor_nbytes(b);
    return a->off < b_end && b->off < a_end;
}

/* Outputs that must not share memory with an input (GEMM, im2col, ...). */
static inline ch_status no_alias(const char *fn, const char *yn, const ch_tensor *y, const char *xn,
                          const ch_tensor *x)
{
    if (x && overlaps(y, x))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s overlaps %s in memory", fn, yn, xn);
    return CH_OK;
}

/* In place is allowed (the same memory), partial overlap is not. */
static inline ch_status same_or_apart(const char *fn, const char *yn, const ch_tensor *y,
                               const char *xn, const ch_tensor *x)
{
    if (x && overlaps(y, x) && !(y->off == x->off && y->numel == x->numel))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s partly overlaps %s in memory", fn,
                         yn, xn);
    return CH_OK;
}

static inline ch_status check_finite(const char *fn, const char *name, double v)
{
    if (!isfinite(v))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is %g, expected a finite number", fn,
                         name, v);
    return CH_OK;
}

/* Resolve a possibly negative axis. */
static inline ch_status check_axis(const char *fn, const ch_tensor *x, int *axis)
{
    int a = *axis < 0 ? *axis + x->ndim : *axis;
    if (a < 0 || a >= x->ndim)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: axis %d out of range for %d dimensions",
                         fn, *axis, x->ndim);
    *axis = a;
    return CH_OK;
}

static inline void split_at(const ch_tensor *x, int axis, int64_t *outer, int64_t *n, int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < axis; i++)
        *outer *= x->shape[i];
    for (int i = axis + 1; i < x->ndim; i++)
        *inner *= x->shape[i];
    *n = x->shape[axis];
}

#define BE(t) ((t)->dev->be->iface)
#define STREAM(t) chi_current_stream((t)->dev)
/* One tensor of an op that runs on the host (lib/ops_fallback.c): the
 * tensor (may be NULL) and what the op does with it. An output that the op
 * reads (an optimizer's state, a gradient it adds to, beta != 0) is FB_IO,
 * so that its values are downloaded first. */
/* clang-format off */
#define FB_IN(t) {CHI_T(t), CHI_HALF_IN}
#define FB_OUT(t) {CHI_T(t), CHI_HALF_OUT}
#define FB_IO(t) {CHI_T(t), CHI_IO}
/* clang-format on */
/* An output read when `reads` holds (axpby's y with beta != 0). */
/* clang-format off */
#define FB_OUT_READ_IF(t, reads) {CHI_T(t), (reads) ? CHI_IO : CHI_HALF_OUT}
/* clang-format on */

/* A backend may leave an op slot NULL (lib/backend.h): the op then runs on
 * the host backend. The tensors after `call` are staged in host tensors,
 * on_host[0], on_host[1], ... in their order, and `call` runs the same op
 * on those (it names them), so that the host's checks and slot do the
 * work; then the outputs go back and the op returns. */
/* clang-format off */
#define SLOT_OR_HOST(fn, t, slot, call, ...)                                                  \
    ON_HOST_IF(!BE(t)->slot, fn, (t)->dev, #slot, call, __VA_ARGS__)
/* clang-format on */
/* The same for a slot chosen at run time (ch_cast's conversions): when
 * `missing`, `call` on the host, `slot` naming the slot in the note. */
/* clang-format off */
#define ON_HOST_IF(missing, fn, dev, slot, call, ...)                                         \
    do {                                                                                      \
        if (missing) {                                                                        \
            const chi_staged staged_[] = {__VA_ARGS__};                                       \
            ch_tensor *on_host[NARGS(staged_)];                                               \
            ch_status fb_ = chi_fallback_stage(fn, slot, dev, staged_, NARGS(staged_),        \
                                               on_host);                                      \
            if (fb_ == CH_OK)                                                                 \
                fb_ = (call);                                                                 \
            return chi_fallback_finish(fb_, staged_, NARGS(staged_), on_host);                \
        }                                                                                     \
    } while (0)
/* clang-format on */

#endif
