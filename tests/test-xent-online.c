/* lib/kernels/xent.h's online softmax compiled as C: a row's (max, sum of
 * exp(x - max)) built one element at a time and from parts merged, as
 * the CUDA fused cross-entropy builds it (each thread a strided part, the
 * parts merged across a warp and a block), against the two-pass sum in
 * double. Rows rising (every element moves the max), falling, random,
 * with -inf elements, all -inf, one element. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/xent.h"
#include "tap.h"

/* Relative error of the row's sum, and whether the max is exact, for the
 * row split into `parts` strided parts (thread t takes t, t + parts, ...)
 * merged pairwise as a warp's shuffles do, then left to right. */
static double row_err(const float *x, int64_t n, int parts, int *max_ok)
{
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++)
        mx = x[j] > mx ? x[j] : mx;
    double want = 0.0;
    for (int64_t j = 0; mx != -INFINITY && j < n; j++)
        want += exp((double)x[j] - mx);
    float *m = malloc(sizeof *m * (size_t)parts), *s = malloc(sizeof *s * (size_t)parts);
    if (!m || !s) {
        free(m);
        free(s);
        *max_ok = 0;
        return INFINITY;
    }
    for (int t = 0; t < parts; t++) {
        m[t] = -INFINITY;
        s[t] = 0.0f;
        for (int64_t j = t; j < n; j += parts)
            chk_xent_online_add(&m[t], &s[t], x[j]);
    }
    for (int step = 1; step < parts; step *= 2)
        for (int t = 0; t + step < parts; t += 2 * step)
            chk_xent_online_merge(&m[t], &s[t], m[t + step], s[t + step]);
    *max_ok = (double)m[0] == mx;
    double err = want == 0.0 ? fabs((double)s[0]) : fabs((double)s[0] - want) / want;
    free(m);
    free(s);
    return err;
}

static void check(const char *what, const float *x, int64_t n, double tol)
{
    static const int parts[] = {1, 32, 512, 1000};
    double worst = 0.0;
    int all_max = 1;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        int max_ok = 0;
        double e = row_err(x, n, parts[i], &max_ok);
        worst = e > worst ? e : worst;
        all_max = all_max && max_ok;
    }
    tap_ok(all_max && worst <= tol,
           "%s, %lld elements, in 1, 32, 512 and 1000 parts: the max exact, the sum within "
           "%.3g of the double's (worst %.3g)",
           what, (long long)n, tol, worst);
}

int main(void)
{
    enum {
        N = 50257
    };
    float *x = malloc(sizeof *x * N);
    if (!x) {
        tap_ok(0, "memory for a row");
        return tap_done();
    }
    tap_rng rng = {20261207};
    /* Random logits of a vocabulary's row. A rounding a term in f32, as a
     * two-pass sum in f32 would lose: the row in one part drifts most
     * (8.5e-5 seen falling, 512 parts 100 times less); 2.5e-4 leaves room
     * for another libm's expf, far below the 3e-3 of n roundings. */
    const double tol = 2.5e-4;
    for (int64_t j = 0; j < N; j++)
        x[j] = tap_rng_uniform(&rng, -10, 10);
    check("random in [-10, 10)", x, N, tol);
    for (int64_t j = 0; j < N; j++)
        x[j] = -8.0f + 16.0f * (float)j / N;
    check("rising (every element a new max)", x, N, tol);
    for (int64_t j = 0; j < N; j++)
        x[j] = 8.0f - 16.0f * (float)j / N;
    check("falling", x, N, tol);
    for (int64_t j = 0; j < N; j++)
        x[j] = j % 7 == 0 ? -INFINITY : tap_rng_uniform(&rng, -3, 3);
    check("random with every seventh -inf", x, N, tol);
    for (int64_t j = 0; j < 100; j++)
        x[j] = -INFINITY;
    check("all -inf (max -inf, sum 0)", x, 100, 0.0);
    x[0] = 3.5f;
    check("one element", x, 1, 0.0);
    free(x);
    return tap_done();
}
