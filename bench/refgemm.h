/* The GEMM library the host backend was built with, called directly: the
 * reference the benchmarks measure the host's GEMM (bench-ops) and a
 * training step's GEMM share (bench-train) against. oneDNN's dnnl_sgemm
 * when the build has oneDNN, else OpenBLAS's cblas_sgemm; HAVE_REF_GEMM is
 * not defined when the host GEMM is the blocked C one. */
#ifndef CHORUS_BENCH_REFGEMM_H
#define CHORUS_BENCH_REFGEMM_H

#include "config.h"

#if defined(HAVE_ONEDNN)
#include <dnnl.h>
#define HAVE_REF_GEMM 1
#define REF_GEMM_NAME "dnnl_sgemm (oneDNN)"
#define REF_GEMM_LIB "oneDNN"
#elif defined(HAVE_BLAS)
#include <cblas.h>
#define HAVE_REF_GEMM 1
#define REF_GEMM_NAME "cblas_sgemm (OpenBLAS)"
#define REF_GEMM_LIB "OpenBLAS"
#else
/* No library: the rows and ratios that name one are left out. */
#define REF_GEMM_NAME "no GEMM library"
#define REF_GEMM_LIB "no library"
#endif

#ifdef HAVE_REF_GEMM
/* Row-major C[m,n] = alpha op(A) op(B) + beta C. */
static inline void ref_sgemm(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                             int lda, const float *b, int ldb, float beta, float *c, int ldc)
{
#if defined(HAVE_ONEDNN)
    if (dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c,
                   ldc) != dnnl_success) {
        fprintf(stderr, "dnnl_sgemm failed\n");
        exit(1);
    }
#else
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}
#endif

#if defined(HAVE_ONEDNN)
#define HAVE_REF_GEMM_HALF 1
/* A half-precision GEMM at the library's speed (oneDNN's matmul, as the
 * host's gemm_half runs it): row-major C[m,n] (f32) = op(A) op(B) (+ C)
 * with A and B in bf16 or f16, count matrices of each back to back. The
 * primitive and its memory are made once (ref_matmul_make, 0 when oneDNN
 * does not take the shape) and run many times (ref_matmul_run). */
typedef struct ref_matmul {
    dnnl_primitive_t prim;
    dnnl_memory_t mem[3];
} ref_matmul;

static inline int ref_matmul_make(ref_matmul *r, dnnl_engine_t eng, int f16, int ta, int tb,
                                  int count, int m, int n, int k, int accumulate, void *a, void *b,
                                  float *c)
{
    dnnl_data_type_t in = f16 ? dnnl_f16 : dnnl_bf16;
    dnnl_dims_t da = {count, m, k}, db = {count, k, n}, dc = {count, m, n};
    dnnl_dims_t sa = {(dnnl_dim_t)m * k, ta ? 1 : k, ta ? m : 1},
                sb = {(dnnl_dim_t)k * n, tb ? 1 : n, tb ? k : 1}, sc = {(dnnl_dim_t)m * n, n, 1};
    dnnl_memory_desc_t md[3];
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    r->prim = NULL;
    for (int i = 0; i < 3; i++)
        r->mem[i] = NULL;
    /* one product 2-D, as the library's gemm_half makes it: oneDNN 2.6 runs
     * x W^T as a 3-D matmul of one matrix at half the speed */
    int nd = count > 1 ? 3 : 2, o = 3 - nd;
    int ok =
        dnnl_memory_desc_init_by_strides(&md[0], nd, da + o, in, sa + o) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&md[1], nd, db + o, in, sb + o) == dnnl_success &&
        dnnl_memory_desc_init_by_strides(&md[2], nd, dc + o, dnnl_f32, sc + o) == dnnl_success &&
        dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok && accumulate)
        ok = dnnl_post_ops_create(&po) == dnnl_success &&
             dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_matmul_desc_init(&d, &md[0], &md[1], NULL, &md[2]) == dnnl_success &&
         dnnl_primitive_desc_create(&pd, &d, attr, eng, NULL) == dnnl_success &&
         dnnl_primitive_create(&r->prim, pd) == dnnl_success;
    void *ptr[3] = {a, b, c};
    for (int i = 0; i < 3 && ok; i++)
        ok = dnnl_memory_create(&r->mem[i], &md[i], eng, ptr[i]) == dnnl_success;
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    if (po)
        dnnl_post_ops_destroy(po);
    if (attr)
        dnnl_primitive_attr_destroy(attr);
    return ok;
}

static inline void ref_matmul_run(const ref_matmul *r, dnnl_stream_t st)
{
    dnnl_exec_arg_t args[3] = {
        {DNNL_ARG_SRC, r->mem[0]}, {DNNL_ARG_WEIGHTS, r->mem[1]}, {DNNL_ARG_DST, r->mem[2]}};
    if (dnnl_primitive_execute(r->prim, st, 3, args) != dnnl_success ||
        dnnl_stream_wait(st) != dnnl_success) {
        fprintf(stderr, "oneDNN's matmul failed\n");
        exit(1);
    }
}

static inline void ref_matmul_free(ref_matmul *r)
{
    for (int i = 0; i < 3; i++)
        if (r->mem[i])
            dnnl_memory_destroy(r->mem[i]);
    if (r->prim)
        dnnl_primitive_destroy(r->prim);
    r->prim = NULL;
}
#endif

#endif
