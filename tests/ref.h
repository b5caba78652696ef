/* Double-precision reference implementations of every primitive op, computed
 * on the host from the same f32 inputs the device ops read. The tests compare
 * every backend (the host backend included) with these, never with another
 * backend's output. Semantics follow include/chorus/ops.h exactly. */
#ifndef CHORUS_TESTS_REF_H
#define CHORUS_TESTS_REF_H

#include <stddef.h>
#include <stdint.h>
#include <chorus.h>

#include "backend.h"
#include "tap.h"

/* Convolution geometry resolved from [N, C, H, W] and a window. */
typedef struct ref_geom {
    int64_t n, c, h, w, oh, ow;
    int kh, kw, sh, sw, ph, pw;
} ref_geom;

ref_geom ref_geom_make(int64_t n, int64_t c, int64_t h, int64_t w, const ch_window2d *win);

/* c[M,N] = alpha op(a) op(b) + beta c0 (c0 unread when beta is 0). a is
 * [M,K] or [K,M] (trans_a), b is [K,N] or [N,K] (trans_b), row-major. */
void ref_gemm(double *c, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
              double alpha, const float *a, const float *b, double beta, const float *c0);

/* Every ref_* function that takes one of the enums crossing the backend ABI
 * knows each of its values below _COUNT, so tests can loop up to it: a
 * value added without its reference makes the tests fail (NaN, "unknown"). */
const char *ref_binary_name(ch_binary_op op); /* "add", ... */
void ref_binary(double *y, ch_binary_op op, int64_t n, const float *a, const float *b);
/* y = alpha x + beta y0 */
void ref_axpby(double *y, int64_t n, double alpha, const float *x, double beta,
               const float *y0);

double ref_act(ch_activation act, double x);
const char *ref_act_name(ch_activation act); /* "relu", ... */
/* 1 when the backward reads the forward input x, 0 when it reads y. */
int ref_act_reads_x(ch_activation act);
void ref_act_forward(double *y, ch_activation act, int64_t n, const float *x);
/* dx = dy * act'(x); tanh and sigmoid take the derivative from y. */
void ref_act_backward(double *dx, ch_activation act, int64_t n, const float *dy,
                      const float *x, const float *y);
/* The size of the terms dx is made of (see ref_err): |dy| (|Phi(x)| +
 * |x phi(x)|) for gelu, whose derivative crosses zero near x = -0.75,
 * and likewise |dy| (s(2u) + |x s(2u) s(-2u) 2u'|) for gelu_tanh; |dx|
 * for the others. */
void ref_act_backward_mag(double *mag, ch_activation act, int64_t n, const float *dy,
                          const float *x, const float *y);

/* x, y as [outer, c, inner]. */
void ref_bias_add(double *y, int64_t outer, int64_t c, int64_t inner, const float *x,
                  const float *bias);
void ref_bias_grad(double *db, int64_t outer, int64_t c, int64_t inner, const float *dy,
                   double beta, const float *db0);

/* Returns the mean loss; probs may be NULL. */
double ref_softmax_xent(double *probs, int64_t n, int64_t c, const float *logits,
                        const int32_t *labels);
/* The error scales of ref_softmax_xent's results (see ref_err): for each
 * probability p_j (1 + |x_j - max|), since an f32 rounding of the exponent
 * x_j - max moves p_j by that much relative to it; returned, the mean over
 * rows of |log sum| + |x_label - max|, the terms of the loss. */
double ref_softmax_xent_mag(double *probs_mag, int64_t n, int64_t c, const float *logits,
                            const int32_t *labels);
void ref_softmax_xent_backward(double *dlogits, int64_t n, int64_t c, const float *probs,
                               const int32_t *labels, double scale);

void ref_transpose01(float *y, int64_t a, int64_t b, int64_t inner, const float *x);

void ref_im2col(double *col, const ref_geom *g, const float *x);
void ref_col2im(double *dx, const ref_geom *g, const float *col);
/* y [N, O, OH, OW] = the convolution of x [N, C, H, W] by w [O, C, kh, kw],
 * directly, tap by tap. */
void ref_conv2d(double *y, const ref_geom *g, int64_t o, const float *x, const float *w);
/* Its gradients from dy: dx [N, C, H, W] and dw = beta dw0 + the weight's
 * (dw0 unread when beta is 0); either output may be NULL. */
void ref_conv2d_backward(double *dx, double *dw, const ref_geom *g, int64_t o, const float *dy,
                         const float *x, const float *w, double beta, const float *dw0);
void ref_maxpool(double *y, int32_t *idx, const ref_geom *g, const float *x);
void ref_maxpool_backward(double *dx, const ref_geom *g, const float *dy, const int32_t *idx);

/* x as [outer, n, inner] -> y [outer, inner]. */
const char *ref_axis_name(ch_axis_op op); /* "sum", "mean" */
void ref_sum_axis(double *y, ch_axis_op op, int64_t outer, int64_t n, int64_t inner,
                  const float *x);
/* The first NaN along n, else the first maximum (ops.h). */
void ref_argmax(int32_t *y, int64_t outer, int64_t n, int64_t inner, const float *x);

void ref_sgd_step(double *p, double *m, int64_t n, const float *p0, const float *m0,
                  const float *g, const ch_sgd_params *prm, int first_step);
void ref_adam_step(double *p, double *m, double *v, int64_t n, const float *p0,
                   const float *m0, const float *v0, const float *g,
                   const ch_adam_params *prm);

/* The Philox streams of ops.h, element i at counter offset + i. Uniform and
 * dropout are computed in f32 exactly as specified (they must match bit for
 * bit); normal in double. */
void ref_rand_uniform(float *y, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi);
void ref_rand_normal(double *y, int64_t n, uint64_t seed, uint64_t offset, double mean,
                     double std);
/* The error scale of each normal (see ref_err): |mean| + |std| sqrt(-2 ln u1),
 * the radius cos(2 pi u2) is multiplied by, since an f32 rounding of the
 * angle moves z by that much. */
void ref_rand_normal_mag(double *mag, int64_t n, uint64_t seed, uint64_t offset, double mean,
                         double std);
void ref_dropout_mask(float *y, int64_t n, uint64_t seed, uint64_t offset, float p);

/* The largest error of got against want, each element's relative to its own
 * scale: max_i |got_i - want_i| / max(s_i, REF_TINY), with s_i = mag[i]
 * where mag is given and |want_i| otherwise. mag is the size of the terms
 * an output is made of (the same expression over the inputs' absolute
 * values): where the terms cancel, as in a sum, rounding errors are
 * relative to them rather than to the result. Small results are held to
 * the same relative accuracy as large ones. A NaN on one side only gives
 * infinity. */
#define REF_TINY 1e-30
double ref_err(const float *got, const double *want, const double *mag, int64_t n);
/* max_i |got_i - want_i| / max(max_j |want_j|, floor): for gradients, whose
 * scale can be far from 1. */
double ref_err_scaled(const double *got, const double *want, int64_t n, double floor);

/* ---- Test cases ----------------------------------------------------------
 * A case owns its host arrays and tensors (freed by its tc_end_* line) and
 * keeps the first call that failed; later calls are skipped, so a case never
 * runs an op on the leftovers of a failed one and reports one TAP line. */

/* A shape as two arguments: its rank and its dimensions. */
#define SHAPE(...) \
    (int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), (int64_t[]){__VA_ARGS__}

typedef struct tcase {
    ch_device *dev;
    char name[256];
    tap_rng rng;       /* seeded from the name: every device gets the same inputs */
    ch_status st;      /* the first call that failed */
    char err[768];
    ch_tensor *t[32];
    int nt;
    void *mem[64];
    int nmem;
} tcase;

void tc_begin(tcase *c, ch_device *dev, const char *fmt, ...) TAP_PRINTF(3, 4);
/* Adds to the case's name (the numbers worth printing on its line). */
void tc_append(tcase *c, const char *fmt, ...) TAP_PRINTF(2, 3);
/* Records a failed status with ch_last_error(), unless one is recorded. */
void tc_check(tcase *c, ch_status st);
void tc_fail(tcase *c, const char *fmt, ...) TAP_PRINTF(2, 3);

/* Runs `call` unless an earlier call of the case failed. */
#define TC(c, call)                \
    do {                           \
        if ((c)->st == CH_OK)      \
            tc_check((c), (call)); \
    } while (0)

/* Zeroed host memory owned by the case. */
void *tc_alloc(tcase *c, size_t bytes);
float *tc_floats(tcase *c, int64_t n);
double *tc_doubles(tcase *c, int64_t n);
int32_t *tc_ints(tcase *c, int64_t n);
float *tc_random(tcase *c, int64_t n, float lo, float hi);
/* |x|, for the magnitudes of ref_err. */
float *tc_abs(tcase *c, const float *x, int64_t n);

/* Tensors on the case's device; NULL once a call has failed. */
void tc_track(tcase *c, ch_tensor *t);
ch_tensor *tc_tensor(tcase *c, ch_dtype dtype, int ndim, const int64_t *shape,
                     const void *data);
ch_tensor *tc_view(tcase *c, ch_tensor *src, int64_t start, int64_t count);
void tc_upload(tcase *c, ch_tensor *t, const void *data);
/* The content of a tensor of n 4-byte elements (zeros if a call failed). */
void *tc_fetch(tcase *c, const ch_tensor *t, int64_t n);
/* The same into `host`, for loops that must not grow the case's memory. */
void tc_download(tcase *c, const ch_tensor *t, void *host, int64_t n);

/* x as doubles, owned by the case. */
double *tc_widen(tcase *c, const float *x, int64_t n);

/* <a, b> and the sum of |a_i b_i|, in double. */
double ref_dot(const float *a, const float *b, int64_t n);
double ref_dot_abs(const float *a, const float *b, int64_t n);

/* What central differences differentiate: a scalar L of `values`, which
 * the objective uploads into `t` itself; `ctx` is whatever else it needs. */
typedef double (*tc_objective)(tcase *c, const void *ctx, ch_tensor *t, const float *values);
/* Central differences of L over every element of `t`, which holds `x`
 * (count floats): want[i] = (L(x + h e_i) - L(x - h e_i)) / d, with d the
 * distance between the two f32 values of x_i actually evaluated, not 2h.
 * Stops at the first failed call; leaves `x` in `t`. */
void tc_central_diff(tcase *c, tc_objective objective, const void *ctx, ch_tensor *t,
                     const float *x, int64_t count, float h, double *want);

/* The ops whose formulas every backend takes from lib/kernels/: besides
 * the reference, a device's result is compared with the host backend's on
 * the same inputs (the case's name seeds them). The host's run of a case
 * keeps its n floats under the case's name (no TAP line); another
 * device's run gives one line: its largest difference from them, each
 * element's relative to mag[i] (|host_i| where mag is NULL, as ref_err),
 * at most tol; a skip naming the case when the host did not run it
 * first. Call it before the case's tc_end_* line. */
void tc_vs_host(tcase *c, const float *got, const double *mag, int64_t n, double tol);

/* One TAP line each, then everything of the case is freed. */
int tc_end_err(tcase *c, double err, double tol);
/* The adjoint identity <A x, y> == <x, A^T y> (lhs, rhs), its error
 * relative to `scale`, the sum of |terms| of <A x, y>. */
int tc_end_adjoint(tcase *c, double lhs, double rhs, double scale, double tol);
int tc_end_exact(tcase *c, int ok, const char *detail);
/* Exact comparison of n 4-byte words (floats or int32). */
int tc_end_words(tcase *c, const void *got, const void *want, int64_t n, int is_float);

/* Counts differing 4-byte words; describes the first in `out`. */
int64_t ref_diff_words(const void *got, const void *want, int64_t n, int is_float, char *out,
                       size_t outlen);
/* One "# SKIP" line per backend that is unavailable or has no device. */
void tc_skip_missing_backends(void);
/* 1 under CHORUS_TEST_SIZES=small: the op tests leave out their largest
 * cases (or take smaller ones), for a slow device such as oclgrind's
 * simulator; the cases kept still span several work-groups, reduce more
 * elements than one work-group holds and end in partial work-groups.
 * 0 when unset, empty or "full"; another value is a failing TAP line
 * (once) and full sizes. */
int tc_small(void);

int64_t ref_numel(int ndim, const int64_t *shape);
void ref_shape_str(char *out, size_t len, int ndim, const int64_t *shape);

/* ---- Causal attention --------------------------------------------------------- */

/* Causal attention (ch_attention) in double for b matrices [t, hd]: o,
 * lse and, for backward, dq, dk, dv from dout (NULL: forward only); mag (may be NULL) each o's error scale,
 * sum_j p_j |v_j| (1 + |s_j - max|) (an f32 rounding of an exponent moves
 * p_j that much relative to it). */
typedef struct attn_ref {
    double *o, *mag, *lse, *dq, *dk, *dv;
} attn_ref;

void ref_attention(const attn_ref *r, const float *q, const float *k, const float *v,
                   const float *dout, int64_t b, int64_t t, int64_t hd, double scale, double *p,
                   double *dp);

#endif
