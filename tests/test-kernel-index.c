/* lib/kernels/index.h compiled as C: the index width rule at its limit and
 * for a window op too large to run here, each function of both widths
 * against its definition by search over small geometries (the 32-bit and
 * 64-bit versions agreeing), the 64-bit versions on indices beyond 2^31,
 * and the permute plan against strides worked out by hand. */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>

#include "kernels/index.h"
#include "tap.h"

static void test_rule(void)
{
    tap_ok(chk_index_is_32(0) && chk_index_is_32(CHK_INDEX32_LIMIT - 1),
           "32-bit index math up to 2^30 - 1");
    tap_ok(!chk_index_is_32(CHK_INDEX32_LIMIT) && !chk_index_is_32(INT64_C(1) << 40),
           "64-bit index math from 2^30");
    /* The cnn's first layer at a batch of 64: input 64*3*224*224 (9.6e6), its
     * column matrix 3*7*7*64*112*112 (1.2e8): 32-bit. */
    chk_i64 small = chk_window_largest(64, 3, 224, 224, 112, 112, 7, 7);
    tap_ok(small == INT64_C(3) * 7 * 7 * 64 * 112 * 112 && chk_index_is_32(small),
           "window op [64,3,224,224], 7x7 to 112x112: largest %" PRId64 " (the column matrix), "
           "32-bit",
           small);
    /* [256,512,64,64] with a 3x3 window: the input (5.4e8) fits, the column
     * matrix (4.8e9) does not even fit in 32 bits unsigned. */
    chk_i64 big = chk_window_largest(256, 512, 64, 64, 64, 64, 3, 3);
    tap_ok(big == INT64_C(512) * 9 * 256 * 64 * 64 && !chk_index_is_32(big),
           "window op [256,512,64,64], 3x3 to 64x64: largest %" PRId64 ", 64-bit", big);
    /* Pooling 2x2 to a larger input than output: the input is the largest. */
    chk_i64 pool = chk_window_largest(1, 1, 1 << 16, 1 << 16, 1 << 15, 1 << 15, 2, 2);
    tap_ok(pool == INT64_C(1) << 32 && !chk_index_is_32(pool),
           "pooling [1,1,65536,65536] 2x2: largest 2^32, 64-bit");
}

/* Every function along one axis against its definition, both widths. */
static void test_axis(void)
{
    int64_t bad = 0, cases = 0;
    char first[200] = "";
    for (int64_t s = 1; s <= 3; s++)
        for (int64_t p = 0; p <= 2; p++)
            for (int64_t k = 1; k <= 4; k++)
                for (int64_t in = 1; in <= 9; in++) {
                    int64_t out = (in + 2 * p - k) / s + 1;
                    if (in + 2 * p < k)
                        continue;
                    for (int64_t y = 0; y < in; y++) {
                        /* Covering windows: o with o s - p <= y < o s - p + k. */
                        int64_t lo = -1, hi = -1;
                        for (int64_t o = 0; o < out; o++)
                            if (o * s - p <= y && y < o * s - p + k) {
                                lo = lo < 0 ? o : lo;
                                hi = o + 1;
                            }
                        if (lo < 0)
                            lo = hi = 0;
                        int32_t y32 = (int32_t)y, s32 = (int32_t)s, p32 = (int32_t)p;
                        int64_t l64 = chk_cover_lo_64(y, s, p, k);
                        int64_t h64 = chk_cover_hi_64(y, s, p, out);
                        int32_t l32 = chk_cover_lo_32(y32, s32, p32, (int32_t)k);
                        int32_t h32 = chk_cover_hi_32(y32, s32, p32, (int32_t)out);
                        int ok = l64 == l32 && h64 == h32 &&
                                 (l64 >= h64 ? lo == hi : l64 == lo && h64 == hi);
                        /* Each tap's source output: the o whose tap kk reads y
                         * (chk_tap_out inverts chk_tap_in). */
                        for (int64_t kk = 0; kk < k; kk++) {
                            int64_t want = -1;
                            for (int64_t o = 0; o < out; o++)
                                if (chk_tap_in_64(o, s, p, kk) == y &&
                                    chk_tap_in_32((int32_t)o, s32, p32, (int32_t)kk) == y32)
                                    want = o;
                            ok &= chk_tap_out_64(y, s, p, kk, out) == want &&
                                  chk_tap_out_32(y32, s32, p32, (int32_t)kk, (int32_t)out) == want;
                        }
                        cases++;
                        if (!ok && bad++ == 0)
                            snprintf(first, sizeof first,
                                     "s %" PRId64 " p %" PRId64 " k %" PRId64 " in %" PRId64
                                     " y %" PRId64 ": cover [%" PRId64 ", %" PRId64
                                     "), want [%" PRId64 ", %" PRId64 ")",
                                     s, p, k, in, y, l64, h64, lo, hi);
                    }
                }
    tap_ok(bad == 0,
           "chk_tap_out and chk_cover_lo/hi, 32 and 64 bits, against a search: "
           "%" PRId64 " of %" PRId64 " positions wrong%s%s",
           bad, cases, bad ? "; first " : "", first);
}

/* The 64-bit functions where 32 bits would wrap. */
static void test_wide(void)
{
    const int64_t y = (INT64_C(1) << 33) + 7;
    tap_ok(chk_tap_in_64(INT64_C(1) << 32, 2, 1, 2) == (INT64_C(1) << 33) + 1,
           "chk_tap_in_64 beyond 2^32");
    tap_ok(chk_tap_out_64(y, 2, 1, 0, INT64_C(1) << 40) == (y + 1) / 2 &&
               chk_tap_out_64(y, 2, 0, 0, INT64_C(1) << 40) == -1,
           "chk_tap_out_64 beyond 2^33");
    tap_ok(chk_cover_lo_64(y, 2, 1, 3) == (y - 1) / 2 &&
               chk_cover_hi_64(y, 2, 1, INT64_C(1) << 40) == (y + 1) / 2 + 1,
           "chk_cover_lo_64 and chk_cover_hi_64 beyond 2^33");
    /* The last element of a [2^17, 2^16] transpose: x's offset 2^33 - 1. */
    const chk_i64 shape[2] = {INT64_C(1) << 16, INT64_C(1) << 17};
    const chk_i64 stride[2] = {1, INT64_C(1) << 16};
    chk_i64 last = (INT64_C(1) << 33) - 1;
    tap_ok(chk_permute_src_64(last, 2, shape, stride) == last, "chk_permute_src_64 at 2^33 - 1");
}

/* The plan and the source of every element against strides by hand: x
 * [2, 3, 4, 5] permuted by (2, 0, 3, 1), both widths. */
static void test_permute(void)
{
    const chk_i64 xshape[4] = {2, 3, 4, 5};
    const int perm[4] = {2, 0, 3, 1};
    chk_i64 yshape[4], ystride[4];
    chk_i64 n = chk_permute_plan(4, xshape, perm, yshape, ystride);
    const chk_i64 want_shape[4] = {4, 2, 5, 3}, want_stride[4] = {5, 60, 1, 20};
    int ok = n == 120;
    for (int d = 0; d < 4; d++)
        ok &= yshape[d] == want_shape[d] && ystride[d] == want_stride[d];
    tap_ok(ok, "chk_permute_plan of [2,3,4,5] by (2,0,3,1): shape [4,2,5,3], strides (5,60,1,20)");
    chk_i32 s32[4], t32[4];
    for (int d = 0; d < 4; d++) {
        s32[d] = (chk_i32)yshape[d];
        t32[d] = (chk_i32)ystride[d];
    }
    int64_t bad = 0, i = 0;
    for (int64_t a = 0; a < 4; a++)
        for (int64_t b = 0; b < 2; b++)
            for (int64_t c = 0; c < 5; c++)
                for (int64_t e = 0; e < 3; e++, i++) {
                    /* y[a, b, c, e] = x[b, e, a, c] */
                    int64_t want = ((b * 3 + e) * 4 + a) * 5 + c;
                    bad += chk_permute_src_64(i, 4, yshape, ystride) != want ||
                           chk_permute_src_32((chk_i32)i, 4, s32, t32) != want;
                }
    tap_ok(bad == 0, "chk_permute_src, 32 and 64 bits: %" PRId64 " of 120 elements wrong", bad);
}

int main(void)
{
    test_rule();
    test_axis();
    test_wide();
    test_permute();
    return tap_done();
}
