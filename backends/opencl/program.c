/* Programs and kernels: the embedded .cl sources built once per context on
 * first use, kernel objects created once per device, and the launch helper
 * every op goes through. */
#include "config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opencl.h"

/* -cl-std=CL1.2 keeps the kernels to what every 1.2 device compiles; no
 * fast-math option, so results (the Philox uniform bits above all) match the
 * host's. */
#define BUILD_OPTIONS "-cl-std=CL1.2"

/* Correctly rounded divide and sqrt when every device of the context
 * offers them: the optimizer kernels then match the host's arithmetic bit
 * for bit (lib/kernels/optim_step.h). */
static const char *rounding_option(cl_context ctx)
{
    cl_device_id devs[64];
    size_t bytes = 0;
    if (clGetContextInfo(ctx, CL_CONTEXT_DEVICES, sizeof devs, devs, &bytes) != CL_SUCCESS ||
        bytes == 0)
        return "";
    for (size_t i = 0; i < bytes / sizeof devs[0]; i++) {
        cl_device_fp_config fp = 0;
        if (clGetDeviceInfo(devs[i], CL_DEVICE_SINGLE_FP_CONFIG, sizeof fp, &fp, NULL) !=
                CL_SUCCESS ||
            !(fp & CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT))
            return "";
    }
    return " -cl-fp32-correctly-rounded-divide-sqrt";
}

/* BUILD_OPTIONS, the rounding option, and -DCH_NAME=value for every enum
 * value that crosses the backend ABI (chcl_enum_values). */
static ch_status build_options(cl_context ctx, char *out, size_t cap)
{
    size_t len = (size_t)snprintf(out, cap, "%s%s", BUILD_OPTIONS, rounding_option(ctx));
    for (int i = 0; i < chcl_enum_count && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, " -D%s=%d", chcl_enum_values[i].name,
                                chcl_enum_values[i].value);
    if (len >= cap)
        return chi_error(CH_ERR_INTERNAL, "opencl: the build options need more than %zu bytes",
                         cap);
    return CH_OK;
}

/* Work-group size of 1-D launches: a multiple of every GPU's SIMD width,
 * and small enough for the devices that cap work-groups at 256. */
#define GROUP_1D 256

/* Elements a reduction's work-item takes, at least, where the work-group
 * would otherwise be larger: several loads in flight a work-item is how a
 * GPU hides its memory's latency, and a group no larger than its data
 * keeps the tree in local memory short. */
#define REDUCE_ITEM_ELEMENTS 16

/* The most a build log adds to an error message. */
#define LOG_MAX 700

/* Room for the build options: a few dozen enum values. */
#define OPTIONS_MAX 4096

/* The index width of the programs compiled once per width (conv.cl,
 * permute.cl; lib/kernels/index.h's rule): IDX the index type, IDX_NAME
 * the kernels' and index.h's names of that width. */
#define WIDTH_32 "#define IDX int\n#define IDX_NAME(f) f##_32\n"
#define WIDTH_64 "#undef IDX\n#undef IDX_NAME\n#define IDX long\n#define IDX_NAME(f) f##_64\n"
/* The sources and their count of such a program. */
/* clang-format off */
#define PER_WIDTH(src)                                                                     \
    (const char *const[]){chcl_src_prelude, chcl_src_index, WIDTH_32, src, WIDTH_64, src}, 6
/* clang-format on */

/* flash.cl once per variant (flash.cl says which): its head size, its
 * tiles in local memory or not, and its names' suffix. */
#define FLASH_VARIANT(hd, local, name)                                                             \
    "#define FLASH_HD " #hd "\n#define FLASH_LOCAL " #local "\n#define FLASH_NAME(f) f##_" #name   \
    "\n",                                                                                          \
        chcl_src_flash

/* The sources of each program, in the order they are concatenated. */
static const struct {
    const char *name;
    const char *const *sources;
    int nsources;
} programs[CHCL_P_COUNT] = {
    [CHCL_P_ELEMENTWISE] = {"elementwise.cl",
                            (const char *const[]){
                                chcl_src_prelude,
                                chcl_src_act,
                                chcl_src_half_bits,
                                chcl_src_optim_step,
                                chcl_src_elementwise,
                            },
                            5},
    /* gemm.cl once per work-group shape, GEMM_WG 0 its gemm_simple. */
    [CHCL_P_GEMM] = {"gemm.cl",
                     (const char *const[]){
                         "#define GEMM_WG 16\n#define GEMM_NAME gemm\n", chcl_src_gemm,
                         "#define GEMM_WG 8\n#define GEMM_NAME gemm_wg8\n", chcl_src_gemm,
                         "#define GEMM_WG 4\n#define GEMM_NAME gemm_wg4\n", chcl_src_gemm,
                         "#define GEMM_WG 0\n", chcl_src_gemm},
                     8},
    [CHCL_P_SUM] = {"sum.cl", (const char *const[]){chcl_src_common, chcl_src_sum}, 2},
    [CHCL_P_SOFTMAX] = {"softmax.cl",
                        (const char *const[]){chcl_src_prelude, chcl_src_common, chcl_src_half_bits,
                                              chcl_src_xent, chcl_src_softmax},
                        5},
    [CHCL_P_CONV] = {"conv.cl", PER_WIDTH(chcl_src_conv)},
    [CHCL_P_RAND] = {"rand.cl", (const char *const[]){chcl_src_philox, chcl_src_rand}, 2},
    [CHCL_P_ATTENTION] = {"attention.cl",
                          (const char *const[]){chcl_src_common, chcl_src_attention}, 2},
    [CHCL_P_PERMUTE] = {"permute.cl", PER_WIDTH(chcl_src_permute)},
    [CHCL_P_NORM] = {"norm.cl",
                     (const char *const[]){chcl_src_prelude, chcl_src_common, chcl_src_half_bits,
                                           chcl_src_normalize, chcl_src_index, chcl_src_norm},
                     6},
    [CHCL_P_FLASH] = {"flash.cl",
                      (const char *const[]){chcl_src_prelude, chcl_src_attn,
                                            FLASH_VARIANT(16, 1, 16), FLASH_VARIANT(32, 1, 32),
                                            FLASH_VARIANT(64, 1, 64), FLASH_VARIANT(128, 1, 128),
                                            FLASH_VARIANT(0, 1, any), FLASH_VARIANT(0, 0, global)},
                      14},
};

/* A flash.cl kernel's variants (opencl.h's order). */
#define FLASH_KERNELS(ID, name)                                                                    \
    [CHCL_K_FLASH_##ID##_16] = {"flash_" #name "_16", CHCL_P_FLASH},                               \
    [CHCL_K_FLASH_##ID##_32] = {"flash_" #name "_32", CHCL_P_FLASH},                               \
    [CHCL_K_FLASH_##ID##_64] = {"flash_" #name "_64", CHCL_P_FLASH},                               \
    [CHCL_K_FLASH_##ID##_128] = {"flash_" #name "_128", CHCL_P_FLASH},                             \
    [CHCL_K_FLASH_##ID##_ANY] = {"flash_" #name "_any", CHCL_P_FLASH},                             \
    [CHCL_K_FLASH_##ID##_GLOBAL] = {"flash_" #name "_global", CHCL_P_FLASH}

static const struct {
    const char *name;
    chcl_prog_id prog;
} kernels[CHCL_K_COUNT] = {
    [CHCL_K_BINARY] = {"binary", CHCL_P_ELEMENTWISE},
    [CHCL_K_AXPBY] = {"axpby", CHCL_P_ELEMENTWISE},
    [CHCL_K_F32_TO_BF16] = {"f32_to_bf16", CHCL_P_ELEMENTWISE},
    [CHCL_K_BF16_TO_F32] = {"bf16_to_f32", CHCL_P_ELEMENTWISE},
    [CHCL_K_F32_TO_F16] = {"f32_to_f16", CHCL_P_ELEMENTWISE},
    [CHCL_K_F16_TO_F32] = {"f16_to_f32", CHCL_P_ELEMENTWISE},
    [CHCL_K_ACT_FORWARD] = {"act_forward", CHCL_P_ELEMENTWISE},
    [CHCL_K_ACT_BACKWARD] = {"act_backward", CHCL_P_ELEMENTWISE},
    [CHCL_K_BIAS_ADD] = {"bias_add", CHCL_P_ELEMENTWISE},
    [CHCL_K_TRANSPOSE01] = {"transpose01", CHCL_P_ELEMENTWISE},
    [CHCL_K_SGD_STEP] = {"sgd_step", CHCL_P_ELEMENTWISE},
    [CHCL_K_ADAM_STEP] = {"adam_step", CHCL_P_ELEMENTWISE},
    [CHCL_K_GEMM] = {"gemm", CHCL_P_GEMM},
    [CHCL_K_GEMM_WG8] = {"gemm_wg8", CHCL_P_GEMM},
    [CHCL_K_GEMM_WG4] = {"gemm_wg4", CHCL_P_GEMM},
    [CHCL_K_GEMM_SIMPLE] = {"gemm_simple", CHCL_P_GEMM},
    [CHCL_K_SUM_ITEM] = {"sum_item", CHCL_P_SUM},
    [CHCL_K_SUM_GROUP] = {"sum_group", CHCL_P_SUM},
    [CHCL_K_ARGMAX_ITEM] = {"argmax_item", CHCL_P_SUM},
    [CHCL_K_ARGMAX_GROUP] = {"argmax_group", CHCL_P_SUM},
    [CHCL_K_BIAS_GRAD] = {"bias_grad", CHCL_P_SUM},
    [CHCL_K_BIAS_GRAD_ROWS] = {"bias_grad_rows", CHCL_P_SUM},
    [CHCL_K_BIAS_GRAD_FINISH] = {"bias_grad_finish", CHCL_P_SUM},
    [CHCL_K_SOFTMAX_ROWS] = {"softmax_rows", CHCL_P_SOFTMAX},
    [CHCL_K_MEAN] = {"mean", CHCL_P_SOFTMAX},
    [CHCL_K_SOFTMAX_BACKWARD] = {"softmax_backward", CHCL_P_SOFTMAX},
    [CHCL_K_XENT_FUSED] = {"xent_fused", CHCL_P_SOFTMAX},
    [CHCL_K_XENT_FUSED_HALF] = {"xent_fused_half", CHCL_P_SOFTMAX},
    [CHCL_K_CHECK_VALUE] = {"check_value", CHCL_P_SOFTMAX},
    [CHCL_K_IM2COL] = {"im2col_32", CHCL_P_CONV},
    [CHCL_K_COL2IM] = {"col2im_32", CHCL_P_CONV},
    [CHCL_K_MAXPOOL_FORWARD] = {"maxpool_forward_32", CHCL_P_CONV},
    [CHCL_K_MAXPOOL_BACKWARD] = {"maxpool_backward_32", CHCL_P_CONV},
    [CHCL_K_IM2COL_64] = {"im2col_64", CHCL_P_CONV},
    [CHCL_K_COL2IM_64] = {"col2im_64", CHCL_P_CONV},
    [CHCL_K_MAXPOOL_FORWARD_64] = {"maxpool_forward_64", CHCL_P_CONV},
    [CHCL_K_MAXPOOL_BACKWARD_64] = {"maxpool_backward_64", CHCL_P_CONV},
    [CHCL_K_RAND] = {"rand", CHCL_P_RAND},
    [CHCL_K_PERMUTE] = {"permute_32", CHCL_P_PERMUTE},
    [CHCL_K_PERMUTE_64] = {"permute_64", CHCL_P_PERMUTE},
    [CHCL_K_SOFTMAX_MASKED] = {"softmax_masked", CHCL_P_ATTENTION},
    [CHCL_K_SOFTMAX_MASKED_BACKWARD] = {"softmax_masked_backward", CHCL_P_ATTENTION},
    [CHCL_K_EMBEDDING] = {"embedding", CHCL_P_ATTENTION},
    [CHCL_K_EMBEDDING_KEYS] = {"embedding_keys", CHCL_P_ATTENTION},
    [CHCL_K_BITONIC_GLOBAL] = {"bitonic_global", CHCL_P_ATTENTION},
    [CHCL_K_BITONIC_LOCAL] = {"bitonic_local", CHCL_P_ATTENTION},
    [CHCL_K_EMBEDDING_BACKWARD] = {"embedding_backward", CHCL_P_ATTENTION},
    [CHCL_K_LAYERNORM] = {"layernorm", CHCL_P_NORM},
    [CHCL_K_LAYERNORM_DX] = {"layernorm_dx", CHCL_P_NORM},
    [CHCL_K_LAYERNORM_PARAM_PART] = {"layernorm_param_part", CHCL_P_NORM},
    [CHCL_K_LAYERNORM_PARAM_SUM] = {"layernorm_param_sum", CHCL_P_NORM},
    [CHCL_K_ADD_LAYERNORM] = {"add_layernorm", CHCL_P_NORM},
    [CHCL_K_LAYERNORM_DX_ADD] = {"layernorm_dx_add", CHCL_P_NORM},
    [CHCL_K_CHANNEL_SUMS_PART] = {"channel_sums_part", CHCL_P_NORM},
    [CHCL_K_CHANNEL_SUMS_FINISH] = {"channel_sums_finish", CHCL_P_NORM},
    [CHCL_K_BATCHNORM_STATS] = {"batchnorm_stats", CHCL_P_NORM},
    [CHCL_K_BATCHNORM_FORWARD] = {"batchnorm_forward", CHCL_P_NORM},
    [CHCL_K_BATCHNORM_PARAM_GRADS] = {"batchnorm_param_grads", CHCL_P_NORM},
    [CHCL_K_BATCHNORM_DX] = {"batchnorm_dx", CHCL_P_NORM},
    [CHCL_K_FLASH_D] = {"flash_d", CHCL_P_FLASH},
    FLASH_KERNELS(FORWARD, forward),
    FLASH_KERNELS(DQ, dq),
    FLASH_KERNELS(DKV, dkv),
};

/* The build failed: the message carries the device's build log. */
static ch_status build_failure(cl_program prog, cl_device_id dev, const char *name,
                               cl_int err)
{
    char log[LOG_MAX + 1] = "";
    size_t len = 0;
    cl_int e = clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &len);
    char *full = e == CL_SUCCESS ? malloc(len + 1) : NULL;
    if (full && clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, len, full, NULL) ==
                    CL_SUCCESS) {
        full[len] = '\0';
        snprintf(log, sizeof log, "%s", full);
    }
    free(full);
    return chi_error(CH_ERR_DRIVER, "clBuildProgram(%s): %s (%d); build log: %s", name,
                     chcl_err_name(err), (int)err, log[0] ? log : "(none)");
}

static ch_status program_build(chcl_platform *p, cl_device_id dev, chcl_prog_id id)
{
    cl_int err;
    cl_program prog = clCreateProgramWithSource(p->ctx, (cl_uint)programs[id].nsources,
                                                (const char **)programs[id].sources,
                                                NULL, &err);
    if (err != CL_SUCCESS)
        return chcl_err(err, "clCreateProgramWithSource");
    char options[OPTIONS_MAX];
    ch_status st = build_options(p->ctx, options, sizeof options);
    if (st != CH_OK) {
        clReleaseProgram(prog);
        return st;
    }
    /* Built for every device of the context at once: that is what "once per
     * context" buys when several devices of a platform are in use. */
    err = clBuildProgram(prog, 0, NULL, options, NULL, NULL);
    if (err != CL_SUCCESS) {
        st = build_failure(prog, dev, programs[id].name, err);
        clReleaseProgram(prog);
        return st;
    }
    p->progs[id] = prog;
    return CH_OK;
}

static ch_status program_get(chcl_platform *p, cl_device_id dev, chcl_prog_id id,
                             cl_program *out)
{
    ch_status st = CH_OK;
    pthread_mutex_lock(&p->lock);
    if (!p->progs[id])
        st = program_build(p, dev, id);
    *out = p->progs[id];
    pthread_mutex_unlock(&p->lock);
    return st;
}

/* The device's kernel object `k`; the caller holds d->lock. */
static ch_status kernel_get(chcl_device *d, chcl_kern_id k, cl_kernel *out)
{
    if (d->kernels[k]) {
        *out = d->kernels[k];
        return CH_OK;
    }
    cl_program prog;
    ch_status st = program_get(d->plat, d->id, kernels[k].prog, &prog);
    if (st != CH_OK)
        return st;
    cl_int err;
    cl_kernel kern = clCreateKernel(prog, kernels[k].name, &err);
    if (err != CL_SUCCESS)
        return chcl_err_on(err, "clCreateKernel", kernels[k].name);
    /* Asked before any argument is set: the local memory of its __local
     * variables alone. */
    size_t wg = 0, multiple = 1;
    cl_ulong local = 0;
    const char *what = "clGetKernelWorkGroupInfo(CL_KERNEL_WORK_GROUP_SIZE)";
    err = clGetKernelWorkGroupInfo(kern, d->id, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg,
                                   NULL);
    if (err == CL_SUCCESS) {
        what = "clGetKernelWorkGroupInfo(CL_KERNEL_LOCAL_MEM_SIZE)";
        err = clGetKernelWorkGroupInfo(kern, d->id, CL_KERNEL_LOCAL_MEM_SIZE, sizeof local,
                                       &local, NULL);
    }
    if (err == CL_SUCCESS) {
        what = "clGetKernelWorkGroupInfo(CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE)";
        err = clGetKernelWorkGroupInfo(kern, d->id,
                                       CL_KERNEL_PREFERRED_WORK_GROUP_SIZE_MULTIPLE,
                                       sizeof multiple, &multiple, NULL);
    }
    if (err != CL_SUCCESS) {
        clReleaseKernel(kern);
        return chcl_err_on(err, what, kernels[k].name);
    }
    d->kernels[k] = kern;
    d->kernel_wg[k] = wg < d->max_wg ? wg : d->max_wg;
    d->kernel_local[k] = local;
    d->kernel_multiple[k] = multiple ? multiple : 1;
    *out = kern;
    return CH_OK;
}

/* The most work-items a 1-D work-group of kernel `k` may have. */
static size_t group_max_1d(const chcl_device *d, chcl_kern_id k)
{
    return d->kernel_wg[k] < d->max_item[0] ? d->kernel_wg[k] : d->max_item[0];
}

/* The work-group of a 1-D launch: GROUP_1D or the kernel's maximum if
 * lower, rounded down to a multiple of the kernel's preferred multiple
 * where it is at least that. */
static size_t group_1d(const chcl_device *d, chcl_kern_id k)
{
    size_t g = group_max_1d(d, k), m = d->kernel_multiple[k];
    if (g > GROUP_1D)
        g = GROUP_1D;
    return g >= m ? g / m * m : g;
}

ch_status chcl_limits_of(chcl_stream *s, chcl_kern_id k, chcl_limits *out)
{
    chcl_device *d = s->dev;
    cl_kernel kern;
    pthread_mutex_lock(&d->lock);
    ch_status st = kernel_get(d, k, &kern);
    if (st == CH_OK) {
        out->group = d->kernel_wg[k];
        for (int i = 0; i < 3; i++)
            out->item[i] = d->max_item[i];
        out->local_room = d->local_mem > d->kernel_local[k] ? d->local_mem - d->kernel_local[k] : 0;
        out->multiple = d->kernel_multiple[k];
    }
    pthread_mutex_unlock(&d->lock);
    return st;
}

/* The largest power of two at most `cap` that kernel `k` runs in 1-D with
 * `per_item` bytes of local memory a work-item, under lim. */
static ch_status group_within(chcl_stream *s, chcl_kern_id k, const chcl_limits *lim, size_t cap,
                              size_t per_item, size_t *out)
{
    const chcl_device *d = s->dev;
    if (per_item > lim->local_room)
        return chi_error(CH_ERR_LIMIT,
                         "opencl %s: needs %llu bytes of local memory for one work-item, "
                         "%s has %llu",
                         kernels[k].name,
                         (unsigned long long)(d->local_mem - lim->local_room + per_item), d->name,
                         (unsigned long long)d->local_mem);
    size_t max = lim->group < lim->item[0] ? lim->group : lim->item[0];
    size_t g = 1;
    while (g * 2 <= cap && g * 2 <= max && (cl_ulong)(g * 2) * per_item <= lim->local_room)
        g *= 2;
    *out = g;
    return CH_OK;
}

ch_status chcl_group_size(chcl_stream *s, chcl_kern_id k, size_t cap, size_t per_item, size_t *out)
{
    chcl_limits lim;
    ch_status st = chcl_limits_of(s, k, &lim);
    return st == CH_OK ? group_within(s, k, &lim, cap, per_item, out) : st;
}

ch_status chcl_reduce_group(chcl_stream *s, chcl_kern_id k, int64_t count, size_t per_item,
                            size_t *out)
{
    chcl_limits lim;
    ch_status st = chcl_limits_of(s, k, &lim);
    if (st != CH_OK)
        return st;
    int64_t items = count / REDUCE_ITEM_ELEMENTS;
    size_t want = chcl_pow2_floor(items > 1 ? (size_t)items : 1);
    size_t warp = chcl_pow2_floor(lim.multiple);
    return group_within(s, k, &lim, want > warp ? want : warp, per_item, out);
}

/* Why a work-group of local[0 .. dims) work-items with `local_bytes` of
 * dynamic local memory cannot run `k` on `d`, in why; 1 when it can. */
static int group_ok(const chcl_device *d, chcl_kern_id k, int dims, const size_t *local,
                    cl_ulong local_bytes, char *why, size_t len)
{
    size_t items = 1;
    for (int i = 0; i < dims; i++) {
        if (local[i] > d->max_item[i]) {
            snprintf(why, len, "work-groups of %zu work-items in dimension %d, %s allows %zu",
                     local[i], i, d->name, d->max_item[i]);
            return 0;
        }
        items *= local[i];
    }
    if (items > d->kernel_wg[k]) {
        snprintf(why, len, "work-groups of %zu work-items, %s allows %zu for this kernel",
                 items, d->name, d->kernel_wg[k]);
        return 0;
    }
    cl_ulong need = d->kernel_local[k] + local_bytes;
    if (need > d->local_mem) {
        snprintf(why, len, "%llu bytes of local memory, %s has %llu",
                 (unsigned long long)need, d->name, (unsigned long long)d->local_mem);
        return 0;
    }
    return 1;
}

ch_status chcl_group_fits(chcl_stream *s, chcl_kern_id k, const size_t local[3], int *fits)
{
    chcl_device *d = s->dev;
    cl_kernel kern;
    char why[256];
    pthread_mutex_lock(&d->lock);
    ch_status st = kernel_get(d, k, &kern);
    if (st == CH_OK)
        *fits = group_ok(d, k, 3, local, 0, why, sizeof why);
    pthread_mutex_unlock(&d->lock);
    return st;
}

static ch_status args_set(cl_kernel kern, const char *name, int nargs, const chcl_arg *args)
{
    for (int i = 0; i < nargs; i++) {
        cl_int err = clSetKernelArg(kern, (cl_uint)i, args[i].size, args[i].value);
        if (err != CL_SUCCESS)
            return chi_error(CH_ERR_INTERNAL, "clSetKernelArg(%s, %d): %s (%d)", name, i,
                             chcl_err_name(err), (int)err);
    }
    return CH_OK;
}

/* A launch beyond the device's limits (a work-group too large for the
 * kernel or the device, more local memory than it has) cannot run there:
 * say so rather than let the launch fail with CL_INVALID_WORK_GROUP_SIZE
 * or CL_OUT_OF_RESOURCES. The sizes are ours to choose, so this is a
 * backstop; chcl_group_size and chcl_group_fits choose within them. */
static ch_status enqueue(chcl_stream *s, chcl_kern_id k, int nargs, const chcl_arg *args,
                         int dims, const size_t *global, const size_t *local)
{
    chcl_device *d = s->dev;
    cl_kernel kern;
    ch_status st = kernel_get(d, k, &kern);
    if (st != CH_OK)
        return st;
    size_t lsz[3], gsz[3];
    for (int i = 0; i < dims; i++) {
        lsz[i] = local ? local[i] : group_1d(d, k);
        gsz[i] = (global[i] + lsz[i] - 1) / lsz[i] * lsz[i];
    }
    cl_ulong local_bytes = 0;
    for (int i = 0; i < nargs; i++)
        if (!args[i].value)
            local_bytes += args[i].size;
    char why[256];
    if (!group_ok(d, k, dims, lsz, local_bytes, why, sizeof why))
        return chi_error(CH_ERR_LIMIT, "opencl %s: needs %s", kernels[k].name, why);
    st = args_set(kern, kernels[k].name, nargs, args);
    if (st != CH_OK)
        return st;
    cl_int err = clEnqueueNDRangeKernel(s->queue, kern, (cl_uint)dims, NULL, gsz, lsz, 0,
                                        NULL, NULL);
    if (err != CL_SUCCESS)
        return chcl_err_on(err, "clEnqueueNDRangeKernel", kernels[k].name);
    return CH_OK;
}

ch_status chcl_launch(chcl_stream *s, chcl_kern_id k, int nargs, const chcl_arg *args,
                      int dims, const size_t *global, const size_t *local)
{
    /* Arguments live in the kernel object until the enqueue copies them: the
     * device lock keeps another thread from setting its own in between. */
    pthread_mutex_lock(&s->dev->lock);
    ch_status st = enqueue(s, k, nargs, args, dims, global, local);
    pthread_mutex_unlock(&s->dev->lock);
    return st;
}

ch_status chcl_launch1(chcl_stream *s, chcl_kern_id k, int nargs, const chcl_arg *args,
                       int64_t n)
{
    ch_status st = chcl_check_count(kernels[k].name, n);
    if (st != CH_OK)
        return st;
    size_t global = (size_t)n;
    return chcl_launch(s, k, nargs, args, 1, &global, NULL);
}

ch_status chcl_launch_groups(chcl_stream *s, chcl_kern_id k, int nargs,
                             const chcl_arg *args, int64_t groups, size_t group)
{
    ch_status st = chcl_check_count(kernels[k].name, groups);
    if (st != CH_OK)
        return st;
    size_t global = (size_t)groups * group;
    return chcl_launch(s, k, nargs, args, 1, &global, &group);
}

void chcl_programs_release(chcl_platform *p)
{
    for (int i = 0; i < CHCL_P_COUNT; i++)
        if (p->progs[i])
            clReleaseProgram(p->progs[i]);
}

void chcl_kernels_release(chcl_device *d)
{
    for (int i = 0; i < CHCL_K_COUNT; i++)
        if (d->kernels[i])
            clReleaseKernel(d->kernels[i]);
}
