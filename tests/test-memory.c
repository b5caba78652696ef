/* The memory account of every device (ch_device_memory_stats): what is in
 * use, cached and at its peak as tensors come and go, ch_device_reset_peak,
 * the backend's workspace and the staging buffers; and the limit
 * (ch_device_set_memory_limit): the cache is emptied before an allocation
 * is refused, the refusal names the device, the request and the limit, and
 * several threads allocating at once never take the device beyond it. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "tap.h"

#define MIB ((uint64_t)1 << 20)
#define KIB ((uint64_t)1 << 10)
/* The loss of test_workspace: rows of classes. */
#define ROWS 4096
#define CLASSES 8
/* test_threads' threads. */
#define THREADS 3

static ch_memory_stats stats_of(ch_device *dev)
{
    ch_memory_stats m;
    memset(&m, 0, sizeof m);
    ch_status st = ch_device_memory_stats(dev, &m);
    if (st != CH_OK)
        tap_status_ok(st, "%s: ch_device_memory_stats", ch_device_id(dev));
    return m;
}

static unsigned long long ull(uint64_t v)
{
    return (unsigned long long)v;
}

/* A 1-D f32 tensor of `bytes` (a multiple of 4), NULL after a failed TAP
 * line. */
static ch_tensor *tensor_of(ch_device *dev, uint64_t bytes)
{
    ch_tensor *t = NULL;
    int64_t n = (int64_t)(bytes / 4);
    ch_status st = ch_tensor_new(&t, dev, CH_F32, 1, &n);
    if (st != CH_OK)
        tap_status_ok(st, "%s: a tensor of %llu bytes", ch_device_id(dev), ull(bytes));
    return t;
}

/* Tensors in use, freed into the cache, reused; the peaks and their reset. */
static void test_accounting(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    tap_status_ok(ch_device_sync(dev), "%s: sync", id);
    tap_status_ok(ch_device_empty_cache(dev), "%s: empty the cache", id);
    tap_status_ok(ch_device_reset_peak(dev), "%s: ch_device_reset_peak", id);
    ch_memory_stats m0 = stats_of(dev);
    uint64_t base = m0.in_use_bytes;
    tap_ok(m0.peak_bytes == base && m0.peak_reserved_bytes == base && m0.cached_bytes == 0 &&
               m0.limit_bytes == 0,
           "%s: after a reset the peaks are what is in use (%llu, %llu, in use %llu), no "
           "cache (%llu), no limit (%llu)",
           id, ull(m0.peak_bytes), ull(m0.peak_reserved_bytes), ull(base), ull(m0.cached_bytes),
           ull(m0.limit_bytes));

    ch_tensor *a = tensor_of(dev, MIB), *b = tensor_of(dev, 2 * MIB);
    ch_memory_stats m1 = stats_of(dev);
    tap_ok(m1.in_use_bytes == base + 3 * MIB && m1.peak_bytes == base + 3 * MIB,
           "%s: 1 and 2 MiB tensors: in use %llu, peak %llu (want %llu both)", id,
           ull(m1.in_use_bytes), ull(m1.peak_bytes), ull(base + 3 * MIB));
    ch_tensor_free(a);
    ch_memory_stats m2 = stats_of(dev);
    tap_ok(m2.in_use_bytes == base + 2 * MIB && m2.cached_bytes == MIB &&
               m2.peak_bytes == base + 3 * MIB && m2.peak_reserved_bytes == base + 3 * MIB,
           "%s: the 1 MiB one freed: in use %llu, cached %llu, peak %llu and reserved peak %llu "
           "kept (want %llu, %llu, %llu, %llu)",
           id, ull(m2.in_use_bytes), ull(m2.cached_bytes), ull(m2.peak_bytes),
           ull(m2.peak_reserved_bytes), ull(base + 2 * MIB), ull(MIB), ull(base + 3 * MIB),
           ull(base + 3 * MIB));
    tap_status_ok(ch_device_reset_peak(dev), "%s: ch_device_reset_peak", id);
    ch_memory_stats m3 = stats_of(dev);
    tap_ok(m3.peak_bytes == base + 2 * MIB && m3.peak_reserved_bytes == base + 3 * MIB,
           "%s: reset: the peak is what is in use now (%llu, want %llu), the reserved peak "
           "that and the cache (%llu, want %llu)",
           id, ull(m3.peak_bytes), ull(base + 2 * MIB), ull(m3.peak_reserved_bytes),
           ull(base + 3 * MIB));
    a = tensor_of(dev, MIB);
    ch_memory_stats m4 = stats_of(dev);
    tap_ok(m4.cache_hits == m3.cache_hits + 1 && m4.device_allocs == m3.device_allocs &&
               m4.cached_bytes == 0 && m4.in_use_bytes == base + 3 * MIB &&
               m4.peak_bytes == base + 3 * MIB,
           "%s: 1 MiB again comes from the cache (hits %llu -> %llu, driver allocations %llu "
           "-> %llu, cached %llu, in use %llu, peak %llu)",
           id, ull(m3.cache_hits), ull(m4.cache_hits), ull(m3.device_allocs), ull(m4.device_allocs),
           ull(m4.cached_bytes), ull(m4.in_use_bytes), ull(m4.peak_bytes));
    /* A tensor's own bytes against its block's: 1000 elements ask for
     * 4000 bytes, in a block of the 4096-byte class. */
    ch_tensor *odd = tensor_of(dev, 4000);
    ch_memory_stats m6 = stats_of(dev);
    tap_ok(m6.tensor_bytes == m4.tensor_bytes + 4000 && m6.in_use_bytes == m4.in_use_bytes + 4096,
           "%s: a tensor of 4000 bytes: tensor bytes +%llu (want 4000), in use +%llu (its "
           "4096-byte class)",
           id, ull(m6.tensor_bytes - m4.tensor_bytes), ull(m6.in_use_bytes - m4.in_use_bytes));
    ch_tensor_free(odd);
    tap_ok(stats_of(dev).tensor_bytes == m4.tensor_bytes && m4.tensor_bytes <= m4.in_use_bytes,
           "%s: freed, the tensor bytes are back (%llu), within what is in use", id,
           ull(stats_of(dev).tensor_bytes));
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_memory_stats m5 = stats_of(dev);
    tap_ok(m5.in_use_bytes == base && m5.cached_bytes == 3 * MIB + 4096,
           "%s: all freed: in use %llu (want %llu), cached %llu (want %llu)", id,
           ull(m5.in_use_bytes), ull(base), ull(m5.cached_bytes), ull(3 * MIB + 4096));
    tap_status_ok(ch_device_empty_cache(dev), "%s: empty the cache", id);
}

/* "1.5 MiB": the library's way of writing sizes from 1 MiB to 1 GiB. */
static void mib_text(char *out, size_t cap, uint64_t bytes)
{
    snprintf(out, cap, "%.1f MiB", (double)bytes / (double)MIB);
}

/* The limit: refusal and its message, the cache emptied first, a limit
 * removed, below what is in use, above the device's memory. */
static void test_limit(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_device_empty_cache(dev);
    ch_device_reset_peak(dev);
    uint64_t base = stats_of(dev).in_use_bytes, limit = base + MIB + MIB / 2;
    tap_status_ok(ch_device_set_memory_limit(dev, limit), "%s: a limit of %llu bytes", id,
                  ull(limit));
    ch_memory_stats m = stats_of(dev);
    tap_ok(m.limit_bytes == limit, "%s: limit_bytes reports it (%llu, want %llu)", id,
           ull(m.limit_bytes), ull(limit));

    ch_tensor *a = tensor_of(dev, MIB), *b = NULL;
    int64_t n = (int64_t)(MIB / 4);
    ch_clear_error();
    ch_status st = ch_tensor_new(&b, dev, CH_F32, 1, &n);
    char want_limit[32], want[160];
    mib_text(want_limit, sizeof want_limit, limit);
    snprintf(want, sizeof want, "%s: 1.0 MiB requested with 1.0 MiB of its %s limit in use", id,
             want_limit);
    if (base != 0) /* in use is then not 1.0 MiB: look for the rest */
        snprintf(want, sizeof want, "%s: 1.0 MiB requested with ", id);
    const char *err = ch_last_error();
    tap_ok(st == CH_ERR_DEVICE_OUT_OF_MEMORY && !b && strstr(err, want) &&
               strstr(err, want_limit) && strstr(err, "ch_device_set_memory_limit"),
           "%s: a second 1 MiB beyond the limit -> %s \"%s\" (want %s, \"%s\")", id,
           ch_status_str(st), err, ch_status_str(CH_ERR_DEVICE_OUT_OF_MEMORY), want);
    m = stats_of(dev);
    tap_ok(m.in_use_bytes == base + MIB, "%s: the refusal took nothing (in use %llu, want %llu)",
           id, ull(m.in_use_bytes), ull(base + MIB));

    /* 1 MiB cached and 1.25 MiB asked: it fits only once the cache goes. */
    ch_tensor_free(a);
    uint64_t flushes = stats_of(dev).cache_flushes;
    a = tensor_of(dev, MIB + MIB / 4);
    m = stats_of(dev);
    tap_ok(a && m.cached_bytes == 0 && m.cache_flushes == flushes + 1 &&
               m.in_use_bytes == base + MIB + MIB / 4,
           "%s: 1.25 MiB with 1 MiB cached under a 1.5 MiB margin: the cache is emptied "
           "(flushes %llu -> %llu, cached %llu) and it fits (in use %llu)",
           id, ull(flushes), ull(m.cache_flushes), ull(m.cached_bytes), ull(m.in_use_bytes));
    ch_tensor_free(a);
    tap_ok(stats_of(dev).peak_reserved_bytes <= limit,
           "%s: in use and cached never went beyond the limit (reserved peak %llu of %llu)", id,
           ull(stats_of(dev).peak_reserved_bytes), ull(limit));

    ch_clear_error();
    n = (int64_t)(2 * MIB / 4);
    st = ch_tensor_new(&b, dev, CH_F32, 1, &n);
    tap_status_is(st, CH_ERR_DEVICE_OUT_OF_MEMORY, "2.0 MiB requested",
                  "%s: 2 MiB, more than the limit even with the cache emptied", id);
    m = stats_of(dev);
    tap_ok(m.cached_bytes == 0, "%s: the cache was emptied before the refusal (%llu cached)", id,
           ull(m.cached_bytes));

    tap_status_ok(ch_device_set_memory_limit(dev, 0), "%s: the limit removed", id);
    b = tensor_of(dev, 2 * MIB);
    tap_ok(b && stats_of(dev).limit_bytes == 0, "%s: then 2 MiB fits (limit_bytes %llu)", id,
           ull(stats_of(dev).limit_bytes));

    /* Below what is in use: allowed; what is held stays, a cached block
     * is reused, anything new is refused. */
    tap_status_ok(ch_device_set_memory_limit(dev, base + MIB),
                  "%s: a limit below what is in use is allowed", id);
    ch_tensor_free(b);
    b = tensor_of(dev, 2 * MIB);
    tap_ok(b != NULL, "%s: a cached block is reused beyond the limit (it adds nothing)", id);
    a = NULL;
    n = (int64_t)(KIB / 4);
    tap_status_is(ch_tensor_new(&a, dev, CH_F32, 1, &n), CH_ERR_DEVICE_OUT_OF_MEMORY, id,
                  "%s: 1 KiB more is refused", id);
    ch_tensor_free(a);
    ch_tensor_free(b);

    ch_device_info info;
    ch_status ist = ch_device_get_info(dev, &info);
    uint64_t above = ist == CH_OK ? 2 * info.memory_bytes + 1 : UINT64_MAX;
    tap_status_ok(ch_device_set_memory_limit(dev, above), "%s: a limit above its memory", id);
    a = tensor_of(dev, 2 * MIB);
    tap_ok(a != NULL, "%s: allocates as without one", id);
    ch_tensor_free(a);
    tap_status_ok(ch_device_set_memory_limit(dev, UINT64_MAX), "%s: a limit of UINT64_MAX", id);
    a = tensor_of(dev, 2 * MIB);
    tap_ok(a != NULL, "%s: allocates as without one", id);
    ch_tensor_free(a);
    tap_status_ok(ch_device_set_memory_limit(dev, 0), "%s: no limit", id);
    ch_device_empty_cache(dev);
}

/* A softmax cross-entropy over `rows` rows of CLASSES. */
typedef struct loss_case {
    ch_tensor *logits, *probs, *labels, *loss;
} loss_case;

static void loss_case_free(loss_case *c)
{
    ch_tensor_free(c->logits);
    ch_tensor_free(c->probs);
    ch_tensor_free(c->labels);
    ch_tensor_free(c->loss);
}

static ch_status loss_case_new(loss_case *c, ch_device *dev, int64_t rows)
{
    int64_t ls[2] = {rows, CLASSES}, one = 1;
    *c = (loss_case){0};
    ch_status st = ch_tensor_new(&c->logits, dev, CH_F32, 2, ls);
    if (st == CH_OK)
        st = ch_tensor_new(&c->probs, dev, CH_F32, 2, ls);
    if (st == CH_OK)
        st = ch_tensor_new(&c->labels, dev, CH_I32, 1, &rows);
    if (st == CH_OK)
        st = ch_tensor_new(&c->loss, dev, CH_F32, 1, &one);
    if (st == CH_OK)
        st = ch_fill(c->logits, 0.5);
    if (st == CH_OK)
        st = ch_fill(c->labels, 3);
    if (st != CH_OK)
        loss_case_free(c);
    return st;
}

static ch_status loss_run(const loss_case *c, ch_device *dev)
{
    ch_status st = ch_softmax_xent(c->loss, c->probs, c->logits, c->labels);
    return st == CH_OK ? ch_device_sync(dev) : st;
}

/* What the backend allocates for itself: a loss op's scratch (a float per
 * row, among others). The host has none; OpenCL and CUDA keep check
 * words and a scratch per stream, the scratch grown to the largest
 * request. It is in use, in the peak, and under the
 * limit: a loss on 4 times the rows wants more than was there. */
static void test_workspace(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_device_info info;
    if (!tap_status_ok(ch_device_get_info(dev, &info), "%s: info", id))
        return;
    loss_case small, big;
    ch_status st = loss_case_new(&small, dev, ROWS);
    if (st == CH_OK && (st = loss_case_new(&big, dev, 4 * ROWS)) != CH_OK)
        loss_case_free(&small);
    if (!tap_status_ok(st, "%s: a loss's tensors", id))
        return;
    ch_device_sync(dev);
    ch_device_reset_peak(dev);
    ch_memory_stats m0 = stats_of(dev);
    if (!tap_status_ok(loss_run(&small, dev), "%s: ch_softmax_xent", id))
        goto done;
    ch_memory_stats m1 = stats_of(dev);
    tap_ok(m1.workspace_bytes <= m1.in_use_bytes &&
               m1.in_use_bytes - m0.in_use_bytes == m1.workspace_bytes - m0.workspace_bytes,
           "%s: the workspace is part of what is in use (workspace %llu -> %llu, in use %llu "
           "-> %llu)",
           id, ull(m0.workspace_bytes), ull(m1.workspace_bytes), ull(m0.in_use_bytes),
           ull(m1.in_use_bytes));
    if (strcmp(info.backend, "host") == 0) {
        tap_ok(m1.workspace_bytes == 0 && m1.peak_bytes == m0.in_use_bytes,
               "%s: the host backend has no workspace (%llu; peak %llu, in use %llu)", id,
               ull(m1.workspace_bytes), ull(m1.peak_bytes), ull(m0.in_use_bytes));
        tap_skip("%s: no workspace to hold under a limit", id);
        goto done;
    }
    tap_ok(m1.workspace_bytes > 0 && m1.peak_bytes >= m0.in_use_bytes + ROWS * 4,
           "%s: the loss's scratch shows: %llu bytes kept, peak %llu, %llu in use before (the "
           "%d rows' scratch: %d bytes)",
           id, ull(m1.workspace_bytes), ull(m1.peak_bytes), ull(m0.in_use_bytes), ROWS, ROWS * 4);
    /* Full to the byte, nothing cached. */
    ch_device_empty_cache(dev);
    tap_status_ok(ch_device_set_memory_limit(dev, stats_of(dev).in_use_bytes),
                  "%s: a limit at what it holds", id);
    ch_clear_error();
    tap_status_is(loss_run(&big, dev), CH_ERR_DEVICE_OUT_OF_MEMORY, "scratch",
                  "%s: the scratch of %d rows is held under the limit", id, 4 * ROWS);
    tap_ok(strstr(ch_last_error(), id) && strstr(ch_last_error(), "limit"),
           "%s: the message names the device and the limit (\"%s\")", id, ch_last_error());
    ch_device_set_memory_limit(dev, 0);
    tap_status_ok(loss_run(&big, dev), "%s: without the limit it runs", id);
done:
    loss_case_free(&small);
    loss_case_free(&big);
}

/* Host memory held for the device's transfers: counted apart, not in use
 * and not under the limit. */
static void test_staging(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_memory_stats m0 = stats_of(dev);
    tap_status_ok(ch_device_set_memory_limit(dev, m0.in_use_bytes + m0.cached_bytes),
                  "%s: a limit at what it holds", id);
    ch_host_buffer *hb = NULL;
    ch_status st = ch_host_buffer_new(&hb, dev, MIB);
    ch_memory_stats m1 = stats_of(dev);
    tap_ok(st == CH_OK && m1.staging_bytes == m0.staging_bytes + MIB &&
               m1.in_use_bytes == m0.in_use_bytes,
           "%s: a 1 MiB pinned buffer beyond the limit (%s): staging %llu -> %llu, in use "
           "%llu -> %llu",
           id, ch_status_str(st), ull(m0.staging_bytes), ull(m1.staging_bytes),
           ull(m0.in_use_bytes), ull(m1.in_use_bytes));
    ch_host_buffer_free(hb);
    ch_memory_stats m2 = stats_of(dev);
    tap_ok(m2.staging_bytes == m0.staging_bytes, "%s: freed, staging back to %llu (%llu)", id,
           ull(m0.staging_bytes), ull(m2.staging_bytes));
    ch_device_set_memory_limit(dev, 0);
}

/* A copy between devices that cannot peer goes through the source's
 * staging buffer, kept for the next copies. */
static void test_copy_staging(void)
{
    ch_device *a, *b;
    if (!tap_cross_pair(&a, &b)) {
        tap_skip("no two devices of one backend that cannot peer: no staged copy");
        return;
    }
    ch_tensor *x = tensor_of(a, MIB), *y = tensor_of(b, MIB);
    uint64_t before = stats_of(a).staging_bytes;
    ch_status st = x && y ? ch_copy(y, x) : CH_ERR_INTERNAL;
    uint64_t after = stats_of(a).staging_bytes;
    tap_ok(st == CH_OK && after >= before && after > 0,
           "%s -> %s: a staged copy (%s) leaves the source's staging buffer counted (%llu -> "
           "%llu bytes)",
           ch_device_id(a), ch_device_id(b), ch_status_str(st), ull(before), ull(after));
    ch_tensor_free(x);
    ch_tensor_free(y);
}

/* Threads allocating and freeing at once under a limit: never beyond it,
 * and everything given back. */
static atomic_int go; /* the threads start together once it is 1 */

typedef struct worker {
    ch_device *dev;
    int refused, failed;
} worker;

/* Each round holds 3.4 MiB for a moment: two threads at once meet the
 * 4 MiB limit. */
static void *allocate_in_turn(void *arg)
{
    worker *w = arg;
    int64_t sizes[3] = {64 * 1024, 96 * 1024, 160 * 1024}; /* floats: 256, 384, 640 KiB */
    while (!atomic_load(&go))
        sched_yield();
    for (int round = 0; round < 100; round++) {
        ch_tensor *held[8] = {0};
        for (int i = 0; i < 8; i++) {
            ch_status st = ch_tensor_new(&held[i], w->dev, CH_F32, 1, &sizes[(round + i) % 3]);
            if (st == CH_ERR_DEVICE_OUT_OF_MEMORY)
                w->refused++;
            else if (st != CH_OK)
                w->failed++;
        }
        sched_yield(); /* held while the others run */
        for (int i = 0; i < 8; i++)
            ch_tensor_free(held[i]);
    }
    return NULL;
}

static void test_threads(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    ch_device_empty_cache(dev);
    ch_device_reset_peak(dev);
    uint64_t base = stats_of(dev).in_use_bytes, limit = base + 4 * MIB;
    ch_device_set_memory_limit(dev, limit);
    pthread_t th[THREADS];
    worker w[THREADS];
    int started = 0;
    atomic_store(&go, 0);
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){dev, 0, 0};
        if (pthread_create(&th[i], NULL, allocate_in_turn, &w[i]) != 0)
            break;
        started++;
    }
    atomic_store(&go, 1);
    int refused = 0, failed = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        refused += w[i].refused;
        failed += w[i].failed;
    }
    ch_memory_stats m = stats_of(dev);
    tap_ok(started == THREADS && failed == 0,
           "%s: %d threads allocating at once (%d started, %d refused, %d other failures)", id,
           THREADS, started, refused, failed);
    tap_ok(m.peak_reserved_bytes <= limit && m.in_use_bytes == base,
           "%s: never beyond the %llu byte limit (reserved peak %llu), all given back (in use "
           "%llu, want %llu)",
           id, ull(limit), ull(m.peak_reserved_bytes), ull(m.in_use_bytes), ull(base));
    ch_device_set_memory_limit(dev, 0);
    ch_device_empty_cache(dev);
}

int main(void)
{
    ch_status st = ch_init();
    if (st != CH_OK) {
        tap_status_ok(st, "ch_init");
        return tap_done();
    }
    ch_device *devs[64];
    int n = tap_devices(devs, 64);
    for (int i = 0; i < n; i++) {
        test_accounting(devs[i]);
        test_limit(devs[i]);
        test_workspace(devs[i]);
        test_staging(devs[i]);
        test_threads(devs[i]);
    }
    test_copy_staging();
    ch_shutdown();
    return tap_done();
}
