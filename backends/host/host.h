/* The host backend's private interface: what its source files share, and
 * the blocked C GEMM that tests and benchmarks call directly, through
 * tests/libchorus-internal (it is the fallback when OpenBLAS is absent, so
 * it must be tested even when the build uses OpenBLAS). */
#ifndef CHORUS_HOST_H
#define CHORUS_HOST_H

#include <stdatomic.h>
#include <stddef.h>
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

/* The fused attention's small products (tile_mm.c) on the calling thread:
 * c[m, n] = alpha sum over p < k of a(i, p) b[p, j] + beta c[i, j], with
 * a(i, p) = a[i * ars + p * acs] (a transposed A is a choice of strides),
 * B's rows ldb apart and C's ldc apart; beta == 0 does not read C. isa:
 * one of CHI_TILE_*; chi_host_tile_isa says which this CPU runs (AUTO:
 * the widest; NONE where it runs neither). chi_host_tile_mm returns 0,
 * doing nothing, for CHI_TILE_NONE: the caller multiplies otherwise. The
 * two builds give the same bits. */
enum {
    CHI_TILE_NONE,
    CHI_TILE_AUTO,
    CHI_TILE_AVX2,
    CHI_TILE_AVX512
};
int chi_host_tile_isa(int isa);
int chi_host_tile_mm(int isa, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                     int64_t ars, int64_t acs, const float *b, int64_t ldb, float beta, float *c,
                     int64_t ldc);
/* f32 to bf16 (bf16_round.c): the loop over n floats' bits, on the
 * calling thread, with VCVTNEPS2BF16 where this CPU has AVX512-BF16, the
 * same bits as chk_f32_to_bf16; NULL elsewhere (chi_host_f32_to_bf16
 * then runs its plain loop). */
typedef void chi_host_round_fn(uint16_t *y, const uint32_t *x, int64_t n);
chi_host_round_fn *chi_host_f32_to_bf16_fast(void);
/* The loop of f32_to_bf16 (half CH_BF16) or f32_to_f16 (CH_F16) on the
 * calling thread (elementwise.c): the same bits as the slots. */
chi_host_round_fn *chi_host_round_loop(int half);
/* dst[c * ldd + r] = src[r * lds + c] for r < rows, c < cols: a product's
 * B transposed for chi_host_tile_mm (AVX registers for CHI_TILE_AVX2 and
 * AVX512, element by element otherwise). */
void chi_host_tile_transpose(int isa, int64_t rows, int64_t cols, const float *src, int64_t lds,
                             float *dst, int64_t ldd);
/* The fused attention's tile products in bf16 on AMX (tile_amx.c).
 * chi_host_amx_bf16: whether this CPU and kernel run them (asked once).
 * A thread brackets its products with start (the tile configuration)
 * and stop. mm: c[m, n] = a b (+ c where add), m, n and k multiples of
 * 32, a bf16 [m, k] rows lda apart, b [k, n] bf16 in pairs of rows (pair
 * row p, ldb elements apart, holds b[2p][j], b[2p + 1][j] at 2j, 2j + 1),
 * c f32 rows ldc apart. The packers round x [rows, cols] (rows ldx
 * apart) to bf16, zeros out to rows_pad x cols_pad (even): rows into
 * y[r * ldy + c]; pairs into b's layout; pairs_t into b's layout of x
 * transposed; trans into y[c * ldy + r] (rows_pad a multiple of 32).
 * pairs_t uses tmp [rows_pad * cols_pad], trans twice that. */
int chi_host_amx_bf16(void);
void chi_host_amx_start(void);
void chi_host_amx_stop(void);
void chi_host_amx_mm(int64_t m, int64_t n, int64_t k, const uint16_t *a, int64_t lda,
                     const uint16_t *b, int64_t ldb, float *c, int64_t ldc, int add);
void chi_host_bf16_rows(int64_t rows, int64_t cols, const float *x, int64_t ldx, uint16_t *y,
                        int64_t ldy, int64_t rows_pad, int64_t cols_pad);
void chi_host_bf16_pairs(int64_t rows, int64_t cols, const float *x, int64_t ldx, uint16_t *y,
                         int64_t ldy, int64_t rows_pad, int64_t cols_pad);
void chi_host_bf16_pairs_t(int64_t rows, int64_t cols, const float *x, int64_t ldx, uint16_t *y,
                           int64_t ldy, int64_t rows_pad, int64_t cols_pad, uint16_t *tmp);
void chi_host_bf16_trans(int64_t rows, int64_t cols, const float *x, int64_t ldx, uint16_t *y,
                         int64_t ldy, int64_t rows_pad, int64_t cols_pad, uint16_t *tmp);
/* dst[c * ldd + r] = src[r * lds + c], 32-bit elements, in AVX-512 (a
 * CPU with AMX has it). */
void chi_host_transpose32(int64_t rows, int64_t cols, const void *src, int64_t lds, void *dst,
                          int64_t ldd);
#ifdef CHI_TEST_HOOKS
/* Tests only: chi_host_amx_bf16 answers 0 while on is 0. */
void chi_host_amx_prefer(int on);
#endif

#ifdef CHI_TEST_HOOKS
/* Tests only (the copy in tests/libchorus-internal): chi_host_tile_isa(AUTO)
 * answers chi_host_tile_isa(isa) from now on (AUTO again: the widest), so
 * that the fused attention runs in each instruction set the CPU has; and
 * the attention's row passes for `isa` on one tile row x[0..nk): the
 * largest of x[0..w), and exp(x - sub) for the first w then 0 (returning
 * the sum), in the same builds as the attention's. */
void chi_host_tile_prefer(int isa);
float chi_host_attention_row_max(int isa, const float *x, int64_t w);
float chi_host_attention_row_exp(int isa, float *x, int64_t w, int64_t nk, float sub);
/* Tests only: into how many parts by rows chi_host_gemm, called now,
 * would cut the product, one oneDNN call a thread (gemm.c's rule), or 0
 * where it leaves the product to oneDNN whole. */
int chi_host_gemm_row_parts(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k);
/* Tests only: on 0, the f32 fused attention takes tiles at every length:
 * the forward tiles of keys with a running maximum, the backward tiles of
 * queries for each tile of keys (1, the default: up to attention.c's
 * FA_ROWS_MAX, whole rows in the forward and a tile of keys against all
 * its queries in the backward). */
void chi_host_attention_whole_rows(int on);
#endif

/* scratch.c: an op's scratch memory, where an allocation per call would
 * cost time on the hot path. take: out->mem = at least `bytes`, 64-byte
 * aligned, from memory the stream keeps between calls (grown when asked
 * for more, freed with the stream; zeroed when allocated, then holding
 * what the op before left there); from an allocation of its own, zeroed,
 * where the stream's is in use by an op another thread runs on it, or
 * stream is NULL. give: hands it back (frees the allocation). */
typedef struct chi_host_stream {
    void *dev;     /* backend.c's host_dev */
    void *scratch; /* chi_host_scratch_take's */
    size_t scratch_bytes;
    atomic_int scratch_busy;
} chi_host_stream;
typedef struct chi_host_scratch {
    void *mem;
    void *stream; /* the stream whose memory it is; NULL: allocated */
} chi_host_scratch;
ch_status chi_host_scratch_take(void *stream, size_t bytes, chi_host_scratch *out);
void chi_host_scratch_give(chi_host_scratch *sc);

/* Below this many elements an op runs on one thread: starting the team
 * (and waking threads that went to sleep) costs more than it saves for a
 * memory-bound pass over fewer elements than this. */
#define CHI_HOST_PAR_MIN 131072

/* The same for the fused optimizer updates, which do more arithmetic per
 * element (Adam: a square root and two divisions). */
#define CHI_HOST_OPT_PAR_MIN 65536

/* A streaming pass asks for the line CHI_HOST_AHEAD bytes past its
 * position in each array it reads, once per 64-byte line it passes: with
 * several streams at once (Adam's four in, GELU's backward two, read cold
 * from memory) the hardware's prefetchers fall behind. 2 KiB: Adam's
 * best distance. The address is formed as an integer (the array may end
 * before it); a prefetch never faults. */
#define CHI_HOST_AHEAD 2048
static inline __attribute__((always_inline)) void chi_host_ahead(const void *p)
{
    __builtin_prefetch((const void *)((uintptr_t)p + CHI_HOST_AHEAD));
}

/* The address a ch_bmem names, typed. */
static inline float *chi_host_f32(ch_bmem m)
{
    return (float *)((char *)m.ptr + m.off);
}

static inline int32_t *chi_host_i32(ch_bmem m)
{
    return (int32_t *)((char *)m.ptr + m.off);
}

/* ---- op and collective slots ----
 * Each is chi_host_<slot> (the device, memory, stream and transfer slots
 * are backend.c's own statics), in the file of its family: gemm.c,
 * elementwise.c (with the f32 <-> bf16 and f16 conversions,
 * lib/kernels/half_bits.h), sum.c, softmax.c, conv.c (with max pooling;
 * the half convolution in dnnl_conv.c and gemm_half in dnnl_matmul.c,
 * built with oneDNN), norm.c, batched.c (gemm_batched and permute),
 * attention.c, embedding.c, optim.c, allreduce.c (its kernel,
 * chi_sum_spread, is the core's: backend.h). The slots the table leaves
 * NULL (span_*) are declared and not defined. */
#define CHI_HOST_DEVICE(ret, name, params)
#define CHI_HOST_MEMORY(ret, name, params)
#define CHI_HOST_STREAM(ret, name, params)
#define CHI_HOST_TRANSFER(ret, name, params)
#define CHI_HOST_OP(ret, name, params) CH_SLOT_PROTOTYPE(chi_host_, ret, name, params)
#define CHI_HOST_COLLECTIVE(ret, name, params) CH_SLOT_PROTOTYPE(chi_host_, ret, name, params)
#define CHI_HOST_SLOT(group, kind, ret, name, params) CHI_HOST_##group(ret, name, params)
CH_BACKEND_SLOTS(CHI_HOST_SLOT)

/* dnnl_conv.c (builds with oneDNN): the convolution through oneDNN's
 * primitives, its inputs in dt (CH_F32, CH_BF16 or CH_F16), its outputs
 * f32. The workspace query answers 0 for a shape oneDNN does not take;
 * the calls then return CH_ERR_UNSUPPORTED without a message, and conv.c's
 * im2col convolution does it (in half: the core's widened one). Its
 * conv2d_half slots, and dnnl_matmul.c's gemm_half: oneDNN's convolution
 * and matmul with bf16 or f16 inputs and f32 outputs and sums
 * (AVX512-BF16 / AMX where the CPU has them); CH_ERR_UNSUPPORTED with a message where oneDNN does
 * not take the format or the shape (the core then widens the inputs).
 * dnnl.c's shutdown frees the primitives, streams and engine of both. */
#ifdef HAVE_ONEDNN
int chi_host_dnnl_conv_workspace(const ch_conv_geom *g, int64_t out_channels, int dt,
                                 int backward, int want, size_t *bytes);
ch_status chi_host_dnnl_conv_forward(const ch_conv_geom *g, int64_t out_channels, int dt,
                                     float *y, const void *x, const void *w, void *ws,
                                     size_t ws_bytes);
ch_status chi_host_dnnl_conv_backward(const ch_conv_geom *g, int64_t out_channels, int dt,
                                      float *dx, float *dw, float beta, const void *dy,
                                      const void *x, const void *w, void *ws, size_t ws_bytes);
void chi_host_dnnl_shutdown(void);
#endif

#ifdef __cplusplus
}
#endif

#endif
