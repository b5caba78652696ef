/* The host's fused attention in each instruction set this CPU runs
 * (chi_host_tile_prefer picks it; CHI_TEST_HOOKS): its row passes, whose
 * exponential is written once in generic vectors (eight lanes) and once in
 * AVX-512 intrinsics (sixteen), against exp in double and bit for bit
 * against each other over floats across [-88, 0]; the row maxima; then
 * forward and backward against a double-precision loop, with the threads'
 * tiles in a stream's scratch memory (grown, reused, and allocated apart
 * while the stream's is in use) and without a stream. Then with bf16
 * products (ch_attention_packed_mixed's): on AMX, where the CPU has it,
 * against the double loop that rounds the same inputs where the kernel
 * rounds them (one tile of keys: to 2e-7; more: to 1e-4, where an
 * exponential rounds to the neighbouring bf16 value), lengths padded to
 * the tiles; and the f32 kernel where AMX is off (chi_host_amx_prefer) or
 * the head size is not a multiple of 32. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "host.h"
#include "kernels/prelude.h" /* chk_bits_f32, chk_f32_bits */

static const int isas[] = {CHI_TILE_AVX512, CHI_TILE_AVX2, CHI_TILE_NONE};
static const char *isa_name[] = {"AVX-512", "AVX2", "plain"};
enum {
    NISA = 3,
    ROW = 64
};

/* Where the exponential is exact to a float: |got - exp(x)| in units of
 * the last place of exp(x) rounded to float. */
static double ulps(float got, double want)
{
    float w = (float)want;
    double ulp = (double)nextafterf(w, INFINITY) - (double)w;
    return fabs((double)got - want) / ulp;
}

/* The sampled inputs: every 97th float from -0 down to -88, then the
 * edges (the last normal result, -88, 0, -inf, NaN, far below). */
static size_t exp_inputs(float **out)
{
    const uint32_t lo = 0x80000000u, hi = chk_f32_bits(-88.0f), step = 97;
    static const float edges[] = {0.0f,    -0.0f,   -87.33654f,   -87.3365f,   -87.33655f,
                                  -87.34f, -88.0f,  -88.00001f,   -1e30f,      -INFINITY,
                                  NAN,     -1e-40f, -0.34657359f, -0.69314718f};
    size_t n = (hi - lo) / step + 1 + sizeof edges / sizeof edges[0];
    n = (n + ROW - 1) / ROW * ROW;
    float *x = malloc(n * sizeof *x);
    if (!x)
        return 0;
    size_t i = 0;
    for (uint32_t u = lo; u <= hi && u >= lo; u += step)
        x[i++] = chk_bits_f32(u);
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        x[i++] = edges[e];
    while (i < n)
        x[i++] = -1.0f;
    *out = x;
    return n;
}

static void test_exp(void)
{
    float *x = NULL, *y[NISA] = {NULL};
    size_t n = exp_inputs(&x);
    if (!n) {
        tap_ok(0, "malloc for the exponential's inputs");
        return;
    }
    for (int s = 0; s < NISA; s++) {
        if (isas[s] != CHI_TILE_NONE && chi_host_tile_isa(isas[s]) == CHI_TILE_NONE) {
            tap_skip("row exponential in %s: this CPU does not run it", isa_name[s]);
            continue;
        }
        y[s] = malloc(n * sizeof *y[s]);
        if (!y[s]) {
            tap_ok(0, "malloc for the exponential's results");
            continue;
        }
        memcpy(y[s], x, n * sizeof *x);
        double worst = 0.0, worst_sum = 0.0;
        size_t bad_special = 0;
        char where[160] = "";
        for (size_t r = 0; r < n; r += ROW) {
            float sum = chi_host_attention_row_exp(isas[s], y[s] + r, ROW, ROW, 0.0f);
            double want_sum = 0.0;
            for (size_t i = r; i < r + ROW; i++) {
                want_sum += y[s][i];
                if (isnan(x[i])) {
                    bad_special += !isnan(y[s][i]);
                    continue;
                }
                if (x[i] < -87.33654f) {
                    bad_special += y[s][i] != 0.0f;
                    continue;
                }
                double u = ulps(y[s][i], exp((double)x[i]));
                if (!(u <= worst)) {
                    worst = u;
                    snprintf(where, sizeof where, "at x = %.9g: got %.9g, want %.9g", (double)x[i],
                             (double)y[s][i], exp((double)x[i]));
                }
            }
            double e = isnan(want_sum) ? 0.0 : fabs(sum - want_sum) / (want_sum + FLT_MIN);
            worst_sum = e > worst_sum ? e : worst_sum;
        }
        tap_ok(worst <= 1.5,
               "row exponential in %s, %zu floats in [-87.34, 0]: %.3f ulp "
               "(want <= 1.5) %s",
               isa_name[s], n, worst, where);
        tap_ok(bad_special == 0,
               "row exponential in %s: below -87.33654 (and -inf) 0, NaN stays NaN (%zu wrong)",
               isa_name[s], bad_special);
        tap_ok(worst_sum <= 1e-6,
               "row exponential in %s: the rows' sums within %.2g (want <= 1e-6)", isa_name[s],
               worst_sum);
    }
    for (int s = 1; s < NISA; s++)
        if (y[0] && y[s]) {
            size_t differ = 0, first = n;
            for (size_t i = 0; i < n; i++)
                if (chk_f32_bits(y[0][i]) != chk_f32_bits(y[s][i]) &&
                    !(isnan(y[0][i]) && isnan(y[s][i]))) {
                    differ++;
                    first = first < n ? first : i;
                }
            char where[64] = "";
            if (differ)
                snprintf(where, sizeof where, ", the first at x = %.9g", (double)x[first]);
            tap_ok(differ == 0,
                   "row exponential: AVX-512 and %s give the same bits on all %zu inputs "
                   "(%zu differ%s)",
                   isa_name[s], n, differ, where);
        }
    for (int s = 0; s < NISA; s++)
        free(y[s]);
    free(x);
}

/* Rows cut short: exp(x - sub) of the first w, 0 after (the floats past w
 * hold 100, whose exponential would show), and the rows' maxima with NaN
 * and -inf among the values, in each instruction set. */
static void test_row_edges(tap_rng *rng)
{
    static const int widths[] = {1, 7, 8, 9, 15, 16, 17, 33, 63, 64};
    for (int s = 0; s < NISA; s++) {
        if (isas[s] != CHI_TILE_NONE && chi_host_tile_isa(isas[s]) == CHI_TILE_NONE) {
            tap_skip("row passes cut short in %s: this CPU does not run them", isa_name[s]);
            continue;
        }
        int bad_exp = 0, bad_max = 0;
        char where[160] = "";
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
            for (int rep = 0; rep < 20; rep++) {
                int w = widths[wi];
                float x[ROW], y[ROW];
                float sub = rep % 2 ? 0.75f : 0.0f;
                for (int i = 0; i < ROW; i++)
                    x[i] = i < w ? tap_rng_uniform(rng, -30.0f, sub) : 100.0f;
                if (rep % 3 == 1)
                    x[rep % w] = -INFINITY;
                if (rep % 4 == 2)
                    x[(rep * 7) % w] = NAN;
                memcpy(y, x, sizeof y);
                float sum = chi_host_attention_row_exp(isas[s], y, w, ROW, sub);
                double want_sum = 0.0, mx = -INFINITY;
                for (int i = 0; i < ROW; i++) {
                    double want = i < w ? exp((double)(x[i] - sub)) : 0.0; /* x - sub in float */
                    if (i < w) {
                        want_sum += want;
                        mx = x[i] > mx ? x[i] : mx; /* NaN compares false: left out */
                    }
                    int ok = isnan(x[i]) && i < w ? isnan(y[i])
                             : want == 0.0        ? y[i] == 0.0f
                                                  : ulps(y[i], want) <= 1.5;
                    if (!ok && !bad_exp++)
                        snprintf(where, sizeof where, "w=%d, element %d: got %.9g, want %.9g", w, i,
                                 (double)y[i], want);
                }
                if (!isnan(want_sum) && !(fabs(sum - want_sum) <= 1e-6 * want_sum) && !bad_exp++)
                    snprintf(where, sizeof where, "w=%d: sum %.9g, want %.9g", w, (double)sum,
                             want_sum);
                float got_max = chi_host_attention_row_max(isas[s], x, w);
                bad_max += (double)got_max != mx;
            }
        tap_ok(bad_exp == 0, "row exponential cut short in %s (%d wrong) %s", isa_name[s], bad_exp,
               where);
        tap_ok(bad_max == 0, "row maxima in %s, NaN left out (%d wrong)", isa_name[s], bad_max);
    }
}

typedef struct attn_shape {
    int b, heads, t, hd;
} attn_shape;

/* Matrix m's element (i, d) in a tensor of rows ld floats apart. */
static size_t at(const attn_shape *a, int m, int i, int d, int ld)
{
    return (size_t)(m / a->heads) * a->t * ld + (size_t)i * ld + (size_t)(m % a->heads) * a->hd + d;
}

/* x rounded to bf16 (to nearest, ties to even; through f32) where half,
 * x itself otherwise. */
static double hr(double x, int half)
{
    if (!half)
        return x;
    uint32_t u = chk_f32_bits((float)x);
    return chk_bits_f32((u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

/* The double loop: o and lse, then from dout, dq, dk and dv; q, k and v
 * packed in rows of ld (k at column heads * hd, v at 2 heads * hd). With
 * half, the products' inputs rounded to bf16 (ch_attention_packed_mixed):
 * q, k, v, dout, the probabilities and scale dS. */
static void reference(const attn_shape *a, const float *qkv, int ld, const float *dout, int ldo,
                      int half, double *o, double *lse, double *dqkv)
{
    int t = a->t, hd = a->hd, off = a->heads * a->hd;
    double scale = 1.0 / sqrt(hd);
    double *p = malloc(sizeof *p * (size_t)t * t);
    if (!p)
        return;
    for (int m = 0; m < a->b * a->heads; m++) {
        const float *q = qkv, *k = qkv + off, *v = qkv + 2 * off;
        for (int i = 0; i < t; i++) {
            double mx = -INFINITY, l = 0.0;
            for (int j = 0; j <= i; j++) {
                double s = 0.0;
                for (int d = 0; d < hd; d++)
                    s += hr(q[at(a, m, i, d, ld)], half) * hr(k[at(a, m, j, d, ld)], half);
                p[(size_t)i * t + j] = s * scale;
                mx = p[(size_t)i * t + j] > mx ? p[(size_t)i * t + j] : mx;
            }
            for (int j = 0; j <= i; j++)
                l += exp(p[(size_t)i * t + j] - mx);
            /* o: the probabilities rounded where the kernel rounds them, at
             * the running maximum of the tiles of 64 keys so far */
            double run = -INFINITY, acc[hd];
            for (int d = 0; d < hd; d++)
                acc[d] = 0.0;
            for (int j0 = 0; j0 <= i; j0 += 64) {
                int j1 = i + 1 < j0 + 64 ? i + 1 : j0 + 64;
                double m_new = run;
                for (int j = j0; j < j1; j++)
                    m_new = p[(size_t)i * t + j] > m_new ? p[(size_t)i * t + j] : m_new;
                double corr = run == -INFINITY ? 0.0 : exp(run - m_new);
                run = m_new;
                for (int d = 0; d < hd; d++) {
                    double sum = 0.0;
                    for (int j = j0; j < j1; j++)
                        sum += hr(exp(p[(size_t)i * t + j] - m_new), half) *
                               hr(v[at(a, m, j, d, ld)], half);
                    acc[d] = acc[d] * corr + sum;
                }
            }
            for (int d = 0; d < hd; d++)
                o[at(a, m, i, d, ldo)] = acc[d] / l;
            for (int j = 0; j <= i; j++)
                p[(size_t)i * t + j] = exp(p[(size_t)i * t + j] - mx) / l;
            lse[(size_t)m * t + i] = mx + log(l);
        }
        for (int i = 0; i < t; i++) {
            double dsum = 0.0, dp[t];
            for (int d = 0; d < hd; d++)
                dsum += (double)dout[at(a, m, i, d, ldo)] * o[at(a, m, i, d, ldo)];
            for (int j = 0; j <= i; j++) {
                dp[j] = 0.0;
                for (int d = 0; d < hd; d++)
                    dp[j] += hr(dout[at(a, m, i, d, ldo)], half) * hr(v[at(a, m, j, d, ld)], half);
            }
            for (int j = 0; j <= i; j++) {
                double pij = p[(size_t)i * t + j], ds = hr(pij * (dp[j] - dsum) * scale, half);
                for (int d = 0; d < hd; d++) {
                    dqkv[at(a, m, i, d, ld)] += ds * hr(k[at(a, m, j, d, ld)], half);
                    dqkv[at(a, m, j, d, ld) + off] += ds * hr(q[at(a, m, i, d, ld)], half);
                    dqkv[at(a, m, j, d, ld) + 2 * off] +=
                        hr(pij, half) * hr(dout[at(a, m, i, d, ldo)], half);
                }
            }
        }
    }
    free(p);
}

/* The largest |got - want| over the entries `used` marks, relative to the
 * largest |want| there; entries not used must still hold `sentinel`. */
static double rel_error(const float *got, const double *want, const unsigned char *used, size_t n,
                        float sentinel, size_t *touched)
{
    double top = 0.0, err = 0.0;
    for (size_t i = 0; i < n; i++)
        if (used[i])
            top = fabs(want[i]) > top ? fabs(want[i]) : top;
    *touched = 0;
    for (size_t i = 0; i < n; i++) {
        if (!used[i]) {
            *touched += chk_f32_bits(got[i]) != chk_f32_bits(sentinel);
            continue;
        }
        double e = fabs(got[i] - want[i]) / (top + 1e-30);
        err = e > err || isnan(e) ? e : err;
    }
    return err;
}

static ch_bmem mem_of(void *p)
{
    return (ch_bmem){.ptr = p, .off = 0};
}

/* Tolerances of the bf16 products against the reference that rounds the
 * same inputs: a probability whose exponential in f32 and in double round
 * to neighbouring bf16 values moves o by about 1e-4 at most here (seen:
 * up to 9.8e-5), dq, dk and dv by up to 3.5e-4 (seen over 13 draws of the
 * inputs; 3.2e-4 at t=256 with one); the f32 products miss that
 * reference by 3e-3 to 4e-3 in o, dq, dk and dv and by 6e-4 to 2e-3 in
 * lse. */
#define RT_O 3e-4
#define RT_L 1e-6
#define RT_D 6e-4

/* The inputs' range: [-2, 2], or wider (test_large_scores), where the
 * scores pass 88 and a row's exponentials overflow unless its maximum is
 * taken out first. */
static float input_range = 2.0f;

/* The f32 kernels' scheme where the length allows whole rows (1, the
 * default) or tiles of keys with a running maximum at every length (0,
 * chi_host_attention_whole_rows). */
static int whole_rows = 1;

static void test_attention(const attn_shape *a, int s, void *stream, ch_dtype half, tap_rng *rng)
{
    /* the products in bf16 (on AMX) or in f32 */
    int rounded = half == CH_BF16 && a->hd % 32 == 0 && chi_host_amx_bf16();
    int off = a->heads * a->hd, ld = 3 * off + 5, ldo = off + 3;
    size_t nqkv = (size_t)a->b * a->t * ld, no = (size_t)a->b * a->t * ldo,
           nl = (size_t)a->b * a->heads * a->t;
    float *qkv = malloc(nqkv * sizeof *qkv), *dqkv = malloc(nqkv * sizeof *dqkv),
          *o = malloc(no * sizeof *o), *dout = malloc(no * sizeof *dout),
          *lse = malloc(nl * sizeof *lse);
    double *ro = calloc(no, sizeof *ro), *rlse = calloc(nl, sizeof *rlse),
           *rd = calloc(nqkv, sizeof *rd);
    unsigned char *used_qkv = calloc(nqkv, 1), *used_o = calloc(no, 1), *used_l = malloc(nl);
    if (!qkv || !dqkv || !o || !dout || !lse || !ro || !rlse || !rd || !used_qkv || !used_o ||
        !used_l) {
        tap_ok(0, "malloc for attention at t=%d", a->t);
        goto out;
    }
    for (size_t i = 0; i < nqkv; i++) {
        qkv[i] = tap_rng_uniform(rng, -input_range, input_range);
        dqkv[i] = -3.0f;
    }
    for (size_t i = 0; i < no; i++) {
        dout[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
        o[i] = -3.0f;
    }
    memset(used_l, 1, nl);
    for (int m = 0; m < a->b * a->heads; m++)
        for (int i = 0; i < a->t; i++)
            for (int d = 0; d < a->hd; d++) {
                used_o[at(a, m, i, d, ldo)] = 1;
                for (int c = 0; c < 3; c++)
                    used_qkv[at(a, m, i, d, ld) + (size_t)c * off] = 1;
            }
    reference(a, qkv, ld, dout, ldo, rounded, ro, rlse, rd);
    chi_host_tile_prefer(isas[s]);
    chi_host_attention_whole_rows(whole_rows);
    float scale = 1.0f / sqrtf((float)a->hd);
    ch_status st =
        chi_host_attention(stream, a->b, a->heads, a->t, a->hd, scale, half, mem_of(o), ldo,
                           mem_of(lse), mem_of(qkv), mem_of(qkv + off), mem_of(qkv + 2 * off), ld);
    ch_status st2 =
        st != CH_OK
            ? st
            : chi_host_attention_backward(stream, a->b, a->heads, a->t, a->hd, scale, half,
                                          mem_of(dqkv), mem_of(dqkv + off), mem_of(dqkv + 2 * off),
                                          mem_of(qkv), mem_of(qkv + off), mem_of(qkv + 2 * off), ld,
                                          mem_of(dout), mem_of(o), ldo, mem_of(lse));
    chi_host_tile_prefer(CHI_TILE_AUTO);
    chi_host_attention_whole_rows(1);
    const char *via = !stream                                                   ? "no stream"
                      : atomic_load(&((chi_host_stream *)stream)->scratch_busy) ? "stream busy"
                                                                                : "stream scratch";
    const char *how = rounded           ? "bf16 on AMX"
                      : half == CH_BF16 ? "bf16 asked, f32"
                      : a->t > 512      ? "f32"
                      : whole_rows      ? "f32 by rows"
                                        : "f32 by tiles";
    if (st != CH_OK || st2 != CH_OK) {
        tap_ok(0, "attention in %s, %s (%s), b=%d heads=%d t=%d hd=%d: %s", isa_name[s], how, via,
               a->b, a->heads, a->t, a->hd, ch_last_error());
        goto out;
    }
    size_t touched_o, touched_l, touched_d;
    double eo = rel_error(o, ro, used_o, no, -3.0f, &touched_o);
    double el = rel_error(lse, rlse, used_l, nl, 0.0f, &touched_l);
    double ed = rel_error(dqkv, rd, used_qkv, nqkv, -3.0f, &touched_d);
    /* bf16: the reference rounds the same inputs, but the probabilities
     * at the final maximum (the kernel at the running one) and in double */
    double want_o = rounded ? RT_O : 2e-6, want_l = rounded ? RT_L : 2e-6,
           want_d = rounded ? RT_D : 5e-6;
    /* wider inputs: a score's own rounding (|s| 2^-24, 3e-5 at |s| 500)
     * moves its exponential by as much */
    if (input_range > 2.0f && !rounded)
        want_o = want_d = 1e-4;
    tap_ok(eo <= want_o && el <= want_l && touched_o == 0,
           "attention forward in %s, %s (%s), b=%d heads=%d t=%d hd=%d, inputs in [-%g, %g]: o "
           "within %.2g (want <= %.2g), lse within %.2g (want <= %.2g), %zu padding floats written",
           isa_name[s], how, via, a->b, a->heads, a->t, a->hd, input_range, input_range, eo, want_o,
           el, want_l, touched_o);
    tap_ok(ed <= want_d && touched_d == 0,
           "attention backward in %s, %s (%s), b=%d heads=%d t=%d hd=%d, inputs in [-%g, %g]: dq, "
           "dk, dv within %.2g (want <= %.2g), %zu padding floats written",
           isa_name[s], how, via, a->b, a->heads, a->t, a->hd, input_range, input_range, ed, want_d,
           touched_d);
out:
    free(qkv), free(dqkv), free(o), free(dout), free(lse), free(ro), free(rlse), free(rd);
    free(used_qkv), free(used_o), free(used_l);
}

/* ch_attention_packed_mixed's bf16 products: on AMX where the CPU has
 * it (against the reference that rounds the same inputs), and the f32
 * products where it has not, or is told not to use it, or the head size
 * is not a multiple of 32. */
static void test_bf16(tap_rng *rng)
{
    static const attn_shape shapes[] = {
        {1, 2, 64, 32}, {2, 2, 256, 64}, {1, 2, 130, 64},
        {1, 1, 33, 32}, {1, 1, 1, 32},   {2, 3, 100, 24},
    };
    chi_host_stream stream = {0};
    if (!chi_host_amx_bf16())
        tap_skip("attention's bf16 products on AMX: this CPU (or kernel) does not run AMX; "
                 "the f32 products stand in, checked below");
    /* the AMX kernel's row passes are its own (AVX-512, which a CPU with
     * AMX has); the f32 kernel's in the widest set this CPU runs */
    int s = chi_host_tile_isa(CHI_TILE_AUTO) == CHI_TILE_AVX512 ? 0
            : chi_host_tile_isa(CHI_TILE_AUTO) == CHI_TILE_AVX2 ? 1
                                                                : 2;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_attention(&shapes[i], s, &stream, CH_BF16, rng);
    chi_host_amx_prefer(0);
    test_attention(&shapes[1], s, &stream, CH_BF16, rng);
    chi_host_amx_prefer(1);
    free(stream.scratch);
}

/* Scores up to some 500 (inputs in [-8, 8], head size 64 scaled by 1/8):
 * every row of every tile must have its running maximum taken out, or
 * its exponentials overflow (a tile's rows past the eighth once kept 0
 * as their maximum: the results at [-2, 2] were right all the same). */
static void test_large_scores(tap_rng *rng)
{
    static const attn_shape shapes[] = {{1, 2, 130, 64}, {2, 1, 256, 64}};
    chi_host_stream stream = {0};
    input_range = 8.0f;
    for (whole_rows = 1; whole_rows >= 0; whole_rows--)
        for (int s = 0; s < NISA; s++)
            if (isas[s] == CHI_TILE_NONE || chi_host_tile_isa(isas[s]) != CHI_TILE_NONE)
                for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                    test_attention(&shapes[i], s, &stream, CH_F32, rng);
    whole_rows = 1;
    input_range = 2.0f;
    free(stream.scratch);
}

static void test_attentions(tap_rng *rng)
{
    static const attn_shape shapes[] = {
        {2, 3, 100, 24}, {1, 2, 64, 32}, {1, 1, 1, 8},
        {1, 2, 130, 64}, {3, 1, 17, 5},  {1, 1, 600, 32}, /* past the whole rows' 512: tiles */
    };
    chi_host_stream stream = {0};
    for (int s = 0; s < NISA; s++) {
        if (isas[s] != CHI_TILE_NONE && chi_host_tile_isa(isas[s]) == CHI_TILE_NONE) {
            tap_skip("attention in %s: this CPU does not run it", isa_name[s]);
            continue;
        }
        for (whole_rows = 1; whole_rows >= 0; whole_rows--)
            for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
                if (whole_rows || shapes[i].t <= 512)
                    test_attention(&shapes[i], s, &stream, CH_F32, rng);
        whole_rows = 1;
        test_attention(&shapes[0], s, NULL, CH_F32, rng);
    }
    /* The stream's memory grew to the largest shape's and was kept. */
    size_t kept = stream.scratch_bytes;
    void *mem = stream.scratch;
    test_attention(&shapes[1], 2, &stream, CH_F32, rng);
    tap_ok(stream.scratch == mem && stream.scratch_bytes == kept && kept > 0,
           "the stream keeps its scratch between calls (%zu bytes)", kept);
    /* In use (another thread's op on the stream): the op allocates apart. */
    atomic_store(&stream.scratch_busy, 1);
    test_attention(&shapes[0], 2, &stream, CH_F32, rng);
    tap_ok(stream.scratch == mem && atomic_load(&stream.scratch_busy) == 1,
           "while the stream's scratch is in use the op leaves it alone");
    atomic_store(&stream.scratch_busy, 0);
    free(stream.scratch);
    test_bf16(rng);
}

int main(void)
{
    tap_rng rng = {20261206};
    test_exp();
    test_row_edges(&rng);
    test_attentions(&rng);
    tap_rng rng_large = {20261207}; /* its own: the cases above keep their inputs */
    test_large_scores(&rng_large);
    return tap_done();
}
