/* The math mode (ch_math_set, CH_MATH_TF32, CHORUS_TF32): its calls and
 * their refusals, the environment variable at ch_init, and what it does to
 * a GEMM on every visible device: without it, f32 GEMMs within f32's
 * error of a double reference; with it, CUDA's within TF32's (inputs
 * rounded to 10-bit mantissas), every other backend's the same bits as
 * without it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

#define MAX_DEVICES 16
#define M 96
#define N 80
#define K 512
/* Relative to the sum of |a b| over k. f32: sums of K terms in any
 * order, measured 1.4e-7 to 2.4e-7 (host, PoCL); TF32 rounds each input
 * to 2^-11, which leaves about 1e-4 at the worst element of this size:
 * TOL_F32 tells the two apart, TOL_TF32 bounds TF32 with margin. */
#define TOL_F32 4e-6
#define TOL_TF32 2e-3

/* c = a b on dev; the largest error relative to each element's sum of
 * |terms|, and c itself in got. */
static double gemm_err(ch_device *dev, const float *a, const float *b, float *got)
{
    int64_t sa[2] = {M, K}, sb[2] = {K, N}, sc[2] = {M, N};
    ch_tensor *ta = NULL, *tb = NULL, *tc = NULL;
    ch_status st = ch_tensor_new(&ta, dev, CH_F32, 2, sa);
    if (st == CH_OK)
        st = ch_tensor_new(&tb, dev, CH_F32, 2, sb);
    if (st == CH_OK)
        st = ch_tensor_new(&tc, dev, CH_F32, 2, sc);
    if (st == CH_OK)
        st = ch_tensor_upload(ta, a, sizeof(float) * M * K);
    if (st == CH_OK)
        st = ch_tensor_upload(tb, b, sizeof(float) * K * N);
    if (st == CH_OK)
        st = ch_gemm(tc, 0, 0, 1.0f, ta, tb, 0.0f);
    if (st == CH_OK)
        st = ch_tensor_download(tc, got, sizeof(float) * M * N);
    ch_tensor_free(ta);
    ch_tensor_free(tb);
    ch_tensor_free(tc);
    if (st != CH_OK) {
        tap_diag("%s: %s", ch_device_id(dev), ch_last_error());
        return INFINITY;
    }
    double worst = 0.0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double want = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                double p = (double)a[i * K + k] * b[k * N + j];
                want += p;
                mag += fabs(p);
            }
            worst = fmax(worst, fabs(got[i * N + j] - want) / mag);
        }
    return worst;
}

int main(void)
{
    unsetenv("CHORUS_TF32");
    tap_ok(ch_math_get() == CH_MATH_DEFAULT, "the math mode starts as CH_MATH_DEFAULT");
    tap_status_is(ch_math_set(CH_MATH_TF32 | 0x10u), CH_ERR_INVALID_ARGUMENT, "CH_MATH_TF32",
                  "ch_math_set refuses a flag it does not know");
    tap_ok(ch_math_get() == CH_MATH_DEFAULT, "a refused ch_math_set leaves the mode as it was");
    setenv("CHORUS_TF32", "yes", 1);
    tap_status_is(ch_init(), CH_ERR_INVALID_ARGUMENT, "CHORUS_TF32",
                  "ch_init refuses CHORUS_TF32=yes, naming it");
    setenv("CHORUS_TF32", "1", 1);
    if (!tap_status_ok(ch_init(), "ch_init with CHORUS_TF32=1")) {
        tap_done();
        return 1;
    }
    tap_ok(ch_math_get() == CH_MATH_TF32, "CHORUS_TF32=1 sets CH_MATH_TF32");
    unsetenv("CHORUS_TF32");
    tap_status_ok(ch_math_set(CH_MATH_DEFAULT), "ch_math_set(CH_MATH_DEFAULT)");
    tap_ok(ch_math_get() == CH_MATH_DEFAULT, "ch_math_get says so");

    float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * K * N);
    float *plain = malloc(sizeof(float) * M * N), *tf32 = malloc(sizeof(float) * M * N);
    if (!a || !b || !plain || !tf32)
        return 99;
    tap_rng rng = {11};
    for (int i = 0; i < M * K; i++)
        a[i] = tap_rng_uniform(&rng, -1, 1);
    for (int i = 0; i < K * N; i++)
        b[i] = tap_rng_uniform(&rng, -1, 1);
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES);
    for (int d = 0; d < ndev; d++) {
        ch_device_info info;
        if (!tap_status_ok(ch_device_get_info(devs[d], &info), "ch_device_get_info"))
            continue;
        const char *id = ch_device_id(devs[d]);
        ch_math_set(CH_MATH_DEFAULT);
        double e0 = gemm_err(devs[d], a, b, plain);
        tap_ok(e0 <= TOL_F32,
               "%s: f32 GEMM [%d, %d] x [%d, %d] without TF32: error %.2e (at most "
               "%.2e)",
               id, M, K, K, N, e0, TOL_F32);
        ch_math_set(CH_MATH_TF32);
        double e1 = gemm_err(devs[d], a, b, tf32);
        ch_math_set(CH_MATH_DEFAULT);
        if (strcmp(info.backend, "cuda") == 0) {
            tap_ok(e1 <= TOL_TF32, "%s: with CH_MATH_TF32: error %.2e (at most %.0e, TF32's)", id,
                   e1, TOL_TF32);
        } else {
            int same = memcmp(plain, tf32, sizeof(float) * M * N) == 0;
            tap_ok(same,
                   "%s: with CH_MATH_TF32 the same bits as without (%s computes f32 "
                   "GEMMs in f32 either way)",
                   id, info.backend);
        }
    }
    free(a);
    free(b);
    free(plain);
    free(tf32);
    ch_shutdown();
    return tap_done();
}
