/* All-reduce (sum) over devices of one context, the OpenCL peer path of
 * data parallelism. Buffers belong to the context, so the first device's
 * axpby kernel reads the others' buffers in place (the runtime moves the
 * data); the sum goes bufs[0] += bufs[1], += bufs[2], ... in that order,
 * so every run gives the same bits. Then each device copies the sum back. */
#include "config.h"

#include "opencl.h"

static ch_status same_context(int count, void *const *streams)
{
    chcl_stream *root = streams[0];
    for (int i = 1; i < count; i++) {
        chcl_stream *s = streams[i];
        if (s->dev->plat != root->dev->plat)
            return chi_error(CH_ERR_UNSUPPORTED,
                             "opencl allreduce_sum: %s and %s are in different platforms "
                             "(no shared context); reduce through host memory",
                             root->dev->name, s->dev->name);
    }
    return CH_OK;
}

static ch_status sum_into_root(int count, void *const *streams, const ch_bmem *bufs,
                               int64_t n)
{
    chcl_stream *root = streams[0];
    for (int i = 1; i < count; i++) {
        ch_status st = chcl_stream_after(root, streams[i]);
        if (st == CH_OK)
            st = chcl_axpby(root, n, bufs[0], 1.0f, bufs[i], 1.0f);
        if (st != CH_OK)
            return st;
    }
    return CH_OK;
}

/* Each device copies the sum on its own stream; the first device's stream
 * then waits for those copies, so later work there cannot overwrite the
 * sum while it is read. */
static ch_status broadcast(int count, void *const *streams, const ch_bmem *bufs,
                           int64_t n)
{
    chcl_stream *root = streams[0];
    for (int i = 1; i < count; i++) {
        chcl_stream *s = streams[i];
        ch_status st = chcl_stream_after(s, root);
        if (st == CH_OK)
            st = chcl_peer_copy(s, bufs[i], root->dev, bufs[0], (size_t)n * sizeof(float));
        if (st != CH_OK)
            return st;
    }
    for (int i = 1; i < count; i++) {
        ch_status st = chcl_stream_after(root, streams[i]);
        if (st != CH_OK)
            return st;
    }
    return CH_OK;
}

/* Buffers of one platform share its context: the kernel of one device
 * reads the others' in place. Across platforms there is no shared context. */
int chcl_can_allreduce(void *dev_a, void *dev_b)
{
    return ((chcl_device *)dev_a)->plat == ((chcl_device *)dev_b)->plat;
}

ch_status chcl_allreduce_sum(int count, void *const *streams, const ch_bmem *bufs,
                             int64_t n)
{
    ch_status st = chcl_check_count("allreduce_sum", n);
    if (st == CH_OK)
        st = same_context(count, streams);
    if (st == CH_OK)
        st = sum_into_root(count, streams, bufs, n);
    if (st == CH_OK)
        st = broadcast(count, streams, bufs, n);
    return st;
}
