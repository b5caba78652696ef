/* im2col, col2im and 2-D max pooling over [N, C, H, W] inputs with a
 * kh x kw window, strides sh, sw and zero padding ph, pw; the output plane
 * is oh x ow. The adjoints (col2im, pooling backward) gather: one work-item
 * per input element sums what it fed, so nothing needs atomics and the sum
 * has a fixed order. */

#pragma OPENCL FP_CONTRACT OFF

#define GEOM int n, int c, int h, int w, int oh, int ow, int kh, int kw, int sh, \
             int sw, int ph, int pw

/* col [c*kh*kw, n*oh*ow] */
__kernel void im2col(__global float *col, ulong co, __global const float *x, ulong xo,
                     int total, GEOM)
{
    int i = get_global_id(0);
    if (i >= total)
        return;
    int cols = n * oh * ow;
    int row = i / cols, k = i % cols;
    int kj = row % kw, ki = row / kw % kh, ch = row / (kw * kh);
    int ox = k % ow, oy = k / ow % oh, b = k / (ow * oh);
    int y = oy * sh - ph + ki, xx = ox * sw - pw + kj;
    float v = 0.0f;
    if (y >= 0 && y < h && xx >= 0 && xx < w)
        v = x[xo + ((b * c + ch) * h + y) * w + xx];
    col[co + i] = v;
}

/* The outputs whose window covers input row (or column) y: from the first
 * o with o*s - p + k - 1 >= y to the last with o*s - p <= y, clamped to the
 * output plane. */
int first_out(int y, int p, int k, int s)
{
    int t = y + p - k + 1;
    return t <= 0 ? 0 : (t + s - 1) / s;
}

int last_out(int y, int p, int s, int o)
{
    return min((y + p) / s, o - 1);
}

__kernel void col2im(__global float *dx, ulong dxo, __global const float *col, ulong co,
                     int total, GEOM)
{
    int i = get_global_id(0);
    if (i >= total)
        return;
    int xx = i % w, y = i / w % h, ch = i / (w * h) % c, b = i / (w * h * c);
    int cols = n * oh * ow;
    float s = 0.0f;
    for (int ki = 0; ki < kh; ki++) {
        int ty = y + ph - ki;
        if (ty < 0 || ty % sh != 0 || ty / sh >= oh)
            continue;
        for (int kj = 0; kj < kw; kj++) {
            int tx = xx + pw - kj;
            if (tx < 0 || tx % sw != 0 || tx / sw >= ow)
                continue;
            int row = (ch * kh + ki) * kw + kj;
            s += col[co + row * cols + (b * oh + ty / sh) * ow + tx / sw];
        }
    }
    dx[dxo + i] = s;
}

/* y [n, c, oh, ow]: the max of the window's positions inside the plane
 * (padding never wins); idx: that position in the h*w plane, the first one
 * on ties; -1 and -inf when the window holds no position of the plane. */
__kernel void maxpool_forward(__global float *y, ulong yo, __global int *idx, ulong io,
                              __global const float *x, ulong xo, int total, GEOM)
{
    int i = get_global_id(0);
    if (i >= total)
        return;
    int ox = i % ow, oy = i / ow % oh, plane = i / (ow * oh);
    __global const float *p = x + xo + (long)plane * h * w;
    float best = -INFINITY;
    int bi = -1;
    for (int ki = 0; ki < kh; ki++) {
        int yy = oy * sh - ph + ki;
        if (yy < 0 || yy >= h)
            continue;
        for (int kj = 0; kj < kw; kj++) {
            int xx = ox * sw - pw + kj;
            if (xx < 0 || xx >= w)
                continue;
            float v = p[yy * w + xx];
            if (bi < 0 || v > best) {
                best = v;
                bi = yy * w + xx;
            }
        }
    }
    y[yo + i] = best;
    idx[io + i] = bi;
}

__kernel void maxpool_backward(__global float *dx, ulong dxo, __global const float *dy,
                               ulong dyo, __global const int *idx, ulong io, int total,
                               GEOM)
{
    int i = get_global_id(0);
    if (i >= total)
        return;
    int xx = i % w, y = i / w % h, plane = i / (w * h);
    int target = y * w + xx;
    int base = plane * oh * ow;
    float s = 0.0f;
    int oy1 = last_out(y, ph, sh, oh), ox1 = last_out(xx, pw, sw, ow);
    for (int oy = first_out(y, ph, kh, sh); oy <= oy1; oy++)
        for (int ox = first_out(xx, pw, kw, sw); ox <= ox1; ox++)
            if (idx[io + base + oy * ow + ox] == target)
                s += dy[dyo + base + oy * ow + ox];
    dx[dxo + i] = s;
}
