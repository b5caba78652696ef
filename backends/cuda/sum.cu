/* Deterministic sums and means along an axis, bias gradient and
 * argmax.
 *
 * x is seen as [outer, n, inner] and reduced over n. A block takes one
 * output tile: blockDim.x = tx consecutive inner items (coalesced reads),
 * blockDim.y = ty threads striding over n; their partial sums meet in
 * shared memory in a fixed tree. No atomics: the order of every addition
 * depends on the shape alone, so a run repeats to the bit. When there are
 * too few tiles to fill the device, n is cut into `splits` chunks summed
 * apart into a double workspace, then summed again. */
#include "common.cuh"

/* Enough blocks to fill any current GPU several times over. */
#define AXIS_TARGET_BLOCKS 1024
/* The shortest chunk of n worth a block of its own. */
#define AXIS_MIN_CHUNK 2048

typedef struct axis_plan {
    unsigned tx, ty;
    int64_t ntiles;
    int64_t splits, chunk;
} axis_plan;

static axis_plan axis_plan_of(int64_t outer, int64_t n, int64_t inner)
{
    axis_plan p;
    p.tx = 1;
    while (p.tx < 32 && (int64_t)p.tx < inner)
        p.tx *= 2;
    p.ty = CHCU_THREADS / p.tx;
    p.ntiles = (inner + p.tx - 1) / p.tx;
    int64_t blocks = outer * p.ntiles;
    int64_t splits = (AXIS_TARGET_BLOCKS + blocks - 1) / blocks;
    if (splits > n / AXIS_MIN_CHUNK)
        splits = n / AXIS_MIN_CHUNK;
    if (splits < 1)
        splits = 1;
    p.chunk = (n + splits - 1) / splits;
    p.splits = (n + p.chunk - 1) / p.chunk;
    return p;
}

size_t chcu_sum_into_work(int64_t outer, int64_t n, int64_t inner)
{
    axis_plan p = axis_plan_of(outer, n, inner);
    return p.splits > 1 ? (size_t)(outer * p.splits * inner) * sizeof(double) : 0;
}

/* Partial sums: part[o, split, i]. */
struct sum_to_part {
    double *part;
    int64_t splits, inner;
    __device__ void put(int64_t o, int64_t sp, int64_t i, double v) const
    {
        part[(o * splits + sp) * inner + i] = v;
    }
};

/* Final values: y[o, i] = v / divisor (+ beta * y[o, i]). */
struct sum_to_float {
    float *y;
    int64_t inner;
    double divisor;
    float beta;
    __device__ void put(int64_t o, int64_t, int64_t i, double v) const
    {
        double r = v / divisor;
        if (beta != 0.0f)
            r += (double)beta * (double)y[o * inner + i];
        y[o * inner + i] = (float)r;
    }
};

template <typename T, typename Out>
__global__ void sum_kernel(const T *x, int64_t outer, int64_t n, int64_t inner, int64_t chunk,
                           int64_t splits, int64_t ntiles, Out out)
{
    __shared__ double sh[CHCU_THREADS];
    const unsigned tx = threadIdx.x, ty = threadIdx.y, nx = blockDim.x, ny = blockDim.y;
    const int64_t slots = outer * splits * ntiles;
    for (int64_t slot = blockIdx.x; slot < slots; slot += gridDim.x) {
        int64_t tile = slot % ntiles, rest = slot / ntiles;
        int64_t sp = rest % splits, o = rest / splits;
        int64_t i = tile * nx + tx;
        int64_t kb = sp * chunk, ke = kb + chunk < n ? kb + chunk : n;
        double acc = 0.0;
        if (i < inner)
            for (int64_t k = kb + ty; k < ke; k += ny)
                acc += (double)x[(o * n + k) * inner + i];
        sh[ty * nx + tx] = acc;
        __syncthreads();
        for (unsigned h = ny / 2; h > 0; h /= 2) {
            if (ty < h)
                sh[ty * nx + tx] += sh[(ty + h) * nx + tx];
            __syncthreads();
        }
        if (ty == 0 && i < inner)
            out.put(o, sp, i, sh[tx]);
    }
}

template <typename T, typename Out>
static ch_status sum_launch(const chcu_stream *s, const axis_plan &p, const T *x, int64_t outer,
                            int64_t n, int64_t inner, int64_t splits, int64_t chunk, Out out)
{
    int64_t slots = outer * splits * p.ntiles;
    int64_t cap = (int64_t)s->dev->sm_count * CHCU_BLOCKS_PER_SM;
    unsigned grid = (unsigned)(slots < cap ? slots : cap);
    sum_kernel<T, Out><<<grid, dim3(p.tx, p.ty), 0, s->s>>>(x, outer, n, inner, chunk, splits,
                                                            p.ntiles, out);
    return chcu_launched("sum_kernel");
}

template <typename T>
static ch_status sum_into(chcu_stream *s, float *y, const T *x, int64_t outer, int64_t n,
                            int64_t inner, double divisor, float beta, void *work)
{
    axis_plan p = axis_plan_of(outer, n, inner);
    sum_to_float fin = {y, inner, divisor, beta};
    if (p.splits == 1)
        return sum_launch(s, p, x, outer, n, inner, 1, n, fin);
    double *part = (double *)work;
    sum_to_part mid = {part, p.splits, inner};
    ch_status st = sum_launch(s, p, x, outer, n, inner, p.splits, p.chunk, mid);
    if (st)
        return st;
    return sum_launch(s, p, (const double *)part, outer, p.splits, inner, 1, p.splits, fin);
}

ch_status chcu_sum_into(chcu_stream *s, float *y, const float *x, int64_t outer, int64_t n,
                        int64_t inner, double divisor, float beta, void *work)
{
    return sum_into(s, y, x, outer, n, inner, divisor, beta, work);
}

ch_status chcu_sum_axis(void *stream, ch_axis_op op, int64_t outer, int64_t n, int64_t inner,
                        ch_bmem y, ch_bmem x)
{
    if (!chi_enum_known((int)op, CH_AXIS_COUNT))
        return chi_unknown_enum("cuda", "sum_axis", "ch_axis_op", (int)op, CH_AXIS_COUNT);
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    double divisor = op == CH_AXIS_MEAN ? (double)n : 1.0;
    size_t bytes = chcu_sum_into_work(outer, n, inner);
    if (bytes == 0)
        return sum_into(s, chcu_at<float>(y), chcu_at<float>(x), outer, n, inner, divisor, 0.0f,
                          NULL);
    void *work;
    st = chcu_scratch_acquire(s, bytes, &work);
    if (st)
        return st;
    st = sum_into(s, chcu_at<float>(y), chcu_at<float>(x), outer, n, inner, divisor, 0.0f, work);
    chcu_scratch_release(s);
    return st;
}

/* db[c] = beta db[c] + sum of dy[outer, c, inner]: first each (outer, c)
 * row over inner into doubles, then those over outer. */
static ch_status bias_grad_rows(chcu_stream *s, int64_t outer, int64_t c, int64_t inner,
                                float *db, const float *dy, float beta)
{
    size_t rows_bytes = (size_t)(outer * c) * sizeof(double);
    void *work;
    ch_status st = chcu_scratch_acquire(s, rows_bytes + chcu_sum_into_work(1, outer, c), &work);
    if (st)
        return st;
    double *rows = (double *)work;
    axis_plan p = axis_plan_of(outer * c, inner, 1);
    sum_to_part mid = {rows, 1, 1};
    st = sum_launch(s, p, dy, outer * c, inner, 1, 1, inner, mid);
    if (!st)
        st = sum_into(s, db, (const double *)rows, 1, outer, c, 1.0, beta,
                        (char *)work + rows_bytes);
    chcu_scratch_release(s);
    return st;
}

ch_status chcu_bias_grad(void *stream, int64_t outer, int64_t c, int64_t inner, ch_bmem db,
                         ch_bmem dy, float beta)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    if (inner > 1)
        return bias_grad_rows(s, outer, c, inner, chcu_at<float>(db), chcu_at<float>(dy), beta);
    /* [outer, c]: column sums, the shape sum_into handles directly. */
    size_t bytes = chcu_sum_into_work(1, outer, c);
    void *work = NULL;
    if (bytes) {
        st = chcu_scratch_acquire(s, bytes, &work);
        if (st)
            return st;
    }
    st = sum_into(s, chcu_at<float>(db), chcu_at<float>(dy), 1, outer, c, 1.0, beta, work);
    if (bytes)
        chcu_scratch_release(s);
    return st;
}

/* ops.h's rule, the first NaN, else the first maximum: (v2, k2) beats
 * (v1, k1) when it is NaN and v1 is not, or larger, or as large (both NaN
 * included) and earlier. k < 0: no value. */
__device__ static bool argmax_better(float v2, int64_t k2, float v1, int64_t k1)
{
    if (k2 < 0)
        return false;
    if (k1 < 0)
        return true;
    if (isnan(v2))
        return !isnan(v1) || k2 < k1;
    return !isnan(v1) && (v2 > v1 || (v2 == v1 && k2 < k1));
}

__global__ void argmax_kernel(int32_t *y, const float *x, int64_t outer, int64_t n,
                              int64_t inner, int64_t ntiles)
{
    __shared__ float sv[CHCU_THREADS];
    __shared__ int64_t sk[CHCU_THREADS];
    const unsigned tx = threadIdx.x, ty = threadIdx.y, nx = blockDim.x, ny = blockDim.y;
    const unsigned me = ty * nx + tx;
    for (int64_t slot = blockIdx.x; slot < outer * ntiles; slot += gridDim.x) {
        int64_t o = slot / ntiles, i = (slot % ntiles) * nx + tx;
        float bv = 0.0f;
        int64_t bk = -1;
        if (i < inner)
            for (int64_t k = ty; k < n; k += ny) {
                float v = x[(o * n + k) * inner + i];
                if (argmax_better(v, k, bv, bk)) {
                    bv = v;
                    bk = k;
                }
            }
        sv[me] = bv;
        sk[me] = bk;
        __syncthreads();
        for (unsigned h = ny / 2; h > 0; h /= 2) {
            unsigned other = me + h * nx;
            if (ty < h && argmax_better(sv[other], sk[other], sv[me], sk[me])) {
                sv[me] = sv[other];
                sk[me] = sk[other];
            }
            __syncthreads();
        }
        if (ty == 0 && i < inner)
            y[o * inner + i] = (int32_t)sk[tx];
    }
}

ch_status chcu_argmax(void *stream, int64_t outer, int64_t n, int64_t inner, ch_bmem y,
                      ch_bmem x)
{
    chcu_stream *s = (chcu_stream *)stream;
    ch_status st = chcu_enter(s->dev);
    if (st)
        return st;
    axis_plan p = axis_plan_of(outer, n, inner);
    int64_t slots = outer * p.ntiles;
    int64_t cap = (int64_t)s->dev->sm_count * CHCU_BLOCKS_PER_SM;
    argmax_kernel<<<(unsigned)(slots < cap ? slots : cap), dim3(p.tx, p.ty), 0, s->s>>>(
        chcu_at<int32_t>(y), chcu_at<float>(x), outer, n, inner, p.ntiles);
    return chcu_launched("argmax_kernel");
}
