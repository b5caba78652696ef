/* GPT sampling for chorus-train's --generate (utils/sample.h): tokens
 * drawn one at a time from the trained model's next-token logits, with a
 * temperature and a top-k cut, the draws from Philox under --seed. */
#include "config.h"

#include <chorus.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sample.h"

static int descending(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* A token drawn from softmax(logits / temperature) over the top_k likeliest
 * (all when top_k is 0), with the uniform number u in [0, 1); `scratch`
 * holds vocab floats. */
static int32_t sample_token(float *logits, float *scratch, int64_t vocab, float temperature,
                            int64_t top_k, double u)
{
    float cut = -INFINITY;
    if (top_k > 0 && top_k < vocab) {
        memcpy(scratch, logits, (size_t)vocab * sizeof *scratch);
        qsort(scratch, (size_t)vocab, sizeof *scratch, descending);
        cut = scratch[top_k - 1];
    }
    double top = -INFINITY, sum = 0;
    for (int64_t i = 0; i < vocab; i++)
        if (logits[i] > top)
            top = logits[i];
    for (int64_t i = 0; i < vocab; i++) {
        double p = logits[i] >= cut ? exp(((double)logits[i] - top) / temperature) : 0.0;
        scratch[i] = (float)p;
        sum += p;
    }
    double target = u * sum, acc = 0;
    int32_t last = 0;
    for (int64_t i = 0; i < vocab; i++) {
        if (scratch[i] <= 0.0f)
            continue;
        last = (int32_t)i;
        acc += scratch[i];
        if (acc > target)
            return (int32_t)i;
    }
    return last;
}

/* One forward of m on the last `context` tokens of text[0, n):
 * the logits of the next token into *logits. */
static ch_status next_logits(ch_module *m, const ch_gpt_config *gpt, const int32_t *text, int64_t n,
                             float *logits)
{
    int64_t ctx = gpt->context, len = n < ctx ? n : ctx;
    int64_t shape[2] = {1, len}, vocab = gpt->vocab;
    ch_tensor *x = NULL, *row = NULL, *y = NULL, *wide = NULL;
    ch_status st = ch_tensor_new(&x, ch_module_device(m), CH_I32, 2, shape);
    if (st == CH_OK)
        st = ch_tensor_upload(x, text + n - len, (size_t)len * sizeof(int32_t));
    if (st == CH_OK)
        st = ch_module_forward(m, &y, x);
    if (st == CH_OK)
        st = ch_tensor_view(&row, y, len - 1, 1);
    /* Mixed precision's logits are half: widened to f32 on the device. */
    if (st == CH_OK && ch_tensor_dtype(row) != CH_F32) {
        int64_t one[2] = {1, vocab};
        st = ch_tensor_new(&wide, ch_tensor_device(row), CH_F32, 2, one);
        if (st == CH_OK)
            st = ch_cast(wide, row);
    }
    if (st == CH_OK)
        st = ch_tensor_download(wide ? wide : row, logits, (size_t)vocab * sizeof(float));
    ch_tensor_free(wide);
    ch_tensor_free(row);
    ch_tensor_free(x);
    return st;
}

ch_status sample_generate(ch_module *m, const train_options *o, int bytes)
{
    int64_t plen = (int64_t)strlen(o->prompt), n = plen > 0 ? plen : 1;
    int32_t *text = malloc((size_t)(n + o->generate) * sizeof *text);
    float *logits = malloc(2 * (size_t)o->gpt.vocab * sizeof *logits);
    ch_status st = text && logits ? CH_OK : CH_ERR_OUT_OF_MEMORY;
    if (st != CH_OK) {
        free(text);
        free(logits);
        fprintf(stderr, "chorus-train: --generate: out of memory\n");
        return st;
    }
    for (int64_t i = 0; i < plen; i++)
        text[i] = (unsigned char)o->prompt[i] % o->gpt.vocab;
    if (plen == 0)
        text[0] = 0;
    ch_module_train(m, 0);
    printf("sample:\n%s", bytes ? o->prompt : "");
    for (int64_t i = 0; st == CH_OK && i < o->generate; i++) {
        st = next_logits(m, &o->gpt, text, n, logits);
        uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), 0x67656e, 0};
        ch_philox4x32(ctr, o->seed);
        double u = (ctr[0] >> 8) * (1.0 / 16777216.0);
        if (st == CH_OK) {
            int32_t tok = sample_token(logits, logits + o->gpt.vocab, o->gpt.vocab, o->temperature,
                                       o->top_k, u);
            text[n++] = tok;
            if (bytes)
                putchar(tok);
            else
                printf("%s%d", i ? " " : "", tok);
        }
    }
    printf("\n");
    fflush(stdout);
    ch_module_train(m, 1);
    free(text);
    free(logits);
    return st;
}
