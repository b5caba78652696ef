/* OpenMP pragmas through a macro, so a build without OpenMP compiles them
 * away instead of warning about unknown pragmas: for the core's and the
 * host backend's parallel loops. */
#ifndef CHORUS_LIB_OMP_H
#define CHORUS_LIB_OMP_H

#ifdef _OPENMP
#define CHI_OMP(x) _Pragma(#x)
#else
#define CHI_OMP(x)
#endif

#endif
