/* The host's attention ops: batched GEMM (one GEMM per matrix), permute,
 * the row softmax with its causal mask, and the embedding gather and its
 * backward.
 *
 * Each output element is computed by one thread in an order fixed by the
 * shape alone, so results are the same bits whatever the thread count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "kernels/index.h"

/* ---- batched GEMM ------------------------------------------------------------ */

/* Matrices of fewer multiply-adds than this are shared out among the
 * threads, each multiplied on one thread; larger ones go one after the
 * other, each using every thread. OpenBLAS multiplies the small ones on a
 * single thread anyway (measured here: 96 x 96 x 64 on one, 128 x 128 x 64
 * on both cores), so in turn they would keep one core busy; attention's
 * (T x T x head size, 64 x 64 x 32 in a small GPT) are far below. */
#define BATCH_PAR_MAX_FLOPS (128 * 128 * 64)

typedef struct batch_gemm {
    int trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    ch_bmem a, b, c;
    int64_t lda, ldb, ldc, stride_a, stride_b, stride_c;
} batch_gemm;

/* Matrix i: each on one thread inside the shared-out loop (`serial`), with
 * every thread one after the other. */
static ch_status batch_gemm_one(const batch_gemm *g, int64_t i, int serial)
{
    ch_bmem a = {g->a.ptr, g->a.off + (size_t)(i * g->stride_a) * sizeof(float)};
    ch_bmem b = {g->b.ptr, g->b.off + (size_t)(i * g->stride_b) * sizeof(float)};
    ch_bmem c = {g->c.ptr, g->c.off + (size_t)(i * g->stride_c) * sizeof(float)};
    if (serial)
        return chi_host_gemm_serial(g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha,
                                    chi_host_f32(a), g->lda, chi_host_f32(b), g->ldb, g->beta,
                                    chi_host_f32(c), g->ldc);
    return chi_host_gemm(NULL, g->trans_a, g->trans_b, g->m, g->n, g->k, g->alpha, a, g->lda, b,
                         g->ldb, g->beta, c, g->ldc);
}

/* The matrices shared out. A failure's message is the failing thread's:
 * it is kept for the caller's. */
static ch_status batch_gemm_shared(const batch_gemm *g, int64_t count)
{
    ch_status st = CH_OK;
    char why[512] = "";
    CHI_OMP(omp parallel for schedule(static))
    for (int64_t i = 0; i < count; i++) {
        ch_status sti = batch_gemm_one(g, i, 1);
        if (sti != CH_OK) {
            CHI_OMP(omp critical)
            {
                st = sti;
                snprintf(why, sizeof why, "%s", ch_last_error());
            }
        }
    }
    return st == CH_OK ? CH_OK : chi_error(st, "%s", why);
}

ch_status chi_host_gemm_batched(void *stream, int trans_a, int trans_b, int64_t count,
                                int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a,
                                int64_t lda, int64_t stride_a, ch_bmem b, int64_t ldb,
                                int64_t stride_b, float beta, ch_bmem c, int64_t ldc,
                                int64_t stride_c)
{
    (void)stream;
    batch_gemm g = {trans_a, trans_b, m, n, k, alpha, beta, a, b, c,
                    lda, ldb, ldc, stride_a, stride_b, stride_c};
    if (count > 1 && (double)m * n * k < BATCH_PAR_MAX_FLOPS)
        return batch_gemm_shared(&g, count);
    /* A plain loop, not a parallel region with an if clause: OpenBLAS
     * called inside an inactive region ran 50 times slower (measured). */
    for (int64_t i = 0; i < count; i++)
        TRY(batch_gemm_one(&g, i, 0));
    return CH_OK;
}

/* ---- permute ------------------------------------------------------------------- */

/* y walked in order, as rows of its last dimension: row r's first element
 * comes from x at the offset its index names, and the row from x's
 * elements `step` apart (1 when the last dimension stays last, as in the
 * attention's permutes: one memcpy per row). */
ch_status chi_host_permute(void *stream, int ndim, const int64_t *xshape, const int *perm,
                           ch_bmem y, ch_bmem x)
{
    (void)stream;
    int64_t shape[CH_MAX_DIMS], stride[CH_MAX_DIMS];
    int64_t numel = chk_permute_plan(ndim, xshape, perm, shape, stride);
    int64_t len = shape[ndim - 1], step = stride[ndim - 1], rows = numel / len;
    uint32_t *py = (uint32_t *)chi_host_f32(y);
    const uint32_t *px = (const uint32_t *)chi_host_f32(x);
    /* Each thread takes a run of rows: the first row's offset in x is
     * index.h's chk_permute_src, the next ones are counted (an odometer
     * over the outer dimensions); the rows are short (a head's 32 or 64
     * floats), so they are copied inline rather than by a memcpy call
     * each. */
    CHI_OMP(omp parallel if (numel > CHI_HOST_PAR_MIN))
    {
        int nt = chi_omp_threads(), t = chi_omp_thread();
        int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
        int64_t idx[CH_MAX_DIMS] = {0}, off = chk_permute_src_64(r0 * len, ndim, shape, stride);
        for (int64_t d = ndim - 2, rest = r0; d >= 0; d--) {
            idx[d] = rest % shape[d];
            rest /= shape[d];
        }
        for (int64_t r = r0; r < r1; r++) {
            uint32_t *restrict dst = py + r * len;
            const uint32_t *restrict src = px + off;
            if (step == 1) {
                CHI_OMP(omp simd)
                for (int64_t j = 0; j < len; j++)
                    dst[j] = src[j];
            } else {
                for (int64_t j = 0; j < len; j++)
                    dst[j] = src[j * step];
            }
            for (int d = ndim - 2; d >= 0; d--) {
                off += stride[d];
                if (++idx[d] < shape[d])
                    break;
                off -= idx[d] * stride[d];
                idx[d] = 0;
            }
        }
    }
    return CH_OK;
}

/* ---- softmax --------------------------------------------------------------------- */

/* The columns row r keeps: all, or with the causal mask those up to its
 * own position t plus the s - t_rows columns before the matrix's first row
 * (backend.h). */
static int64_t row_width(int64_t r, int64_t s, int causal, int64_t rows_per_matrix)
{
    return causal ? r % rows_per_matrix + s - rows_per_matrix + 1 : s;
}

/* Four floats, four i32 and four doubles at once (GCC's vector extensions,
 * as in gemm.c: SSE2, NEON or plain C). */
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v4i __attribute__((vector_size(16)));
typedef double v4d __attribute__((vector_size(32)));

static inline v4i bits_of(v4f x)
{
    v4i b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static inline v4f float_of(v4i b)
{
    v4f x;
    memcpy(&x, &b, sizeof x);
    return x;
}

/* exp(x) for x <= 0, four at a time and without a call (a call to expf per
 * element costs several times the rest of the softmax). x = n ln 2 + r
 * with |r| <= ln 2 / 2 (n rounded by adding and subtracting 1.5 * 2^23;
 * ln 2 split so that n ln2_hi is exact), e^r by its Taylor series to r^7
 * (the next term is below 6e-9 relative), times 2^n through the exponent
 * bits. Checked against exp in double for every float in [-87.34, 0]:
 * within 1.22 ulp. Below -87.34 the result would not be a normal float
 * and is 0 (-inf included); NaN stays NaN. */
static inline v4f exp_nonpositive(v4f x)
{
    const float log2e = 1.44269504088896341f, round = 12582912.0f;
    const float ln2_hi = 0.693145751953125f, ln2_lo = 1.428606765330187e-06f;
    v4i in_range = x >= -88.0f, nan = x != x, tiny = x < -87.33654f;
    /* Out of range (and NaN) inputs go through as -88: n stays an int. */
    v4f xc = float_of((bits_of(x) & in_range) | (bits_of((v4f){0} - 88.0f) & ~in_range));
    v4f n = (xc * log2e + round) - round;
    v4f r = (xc - n * ln2_hi) - n * ln2_lo;
    v4f p = (v4f){0} + 1.0f / 5040;
    p = p * r + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    v4i scale = (__builtin_convertvector(n, v4i) + 127) * (1 << 23);
    v4f e = p * float_of(scale);
    return float_of((bits_of(e) & ~tiny & ~nan) | (bits_of(x) & nan));
}

/* Four floats from x[0..count); past count (the tail of a row), `fill`. */
static inline v4f load4(const float *x, int64_t count, float fill)
{
    v4f v;
    if (count >= 4) {
        memcpy(&v, x, sizeof v);
        return v;
    }
    v = (v4f){0} + fill;
    for (int64_t l = 0; l < count; l++)
        v[l] = x[l];
    return v;
}

static inline void store4(float *y, v4f v, int64_t count)
{
    if (count >= 4)
        memcpy(y, &v, sizeof v);
    else
        for (int64_t l = 0; l < count; l++)
            y[l] = v[l];
}

static inline double sum4d(const v4d *v)
{
    return ((*v)[0] + (*v)[1]) + ((*v)[2] + (*v)[3]);
}

/* The larger of a and b in each lane (a where b is NaN). */
static inline v4f max4(v4f a, v4f b)
{
    v4i take_b = b > a;
    return float_of((bits_of(b) & take_b) | (bits_of(a) & ~take_b));
}

static float row_max(const float *x, int64_t w)
{
    v4f m = (v4f){0} - INFINITY;
    for (int64_t j = 0; j < w; j += 4)
        m = max4(m, load4(x + j, w - j, -INFINITY));
    m = max4(m, __builtin_shufflevector(m, m, 2, 3, 0, 1));
    m = max4(m, __builtin_shufflevector(m, m, 1, 0, 3, 2));
    return m[0];
}

/* y[0..w) = exp(x - max) / sum, y[w..s) = 0. x may be y: each element is
 * read before it is written. The sum is in double, by blocks of four
 * added alternately into two accumulators: a fixed order. */
static void softmax_row(float *y, const float *x, int64_t s, int64_t w)
{
    float max = row_max(x, w);
    v4d even = {0}, odd = {0};
    for (int64_t j = 0; j < w; j += 8) {
        v4f e = exp_nonpositive(load4(x + j, w - j, -INFINITY) - max);
        store4(y + j, e, w - j);
        even += __builtin_convertvector(e, v4d);
        if (j + 4 < w) {
            e = exp_nonpositive(load4(x + j + 4, w - j - 4, -INFINITY) - max);
            store4(y + j + 4, e, w - j - 4);
            odd += __builtin_convertvector(e, v4d);
        }
    }
    even += odd;
    float inv = (float)(1.0 / sum4d(&even));
    for (int64_t j = 0; j < w; j += 4)
        store4(y + j, load4(y + j, w - j, 0.0f) * inv, w - j);
    for (int64_t j = w; j < s; j++)
        y[j] = 0.0f;
}

ch_status chi_host_softmax(void *stream, int64_t rows, int64_t s, int causal,
                           int64_t rows_per_matrix, ch_bmem y, ch_bmem x)
{
    (void)stream;
    float *py = chi_host_f32(y);
    const float *px = chi_host_f32(x);
    CHI_OMP(omp parallel for schedule(static) if (rows * s > CHI_HOST_PAR_MIN / 16))
    for (int64_t r = 0; r < rows; r++)
        softmax_row(py + r * s, px + r * s, s, row_width(r, s, causal, rows_per_matrix));
    return CH_OK;
}

/* <g, p> over a row, in double in softmax_row's order. */
static double row_dot(const float *g, const float *p, int64_t s)
{
    v4d even = {0}, odd = {0};
    for (int64_t j = 0; j < s; j += 8) {
        even += __builtin_convertvector(load4(g + j, s - j, 0.0f), v4d) *
                __builtin_convertvector(load4(p + j, s - j, 0.0f), v4d);
        if (j + 4 < s)
            odd += __builtin_convertvector(load4(g + j + 4, s - j - 4, 0.0f), v4d) *
                   __builtin_convertvector(load4(p + j + 4, s - j - 4, 0.0f), v4d);
    }
    even += odd;
    return sum4d(&even);
}

/* dx = y (dy - <dy, y>) by row; dx may be dy (the dot product comes first). */
ch_status chi_host_softmax_backward(void *stream, int64_t rows, int64_t s, ch_bmem dx,
                                    ch_bmem dy, ch_bmem y)
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

/* ---- embedding ------------------------------------------------------------------- */

ch_status chi_host_embedding(void *stream, int64_t n, int64_t v, int64_t d, ch_bmem y,
                             ch_bmem table, ch_bmem idx)
{
    (void)stream;
    float *py = chi_host_f32(y);
    const float *pt = chi_host_f32(table);
    const int32_t *pi = chi_host_i32(idx);
    CHI_OMP(omp parallel for schedule(static) if (n * d > CHI_HOST_PAR_MIN))
    for (int64_t i = 0; i < n; i++) {
        if (pi[i] >= 0 && pi[i] < v)
            memcpy(py + i * d, pt + pi[i] * d, (size_t)d * sizeof *py);
        else
            memset(py + i * d, 0, (size_t)d * sizeof *py);
    }
    for (int64_t i = 0; i < n; i++)
        if (pi[i] < 0 || pi[i] >= v)
            return chi_bad_index("ch_embedding", i, pi[i], v);
    return CH_OK;
}

/* The positions of each row of the table, in increasing order (a counting
 * sort): row r's are order[first[r] .. first[r + 1]). Indices out of range
 * are left out. */
static ch_status rows_of_table(int64_t n, int64_t v, const int32_t *idx, int64_t **first_out,
                               int64_t **order_out)
{
    int64_t *first = calloc((size_t)v + 1, sizeof *first);
    int64_t *order = malloc((size_t)n * sizeof *order);
    if (!first || !order) {
        free(first);
        free(order);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_embedding_backward: no memory to sort %lld "
                         "indices into %lld rows", (long long)n, (long long)v);
    }
    for (int64_t i = 0; i < n; i++)
        if (idx[i] >= 0 && idx[i] < v)
            first[idx[i] + 1]++;
    for (int64_t r = 0; r < v; r++)
        first[r + 1] += first[r];
    for (int64_t i = 0, *next = first; i < n; i++)
        if (idx[i] >= 0 && idx[i] < v)
            order[next[idx[i]]++] = i;
    /* Filling moved each first[r] to the start of row r + 1: move back. */
    memmove(first + 1, first, (size_t)v * sizeof *first);
    first[0] = 0;
    *first_out = first;
    *order_out = order;
    return CH_OK;
}

/* Columns summed side by side: a block of a row stays in registers or L1. */
#define EMB_COLS 256

/* dtable[r, :] += the sum, in float and in increasing position, of the dy
 * rows at order[0..count): the order and rounding of the device kernels,
 * so every backend gives the same bits. */
static void embedding_row_grad(float *dtable_row, const float *dy, int64_t d,
                               const int64_t *order, int64_t count)
{
    for (int64_t j0 = 0; j0 < d; j0 += EMB_COLS) {
        int64_t w = d - j0 < EMB_COLS ? d - j0 : EMB_COLS;
        float acc[EMB_COLS] = {0};
        for (int64_t p = 0; p < count; p++) {
            const float *row = dy + order[p] * d + j0;
            CHI_OMP(omp simd)
            for (int64_t j = 0; j < w; j++)
                acc[j] += row[j];
        }
        for (int64_t j = 0; j < w; j++)
            dtable_row[j0 + j] += acc[j];
    }
}

ch_status chi_host_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d,
                                      ch_bmem dtable, ch_bmem dy, ch_bmem idx)
{
    (void)stream;
    int64_t *first = NULL, *order = NULL;
    ch_status st = rows_of_table(n, v, chi_host_i32(idx), &first, &order);
    if (st != CH_OK)
        return st;
    float *pdt = chi_host_f32(dtable);
    const float *pdy = chi_host_f32(dy);
    /* Rows hold very different counts (a space against a rare letter):
     * dynamic scheduling evens the threads out; each row still has one. */
    CHI_OMP(omp parallel for schedule(dynamic, 8) if (n * d > CHI_HOST_PAR_MIN))
    for (int64_t r = 0; r < v; r++)
        if (first[r + 1] > first[r])
            embedding_row_grad(pdt + r * d, pdy, d, order + first[r], first[r + 1] - first[r]);
    free(first);
    free(order);
    return CH_OK;
}
