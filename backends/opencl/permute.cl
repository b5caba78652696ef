/* Permute (attention's head splits and joins): one work-item per element
 * of y, its source in x from lib/kernels/index.h's chk_permute_src. Shapes
 * of up to 8 dimensions come as long8 (y's shape, and the stride in x of
 * each of y's dimensions). Compiled once per index width, as conv.cl. */

__kernel void IDX_NAME(permute)(__global uint *y, ulong yo, __global const uint *x, ulong xo,
                                long n, int ndim, long8 yshape, long8 xstride)
{
    IDX i = (IDX)get_global_id(0);
    if (i >= n)
        return;
    long shape64[8], stride64[8];
    vstore8(yshape, 0, shape64);
    vstore8(xstride, 0, stride64);
    IDX shape[8], stride[8];
    for (int d = 0; d < ndim; d++) {
        shape[d] = (IDX)shape64[d];
        stride[d] = (IDX)stride64[d];
    }
    y[yo + i] = x[xo + IDX_NAME(chk_permute_src)(i, ndim, shape, stride)];
}
