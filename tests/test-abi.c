/* What crosses the backend ABI (lib/backend.h). A module built for another
 * ABI version is refused with a message naming both versions, one that
 * leaves a required slot NULL with a message naming the slot, and ch_init
 * still succeeds with the other backends. Every backend answers an enum
 * value beyond those it was built with (what a newer core could pass) with
 * CH_ERR_UNSUPPORTED and a message, never with a default: the slots are
 * called directly, as the core would, the host's from its sources compiled
 * into this program (elementwise.c and sum.c, which hold them), the
 * modules' from chorus-<name>.so found on CHORUS_BACKEND_PATH. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "host.h"
#include "tap.h"

#define N 4

/* ---- A module of another ABI version -------------------------------------- */

static void check_refused(const char *dir)
{
    int found = 0;
    for (int i = 0; i < ch_backend_count(); i++) {
        ch_backend_info info;
        if (ch_backend_get_info(i, &info) != CH_OK || strcmp(info.name, "cuda") != 0)
            continue;
        found = 1;
        char got[64], want[64], path[1024];
        snprintf(got, sizeof got, "ABI version %d", CH_BACKEND_ABI_VERSION - 1);
        snprintf(want, sizeof want, "version %d", CH_BACKEND_ABI_VERSION);
        snprintf(path, sizeof path, "%s/chorus-cuda.so", dir);
        tap_ok(!info.available, "the cuda backend of another ABI version is unavailable");
        tap_ok(strstr(info.detail, got) && strstr(info.detail, want) && strstr(info.detail, path),
               "its detail names the module, its version and ours: \"%s\" (want \"%s\", "
               "\"%s\", \"%s\")", info.detail, path, got, want);
    }
    tap_ok(found, "ch_backend_get_info lists the cuda backend");
}

/* ch_init with the module in the folder $env first on CHORUS_BACKEND_PATH
 * (`search` after it), `check` on what it made of it, then the path back. */
static void with_module_first(const char *env, const char *what, const char *search,
                              void (*check)(const char *dir))
{
    const char *dir = getenv(env);
    if (!tap_ok(dir && *dir, "%s names the folder of %s (make check sets it)", env, what))
        return;
    char path[8200];
    snprintf(path, sizeof path, "%s:%s", dir, search);
    setenv("CHORUS_BACKEND_PATH", path, 1);
    if (tap_status_ok(ch_init(), "ch_init with %s first on the path", what)) {
        check(dir);
        ch_device *host = NULL;
        tap_status_ok(ch_device_by_name(&host, "host"), "the host device is still there");
        ch_shutdown();
    }
    setenv("CHORUS_BACKEND_PATH", search, 1);
}

/* ---- A module without a required slot ---------------------------------------- */

/* The opencl module in `dir` is refused, its detail naming it and `slot`. */
static void check_opencl_refused(const char *dir, const char *what, const char *slot)
{
    int found = 0;
    for (int i = 0; i < ch_backend_count(); i++) {
        ch_backend_info info;
        if (ch_backend_get_info(i, &info) != CH_OK || strcmp(info.name, "opencl") != 0)
            continue;
        found = 1;
        tap_ok(!info.available, "the opencl module %s is unavailable", what);
        tap_ok(strstr(info.detail, slot) && strstr(info.detail, dir),
               "its detail names the module and \"%s\": \"%s\"", slot, info.detail);
    }
    tap_ok(found, "ch_backend_get_info lists the opencl backend");
}

static void check_no_alloc(const char *dir)
{
    check_opencl_refused(dir, "without alloc", "has no alloc slot");
}

static void check_partial_conv(const char *dir)
{
    check_opencl_refused(dir, "with conv2d_forward alone",
                         "has no conv2d_workspace (it has conv2d_forward");
}

/* ---- Enum values beyond a backend's ----------------------------------------- */

/* The slot refused `value` of `what` with a message naming both. */
static void expect_unknown(const char *name, ch_status st, const char *slot, const char *what,
                           int value)
{
    char needle[96];
    snprintf(needle, sizeof needle, "%s %d is unknown", what, value);
    tap_status_is(st, CH_ERR_UNSUPPORTED, needle, "%s %s: %s %d is refused", name, slot, what,
                  value);
}

/* The slots that take an enum, on stream s with buffers x, y, z of N
 * floats: -1 and each _COUNT refused, the last activation run. */
static void test_values(const char *name, const ch_backend_i *be, void *s, ch_bmem x,
                        ch_bmem y, ch_bmem z)
{
    tap_status_ok(be->act_forward(s, CH_ACT_COUNT - 1, N, y, x),
                  "%s act_forward: the last activation (%d) runs", name, CH_ACT_COUNT - 1);
    static const int bad[] = {-1, 0};
    for (int k = 0; k < 2; k++) {
        int act = bad[k] ? bad[k] : CH_ACT_COUNT, bin = bad[k] ? bad[k] : CH_BIN_COUNT;
        int axis = bad[k] ? bad[k] : CH_AXIS_COUNT, kind = bad[k] ? bad[k] : CH_RAND_COUNT;
        ch_clear_error();
        expect_unknown(name, be->act_forward(s, act, N, y, x), "act_forward", "ch_activation",
                       act);
        ch_clear_error();
        expect_unknown(name, be->act_backward(s, act, N, z, y, x, y), "act_backward",
                       "ch_activation", act);
        if (be->gemm_bias_act) {
            /* a 1 x 1 x 1 product, refused before anything is read */
            ch_bmem none = {NULL, 0};
            ch_clear_error();
            expect_unknown(name,
                           be->gemm_bias_act(s, CH_BF16, CH_F32, act, 0, 0, 1, 1, 1, 1.0f, x, 1, y,
                                             1, z, 1, none, x),
                           "gemm_bias_act", "ch_activation", act);
        }
        ch_clear_error();
        expect_unknown(name, be->binary(s, bin, N, z, x, y), "binary", "ch_binary_op", bin);
        ch_clear_error();
        expect_unknown(name, be->sum_axis(s, axis, 1, N, 1, z, x), "sum_axis", "ch_axis_op",
                       axis);
        ch_clear_error();
        expect_unknown(name, be->rand(s, kind, N, z, 1, 0, 0.0f, 1.0f), "rand", "ch_rand_kind",
                       kind);
    }
}

/* The host's slots, from its sources compiled into this program; they run
 * on the calling thread, with no stream, on plain memory. */
static void test_host_values(void)
{
    static const ch_backend_i host_slots = {
        .abi_version = CH_BACKEND_ABI_VERSION,
        .name = "host",
        .binary = chi_host_binary,
        .act_forward = chi_host_act_forward,
        .act_backward = chi_host_act_backward,
        .sum_axis = chi_host_sum_axis,
        .rand = chi_host_rand,
    };
    static float bufs[3][N];
    test_values("host", &host_slots, NULL, (ch_bmem){bufs[0], 0}, (ch_bmem){bufs[1], 0},
                (ch_bmem){bufs[2], 0});
}

/* One module, opened on its device 0, with three buffers of N floats. */
typedef struct opened {
    const char *name;
    const ch_backend_i *be;
    void *ctx, *dev, *stream;
    ch_bmem buf[3];
} opened;

static int open_backend(opened *o)
{
    int n = 0;
    ch_clear_error();
    if (o->be->init(&o->ctx, &n) != CH_OK) {
        tap_skip("%s: no device to run slots on: %s", o->name, ch_last_error());
        return 0;
    }
    if (n == 0) {
        tap_skip("%s: no device", o->name);
        return 0;
    }
    static const float zeros[N];
    ch_status st = o->be->device_open(o->ctx, 0, &o->dev);
    if (st == CH_OK)
        st = o->be->stream_new(o->dev, &o->stream);
    for (int i = 0; i < 3 && st == CH_OK; i++) {
        st = o->be->alloc(o->dev, sizeof zeros, &o->buf[i].ptr);
        if (st == CH_OK)
            st = o->be->upload(o->stream, o->buf[i], zeros, sizeof zeros, 1);
    }
    return tap_status_ok(st, "%s: device 0 opened, buffers ready", o->name);
}

static void close_backend(opened *o)
{
    if (o->stream)
        tap_status_ok(o->be->stream_sync(o->stream), "%s: the stream ends clean", o->name);
    for (int i = 0; i < 3; i++)
        if (o->buf[i].ptr)
            o->be->free(o->dev, o->buf[i].ptr);
    if (o->stream)
        o->be->stream_free(o->stream);
    if (o->dev)
        o->be->device_close(o->dev);
    if (o->ctx)
        o->be->shutdown(o->ctx);
}

static void test_module_values(const char *name, const ch_backend_i *be)
{
    opened o = {.name = name, .be = be};
    if (open_backend(&o))
        test_values(name, be, o.stream, o.buf[0], o.buf[1], o.buf[2]);
    close_backend(&o);
}

/* chorus-<name>.so from the first folder of `search` that has it. */
static const ch_backend_i *module_table(const char *name, const char *search, char *why,
                                        size_t cap)
{
    char dirs[4096], path[4200];
    snprintf(dirs, sizeof dirs, "%s", search);
    snprintf(why, cap, "no chorus-%s.so on CHORUS_BACKEND_PATH (%s)", name, search);
    for (char *save = NULL, *dir = strtok_r(dirs, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        snprintf(path, sizeof path, "%s/chorus-%s.so", dir, name);
        void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!dl) {
            snprintf(why, cap, "%s", dlerror());
            continue;
        }
        ch_backend_entry_fn entry;
        *(void **)&entry = dlsym(dl, CH_BACKEND_ENTRY_SYMBOL);
        if (entry)
            return entry();
        snprintf(why, cap, "%s has no %s", path, CH_BACKEND_ENTRY_SYMBOL);
    }
    return NULL;
}

static void test_module(const char *name, const char *search)
{
    char why[4400];
    const ch_backend_i *be = module_table(name, search, why, sizeof why);
    if (!be) {
        tap_skip("%s: %s", name, why);
        return;
    }
    if (!tap_ok(be->abi_version == CH_BACKEND_ABI_VERSION, "%s: module of ABI version %u, "
                "want %d", name, be->abi_version, CH_BACKEND_ABI_VERSION))
        return;
    test_module_values(name, be);
}

int main(void)
{
    const char *env = getenv("CHORUS_BACKEND_PATH");
    char search[4096];
    snprintf(search, sizeof search, "%s", env ? env : "");
    with_module_first("CHORUS_TEST_WRONG_ABI_DIR", "a module of the previous ABI version", search,
                      check_refused);
    with_module_first("CHORUS_TEST_MISSING_SLOT_DIR", "a module without alloc", search,
                      check_no_alloc);
    with_module_first("CHORUS_TEST_PARTIAL_CONV_DIR", "a module with one convolution slot",
                      search, check_partial_conv);
    test_host_values();
    test_module("opencl", search);
    test_module("cuda", search);
    return tap_done();
}
