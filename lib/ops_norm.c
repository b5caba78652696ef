/* Dispatch of the normalisation ops (LayerNorm, BatchNorm in its steps):
 * every argument checked here, as lib/ops.c does for the others. Outputs
 * never share memory with another argument, except where ops.h allows in
 * place (ch_batchnorm_forward's y over x, ch_add_layernorm's sum over a or
 * b, ch_layernorm_backward_add's dx over dres: the same elements in the
 * same dtype, read before written), so that no slot depends on the
 * order in which it reads and writes. Each op lists its arguments once,
 * outputs first: a[0..nouts) are the outputs, the rest the inputs. */
#include "config.h"

#include "opcheck.h"

/* The memory of an optional tensor; ptr NULL when absent. */
static ch_bmem mem_or_none(const ch_tensor *t)
{
    return t ? chi_mem(t) : (ch_bmem){NULL, 0};
}

/* Each present output a[i], i < nouts, against every other argument;
 * a[skip] (-1: none) is left to the caller. */
static ch_status outputs_apart(const char *fn, const arg *a, int n, int nouts, int skip)
{
    for (int i = 0; i < nouts; i++) {
        if (!a[i].t)
            continue;
        for (int j = i + 1; j < n; j++)
            if (j != skip)
                TRY(no_alias(fn, a[i].name, a[i].t, a[j].name, a[j].t));
    }
    return CH_OK;
}

/* `t` (when present) has `want` elements, `what` saying why. */
static ch_status numel_is(const char *fn, const char *name, const ch_tensor *t, int64_t want,
                          const char *what)
{
    if (t && t->numel != want)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %lld elements, expected %lld (%s)", fn, name,
                         (long long)t->numel, (long long)want, what);
    return CH_OK;
}

static ch_status check_eps(const char *fn, float eps)
{
    TRY(check_finite(fn, "eps", eps));
    if (eps < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: eps %g, expected >= 0", fn, eps);
    return CH_OK;
}

/* ---- LayerNorm ---------------------------------------------------------- */

/* rows and D of x; a[i] for i in rowwise are [rows], in featurewise [D]
 * (index lists ending with -1). */
static ch_status layernorm_shapes(const char *fn, const ch_tensor *x, const arg *a,
                                  const int *rowwise, const int *featurewise, int64_t *rows,
                                  int64_t *d)
{
    *d = x->shape[x->ndim - 1];
    *rows = x->numel / *d;
    for (const int *i = rowwise; *i >= 0; i++)
        TRY(numel_is(fn, a[*i].name, a[*i].t, *rows, "one per row of x"));
    for (const int *i = featurewise; *i >= 0; i++)
        TRY(numel_is(fn, a[*i].name, a[*i].t, *d, "x's last dimension"));
    return CH_OK;
}

static ch_status layernorm_f32(const void *c, ch_tensor *const *t)
{
    return ch_layernorm(t[0], t[1], t[2], t[3], t[4], t[5], *(const float *)c);
}

ch_status ch_layernorm(ch_tensor *y, ch_tensor *mean, ch_tensor *rstd, const ch_tensor *x,
                       const ch_tensor *gamma, const ch_tensor *beta, float eps)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_OUT, CHI_HALF_OUT,
                                CHI_HALF_IN,  CHI_HALF_IN,  CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, layernorm_f32, &eps, y, mean, rstd, CHI_T(x), CHI_T(gamma),
                   CHI_T(beta));
    static const char fn[] = "ch_layernorm";
    arg a[] = {{"y", y, CH_F32, 0},         {"mean", mean, CH_F32, 0},
               {"rstd", rstd, CH_F32, 0},   {"x", x, CH_F32, 0},
               {"gamma", gamma, CH_F32, 0}, {"beta", beta, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(check_eps(fn, eps));
    TRY(same_numel(fn, "y", y, "x", x));
    int64_t rows, d;
    TRY(layernorm_shapes(fn, x, a, (const int[]){1, 2, -1}, (const int[]){4, 5, -1}, &rows,
                         &d));
    TRY(outputs_apart(fn, a, NARGS(a), 3, -1));
    SLOT_OR_HOST(
        fn, y, layernorm,
        ch_layernorm(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4], on_host[5], eps),
        FB_OUT(y), FB_OUT(mean), FB_OUT(rstd), FB_IN(x), FB_IN(gamma), FB_IN(beta));
    return BE(y)->layernorm(STREAM(y), rows, d, eps, chi_mem(y), chi_mem(mean), chi_mem(rstd),
                            chi_mem(x), chi_mem(gamma), chi_mem(beta));
}

static ch_status layernorm_backward_f32(const void *c, ch_tensor *const *t)
{
    (void)c;
    return ch_layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}

ch_status ch_layernorm_backward(ch_tensor *dx, ch_tensor *dgamma, ch_tensor *dbeta,
                                const ch_tensor *dy, const ch_tensor *x, const ch_tensor *mean,
                                const ch_tensor *rstd, const ch_tensor *gamma)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_IO,      CHI_IO,      CHI_HALF_IN,
                                CHI_HALF_IN,  CHI_HALF_IN, CHI_HALF_IN, CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, layernorm_backward_f32, NULL, dx, dgamma, dbeta, CHI_T(dy), CHI_T(x),
                   CHI_T(mean), CHI_T(rstd), CHI_T(gamma));
    static const char fn[] = "ch_layernorm_backward";
    arg a[] = {{"dx", dx, CH_F32, 1},     {"dgamma", dgamma, CH_F32, 0},
               {"dbeta", dbeta, CH_F32, 0}, {"dy", dy, CH_F32, 0},
               {"x", x, CH_F32, 0},       {"mean", mean, CH_F32, 0},
               {"rstd", rstd, CH_F32, 0}, {"gamma", gamma, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(same_numel(fn, "dy", dy, "x", x));
    if (dx)
        TRY(same_numel(fn, "dx", dx, "x", x));
    int64_t rows, d;
    TRY(layernorm_shapes(fn, x, a, (const int[]){5, 6, -1}, (const int[]){1, 2, 7, -1}, &rows,
                         &d));
    TRY(outputs_apart(fn, a, NARGS(a), 3, -1));
    SLOT_OR_HOST(fn, dgamma, layernorm_backward,
                 ch_layernorm_backward(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4],
                                       on_host[5], on_host[6], on_host[7]),
                 FB_OUT(dx), FB_IO(dgamma), FB_IO(dbeta), FB_IN(dy), FB_IN(x), FB_IN(mean),
                 FB_IN(rstd), FB_IN(gamma));
    return BE(dgamma)->layernorm_backward(STREAM(dgamma), rows, d, mem_or_none(dx),
                                          chi_mem(dgamma), chi_mem(dbeta), chi_mem(dy),
                                          chi_mem(x), chi_mem(mean), chi_mem(rstd),
                                          chi_mem(gamma));
}

/* ---- The residual stream's add beside LayerNorm ------------------------- */

/* The half-capable tensors a[i], i in `which` (ending with -1), when
 * present: f32, bf16 or f16. */
static ch_status float_formats(const char *fn, const arg *a, const int *which)
{
    for (const int *i = which; *i >= 0; i++) {
        const ch_tensor *t = a[*i].t;
        if (t && t->dtype != CH_F32 && t->dtype != CH_BF16 && t->dtype != CH_F16)
            return chi_error(CH_ERR_DTYPE, "%s: %s is %s, expected f32, bf16 or f16", fn,
                             a[*i].name, ch_dtype_name(t->dtype));
    }
    return CH_OK;
}

/* An output that may be the input x itself (in place: the same elements
 * in the same dtype), or apart from it, but nothing between. */
static ch_status in_place_or_apart(const char *fn, const char *yn, const ch_tensor *y,
                                   const char *xn, const ch_tensor *x)
{
    if (x && overlaps(y, x) && !(y->off == x->off && y->numel == x->numel && y->dtype == x->dtype))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s partly overlaps %s in memory", fn, yn,
                         xn);
    return CH_OK;
}

ch_status ch_add_layernorm(ch_tensor *sum, ch_tensor *y, ch_tensor *mean, ch_tensor *rstd,
                           const ch_tensor *a, const ch_tensor *b, const ch_tensor *gamma,
                           const ch_tensor *beta, float eps)
{
    static const char fn[] = "ch_add_layernorm";
    arg args[] = {{"sum", sum, ANY, 0},        {"y", y, ANY, 0},         {"mean", mean, CH_F32, 0},
                  {"rstd", rstd, CH_F32, 0},   {"a", a, ANY, 0},         {"b", b, ANY, 0},
                  {"gamma", gamma, CH_F32, 0}, {"beta", beta, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(float_formats(fn, args, (const int[]){0, 1, 4, 5, -1}));
    TRY(check_eps(fn, eps));
    TRY(same_numel(fn, "sum", sum, "a", a));
    TRY(same_numel(fn, "sum", sum, "b", b));
    TRY(same_numel(fn, "y", y, "sum", sum));
    int64_t rows, d;
    TRY(layernorm_shapes(fn, sum, args, (const int[]){2, 3, -1}, (const int[]){6, 7, -1}, &rows,
                         &d));
    /* sum apart from everything but a and b, which it may be; the other
     * outputs apart from everything. */
    for (int j = 1; j < NARGS(args); j++)
        if (j != 4 && j != 5)
            TRY(no_alias(fn, "sum", sum, args[j].name, args[j].t));
    TRY(in_place_or_apart(fn, "sum", sum, "a", a));
    TRY(in_place_or_apart(fn, "sum", sum, "b", b));
    TRY(outputs_apart(fn, args + 1, NARGS(args) - 1, 3, -1));
    const ch_backend_i *be = BE(sum);
    if (be->add_layernorm) {
        ch_status st =
            be->add_layernorm(STREAM(sum), rows, d, eps, sum->dtype, y->dtype, a->dtype, b->dtype,
                              chi_mem(sum), chi_mem(y), chi_mem(mean), chi_mem(rstd), chi_mem(a),
                              chi_mem(b), chi_mem(gamma), chi_mem(beta));
        if (st != CH_ERR_UNSUPPORTED)
            return st;
    }
    /* The composed op, every backend's. */
    TRY(ch_add(sum, a, b));
    return ch_layernorm(y, mean, rstd, sum, gamma, beta, eps);
}

/* ch_layernorm_backward_add composed: LayerNorm's dx in f32 (into dx
 * itself where that is f32 and dres is not read from it), then dres
 * added (or the f32 dx rounded into dx). */
static ch_status layernorm_backward_add_composed(ch_tensor *dx, ch_tensor *dgamma, ch_tensor *dbeta,
                                                 const ch_tensor *dy, const ch_tensor *dres,
                                                 const ch_tensor *x, const ch_tensor *mean,
                                                 const ch_tensor *rstd, const ch_tensor *gamma)
{
    if (dx->dtype == CH_F32 && (!dres || !overlaps(dx, dres))) {
        TRY(ch_layernorm_backward(dx, dgamma, dbeta, dy, x, mean, rstd, gamma));
        return dres ? ch_add(dx, dx, dres) : CH_OK;
    }
    ch_tensor *tmp = NULL;
    TRY(ch_tensor_new(&tmp, dx->dev, CH_F32, x->ndim, x->shape));
    ch_status st = ch_layernorm_backward(tmp, dgamma, dbeta, dy, x, mean, rstd, gamma);
    if (st == CH_OK)
        st = dres ? ch_add(dx, tmp, dres) : ch_cast(dx, tmp);
    ch_tensor_free(tmp);
    return st;
}

ch_status ch_layernorm_backward_add(ch_tensor *dx, ch_tensor *dgamma, ch_tensor *dbeta,
                                    const ch_tensor *dy, const ch_tensor *dres, const ch_tensor *x,
                                    const ch_tensor *mean, const ch_tensor *rstd,
                                    const ch_tensor *gamma)
{
    static const char fn[] = "ch_layernorm_backward_add";
    arg a[] = {
        {"dx", dx, ANY, 0},        {"dgamma", dgamma, CH_F32, 0}, {"dbeta", dbeta, CH_F32, 0},
        {"dy", dy, ANY, 0},        {"dres", dres, ANY, 1},        {"x", x, ANY, 0},
        {"mean", mean, CH_F32, 0}, {"rstd", rstd, CH_F32, 0},     {"gamma", gamma, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(float_formats(fn, a, (const int[]){0, 3, 4, 5, -1}));
    TRY(same_numel(fn, "dy", dy, "x", x));
    TRY(same_numel(fn, "dx", dx, "x", x));
    if (dres)
        TRY(same_numel(fn, "dres", dres, "x", x));
    int64_t rows, d;
    TRY(layernorm_shapes(fn, x, a, (const int[]){6, 7, -1}, (const int[]){1, 2, 8, -1}, &rows, &d));
    /* dx may be dres; no other output shares memory with anything. */
    TRY(outputs_apart(fn, a, NARGS(a), 3, 4));
    TRY(in_place_or_apart(fn, "dx", dx, "dres", dres));
    TRY(no_alias(fn, "dgamma", dgamma, "dres", dres));
    TRY(no_alias(fn, "dbeta", dbeta, "dres", dres));
    const ch_backend_i *be = BE(dx);
    if (be->layernorm_backward_add) {
        ch_status st = be->layernorm_backward_add(
            STREAM(dx), rows, d, dx->dtype, dy->dtype, dres ? dres->dtype : CH_F32, x->dtype,
            chi_mem(dx), chi_mem(dgamma), chi_mem(dbeta), chi_mem(dy), mem_or_none(dres),
            chi_mem(x), chi_mem(mean), chi_mem(rstd), chi_mem(gamma));
        if (st != CH_ERR_UNSUPPORTED)
            return st;
    }
    return layernorm_backward_add_composed(dx, dgamma, dbeta, dy, dres, x, mean, rstd, gamma);
}

/* ---- BatchNorm ---------------------------------------------------------- */

/* x [N, C, ...] as [outer, c, inner]. */
static ch_status channels_of(const char *fn, const char *xn, const ch_tensor *x,
                             int64_t *outer, int64_t *c, int64_t *inner)
{
    if (x->ndim < 2)
        return chi_error(CH_ERR_SHAPE,
                         "%s: %s has %d dimension, expected at least 2 ([N, C, ...])", fn, xn,
                         x->ndim);
    split_at(x, 1, outer, c, inner);
    return CH_OK;
}

/* a[i] (when present) has `count` elements, for i in the list (ending
 * with -1): one per channel, or the 2C + 1 of a sums vector. */
static ch_status numels_are(const char *fn, const arg *a, const int *which, int64_t count,
                            const char *what)
{
    for (const int *i = which; *i >= 0; i++)
        TRY(numel_is(fn, a[*i].name, a[*i].t, count, what));
    return CH_OK;
}

static ch_status channel_sums_f32(const void *c, ch_tensor *const *t)
{
    (void)c;
    return ch_channel_sums(t[0], t[1], t[2], t[3], t[4]);
}

ch_status ch_channel_sums(ch_tensor *sums, const ch_tensor *a, const ch_tensor *a_center,
                          const ch_tensor *b, const ch_tensor *b_center)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN, CHI_HALF_IN, CHI_HALF_IN,
                                CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, channel_sums_f32, NULL, sums, CHI_T(a), CHI_T(a_center), CHI_T(b),
                   CHI_T(b_center));
    static const char fn[] = "ch_channel_sums";
    arg args[] = {{"sums", sums, CH_F32, 0}, {"a", a, CH_F32, 0},
                  {"a_center", a_center, CH_F32, 1}, {"b", b, CH_F32, 0},
                  {"b_center", b_center, CH_F32, 1}};
    TRY(check_args(fn, args, NARGS(args)));
    int64_t outer, c, inner;
    TRY(channels_of(fn, "a", a, &outer, &c, &inner));
    TRY(same_shape(fn, "a", a, "b", b));
    TRY(numel_is(fn, "sums", sums, 2 * c + 1, "2C + 1"));
    TRY(numels_are(fn, args, (const int[]){2, 4, -1}, c, "one per channel of a"));
    TRY(outputs_apart(fn, args, NARGS(args), 1, -1));
    SLOT_OR_HOST(fn, sums, channel_sums,
                 ch_channel_sums(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4]),
                 FB_OUT(sums), FB_IN(a), FB_IN(a_center), FB_IN(b), FB_IN(b_center));
    return BE(sums)->channel_sums(STREAM(sums), outer, c, inner, chi_mem(sums), chi_mem(a),
                                  mem_or_none(a_center), chi_mem(b), mem_or_none(b_center));
}

/* Which of the optional arguments ch_batchnorm_stats may be given
 * together. */
static ch_status stats_mode(const char *fn, const ch_tensor *running_mean,
                            const ch_tensor *running_var, const ch_tensor *sums,
                            const ch_tensor *center)
{
    if (!running_mean != !running_var)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: %s is NULL but %s is not: give both running statistics or "
                         "neither",
                         fn, running_mean ? "running_var" : "running_mean",
                         running_mean ? "running_mean" : "running_var");
    if (!sums && !running_mean)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: sums is NULL (evaluation) and so are running_mean and "
                         "running_var, which evaluation reads",
                         fn);
    if (!sums && center)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: center is given but sums is NULL: a centre belongs to sums", fn);
    return CH_OK;
}

ch_status ch_batchnorm_stats(ch_tensor *mean, ch_tensor *rstd, ch_tensor *running_mean,
                             ch_tensor *running_var, const ch_tensor *sums,
                             const ch_tensor *center, float momentum, float eps)
{
    static const char fn[] = "ch_batchnorm_stats";
    arg a[] = {{"mean", mean, CH_F32, 0},
               {"rstd", rstd, CH_F32, 0},
               {"running_mean", running_mean, CH_F32, 1},
               {"running_var", running_var, CH_F32, 1},
               {"sums", sums, CH_F32, 1},
               {"center", center, CH_F32, 1}};
    TRY(check_args(fn, a, NARGS(a)));
    TRY(stats_mode(fn, running_mean, running_var, sums, center));
    TRY(check_finite(fn, "momentum", momentum));
    if (momentum < 0 || momentum > 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: momentum %g, expected 0 to 1", fn,
                         momentum);
    TRY(check_eps(fn, eps));
    int64_t c = mean->numel;
    TRY(numels_are(fn, a, (const int[]){1, 2, 3, 5, -1}, c, "one per channel, as mean"));
    TRY(numel_is(fn, "sums", sums, 2 * c + 1, "2C + 1, C the elements of mean"));
    TRY(outputs_apart(fn, a, NARGS(a), 4, -1));
    SLOT_OR_HOST(fn, mean, batchnorm_stats,
                 ch_batchnorm_stats(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4],
                                    on_host[5], momentum, eps),
                 FB_OUT(mean), FB_OUT(rstd), FB_IO(running_mean), FB_IO(running_var), FB_IN(sums),
                 FB_IN(center));
    return BE(mean)->batchnorm_stats(STREAM(mean), c, momentum, eps, chi_mem(mean),
                                     chi_mem(rstd), mem_or_none(running_mean),
                                     mem_or_none(running_var), mem_or_none(sums),
                                     mem_or_none(center));
}

static ch_status batchnorm_forward_f32(const void *c, ch_tensor *const *t)
{
    (void)c;
    return ch_batchnorm_forward(t[0], t[1], t[2], t[3], t[4], t[5]);
}

ch_status ch_batchnorm_forward(ch_tensor *y, const ch_tensor *x, const ch_tensor *mean,
                               const ch_tensor *rstd, const ch_tensor *gamma,
                               const ch_tensor *beta)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_HALF_IN, CHI_HALF_IN,
                                CHI_HALF_IN,  CHI_HALF_IN, CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, batchnorm_forward_f32, NULL, y, CHI_T(x), CHI_T(mean), CHI_T(rstd),
                   CHI_T(gamma), CHI_T(beta));
    static const char fn[] = "ch_batchnorm_forward";
    arg a[] = {{"y", y, CH_F32, 0},       {"x", x, CH_F32, 0},
               {"mean", mean, CH_F32, 0}, {"rstd", rstd, CH_F32, 0},
               {"gamma", gamma, CH_F32, 0}, {"beta", beta, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    int64_t outer, c, inner;
    TRY(channels_of(fn, "x", x, &outer, &c, &inner));
    TRY(same_numel(fn, "y", y, "x", x));
    TRY(numels_are(fn, a, (const int[]){2, 3, 4, 5, -1}, c, "one per channel of x"));
    TRY(same_or_apart(fn, "y", y, "x", x));
    TRY(outputs_apart(fn, a, NARGS(a), 1, 1));
    SLOT_OR_HOST(fn, y, batchnorm_forward,
                 ch_batchnorm_forward(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4],
                                      on_host[5]),
                 FB_OUT(y), FB_IN(x), FB_IN(mean), FB_IN(rstd), FB_IN(gamma), FB_IN(beta));
    return BE(y)->batchnorm_forward(STREAM(y), outer, c, inner, chi_mem(y), chi_mem(x),
                                    chi_mem(mean), chi_mem(rstd), chi_mem(gamma),
                                    chi_mem(beta));
}

static ch_status batchnorm_backward_f32(const void *c, ch_tensor *const *t)
{
    (void)c;
    return ch_batchnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9]);
}

ch_status ch_batchnorm_backward(ch_tensor *dx, ch_tensor *dgamma, ch_tensor *dbeta,
                                const ch_tensor *dy, const ch_tensor *x, const ch_tensor *mean,
                                const ch_tensor *rstd, const ch_tensor *gamma,
                                const ch_tensor *local, const ch_tensor *total)
{
    static const int roles[] = {CHI_HALF_OUT, CHI_IO,      CHI_IO,      CHI_HALF_IN,
                                CHI_HALF_IN,  CHI_HALF_IN, CHI_HALF_IN, CHI_HALF_IN,
                                CHI_HALF_IN,  CHI_HALF_IN};
    CHI_HALF_ENTRY(roles, batchnorm_backward_f32, NULL, dx, dgamma, dbeta, CHI_T(dy), CHI_T(x),
                   CHI_T(mean), CHI_T(rstd), CHI_T(gamma), CHI_T(local), CHI_T(total));
    static const char fn[] = "ch_batchnorm_backward";
    arg a[] = {{"dx", dx, CH_F32, 1},       {"dgamma", dgamma, CH_F32, 0},
               {"dbeta", dbeta, CH_F32, 0}, {"dy", dy, CH_F32, 0},
               {"x", x, CH_F32, 0},         {"mean", mean, CH_F32, 0},
               {"rstd", rstd, CH_F32, 0},   {"gamma", gamma, CH_F32, 0},
               {"local", local, CH_F32, 0}, {"total", total, CH_F32, 0}};
    TRY(check_args(fn, a, NARGS(a)));
    int64_t outer, c, inner;
    TRY(channels_of(fn, "x", x, &outer, &c, &inner));
    TRY(same_numel(fn, "dy", dy, "x", x));
    if (dx)
        TRY(same_numel(fn, "dx", dx, "x", x));
    TRY(numels_are(fn, a, (const int[]){1, 2, 5, 6, 7, -1}, c, "one per channel of x"));
    TRY(numels_are(fn, a, (const int[]){8, 9, -1}, 2 * c + 1, "2C + 1 channel sums"));
    TRY(outputs_apart(fn, a, NARGS(a), 3, -1));
    SLOT_OR_HOST(fn, dgamma, batchnorm_backward,
                 ch_batchnorm_backward(on_host[0], on_host[1], on_host[2], on_host[3], on_host[4],
                                       on_host[5], on_host[6], on_host[7], on_host[8], on_host[9]),
                 FB_OUT(dx), FB_IO(dgamma), FB_IO(dbeta), FB_IN(dy), FB_IN(x), FB_IN(mean),
                 FB_IN(rstd), FB_IN(gamma), FB_IN(local), FB_IN(total));
    return BE(dgamma)->batchnorm_backward(STREAM(dgamma), outer, c, inner, mem_or_none(dx),
                                          chi_mem(dgamma), chi_mem(dbeta), chi_mem(dy),
                                          chi_mem(x), chi_mem(mean), chi_mem(rstd),
                                          chi_mem(gamma), chi_mem(local), chi_mem(total));
}
