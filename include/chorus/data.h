/* Chorus: data sets and the data loader. */
#ifndef CHORUS_DATA_H
#define CHORUS_DATA_H

#include <stddef.h>
#include <stdint.h>
#include <chorus/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Data sets -------------------------------------------------------------
 * A data set of images (f32) and integer class labels, held in host memory. */
typedef struct ch_dataset ch_dataset;

typedef struct ch_idx_options {
    /* Pixels are scaled from bytes to [0, 1], then normalised:
     * x = (x - mean) / std. mean 0 and std 1 keep [0, 1]. */
    float mean;
    float std;
} ch_idx_options; /* NULL options: mean 0, std 1 */

/* Open an IDX image file (magic 0x00000803, unsigned bytes, [N, H, W]) and
 * its IDX label file (0x00000801, [N]), each gzip-compressed or plain (told
 * apart by content, not by name). Errors (CH_ERR_IO, CH_ERR_FORMAT) name the
 * file and the problem: missing, wrong magic, truncated (sizes that disagree
 * with the length), trailing bytes, image and label counts that differ, a
 * label >= the class count given by `classes` (0: no check). */
CH_API ch_status ch_dataset_idx_open(ch_dataset **out, const char *images_path,
                                     const char *labels_path, int classes,
                                     const ch_idx_options *options);

/* The MNIST / Fashion-MNIST files in `dir` (train-images-idx3-ubyte[.gz], ...
 * or t10k-*), 10 classes, normalised with the given options. NULL: with
 * the statistics of the training images in `dir` (ch_dataset_stats), for
 * the test set too, which then reads the training images for them; for
 * Fashion-MNIST they are 0.2860 and 0.3530. */
CH_API ch_status ch_dataset_mnist_open(ch_dataset **out, const char *dir, int train,
                                       const ch_idx_options *options);

/* The mean and standard deviation of the pixels of `ds`, scaled to [0, 1]
 * but not normalised, over all its samples, each rounded to four
 * significant digits as published statistics are (Fashion-MNIST's training
 * set gives exactly 0.2860f and 0.3530f). A set whose pixels are all equal
 * gets std 1: there is no spread to scale. Normalising a test set with its
 * training set's statistics keeps the two alike: pass these as the test
 * set's options. */
CH_API ch_status ch_dataset_stats(const ch_dataset *ds, ch_idx_options *out);

/* The mean and std `ds` was opened with (a head view shares its source's). */
CH_API ch_status ch_dataset_normalization(const ch_dataset *ds, ch_idx_options *out);

CH_API void ch_dataset_free(ch_dataset *ds);
CH_API int64_t ch_dataset_size(const ch_dataset *ds);
/* Shape of one sample: [1, H, W] for IDX images. Returns ndim. */
CH_API int ch_dataset_sample_shape(const ch_dataset *ds, int64_t shape[CH_MAX_DIMS]);
CH_API int64_t ch_dataset_sample_numel(const ch_dataset *ds);
CH_API int ch_dataset_classes(const ch_dataset *ds);
/* Copy sample `index` into `image` (sample_numel floats) and `*label`. */
CH_API ch_status ch_dataset_get(const ch_dataset *ds, int64_t index, float *image,
                                int32_t *label);
/* A data set of the first `count` samples of `ds` (sharing its memory; ds
 * must outlive it): for short runs and tests. */
CH_API ch_status ch_dataset_head(ch_dataset **out, const ch_dataset *ds, int64_t count);

/* ---- Token data sets --------------------------------------------------------
 * Token sequences for language models, read from files and held compactly
 * (mapped, not copied: two bytes a token for shards, one for text), in two
 * splits: training and validation. A sample is a window of context + 1
 * consecutive tokens: its first `context` are the inputs, its last `context`
 * the targets (each input's next token). */
typedef struct ch_tokens ch_tokens;

/* Open the data at `path`, one of:
 *  - a folder of llm.c token shards: every file named *_train*.bin is the
 *    training split, every *_val*.bin the validation split, each group read
 *    in name order (bytewise) and concatenated. A shard is a header of 256
 *    little-endian int32 (magic 20240520, version 1, the token count, the
 *    rest unused) followed by that many little-endian uint16 tokens;
 *  - a text file, read as bytes (vocabulary 256): the last floor(n / 10) of
 *    its n bytes are the validation split, the rest the training split;
 *  - a folder without shards: its regular files, in name order, concatenated
 *    as one text and split as above. Symbolic links, files named *.dat and
 *    folders are left out (so Debian's fortunes folder gives its texts alone,
 *    not their .dat indexes nor their .u8 links).
 * In a folder, names beginning with '.' are left out (hidden files, and the
 * "._" copies some archivers add).
 * Errors name the file and the problem: CH_ERR_IO when a file or folder
 * cannot be read; CH_ERR_FORMAT for a shard with a wrong magic or version,
 * a header shorter than 1024 bytes, a count that disagrees with the
 * file's length (truncated or trailing bytes), a name in both groups, a
 * folder with shards of one group only, a split without tokens, an empty
 * text or one under 10 bytes (an empty validation split). A split too
 * short for a window is found when a context is given (ch_tokens_windows).
 * Opening shards reads every token once, for the vocabulary.
 * Both handles are the caller's to free; on failure both are NULL. The files
 * stay mapped until the handles are freed: changing them meanwhile changes
 * (or, when one shrinks, faults) what the windows read. */
CH_API ch_status ch_tokens_open(ch_tokens **train, ch_tokens **val, const char *path);
CH_API void ch_tokens_free(ch_tokens *t);

/* Tokens in the split (0 for NULL). */
CH_API int64_t ch_tokens_count(const ch_tokens *t);
/* Token ids are below this: 256 for bytes; for shards, the largest id of
 * either split + 1 (both splits answer the same). */
CH_API int32_t ch_tokens_vocab(const ch_tokens *t);
/* 1 when the tokens are bytes of a text (they can be printed as they are). */
CH_API int ch_tokens_bytes(const ch_tokens *t);

/* Windows of `context` tokens (context >= 1) the split holds end to end:
 * (count - 1) / context. That is the number of training samples of an
 * epoch, and of evaluation windows. 0 when the split is shorter than one
 * window (context + 1 tokens) or context < 1; ch_last_error() then says
 * which split of which file, and how many tokens it has and needs. */
CH_API int64_t ch_tokens_windows(const ch_tokens *t, int context);

/* Training sample `index` (0 <= index < ch_tokens_windows) of epoch `epoch`
 * (>= 0): the window at offset
 *     ctr = {index low 32 bits, index high, epoch low, epoch high};
 *     ch_philox4x32(ctr, seed);
 *     offset = ((uint64_t)ctr[0] << 32 | ctr[1]) % (count - context);
 * inputs[k] = token[offset + k], targets[k] = token[offset + k + 1] for
 * k < context. Every offset at which a window fits is drawn with the same
 * probability (to within (count - context) / 2^64), and the window depends
 * on (seed, epoch, index) alone: the same global sample index gives the
 * same window whatever the devices, the batch split or the order in which
 * samples are drawn. `inputs` and `targets` hold `context` ids each.
 * CH_ERR_INVALID_ARGUMENT for a NULL pointer, context < 1, a split shorter
 * than one window, an index or epoch out of range. */
CH_API ch_status ch_tokens_window(const ch_tokens *t, int32_t *inputs, int32_t *targets,
                                  uint64_t seed, int64_t epoch, int64_t index, int context);

/* Evaluation window i (0 <= i < ch_tokens_windows): the window at offset
 * i * context, so the windows follow each other and every token after the
 * first up to windows * context is a target exactly once. Errors as
 * ch_tokens_window's. */
CH_API ch_status ch_tokens_eval_window(const ch_tokens *t, int32_t *inputs, int32_t *targets,
                                       int64_t i, int context);

/* ---- Loader -----------------------------------------------------------------
 * Batches assembled by worker threads into pinned host buffers, ahead of
 * use. An epoch visits every sample of this process's share exactly once
 * (the last short batch is dropped with drop_last). The order is a shuffle
 * seeded by (seed, epoch): a new order each epoch, the same order for the
 * same seed. With world > 1, process `rank` takes every world-th sample of
 * the shuffled order (a distributed sampler: the shares are disjoint and
 * cover the epoch; the share sizes differ by at most one unless drop_last). */
typedef struct ch_loader ch_loader;

typedef struct ch_loader_options {
    int batch_size;      /* >= 1 */
    int shuffle;         /* 0: the data set's order */
    uint64_t seed;
    int drop_last;
    int workers;         /* assembling threads, >= 1 */
    int prefetch;        /* batches ready ahead, >= 1 */
    int rank, world;     /* 0 and 1 for a single process */
    ch_device *pin_for;  /* pinned for this device's transfers; NULL: plain memory */
    /* Random augmentation of each sample, as torchvision's transforms: a
     * set of CH_AUGMENT_* flags (0: none). The draws for the sample of data
     * set index i in epoch e are
     *     ctr = {i low 32 bits, i high, e low, e high};
     *     ch_philox4x32(ctr, seed ^ CH_AUGMENT_KEY);
     *     flip = ctr[0] & 1;  dy = ctr[1] % (2 * crop_pad + 1) - crop_pad;
     *     dx = ctr[2] % (2 * crop_pad + 1) - crop_pad;
     * (output pixel (y, x) is input pixel (y + dy, x + dx), 0 outside, and
     * the flip comes after the crop), so a sample is augmented the same way
     * whatever the workers, devices or ranks, and a resumed run sees what
     * the uninterrupted run saw. */
    unsigned augment;
    int crop_pad;        /* CH_AUGMENT_CROP: shift by up to this many pixels */
} ch_loader_options;

enum {
    /* Mirror the image left to right with probability 1/2
     * (RandomHorizontalFlip). */
    CH_AUGMENT_FLIP = 1u << 0,
    /* Pad by crop_pad pixels of value 0 (before normalisation) and crop a
     * window of the original size at a uniform offset (RandomCrop with
     * padding). */
    CH_AUGMENT_CROP = 1u << 1
};
#define CH_AUGMENT_KEY 0x6175676d656e7421ull /* "augment!" */

/* One batch: `count` samples (batch_size, or fewer for the last one). */
typedef struct ch_batch {
    ch_host_buffer *images;   /* count * sample_numel floats */
    ch_host_buffer *labels;   /* count int32 */
    const int64_t *indices;   /* the data set index of each sample */
    int count;
    int64_t epoch;
    int64_t number;           /* batch number within the epoch, from 0 */
} ch_batch;

CH_API ch_status ch_loader_new(ch_loader **out, const ch_dataset *ds,
                               const ch_loader_options *options);
/* Stops the workers; returns after they have exited. */
CH_API void ch_loader_free(ch_loader *loader);
/* Start epoch `epoch` at batch `first_batch` (0, or a position saved in a
 * checkpoint to resume exactly). Must come before the first ch_loader_next;
 * batches still held stay valid until released. */
CH_API ch_status ch_loader_start(ch_loader *loader, int64_t epoch, int64_t first_batch);
/* The next batch of the epoch, waiting for it if needed; *batch is NULL at
 * the end of the epoch. Give each batch back with ch_loader_release; a caller
 * may hold at most `prefetch` batches at once (CH_ERR_STATE beyond). */
CH_API ch_status ch_loader_next(ch_loader *loader, ch_batch **batch);
CH_API void ch_loader_release(ch_loader *loader, ch_batch *batch);
/* Batches in one epoch of this process's share. */
CH_API int64_t ch_loader_batches(const ch_loader *loader);

#ifdef __cplusplus
}
#endif

#endif
