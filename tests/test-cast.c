/* ch_cast: f32 to bf16 and f16 and back, bit for bit on every device,
 * against a reference that rounds in double arithmetic (not the library's
 * bit steps): every 16-bit pattern widened; narrowed, every value a 16-bit
 * format can hold, every midpoint between two neighbours (the ties) and a
 * float on either side of it, the specials (zeros, infinities, NaNs with
 * payloads, f32 subnormals, the overflow edges) and a million random
 * bit patterns (4096 under CHORUS_TEST_SIZES=small). The same inputs
 * through the library's rounding to bf16 kept in 32 bits
 * (lib/kernels/half_bits.h, for the host's bf16 sums). Then the errors a
 * caller can make. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/half_bits.h" /* chk_f32_round_bf16, which the host's bf16 sums use */
#include "ref.h"  /* tc_small */
#include "tap.h"

#define MAX_DEVICES 16

/* A 16-bit format: its mantissa bits (tap_half_narrow's). */
typedef struct fmt {
    const char *name;
    ch_dtype dtype;
    int mant;
} fmt;

static const fmt formats[] = {{"bf16", CH_BF16, 7}, {"f16", CH_F16, 10}};

/* The floats to narrow (small sizes, CHORUS_TEST_SIZES: 4096 random bit
 * patterns rather than a million). */
static float *inputs(const fmt *F, size_t *count)
{
    size_t cap = 65536 * 4 + 64 + (tc_small() ? 4096u : 1u << 20), n = 0;
    float *v = malloc(cap * sizeof *v);
    if (!v)
        return NULL;
    for (uint32_t h = 0; h < 65536; h++) {
        float a = tap_float_of(tap_half_widen(F->mant, (uint16_t)h));
        v[n++] = a;
        float b = tap_float_of(tap_half_widen(F->mant, (uint16_t)(h + 1)));
        /* Neighbours of one sign, both finite: their midpoint, a tie, and
         * the floats on either side of it. */
        if ((h & 0x7fffu) != 0x7fffu && isfinite(a) && isfinite(b) &&
            (h >> 15) == ((h + 1) >> 15)) {
            float mid = (float)(((double)a + (double)b) / 2);
            v[n++] = mid;
            v[n++] = nextafterf(mid, INFINITY);
            v[n++] = nextafterf(mid, -INFINITY);
        }
    }
    static const uint32_t specials[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u,
        0x7f800001u, 0xff800001u, 0x7fa00001u, 0x7fffffffu, 0xffffffffu, 0x7f7fffffu,
        0xff7fffffu, 0x00000001u, 0x80000001u, 0x007fffffu, 0x00400000u, 0x00800000u,
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u, 0x33000000u,
        0x33000001u, 0x32ffffffu, 0x387fc000u, 0x387fe000u, 0x387fffffu, 0x38800000u,
        0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f800001u, 0x7f7f8000u, 0x7f7f7fffu};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
        v[n++] = tap_float_of(specials[i]);
    tap_rng rng = {F->mant};
    while (n < cap)
        v[n++] = tap_float_of((uint32_t)tap_rng_next(&rng));
    *count = n;
    return v;
}

static void test_device(ch_device *dev, const fmt *F)
{
    const char *id = ch_device_id(dev);
    size_t n = 0;
    float *in = inputs(F, &n);
    uint16_t *half = malloc(n * sizeof *half), *pattern = malloc(65536 * sizeof *pattern);
    uint32_t *wide = malloc(65536 * sizeof *wide);
    ch_tensor *x = NULL, *y = NULL, *h = NULL, *w = NULL;
    int64_t len = (int64_t)n, all = 65536;
    ch_status st = in && half && pattern && wide ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_tensor_new(&x, dev, CH_F32, 1, &len);
    if (st == CH_OK)
        st = ch_tensor_new(&y, dev, F->dtype, 1, &len);
    if (st == CH_OK)
        st = ch_tensor_upload(x, in, n * sizeof *in);
    if (st == CH_OK)
        st = ch_cast(y, x);
    if (st == CH_OK)
        st = ch_tensor_download(y, half, n * sizeof *half);
    size_t bad = 0, first = 0;
    for (size_t i = 0; st == CH_OK && i < n; i++)
        if (half[i] != tap_half_narrow(F->mant, in[i]) && bad++ == 0)
            first = i;
    if (tap_status_ok(st, "%s: f32 to %s of %zu floats", id, F->name, n))
        tap_ok(bad == 0, "%s: f32 to %s bit for bit (%zu wrong; the first: 0x%08x gave 0x%04x, "
               "want 0x%04x)", id, F->name, bad, bad ? tap_bits_of(in[first]) : 0,
               bad ? half[first] : 0, bad ? tap_half_narrow(F->mant, in[first]) : 0);

    for (uint32_t k = 0; k < 65536; k++)
        pattern[k] = (uint16_t)k;
    if (st == CH_OK)
        st = ch_tensor_new(&h, dev, F->dtype, 1, &all);
    if (st == CH_OK)
        st = ch_tensor_new(&w, dev, CH_F32, 1, &all);
    if (st == CH_OK)
        st = ch_tensor_upload(h, pattern, 65536 * sizeof *pattern);
    if (st == CH_OK)
        st = ch_cast(w, h);
    if (st == CH_OK)
        st = ch_tensor_download(w, wide, 65536 * sizeof *wide);
    bad = 0;
    for (uint32_t k = 0; st == CH_OK && k < 65536; k++)
        if (wide[k] != tap_half_widen(F->mant, (uint16_t)k) && bad++ == 0)
            first = k;
    if (tap_status_ok(st, "%s: %s to f32 of all 65536 patterns", id, F->name))
        tap_ok(bad == 0, "%s: %s to f32 bit for bit (%zu wrong; the first: 0x%04zx gave "
               "0x%08x, want 0x%08x)", id, F->name, bad, bad ? first : 0,
               bad ? wide[first] : 0, bad ? tap_half_widen(F->mant, (uint16_t)first) : 0);

    /* A view at an odd element: the offsets of both widths. */
    ch_tensor *vx = NULL, *vy = NULL;
    if (st == CH_OK)
        st = ch_tensor_view(&vx, x, 7, 1000);
    if (st == CH_OK)
        st = ch_tensor_view(&vy, y, 3, 1000);
    if (st == CH_OK)
        st = ch_fill(x, 0.0);
    if (st == CH_OK)
        st = ch_tensor_upload(vx, in, 1000 * sizeof *in);
    if (st == CH_OK)
        st = ch_cast(vy, vx);
    if (st == CH_OK)
        st = ch_tensor_download(vy, half, 1000 * sizeof *half);
    bad = 0;
    for (size_t i = 0; st == CH_OK && i < 1000; i++)
        bad += half[i] != tap_half_narrow(F->mant, in[i]);
    if (tap_status_ok(st, "%s: f32 to %s between views at elements 7 and 3", id, F->name))
        tap_ok(bad == 0, "%s: ... every element where it belongs (%zu wrong)", id, bad);
    ch_tensor_free(vx);
    ch_tensor_free(vy);
    ch_tensor_free(x);
    ch_tensor_free(y);
    ch_tensor_free(h);
    ch_tensor_free(w);
    free(in);
    free(half);
    free(pattern);
    free(wide);
}

/* chk_f32_round_bf16(u): the reference's bf16 pattern widened, bit for bit. */
static void test_round_in_place(void)
{
    size_t n = 0;
    float *in = inputs(&formats[0], &n);
    if (!in) {
        tap_ok(0, "out of memory");
        return;
    }
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t want = tap_half_widen(formats[0].mant, tap_half_narrow(formats[0].mant, in[i]));
        if (chk_f32_round_bf16(tap_bits_of(in[i])) != want && bad++ == 0)
            first = i;
    }
    tap_ok(bad == 0,
           "chk_f32_round_bf16 over %zu floats: the bf16 rounding, widened, bit for "
           "bit (%zu differ; first 0x%08x)",
           n, bad, bad ? tap_bits_of(in[first]) : 0u);
    free(in);
}

static void test_errors(ch_device *host, ch_device *other)
{
    int64_t four = 4, five = 5;
    ch_tensor *f = NULL, *g = NULL, *b = NULL, *b5 = NULL, *i = NULL, *o = NULL;
    ch_tensor_new(&f, host, CH_F32, 1, &four);
    ch_tensor_new(&g, host, CH_F32, 1, &four);
    ch_tensor_new(&b, host, CH_BF16, 1, &four);
    ch_tensor_new(&b5, host, CH_BF16, 1, &five);
    ch_tensor_new(&i, host, CH_I32, 1, &four);
    tap_status_is(ch_cast(NULL, f), CH_ERR_INVALID_ARGUMENT, "y is NULL", "ch_cast(NULL, x)");
    tap_status_is(ch_cast(b, NULL), CH_ERR_INVALID_ARGUMENT, "x is NULL", "ch_cast(y, NULL)");
    tap_status_is(ch_cast(g, f), CH_ERR_DTYPE, "from f32 to f32", "ch_cast from f32 to f32");
    tap_status_is(ch_cast(b, i), CH_ERR_DTYPE, "from i32 to bf16", "ch_cast from i32 to bf16");
    tap_status_is(ch_cast(b5, f), CH_ERR_SHAPE, "5 elements", "ch_cast of 4 elements into 5");
    tap_status_is(ch_cast(f, f), CH_ERR_INVALID_ARGUMENT, "overlaps",
                  "ch_cast of a tensor onto itself");
    if (other && ch_tensor_new(&o, other, CH_F16, 1, &four) == CH_OK)
        tap_status_is(ch_cast(o, f), CH_ERR_DEVICE_MISMATCH, "is on",
                      "ch_cast between devices (%s, host)", ch_device_id(other));
    else
        tap_skip("no second device: ch_cast between devices not tried");
    ch_tensor_free(f);
    ch_tensor_free(g);
    ch_tensor_free(b);
    ch_tensor_free(b5);
    ch_tensor_free(i);
    ch_tensor_free(o);
}

int main(void)
{
    tc_small();
    ch_status st = ch_init();
    if (!tap_status_ok(st, "ch_init"))
        return tap_done();
    ch_device *devs[MAX_DEVICES];
    int n = tap_devices(devs, MAX_DEVICES);
    for (int d = 0; d < n; d++)
        for (size_t k = 0; k < sizeof formats / sizeof formats[0]; k++)
            test_device(devs[d], &formats[k]);
    ch_device *host = NULL;
    ch_device_by_name(&host, "host");
    test_round_in_place();
    test_errors(host, n > 1 && devs[1] != host ? devs[1] : NULL);
    ch_shutdown();
    return tap_done();
}
