/* The host's softmax ops: ch_softmax (rows, with the causal mask) and its
 * backward, and the fused softmax-cross-entropy: forward and backward,
 * and both in one pass in place.
 * Each row is one thread's (the exponentials vectorised in float, their
 * sum and the loss in double), so the result is the same bits whatever
 * the thread count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "kernels/half_bits.h"
#include "kernels/xent.h"
#include "vec.h"

/* ---- softmax ------------------------------------------------------------------ */

/* The columns row r keeps: all, or with the causal mask those up to its
 * own position t plus the s - t_rows columns before the matrix's first row
 * (backend.h). */
static int64_t row_width(int64_t r, int64_t s, int causal, int64_t rows_per_matrix)
{
    return causal ? r % rows_per_matrix + s - rows_per_matrix + 1 : s;
}

/* v[0..count) to y, four at a time or, in a row's tail, one by one. */
static inline void store4(float *y, v4f v, int64_t count)
{
    if (count >= 4)
        memcpy(y, &v, sizeof v);
    else
        for (int64_t l = 0; l < count; l++)
            y[l] = v[l];
}

/* The four lanes as (0 + 1) + (2 + 3): these rows' own order (not
 * CHI_LANES_TOTAL's), which ch_softmax's and the loss's bits follow. */
static inline double sum4d(const v4d *v)
{
    return ((*v)[0] + (*v)[1]) + ((*v)[2] + (*v)[3]);
}

/* y[0..w) = exp(x - max) / sum, y[w..s) = 0. x may be y: each element is
 * read before it is written. The sum is in double, by blocks of four
 * added alternately into two accumulators: a fixed order. Returns the
 * sum; *max_out (when not NULL) gets the row's max (the softmax loss's
 * log-sum-exp). */
static double softmax_row(float *y, const float *x, int64_t s, int64_t w, float *max_out)
{
    float max = chi_row_max4(x, w);
    if (max_out)
        *max_out = max;
    v4d even = {0}, odd = {0};
    for (int64_t j = 0; j < w; j += 8) {
        v4f e = chi_exp4_nonpositive(chi_load4(x + j, w - j, -INFINITY) - max);
        store4(y + j, e, w - j);
        even += __builtin_convertvector(e, v4d);
        if (j + 4 < w) {
            e = chi_exp4_nonpositive(chi_load4(x + j + 4, w - j - 4, -INFINITY) - max);
            store4(y + j + 4, e, w - j - 4);
            odd += __builtin_convertvector(e, v4d);
        }
    }
    even += odd;
    double sum = sum4d(&even);
    float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < w; j += 4)
        store4(y + j, chi_load4(y + j, w - j, 0.0f) * inv, w - j);
    for (int64_t j = w; j < s; j++)
        y[j] = 0.0f;
    return sum;
}

ch_status chi_host_softmax(void *stream, int64_t rows, int64_t s, int causal,
                           int64_t rows_per_matrix, ch_bmem y, ch_bmem x)
{
    (void)stream;
    float *py = chi_host_f32(y);
    const float *px = chi_host_f32(x);
    CHI_OMP(omp parallel for schedule(static) if (rows * s > CHI_HOST_PAR_MIN / 16))
    for (int64_t r = 0; r < rows; r++)
        softmax_row(py + r * s, px + r * s, s, row_width(r, s, causal, rows_per_matrix), NULL);
    return CH_OK;
}

/* <g, p> over a row, in double in softmax_row's order. */
static double row_dot(const float *g, const float *p, int64_t s)
{
    v4d even = {0}, odd = {0};
    for (int64_t j = 0; j < s; j += 8) {
        even += __builtin_convertvector(chi_load4(g + j, s - j, 0.0f), v4d) *
                __builtin_convertvector(chi_load4(p + j, s - j, 0.0f), v4d);
        if (j + 4 < s)
            odd += __builtin_convertvector(chi_load4(g + j + 4, s - j - 4, 0.0f), v4d) *
                   __builtin_convertvector(chi_load4(p + j + 4, s - j - 4, 0.0f), v4d);
    }
    even += odd;
    return sum4d(&even);
}

/* dx = y (dy - <dy, y>) by row; dx may be dy (the dot product comes first). */
ch_status chi_host_softmax_backward(void *stream, int64_t rows, int64_t s, ch_bmem dx, ch_bmem dy,
                                    ch_bmem y)
{
    (void)stream;
    float *pdx = chi_host_f32(dx);
    const float *pdy = chi_host_f32(dy), *py = chi_host_f32(y);
    CHI_OMP(omp parallel for schedule(static) if (rows * s > CHI_HOST_PAR_MIN / 4))
    for (int64_t r = 0; r < rows; r++) {
        const float *g = pdy + r * s, *p = py + r * s;
        float d = (float)row_dot(g, p, s);
        float *out = pdx + r * s;
        CHI_OMP(omp simd)
        for (int64_t j = 0; j < s; j++)
            out[j] = p[j] * (g[j] - d);
    }
    return CH_OK;
}

/* ---- softmax cross-entropy ------------------------------------------------------ */

/* Labels outside [0, C) are an error on every backend (ops.h); the message
 * names the first, as the device backends' do. */
static ch_status check_labels(const char *fn, const int32_t *labels, int64_t n,
                              int64_t c)
{
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= c)
            return chi_bad_label(fn, i, labels[i], c);
    return CH_OK;
}

/* One row: probs = softmax(logits) (softmax_row: the max taken off, the
 * vectorised exp, the sum in double); returns -log probs[label] =
 * log(sum) - (logits[label] - max). */
static double xent_row(float *probs, const float *logits, int64_t c, int32_t label)
{
    float max;
    double sum = softmax_row(probs, logits, c, c, &max);
    return log(sum) - ((double)logits[label] - max);
}

ch_status chi_host_softmax_xent(void *stream, int64_t n, int64_t c, ch_bmem loss,
                                ch_bmem probs, ch_bmem logits, ch_bmem labels)
{
    (void)stream;
    const int32_t *pl = chi_host_i32(labels);
    ch_status st = check_labels("ch_softmax_xent", pl, n, c);
    if (st != CH_OK)
        return st;
    double *row_loss = malloc((size_t)n * sizeof *row_loss);
    if (!row_loss)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "softmax_xent: malloc(%zu) failed",
                         (size_t)n * sizeof *row_loss);
    float *pp = chi_host_f32(probs);
    const float *px = chi_host_f32(logits);
    CHI_OMP(omp parallel for if (n * c > CHI_HOST_PAR_MIN / 16))
    for (int64_t i = 0; i < n; i++)
        row_loss[i] = xent_row(pp + i * c, px + i * c, c, pl[i]);
    double total = 0.0;
    for (int64_t i = 0; i < n; i++)
        total += row_loss[i];
    free(row_loss);
    chi_host_f32(loss)[0] = (float)(total / (double)n);
    return CH_OK;
}

ch_status chi_host_softmax_xent_backward(void *stream, int64_t n, int64_t c,
                                         ch_bmem dlogits, ch_bmem probs,
                                         ch_bmem labels, float scale)
{
    (void)stream;
    const int32_t *pl = chi_host_i32(labels);
    ch_status st = check_labels("ch_softmax_xent_backward", pl, n, c);
    if (st != CH_OK)
        return st;
    float *pd = chi_host_f32(dlogits);
    const float *pp = chi_host_f32(probs);
    double k = chk_xent_scale(scale, (double)n);
    CHI_OMP(omp parallel for if (n * c > CHI_HOST_PAR_MIN))
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            pd[i * c + j] = chk_xent_grad(pp[i * c + j], j == pl[i], k);
    return CH_OK;
}

/* One row of softmax_xent_fused, f32 in w: softmax_row in place, then
 * the gradient over it; returns the row's loss. */
static double xent_fused_row(float *w, int64_t c, int32_t label, double k)
{
    float max, at_label = w[label];
    double sum = softmax_row(w, w, c, c, &max);
    for (int64_t j = 0; j < c; j++)
        w[j] = chk_xent_grad(w[j], j == label, k);
    return log(sum) - ((double)at_label - max);
}

/* A half row widened into w, worked on there, and the gradient narrowed
 * back into it. */
static double xent_fused_half_row(uint16_t *h, float *w, int64_t c, int32_t label, double k,
                                  int bf16)
{
    for (int64_t j = 0; j < c; j++)
        w[j] = chk_bits_f32(bf16 ? chk_bf16_to_f32(h[j]) : chk_f16_to_f32(h[j]));
    double loss = xent_fused_row(w, c, label, k);
    for (int64_t j = 0; j < c; j++)
        h[j] = bf16 ? chk_f32_to_bf16(chk_f32_bits(w[j])) : chk_f32_to_f16(chk_f32_bits(w[j]));
    return loss;
}

ch_status chi_host_softmax_xent_fused(void *stream, int64_t n, int64_t c, ch_dtype dt, float scale,
                                      ch_bmem loss, ch_bmem logits, ch_bmem labels)
{
    static const char fn[] = "ch_softmax_xent_fused";
    if (dt != CH_F32 && dt != CH_BF16 && dt != CH_F16)
        return chi_error(CH_ERR_UNSUPPORTED, "host softmax_xent_fused: dtype %d", (int)dt);
    const int32_t *pl = chi_host_i32(labels);
    ch_status st = check_labels(fn, pl, n, c);
    if (st != CH_OK)
        return st;
    /* The row losses, then (half formats) a row of f32 per thread. */
    int threads = dt == CH_F32 ? 0 : chi_omp_max_threads();
    chi_host_scratch sc;
    st = chi_host_scratch_take(
        stream, (size_t)n * sizeof(double) + (size_t)threads * (size_t)c * sizeof(float), &sc);
    if (st != CH_OK)
        return st;
    double *row_loss = sc.mem, k = chk_xent_scale(scale, (double)n);
    float *rows = (float *)(row_loss + n);
    char *x = (char *)logits.ptr + logits.off;
    int par = n * c > CHI_HOST_PAR_MIN / 16;
    if (dt == CH_F32) {
        CHI_OMP(omp parallel for if (par))
        for (int64_t i = 0; i < n; i++)
            row_loss[i] = xent_fused_row((float *)x + i * c, c, pl[i], k);
    } else {
        CHI_OMP(omp parallel for if (par))
        for (int64_t i = 0; i < n; i++)
            row_loss[i] = xent_fused_half_row((uint16_t *)x + i * c, rows + chi_omp_thread() * c, c,
                                              pl[i], k, dt == CH_BF16);
    }
    double total = 0.0;
    for (int64_t i = 0; i < n; i++)
        total += row_loss[i];
    chi_host_scratch_give(&sc);
    chi_host_f32(loss)[0] = (float)(total / (double)n);
    return CH_OK;
}
