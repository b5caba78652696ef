/* The op slots: each turns its arguments into kernel arguments (buffers as
 * cl_mem plus element offset, sizes as int after a limit check) and queues
 * one kernel, two for the softmax loss. The core has checked shapes, dtypes
 * and devices already. */
#include "config.h"

#include <math.h>

#include "opencl.h"
#include "optim_consts.h"

/* The elements of [outer, c, inner] as one kernel indexes them (the
 * product of a real tensor's sizes cannot overflow int64). */
static ch_status check_3d(const char *op, int64_t outer, int64_t c, int64_t inner)
{
    return chcl_check_count(op, outer * c * inner);
}

ch_status chcl_fill(void *stream, ch_bmem y, int64_t n, uint32_t word)
{
    chcl_stream *s = stream;
    cl_uint pattern = word;
    cl_int err = clEnqueueFillBuffer(s->queue, chcl_buf(y), &pattern, sizeof pattern, y.off,
                                     (size_t)n * sizeof pattern, 0, NULL, NULL);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, "clEnqueueFillBuffer");
}

ch_status chcl_binary(void *stream, ch_binary_op op, int64_t n, ch_bmem y, ch_bmem a,
                      ch_bmem b)
{
    if (!chi_enum_known((int)op, CH_BIN_COUNT))
        return chi_unknown_enum("opencl", "binary", "ch_binary_op", (int)op, CH_BIN_COUNT);
    chcl_ref Y = chcl_ref_of(y), A = chcl_ref_of(a), B = chcl_ref_of(b);
    cl_int len = (cl_int)n, code = (cl_int)op;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(A), CHCL_REF(B), CHCL_ARG(len),
                       CHCL_ARG(code)};
    return chcl_launch1(stream, CHCL_K_BINARY, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_axpby(void *stream, int64_t n, ch_bmem y, float alpha, ch_bmem x,
                     float beta)
{
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x);
    cl_int len = (cl_int)n;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(len), CHCL_ARG(alpha),
                       CHCL_ARG(beta)};
    return chcl_launch1(stream, CHCL_K_AXPBY, CHCL_COUNT_OF(args), args, n);
}

/* f32 <-> bf16 and f16: offsets in elements of each side's width. */
static ch_status convert(void *stream, chcl_kern_id k, int64_t n, ch_bmem y, size_t ysize,
                         ch_bmem x, size_t xsize)
{
    chcl_ref Y = {chcl_buf(y), (cl_ulong)(y.off / ysize)}, X = {chcl_buf(x),
                                                                (cl_ulong)(x.off / xsize)};
    cl_int len = (cl_int)n;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(len)};
    return chcl_launch1(stream, k, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_f32_to_bf16(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert(stream, CHCL_K_F32_TO_BF16, n, y, 2, x, 4);
}

ch_status chcl_bf16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert(stream, CHCL_K_BF16_TO_F32, n, y, 4, x, 2);
}

ch_status chcl_f32_to_f16(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert(stream, CHCL_K_F32_TO_F16, n, y, 2, x, 4);
}

ch_status chcl_f16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert(stream, CHCL_K_F16_TO_F32, n, y, 4, x, 2);
}

ch_status chcl_act_forward(void *stream, ch_activation act, int64_t n, ch_bmem y,
                           ch_bmem x)
{
    if (!chi_enum_known((int)act, CH_ACT_COUNT))
        return chi_unknown_enum("opencl", "act_forward", "ch_activation", (int)act,
                                CH_ACT_COUNT);
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x);
    cl_int len = (cl_int)n, code = (cl_int)act;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(len), CHCL_ARG(code)};
    return chcl_launch1(stream, CHCL_K_ACT_FORWARD, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_act_backward(void *stream, ch_activation act, int64_t n, ch_bmem dx,
                            ch_bmem dy, ch_bmem x, ch_bmem y)
{
    if (!chi_enum_known((int)act, CH_ACT_COUNT))
        return chi_unknown_enum("opencl", "act_backward", "ch_activation", (int)act,
                                CH_ACT_COUNT);
    /* The buffer the activation does not read may be absent: dy stands in,
     * the kernel never touches it. */
    if (!x.ptr)
        x = dy;
    if (!y.ptr)
        y = dy;
    chcl_ref DX = chcl_ref_of(dx), DY = chcl_ref_of(dy), X = chcl_ref_of(x),
             Y = chcl_ref_of(y);
    cl_int len = (cl_int)n, code = (cl_int)act;
    chcl_arg args[] = {CHCL_REF(DX), CHCL_REF(DY), CHCL_REF(X), CHCL_REF(Y),
                       CHCL_ARG(len), CHCL_ARG(code)};
    return chcl_launch1(stream, CHCL_K_ACT_BACKWARD, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_bias_add(void *stream, int64_t outer, int64_t c, int64_t inner, ch_bmem y,
                        ch_bmem x, ch_bmem bias)
{
    ch_status st = check_3d("bias_add", outer, c, inner);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x), B = chcl_ref_of(bias);
    cl_int len = (cl_int)(outer * c * inner), cc = (cl_int)c, in = (cl_int)inner;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_REF(B), CHCL_ARG(len), CHCL_ARG(cc),
                       CHCL_ARG(in)};
    return chcl_launch1(stream, CHCL_K_BIAS_ADD, CHCL_COUNT_OF(args), args, len);
}

/* The bias gradient's spans (sum.cl): a linear layer's rows in spans of
 * at least BIAS_SPAN_ROWS rows, a convolution channel's elements in spans
 * of at least BIAS_SPAN_ELEMENTS, at most BIAS_SPANS_MAX. */
#define BIAS_SPAN_ROWS 256
#define BIAS_SPAN_ELEMENTS 4096
#define BIAS_SPANS_MAX 64
/* bias_grad_rows: rows each work-item sums, at least. */
#define BIAS_LANE_ROWS 8

/* bias_grad_rows' work-group: tx channels side by side, the kernel's
 * preferred multiple (a GPU's warp reads one run of a row), by ty lanes of
 * rows, as many as the kernel, the device and local memory allow. */
static ch_status bias_rows_group(chcl_stream *s, int64_t c, int64_t chunk, size_t local[2])
{
    chcl_limits lim;
    ch_status st = chcl_limits_of(s, CHCL_K_BIAS_GRAD_ROWS, &lim);
    if (st != CH_OK)
        return st;
    cl_ulong fit = lim.local_room / sizeof(cl_float);
    size_t most = chcl_pow2_floor(lim.group < fit ? lim.group : (size_t)fit);
    if (most == 0)
        return chi_error(CH_ERR_LIMIT, "opencl bias_grad: no room in %s's local memory",
                         s->dev->name);
    size_t tx = chcl_pow2_floor(lim.multiple), ty = 1;
    while (tx > 1 && (tx > chcl_pow2_cover(c) || tx > lim.item[0] || tx > most))
        tx /= 2;
    int64_t lanes = (chunk + BIAS_LANE_ROWS - 1) / BIAS_LANE_ROWS;
    while (ty * 2 * tx <= most && ty * 2 <= lim.item[1] && (int64_t)ty < lanes)
        ty *= 2;
    local[0] = tx;
    local[1] = ty;
    return CH_OK;
}

/* Into `out` (db, or part [spans, c] when partial). */
static ch_status bias_grad_spans(chcl_stream *s, int64_t outer, int64_t c, int64_t inner,
                                 int64_t spans, chcl_ref out, int partial, ch_bmem dy, float beta)
{
    chcl_ref DY = chcl_ref_of(dy);
    cl_int cc = (cl_int)c, part = partial;
    if (inner == 1) {
        size_t local[2], global[2];
        cl_int rows = (cl_int)outer, chunk = (cl_int)((outer + spans - 1) / spans);
        ch_status st = bias_rows_group(s, c, chunk, local);
        if (st != CH_OK)
            return st;
        global[0] = (size_t)c;
        global[1] = (size_t)spans * local[1];
        chcl_arg args[] = {CHCL_REF(out),   CHCL_REF(DY),
                           CHCL_ARG(rows),  CHCL_ARG(cc),
                           CHCL_ARG(chunk), CHCL_ARG(beta),
                           CHCL_ARG(part),  CHCL_LOCAL(local[0] * local[1] * sizeof(cl_float))};
        return chcl_launch(s, CHCL_K_BIAS_GRAD_ROWS, CHCL_COUNT_OF(args), args, 2, global, local);
    }
    int64_t count = outer * inner;
    size_t group = 0;
    ch_status st = chcl_reduce_group(s, CHCL_K_BIAS_GRAD, count / spans, sizeof(cl_float), &group);
    if (st != CH_OK)
        return st;
    cl_int in = (cl_int)inner, n = (cl_int)count, chunk = (cl_int)((count + spans - 1) / spans);
    chcl_arg args[] = {CHCL_REF(out),  CHCL_REF(DY),   CHCL_ARG(cc),
                       CHCL_ARG(in),   CHCL_ARG(n),    CHCL_ARG(chunk),
                       CHCL_ARG(beta), CHCL_ARG(part), CHCL_LOCAL(group * sizeof(cl_float))};
    return chcl_launch_groups(s, CHCL_K_BIAS_GRAD, CHCL_COUNT_OF(args), args, c * spans, group);
}

ch_status chcl_bias_grad(void *stream, int64_t outer, int64_t c, int64_t inner,
                         ch_bmem db, ch_bmem dy, float beta)
{
    chcl_stream *s = stream;
    ch_status st = check_3d("bias_grad", outer, c, inner);
    if (st != CH_OK)
        return st;
    int64_t spans = inner == 1 ? chcl_spans(outer, BIAS_SPAN_ROWS, BIAS_SPANS_MAX)
                               : chcl_spans(outer * inner, BIAS_SPAN_ELEMENTS, BIAS_SPANS_MAX);
    if (spans == 1)
        return bias_grad_spans(s, outer, c, inner, 1, chcl_ref_of(db), 0, dy, beta);
    cl_mem part = NULL;
    st = chcl_scratch_acquire(s, "bias_grad", (size_t)(spans * c) * sizeof(cl_float), &part);
    if (st != CH_OK)
        return st;
    chcl_ref P = {part, 0}, DB = chcl_ref_of(db);
    st = bias_grad_spans(s, outer, c, inner, spans, P, 1, dy, beta);
    cl_int cc = (cl_int)c, n = (cl_int)spans;
    chcl_arg args[] = {CHCL_REF(DB), CHCL_ARG(part), CHCL_ARG(cc), CHCL_ARG(n), CHCL_ARG(beta)};
    if (st == CH_OK)
        st = chcl_launch1(s, CHCL_K_BIAS_GRAD_FINISH, CHCL_COUNT_OF(args), args, c);
    chcl_scratch_release(s);
    return st;
}

/* Mean of the row losses in `rows` into loss[0], one work-group. */
static ch_status loss_mean(chcl_stream *s, ch_bmem loss, cl_mem rows, int64_t n)
{
    size_t group;
    ch_status st = chcl_reduce_group(s, CHCL_K_MEAN, n, sizeof(cl_float), &group);
    if (st != CH_OK)
        return st;
    chcl_ref L = chcl_ref_of(loss);
    cl_int len = (cl_int)n;
    chcl_arg args[] = {CHCL_REF(L), CHCL_ARG(rows), CHCL_ARG(len),
                       CHCL_LOCAL(group * sizeof(cl_float))};
    return chcl_launch_groups(s, CHCL_K_MEAN, CHCL_COUNT_OF(args), args, 1, group);
}

/* Labels out of range: the kernels lower the stream's check word, read at
 * the stream's next wait (stream.c); the call itself does not wait. */

static ch_status softmax_rows(chcl_stream *s, int64_t n, int64_t c, ch_bmem probs, cl_mem rows,
                              ch_bmem logits, ch_bmem labels, chcl_ref bad)
{
    size_t group;
    ch_status st = chcl_reduce_group(s, CHCL_K_SOFTMAX_ROWS, c, sizeof(cl_float), &group);
    if (st != CH_OK)
        return st;
    chcl_ref P = chcl_ref_of(probs), X = chcl_ref_of(logits), LB = chcl_ref_of(labels);
    cl_int cc = (cl_int)c;
    chcl_arg args[] = {CHCL_REF(P),
                       CHCL_ARG(rows),
                       CHCL_REF(X),
                       CHCL_REF(LB),
                       CHCL_ARG(cc),
                       CHCL_REF(bad),
                       CHCL_LOCAL(group * sizeof(cl_float))};
    return chcl_launch_groups(s, CHCL_K_SOFTMAX_ROWS, CHCL_COUNT_OF(args), args, n, group);
}

ch_status chcl_softmax_xent(void *stream, int64_t n, int64_t c, ch_bmem loss,
                            ch_bmem probs, ch_bmem logits, ch_bmem labels)
{
    chcl_stream *s = stream;
    ch_status st = check_3d("softmax_xent", n, c, 1);
    cl_mem rows = NULL;
    chcl_ref bad;
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "softmax_xent", (size_t)n * sizeof(cl_float), &rows);
    if (st != CH_OK)
        return st;
    st = chcl_check_begin(s, &bad);
    if (st == CH_OK) {
        ch_status ran = softmax_rows(s, n, c, probs, rows, logits, labels, bad);
        if (ran == CH_OK)
            ran = loss_mean(s, loss, rows, n);
        st = chcl_check_end(s, ran, bad, labels, "ch_softmax_xent", 0, c);
    }
    chcl_scratch_release(s);
    return st;
}

ch_status chcl_softmax_xent_backward(void *stream, int64_t n, int64_t c, ch_bmem dlogits,
                                     ch_bmem probs, ch_bmem labels, float scale)
{
    chcl_stream *s = stream;
    chcl_ref bad;
    ch_status st = check_3d("softmax_xent_backward", n, c, 1);
    if (st == CH_OK)
        st = chcl_check_begin(s, &bad);
    if (st != CH_OK)
        return st;
    chcl_ref D = chcl_ref_of(dlogits), P = chcl_ref_of(probs), LB = chcl_ref_of(labels);
    cl_int total = (cl_int)(n * c), cc = (cl_int)c;
    cl_float rows = (cl_float)n;
    chcl_arg args[] = {CHCL_REF(D),  CHCL_REF(P),     CHCL_REF(LB),   CHCL_ARG(total),
                       CHCL_ARG(cc), CHCL_ARG(scale), CHCL_ARG(rows), CHCL_REF(bad)};
    st = chcl_launch1(s, CHCL_K_SOFTMAX_BACKWARD, CHCL_COUNT_OF(args), args, total);
    return chcl_check_end(s, st, bad, labels, "ch_softmax_xent_backward", 0, c);
}

ch_status chcl_softmax_xent_fused(void *stream, int64_t n, int64_t c, ch_dtype dt, float scale,
                                  ch_bmem loss, ch_bmem logits, ch_bmem labels)
{
    static const char fn[] = "ch_softmax_xent_fused";
    if (dt != CH_F32 && dt != CH_BF16 && dt != CH_F16)
        return chi_error(CH_ERR_UNSUPPORTED, "opencl softmax_xent_fused: dtype %d", (int)dt);
    chcl_stream *s = stream;
    int k = dt == CH_F32 ? CHCL_K_XENT_FUSED : CHCL_K_XENT_FUSED_HALF;
    size_t group;
    cl_mem rows = NULL;
    chcl_ref bad;
    ch_status st = check_3d("softmax_xent_fused", n, c, 1);
    if (st == CH_OK)
        st = chcl_reduce_group(s, k, c, 2 * sizeof(cl_float), &group);
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "softmax_xent_fused", (size_t)n * sizeof(cl_float), &rows);
    if (st != CH_OK)
        return st;
    st = chcl_check_begin(s, &bad);
    if (st == CH_OK) {
        /* The offset in elements of the logits' own size. */
        size_t size = dt == CH_F32 ? sizeof(cl_float) : sizeof(cl_ushort);
        chcl_ref X = {chcl_buf(logits), (cl_ulong)(logits.off / size)};
        chcl_ref LB = chcl_ref_of(labels);
        cl_int cc = (cl_int)c, bf16 = dt == CH_BF16;
        cl_float nrows = (cl_float)n;
        chcl_arg args[] = {CHCL_REF(X),     CHCL_ARG(rows),
                           CHCL_REF(LB),    CHCL_ARG(cc),
                           CHCL_ARG(scale), CHCL_ARG(nrows),
                           CHCL_REF(bad),   CHCL_LOCAL(2 * group * sizeof(cl_float)),
                           CHCL_ARG(bf16)};
        int nargs = CHCL_COUNT_OF(args) - (dt == CH_F32);
        ch_status ran = chcl_launch_groups(s, k, nargs, args, n, group);
        if (ran == CH_OK)
            ran = loss_mean(s, loss, rows, n);
        st = chcl_check_end(s, ran, bad, labels, fn, 0, c);
    }
    chcl_scratch_release(s);
    return st;
}

ch_status chcl_transpose01(void *stream, int64_t a, int64_t b, int64_t inner, ch_bmem y,
                           ch_bmem x)
{
    ch_status st = check_3d("transpose01", a, b, inner);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x);
    cl_int len = (cl_int)(a * b * inner), aa = (cl_int)a, bb = (cl_int)b,
           in = (cl_int)inner;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(len), CHCL_ARG(aa), CHCL_ARG(bb),
                       CHCL_ARG(in)};
    return chcl_launch1(stream, CHCL_K_TRANSPOSE01, CHCL_COUNT_OF(args), args, len);
}

/* Short reductions get one work-item per output (sequential sum), long
 * ones a work-group per output: both a fixed order. */
#define AXIS_ITEM_MAX 64

ch_status chcl_sum_axis(void *stream, ch_axis_op op, int64_t outer, int64_t n,
                        int64_t inner, ch_bmem y, ch_bmem x)
{
    if (!chi_enum_known((int)op, CH_AXIS_COUNT))
        return chi_unknown_enum("opencl", "sum_axis", "ch_axis_op", (int)op, CH_AXIS_COUNT);
    ch_status st = check_3d("sum_axis", outer, n, inner);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x);
    cl_int outputs = (cl_int)(outer * inner), len = (cl_int)n, in = (cl_int)inner,
           mean = op == CH_AXIS_MEAN;
    if (n <= AXIS_ITEM_MAX) {
        chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(outputs), CHCL_ARG(len),
                           CHCL_ARG(in), CHCL_ARG(mean)};
        return chcl_launch1(stream, CHCL_K_SUM_ITEM, CHCL_COUNT_OF(args), args, outputs);
    }
    size_t group;
    st = chcl_reduce_group(stream, CHCL_K_SUM_GROUP, n, sizeof(cl_float), &group);
    if (st != CH_OK)
        return st;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(len), CHCL_ARG(in),
                       CHCL_ARG(mean), CHCL_LOCAL(group * sizeof(cl_float))};
    return chcl_launch_groups(stream, CHCL_K_SUM_GROUP, CHCL_COUNT_OF(args), args,
                              outputs, group);
}

ch_status chcl_argmax(void *stream, int64_t outer, int64_t n, int64_t inner, ch_bmem y,
                      ch_bmem x)
{
    ch_status st = check_3d("argmax", outer, n, inner);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x);
    cl_int outputs = (cl_int)(outer * inner), len = (cl_int)n, in = (cl_int)inner;
    if (n <= AXIS_ITEM_MAX) {
        chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(outputs), CHCL_ARG(len),
                           CHCL_ARG(in)};
        return chcl_launch1(stream, CHCL_K_ARGMAX_ITEM, CHCL_COUNT_OF(args), args, outputs);
    }
    size_t group;
    st = chcl_reduce_group(stream, CHCL_K_ARGMAX_GROUP, n, sizeof(cl_float) + sizeof(cl_int),
                           &group);
    if (st != CH_OK)
        return st;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_ARG(len), CHCL_ARG(in),
                       CHCL_LOCAL(group * sizeof(cl_float)),
                       CHCL_LOCAL(group * sizeof(cl_int))};
    return chcl_launch_groups(stream, CHCL_K_ARGMAX_GROUP, CHCL_COUNT_OF(args), args,
                              outputs, group);
}

ch_status chcl_sgd_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,
                        const ch_sgd_params *params, int first_step)
{
    /* Without momentum there is no buffer: p stands in, never touched. */
    if (!m.ptr)
        m = p;
    chcl_ref P = chcl_ref_of(p), M = chcl_ref_of(m), G = chcl_ref_of(g);
    cl_int len = (cl_int)n;
    chk_sgd_consts k = chi_sgd_consts_of(params, first_step);
    chcl_arg args[] = {
        CHCL_REF(P),          CHCL_REF(M),           CHCL_REF(G),      CHCL_ARG(len),
        CHCL_ARG(k.lr),       CHCL_ARG(k.momentum),  CHCL_ARG(k.damp), CHCL_ARG(k.weight_decay),
        CHCL_ARG(k.nesterov), CHCL_ARG(k.first_step)};
    return chcl_launch1(stream, CHCL_K_SGD_STEP, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v,
                         ch_bmem g, const ch_adam_params *params)
{
    chcl_ref P = chcl_ref_of(p), M = chcl_ref_of(m), V = chcl_ref_of(v), G = chcl_ref_of(g);
    cl_int len = (cl_int)n;
    chk_adam_consts k = chi_adam_consts_of(params);
    chcl_arg args[] = {CHCL_REF(P),
                       CHCL_REF(M),
                       CHCL_REF(V),
                       CHCL_REF(G),
                       CHCL_ARG(len),
                       CHCL_ARG(k.beta1),
                       CHCL_ARG(k.one_minus_beta1),
                       CHCL_ARG(k.beta2),
                       CHCL_ARG(k.one_minus_beta2),
                       CHCL_ARG(k.step_size),
                       CHCL_ARG(k.bc2_sqrt),
                       CHCL_ARG(k.eps),
                       CHCL_ARG(k.decay),
                       CHCL_ARG(k.l2)};
    return chcl_launch1(stream, CHCL_K_ADAM_STEP, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_rand(void *stream, ch_rand_kind kind, int64_t n, ch_bmem y, uint64_t seed,
                    uint64_t offset, float a, float b)
{
    if (!chi_enum_known((int)kind, CH_RAND_COUNT))
        return chi_unknown_enum("opencl", "rand", "ch_rand_kind", (int)kind, CH_RAND_COUNT);
    chcl_ref Y = chcl_ref_of(y);
    cl_int len = (cl_int)n, code = (cl_int)kind;
    cl_ulong key = seed, first = offset;
    /* Dropout keeps with probability 1 - p and scales by its inverse,
     * computed once here in float as the host does. */
    cl_float lo = a, hi = kind == CH_RAND_DROPOUT ? 1.0f / (1.0f - a) : b;
    chcl_arg args[] = {CHCL_REF(Y),    CHCL_ARG(len), CHCL_ARG(key), CHCL_ARG(first),
                       CHCL_ARG(code), CHCL_ARG(lo),  CHCL_ARG(hi)};
    return chcl_launch1(stream, CHCL_K_RAND, CHCL_COUNT_OF(args), args, n);
}
