/* Initialisation and the device list. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "discover.h"
#include "registry.h"
#include "trace.h"

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int initialized;
static atomic_uint generation; /* bumped by every ch_init, for stale thread state */

static ch_device *devices[CH_MAX_DEVICES];
static int ndevices;
/* The host device opened for ops run on the host when it is not in the
 * list (chi_host_device), else NULL. */
static ch_device *fallback_host;
static ch_hidden_device *hidden;
static int nhidden;
/* The hidden duplicates of a GPU another backend shows (discovery's
 * twins) with what opens them: one is opened, and joins the list, when
 * named (CHORUS_DEVICES, ch_device_by_name, a device list). */
typedef struct twin_device {
    chi_disc_input in;
    chi_disc_device dd;
    char failed[256]; /* why it would not open, "" until it was tried */
} twin_device;
static twin_device *twins;
static int ntwins;
static void *topology;

int chi_initialized(void) { return atomic_load(&initialized); }
unsigned chi_generation(void) { return atomic_load(&generation); }
void *chi_topology(void) { return topology; }

static ch_status add_hidden(const ch_hidden_device *h)
{
    ch_hidden_device *grown = realloc(hidden, (size_t)(nhidden + 1) * sizeof *hidden);
    if (!grown)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_init: out of memory");
    hidden = grown;
    hidden[nhidden++] = *h;
    return CH_OK;
}

/* Every device of every loaded backend. */
static ch_status gather_inputs(chi_disc_input **out, int *n)
{
    int total = 0;
    for (int b = 0; b < chi_registry_count(); b++)
        if (chi_registry_get(b)->iface)
            total += chi_registry_get(b)->ndevices;
    chi_disc_input *in = calloc(total ? (size_t)total : 1, sizeof *in);
    if (!in)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_init: out of memory");
    int k = 0;
    for (int b = 0; b < chi_registry_count(); b++) {
        chi_backend *be = chi_registry_get(b);
        if (!be->iface)
            continue;
        for (int i = 0; i < be->ndevices; i++) {
            ch_status pst = be->iface->device_props(be->ctx, i, &in[k].props);
            if (pst == CH_ERR_OUT_OF_MEMORY) { /* not the device's fault: see open_device */
                free(in);
                return chi_error(pst, "ch_init: %s:%d: %s", be->name, i, ch_last_error());
            }
            if (pst != CH_OK) {
                ch_hidden_device h = {0};
                snprintf(h.id, sizeof h.id, "%s:%d", be->name, i);
                snprintf(h.reason, sizeof h.reason, "cannot read its properties: %s",
                         ch_last_error());
                ch_status st = add_hidden(&h);
                if (st != CH_OK) {
                    free(in);
                    return st;
                }
                continue;
            }
            snprintf(in[k].backend, sizeof in[k].backend, "%s", be->name);
            in[k].backend_index = i;
            in[k].priority = be->iface->priority;
            k++;
        }
    }
    *out = in;
    *n = k;
    return CH_OK;
}

static chi_backend *backend_named(const char *name)
{
    for (int b = 0; b < chi_registry_count(); b++)
        if (strcmp(chi_registry_get(b)->name, name) == 0)
            return chi_registry_get(b);
    return NULL;
}

static void fill_info(ch_device *d, const chi_disc_input *in, const chi_disc_device *dd)
{
    ch_device_info *info = &d->info;
    memset(info, 0, sizeof *info);
    info->index = d->index;
    snprintf(info->id, sizeof info->id, "%s", dd->id);
    snprintf(info->backend, sizeof info->backend, "%s", in->backend);
    snprintf(info->name, sizeof info->name, "%s", in->props.name);
    snprintf(info->vendor, sizeof info->vendor, "%s", in->props.vendor);
    snprintf(info->platform, sizeof info->platform, "%s", in->props.platform);
    info->kind = in->props.kind;
    info->memory_bytes = in->props.memory_bytes;
    info->max_alloc_bytes = in->props.max_alloc_bytes;
    info->compute_units = in->props.compute_units;
    snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "%s", in->props.pci_bus_id);
    info->numa_node = dd->numa_node;
    snprintf(info->cpuset, sizeof info->cpuset, "%s", dd->cpuset);
    info->in_all = dd->in_all;
    snprintf(info->note, sizeof info->note, "%s", dd->note);
    snprintf(d->id, sizeof d->id, "%s", dd->id);
}

/* `visible` 0: the host device the fallback runs ops on when
 * CHORUS_DEVICES leaves host out, kept apart from the device list. */
static ch_status open_device(const chi_disc_input *in, const chi_disc_device *dd, int visible)
{
    chi_backend *be = backend_named(in->backend);
    if (!be)
        return chi_error(CH_ERR_INTERNAL, "ch_init: no backend named %s", in->backend);
    if (ndevices >= CH_MAX_DEVICES)
        return chi_error(CH_ERR_LIMIT, "ch_init: more than %d devices", CH_MAX_DEVICES);
    ch_device *d = calloc(1, sizeof *d);
    if (!d)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_init: out of memory");
    d->index = ndevices;
    d->be = be;
    d->be_index = in->backend_index;
    fill_info(d, in, dd);
    ch_status st = CHI_INJECT("device opening", CH_ERR_DRIVER,
                              be->iface->device_open(be->ctx, in->backend_index, &d->dev));
    /* A device that will not open is hidden (and chorus-info says why),
     * but the host always opens, and running out of memory is not the
     * device's fault: those fail ch_init rather than give a smaller
     * machine. */
    if (st != CH_OK && (st == CH_ERR_OUT_OF_MEMORY || strcmp(be->name, "host") == 0)) {
        free(d);
        return chi_error(st, "ch_init: cannot open %s: %s", dd->id, ch_last_error());
    }
    if (st != CH_OK) {
        ch_hidden_device h = {0};
        snprintf(h.id, sizeof h.id, "%s", dd->id);
        snprintf(h.name, sizeof h.name, "%s", in->props.name);
        snprintf(h.pci_bus_id, sizeof h.pci_bus_id, "%s", in->props.pci_bus_id);
        snprintf(h.reason, sizeof h.reason, "cannot open it: %s", ch_last_error());
        free(d);
        return add_hidden(&h);
    }
    chi_alloc_init(&d->alloc);
    pthread_mutex_init(&d->staging_lock, NULL);
    pthread_mutex_init(&d->streams_lock, NULL);
    pthread_mutex_init(&d->clock.lock, NULL);
    /* Listed before its first stream: what the backend allocates from
     * then on is counted on it (chi_device_of). */
    if (visible)
        devices[ndevices++] = d;
    else
        fallback_host = d;
    st = chi_stream_create(&d->default_stream, d, 1);
    if (st != CH_OK) {
        if (visible)
            devices[--ndevices] = NULL;
        else
            fallback_host = NULL;
        be->iface->device_close(d->dev);
        free(d);
        return st;
    }
    return CH_OK;
}

ch_device *chi_device_of(const void *bdev)
{
    for (int i = 0; i < ndevices; i++)
        if (devices[i]->dev == bdev)
            return devices[i];
    return fallback_host && fallback_host->dev == bdev ? fallback_host : NULL;
}

/* While it closes, the device is still listed (its backend gives back
 * what it counted there); it leaves the list once closed. */
static void close_device(ch_device *d)
{
    chi_stream_destroy(d->default_stream);
    chi_alloc_release(d);
    if (d->staging) {
        if (d->be->iface->host_free)
            d->be->iface->host_free(d->dev, d->staging);
        else
            free(d->staging);
    }
    pthread_mutex_destroy(&d->staging_lock);
    pthread_mutex_destroy(&d->streams_lock);
    pthread_mutex_destroy(&d->clock.lock);
    pthread_mutex_destroy(&d->alloc.lock);
    d->be->iface->device_close(d->dev);
    free(d);
}

/* Is `id` named in the CHORUS_DEVICES list (already split at commas)? */
static int listed(const char *list, const char *id)
{
    size_t n = strlen(id);
    for (const char *p = list; *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, id, n) == 0)
            return 1;
        p += len + (end ? 1 : 0);
    }
    return 0;
}

/* Whether `name` is a hidden duplicate's id. */
static int is_twin(const char *name)
{
    for (int i = 0; i < ntwins; i++)
        if (strcmp(twins[i].dd.id, name) == 0)
            return 1;
    return 0;
}

/* Takes the entry of `id` out of the hidden list (a duplicate now open). */
static void unhide(const char *id)
{
    for (int i = 0; i < nhidden; i++)
        if (strcmp(hidden[i].id, id) == 0) {
            memmove(&hidden[i], &hidden[i + 1], (size_t)(nhidden - i - 1) * sizeof *hidden);
            nhidden--;
            return;
        }
}

/* Opens the hidden duplicate t (init_lock held or ch_init running): it
 * joins the end of the list and leaves the hidden one. One that will not
 * open stays hidden, and says why from then on. */
static ch_status open_twin(twin_device *t)
{
    if (t->failed[0])
        return chi_error(CH_ERR_UNAVAILABLE, "device \"%s\" (%s) does not open: %s", t->dd.id,
                         t->dd.note, t->failed);
    int before = ndevices, hidden_before = nhidden;
    ch_status st = open_device(&t->in, &t->dd, 1);
    if (st == CH_OK && ndevices > before) {
        unhide(t->dd.id);
        return CH_OK;
    }
    if (st != CH_OK) /* out of memory: not the device's fault, nothing kept */
        return st;
    if (nhidden > hidden_before) { /* open_device hid it, saying why */
        snprintf(t->failed, sizeof t->failed, "%s", hidden[nhidden - 1].reason);
        nhidden--;
    }
    return chi_error(CH_ERR_UNAVAILABLE, "device \"%s\" (%s) does not open: %s", t->dd.id,
                     t->dd.note, t->failed);
}

/* Names in CHORUS_DEVICES that match no device are an error, not a silent
 * smaller machine; so are a list that names nothing (only commas) and one
 * longer than a device list may be (ch_device_list_parse's 1023
 * characters), which would be cut inside a name. */
static ch_status check_env_list(const char *env, const chi_disc_result *res)
{
    char buf[1024];
    size_t len = strlen(env);
    if (len >= sizeof buf)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_init: CHORUS_DEVICES is %zu characters long, longer than the %zu "
                         "a device list may have", len, sizeof buf - 1);
    memcpy(buf, env, len + 1);
    int names = 0;
    for (char *save = NULL, *name = strtok_r(buf, ",", &save); name;
         name = strtok_r(NULL, ",", &save)) {
        names++;
        if (strcmp(name, "all") == 0)
            continue;
        int found = is_twin(name);
        for (int i = 0; i < res->ndevices && !found; i++)
            found = strcmp(res->devices[i].id, name) == 0;
        if (!found)
            return chi_error(CH_ERR_NOT_FOUND,
                             "ch_init: CHORUS_DEVICES names \"%s\", which is not a device "
                             "here (run chorus-info)", name);
    }
    if (names == 0)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_init: CHORUS_DEVICES \"%s\" names no "
                         "device (unset it to see them all)", env);
    return CH_OK;
}

static int visible(const char *env, const chi_disc_device *dd)
{
    if (!env || !*env)
        return 1;
    if (listed(env, dd->id))
        return 1;
    return listed(env, "all") && dd->in_all;
}

static ch_status discover_and_open(void)
{
    chi_disc_input *in = NULL;
    int nin = 0;
    ch_status st = gather_inputs(&in, &nin);
    if (st != CH_OK)
        return st;
    /* A machine without hwloc information still works, just unplaced. */
    if (chi_topology_load(&topology, NULL) != CH_OK) {
        topology = NULL;
        ch_clear_error();
    }
    chi_disc_result res = {0};
    st = chi_discover(in, nin, topology, &res);
    if (st == CH_OK && res.ntwins > 0) {
        twins = calloc((size_t)res.ntwins, sizeof *twins);
        if (!twins)
            st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_init: out of memory");
        for (int i = 0; st == CH_OK && i < res.ntwins; i++) {
            twins[i].in = in[res.twins[i].input];
            twins[i].dd = res.twins[i];
            ntwins++;
        }
    }
    const char *env = getenv("CHORUS_DEVICES");
    if (st == CH_OK && env && *env)
        st = check_env_list(env, &res);
    for (int i = 0; st == CH_OK && i < res.nhidden; i++)
        st = add_hidden(&res.hidden[i]);
    for (int i = 0; st == CH_OK && i < res.ndevices; i++) {
        chi_disc_device *dd = &res.devices[i];
        if (!visible(env, dd))
            continue;
        /* Named in CHORUS_DEVICES: the user chose it, so "all" takes it
         * too (PoCL's CPU devices, left out by default). */
        if (env && *env && listed(env, dd->id) && !dd->in_all) {
            dd->in_all = 1;
            snprintf(dd->note, sizeof dd->note, "in \"all\": named in CHORUS_DEVICES");
        }
        st = open_device(&in[dd->input], dd, 1);
    }
    /* A duplicate named in CHORUS_DEVICES is opened too, after the rest. */
    for (int i = 0; st == CH_OK && env && *env && i < ntwins; i++)
        if (listed(env, twins[i].dd.id) && (st = open_twin(&twins[i])) == CH_ERR_UNAVAILABLE) {
            st = CH_OK; /* hidden, as a device that will not open is */
            ch_clear_error();
        }
    /* Ops a backend leaves out run on the host (lib/ops_fallback.c), which
     * needs a host device even when the user's list leaves it out. */
    for (int i = 0; st == CH_OK && !chi_host_device() && i < res.ndevices; i++)
        if (strcmp(in[res.devices[i].input].backend, "host") == 0)
            st = open_device(&in[res.devices[i].input], &res.devices[i], 0);
    chi_disc_result_free(&res);
    free(in);
    return st;
}

static void teardown(void)
{
    for (; ndevices > 0; ndevices--)
        close_device(devices[ndevices - 1]);
    if (fallback_host)
        close_device(fallback_host);
    fallback_host = NULL;
    chi_fallback_reset();
    free(hidden);
    hidden = NULL;
    nhidden = 0;
    free(twins);
    twins = NULL;
    ntwins = 0;
    if (topology)
        chi_topology_free(topology);
    topology = NULL;
    chi_registry_unload();
}

ch_status ch_init(void)
{
    pthread_mutex_lock(&init_lock);
    ch_status st = CH_OK;
    if (!atomic_load(&initialized)) {
        st = chi_math_from_env();
        if (st == CH_OK)
            st = chi_registry_load();
        if (st == CH_OK)
            st = discover_and_open();
        if (st == CH_OK) {
            atomic_fetch_add(&generation, 1);
            atomic_store(&initialized, 1);
        } else {
            char msg[1024];
            snprintf(msg, sizeof msg, "%s", ch_last_error());
            teardown();
            chi_error(st, "%s", msg);
        }
    }
    pthread_mutex_unlock(&init_lock);
    return st;
}

void ch_shutdown(void)
{
    /* A running trace is stopped and written out. ch_shutdown returns
     * nothing: a failure leaves its message in ch_last_error() and says it
     * on stderr, as a trace lost without a word would mislead. */
    if (chi_trace_shutdown() != CH_OK)
        fprintf(stderr, "chorus: ch_shutdown: %s\n", ch_last_error());
    pthread_mutex_lock(&init_lock);
    if (atomic_load(&initialized)) {
        atomic_store(&initialized, 0);
        teardown();
    }
    pthread_mutex_unlock(&init_lock);
}

int ch_device_count(void) { return chi_initialized() ? ndevices : 0; }

ch_device *chi_host_device(void)
{
    for (int i = 0; i < ndevices; i++)
        if (devices[i]->be->host_memory)
            return devices[i];
    return fallback_host;
}

ch_status ch_device_get(ch_device **out, int index)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_get: out is NULL");
    *out = NULL;
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_device_get: call ch_init first");
    if (index < 0 || index >= ndevices)
        return chi_error(CH_ERR_NOT_FOUND, "ch_device_get: index %d out of range (%d devices)",
                         index, ndevices);
    *out = devices[index];
    return CH_OK;
}

/* Why a name that is not visible is not there: hidden as a duplicate,
 * restricted by CHORUS_DEVICES, or simply unknown. */
static ch_status not_found(const char *fn, const char *name)
{
    for (int i = 0; i < nhidden; i++)
        if (strcmp(hidden[i].id, name) == 0)
            return chi_error(CH_ERR_NOT_FOUND, "%s: device \"%s\" is hidden: %s", fn, name,
                             hidden[i].reason);
    const char *env = getenv("CHORUS_DEVICES");
    if (env && *env)
        return chi_error(CH_ERR_NOT_FOUND,
                         "%s: no device named \"%s\" (CHORUS_DEVICES=%s restricts the list)",
                         fn, name, env);
    return chi_error(CH_ERR_NOT_FOUND, "%s: no device named \"%s\" (run chorus-info for the list)",
                     fn, name);
}

static ch_device *find_open(const char *name)
{
    for (int i = 0; i < ndevices; i++)
        if (strcmp(devices[i]->id, name) == 0)
            return devices[i];
    return NULL;
}

/* The device of that name, opening a hidden duplicate named for the first
 * time. NULL with *st CH_OK: no such device; NULL with an error: the
 * duplicate would not open. */
static ch_device *find(const char *name, ch_status *st)
{
    *st = CH_OK;
    ch_device *d = find_open(name);
    if (d || !is_twin(name))
        return d;
    pthread_mutex_lock(&init_lock);
    d = find_open(name);
    for (int i = 0; !d && *st == CH_OK && i < ntwins; i++)
        if (strcmp(twins[i].dd.id, name) == 0) {
            *st = open_twin(&twins[i]);
            d = *st == CH_OK ? devices[ndevices - 1] : NULL;
        }
    pthread_mutex_unlock(&init_lock);
    return d;
}

ch_status ch_device_by_name(ch_device **out, const char *name)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_by_name: out is NULL");
    *out = NULL;
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_device_by_name: call ch_init first");
    if (!name)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_by_name: name is NULL");
    ch_status st;
    *out = find(name, &st);
    if (st != CH_OK)
        return chi_error(st, "ch_device_by_name: %s", ch_last_error());
    return *out ? CH_OK : not_found("ch_device_by_name", name);
}

/* Appends d; a device already in the list is an error unless `repeats`. */
static ch_status push(const char *fn, int repeats, ch_device **out, int capacity, int *n,
                      ch_device *d, const char *name)
{
    for (int i = 0; !repeats && i < *n; i++)
        if (out[i] == d)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: device \"%s\" is listed twice", fn,
                             name);
    if (*n >= capacity)
        return chi_error(CH_ERR_LIMIT, "%s: more than capacity %d devices in the list", fn,
                         capacity);
    out[(*n)++] = d;
    return CH_OK;
}

static ch_status parse_list(const char *fn, int repeats, ch_device **out, int capacity,
                            int *n, const char *list)
{
    if (!out || !n || !list)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                         !out ? "out" : !n ? "n" : "list");
    *n = 0;
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "%s: call ch_init first", fn);
    if (capacity < 1)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: capacity %d, expected at least 1", fn,
                         capacity);
    if (!*list)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "%s: the list is empty (expected \"all\" or names)", fn);
    char buf[1024];
    if (strlen(list) >= sizeof buf)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: list too long", fn);
    snprintf(buf, sizeof buf, "%s", list);
    ch_status st = CH_OK;
    char *p = buf;
    while (st == CH_OK) {
        char *comma = strchr(p, ',');
        if (comma)
            *comma = '\0';
        if (!*p) {
            st = chi_error(CH_ERR_INVALID_ARGUMENT, "%s: empty name in \"%s\"", fn, list);
        } else if (strcmp(p, "all") == 0) {
            for (int i = 0; st == CH_OK && i < ndevices; i++)
                if (devices[i]->info.in_all)
                    st = push(fn, repeats, out, capacity, n, devices[i], devices[i]->id);
        } else {
            ch_device *d = find(p, &st);
            if (st != CH_OK)
                st = chi_error(st, "%s: %s", fn, ch_last_error());
            else
                st = d ? push(fn, repeats, out, capacity, n, d, p) : not_found(fn, p);
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    if (st == CH_OK && *n == 0)
        st = chi_error(CH_ERR_NOT_FOUND, "%s: \"%s\" names no device", fn, list);
    if (st != CH_OK)
        *n = 0;
    return st;
}

ch_status ch_device_list_parse(ch_device **out, int capacity, int *n, const char *list)
{
    return parse_list("ch_device_list_parse", 0, out, capacity, n, list);
}

ch_status ch_device_list_parse_replicas(ch_device **out, int capacity, int *n, const char *list)
{
    return parse_list("ch_device_list_parse_replicas", 1, out, capacity, n, list);
}

#define CHECK_DEVICE(fn, dev)                                                    \
    do {                                                                         \
        if (!chi_initialized())                                                  \
            return chi_error(CH_ERR_STATE, fn ": call ch_init first");           \
        if (!(dev))                                                              \
            return chi_error(CH_ERR_INVALID_ARGUMENT, fn ": dev is NULL");       \
    } while (0)

ch_status ch_device_get_info(const ch_device *dev, ch_device_info *info)
{
    CHECK_DEVICE("ch_device_get_info", dev);
    if (!info)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_get_info: info is NULL");
    *info = dev->info;
    return CH_OK;
}

ch_status ch_device_memory(const ch_device *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    CHECK_DEVICE("ch_device_memory", dev);
    if (!free_bytes || !total_bytes)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_memory: %s is NULL",
                         !free_bytes ? "free_bytes" : "total_bytes");
    if (!dev->be->iface->mem_info) {
        *total_bytes = dev->info.memory_bytes;
        *free_bytes = dev->info.memory_bytes;
        return CH_OK;
    }
    return dev->be->iface->mem_info(dev->dev, free_bytes, total_bytes);
}

const char *ch_device_id(const ch_device *dev) { return dev ? dev->id : "(null)"; }

int ch_device_can_peer(const ch_device *src, const ch_device *dst)
{
    if (!chi_initialized() || !src || !dst || src == dst || src->be != dst->be)
        return 0;
    return src->be->iface->can_peer ? src->be->iface->can_peer(src->dev, dst->dev) : 0;
}

ch_status ch_device_bind_thread(const ch_device *dev)
{
    CHECK_DEVICE("ch_device_bind_thread", dev);
    if (!topology)
        return chi_error(CH_ERR_UNAVAILABLE, "ch_device_bind_thread(%s): no hwloc topology "
                         "(built without hwloc, or it failed to load)", dev->id);
    if (dev->info.cpuset[0] == '\0')
        return chi_error(CH_ERR_UNAVAILABLE, "ch_device_bind_thread(%s): the CPUs near the "
                         "device are unknown", dev->id);
    return chi_bind_thread(topology, dev->info.cpuset);
}

ch_status ch_device_sync(ch_device *dev)
{
    CHECK_DEVICE("ch_device_sync", dev);
    return chi_stream_sync_all(dev);
}

int ch_hidden_device_count(void) { return chi_initialized() ? nhidden : 0; }

ch_status ch_hidden_device_get(int index, ch_hidden_device *out)
{
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_hidden_device_get: call ch_init first");
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_hidden_device_get: out is NULL");
    if (index < 0 || index >= nhidden)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_hidden_device_get: index %d out of range (%d hidden)", index,
                         nhidden);
    *out = hidden[index];
    return CH_OK;
}

ch_status ch_device_memory_stats(const ch_device *dev, ch_memory_stats *stats)
{
    CHECK_DEVICE("ch_device_memory_stats", dev);
    if (!stats)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_memory_stats: stats is NULL");
    ch_device *d = (ch_device *)dev;
    pthread_mutex_lock(&d->alloc.lock);
    *stats = d->alloc.stats;
    pthread_mutex_unlock(&d->alloc.lock);
    return CH_OK;
}

ch_status ch_device_reset_peak(ch_device *dev)
{
    CHECK_DEVICE("ch_device_reset_peak", dev);
    chi_alloc_reset_peak(dev);
    return CH_OK;
}

/* The checked device's counters slot: start, or read into out. */
static ch_status counters(const char *fn, ch_device *dev, int start, int time_gemms,
                          ch_device_counters *out)
{
    if (!start && !out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    if (!dev->be->iface->counters)
        return chi_error(CH_ERR_UNSUPPORTED, "%s: %s's backend does not count its launches", fn,
                         dev->id);
    ch_device_counters c = {0, 0, -1.0};
    TRY(dev->be->iface->counters(dev->dev, start, time_gemms != 0, &c.launches, &c.gemms,
                                 &c.gemm_seconds));
    if (out)
        *out = c;
    return CH_OK;
}

ch_status ch_device_counters_start(ch_device *dev, int time_gemms)
{
    CHECK_DEVICE("ch_device_counters_start", dev);
    return counters("ch_device_counters_start", dev, 1, time_gemms, NULL);
}

ch_status ch_device_counters_read(ch_device *dev, ch_device_counters *out)
{
    CHECK_DEVICE("ch_device_counters_read", dev);
    return counters("ch_device_counters_read", dev, 0, 0, out);
}

ch_status ch_device_set_memory_limit(ch_device *dev, uint64_t bytes)
{
    CHECK_DEVICE("ch_device_set_memory_limit", dev);
    chi_alloc_set_limit(dev, bytes);
    return CH_OK;
}

ch_status ch_device_transfer_stats(const ch_device *dev, ch_transfer_stats *stats)
{
    CHECK_DEVICE("ch_device_transfer_stats", dev);
    if (!stats)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_device_transfer_stats: stats is NULL");
    const chi_transfers *t = &dev->transfers;
    stats->peer_copies = atomic_load(&t->peer_copies);
    stats->peer_bytes = atomic_load(&t->peer_bytes);
    stats->staged_copies = atomic_load(&t->staged_copies);
    stats->staged_bytes = atomic_load(&t->staged_bytes);
    return CH_OK;
}

ch_status ch_device_empty_cache(ch_device *dev)
{
    CHECK_DEVICE("ch_device_empty_cache", dev);
    chi_alloc_release(dev);
    return CH_OK;
}
