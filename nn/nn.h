/* nn's private structures. nn/ uses only the public API of lib/, plus
 * lib/error.h (chi_error, TRY). */
#ifndef CHORUS_NN_NN_H
#define CHORUS_NN_NN_H

#include <chorus.h>
#include <chorus/nn.h>

#include "error.h"

typedef struct nn_param {
    char name[64];      /* "3.weight" */
    ch_tensor *value;
    ch_tensor *grad;
} nn_param;

/* Called by a Sequential during backward, right after child modules have
 * produced the gradients of parameters [first, first + count) (indices in
 * ch_module_param order): data parallelism starts reducing them while
 * backward goes on. */
typedef ch_status (*nn_grad_hook)(void *user, int first, int count);

typedef struct nn_ops {
    const char *kind;
    ch_status (*forward)(ch_module *m, const ch_tensor *x);
    ch_status (*backward)(ch_module *m, const ch_tensor *dy, int want_dx);
} nn_ops;

struct ch_module {
    const nn_ops *ops;
    ch_device *dev;          /* where parameters live / it last ran */
    int training;

    nn_param params[2];      /* weight, bias (Linear, Conv2d) */
    int nparams;

    /* configuration */
    int64_t in, out;         /* features or channels */
    int kernel, stride, padding;
    ch_activation act;
    float p;                 /* dropout */

    ch_module **child;       /* Sequential */
    int nchild;

    /* forward state, reused across steps */
    const ch_tensor *x;      /* the input, kept for backward */
    ch_tensor *y;            /* output (owned) */
    ch_tensor *dx;           /* input gradient (owned) */
    ch_tensor *aux;          /* im2col columns, pooling indices, dropout mask */
    ch_tensor *aux2;         /* conv: [O, N*P] GEMM output / input gradient */
    ch_tensor **moved;       /* Sequential: activations moved to a child's device */
    ch_tensor **moved_grad;  /* Sequential: gradients moved back */

    /* dropout's random stream */
    uint64_t seed;
    int64_t step, first_sample;
    int layer;               /* index in the parent, part of the stream key */

    nn_grad_hook hook;       /* Sequential: see nn_set_grad_hook */
    void *hook_user;
};

/* Set (fn NULL: clear) the gradient hook of `m`, a Sequential; other
 * modules have no hook. */
void nn_set_grad_hook(ch_module *m, nn_grad_hook fn, void *user);
/* Make the gradients of parameters [first, first + count) (ch_module_param
 * order) views of `buf` (1-D f32 on the module's device, exactly as many
 * elements), one after the other: those gradients are then one buffer
 * that can be reduced as a whole. Their values are copied in. */
ch_status nn_grads_into(ch_module *m, int first, int count, ch_tensor *buf);

/* (Re)allocate *t unless it already has this device, dtype and shape. */
ch_status nn_ensure(ch_tensor **t, ch_device *dev, ch_dtype dtype, int ndim,
                    const int64_t *shape);
/* A reshaped view, freed by the caller. */
ch_status nn_view(ch_tensor **out, const ch_tensor *t, int ndim, const int64_t *shape);

#ifdef CHI_TEST_HOOKS
/* Only in the copy of nn/ built for tests (tests/Makefile.mk), never in
 * the installed library. Replica `replica` of `dp` fails in the middle of
 * its next call (after its batch is on the device, before forward). */
struct ch_dp;
void chi_dp_fail_next(struct ch_dp *dp, int replica);
/* The reduction of the next step fails (in the reducer thread, while the
 * replicas are in backward). */
void chi_dp_fail_reduce_next(struct ch_dp *dp);
#endif

/* The slot of optimizer state `index` (see ch_optimizer_state) and the
 * parameter it belongs to: for loading checkpoints. */
ch_optimizer_kind nn_optimizer_kind(const ch_optimizer *opt);
ch_status nn_optimizer_state_slot(ch_optimizer *opt, int index, ch_tensor ***slot,
                                  ch_tensor **param);

#endif
