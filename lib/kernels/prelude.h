/* The words that differ between the three dialects the shared kernel math
 * (lib/kernels/) is compiled in: C (the host backend and the tests), CUDA
 * (backends/cuda, on the device and the host) and OpenCL C 1.2 (embedded in
 * the OpenCL module's programs by backends/opencl/Makefile.mk, this file
 * first). Every header of lib/kernels/ includes this one and otherwise uses
 * only the C subset the three share: scalar functions of scalars, no
 * pointers to memory of an address space, no library calls but the
 * CHK_ math macros below, no recursion.
 *
 * One rule decided here, for every formula that accumulates (BatchNorm's
 * and LayerNorm's statistics and backward): chk_acc is double where the
 * device has it (C, CUDA, and OpenCL with cl_khr_fp64), float otherwise.
 * CHK_ACC_IS_DOUBLE says which.
 *
 * OpenCL programs are built from concatenated strings with no include
 * path, so a header of lib/kernels/ includes what it needs only outside
 * OpenCL C (#ifndef __OPENCL_VERSION__), and backends/opencl/program.c
 * lists the headers a program needs before its .cl source, this one
 * first. */
#ifndef CHORUS_LIB_KERNELS_PRELUDE_H
#define CHORUS_LIB_KERNELS_PRELUDE_H

#ifdef __OPENCL_VERSION__
/* Every multiply and add rounded on its own, as the build asks of C and
 * CUDA (-ffp-contract=off, --fmad=false). */
#pragma OPENCL FP_CONTRACT OFF
#ifdef cl_khr_fp64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define CHK_ACC_IS_DOUBLE 1
#else
#define CHK_ACC_IS_DOUBLE 0
#endif
typedef ushort chk_u16;
typedef uint chk_u32;
typedef ulong chk_u64;
typedef int chk_i32;
typedef long chk_i64;
#define CHK_FN
#define CHK_BITS_F32(u) as_float(u)
#define CHK_F32_BITS(f) as_uint(f)
#else /* C and CUDA */
#include <math.h>
#include <stdint.h>
#include <string.h>
typedef uint16_t chk_u16;
typedef uint32_t chk_u32;
typedef uint64_t chk_u64;
typedef int32_t chk_i32;
typedef int64_t chk_i64;
#define CHK_ACC_IS_DOUBLE 1
#ifdef __CUDACC__
#define CHK_FN static inline __host__ __device__
#else
#define CHK_FN static inline
#endif
/* memcpy is the bit cast C allows; CUDA compiles it to a move on the device. */
CHK_FN float chk_bits_f32(chk_u32 u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
CHK_FN chk_u32 chk_f32_bits(float f)
{
    chk_u32 u;
    memcpy(&u, &f, sizeof u);
    return u;
}
#define CHK_BITS_F32(u) chk_bits_f32(u)
#define CHK_F32_BITS(f) chk_f32_bits(f)
#endif

#if CHK_ACC_IS_DOUBLE
typedef double chk_acc;
#else
typedef float chk_acc;
#endif

/* Math on float, and on double where CHK_ACC_IS_DOUBLE (OpenCL's
 * functions are overloaded; C's and CUDA's are not). */
#ifdef __OPENCL_VERSION__
#define CHK_EXPF exp
#define CHK_LOGF log
#define CHK_TANHF tanh
#define CHK_ERFF erf
#define CHK_ERFCF erfc
#define CHK_SQRTF sqrt
#define CHK_FABSF fabs
#define CHK_EXP exp
#define CHK_TANH tanh
#define CHK_ERF erf
#define CHK_SQRT sqrt
#else
#define CHK_EXPF expf
#define CHK_LOGF logf
#define CHK_TANHF tanhf
#define CHK_ERFF erff
#define CHK_ERFCF erfcf
#define CHK_SQRTF sqrtf
#define CHK_FABSF fabsf
#define CHK_EXP exp
#define CHK_TANH tanh
#define CHK_ERF erf
#define CHK_SQRT sqrt
#endif

#endif
