/* The OpenCL backend module: finds every platform and device through the
 * ICD loader, one context per platform, and exports the backend table. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl.h"

/* NVIDIA's PCI queries (cl_nv_device_attribute_query), which the Khronos
 * headers do not define. */
#define CHCL_DEVICE_PCI_BUS_ID_NV 0x4008
#define CHCL_DEVICE_PCI_SLOT_ID_NV 0x4009
#define CHCL_DEVICE_PCI_DOMAIN_ID_NV 0x400A

/* ---- device queries ----------------------------------------------------- */

/* A string property in memory of its own (free it). */
static ch_status info_string_new(cl_device_id dev, cl_device_info param, const char *what,
                                 char **out)
{
    size_t len = 0;
    cl_int err = clGetDeviceInfo(dev, param, 0, NULL, &len);
    if (err != CL_SUCCESS)
        return chcl_err(err, what);
    char *s = malloc(len + 1);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: %zu bytes", what, len + 1);
    err = clGetDeviceInfo(dev, param, len, s, NULL);
    if (err != CL_SUCCESS) {
        free(s);
        return chcl_err(err, what);
    }
    s[len] = '\0';
    *out = s;
    return CH_OK;
}

/* A string property, truncated to `cap` (a direct query into a short buffer
 * would fail with CL_INVALID_VALUE). */
static ch_status info_string(cl_device_id dev, cl_device_info param, const char *what,
                             char *buf, size_t cap)
{
    char *s;
    ch_status st = info_string_new(dev, param, what, &s);
    if (st != CH_OK)
        return st;
    snprintf(buf, cap, "%s", s);
    free(s);
    return CH_OK;
}

static ch_status info_value(cl_device_id dev, cl_device_info param, const char *what,
                            void *value, size_t size)
{
    cl_int err = clGetDeviceInfo(dev, param, size, value, NULL);
    return err == CL_SUCCESS ? CH_OK : chcl_err(err, what);
}

/* Whether the space-separated extension list names `name` (whole words:
 * cl_khr_fp16 is not cl_khr_fp1). */
static int has_extension(cl_device_id dev, const char *name)
{
    char *ext;
    if (info_string_new(dev, CL_DEVICE_EXTENSIONS, "clGetDeviceInfo(CL_DEVICE_EXTENSIONS)",
                        &ext) != CH_OK)
        return 0;
    size_t len = strlen(name);
    int found = 0;
    for (const char *p = strstr(ext, name); p && !found; p = strstr(p + 1, name))
        found = (p == ext || p[-1] == ' ') && (p[len] == ' ' || p[len] == '\0');
    free(ext);
    return found;
}

static void pci_format(char *out, size_t cap, unsigned domain, unsigned bus, unsigned dev,
                       unsigned fn)
{
    snprintf(out, cap, "%04x:%02x:%02x.%x", domain, bus & 0xffu, dev & 0x1fu, fn & 7u);
}

/* The PCI bus id through whichever query the platform offers, "" when none
 * does (PoCL's CPU devices). A failed query only means "unknown". Our own
 * rather than hwloc's hwloc_opencl_get_device_pci_busid: that one knows no
 * cl_khr_pci_bus_info, and the module builds without hwloc. */
static void pci_bus_id(cl_device_id dev, char *out, size_t cap)
{
    out[0] = '\0';
    if (has_extension(dev, "cl_khr_pci_bus_info")) {
        cl_device_pci_bus_info_khr pci;
        if (clGetDeviceInfo(dev, CL_DEVICE_PCI_BUS_INFO_KHR, sizeof pci, &pci, NULL) ==
            CL_SUCCESS)
            pci_format(out, cap, pci.pci_domain, pci.pci_bus, pci.pci_device,
                       pci.pci_function);
    } else if (has_extension(dev, "cl_nv_device_attribute_query")) {
        cl_uint bus, slot, domain = 0;
        if (clGetDeviceInfo(dev, CHCL_DEVICE_PCI_BUS_ID_NV, sizeof bus, &bus, NULL) !=
                CL_SUCCESS ||
            clGetDeviceInfo(dev, CHCL_DEVICE_PCI_SLOT_ID_NV, sizeof slot, &slot, NULL) !=
                CL_SUCCESS)
            return;
        /* The domain query came with CUDA 10.2; older drivers mean domain 0. */
        if (clGetDeviceInfo(dev, CHCL_DEVICE_PCI_DOMAIN_ID_NV, sizeof domain, &domain,
                            NULL) != CL_SUCCESS)
            domain = 0;
        pci_format(out, cap, domain, bus, slot >> 3, slot & 7u);
    } else if (has_extension(dev, "cl_amd_device_attribute_query")) {
        cl_device_topology_amd topo;
        if (clGetDeviceInfo(dev, CL_DEVICE_TOPOLOGY_AMD, sizeof topo, &topo, NULL) ==
                CL_SUCCESS &&
            topo.raw.type == CL_DEVICE_TOPOLOGY_TYPE_PCIE_AMD)
            pci_format(out, cap, 0, (unsigned char)topo.pcie.bus,
                       (unsigned char)topo.pcie.device, (unsigned char)topo.pcie.function);
    }
}

static ch_device_kind kind_of(cl_device_type type)
{
    if (type & CL_DEVICE_TYPE_GPU)
        return CH_DEVICE_GPU;
    if (type & CL_DEVICE_TYPE_CPU)
        return CH_DEVICE_CPU;
    return CH_DEVICE_ACCELERATOR;
}

static ch_status backend_device_props(void *ctx, int index, ch_bdev_props *props)
{
    cl_device_id dev = ((chcl_backend *)ctx)->devices[index];
    cl_device_type type;
    cl_ulong mem, max_alloc;
    cl_uint units;
    ch_status st = info_string(dev, CL_DEVICE_NAME, "clGetDeviceInfo(CL_DEVICE_NAME)",
                               props->name, sizeof props->name);
    if (st == CH_OK)
        st = info_string(dev, CL_DEVICE_VENDOR, "clGetDeviceInfo(CL_DEVICE_VENDOR)",
                         props->vendor, sizeof props->vendor);
    if (st == CH_OK)
        st = info_string(dev, CL_DEVICE_VERSION, "clGetDeviceInfo(CL_DEVICE_VERSION)",
                         props->detail, sizeof props->detail);
    if (st == CH_OK)
        st = info_value(dev, CL_DEVICE_TYPE, "clGetDeviceInfo(CL_DEVICE_TYPE)", &type,
                        sizeof type);
    if (st == CH_OK)
        st = info_value(dev, CL_DEVICE_GLOBAL_MEM_SIZE,
                        "clGetDeviceInfo(CL_DEVICE_GLOBAL_MEM_SIZE)", &mem, sizeof mem);
    if (st == CH_OK)
        st = info_value(dev, CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                        "clGetDeviceInfo(CL_DEVICE_MAX_MEM_ALLOC_SIZE)", &max_alloc,
                        sizeof max_alloc);
    if (st == CH_OK)
        st = info_value(dev, CL_DEVICE_MAX_COMPUTE_UNITS,
                        "clGetDeviceInfo(CL_DEVICE_MAX_COMPUTE_UNITS)", &units,
                        sizeof units);
    if (st != CH_OK)
        return st;
    cl_platform_id plat;
    st = info_value(dev, CL_DEVICE_PLATFORM, "clGetDeviceInfo(CL_DEVICE_PLATFORM)", &plat,
                    sizeof plat);
    if (st != CH_OK)
        return st;
    char *pname;
    size_t len = 0;
    cl_int err = clGetPlatformInfo(plat, CL_PLATFORM_NAME, 0, NULL, &len);
    if (err != CL_SUCCESS)
        return chcl_err(err, "clGetPlatformInfo(CL_PLATFORM_NAME)");
    if (!(pname = malloc(len + 1)))
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl: platform name of %zu bytes", len + 1);
    err = clGetPlatformInfo(plat, CL_PLATFORM_NAME, len, pname, NULL);
    pname[err == CL_SUCCESS ? len : 0] = '\0';
    snprintf(props->platform, sizeof props->platform, "%s", pname);
    free(pname);
    if (err != CL_SUCCESS)
        return chcl_err(err, "clGetPlatformInfo(CL_PLATFORM_NAME)");
    props->kind = kind_of(type);
    props->memory_bytes = mem;
    props->max_alloc_bytes = max_alloc;
    props->compute_units = (int)units;
    pci_bus_id(dev, props->pci_bus_id, sizeof props->pci_bus_id);
    return CH_OK;
}

/* ---- platforms ---------------------------------------------------------- */

/* The platform's devices of every type (CPU devices too, so PoCL counts);
 * none is not an error. */
static ch_status platform_devices(cl_platform_id p, cl_device_id **out, cl_uint *n)
{
    *out = NULL;
    *n = 0;
    cl_int err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, NULL, n);
    if (err == CL_DEVICE_NOT_FOUND || (err == CL_SUCCESS && *n == 0)) {
        *n = 0;
        return CH_OK;
    }
    if (err != CL_SUCCESS)
        return chcl_err(err, "clGetDeviceIDs");
    *out = malloc(*n * sizeof **out);
    if (!*out)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl: device list of %u", (unsigned)*n);
    err = clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, *n, *out, NULL);
    if (err != CL_SUCCESS) {
        free(*out);
        *out = NULL;
        return chcl_err(err, "clGetDeviceIDs");
    }
    return CH_OK;
}

static ch_status devices_append(chcl_backend *be, chcl_platform *plat,
                                const cl_device_id *ids, cl_uint n)
{
    size_t total = (size_t)be->ndevices + n;
    cl_device_id *devs = realloc(be->devices, total * sizeof *devs);
    if (devs)
        be->devices = devs;
    chcl_platform **owners = realloc(be->device_platform, total * sizeof *owners);
    if (owners)
        be->device_platform = owners;
    if (!devs || !owners)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl: device list of %zu", total);
    for (cl_uint i = 0; i < n; i++) {
        be->devices[be->ndevices] = ids[i];
        be->device_platform[be->ndevices] = plat;
        be->ndevices++;
    }
    return CH_OK;
}

/* One context over all of a platform's devices: buffers of that context
 * move between its devices with clEnqueueCopyBuffer (the peer path). */
static ch_status platform_add(chcl_backend *be, cl_platform_id id)
{
    cl_device_id *ids;
    cl_uint n;
    ch_status st = platform_devices(id, &ids, &n);
    if (st != CH_OK || n == 0)
        return st;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)id, 0};
    cl_int err;
    cl_context ctx = clCreateContext(props, n, ids, NULL, NULL, &err);
    if (err != CL_SUCCESS) {
        free(ids);
        return chcl_err(err, "clCreateContext");
    }
    chcl_platform *p = &be->platforms[be->nplatforms];
    memset(p, 0, sizeof *p);
    p->id = id;
    p->ctx = ctx;
    int rc = pthread_mutex_init(&p->lock, NULL);
    if (rc == 0)
        st = devices_append(be, p, ids, n);
    free(ids);
    if (rc != 0 || st != CH_OK) {
        if (rc == 0)
            pthread_mutex_destroy(&p->lock);
        clReleaseContext(ctx);
        return rc != 0 ? chi_error(CH_ERR_INTERNAL, "opencl: pthread_mutex_init: %s",
                                   strerror(rc))
                       : st;
    }
    be->nplatforms++;
    return CH_OK;
}

static void backend_shutdown(void *ctx)
{
    chcl_backend *be = ctx;
    if (!be)
        return;
    for (int i = 0; i < be->nplatforms; i++) {
        chcl_programs_release(&be->platforms[i]);
        clReleaseContext(be->platforms[i].ctx);
        pthread_mutex_destroy(&be->platforms[i].lock);
    }
    free(be->platforms);
    free(be->devices);
    free(be->device_platform);
    free(be);
}

static ch_status platform_ids(cl_platform_id **out, cl_uint *n)
{
    cl_int err = clGetPlatformIDs(0, NULL, n);
    if (err == CL_PLATFORM_NOT_FOUND_KHR || (err == CL_SUCCESS && *n == 0))
        return chi_error(CH_ERR_UNAVAILABLE, "no OpenCL platform (no ICD is installed, "
                                             "or none loads)");
    if (err != CL_SUCCESS)
        return chi_error(CH_ERR_UNAVAILABLE, "clGetPlatformIDs: %s (%d)",
                         chcl_err_name(err), (int)err);
    *out = malloc(*n * sizeof **out);
    if (!*out)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl: platform list of %u", (unsigned)*n);
    err = clGetPlatformIDs(*n, *out, NULL);
    if (err != CL_SUCCESS) {
        free(*out);
        return chi_error(CH_ERR_UNAVAILABLE, "clGetPlatformIDs: %s (%d)",
                         chcl_err_name(err), (int)err);
    }
    return CH_OK;
}

/* Platforms in the loader's order, devices in each platform's order: that
 * order is opencl:N. A platform that fails (a broken ICD) is left out so the
 * others still work; with no device at all, its error is the reason. */
static ch_status platforms_add(chcl_backend *be, const cl_platform_id *ids, cl_uint n)
{
    ch_status last = CH_OK;
    char why[512] = "";
    for (cl_uint i = 0; i < n; i++) {
        ch_status st = platform_add(be, ids[i]);
        if (st == CH_ERR_OUT_OF_MEMORY)
            return st;
        if (st != CH_OK) {
            last = st;
            snprintf(why, sizeof why, "%s", ch_last_error());
        }
    }
    if (be->ndevices > 0)
        return CH_OK;
    if (last != CH_OK)
        return chi_error(CH_ERR_UNAVAILABLE, "no usable OpenCL device: %s", why);
    return chi_error(CH_ERR_UNAVAILABLE, "no OpenCL device on %u platform(s)", (unsigned)n);
}

/* A cap from the environment: unset or empty is none (0), else a decimal
 * count from 1 to `max`; anything else makes the backend unavailable,
 * saying why, as CHORUS_OPENCL_GEMM does. */
static ch_status cap_parse(const char *name, const char *unit, unsigned long long max,
                           unsigned long long *out)
{
    const char *value = getenv(name);
    *out = 0;
    if (!value || !*value)
        return CH_OK;
    unsigned long long v = 0;
    const char *p = value;
    for (; *p >= '0' && *p <= '9'; p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (v > (max - digit) / 10) {
            v = 0;
            break;
        }
        v = v * 10 + digit;
    }
    if (*p || v == 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s=%s: expected a number of %s from 1 to %llu", name, value, unit,
                         max);
    *out = v;
    return CH_OK;
}

/* CHORUS_OPENCL_MAX_WORK_GROUP and CHORUS_OPENCL_LOCAL_MEM: limits below
 * every device's own, for tests of the paths a smaller device takes. */
static ch_status caps_parse(chcl_caps *caps)
{
    unsigned long long wg, local;
    ch_status st = cap_parse("CHORUS_OPENCL_MAX_WORK_GROUP", "work-items", 1u << 20, &wg);
    if (st == CH_OK)
        st = cap_parse("CHORUS_OPENCL_LOCAL_MEM", "bytes", 1ull << 40, &local);
    if (st != CH_OK)
        return st;
    caps->max_wg = (size_t)wg;
    caps->local_mem = (cl_ulong)local;
    return CH_OK;
}

static ch_status backend_init(void **ctx, int *ndevices)
{
    chcl_gemm_mode mode;
    chcl_caps caps;
    ch_status st = chcl_gemm_mode_parse(getenv("CHORUS_OPENCL_GEMM"), &mode);
    if (st == CH_OK)
        st = caps_parse(&caps);
    if (st != CH_OK)
        return st;
    cl_platform_id *ids = NULL;
    cl_uint n;
    st = platform_ids(&ids, &n);
    if (st != CH_OK)
        return st;
    chcl_backend *be = calloc(1, sizeof *be);
    if (be)
        be->platforms = calloc(n, sizeof *be->platforms);
    if (!be || !be->platforms) {
        free(be);
        free(ids);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl: backend context");
    }
    be->gemm_mode = mode;
    be->caps = caps;
    st = platforms_add(be, ids, n);
    free(ids);
    if (st != CH_OK) {
        backend_shutdown(be);
        return st;
    }
    *ctx = be;
    *ndevices = be->ndevices;
    return CH_OK;
}

/* ---- devices ------------------------------------------------------------ */

/* The device's limits that launches keep to, each lowered to the
 * backend's cap where one is set. */
static ch_status device_limits(chcl_device *d)
{
    cl_uint dims = 0;
    ch_status st = info_string(d->id, CL_DEVICE_NAME, "clGetDeviceInfo(CL_DEVICE_NAME)",
                               d->name, sizeof d->name);
    if (st == CH_OK)
        st = info_value(d->id, CL_DEVICE_MAX_MEM_ALLOC_SIZE,
                        "clGetDeviceInfo(CL_DEVICE_MAX_MEM_ALLOC_SIZE)", &d->max_alloc,
                        sizeof d->max_alloc);
    if (st == CH_OK)
        st = info_value(d->id, CL_DEVICE_GLOBAL_MEM_SIZE,
                        "clGetDeviceInfo(CL_DEVICE_GLOBAL_MEM_SIZE)", &d->global_mem,
                        sizeof d->global_mem);
    if (st == CH_OK)
        st = info_value(d->id, CL_DEVICE_MAX_WORK_GROUP_SIZE,
                        "clGetDeviceInfo(CL_DEVICE_MAX_WORK_GROUP_SIZE)", &d->max_wg,
                        sizeof d->max_wg);
    if (st == CH_OK)
        st = info_value(d->id, CL_DEVICE_LOCAL_MEM_SIZE,
                        "clGetDeviceInfo(CL_DEVICE_LOCAL_MEM_SIZE)", &d->local_mem,
                        sizeof d->local_mem);
    if (st == CH_OK)
        st = info_value(d->id, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS,
                        "clGetDeviceInfo(CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS)", &dims,
                        sizeof dims);
    if (st != CH_OK)
        return st;
    /* At least 3 dimensions (the OpenCL minimum); the sizes of all of them
     * asked at once, the first three kept. */
    if (dims < 3)
        return chi_error(CH_ERR_UNSUPPORTED, "opencl: %s has %u work-item dimensions, fewer "
                         "than the 3 every OpenCL device has", d->name, (unsigned)dims);
    size_t *items = malloc(dims * sizeof *items);
    if (!items)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl: %u work-item sizes", (unsigned)dims);
    st = info_value(d->id, CL_DEVICE_MAX_WORK_ITEM_SIZES,
                    "clGetDeviceInfo(CL_DEVICE_MAX_WORK_ITEM_SIZES)", items,
                    dims * sizeof *items);
    for (int i = 0; st == CH_OK && i < 3; i++)
        d->max_item[i] = items[i];
    free(items);
    if (st != CH_OK)
        return st;
    const chcl_caps *caps = &d->be->caps;
    if (caps->max_wg && caps->max_wg < d->max_wg)
        d->max_wg = caps->max_wg;
    for (int i = 0; i < 3; i++)
        if (d->max_item[i] > d->max_wg)
            d->max_item[i] = d->max_wg;
    if (caps->local_mem && caps->local_mem < d->local_mem)
        d->local_mem = caps->local_mem;
    d->has_fp64 = has_extension(d->id, "cl_khr_fp64");
    return CH_OK;
}

static void device_close(void *dev)
{
    chcl_device *d = dev;
    if (!d)
        return;
    chcl_kernels_release(d);
    if (d->queue)
        clReleaseCommandQueue(d->queue);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static ch_status device_open(void *ctx, int index, void **out)
{
    chcl_backend *be = ctx;
    chcl_device *d = calloc(1, sizeof *d);
    if (!d)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "opencl: device context");
    int rc = pthread_mutex_init(&d->lock, NULL);
    if (rc != 0) {
        free(d);
        return chi_error(CH_ERR_INTERNAL, "opencl: pthread_mutex_init: %s", strerror(rc));
    }
    d->be = be;
    d->plat = be->device_platform[index];
    d->id = be->devices[index];
    atomic_init(&d->allocated, 0);
    ch_status st = device_limits(d);
    if (st == CH_OK) {
        cl_int err;
        d->queue = clCreateCommandQueue(d->plat->ctx, d->id, 0, &err);
        if (err != CL_SUCCESS)
            st = chcl_err(err, "clCreateCommandQueue");
    }
    if (st != CH_OK) {
        device_close(d);
        return st;
    }
    *out = d;
    return CH_OK;
}

/* OpenCL has no portable free-memory query: AMD's where it exists, else
 * the total less what this process holds on the device. */
static ch_status device_mem_info(void *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    chcl_device *d = dev;
    size_t free_kb[2];
    *total_bytes = d->global_mem;
    if (has_extension(d->id, "cl_amd_device_attribute_query") &&
        clGetDeviceInfo(d->id, CL_DEVICE_GLOBAL_FREE_MEMORY_AMD, sizeof free_kb, free_kb,
                        NULL) == CL_SUCCESS) {
        *free_bytes = (uint64_t)free_kb[0] * 1024u;
        return CH_OK;
    }
    uint64_t used = atomic_load(&d->allocated);
    *free_bytes = used < d->global_mem ? d->global_mem - used : 0;
    return CH_OK;
}

static const ch_backend_i table = {
    .abi_version = CH_BACKEND_ABI_VERSION,
    .name = "opencl",
    /* Below a vendor's own API (cuda: 50): a GPU that both drive is kept
     * as cuda:N and hidden here. */
    .priority = 10,
    .init = backend_init,
    .shutdown = backend_shutdown,
    .device_props = backend_device_props,
    .device_open = device_open,
    .device_close = device_close,
    .mem_info = device_mem_info,

    .alloc = chcl_alloc,
    .free = chcl_free,
    .host_alloc = chcl_host_alloc,
    .host_free = chcl_host_free,

    .stream_new = chcl_stream_new,
    .stream_free = chcl_stream_free,
    .stream_sync = chcl_stream_sync,
    .event_new = chcl_event_new,
    .event_free = chcl_event_free,
    .event_record = chcl_event_record,
    .event_wait = chcl_event_wait,
    .event_sync = chcl_event_sync,
    .event_seconds = chcl_event_seconds,

    .upload = chcl_upload,
    .download = chcl_download,
    .copy = chcl_copy,
    .can_peer = chcl_can_peer,
    .peer_copy = chcl_peer_copy,

    .fill = chcl_fill,
    .gemm = chcl_gemm,
    .binary = chcl_binary,
    .axpby = chcl_axpby,
    .act_forward = chcl_act_forward,
    .act_backward = chcl_act_backward,
    .bias_add = chcl_bias_add,
    .bias_grad = chcl_bias_grad,
    .softmax_xent = chcl_softmax_xent,
    .softmax_xent_backward = chcl_softmax_xent_backward,
    .softmax_xent_fused = chcl_softmax_xent_fused,
    .transpose01 = chcl_transpose01,
    .im2col = chcl_im2col,
    .col2im = chcl_col2im,
    .maxpool_forward = chcl_maxpool_forward,
    .maxpool_backward = chcl_maxpool_backward,
    .sum_axis = chcl_sum_axis,
    .argmax = chcl_argmax,
    .sgd_step = chcl_sgd_step,
    .adam_step = chcl_adam_step,
    .rand = chcl_rand,
    .gemm_batched = chcl_gemm_batched,
    .permute = chcl_permute,
    .softmax = chcl_softmax,
    .softmax_backward = chcl_softmax_backward,
    .attention = chcl_attention,
    .attention_backward = chcl_attention_backward,
    .embedding = chcl_embedding,
    .embedding_backward = chcl_embedding_backward,
    .layernorm = chcl_layernorm,
    .layernorm_backward = chcl_layernorm_backward,
    .add_layernorm = chcl_add_layernorm,
    .layernorm_backward_add = chcl_layernorm_backward_add,
    .channel_sums = chcl_channel_sums,
    .batchnorm_stats = chcl_batchnorm_stats,
    .batchnorm_forward = chcl_batchnorm_forward,
    .batchnorm_backward = chcl_batchnorm_backward,

    .allreduce_sum = chcl_allreduce_sum,
    .can_allreduce = chcl_can_allreduce,
    .f32_to_bf16 = chcl_f32_to_bf16,
    .bf16_to_f32 = chcl_bf16_to_f32,
    .f32_to_f16 = chcl_f32_to_f16,
    .f16_to_f32 = chcl_f16_to_f32,
};

CH_API const ch_backend_i *chorus_backend_entry(void) { return &table; }
