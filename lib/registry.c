/* The backend registry: the host backend built in, the others loaded as
 * modules from CHORUS_BACKEND_PATH or the installed backend folder. */
#include "config.h"

#include <dirent.h>
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

/* The modules this source tree makes, and whether this build made them:
 * named in ch_backend_get_info when the scan finds none of them, to say
 * why (not built, or built and not found). Modules are found by the scan
 * alone (scan_modules). */
static const struct {
    const char *name;
    int built;
} known_modules[] = {
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

/* The search path: CHORUS_BACKEND_PATH's folders, then the installed
 * backend folder. */
static void search_path(char *dirs, size_t size)
{
    const char *env = getenv("CHORUS_BACKEND_PATH");
    snprintf(dirs, size, "%s%s%s", env ? env : "", env && *env ? ":" : "", CH_BACKEND_DIR);
}

/* The backend name of a file called chorus-<name>.so, or 0 when the file
 * is not a module's (or the name does not fit). */
static int module_name(const char *file, char *name, size_t size)
{
    static const char prefix[] = "chorus-", suffix[] = ".so";
    size_t len = strlen(file), pre = sizeof prefix - 1, suf = sizeof suffix - 1;
    if (len <= pre + suf || strncmp(file, prefix, pre) != 0 ||
        strcmp(file + len - suf, suffix) != 0 || len - pre - suf >= size)
        return 0;
    memcpy(name, file + pre, len - pre - suf);
    name[len - pre - suf] = '\0';
    return 1;
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first slot the core calls without looking that `iface` leaves NULL,
 * or NULL when it has them all (lib/backend.h's list says which may be
 * missing; the pairs below are the rules a kind cannot say). */
static const char *missing_slot(const ch_backend_i *iface)
{
/* clang-format off */
#define REQUIRED_SLOT(group, kind, ret, name, params)                                    \
    if (CH_SLOT_IS_##kind##_REQUIRED && !iface->name)                                     \
        return #name;
    /* clang-format on */
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

/* Load the module at `path` as backend `name`. CH_OK, the backend
 * unavailable (the reason in its detail) or not; CH_ERR_OUT_OF_MEMORY when
 * it ran out of memory starting. */
static ch_status load_module(chi_backend *be, const char *name, const char *path)
{
    snprintf(be->name, sizeof be->name, "%s", name);
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

static chi_backend *backend_named(const char *name)
{
    for (int i = 0; i < nbackends; i++)
        if (strcmp(backends[i].name, name) == 0)
            return &backends[i];
    return NULL;
}

/* Every chorus-<name>.so in the search path, in path order and by name
 * within a folder; the first file of a name is the one loaded (a folder
 * earlier in CHORUS_BACKEND_PATH overrides an installed module). */
static ch_status scan_modules(void)
{
    char dirs[4096];
    search_path(dirs, sizeof dirs);
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        DIR *d = *dir ? opendir(dir) : NULL;
        if (!d)
            continue; /* a folder that is not there holds no module */
        char *names[CH_MAX_BACKENDS * 4];
        int n = 0;
        ch_status st = CH_OK;
        for (struct dirent *e = readdir(d); e && st == CH_OK; e = readdir(d)) {
            char name[sizeof backends[0].name];
            if (!module_name(e->d_name, name, sizeof name) || strcmp(name, "host") == 0)
                continue;
            if (n == (int)(sizeof names / sizeof names[0])) {
                st = chi_error(CH_ERR_LIMIT, "ch_init: more than %d modules in %s", n, dir);
                break;
            }
            names[n] = strdup(name);
            if (!names[n])
                st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_init: strdup: out of memory");
            else
                n++;
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof names[0], name_cmp);
        for (int i = 0; i < n && st == CH_OK; i++) {
            if (backend_named(names[i]))
                continue;
            if (nbackends == CH_MAX_BACKENDS) {
                st = chi_error(CH_ERR_LIMIT, "ch_init: more than %d backends (at %s/chorus-%s.so)",
                               CH_MAX_BACKENDS, dir, names[i]);
                break;
            }
            char path[4200];
            snprintf(path, sizeof path, "%s/chorus-%s.so", dir, names[i]);
            chi_backend *be = &backends[nbackends++];
            if (load_module(be, names[i], path) != CH_OK)
                st = chi_error(CH_ERR_OUT_OF_MEMORY, "ch_init: starting the %s backend: %s",
                               names[i], be->detail);
        }
        for (int i = 0; i < n; i++)
            free(names[i]);
        if (st != CH_OK)
            return st;
    }
    return CH_OK;
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
    TRY(scan_modules());
    /* Say why a module of this source tree is missing. */
    char searched[400];
    search_path(searched, sizeof searched); /* a long path list is cut, not an error */
    for (size_t i = 0; i < sizeof known_modules / sizeof known_modules[0]; i++) {
        if (backend_named(known_modules[i].name) || nbackends == CH_MAX_BACKENDS)
            continue;
        chi_backend *be = &backends[nbackends++];
        snprintf(be->name, sizeof be->name, "%s", known_modules[i].name);
        if (known_modules[i].built)
            set_detail(be, "module chorus-%s.so not found in %s", be->name, searched);
        else
            set_detail(be, "not built: configure found no %s toolkit or was told --without-%s",
                       be->name, be->name);
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
