/* The CUDA embedding backward's order (backends/cuda/embedding_order.h),
 * checked on the host where no GPU is needed: the pairs (key, position)
 * sorted stably by key as CUB's radix sort does (here a merge sort), then
 * the header's run starts and run sums, give every row of dtable the bits
 * of ops.h's order (each row's dy rows summed from 0 in increasing
 * position, then added), for index sets with repeats, a row used by every
 * position, indices out of range anywhere, and rows never used. */
#include <stdlib.h>
#include <string.h>

#include "../backends/cuda/embedding_order.h"
#include "tap.h"

/* A stable sort of (keys, pos) by key: merges of runs of doubling width. */
static void stable_sort(uint32_t *keys, int32_t *pos, int64_t n)
{
    uint32_t *kt = malloc((size_t)n * sizeof *kt);
    int32_t *pt = malloc((size_t)n * sizeof *pt);
    if (!kt || !pt) {
        free(kt);
        free(pt);
        tap_ok(0, "memory for the sort");
        return;
    }
    for (int64_t w = 1; w < n; w *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * w) {
            int64_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid || b < hi) {
                /* Equal keys: the left run's first, which keeps the order. */
                int left = b >= hi || (a < mid && keys[a] <= keys[b]);
                int64_t k = left ? a++ : b++;
                kt[o] = keys[k];
                pt[o++] = pos[k];
            }
        }
        memcpy(keys, kt, (size_t)n * sizeof *keys);
        memcpy(pos, pt, (size_t)n * sizeof *pos);
    }
    free(kt);
    free(pt);
}

/* Every position's index in [lo, hi) (some out of [0, v) when lo < 0 or
 * hi > v), and dy's rows of random magnitudes so that the order of the
 * additions shows in the bits. */
static void case_run(const char *what, int64_t n, int64_t v, int64_t d, int32_t lo, int32_t hi,
                     uint64_t seed)
{
    tap_rng rng = {seed};
    int32_t *idx = malloc((size_t)n * sizeof *idx);
    uint32_t *keys = malloc((size_t)n * sizeof *keys);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    float *dy = malloc((size_t)(n * d) * sizeof *dy);
    float *want = malloc((size_t)(v * d) * sizeof *want);
    float *got = malloc((size_t)(v * d) * sizeof *got);
    float *sum = malloc((size_t)d * sizeof *sum);
    if (!idx || !keys || !pos || !dy || !want || !got || !sum) {
        tap_ok(0, "%s: memory", what);
        goto out;
    }
    for (int64_t i = 0; i < n; i++)
        idx[i] = lo + (int32_t)(tap_rng_next(&rng) % (uint64_t)(hi - lo));
    for (int64_t i = 0; i < n * d; i++)
        dy[i] = tap_rng_uniform(&rng, -1.0f, 1.0f) * (float)(1u << (tap_rng_next(&rng) % 20));
    for (int64_t i = 0; i < v * d; i++)
        want[i] = got[i] = tap_rng_uniform(&rng, -4.0f, 4.0f);

    /* ops.h's order, spelled directly: per row, its positions ascending. */
    for (int64_t r = 0; r < v; r++) {
        int used = 0;
        for (int64_t j = 0; j < d; j++)
            sum[j] = 0.0f;
        for (int64_t i = 0; i < n; i++) {
            if (idx[i] != r)
                continue;
            used = 1;
            for (int64_t j = 0; j < d; j++)
                sum[j] += dy[i * d + j];
        }
        for (int64_t j = 0; used && j < d; j++)
            want[r * d + j] += sum[j];
    }

    /* The CUDA backend's: keys, the stable sort, one "thread" per (sorted
     * position, column). */
    for (int64_t i = 0; i < n; i++) {
        keys[i] = cheo_key(idx[i], v);
        pos[i] = (int32_t)i;
    }
    stable_sort(keys, pos, n);
    int64_t runs = 0, rows_used = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!cheo_run_start(keys, i, v))
            continue;
        runs++;
        for (int64_t j = 0; j < d; j++)
            got[(int64_t)keys[i] * d + j] += cheo_run_sum(keys, pos, dy, n, d, i, j);
    }
    for (int64_t r = 0; r < v; r++)
        for (int64_t i = 0; i < n; i++)
            if (idx[i] == r) {
                rows_used++;
                break;
            }
    int64_t diff = -1;
    for (int64_t k = 0; k < v * d && diff < 0; k++)
        if (tap_bits_of(got[k]) != tap_bits_of(want[k]))
            diff = k;
    tap_ok(diff < 0 && runs == rows_used,
           "%s: %lld indices into %lld rows, width %lld: every row the bits of the ordered sum "
           "(first difference at %lld: %.9g, want %.9g); %lld runs for %lld rows used",
           what, (long long)n, (long long)v, (long long)d, (long long)diff,
           diff < 0 ? 0.0 : (double)got[diff], diff < 0 ? 0.0 : (double)want[diff], (long long)runs,
           (long long)rows_used);
out:
    free(idx);
    free(keys);
    free(pos);
    free(dy);
    free(want);
    free(got);
    free(sum);
}

int main(void)
{
    tap_ok(cheo_key_bits(1) == 1 && cheo_key_bits(2) == 2 && cheo_key_bits(3) == 2 &&
               cheo_key_bits(4) == 3 && cheo_key_bits(50257) == 16 &&
               cheo_key_bits((int64_t)UINT32_MAX - 1) == 32,
           "the sort's key bits hold every key up to v (v itself marks the out of range)");
    tap_ok(cheo_key(-1, 10) == 10 && cheo_key(10, 10) == 10 && cheo_key(INT32_MIN, 10) == 10 &&
               cheo_key(0, 10) == 0 && cheo_key(9, 10) == 9,
           "indices outside [0, v) get the key v, after every row");
    case_run("repeats", 257, 16, 5, 0, 16, 1);
    case_run("one row for all", 300, 7, 3, 4, 5, 2);
    case_run("out of range too", 513, 40, 4, -3, 43, 3);
    case_run("most rows unused", 31, 1000, 2, 0, 1000, 4);
    case_run("one position", 1, 3, 8, 0, 3, 5);
    case_run("wide rows", 64, 9, 130, 0, 9, 6);
    return tap_done();
}
