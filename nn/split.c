/* The data-parallel split policy (nn/split.h). */
#include "config.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nn.h"
#include "split.h"

/* Tests build this file with their own allocator to reach the failure. */
#ifdef NN_SPLIT_CALLOC
void *NN_SPLIT_CALLOC(size_t n, size_t size);
#else
#define NN_SPLIT_CALLOC calloc
#endif

/* Rates are smoothed over steps: new = (1 - KEEP) measured + KEEP old. */
#define RATE_KEEP 0.7
/* An automatic split moving at most this fraction of the batch (and at
 * least one sample) is not taken: timing noise would otherwise reshape the
 * replicas' buffers every step. */
#define KEEP_FRACTION 50 /* 1/50: 2% */

ch_status nn_split_init(nn_split *s, int n, ch_dp_split mode, const float *weights)
{
    memset(s, 0, sizeof *s);
    if (n < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "the split: %d replicas, expected at least 1",
                         n);
    if (mode != CH_DP_SPLIT_EQUAL && mode != CH_DP_SPLIT_WEIGHTS && mode != CH_DP_SPLIT_AUTO)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "the split: mode %d is not a ch_dp_split",
                         (int)mode);
    if (mode == CH_DP_SPLIT_WEIGHTS && !weights)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "the split: weighted, but weights is NULL");
    size_t per = 4 * sizeof(double) + 4 * sizeof(int);
    if ((size_t)n > SIZE_MAX / per)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "the split: %d replicas overflow the address "
                         "space", n);
    /* The doubles first: the ints after them stay aligned. */
    char *mem = NN_SPLIT_CALLOC((size_t)n, per);
    if (!mem)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "the split: out of memory for %d replicas", n);
    size_t un = (size_t)n;
    s->mem = mem;
    s->weight = (double *)mem;
    s->rate = s->weight + un;
    s->seconds = s->rate + un;
    s->w = s->seconds + un;
    s->count = (int *)(s->w + un);
    s->start = s->count + un;
    s->fresh = s->start + un;
    s->out = s->fresh + un;
    s->n = n;
    s->mode = mode;
    for (int i = 0; i < n; i++)
        s->weight[i] = mode == CH_DP_SPLIT_WEIGHTS ? (double)weights[i] : 1.0;
    return CH_OK;
}

void nn_split_free(nn_split *s)
{
    if (!s)
        return;
    free(s->mem);
    memset(s, 0, sizeof *s);
}

/* counts in proportion to w; the rounding remainder goes to the largest
 * fractions first (ties to the first replica), so the counts add up to
 * total. Then every replica not left out (out[i] 0; its weight is 0 too)
 * gets a sample when the total has enough: one from the largest count (the
 * first of them) for each that got none. */
static void split_by(int n, const double *w, const int *out, int total, int *counts)
{
    double wsum = 0;
    for (int i = 0; i < n; i++)
        wsum += w[i];
    int given = 0;
    for (int i = 0; i < n; i++) {
        counts[i] = (int)floor((double)total * w[i] / wsum);
        given += counts[i];
    }
    for (; given < total; given++) {
        int best = 0;
        double bestf = -INFINITY;
        for (int i = 0; i < n; i++) {
            double f = (double)total * w[i] / wsum - counts[i];
            if (f > bestf) {
                bestf = f;
                best = i;
            }
        }
        counts[best]++;
    }
    int in = 0;
    for (int i = 0; i < n; i++)
        in += !out[i];
    for (int i = 0; total >= in && i < n; i++) {
        if (counts[i] > 0 || out[i])
            continue;
        int big = 0;
        for (int j = 1; j < n; j++)
            if (counts[j] > counts[big])
                big = j;
        counts[big]--;
        counts[i]++;
    }
}

static int measured(const nn_split *s)
{
    int first = 0;
    while (first < s->n - 1 && s->out[first])
        first++;
    return s->mode == CH_DP_SPLIT_AUTO && s->rate[first] > 0.0;
}

/* Whether the new counts (s->fresh) move so few samples from the current
 * ones, for the same total, that the current split stays. */
static int keep_current(const nn_split *s, int total)
{
    if (!measured(s))
        return 0;
    int64_t moved = 0, current = 0;
    for (int i = 0; i < s->n; i++) {
        moved += abs(s->fresh[i] - s->count[i]);
        current += s->count[i];
    }
    int most = total / KEEP_FRACTION > 1 ? total / KEEP_FRACTION : 1;
    /* Each sample moved counts twice: where it left and where it went. */
    return current == total && moved <= 2 * (int64_t)most;
}

void nn_split_batch(nn_split *s, int total)
{
    if (total < 0)
        total = 0;
    const double *by = measured(s) ? s->rate : s->weight;
    for (int i = 0; i < s->n; i++)
        s->w[i] = s->out[i] ? 0.0 : by[i];
    split_by(s->n, s->w, s->out, total, s->fresh);
    if (!keep_current(s, total))
        memcpy(s->count, s->fresh, (size_t)s->n * sizeof *s->count);
    int start = 0;
    for (int i = 0; i < s->n; i++) {
        s->start[i] = start;
        start += s->count[i];
    }
}

void nn_split_measure(nn_split *s)
{
    const double *seconds = s->seconds;
    if (s->mode != CH_DP_SPLIT_AUTO || s->measures++ == 0)
        return;
    for (int i = 0; i < s->n; i++) {
        if (s->count[i] == 0 || !(seconds[i] > 0.0))
            continue;
        double rate = s->count[i] / seconds[i];
        if (!isfinite(rate))
            continue;
        s->rate[i] = s->rate[i] > 0.0 ? RATE_KEEP * s->rate[i] + (1.0 - RATE_KEEP) * rate
                                      : rate;
    }
    double sum = 0;
    int known = 0;
    for (int i = 0; i < s->n; i++)
        if (s->rate[i] > 0.0) {
            sum += s->rate[i];
            known++;
        }
    for (int i = 0; known && i < s->n; i++)
        if (!(s->rate[i] > 0.0) && !s->out[i])
            s->rate[i] = sum / known;
}

int nn_split_leave_out(nn_split *s, int i)
{
    int in = 0;
    for (int k = 0; k < s->n; k++)
        in += !s->out[k];
    if (i < 0 || i >= s->n || s->out[i] || in < 2)
        return 0;
    s->out[i] = 1;
    s->rate[i] = 0.0;
    return 1;
}
