/* The layout of a data set, shared by nn/dataset.c and nn/loader.c (the
 * loader's workers convert pixels straight from it, without a call per
 * sample). */
#ifndef CHORUS_NN_DATASET_H
#define CHORUS_NN_DATASET_H

#include <stdint.h>
#include <chorus/data.h>

struct ch_dataset {
    const uint8_t *pixels; /* count * rows * cols bytes, sample after sample */
    const uint8_t *labels; /* count bytes */
    uint8_t *own_pixels;   /* what free releases: NULL in a head view, */
    uint8_t *own_labels;   /* which shares its source's memory */
    int64_t count;
    int rows, cols;
    int classes;
    float mean, std;       /* the normalisation: (byte / 255 - mean) / std */
    float lut[256];        /* normalised value of each byte */
};

/* Sample `index` (in range) as normalised floats and its label. */
static inline void chn_dataset_fill(const ch_dataset *ds, int64_t index, float *image,
                                    int32_t *label)
{
    int64_t numel = (int64_t)ds->rows * ds->cols;
    const uint8_t *src = ds->pixels + index * numel;
    for (int64_t k = 0; k < numel; k++)
        image[k] = ds->lut[src[k]];
    *label = ds->labels[index];
}

#endif
