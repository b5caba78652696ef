/* Device discovery: order the backends' devices, merge a GPU that two
 * backends expose, place each device on the machine's topology, and name the
 * GPUs on the PCI bus that no backend drives. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_HWLOC
#include <hwloc.h>
#endif

#include "discover.h"

/* A parsed PCI address; bus ids from different drivers differ in case and
 * in the width of the domain, so they are compared as numbers. */
typedef struct pci_addr {
    int valid;
    unsigned domain;
    unsigned char bus, dev, func;
} pci_addr;

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Reads 1 to `max_digits` hex digits followed by `end`; advances *s. */
static int hex_field(const char **s, int max_digits, char end, unsigned *out)
{
    unsigned v = 0;
    int n = 0;
    while (hex_digit(**s) >= 0) {
        if (++n > max_digits)
            return 0;
        v = v * 16 + (unsigned)hex_digit(**s);
        (*s)++;
    }
    if (n == 0 || **s != end)
        return 0;
    if (end != '\0')
        (*s)++;
    *out = v;
    return 1;
}

/* "dddd:bb:dd.f", hex, any case; NVML writes the domain with 8 digits. */
static pci_addr pci_addr_parse(const char *s)
{
    pci_addr a = {0, 0, 0, 0, 0};
    unsigned bus, dev, func;
    if (!hex_field(&s, 8, ':', &a.domain) || !hex_field(&s, 2, ':', &bus) ||
        !hex_field(&s, 2, '.', &dev) || !hex_field(&s, 1, '\0', &func) ||
        dev > 0x1f || func > 7)
        return a;
    a.bus = (unsigned char)bus;
    a.dev = (unsigned char)dev;
    a.func = (unsigned char)func;
    a.valid = 1;
    return a;
}

static int pci_addr_equal(pci_addr a, pci_addr b)
{
    return a.valid && b.valid && a.domain == b.domain && a.bus == b.bus &&
           a.dev == b.dev && a.func == b.func;
}

static void pci_addr_format(pci_addr a, char *out, size_t size)
{
    snprintf(out, size, "%04x:%02x:%02x.%x", a.domain, a.bus, a.dev, a.func);
}

/* ---- placement on the topology -------------------------------------------- */

#ifdef HAVE_HWLOC
/* The NUMA node is only named when the CPUs are local to exactly one: a GPU
 * hanging off the whole machine is no closer to node 0 than to node 1. */
static void place_at(hwloc_const_cpuset_t cpus, hwloc_const_nodeset_t nodes,
                     chi_disc_device *d)
{
    int len;
    if (nodes && hwloc_bitmap_weight(nodes) == 1)
        d->numa_node = hwloc_bitmap_first(nodes);
    if (!cpus)
        return;
    len = hwloc_bitmap_list_snprintf(d->cpuset, sizeof d->cpuset, cpus);
    /* A truncated list would bind threads to a subset: better unknown. */
    if (len < 0 || (size_t)len >= sizeof d->cpuset)
        d->cpuset[0] = '\0';
}

static void place_host(void *topology, chi_disc_device *d)
{
    hwloc_topology_t topo = topology;
    place_at(hwloc_topology_get_allowed_cpuset(topo),
             hwloc_get_root_obj(topo)->nodeset, d);
}

static void place_pci(void *topology, pci_addr a, chi_disc_device *d)
{
    hwloc_topology_t topo = topology;
    hwloc_obj_t pci, anc;
    if (!a.valid)
        return;
    pci = hwloc_get_pcidev_by_busid(topo, a.domain, a.bus, a.dev, a.func);
    if (!pci)
        return;
    anc = hwloc_get_non_io_ancestor_obj(topo, pci);
    place_at(anc->cpuset, anc->nodeset, d);
}
#else
static void place_host(void *topology, chi_disc_device *d)
{
    (void)topology;
    (void)d;
}

static void place_pci(void *topology, pci_addr a, chi_disc_device *d)
{
    (void)topology;
    (void)a;
    (void)d;
}
#endif

/* ---- ordering and de-duplication ------------------------------------------ */

typedef struct disc_state {
    const chi_disc_input *inputs;
    int ninputs;
    void *topology;
    int *order;        /* input indices in list order */
    pci_addr *addr;    /* parsed bus id of each input */
    chi_disc_result *out;
} disc_state;

/* Higher priority first (the backends' tables say theirs: host, then
 * cuda, then opencl), then by backend name; each by backend index. The
 * first of a group of inputs with one bus id in this order is the one
 * kept, which is how CUDA wins over OpenCL. */
static int input_before(const chi_disc_input *inputs, int a, int b)
{
    const chi_disc_input *x = &inputs[a], *y = &inputs[b];
    int c = (y->priority > x->priority) - (y->priority < x->priority);
    if (c == 0)
        c = strcmp(x->backend, y->backend);
    if (c == 0)
        c = (x->backend_index > y->backend_index) - (x->backend_index < y->backend_index);
    return c < 0;
}

/* Insertion sort: a handful of devices, and no global state for qsort. */
static void sort_order(const chi_disc_input *inputs, int *order, int n)
{
    for (int i = 1; i < n; i++) {
        int v = order[i], j = i;
        for (; j > 0 && input_before(inputs, v, order[j - 1]); j--)
            order[j] = order[j - 1];
        order[j] = v;
    }
}

static void device_id(const chi_disc_input *in, char *out, size_t size)
{
    if (strcmp(in->backend, "host") == 0)
        snprintf(out, size, "host");
    else
        snprintf(out, size, "%s:%d", in->backend, in->backend_index);
}

static ch_status check_inputs(const chi_disc_input *inputs, int ninputs)
{
    for (int i = 0; i < ninputs; i++) {
        if (inputs[i].backend[0] == '\0' ||
            memchr(inputs[i].backend, '\0', sizeof inputs[i].backend) == NULL)
            return chi_error(CH_ERR_INVALID_ARGUMENT,
                             "chi_discover: inputs[%d].backend is empty or not terminated", i);
        for (int j = 0; j < i; j++)
            if (strcmp(inputs[i].backend, inputs[j].backend) == 0 &&
                inputs[i].backend_index == inputs[j].backend_index)
                return chi_error(CH_ERR_INVALID_ARGUMENT,
                                 "chi_discover: inputs[%d] and inputs[%d] are both %s device %d",
                                 j, i, inputs[i].backend, inputs[i].backend_index);
    }
    return CH_OK;
}

static void *disc_alloc(size_t count, size_t size, ch_status *st)
{
    /* calloc(0, ...) may return NULL; one element keeps NULL meaning failure. */
    void *p = calloc(count ? count : 1, size);
    if (!p)
        *st = chi_error(CH_ERR_OUT_OF_MEMORY, "chi_discover: calloc(%zu, %zu): out of memory",
                        count, size);
    return p;
}

/* The visible device of the same GPU that comes earlier in list order. */
static const chi_disc_device *find_twin(const disc_state *s, int input)
{
    for (int i = 0; i < s->out->ndevices; i++)
        if (pci_addr_equal(s->addr[s->out->devices[i].input], s->addr[input]))
            return &s->out->devices[i];
    return NULL;
}

static void add_duplicate(disc_state *s, int input, const chi_disc_device *twin)
{
    const chi_disc_input *in = &s->inputs[input];
    ch_hidden_device *h = &s->out->hidden[s->out->nhidden++];
    char bus[24];
    pci_addr_format(s->addr[input], bus, sizeof bus);
    memset(h, 0, sizeof *h);
    device_id(in, h->id, sizeof h->id);
    snprintf(h->name, sizeof h->name, "%s", in->props.name);
    snprintf(h->pci_bus_id, sizeof h->pci_bus_id, "%s", bus);
    snprintf(h->reason, sizeof h->reason,
             "the same GPU as %s (PCI %s); name it to drive that GPU through %s too", twin->id, bus,
             in->backend);
    chi_disc_device *d = &s->out->twins[s->out->ntwins++];
    memset(d, 0, sizeof *d);
    d->input = input;
    snprintf(d->id, sizeof d->id, "%s", h->id);
    d->numa_node = twin->numa_node;
    snprintf(d->cpuset, sizeof d->cpuset, "%s", twin->cpuset);
    snprintf(d->note, sizeof d->note, "the same GPU as %s (PCI %s), opened because it was named",
             twin->id, bus);
}

static void add_visible(disc_state *s, int input)
{
    const chi_disc_input *in = &s->inputs[input];
    chi_disc_device *d = &s->out->devices[s->out->ndevices++];
    int host_cpu = in->props.kind == CH_DEVICE_CPU;
    memset(d, 0, sizeof *d);
    d->input = input;
    device_id(in, d->id, sizeof d->id);
    d->numa_node = -1;
    d->in_all = 1;
    /* An OpenCL CPU device runs on the host's cores: running it next to
     * host in "all" would put two workers on every core. */
    if (host_cpu && strcmp(in->backend, "host") != 0) {
        d->in_all = 0;
        snprintf(d->note, sizeof d->note, "the host's own CPU (use host); named only");
    }
    if (!s->topology)
        return;
    if (host_cpu)
        place_host(s->topology, d);
    else
        place_pci(s->topology, s->addr[input], d);
}

static void merge_devices(disc_state *s)
{
    for (int k = 0; k < s->ninputs; k++) {
        int i = s->order[k];
        const chi_disc_device *twin = find_twin(s, i);
        if (twin)
            add_duplicate(s, i, twin);
        else
            add_visible(s, i);
    }
}

/* ---- GPUs that no backend drives ------------------------------------------ */

#ifdef HAVE_HWLOC
/* The GPU vendors a backend of ours can drive, and what to install. */
typedef struct gpu_vendor {
    unsigned id;
    const char *name;
    const char *hint;
} gpu_vendor;

static const gpu_vendor gpu_vendors[] = {
    {0x10de, "NVIDIA", "install the NVIDIA driver and CUDA"},
    {0x1002, "AMD", "install an OpenCL ICD for AMD (ROCm or Mesa rusticl)"},
    {0x8086, "Intel", "install Intel's OpenCL runtime (intel-opencl-icd)"},
};

static const gpu_vendor *gpu_vendor_find(unsigned id)
{
    for (size_t i = 0; i < sizeof gpu_vendors / sizeof *gpu_vendors; i++)
        if (gpu_vendors[i].id == id)
            return &gpu_vendors[i];
    return NULL;
}

/* hwloc names PCI devices only where pci.ids was read. */
static void pci_name(hwloc_obj_t pci, const gpu_vendor *v, char *out, size_t size)
{
    const char *vendor = hwloc_obj_get_info_by_name(pci, "PCIVendor");
    const char *device = hwloc_obj_get_info_by_name(pci, "PCIDevice");
    if (vendor && device)
        snprintf(out, size, "%s %s", vendor, device);
    else if (device)
        snprintf(out, size, "%s", device);
    else if (pci->name)
        snprintf(out, size, "%s", pci->name);
    else
        snprintf(out, size, "%s GPU [%04x:%04x]", v->name, pci->attr->pcidev.vendor_id,
                 pci->attr->pcidev.device_id);
}

static int pci_is_driven(const disc_state *s, pci_addr a)
{
    for (int i = 0; i < s->ninputs; i++)
        if (pci_addr_equal(s->addr[i], a))
            return 1;
    return 0;
}

static int count_pci(void *topology)
{
    int n = 0;
    for (hwloc_obj_t o = hwloc_get_next_pcidev(topology, NULL); o;
         o = hwloc_get_next_pcidev(topology, o))
        n++;
    return n;
}

static void add_undriven(disc_state *s)
{
    hwloc_topology_t topo = s->topology;
    for (hwloc_obj_t o = hwloc_get_next_pcidev(topo, NULL); o;
         o = hwloc_get_next_pcidev(topo, o)) {
        const struct hwloc_pcidev_attr_s *p = &o->attr->pcidev;
        pci_addr a = {1, p->domain, p->bus, p->dev, p->func};
        const gpu_vendor *v = gpu_vendor_find(p->vendor_id);
        ch_hidden_device *h;
        char bus[24];
        /* Class 03xx: VGA, XGA and 3D controllers. */
        if ((p->class_id >> 8) != 0x03 || !v || pci_is_driven(s, a))
            continue;
        h = &s->out->hidden[s->out->nhidden++];
        memset(h, 0, sizeof *h);
        pci_addr_format(a, bus, sizeof bus);
        snprintf(h->id, sizeof h->id, "pci:%s", bus);
        pci_name(o, v, h->name, sizeof h->name);
        snprintf(h->pci_bus_id, sizeof h->pci_bus_id, "%s", bus);
        snprintf(h->reason, sizeof h->reason, "present, no driver: %s", v->hint);
    }
}
#else
static int count_pci(void *topology)
{
    (void)topology;
    return 0;
}

static void add_undriven(disc_state *s)
{
    (void)s;
}
#endif

/* ---- entry points ---------------------------------------------------------- */

static ch_status disc_prepare(disc_state *s)
{
    ch_status st = CH_OK;
    int npci = s->topology ? count_pci(s->topology) : 0;
    s->order = disc_alloc((size_t)s->ninputs, sizeof *s->order, &st);
    s->addr = disc_alloc((size_t)s->ninputs, sizeof *s->addr, &st);
    s->out->devices = disc_alloc((size_t)s->ninputs, sizeof *s->out->devices, &st);
    s->out->hidden = disc_alloc((size_t)s->ninputs + (size_t)npci, sizeof *s->out->hidden, &st);
    s->out->twins = disc_alloc((size_t)s->ninputs, sizeof *s->out->twins, &st);
    if (st != CH_OK)
        return st;
    for (int i = 0; i < s->ninputs; i++) {
        s->order[i] = i;
        s->addr[i] = pci_addr_parse(s->inputs[i].props.pci_bus_id);
    }
    sort_order(s->inputs, s->order, s->ninputs);
    return CH_OK;
}

ch_status chi_discover(const chi_disc_input *inputs, int ninputs, void *topology,
                       chi_disc_result *result)
{
    disc_state s = {inputs, ninputs, topology, NULL, NULL, result};
    ch_status st;
    if (!result)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "chi_discover: result is NULL");
    memset(result, 0, sizeof *result);
    if (ninputs < 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "chi_discover: ninputs is %d, want >= 0",
                         ninputs);
    if (ninputs > 0 && !inputs)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "chi_discover: inputs is NULL for %d inputs",
                         ninputs);
    st = check_inputs(inputs, ninputs);
    if (st == CH_OK)
        st = disc_prepare(&s);
    if (st == CH_OK) {
        merge_devices(&s);
        if (topology)
            add_undriven(&s);
    }
    free(s.order);
    free(s.addr);
    if (st != CH_OK)
        chi_disc_result_free(result);
    return st;
}

void chi_disc_result_free(chi_disc_result *result)
{
    if (!result)
        return;
    free(result->devices);
    free(result->hidden);
    free(result->twins);
    memset(result, 0, sizeof *result);
}
