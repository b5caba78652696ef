/* What a training step on OpenCL asks of the host, on every OpenCL device:
 * - the ops that need temporaries take them from the stream's one scratch
 *   buffer, grown to the largest request and reused by every later call
 *   (no buffer made per call; two ops in turn on one stream, and streams
 *   of their own on two threads at once, give the bits each gives alone);
 * - no op of a training step waits for the device: not the losses, the
 *   embedding and their checks of labels and indices, nor the sums;
 *   a GPT step waits once, to read its loss, and a step whose labels are
 *   out of range still fails, at that read, naming the first bad one, and
 *   only once.
 *
 * The test counts the OpenCL calls the backend makes by defining them
 * itself: this program exports clCreateBuffer, clFinish and the calls that
 * can block (-export-dynamic), so the module, loaded later, binds to these,
 * which count and hand on to the ICD loader's. Nothing of this is in the
 * library. */
#define CL_TARGET_OPENCL_VERSION 120

#include <dlfcn.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <CL/cl.h>

#include "tap.h"

/* ---- the counted calls ---------------------------------------------------- */

static atomic_long buffers_made, host_waits;

/* The ICD loader's function `name`: the module has loaded it by the time
 * any of these runs. */
static void *loader_fn(const char *name)
{
    void *lib = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD);
    void *fn = lib ? dlsym(lib, name) : NULL;
    if (!fn) {
        fprintf(stderr, "test-opencl-step: no %s in libOpenCL.so.1: %s\n", name, dlerror());
        abort();
    }
    return fn;
}

/* The build hides every symbol (-fvisibility=hidden); these must be seen. */
#define COUNTED __attribute__((visibility("default")))

/* The real function of this name, looked up once, in `fn`. */
#define REAL(fn, name)                                                                             \
    do {                                                                                           \
        if (!fn)                                                                                   \
            *(void **)&fn = loader_fn(name);                                                       \
    } while (0)

COUNTED cl_mem CL_API_CALL clCreateBuffer(cl_context ctx, cl_mem_flags flags, size_t size,
                                          void *host, cl_int *err)
{
    static cl_mem(CL_API_CALL * fn)(cl_context, cl_mem_flags, size_t, void *, cl_int *);
    REAL(fn, "clCreateBuffer");
    atomic_fetch_add(&buffers_made, 1);
    return fn(ctx, flags, size, host, err);
}

COUNTED cl_int CL_API_CALL clFinish(cl_command_queue q)
{
    static cl_int(CL_API_CALL * fn)(cl_command_queue);
    REAL(fn, "clFinish");
    atomic_fetch_add(&host_waits, 1);
    return fn(q);
}

COUNTED cl_int CL_API_CALL clWaitForEvents(cl_uint n, const cl_event *events)
{
    static cl_int(CL_API_CALL * fn)(cl_uint, const cl_event *);
    REAL(fn, "clWaitForEvents");
    atomic_fetch_add(&host_waits, 1);
    return fn(n, events);
}

COUNTED cl_int CL_API_CALL clEnqueueReadBuffer(cl_command_queue q, cl_mem buf, cl_bool blocking,
                                               size_t off, size_t size, void *host, cl_uint nwait,
                                               const cl_event *wait, cl_event *ev)
{
    static cl_int(CL_API_CALL * fn)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, void *,
                                    cl_uint, const cl_event *, cl_event *);
    REAL(fn, "clEnqueueReadBuffer");
    if (blocking)
        atomic_fetch_add(&host_waits, 1);
    return fn(q, buf, blocking, off, size, host, nwait, wait, ev);
}

COUNTED cl_int CL_API_CALL clEnqueueWriteBuffer(cl_command_queue q, cl_mem buf, cl_bool blocking,
                                                size_t off, size_t size, const void *host,
                                                cl_uint nwait, const cl_event *wait, cl_event *ev)
{
    static cl_int(CL_API_CALL * fn)(cl_command_queue, cl_mem, cl_bool, size_t, size_t, const void *,
                                    cl_uint, const cl_event *, cl_event *);
    REAL(fn, "clEnqueueWriteBuffer");
    if (blocking)
        atomic_fetch_add(&host_waits, 1);
    return fn(q, buf, blocking, off, size, host, nwait, wait, ev);
}

COUNTED void *CL_API_CALL clEnqueueMapBuffer(cl_command_queue q, cl_mem buf, cl_bool blocking,
                                             cl_map_flags flags, size_t off, size_t size,
                                             cl_uint nwait, const cl_event *wait, cl_event *ev,
                                             cl_int *err)
{
    static void *(CL_API_CALL * fn)(cl_command_queue, cl_mem, cl_bool, cl_map_flags, size_t, size_t,
                                    cl_uint, const cl_event *, cl_event *, cl_int *);
    REAL(fn, "clEnqueueMapBuffer");
    if (blocking)
        atomic_fetch_add(&host_waits, 1);
    return fn(q, buf, blocking, flags, off, size, nwait, wait, ev, err);
}

#define MAX_DEVICES 16
/* Rows and classes of the losses; the width of the LayerNorm rows. */
#define ROWS 96
#define CLASSES 37
#define WIDTH 200

/* On dev, a tensor of floats uniform in [lo, hi), or of n labels below
 * `classes`, drawn from rng. */
static ch_status floats_new(ch_tensor **t, ch_device *dev, int ndim, const int64_t *shape,
                            tap_rng *rng, float lo, float hi)
{
    ch_status st = ch_tensor_new(t, dev, CH_F32, ndim, shape);
    int64_t n = st == CH_OK ? ch_tensor_numel(*t) : 0;
    float *v = st == CH_OK ? malloc((size_t)n * sizeof *v) : NULL;
    if (st == CH_OK && !v)
        st = CH_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; st == CH_OK && i < n; i++)
        v[i] = tap_rng_uniform(rng, lo, hi);
    if (st == CH_OK)
        st = ch_tensor_upload(*t, v, (size_t)n * sizeof *v);
    free(v);
    return st;
}

static ch_status labels_new(ch_tensor **t, ch_device *dev, int64_t n, tap_rng *rng, int32_t classes)
{
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return CH_ERR_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++)
        v[i] = (int32_t)(tap_rng_next(rng) % (uint64_t)classes);
    ch_status st = ch_tensor_new(t, dev, CH_I32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_upload(*t, v, (size_t)n * sizeof *v);
    free(v);
    return st;
}

/* ---- the ops that take scratch ------------------------------------------ */

/* A loss over `rows` rows, LayerNorm's backward over `rows` rows of WIDTH
 * and a convolution's channel sums: the three ops whose scratch grows
 * with their shapes. */
typedef struct scratch_case {
    ch_tensor *logits, *labels, *probs, *loss, *dlogits;
    ch_tensor *x, *dy, *mean, *rstd, *gamma, *beta, *y, *dx, *dgamma, *dbeta;
    ch_tensor *conv, *sums;
} scratch_case;

static void scratch_case_free(scratch_case *c)
{
    ch_tensor *all[] = {c->logits, c->labels, c->probs, c->loss,  c->dlogits, c->x,
                        c->dy,     c->mean,   c->rstd,  c->gamma, c->beta,    c->y,
                        c->dx,     c->dgamma, c->dbeta, c->conv,  c->sums};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ch_tensor_free(all[i]);
    memset(c, 0, sizeof *c);
}

static ch_status scratch_case_new(scratch_case *c, ch_device *dev, int64_t rows, uint64_t seed)
{
    tap_rng rng = {seed};
    int64_t lg[2] = {rows, CLASSES}, ln[2] = {rows, WIDTH}, width = WIDTH, one = 1,
            conv[4] = {3, 5, 7, 11}, sums = 2 * 5 + 1;
    memset(c, 0, sizeof *c);
    ch_status st = floats_new(&c->logits, dev, 2, lg, &rng, -3, 3);
    if (st == CH_OK)
        st = labels_new(&c->labels, dev, rows, &rng, CLASSES);
    if (st == CH_OK)
        st = ch_tensor_new(&c->probs, dev, CH_F32, 2, lg);
    if (st == CH_OK)
        st = ch_tensor_new(&c->loss, dev, CH_F32, 1, &one);
    if (st == CH_OK)
        st = ch_tensor_new(&c->dlogits, dev, CH_F32, 2, lg);
    if (st == CH_OK)
        st = floats_new(&c->x, dev, 2, ln, &rng, -2, 2);
    if (st == CH_OK)
        st = floats_new(&c->dy, dev, 2, ln, &rng, -1, 1);
    if (st == CH_OK)
        st = ch_tensor_new(&c->mean, dev, CH_F32, 1, &rows);
    if (st == CH_OK)
        st = ch_tensor_new(&c->rstd, dev, CH_F32, 1, &rows);
    if (st == CH_OK)
        st = floats_new(&c->gamma, dev, 1, &width, &rng, 0.5f, 1.5f);
    if (st == CH_OK)
        st = floats_new(&c->beta, dev, 1, &width, &rng, -0.5f, 0.5f);
    if (st == CH_OK)
        st = ch_tensor_new(&c->y, dev, CH_F32, 2, ln);
    if (st == CH_OK)
        st = ch_tensor_new(&c->dx, dev, CH_F32, 2, ln);
    if (st == CH_OK)
        st = ch_tensor_new(&c->dgamma, dev, CH_F32, 1, &width);
    if (st == CH_OK)
        st = ch_tensor_new(&c->dbeta, dev, CH_F32, 1, &width);
    if (st == CH_OK)
        st = floats_new(&c->conv, dev, 4, conv, &rng, -1, 1);
    if (st == CH_OK)
        st = ch_tensor_new(&c->sums, dev, CH_F32, 1, &sums);
    if (st != CH_OK)
        scratch_case_free(c);
    return st;
}

/* The ops one after the other, each followed by a wait on dev when `wait`
 * is set; the gradients start from 0. */
static ch_status scratch_ops(scratch_case *c, ch_device *dev, int wait)
{
    ch_status st = ch_fill(c->dgamma, 0.0);
    if (st == CH_OK)
        st = ch_fill(c->dbeta, 0.0);
    if (st == CH_OK)
        st = ch_layernorm(c->y, c->mean, c->rstd, c->x, c->gamma, c->beta, 1e-5f);
    if (st == CH_OK && wait)
        st = ch_device_sync(dev);
    if (st == CH_OK)
        st = ch_layernorm_backward(c->dx, c->dgamma, c->dbeta, c->dy, c->x, c->mean, c->rstd,
                                   c->gamma);
    if (st == CH_OK && wait)
        st = ch_device_sync(dev);
    if (st == CH_OK)
        st = ch_softmax_xent(c->loss, c->probs, c->logits, c->labels);
    if (st == CH_OK && wait)
        st = ch_device_sync(dev);
    if (st == CH_OK)
        st = ch_softmax_xent_backward(c->dlogits, c->probs, c->labels, 1.0f);
    if (st == CH_OK && wait)
        st = ch_device_sync(dev);
    if (st == CH_OK)
        st = ch_channel_sums(c->sums, c->conv, NULL, c->conv, NULL);
    return st == CH_OK ? ch_device_sync(dev) : st;
}

/* The bits of every output of the case, appended to *out (grown). */
typedef struct words {
    uint32_t *v;
    size_t n;
} words;

static ch_status words_add(words *w, const ch_tensor *t)
{
    size_t n = (size_t)ch_tensor_numel(t);
    uint32_t *v = realloc(w->v, (w->n + n) * sizeof *v);
    if (!v)
        return CH_ERR_OUT_OF_MEMORY;
    w->v = v;
    ch_status st = ch_tensor_download(t, v + w->n, n * sizeof *v);
    w->n += n;
    return st;
}

static ch_status scratch_outputs(const scratch_case *c, words *w)
{
    const ch_tensor *outs[] = {c->loss, c->probs, c->dlogits, c->dx, c->dgamma, c->dbeta, c->sums};
    ch_status st = CH_OK;
    w->n = 0;
    for (size_t i = 0; i < sizeof outs / sizeof outs[0] && st == CH_OK; i++)
        st = words_add(w, outs[i]);
    return st;
}

/* The first word where a and b differ, or -1. */
static long words_diff(const words *a, const words *b)
{
    if (a->n != b->n)
        return 0;
    for (size_t i = 0; i < a->n; i++)
        if (a->v[i] != b->v[i])
            return (long)i;
    return -1;
}

/* What a comparison of words found, for a TAP line. */
static const char *difference(ch_status st, const char *error, long at)
{
    static char buf[320];
    if (st != CH_OK)
        snprintf(buf, sizeof buf, "%.300s", error);
    else if (at < 0)
        snprintf(buf, sizeof buf, "identical");
    else
        snprintf(buf, sizeof buf, "the first difference at word %ld", at);
    return buf;
}

static uint64_t workspace_of(ch_device *dev)
{
    ch_memory_stats m;
    return ch_device_memory_stats(dev, &m) == CH_OK ? m.workspace_bytes : 0;
}

/* One scratch per stream, grown once: repeated calls leave the workspace
 * where the first left it. */
static void test_scratch_kept(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    scratch_case c;
    if (!tap_status_ok(scratch_case_new(&c, dev, ROWS, 1), "%s: the ops' tensors", id))
        return;
    ch_status st = scratch_ops(&c, dev, 0);
    uint64_t first = workspace_of(dev);
    long made = atomic_load(&buffers_made);
    for (int i = 0; i < 20 && st == CH_OK; i++)
        st = scratch_ops(&c, dev, 0);
    made = atomic_load(&buffers_made) - made;
    uint64_t later = workspace_of(dev);
    tap_ok(st == CH_OK && made == 0 && first > 0 && later == first,
           "%s: 20 more rounds of the ops make no buffer (%ld clCreateBuffer) and keep the "
           "stream's scratch: workspace %" PRIu64 " bytes after the first, %" PRIu64
           " after them (%s)",
           id, made, first, later, st == CH_OK ? "ran" : ch_last_error());
    scratch_case_free(&c);
}

/* The ops queued back to back on one stream share its scratch in turn:
 * the same bits as with a wait after each. */
static void test_scratch_in_turn(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    scratch_case c;
    words waited = {NULL, 0}, queued = {NULL, 0};
    if (!tap_status_ok(scratch_case_new(&c, dev, 3 * ROWS, 2), "%s: the ops' tensors", id))
        return;
    ch_status st = scratch_ops(&c, dev, 1);
    if (st == CH_OK)
        st = scratch_outputs(&c, &waited);
    if (st == CH_OK)
        st = scratch_ops(&c, dev, 0);
    if (st == CH_OK)
        st = scratch_outputs(&c, &queued);
    long at = st == CH_OK ? words_diff(&waited, &queued) : 0;
    tap_ok(st == CH_OK && at < 0,
           "%s: LayerNorm's backward, the loss and its backward and the channel sums queued "
           "back to back give the bits of the same ops with a wait after each (%s)",
           id, difference(st, ch_last_error(), at));
    free(waited.v);
    free(queued.v);
    scratch_case_free(&c);
}

/* Two threads, each with a stream of its own on the same device and a case
 * of its own shape, run the ops at once, several rounds. */
typedef struct racer {
    ch_device *dev;
    scratch_case c;
    words got;
    ch_status st;
    char error[256];
} racer;

static void *racer_run(void *arg)
{
    racer *r = arg;
    ch_stream *s = NULL;
    r->st = ch_stream_new(&s, r->dev);
    if (r->st == CH_OK)
        r->st = ch_stream_set_current(s);
    for (int i = 0; i < 8 && r->st == CH_OK; i++)
        r->st = scratch_ops(&r->c, r->dev, 0);
    if (r->st == CH_OK)
        r->st = scratch_outputs(&r->c, &r->got);
    if (r->st != CH_OK)
        snprintf(r->error, sizeof r->error, "%s", ch_last_error());
    if (s) {
        ch_stream_reset_current(r->dev);
        ch_stream_free(s);
    }
    return NULL;
}

static void test_scratch_streams(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    racer r[2] = {{.dev = dev}, {.dev = dev}};
    words want[2] = {{NULL, 0}, {NULL, 0}};
    ch_status st = CH_OK;
    for (int k = 0; k < 2 && st == CH_OK; k++) {
        st = scratch_case_new(&r[k].c, dev, (k + 1) * ROWS, 10 + (uint64_t)k);
        if (st == CH_OK)
            st = scratch_ops(&r[k].c, dev, 0);
        if (st == CH_OK)
            st = scratch_outputs(&r[k].c, &want[k]);
    }
    pthread_t th[2];
    int started = 0;
    for (int k = 0; k < 2 && st == CH_OK; k++)
        if (pthread_create(&th[k], NULL, racer_run, &r[k]) == 0)
            started++;
    for (int k = 0; k < started; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 2; k++) {
        ch_status rs = st != CH_OK ? st : started < 2 ? CH_ERR_INTERNAL : r[k].st;
        long at = rs == CH_OK ? words_diff(&want[k], &r[k].got) : 0;
        tap_ok(rs == CH_OK && at < 0,
               "%s: thread %d, on a stream of its own beside the other's, gives the bits its "
               "ops give alone (%s)",
               id, k, difference(rs, r[k].st != CH_OK ? r[k].error : "no thread", at));
        free(want[k].v);
        free(r[k].got.v);
        scratch_case_free(&r[k].c);
    }
}

/* ---- no host wait inside a step ----------------------------------------- */

/* The ops of a training step that once waited for their checks, or that
 * take scratch or reduce across work-groups, each on good inputs: no
 * clFinish, clWaitForEvents or blocking transfer until the device sync
 * after them, which waits once. */
static void test_ops_no_wait(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    scratch_case c;
    tap_rng rng = {5};
    ch_tensor *table = NULL, *dtable = NULL, *idx = NULL, *emb = NULL, *db = NULL;
    int64_t tshape[2] = {CLASSES, WIDTH}, eshape[2] = {ROWS, WIDTH}, width = WIDTH;
    ch_status st = scratch_case_new(&c, dev, ROWS, 3);
    if (st == CH_OK)
        st = floats_new(&table, dev, 2, tshape, &rng, -1, 1);
    if (st == CH_OK && (st = ch_tensor_new(&dtable, dev, CH_F32, 2, tshape)) == CH_OK)
        st = ch_fill(dtable, 0.0);
    if (st == CH_OK)
        st = labels_new(&idx, dev, ROWS, &rng, CLASSES);
    if (st == CH_OK)
        st = ch_tensor_new(&emb, dev, CH_F32, 2, eshape);
    if (st == CH_OK)
        st = ch_tensor_new(&db, dev, CH_F32, 1, &width);
    /* Kernels built, scratch grown and check words made: a first round. */
    for (int round = 0; round < 2 && st == CH_OK; round++) {
        long before = atomic_load(&host_waits);
        st = ch_embedding(emb, table, idx);
        if (st == CH_OK)
            st = ch_embedding_backward(dtable, c.dy, idx);
        if (st == CH_OK)
            st = ch_bias_grad(db, c.dy, 1, 0.0f);
        if (st == CH_OK)
            st = ch_layernorm(c.y, c.mean, c.rstd, c.x, c.gamma, c.beta, 1e-5f);
        if (st == CH_OK)
            st = ch_layernorm_backward(c.dx, c.dgamma, c.dbeta, c.dy, c.x, c.mean, c.rstd, c.gamma);
        if (st == CH_OK)
            st = ch_softmax_xent(c.loss, c.probs, c.logits, c.labels);
        if (st == CH_OK)
            st = ch_softmax_xent_backward(c.dlogits, c.probs, c.labels, 1.0f);
        if (st == CH_OK)
            st = ch_channel_sums(c.sums, c.conv, NULL, c.conv, NULL);
        long inside = atomic_load(&host_waits) - before;
        if (st == CH_OK)
            st = ch_device_sync(dev);
        long total = atomic_load(&host_waits) - before;
        if (round == 1)
            tap_ok(st == CH_OK && inside == 0 && total >= 1,
                   "%s: the embedding and its backward, bias_grad, LayerNorm and its backward, "
                   "the loss and its backward and the channel sums queue without a host wait "
                   "(%ld waits inside them; the sync after them %ld) (%s)",
                   id, inside, total - inside, st == CH_OK ? "ran" : ch_last_error());
    }
    if (st != CH_OK)
        tap_ok(0, "%s: the ops without a wait: %s", id, ch_last_error());
    ch_tensor_free(table);
    ch_tensor_free(dtable);
    ch_tensor_free(idx);
    ch_tensor_free(emb);
    ch_tensor_free(db);
    scratch_case_free(&c);
}

/* 32 checks queue unread; the 33rd waits for them on its own, and fails
 * with the first's error (ops.h, like CUDA's). */
static void test_checks_full(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    scratch_case c;
    ch_tensor *bad = NULL;
    tap_rng rng = {9};
    int32_t labels[ROWS];
    int first_error = 0;
    ch_status st = scratch_case_new(&c, dev, ROWS, 4);
    for (int i = 0; i < ROWS; i++)
        labels[i] = (int32_t)(tap_rng_next(&rng) % CLASSES);
    labels[7] = CLASSES;
    if (st == CH_OK)
        st = labels_new(&bad, dev, ROWS, &rng, CLASSES);
    if (st == CH_OK)
        st = ch_tensor_upload(bad, labels, sizeof labels);
    if (st == CH_OK)
        st = ch_device_sync(dev);
    if (st == CH_OK)
        st = ch_softmax_xent(c.loss, c.probs, c.logits, bad);
    for (int i = 2; i <= 40 && st == CH_OK; i++) {
        st = ch_softmax_xent_backward(c.dlogits, c.probs, c.labels, 1.0f);
        first_error = i;
    }
    char want[64];
    snprintf(want, sizeof want, "labels[7] = %d", CLASSES);
    tap_ok(first_error == 33 && st == CH_ERR_INVALID_ARGUMENT && strstr(ch_last_error(), want),
           "%s: 32 checks queue unread, the 33rd waits and reports the first's bad label "
           "(call %d: %s, \"%s\")",
           id, first_error, ch_status_str(st), ch_last_error());
    st = ch_device_sync(dev);
    tap_ok(st == CH_OK, "%s: then the device syncs clean (%s)", id,
           st == CH_OK ? "ok" : ch_last_error());
    ch_tensor_free(bad);
    scratch_case_free(&c);
}

/* ---- a GPT step ------------------------------------------------------------ */

#define GPT_BATCH 2
#define GPT_CONTEXT 16

typedef struct gpt_case {
    ch_module *m;
    ch_loss *lf;
    ch_optimizer *opt;
    ch_tensor *x, *y;
    int32_t tokens[GPT_BATCH * GPT_CONTEXT];
} gpt_case;

static void gpt_free(gpt_case *g)
{
    ch_optimizer_free(g->opt);
    ch_loss_free(g->lf);
    ch_module_free(g->m);
    ch_tensor_free(g->x);
    ch_tensor_free(g->y);
    memset(g, 0, sizeof *g);
}

static ch_status gpt_new(gpt_case *g, ch_device *dev)
{
    ch_gpt_config cfg = ch_gpt_defaults();
    cfg.layers = 2;
    cfg.context = GPT_CONTEXT;
    ch_optimizer_options o = ch_optimizer_defaults(CH_OPT_ADAMW, 1e-3f);
    int64_t shape[2] = {GPT_BATCH, GPT_CONTEXT}, n = GPT_BATCH * GPT_CONTEXT;
    tap_rng rng = {7};
    memset(g, 0, sizeof *g);
    for (int64_t i = 0; i < n; i++)
        g->tokens[i] = (int32_t)(tap_rng_next(&rng) % (uint64_t)cfg.vocab);
    ch_status st = ch_nn_gpt(&g->m, &cfg);
    if (st == CH_OK)
        st = ch_module_init(g->m, 7);
    if (st == CH_OK)
        st = ch_module_to(g->m, dev);
    if (st == CH_OK)
        st = ch_loss_new(&g->lf, CH_LOSS_CROSS_ENTROPY);
    if (st == CH_OK)
        st = ch_optimizer_new(&g->opt, g->m, &o);
    if (st == CH_OK)
        st = ch_tensor_new(&g->x, dev, CH_I32, 2, shape);
    if (st == CH_OK)
        st = ch_tensor_upload(g->x, g->tokens, sizeof g->tokens);
    if (st == CH_OK)
        st = ch_tensor_new(&g->y, dev, CH_I32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_upload(g->y, g->tokens, sizeof g->tokens);
    if (st != CH_OK)
        gpt_free(g);
    return st;
}

/* Forward, loss, backward and an AdamW step, then the loss read; *inside
 * the host waits before the read, *first the first call that failed (its
 * name), NULL when none did. */
static ch_status gpt_step(gpt_case *g, float *loss, long *inside, const char **first)
{
    ch_tensor *pred = NULL, *value = NULL, *dpred = NULL, *dx = NULL;
    long before = atomic_load(&host_waits);
    ch_status st = ch_module_zero_grad(g->m);
    *first = "ch_module_zero_grad";
    if (st == CH_OK && (st = ch_module_forward(g->m, &pred, g->x)) != CH_OK)
        *first = "ch_module_forward";
    if (st == CH_OK && (st = ch_loss_forward(g->lf, &value, pred, g->y)) != CH_OK)
        *first = "ch_loss_forward";
    if (st == CH_OK && (st = ch_loss_backward(g->lf, &dpred, 1.0f)) != CH_OK)
        *first = "ch_loss_backward";
    if (st == CH_OK && (st = ch_module_backward(g->m, &dx, dpred)) != CH_OK)
        *first = "ch_module_backward";
    if (st == CH_OK && (st = ch_optimizer_step(g->opt, 1e-3f)) != CH_OK)
        *first = "ch_optimizer_step";
    *inside = atomic_load(&host_waits) - before;
    if (st == CH_OK && (st = ch_tensor_download(value, loss, sizeof *loss)) != CH_OK)
        *first = "ch_tensor_download (the loss)";
    if (st == CH_OK)
        *first = NULL;
    return st;
}

/* The ops of dev that ran on the host since ch_init. */
static int fallbacks_of(const ch_device *dev)
{
    int n = 0;
    for (int i = 0; i < ch_fallback_count(); i++) {
        ch_fallback_info f;
        n += ch_fallback_get(i, &f) == CH_OK && strcmp(f.device, ch_device_id(dev)) == 0;
    }
    return n;
}

static void test_gpt_step(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    gpt_case g;
    float loss = 0.0f;
    long inside = 0;
    const char *first = NULL;
    ch_status st = gpt_new(&g, dev);
    if (!tap_status_ok(st, "%s: a GPT of 2 layers", id))
        return;
    /* The first step builds the kernels and fills the caches. */
    st = gpt_step(&g, &loss, &inside, &first);
    long read = atomic_load(&host_waits);
    if (st == CH_OK)
        st = gpt_step(&g, &loss, &inside, &first);
    read = atomic_load(&host_waits) - read - inside;
    /* An op that ran on the host would wait: its inputs are downloaded. */
    int host_ops = fallbacks_of(dev);
    tap_ok(st == CH_OK && inside == 0,
           "%s: a GPT step makes no host wait before its loss is read (%ld waits; %d ops of "
           "the device ran on the host) (%s)",
           id, inside, host_ops, st == CH_OK ? "ran" : ch_last_error());
    tap_ok(st == CH_OK && read == 1, "%s: reading the loss is the step's one wait (%ld waits) (%s)",
           id, read, st == CH_OK ? "ran" : ch_last_error());

    /* A label out of range: the loss's read reports it, naming it, once. */
    const int64_t bad_at = 21;
    const int32_t bad = 999;
    int32_t labels[GPT_BATCH * GPT_CONTEXT];
    memcpy(labels, g.tokens, sizeof labels);
    labels[bad_at] = bad;
    char want[64];
    snprintf(want, sizeof want, "labels[%lld] = %d", (long long)bad_at, (int)bad);
    ch_clear_error();
    st = ch_tensor_upload(g.y, labels, sizeof labels);
    if (st == CH_OK)
        st = gpt_step(&g, &loss, &inside, &first);
    int named = st == CH_ERR_INVALID_ARGUMENT && strstr(ch_last_error(), want);
    int at_read = first && strncmp(first, "ch_tensor_download", 18) == 0;
    tap_ok(named && at_read,
           "%s: a step with labels[%lld] = %d out of the vocabulary: every op queues, the "
           "loss's read fails naming it (%s from %s: \"%s\")",
           id, (long long)bad_at, (int)bad, ch_status_str(st), first ? first : "nothing",
           ch_last_error());
    st = ch_device_sync(dev);
    tap_ok(st == CH_OK, "%s: then the device syncs clean: the error is told once (%s)", id,
           st == CH_OK ? "ok" : ch_last_error());
    st = ch_tensor_upload(g.y, g.tokens, sizeof g.tokens);
    if (st == CH_OK)
        st = gpt_step(&g, &loss, &inside, &first);
    tap_ok(st == CH_OK, "%s: and the next step with good labels runs (%s)", id,
           st == CH_OK ? "ok" : ch_last_error());

    /* A token out of the embedding's table, the same way. */
    memcpy(labels, g.tokens, sizeof labels);
    labels[bad_at] = -3;
    snprintf(want, sizeof want, "idx[%lld] = -3", (long long)bad_at);
    ch_clear_error();
    st = ch_tensor_upload(g.x, labels, sizeof labels);
    if (st == CH_OK)
        st = gpt_step(&g, &loss, &inside, &first);
    named = st == CH_ERR_INVALID_ARGUMENT && strstr(ch_last_error(), want);
    at_read = first && strncmp(first, "ch_tensor_download", 18) == 0;
    tap_ok(named && at_read,
           "%s: a step with token %lld = -3: the loss's read fails naming it (%s from %s: "
           "\"%s\")",
           id, (long long)bad_at, ch_status_str(st), first ? first : "nothing", ch_last_error());
    st = ch_tensor_upload(g.x, g.tokens, sizeof g.tokens);
    if (st == CH_OK)
        st = gpt_step(&g, &loss, &inside, &first);
    tap_ok(st == CH_OK, "%s: and the next step with good tokens runs (%s)", id,
           st == CH_OK ? "ok" : ch_last_error());
    gpt_free(&g);
}

int main(void)
{
    setenv("CHORUS_QUIET_FALLBACK", "1", 1);
    if (ch_init() != CH_OK) {
        tap_skip_all("ch_init: %s", ch_last_error());
        return 0;
    }
    ch_device *devs[MAX_DEVICES];
    int ndev = tap_devices(devs, MAX_DEVICES), opencl = 0;
    for (int d = 0; d < ndev; d++) {
        ch_device_info info;
        if (ch_device_get_info(devs[d], &info) != CH_OK || strcmp(info.backend, "opencl") != 0)
            continue;
        opencl++;
        test_scratch_kept(devs[d]);
        test_scratch_in_turn(devs[d]);
        test_scratch_streams(devs[d]);
        test_ops_no_wait(devs[d]);
        test_checks_full(devs[d]);
        test_gpt_step(devs[d]);
    }
    if (!opencl)
        tap_skip("no OpenCL device");
    ch_shutdown();
    return tap_done();
}
