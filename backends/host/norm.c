/* Host LayerNorm and BatchNorm (ops.h, "Normalisation").
 *
 * The formulas are lib/kernels/normalize.h's, in double (chk_acc) from the
 * f32 inputs and rounded once on the way out. Every sum has an order fixed
 * by the shape alone, so the same inputs give the same bits whatever the
 * thread count: a row's sums in CHI_LANES interleaved accumulators added
 * pairwise (vec.h: an order the compiler can still vectorise),
 * LayerNorm's parameter gradients per chunk of rows,
 * the chunks then added in order, a channel's sums one run of `inner`
 * elements at a time. A double sum of n terms errs by at most n 2^-53 of
 * the sum of their magnitudes: below f32's own rounding (2^-24) for any n
 * below 2^29, so the f32 results do not lose accuracy as the batch grows. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "host.h"
#include "kernels/normalize.h"
#include "vec.h"

/* Rows of LayerNorm's backward summed together into one partial sum of
 * the parameter gradients. */
#define LN_CHUNK 32

/* s1 = the sum of a - ca and s2 = the sum of (a - ca)(b - cb) over n
 * elements. */
CHI_CLONES_WIDE static void sums_around(const float *a, double ca, const float *b, double cb,
                                        int64_t n, double *s1, double *s2)
{
    double l1[CHI_LANES] = {0}, l2[CHI_LANES] = {0};
    int64_t i = 0;
    for (; i + CHI_LANES <= n; i += CHI_LANES)
        for (int k = 0; k < CHI_LANES; k++) {
            double da = (double)a[i + k] - ca;
            l1[k] += da;
            l2[k] += da * ((double)b[i + k] - cb);
        }
    for (int k = 0; i < n; i++, k++) {
        double da = (double)a[i] - ca;
        l1[k] += da;
        l2[k] += da * ((double)b[i] - cb);
    }
    *s1 = chi_lanes_total(l1);
    *s2 = chi_lanes_total(l2);
}

/* ---- LayerNorm ------------------------------------------------------------ */

/* Rows taken together: a row's sums are chains of dependent additions
 * (d / CHI_LANES long), and interleaving LN_ROWS rows' chains keeps the
 * adders busy, where one row at a time waited on them. The backward's
 * parameter sums pg and pb then take the rows' terms in one load and
 * store. Each row's arithmetic is the same whatever rows are beside it
 * (the same bits as one row at a time). */
#define LN_ROWS 4

/* Eight floats at p as doubles: the row functions take it as a constant
 * argument, inlined. GCC 12 converts a generic vector of eight floats in
 * halves (two VCVTPS2PD and an insert), so the AVX-512 build loads with
 * the instruction itself. */
typedef v8d (*ln_loader)(const float *p);
/* And eight doubles rounded to floats at p, the same way. */
typedef void (*ln_storer)(float *p, v8d v);

CHI_INLINE v8d ln_load(const float *p)
{
    v8f v;
    memcpy(&v, p, sizeof v);
    return __builtin_convertvector(v, v8d);
}

CHI_INLINE void ln_store(float *p, v8d v)
{
    v8f f = __builtin_convertvector(v, v8f);
    memcpy(p, &f, sizeof f);
}

#ifdef CHI_HAVE_AVX512
__attribute__((target("avx512f"), always_inline)) static inline v8d ln_load512(const float *p)
{
    return (v8d)_mm512_cvtps_pd(_mm256_loadu_ps(p));
}

__attribute__((target("avx512f"), always_inline)) static inline void ln_store512(float *p, v8d v)
{
    _mm256_storeu_ps(p, _mm512_cvtpd_ps((__m512d)v));
}
#endif

/* 1 where the rows go through the AVX-512 build: where the host's tile
 * kernels would (chi_host_tile_isa, which tests can steer). */
static int ln_wide(void)
{
#ifdef CHI_HAVE_AVX512
    return chi_host_tile_isa(CHI_TILE_AUTO) == CHI_TILE_AVX512;
#else
    return 0;
#endif
}

CHI_INLINE double ln_total(v8d v)
{
    double l[CHI_LANES];
    memcpy(l, &v, sizeof l);
    return chi_lanes_total(l);
}

/* nr rows (rows d apart) from x: m = the sum of x / d, var = the sum of
 * (x - m)^2 / d, each in CHI_LANES lanes (lane k the elements k mod
 * CHI_LANES in increasing order, the last d mod CHI_LANES into the first
 * lanes). */
CHI_INLINE void ln_rows(ln_loader load, ln_storer store, int nr, float *y, float *mean, float *rstd,
                        const float *x, const float *gamma, const float *beta, int64_t d, float eps)
{
    int64_t body = d / CHI_LANES * CHI_LANES;
    v8d s[LN_ROWS] = {{0}}, v[LN_ROWS] = {{0}};
    double m[LN_ROWS], r[LN_ROWS];
    for (int64_t i = 0; i < body; i += CHI_LANES) {
#pragma GCC unroll 4
        for (int q = 0; q < nr; q++)
            s[q] += load(x + q * d + i);
    }
    for (int q = 0; q < nr; q++) {
        for (int64_t i = body; i < d; i++)
            s[q][i - body] += (double)x[q * d + i];
        m[q] = ln_total(s[q]) / (double)d;
    }
    for (int64_t i = 0; i < body; i += CHI_LANES) {
#pragma GCC unroll 4
        for (int q = 0; q < nr; q++) {
            v8d dv = load(x + q * d + i) - m[q];
            v[q] += dv * dv;
        }
    }
    for (int q = 0; q < nr; q++) {
        for (int64_t i = body; i < d; i++) {
            double dv = (double)x[q * d + i] - m[q];
            v[q][i - body] += dv * dv;
        }
        r[q] = chk_norm_rstd(ln_total(v[q]) / (double)d, eps);
        float *yq = y + q * d;
        const float *xq = x + q * d;
        double mq = m[q], rq = r[q];
        /* chk_norm_affine, eight at a time */
        for (int64_t j = 0; j < body; j += CHI_LANES)
            store(yq + j,
                  CHK_NORM_AFFINE_OF(load(xq + j), mq, rq, load(gamma + j), load(beta + j)));
        for (int64_t j = body; j < d; j++)
            yq[j] = chk_norm_affine(xq[j], mq, rq, gamma[j], beta[j]);
        mean[q] = (float)mq;
        rstd[q] = (float)rq;
    }
}

/* nr rows, LN_ROWS at a time where nr is. */
#define LN_ROWS_ALL(load, store, nr, y, mean, rstd, x, gamma, beta, d, eps)                        \
    do {                                                                                           \
        int64_t q_ = 0;                                                                            \
        for (; q_ + LN_ROWS <= (nr); q_ += LN_ROWS)                                                \
            ln_rows(load, store, LN_ROWS, (y) + q_ * (d), (mean) + q_, (rstd) + q_,                \
                    (x) + q_ * (d), gamma, beta, d, eps);                                          \
        for (; q_ < (nr); q_++)                                                                    \
            ln_rows(load, store, 1, (y) + q_ * (d), (mean) + q_, (rstd) + q_, (x) + q_ * (d),      \
                    gamma, beta, d, eps);                                                          \
    } while (0)

CHI_CLONES static void layernorm_rows(int64_t nr, float *y, float *mean, float *rstd,
                                      const float *x, const float *gamma, const float *beta,
                                      int64_t d, float eps)
{
    LN_ROWS_ALL(ln_load, ln_store, nr, y, mean, rstd, x, gamma, beta, d, eps);
}

#ifdef CHI_HAVE_AVX512
__attribute__((target("avx512f"))) static void layernorm_rows512(int64_t nr, float *y, float *mean,
                                                                 float *rstd, const float *x,
                                                                 const float *gamma,
                                                                 const float *beta, int64_t d,
                                                                 float eps)
{
    LN_ROWS_ALL(ln_load512, ln_store512, nr, y, mean, rstd, x, gamma, beta, d, eps);
}
#endif

/* nr rows (at most LN_ROWS) in the build ln_wide chose. */
static void layernorm_group(int wide, int64_t nr, float *y, float *mean, float *rstd,
                            const float *x, const float *gamma, const float *beta, int64_t d,
                            float eps)
{
#ifdef CHI_HAVE_AVX512
    if (wide) {
        layernorm_rows512(nr, y, mean, rstd, x, gamma, beta, d, eps);
        return;
    }
#else
    (void)wide;
#endif
    layernorm_rows(nr, y, mean, rstd, x, gamma, beta, d, eps);
}

ch_status chi_host_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_bmem y,
                             ch_bmem mean, ch_bmem rstd, ch_bmem x, ch_bmem gamma,
                             ch_bmem beta)
{
    (void)stream;
    float *py = chi_host_f32(y), *pm = chi_host_f32(mean), *pr = chi_host_f32(rstd);
    const float *px = chi_host_f32(x), *pg = chi_host_f32(gamma), *pb = chi_host_f32(beta);
    int64_t groups = (rows + LN_ROWS - 1) / LN_ROWS;
    int wide = ln_wide();
    CHI_OMP(omp parallel for if (rows * d > CHI_HOST_PAR_MIN))
    for (int64_t k = 0; k < groups; k++) {
        int64_t r = k * LN_ROWS, nr = rows - r < LN_ROWS ? rows - r : LN_ROWS;
        layernorm_group(wide, nr, py + r * d, pm + r, pr + r, px + r * d, pg, pb, d, eps);
    }
    return CH_OK;
}

/* nr rows of the backward (rows d apart): their dy * xhat and dy added to
 * the chunk's partial sums pg and pb, row after row, and (when dx is
 * wanted) in the same pass each row's s1 = the sum of g = dy gamma and
 * s2 = the sum of g xhat (CHI_LANES lanes, as ln_rows), then the rows' dx. */
CHI_INLINE void ln_backward_rows(ln_loader load, ln_storer store, int nr, float *dx, double *pg,
                                 double *pb, const float *dy, const float *x, const float *mean,
                                 const float *rstd, const float *gamma, int64_t d)
{
    int64_t body = d / CHI_LANES * CHI_LANES;
    double m[LN_ROWS], r[LN_ROWS];
    v8d l1[LN_ROWS] = {{0}}, l2[LN_ROWS] = {{0}};
    for (int q = 0; q < nr; q++) {
        m[q] = mean[q];
        r[q] = rstd[q];
    }
    for (int64_t j = 0; j < body; j += CHI_LANES) {
        v8d g_j = load(gamma + j), sg, sb;
        memcpy(&sg, pg + j, sizeof sg);
        memcpy(&sb, pb + j, sizeof sb);
#pragma GCC unroll 4
        for (int q = 0; q < nr; q++) {
            v8d xh = (load(x + q * d + j) - m[q]) * r[q], dyq = load(dy + q * d + j);
            sg += dyq * xh;
            sb += dyq;
            if (dx) {
                v8d g = dyq * g_j;
                l1[q] += g;
                l2[q] += g * xh;
            }
        }
        memcpy(pg + j, &sg, sizeof sg);
        memcpy(pb + j, &sb, sizeof sb);
    }
    for (int64_t j = body; j < d; j++)
        for (int q = 0; q < nr; q++) {
            float dyq = dy[q * d + j];
            double xh = chk_norm_xhat(x[q * d + j], m[q], r[q]);
            pg[j] += dyq * xh;
            pb[j] += dyq;
            if (dx) {
                double g = chk_ln_g(dyq, gamma[j]);
                l1[q][j - body] += g;
                l2[q][j - body] += g * xh;
            }
        }
    if (!dx)
        return;
    for (int q = 0; q < nr; q++) {
        double k1 = ln_total(l1[q]) / (double)d, k2 = ln_total(l2[q]) / (double)d;
        double mq = m[q], rq = r[q];
        float *dxq = dx + q * d;
        const float *dyq = dy + q * d, *xq = x + q * d;
        /* chk_ln_dx, eight at a time */
        for (int64_t j = 0; j < body; j += CHI_LANES) {
            v8d g = load(dyq + j) * load(gamma + j), xh = CHK_NORM_XHAT_OF(load(xq + j), mq, rq);
            store(dxq + j, CHK_LN_DX_OF(g, xh, rq, k1, k2));
        }
        for (int64_t j = body; j < d; j++)
            dxq[j] = chk_ln_dx(dyq[j], gamma[j], xq[j], mq, rq, k1, k2);
    }
}

/* A chunk's rows [0, nr), LN_ROWS at a time where nr is; dx NULL or
 * not, a loop of its own (the test out of the inner loop). */
#define LN_BACKWARD_ALL(load, store, nr, dx, pg, pb, dy, x, mean, rstd, gamma, d)                  \
    do {                                                                                           \
        int64_t q_ = 0;                                                                            \
        for (; q_ + LN_ROWS <= (nr); q_ += LN_ROWS)                                                \
            ln_backward_rows(load, store, LN_ROWS, (dx) ? (dx) + q_ *(d) : NULL, pg, pb,           \
                             (dy) + q_ * (d), (x) + q_ * (d), (mean) + q_, (rstd) + q_, gamma, d); \
        for (; q_ < (nr); q_++)                                                                    \
            ln_backward_rows(load, store, 1, (dx) ? (dx) + q_ *(d) : NULL, pg, pb,                 \
                             (dy) + q_ * (d), (x) + q_ * (d), (mean) + q_, (rstd) + q_, gamma, d); \
    } while (0)

CHI_CLONES static void layernorm_backward_rows(int64_t nr, float *dx, double *pg, double *pb,
                                               const float *dy, const float *x, const float *mean,
                                               const float *rstd, const float *gamma, int64_t d)
{
    if (dx)
        LN_BACKWARD_ALL(ln_load, ln_store, nr, dx, pg, pb, dy, x, mean, rstd, gamma, d);
    else /* the same with dx known to be NULL */
        LN_BACKWARD_ALL(ln_load, ln_store, nr, dx, pg, pb, dy, x, mean, rstd, gamma, d);
}

#ifdef CHI_HAVE_AVX512
__attribute__((target("avx512f"))) static void layernorm_backward_rows512(
    int64_t nr, float *dx, double *pg, double *pb, const float *dy, const float *x,
    const float *mean, const float *rstd, const float *gamma, int64_t d)
{
    if (dx)
        LN_BACKWARD_ALL(ln_load512, ln_store512, nr, dx, pg, pb, dy, x, mean, rstd, gamma, d);
    else /* the same with dx known to be NULL */
        LN_BACKWARD_ALL(ln_load512, ln_store512, nr, dx, pg, pb, dy, x, mean, rstd, gamma, d);
}
#endif

/* nr rows of a chunk in the build ln_wide chose. */
static void layernorm_backward_chunk(int wide, int64_t nr, float *dx, double *pg, double *pb,
                                     const float *dy, const float *x, const float *mean,
                                     const float *rstd, const float *gamma, int64_t d)
{
#ifdef CHI_HAVE_AVX512
    if (wide) {
        layernorm_backward_rows512(nr, dx, pg, pb, dy, x, mean, rstd, gamma, d);
        return;
    }
#else
    (void)wide;
#endif
    layernorm_backward_rows(nr, dx, pg, pb, dy, x, mean, rstd, gamma, d);
}

/* The scratch of the backward: part[k], chunk k's sums (d of dy * xhat,
 * then d of dy) for each of `chunks`, then `extra` bytes; in the stream's
 * scratch (an allocation per call, 400 KB at [1024, 768], went to mmap
 * and its page faults every time), each chunk's sums zeroed by its
 * thread. */
static ch_status layernorm_backward_scratch(const char *slot, void *stream, int64_t chunks,
                                            int64_t d, uint64_t extra, chi_host_scratch *sc)
{
    if ((uint64_t)chunks * 2 * (uint64_t)d > (SIZE_MAX - extra) / sizeof(double))
        return chi_error(CH_ERR_OUT_OF_MEMORY,
                         "host %s: %lld chunks of 2 x %lld doubles exceed the address space", slot,
                         (long long)chunks, (long long)d);
    return chi_host_scratch_take(stream, (size_t)(chunks * 2 * d) * sizeof(double) + extra, sc);
}

/* The chunks' sums in order into chunk 0's (0 + the first, then each
 * next: the order of one sum per column), then into the gradients. */
static void layernorm_params_finish(double *part, int64_t chunks, int64_t d, ch_bmem dgamma,
                                    ch_bmem dbeta)
{
    for (int64_t j = 0; j < 2 * d; j++)
        part[j] = 0.0 + part[j];
    for (int64_t k = 1; k < chunks; k++) {
        const double *pk = part + k * 2 * d;
        CHI_OMP(omp simd)
        for (int64_t j = 0; j < 2 * d; j++)
            part[j] += pk[j];
    }
    float *pdg = chi_host_f32(dgamma), *pdb = chi_host_f32(dbeta);
    for (int64_t j = 0; j < d; j++) {
        pdg[j] = (float)(pdg[j] + part[j]);
        pdb[j] = (float)(pdb[j] + part[d + j]);
    }
}

ch_status chi_host_layernorm_backward(void *stream, int64_t rows, int64_t d, ch_bmem dx,
                                      ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x,
                                      ch_bmem mean, ch_bmem rstd, ch_bmem gamma)
{
    int64_t chunks = (rows + LN_CHUNK - 1) / LN_CHUNK;
    chi_host_scratch sc;
    TRY(layernorm_backward_scratch("layernorm_backward", stream, chunks, d, 0, &sc));
    double *part = sc.mem;
    int wide = ln_wide();
    float *pdx = dx.ptr ? chi_host_f32(dx) : NULL;
    const float *pdy = chi_host_f32(dy), *px = chi_host_f32(x), *pm = chi_host_f32(mean),
                *pr = chi_host_f32(rstd), *pgam = chi_host_f32(gamma);
    CHI_OMP(omp parallel for if (rows * d > CHI_HOST_PAR_MIN))
    for (int64_t k = 0; k < chunks; k++) {
        double *pg = part + k * 2 * d, *pb = pg + d;
        memset(pg, 0, (size_t)(2 * d) * sizeof *pg);
        int64_t r = k * LN_CHUNK, end = r + LN_CHUNK < rows ? r + LN_CHUNK : rows;
        layernorm_backward_chunk(wide, end - r, pdx ? pdx + r * d : NULL, pg, pb, pdy + r * d,
                                 px + r * d, pm + r, pr + r, pgam, d);
    }
    layernorm_params_finish(part, chunks, d, dgamma, dbeta);
    chi_host_scratch_give(&sc);
    return CH_OK;
}

/* ---- The residual stream's add beside LayerNorm -------------------------
 * The same row functions as above on f32 rows: the half tensors widened
 * (and the rounded sum widened back, the values the LayerNorm reads) into
 * a few rows of f32 per thread, the half outputs rounded from there. So
 * every f32 result is the unfused ops' to the bit. */

/* lib/kernels/normalize.h's format of a dtype the core passed; -1 for one
 * this module does not know. */
static int ln_fmt(ch_dtype dt)
{
    return dt == CH_F32    ? CHK_FMT_F32
           : dt == CH_BF16 ? CHK_FMT_BF16
           : dt == CH_F16  ? CHK_FMT_F16
                           : -1;
}

/* The address of element `at` of a tensor of format fmt. */
static void *ln_at(ch_bmem m, int fmt, int64_t at)
{
    return (char *)m.ptr + m.off + (size_t)at * (fmt == CHK_FMT_F32 ? 4 : 2);
}

/* n elements of format fmt at p as f32: p itself where f32, else widened
 * into w. */
static const float *ln_widened(const void *p, int fmt, int64_t n, float *w)
{
    if (fmt == CHK_FMT_F32)
        return p;
    const uint16_t *h = p;
    for (int64_t i = 0; i < n; i++)
        w[i] = chk_fmt_widen(h[i], fmt);
    return w;
}

/* n f32 values v stored at p in format fmt, a half one rounded (the
 * conversion slots' bits: half_bits.h's steps, a loop the compiler
 * vectorises for bf16). */
static void ln_stored(void *p, int fmt, const float *v, int64_t n)
{
    uint16_t *h = p;
    if (fmt == CHK_FMT_BF16) {
        for (int64_t i = 0; i < n; i++)
            h[i] = chk_f32_to_bf16(chk_f32_bits(v[i]));
    } else if (fmt == CHK_FMT_F16) {
        for (int64_t i = 0; i < n; i++)
            h[i] = chk_f32_to_f16(chk_f32_bits(v[i]));
    } else if (p != v) {
        memcpy(p, v, (size_t)n * sizeof *v);
    }
}

/* The f32 rows a thread works in: `count` arrays of LN_ROWS rows, for
 * each of `threads`; *per its floats per thread. */
static ch_status ln_rows_bytes(const char *slot, int64_t d, int count, int threads, int64_t *per,
                               uint64_t *bytes)
{
    *per = (int64_t)count * LN_ROWS * d;
    *bytes = (uint64_t)*per * (uint64_t)threads * sizeof(float);
    if ((uint64_t)*per > SIZE_MAX / sizeof(float) / (uint64_t)threads / 2)
        return chi_error(CH_ERR_OUT_OF_MEMORY,
                         "host %s: %d threads' rows of %lld floats exceed the address space", slot,
                         threads, (long long)d);
    return CH_OK;
}

ch_status chi_host_add_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_dtype sum_dt,
                                 ch_dtype y_dt, ch_dtype a_dt, ch_dtype b_dt, ch_bmem sum,
                                 ch_bmem y, ch_bmem mean, ch_bmem rstd, ch_bmem a, ch_bmem b,
                                 ch_bmem gamma, ch_bmem beta)
{
    int fs = ln_fmt(sum_dt), fy = ln_fmt(y_dt), fa = ln_fmt(a_dt), fb = ln_fmt(b_dt);
    if (fs < 0 || fy < 0 || fa < 0 || fb < 0)
        return chi_error(CH_ERR_UNSUPPORTED, "host add_layernorm: dtypes %d, %d, %d, %d",
                         (int)sum_dt, (int)y_dt, (int)a_dt, (int)b_dt);
    /* Per thread: LN_ROWS rows of a, of b (widened), of the sum as the
     * LayerNorm reads it and of y before it is rounded. */
    int threads = chi_omp_max_threads();
    int64_t per;
    uint64_t bytes;
    TRY(ln_rows_bytes("add_layernorm", d, 4, threads, &per, &bytes));
    chi_host_scratch sc;
    TRY(chi_host_scratch_take(stream, (size_t)bytes, &sc));
    float *work = sc.mem, *pm = chi_host_f32(mean), *pr = chi_host_f32(rstd);
    const float *pg = chi_host_f32(gamma), *pb = chi_host_f32(beta);
    int64_t groups = (rows + LN_ROWS - 1) / LN_ROWS, lr = LN_ROWS * d;
    int wide = ln_wide();
    CHI_OMP(omp parallel for if (rows * d > CHI_HOST_PAR_MIN))
    for (int64_t k = 0; k < groups; k++) {
        int64_t r = k * LN_ROWS, nr = rows - r < LN_ROWS ? rows - r : LN_ROWS, n = nr * d;
        int64_t at = r * d;
        float *w = work + chi_omp_thread() * per;
        const float *xa = ln_widened(ln_at(a, fa, at), fa, n, w);
        const float *xb = ln_widened(ln_at(b, fb, at), fb, n, w + lr);
        /* In place (sum is a or b) each element is read before it is
         * written, or was widened before. */
        float *xs = fs == CHK_FMT_F32 ? ln_at(sum, fs, at) : w + 2 * lr;
        for (int64_t i = 0; i < n; i++)
            xs[i] = chk_res_sum(xa[i], xb[i]);
        if (fs != CHK_FMT_F32) {
            ln_stored(ln_at(sum, fs, at), fs, xs, n);
            ln_widened(ln_at(sum, fs, at), fs, n, xs);
        }
        float *yo = fy == CHK_FMT_F32 ? ln_at(y, fy, at) : w + 3 * lr;
        layernorm_group(wide, nr, yo, pm + r, pr + r, xs, pg, pb, d, eps);
        if (fy != CHK_FMT_F32)
            ln_stored(ln_at(y, fy, at), fy, yo, n);
    }
    chi_host_scratch_give(&sc);
    return CH_OK;
}

ch_status chi_host_layernorm_backward_add(void *stream, int64_t rows, int64_t d, ch_dtype dx_dt,
                                          ch_dtype dy_dt, ch_dtype dres_dt, ch_dtype x_dt,
                                          ch_bmem dx, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy,
                                          ch_bmem dres, ch_bmem x, ch_bmem mean, ch_bmem rstd,
                                          ch_bmem gamma)
{
    int fdx = ln_fmt(dx_dt), fdy = ln_fmt(dy_dt), fx = ln_fmt(x_dt);
    int fres = dres.ptr ? ln_fmt(dres_dt) : CHK_FMT_F32;
    if (fdx < 0 || fdy < 0 || fx < 0 || fres < 0)
        return chi_error(CH_ERR_UNSUPPORTED, "host layernorm_backward_add: dtypes %d, %d, %d, %d",
                         (int)dx_dt, (int)dy_dt, (int)dres_dt, (int)x_dt);
    /* The chunks' sums as layernorm_backward's, then per thread LN_ROWS
     * rows of dy and x (widened), of LayerNorm's dx and of dres. */
    int64_t chunks = (rows + LN_CHUNK - 1) / LN_CHUNK, per;
    int threads = chi_omp_max_threads();
    uint64_t bytes;
    TRY(ln_rows_bytes("layernorm_backward_add", d, 4, threads, &per, &bytes));
    chi_host_scratch sc;
    TRY(layernorm_backward_scratch("layernorm_backward_add", stream, chunks, d, bytes, &sc));
    double *part = sc.mem;
    float *work = (float *)(part + chunks * 2 * d);
    const float *pm = chi_host_f32(mean), *pr = chi_host_f32(rstd), *pgam = chi_host_f32(gamma);
    int64_t lr = LN_ROWS * d;
    int wide = ln_wide();
    CHI_OMP(omp parallel for if (rows * d > CHI_HOST_PAR_MIN))
    for (int64_t k = 0; k < chunks; k++) {
        double *pg = part + k * 2 * d, *pb = pg + d;
        memset(pg, 0, (size_t)(2 * d) * sizeof *pg);
        float *w = work + chi_omp_thread() * per, *wdx = w + 2 * lr;
        int64_t end = (k + 1) * LN_CHUNK < rows ? (k + 1) * LN_CHUNK : rows;
        /* The chunk's rows in order, LN_ROWS at a time: the sums pg and pb
         * take them in layernorm_backward's order. */
        for (int64_t r = k * LN_CHUNK; r < end; r += LN_ROWS) {
            int64_t nr = end - r < LN_ROWS ? end - r : LN_ROWS, n = nr * d, at = r * d;
            const float *xdy = ln_widened(ln_at(dy, fdy, at), fdy, n, w);
            const float *xx = ln_widened(ln_at(x, fx, at), fx, n, w + lr);
            layernorm_backward_chunk(wide, nr, wdx, pg, pb, xdy, xx, pm + r, pr + r, pgam, d);
            if (dres.ptr) {
                /* dres may be dx: each element read before it is written */
                const float *xres = ln_widened(ln_at(dres, fres, at), fres, n, w + 3 * lr);
                for (int64_t i = 0; i < n; i++)
                    wdx[i] = chk_ln_dx_res(wdx[i], xres[i]);
            }
            ln_stored(ln_at(dx, fdx, at), fdx, wdx, n);
        }
    }
    layernorm_params_finish(part, chunks, d, dgamma, dbeta);
    chi_host_scratch_give(&sc);
    return CH_OK;
}

/* ---- BatchNorm ------------------------------------------------------------ */

ch_status chi_host_channel_sums(void *stream, int64_t outer, int64_t c, int64_t inner,
                                ch_bmem sums, ch_bmem a, ch_bmem a_center, ch_bmem b,
                                ch_bmem b_center)
{
    (void)stream;
    float *ps = chi_host_f32(sums);
    const float *pa = chi_host_f32(a), *pb = chi_host_f32(b);
    const float *pac = a_center.ptr ? chi_host_f32(a_center) : NULL;
    const float *pbc = b_center.ptr ? chi_host_f32(b_center) : NULL;
    CHI_OMP(omp parallel for if (outer * c * inner > CHI_HOST_PAR_MIN))
    for (int64_t ch = 0; ch < c; ch++) {
        double ac = pac ? pac[ch] : 0.0, bc = pbc ? pbc[ch] : 0.0, s1 = 0.0, s2 = 0.0;
        for (int64_t o = 0; o < outer; o++) {
            double r1, r2;
            sums_around(pa + (o * c + ch) * inner, ac, pb + (o * c + ch) * inner, bc, inner,
                        &r1, &r2);
            s1 += r1;
            s2 += r2;
        }
        ps[ch] = (float)s1;
        ps[c + ch] = (float)s2;
    }
    ps[2 * c] = (float)(outer * inner);
    return CH_OK;
}

/* Training: the batch's mean and rstd from the sums, and the running
 * statistics moved towards them. */
static void stats_from_sums(int64_t c, float momentum, float eps, float *mean, float *rstd,
                            float *run_mean, float *run_var, const float *sums,
                            const float *center)
{
    float count = sums[2 * c];
    for (int64_t ch = 0; ch < c; ch++) {
        double m = chk_bn_mean(center ? center[ch] : 0.0f, sums[ch], count);
        double v = chk_bn_var(sums[ch], sums[c + ch], count);
        mean[ch] = (float)m;
        rstd[ch] = (float)chk_norm_rstd(v, eps);
        if (!run_mean)
            continue;
        run_mean[ch] = chk_bn_running(run_mean[ch], momentum, m);
        run_var[ch] = chk_bn_running(run_var[ch], momentum, chk_bn_unbiased(v, count));
    }
}

ch_status chi_host_batchnorm_stats(void *stream, int64_t c, float momentum, float eps,
                                   ch_bmem mean, ch_bmem rstd, ch_bmem running_mean,
                                   ch_bmem running_var, ch_bmem sums, ch_bmem center)
{
    (void)stream;
    float *pm = chi_host_f32(mean), *pr = chi_host_f32(rstd);
    float *prm = running_mean.ptr ? chi_host_f32(running_mean) : NULL;
    float *prv = running_var.ptr ? chi_host_f32(running_var) : NULL;
    if (sums.ptr) {
        stats_from_sums(c, momentum, eps, pm, pr, prm, prv, chi_host_f32(sums),
                        center.ptr ? chi_host_f32(center) : NULL);
        return CH_OK;
    }
    for (int64_t ch = 0; ch < c; ch++) {
        pm[ch] = prm[ch];
        pr[ch] = (float)chk_norm_rstd(prv[ch], eps);
    }
    return CH_OK;
}

/* One channel's run of `inner` elements (AVX2 or baseline). */
CHI_CLONES static void bn_forward_run(float *y, const float *x, int64_t inner, float m, float r,
                                      float gamma, float beta)
{
    CHI_OMP(omp simd)
    for (int64_t i = 0; i < inner; i++)
        y[i] = chk_norm_affine(x[i], m, r, gamma, beta);
}

/* t: the channel's total sums (s1, s2, count). */
CHI_CLONES static void bn_backward_run(float *dx, const float *dy, const float *x, int64_t inner,
                                       float m, float r, float gamma, float t1, float t2,
                                       float count)
{
    CHI_OMP(omp simd)
    for (int64_t i = 0; i < inner; i++)
        dx[i] = chk_bn_dx(dy[i], x[i], m, r, gamma, t1, t2, count);
}

ch_status chi_host_batchnorm_forward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                     ch_bmem y, ch_bmem x, ch_bmem mean, ch_bmem rstd,
                                     ch_bmem gamma, ch_bmem beta)
{
    (void)stream;
    float *py = chi_host_f32(y);
    const float *px = chi_host_f32(x), *pm = chi_host_f32(mean), *pr = chi_host_f32(rstd),
                *pg = chi_host_f32(gamma), *pb = chi_host_f32(beta);
    CHI_OMP(omp parallel for collapse(2) if (outer * c * inner > CHI_HOST_PAR_MIN))
    for (int64_t o = 0; o < outer; o++)
        for (int64_t ch = 0; ch < c; ch++) {
            int64_t at = (o * c + ch) * inner;
            bn_forward_run(py + at, px + at, inner, pm[ch], pr[ch], pg[ch], pb[ch]);
        }
    return CH_OK;
}

ch_status chi_host_batchnorm_backward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                      ch_bmem dx, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy,
                                      ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma,
                                      ch_bmem local, ch_bmem total)
{
    (void)stream;
    const float *pm = chi_host_f32(mean), *pr = chi_host_f32(rstd), *pg = chi_host_f32(gamma),
                *pl = chi_host_f32(local), *pt = chi_host_f32(total);
    float *pdg = chi_host_f32(dgamma), *pdb = chi_host_f32(dbeta);
    for (int64_t ch = 0; ch < c; ch++) {
        pdg[ch] = chk_bn_dgamma(pdg[ch], pr[ch], pl[c + ch]);
        pdb[ch] = chk_bn_dbeta(pdb[ch], pl[ch]);
    }
    if (!dx.ptr)
        return CH_OK;
    float *pdx = chi_host_f32(dx);
    const float *pdy = chi_host_f32(dy), *px = chi_host_f32(x);
    CHI_OMP(omp parallel for collapse(2) if (outer * c * inner > CHI_HOST_PAR_MIN))
    for (int64_t o = 0; o < outer; o++)
        for (int64_t ch = 0; ch < c; ch++) {
            int64_t at = (o * c + ch) * inner;
            bn_backward_run(pdx + at, pdy + at, px + at, inner, pm[ch], pr[ch], pg[ch], pt[ch],
                            pt[c + ch], pt[2 * c]);
        }
    return CH_OK;
}
