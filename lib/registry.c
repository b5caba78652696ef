/* The backend registry: the host backend built in, the others loaded as
 * modules from CHORUS_BACKEND_PATH or the installed backend folder. */
#include "config.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "registry.h"

static chi_backend backends[CH_MAX_BACKENDS];
static int nbackends;

/* Modules the core knows how to look for, in list order, and whether this
 * build made them (a module may still be installed from another build). */
static const struct {
    const char *name;
    int built;
} modules[] = {
#ifdef CH_BUILT_CUDA
    {"cuda", 1},
#else
    {"cuda", 0},
#endif
#ifdef CH_BUILT_OPENCL
    {"opencl", 1},
#else
    {"opencl", 0},
#endif
};

static void set_detail(chi_backend *be, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void set_detail(chi_backend *be, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(be->detail, sizeof be->detail, fmt, ap);
    va_end(ap);
}

/* Find chorus-<name>.so in the search path; "" when it is nowhere. */
static void find_module(const char *name, char *path, size_t size, char *searched,
                        size_t searched_size)
{
    char dirs[4096];
    const char *env = getenv("CHORUS_BACKEND_PATH");
    snprintf(dirs, sizeof dirs, "%s%s%s", env ? env : "", env && *env ? ":" : "",
             CH_BACKEND_DIR);
    size_t len = strlen(dirs) < searched_size ? strlen(dirs) : searched_size - 1;
    memcpy(searched, dirs, len); /* a long path list is cut, not an error */
    searched[len] = '\0';
    path[0] = '\0';
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        if (!*dir)
            continue;
        snprintf(path, size, "%s/chorus-%s.so", dir, name);
        if (access(path, R_OK) == 0)
            return;
    }
    path[0] = '\0';
}

/* The first slot the core calls without looking that `iface` leaves NULL,
 * or NULL when it has them all (lib/backend.h's list says which may be
 * missing; the pairs below are the rules a kind cannot say). */
static const char *missing_slot(const ch_backend_i *iface)
{
#define REQUIRED_SLOT(group, kind, ret, name, params)                                    \
    if (CH_SLOT_IS_##kind##_REQUIRED && !iface->name)                                     \
        return #name;
    CH_BACKEND_SLOTS(REQUIRED_SLOT)
#undef REQUIRED_SLOT
    if (!iface->host_alloc != !iface->host_free)
        return iface->host_alloc ? "host_free (it has host_alloc)" : "host_alloc (it has host_free)";
    if (iface->peer_copy && !iface->can_peer)
        return "can_peer (it has peer_copy)";
    /* The convolution: all three or none. */
    if (iface->conv2d_workspace || iface->conv2d_forward || iface->conv2d_backward) {
        if (!iface->conv2d_workspace)
            return "conv2d_workspace (it has conv2d_forward or conv2d_backward)";
        if (!iface->conv2d_forward)
            return "conv2d_forward (it has conv2d_workspace)";
        if (!iface->conv2d_backward)
            return "conv2d_backward (it has conv2d_workspace)";
    }
    return NULL;
}

/* `path` names the module in messages ("built in" for the host). Nothing
 * but abi_version is read from a table of another version: its layout may
 * differ. */
static ch_status start_backend(chi_backend *be, const ch_backend_i *iface, const char *path)
{
    if (iface->abi_version != CH_BACKEND_ABI_VERSION) {
        set_detail(be,
                   "%s was built for backend ABI version %u, this libchorus speaks version "
                   "%d: rebuild the module with this library",
                   path, (unsigned)iface->abi_version, CH_BACKEND_ABI_VERSION);
        return CH_ERR_UNAVAILABLE;
    }
    const char *missing = missing_slot(iface);
    if (missing) {
        set_detail(be, "%s has no %s slot, which every backend must fill: fix the module",
                   path, missing);
        return CH_ERR_UNAVAILABLE;
    }
    ch_clear_error();
    int n = 0;
    void *ctx = NULL;
    ch_status st = iface->init(&ctx, &n);
    if (st != CH_OK) {
        set_detail(be, "%s", ch_last_error()[0] ? ch_last_error() : "init failed");
        /* Running out of memory is not the backend's fault: ch_init fails
         * rather than give a machine without it. */
        return st == CH_ERR_OUT_OF_MEMORY ? st : CH_ERR_UNAVAILABLE;
    }
    be->iface = iface;
    be->ctx = ctx;
    be->ndevices = n;
    return CH_OK;
}

/* CH_OK, the backend unavailable (the reason in its detail) or not;
 * CH_ERR_OUT_OF_MEMORY when it ran out of memory starting. */
static ch_status load_module(chi_backend *be, const char *name, int built)
{
    char path[1024], searched[400];
    snprintf(be->name, sizeof be->name, "%s", name);
    find_module(name, path, sizeof path, searched, sizeof searched);
    if (!path[0] && !built) {
        set_detail(be, "not built: configure found no %s toolkit or was told --without-%s",
                   name, name);
        return CH_OK;
    }
    if (!path[0]) {
        set_detail(be, "module chorus-%s.so not found in %s", name, searched);
        return CH_OK;
    }
    /* RTLD_LOCAL keeps each module's symbols to itself. Modules are never
     * dlclose'd: driver runtimes (static cudart) register exit handlers that
     * must still find their code at exit. */
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        set_detail(be, "cannot load module: %s", why ? why : path);
        return CH_OK;
    }
    ch_backend_entry_fn entry;
    *(void **)&entry = dlsym(dl, CH_BACKEND_ENTRY_SYMBOL);
    if (!entry) {
        set_detail(be, "%s has no symbol %s", path, CH_BACKEND_ENTRY_SYMBOL);
        return CH_OK;
    }
    be->dl = dl;
    ch_status st = start_backend(be, entry(), path);
    if (st == CH_OK)
        set_detail(be, "%s", path);
    return st == CH_ERR_OUT_OF_MEMORY ? st : CH_OK;
}

ch_status chi_registry_load(void)
{
    memset(backends, 0, sizeof backends);
    nbackends = 0;
    chi_backend *host = &backends[nbackends++];
    snprintf(host->name, sizeof host->name, "host");
    host->host_memory = 1;
    ch_status st = start_backend(host, chi_host_backend(), "the built-in host backend");
    if (st != CH_OK)
        return chi_error(st == CH_ERR_OUT_OF_MEMORY ? st : CH_ERR_INTERNAL,
                         "ch_init: the host backend failed: %s", host->detail);
    set_detail(host, "built in");
    for (size_t i = 0; i < sizeof modules / sizeof modules[0]; i++) {
        chi_backend *be = &backends[nbackends++];
        if (load_module(be, modules[i].name, modules[i].built) != CH_OK)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_init: starting the %s backend: %s",
                             modules[i].name, be->detail);
    }
    return CH_OK;
}

void chi_registry_unload(void)
{
    for (int i = 0; i < nbackends; i++)
        if (backends[i].iface && backends[i].iface->shutdown)
            backends[i].iface->shutdown(backends[i].ctx);
    memset(backends, 0, sizeof backends);
    nbackends = 0;
}

int chi_registry_count(void) { return nbackends; }

chi_backend *chi_registry_get(int i) { return i >= 0 && i < nbackends ? &backends[i] : NULL; }

int ch_backend_count(void) { return chi_initialized() ? nbackends : 0; }

ch_status ch_backend_get_info(int index, ch_backend_info *info)
{
    if (!chi_initialized())
        return chi_error(CH_ERR_STATE, "ch_backend_get_info: call ch_init first");
    if (!info)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_backend_get_info: info is NULL");
    if (index < 0 || index >= nbackends)
        return chi_error(CH_ERR_INVALID_ARGUMENT,
                         "ch_backend_get_info: index %d out of range (0 to %d)", index,
                         nbackends - 1);
    const chi_backend *be = &backends[index];
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", be->name);
    info->available = be->iface != NULL;
    info->device_count = be->ndevices;
    snprintf(info->detail, sizeof info->detail, "%s", be->detail);
    return CH_OK;
}
