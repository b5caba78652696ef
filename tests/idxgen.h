/* Small IDX files for the data set and loader tests, written at test time
 * into a temporary folder (no binary files in the repository). */
#ifndef CHORUS_TESTS_IDXGEN_H
#define CHORUS_TESTS_IDXGEN_H

#include <stddef.h>
#include <stdint.h>

#define IDXGEN_IMAGES_MAGIC 0x00000803u
#define IDXGEN_LABELS_MAGIC 0x00000801u

/* The generated content: byte k of image i, and the label of sample i. */
uint8_t idxgen_pixel(int64_t i, int64_t k);
uint8_t idxgen_label(int64_t i, int classes);

/* Bytes of a whole IDX file (header and payload), malloc'ed; *len is set.
 * The header says `n` items; the payload holds `n` items too. */
uint8_t *idxgen_images(uint32_t n, uint32_t rows, uint32_t cols, size_t *len);
uint8_t *idxgen_labels(uint32_t n, int classes, size_t *len);

/* Writes `len` bytes to `path`, gzip-compressed (zlib) when gz. 0 on success. */
int idxgen_write(const char *path, const uint8_t *bytes, size_t len, int gz);
/* Reads a whole file (malloc'ed); NULL on failure. */
uint8_t *idxgen_read(const char *path, size_t *len);

/* A fresh folder under $TMPDIR (or /tmp); NULL on failure. */
const char *idxgen_tmpdir(void);
/* Removes the files in the folder and the folder. */
void idxgen_cleanup(const char *dir);

#endif
