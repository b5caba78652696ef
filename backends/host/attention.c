/* The host's fused causal attention and its backward: FlashAttention's
 * tiles in f32, and in bf16 on AMX for the mixed op.
 *
 * Each output element is computed by one thread in an order fixed by the
 * shape alone, so results are the same bits whatever the thread count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "host.h"
#include "vec.h"

/* ---- fused causal attention ----------------------------------------------------
 * FlashAttention's scheme on the CPU: a tile of FA_Q queries against tiles
 * of FA_K keys, the scores of a tile in cache (a product each way in
 * registers, tile_mm.c, where the CPU has AVX2 and FMA or AVX-512, and
 * with the library's single-threaded sgemm elsewhere), a running maximum
 * and sum per row
 * (online softmax), the tiles above the diagonal never computed. Each [B]
 * matrix is one thread's, in a fixed order: the same bits for any thread
 * count. Backward rebuilds each tile's probabilities from lse. Up to
 * FA_ROWS_MAX the forward takes whole rows (fa_forward_rows) and the
 * backward a tile of keys against all its queries at once. */

enum {
    FA_Q = 64,
    FA_K = 64
};

/* The valid keys of row i in the tile of keys from j0 (count nk). */
static int64_t fa_width(int64_t i, int64_t j0, int64_t nk)
{
    int64_t w = i - j0 + 1;
    return w < 0 ? 0 : w > nk ? nk : w;
}

/* One thread's tiles: s (scores, then probabilities) and dp [FA_Q *
 * fa_row_floats(t)] (rows of FA_K, or whole rows), acc [FA_Q * hd], m and l [FA_Q], d [t] (backward's rowsum(dout * o);
 * forward's corrections of a tile's rows, fa_rows_update), kt and vt
 * [hd * t] (the matrix's k and v transposed, for the tile products,
 * fa_mm_bt). */
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

/* Lanes j + l < w of the 8 floats at x + j, `fill` in the others (which
 * are read, but not used: a tile row has FA_K floats, a multiple of 8). */
CHI_INLINE v8f fa_load(const float *x, int64_t j, int64_t w, float fill)
{
    const v8i lane = {0, 1, 2, 3, 4, 5, 6, 7};
    v8f v;
    memcpy(&v, x + j, sizeof v);
    v8i keep = lane < (int32_t)(w - j);
    return (v8f)(((v8i)v & keep) | ((v8i)((v8f){0} + fill) & ~keep));
}

/* The largest of x[0..w) (NaN left out, as max4 leaves it out). */
CHI_INLINE float fa_row_max(const float *x, int64_t w)
{
    v8f m = (v8f){0} - INFINITY;
    for (int64_t j = 0; j < w; j += 8) {
        v8f b = fa_load(x, j, w, -INFINITY);
        v8i take_b = b > m;
        m = (v8f)(((v8i)b & take_b) | ((v8i)m & ~take_b));
    }
    float mx = m[0];
    for (int l = 1; l < 8; l++)
        mx = m[l] > mx ? m[l] : mx;
    return mx;
}

/* x[0..nk) of a tile row: exp(x - sub) for the first w, then 0. Returns
 * the sum of the exponentials, in eight lanes added pairwise. */
CHI_INLINE float fa_row_exp(float *x, int64_t w, int64_t nk, float sub)
{
    v8f sum = {0};
    int64_t j = 0;
    for (; j < w; j += 8) {
        /* the lanes past w: exp(-inf) = 0 */
        v8f e = chi_exp8_nonpositive(fa_load(x, j, w, -INFINITY) - sub);
        memcpy(x + j, &e, sizeof e);
        sum += e;
    }
    for (; j < nk; j++)
        x[j] = 0.0f;
    for (int h = 4; h > 0; h /= 2)
        for (int l = 0; l < h; l++)
            sum[l] += sum[l + h];
    return sum[0];
}

#if defined(__x86_64__) && defined(__GNUC__)
/* fa_row_max and fa_row_exp sixteen lanes at a time where the tile
 * products run in AVX-512, in intrinsics (GCC's generic 512-bit compares
 * become lane-by-lane code without AVX-512DQ): per lane the same
 * operations as CHI_DEFINE_EXP_NONPOSITIVE's (no FMA), the sum in sixteen
 * lanes. */

__attribute__((target("avx512f"))) static inline __m512 exp16_nonpositive(__m512 x)
{
    __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-88.0f), _CMP_GE_OQ);
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.33654f), _CMP_LT_OQ);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512 xc = _mm512_mask_mov_ps(_mm512_set1_ps(-88.0f), in_range, x);
    __m512 round = _mm512_set1_ps(12582912.0f);
    __m512 n = _mm512_sub_ps(
        _mm512_add_ps(_mm512_mul_ps(xc, _mm512_set1_ps(1.44269504088896341f)), round), round);
    __m512 r =
        _mm512_sub_ps(_mm512_sub_ps(xc, _mm512_mul_ps(n, _mm512_set1_ps(0.693145751953125f))),
                      _mm512_mul_ps(n, _mm512_set1_ps(1.428606765330187e-06f)));
    static const float coef[] = {1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    for (int c = 0; c < 7; c++)
        p = _mm512_add_ps(_mm512_mul_ps(p, r), _mm512_set1_ps(coef[c]));
    __m512i scale =
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(n), _mm512_set1_epi32(127)), 23);
    __m512 e = _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_mul_ps(p, _mm512_castsi512_ps(scale)));
    return _mm512_mask_mov_ps(e, nan, x);
}

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
        __m512 e = exp16_nonpositive(_mm512_sub_ps(v, vs));
        _mm512_storeu_ps(x + j, e); /* within the row's FA_K floats; past w, 0 */
        sum = _mm512_add_ps(sum, e);
    }
    for (; j < nk; j++)
        x[j] = 0.0f;
    return _mm512_reduce_add_ps(sum);
}
#define FA_HAVE_512 1

__attribute__((target("avx512f"))) static void fa_rowdots512(float *d, const float *dout,
                                                             const float *o, int64_t tt, int64_t hd,
                                                             int64_t ldo)
{
    for (int64_t r = 0; r < tt; r++) {
        __m512 sum = _mm512_setzero_ps();
        for (int64_t c = 0; c < hd; c += 16)
            sum = _mm512_fmadd_ps(_mm512_loadu_ps(dout + r * ldo + c),
                                  _mm512_loadu_ps(o + r * ldo + c), sum);
        d[r] = _mm512_reduce_add_ps(sum);
    }
}
#endif

/* The row passes for the tile products' instruction set `isa`. */
CHI_INLINE float fa_max(int isa, const float *x, int64_t w)
{
#ifdef FA_HAVE_512
    if (isa == CHI_TILE_AVX512)
        return fa_row_max512(x, w);
#endif
    (void)isa;
    return fa_row_max(x, w);
}

CHI_INLINE float fa_exp(int isa, float *x, int64_t w, int64_t nk, float sub)
{
#ifdef FA_HAVE_512
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
        v8f mx = fa_load(corr, r, mq, 0.0f), old = fa_load(m, r, mq, 0.0f);
        v8i take = mx > old, first = old == -INFINITY;
        v8f m_new = (v8f)(((v8i)mx & take) | ((v8i)old & ~take));
        v8f c = (v8f)((v8i)chi_exp8_nonpositive(old - m_new) & ~first);
        for (int64_t u = 0; u < 8 && r + u < mq; u++) {
            corr[r + u] = c[u];
            m[r + u] = m_new[u];
        }
    }
    for (int64_t r = 0; r < mq; r++) {
        float c = corr[r], *a = acc + r * hd;
        l[r] = l[r] * c + fa_exp(isa, s + r * FA_K, fa_width(i0 + r, j0, nk), nk, m[r]);
        if (c != 1.0f)
            CHI_OMP(omp simd)
        for (int64_t d = 0; d < hd; d++)
            a[d] *= c;
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

/* One call's arguments: b * heads matrices [t, hd], matrix i = (n, h) at
 * row n * t of its sample and column h * hd: q, k, v (and dq, dk, dv)
 * rows ld floats apart, o (and dout) rows ldo apart, lse [b * heads, t];
 * the backward's dq, dk, dv and dout are NULL in forward. */
typedef struct fa_job {
    int64_t t, hd, heads, ld, ldo;
    int isa; /* the tile products' (chi_host_tile_isa) */
    int amx; /* in bf16 on AMX (fa_amx_*) */
    float scale;
    float *o, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout;
} fa_job;

/* Matrix i's first element in a tensor of rows `ld` floats apart. */
static int64_t fa_at(const fa_job *j, int64_t i, int64_t ld)
{
    return i / j->heads * j->t * ld + i % j->heads * j->hd;
}

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

/* A tile of queries begins: m = -inf, l = 0 for its mq rows, acc[0..n) 0. */
CHI_INLINE void fa_start(float *m, float *l, float *acc, int64_t mq, int64_t n)
{
    for (int64_t r = 0; r < mq; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
    }
    memset(acc, 0, (size_t)n * sizeof *acc);
}

/* A tile of queries done: out rows (ldo apart) = acc rows (lda apart) /
 * l, lse = m + log l (acc may be o itself). */
CHI_INLINE void fa_finish(float *o, int64_t ldo, float *lse, const float *acc, int64_t lda,
                          const float *m, const float *l, int64_t mq, int64_t hd)
{
    for (int64_t r = 0; r < mq; r++) {
        float inv = 1.0f / l[r], *out = o + r * ldo;
        const float *in = acc + r * lda;
        CHI_OMP(omp simd)
        for (int64_t d = 0; d < hd; d++)
            out[d] = in[d] * inv;
        lse[r] = m[r] + logf(l[r]);
    }
}

/* d[r] = rowsum(dout * o) for r < tt (rows ldo apart): the backward's D.
 * In f32, eight sums (lane l takes the columns c = l mod 8, in increasing
 * c; the last hd mod 8 columns into the first lanes), added pairwise:
 * the same operations on every lane whatever the vectors' width, so the
 * same bits in every build (one sum over the row, a chain of hd dependent
 * additions per row, took a tenth of the backward's time). wide (the AMX
 * kernel's, hd a multiple of 16): sixteen lanes. */
CHI_INLINE void fa_rowdots(float *d, const float *dout, const float *o, int64_t tt, int64_t hd,
                           int64_t ldo, int wide)
{
#ifdef FA_HAVE_512
    if (wide) {
        fa_rowdots512(d, dout, o, tt, hd, ldo);
        return;
    }
#endif
    (void)wide;
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
        for (int h = 4; h > 0; h /= 2)
            for (int l = 0; l < h; l++)
                sum[l] += sum[l + h];
        d[r] = sum[0];
    }
}

/* ---- in bf16 on AMX ----------------------------------------------------------------
 * Mixed precision with CH_BF16 where the CPU has AMX (chi_host_amx_bf16)
 * and the head size is a multiple of 32: the tile products take bf16
 * inputs and sum in f32, as autocast's attention does. Each matrix's q,
 * k, v (and dout) are rounded once into the layouts the products read
 * (tile_amx.c), the length padded with zeros to a multiple of FA_K. A
 * tile row's pass (one per row in forward, per pair of rows in
 * backward, sixteen lanes in registers) scales the f32 scores, takes the
 * exponentials (degree 6 with FMA: the probabilities are rounded to bf16
 * next), keeps the running sums l from the unrounded ones and writes the
 * rounded ones where the next product reads them; dS likewise (the scale
 * in it before it is rounded). Backward accumulates dq, and dk and dv
 * transposed, in f32 and writes them at the end. */

static int64_t fa_pad(int64_t t)
{
    return (t + FA_K - 1) / FA_K * FA_K;
}

/* The loops around the products in AVX-512, which a CPU with AMX has. */
#ifdef FA_HAVE_512
#define FA_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#else
#define FA_AMX_TARGET
#endif

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

static size_t fa_amx_floats(int64_t hd, int64_t tt)
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

#ifdef FA_HAVE_512
#define FA_AMX_ROW_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

/* exp(x) for x <= 0 (NaN stays NaN), for probabilities that are rounded
 * to bf16 next: Taylor to degree 6 on |r| <= ln 2 / 2 (relative error
 * below 2e-7), scaled by 2^n with scalef (0 far below). */
FA_AMX_ROW_TARGET static inline __m512 fa_exp16_fast(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-100.0f), x);
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    static const float coef[] = {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    for (int c = 0; c < 6; c++)
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(coef[c]));
    return _mm512_scalef_ps(p, n);
}

/* Lanes j < w of vector v of a tile row, the rest false. */
#define FA_ROW_MASK(w, v) CHI_LANES16((w)-16 * (v))

/* Forward, one row of a tile (FA_K = 64 floats, four vectors): x = scale
 * s for the first w keys; m and l move to the new maximum and acc with
 * them; the probabilities exp(x - m) rounded to bf16 into prow[0..FA_K)
 * (0 past w), their f32 values summed into l. */
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
        __m512 e = _mm512_maskz_mov_ps(k, fa_exp16_fast(_mm512_sub_ps(x[v], vm)));
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
            FA_ROW_MASK(w0, v),
            fa_exp16_fast(_mm512_fmsub_ps(_mm512_loadu_ps(s0 + 16 * v), vs, l0)));
        __m512 p1 = _mm512_maskz_mov_ps(
            FA_ROW_MASK(w1, v),
            fa_exp16_fast(_mm512_fmsub_ps(_mm512_loadu_ps(s1 + 16 * v), vs, l1)));
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
#endif

FA_AMX_TARGET static ch_status fa_amx_forward_one(float *mem, const fa_job *j, int64_t i)
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

FA_AMX_TARGET static ch_status fa_amx_backward_one(float *mem, const fa_job *j, int64_t i)
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
    fa_rowdots(t->d, dout, o, tt, hd, ldo, 1);
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

/* One matrix's work, its thread's tiles laid out in mem (fa_tiles_floats
 * of them, or fa_amx_floats with j->amx). */
typedef ch_status (*fa_fn)(float *mem, const fa_job *j, int64_t i);

/* one(i) for every matrix i < b, shared out among the threads, each with
 * its tiles (in the stream's scratch: chi_host_scratch_take, so no call
 * allocates once the stream has the size; what a tile row holds past its
 * valid keys is read by fa_load and never used, so whatever an op before
 * left there does no harm); the first failure's message is kept. */
static ch_status fa_each(void *stream, const fa_job *job, int64_t b, fa_fn one)
{
    size_t per = job->amx ? fa_amx_floats(job->hd, job->t) : fa_tiles_floats(job->hd, job->t),
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
                   job.amx            ? fa_amx_forward_one
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
    fa_rowdots(t->d, dout, o, tt, hd, ldo, 0);
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
    return fa_each(stream, &job, b * heads, job.amx ? fa_amx_backward_one : fa_backward_one);
}
