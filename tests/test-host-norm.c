/* The host's LayerNorm (backends/host/norm.c) in each instruction set
 * this CPU runs (chi_host_tile_prefer picks it; CHI_TEST_HOOKS): rows
 * four at a time and the rest one by one, forward and backward with and
 * without dx, over shapes whose widths are and are not multiples of the
 * eight lanes and whose row counts cross the backward's chunks of 32.
 * The AVX-512 build gives the same bits as the generic one (the same
 * arithmetic on every lane), and that one is held to a double-precision
 * loop:
 * each result within 4 ulp of its own size, dx and the parameter
 * gradients of the size of their terms. */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "host.h"

#define ULP 1.1920928955078125e-07

/* Preferring no tile kernels, the rows go through the generic vectors
 * (norm.c's CHI_CLONES: AVX2 or the baseline, as the CPU has); with
 * AVX-512 preferred, through its own build. */
static const int isas[] = {CHI_TILE_NONE, CHI_TILE_AVX512};
static const char *isa_name[] = {"generic vectors", "AVX-512"};
enum {
    NISA = 2
};

typedef struct outputs {
    float *y, *mean, *rstd, *dx, *dg, *db, *dg_only, *db_only;
} outputs;

static ch_bmem mem_of(const void *p)
{
    return (ch_bmem){.ptr = (void *)p, .off = 0};
}

static float *floats(size_t n, float fill)
{
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++)
        p[i] = fill;
    return p;
}

static void outputs_free(outputs *o)
{
    free(o->y), free(o->mean), free(o->rstd), free(o->dx), free(o->dg), free(o->db);
    free(o->dg_only), free(o->db_only);
}

/* Forward, backward with dx, backward without: the parameter gradients
 * start at 0.5 (the op adds to them). */
static int run(int64_t rows, int64_t d, const float *x, const float *g, const float *b,
               const float *dy, outputs *o)
{
    size_t n = (size_t)(rows * d);
    o->y = floats(n, -7.0f), o->dx = floats(n, -7.0f);
    o->mean = floats((size_t)rows, -7.0f), o->rstd = floats((size_t)rows, -7.0f);
    o->dg = floats((size_t)d, 0.5f), o->db = floats((size_t)d, 0.5f);
    o->dg_only = floats((size_t)d, 0.5f), o->db_only = floats((size_t)d, 0.5f);
    if (!o->y || !o->dx || !o->mean || !o->rstd || !o->dg || !o->db || !o->dg_only || !o->db_only)
        return 0;
    ch_status st = chi_host_layernorm(NULL, rows, d, 1e-5f, mem_of(o->y), mem_of(o->mean),
                                      mem_of(o->rstd), mem_of(x), mem_of(g), mem_of(b));
    if (st == CH_OK)
        st = chi_host_layernorm_backward(NULL, rows, d, mem_of(o->dx), mem_of(o->dg), mem_of(o->db),
                                         mem_of(dy), mem_of(x), mem_of(o->mean), mem_of(o->rstd),
                                         mem_of(g));
    if (st == CH_OK)
        st = chi_host_layernorm_backward(NULL, rows, d, (ch_bmem){0}, mem_of(o->dg_only),
                                         mem_of(o->db_only), mem_of(dy), mem_of(x), mem_of(o->mean),
                                         mem_of(o->rstd), mem_of(g));
    return st == CH_OK;
}

static int same(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof *a) == 0;
}

/* The largest |got - want| / scale[i] (scale NULL: |want|), in ulp. */
static double err(const float *got, const double *want, const double *scale, int64_t n)
{
    double e = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double s = fmax(scale ? scale[i] : fabs(want[i]), 1e-30);
        e = fmax(e, fabs((double)got[i] - want[i]) / s);
    }
    return e / ULP;
}

/* The generic build against LayerNorm in double. */
static void check_reference(int64_t rows, int64_t d, const float *x, const float *g, const float *b,
                            const float *dy, const outputs *o)
{
    size_t n = (size_t)(rows * d);
    double *y = malloc(n * sizeof *y), *dx = malloc(n * sizeof *dx), *dxs = malloc(n * sizeof *dxs);
    double *dg = calloc((size_t)d, sizeof *dg), *db = calloc((size_t)d, sizeof *db);
    double *dgs = calloc((size_t)d, sizeof *dgs), *dbs = calloc((size_t)d, sizeof *dbs);
    if (!y || !dx || !dxs || !dg || !db || !dgs || !dbs) {
        tap_ok(0, "malloc for the reference");
        goto out;
    }
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *dyr = dy + r * d;
        double m = 0.0, v = 0.0, s1 = 0.0, s2 = 0.0, a1 = 0.0, a2 = 0.0;
        for (int64_t j = 0; j < d; j++)
            m += xr[j];
        m /= (double)d;
        for (int64_t j = 0; j < d; j++)
            v += (xr[j] - m) * (xr[j] - m);
        double rs = 1.0 / sqrt(v / (double)d + 1e-5f);
        for (int64_t j = 0; j < d; j++) {
            double xh = (xr[j] - m) * rs, gj = (double)dyr[j] * g[j];
            y[r * d + j] = xh * g[j] + b[j];
            dg[j] += dyr[j] * xh;
            db[j] += dyr[j];
            dgs[j] += fabs(dyr[j] * xh);
            dbs[j] += fabs(dyr[j]);
            s1 += gj;
            s2 += gj * xh;
            a1 += fabs(gj);
            a2 += fabs(gj * xh);
        }
        for (int64_t j = 0; j < d; j++) {
            double xh = (xr[j] - m) * rs, gj = (double)dyr[j] * g[j];
            dx[r * d + j] = rs * (gj - s1 / (double)d - xh * s2 / (double)d);
            dxs[r * d + j] = rs * (fabs(gj) + a1 / (double)d + fabs(xh) * a2 / (double)d);
        }
    }
    for (int64_t j = 0; j < d; j++) {
        dg[j] += 0.5, db[j] += 0.5, dgs[j] += 0.5, dbs[j] += 0.5;
    }
    double ey = err(o->y, y, NULL, (int64_t)n), edx = err(o->dx, dx, dxs, (int64_t)n);
    double ep = fmax(fmax(err(o->dg, dg, dgs, d), err(o->db, db, dbs, d)),
                     fmax(err(o->dg_only, dg, dgs, d), err(o->db_only, db, dbs, d)));
    tap_ok(ey <= 4 && edx <= 4 && ep <= 4,
           "layernorm [%" PRId64 ", %" PRId64 "] generic, against double: y %.2f ulp, dx %.2f, "
           "dgamma and dbeta %.2f (4 allowed)",
           rows, d, ey, edx, ep);
out:
    free(y), free(dx), free(dxs), free(dg), free(db), free(dgs), free(dbs);
}

static void test_shape(int64_t rows, int64_t d, tap_rng *rng)
{
    size_t n = (size_t)(rows * d);
    float *x = floats(n, 0), *dy = floats(n, 0), *g = floats((size_t)d, 0),
          *b = floats((size_t)d, 0);
    outputs out[NISA] = {{0}};
    if (!x || !dy || !g || !b) {
        tap_ok(0, "malloc for layernorm [%" PRId64 ", %" PRId64 "]", rows, d);
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        x[i] = 3.0f + tap_rng_uniform(rng, -2.0f, 2.0f); /* a mean away from 0 */
        dy[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
    }
    for (int64_t j = 0; j < d; j++) {
        g[j] = tap_rng_uniform(rng, 0.5f, 1.5f);
        b[j] = tap_rng_uniform(rng, -0.5f, 0.5f);
    }
    for (int s = 0; s < NISA; s++) {
        if (isas[s] != CHI_TILE_NONE && chi_host_tile_isa(isas[s]) == CHI_TILE_NONE) {
            tap_skip("layernorm [%" PRId64 ", %" PRId64 "] in %s: this CPU does not run it", rows,
                     d, isa_name[s]);
            continue;
        }
        chi_host_tile_prefer(isas[s]);
        int ok = run(rows, d, x, g, b, dy, &out[s]);
        chi_host_tile_prefer(CHI_TILE_AUTO);
        if (!ok) {
            tap_ok(0, "layernorm [%" PRId64 ", %" PRId64 "] in %s: %s", rows, d, isa_name[s],
                   ch_last_error());
            continue;
        }
        if (s == 0) {
            check_reference(rows, d, x, g, b, dy, &out[0]);
            continue;
        }
        const outputs *p = &out[0], *o = &out[s];
        tap_ok(same(o->y, p->y, rows * d) && same(o->mean, p->mean, rows) &&
                   same(o->rstd, p->rstd, rows) && same(o->dx, p->dx, rows * d) &&
                   same(o->dg, p->dg, d) && same(o->db, p->db, d) &&
                   same(o->dg_only, p->dg_only, d) && same(o->db_only, p->db_only, d),
               "layernorm [%" PRId64 ", %" PRId64 "] in %s: the generic build's bits", rows, d,
               isa_name[s]);
    }
done:
    for (int s = 0; s < NISA; s++)
        outputs_free(&out[s]);
    free(x), free(dy), free(g), free(b);
}

int main(void)
{
    tap_rng rng = {20261206};
    static const int64_t shapes[][2] = {{37, 771}, {64, 768}, {5, 3}, {1, 8}, {33, 16}, {4, 9}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_shape(shapes[i][0], shapes[i][1], &rng);
    return tap_done();
}
