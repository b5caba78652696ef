/* Small helpers shared by the benchmarks. */
#ifndef CHORUS_BENCH_H
#define CHORUS_BENCH_H

#include <chorus.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static inline double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of n timings (sorts them). */
static inline double bench_median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return t[n / 2];
}

/* A benchmark has no error handling to speak of: stop with the message. */
#define BENCH_CHECK(call)                                                        \
    do {                                                                         \
        ch_status st_ = (call);                                                  \
        if (st_ != CH_OK) {                                                      \
            fprintf(stderr, "%s: %s\n", #call, ch_last_error());                 \
            exit(1);                                                             \
        }                                                                        \
    } while (0)

#endif
