/* Data sets from IDX files (MNIST, Fashion-MNIST), gzipped or plain: zlib's
 * gzread reads both. Pixels stay bytes in memory (47 MB for Fashion-MNIST's
 * training set, four times less than floats) and become normalised floats
 * when a sample is read. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <chorus.h>
#include "error.h"
#include "dataset.h"

#define IDX_IMAGES_MAGIC 0x00000803u /* unsigned bytes, 3 dimensions */
#define IDX_LABELS_MAGIC 0x00000801u /* unsigned bytes, 1 dimension */
/* The first allocation for a payload and the largest single gzread: the
 * buffer grows with what the file really holds, never to what a (possibly
 * corrupt) header claims before the bytes are there. */
#define READ_CHUNK ((size_t)1 << 20)

typedef struct idx_file {
    const char *path;
    uint32_t magic;
    int ndim;
    uint32_t dims[3];
    size_t header_bytes;
    uint64_t payload; /* bytes after the header, from the dims */
    uint8_t *data;
} idx_file;

static ch_status gz_fail(gzFile f, const char *path)
{
    int err = errno, errnum = Z_OK;
    const char *msg = gzerror(f, &errnum);
    size_t n = strlen(path);
    /* zlib's message starts with the path: ours already does. */
    if (strncmp(msg, path, n) == 0 && strncmp(msg + n, ": ", 2) == 0)
        msg += n + 2;
    if (errnum == Z_ERRNO)
        return chi_error(CH_ERR_IO, "%s: gzread: %s", path, strerror(err));
    if (errnum == Z_MEM_ERROR)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: gzread: %s", path, msg);
    return chi_error(CH_ERR_FORMAT, "%s: corrupt gzip data: %s", path, msg);
}

/* Reads `len` bytes, fewer only at the end of the file. */
static ch_status read_full(gzFile f, const char *path, uint8_t *buf, size_t len, size_t *got)
{
    *got = 0;
    while (*got < len) {
        size_t want = len - *got < READ_CHUNK ? len - *got : READ_CHUNK;
        int n = gzread(f, buf + *got, (unsigned)want);
        if (n < 0)
            return gz_fail(f, path);
        if (n == 0)
            break;
        *got += (size_t)n;
    }
    return CH_OK;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* "60000 images of 28x28 (47040016 bytes)": what the header promises. */
static void describe(const idx_file *x, char *out, size_t cap)
{
    unsigned long long total = x->header_bytes + x->payload;
    if (x->ndim == 3)
        snprintf(out, cap, "%u images of %ux%u (%llu bytes)", x->dims[0], x->dims[1],
                 x->dims[2], total);
    else
        snprintf(out, cap, "%u labels (%llu bytes)", x->dims[0], total);
}

static ch_status check_magic(const idx_file *x, uint32_t magic)
{
    if (magic == x->magic)
        return CH_OK;
    const char *kind = x->ndim == 3 ? "images" : "labels";
    const char *hint = "";
    if (magic == IDX_IMAGES_MAGIC)
        hint = ": this is an image file";
    else if (magic == IDX_LABELS_MAGIC)
        hint = ": this is a label file";
    return chi_error(CH_ERR_FORMAT, "%s: wrong magic 0x%08x, expected 0x%08x (IDX %s)%s",
                     x->path, magic, x->magic, kind, hint);
}

/* The payload size from the dims, refusing zero and sizes that overflow. */
static ch_status check_dims(idx_file *x)
{
    char dims[48];
    if (x->ndim == 3)
        snprintf(dims, sizeof dims, "%ux%ux%u", x->dims[0], x->dims[1], x->dims[2]);
    else
        snprintf(dims, sizeof dims, "%u", x->dims[0]);
    uint64_t bytes = 1;
    for (int i = 0; i < x->ndim; i++) {
        if (x->dims[i] == 0)
            return chi_error(CH_ERR_FORMAT, "%s: header has a dimension of 0 (%s)", x->path,
                             dims);
        if (bytes > UINT64_MAX / x->dims[i])
            return chi_error(CH_ERR_FORMAT, "%s: header sizes overflow (%s)", x->path, dims);
        bytes *= x->dims[i];
    }
    uint64_t sample = x->ndim == 3 ? (uint64_t)x->dims[1] * x->dims[2] : 1;
    if (sample > INT_MAX || bytes > PTRDIFF_MAX - x->header_bytes)
        return chi_error(CH_ERR_FORMAT, "%s: header sizes overflow (%s)", x->path, dims);
    x->payload = bytes;
    return CH_OK;
}

static ch_status read_header(gzFile f, idx_file *x)
{
    uint8_t h[16];
    size_t got;
    x->header_bytes = 4 + 4 * (size_t)x->ndim;
    ch_status st = read_full(f, x->path, h, x->header_bytes, &got);
    if (st != CH_OK)
        return st;
    if (got == 0)
        return chi_error(CH_ERR_FORMAT, "%s: empty file, expected IDX %s", x->path,
                         x->ndim == 3 ? "images" : "labels");
    if (got < x->header_bytes)
        return chi_error(CH_ERR_FORMAT, "%s: truncated: %zu bytes, shorter than the %zu-byte header",
                         x->path, got, x->header_bytes);
    st = check_magic(x, be32(h));
    if (st != CH_OK)
        return st;
    for (int i = 0; i < x->ndim; i++)
        x->dims[i] = be32(h + 4 + 4 * i);
    return check_dims(x);
}

/* Bytes left after the payload: there must be none. */
static ch_status check_trailing(gzFile f, const idx_file *x)
{
    uint8_t scratch[4096];
    uint64_t extra = 0;
    size_t got;
    do {
        ch_status st = read_full(f, x->path, scratch, sizeof scratch, &got);
        if (st != CH_OK)
            return st;
        extra += got;
    } while (got == sizeof scratch);
    if (extra == 0)
        return CH_OK;
    char what[96];
    describe(x, what, sizeof what);
    return chi_error(CH_ERR_FORMAT, "%s: trailing bytes: header says %s, file has %llu",
                     x->path, what, (unsigned long long)(x->header_bytes + x->payload + extra));
}

static ch_status read_payload(gzFile f, idx_file *x)
{
    size_t want = (size_t)x->payload, cap = want < READ_CHUNK ? want : READ_CHUNK, have = 0;
    x->data = malloc(cap);
    if (!x->data)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", x->path, cap);
    for (;;) {
        size_t got;
        ch_status st = read_full(f, x->path, x->data + have, cap - have, &got);
        if (st != CH_OK)
            return st;
        have += got;
        if (have < cap || cap == want)
            break;
        cap = cap > want / 2 ? want : 2 * cap;
        uint8_t *bigger = realloc(x->data, cap);
        if (!bigger)
            return chi_error(CH_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", x->path,
                             cap);
        x->data = bigger;
    }
    if (have < want) {
        char what[96];
        describe(x, what, sizeof what);
        return chi_error(CH_ERR_FORMAT, "%s: truncated: header says %s, file has %zu", x->path,
                         what, x->header_bytes + have);
    }
    return check_trailing(f, x);
}

static ch_status close_file(gzFile f, const char *path)
{
    int rc = gzclose(f);
    if (rc == Z_OK)
        return CH_OK;
    if (rc == Z_ERRNO)
        return chi_error(CH_ERR_IO, "%s: gzclose: %s", path, strerror(errno));
    if (rc == Z_BUF_ERROR)
        return chi_error(CH_ERR_FORMAT, "%s: truncated: the gzip stream ends early", path);
    return chi_error(CH_ERR_INTERNAL, "%s: gzclose returned %d", path, rc);
}

/* Reads a whole IDX file into x->data (freed by the caller, also on error). */
static ch_status idx_read(idx_file *x)
{
    errno = 0; /* gzopen leaves it 0 when it failed for lack of memory */
    gzFile f = gzopen(x->path, "rb");
    if (!f)
        return chi_error(CH_ERR_IO, "%s: cannot open: %s", x->path,
                         errno ? strerror(errno) : "out of memory");
    ch_status st = read_header(f, x);
    if (st == CH_OK)
        st = read_payload(f, x);
    if (st != CH_OK) {
        /* Already failing: the read error is the one worth reporting. */
        gzclose(f);
        return st;
    }
    return close_file(f, x->path);
}

static ch_status check_labels(const idx_file *images, const idx_file *labels, int classes)
{
    if (labels->dims[0] != images->dims[0])
        return chi_error(CH_ERR_FORMAT, "%s has %u labels but %s has %u images", labels->path,
                         labels->dims[0], images->path, images->dims[0]);
    if (classes == 0)
        return CH_OK;
    for (uint32_t i = 0; i < labels->dims[0]; i++)
        if (labels->data[i] >= classes)
            return chi_error(CH_ERR_FORMAT, "%s: label %u of sample %u is out of range, expected < %d classes",
                             labels->path, labels->data[i], i, classes);
    return CH_OK;
}

static int max_label(const uint8_t *labels, int64_t count)
{
    int top = 0;
    for (int64_t i = 0; i < count; i++)
        if (labels[i] > top)
            top = labels[i];
    return top;
}

static ch_status check_options(const char *fn, const ch_idx_options *o)
{
    if (!isfinite(o->mean))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: options->mean is %g, expected a finite number",
                         fn, o->mean);
    if (!(o->std > 0.0f) || !isfinite(o->std))
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: options->std is %g, expected > 0", fn,
                         o->std);
    return CH_OK;
}

static void normalize(ch_dataset *ds, const ch_idx_options *o)
{
    ds->mean = o->mean;
    ds->std = o->std;
    for (int p = 0; p < 256; p++)
        ds->lut[p] = ((float)p / 255.0f - o->mean) / o->std;
}

static ch_status dataset_make(ch_dataset **out, idx_file *images, idx_file *labels,
                              int classes, const ch_idx_options *o)
{
    ch_dataset *ds = calloc(1, sizeof *ds);
    if (!ds)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dataset_idx_open: out of memory");
    ds->own_pixels = images->data;
    ds->own_labels = labels->data;
    images->data = labels->data = NULL;
    ds->pixels = ds->own_pixels;
    ds->labels = ds->own_labels;
    ds->count = images->dims[0];
    ds->rows = (int)images->dims[1];
    ds->cols = (int)images->dims[2];
    ds->classes = classes ? classes : max_label(ds->labels, ds->count) + 1;
    normalize(ds, o);
    *out = ds;
    return CH_OK;
}

ch_status ch_dataset_idx_open(ch_dataset **out, const char *images_path,
                              const char *labels_path, int classes,
                              const ch_idx_options *options)
{
    static const ch_idx_options identity = {0.0f, 1.0f};
    const char *fn = "ch_dataset_idx_open";
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: out is NULL", fn);
    *out = NULL;
    if (!images_path)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: images_path is NULL", fn);
    if (!labels_path)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: labels_path is NULL", fn);
    if (classes < 0 || classes > 256)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "%s: classes is %d, expected 0 to 256", fn,
                         classes);
    const ch_idx_options *o = options ? options : &identity;
    ch_status st = check_options(fn, o);
    if (st != CH_OK)
        return st;
    idx_file images = {.path = images_path, .magic = IDX_IMAGES_MAGIC, .ndim = 3};
    idx_file labels = {.path = labels_path, .magic = IDX_LABELS_MAGIC, .ndim = 1};
    st = idx_read(&images);
    if (st == CH_OK)
        st = idx_read(&labels);
    if (st == CH_OK)
        st = check_labels(&images, &labels, classes);
    if (st == CH_OK)
        st = dataset_make(out, &images, &labels, classes, o);
    free(images.data);
    free(labels.data);
    return st;
}

/* dir/name.gz, else dir/name: the first that exists. */
static ch_status find_file(char *path, size_t cap, const char *dir, const char *name)
{
    for (int gz = 1; gz >= 0; gz--) {
        int n = snprintf(path, cap, "%s/%s%s", dir, name, gz ? ".gz" : "");
        if (n < 0 || (size_t)n >= cap)
            return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_mnist_open: dir is too long (%zu characters)",
                             strlen(dir));
        if (access(path, F_OK) == 0)
            return CH_OK;
        if (errno != ENOENT)
            return chi_error(CH_ERR_IO, "ch_dataset_mnist_open: %s: %s", path, strerror(errno));
    }
    return chi_error(CH_ERR_NOT_FOUND, "ch_dataset_mnist_open: %s has neither %s.gz nor %s", dir,
                     name, name);
}

/* The set's files in dir, normalised with `options`. */
static ch_status mnist_open(ch_dataset **out, const char *dir, int train,
                            const ch_idx_options *options)
{
    const char *set = train ? "train" : "t10k";
    char name[64], images[PATH_MAX], labels[PATH_MAX];
    snprintf(name, sizeof name, "%s-images-idx3-ubyte", set);
    ch_status st = find_file(images, sizeof images, dir, name);
    if (st != CH_OK)
        return st;
    snprintf(name, sizeof name, "%s-labels-idx1-ubyte", set);
    st = find_file(labels, sizeof labels, dir, name);
    if (st != CH_OK)
        return st;
    return ch_dataset_idx_open(out, images, labels, 10, options);
}

ch_status ch_dataset_mnist_open(ch_dataset **out, const char *dir, int train,
                                const ch_idx_options *options)
{
    static const ch_idx_options identity = {0.0f, 1.0f};
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_mnist_open: out is NULL");
    *out = NULL;
    if (!dir)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_mnist_open: dir is NULL");
    if (options)
        return mnist_open(out, dir, train, options);
    /* The training images' statistics: the training set is read once. */
    ch_dataset *ds = NULL;
    ch_idx_options own;
    ch_status st = mnist_open(&ds, dir, 1, &identity);
    if (st == CH_OK)
        st = ch_dataset_stats(ds, &own);
    if (st == CH_OK && train) {
        normalize(ds, &own);
        *out = ds;
        return CH_OK;
    }
    ch_dataset_free(ds);
    return st == CH_OK ? mnist_open(out, dir, 0, &own) : st;
}

/* x to four significant digits, through its decimal form, so that the
 * float is the one a program gets from the published constant. */
static float four_digits(double x)
{
    char text[32];
    snprintf(text, sizeof text, "%.4g", x);
    return strtof(text, NULL);
}

ch_status ch_dataset_stats(const ch_dataset *ds, ch_idx_options *out)
{
    if (!out || !ds)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_stats: %s is NULL",
                         !out ? "out" : "ds");
    /* A histogram of the bytes: exact sums, whatever the set's size. */
    uint64_t hist[256] = {0};
    uint64_t n = (uint64_t)ds->count * (uint64_t)ds->rows * (uint64_t)ds->cols;
    for (uint64_t i = 0; i < n; i++)
        hist[ds->pixels[i]]++;
    double sum = 0.0, squares = 0.0;
    for (int v = 0; v < 256; v++)
        sum += (double)v * (double)hist[v];
    double mean = sum / (double)n;
    for (int v = 0; v < 256; v++)
        squares += ((double)v - mean) * ((double)v - mean) * (double)hist[v];
    double std = sqrt(squares / (double)n) / 255.0;
    out->mean = four_digits(mean / 255.0);
    out->std = std > 0.0 ? four_digits(std) : 1.0f;
    return CH_OK;
}

ch_status ch_dataset_normalization(const ch_dataset *ds, ch_idx_options *out)
{
    if (!out || !ds)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_normalization: %s is NULL",
                         !out ? "out" : "ds");
    out->mean = ds->mean;
    out->std = ds->std;
    return CH_OK;
}

void ch_dataset_free(ch_dataset *ds)
{
    if (!ds)
        return;
    free(ds->own_pixels);
    free(ds->own_labels);
    free(ds);
}

int64_t ch_dataset_size(const ch_dataset *ds) { return ds ? ds->count : 0; }

int ch_dataset_sample_shape(const ch_dataset *ds, int64_t shape[CH_MAX_DIMS])
{
    if (!ds || !shape)
        return 0;
    shape[0] = 1;
    shape[1] = ds->rows;
    shape[2] = ds->cols;
    return 3;
}

int64_t ch_dataset_sample_numel(const ch_dataset *ds)
{
    return ds ? (int64_t)ds->rows * ds->cols : 0;
}

int ch_dataset_classes(const ch_dataset *ds) { return ds ? ds->classes : 0; }

ch_status ch_dataset_get(const ch_dataset *ds, int64_t index, float *image, int32_t *label)
{
    if (!ds)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_get: ds is NULL");
    if (!image)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_get: image is NULL");
    if (!label)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_get: label is NULL");
    if (index < 0 || index >= ds->count)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_get: index is %lld, expected 0 to %lld",
                         (long long)index, (long long)ds->count - 1);
    chn_dataset_fill(ds, index, image, label);
    return CH_OK;
}

ch_status ch_dataset_head(ch_dataset **out, const ch_dataset *ds, int64_t count)
{
    if (!out)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_head: out is NULL");
    *out = NULL;
    if (!ds)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_head: ds is NULL");
    if (count < 1 || count > ds->count)
        return chi_error(CH_ERR_INVALID_ARGUMENT, "ch_dataset_head: count is %lld, expected 1 to %lld",
                         (long long)count, (long long)ds->count);
    ch_dataset *head = malloc(sizeof *head);
    if (!head)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "ch_dataset_head: out of memory");
    *head = *ds;
    head->own_pixels = head->own_labels = NULL;
    head->count = count;
    *out = head;
    return CH_OK;
}
