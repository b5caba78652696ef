/* The core without any particular op: init, devices, tensors, views,
 * transfers, streams, events, host buffers and the caching allocator. */
#include <stdlib.h>
#include <string.h>

#include "tap.h"

static void test_init(void)
{
    tap_status_ok(ch_init(), "ch_init");
    tap_status_ok(ch_init(), "ch_init a second time is harmless");
    tap_ok(ch_device_count() >= 1, "at least one device (got %d)", ch_device_count());
    ch_device *host = NULL;
    tap_status_ok(ch_device_by_name(&host, "host"), "host is a device");
    ch_device_info info;
    if (host && tap_status_ok(ch_device_get_info(host, &info), "host info")) {
        tap_ok(strcmp(info.id, "host") == 0, "host's id is \"%s\"", info.id);
        tap_ok(info.memory_bytes > 0, "host memory %llu bytes",
               (unsigned long long)info.memory_bytes);
        tap_ok(info.compute_units >= 1, "host compute units %d", info.compute_units);
        tap_ok(info.in_all == 1, "host is part of \"all\"");
    }
    int nb = ch_backend_count(), host_seen = 0;
    for (int i = 0; i < nb; i++) {
        ch_backend_info bi;
        if (ch_backend_get_info(i, &bi) == CH_OK && strcmp(bi.name, "host") == 0)
            host_seen = bi.available;
        if (ch_backend_get_info(i, &bi) == CH_OK && !bi.available)
            tap_diag("backend %s unavailable: %s", bi.name, bi.detail);
    }
    tap_ok(host_seen, "the host backend is listed and available");
}

static void test_device_list(void)
{
    ch_device *list[64];
    int n = 0;
    tap_status_ok(ch_device_list_parse(list, 64, &n, "all"), "parse \"all\"");
    int cpu_in_all = 0;
    for (int i = 0; i < n; i++) {
        ch_device_info info;
        ch_device_get_info(list[i], &info);
        cpu_in_all += info.kind == CH_DEVICE_CPU && strcmp(info.backend, "host") != 0;
    }
    tap_ok(cpu_in_all == 0, "\"all\" leaves out OpenCL CPU devices (found %d)", cpu_in_all);
    tap_status_ok(ch_device_list_parse(list, 64, &n, "host"), "parse \"host\"");
    tap_ok(n == 1 && strcmp(ch_device_id(list[0]), "host") == 0, "\"host\" gives host (n=%d)", n);
    tap_status_is(ch_device_list_parse(list, 1, &n, "host,host"), CH_ERR_INVALID_ARGUMENT,
                  "twice", "a device listed twice is an error");
    tap_status_is(ch_device_list_parse(list, 64, &n, "host,cuda:99"),
                  CH_ERR_NOT_FOUND, "cuda:99", "an unknown device in a list names it");
    tap_ok(n == 0, "a failed parse leaves n = 0 (got %d)", n);
    /* Replicas: a device may come back, once per mention. */
    int nall = 0;
    tap_status_ok(ch_device_list_parse(list, 64, &nall, "all"), "parse \"all\" again");
    tap_status_ok(ch_device_list_parse_replicas(list, 64, &n, "host,all,host"),
                  "replicas: parse \"host,all,host\"");
    int hosts = 0;
    for (int i = 0; i < n; i++)
        hosts += strcmp(ch_device_id(list[i]), "host") == 0;
    tap_ok(n == nall + 2 && hosts == 3 && strcmp(ch_device_id(list[0]), "host") == 0 &&
               strcmp(ch_device_id(list[n - 1]), "host") == 0,
           "replicas: \"host,all,host\" gives host, the %d of all, host (n=%d, %d hosts)", nall,
           n, hosts);
}

static void test_tensors(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    int64_t shape[3] = {16, 3, 5};
    ch_tensor *t = NULL;
    if (!tap_status_ok(ch_tensor_new(&t, dev, CH_F32, 3, shape), "%s: new [16,3,5]", id))
        return;
    tap_ok(ch_tensor_numel(t) == 240 && ch_tensor_nbytes(t) == 960 && ch_tensor_ndim(t) == 3 &&
               ch_tensor_dim(t, -1) == 5 && ch_tensor_dim(t, 3) == 0,
           "%s: numel %lld, bytes %zu, dims", id, (long long)ch_tensor_numel(t),
           ch_tensor_nbytes(t));
    float src[240], back[240];
    for (int i = 0; i < 240; i++)
        src[i] = (float)i * 0.5f - 7.0f;
    tap_status_ok(ch_tensor_upload(t, src, sizeof src), "%s: upload", id);
    memset(back, 0, sizeof back);
    tap_status_ok(ch_tensor_download(t, back, sizeof back), "%s: download", id);
    tap_ok(memcmp(src, back, sizeof src) == 0, "%s: upload then download round-trips", id);

    ch_tensor *v = NULL;
    tap_status_ok(ch_tensor_view(&v, t, 4, 3), "%s: view rows 4..6", id);
    float vb[45];
    if (v && tap_status_ok(ch_tensor_download(v, vb, sizeof vb), "%s: download the view", id))
        tap_ok(memcmp(vb, src + 60, sizeof vb) == 0 && ch_tensor_dim(v, 0) == 3,
               "%s: the view holds rows 4..6 (first %g, want %g)", id, vb[0], src[60]);
    float ones[45];
    for (int i = 0; i < 45; i++)
        ones[i] = 1.0f;
    if (v)
        ch_tensor_upload(v, ones, sizeof ones);
    ch_tensor_free(t); /* the view keeps the memory alive */
    ch_tensor_download(v, vb, sizeof vb);
    tap_ok(vb[44] == 1.0f, "%s: a view outlives its parent (got %g)", id, vb[44]);
    int64_t flat[1] = {45};
    ch_tensor *r = NULL;
    tap_status_ok(ch_tensor_reshape(&r, v, 1, flat), "%s: reshape a view to [45]", id);
    ch_tensor_free(v);
    ch_tensor_free(r);
}

static void test_transfers(ch_device *a, ch_device *b)
{
    int64_t shape[1] = {100003};
    float *src = malloc(sizeof(float) * 100003), *back = malloc(sizeof(float) * 100003);
    for (int i = 0; i < 100003; i++)
        src[i] = (float)(i % 977) - 3.25f;
    ch_tensor *x = NULL, *y = NULL, *z = NULL;
    ch_tensor_new(&x, a, CH_F32, 1, shape);
    ch_tensor_upload(x, src, sizeof(float) * 100003);
    tap_status_ok(ch_tensor_to(&y, x, b), "%s -> %s with ch_tensor_to", ch_device_id(a),
                  ch_device_id(b));
    tap_status_ok(ch_tensor_to(&z, y, a), "%s -> %s back", ch_device_id(b), ch_device_id(a));
    memset(back, 0, sizeof(float) * 100003);
    if (z)
        ch_tensor_download(z, back, sizeof(float) * 100003);
    tap_ok(memcmp(src, back, sizeof(float) * 100003) == 0, "%s <-> %s round trip intact",
           ch_device_id(a), ch_device_id(b));
    ch_tensor_free(x);
    ch_tensor_free(y);
    ch_tensor_free(z);
    free(src);
    free(back);
}

static void test_streams(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_stream *s = NULL, *cur = NULL, *def = NULL;
    ch_event *e = NULL;
    tap_status_ok(ch_stream_new(&s, dev), "%s: new stream", id);
    ch_device_default_stream(&def, dev);
    tap_status_ok(ch_stream_set_current(s), "%s: make it current", id);
    ch_stream_get_current(&cur, dev);
    tap_ok(cur == s && ch_stream_device(s) == dev, "%s: it is current", id);
    int64_t shape[1] = {1000};
    ch_tensor *t = NULL;
    ch_tensor_new(&t, dev, CH_F32, 1, shape);
    ch_fill(t, 2.5);
    tap_status_ok(ch_event_new(&e, dev), "%s: new event", id);
    tap_status_ok(ch_event_record(e, s), "%s: record", id);
    tap_status_ok(ch_event_wait(def, e), "%s: default stream waits for it", id);
    tap_status_ok(ch_event_sync(e), "%s: event sync", id);
    tap_status_ok(ch_stream_reset_current(dev), "%s: back to the default stream", id);
    ch_stream_get_current(&cur, dev);
    tap_ok(cur == def, "%s: the default stream is current again", id);
    float back[1000];
    ch_tensor_download(t, back, sizeof back);
    tap_ok(back[0] == 2.5f && back[999] == 2.5f, "%s: fill on a side stream is seen (got %g)",
           id, back[999]);
    tap_status_ok(ch_device_sync(dev), "%s: device sync", id);
    ch_tensor_free(t);
    ch_event_free(e);
    ch_stream_free(s);

    ch_host_buffer *hb = NULL;
    if (tap_status_ok(ch_host_buffer_new(&hb, dev, 4000 + 64), "%s: pinned host buffer", id)) {
        float *p = ch_host_buffer_data(hb);
        for (int i = 0; i < 1016; i++)
            p[i] = (float)i;
        ch_tensor_new(&t, dev, CH_F32, 1, shape);
        ch_tensor_upload_async(t, hb, 64);
        ch_tensor_download(t, back, sizeof back);
        tap_ok(back[0] == 16.0f && back[999] == 1015.0f,
               "%s: async upload from offset 64 (got %g, %g)", id, back[0], back[999]);
        ch_fill(t, -1.0);
        ch_tensor_download_async(t, hb, 0);
        ch_device_sync(dev);
        tap_ok(p[0] == -1.0f && p[999] == -1.0f && p[1000] == 1000.0f,
               "%s: async download lands in place", id);
        ch_tensor_free(t);
        ch_host_buffer_free(hb);
    }
}

static void test_allocator(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_device_empty_cache(dev);
    ch_memory_stats before, after;
    ch_device_memory_stats(dev, &before);
    int64_t shape[1] = {300000};
    ch_tensor *t = NULL;
    ch_tensor_new(&t, dev, CH_F32, 1, shape);
    ch_tensor_free(t);
    ch_tensor_new(&t, dev, CH_F32, 1, shape);
    ch_device_memory_stats(dev, &after);
    tap_ok(after.cache_hits == before.cache_hits + 1 &&
               after.device_allocs == before.device_allocs + 1,
           "%s: a freed block is reused (hits %llu -> %llu, driver allocs %llu -> %llu)", id,
           (unsigned long long)before.cache_hits, (unsigned long long)after.cache_hits,
           (unsigned long long)before.device_allocs, (unsigned long long)after.device_allocs);
    tap_ok(after.in_use_bytes >= before.in_use_bytes + 1200000, "%s: in use counts it (%llu)",
           id, (unsigned long long)after.in_use_bytes);
    ch_tensor_free(t);
    ch_device_memory_stats(dev, &after);
    tap_ok(after.cached_bytes >= 1200000, "%s: freed memory is cached (%llu bytes)", id,
           (unsigned long long)after.cached_bytes);
    tap_status_ok(ch_device_empty_cache(dev), "%s: empty the cache", id);
    ch_device_memory_stats(dev, &after);
    tap_ok(after.cached_bytes == 0 && after.peak_bytes >= 1200000,
           "%s: the cache is empty (%llu), peak kept (%llu)", id,
           (unsigned long long)after.cached_bytes, (unsigned long long)after.peak_bytes);
}

/* Philox-4x32-10's known answers (Salmon et al., the Random123
 * distribution's kat_vectors), and the public function is the generator
 * the random ops draw from. */
static void test_philox(ch_device *host)
{
    static const uint32_t kat[3][3][4] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{~0u, ~0u, ~0u, ~0u}, {~0u, ~0u}, {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (int v = 0; v < 3; v++) {
        uint32_t c[4];
        memcpy(c, kat[v][0], sizeof c);
        ch_philox4x32(c, (uint64_t)kat[v][1][1] << 32 | kat[v][1][0]);
        tap_ok(memcmp(c, kat[v][2], sizeof c) == 0,
               "ch_philox4x32 known answer %d: got %08x %08x %08x %08x, want %08x %08x %08x %08x",
               v, c[0], c[1], c[2], c[3], kat[v][2][0], kat[v][2][1], kat[v][2][2], kat[v][2][3]);
    }
    enum { N = 1000 };
    const uint64_t seed = 0x0123456789abcdefull, offset = (uint64_t)1 << 32 | 7;
    int64_t n = N;
    ch_tensor *t = NULL;
    float got[N];
    if (!tap_status_ok(ch_tensor_new(&t, host, CH_F32, 1, &n), "philox: a host tensor") ||
        !tap_status_ok(ch_rand_uniform(t, seed, offset, 0.0f, 1.0f), "ch_rand_uniform") ||
        !tap_status_ok(ch_tensor_download(t, got, sizeof got), "download")) {
        ch_tensor_free(t);
        return;
    }
    int bad = -1;
    for (int i = 0; i < N && bad < 0; i++) {
        uint64_t k = offset + (uint64_t)i;
        uint32_t c[4] = {(uint32_t)k, (uint32_t)(k >> 32), 0, 0};
        ch_philox4x32(c, seed);
        if (got[i] != (float)(c[0] >> 8) * (1.0f / 16777216.0f))
            bad = i;
    }
    tap_ok(bad < 0, "ch_rand_uniform draws element i from ch_philox4x32 of counter offset + i "
           "(first difference at %d)", bad);
    ch_tensor_free(t);
}

int main(void)
{
    test_init();
    test_device_list();
    ch_device *devs[64];
    int n = tap_devices(devs, 64);
    ch_device *host = NULL;
    if (ch_device_by_name(&host, "host") == CH_OK)
        test_philox(host);
    for (int i = 0; i < n; i++) {
        test_tensors(devs[i]);
        test_streams(devs[i]);
        test_allocator(devs[i]);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (i != j)
                test_transfers(devs[i], devs[j]);
    ch_shutdown();
    tap_ok(ch_device_count() == 0, "no devices after ch_shutdown");
    tap_status_ok(ch_init(), "ch_init again after ch_shutdown");
    ch_shutdown();
    return tap_done();
}
