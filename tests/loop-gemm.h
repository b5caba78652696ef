/* The GEMM of the test backend modules (tests/minimal-module.c,
 * tests/flaky-module.c): row-major C = alpha op(A) op(B) + beta C on host
 * memory, each product summed in float from k = 0 up; beta 0 does not
 * read C. */
#ifndef CHORUS_TESTS_LOOP_GEMM_H
#define CHORUS_TESTS_LOOP_GEMM_H

#include <stdint.h>

static inline void loop_gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                             const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                             float *C, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < k; p++)
                acc += (trans_a ? A[p * lda + i] : A[i * lda + p]) *
                       (trans_b ? B[j * ldb + p] : B[p * ldb + j]);
            float *cij = &C[i * ldc + j];
            *cij = beta == 0.0f ? alpha * acc : alpha * acc + beta * *cij;
        }
}

#endif
