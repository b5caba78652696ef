/* The ops that take bf16 and f16 tensors, on every device, against a
 * double-precision reference computed from the same half values.
 *
 * ch_gemm and ch_gemm_batched with half a and b (both transposes each,
 * beta 0 and 0.5, odd sizes) into an f32 c or a c of the inputs' format.
 * The inputs are exact in f32, so with f32 sums the only errors are the
 * sums' rounding, bounded as for f32 GEMM by 2e-5 of the sum of the terms'
 * magnitudes (test-ops' bound), and, for a half c, the one rounding of the
 * result to the format: half an ulp, 2^-(mantissa bits + 1) of the value
 * (bf16: 2^-8 = 3.9e-3, f16: 2^-11 = 4.9e-4). So an element passes when
 * |got - want| <= u |want| + 2e-5 (sum of |terms|), u 0 for an f32 c.
 * Then the dtype errors a caller can make. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

#define MAX_DEVICES 16

typedef struct fmt {
    const char *name;
    ch_dtype dtype;
    int mant;
} fmt;

static const fmt formats[] = {{"bf16", CH_BF16, 7}, {"f16", CH_F16, 10}};

static ch_device *host;

/* n random floats in [-1, 1] rounded to F (host casts, checked bit for bit
 * by test-cast): the half patterns and their exact f32 values. */
static ch_status make_half(const fmt *F, int64_t n, tap_rng *rng, uint16_t *bits, float *exact)
{
    float *f = malloc(sizeof(float) * (size_t)n);
    ch_tensor *x = NULL, *h = NULL;
    ch_status st = f ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; f && i < n; i++)
        f[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
    if (st == CH_OK)
        st = ch_tensor_new(&x, host, CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_new(&h, host, F->dtype, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_upload(x, f, sizeof(float) * (size_t)n);
    if (st == CH_OK)
        st = ch_cast(h, x);
    if (st == CH_OK)
        st = ch_tensor_download(h, bits, 2 * (size_t)n);
    if (st == CH_OK)
        st = ch_cast(x, h);
    if (st == CH_OK)
        st = ch_tensor_download(x, exact, sizeof(float) * (size_t)n);
    ch_tensor_free(x);
    ch_tensor_free(h);
    free(f);
    return st;
}

/* A tensor on dev of `dtype` holding `bits` (half) or `vals` (f32). */
static ch_status tensor_of(ch_tensor **t, ch_device *dev, ch_dtype dtype, int ndim,
                           const int64_t *shape, const uint16_t *bits, const float *vals)
{
    ch_status st = ch_tensor_new(t, dev, dtype, ndim, shape);
    if (st == CH_OK)
        st = dtype == CH_F32 ? ch_tensor_upload(*t, vals, ch_tensor_nbytes(*t))
                             : ch_tensor_upload(*t, bits, ch_tensor_nbytes(*t));
    return st;
}

/* c's values as f32 on the host. */
static ch_status values_of(const ch_tensor *c, float *out)
{
    if (ch_tensor_dtype(c) == CH_F32)
        return ch_tensor_download(c, out, ch_tensor_nbytes(c));
    int64_t n = ch_tensor_numel(c);
    ch_tensor *on_host = NULL, *wide = NULL;
    ch_status st = ch_tensor_to(&on_host, c, host);
    if (st == CH_OK)
        st = ch_tensor_new(&wide, host, CH_F32, 1, &n);
    if (st == CH_OK) {
        ch_tensor *flat = NULL;
        st = ch_tensor_reshape(&flat, on_host, 1, &n);
        if (st == CH_OK)
            st = ch_cast(wide, flat);
        ch_tensor_free(flat);
    }
    if (st == CH_OK)
        st = ch_tensor_download(wide, out, sizeof(float) * (size_t)n);
    ch_tensor_free(on_host);
    ch_tensor_free(wide);
    return st;
}

/* One product on dev: `count` matrices (0: ch_gemm, 2-D), op(a) [m, k],
 * op(b) [k, n], c of `cd`, beta. */
static void gemm_case(ch_device *dev, const fmt *F, ch_dtype cd, int count, int ta, int tb,
                      int64_t m, int64_t n, int64_t k, float beta, tap_rng *rng)
{
    const char *id = ch_device_id(dev);
    int64_t batch = count ? count : 1;
    int64_t na = batch * m * k, nb = batch * k * n, nc = batch * m * n;
    uint16_t *abits = malloc(2 * na), *bbits = malloc(2 * nb), *cbits = malloc(2 * nc);
    float *av = malloc(4 * na), *bv = malloc(4 * nb), *c0 = malloc(4 * nc),
          *got = malloc(4 * nc);
    ch_tensor *a = NULL, *b = NULL, *c = NULL;
    ch_status st = abits && bbits && cbits && av && bv && c0 && got ? CH_OK
                                                                    : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = make_half(F, na, rng, abits, av);
    if (st == CH_OK)
        st = make_half(F, nb, rng, bbits, bv);
    if (st == CH_OK)
        st = make_half(F, nc, rng, cbits, c0); /* c0 exact in either dtype */
    int64_t sa[3] = {batch, ta ? k : m, ta ? m : k}, sb[3] = {batch, tb ? n : k, tb ? k : n},
            sc[3] = {batch, m, n};
    int nd = count ? 3 : 2, off = count ? 0 : 1;
    if (st == CH_OK)
        st = tensor_of(&a, dev, F->dtype, nd, sa + off, abits, NULL);
    if (st == CH_OK)
        st = tensor_of(&b, dev, F->dtype, nd, sb + off, bbits, NULL);
    if (st == CH_OK)
        st = tensor_of(&c, dev, cd, nd, sc + off, cbits, c0);
    if (st == CH_OK)
        st = count ? ch_gemm_batched(c, ta, tb, 1.0f, a, b, beta)
                   : ch_gemm(c, ta, tb, 1.0f, a, b, beta);
    if (st == CH_OK)
        st = values_of(c, got);
    double u = cd == CH_F32 ? 0.0 : ldexp(1.0, -(F->mant + 1)), worst = 0.0;
    int64_t bad = 0;
    for (int64_t q = 0; st == CH_OK && q < batch; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double sum = beta * (double)c0[(q * m + i) * n + j];
                double mag = fabs(sum);
                for (int64_t p = 0; p < k; p++) {
                    double x = av[q * m * k + (ta ? p * m + i : i * k + p)];
                    double y = bv[q * k * n + (tb ? j * k + p : p * n + j)];
                    sum += x * y;
                    mag += fabs(x * y);
                }
                double g = got[(q * m + i) * n + j], err = fabs(g - sum);
                double bound = u * fabs(sum) + 2e-5 * mag;
                if (!(err <= bound))
                    bad++;
                if (!(err / (mag + 1e-30) <= worst))
                    worst = err / (mag + 1e-30);
            }
    const char *op = count ? "ch_gemm_batched" : "ch_gemm";
    if (tap_status_ok(st, "%s: %s %s x %s -> %s%s%s, %lld x %lld x %lld (x%d), beta %g", id, op,
                      F->name, F->name, ch_dtype_name(cd), ta ? " a^T" : "", tb ? " b^T" : "",
                      (long long)m, (long long)n, (long long)k, (int)batch, beta))
        tap_ok(bad == 0, "%s: ... every element within u |want| + 2e-5 sum|terms| (u = %g; %lld "
               "outside; the largest error is %.2g of sum|terms|)",
               id, u, (long long)bad, worst);
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_tensor_free(c);
    free(abits), free(bbits), free(cbits), free(av), free(bv), free(c0), free(got);
}

static void test_device(ch_device *dev, tap_rng *rng)
{
    for (int f = 0; f < 2; f++) {
        const fmt *F = &formats[f];
        for (int t = 0; t < 4; t++)
            gemm_case(dev, F, CH_F32, 0, t >> 1, t & 1, 37, 29, 41, t == 3 ? 0.5f : 0.0f, rng);
        gemm_case(dev, F, F->dtype, 0, 0, 1, 33, 40, 64, 0.0f, rng);
        gemm_case(dev, F, F->dtype, 0, 1, 0, 20, 17, 50, 0.5f, rng);
        gemm_case(dev, F, CH_F32, 3, 0, 1, 17, 19, 23, 0.0f, rng);
        gemm_case(dev, F, CH_F32, 4, 1, 0, 16, 16, 32, 0.5f, rng);
        gemm_case(dev, F, F->dtype, 2, 0, 0, 9, 31, 12, 0.0f, rng);
    }
}

static void test_errors(ch_device *dev)
{
    int64_t s[2] = {4, 4};
    ch_tensor *f = NULL, *bf = NULL, *h = NULL, *i = NULL, *c = NULL;
    ch_status st = ch_tensor_new(&f, dev, CH_F32, 2, s);
    if (st == CH_OK)
        st = ch_tensor_new(&bf, dev, CH_BF16, 2, s);
    if (st == CH_OK)
        st = ch_tensor_new(&h, dev, CH_F16, 2, s);
    if (st == CH_OK)
        st = ch_tensor_new(&i, dev, CH_I32, 2, s);
    if (st == CH_OK)
        st = ch_tensor_new(&c, dev, CH_F32, 2, s);
    if (!tap_status_ok(st, "%s: tensors for the error cases", ch_device_id(dev)))
        goto out;
    tap_status_is(ch_gemm(c, 0, 0, 1.0f, bf, h, 0.0f), CH_ERR_DTYPE, "expected the same dtype",
                  "%s: ch_gemm of bf16 by f16 is refused", ch_device_id(dev));
    tap_status_is(ch_gemm(c, 0, 0, 1.0f, f, bf, 0.0f), CH_ERR_DTYPE, "expected the same dtype",
                  "%s: ch_gemm of f32 by bf16 is refused", ch_device_id(dev));
    tap_status_is(ch_gemm(h, 0, 0, 1.0f, bf, bf, 0.0f), CH_ERR_DTYPE, "expected f32 or a's",
                  "%s: ch_gemm of bf16 into f16 is refused", ch_device_id(dev));
    tap_status_is(ch_gemm(bf, 0, 0, 1.0f, f, f, 0.0f), CH_ERR_DTYPE, "expected f32 or a's",
                  "%s: ch_gemm of f32 into bf16 is refused", ch_device_id(dev));
    tap_status_is(ch_gemm(c, 0, 0, 1.0f, i, i, 0.0f), CH_ERR_DTYPE, "expected f32, bf16 or f16",
                  "%s: ch_gemm of i32 is refused", ch_device_id(dev));
out:
    ch_tensor_free(f);
    ch_tensor_free(bf);
    ch_tensor_free(h);
    ch_tensor_free(i);
    ch_tensor_free(c);
}

int main(void)
{
    if (ch_init() != CH_OK) {
        tap_skip_all("ch_init failed: %s", ch_last_error());
        return 0;
    }
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES);
    if (ch_device_by_name(&host, "host") != CH_OK) {
        tap_skip_all("no host device: %s", ch_last_error());
        return 0;
    }
    tap_rng rng = {20261201};
    for (int d = 0; d < ndev; d++) {
        test_device(devs[d], &rng);
        test_errors(devs[d]);
    }
    ch_shutdown();
    return tap_done();
}
