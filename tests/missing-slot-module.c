/* A backend module of the right ABI version that leaves a required slot
 * (alloc) NULL, for test-abi: built (check only) as chorus-opencl.so, so
 * that the registry finds it first on CHORUS_BACKEND_PATH and must refuse
 * it, naming the slot, before calling anything in it. The slots before
 * alloc in the registry's list are filled, so the refusal is for alloc. */
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

static const ch_backend_i table = {
    .abi_version = CH_BACKEND_ABI_VERSION,
    .name = "opencl",
    .init = never_init,
    .shutdown = shutdown_none,
    .device_props = props_none,
    .device_open = open_none,
    .device_close = close_none,
};

CH_API const ch_backend_i *chorus_backend_entry(void);

const ch_backend_i *chorus_backend_entry(void)
{
    return &table;
}
