/* chorus-train's command line: the options, their defaults and checks.
 * A part of chorus-train of its own (utils/train-options.c) so that
 * tests/fuzz/fuzz-train-options.c drives the same parser: it never exits
 * and can be called again. */
#ifndef CHORUS_TRAIN_OPTIONS_H
#define CHORUS_TRAIN_OPTIONS_H

#include <chorus.h>
#include <stdint.h>
#include <stdio.h>

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
#define EXIT_USAGE 2
#define EXIT_RUNTIME 1

/* What train_parse_options returns besides 0 and EXIT_USAGE: --help or
 * --version was given (main prints and exits 0). */
#define TRAIN_OPTIONS_HELP (-1)
#define TRAIN_OPTIONS_VERSION (-2)

/* --device-memory's entries at most, and a device name's length. */
#define TRAIN_MAX_LIMITS 64
#define TRAIN_DEVICE_NAME 32

/* One entry of --device-memory: a device's name as written (that it is a
 * device, and one of --devices, is chorus-train's to check after
 * ch_init) and its limit, > 0. */
typedef struct train_memory_limit {
    char device[TRAIN_DEVICE_NAME];
    uint64_t bytes;
} train_memory_limit;

typedef struct train_options {
    const char *data, *model, *devices, *optimizer, *checkpoint, *resume, *log, *schedule;
    const char *split, *reduce, *batchnorm, *prompt;
    const char *trace;       /* --trace FILE, NULL: none */
    float weights[64];       /* --split W1,W2,...; nweights 0: equal or auto */
    int nweights;
    ch_idx_options norm;     /* --normalize MEAN,STD; std 0: not given */
    int64_t epochs, max_steps, limit, accumulate;
    int64_t bucket_mb; /* -1: auto */
    int batch, json, quiet;
    float lr;
    uint64_t seed;
    int64_t depth;           /* resnet */
    ch_gpt_config gpt;       /* gpt; vocab 0: the data's */
    int64_t generate, top_k, eval_every;
    float temperature;
    int lm;                  /* a language model (gpt) */
    unsigned aug;            /* CH_AUGMENT_* */
    int crop_pad;
    float weight_decay;      /* < 0: the optimizer's default */
    ch_dtype save_dtype;     /* --save-dtype: the checkpoints' tensors */
    ch_dtype precision;      /* --precision: mixed precision's half format, or f32 */
    ch_dtype reduce_dtype;   /* --reduce-dtype: the gradients' host-staged reduction */
    train_memory_limit limits[TRAIN_MAX_LIMITS]; /* --device-memory, each device once */
    int nlimits;
    int shard_optimizer; /* --shard-optimizer (ch_dp_options.shard_optimizer) */
    int recompute;       /* --recompute (ch_dp_options.recompute) */
    int tf32;            /* --tf32 (ch_math_set(CH_MATH_TF32)) */
    int64_t checkpoint_every; /* --checkpoint-every N: also after every N steps; 0: not */
    int elastic;              /* --elastic (ch_dp_options.elastic) */
    double elastic_timeout;   /* --elastic-timeout SECONDS, > 0; 0: not given (60) */
} train_options;

/* The help text. */
void train_usage(FILE *f);

/* Parses argv into *o (its defaults first): 0, EXIT_USAGE after writing
 * "chorus-train: ... (see --help)" to `err` (nothing when err is NULL:
 * under mpirun the ranks other than 0 stay quiet), or TRAIN_OPTIONS_HELP
 * or TRAIN_OPTIONS_VERSION at the first --help or --version. The strings
 * of *o point into argv. Resets getopt, so it may be called again. */
int train_parse_options(int argc, char **argv, train_options *o, FILE *err);

/* A whole number >= lo: 1 and *out, or 0. */
int train_parse_int(const char *s, int64_t lo, int64_t *out);

/* A size in bytes: a number (a fraction allowed) with an optional K, M,
 * G or T suffix (binary: 1K is 1024), at least 1 byte and below 2^64:
 * 1 and *out, or 0. */
int train_parse_size(const char *s, uint64_t *out);

#endif
