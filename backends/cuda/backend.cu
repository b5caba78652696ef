/* The CUDA backend module: its entry point, the slot table, and the
 * lifetime of the backend and its devices. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "common.cuh"

static ch_status chcu_read_info(int index, chcu_dev_info *info)
{
    cudaDeviceProp p;
    ch_status st = chcu_check(cudaGetDeviceProperties(&p, index), "cudaGetDeviceProperties");
    if (st)
        return st;
    snprintf(info->name, sizeof info->name, "%.*s", (int)sizeof info->name - 1, p.name);
    info->memory_bytes = p.totalGlobalMem;
    info->sm_count = p.multiProcessorCount;
    info->major = p.major;
    info->minor = p.minor;

    char bus[64];
    st = chcu_check(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, index), "cudaDeviceGetPCIBusId");
    if (st)
        return st;
    /* The driver may print an 8-digit domain and upper-case hex; discovery
     * matches the "dddd:bb:dd.f" lower-case form. */
    unsigned domain, b, d, f;
    if (sscanf(bus, "%x:%x:%x.%x", &domain, &b, &d, &f) != 4)
        return chi_error(CH_ERR_DRIVER, "cudaDeviceGetPCIBusId: unexpected bus id \"%s\"", bus);
    snprintf(info->pci_bus_id, sizeof info->pci_bus_id, "%04x:%02x:%02x.%x", domain, b, d, f);
    return CH_OK;
}

static void chcu_shutdown(void *ctx)
{
    chcu_backend *be = (chcu_backend *)ctx;
    if (!be)
        return;
    chcu_comms_free(be);
    pthread_mutex_destroy(&be->lock);
    free(be->info);
    free(be);
}

static ch_status chcu_count(int *count)
{
    /* With no driver the runtime returns without writing the count. */
    *count = 0;
    cudaError_t err = cudaGetDeviceCount(count);
    if (err == cudaSuccess)
        return *count > 0 ? CH_OK : chi_error(CH_ERR_UNAVAILABLE, "no CUDA device");
    (void)cudaGetLastError();
    const char *what = err == cudaErrorInsufficientDriver ? "no CUDA driver"
                       : err == cudaErrorNoDevice        ? "no CUDA device"
                                                         : "CUDA driver unusable";
    return chi_error(CH_ERR_UNAVAILABLE, "%s (cudaGetDeviceCount: %s)", what,
                     cudaGetErrorString(err));
}

static ch_status chcu_init(void **ctx, int *ndevices)
{
    *ctx = NULL;
    *ndevices = 0;
    chcu_nccl_mode nccl;
    ch_status st = chcu_nccl_mode_of_env(&nccl);
    if (st)
        return st;
    int count;
    st = chcu_count(&count);
    if (st)
        return st;
    /* Peer flags live in a fixed table; more GPUs than that in one process
     * is beyond any machine we target. */
    if (count > CHCU_MAX_DEVICES)
        count = CHCU_MAX_DEVICES;

    chcu_backend *be = (chcu_backend *)calloc(1, sizeof *be);
    chcu_dev_info *info = (chcu_dev_info *)calloc((size_t)count, sizeof *info);
    if (!be || !info) {
        free(be);
        free(info);
        return chi_error(CH_ERR_OUT_OF_MEMORY, "cuda init: out of host memory");
    }
    if (pthread_mutex_init(&be->lock, NULL) != 0) {
        free(be);
        free(info);
        return chi_error(CH_ERR_INTERNAL, "cuda init: pthread_mutex_init failed");
    }
    be->info = info;
    be->ndevices = count;
    be->nccl = nccl;
    for (int i = 0; i < count; i++) {
        st = chcu_read_info(i, &info[i]);
        if (st) {
            chcu_shutdown(be);
            return st;
        }
    }
    *ctx = be;
    *ndevices = count;
    return CH_OK;
}

static ch_status chcu_device_props(void *ctx, int index, ch_bdev_props *props)
{
    const chcu_dev_info *info = &((chcu_backend *)ctx)->info[index];
    memset(props, 0, sizeof *props);
    snprintf(props->name, sizeof props->name, "%s", info->name);
    snprintf(props->vendor, sizeof props->vendor, "NVIDIA");
    props->kind = CH_DEVICE_GPU;
    props->memory_bytes = info->memory_bytes;
    props->max_alloc_bytes = info->memory_bytes;
    props->compute_units = info->sm_count;
    snprintf(props->pci_bus_id, sizeof props->pci_bus_id, "%s", info->pci_bus_id);
    snprintf(props->detail, sizeof props->detail, "sm_%d%d", info->major, info->minor);
    return CH_OK;
}

static void chcu_device_close(void *dev)
{
    chcu_device *d = (chcu_device *)dev;
    if (!d)
        return;
    chcu_clock_release(d);
    chcu_events_release(d);
    chcu_counters_release(d);
    pthread_mutex_destroy(&d->event_lock);
    pthread_mutex_destroy(&d->clock_lock);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

static ch_status chcu_device_open(void *ctx, int index, void **dev)
{
    chcu_backend *be = (chcu_backend *)ctx;
    chcu_device *d = (chcu_device *)calloc(1, sizeof *d);
    if (!d)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "cuda device_open: out of host memory");
    if (pthread_mutex_init(&d->lock, NULL) != 0) {
        free(d);
        return chi_error(CH_ERR_INTERNAL, "cuda device_open: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&d->clock_lock, NULL) != 0) {
        pthread_mutex_destroy(&d->lock);
        free(d);
        return chi_error(CH_ERR_INTERNAL, "cuda device_open: pthread_mutex_init failed");
    }
    if (pthread_mutex_init(&d->event_lock, NULL) != 0) {
        pthread_mutex_destroy(&d->clock_lock);
        pthread_mutex_destroy(&d->lock);
        free(d);
        return chi_error(CH_ERR_INTERNAL, "cuda device_open: pthread_mutex_init failed");
    }
    d->be = be;
    d->index = index;
    d->sm_count = be->info[index].sm_count;
    d->memory_bytes = be->info[index].memory_bytes;
    /* The device's primary context is made now, so that a device that
     * cannot start fails here rather than at its first op. */
    int caller = chcu_current();
    ch_status st = chcu_enter(d);
    chcu_restore(caller);
    if (st) {
        chcu_device_close(d);
        return st;
    }
    *dev = d;
    return CH_OK;
}

static ch_status chcu_mem_info(void *dev, uint64_t *free_bytes, uint64_t *total_bytes)
{
    ch_status st = chcu_enter((chcu_device *)dev);
    if (st)
        return st;
    size_t fb = 0, tb = 0;
    st = chcu_check(cudaMemGetInfo(&fb, &tb), "cudaMemGetInfo");
    if (st)
        return st;
    *free_bytes = fb;
    *total_bytes = tb;
    return CH_OK;
}

/* In the order of lib/backend.h's list: C++ wants designated initializers
 * in declaration order. */
static const ch_backend_i chcu_table = {
    .abi_version = CH_BACKEND_ABI_VERSION,
    .name = "cuda",
    /* Above OpenCL (10): a GPU that both drive is kept as cuda:N. */
    .priority = 50,
#ifdef CH_HAVE_NCCL
    .span_id_bytes = chcu_span_id_bytes,
#else
    .span_id_bytes = 0,
#endif
    .init = chcu_init,
    .shutdown = chcu_shutdown,
    .device_props = chcu_device_props,
    .device_open = chcu_device_open,
    .device_close = chcu_device_close,
    .mem_info = chcu_mem_info,
    .counters = chcu_counters,
    .alloc = chcu_alloc,
    .free = chcu_free,
    .host_alloc = chcu_host_alloc,
    .host_free = chcu_host_free,
    .stream_new = chcu_stream_new,
    .stream_free = chcu_stream_free,
    .stream_sync = chcu_stream_sync,
    .event_new = chcu_event_new,
    .event_free = chcu_event_free,
    .event_record = chcu_event_record,
    .event_wait = chcu_event_wait,
    .event_sync = chcu_event_sync,
    .event_seconds = chcu_event_seconds,
    .upload = chcu_upload,
    .download = chcu_download,
    .copy = chcu_copy,
    .can_peer = chcu_can_peer,
    .peer_copy = chcu_peer_copy,
    .fill = chcu_fill,
    .gemm = chcu_gemm,
    .binary = chcu_binary,
    .axpby = chcu_axpby,
    .act_forward = chcu_act_forward,
    .act_backward = chcu_act_backward,
    .bias_add = chcu_bias_add,
    .bias_grad = chcu_bias_grad,
    .softmax_xent = chcu_softmax_xent,
    .softmax_xent_backward = chcu_softmax_xent_backward,
    .softmax_xent_fused = chcu_softmax_xent_fused,
    .transpose01 = chcu_transpose01,
    .im2col = chcu_im2col,
    .col2im = chcu_col2im,
    .maxpool_forward = chcu_maxpool_forward,
    .maxpool_backward = chcu_maxpool_backward,
    .sum_axis = chcu_sum_axis,
    .argmax = chcu_argmax,
    .sgd_step = chcu_sgd_step,
    .adam_step = chcu_adam_step,
    .adam_step_half = chcu_adam_step_half,
    .adam_step_multi = chcu_adam_step_multi,
    .rand = chcu_rand,
    .gemm_batched = chcu_gemm_batched,
    .permute = chcu_permute,
    .softmax = chcu_softmax,
    .softmax_backward = chcu_softmax_backward,
    /* FlashAttention's tiles (flash.cu). */
    .attention = chcu_attention,
    .attention_backward = chcu_attention_backward,
    .embedding = chcu_embedding,
    .embedding_backward = chcu_embedding_backward,
    .layernorm = chcu_layernorm,
    .layernorm_backward = chcu_layernorm_backward,
    .add_layernorm = chcu_add_layernorm,
    .layernorm_backward_add = chcu_layernorm_backward_add,
    .channel_sums = chcu_channel_sums,
    .batchnorm_stats = chcu_batchnorm_stats,
    .batchnorm_forward = chcu_batchnorm_forward,
    .batchnorm_backward = chcu_batchnorm_backward,
    .f32_to_bf16 = chcu_f32_to_bf16,
    .bf16_to_f32 = chcu_bf16_to_f32,
    .f32_to_f16 = chcu_f32_to_f16,
    .f16_to_f32 = chcu_f16_to_f32,
    /* No convolution of its own: the core composes im2col, a cuBLAS GEMM
     * and a transpose (cuDNN's would fill these). */
    .conv2d_workspace = nullptr,
    .conv2d_forward = nullptr,
    .conv2d_backward = nullptr,
    .gemm_half = chcu_gemm_half,
    /* cuBLASLt's GELU epilogues, for CH_ACT_GELU_TANH (gemm.cu). */
    .gemm_bias_act = chcu_gemm_bias_act,
    /* No half convolution of its own either: the core widens the inputs
     * and composes the f32 one (cuDNN's would fill these). */
    .conv2d_half_workspace = nullptr,
    .conv2d_half_forward = nullptr,
    .conv2d_half_backward = nullptr,
    .allreduce_sum = chcu_allreduce_sum,
    .can_allreduce = chcu_can_allreduce,
#ifdef CH_HAVE_NCCL
    /* Across the processes of an MPI job: NCCL's communicators. */
    .span_id = chcu_span_id,
    .span_new = chcu_span_new,
    .span_allreduce = chcu_span_allreduce,
    .span_free = chcu_span_free,
#else
    .span_id = nullptr,
    .span_new = nullptr,
    .span_allreduce = nullptr,
    .span_free = nullptr,
#endif
};

extern "C" CH_API const ch_backend_i *chorus_backend_entry(void)
{
    return &chcu_table;
}
