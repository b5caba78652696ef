/* Fused causal attention (lib/backend.h's attention slots, launched by
 * flash.c), FlashAttention's scheme as the CUDA backend's
 * (backends/cuda/flash.h), with lib/kernels/attn.h's formulas: no [T, T]
 * matrix is ever stored.
 *
 * Every kernel but flash_d is a 2-D launch: dimension 1 the matrix
 * bh = n heads + h of b heads, dimension 0 its rows, in work-groups of G
 * work-items, each owning one row (a query row in the forward and in the
 * dq pass, a key row in the dk, dv pass) with its vectors in private
 * arrays. The group walks the other side's rows in tiles of `rows` rows,
 * which its work-items load together into local memory, [rows][hd] each:
 *
 *   for each tile: barrier; load (every work-item a share); barrier;
 *                  every work-item its own row against the tile
 *
 * Work-items past the last row load their share and skip the rest, so
 * every barrier is reached by the whole group. Every sum runs in one
 * work-item in the order of the rows: the same bits on every run.
 * Products in f32 (the slot's `half` is a format the products may round
 * to; these do not), each product-sum rounded once (fma) as CUDA's are.
 *
 * program.c places this file in the program once per variant, each after
 * its FLASH_HD, FLASH_LOCAL and FLASH_NAME (the suffix of its names):
 * - FLASH_HD 16, 32, 64 or 128: that head size, the loops over a row of
 *   constant length (the rows' arrays can stay in registers); 0: any head
 *   size up to FLASH_HD_MAX;
 * - FLASH_LOCAL 1: the tiles in local memory; 0 (with FLASH_HD 0): no
 *   local memory, each tile read where it lies in global memory, for a
 *   device whose local memory holds not even one row of each tile.
 * What is the same for every variant comes once (FLASH_ONCE). Placed
 * after prelude.h and attn.h. */

#ifndef FLASH_ONCE
#define FLASH_ONCE

/* The largest head size (CUDA's CHF_HD_MAX); flash.c refuses more. */
#define FLASH_HD_MAX 256

/* Where the matrices are: matrix bh = n heads + h starts at row n t,
 * column h hd of q, k, v, dq, dk, dv (rows ld floats apart) and of o, dout
 * (rows ldo apart); lse and d (the backward's dout.o) are [b heads, t]. */
typedef struct flash_geom {
    int t, heads, hd, ld, ldo;
    float scale;
} flash_geom;

/* The parameters every 2-D kernel takes after its arrays: the geometry,
 * then the rows of its tiles. */
#define FLASH_GEOM_PARAMS int t, int heads, int hd, int ld, int ldo, float scale, int rows

/* A work-item's place in a 2-D launch: its matrix bh, the rows of its
 * group first .. end (end at most t) and its own row. */
typedef struct flash_place {
    int bh, first, end, row;
} flash_place;

flash_place flash_place_of(const flash_geom *g)
{
    int group = (int)get_local_size(0), first = (int)get_group_id(0) * group;
    flash_place p = {(int)get_group_id(1), first, min(first + group, g->t),
                     first + (int)get_local_id(0)};
    return p;
}

/* Offset of element 0 of row r of matrix bh in an array of row stride ld
 * (below b t ld: flash.c checks that it fits an int). */
int flash_at(const flash_geom *g, int ld, int bh, int r)
{
    int n = bh / g->heads, h = bh - n * g->heads;
    return (n * g->t + r) * ld + h * g->hd;
}

/* Row i of matrix bh of x (row stride ld) into the private x_i, or zeros
 * past the last row. */
void flash_row(const flash_geom *g, float *xi, __global const float *x, int ld, int bh, int i)
{
    for (int c = 0; c < g->hd; c++)
        xi[c] = i < g->t ? x[flash_at(g, ld, bh, i) + c] : 0.0f;
}

void flash_zero(const flash_geom *g, float *x)
{
    for (int c = 0; c < g->hd; c++)
        x[c] = 0.0f;
}

/* The work-item's share of a tile: rows r0 .. r0 + rows of matrix bh of x
 * (row stride ld; those past the last row as 0) into xs [rows][hd]. */
void flash_load(const flash_geom *g, __local float *xs, __global const float *x, int ld, int bh,
                int r0, int rows)
{
    int hd = g->hd;
    for (int e = get_local_id(0); e < rows * hd; e += get_local_size(0)) {
        int r = e / hd, c = e - r * hd;
        xs[e] = r0 + r < g->t ? x[flash_at(g, ld, bh, r0 + r) + c] : 0.0f;
    }
}

/* The same for one float a row (lse, d) of [b heads, t]. */
void flash_load_scalars(const flash_geom *g, __local float *xs, __global const float *x, int bh,
                        int r0, int rows)
{
    for (int r = get_local_id(0); r < rows; r += get_local_size(0))
        xs[r] = r0 + r < g->t ? x[bh * g->t + r0 + r] : 0.0f;
}

/* The backward's first pass, a work-item per row r of the n = b heads t:
 * d[r] = dout_r . o_r. */
__kernel void flash_d(__global float *d, ulong d_off, __global const float *dout, ulong dout_off,
                      __global const float *o, ulong o_off, int t, int heads, int hd, int ldo,
                      int n)
{
    int r = get_global_id(0);
    if (r >= n)
        return;
    flash_geom g = {t, heads, hd, ldo, ldo, 0.0f};
    int at = flash_at(&g, ldo, r / t, r % t);
    __global const float *a = dout + dout_off + at, *b = o + o_off + at;
    float s = 0.0f;
    for (int c = 0; c < hd; c++)
        s = fma(a[c], b[c], s);
    d[d_off + r] = s;
}

#endif /* FLASH_ONCE */

#if FLASH_HD
#define FLASH_ROW FLASH_HD
#else
#define FLASH_ROW FLASH_HD_MAX
#endif
#if FLASH_LOCAL
#define FLASH_TILE __local
/* A kernel's or a function's parameter for tile x, and that argument
 * passed on (nothing without local memory). */
#define FLASH_TILE_ARG(x) , __local float *x
#define FLASH_TILE_PASS(x) , x
#else
#define FLASH_TILE __global
#define FLASH_TILE_ARG(x)
#define FLASH_TILE_PASS(x)
#endif

/* The kernel's geometry, its head size fixed where FLASH_HD is not 0. */
flash_geom FLASH_NAME(flash_geom_of)(int t, int heads, int hd, int ld, int ldo, float scale)
{
    flash_geom g = {t, heads, FLASH_HD ? FLASH_HD : hd, ld, ldo, scale};
    return g;
}

float FLASH_NAME(flash_dot)(const flash_geom *g, const float *a, FLASH_TILE const float *b)
{
    float s = 0.0f;
    for (int c = 0; c < g->hd; c++)
        s = fma(a[c], b[c], s);
    return s;
}

/* Keys j0 .. j0 + rows of matrix bh for a query row's pass (the forward,
 * dq): *kt and *vt where the work-item reads them, rows of the returned
 * stride apart. With local memory the whole group loads them into ks and
 * vs between two barriers, so every work-item of the group must call it. */
int FLASH_NAME(flash_keys)(const flash_geom *g, __global const float *k, __global const float *v,
                           int bh, int j0, int rows, FLASH_TILE const float **kt,
                           FLASH_TILE const float **vt FLASH_TILE_ARG(ks) FLASH_TILE_ARG(vs))
{
#if FLASH_LOCAL
    barrier(CLK_LOCAL_MEM_FENCE);
    flash_load(g, ks, k, g->ld, bh, j0, rows);
    flash_load(g, vs, v, g->ld, bh, j0, rows);
    barrier(CLK_LOCAL_MEM_FENCE);
    *kt = ks;
    *vt = vs;
    return g->hd;
#else
    int at = flash_at(g, g->ld, bh, j0);
    *kt = k + at;
    *vt = v + at;
    return g->ld;
#endif
}

/* ---- forward: a work-item per query row i ------------------------------------ */

/* Keys j0 .. j0 + rows (ks, vs: rows `st` floats apart) against row i:
 * those j <= i. *m and *l: the running maximum and sum. */
void FLASH_NAME(flash_fwd_tile)(const flash_geom *g, int i, int j0, int rows, float *m, float *l,
                                const float *qi, float *acc, FLASH_TILE const float *ks,
                                FLASH_TILE const float *vs, int st)
{
    for (int r = 0; r < rows && j0 + r <= i && i < g->t; r++) {
        float s = g->scale * FLASH_NAME(flash_dot)(g, qi, ks + r * st);
        if (s > *m) {
            float k = chk_attn_rescale(*m, s);
            *l *= k;
            for (int c = 0; c < g->hd; c++)
                acc[c] *= k;
            *m = s;
        }
        float p = chk_attn_p(s, *m);
        *l += p;
        for (int c = 0; c < g->hd; c++)
            acc[c] = fma(p, vs[r * st + c], acc[c]);
    }
}

__kernel void FLASH_NAME(flash_forward)(__global float *o, ulong o_off, __global float *lse,
                                        ulong lse_off, __global const float *q, ulong q_off,
                                        __global const float *k, ulong k_off,
                                        __global const float *v, ulong v_off,
                                        FLASH_GEOM_PARAMS FLASH_TILE_ARG(ks) FLASH_TILE_ARG(vs))
{
    const flash_geom g = FLASH_NAME(flash_geom_of)(t, heads, hd, ld, ldo, scale);
    const flash_place here = flash_place_of(&g);
    int i = here.row;
    float qi[FLASH_ROW], acc[FLASH_ROW], m = -INFINITY, l = 0.0f;
    flash_row(&g, qi, q + q_off, g.ld, here.bh, i);
    flash_zero(&g, acc);
    for (int j0 = 0; j0 < here.end; j0 += rows) {
        FLASH_TILE const float *kt, *vt;
        int st = FLASH_NAME(flash_keys)(&g, k + k_off, v + v_off, here.bh, j0, rows, &kt,
                                        &vt FLASH_TILE_PASS(ks) FLASH_TILE_PASS(vs));
        FLASH_NAME(flash_fwd_tile)(&g, i, j0, rows, &m, &l, qi, acc, kt, vt, st);
    }
    if (i >= g.t)
        return;
    __global float *oi = o + o_off + flash_at(&g, g.ldo, here.bh, i);
    for (int c = 0; c < g.hd; c++)
        oi[c] = acc[c] / l;
    lse[lse_off + here.bh * g.t + i] = chk_attn_lse(m, l);
}

/* ---- backward -----------------------------------------------------------------
 * d = dout.o per query row first (flash_d), then dq by query rows and dk,
 * dv by key rows, each rebuilding p = exp(s - lse_i) and
 * ds = p (dout_i . v_j - d_i). */

/* dq: a work-item per query row i, keys j0 .. j0 + rows in tiles (ks, vs:
 * rows `st` floats apart). */
void FLASH_NAME(flash_dq_tile)(const flash_geom *g, int i, int j0, int rows, float lse_i,
                               float d_i, const float *qi, const float *doi, float *dq,
                               FLASH_TILE const float *ks, FLASH_TILE const float *vs, int st)
{
    for (int r = 0; r < rows && j0 + r <= i && i < g->t; r++) {
        float p = chk_attn_p(g->scale * FLASH_NAME(flash_dot)(g, qi, ks + r * st), lse_i);
        float ds = chk_attn_ds(p, FLASH_NAME(flash_dot)(g, doi, vs + r * st), d_i);
        for (int c = 0; c < g->hd; c++)
            dq[c] = fma(ds, ks[r * st + c], dq[c]);
    }
}

__kernel void FLASH_NAME(flash_dq)(__global float *dq, ulong dq_off, __global const float *q,
                                   ulong q_off, __global const float *k, ulong k_off,
                                   __global const float *v, ulong v_off,
                                   __global const float *dout, ulong dout_off,
                                   __global const float *lse, ulong lse_off,
                                   __global const float *d, ulong d_off,
                                   FLASH_GEOM_PARAMS FLASH_TILE_ARG(ks) FLASH_TILE_ARG(vs))
{
    const flash_geom g = FLASH_NAME(flash_geom_of)(t, heads, hd, ld, ldo, scale);
    const flash_place here = flash_place_of(&g);
    int i = here.row, own = here.bh * g.t + i;
    float qi[FLASH_ROW], doi[FLASH_ROW], acc[FLASH_ROW];
    flash_row(&g, qi, q + q_off, g.ld, here.bh, i);
    flash_row(&g, doi, dout + dout_off, g.ldo, here.bh, i);
    flash_zero(&g, acc);
    float lse_i = i < g.t ? lse[lse_off + own] : 0.0f, d_i = i < g.t ? d[d_off + own] : 0.0f;
    for (int j0 = 0; j0 < here.end; j0 += rows) {
        FLASH_TILE const float *kt, *vt;
        int st = FLASH_NAME(flash_keys)(&g, k + k_off, v + v_off, here.bh, j0, rows, &kt,
                                        &vt FLASH_TILE_PASS(ks) FLASH_TILE_PASS(vs));
        FLASH_NAME(flash_dq_tile)(&g, i, j0, rows, lse_i, d_i, qi, doi, acc, kt, vt, st);
    }
    if (i >= g.t)
        return;
    __global float *dqi = dq + dq_off + flash_at(&g, g.ld, here.bh, i);
    for (int c = 0; c < g.hd; c++)
        dqi[c] = g.scale * acc[c];
}

/* dk, dv: a work-item per key row j, queries i0 .. i0 + rows in tiles
 * (qs, dos: rows qst and dst floats apart; their lse and d in ls, ds). */
void FLASH_NAME(flash_dkv_tile)(const flash_geom *g, int j, int i0, int rows, const float *kj,
                                const float *vj, float *dk, float *dv, FLASH_TILE const float *qs,
                                int qst, FLASH_TILE const float *dos, int dst,
                                FLASH_TILE const float *ls, FLASH_TILE const float *ds)
{
    for (int r = 0; r < rows && i0 + r < g->t && j < g->t; r++) {
        if (i0 + r < j)
            continue;
        FLASH_TILE const float *qi = qs + r * qst, *doi = dos + r * dst;
        float p = chk_attn_p(g->scale * FLASH_NAME(flash_dot)(g, kj, qi), ls[r]);
        float s = chk_attn_ds(p, FLASH_NAME(flash_dot)(g, vj, doi), ds[r]);
        for (int c = 0; c < g->hd; c++) {
            dv[c] = fma(p, doi[c], dv[c]);
            dk[c] = fma(s, qi[c], dk[c]);
        }
    }
}

__kernel void FLASH_NAME(flash_dkv)(__global float *dk, ulong dk_off, __global float *dv,
                                    ulong dv_off, __global const float *q, ulong q_off,
                                    __global const float *k, ulong k_off,
                                    __global const float *v, ulong v_off,
                                    __global const float *dout, ulong dout_off,
                                    __global const float *lse, ulong lse_off,
                                    __global const float *d, ulong d_off,
                                    FLASH_GEOM_PARAMS FLASH_TILE_ARG(qs) FLASH_TILE_ARG(dos)
                                        FLASH_TILE_ARG(ls) FLASH_TILE_ARG(ds))
{
    const flash_geom g = FLASH_NAME(flash_geom_of)(t, heads, hd, ld, ldo, scale);
    const flash_place here = flash_place_of(&g);
    int j = here.row;
    q += q_off;
    dout += dout_off;
    lse += lse_off;
    d += d_off;
    float kj[FLASH_ROW], vj[FLASH_ROW], gk[FLASH_ROW], gv[FLASH_ROW];
    flash_row(&g, kj, k + k_off, g.ld, here.bh, j);
    flash_row(&g, vj, v + v_off, g.ld, here.bh, j);
    flash_zero(&g, gk);
    flash_zero(&g, gv);
    /* the first query that sees a key of the group is the group's first row */
    for (int i0 = here.first; i0 < g.t; i0 += rows) {
#if FLASH_LOCAL
        barrier(CLK_LOCAL_MEM_FENCE);
        flash_load(&g, qs, q, g.ld, here.bh, i0, rows);
        flash_load(&g, dos, dout, g.ldo, here.bh, i0, rows);
        flash_load_scalars(&g, ls, lse, here.bh, i0, rows);
        flash_load_scalars(&g, ds, d, here.bh, i0, rows);
        barrier(CLK_LOCAL_MEM_FENCE);
        FLASH_NAME(flash_dkv_tile)(&g, j, i0, rows, kj, vj, gk, gv, qs, g.hd, dos, g.hd, ls, ds);
#else
        int row0 = here.bh * g.t + i0;
        FLASH_NAME(flash_dkv_tile)(&g, j, i0, rows, kj, vj, gk, gv,
                                   q + flash_at(&g, g.ld, here.bh, i0), g.ld,
                                   dout + flash_at(&g, g.ldo, here.bh, i0), g.ldo, lse + row0,
                                   d + row0);
#endif
    }
    if (j >= g.t)
        return;
    int own = flash_at(&g, g.ld, here.bh, j);
    for (int c = 0; c < g.hd; c++) {
        dk[dk_off + own + c] = g.scale * gk[c];
        dv[dv_off + own + c] = gv[c];
    }
}

#undef FLASH_ROW
#undef FLASH_TILE
#undef FLASH_TILE_ARG
#undef FLASH_TILE_PASS
#undef FLASH_HD
#undef FLASH_LOCAL
#undef FLASH_NAME
