/* Elementwise kernels: one work-item per element, launched with a global
 * size rounded up to the work-group size, hence the bounds checks.
 * Every buffer comes with an element offset (the allocation is shared by
 * views, and sub-buffers would need an aligned origin). */

/* The host backend computes in plain C without fused multiply-adds; keep
 * the same roundings here (lib/kernels/prelude.h, placed first, says so
 * too).
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

/* The activations of lib/kernels/act.h (placed before this file's source
 * by program.c). */
__kernel void act_forward(__global float *y, ulong yo, __global const float *x,
                          ulong xo, int n, int act)
{
    int i = get_global_id(0);
    if (i < n)
        y[yo + i] = chk_act(act, x[xo + i]);
}

/* relu and the gelus read the forward input x, tanh and sigmoid its output y;
 * the other buffer is a placeholder then, never read. */
__kernel void act_backward(__global float *dx, ulong dxo, __global const float *dy,
                           ulong dyo, __global const float *x, ulong xo,
                           __global const float *y, ulong yo, int n, int act)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    int reads_x = chk_act_reads_x(act);
    dx[dxo + i] = chk_act_grad(act, dy[dyo + i], reads_x ? x[xo + i] : 0.0f,
                               reads_x ? 0.0f : y[yo + i]);
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

/* The optimizers' steps of lib/kernels/optim_step.h, whose scalars come
 * from lib/optim_consts.h (backends/opencl/ops.c): replicas on other
 * backends take the same step bit for bit. m is a placeholder, never
 * touched, without momentum. */
__kernel void sgd_step(__global float *p, ulong po, __global float *m, ulong mo,
                       __global const float *g, ulong go, int n, float lr,
                       float momentum, float damp, float weight_decay,
                       int nesterov, int first_step)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    chk_sgd_consts k;
    k.lr = lr;
    k.momentum = momentum;
    k.weight_decay = weight_decay;
    k.damp = damp;
    k.has_momentum = momentum != 0.0f;
    k.nesterov = nesterov;
    k.first_step = first_step;
    chk_sgd_state s;
    s.p = p[po + i];
    s.m = k.has_momentum && !first_step ? m[mo + i] : 0.0f;
    s = chk_sgd_step(k, s, g[go + i]);
    p[po + i] = s.p;
    if (k.has_momentum)
        m[mo + i] = s.m;
}

__kernel void adam_step(__global float *p, ulong po, __global float *m, ulong mo,
                        __global float *v, ulong vo, __global const float *g, ulong go,
                        int n, float beta1, float one_minus_beta1, float beta2,
                        float one_minus_beta2, float step_size, float bc2_sqrt, float eps,
                        float decay, float l2)
{
    int i = get_global_id(0);
    if (i >= n)
        return;
    chk_adam_consts k;
    k.beta1 = beta1;
    k.one_minus_beta1 = one_minus_beta1;
    k.beta2 = beta2;
    k.one_minus_beta2 = one_minus_beta2;
    k.step_size = step_size;
    k.bc2_sqrt = bc2_sqrt;
    k.eps = eps;
    k.decay = decay;
    k.l2 = l2;
    chk_adam_state s;
    s.p = p[po + i];
    s.m = m[mo + i];
    s.v = v[vo + i];
    s = chk_adam_step(k, s, g[go + i]);
    p[po + i] = s.p;
    m[mo + i] = s.m;
    v[vo + i] = s.v;
}

/* f32 <-> bf16 and f16 on the bits: lib/kernels/half_bits.h's functions.
 * Halves as ushort, floats as uint; offsets in elements. */
__kernel void f32_to_bf16(__global ushort *y, ulong yo, __global const uint *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[yo + i] = chk_f32_to_bf16(x[xo + i]);
}

__kernel void bf16_to_f32(__global uint *y, ulong yo, __global const ushort *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[yo + i] = chk_bf16_to_f32(x[xo + i]);
}

__kernel void f32_to_f16(__global ushort *y, ulong yo, __global const uint *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[yo + i] = chk_f32_to_f16(x[xo + i]);
}

__kernel void f16_to_f32(__global uint *y, ulong yo, __global const ushort *x, ulong xo, int n)
{
    int i = get_global_id(0);
    if (i < n)
        y[yo + i] = chk_f16_to_f32(x[xo + i]);
}
