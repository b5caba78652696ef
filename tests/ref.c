/* Double-precision references for the op tests (see ref.h). Written for
 * clarity, not speed: plain loops in the order ops.h describes. */
#include "ref.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "philox.h"

ref_geom ref_geom_make(int64_t n, int64_t c, int64_t h, int64_t w, const ch_window2d *win)
{
    ref_geom g = {
        .n = n, .c = c, .h = h, .w = w,
        .kh = win->kh, .kw = win->kw, .sh = win->sh, .sw = win->sw,
        .ph = win->ph, .pw = win->pw,
    };
    g.oh = (h + 2 * win->ph - win->kh) / win->sh + 1;
    g.ow = (w + 2 * win->pw - win->kw) / win->sw + 1;
    return g;
}

static double gemm_at(const float *x, int trans, int64_t rows, int64_t cols, int64_t i,
                      int64_t j)
{
    /* Element (i, j) of op(x), where op(x) is [rows, cols]. */
    return trans ? x[j * rows + i] : x[i * cols + j];
}

void ref_gemm(double *c, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
              double alpha, const float *a, const float *b, double beta, const float *c0)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = 0.0;
            for (int64_t p = 0; p < k; p++)
                s += gemm_at(a, trans_a, m, k, i, p) * gemm_at(b, trans_b, k, n, p, j);
            c[i * n + j] = alpha * s + (beta != 0.0 ? beta * c0[i * n + j] : 0.0);
        }
}

const char *ref_binary_name(ch_binary_op op)
{
    switch (op) {
    case CH_BIN_ADD: return "add";
    case CH_BIN_SUB: return "sub";
    case CH_BIN_MUL: return "mul";
    case CH_BIN_COUNT: break;
    }
    return "unknown";
}

static double binary_one(ch_binary_op op, double x, double z)
{
    switch (op) {
    case CH_BIN_ADD: return x + z;
    case CH_BIN_SUB: return x - z;
    case CH_BIN_MUL: return x * z;
    case CH_BIN_COUNT: break;
    }
    return NAN;
}

void ref_binary(double *y, ch_binary_op op, int64_t n, const float *a, const float *b)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = binary_one(op, a[i], b[i]);
}

void ref_axpby(double *y, int64_t n, double alpha, const float *x, double beta,
               const float *y0)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = alpha * x[i] + (beta != 0.0 ? beta * y0[i] : 0.0);
}

/* GELU's tanh approximation as x s(2u), s the logistic function: the
 * same as x (1 + tanh(u)) / 2, whose 1 + tanh(u) cancels in double too
 * for x below -4 (1e-8 of the result at x = -6). */
static double gelu_tanh_u(double x)
{
    return sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x);
}

static double logistic(double z)
{
    return 1.0 / (1.0 + exp(-z));
}

double ref_act(ch_activation act, double x)
{
    switch (act) {
    case CH_ACT_RELU: return x > 0.0 ? x : 0.0;
    case CH_ACT_GELU: return 0.5 * x * erfc(-x / sqrt(2.0));
    case CH_ACT_TANH: return tanh(x);
    case CH_ACT_SIGMOID: return 1.0 / (1.0 + exp(-x));
    case CH_ACT_GELU_TANH: return x * logistic(2.0 * gelu_tanh_u(x));
    case CH_ACT_COUNT: break;
    }
    return NAN;
}

const char *ref_act_name(ch_activation act)
{
    switch (act) {
    case CH_ACT_RELU: return "relu";
    case CH_ACT_GELU: return "gelu";
    case CH_ACT_TANH: return "tanh";
    case CH_ACT_SIGMOID: return "sigmoid";
    case CH_ACT_GELU_TANH: return "gelu_tanh";
    case CH_ACT_COUNT: break;
    }
    return "unknown";
}

int ref_act_reads_x(ch_activation act)
{
    return act == CH_ACT_RELU || act == CH_ACT_GELU || act == CH_ACT_GELU_TANH;
}

void ref_act_forward(double *y, ch_activation act, int64_t n, const float *x)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = ref_act(act, x[i]);
}

/* Phi(x) and x phi(x): gelu's derivative is their sum. */
static double gelu_cdf(double x)
{
    return 0.5 * erfc(-x / sqrt(2.0));
}

static double gelu_pdf_x(double x)
{
    return x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
}

/* gelu_tanh's derivative is s(2u) plus this, x s(2u) s(-2u) 2u'. */
static double gelu_tanh_slope_x(double x)
{
    double du = 2.0 * sqrt(2.0 / M_PI) * (1.0 + 3.0 * 0.044715 * x * x);
    double u = gelu_tanh_u(x);
    return x * logistic(2.0 * u) * logistic(-2.0 * u) * du;
}

static double act_derivative(ch_activation act, double x, double y)
{
    switch (act) {
    case CH_ACT_RELU: return x > 0.0 ? 1.0 : 0.0;
    case CH_ACT_GELU: return gelu_cdf(x) + gelu_pdf_x(x);
    case CH_ACT_TANH: return 1.0 - y * y;
    case CH_ACT_SIGMOID: return y * (1.0 - y);
    case CH_ACT_GELU_TANH: return logistic(2.0 * gelu_tanh_u(x)) + gelu_tanh_slope_x(x);
    case CH_ACT_COUNT: break;
    }
    return NAN;
}

void ref_act_backward(double *dx, ch_activation act, int64_t n, const float *dy,
                      const float *x, const float *y)
{
    for (int64_t i = 0; i < n; i++)
        dx[i] = dy[i] * act_derivative(act, x ? x[i] : 0.0, y ? y[i] : 0.0);
}

void ref_act_backward_mag(double *mag, ch_activation act, int64_t n, const float *dy,
                          const float *x, const float *y)
{
    ref_act_backward(mag, act, n, dy, x, y);
    for (int64_t i = 0; i < n; i++)
        mag[i] =
            act == CH_ACT_GELU ? fabs(dy[i]) * (fabs(gelu_cdf(x[i])) + fabs(gelu_pdf_x(x[i])))
            : act == CH_ACT_GELU_TANH
                ? fabs(dy[i]) * (logistic(2.0 * gelu_tanh_u(x[i])) + fabs(gelu_tanh_slope_x(x[i])))
                : fabs(mag[i]);
}

void ref_bias_add(double *y, int64_t outer, int64_t c, int64_t inner, const float *x,
                  const float *bias)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < c; j++)
            for (int64_t i = 0; i < inner; i++) {
                int64_t at = (o * c + j) * inner + i;
                y[at] = (double)x[at] + bias[j];
            }
}

void ref_bias_grad(double *db, int64_t outer, int64_t c, int64_t inner, const float *dy,
                   double beta, const float *db0)
{
    for (int64_t j = 0; j < c; j++) {
        double s = 0.0;
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++)
                s += dy[(o * c + j) * inner + i];
        db[j] = (beta != 0.0 ? beta * db0[j] : 0.0) + s;
    }
}

double ref_softmax_xent(double *probs, int64_t n, int64_t c, const float *logits,
                        const int32_t *labels)
{
    double loss = 0.0;
    for (int64_t r = 0; r < n; r++) {
        const float *row = logits + r * c;
        double mx = row[0];
        for (int64_t j = 1; j < c; j++)
            mx = row[j] > mx ? row[j] : mx;
        double z = 0.0;
        for (int64_t j = 0; j < c; j++)
            z += exp(row[j] - mx);
        for (int64_t j = 0; probs && j < c; j++)
            probs[r * c + j] = exp(row[j] - mx) / z;
        loss += log(z) - (row[labels[r]] - mx);
    }
    return loss / (double)n;
}

double ref_softmax_xent_mag(double *probs_mag, int64_t n, int64_t c, const float *logits,
                            const int32_t *labels)
{
    double *probs = malloc((size_t)(n * c) * sizeof *probs);
    if (!probs)
        return NAN;
    ref_softmax_xent(probs, n, c, logits, labels);
    double mag = 0.0;
    for (int64_t r = 0; r < n; r++) {
        const float *row = logits + r * c;
        double mx = row[0], z = 0.0;
        for (int64_t j = 1; j < c; j++)
            mx = row[j] > mx ? row[j] : mx;
        for (int64_t j = 0; j < c; j++) {
            z += exp(row[j] - mx);
            probs_mag[r * c + j] = probs[r * c + j] * (1.0 + fabs(row[j] - mx));
        }
        mag += fabs(log(z)) + fabs(row[labels[r]] - mx);
    }
    free(probs);
    return mag / (double)n;
}

void ref_softmax_xent_backward(double *dlogits, int64_t n, int64_t c, const float *probs,
                               const int32_t *labels, double scale)
{
    for (int64_t r = 0; r < n; r++)
        for (int64_t j = 0; j < c; j++) {
            double onehot = j == labels[r] ? 1.0 : 0.0;
            dlogits[r * c + j] = scale * ((double)probs[r * c + j] - onehot) / (double)n;
        }
}

void ref_transpose01(float *y, int64_t a, int64_t b, int64_t inner, const float *x)
{
    for (int64_t i = 0; i < a; i++)
        for (int64_t j = 0; j < b; j++)
            memcpy(y + (j * a + i) * inner, x + (i * b + j) * inner,
                   (size_t)inner * sizeof *x);
}

/* Visits every element of the column matrix with the input element it
 * holds; x_at is -1 where the window lies on padding. */
typedef void (*col_visit)(void *arg, int64_t col_at, int64_t x_at);

static void for_each_col(const ref_geom *g, col_visit f, void *arg)
{
    int64_t ncols = g->n * g->oh * g->ow;
    for (int64_t ci = 0; ci < g->c; ci++)
        for (int ki = 0; ki < g->kh; ki++)
            for (int kj = 0; kj < g->kw; kj++) {
                int64_t row = (ci * g->kh + ki) * g->kw + kj;
                for (int64_t ni = 0; ni < g->n; ni++)
                    for (int64_t oy = 0; oy < g->oh; oy++)
                        for (int64_t ox = 0; ox < g->ow; ox++) {
                            int64_t iy = oy * g->sh - g->ph + ki;
                            int64_t ix = ox * g->sw - g->pw + kj;
                            int64_t col = (ni * g->oh + oy) * g->ow + ox;
                            int inside = iy >= 0 && iy < g->h && ix >= 0 && ix < g->w;
                            int64_t x_at = ((ni * g->c + ci) * g->h + iy) * g->w + ix;
                            f(arg, row * ncols + col, inside ? x_at : -1);
                        }
            }
}

typedef struct col_args {
    double *out;
    const float *in;
} col_args;

static void im2col_visit(void *arg, int64_t col_at, int64_t x_at)
{
    col_args *a = arg;
    a->out[col_at] = x_at >= 0 ? a->in[x_at] : 0.0;
}

static void col2im_visit(void *arg, int64_t col_at, int64_t x_at)
{
    col_args *a = arg;
    if (x_at >= 0)
        a->out[x_at] += a->in[col_at];
}

void ref_im2col(double *col, const ref_geom *g, const float *x)
{
    col_args a = {col, x};
    for_each_col(g, im2col_visit, &a);
}

void ref_col2im(double *dx, const ref_geom *g, const float *col)
{
    col_args a = {dx, col};
    for (int64_t i = 0; i < g->n * g->c * g->h * g->w; i++)
        dx[i] = 0.0;
    for_each_col(g, col2im_visit, &a);
}

/* Calls visit(n, o, oy, ox, ci, ki, kj, iy, ix) for every tap of every
 * output that lands inside the input. */
#define CONV_TAPS(g, o, BODY)                                                              \
    for (int64_t n_ = 0; n_ < (g)->n; n_++)                                                \
        for (int64_t o_ = 0; o_ < (o); o_++)                                               \
            for (int64_t oy_ = 0; oy_ < (g)->oh; oy_++)                                    \
                for (int64_t ox_ = 0; ox_ < (g)->ow; ox_++)                                \
                    for (int64_t c_ = 0; c_ < (g)->c; c_++)                                \
                        for (int ki_ = 0; ki_ < (g)->kh; ki_++)                            \
                            for (int kj_ = 0; kj_ < (g)->kw; kj_++) {                      \
                                int64_t iy_ = oy_ * (g)->sh - (g)->ph + ki_;               \
                                int64_t ix_ = ox_ * (g)->sw - (g)->pw + kj_;               \
                                if (iy_ < 0 || iy_ >= (g)->h || ix_ < 0 || ix_ >= (g)->w)  \
                                    continue;                                              \
                                int64_t yi_ = ((n_ * (o) + o_) * (g)->oh + oy_) * (g)->ow + ox_; \
                                int64_t xi_ = ((n_ * (g)->c + c_) * (g)->h + iy_) * (g)->w + ix_; \
                                int64_t wi_ = ((o_ * (g)->c + c_) * (g)->kh + ki_) * (g)->kw + kj_; \
                                BODY;                                                      \
                            }

void ref_conv2d(double *y, const ref_geom *g, int64_t o, const float *x, const float *w)
{
    for (int64_t i = 0; i < g->n * o * g->oh * g->ow; i++)
        y[i] = 0.0;
    CONV_TAPS(g, o, y[yi_] += (double)x[xi_] * w[wi_])
}

void ref_conv2d_backward(double *dx, double *dw, const ref_geom *g, int64_t o, const float *dy,
                         const float *x, const float *w, double beta, const float *dw0)
{
    for (int64_t i = 0; dx && i < g->n * g->c * g->h * g->w; i++)
        dx[i] = 0.0;
    for (int64_t i = 0; dw && i < o * g->c * g->kh * g->kw; i++)
        dw[i] = beta == 0.0 ? 0.0 : beta * dw0[i];
    CONV_TAPS(g, o, {
        if (dx)
            dx[xi_] += (double)dy[yi_] * w[wi_];
        if (dw)
            dw[wi_] += (double)dy[yi_] * x[xi_];
    })
}

/* The first in-bounds maximum of one window, as an index in the plane. */
static int32_t window_argmax(const ref_geom *g, const float *plane, int64_t oy, int64_t ox)
{
    int32_t best = -1;
    for (int ki = 0; ki < g->kh; ki++)
        for (int kj = 0; kj < g->kw; kj++) {
            int64_t iy = oy * g->sh - g->ph + ki, ix = ox * g->sw - g->pw + kj;
            if (iy < 0 || iy >= g->h || ix < 0 || ix >= g->w)
                continue;
            int32_t at = (int32_t)(iy * g->w + ix);
            if (best < 0 || plane[at] > plane[best])
                best = at;
        }
    return best;
}

void ref_maxpool(double *y, int32_t *idx, const ref_geom *g, const float *x)
{
    for (int64_t p = 0; p < g->n * g->c; p++) {
        const float *plane = x + p * g->h * g->w;
        for (int64_t oy = 0; oy < g->oh; oy++)
            for (int64_t ox = 0; ox < g->ow; ox++) {
                int64_t at = (p * g->oh + oy) * g->ow + ox;
                idx[at] = window_argmax(g, plane, oy, ox);
                y[at] = idx[at] >= 0 ? plane[idx[at]] : NAN;
            }
    }
}

void ref_maxpool_backward(double *dx, const ref_geom *g, const float *dy, const int32_t *idx)
{
    int64_t hw = g->h * g->w, ohw = g->oh * g->ow;
    for (int64_t i = 0; i < g->n * g->c * hw; i++)
        dx[i] = 0.0;
    for (int64_t p = 0; p < g->n * g->c; p++)
        for (int64_t o = 0; o < ohw; o++)
            dx[p * hw + idx[p * ohw + o]] += dy[p * ohw + o];
}

const char *ref_axis_name(ch_axis_op op)
{
    switch (op) {
    case CH_AXIS_SUM: return "sum";
    case CH_AXIS_MEAN: return "mean";
    case CH_AXIS_COUNT: break;
    }
    return "unknown";
}

static double axis_divisor(ch_axis_op op, int64_t n)
{
    switch (op) {
    case CH_AXIS_SUM: return 1.0;
    case CH_AXIS_MEAN: return (double)n;
    case CH_AXIS_COUNT: break;
    }
    return NAN;
}

void ref_sum_axis(double *y, ch_axis_op op, int64_t outer, int64_t n, int64_t inner,
                  const float *x)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            double s = 0.0;
            for (int64_t j = 0; j < n; j++)
                s += x[(o * n + j) * inner + i];
            y[o * inner + i] = s / axis_divisor(op, n);
        }
}

void ref_argmax(int32_t *y, int64_t outer, int64_t n, int64_t inner, const float *x)
{
    for (int64_t o = 0; o < outer; o++)
        for (int64_t i = 0; i < inner; i++) {
            const float *col = x + o * n * inner + i;
            int32_t best = 0;
            for (int64_t j = 1; j < n && !isnan(col[best * inner]); j++)
                if (isnan(col[j * inner]) || col[j * inner] > col[best * inner])
                    best = (int32_t)j;
            y[o * inner + i] = best;
        }
}

void ref_sgd_step(double *p, double *m, int64_t n, const float *p0, const float *m0,
                  const float *g, const ch_sgd_params *prm, int first_step)
{
    double mu = prm->momentum;
    for (int64_t i = 0; i < n; i++) {
        double gi = g[i] + (double)prm->weight_decay * p0[i];
        double d = gi;
        if (mu != 0.0) {
            double mi = first_step ? gi : mu * m0[i] + (1.0 - prm->dampening) * gi;
            m[i] = mi;
            d = prm->nesterov ? gi + mu * mi : mi;
        }
        p[i] = p0[i] - (double)prm->lr * d;
    }
}

void ref_adam_step(double *p, double *m, double *v, int64_t n, const float *p0,
                   const float *m0, const float *v0, const float *g,
                   const ch_adam_params *prm)
{
    double b1 = prm->beta1, b2 = prm->beta2, lr = prm->lr, wd = prm->weight_decay;
    double bc1 = 1.0 - pow(b1, (double)prm->step);
    double bc2 = 1.0 - pow(b2, (double)prm->step);
    for (int64_t i = 0; i < n; i++) {
        double pi = p0[i];
        double gi = prm->decoupled ? g[i] : g[i] + wd * pi;
        if (prm->decoupled)
            pi -= lr * wd * pi;
        m[i] = b1 * m0[i] + (1.0 - b1) * gi;
        v[i] = b2 * v0[i] + (1.0 - b2) * gi * gi;
        p[i] = pi - lr * (m[i] / bc1) / (sqrt(v[i] / bc2) + prm->eps);
    }
}

void ref_rand_uniform(float *y, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t w0, w1;
        chi_philox_words(seed, offset + (uint64_t)i, &w0, &w1);
        y[i] = lo + (hi - lo) * chi_philox_unit(w0);
    }
}

void ref_rand_normal(double *y, int64_t n, uint64_t seed, uint64_t offset, double mean,
                     double std)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t w0, w1;
        chi_philox_words(seed, offset + (uint64_t)i, &w0, &w1);
        double u1 = ((double)(w0 >> 8) + 1.0) / 16777216.0;
        double u2 = (double)(w1 >> 8) / 16777216.0;
        y[i] = mean + std * sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    }
}

void ref_rand_normal_mag(double *mag, int64_t n, uint64_t seed, uint64_t offset, double mean,
                         double std)
{
    for (int64_t i = 0; i < n; i++) {
        uint32_t w0, w1;
        chi_philox_words(seed, offset + (uint64_t)i, &w0, &w1);
        double u1 = ((double)(w0 >> 8) + 1.0) / 16777216.0;
        mag[i] = fabs(mean) + fabs(std) * sqrt(-2.0 * log(u1));
    }
}

void ref_dropout_mask(float *y, int64_t n, uint64_t seed, uint64_t offset, float p)
{
    float keep = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < n; i++) {
        uint32_t w0, w1;
        chi_philox_words(seed, offset + (uint64_t)i, &w0, &w1);
        y[i] = chi_philox_unit(w0) >= p ? keep : 0.0f;
    }
}

static double one_err(double got, double want, double scale)
{
    if (isnan(got) || isnan(want))
        return isnan(got) && isnan(want) ? 0.0 : INFINITY;
    return fabs(got - want) / scale;
}

double ref_err(const float *got, const double *want, const double *mag, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = one_err(got[i], want[i], fmax(mag ? mag[i] : fabs(want[i]), REF_TINY));
        e = d > e ? d : e;
    }
    return e;
}

double ref_err_scaled(const double *got, const double *want, int64_t n, double floor)
{
    double scale = floor;
    for (int64_t i = 0; i < n; i++)
        scale = fmax(scale, fabs(want[i]));
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = one_err(got[i], want[i], scale);
        e = d > e ? d : e;
    }
    return e;
}

/* ---- Test cases ---------------------------------------------------------- */

static uint64_t name_seed(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

void tc_begin(tcase *c, ch_device *dev, const char *fmt, ...)
{
    va_list ap;
    memset(c, 0, sizeof *c);
    c->dev = dev;
    va_start(ap, fmt);
    vsnprintf(c->name, sizeof c->name, fmt, ap);
    va_end(ap);
    c->rng.s = name_seed(c->name);
}

void tc_append(tcase *c, const char *fmt, ...)
{
    size_t at = strlen(c->name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->name + at, sizeof c->name - at, fmt, ap);
    va_end(ap);
}

void tc_check(tcase *c, ch_status st)
{
    if (st == CH_OK || c->st != CH_OK)
        return;
    c->st = st;
    snprintf(c->err, sizeof c->err, "%s (%s)", ch_status_str(st), ch_last_error());
}

void tc_fail(tcase *c, const char *fmt, ...)
{
    va_list ap;
    if (c->st != CH_OK)
        return;
    c->st = CH_ERR_INTERNAL;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

void *tc_alloc(tcase *c, size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p || c->nmem == (int)(sizeof c->mem / sizeof c->mem[0])) {
        printf("Bail out! out of memory or scratch slots in %s\n", c->name);
        exit(1);
    }
    c->mem[c->nmem++] = p;
    return p;
}

float *tc_floats(tcase *c, int64_t n) { return tc_alloc(c, (size_t)n * sizeof(float)); }
double *tc_doubles(tcase *c, int64_t n) { return tc_alloc(c, (size_t)n * sizeof(double)); }
int32_t *tc_ints(tcase *c, int64_t n) { return tc_alloc(c, (size_t)n * sizeof(int32_t)); }

float *tc_random(tcase *c, int64_t n, float lo, float hi)
{
    float *x = tc_floats(c, n);
    for (int64_t i = 0; i < n; i++)
        x[i] = tap_rng_uniform(&c->rng, lo, hi);
    return x;
}

float *tc_abs(tcase *c, const float *x, int64_t n)
{
    float *a = tc_floats(c, n);
    for (int64_t i = 0; i < n; i++)
        a[i] = fabsf(x[i]);
    return a;
}

void tc_track(tcase *c, ch_tensor *t)
{
    if (c->nt == (int)(sizeof c->t / sizeof c->t[0])) {
        printf("Bail out! too many tensors in %s\n", c->name);
        exit(1);
    }
    c->t[c->nt++] = t;
}

ch_tensor *tc_tensor(tcase *c, ch_dtype dtype, int ndim, const int64_t *shape,
                     const void *data)
{
    ch_tensor *t = NULL;
    TC(c, ch_tensor_new(&t, c->dev, dtype, ndim, shape));
    if (!t)
        return NULL;
    tc_track(c, t);
    if (data)
        tc_upload(c, t, data);
    return t;
}

ch_tensor *tc_view(tcase *c, ch_tensor *src, int64_t start, int64_t count)
{
    ch_tensor *v = NULL;
    TC(c, ch_tensor_view(&v, src, start, count));
    if (v)
        tc_track(c, v);
    return v;
}

void tc_upload(tcase *c, ch_tensor *t, const void *data)
{
    TC(c, ch_tensor_upload(t, data, ch_tensor_nbytes(t)));
}

void *tc_fetch(tcase *c, const ch_tensor *t, int64_t n)
{
    void *host = tc_alloc(c, (size_t)n * 4);
    tc_download(c, t, host, n);
    return host;
}

void tc_download(tcase *c, const ch_tensor *t, void *host, int64_t n)
{
    if (t)
        TC(c, ch_tensor_download(t, host, (size_t)n * 4));
}

double *tc_widen(tcase *c, const float *x, int64_t n)
{
    double *d = tc_doubles(c, n);
    for (int64_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

void tc_central_diff(tcase *c, tc_objective objective, const void *ctx, ch_tensor *t,
                     const float *x, int64_t count, float h, double *want)
{
    float *v = tc_floats(c, count);
    memcpy(v, x, (size_t)count * sizeof *v);
    for (int64_t i = 0; i < count && c->st == CH_OK; i++) {
        v[i] = x[i] + h;
        double up = objective(c, ctx, t, v), hi = v[i];
        v[i] = x[i] - h;
        double down = objective(c, ctx, t, v);
        want[i] = (up - down) / (hi - v[i]);
        v[i] = x[i];
    }
    tc_upload(c, t, x);
}

double ref_dot(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

double ref_dot_abs(const float *a, const float *b, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += fabs((double)a[i] * b[i]);
    return s;
}

/* Small sizes also give the case's memory back to the driver: a
 * simulator such as oclgrind's checks every launch against every live
 * buffer, so memory cached from earlier cases would slow every launch
 * after them. */
static void tc_free(tcase *c)
{
    while (c->nt > 0)
        ch_tensor_free(c->t[--c->nt]);
    while (c->nmem > 0)
        free(c->mem[--c->nmem]);
    if (c->dev && tc_small())
        ch_device_empty_cache(c->dev);
}

/* The host backend's results, kept by tc_vs_host for the devices after
 * it: a list, newest first, freed at exit. */
typedef struct host_result {
    struct host_result *next;
    char name[256];
    int64_t n;
    float v[];
} host_result;

static host_result *host_results;

static void host_results_free(void)
{
    while (host_results) {
        host_result *r = host_results;
        host_results = r->next;
        free(r);
    }
}

void tc_vs_host(tcase *c, const float *got, const double *mag, int64_t n, double tol)
{
    if (c->st != CH_OK)
        return; /* the case's own line reports the failed call */
    const char *id = ch_device_id(c->dev);
    if (strncmp(id, "host", 4) == 0) {
        host_result *r = malloc(sizeof *r + (size_t)n * sizeof(float));
        if (!r) {
            tc_fail(c, "tc_vs_host: malloc failed");
            return;
        }
        if (!host_results)
            atexit(host_results_free);
        snprintf(r->name, sizeof r->name, "%s", c->name);
        r->n = n;
        memcpy(r->v, got, (size_t)n * sizeof(float));
        r->next = host_results;
        host_results = r;
        return;
    }
    const host_result *r = host_results;
    while (r && strcmp(r->name, c->name) != 0)
        r = r->next;
    if (!r) {
        tap_skip("%s %s against the host backend: the host did not run it", id, c->name);
        return;
    }
    double err = INFINITY;
    if (r->n == n) {
        err = 0.0;
        for (int64_t i = 0; i < n; i++) {
            double d = one_err(got[i], r->v[i], fmax(mag ? mag[i] : fabs(r->v[i]), REF_TINY));
            err = d > err ? d : err;
        }
    }
    tap_ok(err <= tol, "%s %s against the host backend: err %.3g, want <= %.2g", id, c->name, err,
           tol);
}

int tc_end_err(tcase *c, double err, double tol)
{
    int ok;
    if (c->st != CH_OK)
        ok = tap_ok(0, "%s %s: %s", ch_device_id(c->dev), c->name, c->err);
    else
        ok = tap_ok(err <= tol, "%s %s: err %.3g, want <= %.2g", ch_device_id(c->dev),
                    c->name, err, tol);
    tc_free(c);
    return ok;
}

int tc_end_adjoint(tcase *c, double lhs, double rhs, double scale, double tol)
{
    tc_append(c, " (<Ax,y> %.9g, <x,A^T y> %.9g)", lhs, rhs);
    return tc_end_err(c, fabs(lhs - rhs) / fmax(scale, 1e-30), tol);
}

int tc_end_exact(tcase *c, int ok, const char *detail)
{
    if (c->st != CH_OK)
        ok = tap_ok(0, "%s %s: %s", ch_device_id(c->dev), c->name, c->err);
    else
        ok = tap_ok(ok, "%s %s: %s", ch_device_id(c->dev), c->name, detail);
    tc_free(c);
    return ok;
}

int tc_end_words(tcase *c, const void *got, const void *want, int64_t n, int is_float)
{
    char detail[256];
    int64_t bad = ref_diff_words(got, want, n, is_float, detail, sizeof detail);
    return tc_end_exact(c, bad == 0, detail);
}

int64_t ref_diff_words(const void *got, const void *want, int64_t n, int is_float, char *out,
                       size_t outlen)
{
    const char *g = got, *w = want;
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (memcmp(g + 4 * i, w + 4 * i, 4) != 0) {
            bad++;
            first = first < 0 ? i : first;
        }
    if (bad == 0) {
        snprintf(out, outlen, "all %" PRId64 " elements exact", n);
    } else if (is_float) {
        float gf, wf;
        memcpy(&gf, g + 4 * first, 4);
        memcpy(&wf, w + 4 * first, 4);
        snprintf(out, outlen, "%" PRId64 " of %" PRId64 " differ, first [%" PRId64
                 "]: got %.9g, want %.9g", bad, n, first, gf, wf);
    } else {
        int32_t gi, wi;
        memcpy(&gi, g + 4 * first, 4);
        memcpy(&wi, w + 4 * first, 4);
        snprintf(out, outlen, "%" PRId64 " of %" PRId64 " differ, first [%" PRId64
                 "]: got %" PRId32 ", want %" PRId32, bad, n, first, gi, wi);
    }
    return bad;
}

void tc_skip_missing_backends(void)
{
    for (int i = 0; i < ch_backend_count(); i++) {
        ch_backend_info info;
        if (ch_backend_get_info(i, &info) != CH_OK)
            continue;
        if (!info.available)
            tap_skip("%s backend unavailable: %s", info.name, info.detail);
        else if (info.device_count == 0)
            tap_skip("%s backend has no device", info.name);
    }
}

int tc_small(void)
{
    static int small = -1;
    if (small >= 0)
        return small;
    const char *v = getenv("CHORUS_TEST_SIZES");
    small = v && strcmp(v, "small") == 0;
    if (small)
        tap_diag("CHORUS_TEST_SIZES=small: the largest cases left out or made smaller");
    else if (v && *v && strcmp(v, "full") != 0)
        tap_ok(0, "CHORUS_TEST_SIZES=%s: expected \"small\" or \"full\"", v);
    return small;
}

int64_t ref_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

void ref_shape_str(char *out, size_t len, int ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < ndim && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, i ? ",%" PRId64 : "%" PRId64, shape[i]);
    if (at < len)
        snprintf(out + at, len - at, "]");
}

/* ref.h says what it computes. */
void ref_attention(const attn_ref *r, const float *q, const float *k, const float *v,
                   const float *dout, int64_t b, int64_t t, int64_t hd, double scale, double *p,
                   double *dp)
{
    for (int64_t m = 0; m < b; m++) {
        const float *qm = q + m * t * hd, *km = k + m * t * hd, *vm = v + m * t * hd;
        for (int64_t i = 0; i < t; i++) {
            double max = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j <= i; j++) {
                double sc = 0.0;
                for (int64_t d = 0; d < hd; d++)
                    sc += (double)qm[i * hd + d] * km[j * hd + d];
                p[i * t + j] = sc * scale;
                max = fmax(max, p[i * t + j]);
            }
            for (int64_t j = 0; j <= i; j++)
                sum += exp(p[i * t + j] - max);
            r->lse[m * t + i] = max + log(sum);
            for (int64_t d = 0; d < hd; d++) {
                double acc = 0.0, mag = 0.0;
                for (int64_t j = 0; j <= i; j++) {
                    double pj = exp(p[i * t + j] - max) / sum;
                    acc += pj * vm[j * hd + d];
                    mag += pj * fabs(vm[j * hd + d]) * (1.0 + fabs(p[i * t + j] - max));
                }
                r->o[(m * t + i) * hd + d] = acc;
                if (r->mag)
                    r->mag[(m * t + i) * hd + d] = mag;
            }
            for (int64_t j = 0; j <= i; j++)
                p[i * t + j] = exp(p[i * t + j] - max) / sum;
        }
        if (!dout)
            continue;
        const float *g = dout + m * t * hd;
        double *dq = r->dq + m * t * hd, *dk = r->dk + m * t * hd, *dv = r->dv + m * t * hd;
        memset(dq, 0, (size_t)(t * hd) * sizeof *dq);
        memset(dk, 0, (size_t)(t * hd) * sizeof *dk);
        memset(dv, 0, (size_t)(t * hd) * sizeof *dv);
        for (int64_t i = 0; i < t; i++) {
            double dsum = 0.0;
            for (int64_t j = 0; j <= i; j++) {
                double x = 0.0;
                for (int64_t d = 0; d < hd; d++) {
                    x += (double)g[i * hd + d] * vm[j * hd + d];
                    dv[j * hd + d] += p[i * t + j] * g[i * hd + d];
                }
                dp[j] = x;
                dsum += p[i * t + j] * x;
            }
            for (int64_t j = 0; j <= i; j++) {
                double ds = p[i * t + j] * (dp[j] - dsum) * scale;
                for (int64_t d = 0; d < hd; d++) {
                    dq[i * hd + d] += ds * km[j * hd + d];
                    dk[j * hd + d] += ds * qm[i * hd + d];
                }
            }
        }
    }
}
