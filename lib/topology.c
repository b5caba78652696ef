/* The machine's topology through hwloc: loading it (or a made-up machine
 * from XML) and binding threads to a device's local CPUs. */
#include "config.h"

#include <errno.h>
#include <string.h>

#ifdef HAVE_HWLOC
#include <hwloc.h>
#endif

#include "discover.h"

#ifdef HAVE_HWLOC
/* hwloc does not always set errno; "Success" would mislead. */
static const char *errno_text(int err)
{
    return err ? strerror(err) : "unknown error";
}

/* hwloc components we never need: the OS-device plugins open the vendor
 * runtimes (an OpenCL platform scan, CUDA, NVML, the X server), which our
 * backends already query and which cost tens of milliseconds to seconds; on
 * Linux the kernel's sysfs lists PCI devices, and libpciaccess (the "pci"
 * component) would only add names while leaving memory behind that leak
 * checkers report once hwloc unloads it. */
static const char *const skipped_components[] = {
    "opencl", "cuda", "nvml", "rsmi", "levelzero", "gl",
#ifdef __linux__
    "pci",
#endif
};

static ch_status skip_components(hwloc_topology_t topo)
{
#if HWLOC_API_VERSION >= 0x00020100
    for (size_t i = 0; i < sizeof skipped_components / sizeof *skipped_components; i++) {
        errno = 0;
        /* EINVAL: this hwloc has no such component, nothing to turn off. */
        if (hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST,
                                          skipped_components[i]) != 0 &&
            errno != EINVAL)
            return chi_error(CH_ERR_DRIVER, "hwloc_topology_set_components(-%s): %s",
                             skipped_components[i], errno_text(errno));
    }
#else
    (void)topo;
    (void)skipped_components;
#endif
    return CH_OK;
}

static ch_status topology_configure(hwloc_topology_t topo, const char *xml_path)
{
    ch_status st = skip_components(topo);
    if (st != CH_OK)
        return st;
    /* Without this, XML and live topologies alike drop every PCI device and
     * discovery could place nothing. */
    if (hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT) != 0)
        return chi_error(CH_ERR_DRIVER, "hwloc_topology_set_io_types_filter: %s",
                         errno_text(errno));
    errno = 0;
    if (xml_path && hwloc_topology_set_xml(topo, xml_path) != 0)
        return chi_error(CH_ERR_DRIVER, "hwloc_topology_set_xml(%s): %s", xml_path,
                         errno_text(errno));
    errno = 0;
    if (hwloc_topology_load(topo) != 0)
        return chi_error(CH_ERR_DRIVER, "hwloc_topology_load(%s): %s",
                         xml_path ? xml_path : "this machine", errno_text(errno));
    return CH_OK;
}

ch_status chi_topology_load(void **topology, const char *xml_path)
{
    hwloc_topology_t topo;
    ch_status st;
    if (!topology)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "chi_topology_load: topology is NULL");
    *topology = NULL;
    if (hwloc_topology_init(&topo) != 0)
        return chi_error(CH_ERR_DRIVER, "hwloc_topology_init: %s", errno_text(errno));
    st = topology_configure(topo, xml_path);
    if (st != CH_OK) {
        hwloc_topology_destroy(topo);
        return st;
    }
    *topology = topo;
    return CH_OK;
}

void chi_topology_free(void *topology)
{
    if (topology)
        hwloc_topology_destroy(topology);
}

static ch_status bind_set(hwloc_topology_t topo, hwloc_bitmap_t set, const char *cpuset)
{
    if (hwloc_bitmap_list_sscanf(set, cpuset) != 0 || hwloc_bitmap_iszero(set))
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "chi_bind_thread: cpuset \"%s\" is not a CPU list like \"0-3,8\"",
                         cpuset);
    errno = 0;
    if (hwloc_set_cpubind(topo, set, HWLOC_CPUBIND_THREAD) != 0)
        return chi_error(CH_ERR_DRIVER, "hwloc_set_cpubind(%s, HWLOC_CPUBIND_THREAD): %s",
                         cpuset, errno_text(errno));
    return CH_OK;
}

ch_status chi_bind_thread(void *topology, const char *cpuset)
{
    hwloc_bitmap_t set;
    ch_status st;
    if (!cpuset || cpuset[0] == '\0')
        return CH_OK;
    if (!topology)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "chi_bind_thread: topology is NULL for cpuset \"%s\"", cpuset);
    set = hwloc_bitmap_alloc();
    if (!set)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "chi_bind_thread: hwloc_bitmap_alloc: %s",
                         errno_text(errno));
    st = bind_set(topology, set, cpuset);
    hwloc_bitmap_free(set);
    return st;
}
#else
ch_status chi_topology_load(void **topology, const char *xml_path)
{
    if (topology)
        *topology = NULL;
    return chi_error(CH_ERR_UNAVAILABLE, "chi_topology_load(%s): built without hwloc",
                     xml_path ? xml_path : "this machine");
}

void chi_topology_free(void *topology)
{
    (void)topology;
}

ch_status chi_bind_thread(void *topology, const char *cpuset)
{
    (void)topology;
    (void)cpuset;
    return CH_OK;
}
#endif
