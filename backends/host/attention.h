/* What the host's two fused attentions share: attention.c's in f32 (the
 * ops' entry points, which choose) and attention_amx.c's in bf16 on AMX.
 * The tiles' sizes, one call's arguments and where its matrices lie, a
 * row's valid keys in a tile, and a tile of queries' start and finish. */
#ifndef CHI_HOST_ATTENTION_H
#define CHI_HOST_ATTENTION_H

#include <math.h>
#include <string.h>

#include "host.h"

/* A tile: FA_Q queries against FA_K keys. */
enum {
    FA_Q = 64,
    FA_K = 64
};

/* One call's arguments: b * heads matrices [t, hd], matrix i = (n, h) at
 * row n * t of its sample and column h * hd: q, k, v (and dq, dk, dv)
 * rows ld floats apart, o (and dout) rows ldo apart, lse [b * heads, t];
 * the backward's dq, dk, dv and dout are NULL in forward. */
typedef struct fa_job {
    int64_t t, hd, heads, ld, ldo;
    int isa; /* the tile products' (chi_host_tile_isa) */
    int amx; /* in bf16 on AMX (attention_amx.c) */
    float scale;
    float *o, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout;
} fa_job;

/* Matrix i's first element in a tensor of rows `ld` floats apart. */
static inline int64_t fa_at(const fa_job *j, int64_t i, int64_t ld)
{
    return i / j->heads * j->t * ld + i % j->heads * j->hd;
}

/* The valid keys of row i in the tile of keys from j0 (count nk). */
static inline int64_t fa_width(int64_t i, int64_t j0, int64_t nk)
{
    int64_t w = i - j0 + 1;
    return w < 0 ? 0 : w > nk ? nk : w;
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

/* attention_amx.c: one thread's tiles in floats, and one matrix's
 * forward and backward (fa_each's `one`). */
size_t chi_host_attention_amx_floats(int64_t hd, int64_t tt);
ch_status chi_host_attention_amx_forward(float *mem, const fa_job *j, int64_t i);
ch_status chi_host_attention_amx_backward(float *mem, const fa_job *j, int64_t i);

#endif
