/* The IDX reader, ch_dataset_idx_open (nn/dataset.c): an image file and a
 * label file, each plain or gzip.
 *
 * Input: byte 0 chooses (bits 0-1) the class count passed (0: none, 10,
 * 256, 2), (bit 2) whether the harness gzips the image file, (bit 3) the
 * label file, and (bits 4-5) the normalisation (NULL, Fashion-MNIST's,
 * mean 0 and std 1, mean 0.5 and std 0.25); bytes 1-2, little-endian, are
 * the image file's length; then come its bytes and the label file's (the
 * rest). A file that starts with gzip's magic is gzip in any case.
 *
 * Checked: a failure has a message; an opened set has N >= 1 samples of
 * 1 x H x W, its files held exactly the header's bytes (when the harness
 * knows their plain content), every sample reads back as those bytes
 * normalised, every label is below the class count (the one asked, else the
 * largest label + 1), and its statistics, its head and an index out of
 * range behave. */
#include "config.h"

#include <chorus.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

static char images_path[4096], labels_path[4096];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fuzz_path(images_path, sizeof images_path, "images");
    fuzz_path(labels_path, sizeof labels_path, "labels");
    return 0;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int is_gzip(const uint8_t *p, size_t n) { return n >= 2 && p[0] == 0x1f && p[1] == 0x8b; }

/* Reads sample i and checks it against the plain bytes, when known. */
static void check_sample(const ch_dataset *ds, int64_t i, float *image, const uint8_t *pixels,
                         const uint8_t *labels, const float *lut)
{
    int32_t label = -1;
    int64_t numel = ch_dataset_sample_numel(ds);
    ch_status st = ch_dataset_get(ds, i, image, &label);
    FUZZ_CHECK(st == CH_OK, "sample %lld of %lld: %s", (long long)i,
               (long long)ch_dataset_size(ds), ch_last_error());
    FUZZ_CHECK(label >= 0 && label < ch_dataset_classes(ds), "label %d, %d classes", label,
               ch_dataset_classes(ds));
    if (labels)
        FUZZ_CHECK(label == labels[i], "label %d, the file has %d", label, labels[i]);
    for (int64_t k = 0; k < numel; k++) {
        FUZZ_CHECK(!isnan(image[k]), "pixel %lld of sample %lld is NaN", (long long)k,
                   (long long)i);
        if (pixels)
            FUZZ_CHECK(memcmp(&image[k], &lut[pixels[i * numel + k]], sizeof(float)) == 0,
                       "pixel %lld of sample %lld: %g, expected %g", (long long)k,
                       (long long)i, image[k], lut[pixels[i * numel + k]]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const int class_choice[4] = {0, 10, 256, 2};
    static const ch_idx_options norms[4] = {{0.0f, 0.0f}, {0.2860f, 0.3530f}, {0.0f, 1.0f},
                                            {0.5f, 0.25f}};
    if (size < 3)
        return 0;
    int flags = data[0];
    int classes = class_choice[flags & 3];
    int gz_images = flags >> 2 & 1, gz_labels = flags >> 3 & 1, norm = flags >> 4 & 3;
    size_t n_images = (size_t)data[1] | (size_t)data[2] << 8;
    data += 3;
    size -= 3;
    if (n_images > size)
        n_images = size;
    const uint8_t *img = data, *lab = data + n_images;
    size_t n_labels = size - n_images;
    fuzz_write(images_path, img, n_images, gz_images);
    fuzz_write(labels_path, lab, n_labels, gz_labels);

    const ch_idx_options *o = norm ? &norms[norm] : NULL;
    ch_dataset *ds = NULL;
    ch_status st = ch_dataset_idx_open(&ds, images_path, labels_path, classes, o);
    if (st != CH_OK) {
        fuzz_check_error("ch_dataset_idx_open");
        FUZZ_CHECK(ds == NULL, "a failed open left a data set");
        return 0;
    }
    FUZZ_CHECK(ds != NULL, "opened without a data set");
    int64_t n = ch_dataset_size(ds), shape[CH_MAX_DIMS];
    FUZZ_CHECK(n >= 1, "%lld samples", (long long)n);
    FUZZ_CHECK(ch_dataset_sample_shape(ds, shape) == 3 && shape[0] == 1 && shape[1] >= 1 &&
                   shape[2] >= 1 && shape[1] * shape[2] == ch_dataset_sample_numel(ds),
               "sample shape [%lld, %lld, %lld]", (long long)shape[0], (long long)shape[1],
               (long long)shape[2]);
    int64_t numel = ch_dataset_sample_numel(ds);
    int got_classes = ch_dataset_classes(ds);
    FUZZ_CHECK(classes ? got_classes == classes : got_classes >= 1 && got_classes <= 256,
               "%d classes, asked %d", got_classes, classes);

    /* The plain content of each file, when the harness knows it. */
    int plain_images = gz_images || !is_gzip(img, n_images);
    int plain_labels = gz_labels || !is_gzip(lab, n_labels);
    if (plain_images) {
        FUZZ_CHECK(n_images == 16 + (size_t)(n * numel), "an image file of %zu bytes holds "
                   "%lld images of %lld pixels", n_images, (long long)n, (long long)numel);
        FUZZ_CHECK(be32(img + 4) == n && be32(img + 8) == shape[1] && be32(img + 12) == shape[2],
                   "the header's dims differ from the set's");
    }
    if (plain_labels)
        FUZZ_CHECK(n_labels == 8 + (size_t)n, "a label file of %zu bytes holds %lld labels",
                   n_labels, (long long)n);

    ch_idx_options used = {0}, stats = {0};
    FUZZ_CHECK(ch_dataset_normalization(ds, &used) == CH_OK, "%s", ch_last_error());
    const ch_idx_options want = o ? *o : norms[2];
    FUZZ_CHECK(used.mean == want.mean && used.std == want.std, "normalised with %g,%g", used.mean,
               used.std);
    float lut[256];
    for (int p = 0; p < 256; p++)
        lut[p] = ((float)p / 255.0f - want.mean) / want.std;

    float *image = malloc((size_t)numel * sizeof *image);
    FUZZ_CHECK(image != NULL, "out of memory for %lld pixels", (long long)numel);
    /* Every sample of a small set; the first and last 512 of a large one. */
    for (int64_t i = 0; i < n; i++) {
        if (n > 1024 && i == 512)
            i = n - 512;
        check_sample(ds, i, image, plain_images ? img + 16 : NULL,
                     plain_labels ? lab + 8 : NULL, lut);
    }
    int32_t label;
    FUZZ_CHECK(ch_dataset_get(ds, n, image, &label) == CH_ERR_INVALID_ARGUMENT,
               "sample %lld of %lld read", (long long)n, (long long)n);
    fuzz_check_error("ch_dataset_get out of range");
    FUZZ_CHECK(ch_dataset_get(ds, -1, image, &label) == CH_ERR_INVALID_ARGUMENT,
               "sample -1 read");

    FUZZ_CHECK(ch_dataset_stats(ds, &stats) == CH_OK, "%s", ch_last_error());
    FUZZ_CHECK(stats.mean >= 0.0f && stats.mean <= 1.0f && stats.std > 0.0f && stats.std <= 1.0f,
               "statistics %g, %g", stats.mean, stats.std);

    ch_dataset *head = NULL;
    FUZZ_CHECK(ch_dataset_head(&head, ds, n) == CH_OK && ch_dataset_size(head) == n,
               "the head of all %lld samples: %s", (long long)n, ch_last_error());
    check_sample(head, n - 1, image, plain_images ? img + 16 : NULL,
                 plain_labels ? lab + 8 : NULL, lut);
    ch_dataset_free(head);
    FUZZ_CHECK(ch_dataset_head(&head, ds, n + 1) == CH_ERR_INVALID_ARGUMENT && !head,
               "a head longer than the set");
    free(image);
    ch_dataset_free(ds);
    return 0;
}
