/* Device lists: ch_device_list_parse, ch_device_list_parse_replicas, and
 * CHORUS_DEVICES as ch_init reads it (lib/device.c). The harness sees the
 * host alone (CHORUS_BACKEND_PATH is cleared: no module from the build
 * tree loads).
 *
 * Input: byte 0, then the list (up to the first NUL). When byte 0 % 32 is
 * 0 (one input in 32: a ch_init costs as much as hundreds of parses), the
 * list is CHORUS_DEVICES for a ch_init of its own (the library is
 * shut down and initialised again, then restored), and the list is parsed
 * again under it; otherwise byte 0 / 8 % 8 + 1 is the capacity passed to
 * the parsers.
 *
 * Checked against a plain reading of the list: each parser succeeds
 * exactly when every comma-separated name is "all" or a visible device,
 * none is empty, the list is shorter than 1024 characters, the devices fit
 * the capacity and (ch_device_list_parse) none comes twice, and then gives
 * exactly those devices in that order; a failure has a message and *n 0.
 * ch_init under CHORUS_DEVICES succeeds exactly when every name in it is
 * "all" or a device, there is at least one and it is shorter than 1024
 * characters, and then makes visible exactly the devices it names (an
 * empty CHORUS_DEVICES is no restriction, as when it is unset). hwloc
 * sees a made-up machine (HWLOC_SYNTHETIC), for speed. */
#include "config.h"

#include <chorus.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

#define MAXDEV 16

static int ndev;                /* devices without CHORUS_DEVICES */
static char ids[MAXDEV][32];
static int in_all[MAXDEV];

static void init_or_die(void)
{
    if (ch_init() != CH_OK)
        fuzz_fail(__FILE__, __LINE__, "ch_init", "%s", ch_last_error());
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    unsetenv("CHORUS_DEVICES");
    unsetenv("CHORUS_BACKEND_PATH");
    /* A made-up machine for hwloc: ch_init reads the real one in 100 ms
     * and more under ASan, this one in a few. */
    setenv("HWLOC_SYNTHETIC", "pack:1 core:2 pu:1", 0);
    init_or_die();
    ndev = ch_device_count();
    FUZZ_CHECK(ndev >= 1 && ndev <= MAXDEV, "%d devices", ndev);
    for (int i = 0; i < ndev; i++) {
        ch_device *d;
        ch_device_info info;
        FUZZ_CHECK(ch_device_get(&d, i) == CH_OK && ch_device_get_info(d, &info) == CH_OK,
                   "%s", ch_last_error());
        snprintf(ids[i], sizeof ids[i], "%s", info.id);
        in_all[i] = info.in_all;
    }
    return 0;
}

/* The index in ids[] of the visible device named `name` (len bytes), or -1. */
static int visible_index(const char *name, size_t len, const int *visible)
{
    for (int i = 0; i < ndev; i++)
        if (visible[i] && strlen(ids[i]) == len && memcmp(ids[i], name, len) == 0)
            return i;
    return -1;
}

/* Append device i to the expected list: 0 when that makes the list wrong
 * (a repeat where none may be, or more than `capacity`). */
static int add(int *out, int *n, int i, int capacity, int repeats)
{
    for (int k = 0; !repeats && k < *n; k++)
        if (out[k] == i)
            return 0;
    if (*n >= capacity)
        return 0;
    out[(*n)++] = i;
    return 1;
}

/* What parsing `list` should give: 1 and the indices, or 0. */
static int expect(const char *list, int capacity, int repeats, const int *visible,
                  const int *inall, int *out, int *n)
{
    *n = 0;
    if (!*list || strlen(list) >= 1024)
        return 0;
    for (const char *p = list;;) {
        size_t len = strcspn(p, ",");
        if (len == 0)
            return 0;
        if (len == 3 && memcmp(p, "all", 3) == 0) {
            for (int i = 0; i < ndev; i++)
                if (visible[i] && inall[i] && !add(out, n, i, capacity, repeats))
                    return 0;
        } else {
            int i = visible_index(p, len, visible);
            if (i < 0 || !add(out, n, i, capacity, repeats))
                return 0;
        }
        if (!p[len])
            break;
        p += len + 1;
    }
    return *n > 0;
}

static void check_parse(const char *list, int capacity, int repeats, const int *visible,
                        const int *inall)
{
    ch_device *got[64];
    int want[64], nwant, n = -1;
    int ok = expect(list, capacity, repeats, visible, inall, want, &nwant);
    ch_status st = repeats ? ch_device_list_parse_replicas(got, capacity, &n, list)
                           : ch_device_list_parse(got, capacity, &n, list);
    FUZZ_CHECK((st == CH_OK) == ok, "parsing \"%s\" (capacity %d%s) returned %s, expected %s: %s",
               list, capacity, repeats ? ", replicas" : "", ch_status_str(st),
               ok ? "success" : "a failure", ch_last_error());
    if (st != CH_OK) {
        fuzz_check_error("ch_device_list_parse");
        FUZZ_CHECK(n == 0, "a failed parse set *n to %d", n);
        return;
    }
    FUZZ_CHECK(n == nwant, "parsing \"%s\" gave %d devices, expected %d", list, n, nwant);
    for (int k = 0; k < n; k++)
        FUZZ_CHECK(got[k] && strcmp(ch_device_id(got[k]), ids[want[k]]) == 0,
                   "device %d of \"%s\" is %s, expected %s", k, list, ch_device_id(got[k]),
                   ids[want[k]]);
}

/* ch_init under CHORUS_DEVICES=list. */
static void check_env(const char *list)
{
    int all[MAXDEV], visible[MAXDEV], named[MAXDEV], names = 0, ok = strlen(list) < 1024;
    for (int i = 0; i < ndev; i++) {
        all[i] = 1;
        visible[i] = named[i] = 0;
    }
    int any_all = 0;
    for (const char *p = list; ok;) {
        size_t len = strcspn(p, ",");
        if (len == 3 && memcmp(p, "all", 3) == 0) {
            any_all = 1;
            names++;
        } else if (len > 0) {
            int i = visible_index(p, len, all);
            ok = i >= 0;
            if (ok)
                visible[i] = named[i] = 1;
            names++;
        }
        if (!p[len])
            break;
        p += len + 1;
    }
    ok = ok && names > 0;
    for (int i = 0; any_all && i < ndev; i++)
        visible[i] |= in_all[i];
    /* Empty is unset: every device. */
    for (int i = 0; !*list && i < ndev; i++)
        visible[i] = ok = 1;

    ch_shutdown();
    FUZZ_CHECK(setenv("CHORUS_DEVICES", list, 1) == 0, "setenv");
    ch_status st = ch_init();
    FUZZ_CHECK((st == CH_OK) == ok,
               "ch_init with CHORUS_DEVICES=\"%s\" returned %s, expected %s: %s", list,
               ch_status_str(st), ok ? "success" : "a failure", ch_last_error());
    if (st != CH_OK) {
        fuzz_check_error("ch_init");
        FUZZ_CHECK(ch_device_count() == 0, "a failed ch_init left %d devices",
                   ch_device_count());
    } else {
        int count = 0;
        for (int i = 0; i < ndev; i++) {
            ch_device *d = NULL;
            ch_status s = ch_device_by_name(&d, ids[i]);
            FUZZ_CHECK((s == CH_OK) == visible[i], "%s is %svisible under CHORUS_DEVICES=\"%s\"",
                       ids[i], s == CH_OK ? "" : "not ", list);
            if (s != CH_OK)
                fuzz_check_error("ch_device_by_name");
            count += visible[i];
        }
        FUZZ_CHECK(ch_device_count() == count, "%d devices visible, expected %d",
                   ch_device_count(), count);
        /* A device CHORUS_DEVICES names is in "all" too. */
        int inall[MAXDEV];
        for (int i = 0; i < ndev; i++)
            inall[i] = in_all[i] || named[i];
        check_parse(list, 64, 1, visible, inall);
        check_parse(list, 64, 0, visible, inall);
    }
    unsetenv("CHORUS_DEVICES");
    ch_shutdown();
    init_or_die();
    FUZZ_CHECK(ch_device_count() == ndev, "%d devices after restoring, had %d",
               ch_device_count(), ndev);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    char *list = malloc(size);
    FUZZ_CHECK(list != NULL, "out of memory");
    memcpy(list, data + 1, size - 1);
    list[size - 1] = '\0';
    if (data[0] % 32 == 0) {
        check_env(list);
    } else {
        int visible[MAXDEV];
        for (int i = 0; i < MAXDEV; i++)
            visible[i] = 1;
        int capacity = data[0] / 8 % 8 + 1;
        check_parse(list, capacity, 0, visible, in_all);
        check_parse(list, capacity, 1, visible, in_all);
    }
    free(list);
    return 0;
}
