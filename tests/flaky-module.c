/* A backend module whose devices fail on command, for the tests of what
 * Chorus does when a device is lost: two devices, flaky:0 and flaky:1, on
 * plain host memory (malloc) with the required slots alone (every op runs
 * on the host backend: lib/ops_fallback.c, so their results are the
 * host's bits), each working until it is armed:
 *
 *   chorus_flaky_arm(index, after, hang): the device's call `after` calls
 *   from now (1: the next) and every call after it fail with
 *   CH_ERR_DRIVER ("flaky:1: the device was lost ..."), as a GPU that
 *   fell off the bus; with `hang`, that call blocks instead, as a driver
 *   that stopped answering, until chorus_flaky_reset lets it go on.
 *   chorus_flaky_reset(index): the device answers again (it came back).
 *   chorus_flaky_calls(index): its calls so far.
 *
 * A call is any slot that names the device: an allocation, a stream or
 * event made, a sync, a transfer, a copy, a GEMM (a free cannot fail and
 * is not counted). CHORUS_FLAKY="INDEX:AFTER[:hang]" arms one device when
 * the module loads, for a process a test cannot reach into (under
 * mpirun). Built (check only) as chorus-flaky.so, found by the scan of
 * CHORUS_BACKEND_PATH; tests/test-flaky.c drives it. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "loop-gemm.h"

#define NDEV 2

typedef struct flaky_dev {
    int index;
    atomic_long calls;   /* slot calls so far */
    atomic_long fail_at; /* the call that fails (and every later one); 0: none */
    atomic_int hang;     /* that call blocks until chorus_flaky_reset */
    atomic_int lost;     /* failing from now on */
} flaky_dev;

static flaky_dev devs[NDEV];

typedef struct flaky_stream {
    flaky_dev *dev;
} flaky_stream;

CH_API void chorus_flaky_arm(int index, long after, int hang);
CH_API void chorus_flaky_reset(int index);
CH_API long chorus_flaky_calls(int index);

void chorus_flaky_arm(int index, long after, int hang)
{
    if (index < 0 || index >= NDEV || after < 1)
        return;
    flaky_dev *d = &devs[index];
    atomic_store(&d->hang, hang != 0);
    atomic_store(&d->fail_at, atomic_load(&d->calls) + after);
}

void chorus_flaky_reset(int index)
{
    if (index < 0 || index >= NDEV)
        return;
    flaky_dev *d = &devs[index];
    /* A hung call looks at `lost` once `hang` is cleared: that last. */
    atomic_store(&d->lost, 0);
    atomic_store(&d->fail_at, 0);
    atomic_store(&d->hang, 0);
}

long chorus_flaky_calls(int index)
{
    return index >= 0 && index < NDEV ? atomic_load(&devs[index].calls) : -1;
}

/* Every slot's first step: counts the call, and fails it (after blocking,
 * when armed to hang) once the device is lost. */
static ch_status call(flaky_dev *d)
{
    long n = atomic_fetch_add(&d->calls, 1) + 1, at = atomic_load(&d->fail_at);
    if (!atomic_load(&d->lost) && at > 0 && n >= at) {
        atomic_store(&d->lost, 1);
        while (atomic_load(&d->hang)) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    if (atomic_load(&d->lost))
        return chi_error(CH_ERR_DRIVER,
                         "flaky:%d: the device was lost (armed to fail at its "
                         "call %ld; this is call %ld)",
                         d->index, at, n);
    return CH_OK;
}

/* CHORUS_FLAKY="INDEX:AFTER[:hang]", if set. */
static void arm_from_env(void)
{
    const char *env = getenv("CHORUS_FLAKY");
    int index;
    long after;
    char mode[8] = "";
    if (env && sscanf(env, "%d:%ld:%7s", &index, &after, mode) >= 2)
        chorus_flaky_arm(index, after, strcmp(mode, "hang") == 0);
}

static ch_status flaky_init(void **ctx, int *ndevices)
{
    *ctx = NULL;
    *ndevices = NDEV;
    for (int i = 0; i < NDEV; i++)
        devs[i].index = i;
    arm_from_env();
    return CH_OK;
}

static void flaky_shutdown(void *ctx)
{
    (void)ctx;
}

static ch_status flaky_device_props(void *ctx, int index, ch_bdev_props *props)
{
    (void)ctx;
    if (index < 0 || index >= NDEV)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "flaky: no device %d", index);
    memset(props, 0, sizeof *props);
    snprintf(props->name, sizeof props->name, "flaky test device %d", index);
    strcpy(props->vendor, "chorus tests");
    /* Not a CPU (discovery would take it for the host's cores), no PCI
     * bus id (nobody's duplicate). */
    props->kind = CH_DEVICE_ACCELERATOR;
    props->memory_bytes = 1u << 30;
    props->max_alloc_bytes = 1u << 30;
    props->compute_units = 1;
    strcpy(props->detail, "fails on command (tests/flaky-module.c)");
    return CH_OK;
}

static ch_status flaky_device_open(void *ctx, int index, void **dev)
{
    (void)ctx;
    *dev = &devs[index];
    return CH_OK;
}

static void flaky_device_close(void *dev)
{
    (void)dev;
}

static ch_status flaky_alloc(void *dev, size_t bytes, void **ptr)
{
    TRY(call(dev));
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr)
        return chi_error(CH_ERR_DEVICE_OUT_OF_MEMORY, "flaky: malloc(%zu) failed", bytes);
    return CH_OK;
}

static void flaky_free(void *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

/* Streams and events: every call has run when it returns; an event is a
 * token that knows its device. */
static ch_status flaky_stream_new(void *dev, void **stream)
{
    TRY(call(dev));
    flaky_stream *s = calloc(1, sizeof *s);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "flaky: calloc for a stream failed");
    s->dev = dev;
    *stream = s;
    return CH_OK;
}

static void flaky_stream_free(void *stream)
{
    free(stream);
}

static ch_status flaky_stream_sync(void *stream)
{
    return call(((flaky_stream *)stream)->dev);
}

static ch_status flaky_event_record(void *event, void *stream)
{
    (void)event;
    return call(((flaky_stream *)stream)->dev);
}

static char *at(ch_bmem m)
{
    return (char *)m.ptr + m.off;
}

static ch_status flaky_upload(void *stream, ch_bmem dst, const void *host, size_t bytes,
                              int blocking)
{
    (void)blocking;
    TRY(call(((flaky_stream *)stream)->dev));
    memcpy(at(dst), host, bytes);
    return CH_OK;
}

static ch_status flaky_download(void *stream, void *host, ch_bmem src, size_t bytes, int blocking)
{
    (void)blocking;
    TRY(call(((flaky_stream *)stream)->dev));
    memcpy(host, at(src), bytes);
    return CH_OK;
}

static ch_status flaky_copy(void *stream, ch_bmem dst, ch_bmem src, size_t bytes)
{
    TRY(call(((flaky_stream *)stream)->dev));
    memcpy(at(dst), at(src), bytes);
    return CH_OK;
}

static ch_status flaky_gemm(void *stream, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, ch_bmem a, int64_t lda, ch_bmem b, int64_t ldb, float beta,
                            ch_bmem c, int64_t ldc)
{
    TRY(call(((flaky_stream *)stream)->dev));
    loop_gemm(trans_a, trans_b, m, n, k, alpha, (const float *)at(a), lda, (const float *)at(b),
              ldb, beta, (float *)at(c), ldc);
    return CH_OK;
}

static const ch_backend_i table = {
    .abi_version = CH_BACKEND_ABI_VERSION,
    .name = "flaky",
    .priority = 1,
    .init = flaky_init,
    .shutdown = flaky_shutdown,
    .device_props = flaky_device_props,
    .device_open = flaky_device_open,
    .device_close = flaky_device_close,
    .alloc = flaky_alloc,
    .free = flaky_free,
    .stream_new = flaky_stream_new,
    .stream_free = flaky_stream_free,
    .stream_sync = flaky_stream_sync,
    .event_new = flaky_stream_new,
    .event_free = flaky_stream_free,
    .event_record = flaky_event_record,
    .event_wait = flaky_event_record,
    .event_sync = flaky_stream_sync,
    .upload = flaky_upload,
    .download = flaky_download,
    .copy = flaky_copy,
    .gemm = flaky_gemm,
};

CH_API const ch_backend_i *chorus_backend_entry(void);

const ch_backend_i *chorus_backend_entry(void)
{
    return &table;
}
