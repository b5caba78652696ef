/* Elementwise ops: fill, arithmetic, activations and bias add.
 * Outputs may alias inputs (in place), so no pointer is __restrict__. */
#include <math.h>
#include "common.cuh"
#include "kernels/act.h"
#include "kernels/half_bits.h"

__global__ void fill_kernel(uint32_t *y, int64_t n, uint32_t word)
{
    CHCU_FOR_EACH(i, n)
    y[i] = word;
}

ch_status chcu_fill(void *stream, ch_bmem y, int64_t n, uint32_t word)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    fill_kernel<<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(chcu_at<uint32_t>(y), n, word);
    return chcu_launched("fill_kernel");
}

template <ch_binary_op OP> __device__ float binary_apply(float a, float b)
{
    static_assert(OP == CH_BIN_ADD || OP == CH_BIN_SUB || OP == CH_BIN_MUL, "a ch_binary_op");
    if (OP == CH_BIN_ADD)
        return a + b;
    if (OP == CH_BIN_SUB)
        return a - b;
    return a * b;
}

template <ch_binary_op OP>
__global__ void binary_kernel(float *y, const float *a, const float *b, int64_t n)
{
    CHCU_FOR_EACH(i, n)
    y[i] = binary_apply<OP>(a[i], b[i]);
}

ch_status chcu_binary(void *stream, ch_binary_op op, int64_t n, ch_bmem y, ch_bmem a, ch_bmem b)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    unsigned grid = chcu_grid(s->dev, n);
    float *py = chcu_at<float>(y);
    const float *pa = chcu_at<float>(a), *pb = chcu_at<float>(b);
    switch (op) {
    case CH_BIN_ADD:
        binary_kernel<CH_BIN_ADD><<<grid, CHCU_THREADS, 0, s->s>>>(py, pa, pb, n);
        break;
    case CH_BIN_SUB:
        binary_kernel<CH_BIN_SUB><<<grid, CHCU_THREADS, 0, s->s>>>(py, pa, pb, n);
        break;
    case CH_BIN_MUL:
        binary_kernel<CH_BIN_MUL><<<grid, CHCU_THREADS, 0, s->s>>>(py, pa, pb, n);
        break;
    default:
        return chi_unknown_enum("cuda", "binary", "ch_binary_op", (int)op, CH_BIN_COUNT);
    }
    return chcu_launched("binary_kernel");
}

__global__ void scale_kernel(float *y, float alpha, const float *x, int64_t n)
{
    CHCU_FOR_EACH(i, n)
    y[i] = alpha * x[i];
}

__global__ void axpby_kernel(float *y, float alpha, const float *x, float beta, int64_t n)
{
    CHCU_FOR_EACH(i, n)
    y[i] = alpha * x[i] + beta * y[i];
}

ch_status chcu_axpby(void *stream, int64_t n, ch_bmem y, float alpha, ch_bmem x, float beta)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    unsigned grid = chcu_grid(s->dev, n);
    /* beta 0 must not read y: it may hold NaNs from an earlier life. */
    if (beta == 0.0f)
        scale_kernel<<<grid, CHCU_THREADS, 0, s->s>>>(chcu_at<float>(y), alpha,
                                                      chcu_at<float>(x), n);
    else
        axpby_kernel<<<grid, CHCU_THREADS, 0, s->s>>>(chcu_at<float>(y), alpha,
                                                      chcu_at<float>(x), beta, n);
    return chcu_launched("axpby_kernel");
}

/* ---- f32 <-> bf16 and f16: lib/kernels/half_bits.h's steps on the device ---- */

template <typename To, typename From, To (*F)(From)>
__global__ void convert_kernel(To *y, const From *x, int64_t n)
{
    CHCU_FOR_EACH(i, n)
    y[i] = F(x[i]);
}

template <typename To, typename From, To (*F)(From)>
static ch_status convert(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    convert_kernel<To, From, F><<<chcu_grid(s->dev, n), CHCU_THREADS, 0, s->s>>>(
        chcu_at<To>(y), chcu_at<From>(x), n);
    return chcu_launched("convert_kernel");
}

ch_status chcu_f32_to_bf16(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert<uint16_t, uint32_t, chk_f32_to_bf16>(stream, n, y, x);
}

ch_status chcu_bf16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert<uint32_t, uint16_t, chk_bf16_to_f32>(stream, n, y, x);
}

ch_status chcu_f32_to_f16(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert<uint16_t, uint32_t, chk_f32_to_f16>(stream, n, y, x);
}

ch_status chcu_f16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x)
{
    return convert<uint32_t, uint16_t, chk_f16_to_f32>(stream, n, y, x);
}

/* ---- activations: lib/kernels/act.h's, A a constant, so each kernel keeps
 * one branch ---- */

template <ch_activation A> __global__ void act_forward_kernel(float *y, const float *x, int64_t n)
{
    CHCU_FOR_EACH(i, n)
    y[i] = chk_act(A, x[i]);
}

/* relu and the gelus read x, tanh and sigmoid read y (the other may be
 * NULL). */
template <ch_activation A>
__global__ void act_backward_kernel(float *dx, const float *dy, const float *x, const float *y,
                                    int64_t n)
{
    CHCU_FOR_EACH(i, n)
    dx[i] =
        chk_act_grad(A, dy[i], chk_act_reads_x(A) ? x[i] : 0.0f, chk_act_reads_x(A) ? 0.0f : y[i]);
}

template <ch_activation A>
static void act_launch(const chcu_stream *s, int backward, int64_t n, float *out,
                       const float *dy, const float *x, const float *y)
{
    unsigned grid = chcu_grid(s->dev, n);
    if (backward)
        act_backward_kernel<A><<<grid, CHCU_THREADS, 0, s->s>>>(out, dy, x, y, n);
    else
        act_forward_kernel<A><<<grid, CHCU_THREADS, 0, s->s>>>(out, x, n);
}

static ch_status act_run(void *stream, ch_activation act, int backward, int64_t n, float *out,
                         const float *dy, const float *x, const float *y)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    switch (act) {
    case CH_ACT_RELU:
        act_launch<CH_ACT_RELU>(s, backward, n, out, dy, x, y);
        break;
    case CH_ACT_GELU:
        act_launch<CH_ACT_GELU>(s, backward, n, out, dy, x, y);
        break;
    case CH_ACT_TANH:
        act_launch<CH_ACT_TANH>(s, backward, n, out, dy, x, y);
        break;
    case CH_ACT_SIGMOID:
        act_launch<CH_ACT_SIGMOID>(s, backward, n, out, dy, x, y);
        break;
    case CH_ACT_GELU_TANH: act_launch<CH_ACT_GELU_TANH>(s, backward, n, out, dy, x, y); break;
    default:
        return chi_unknown_enum("cuda", backward ? "act_backward" : "act_forward",
                                "ch_activation", (int)act, CH_ACT_COUNT);
    }
    return chcu_launched(backward ? "act_backward_kernel" : "act_forward_kernel");
}

ch_status chcu_act_forward(void *stream, ch_activation act, int64_t n, ch_bmem y, ch_bmem x)
{
    return act_run(stream, act, 0, n, chcu_at<float>(y), NULL, chcu_at<float>(x), NULL);
}

ch_status chcu_act_backward(void *stream, ch_activation act, int64_t n, ch_bmem dx,
                            ch_bmem dy, ch_bmem x, ch_bmem y)
{
    const float *px = x.ptr ? chcu_at<float>(x) : NULL;
    const float *py = y.ptr ? chcu_at<float>(y) : NULL;
    return act_run(stream, act, 1, n, chcu_at<float>(dx), chcu_at<float>(dy), px, py);
}

/* x, y as rows of `cols` items; the bias index is the row modulo c (rows of
 * [outer, c] with cols = inner) or the column (rows of [outer] with cols = c,
 * when inner is 1): one division per row, none per item. */
template <bool BY_COL>
__global__ void bias_add_kernel(float *y, const float *x, const float *bias, int64_t rows,
                                int64_t cols, int64_t c)
{
    CHCU_FOR_ROWS(r, rows)
    {
        float br = BY_COL ? 0.0f : bias[r % c];
        CHCU_FOR_COLS(j, cols)
        {
            int64_t i = r * cols + j;
            y[i] = x[i] + (BY_COL ? bias[j] : br);
        }
    }
}

ch_status chcu_bias_add(void *stream, int64_t outer, int64_t c, int64_t inner, ch_bmem y,
                        ch_bmem x, ch_bmem bias)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    float *py = chcu_at<float>(y);
    const float *px = chcu_at<float>(x), *pb = chcu_at<float>(bias);
    if (inner == 1) {
        chcu_shape2 sh = chcu_rows(s->dev, outer, c);
        bias_add_kernel<true><<<sh.grid, sh.block, 0, s->s>>>(py, px, pb, outer, c, c);
    } else {
        chcu_shape2 sh = chcu_rows(s->dev, outer * c, inner);
        bias_add_kernel<false><<<sh.grid, sh.block, 0, s->s>>>(py, px, pb, outer * c, inner, c);
    }
    return chcu_launched("bias_add_kernel");
}
