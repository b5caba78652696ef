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
 *
 * The ops that take half storage and compute in f32 (elementwise,
 * activations, bias, sums, softmax, LayerNorm, BatchNorm): on each device,
 * given tensors in a half format (and some in f32 beside them), against
 * the host's f32 op on the same (exact) values, whose result the device
 * must give rounded once to the output's format: |got - want| <= u |want|
 * + 1e-5 max|want|, u half an ulp of the output's format as above (0 for
 * an f32 output), 1e-5 the f32 ops' agreement across devices (test-ops).
 *
 * ch_conv2d and ch_conv2d_backward with half x, w and dy (f32 outputs,
 * dw with beta 0.5), strided, padded and not: the same bound as the GEMM's
 * for an f32 c (the products of half values are exact in f32, so the sums'
 * rounding is the only error), 2e-5 of the sum of the terms' magnitudes,
 * against test-ops' double-precision convolution of the same values. On the
 * host with oneDNN, bf16 runs oneDNN's bf16 convolution (AMX here; see
 * test-host-conv); elsewhere the core widens the inputs on the device.
 *
 * Mixed precision in attention (ch_module_set_precision on a causal
 * self-attention, on each device): forward against a reference computed
 * here in double sums that rounds the inputs of all four products to bf16
 * (the two Linears' and the two batched ones, as autocast does): closer
 * to it by 8 times at least than to the reference that rounds only the
 * Linears' (a device's f32 sums may flip the odd bf16 rounding of an
 * intermediate, so not bit for bit); backward's gradients against the
 * f32 module's within 3e-2 of their largest (a few bf16 roundings of
 * 2^-9 in a row), and other bits than f32's.
 *
 * Then the dtype errors a caller can make. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ref.h"
#include "stamp.h"
#include "tap.h"

#define MAX_DEVICES 16

typedef struct fmt {
    const char *name;
    ch_dtype dtype;
    int mant;
} fmt;

static const fmt formats[] = {{"bf16", CH_BF16, 7}, {"f16", CH_F16, 10}};

static ch_device *host;

/* vals rounded to F in place (host casts, checked bit for bit by
 * test-cast), their half patterns in bits. */
static ch_status round_to(const fmt *F, int64_t n, float *vals, uint16_t *bits)
{
    ch_tensor *x = NULL, *h = NULL;
    ch_status st = ch_tensor_new(&x, host, CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_new(&h, host, F->dtype, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_upload(x, vals, sizeof(float) * (size_t)n);
    if (st == CH_OK)
        st = ch_cast(h, x);
    if (st == CH_OK)
        st = ch_tensor_download(h, bits, 2 * (size_t)n);
    if (st == CH_OK)
        st = ch_cast(x, h);
    if (st == CH_OK)
        st = ch_tensor_download(x, vals, sizeof(float) * (size_t)n);
    ch_tensor_free(x);
    ch_tensor_free(h);
    return st;
}

/* n random floats in [-1, 1] rounded to F: the half patterns and their
 * exact f32 values. */
static ch_status make_half(const fmt *F, int64_t n, tap_rng *rng, uint16_t *bits, float *exact)
{
    for (int64_t i = 0; i < n; i++)
        exact[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
    return round_to(F, n, exact, bits);
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
 * op(b) [k, n], c of `cd`, beta. With bias (count 0, beta 0): ch_gemm_bias
 * with a random f32 bias [n]; into an f32 c also against ch_gemm then
 * ch_bias_add, bit for bit. Into a half c the product plus the bias is
 * rounded once, fused (CUDA's cuBLASLt epilogue) or not (an f32 product,
 * then the bias added into c), so the bound is the one rounding's, u
 * |want| + 2e-5 sum|terms|: ch_gemm into the half c then ch_bias_add,
 * which rounds twice, would fail it where the roundings add up. */
static void gemm_case(ch_device *dev, const fmt *F, ch_dtype cd, int count, int ta, int tb,
                      int64_t m, int64_t n, int64_t k, float beta, int bias, tap_rng *rng)
{
    const char *id = ch_device_id(dev);
    int64_t batch = count ? count : 1;
    int64_t na = batch * m * k, nb = batch * k * n, nc = batch * m * n;
    uint16_t *abits = malloc(2 * na), *bbits = malloc(2 * nb), *cbits = malloc(2 * nc);
    float *av = malloc(4 * na), *bv = malloc(4 * nb), *c0 = malloc(4 * nc),
          *got = malloc(4 * nc);
    float *bias_v = malloc(4 * n), *plain = malloc(4 * nc);
    ch_tensor *a = NULL, *b = NULL, *c = NULL, *tbias = NULL;
    ch_status st = abits && bbits && cbits && av && bv && c0 && got && bias_v && plain
                       ? CH_OK
                       : CH_ERR_OUT_OF_MEMORY;
    for (int64_t j = 0; st == CH_OK && j < n; j++)
        bias_v[j] = bias ? tap_rng_uniform(rng, -1.0f, 1.0f) : 0.0f;
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
    if (st == CH_OK && bias)
        st = tensor_of(&tbias, dev, CH_F32, 1, &n, NULL, bias_v);
    int64_t differ = 0;
    if (st == CH_OK && bias) {
        /* ch_gemm then ch_bias_add first, into the same c */
        st = ch_gemm(c, ta, tb, 1.0f, a, b, 0.0f);
        if (st == CH_OK)
            st = ch_bias_add(c, c, tbias, 1);
        if (st == CH_OK)
            st = values_of(c, plain);
        if (st == CH_OK)
            st = ch_gemm_bias(c, ta, tb, 1.0f, a, b, tbias);
    } else if (st == CH_OK) {
        st = count ? ch_gemm_batched(c, ta, tb, 1.0f, a, b, beta)
                   : ch_gemm(c, ta, tb, 1.0f, a, b, beta);
    }
    if (st == CH_OK)
        st = values_of(c, got);
    for (int64_t i = 0; st == CH_OK && bias && cd == CH_F32 && i < nc; i++)
        differ += memcmp(&got[i], &plain[i], sizeof *got) != 0;
    double u = cd == CH_F32 ? 0.0 : ldexp(1.0, -(F->mant + 1)), worst = 0.0;
    int64_t bad = 0;
    for (int64_t q = 0; st == CH_OK && q < batch; q++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                double prod = beta * (double)c0[(q * m + i) * n + j], mag = fabs(prod);
                for (int64_t p = 0; p < k; p++) {
                    double x = av[q * m * k + (ta ? p * m + i : i * k + p)];
                    double y = bv[q * k * n + (tb ? j * k + p : p * n + j)];
                    prod += x * y;
                    mag += fabs(x * y);
                }
                double sum = prod + bias_v[j];
                mag += fabs(bias_v[j]);
                int64_t at = (q * m + i) * n + j;
                double g = got[at], err = fabs(g - sum);
                if (!(err <= u * fabs(sum) + 2e-5 * mag))
                    bad++;
                if (!(err / (mag + 1e-30) <= worst))
                    worst = err / (mag + 1e-30);
            }
    const char *op = count ? "ch_gemm_batched" : bias ? "ch_gemm_bias" : "ch_gemm";
    if (tap_status_ok(st, "%s: %s %s x %s -> %s%s%s, %lld x %lld x %lld (x%d), beta %g", id, op,
                      F->name, F->name, ch_dtype_name(cd), ta ? " a^T" : "", tb ? " b^T" : "",
                      (long long)m, (long long)n, (long long)k, (int)batch, beta))
        tap_ok(bad == 0,
               "%s: ... every element within u |want| + 2e-5 sum|terms| (u = %g; %lld "
               "outside; the largest error is %.2g of sum|terms|)",
               id, u, (long long)bad, worst);
    if (st == CH_OK && bias && cd == CH_F32)
        tap_ok(differ == 0, "%s: ... the same bits as ch_gemm then ch_bias_add (%lld differ)", id,
               (long long)differ);
    ch_tensor_free(tbias);
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_tensor_free(c);
    free(abits), free(bbits), free(cbits), free(av), free(bv), free(c0), free(got);
    free(bias_v), free(plain);
}

static void conv_case(ch_device *dev, const fmt *F, int64_t n, int64_t c, int64_t h, int64_t w,
                      int64_t o, const ch_window2d *win, tap_rng *rng);

static void test_device(ch_device *dev, tap_rng *rng)
{
    static const ch_window2d same3 = {3, 3, 1, 1, 1, 1}, down3 = {3, 3, 2, 2, 1, 1},
                             one = {1, 1, 2, 2, 0, 0}, odd = {5, 3, 2, 1, 0, 2};
    /* Small sizes (CHORUS_TEST_SIZES): half the channels, smaller planes. */
    int small = tc_small();
    int64_t c1 = small ? 4 : 8, c2 = small ? 8 : 16, hw = small ? 10 : 14;
    for (int f = 0; f < 2; f++) {
        const fmt *F = &formats[f];
        conv_case(dev, F, small ? 2 : 3, c1, 12, 12, 2 * c1, &same3, rng);
        conv_case(dev, F, 2, c2, hw, hw, 2 * c2, &down3, rng);
        conv_case(dev, F, 2, c2, hw, hw, 2 * c2, &one, rng);
        conv_case(dev, F, 2, 3, 7, 8, 4, &odd, rng);
        for (int t = 0; t < 4; t++)
            gemm_case(dev, F, CH_F32, 0, t >> 1, t & 1, 37, 29, 41, t == 3 ? 0.5f : 0.0f, 0, rng);
        gemm_case(dev, F, F->dtype, 0, 0, 1, 33, 40, 64, 0.0f, 0, rng);
        gemm_case(dev, F, F->dtype, 0, 1, 0, 20, 17, 50, 0.5f, 0, rng);
        gemm_case(dev, F, CH_F32, 3, 0, 1, 17, 19, 23, 0.0f, 0, rng);
        gemm_case(dev, F, CH_F32, 4, 1, 0, 16, 16, 32, 0.5f, 0, rng);
        gemm_case(dev, F, F->dtype, 2, 0, 0, 9, 31, 12, 0.0f, 0, rng);
        /* B transposed with n an odd multiple of 256 and k at most 768:
         * the host reorders B into oneDNN's own layout (dnnl_matmul.c). */
        gemm_case(dev, F, CH_F32, 0, 0, 1, 19, 256, 72, 0.5f, 0, rng);
        gemm_case(dev, F, F->dtype, 0, 1, 1, 24, 768, 40, 0.0f, 0, rng);
        /* with a bias: a Linear's forward (x W^T) and the other layouts */
        gemm_case(dev, F, CH_F32, 0, 0, 1, 64, 256, 48, 0.0f, 1, rng);
        gemm_case(dev, F, CH_F32, 0, 0, 1, 24, 768, 40, 0.0f, 1, rng);
        gemm_case(dev, F, CH_F32, 0, 1, 0, 37, 29, 41, 0.0f, 1, rng);
        /* ... into a c of the inputs' format */
        gemm_case(dev, F, F->dtype, 0, 0, 1, 64, 256, 48, 0.0f, 1, rng);
        gemm_case(dev, F, F->dtype, 0, 1, 0, 37, 29, 41, 0.0f, 1, rng);
        gemm_case(dev, F, F->dtype, 0, 1, 1, 24, 768, 40, 0.0f, 1, rng);
    }
}

/* ---- the convolution with half inputs --------------------------------- */

static void conv_case(ch_device *dev, const fmt *F, int64_t n, int64_t c, int64_t h, int64_t w,
                      int64_t o, const ch_window2d *win, tap_rng *rng)
{
    const char *id = ch_device_id(dev);
    ref_geom g = ref_geom_make(n, c, h, w, win);
    int64_t nx = n * c * h * w, nw = o * c * win->kh * win->kw, ny = n * o * g.oh * g.ow;
    int64_t xs[4] = {n, c, h, w}, ws[4] = {o, c, win->kh, win->kw}, ys[4] = {n, o, g.oh, g.ow};
    uint16_t *bx = malloc(2 * nx), *bw = malloc(2 * nw), *bdy = malloc(2 * ny);
    float *x = malloc(4 * nx), *wt = malloc(4 * nw), *dy = malloc(4 * ny), *dw0 = malloc(4 * nw),
          *ax = malloc(4 * nx), *aw = malloc(4 * nw), *ady = malloc(4 * ny),
          *y = malloc(4 * ny), *dx = malloc(4 * nx), *dw = malloc(4 * nw),
          *dx1 = malloc(4 * nx), *dw1 = malloc(4 * nw);
    double *want_y = malloc(8 * ny), *mag_y = malloc(8 * ny), *want_dx = malloc(8 * nx),
           *mag_dx = malloc(8 * nx), *want_dw = malloc(8 * nw), *mag_dw = malloc(8 * nw);
    ch_tensor *tx = NULL, *tw = NULL, *tdy = NULL, *ty = NULL, *tdx = NULL, *tdw = NULL,
              *tdx1 = NULL, *tdw1 = NULL;
    ch_status st = bx && bw && bdy && x && wt && dy && dw0 && ax && aw && ady && y && dx && dw &&
                           dx1 && dw1 &&
                           want_y && mag_y && want_dx && mag_dx && want_dw && mag_dw
                       ? CH_OK
                       : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = make_half(F, nx, rng, bx, x);
    if (st == CH_OK)
        st = make_half(F, nw, rng, bw, wt);
    if (st == CH_OK)
        st = make_half(F, ny, rng, bdy, dy);
    for (int64_t i = 0; st == CH_OK && i < nw; i++)
        dw0[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
    if (st == CH_OK)
        st = tensor_of(&tx, dev, F->dtype, 4, xs, bx, NULL);
    if (st == CH_OK)
        st = tensor_of(&tw, dev, F->dtype, 4, ws, bw, NULL);
    if (st == CH_OK)
        st = tensor_of(&tdy, dev, F->dtype, 4, ys, bdy, NULL);
    if (st == CH_OK)
        st = ch_tensor_new(&ty, dev, CH_F32, 4, ys);
    if (st == CH_OK)
        st = ch_tensor_new(&tdx, dev, CH_F32, 4, xs);
    if (st == CH_OK)
        st = tensor_of(&tdw, dev, CH_F32, 4, ws, NULL, dw0);
    if (st == CH_OK)
        st = ch_conv2d(ty, tx, tw, win);
    if (st == CH_OK)
        st = ch_conv2d_backward(tdx, tdw, tdy, tx, tw, win, 0.5f);
    if (st == CH_OK)
        st = ch_tensor_download(ty, y, 4 * (size_t)ny);
    if (st == CH_OK)
        st = ch_tensor_download(tdx, dx, 4 * (size_t)nx);
    if (st == CH_OK)
        st = ch_tensor_download(tdw, dw, 4 * (size_t)nw);
    /* One gradient at a time (widened, the core reads x only for dw and w
     * only for dx). */
    if (st == CH_OK)
        st = ch_tensor_new(&tdx1, dev, CH_F32, 4, xs);
    if (st == CH_OK)
        st = tensor_of(&tdw1, dev, CH_F32, 4, ws, NULL, dw0);
    if (st == CH_OK)
        st = ch_conv2d_backward(tdx1, NULL, tdy, tx, tw, win, 0.0f);
    if (st == CH_OK)
        st = ch_conv2d_backward(NULL, tdw1, tdy, tx, tw, win, 0.5f);
    if (st == CH_OK)
        st = ch_tensor_download(tdx1, dx1, 4 * (size_t)nx);
    if (st == CH_OK)
        st = ch_tensor_download(tdw1, dw1, 4 * (size_t)nw);
    if (tap_status_ok(st, "%s: ch_conv2d and its backward, %s x [%lld, %lld, %lld, %lld], "
                      "w [%lld, %lld, %d, %d], stride %d, padding %d", id, F->name,
                      (long long)n, (long long)c, (long long)h, (long long)w, (long long)o,
                      (long long)c, win->kh, win->kw, win->sh, win->ph)) {
        for (int64_t i = 0; i < nx; i++)
            ax[i] = fabsf(x[i]);
        for (int64_t i = 0; i < nw; i++)
            aw[i] = fabsf(wt[i]);
        for (int64_t i = 0; i < ny; i++)
            ady[i] = fabsf(dy[i]);
        ref_conv2d(want_y, &g, o, x, wt);
        ref_conv2d(mag_y, &g, o, ax, aw);
        ref_conv2d_backward(want_dx, want_dw, &g, o, dy, x, wt, 0.5, dw0);
        for (int64_t i = 0; i < nw; i++)
            dw0[i] = fabsf(dw0[i]);
        ref_conv2d_backward(mag_dx, mag_dw, &g, o, ady, ax, aw, 0.5, dw0);
        double ey = ref_err(y, want_y, mag_y, ny), edx = ref_err(dx, want_dx, mag_dx, nx),
               edw = ref_err(dw, want_dw, mag_dw, nw);
        double edx1 = ref_err(dx1, want_dx, mag_dx, nx), edw1 = ref_err(dw1, want_dw, mag_dw, nw);
        tap_ok(ey <= 2e-5 && edx <= 2e-5 && edw <= 2e-5 && edx1 <= 2e-5 && edw1 <= 2e-5,
               "%s: ... y, dx and dw, and dx and dw asked for alone, within 2e-5 of "
               "sum|terms| (largest %.2g, %.2g, %.2g, %.2g, %.2g)",
               id, ey, edx, edw, edx1, edw1);
    }
    ch_tensor_free(tx), ch_tensor_free(tw), ch_tensor_free(tdy);
    ch_tensor_free(ty), ch_tensor_free(tdx), ch_tensor_free(tdw);
    ch_tensor_free(tdx1), ch_tensor_free(tdw1);
    free(bx), free(bw), free(bdy), free(x), free(wt), free(dy), free(dw0), free(ax), free(aw);
    free(ady), free(y), free(dx), free(dw), free(dx1), free(dw1);
    free(want_y), free(mag_y), free(want_dx), free(mag_dx), free(want_dw), free(mag_dw);
}

/* ---- the ops that compute in f32 on half storage ---------------------- */

#define MAX_T 10

/* One op on up to MAX_T tensors; `t` holds them in the op's order. */
typedef ch_status (*op_fn)(ch_tensor **t);

typedef struct op_case {
    const char *name;
    op_fn run;
    int n;
    int ndim[MAX_T];
    int64_t shape[MAX_T][4];
    int out[MAX_T];      /* written by the op (compared) */
    int keep_f32[MAX_T]; /* stays f32 on the device (mixed formats) */
    float lo[MAX_T], hi[MAX_T];
    int same_as[MAX_T];  /* > 0: the same tensor as argument same_as - 1 (in place) */
} op_case;

static ch_status op_add(ch_tensor **t) { return ch_add(t[0], t[1], t[2]); }
static ch_status op_mul(ch_tensor **t) { return ch_mul(t[0], t[1], t[2]); }
static ch_status op_scale(ch_tensor **t) { return ch_scale(t[0], t[1], 0.7f); }
static ch_status op_axpy(ch_tensor **t) { return ch_axpy(t[0], 0.5f, t[1]); }
static ch_status op_gelu(ch_tensor **t) { return ch_activation_forward(t[0], t[1], CH_ACT_GELU); }
static ch_status op_gelu_back(ch_tensor **t)
{
    return ch_activation_backward(t[0], t[1], t[2], NULL, CH_ACT_GELU);
}
static ch_status op_tanh_back(ch_tensor **t)
{
    return ch_activation_backward(t[0], t[1], NULL, t[2], CH_ACT_TANH);
}
static ch_status op_bias_add(ch_tensor **t) { return ch_bias_add(t[0], t[1], t[2], 1); }
static ch_status op_bias_grad(ch_tensor **t) { return ch_bias_grad(t[0], t[1], 1, 0.5f); }
static ch_status op_sum(ch_tensor **t) { return ch_sum(t[0], t[1], 1); }
static ch_status op_mean(ch_tensor **t) { return ch_mean(t[0], t[1], 0); }
static ch_status op_softmax(ch_tensor **t) { return ch_softmax(t[0], t[1], 1); }
static ch_status op_softmax_back(ch_tensor **t) { return ch_softmax_backward(t[0], t[1], t[2]); }
static ch_status op_layernorm(ch_tensor **t)
{
    return ch_layernorm(t[0], t[1], t[2], t[3], t[4], t[5], 1e-5f);
}
static ch_status op_layernorm_back(ch_tensor **t)
{
    return ch_layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
}
static ch_status op_bn_forward(ch_tensor **t)
{
    return ch_batchnorm_forward(t[0], t[1], t[2], t[3], t[4], t[5]);
}
static ch_status op_channel_sums(ch_tensor **t)
{
    return ch_channel_sums(t[0], t[1], NULL, t[2], NULL);
}

static const op_case op_cases[] = {
    {"ch_add", op_add, 3, {1, 1, 1}, {{300}, {300}, {300}}, {1}, {0}, {0}, {0}, {0}},
    {"ch_add in place (y = a)", op_add, 3, {1, 1, 1}, {{300}, {300}, {300}}, {1}, {0}, {0},
     {0}, {0, 1, 0}},
    {"ch_mul, b in f32", op_mul, 3, {2, 2, 2}, {{7, 9}, {7, 9}, {7, 9}}, {1}, {0, 0, 1}, {0},
     {0}, {0}},
    {"ch_scale", op_scale, 2, {1, 1}, {{257}, {257}}, {1}, {0}, {0}, {0}, {0}},
    {"ch_axpy (y read and written)", op_axpy, 2, {1, 1}, {{257}, {257}}, {1}, {0}, {0}, {0},
     {0}},
    {"ch_activation_forward gelu", op_gelu, 2, {1, 1}, {{400}, {400}}, {1}, {0}, {-4, -4},
     {4, 4}, {0}},
    {"ch_activation_backward gelu", op_gelu_back, 3, {1, 1, 1}, {{400}, {400}, {400}}, {1},
     {0}, {0, -1, -4}, {0, 1, 4}, {0}},
    {"ch_activation_backward tanh", op_tanh_back, 3, {1, 1, 1}, {{400}, {400}, {400}}, {1},
     {0}, {0}, {0}, {0}},
    {"ch_bias_add", op_bias_add, 3, {2, 2, 1}, {{6, 10}, {6, 10}, {10}}, {1}, {0}, {0}, {0},
     {0}},
    {"ch_bias_grad (beta 0.5)", op_bias_grad, 2, {1, 2}, {{10}, {6, 10}}, {1}, {0}, {0}, {0},
     {0}},
    {"ch_sum", op_sum, 2, {1, 2}, {{5}, {5, 37}}, {1}, {0}, {0}, {0}, {0}},
    {"ch_mean, y in f32", op_mean, 2, {1, 2}, {{37}, {5, 37}}, {1}, {1}, {0}, {0}, {0}},
    {"ch_softmax causal", op_softmax, 2, {3, 3}, {{2, 7, 7}, {2, 7, 7}}, {1}, {0}, {-3, -3},
     {3, 3}, {0}},
    {"ch_softmax_backward", op_softmax_back, 3, {3, 3, 3}, {{2, 7, 7}, {2, 7, 7}, {2, 7, 7}},
     {1}, {0}, {0, -1, 0}, {0, 1, 0.3f}, {0}},
    {"ch_layernorm", op_layernorm, 6, {2, 1, 1, 2, 1, 1},
     {{6, 16}, {6}, {6}, {6, 16}, {16}, {16}}, {1, 1, 1}, {0}, {0}, {0}, {0}},
    {"ch_layernorm_backward (dgamma, dbeta accumulate)", op_layernorm_back, 8,
     {2, 1, 1, 2, 2, 1, 1, 1},
     {{6, 16}, {16}, {16}, {6, 16}, {6, 16}, {6}, {6}, {16}}, {1, 1, 1}, {0},
     {-1, -1, -1, -1, -1, -0.2f, 0.8f, -1}, {1, 1, 1, 1, 1, 0.2f, 1.2f, 1}, {0}},
    {"ch_batchnorm_forward, statistics in f32", op_bn_forward, 6, {4, 4, 1, 1, 1, 1},
     {{4, 3, 5, 5}, {4, 3, 5, 5}, {3}, {3}, {3}, {3}}, {1}, {0, 0, 1, 1, 0, 0},
     {-1, -1, -0.2f, 0.8f, -1, -1}, {1, 1, 0.2f, 1.2f, 1, 1}, {0}},
    {"ch_channel_sums", op_channel_sums, 3, {1, 4, 4}, {{7}, {4, 3, 5, 5}, {4, 3, 5, 5}},
     {1}, {1}, {0}, {0}, {0}},
};

/* Random values in [lo, hi] (default [-1, 1]) rounded to F: exact in f32. */
static ch_status case_values(const fmt *F, int64_t n, float lo, float hi, tap_rng *rng,
                             uint16_t *bits, float *exact)
{
    ch_status made = make_half(F, n, rng, bits, exact);
    if (made != CH_OK || (lo == 0.0f && hi == 0.0f))
        return made;
    for (int64_t i = 0; i < n; i++)
        exact[i] = lo + (exact[i] + 1.0f) * 0.5f * (hi - lo);
    return round_to(F, n, exact, bits);
}

static int64_t count_of(const op_case *c, int i)
{
    int64_t n = 1;
    for (int d = 0; d < c->ndim[i]; d++)
        n *= c->shape[i][d];
    return n;
}

static void op_case_run(ch_device *dev, const fmt *F, const op_case *c, tap_rng *rng)
{
    const char *id = ch_device_id(dev);
    ch_tensor *ref[MAX_T] = {NULL}, *on[MAX_T] = {NULL};
    uint16_t *bits[MAX_T] = {NULL};
    float *vals[MAX_T] = {NULL}, *want[MAX_T] = {NULL}, *got[MAX_T] = {NULL};
    ch_status st = CH_OK;
    for (int i = 0; i < c->n && st == CH_OK; i++) {
        int64_t n = count_of(c, i);
        if (c->same_as[i] > 0)
            continue;
        bits[i] = malloc(2 * n);
        vals[i] = malloc(4 * n);
        want[i] = malloc(4 * n);
        got[i] = malloc(4 * n);
        if (!bits[i] || !vals[i] || !want[i] || !got[i]) {
            st = CH_ERR_OUT_OF_MEMORY;
            break;
        }
        st = case_values(F, n, c->lo[i], c->hi[i], rng, bits[i], vals[i]);
        if (st == CH_OK)
            st = tensor_of(&ref[i], host, CH_F32, c->ndim[i], c->shape[i], NULL, vals[i]);
        ch_dtype dt = c->keep_f32[i] ? CH_F32 : F->dtype;
        if (st == CH_OK)
            st = tensor_of(&on[i], dev, dt, c->ndim[i], c->shape[i], bits[i], vals[i]);
    }
    ch_tensor *rt[MAX_T], *ot[MAX_T];
    for (int i = 0; i < c->n; i++) {
        int k = c->same_as[i] > 0 ? c->same_as[i] - 1 : i;
        rt[i] = ref[k];
        ot[i] = on[k];
    }
    if (st == CH_OK)
        st = c->run(rt);
    if (st == CH_OK)
        st = c->run(ot);
    double u = ldexp(1.0, -(F->mant + 1)), worst = 0.0;
    int64_t bad = 0;
    for (int i = 0; i < c->n && st == CH_OK; i++) {
        if (!c->out[i] || c->same_as[i] > 0)
            continue;
        int64_t n = count_of(c, i);
        st = ch_tensor_download(ref[i], want[i], 4 * (size_t)n);
        if (st == CH_OK)
            st = values_of(on[i], got[i]);
        double big = 0.0, ui = c->keep_f32[i] ? 0.0 : u;
        for (int64_t e = 0; st == CH_OK && e < n; e++)
            big = fmax(big, fabs(want[i][e]));
        for (int64_t e = 0; st == CH_OK && e < n; e++) {
            double err = fabs((double)got[i][e] - want[i][e]);
            if (!(err <= ui * fabs(want[i][e]) + 1e-5 * big))
                bad++;
            worst = fmax(worst, err / (big + 1e-30));
        }
    }
    if (tap_status_ok(st, "%s: %s on %s storage", id, c->name, F->name))
        tap_ok(bad == 0, "%s: ... the host's f32 result rounded once (%lld elements outside "
               "u |want| + 1e-5 max|want|; largest error %.2g of max|want|)",
               id, (long long)bad, worst);
    for (int i = 0; i < c->n; i++) {
        ch_tensor_free(ref[i]);
        ch_tensor_free(on[i]);
        free(bits[i]), free(vals[i]), free(want[i]), free(got[i]);
    }
}

static void test_ops(ch_device *dev, tap_rng *rng)
{
    for (int f = 0; f < 2; f++)
        for (size_t k = 0; k < sizeof op_cases / sizeof op_cases[0]; k++)
            op_case_run(dev, &formats[f], &op_cases[k], rng);
}

/* ---- Mixed precision in attention ------------------------------------------- */

enum { AB = 2, AT = 6, AD = 8, AH = 2, AHD = 4, AQKV = 3 * AD };

/* v[0..n) rounded to bf16 in place when `on`. */
static void rounded(int on, float *v, int64_t n)
{
    uint16_t bits[AB * AT * AQKV];
    if (on && round_to(&formats[0], n, v, bits) != CH_OK)
        for (int64_t i = 0; i < n; i++)
            v[i] = NAN;
}

/* y [AB, AT, AD] = attention of x with the weights w (c_attn's weight and
 * bias, c_proj's, in state_dict order), sums in double: the Linears'
 * inputs rounded to bf16 when `linear`, the batched products' when
 * `core`. */
static void attention_ref(float *y, const float *x, float *const *w, int linear, int core)
{
    float xr[AB * AT * AD], wa[AQKV * AD], wp[AD * AD], qkv[AB * AT * AQKV];
    float oy[AB * AT * AD];
    memcpy(xr, x, sizeof xr);
    memcpy(wa, w[0], sizeof wa);
    memcpy(wp, w[2], sizeof wp);
    rounded(linear, xr, AB * AT * AD);
    rounded(linear, wa, AQKV * AD);
    rounded(linear, wp, AD * AD);
    for (int r = 0; r < AB * AT; r++)
        for (int j = 0; j < AQKV; j++) {
            double s = w[1][j];
            for (int i = 0; i < AD; i++)
                s += (double)xr[r * AD + i] * wa[j * AD + i];
            qkv[r * AQKV + j] = (float)s;
        }
    rounded(core, qkv, AB * AT * AQKV);
    double scale = 1.0 / sqrt((double)AHD);
    for (int b = 0; b < AB; b++)
        for (int h = 0; h < AH; h++)
            for (int t = 0; t < AT; t++) {
                const float *q = qkv + (b * AT + t) * AQKV + h * AHD;
                float p[AT];
                double e[AT], mx = -INFINITY, z = 0;
                for (int u = 0; u <= t; u++) {
                    const float *k = qkv + (b * AT + u) * AQKV + AD + h * AHD;
                    double s = 0;
                    for (int c = 0; c < AHD; c++)
                        s += (double)q[c] * k[c];
                    e[u] = (float)(s * scale);
                    mx = fmax(mx, e[u]);
                }
                for (int u = 0; u <= t; u++)
                    z += e[u] = exp(e[u] - mx);
                for (int u = 0; u <= t; u++)
                    p[u] = (float)(e[u] / z);
                rounded(core, p, t + 1);
                for (int c = 0; c < AHD; c++) {
                    double s = 0;
                    for (int u = 0; u <= t; u++)
                        s += (double)p[u] * qkv[(b * AT + u) * AQKV + 2 * AD + h * AHD + c];
                    oy[(b * AT + t) * AD + h * AHD + c] = (float)s;
                }
            }
    rounded(linear, oy, AB * AT * AD);
    for (int r = 0; r < AB * AT; r++)
        for (int j = 0; j < AD; j++) {
            double s = w[3][j];
            for (int i = 0; i < AD; i++)
                s += (double)oy[r * AD + i] * wp[j * AD + i];
            y[r * AD + j] = (float)s;
        }
}

/* The module's output for x, and its gradients for dy (dx, then every
 * parameter's) laid end to end in g. */
static ch_status attention_run(ch_device *dev, ch_dtype precision, const float *x,
                               const float *dy, float *y, float *g, float **w)
{
    ch_module *m = NULL;
    ch_tensor *tx = NULL, *tdy = NULL, *ty, *tdx;
    int64_t shape[3] = {AB, AT, AD};
    ch_status st = ch_nn_causal_self_attention(&m, AD, AH, 0.0f);
    if (st == CH_OK)
        st = ch_module_init(m, 5);
    for (int i = 0; st == CH_OK && i < 4; i++) { /* the weights, for the reference */
        ch_tensor *v;
        st = ch_module_param(m, i, NULL, &v, NULL);
        if (st == CH_OK)
            st = ch_tensor_download(v, w[i], ch_tensor_nbytes(v));
    }
    if (st == CH_OK)
        st = ch_module_set_precision(m, precision);
    if (st == CH_OK)
        st = ch_module_to(m, dev);
    if (st == CH_OK)
        st = tensor_of(&tx, dev, CH_F32, 3, shape, NULL, x);
    if (st == CH_OK)
        st = tensor_of(&tdy, dev, CH_F32, 3, shape, NULL, dy);
    if (st == CH_OK)
        st = ch_module_forward(m, &ty, tx);
    if (st == CH_OK)
        st = tap_download_floats(ty, y, sizeof(float) * AB * AT * AD);
    if (st == CH_OK)
        st = ch_module_backward(m, &tdx, tdy);
    if (st == CH_OK)
        st = ch_tensor_download(tdx, g, sizeof(float) * AB * AT * AD);
    size_t at = AB * AT * AD;
    for (int i = 0; st == CH_OK && i < 4; i++) {
        ch_tensor *grad;
        st = ch_module_param(m, i, NULL, NULL, &grad);
        if (st == CH_OK)
            st = ch_tensor_download(grad, g + at, ch_tensor_nbytes(grad));
        at += (size_t)ch_tensor_numel(grad);
    }
    ch_tensor_free(tx);
    ch_tensor_free(tdy);
    ch_module_free(m);
    return st;
}

/* The attention module in bf16 against f32 and the two references: the
 * composed path (CHORUS_FUSED_ATTENTION=0) rounds the batched products'
 * inputs as autocast does; the fused kernel (every backend's) sums in f32
 * on c_attn's output at this head size of 4 (the host's bf16 products
 * want a multiple of 32 and AMX: test-host-attn and test-ops-attn), so
 * only the Linears' inputs are rounded. */
static void attention_case(ch_device *dev, const float *x, const float *dy, int fused,
                           const char *how)
{
    enum { NX = AB * AT * AD, NG = NX + AQKV * AD + AQKV + AD * AD + AD };
    float y16[NX], y32[NX], g16[NG], g32[NG], ra[NX], rb[NX];
    float wa[AQKV * AD], ba[AQKV], wp[AD * AD], bp[AD], *w[4] = {wa, ba, wp, bp};
    ch_status st = attention_run(dev, CH_BF16, x, dy, y16, g16, w);
    if (st == CH_OK)
        st = attention_run(dev, CH_F32, x, dy, y32, g32, w);
    if (!tap_status_ok(st, "%s%s: causal self-attention in bf16 and f32, forward and backward",
                       ch_device_id(dev), how))
        return;
    attention_ref(ra, x, w, 1, 1);
    attention_ref(rb, x, w, 1, 0);
    double ea = 0, eb = 0, scale = 0, eg = 0, gscale = 0;
    for (int i = 0; i < NX; i++) {
        ea = fmax(ea, fabs(y16[i] - ra[i]));
        eb = fmax(eb, fabs(y16[i] - rb[i]));
        scale = fmax(scale, fabs(ra[i]));
    }
    int same = 1;
    for (int i = 0; i < NG; i++) {
        eg = fmax(eg, fabs(g16[i] - g32[i]));
        gscale = fmax(gscale, fabs(g32[i]));
        same = same && g16[i] == g32[i];
    }
    if (fused)
        tap_ok(eb * 8 <= ea && eb <= 1e-3 * scale,
               "%s%s: fused attention in bf16 rounds the Linears' inputs alone: max err %.2e "
               "against the reference that does, %.2e against the one that rounds the batched "
               "products' too (largest output %.2f)",
               ch_device_id(dev), how, eb, ea, scale);
    else
        tap_ok(ea * 8 <= eb && ea <= 1e-3 * scale,
               "%s%s: attention in bf16 rounds the batched products' inputs too: max err %.2e "
               "against the reference that does, %.2e against the one that rounds the Linears' "
               "alone (largest output %.2f)",
               ch_device_id(dev), how, ea, eb, scale);
    tap_ok(eg <= 3e-2 * gscale && !same,
           "%s%s: its gradients (dx, the weights') within 3e-2 of f32's largest (max err %.2e of "
           "%.2e), other bits",
           ch_device_id(dev), how, eg, gscale);
}

static void test_attention(ch_device *dev, tap_rng *rng)
{
    enum {
        NX = AB * AT * AD
    };
    float x[NX], dy[NX];
    for (int i = 0; i < NX; i++) {
        x[i] = tap_rng_uniform(rng, -2.0f, 2.0f);
        dy[i] = tap_rng_uniform(rng, -1.0f, 1.0f);
    }
    const char *env = getenv("CHORUS_FUSED_ATTENTION");
    int composed = env && strcmp(env, "0") == 0;
    attention_case(dev, x, dy, !composed, "");
    if (!composed) { /* the composed path too */
        setenv("CHORUS_FUSED_ATTENTION", "0", 1);
        attention_case(dev, x, dy, 0, " (CHORUS_FUSED_ATTENTION=0)");
        unsetenv("CHORUS_FUSED_ATTENTION");
    }
}

/* The weights' half copies kept from one step to the next: in mixed
 * precision a Linear's forward reads its weight rounded to the half
 * format; where the backend's Adam can round as it writes (the host's),
 * the optimizer's step writes that copy and the next forward takes it as
 * it stands, unless something used the weight or the copy since
 * (lib/stamp.h). Four runs of four Adam steps of a small MLP: (a) as is;
 * (b) every parameter downloaded after every step, which makes each
 * forward round the weights itself; (c) as (a), with the first weight
 * overwritten (ch_tensor_upload) after the second step, and (d) as (c)
 * with (b)'s downloads. (a) and (b), (c) and (d) must end with the same
 * bits of every parameter and of the output: the kept copy is the
 * forward's rounding. The forward right after the upload in (c) must
 * give the output of a model made afresh with (d)'s parameters read
 * after the upload (a stale copy would not), and so must a clone's
 * forward after a step (the clone made from a model that ran, which is
 * then freed). Where the backend fuses, the forwards after a step must
 * not use the f32 weight at all (its stamp unchanged): the copy is
 * taken. */

enum {
    KW_IN = 24,
    KW_HID = 40,
    KW_OUT = 8,
    KW_ROWS = 12,
    KW_STEPS = 4
};

#define KW_PARAMS (KW_IN * KW_HID + KW_HID + KW_HID * KW_OUT + KW_OUT)

typedef struct kept_run {
    float params[KW_PARAMS], y[KW_ROWS * KW_OUT];
    int untouched; /* forwards after a step that left the f32 weight unused */
    /* With the upload: every parameter just after it, and the output of
     * the forward that follows. */
    float uploaded[KW_PARAMS], y_uploaded[KW_ROWS * KW_OUT];
} kept_run;

/* Every parameter of m to or from `vals`, in order. */
static ch_status kw_params(ch_module *m, float *vals, int upload)
{
    ch_status st = CH_OK;
    size_t at = 0;
    for (int i = 0; st == CH_OK && i < ch_module_param_count(m); i++) {
        ch_tensor *v = NULL;
        st = ch_module_param(m, i, NULL, &v, NULL);
        if (st == CH_OK)
            st = upload ? ch_tensor_upload(v, vals + at, ch_tensor_nbytes(v))
                        : ch_tensor_download(v, vals + at, ch_tensor_nbytes(v));
        at += st == CH_OK ? (size_t)ch_tensor_numel(v) : 0;
    }
    return st;
}

/* The MLP in `precision` on dev, x in *tx. */
static ch_status kw_model(ch_module **m, ch_tensor **tx, ch_device *dev, ch_dtype precision,
                          const float *x)
{
    ch_module *c[3] = {NULL};
    ch_nn_linear(&c[0], KW_IN, KW_HID);
    ch_nn_activation(&c[1], CH_ACT_GELU);
    ch_nn_linear(&c[2], KW_HID, KW_OUT);
    *m = tap_sequential(3, c);
    int64_t xs[2] = {KW_ROWS, KW_IN};
    ch_status st = *m ? ch_module_init(*m, 11) : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_module_set_precision(*m, precision);
    if (st == CH_OK)
        st = ch_module_to(*m, dev);
    if (st == CH_OK)
        st = tensor_of(tx, dev, CH_F32, 2, xs, NULL, x);
    return st;
}

/* The output of a model made afresh (no step, so nothing kept) with the
 * parameters `vals`. */
static ch_status kw_fresh_output(ch_device *dev, ch_dtype precision, const float *x,
                                 const float *vals, float *y)
{
    ch_module *m = NULL;
    ch_tensor *tx = NULL, *ty = NULL;
    ch_status st = kw_model(&m, &tx, dev, precision, x);
    if (st == CH_OK)
        st = kw_params(m, (float *)vals, 1);
    if (st == CH_OK)
        st = ch_module_forward(m, &ty, tx);
    if (st == CH_OK)
        st = tap_download_floats(ty, y, sizeof(float) * KW_ROWS * KW_OUT);
    ch_tensor_free(tx);
    ch_module_free(m);
    return st;
}

/* A model that ran a forward (its weights' copies made), cloned, freed;
 * the clone steps (zero gradients: the weight decay moves the weights)
 * before its own first forward, then runs one: its output into y, its
 * parameters into vals. The clone names its own copies (a sanitizer
 * build sees any use of the freed model's). */
static ch_status kw_clone_run(ch_device *dev, ch_dtype precision, const float *x, float *vals,
                              float *y)
{
    ch_module *m = NULL, *c = NULL;
    ch_tensor *tx = NULL, *ty = NULL;
    ch_optimizer *opt = NULL;
    ch_status st = kw_model(&m, &tx, dev, precision, x);
    if (st == CH_OK)
        st = ch_module_forward(m, &ty, tx);
    if (st == CH_OK)
        st = ch_module_clone(&c, m, dev);
    ch_module_free(m);
    if (st == CH_OK) {
        ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, 1e-2f);
        st = ch_optimizer_new(&opt, c, &o);
    }
    if (st == CH_OK)
        st = ch_module_zero_grad(c);
    if (st == CH_OK)
        st = ch_optimizer_step(opt, 1e-2f);
    if (st == CH_OK)
        st = ch_module_forward(c, &ty, tx);
    if (st == CH_OK)
        st = tap_download_floats(ty, y, sizeof(float) * KW_ROWS * KW_OUT);
    if (st == CH_OK)
        st = kw_params(c, vals, 0);
    ch_optimizer_free(opt);
    ch_module_free(c);
    ch_tensor_free(tx);
    return st;
}

static ch_status kept_weights_run(ch_device *dev, ch_dtype precision, int download, int overwrite,
                                  const float *x, const float *dy, kept_run *out)
{
    ch_module *m = NULL;
    ch_optimizer *opt = NULL;
    ch_tensor *tx = NULL, *tdy = NULL, *ty = NULL, *tdx = NULL, *w0 = NULL;
    int64_t ys[2] = {KW_ROWS, KW_OUT};
    ch_status st = kw_model(&m, &tx, dev, precision, x);
    if (st == CH_OK)
        st = tensor_of(&tdy, dev, CH_F32, 2, ys, NULL, dy);
    if (st == CH_OK) {
        ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, 1e-2f);
        st = ch_optimizer_new(&opt, m, &o);
    }
    if (st == CH_OK)
        st = ch_module_param(m, 0, NULL, &w0, NULL);
    out->untouched = 0;
    for (int s = 0; st == CH_OK && s <= KW_STEPS; s++) {
        uint64_t before = chi_tensor_stamp(w0);
        st = ch_module_forward(m, &ty, tx);
        out->untouched += s > 0 && chi_tensor_stamp(w0) == before;
        if (st == CH_OK && overwrite && s == 2)
            st = tap_download_floats(ty, out->y_uploaded, sizeof out->y_uploaded);
        if (st != CH_OK || s == KW_STEPS)
            break;
        st = ch_module_zero_grad(m);
        if (st == CH_OK)
            st = ch_module_backward(m, &tdx, tdy);
        if (st == CH_OK)
            st = ch_optimizer_step(opt, 1e-2f);
        if (st == CH_OK && download)
            st = kw_params(m, out->params, 0);
        if (st == CH_OK && overwrite && s == 1) {
            float w[KW_IN * KW_HID];
            for (int i = 0; i < KW_IN * KW_HID; i++)
                w[i] = 0.05f * (float)((i * 7) % 23 - 11);
            st = ch_tensor_upload(w0, w, sizeof w);
            /* Reading the parameters makes any forward round them again:
             * only the run with downloads reads them here. */
            if (st == CH_OK && download)
                st = kw_params(m, out->uploaded, 0);
        }
    }
    if (st == CH_OK)
        st = tap_download_floats(ty, out->y, sizeof out->y);
    if (st == CH_OK)
        st = kw_params(m, out->params, 0);
    ch_tensor_free(tx);
    ch_tensor_free(tdy);
    ch_optimizer_free(opt);
    ch_module_free(m);
    return st;
}

static void test_kept_weights(ch_device *dev, tap_rng *rng)
{
    const char *id = ch_device_id(dev);
    float x[KW_ROWS * KW_IN], dy[KW_ROWS * KW_OUT];
    for (int i = 0; i < KW_ROWS * KW_IN; i++)
        x[i] = tap_rng_uniform(rng, -1, 1);
    for (int i = 0; i < KW_ROWS * KW_OUT; i++)
        dy[i] = tap_rng_uniform(rng, -1, 1);
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        const fmt *F = &formats[f];
        /* Whether this device's Adam rounds into a copy, asked of tensors
         * of the first weight's size. */
        ch_tensor *p = NULL, *ph = NULL;
        int64_t wn[1] = {KW_IN * KW_HID};
        ch_status st = ch_tensor_new(&p, dev, CH_F32, 1, wn);
        if (st == CH_OK)
            st = ch_tensor_new(&ph, dev, F->dtype, 1, wn);
        int fused = st == CH_OK && chi_adam_half_fused(p, ph);
        ch_tensor_free(p);
        ch_tensor_free(ph);
        static kept_run r[4];
        for (int k = 0; st == CH_OK && k < 4; k++)
            st = kept_weights_run(dev, F->dtype, k % 2, k / 2, x, dy, &r[k]);
        if (st != CH_OK) {
            tap_ok(0, "%s %s: kept half weights: %s", id, F->name, ch_last_error());
            continue;
        }
        int64_t np = (int64_t)(sizeof r[0].params / sizeof(float));
        int64_t ny = (int64_t)(sizeof r[0].y / sizeof(float));
        for (int k = 0; k < 4; k += 2) {
            char dp[256], dy_[256];
            int64_t bad = ref_diff_words(r[k].params, r[k + 1].params, np, 1, dp, sizeof dp) +
                          ref_diff_words(r[k].y, r[k + 1].y, ny, 1, dy_, sizeof dy_);
            tap_ok(bad == 0,
                   "%s %s: %d Adam steps%s (%s): the bits of a run whose every "
                   "forward rounds the weights (parameters: %s; output: %s)",
                   id, F->name, KW_STEPS, k ? ", the first weight uploaded after the second" : "",
                   fused ? "the step rounds into the copies" : "no fused step here", dp, dy_);
        }
        /* The forward after the upload, without downloads (c), against a
         * model made afresh with the parameters (d) read after it. */
        static float fresh[KW_ROWS * KW_OUT];
        char dup[256];
        st = kw_fresh_output(dev, F->dtype, x, r[3].uploaded, fresh);
        int64_t bad =
            st == CH_OK ? ref_diff_words(r[2].y_uploaded, fresh, ny, 1, dup, sizeof dup) : -1;
        tap_ok(bad == 0,
               "%s %s: the forward after a weight's upload: the output of a model made "
               "afresh with the parameters as uploaded (%s)",
               id, F->name, st == CH_OK ? dup : ch_last_error());
        static float cvals[KW_PARAMS], cy[KW_ROWS * KW_OUT];
        st = kw_clone_run(dev, F->dtype, x, cvals, cy);
        if (st == CH_OK)
            st = kw_fresh_output(dev, F->dtype, x, cvals, fresh);
        bad = st == CH_OK ? ref_diff_words(cy, fresh, ny, 1, dup, sizeof dup) : -1;
        tap_ok(bad == 0,
               "%s %s: a clone of a model that ran, the model freed, one step: the "
               "output of a model made afresh with its parameters (%s)",
               id, F->name, st == CH_OK ? dup : ch_last_error());
        /* (a): every forward after a step; (c): all but the one after the
         * upload; with the downloads or without the fused step, none. */
        int want_a = fused ? KW_STEPS : 0, want_c = fused ? KW_STEPS - 1 : 0;
        tap_ok(r[0].untouched == want_a && r[2].untouched == want_c && r[1].untouched == 0 &&
                   r[3].untouched == 0,
               "%s %s: forwards after a step that took the copy as it stood: %d, %d after an "
               "upload, %d and %d with downloads (want %d, %d, 0, 0)",
               id, F->name, r[0].untouched, r[2].untouched, r[1].untouched, r[3].untouched, want_a,
               want_c);
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
    /* The convolution: x, w (and dy) alike, outputs f32. */
    ch_tensor *x4 = NULL, *xh4 = NULL, *w4 = NULL, *wh4 = NULL, *wf4 = NULL, *y4 = NULL,
              *yh4 = NULL, *yf4 = NULL, *dw4 = NULL, *dwh4 = NULL, *i4 = NULL;
    int64_t xs[4] = {1, 2, 5, 5}, ws[4] = {3, 2, 3, 3}, ys[4] = {1, 3, 3, 3};
    st = ch_tensor_new(&x4, dev, CH_F32, 4, xs);
    if (st == CH_OK)
        st = ch_tensor_new(&xh4, dev, CH_BF16, 4, xs);
    if (st == CH_OK)
        st = ch_tensor_new(&i4, dev, CH_I32, 4, xs);
    if (st == CH_OK)
        st = ch_tensor_new(&w4, dev, CH_F32, 4, ws);
    if (st == CH_OK)
        st = ch_tensor_new(&wh4, dev, CH_BF16, 4, ws);
    if (st == CH_OK)
        st = ch_tensor_new(&wf4, dev, CH_F16, 4, ws);
    if (st == CH_OK)
        st = ch_tensor_new(&dw4, dev, CH_F32, 4, ws);
    if (st == CH_OK)
        st = ch_tensor_new(&dwh4, dev, CH_BF16, 4, ws);
    if (st == CH_OK)
        st = ch_tensor_new(&y4, dev, CH_F32, 4, ys);
    if (st == CH_OK)
        st = ch_tensor_new(&yh4, dev, CH_BF16, 4, ys);
    if (st == CH_OK)
        st = ch_tensor_new(&yf4, dev, CH_F16, 4, ys);
    const ch_window2d win = {3, 3, 1, 1, 0, 0};
    if (tap_status_ok(st, "%s: tensors for the convolution's error cases", ch_device_id(dev))) {
        tap_status_is(ch_conv2d(y4, xh4, w4, &win), CH_ERR_DTYPE, "x is bf16 but w is f32",
                      "%s: ch_conv2d of bf16 x by f32 w is refused", ch_device_id(dev));
        tap_status_is(ch_conv2d(y4, xh4, wf4, &win), CH_ERR_DTYPE, "x is bf16 but w is f16",
                      "%s: ch_conv2d of bf16 x by f16 w is refused", ch_device_id(dev));
        tap_status_is(ch_conv2d(yh4, xh4, wh4, &win), CH_ERR_DTYPE, "y",
                      "%s: ch_conv2d into a bf16 y is refused", ch_device_id(dev));
        tap_status_is(ch_conv2d(y4, i4, w4, &win), CH_ERR_DTYPE, "expected f32, bf16 or f16",
                      "%s: ch_conv2d of an i32 x is refused", ch_device_id(dev));
        tap_status_is(ch_conv2d_backward(NULL, dw4, yf4, xh4, wh4, &win, 0.0f), CH_ERR_DTYPE,
                      "x is bf16 but dy is f16",
                      "%s: ch_conv2d_backward with an f16 dy for bf16 x and w is refused",
                      ch_device_id(dev));
        tap_status_is(ch_conv2d_backward(NULL, dw4, y4, xh4, wh4, &win, 0.0f), CH_ERR_DTYPE,
                      "x is bf16 but dy is f32",
                      "%s: ch_conv2d_backward with an f32 dy for bf16 x and w is refused",
                      ch_device_id(dev));
        tap_status_is(ch_conv2d_backward(NULL, dwh4, yh4, xh4, wh4, &win, 0.0f), CH_ERR_DTYPE,
                      "dw", "%s: ch_conv2d_backward into a bf16 dw is refused",
                      ch_device_id(dev));
    }
    ch_tensor_free(x4), ch_tensor_free(xh4), ch_tensor_free(i4), ch_tensor_free(w4);
    ch_tensor_free(wh4), ch_tensor_free(wf4), ch_tensor_free(dw4), ch_tensor_free(dwh4);
    ch_tensor_free(y4), ch_tensor_free(yh4), ch_tensor_free(yf4);
out:
    ch_tensor_free(f);
    ch_tensor_free(bf);
    ch_tensor_free(h);
    ch_tensor_free(i);
    ch_tensor_free(c);
}

int main(void)
{
    tc_small();
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
        test_ops(devs[d], &rng);
        test_attention(devs[d], &rng);
        test_kept_weights(devs[d], &rng);
        test_errors(devs[d]);
    }
    ch_shutdown();
    return tap_done();
}
