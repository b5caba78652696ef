/* Transfers and copies in the order a program sees them.
 *
 * An upload has landed when ch_tensor_upload returns: another stream of
 * the device reads the new values at once, with nothing else to order
 * them (OpenCL lets a blocking write return before the write has run,
 * once the host memory may be reused; Intel's runtime does so for writes
 * of up to a few hundred bytes). Checked on every device that is not the
 * host, many times over, since a race shows only now and then.
 *
 * A peer copy reads its source on the destination's stream: the source's
 * own stream must not overwrite it, nor the caching allocator hand its
 * block to a new tensor, before the copy is done. Run on two devices that
 * can peer (one OpenCL context, so copies between them are peer copies).
 *
 * To make the hazard likely, the destination's stream is kept busy with a
 * slow kernel before the copy is queued, while the source's stream is idle:
 * unordered, the source's next write runs at once and the copy, when it
 * finally starts, reads the new bytes. */
#include <stdlib.h>
#include <string.h>

#include "tap.h"

enum { ROUNDS = 4 };
static const int64_t N = (int64_t)4 << 20; /* 16 MiB of f32 */
static const int64_t BUSY = (int64_t)1 << 20;

/* Two devices that can peer (one OpenCL context). */
static ch_device *ocl0, *ocl1;

/* The first element of `b` that is not `want`, or n. */
static int64_t first_bad(const float *b, int64_t n, float want)
{
    int64_t i = 0;
    while (i < n && b[i] == want)
        i++;
    return i;
}

enum { UPLOAD_ROUNDS = 2000 };

/* Upload `len` floats on the default stream, read them back at once on a
 * stream of the test's own, UPLOAD_ROUNDS times with new values. */
static void test_upload_visible(ch_device *dev, int64_t len)
{
    const char *id = ch_device_id(dev);
    ch_stream *other = NULL;
    ch_tensor *t = NULL;
    float *v = malloc((size_t)len * sizeof *v), *back = malloc((size_t)len * sizeof *back);
    ch_status st = v && back ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_tensor_new(&t, dev, CH_F32, 1, &len);
    if (st == CH_OK)
        st = ch_stream_new(&other, dev);
    int stale = 0, round = 0;
    for (; st == CH_OK && round < UPLOAD_ROUNDS; round++) {
        for (int64_t i = 0; i < len; i++)
            v[i] = (float)(round + 1);
        st = ch_stream_reset_current(dev);
        if (st == CH_OK)
            st = ch_tensor_upload(t, v, (size_t)len * sizeof *v);
        /* The host memory may be reused now: scribble on it. */
        memset(v, 0xff, (size_t)len * sizeof *v);
        if (st == CH_OK)
            st = ch_stream_set_current(other);
        if (st == CH_OK)
            st = ch_tensor_download(t, back, (size_t)len * sizeof *back);
        if (st == CH_OK)
            stale += first_bad(back, len, (float)(round + 1)) != len;
    }
    ch_status reset = ch_stream_reset_current(dev);
    if (st == CH_OK)
        st = reset;
    if (tap_status_ok(st, "%s: %d uploads of %lld floats, each read on another stream", id,
                      round, (long long)len))
        tap_ok(stale == 0,
               "%s: every upload of %lld floats is there when ch_tensor_upload returns (%d of "
               "%d reads saw old values)",
               id, (long long)len, stale, round);
    ch_stream_free(other);
    ch_tensor_free(t);
    free(v);
    free(back);
}

typedef enum hazard { WRITE_SOURCE, FREE_AND_REUSE, TENSOR_TO } hazard;

static const char *hazard_name(hazard h)
{
    switch (h) {
    case WRITE_SOURCE: return "the source written right after the copy";
    case FREE_AND_REUSE: return "the source freed, reallocated and written";
    case TENSOR_TO: return "ch_tensor_to, then the source freed, reallocated and written";
    }
    return "?";
}

/* One round: `src` (on opencl:0) holds `value`; opencl:1's stream is busy;
 * the copy is queued, the hazard follows. *dst gets the copy. */
static ch_status round_trip(hazard h, ch_tensor **src, ch_tensor **dst, ch_tensor *busy,
                            float value, uint64_t *peer)
{
    ch_status st = ch_fill(*src, value);
    if (st == CH_OK)
        st = ch_device_sync(ocl0);
    if (st == CH_OK)
        st = ch_rand_normal(busy, 7, 0, 0.0f, 1.0f);
    ch_transfer_stats t0 = {0}, t1 = {0};
    if (st == CH_OK)
        st = ch_device_transfer_stats(ocl1, &t0);
    if (st == CH_OK && h == TENSOR_TO) {
        ch_tensor_free(*dst);
        *dst = NULL;
        st = ch_tensor_to(dst, *src, ocl1);
    } else if (st == CH_OK) {
        st = ch_copy(*dst, *src);
    }
    if (st == CH_OK)
        st = ch_device_transfer_stats(ocl1, &t1);
    *peer += t1.peer_copies - t0.peer_copies;
    if (st == CH_OK && h != WRITE_SOURCE) {
        ch_tensor_free(*src);
        *src = NULL;
        st = ch_tensor_new(src, ocl0, CH_F32, 1, &N);
    }
    if (st == CH_OK)
        st = ch_fill(*src, -1.0);
    return st;
}

static void test_hazard(hazard h, float *back)
{
    ch_tensor *src = NULL, *dst = NULL, *busy = NULL;
    ch_memory_stats before, after;
    ch_status st = ch_tensor_new(&src, ocl0, CH_F32, 1, &N);
    if (st == CH_OK)
        st = ch_tensor_new(&dst, ocl1, CH_F32, 1, &N);
    if (st == CH_OK)
        st = ch_tensor_new(&busy, ocl1, CH_F32, 1, &BUSY);
    if (st == CH_OK)
        st = ch_device_memory_stats(ocl0, &before);
    uint64_t peer = 0;
    int64_t bad = N;
    int round = 0;
    float value = 0.0f;
    for (; st == CH_OK && round < ROUNDS && bad == N; round++) {
        value = (float)(round + 1);
        st = round_trip(h, &src, &dst, busy, value, &peer);
        if (st == CH_OK)
            st = ch_tensor_download(dst, back, (size_t)N * sizeof *back);
        if (st == CH_OK)
            bad = first_bad(back, N, value);
    }
    if (st == CH_OK)
        st = ch_device_memory_stats(ocl0, &after);
    if (!tap_status_ok(st, "%s: %d rounds ran (of %d)", hazard_name(h), round, ROUNDS)) {
        tap_skip("the rounds failed: no copy to check");
    } else {
        tap_ok(peer == (uint64_t)round, "%s: every copy was a peer copy (%llu of %d)",
               hazard_name(h), (unsigned long long)peer, round);
        if (h != WRITE_SOURCE)
            tap_ok(after.cache_hits - before.cache_hits >= (uint64_t)round,
                   "%s: each new source reused the freed block (%llu cache hits in %d rounds)",
                   hazard_name(h), (unsigned long long)(after.cache_hits - before.cache_hits),
                   round);
        if (bad == N)
            tap_ok(1, "%s: the copy holds the source's bytes before the write, %d rounds",
                   hazard_name(h), round);
        else
            tap_ok(0, "%s: round %d: the copy's element %lld is %g, want %g", hazard_name(h),
                   round, (long long)bad, back[bad], value);
    }
    ch_device_sync(ocl0);
    ch_device_sync(ocl1);
    ch_tensor_free(busy);
    ch_tensor_free(dst);
    ch_tensor_free(src);
}

int main(void)
{
    ch_status st = ch_init();
    if (st != CH_OK) {
        tap_status_ok(st, "ch_init");
        return tap_done();
    }
    ch_device *devs[16];
    int ndev = tap_devices(devs, 16), tested = 0;
    for (int i = 0; i < ndev; i++) {
        ch_device_info info;
        if (ch_device_get_info(devs[i], &info) != CH_OK || strcmp(info.backend, "host") == 0)
            continue;
        test_upload_visible(devs[i], 1);
        test_upload_visible(devs[i], 37);
        tested++;
    }
    if (tested == 0)
        tap_skip("no device but the host: uploads to host memory are plain copies");

    if (!tap_peer_pair(&ocl0, &ocl1)) {
        tap_skip("no two devices that can peer (POCL_DEVICES=\"pthread pthread\" gives two "
                 "in one platform): the peer copy's order is not tested");
    } else {
        float *back = malloc((size_t)N * sizeof *back);
        if (!back)
            tap_skip_all("no host memory for %lld floats", (long long)N);
        test_hazard(WRITE_SOURCE, back);
        test_hazard(FREE_AND_REUSE, back);
        test_hazard(TENSOR_TO, back);
        free(back);
    }
    ch_shutdown();
    return tap_done();
}
