/* Data sets: IDX files written here (plain and gzipped) read back exactly;
 * every corrupt input is a clear error naming the file and the problem;
 * Fashion-MNIST when Debian's package is installed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "idxgen.h"
#include "tap.h"

#define N 1000
#define ROWS 4
#define COLS 5
#define CLASSES 10
#define FASHION_DIR "/usr/share/datasets/fashion-mnist"

static const char *tmp;

static const char *path_in(const char *name)
{
    static char paths[8][4096];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 4096, "%s/%s", tmp, name);
    return p;
}

static const char *write_file(const char *name, const uint8_t *bytes, size_t len, int gz)
{
    const char *path = path_in(name);
    if (idxgen_write(path, bytes, len, gz) != 0)
        tap_diag("could not write %s", path);
    return path;
}

/* Every sample of `ds` against the generated content, normalised. */
static void check_content(const ch_dataset *ds, float mean, float std, const char *what)
{
    float image[ROWS * COLS];
    int32_t label = -1;
    for (int64_t i = 0; i < ch_dataset_size(ds); i++) {
        if (ch_dataset_get(ds, i, image, &label) != CH_OK) {
            tap_ok(0, "%s: ch_dataset_get(%lld): %s", what, (long long)i, ch_last_error());
            return;
        }
        for (int k = 0; k < ROWS * COLS; k++) {
            float want = ((float)idxgen_pixel(i, k) / 255.0f - mean) / std;
            if (fabsf(image[k] - want) > 1e-6f) {
                tap_ok(0, "%s: sample %lld pixel %d: got %.7f, want %.7f +- 1e-6", what,
                       (long long)i, k, image[k], want);
                return;
            }
        }
        if (label != idxgen_label(i, CLASSES)) {
            tap_ok(0, "%s: sample %lld: label %d, want %d", what, (long long)i, label,
                   idxgen_label(i, CLASSES));
            return;
        }
    }
    tap_ok(1, "%s: %lld samples read back exactly", what, (long long)ch_dataset_size(ds));
}

static void check_shape(const ch_dataset *ds, const char *what)
{
    int64_t shape[CH_MAX_DIMS] = {0};
    int nd = ch_dataset_sample_shape(ds, shape);
    tap_ok(ch_dataset_size(ds) == N, "%s: size %lld, want %d", what,
           (long long)ch_dataset_size(ds), N);
    tap_ok(nd == 3 && shape[0] == 1 && shape[1] == ROWS && shape[2] == COLS,
           "%s: sample shape ndim %d [%lld, %lld, %lld], want [1, %d, %d]", what, nd,
           (long long)shape[0], (long long)shape[1], (long long)shape[2], ROWS, COLS);
    tap_ok(ch_dataset_sample_numel(ds) == ROWS * COLS, "%s: sample numel %lld, want %d", what,
           (long long)ch_dataset_sample_numel(ds), ROWS * COLS);
    tap_ok(ch_dataset_classes(ds) == CLASSES, "%s: %d classes, want %d", what,
           ch_dataset_classes(ds), CLASSES);
}

static void test_good_files(void)
{
    size_t ni, nl;
    uint8_t *img = idxgen_images(N, ROWS, COLS, &ni), *lab = idxgen_labels(N, CLASSES, &nl);
    const ch_idx_options norm = {0.5f, 0.25f};
    struct { const char *img, *lab; int gz; const char *what; } cases[] = {
        {"plain-images", "plain-labels", 0, "plain files"},
        {"gz-images.gz", "gz-labels.gz", 1, "gzipped files"},
        {"gz-images-noext", "gz-labels-noext", 1, "gzipped files named without .gz"},
        {"plain-images.gz", "plain-labels.gz", 0, "plain files named .gz"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const char *ip = write_file(cases[c].img, img, ni, cases[c].gz);
        const char *lp = write_file(cases[c].lab, lab, nl, cases[c].gz);
        ch_dataset *ds = NULL;
        if (tap_status_ok(ch_dataset_idx_open(&ds, ip, lp, CLASSES, &norm), "%s open",
                          cases[c].what)) {
            check_shape(ds, cases[c].what);
            check_content(ds, norm.mean, norm.std, cases[c].what);
        }
        ch_dataset_free(ds);
    }
    ch_dataset *ds = NULL;
    if (tap_status_ok(ch_dataset_idx_open(&ds, path_in("plain-images"), path_in("plain-labels"),
                                          0, NULL),
                      "open with classes 0 and no options")) {
        check_content(ds, 0.0f, 1.0f, "no options: pixels / 255");
        tap_ok(ch_dataset_classes(ds) == CLASSES,
               "classes 0: the class count is the largest label + 1 (got %d, want %d)",
               ch_dataset_classes(ds), CLASSES);
    }
    ch_dataset_free(ds);
    free(img);
    free(lab);
}

/* A call that must fail with `want` and a message naming `path` and `problem`. */
static void fails_with(ch_status got, ch_status want, const char *path, const char *problem,
                       const char *what)
{
    const char *msg = ch_last_error();
    if (got == want && strstr(msg, path) && strstr(msg, problem))
        tap_ok(1, "%s: %s \"%s\"", what, ch_status_str(got), msg);
    else
        tap_ok(0, "%s: got %s \"%s\", want %s naming %s and \"%s\"", what, ch_status_str(got),
               msg, ch_status_str(want), path, problem);
}

static void open_fails(const char *ip, const char *lp, ch_status want, const char *named,
                       const char *problem, const char *what)
{
    ch_dataset *ds = (ch_dataset *)&ds;
    fails_with(ch_dataset_idx_open(&ds, ip, lp, CLASSES, NULL), want, named, problem, what);
    tap_ok(ds == NULL, "%s: *out is NULL after the failure", what);
}

static void put32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void test_header_errors(const char *good_img, const char *good_lab)
{
    size_t ni, nl;
    uint8_t *img = idxgen_images(N, ROWS, COLS, &ni), *lab = idxgen_labels(N, CLASSES, &nl);
    const char *p = write_file("magic-images", lab, nl, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p, "wrong magic 0x00000801, expected 0x00000803",
               "a label file given as images");
    p = write_file("magic-labels", img, ni, 1);
    open_fails(good_img, p, CH_ERR_FORMAT, p, "wrong magic 0x00000803, expected 0x00000801",
               "an image file (gzipped) given as labels");
    p = write_file("empty", img, 0, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p, "empty file", "an empty file");
    p = write_file("short-header", img, 7, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p, "truncated: 7 bytes, shorter than the 16-byte header",
               "a file shorter than its header");
    uint8_t hdr[16];
    memcpy(hdr, img, 16);
    put32(hdr + 4, 0xFFFFFFFFu);
    put32(hdr + 8, 0xFFFFFFFFu);
    put32(hdr + 12, 0xFFFFFFFFu);
    p = write_file("overflow", hdr, 16, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p, "sizes overflow (4294967295x4294967295x4294967295)",
               "dims whose product overflows");
    put32(hdr + 8, 0);
    p = write_file("zero-dim", hdr, 16, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p, "dimension of 0", "a dimension of 0");
    /* 3.3 TB promised, 16 bytes there: an error, not a 3.3 TB allocation. */
    put32(hdr + 8, 28);
    put32(hdr + 12, 28);
    p = write_file("huge", hdr, 16, 1);
    open_fails(p, good_lab, CH_ERR_FORMAT, p,
               "truncated: header says 4294967295 images of 28x28 (3367254359296 bytes), file has 16",
               "a huge header over an empty payload");
    free(img);
    free(lab);
}

static void test_size_errors(const char *good_img, const char *good_lab)
{
    size_t ni, nl;
    uint8_t *img = idxgen_images(N, ROWS, COLS, &ni), *lab = idxgen_labels(N, CLASSES, &nl);
    const char *p = write_file("trunc-images.gz", img, ni - 6, 1);
    open_fails(p, good_lab, CH_ERR_FORMAT, p,
               "truncated: header says 1000 images of 4x5 (20016 bytes), file has 20010",
               "truncated images");
    p = write_file("trunc-labels", lab, nl - 1, 0);
    open_fails(good_img, p, CH_ERR_FORMAT, p,
               "truncated: header says 1000 labels (1008 bytes), file has 1007", "truncated labels");
    uint8_t *longer = malloc(ni + 4);
    memcpy(longer, img, ni);
    memset(longer + ni, 0, 4);
    p = write_file("trailing-images", longer, ni + 4, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p,
               "trailing bytes: header says 1000 images of 4x5 (20016 bytes), file has 20020",
               "trailing bytes after the images");
    free(longer);
    size_t nfew;
    uint8_t *few = idxgen_labels(N - 1, CLASSES, &nfew);
    p = write_file("few-labels", few, nfew, 0);
    open_fails(good_img, p, CH_ERR_FORMAT, p, "has 999 labels but", "999 labels for 1000 images");
    tap_ok(strstr(ch_last_error(), good_img) != NULL, "the count mismatch names the image file too: \"%s\"",
           ch_last_error());
    free(few);
    lab[8 + 5] = CLASSES;
    p = write_file("bad-label", lab, nl, 1);
    open_fails(good_img, p, CH_ERR_FORMAT, p,
               "label 10 of sample 5 is out of range, expected < 10 classes", "a label out of range");
    free(img);
    free(lab);
}

static void test_gzip_errors(const char *good_lab)
{
    size_t ni, len;
    uint8_t *img = idxgen_images(N, ROWS, COLS, &ni);
    const char *p = write_file("gz-src.gz", img, ni, 1);
    uint8_t *gz = idxgen_read(p, &len);
    if (!gz) {
        tap_skip("could not read back %s", p);
        tap_skip("could not read back %s", p);
        free(img);
        return;
    }
    /* The CRC is the trailer's first 4 bytes: the data inflates fine, the check fails. */
    gz[len - 8] ^= 0xFF;
    p = write_file("bad-crc.gz", gz, len, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p, "corrupt gzip data", "a gzip file with a bad CRC");
    gz[len - 8] ^= 0xFF;
    p = write_file("cut-trailer.gz", gz, len - 8, 0);
    open_fails(p, good_lab, CH_ERR_FORMAT, p, "truncated", "a gzip stream without its trailer");
    free(gz);
    free(img);
}

static void test_io_errors(const char *good_img, const char *good_lab)
{
    const char *p = path_in("no-such-file");
    open_fails(p, good_lab, CH_ERR_IO, p, "No such file or directory", "a missing image file");
    open_fails(good_img, p, CH_ERR_IO, p, "No such file or directory", "a missing label file");
    p = path_in("a-folder");
    if (mkdir(p, 0700) != 0) {
        tap_skip("mkdir %s failed", p);
        tap_skip("mkdir %s failed", p);
        return;
    }
    open_fails(p, good_lab, CH_ERR_IO, p, "Is a directory", "a folder given as the image file");
}

static void test_bad_arguments(const char *img, const char *lab)
{
    ch_dataset *ds = NULL;
    const ch_idx_options zero_std = {0.0f, 0.0f};
    tap_status_is(ch_dataset_idx_open(NULL, img, lab, 10, NULL), CH_ERR_INVALID_ARGUMENT,
                  "out is NULL", "idx_open: out NULL");
    tap_status_is(ch_dataset_idx_open(&ds, NULL, lab, 10, NULL), CH_ERR_INVALID_ARGUMENT,
                  "images_path is NULL", "idx_open: images_path NULL");
    tap_status_is(ch_dataset_idx_open(&ds, img, NULL, 10, NULL), CH_ERR_INVALID_ARGUMENT,
                  "labels_path is NULL", "idx_open: labels_path NULL");
    tap_status_is(ch_dataset_idx_open(&ds, img, lab, -1, NULL), CH_ERR_INVALID_ARGUMENT,
                  "classes is -1", "idx_open: classes -1");
    tap_status_is(ch_dataset_idx_open(&ds, img, lab, 10, &zero_std), CH_ERR_INVALID_ARGUMENT,
                  "options->std is 0, expected > 0", "idx_open: std 0");
    tap_status_is(ch_dataset_mnist_open(&ds, NULL, 1, NULL), CH_ERR_INVALID_ARGUMENT,
                  "dir is NULL", "mnist_open: dir NULL");
    ch_idx_options st;
    tap_status_is(ch_dataset_stats(ds, NULL), CH_ERR_INVALID_ARGUMENT, "out is NULL",
                  "stats: out NULL");
    tap_status_is(ch_dataset_stats(NULL, &st), CH_ERR_INVALID_ARGUMENT, "ds is NULL",
                  "stats: ds NULL");
    tap_status_is(ch_dataset_normalization(ds, NULL), CH_ERR_INVALID_ARGUMENT, "out is NULL",
                  "normalization: out NULL");
    tap_status_is(ch_dataset_normalization(NULL, &st), CH_ERR_INVALID_ARGUMENT, "ds is NULL",
                  "normalization: ds NULL");
    tap_ok(ch_dataset_size(NULL) == 0 && ch_dataset_classes(NULL) == 0 &&
               ch_dataset_sample_numel(NULL) == 0,
           "queries on a NULL data set give 0");
    ch_dataset_free(NULL);
    tap_ok(1, "ch_dataset_free(NULL) is a no-op");
}

static void test_get_and_head(const char *img, const char *lab)
{
    ch_dataset *ds = NULL, *head = NULL;
    if (!tap_status_ok(ch_dataset_idx_open(&ds, img, lab, CLASSES, NULL), "open for get/head"))
        return;
    float image[ROWS * COLS];
    int32_t label;
    tap_status_is(ch_dataset_get(ds, N, image, &label), CH_ERR_INVALID_ARGUMENT,
                  "index is 1000, expected 0 to 999", "get: index past the end");
    tap_status_is(ch_dataset_get(ds, -1, image, &label), CH_ERR_INVALID_ARGUMENT,
                  "index is -1", "get: negative index");
    tap_status_is(ch_dataset_get(ds, 0, NULL, &label), CH_ERR_INVALID_ARGUMENT,
                  "image is NULL", "get: image NULL");
    tap_status_is(ch_dataset_head(&head, ds, N + 1), CH_ERR_INVALID_ARGUMENT,
                  "count is 1001, expected 1 to 1000", "head: more than the data set");
    tap_status_is(ch_dataset_head(&head, ds, 0), CH_ERR_INVALID_ARGUMENT, "count is 0",
                  "head: 0 samples");
    if (tap_status_ok(ch_dataset_head(&head, ds, 17), "head of 17")) {
        float a[ROWS * COLS], b[ROWS * COLS];
        int32_t la, lb;
        int same = ch_dataset_get(head, 16, a, &la) == CH_OK &&
                   ch_dataset_get(ds, 16, b, &lb) == CH_OK && memcmp(a, b, sizeof a) == 0 &&
                   la == lb;
        tap_ok(ch_dataset_size(head) == 17, "head: size %lld, want 17",
               (long long)ch_dataset_size(head));
        tap_ok(same, "head: sample 16 equals the source's sample 16");
        tap_status_is(ch_dataset_get(head, 17, a, &la), CH_ERR_INVALID_ARGUMENT,
                      "index is 17, expected 0 to 16", "head: sample 17 is out of range");
    }
    ch_dataset_free(head);
    ch_dataset_free(ds);
}

/* The generated pixels' mean and std over the first n samples, to four
 * significant digits: what ch_dataset_stats promises. */
static ch_idx_options generated_stats(int64_t n)
{
    double sum = 0, squares = 0, count = (double)n * ROWS * COLS;
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < ROWS * COLS; k++)
            sum += idxgen_pixel(i, k) / 255.0;
    double mean = sum / count;
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < ROWS * COLS; k++)
            squares += (idxgen_pixel(i, k) / 255.0 - mean) * (idxgen_pixel(i, k) / 255.0 - mean);
    char text[64];
    snprintf(text, sizeof text, "%.4g %.4g", mean, sqrt(squares / count));
    ch_idx_options o;
    sscanf(text, "%f %f", &o.mean, &o.std);
    return o;
}

static void same_options(ch_idx_options got, ch_idx_options want, const char *what)
{
    tap_ok(got.mean == want.mean && got.std == want.std,
           "%s: mean %.9g, std %.9g, want %.9g and %.9g", what, got.mean, got.std, want.mean,
           want.std);
}

/* Without options, both sets are normalised with the training images'
 * statistics, whatever the set (these are far from Fashion-MNIST's). */
static void test_own_stats(void)
{
    ch_idx_options train = generated_stats(N), test = generated_stats(100), got;
    tap_ok(fabsf(train.mean - 0.2860f) > 0.1f && train.mean != test.mean,
           "the made-up set's statistics (%g, %g) are not Fashion-MNIST's, nor its test "
           "set's (%g, %g)", train.mean, train.std, test.mean, test.std);
    ch_dataset *ds = NULL;
    if (tap_status_ok(ch_dataset_mnist_open(&ds, tmp, 1, NULL), "mnist_open: train, no options")) {
        check_content(ds, train.mean, train.std, "mnist_open train: its own mean and std");
        ch_dataset_normalization(ds, &got);
        same_options(got, train, "mnist_open train: ch_dataset_normalization");
        ch_dataset_stats(ds, &got);
        same_options(got, train, "ch_dataset_stats of the training set");
    }
    ch_dataset_free(ds);
    size_t ni, nl;
    uint8_t *img = idxgen_images(100, ROWS, COLS, &ni), *lab = idxgen_labels(100, CLASSES, &nl);
    write_file("t10k-images-idx3-ubyte", img, ni, 0);
    write_file("t10k-labels-idx1-ubyte", lab, nl, 0);
    if (tap_status_ok(ch_dataset_mnist_open(&ds, tmp, 0, NULL), "mnist_open: t10k, no options"))
        check_content(ds, train.mean, train.std, "mnist_open t10k: the training set's mean and std");
    ch_dataset_free(ds);
    free(img);
    free(lab);
}

/* All pixels equal: no spread to scale, std 1. */
static void test_flat_stats(void)
{
    size_t ni, nl;
    uint8_t *img = idxgen_images(10, ROWS, COLS, &ni), *lab = idxgen_labels(10, CLASSES, &nl);
    memset(img + 16, 51, ni - 16);
    const char *ip = write_file("flat-images", img, ni, 0), *lp = write_file("flat-labels", lab, nl, 0);
    ch_dataset *ds = NULL;
    ch_idx_options got = {0, 0};
    if (tap_status_ok(ch_dataset_idx_open(&ds, ip, lp, CLASSES, NULL), "open a flat set"))
        tap_status_ok(ch_dataset_stats(ds, &got), "stats of a flat set");
    same_options(got, (ch_idx_options){0.2f, 1.0f}, "a set of pixels all 51: mean 0.2, std 1");
    ch_dataset_free(ds);
    free(img);
    free(lab);
}

static void test_mnist_dir(void)
{
    size_t ni, nl;
    uint8_t *img = idxgen_images(N, ROWS, COLS, &ni), *lab = idxgen_labels(N, CLASSES, &nl);
    write_file("train-images-idx3-ubyte.gz", img, ni, 1);
    write_file("train-labels-idx1-ubyte.gz", lab, nl, 1);
    write_file("t10k-images-idx3-ubyte", img, ni, 0);
    ch_dataset *ds = NULL;
    const ch_idx_options unit = {0.0f, 1.0f};
    if (tap_status_ok(ch_dataset_mnist_open(&ds, tmp, 1, &unit), "mnist_open: train (gzipped)"))
        check_content(ds, 0.0f, 1.0f, "mnist_open train with mean 0, std 1");
    ch_dataset_free(ds);
    fails_with(ch_dataset_mnist_open(&ds, tmp, 0, NULL), CH_ERR_NOT_FOUND, tmp,
               "neither t10k-labels-idx1-ubyte.gz nor t10k-labels-idx1-ubyte",
               "mnist_open: the test labels are missing");
    write_file("t10k-labels-idx1-ubyte", lab, nl, 0);
    if (tap_status_ok(ch_dataset_mnist_open(&ds, tmp, 0, &unit), "mnist_open: t10k (plain)"))
        check_content(ds, 0.0f, 1.0f, "mnist_open t10k with mean 0, std 1");
    ch_dataset_free(ds);
    test_own_stats();
    const char *none = path_in("no-such-dir");
    fails_with(ch_dataset_mnist_open(&ds, none, 1, NULL), CH_ERR_NOT_FOUND, none,
               "neither train-images-idx3-ubyte.gz nor train-images-idx3-ubyte",
               "mnist_open: a folder without the files");
    free(img);
    free(lab);
}

static void test_fashion_mnist(void)
{
    if (access(FASHION_DIR, R_OK) != 0) {
        tap_skip("%s is not installed (Debian package dataset-fashion-mnist)", FASHION_DIR);
        return;
    }
    static const struct { int train; int64_t size; } sets[] = {{1, 60000}, {0, 10000}};
    for (int s = 0; s < 2; s++) {
        ch_dataset *ds = NULL;
        const char *name = sets[s].train ? "train" : "test";
        if (!tap_status_ok(ch_dataset_mnist_open(&ds, FASHION_DIR, sets[s].train, NULL),
                           "Fashion-MNIST %s opens", name))
            continue;
        int64_t shape[CH_MAX_DIMS] = {0};
        ch_dataset_sample_shape(ds, shape);
        tap_ok(ch_dataset_size(ds) == sets[s].size, "Fashion-MNIST %s: %lld samples, want %lld",
               name, (long long)ch_dataset_size(ds), (long long)sets[s].size);
        tap_ok(shape[1] == 28 && shape[2] == 28, "Fashion-MNIST %s: %lldx%lld, want 28x28", name,
               (long long)shape[1], (long long)shape[2]);
        tap_ok(ch_dataset_classes(ds) == 10, "Fashion-MNIST %s: %d classes, want 10", name,
               ch_dataset_classes(ds));
        /* Its statistics round to the published constants, so a run with
         * no options normalises as one with them always did. */
        ch_idx_options got;
        ch_dataset_normalization(ds, &got);
        same_options(got, (ch_idx_options){0.2860f, 0.3530f},
                     sets[s].train ? "Fashion-MNIST train, no options"
                                   : "Fashion-MNIST test, no options: the training set's");
        ch_dataset_free(ds);
    }
}

int main(void)
{
    tmp = idxgen_tmpdir();
    if (!tmp)
        tap_skip_all("cannot create a temporary folder");
    size_t ni, nl;
    uint8_t *img = idxgen_images(N, ROWS, COLS, &ni), *lab = idxgen_labels(N, CLASSES, &nl);
    const char *good_img = write_file("good-images", img, ni, 0);
    const char *good_lab = write_file("good-labels.gz", lab, nl, 1);
    free(img);
    free(lab);
    char gi[4096], gl[4096];
    snprintf(gi, sizeof gi, "%s", good_img);
    snprintf(gl, sizeof gl, "%s", good_lab);

    test_good_files();
    test_header_errors(gi, gl);
    test_size_errors(gi, gl);
    test_gzip_errors(gl);
    test_io_errors(gi, gl);
    test_bad_arguments(gi, gl);
    test_get_and_head(gi, gl);
    test_mnist_dir();
    test_flat_stats();
    test_fashion_mnist();
    idxgen_cleanup(tmp);
    return tap_done();
}
