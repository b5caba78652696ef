/* The host's fused softmax-cross-entropy, forward and backward: each row
 * by one thread (the exponentials vectorised in float, as ch_softmax's,
 * their sum and the loss in double), so the result is the same bits
 * whatever the thread count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <math.h>
#include <stdlib.h>

#include "host.h"
#include "kernels/xent.h"

/* Labels outside [0, C) are an error on every backend (ops.h); the message
 * names the first, as the device backends' do. */
static ch_status check_labels(const char *fn, const int32_t *labels, int64_t n,
                              int64_t c)
{
    for (int64_t i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= c)
            return chi_bad_label(fn, i, labels[i], c);
    return CH_OK;
}

/* One row: probs = softmax(logits) (chi_host_softmax_row: the max taken
 * off, the vectorised exp, the sum in double); returns -log probs[label]
 * = log(sum) - (logits[label] - max). */
static double softmax_row(float *probs, const float *logits, int64_t c, int32_t label)
{
    float max;
    double sum = chi_host_softmax_row(probs, logits, c, c, &max);
    return log(sum) - ((double)logits[label] - max);
}

ch_status chi_host_softmax_xent(void *stream, int64_t n, int64_t c, ch_bmem loss,
                                ch_bmem probs, ch_bmem logits, ch_bmem labels)
{
    (void)stream;
    const int32_t *pl = chi_host_i32(labels);
    ch_status st = check_labels("ch_softmax_xent", pl, n, c);
    if (st != CH_OK)
        return st;
    double *row_loss = malloc((size_t)n * sizeof *row_loss);
    if (!row_loss)
        return chi_error(CH_ERR_OUT_OF_MEMORY, "softmax_xent: malloc(%zu) failed",
                         (size_t)n * sizeof *row_loss);
    float *pp = chi_host_f32(probs);
    const float *px = chi_host_f32(logits);
    CHI_OMP(omp parallel for if (n * c > CHI_HOST_PAR_MIN / 16))
    for (int64_t i = 0; i < n; i++)
        row_loss[i] = softmax_row(pp + i * c, px + i * c, c, pl[i]);
    double total = 0.0;
    for (int64_t i = 0; i < n; i++)
        total += row_loss[i];
    free(row_loss);
    chi_host_f32(loss)[0] = (float)(total / (double)n);
    return CH_OK;
}

ch_status chi_host_softmax_xent_backward(void *stream, int64_t n, int64_t c,
                                         ch_bmem dlogits, ch_bmem probs,
                                         ch_bmem labels, float scale)
{
    (void)stream;
    const int32_t *pl = chi_host_i32(labels);
    ch_status st = check_labels("ch_softmax_xent_backward", pl, n, c);
    if (st != CH_OK)
        return st;
    float *pd = chi_host_f32(dlogits);
    const float *pp = chi_host_f32(probs);
    double k = chk_xent_scale(scale, (double)n);
    CHI_OMP(omp parallel for if (n * c > CHI_HOST_PAR_MIN))
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < c; j++)
            pd[i * c + j] = chk_xent_grad(pp[i * c + j], j == pl[i], k);
    return CH_OK;
}
