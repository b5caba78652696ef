/* The summing kernel of the host-staged all-reduce (lib/reduce.c), which
 * the host backend's allreduce_sum slot calls too.
 *
 * Each output element is src[0] + src[1] + ... + src[n-1], added left to
 * right: the same bits whatever the thread count or chunk size. The work
 * is cut into fixed chunks shared out over OpenMP threads; a chunk is
 * summed in one pass over its sources and, while it is still in cache,
 * copied to every other destination. */
#include "config.h"

#include <string.h>

#include "backend.h"
#include "bf16_sum.h"
#include "omp.h"

/* Floats per chunk: 64 KiB per source, so a chunk of the total stays in
 * the L2 cache while it is copied out. */
#define SPREAD_CHUNK 16384
/* Up to this many chunks one thread sums them: starting the team (and
 * waking threads that went to sleep) costs more than it saves. */
#define SPREAD_PAR_CHUNKS 8
/* Sources one pass adds; longer lists continue from the partial sum. */
#define SPREAD_FAN 8

/* Four floats, loaded and stored with memcpy (no alignment needed): the
 * compiler emits vector adds at any optimisation level. */
typedef float v4f __attribute__((vector_size(16)));

/* d[0..len) = s[0] + s[1] + ... + s[k-1], k in 1..SPREAD_FAN, left to
 * right. d may be s[0] (each element is read before it is written); it
 * does not otherwise overlap a source. */
static void sum_pass(float *d, const float *const *s, int k, int64_t len)
{
    const float *p[SPREAD_FAN];
    for (int j = 0; j < k; j++)
        p[j] = s[j];
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
        v4f a, b, x, y;
        memcpy(&a, p[0] + i, sizeof a);
        memcpy(&b, p[0] + i + 4, sizeof b);
        for (int j = 1; j < k; j++) {
            memcpy(&x, p[j] + i, sizeof x);
            memcpy(&y, p[j] + i + 4, sizeof y);
            a += x;
            b += y;
        }
        memcpy(d + i, &a, sizeof a);
        memcpy(d + i + 4, &b, sizeof b);
    }
    for (; i < len; i++) {
        float a = p[0][i];
        for (int j = 1; j < k; j++)
            a += p[j][i];
        d[i] = a;
    }
}

static void spread_chunk(int64_t lo, int64_t len, float *dst, int nsrc,
                         const float *const *src, int ncopies, float *const *copies)
{
    const float *s[SPREAD_FAN];
    int k = nsrc < SPREAD_FAN ? nsrc : SPREAD_FAN;
    for (int j = 0; j < k; j++)
        s[j] = src[j] + lo;
    sum_pass(dst + lo, s, k, len);
    /* More sources: the partial sum is the first term of the next pass. */
    for (int next = k; next < nsrc; next += k - 1) {
        s[0] = dst + lo;
        k = 1;
        while (k < SPREAD_FAN && next + k - 1 < nsrc) {
            s[k] = src[next + k - 1] + lo;
            k++;
        }
        sum_pass(dst + lo, s, k, len);
    }
    for (int c = 0; c < ncopies; c++)
        if (copies[c] != dst)
            memcpy(copies[c] + lo, dst + lo, (size_t)len * sizeof(float));
}

/* fn on every fixed chunk of [0, n), shared out over the threads. */
typedef void (*chunk_fn)(int64_t lo, int64_t len, const void *ctx);

static void each_chunk(int64_t n, chunk_fn fn, const void *ctx)
{
    int64_t chunks = (n + SPREAD_CHUNK - 1) / SPREAD_CHUNK;
    CHI_OMP(omp parallel for schedule(static) if (parallel: chunks > SPREAD_PAR_CHUNKS))
    for (int64_t c = 0; c < chunks; c++) {
        int64_t lo = c * SPREAD_CHUNK;
        fn(lo, n - lo < SPREAD_CHUNK ? n - lo : SPREAD_CHUNK, ctx);
    }
}

typedef struct spread_args {
    float *dst;
    int nsrc, ncopies;
    const float *const *src;
    float *const *copies;
} spread_args;

static void spread_one(int64_t lo, int64_t len, const void *ctx)
{
    const spread_args *a = ctx;
    spread_chunk(lo, len, a->dst, a->nsrc, a->src, a->ncopies, a->copies);
}

void chi_sum_spread(int64_t n, float *dst, int nsrc, const float *const *src, int ncopies,
                    float *const *copies)
{
    if (n <= 0 || nsrc < 1)
        return;
    spread_args a = {dst, nsrc, ncopies, src, copies};
    each_chunk(n, spread_one, &a);
}

/* ---- the bf16 all-reduce ------------------------------------------------- */

/* One chunk (lib/bf16_sum.h), built for AVX2 too. */
CHI_CLONES static void sum_bf16_chunk(int64_t lo, int64_t len, int nsrc,
                                      const void *const *src, const int *is_bf16,
                                      float *t32, uint16_t *t16, int ncopies,
                                      float *const *copies)
{
    chi_bf16_sum_range(lo, len, nsrc, src, is_bf16, t32, t16, ncopies, copies);
}

typedef struct bf16_args {
    int64_t from;
    int nsrc;
    const void *const *src;
    const int *is_bf16;
    float *t32;
    uint16_t *t16;
    int ncopies;
    float *const *copies;
} bf16_args;

static void sum_bf16_one(int64_t lo, int64_t len, const void *ctx)
{
    const bf16_args *a = ctx;
    sum_bf16_chunk(a->from + lo, len, a->nsrc, a->src, a->is_bf16, a->t32, a->t16,
                   a->ncopies, a->copies);
}

void chi_sum_bf16(int64_t from, int64_t n, int nsrc, const void *const *src,
                  const int *is_bf16, float *t32, uint16_t *t16, int ncopies,
                  float *const *copies)
{
    if (n <= 0 || nsrc < 1)
        return;
    bf16_args a = {from, nsrc, src, is_bf16, t32, t16, ncopies, copies};
    each_chunk(n, sum_bf16_one, &a);
}
