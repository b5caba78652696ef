/* bench-allreduce: the reducer (chorus/reduce.h) over n replicas, 1 KiB to
 * 256 MiB in powers of 4, against the bound that memory copies set,
 * measured in the same run.
 *
 * For each size: the median and best time of ch_reducer_allreduce over the
 * whole buffers, the algorithm bandwidth (bytes / median time), memcpy's
 * bandwidth between two malloc'd buffers of that size (best of several),
 * and the ratio bound / median, where the bound moves every replica's
 * buffer once in and once out at memcpy speed: 2 * n * bytes / memcpy_bw.
 * A ratio of 1 means the reduction costs what 2n memcpys of the buffer
 * cost; above 1, less (the host-staged sum reads host replicas in place
 * and writes the total straight back).
 *
 * Under mpirun with two processes or more (a build with MPI), the
 * cross-process mode: each process reduces its own replicas (--devices,
 * default host) and the processes' totals are summed across the job, as
 * data parallelism does (ch_reducer_set_stage with ch_dist_sum_f32), against
 * MPI_Allreduce alone on one host buffer of the same size, timed in the same
 * run, each repetition after a barrier, the two interleaved. ratio = MPI's
 * median / ours (target: at least 0.9 from 4 MiB). With --bf16 there: the
 * reducer in f32 (stage ch_dist_sum_f32) against the reducer in bf16
 * (stage ch_dist_sum_bf16: half the bytes cross between the processes),
 * interleaved the same way, ratio = f32 median / bf16 median. */
#include "config.h"

#include <chorus.h>

#include "bench.h"
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_MPI
#include <mpi.h>
#endif

#define MAX_REPLICAS 16

/* Timed runs per size: as many as fit in about `budget` seconds, between
 * `lo` and `hi`. */
static int reps_for(double one_run, double budget, int lo, int hi)
{
    int r = one_run > 0 ? (int)(budget / one_run) : hi;
    return r < lo ? lo : r > hi ? hi : r;
}

/* memcpy bandwidth in bytes/s between two buffers of `bytes` (touched
 * first), best of several copies. */
static double memcpy_bw(size_t bytes)
{
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) {
        fprintf(stderr, "bench-allreduce: malloc(%zu) failed\n", bytes);
        exit(1);
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double t0 = ch_clock_seconds();
    memcpy(b, a, bytes);
    int reps = reps_for(ch_clock_seconds() - t0, 0.2, 5, 2000);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        t0 = ch_clock_seconds();
        memcpy(r % 2 ? a : b, r % 2 ? b : a, bytes);
        double t = ch_clock_seconds() - t0;
        if (t < best)
            best = t;
    }
    /* Keep the copies from being optimised away. */
    volatile char sink = a[bytes / 2] + b[bytes / 3];
    (void)sink;
    free(a);
    free(b);
    return (double)bytes / best;
}

#ifdef HAVE_MPI
/* The cross-process stage: the job's sum of the process's total. */
static ch_status across(void *user, float *total, int64_t count)
{
    return ch_dist_sum_f32(user, total, count);
}

static ch_status across_bf16(void *user, uint16_t *total, int64_t count)
{
    return ch_dist_sum_bf16(user, total, count);
}

static int size_label(char *out, size_t cap, size_t bytes)
{
    if (bytes >= (1u << 20))
        return snprintf(out, cap, "%zu MiB", bytes >> 20);
    return snprintf(out, cap, "%zu KiB", bytes >> 10);
}

/* Every process's sum against MPI_Allreduce alone (bf16: the reducer in
 * f32 against itself in bf16); rank 0 prints. */
static int cross_process(ch_dist *world, ch_device **devs, int n, const char *ids,
                         ch_reduce_mode mode, size_t min_bytes, size_t max_bytes, int bf16)
{
    int rank = ch_dist_rank(world), ranks = ch_dist_size(world);
    ch_stream *streams[MAX_REPLICAS];
    ch_tensor *bufs[MAX_REPLICAS];
    for (int i = 0; i < n; i++)
        BENCH_CHECK(ch_stream_new(&streams[i], devs[i]));
    ch_reducer *r;
    BENCH_CHECK(ch_reducer_new(&r, streams, n, (int64_t)(max_bytes / sizeof(float)), mode));
    BENCH_CHECK(ch_reducer_set_stage(r, across, world));
    BENCH_CHECK(ch_reducer_set_stage_bf16(r, across_bf16, world));
    if (rank == 0) {
        /* The two columns: MPI_Allreduce and ours, or ours in f32 and bf16. */
        const char *a = bf16 ? "f32" : "MPI", *b = bf16 ? "bf16" : "ours";
        bench_header(bf16 ? "bench-allreduce (across processes, bf16 against f32)"
                          : "bench-allreduce (across processes)");
        printf("# %d processes, each with %d replica%s on %s (rank 0's list), mode %s; %s\n",
               ranks, n, n == 1 ? "" : "s", ids, ch_reduce_mode_name(mode),
               bf16 ? "the reducer with the cross-process stage in f32 (ch_dist_sum_f32) and "
                      "in bf16 (ch_dist_sum_bf16), interleaved; ratio = f32 median / bf16 "
                      "median"
                    : "ours = the reducer with the cross-process stage, MPI = MPI_Allreduce "
                      "alone on one host buffer; ratio = MPI median / ours");
        char ms[2][16], gbs[2][16];
        snprintf(ms[0], sizeof ms[0], "%s ms", a);
        snprintf(ms[1], sizeof ms[1], "%s ms", b);
        snprintf(gbs[0], sizeof gbs[0], "%s GB/s", a);
        snprintf(gbs[1], sizeof gbs[1], "%s GB/s", b);
        printf("%10s %6s %12s %12s %10s %10s %7s\n", "size", "reps", ms[0], ms[1], gbs[0],
               gbs[1], "ratio");
    }
    double worst = 1e30, at64 = 0;
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        int64_t count = (int64_t)(bytes / sizeof(float));
        float *plain = malloc(bytes);
        if (!plain)
            return 1;
        for (int64_t k = 0; k < count; k++)
            plain[k] = (float)(rank + 1);
        for (int i = 0; i < n; i++) {
            BENCH_CHECK(ch_tensor_new(&bufs[i], devs[i], CH_F32, 1, &count));
            BENCH_CHECK(ch_fill(bufs[i], (double)(rank + 1)));
        }
        for (int i = 0; i < n; i++)
            BENCH_CHECK(ch_device_sync(devs[i]));
        /* Once checked: ours gives n times the ranks' sum, MPI the sum. */
        BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
        MPI_Allreduce(MPI_IN_PLACE, plain, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        float got[2], want = (float)(ranks * (ranks + 1) / 2);
        ch_tensor *v;
        BENCH_CHECK(ch_tensor_view(&v, bufs[n - 1], count - 1, 1));
        BENCH_CHECK(ch_tensor_download(v, &got[0], sizeof(float)));
        ch_tensor_free(v);
        got[1] = plain[count / 2];
        if (got[0] != want * (float)n || got[1] != want) {
            fprintf(stderr, "bench-allreduce: rank %d holds %g (ours) and %g (MPI), want %g "
                    "and %g\n", rank, got[0], got[1], want * (float)n, want);
            return 1;
        }
        for (int i = 0; i < n; i++)
            BENCH_CHECK(ch_fill(bufs[i], 0.0));
        for (int i = 0; i < n; i++)
            BENCH_CHECK(ch_device_sync(devs[i]));
        memset(plain, 0, bytes);
        /* Repetitions: rank 0's count from one timed call of each, for all. */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = ch_clock_seconds();
        BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
        MPI_Allreduce(MPI_IN_PLACE, plain, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        int reps = reps_for(ch_clock_seconds() - t0, 2.0, 5, 500);
        MPI_Bcast(&reps, 1, MPI_INT, 0, MPI_COMM_WORLD);
        double *tm = malloc(sizeof *tm * (size_t)reps), *to = malloc(sizeof *to * (size_t)reps);
        if (!tm || !to)
            return 1;
        /* bf16: tm holds the reducer's f32 times, to its bf16 ones. */
        for (int k = 0; k < reps; k++) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = ch_clock_seconds();
            if (bf16)
                BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
            else
                MPI_Allreduce(MPI_IN_PLACE, plain, (int)count, MPI_FLOAT, MPI_SUM,
                              MPI_COMM_WORLD);
            tm[k] = ch_clock_seconds() - t0;
            if (bf16)
                BENCH_CHECK(ch_reducer_set_dtype(r, CH_BF16));
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = ch_clock_seconds();
            BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
            to[k] = ch_clock_seconds() - t0;
            if (bf16)
                BENCH_CHECK(ch_reducer_set_dtype(r, CH_F32));
        }
        double mm = bench_median(tm, reps), mo = bench_median(to, reps);
        free(tm);
        free(to);
        free(plain);
        for (int i = 0; i < n; i++)
            ch_tensor_free(bufs[i]);
        if (rank != 0)
            continue;
        char size[32];
        size_label(size, sizeof size, bytes);
        printf("%10s %6d %12.3f %12.3f %10.2f %10.2f %7.2f\n", size, reps, mm * 1e3, mo * 1e3,
               (double)bytes / mm / 1e9, (double)bytes / mo / 1e9, mm / mo);
        fflush(stdout);
        if (bytes >= ((size_t)4 << 20) && mm / mo < worst)
            worst = mm / mo;
        if (bytes == ((size_t)64 << 20))
            at64 = mm / mo;
    }
    if (rank == 0 && worst < 1e30 && !bf16)
        printf("from 4 MiB: ours at %.2f of MPI_Allreduce's speed or better (target 0.9)\n",
               worst);
    if (rank == 0 && bf16 && at64 > 0)
        printf("64 MiB across %d processes: bf16 %.2fx as fast as f32 (target 1.6)\n", ranks,
               at64);
    ch_reducer_free(r);
    for (int i = 0; i < n; i++)
        ch_stream_free(streams[i]);
    return 0;
}
#endif

/* --bf16: the reducer in f32 and in bf16 (ch_reducer_set_dtype) on the
 * same buffers, the two interleaved call by call, from `min_bytes` (of
 * f32 data) up; ratio = f32 median / bf16 median (target: 1.6 at 64 MiB
 * on the host path). */
static int compare_bf16(ch_reducer *r, ch_device **devs, int n, const char *ids,
                        ch_reduce_mode mode, size_t min_bytes, size_t max_bytes)
{
    ch_tensor *bufs[MAX_REPLICAS];
    bench_header("bench-allreduce (bf16 against f32)");
    printf("# %d replicas on %s, mode %s; f32 and bf16 calls interleaved; ratio = f32 median "
           "/ bf16 median\n", n, ids, ch_reduce_mode_name(mode));
    printf("%10s %6s %12s %12s %7s\n", "size", "reps", "f32 ms", "bf16 ms", "ratio");
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
        int64_t count = (int64_t)(bytes / sizeof(float));
        for (int i = 0; i < n; i++) {
            BENCH_CHECK(ch_tensor_new(&bufs[i], devs[i], CH_F32, 1, &count));
            BENCH_CHECK(ch_fill(bufs[i], 0.0));
        }
        for (int i = 0; i < n; i++)
            BENCH_CHECK(ch_device_sync(devs[i]));
        double t0 = ch_clock_seconds();
        BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
        int reps = reps_for(ch_clock_seconds() - t0, 1.0, 5, 300);
        double *tf = malloc(sizeof *tf * (size_t)reps), *th = malloc(sizeof *th * (size_t)reps);
        if (!tf || !th)
            return 1;
        for (int k = 0; k < reps; k++) {
            for (int h = 0; h < 2; h++) {
                BENCH_CHECK(ch_reducer_set_dtype(r, h ? CH_BF16 : CH_F32));
                t0 = ch_clock_seconds();
                BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
                (h ? th : tf)[k] = ch_clock_seconds() - t0;
            }
        }
        BENCH_CHECK(ch_reducer_set_dtype(r, CH_F32));
        double mf = bench_median(tf, reps), mh = bench_median(th, reps);
        free(tf);
        free(th);
        for (int i = 0; i < n; i++)
            ch_tensor_free(bufs[i]);
        char size[32];
        if (bytes >= (1u << 20))
            snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
        else
            snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
        printf("%10s %6d %12.3f %12.3f %7.2f\n", size, reps, mf * 1e3, mh * 1e3, mf / mh);
        fflush(stdout);
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bench-allreduce [--devices LIST (default host,host,host; under mpirun, "
               "host for each process)] [--mode host|peer|auto] [--max-mb N (default 256)] "
               "[--min-kb N (default 1)] [--bf16 (bf16 against f32, interleaved)]\n");
}

int main(int argc, char **argv)
{
    const char *devices = "host,host,host";
    ch_reduce_mode mode = CH_REDUCE_HOST;
    long max_mb = 256, min_kb = 1;
    int bf16 = 0;
    static const struct option longs[] = {{"devices", required_argument, 0, 'd'},
                                          {"mode", required_argument, 0, 'm'},
                                          {"max-mb", required_argument, 0, 'x'},
                                          {"min-kb", required_argument, 0, 'n'},
                                          {"bf16", no_argument, 0, 'b'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'd': devices = optarg; break;
        case 'm':
            if (ch_reduce_mode_parse(&mode, optarg) != CH_OK) {
                fprintf(stderr, "bench-allreduce: --mode: %s\n", ch_last_error());
                return 2;
            }
            break;
        case 'x': max_mb = atol(optarg); break;
        case 'n': min_kb = atol(optarg); break;
        case 'b': bf16 = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (max_mb < 1 || max_mb > 4096 || min_kb < 1 || min_kb > max_mb * 1024) {
        fprintf(stderr, "bench-allreduce: --max-mb must be 1 to 4096, --min-kb 1 to it\n");
        return 2;
    }
    ch_dist *world = NULL;
    if (ch_dist_launched()) {
        BENCH_CHECK(ch_dist_init(&argc, &argv));
        world = ch_dist_world();
        if (ch_dist_size(world) > 1 && strcmp(devices, "host,host,host") == 0)
            devices = "host"; /* the default across processes: one host replica each */
    }
    BENCH_CHECK(ch_init());
    ch_device *devs[MAX_REPLICAS];
    ch_stream *streams[MAX_REPLICAS];
    ch_tensor *bufs[MAX_REPLICAS];
    int n = 0;
    if (ch_device_list_parse_replicas(devs, MAX_REPLICAS, &n, devices) != CH_OK) {
        fprintf(stderr, "bench-allreduce: --devices: %s\n", ch_last_error());
        return 2;
    }
    char ids[256] = "";
    for (int i = 0; i < n; i++) {
        size_t len = strlen(ids);
        snprintf(ids + len, sizeof ids - len, "%s%s", i ? "," : "", ch_device_id(devs[i]));
        BENCH_CHECK(ch_stream_new(&streams[i], devs[i]));
    }
    size_t max_bytes = (size_t)max_mb << 20;
    if (ch_dist_size(world) > 1) {
#ifdef HAVE_MPI
        int rc = cross_process(world, devs, n, ids, mode, (size_t)min_kb << 10, max_bytes,
                               bf16);
        ch_shutdown();
        ch_dist_finalize();
        return rc;
#endif
    }
    ch_reducer *r;
    BENCH_CHECK(ch_reducer_new(&r, streams, n, (int64_t)(max_bytes / sizeof(float)), mode));
    if (bf16) {
        int rc = compare_bf16(r, devs, n, ids, mode, (size_t)min_kb << 10, max_bytes);
        ch_reducer_free(r);
        for (int i = 0; i < n; i++)
            ch_stream_free(streams[i]);
        ch_shutdown();
        return rc;
    }

    bench_header("bench-allreduce");
    printf("# %d replicas on %s, mode %s (%d group%s); bound = 2 * %d * bytes / memcpy "
           "bandwidth, ratio = bound / median\n",
           n, ids, ch_reduce_mode_name(mode), ch_reducer_group_count(r),
           ch_reducer_group_count(r) == 1 ? "" : "s", n);
    printf("%10s %6s %10s %10s %10s %10s %10s %7s\n", "size", "reps", "median ms", "best ms",
           "alg GB/s", "memcpy GB/s", "bound ms", "ratio");
    double summary[4] = {0};
    for (size_t bytes = (size_t)min_kb << 10; bytes <= max_bytes; bytes *= 4) {
        int64_t count = (int64_t)(bytes / sizeof(float));
        for (int i = 0; i < n; i++) {
            BENCH_CHECK(ch_tensor_new(&bufs[i], devs[i], CH_F32, 1, &count));
            BENCH_CHECK(ch_fill(bufs[i], (double)(i + 1)));
        }
        /* Fills run on the default streams, the reducer on its own. */
        for (int i = 0; i < n; i++)
            BENCH_CHECK(ch_device_sync(devs[i]));
        /* Once checked: every element becomes 1 + 2 + ... + n. */
        BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
        float ends[2], want = (float)(n * (n + 1) / 2);
        for (int i = 0; i < n; i++) {
            ch_tensor *v;
            BENCH_CHECK(ch_tensor_view(&v, bufs[i], count - 1, 1));
            BENCH_CHECK(ch_tensor_download(v, &ends[1], sizeof(float)));
            ch_tensor_free(v);
            BENCH_CHECK(ch_tensor_view(&v, bufs[i], 0, 1));
            BENCH_CHECK(ch_tensor_download(v, &ends[0], sizeof(float)));
            ch_tensor_free(v);
            if (ends[0] != want || ends[1] != want) {
                fprintf(stderr, "bench-allreduce: %s holds %g ... %g, want %g\n",
                        ch_device_id(devs[i]), ends[0], ends[1], want);
                return 1;
            }
        }
        /* Zeros from here: repeated sums of them stay finite. */
        for (int i = 0; i < n; i++)
            BENCH_CHECK(ch_fill(bufs[i], 0.0));
        for (int i = 0; i < n; i++)
            BENCH_CHECK(ch_device_sync(devs[i]));
        double t0 = ch_clock_seconds();
        BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
        int reps = reps_for(ch_clock_seconds() - t0, 1.0, 5, 500);
        double *t = malloc(sizeof *t * (size_t)reps);
        if (!t)
            return 1;
        for (int k = 0; k < reps; k++) {
            t0 = ch_clock_seconds();
            BENCH_CHECK(ch_reducer_allreduce(r, bufs, 0, count));
            t[k] = ch_clock_seconds() - t0;
        }
        double best = t[0];
        for (int k = 1; k < reps; k++)
            best = t[k] < best ? t[k] : best;
        double median = bench_median(t, reps);
        free(t);
        double bw = memcpy_bw(bytes);
        double bound = 2.0 * n * (double)bytes / bw;
        char size[32];
        if (bytes >= (1u << 20))
            snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
        else
            snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
        printf("%10s %6d %10.3f %10.3f %10.2f %10.2f %10.3f %7.2f\n", size, reps, median * 1e3,
               best * 1e3, (double)bytes / median / 1e9, bw / 1e9, bound * 1e3, bound / median);
        fflush(stdout);
        if (bytes == (size_t)64 << 20) {
            summary[0] = median;
            summary[1] = (double)bytes / median;
            summary[2] = bw;
            summary[3] = bound / median;
        }
        for (int i = 0; i < n; i++)
            ch_tensor_free(bufs[i]);
    }
    if (summary[0] > 0)
        printf("64 MiB over %d replicas (%s), %s mode: %.2f ms, %.2f GB/s, memcpy %.2f GB/s, "
               "ratio %.2f (target 0.5)\n",
               n, ids, ch_reduce_mode_name(mode), summary[0] * 1e3, summary[1] / 1e9,
               summary[2] / 1e9, summary[3]);
    ch_reducer_free(r);
    for (int i = 0; i < n; i++)
        ch_stream_free(streams[i]);
    ch_shutdown();
    ch_dist_finalize();
    return 0;
}
