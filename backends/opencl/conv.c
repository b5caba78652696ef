/* im2col, col2im and max pooling: one work-item per element of the tensor
 * each kernel writes; the geometry goes as twelve int arguments (conv.cl's
 * GEOM). */
#include "config.h"

#include "opencl.h"

#define GEOM_ARGS 12

/* The geometry as the kernels take it, or CH_ERR_LIMIT when an index into
 * the input, the output or the column matrix would not fit in an int. */
static ch_status geom_args(const char *op, const ch_conv_geom *g, cl_int out[GEOM_ARGS])
{
    int64_t input = g->n * g->c * g->h * g->w;
    int64_t output = g->n * g->c * g->oh * g->ow;
    int64_t col = (int64_t)g->kh * g->kw * output;
    int64_t largest = input > col ? input : col;
    ch_status st = chcl_check_count(op, largest);
    if (st != CH_OK)
        return st;
    const int64_t v[GEOM_ARGS] = {g->n, g->c, g->h, g->w, g->oh, g->ow,
                                  g->kh, g->kw, g->sh, g->sw, g->ph, g->pw};
    for (int i = 0; i < GEOM_ARGS; i++)
        out[i] = (cl_int)v[i];
    return CH_OK;
}

/* Launch `k` over `total` work-items with the arguments: out, in (each a
 * buffer and offset), optionally a second output, then total and the
 * geometry. */
static ch_status conv_launch(void *stream, chcl_kern_id k, const char *op,
                             const ch_conv_geom *g, int64_t total, const ch_bmem *bufs,
                             int nbufs)
{
    cl_int geom[GEOM_ARGS];
    ch_status st = geom_args(op, g, geom);
    if (st != CH_OK)
        return st;
    chcl_ref refs[3];
    chcl_arg args[2 * 3 + 1 + GEOM_ARGS];
    int nargs = 0;
    for (int i = 0; i < nbufs; i++) {
        refs[i] = chcl_ref_of(bufs[i]);
        args[nargs++] = CHCL_ARG(refs[i].mem);
        args[nargs++] = CHCL_ARG(refs[i].off);
    }
    cl_int count = (cl_int)total;
    args[nargs++] = CHCL_ARG(count);
    for (int i = 0; i < GEOM_ARGS; i++)
        args[nargs++] = CHCL_ARG(geom[i]);
    return chcl_launch1(stream, k, nargs, args, total);
}

ch_status chcl_im2col(void *stream, const ch_conv_geom *g, ch_bmem col, ch_bmem x)
{
    int64_t total = g->c * g->kh * g->kw * g->n * g->oh * g->ow;
    return conv_launch(stream, CHCL_K_IM2COL, "im2col", g, total, (ch_bmem[]){col, x}, 2);
}

ch_status chcl_col2im(void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem col)
{
    int64_t total = g->n * g->c * g->h * g->w;
    return conv_launch(stream, CHCL_K_COL2IM, "col2im", g, total, (ch_bmem[]){dx, col}, 2);
}

ch_status chcl_maxpool_forward(void *stream, const ch_conv_geom *g, ch_bmem y,
                               ch_bmem idx, ch_bmem x)
{
    int64_t total = g->n * g->c * g->oh * g->ow;
    return conv_launch(stream, CHCL_K_MAXPOOL_FORWARD, "maxpool_forward", g, total,
                       (ch_bmem[]){y, idx, x}, 3);
}

ch_status chcl_maxpool_backward(void *stream, const ch_conv_geom *g, ch_bmem dx,
                                ch_bmem dy, ch_bmem idx)
{
    int64_t total = g->n * g->c * g->h * g->w;
    return conv_launch(stream, CHCL_K_MAXPOOL_BACKWARD, "maxpool_backward", g, total,
                       (ch_bmem[]){dx, dy, idx}, 3);
}
