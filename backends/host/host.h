/* The host backend's private interface: what its source files share, and
 * the blocked C GEMM that tests and benchmarks call directly, through
 * tests/libchorus-internal (it is the fallback when OpenBLAS is absent, so
 * it must be tested even when the build uses OpenBLAS). */
#ifndef CHORUS_HOST_H
#define CHORUS_HOST_H

#include <stdint.h>
#include "backend.h"
#include "bf16_sum.h" /* CHI_CLONES */
#include "omp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Row-major C[M,N] = alpha op(A) op(B) + beta C with op(A) [M,K] and
 * op(B) [K,N]; lda/ldb/ldc are the row strides as stored. beta == 0 does
 * not read C, alpha == 0 does not read A or B (as BLAS does).
 * CH_ERR_OUT_OF_MEMORY when the packing buffers cannot be allocated. */
ch_status chi_host_sgemm_blocked(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                 float alpha, const float *a, int64_t lda, const float *b,
                                 int64_t ldb, float beta, float *c, int64_t ldc);

/* The same product on the calling thread alone when called inside a
 * parallel region, for work it has already shared out (the convolution's
 * per-sample GEMMs, attention's small matrices). */
ch_status chi_host_gemm_serial(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                               float alpha, const float *a, int64_t lda, const float *b,
                               int64_t ldb, float beta, float *c, int64_t ldc);

/* Below this many elements an op runs on one thread: starting the team
 * (and waking threads that went to sleep) costs more than it saves for a
 * memory-bound pass over fewer elements than this. */
#define CHI_HOST_PAR_MIN 131072

/* The same for the fused optimizer updates, which do more arithmetic per
 * element (Adam: a square root and two divisions). */
#define CHI_HOST_OPT_PAR_MIN 65536

/* The address a ch_bmem names, typed. */
/* f32 <-> bf16 and f16 (lib/kernels/half_bits.h), elementwise.c. */
ch_status chi_host_f32_to_bf16(void *stream, int64_t n, ch_bmem y, ch_bmem x);
ch_status chi_host_bf16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x);
ch_status chi_host_f32_to_f16(void *stream, int64_t n, ch_bmem y, ch_bmem x);
ch_status chi_host_f16_to_f32(void *stream, int64_t n, ch_bmem y, ch_bmem x);

static inline float *chi_host_f32(ch_bmem m)
{
    return (float *)((char *)m.ptr + m.off);
}

static inline int32_t *chi_host_i32(ch_bmem m)
{
    return (int32_t *)((char *)m.ptr + m.off);
}

/* ---- op slots, one file per family ---- */

/* gemm.c */
ch_status chi_host_gemm(void *stream, int trans_a, int trans_b, int64_t m,
                        int64_t n, int64_t k, float alpha, ch_bmem a, int64_t lda,
                        ch_bmem b, int64_t ldb, float beta, ch_bmem c, int64_t ldc);

/* elementwise.c */
ch_status chi_host_fill(void *stream, ch_bmem y, int64_t n, uint32_t word);
ch_status chi_host_binary(void *stream, ch_binary_op op, int64_t n, ch_bmem y,
                          ch_bmem a, ch_bmem b);
ch_status chi_host_axpby(void *stream, int64_t n, ch_bmem y, float alpha, ch_bmem x,
                         float beta);
ch_status chi_host_act_forward(void *stream, ch_activation act, int64_t n, ch_bmem y,
                               ch_bmem x);
ch_status chi_host_act_backward(void *stream, ch_activation act, int64_t n,
                                ch_bmem dx, ch_bmem dy, ch_bmem x, ch_bmem y);
ch_status chi_host_bias_add(void *stream, int64_t outer, int64_t c, int64_t inner,
                            ch_bmem y, ch_bmem x, ch_bmem bias);
ch_status chi_host_transpose01(void *stream, int64_t a, int64_t b, int64_t inner,
                               ch_bmem y, ch_bmem x);
ch_status chi_host_rand(void *stream, ch_rand_kind kind, int64_t n, ch_bmem y,
                        uint64_t seed, uint64_t offset, float a, float b);

/* sum.c */
ch_status chi_host_bias_grad(void *stream, int64_t outer, int64_t c, int64_t inner,
                             ch_bmem db, ch_bmem dy, float beta);
ch_status chi_host_sum_axis(void *stream, ch_axis_op op, int64_t outer, int64_t n,
                            int64_t inner, ch_bmem y, ch_bmem x);
ch_status chi_host_argmax(void *stream, int64_t outer, int64_t n, int64_t inner,
                          ch_bmem y, ch_bmem x);

/* softmax.c */
ch_status chi_host_softmax_xent(void *stream, int64_t n, int64_t c, ch_bmem loss,
                                ch_bmem probs, ch_bmem logits, ch_bmem labels);
ch_status chi_host_softmax_xent_backward(void *stream, int64_t n, int64_t c,
                                         ch_bmem dlogits, ch_bmem probs,
                                         ch_bmem labels, float scale);

/* conv.c */
ch_status chi_host_im2col(void *stream, const ch_conv_geom *g, ch_bmem col,
                          ch_bmem x);
ch_status chi_host_col2im(void *stream, const ch_conv_geom *g, ch_bmem dx,
                          ch_bmem col);
ch_status chi_host_conv2d_workspace(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                    int backward, int want, size_t *bytes);
ch_status chi_host_conv2d_forward(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                  ch_bmem y, ch_bmem x, ch_bmem w, ch_bmem ws, size_t ws_bytes);
ch_status chi_host_conv2d_backward(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                   ch_bmem dx, ch_bmem dw, float beta, ch_bmem dy, ch_bmem x,
                                   ch_bmem w, ch_bmem ws, size_t ws_bytes);
/* dnnl.c (builds with oneDNN): the convolution through oneDNN's
 * primitives, its inputs in dt (CH_F32, CH_BF16 or CH_F16), its outputs
 * f32. The workspace query answers 0 for a shape oneDNN does not take;
 * the calls then return CH_ERR_UNSUPPORTED without a message, and conv.c's
 * im2col convolution does it (in half: the core's widened one). */
#ifdef HAVE_ONEDNN
int chi_host_dnnl_conv_workspace(const ch_conv_geom *g, int64_t out_channels, int dt,
                                 int backward, int want, size_t *bytes);
ch_status chi_host_dnnl_conv_forward(const ch_conv_geom *g, int64_t out_channels, int dt,
                                     float *y, const void *x, const void *w, void *ws,
                                     size_t ws_bytes);
ch_status chi_host_dnnl_conv_backward(const ch_conv_geom *g, int64_t out_channels, int dt,
                                      float *dx, float *dw, float beta, const void *dy,
                                      const void *x, const void *w, void *ws, size_t ws_bytes);
/* The conv2d_half slots: oneDNN's convolution with bf16 or f16 inputs and
 * f32 outputs and sums (AVX512-BF16 / AMX where the CPU has them);
 * CH_ERR_UNSUPPORTED with a message where oneDNN does not take the format
 * or the shape (the core then widens the inputs). */
ch_status chi_host_conv2d_half_workspace(void *stream, const ch_conv_geom *g,
                                         int64_t out_channels, int dt, int backward, int want,
                                         size_t *bytes);
ch_status chi_host_conv2d_half_forward(void *stream, const ch_conv_geom *g, int64_t out_channels,
                                       int dt, ch_bmem y, ch_bmem x, ch_bmem w, ch_bmem ws,
                                       size_t ws_bytes);
ch_status chi_host_conv2d_half_backward(void *stream, const ch_conv_geom *g,
                                        int64_t out_channels, int dt, ch_bmem dx, ch_bmem dw,
                                        float beta, ch_bmem dy, ch_bmem x, ch_bmem w,
                                        ch_bmem ws, size_t ws_bytes);
void chi_host_dnnl_shutdown(void);
/* The gemm_half slot: oneDNN's matmul with bf16 or f16 inputs and f32
 * sums (AVX512-BF16 / AMX where the CPU has them); CH_ERR_UNSUPPORTED with
 * a message for a combination oneDNN does not run here. */
ch_status chi_host_gemm_half(void *stream, int ab, int cd, int trans_a, int trans_b,
                             int64_t count, int64_t m, int64_t n, int64_t k, float alpha,
                             ch_bmem a, int64_t lda, int64_t stride_a, ch_bmem b, int64_t ldb,
                             int64_t stride_b, float beta, ch_bmem c, int64_t ldc,
                             int64_t stride_c);
#endif
ch_status chi_host_maxpool_forward(void *stream, const ch_conv_geom *g, ch_bmem y,
                                   ch_bmem idx, ch_bmem x);
ch_status chi_host_maxpool_backward(void *stream, const ch_conv_geom *g, ch_bmem dx,
                                    ch_bmem dy, ch_bmem idx);

/* norm.c */
ch_status chi_host_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_bmem y,
                             ch_bmem mean, ch_bmem rstd, ch_bmem x, ch_bmem gamma,
                             ch_bmem beta);
ch_status chi_host_layernorm_backward(void *stream, int64_t rows, int64_t d, ch_bmem dx,
                                      ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x,
                                      ch_bmem mean, ch_bmem rstd, ch_bmem gamma);
ch_status chi_host_channel_sums(void *stream, int64_t outer, int64_t c, int64_t inner,
                                ch_bmem sums, ch_bmem a, ch_bmem a_center, ch_bmem b,
                                ch_bmem b_center);
ch_status chi_host_batchnorm_stats(void *stream, int64_t c, float momentum, float eps,
                                   ch_bmem mean, ch_bmem rstd, ch_bmem running_mean,
                                   ch_bmem running_var, ch_bmem sums, ch_bmem center);
ch_status chi_host_batchnorm_forward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                     ch_bmem y, ch_bmem x, ch_bmem mean, ch_bmem rstd,
                                     ch_bmem gamma, ch_bmem beta);
ch_status chi_host_batchnorm_backward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                      ch_bmem dx, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy,
                                      ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma,
                                      ch_bmem local, ch_bmem total);

/* allreduce.c (the kernel, chi_sum_spread, is the core's: backend.h) */
ch_status chi_host_allreduce_sum(int count, void *const *streams, const ch_bmem *bufs,
                                 int64_t n);
int chi_host_can_allreduce(void *dev_a, void *dev_b);

/* attention.c */
ch_status chi_host_gemm_batched(void *stream, int trans_a, int trans_b, int64_t count,
                                int64_t m, int64_t n, int64_t k, float alpha, ch_bmem a,
                                int64_t lda, int64_t stride_a, ch_bmem b, int64_t ldb,
                                int64_t stride_b, float beta, ch_bmem c, int64_t ldc,
                                int64_t stride_c);
ch_status chi_host_permute(void *stream, int ndim, const int64_t *xshape, const int *perm,
                           ch_bmem y, ch_bmem x);
ch_status chi_host_softmax(void *stream, int64_t rows, int64_t s, int causal,
                           int64_t rows_per_matrix, ch_bmem y, ch_bmem x);
ch_status chi_host_softmax_backward(void *stream, int64_t rows, int64_t s, ch_bmem dx,
                                    ch_bmem dy, ch_bmem y);
ch_status chi_host_embedding(void *stream, int64_t n, int64_t v, int64_t d, ch_bmem y,
                             ch_bmem table, ch_bmem idx);
ch_status chi_host_embedding_backward(void *stream, int64_t n, int64_t v, int64_t d,
                                      ch_bmem dtable, ch_bmem dy, ch_bmem idx);

/* optim.c */
ch_status chi_host_sgd_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem g,
                            const ch_sgd_params *params, int first_step);
ch_status chi_host_adam_step(void *stream, int64_t n, ch_bmem p, ch_bmem m, ch_bmem v,
                             ch_bmem g, const ch_adam_params *params);

#ifdef __cplusplus
}
#endif

#endif
