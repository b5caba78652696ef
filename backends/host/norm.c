/* Host LayerNorm and BatchNorm (ops.h, "Normalisation").
 *
 * The formulas are lib/kernels/normalize.h's, in double (chk_acc) from the
 * f32 inputs and rounded once on the way out. Every sum has an order fixed
 * by the shape alone, so the same inputs give the same bits whatever the
 * thread count: a row's sums
 * in LANES interleaved accumulators added pairwise (an order the compiler
 * can still vectorise), LayerNorm's parameter gradients per chunk of rows,
 * the chunks then added in order, a channel's sums one run of `inner`
 * elements at a time. A double sum of n terms errs by at most n 2^-53 of
 * the sum of their magnitudes: below f32's own rounding (2^-24) for any n
 * below 2^29, so the f32 results do not lose accuracy as the batch grows. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdlib.h>

#include "host.h"
#include "kernels/normalize.h"

/* Rows of LayerNorm's backward summed together into one partial sum of
 * the parameter gradients. */
#define LN_CHUNK 32
#define LANES 8

/* The lanes of a sum added pairwise into l[0]. */
static double lanes_total(double *l)
{
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int k = 0; k < w; k++)
            l[k] += l[k + w];
    return l[0];
}

/* s1 = the sum of a - ca and s2 = the sum of (a - ca)(b - cb) over n
 * elements. */
CHI_CLONES_WIDE static void sums_around(const float *a, double ca, const float *b, double cb,
                                        int64_t n, double *s1, double *s2)
{
    double l1[LANES] = {0}, l2[LANES] = {0};
    int64_t i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int k = 0; k < LANES; k++) {
            double da = (double)a[i + k] - ca;
            l1[k] += da;
            l2[k] += da * ((double)b[i + k] - cb);
        }
    for (int k = 0; i < n; i++, k++) {
        double da = (double)a[i] - ca;
        l1[k] += da;
        l2[k] += da * ((double)b[i] - cb);
    }
    *s1 = lanes_total(l1);
    *s2 = lanes_total(l2);
}

/* ---- LayerNorm ------------------------------------------------------------ */

CHI_CLONES_WIDE static void layernorm_row(float *y, float *mean, float *rstd, const float *x,
                                          const float *gamma, const float *beta, int64_t d,
                                          float eps)
{
    double s, v, unused;
    sums_around(x, 0.0, x, 0.0, d, &s, &unused);
    double m = s / (double)d;
    sums_around(x, m, x, m, d, &unused, &v);
    double r = chk_norm_rstd(v / (double)d, eps);
    CHI_OMP(omp simd)
    for (int64_t j = 0; j < d; j++)
        y[j] = chk_norm_affine(x[j], m, r, gamma[j], beta[j]);
    *mean = (float)m;
    *rstd = (float)r;
}

ch_status chi_host_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_bmem y,
                             ch_bmem mean, ch_bmem rstd, ch_bmem x, ch_bmem gamma,
                             ch_bmem beta)
{
    (void)stream;
    float *py = chi_host_f32(y), *pm = chi_host_f32(mean), *pr = chi_host_f32(rstd);
    const float *px = chi_host_f32(x), *pg = chi_host_f32(gamma), *pb = chi_host_f32(beta);
    CHI_OMP(omp parallel for if (rows * d > CHI_HOST_PAR_MIN))
    for (int64_t r = 0; r < rows; r++)
        layernorm_row(py + r * d, pm + r, pr + r, px + r * d, pg, pb, d, eps);
    return CH_OK;
}

/* One row of the backward: its dy * xhat and dy added to the chunk's
 * partial sums pg and pb, and (when dx is wanted) in the same pass
 * s1 = the sum of g = dy gamma and s2 = the sum of g xhat over the row,
 * then the row's dx. */
CHI_CLONES_WIDE static void layernorm_backward_row(float *restrict dx, double *restrict pg,
                                                   double *restrict pb, const float *restrict dy,
                                                   const float *restrict x, float mean, float rstd,
                                                   const float *restrict gamma, int64_t d)
{
    double m = mean, r = rstd;
    if (!dx) {
        CHI_OMP(omp simd)
        for (int64_t j = 0; j < d; j++) {
            pg[j] += dy[j] * chk_norm_xhat(x[j], m, r);
            pb[j] += dy[j];
        }
        return;
    }
    double l1[LANES] = {0}, l2[LANES] = {0};
    int64_t j = 0;
    for (; j + LANES <= d; j += LANES)
        for (int k = 0; k < LANES; k++) {
            double xh = chk_norm_xhat(x[j + k], m, r), g = chk_ln_g(dy[j + k], gamma[j + k]);
            pg[j + k] += dy[j + k] * xh;
            pb[j + k] += dy[j + k];
            l1[k] += g;
            l2[k] += g * xh;
        }
    for (int k = 0; j < d; j++, k++) {
        double xh = chk_norm_xhat(x[j], m, r), g = chk_ln_g(dy[j], gamma[j]);
        pg[j] += dy[j] * xh;
        pb[j] += dy[j];
        l1[k] += g;
        l2[k] += g * xh;
    }
    double k1 = lanes_total(l1) / (double)d, k2 = lanes_total(l2) / (double)d;
    CHI_OMP(omp simd)
    for (j = 0; j < d; j++)
        dx[j] = chk_ln_dx(dy[j], gamma[j], x[j], m, r, k1, k2);
}

ch_status chi_host_layernorm_backward(void *stream, int64_t rows, int64_t d, ch_bmem dx,
                                      ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x,
                                      ch_bmem mean, ch_bmem rstd, ch_bmem gamma)
{
    (void)stream;
    int64_t chunks = (rows + LN_CHUNK - 1) / LN_CHUNK;
    /* part[k] holds chunk k's sums: d of dy * xhat, then d of dy. */
    double *part = calloc((size_t)(chunks * 2 * d), sizeof *part);
    if (!part)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host layernorm_backward: calloc(%lld doubles) "
                         "failed", (long long)(chunks * 2 * d));
    float *pdx = dx.ptr ? chi_host_f32(dx) : NULL;
    const float *pdy = chi_host_f32(dy), *px = chi_host_f32(x), *pm = chi_host_f32(mean),
                *pr = chi_host_f32(rstd), *pgam = chi_host_f32(gamma);
    CHI_OMP(omp parallel for if (rows * d > CHI_HOST_PAR_MIN))
    for (int64_t k = 0; k < chunks; k++) {
        double *pg = part + k * 2 * d, *pb = pg + d;
        int64_t end = (k + 1) * LN_CHUNK < rows ? (k + 1) * LN_CHUNK : rows;
        for (int64_t r = k * LN_CHUNK; r < end; r++)
            layernorm_backward_row(pdx ? pdx + r * d : NULL, pg, pb, pdy + r * d, px + r * d,
                                   pm[r], pr[r], pgam, d);
    }
    float *pdg = chi_host_f32(dgamma), *pdb = chi_host_f32(dbeta);
    for (int64_t j = 0; j < d; j++) {
        double g = 0.0, b = 0.0;
        for (int64_t k = 0; k < chunks; k++) {
            g += part[k * 2 * d + j];
            b += part[k * 2 * d + d + j];
        }
        pdg[j] = (float)(pdg[j] + g);
        pdb[j] = (float)(pdb[j] + b);
    }
    free(part);
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
