/* The normalisation slots (norm.cl): sizes checked against what a kernel
 * indexes, temporaries for the two-step sums (local and global, sized for
 * doubles: the kernels' chk_acc is double where the device has it, float
 * otherwise), absent buffers replaced by a stand-in that the kernel is
 * told not to read. */
#include "config.h"

#include "opencl.h"
#include "kernels/normalize.h"

/* LayerNorm's parameter gradients: rows per partial sum. */
#define LN_CHUNK_ROWS 32
/* A channel's sums are cut into splits of at least this many elements,
 * at most SUMS_SPLITS_MAX of them, a work-group each: enough groups to
 * fill a device when there are few channels. */
#define SUMS_SPLIT_MIN 4096
#define SUMS_SPLITS_MAX 64

/* ---- LayerNorm ------------------------------------------------------------ */

ch_status chcl_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_bmem y,
                         ch_bmem mean, ch_bmem rstd, ch_bmem x, ch_bmem gamma, ch_bmem beta)
{
    size_t group = 0;
    ch_status st = chcl_check_count("layernorm", rows * d);
    if (st == CH_OK)
        st = chcl_reduce_group(stream, CHCL_K_LAYERNORM, d, sizeof(cl_double), &group);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), M = chcl_ref_of(mean), R = chcl_ref_of(rstd),
             X = chcl_ref_of(x), G = chcl_ref_of(gamma), B = chcl_ref_of(beta);
    cl_int dd = (cl_int)d;
    chcl_arg args[] = {CHCL_REF(Y),  CHCL_REF(M),   CHCL_REF(R),
                       CHCL_REF(X),  CHCL_REF(G),   CHCL_REF(B),
                       CHCL_ARG(dd), CHCL_ARG(eps), CHCL_LOCAL(group * sizeof(cl_double))};
    return chcl_launch_groups(stream, CHCL_K_LAYERNORM, CHCL_COUNT_OF(args), args, rows,
                              group);
}

static ch_status layernorm_dx(chcl_stream *s, int64_t rows, int64_t d, ch_bmem dx, ch_bmem dy,
                              ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma)
{
    size_t group;
    ch_status st = chcl_reduce_group(s, CHCL_K_LAYERNORM_DX, d, 2 * sizeof(cl_double), &group);
    if (st != CH_OK)
        return st;
    chcl_ref DX = chcl_ref_of(dx), DY = chcl_ref_of(dy), X = chcl_ref_of(x),
             M = chcl_ref_of(mean), R = chcl_ref_of(rstd), G = chcl_ref_of(gamma);
    cl_int dd = (cl_int)d;
    chcl_arg args[] = {
        CHCL_REF(DX), CHCL_REF(DY), CHCL_REF(X),  CHCL_REF(M),
        CHCL_REF(R),  CHCL_REF(G),  CHCL_ARG(dd), CHCL_LOCAL(2 * group * sizeof(cl_double))};
    return chcl_launch_groups(s, CHCL_K_LAYERNORM_DX, CHCL_COUNT_OF(args), args, rows, group);
}

/* A tensor in one of lib/kernels/normalize.h's formats as norm.cl's
 * kernels take it: its buffer and its offset in elements of its own size. */
static chcl_ref ref_fmt(ch_bmem m, int fmt)
{
    return (chcl_ref){chcl_buf(m), (cl_ulong)(m.off / (fmt == CHK_FMT_F32 ? 4 : 2))};
}

/* dgamma and dbeta += the sums over the rows, through `part` [chunks, 2,
 * d]; dy and x in formats dyf and xf. */
static ch_status layernorm_params(chcl_stream *s, int64_t rows, int64_t d, int64_t chunks,
                                  cl_mem part, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy,
                                  cl_int dyf, ch_bmem x, cl_int xf, ch_bmem mean, ch_bmem rstd)
{
    chcl_ref DY = ref_fmt(dy, dyf), X = ref_fmt(x, xf), M = chcl_ref_of(mean),
             R = chcl_ref_of(rstd), DG = chcl_ref_of(dgamma), DB = chcl_ref_of(dbeta);
    cl_int nrows = (cl_int)rows, dd = (cl_int)d, chunk_rows = LN_CHUNK_ROWS,
           items = (cl_int)(chunks * d), nchunks = (cl_int)chunks;
    chcl_arg pargs[] = {CHCL_ARG(part),  CHCL_REF(DY),    CHCL_REF(X),  CHCL_REF(M),
                        CHCL_REF(R),     CHCL_ARG(nrows), CHCL_ARG(dd), CHCL_ARG(chunk_rows),
                        CHCL_ARG(items), CHCL_ARG(dyf),   CHCL_ARG(xf)};
    ch_status st = chcl_launch1(s, CHCL_K_LAYERNORM_PARAM_PART, CHCL_COUNT_OF(pargs), pargs,
                                items);
    if (st != CH_OK)
        return st;
    chcl_arg sargs[] = {CHCL_REF(DG), CHCL_REF(DB), CHCL_ARG(part), CHCL_ARG(nchunks),
                        CHCL_ARG(dd)};
    return chcl_launch1(s, CHCL_K_LAYERNORM_PARAM_SUM, CHCL_COUNT_OF(sargs), sargs, d);
}

ch_status chcl_layernorm_backward(void *stream, int64_t rows, int64_t d, ch_bmem dx,
                                  ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem x,
                                  ch_bmem mean, ch_bmem rstd, ch_bmem gamma)
{
    chcl_stream *s = stream;
    int64_t chunks = (rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    ch_status st = chcl_check_count("layernorm_backward", rows * d);
    if (st == CH_OK)
        st = chcl_check_count("layernorm_backward", chunks * 2 * d);
    if (st == CH_OK && dx.ptr)
        st = layernorm_dx(s, rows, d, dx, dy, x, mean, rstd, gamma);
    cl_mem part = NULL;
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "layernorm_backward",
                                  (size_t)(chunks * 2 * d) * sizeof(cl_double), &part);
    if (st != CH_OK)
        return st;
    st = layernorm_params(s, rows, d, chunks, part, dgamma, dbeta, dy, CHK_FMT_F32, x, CHK_FMT_F32,
                          mean, rstd);
    chcl_scratch_release(s);
    return st;
}

/* ---- The residual stream's add beside LayerNorm ------------------------- */

/* lib/kernels/normalize.h's format of a dtype the core passed; -1 for one
 * this module does not know. */
static cl_int fmt_of(ch_dtype dt)
{
    return dt == CH_F32    ? CHK_FMT_F32
           : dt == CH_BF16 ? CHK_FMT_BF16
           : dt == CH_F16  ? CHK_FMT_F16
                           : -1;
}

ch_status chcl_add_layernorm(void *stream, int64_t rows, int64_t d, float eps, ch_dtype sum_dt,
                             ch_dtype y_dt, ch_dtype a_dt, ch_dtype b_dt, ch_bmem sum, ch_bmem y,
                             ch_bmem mean, ch_bmem rstd, ch_bmem a, ch_bmem b, ch_bmem gamma,
                             ch_bmem beta)
{
    cl_int sf = fmt_of(sum_dt), yf = fmt_of(y_dt), af = fmt_of(a_dt), bf = fmt_of(b_dt);
    if (sf < 0 || yf < 0 || af < 0 || bf < 0)
        return chi_error(CH_ERR_UNSUPPORTED, "opencl add_layernorm: dtypes %d, %d, %d, %d",
                         (int)sum_dt, (int)y_dt, (int)a_dt, (int)b_dt);
    size_t group = 0;
    ch_status st = chcl_check_count("add_layernorm", rows * d);
    if (st == CH_OK)
        st = chcl_reduce_group(stream, CHCL_K_ADD_LAYERNORM, d, sizeof(cl_double), &group);
    if (st != CH_OK)
        return st;
    chcl_ref S = ref_fmt(sum, sf), Y = ref_fmt(y, yf), M = chcl_ref_of(mean), R = chcl_ref_of(rstd),
             A = ref_fmt(a, af), B = ref_fmt(b, bf), G = chcl_ref_of(gamma), BE = chcl_ref_of(beta);
    cl_int dd = (cl_int)d;
    chcl_arg args[] = {CHCL_REF(S),  CHCL_REF(Y),   CHCL_REF(M),
                       CHCL_REF(R),  CHCL_REF(A),   CHCL_REF(B),
                       CHCL_REF(G),  CHCL_REF(BE),  CHCL_ARG(sf),
                       CHCL_ARG(yf), CHCL_ARG(af),  CHCL_ARG(bf),
                       CHCL_ARG(dd), CHCL_ARG(eps), CHCL_LOCAL(group * sizeof(cl_double))};
    return chcl_launch_groups(stream, CHCL_K_ADD_LAYERNORM, CHCL_COUNT_OF(args), args, rows, group);
}

ch_status chcl_layernorm_backward_add(void *stream, int64_t rows, int64_t d, ch_dtype dx_dt,
                                      ch_dtype dy_dt, ch_dtype dres_dt, ch_dtype x_dt, ch_bmem dx,
                                      ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy, ch_bmem dres,
                                      ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma)
{
    chcl_stream *s = stream;
    cl_int has_res = dres.ptr != NULL;
    cl_int dxf = fmt_of(dx_dt), dyf = fmt_of(dy_dt), xf = fmt_of(x_dt);
    cl_int rf = has_res ? fmt_of(dres_dt) : CHK_FMT_F32;
    if (dxf < 0 || dyf < 0 || rf < 0 || xf < 0)
        return chi_error(CH_ERR_UNSUPPORTED, "opencl layernorm_backward_add: dtypes %d, %d, %d, %d",
                         (int)dx_dt, (int)dy_dt, (int)dres_dt, (int)x_dt);
    int64_t chunks = (rows + LN_CHUNK_ROWS - 1) / LN_CHUNK_ROWS;
    size_t group = 0;
    ch_status st = chcl_check_count("layernorm_backward_add", rows * d);
    if (st == CH_OK)
        st = chcl_check_count("layernorm_backward_add", chunks * 2 * d);
    if (st == CH_OK)
        st = chcl_reduce_group(s, CHCL_K_LAYERNORM_DX_ADD, d, 2 * sizeof(cl_double), &group);
    if (st != CH_OK)
        return st;
    /* An absent dres: dx stands in, never read. */
    chcl_ref DX = ref_fmt(dx, dxf), DY = ref_fmt(dy, dyf), X = ref_fmt(x, xf),
             DR = has_res ? ref_fmt(dres, rf) : DX, M = chcl_ref_of(mean), R = chcl_ref_of(rstd),
             G = chcl_ref_of(gamma);
    cl_int dd = (cl_int)d;
    chcl_arg args[] = {CHCL_REF(DX),  CHCL_REF(DY),
                       CHCL_REF(DR),  CHCL_REF(X),
                       CHCL_REF(M),   CHCL_REF(R),
                       CHCL_REF(G),   CHCL_ARG(dxf),
                       CHCL_ARG(dyf), CHCL_ARG(rf),
                       CHCL_ARG(xf),  CHCL_ARG(has_res),
                       CHCL_ARG(dd),  CHCL_LOCAL(2 * group * sizeof(cl_double))};
    st = chcl_launch_groups(s, CHCL_K_LAYERNORM_DX_ADD, CHCL_COUNT_OF(args), args, rows, group);
    cl_mem part = NULL;
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "layernorm_backward_add",
                                  (size_t)(chunks * 2 * d) * sizeof(cl_double), &part);
    if (st != CH_OK)
        return st;
    st = layernorm_params(s, rows, d, chunks, part, dgamma, dbeta, dy, dyf, x, xf, mean, rstd);
    chcl_scratch_release(s);
    return st;
}

/* ---- BatchNorm ------------------------------------------------------------ */

static ch_status channel_sums_part(chcl_stream *s, int64_t c, int64_t inner, int64_t count,
                                   int64_t splits, cl_mem part, ch_bmem a, ch_bmem a_center,
                                   ch_bmem b, ch_bmem b_center)
{
    int64_t chunk = (count + splits - 1) / splits;
    size_t group;
    ch_status st =
        chcl_reduce_group(s, CHCL_K_CHANNEL_SUMS_PART, chunk, 4 * sizeof(cl_double), &group);
    if (st != CH_OK)
        return st;
    cl_int has_ac = a_center.ptr != NULL, has_bc = b_center.ptr != NULL;
    /* An absent centre: a stands in, never read. */
    chcl_ref A = chcl_ref_of(a), B = chcl_ref_of(b);
    chcl_ref AC = has_ac ? chcl_ref_of(a_center) : A, BC = has_bc ? chcl_ref_of(b_center) : A;
    cl_int cc = (cl_int)c, in = (cl_int)inner, n = (cl_int)count, sp = (cl_int)splits,
           ck = (cl_int)chunk;
    chcl_arg args[] = {CHCL_ARG(part),
                       CHCL_REF(A),
                       CHCL_REF(AC),
                       CHCL_REF(B),
                       CHCL_REF(BC),
                       CHCL_ARG(has_ac),
                       CHCL_ARG(has_bc),
                       CHCL_ARG(cc),
                       CHCL_ARG(in),
                       CHCL_ARG(n),
                       CHCL_ARG(sp),
                       CHCL_ARG(ck),
                       CHCL_LOCAL(4 * group * sizeof(cl_double))};
    return chcl_launch_groups(s, CHCL_K_CHANNEL_SUMS_PART, CHCL_COUNT_OF(args), args,
                              c * splits, group);
}

ch_status chcl_channel_sums(void *stream, int64_t outer, int64_t c, int64_t inner,
                            ch_bmem sums, ch_bmem a, ch_bmem a_center, ch_bmem b,
                            ch_bmem b_center)
{
    chcl_stream *s = stream;
    int64_t count = outer * inner, splits = chcl_spans(count, SUMS_SPLIT_MIN, SUMS_SPLITS_MAX);
    ch_status st = chcl_check_count("channel_sums", outer * c * inner);
    if (st == CH_OK)
        st = chcl_check_count("channel_sums", 4 * c * splits);
    cl_mem part = NULL;
    if (st == CH_OK)
        st = chcl_scratch_acquire(s, "channel_sums", (size_t)(4 * c * splits) * sizeof(cl_double),
                                  &part);
    if (st != CH_OK)
        return st;
    st = channel_sums_part(s, c, inner, count, splits, part, a, a_center, b, b_center);
    if (st == CH_OK) {
        chcl_ref S = chcl_ref_of(sums);
        cl_int cc = (cl_int)c, sp = (cl_int)splits, n = (cl_int)count;
        chcl_arg args[] = {CHCL_REF(S), CHCL_ARG(part), CHCL_ARG(cc), CHCL_ARG(sp),
                           CHCL_ARG(n)};
        st = chcl_launch1(s, CHCL_K_CHANNEL_SUMS_FINISH, CHCL_COUNT_OF(args), args, c);
    }
    chcl_scratch_release(s);
    return st;
}

ch_status chcl_batchnorm_stats(void *stream, int64_t c, float momentum, float eps,
                               ch_bmem mean, ch_bmem rstd, ch_bmem running_mean,
                               ch_bmem running_var, ch_bmem sums, ch_bmem center)
{
    cl_int has_running = running_mean.ptr != NULL, has_sums = sums.ptr != NULL,
           has_center = center.ptr != NULL, cc = (cl_int)c;
    /* Absent buffers: mean stands in, never read. */
    chcl_ref M = chcl_ref_of(mean), R = chcl_ref_of(rstd);
    chcl_ref RM = has_running ? chcl_ref_of(running_mean) : M,
             RV = has_running ? chcl_ref_of(running_var) : M,
             S = has_sums ? chcl_ref_of(sums) : M, C = has_center ? chcl_ref_of(center) : M;
    chcl_arg args[] = {CHCL_REF(M),           CHCL_REF(R),        CHCL_REF(RM),
                       CHCL_REF(RV),          CHCL_REF(S),        CHCL_REF(C),
                       CHCL_ARG(has_running), CHCL_ARG(has_sums), CHCL_ARG(has_center),
                       CHCL_ARG(cc),          CHCL_ARG(momentum), CHCL_ARG(eps)};
    return chcl_launch1(stream, CHCL_K_BATCHNORM_STATS, CHCL_COUNT_OF(args), args, c);
}

ch_status chcl_batchnorm_forward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                 ch_bmem y, ch_bmem x, ch_bmem mean, ch_bmem rstd,
                                 ch_bmem gamma, ch_bmem beta)
{
    ch_status st = chcl_check_count("batchnorm_forward", outer * c * inner);
    if (st != CH_OK)
        return st;
    chcl_ref Y = chcl_ref_of(y), X = chcl_ref_of(x), M = chcl_ref_of(mean),
             R = chcl_ref_of(rstd), G = chcl_ref_of(gamma), B = chcl_ref_of(beta);
    cl_int n = (cl_int)(outer * c * inner), cc = (cl_int)c, in = (cl_int)inner;
    chcl_arg args[] = {CHCL_REF(Y), CHCL_REF(X), CHCL_REF(M),  CHCL_REF(R),  CHCL_REF(G),
                       CHCL_REF(B), CHCL_ARG(n), CHCL_ARG(cc), CHCL_ARG(in)};
    return chcl_launch1(stream, CHCL_K_BATCHNORM_FORWARD, CHCL_COUNT_OF(args), args, n);
}

ch_status chcl_batchnorm_backward(void *stream, int64_t outer, int64_t c, int64_t inner,
                                  ch_bmem dx, ch_bmem dgamma, ch_bmem dbeta, ch_bmem dy,
                                  ch_bmem x, ch_bmem mean, ch_bmem rstd, ch_bmem gamma,
                                  ch_bmem local, ch_bmem total)
{
    ch_status st = chcl_check_count("batchnorm_backward", outer * c * inner);
    if (st != CH_OK)
        return st;
    chcl_ref DG = chcl_ref_of(dgamma), DB = chcl_ref_of(dbeta), R = chcl_ref_of(rstd),
             L = chcl_ref_of(local);
    cl_int cc = (cl_int)c;
    chcl_arg pargs[] = {CHCL_REF(DG), CHCL_REF(DB), CHCL_REF(R), CHCL_REF(L), CHCL_ARG(cc)};
    st = chcl_launch1(stream, CHCL_K_BATCHNORM_PARAM_GRADS, CHCL_COUNT_OF(pargs), pargs, c);
    if (st != CH_OK || !dx.ptr)
        return st;
    chcl_ref DX = chcl_ref_of(dx), DY = chcl_ref_of(dy), X = chcl_ref_of(x),
             M = chcl_ref_of(mean), G = chcl_ref_of(gamma), T = chcl_ref_of(total);
    cl_int n = (cl_int)(outer * c * inner), in = (cl_int)inner;
    chcl_arg args[] = {CHCL_REF(DX), CHCL_REF(DY), CHCL_REF(X),  CHCL_REF(M),
                       CHCL_REF(R),  CHCL_REF(G),  CHCL_REF(T),  CHCL_ARG(n),
                       CHCL_ARG(cc), CHCL_ARG(in)};
    return chcl_launch1(stream, CHCL_K_BATCHNORM_DX, CHCL_COUNT_OF(args), args, n);
}
