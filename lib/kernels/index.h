/* Index math for every backend (prelude.h says how this file is compiled
 * in C, CUDA and OpenCL C): which input element a column of im2col or a
 * max-pooling window reads, which column entries and windows sum back into
 * an input element (col2im, pooling backward), where an element of a
 * permute comes from, and BatchNorm's channel of an element. What stays
 * each backend's own: how the elements are shared out (loops, work-items,
 * threads), and the order of the sums, which the backends keep fixed
 * (window offsets, then outputs, ascending).
 *
 * THE index width rule, for every launch of these kernels: 32-bit index
 * math when chk_index_is_32 says every index of the launch fits, 64-bit
 * otherwise, decided once per launch (a division of 64-bit integers costs
 * several times one of 32-bit on a GPU, and these kernels divide per
 * element). So every function below exists for both widths: in C and
 * OpenCL C as name_32 (chk_i32) and name_64 (chk_i64); in CUDA as one
 * overloaded name, for templated kernels. */
#ifndef CHORUS_LIB_KERNELS_INDEX_H
#define CHORUS_LIB_KERNELS_INDEX_H

#ifndef __OPENCL_VERSION__
#include "kernels/prelude.h"
#endif

/* 32-bit index math when every index of the launch (element counts and
 * offsets, the largest passed here) is below 2^30: the other half of
 * int32's range leaves room for a grid-stride loop's step past the end. */
#define CHK_INDEX32_LIMIT ((chk_i64)1 << 30)

CHK_FN int chk_index_is_32(chk_i64 largest)
{
    return largest < CHK_INDEX32_LIMIT;
}

/* The largest index of a window op over x [n, c, h, w] with a kh x kw
 * window and an oh x ow output plane: the input's or the column matrix's
 * size ([c kh kw, n oh ow], larger than the output), whichever is larger;
 * the pooling ops, which have no column matrix, take the same bound. */
CHK_FN chk_i64 chk_window_largest(chk_i64 n, chk_i64 c, chk_i64 h, chk_i64 w, chk_i64 oh,
                                  chk_i64 ow, chk_i64 kh, chk_i64 kw)
{
    chk_i64 input = n * c * h * w, col = c * kh * kw * n * oh * ow;
    return input > col ? input : col;
}

/* The functions of one width T, named by NAME(f). Along one axis: s the
 * stride, p the padding, k a window offset (tap), in and out the input's
 * and output's extents. */
/* clang-format off */
#define CHK_INDEX_MATH(T, NAME)                                                               \
    /* The input coordinate output o's tap k reads: outside [0, in) it                     \
     * reads the padding (a 0 for im2col, nothing for pooling). */                          \
    CHK_FN T NAME(chk_tap_in)(T o, T s, T p, T k)                                           \
    {                                                                                       \
        return o * s - p + k;                                                               \
    }                                                                                       \
    /* The output whose tap k reads input coordinate y, or -1 where none                    \
     * does (col2im's gather). */                                                           \
    CHK_FN T NAME(chk_tap_out)(T y, T s, T p, T k, T out)                                   \
    {                                                                                       \
        T t = y + p - k;                                                                    \
        return t >= 0 && t % s == 0 && t / s < out ? t / s : -1;                            \
    }                                                                                       \
    /* The outputs [lo, hi) with lo s >= t and (hi - 1) s <= u, u >= 0 or                   \
     * hi = 0, clipped to [0, out): */                                                      \
    CHK_FN T NAME(chk_out_lo)(T t, T s)                                                     \
    {                                                                                       \
        return t <= 0 ? 0 : (t + s - 1) / s;                                                \
    }                                                                                       \
    CHK_FN T NAME(chk_out_hi)(T u, T s, T out)                                              \
    {                                                                                       \
        T hi = u < 0 ? 0 : u / s + 1;                                                       \
        return hi < out ? hi : out;                                                         \
    }                                                                                       \
    /* The outputs [lo, hi) whose window of k covers input coordinate y                     \
     * (pooling's backward). */                                                             \
    CHK_FN T NAME(chk_cover_lo)(T y, T s, T p, T k)                                         \
    {                                                                                       \
        return NAME(chk_out_lo)(y + p - k + 1, s);                                          \
    }                                                                                       \
    CHK_FN T NAME(chk_cover_hi)(T y, T s, T p, T out)                                       \
    {                                                                                       \
        return NAME(chk_out_hi)(y + p, s, out);                                             \
    }                                                                                       \
    /* The channel of element i of [outer, c, inner] (BatchNorm). */                        \
    CHK_FN T NAME(chk_channel_of)(T i, T c, T inner)                                        \
    {                                                                                       \
        return i / inner % c;                                                               \
    }                                                                                       \
    /* Permute: the offset in x of element i of y, y's shape and each of                    \
     * its dimensions' stride in x given (ndim of each, last fastest). */                   \
    CHK_FN T NAME(chk_permute_src)(T i, int ndim, const T *shape, const T *stride)          \
    {                                                                                       \
        T off = 0;                                                                          \
        for (int d = ndim - 1; d >= 0; d--) {                                               \
            off += i % shape[d] * stride[d];                                                \
            i /= shape[d];                                                                  \
        }                                                                                   \
        return off;                                                                         \
    }
/* clang-format on */

#ifdef __CUDACC__
#define CHK_INDEX_OVERLOAD(f) f
CHK_INDEX_MATH(chk_i32, CHK_INDEX_OVERLOAD)
CHK_INDEX_MATH(chk_i64, CHK_INDEX_OVERLOAD)
#else
#define CHK_INDEX_NAME_32(f) f##_32
#define CHK_INDEX_NAME_64(f) f##_64
CHK_INDEX_MATH(chk_i32, CHK_INDEX_NAME_32)
CHK_INDEX_MATH(chk_i64, CHK_INDEX_NAME_64)
#endif

#ifndef __OPENCL_VERSION__
/* The host side of a permute (C, and CUDA's host code): y's shape and the
 * stride in x of each of its dimensions, from x's shape and perm (y's
 * dimension i is x's perm[i]); returns the element count. */
static inline chk_i64 chk_permute_plan(int ndim, const chk_i64 *xshape, const int *perm,
                                       chk_i64 *yshape, chk_i64 *ystride)
{
    chk_i64 numel = 1;
    for (int i = 0; i < ndim; i++) {
        yshape[i] = xshape[perm[i]];
        ystride[i] = 1;
        for (int d = perm[i] + 1; d < ndim; d++)
            ystride[i] *= xshape[d];
        numel *= xshape[i];
    }
    return numel;
}
#endif

#endif
