/* Chorus: train neural networks on every device of a machine.
 * One include for the whole public API.
 *
 * Conventions every header follows.
 *
 * Statuses: a call that can fail returns a ch_status, and ch_last_error()
 * then names the call, the argument and the problem. Queries that cannot
 * fail (ch_tensor_numel, ch_device_id, ...) return their value.
 *
 * Argument order:
 *   - a call that makes or finds a handle puts it first:
 *     ch_tensor_new(&t, dev, ...), ch_device_by_name(&dev, "cuda:0"),
 *     ch_tensor_view(&v, t, ...), ch_device_default_stream(&s, dev),
 *     ch_reduce_mode_parse(&mode, "auto");
 *   - an op (chorus/ops.h) takes the tensors it writes first, then those it
 *     reads, then its scalars: ch_add(y, a, b), ch_softmax_xent(loss, probs,
 *     logits, labels);
 *   - a call that acts on an object takes that object first, then what it
 *     writes, then what it reads: ch_module_forward(m, &y, x),
 *     ch_dp_step(dp, &loss, batch, lr), ch_device_get_info(dev, &info).
 *     An index that picks the object, or a part of it, comes with the
 *     object (ch_backend_get_info(index, &info), ch_dataset_get(ds, index,
 *     image, &label), ch_module_param(m, index, &name, &value, &grad));
 *     the length of output arrays follows them
 *     (ch_dp_last_step(dp, counts, seconds, n)); a checkpoint's file comes
 *     first (ch_checkpoint_load(path, model, opt, &state)).
 *
 * Ownership:
 *   - what the caller makes is the caller's to free with the matching
 *     `*_free` (every `*_free(NULL)` is a no-op): the results of `*_new`,
 *     ch_nn_* and ch_nn_preset (until added to a Sequential, which then owns
 *     them), ch_module_clone, ch_tensor_to, ch_tensor_view,
 *     ch_tensor_reshape, ch_dataset_*_open, ch_dataset_head and
 *     ch_tokens_open;
 *   - everything else a call hands back is borrowed and must not be freed:
 *     devices (the library's until ch_shutdown), default streams, a
 *     module's output and input gradient (until its next forward or
 *     backward), a loss's value and gradient (until its next forward or
 *     backward), parameters, gradients, children and optimizer state (as
 *     long as their module or optimizer), a data-parallel replica and its
 *     optimizer (as long as the ch_dp), a loader's batch (given back with
 *     ch_loader_release), and every const char * (constant). Each call's
 *     comment says which of its outputs are borrowed. */
#ifndef CHORUS_H
#define CHORUS_H

#include <chorus/export.h>
#include <chorus/status.h>
#include <chorus/clock.h>
#include <chorus/trace.h>
#include <chorus/device.h>
#include <chorus/stream.h>
#include <chorus/tensor.h>
#include <chorus/ops.h>
#include <chorus/data.h>
#include <chorus/nn.h>
#include <chorus/reduce.h>
#include <chorus/dist.h>
#include <chorus/dp.h>

#define CHORUS_VERSION_MAJOR 0
#define CHORUS_VERSION_MINOR 1
#define CHORUS_VERSION_PATCH 0

#ifdef __cplusplus
extern "C" {
#endif

/* The library's version string ("0.1.0"). */
CH_API const char *ch_version(void);

#ifdef __cplusplus
}
#endif

#endif
