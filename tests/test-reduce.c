/* The reducer (chorus/reduce.h): every mode over participant lists made of
 * the devices that exist, against a double-precision host reference;
 * sub-ranges; the same bits on every host-staged run; grouping; peer
 * refusals; every argument error; the caller's current streams. Run with
 * POCL_DEVICES="pthread pthread" (the harness sets it) for two OpenCL
 * devices in one platform, and a second vendor's OpenCL beside PoCL
 * (Intel's CPU runtime, which ./bootstrap installs) for two platforms;
 * CHORUS_TEST_DEVICES adds a list of one's own.
 *
 * OpenCL devices are named here by what they share, not by index (which
 * platform comes first is the ICD loader's choice): "peer:0" and "peer:1"
 * are two devices of one platform (one context: peer copies, peer
 * reduction), "cross:0" and "cross:1" two of two platforms, "ocl:N" the
 * N-th OpenCL device; a case whose names are not all here is skipped. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "error.h" /* chi_error, for the failing stage */

#define MAXP 10
#define CAPACITY 65537

static const ch_reduce_mode modes[] = {CH_REDUCE_HOST, CH_REDUCE_PEER, CH_REDUCE_AUTO};

typedef struct rcase {
    const char *names[MAXP];
    int n;
} rcase;

static const rcase cases[] = {
    {{"host", "host", "host"}, 3},
    {{"peer:0", "peer:1"}, 2},
    {{"host", "peer:0", "peer:1"}, 3},
    {{"host", "peer:0", "host", "peer:1"}, 4},
    {{"cross:0", "cross:1"}, 2},
    {{"host", "cross:0", "cross:1"}, 3},
    {{"host", "cross:0", "host", "cross:1"}, 4},
    {{"host", "ocl:0", "ocl:1", "ocl:2"}, 4},
    {{"ocl:0", "ocl:0"}, 2},
    {{"ocl:1", "ocl:1"}, 2},
    {{"ocl:2", "ocl:2"}, 2},
    {{"cuda:0", "cuda:1"}, 2},
    {{"cuda:0", "cuda:0"}, 2},
    {{"host", "cuda:0", "ocl:0"}, 3},
};

/* The symbolic names' devices (NULL where there is none). */
static ch_device *peer_dev[2], *cross_dev[2], *ocl_dev[3];

static void find_symbolic(void)
{
    if (!tap_peer_pair(&peer_dev[0], &peer_dev[1]))
        peer_dev[0] = peer_dev[1] = NULL;
    if (!tap_cross_pair(&cross_dev[0], &cross_dev[1]))
        cross_dev[0] = cross_dev[1] = NULL;
    ch_device *all[64];
    int n = tap_devices(all, 64), k = 0;
    for (int i = 0; i < n && k < 3; i++) {
        ch_device_info info;
        if (ch_device_get_info(all[i], &info) == CH_OK && strcmp(info.backend, "opencl") == 0)
            ocl_dev[k++] = all[i];
    }
}

/* A name of the cases: a device's own id, or a symbolic one. CH_OK with
 * *dev set, or the status of a name that is not here. */
static ch_status device_named(ch_device **dev, const char *name)
{
    ch_device *const *table = NULL;
    int index = 0, size = 0;
    if (sscanf(name, "peer:%d", &index) == 1) {
        table = peer_dev;
        size = 2;
    } else if (sscanf(name, "cross:%d", &index) == 1) {
        table = cross_dev;
        size = 2;
    } else if (sscanf(name, "ocl:%d", &index) == 1) {
        table = ocl_dev;
        size = 3;
    } else {
        return ch_device_by_name(dev, name);
    }
    if (index < 0 || index >= size || !table[index])
        return CH_ERR_NOT_FOUND;
    *dev = table[index];
    return CH_OK;
}

/* One participant list, resolved: devices, a stream each, and the names
 * joined for messages. */
typedef struct plist {
    int n;
    ch_device *dev[MAXP];
    ch_stream *stream[MAXP];
    char label[96];
} plist;

static void plist_free(plist *p)
{
    for (int i = 0; i < p->n; i++)
        ch_stream_free(p->stream[i]);
    memset(p, 0, sizeof *p);
}

/* 1 with everything made; 0 after a failure, or with *missing set to the
 * name of a device that is not here (nothing printed: the caller skips). */
static int plist_make(plist *p, const rcase *c, const char **missing)
{
    *missing = NULL;
    memset(p, 0, sizeof *p);
    for (int i = 0; i < c->n; i++)
        if (device_named(&p->dev[i], c->names[i]) != CH_OK) {
            for (int k = 0; k < c->n; k++) {
                size_t len = strlen(p->label);
                snprintf(p->label + len, sizeof p->label - len, "%s%s", k ? "," : "",
                         c->names[k]);
            }
            *missing = c->names[i];
            return 0;
        }
    for (int i = 0; i < c->n; i++) {
        size_t len = strlen(p->label);
        snprintf(p->label + len, sizeof p->label - len, "%s%s", i ? "," : "",
                 ch_device_id(p->dev[i]));
    }
    for (int i = 0; i < c->n; i++) {
        ch_status st = ch_stream_new(&p->stream[i], p->dev[i]);
        if (st != CH_OK) {
            tap_status_ok(st, "{%s}: ch_stream_new on %s", p->label, c->names[i]);
            plist_free(p);
            return 0;
        }
        p->n = i + 1;
    }
    return 1;
}

/* Whether a and b can be in one peer group: one backend, and for OpenCL
 * one platform (the same device, or two that peer both ways). */
static int joinable(ch_device *a, ch_device *b)
{
    ch_device_info x, y;
    if (ch_device_get_info(a, &x) != CH_OK || ch_device_get_info(b, &y) != CH_OK ||
        strcmp(x.backend, y.backend) != 0)
        return 0;
    if (a == b || strcmp(x.backend, "opencl") != 0)
        return 1;
    return ch_device_can_peer(a, b) && ch_device_can_peer(b, a);
}

/* The first participant that cannot join participant 0, or p->n. */
static int first_apart(const plist *p)
{
    int k = 1;
    while (k < p->n && joinable(p->dev[0], p->dev[k]))
        k++;
    return k;
}

/* ---- one reduction, checked -------------------------------------------- */

/* Buffers of `total` elements (2-D [total / 100, 100] when `two_d`), random
 * inputs; reduce [offset, offset + count); check the sum against a double
 * reference, the same bits in every buffer, the rest untouched. With
 * `exact`, the result must also be the float sum in participant order, and
 * `bits` (NULL or count floats) receives participant 0's result. */
static void run_one(ch_reducer *r, const plist *p, const char *what, int64_t total,
                    int two_d, int64_t offset, int64_t count, uint64_t seed, int exact,
                    float *bits)
{
    int n = p->n;
    ch_tensor *t[MAXP] = {0};
    float *in[MAXP] = {0}, *out = malloc(sizeof(float) * (size_t)total);
    int64_t shape[2] = {two_d ? total / 100 : total, 100};
    ch_status st = CH_OK;
    for (int i = 0; i < n && st == CH_OK; i++) {
        in[i] = malloc(sizeof(float) * (size_t)total);
        if (!in[i] || !out) {
            st = CH_ERR_OUT_OF_MEMORY;
            break;
        }
        tap_rng rng = {seed * 31 + (uint64_t)i};
        for (int64_t k = 0; k < total; k++)
            in[i][k] = tap_rng_uniform(&rng, -1.0f, 1.0f);
        st = ch_tensor_new(&t[i], p->dev[i], CH_F32, two_d ? 2 : 1, shape);
        if (st == CH_OK)
            st = ch_tensor_upload(t[i], in[i], sizeof(float) * (size_t)total);
    }
    if (st == CH_OK)
        st = ch_reducer_allreduce(r, t, offset, count);
    if (!tap_status_ok(st, "%s: allreduce", what))
        goto done;

    double worst = 0;
    int64_t worst_at = -1, inexact = 0, differ = 0, touched = 0;
    for (int i = 0; i < n && st == CH_OK; i++) {
        st = ch_tensor_download(t[i], out, sizeof(float) * (size_t)total);
        if (st != CH_OK)
            break;
        for (int64_t k = 0; k < total; k++) {
            if (k < offset || k >= offset + count) {
                touched += memcmp(&out[k], &in[i][k], sizeof(float)) != 0;
                continue;
            }
            double ref = 0, mag = 0;
            float lr = in[0][k];
            for (int j = 0; j < n; j++) {
                ref += in[j][k];
                mag += fabs(in[j][k]);
                if (j)
                    lr += in[j][k];
            }
            double err = fabs(out[k] - ref) / (mag > 0 ? mag : 1);
            if (err > worst || worst_at < 0) {
                worst = err;
                worst_at = k;
            }
            inexact += memcmp(&out[k], &lr, sizeof lr) != 0;
            if (i == 0 && bits)
                bits[k - offset] = out[k];
            else if (bits)
                differ += memcmp(&out[k], &bits[k - offset], sizeof(float)) != 0;
        }
    }
    if (!tap_status_ok(st, "%s: download", what))
        goto done;
    tap_ok(worst < 1e-6, "%s: relative error %.3g (element %lld) < 1e-6", what, worst,
           (long long)worst_at);
    if (bits)
        tap_ok(differ == 0, "%s: every buffer holds the same bits (%lld differ)", what,
               (long long)differ);
    if (exact)
        tap_ok(inexact == 0,
               "%s: the float sum in participant order, bit for bit (%lld of %lld differ)",
               what, (long long)inexact, (long long)(count * n));
    if (offset > 0 || count < total)
        tap_ok(touched == 0, "%s: the %lld elements outside the range are untouched (%lld "
               "changed)", what, (long long)(total - count) * n, (long long)touched);
done:
    for (int i = 0; i < n; i++) {
        ch_tensor_free(t[i]);
        free(in[i]);
    }
    free(out);
}

/* The caller's current streams: participant 0's device gets a stream of its
 * own made current; after the call every device still has what it had. */
static void check_current_restored(ch_reducer *r, const plist *p, const char *what)
{
    ch_stream *mine = NULL, *before[MAXP], *after[MAXP];
    ch_tensor *t[MAXP] = {0};
    int64_t len = 100;
    ch_status st = ch_stream_new(&mine, p->dev[0]);
    if (st == CH_OK)
        st = ch_stream_set_current(mine);
    for (int i = 0; i < p->n && st == CH_OK; i++) {
        st = ch_tensor_new(&t[i], p->dev[i], CH_F32, 1, &len);
        if (st == CH_OK)
            st = ch_fill(t[i], 1.0);
    }
    /* The fills ran on the caller's streams, the reducer uses its own. */
    for (int i = 0; i < p->n && st == CH_OK; i++)
        st = ch_device_sync(p->dev[i]);
    for (int i = 0; i < p->n && st == CH_OK; i++)
        st = ch_stream_get_current(&before[i], p->dev[i]);
    if (st == CH_OK)
        st = ch_reducer_allreduce(r, t, 0, len);
    for (int i = 0; i < p->n && st == CH_OK; i++)
        st = ch_stream_get_current(&after[i], p->dev[i]);
    if (tap_status_ok(st, "%s: allreduce with a stream of the caller's current", what)) {
        int same = before[0] == mine;
        for (int i = 0; i < p->n; i++)
            same &= before[i] == after[i];
        tap_ok(same, "%s: the calling thread's current streams are as they were", what);
    }
    for (int i = 0; i < p->n; i++)
        ch_tensor_free(t[i]);
    if (mine) {
        ch_stream_reset_current(p->dev[0]);
        ch_stream_free(mine);
    }
}

/* The race that returned wrong sums of 1 float now and then (an upload
 * not yet run when another queue read the buffer): many all-reduces of
 * one float, each on new values uploaded just before, every one checked. */
enum { RACE_ROUNDS = 200 };

static void race_one_float(ch_reducer *r, const plist *p, const char *what)
{
    ch_tensor *t[MAXP] = {0};
    int64_t one = 1;
    ch_status st = CH_OK;
    for (int i = 0; i < p->n && st == CH_OK; i++)
        st = ch_tensor_new(&t[i], p->dev[i], CH_F32, 1, &one);
    int wrong = 0, round = 0;
    for (; round < RACE_ROUNDS && st == CH_OK; round++) {
        float want = 0;
        for (int i = 0; i < p->n && st == CH_OK; i++) {
            float v = (float)(round * 8 + i + 1);
            want += v;
            st = ch_tensor_upload(t[i], &v, sizeof v);
        }
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, t, 0, 1);
        for (int i = 0; i < p->n && st == CH_OK; i++) {
            float got = 0;
            st = ch_tensor_download(t[i], &got, sizeof got);
            wrong += st == CH_OK && got != want;
        }
    }
    if (tap_status_ok(st, "%s: %d all-reduces of 1 float", what, round))
        tap_ok(wrong == 0, "%s: each of %d all-reduces of 1 float right in every buffer (%d "
               "wrong)", what, round, wrong);
    for (int i = 0; i < p->n; i++)
        ch_tensor_free(t[i]);
}

static void run_mode(const plist *p, ch_reduce_mode mode)
{
    char what[160];
    ch_reducer *r = NULL;
    int apart = first_apart(p), peer_ok = apart == p->n;
    ch_status st = ch_reducer_new(&r, p->stream, p->n, CAPACITY, mode);
    snprintf(what, sizeof what, "{%s} %s", p->label, ch_reduce_mode_name(mode));
    if (mode == CH_REDUCE_PEER && !peer_ok) {
        /* Across backends or platforms peer must refuse, naming the
         * first two devices that cannot reduce together. */
        char needle[96];
        snprintf(needle, sizeof needle, "cannot join %s and %s", ch_device_id(p->dev[0]),
                 ch_device_id(p->dev[apart]));
        tap_status_is(st, CH_ERR_UNSUPPORTED, needle, "%s: refused", what);
        tap_ok(r == NULL && strstr(ch_last_error(), "auto or host") != NULL,
               "%s: no reducer, and the message suggests auto or host", what);
        ch_reducer_free(r);
        return;
    }
    if (!tap_status_ok(st, "%s: ch_reducer_new", what))
        return;

    /* Grouping. */
    int groups = ch_reducer_group_count(r), expect_groups = -1;
    if (mode == CH_REDUCE_HOST)
        expect_groups = p->n;
    else if (mode == CH_REDUCE_PEER)
        expect_groups = 1;
    int ordered = 1, last = -1;
    for (int i = 0; i < p->n; i++) {
        int g = ch_reducer_group(r, i);
        if (g < 0 || g >= groups || g > last + 1)
            ordered = 0;
        if (g > last)
            last = g;
        if (mode == CH_REDUCE_AUTO) /* one group per backend, and OpenCL platform */
            for (int j = 0; j < i; j++)
                if ((ch_reducer_group(r, j) == g) !=
                    (p->dev[j] == p->dev[i] ||
                     (strcmp(ch_device_id(p->dev[j]), "host") != 0 &&
                      joinable(p->dev[j], p->dev[i]))))
                    ordered = 0;
    }
    tap_ok((expect_groups < 0 || groups == expect_groups) && ordered &&
               ch_reducer_mode(r) == mode,
           "%s: %d group(s), numbered in order of their first participant, like devices "
           "together in auto",
           what, groups);

    /* Sizes, a sub-range of a 2-D buffer, and the same bits twice. */
    int exact = mode == CH_REDUCE_HOST;
    static const int64_t sizes[] = {1, 1000, 65537};
    float *bits = malloc(sizeof(float) * CAPACITY), *first = malloc(sizeof(float) * CAPACITY);
    char w[256];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        snprintf(w, sizeof w, "%s, %lld floats", what, (long long)sizes[s]);
        run_one(r, p, w, sizes[s], 0, 0, sizes[s], 100 + s, exact, bits);
    }
    memcpy(first, bits, sizeof(float) * 65537); /* the 65537 floats of seed 102 */
    race_one_float(r, p, what);
    snprintf(w, sizeof w, "%s, floats [17, 1017) of a [50, 100] buffer", what);
    run_one(r, p, w, 5000, 1, 17, 1000, 7, exact, bits);
    if (mode == CH_REDUCE_HOST) {
        snprintf(w, sizeof w, "%s, 65537 floats again", what);
        run_one(r, p, w, 65537, 0, 0, 65537, 102, exact, bits);
        tap_ok(memcmp(bits, first, sizeof(float) * 65537) == 0,
               "%s: two runs on the same inputs give the same bits", what);
    }
    free(bits);
    free(first);

    check_current_restored(r, p, what);

    /* count 0: nothing happens, successfully. */
    ch_tensor *t[MAXP] = {0};
    int64_t one = 1;
    st = CH_OK;
    for (int i = 0; i < p->n && st == CH_OK; i++)
        st = ch_tensor_new(&t[i], p->dev[i], CH_F32, 1, &one);
    if (st == CH_OK)
        st = ch_reducer_allreduce(r, t, 1, 0);
    tap_status_ok(st, "%s: count 0 at the end of the buffers is a no-op", what);
    for (int i = 0; i < p->n; i++)
        ch_tensor_free(t[i]);
    ch_reducer_free(r);
}

static void run_case(const rcase *c)
{
    plist p;
    const char *missing;
    if (!plist_make(&p, c, &missing)) {
        for (size_t m = 0; missing && m < sizeof modes / sizeof modes[0]; m++)
            tap_skip("{%s} %s: no device %s here", p.label, ch_reduce_mode_name(modes[m]),
                     missing);
        return;
    }
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
        run_mode(&p, modes[m]);
    plist_free(&p);
}

/* CHORUS_TEST_DEVICES (the GPU check sets "cuda:0,cuda:0" and
 * "cuda:0,cuda:0,cuda:0") is one more case, in every mode. */
static void run_env_case(void)
{
    ch_device *devs[MAXP];
    rcase c;
    memset(&c, 0, sizeof c);
    c.n = tap_env_devices(devs, MAXP);
    for (int i = 0; i < c.n; i++)
        c.names[i] = ch_device_id(devs[i]);
    if (c.n > 0)
        run_case(&c);
}

/* ---- grouping in auto -------------------------------------------------- */

/* Auto groups participants that can reduce peer to peer: one group per
 * backend, and for OpenCL per platform (one context each); the host
 * stages between the groups. */
static void auto_groups_case(const rcase *c, int ngroups, const int *group)
{
    plist p;
    const char *missing;
    if (!plist_make(&p, c, &missing)) {
        if (missing)
            tap_skip("auto over {%s}: no device %s here", p.label, missing);
        return;
    }
    ch_reducer *r = NULL;
    ch_status st = ch_reducer_new(&r, p.stream, p.n, 16, CH_REDUCE_AUTO);
    if (tap_status_ok(st, "auto over {%s}", p.label)) {
        int ok = ch_reducer_group_count(r) == ngroups && ch_reducer_group(r, p.n) == -1 &&
                 ch_reducer_group(r, -1) == -1;
        char got[64] = "";
        for (int i = 0; i < p.n; i++) {
            ok = ok && ch_reducer_group(r, i) == group[i];
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d",
                     ch_reducer_group(r, i));
        }
        tap_ok(ok, "auto over {%s}: %d groups (got %d:%s)", p.label, ngroups,
               ch_reducer_group_count(r), got);
    }
    ch_reducer_free(r);
    plist_free(&p);
}

static void test_auto_groups(void)
{
    const rcase one_platform = {{"host", "peer:0", "peer:1"}, 3};
    auto_groups_case(&one_platform, 2, (const int[]){0, 1, 1});
    const rcase two_platforms = {{"host", "cross:0", "cross:1"}, 3};
    auto_groups_case(&two_platforms, 3, (const int[]){0, 1, 2});
    /* A pair of one platform and a device of another, interleaved. */
    const rcase mixed = {{"peer:0", "host", "cross:0", "peer:1", "cross:1"}, 5};
    plist p;
    const char *missing;
    if (!plist_make(&p, &mixed, &missing)) {
        if (missing)
            tap_skip("auto over {%s}: no device %s here", p.label, missing);
        return;
    }
    /* cross:0 or cross:1 is of peer:0's platform; the other is not. */
    int g[5] = {0, 1, 0, 0, 0};
    int other = joinable(p.dev[0], p.dev[2]) ? 4 : 2;
    g[other] = 2;
    plist_free(&p);
    auto_groups_case(&mixed, 3, g);
}

/* ---- many host replicas, long buffers ------------------------------------ */

/* Ten host participants (more than one pass of the summing kernel adds) and
 * a length that several threads share and that ends inside a chunk and a
 * vector: host and peer (the host backend's allreduce_sum) both give the
 * float sum in participant order. */
static void test_many_host(void)
{
    rcase c;
    for (int i = 0; i < MAXP; i++)
        c.names[i] = "host";
    c.n = MAXP;
    plist p;
    const char *missing;
    if (!plist_make(&p, &c, &missing))
        return;
    static const ch_reduce_mode two[] = {CH_REDUCE_HOST, CH_REDUCE_PEER};
    int64_t total = 300007;
    for (size_t m = 0; m < 2; m++) {
        char what[64];
        snprintf(what, sizeof what, "10 x host %s, %lld floats", ch_reduce_mode_name(two[m]),
                 (long long)total);
        ch_reducer *r = NULL;
        float *bits = malloc(sizeof(float) * (size_t)total);
        if (tap_status_ok(ch_reducer_new(&r, p.stream, p.n, total, two[m]), "%s: new", what))
            run_one(r, &p, what, total, 0, 0, total, 5, 1, bits);
        free(bits);
        ch_reducer_free(r);
    }
    plist_free(&p);
}

/* ---- one participant --------------------------------------------------- */

static void test_single(void)
{
    ch_device *host;
    ch_stream *s;
    ch_reducer *r = NULL;
    ch_tensor *t = NULL;
    int64_t n = 1000;
    float in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (float)i * 0.5f;
    ch_status st = ch_device_by_name(&host, "host");
    if (st == CH_OK)
        st = ch_device_default_stream(&s, host);
    for (size_t m = 0; m < sizeof modes / sizeof modes[0] && st == CH_OK; m++) {
        st = ch_reducer_new(&r, &s, 1, n, modes[m]);
        if (st == CH_OK)
            st = ch_tensor_new(&t, host, CH_F32, 1, &n);
        if (st == CH_OK)
            st = ch_tensor_upload(t, in, sizeof in);
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, &t, 0, n);
        if (st == CH_OK)
            st = ch_tensor_download(t, out, sizeof out);
        if (tap_status_ok(st, "one participant, %s: allreduce", ch_reduce_mode_name(modes[m])))
            tap_ok(memcmp(in, out, sizeof in) == 0 && ch_reducer_group_count(r) == 1 &&
                       ch_reducer_group(r, 0) == 0,
                   "one participant, %s: a no-op, one group", ch_reduce_mode_name(modes[m]));
        ch_tensor_free(t);
        t = NULL;
        ch_reducer_free(r);
        r = NULL;
    }
}

/* ---- a stage across processes ------------------------------------------ */

/* What the stage saw and did: it checks the total it is given against the
 * inputs' sum, keeps a copy, and doubles it plus one (another process's
 * contribution, as it were); `fail` makes it fail instead. */
typedef struct stage_probe {
    int calls, fail;
    int64_t count;
    double worst;        /* largest |total - reference| / (1 + |reference|) */
    const double *want;  /* the reference sum of the range */
    float seen[4096];    /* what it wrote */
} stage_probe;

static ch_status probe_stage(void *user, float *total, int64_t count)
{
    stage_probe *p = user;
    p->calls++;
    p->count = count;
    if (p->fail)
        return chi_error(CH_ERR_REMOTE, "the stage failed on purpose");
    for (int64_t i = 0; i < count; i++) {
        p->worst = fmax(p->worst, fabs(total[i] - p->want[i]) / (1 + fabs(p->want[i])));
        total[i] = total[i] * 2.0f + 1.0f;
        if (i < 4096)
            p->seen[i] = total[i];
    }
    return CH_OK;
}

/* The participants `names` (n of them) in *p; 0, with a skip line naming
 * the missing device under `what`, when one is not here. */
static int plist_of(plist *p, const char *const *names, int n, const char *what)
{
    rcase c = {{NULL}, n};
    for (int i = 0; i < n; i++)
        c.names[i] = names[i];
    const char *missing;
    if (plist_make(p, &c, &missing))
        return 1;
    if (missing)
        tap_skip("%s over {%s...}: no device %s here", what, names[0], missing);
    return 0;
}

static void stage_case(const char *const *names, int n, ch_reduce_mode mode)
{
    plist p;
    if (!plist_of(&p, names, n, "stage"))
        return;
    const char *mode_name = ch_reduce_mode_name(mode);
    ch_reducer *r = NULL;
    ch_status st = ch_reducer_new(&r, p.stream, n, 3000, mode);
    if (st == CH_ERR_UNSUPPORTED) { /* peer over backends that cannot */
        plist_free(&p);
        return;
    }
    enum { TOTAL = 3000, OFF = 100, COUNT = 2500 };
    ch_tensor *t[MAXP] = {0};
    float in[MAXP][TOTAL], out[TOTAL];
    static double want[COUNT];
    tap_rng rng = {41};
    for (int k = 0; k < COUNT; k++)
        want[k] = 0;
    for (int i = 0; i < n; i++)
        for (int k = 0; k < TOTAL; k++) {
            in[i][k] = tap_rng_uniform(&rng, -1, 1);
            if (k >= OFF && k < OFF + COUNT)
                want[k - OFF] += in[i][k];
        }
    stage_probe probe = {0};
    probe.want = want;
    int64_t len = TOTAL;
    if (st == CH_OK)
        st = ch_reducer_set_stage(r, probe_stage, &probe);
    for (int i = 0; i < n && st == CH_OK; i++) {
        st = ch_tensor_new(&t[i], p.dev[i], CH_F32, 1, &len);
        if (st == CH_OK)
            st = ch_tensor_upload(t[i], in[i], sizeof in[i]);
    }
    if (st == CH_OK)
        st = ch_reducer_allreduce(r, t, OFF, COUNT);
    int same = 1;
    for (int i = 0; i < n && st == CH_OK; i++) {
        st = ch_tensor_download(t[i], out, sizeof out);
        for (int k = 0; k < TOTAL; k++)
            same = same && (k >= OFF && k < OFF + COUNT
                                ? memcmp(&out[k], &probe.seen[k - OFF], sizeof(float)) == 0
                                : out[k] == in[i][k]);
    }
    if (tap_status_ok(st, "stage over {%s}, %s: allreduce", p.label, mode_name))
        tap_ok(probe.calls == 1 && probe.count == COUNT && probe.worst < 1e-5 && same,
               "stage over {%s}, %s: called once with the range's %lld-element total (max err "
               "%.1e), and what it wrote is in every buffer, the rest untouched", p.label,
               mode_name, (long long)probe.count, probe.worst);
    probe.fail = 1;
    if (st == CH_OK)
        tap_status_is(ch_reducer_allreduce(r, t, 0, 10), CH_ERR_REMOTE, "failed on purpose",
                      "stage over {%s}, %s: the stage's failure is the call's", p.label,
                      mode_name);
    if (st == CH_OK) {
        int calls = probe.calls;
        st = ch_reducer_set_stage(r, NULL, NULL);
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, t, 0, 10);
        tap_ok(st == CH_OK && probe.calls == calls, "stage over {%s}, %s: removed with NULL, "
               "the next call goes without it", p.label, mode_name);
    }
    for (int i = 0; i < n; i++)
        ch_tensor_free(t[i]);
    ch_reducer_free(r);
    plist_free(&p);
}

static void test_stage(void)
{
    static const char *const one[] = {"host"}, *const hosts[] = {"host", "host", "host"},
                             *const ocl1[] = {"ocl:0"}, *const ocl[] = {"peer:0", "peer:1"},
                             *const mixed[] = {"host", "peer:0", "peer:1"},
                             *const vendors[] = {"host", "cross:0", "cross:1"},
                             *const cuda[] = {"cuda:0"};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        stage_case(one, 1, modes[m]);
        stage_case(hosts, 3, modes[m]);
        stage_case(ocl1, 1, modes[m]);
        stage_case(ocl, 2, modes[m]);
        stage_case(mixed, 3, modes[m]);
        stage_case(vendors, 3, modes[m]);
        stage_case(cuda, 1, modes[m]);
    }
    tap_status_is(ch_reducer_set_stage(NULL, probe_stage, NULL), CH_ERR_INVALID_ARGUMENT,
                  "r is NULL", "ch_reducer_set_stage(NULL)");
}

/* ---- bf16 on the host path ------------------------------------------------- */

static float bf16_round(float f)
{
    /* Round to nearest even on the top 16 bits (finite inputs here). */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Each participant's `total` random floats in in[i] (malloc'd) and in a new
 * f32 tensor t[i] on its device. */
static ch_status random_buffers(const plist *p, int n, int64_t total, tap_rng *rng, float **in,
                                ch_tensor **t)
{
    for (int i = 0; i < n; i++) {
        in[i] = malloc(sizeof(float) * (size_t)total);
        if (!in[i])
            return CH_ERR_OUT_OF_MEMORY;
        for (int64_t k = 0; k < total; k++)
            in[i][k] = tap_rng_uniform(rng, -1, 1);
        TRY(ch_tensor_new(&t[i], p->dev[i], CH_F32, 1, &total));
        TRY(ch_tensor_upload(t[i], in[i], sizeof(float) * (size_t)total));
    }
    return CH_OK;
}

static void free_buffers(int n, float **in, ch_tensor **t)
{
    for (int i = 0; i < n; i++) {
        ch_tensor_free(t[i]);
        free(in[i]);
    }
}

/* Host mode moves bf16: every participant ends with the bf16 rounding of
 * the f32 sum, taken left to right, of the participants' values rounded
 * to bf16: bit for bit, in every buffer, the rest of the buffers untouched;
 * two calls give the same bits; f32 again after switching back. */
static void bf16_case(const char *const *names, int n, int64_t total, int64_t off, int64_t count)
{
    plist p;
    if (!plist_of(&p, names, n, "bf16"))
        return;
    ch_reducer *r = NULL;
    ch_tensor *t[MAXP] = {0};
    float *in[MAXP] = {0}, *out = malloc(sizeof(float) * (size_t)total),
          *want = malloc(sizeof(float) * (size_t)count);
    tap_rng rng = {77};
    ch_status st = out && want ? ch_reducer_new(&r, p.stream, n, count, CH_REDUCE_HOST)
                               : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_OK)
        st = ch_reducer_set_dtype(r, CH_BF16);
    if (st == CH_OK)
        st = random_buffers(&p, n, total, &rng, in, t);
    for (int64_t k = 0; st == CH_OK && k < count; k++) {
        float acc = bf16_round(in[0][off + k]);
        for (int i = 1; i < n; i++)
            acc += bf16_round(in[i][off + k]);
        want[k] = bf16_round(acc);
    }
    int same = 1, again = 1;
    for (int pass = 0; pass < 2 && st == CH_OK; pass++) {
        if (pass == 1) /* the same inputs again */
            for (int i = 0; i < n && st == CH_OK; i++)
                st = ch_tensor_upload(t[i], in[i], sizeof(float) * (size_t)total);
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, t, off, count);
        for (int i = 0; i < n && st == CH_OK; i++) {
            st = ch_tensor_download(t[i], out, sizeof(float) * (size_t)total);
            for (int64_t k = 0; st == CH_OK && k < total; k++) {
                int ok = k >= off && k < off + count
                             ? memcmp(&out[k], &want[k - off], sizeof(float)) == 0
                             : out[k] == in[i][k];
                if (pass == 0)
                    same = same && ok;
                else
                    again = again && ok;
            }
        }
    }
    if (tap_status_ok(st, "bf16 over {%s}: allreduce of %lld of %lld floats", p.label,
                      (long long)count, (long long)total))
        tap_ok(same && again, "bf16 over {%s}: every buffer holds bf16(sum of bf16(x_i)) bit for "
               "bit, the rest untouched, on two calls", p.label);
    if (st == CH_OK) {
        st = ch_reducer_set_dtype(r, CH_F32);
        for (int i = 0; i < n && st == CH_OK; i++)
            st = ch_tensor_upload(t[i], in[i], sizeof(float) * (size_t)total);
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, t, off, count);
        int f32 = 1;
        for (int i = 0; i < n && st == CH_OK; i++) {
            st = ch_tensor_download(t[i], out, sizeof(float) * (size_t)total);
            for (int64_t k = 0; st == CH_OK && k < count; k++) {
                float acc = in[0][off + k];
                for (int j = 1; j < n; j++)
                    acc += in[j][off + k];
                f32 = f32 && out[off + k] == acc;
            }
        }
        tap_ok(st == CH_OK && f32, "bf16 over {%s}: back to f32, the f32 sum bit for bit",
               p.label);
    }
    free_buffers(n, in, t);
    free(out);
    free(want);
    ch_reducer_free(r);
    plist_free(&p);
}

/* A bf16 stage (ch_reducer_set_stage_bf16): in bf16 it gets the bf16
 * rounding of the sum of the bf16-rounded values, bit for bit, and what it
 * leaves (here each value doubled, exact in bf16) is in every buffer; the
 * f32 stage beside it is not called in bf16, and is again in f32. */
typedef struct stage16_probe {
    const float *want; /* the bf16 total, widened */
    int calls, exact, fail;
    int64_t count;     /* the elements it has been given, its pieces in order */
} stage16_probe;

static ch_status probe_stage16(void *user, uint16_t *total, int64_t count)
{
    stage16_probe *p = user;
    p->calls++;
    if (p->fail)
        return chi_error(CH_ERR_REMOTE, "the bf16 stage failed on purpose");
    const float *want = p->want + p->count;
    p->count += count;
    for (int64_t k = 0; k < count; k++) {
        uint32_t u = (uint32_t)total[k] << 16, w;
        memcpy(&w, &want[k], sizeof w);
        p->exact = p->exact && u == w;
        float f;
        memcpy(&f, &u, sizeof f);
        f *= 2.0f;
        memcpy(&u, &f, sizeof u);
        total[k] = (uint16_t)(u >> 16);
    }
    return CH_OK;
}

static void stage16_case(const char *const *names, int n, ch_reduce_mode mode, int64_t total)
{
    plist p;
    if (!plist_of(&p, names, n, "bf16 stage"))
        return;
    const char *mode_name = ch_reduce_mode_name(mode);
    const int64_t off = 7, count = total - 10;
    ch_reducer *r = NULL;
    ch_tensor *t[MAXP] = {0};
    float *in[MAXP] = {0}, *out = malloc(sizeof(float) * total),
          *want = malloc(sizeof(float) * count);
    ch_status st = out && want ? ch_reducer_new(&r, p.stream, n, count, mode)
                               : CH_ERR_OUT_OF_MEMORY;
    if (st == CH_ERR_UNSUPPORTED) { /* peer over backends that cannot */
        free(out);
        free(want);
        plist_free(&p);
        return;
    }
    tap_rng rng = {43};
    if (st == CH_OK)
        st = random_buffers(&p, n, total, &rng, in, t);
    /* Peer groups sum in f32 first (in participant order), the host rounds
     * each group's sum to bf16 and adds them in f32 in group order. */
    int groups = st == CH_OK ? ch_reducer_group_count(r) : 0;
    for (int k = 0; st == CH_OK && k < count; k++) {
        float acc = 0.0f;
        for (int g = 0; g < groups; g++) {
            float sum = 0.0f;
            int first = 1;
            for (int i = 0; i < n; i++)
                if (ch_reducer_group(r, i) == g) {
                    sum = first ? in[i][off + k] : sum + in[i][off + k];
                    first = 0;
                }
            acc = g == 0 ? bf16_round(sum) : acc + bf16_round(sum);
        }
        want[k] = bf16_round(acc);
    }
    stage_probe probe32 = {0};
    stage16_probe probe = {want, 0, 1, 0, 0};
    if (st == CH_OK)
        st = ch_reducer_set_stage(r, probe_stage, &probe32);
    if (st == CH_OK)
        st = ch_reducer_set_stage_bf16(r, probe_stage16, &probe);
    if (st == CH_OK)
        st = ch_reducer_set_dtype(r, CH_BF16);
    if (st == CH_OK)
        st = ch_reducer_allreduce(r, t, off, count);
    int same = 1;
    for (int i = 0; i < n && st == CH_OK; i++) {
        st = ch_tensor_download(t[i], out, sizeof(float) * total);
        for (int k = 0; st == CH_OK && k < total; k++)
            same = same && (k >= off && k < off + count ? out[k] == 2.0f * want[k - off]
                                                         : out[k] == in[i][k]);
    }
    if (tap_status_ok(st, "bf16 stage over {%s}, %s: allreduce", p.label, mode_name))
        tap_ok(probe.calls == (count + (1 << 20) - 1) / (1 << 20) && probe.count == count &&
                   probe.exact && probe32.calls == 0 && same,
               "bf16 stage over {%s}, %s: called with the %lld-element bf16 total bit for bit "
               "(%s), in %d piece%s of up to 2^20, the f32 stage not at all (%d), what it left "
               "in every buffer", p.label, mode_name, (long long)probe.count,
               probe.exact ? "yes" : "no", probe.calls, probe.calls == 1 ? "" : "s",
               probe32.calls);
    probe.fail = 1;
    if (st == CH_OK)
        tap_status_is(ch_reducer_allreduce(r, t, 0, 10), CH_ERR_REMOTE, "bf16 stage failed on",
                      "bf16 stage over {%s}, %s: its failure is the call's", p.label, mode_name);
    if (st == CH_OK) {
        int calls = probe.calls;
        st = ch_reducer_set_dtype(r, CH_F32);
        static const double zeros[10];
        probe32.want = zeros;
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, t, 0, 10);
        tap_ok(st == CH_OK && probe.calls == calls && probe32.calls == 1,
               "bf16 stage over {%s}, %s: back in f32 the f32 stage runs (%d), the bf16 one "
               "not", p.label, mode_name, probe32.calls);
    }
    free_buffers(n, in, t);
    free(out);
    free(want);
    ch_reducer_free(r);
    plist_free(&p);
}

static void test_bf16(void)
{
    static const char *const hosts[] = {"host", "host", "host"},
                             *const mixed[] = {"host", "peer:0", "peer:1"},
                             *const ocl[] = {"peer:0", "peer:1"},
                             *const vendors[] = {"host", "cross:0", "cross:1"},
                             *const gpu[] = {"cuda:0", "host"};
    bf16_case(hosts, 3, 1000, 10, 900);
    bf16_case(mixed, 3, 1000, 10, 900);
    bf16_case(vendors, 3, 1000, 10, 900);
    bf16_case(mixed, 3, 70001, 3, 69990); /* several chunks, in parallel */
    bf16_case(ocl, 2, 5000, 0, 5000);
    bf16_case(gpu, 2, 5000, 7, 4000);
    static const char *const one[] = {"host"};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        stage16_case(one, 1, modes[m], 40000);
        stage16_case(hosts, 3, modes[m], 40000);
        stage16_case(mixed, 3, modes[m], 40000);
        stage16_case(ocl, 2, modes[m], 40000);
        stage16_case(vendors, 3, modes[m], 40000);
        stage16_case(gpu, 2, modes[m], 40000);
    }
    /* Past one piece: 2^21 + 3 elements go in three. */
    stage16_case(mixed, 3, CH_REDUCE_HOST, ((int64_t)1 << 21) + 13);
    ch_device *host;
    ch_stream *s[1];
    ch_reducer *r = NULL;
    if (ch_device_by_name(&host, "host") == CH_OK && ch_stream_new(&s[0], host) == CH_OK) {
        if (ch_reducer_new(&r, s, 1, 16, CH_REDUCE_HOST) == CH_OK) {
            tap_status_is(ch_reducer_set_dtype(r, CH_F16), CH_ERR_DTYPE, "expected f32 or bf16",
                          "ch_reducer_set_dtype(f16) is refused");
            ch_reducer_free(r);
        }
        ch_stream_free(s[0]);
    }
    tap_status_is(ch_reducer_set_dtype(NULL, CH_BF16), CH_ERR_INVALID_ARGUMENT, "r is NULL",
                  "ch_reducer_set_dtype(NULL)");
    tap_status_is(ch_reducer_set_stage_bf16(NULL, probe_stage16, NULL), CH_ERR_INVALID_ARGUMENT,
                  "r is NULL", "ch_reducer_set_stage_bf16(NULL)");
}

/* ---- across processes without the host (NCCL) ---------------------------- */

static void test_span(void)
{
    ch_device *host, *cuda;
    ch_stream *s[2];
    ch_reducer *r = NULL;
    unsigned char id[512];
    ch_status st = ch_device_by_name(&host, "host");
    if (st == CH_OK)
        st = ch_device_default_stream(&s[0], host);
    if (st == CH_OK)
        st = ch_stream_new(&s[1], host);
    if (st == CH_OK)
        st = ch_reducer_new(&r, s, 2, 16, CH_REDUCE_AUTO);
    if (!tap_status_ok(st, "span: a reducer over host,host"))
        return;
    tap_ok(ch_reducer_span_bytes(r) == 0 && !ch_reducer_spans(r),
           "span: host participants cannot span processes (%zu bytes)",
           ch_reducer_span_bytes(r));
    tap_status_is(ch_reducer_span_id(r, id), CH_ERR_UNSUPPORTED, "cannot reduce across",
                  "span: ch_reducer_span_id over host participants");
    tap_status_is(ch_reducer_span(r, id, 0, 2), CH_ERR_UNSUPPORTED, "cannot reduce across",
                  "span: ch_reducer_span over host participants");
    tap_status_is(ch_reducer_span(NULL, id, 0, 2), CH_ERR_INVALID_ARGUMENT, "r is NULL",
                  "span: ch_reducer_span(NULL)");
    tap_status_is(ch_reducer_span_id(r, NULL), CH_ERR_INVALID_ARGUMENT, "id is NULL",
                  "span: ch_reducer_span_id without an id");
    tap_ok(ch_reducer_span_bytes(NULL) == 0 && !ch_reducer_spans(NULL),
           "span: a NULL reducer cannot span");
    ch_reducer_free(r);
    ch_stream_free(s[1]);
    r = NULL;

    /* CUDA with NCCL: a job of one process and one device, which NCCL can
     * make here; the sum over one participant leaves the buffer. */
    if (ch_device_by_name(&cuda, "cuda:0") != CH_OK) {
        tap_skip("span: no cuda:0 here: NCCL's communicator across processes not tried");
        return;
    }
    st = ch_stream_new(&s[0], cuda);
    if (st == CH_OK)
        st = ch_reducer_new(&r, s, 1, 1000, CH_REDUCE_HOST);
    if (st == CH_OK)
        tap_ok(ch_reducer_span_bytes(r) == 0, "span: host mode never spans, even on cuda:0");
    ch_reducer_free(r);
    r = NULL;
    if (st == CH_OK)
        st = ch_reducer_new(&r, s, 1, 1000, CH_REDUCE_PEER);
    size_t bytes = st == CH_OK ? ch_reducer_span_bytes(r) : 0;
    if (st == CH_OK && bytes == 0) {
        tap_skip("span: the CUDA module has no NCCL: spanning processes not tried");
    } else if (tap_status_ok(st, "span: a peer reducer on cuda:0") &&
               tap_ok(bytes > 0 && bytes <= sizeof id, "span: an id of %zu bytes", bytes)) {
        int64_t n = 1000;
        float in[1000], out[1000];
        for (int i = 0; i < 1000; i++)
            in[i] = (float)i - 300.5f;
        ch_tensor *t = NULL;
        st = ch_reducer_span_id(r, id);
        if (st == CH_OK)
            tap_status_is(ch_reducer_span(r, id, 1, 1), CH_ERR_INVALID_ARGUMENT,
                          "expected 0 <= first", "span: participant 1 of a job of 1");
        if (st == CH_OK)
            st = ch_reducer_span(r, id, 0, 1);
        if (st == CH_OK)
            st = ch_tensor_new(&t, cuda, CH_F32, 1, &n);
        if (st == CH_OK)
            st = ch_tensor_upload(t, in, sizeof in);
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, &t, 0, n);
        if (st == CH_OK)
            st = ch_tensor_download(t, out, sizeof out);
        if (tap_status_ok(st, "span: NCCL over a job of one process, one device"))
            tap_ok(ch_reducer_spans(r) && memcmp(in, out, sizeof in) == 0,
                   "span: the sum over one participant is the buffer itself");
        tap_status_is(ch_reducer_span(r, id, 0, 1), CH_ERR_STATE, "already",
                      "span: a second ch_reducer_span");
        ch_tensor_free(t);
    }
    ch_reducer_free(r);
    ch_stream_free(s[0]);
}

/* ---- argument errors --------------------------------------------------- */

static void test_errors(void)
{
    ch_reduce_mode mode = CH_REDUCE_AUTO;
    tap_ok(strcmp(ch_reduce_mode_name(CH_REDUCE_HOST), "host") == 0 &&
               strcmp(ch_reduce_mode_name(CH_REDUCE_PEER), "peer") == 0 &&
               strcmp(ch_reduce_mode_name(CH_REDUCE_AUTO), "auto") == 0 &&
               strcmp(ch_reduce_mode_name((ch_reduce_mode)9), "?") == 0,
           "ch_reduce_mode_name: host, peer, auto, ? for anything else");
    int parsed = 1;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++)
        parsed &= ch_reduce_mode_parse(&mode, ch_reduce_mode_name(modes[m])) == CH_OK &&
                  mode == modes[m];
    tap_ok(parsed, "ch_reduce_mode_parse: the names back to the modes");
    tap_status_is(ch_reduce_mode_parse(&mode, "nccl"), CH_ERR_INVALID_ARGUMENT,
                  "host, peer or auto", "ch_reduce_mode_parse(\"nccl\") names the words");
    tap_status_is(ch_reduce_mode_parse(&mode, NULL), CH_ERR_INVALID_ARGUMENT, "name is NULL",
                  "ch_reduce_mode_parse: NULL name");
    tap_status_is(ch_reduce_mode_parse(NULL, "host"), CH_ERR_INVALID_ARGUMENT, "mode is NULL",
                  "ch_reduce_mode_parse: NULL mode");

    ch_device *host;
    ch_stream *s[3] = {NULL, NULL, NULL};
    ch_reducer *r = (ch_reducer *)&mode;
    ch_status st = ch_device_by_name(&host, "host");
    for (int i = 0; i < 3 && st == CH_OK; i++)
        st = ch_stream_new(&s[i], host);
    if (!tap_status_ok(st, "three host streams"))
        return;
    ch_stream *with_null[2] = {s[0], NULL};
    tap_status_is(ch_reducer_new(NULL, s, 2, 8, CH_REDUCE_HOST), CH_ERR_INVALID_ARGUMENT,
                  "ch_reducer_new: out is NULL", "ch_reducer_new: NULL out");
    tap_status_is(ch_reducer_new(&r, NULL, 2, 8, CH_REDUCE_HOST), CH_ERR_INVALID_ARGUMENT,
                  "ch_reducer_new: streams is NULL", "ch_reducer_new: NULL streams");
    tap_ok(r == NULL, "ch_reducer_new: *out is NULL after a failure");
    tap_status_is(ch_reducer_new(&r, s, 0, 8, CH_REDUCE_HOST), CH_ERR_INVALID_ARGUMENT,
                  "n is 0", "ch_reducer_new: n 0");
    tap_status_is(ch_reducer_new(&r, with_null, 2, 8, CH_REDUCE_HOST), CH_ERR_INVALID_ARGUMENT,
                  "streams[1] is NULL", "ch_reducer_new: NULL streams[1]");
    tap_status_is(ch_reducer_new(&r, s, 2, -1, CH_REDUCE_HOST), CH_ERR_INVALID_ARGUMENT,
                  "capacity is -1", "ch_reducer_new: capacity -1");
    tap_status_is(ch_reducer_new(&r, s, 2, 8, (ch_reduce_mode)7), CH_ERR_INVALID_ARGUMENT,
                  "mode 7", "ch_reducer_new: mode 7");

    ch_reducer_free(NULL);
    tap_ok(ch_reducer_group_count(NULL) == 0 && ch_reducer_group(NULL, 0) == -1,
           "ch_reducer_free(NULL) is a no-op; NULL has no groups");

    st = ch_reducer_new(&r, s, 2, 100, CH_REDUCE_HOST);
    if (!tap_status_ok(st, "a host reducer over two streams, capacity 100"))
        goto out;
    ch_tensor *a = NULL, *b = NULL, *small = NULL, *ints = NULL, *far = NULL;
    int64_t len = 100, short_len = 50;
    st = ch_tensor_new(&a, host, CH_F32, 1, &len);
    if (st == CH_OK)
        st = ch_tensor_new(&b, host, CH_F32, 1, &len);
    if (st == CH_OK)
        st = ch_tensor_new(&small, host, CH_F32, 1, &short_len);
    if (st == CH_OK)
        st = ch_tensor_new(&ints, host, CH_I32, 1, &len);
    if (tap_status_ok(st, "buffers for the argument checks")) {
        ch_tensor *ok[2] = {a, b}, *null1[2] = {a, NULL}, *i32[2] = {a, ints},
                  *short1[2] = {a, small};
        tap_status_is(ch_reducer_allreduce(NULL, ok, 0, 10), CH_ERR_INVALID_ARGUMENT,
                      "r is NULL", "ch_reducer_allreduce: NULL r");
        tap_status_is(ch_reducer_allreduce(r, NULL, 0, 10), CH_ERR_INVALID_ARGUMENT,
                      "bufs is NULL", "ch_reducer_allreduce: NULL bufs");
        tap_status_is(ch_reducer_allreduce(r, null1, 0, 10), CH_ERR_INVALID_ARGUMENT,
                      "bufs[1] is NULL", "ch_reducer_allreduce: NULL bufs[1]");
        tap_status_is(ch_reducer_allreduce(r, i32, 0, 10), CH_ERR_DTYPE,
                      "bufs[1] is i32, expected f32", "ch_reducer_allreduce: i32 bufs[1]");
        tap_status_is(ch_reducer_allreduce(r, ok, -1, 10), CH_ERR_INVALID_ARGUMENT,
                      "offset is -1", "ch_reducer_allreduce: offset -1");
        tap_status_is(ch_reducer_allreduce(r, ok, 0, -1), CH_ERR_INVALID_ARGUMENT,
                      "count is -1", "ch_reducer_allreduce: count -1");
        tap_status_is(ch_reducer_allreduce(r, ok, 0, 101), CH_ERR_INVALID_ARGUMENT,
                      "capacity of 100", "ch_reducer_allreduce: count beyond the capacity");
        tap_status_is(ch_reducer_allreduce(r, short1, 40, 20), CH_ERR_SHAPE,
                      "bufs[1] holds 50 elements", "ch_reducer_allreduce: bufs[1] too short");
        tap_status_is(ch_reducer_allreduce(r, ok, 90, 20), CH_ERR_SHAPE,
                      "bufs[0] holds 100 elements",
                      "ch_reducer_allreduce: offset + count beyond the buffers");
        tap_status_is(ch_reducer_allreduce(r, ok, INT64_MAX, 1), CH_ERR_SHAPE,
                      "bufs[0] holds 100 elements",
                      "ch_reducer_allreduce: an offset that would overflow");
        ch_device *other = NULL;
        if (ch_device_by_name(&other, "opencl:0") == CH_OK &&
            ch_tensor_new(&far, other, CH_F32, 1, &len) == CH_OK) {
            ch_tensor *mixed[2] = {a, far};
            tap_status_is(ch_reducer_allreduce(r, mixed, 0, 10), CH_ERR_DEVICE_MISMATCH,
                          "bufs[1] is on opencl:0 but streams[1] is on host",
                          "ch_reducer_allreduce: bufs[1] on another device than streams[1]");
        } else {
            tap_skip("device mismatch: no opencl:0 to put a buffer on");
        }
    }
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_tensor_free(small);
    ch_tensor_free(ints);
    ch_tensor_free(far);
    ch_reducer_free(r);

    /* capacity 0: only count 0 goes. */
    st = ch_reducer_new(&r, s, 3, 0, CH_REDUCE_HOST);
    if (tap_status_ok(st, "a host reducer of capacity 0")) {
        ch_tensor *t[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3 && st == CH_OK; i++)
            st = ch_tensor_new(&t[i], host, CH_F32, 1, &len);
        if (st == CH_OK)
            st = ch_reducer_allreduce(r, t, 5, 0);
        tap_status_ok(st, "capacity 0: count 0 is a no-op");
        tap_status_is(ch_reducer_allreduce(r, t, 0, 1), CH_ERR_INVALID_ARGUMENT, "capacity",
                      "capacity 0: count 1 is refused");
        for (int i = 0; i < 3; i++)
            ch_tensor_free(t[i]);
        ch_reducer_free(r);
    }
out:
    for (int i = 0; i < 3; i++)
        ch_stream_free(s[i]);
}

/* ch_reducer_reduce_scatter through the host in f32: each device
 * participant ends with the sum in its window and its own values
 * elsewhere (only its window was uploaded); a host participant with at
 * least its window; the sums are the all-reduce's bits. Windows outside
 * the call are refused. */
static void scatter_case(const char *const *names, int n, ch_reduce_mode mode)
{
    plist p;
    if (!plist_of(&p, names, n, "reduce-scatter"))
        return;
    enum { TOTAL = 3000, OFF = 100, COUNT = 2500 };
    tap_rng rng = {41};
    float *in[MAXP] = {NULL}, *got = malloc(sizeof(float) * TOTAL);
    ch_tensor *t[MAXP] = {NULL}, *u[MAXP] = {NULL};
    ch_reducer *r = NULL;
    ch_status st = random_buffers(&p, n, TOTAL, &rng, in, t);
    for (int i = 0; st == CH_OK && i < n; i++) {
        int64_t total = TOTAL;
        st = ch_tensor_new(&u[i], p.dev[i], CH_F32, 1, &total);
        if (st == CH_OK)
            st = ch_tensor_upload(u[i], in[i], sizeof(float) * TOTAL);
    }
    if (st == CH_OK)
        st = ch_reducer_new(&r, p.stream, n, COUNT, mode);
    /* Windows one after another, the last one empty. */
    int64_t first[MAXP], count[MAXP];
    for (int i = 0; i < n; i++) {
        first[i] = i == n - 1 ? COUNT : (int64_t)COUNT * i / (n - 1);
        count[i] = i == n - 1 ? 0 : (int64_t)COUNT * (i + 1) / (n - 1) - first[i];
    }
    if (st == CH_OK)
        st = ch_reducer_allreduce(r, u, OFF, COUNT);
    if (st == CH_OK)
        st = ch_reducer_reduce_scatter(r, t, OFF, COUNT, first, count);
    int good = st == CH_OK;
    float *sum = malloc(sizeof(float) * TOTAL);
    for (int i = 0; good && i < n; i++) {
        good = ch_tensor_download(u[i], sum, sizeof(float) * TOTAL) == CH_OK &&
               ch_tensor_download(t[i], got, sizeof(float) * TOTAL) == CH_OK;
        int host = strcmp(ch_device_id(p.dev[i]), "host") == 0;
        for (int64_t k = 0; good && k < TOTAL; k++) {
            int in_call = k >= OFF && k < OFF + COUNT;
            int mine = k >= OFF + first[i] && k < OFF + first[i] + count[i];
            float want = mine ? sum[k] : !in_call ? in[i][k] : host ? got[k] : in[i][k];
            if (!mine && in_call && host && got[k] != sum[k] && got[k] != in[i][k])
                good = 0;
            if (memcmp(&got[k], &want, sizeof want) != 0)
                good = 0;
        }
    }
    tap_ok(good, "reduce-scatter over %s (%s): each device's window holds the all-reduce's sum, "
           "its other elements its own values", p.label, ch_reduce_mode_name(mode));
    int64_t bad_first[MAXP], bad_count[MAXP];
    memcpy(bad_first, first, sizeof bad_first);
    memcpy(bad_count, count, sizeof bad_count);
    bad_count[0] = COUNT + 1;
    if (r)
        tap_status_is(ch_reducer_reduce_scatter(r, t, OFF, COUNT, bad_first, bad_count),
                      CH_ERR_INVALID_ARGUMENT, "window", "a window past the call's elements");
    if (r)
        tap_status_is(ch_reducer_reduce_scatter(r, t, OFF, COUNT, NULL, count),
                      CH_ERR_INVALID_ARGUMENT, "first", "reduce-scatter without windows");
    ch_reducer_free(r);
    free_buffers(n, in, t);
    for (int i = 0; i < n; i++)
        ch_tensor_free(u[i]);
    free(got);
    free(sum);
    plist_free(&p);
}

static void test_scatter(void)
{
    const char *three[3] = {"host", "ocl:0", "ocl:1"};
    scatter_case(three, 3, CH_REDUCE_HOST);
    const char *cross[3] = {"cross:0", "cross:1", "host"};
    scatter_case(cross, 3, CH_REDUCE_AUTO);
}

int main(void)
{
    /* Before ch_init there are no devices to reduce on. */
    ch_reducer *early = NULL;
    ch_stream *none[1] = {NULL};
    tap_status_is(ch_reducer_new(&early, none, 1, 4, CH_REDUCE_HOST), CH_ERR_STATE, "ch_init",
                  "ch_reducer_new before ch_init");
    ch_status st = ch_init();
    if (st != CH_OK) {
        tap_status_ok(st, "ch_init");
        return tap_done();
    }
    char devs[256] = "";
    for (int i = 0; i < ch_device_count(); i++) {
        ch_device *d;
        if (ch_device_get(&d, i) == CH_OK) {
            size_t len = strlen(devs);
            snprintf(devs + len, sizeof devs - len, "%s%s", i ? " " : "", ch_device_id(d));
        }
    }
    tap_diag("devices: %s", devs);
    find_symbolic();
    test_errors();
    test_single();
    test_stage();
    test_bf16();
    test_scatter();
    test_span();
    test_auto_groups();
    test_many_host();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        run_case(&cases[c]);
    run_env_case();
    ch_shutdown();
    return tap_done();
}
