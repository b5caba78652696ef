/* The CUDA backend's fused attention (backends/cuda/flash.h, flash.cu) on
 * the CPU, without a GPU: the very tile functions its kernels call, run
 * in the kernels' order, block by block, every thread of a block through
 * one phase before any thread starts the next (what the kernels' barriers
 * promise), against attention in double. The shared tiles are filled with
 * NaN before each load, so a thread's share left out of a load, or a read
 * past what was loaded, shows in the results. Shapes cross the blocks of
 * 64 rows and the tiles (64 rows, fewer past a head size of 64), take the
 * kernels with a head size of their own (16, 32, 64, 128) and the general
 * one, the packed layout of c_attn's output (q, k, v side by side in rows
 * of 3 heads hd) and separate matrices, and large scores, where the
 * running maximum moves from tile to tile. Each case fails with the
 * rescale of the running sums left out, or one row of a tile not loaded. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flash.h"
#include "ref.h"
#include "tap.h"

/* Every output within TOL of the largest entry of its reference (inputs
 * of order 1: sums in f32 of at most a few hundred terms). */
#define TOL 2e-5

typedef struct shapes {
    int64_t b, heads, t, hd;
    int packed;   /* q, k, v in one [b t, 3 heads hd] array */
    float lo, hi; /* q and k drawn from [lo, hi) */
} shapes;

typedef struct tensors {
    chf_geom g;
    int64_t bh, n;     /* matrices; elements of one of q, k, v */
    float *q, *k, *v;  /* views into qkv (or separate) */
    float *qkv, *dqkv; /* the arrays the views point into */
    float *dq, *dk, *dv;
    float *o, *dout, *lse, *d;
} tensors;

static float *floats(int64_t n)
{
    float *p = malloc((size_t)n * sizeof *p);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(99);
    }
    return p;
}

static void poison(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* ---- the kernels' order, on the CPU --------------------------------------- */

/* Per-thread rows: CHF_THREADS of CHF_HD_MAX floats. */
typedef float rows_t[CHF_THREADS][CHF_HD_MAX];

static void forward(const tensors *x)
{
    const chf_geom *g = &x->g;
    int64_t blocks = (g->t + CHF_THREADS - 1) / CHF_THREADS, rows = chf_tile_rows(g->hd);
    float *ks = floats(CHF_TILE_FLOATS), *vs = floats(CHF_TILE_FLOATS);
    rows_t *qi = malloc(sizeof *qi), *acc = malloc(sizeof *acc);
    chf_fwd_row st[CHF_THREADS];
    for (int64_t bh = 0; bh < x->bh; bh++)
        for (int64_t blk = 0; blk < blocks; blk++) {
            for (int tid = 0; tid < CHF_THREADS; tid++)
                st[tid] =
                    chf_fwd_begin(g, x->q, bh, blk * CHF_THREADS + tid, (*qi)[tid], (*acc)[tid]);
            for (int64_t j0 = 0; j0 < chf_keys_end(g, blk); j0 += rows) {
                poison(ks, CHF_TILE_FLOATS);
                poison(vs, CHF_TILE_FLOATS);
                for (int tid = 0; tid < CHF_THREADS; tid++) {
                    chf_load(g, x->k, g->ld, bh, j0, rows, tid, ks);
                    chf_load(g, x->v, g->ld, bh, j0, rows, tid, vs);
                }
                for (int tid = 0; tid < CHF_THREADS; tid++)
                    st[tid] = chf_fwd_tile(g, blk * CHF_THREADS + tid, j0, rows, st[tid],
                                           (*qi)[tid], (*acc)[tid], ks, vs);
            }
            for (int tid = 0; tid < CHF_THREADS; tid++)
                chf_fwd_end(g, x->o, x->lse, bh, blk * CHF_THREADS + tid, st[tid], (*acc)[tid]);
        }
    free(ks);
    free(vs);
    free(qi);
    free(acc);
}

static void backward(const tensors *x)
{
    const chf_geom *g = &x->g;
    int64_t blocks = (g->t + CHF_THREADS - 1) / CHF_THREADS, rows = chf_tile_rows(g->hd);
    for (int64_t r = 0; r < x->bh * g->t; r++) /* flash_d_kernel */
        x->d[r] = chf_bwd_d(g, x->dout, x->o, r / g->t, r % g->t);
    float *s1 = floats(CHF_TILE_FLOATS), *s2 = floats(CHF_TILE_FLOATS);
    float ls[CHF_THREADS], ds[CHF_THREADS];
    rows_t *a = malloc(sizeof *a), *b = malloc(sizeof *b), *c = malloc(sizeof *c),
           *e = malloc(sizeof *e);
    for (int64_t bh = 0; bh < x->bh; bh++)
        for (int64_t blk = 0; blk < blocks; blk++) { /* flash_dq_kernel */
            float lse_i[CHF_THREADS], d_i[CHF_THREADS];
            for (int tid = 0; tid < CHF_THREADS; tid++) {
                int64_t i = blk * CHF_THREADS + tid;
                chf_dq_begin(g, x->q, x->dout, bh, i, (*a)[tid], (*b)[tid], (*c)[tid]);
                lse_i[tid] = i < g->t ? x->lse[bh * g->t + i] : 0.0f;
                d_i[tid] = i < g->t ? x->d[bh * g->t + i] : 0.0f;
            }
            for (int64_t j0 = 0; j0 < chf_keys_end(g, blk); j0 += rows) {
                poison(s1, CHF_TILE_FLOATS);
                poison(s2, CHF_TILE_FLOATS);
                for (int tid = 0; tid < CHF_THREADS; tid++) {
                    chf_load(g, x->k, g->ld, bh, j0, rows, tid, s1);
                    chf_load(g, x->v, g->ld, bh, j0, rows, tid, s2);
                }
                for (int tid = 0; tid < CHF_THREADS; tid++)
                    chf_dq_tile(g, blk * CHF_THREADS + tid, j0, rows, lse_i[tid], d_i[tid],
                                (*a)[tid], (*b)[tid], (*c)[tid], s1, s2);
            }
            for (int tid = 0; tid < CHF_THREADS; tid++)
                chf_dq_end(g, x->dq, bh, blk * CHF_THREADS + tid, (*c)[tid]);
        }
    for (int64_t bh = 0; bh < x->bh; bh++)
        for (int64_t blk = 0; blk < blocks; blk++) { /* flash_dkv_kernel */
            for (int tid = 0; tid < CHF_THREADS; tid++)
                chf_dkv_begin(g, x->k, x->v, bh, blk * CHF_THREADS + tid, (*a)[tid], (*b)[tid],
                              (*c)[tid], (*e)[tid]);
            for (int64_t i0 = chf_queries_begin(blk); i0 < g->t; i0 += rows) {
                poison(s1, CHF_TILE_FLOATS);
                poison(s2, CHF_TILE_FLOATS);
                poison(ls, CHF_THREADS);
                poison(ds, CHF_THREADS);
                for (int tid = 0; tid < CHF_THREADS; tid++) {
                    chf_load(g, x->q, g->ld, bh, i0, rows, tid, s1);
                    chf_load(g, x->dout, g->ldo, bh, i0, rows, tid, s2);
                    chf_load_scalars(g, x->lse, bh, i0, rows, tid, ls);
                    chf_load_scalars(g, x->d, bh, i0, rows, tid, ds);
                }
                for (int tid = 0; tid < CHF_THREADS; tid++)
                    chf_dkv_tile(g, blk * CHF_THREADS + tid, i0, rows, (*a)[tid], (*b)[tid],
                                 (*c)[tid], (*e)[tid], s1, s2, ls, ds);
            }
            for (int tid = 0; tid < CHF_THREADS; tid++)
                chf_dkv_end(g, x->dk, x->dv, bh, blk * CHF_THREADS + tid, (*c)[tid], (*e)[tid]);
        }
    free(s1);
    free(s2);
    free(a);
    free(b);
    free(c);
    free(e);
}

/* ---- against the reference (tests/ref.c) ------------------------------------ */

/* Row r of matrix bh of x, through the geometry, into out[hd]. */
static void unpack(const tensors *x, const float *base, int64_t ld, int64_t bh, int64_t r,
                   float *out)
{
    memcpy(out, base + chf_at(&x->g, ld, bh, r), (size_t)x->g.hd * sizeof *out);
}

/* max |got - want| / max |want| over n values. */
static double err_of(const float *got, const double *want, int64_t n)
{
    double diff = 0.0, mag = 1e-30;
    for (int64_t i = 0; i < n; i++) {
        diff = fmax(diff, isnan(got[i]) ? INFINITY : fabs(got[i] - want[i]));
        mag = fmax(mag, fabs(want[i]));
    }
    return diff / mag;
}

/* The errors of o, lse, dq, dk, dv in err[0..5), every matrix taken apart
 * into [bh, t, hd] arrays for ref_attention. */
static void check(const tensors *x, double err[5])
{
    const chf_geom *g = &x->g;
    int64_t t = g->t, hd = g->hd, n = x->bh * t * hd;
    float *part[9];
    for (int i = 0; i < 9; i++)
        part[i] = floats(n); /* q k v dout o dq dk dv, and lse in the last */
    const float *from[8] = {x->q, x->k, x->v, x->dout, x->o, x->dq, x->dk, x->dv};
    for (int64_t bh = 0; bh < x->bh; bh++)
        for (int64_t r = 0; r < t; r++)
            for (int i = 0; i < 8; i++)
                unpack(x, from[i], i == 3 || i == 4 ? g->ldo : g->ld, bh, r,
                       part[i] + (bh * t + r) * hd);
    memcpy(part[8], x->lse, (size_t)(x->bh * t) * sizeof(float));
    double *want[6];
    for (int i = 0; i < 6; i++)
        want[i] = calloc((size_t)n, sizeof(double));
    double *p = calloc((size_t)(t * t), sizeof *p), *dp = calloc((size_t)t, sizeof *dp);
    attn_ref r = {want[0], NULL, want[1], want[2], want[3], want[4]};
    ref_attention(&r, part[0], part[1], part[2], part[3], x->bh, t, hd, g->scale, p, dp);
    err[0] = err_of(part[4], want[0], n);
    err[1] = err_of(part[8], want[1], x->bh * t);
    for (int i = 0; i < 3; i++)
        err[2 + i] = err_of(part[5 + i], want[2 + i], n);
    for (int i = 0; i < 9; i++)
        free(part[i]);
    for (int i = 0; i < 6; i++)
        free(want[i]);
    free(p);
    free(dp);
}

/* ---- cases ------------------------------------------------------------------ */

static void run(const shapes *s, tap_rng *rng)
{
    tensors x;
    memset(&x, 0, sizeof x);
    int64_t d = s->heads * s->hd;
    x.bh = s->b * s->heads;
    x.n = s->b * s->t * d;
    int64_t parts = s->packed ? 3 : 1;
    x.g = (chf_geom){s->t, s->heads, s->hd, parts * d, d, (float)(1.0 / sqrt((double)s->hd))};
    /* packed: one array, q k v side by side; apart: three arrays of ld d */
    x.qkv = floats(3 * x.n);
    x.dqkv = floats(3 * x.n);
    for (int64_t r = 0; r < s->b * s->t; r++)
        for (int64_t c = 0; c < 3 * d; c++) {
            int part = (int)(c / d);
            int64_t where = s->packed ? r * 3 * d + c : part * x.n + r * d + c % d;
            x.qkv[where] =
                part < 2 ? tap_rng_uniform(rng, s->lo, s->hi) : tap_rng_uniform(rng, -1.0f, 1.0f);
        }
    poison(x.dqkv, 3 * x.n);
    int64_t step = s->packed ? d : x.n;
    x.q = x.qkv;
    x.k = x.qkv + step;
    x.v = x.qkv + 2 * step;
    x.dq = x.dqkv;
    x.dk = x.dqkv + step;
    x.dv = x.dqkv + 2 * step;
    x.o = floats(x.n);
    x.dout = floats(x.n);
    x.lse = floats(x.bh * s->t);
    x.d = floats(x.bh * s->t);
    poison(x.o, x.n);
    poison(x.lse, x.bh * s->t);
    for (int64_t i = 0; i < x.n; i++)
        x.dout[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
    forward(&x);
    backward(&x);
    double err[5];
    check(&x, err);
    /* Every element of dqkv written (no NaN left of the poison). */
    int64_t unwritten = 0;
    for (int64_t i = 0; i < 3 * x.n; i++)
        unwritten += isnan(x.dqkv[i]) != 0;
    double worst = 0.0;
    for (int i = 0; i < 5; i++)
        worst = fmax(worst, err[i]);
    tap_ok(worst <= TOL && unwritten == 0,
           "%s: b %" PRId64 ", %" PRId64 " heads, t %" PRId64 ", hd %" PRId64 " (tiles of %" PRId64
           "), q, k in [%g, %g): o %.1e, lse %.1e, dq %.1e, dk %.1e, dv %.1e"
           " (at most %.0e); %" PRId64 " of dqkv unwritten",
           s->packed ? "packed" : "apart", s->b, s->heads, s->t, s->hd, chf_tile_rows(s->hd), s->lo,
           s->hi, err[0], err[1], err[2], err[3], err[4], TOL, unwritten);
    free(x.qkv);
    free(x.dqkv);
    free(x.o);
    free(x.dout);
    free(x.lse);
    free(x.d);
}

int main(void)
{
    static const shapes cases[] = {
        {1, 1, 1, 1, 0, -1, 1},    {2, 3, 5, 4, 1, -1, 1},    {1, 2, 64, 16, 1, -1, 1},
        {1, 1, 65, 32, 0, -1, 1},  {2, 2, 130, 64, 1, -1, 1}, {1, 1, 129, 128, 1, -1, 1},
        {1, 2, 70, 48, 1, -1, 1},  {1, 1, 40, 256, 0, -1, 1}, {1, 1, 33, 200, 1, -1, 1},
        {1, 2, 129, 64, 1, -4, 4}, {2, 1, 200, 16, 0, -4, 4}, {1, 1, 100, 128, 1, -3, 3},
    };
    int n = (int)(sizeof cases / sizeof cases[0]);
    tap_plan(n);
    tap_rng rng = {0x5eed};
    for (int i = 0; i < n; i++)
        run(&cases[i], &rng);
    return tap_done();
}
