/* What a training step on OpenCL asks of the host, on every OpenCL device:
 * the ops that need temporaries take them from the stream's one scratch
 * buffer, grown to the largest request and reused by every later call
 * (no buffer made per call; two ops in turn on one stream, and streams of
 * their own on two threads at once, give the bits each gives alone).
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
        snprintf(buf, sizeof buf, "%s", error);
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

int main(void)
{
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
    }
    if (!opencl)
        tap_skip("no OpenCL device");
    ch_shutdown();
    return tap_done();
}
