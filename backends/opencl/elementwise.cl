/* Elementwise kernels: one work-item per element, launched with a global
 * size rounded up to the work-group size, hence the bounds checks.
 * Every buffer comes with an element offset (the allocation is shared by
 * views, and sub-buffers would need an aligned origin). */

/* The host backend computes in plain C without fused multiply-adds; keep
 * the same roundings here.
 * The CH_BIN_* and CH_ACT_* values come from the build options (program.c),
 * as the C code was compiled with them; ops.c refuses values beyond them
 * before a kernel runs, so the NaN of a default is never seen. */
#pragma OPENCL FP_CONTRACT OFF

__kernel void binary(__global float *y, ulong yo, __global const float *a, ulong ao,
                     __global const float *b, ulong bo, int n, int op)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float u = a[ao + i], v = b[bo + i], r;
    switch (op) {
    case CH_BIN_ADD: r = u + v; break;
    case CH_BIN_SUB: r = u - v; break;
    case CH_BIN_MUL: r = u * v; break;
    default: r = NAN; break;
    }
    y[yo + i] = r;
}

/* y = alpha x + beta y; y is not read when beta is 0 (it may hold NaN). */
__kernel void axpby(__global float *y, ulong yo, __global const float *x, ulong xo,
                    int n, float alpha, float beta)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float r = alpha * x[xo + i];
    if (beta != 0.0f)
        r += beta * y[yo + i];
    y[yo + i] = r;
}

/* Phi(x) through erfc: for large negative x, 1 + erf(x) would cancel. */
float gelu_cdf(float x) { return 0.5f * erfc(-x * M_SQRT1_2_F); }

__kernel void act_forward(__global float *y, ulong yo, __global const float *x,
                          ulong xo, int n, int act)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float v = x[xo + i], r;
    switch (act) {
    case CH_ACT_RELU: r = v > 0.0f ? v : 0.0f; break;
    case CH_ACT_GELU: r = v * gelu_cdf(v); break;
    case CH_ACT_TANH: r = tanh(v); break;
    case CH_ACT_SIGMOID: r = 1.0f / (1.0f + exp(-v)); break;
    default: r = NAN; break;
    }
    y[yo + i] = r;
}

/* relu and gelu read the forward input x, tanh and sigmoid its output y;
 * the other buffer is a placeholder then. */
__kernel void act_backward(__global float *dx, ulong dxo, __global const float *dy,
                           ulong dyo, __global const float *x, ulong xo,
                           __global const float *y, ulong yo, int n, int act)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float g = dy[dyo + i], r;
    switch (act) {
    case CH_ACT_RELU: r = x[xo + i] > 0.0f ? g : 0.0f; break;
    case CH_ACT_GELU: {
        float v = x[xo + i];
        float pdf = exp(-0.5f * v * v) * (M_2_SQRTPI_F * M_SQRT1_2_F * 0.5f);
        r = g * (gelu_cdf(v) + v * pdf);
        break;
    }
    case CH_ACT_TANH: {
        /* (1 - t)(1 + t) rather than 1 - t^2, which cancels near |t| = 1. */
        float t = y[yo + i];
        r = g * ((1.0f - t) * (1.0f + t));
        break;
    }
    case CH_ACT_SIGMOID: {
        float s = y[yo + i];
        r = g * (s * (1.0f - s));
        break;
    }
    default: r = NAN; break;
    }
    dx[dxo + i] = r;
}

/* x, y as [outer, c, inner]: y = x + bias[c]. */
__kernel void bias_add(__global float *y, ulong yo, __global const float *x, ulong xo,
                       __global const float *bias, ulong bo, int n, int c, int inner)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    y[yo + i] = x[xo + i] + bias[bo + (i / inner) % c];
}

/* [a, b, inner] -> [b, a, inner] of 4-byte elements (f32 or i32 alike). */
__kernel void transpose01(__global uint *y, ulong yo, __global const uint *x, ulong xo,
                          int n, int a, int b, int inner)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    int k = i % inner, rest = i / inner;
    int ib = rest % b, ia = rest / b;
    y[yo + (ib * a + ia) * inner + k] = x[xo + i];
}

/* The optimizers, in exactly the operations of lib/optim_consts.h, each
 * rounded on its own: replicas on other backends take the same step bit
 * for bit. */
#pragma OPENCL FP_CONTRACT OFF

__kernel void sgd_step(__global float *p, ulong po, __global float *m, ulong mo,
                       __global const float *g, ulong go, int n, float lr,
                       float momentum, float damp, float weight_decay,
                       int nesterov, int first_step)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float w = p[po + i];
    float gi = g[go + i] + weight_decay * w;
    float d = gi;
    if (momentum != 0.0f) {
        float mi = first_step ? gi : momentum * m[mo + i] + damp * gi;
        m[mo + i] = mi;
        d = nesterov ? gi + momentum * mi : mi;
    }
    p[po + i] = w - lr * d;
}

/* Adam and AdamW with the constants of chi_adam_consts. */
__kernel void adam_step(__global float *p, ulong po, __global float *m, ulong mo,
                        __global float *v, ulong vo, __global const float *g, ulong go,
                        int n, float beta1, float one_minus_beta1, float beta2,
                        float one_minus_beta2, float step_size, float bc2_sqrt, float eps,
                        float decay, float l2)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float w = p[po + i];
    float gi = g[go + i] + l2 * w;
    float pi = w * decay;
    float mi = beta1 * m[mo + i] + one_minus_beta1 * gi;
    float vi = beta2 * v[vo + i] + (one_minus_beta2 * gi) * gi;
    m[mo + i] = mi;
    v[vo + i] = vi;
    p[po + i] = pi - (step_size * mi) / (sqrt(vi) / bc2_sqrt + eps);
}

/* f32 <-> bf16 and f16 on the bits, the steps of lib/half.h (round to
 * nearest even; a NaN narrowed becomes a quiet NaN with its sign and the
 * top of its payload, widened it keeps its bits). Halves as ushort,
 * floats as uint; offsets in elements. */
__kernel void f32_to_bf16(__global ushort *y, ulong yo, __global const uint *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    uint u = x[xo + i];
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        y[yo + i] = (ushort)((u >> 16) | 0x0040u);
        return;
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    y[yo + i] = (ushort)(u >> 16);
}

__kernel void bf16_to_f32(__global uint *y, ulong yo, __global const ushort *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[yo + i] = (uint)x[xo + i] << 16;
}

__kernel void f32_to_f16(__global ushort *y, ulong yo, __global const uint *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    uint u = x[xo + i];
    uint sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu, h;
    if (a > 0x7f800000u) {
        h = sign | 0x7e00u | ((a >> 13) & 0x3ffu);
    } else if (a >= 0x477ff000u) {
        h = sign | 0x7c00u;
    } else if (a <= 0x33000000u) {
        h = sign;
    } else if (a < 0x38800000u) {
        uint e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e;
        uint q = m >> shift, rem = m & ((1u << shift) - 1u), tie = 1u << (shift - 1u);
        if (rem > tie || (rem == tie && (q & 1u)))
            q++;
        h = sign | q;
    } else {
        uint q = (a - 0x38000000u) >> 13, rem = a & 0x1fffu;
        if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
            q++;
        h = sign | q;
    }
    y[yo + i] = (ushort)h;
}

__kernel void f16_to_f32(__global uint *y, ulong yo, __global const ushort *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    uint h = x[xo + i];
    /* The exponent field tested in place, not shifted down: from
     * (h >> 10) & 0x1f, clang makes a switch on h >> 10 truncated to 5 bits,
     * which oclgrind 21.10 runs with the sign bit still above them (it
     * keeps narrow integers in whole bytes, unmasked), sending -0, the
     * negative subnormals and -inf and NaNs to the normal numbers' branch
     * (tests/oclgrind.sh). Here nothing is set above the field. */
    uint sign = (h & 0x8000u) << 16, field = h & 0x7c00u, m = h & 0x3ffu, e = field >> 10, r;
    if (field == 0x7c00u) {
        r = sign | 0x7f800000u | (m << 13);
    } else if (field == 0u) {
        if (m == 0u) {
            r = sign;
        } else {
            e = 113u;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            r = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        r = sign | ((e + 112u) << 23) | (m << 13);
    }
    y[yo + i] = r;
}
