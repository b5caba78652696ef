/* Chorus: primitive tensor ops.
 *
 * Outputs come first, then inputs. All tensors of one call must live on the
 * same device (ch_copy excepted); the op runs on that device's current stream
 * and returns once it is queued (the softmax losses excepted, see there).
 * Arguments are checked before anything runs:
 * a bad shape, dtype or device is a status and a message, never a crash.
 * Unless said otherwise, tensors are f32 and an output may not overlap an
 * input except where noted ("in place allowed"). */
#ifndef CHORUS_OPS_H
#define CHORUS_OPS_H

#include <stdint.h>
#include <chorus/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Data movement ------------------------------------------------------ */

/* Set every element (f32 or i32) to `value`. */
CH_API ch_status ch_fill(ch_tensor *y, double value);

/* y = x, same dtype and element count; any two devices. Between devices it
 * goes peer to peer where the backends allow it, through pinned host memory
 * otherwise. The copy comes after what both devices' current streams hold,
 * and what is queued on x's stream afterwards (a write to x, its free and
 * reuse) waits for it. */
CH_API ch_status ch_copy(ch_tensor *y, const ch_tensor *x);

/* x of shape [A, B, rest...] -> y of shape [B, A, rest...]. */
CH_API ch_status ch_transpose01(ch_tensor *y, const ch_tensor *x);

/* ---- Linear algebra ----------------------------------------------------- */

/* c = alpha * op(a) @ op(b) + beta * c, all 2-D, op(x) = x or x^T.
 * c is [M, N], op(a) is [M, K], op(b) is [K, N]. a and b are both f32,
 * both bf16 or both f16; c is f32 or a's dtype. With half inputs the
 * products are summed in f32 (cuBLAS's GemmEx with tensor cores on CUDA;
 * elsewhere a and b are widened to f32 on the device first) and a half c
 * gets the result rounded once, to nearest even. */
CH_API ch_status ch_gemm(ch_tensor *c, int trans_a, int trans_b, float alpha,
                         const ch_tensor *a, const ch_tensor *b, float beta);
/* c = alpha * op(a) @ op(b) + bias, bias f32 [N] added to every row of c
 * (a linear layer's forward), c f32 or a's dtype as for ch_gemm: ch_gemm
 * with beta 0 then ch_bias_add on axis 1, the same values; in one pass
 * where the backend fuses them (the host's oneDNN matmul with half inputs
 * and an f32 c; CUDA's cuBLASLt bias epilogue with half inputs and an f32
 * or half c). A half c gets the product plus the bias rounded to its
 * format once, fused or not (apart, the product is summed into an f32
 * buffer of the device first). bias may not overlap c. */
CH_API ch_status ch_gemm_bias(ch_tensor *c, int trans_a, int trans_b, float alpha,
                              const ch_tensor *a, const ch_tensor *b, const ch_tensor *bias);

/* How f32 products may be computed, for the whole process (every device,
 * every thread), from the next GEMM on: CH_MATH_DEFAULT (0) keeps f32
 * GEMMs in f32; CH_MATH_TF32 lets CUDA's f32 GEMMs (ch_gemm,
 * ch_gemm_batched, the convolutions' products) round their inputs to
 * TF32 (10-bit mantissa) on tensor cores and sum in f32, as PyTorch's
 * torch.backends.cuda.matmul.allow_tf32 does. Off by default, as in
 * PyTorch. Other backends compute in f32 either way. The environment
 * variable CHORUS_TF32=1 sets it at ch_init. Unknown bits:
 * CH_ERR_INVALID_ARGUMENT, the mode unchanged. */
#define CH_MATH_DEFAULT 0u
#define CH_MATH_TF32 1u
CH_API ch_status ch_math_set(unsigned flags);
CH_API unsigned ch_math_get(void);

/* ---- Half storage ---------------------------------------------------------
 * The elementwise ops, activations, bias, ch_sum and ch_mean, softmax,
 * LayerNorm and BatchNorm (with ch_channel_sums) take any of their float
 * tensors in CH_BF16 or CH_F16 as well as CH_F32, mixed freely: they
 * compute in f32 on the values the half tensors hold (exact in f32) and
 * round each half output once, to nearest even. Where a backend has no
 * half kernels of its own, the core runs the f32 op on f32 copies made on
 * the same device (ch_cast), so every backend takes them. The
 * convolution takes half inputs with an f32 output (below). The optimizer
 * steps, the losses, the embedding and pooling stay f32 (master weights
 * and their state are f32 by design). */

/* ---- Elementwise (same element count; in place allowed) ------------------ */

CH_API ch_status ch_add(ch_tensor *y, const ch_tensor *a, const ch_tensor *b);
CH_API ch_status ch_sub(ch_tensor *y, const ch_tensor *a, const ch_tensor *b);
CH_API ch_status ch_mul(ch_tensor *y, const ch_tensor *a, const ch_tensor *b);
/* y = alpha * x */
CH_API ch_status ch_scale(ch_tensor *y, const ch_tensor *x, float alpha);
/* y += alpha * x */
CH_API ch_status ch_axpy(ch_tensor *y, float alpha, const ch_tensor *x);

typedef enum ch_activation {
    CH_ACT_RELU = 0,
    CH_ACT_GELU = 1,   /* exact: x Phi(x) = x erfc(-x / sqrt 2) / 2 */
    CH_ACT_TANH = 2,
    CH_ACT_SIGMOID = 3,
    /* GELU's tanh approximation, GPT-2's (Hugging Face's "gelu_new"):
     * x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) / 2 */
    CH_ACT_GELU_TANH = 4,
    CH_ACT_COUNT       /* not an activation: how many there are */
} ch_activation;

/* y = act(x); an act outside [0, CH_ACT_COUNT) is CH_ERR_INVALID_ARGUMENT. */
CH_API ch_status ch_activation_forward(ch_tensor *y, const ch_tensor *x,
                                       ch_activation act);
/* dx = dy * act'(x). `x` is the forward input and `y` its output; relu,
 * gelu and gelu_tanh read x, tanh and sigmoid read y (the other may be
 * NULL). */
CH_API ch_status ch_activation_backward(ch_tensor *dx, const ch_tensor *dy,
                                        const ch_tensor *x, const ch_tensor *y,
                                        ch_activation act);

/* c = act(alpha * op(a) @ op(b) + bias): ch_gemm_bias's product and bias
 * (its shapes and dtypes: c f32 or a's dtype, bias f32 [N]) and the
 * activation, a linear layer and its activation's forward. pre, when not
 * NULL, receives alpha * op(a) @ op(b) + bias (what the activation's
 * backward reads as x), same shape and dtype as c. Neither c nor pre may
 * overlap anything else. The same values as ch_gemm_bias into pre (or c)
 * then ch_activation_forward into c, which is how it runs where the
 * backend has no fused pass: CUDA fuses CH_ACT_GELU_TANH with half inputs
 * (cuBLASLt's GELU epilogue, which rounds the sum into a half c or pre
 * once and computes c from the unrounded sum; its GELU is the tanh
 * approximation, never used for CH_ACT_GELU). */
CH_API ch_status ch_gemm_bias_act(ch_tensor *c, ch_tensor *pre, int trans_a, int trans_b,
                                  float alpha, const ch_tensor *a, const ch_tensor *b,
                                  const ch_tensor *bias, ch_activation act);

/* ---- Bias --------------------------------------------------------------- */

/* y = x + bias broadcast along dimension `axis` of x: bias has x's size on
 * that axis (axis 1 of [N, F] for a linear layer, of [N, C, H, W] for a
 * convolution). In place allowed. */
CH_API ch_status ch_bias_add(ch_tensor *y, const ch_tensor *x,
                             const ch_tensor *bias, int axis);
/* db = beta * db + (dy summed over every dimension but `axis`). */
CH_API ch_status ch_bias_grad(ch_tensor *db, const ch_tensor *dy, int axis,
                              float beta);

/* ---- Loss --------------------------------------------------------------- */

/* probs = softmax(logits) by row; loss (one element) = mean over the N rows
 * of -log probs[i, labels[i]]. logits [N, C] f32, labels [N] i32 in [0, C).
 *
 * Labels live on the device, so only the kernel sees them: a label outside
 * [0, C) is CH_ERR_INVALID_ARGUMENT on every backend, the message naming
 * the op, the first such row and its label, and the outputs are then
 * unspecified. Where it comes from differs:
 *   - host: from the call, which runs synchronously.
 *   - CUDA and OpenCL: the call does not wait. The check is read at the
 *     next wait on the stream the op ran on: a blocking download
 *     (ch_tensor_download, reading the loss), a blocking upload,
 *     ch_stream_sync or ch_device_sync, which returns the error instead of
 *     CH_OK, once. (After 32 checks with no wait between them, the 33rd
 *     checked op waits on its own, and returns the error if one was found.)
 * A training step reads its loss anyway, so it waits once a step, not once
 * per check. */
CH_API ch_status ch_softmax_xent(ch_tensor *loss, ch_tensor *probs,
                                 const ch_tensor *logits, const ch_tensor *labels);
/* dlogits = scale * (probs - onehot(labels)) / N: the gradient of
 * scale * mean loss. */
CH_API ch_status ch_softmax_xent_backward(ch_tensor *dlogits, const ch_tensor *probs,
                                          const ch_tensor *labels, float scale);

/* Both of the above in one pass over each row, in place, without the
 * probabilities: loss [1] (f32) = the mean over rows of -log
 * softmax(logits)[label], and logits [N, C] overwritten by the gradient of
 * scale * mean loss, scale * (softmax(logits) - onehot(labels)) / N, in
 * logits' own dtype: f32, bf16 or f16 (the half formats read widened to
 * f32, the gradient rounded once). The softmax and the loss are computed
 * in f32 or better whatever the format. For a training step whose logits
 * are not needed after the loss: one [N, C] tensor where the two ops above
 * keep three (logits, probs, dlogits). Labels are checked, and reported,
 * as ch_softmax_xent's; a bad label leaves logits unspecified. */
CH_API ch_status ch_softmax_xent_fused(ch_tensor *loss, ch_tensor *logits, const ch_tensor *labels,
                                       float scale);

/* ---- Convolution and pooling -------------------------------------------- */

typedef struct ch_window2d {
    int kh, kw; /* window */
    int sh, sw; /* stride, >= 1 */
    int ph, pw; /* zero padding on each side */
} ch_window2d;

/* x [N, C, H, W] -> col [C*kh*kw, N*OH*OW], OH = (H + 2ph - kh) / sh + 1:
 * a convolution is then one GEMM W[O, C*kh*kw] @ col and a ch_transpose01. */
CH_API ch_status ch_im2col(ch_tensor *col, const ch_tensor *x, const ch_window2d *w);
/* The adjoint: dx [N, C, H, W] = sum of col's entries at the positions
 * they were taken from (dx is overwritten). */
CH_API ch_status ch_col2im(ch_tensor *dx, const ch_tensor *col, const ch_window2d *w);

/* A 2-D convolution without bias, as PyTorch's conv2d: y [N, O, OH, OW]
 * from x [N, C, H, W] and w [O, C, kh, kw] (kh, kw as the window's). A
 * backend with a convolution of its own runs it (the host: oneDNN's, or
 * one sample at a time per thread, in its cache); the others run
 * ch_im2col, ch_gemm and ch_transpose01 on scratch from the device's
 * allocator. x and w may be CH_BF16 or CH_F16 (both alike; y stays f32):
 * the products are summed in f32, by the backend's half convolution where
 * it has one (the host with oneDNN: bf16 on AVX512-BF16/AMX), elsewhere on
 * f32 copies of the inputs made on the device. */
CH_API ch_status ch_conv2d(ch_tensor *y, const ch_tensor *x, const ch_tensor *w,
                           const ch_window2d *win);
/* Its gradients from dy [N, O, OH, OW]: dx [N, C, H, W] = the input's
 * (overwritten; NULL: not wanted), dw [O, C, kh, kw] = beta * dw + the
 * weight's (NULL: not wanted; beta 0 does not read dw). One of them must be
 * asked for. x and w are the forward's inputs. dy, x and w may be half
 * (all three alike) as in ch_conv2d; dx and dw stay f32. */
CH_API ch_status ch_conv2d_backward(ch_tensor *dx, ch_tensor *dw, const ch_tensor *dy,
                                    const ch_tensor *x, const ch_tensor *w,
                                    const ch_window2d *win, float beta);

/* y [N, C, OH, OW] = max over each window of x [N, C, H, W] (padding never
 * wins); idx (i32, y's shape) = the index within the H*W plane of the max. */
CH_API ch_status ch_maxpool2d(ch_tensor *y, ch_tensor *idx, const ch_tensor *x,
                              const ch_window2d *w);
/* dx [N, C, H, W] = dy routed back to the positions idx names (overwrites);
 * an index outside its own output's window is skipped. */
CH_API ch_status ch_maxpool2d_backward(ch_tensor *dx, const ch_tensor *dy,
                                       const ch_tensor *idx, const ch_window2d *w);

/* ---- Conversions --------------------------------------------------------- */

/* y = x in another floating-point format: f32 to bf16 or f16, and back.
 * Round to nearest, ties to even; infinities, signed zeros and subnormals
 * kept as IEEE 754 says; a NaN narrowed becomes a quiet NaN with its sign
 * and the top bits of its payload (f32 0x7fa00001 is bf16 0x7fe0 and f16
 * 0x7f00). Widening is exact, a NaN's bits included (a signalling one
 * stays signalling). The same bits on every backend. y and x: the same
 * number of elements, the same device, not overlapping. CH_ERR_DTYPE for
 * another pair of dtypes. */
CH_API ch_status ch_cast(ch_tensor *y, const ch_tensor *x);

/* ---- Reductions --------------------------------------------------------- */

/* Along dimension `axis` of x. y has x's shape without that axis, or with it
 * of size 1 (any shape of that element count is accepted).
 * argmax gives i32 indices: NaN wins, as in NumPy and PyTorch, so the index
 * of the first NaN along the axis where there is one, of the first maximum
 * otherwise (ties go to the lowest index). The same on every backend. */
CH_API ch_status ch_sum(ch_tensor *y, const ch_tensor *x, int axis);
CH_API ch_status ch_mean(ch_tensor *y, const ch_tensor *x, int axis);
CH_API ch_status ch_argmax(ch_tensor *y, const ch_tensor *x, int axis);

/* ---- Optimizer updates (one fused op per parameter) --------------------- */

typedef struct ch_sgd_params {
    float lr;
    float momentum;      /* 0 disables the momentum buffer */
    float dampening;
    float weight_decay;  /* L2: g += weight_decay * p */
    int nesterov;
} ch_sgd_params;

/* PyTorch's SGD: g' = g + wd*p; m = momentum*m + (1-dampening)*g' (m = g' on
 * the first step: pass first_step = 1); d = nesterov ? g' + momentum*m : m;
 * p -= lr*d. m may be NULL when momentum is 0. */
CH_API ch_status ch_sgd_step(ch_tensor *p, ch_tensor *m, const ch_tensor *g,
                             const ch_sgd_params *params, int first_step);

/* PyTorch's Adam/AdamW: m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (m / (1-b1^step)) / (sqrt(v / (1-b2^step)) + eps). */
typedef struct ch_adam_params {
    float lr, beta1, beta2, eps;
    float weight_decay;
    int decoupled;       /* 1: AdamW (p -= lr*wd*p); 0: Adam (g += wd*p) */
    int64_t step;        /* 1 on the first step: for bias correction */
} ch_adam_params;

CH_API ch_status ch_adam_step(ch_tensor *p, ch_tensor *m, ch_tensor *v,
                              const ch_tensor *g, const ch_adam_params *params);

/* ---- Batched GEMM and attention ------------------------------------------ */

/* For every b < B: c[b] = alpha * op(a[b]) @ op(b[b]) + beta * c[b]; a, b, c
 * are 3-D, [B, rows, cols] as stored, with ch_gemm's rules per batch
 * (cuBLAS strided-batched, CLBlast batched, one GEMM per batch on the
 * host). */
CH_API ch_status ch_gemm_batched(ch_tensor *c, int trans_a, int trans_b, float alpha,
                                 const ch_tensor *a, const ch_tensor *b, float beta);

/* y = x with its dimensions reordered: y's dimension i is x's dimension
 * perm[i] (perm holds 0 .. ndim-1 once each); f32 or i32. */
CH_API ch_status ch_permute(ch_tensor *y, const ch_tensor *x, const int *perm);

/* Softmax over the last dimension of x [..., T, S] (in place allowed).
 * causal: row i of every [T, S] matrix sees columns j <= i + (S - T) only,
 * the others get probability 0 (attention's causal mask; S >= T). */
CH_API ch_status ch_softmax(ch_tensor *y, const ch_tensor *x, int causal);
/* dx = y * (dy - sum over the row of dy * y), y the forward output (masked
 * entries of y are 0, so the mask needs no argument). In place (dx = dy)
 * allowed. */
CH_API ch_status ch_softmax_backward(ch_tensor *dx, const ch_tensor *dy, const ch_tensor *y);

/* Causal attention in one pass (FlashAttention's scheme): o =
 * softmax(scale q k^T, causal) v for q, k, v and o [B, T, hd] (B: batch
 * times heads), row i seeing keys j <= i. The probabilities are never
 * stored: lse [B, T] receives each row's log-sum-exp of its scaled
 * scores, from which ch_attention_backward rebuilds them. f32 only; o and
 * lse may not overlap the inputs. The host runs it tiled (64 queries by
 * 64 keys, the masked tiles skipped, each [B] matrix on one thread: the
 * same bits for any thread count); CUDA runs it tiled too (64 rows a
 * block, one thread a row, head sizes up to 256: the same bits on every
 * run); the OpenCL backend has no kernel for it and runs it on the host
 * (ch_fallback_get), so on OpenCL the GPT keeps ch_gemm_batched and
 * ch_softmax. */
CH_API ch_status ch_attention(ch_tensor *o, ch_tensor *lse, const ch_tensor *q, const ch_tensor *k,
                              const ch_tensor *v, float scale);
/* Its gradients: dq, dk and dv (written, not added to) from dout, the
 * forward's inputs, its o and lse, and the same scale. */
CH_API ch_status ch_attention_backward(ch_tensor *dq, ch_tensor *dk, ch_tensor *dv,
                                       const ch_tensor *dout, const ch_tensor *q,
                                       const ch_tensor *k, const ch_tensor *v, const ch_tensor *o,
                                       const ch_tensor *lse, float scale);

/* The same on the layout one projection to q, k and v writes, heads apart
 * without a permute: qkv [B, T, 3 D] holds each token's q, then k, then
 * v, each `heads` heads of hd = D / heads side by side; o [B, T, D] gets
 * the heads side by side (what the output projection reads) and lse [B,
 * heads, T]. The results are ch_attention's on the heads taken apart, bit
 * for bit on the host. The backward writes all of dqkv [B, T, 3 D]. */
CH_API ch_status ch_attention_packed(ch_tensor *o, ch_tensor *lse, const ch_tensor *qkv, int heads,
                                     float scale);
CH_API ch_status ch_attention_packed_backward(ch_tensor *dqkv, const ch_tensor *dout,
                                              const ch_tensor *qkv, const ch_tensor *o,
                                              const ch_tensor *lse, int heads, float scale);
/* The same in mixed precision: with half CH_BF16, on a host whose CPU
 * has AMX (Sapphire Rapids and later) and a head size that is a multiple
 * of 32, the tile products take q, k, v (and dout), the probabilities
 * and dS rounded to bf16 and sum in f32 (autocast's rounding; the
 * softmax's statistics, o, lse and the gradients stay f32). Elsewhere,
 * with CH_F16, and with CH_F32, exactly ch_attention_packed's results.
 * The backward takes the forward's half. Another dtype is CH_ERR_DTYPE.
 * (ch_module_set_precision's GPT passes its precision.) */
CH_API ch_status ch_attention_packed_mixed(ch_tensor *o, ch_tensor *lse, const ch_tensor *qkv,
                                           int heads, float scale, ch_dtype half);
CH_API ch_status ch_attention_packed_mixed_backward(ch_tensor *dqkv, const ch_tensor *dout,
                                                    const ch_tensor *qkv, const ch_tensor *o,
                                                    const ch_tensor *lse, int heads, float scale,
                                                    ch_dtype half);

/* ---- Embedding ------------------------------------------------------------ */

/* y[i, :] = table[idx[i], :]: table [V, D] f32, idx i32 of N elements (any
 * shape), y of N * D elements. An index outside [0, V) is
 * CH_ERR_INVALID_ARGUMENT naming the first one, on every backend, and its
 * row of y is 0; the error comes as the softmax losses' does (from the
 * call on the host, at the stream's next wait on CUDA and OpenCL). */
CH_API ch_status ch_embedding(ch_tensor *y, const ch_tensor *table, const ch_tensor *idx);
/* dtable[v, :] += sum of dy[i, :] over the i with idx[i] == v, added in
 * increasing i: deterministic, no atomics (the same bits on every run).
 * Indices outside [0, V) contribute nothing. */
CH_API ch_status ch_embedding_backward(ch_tensor *dtable, const ch_tensor *dy,
                                       const ch_tensor *idx);

/* ---- Normalisation -------------------------------------------------------- */

/* LayerNorm over the last dimension D of x (rows = numel / D): y = (x -
 * mean) * rstd * gamma + beta, rstd = 1 / sqrt(var + eps), var the biased
 * variance of the row. mean and rstd [rows] are outputs kept for backward.
 * gamma and beta [D]. */
CH_API ch_status ch_layernorm(ch_tensor *y, ch_tensor *mean, ch_tensor *rstd,
                              const ch_tensor *x, const ch_tensor *gamma,
                              const ch_tensor *beta, float eps);
/* dx = the input gradient (may be NULL: not wanted); dgamma += sum over
 * rows of dy * xhat, dbeta += sum over rows of dy (accumulated, as
 * gradients are), xhat = (x - mean) * rstd. */
CH_API ch_status ch_layernorm_backward(ch_tensor *dx, ch_tensor *dgamma, ch_tensor *dbeta,
                                       const ch_tensor *dy, const ch_tensor *x,
                                       const ch_tensor *mean, const ch_tensor *rstd,
                                       const ch_tensor *gamma);
/* The residual stream's add and the next block's LayerNorm in one pass:
 * sum = a + b (as ch_add: in f32, rounded once into sum's dtype), then y,
 * mean and rstd = ch_layernorm of sum as stored (a bf16 sum normalised as
 * its bf16 values, as the two calls would), over sum's last dimension D.
 * The values of ch_add then ch_layernorm: to the bit on the host, within
 * a rounding of each f32 result where a device's kernel sums a row in
 * another order. a, b, sum and y: f32, bf16 or f16 each, of one element
 * count; mean and rstd [rows], gamma and beta [D]: f32. sum may be a or b
 * (the same tensor: in place, the residual stream updated); no other
 * output may overlap an argument. */
CH_API ch_status ch_add_layernorm(ch_tensor *sum, ch_tensor *y, ch_tensor *mean, ch_tensor *rstd,
                                  const ch_tensor *a, const ch_tensor *b, const ch_tensor *gamma,
                                  const ch_tensor *beta, float eps);
/* Its backward, where the residual's gradient joins: dx = dres + the
 * input gradient of ch_layernorm_backward from dy, added in f32 and
 * rounded once into dx's dtype (dres NULL: 0); dgamma and dbeta
 * accumulate as ch_layernorm_backward's. x is the forward's sum, mean and
 * rstd its outputs. The values of ch_layernorm_backward into an f32
 * tensor, then ch_add into dx (to the bit on the host, as above
 * elsewhere). dx, dy, dres and x: f32, bf16 or f16 each; the rest f32.
 * dres may be dx (in place: the residual gradient accumulated); no other
 * output may overlap an argument. */
CH_API ch_status ch_layernorm_backward_add(ch_tensor *dx, ch_tensor *dgamma, ch_tensor *dbeta,
                                           const ch_tensor *dy, const ch_tensor *dres,
                                           const ch_tensor *x, const ch_tensor *mean,
                                           const ch_tensor *rstd, const ch_tensor *gamma);

/* BatchNorm over the channels (dimension 1) of x [N, C, ...], in steps, so
 * that data parallelism can all-reduce the per-channel sums between them
 * (synchronised batch statistics), and with the variance taken around a
 * centre (a first estimate of the mean) so that it survives channels whose
 * mean is large beside their spread:
 *   forward:  ch_channel_sums(s0, x, NULL, x, NULL); [all-reduce s0];
 *             ch_batchnorm_stats(m0, ..., s0, NULL) (a first mean m0);
 *             ch_channel_sums(s, x, m0, x, m0); [all-reduce s];
 *             ch_batchnorm_stats(mean, rstd, running..., s, m0); ch_batchnorm_forward
 *   backward: ch_channel_sums(g, dy, NULL, x, mean); [g_all = all-reduce g];
 *             ch_batchnorm_backward(..., g, g_all)
 * sums [2C + 1]: with a' = a - a_center[c] and b' = b - b_center[c] (a
 * NULL centre: 0), sums[c] = the sum over n and the positions of a',
 * sums[C + c] = the sum of a' * b', sums[2C] = how many elements each
 * channel has (N times the positions), as f32 (exact up to 2^24): the
 * sums of several replicas add up. a and b have the same shape. */
CH_API ch_status ch_channel_sums(ch_tensor *sums, const ch_tensor *a, const ch_tensor *a_center,
                                 const ch_tensor *b, const ch_tensor *b_center);
/* mean and rstd [C] from sums of (x - center, x - center) (center NULL: 0):
 * M = s[2C], d = s[c] / M, mean = center + d, var = s[C + c] / M - d^2
 * (biased, at least 0), rstd = 1 / sqrt(var + eps), eps >= 0. When
 * running_mean and running_var are given (both or neither) they move
 * towards the batch's as PyTorch's do: r = (1 - momentum) r + momentum
 * stat, 0 <= momentum <= 1, with the unbiased variance var * M / (M - 1)
 * (M = 1, where PyTorch's would be 0 / 0: the biased one, 0).
 * sums NULL (evaluation): mean = running_mean, rstd from running_var; rstd
 * may then be computed once for many forwards. */
CH_API ch_status ch_batchnorm_stats(ch_tensor *mean, ch_tensor *rstd,
                                    ch_tensor *running_mean, ch_tensor *running_var,
                                    const ch_tensor *sums, const ch_tensor *center,
                                    float momentum, float eps);
/* y = (x - mean[c]) * rstd[c] * gamma[c] + beta[c] (in place allowed). */
CH_API ch_status ch_batchnorm_forward(ch_tensor *y, const ch_tensor *x, const ch_tensor *mean,
                                      const ch_tensor *rstd, const ch_tensor *gamma,
                                      const ch_tensor *beta);
/* The training-mode backward. `local` = ch_channel_sums(local, dy, NULL, x,
 * mean) of this replica, `total` = their sum over the replicas (or `local`
 * itself alone): dgamma += rstd local[C + c], dbeta += local[c] (this
 * replica's share, as every gradient is), and dx (may be NULL) =
 * gamma rstd (dy - total[c] / M - (x - mean) rstd^2 total[C + c] / M),
 * M = total[2C]. */
CH_API ch_status ch_batchnorm_backward(ch_tensor *dx, ch_tensor *dgamma, ch_tensor *dbeta,
                                       const ch_tensor *dy, const ch_tensor *x,
                                       const ch_tensor *mean, const ch_tensor *rstd,
                                       const ch_tensor *gamma, const ch_tensor *local,
                                       const ch_tensor *total);

/* ---- Average pooling ------------------------------------------------------- */

/* Global average pooling (AdaptiveAvgPool2d(1)): y [N, C] (or
 * [N, C, 1, 1], PyTorch's shape) = the mean of each [H, W] plane of
 * x [N, C, H, W]; the backward spreads dy / (H W) over the plane
 * (overwriting dx). Built from ch_mean, ch_fill, ch_bias_add and ch_scale:
 * no slot of its own. */
CH_API ch_status ch_avgpool_global(ch_tensor *y, const ch_tensor *x);
CH_API ch_status ch_avgpool_global_backward(ch_tensor *dx, const ch_tensor *dy);

/* ---- Random numbers ------------------------------------------------------
 * Philox-4x32-10: element i of y takes the counter (offset + i) split into
 * its low and high 32 bits as (c0, c1, 0, 0), the key (seed low, seed high),
 * so a slice of a tensor can be drawn on its own. u = (word0 >> 8) * 2^-24.
 *
 * Across backends, for the same (seed, offset) and arguments:
 * ch_rand_uniform and ch_dropout_mask give the same bits on every backend.
 * ch_rand_normal gives the same u1 and u2, but z goes through each device's
 * own sqrt, log and cos (which may differ from the host's by a few ulps), so
 * each value is within 2^-16 (|mean| + std) of the host backend's: about
 * 1.5e-5 for a standard normal, where OpenCL's and CUDA's error bounds
 * allow 1.1e-5. */

/* Philox-4x32-10 itself, for host code that must draw from the same
 * generator as the ops (a shuffle, a sampler): the four words of `ctr` are
 * replaced by the generator's output for that counter under `key` (its low
 * and high 32 bits are the two key words). ch_rand_uniform's element i is
 * ch_philox4x32({i low, i high, 0, 0}, seed)[0] >> 8, times 2^-24. */
CH_API void ch_philox4x32(uint32_t ctr[4], uint64_t key);

/* y = lo + (hi - lo) * u, in [lo, hi). */
CH_API ch_status ch_rand_uniform(ch_tensor *y, uint64_t seed, uint64_t offset,
                                 float lo, float hi);
/* y = mean + std * z, z = sqrt(-2 ln u1) cos(2 pi u2) with
 * u1 = ((word0 >> 8) + 1) * 2^-24 (never 0) and u2 = (word1 >> 8) * 2^-24. */
CH_API ch_status ch_rand_normal(ch_tensor *y, uint64_t seed, uint64_t offset,
                                float mean, float std);
/* y = u >= p ? 1 / (1 - p) : 0 (inverted dropout mask), 0 <= p < 1. */
CH_API ch_status ch_dropout_mask(ch_tensor *y, uint64_t seed, uint64_t offset, float p);

#ifdef __cplusplus
}
#endif

#endif
