/* Chorus: initialisation, backends and devices. */
#ifndef CHORUS_DEVICE_H
#define CHORUS_DEVICE_H

#include <stddef.h>
#include <stdint.h>
#include <chorus/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ch_device ch_device; /* opaque; owned by the library */

/* Load the backends, discover the devices. Safe to call more than once (the
 * later calls do nothing). A backend that cannot load (no CUDA driver, no
 * OpenCL loader) is recorded as unavailable; ch_init still succeeds as long
 * as the host backend works. Environment:
 *   CHORUS_BACKEND_PATH  folders (':'-separated) scanned for backend modules
 *                        (chorus-<name>.so) before the installed backend
 *                        folder; the first file of a name is loaded
 *   CHORUS_DEVICES       a device list (see ch_device_list_parse): only these
 *                        devices are visible (a hidden duplicate named
 *                        there is opened too, see ch_device_by_name) */
CH_API ch_status ch_init(void);

/* Release every device and backend. Tensors must be freed before. Stops a
 * running trace (chorus/trace.h): should its file fail, the message is
 * left in ch_last_error() and printed on stderr. */
CH_API void ch_shutdown(void);

/* ---- Backends ---------------------------------------------------------- */

typedef struct ch_backend_info {
    char name[16];      /* "host", "opencl", "cuda" */
    int available;      /* 1 when loaded and initialised */
    int device_count;   /* devices it exposes (before de-duplication) */
    char detail[512];   /* module path when available; why not, otherwise */
} ch_backend_info;

CH_API int ch_backend_count(void);
CH_API ch_status ch_backend_get_info(int index, ch_backend_info *info);

/* ---- Devices ----------------------------------------------------------- */

/* Number of visible devices; 0 before ch_init. */
CH_API int ch_device_count(void);

/* Devices are borrowed: they belong to the library until ch_shutdown. */
CH_API ch_status ch_device_get(ch_device **out, int index);

/* "host", "cuda:N", "opencl:N". A device hidden as the duplicate of a GPU
 * another backend shows ("the same GPU as cuda:0", ch_hidden_device_get)
 * opens when named, here or in a device list: it joins the end of the
 * list (ch_device_count grows by one; name it before other threads use
 * the list) and "all" leaves it out. CH_ERR_UNAVAILABLE, saying why, when
 * it will not open. */
CH_API ch_status ch_device_by_name(ch_device **out, const char *name);

/* Parse "all" or a comma-separated list of names ("cuda:0,opencl:1,host").
 * "all" gives every visible device except the OpenCL CPU devices (they are
 * the host's own cores). Fills at most `capacity` entries of `out` and sets
 * *n to the count. Duplicates and unknown names are errors. */
CH_API ch_status ch_device_list_parse(ch_device **out, int capacity, int *n,
                                      const char *list);
/* The same for the devices of data-parallel replicas (chorus/dp.h): a
 * device may be named more than once, one entry each time (two replicas on
 * one GPU), and each "all" adds its devices again. Unknown names are
 * errors. */
CH_API ch_status ch_device_list_parse_replicas(ch_device **out, int capacity, int *n,
                                               const char *list);

typedef enum ch_device_kind {
    CH_DEVICE_CPU = 0,
    CH_DEVICE_GPU = 1,
    CH_DEVICE_ACCELERATOR = 2
} ch_device_kind;

typedef struct ch_device_info {
    int index;                /* position in the device list */
    char id[32];              /* "host", "cuda:0", "opencl:1" */
    char backend[16];         /* "host", "cuda", "opencl" */
    char platform[64];        /* the driver's platform: OpenCL's platform name
                                 ("Portable Computing Language", "Intel(R)
                                 OpenCL", "AMD Accelerated Parallel
                                 Processing"), "" for host and CUDA. Devices
                                 of one platform share a context: copies and
                                 peer reduction go device to device; between
                                 platforms they go through host memory */
    char name[128];           /* the product name */
    char vendor[64];
    ch_device_kind kind;
    uint64_t memory_bytes;    /* total device memory */
    uint64_t max_alloc_bytes; /* the largest single allocation */
    int compute_units;        /* SMs, compute units, or CPU cores */
    char pci_bus_id[32];      /* "0000:65:00.0", "" when unknown */
    int numa_node;            /* -1 when unknown */
    char cpuset[1024];        /* CPUs local to the device (hwloc list syntax), "" when unknown */
    int in_all;               /* 0 for devices that "all" leaves out */
    char note[160];           /* why "all" leaves it out, or other remarks */
} ch_device_info;

CH_API ch_status ch_device_get_info(const ch_device *dev, ch_device_info *info);

/* Free and total memory as the driver reports it now. */
CH_API ch_status ch_device_memory(const ch_device *dev, uint64_t *free_bytes,
                                  uint64_t *total_bytes);

/* The device's id ("cuda:0"); never NULL for a valid device. */
CH_API const char *ch_device_id(const ch_device *dev);

/* 1 when a copy from src to dst can go device to device without host staging. */
CH_API int ch_device_can_peer(const ch_device *src, const ch_device *dst);

/* Wait until all work queued on the device's streams is done. */
CH_API ch_status ch_device_sync(ch_device *dev);

/* Bind the calling thread to the CPUs near `dev` (its cpuset, through
 * hwloc). CH_ERR_UNAVAILABLE when the library has no topology or the
 * device's CPUs are unknown. */
CH_API ch_status ch_device_bind_thread(const ch_device *dev);

/* ---- Devices hidden by discovery --------------------------------------- */

/* Devices a backend exposes that discovery hid (one GPU seen by two
 * backends), and GPUs on the PCI bus that no backend drives. */
typedef struct ch_hidden_device {
    char id[32];         /* "opencl:2", or "pci:0000:65:00.0" with no driver */
    char name[128];
    char pci_bus_id[32];
    char reason[256];    /* "same GPU as cuda:0", "no driver: install ..." */
} ch_hidden_device;

CH_API int ch_hidden_device_count(void);
CH_API ch_status ch_hidden_device_get(int index, ch_hidden_device *out);

/* ---- Ops run on the host for a device ---------------------------------- */

/* A backend may leave out ops (a new backend starts with memory, streams
 * and GEMM and grows): such an op, called on one of its devices, runs on
 * the host backend instead, its tensors staged through host memory (the
 * inputs downloaded, the outputs uploaded before the op returns), with
 * the host's results. The first time for each device and op, one line on
 * stderr says so ("chorus: opencl:0 has no layernorm; running it on the
 * host"), unless the environment has CHORUS_QUIET_FALLBACK=1; every such
 * (device, op) pair since ch_init is listed here, in the order they first
 * ran. `op` is the backend slot's name (lib/backend.h), which is the op's
 * name without ch_ for most ("layernorm", "act_forward", "im2col"). */
typedef struct ch_fallback_info {
    char device[32]; /* "opencl:0" */
    char op[32];     /* "layernorm" */
} ch_fallback_info;

CH_API int ch_fallback_count(void);
CH_API ch_status ch_fallback_get(int index, ch_fallback_info *info);

/* ---- Memory ------------------------------------------------------------ */

/* What a device's memory holds, counted by its caching allocator: every
 * tensor's block, the blocks kept for reuse, and the scratch a backend
 * allocates for itself (its workspace). Every figure is in bytes as
 * allocated (a tensor's size rounded up to its size class). Memory the
 * device's libraries take for themselves (cuBLAS's workspace, NCCL's
 * buffers, CLBlast's temporaries) is not seen, nor are the host backend's
 * temporaries, plain heap memory taken and given back within one op.
 *
 * The structure grows at its end only: a field added is added last. */
typedef struct ch_memory_stats {
    uint64_t in_use_bytes;    /* held by live tensors and the backend's workspace */
    uint64_t cached_bytes;    /* freed by tensors, kept for reuse */
    uint64_t peak_bytes;      /* highest in_use_bytes since ch_init or the last
                                 ch_device_reset_peak */
    uint64_t allocs;          /* allocations served */
    uint64_t cache_hits;      /* ... of which from the cache */
    uint64_t device_allocs;   /* calls to the driver's allocator */
    uint64_t cache_flushes;   /* times the cache was emptied (request or pressure) */
    uint64_t workspace_bytes; /* of in_use_bytes: scratch the backend allocates
                                 itself, outside the cache (CUDA's per-stream
                                 scratch and label-check words, OpenCL's scratch
                                 buffers and per-stream flag word); 0 on the host */
    uint64_t staging_bytes;   /* host memory held for this device's transfers:
                                 ch_host_buffer_new's buffers (the reducer's and
                                 the loader's among them), the staging buffer of
                                 copies between devices, a backend's pinned words.
                                 Host memory, not the device's: neither in
                                 in_use_bytes nor under the limit */
    uint64_t limit_bytes;     /* ch_device_set_memory_limit's limit, 0: none */
    uint64_t peak_reserved_bytes; /* highest in_use_bytes + cached_bytes (what the
                                     device held from its driver) since ch_init or
                                     the last ch_device_reset_peak */
    uint64_t tensor_bytes;        /* of in_use_bytes: what the live tensors asked for
                                 (their elements times the element size), before
                                 the allocator rounds each up to its size class */
} ch_memory_stats;

CH_API ch_status ch_device_memory_stats(const ch_device *dev, ch_memory_stats *stats);

/* Start the peaks again from now: peak_bytes becomes in_use_bytes and
 * peak_reserved_bytes in_use_bytes + cached_bytes. */
CH_API ch_status ch_device_reset_peak(ch_device *dev);

/* The device's work as its backend counts it, for benchmarks: what a
 * training step launches and how much of it is GEMM. CUDA counts every
 * kernel launch and cuBLAS call (a cuBLAS call counted once, however many
 * kernels it runs); the host and OpenCL do not count (CH_ERR_UNSUPPORTED
 * from both calls). */
typedef struct ch_device_counters {
    uint64_t launches;   /* kernels and library calls queued since the start */
    uint64_t gemms;      /* of those, the GEMM calls */
    double gemm_seconds; /* the device's time inside them, where the start
                            asked for it (an event pair around each); < 0
                            otherwise */
} ch_device_counters;

/* Start counting from zero; time_gemms 1 also times every GEMM, at a cost
 * of two events each (leave it 0 where the step's own time matters). */
CH_API ch_status ch_device_counters_start(ch_device *dev, int time_gemms);
/* What was counted since the start (it goes on counting). With GEMM
 * times, waits for the GEMMs queued so far to finish. */
CH_API ch_status ch_device_counters_read(ch_device *dev, ch_device_counters *out);

/* Hold the device's memory to `bytes` (0: no limit, the default): an
 * allocation is refused when in_use_bytes + cached_bytes + its size would
 * go beyond it. The cache is emptied first (as when the driver runs out
 * of memory); when that is not enough the allocation fails with
 * CH_ERR_DEVICE_OUT_OF_MEMORY and a message naming the device, the
 * request, the bytes in use and the limit ("opencl:0: 4.0 MiB requested
 * with 1020.3 MiB of its 1.0 GiB limit in use
 * (ch_device_set_memory_limit)"). Workspace a backend allocates counts
 * too; staging buffers (host memory) do not. Reusing a cached block adds
 * nothing and is never refused. A limit below what is in use is allowed:
 * what is held stays, and later allocations fail until enough is freed.
 * A limit above the device's memory is allowed and changes nothing. A
 * limit lets a smaller device be emulated on a larger one. */
CH_API ch_status ch_device_set_memory_limit(ch_device *dev, uint64_t bytes);

/* Copies into a device from another device since ch_init (ch_copy,
 * ch_tensor_to, a Sequential whose layers sit on several devices), by the
 * path they took: device to device (ch_device_can_peer), or through host
 * memory. */
typedef struct ch_transfer_stats {
    uint64_t peer_copies;
    uint64_t peer_bytes;
    uint64_t staged_copies;
    uint64_t staged_bytes;
} ch_transfer_stats;

CH_API ch_status ch_device_transfer_stats(const ch_device *dev, ch_transfer_stats *stats);

/* Give cached blocks back to the driver. */
CH_API ch_status ch_device_empty_cache(ch_device *dev);

#ifdef __cplusplus
}
#endif

#endif
