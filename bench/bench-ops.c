/* bench-ops: what the primitive ops reach on every device, next to the
 * references measured in the same run: the host's GEMM library (oneDNN's
 * dnnl_sgemm or OpenBLAS's cblas_sgemm) called directly and the host's blocked C GEMM.
 *
 * Per device: SGEMM GFLOP/s (square, no transpose), the same product with
 * bf16 and f16 inputs (f32 sums, an f32 result), GB/s of add, scale
 * (axpby) and relu; per pair of non-host devices the ch_copy bandwidth;
 * per non-host device upload and download from pageable and pinned memory;
 * per device the calls of the training step's smaller ops (the bias
 * gradient, the embedding and its backward, the softmax loss with its
 * backward, LayerNorm's backward, a channel's sums) in microseconds.
 * Every number is the median of several timed runs after a warm-up, each
 * run ending with a device synchronisation.
 *
 *   bench-ops [--sizes 256,512,1024] [--devices LIST] [--quick] [--train-ops] [--json] */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "refgemm.h"

#include <chorus.h>
#include "host.h"

#define MAX_SIZES 16
#define MAX_DEVICES 64
#define MAX_ROWS 1024

typedef struct options {
    int sizes[MAX_SIZES];
    int nsizes;
    const char *devices; /* NULL: every visible device */
    int quick;
    int train_ops; /* the training ops alone */
    int json;
} options;

typedef struct result {
    char device[32];
    char what[48];
    long long size;      /* matrix side, or elements, or bytes */
    double value;
    const char *unit;
} result;

static result results[MAX_ROWS];
static int nresults;
static int failures;

/* ---- timing ---------------------------------------------------------------- */

typedef ch_status (*work_fn)(void *arg);

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct work {
    work_fn fn;
    void *arg;
    double secs; /* the median */
} work;

/* The median times of `count` works run in turns (a, b, a, b, ...) after
 * `warm` untimed turns: a change in the machine's load then hits them
 * alike, and the first touch of memory or a kernel build is not timed. */
static ch_status time_medians(work *w, int count, int warm, int reps)
{
    double t[4][32];
    for (int i = 0; i < warm + reps; i++)
        for (int k = 0; k < count; k++) {
            double t0 = ch_clock_seconds();
            ch_status st = w[k].fn(w[k].arg);
            if (st != CH_OK)
                return st;
            if (i >= warm)
                t[k][i - warm] = ch_clock_seconds() - t0;
        }
    for (int k = 0; k < count; k++) {
        qsort(t[k], (size_t)reps, sizeof t[k][0], cmp_double);
        w[k].secs = t[k][reps / 2];
    }
    return CH_OK;
}

static ch_status time_median(work_fn fn, void *arg, int warm, int reps, double *secs)
{
    work w = {fn, arg, 0.0};
    ch_status st = time_medians(&w, 1, warm, reps);
    *secs = w.secs;
    return st;
}

static void add_result(const char *device, const char *what, long long size,
                       double value, const char *unit)
{
    if (nresults == MAX_ROWS)
        return;
    result *r = &results[nresults++];
    snprintf(r->device, sizeof r->device, "%s", device);
    snprintf(r->what, sizeof r->what, "%s", what);
    r->size = size;
    r->value = value;
    r->unit = unit;
}

/* A failed measurement is reported and skipped; the run goes on. */
static int check(ch_status st, const char *fmt, ...)
{
    if (st == CH_OK)
        return 1;
    va_list ap;
    fprintf(stderr, "bench-ops: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, ": %s: %s\n", ch_status_str(st), ch_last_error());
    failures++;
    return 0;
}

static int reps_for(const options *o)
{
    return o->quick ? 3 : 7;
}

/* ---- tensors ---------------------------------------------------------------- */

static ch_status tensor_1d(ch_tensor **t, ch_device *dev, int64_t n, uint64_t seed)
{
    ch_status st = ch_tensor_new(t, dev, CH_F32, 1, &n);
    if (st == CH_OK)
        st = ch_rand_uniform(*t, seed, 0, -1.0f, 1.0f);
    return st;
}

static ch_status tensor_square(ch_tensor **t, ch_device *dev, int64_t side,
                               uint64_t seed)
{
    int64_t shape[2] = {side, side};
    ch_status st = ch_tensor_new(t, dev, CH_F32, 2, shape);
    if (st == CH_OK)
        st = ch_rand_uniform(*t, seed, 0, -1.0f, 1.0f);
    return st;
}

/* ---- host references: the GEMM library and the blocked C GEMM --------------------- */

#define BLOCKED_NAME "blocked C sgemm"

typedef struct ref_work {
    int blocked; /* 0: the library's sgemm */
    int n;
    float *a, *b, *c;
} ref_work;

static ch_status ref_run(void *arg)
{
    ref_work *w = arg;
#ifdef HAVE_REF_GEMM
    if (!w->blocked) {
        ref_sgemm(0, 0, w->n, w->n, w->n, 1.0f, w->a, w->n, w->b, w->n, 0.0f, w->c, w->n);
        return CH_OK;
    }
#endif
    return chi_host_sgemm_blocked(0, 0, w->n, w->n, w->n, 1.0f, w->a, w->n, w->b, w->n,
                                  0.0f, w->c, w->n);
}

static void ref_free(ref_work *w)
{
    free(w->a);
    free(w->b);
    free(w->c);
}

/* n x n operands in host memory, filled. */
static int ref_new(ref_work *w, int blocked, int n)
{
    size_t nn = (size_t)n * (size_t)n;
    *w = (ref_work){blocked, n, malloc(nn * sizeof(float)), malloc(nn * sizeof(float)),
                    malloc(nn * sizeof(float))};
    if (!w->a || !w->b || !w->c) {
        fprintf(stderr, "bench-ops: malloc for %d x %d matrices failed\n", n, n);
        failures++;
        ref_free(w);
        return 0;
    }
    for (size_t i = 0; i < nn; i++) {
        w->a[i] = (float)(i % 17) * 0.0625f - 0.5f;
        w->b[i] = (float)(i % 13) * 0.0625f - 0.375f;
        w->c[i] = 0.0f;
    }
    return 1;
}

static void bench_reference(int blocked, const char *name, const options *o)
{
    for (int s = 0; s < o->nsizes; s++) {
        ref_work w;
        double secs;
        double n = o->sizes[s];
        if (!ref_new(&w, blocked, o->sizes[s]))
            continue;
        if (check(time_median(ref_run, &w, 2, reps_for(o), &secs), "%s %d", name,
                  o->sizes[s]))
            add_result("host", name, o->sizes[s], 2.0 * n * n * n / secs * 1e-9,
                       "GFLOP/s");
        ref_free(&w);
    }
}

/* ---- GEMM through the op ------------------------------------------------------ */

typedef struct gemm_work {
    ch_device *dev;
    ch_tensor *a, *b, *c;
} gemm_work;

static ch_status gemm_run(void *arg)
{
    gemm_work *w = arg;
    ch_status st = ch_gemm(w->c, 0, 0, 1.0f, w->a, w->b, 0.0f);
    return st == CH_OK ? ch_device_sync(w->dev) : st;
}

/* On the host with a GEMM library, the op and the library's sgemm run in
 * turns: the op/library ratio then compares like with like. */
static int pairs_with_library(ch_device *dev)
{
#ifdef HAVE_REF_GEMM
    return !strcmp(ch_device_id(dev), "host");
#else
    (void)dev;
    return 0;
#endif
}

static void bench_gemm_size(ch_device *dev, int64_t n, const options *o)
{
    const char *id = ch_device_id(dev);
    gemm_work g = {dev, NULL, NULL, NULL};
    ref_work r = {0, 0, NULL, NULL, NULL};
    work w[2] = {{gemm_run, &g, 0.0}, {ref_run, &r, 0.0}};
    int count = pairs_with_library(dev) && ref_new(&r, 0, (int)n) ? 2 : 1;
    double flop = 2.0 * (double)n * (double)n * (double)n;
    if (check(tensor_square(&g.a, dev, n, 1), "%s: %lldx%lld tensor", id, (long long)n,
              (long long)n) &&
        check(tensor_square(&g.b, dev, n, 2), "%s: tensor", id) &&
        check(tensor_square(&g.c, dev, n, 3), "%s: tensor", id) &&
        check(time_medians(w, count, 2, reps_for(o)), "%s: sgemm %lld", id,
              (long long)n)) {
        add_result(id, "sgemm", n, flop / w[0].secs * 1e-9, "GFLOP/s");
        if (count == 2)
            add_result("host", REF_GEMM_NAME, n, flop / w[1].secs * 1e-9, "GFLOP/s");
    }
    ch_tensor_free(g.a);
    ch_tensor_free(g.b);
    ch_tensor_free(g.c);
    ref_free(&r);
}

/* The same square product with bf16 or f16 a and b and an f32 c (f32
 * sums): "bf16 gemm" and "f16 gemm" rows beside "sgemm". */
static void bench_gemm_half(ch_device *dev, ch_dtype dt, int64_t n, const options *o)
{
    const char *id = ch_device_id(dev);
    const char *name = dt == CH_BF16 ? "bf16 gemm" : "f16 gemm";
    gemm_work g = {dev, NULL, NULL, NULL};
    work w[1] = {{gemm_run, &g, 0.0}};
    ch_tensor *fa = NULL, *fb = NULL;
    int64_t shape[2] = {n, n};
    double flop = 2.0 * (double)n * (double)n * (double)n;
    if (check(tensor_square(&fa, dev, n, 1), "%s: %lldx%lld tensor", id, (long long)n,
              (long long)n) &&
        check(tensor_square(&fb, dev, n, 2), "%s: tensor", id) &&
        check(tensor_square(&g.c, dev, n, 3), "%s: tensor", id) &&
        check(ch_tensor_new(&g.a, dev, dt, 2, shape), "%s: %s tensor", id, name) &&
        check(ch_tensor_new(&g.b, dev, dt, 2, shape), "%s: %s tensor", id, name) &&
        check(ch_cast(g.a, fa), "%s: cast", id) && check(ch_cast(g.b, fb), "%s: cast", id) &&
        check(time_medians(w, 1, 2, reps_for(o)), "%s: %s %lld", id, name, (long long)n))
        add_result(id, name, n, flop / w[0].secs * 1e-9, "GFLOP/s");
    ch_tensor_free(fa);
    ch_tensor_free(fb);
    ch_tensor_free(g.a);
    ch_tensor_free(g.b);
    ch_tensor_free(g.c);
}

static void bench_gemm(ch_device *dev, const options *o)
{
    for (int s = 0; s < o->nsizes; s++) {
        bench_gemm_size(dev, o->sizes[s], o);
        bench_gemm_half(dev, CH_BF16, o->sizes[s], o);
        bench_gemm_half(dev, CH_F16, o->sizes[s], o);
    }
}

/* ---- elementwise ops ------------------------------------------------------------ */

typedef enum ew_kind { EW_ADD, EW_SCALE, EW_RELU } ew_kind;

typedef struct ew_work {
    ch_device *dev;
    ew_kind kind;
    ch_tensor *y, *a, *b;
} ew_work;

static ch_status ew_run(void *arg)
{
    ew_work *w = arg;
    ch_status st;
    switch (w->kind) {
    case EW_ADD:
        st = ch_add(w->y, w->a, w->b);
        break;
    case EW_SCALE:
        st = ch_scale(w->y, w->a, 0.5f);
        break;
    default:
        st = ch_activation_forward(w->y, w->a, CH_ACT_RELU);
        break;
    }
    return st == CH_OK ? ch_device_sync(w->dev) : st;
}

static void bench_elementwise(ch_device *dev, const options *o)
{
    static const struct {
        ew_kind kind;
        const char *name;
        int streams; /* arrays read or written, 4 bytes per element each */
    } ops[] = {{EW_ADD, "add", 3}, {EW_SCALE, "scale (axpby)", 2}, {EW_RELU, "relu", 2}};
    const char *id = ch_device_id(dev);
    int64_t n = o->quick ? (int64_t)4 << 20 : (int64_t)16 << 20;
    ew_work w = {dev, EW_ADD, NULL, NULL, NULL};
    if (check(tensor_1d(&w.y, dev, n, 4), "%s: %lld-element tensor", id, (long long)n) &&
        check(tensor_1d(&w.a, dev, n, 5), "%s: tensor", id) &&
        check(tensor_1d(&w.b, dev, n, 6), "%s: tensor", id))
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
            double secs;
            w.kind = ops[i].kind;
            if (check(time_median(ew_run, &w, 2, reps_for(o), &secs), "%s: %s", id,
                      ops[i].name))
                add_result(id, ops[i].name, n, 4.0 * ops[i].streams * n / secs * 1e-9,
                           "GB/s");
        }
    ch_tensor_free(w.y);
    ch_tensor_free(w.a);
    ch_tensor_free(w.b);
}

/* ---- the training step's smaller ops ------------------------------------------ */

typedef enum train_op {
    TR_BIAS_GRAD,
    TR_BIAS_GRAD_CONV,
    TR_EMBEDDING,
    TR_EMBEDDING_BACKWARD,
    TR_XENT,
    TR_LAYERNORM_BACKWARD,
    TR_CHANNEL_SUMS,
    TR_COUNT
} train_op;

/* Shapes of a GPT step (batch 64 x context 64 tokens, width 256, a
 * vocabulary of 8192) and a convolution's [64, 64, 32 x 32]. */
#define TR_ROWS 4096
#define TR_WIDTH 256
#define TR_VOCAB 8192

typedef struct train_work {
    ch_device *dev;
    train_op op;
    ch_tensor *rows, *drows, *dx, *conv, *vec, *vec2, *gamma, *cvec, *table, *dtable, *idx, *logits,
        *probs, *labels, *loss, *stat, *stat2, *sums;
} train_work;

static ch_status train_run(void *arg)
{
    train_work *w = arg;
    ch_status st;
    switch (w->op) {
    case TR_BIAS_GRAD: st = ch_bias_grad(w->vec, w->drows, 1, 0.0f); break;
    case TR_BIAS_GRAD_CONV: st = ch_bias_grad(w->cvec, w->conv, 1, 0.0f); break;
    case TR_EMBEDDING: st = ch_embedding(w->rows, w->table, w->idx); break;
    case TR_EMBEDDING_BACKWARD: st = ch_embedding_backward(w->dtable, w->drows, w->idx); break;
    case TR_XENT:
        st = ch_softmax_xent(w->loss, w->probs, w->logits, w->labels);
        if (st == CH_OK)
            st = ch_softmax_xent_backward(w->logits, w->probs, w->labels, 1.0f);
        break;
    case TR_LAYERNORM_BACKWARD:
        st = ch_layernorm_backward(w->dx, w->vec, w->vec2, w->drows, w->rows, w->stat, w->stat2,
                                   w->gamma);
        break;
    default: st = ch_channel_sums(w->sums, w->conv, NULL, w->conv, NULL); break;
    }
    return st == CH_OK ? ch_device_sync(w->dev) : st;
}

static void train_free(train_work *w)
{
    ch_tensor *all[] = {w->rows,  w->drows,  w->dx,    w->conv,   w->vec,   w->vec2,
                        w->gamma, w->cvec,   w->table, w->dtable, w->idx,   w->logits,
                        w->probs, w->labels, w->loss,  w->stat,   w->stat2, w->sums};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        ch_tensor_free(all[i]);
}

/* Integers in [0, bound) in a new i32 tensor of n elements. */
static ch_status ints_new(ch_tensor **t, ch_device *dev, int64_t n, int32_t bound)
{
    int32_t *v = malloc((size_t)n * sizeof *v);
    if (!v)
        return CH_ERR_OUT_OF_MEMORY;
    uint32_t x = 12345;
    for (int64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        v[i] = (int32_t)((x >> 8) % (uint32_t)bound);
    }
    ch_status st = ch_tensor_new(t, dev, CH_I32, 1, &n);
    if (st == CH_OK)
        st = ch_tensor_upload(*t, v, (size_t)n * sizeof *v);
    free(v);
    return st;
}

/* A new f32 tensor, uniform in [lo, hi) drawn with `seed` where lo < hi,
 * else every element lo. */
static ch_status f32_new(ch_tensor **t, ch_device *dev, int ndim, const int64_t *shape,
                         uint64_t seed, float lo, float hi)
{
    ch_status st = ch_tensor_new(t, dev, CH_F32, ndim, shape);
    if (st == CH_OK)
        st = lo < hi ? ch_rand_uniform(*t, seed, 0, lo, hi) : ch_fill(*t, lo);
    return st;
}

static ch_status train_new(train_work *w, ch_device *dev)
{
    static const int64_t rows[2] = {TR_ROWS, TR_WIDTH}, conv[4] = {64, 64, 32, 32},
                         table[2] = {TR_VOCAB, TR_WIDTH}, vec[1] = {TR_WIDTH}, n[1] = {TR_ROWS},
                         one[1] = {1}, channels[1] = {64}, sums[1] = {2 * 64 + 1};
    *w = (train_work){.dev = dev};
    const struct {
        ch_tensor **t;
        int ndim;
        const int64_t *shape;
        float lo, hi;
    } f[] = {
        {&w->rows, 2, rows, -1, 1},   {&w->drows, 2, rows, -1, 1},   {&w->dx, 2, rows, 0, 0},
        {&w->conv, 4, conv, -1, 1},   {&w->vec, 1, vec, 1, 1},       {&w->vec2, 1, vec, 0, 0},
        {&w->gamma, 1, vec, 1, 1},    {&w->cvec, 1, channels, 0, 0}, {&w->table, 2, table, -1, 1},
        {&w->dtable, 2, table, 0, 0}, {&w->logits, 2, rows, -3, 3},  {&w->probs, 2, rows, 0, 0},
        {&w->loss, 1, one, 0, 0},     {&w->stat, 1, n, 0, 0},        {&w->stat2, 1, n, 1, 1},
        {&w->sums, 1, sums, 0, 0}};
    ch_status st = CH_OK;
    for (size_t i = 0; i < sizeof f / sizeof f[0] && st == CH_OK; i++)
        st = f32_new(f[i].t, dev, f[i].ndim, f[i].shape, 11 + i, f[i].lo, f[i].hi);
    if (st == CH_OK)
        st = ints_new(&w->idx, dev, TR_ROWS, TR_VOCAB);
    if (st == CH_OK)
        st = ints_new(&w->labels, dev, TR_ROWS, TR_WIDTH);
    return st;
}

static void bench_train_ops(ch_device *dev, const options *o)
{
    static const char *names[TR_COUNT] = {
        "bias_grad [4096,256] (us)",     "bias_grad [64,64,1024] (us)",  "embedding 4096x256 (us)",
        "embedding_backward (us)",       "softmax_xent + backward (us)", "layernorm_backward (us)",
        "channel_sums [64,64,1024] (us)"};
    const char *id = ch_device_id(dev);
    train_work w;
    if (check(train_new(&w, dev), "%s: the training ops' tensors", id))
        for (int k = 0; k < TR_COUNT; k++) {
            double secs;
            w.op = (train_op)k;
            if (check(time_median(train_run, &w, 2, reps_for(o), &secs), "%s: %s", id, names[k]))
                add_result(id, names[k],
                           k == TR_BIAS_GRAD_CONV || k == TR_CHANNEL_SUMS ? 64 * 64 * 1024
                                                                          : TR_ROWS * TR_WIDTH,
                           secs * 1e6, "us");
        }
    train_free(&w);
}

/* The value of a result, or 0 when it was not measured. */
static double find(const char *device, const char *what, long long size)
{
    for (int i = 0; i < nresults; i++)
        if (!strcmp(results[i].device, device) && !strcmp(results[i].what, what) &&
            results[i].size == size)
            return results[i].value;
    return 0.0;
}

static void add_ratio(const char *what, const char *num, const char *den, int size)
{
    double a = find("host", num, size), b = find("host", den, size);
    if (a > 0.0 && b > 0.0)
        add_result("host", what, size, a / b, "ratio");
}

/* ---- transfers ------------------------------------------------------------------- */

#define COPY_BYTES ((int64_t)64 << 20)

typedef struct copy_work {
    ch_device *src_dev, *dst_dev;
    ch_tensor *src, *dst;
} copy_work;

static ch_status copy_run(void *arg)
{
    copy_work *w = arg;
    ch_status st = ch_copy(w->dst, w->src);
    if (st == CH_OK)
        st = ch_device_sync(w->dst_dev);
    return st == CH_OK ? ch_device_sync(w->src_dev) : st;
}

static void bench_copy(ch_device *src, ch_device *dst, const options *o)
{
    char what[48];
    int64_t n = COPY_BYTES / 4;
    copy_work w = {src, dst, NULL, NULL};
    double secs;
    snprintf(what, sizeof what, "copy to %s", ch_device_id(dst));
    if (check(tensor_1d(&w.src, src, n, 7), "%s: tensor", ch_device_id(src)) &&
        check(tensor_1d(&w.dst, dst, n, 8), "%s: tensor", ch_device_id(dst)) &&
        check(time_median(copy_run, &w, 2, reps_for(o), &secs), "%s %s",
              ch_device_id(src), what))
        add_result(ch_device_id(src), what, COPY_BYTES, COPY_BYTES / secs * 1e-9, "GB/s");
    ch_tensor_free(w.src);
    ch_tensor_free(w.dst);
}

typedef enum xfer_kind { UPLOAD, DOWNLOAD, UPLOAD_PINNED, DOWNLOAD_PINNED } xfer_kind;

typedef struct xfer_work {
    ch_device *dev;
    xfer_kind kind;
    ch_tensor *t;
    void *host;
    ch_host_buffer *pinned;
} xfer_work;

static ch_status xfer_run(void *arg)
{
    xfer_work *w = arg;
    ch_status st;
    switch (w->kind) {
    case UPLOAD:
        st = ch_tensor_upload(w->t, w->host, (size_t)COPY_BYTES);
        break;
    case DOWNLOAD:
        st = ch_tensor_download(w->t, w->host, (size_t)COPY_BYTES);
        break;
    case UPLOAD_PINNED:
        st = ch_tensor_upload_async(w->t, w->pinned, 0);
        break;
    default:
        st = ch_tensor_download_async(w->t, w->pinned, 0);
        break;
    }
    return st == CH_OK ? ch_device_sync(w->dev) : st;
}

static void bench_transfers(ch_device *dev, const options *o)
{
    static const char *names[] = {"upload", "download", "upload (pinned)",
                                  "download (pinned)"};
    const char *id = ch_device_id(dev);
    xfer_work w = {dev, UPLOAD, NULL, malloc((size_t)COPY_BYTES), NULL};
    if (!w.host) {
        fprintf(stderr, "bench-ops: malloc(%lld) failed\n", (long long)COPY_BYTES);
        failures++;
        return;
    }
    /* Touch the pageable buffer once: a first touch is not a transfer. */
    memset(w.host, 1, (size_t)COPY_BYTES);
    if (check(tensor_1d(&w.t, dev, COPY_BYTES / 4, 9), "%s: tensor", id) &&
        check(ch_host_buffer_new(&w.pinned, dev, (size_t)COPY_BYTES),
              "%s: pinned buffer", id)) {
        memset(ch_host_buffer_data(w.pinned), 1, (size_t)COPY_BYTES);
        for (int k = UPLOAD; k <= DOWNLOAD_PINNED; k++) {
            double secs;
            w.kind = (xfer_kind)k;
            if (check(time_median(xfer_run, &w, 2, reps_for(o), &secs), "%s: %s", id,
                      names[k]))
                add_result(id, names[k], COPY_BYTES, COPY_BYTES / secs * 1e-9, "GB/s");
        }
    }
    ch_host_buffer_free(w.pinned);
    ch_tensor_free(w.t);
    free(w.host);
}

/* ---- output -------------------------------------------------------------------- */

static void print_table(void)
{
    printf("%-12s %-28s %12s %12s  %s\n", "device", "measurement", "size", "value", "unit");
    for (int i = 0; i < nresults; i++)
        printf("%-12s %-28s %12lld %12.3f  %s\n", results[i].device, results[i].what,
               results[i].size, results[i].value, results[i].unit);
}

static void print_json(void)
{
    printf("[\n");
    for (int i = 0; i < nresults; i++)
        printf("  {\"device\": \"%s\", \"measurement\": \"%s\", \"size\": %lld, "
               "\"value\": %.4f, \"unit\": \"%s\"}%s\n",
               results[i].device, results[i].what, results[i].size, results[i].value,
               results[i].unit, i + 1 < nresults ? "," : "");
    printf("]\n");
}

/* ---- options ------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: bench-ops [--sizes N,N,...] [--devices LIST] [--quick] [--train-ops] "
               "[--json]\n"
               "  --sizes    SGEMM sides (default 256,512,1024; --quick: 256,512)\n"
               "  --devices  a device list (\"host,opencl:0\", \"all\"); default: "
               "every visible device\n"
               "  --quick    fewer runs and smaller elementwise tensors\n"
               "  --train-ops  the training step's smaller ops alone, in microseconds a call\n"
               "  --json     one JSON array instead of the table\n");
}

static int parse_sizes(options *o, const char *list)
{
    const char *p = list;
    o->nsizes = 0;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 65536 || o->nsizes == MAX_SIZES ||
            (*end && *end != ','))
            return 0;
        o->sizes[o->nsizes++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return o->nsizes > 0;
}

static int parse_options(options *o, int argc, char **argv)
{
    const char *sizes = NULL;
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sizes") && i + 1 < argc)
            sizes = argv[++i];
        else if (!strcmp(argv[i], "--devices") && i + 1 < argc)
            o->devices = argv[++i];
        else if (!strcmp(argv[i], "--quick"))
            o->quick = 1;
        else if (!strcmp(argv[i], "--train-ops"))
            o->train_ops = 1;
        else if (!strcmp(argv[i], "--json"))
            o->json = 1;
        else
            return 0;
    }
    if (!sizes)
        sizes = o->quick ? "256,512" : "256,512,1024";
    return parse_sizes(o, sizes);
}

static int select_devices(const options *o, ch_device **devs)
{
    int n = 0;
    if (o->devices)
        return check(ch_device_list_parse(devs, MAX_DEVICES, &n, o->devices),
                     "--devices %s", o->devices)
                   ? n
                   : -1;
    for (int i = 0; i < ch_device_count() && n < MAX_DEVICES; i++)
        if (check(ch_device_get(&devs[n], i), "device %d", i))
            n++;
    return n;
}

static int is_host(ch_device *dev)
{
    return !strcmp(ch_device_id(dev), "host");
}

#ifdef HAVE_REF_GEMM
static int host_selected(ch_device **devs, int ndev)
{
    for (int d = 0; d < ndev; d++)
        if (is_host(devs[d]))
            return 1;
    return 0;
}
#endif

int main(int argc, char **argv)
{
    options o;
    ch_device *devs[MAX_DEVICES];
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return 0;
    }
    if (!parse_options(&o, argc, argv)) {
        usage(stderr);
        return 2;
    }
    if (!check(ch_init(), "ch_init"))
        return 1;
    int ndev = select_devices(&o, devs);
    if (ndev < 0) {
        ch_shutdown();
        return 1;
    }
    if (o.train_ops) {
        for (int d = 0; d < ndev; d++)
            bench_train_ops(devs[d], &o);
        goto out;
    }
    /* The host references first: other devices' runtimes (PoCL's worker
     * threads) keep the cores busy for a while after their work. OpenBLAS
     * runs here only when the host op is not measured (it then runs in
     * turns with the op). */
    bench_reference(1, BLOCKED_NAME, &o);
#ifdef HAVE_REF_GEMM
    if (!host_selected(devs, ndev))
        bench_reference(0, REF_GEMM_NAME, &o);
#endif
    for (int d = 0; d < ndev; d++) {
        bench_gemm(devs[d], &o);
        bench_elementwise(devs[d], &o);
    }
    int largest = o.sizes[0];
    for (int s = 1; s < o.nsizes; s++)
        largest = o.sizes[s] > largest ? o.sizes[s] : largest;
    add_ratio("sgemm op / " REF_GEMM_LIB, "sgemm", REF_GEMM_NAME, largest);
    add_ratio("blocked C / " REF_GEMM_LIB, BLOCKED_NAME, REF_GEMM_NAME, largest);
    for (int s = 0; s < ndev; s++)
        for (int d = 0; d < ndev; d++)
            if (s != d && !is_host(devs[s]) && !is_host(devs[d]))
                bench_copy(devs[s], devs[d], &o);
    for (int d = 0; d < ndev; d++)
        if (!is_host(devs[d]))
            bench_transfers(devs[d], &o);
    for (int d = 0; d < ndev; d++)
        bench_train_ops(devs[d], &o);
out:
    if (o.json)
        print_json();
    else
        print_table();
    ch_shutdown();
    return failures ? 1 : 0;
}
