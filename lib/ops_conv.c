/* Op dispatch for convolution (im2col, col2im, the 2-D convolution and its
 * gradients, composed from im2col, GEMM and transpose01 where a backend has
 * no convolution of its own) and max pooling, which shares its geometry.
 * The checks are lib/ops.c's, from lib/opcheck.h. */
#include "config.h"

#include "opcheck.h"

/* ---- Convolution and pooling ---------------------------------------------- */

/* Fill the geometry from an [N, C, H, W] tensor and a window. */
static ch_status conv_geom(const char *fn, const char *xn, const ch_tensor *x, const ch_window2d *w,
                           ch_conv_geom *g)
{
    if (!w)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: w is NULL", fn);
    if (x->ndim != 4)
        return chi_error(CH_ERR_SHAPE, "%s: %s has %d dimensions, expected 4 ([N, C, H, W])", fn,
                         xn, x->ndim);
    if (w->kh < 1 || w->kw < 1 || w->sh < 1 || w->sw < 1 || w->ph < 0 || w->pw < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: window %dx%d stride %dx%d padding %dx%d, expected window and "
                         "stride >= 1, padding >= 0",
                         fn, w->kh, w->kw, w->sh, w->sw, w->ph, w->pw);
    *g = (ch_conv_geom){.n = x->shape[0],
                        .c = x->shape[1],
                        .h = x->shape[2],
                        .w = x->shape[3],
                        .kh = w->kh,
                        .kw = w->kw,
                        .sh = w->sh,
                        .sw = w->sw,
                        .ph = w->ph,
                        .pw = w->pw};
    if (g->h + 2 * g->ph < g->kh || g->w + 2 * g->pw < g->kw)
        return chi_error(CH_ERR_SHAPE,
                         "%s: window %dx%d is larger than the padded %s plane %lldx%lld", fn, w->kh,
                         w->kw, xn, (long long)(g->h + 2 * g->ph), (long long)(g->w + 2 * g->pw));
    g->oh = (g->h + 2 * g->ph - g->kh) / g->sh + 1;
    g->ow = (g->w + 2 * g->pw - g->kw) / g->sw + 1;
    return CH_OK;
}

static ch_status check_col(const char *fn, const char *cn, const ch_tensor *col,
                           const ch_conv_geom *g)
{
    int64_t rows = g->c * g->kh * g->kw, cols = g->n * g->oh * g->ow;
    if (col->ndim != 2 || col->shape[0] != rows || col->shape[1] != cols)
        return chi_error(CH_ERR_SHAPE, "%s: %s must be [%lld, %lld] (C*kh*kw, N*OH*OW)", fn, cn,
                         (long long)rows, (long long)cols);
    return CH_OK;
}

ch_status ch_im2col(ch_tensor *col, const ch_tensor *x, const ch_window2d *w)
{
    static const char fn[] = "ch_im2col";
    arg args[] = {{"col", col, CH_F32, 0}, {"x", x, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    ch_conv_geom g;
    TRY(conv_geom(fn, "x", x, w, &g));
    TRY(check_col(fn, "col", col, &g));
    TRY(no_alias(fn, "col", col, "x", x));
    SLOT_OR_HOST(fn, col, im2col, ch_im2col(on_host[0], on_host[1], w), FB_OUT(col), FB_IN(x));
    return BE(col)->im2col(STREAM(col), &g, chi_mem(col), chi_mem(x));
}

ch_status ch_col2im(ch_tensor *dx, const ch_tensor *col, const ch_window2d *w)
{
    static const char fn[] = "ch_col2im";
    arg args[] = {{"dx", dx, CH_F32, 0}, {"col", col, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    ch_conv_geom g;
    TRY(conv_geom(fn, "dx", dx, w, &g));
    TRY(check_col(fn, "col", col, &g));
    TRY(no_alias(fn, "dx", dx, "col", col));
    SLOT_OR_HOST(fn, dx, col2im, ch_col2im(on_host[0], on_host[1], w), FB_OUT(dx), FB_IN(col));
    return BE(dx)->col2im(STREAM(dx), &g, chi_mem(dx), chi_mem(col));
}

/* w [O, C, kh, kw] for x's channels and the window; y (or dy) [N, O, OH, OW]. */
static ch_status check_conv(const char *fn, const ch_tensor *w, const char *yn, const ch_tensor *y,
                            const ch_conv_geom *g)
{
    if (w->ndim != 4 || w->shape[1] != g->c || w->shape[2] != g->kh || w->shape[3] != g->kw)
        return chi_error(CH_ERR_SHAPE,
                         "%s: w must be [O, %lld, %d, %d] (O, x's channels, the window); it has "
                         "%d dimensions, [%lld, %lld, ...]",
                         fn, (long long)g->c, g->kh, g->kw, w->ndim, (long long)w->shape[0],
                         (long long)(w->ndim > 1 ? w->shape[1] : 0));
    if (y->ndim != 4 || y->shape[0] != g->n || y->shape[1] != w->shape[0] || y->shape[2] != g->oh ||
        y->shape[3] != g->ow)
        return chi_error(CH_ERR_SHAPE, "%s: %s must be [%lld, %lld, %lld, %lld] (N, O, OH, OW)", fn,
                         yn, (long long)g->n, (long long)w->shape[0], (long long)g->oh,
                         (long long)g->ow);
    return CH_OK;
}

static ch_bmem mem_or_null(const ch_tensor *t)
{
    return t ? chi_mem(t) : (ch_bmem){NULL, 0};
}

/* The convolution's inputs: x and w (backward: dy too) alike, in f32,
 * bf16 or f16. */
static ch_status conv_dtypes(const char *fn, const ch_tensor *x, const ch_tensor *w,
                             const ch_tensor *dy)
{
    if (x->dtype != CH_F32 && x->dtype != CH_BF16 && x->dtype != CH_F16)
        return chi_error(CH_ERR_DTYPE, "%s: x is %s, expected f32, bf16 or f16", fn,
                         ch_dtype_name(x->dtype));
    const ch_tensor *other = w->dtype != x->dtype ? w : dy && dy->dtype != x->dtype ? dy : NULL;
    if (other)
        return chi_error(CH_ERR_DTYPE, "%s: x is %s but %s is %s, expected the same dtype", fn,
                         ch_dtype_name(x->dtype), other == w ? "w" : "dy",
                         ch_dtype_name(other->dtype));
    return CH_OK;
}

/* The backend's scratch for its convolution with inputs in dt, on `like`'s
 * device (NULL when it asks for none). */
static ch_status conv_scratch(ch_tensor **ws, size_t *bytes, const ch_tensor *like,
                              const ch_conv_geom *g, int64_t o, ch_dtype dt, int backward, int want)
{
    *ws = NULL;
    *bytes = 0;
    if (dt == CH_F32)
        TRY(BE(like)->conv2d_workspace(STREAM(like), g, o, backward, want, bytes));
    else
        TRY(BE(like)->conv2d_half_workspace(STREAM(like), g, o, (int)dt, backward, want, bytes));
    if (*bytes == 0)
        return CH_OK;
    int64_t floats = (int64_t)((*bytes + sizeof(float) - 1) / sizeof(float));
    return ch_tensor_new(ws, like->dev, CH_F32, 1, &floats);
}

/* im2col, one GEMM over the whole batch, and [O, N, P] -> [N, O, P]. */
static ch_status conv_composed(ch_tensor *y, const ch_tensor *x, const ch_tensor *w,
                               const ch_window2d *win, const ch_conv_geom *g, int64_t o)
{
    int64_t k = g->c * g->kh * g->kw, p = g->oh * g->ow, n = g->n;
    int64_t col_shape[2] = {k, n * p}, yt_shape[3] = {o, n, p}, yt2[2] = {o, n * p};
    int64_t w2[2] = {o, k}, y3[3] = {n, o, p};
    ch_tensor *col = NULL, *yt = NULL, *ytv = NULL, *wv = NULL, *yv = NULL;
    ch_status st = ch_tensor_new(&col, x->dev, CH_F32, 2, col_shape);
    if (st == CH_OK)
        st = ch_tensor_new(&yt, x->dev, CH_F32, 3, yt_shape);
    if (st == CH_OK)
        st = ch_im2col(col, x, win);
    if (st == CH_OK)
        st = read_view(&wv, w, 2, w2);
    if (st == CH_OK)
        st = read_view(&ytv, yt, 2, yt2);
    if (st == CH_OK)
        st = ch_gemm(ytv, 0, 0, 1.0f, wv, col, 0.0f);
    if (st == CH_OK)
        st = ch_tensor_reshape(&yv, y, 3, y3);
    if (st == CH_OK)
        st = ch_transpose01(yv, yt);
    ch_tensor_free(col);
    ch_tensor_free(yt);
    ch_tensor_free(ytv);
    ch_tensor_free(wv);
    ch_tensor_free(yv);
    return st;
}

/* The convolution with half inputs (forward x and w, backward dy too; the
 * shapes checked): the backend's conv2d_half slots, or the inputs widened
 * to f32 on the device and the f32 convolution. Forward writes y,
 * backward dx and dw as ch_conv2d_backward does. */
static ch_status conv_half(const char *fn, int backward, ch_tensor *y, ch_tensor *dx, ch_tensor *dw,
                           float beta, const ch_tensor *dy, const ch_tensor *x, const ch_tensor *w,
                           const ch_window2d *win, const ch_conv_geom *g, int64_t o)
{
    const ch_tensor *like = backward ? dy : y;
    const ch_backend_i *be = BE(like);
    if (be->conv2d_half_workspace && be->conv2d_half_forward && be->conv2d_half_backward) {
        ch_tensor *ws = NULL;
        size_t bytes = 0;
        ch_status st =
            conv_scratch(&ws, &bytes, like, g, o, x->dtype, backward, (dx ? 1 : 0) | (dw ? 2 : 0));
        if (st == CH_OK && backward)
            st = be->conv2d_half_backward(STREAM(like), g, o, (int)x->dtype, mem_or_null(dx),
                                          mem_or_null(dw), beta, chi_mem(dy), chi_mem(x),
                                          chi_mem(w), mem_or_null(ws), bytes);
        else if (st == CH_OK)
            st = be->conv2d_half_forward(STREAM(like), g, o, (int)x->dtype, chi_mem(y), chi_mem(x),
                                         chi_mem(w), mem_or_null(ws), bytes);
        ch_tensor_free(ws);
        if (st != CH_ERR_UNSUPPORTED)
            return st;
    }
    /* Backward reads x only for dw and w only for dx. */
    ch_tensor *tx = NULL, *tw = NULL, *tdy = NULL, *x32, *w32, *dy32 = NULL;
    ch_status st = chi_widened(x, !backward || dw, &tx, &x32);
    if (st == CH_OK)
        st = chi_widened(w, !backward || dx, &tw, &w32);
    if (st == CH_OK && backward)
        st = chi_widened(dy, 1, &tdy, &dy32);
    if (st == CH_OK)
        st = backward ? ch_conv2d_backward(dx, dw, dy32, x32, w32, win, beta)
                      : ch_conv2d(y, x32, w32, win);
    ch_tensor_free(tx);
    ch_tensor_free(tw);
    ch_tensor_free(tdy);
    if (st != CH_OK)
        return chi_error(st, "%s (%s inputs): %s", fn, ch_dtype_name(x->dtype), ch_last_error());
    return CH_OK;
}

ch_status ch_conv2d(ch_tensor *y, const ch_tensor *x, const ch_tensor *w, const ch_window2d *win)
{
    static const char fn[] = "ch_conv2d";
    arg args[] = {{"y", y, CH_F32, 0}, {"x", x, ANY, 0}, {"w", w, ANY, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(conv_dtypes(fn, x, w, NULL));
    if (!win)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: win is NULL", fn);
    ch_conv_geom g;
    TRY(conv_geom(fn, "x", x, win, &g));
    TRY(check_conv(fn, w, "y", y, &g));
    TRY(no_alias(fn, "y", y, "x", x));
    TRY(no_alias(fn, "y", y, "w", w));
    int64_t o = w->shape[0];
    if (x->dtype != CH_F32)
        return conv_half(fn, 0, y, NULL, NULL, 0.0f, NULL, x, w, win, &g, o);
    if (!BE(y)->conv2d_forward)
        return conv_composed(y, x, w, win, &g, o);
    ch_tensor *ws = NULL;
    size_t bytes = 0;
    ch_status st = conv_scratch(&ws, &bytes, y, &g, o, CH_F32, 0, 0);
    if (st == CH_OK)
        st = BE(y)->conv2d_forward(STREAM(y), &g, o, chi_mem(y), chi_mem(x), chi_mem(w),
                                   mem_or_null(ws), bytes);
    ch_tensor_free(ws);
    return st;
}

/* dy -> [O, N, P]; then dw from it and im2col(x), dx by col2im of w^T
 * times it. */
static ch_status conv_backward_composed(ch_tensor *dx, ch_tensor *dw, const ch_tensor *dy,
                                        const ch_tensor *x, const ch_tensor *w,
                                        const ch_window2d *win, float beta, const ch_conv_geom *g,
                                        int64_t o)
{
    int64_t k = g->c * g->kh * g->kw, p = g->oh * g->ow, n = g->n;
    int64_t col_shape[2] = {k, n * p}, dyt_shape[3] = {o, n, p}, dyt2[2] = {o, n * p};
    int64_t w2[2] = {o, k}, dy3[3] = {n, o, p};
    ch_tensor *col = NULL, *dyt = NULL, *dytv = NULL, *dyv = NULL, *wv = NULL, *dwv = NULL;
    ch_status st = ch_tensor_new(&col, dy->dev, CH_F32, 2, col_shape);
    if (st == CH_OK)
        st = ch_tensor_new(&dyt, dy->dev, CH_F32, 3, dyt_shape);
    if (st == CH_OK)
        st = read_view(&dyv, dy, 3, dy3);
    if (st == CH_OK)
        st = ch_transpose01(dyt, dyv);
    if (st == CH_OK)
        st = read_view(&dytv, dyt, 2, dyt2);
    if (st == CH_OK && dw) {
        st = ch_im2col(col, x, win);
        if (st == CH_OK)
            st = ch_tensor_reshape(&dwv, dw, 2, w2);
        if (st == CH_OK)
            st = ch_gemm(dwv, 0, 1, 1.0f, dytv, col, beta);
    }
    if (st == CH_OK && dx) {
        st = read_view(&wv, w, 2, w2);
        if (st == CH_OK)
            st = ch_gemm(col, 1, 0, 1.0f, wv, dytv, 0.0f);
        if (st == CH_OK)
            st = ch_col2im(dx, col, win);
    }
    ch_tensor_free(col);
    ch_tensor_free(dyt);
    ch_tensor_free(dytv);
    ch_tensor_free(dyv);
    ch_tensor_free(wv);
    ch_tensor_free(dwv);
    return st;
}

ch_status ch_conv2d_backward(ch_tensor *dx, ch_tensor *dw, const ch_tensor *dy, const ch_tensor *x,
                             const ch_tensor *w, const ch_window2d *win, float beta)
{
    static const char fn[] = "ch_conv2d_backward";
    arg args[] = {{"dy", dy, ANY, 0},
                  {"x", x, ANY, 0},
                  {"w", w, ANY, 0},
                  {"dx", dx, CH_F32, 1},
                  {"dw", dw, CH_F32, 1}};
    TRY(check_args(fn, args, NARGS(args)));
    TRY(conv_dtypes(fn, x, w, dy));
    if (!dx && !dw)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: dx and dw are both NULL (nothing to do)",
                         fn);
    TRY(check_finite(fn, "beta", beta));
    if (!win)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: win is NULL", fn);
    ch_conv_geom g;
    TRY(conv_geom(fn, "x", x, win, &g));
    TRY(check_conv(fn, w, "dy", dy, &g));
    if (dx) {
        TRY(same_shape(fn, "dx", dx, "x", x));
        TRY(no_alias(fn, "dx", dx, "dy", dy));
        TRY(no_alias(fn, "dx", dx, "x", x));
        TRY(no_alias(fn, "dx", dx, "w", w));
    }
    if (dw) {
        TRY(same_shape(fn, "dw", dw, "w", w));
        TRY(no_alias(fn, "dw", dw, "dy", dy));
        TRY(no_alias(fn, "dw", dw, "x", x));
        TRY(no_alias(fn, "dw", dw, "w", w));
        if (dx)
            TRY(no_alias(fn, "dw", dw, "dx", dx));
    }
    int64_t o = w->shape[0];
    if (x->dtype != CH_F32)
        return conv_half(fn, 1, NULL, dx, dw, beta, dy, x, w, win, &g, o);
    if (!BE(dy)->conv2d_backward)
        return conv_backward_composed(dx, dw, dy, x, w, win, beta, &g, o);
    ch_tensor *ws = NULL;
    size_t bytes = 0;
    ch_status st = conv_scratch(&ws, &bytes, dy, &g, o, CH_F32, 1, (dx ? 1 : 0) | (dw ? 2 : 0));
    if (st == CH_OK)
        st = BE(dy)->conv2d_backward(STREAM(dy), &g, o, mem_or_null(dx), mem_or_null(dw), beta,
                                     chi_mem(dy), chi_mem(x), chi_mem(w), mem_or_null(ws), bytes);
    ch_tensor_free(ws);
    return st;
}

static ch_status pool_geom(const char *fn, const char *xn, const ch_tensor *x, const ch_window2d *w,
                           ch_conv_geom *g)
{
    TRY(conv_geom(fn, xn, x, w, g));
    /* Wider padding could give a window of padding only, with no maximum. */
    if (2 * w->ph > w->kh || 2 * w->pw > w->kw)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: padding %dx%d is more than half the window %dx%d", fn, w->ph, w->pw,
                         w->kh, w->kw);
    return CH_OK;
}

static ch_status check_pooled(const char *fn, const char *yn, const ch_tensor *y,
                              const ch_conv_geom *g)
{
    if (y->ndim != 4 || y->shape[0] != g->n || y->shape[1] != g->c || y->shape[2] != g->oh ||
        y->shape[3] != g->ow)
        return chi_error(CH_ERR_SHAPE, "%s: %s must be [%lld, %lld, %lld, %lld]", fn, yn,
                         (long long)g->n, (long long)g->c, (long long)g->oh, (long long)g->ow);
    return CH_OK;
}

ch_status ch_maxpool2d(ch_tensor *y, ch_tensor *idx, const ch_tensor *x, const ch_window2d *w)
{
    static const char fn[] = "ch_maxpool2d";
    arg args[] = {{"y", y, CH_F32, 0}, {"idx", idx, CH_I32, 0}, {"x", x, CH_F32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    ch_conv_geom g;
    TRY(pool_geom(fn, "x", x, w, &g));
    TRY(check_pooled(fn, "y", y, &g));
    TRY(check_pooled(fn, "idx", idx, &g));
    TRY(no_alias(fn, "y", y, "x", x));
    TRY(no_alias(fn, "idx", idx, "x", x));
    TRY(no_alias(fn, "idx", idx, "y", y));
    SLOT_OR_HOST(fn, y, maxpool_forward, ch_maxpool2d(on_host[0], on_host[1], on_host[2], w),
                 FB_OUT(y), FB_OUT(idx), FB_IN(x));
    return BE(y)->maxpool_forward(STREAM(y), &g, chi_mem(y), chi_mem(idx), chi_mem(x));
}

ch_status ch_maxpool2d_backward(ch_tensor *dx, const ch_tensor *dy, const ch_tensor *idx,
                                const ch_window2d *w)
{
    static const char fn[] = "ch_maxpool2d_backward";
    arg args[] = {{"dx", dx, CH_F32, 0}, {"dy", dy, CH_F32, 0}, {"idx", idx, CH_I32, 0}};
    TRY(check_args(fn, args, NARGS(args)));
    ch_conv_geom g;
    TRY(pool_geom(fn, "dx", dx, w, &g));
    TRY(check_pooled(fn, "dy", dy, &g));
    TRY(check_pooled(fn, "idx", idx, &g));
    TRY(no_alias(fn, "dx", dx, "dy", dy));
    TRY(no_alias(fn, "dx", dx, "idx", idx));
    SLOT_OR_HOST(fn, dx, maxpool_backward,
                 ch_maxpool2d_backward(on_host[0], on_host[1], on_host[2], w), FB_OUT(dx),
                 FB_IN(dy), FB_IN(idx));
    return BE(dx)->maxpool_backward(STREAM(dx), &g, chi_mem(dx), chi_mem(dy), chi_mem(idx));
}
