/* The host backend: one device, "host", the machine's own CPUs.
 *
 * Work runs synchronously on the calling thread (OpenMP inside the big ops),
 * so streams and events are small real objects whose waits have nothing
 * left to wait for. Device memory is host memory: transfers are memcpy. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <chorus/clock.h>

#include "host.h"
#include "trace.h"

typedef struct host_ctx {
    ch_bdev_props props;
} host_ctx;

typedef struct host_dev {
    uint64_t memory_bytes;
    uint64_t max_alloc_bytes;
} host_dev;

/* A stream: chi_host_stream (host.h), its device the host_dev. */
typedef chi_host_stream host_stream;

typedef struct host_event {
    uint64_t records; /* how often it was recorded: nothing is ever pending */
    /* ch_clock_seconds at the last record, when a trace ran then (the work
     * before it has run: it ran at its call); timed 0 otherwise, and then
     * the clock is not read. */
    double seconds;
    int timed;
} host_event;

/* ---- lifetime -------------------------------------------------------------- */

/* The value of the first "key : value" line of a /proc file, or 0. */
static int proc_field(const char *path, const char *key, char *out, size_t size)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char line[512];
    size_t klen = strlen(key);
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (strncmp(line, key, klen) != 0 || !colon)
            continue;
        char *v = colon + 1;
        v += strspn(v, " \t");
        v[strcspn(v, "\n")] = '\0';
        snprintf(out, size, "%s", v);
        found = 1;
    }
    fclose(f);
    return found;
}

static ch_status sysconf_checked(int name, const char *what, long *out)
{
    errno = 0;
    long v = sysconf(name);
    if (v <= 0)
        return chi_error(CH_ERR_DRIVER, "host: sysconf(%s) failed: %s", what,
                         errno ? strerror(errno) : "no value");
    *out = v;
    return CH_OK;
}

static ch_status host_props_fill(ch_bdev_props *p)
{
    long pages, page_size, cpus;
    ch_status st = sysconf_checked(_SC_PHYS_PAGES, "_SC_PHYS_PAGES", &pages);
    if (st == CH_OK)
        st = sysconf_checked(_SC_PAGESIZE, "_SC_PAGESIZE", &page_size);
    if (st == CH_OK)
        st = sysconf_checked(_SC_NPROCESSORS_ONLN, "_SC_NPROCESSORS_ONLN", &cpus);
    if (st != CH_OK)
        return st;
    memset(p, 0, sizeof *p);
    /* /proc/cpuinfo is Linux (and x86) specific: plain names elsewhere. */
    if (!proc_field("/proc/cpuinfo", "model name", p->name, sizeof p->name))
        snprintf(p->name, sizeof p->name, "CPU");
    if (!proc_field("/proc/cpuinfo", "vendor_id", p->vendor, sizeof p->vendor))
        snprintf(p->vendor, sizeof p->vendor, "unknown");
    p->kind = CH_DEVICE_CPU;
    p->memory_bytes = (uint64_t)pages * (uint64_t)page_size;
    p->max_alloc_bytes = p->memory_bytes;
    p->compute_units = (int)cpus;
#ifdef HAVE_ONEDNN
    snprintf(p->detail, sizeof p->detail, "GEMM: oneDNN");
#elif defined(HAVE_BLAS)
    snprintf(p->detail, sizeof p->detail, "GEMM: OpenBLAS");
#else
    snprintf(p->detail, sizeof p->detail, "GEMM: blocked C");
#endif
    return CH_OK;
}

static ch_status host_init(void **ctx, int *ndevices)
{
    host_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host: calloc(%zu) failed", sizeof *c);
    ch_status st = host_props_fill(&c->props);
    if (st != CH_OK) {
        free(c);
        return st;
    }
    *ctx = c;
    *ndevices = 1;
    return CH_OK;
}

static void host_shutdown(void *ctx)
{
#ifdef HAVE_ONEDNN
    chi_host_dnnl_shutdown();
#endif
    free(ctx);
}

static ch_status host_device_props(void *ctx, int index, ch_bdev_props *props)
{
    (void)index;
    *props = ((const host_ctx *)ctx)->props;
    return CH_OK;
}

static ch_status host_device_open(void *ctx, int index, void **dev)
{
    (void)index;
    host_dev *d = calloc(1, sizeof *d);
    if (!d)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host: calloc(%zu) failed", sizeof *d);
    d->memory_bytes = ((const host_ctx *)ctx)->props.memory_bytes;
    d->max_alloc_bytes = ((const host_ctx *)ctx)->props.max_alloc_bytes;
    *dev = d;
    return CH_OK;
}

static void host_device_close(void *dev)
{
    free(dev);
}

/* MemAvailable (what can be allocated without swapping) where /proc has
 * it; the free pages the C library reports otherwise. */
static ch_status host_mem_info(void *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    char value[64];
    unsigned long long kib;
    *total_bytes = ((const host_dev *)dev)->memory_bytes;
    if (proc_field("/proc/meminfo", "MemAvailable", value, sizeof value) &&
        sscanf(value, "%llu", &kib) == 1) {
        *free_bytes = (uint64_t)kib * 1024u;
        return CH_OK;
    }
    long pages, page_size;
    ch_status st = sysconf_checked(_SC_AVPHYS_PAGES, "_SC_AVPHYS_PAGES", &pages);
    if (st == CH_OK)
        st = sysconf_checked(_SC_PAGESIZE, "_SC_PAGESIZE", &page_size);
    if (st == CH_OK)
        *free_bytes = (uint64_t)pages * (uint64_t)page_size;
    return st;
}

/* ---- memory ---------------------------------------------------------------- */

/* 64-byte alignment: a cache line, and the widest vector load. */
static ch_status host_alloc(void *dev, size_t bytes, void **ptr)
{
    const host_dev *d = dev;
    if (bytes > d->max_alloc_bytes)
        return chi_error(CH_ERR_LIMIT, "host: %zu bytes is more than the machine's "
                                       "memory (%llu bytes)",
                         bytes, (unsigned long long)d->max_alloc_bytes);
    int rc = posix_memalign(ptr, 64, bytes);
    if (rc != 0)
        return chi_error(CH_ERR_DEVICE_OUT_OF_MEMORY, "host: posix_memalign(%zu bytes): %s",
                         bytes, strerror(rc));
    return CH_OK;
}

static void host_free(void *dev, void *ptr)
{
    (void)dev;
    free(ptr);
}

/* ---- streams and events -------------------------------------------------- */

static ch_status host_stream_new(void *dev, void **stream)
{
    host_stream *s = calloc(1, sizeof *s);
    if (!s)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host: calloc(%zu) for a stream failed",
                         sizeof *s);
    s->dev = dev;
    *stream = s;
    return CH_OK;
}

static void host_stream_free(void *stream)
{
    host_stream *s = stream;
    if (s)
        free(s->scratch);
    free(s);
}

static ch_status host_stream_sync(void *stream)
{
    (void)stream;
    return CH_OK;
}

static ch_status host_event_new(void *dev, void **event)
{
    (void)dev;
    host_event *e = calloc(1, sizeof *e);
    if (!e)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "host: calloc(%zu) for an event failed",
                         sizeof *e);
    *event = e;
    return CH_OK;
}

static void host_event_free(void *event)
{
    free(event);
}

static ch_status host_event_record(void *event, void *stream)
{
    (void)stream;
    host_event *e = event;
    e->records++;
    e->timed = chi_tracing();
    if (e->timed)
        e->seconds = ch_clock_seconds();
    return CH_OK;
}

static ch_status host_event_wait(void *stream, void *event)
{
    (void)stream;
    (void)event;
    return CH_OK;
}

static ch_status host_event_sync(void *event)
{
    (void)event;
    return CH_OK;
}

static ch_status host_event_seconds(void *event, double *seconds)
{
    const host_event *e = event;
    if (!e->timed)
        return chi_error(CH_ERR_UNSUPPORTED, "host event_seconds: the event was %s",
                         e->records ? "recorded while no trace ran" : "never recorded");
    *seconds = e->seconds;
    return CH_OK;
}

/* ---- transfers ------------------------------------------------------------- */

static void *addr(ch_bmem m)
{
    return (char *)m.ptr + m.off;
}

static ch_status host_upload(void *stream, ch_bmem dst, const void *host, size_t bytes,
                             int blocking)
{
    (void)stream;
    (void)blocking;
    memcpy(addr(dst), host, bytes);
    return CH_OK;
}

static ch_status host_download(void *stream, void *host, ch_bmem src, size_t bytes,
                               int blocking)
{
    (void)stream;
    (void)blocking;
    memcpy(host, addr(src), bytes);
    return CH_OK;
}

static ch_status host_copy(void *stream, ch_bmem dst, ch_bmem src, size_t bytes)
{
    (void)stream;
    memcpy(addr(dst), addr(src), bytes);
    return CH_OK;
}

/* ---- the table ------------------------------------------------------------- */

static const ch_backend_i host_iface = {
    .abi_version = CH_BACKEND_ABI_VERSION,
    .name = "host",
    /* Above every module: the host CPU is only ever this backend's (an
     * OpenCL CPU device is the same cores, but no PCI bus id ties them). */
    .priority = 100,
    .init = host_init,
    .shutdown = host_shutdown,
    .device_props = host_device_props,
    .device_open = host_device_open,
    .device_close = host_device_close,
    .mem_info = host_mem_info,
    .alloc = host_alloc,
    .free = host_free,
    .host_alloc = NULL,
    .host_free = NULL,
    .stream_new = host_stream_new,
    .stream_free = host_stream_free,
    .stream_sync = host_stream_sync,
    .event_new = host_event_new,
    .event_free = host_event_free,
    .event_record = host_event_record,
    .event_wait = host_event_wait,
    .event_sync = host_event_sync,
    .event_seconds = host_event_seconds,
    .upload = host_upload,
    .download = host_download,
    .copy = host_copy,
    .can_peer = NULL,
    .peer_copy = NULL,
    .fill = chi_host_fill,
    .gemm = chi_host_gemm,
    .binary = chi_host_binary,
    .axpby = chi_host_axpby,
    .act_forward = chi_host_act_forward,
    .act_backward = chi_host_act_backward,
    .bias_add = chi_host_bias_add,
    .bias_grad = chi_host_bias_grad,
    .softmax_xent = chi_host_softmax_xent,
    .softmax_xent_backward = chi_host_softmax_xent_backward,
    .softmax_xent_fused = chi_host_softmax_xent_fused,
    .transpose01 = chi_host_transpose01,
    .im2col = chi_host_im2col,
    .col2im = chi_host_col2im,
    .conv2d_workspace = chi_host_conv2d_workspace,
    .conv2d_forward = chi_host_conv2d_forward,
    .conv2d_backward = chi_host_conv2d_backward,
    .maxpool_forward = chi_host_maxpool_forward,
    .maxpool_backward = chi_host_maxpool_backward,
    .sum_axis = chi_host_sum_axis,
    .argmax = chi_host_argmax,
    .sgd_step = chi_host_sgd_step,
    .adam_step = chi_host_adam_step,
    .adam_step_half = chi_host_adam_step_half,
    .adam_step_multi = chi_host_adam_step_multi,
    .rand = chi_host_rand,
    .gemm_batched = chi_host_gemm_batched,
    .permute = chi_host_permute,
    .softmax = chi_host_softmax,
    .softmax_backward = chi_host_softmax_backward,
    .attention = chi_host_attention,
    .attention_backward = chi_host_attention_backward,
    .embedding = chi_host_embedding,
    .embedding_backward = chi_host_embedding_backward,
    .layernorm = chi_host_layernorm,
    .layernorm_backward = chi_host_layernorm_backward,
    .add_layernorm = chi_host_add_layernorm,
    .layernorm_backward_add = chi_host_layernorm_backward_add,
    .channel_sums = chi_host_channel_sums,
    .batchnorm_stats = chi_host_batchnorm_stats,
    .batchnorm_forward = chi_host_batchnorm_forward,
    .batchnorm_backward = chi_host_batchnorm_backward,
    .allreduce_sum = chi_host_allreduce_sum,
    .can_allreduce = chi_host_can_allreduce,
    .f32_to_bf16 = chi_host_f32_to_bf16,
    .bf16_to_f32 = chi_host_bf16_to_f32,
    .f32_to_f16 = chi_host_f32_to_f16,
    .f16_to_f32 = chi_host_f16_to_f32,
#ifdef HAVE_ONEDNN
    .gemm_half = chi_host_gemm_half,
    .conv2d_half_workspace = chi_host_conv2d_half_workspace,
    .conv2d_half_forward = chi_host_conv2d_half_forward,
    .conv2d_half_backward = chi_host_conv2d_half_backward,
#endif
};

const ch_backend_i *chi_host_backend(void)
{
    return &host_iface;
}
