/* im2col, col2im and 2-D max pooling over [N, C, H, W] inputs with a
 * kh x kw window, strides sh, sw and zero padding ph, pw; the output plane
 * is oh x ow. The index math is lib/kernels/index.h's. The adjoints
 * (col2im, pooling backward) gather: one work-item per input element sums
 * what it fed, so nothing needs atomics and the sum has a fixed order.
 *
 * This file is compiled once per index width (program.c): IDX is the
 * launch's index type (int or long, index.h's rule) and IDX_NAME(f) names
 * a kernel or an index.h function of that width. The geometry comes as
 * longs and is narrowed to IDX once. */

#define GEOM long n_, long c_, long h_, long w_, long oh_, long ow_, long kh_, long kw_, \
             long sh_, long sw_, long ph_, long pw_
#define GEOM_IDX                                                                      \
    IDX n = (IDX)n_, c = (IDX)c_, h = (IDX)h_, w = (IDX)w_, oh = (IDX)oh_, ow = (IDX)ow_, \
        kh = (IDX)kh_, kw = (IDX)kw_, sh = (IDX)sh_, sw = (IDX)sw_, ph = (IDX)ph_,         \
        pw = (IDX)pw_

/* col [c*kh*kw, n*oh*ow] */
__kernel void IDX_NAME(im2col)(__global float *col, ulong co, __global const float *x,
                               ulong xo, long total, GEOM)
{
    IDX i = (IDX)get_global_id(0);
    if (i >= total)
        return;
    GEOM_IDX;
    IDX cols = n * oh * ow;
    IDX row = i / cols, k = i % cols;
    IDX kj = row % kw, ki = row / kw % kh, ch = row / (kw * kh);
    IDX ox = k % ow, oy = k / ow % oh, b = k / (ow * oh);
    IDX y = IDX_NAME(chk_tap_in)(oy, sh, ph, ki), xx = IDX_NAME(chk_tap_in)(ox, sw, pw, kj);
    float v = 0.0f;
    if (y >= 0 && y < h && xx >= 0 && xx < w)
        v = x[xo + ((b * c + ch) * h + y) * w + xx];
    col[co + i] = v;
}

/* dx: each element the sum of the col entries taken from it, window
 * offsets (ki, kj) in increasing order. */
__kernel void IDX_NAME(col2im)(__global float *dx, ulong dxo, __global const float *col,
                               ulong co, long total, GEOM)
{
    IDX i = (IDX)get_global_id(0);
    if (i >= total)
        return;
    GEOM_IDX;
    IDX xx = i % w, y = i / w % h, ch = i / (w * h) % c, b = i / (w * h * c);
    IDX cols = n * oh * ow;
    float s = 0.0f;
    for (IDX ki = 0; ki < kh; ki++) {
        IDX oy = IDX_NAME(chk_tap_out)(y, sh, ph, ki, oh);
        if (oy < 0)
            continue;
        for (IDX kj = 0; kj < kw; kj++) {
            IDX ox = IDX_NAME(chk_tap_out)(xx, sw, pw, kj, ow);
            if (ox < 0)
                continue;
            IDX row = (ch * kh + ki) * kw + kj;
            s += col[co + row * cols + (b * oh + oy) * ow + ox];
        }
    }
    dx[dxo + i] = s;
}

/* y [n, c, oh, ow]: the max of the window's positions inside the plane
 * (padding never wins); idx: that position in the h*w plane, the first one
 * on ties; -1 and -inf when the window holds no position of the plane. */
__kernel void IDX_NAME(maxpool_forward)(__global float *y, ulong yo, __global int *idx,
                                        ulong io, __global const float *x, ulong xo,
                                        long total, GEOM)
{
    IDX i = (IDX)get_global_id(0);
    if (i >= total)
        return;
    GEOM_IDX;
    (void)n;
    (void)c;
    IDX ox = i % ow, oy = i / ow % oh, plane = i / (ow * oh);
    __global const float *p = x + xo + plane * h * w;
    float best = -INFINITY;
    IDX bi = -1;
    for (IDX ki = 0; ki < kh; ki++) {
        IDX yy = IDX_NAME(chk_tap_in)(oy, sh, ph, ki);
        if (yy < 0 || yy >= h)
            continue;
        for (IDX kj = 0; kj < kw; kj++) {
            IDX xx = IDX_NAME(chk_tap_in)(ox, sw, pw, kj);
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
    idx[io + i] = (int)bi;
}

/* dx: each input position the sum of dy over the windows that cover it
 * and chose it, windows in increasing (oy, ox) order. */
__kernel void IDX_NAME(maxpool_backward)(__global float *dx, ulong dxo, __global const float *dy,
                                         ulong dyo, __global const int *idx, ulong io,
                                         long total, GEOM)
{
    IDX i = (IDX)get_global_id(0);
    if (i >= total)
        return;
    GEOM_IDX;
    (void)n;
    (void)c;
    IDX xx = i % w, y = i / w % h, plane = i / (w * h);
    int target = (int)(y * w + xx);
    IDX base = plane * oh * ow;
    float s = 0.0f;
    IDX oy1 = IDX_NAME(chk_cover_hi)(y, sh, ph, oh), ox1 = IDX_NAME(chk_cover_hi)(xx, sw, pw, ow);
    for (IDX oy = IDX_NAME(chk_cover_lo)(y, sh, ph, kh); oy < oy1; oy++)
        for (IDX ox = IDX_NAME(chk_cover_lo)(xx, sw, pw, kw); ox < ox1; ox++)
            if (idx[io + base + oy * ow + ox] == target)
                s += dy[dyo + base + oy * ow + ox];
    dx[dxo + i] = s;
}

#undef GEOM
#undef GEOM_IDX
