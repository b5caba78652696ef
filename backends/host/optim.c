/* Host optimizer updates, one fused pass per parameter tensor: the
 * per-element steps of lib/kernels/optim_step.h (PyTorch's formulas in
 * PyTorch's order, in float), which every backend shares.
 *
 * The loops are written so that they vectorise: SGD's options become
 * constants of one loop per case (no branch inside), and Adam, whose
 * square root the compiler will not vectorise while sqrtf may set errno,
 * runs the shared CHK_ADAM_UPDATE on SSE2 and AVX vectors. Those do the
 * very same float operations in the same order (no FMA contraction), and
 * vector square root and division are correctly rounded like the scalar
 * ones, so every path gives the same bits. Tensors are cut into fixed
 * blocks shared among the threads. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <string.h>

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
    chk_sgd_consts k;
} sgd_job;

/* chk_sgd_step over [lo, hi) with the options given as constants, so that
 * each call below compiles to a loop without a branch, which vectorises. */
static inline __attribute__((always_inline)) void sgd_loop(const sgd_job *j, int64_t lo, int64_t hi,
                                                           int has_momentum, int first_step,
                                                           int nesterov)
{
    float *restrict p = j->p, *restrict m = j->m;
    const float *restrict g = j->g;
    chk_sgd_consts k = j->k;
    k.has_momentum = has_momentum;
    k.first_step = first_step;
    k.nesterov = nesterov;
    CHI_OMP(omp simd)
    for (int64_t i = lo; i < hi; i++) {
        chk_sgd_state s = {p[i], has_momentum && !first_step ? m[i] : 0.0f};
        s = chk_sgd_step(k, s, g[i]);
        p[i] = s.p;
        if (has_momentum)
            m[i] = s.m;
    }
}

static void sgd_block(const sgd_job *j, int64_t lo, int64_t hi)
{
    if (!j->k.has_momentum)
        sgd_loop(j, lo, hi, 0, 0, 0);
    else if (j->k.first_step)
        j->k.nesterov ? sgd_loop(j, lo, hi, 1, 1, 1) : sgd_loop(j, lo, hi, 1, 1, 0);
    else
        j->k.nesterov ? sgd_loop(j, lo, hi, 1, 0, 1) : sgd_loop(j, lo, hi, 1, 0, 0);
}

ch_status chi_host_sgd_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,
                            const ch_sgd_params *params, int first_step)
{
    (void)stream;
    sgd_job j = {chi_host_f32(p), params->momentum != 0.0f ? chi_host_f32(m) : NULL,
                 chi_host_f32(g), chi_sgd_consts_of(params, first_step)};
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
    chk_adam_consts k;
} adam_job;

typedef void (*adam_fn)(const adam_job *j, int64_t lo, int64_t hi);

/* The update element by element; the vector versions below run the same
 * CHK_ADAM_UPDATE on four or eight lanes and finish their tails here. */
static void adam_scalar(const adam_job *j, int64_t lo, int64_t hi)
{
    for (int64_t i = lo; i < hi; i++) {
        chk_adam_state s = {j->p[i], j->m[i], j->v[i]};
        s = chk_adam_step(j->k, s, j->g[i]);
        j->p[i] = s.p;
        j->m[i] = s.m;
        j->v[i] = s.v;
    }
}

#ifdef HAVE_X86_KERNELS
/* GCC's vector types: +, -, * and / on them are the SSE and AVX
 * instructions, correctly rounded like the scalar ones, and so are the
 * square roots below. */
typedef float v4f __attribute__((vector_size(16)));
typedef float v8f __attribute__((vector_size(32)));

static inline v4f sqrt4(v4f x)
{
    return (v4f)_mm_sqrt_ps((__m128)x);
}

__attribute__((target("avx"))) static inline v8f sqrt8(v8f x)
{
    return (v8f)_mm256_sqrt_ps((__m256)x);
}

/* Adam streams four arrays in and three out, more than the hardware's
 * prefetchers keep ahead of: chi_host_ahead on each of the four. */

/* NAME runs CHK_ADAM_UPDATE W lanes of type VT at a time. */
/* clang-format off */
#define DEFINE_ADAM_VEC(NAME, TARGET, VT, W, SQRT)                                       \
    __attribute__((target(TARGET))) static void NAME(const adam_job *j, int64_t lo,      \
                                                     int64_t hi)                         \
    {                                                                                    \
        int64_t i = lo;                                                                  \
        for (; i + W <= hi; i += W) {                                                    \
            VT p, m, v, g;                                                               \
            if (i % 16 == 0) {                                                           \
                chi_host_ahead(j->p + i);                                                \
                chi_host_ahead(j->m + i);                                                \
                chi_host_ahead(j->v + i);                                                \
                chi_host_ahead(j->g + i);                                                \
            }                                                                            \
            memcpy(&p, j->p + i, sizeof p);                                              \
            memcpy(&m, j->m + i, sizeof m);                                              \
            memcpy(&v, j->v + i, sizeof v);                                              \
            memcpy(&g, j->g + i, sizeof g);                                              \
            CHK_ADAM_UPDATE(VT, SQRT, j->k, p, m, v, g);                                 \
            memcpy(j->p + i, &p, sizeof p);                                              \
            memcpy(j->m + i, &m, sizeof m);                                              \
            memcpy(j->v + i, &v, sizeof v);                                              \
        }                                                                                \
        adam_scalar(j, i, hi);                                                           \
    }
/* clang-format on */

DEFINE_ADAM_VEC(adam_sse2, "sse2", v4f, 4, sqrt4)
DEFINE_ADAM_VEC(adam_avx, "avx", v8f, 8, sqrt8)
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

/* The update block by block; with `round`, each block of p rounded into
 * ph right after, while it is in the cache. */
static void adam_blocks(int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                        const ch_adam_params *params, chi_host_round_fn *round, uint16_t *ph)
{
    adam_job j = {chi_host_f32(p), chi_host_f32(m), chi_host_f32(v), chi_host_f32(g),
                  chi_adam_consts_of(params)};
    adam_fn kernel = adam_kernel();
    int64_t blocks = (n + OPT_BLOCK - 1) / OPT_BLOCK;
    CHI_OMP(omp parallel for schedule(static) if (n > CHI_HOST_OPT_PAR_MIN))
    for (int64_t b = 0; b < blocks; b++) {
        int64_t lo = b * OPT_BLOCK, hi = n - lo < OPT_BLOCK ? n : lo + OPT_BLOCK;
        kernel(&j, lo, hi);
        if (round)
            round(ph + lo, (const uint32_t *)j.p + lo, hi - lo);
    }
}

ch_status chi_host_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v, ch_bmem g,
                             const ch_adam_params *params)
{
    (void)stream;
    adam_blocks(n, p, m, v, g, params, NULL, NULL);
    return CH_OK;
}

ch_status chi_host_adam_step_half(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v,
                                  ch_bmem g, const ch_adam_params *params, int half, ch_bmem ph)
{
    (void)stream;
    adam_blocks(n, p, m, v, g, params, chi_host_round_loop(half),
                (uint16_t *)((char *)ph.ptr + ph.off));
    return CH_OK;
}

/* One segment after another: the same work as the per-parameter calls. */
ch_status chi_host_adam_step_multi(void *stream, int count, const ch_adam_segment *segs,
                                   const ch_adam_params *params)
{
    (void)stream;
    for (int i = 0; i < count; i++) {
        const ch_adam_segment *g = &segs[i];
        if (g->half != CH_F32 && g->half != CH_BF16 && g->half != CH_F16)
            return chi_error(CH_ERR_UNSUPPORTED, "host adam_step_multi: format %d", (int)g->half);
        int half = g->half != CH_F32;
        adam_blocks(g->n, g->p, g->m, g->v, g->g, params,
                    half ? chi_host_round_loop(g->half) : NULL,
                    half ? (uint16_t *)((char *)g->ph.ptr + g->ph.off) : NULL);
    }
    return CH_OK;
}
