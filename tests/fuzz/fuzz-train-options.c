/* chorus-train's option parser, train_parse_options (utils/train-options.c).
 *
 * Input: the arguments after the program name, separated by NUL bytes (at
 * most 64 of them).
 *
 * Checked: the parser returns 0, EXIT_USAGE or --help's or --version's
 * code; EXIT_USAGE comes with a message "chorus-train: ... (see
 * --help)\n" and nothing else prints; parsing the same line again
 * gives the same result (getopt starts over); parsed options hold what
 * chorus-train relies on (a known model, optimizer, schedule, batchnorm,
 * split and reduction; numbers in their ranges; heads dividing dim;
 * --device-memory's devices named once each, with sizes >= 1; --elastic
 * and its timeout only where ch_dp_new takes them). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "train-options.h"

#define MAXARGS 64

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    return 0;
}

static int one_of(const char *s, const char *const *set)
{
    for (; *set; set++)
        if (strcmp(s, *set) == 0)
            return 1;
    return 0;
}

/* Parses a copy of argv; the message, if any, goes to *msg (malloc'ed). */
static int parse(int argc, char **argv, train_options *o, char **msg, size_t *len)
{
    char *copy[MAXARGS + 2];
    memcpy(copy, argv, (size_t)(argc + 1) * sizeof *copy);
    FILE *err = open_memstream(msg, len);
    FUZZ_CHECK(err != NULL, "open_memstream");
    int rc = train_parse_options(argc, copy, o, err);
    FUZZ_CHECK(fclose(err) == 0, "fclose");
    return rc;
}

static void check_options(const train_options *o)
{
    static const char *const models[] = {"mlp", "cnn", "resnet", "gpt", NULL};
    static const char *const optimizers[] = {"sgd", "adam", "adamw", NULL};
    static const char *const schedules[] = {"cosine", "step", "constant", NULL};
    static const char *const batchnorms[] = {"sync", "local", NULL};
    FUZZ_CHECK(one_of(o->model, models), "--model %s", o->model);
    FUZZ_CHECK(o->lm == (strcmp(o->model, "gpt") == 0), "lm %d for %s", o->lm, o->model);
    FUZZ_CHECK(o->data && o->devices && o->split && o->reduce && o->prompt, "a NULL string");
    FUZZ_CHECK(one_of(o->optimizer, optimizers), "--optimizer %s", o->optimizer);
    FUZZ_CHECK(one_of(o->schedule, schedules), "--schedule %s", o->schedule);
    FUZZ_CHECK(one_of(o->batchnorm, batchnorms), "--batchnorm %s", o->batchnorm);
    ch_reduce_mode mode;
    FUZZ_CHECK(ch_reduce_mode_parse(&mode, o->reduce) == CH_OK, "--reduce %s", o->reduce);
    if (strcmp(o->split, "auto") == 0 || strcmp(o->split, "equal") == 0) {
        FUZZ_CHECK(o->nweights == 0, "%d weights for --split %s", o->nweights, o->split);
    } else {
        FUZZ_CHECK(o->nweights >= 1 && o->nweights <= 64, "%d weights", o->nweights);
        for (int i = 0; i < o->nweights; i++)
            FUZZ_CHECK(o->weights[i] > 0.0f && isfinite(o->weights[i]), "weight %g",
                       o->weights[i]);
    }
    FUZZ_CHECK(o->norm.std == 0.0f || (o->norm.std > 0.0f && isfinite(o->norm.std) &&
                                       isfinite(o->norm.mean)),
               "--normalize %g,%g", o->norm.mean, o->norm.std);
    FUZZ_CHECK(o->epochs >= 1 && (o->max_steps == -1 || o->max_steps >= 1) && o->limit >= 0,
               "epochs %lld, max steps %lld, limit %lld", (long long)o->epochs,
               (long long)o->max_steps, (long long)o->limit);
    FUZZ_CHECK(o->checkpoint_every == 0 || (o->checkpoint_every >= 1 && o->checkpoint),
               "checkpoint every %lld steps, checkpoint %s", (long long)o->checkpoint_every,
               o->checkpoint ? o->checkpoint : "(none)");
    /* --bucket-mb auto is -1. */
    FUZZ_CHECK((o->bucket_mb == -1 || (o->bucket_mb >= 1 && o->bucket_mb <= 1 << 20)) &&
                   o->accumulate >= 1 && o->accumulate <= 1 << 20 && o->batch >= 1 &&
                   o->batch <= 1 << 20,
               "bucket %lld, accumulate %lld, batch %d", (long long)o->bucket_mb,
               (long long)o->accumulate, o->batch);
    FUZZ_CHECK(o->lr > 0.0f && isfinite(o->lr), "lr %g", o->lr);
    FUZZ_CHECK(o->depth >= 8 && (o->depth - 2) % 6 == 0 && o->depth <= 10000, "depth %lld",
               (long long)o->depth);
    FUZZ_CHECK(o->gpt.layers >= 1 && o->gpt.heads >= 1 && o->gpt.dim >= 1 &&
                   o->gpt.context >= 1 && o->gpt.vocab >= 0 && o->gpt.dim % o->gpt.heads == 0,
               "gpt %d layers, %d heads, dim %lld, context %lld, vocab %lld", o->gpt.layers,
               o->gpt.heads, (long long)o->gpt.dim, (long long)o->gpt.context,
               (long long)o->gpt.vocab);
    FUZZ_CHECK(o->gpt.dropout >= 0.0f && o->gpt.dropout < 1.0f, "dropout %g", o->gpt.dropout);
    FUZZ_CHECK(o->generate >= 0 && o->generate <= 1 << 20 && o->top_k >= 0 &&
                   o->eval_every >= 0 && o->temperature > 0.0f && isfinite(o->temperature),
               "generate %lld, top-k %lld, eval-every %lld, temperature %g",
               (long long)o->generate, (long long)o->top_k, (long long)o->eval_every,
               o->temperature);
    FUZZ_CHECK(o->lm || (o->generate == 0 && o->eval_every == 0), "gpt options for %s",
               o->model);
    FUZZ_CHECK((o->aug & ~(unsigned)(CH_AUGMENT_FLIP | CH_AUGMENT_CROP)) == 0 &&
                   (!o->lm || o->aug == 0) &&
                   ((o->aug & CH_AUGMENT_CROP) ? o->crop_pad >= 1 && o->crop_pad <= 1024
                                               : o->crop_pad == 0),
               "augment %u, crop %d", o->aug, o->crop_pad);
    FUZZ_CHECK(o->weight_decay == -1.0f || (o->weight_decay >= 0.0f && isfinite(o->weight_decay)),
               "weight decay %g", o->weight_decay);
    FUZZ_CHECK(o->save_dtype == CH_F32 || o->save_dtype == CH_BF16 || o->save_dtype == CH_F16,
               "save dtype %d", (int)o->save_dtype);
    FUZZ_CHECK(o->precision == CH_F32 || o->precision == CH_BF16 || o->precision == CH_F16,
               "precision %d", (int)o->precision);
    FUZZ_CHECK(o->reduce_dtype == CH_F32 || o->reduce_dtype == CH_BF16, "reduce dtype %d",
               (int)o->reduce_dtype);
    FUZZ_CHECK(o->nlimits >= 0 && o->nlimits <= TRAIN_MAX_LIMITS, "%d limits", o->nlimits);
    for (int i = 0; i < o->nlimits; i++) {
        const train_memory_limit *l = &o->limits[i];
        size_t len = strnlen(l->device, sizeof l->device);
        FUZZ_CHECK(len > 0 && len < sizeof l->device && !strchr(l->device, '=') &&
                       !strchr(l->device, ',') && l->bytes >= 1,
                   "limit %d: \"%.*s\" %llu bytes", i, (int)len, l->device,
                   (unsigned long long)l->bytes);
        for (int j = 0; j < i; j++)
            FUZZ_CHECK(strcmp(o->limits[j].device, l->device) != 0, "%s limited twice", l->device);
    }
    FUZZ_CHECK((o->shard_optimizer == 0 || o->shard_optimizer == 1) &&
                   (o->recompute == 0 || o->recompute == 1),
               "shard %d, recompute %d", o->shard_optimizer, o->recompute);
    /* --elastic-timeout only with --elastic, which ch_dp_new refuses with
     * --shard-optimizer and --accumulate > 1. */
    FUZZ_CHECK((o->elastic == 0 || o->elastic == 1) &&
                   (o->elastic_timeout == 0.0 ||
                    (o->elastic && o->elastic_timeout > 0.0 && isfinite(o->elastic_timeout))) &&
                   (!o->elastic || (!o->shard_optimizer && o->accumulate == 1)),
               "elastic %d, timeout %g, shard %d, accumulate %lld", o->elastic, o->elastic_timeout,
               o->shard_optimizer, (long long)o->accumulate);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 1);
    FUZZ_CHECK(buf != NULL, "out of memory");
    memcpy(buf, data, size);
    buf[size] = '\0';
    char *argv[MAXARGS + 2];
    int argc = 0;
    argv[argc++] = (char *)"chorus-train";
    for (size_t at = 0; at < size && argc <= MAXARGS; at += strlen(buf + at) + 1)
        argv[argc++] = buf + at;
    argv[argc] = NULL;

    train_options o, again;
    char *msg = NULL, *msg2 = NULL;
    size_t len = 0, len2 = 0;
    int rc = parse(argc, argv, &o, &msg, &len);
    FUZZ_CHECK(rc == 0 || rc == EXIT_USAGE || rc == TRAIN_OPTIONS_HELP ||
                   rc == TRAIN_OPTIONS_VERSION,
               "train_parse_options returned %d", rc);
    if (rc == EXIT_USAGE) {
        static const char tail[] = " (see --help)\n";
        FUZZ_CHECK(len > strlen("chorus-train: ") + strlen(tail) &&
                       strncmp(msg, "chorus-train: ", 14) == 0 &&
                       strcmp(msg + len - strlen(tail), tail) == 0,
                   "the usage message is \"%s\"", msg);
    } else {
        FUZZ_CHECK(len == 0, "it printed \"%s\" and returned %d", msg, rc);
    }
    if (rc == 0)
        check_options(&o);
    /* Once more: getopt starts over, the same result. */
    int rc2 = parse(argc, argv, &again, &msg2, &len2);
    FUZZ_CHECK(rc2 == rc && len2 == len && memcmp(msg, msg2, len) == 0,
               "parsed again: %d \"%s\", first %d \"%s\"", rc2, msg2, rc, msg);
    /* Silent when it is not rank 0's to say. */
    FUZZ_CHECK(train_parse_options(argc, argv, &again, NULL) == rc, "without err");
    free(msg);
    free(msg2);
    free(buf);
    return 0;
}
