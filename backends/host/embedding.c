/* The host's embedding: the gather of the table's rows, and its backward,
 * which sorts the positions by row (a counting sort) so that each row of
 * the table's gradient is one thread's sum in increasing position: the
 * order of the device kernels, and no atomics. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdlib.h>
#include <string.h>

#include "host.h"

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
        return chi_error(CH_ERR_OUT_OF_MEMORY,
                         "ch_embedding_backward: no memory to sort %lld indices into %lld rows",
                         (long long)n, (long long)v);
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
static void embedding_row_grad(float *dtable_row, const float *dy, int64_t d, const int64_t *order,
                               int64_t count)
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

ch_status chi_host_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d, ch_bmem dtable,
                                      ch_bmem dy, ch_bmem idx)
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
