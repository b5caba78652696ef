/* Small helpers shared by the benchmarks. */
#ifndef CHORUS_BENCH_H
#define CHORUS_BENCH_H

#include <chorus.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

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

/* "name: <CPU model>, N CPUs, <date>": the machine and the day a result
 * belongs to, first line of every benchmark's output. */
static inline void bench_header(const char *name)
{
    char cpu[256] = "unknown CPU", line[512];
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "model name : %255[^\n]", cpu) == 1)
            break;
    if (f)
        fclose(f);
    char day[64] = "";
    time_t t = time(NULL);
    struct tm tm;
    if (localtime_r(&t, &tm))
        strftime(day, sizeof day, "%Y-%m-%d %H:%M", &tm);
    printf("# %s: %s, %ld CPUs, %s, chorus %s\n", name, cpu, sysconf(_SC_NPROCESSORS_ONLN), day,
           ch_version());
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
