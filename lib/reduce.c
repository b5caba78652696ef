/* The reducer: an all-reduce (sum) of f32 buffers over a list of streams,
 * host-staged, peer (the backends' allreduce_sum slot) or both.
 *
 * Participants are grouped once, in ch_reducer_new: two may share a peer
 * group when their devices are of one backend that has an allreduce_sum
 * slot and says (can_allreduce) it can take both devices in one call. A
 * call then runs the backend's all-reduce inside every group of two or
 * more, and, where there are several groups, sums the groups' first
 * members on the host and gives the total back to every participant.
 *
 * The host-staged sum: participants whose memory is device memory are
 * downloaded into pinned staging (all at once, each on its own stream);
 * participants whose "device" memory is host memory are read in place.
 * The sum is taken in participant order (s0 + s1 + s2 ...: the same bits
 * every run) by chi_sum_spread (lib/sum_spread.c), in parallel over
 * chunks, into the first participant's memory (in place when it is host
 * memory, else its staging); while each chunk is hot in cache it copies it to
 * the other host-memory participants and to the staging that the device
 * participants upload from (one staging per backend where it can: a
 * buffer pinned by a backend serves all of that backend's devices).
 *
 * A stage (ch_reducer_set_stage: data parallelism across processes) makes
 * every call host-staged, one group or several: the total is taken on the
 * host, passes through the stage, and only then is copied out.
 *
 * ch_reducer_set_dtype(CH_BF16) makes the host-staged sum move bf16
 * (stage_bf16): half the bytes cross, the sum is taken in f32 and rounded
 * once. In ch_reducer_reduce_scatter each participant needs its window
 * of the total only, and the host-staged sum uploads no more.
 *
 * Across processes without the host, through a backend's communicator:
 * lib/reduce_span.c. A call's stages on the trace: lib/reduce_trace.c.
 * What the three files share: lib/reduce_impl.h.
 *
 * Across streams (docs/DESIGN.md, Streams): everything is queued on the
 * participants' streams after what they already hold, and a call returns
 * only once every one of them is drained, after a failure too, so no work
 * of the reducer still reads a buffer or a staging buffer afterwards. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "reduce_impl.h"

/* ---- modes --------------------------------------------------------------- */

const char *ch_reduce_mode_name(ch_reduce_mode mode)
{
    switch (mode) {
    case CH_REDUCE_HOST: return "host";
    case CH_REDUCE_PEER: return "peer";
    case CH_REDUCE_AUTO: return "auto";
    }
    return "?";
}

ch_status ch_reduce_mode_parse(ch_reduce_mode *mode, const char *name)
{
    if (!name || !mode)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reduce_mode_parse: %s is NULL",
                         !name ? "name" : "mode");
    static const ch_reduce_mode all[] = {CH_REDUCE_HOST, CH_REDUCE_PEER, CH_REDUCE_AUTO};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, ch_reduce_mode_name(all[i])) == 0) {
            *mode = all[i];
            return CH_OK;
        }
    return chi_error(CH_ERR_INVALID_ARGUMENT,
                     "ch_reduce_mode_parse: \"%.64s\" is not a reduction mode (expected host, "
                     "peer or auto)",
                     name);
}

/* ---- grouping ------------------------------------------------------------ */

/* Whether participants on `a` and `b` can be in one peer group; when not,
 * `why` says so in a few words. */
static int can_join(const ch_device *a, const ch_device *b, char *why, size_t size)
{
    const ch_backend_i *be = a->be->iface;
    if (a->be != b->be) {
        snprintf(why, size, "different backends");
        return 0;
    }
    if (!be->allreduce_sum) {
        snprintf(why, size, "the %s backend has no peer all-reduce", a->be->name);
        return 0;
    }
    if (a == b)
        return 1;
    if (!be->can_allreduce || !be->can_allreduce(a->dev, b->dev)) {
        if (strcmp(a->info.platform, b->info.platform) != 0)
            snprintf(why, size, "they are on two %s platforms, %s and %s, with no context in "
                     "common", a->be->name, a->info.platform, b->info.platform);
        else
            snprintf(why, size, "the %s backend cannot reduce across them", a->be->name);
        return 0;
    }
    return 1;
}

static ch_status make_groups(ch_reducer *r)
{
    char why[320];
    r->ngroups = 0;
    for (int i = 0; i < r->n; i++) {
        ch_device *dev = r->streams[i]->dev;
        int g = -1;
        if (r->mode != CH_REDUCE_HOST)
            for (int k = 0; k < r->ngroups && g < 0; k++)
                if (can_join(r->streams[r->first[k]]->dev, dev, why, sizeof why))
                    g = k;
        if (g < 0 && r->mode == CH_REDUCE_PEER && i > 0) {
            ch_device *root = r->streams[0]->dev;
            (void)can_join(root, dev, why, sizeof why);
            return chi_error(CH_ERR_UNSUPPORTED,
                             "ch_reducer_new: peer reduction cannot join %s and %s (%s); use "
                             "auto or host",
                             root->id, dev->id, why);
        }
        if (g < 0) {
            g = r->ngroups++;
            r->first[g] = i;
            r->gsize[g] = 0;
        }
        r->group[i] = g;
        r->gsize[g]++;
    }
    return CH_OK;
}

/* Which participants get pinned staging: the members of the host-staged
 * sum (every participant in host mode, the first of each group in auto
 * with two groups or more; with a stage, the first of every group) whose
 * memory is device memory. */
static int needs_staging(const ch_reducer *r, int i, int staged)
{
    if (r->capacity == 0 || (r->ngroups < 2 && !staged) || host_memory(r->streams[i]->dev))
        return 0;
    return r->first[r->group[i]] == i;
}

static ch_status make_staging(ch_reducer *r, int i, int staged)
{
    if (r->staging[i] || !needs_staging(r, i, staged))
        return CH_OK;
    return ch_host_buffer_new(&r->staging[i], r->streams[i]->dev,
                              (size_t)r->capacity * sizeof(float));
}

/* ---- lifetime ------------------------------------------------------------ */

void ch_reducer_free(ch_reducer *r)
{
    if (!r)
        return;
    if (r->span)
        r->span_be->span_free(r->span);
    if (r->staging)
        for (int i = 0; i < r->n; i++)
            ch_host_buffer_free(r->staging[i]);
    for (int i = 0; r->half && i < r->n; i++)
        ch_tensor_free(r->half[i]);
    free(r->half);
    ch_host_buffer_free(r->t16);
    free(r->t32);
    free(r->hsrc);
    free(r->hsrc_bf16);
    free(r->hviews);
    free(r->streams);
    free(r->group);
    free(r->first);
    free(r->gsize);
    free(r->staging);
    free(r->views);
    free(r->saved);
    free(r->handles);
    free(r->mems);
    free(r->src);
    free(r->copies);
    free(r->upload_from);
    free(r->holders);
    chi_reducer_trace_free(r);
    free(r);
}

ch_status ch_reducer_new(ch_reducer **out, ch_stream *const *streams, int n, int64_t capacity,
                         ch_reduce_mode mode)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_new: out is NULL");
    *out = NULL;
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_reducer_new: call ch_init first");
    if (!streams)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_new: streams is NULL");
    if (n < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_new: n is %d, expected at least 1",
                         n);
    for (int i = 0; i < n; i++)
        if (!streams[i])
            return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_new: streams[%d] is NULL", i);
    if (capacity < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_reducer_new: capacity is %lld, expected at least 0",
                         (long long)capacity);
    if ((uint64_t)capacity > SIZE_MAX / 2 / sizeof(float))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_reducer_new: capacity %lld floats overflows the address space",
                         (long long)capacity);
    if (mode != CH_REDUCE_HOST && mode != CH_REDUCE_PEER && mode != CH_REDUCE_AUTO)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_reducer_new: mode %d is not a ch_reduce_mode (CH_REDUCE_HOST, "
                         "CH_REDUCE_PEER or CH_REDUCE_AUTO)",
                         (int)mode);

    ch_reducer *r = calloc(1, sizeof *r);
    if (!r)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_reducer_new: out of host memory");
    r->n = n;
    r->mode = mode;
    r->capacity = capacity;
    size_t un = (size_t)n;
    r->streams = calloc(un, sizeof *r->streams);
    r->group = calloc(un, sizeof *r->group);
    r->first = calloc(un, sizeof *r->first);
    r->gsize = calloc(un, sizeof *r->gsize);
    r->staging = calloc(un, sizeof *r->staging);
    r->views = calloc(un, sizeof *r->views);
    r->saved = calloc(un, sizeof *r->saved);
    r->handles = calloc(un, sizeof *r->handles);
    r->mems = calloc(un, sizeof *r->mems);
    r->src = calloc(un, sizeof *r->src);
    r->copies = calloc(un, sizeof *r->copies);
    r->upload_from = calloc(un, sizeof *r->upload_from);
    r->holders = calloc(un + 1, sizeof *r->holders);
    if (!r->streams || !r->group || !r->first || !r->gsize || !r->staging || !r->views ||
        !r->saved || !r->handles || !r->mems || !r->src || !r->copies || !r->upload_from ||
        !r->holders) {
        ch_reducer_free(r);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_reducer_new: out of host memory");
    }
    memcpy(r->streams, streams, un * sizeof *streams);
    ch_status st = make_groups(r);
    for (int i = 0; st == CH_OK && i < n; i++)
        st = make_staging(r, i, 0);
    if (st != CH_OK) {
        ch_reducer_free(r);
        return st;
    }
    *out = r;
    return CH_OK;
}

int ch_reducer_group_count(const ch_reducer *r) { return r ? r->ngroups : 0; }

int ch_reducer_group(const ch_reducer *r, int index)
{
    return r && index >= 0 && index < r->n ? r->group[index] : -1;
}

ch_reduce_mode ch_reducer_mode(const ch_reducer *r) { return r ? r->mode : CH_REDUCE_HOST; }

/* ---- settings ------------------------------------------------------------ */

ch_status ch_reducer_set_stage(ch_reducer *r, ch_reduce_stage_fn fn, void *user)
{
    if (!r)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_set_stage: r is NULL");
    /* The total is then always taken on the host: the first participant
     * of every group needs staging, one group or several. */
    for (int i = 0; fn && i < r->n; i++)
        TRY(make_staging(r, i, 1));
    r->stage = fn;
    r->stage_user = user;
    return CH_OK;
}

ch_status ch_reducer_set_stage_bf16(ch_reducer *r, ch_reduce_stage_bf16_fn fn, void *user)
{
    if (!r)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_set_stage_bf16: r is NULL");
    /* Its staging comes with ch_reducer_set_dtype(CH_BF16), the only
     * state in which it runs. */
    r->stage16 = fn;
    r->stage16_user = user;
    return CH_OK;
}

/* Whether the total goes through a stage in the reducer's current dtype. */
static int staged(const ch_reducer *r)
{
    return r->stage || (r->dtype == CH_BF16 && r->stage16);
}

ch_status ch_reducer_set_dtype(ch_reducer *r, ch_dtype dtype)
{
    static const char fn[] = "ch_reducer_set_dtype";
    if (!r)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: r is NULL", fn);
    if (dtype != CH_F32 && dtype != CH_BF16)
        return chi_error(CH_ERR_DTYPE, "%s: %s, expected f32 or bf16", fn, ch_dtype_name(dtype));
    if (dtype == r->dtype)
        return CH_OK;
    if (dtype == CH_BF16 && r->span)
        return chi_error(CH_ERR_STATE, "%s: the reducer spans processes through its backend, "
                         "which sums in f32", fn);
    if (dtype == CH_F32) {
        r->dtype = CH_F32;
        return CH_OK;
    }
    /* Staging for every group's first participant (as a stage needs), a
     * bf16 copy on every device participant, the pinned bf16 total. */
    ch_status st = CH_OK;
    size_t un = (size_t)r->n;
    if (!r->half) {
        r->half = calloc(un, sizeof *r->half);
        r->hsrc = calloc(un, sizeof *r->hsrc);
        r->hsrc_bf16 = calloc(un, sizeof *r->hsrc_bf16);
        r->hviews = calloc(un, sizeof *r->hviews);
        if (!r->half || !r->hsrc || !r->hsrc_bf16 || !r->hviews)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: out of host memory", fn);
    }
    int64_t cap = r->capacity > 0 ? r->capacity : 1;
    for (int i = 0; st == CH_OK && i < r->n; i++) {
        if (r->first[r->group[i]] == i)
            st = make_staging(r, i, 1);
        if (st == CH_OK && !r->half[i] && !host_memory(r->streams[i]->dev))
            st = ch_tensor_new(&r->half[i], r->streams[i]->dev, CH_BF16, 1, &cap);
        if (st == CH_OK && !r->t16 && !host_memory(r->streams[i]->dev))
            st = ch_host_buffer_new(&r->t16, r->streams[i]->dev, (size_t)cap * 2);
    }
    if (st == CH_OK && !r->t16)
        st = ch_host_buffer_new(&r->t16, r->streams[0]->dev, (size_t)cap * 2);
    if (st != CH_OK)
        return chi_error(st, "%s: %s", fn, ch_last_error());
    r->dtype = CH_BF16;
    return CH_OK;
}

/* ---- one call ------------------------------------------------------------ */

static ch_status check_call(const ch_reducer *r, ch_tensor *const *bufs, int64_t offset,
                            int64_t count)
{
    if (!r || !bufs)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_allreduce: %s is NULL",
                         !r ? "r" : "bufs");
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_reducer_allreduce: call ch_init first");
    if (offset < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_reducer_allreduce: offset is %lld, expected at least 0",
                         (long long)offset);
    if (count < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_reducer_allreduce: count is %lld, expected at least 0",
                         (long long)count);
    if (count > r->capacity)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_reducer_allreduce: count is %lld, more than the reducer's "
                         "capacity of %lld floats",
                         (long long)count, (long long)r->capacity);
    for (int i = 0; i < r->n; i++) {
        const ch_tensor *t = bufs[i];
        const ch_device *dev = r->streams[i]->dev;
        if (!t)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_allreduce: bufs[%d] is NULL",
                             i);
        if (t->dtype != CH_F32)
            return chi_error(CH_ERR_DTYPE, "ch_reducer_allreduce: bufs[%d] is %s, expected f32",
                             i, ch_dtype_name(t->dtype));
        if (t->dev != dev)
            return chi_error(CH_ERR_DEVICE_MISMATCH,
                             "ch_reducer_allreduce: bufs[%d] is on %s but streams[%d] is on %s",
                             i, t->dev->id, i, dev->id);
        if (offset > t->numel || count > t->numel - offset)
            return chi_error(CH_ERR_SHAPE,
                             "ch_reducer_allreduce: bufs[%d] holds %lld elements, too few for "
                             "offset %lld + count %lld",
                             i, (long long)t->numel, (long long)offset, (long long)count);
    }
    return CH_OK;
}

/* A 1-D view of elements [offset, offset + count) of t. */
static ch_status range_view(ch_tensor **out, ch_tensor *t, int64_t offset, int64_t count)
{
    if (t->ndim == 1)
        return ch_tensor_view(out, t, offset, count);
    ch_tensor *flat;
    ch_status st = ch_tensor_reshape(&flat, t, 1, &t->numel);
    if (st != CH_OK)
        return st;
    st = ch_tensor_view(out, flat, offset, count);
    ch_tensor_free(flat);
    return st;
}

static float *host_addr(const ch_tensor *v)
{
    chi_touch(v);
    return (float *)((char *)v->buf->ptr + v->off);
}

/* Peer all-reduce inside every group of two or more. */
static ch_status reduce_groups(ch_reducer *r, int64_t count)
{
    for (int g = 0; g < r->ngroups; g++) {
        if (r->gsize[g] < 2)
            continue;
        int k = 0;
        for (int i = r->first[g]; i < r->n; i++)
            if (r->group[i] == g) {
                r->handles[k] = r->streams[i]->handle;
                r->mems[k] = chi_mem(r->views[i]);
                chi_reducer_trace_mark(r, i, M_PEER0);
                k++;
            }
        const ch_backend_i *be = r->streams[r->first[g]]->dev->be->iface;
        ch_status st = be->allreduce_sum(k, r->handles, r->mems, count);
        if (st != CH_OK)
            return st;
        for (int i = r->first[g]; i < r->n; i++)
            if (r->group[i] == g)
                chi_reducer_trace_mark(r, i, M_PEER1);
    }
    return CH_OK;
}

/* The staging buffer that holds the total and is pinned by `dev`'s
 * backend, or NULL. */
static const ch_host_buffer *holder_for(const ch_reducer *r, int nholders, const ch_device *dev)
{
    for (int h = 0; h < nholders; h++)
        if (r->holders[h]->pinned && r->holders[h]->dev->be == dev->be)
            return r->holders[h];
    return NULL;
}

/* Host-staged sum over the first participant of every group, in group
 * order; the total goes to every participant. */
static ch_status stage_across_groups(ch_reducer *r, int64_t count)
{
    ch_status st = CH_OK;
    /* Downloads, queued on every device at once. */
    for (int g = 0; g < r->ngroups && st == CH_OK; g++) {
        int i = r->first[g];
        if (!host_memory(r->streams[i]->dev)) {
            st = ch_stream_set_current(r->streams[i]);
            chi_reducer_trace_mark(r, i, M_D2H0);
            if (st == CH_OK)
                st = ch_tensor_download_async(r->views[i], r->staging[i], 0);
            chi_reducer_trace_mark(r, i, M_D2H1);
        }
    }
    for (int g = 0; g < r->ngroups && st == CH_OK; g++) {
        int i = r->first[g];
        if (!host_memory(r->streams[i]->dev))
            st = ch_stream_sync(r->streams[i]);
    }
    if (st != CH_OK)
        return st;

    for (int g = 0; g < r->ngroups; g++) {
        int i = r->first[g];
        r->src[g] = host_memory(r->streams[i]->dev) ? host_addr(r->views[i])
                                                    : ch_host_buffer_data(r->staging[i]);
    }
    /* The total goes where the first source is: the sum is taken in place. */
    int i0 = r->first[0];
    float *total = (float *)r->src[0];
    int nholders = 0, ncopies = 0;
    if (!host_memory(r->streams[i0]->dev))
        r->holders[nholders++] = r->staging[i0];
    for (int i = 0; i < r->n; i++) {
        ch_device *dev = r->streams[i]->dev;
        r->upload_from[i] = NULL;
        if (host_memory(dev)) {
            float *p = host_addr(r->views[i]);
            if (p != total)
                r->copies[ncopies++] = p;
            continue;
        }
        const ch_host_buffer *h = holder_for(r, nholders, dev);
        if (!h && r->staging[i]) {
            /* Its own staging gets a copy of the total (unless it holds
             * the total already), and serves its backend from now on. */
            h = r->staging[i];
            if ((float *)ch_host_buffer_data(h) != total)
                r->copies[ncopies++] = ch_host_buffer_data(h);
            r->holders[nholders++] = h;
        }
        r->upload_from[i] = h;
    }
    if (r->tr.on)
        r->tr.sum0 = ch_clock_seconds();
    if (!r->stage) {
        chi_sum_spread(count, total, r->ngroups, r->src, ncopies, r->copies);
    } else {
        /* The total (one group's is in place already), then the stage,
         * then its copies. */
        if (r->ngroups > 1)
            chi_sum_spread(count, total, r->ngroups, r->src, 0, NULL);
        if (r->tr.on)
            r->tr.stage0 = ch_clock_seconds();
        st = r->stage(r->stage_user, total, count);
        if (r->tr.on)
            r->tr.stage1 = ch_clock_seconds();
        if (st != CH_OK)
            return st;
        const float *from[1] = {total};
        if (ncopies > 0)
            chi_sum_spread(count, r->copies[0], 1, from, ncopies - 1, r->copies + 1);
    }
    if (r->tr.on)
        r->tr.sum1 = ch_clock_seconds();

    /* Uploads, queued on every device at once. */
    for (int i = 0; i < r->n && st == CH_OK; i++) {
        ch_device *dev = r->streams[i]->dev;
        if (host_memory(dev))
            continue;
        st = ch_stream_set_current(r->streams[i]);
        if (st != CH_OK)
            break;
        /* A reduce-scatter's participant takes its window of the total. */
        int64_t first = r->win_first ? r->win_first[i] : 0;
        int64_t n = r->win_count ? r->win_count[i] : count;
        if (n == 0)
            continue;
        ch_tensor *part = r->views[i];
        if (n != count)
            st = range_view(&part, r->views[i], first, n);
        if (st != CH_OK)
            break;
        chi_reducer_trace_mark(r, i, M_H2D0);
        if (r->upload_from[i]) {
            st = ch_tensor_upload_async(part, r->upload_from[i], (size_t)first * sizeof(float));
        } else {
            /* No pinned copy of the total for this backend (not reached
             * with the staging made by ch_reducer_new): a plain upload. */
            st = ch_tensor_upload(part, total + first, (size_t)n * sizeof(float));
        }
        chi_reducer_trace_mark(r, i, M_H2D1);
        /* The view goes; the memory it names stays the caller's. */
        if (part != r->views[i])
            ch_tensor_free(part);
    }
    return st;
}

/* Elements per call of a bf16 stage: 2 MiB of bf16, 4 MiB of each f32
 * source. */
#define STAGE_SLICE ((int64_t)1 << 20)

/* The host-staged sum in bf16: every group's first participant's buffer
 * rounded to bf16 on its device and downloaded (half the bytes), host
 * participants' read in place and rounded, the sum taken in f32 in group
 * order and rounded to bf16 once (after an f32 stage, which gets the f32
 * total; before a bf16 stage, which leaves the job's bf16 total in its
 * place), and that bf16 total uploaded to every device participant and
 * widened there, and widened into every host participant: every
 * participant ends with the same values. */
static ch_status stage_bf16(ch_reducer *r, int64_t count)
{
    ch_status st = CH_OK;
    ch_tensor **half = r->hviews;
    memset(half, 0, (size_t)r->n * sizeof *half);
    for (int i = 0; i < r->n && st == CH_OK; i++)
        if (r->half[i])
            st = ch_tensor_view(&half[i], r->half[i], 0, count);
    /* Rounded on the devices and downloaded, queued on every device. */
    for (int g = 0; g < r->ngroups && st == CH_OK; g++) {
        int i = r->first[g];
        if (host_memory(r->streams[i]->dev))
            continue;
        st = ch_stream_set_current(r->streams[i]);
        chi_reducer_trace_mark(r, i, M_D2H0);
        if (st == CH_OK)
            st = ch_cast(half[i], r->views[i]);
        if (st == CH_OK)
            st = ch_tensor_download_async(half[i], r->staging[i], 0);
        chi_reducer_trace_mark(r, i, M_D2H1);
    }
    for (int g = 0; g < r->ngroups && st == CH_OK; g++) {
        int i = r->first[g];
        if (!host_memory(r->streams[i]->dev))
            st = ch_stream_sync(r->streams[i]);
    }
    /* The bf16 total is written only when a device participant takes it. */
    uint16_t *t16 = NULL;
    for (int i = 0; i < r->n; i++)
        if (r->half[i])
            t16 = ch_host_buffer_data(r->t16);
    if (st == CH_OK && r->tr.on)
        r->tr.sum0 = ch_clock_seconds();
    if (st == CH_OK) {
        for (int g = 0; g < r->ngroups; g++) {
            int i = r->first[g];
            int dev = !host_memory(r->streams[i]->dev);
            r->hsrc[g] = dev ? ch_host_buffer_data(r->staging[i])
                             : (const void *)host_addr(r->views[i]);
            r->hsrc_bf16[g] = dev;
        }
        /* Host participants get the widened total straight from the sum
         * (after the stage, from a second pass). */
        int ncopies = 0;
        for (int i = 0; i < r->n; i++)
            if (host_memory(r->streams[i]->dev))
                r->copies[ncopies++] = host_addr(r->views[i]);
        if (r->stage16) {
            /* The process's total rounded to bf16 through the stage, which
             * leaves the job's there, then widened into the host
             * participants: slice by slice, so that each slice's sources,
             * bf16 total and copies are still in cache from one step to
             * the next. */
            uint16_t *total = ch_host_buffer_data(r->t16);
            const void *one[1] = {total};
            const int bf16[1] = {1};
            for (int64_t lo = 0; lo < count && st == CH_OK; lo += STAGE_SLICE) {
                int64_t len = count - lo < STAGE_SLICE ? count - lo : STAGE_SLICE;
                chi_sum_bf16(lo, len, r->ngroups, r->hsrc, r->hsrc_bf16, NULL, total, 0, NULL);
                st = r->stage16(r->stage16_user, total + lo, len);
                if (st == CH_OK)
                    chi_sum_bf16(lo, len, 1, one, bf16, NULL, NULL, ncopies, r->copies);
            }
        } else if (r->stage) {
            if (!r->t32)
                r->t32 = malloc((size_t)(r->capacity > 0 ? r->capacity : 1) * sizeof(float));
            if (!r->t32)
                st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_reducer_allreduce: out of host memory");
            if (st == CH_OK) {
                chi_sum_bf16(0, count, r->ngroups, r->hsrc, r->hsrc_bf16, r->t32, NULL, 0, NULL);
                st = r->stage(r->stage_user, r->t32, count);
            }
            if (st == CH_OK) {
                const void *one[1] = {r->t32};
                const int f32[1] = {0};
                chi_sum_bf16(0, count, 1, one, f32, NULL, t16, ncopies, r->copies);
            }
        } else {
            chi_sum_bf16(0, count, r->ngroups, r->hsrc, r->hsrc_bf16, NULL, t16, ncopies,
                         r->copies);
        }
    }
    if (st == CH_OK && r->tr.on)
        r->tr.sum1 = ch_clock_seconds();
    /* Back to the devices: upload the bf16 total and widen it there. */
    for (int i = 0; i < r->n && st == CH_OK; i++) {
        if (!r->half[i])
            continue;
        st = ch_stream_set_current(r->streams[i]);
        chi_reducer_trace_mark(r, i, M_H2D0);
        if (st == CH_OK)
            st = r->t16->pinned && r->t16->dev->be == r->streams[i]->dev->be
                     ? ch_tensor_upload_async(half[i], r->t16, 0)
                     : ch_tensor_upload(half[i], t16, (size_t)count * 2);
        if (st == CH_OK)
            st = ch_cast(r->views[i], half[i]);
        chi_reducer_trace_mark(r, i, M_H2D1);
    }
    /* Nothing queued may still read the views or the staging: the caller
     * syncs every stream before the views go. */
    for (int i = 0; i < r->n; i++) {
        ch_tensor_free(half[i]);
        half[i] = NULL;
    }
    return st;
}

static ch_status sync_all(ch_reducer *r)
{
    ch_status st = CH_OK;
    for (int i = 0; i < r->n; i++) {
        ch_status s = ch_stream_sync(r->streams[i]);
        if (st == CH_OK)
            st = s;
    }
    return st;
}

static ch_status save_current(ch_reducer *r)
{
    for (int i = 0; i < r->n; i++) {
        ch_status st = ch_stream_get_current(&r->saved[i], r->streams[i]->dev);
        if (st != CH_OK)
            return st;
    }
    return CH_OK;
}

/* Back to what the caller had, in reverse order so that a device listed
 * twice ends with its first saved stream (both are the same). */
static ch_status restore_current(ch_reducer *r)
{
    ch_status st = CH_OK;
    for (int i = r->n - 1; i >= 0; i--) {
        ch_stream *s = r->saved[i];
        if (!s)
            continue;
        ch_status e = s == s->dev->default_stream ? ch_stream_reset_current(s->dev)
                                                  : ch_stream_set_current(s);
        if (st == CH_OK)
            st = e;
    }
    return st;
}

ch_status ch_reducer_reduce_scatter(ch_reducer *r, ch_tensor *const *bufs, int64_t offset,
                                    int64_t count, const int64_t *first, const int64_t *n)
{
    if (!first || !n)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_reducer_reduce_scatter: %s is NULL",
                         !first ? "first" : "n");
    TRY(check_call(r, bufs, offset, count));
    for (int i = 0; i < r->n; i++)
        if (first[i] < 0 || n[i] < 0 || first[i] > count || n[i] > count - first[i])
            return chi_error(CH_ERR_INVALID_ARGUMENT,
                             "ch_reducer_reduce_scatter: participant %d's window [%lld, + %lld) "
                             "is not inside the call's %lld elements",
                             i, (long long)first[i], (long long)n[i], (long long)count);
    r->win_first = first;
    r->win_count = n;
    ch_status st = ch_reducer_allreduce(r, bufs, offset, count);
    r->win_first = NULL;
    r->win_count = NULL;
    return st;
}

ch_status ch_reducer_allreduce(ch_reducer *r, ch_tensor *const *bufs, int64_t offset,
                               int64_t count)
{
    ch_status st = check_call(r, bufs, offset, count);
    if (st != CH_OK || (r->n == 1 && !staged(r) && !r->span) || count == 0)
        return st;

    memset(r->saved, 0, (size_t)r->n * sizeof *r->saved);
    memset(r->views, 0, (size_t)r->n * sizeof *r->views);
    chi_reducer_trace_begin(r);
    st = save_current(r);
    for (int i = 0; i < r->n && st == CH_OK; i++)
        st = range_view(&r->views[i], bufs[i], offset, count);
    int queued = 0;
    if (st == CH_OK && r->span) {
        /* One call of the backend over every participant of the job. */
        queued = 1;
        for (int i = 0; i < r->n; i++) {
            r->handles[i] = r->streams[i]->handle;
            r->mems[i] = chi_mem(r->views[i]);
            chi_reducer_trace_mark(r, i, M_PEER0);
        }
        st = r->span_be->span_allreduce(r->span, r->n, r->handles, r->mems, count);
        for (int i = 0; st == CH_OK && i < r->n; i++)
            chi_reducer_trace_mark(r, i, M_PEER1);
    } else if (st == CH_OK) {
        queued = 1;
        st = reduce_groups(r, count);
    }
    if (st == CH_OK && !r->span && r->dtype == CH_BF16 && (r->ngroups >= 2 || staged(r)))
        st = stage_bf16(r, count);
    else if (st == CH_OK && !r->span && (r->ngroups >= 2 || r->stage))
        st = stage_across_groups(r, count);
    /* Also after a failure: nothing queued may still touch the staging or
     * the views once this returns. The first failure's message is kept. */
    char why[512] = "";
    if (st != CH_OK)
        snprintf(why, sizeof why, "%s", ch_last_error());
    if (queued) {
        ch_status s = sync_all(r);
        if (st == CH_OK)
            st = s;
    }
    if (st == CH_OK)
        chi_reducer_trace_end(r);
    r->tr.on = 0;
    ch_status s = restore_current(r);
    if (st == CH_OK)
        st = s;
    for (int i = 0; i < r->n; i++) {
        ch_tensor_free(r->views[i]);
        r->views[i] = NULL;
    }
    if (why[0])
        chi_error(st, "%s", why);
    return st;
}
