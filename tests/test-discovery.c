/* Device discovery with made-up backend device lists, on hwloc XML
 * topologies of machines we do not have (tests/topologies/). */
/* sched_getaffinity, to see where chi_bind_thread put us. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "config.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "discover.h"
#include "tap.h"

/* What the backends of a made-up machine expose. */
typedef struct machine {
    chi_disc_input in[16];
    int n;
} machine;

/* The priorities the built-in backends' tables state (lib/backend.h);
 * another backend's is set by add_with_priority. */
static int builtin_priority(const char *backend)
{
    return strcmp(backend, "host") == 0 ? 100 : strcmp(backend, "cuda") == 0 ? 50 : 10;
}

static void add_with_priority(machine *m, const char *backend, int priority, int index,
                              ch_device_kind kind, const char *name, const char *bus)
{
    chi_disc_input *in = &m->in[m->n++];
    memset(in, 0, sizeof *in);
    snprintf(in->backend, sizeof in->backend, "%s", backend);
    in->backend_index = index;
    in->priority = priority;
    in->props.kind = kind;
    snprintf(in->props.name, sizeof in->props.name, "%s", name);
    snprintf(in->props.pci_bus_id, sizeof in->props.pci_bus_id, "%s", bus);
}

static void add(machine *m, const char *backend, int index, ch_device_kind kind, const char *name,
                const char *bus)
{
    add_with_priority(m, backend, builtin_priority(backend), index, kind, name, bus);
}

static void add_host(machine *m)
{
    add(m, "host", 0, CH_DEVICE_CPU, "AMD EPYC", "");
}

static int discover(const machine *m, void *topo, chi_disc_result *r, const char *what)
{
    return tap_status_ok(chi_discover(m->in, m->n, topo, r), "%s: chi_discover", what);
}

static const chi_disc_device *find_dev(const chi_disc_result *r, const char *id)
{
    for (int i = 0; i < r->ndevices; i++)
        if (strcmp(r->devices[i].id, id) == 0)
            return &r->devices[i];
    return NULL;
}

static const ch_hidden_device *find_hidden(const chi_disc_result *r, const char *id)
{
    for (int i = 0; i < r->nhidden; i++)
        if (strcmp(r->hidden[i].id, id) == 0)
            return &r->hidden[i];
    return NULL;
}

static void check_visible(const chi_disc_result *r, const char *want, const char *what)
{
    char got[512] = "";
    for (int i = 0; i < r->ndevices; i++) {
        if (i > 0)
            strcat(got, ",");
        strcat(got, r->devices[i].id);
    }
    tap_ok(strcmp(got, want) == 0, "%s: visible devices in order: got \"%s\", want \"%s\"",
           what, got, want);
}

static void check_hidden_ids(const chi_disc_result *r, const char *want, const char *what)
{
    char got[512] = "";
    for (int i = 0; i < r->nhidden; i++) {
        if (i > 0)
            strcat(got, ",");
        strcat(got, r->hidden[i].id);
    }
    tap_ok(strcmp(got, want) == 0, "%s: hidden devices: got \"%s\", want \"%s\"", what, got,
           want);
}

/* The hidden device `id` exists and its reason contains each needle. */
static void check_reason(const chi_disc_result *r, const char *id, const char *needle1,
                         const char *needle2)
{
    const ch_hidden_device *h = find_hidden(r, id);
    const char *reason = h ? h->reason : "(not hidden)";
    tap_ok(h && strstr(reason, needle1) && (!needle2 || strstr(reason, needle2)),
           "%s hidden: reason \"%s\" names \"%s\"%s%s", id, reason, needle1,
           needle2 ? " and " : "", needle2 ? needle2 : "");
}

/* Every visible device points back at the input it came from. */
static void check_inputs(const machine *m, const chi_disc_result *r, const char *what)
{
    int bad = -1;
    for (int i = 0; i < r->ndevices && bad < 0; i++) {
        const chi_disc_input *in = &m->in[r->devices[i].input];
        char id[32];
        if (strcmp(in->backend, "host") == 0)
            snprintf(id, sizeof id, "host");
        else
            snprintf(id, sizeof id, "%s:%d", in->backend, in->backend_index);
        if (strcmp(id, r->devices[i].id) != 0)
            bad = i;
    }
    tap_ok(bad < 0, "%s: each device's input matches its id (first mismatch: %d)", what, bad);
}

/* ---- rules that need no topology ---------------------------------------- */

static void test_cuda_wins(void)
{
    machine m = {.n = 0};
    chi_disc_result r;
    add_host(&m);
    add(&m, "opencl", 0, CH_DEVICE_GPU, "NVIDIA GeForce RTX 3090", "0000:65:00.0");
    add(&m, "cuda", 0, CH_DEVICE_GPU, "NVIDIA GeForce RTX 3090", "0000:65:00.0");
    if (!discover(&m, NULL, &r, "no topology, OpenCL listed first"))
        return;
    check_visible(&r, "host,cuda:0", "no topology, OpenCL listed first");
    check_hidden_ids(&r, "opencl:0", "no topology, OpenCL listed first");
    check_reason(&r, "opencl:0", "same GPU as cuda:0", "0000:65:00.0");
    check_inputs(&m, &r, "no topology, OpenCL listed first");
    /* The duplicate, ready to open when named: its own input, out of
     * "all", its note naming the twin. */
    const chi_disc_device *t = r.ntwins == 1 ? &r.twins[0] : NULL;
    tap_ok(t && strcmp(t->id, "opencl:0") == 0 && t->input == 1 && !t->in_all &&
               strstr(t->note, "the same GPU as cuda:0 (PCI 0000:65:00.0)"),
           "no topology, OpenCL listed first: opencl:0 is the one twin, input 1, out of \"all\", "
           "noted \"%s\" (%d twins)",
           t ? t->note : "", r.ntwins);
    chi_disc_result_free(&r);
}

/* The backend of higher priority keeps a GPU two backends see, whatever
 * its name: a made-up "vulkan" module above CUDA takes the NVIDIA GPU,
 * one below OpenCL loses the AMD GPU to it, and the list is ordered by
 * priority, then name. */
static void test_priority(void)
{
    machine m = {.n = 0};
    chi_disc_result r;
    const char *what = "vulkan at 60, then at 5";
    add_host(&m);
    add(&m, "cuda", 0, CH_DEVICE_GPU, "H100", "0000:17:00.0");
    add(&m, "opencl", 0, CH_DEVICE_GPU, "Radeon", "0000:03:00.0");
    add_with_priority(&m, "vulkan", 60, 0, CH_DEVICE_GPU, "H100", "0000:17:00.0");
    add_with_priority(&m, "vulkan", 60, 1, CH_DEVICE_GPU, "Radeon", "0000:03:00.0");
    if (!discover(&m, NULL, &r, what))
        return;
    check_visible(&r, "host,vulkan:0,vulkan:1", "vulkan at 60");
    check_reason(&r, "cuda:0", "same GPU as vulkan:0", "0000:17:00.0");
    check_reason(&r, "opencl:0", "same GPU as vulkan:1", "0000:03:00.0");
    chi_disc_result_free(&r);
    m.in[3].priority = m.in[4].priority = 5;
    if (!discover(&m, NULL, &r, what))
        return;
    check_visible(&r, "host,cuda:0,opencl:0", "vulkan at 5");
    check_reason(&r, "vulkan:0", "same GPU as cuda:0", NULL);
    check_reason(&r, "vulkan:1", "same GPU as opencl:0", NULL);
    check_inputs(&m, &r, what);
    chi_disc_result_free(&r);
}

static void test_order(void)
{
    machine m = {.n = 0};
    chi_disc_result r;
    add(&m, "opencl", 1, CH_DEVICE_GPU, "Radeon", "0000:03:00.0");
    add(&m, "opencl", 0, CH_DEVICE_GPU, "Arc", "0000:04:00.0");
    add(&m, "cuda", 1, CH_DEVICE_GPU, "H100", "0000:b3:00.0");
    add_host(&m);
    add(&m, "cuda", 0, CH_DEVICE_GPU, "H100", "0000:17:00.0");
    if (!discover(&m, NULL, &r, "shuffled inputs"))
        return;
    check_visible(&r, "host,cuda:0,cuda:1,opencl:0,opencl:1", "shuffled inputs");
    check_hidden_ids(&r, "", "shuffled inputs");
    check_inputs(&m, &r, "shuffled inputs");
    tap_ok(r.devices[1].numa_node == -1 && r.devices[1].cpuset[0] == '\0',
           "no topology: cuda:0 unplaced: got numa %d, cpuset \"%s\", want -1 and \"\"",
           r.devices[1].numa_node, r.devices[1].cpuset);
    chi_disc_result_free(&r);
}

static void test_case_insensitive(void)
{
    machine m = {.n = 0};
    chi_disc_result r;
    add_host(&m);
    add(&m, "cuda", 0, CH_DEVICE_GPU, "H100", "0000:B3:00.0");
    add(&m, "opencl", 0, CH_DEVICE_GPU, "H100", "0000:b3:00.0");
    add(&m, "opencl", 1, CH_DEVICE_GPU, "H100 again", "00000000:b3:00.0");
    if (!discover(&m, NULL, &r, "bus ids in mixed case"))
        return;
    check_visible(&r, "host,cuda:0", "bus ids in mixed case");
    check_reason(&r, "opencl:0", "same GPU as cuda:0", NULL);
    check_reason(&r, "opencl:1", "same GPU as cuda:0", NULL);
    tap_ok(r.ntwins == 2 && strcmp(r.twins[0].id, "opencl:0") == 0 &&
               strcmp(r.twins[1].id, "opencl:1") == 0,
           "bus ids in mixed case: both OpenCL views are twins, in list order (%d)", r.ntwins);
    chi_disc_result_free(&r);
}

static void test_empty_bus_id(void)
{
    machine m = {.n = 0};
    chi_disc_result r;
    add_host(&m);
    add(&m, "cuda", 0, CH_DEVICE_GPU, "GPU without bus id", "");
    add(&m, "opencl", 0, CH_DEVICE_GPU, "GPU without bus id", "");
    add(&m, "opencl", 1, CH_DEVICE_ACCELERATOR, "bad bus id", "0000:zz:00.0");
    add(&m, "opencl", 2, CH_DEVICE_ACCELERATOR, "bad bus id", "0000:zz:00.0");
    if (!discover(&m, NULL, &r, "empty bus ids"))
        return;
    check_visible(&r, "host,cuda:0,opencl:0,opencl:1,opencl:2", "empty or bad bus ids never match");
    chi_disc_result_free(&r);
}

static void test_opencl_cpu(void)
{
    machine m = {.n = 0};
    chi_disc_result r;
    const chi_disc_device *d, *h;
    add_host(&m);
    add(&m, "opencl", 0, CH_DEVICE_CPU, "cpu-AMD EPYC", "");
    add(&m, "opencl", 1, CH_DEVICE_CPU, "cpu-AMD EPYC", "");
    if (!discover(&m, NULL, &r, "PoCL CPU devices"))
        return;
    check_visible(&r, "host,opencl:0,opencl:1", "PoCL CPU devices");
    d = find_dev(&r, "opencl:1");
    h = find_dev(&r, "host");
    tap_ok(d && d->in_all == 0 && strstr(d->note, "host's own CPU"),
           "opencl:1 (PoCL) is named only: in_all %d, note \"%s\"", d ? d->in_all : -1,
           d ? d->note : "");
    tap_ok(h && h->in_all == 1 && h->note[0] == '\0', "host is in all: in_all %d, note \"%s\"",
           h ? h->in_all : -1, h ? h->note : "");
    chi_disc_result_free(&r);
}

static void test_bad_arguments(void)
{
    machine m = {.n = 0};
    chi_disc_result r = {0};
    add_host(&m);
    add(&m, "cuda", 0, CH_DEVICE_GPU, "A", "");
    add(&m, "cuda", 0, CH_DEVICE_GPU, "B", "");
    tap_status_is(chi_discover(m.in, 1, NULL, NULL), CH_ERR_INVALID_ARGUMENT, "result",
                  "chi_discover with result NULL");
    tap_status_is(chi_discover(NULL, 2, NULL, &r), CH_ERR_INVALID_ARGUMENT, "inputs is NULL",
                  "chi_discover with inputs NULL");
    tap_status_is(chi_discover(m.in, -1, NULL, &r), CH_ERR_INVALID_ARGUMENT, "ninputs is -1",
                  "chi_discover with -1 inputs");
    tap_status_is(chi_discover(m.in, m.n, NULL, &r), CH_ERR_INVALID_ARGUMENT, "cuda device 0",
                  "chi_discover with cuda:0 twice");
    tap_ok(r.devices == NULL && r.ndevices == 0, "a failed chi_discover leaves an empty result");
    tap_status_ok(chi_discover(NULL, 0, NULL, &r), "chi_discover with no inputs");
    tap_ok(r.ndevices == 0 && r.nhidden == 0, "no inputs, no devices: got %d and %d hidden",
           r.ndevices, r.nhidden);
    chi_disc_result_free(&r);
    chi_disc_result_free(NULL);
}

/* ---- made-up machines ---------------------------------------------------- */

#ifdef HAVE_HWLOC
static void check_place(const chi_disc_result *r, const char *id, int numa, const char *cpuset,
                        const char *what)
{
    const chi_disc_device *d = find_dev(r, id);
    if (!tap_ok(d != NULL, "%s: %s is visible", what, id))
        return;
    tap_ok(d->numa_node == numa, "%s: %s on NUMA node: got %d, want %d", what, id, d->numa_node,
           numa);
    tap_ok(strcmp(d->cpuset, cpuset) == 0, "%s: %s cpuset: got \"%s\", want \"%s\"", what, id,
           d->cpuset, cpuset);
}

static void *load_xml(const char *file)
{
    const char *srcdir = getenv("CHORUS_TEST_SRCDIR");
    char path[4096];
    void *topo = NULL;
    snprintf(path, sizeof path, "%s/tests/topologies/%s", srcdir ? srcdir : ".", file);
    if (!tap_status_ok(chi_topology_load(&topo, path), "load %s", path))
        return NULL;
    return topo;
}

/* (a) two H100s on different NUMA nodes, each seen by CUDA and OpenCL. */
static void test_two_numa(void)
{
    void *topo = load_xml("two-nvidia-numa.xml");
    machine m = {.n = 0};
    chi_disc_result r;
    const char *what = "two-nvidia-numa";
    add_host(&m);
    add(&m, "opencl", 0, CH_DEVICE_GPU, "NVIDIA H100 PCIe", "0000:17:00.0");
    add(&m, "opencl", 1, CH_DEVICE_GPU, "NVIDIA H100 PCIe", "0000:b3:00.0");
    add(&m, "cuda", 0, CH_DEVICE_GPU, "NVIDIA H100 PCIe", "0000:17:00.0");
    /* Upper case, as some drivers write it: placed and merged all the same. */
    add(&m, "cuda", 1, CH_DEVICE_GPU, "NVIDIA H100 PCIe", "0000:B3:00.0");
    if (topo && discover(&m, topo, &r, what)) {
        check_visible(&r, "host,cuda:0,cuda:1", what);
        check_hidden_ids(&r, "opencl:0,opencl:1", what);
        check_reason(&r, "opencl:1", "same GPU as cuda:1", "0000:b3:00.0");
        check_place(&r, "cuda:0", 0, "0-7", what);
        check_place(&r, "cuda:1", 1, "8-15", what);
        check_place(&r, "host", -1, "0-15", what);
        tap_ok(strcmp(r.devices[1].cpuset, r.devices[2].cpuset) != 0,
               "%s: the two GPUs have different cpusets: \"%s\" and \"%s\"", what,
               r.devices[1].cpuset, r.devices[2].cpuset);
        chi_disc_result_free(&r);
    }
    chi_topology_free(topo);
}

/* (b) an RTX 4090 (CUDA and NVIDIA's OpenCL) next to an RX 7900 XTX. */
static void test_nvidia_amd(void)
{
    void *topo = load_xml("nvidia-amd.xml");
    machine m = {.n = 0};
    chi_disc_result r;
    const char *what = "nvidia-amd";
    add_host(&m);
    add(&m, "cuda", 0, CH_DEVICE_GPU, "NVIDIA GeForce RTX 4090", "0000:01:00.0");
    add(&m, "opencl", 0, CH_DEVICE_GPU, "NVIDIA GeForce RTX 4090", "0000:01:00.0");
    add(&m, "opencl", 1, CH_DEVICE_GPU, "gfx1100", "0000:03:00.0");
    if (topo && discover(&m, topo, &r, what)) {
        check_visible(&r, "host,cuda:0,opencl:1", what);
        check_hidden_ids(&r, "opencl:0", what);
        check_reason(&r, "opencl:0", "same GPU as cuda:0", NULL);
        check_place(&r, "cuda:0", 0, "0-7", what);
        check_place(&r, "opencl:1", 0, "0-7", what);
        check_place(&r, "host", 0, "0-7", what);
        chi_disc_result_free(&r);
    }
    /* Without the AMD ICD, the RX 7900 is still on the bus. */
    m.n = 2;
    if (topo && discover(&m, topo, &r, "nvidia-amd, CUDA only")) {
        check_visible(&r, "host,cuda:0", "nvidia-amd, CUDA only");
        check_hidden_ids(&r, "pci:0000:03:00.0", "nvidia-amd, CUDA only");
        check_reason(&r, "pci:0000:03:00.0", "present, no driver", "OpenCL ICD for AMD");
        tap_ok(r.nhidden == 1 && strcmp(r.hidden[0].name, "AMD GPU [1002:744c]") == 0,
               "nvidia-amd: a GPU without a PCI name is named by vendor and ids: got \"%s\"",
               r.nhidden == 1 ? r.hidden[0].name : "");
        chi_disc_result_free(&r);
    }
    chi_topology_free(topo);
}

/* (c) one RTX 3090, seen by CUDA and OpenCL, plus PoCL on the host. */
static void test_one_nvidia(void)
{
    void *topo = load_xml("one-nvidia.xml");
    machine m = {.n = 0};
    chi_disc_result r;
    const char *what = "one-nvidia";
    add(&m, "opencl", 0, CH_DEVICE_GPU, "NVIDIA GeForce RTX 3090", "0000:65:00.0");
    add(&m, "opencl", 1, CH_DEVICE_CPU, "cpu-Intel Xeon W-2245", "");
    add(&m, "cuda", 0, CH_DEVICE_GPU, "NVIDIA GeForce RTX 3090", "0000:65:00.0");
    add_host(&m);
    if (topo && discover(&m, topo, &r, what)) {
        check_visible(&r, "host,cuda:0,opencl:1", what);
        check_hidden_ids(&r, "opencl:0", what);
        check_reason(&r, "opencl:0", "same GPU as cuda:0", "0000:65:00.0");
        check_place(&r, "cuda:0", 0, "0-3", what);
        check_place(&r, "opencl:1", 0, "0-3", what);
        tap_ok(find_dev(&r, "opencl:1") && find_dev(&r, "opencl:1")->in_all == 0,
               "%s: PoCL's opencl:1 is left out of all", what);
        chi_disc_result_free(&r);
    }
    m.n = 0;
    add_host(&m);
    if (topo && discover(&m, topo, &r, "one-nvidia, no driver")) {
        check_visible(&r, "host", "one-nvidia, no driver");
        check_reason(&r, "pci:0000:65:00.0", "present, no driver", "NVIDIA driver and CUDA");
        chi_disc_result_free(&r);
    }
    chi_topology_free(topo);
}

/* (d) an Intel UHD 770 with its OpenCL runtime, an RX 6800 without one, an
 * Intel NIC and an ASPEED BMC display that are no GPUs of ours. */
static void test_amd_no_driver(void)
{
    void *topo = load_xml("amd-nodriver-intel.xml");
    machine m = {.n = 0};
    chi_disc_result r;
    const char *what = "amd-nodriver-intel";
    const ch_hidden_device *h;
    add_host(&m);
    add(&m, "opencl", 0, CH_DEVICE_GPU, "Intel(R) UHD Graphics 770", "0000:00:02.0");
    if (topo && discover(&m, topo, &r, what)) {
        check_visible(&r, "host,opencl:0", what);
        check_hidden_ids(&r, "pci:0000:03:00.0", what);
        check_reason(&r, "pci:0000:03:00.0", "present, no driver: install",
                     "OpenCL ICD for AMD (ROCm or Mesa rusticl)");
        h = find_hidden(&r, "pci:0000:03:00.0");
        tap_ok(h && strstr(h->name, "Navi 21") && strcmp(h->pci_bus_id, "0000:03:00.0") == 0,
               "%s: the AMD GPU is named from hwloc: \"%s\" at \"%s\"", what, h ? h->name : "",
               h ? h->pci_bus_id : "");
        check_place(&r, "opencl:0", 0, "0-11", what);
        chi_disc_result_free(&r);
    }
    m.n = 1;
    if (topo && discover(&m, topo, &r, "amd-nodriver-intel, host only")) {
        check_hidden_ids(&r, "pci:0000:00:02.0,pci:0000:03:00.0", "amd-nodriver-intel, host only");
        check_reason(&r, "pci:0000:00:02.0", "present, no driver", "intel-opencl-icd");
        chi_disc_result_free(&r);
    }
    chi_topology_free(topo);
}

static void test_missing_xml(void)
{
    void *topo = (void *)&topo;
    ch_status st = chi_topology_load(&topo, "/nonexistent/chorus-test.xml");
    tap_status_is(st, CH_ERR_DRIVER, "/nonexistent/chorus-test.xml",
                  "chi_topology_load on a missing XML file");
    tap_ok(topo == NULL, "a failed load leaves no topology");
}

static void test_bind(void)
{
    void *topo = NULL;
    machine m = {.n = 0};
    chi_disc_result r;
    cpu_set_t mask;
    char cpu[16];
    int c, got;
    /* The machine itself, whatever the environment points hwloc at. */
    unsetenv("HWLOC_XMLFILE");
    if (!tap_status_ok(chi_topology_load(&topo, NULL), "load this machine's topology"))
        return;
    add_host(&m);
    if (discover(&m, topo, &r, "this machine")) {
        tap_ok(r.devices[0].cpuset[0] != '\0', "this machine: host cpuset \"%s\" is known",
               r.devices[0].cpuset);
        c = atoi(r.devices[0].cpuset);
        snprintf(cpu, sizeof cpu, "%d", c);
        tap_status_ok(chi_bind_thread(topo, cpu), "chi_bind_thread to CPU %s", cpu);
        CPU_ZERO(&mask);
        got = sched_getaffinity(0, sizeof mask, &mask);
        tap_ok(got == 0 && CPU_COUNT(&mask) == 1 && CPU_ISSET(c, &mask),
               "the thread runs on CPU %d only: got %d CPUs allowed (sched_getaffinity %d), want 1",
               c, CPU_COUNT(&mask), got);
        chi_disc_result_free(&r);
    }
    tap_status_ok(chi_bind_thread(topo, ""), "chi_bind_thread with an empty cpuset is a no-op");
    tap_status_is(chi_bind_thread(topo, "zero"), CH_ERR_INVALID_ARGUMENT, "zero",
                  "chi_bind_thread with a bad cpuset");
    chi_topology_free(topo);
}

#endif

int main(void)
{
    /* Once PoCL is loaded it points HWLOC_PLUGINS_PATH at /dev/null, and
     * hwloc then reads XML with its own minimal parser instead of libxml2:
     * the made-up machines must load with that parser too. hwloc reads this
     * once, before the first load. */
    setenv("HWLOC_LIBXML_IMPORT", "0", 1);
    test_cuda_wins();
    test_order();
    test_priority();
    test_case_insensitive();
    test_empty_bus_id();
    test_opencl_cpu();
    test_bad_arguments();
#ifdef HAVE_HWLOC
    test_two_numa();
    test_nvidia_amd();
    test_one_nvidia();
    test_amd_no_driver();
    test_missing_xml();
    test_bind();
#else
    tap_skip("made-up topologies and thread binding: built without hwloc");
    tap_status_is(chi_topology_load(&(void *){NULL}, NULL), CH_ERR_UNAVAILABLE, "without hwloc",
                  "chi_topology_load says it was built without hwloc");
#endif
    return tap_done();
}
