/* Host optimizer updates, one fused pass per parameter tensor, with
 * PyTorch's formulas in PyTorch's order (torch.optim.SGD and Adam/AdamW,
 * single-tensor path), in float as PyTorch computes them.
 *
 * The loops are written so that they vectorise: the options are resolved
 * before the loop (one loop per case, no branch inside), and Adam, whose
 * square root the compiler will not vectorise while sqrtf may set errno,
 * has SSE2 and AVX versions. Those do the very same float operations in
 * the same order (no FMA contraction), and vector square root and division
 * are correctly rounded like the scalar ones, so every path gives the same
 * bits. Tensors are cut into fixed blocks shared among the threads. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>

#include "host.h"
#include "optim_consts.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_X86_KERNELS 1
#endif

/* Elements per task of the threaded loops. */
#define OPT_BLOCK 16384

/* ---- SGD ------------------------------------------------------------------- */

typedef struct sgd_job {
    float *p, *m;
    const float *g;
    ch_sgd_params s;
    int first_step;
} sgd_job;

static void sgd_block(const sgd_job *j, int64_t lo, int64_t hi)
{
    float *restrict p = j->p, *restrict m = j->m;
    const float *restrict g = j->g;
    const float lr = j->s.lr, wd = j->s.weight_decay, mom = j->s.momentum;
    const float damp = chi_sgd_damp(&j->s);
    if (mom == 0.0f) {
        CHI_OMP(omp simd)
        for (int64_t i = lo; i < hi; i++) {
            float gi = g[i] + wd * p[i];
            p[i] -= lr * gi;
        }
        return;
    }
    if (j->first_step) {
        if (j->s.nesterov) {
            CHI_OMP(omp simd)
            for (int64_t i = lo; i < hi; i++) {
                float gi = g[i] + wd * p[i];
                m[i] = gi;
                p[i] -= lr * (gi + mom * gi);
            }
        } else {
            CHI_OMP(omp simd)
            for (int64_t i = lo; i < hi; i++) {
                float gi = g[i] + wd * p[i];
                m[i] = gi;
                p[i] -= lr * gi;
            }
        }
        return;
    }
    if (j->s.nesterov) {
        CHI_OMP(omp simd)
        for (int64_t i = lo; i < hi; i++) {
            float gi = g[i] + wd * p[i];
            float mi = mom * m[i] + damp * gi;
            m[i] = mi;
            p[i] -= lr * (gi + mom * mi);
        }
    } else {
        CHI_OMP(omp simd)
        for (int64_t i = lo; i < hi; i++) {
            float gi = g[i] + wd * p[i];
            float mi = mom * m[i] + damp * gi;
            m[i] = mi;
            p[i] -= lr * mi;
        }
    }
}

ch_status chi_host_sgd_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,
                            const ch_sgd_params *params, int first_step)
{
    (void)stream;
    sgd_job j = {chi_host_f32(p), params->momentum != 0.0f ? chi_host_f32(m) : NULL,
                 chi_host_f32(g), *params, first_step};
    int64_t blocks = (n + OPT_BLOCK - 1) / OPT_BLOCK;
    CHI_OMP(omp parallel for schedule(static) if (n > CHI_HOST_OPT_PAR_MIN))
    for (int64_t b = 0; b < blocks; b++)
        sgd_block(&j, b * OPT_BLOCK, n - b * OPT_BLOCK < OPT_BLOCK ? n : (b + 1) * OPT_BLOCK);
    return CH_OK;
}

/* ---- Adam and AdamW ---------------------------------------------------------- */

typedef struct adam_job {
    float *p, *m, *v;
    const float *g;
    chi_adam_consts k;
} adam_job;

typedef void (*adam_fn)(const adam_job *j, int64_t lo, int64_t hi);

/* The formula, element by element; the vector versions below do exactly
 * this, and finish their tails with it. */
static void adam_scalar(const adam_job *j, int64_t lo, int64_t hi)
{
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const float *restrict g = j->g;
    for (int64_t i = lo; i < hi; i++) {
        float gi = g[i] + j->k.l2 * p[i];
        float pi = p[i] * j->k.decay;
        float mi = j->k.beta1 * m[i] + j->k.one_minus_beta1 * gi;
        float vi = j->k.beta2 * v[i] + j->k.one_minus_beta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float denom = sqrtf(vi) / j->k.bc2_sqrt + j->k.eps;
        p[i] = pi - j->k.step_size * mi / denom;
    }
}

#ifdef HAVE_X86_KERNELS
static void adam_sse2(const adam_job *j, int64_t lo, int64_t hi)
{
    const __m128 l2 = _mm_set1_ps(j->k.l2), decay = _mm_set1_ps(j->k.decay);
    const __m128 b1 = _mm_set1_ps(j->k.beta1), omb1 = _mm_set1_ps(j->k.one_minus_beta1);
    const __m128 b2 = _mm_set1_ps(j->k.beta2), omb2 = _mm_set1_ps(j->k.one_minus_beta2);
    const __m128 bc2 = _mm_set1_ps(j->k.bc2_sqrt), eps = _mm_set1_ps(j->k.eps);
    const __m128 step = _mm_set1_ps(j->k.step_size);
    int64_t i = lo;
    for (; i + 4 <= hi; i += 4) {
        __m128 p = _mm_loadu_ps(j->p + i), g = _mm_loadu_ps(j->g + i);
        __m128 gi = _mm_add_ps(g, _mm_mul_ps(l2, p));
        __m128 pi = _mm_mul_ps(p, decay);
        __m128 mi = _mm_add_ps(_mm_mul_ps(b1, _mm_loadu_ps(j->m + i)), _mm_mul_ps(omb1, gi));
        __m128 vi = _mm_add_ps(_mm_mul_ps(b2, _mm_loadu_ps(j->v + i)),
                               _mm_mul_ps(_mm_mul_ps(omb2, gi), gi));
        _mm_storeu_ps(j->m + i, mi);
        _mm_storeu_ps(j->v + i, vi);
        __m128 denom = _mm_add_ps(_mm_div_ps(_mm_sqrt_ps(vi), bc2), eps);
        _mm_storeu_ps(j->p + i, _mm_sub_ps(pi, _mm_div_ps(_mm_mul_ps(step, mi), denom)));
    }
    adam_scalar(j, i, hi);
}

__attribute__((target("avx")))
static void adam_avx(const adam_job *j, int64_t lo, int64_t hi)
{
    const __m256 l2 = _mm256_set1_ps(j->k.l2), decay = _mm256_set1_ps(j->k.decay);
    const __m256 b1 = _mm256_set1_ps(j->k.beta1), omb1 = _mm256_set1_ps(j->k.one_minus_beta1);
    const __m256 b2 = _mm256_set1_ps(j->k.beta2), omb2 = _mm256_set1_ps(j->k.one_minus_beta2);
    const __m256 bc2 = _mm256_set1_ps(j->k.bc2_sqrt), eps = _mm256_set1_ps(j->k.eps);
    const __m256 step = _mm256_set1_ps(j->k.step_size);
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        __m256 p = _mm256_loadu_ps(j->p + i), g = _mm256_loadu_ps(j->g + i);
        __m256 gi = _mm256_add_ps(g, _mm256_mul_ps(l2, p));
        __m256 pi = _mm256_mul_ps(p, decay);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(j->m + i)),
                                  _mm256_mul_ps(omb1, gi));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(j->v + i)),
                                  _mm256_mul_ps(_mm256_mul_ps(omb2, gi), gi));
        _mm256_storeu_ps(j->m + i, mi);
        _mm256_storeu_ps(j->v + i, vi);
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        _mm256_storeu_ps(j->p + i,
                         _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(step, mi), denom)));
    }
    adam_scalar(j, i, hi);
}
#endif

static adam_fn adam_kernel(void)
{
#ifdef HAVE_X86_KERNELS
    if (__builtin_cpu_supports("avx"))
        return adam_avx;
    return adam_sse2;
#else
    return adam_scalar;
#endif
}

ch_status chi_host_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v,
                             ch_bmem g, const ch_adam_params *params)
{
    (void)stream;
    adam_job j = {chi_host_f32(p), chi_host_f32(m), chi_host_f32(v), chi_host_f32(g),
                  chi_adam_consts_of(params)};
    adam_fn kernel = adam_kernel();
    int64_t blocks = (n + OPT_BLOCK - 1) / OPT_BLOCK;
    CHI_OMP(omp parallel for schedule(static) if (n > CHI_HOST_OPT_PAR_MIN))
    for (int64_t b = 0; b < blocks; b++)
        kernel(&j, b * OPT_BLOCK, n - b * OPT_BLOCK < OPT_BLOCK ? n : (b + 1) * OPT_BLOCK);
    return CH_OK;
}
