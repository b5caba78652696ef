/* What the reducer's files share. Private to them:
 *
 * - lib/reduce.c: the reducer (what it does is told there), its groups,
 *   its staging and its calls;
 * - lib/reduce_span.c: the reducer across processes through a backend
 *   that spans them (ch_reducer_span), without the host;
 * - lib/reduce_trace.c: a call's stages on the trace. */
#ifndef CHORUS_LIB_REDUCE_IMPL_H
#define CHORUS_LIB_REDUCE_IMPL_H

#include <stdint.h>

#include "core.h"

struct ch_reducer {
    int n;
    ch_reduce_mode mode;
    int64_t capacity;
    ch_stream **streams; /* [n] */
    int ngroups;
    int *group;               /* [n] the group of each participant */
    int *first;               /* [ngroups] each group's first participant */
    int *gsize;               /* [ngroups] */
    ch_host_buffer **staging; /* [n] NULL where a participant needs none */
    /* Scratch for one call, allocated once. */
    ch_tensor **views;                  /* [n] */
    ch_stream **saved;                  /* [n] the caller's current stream per participant */
    void **handles;                     /* [n] */
    ch_bmem *mems;                      /* [n] */
    const float **src;                  /* [n] */
    float **copies;                     /* [n] */
    const ch_host_buffer **upload_from; /* [n] */
    const ch_host_buffer **holders;     /* [n + 1] staging that holds the total */
    ch_reduce_stage_fn stage;           /* the total passes through it on the host */
    void *stage_user;
    ch_reduce_stage_bf16_fn stage16; /* in bf16, instead: the bf16 total does */
    void *stage16_user;
    void *span; /* the backend's communicators across processes */
    const ch_backend_i *span_be;
    /* ch_reducer_set_dtype(CH_BF16): the host-staged sum moves bf16. */
    ch_dtype dtype;
    ch_tensor **half;    /* [n] device participants' bf16 copies */
    ch_host_buffer *t16; /* the bf16 total, pinned */
    float *t32;          /* with a stage: the f32 total it gets */
    const void **hsrc;   /* [n] */
    int *hsrc_bf16;      /* [n] */
    ch_tensor **hviews;  /* [n] a call's views of half */
    /* ch_reducer_reduce_scatter's call: participant i needs the total of
     * [win_first[i], + win_count[i]) of the call's elements only (NULL:
     * all of them). */
    const int64_t *win_first, *win_count;
    /* The trace (only while one runs): a mark on a participant's stream
     * before and after each of its stages, made at the first traced call. */
    struct {
        int on;                            /* this call is traced */
        char label[48];                    /* "bucket 3": chi_trace_reducer_label */
        ch_event **ev;                     /* [n * MARKS] */
        double *host;                      /* [n * MARKS] the host's clock at each mark */
        unsigned char *set;                /* [n * MARKS] recorded in this call */
        double sum0, sum1, stage0, stage1; /* host stages of this call */
    } tr;
};

/* A participant's marks: its download's, its upload's, its peer stage's. */
enum {
    M_D2H0,
    M_D2H1,
    M_H2D0,
    M_H2D1,
    M_PEER0,
    M_PEER1,
    MARKS
};

/* Whether `dev`'s memory is host memory (a participant read in place). */
static inline int host_memory(const ch_device *dev)
{
    return dev->be->host_memory;
}

/* ---- lib/reduce_trace.c ----------------------------------------------------- */

/* At a call: whether it is traced (r->tr.on), its marks' events made at
 * the first traced call. */
void chi_reducer_trace_begin(ch_reducer *r);
/* Mark `m` of participant i, when the call is traced. */
void chi_reducer_trace_mark(ch_reducer *r, int i, int m);
/* After a traced call, every stream drained: its stages on the trace. */
void chi_reducer_trace_end(ch_reducer *r);
/* ch_reducer_free's part: the marks' events. */
void chi_reducer_trace_free(ch_reducer *r);

#endif
