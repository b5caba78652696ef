/* The attention slots (attention.cl): permute, the masked softmax and its
 * backward, the embedding and its backward. The batched GEMM is gemm.c's. */
#include "config.h"

#include "opencl.h"
#include "kernels/index.h"

/* Work-groups of the row reductions: a power of two covering the row, at
 * most 256. */
static size_t row_group(int64_t s)
{
    size_t g = 1;
    while (g < 256 && (int64_t)g < s)
        g *= 2;
    return g;
}

ch_status chcl_permute(void *stream, int ndim, const int64_t *xshape, const int *perm,
                       ch_bmem y, ch_bmem x)
{
    int64_t yshape[CH_MAX_DIMS], ystride[CH_MAX_DIMS];
    int64_t numel = chk_permute_plan(ndim, xshape, perm, yshape, ystride);
    cl_long8 shape = {{0}}, stride = {{0}};
    for (int i = 0; i < ndim; i++) {
        shape.s[i] = yshape[i];
        stride.s[i] = ystride[i];
    }
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x);
    cl_long n = numel;
    cl_int nd = ndim;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(n), CHCL_ARG(nd), CHCL_ARG(shape),
                       CHCL_ARG(stride)};
    /* Every offset into x or y is below numel (index.h's rule). */
    chcl_kern_id k = chk_index_is_32(numel) ? CHCL_K_PERMUTE : CHCL_K_PERMUTE_64;
    return chcl_launch1(stream, k, CHCL_COUNT_OF(args), args, numel);
}

ch_status chcl_softmax(void *stream, int64_t rows, int64_t s, int causal,
                       int64_t rows_per_matrix, ch_bmem y, ch_bmem x)
{
    size_t group;
    ch_status st = chcl_check_count("softmax", rows * s);
    if (st == CH_OK)
        st = chcl_group_size(stream, CHCL_K_SOFTMAX_MASKED, row_group(s), sizeof(cl_float),
                             &group);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x);
    cl_int len = (cl_int)s, mask = causal != 0, rpm = (cl_int)rows_per_matrix;
    chcl_arg args[] = {CHCL_REF(Y),   CHCL_REF(X),   CHCL_ARG(len),
                       CHCL_ARG(mask), CHCL_ARG(rpm), CHCL_LOCAL(group * sizeof(cl_float))};
    return chcl_launch_groups(stream, CHCL_K_SOFTMAX_MASKED, CHCL_COUNT_OF(args), args, rows,
                              group);
}

ch_status chcl_softmax_backward(void *stream, int64_t rows, int64_t s, ch_bmem dx, ch_bmem dy,
                                ch_bmem y)
{
    size_t group;
    ch_status st = chcl_check_count("softmax_backward", rows * s);
    if (st == CH_OK)
        st = chcl_group_size(stream, CHCL_K_SOFTMAX_MASKED_BACKWARD, row_group(s),
                             sizeof(cl_float), &group);
    if (st != CH_OK)
        return st;
    chcl_ref DX = chcl_ref_of(dx), DY = chcl_ref_of(dy), Y = chcl_ref_of(y);
    cl_int len = (cl_int)s;
    chcl_arg args[] = {CHCL_REF(DX), CHCL_REF(DY), CHCL_REF(Y), CHCL_ARG(len),
                       CHCL_LOCAL(group * sizeof(cl_float))};
    return chcl_launch_groups(stream, CHCL_K_SOFTMAX_MASKED_BACKWARD, CHCL_COUNT_OF(args), args,
                              rows, group);
}

/* The kernels index y or dy (n x d) and the table (v x d) with int. */
static ch_status check_embedding(const char *op, int64_t n, int64_t v, int64_t d)
{
    ch_status st = chcl_check_count(op, n * d);
    return st == CH_OK ? chcl_check_count(op, v * d) : st;
}

/* An index out of range lowers the stream's check word, read at the
 * stream's next wait (stream.c); the call itself does not wait. */
ch_status chcl_embedding(void *stream, int64_t n, int64_t v, int64_t d, ch_bmem y,
                         ch_bmem table, ch_bmem idx)
{
    chcl_stream *s = stream;
    chcl_ref bad;
    ch_status st = check_embedding("embedding", n, v, d);
    if (st == CH_OK)
        st = chcl_check_begin(s, &bad);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), T = chcl_ref_of(table), I = chcl_ref_of(idx);
    cl_int total = (cl_int)(n * d), rows = (cl_int)v, cols = (cl_int)d;
    chcl_arg args[] = {CHCL_REF(Y),    CHCL_REF(T),    CHCL_REF(I),  CHCL_ARG(total),
                       CHCL_ARG(rows), CHCL_ARG(cols), CHCL_REF(bad)};
    st = chcl_launch1(s, CHCL_K_EMBEDDING, CHCL_COUNT_OF(args), args, n * d);
    return chcl_check_end(s, st, bad, idx, "ch_embedding", 1, v);
}

/* The chains of embedding_chain (attention.cl): head [v], which starts
 * at -1, then next [n]. */
static ch_status embedding_chains(chcl_stream *s, int64_t n, int64_t v, ch_bmem idx,
                                  cl_mem chains)
{
    cl_int none = -1;
    cl_int err = clEnqueueFillBuffer(s->queue, chains, &none, sizeof none, 0,
                                     (size_t)v * sizeof none, 0, NULL, NULL);
    if (err != CL_SUCCESS)
        return chcl_err(err, "clEnqueueFillBuffer");
    chcl_ref I = chcl_ref_of(idx);
    cl_int len = (cl_int)n, rows = (cl_int)v;
    chcl_arg args[] = {CHCL_ARG(chains), CHCL_REF(I), CHCL_ARG(len), CHCL_ARG(rows)};
    return chcl_launch1(s, CHCL_K_EMBEDDING_CHAIN, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d,
                                  ch_bmem dtable, ch_bmem dy, ch_bmem idx)
{
    chcl_stream *s = stream;
    cl_mem chains = NULL;
    ch_status st = check_embedding("embedding_backward", n, v, d);
    if (st == CH_OK)
        st = chcl_check_count("embedding_backward", v + n);
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "embedding_backward", (size_t)(v + n) * sizeof(cl_int),
                                  &chains);
    if (st != CH_OK)
        return st;
    st = embedding_chains(s, n, v, idx, chains);
    chcl_ref DT = chcl_ref_of(dtable), DY = chcl_ref_of(dy);
    cl_int rows = (cl_int)v, cols = (cl_int)d;
    chcl_arg args[] = {CHCL_REF(DT), CHCL_REF(DY), CHCL_ARG(chains), CHCL_ARG(rows),
                       CHCL_ARG(cols)};
    if (st == CH_OK)
        st = chcl_launch1(s, CHCL_K_EMBEDDING_BACKWARD, CHCL_COUNT_OF(args), args, v * d);
    chcl_scratch_release(s);
    return st;
}
