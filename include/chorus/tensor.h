/* Chorus: tensors. */
#ifndef CHORUS_TENSOR_H
#define CHORUS_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <chorus/device.h>
#include <chorus/stream.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CH_MAX_DIMS 8

typedef enum ch_dtype {
    CH_F32 = 0,
    CH_I32 = 1,
    CH_BF16 = 2, /* bfloat16: storage for the float ops (chorus/ops.h), checkpoints */
    CH_F16 = 3   /* IEEE binary16: the same */
} ch_dtype;

CH_API const char *ch_dtype_name(ch_dtype dtype);
CH_API size_t ch_dtype_size(ch_dtype dtype); /* 0 for an unknown dtype */

/* A dense, row-major, contiguous array owned by one device. */
typedef struct ch_tensor ch_tensor;

/* A new tensor of `ndim` (1..8) dimensions, each >= 1. Its content is
 * undefined until written. */
CH_API ch_status ch_tensor_new(ch_tensor **out, ch_device *dev, ch_dtype dtype,
                               int ndim, const int64_t *shape);
/* Frees the tensor; the memory goes back to the device's cache once no view
 * refers to it. NULL is a no-op. */
CH_API void ch_tensor_free(ch_tensor *t);

/* Copy `bytes` (must equal the tensor's size) from host memory; returns when
 * the tensor holds the data, for work on any stream of its device (and so
 * `src` may be reused). */
CH_API ch_status ch_tensor_upload(ch_tensor *t, const void *src, size_t bytes);
/* Copy the tensor to host memory; returns when the data is there. */
CH_API ch_status ch_tensor_download(const ch_tensor *t, void *dst, size_t bytes);

/* Asynchronous copies between a pinned host buffer (from `offset`) and the
 * tensor, queued on the current stream of the tensor's device. The host
 * buffer must stay untouched until that stream is synchronised. */
CH_API ch_status ch_tensor_upload_async(ch_tensor *t, const ch_host_buffer *src,
                                        size_t offset);
CH_API ch_status ch_tensor_download_async(const ch_tensor *t, ch_host_buffer *dst,
                                          size_t offset);

/* A copy of `src` on `dev` (the guide's .to(device)). When `dev` is already
 * src's device the result is still a new tensor. */
CH_API ch_status ch_tensor_to(ch_tensor **out, const ch_tensor *src, ch_device *dev);

/* Rows [start, start + count) of the first dimension, sharing memory with
 * `src`: for splitting a batch without a copy. The view must be freed too;
 * the memory lives until the last of them is freed. */
CH_API ch_status ch_tensor_view(ch_tensor **out, ch_tensor *src, int64_t start,
                                int64_t count);

/* The same memory seen with another shape of the same element count. */
CH_API ch_status ch_tensor_reshape(ch_tensor **out, ch_tensor *src, int ndim,
                                   const int64_t *shape);

CH_API ch_device *ch_tensor_device(const ch_tensor *t);
CH_API ch_dtype ch_tensor_dtype(const ch_tensor *t);
CH_API int ch_tensor_ndim(const ch_tensor *t);
/* Size of dimension `dim`; negative counts from the end. 0 when out of range. */
CH_API int64_t ch_tensor_dim(const ch_tensor *t, int dim);
CH_API int64_t ch_tensor_numel(const ch_tensor *t);
CH_API size_t ch_tensor_nbytes(const ch_tensor *t);

#ifdef __cplusplus
}
#endif

#endif
