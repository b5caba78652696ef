/* Host ops that combine many elements along an axis: sums, means, argmax
 * and bias gradients.
 *
 * Every result is the same bits whatever the thread count: each output
 * element is summed by one thread in a fixed order, and a long sum is cut
 * into chunks of a fixed length whose partial sums are added in order.
 * Sums run in double. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdlib.h>

#include "host.h"
#include "vec.h"

#define SUM_CHUNK 8192 /* elements per partial sum of a long reduction */
#define COL_BLOCK 64   /* outputs one task sums side by side (strided sums) */
#define ROW_RUN 16     /* rows summed in float before a double add (bias_grad) */
/* A Linear's bias gradient (bias_grad): a task sums PART_ROWS whole rows,
 * or, with that many rows or fewer, ROW_BLOCK columns down them. 64
 * columns (256 bytes) of rows 12 KiB apart (GPT-2's MLP) cost a TLB miss
 * per 256 bytes, many times slower than reading the rows along; and 128
 * columns (the small GPT's width) were one task for one thread. */
#define ROW_BLOCK 256
#define PART_ROWS 64

/* x[0..len) in double, in CHI_LANES interleaved accumulators added
 * pairwise (vec.h): a fixed order that still lets the compiler
 * vectorise. */
static double chunk_sum(const float *x, int64_t len)
{
    double lane[CHI_LANES] = {0};
    int64_t i = 0;
    for (; i + CHI_LANES <= len; i += CHI_LANES)
        for (int l = 0; l < CHI_LANES; l++)
            lane[l] += x[i + l];
    for (int l = 0; i < len; i++, l++)
        lane[l] += x[i];
    return chi_lanes_total(lane);
}

/* The sum of x[0..n) as the chunks in order; one thread. */
static double sum_contig(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i += SUM_CHUNK)
        s += chunk_sum(x + i, n - i < SUM_CHUNK ? n - i : SUM_CHUNK);
    return s;
}

/* The same sum with the chunks spread over the threads: the same bits as
 * sum_contig. */
static ch_status sum_contig_parallel(const float *x, int64_t n, double *out)
{
    int64_t chunks = (n + SUM_CHUNK - 1) / SUM_CHUNK;
    double *part = malloc((size_t)chunks * sizeof *part);
    if (!part)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host sum_axis: malloc(%zu) failed",
                         (size_t)chunks * sizeof *part);
    CHI_OMP(omp parallel for if (n > CHI_HOST_PAR_MIN))
    for (int64_t c = 0; c < chunks; c++) {
        int64_t i = c * SUM_CHUNK;
        part[c] = chunk_sum(x + i, n - i < SUM_CHUNK ? n - i : SUM_CHUNK);
    }
    double s = 0.0;
    for (int64_t c = 0; c < chunks; c++)
        s += part[c];
    free(part);
    *out = s;
    return CH_OK;
}

/* y[t] = scale * sum over j of x[j * stride + t], t < count <= COL_BLOCK:
 * count neighbouring strided sums at once, reading x row by row. */
static void sum_strided_block(float *y, const float *x, int64_t n, int64_t stride,
                              int64_t count, double scale)
{
    double acc[COL_BLOCK] = {0};
    for (int64_t j = 0; j < n; j++)
        for (int64_t t = 0; t < count; t++)
            acc[t] += x[j * stride + t];
    for (int64_t t = 0; t < count; t++)
        y[t] = (float)(acc[t] * scale);
}

ch_status chi_host_sum_axis(void *stream, ch_axis_op op, int64_t outer, int64_t n,
                            int64_t inner, ch_bmem y, ch_bmem x)
{
    (void)stream;
    if (!chi_enum_known((int)op, CH_AXIS_COUNT))
        return chi_unknown_enum("host", "sum_axis", "ch_axis_op", (int)op, CH_AXIS_COUNT);
    float *py = chi_host_f32(y);
    const float *px = chi_host_f32(x);
    double scale = op == CH_AXIS_MEAN ? 1.0 / (double)n : 1.0;
    if (inner == 1 && outer == 1) {
        double s = 0.0;
        ch_status st = sum_contig_parallel(px, n, &s);
        if (st == CH_OK)
            py[0] = (float)(s * scale);
        return st;
    }
    if (inner == 1) {
        CHI_OMP(omp parallel for if (outer * n > CHI_HOST_PAR_MIN))
        for (int64_t o = 0; o < outer; o++)
            py[o] = (float)(sum_contig(px + o * n, n) * scale);
        return CH_OK;
    }
    int64_t blocks = (inner + COL_BLOCK - 1) / COL_BLOCK;
    CHI_OMP(omp parallel for collapse(2) if (outer * n * inner > CHI_HOST_PAR_MIN))
    for (int64_t o = 0; o < outer; o++)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t t0 = b * COL_BLOCK;
            int64_t count = inner - t0 < COL_BLOCK ? inner - t0 : COL_BLOCK;
            sum_strided_block(py + o * inner + t0, px + o * n * inner + t0, n, inner,
                              count, scale);
        }
    return CH_OK;
}

/* ops.h's rule: the first NaN, else the first maximum. Once the best is NaN
 * nothing moves it; before, a NaN or a strictly greater value does. */
ch_status chi_host_argmax(void *stream, int64_t outer, int64_t n, int64_t inner,
                          ch_bmem y, ch_bmem x)
{
    (void)stream;
    int32_t *py = chi_host_i32(y);
    const float *px = chi_host_f32(x);
    CHI_OMP(omp parallel for collapse(2) if (outer * n * inner > CHI_HOST_PAR_MIN))
    for (int64_t o = 0; o < outer; o++)
        for (int64_t t = 0; t < inner; t++) {
            const float *col = px + o * n * inner + t;
            int64_t best = 0;
            for (int64_t j = 1; j < n && !isnan(col[best * inner]); j++)
                if (isnan(col[j * inner]) || col[j * inner] > col[best * inner])
                    best = j;
            py[o * inner + t] = (int32_t)best;
        }
    return CH_OK;
}

/* A wide Linear's bias gradient: db[j] = beta db[j] + sum of dy[o, j] over
 * a [outer, c] dy, by parts of PART_ROWS whole rows (each task reads its
 * rows front to back), each part summed in float over runs of ROW_RUN
 * rows and in double across them; the parts' sums are then added in
 * order. The order is fixed by the shape. */
static ch_status bias_grad_by_rows(int64_t outer, int64_t c, float *pdb, const float *pdy,
                                   float beta)
{
    int64_t parts = (outer + PART_ROWS - 1) / PART_ROWS;
    size_t bytes = (size_t)(parts * c) * (sizeof(double) + sizeof(float));
    double *part = malloc(bytes);
    if (!part)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host bias_grad: malloc(%zu) failed", bytes);
    float *runs = (float *)(part + parts * c);
    CHI_OMP(omp parallel for if (outer * c > CHI_HOST_PAR_MIN))
    for (int64_t p = 0; p < parts; p++) {
        double *acc = part + p * c;
        float *run = runs + p * c;
        int64_t end = outer - p * PART_ROWS < PART_ROWS ? outer : (p + 1) * PART_ROWS;
        for (int64_t t = 0; t < c; t++)
            acc[t] = 0.0;
        for (int64_t o0 = p * PART_ROWS; o0 < end; o0 += ROW_RUN) {
            int64_t o1 = end - o0 < ROW_RUN ? end : o0 + ROW_RUN;
            const float *row = pdy + o0 * c;
            CHI_OMP(omp simd)
            for (int64_t t = 0; t < c; t++)
                run[t] = row[t];
            for (int64_t o = o0 + 1; o < o1; o++) {
                row = pdy + o * c;
                CHI_OMP(omp simd)
                for (int64_t t = 0; t < c; t++)
                    run[t] += row[t];
            }
            CHI_OMP(omp simd)
            for (int64_t t = 0; t < c; t++)
                acc[t] += run[t];
        }
    }
    CHI_OMP(omp parallel for if (parts * c > CHI_HOST_PAR_MIN / 4))
    for (int64_t t = 0; t < c; t++) {
        double sum = beta != 0.0f ? (double)beta * pdb[t] : 0.0;
        for (int64_t p = 0; p < parts; p++)
            sum += part[p * c + t];
        pdb[t] = (float)sum;
    }
    free(part);
    return CH_OK;
}

/* db[c] = beta db[c] + sum of dy[o, c, i]; beta == 0 does not read db.
 * A [outer, c] dy (Linear) of more than PART_ROWS rows goes by parts of
 * rows (bias_grad_by_rows); a shorter one by tasks of ROW_BLOCK channels
 * walking dy in memory order; otherwise one channel a task, each a run of
 * `inner` elements (a convolution's 32 or 64 channels would otherwise be
 * a single task). */
ch_status chi_host_bias_grad(void *stream, int64_t outer, int64_t c, int64_t inner,
                             ch_bmem db, ch_bmem dy, float beta)
{
    (void)stream;
    float *pdb = chi_host_f32(db);
    const float *pdy = chi_host_f32(dy);
    if (inner == 1 && outer > PART_ROWS)
        return bias_grad_by_rows(outer, c, pdb, pdy, beta);
    int64_t block = inner == 1 ? ROW_BLOCK : 1, blocks = (c + block - 1) / block;
    CHI_OMP(omp parallel for if (outer * c * inner > CHI_HOST_PAR_MIN))
    for (int64_t b = 0; b < blocks; b++) {
        int64_t c0 = b * block, count = c - c0 < block ? c - c0 : block;
        double acc[ROW_BLOCK] = {0};
        if (inner == 1) {
            /* dy is [outer, c] (Linear): rows in order, side by side, in
             * float over runs of ROW_RUN rows, each run's sums then added
             * in double (a conversion per run, not per element). */
            for (int64_t o0 = 0; o0 < outer; o0 += ROW_RUN) {
                int64_t o1 = outer - o0 < ROW_RUN ? outer : o0 + ROW_RUN;
                float run[ROW_BLOCK] = {0};
                for (int64_t o = o0; o < o1; o++) {
                    const float *row = pdy + o * c + c0;
                    CHI_OMP(omp simd)
                    for (int64_t t = 0; t < count; t++)
                        run[t] += row[t];
                }
                CHI_OMP(omp simd)
                for (int64_t t = 0; t < count; t++)
                    acc[t] += run[t];
            }
        } else {
            for (int64_t o = 0; o < outer; o++)
                for (int64_t t = 0; t < count; t++)
                    acc[t] += chunk_sum(pdy + (o * c + c0 + t) * inner, inner);
        }
        for (int64_t t = 0; t < count; t++) {
            double old = beta != 0.0f ? (double)beta * pdb[c0 + t] : 0.0;
            pdb[c0 + t] = (float)(old + acc[t]);
        }
    }
    return CH_OK;
}
