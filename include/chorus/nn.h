/* Chorus: neural-network modules, losses and optimizers. */
#ifndef CHORUS_NN_H
#define CHORUS_NN_H

#include <stdint.h>
#include <chorus/ops.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Modules -----------------------------------------------------------------
 * A module has explicit forward and backward passes built from the core's
 * ops, so it runs on every backend. Modules are created on the host device
 * with their parameters and gradients zero (norms: weight 1); ch_module_init
 * draws them from a seed (PyTorch's default scheme, or the scheme of the
 * preset's model, from the Philox stream: the same numbers on every
 * backend), ch_module_to moves them.
 *
 * Modules form a tree: containers (Sequential, Residual, and the layers
 * made of layers) own their children, each child has a name in its parent,
 * and a parameter's name is the path of names down to it, as in PyTorch's
 * state_dict: "layer1.0.conv1.weight", "transformer.h.0.attn.c_attn.bias".
 * A Sequential numbers its unnamed children "0", "1", ... by position; a
 * child named "" adds no level to the path. Layouts are PyTorch's (Linear
 * weight [out, in], Conv2d weight [out, in, kh, kw], Embedding [num, dim]). */
typedef struct ch_module ch_module;

CH_API ch_status ch_nn_linear(ch_module **out, int64_t in_features, int64_t out_features);
CH_API ch_status ch_nn_conv2d(ch_module **out, int64_t in_channels, int64_t out_channels,
                              int kernel, int stride, int padding);
CH_API ch_status ch_nn_activation(ch_module **out, ch_activation act);
CH_API ch_status ch_nn_maxpool2d(ch_module **out, int kernel, int stride);
CH_API ch_status ch_nn_flatten(ch_module **out);
CH_API ch_status ch_nn_dropout(ch_module **out, float p);
/* Conv2d without a bias (the convolutions of a ResNet, before a BatchNorm). */
CH_API ch_status ch_nn_conv2d_nobias(ch_module **out, int64_t in_channels,
                                     int64_t out_channels, int kernel, int stride, int padding);
/* BatchNorm2d over dimension 1 of [N, C, ...] (PyTorch's eps 1e-5, momentum
 * 0.1): in training mode it normalises with the batch's statistics and
 * moves the buffers running_mean, running_var (unbiased) and
 * num_batches_tracked; in evaluation mode it uses the running ones. Under
 * ch_dp the batch statistics are those of the whole batch, over every
 * replica (see ch_dp_options). */
CH_API ch_status ch_nn_batchnorm2d(ch_module **out, int64_t channels, float eps, float momentum);
/* LayerNorm over the last dimension (PyTorch's eps 1e-5). */
CH_API ch_status ch_nn_layernorm(ch_module **out, int64_t features, float eps);
/* Embedding: i32 indices [...] in [0, num) -> rows [..., dim]. */
CH_API ch_status ch_nn_embedding(ch_module **out, int64_t num, int64_t dim);
/* Global average pooling, AdaptiveAvgPool2d(1): [N, C, H, W] -> [N, C, 1, 1]. */
CH_API ch_status ch_nn_avgpool_global(ch_module **out);
/* Causal multi-head self-attention on [B, T, dim], as GPT-2's: children
 * "c_attn" (Linear(dim, 3 dim), q, k and v in that order) and "c_proj"
 * (Linear(dim, dim)); `dropout` on the attention probabilities and on the
 * output. heads must divide dim. */
CH_API ch_status ch_nn_causal_self_attention(ch_module **out, int64_t dim, int heads,
                                             float dropout);

CH_API ch_status ch_nn_sequential(ch_module **out);
/* Append `child` (ownership passes to seq, also on failure), named by its
 * position unless it was given a name (ch_module_set_name). */
CH_API ch_status ch_nn_sequential_add(ch_module *seq, ch_module *child);
/* Append `child` under `name` (no dot; "" adds no level to the names). */
CH_API ch_status ch_nn_sequential_add_named(ch_module *seq, const char *name,
                                            ch_module *child);
/* y = main_branch(x) + shortcut(x); shortcut NULL: the identity. The main
 * branch adds no level to the names; the shortcut is "shortcut" unless it
 * was named. Ownership of both passes to *out, also on failure. */
CH_API ch_status ch_nn_residual(ch_module **out, ch_module *main_branch, ch_module *shortcut);
/* Name a module in its parent (and rename the tree's parameters). */
CH_API ch_status ch_module_set_name(ch_module *m, const char *name);
CH_API const char *ch_module_name(const ch_module *m);

/* The GPT-2 of nanoGPT: token and position embeddings, `layers` pre-norm
 * blocks (ln_1, causal self-attention, ln_2, MLP of 4 dim with GELU), a
 * final LayerNorm, and logits from the token embedding's weight (tied: its
 * gradient sums both uses, a checkpoint holds it once, as
 * "transformer.wte.weight"). Input i32 tokens [B, T], T <= context; output
 * logits [B * T, vocab]. Initialised as nanoGPT: normal(0, 0.02), c_proj
 * weights 0.02 / sqrt(2 layers), biases 0. */
typedef struct ch_gpt_config {
    int layers, heads;
    int64_t dim, context, vocab;
    float dropout;
} ch_gpt_config;
/* layers 4, heads 4, dim 128, context 64, vocab 256 (bytes), dropout 0. */
CH_API ch_gpt_config ch_gpt_defaults(void);
CH_API ch_status ch_nn_gpt(ch_module **out, const ch_gpt_config *config);

/* The CIFAR ResNet of He et al. (2016) for [N, in_channels, H, W] images:
 * conv1 3x3 (width) + bn1 + relu; layer1, layer2, layer3 of (depth - 2) / 6
 * BasicBlocks with width, 2 width, 4 width channels (stride 2 first in
 * layer2 and layer3; a "downsample" 1x1 conv + BatchNorm shortcut where the
 * shape changes); global average pooling; fc. Names as torchvision's;
 * convolutions initialised as torchvision's (normal, fan_out). depth is
 * 6n + 2: 8, 14, 20, ... */
CH_API ch_status ch_nn_resnet(ch_module **out, int depth, int width, int in_channels,
                              int classes);
#define CH_RESNET_DEPTH 20

/* The reference networks for 1x28x28 images and 10 classes, as Sequentials:
 *   "mlp": Flatten, Linear(784, 512), ReLU, Linear(512, 512), ReLU, Linear(512, 10)
 *   "cnn": Conv2d(1, 32, 3, pad 1), ReLU, MaxPool2d(2), Conv2d(32, 64, 3, pad 1),
 *          ReLU, MaxPool2d(2), Flatten, Linear(3136, 128), ReLU, Linear(128, 10)
 *   "resnet": ch_nn_resnet(CH_RESNET_DEPTH, width 16, 1 channel, 10 classes)
 * and "gpt": ch_nn_gpt(ch_gpt_defaults()), a byte-level language model. */
CH_API ch_status ch_nn_preset(ch_module **out, const char *name);

/* Frees the module, its children, parameters and buffers. NULL: no-op. */
CH_API void ch_module_free(ch_module *m);

/* "Linear", "Conv2d", "ReLU", ..., "Sequential". */
CH_API const char *ch_module_kind(const ch_module *m);
CH_API int ch_module_child_count(const ch_module *m);
/* Borrowed: the child belongs to m. NULL when index is out of range. */
CH_API ch_module *ch_module_child(const ch_module *m, int index);

/* Draw every parameter from `seed`: PyTorch's defaults (Kaiming-uniform
 * weights with a = sqrt(5), biases uniform in +-1/sqrt(fan_in)). */
CH_API ch_status ch_module_init(ch_module *m, uint64_t seed);

/* Move the module (all its parameters and buffers) to `dev`. Called on one
 * child of a Sequential, it moves only that layer: the Sequential then moves
 * activations and gradients across at the boundaries. */
CH_API ch_status ch_module_to(ch_module *m, ch_device *dev);
/* The device of the module's first parameter or, for a module without
 * parameters, where it last ran (NULL before). */
CH_API ch_device *ch_module_device(const ch_module *m);

/* A deep copy on `dev`, with the same parameter values (replicas). */
CH_API ch_status ch_module_clone(ch_module **out, const ch_module *m, ch_device *dev);

/* Training mode (dropout on) or evaluation mode. */
CH_API void ch_module_train(ch_module *m, int training);

/* Mixed precision, as PyTorch's autocast runs it: with CH_BF16 or CH_F16
 * the GEMMs of every Linear, of attention's two batched products (q k^T
 * and the probabilities times v, and theirs in backward) and of the GPT's
 * output projection take their inputs (activations, weights, incoming
 * gradients) rounded to that format and sum in f32 (ch_gemm and
 * ch_gemm_batched with half inputs: tensor cores on CUDA), and every
 * Conv2d convolves inputs, weights and gradients rounded to it, also
 * summing in f32 (ch_conv2d with half inputs: oneDNN's bf16 convolution
 * on the host where it has one). The GPT's logits are in the half format
 * (rounded once from the f32 sums, as autocast's), so its
 * ch_module_forward's y is bf16 or f16, which the losses take (computing
 * in f32) and the fused cross-entropy reads and overwrites as they are.
 * The other outputs stay f32: the activations between layers (a Linear's
 * too, until the backends' elementwise kernels read and write half
 * storage themselves), normalisations, attention's scores and softmax.
 * Modules take a half input where a module before gives one (an
 * activation's and a dropout's output is in its input's format).
 * ch_module_backward takes dy in f32 or in y's format (an f32 gradient is
 * rounded to y's format first, as autocast's backward casts it); each
 * input gradient is in its input's format. The parameters, their
 * gradients and the optimizer's state stay f32 (master weights). The half
 * copy of a weight is the rounding of the weight as it stands
 * (where the optimizer's Adam step makes it, the next forward reuses it
 * unless the weight was used or written since). CH_F32 (the default)
 * turns it off. Applies to m and every module below it (clones
 * keep it). CH_ERR_DTYPE for another dtype. (The host's fused attention,
 * the GPT's there, rounds the batched products' inputs with CH_BF16 on a
 * CPU with AMX and a head size that is a multiple of 32, and sums them
 * unrounded in f32 otherwise: ch_attention_packed_mixed.) */
CH_API ch_status ch_module_set_precision(ch_module *m, ch_dtype dtype);
CH_API ch_dtype ch_module_precision(const ch_module *m);

/* Recomputed activations (activation checkpointing): with on != 0, every
 * GPT block (transformer.h.N) and every ResNet stage (layer1, layer2,
 * layer3) in m, m included, keeps only its input and output in forward:
 * the activations inside it go back to the device's allocator, where the
 * next block or stage reuses them. Its backward runs its forward again
 * from the kept input, then goes back through it, and frees them again.
 * The re-run draws the same dropout masks (the same Philox stream
 * offsets), and BatchNorm reuses the batch statistics of the first
 * forward (no second exchange between data-parallel replicas, running
 * statistics moved once), so losses, gradients and their order are those
 * of a run without it, bit for bit where the kernels are deterministic
 * (every backend here); the cost is a second forward of each block, less
 * memory the saving. Other modules ignore it; names, parameters and
 * checkpoints do not change; clones keep it. on 0 turns it off. */
CH_API ch_status ch_module_set_recompute(ch_module *m, int on);
/* 1 when m or a module below it recomputes, else 0 (also for NULL). */
CH_API int ch_module_recompute(const ch_module *m);

/* The random stream of dropout layers: the mask of sample s of the batch
 * is drawn at offset (first_sample + s) * sample_numel of stream
 * (seed, step, layer), so how a batch is split does not change which
 * numbers a sample sees. */
CH_API void ch_module_set_rng(ch_module *m, uint64_t seed, int64_t step, int64_t first_sample);

/* y = m(x). *y belongs to the module and stays valid until its next forward.
 * x is kept for backward: it must not change before backward. */
CH_API ch_status ch_module_forward(ch_module *m, ch_tensor **y, const ch_tensor *x);
/* Given dL/dy, add dL/dparams to the parameters' gradients and set *dx to
 * dL/dx (owned by the module; NULL may be passed when not needed). *dx
 * stays valid until the module's next backward; a module inside a
 * container lets its dx go once the container has read it (the pass
 * keeps only the gradients in flight). */
CH_API ch_status ch_module_backward(ch_module *m, ch_tensor **dx, const ch_tensor *dy);
/* Every parameter's gradient becomes zero; backward adds to gradients, so
 * call it before each step's first backward. The zeros are not written
 * at once (PyTorch's zero_grad leaves None in their place): the next
 * backward's ops write the gradients whole (a Linear's GEMM with beta 0)
 * or write the zeros first where they add to part of one (an embedding's
 * rows), and ch_module_param writes them before it hands a gradient out,
 * so every reader sees zeros. Gradients that data parallelism keeps in
 * its buckets are zeroed at once. */
CH_API ch_status ch_module_zero_grad(ch_module *m);

/* Parameters in state_dict order, with their gradients: *name, *value and
 * *grad are borrowed (they belong to the module); any of them may be NULL. */
CH_API int ch_module_param_count(const ch_module *m);
CH_API ch_status ch_module_param(const ch_module *m, int index, const char **name,
                                 ch_tensor **value, ch_tensor **grad);
CH_API int64_t ch_module_param_numel(const ch_module *m);

/* Buffers (saved, not trained: BatchNorm's running_mean, running_var and
 * num_batches_tracked) in state_dict order. Each is a tensor (*value) or an
 * int64 counter (*counter, the other NULL); all borrowed. */
CH_API int ch_module_buffer_count(const ch_module *m);
CH_API ch_status ch_module_buffer(const ch_module *m, int index, const char **name,
                                  ch_tensor **value, int64_t **counter);

/* ---- Losses -------------------------------------------------------------------- */

/* A loss of one of two kinds, both means:
 * - CH_LOSS_CROSS_ENTROPY: softmax cross-entropy of logits [N, C] against
 *   i32 labels, one per row (N in all), averaged over the rows; forward
 *   keeps the probabilities for backward;
 * - CH_LOSS_MSE: squared error of a prediction of any shape against an f32
 *   target with as many elements, averaged over the elements.
 * The prediction may be f32, bf16 or f16 (a mixed-precision model's
 * output); the loss is computed in f32 either way, and backward's dpred is
 * f32 (ch_module_backward takes it for a half output).
 * Forward gives the loss (1 element on the prediction's device); backward
 * gives dL/dpred scaled by `scale` (1 for the mean loss): [N, C] for
 * cross-entropy, flat ([1, elements]) for MSE. */
typedef struct ch_loss ch_loss;
typedef enum ch_loss_kind { CH_LOSS_CROSS_ENTROPY = 0, CH_LOSS_MSE = 1 } ch_loss_kind;
CH_API ch_status ch_loss_new(ch_loss **out, ch_loss_kind kind);
CH_API void ch_loss_free(ch_loss *loss);
/* target: i32 labels [N] for cross-entropy, f32 of the prediction's shape
 * for MSE (mean over all elements). *value and backward's *dpred are
 * borrowed: they belong to the loss and stay valid until its next forward
 * (value) or backward (dpred). */
CH_API ch_status ch_loss_forward(ch_loss *loss, ch_tensor **value, const ch_tensor *pred,
                                 const ch_tensor *target);
CH_API ch_status ch_loss_backward(ch_loss *loss, ch_tensor **dpred, float scale);
/* Forward and backward at once, for a training step that needs pred only
 * for the loss. Cross-entropy overwrites pred (f32, bf16 or f16) with
 * its gradient, *dpred = pred, in one pass (ch_softmax_xent_fused): one
 * [N, C] tensor where forward and backward keep three; the loss keeps no
 * state for a later ch_loss_backward. MSE runs forward then backward and
 * leaves pred as it was. A module's output may be passed where its
 * backward does not read it: that of a Linear, a Conv2d or a GPT (ch_dp
 * does this by itself). *value as forward's. */
CH_API ch_status ch_loss_forward_backward(ch_loss *loss, ch_tensor **value, ch_tensor **dpred,
                                          ch_tensor *pred, const ch_tensor *target, float scale);

/* ---- Optimizers ---------------------------------------------------------------- */

typedef struct ch_optimizer ch_optimizer;
typedef enum ch_optimizer_kind { CH_OPT_SGD = 0, CH_OPT_ADAM = 1, CH_OPT_ADAMW = 2 } ch_optimizer_kind;

typedef struct ch_optimizer_options {
    ch_optimizer_kind kind;
    float lr;
    float momentum, dampening;  /* SGD */
    int nesterov;               /* SGD */
    float beta1, beta2, eps;    /* Adam, AdamW */
    float weight_decay;
} ch_optimizer_options;

/* Defaults like PyTorch's: SGD momentum 0; Adam(W) betas 0.9, 0.999, eps
 * 1e-8; weight decay 0 (SGD, Adam) or 0.01 (AdamW). */
CH_API ch_optimizer_options ch_optimizer_defaults(ch_optimizer_kind kind, float lr);

/* The state (momentum, moments) lives beside each parameter, on its device. */
CH_API ch_status ch_optimizer_new(ch_optimizer **out, ch_module *model,
                                  const ch_optimizer_options *options);
CH_API void ch_optimizer_free(ch_optimizer *opt);
/* One update of every parameter from its gradient, at learning rate `lr`. */
CH_API ch_status ch_optimizer_step(ch_optimizer *opt, float lr);
/* on 1: step each parameter with a call of its own, as PyTorch's
 * foreach=False does, for comparisons; 0 (the default): an Adam step
 * takes every parameter of a device at once (on CUDA one launch for up to
 * 48 tensors). The same numbers either way. */
CH_API ch_status ch_optimizer_set_one_by_one(ch_optimizer *opt, int on);
CH_API int64_t ch_optimizer_steps(const ch_optimizer *opt);
/* State tensors for checkpoints: for each parameter, "momentum" (SGD) or
 * "exp_avg", "exp_avg_sq" (Adam); NULL when the state does not exist yet.
 * *name and *value are borrowed (they belong to the optimizer). */
CH_API int ch_optimizer_state_count(const ch_optimizer *opt);
CH_API ch_status ch_optimizer_state(const ch_optimizer *opt, int index, const char **name,
                                    ch_tensor **value);
CH_API ch_status ch_optimizer_set_steps(ch_optimizer *opt, int64_t steps);

/* Scale every gradient so that their global L2 norm is at most max_norm;
 * *norm gets the norm before clipping (may be NULL). */
CH_API ch_status ch_clip_grad_norm(ch_module *model, float *norm, float max_norm);

/* ---- Learning-rate schedules ------------------------------------------------- */

typedef enum ch_lr_kind { CH_LR_CONSTANT = 0, CH_LR_STEP = 1, CH_LR_COSINE = 2 } ch_lr_kind;
typedef struct ch_lr_schedule {
    ch_lr_kind kind;
    float base_lr;
    int64_t warmup_steps;   /* linear warm-up from 0 (cosine; others too if > 0) */
    int64_t step_size;      /* CH_LR_STEP: multiply by gamma every step_size steps */
    float gamma;
    int64_t total_steps;    /* CH_LR_COSINE: decays to min_lr at total_steps */
    float min_lr;
} ch_lr_schedule;

CH_API float ch_lr_at(const ch_lr_schedule *s, int64_t step);

/* ---- Checkpoints ---------------------------------------------------------------
 * A safetensors file: the parameters under their state_dict names (PyTorch's
 * safetensors.torch.load_file reads them), the optimizer's state under
 * "optimizer.<parameter>.<state>", and the training state in the header's
 * metadata. Written to "<path>.tmp", fsynced and renamed: a crash leaves
 * the previous file intact. */
typedef struct ch_train_state {
    int64_t epoch;          /* the epoch to continue with */
    int64_t batch;          /* the batch within that epoch to continue from */
    int64_t step;           /* optimizer steps taken */
    uint64_t seed;
    /* The inputs' normalisation, (x - input_mean) / input_std, so that a
     * resumed or evaluated model sees its inputs as it was trained on
     * them (ch_idx_options). input_std 0: none recorded. */
    float input_mean, input_std;
    /* fp16's dynamic loss scale (ch_dp_loss_scale) and its clean steps in
     * a row, so that a resumed run scales as the straight one; scale 0:
     * none recorded. */
    float loss_scale;
    int64_t loss_scale_clean;
} ch_train_state;

/* opt and state may be NULL. */
CH_API ch_status ch_checkpoint_save(const char *path, const ch_module *model,
                                    const ch_optimizer *opt, const ch_train_state *state);
/* The same with every tensor in the file as `dtype`: CH_F32 (what
 * ch_checkpoint_save writes), or CH_BF16 or CH_F16 for a file of half the
 * size (safetensors BF16 and F16, converted as ch_cast does; the counters
 * stay I64). Loading widens them back to f32, exactly: the values are
 * those rounded to the half format. */
CH_API ch_status ch_checkpoint_save_as(const char *path, const ch_module *model,
                                       const ch_optimizer *opt, const ch_train_state *state,
                                       ch_dtype dtype);
/* Checks every name, dtype (F32, BF16 or F16) and shape against the model
 * (and the optimizer, when given) before changing anything, and reports
 * the first mismatch. opt and state may be NULL. */
CH_API ch_status ch_checkpoint_load(const char *path, ch_module *model, ch_optimizer *opt,
                                    ch_train_state *state);

#ifdef __cplusplus
}
#endif

#endif
