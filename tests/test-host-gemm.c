/* The host's blocked C GEMM (the fallback when OpenBLAS is absent) against
 * a double-precision loop: every transpose combination, alpha and beta
 * variants, odd shapes and shapes that cross each blocking boundary
 * (KC = 512 deep, MCHUNK = 2304 rows, NC = 4080 columns). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "host.h"

typedef struct shape {
    int m, n, k;
} shape;

typedef struct gemm_case {
    int ta, tb, m, n, k;
    int pad;             /* extra elements at the end of every stored row */
    float alpha, beta;
} gemm_case;

/* op(X)[r, c] of X stored with row stride ld. */
static double at(const float *x, int trans, int64_t ld, int r, int c)
{
    return trans ? x[(int64_t)c * ld + r] : x[(int64_t)r * ld + c];
}

static void fill(float *x, size_t n, tap_rng *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
}

/* The largest error of c against the double loop, relative to the size of
 * the terms each element sums (so that k = 600 and k = 1 share one bound). */
static double worst_error(const gemm_case *t, const float *a, int64_t lda, const float *b,
                          int64_t ldb, const float *c0, const float *c, int64_t ldc,
                          char *where, size_t size)
{
    double worst = 0.0;
    for (int i = 0; i < t->m; i++)
        for (int j = 0; j < t->n; j++) {
            double sum = 0.0, mag = 0.0;
            for (int p = 0; p < t->k; p++) {
                double ab = at(a, t->ta, lda, i, p) * at(b, t->tb, ldb, p, j);
                sum += ab;
                mag += fabs(ab);
            }
            double old = t->beta != 0.0f ? c0[i * ldc + j] : 0.0;
            double want = t->alpha * sum + t->beta * old;
            double scale = fabs(t->alpha) * mag + fabs(t->beta * old) + 1e-30;
            double err = fabs(c[i * ldc + j] - want) / scale;
            if (!(err <= worst)) {
                worst = err;
                snprintf(where, size, "at (%d,%d): got %.7g, want %.7g", i, j,
                         c[i * ldc + j], want);
            }
        }
    return worst;
}

static void run_case(const gemm_case *t, tap_rng *rng)
{
    int64_t ar = t->ta ? t->k : t->m, ac = t->ta ? t->m : t->k;
    int64_t br = t->tb ? t->n : t->k, bc = t->tb ? t->k : t->n;
    int64_t lda = ac + t->pad, ldb = bc + t->pad, ldc = t->n + t->pad;
    float *a = malloc(sizeof *a * ar * lda), *b = malloc(sizeof *b * br * ldb);
    float *c = malloc(sizeof *c * t->m * ldc), *c0 = malloc(sizeof *c0 * t->m * ldc);
    if (!a || !b || !c || !c0) {
        tap_ok(0, "malloc for a %dx%dx%d case", t->m, t->n, t->k);
        free(a), free(b), free(c), free(c0);
        return;
    }
    fill(a, (size_t)(ar * lda), rng);
    fill(b, (size_t)(br * ldb), rng);
    fill(c0, (size_t)(t->m * ldc), rng);
    /* beta == 0 must not read C: NaN there must not reach the result. */
    if (t->beta == 0.0f)
        for (int64_t i = 0; i < t->m * ldc; i++)
            c0[i] = NAN;
    memcpy(c, c0, sizeof *c * t->m * ldc);
    ch_status st = chi_host_sgemm_blocked(t->ta, t->tb, t->m, t->n, t->k, t->alpha, a,
                                          lda, b, ldb, t->beta, c, ldc);
    char where[160] = "";
    double err = st == CH_OK ? worst_error(t, a, lda, b, ldb, c0, c, ldc, where,
                                           sizeof where)
                             : INFINITY;
    tap_ok(err <= 1e-5, "gemm %c%c m=%d n=%d k=%d ld+%d alpha=%g beta=%g: relative "
                        "error %.3g (want <= 1e-5) %s%s",
           t->ta ? 'T' : 'N', t->tb ? 'T' : 'N', t->m, t->n, t->k, t->pad,
           (double)t->alpha, (double)t->beta, err, where,
           st == CH_OK ? "" : ch_last_error());
    free(a), free(b), free(c), free(c0);
}

/* alpha == 0 reads neither A nor B: NaN there leaves beta * C. */
static void alpha_zero(void)
{
    float a[6], b[6], c[4] = {1, 2, 3, 4};
    for (int i = 0; i < 6; i++)
        a[i] = b[i] = NAN;
    ch_status st = chi_host_sgemm_blocked(0, 0, 2, 2, 3, 0.0f, a, 3, b, 2, 0.5f, c, 2);
    tap_ok(st == CH_OK && c[0] == 0.5f && c[1] == 1.0f && c[2] == 1.5f && c[3] == 2.0f,
           "alpha = 0 gives beta * C without reading A or B: got %g %g %g %g, "
           "want 0.5 1 1.5 2", c[0], c[1], c[2], c[3]);
}

int main(void)
{
    static const shape shapes[] = {
        {1, 1, 1},    {37, 53, 61},  {127, 129, 65}, {256, 256, 256},
        {7, 33, 600}, {2400, 17, 9}, {5, 4100, 3},
    };
    static const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 2.0f}, {-1.5f, 1.0f}};
    tap_rng rng = {20261130};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++)
            for (size_t v = 0; v < sizeof ab / sizeof ab[0]; v++) {
                gemm_case t = {tr >> 1, tr & 1, shapes[s].m, shapes[s].n, shapes[s].k,
                           (int)v, ab[v][0], ab[v][1]};
                run_case(&t, &rng);
            }
    alpha_zero();
    return tap_done();
}
