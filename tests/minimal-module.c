/* A backend module with the required slots alone: one device on plain host
 * memory (malloc), streams that run everything at once, and a GEMM of
 * plain loops. Every op slot is NULL, so every op on its device runs on
 * the host backend (lib/ops_fallback.c): what a new backend (Vulkan, HIP,
 * Metal) starts from. Built (check only) as chorus-minimal.so, a name the
 * core knows nothing of: the registry finds it by scanning
 * CHORUS_BACKEND_PATH. tests/test-fallback.c trains on it. */
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "loop-gemm.h"

/* Built again as two twins of one made-up GPU (tests/test-twin.c): their
 * backend name, priority and the PCI bus id they report. */
#ifndef MINIMAL_NAME
#define MINIMAL_NAME "minimal"
#endif
#ifndef MINIMAL_PRIORITY
#define MINIMAL_PRIORITY 1
#endif
#ifndef MINIMAL_PCI
#define MINIMAL_PCI ""
#endif

typedef struct minimal_stream {
    int unused; /* work runs when it is queued: nothing to remember */
} minimal_stream;

static int the_device; /* device_open's handle: its address */

static ch_status minimal_init(void **ctx, int *ndevices)
{
    *ctx = NULL;
    *ndevices = 1;
    return CH_OK;
}

static void minimal_shutdown(void *ctx)
{
    (void)ctx;
}

static ch_status minimal_device_props(void *ctx, int index, ch_bdev_props *props)
{
    (void)ctx;
    if (index != 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "minimal: no device %d", index);
    memset(props, 0, sizeof *props);
    strcpy(props->name, "minimal test device");
    strcpy(props->vendor, "chorus tests");
    /* Not a CPU: discovery would note it as the host's own cores and leave
     * it out of "all"; no PCI bus id (but the twins'), so it is nobody's
     * duplicate. */
    props->kind = CH_DEVICE_ACCELERATOR;
    strcpy(props->pci_bus_id, MINIMAL_PCI);
    props->memory_bytes = 1u << 30;
    props->max_alloc_bytes = 1u << 30;
    props->compute_units = 1;
    strcpy(props->detail, "required slots only");
    return CH_OK;
}

static ch_status minimal_device_open(void *ctx, int index, void **dev)
{
    (void)ctx;
    (void)index;
    /* A device that will not open, on request: MINIMAL_FAIL_OPEN names the
     * backend. */
    const char *fail = getenv("MINIMAL_FAIL_OPEN");
    if (fail && strcmp(fail, MINIMAL_NAME) == 0)
        return chi_error(CH_ERR_DRIVER, "%s: device_open refused (MINIMAL_FAIL_OPEN)",
                         MINIMAL_NAME);
    *dev = &the_device;
    return CH_OK;
}

static void minimal_device_close(void *dev)
{
    (void)dev;
}

static ch_status minimal_alloc(void *dev, size_t bytes, void **ptr)
{
    (void)dev;
    *ptr = malloc(bytes ? bytes : 1);
    if (!*ptr)
        return chi_error(CH_ERR_DEVICE_OUT_OF_MEMORY, "minimal: malloc(%zu) failed", bytes);
    return CH_OK;
}

static void minimal_free(void *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

/* Streams and events: every call has run when it returns, so there is
 * nothing to wait for; an event is a token. */
static ch_status minimal_stream_new(void *dev, void **stream)
{
    (void)dev;
    *stream = calloc(1, sizeof(minimal_stream));
    if (!*stream)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "minimal: calloc for a stream failed");
    return CH_OK;
}

static void minimal_stream_free(void *stream)
{
    free(stream);
}

static ch_status minimal_stream_sync(void *stream)
{
    (void)stream;
    return CH_OK;
}

static ch_status minimal_event_new(void *dev, void **event)
{
    return minimal_stream_new(dev, event);
}

static ch_status minimal_event_record(void *event, void *stream)
{
    (void)event;
    (void)stream;
    return CH_OK;
}

static char *at(ch_bmem m)
{
    return (char *)m.ptr + m.off;
}

static ch_status minimal_upload(void *stream, ch_bmem dst, const void *host, size_t bytes,
                                int blocking)
{
    (void)stream;
    (void)blocking;
    memcpy(at(dst), host, bytes);
    return CH_OK;
}

static ch_status minimal_download(void *stream, void *host, ch_bmem src, size_t bytes, int blocking)
{
    (void)stream;
    (void)blocking;
    memcpy(host, at(src), bytes);
    return CH_OK;
}

static ch_status minimal_copy(void *stream, ch_bmem dst, ch_bmem src, size_t bytes)
{
    (void)stream;
    memcpy(at(dst), at(src), bytes);
    return CH_OK;
}

static ch_status minimal_gemm(void *stream, int trans_a, int trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, ch_bmem a, int64_t lda, ch_bmem b,
                              int64_t ldb, float beta, ch_bmem c, int64_t ldc)
{
    (void)stream;
    loop_gemm(trans_a, trans_b, m, n, k, alpha, (const float *)at(a), lda, (const float *)at(b),
              ldb, beta, (float *)at(c), ldc);
    return CH_OK;
}

static const ch_backend_i table = {
    .abi_version = CH_BACKEND_ABI_VERSION,
    .name = MINIMAL_NAME,
    .priority = MINIMAL_PRIORITY,
    .init = minimal_init,
    .shutdown = minimal_shutdown,
    .device_props = minimal_device_props,
    .device_open = minimal_device_open,
    .device_close = minimal_device_close,
    .alloc = minimal_alloc,
    .free = minimal_free,
    .stream_new = minimal_stream_new,
    .stream_free = minimal_stream_free,
    .stream_sync = minimal_stream_sync,
    .event_new = minimal_event_new,
    .event_free = minimal_stream_free,
    .event_record = minimal_event_record,
    .event_wait = minimal_event_record,
    .event_sync = minimal_stream_sync,
    .upload = minimal_upload,
    .download = minimal_download,
    .copy = minimal_copy,
    .gemm = minimal_gemm,
};

CH_API const ch_backend_i *chorus_backend_entry(void);

const ch_backend_i *chorus_backend_entry(void)
{
    return &table;
}
