/* GEMM on cuda:0: cuBLAS called directly against ch_gemm (our op, through
 * the public API) on the same inputs, in the same run: f32 (cublasSgemm),
 * and bf16 and f16 inputs with f32 sums into an f32 C (cublasGemmEx,
 * CUBLAS_COMPUTE_32F, the tensor cores). Target: the op at 95% of cuBLAS.
 *
 * Usage: bench-cublas [size ...]   (default 1024 2048 4096)
 * Exit status: 0 when both ran and agree, 1 on an error, 2 with no cuda:0. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <chorus.h>

#define TRIES 3

static int cuda_ok(cudaError_t err, const char *call)
{
    if (err == cudaSuccess)
        return 1;
    fprintf(stderr, "bench-cublas: %s: %s\n", call, cudaGetErrorString(err));
    return 0;
}

static int blas_ok(cublasStatus_t st, const char *call)
{
    if (st == CUBLAS_STATUS_SUCCESS)
        return 1;
    fprintf(stderr, "bench-cublas: %s: %s\n", call, cublasGetStatusName(st));
    return 0;
}

static int ch_ok(ch_status st, const char *call)
{
    if (st == CH_OK)
        return 1;
    fprintf(stderr, "bench-cublas: %s: %s: %s\n", call, ch_status_str(st), ch_last_error());
    return 0;
}

/* Enough calls to run for a good fraction of a second. */
static int reps_for(int n)
{
    double flops = 2.0 * n * n * (double)n;
    double r = 4e11 / flops;
    return r < 10 ? 10 : r > 1000 ? 1000 : (int)r;
}

typedef struct direct {
    cublasHandle_t h;
    cudaStream_t s;
    ch_dtype in; /* the inputs' type; C is f32 */
    void *a, *b;
    float *c;
} direct;

static int direct_run(direct *d, int n, int reps, double *secs)
{
    const float alpha = 1.0f, beta = 0.0f;
    cudaDataType_t t = d->in == CH_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    double t0 = ch_clock_seconds();
    for (int r = 0; r < reps; r++)
        if (d->in == CH_F32
                ? !blas_ok(cublasSgemm(d->h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha,
                                       (const float *)d->b, n, (const float *)d->a, n, &beta,
                                       d->c, n),
                           "cublasSgemm")
                : !blas_ok(cublasGemmEx(d->h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, d->b, t,
                                        n, d->a, t, n, &beta, d->c, CUDA_R_32F, n,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                           "cublasGemmEx"))
            return 0;
    if (!cuda_ok(cudaStreamSynchronize(d->s), "cudaStreamSynchronize"))
        return 0;
    *secs = ch_clock_seconds() - t0;
    return 1;
}

static int ours_run(ch_device *dev, ch_tensor *c, const ch_tensor *a, const ch_tensor *b,
                    int reps, double *secs)
{
    double t0 = ch_clock_seconds();
    for (int r = 0; r < reps; r++)
        if (!ch_ok(ch_gemm(c, 0, 0, 1.0f, a, b, 0.0f), "ch_gemm"))
            return 0;
    if (!ch_ok(ch_device_sync(dev), "ch_device_sync"))
        return 0;
    *secs = ch_clock_seconds() - t0;
    return 1;
}

/* The direct buffers, A and B holding `in_bytes` of `inputs` (the same
 * bits ch_gemm gets), C of `bytes`. */
static int direct_setup(direct *d, ch_dtype in, const void *inputs, size_t in_bytes,
                        size_t bytes)
{
    memset(d, 0, sizeof *d);
    d->in = in;
    return cuda_ok(cudaSetDevice(0), "cudaSetDevice") &&
           cuda_ok(cudaStreamCreateWithFlags(&d->s, cudaStreamNonBlocking), "cudaStreamCreate") &&
           blas_ok(cublasCreate(&d->h), "cublasCreate") &&
           blas_ok(cublasSetStream(d->h, d->s), "cublasSetStream") &&
           cuda_ok(cudaMalloc(&d->a, in_bytes), "cudaMalloc") &&
           cuda_ok(cudaMalloc(&d->b, in_bytes), "cudaMalloc") &&
           cuda_ok(cudaMalloc((void **)&d->c, bytes), "cudaMalloc") &&
           cuda_ok(cudaMemcpy(d->a, inputs, in_bytes, cudaMemcpyHostToDevice), "cudaMemcpy") &&
           cuda_ok(cudaMemcpy(d->b, inputs, in_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
}

static void direct_free(direct *d)
{
    if (d->h && !blas_ok(cublasDestroy(d->h), "cublasDestroy"))
        d->h = NULL;
    void *bufs[3] = {d->a, d->b, d->c};
    for (int i = 0; i < 3; i++)
        if (bufs[i])
            cuda_ok(cudaFree(bufs[i]), "cudaFree");
    if (d->s)
        cuda_ok(cudaStreamDestroy(d->s), "cudaStreamDestroy");
}

/* The largest difference between the two products, relative to the
 * largest entry. */
static int compare(const direct *d, const ch_tensor *c, size_t bytes, double *rel)
{
    float *x = malloc(bytes), *y = malloc(bytes);
    int ok = x && y && cuda_ok(cudaMemcpy(x, d->c, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy") &&
             ch_ok(ch_tensor_download(c, y, bytes), "ch_tensor_download");
    if (ok) {
        double diff = 0.0, big = 0.0;
        for (size_t i = 0; i < bytes / sizeof(float); i++) {
            diff = fmax(diff, fabs((double)x[i] - y[i]));
            big = fmax(big, fabs((double)x[i]));
        }
        *rel = big > 0.0 ? diff / big : diff;
    }
    free(x);
    free(y);
    return ok;
}

static int bench_size(ch_device *dev, int n, ch_dtype in)
{
    size_t bytes = (size_t)n * n * sizeof(float), in_bytes = (size_t)n * n * ch_dtype_size(in);
    float *host = malloc(bytes);
    void *inputs = malloc(in_bytes);
    if (!host || !inputs) {
        fprintf(stderr, "bench-cublas: out of host memory\n");
        free(host);
        free(inputs);
        return 0;
    }
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < (size_t)n * n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        host[i] = (float)((s >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    int64_t shape[2] = {n, n};
    ch_tensor *f = NULL, *a = NULL, *b = NULL, *c = NULL;
    direct d;
    memset(&d, 0, sizeof d);
    /* The inputs made on the device (ch_cast for the half formats), their
     * bits read back for cuBLAS. */
    int ok = ch_ok(ch_tensor_new(&f, dev, CH_F32, 2, shape), "ch_tensor_new") &&
             ch_ok(ch_tensor_new(&a, dev, in, 2, shape), "ch_tensor_new") &&
             ch_ok(ch_tensor_new(&b, dev, in, 2, shape), "ch_tensor_new") &&
             ch_ok(ch_tensor_new(&c, dev, CH_F32, 2, shape), "ch_tensor_new") &&
             ch_ok(ch_tensor_upload(f, host, bytes), "ch_tensor_upload") &&
             ch_ok(in == CH_F32 ? ch_copy(a, f) : ch_cast(a, f), "ch_cast") &&
             ch_ok(in == CH_F32 ? ch_copy(b, f) : ch_cast(b, f), "ch_cast") &&
             ch_ok(ch_tensor_download(a, inputs, in_bytes), "ch_tensor_download") &&
             direct_setup(&d, in, inputs, in_bytes, bytes);
    int reps = reps_for(n) * (in == CH_F32 ? 1 : 4);
    double best_direct = 1e30, best_ours = 1e30, t, rel = 0.0;
    /* A warm-up call of each, then alternate so that clocks and caches
     * favour neither. */
    ok = ok && direct_run(&d, n, 1, &t) && ours_run(dev, c, a, b, 1, &t);
    for (int i = 0; ok && i < TRIES; i++) {
        ok = direct_run(&d, n, reps, &t);
        best_direct = fmin(best_direct, t);
        ok = ok && ours_run(dev, c, a, b, reps, &t);
        best_ours = fmin(best_ours, t);
    }
    ok = ok && compare(&d, c, bytes, &rel);
    if (ok) {
        double flops = 2.0 * n * n * (double)n * reps;
        double gd = flops / best_direct * 1e-9, go = flops / best_ours * 1e-9;
        printf("%6s %6d %8d %14.1f %14.1f %7.3f %10.2e\n", ch_dtype_name(in), n, reps, gd, go,
               go / gd, rel);
        ok = rel < 1e-5;
        if (!ok)
            fprintf(stderr, "bench-cublas: %s n=%d: ch_gemm and cuBLAS differ by %.2e\n",
                    ch_dtype_name(in), n, rel);
    }
    direct_free(&d);
    ch_tensor_free(f);
    ch_tensor_free(a);
    ch_tensor_free(b);
    ch_tensor_free(c);
    free(host);
    free(inputs);
    return ok;
}

int main(int argc, char **argv)
{
    if (!ch_ok(ch_init(), "ch_init"))
        return 1;
    ch_device *dev = NULL;
    if (ch_device_by_name(&dev, "cuda:0") != CH_OK) {
        printf("bench-cublas: no cuda:0 (%s)\n", ch_last_error());
        ch_shutdown();
        return 2;
    }
    ch_device_info info;
    if (!ch_ok(ch_device_get_info(dev, &info), "ch_device_get_info"))
        return 1;
    printf("# GEMM C = A B, row-major n x n, C f32, on cuda:0 (%s)\n", info.name);
    printf("%6s %6s %8s %14s %14s %7s %10s\n", "inputs", "n", "calls", "cublas_GF/s",
           "ch_gemm_GF/s", "ratio", "max_rel");
    int ok = 1;
    static const ch_dtype types[3] = {CH_F32, CH_BF16, CH_F16};
    for (int t = 0; t < 3; t++) {
        if (argc > 1)
            for (int i = 1; i < argc; i++)
                ok &= bench_size(dev, atoi(argv[i]), types[t]);
        else
            for (int n = 1024; n <= 4096; n *= 2)
                ok &= bench_size(dev, n, types[t]);
    }
    ch_shutdown();
    return ok ? 0 : 1;
}
