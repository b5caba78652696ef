/* A backend module of the right ABI version that leaves a required slot
 * (alloc) NULL, for test-abi: built (check only) as chorus-opencl.so, so
 * that the registry finds it first on CHORUS_BACKEND_PATH and must refuse
 * it, naming the slot, before calling anything in it. The slots before
 * alloc in the registry's list are filled, so the refusal is for alloc.
 * Built again with PARTIAL_CONV: every required slot filled (gemm too), and of the
 * three convolution slots (all or none) conv2d_forward alone, so the
 * refusal is for conv2d_workspace. */
#include <stdlib.h>

#include "backend.h"

static ch_status never_init(void **ctx, int *ndevices)
{
    (void)ctx;
    (void)ndevices;
    abort(); /* the registry must refuse the module before init */
}

static void shutdown_none(void *ctx) { (void)ctx; }

static ch_status props_none(void *ctx, int index, ch_bdev_props *props)
{
    (void)ctx;
    (void)index;
    (void)props;
    return CH_ERR_UNAVAILABLE;
}

static ch_status open_none(void *ctx, int index, void **dev)
{
    (void)ctx;
    (void)index;
    (void)dev;
    return CH_ERR_UNAVAILABLE;
}

static void close_none(void *dev) { (void)dev; }

#ifdef PARTIAL_CONV
/* Never called: the registry refuses the module first. */
static ch_status never(void) { abort(); }
static void never_void(void) { abort(); }
#define NEVER(type) ((type)(void (*)(void))never)
#define NEVER_VOID(type) ((type)never_void)
#endif

static const ch_backend_i table = {
    .abi_version = CH_BACKEND_ABI_VERSION,
    .name = "opencl",
    .init = never_init,
    .shutdown = shutdown_none,
    .device_props = props_none,
    .device_open = open_none,
    .device_close = close_none,
#ifdef PARTIAL_CONV
    .alloc = NEVER(ch_status(*)(void *, size_t, void **)),
    .free = NEVER_VOID(void (*)(void *, void *)),
    .stream_new = NEVER(ch_status(*)(void *, void **)),
    .stream_free = NEVER_VOID(void (*)(void *)),
    .stream_sync = NEVER(ch_status(*)(void *)),
    .event_new = NEVER(ch_status(*)(void *, void **)),
    .event_free = NEVER_VOID(void (*)(void *)),
    .event_record = NEVER(ch_status(*)(void *, void *)),
    .event_wait = NEVER(ch_status(*)(void *, void *)),
    .event_sync = NEVER(ch_status(*)(void *)),
    .upload = NEVER(ch_status(*)(void *, ch_bmem, const void *, size_t, int)),
    .download = NEVER(ch_status(*)(void *, void *, ch_bmem, size_t, int)),
    .copy = NEVER(ch_status(*)(void *, ch_bmem, ch_bmem, size_t)),
    .gemm = NEVER(ch_status(*)(void *, int, int, int64_t, int64_t, int64_t, float, ch_bmem, int64_t,
                               ch_bmem, int64_t, float, ch_bmem, int64_t)),
    .conv2d_forward = NEVER(ch_status(*)(void *, const ch_conv_geom *, int64_t, ch_bmem, ch_bmem,
                                         ch_bmem, ch_bmem, size_t)),
#endif
};

CH_API const ch_backend_i *chorus_backend_entry(void);

const ch_backend_i *chorus_backend_entry(void)
{
    return &table;
}
