/* The host's fused causal attention and its backward, FlashAttention's
 * scheme on the CPU: a tile of FA_Q queries against tiles of FA_K keys,
 * the scores of a tile in cache (a product each way in registers,
 * tile_mm.c, where the CPU has AVX2 and FMA or AVX-512, and with the
 * library's single-threaded sgemm elsewhere), a running maximum and sum
 * per row (online softmax), the tiles above the diagonal never computed.
 * Backward rebuilds each tile's probabilities from lse. Up to
 * FA_ROWS_MAX the forward takes whole rows (fa_forward_rows) and the
 * backward a tile of keys against all its queries at once. This file
 * holds the f32 kernel and the ops' entry points, which hand the mixed
 * op in bf16 to attention_amx.c where the CPU has AMX.
 *
 * Each [B] matrix is one thread's, each output element computed in an
 * order fixed by the shape alone: the same bits whatever the thread
 * count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host.h"
#include "vec.h"
#include "attention.h"

/* One thread's tiles: s (scores, then probabilities) and dp [FA_Q *
 * fa_row_floats(t)] (rows of FA_K, or whole rows), acc [FA_Q * hd], m
 * and l [FA_Q], d [t] (backward's rowsum(dout * o); forward's
 * corrections of a tile's rows, fa_rows_update), kt and vt [hd * t] (the
 * matrix's k and v transposed, for the tile products, fa_mm_bt). */
typedef struct fa_tiles {
    float *s, *dp, *acc, *m, *l, *d, *kt, *vt;
} fa_tiles;

/* The forward takes whole rows (fa_forward_rows) where the length is at
 * most FA_ROWS_MAX: a tile of queries' scores against all their keys,
 * [FA_Q, fa_row_floats(t)], stay in the thread's L2. */
enum {
    FA_ROWS_MAX = 512
};

#ifdef CHI_TEST_HOOKS
static int fa_rows_allowed = 1;

void chi_host_attention_whole_rows(int on)
{
    fa_rows_allowed = on;
}
#else
enum {
    fa_rows_allowed = 1
};
#endif

static int fa_whole_rows(int64_t tt)
{
    return fa_rows_allowed && tt <= FA_ROWS_MAX;
}

/* A row of s: FA_K floats, or where the forward takes whole rows the
 * length rounded up to 16 (a row pass stores whole 16-float vectors). */
static int64_t fa_row_floats(int64_t tt)
{
    int64_t whole = (tt + 15) / 16 * 16;
    return fa_whole_rows(tt) && whole > FA_K ? whole : FA_K;
}

/* A thread's tiles in floats, rounded up to 64 bytes. */
static size_t fa_tiles_floats(int64_t hd, int64_t tt)
{
    size_t n = (size_t)(2 * FA_Q * fa_row_floats(tt) + FA_Q * hd + 2 * FA_Q + tt + 2 * hd * tt);
    return (n + 15) / 16 * 16;
}

/* The tiles in `mem`, fa_tiles_floats(hd, tt) of them. */
static void fa_tiles_at(fa_tiles *t, float *mem, int64_t hd, int64_t tt)
{
    t->s = mem;
    t->dp = t->s + FA_Q * fa_row_floats(tt);
    t->acc = t->dp + FA_Q * fa_row_floats(tt);
    t->m = t->acc + FA_Q * hd;
    t->l = t->m + FA_Q;
    t->d = t->l + FA_Q;
    t->kt = t->d + tt;
    t->vt = t->kt + hd * tt;
}

/* x[0..nk) of a tile row: exp(x - sub) for the first w, then 0. Returns
 * the sum of the exponentials, in eight lanes added pairwise
 * (CHI_LANES_TOTAL). */
CHI_INLINE float fa_row_exp(float *x, int64_t w, int64_t nk, float sub)
{
    v8f sum = {0};
    int64_t j = 0;
    for (; j < w; j += 8) {
        /* the lanes past w: exp(-inf) = 0 */
        v8f e = chi_exp8_nonpositive(chi_load8(x + j, w - j, -INFINITY) - sub);
        memcpy(x + j, &e, sizeof e);
        sum += e;
    }
    for (; j < nk; j++)
        x[j] = 0.0f;
    return CHI_LANES_TOTAL(sum, 8);
}

#ifdef CHI_HAVE_AVX512
/* The row passes sixteen lanes at a time where the tile products run in
 * AVX-512, in intrinsics (GCC's generic 512-bit compares become
 * lane-by-lane code without AVX-512DQ): per lane the same operations as
 * chi_row_max8's and fa_row_exp's, the sum in sixteen lanes. */

__attribute__((target("avx512f"))) static float fa_row_max512(const float *x, int64_t w)
{
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < w; j += 16) {
        __m512 b = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), CHI_LANES16(w - j), x + j);
        m = _mm512_mask_mov_ps(m, _mm512_cmp_ps_mask(b, m, _CMP_GT_OQ), b);
    }
    return _mm512_reduce_max_ps(m);
}

__attribute__((target("avx512f"))) static float fa_row_exp512(float *x, int64_t w, int64_t nk,
                                                              float sub)
{
    __m512 sum = _mm512_setzero_ps(), vs = _mm512_set1_ps(sub);
    int64_t j = 0;
    for (; j < w; j += 16) {
        __m512 v = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), CHI_LANES16(w - j), x + j);
        __m512 e = chi_exp16_nonpositive(_mm512_sub_ps(v, vs));
        _mm512_storeu_ps(x + j, e); /* within the row's FA_K floats; past w, 0 */
        sum = _mm512_add_ps(sum, e);
    }
    for (; j < nk; j++)
        x[j] = 0.0f;
    return _mm512_reduce_add_ps(sum);
}

#endif

/* The row passes for the tile products' instruction set `isa`. */
CHI_INLINE float fa_max(int isa, const float *x, int64_t w)
{
#ifdef CHI_HAVE_AVX512
    if (isa == CHI_TILE_AVX512)
        return fa_row_max512(x, w);
#endif
    (void)isa;
    return chi_row_max8(x, w);
}

CHI_INLINE float fa_exp(int isa, float *x, int64_t w, int64_t nk, float sub)
{
#ifdef CHI_HAVE_AVX512
    if (isa == CHI_TILE_AVX512)
        return fa_row_exp512(x, w, nk, sub);
#endif
    (void)isa;
    return fa_row_exp(x, w, nk, sub);
}

/* The mq rows of a tile of scores s (rows FA_K apart, row r's valid
 * keys w(r)): each row's maximum, then the running maxima m, the
 * corrections exp(m - new m) (0 where m was -inf) eight rows at a time,
 * and each row's scores s[0..w) become exp(s - new m), s[w..nk) 0, its
 * sum l and its row of acc move to the new maximum. corr: scratch of mq
 * floats, read eight at a time (what lies past mq, within the thread's
 * tiles, is read and not used). */
CHI_INLINE void fa_rows_update(int isa, float *s, int64_t i0, int64_t j0, int64_t mq, int64_t nk,
                               float *m, float *l, float *corr, float *acc, int64_t hd)
{
    for (int64_t r = 0; r < mq; r++)
        corr[r] = fa_max(isa, s + r * FA_K, fa_width(i0 + r, j0, nk));
    for (int64_t r = 0; r < mq; r += 8) {
        v8f mx = chi_load8(corr + r, mq - r, 0.0f), old = chi_load8(m + r, mq - r, 0.0f);
        v8i first = old == -INFINITY;
        v8f m_new = chi_max8(old, mx);
        v8f c = (v8f)((v8i)chi_exp8_nonpositive(old - m_new) & ~first);
        for (int64_t u = 0; u < 8 && r + u < mq; u++) {
            corr[r + u] = c[u];
            m[r + u] = m_new[u];
        }
    }
    for (int64_t r = 0; r < mq; r++) {
        float c = corr[r], *a = acc + r * hd;
        l[r] = l[r] * c + fa_exp(isa, s + r * FA_K, fa_width(i0 + r, j0, nk), nk, m[r]);
        if (c != 1.0f) {
            CHI_OMP(omp simd)
            for (int64_t d = 0; d < hd; d++)
                a[d] *= c;
        }
    }
}

#ifdef CHI_TEST_HOOKS
CHI_CLONES_WIDE float chi_host_attention_row_max(int isa, const float *x, int64_t w)
{
    return fa_max(isa, x, w);
}

CHI_CLONES_WIDE float chi_host_attention_row_exp(int isa, float *x, int64_t w, int64_t nk,
                                                 float sub)
{
    return fa_exp(isa, x, w, nk, sub);
}
#endif

/* One tile product, chi_host_gemm_serial's arguments without trans_b: in
 * registers (tile_mm.c) where the CPU runs that, chi_host_gemm_serial's
 * otherwise. */
static ch_status fa_mm(const fa_job *j, int trans_a, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                       float *c, int64_t ldc)
{
    if (chi_host_tile_mm(j->isa, m, n, k, alpha, a, trans_a ? 1 : lda, trans_a ? lda : 1, b, ldb,
                         beta, c, ldc))
        return CH_OK;
    return chi_host_gemm_serial(trans_a, 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* c = alpha a b^T + beta c, a [m, k] and b [n, k]: from bt, b transposed
 * ([k, n] of rows ldbt apart, fa_transpose), in registers; from b itself
 * where the CPU runs neither tile build. */
static ch_status fa_mm_bt(const fa_job *j, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *bt, int64_t ldbt,
                          const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (chi_host_tile_mm(j->isa, m, n, k, alpha, a, lda, 1, bt, ldbt, beta, c, ldc))
        return CH_OK;
    return chi_host_gemm_serial(0, 1, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* x [t, hd] (rows ld apart) transposed into xt [hd, t], where the tile
 * products will read it. */
static void fa_transpose(const fa_job *j, const float *x, float *xt)
{
    if (j->isa != CHI_TILE_NONE)
        chi_host_tile_transpose(j->isa, j->t, j->hd, x, j->ld, xt, j->t);
}

/* d[r] = rowsum(dout * o) for r < tt (rows ldo apart): the backward's D,
 * in eight lanes in vec.h's order (CHI_LANES), so the same bits in every
 * build; eight chains of additions rather than one of hd per row, which
 * would wait on the adder at each step. */
CHI_INLINE void fa_rowdots(float *d, const float *dout, const float *o, int64_t tt, int64_t hd,
                           int64_t ldo)
{
    int64_t body = hd / 8 * 8;
    for (int64_t r = 0; r < tt; r++) {
        const float *g = dout + r * ldo, *y = o + r * ldo;
        v8f sum = {0}, a, b;
        for (int64_t c = 0; c < body; c += 8) {
            memcpy(&a, g + c, sizeof a);
            memcpy(&b, y + c, sizeof b);
            sum += a * b;
        }
        for (int64_t c = body; c < hd; c++)
            sum[c - body] += g[c] * y[c];
        d[r] = CHI_LANES_TOTAL(sum, 8);
    }
}

/* One matrix's work, its thread's tiles laid out in mem (fa_tiles_floats
 * of them, or chi_host_attention_amx_floats with j->amx). */
typedef ch_status (*fa_fn)(float *mem, const fa_job *j, int64_t i);

/* one(i) for every matrix i < b, shared out among the threads, each with
 * its tiles (in the stream's scratch: chi_host_scratch_take, so no call
 * allocates once the stream has the size; what a tile row holds past its
 * valid keys is read by chi_load8 and never used, so whatever an op before
 * left there does no harm); the first failure's message is kept. */
static ch_status fa_each(void *stream, const fa_job *job, int64_t b, fa_fn one)
{
    size_t per = job->amx ? chi_host_attention_amx_floats(job->hd, job->t)
                          : fa_tiles_floats(job->hd, job->t),
           threads = (size_t)chi_omp_max_threads();
    if (per > SIZE_MAX / sizeof(float) / threads)
        return chi_error(CH_ERR_OUT_OF_MEMORY,
                         "ch_attention: the threads' tiles for t=%lld, head size %lld "
                         "exceed the address space",
                         (long long)job->t, (long long)job->hd);
    chi_host_scratch sc;
    TRY(chi_host_scratch_take(stream, per * threads * sizeof(float), &sc));
    ch_status st = CH_OK;
    char why[512] = "";
    CHI_OMP(omp parallel)
    {
        float *mem = (float *)sc.mem + per * (size_t)chi_omp_thread();
        ch_status mine = CH_OK;
        if (job->amx)
            chi_host_amx_start();
        CHI_OMP(omp for schedule(dynamic, 1))
        for (int64_t i = 0; i < b; i++)
            if (mine == CH_OK)
                mine = one(mem, job, i);
        if (job->amx)
            chi_host_amx_stop();
        if (mine != CH_OK) {
            CHI_OMP(omp critical)
            {
                if (st == CH_OK) {
                    st = mine;
                    snprintf(why, sizeof why, "%s", ch_last_error());
                }
            }
        }
    }
    chi_host_scratch_give(&sc);
    return st == CH_OK ? CH_OK : chi_error(st, "%s", why);
}

/* The diagonal tile (i0 == j0) in halves: its queries [0, FA_H) see keys
 * [0, FA_H) only, so the products leave the block of those queries
 * against keys [FA_H, nk) out (probabilities 0 there: the same sums, a
 * quarter of the tile's work fewer). split: this tile, more than FA_H
 * queries and keys. */
enum {
    FA_H = FA_Q / 2
};

/* c [mq, nk] (rows FA_K apart) = alpha a b^T for a tile of queries a
 * [mq, hd] against keys b [nk, hd] (bt transposed, fa_mm_bt). */
static ch_status fa_s_product(const fa_job *j, int split, int64_t mq, int64_t nk, float alpha,
                              const float *a, int64_t lda, const float *bt, int64_t ldbt,
                              const float *b, int64_t ldb, float *c)
{
    if (!split)
        return fa_mm_bt(j, mq, nk, j->hd, alpha, a, lda, bt, ldbt, b, ldb, 0.0f, c, FA_K);
    TRY(fa_mm_bt(j, FA_H, FA_H, j->hd, alpha, a, lda, bt, ldbt, b, ldb, 0.0f, c, FA_K));
    return fa_mm_bt(j, mq - FA_H, nk, j->hd, alpha, a + FA_H * lda, lda, bt, ldbt, b, ldb, 0.0f,
                    c + FA_H * FA_K, FA_K);
}

/* With trans 0, c [mq, hd] = alpha p b + beta c: a tile p [mq, nk] (rows
 * FA_K apart) times the keys' rows b [nk, hd]; with trans 1, c [nk, hd] =
 * alpha p^T b + beta c: the tile transposed times the queries' rows b
 * [mq, hd]. */
static ch_status fa_tile_product(const fa_job *j, int trans, int split, int64_t mq, int64_t nk,
                                 float alpha, const float *p, const float *b, int64_t ldb,
                                 float beta, float *c, int64_t ldc)
{
    int64_t m = trans ? nk : mq, k = trans ? mq : nk;
    if (!split)
        return fa_mm(j, trans, m, j->hd, k, alpha, p, FA_K, b, ldb, beta, c, ldc);
    /* rows [0, FA_H) of c, then the rest (queries or keys past FA_H) */
    TRY(fa_mm(j, trans, FA_H, j->hd, trans ? mq : FA_H, alpha, p, FA_K, b, ldb, beta, c, ldc));
    return fa_mm(j, trans, m - FA_H, j->hd, trans ? mq - FA_H : nk, alpha,
                 p + FA_H * FA_K + (trans ? FA_H : 0), FA_K, b + (trans ? FA_H * ldb : 0), ldb,
                 beta, c + FA_H * ldc, ldc);
}

CHI_CLONES_WIDE static ch_status fa_forward_one(float *mem, const fa_job *j, int64_t i)
{
    fa_tiles tiles, *t = &tiles;
    fa_tiles_at(t, mem, j->hd, j->t);
    int64_t tt = j->t, hd = j->hd, ld = j->ld, ldo = j->ldo, at = fa_at(j, i, ld);
    const float *q = j->q + at, *k = j->k + at, *v = j->v + at;
    float *o = j->o + fa_at(j, i, ldo), *lse = j->lse + i * tt;
    fa_transpose(j, k, t->kt);
    for (int64_t i0 = 0; i0 < tt; i0 += FA_Q) {
        int64_t mq = tt - i0 < FA_Q ? tt - i0 : FA_Q;
        fa_start(t->m, t->l, t->acc, mq, mq * hd);
        /* Keys up to the tile's last query. */
        for (int64_t j0 = 0; j0 < i0 + mq; j0 += FA_K) {
            int64_t nk = i0 + mq - j0 < FA_K ? i0 + mq - j0 : FA_K;
            int split = i0 == j0 && mq > FA_H && nk > FA_H;
            TRY(fa_s_product(j, split, mq, nk, j->scale, q + i0 * ld, ld, t->kt + j0, tt,
                             k + j0 * ld, ld, t->s));
            fa_rows_update(j->isa, t->s, i0, j0, mq, nk, t->m, t->l, t->d, t->acc, hd);
            TRY(fa_tile_product(j, 0, split, mq, nk, 1.0f, t->s, v + j0 * ld, ld, 1.0f, t->acc,
                                hd));
        }
        fa_finish(o + i0 * ldo, ldo, lse + i0, t->acc, hd, t->m, t->l, mq, hd);
    }
    return CH_OK;
}

/* The forward by whole rows (t <= FA_ROWS_MAX): for each tile of
 * queries, in two halves of FA_H rows (the first half's keys end FA_H
 * before the second's, as the diagonal tile's split leaves them out),
 * the scores against all the half's keys in one product, each row's
 * maximum and exponentials once (no running rescale), and o = P v in one
 * product over all those keys, written to o and divided by the row's
 * sum there. */
CHI_CLONES_WIDE static ch_status fa_forward_rows(float *mem, const fa_job *j, int64_t i)
{
    fa_tiles tiles, *t = &tiles;
    fa_tiles_at(t, mem, j->hd, j->t);
    int64_t tt = j->t, hd = j->hd, ld = j->ld, ldo = j->ldo, at = fa_at(j, i, ld),
            sw = fa_row_floats(tt);
    const float *q = j->q + at, *k = j->k + at, *v = j->v + at;
    float *o = j->o + fa_at(j, i, ldo), *lse = j->lse + i * tt;
    fa_transpose(j, k, t->kt);
    for (int64_t i0 = 0; i0 < tt; i0 += FA_H) {
        int64_t mq = tt - i0 < FA_H ? tt - i0 : FA_H, nk = i0 + mq;
        float *s = t->s, *out = o + i0 * ldo;
        TRY(fa_mm_bt(j, mq, nk, hd, j->scale, q + i0 * ld, ld, t->kt, tt, k, ld, 0.0f, s, sw));
        for (int64_t r = 0; r < mq; r++) {
            float *row = s + r * sw;
            t->m[r] = fa_max(j->isa, row, i0 + r + 1);
            t->l[r] = fa_exp(j->isa, row, i0 + r + 1, nk, t->m[r]);
        }
        TRY(fa_mm(j, 0, mq, hd, nk, 1.0f, s, sw, v, ld, 0.0f, out, ldo));
        fa_finish(out, ldo, lse + i0, out, ldo, t->m, t->l, mq, hd);
    }
    return CH_OK;
}

/* In bf16 on AMX: asked for, the head size a multiple of the products'
 * depth, and the CPU runs it. */
static int fa_use_amx(ch_dtype half, int64_t hd)
{
    return half == CH_BF16 && hd % 32 == 0 && chi_host_amx_bf16();
}

ch_status chi_host_attention(void *stream, int64_t b, int64_t heads, int64_t t, int64_t hd,
                             float scale, ch_dtype half, ch_bmem o, int64_t ldo, ch_bmem lse,
                             ch_bmem q, ch_bmem k, ch_bmem v, int64_t ld)
{
    fa_job job = {.t = t,
                  .hd = hd,
                  .heads = heads,
                  .ld = ld,
                  .ldo = ldo,
                  .scale = scale,
                  .isa = chi_host_tile_isa(CHI_TILE_AUTO),
                  .o = chi_host_f32(o),
                  .lse = chi_host_f32(lse),
                  .q = chi_host_f32(q),
                  .k = chi_host_f32(k),
                  .v = chi_host_f32(v),
                  .amx = fa_use_amx(half, hd)};
    return fa_each(stream, &job, b * heads,
                   job.amx            ? chi_host_attention_amx_forward
                   : fa_whole_rows(t) ? fa_forward_rows
                                      : fa_forward_one);
}

/* Backward of one matrix: D = rowsum(dout * o); for each tile of keys and
 * each tile of queries at or below it, P = exp(scale q k^T - lse) (0 above
 * the diagonal), dv += P^T dout, dP = dout v^T, dS = P (dP - D), dq +=
 * scale dS k, dk += scale dS^T q. */
CHI_CLONES_WIDE static ch_status fa_backward_one(float *mem, const fa_job *j, int64_t i)
{
    fa_tiles tiles, *t = &tiles;
    fa_tiles_at(t, mem, j->hd, j->t);
    int64_t tt = j->t, hd = j->hd, ld = j->ld, ldo = j->ldo, at = fa_at(j, i, ld),
            ato = fa_at(j, i, ldo);
    const float *q = j->q + at, *k = j->k + at, *v = j->v + at, *dout = j->dout + ato;
    const float *o = j->o + ato, *lse = j->lse + i * tt;
    float *dq = j->dq + at, *dk = j->dk + at, *dv = j->dv + at;
    fa_transpose(j, k, t->kt);
    fa_transpose(j, v, t->vt);
    fa_rowdots(t->d, dout, o, tt, hd, ldo);
    /* dq's rows first summed into at j0 = 0, dk's and dv's at their
     * diagonal tile: beta 0 there, so no pass zeroes them first. Where
     * the forward takes whole rows, a tile of keys takes all its queries
     * at once (s and dp hold [t, FA_K]): dk's and dv's products sum over
     * all of them in one. */
    int64_t step = fa_whole_rows(tt) ? tt : FA_Q;
    for (int64_t j0 = 0; j0 < tt; j0 += FA_K) {
        int64_t nk = tt - j0 < FA_K ? tt - j0 : FA_K;
        for (int64_t i0 = j0 / FA_Q * FA_Q; i0 < tt; i0 += step) {
            int64_t mq = tt - i0 < step ? tt - i0 : step;
            const float *d = t->d + i0;
            float beta_q = j0 == 0 ? 0.0f : 1.0f, beta_kv = i0 == j0 / FA_Q * FA_Q ? 0.0f : 1.0f;
            int split = i0 == j0 && mq > FA_H && nk > FA_H;
            TRY(fa_s_product(j, split, mq, nk, j->scale, q + i0 * ld, ld, t->kt + j0, tt,
                             k + j0 * ld, ld, t->s));
            for (int64_t r = 0; r < mq; r++)
                fa_exp(j->isa, t->s + r * FA_K, fa_width(i0 + r, j0, nk), nk, lse[i0 + r]);
            TRY(fa_tile_product(j, 1, split, mq, nk, 1.0f, t->s, dout + i0 * ldo, ldo, beta_kv,
                                dv + j0 * ld, ld));
            TRY(fa_s_product(j, split, mq, nk, 1.0f, dout + i0 * ldo, ldo, t->vt + j0, tt,
                             v + j0 * ld, ld, t->dp));
            for (int64_t r = 0; r < mq; r++) {
                /* a split tile's first rows: dP past FA_H not computed, P 0 */
                int64_t cols = split && r < FA_H ? FA_H : nk;
                float *p = t->s + r * FA_K, dr = d[r];
                const float *dp = t->dp + r * FA_K;
                CHI_OMP(omp simd)
                for (int64_t c = 0; c < cols; c++)
                    p[c] = p[c] * (dp[c] - dr);
            }
            TRY(fa_tile_product(j, 0, split, mq, nk, j->scale, t->s, k + j0 * ld, ld, beta_q,
                                dq + i0 * ld, ld));
            TRY(fa_tile_product(j, 1, split, mq, nk, j->scale, t->s, q + i0 * ld, ld, beta_kv,
                                dk + j0 * ld, ld));
        }
    }
    return CH_OK;
}

ch_status chi_host_attention_backward(void *stream, int64_t b, int64_t heads, int64_t t, int64_t hd,
                                      float scale, ch_dtype half, ch_bmem dq, ch_bmem dk,
                                      ch_bmem dv, ch_bmem q, ch_bmem k, ch_bmem v, int64_t ld,
                                      ch_bmem dout, ch_bmem o, int64_t ldo, ch_bmem lse)
{
    fa_job job = {.t = t,
                  .hd = hd,
                  .heads = heads,
                  .ld = ld,
                  .ldo = ldo,
                  .scale = scale,
                  .isa = chi_host_tile_isa(CHI_TILE_AUTO),
                  .o = chi_host_f32(o),
                  .lse = chi_host_f32(lse),
                  .dq = chi_host_f32(dq),
                  .dk = chi_host_f32(dk),
                  .dv = chi_host_f32(dv),
                  .q = chi_host_f32(q),
                  .k = chi_host_f32(k),
                  .v = chi_host_f32(v),
                  .dout = chi_host_f32(dout),
                  .amx = fa_use_amx(half, hd)};
    return fa_each(stream, &job, b * heads,
                   job.amx ? chi_host_attention_amx_backward : fa_backward_one);
}
