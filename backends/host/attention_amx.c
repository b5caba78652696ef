/* The host's fused causal attention in bf16 on AMX, which attention.c's
 * entry points choose for mixed precision with CH_BF16 where the CPU has
 * AMX (chi_host_amx_bf16) and the head size is a multiple of 32. The
 * tile products (tile_amx.c) take bf16 inputs and sum in f32, as
 * autocast's attention does. Each matrix's q, k, v (and dout) are rounded
 * once into the layouts the products read (tile_amx.c), the length padded
 * with zeros to a multiple of FA_K. A tile row's pass (one per row in
 * forward, per pair of rows in backward, sixteen lanes in registers)
 * scales the f32 scores, takes the exponentials (degree 6 with FMA: the
 * probabilities are rounded to bf16 next), keeps the running sums l from
 * the unrounded ones and writes the rounded ones where the next product
 * reads them; dS likewise (the scale in it before it is rounded).
 * Backward accumulates dq, and dk and dv transposed, in f32 and writes
 * them at the end. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <string.h>

#include "host.h"
#include "vec.h"
#include "attention.h"

#ifdef CHI_HAVE_AVX512

static int64_t fa_pad(int64_t t)
{
    return (t + FA_K - 1) / FA_K * FA_K;
}

/* The loops around the products in AVX-512, which a CPU with AMX has. */
#define FA_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

/* One thread's AMX tiles: f32 s, dp [FA_Q * FA_K], acc [FA_Q * hd], m, l
 * [FA_Q], d [tp], dq [tp * hd], dkt and dvt [hd * tp]; bf16 qa, doa
 * (rows), kb, vtb (k and v transposed, in pairs), vb, kvb (pairs), qta,
 * dota (transposed) [tp * hd] each, pa, pb [FA_Q * FA_K], and the
 * packers' tmp [2 tp * hd]. */
typedef struct fa_amx_tiles {
    float *s, *dp, *acc, *m, *l, *d, *dq, *dkt, *dvt;
    uint16_t *qa, *doa, *kb, *vtb, *vb, *kvb, *qta, *dota, *pa, *pb, *tmp;
} fa_amx_tiles;

/* n floats, rounded up to 64 bytes. */
static size_t fa_round16(size_t n)
{
    return (n + 15) / 16 * 16;
}

size_t chi_host_attention_amx_floats(int64_t hd, int64_t tt)
{
    size_t tp = (size_t)fa_pad(tt), h = (size_t)hd, tile = FA_Q * FA_K;
    return 2 * fa_round16(tile) + fa_round16(FA_Q * h) + 2 * fa_round16(FA_Q) + fa_round16(tp) +
           3 * fa_round16(tp * h) + 8 * fa_round16(tp * h / 2) + 2 * fa_round16(tile / 2) +
           fa_round16(tp * h);
}

static void fa_amx_at(fa_amx_tiles *t, float *mem, int64_t hd, int64_t tt)
{
    size_t tp = (size_t)fa_pad(tt), h = (size_t)hd, tile = FA_Q * FA_K;
    float *at = mem;
#define FA_TAKE(field, floats, type)                                                               \
    do {                                                                                           \
        t->field = (type *)at;                                                                     \
        at += fa_round16(floats);                                                                  \
    } while (0)
    FA_TAKE(s, tile, float);
    FA_TAKE(dp, tile, float);
    FA_TAKE(acc, FA_Q * h, float);
    FA_TAKE(m, FA_Q, float);
    FA_TAKE(l, FA_Q, float);
    FA_TAKE(d, tp, float);
    FA_TAKE(dq, tp * h, float);
    FA_TAKE(dkt, tp * h, float);
    FA_TAKE(dvt, tp * h, float);
    FA_TAKE(qa, tp * h / 2, uint16_t);
    FA_TAKE(doa, tp * h / 2, uint16_t);
    FA_TAKE(kb, tp * h / 2, uint16_t);
    FA_TAKE(vtb, tp * h / 2, uint16_t);
    FA_TAKE(vb, tp * h / 2, uint16_t);
    FA_TAKE(kvb, tp * h / 2, uint16_t);
    FA_TAKE(qta, tp * h / 2, uint16_t);
    FA_TAKE(dota, tp * h / 2, uint16_t);
    FA_TAKE(pa, tile / 2, uint16_t);
    FA_TAKE(pb, tile / 2, uint16_t);
    FA_TAKE(tmp, tp * h, uint16_t);
#undef FA_TAKE
}

/* d[r] = rowsum(dout * o) for r < tt (rows ldo apart), the backward's D:
 * sixteen lanes, hd a multiple of 16. */
__attribute__((target("avx512f"))) static void fa_amx_rowdots(float *d, const float *dout,
                                                              const float *o, int64_t tt,
                                                              int64_t hd, int64_t ldo)
{
    for (int64_t r = 0; r < tt; r++) {
        __m512 sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < hd; c += 16)
            sum = _mm512_fmadd_ps(_mm512_loadu_ps(dout + r * ldo + c),
                                  _mm512_loadu_ps(o + r * ldo + c), sum);
        d[r] = _mm512_reduce_add_ps(sum);
    }
}

#define FA_AMX_ROW_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

/* The probabilities' exponential (x <= 0, NaN kept): degree 6, as they
 * are rounded to bf16 next, x below -100 taken as -100 (chi_exp16_fma). */
FA_AMX_ROW_TARGET __attribute__((always_inline)) static inline __m512 fa_amx_exp(__m512 x)
{
    return chi_exp16_fma(x, 6, -100.0f);
}

/* Lanes j < w of vector v of a tile row, the rest false. */
#define FA_ROW_MASK(w, v) CHI_LANES16((w)-16 * (v))

/* Forward, one row of a tile (FA_K = 64 floats, four vectors): x = scale
 * s for the first w keys; m and l move to the new maximum and acc with
 * them; the probabilities exp(x - m) rounded to bf16 into prow[0..FA_K)
 * (0 past w), their f32 values summed into l. The running maximum moves
 * as attention.c's fa_rows_update moves it, with two differences that
 * this kernel's bits keep: the row's maximum is VMAXPS's (whose answer
 * for a NaN score depends on its place; chi_row_max8 leaves NaN out), and
 * the correction exp(m - new m) is libm's expf, one row at a time
 * (fa_rows_update's is chi_exp8_nonpositive, eight rows at a time). */
FA_AMX_ROW_TARGET static void fa_amx_row_forward(const float *s, int64_t w, float scale, float *m,
                                                 float *l, float *acc, int64_t hd, uint16_t *prow)
{
    __m512 x[4], mx = _mm512_set1_ps(-INFINITY), vs = _mm512_set1_ps(scale);
    for (int v = 0; v < 4; v++) {
        __mmask16 k = FA_ROW_MASK(w, v);
        x[v] = _mm512_mask_mul_ps(_mm512_set1_ps(-INFINITY), k, _mm512_loadu_ps(s + 16 * v), vs);
        mx = _mm512_max_ps(mx, x[v]);
    }
    float row_max = _mm512_reduce_max_ps(mx), m_new = row_max > *m ? row_max : *m;
    float corr = *m == -INFINITY ? 0.0f : expf(*m - m_new);
    __m512 sum = _mm512_setzero_ps(), vm = _mm512_set1_ps(m_new);
    for (int v = 0; v < 4; v++) {
        __mmask16 k = FA_ROW_MASK(w, v);
        __m512 e = _mm512_maskz_mov_ps(k, fa_amx_exp(_mm512_sub_ps(x[v], vm)));
        sum = _mm512_add_ps(sum, e);
        _mm256_storeu_si256((__m256i *)(prow + 16 * v), (__m256i)_mm512_cvtneps_pbh(e));
    }
    *l = *l * corr + _mm512_reduce_add_ps(sum);
    *m = m_new;
    if (corr != 1.0f) {
        __m512 vc = _mm512_set1_ps(corr);
        for (int64_t d = 0; d < hd; d += 16)
            _mm512_storeu_ps(acc + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), vc));
    }
}

/* Backward, rows r and r + 1 of a tile (s0, s1; w1 = 0 for a row past
 * the tile's queries): P = exp(scale s - lse) for the first w keys, 0
 * after, kept in f32 in the rows and rounded into pair row pb[0..2 FA_K). */
FA_AMX_ROW_TARGET static void fa_amx_prob2(float *s0, float *s1, int64_t w0, int64_t w1,
                                           float scale, float lse0, float lse1, uint16_t *pb)
{
    __m512 vs = _mm512_set1_ps(scale), l0 = _mm512_set1_ps(lse0), l1 = _mm512_set1_ps(lse1);
    for (int v = 0; v < 4; v++) {
        __m512 p0 = _mm512_maskz_mov_ps(
            FA_ROW_MASK(w0, v), fa_amx_exp(_mm512_fmsub_ps(_mm512_loadu_ps(s0 + 16 * v), vs, l0)));
        __m512 p1 = _mm512_maskz_mov_ps(
            FA_ROW_MASK(w1, v), fa_amx_exp(_mm512_fmsub_ps(_mm512_loadu_ps(s1 + 16 * v), vs, l1)));
        _mm512_storeu_ps(s0 + 16 * v, p0);
        _mm512_storeu_ps(s1 + 16 * v, p1);
        _mm512_storeu_si512(pb + 32 * v, chi_bf16_pair16(p0, p1));
    }
}

/* Backward, rows r and r + 1: dS = scale P (dP - D) (d1 0 and P's row 0
 * past the tile's queries), rounded into rows pa0, pa1 and pair row pb. */
FA_AMX_ROW_TARGET static void fa_amx_ds2(const float *p0, const float *p1, const float *dp0,
                                         const float *dp1, float d0, float d1, float scale,
                                         uint16_t *pa0, uint16_t *pa1, uint16_t *pb)
{
    __m512 vs = _mm512_set1_ps(scale), vd0 = _mm512_set1_ps(d0), vd1 = _mm512_set1_ps(d1);
    for (int v = 0; v < 4; v++) {
        __m512 a =
            _mm512_mul_ps(vs, _mm512_mul_ps(_mm512_loadu_ps(p0 + 16 * v),
                                            _mm512_sub_ps(_mm512_loadu_ps(dp0 + 16 * v), vd0)));
        __m512 b =
            _mm512_mul_ps(vs, _mm512_mul_ps(_mm512_loadu_ps(p1 + 16 * v),
                                            _mm512_sub_ps(_mm512_loadu_ps(dp1 + 16 * v), vd1)));
        _mm256_storeu_si256((__m256i *)(pa0 + 16 * v), (__m256i)_mm512_cvtneps_pbh(a));
        _mm256_storeu_si256((__m256i *)(pa1 + 16 * v), (__m256i)_mm512_cvtneps_pbh(b));
        _mm512_storeu_si512(pb + 32 * v, chi_bf16_pair16(a, b));
    }
}
FA_AMX_TARGET ch_status chi_host_attention_amx_forward(float *mem, const fa_job *j, int64_t i)
{
    fa_amx_tiles tiles, *t = &tiles;
    int64_t tt = j->t, tp = fa_pad(tt), hd = j->hd, ld = j->ld, ldo = j->ldo, at = fa_at(j, i, ld);
    fa_amx_at(t, mem, hd, tt);
    const float *q = j->q + at, *k = j->k + at, *v = j->v + at;
    float *o = j->o + fa_at(j, i, ldo), *lse = j->lse + i * tt;
    chi_host_bf16_rows(tt, hd, q, ld, t->qa, hd, tp, hd);
    chi_host_bf16_pairs_t(tt, hd, k, ld, t->kb, 2 * tp, tp, hd, t->tmp);
    chi_host_bf16_pairs(tt, hd, v, ld, t->vb, 2 * hd, tp, hd);
    for (int64_t i0 = 0; i0 < tt; i0 += FA_Q) {
        int64_t mq = tt - i0 < FA_Q ? tt - i0 : FA_Q;
        fa_start(t->m, t->l, t->acc, mq, FA_Q * hd); /* all of acc: AMX adds to its rows */
        for (int64_t j0 = 0; j0 < i0 + mq; j0 += FA_K) {
            int64_t nk = i0 + mq - j0 < FA_K ? i0 + mq - j0 : FA_K;
            chi_host_amx_mm(FA_Q, FA_K, hd, t->qa + i0 * hd, hd, t->kb + 2 * j0, 2 * tp, t->s, FA_K,
                            0);
            for (int64_t r = 0; r < mq; r++)
                fa_amx_row_forward(t->s + r * FA_K, fa_width(i0 + r, j0, nk), j->scale, &t->m[r],
                                   &t->l[r], t->acc + r * hd, hd, t->pa + r * FA_K);
            memset(t->pa + mq * FA_K, 0, (size_t)((FA_Q - mq) * FA_K) * sizeof *t->pa);
            chi_host_amx_mm(FA_Q, hd, FA_K, t->pa, FA_K, t->vb + j0 * hd, 2 * hd, t->acc, hd, 1);
        }
        fa_finish(o + i0 * ldo, ldo, lse + i0, t->acc, hd, t->m, t->l, mq, hd);
    }
    return CH_OK;
}

FA_AMX_TARGET ch_status chi_host_attention_amx_backward(float *mem, const fa_job *j, int64_t i)
{
    fa_amx_tiles tiles, *t = &tiles;
    int64_t tt = j->t, tp = fa_pad(tt), hd = j->hd, ld = j->ld, ldo = j->ldo, at = fa_at(j, i, ld),
            ato = fa_at(j, i, ldo);
    fa_amx_at(t, mem, hd, tt);
    const float *q = j->q + at, *k = j->k + at, *v = j->v + at, *dout = j->dout + ato;
    const float *o = j->o + ato, *lse = j->lse + i * tt;
    float *dq = j->dq + at, *dk = j->dk + at, *dv = j->dv + at;
    chi_host_bf16_rows(tt, hd, q, ld, t->qa, hd, tp, hd);
    chi_host_bf16_pairs_t(tt, hd, k, ld, t->kb, 2 * tp, tp, hd, t->tmp);
    chi_host_bf16_rows(tt, hd, dout, ldo, t->doa, hd, tp, hd);
    chi_host_bf16_pairs_t(tt, hd, v, ld, t->vtb, 2 * tp, tp, hd, t->tmp);
    chi_host_bf16_trans(tt, hd, dout, ldo, t->dota, tp, tp, hd, t->tmp);
    chi_host_bf16_pairs(tt, hd, k, ld, t->kvb, 2 * hd, tp, hd);
    chi_host_bf16_trans(tt, hd, q, ld, t->qta, tp, tp, hd, t->tmp);
    fa_amx_rowdots(t->d, dout, o, tt, hd, ldo);
    /* dq's rows first summed into at j0 = 0, dk's and dv's at their
     * diagonal tile: written there, added to after (no zeroing pass); dq
     * in place where the tiles' rows are all the matrix's */
    int in_place = tt % FA_Q == 0;
    float *dqs = in_place ? dq : t->dq;
    int64_t ldq = in_place ? ld : hd;
    for (int64_t j0 = 0; j0 < tt; j0 += FA_K) {
        int64_t nk = tt - j0 < FA_K ? tt - j0 : FA_K;
        for (int64_t i0 = j0 / FA_Q * FA_Q; i0 < tt; i0 += FA_Q) {
            int64_t mq = tt - i0 < FA_Q ? tt - i0 : FA_Q;
            const float *d = t->d + i0;
            chi_host_amx_mm(FA_Q, FA_K, hd, t->qa + i0 * hd, hd, t->kb + 2 * j0, 2 * tp, t->s, FA_K,
                            0);
            /* P (rows past the tile's queries 0), then dv^T += dout^T P */
            int64_t pairs = (mq + 1) / 2;
            for (int64_t r = 0; r < mq; r += 2) {
                int more = r + 1 < mq;
                fa_amx_prob2(t->s + r * FA_K, t->s + (r + 1) * FA_K, fa_width(i0 + r, j0, nk),
                             more ? fa_width(i0 + r + 1, j0, nk) : 0, j->scale, lse[i0 + r],
                             more ? lse[i0 + r + 1] : 0.0f, t->pb + r * FA_K);
            }
            memset(t->pb + pairs * 2 * FA_K, 0,
                   (size_t)((FA_Q / 2 - pairs) * 2 * FA_K) * sizeof *t->pb);
            int add_q = j0 != 0, add_kv = i0 != j0 / FA_Q * FA_Q;
            chi_host_amx_mm(hd, FA_K, FA_Q, t->dota + i0, tp, t->pb, 2 * FA_K, t->dvt + j0, tp,
                            add_kv);
            /* dP = dout v^T, dS = scale P (dP - D) */
            chi_host_amx_mm(FA_Q, FA_K, hd, t->doa + i0 * hd, hd, t->vtb + 2 * j0, 2 * tp, t->dp,
                            FA_K, 0);
            for (int64_t r = 0; r < mq; r += 2)
                fa_amx_ds2(t->s + r * FA_K, t->s + (r + 1) * FA_K, t->dp + r * FA_K,
                           t->dp + (r + 1) * FA_K, d[r], r + 1 < mq ? d[r + 1] : 0.0f, j->scale,
                           t->pa + r * FA_K, t->pa + (r + 1) * FA_K, t->pb + r * FA_K);
            /* pb's pair rows from `pairs` on are still the zeros written above */
            memset(t->pa + 2 * pairs * FA_K, 0,
                   (size_t)((FA_Q - 2 * pairs) * FA_K) * sizeof *t->pa);
            /* dq += dS k, dk^T += q^T dS */
            chi_host_amx_mm(FA_Q, hd, FA_K, t->pa, FA_K, t->kvb + j0 * hd, 2 * hd, dqs + i0 * ldq,
                            ldq, add_q);
            chi_host_amx_mm(hd, FA_K, FA_Q, t->qta + i0, tp, t->pb, 2 * FA_K, t->dkt + j0, tp,
                            add_kv);
        }
    }
    for (int64_t r = 0; r < tt && !in_place; r++)
        memcpy(dq + r * ld, t->dq + r * hd, (size_t)hd * sizeof *dq);
    chi_host_transpose32(hd, tt, t->dkt, tp, dk, ld);
    chi_host_transpose32(hd, tt, t->dvt, tp, dv, ld);
    return CH_OK;
}

#else /* no AVX-512 build: no AMX either, and chi_host_amx_bf16 answers 0 */

size_t chi_host_attention_amx_floats(int64_t hd, int64_t tt)
{
    (void)hd, (void)tt;
    return 0;
}

ch_status chi_host_attention_amx_forward(float *mem, const fa_job *j, int64_t i)
{
    (void)mem, (void)j, (void)i;
    return chi_error(CH_ERR_UNSUPPORTED, "ch_attention: no AMX build");
}

ch_status chi_host_attention_amx_backward(float *mem, const fa_job *j, int64_t i)
{
    (void)mem, (void)j, (void)i;
    return chi_error(CH_ERR_UNSUPPORTED, "ch_attention_backward: no AMX build");
}
#endif
