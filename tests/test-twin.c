/* One GPU seen through two backends (tests/minimal-module.c built twice as
 * twinhi, priority 50, and twinlo, priority 10, both reporting PCI
 * 0000:17:00.0, as CUDA and OpenCL report an NVIDIA GPU): discovery keeps
 * twinhi:0 and hides twinlo:0 as "the same GPU as twinhi:0"; naming
 * twinlo:0 (ch_device_by_name, a device list, CHORUS_DEVICES) opens it, at
 * the end of the list and out of "all"; one that will not open stays
 * hidden and says why, every time. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"

/* The hidden entry of `id`, or 0 when there is none. */
static int hidden_entry(const char *id, ch_hidden_device *out)
{
    for (int i = 0; i < ch_hidden_device_count(); i++)
        if (ch_hidden_device_get(i, out) == CH_OK && strcmp(out->id, id) == 0)
            return 1;
    return 0;
}

/* Whether "all" lists a device of that id. */
static int in_all(const char *id)
{
    ch_device *devs[64];
    int n = 0;
    if (ch_device_list_parse(devs, 64, &n, "all") != CH_OK)
        return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(ch_device_id(devs[i]), id) == 0)
            return 1;
    return 0;
}

/* A 2x2 product on `dev` and the bits copied back through the other twin:
 * the named twin is a device like any other. */
static void check_works(ch_device *lo, ch_device *hi)
{
    int64_t shape[2] = {2, 2};
    float a[4] = {1, 2, 3, 4}, c[4] = {0};
    ch_tensor *ta = NULL, *tc = NULL, *moved = NULL;
    ch_status st = ch_tensor_new(&ta, lo, CH_F32, 2, shape);
    if (st == CH_OK)
        st = ch_tensor_new(&tc, lo, CH_F32, 2, shape);
    if (st == CH_OK)
        st = ch_tensor_upload(ta, a, sizeof a);
    if (st == CH_OK)
        st = ch_gemm(tc, 0, 0, 1.0f, ta, ta, 0.0f);
    if (st == CH_OK)
        st = ch_tensor_to(&moved, tc, hi);
    if (st == CH_OK)
        st = ch_tensor_download(moved, c, sizeof c);
    tap_ok(st == CH_OK && c[0] == 7 && c[1] == 10 && c[2] == 15 && c[3] == 22,
           "twinlo:0 multiplies and its result moves to twinhi:0 (status %d: %g %g %g %g)", st,
           c[0], c[1], c[2], c[3]);
    ch_tensor_free(moved);
    ch_tensor_free(tc);
    ch_tensor_free(ta);
}

static void by_default(void)
{
    ch_status st = ch_init();
    if (!tap_status_ok(st, "ch_init with the twins' modules"))
        return;
    ch_device *hi = NULL, *lo = NULL, *again = NULL;
    ch_hidden_device h;
    int count = ch_device_count();
    tap_status_ok(ch_device_by_name(&hi, "twinhi:0"), "twinhi:0 is listed");
    tap_ok(hidden_entry("twinlo:0", &h) && strstr(h.reason, "the same GPU as twinhi:0") &&
               strcmp(h.pci_bus_id, "0000:17:00.0") == 0,
           "twinlo:0 is hidden as \"the same GPU as twinhi:0\" (reason \"%s\")",
           hidden_entry("twinlo:0", &h) ? h.reason : "none");
    tap_ok(in_all("twinhi:0") == 1 && in_all("twinlo:0") == 0,
           "\"all\" takes twinhi:0 and not its duplicate");

    st = ch_device_by_name(&lo, "twinlo:0");
    tap_status_ok(st, "ch_device_by_name(\"twinlo:0\") opens the duplicate");
    ch_device_info info = {0};
    if (lo)
        ch_device_get_info(lo, &info);
    tap_ok(lo && ch_device_count() == count + 1 && info.index == count &&
               strstr(info.note, "the same GPU as twinhi:0") && !info.in_all,
           "it joins the end of the list (%d devices, index %d), out of \"all\", noted \"%s\"",
           ch_device_count(), info.index, info.note);
    tap_ok(!hidden_entry("twinlo:0", &h) && in_all("twinlo:0") == 0,
           "once open it is no longer in the hidden list, and still not in \"all\"");
    tap_ok(ch_device_by_name(&again, "twinlo:0") == CH_OK && again == lo &&
               ch_device_count() == count + 1,
           "naming it again gives the same device");
    ch_device *pair[4];
    int n = 0;
    st = ch_device_list_parse(pair, 4, &n, "twinhi:0,twinlo:0");
    tap_ok(st == CH_OK && n == 2 && pair[0] == hi && pair[1] == lo,
           "the list \"twinhi:0,twinlo:0\" gives both views of the GPU (status %d, %d devices)", st,
           n);
    if (lo && hi)
        check_works(lo, hi);
    else
        tap_skip("twinlo:0 did not open: nothing to run on it");
    ch_shutdown();
}

static void named_at_init(void)
{
    setenv("CHORUS_DEVICES", "host,twinhi:0,twinlo:0", 1);
    ch_status st = ch_init();
    ch_device *lo = NULL;
    ch_hidden_device h;
    tap_ok(st == CH_OK && ch_device_count() == 3 && ch_device_by_name(&lo, "twinlo:0") == CH_OK &&
               !hidden_entry("twinlo:0", &h),
           "CHORUS_DEVICES=host,twinhi:0,twinlo:0 opens the duplicate at ch_init (status %d, %d "
           "devices)",
           st, ch_device_count());
    ch_shutdown();
    unsetenv("CHORUS_DEVICES");
}

static void will_not_open(void)
{
    setenv("MINIMAL_FAIL_OPEN", "twinlo", 1);
    ch_status st = ch_init();
    ch_device *lo = NULL;
    ch_hidden_device h;
    int count = ch_device_count();
    if (!tap_status_ok(st, "ch_init with twinlo's devices refusing to open"))
        return;
    tap_status_is(ch_device_by_name(&lo, "twinlo:0"), CH_ERR_UNAVAILABLE, "device_open refused",
                  "naming a duplicate that will not open fails, saying why");
    tap_status_is(ch_device_by_name(&lo, "twinlo:0"), CH_ERR_UNAVAILABLE, "device_open refused",
                  "and again the same way");
    tap_ok(lo == NULL && ch_device_count() == count && hidden_entry("twinlo:0", &h),
           "it stays hidden and the list is unchanged (%d devices)", ch_device_count());
    ch_device *list[4];
    int n = 0;
    tap_status_is(ch_device_list_parse(list, 4, &n, "twinhi:0,twinlo:0"), CH_ERR_UNAVAILABLE,
                  "twinlo:0", "a device list naming it fails too");
    ch_shutdown();

    setenv("CHORUS_DEVICES", "host,twinhi:0,twinlo:0", 1);
    st = ch_init();
    tap_ok(st == CH_OK && ch_device_count() == 2 && hidden_entry("twinlo:0", &h),
           "named in CHORUS_DEVICES, it stays hidden and ch_init goes on (status %d, %d devices)",
           st, ch_device_count());
    tap_status_is(ch_device_by_name(&lo, "twinlo:0"), CH_ERR_UNAVAILABLE, "device_open refused",
                  "and naming it then says why");
    ch_shutdown();
    unsetenv("CHORUS_DEVICES");
    unsetenv("MINIMAL_FAIL_OPEN");
}

int main(void)
{
    const char *dir = getenv("CHORUS_TEST_TWIN_DIR");
    if (!dir || !*dir)
        tap_skip_all("CHORUS_TEST_TWIN_DIR is unset (make check sets it)");
    /* The twins alone beside the host: no other backend's devices. */
    setenv("CHORUS_BACKEND_PATH", dir, 1);
    unsetenv("CHORUS_DEVICES");
    setenv("CHORUS_QUIET_FALLBACK", "1", 1);
    by_default();
    named_at_init();
    will_not_open();
    return tap_done();
}
