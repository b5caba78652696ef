/* Device and pinned host memory, transfers and peer copies. */
#include "common.cuh"

ch_status chcu_alloc(void *dev, size_t bytes, void **ptr)
{
    chcu_device *d = (chcu_device *)dev;
    if (bytes > d->memory_bytes)
        return chi_error(CH_ERR_LIMIT, "cudaMalloc: %zu bytes is more than cuda:%d has (%llu)",
                         bytes, d->index, (unsigned long long)d->memory_bytes);
    ch_status st = chcu_enter(d);
    if (st)
        return st;
    cudaError_t err = cudaMalloc(ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        return chi_error(CH_ERR_DEVICE_OUT_OF_MEMORY, "cudaMalloc(%zu bytes): out of memory on cuda:%d",
                         bytes, d->index);
    }
    return chcu_check(err, "cudaMalloc");
}

void chcu_free(void *dev, void *ptr)
{
    if (chcu_enter((chcu_device *)dev) == CH_OK)
        (void)chcu_check(cudaFree(ptr), "cudaFree");
}

ch_status chcu_host_alloc(void *dev, size_t bytes, void **ptr)
{
    ch_status st = chcu_enter((chcu_device *)dev);
    if (st)
        return st;
    /* Portable: any CUDA device may use the buffer, not only this one. */
    cudaError_t err = cudaHostAlloc(ptr, bytes, cudaHostAllocPortable);
    if (err == cudaErrorMemoryAllocation)
        return chcu_fail(CH_ERR_OUT_OF_MEMORY, err, "cudaHostAlloc");
    return chcu_check(err, "cudaHostAlloc");
}

void chcu_host_free(void *dev, void *ptr)
{
    (void)dev;
    (void)chcu_check(cudaFreeHost(ptr), "cudaFreeHost");
}

static ch_status chcu_transfer(chcu_stream *s, void *dst, const void *src, size_t bytes,
                               cudaMemcpyKind kind, int blocking, const char *what)
{
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    st = chcu_check(cudaMemcpyAsync(dst, src, bytes, kind, s->s), what);
    if (st || !blocking)
        return st;
    /* A blocking transfer waits for the stream: the checks queued before it
     * are read there (reading the loss reports its labels). */
    return chcu_stream_wait(s, "cudaStreamSynchronize");
}

ch_status chcu_upload(void *stream, ch_bmem dst, const void *host, size_t bytes, int blocking)
{
    return chcu_transfer((chcu_stream *)stream, chcu_at<char>(dst), host, bytes,
                         cudaMemcpyHostToDevice, blocking, "cudaMemcpyAsync(upload)");
}

ch_status chcu_download(void *stream, void *host, ch_bmem src, size_t bytes, int blocking)
{
    return chcu_transfer((chcu_stream *)stream, host, chcu_at<char>(src), bytes,
                         cudaMemcpyDeviceToHost, blocking, "cudaMemcpyAsync(download)");
}

ch_status chcu_copy(void *stream, ch_bmem dst, ch_bmem src, size_t bytes)
{
    return chcu_transfer((chcu_stream *)stream, chcu_at<char>(dst), chcu_at<char>(src), bytes,
                         cudaMemcpyDeviceToDevice, 0, "cudaMemcpyAsync(copy)");
}

/* 1 when `dst` can now read `src`'s memory directly. */
static int chcu_peer_enable(const chcu_device *dst, const chcu_device *src)
{
    int ok = 0;
    if (chcu_check(cudaDeviceCanAccessPeer(&ok, dst->index, src->index),
                   "cudaDeviceCanAccessPeer") || !ok)
        return 0;
    if (chcu_enter(dst))
        return 0;
    cudaError_t err = cudaDeviceEnablePeerAccess(src->index, 0);
    if (err == cudaErrorPeerAccessAlreadyEnabled) {
        /* Someone else in the process enabled it: fine, but the error stays
         * as the thread's last error unless read. */
        (void)cudaGetLastError();
        return 1;
    }
    return chcu_check(err, "cudaDeviceEnablePeerAccess") == CH_OK;
}

int chcu_can_peer(void *src_dev, void *dst_dev)
{
    chcu_device *src = (chcu_device *)src_dev, *dst = (chcu_device *)dst_dev;
    if (src->index == dst->index)
        return 1;
    pthread_mutex_lock(&dst->lock);
    if (dst->peer[src->index] == 0) {
        int caller = chcu_current();
        dst->peer[src->index] = chcu_peer_enable(dst, src) ? 1 : 2;
        chcu_restore(caller);
    }
    int ok = dst->peer[src->index] == 1;
    pthread_mutex_unlock(&dst->lock);
    return ok;
}

ch_status chcu_peer_copy(void *stream, ch_bmem dst, void *src_dev, ch_bmem src, size_t bytes)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    return chcu_check(cudaMemcpyPeerAsync(chcu_at<char>(dst), s->dev->index, chcu_at<char>(src),
                                          ((chcu_device *)src_dev)->index, bytes, s->s),
                      "cudaMemcpyPeerAsync");
}
