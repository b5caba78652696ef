/* Elementwise kernels: one work-item per element, launched with a global
 * size rounded up to the work-group size, hence the bounds checks.
 * Every buffer comes with an element offset (the allocation is shared by
 * views, and sub-buffers would need an aligned origin). */

/* The host backend computes in plain C without fused multiply-adds; keep
 * the same roundings here. */
#pragma OPENCL FP_CONTRACT OFF

#define BIN_ADD 0
#define BIN_SUB 1
#define BIN_MUL 2

#define ACT_RELU 0
#define ACT_GELU 1
#define ACT_TANH 2
#define ACT_SIGMOID 3

__kernel void binary(__global float *y, ulong yo, __global const float *a, ulong ao,
                     __global const float *b, ulong bo, int n, int op)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float u = a[ao + i], v = b[bo + i];
    y[yo + i] = op == BIN_ADD ? u + v : op == BIN_SUB ? u - v : u * v;
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
    case ACT_RELU: r = v > 0.0f ? v : 0.0f; break;
    case ACT_GELU: r = v * gelu_cdf(v); break;
    case ACT_TANH: r = tanh(v); break;
    default: r = 1.0f / (1.0f + exp(-v)); break;
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
    case ACT_RELU: r = x[xo + i] > 0.0f ? g : 0.0f; break;
    case ACT_GELU: {
        float v = x[xo + i];
        float pdf = exp(-0.5f * v * v) * (M_2_SQRTPI_F * M_SQRT1_2_F * 0.5f);
        r = g * (gelu_cdf(v) + v * pdf);
        break;
    }
    case ACT_TANH: {
        /* (1 - t)(1 + t) rather than 1 - t^2, which cancels near |t| = 1. */
        float t = y[yo + i];
        r = g * ((1.0f - t) * (1.0f + t));
        break;
    }
    default: {
        float s = y[yo + i];
        r = g * (s * (1.0f - s));
        break;
    }
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

/* PyTorch's SGD, see include/chorus/ops.h. m is a placeholder when
 * momentum is 0. */
__kernel void sgd_step(__global float *p, ulong po, __global float *m, ulong mo,
                       __global const float *g, ulong go, int n, float lr,
                       float momentum, float dampening, float weight_decay,
                       int nesterov, int first_step)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float w = p[po + i];
    float d = g[go + i];
    if (weight_decay != 0.0f)
        d += weight_decay * w;
    if (momentum != 0.0f) {
        float buf = first_step ? d : momentum * m[mo + i] + (1.0f - dampening) * d;
        m[mo + i] = buf;
        d = nesterov ? d + momentum * buf : buf;
    }
    p[po + i] = w - lr * d;
}

/* Adam and AdamW; bc1 and bc2 are the bias corrections 1 - beta^step. */
__kernel void adam_step(__global float *p, ulong po, __global float *m, ulong mo,
                        __global float *v, ulong vo, __global const float *g, ulong go,
                        int n, float lr, float beta1, float beta2, float eps,
                        float weight_decay, int decoupled, float bc1, float bc2)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    float w = p[po + i];
    float d = g[go + i];
    if (decoupled)
        w -= lr * weight_decay * w;
    else
        d += weight_decay * w;
    float mi = beta1 * m[mo + i] + (1.0f - beta1) * d;
    float vi = beta2 * v[vo + i] + (1.0f - beta2) * d * d;
    m[mo + i] = mi;
    v[vo + i] = vi;
    p[po + i] = w - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
}
