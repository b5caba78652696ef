/* Chorus: all-reduce (sum) of float buffers over several devices, the
 * collective that data parallelism reduces gradients with. */
#ifndef CHORUS_REDUCE_H
#define CHORUS_REDUCE_H

#include <chorus/stream.h>
#include <chorus/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ch_reduce_mode {
    /* Every buffer goes to pinned host memory, the sum is taken on the
     * host in a fixed order (buffer 0 + buffer 1 + ...) in parallel over
     * chunks, and goes back: the same bits on every run, any devices. */
    CH_REDUCE_HOST = 0,
    /* Device to device, inside one backend: NCCL (or peer copies) across
     * CUDA devices, in-context copies and kernels across the devices of one
     * OpenCL platform, plain memory for host replicas. Every device must be
     * in one such group, or ch_reducer_new fails. */
    CH_REDUCE_PEER = 1,
    /* Peer inside each group of devices that can reduce together, then
     * host-staged across the groups. */
    CH_REDUCE_AUTO = 2
} ch_reduce_mode;

/* "host", "peer", "auto"; "?" for anything else. */
CH_API const char *ch_reduce_mode_name(ch_reduce_mode mode);
/* The reverse; CH_ERR_INVALID_ARGUMENT naming the accepted words. */
CH_API ch_status ch_reduce_mode_parse(ch_reduce_mode *mode, const char *name);

typedef struct ch_reducer ch_reducer;

/* A reducer over n streams (n >= 1), one per participant; each stream's
 * device is where that participant's buffer lives, and a device may appear
 * more than once (best with distinct streams, so that their work can
 * overlap). Buffers of up to `capacity` floats (>= 0) can be reduced;
 * pinned host staging for that size is allocated here, once, for the
 * participants whose memory is not host memory already. Fails with
 * CH_ERR_UNSUPPORTED, naming two devices that cannot reduce together, when
 * `mode` is peer and they are of different backends (or of different
 * OpenCL platforms). The streams must outlive the reducer. */
CH_API ch_status ch_reducer_new(ch_reducer **out, ch_stream *const *streams, int n,
                                int64_t capacity, ch_reduce_mode mode);
/* NULL: no-op. */
CH_API void ch_reducer_free(ch_reducer *r);

/* In place: elements [offset, offset + count) of every bufs[i] (f32,
 * contiguous, on the device of streams[i], at least offset + count
 * elements, any shape: the elements are counted in row-major order)
 * become the sum over i of those elements; count <= capacity, and count 0
 * does nothing. The ranges of different participants must not overlap.
 * The work is queued on the reducer's streams after whatever they already
 * hold, and the call returns when the sum is in every buffer. Only one
 * thread may use a reducer at a time; the calling thread's current streams
 * are left as they were. */
CH_API ch_status ch_reducer_allreduce(ch_reducer *r, ch_tensor *const *bufs, int64_t offset,
                                      int64_t count);

/* The same where participant i needs only elements [offset + first[i],
 * offset + first[i] + n[i]) of the sum (a reduce-scatter: the sharded
 * optimizer's owners). Each participant gets at least its window; where
 * the total moves through the host in f32 (host reduction, between
 * groups, with a stage) a device participant gets only that, less to
 * upload, and elsewhere its buffer is left as it was. Other paths (peer
 * reduction in one group, bf16, NCCL) still give every participant the
 * whole sum. CH_ERR_INVALID_ARGUMENT for a window outside [0, count). */
CH_API ch_status ch_reducer_reduce_scatter(ch_reducer *r, ch_tensor *const *bufs, int64_t offset,
                                           int64_t count, const int64_t *first, const int64_t *n);

/* A stage the total of every call passes through on the host before it
 * goes back to the participants: data parallelism across processes
 * (chorus/dp.h with a ch_dist) sums the processes' totals there. `fn` gets
 * host memory holding the `count` floats of the call's total (the
 * elements [offset, offset + count) of the buffers) and may change them
 * in place; its failure fails the call. With a stage, the total is taken
 * on the host in every mode (in peer mode too, after the peer all-reduce),
 * and a reducer of one participant calls it as well. NULL removes it.
 * Fails with CH_ERR_OUT_OF_MEMORY when the pinned staging it needs cannot
 * be allocated (the reducer is then unchanged). */
typedef ch_status (*ch_reduce_stage_fn)(void *user, float *total, int64_t count);
CH_API ch_status ch_reducer_set_stage(ch_reducer *r, ch_reduce_stage_fn fn, void *user);

/* The host-staged sum in bf16 (dtype CH_BF16; CH_F32, the default, turns
 * it back): every group's first participant rounds its buffer to bf16 on
 * its device, and half the bytes go to the host and back; host
 * participants are rounded as they are read. The sum is taken in f32, in
 * group order (the same bits every run), rounded to bf16 once (an f32
 * stage gets the f32 total first; a bf16 stage, below, the rounded one),
 * and every participant ends with that bf16 total widened to f32: the
 * same values everywhere. Applies where the
 * total goes through the host (host mode, auto across groups, a stage);
 * peer reduction inside a group stays f32, and a group's sum is rounded
 * once. The buffers stay f32. Allocates a bf16 copy of `capacity` on every
 * device participant and staging where missing: CH_ERR_OUT_OF_MEMORY
 * leaves the reducer as it was. CH_ERR_DTYPE for another dtype,
 * CH_ERR_STATE when the reducer spans processes (ch_reducer_span). */
CH_API ch_status ch_reducer_set_dtype(ch_reducer *r, ch_dtype dtype);
/* A stage for the reducer in bf16 (ch_reducer_set_dtype(CH_BF16)), taking
 * the place of ch_reducer_set_stage's there: `fn` gets host memory holding
 * the call's total rounded to bf16 (`count` bit patterns) and leaves in
 * place the bf16 values every participant is to get, widened. A call of
 * more than 2^20 elements gives it its total in pieces of 2^20 (the last
 * shorter), one call of `fn` each, in order, so that each piece is still
 * in cache when it comes back. Across processes (ch_dist_sum_bf16, which
 * data parallelism with reduce_dtype bf16 uses) it moves half the bytes
 * of the f32 stage. In f32 the reducer keeps using the f32 stage, if any;
 * NULL removes this one. */
typedef ch_status (*ch_reduce_stage_bf16_fn)(void *user, uint16_t *total, int64_t count);
CH_API ch_status ch_reducer_set_stage_bf16(ch_reducer *r, ch_reduce_stage_bf16_fn fn,
                                           void *user);

/* Across processes without the host: when every participant is on one
 * backend that can make communicators spanning processes (CUDA with NCCL),
 * each on its own device, and the mode is peer or auto, the reducers of
 * every process of a job can become one: ch_reducer_span_bytes says how
 * big the id that joins them is (0 when these participants cannot span);
 * one process makes the id (ch_reducer_span_id) and sends it to the others
 * (MPI_Bcast); every process then calls ch_reducer_span with the id, its
 * participants being participants [first, first + n) of the job's `total`
 * (this waits until every process has called it). From then on
 * ch_reducer_allreduce sums over every participant of every process in one
 * call of the backend (NCCL's all-reduce), without the host or the stage.
 * chorus/dp.h does this for a job of CUDA devices only. CH_ERR_UNSUPPORTED
 * when the participants cannot span; CH_ERR_STATE when this one spans
 * already. ch_reducer_spans says whether it does. */
CH_API size_t ch_reducer_span_bytes(const ch_reducer *r);
CH_API ch_status ch_reducer_span_id(ch_reducer *r, void *id);
CH_API ch_status ch_reducer_span(ch_reducer *r, const void *id, int first, int total);
CH_API int ch_reducer_spans(const ch_reducer *r);

/* How the participants were grouped: the number of peer groups (1 for
 * peer; n for host), and the group of participant `index` (-1 if out of
 * range). Groups are numbered in order of their first participant. */
CH_API int ch_reducer_group_count(const ch_reducer *r);
CH_API int ch_reducer_group(const ch_reducer *r, int index);
/* The mode the reducer was made with. */
CH_API ch_reduce_mode ch_reducer_mode(const ch_reducer *r);

#ifdef __cplusplus
}
#endif

#endif
