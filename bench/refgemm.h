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

#endif
