/* The CUDA backend: what test-ops does not reach. Device properties, memory,
 * pinned asynchronous transfers, streams and events, out-of-memory that is
 * not sticky, the split paths of the deterministic reductions, the
 * all-reduce, and peer copies. Where the module was built but no GPU is
 * there, it must say why (no driver, no device) and leave the rest of the
 * library working. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"
#include "tap.h"

#define MAX_CUDA 16

static ch_tensor *upload(ch_device *dev, int ndim, const int64_t *shape, const void *data)
{
    ch_tensor *t = NULL;
    if (!tap_status_ok(ch_tensor_new(&t, dev, CH_F32, ndim, shape), "ch_tensor_new on %s",
                       ch_device_id(dev)))
        return NULL;
    if (data && !tap_status_ok(ch_tensor_upload(t, data, ch_tensor_nbytes(t)), "ch_tensor_upload")) {
        ch_tensor_free(t);
        return NULL;
    }
    return t;
}

static float *download(const ch_tensor *t)
{
    float *h = malloc(ch_tensor_nbytes(t));
    if (h && ch_tensor_download(t, h, ch_tensor_nbytes(t)) != CH_OK) {
        free(h);
        return NULL;
    }
    return h;
}

static float *random_floats(int64_t n, uint64_t seed)
{
    tap_rng r = {seed};
    float *x = malloc((size_t)n * sizeof *x);
    for (int64_t i = 0; x && i < n; i++)
        x[i] = tap_rng_uniform(&r, -1.0f, 1.0f);
    return x;
}

/* ---- no GPU here ---------------------------------------------------------- */

static int find_backend(const char *name, ch_backend_info *out)
{
    for (int i = 0; i < ch_backend_count(); i++)
        if (ch_backend_get_info(i, out) == CH_OK && strcmp(out->name, name) == 0)
            return 1;
    return 0;
}

static void test_unavailable(const ch_backend_info *cu)
{
#ifdef CH_TEST_HAVE_CUDA
    /* Built with CUDA: the module must load, and its init must say why it
     * found nothing (not a loader error). */
    tap_ok(strstr(cu->detail, "no CUDA driver") || strstr(cu->detail, "no CUDA device") ||
               strstr(cu->detail, "CUDA driver unusable"),
           "cuda module loaded and init said why it is unavailable: \"%s\"", cu->detail);
#else
    tap_ok(cu->detail[0] != '\0', "cuda backend unavailable with a reason: \"%s\"", cu->detail);
#endif
    /* Nothing sticky: the host still runs ops. */
    ch_device *host = NULL;
    int64_t shape[1] = {5};
    if (!tap_status_ok(ch_device_by_name(&host, "host"), "host device after cuda failed"))
        return;
    ch_tensor *t = upload(host, 1, shape, NULL);
    if (!t)
        return;
    float got[5] = {0};
    tap_status_ok(ch_fill(t, 1.5), "ch_fill on host after cuda failed");
    tap_status_ok(ch_tensor_download(t, got, sizeof got), "download on host");
    tap_ok(got[4] == 1.5f, "host fill after cuda failed: got %g, want 1.5", got[4]);
    ch_tensor_free(t);
}

/* ---- properties and memory ------------------------------------------------ */

static int bus_id_ok(const char *id)
{
    unsigned d, b, s, f;
    char tail;
    if (strlen(id) != 12 || sscanf(id, "%4x:%2x:%2x.%1x%c", &d, &b, &s, &f, &tail) != 4)
        return 0;
    for (const char *p = id; *p; p++)
        if (isupper((unsigned char)*p))
            return 0;
    return 1;
}

static void test_info(ch_device *dev)
{
    ch_device_info info;
    if (!tap_status_ok(ch_device_get_info(dev, &info), "%s: ch_device_get_info", ch_device_id(dev)))
        return;
    tap_ok(strcmp(info.vendor, "NVIDIA") == 0, "%s: vendor \"%s\", want NVIDIA", info.id,
           info.vendor);
    tap_ok(info.kind == CH_DEVICE_GPU, "%s: kind %d, want GPU", info.id, (int)info.kind);
    tap_ok(info.name[0] != '\0', "%s: name \"%s\"", info.id, info.name);
    tap_ok(info.compute_units > 0, "%s: %d SMs", info.id, info.compute_units);
    tap_ok(info.memory_bytes > 0 && info.max_alloc_bytes == info.memory_bytes,
           "%s: memory %" PRIu64 ", max alloc %" PRIu64 " (want equal)", info.id,
           info.memory_bytes, info.max_alloc_bytes);
    tap_ok(bus_id_ok(info.pci_bus_id), "%s: PCI bus id \"%s\" is dddd:bb:dd.f, lower case",
           info.id, info.pci_bus_id);
    uint64_t fb = 0, tb = 0;
    if (tap_status_ok(ch_device_memory(dev, &fb, &tb), "%s: ch_device_memory", info.id))
        tap_ok(tb == info.memory_bytes && fb > 0 && fb <= tb,
               "%s: free %" PRIu64 " <= total %" PRIu64 " == memory %" PRIu64, info.id, fb, tb,
               info.memory_bytes);
}

/* Filling the device ends in CH_ERR_DEVICE_OUT_OF_MEMORY, and once the
 * blocks are freed ops run again (the failed cudaMalloc left nothing behind).
 * Blocks are a power of two, a size the caching allocator does not round. */
#define OOM_MAX_BLOCKS 64
static void test_oom(ch_device *dev)
{
    ch_device_info info;
    if (ch_device_get_info(dev, &info) != CH_OK)
        return;
    ch_tensor *t = NULL;
    int64_t too_big[1] = {(int64_t)(info.memory_bytes / 4) + 1};
    tap_status_is(ch_tensor_new(&t, dev, CH_F32, 1, too_big), CH_ERR_LIMIT, NULL,
                  "%s: a tensor larger than the device", info.id);
    ch_tensor_free(t);

    uint64_t block = 1;
    while (block * 2 <= info.memory_bytes / 8)
        block *= 2;
    ch_tensor *held[OOM_MAX_BLOCKS];
    int nheld = 0;
    ch_status st = CH_OK;
    int64_t shape[1] = {(int64_t)(block / 4)};
    while (nheld < OOM_MAX_BLOCKS &&
           (st = ch_tensor_new(&held[nheld], dev, CH_F32, 1, shape)) == CH_OK)
        nheld++;
    tap_status_is(st, CH_ERR_DEVICE_OUT_OF_MEMORY, "cudaMalloc",
                  "%s: out of memory after %d blocks of %" PRIu64 " bytes", info.id, nheld, block);
    for (int i = 0; i < nheld; i++)
        ch_tensor_free(held[i]);
    tap_status_ok(ch_device_empty_cache(dev), "%s: ch_device_empty_cache", info.id);

    int64_t small[1] = {1000};
    float want[1000], got[1000];
    for (int i = 0; i < 1000; i++)
        want[i] = (float)i;
    ch_tensor *s = upload(dev, 1, small, want);
    if (!s)
        return;
    int ok = tap_status_ok(ch_scale(s, s, 2.0f), "%s: an op after out of memory", info.id) &&
             tap_status_ok(ch_tensor_download(s, got, sizeof got), "download after out of memory");
    tap_ok(ok && got[999] == 1998.0f, "%s: scale after out of memory: got %g, want 1998",
           info.id, ok ? got[999] : NAN);
    ch_tensor_free(s);
}

/* ---- transfers, streams, events -------------------------------------------- */

static void test_roundtrip(ch_device *dev, int64_t n)
{
    float *x = random_floats(n, (uint64_t)n);
    int64_t shape[1] = {n};
    ch_tensor *t = upload(dev, 1, shape, x);
    float *y = t ? download(t) : NULL;
    tap_ok(y && memcmp(x, y, (size_t)n * 4) == 0, "%s: upload and download of %" PRId64
           " floats are exact", ch_device_id(dev), n);
    free(y);
    ch_tensor_free(t);
    free(x);
}

/* Pinned buffers, queued on a second stream, ordered by an event against
 * the default stream. */
static void test_async(ch_device *dev)
{
    const int64_t n = (1 << 20) + 3;
    const size_t bytes = (size_t)n * 4;
    int64_t shape[1] = {n};
    ch_host_buffer *in = NULL, *out = NULL;
    ch_stream *side = NULL, *main_stream = NULL;
    ch_event *done = NULL;
    ch_tensor *a = NULL, *b = NULL;
    if (!tap_status_ok(ch_host_buffer_new(&in, dev, bytes), "%s: ch_host_buffer_new", ch_device_id(dev)) ||
        !tap_status_ok(ch_host_buffer_new(&out, dev, bytes), "ch_host_buffer_new") ||
        !tap_status_ok(ch_stream_new(&side, dev), "ch_stream_new") ||
        !tap_status_ok(ch_device_default_stream(&main_stream, dev), "ch_device_default_stream") ||
        !tap_status_ok(ch_event_new(&done, dev), "ch_event_new") ||
        !(a = upload(dev, 1, shape, NULL)) || !(b = upload(dev, 1, shape, NULL)))
        goto out;
    float *src = ch_host_buffer_data(in), *dst = ch_host_buffer_data(out);
    for (int64_t i = 0; i < n; i++)
        src[i] = (float)(i % 1000);
    int ok = tap_status_ok(ch_stream_set_current(side), "ch_stream_set_current") &&
             tap_status_ok(ch_tensor_upload_async(a, in, 0), "ch_tensor_upload_async") &&
             tap_status_ok(ch_scale(a, a, 3.0f), "scale on the side stream") &&
             tap_status_ok(ch_event_record(done, side), "ch_event_record") &&
             tap_status_ok(ch_stream_reset_current(dev), "ch_stream_reset_current") &&
             tap_status_ok(ch_event_wait(main_stream, done), "ch_event_wait") &&
             tap_status_ok(ch_add(b, a, a), "add on the default stream after the event") &&
             tap_status_ok(ch_tensor_download_async(b, out, 0), "ch_tensor_download_async") &&
             tap_status_ok(ch_stream_sync(main_stream), "ch_stream_sync");
    int64_t bad = 0;
    for (int64_t i = 0; ok && i < n; i++)
        if (dst[i] != 6.0f * (float)(i % 1000))
            bad++;
    tap_ok(ok && bad == 0, "%s: pinned async upload, two streams and an event: %" PRId64
           " of %" PRId64 " wrong", ch_device_id(dev), bad, n);
out:
    ch_stream_reset_current(dev);
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_event_free(done);
    ch_stream_free(side);
    ch_host_buffer_free(in);
    ch_host_buffer_free(out);
}

/* ---- reductions long enough to be split ------------------------------------ */

static double sum_ref(const float *x, int64_t n, int64_t stride)
{
    double s = 0.0;
    for (int64_t k = 0; k < n; k++)
        s += x[k * stride];
    return s;
}

static void check_close(const char *what, const float *got, const double *want, int64_t n,
                        double tol)
{
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / fmax(fabs(want[i]), 1.0);
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    tap_ok(worst <= tol, "%s: got %.7g, want %.7g +- %g (element %" PRId64 ")", what, got[at],
           want[at], tol, at);
}

/* sum over axis 1 of [outer, n, inner], twice: same bits both times. */
static void test_sum(ch_device *dev, int64_t outer, int64_t n, int64_t inner)
{
    char what[128];
    snprintf(what, sizeof what, "%s: sum of [%" PRId64 ", %" PRId64 ", %" PRId64 "] over axis 1",
             ch_device_id(dev), outer, n, inner);
    float *x = random_floats(outer * n * inner, 7);
    int64_t xs[3] = {outer, n, inner}, ys[2] = {outer, inner};
    ch_tensor *tx = upload(dev, 3, xs, x), *ty = upload(dev, 2, ys, NULL);
    float *y1 = NULL, *y2 = NULL;
    double *want = malloc((size_t)(outer * inner) * sizeof *want);
    if (tx && ty && want && tap_status_ok(ch_sum(ty, tx, 1), "%s", what) && (y1 = download(ty)) &&
        tap_status_ok(ch_sum(ty, tx, 1), "%s again", what) && (y2 = download(ty))) {
        for (int64_t o = 0; o < outer; o++)
            for (int64_t i = 0; i < inner; i++)
                want[o * inner + i] = sum_ref(x + o * n * inner + i, n, inner);
        check_close(what, y1, want, outer * inner, 1e-5);
        tap_ok(memcmp(y1, y2, (size_t)(outer * inner) * 4) == 0, "%s: same bits twice", what);
    }
    free(want);
    free(y1);
    free(y2);
    ch_tensor_free(tx);
    ch_tensor_free(ty);
    free(x);
}

static void test_bias_grad(ch_device *dev, int64_t outer, int64_t c, int64_t inner)
{
    char what[128];
    snprintf(what, sizeof what, "%s: bias_grad of [%" PRId64 ", %" PRId64 ", %" PRId64 "], beta 0.5",
             ch_device_id(dev), outer, c, inner);
    float *dy = random_floats(outer * c * inner, 11), *db0 = random_floats(c, 13);
    int64_t xs[3] = {outer, c, inner}, bs[1] = {c};
    ch_tensor *tdy = upload(dev, 3, xs, dy), *tdb = upload(dev, 1, bs, db0);
    double *want = malloc((size_t)c * sizeof *want);
    float *got = NULL;
    if (tdy && tdb && want && tap_status_ok(ch_bias_grad(tdb, tdy, 1, 0.5f), "%s", what) &&
        (got = download(tdb))) {
        for (int64_t j = 0; j < c; j++) {
            double s = 0.5 * db0[j];
            for (int64_t o = 0; o < outer; o++)
                s += sum_ref(dy + (o * c + j) * inner, inner, 1);
            want[j] = s;
        }
        check_close(what, got, want, c, 1e-5);
    }
    free(got);
    free(want);
    ch_tensor_free(tdy);
    ch_tensor_free(tdb);
    free(dy);
    free(db0);
}

/* Many rows: the mean loss goes through the split reduction. */
static void test_softmax_rows(ch_device *dev, int64_t n, int64_t c)
{
    char what[96];
    snprintf(what, sizeof what, "%s: softmax_xent mean loss of %" PRId64 " rows of %" PRId64,
             ch_device_id(dev), n, c);
    float *x = random_floats(n * c, 17);
    int32_t *labels = malloc((size_t)n * sizeof *labels);
    for (int64_t i = 0; labels && i < n; i++)
        labels[i] = (int32_t)((i * 7) % c);
    int64_t xs[2] = {n, c}, ls[1] = {n}, one[1] = {1};
    ch_tensor *tx = upload(dev, 2, xs, x), *tp = upload(dev, 2, xs, NULL);
    ch_tensor *tl = NULL, *loss = upload(dev, 1, one, NULL);
    float got = NAN;
    if (tx && tp && loss && labels &&
        tap_status_ok(ch_tensor_new(&tl, dev, CH_I32, 1, ls), "labels") &&
        tap_status_ok(ch_tensor_upload(tl, labels, (size_t)n * 4), "upload labels") &&
        tap_status_ok(ch_softmax_xent(loss, tp, tx, tl), "%s", what) &&
        tap_status_ok(ch_tensor_download(loss, &got, sizeof got), "download loss")) {
        double total = 0.0;
        for (int64_t i = 0; i < n; i++) {
            const float *r = x + i * c;
            double m = r[0], s = 0.0;
            for (int64_t j = 1; j < c; j++)
                m = fmax(m, r[j]);
            for (int64_t j = 0; j < c; j++)
                s += exp(r[j] - m);
            total += log(s) - (r[labels[i]] - m);
        }
        double want = total / (double)n;
        check_close(what, &got, &want, 1, 1e-5);
    }
    ch_tensor_free(tx);
    ch_tensor_free(tp);
    ch_tensor_free(tl);
    ch_tensor_free(loss);
    free(labels);
    free(x);
}

/* ---- GEMM on concurrent streams -------------------------------------------- */

/* One thread's GEMMs: c = a @ b, `reps` times, queued on its own stream of
 * the device while the other thread does the same on another. */
typedef struct gemm_job {
    ch_stream *stream;
    ch_tensor *c;
    const ch_tensor *a, *b;
    int reps;
    ch_status st;
    char error[256];
} gemm_job;

static void *gemm_worker(void *arg)
{
    gemm_job *j = arg;
    j->st = ch_stream_set_current(j->stream);
    for (int r = 0; r < j->reps && j->st == CH_OK; r++)
        j->st = ch_gemm(j->c, 0, 0, 1.0f, j->a, j->b, 0.0f);
    if (j->st == CH_OK)
        j->st = ch_stream_sync(j->stream);
    if (j->st != CH_OK)
        snprintf(j->error, sizeof j->error, "%s", ch_last_error());
    ch_stream_reset_current(ch_stream_device(j->stream));
    return NULL;
}

/* Replicas on one device must stay identical: GEMMs queued at the same
 * time from two threads, each on its own stream, give the bits the same
 * GEMM gives alone on the default stream. [m, k] @ [k, n] with a long k,
 * where cuBLAS may split the sum and use its workspace. */
static void test_gemm_streams(ch_device *dev, int64_t m, int64_t k, int64_t n)
{
    enum { JOBS = 2 };
    int64_t as[2] = {m, k}, bs[2] = {k, n}, cs[2] = {m, n};
    float *ha = random_floats(m * k, 31), *hb = random_floats(k * n, 37);
    ch_tensor *a = upload(dev, 2, as, ha), *b = upload(dev, 2, bs, hb), *ref = upload(dev, 2, cs, NULL);
    gemm_job jobs[JOBS];
    memset(jobs, 0, sizeof jobs);
    pthread_t threads[JOBS];
    int started = 0;
    float *want = NULL;
    if (!a || !b || !ref || !tap_status_ok(ch_gemm(ref, 0, 0, 1.0f, a, b, 0.0f), "%s: gemm alone",
                                           ch_device_id(dev)) ||
        !(want = download(ref)))
        goto out;
    for (int i = 0; i < JOBS; i++) {
        jobs[i].a = a;
        jobs[i].b = b;
        jobs[i].reps = 8;
        if (!tap_status_ok(ch_stream_new(&jobs[i].stream, dev), "ch_stream_new") ||
            !(jobs[i].c = upload(dev, 2, cs, NULL)))
            goto out;
    }
    for (; started < JOBS; started++)
        if (pthread_create(&threads[started], NULL, gemm_worker, &jobs[started]) != 0)
            break;
    for (int i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    tap_ok(started == JOBS, "%s: %d gemm threads started", ch_device_id(dev), started);
    for (int i = 0; i < started; i++) {
        float *got = NULL;
        if (!tap_status_ok(jobs[i].st, "%s: %d gemms queued from thread %d%s%s", ch_device_id(dev),
                           jobs[i].reps, i, jobs[i].error[0] ? ": " : "", jobs[i].error) ||
            !(got = download(jobs[i].c)))
            continue;
        int64_t diff = 0, first = -1;
        for (int64_t e = 0; e < m * n; e++)
            if (memcmp(&got[e], &want[e], sizeof *got) != 0 && diff++ == 0)
                first = e;
        tap_ok(diff == 0, "%s: [%" PRId64 ", %" PRId64 "] @ [%" PRId64 ", %" PRId64
               "] on stream %d beside another: %" PRId64 " elements differ from the gemm alone "
               "(first %" PRId64 ": %.9g vs %.9g)", ch_device_id(dev), m, k, k, n, i, diff, first,
               first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
        free(got);
    }
out:
    for (int i = 0; i < JOBS; i++) {
        ch_tensor_free(jobs[i].c);
        ch_stream_free(jobs[i].stream);
    }
    free(want);
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_tensor_free(ref);
    free(ha);
    free(hb);
}

/* ---- several devices ------------------------------------------------------- */

static ch_bmem bmem_of(const ch_tensor *t)
{
    ch_bmem m = {t->buf->ptr, t->off};
    return m;
}

/* What the library writes on stderr (fd 2) between capture_begin and
 * capture_end: the all-reduce's note when it falls back from NCCL. */
typedef struct capture {
    FILE *file;
    int saved;
} capture;

static int capture_begin(capture *c)
{
    fflush(stderr);
    c->file = tmpfile();
    c->saved = c->file ? dup(2) : -1;
    if (c->saved < 0 || dup2(fileno(c->file), 2) < 0) {
        if (c->saved >= 0)
            close(c->saved);
        if (c->file)
            fclose(c->file);
        c->file = NULL;
        return 0;
    }
    return 1;
}

/* The text captured (the caller frees it), or NULL. */
static char *capture_end(capture *c)
{
    if (!c->file)
        return NULL;
    fflush(stderr);
    dup2(c->saved, 2);
    close(c->saved);
    long size = ftell(c->file);
    char *text = size >= 0 ? calloc(1, (size_t)size + 1) : NULL;
    rewind(c->file);
    if (text && fread(text, 1, (size_t)size, c->file) != (size_t)size) {
        free(text);
        text = NULL;
    }
    fclose(c->file);
    return text;
}

static int count_of(const char *text, const char *needle)
{
    int k = 0;
    for (const char *p = text; p && (p = strstr(p, needle)) != NULL; p += strlen(needle))
        k++;
    return k;
}

#define NCCL_NOTE "no NCCL communicator"

/* One all-reduce of `n` floats, called the way ch_reducer calls it:
 * replica i on devs[i] (a device may be listed several times) and on a
 * stream of its own. */
typedef struct areduce {
    int count;
    int64_t n;
    char label[96];
    ch_stream *stream[MAX_CUDA];
    ch_tensor *t[MAX_CUDA];
    float *x[MAX_CUDA];
} areduce;

static void areduce_free(areduce *r)
{
    for (int i = 0; i < r->count; i++) {
        ch_tensor_free(r->t[i]);
        ch_stream_free(r->stream[i]);
        free(r->x[i]);
    }
}

static int areduce_make(areduce *r, ch_device *const *devs, int count, int64_t n)
{
    memset(r, 0, sizeof *r);
    r->n = n;
    for (int i = 0; i < count; i++) {
        size_t len = strlen(r->label);
        snprintf(r->label + len, sizeof r->label - len, "%s%s", i ? "," : "", ch_device_id(devs[i]));
    }
    int64_t shape[1] = {n};
    for (int i = 0; i < count; i++) {
        r->count = i + 1;
        if (!(r->x[i] = random_floats(n, 101 + (uint64_t)i)) ||
            !tap_status_ok(ch_stream_new(&r->stream[i], devs[i]), "ch_stream_new on %s",
                           ch_device_id(devs[i])) ||
            !(r->t[i] = upload(devs[i], 1, shape, NULL)))
            return 0;
    }
    return 1;
}

/* Upload the inputs, reduce, wait; the results downloaded into got[]. */
static int areduce_run(areduce *r, float **got)
{
    const ch_backend_i *be = r->t[0]->dev->be->iface;
    void *streams[MAX_CUDA];
    ch_bmem bufs[MAX_CUDA];
    for (int i = 0; i < r->count; i++) {
        if (!tap_status_ok(ch_tensor_upload(r->t[i], r->x[i], (size_t)r->n * 4), "upload"))
            return 0;
        streams[i] = r->stream[i]->handle;
        bufs[i] = bmem_of(r->t[i]);
    }
    ch_status st = be->allreduce_sum(r->count, streams, bufs, r->n);
    for (int i = 0; i < r->count && st == CH_OK; i++)
        st = ch_stream_sync(r->stream[i]);
    if (!tap_status_ok(st, "allreduce_sum over {%s}, %" PRId64 " floats", r->label, r->n))
        return 0;
    for (int i = 0; i < r->count; i++)
        if (!(got[i] = download(r->t[i])))
            return 0;
    return 1;
}

/* Every replica holds the sum (to float rounding: |error| <= count * eps *
 * sum |x|), the same bits as replica 0, and the same bits as a second run.
 * The message shows the first sum off, or else the closest to its bound. */
static void areduce_check(const areduce *r, float *const *got, float *const *again)
{
    int64_t bad = 0, shown = 0;
    double shown_want = 0.0, shown_tol = 0.0, closest = -1.0;
    for (int64_t k = 0; k < r->n; k++) {
        double want = 0.0, mag = 0.0;
        for (int i = 0; i < r->count; i++) {
            want += r->x[i][k];
            mag += fabs(r->x[i][k]);
        }
        double err = fabs(got[0][k] - want), tol = r->count * 1.2e-7 * mag;
        int off = !(err <= tol);
        if ((off && bad++ == 0) || (!bad && err > closest * tol)) {
            shown = k;
            shown_want = want;
            shown_tol = tol;
            closest = tol > 0.0 ? err / tol : 0.0;
        }
    }
    tap_ok(bad == 0, "allreduce_sum over {%s}: %" PRId64 " of %" PRId64 " sums off (element %"
           PRId64 ": got %.9g, want %.9g +- %.3g)", r->label, bad, r->n, shown, got[0][shown],
           shown_want, shown_tol);
    int differ = 0;
    for (int i = 1; i < r->count; i++)
        differ += memcmp(got[i], got[0], (size_t)r->n * 4) != 0;
    tap_ok(differ == 0, "allreduce_sum over {%s}: %d of %d replicas differ in bits from the "
           "first", r->label, differ, r->count - 1);
    tap_ok(memcmp(again[0], got[0], (size_t)r->n * 4) == 0,
           "allreduce_sum over {%s}: the same bits twice", r->label);
}

/* The case, run twice; what the module said on stderr meanwhile is
 * returned (the caller frees it). */
static char *test_allreduce(ch_device *const *devs, int count, int64_t n)
{
    areduce r;
    float *got[MAX_CUDA] = {0}, *again[MAX_CUDA] = {0};
    capture cap;
    int captured = capture_begin(&cap);
    int ok = areduce_make(&r, devs, count, n) && areduce_run(&r, got) && areduce_run(&r, again);
    char *said = captured ? capture_end(&cap) : NULL;
    if (!captured)
        tap_diag("stderr not captured: %s", strerror(errno));
    if (said && *said)
        tap_diag("stderr: %s", said);
    if (ok)
        areduce_check(&r, got, again);
    for (int i = 0; i < r.count; i++) {
        free(got[i]);
        free(again[i]);
    }
    areduce_free(&r);
    return said;
}

/* Lists that reach every path: two and three replicas on one device (the
 * sum on the device, then NCCL's one-rank communicator), every device
 * once, every device twice, and the devices in reverse order with a
 * growing buffer (the first stream's scratch, grown while another device
 * is current). */
typedef struct rlist {
    ch_device *dev[MAX_CUDA];
    int n;
} rlist;

static int make_lists(rlist *out, ch_device *const *devs, int count)
{
    int k = 0;
    for (int rep = 2; rep <= 3; rep++, k++) {
        out[k].n = rep;
        for (int i = 0; i < rep; i++)
            out[k].dev[i] = devs[0];
    }
    if (count < 2)
        return k;
    int once = count < MAX_CUDA / 2 ? count : MAX_CUDA / 2;
    out[k].n = once;
    out[k + 1].n = 2 * once;
    out[k + 2].n = once;
    for (int i = 0; i < once; i++) {
        out[k].dev[i] = devs[i];
        out[k + 1].dev[2 * i] = out[k + 1].dev[2 * i + 1] = devs[i];
        out[k + 2].dev[i] = devs[once - 1 - i];
    }
    return k + 3;
}

/* Every list, under the NCCL mode the backend was started with; returns
 * how many notes of a fallback from NCCL stderr showed. */
static int test_allreduce_lists(ch_device *const *devs, int count)
{
    rlist lists[5];
    int nlists = make_lists(lists, devs, count);
    int notes = 0;
    for (int l = 0; l < nlists; l++) {
        int64_t n = l == nlists - 1 && count >= 2 ? 3000017 : 100003;
        char *said = test_allreduce(lists[l].dev, lists[l].n, n);
        notes += count_of(said, NCCL_NOTE);
        free(said);
    }
    return notes;
}

static int cuda_devices(ch_device **devs)
{
    int count = 0;
    for (int i = 0; i < ch_device_count() && count < MAX_CUDA; i++) {
        ch_device *d;
        if (ch_device_get(&d, i) == CH_OK && strncmp(ch_device_id(d), "cuda:", 5) == 0)
            devs[count++] = d;
    }
    return count;
}

/* Restart the library with CHORUS_CUDA_NCCL=mode: 1 when it finds `want`
 * CUDA devices again. */
static int restart_with(const char *mode, ch_device **devs, int want)
{
    ch_shutdown();
    if (setenv("CHORUS_CUDA_NCCL", mode, 1) != 0 ||
        !tap_status_ok(ch_init(), "ch_init with CHORUS_CUDA_NCCL=%s", mode))
        return 0;
    int count = cuda_devices(devs);
    return tap_ok(count == want, "CHORUS_CUDA_NCCL=%s: %d CUDA devices after a restart, want %d",
                  mode, count, want);
}

/* The default run: NCCL where the module has it. A one-rank communicator
 * can be made wherever NCCL works at all, so on one GPU no fallback is
 * allowed; with several, a VM without peer access or shared memory may
 * legitimately fall back, and the notes are only shown. */
static void test_allreduce_default(ch_device *const *devs, int count)
{
    int notes = test_allreduce_lists(devs, count);
    if (count < 2)
        tap_ok(notes == 0, "one GPU, CHORUS_CUDA_NCCL %s: %d notes of a fallback from NCCL, "
               "want 0", getenv("CHORUS_CUDA_NCCL") ? "set" : "unset", notes);
    else
        tap_diag("%d GPUs: %d notes of a fallback from NCCL", count, notes);
}

/* The fallback from NCCL, forced, and the peer path alone: the same sums,
 * and a note only where the module has NCCL to fall back from, once per
 * device list NCCL would have had: {0} (one GPU, or replicas sharing it),
 * then with several GPUs every device once, and in reverse order. */
static void test_allreduce_modes(int count)
{
    ch_device *devs[MAX_CUDA];
#ifndef CHI_TEST_HOOKS
    tap_skip("CHORUS_CUDA_NCCL=fail: a test hook, in test builds only (tests/gpu/check.sh)");
#else
#ifdef CH_TEST_HAVE_NCCL
    int want = count < 2 ? 1 : 3;
#else
    int want = 0;
    tap_diag("module built without NCCL: CHORUS_CUDA_NCCL=fail has nothing to fall back from");
#endif
    if (restart_with("fail", devs, count)) {
        int notes = test_allreduce_lists(devs, count);
        tap_ok(notes == want, "CHORUS_CUDA_NCCL=fail: %d notes of the fallback to peer copies "
               "on stderr, want %d (one per device list)", notes, want);
    }
#endif
    if (restart_with("off", devs, count)) {
        int notes = test_allreduce_lists(devs, count);
        tap_ok(notes == 0, "CHORUS_CUDA_NCCL=off: %d notes of a fallback, want 0", notes);
    }
    unsetenv("CHORUS_CUDA_NCCL");
}

/* A mistyped CHORUS_CUDA_NCCL makes the backend unavailable, saying why
 * (checked before the driver is asked, so this runs without a GPU too);
 * the library starts and the host still works. */
static void test_bad_nccl_mode(void)
{
#ifdef CH_TEST_HAVE_CUDA
    ch_device *devs[MAX_CUDA];
    ch_backend_info cu;
    if (restart_with("nccl", devs, 0))
        tap_ok(find_backend("cuda", &cu) && !cu.available && strstr(cu.detail, "CHORUS_CUDA_NCCL"),
               "CHORUS_CUDA_NCCL=nccl: cuda unavailable, saying why: \"%s\"", cu.detail);
#ifndef CHI_TEST_HOOKS
    /* The test hook is not in the installed module. */
    if (restart_with("fail", devs, 0))
        tap_ok(find_backend("cuda", &cu) && !cu.available && strstr(cu.detail, "on or off"),
               "CHORUS_CUDA_NCCL=fail outside a test build: cuda unavailable, saying why: "
               "\"%s\"", cu.detail);
#endif
    ch_device *host = NULL;
    tap_status_ok(ch_device_by_name(&host, "host"), "host device with cuda refused");
    unsetenv("CHORUS_CUDA_NCCL");
#else
    tap_skip("CHORUS_CUDA_NCCL: the cuda module is not built");
#endif
}

static void test_peer(ch_device *src, ch_device *dst)
{
    const int64_t n = 3 * 1000003;
    float *x = random_floats(n, 23);
    int64_t shape[1] = {n};
    ch_tensor *a = upload(src, 1, shape, x), *b = upload(dst, 1, shape, NULL);
    ch_transfer_stats t0 = {0}, t1 = {0};
    ch_device_transfer_stats(dst, &t0);
    float *y = NULL;
    if (a && b && tap_status_ok(ch_copy(b, a), "ch_copy %s -> %s", ch_device_id(src),
                                ch_device_id(dst)))
        y = download(b);
    ch_device_transfer_stats(dst, &t1);
    uint64_t peer0 = t0.peer_copies, staged0 = t0.staged_copies;
    uint64_t peer1 = t1.peer_copies, staged1 = t1.staged_copies;
    tap_ok(y && memcmp(x, y, (size_t)n * 4) == 0, "copy %s -> %s is exact", ch_device_id(src),
           ch_device_id(dst));
    int can = ch_device_can_peer(src, dst);
    tap_ok(can ? peer1 == peer0 + 1 : staged1 == staged0 + 1,
           "copy %s -> %s took the %s path (peer %" PRIu64 " -> %" PRIu64 ", staged %" PRIu64
           " -> %" PRIu64 ")", ch_device_id(src), ch_device_id(dst), can ? "peer" : "staged",
           peer0, peer1, staged0, staged1);
    free(y);
    free(x);
    ch_tensor_free(a);
    ch_tensor_free(b);
}

/* ---- main ------------------------------------------------------------------ */

/* ch_device_counters: three GEMMs and two fills since the start count 3
 * GEMMs and at least 5 launches; timed, their seconds are > 0; untimed,
 * < 0; a new start counts from zero again. */
static void test_counters(ch_device *dev)
{
    const char *id = ch_device_id(dev);
    int64_t s[2] = {256, 256};
    ch_tensor *a = NULL, *b = NULL, *c = NULL;
    ch_status st = ch_tensor_new(&a, dev, CH_F32, 2, s);
    if (st == CH_OK)
        st = ch_tensor_new(&b, dev, CH_F32, 2, s);
    if (st == CH_OK)
        st = ch_tensor_new(&c, dev, CH_F32, 2, s);
    for (int timed = 1; timed >= 0 && st == CH_OK; timed--) {
        ch_device_counters k = {0};
        st = ch_device_counters_start(dev, timed);
        if (st == CH_OK)
            st = ch_fill(a, 1.0);
        if (st == CH_OK)
            st = ch_fill(b, 0.5);
        for (int i = 0; i < 3 && st == CH_OK; i++)
            st = ch_gemm(c, 0, 0, 1.0f, a, b, 0.0f);
        if (st == CH_OK)
            st = ch_device_counters_read(dev, &k);
        tap_ok(st == CH_OK && k.gemms == 3 && k.launches >= 5 &&
                   (timed ? k.gemm_seconds > 0.0 : k.gemm_seconds < 0.0),
               "%s: counters%s: %llu launches, %llu GEMMs, %g s in them (%s)", id,
               timed ? " with GEMM times" : "", (unsigned long long)k.launches,
               (unsigned long long)k.gemms, k.gemm_seconds, st == CH_OK ? "ok" : ch_last_error());
    }
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_tensor_free(c);
}

/* The fused products: cuBLASLt's epilogues run each as one library call
 * (one launch, one GEMM in the counters), where the composition would
 * add a bias and an activation kernel. ch_gemm_bias with half inputs
 * into an f32 or half c, and ch_gemm_bias_act with CH_ACT_GELU_TANH (pre
 * kept or not) are fused; CH_ACT_GELU, exact, never is (cuBLASLt's GELU
 * is the tanh form), nor a kept pre whose rows are not a multiple of 8
 * elements. Their values are test-ops' (every device against a double
 * reference); this says which path ran. */
static void test_fused(ch_device *dev, ch_dtype half)
{
    const char *id = ch_device_id(dev), *hn = ch_dtype_name(half);
    int64_t sx[2] = {64, 48}, sw[2] = {256, 48}, sy[2] = {64, 256}, sb[1] = {256};
    int64_t sw7[2] = {252, 48}, sy7[2] = {64, 252}, sb7[1] = {252};
    ch_tensor *x32 = NULL, *w32 = NULL, *x = NULL, *w = NULL, *w7 = NULL, *w7_32 = NULL,
              *bias = NULL, *bias7 = NULL, *y32 = NULL, *yh = NULL, *pre = NULL, *y7 = NULL,
              *pre7 = NULL;
    ch_status st = ch_tensor_new(&x32, dev, CH_F32, 2, sx);
    if (st == CH_OK)
        st = ch_tensor_new(&w32, dev, CH_F32, 2, sw);
    if (st == CH_OK)
        st = ch_tensor_new(&w7_32, dev, CH_F32, 2, sw7);
    if (st == CH_OK)
        st = ch_tensor_new(&x, dev, half, 2, sx);
    if (st == CH_OK)
        st = ch_tensor_new(&w, dev, half, 2, sw);
    if (st == CH_OK)
        st = ch_tensor_new(&w7, dev, half, 2, sw7);
    if (st == CH_OK)
        st = ch_tensor_new(&bias, dev, CH_F32, 1, sb);
    if (st == CH_OK)
        st = ch_tensor_new(&bias7, dev, CH_F32, 1, sb7);
    if (st == CH_OK)
        st = ch_tensor_new(&y32, dev, CH_F32, 2, sy);
    if (st == CH_OK)
        st = ch_tensor_new(&yh, dev, half, 2, sy);
    if (st == CH_OK)
        st = ch_tensor_new(&pre, dev, half, 2, sy);
    if (st == CH_OK)
        st = ch_tensor_new(&y7, dev, half, 2, sy7);
    if (st == CH_OK)
        st = ch_tensor_new(&pre7, dev, half, 2, sy7);
    if (st == CH_OK)
        st = ch_rand_uniform(x32, 1, 0, -1.0f, 1.0f);
    if (st == CH_OK)
        st = ch_rand_uniform(w32, 2, 0, -1.0f, 1.0f);
    if (st == CH_OK)
        st = ch_rand_uniform(w7_32, 3, 0, -1.0f, 1.0f);
    if (st == CH_OK)
        st = ch_rand_uniform(bias, 4, 0, -1.0f, 1.0f);
    if (st == CH_OK)
        st = ch_rand_uniform(bias7, 5, 0, -1.0f, 1.0f);
    if (st == CH_OK)
        st = ch_cast(x, x32);
    if (st == CH_OK)
        st = ch_cast(w, w32);
    if (st == CH_OK)
        st = ch_cast(w7, w7_32);
    if (st == CH_OK)
        st = ch_device_sync(dev);
    if (!tap_status_ok(st, "%s: %s tensors for the fused products", id, hn))
        goto out;
    for (int k = 0; k < 6; k++) {
        static const char *what[] = {"ch_gemm_bias into f32",
                                     "ch_gemm_bias into the inputs' format",
                                     "ch_gemm_bias_act gelu_tanh, pre kept",
                                     "ch_gemm_bias_act gelu_tanh into f32",
                                     "ch_gemm_bias_act gelu (exact: not cuBLASLt's)",
                                     "ch_gemm_bias_act gelu_tanh, pre kept, rows of 252 elements"};
        ch_device_counters c = {0};
        st = ch_device_counters_start(dev, 0);
        /* twice: the second from the stream's kept heuristic answer */
        for (int rep = 0; rep < 2 && st == CH_OK; rep++)
            st = k == 0   ? ch_gemm_bias(y32, 0, 1, 1.0f, x, w, bias)
                 : k == 1 ? ch_gemm_bias(yh, 0, 1, 1.0f, x, w, bias)
                 : k == 2 ? ch_gemm_bias_act(yh, pre, 0, 1, 1.0f, x, w, bias, CH_ACT_GELU_TANH)
                 : k == 3 ? ch_gemm_bias_act(y32, NULL, 0, 1, 0.5f, x, w, bias, CH_ACT_GELU_TANH)
                 : k == 4 ? ch_gemm_bias_act(yh, pre, 0, 1, 1.0f, x, w, bias, CH_ACT_GELU)
                          : ch_gemm_bias_act(y7, pre7, 0, 1, 1.0f, x, w7, bias7, CH_ACT_GELU_TANH);
        if (st == CH_OK)
            st = ch_device_sync(dev);
        if (st == CH_OK)
            st = ch_device_counters_read(dev, &c);
        /* composed: the product (its bias fused) and the activation's
         * launches */
        int fused = k < 4;
        tap_ok(st == CH_OK && c.gemms == 2 && (fused ? c.launches == 2 : c.launches >= 4),
               "%s: %s with %s inputs, twice: %s (%llu launches, %llu GEMMs; %s)", id, what[k], hn,
               fused ? "one cuBLASLt call each" : "composed", (unsigned long long)c.launches,
               (unsigned long long)c.gemms, st == CH_OK ? "ok" : ch_last_error());
    }
out:
    ch_tensor_free(x32), ch_tensor_free(w32), ch_tensor_free(w7_32), ch_tensor_free(x);
    ch_tensor_free(w), ch_tensor_free(w7), ch_tensor_free(bias), ch_tensor_free(bias7);
    ch_tensor_free(y32), ch_tensor_free(yh), ch_tensor_free(pre), ch_tensor_free(y7);
    ch_tensor_free(pre7);
}

static void test_device(ch_device *dev)
{
    test_info(dev);
    test_roundtrip(dev, 1);
    test_roundtrip(dev, 1000003);
    test_async(dev);
    test_sum(dev, 1, 3000017, 1);
    test_sum(dev, 3, 100003, 5);
    test_sum(dev, 2, 50000, 40);
    test_bias_grad(dev, 100003, 3, 1);
    test_bias_grad(dev, 7, 5, 30011);
    test_bias_grad(dev, 64, 16, 1024);
    test_softmax_rows(dev, 20011, 10);
    test_gemm_streams(dev, 1024, 1024, 1024);
    test_gemm_streams(dev, 64, 65536, 64);
    test_counters(dev);
    test_fused(dev, CH_BF16);
    test_fused(dev, CH_F16);
    test_oom(dev);
}

int main(void)
{
    if (!tap_status_ok(ch_init(), "ch_init"))
        return tap_done();
    ch_backend_info cu;
    if (!find_backend("cuda", &cu)) {
        tap_ok(0, "the cuda backend is registered");
        return tap_done();
    }
    if (!cu.available) {
        test_unavailable(&cu);
        tap_skip("no CUDA device (%s)", cu.detail);
        test_bad_nccl_mode();
        ch_shutdown();
        return tap_done();
    }
    ch_device *devs[MAX_CUDA];
    int count = cuda_devices(devs);
    tap_ok(count == cu.device_count || getenv("CHORUS_DEVICES"),
           "every CUDA device is visible: %d of %d", count, cu.device_count);
    for (int i = 0; i < count; i++)
        test_device(devs[i]);
    if (count < 2)
        tap_skip("peer copies: %d CUDA device", count);
    for (int i = 0; i < count; i++)
        for (int j = 0; j < count; j++)
            if (i != j)
                test_peer(devs[i], devs[j]);
    if (count > 0) {
        test_allreduce_default(devs, count);
        test_allreduce_modes(count);
    }
    test_bad_nccl_mode();
    ch_shutdown();
    return tap_done();
}
