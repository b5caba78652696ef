/* An op whose slot a backend leaves NULL runs on the host backend
 * (lib/backend.h: a new backend starts with the required slots and
 * grows). The tensors are staged through host memory: the inputs
 * downloaded into host tensors, the op run on those by the host backend,
 * the outputs uploaded, before the op returns. Each (device, op) pair is
 * said once on stderr, unless CHORUS_QUIET_FALLBACK=1, and listed by
 * ch_fallback_get. */
#include "config.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* The op slots of lib/backend.h's list: at most one note each per
 * device. */
#define COUNT_OP(group, kind, ret, name, params) +CH_SLOT_IS_##kind##_OP
enum {
    OP_SLOTS = 0 CH_BACKEND_SLOTS(COUNT_OP)
};
#undef COUNT_OP

static pthread_mutex_t notes_lock = PTHREAD_MUTEX_INITIALIZER;
static ch_fallback_info notes[CH_MAX_DEVICES * OP_SLOTS];
static int nnotes;

static int quiet(void)
{
    const char *env = getenv("CHORUS_QUIET_FALLBACK");
    return env && strcmp(env, "1") == 0;
}

/* The first time `dev` runs `slot` on the host: note it and say so. */
static void note(const ch_device *dev, const char *slot)
{
    pthread_mutex_lock(&notes_lock);
    int seen = 0;
    for (int i = 0; i < nnotes && !seen; i++)
        seen = strcmp(notes[i].device, dev->id) == 0 && strcmp(notes[i].op, slot) == 0;
    /* The array holds every (device, op slot) pair there can be. */
    if (!seen && nnotes < (int)(sizeof notes / sizeof notes[0])) {
        ch_fallback_info *f = &notes[nnotes++];
        snprintf(f->device, sizeof f->device, "%s", dev->id);
        snprintf(f->op, sizeof f->op, "%s", slot);
        if (!quiet())
            fprintf(stderr, "chorus: %s has no %s; running it on the host\n", dev->id, slot);
    }
    pthread_mutex_unlock(&notes_lock);
}

void chi_fallback_reset(void)
{
    pthread_mutex_lock(&notes_lock);
    nnotes = 0;
    pthread_mutex_unlock(&notes_lock);
}

int ch_fallback_count(void)
{
    pthread_mutex_lock(&notes_lock);
    int n = nnotes;
    pthread_mutex_unlock(&notes_lock);
    return n;
}

ch_status ch_fallback_get(int index, ch_fallback_info *info)
{
    if (!info)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_fallback_get: info is NULL");
    pthread_mutex_lock(&notes_lock);
    int n = nnotes;
    if (index >= 0 && index < n)
        *info = notes[index];
    pthread_mutex_unlock(&notes_lock);
    if (index < 0 || index >= n)
        return chi_error(CH_ERR_NOT_FOUND,
                         "ch_fallback_get: index %d out of range (%d ops ran "
                         "on the host)",
                         index, n);
    return CH_OK;
}

/* The host memory a host tensor names. */
static void *host_addr(const ch_tensor *t)
{
    ch_bmem m = chi_mem(t);
    return (char *)m.ptr + m.off;
}

/* The earlier argument naming the same memory as staged[i], or i. */
static int first_alias(const chi_staged *staged, int i)
{
    const ch_tensor *t = staged[i].t;
    for (int j = 0; j < i; j++) {
        const ch_tensor *u = staged[j].t;
        if (u && u->buf == t->buf && u->off == t->off && u->numel == t->numel &&
            u->dtype == t->dtype)
            return j;
    }
    return i;
}

ch_status chi_fallback_stage(const char *fn, const char *slot, ch_device *dev,
                             const chi_staged *staged, int n, ch_tensor **on_host)
{
    for (int i = 0; i < n; i++)
        on_host[i] = NULL;
    ch_device *host = chi_host_device();
    if (!host)
        return chi_error(CH_ERR_INTERNAL,
                         "%s: %s has no %s and there is no host device to run "
                         "it on",
                         fn, dev->id, slot);
    note(dev, slot);
    ch_status st = CH_OK;
    for (int i = 0; i < n && st == CH_OK; i++) {
        if (!staged[i].t)
            continue;
        int a = first_alias(staged, i);
        if (a != i) {
            on_host[i] = on_host[a];
            continue;
        }
        const ch_tensor *t = staged[i].t;
        int reads = 0;
        for (int j = i; j < n; j++)
            if (staged[j].t && first_alias(staged, j) == i)
                reads |= staged[j].role & CHI_HALF_IN;
        st = ch_tensor_new(&on_host[i], host, t->dtype, t->ndim, t->shape);
        if (st == CH_OK && reads)
            st = ch_tensor_download(t, host_addr(on_host[i]), ch_tensor_nbytes(t));
    }
    if (st != CH_OK)
        chi_fallback_finish(st, staged, n, on_host);
    return st;
}

ch_status chi_fallback_finish(ch_status st, const chi_staged *staged, int n, ch_tensor **on_host)
{
    for (int i = 0; i < n && st == CH_OK; i++) {
        if (!on_host[i] || first_alias(staged, i) != i)
            continue;
        int writes = 0;
        for (int j = i; j < n; j++)
            if (staged[j].t && first_alias(staged, j) == i)
                writes |= staged[j].role & CHI_HALF_OUT;
        /* The host backend runs an op on the calling thread, so its
         * results are there now. */
        if (writes)
            st =
                ch_tensor_upload(staged[i].t, host_addr(on_host[i]), ch_tensor_nbytes(staged[i].t));
    }
    for (int i = 0; i < n; i++)
        if (on_host[i] && first_alias(staged, i) == i)
            ch_tensor_free(on_host[i]);
    for (int i = 0; i < n; i++)
        on_host[i] = NULL;
    return st;
}
