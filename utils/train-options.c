/* chorus-train's command line (utils/train-options.h). */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train-options.h"

void train_usage(FILE *f)
{
    fprintf(f,
            "usage: chorus-train [options]\n"
            "  --data PATH         images: a folder of IDX files (default\n"
            "                      " DEFAULT_DATA ");\n"
            "                      gpt: a text file, a folder of texts, or a folder of\n"
            "                      llm.c token shards (*_train*.bin, *_val*.bin)\n"
            "  --model NAME        mlp, cnn (default), resnet or gpt\n"
            "  --depth N           resnet: 6n+2 layers (default %d)\n"
            "  --batchnorm sync|local  under data parallelism, BatchNorm's batch statistics\n"
            "                      over the whole batch (sync, default) or per replica\n"
            "  --layers N --heads N --dim N --context N --vocab N --dropout P\n"
            "                      gpt: its shape (default 4, 4, 128, 64, the data's\n"
            "                      vocabulary, 0); context = tokens a sample sees\n"
            "  --eval-every N      gpt: validation loss every N steps (default: each epoch)\n"
            "  --generate N        gpt: print N tokens sampled from the model after training\n"
            "  --temperature X     sampling temperature (default 1)\n"
            "  --top-k K           sample among the K likeliest tokens (default 40; 0: all)\n"
            "  --prompt TEXT       what the sample continues (default a newline)\n"
            "  --devices LIST      devices to train on, \"all\" (default); with several,\n"
            "                      data parallel: one replica each, the batch split; a\n"
            "                      device listed twice (host,host) holds two replicas.\n"
            "                      Under mpirun, LIST;LIST;... gives each process on a\n"
            "                      machine its own (by local rank, in turn)\n"
            "  --split auto|equal|W1,W2,...  shares of the batch per device: auto\n"
            "                      (default) balances them from measured step times\n"
            "  --reduce auto|host|peer  gradient reduction: host (pinned memory, fixed\n"
            "                      order), peer (device to device inside one backend) or\n"
            "                      auto (default: peer inside groups, host across them)\n"
            "  --bucket-mb N|auto  reduce gradients in buckets of N MiB (default 25);\n"
            "                      auto measures 1, 4, 16 and 64 over the first steps\n"
            "                      and keeps the one whose reduction is least exposed\n"
            "  --accumulate K      one optimizer step every K batches (default 1)\n"
            "  --epochs N          epochs (default 5)\n"
            "  --max-steps N       stop after N optimizer steps in all (default: no limit)\n"
            "  --limit N           train on the first N samples only (quick runs)\n"
            "  --normalize MEAN,STD  inputs become (pixel / 255 - MEAN) / STD; default: the\n"
            "                      checkpoint's with --resume, else the mean and std of the\n"
            "                      training images (Fashion-MNIST: 0.2860,0.3530)\n"
            "  --batch N           batch size (default 64)\n"
            "  --augment LIST      random augmentation of the training images: none,\n"
            "                      flip (mirror left-right half the time), crop[:N]\n"
            "                      (shift by up to N pixels, default 2, zeros in),\n"
            "                      or flip,crop[:N]; default none\n"
            "  --lr X              learning rate (default 0.001; resnet 0.003; sgd 0.05)\n"
            "  --optimizer NAME    sgd, adam (default) or adamw (the resnet's default)\n"
            "  --weight-decay X    weight decay (default 0; adamw 0.01, the resnet's\n"
            "                      adamw 0.05), decoupled for adamw, added to the\n"
            "                      gradient for sgd and adam\n"
            "  --schedule NAME     learning rate: cosine (default, decays to 0 over the\n"
            "                      epochs), step (x0.1 every 2 epochs) or constant\n"
            "  --seed N            seed of the initialisation and the shuffle (default 1)\n"
            "  --checkpoint FILE   save a checkpoint (safetensors) after every epoch\n"
            "  --checkpoint-every N  with --checkpoint: save it after every N optimizer\n"
            "                      steps too (mid-epoch; --resume goes on from there)\n"
            "  --save-dtype f32|bf16|f16  the checkpoint's tensors (default f32; bf16\n"
            "                      or f16: half the size, a resumed run goes on from the\n"
            "                      values rounded to it)\n"
            "  --precision f32|bf16|fp16  mixed precision (default f32): the layers'\n"
            "                      GEMMs and convolutions on inputs rounded to bf16 or\n"
            "                      fp16, f32 sums, f32 master weights; fp16 scales the\n"
            "                      loss dynamically (kept in checkpoints)\n"
            "  --reduce-dtype f32|bf16  the gradients' reduction through the host in bf16\n"
            "                      (half the bytes moved, f32 sums; default f32)\n"
            "  --device-memory DEV=SIZE,...  hold each named device of --devices to SIZE\n"
            "                      bytes (K, M, G, T: binary; host=6G,opencl:0=1G): an\n"
            "                      allocation beyond it fails, as on a smaller device\n"
            "  --shard-optimizer   each replica keeps the optimizer state of its own part\n"
            "                      of the parameters (ZeRO stage 1), parts sized by the\n"
            "                      devices' memory limits\n"
            "  --recompute         each GPT block and ResNet stage keeps only its input in\n"
            "                      forward and runs its forward again in backward\n"
            "  --tf32              CUDA's f32 GEMMs may round their inputs to TF32 on\n"
            "                      tensor cores (ch_math_set(CH_MATH_TF32), PyTorch's\n"
            "                      allow_tf32; default off); other devices unchanged\n"
            "  --elastic           a device that fails (or stops answering) while training\n"
            "                      is dropped and the step made again over the others;\n"
            "                      lost devices that answer again rejoin at the next\n"
            "                      epoch. One process, without --shard-optimizer and\n"
            "                      with --accumulate 1\n"
            "  --elastic-timeout SECONDS  with --elastic: a call that runs this long on\n"
            "                      a device that then does not answer loses it (default\n"
            "                      60)\n"
            "  --resume FILE       continue from a checkpoint\n"
            "  --log FILE          one JSON line per step, with its breakdown\n"
            "  --trace FILE        write a timeline (Chrome trace-event JSON: Perfetto,\n"
            "                      chrome://tracing) of every device, bucket and link;\n"
            "                      under mpirun each rank writes FILE.rankK.json\n"
            "  --json              print the result as one JSON object\n"
            "  --quiet             no progress output\n"
            "  --help, --version\n"
            "SIGINT or SIGTERM stops training after the current step, writes the\n"
            "checkpoint (with --checkpoint) and exits 130 or 143; a second one ends\n"
            "the process at once. Exit status: 0, 1 for a failure while training,\n"
            "2 for bad options or data.\n",
            CH_RESNET_DEPTH);
}

static int fail_usage(FILE *err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static int fail_usage(FILE *err, const char *fmt, ...)
{
    if (!err)
        return EXIT_USAGE; /* every rank parses the same line: rank 0 says it */
    va_list ap;
    fprintf(err, "chorus-train: ");
    va_start(ap, fmt);
    vfprintf(err, fmt, ap);
    va_end(ap);
    fprintf(err, " (see --help)\n");
    return EXIT_USAGE;
}

int train_parse_int(const char *s, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo)
        return 0;
    *out = v;
    return 1;
}

int train_parse_size(const char *s, uint64_t *out)
{
    static const char suffixes[] = "KMGT";
    /* Digits and a point alone: strtod would also take a sign, spaces,
     * exponents, "inf" and hexadecimal. */
    size_t number = strspn(s, "0123456789.");
    if (number == 0 || *s == '.')
        return 0;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end != s + number)
        return 0;
    if (*end) {
        const char *unit = strchr(suffixes, toupper((unsigned char)*end));
        if (!unit || end[1])
            return 0;
        v = ldexp(v, 10 * (int)(unit - suffixes + 1));
    }
    /* 2^64 itself does not fit; a fraction of a byte rounds down. */
    if (!(v >= 1.0) || v >= 18446744073709551616.0)
        return 0;
    *out = (uint64_t)v;
    return 1;
}

/* "host=6G,opencl:0=1G" into o->limits, each device once; 0 and a message
 * in `why` for the first entry that is wrong. */
static int parse_limits(const char *s, train_options *o, char *why, size_t cap)
{
    o->nlimits = 0;
    while (*s) {
        size_t n = strcspn(s, ","), name = strcspn(s, "=");
        char size[64];
        if (name >= n || name == 0 || name >= TRAIN_DEVICE_NAME || n - name - 1 >= sizeof size) {
            snprintf(why, cap, "\"%.*s\" is not DEVICE=SIZE", (int)(n < 80 ? n : 80), s);
            return 0;
        }
        memcpy(size, s + name + 1, n - name - 1);
        size[n - name - 1] = '\0';
        train_memory_limit l = {{0}, 0};
        memcpy(l.device, s, name);
        if (!train_parse_size(size, &l.bytes)) {
            snprintf(why, cap, "%s=%s: the size is a number of bytes with K, M, G or T, >= 1",
                     l.device, size);
            return 0;
        }
        for (int i = 0; i < o->nlimits; i++)
            if (strcmp(o->limits[i].device, l.device) == 0) {
                snprintf(why, cap, "%s is named twice", l.device);
                return 0;
            }
        if (o->nlimits == TRAIN_MAX_LIMITS) {
            snprintf(why, cap, "more than %d devices", TRAIN_MAX_LIMITS);
            return 0;
        }
        o->limits[o->nlimits++] = l;
        s += n;
        if (*s == ',' && !*++s) {
            snprintf(why, cap, "a comma ends the list");
            return 0;
        }
    }
    if (o->nlimits == 0)
        snprintf(why, cap, "the list is empty");
    return o->nlimits > 0;
}

/* A float format's name among the space-separated `accepted` ones ("fp16"
 * and "f16" both name f16): 1 and *out, or 0. */
static int parse_dtype(const char *s, const char *accepted, ch_dtype *out)
{
    static const struct {
        const char *name;
        ch_dtype dtype;
    } names[] = {{"f32", CH_F32}, {"bf16", CH_BF16}, {"f16", CH_F16}, {"fp16", CH_F16}};
    size_t len = strlen(s);
    for (const char *a = accepted; *a;) {
        size_t n = strcspn(a, " ");
        if (n == len && strncmp(a, s, n) == 0)
            for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
                if (strcmp(names[i].name, s) == 0) {
                    *out = names[i].dtype;
                    return 1;
                }
        a += n;
        a += *a == ' ';
    }
    return 0;
}

static int parse_float(const char *s, float *out)
{
    char *end;
    float v = strtof(s, &end);
    if (end == s || *end || !isfinite(v))
        return 0;
    *out = v;
    return 1;
}

/* The long name of option value `c`. */
static const char *longs_name(const struct option *longs, int c)
{
    for (; longs->name; longs++)
        if (longs->val == c)
            return longs->name;
    return "?";
}

/* "1,2,5" into o->weights. */
static int parse_weights(train_options *o)
{
    const char *p = o->split;
    o->nweights = 0;
    while (*p && o->nweights < 64) {
        char *end;
        float w = strtof(p, &end);
        if (end == p || !(w > 0.0f) || !isfinite(w) || (*end && *end != ','))
            return 0;
        o->weights[o->nweights++] = w;
        p = *end ? end + 1 : end;
    }
    return o->nweights > 0 && !*p;
}

/* "0.5,0.25": a finite mean and a std > 0. */
static int parse_norm(const char *s, ch_idx_options *out)
{
    char *end, *end2;
    float mean = strtof(s, &end);
    if (end == s || *end != ',' || !isfinite(mean))
        return 0;
    float std = strtof(end + 1, &end2);
    if (end2 == end + 1 || *end2 || !isfinite(std) || !(std > 0.0f))
        return 0;
    *out = (ch_idx_options){mean, std};
    return 1;
}

/* none | flip | crop[:N] | flip,crop[:N] (either order). */
static int parse_augment(const char *s, train_options *o)
{
    o->aug = 0;
    o->crop_pad = 0;
    if (strcmp(s, "none") == 0)
        return 1;
    while (*s) {
        size_t n = strcspn(s, ",");
        if (n == 4 && strncmp(s, "flip", 4) == 0 && !(o->aug & CH_AUGMENT_FLIP)) {
            o->aug |= CH_AUGMENT_FLIP;
        } else if (n >= 4 && strncmp(s, "crop", 4) == 0 && !(o->aug & CH_AUGMENT_CROP)) {
            o->aug |= CH_AUGMENT_CROP;
            o->crop_pad = 2;
            if (n > 4) {
                char num[16];
                int64_t v;
                if (s[4] != ':' || n - 5 >= sizeof num)
                    return 0;
                memcpy(num, s + 5, n - 5);
                num[n - 5] = 0;
                if (!train_parse_int(num, 1, &v) || v > 1024)
                    return 0;
                o->crop_pad = (int)v;
            }
        } else {
            return 0;
        }
        s += n;
        if (*s == ',' && !*++s)
            return 0;
    }
    return o->aug != 0;
}

int train_parse_options(int argc, char **argv, train_options *o, FILE *err)
{
    static const struct option longs[] = {{"data", required_argument, 0, 'd'},
                                          {"model", required_argument, 0, 'm'},
                                          {"devices", required_argument, 0, 'D'},
                                          {"epochs", required_argument, 0, 'e'},
                                          {"max-steps", required_argument, 0, 'S'},
                                          {"batch", required_argument, 0, 'b'},
                                          {"limit", required_argument, 0, 'N'},
                                          {"schedule", required_argument, 0, 'C'},
                                          {"split", required_argument, 0, 'P'},
                                          {"reduce", required_argument, 0, 'R'},
                                          {"lr", required_argument, 0, 'l'},
                                          {"optimizer", required_argument, 0, 'o'},
                                          {"seed", required_argument, 0, 's'},
                                          {"checkpoint", required_argument, 0, 'c'},
                                          {"resume", required_argument, 0, 'r'},
                                          {"log", required_argument, 0, 'L'},
                                          {"json", no_argument, 0, 'j'},
                                          {"quiet", no_argument, 0, 'q'},
                                          {"bucket-mb", required_argument, 0, 'B'},
                                          {"accumulate", required_argument, 0, 'A'},
                                          {"normalize", required_argument, 0, 'Z'},
                                          {"depth", required_argument, 0, 1000},
                                          {"batchnorm", required_argument, 0, 1001},
                                          {"layers", required_argument, 0, 1002},
                                          {"heads", required_argument, 0, 1003},
                                          {"dim", required_argument, 0, 1004},
                                          {"context", required_argument, 0, 1005},
                                          {"vocab", required_argument, 0, 1006},
                                          {"dropout", required_argument, 0, 1007},
                                          {"generate", required_argument, 0, 1008},
                                          {"temperature", required_argument, 0, 1009},
                                          {"top-k", required_argument, 0, 1010},
                                          {"prompt", required_argument, 0, 1011},
                                          {"eval-every", required_argument, 0, 1012},
                                          {"augment", required_argument, 0, 1013},
                                          {"weight-decay", required_argument, 0, 1014},
                                          {"save-dtype", required_argument, 0, 1015},
                                          {"precision", required_argument, 0, 1016},
                                          {"reduce-dtype", required_argument, 0, 1017},
                                          {"trace", required_argument, 0, 1018},
                                          {"device-memory", required_argument, 0, 1019},
                                          {"shard-optimizer", no_argument, 0, 1020},
                                          {"recompute", no_argument, 0, 1021},
                                          {"checkpoint-every", required_argument, 0, 1022},
                                          {"elastic", no_argument, 0, 1023},
                                          {"elastic-timeout", required_argument, 0, 1024},
                                          {"tf32", no_argument, 0, 1025},
                                          {"help", no_argument, 0, 'h'},
                                          {"version", no_argument, 0, 'V'},
                                          {0, 0, 0, 0}};
    *o = (train_options){.model = "cnn",
                         .devices = "all",
                         .schedule = "cosine",
                         .split = "auto",
                         .reduce = "auto",
                         .batchnorm = "sync",
                         .prompt = "\n",
                         .epochs = 5,
                         .max_steps = -1,
                         .bucket_mb = 25,
                         .accumulate = 1,
                         .batch = 64,
                         .lr = -1.0f,
                         .seed = 1,
                         .depth = CH_RESNET_DEPTH,
                         .gpt = ch_gpt_defaults(),
                         .top_k = 40,
                         .temperature = 1.0f,
                         .weight_decay = -1.0f,
                         .save_dtype = CH_F32,
                         .precision = CH_F32,
                         .reduce_dtype = CH_F32};
    o->gpt.vocab = 0;
    opterr = 0;
    optind = 0; /* glibc: start over, as for a new argv */
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "", longs, NULL)) != -1) {
        switch (c) {
        case 'd': o->data = optarg; break;
        case 'm': o->model = optarg; break;
        case 'D': o->devices = optarg; break;
        case 'o': o->optimizer = optarg; break;
        case 'c': o->checkpoint = optarg; break;
        case 'r': o->resume = optarg; break;
        case 'L': o->log = optarg; break;
        case 1018: o->trace = optarg; break;
        case 'C': o->schedule = optarg; break;
        case 'P': o->split = optarg; break;
        case 'R': o->reduce = optarg; break;
        case 'j': o->json = 1; break;
        case 'q': o->quiet = 1; break;
        case 'e':
            if (!train_parse_int(optarg, 1, &o->epochs))
                return fail_usage(err, "--epochs wants a whole number >= 1, not \"%s\"", optarg);
            break;
        case 'S':
            if (!train_parse_int(optarg, 1, &o->max_steps))
                return fail_usage(err, "--max-steps wants a whole number >= 1, not \"%s\"", optarg);
            break;
        case 'B':
            if (strcmp(optarg, "auto") == 0)
                o->bucket_mb = -1;
            else if (!train_parse_int(optarg, 1, &o->bucket_mb) || o->bucket_mb > 1 << 20)
                return fail_usage(err,
                                  "--bucket-mb wants auto or a whole number from 1 to "
                                  "1048576, not \"%s\"",
                                  optarg);
            break;
        case 'A':
            if (!train_parse_int(optarg, 1, &o->accumulate) || o->accumulate > 1 << 20)
                return fail_usage(err, "--accumulate wants a whole number from 1 to 1048576, not "
                                  "\"%s\"", optarg);
            break;
        case 'Z':
            if (!parse_norm(optarg, &o->norm))
                return fail_usage(err, "--normalize wants MEAN,STD, two numbers with STD > 0, not "
                                  "\"%s\"", optarg);
            break;
        case 'N':
            if (!train_parse_int(optarg, 1, &o->limit))
                return fail_usage(err, "--limit wants a whole number >= 1, not \"%s\"", optarg);
            break;
        case 'b':
            if (!train_parse_int(optarg, 1, &v) || v > 1 << 20)
                return fail_usage(err, "--batch wants a whole number from 1 to 1048576, not \"%s\"",
                                  optarg);
            o->batch = (int)v;
            break;
        case 's':
            if (!train_parse_int(optarg, 0, &v))
                return fail_usage(err, "--seed wants a whole number >= 0, not \"%s\"", optarg);
            o->seed = (uint64_t)v;
            break;
        case 'l': {
            char *end;
            o->lr = strtof(optarg, &end);
            if (end == optarg || *end || !(o->lr > 0.0f) || !isfinite(o->lr))
                return fail_usage(err, "--lr wants a number > 0, not \"%s\"", optarg);
            break;
        }
        case 1000:
            if (!train_parse_int(optarg, 8, &o->depth) || (o->depth - 2) % 6 || o->depth > 10000)
                return fail_usage(err, "--depth wants 6n + 2 (8, 14, 20, ...), not \"%s\"", optarg);
            break;
        case 1001: o->batchnorm = optarg; break;
        case 1002: case 1003: case 1004: case 1005: case 1006:
            if (!train_parse_int(optarg, 1, &v) || v > 1 << 24)
                return fail_usage(err, "--%s wants a whole number from 1 to 16777216, not \"%s\"",
                                  longs_name(longs, c), optarg);
            if (c == 1002)
                o->gpt.layers = (int)v;
            else if (c == 1003)
                o->gpt.heads = (int)v;
            else if (c == 1004)
                o->gpt.dim = v;
            else if (c == 1005)
                o->gpt.context = v;
            else
                o->gpt.vocab = v;
            break;
        case 1007:
            if (!parse_float(optarg, &o->gpt.dropout) || o->gpt.dropout < 0.0f ||
                o->gpt.dropout >= 1.0f)
                return fail_usage(err, "--dropout wants a number in [0, 1), not \"%s\"", optarg);
            break;
        case 1008:
            if (!train_parse_int(optarg, 0, &o->generate) || o->generate > 1 << 20)
                return fail_usage(err, "--generate wants a whole number from 0 to 1048576, not "
                                  "\"%s\"", optarg);
            break;
        case 1009:
            if (!parse_float(optarg, &o->temperature) || !(o->temperature > 0.0f))
                return fail_usage(err, "--temperature wants a number > 0, not \"%s\"", optarg);
            break;
        case 1010:
            if (!train_parse_int(optarg, 0, &o->top_k))
                return fail_usage(err, "--top-k wants a whole number >= 0, not \"%s\"", optarg);
            break;
        case 1011: o->prompt = optarg; break;
        case 1012:
            if (!train_parse_int(optarg, 1, &o->eval_every))
                return fail_usage(err, "--eval-every wants a whole number >= 1, not \"%s\"",
                                  optarg);
            break;
        case 1013:
            if (!parse_augment(optarg, o))
                return fail_usage(err, "--augment is none, flip, crop[:N] or flip,crop[:N] with N "
                                  "from 1 to 1024, not \"%s\"", optarg);
            break;
        case 1014:
            if (!parse_float(optarg, &o->weight_decay) || !(o->weight_decay >= 0.0f))
                return fail_usage(err, "--weight-decay wants a number >= 0, not \"%s\"", optarg);
            break;
        case 1015:
            if (!parse_dtype(optarg, "f32 bf16 f16", &o->save_dtype))
                return fail_usage(err, "--save-dtype is f32, bf16 or f16, not \"%s\"", optarg);
            break;
        case 1016:
            if (!parse_dtype(optarg, "f32 bf16 fp16 f16", &o->precision))
                return fail_usage(err, "--precision is f32, bf16 or fp16, not \"%s\"", optarg);
            break;
        case 1017:
            if (!parse_dtype(optarg, "f32 bf16", &o->reduce_dtype))
                return fail_usage(err, "--reduce-dtype is f32 or bf16, not \"%s\"", optarg);
            break;
        case 1019: {
            char why[160];
            if (!parse_limits(optarg, o, why, sizeof why))
                return fail_usage(err,
                                  "--device-memory wants DEVICE=SIZE,... (host=6G,"
                                  "opencl:0=1G): %s",
                                  why);
            break;
        }
        case 1020: o->shard_optimizer = 1; break;
        case 1021: o->recompute = 1; break;
        case 1025: o->tf32 = 1; break;
        case 1022:
            if (!train_parse_int(optarg, 1, &o->checkpoint_every))
                return fail_usage(err, "--checkpoint-every wants a whole number >= 1, not \"%s\"",
                                  optarg);
            break;
        case 1023: o->elastic = 1; break;
        case 1024: {
            char *end;
            errno = 0;
            o->elastic_timeout = strtod(optarg, &end);
            if (errno || end == optarg || *end || !(o->elastic_timeout > 0.0) ||
                !isfinite(o->elastic_timeout))
                return fail_usage(err,
                                  "--elastic-timeout wants a number of seconds > 0, not "
                                  "\"%s\"",
                                  optarg);
            break;
        }
        case 'h': return TRAIN_OPTIONS_HELP;
        case 'V': return TRAIN_OPTIONS_VERSION;
        default:
            return fail_usage(err, "unknown option or missing value: %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail_usage(err, "unexpected argument \"%s\"", argv[optind]);
    if (strcmp(o->model, "mlp") != 0 && strcmp(o->model, "cnn") != 0 &&
        strcmp(o->model, "resnet") != 0 && strcmp(o->model, "gpt") != 0)
        return fail_usage(err, "--model is mlp, cnn, resnet or gpt, not \"%s\"", o->model);
    o->lm = strcmp(o->model, "gpt") == 0;
    if (o->lm && !o->data)
        return fail_usage(err, "--model gpt needs --data: a text file, a folder of texts, or a "
                          "folder of llm.c token shards");
    if (o->checkpoint_every > 0 && !o->checkpoint)
        return fail_usage(err, "--checkpoint-every needs --checkpoint FILE to write to");
    if (o->elastic_timeout > 0.0 && !o->elastic)
        return fail_usage(err, "--elastic-timeout needs --elastic");
    /* ch_dp_new's reasons (include/chorus/dp.h); more than one process is
     * chorus-train's to refuse (main), once it knows. */
    if (o->elastic && o->shard_optimizer)
        return fail_usage(err, "--elastic needs every replica to hold the whole optimizer "
                               "state (a lost replica's part of a sharded state is lost with "
                               "it): leave out --shard-optimizer");
    if (o->elastic && o->accumulate > 1)
        return fail_usage(err,
                          "--elastic with --accumulate %lld: a lost device would lose "
                          "the batches accumulated before it; use --accumulate 1",
                          (long long)o->accumulate);
    if (!o->data)
        o->data = DEFAULT_DATA;
    if (o->gpt.dim % o->gpt.heads != 0)
        return fail_usage(err, "--heads %d does not divide --dim %lld", o->gpt.heads,
                          (long long)o->gpt.dim);
    if (strcmp(o->batchnorm, "sync") != 0 && strcmp(o->batchnorm, "local") != 0)
        return fail_usage(err, "--batchnorm is sync or local, not \"%s\"", o->batchnorm);
    if (o->lm && o->aug)
        return fail_usage(err, "--augment is for image models, not --model gpt");
    if (!o->lm && (o->generate || o->eval_every))
        return fail_usage(err, "--%s is for --model gpt", o->generate ? "generate" : "eval-every");
    /* The resnet trains with AdamW and a weight decay of 0.05: in 5 epochs
     * on Fashion-MNIST it reaches 0.93 over three devices as on the host,
     * where Adam alone fell short over three (docs/PERFORMANCE_LOG.md,
     * "2026-12-01: ResNet and GPT against PyTorch"). */
    int resnet = strcmp(o->model, "resnet") == 0;
    if (!o->optimizer)
        o->optimizer = resnet ? "adamw" : "adam";
    if (o->weight_decay < 0.0f && resnet && strcmp(o->optimizer, "adamw") == 0)
        o->weight_decay = 0.05f;
    if (strcmp(o->optimizer, "sgd") && strcmp(o->optimizer, "adam") && strcmp(o->optimizer, "adamw"))
        return fail_usage(err, "--optimizer is sgd, adam or adamw, not \"%s\"", o->optimizer);
    if (strcmp(o->schedule, "cosine") && strcmp(o->schedule, "step") &&
        strcmp(o->schedule, "constant"))
        return fail_usage(err, "--schedule is cosine, step or constant, not \"%s\"", o->schedule);
    ch_reduce_mode mode;
    if (ch_reduce_mode_parse(&mode, o->reduce) != CH_OK)
        return fail_usage(err, "--reduce is auto, host or peer, not \"%s\"", o->reduce);
    if (strcmp(o->split, "equal") != 0 && strcmp(o->split, "auto") != 0 && !parse_weights(o))
        return fail_usage(err, "--split is auto, equal or positive weights W1,W2,..., not \"%s\"",
                          o->split);
    /* The resnet's BatchNorm takes a larger step: 3e-3 trains it further
     * in 5 epochs than 1e-3 (docs/PERFORMANCE_LOG.md, the same entry). */
    if (o->lr < 0)
        o->lr = strcmp(o->optimizer, "sgd") == 0 ? 0.05f
                : resnet                         ? 0.003f
                                                  : 0.001f;
    return 0;
}
