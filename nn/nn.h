/* nn's private structures. nn/ uses only the public API of lib/, plus
 * lib/error.h (chi_error, TRY). */
#ifndef CHORUS_NN_NN_H
#define CHORUS_NN_NN_H

#include <chorus.h>
#include <chorus/nn.h>

#include "error.h"

#define NN_NAME 96

typedef struct nn_param {
    char name[NN_NAME];  /* the state_dict name: "layer1.0.conv1.weight" */
    const char *local;   /* the part the module gives: "weight", "wte.weight" */
    ch_tensor *value;
    ch_tensor *grad;
    /* 1: the gradient is zero without its zeros written (ch_module_zero_grad
     * left them to the first write, as PyTorch's zero_grad leaves None):
     * a backward that writes the whole gradient passes nn_grad_beta's 0,
     * one that adds to it calls nn_grad_settle first, and ch_module_param
     * settles it before handing it out. Never for a gradient that is a
     * view of a shared buffer (flat): zero_grad writes those at once. */
    int zero;
    int flat; /* the gradient is a view of a bucket's buffer (nn_grads_into) */
    /* Mixed precision: the module's slot that holds the weight rounded to
     * its half format (nn_half_weight), NULL where none does; and, after
     * an Adam step that rounded into it (nn/optim.c), the stamps
     * (lib/stamp.h) of value and of the rounded copy just after: while
     * both still read so, the copy is the rounding of value. */
    ch_tensor **half;
    uint64_t half_stamps[2];
} nn_param;

/* A buffer: state that is saved but not trained (BatchNorm's running
 * statistics). A tensor, or an int64 counter (num_batches_tracked). */
typedef struct nn_buffer {
    char name[NN_NAME];
    const char *local;
    ch_tensor *value;    /* NULL for the counter */
    int64_t *counter;
} nn_buffer;

/* Called after a module has produced the gradients of its own parameters,
 * [first, first + count) in ch_module_param order of the tree the hook was
 * set on: data parallelism starts reducing them while backward goes on. */
typedef ch_status (*nn_grad_hook)(void *user, int first, int count);

/* Sums `t` (f32, on the module's device) over every replica of the model,
 * in place, each replica getting the same bits: BatchNorm's statistics
 * under data parallelism. Every replica calls it the same number of
 * times, in the same order. */
typedef ch_status (*nn_sync_fn)(void *user, ch_tensor *t);

/* Called as the forward (backward 0) or backward (backward 1) pass of a
 * module that has one set begins (end 0) and after it ended (end 1, after
 * the gradient hook): data parallelism marks the top-level modules' passes
 * on the trace (nn/dp_trace.c). It cannot fail the pass. */
typedef void (*nn_pass_hook)(void *user, ch_module *m, int backward, int end);

typedef struct nn_ops {
    const char *kind;
    ch_status (*forward)(ch_module *m, const ch_tensor *x);
    ch_status (*backward)(ch_module *m, const ch_tensor *dy, int want_dx);
    ch_dtype input;      /* the dtype forward takes (f32, or i32 tokens) */
    int container;       /* children run through the module's own passes */
    /* Draws the module's own parameters from (seed, *offset), advancing
     * *offset by each one's numel; NULL: the Linear/Conv2d rule of m->init. */
    ch_status (*init)(ch_module *m, uint64_t seed, uint64_t *offset);
    /* 1: forward takes x in CH_BF16 or CH_F16 as well as in `input` f32
     * (a half format's output of the module before it, mixed precision) */
    int half_in;
} nn_ops;

/* How ch_module_init draws a module's parameters. */
typedef enum nn_init {
    NN_INIT_DEFAULT = 0, /* PyTorch's layer defaults (uniform 1/sqrt(fan_in); norms 1, 0) */
    NN_INIT_KAIMING_OUT, /* weight normal, std sqrt(2 / fan_out) (torchvision's convs); bias 0 */
    NN_INIT_NORMAL       /* weights normal(0, init_std), biases 0 (GPT-2) */
} nn_init;

#define NN_TEMPS 17

struct ch_module {
    const nn_ops *ops;
    ch_device *dev;          /* where parameters live / it last ran */
    int training;
    ch_dtype precision;      /* mixed precision: CH_F32, CH_BF16 or CH_F16 */

    /* the tree */
    char cname[32];          /* its name in the parent; "" adds no level */
    int named;               /* cname was given (a Sequential numbers the others) */
    ch_module *parent;
    ch_module **child;
    int nchild;
    int pfirst;              /* index of params[0] in the root's ch_module_param order */

    nn_param params[2];
    int nparams;
    nn_buffer bufs[3];
    int nbufs;
    int64_t batches;         /* BatchNorm's num_batches_tracked */

    /* configuration */
    int64_t in, out;         /* features, channels, vocabulary and width, ... */
    int kernel, stride, padding;
    ch_activation act;
    float p;                 /* dropout (attention: both of its dropouts) */
    float eps, momentum;     /* norms */
    int heads;               /* attention */
    int fused;               /* attention: its last forward ran ch_attention */
    int passed;              /* dropout: its last forward passed x through (y a view of it) */
    /* Its GEMM's output in the half format under mixed precision (the
     * GPT's logits, which the fused cross-entropy reads so); 0: f32, as
     * a Linear's stays until the backends' elementwise kernels read and
     * write half storage themselves (today the core widens it for them,
     * lib/ops_half.c, which costs more than the half output saves) */
    int half_out;
    /* LayerNorm inside a GPT block (nn/gpt.c), set by the block for one
     * pass: forward normalises res + x, the sum written in aux (and kept
     * as the input backward reads; ch_add_layernorm); backward's dx is
     * dres + its own input gradient (ch_layernorm_backward_add), the
     * gradient of the sum. NULL otherwise. */
    const ch_tensor *res, *dres;
    int64_t positions;       /* GPT embedding: the context length */
    nn_init init;
    float init_std;

    /* Recomputed activations (ch_module_set_recompute). A segment (a GPT
     * block, a ResNet stage) that recomputes frees the forward state of
     * every module below it once its forward is done (dropped), keeping
     * its own input and output, and runs its forward again at the start of
     * its backward, the modules below it replaying: BatchNorm then reuses
     * the batch statistics of the first forward instead of taking (and
     * exchanging) them again and moving its running statistics twice. */
    int segment; /* ch_module_set_recompute applies to it */
    int recompute;
    int dropped;   /* the state below it is gone: backward reruns forward */
    int replaying; /* inside a segment's re-forward */
    /* The tmp[] slots (a bit each) that a segment's freeing leaves: what
     * a re-forward reuses (BatchNorm's batch statistics). */
    unsigned keep;

    /* forward state, reused across steps */
    const ch_tensor *x;      /* the input, kept for backward */
    ch_tensor *y;            /* output (owned) */
    ch_tensor *dx;           /* input gradient (owned) */
    ch_tensor *aux;          /* im2col columns, pooling indices, dropout mask */
    ch_tensor *aux2;         /* conv: [O, N*P] GEMM output / input gradient */
    ch_tensor *tmp[NN_TEMPS];/* the other layers' intermediate tensors */
    ch_tensor *dy_cast;      /* dy in the output's format, where it came in another */
    ch_tensor **moved;       /* Sequential: activations moved to a child's device */
    ch_tensor **moved_grad;  /* Sequential: gradients moved back */

    /* dropout's random stream */
    uint64_t seed;
    int64_t step, first_sample;
    int layer;               /* preorder position in the tree, part of the stream key */

    nn_grad_hook hook;       /* see nn_set_grad_hook */
    void *hook_user;
    nn_sync_fn sync;         /* see nn_set_sync */
    void *sync_user;
    nn_pass_hook pass; /* see nn_pass_hook; this module's alone */
    void *pass_user;
};

/* Set (fn NULL: clear) the gradient hook of the tree `m`. */
void nn_set_grad_hook(ch_module *m, nn_grad_hook fn, void *user);
/* Set (fn NULL: clear) the statistics' all-reduce of every BatchNorm in
 * the tree `m`. */
void nn_set_sync(ch_module *m, nn_sync_fn fn, void *user);

/* The passes of a child, for modules that run their children themselves:
 * with the dtype, device and shape checks, and the gradient hook. */
ch_status nn_forward(ch_module *m, const ch_tensor *x);
ch_status nn_backward(ch_module *m, const ch_tensor *dy, int want_dx);
/* The end of a constructor: on failure (st not CH_OK) the half-made *out
 * is freed and NULL. Returns st. */
ch_status nn_made(ch_module **out, ch_status st);
/* *slot (freed first) becomes a view of all of t, with its shape. */
ch_status nn_view_of(ch_tensor **slot, const ch_tensor *t);
/* A new module of `ops` (training mode, no parameters). */
ch_status nn_module_new(ch_module **out, const nn_ops *ops);
/* The Sequential's ops (nn/containers.c): the one module whose input may
 * be on another device than its own, each child moving it to its own. */
extern const nn_ops nn_seq_ops;
/* Parameter or buffer on the host: zero value, zero gradient (params). */
ch_status nn_add_param(ch_module *m, const char *local, int ndim, const int64_t *shape);
ch_status nn_add_buffer(ch_module *m, const char *local, int64_t n, double value);
/* Append child `c` to container `m` under `name` (NULL: numbered). On
 * failure c is freed. */
ch_status nn_add_child(ch_module *m, ch_module *c, const char *name);
/* The dropout stream's key of module m, `salt` telling its masks apart. */
uint64_t nn_dropout_key(const ch_module *m, uint64_t salt);
/* Shape of t into shape[]. */
void nn_shape(const ch_tensor *t, int64_t *shape);
/* Make the gradients of parameters [first, first + count) (ch_module_param
 * order) views of `buf` (1-D f32 on the module's device, exactly as many
 * elements), one after the other: those gradients are then one buffer
 * that can be reduced as a whole. Their values are copied in. */
ch_status nn_grads_into(ch_module *m, int first, int count, ch_tensor *buf);
/* The beta of a backward's op that writes parameter p's whole gradient:
 * 0 where ch_module_zero_grad left it unwritten (which the write ends), 1
 * where the op adds to what is there. */
float nn_grad_beta(nn_param *p);
/* p's gradient's zeros written where ch_module_zero_grad left them
 * unwritten: before an op adds to part of it. */
ch_status nn_grad_settle(nn_param *p);
/* Frees every parameter's gradient of the tree, before nn_grads_into
 * gives each one in a buffer (zeros): a module without gradients must
 * get them that way before anything reads them. */
void nn_drop_grads(ch_module *m);

/* *t freed and NULL: a backward's buffer whose reader has run (a child's
 * input gradient once the module before it went back through it). The
 * block goes back to the device's caching allocator, where the next
 * gradient of the pass finds it: the pass holds the gradients in flight,
 * not one per module. A view of it (a container's dx) keeps the memory. */
void nn_release(ch_tensor **t);
/* (Re)allocate *t unless it already has this device, dtype and shape. */
ch_status nn_ensure(ch_tensor **t, ch_device *dev, ch_dtype dtype, int ndim,
                    const int64_t *shape);
/* Mixed precision: t itself when m computes in f32 or t is already in
 * m's half format, else t rounded to it in *slot (made or reused), in
 * *out. */
ch_status nn_half(ch_tensor **slot, const ch_module *m, const ch_tensor *t,
                  const ch_tensor **out);
/* nn_half of a weight, p's value, into *slot, which p remembers, so that
 * the optimizer's step can round into it as it writes value; the copy is
 * used as it stands when nothing has used value or the copy since
 * (nn_param's half_stamps), rounded again otherwise. */
ch_status nn_half_weight(ch_tensor **slot, const ch_module *m, nn_param *p, const ch_tensor **out);
/* The parameter of m's index (ch_module_param's order), NULL out of range. */
nn_param *nn_param_at(const ch_module *m, int index);
/* The format of a GEMM's output: m's half format where m->half_out (the
 * GPT's logits) under mixed precision, as autocast gives them; else f32. */
ch_dtype nn_gemm_out(const ch_module *m);
/* 1 for CH_BF16 and CH_F16. */
int nn_is_half(ch_dtype dt);
/* A reshaped view, freed by the caller. */
ch_status nn_view(ch_tensor **out, const ch_tensor *t, int ndim, const int64_t *shape);
/* 1 when m's output (ch_module_forward's y) may be overwritten between
 * its forward and its backward, which then never reads it: the output of
 * a Linear, a Conv2d or a GPT, or of a Sequential whose last child's is
 * (ch_loss_forward_backward writes the loss's gradient there). */
int nn_output_spare(const ch_module *m);

#ifdef CHI_TEST_HOOKS
/* Only in the copy of nn/ built for tests (tests/Makefile.mk), never in
 * the installed library. Replica `replica` of `dp` fails in the middle of
 * its next call (after its batch is on the device, before forward). */
struct ch_dp;
void chi_dp_fail_next(struct ch_dp *dp, int replica);
/* The reduction of the next step fails (in the reducer thread, while the
 * replicas are in backward). */
void chi_dp_fail_reduce_next(struct ch_dp *dp);
/* Replica `replica` fails its next update (past the barrier, after the
 * others may have updated): the dp must refuse every later call. */
void chi_dp_fail_update_next(struct ch_dp *dp, int replica);
/* Elastic data parallelism's tests: `dev` is lost at point `at` (0:
 * forward, 1: backward, 2: the reduction, 3: the optimizer's update) of
 * training step `step` (1: the first) of any dp: that point fails with
 * CH_ERR_DRIVER there (or, with `hang`, blocks until chi_dp_found), and
 * every probe of the device fails until chi_dp_found(dev) says it
 * answers again. */
void chi_dp_lose(ch_device *dev, int at, int64_t step, int hang);
void chi_dp_found(ch_device *dev);
/* Objects of replicas given up with a thread that did not answer, still
 * waiting for it (each frees itself when its last thread returns). */
int chi_dp_abandoned(void);
#endif

ch_optimizer_kind nn_optimizer_kind(const ch_optimizer *opt);
/* Make (or move) every state tensor the next ch_optimizer_step needs, so
 * that the step itself allocates nothing (data parallelism prepares every
 * replica's before any of them updates). */
ch_status nn_optimizer_prepare(ch_optimizer *opt);
/* The slot of optimizer state `index` (see ch_optimizer_state) and the
 * parameter it belongs to: for loading checkpoints and moving the state
 * between optimizers. `writing`: the caller puts a state there that steps
 * were taken with (it is not a fresh momentum any more). */
ch_status nn_optimizer_state_slot(ch_optimizer *opt, int index, ch_tensor ***slot,
                                  ch_tensor **param, int writing);
/* Optimizer state `index` of a whole optimizer (not ranged), for the
 * caller to write into: the slot's tensor, made first when the optimizer
 * has none yet (f32, its parameter's shape, on its device, its values
 * unset). */
ch_status nn_optimizer_state_make(ch_optimizer *opt, int index, ch_tensor **out);
/* Data parallelism's sharded optimizer (ZeRO stage 1): this optimizer
 * keeps the state of, and updates, elements [lo, hi) of the parameters'
 * concatenation in parameter order only; set before its first step. */
ch_status nn_optimizer_set_range(ch_optimizer *opt, int64_t lo, int64_t hi);
/* Parameter i's elements this optimizer updates: [*first, *first + *count)
 * of its flat elements; returns whether the optimizer is ranged (its state
 * of parameter i then 1-D of *count elements, NULL when 0). */
int nn_optimizer_part(const ch_optimizer *opt, int i, int64_t *first, int64_t *count);
int nn_optimizer_ranged(const ch_optimizer *opt);
/* Bytes of the state the optimizer keeps (its part's, when ranged), and
 * in *made whether it exists yet (it is made at the first step). */
int64_t nn_optimizer_state_bytes(const ch_optimizer *opt, int *made);
/* Elements [first, first + count) of t, flat: a view freed by the caller. */
ch_status nn_flat_view(ch_tensor **out, const ch_tensor *t, int64_t first, int64_t count);

#endif
