/* Device discovery: from the devices the backends expose and the machine's
 * topology (hwloc) to the list of devices the user sees.
 *
 * Pure logic over its inputs, so tests can feed made-up backend device lists
 * and hwloc XML topologies of machines we do not have (they link these
 * functions through tests/libchorus-internal: the library does not export
 * them). */
#ifndef CHORUS_LIB_DISCOVER_H
#define CHORUS_LIB_DISCOVER_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One device as a backend exposes it. */
typedef struct chi_disc_input {
    char backend[16];     /* "host", "cuda", "opencl" */
    int backend_index;    /* the backend's own index: cuda:N, opencl:N */
    int priority;         /* its backend table's priority (lib/backend.h) */
    ch_bdev_props props;
} chi_disc_input;

/* One device the user will see. */
typedef struct chi_disc_device {
    int input;            /* index into the input array */
    char id[32];          /* "host", "cuda:0", "opencl:1" */
    int numa_node;        /* -1 when unknown */
    char cpuset[1024];    /* hwloc list syntax ("0-15"), "" when unknown */
    int in_all;           /* 0: "all" leaves it out */
    char note[160];       /* why it is left out of "all", or "" */
} chi_disc_device;

typedef struct chi_disc_result {
    chi_disc_device *devices; /* visible devices, in list order */
    int ndevices;
    ch_hidden_device *hidden; /* duplicates and GPUs with no driver */
    int nhidden;
    /* The duplicates again, as devices that may be opened when named
     * (in_all 0, the note naming their twin), in list order. */
    chi_disc_device *twins;
    int ntwins;
} chi_disc_result;

/* `topology` is an hwloc_topology_t loaded with I/O objects kept, or NULL
 * (no hwloc: no NUMA placement and no "present, no driver" entries, but
 * duplicates are still found by PCI bus id).
 *
 * Order of the visible list: by backend priority, highest first (host
 * 100, cuda 50, opencl 10), backends of one priority by name, each by
 * backend index. Rules:
 *   - A GPU exposed by two backends (same PCI bus id) is kept once, by the
 *     backend of higher priority (CUDA over OpenCL); the other is hidden
 *     with "the same GPU as cuda:N", and listed in twins: a user who
 *     names it gets it (lib/device.c), to drive one GPU through both.
 *   - A CPU device of a backend other than host (PoCL) stays visible, with
 *     in_all = 0 and a note saying it is the host's own CPU.
 *   - A PCI display/3D controller of NVIDIA (10de), AMD (1002) or Intel
 *     (8086) that no device matches is hidden as "pci:<busid>" with a hint
 *     naming the driver to install. */
ch_status chi_discover(const chi_disc_input *inputs, int ninputs, void *topology,
                       chi_disc_result *result);
void chi_disc_result_free(chi_disc_result *result);

/* Load a topology (the machine's, or `xml_path` when not NULL) with I/O
 * devices kept. CH_ERR_UNAVAILABLE without hwloc support. */
ch_status chi_topology_load(void **topology, const char *xml_path);
void chi_topology_free(void *topology);

/* Bind the calling thread to the CPUs in `cpuset` (hwloc list syntax).
 * A no-op returning CH_OK without hwloc or with an empty cpuset. */
ch_status chi_bind_thread(void *topology, const char *cpuset);

#ifdef __cplusplus
}
#endif

#endif
