/* The OpenCL backend (issue 3): device info, copies host -> A -> B -> host
 * of every size, which path each copy took, device limits, pinned
 * transfers, events across devices, GEMM shapes and the all-reduce.
 * The op-against-host suite is tests/test-ops.c. Run with
 * POCL_DEVICES="pthread pthread" (the harness sets it) for two devices in
 * one platform, and with a second vendor's runtime beside PoCL (Intel's
 * CPU runtime, from ./bootstrap) for two platforms. Pairs are chosen by
 * platform, not by index: two devices of one platform share a context
 * (peer copies, the peer all-reduce), two of two platforms do not (copies
 * staged through host memory, events waited for on the host, the peer
 * all-reduce refused). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "tap.h"

enum { MAXOCL = 8 };
static ch_device *ocl[MAXOCL];
static int nocl;
/* Two devices of one platform, and two of two platforms (NULL: none). */
static ch_device *same[2], *apart[2];

/* The backend's table and its handles, for what the public API cannot
 * reach: slots called with arguments the core would never pass. */
static const ch_backend_i *iface(ch_device *dev) { return dev->be->iface; }
static void *stream_of(ch_device *dev) { return dev->default_stream->handle; }
static ch_bmem bmem_of(const ch_tensor *t) { return (ch_bmem){t->buf->ptr, t->off}; }

static void find_devices(void)
{
    char why[512] = "the opencl backend is not listed";
    for (int i = 0; i < ch_backend_count(); i++) {
        ch_backend_info bi;
        if (ch_backend_get_info(i, &bi) == CH_OK && strcmp(bi.name, "opencl") == 0)
            snprintf(why, sizeof why, "%s", bi.available ? "it exposes none" : bi.detail);
    }
    ch_device *all[64];
    int n = tap_devices(all, 64);
    for (int i = 0; i < n && nocl < MAXOCL; i++) {
        ch_device_info info;
        if (ch_device_get_info(all[i], &info) == CH_OK && strcmp(info.backend, "opencl") == 0)
            ocl[nocl++] = all[i];
    }
    if (nocl == 0)
        tap_skip_all("no OpenCL device: %s", why);
    if (!tap_peer_pair(&same[0], &same[1]))
        same[0] = same[1] = NULL;
    if (!tap_cross_pair(&apart[0], &apart[1]))
        apart[0] = apart[1] = NULL;
}

static void test_info(ch_device *dev)
{
    ch_device_info info;
    if (!tap_status_ok(ch_device_get_info(dev, &info), "%s: info", ch_device_id(dev)))
        return;
    tap_ok(strcmp(info.backend, "opencl") == 0 && info.name[0] && info.vendor[0] &&
               info.platform[0],
           "%s: backend \"%s\", platform \"%s\", name \"%s\", vendor \"%s\"", info.id,
           info.backend, info.platform, info.name, info.vendor);
    tap_ok(info.memory_bytes > 0 && info.max_alloc_bytes > 0 &&
               info.max_alloc_bytes <= info.memory_bytes && info.compute_units >= 1,
           "%s: memory %llu, max alloc %llu, compute units %d", info.id,
           (unsigned long long)info.memory_bytes, (unsigned long long)info.max_alloc_bytes,
           info.compute_units);
    int pci_ok = info.pci_bus_id[0] == '\0' || strlen(info.pci_bus_id) == 12;
    tap_ok(pci_ok, "%s: PCI bus id \"%s\" is empty or dddd:bb:dd.f", info.id,
           info.pci_bus_id);
}

/* Fills `n` 4-byte words with a pattern that differs at every position. */
static void pattern(uint32_t *w, size_t n, uint64_t seed)
{
    tap_rng r = {seed};
    for (size_t i = 0; i < n; i++)
        w[i] = (uint32_t)tap_rng_next(&r);
}

static size_t first_diff(const uint32_t *a, const uint32_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i])
            return i;
    return n;
}

/* host -> a -> b -> host, `n` elements of `dtype`. */
static void test_round_trip(ch_device *a, ch_device *b, ch_dtype dtype, int64_t n)
{
    size_t bytes = (size_t)n * 4;
    uint32_t *src = malloc(bytes), *back = malloc(bytes);
    ch_tensor *host = NULL, *t0 = NULL, *t1 = NULL, *out = NULL;
    ch_device *hostdev;
    ch_status st = src && back ? ch_device_by_name(&hostdev, "host") : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_tensor_new(&host, hostdev, dtype, 1, &n);
    if (st == CH_OK) {
        pattern(src, (size_t)n, (uint64_t)n);
        memset(back, 0, bytes);
        st = ch_tensor_upload(host, src, bytes);
    }
    if (st == CH_OK)
        st = ch_tensor_to(&t0, host, a);
    if (st == CH_OK)
        st = ch_tensor_to(&t1, t0, b);
    if (st == CH_OK)
        st = ch_tensor_to(&out, t1, hostdev);
    if (st == CH_OK)
        st = ch_tensor_download(out, back, bytes);
    if (tap_status_ok(st, "%s x %lld: host -> %s -> %s -> host", ch_dtype_name(dtype),
                      (long long)n, ch_device_id(a), ch_device_id(b))) {
        size_t at = first_diff(src, back, (size_t)n);
        if (at == (size_t)n)
            tap_ok(1, "%s x %lld arrive intact through %s and %s", ch_dtype_name(dtype),
                   (long long)n, ch_device_id(a), ch_device_id(b));
        else
            tap_ok(0, "%s x %lld through %s and %s: element %zu is %08x, want %08x",
                   ch_dtype_name(dtype), (long long)n, ch_device_id(a), ch_device_id(b), at,
                   back[at], src[at]);
    }
    ch_tensor_free(out);
    ch_tensor_free(t1);
    ch_tensor_free(t0);
    ch_tensor_free(host);
    free(src);
    free(back);
}

/* One copy between two devices; how many copies into dst's device took
 * each path, and whether the bytes were counted with them. */
static ch_status counted_copy(ch_tensor *dst, const ch_tensor *src, uint64_t *peer,
                              uint64_t *staged)
{
    ch_transfer_stats a, b;
    ch_device *dev = ch_tensor_device(dst);
    ch_status st = ch_device_transfer_stats(dev, &a);
    if (st == CH_OK)
        st = ch_copy(dst, src);
    if (st == CH_OK)
        st = ch_device_transfer_stats(dev, &b);
    if (st != CH_OK)
        return st;
    *peer = b.peer_copies - a.peer_copies;
    *staged = b.staged_copies - a.staged_copies;
    uint64_t bytes = (b.peer_bytes - a.peer_bytes) + (b.staged_bytes - a.staged_bytes);
    tap_ok(bytes == ch_tensor_nbytes(src), "%s -> %s: %llu bytes counted, want %zu",
           ch_device_id(ch_tensor_device(src)), ch_device_id(dev), (unsigned long long)bytes,
           ch_tensor_nbytes(src));
    return CH_OK;
}

/* Which path a copy takes: host to a device through host memory; two
 * devices of one platform device to device (`peer`), of two platforms
 * through host memory; the data right either way. */
static void test_paths(ch_device *const *pair, int peer, const char *what)
{
    if (!pair[0]) {
        tap_skip("no two OpenCL devices %s: its copy paths are not tried", what);
        return;
    }
    const char *a_id = ch_device_id(pair[0]), *b_id = ch_device_id(pair[1]);
    int can = ch_device_can_peer(pair[0], pair[1]), back_can = ch_device_can_peer(pair[1], pair[0]);
    tap_ok(can == peer && back_can == peer, "%s and %s (%s): peer copies %s both ways (%d, %d)",
           a_id, b_id, what, peer ? "possible" : "impossible", can, back_can);
    ch_device *hostdev;
    ch_tensor *h = NULL, *a = NULL, *b = NULL;
    int64_t n = 4096;
    ch_status st = ch_device_by_name(&hostdev, "host");
    if (st == CH_OK)
        st = ch_tensor_new(&h, hostdev, CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_new(&a, pair[0], CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_new(&b, pair[1], CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_fill(h, 1.0);
    uint64_t npeer = 0, staged = 0;
    if (st == CH_OK)
        st = counted_copy(a, h, &npeer, &staged);
    tap_ok(st == CH_OK && npeer == 0 && staged == 1,
           "host -> %s goes through host memory (status %s, peer %llu, staged %llu)", a_id,
           ch_status_str(st), (unsigned long long)npeer, (unsigned long long)staged);
    if (st == CH_OK)
        st = counted_copy(b, a, &npeer, &staged);
    tap_ok(st == CH_OK && npeer == (uint64_t)peer && staged == (uint64_t)!peer,
           "%s -> %s %s (status %s, peer %llu, staged %llu)", a_id, b_id,
           peer ? "stays in the context" : "goes through host memory", ch_status_str(st),
           (unsigned long long)npeer, (unsigned long long)staged);
    float got[4096];
    if (st == CH_OK)
        st = ch_tensor_download(b, got, sizeof got);
    int64_t bad = 0;
    while (st == CH_OK && bad < n && got[bad] == 1.0f)
        bad++;
    tap_ok(st == CH_OK && bad == n, "%s -> %s: the copy holds the values (first wrong: %lld)",
           a_id, b_id, (long long)bad);
    ch_tensor_free(b);
    ch_tensor_free(a);
    ch_tensor_free(h);
}

static void test_limits(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_device_info info;
    if (ch_device_get_info(dev, &info) != CH_OK)
        return;
    int64_t n = (int64_t)(info.max_alloc_bytes / 4) + 1;
    ch_tensor *t = NULL;
    tap_status_is(ch_tensor_new(&t, dev, CH_F32, 1, &n), CH_ERR_LIMIT, NULL,
                  "%s: a tensor above the largest allocation (%llu bytes) is refused", id,
                  (unsigned long long)info.max_alloc_bytes);
    ch_tensor_free(t);

    void *ptr = NULL;
    tap_status_is(iface(dev)->alloc(dev->dev, (size_t)info.max_alloc_bytes + 1, &ptr),
                  CH_ERR_LIMIT, "CL_DEVICE_MAX_MEM_ALLOC_SIZE",
                  "%s: the backend refuses max alloc + 1 bytes without a driver call", id);

    /* A launch past what one kernel indexes, on a real (small) buffer: the
     * check comes before anything touches it. */
    int64_t small = 16;
    if (ch_tensor_new(&t, dev, CH_F32, 1, &small) != CH_OK)
        return;
    ch_bmem m = bmem_of(t);
    tap_status_is(iface(dev)->binary(stream_of(dev), CH_BIN_ADD, 3000000000LL, m, m, m),
                  CH_ERR_LIMIT, "3000000000 elements",
                  "%s: an elementwise launch of 3e9 work-items is refused", id);
    ch_conv_geom g = {1, 1, 65536, 65536, 65536, 65536, 1, 1, 1, 1, 0, 0};
    tap_status_is(iface(dev)->im2col(stream_of(dev), &g, m, m), CH_ERR_LIMIT, "im2col",
                  "%s: im2col of a 65536 x 65536 plane is refused", id);
    tap_status_ok(ch_device_sync(dev), "%s: the device is still usable afterwards", id);
    ch_tensor_free(t);
}

/* Pinned buffers of the device, asynchronous upload and download. */
static void test_pinned(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    int64_t n = 100003;
    size_t bytes = (size_t)n * 4;
    ch_host_buffer *in = NULL, *out = NULL;
    ch_tensor *t = NULL;
    ch_stream *s = NULL;
    ch_status st = ch_host_buffer_new(&in, dev, bytes);
    if (st == CH_OK)
        st = ch_host_buffer_new(&out, dev, bytes);
    if (st == CH_OK)
        st = ch_tensor_new(&t, dev, CH_I32, 1, &n);
    if (st == CH_OK) {
        pattern(ch_host_buffer_data(in), (size_t)n, 42);
        memset(ch_host_buffer_data(out), 0, bytes);
        st = ch_tensor_upload_async(t, in, 0);
    }
    if (st == CH_OK)
        st = ch_tensor_download_async(t, out, 0);
    if (st == CH_OK)
        st = ch_stream_get_current(&s, dev);
    if (st == CH_OK)
        st = ch_stream_sync(s);
    if (tap_status_ok(st, "%s: pinned upload and download of %zu bytes", id, bytes)) {
        const uint32_t *a = ch_host_buffer_data(in), *b = ch_host_buffer_data(out);
        size_t at = first_diff(a, b, (size_t)n);
        if (at == (size_t)n)
            tap_ok(1, "%s: pinned round trip intact", id);
        else
            tap_ok(0, "%s: pinned round trip: element %zu is %08x, want %08x", id, at, b[at],
                   a[at]);
    }
    ch_tensor_free(t);
    ch_host_buffer_free(out);
    ch_host_buffer_free(in);
}

/* A buffer pinned by one platform's device, uploaded to and downloaded
 * from a device of another platform asynchronously: to the other context
 * it is plain host memory, which stays untouched until the stream syncs. */
static void test_pinned_apart(void)
{
    if (!apart[0]) {
        tap_skip("no two OpenCL platforms: pinned memory of one used by the other not tried");
        return;
    }
    int64_t n = 4099;
    size_t bytes = (size_t)n * 4;
    ch_host_buffer *in = NULL, *out = NULL;
    ch_tensor *t = NULL;
    ch_stream *s = NULL;
    ch_status st = ch_host_buffer_new(&in, apart[0], bytes);
    if (st == CH_OK)
        st = ch_host_buffer_new(&out, apart[0], bytes);
    if (st == CH_OK)
        st = ch_tensor_new(&t, apart[1], CH_I32, 1, &n);
    for (int round = 0; round < 50 && st == CH_OK; round++) {
        pattern(ch_host_buffer_data(in), (size_t)n, 7 + (uint64_t)round);
        memset(ch_host_buffer_data(out), 0, bytes);
        st = ch_tensor_upload_async(t, in, 0);
        if (st == CH_OK)
            st = ch_tensor_download_async(t, out, 0);
        if (st == CH_OK)
            st = ch_stream_get_current(&s, apart[1]);
        if (st == CH_OK)
            st = ch_stream_sync(s);
        if (st == CH_OK &&
            first_diff(ch_host_buffer_data(in), ch_host_buffer_data(out), (size_t)n) != (size_t)n)
            st = chi_error(CH_ERR_INTERNAL, "round %d: the data came back changed", round);
    }
    tap_status_ok(st, "memory pinned by %s, uploaded to %s and back asynchronously, 50 rounds",
                  ch_device_id(apart[0]), ch_device_id(apart[1]));
    ch_tensor_free(t);
    ch_host_buffer_free(out);
    ch_host_buffer_free(in);
}

/* Work on a second stream of pair[0], then an event orders pair[1]'s
 * stream after it: the copy must see the fill, not what was there. Across
 * platforms the event is of another context, which no wait list may hold:
 * the host waits for it instead. */
static void test_events(ch_device *const *pair, const char *what)
{
    if (!pair[0]) {
        tap_skip("no two OpenCL devices %s: no event between them to test", what);
        return;
    }
    ch_device *ocl[2] = {pair[0], pair[1]};
    int64_t n = 1 << 20;
    ch_stream *s0 = NULL;
    ch_event *ev = NULL;
    ch_tensor *a = NULL, *b = NULL;
    float *back = malloc((size_t)n * sizeof *back);
    ch_status st = back ? ch_stream_new(&s0, ocl[0]) : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_tensor_new(&a, ocl[0], CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_new(&b, ocl[1], CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_fill(a, 1.0);
    if (st == CH_OK)
        st = ch_device_sync(ocl[0]);
    if (st == CH_OK)
        st = ch_stream_set_current(s0);
    if (st == CH_OK)
        st = ch_fill(a, 7.0);
    if (st == CH_OK)
        st = ch_event_new(&ev, ocl[0]);
    if (st == CH_OK)
        st = ch_event_record(ev, s0);
    if (st == CH_OK)
        st = ch_stream_reset_current(ocl[0]);
    ch_stream *s1 = NULL;
    if (st == CH_OK)
        st = ch_device_default_stream(&s1, ocl[1]);
    if (st == CH_OK)
        st = ch_event_wait(s1, ev);
    if (st == CH_OK)
        st = ch_copy(b, a);
    if (st == CH_OK)
        st = ch_tensor_download(b, back, (size_t)n * sizeof *back);
    if (tap_status_ok(st, "fill on a second stream of %s, event, copy to %s (%s)",
                      ch_device_id(ocl[0]), ch_device_id(ocl[1]), what)) {
        int64_t bad = 0;
        while (bad < n && back[bad] == 7.0f)
            bad++;
        if (bad == n)
            tap_ok(1, "the copy to %s saw the fill", ch_device_id(ocl[1]));
        else
            tap_ok(0, "the copy missed the fill: element %lld is %g, want 7", (long long)bad,
                   back[bad]);
    }
    ch_event_free(ev);
    ch_tensor_free(b);
    ch_tensor_free(a);
    ch_stream_free(s0);
    free(back);
}

/* GEMM shapes around the 64 x 64 tile and CLBlast's kernels, with
 * transposes, against a double reference (normalised by sum |a||b|). */
static void test_gemm(ch_device *dev, int m, int n, int k, int ta, int tb)
{
    float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
    float *c = malloc(sizeof(float) * m * n);
    tap_rng r = {(uint64_t)(m * 131 + n * 7 + k)};
    for (int i = 0; i < m * k; i++)
        a[i] = tap_rng_uniform(&r, -1, 1);
    for (int i = 0; i < k * n; i++)
        b[i] = tap_rng_uniform(&r, -1, 1);
    for (int i = 0; i < m * n; i++)
        c[i] = tap_rng_uniform(&r, -1, 1);
    int64_t sa[2] = {ta ? k : m, ta ? m : k}, sb[2] = {tb ? n : k, tb ? k : n};
    int64_t sc[2] = {m, n};
    ch_tensor *A = NULL, *B = NULL, *C = NULL;
    ch_status st = ch_tensor_new(&A, dev, CH_F32, 2, sa);
    if (st == CH_OK)
        st = ch_tensor_new(&B, dev, CH_F32, 2, sb);
    if (st == CH_OK)
        st = ch_tensor_new(&C, dev, CH_F32, 2, sc);
    if (st == CH_OK)
        st = ch_tensor_upload(A, a, sizeof(float) * m * k);
    if (st == CH_OK)
        st = ch_tensor_upload(B, b, sizeof(float) * k * n);
    if (st == CH_OK)
        st = ch_tensor_upload(C, c, sizeof(float) * m * n);
    float *got = malloc(sizeof(float) * m * n);
    if (st == CH_OK)
        st = ch_gemm(C, ta, tb, 0.75f, A, B, -0.5f);
    if (st == CH_OK)
        st = ch_tensor_download(C, got, sizeof(float) * m * n);
    double worst = 0;
    int wi = 0;
    for (int i = 0; st == CH_OK && i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = 0, mag = 0;
            for (int p = 0; p < k; p++) {
                double x = ta ? a[p * m + i] : a[i * k + p];
                double y = tb ? b[j * k + p] : b[p * n + j];
                s += x * y;
                mag += fabs(x * y);
            }
            double want = 0.75 * s - 0.5 * c[i * n + j];
            double err = fabs(got[i * n + j] - want) / (0.75 * mag + 0.5 * fabs(c[i * n + j]));
            if (!(err <= worst)) {
                worst = err;
                wi = i * n + j;
            }
        }
    if (tap_status_ok(st, "%s: gemm %dx%dx%d%s%s", ch_device_id(dev), m, n, k,
                      ta ? " A^T" : "", tb ? " B^T" : ""))
        tap_ok(worst < 1e-5, "%s: gemm %dx%dx%d%s%s: normalised error %.3g at %d < 1e-5",
               ch_device_id(dev), m, n, k, ta ? " A^T" : "", tb ? " B^T" : "", worst, wi);
    ch_tensor_free(C);
    ch_tensor_free(B);
    ch_tensor_free(A);
    free(a);
    free(b);
    free(c);
    free(got);
}

/* The optional all-reduce slot: two devices of one platform each hold a
 * vector; afterwards both hold the sum. Over two platforms (no shared
 * context) the slot refuses, naming both devices. */
static void test_allreduce_apart(void)
{
    if (!apart[0]) {
        tap_skip("no two OpenCL platforms: the all-reduce's refusal across them is not tried");
        return;
    }
    int64_t n = 16;
    ch_tensor *t[2] = {NULL, NULL};
    ch_status st = CH_OK;
    for (int i = 0; i < 2 && st == CH_OK; i++)
        st = ch_tensor_new(&t[i], apart[i], CH_F32, 1, &n);
    if (tap_status_ok(st, "buffers on %s and %s", ch_device_id(apart[0]), ch_device_id(apart[1]))) {
        void *streams[2] = {stream_of(apart[0]), stream_of(apart[1])};
        ch_bmem bufs[2] = {bmem_of(t[0]), bmem_of(t[1])};
        tap_status_is(iface(apart[0])->allreduce_sum(2, streams, bufs, n), CH_ERR_UNSUPPORTED,
                      "different platforms", "allreduce_sum over %s and %s (two platforms) is "
                      "refused", ch_device_id(apart[0]), ch_device_id(apart[1]));
        tap_ok(!iface(apart[0])->can_allreduce(apart[0]->dev, apart[1]->dev),
               "can_allreduce says no for %s and %s", ch_device_id(apart[0]),
               ch_device_id(apart[1]));
    }
    ch_tensor_free(t[0]);
    ch_tensor_free(t[1]);
}

static void test_allreduce(void)
{
    if (!same[0] || !iface(same[0])->allreduce_sum) {
        tap_skip(!same[0] ? "no two OpenCL devices of one platform" : "no allreduce_sum slot");
        return;
    }
    ch_device *ocl[2] = {same[0], same[1]};
    int64_t n = 300007;
    ch_tensor *t[2] = {NULL, NULL};
    ch_status st = CH_OK;
    for (int i = 0; i < 2 && st == CH_OK; i++) {
        st = ch_tensor_new(&t[i], ocl[i], CH_F32, 1, &n);
        if (st == CH_OK)
            st = ch_rand_uniform(t[i], 11, (uint64_t)i * (uint64_t)n, -1, 1);
    }
    float *x = malloc((size_t)n * 8), *got = malloc((size_t)n * 4);
    for (int i = 0; i < 2 && st == CH_OK; i++)
        st = ch_tensor_download(t[i], x + (size_t)i * n, (size_t)n * 4);
    void *streams[2] = {stream_of(ocl[0]), stream_of(ocl[1])};
    ch_bmem bufs[2] = {t[0] ? bmem_of(t[0]) : (ch_bmem){0}, t[1] ? bmem_of(t[1]) : (ch_bmem){0}};
    if (st == CH_OK)
        st = iface(ocl[0])->allreduce_sum(2, streams, bufs, n);
    int okays = 0;
    for (int i = 0; i < 2 && st == CH_OK; i++) {
        st = ch_tensor_download(t[i], got, (size_t)n * 4);
        int64_t bad = 0;
        while (st == CH_OK && bad < n && got[bad] == x[bad] + x[n + bad])
            bad++;
        okays += bad == n;
        if (bad < n)
            tap_diag("device %d, element %lld: got %g, want %g", i, (long long)bad, got[bad],
                     x[bad] + x[n + bad]);
    }
    if (tap_status_ok(st, "allreduce_sum over %s and %s", ch_device_id(ocl[0]),
                      ch_device_id(ocl[1])))
        tap_ok(okays == 2, "both devices hold the exact sum (%d of 2)", okays);
    ch_tensor_free(t[0]);
    ch_tensor_free(t[1]);
    free(x);
    free(got);
}

int main(void)
{
    /* Nothing is printed before find_devices: a skip must be the only line. */
    ch_status st = ch_init();
    if (st != CH_OK) {
        tap_status_ok(st, "ch_init");
        return tap_done();
    }
    find_devices();
    const char *gemm = getenv("CHORUS_OPENCL_GEMM");
    tap_diag("%d OpenCL device(s); GEMM: %s", nocl, gemm && *gemm ? gemm : "auto");
    for (int i = 0; i < nocl; i++)
        test_info(ocl[i]);

    /* From 1 element (the closest a tensor gets to 1 byte) to 64 MiB. */
    static const int64_t sizes[] = {1, 3, 1023, 65537, 1000003, 16 << 20};
    ch_device *first = same[0] ? same[0] : ocl[0], *second = same[0] ? same[1] : ocl[nocl - 1];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        test_round_trip(first, second, i % 2 ? CH_I32 : CH_F32, sizes[i]);
        if (apart[0])
            test_round_trip(apart[0], apart[1], i % 2 ? CH_I32 : CH_F32, sizes[i]);
    }

    test_paths(same, 1, "of one platform");
    test_paths(apart, 0, "of two platforms");
    test_events(same, "of one platform");
    test_events(apart, "of two platforms");
    test_pinned_apart();
    for (int i = 0; i < nocl; i++) {
        test_pinned(ocl[i]);
        test_limits(ocl[i]);
    }
    static const int shapes[][3] = {{1, 1, 1}, {64, 64, 64}, {65, 63, 129}, {1, 300, 17},
                                    {200, 1, 301}, {130, 70, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        test_gemm(ocl[i % nocl], shapes[i][0], shapes[i][1], shapes[i][2], i % 2, i / 2 % 2);
    test_allreduce();
    test_allreduce_apart();
    ch_shutdown();
    return tap_done();
}
