/* Fault injection (a build configured --enable-fault-injection; lib/fault.h):
 * the Nth allocation point of an operation fails, for every N the operation
 * has, in a fresh state each time: host malloc/calloc/realloc/strdup/
 * posix_memalign inside the library, device and pinned allocations, stream,
 * event and span creation, device opening. The operations: ch_init; making
 * the cnn and moving it to a device; a training step on one device, in f32
 * and in mixed precision (bf16: the half GEMMs and convolutions, the host's
 * own and the core's widened ones on opencl:0); a data-parallel step over host, opencl:0 and opencl:1; a checkpoint save
 * and load. Each failure must come back as a status with a message (or be
 * absorbed, the operation succeeding), leave the objects usable (the same
 * operation succeeds next, a data-parallel model's replicas stay equal) or
 * at least freeable, and block no thread (a watchdog ends the test). Under
 * --enable-sanitizers, LeakSanitizer checks that nothing leaked after each
 * walk.
 *
 * Then the checkpoint's writes: every write and fsync of a save failing
 * with ENOSPC, EIO or a short write (a disk filling up), and every read of
 * a load failing or coming up short: the save fails with CH_ERR_IO naming
 * the file, the previous checkpoint is intact byte for byte and no
 * temporary file stays; the load fails, and the model loads afterwards. */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../nn/nn.h" /* chi_dp_lose */
#include "tap.h"
#include "error.h" /* chi_error */
/* The counters alone, not the macros that count the library's calls. */
#define CHI_FAULT_IMPL 1
#include "fault.h"

#if defined(__has_include)
#if __has_include(<sanitizer/lsan_interface.h>) && defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define HAVE_LSAN 1
#endif
#endif

enum { BATCH = 24, WATCHDOG_SECONDS = 120 };

/* Which walks this program makes: built twice (tests/Makefile.mk), so that
 * make check runs the data-parallel walks, half of the time under ASan,
 * beside the others: 1 all but the data-parallel ones (test-fault), 2
 * those alone (test-fault-dp), 0 all. */
#ifndef TEST_FAULT_PART
#define TEST_FAULT_PART 0
#endif
enum {
    PART = TEST_FAULT_PART
};

static ch_device *host, *ocl0, *ocl1;
static char tmpdir[256];

/* ---- The watchdog: a blocked thread never returns the operation --------- */

static volatile sig_atomic_t watch_n;
static const char *volatile watch_op = "";

static void watchdog(int sig)
{
    (void)sig;
    char msg[256];
    int len = snprintf(msg, sizeof msg,
                       "Bail out! %s with point %ld failing did not return in %d s "
                       "(a thread blocked)\n",
                       watch_op, (long)watch_n, WATCHDOG_SECONDS);
    if (len > 0 && write(STDOUT_FILENO, msg, (size_t)len) < 0)
        _exit(3);
    _exit(3);
}

/* ---- A walk --------------------------------------------------------------- */

typedef struct walk_ops {
    const char *name;
    void (*setup)(void *ctx);                  /* fresh state, nothing failing */
    ch_status (*run)(void *ctx);               /* the operation walked over */
    /* After run, nothing failing: 0 when the objects are usable (or were
     * freeable, when usability is not asked), else a line saying why not. */
    int (*after)(void *ctx, ch_status st, char *why, size_t cap);
    void (*teardown)(void *ctx);               /* free everything */
} walk_ops;

/* Walk N = 1, 2, ... until the operation passes with nothing failing. One
 * TAP line for the whole walk, with the first problems as diagnostics. */
static void walk(const walk_ops *w, void *ctx, chi_fault_kind kind, int mode)
{
    long points = 0, reported = 0, absorbed = 0, problems = 0;
    watch_op = w->name;
    /* To look into one walk: CHORUS_FAULT_ONLY=part of its name, and
     * CHORUS_FAULT_FROM=N to start there (with CHORUS_FAULT_BACKTRACE=1,
     * lib/fault.c prints where each failing point was called from). */
    const char *only = getenv("CHORUS_FAULT_ONLY"), *from = getenv("CHORUS_FAULT_FROM");
    if (only && !strstr(w->name, only)) {
        tap_skip("%s: not the walk CHORUS_FAULT_ONLY names", w->name);
        return;
    }
    for (long n = from ? atol(from) : 1;; n++) {
        w->setup(ctx);
        ch_clear_error();
        watch_n = n;
        alarm(WATCHDOG_SECONDS);
        chi_fault_arm(kind, n, mode);
        ch_status st = w->run(ctx);
        const char *where = "";
        int fired = chi_fault_fired(kind, &where);
        char at[256];
        snprintf(at, sizeof at, "%s", where);
        chi_fault_arm(kind, 0, 0);
        char why[512] = "";
        if (!fired) {
            points = n - 1;
            if (st != CH_OK) {
                problems++;
                tap_diag("%s: fails with nothing injected: %s", w->name, ch_last_error());
            }
            if (w->after(ctx, st, why, sizeof why) != 0) {
                problems++;
                tap_diag("%s: %s", w->name, why);
            }
            w->teardown(ctx);
            alarm(0);
            break;
        }
        if (st != CH_OK) {
            reported++;
            const char *msg = ch_last_error();
            if (!msg || !*msg) {
                if (problems++ < 10)
                    tap_diag("%s: point %ld, %s, failing gave status %d without a message",
                             w->name, n, at, (int)st);
            }
        } else {
            absorbed++;
        }
        if (w->after(ctx, st, why, sizeof why) != 0 && problems++ < 10)
            tap_diag("%s: after point %ld, %s, failed (status %d: %s): %s", w->name, n, at,
                     (int)st, st != CH_OK ? ch_last_error() : "absorbed", why);
        w->teardown(ctx);
        alarm(0);
    }
    long leaks = 0;
#ifdef HAVE_LSAN
    leaks = __lsan_do_recoverable_leak_check();
#endif
    tap_ok(points > 0 && problems == 0 && leaks == 0,
           "%s: %ld %s points, each failing once: %ld reported with a message, "
           "%ld absorbed, %ld problems%s",
           w->name, points, kind == CHI_FAULT_IO ? "I/O" : "allocation", reported, absorbed,
           problems,
           leaks ? ", and LeakSanitizer found leaks" : "");
}

/* ---- ch_init --------------------------------------------------------------- */

static void nothing(void *ctx) { (void)ctx; }

static ch_status init_run(void *ctx)
{
    (void)ctx;
    return ch_init();
}

/* A failed ch_init leaves nothing initialised and can be called again. */
static int init_after(void *ctx, ch_status st, char *why, size_t cap)
{
    (void)ctx;
    if (st != CH_OK && ch_device_count() != 0) {
        snprintf(why, cap, "a failed ch_init left %d devices", ch_device_count());
        return 1;
    }
    ch_status again = ch_init();
    if (again != CH_OK) {
        snprintf(why, cap, "ch_init afterwards: %s", ch_last_error());
        return 1;
    }
    ch_device *d = NULL;
    if (ch_device_by_name(&d, "host") != CH_OK) {
        snprintf(why, cap, "no host device afterwards: %s", ch_last_error());
        return 1;
    }
    return 0;
}

static void init_teardown(void *ctx)
{
    (void)ctx;
    ch_shutdown();
}

/* ---- The cnn, made and moved ----------------------------------------------- */

typedef struct model_ctx {
    ch_device *dev;
    ch_module *m;
} model_ctx;

static void model_setup(void *ctx)
{
    model_ctx *c = ctx;
    c->m = NULL;
    ch_device_empty_cache(c->dev);
}

static ch_status model_run(void *ctx)
{
    model_ctx *c = ctx;
    ch_status st = ch_nn_preset(&c->m, "cnn");
    if (st == CH_OK)
        st = ch_module_init(c->m, 7);
    if (st == CH_OK)
        st = ch_module_to(c->m, c->dev);
    return st;
}

/* Usable: what was made moves to the device (again) and is there. */
static int model_after(void *ctx, ch_status st, char *why, size_t cap)
{
    model_ctx *c = ctx;
    if (!c->m) {
        if (st == CH_OK)
            snprintf(why, cap, "success without a model");
        return st == CH_OK;
    }
    if (ch_module_to(c->m, c->dev) != CH_OK) {
        snprintf(why, cap, "ch_module_to afterwards: %s", ch_last_error());
        return 1;
    }
    if (ch_module_device(c->m) != c->dev) {
        snprintf(why, cap, "the model is not on %s", ch_device_id(c->dev));
        return 1;
    }
    return 0;
}

static void model_teardown(void *ctx)
{
    model_ctx *c = ctx;
    ch_module_free(c->m);
    c->m = NULL;
}

/* ---- Fused attention on the host ------------------------------------------------- */

/* ch_attention and its backward over 3 matrices [70, 8] (two tiles of
 * queries), then ch_attention_packed and its backward on part of the same
 * memory: their tiles are the one allocation of their own. */
enum {
    ATT_B = 3,
    ATT_T = 70,
    ATT_HD = 8
};

typedef struct attn_ctx {
    ch_tensor *t[9]; /* q, k, v, dout, o, lse, dq, dk, dv */
} attn_ctx;

static void attn_setup(void *ctx)
{
    attn_ctx *c = ctx;
    int64_t shape[3] = {ATT_B, ATT_T, ATT_HD};
    for (int i = 0; i < 9; i++) {
        c->t[i] = NULL;
        if (ch_tensor_new(&c->t[i], host, CH_F32, i == 5 ? 2 : 3, shape) == CH_OK && i < 4)
            ch_rand_normal(c->t[i], 11, (uint64_t)i * 4096, 0.0f, 1.0f);
    }
}

static ch_status attn_run(void *ctx)
{
    attn_ctx *c = ctx;
    ch_tensor **t = c->t;
    float scale = 0.35f;
    ch_status st = ch_attention(t[4], t[5], t[0], t[1], t[2], scale);
    if (st == CH_OK)
        st = ch_attention_backward(t[6], t[7], t[8], t[3], t[0], t[1], t[2], t[4], t[5], scale);
    /* The packed layout on the same memory seen as [1, 70, 24] (q, k
     * and v of one head of 8 side by side) and o [1, 70, 8]. */
    ch_tensor *qkv = NULL, *o = NULL, *lse = NULL, *dqkv = NULL, *g = NULL;
    int64_t s3[3] = {1, ATT_T, 3 * ATT_HD}, sl[3] = {1, 1, ATT_T};
    if (st == CH_OK)
        st = ch_tensor_reshape(&qkv, t[0], 3, s3);
    if (st == CH_OK)
        st = ch_tensor_reshape(&dqkv, t[6], 3, s3);
    if (st == CH_OK)
        st = ch_tensor_view(&o, t[4], 0, 1);
    if (st == CH_OK)
        st = ch_tensor_view(&g, t[3], 0, 1);
    if (st == CH_OK) {
        ch_tensor *row = NULL;
        st = ch_tensor_view(&row, t[5], 0, 1);
        if (st == CH_OK)
            st = ch_tensor_reshape(&lse, row, 3, sl);
        ch_tensor_free(row);
    }
    if (st == CH_OK)
        st = ch_attention_packed(o, lse, qkv, 1, scale);
    if (st == CH_OK)
        st = ch_attention_packed_backward(dqkv, g, qkv, o, lse, 1, scale);
    ch_tensor_free(qkv);
    ch_tensor_free(o);
    ch_tensor_free(lse);
    ch_tensor_free(dqkv);
    ch_tensor_free(g);
    return st;
}

/* Usable: the same calls succeed afterwards, with finite results. */
static int attn_after(void *ctx, ch_status st, char *why, size_t cap)
{
    (void)st;
    attn_ctx *c = ctx;
    if (attn_run(ctx) != CH_OK) {
        snprintf(why, cap, "ch_attention afterwards: %s", ch_last_error());
        return 1;
    }
    static float dq[ATT_B * ATT_T * ATT_HD];
    if (ch_tensor_download(c->t[6], dq, sizeof dq) != CH_OK) {
        snprintf(why, cap, "dq: %s", ch_last_error());
        return 1;
    }
    for (size_t i = 0; i < sizeof dq / sizeof dq[0]; i++)
        if (!isfinite(dq[i])) {
            snprintf(why, cap, "dq[%zu] is %g", i, dq[i]);
            return 1;
        }
    return 0;
}

static void attn_teardown(void *ctx)
{
    attn_ctx *c = ctx;
    for (int i = 0; i < 9; i++) {
        ch_tensor_free(c->t[i]);
        c->t[i] = NULL;
    }
}

/* ---- One training step on one device ---------------------------------------- */

static float images[BATCH * 784];
static int32_t labels[BATCH];

static void make_data(void)
{
    tap_rng rng = {3};
    for (int i = 0; i < BATCH * 784; i++)
        images[i] = tap_rng_uniform(&rng, -1, 1);
    for (int i = 0; i < BATCH; i++) {
        labels[i] = (int32_t)(tap_rng_next(&rng) % 10);
        for (int j = 0; j < 28; j++)
            images[i * 784 + labels[i] * 28 + j] += 1.5f;
    }
}

typedef struct step_ctx {
    ch_device *dev;
    ch_dtype precision;
    ch_module *m;
    ch_optimizer *opt;
    ch_loss *loss;
    ch_tensor *x, *labels;
} step_ctx;

/* A fresh model, optimizer and loss on an emptied cache: the first step
 * allocates everything a step needs. */
static void step_setup(void *ctx)
{
    step_ctx *c = ctx;
    ch_device_empty_cache(c->dev);
    int64_t xs[4] = {BATCH, 1, 28, 28}, ls[1] = {BATCH};
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f);
    if (ch_nn_preset(&c->m, "cnn") != CH_OK || ch_module_init(c->m, 7) != CH_OK ||
        ch_module_set_precision(c->m, c->precision) != CH_OK ||
        ch_module_to(c->m, c->dev) != CH_OK || ch_optimizer_new(&c->opt, c->m, &o) != CH_OK ||
        ch_loss_new(&c->loss, CH_LOSS_CROSS_ENTROPY) != CH_OK ||
        ch_tensor_new(&c->x, c->dev, CH_F32, 4, xs) != CH_OK ||
        ch_tensor_new(&c->labels, c->dev, CH_I32, 1, ls) != CH_OK ||
        ch_tensor_upload(c->x, images, sizeof images) != CH_OK ||
        ch_tensor_upload(c->labels, labels, sizeof labels) != CH_OK) {
        printf("Bail out! setting up a step on %s: %s\n", ch_device_id(c->dev), ch_last_error());
        exit(1);
    }
}

static ch_status step_run(void *ctx)
{
    step_ctx *c = ctx;
    ch_tensor *y = NULL, *value = NULL, *dy = NULL;
    ch_status st = ch_module_zero_grad(c->m);
    if (st == CH_OK)
        st = ch_module_forward(c->m, &y, c->x);
    if (st == CH_OK)
        st = ch_loss_forward(c->loss, &value, y, c->labels);
    if (st == CH_OK)
        st = ch_loss_backward(c->loss, &dy, 1.0f);
    if (st == CH_OK)
        st = ch_module_backward(c->m, NULL, dy);
    if (st == CH_OK)
        st = ch_optimizer_step(c->opt, 1e-3f);
    float v = NAN;
    if (st == CH_OK)
        st = ch_tensor_download(value, &v, sizeof v);
    if (st == CH_OK && !isfinite(v))
        st = chi_error(CH_ERR_INTERNAL, "the loss is %g", v);
    return st;
}

/* Usable: a whole step runs now. */
static int step_after(void *ctx, ch_status st, char *why, size_t cap)
{
    (void)st;
    if (step_run(ctx) != CH_OK) {
        snprintf(why, cap, "the next step: %s", ch_last_error());
        return 1;
    }
    return 0;
}

static void step_teardown(void *ctx)
{
    step_ctx *c = ctx;
    ch_tensor_free(c->x);
    ch_tensor_free(c->labels);
    ch_loss_free(c->loss);
    ch_optimizer_free(c->opt);
    ch_module_free(c->m);
    c->x = c->labels = NULL;
    c->loss = NULL;
    c->opt = NULL;
    c->m = NULL;
}

/* ---- A data-parallel step over host, opencl:0 and opencl:1 ------------------- */

typedef struct dp_ctx {
    ch_device *devs[3];
    ch_module *model;
    ch_dp *dp;
    ch_host_buffer *img, *lab;
    ch_batch batch;
} dp_ctx;

static void dp_setup(void *ctx)
{
    dp_ctx *c = ctx;
    for (int i = 0; i < 3; i++)
        ch_device_empty_cache(c->devs[i]);
    c->dp = NULL;
    if (ch_nn_preset(&c->model, "cnn") != CH_OK || ch_module_init(c->model, 3) != CH_OK) {
        printf("Bail out! the cnn: %s\n", ch_last_error());
        exit(1);
    }
}

static ch_status dp_run(void *ctx)
{
    dp_ctx *c = ctx;
    ch_dp_options o = tap_mnist_dp_options(5);
    float loss = NAN;
    ch_status st = ch_dp_new(&c->dp, c->model, c->devs, 3, &o);
    if (st == CH_OK)
        st = ch_dp_step(c->dp, &loss, &c->batch, 0.05f);
    return st;
}

/* The parameters of replica i, downloaded one after another. */
static float *replica_params(const ch_dp *dp, int i, int64_t *count)
{
    ch_module *r = ch_dp_replica(dp, i);
    int64_t total = ch_module_param_numel(r);
    float *all = malloc((size_t)total * sizeof *all);
    int64_t at = 0;
    for (int p = 0; all && p < ch_module_param_count(r); p++) {
        const char *name = NULL;
        ch_tensor *t = NULL, *g = NULL;
        if (ch_module_param(r, p, &name, &t, &g) != CH_OK ||
            ch_tensor_download(t, all + at, (size_t)ch_tensor_numel(t) * sizeof *all) != CH_OK) {
            free(all);
            return NULL;
        }
        at += ch_tensor_numel(t);
    }
    *count = total;
    return all;
}

/* Usable: the next step succeeds, and the replicas hold the same
 * parameters bit for bit (a step that failed halfway must not leave one
 * replica updated and another not). */
static int dp_after(void *ctx, ch_status st, char *why, size_t cap)
{
    dp_ctx *c = ctx;
    if (!c->dp) {
        if (st == CH_OK)
            snprintf(why, cap, "success without a dp");
        return st == CH_OK;
    }
    float loss = NAN;
    if (ch_dp_step(c->dp, &loss, &c->batch, 0.05f) != CH_OK) {
        snprintf(why, cap, "the next step: %s", ch_last_error());
        return 1;
    }
    int64_t n0 = 0, n = 0;
    float *p0 = replica_params(c->dp, 0, &n0);
    int bad = !p0;
    for (int i = 1; !bad && i < 3; i++) {
        float *p = replica_params(c->dp, i, &n);
        bad = !p || n != n0 || memcmp(p, p0, (size_t)n * sizeof *p) != 0;
        if (bad)
            snprintf(why, cap, "replica %d's parameters differ from replica 0's", i);
        free(p);
    }
    if (!p0)
        snprintf(why, cap, "reading replica 0: %s", ch_last_error());
    free(p0);
    return bad;
}

static void dp_teardown(void *ctx)
{
    dp_ctx *c = ctx;
    ch_dp_free(c->dp);
    ch_module_free(c->model);
    c->dp = NULL;
    c->model = NULL;
}

/* ---- A reducer's calls while a trace runs ----------------------------------------- */

/* The reducer's marks, made at its first traced call, with the recorder's
 * own allocations: after a failure, the next traced call still sums. */
#define RED_N 4096
typedef struct red_ctx {
    ch_device *devs[2];
    ch_stream *streams[2];
    ch_tensor *bufs[2];
    ch_reducer *r;
} red_ctx;

static void red_setup(void *ctx)
{
    red_ctx *c = ctx;
    int64_t n = RED_N;
    static float v[RED_N];
    for (int i = 0; i < 2; i++) {
        for (int64_t k = 0; k < n; k++)
            v[k] = (float)(i + 1);
        if (ch_stream_new(&c->streams[i], c->devs[i]) != CH_OK ||
            ch_tensor_new(&c->bufs[i], c->devs[i], CH_F32, 1, &n) != CH_OK ||
            ch_tensor_upload(c->bufs[i], v, sizeof v) != CH_OK) {
            printf("Bail out! the reducer's buffers: %s\n", ch_last_error());
            exit(1);
        }
    }
    if (ch_reducer_new(&c->r, c->streams, 2, n, CH_REDUCE_HOST) != CH_OK) {
        printf("Bail out! the reducer: %s\n", ch_last_error());
        exit(1);
    }
}

/* An all-reduce while a trace runs; the trace stopped after it. */
static ch_status red_run(void *ctx)
{
    red_ctx *c = ctx;
    char path[300];
    snprintf(path, sizeof path, "%s/reduce-trace.json", tmpdir);
    ch_status st = ch_trace_start(path, NULL);
    if (st == CH_OK)
        st = ch_reducer_allreduce(c->r, c->bufs, 0, RED_N);
    if (ch_trace_running()) {
        ch_status stop = ch_trace_stop();
        if (st == CH_OK)
            st = stop;
    }
    return st;
}

/* Usable: a second traced all-reduce works, and leaves both buffers with
 * one and the same sum in every element (a call that failed may have left
 * the buffers anywhere between their values and the sum). */
static int red_after(void *ctx, ch_status st, char *why, size_t cap)
{
    (void)st;
    red_ctx *c = ctx;
    if (red_run(c) != CH_OK) {
        snprintf(why, cap, "the next traced all-reduce: %s", ch_last_error());
        return 1;
    }
    static float a[RED_N], b[RED_N];
    if (ch_tensor_download(c->bufs[0], a, sizeof a) != CH_OK ||
        ch_tensor_download(c->bufs[1], b, sizeof b) != CH_OK) {
        snprintf(why, cap, "reading the sums: %s", ch_last_error());
        return 1;
    }
    for (int64_t k = 0; k < RED_N; k++)
        if (a[k] != b[k] || a[k] != a[0] || a[k] < 3.0f) {
            snprintf(why, cap, "element %lld: %g and %g, want both %g (at least 3)", (long long)k,
                     (double)a[k], (double)b[k], (double)a[0]);
            return 1;
        }
    return 0;
}

static void red_teardown(void *ctx)
{
    red_ctx *c = ctx;
    ch_reducer_free(c->r);
    for (int i = 0; i < 2; i++) {
        ch_tensor_free(c->bufs[i]);
        ch_stream_free(c->streams[i]);
        c->bufs[i] = NULL;
        c->streams[i] = NULL;
    }
    c->r = NULL;
}

/* ---- Elastic data parallelism: a device lost, then rejoining ------------------- */

/* An elastic dp over the three after one step, opencl:1 (devs[2]) to be
 * lost in backward of the next (removal), or already lost in the first
 * and answering again (rejoin). */
static void elastic_setup(dp_ctx *c, int rejoin)
{
    /* A linear model: the walks cover the removal and the rejoin, whose
     * points grow with the layers; the cnn's step is walked above. */
    for (int i = 0; i < 3; i++)
        ch_device_empty_cache(c->devs[i]);
    c->dp = NULL;
    ch_module *parts[2] = {NULL, NULL};
    ch_nn_flatten(&parts[0]);
    ch_nn_linear(&parts[1], 784, 10);
    c->model = tap_sequential(2, parts);
    if (!c->model || ch_module_init(c->model, 3) != CH_OK) {
        printf("Bail out! a linear model: %s\n", ch_last_error());
        exit(1);
    }
    ch_dp_options o = tap_mnist_dp_options(5);
    o.elastic = 1;
    o.elastic_timeout = 5.0;
    float loss = NAN;
    if (rejoin)
        chi_dp_lose(c->devs[2], 0, 1, 0);
    if (ch_dp_new(&c->dp, c->model, c->devs, 3, &o) != CH_OK ||
        ch_dp_step(c->dp, &loss, &c->batch, 0.05f) != CH_OK) {
        printf("Bail out! an elastic dp: %s\n", ch_last_error());
        exit(1);
    }
    if (rejoin)
        chi_dp_found(c->devs[2]);
    else
        chi_dp_lose(c->devs[2], 1, 2, 0);
}

static void remove_setup(void *ctx)
{
    elastic_setup(ctx, 0);
}

static void rejoin_setup(void *ctx)
{
    elastic_setup(ctx, 1);
}

static ch_status remove_run(void *ctx)
{
    dp_ctx *c = ctx;
    float loss = NAN;
    return ch_dp_step(c->dp, &loss, &c->batch, 0.05f);
}

static ch_status rejoin_run(void *ctx)
{
    dp_ctx *c = ctx;
    int back = 0;
    return ch_dp_rejoin(c->dp, &back);
}

/* Usable: the next step succeeds over the replicas there are (two, or
 * three after a rejoin that succeeded), which hold the same parameters. */
static int elastic_after(void *ctx, ch_status st, char *why, size_t cap)
{
    dp_ctx *c = ctx;
    (void)st;
    float loss = NAN;
    if (ch_dp_step(c->dp, &loss, &c->batch, 0.05f) != CH_OK) {
        snprintf(why, cap, "the next step: %s", ch_last_error());
        return 1;
    }
    int n = ch_dp_replica_count(c->dp);
    int64_t n0 = 0, k = 0;
    float *p0 = replica_params(c->dp, 0, &n0);
    int bad = !p0 || n < 2;
    if (n < 2)
        snprintf(why, cap, "%d replicas left", n);
    for (int i = 1; !bad && i < n; i++) {
        float *p = replica_params(c->dp, i, &k);
        bad = !p || k != n0 || memcmp(p, p0, (size_t)k * sizeof *p) != 0;
        if (bad)
            snprintf(why, cap, "replica %d's parameters differ from replica 0's", i);
        free(p);
    }
    free(p0);
    return bad;
}

static void elastic_teardown(void *ctx)
{
    dp_ctx *c = ctx;
    dp_teardown(c);
    chi_dp_found(c->devs[2]);
}

/* ---- Checkpoints ------------------------------------------------------------- */

typedef struct ckpt_ctx {
    ch_module *model, *other;
    ch_optimizer *opt, *other_opt;
    char path[512], tmp[520];
    unsigned char *previous; /* the file before the save */
    size_t previous_len;
    int saved;               /* the walked save succeeded: restore the previous file */
} ckpt_ctx;

static unsigned char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, n = 0;
    for (;;) {
        if (n == cap) {
            cap = cap ? 2 * cap : 1 << 16;
            unsigned char *grown = realloc(buf, cap);
            if (!grown) {
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    *len = n;
    return buf;
}

static const ch_train_state previous_state = {.epoch = 1, .step = 10, .seed = 1};
static const ch_train_state new_state = {.epoch = 2, .step = 20, .seed = 1};

static void ckpt_setup(void *ctx)
{
    ckpt_ctx *c = ctx;
    c->saved = 0;
}

static ch_status save_run(void *ctx)
{
    ckpt_ctx *c = ctx;
    ch_status st = ch_checkpoint_save(c->path, c->model, c->opt, &new_state);
    c->saved = st == CH_OK;
    return st;
}

/* A failed save leaves the previous file as it was and no temporary file;
 * a save that succeeded wrote a file that loads. */
static int save_after(void *ctx, ch_status st, char *why, size_t cap)
{
    ckpt_ctx *c = ctx;
    if (st == CH_OK) {
        ch_train_state s = {0};
        if (ch_checkpoint_load(c->path, c->other, c->other_opt, &s) != CH_OK || s.step != 20) {
            snprintf(why, cap, "the file saved does not load: %s", ch_last_error());
            return 1;
        }
        return 0;
    }
    if (st != CH_ERR_IO && st != CH_ERR_OUT_OF_MEMORY && st != CH_ERR_DEVICE_OUT_OF_MEMORY &&
        st != CH_ERR_DRIVER) {
        snprintf(why, cap, "status %d is not an I/O or memory error", (int)st);
        return 1;
    }
    size_t len = 0;
    unsigned char *now = slurp(c->path, &len);
    int same = now && len == c->previous_len && memcmp(now, c->previous, len) == 0;
    free(now);
    if (!same) {
        snprintf(why, cap, "the previous checkpoint changed");
        return 1;
    }
    if (access(c->tmp, F_OK) == 0) {
        snprintf(why, cap, "%s is left behind", c->tmp);
        return 1;
    }
    return 0;
}

static void save_teardown(void *ctx)
{
    ckpt_ctx *c = ctx;
    if (c->saved && ch_checkpoint_save(c->path, c->model, c->opt, &previous_state) != CH_OK) {
        printf("Bail out! restoring the previous checkpoint: %s\n", ch_last_error());
        exit(1);
    }
}

static ch_status load_run(void *ctx)
{
    ckpt_ctx *c = ctx;
    ch_train_state s = {0};
    ch_status st = ch_checkpoint_load(c->path, c->other, c->other_opt, &s);
    if (st == CH_OK && s.step != previous_state.step)
        st = chi_error(CH_ERR_INTERNAL, "loaded step %lld, saved %lld", (long long)s.step,
                       (long long)previous_state.step);
    return st;
}

/* Usable: the model loads now, and holds the saved parameters. */
static int load_after(void *ctx, ch_status st, char *why, size_t cap)
{
    ckpt_ctx *c = ctx;
    (void)st;
    if (load_run(ctx) != CH_OK) {
        snprintf(why, cap, "loading afterwards: %s", ch_last_error());
        return 1;
    }
    for (int p = 0; p < ch_module_param_count(c->model); p++) {
        const char *name = NULL;
        ch_tensor *a = NULL, *b = NULL, *g = NULL;
        ch_module_param(c->model, p, &name, &a, &g);
        ch_module_param(c->other, p, &name, &b, &g);
        size_t bytes = (size_t)ch_tensor_numel(a) * sizeof(float);
        float *x = malloc(bytes), *y = malloc(bytes);
        int same = x && y && ch_tensor_download(a, x, bytes) == CH_OK &&
                   ch_tensor_download(b, y, bytes) == CH_OK && memcmp(x, y, bytes) == 0;
        free(x);
        free(y);
        if (!same) {
            snprintf(why, cap, "parameter %s differs after loading", name);
            return 1;
        }
    }
    return 0;
}

static void ckpt_make(ckpt_ctx *c)
{
    snprintf(c->path, sizeof c->path, "%s/ckpt.safetensors", tmpdir);
    snprintf(c->tmp, sizeof c->tmp, "%s.tmp", c->path);
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAM, 1e-3f);
    step_ctx s = {.dev = host};
    step_setup(&s);
    if (step_run(&s) != CH_OK) {
        printf("Bail out! a step before the checkpoint: %s\n", ch_last_error());
        exit(1);
    }
    c->model = s.m;
    c->opt = s.opt;
    s.m = NULL;
    s.opt = NULL;
    step_teardown(&s);
    if (ch_nn_preset(&c->other, "cnn") != CH_OK || ch_optimizer_new(&c->other_opt, c->other, &o) ||
        ch_checkpoint_save(c->path, c->model, c->opt, &previous_state) != CH_OK ||
        !(c->previous = slurp(c->path, &c->previous_len))) {
        printf("Bail out! the first checkpoint: %s\n", ch_last_error());
        exit(1);
    }
}

static void ckpt_free(ckpt_ctx *c)
{
    ch_optimizer_free(c->opt);
    ch_optimizer_free(c->other_opt);
    ch_module_free(c->model);
    ch_module_free(c->other);
    free(c->previous);
    unlink(c->path);
}

/* ---- main ---------------------------------------------------------------------- */

int main(void)
{
    signal(SIGALRM, watchdog);
    snprintf(tmpdir, sizeof tmpdir, "%s/test-fault.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(tmpdir)) {
        printf("Bail out! mkdtemp %s: %s\n", tmpdir, strerror(errno));
        return 1;
    }
    make_data();

    /* The counter counts, and an armed point fails the call it is in. */
    if (PART != 2) {
        chi_fault_arm(CHI_FAULT_ALLOC, 0, 0);
        tap_status_ok(ch_init(), "ch_init, counting");
        long init_points = chi_fault_count(CHI_FAULT_ALLOC);
        tap_ok(init_points > 10, "ch_init passes %ld allocation points", init_points);
        ch_shutdown();

        walk(&(walk_ops){"ch_init", nothing, init_run, init_after, init_teardown}, NULL,
             CHI_FAULT_ALLOC, 0);
    }

    if (!tap_status_ok(ch_init(), "ch_init"))
        return tap_done();
    ch_device_by_name(&host, "host");
    ch_device_by_name(&ocl0, "opencl:0");
    ch_device_by_name(&ocl1, "opencl:1");
    ch_clear_error();

    ch_device *targets[2] = {host, ocl0};
    for (int i = 0; PART != 2 && i < 2; i++) {
        if (!targets[i]) {
            tap_skip("no opencl:0 here (PoCL with POCL_DEVICES=\"pthread pthread\" gives it)");
            tap_skip("no opencl:0 here");
            tap_skip("no opencl:0 here");
            continue;
        }
        char name[3][64];
        snprintf(name[0], sizeof name[0], "the cnn made and moved to %s", ch_device_id(targets[i]));
        snprintf(name[1], sizeof name[1], "a training step on %s", ch_device_id(targets[i]));
        snprintf(name[2], sizeof name[2], "a bf16 mixed-precision training step on %s",
                 ch_device_id(targets[i]));
        model_ctx m = {.dev = targets[i]};
        walk(&(walk_ops){name[0], model_setup, model_run, model_after, model_teardown}, &m,
             CHI_FAULT_ALLOC, 0);
        step_ctx s = {.dev = targets[i], .precision = CH_F32};
        walk(&(walk_ops){name[1], step_setup, step_run, step_after, step_teardown}, &s,
             CHI_FAULT_ALLOC, 0);
        step_ctx h = {.dev = targets[i], .precision = CH_BF16};
        walk(&(walk_ops){name[2], step_setup, step_run, step_after, step_teardown}, &h,
             CHI_FAULT_ALLOC, 0);
    }

    attn_ctx a;
    if (PART != 2)
        walk(&(walk_ops){"ch_attention, ch_attention_packed and their backwards on host",
                         attn_setup, attn_run, attn_after, attn_teardown},
             &a, CHI_FAULT_ALLOC, 0);

    if (PART == 1) {
        /* test-fault-dp makes the data-parallel walks. */
    } else if (ocl0 && ocl1) {
        dp_ctx d = {.devs = {host, ocl0, ocl1}};
        ch_host_buffer_new(&d.img, host, sizeof images);
        ch_host_buffer_new(&d.lab, host, sizeof labels);
        memcpy(ch_host_buffer_data(d.img), images, sizeof images);
        memcpy(ch_host_buffer_data(d.lab), labels, sizeof labels);
        d.batch = (ch_batch){d.img, d.lab, NULL, BATCH, 0, 0};
        walk(&(walk_ops){"a data-parallel step over host,opencl:0,opencl:1", dp_setup, dp_run,
                         dp_after, dp_teardown},
             &d, CHI_FAULT_ALLOC, 0);
        walk(&(walk_ops){"a traced all-reduce over host and opencl:0, then another", red_setup,
                         red_run, red_after, red_teardown},
             &(red_ctx){.devs = {host, ocl0}}, CHI_FAULT_ALLOC, 0);
        walk(&(walk_ops){"elastic: a step losing opencl:1 (its removal)", remove_setup, remove_run,
                         elastic_after, elastic_teardown},
             &d, CHI_FAULT_ALLOC, 0);
        walk(&(walk_ops){"elastic: ch_dp_rejoin taking opencl:1 back", rejoin_setup, rejoin_run,
                         elastic_after, elastic_teardown},
             &d, CHI_FAULT_ALLOC, 0);
        ch_host_buffer_free(d.img);
        ch_host_buffer_free(d.lab);
    } else {
        for (int i = 0; i < 4; i++)
            tap_skip("no opencl:0 and opencl:1 for the data-parallel walks (POCL_DEVICES=\"pthread "
                     "pthread\" gives them)");
    }

    if (PART == 2) {
        rmdir(tmpdir);
        ch_shutdown();
        return tap_done();
    }
    ckpt_ctx c = {0};
    ckpt_make(&c);
    walk(&(walk_ops){"a checkpoint save", ckpt_setup, save_run, save_after, save_teardown}, &c,
         CHI_FAULT_ALLOC, 0);
    walk(&(walk_ops){"a checkpoint load", ckpt_setup, load_run, load_after, ckpt_setup}, &c,
         CHI_FAULT_ALLOC, 0);
    static const struct {
        int mode;
        const char *name;
    } modes[] = {{CHI_FAULT_IO_ENOSPC, "ENOSPC"}, {CHI_FAULT_IO_SHORT, "a short write, then ENOSPC"},
                 {CHI_FAULT_IO_EIO, "EIO"}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++) {
        char name[2][96];
        snprintf(name[0], sizeof name[0], "a checkpoint save, each write or fsync failing: %s",
                 modes[i].name);
        snprintf(name[1], sizeof name[1], "a checkpoint load, each read failing: %s",
                 modes[i].mode == CHI_FAULT_IO_SHORT ? "a short read" : modes[i].name);
        walk(&(walk_ops){name[0], ckpt_setup, save_run, save_after, save_teardown}, &c,
             CHI_FAULT_IO, modes[i].mode);
        walk(&(walk_ops){name[1], ckpt_setup, load_run, load_after, ckpt_setup}, &c, CHI_FAULT_IO,
             modes[i].mode);
    }
    ckpt_free(&c);
    rmdir(tmpdir);
    ch_shutdown();
    return tap_done();
}
