/* im2col, col2im and max pooling: one work-item per element of the tensor
 * each kernel writes; the geometry goes as twelve long arguments (conv.cl's
 * GEOM), the kernel of the launch's index width chosen by
 * lib/kernels/index.h's rule. */
#include "config.h"

#include "opencl.h"
#include "kernels/index.h"

#define GEOM_ARGS 12

/* The 64-bit twin of each 32-bit window kernel. */
static chcl_kern_id wide(chcl_kern_id k)
{
    switch (k) {
    case CHCL_K_IM2COL: return CHCL_K_IM2COL_64;
    case CHCL_K_COL2IM: return CHCL_K_COL2IM_64;
    case CHCL_K_MAXPOOL_FORWARD: return CHCL_K_MAXPOOL_FORWARD_64;
    default: return CHCL_K_MAXPOOL_BACKWARD_64;
    }
}

/* Launch `k` (or its 64-bit twin) over `total` work-items with the
 * arguments: out, in (each a buffer and offset), optionally a second
 * output, then total and the geometry. */
static ch_status conv_launch(void *stream, chcl_kern_id k, const ch_conv_geom *g, int64_t total,
                             const ch_bmem *bufs, int nbufs)
{
    const cl_long geom[GEOM_ARGS] = {g->n,  g->c,  g->h,  g->w,  g->oh, g->ow,
                                     g->kh, g->kw, g->sh, g->sw, g->ph, g->pw};
    if (!chk_index_is_32(chk_window_largest(g->n, g->c, g->h, g->w, g->oh, g->ow, g->kh, g->kw)))
        k = wide(k);
    chcl_ref refs[3];
    chcl_arg args[2 * 3 + 1 + GEOM_ARGS];
    int nargs = 0;
    for (int i = 0; i < nbufs; i++) {
        refs[i] = chcl_ref_of(bufs[i]);
        args[nargs++] = CHCL_ARG(refs[i].mem);
        args[nargs++] = CHCL_ARG(refs[i].off);
    }
    cl_long count = total;
    args[nargs++] = CHCL_ARG(count);
    for (int i = 0; i < GEOM_ARGS; i++)
        args[nargs++] = CHCL_ARG(geom[i]);
    return chcl_launch1(stream, k, nargs, args, total);
}

ch_status chcl_im2col(void *stream, const ch_conv_geom *g, ch_bmem col, ch_bmem x)
{
    int64_t total = g->c * g->kh * g->kw * g->n * g->oh * g->ow;
    return conv_launch(stream, CHCL_K_IM2COL, g, total, (ch_bmem[]){col, x}, 2);
}

ch_status chcl_col2im(void *stream, const ch_conv_geom *g, ch_bmem dx, ch_bmem col)
{
    int64_t total = g->n * g->c * g->h * g->w;
    return conv_launch(stream, CHCL_K_COL2IM, g, total, (ch_bmem[]){dx, col}, 2);
}

ch_status chcl_maxpool_forward(void *stream, const ch_conv_geom *g, ch_bmem y,
                               ch_bmem idx, ch_bmem x)
{
    int64_t total = g->n * g->c * g->oh * g->ow;
    return conv_launch(stream, CHCL_K_MAXPOOL_FORWARD, g, total, (ch_bmem[]){y, idx, x}, 3);
}

ch_status chcl_maxpool_backward(void *stream, const ch_conv_geom *g, ch_bmem dx,
                                ch_bmem dy, ch_bmem idx)
{
    int64_t total = g->n * g->c * g->h * g->w;
    return conv_launch(stream, CHCL_K_MAXPOOL_BACKWARD, g, total, (ch_bmem[]){dx, dy, idx}, 3);
}
