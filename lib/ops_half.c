/* bf16 and f16 storage for the ops that compute in f32: elementwise,
 * activations, bias, reductions, softmax, LayerNorm and BatchNorm. An op
 * given a half tensor runs on f32 copies on the same devices (the half
 * inputs widened exactly by ch_cast, the half outputs rounded back once,
 * to nearest even), so every backend reads and writes half storage through
 * its conversion slots and its f32 kernels; the results are the f32 op's
 * on the half values, rounded once. A backend's own half kernels, reading
 * and writing half storage directly, would slot in here. */
#include "config.h"

#include <string.h>

#include "core.h"
#include "opcheck.h"

#define MAX_ARGS 12

static int is_half(const ch_tensor *t)
{
    return t && (t->dtype == CH_BF16 || t->dtype == CH_F16);
}

/* The same elements of the same buffer in the same format. */
static int same_region(const ch_tensor *a, const ch_tensor *b)
{
    return a->buf == b->buf && a->off == b->off && a->numel == b->numel && a->dtype == b->dtype;
}

ch_status chi_half_call(int n, ch_tensor *const *t, const int *role, chi_f32_op op,
                        const void *ctx, int *handled)
{
    *handled = 0;
    int any = 0;
    for (int i = 0; i < n; i++)
        any |= is_half(t[i]);
    if (!any)
        return CH_OK;
    *handled = 1;
    if (n > MAX_ARGS)
        return chi_error(CH_ERR_INTERNAL, "chi_half_call: %d tensors, at most %d", n, MAX_ARGS);
    ch_tensor *w[MAX_ARGS] = {NULL}, *own[MAX_ARGS] = {NULL};
    int alias[MAX_ARGS], reads[MAX_ARGS] = {0}, writes[MAX_ARGS] = {0};
    /* Arguments naming one region share one f32 copy, read when any of
     * them is read and rounded back when any of them is written. */
    for (int i = 0; i < n; i++) {
        alias[i] = i;
        for (int j = 0; j < i && is_half(t[i]); j++)
            if (t[j] && alias[j] == j && same_region(t[i], t[j])) {
                alias[i] = j;
                break;
            }
        reads[alias[i]] |= role[i] & CHI_HALF_IN;
        writes[alias[i]] |= role[i] & CHI_HALF_OUT;
    }
    ch_status st = CH_OK;
    for (int i = 0; i < n && st == CH_OK; i++) {
        if (!is_half(t[i])) {
            w[i] = t[i];
            continue;
        }
        if (alias[i] != i) {
            w[i] = w[alias[i]];
            continue;
        }
        st = ch_tensor_new(&own[i], t[i]->dev, CH_F32, t[i]->ndim, t[i]->shape);
        if (st == CH_OK && reads[i])
            st = ch_cast(own[i], t[i]);
        w[i] = own[i];
    }
    if (st == CH_OK)
        st = op(ctx, w);
    for (int i = 0; i < n && st == CH_OK; i++)
        if (own[i] && writes[i])
            st = ch_cast(t[i], own[i]);
    for (int i = 0; i < n; i++)
        ch_tensor_free(own[i]);
    return st;
}
