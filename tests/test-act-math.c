/* lib/kernels/act.h's scalar formulas, compiled as C, against double
 * precision over a sweep of the floats in [-9, 9]: the bounds act.h states.
 * GELU and its derivative are the float formula every backend runs (here
 * with glibc's erfcf and expf); tanh and sigmoid in float alone are what an
 * OpenCL device without fp64 runs (here with glibc's tanhf and expf, so
 * this checks the formula, and the device's functions add their own
 * error); tanh and sigmoid through chk_act are the double formula of every
 * other device, and so is GELU's tanh approximation. Errors are relative,
 * in units of 2^-23 (ulp), the derivative's relative to the size of its
 * terms, as tests/ref.c measures. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "kernels/act.h"
#include "tap.h"

#define ULP 1.1920928955078125e-07

/* Every float in [lo, hi] whose bits are a multiple of `stride` apart. */
typedef double (*err_fn)(float x);

static double sweep(err_fn f, float lo, float hi, uint32_t stride, float *worst_x)
{
    double worst = 0.0;
    for (int sign = 0; sign <= 1; sign++) {
        float end = sign ? -lo : hi;
        for (uint32_t u = 0; tap_float_of(u) <= end; u += stride) {
            float x = sign ? -tap_float_of(u) : tap_float_of(u);
            double e = f(x);
            if (!(e <= worst)) {
                worst = e;
                *worst_x = x;
            }
        }
    }
    return worst / ULP;
}

/* Relative to |scale|, or to FLT_MIN below it: a subnormal result has
 * fewer bits than a relative bound would ask of it. */
static double rel(double got, double want, double scale)
{
    return fabs(got - want) / fmax(fabs(scale), FLT_MIN);
}

static double gelu_err(float x)
{
    double want = 0.5 * x * erfc(-(double)x * M_SQRT1_2);
    return rel(chk_gelu(x), want, want);
}

/* Phi(x) + x phi(x), relative to Phi(x) + |x| phi(x): the derivative
 * crosses zero near x = -0.75. */
static double gelu_grad_err(float x)
{
    double cdf = 0.5 * erfc(-(double)x * M_SQRT1_2);
    double pdf = exp(-0.5 * (double)x * x) / sqrt(2.0 * M_PI);
    return rel(chk_gelu_grad(x), cdf + x * pdf, cdf + fabs((double)x) * pdf);
}

static double tanh_f32_err(float x)
{
    return rel(chk_tanh_f32(x), tanh(x), tanh(x));
}

static double sigmoid_f32_err(float x)
{
    double want = 1.0 / (1.0 + exp(-(double)x));
    return rel(chk_sigmoid_f32(x), want, want);
}

static double tanh_err(float x)
{
    return rel(chk_act(CH_ACT_TANH, x), tanh(x), tanh(x));
}

static double sigmoid_err(float x)
{
    double want = 1.0 / (1.0 + exp(-(double)x));
    return rel(chk_act(CH_ACT_SIGMOID, x), want, want);
}

/* GELU's tanh approximation against its logistic form in long double,
 * x s(2u) (1 + tanh(u) cancels below x = -5); the derivative s(2u) + x
 * s(2u) s(-2u) 2u' relative to s(2u) + |x s(2u) s(-2u) 2u'|. */
static long double gelu_tanh_u(float x)
{
    long double y = x;
    return sqrtl(2.0L / 3.14159265358979323846264338327950288L) * (y + 0.044715L * y * y * y);
}

static double gelu_tanh_err(float x)
{
    long double want = x / (1.0L + expl(-2.0L * gelu_tanh_u(x)));
    return rel(chk_act(CH_ACT_GELU_TANH, x), (double)want, (double)want);
}

static double gelu_tanh_grad_err(float x)
{
    long double y = x, u = gelu_tanh_u(x);
    long double s = 1.0L / (1.0L + expl(-2.0L * u)), sn = 1.0L / (1.0L + expl(2.0L * u));
    long double du = 2.0L * sqrtl(2.0L / 3.14159265358979323846264338327950288L) *
                     (1.0L + 3.0L * 0.044715L * y * y);
    long double slope = y * s * sn * du;
    return rel(chk_act_grad(CH_ACT_GELU_TANH, 1.0f, x, 0.0f), (double)(s + slope),
               (double)(s + fabsl(slope)));
}

static void check(const char *name, err_fn f, double bound)
{
    float at = 0.0f;
    double e = sweep(f, -9.0f, 9.0f, 257, &at);
    tap_ok(e <= bound, "%s over [-9, 9]: %.3g ulp at x = %.9g, want <= %g", name, e, at, bound);
}

int main(void)
{
    check("chk_gelu (float, corrected)", gelu_err, 2.5);
    check("chk_gelu_grad (float, corrected)", gelu_grad_err, 2.5);
    check("chk_act tanh (double)", tanh_err, 1.0);
    check("chk_act sigmoid (double)", sigmoid_err, 1.0);
    check("chk_act gelu_tanh (double)", gelu_tanh_err, 1.0);
    check("chk_act_grad gelu_tanh (double)", gelu_tanh_grad_err, 1.0);
    check("chk_tanh_f32 (OpenCL without fp64, glibc's tanhf)", tanh_f32_err, 5.0);
    check("chk_sigmoid_f32 (OpenCL without fp64, glibc's expf)", sigmoid_f32_err, 6.0);
    return tap_done();
}
