/* OpenMP pragmas through a macro, so a build without OpenMP compiles them
 * away instead of warning about unknown pragmas: for the core's and the
 * host backend's parallel loops. */
#ifndef CHORUS_LIB_OMP_H
#define CHORUS_LIB_OMP_H

#ifdef _OPENMP
/* From the OpenMP API (its <omp.h> would be this file on our include path). */
int omp_get_max_threads(void);
int omp_get_thread_num(void);
int omp_get_num_threads(void);
#define CHI_OMP(x) _Pragma(#x)
#else
#define CHI_OMP(x)
#endif

/* The team a parallel region here would get, and this thread's place in
 * the current one: 1 and 0 without OpenMP. */
static inline int chi_omp_max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* The size of the current team: 1 outside a parallel region. */
static inline int chi_omp_threads(void)
{
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

static inline int chi_omp_thread(void)
{
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

#endif
