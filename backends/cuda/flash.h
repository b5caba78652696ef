/* The tiles of the CUDA backend's fused causal attention (attention.cu),
 * FlashAttention's scheme: no [T, T] matrix is ever stored. Written in the
 * subset C and CUDA share so that tests/test-cuda-flash.c runs these very
 * functions on the CPU, stepping through a block's threads phase by phase
 * as the GPU runs them between its barriers. The formulas are
 * lib/kernels/attn.h's.
 *
 * Each kernel is one block of CHF_THREADS threads per CHF_THREADS rows of
 * one matrix (n, h) of b * heads, each thread owning one row (a query row
 * in the forward and in the dq pass, a key row in the dk, dv pass), its
 * vectors in its own arrays. The block walks the other side's rows in
 * tiles of chf_tile_rows(hd) rows that its threads load together into
 * shared arrays, [rows][hd] each:
 *
 *   begin (own row)
 *   for each tile: barrier; load (every thread a share); barrier;
 *                  tile (every thread its own row against the tile)
 *   end (own row)
 *
 * Threads past the last row load their share and skip the rest, so every
 * barrier is reached by every thread. Every sum runs in one thread, in the
 * order of the rows: the same bits on every run. Products in f32 (the
 * slot's `half` is a format the products may round to; these do not). */
#ifndef CHORUS_CUDA_FLASH_H
#define CHORUS_CUDA_FLASH_H

#include <math.h>
#include <stdint.h>
#include "kernels/attn.h"

#ifdef __CUDACC__
#define CHF_FN static __host__ __device__ __forceinline__
#else
#define CHF_FN static inline
#endif
/* Every product-sum of a row (the dots, the accumulations) rounds once,
 * as fmaf does wherever it runs (the test on the CPU too): the module's
 * --fmad=false, which keeps the elementwise kernels' bits, does not halve
 * these kernels' arithmetic. */
#define CHF_FMA(a, b, c) fmaf(a, b, c)

/* Threads of a block: the rows each block owns. */
#define CHF_THREADS 64
/* The largest head size; the floats of one shared tile (16 KiB). */
#define CHF_HD_MAX 256
#define CHF_TILE_FLOATS 4096

/* Where the matrices are (lib/backend.h's attention slots): matrix bh =
 * n heads + h starts at row n t, column h hd of q, k, v (rows ld floats
 * apart) and of o, dout (rows ldo apart); lse and d (the backward's
 * dout.o) are [b heads, t]. */
typedef struct chf_geom {
    int64_t t, heads, hd, ld, ldo;
    float scale;
} chf_geom;

/* Rows of the other side per tile: as many as fill CHF_TILE_FLOATS, at
 * most CHF_THREADS. */
CHF_FN int64_t chf_tile_rows(int64_t hd)
{
    int64_t rows = CHF_TILE_FLOATS / hd;
    return rows < CHF_THREADS ? rows : CHF_THREADS;
}

/* Offset of element 0 of row r of matrix bh in an array of row stride ld. */
CHF_FN int64_t chf_at(const chf_geom *g, int64_t ld, int64_t bh, int64_t r)
{
    int64_t n = bh / g->heads, h = bh % g->heads;
    return (n * g->t + r) * ld + h * g->hd;
}

/* The keys block `blk` (rows blk CHF_THREADS ...) of queries needs: those
 * before its last row, causal. */
CHF_FN int64_t chf_keys_end(const chf_geom *g, int64_t blk)
{
    int64_t end = (blk + 1) * CHF_THREADS;
    return end < g->t ? end : g->t;
}

/* The first query that sees a key of block `blk`. */
CHF_FN int64_t chf_queries_begin(int64_t blk)
{
    return blk * CHF_THREADS;
}

/* Thread `tid`'s share of a tile: rows r0 .. r0 + rows of the matrix in x
 * (rows past t as 0) into xs [rows][hd]. */
CHF_FN void chf_load(const chf_geom *g, const float *x, int64_t ld, int64_t bh, int64_t r0,
                     int64_t rows, int tid, float *xs)
{
    int64_t hd = g->hd;
    for (int64_t e = tid; e < rows * hd; e += CHF_THREADS) {
        int64_t r = e / hd, c = e - r * hd;
        xs[e] = r0 + r < g->t ? x[chf_at(g, ld, bh, r0 + r) + c] : 0.0f;
    }
}

/* The same for one float a row (lse, d) of [b heads, t]. */
CHF_FN void chf_load_scalars(const chf_geom *g, const float *x, int64_t bh, int64_t r0,
                             int64_t rows, int tid, float *xs)
{
    for (int64_t r = tid; r < rows; r += CHF_THREADS)
        xs[r] = r0 + r < g->t ? x[bh * g->t + r0 + r] : 0.0f;
}

CHF_FN float chf_dot(const float *a, const float *b, int64_t hd)
{
    float s = 0.0f;
    for (int64_t c = 0; c < hd; c++)
        s = CHF_FMA(a[c], b[c], s);
    return s;
}

/* ---- forward: a thread per query row i -------------------------------------- */

typedef struct chf_fwd_row {
    float m, l; /* the running maximum and sum */
} chf_fwd_row;

CHF_FN chf_fwd_row chf_fwd_begin(const chf_geom *g, const float *q, int64_t bh, int64_t i,
                                 float *qi, float *acc)
{
    chf_fwd_row st = {-INFINITY, 0.0f};
    for (int64_t c = 0; c < g->hd; c++) {
        qi[c] = i < g->t ? q[chf_at(g, g->ld, bh, i) + c] : 0.0f;
        acc[c] = 0.0f;
    }
    return st;
}

/* Keys j0 .. j0 + rows (ks, vs) against row i: those j <= i. */
CHF_FN chf_fwd_row chf_fwd_tile(const chf_geom *g, int64_t i, int64_t j0, int64_t rows,
                                chf_fwd_row st, const float *qi, float *acc, const float *ks,
                                const float *vs)
{
    int64_t hd = g->hd;
    for (int64_t r = 0; r < rows && j0 + r <= i && i < g->t; r++) {
        float s = g->scale * chf_dot(qi, ks + r * hd, hd);
        if (s > st.m) {
            float k = chk_attn_rescale(st.m, s);
            st.l *= k;
            for (int64_t c = 0; c < hd; c++)
                acc[c] *= k;
            st.m = s;
        }
        float p = chk_attn_p(s, st.m);
        st.l += p;
        for (int64_t c = 0; c < hd; c++)
            acc[c] = CHF_FMA(p, vs[r * hd + c], acc[c]);
    }
    return st;
}

CHF_FN void chf_fwd_end(const chf_geom *g, float *o, float *lse, int64_t bh, int64_t i,
                        chf_fwd_row st, const float *acc)
{
    if (i >= g->t)
        return;
    for (int64_t c = 0; c < g->hd; c++)
        o[chf_at(g, g->ldo, bh, i) + c] = acc[c] / st.l;
    lse[bh * g->t + i] = chk_attn_lse(st.m, st.l);
}

/* ---- backward ---------------------------------------------------------------
 * d[bh t + i] = dout_i . o_i first (chf_bwd_d), then dq by query rows and
 * dk, dv by key rows, each rebuilding p = exp(s - lse_i) and
 * ds = p (dout_i . v_j - d_i). */

CHF_FN float chf_bwd_d(const chf_geom *g, const float *dout, const float *o, int64_t bh, int64_t i)
{
    int64_t at = chf_at(g, g->ldo, bh, i);
    return chf_dot(dout + at, o + at, g->hd);
}

/* dq: a thread per query row i, keys in tiles (ks, vs). */
CHF_FN void chf_dq_begin(const chf_geom *g, const float *q, const float *dout, int64_t bh,
                         int64_t i, float *qi, float *doi, float *dq)
{
    for (int64_t c = 0; c < g->hd; c++) {
        int ok = i < g->t;
        qi[c] = ok ? q[chf_at(g, g->ld, bh, i) + c] : 0.0f;
        doi[c] = ok ? dout[chf_at(g, g->ldo, bh, i) + c] : 0.0f;
        dq[c] = 0.0f;
    }
}

CHF_FN void chf_dq_tile(const chf_geom *g, int64_t i, int64_t j0, int64_t rows, float lse_i,
                        float d_i, const float *qi, const float *doi, float *dq, const float *ks,
                        const float *vs)
{
    int64_t hd = g->hd;
    for (int64_t r = 0; r < rows && j0 + r <= i && i < g->t; r++) {
        float p = chk_attn_p(g->scale * chf_dot(qi, ks + r * hd, hd), lse_i);
        float ds = chk_attn_ds(p, chf_dot(doi, vs + r * hd, hd), d_i);
        for (int64_t c = 0; c < hd; c++)
            dq[c] = CHF_FMA(ds, ks[r * hd + c], dq[c]);
    }
}

CHF_FN void chf_dq_end(const chf_geom *g, float *dq_out, int64_t bh, int64_t i, const float *dq)
{
    if (i >= g->t)
        return;
    for (int64_t c = 0; c < g->hd; c++)
        dq_out[chf_at(g, g->ld, bh, i) + c] = g->scale * dq[c];
}

/* dk, dv: a thread per key row j, queries in tiles (qs, dos, with their
 * lse and d in ls, ds). */
CHF_FN void chf_dkv_begin(const chf_geom *g, const float *k, const float *v, int64_t bh, int64_t j,
                          float *kj, float *vj, float *dk, float *dv)
{
    for (int64_t c = 0; c < g->hd; c++) {
        int ok = j < g->t;
        kj[c] = ok ? k[chf_at(g, g->ld, bh, j) + c] : 0.0f;
        vj[c] = ok ? v[chf_at(g, g->ld, bh, j) + c] : 0.0f;
        dk[c] = 0.0f;
        dv[c] = 0.0f;
    }
}

CHF_FN void chf_dkv_tile(const chf_geom *g, int64_t j, int64_t i0, int64_t rows, const float *kj,
                         const float *vj, float *dk, float *dv, const float *qs, const float *dos,
                         const float *ls, const float *ds)
{
    int64_t hd = g->hd;
    for (int64_t r = 0; r < rows && i0 + r < g->t; r++) {
        if (i0 + r < j)
            continue;
        const float *qi = qs + r * hd, *doi = dos + r * hd;
        float p = chk_attn_p(g->scale * chf_dot(qi, kj, hd), ls[r]);
        float s = chk_attn_ds(p, chf_dot(doi, vj, hd), ds[r]);
        for (int64_t c = 0; c < hd; c++) {
            dv[c] = CHF_FMA(p, doi[c], dv[c]);
            dk[c] = CHF_FMA(s, qi[c], dk[c]);
        }
    }
}

CHF_FN void chf_dkv_end(const chf_geom *g, float *dk_out, float *dv_out, int64_t bh, int64_t j,
                        const float *dk, const float *dv)
{
    if (j >= g->t)
        return;
    int64_t at = chf_at(g, g->ld, bh, j);
    for (int64_t c = 0; c < g->hd; c++) {
        dk_out[at + c] = g->scale * dk[c];
        dv_out[at + c] = dv[c];
    }
}

#endif
