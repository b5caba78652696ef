/* The attention slots (attention.cl): permute, the masked softmax and its
 * backward, the embedding and its backward. The batched GEMM is gemm.c's. */
#include "config.h"

#include "opencl.h"
#include "kernels/index.h"

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
        st = chcl_reduce_group(stream, CHCL_K_SOFTMAX_MASKED, s, sizeof(cl_float), &group);
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
        st = chcl_reduce_group(stream, CHCL_K_SOFTMAX_MASKED_BACKWARD, s, sizeof(cl_float), &group);
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

/* Sorts the n2 words (a power of two, at least 2) in ascending order
 * (attention.cl): work-groups sort chunks of 2 L in local memory, then
 * each larger stage takes its strides of 2 L and more a launch each over
 * the whole array, and its smaller ones in local memory again. */
static ch_status bitonic_sort(chcl_stream *s, cl_mem words, int64_t n2)
{
    size_t group;
    ch_status st =
        chcl_group_size(s, CHCL_K_BITONIC_LOCAL, (size_t)(n2 / 2), 2 * sizeof(cl_ulong), &group);
    int64_t chunk = 2 * (int64_t)group, groups = n2 / chunk;
    cl_int pairs = (cl_int)(n2 / 2), stage = 0;
    chcl_arg largs[] = {CHCL_ARG(words), CHCL_ARG(stage), CHCL_LOCAL(chunk * sizeof(cl_ulong))};
    if (st == CH_OK)
        st =
            chcl_launch_groups(s, CHCL_K_BITONIC_LOCAL, CHCL_COUNT_OF(largs), largs, groups, group);
    for (int64_t k = 2 * chunk; k <= n2 && st == CH_OK; k *= 2) {
        cl_int kk = (cl_int)k, j;
        chcl_arg gargs[] = {CHCL_ARG(words), CHCL_ARG(pairs), CHCL_ARG(kk), CHCL_ARG(j)};
        for (int64_t jj = k / 2; jj >= chunk && st == CH_OK; jj /= 2) {
            j = (cl_int)jj;
            st = chcl_launch1(s, CHCL_K_BITONIC_GLOBAL, CHCL_COUNT_OF(gargs), gargs, pairs);
        }
        stage = kk;
        if (st == CH_OK)
            st = chcl_launch_groups(s, CHCL_K_BITONIC_LOCAL, CHCL_COUNT_OF(largs), largs, groups,
                                    group);
    }
    return st;
}

/* The sorted (key, position) words of the batch's indices in `words`
 * (n2 of them), then the runs summed into dtable (attention.cl). */
static ch_status embedding_runs(chcl_stream *s, int64_t n, int64_t n2, int64_t v, int64_t d,
                                cl_mem words, ch_bmem dtable, ch_bmem dy, ch_bmem idx)
{
    chcl_ref I = chcl_ref_of(idx), DT = chcl_ref_of(dtable), DY = chcl_ref_of(dy);
    cl_int len = (cl_int)n, len2 = (cl_int)n2, rows = (cl_int)v, cols = (cl_int)d;
    chcl_arg kargs[] = {CHCL_ARG(words), CHCL_REF(I), CHCL_ARG(len), CHCL_ARG(len2),
                        CHCL_ARG(rows)};
    ch_status st = chcl_launch1(s, CHCL_K_EMBEDDING_KEYS, CHCL_COUNT_OF(kargs), kargs, n2);
    if (st == CH_OK && n2 > 1)
        st = bitonic_sort(s, words, n2);
    chcl_arg args[] = {CHCL_REF(DT),  CHCL_REF(DY),   CHCL_ARG(words),
                       CHCL_ARG(len), CHCL_ARG(rows), CHCL_ARG(cols)};
    if (st == CH_OK)
        st = chcl_launch1(s, CHCL_K_EMBEDDING_BACKWARD, CHCL_COUNT_OF(args), args, n * d);
    return st;
}

ch_status chcl_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d,
                                  ch_bmem dtable, ch_bmem dy, ch_bmem idx)
{
    chcl_stream *s = stream;
    int64_t n2 = (int64_t)chcl_pow2_cover(n);
    cl_mem words = NULL;
    ch_status st = check_embedding("embedding_backward", n, v, d);
    if (st == CH_OK)
        st = chcl_check_count("embedding_backward", n2);
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "embedding_backward", (size_t)n2 * sizeof(cl_ulong), &words);
    if (st != CH_OK)
        return st;
    st = embedding_runs(s, n, n2, v, d, words, dtable, dy, idx);
    chcl_scratch_release(s);
    return st;
}
