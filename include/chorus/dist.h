/* Chorus: a job of several processes, on one machine or many, started by
 * an MPI launcher (mpirun, srun); the process group that data parallelism
 * (chorus/dp.h) spans.
 *
 * Without MPI in the build, or in a process started alone, the job is
 * this process: rank 0 of 1, and everything behaves as in one process. */
#ifndef CHORUS_DIST_H
#define CHORUS_DIST_H

#include <stddef.h>
#include <stdint.h>

#include <chorus/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_dist ch_dist;

/* 1 when the library was built with MPI (./configure --with-mpi). */
CH_API int ch_dist_built(void);

/* 1 when an MPI launcher (mpirun or mpiexec of Open MPI or MPICH, srun
 * with PMI or PMIx) started this process, from the variables it sets: a
 * program may then call ch_dist_init, and run as one process otherwise. */
CH_API int ch_dist_launched(void);

/* Join the job: initialises MPI (MPI_Init_thread; a program that has
 * initialised MPI itself keeps it, and ch_dist_finalize leaves it
 * initialised) and finds this process's rank, the job's size, and the
 * processes that share its machine. argc and argv (either may be NULL) go
 * to MPI_Init_thread. Without MPI in the build: a job of one process.
 * CH_ERR_STATE when called twice without ch_dist_finalize in between;
 * CH_ERR_UNAVAILABLE when MPI cannot start or cannot be called from
 * several threads (MPI_THREAD_SERIALIZED at least). */
CH_API ch_status ch_dist_init(int *argc, char ***argv);

/* Leave the job (MPI_Finalize when ch_dist_init initialised MPI). Every
 * process must call it, after freeing the data-parallel objects that use
 * the world; no-op when the job was not joined. */
CH_API ch_status ch_dist_finalize(void);

/* The job's process group after ch_dist_init, else NULL: NULL is also
 * accepted everywhere a ch_dist is, as a job of this process alone. */
CH_API ch_dist *ch_dist_world(void);

/* This process's rank in the group (0 for NULL), the group's size (1 for
 * NULL), and the same within the processes on this machine (MPI's
 * shared-memory split): the local rank picks this process's devices. */
CH_API int ch_dist_rank(const ch_dist *d);
CH_API int ch_dist_size(const ch_dist *d);
CH_API int ch_dist_local_rank(const ch_dist *d);
CH_API int ch_dist_local_size(const ch_dist *d);

/* The watchdog: a collective of the job (a gradient bucket's all-reduce,
 * BatchNorm's statistics, the end of a step) that has not completed after
 * this many seconds fails with CH_ERR_REMOTE instead of waiting for a
 * process that crashed or hangs; its message names the processes that did
 * not answer a ping within 2 s (ch_dist_init starts a thread in every
 * process of a job of two or more that answers them). Default 60; from the
 * environment variable CHORUS_DIST_TIMEOUT when set at ch_dist_init.
 * `seconds` must be > 0. */
CH_API ch_status ch_dist_set_timeout(ch_dist *d, double seconds);
CH_API double ch_dist_timeout(const ch_dist *d);

/* Every process of the group waits for the others (with the watchdog). */
CH_API ch_status ch_dist_barrier(ch_dist *d);

/* `bytes` bytes at `data` on rank `root` go to every process's `data`. */
CH_API ch_status ch_dist_broadcast(ch_dist *d, void *data, size_t bytes, int root);

/* In place: every process's `n` doubles become their sum over the group,
 * the same bits on every process. */
CH_API ch_status ch_dist_sum(ch_dist *d, double *values, int n);

/* The same for `n` floats (the stage data parallelism gives its reducer:
 * chorus/reduce.h, ch_reducer_set_stage). */
CH_API ch_status ch_dist_sum_f32(ch_dist *d, float *values, int64_t n);

/* In place, `n` bf16 values (their bit patterns): each becomes the sum
 * over the group of the processes' values, taken in f32 in rank order and
 * rounded to bf16 once (to nearest, ties to even): the same bits on every
 * process, while each process sends and receives half the bytes of
 * ch_dist_sum_f32 over as many elements (a reduce-scatter and an
 * all-gather of bf16). The stage of a reducer that reduces in bf16
 * (chorus/reduce.h, ch_reducer_set_stage_bf16). CH_ERR_OUT_OF_MEMORY when
 * the blocks it receives (about 2n bytes, kept for the next call) cannot
 * be allocated. */
CH_API ch_status ch_dist_sum_bf16(ch_dist *d, uint16_t *values, int64_t n);

#ifdef __cplusplus
}
#endif

#endif
