/* Host GEMM: oneDNN's sgemm or OpenBLAS when the build has one, otherwise (and always for
 * chi_host_sgemm_blocked) a blocked, packed GEMM in plain C.
 *
 * The blocked GEMM follows the BLIS/GotoBLAS layering: op(B) is packed by
 * KC x NC panels (kept in the last-level cache), op(A) by row chunks of
 * KC-deep MR-row strips, and a 6x16 register-blocked micro-kernel multiplies
 * an MR-row strip of A by an NR-column strip of B (which stays in L1). The
 * micro-kernels use GCC vector extensions: an 8-wide one compiled for
 * AVX2 (no FMA instructions: contraction is off), chosen at run time on
 * x86-64 CPUs that have AVX2 and FMA (no -march assumed), and a 4-wide one
 * that compiles to SSE2, NEON or plain C everywhere else. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_ONEDNN
#include <dnnl.h>
#elif defined(HAVE_BLAS)
#include <cblas.h>
#include <limits.h>
#endif

#include "host.h"

#define MR 6
#define NR 16
#define KC 512
#define MC 96       /* rows of A per L2 block: a multiple of MR */
#define NC 4080     /* columns of B per packed panel: a multiple of NR */
#define MCHUNK 2304 /* rows of A packed at once: a multiple of MC */

/* Below this many multiply-adds one thread does the whole product. */
#define PAR_MIN_FLOPS (64 * 64 * 64)

typedef float v4f __attribute__((vector_size(16)));

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_AVX2_KERNEL 1
typedef float v8f __attribute__((vector_size(32)));
#endif

/* A micro-kernel: the MR x NR product of a packed A strip and a packed B
 * strip, kc deep, into tile. */
typedef void (*kernel_fn)(int64_t kc, const float *restrict ap,
                          const float *restrict bp, float tile[MR][NR]);

/* Everything one call shares between the threads of its team. */
typedef struct gemm_job {
    int trans_a, trans_b;
    int64_t m, n, k;
    float alpha, beta;
    const float *a, *b;
    int64_t lda, ldb, ldc;
    float *c;
    float *apack; /* MCHUNK x KC */
    float *bpack; /* KC x NC */
    kernel_fn kernel;
} gemm_job;

static int64_t min64(int64_t x, int64_t y)
{
    return x < y ? x : y;
}

static int64_t round_up(int64_t x, int64_t to)
{
    return (x + to - 1) / to * to;
}

/* Packing copies `total` source rows (row r at src + r*rs, its element p
 * at src + p*ps), kc deep, into strips of `width` rows stored depth-major
 * (strip s at dst + s*width*kc, element (r, p) at p*width + r); slots past
 * the last row are zero so the kernel needs no edge cases. Two walks, so
 * that memory is always read in order. */

/* Rows adjacent in memory (rs == 1): read depth by depth; each depth's
 * contiguous run feeds every strip. */
static void pack_by_depth(float *dst, int width, const float *src, int64_t ps,
                          int64_t total, int64_t kc)
{
    int64_t strips = (total + width - 1) / width;
    CHI_OMP(omp for schedule(static))
    for (int64_t p = 0; p < kc; p++)
        for (int64_t s = 0; s < strips; s++) {
            float *d = dst + s * width * kc + p * width;
            const float *from = src + p * ps + s * width;
            int w = (int)min64(width, total - s * width);
            for (int r = 0; r < w; r++)
                d[r] = from[r];
            for (int r = w; r < width; r++)
                d[r] = 0.0f;
        }
}

/* Depth adjacent in memory (ps == 1): read strip by strip, row by row. */
static void pack_by_strip(float *dst, int width, const float *src, int64_t rs,
                          int64_t total, int64_t kc)
{
    int64_t strips = (total + width - 1) / width;
    CHI_OMP(omp for schedule(static))
    for (int64_t s = 0; s < strips; s++) {
        float *d = dst + s * width * kc;
        int w = (int)min64(width, total - s * width);
        for (int r = 0; r < w; r++) {
            const float *row = src + (s * width + r) * rs;
            for (int64_t p = 0; p < kc; p++)
                d[p * width + r] = row[p];
        }
        for (int r = w; r < width; r++)
            for (int64_t p = 0; p < kc; p++)
                d[p * width + r] = 0.0f;
    }
}

/* Rows [i0, i0 + mc) of op(A), depth [p0, p0 + kc), as MR-row strips. */
static void pack_a(const gemm_job *j, int64_t i0, int64_t mc, int64_t p0, int64_t kc)
{
    if (j->trans_a)
        pack_by_depth(j->apack, MR, j->a + p0 * j->lda + i0, j->lda, mc, kc);
    else
        pack_by_strip(j->apack, MR, j->a + i0 * j->lda + p0, j->lda, mc, kc);
}

/* Columns [j0, j0 + nc) of op(B), depth [p0, p0 + kc), as NR-column strips. */
static void pack_b(const gemm_job *j, int64_t p0, int64_t kc, int64_t j0, int64_t nc)
{
    if (j->trans_b)
        pack_by_strip(j->bpack, NR, j->b + j0 * j->ldb + p0, j->ldb, nc, kc);
    else
        pack_by_depth(j->bpack, NR, j->b + p0 * j->ldb + j0, j->ldb, nc, kc);
}

/* Twelve 4-wide accumulators and three operands fit the 16 registers of
 * SSE2 (NEON has 32): so the 16 columns are done as two passes of 8. */
static void kernel_4wide(int64_t kc, const float *restrict ap, const float *restrict bp,
                         float tile[MR][NR])
{
    for (int h = 0; h < 2; h++) {
        v4f acc[MR][2] = {{{0}}};
        const float *a = ap, *b = bp + 8 * h;
#pragma GCC unroll 4
        for (int64_t p = 0; p < kc; p++) {
            v4f b0, b1;
            memcpy(&b0, b, sizeof b0);
            memcpy(&b1, b + 4, sizeof b1);
#pragma GCC unroll 6
            for (int i = 0; i < MR; i++) {
                acc[i][0] += a[i] * b0;
                acc[i][1] += a[i] * b1;
            }
            a += MR;
            b += NR;
        }
        for (int i = 0; i < MR; i++)
            memcpy(&tile[i][8 * h], acc[i], sizeof acc[i]);
    }
}

#ifdef HAVE_AVX2_KERNEL
/* Twelve 8-wide accumulators in the 16 AVX registers, one pass. `acc += a
 * * b` stays a multiply and an add (vmulps, vaddps), each rounded: the
 * build's -ffp-contract=off (configure.ac) keeps the compiler from fusing
 * them into FMA although the target allows it, so the sums round as the
 * 4-wide kernel's do. */
__attribute__((target("avx2,fma")))
static void kernel_avx2(int64_t kc, const float *restrict ap, const float *restrict bp,
                        float tile[MR][NR])
{
    v8f acc[MR][2] = {{{0}}};
#pragma GCC unroll 4
    for (int64_t p = 0; p < kc; p++) {
        v8f b0, b1;
        memcpy(&b0, bp, sizeof b0);
        memcpy(&b1, bp + 8, sizeof b1);
#pragma GCC unroll 6
        for (int i = 0; i < MR; i++) {
            acc[i][0] += ap[i] * b0;
            acc[i][1] += ap[i] * b1;
        }
        ap += MR;
        bp += NR;
    }
    memcpy(tile, acc, sizeof acc);
}
#endif

static kernel_fn pick_kernel(void)
{
#ifdef HAVE_AVX2_KERNEL
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return kernel_avx2;
#endif
    return kernel_4wide;
}

/* C block (mr x nr of it) = alpha * tile + beta * C; beta == 0 never
 * reads C. */
static void store_tile(float *c, int64_t ldc, const float tile[MR][NR], int mr,
                       int nr, float alpha, float beta)
{
    for (int i = 0; i < mr; i++) {
        float *row = c + i * ldc;
        if (beta == 0.0f)
            for (int jj = 0; jj < nr; jj++)
                row[jj] = alpha * tile[i][jj];
        else
            for (int jj = 0; jj < nr; jj++)
                row[jj] = alpha * tile[i][jj] + beta * row[jj];
    }
}

/* One MC-row block of the packed A chunk times one NR strip of packed B. */
static void macro_tile(const gemm_job *j, const float *ablock, int64_t mc,
                       const float *bstrip, int nr, int64_t kc, float *c, float beta)
{
    float tile[MR][NR] __attribute__((aligned(64)));
    for (int64_t ir = 0; ir < mc; ir += MR) {
        float *cblock = c + ir * j->ldc;
        int mr = (int)min64(MR, mc - ir);
        /* C is written only after the kernel: fetching it now hides that
         * miss (measured: about 10% at 1024^3, where C's rows are 4 KiB
         * apart and collide in L1). */
        for (int i = 0; i < mr; i++) {
            __builtin_prefetch(cblock + i * j->ldc, 1);
            __builtin_prefetch(cblock + i * j->ldc + nr - 1, 1);
        }
        j->kernel(kc, ablock + ir * kc, bstrip, tile);
        store_tile(cblock, j->ldc, tile, mr, nr, j->alpha, beta);
    }
}

/* Multiply the packed A chunk (rows i0.., mc of them) by the packed B panel;
 * each (MC block, NR strip) tile of C is written by exactly one thread. */
static void multiply_chunk(const gemm_job *j, int64_t i0, int64_t mc, int64_t j0,
                           int64_t nc, int64_t kc, float beta)
{
    int64_t blocks = (mc + MC - 1) / MC, strips = (nc + NR - 1) / NR;
    CHI_OMP(omp for collapse(2) schedule(static))
    for (int64_t ib = 0; ib < blocks; ib++)
        for (int64_t s = 0; s < strips; s++) {
            int64_t r0 = ib * MC, c0 = s * NR;
            macro_tile(j, j->apack + r0 * kc, min64(MC, mc - r0), j->bpack + c0 * kc,
                       (int)min64(NR, nc - c0), kc,
                       j->c + (i0 + r0) * j->ldc + j0 + c0, beta);
        }
}

/* The loop nest; run by every thread of the team, the omp for loops inside
 * share out the packing and the tiles (their barriers order the phases). */
static void gemm_run(const gemm_job *j)
{
    for (int64_t j0 = 0; j0 < j->n; j0 += NC) {
        int64_t nc = min64(NC, j->n - j0);
        for (int64_t p0 = 0; p0 < j->k; p0 += KC) {
            int64_t kc = min64(KC, j->k - p0);
            float beta = p0 == 0 ? j->beta : 1.0f;
            pack_b(j, p0, kc, j0, nc);
            for (int64_t i0 = 0; i0 < j->m; i0 += MCHUNK) {
                int64_t mc = min64(MCHUNK, j->m - i0);
                pack_a(j, i0, mc, p0, kc);
                multiply_chunk(j, i0, mc, j0, nc, kc, beta);
            }
        }
    }
}

/* C = beta C: what GEMM reduces to when alpha or k is 0. */
static void scale_c(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t jj = 0; jj < n; jj++)
            c[i * ldc + jj] = beta != 0.0f ? beta * c[i * ldc + jj] : 0.0f;
}

static ch_status alloc_pack(float **out, int64_t floats)
{
    void *p = NULL;
    int rc = posix_memalign(&p, 64, (size_t)floats * sizeof(float));
    if (rc != 0)
        return chi_error(CH_ERR_OUT_OF_MEMORY,
                         "chi_host_sgemm_blocked: posix_memalign(%zu bytes) for "
                         "a packing buffer: %s",
                         (size_t)floats * sizeof(float), strerror(rc));
    *out = p;
    return CH_OK;
}

ch_status chi_host_sgemm_blocked(int trans_a, int trans_b, int64_t m, int64_t n,
                                 int64_t k, float alpha, const float *a, int64_t lda,
                                 const float *b, int64_t ldb, float beta, float *c,
                                 int64_t ldc)
{
    if (m <= 0 || n <= 0)
        return CH_OK;
    if (k <= 0 || alpha == 0.0f) {
        scale_c(m, n, beta, c, ldc);
        return CH_OK;
    }
    gemm_job j = {trans_a, trans_b, m, n, k, alpha, beta, a, b, lda, ldb, ldc, c,
                  NULL, NULL, pick_kernel()};
    int64_t kc = min64(KC, k);
    ch_status st = alloc_pack(&j.apack, round_up(min64(m, MCHUNK), MR) * kc);
    if (st == CH_OK)
        st = alloc_pack(&j.bpack, round_up(min64(n, NC), NR) * kc);
    if (st == CH_OK) {
        CHI_OMP(omp parallel if ((double)m * n * k > PAR_MIN_FLOPS))
        gemm_run(&j);
    }
    free(j.apack);
    free(j.bpack);
    return st;
}

#ifdef HAVE_ONEDNN
/* The product through dnnl_sgemm (row-major, 64-bit sizes). Inside one of
 * our OpenMP regions oneDNN's OpenMP build runs it on the calling thread. */
static ch_status lib_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc)
{
    dnnl_status_t s = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a,
                                 lda, b, ldb, beta, c, ldc);
    if (s == dnnl_success)
        return CH_OK;
    return chi_error(s == dnnl_out_of_memory ? CH_ERR_OUT_OF_MEMORY : CH_ERR_INTERNAL,
                     "host GEMM: dnnl_sgemm(%c%c, %lld x %lld x %lld) failed with oneDNN "
                     "status %d",
                     trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', (long long)m, (long long)n,
                     (long long)k, (int)s);
}
#define HAVE_LIB_SGEMM 1
#define LIB_SGEMM_SERIAL_IN_REGION 1

/* How many parts chi_host_gemm cuts a product into by rows, one call of
 * oneDNN's sgemm a thread (0: none, oneDNN shares it out itself). The
 * rule: an NT product (a [m, k] times b^T, b [n, k]) that is narrow and
 * deep, fewer than 1024 columns and a depth from 1536, which oneDNN 2.6
 * shares between threads less well than whole rows a thread: a thread
 * that owns whole rows owns whole dot products, against a b that every
 * thread only reads; and each thread gets at least ROW_PART_MIN rows, so
 * that each call still fills the library's blocks.
 * Outside a parallel region only (inside one, a call is the thread's own).
 * Each element is the same sum whichever thread takes its row, so the
 * parts change no bit. The shapes measured, at two threads, are in
 * docs/PERFORMANCE_LOG.md (2026-12-06 15:20-17:10 UTC). */
#define ROW_PART_MIN 256
static int row_parts(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k)
{
    int team = chi_omp_max_threads();
    if (team < 2 || chi_omp_threads() != 1 || trans_a || !trans_b || n >= 1024 || k < 1536 ||
        m < (int64_t)ROW_PART_MIN * team)
        return 0;
    return team;
}

/* The product in `parts` calls by rows, one a thread: part p takes rows
 * [m p / parts, m (p + 1) / parts). A smaller team than asked for (no
 * threads to spare) takes the parts in turn. */
static ch_status lib_sgemm_rows(int parts, int64_t m, int64_t n, int64_t k, float alpha,
                                const float *a, int64_t lda, const float *b, int64_t ldb,
                                float beta, float *c, int64_t ldc)
{
    ch_status first = CH_OK;
    char why[256] = "";
    CHI_OMP(omp parallel for num_threads(parts) schedule(static, 1))
    for (int p = 0; p < parts; p++) {
        int64_t r0 = m * p / parts, r1 = m * (p + 1) / parts;
        ch_status st = lib_sgemm(0, 1, r1 - r0, n, k, alpha, a + r0 * lda, lda, b, ldb, beta,
                                 c + r0 * ldc, ldc);
        if (st != CH_OK) {
            CHI_OMP(omp critical(chi_host_gemm_rows))
            if (first == CH_OK) {
                first = st;
                snprintf(why, sizeof why, "%s", ch_last_error());
            }
        }
    }
    return first == CH_OK ? CH_OK : chi_error(first, "%s", why);
}
#elif defined(HAVE_BLAS)
/* The product through cblas_sgemm when it takes these sizes (int);
 * CH_ERR_LIMIT when it does not, for the blocked GEMM to do it. */
static ch_status lib_sgemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX)
        return CH_ERR_LIMIT;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a, (int)lda,
                b, (int)ldb, beta, c, (int)ldc);
    return CH_OK;
}
#define HAVE_LIB_SGEMM 1
/* OpenBLAS's OpenMP and serial builds run a call made inside a parallel
 * region on the calling thread; its pthreads build would wake its own
 * threads from each of ours. */
#define LIB_SGEMM_SERIAL_IN_REGION (openblas_get_parallel() != 1)
#endif

/* Inside a parallel region: the library's GEMM where it runs the call on
 * the calling thread, otherwise the blocked C GEMM (its own region, nested
 * in ours, is one thread). Outside a region this is chi_host_gemm's
 * product. */
ch_status chi_host_gemm_serial(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                               float alpha, const float *a, int64_t lda, const float *b,
                               int64_t ldb, float beta, float *c, int64_t ldc)
{
#ifdef HAVE_LIB_SGEMM
    if (LIB_SGEMM_SERIAL_IN_REGION) {
        ch_status st = lib_sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        if (st != CH_ERR_LIMIT)
            return st;
    }
#endif
    return chi_host_sgemm_blocked(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                  ldc);
}

#ifdef CHI_TEST_HOOKS
int chi_host_gemm_row_parts(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k)
{
#ifdef HAVE_ONEDNN
    return row_parts(trans_a, trans_b, m, n, k);
#else
    (void)trans_a, (void)trans_b, (void)m, (void)n, (void)k;
    return 0;
#endif
}
#endif

ch_status chi_host_gemm(void *stream, int trans_a, int trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, ch_bmem a, int64_t lda, ch_bmem b,
                        int64_t ldb, float beta, ch_bmem c, int64_t ldc)
{
    (void)stream;
#ifdef HAVE_ONEDNN
    int parts = row_parts(trans_a, trans_b, m, n, k);
    if (parts)
        return lib_sgemm_rows(parts, m, n, k, alpha, chi_host_f32(a), lda, chi_host_f32(b), ldb,
                              beta, chi_host_f32(c), ldc);
#endif
#ifdef HAVE_LIB_SGEMM
    /* Sizes OpenBLAS cannot take (int) go to the blocked GEMM. */
    ch_status st = lib_sgemm(trans_a, trans_b, m, n, k, alpha, chi_host_f32(a), lda,
                             chi_host_f32(b), ldb, beta, chi_host_f32(c), ldc);
    if (st != CH_ERR_LIMIT)
        return st;
#endif
    return chi_host_sgemm_blocked(trans_a, trans_b, m, n, k, alpha, chi_host_f32(a),
                                  lda, chi_host_f32(b), ldb, beta, chi_host_f32(c),
                                  ldc);
}
