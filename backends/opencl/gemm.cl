/* C[M,N] = alpha op(A) op(B) + beta C, row-major, with lda, ldb, ldc the row
 * strides of A, B, C as stored; the third dimension of the launch goes
 * through a batch of such products, each matrix `stride_*` elements after
 * the previous one. Our fallback where CLBlast is absent or refuses a
 * shape.
 *
 * program.c places this file in the program several times, each after a
 * GEMM_WG (and GEMM_NAME) of its own, so that a device with smaller
 * work-groups or less local memory than a CPU's or a GPU's still has a
 * kernel (gemm.c picks the largest that fits):
 * - GEMM_WG 16, 8, 4: a work-group of WG x WG work-items computes a TS x TS
 *   tile of C (TS = 4 WG), each work-item a 4 x 4 block strided by WG so
 *   that neighbouring work-items touch neighbouring columns. The K
 *   dimension goes by slices of 16 staged in local memory (2 x 16 x (TS + 1)
 *   floats: 8.3 KiB at WG 16, 4.2 at 8, 2.2 at 4); edges are padded with
 *   zeros, so any M, N, K works.
 * - GEMM_WG 0: gemm_simple, one work-item per element of C, no local
 *   memory, any work-group.
 * Every one sums the products in the same order, increasing p from 0
 * (the tiles' zero padding adds only zeros after them). CHCL_GEMM_WPT in
 * opencl.h is WPT here. */

/* Products summed with fused multiply-adds where the device has them, as
 * BLAS libraries do. */
#pragma OPENCL FP_CONTRACT ON

#if GEMM_WG > 0

#define WG GEMM_WG
#define WPT 4
#define TS (WG * WPT)
#define TK 16
#define LOADS (TS * TK / (WG * WG))

__kernel __attribute__((reqd_work_group_size(WG, WG, 1)))
void GEMM_NAME(__global float *c, ulong co, int ldc, __global const float *a, ulong ao,
               int lda, __global const float *b, ulong bo, int ldb, int m, int n, int k,
               int trans_a, int trans_b, float alpha, float beta, ulong stride_a,
               ulong stride_b, ulong stride_c)
{
    /* One column of padding: the staging stores of a non-transposed A (or a
     * transposed B) walk down a column, which would hit one bank 16 times. */
    __local float as[TK][TS + 1];
    __local float bs[TK][TS + 1];
    int tx = get_local_id(0), ty = get_local_id(1);
    int tid = ty * WG + tx;
    int i0 = get_group_id(1) * TS, j0 = get_group_id(0) * TS;
    float acc[WPT][WPT];
    for (int r = 0; r < WPT; r++)
        for (int q = 0; q < WPT; q++)
            acc[r][q] = 0.0f;
    ulong batch = get_global_id(2);
    a += ao + batch * stride_a;
    b += bo + batch * stride_b;
    c += co + batch * stride_c;

    for (int p0 = 0; p0 < k; p0 += TK) {
        /* Each work-item stages LOADS elements of each tile; the split of the
         * element number follows the stored layout so reads are coalesced. */
        for (int l = 0; l < LOADS; l++) {
            int e = tid + l * WG * WG;
            int ii = trans_a ? e % TS : e / TK;
            int pa = trans_a ? e / TS : e % TK;
            int i = i0 + ii, p = p0 + pa;
            float va = 0.0f;
            if (i < m && p < k)
                va = trans_a ? a[p * lda + i] : a[i * lda + p];
            as[pa][ii] = va;

            int jj = trans_b ? e / TK : e % TS;
            int pb = trans_b ? e % TK : e / TS;
            int j = j0 + jj;
            p = p0 + pb;
            float vb = 0.0f;
            if (j < n && p < k)
                vb = trans_b ? b[j * ldb + p] : b[p * ldb + j];
            bs[pb][jj] = vb;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int p = 0; p < TK; p++) {
            float ar[WPT], br[WPT];
            for (int r = 0; r < WPT; r++)
                ar[r] = as[p][ty + r * WG];
            for (int q = 0; q < WPT; q++)
                br[q] = bs[p][tx + q * WG];
            for (int r = 0; r < WPT; r++)
                for (int q = 0; q < WPT; q++)
                    acc[r][q] += ar[r] * br[q];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

    for (int r = 0; r < WPT; r++) {
        int i = i0 + ty + r * WG;
        for (int q = 0; q < WPT; q++) {
            int j = j0 + tx + q * WG;
            if (i >= m || j >= n)
                continue;
            /* beta 0: C is not read (it may hold NaN), as in BLAS. */
            float v = alpha * acc[r][q];
            if (beta != 0.0f)
                v += beta * c[i * ldc + j];
            c[i * ldc + j] = v;
        }
    }
}

#undef WG
#undef WPT
#undef TS
#undef TK
#undef LOADS

#else

/* Work-item (j, i, batch) computes C[i, j] of its matrix. */
__kernel void gemm_simple(__global float *c, ulong co, int ldc, __global const float *a,
                          ulong ao, int lda, __global const float *b, ulong bo, int ldb, int m,
                          int n, int k, int trans_a, int trans_b, float alpha, float beta,
                          ulong stride_a, ulong stride_b, ulong stride_c)
{
    int j = get_global_id(0), i = get_global_id(1);
    if (i >= m || j >= n)
        return;
    ulong batch = get_global_id(2);
    a += ao + batch * stride_a;
    b += bo + batch * stride_b;
    c += co + batch * stride_c;
    float acc = 0.0f;
    for (int p = 0; p < k; p++)
        acc += (trans_a ? a[p * lda + i] : a[i * lda + p]) *
               (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
    float v = alpha * acc;
    if (beta != 0.0f)
        v += beta * c[i * ldc + j];
    c[i * ldc + j] = v;
}

#endif

#undef GEMM_WG
#undef GEMM_NAME
