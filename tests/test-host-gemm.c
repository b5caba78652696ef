/* The host's blocked C GEMM (the fallback when OpenBLAS is absent) against
 * a double-precision loop: every transpose combination, alpha and beta
 * variants, odd shapes and shapes that cross each blocking boundary
 * (KC = 512 deep, MCHUNK = 2304 rows, NC = 4080 columns). Then the fused
 * attention's tile products (chi_host_tile_mm) in each instruction set
 * this CPU runs, against the same loop and against each other. Last the
 * host's rounding of f32 to bf16 with VCVTNEPS2BF16 (where the CPU has
 * it) against chk_f32_to_bf16, bit for bit (test-cast holds ch_cast to an
 * independent reference on every device). chi_host_gemm itself on the
 * products it cuts into parts by rows (with oneDNN) and near them. */
#ifdef HAVE_CONFIG_H
#include "config.h" /* HAVE_ONEDNN */
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
/* From the OpenMP API (lib/omp.h, on the include path, shadows <omp.h>). */
void omp_set_num_threads(int n);
#endif

#include "tap.h"
#include "host.h"
#include "kernels/half_bits.h" /* chk_f32_to_bf16 */

typedef struct shape {
    int m, n, k;
} shape;

typedef struct gemm_case {
    int ta, tb, m, n, k;
    int pad;             /* extra elements at the end of every stored row */
    float alpha, beta;
} gemm_case;

/* op(X)[r, c] of X stored with row stride ld. */
static double at(const float *x, int trans, int64_t ld, int r, int c)
{
    return trans ? x[(int64_t)c * ld + r] : x[(int64_t)r * ld + c];
}

static void fill(float *x, size_t n, tap_rng *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
}

/* The largest error of c against the double loop, relative to the size of
 * the terms each element sums (so that k = 600 and k = 1 share one bound). */
static double worst_error(const gemm_case *t, const float *a, int64_t lda, const float *b,
                          int64_t ldb, const float *c0, const float *c, int64_t ldc,
                          char *where, size_t size)
{
    double worst = 0.0;
    for (int i = 0; i < t->m; i++)
        for (int j = 0; j < t->n; j++) {
            double sum = 0.0, mag = 0.0;
            for (int p = 0; p < t->k; p++) {
                double ab = at(a, t->ta, lda, i, p) * at(b, t->tb, ldb, p, j);
                sum += ab;
                mag += fabs(ab);
            }
            double old = t->beta != 0.0f ? c0[i * ldc + j] : 0.0;
            double want = t->alpha * sum + t->beta * old;
            double scale = fabs(t->alpha) * mag + fabs(t->beta * old) + 1e-30;
            double err = fabs(c[i * ldc + j] - want) / scale;
            if (!(err <= worst)) {
                worst = err;
                snprintf(where, size, "at (%d,%d): got %.7g, want %.7g", i, j,
                         c[i * ldc + j], want);
            }
        }
    return worst;
}

/* via_host: through chi_host_gemm (the library GEMM where the build has
 * one, as ops call it) instead of the blocked C GEMM. */
static int via_host = 0;

static ch_bmem mem_of(void *p)
{
    return (ch_bmem){.ptr = p, .off = 0};
}

static void run_case(const gemm_case *t, tap_rng *rng)
{
    int64_t ar = t->ta ? t->k : t->m, ac = t->ta ? t->m : t->k;
    int64_t br = t->tb ? t->n : t->k, bc = t->tb ? t->k : t->n;
    int64_t lda = ac + t->pad, ldb = bc + t->pad, ldc = t->n + t->pad;
    float *a = malloc(sizeof *a * ar * lda), *b = malloc(sizeof *b * br * ldb);
    float *c = malloc(sizeof *c * t->m * ldc), *c0 = malloc(sizeof *c0 * t->m * ldc);
    if (!a || !b || !c || !c0) {
        tap_ok(0, "malloc for a %dx%dx%d case", t->m, t->n, t->k);
        free(a), free(b), free(c), free(c0);
        return;
    }
    fill(a, (size_t)(ar * lda), rng);
    fill(b, (size_t)(br * ldb), rng);
    fill(c0, (size_t)(t->m * ldc), rng);
    /* beta == 0 must not read C: NaN there must not reach the result. */
    if (t->beta == 0.0f)
        for (int64_t i = 0; i < t->m * ldc; i++)
            c0[i] = NAN;
    memcpy(c, c0, sizeof *c * t->m * ldc);
    ch_status st = via_host ? chi_host_gemm(NULL, t->ta, t->tb, t->m, t->n, t->k, t->alpha,
                                            mem_of(a), lda, mem_of(b), ldb, t->beta, mem_of(c), ldc)
                            : chi_host_sgemm_blocked(t->ta, t->tb, t->m, t->n, t->k, t->alpha, a,
                                                     lda, b, ldb, t->beta, c, ldc);
    char where[160] = "";
    double err = st == CH_OK ? worst_error(t, a, lda, b, ldb, c0, c, ldc, where,
                                           sizeof where)
                             : INFINITY;
    tap_ok(err <= 1e-5,
           "%sgemm %c%c m=%d n=%d k=%d ld+%d alpha=%g beta=%g: relative "
           "error %.3g (want <= 1e-5) %s%s",
           !via_host ? ""
           : chi_host_gemm_row_parts(t->ta, t->tb, t->m, t->n, t->k)
               ? "chi_host_gemm by parts of rows: "
               : "chi_host_gemm: ",
           t->ta ? 'T' : 'N', t->tb ? 'T' : 'N', t->m, t->n, t->k, t->pad, (double)t->alpha,
           (double)t->beta, err, where, st == CH_OK ? "" : ch_last_error());
    free(a), free(b), free(c), free(c0);
}

#if defined(HAVE_ONEDNN) && defined(_OPENMP)
/* The products chi_host_gemm cuts into parts by rows, one a thread, with
 * `team` threads: the NT products of fewer than 1024 columns and a depth
 * from 1536 with at least 256 rows a thread (gemm.c's rule), and no
 * others. */
static void row_parts_rule(int team)
{
    int64_t m = 256 * (int64_t)team;
    int at = chi_host_gemm_row_parts(0, 1, m, 1023, 1536);
    tap_ok(at == team && chi_host_gemm_row_parts(0, 1, m + 89, 300, 1600) == team &&
               !chi_host_gemm_row_parts(0, 1, m - 1, 300, 1600) &&
               !chi_host_gemm_row_parts(0, 1, m, 1024, 1536) &&
               !chi_host_gemm_row_parts(0, 1, m, 300, 1535) &&
               !chi_host_gemm_row_parts(0, 0, m + 89, 300, 1600) &&
               !chi_host_gemm_row_parts(1, 1, m + 89, 300, 1600),
           "chi_host_gemm with oneDNN and %d threads cuts into %d parts by rows the NT "
           "products of fewer than 1024 columns, depth from 1536 and %lld rows or more, and "
           "no others (got %d parts at the edge)",
           team, team, (long long)m, at);
}

#endif

/* chi_host_gemm on NT products that it cuts into parts by rows where the
 * build has oneDNN and several threads run (an odd count of rows, padded
 * rows, beta 0 with NaN in C and beta 2), and on the same layout just
 * past the region and in other layouts: against the double loop; then,
 * with three threads, parts of unequal rows. */
static void library_cases(tap_rng *rng)
{
    static const gemm_case cases[] = {
        {0, 1, 601, 300, 1600, 0, 1.0f, 0.0f},  {0, 1, 512, 1023, 1536, 3, 0.5f, 2.0f},
        {0, 1, 520, 1024, 1536, 0, 1.0f, 0.0f}, {0, 1, 520, 300, 1535, 1, 1.0f, 0.0f},
        {0, 0, 601, 300, 1600, 1, 1.0f, 0.0f},  {1, 0, 601, 300, 1600, 0, -1.5f, 1.0f},
    };
    via_host = 1;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(&cases[i], rng);
#if defined(HAVE_ONEDNN) && defined(_OPENMP)
    int team = chi_omp_max_threads();
    if (team >= 2)
        row_parts_rule(team);
    else
        tap_skip("chi_host_gemm's parts by rows: one thread runs");
    /* Three parts of unequal rows (256, 257 and 257 of 770), whatever the
     * cores. */
    omp_set_num_threads(3);
    row_parts_rule(3);
    static const gemm_case three = {0, 1, 770, 500, 1536, 2, 1.0f, 0.0f};
    run_case(&three, rng);
    omp_set_num_threads(team);
#else
    tap_skip("chi_host_gemm's parts by rows: this build has no oneDNN or no OpenMP");
    tap_skip("chi_host_gemm's parts by rows with three threads: the same");
#endif
    via_host = 0;
}

/* alpha == 0 reads neither A nor B: NaN there leaves beta * C. */
static void alpha_zero(void)
{
    float a[6], b[6], c[4] = {1, 2, 3, 4};
    for (int i = 0; i < 6; i++)
        a[i] = b[i] = NAN;
    ch_status st = chi_host_sgemm_blocked(0, 0, 2, 2, 3, 0.0f, a, 3, b, 2, 0.5f, c, 2);
    tap_ok(st == CH_OK && c[0] == 0.5f && c[1] == 1.0f && c[2] == 1.5f && c[3] == 2.0f,
           "alpha = 0 gives beta * C without reading A or B: got %g %g %g %g, "
           "want 0.5 1 1.5 2", c[0], c[1], c[2], c[3]);
}

/* The tile product of case t (tb 0: B is read along its rows; ta by the
 * strides of A) in instruction set `isa`, into c (filled from c0 first);
 * 1 when it ran. */
static int tile_case(int isa, const gemm_case *t, const float *a, int64_t lda, const float *b,
                     int64_t ldb, const float *c0, float *c, int64_t ldc)
{
    memcpy(c, c0, sizeof *c * (size_t)(t->m * ldc));
    return chi_host_tile_mm(isa, t->m, t->n, t->k, t->alpha, a, t->ta ? 1 : lda, t->ta ? lda : 1, b,
                            ldb, t->beta, c, ldc);
}

static void tile_cases(tap_rng *rng)
{
    static const char *name[] = {[CHI_TILE_AVX512] = "AVX-512", [CHI_TILE_AVX2] = "AVX2"};
    static const int isas[] = {CHI_TILE_AVX512, CHI_TILE_AVX2};
    /* Rows around the blocks of 4 (of 8 where a block is at most two
     * vectors wide, of 6 in AVX-512 where it is three or four: 7 is 6 and
     * 1, 8 is 4 and 4, 10 is 6 and 4), columns around the vectors (8, 16)
     * and the 64 columns of a block, the fused attention's 64 x 64 x 64
     * and its diagonal's 32 x 64 x 64. */
    static const shape shapes[] = {{1, 1, 1},    {3, 5, 7},    {4, 16, 32},  {5, 17, 33},
                                   {64, 64, 32}, {64, 32, 64}, {61, 63, 64}, {9, 130, 3},
                                   {7, 8, 0},    {13, 20, 9},  {8, 16, 5},   {23, 31, 40},
                                   {7, 50, 11},  {8, 64, 9},   {10, 48, 17}, {32, 64, 64}};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.125f, 1.0f}, {-1.5f, 0.5f}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int ta = 0; ta < 2; ta++) {
            size_t v = (s + (size_t)ta) % 3;
            gemm_case t = {ta,          0,      shapes[s].m, shapes[s].n,
                           shapes[s].k, (int)v, ab[v][0],    ab[v][1]};
            int64_t ar = ta ? t.k : t.m, lda = (ta ? t.m : t.k) + t.pad, ldb = t.n + t.pad,
                    ldc = t.n + t.pad;
            size_t na = (size_t)(ar * lda) + 1, nb = (size_t)(t.k * ldb) + 1,
                   nc = (size_t)(t.m * ldc);
            float *a = malloc(sizeof *a * na), *b = malloc(sizeof *b * nb),
                  *c0 = malloc(sizeof *c0 * nc),
                  *c[2] = {malloc(sizeof(float) * nc), malloc(sizeof(float) * nc)};
            if (!a || !b || !c0 || !c[0] || !c[1]) {
                tap_ok(0, "malloc for a %dx%dx%d tile case", t.m, t.n, t.k);
                free(a), free(b), free(c0), free(c[0]), free(c[1]);
                continue;
            }
            fill(a, na, rng);
            fill(b, nb, rng);
            fill(c0, nc, rng);
            if (t.beta == 0.0f)
                for (size_t i = 0; i < nc; i++)
                    c0[i] = NAN;
            int ran[2] = {0, 0};
            for (int i = 0; i < 2; i++) {
                if (chi_host_tile_isa(isas[i]) == CHI_TILE_NONE) {
                    tap_skip("tile product %dx%dx%d in %s: this CPU does not run it", t.m, t.n, t.k,
                             name[isas[i]]);
                    continue;
                }
                ran[i] = tile_case(isas[i], &t, a, lda, b, ldb, c0, c[i], ldc);
                char where[160] = "";
                double err =
                    ran[i] ? worst_error(&t, a, lda, b, ldb, c0, c[i], ldc, where, sizeof where)
                           : INFINITY;
                tap_ok(err <= 1e-5,
                       "tile product in %s, %s, m=%d n=%d k=%d ld+%d alpha=%g "
                       "beta=%g: relative error %.3g (want <= 1e-5) %s",
                       name[isas[i]], ta ? "A transposed" : "A as stored", t.m, t.n, t.k, t.pad,
                       (double)t.alpha, (double)t.beta, err, where);
            }
            if (ran[0] && ran[1])
                tap_ok(memcmp(c[0], c[1], sizeof(float) * nc) == 0,
                       "tile product %dx%dx%d: AVX-512 and AVX2 give the same bits", t.m, t.n, t.k);
            free(a), free(b), free(c0), free(c[0]), free(c[1]);
        }
    /* The transposes the products read B from, at the edges of the 8 x 8
     * blocks and inside them, against the plain loop's bits. */
    static const int sides[][2] = {{1, 1}, {8, 8}, {64, 32}, {13, 21}, {7, 9}, {0, 5}};
    for (size_t s = 0; s < sizeof sides / sizeof sides[0]; s++)
        for (int i = 0; i < 3; i++) {
            static const int all[] = {CHI_TILE_AVX512, CHI_TILE_AVX2, CHI_TILE_NONE};
            static const char *label[] = {"AVX-512", "AVX2", "plain"};
            int rows = sides[s][0], cols = sides[s][1], lds = cols + 3, ldd = rows + 2;
            if (all[i] != CHI_TILE_NONE && chi_host_tile_isa(all[i]) == CHI_TILE_NONE) {
                tap_skip("transpose %dx%d in %s: this CPU does not run it", rows, cols, label[i]);
                continue;
            }
            float *src = malloc(sizeof *src * (size_t)(rows * lds + 1)),
                  *dst = malloc(sizeof *dst * (size_t)(cols * ldd + 1));
            if (!src || !dst) {
                tap_ok(0, "malloc for a %dx%d transpose", rows, cols);
                free(src), free(dst);
                continue;
            }
            fill(src, (size_t)(rows * lds + 1), rng);
            for (int e = 0; e < cols * ldd + 1; e++)
                dst[e] = -7.0f;
            chi_host_tile_transpose(all[i], rows, cols, src, lds, dst, ldd);
            int bad = 0;
            for (int r = 0; r < rows; r++)
                for (int c = 0; c < cols; c++)
                    bad += dst[c * ldd + r] != src[r * lds + c];
            for (int c = 0; c < cols; c++)
                for (int r = rows; r < ldd; r++)
                    bad += c * ldd + r < cols * ldd && dst[c * ldd + r] != -7.0f;
            tap_ok(bad == 0, "transpose %dx%d (strides %d, %d) in %s: %d elements wrong", rows,
                   cols, lds, ldd, label[i], bad);
            free(src), free(dst);
        }
    int none = chi_host_tile_mm(CHI_TILE_NONE, 1, 1, 1, 1.0f, NULL, 1, 1, NULL, 1, 0.0f, NULL, 1);
    tap_ok(none == 0, "chi_host_tile_mm(CHI_TILE_NONE) declines (returned %d)", none);
    int any = chi_host_tile_isa(CHI_TILE_AUTO);
    tap_ok(any == CHI_TILE_NONE || chi_host_tile_isa(any) == any,
           "chi_host_tile_isa(AUTO) names one this CPU runs (%d)", any);
}

/* f32 to bf16 with VCVTNEPS2BF16 against chk_f32_to_bf16 (the plain
 * loop's and every backend's rounding): the specials
 * (zeros, infinities, NaNs quiet and signalling with payloads, the
 * subnormals the instruction alone would flush, the ties and their
 * neighbours) and random bit patterns, from every offset of a
 * sixteen-lane vector so that each lands in each lane and in the tail. */
static void bf16_rounding(tap_rng *rng)
{
    chi_host_round_fn *fast = chi_host_f32_to_bf16_fast();
    if (!fast) {
        tap_skip("f32 to bf16 with VCVTNEPS2BF16: this CPU does not run it");
        return;
    }
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
        0xff812345u, 0x7fbfffffu, 0x00000001u, 0x80000001u, 0x007fffffu, 0x807fffffu, 0x00008000u,
        0x00018000u, 0x0000ffffu, 0x00400000u, 0x80408000u, 0x00800000u, 0x3f808000u, 0x3f818000u,
        0x3f807fffu, 0x3f808001u, 0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu, 0x3f800000u, 0xbf7fffffu};
    enum {
        RANDOM = 1 << 16
    };
    size_t ns = sizeof special / sizeof special[0], n = ns * 3 + RANDOM;
    uint32_t *x = malloc(sizeof *x * (n + 16));
    uint16_t *got = malloc(sizeof *got * (n + 16));
    if (!x || !got) {
        tap_ok(0, "malloc for the bf16 rounding");
        free(x), free(got);
        return;
    }
    size_t at = 0;
    for (int copy = 0; copy < 3; copy++) /* each special in more than one lane */
        for (size_t i = 0; i < ns; i++)
            x[at++] = special[(i + (size_t)copy * 5) % ns];
    while (at < n + 16) {
        uint32_t u = (uint32_t)tap_rng_next(rng);
        x[at] = (at & 7) == 0 ? u & 0x807fffffu : u; /* one in eight subnormal */
        at++;
    }
    size_t wrong = 0, first = 0;
    for (int off = 0; off < 16; off++) {
        fast(got, x + off, (int64_t)n);
        for (size_t i = 0; i < n; i++)
            if (got[i] != chk_f32_to_bf16(x[off + i]) && wrong++ == 0)
                first = i + (size_t)off;
    }
    tap_ok(wrong == 0,
           "f32 to bf16 with VCVTNEPS2BF16: chk_f32_to_bf16's bits on %zu floats from 16 offsets "
           "(%zu differ; the first 0x%08x)",
           n, wrong, wrong ? (unsigned)x[first] : 0u);
    free(x), free(got);
}

int main(void)
{
    static const shape shapes[] = {
        {1, 1, 1},    {37, 53, 61},  {127, 129, 65}, {256, 256, 256},
        {7, 33, 600}, {2400, 17, 9}, {5, 4100, 3},
    };
    static const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 2.0f}, {-1.5f, 1.0f}};
    tap_rng rng = {20261130};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++)
            for (size_t v = 0; v < sizeof ab / sizeof ab[0]; v++) {
                gemm_case t = {tr >> 1, tr & 1, shapes[s].m, shapes[s].n, shapes[s].k,
                           (int)v, ab[v][0], ab[v][1]};
                run_case(&t, &rng);
            }
    alpha_zero();
    library_cases(&rng);
    tile_cases(&rng);
    bf16_rounding(&rng);
    return tap_done();
}
