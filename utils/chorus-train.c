/* chorus-train: train an MLP or a CNN on Fashion-MNIST (or MNIST). */
#include "config.h"

#include <chorus.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
#define EXIT_USAGE 2
#define EXIT_RUNTIME 1

typedef struct options {
    const char *data, *model, *devices, *optimizer, *checkpoint, *resume, *log, *schedule;
    const char *split, *reduce;
    float weights[64];       /* --split W1,W2,...; nweights 0: equal or auto */
    int nweights;
    ch_idx_options norm;     /* --normalize MEAN,STD; std 0: not given */
    int64_t epochs, max_steps, limit, bucket_mb, accumulate;
    int batch, json, quiet;
    float lr;
    uint64_t seed;
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: chorus-train [options]\n"
            "  --data DIR          IDX files (default " DEFAULT_DATA ")\n"
            "  --model mlp|cnn     the network (default cnn)\n"
            "  --devices LIST      devices to train on, \"all\" (default); with several,\n"
            "                      data parallel: one replica each, the batch split; a\n"
            "                      device listed twice (host,host) holds two replicas\n"
            "  --split auto|equal|W1,W2,...  shares of the batch per device: auto\n"
            "                      (default) balances them from measured step times\n"
            "  --reduce auto|host|peer  gradient reduction: host (pinned memory, fixed\n"
            "                      order), peer (device to device inside one backend) or\n"
            "                      auto (default: peer inside groups, host across them)\n"
            "  --bucket-mb N       reduce gradients in buckets of N MiB (default 25)\n"
            "  --accumulate K      one optimizer step every K batches (default 1)\n"
            "  --epochs N          epochs (default 5)\n"
            "  --max-steps N       stop after N optimizer steps in all (default: no limit)\n"
            "  --limit N           train on the first N samples only (quick runs)\n"
            "  --normalize MEAN,STD  inputs become (pixel / 255 - MEAN) / STD; default: the\n"
            "                      checkpoint's with --resume, else the mean and std of the\n"
            "                      training images (Fashion-MNIST: 0.2860,0.3530)\n"
            "  --batch N           batch size (default 64)\n"
            "  --lr X              learning rate (default 0.001; sgd 0.05)\n"
            "  --optimizer NAME    sgd, adam (default) or adamw\n"
            "  --schedule NAME     learning rate: cosine (default, decays to 0 over the\n"
            "                      epochs), step (x0.1 every 2 epochs) or constant\n"
            "  --seed N            seed of the initialisation and the shuffle (default 1)\n"
            "  --checkpoint FILE   save a checkpoint (safetensors) after every epoch\n"
            "  --resume FILE       continue from a checkpoint\n"
            "  --log FILE          one JSON line per step\n"
            "  --json              print the result as one JSON object\n"
            "  --quiet             no progress output\n"
            "  --help, --version\n");
}

static int fail_usage(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "chorus-train: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see --help)\n");
    return EXIT_USAGE;
}

static int parse_int(const char *s, int64_t lo, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo)
        return 0;
    *out = v;
    return 1;
}

/* "1,2,5" into o->weights. */
static int parse_weights(options *o)
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

static int parse_options(int argc, char **argv, options *o)
{
    static const struct option longs[] = {
        {"data", required_argument, 0, 'd'},    {"model", required_argument, 0, 'm'},
        {"devices", required_argument, 0, 'D'}, {"epochs", required_argument, 0, 'e'},
        {"max-steps", required_argument, 0, 'S'}, {"batch", required_argument, 0, 'b'},
        {"limit", required_argument, 0, 'N'},   {"schedule", required_argument, 0, 'C'},
        {"split", required_argument, 0, 'P'},   {"reduce", required_argument, 0, 'R'},
        {"lr", required_argument, 0, 'l'},      {"optimizer", required_argument, 0, 'o'},
        {"seed", required_argument, 0, 's'},    {"checkpoint", required_argument, 0, 'c'},
        {"resume", required_argument, 0, 'r'},  {"log", required_argument, 0, 'L'},
        {"json", no_argument, 0, 'j'},          {"quiet", no_argument, 0, 'q'},
        {"bucket-mb", required_argument, 0, 'B'}, {"accumulate", required_argument, 0, 'A'},
        {"normalize", required_argument, 0, 'Z'},
        {"help", no_argument, 0, 'h'},          {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0}};
    *o = (options){DEFAULT_DATA, "cnn", "all", "adam", NULL, NULL, NULL, "cosine", "auto", "auto",
                   {0}, 0, {0.0f, 0.0f}, 5, -1, 0, 25, 1, 64, 0, 0, -1, 1};
    opterr = 0;
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
        case 'C': o->schedule = optarg; break;
        case 'P': o->split = optarg; break;
        case 'R': o->reduce = optarg; break;
        case 'j': o->json = 1; break;
        case 'q': o->quiet = 1; break;
        case 'e':
            if (!parse_int(optarg, 1, &o->epochs))
                return fail_usage("--epochs wants a whole number >= 1, not \"%s\"", optarg);
            break;
        case 'S':
            if (!parse_int(optarg, 1, &o->max_steps))
                return fail_usage("--max-steps wants a whole number >= 1, not \"%s\"", optarg);
            break;
        case 'B':
            if (!parse_int(optarg, 1, &o->bucket_mb) || o->bucket_mb > 1 << 20)
                return fail_usage("--bucket-mb wants a whole number from 1 to 1048576, not "
                                  "\"%s\"", optarg);
            break;
        case 'A':
            if (!parse_int(optarg, 1, &o->accumulate) || o->accumulate > 1 << 20)
                return fail_usage("--accumulate wants a whole number from 1 to 1048576, not "
                                  "\"%s\"", optarg);
            break;
        case 'Z':
            if (!parse_norm(optarg, &o->norm))
                return fail_usage("--normalize wants MEAN,STD, two numbers with STD > 0, not "
                                  "\"%s\"", optarg);
            break;
        case 'N':
            if (!parse_int(optarg, 1, &o->limit))
                return fail_usage("--limit wants a whole number >= 1, not \"%s\"", optarg);
            break;
        case 'b':
            if (!parse_int(optarg, 1, &v) || v > 1 << 20)
                return fail_usage("--batch wants a whole number from 1 to 1048576, not \"%s\"",
                                  optarg);
            o->batch = (int)v;
            break;
        case 's':
            if (!parse_int(optarg, 0, &v))
                return fail_usage("--seed wants a whole number >= 0, not \"%s\"", optarg);
            o->seed = (uint64_t)v;
            break;
        case 'l': {
            char *end;
            o->lr = strtof(optarg, &end);
            if (end == optarg || *end || !(o->lr > 0.0f) || !isfinite(o->lr))
                return fail_usage("--lr wants a number > 0, not \"%s\"", optarg);
            break;
        }
        case 'h': usage(stdout); exit(0);
        case 'V': printf("chorus-train %s\n", ch_version()); exit(0);
        default:
            return fail_usage("unknown option or missing value: %s", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return fail_usage("unexpected argument \"%s\"", argv[optind]);
    if (strcmp(o->model, "mlp") != 0 && strcmp(o->model, "cnn") != 0)
        return fail_usage("--model is mlp or cnn, not \"%s\"", o->model);
    if (strcmp(o->optimizer, "sgd") && strcmp(o->optimizer, "adam") && strcmp(o->optimizer, "adamw"))
        return fail_usage("--optimizer is sgd, adam or adamw, not \"%s\"", o->optimizer);
    if (strcmp(o->schedule, "cosine") && strcmp(o->schedule, "step") &&
        strcmp(o->schedule, "constant"))
        return fail_usage("--schedule is cosine, step or constant, not \"%s\"", o->schedule);
    ch_reduce_mode mode;
    if (ch_reduce_mode_parse(&mode, o->reduce) != CH_OK)
        return fail_usage("--reduce is auto, host or peer, not \"%s\"", o->reduce);
    if (strcmp(o->split, "equal") != 0 && strcmp(o->split, "auto") != 0 && !parse_weights(o))
        return fail_usage("--split is auto, equal or positive weights W1,W2,..., not \"%s\"",
                          o->split);
    if (o->lr < 0)
        o->lr = strcmp(o->optimizer, "sgd") == 0 ? 0.05f : 0.001f;
    return 0;
}

/* ---- Training -------------------------------------------------------------------- */

typedef struct trainer {
    const options *o;
    ch_device *dev;          /* the first device: pinned buffers */
    ch_device *devs[64];     /* a device listed twice holds two replicas */
    int ndev;
    char label[64][48];      /* each replica's device, numbered when replicas share it */
    int sharing[64];         /* replicas on each one's device */
    ch_dp *dp;               /* one replica per device, a single one included */
    ch_module *model;        /* the initialised (or resumed) model the replicas copy */
    ch_dataset *train, *test;
    ch_dataset *full;        /* the whole training set when --limit takes its head */
    ch_idx_options norm;     /* the inputs' normalisation, for both sets */
    ch_train_state resumed;  /* where --resume goes on from */
    ch_loader *loader;
    FILE *log;
    int tty;
    int shown;               /* columns of the progress line on the screen */
    int bad_reduce;          /* ch_dp_new refused --reduce for these devices */
    int64_t step;
    ch_lr_schedule lr;       /* by optimizer step, over all the epochs */
} trainer;

/* One batch; *updated tells whether the optimizer stepped (with
 * --accumulate K, once every K batches). */
static ch_status train_step(trainer *t, const ch_batch *b, float *loss_out, int *updated)
{
    ch_status st = ch_dp_step(t->dp, loss_out, b, ch_lr_at(&t->lr, t->step));
    *updated = ch_dp_pending(t->dp) == 0;
    return st;
}

/* ---- The progress line ---------------------------------------------------------- */

/* Its parts, from the one a narrow terminal keeps longest to the one it
 * drops first. */
enum { PART_EPOCH, PART_LOSS, PART_LEFT, PART_BAR, PART_STEP, PART_RATE, PART_DEVICES, NPARTS };

/* What a terminal too narrow for the line gives up, in turn: -1 narrows the
 * bar, a part number drops that part. */
static const int fit_moves[] = {PART_DEVICES, -1, PART_RATE, PART_STEP, PART_BAR, PART_LEFT,
                                PART_LOSS};

#define BAR_WIDTH 30
#define BAR_MIN 10
#define PART_MAX 5120       /* 64 devices' " | opencl:12#2 123456 1234ms" */

typedef struct line_parts {
    char text[NPARTS][PART_MAX]; /* each part but the bar; "" leaves it out */
    double done;                 /* the share of the epoch behind us, for the bar */
} line_parts;

/* The kept parts in display order (epoch, bar, step, loss, rate, time
 * left, devices) into out; returns its length. */
static int compose(char *out, size_t cap, const line_parts *p, unsigned keep, int bar)
{
    static const int order[NPARTS] = {PART_EPOCH, PART_BAR,  PART_STEP,   PART_LOSS,
                                      PART_RATE,  PART_LEFT, PART_DEVICES};
    size_t len = 0;
    out[0] = '\0';
    for (int k = 0; k < NPARTS && len < cap; k++) {
        int part = order[k];
        if (!(keep & 1u << part) || (part != PART_BAR && !p->text[part][0]))
            continue;
        const char *sep = len && part != PART_DEVICES ? " " : "";
        if (part == PART_BAR) {
            int full = (int)(bar * p->done);
            snprintf(out + len, cap - len, "%s[%.*s%*s]", sep, full,
                     "##############################", bar - full, "");
        } else {
            snprintf(out + len, cap - len, "%s%s", sep, p->text[part]);
        }
        len += strlen(out + len);
    }
    return (int)len;
}

/* The line in at most `width` columns: parts dropped in fit_moves' order,
 * the epoch cut short as a last resort. */
static int fit(char *out, size_t cap, const line_parts *p, int width)
{
    unsigned keep = (1u << NPARTS) - 1;
    int bar = BAR_WIDTH, len = compose(out, cap, p, keep, bar);
    for (size_t m = 0; len > width && m < sizeof fit_moves / sizeof fit_moves[0]; m++) {
        if (fit_moves[m] < 0)
            bar = bar - (len - width) > BAR_MIN ? bar - (len - width) : BAR_MIN;
        else
            keep &= ~(1u << fit_moves[m]);
        len = compose(out, cap, p, keep, bar);
    }
    if (len > width && width >= 0 && (size_t)width < cap) {
        out[width] = '\0';
        len = width;
    }
    return len;
}

/* Columns of the terminal on stderr: its size, else $COLUMNS, else 80. */
static int terminal_columns(void)
{
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    const char *env = getenv("COLUMNS");
    int64_t v;
    if (env && parse_int(env, 1, &v) && v <= 100000)
        return (int)v;
    return 80;
}

static void device_parts(const trainer *t, char *out, size_t cap)
{
    int counts[64];
    double times[64];
    size_t len = 0;
    out[0] = '\0';
    if (t->ndev < 2 || ch_dp_last_step(t->dp, counts, times, t->ndev) != CH_OK)
        return;
    for (int i = 0; i < t->ndev && len < cap; i++) {
        snprintf(out + len, cap - len, " | %s %d %.0fms", t->label[i], counts[i],
                 1e3 * times[i]);
        len += strlen(out + len);
    }
}

/* Redrawn in place: a carriage return, the line fitted to the terminal,
 * and spaces over what the previous one left. */
static void progress(trainer *t, int64_t epoch, int64_t batch, int64_t nbatches, float loss,
                     double rate, double left)
{
    if (t->o->quiet || !t->tty)
        return;
    line_parts p;
    char line[sizeof p.text];
    p.done = (double)(batch + 1) / (double)nbatches;
    snprintf(p.text[PART_EPOCH], PART_MAX, "epoch %lld/%lld", (long long)epoch + 1,
             (long long)t->o->epochs);
    snprintf(p.text[PART_STEP], PART_MAX, "step %lld", (long long)t->step);
    snprintf(p.text[PART_LOSS], PART_MAX, "loss %.4f", loss);
    snprintf(p.text[PART_RATE], PART_MAX, "%6.0f samples/s", rate);
    snprintf(p.text[PART_LEFT], PART_MAX, "%4.0fs left", left);
    device_parts(t, p.text[PART_DEVICES], PART_MAX);
    /* The last column stays empty: a line that fills it wraps at once on
     * some terminals. */
    int width = terminal_columns() - 1;
    int len = fit(line, sizeof line, &p, width);
    int pad = t->shown < width ? t->shown - len : width - len;
    fprintf(stderr, "\r%s%*s", line, pad > 0 ? pad : 0, "");
    fflush(stderr);
    t->shown = len;
}

static void log_step(const trainer *t, int64_t epoch, float loss, double rate)
{
    if (!t->log)
        return;
    int counts[64] = {0};
    double times[64] = {0};
    (void)ch_dp_last_step(t->dp, counts, times, t->ndev); /* fails only for another n */
    int total = 0;
    for (int i = 0; i < t->ndev; i++)
        total += counts[i];
    /* JSON has no NaN or infinity: a diverged loss is null. */
    char lossv[32] = "null";
    if (isfinite(loss))
        snprintf(lossv, sizeof lossv, "%.6f", loss);
    fprintf(t->log, "{\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"samples_per_s\":%.1f,"
            "\"devices\":[", (long long)t->step, (long long)epoch, lossv, rate);
    for (int i = 0; i < t->ndev; i++) {
        fprintf(t->log, "%s{\"id\":\"%s\",\"share\":%.4f,\"time_s\":%.6f", i ? "," : "",
                ch_device_id(t->devs[i]), total ? (double)counts[i] / total : 0.0, times[i]);
        if (t->sharing[i] > 1)
            fprintf(t->log, ",\"replicas_on_device\":%d", t->sharing[i]);
        fprintf(t->log, "}");
    }
    fprintf(t->log, "]}\n");
}

/* One epoch from batch `first`; returns 1 in *stop when --max-steps is
 * reached, and in *next the batch to go on from. */
static ch_status train_epoch(trainer *t, int64_t epoch, int64_t first, int *stop,
                             double *busy, int64_t *samples, int64_t *next)
{
    *next = first;
    ch_status st = ch_loader_start(t->loader, epoch, first);
    int64_t nb = ch_loader_batches(t->loader);
    double t0 = ch_clock_seconds();
    float loss = 0.0f;
    while (st == CH_OK) {
        ch_batch *b = NULL;
        st = ch_loader_next(t->loader, &b);
        if (st != CH_OK || !b)
            break;
        double s0 = ch_clock_seconds();
        int updated = 0;
        st = train_step(t, b, &loss, &updated);
        *busy += ch_clock_seconds() - s0;
        *samples += b->count;
        t->step += updated;
        int64_t number = b->number;
        *next = number + 1;
        ch_loader_release(t->loader, b);
        double rate = (double)*samples / *busy;
        log_step(t, epoch, loss, rate);
        double left = (ch_clock_seconds() - t0) / (double)(number + 1 - first) *
                      (double)(nb - number - 1);
        progress(t, epoch, number, nb, loss, rate, left);
        if (st == CH_OK && updated && t->o->max_steps > 0 && t->step >= t->o->max_steps) {
            *stop = 1;
            break;
        }
    }
    /* The end of the epoch: what is accumulated makes one last step. */
    if (st == CH_OK && ch_dp_pending(t->dp) > 0 && !*stop) {
        st = ch_dp_flush(t->dp, ch_lr_at(&t->lr, t->step));
        t->step += st == CH_OK;
    }
    if (st == CH_OK && !t->o->quiet && !t->tty)
        fprintf(stderr, "epoch %lld: loss %.4f, %.0f samples/s\n", (long long)epoch + 1, loss,
                *busy > 0 ? (double)*samples / *busy : 0.0);
    return st;
}

/* Accuracy and mean loss over the test set, in evaluation mode, each
 * replica on its share of every batch. */
static ch_status evaluate(trainer *t, double *accuracy, double *loss)
{
    ch_loader_options lo = {t->o->batch > 256 ? t->o->batch : 256, 0, 0, 0, 2, 2, 0, 1, t->dev};
    ch_loader *ld = NULL;
    ch_status st = ch_loader_new(&ld, t->test, &lo);
    if (st == CH_OK)
        st = ch_loader_start(ld, 0, 0);
    int64_t correct = 0, total = 0;
    double loss_sum = 0;
    while (st == CH_OK) {
        ch_batch *b = NULL;
        st = ch_loader_next(ld, &b);
        if (st != CH_OK || !b)
            break;
        float l = 0;
        int64_t right = 0;
        st = ch_dp_evaluate(t->dp, &l, &right, b);
        correct += right;
        loss_sum += (double)l * b->count;
        total += b->count;
        ch_loader_release(ld, b);
    }
    ch_loader_free(ld);
    *accuracy = total ? (double)correct / (double)total : 0.0;
    *loss = total ? loss_sum / (double)total : 0.0;
    return st;
}

/* Replicas of the (initialised or resumed) model on every device; each
 * replica's optimizer takes the checkpoint's state too. */
static ch_status setup_dp(trainer *t, const ch_optimizer_options *oo)
{
    ch_dp_options d = {0};
    if (ch_reduce_mode_parse(&d.reduce, t->o->reduce) != CH_OK)
        return CH_ERR_INVALID_ARGUMENT;
    d.split = t->o->nweights                          ? CH_DP_SPLIT_WEIGHTS
              : strcmp(t->o->split, "equal") == 0 ? CH_DP_SPLIT_EQUAL
                                                  : CH_DP_SPLIT_AUTO;
    d.weights = t->o->nweights ? t->o->weights : NULL;
    d.nweights = t->o->nweights;
    d.bucket_bytes = (size_t)t->o->bucket_mb << 20;
    d.accumulate = (int)t->o->accumulate;
    d.loss = CH_LOSS_CROSS_ENTROPY;
    d.optimizer = *oo;
    d.sample_ndim = ch_dataset_sample_shape(t->train, d.sample_shape);
    d.seed = t->o->seed;
    ch_status st = ch_dp_new(&t->dp, t->model, t->devs, t->ndev, &d);
    /* A reduction these devices cannot do is the user's choice to change. */
    t->bad_reduce = st == CH_ERR_UNSUPPORTED;
    for (int i = 0; st == CH_OK && t->o->resume && i < t->ndev; i++)
        st = ch_checkpoint_load(t->o->resume, ch_dp_replica(t->dp, i), ch_dp_optimizer(t->dp, i),
                                NULL);
    return st;
}

/* The model, initialised from --seed or resumed: its parameters and where
 * training stopped (the replicas load the optimizer state later). */
static ch_status make_model(trainer *t)
{
    t->resumed = (ch_train_state){0, 0, 0, t->o->seed, 0.0f, 0.0f};
    ch_status st = ch_nn_preset(&t->model, t->o->model);
    if (st == CH_OK)
        st = ch_module_init(t->model, t->o->seed);
    if (st == CH_OK && t->o->resume)
        st = ch_checkpoint_load(t->o->resume, t->model, NULL, &t->resumed);
    return st;
}

static ch_status setup(trainer *t)
{
    ch_optimizer_kind kind = strcmp(t->o->optimizer, "sgd") == 0    ? CH_OPT_SGD
                             : strcmp(t->o->optimizer, "adam") == 0 ? CH_OPT_ADAM
                                                                    : CH_OPT_ADAMW;
    ch_optimizer_options oo = ch_optimizer_defaults(kind, t->o->lr);
    if (kind == CH_OPT_SGD)
        oo.momentum = 0.9f;
    ch_status st = setup_dp(t, &oo);
    ch_loader_options lo = {t->o->batch, 1, t->o->seed, 0, 2, 4, 0, 1, t->dev};
    if (st == CH_OK)
        st = ch_loader_new(&t->loader, t->train, &lo);
    /* The schedule depends only on the step and the planned epochs, so a
     * resumed run follows the same curve. */
    int64_t k = t->o->accumulate, per_epoch = st == CH_OK ? ch_loader_batches(t->loader) : 0;
    int64_t total = t->o->epochs * ((per_epoch + k - 1) / k);
    ch_lr_kind lr_kind = strcmp(t->o->schedule, "cosine") == 0 ? CH_LR_COSINE
                      : strcmp(t->o->schedule, "step") == 0 ? CH_LR_STEP
                                                            : CH_LR_CONSTANT;
    t->lr = (ch_lr_schedule){lr_kind, t->o->lr, 0, 2 * total / (t->o->epochs ? t->o->epochs : 1),
                             0.1f, total, 0.0f};
    return st;
}

/* 1 for the first replica on its device, 2 for the second, ... */
static int ordinal_on_device(const trainer *t, int i)
{
    int k = 1;
    for (int j = 0; j < i; j++)
        k += t->devs[j] == t->devs[i];
    return k;
}

/* "host#1", "host#2" for two replicas on host; a device's id alone
 * otherwise. */
static void name_replicas(trainer *t)
{
    for (int i = 0; i < t->ndev; i++) {
        t->sharing[i] = 0;
        for (int j = 0; j < t->ndev; j++)
            t->sharing[i] += t->devs[j] == t->devs[i];
        const char *id = ch_device_id(t->devs[i]);
        if (t->sharing[i] > 1)
            snprintf(t->label[i], sizeof t->label[i], "%s#%d", id, ordinal_on_device(t, i));
        else
            snprintf(t->label[i], sizeof t->label[i], "%s", id);
    }
}

/* Replicas that share a device split its time: say so before the first step. */
static void note_sharing(const trainer *t)
{
    for (int i = 0; !t->o->quiet && i < t->ndev; i++)
        if (t->sharing[i] > 1 && ordinal_on_device(t, i) == 1)
            fprintf(stderr, "chorus-train: %d replicas share %s\n", t->sharing[i],
                    ch_device_id(t->devs[i]));
}

static void teardown(trainer *t)
{
    ch_loader_free(t->loader);
    ch_dp_free(t->dp);
    ch_module_free(t->model);
    ch_dataset_free(t->train);
    ch_dataset_free(t->full);
    ch_dataset_free(t->test);
    if (t->log)
        fclose(t->log);
}

static int runtime_error(const char *what)
{
    fprintf(stderr, "\nchorus-train: %s: %s\n", what, ch_last_error());
    return EXIT_RUNTIME;
}

static int run(trainer *t)
{
    const options *o = t->o;
    const ch_train_state state = t->resumed;
    if (setup(t) != CH_OK) {
        if (t->bad_reduce) {
            fprintf(stderr, "chorus-train: --reduce %s: %s (see --help)\n", o->reduce,
                    ch_last_error());
            return EXIT_USAGE;
        }
        return runtime_error(o->resume ? "cannot resume" : "cannot set up training");
    }
    t->step = state.step;
    note_sharing(t);
    double busy = 0;
    int64_t samples = 0, epoch = state.epoch;
    int stop = 0;
    for (; epoch < o->epochs && !stop; epoch++) {
        int64_t first = epoch == state.epoch ? state.batch : 0, next = first;
        if (train_epoch(t, epoch, first, &stop, &busy, &samples, &next) != CH_OK)
            return runtime_error("training failed");
        if (t->tty && !o->quiet)
            fprintf(stderr, "\n");
        t->shown = 0;
        /* A checkpoint that stops mid-epoch records where to go on from. */
        ch_train_state cs = {stop ? epoch : epoch + 1, stop ? next : 0, t->step, o->seed,
                             t->norm.mean, t->norm.std};
        if (o->checkpoint && ch_checkpoint_save(o->checkpoint, ch_dp_replica(t->dp, 0),
                                                ch_dp_optimizer(t->dp, 0), &cs) != CH_OK)
            return runtime_error("cannot write the checkpoint");
    }
    double acc = 0, loss = 0;
    if (evaluate(t, &acc, &loss) != CH_OK)
        return runtime_error("evaluation failed");
    double rate = busy > 0 ? (double)samples / busy : 0.0;
    char ids[1024] = "";
    for (int i = 0; i < t->ndev; i++) {
        size_t len = strlen(ids);
        snprintf(ids + len, sizeof ids - len, "%s%s", i ? "," : "", ch_device_id(t->devs[i]));
    }
    if (o->json)
        printf("{\"test_accuracy\":%.4f,\"test_loss\":%.4f,\"samples_per_s\":%.1f,"
               "\"epochs\":%lld,\"devices\":\"%s\",\"steps\":%lld}\n",
               acc, loss, rate, (long long)epoch, ids, (long long)t->step);
    else
        printf("result test_accuracy=%.4f test_loss=%.4f samples_per_s=%.1f epochs=%lld "
               "devices=%s\n",
               acc, loss, rate, (long long)epoch, ids);
    return 0;
}

/* Both sets normalised alike: by --normalize, else as the checkpoint
 * records, else with the training images' own statistics. 0 or the exit
 * status. */
static int open_data(trainer *t)
{
    const options *o = t->o;
    const ch_idx_options recorded = {t->resumed.input_mean, t->resumed.input_std};
    if (o->norm.std > 0 && recorded.std > 0 &&
        (o->norm.mean != recorded.mean || o->norm.std != recorded.std)) {
        fprintf(stderr, "chorus-train: --normalize %g,%g: %s was trained on inputs normalised "
                "with %g,%g (see --help)\n", o->norm.mean, o->norm.std, o->resume,
                recorded.mean, recorded.std);
        return EXIT_USAGE;
    }
    const ch_idx_options *norm = o->norm.std > 0 ? &o->norm : recorded.std > 0 ? &recorded : NULL;
    if (ch_dataset_mnist_open(&t->train, o->data, 1, norm) != CH_OK ||
        ch_dataset_normalization(t->train, &t->norm) != CH_OK ||
        ch_dataset_mnist_open(&t->test, o->data, 0, &t->norm) != CH_OK) {
        fprintf(stderr, "chorus-train: --data: %s\n", ch_last_error());
        return EXIT_USAGE;
    }
    if (o->limit > 0 && o->limit < ch_dataset_size(t->train)) {
        t->full = t->train;
        t->train = NULL;
        if (ch_dataset_head(&t->train, t->full, o->limit) != CH_OK) {
            fprintf(stderr, "chorus-train: --limit: %s\n", ch_last_error());
            return EXIT_RUNTIME;
        }
    }
    return 0;
}

/* Devices, model, data and log; 0 or the exit status. */
static int prepare(trainer *t)
{
    const options *o = t->o;
    if (ch_device_list_parse_replicas(t->devs, 64, &t->ndev, o->devices) != CH_OK) {
        fprintf(stderr, "chorus-train: --devices: %s\n", ch_last_error());
        return EXIT_USAGE;
    }
    if (o->nweights && o->nweights != t->ndev) {
        fprintf(stderr, "chorus-train: --split has %d weights for %d devices\n", o->nweights,
                t->ndev);
        return EXIT_USAGE;
    }
    t->dev = t->devs[0];
    name_replicas(t);
    if (make_model(t) != CH_OK)
        return runtime_error(o->resume ? "cannot resume" : "cannot set up training");
    int rc = open_data(t);
    if (rc)
        return rc;
    if (o->log && !(t->log = fopen(o->log, "w"))) {
        fprintf(stderr, "chorus-train: --log: cannot write %s: %s\n", o->log, strerror(errno));
        return EXIT_USAGE;
    }
    return 0;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc)
        return rc;
    if (ch_init() != CH_OK) {
        fprintf(stderr, "chorus-train: %s\n", ch_last_error());
        return EXIT_RUNTIME;
    }
    trainer t = {.o = &o, .tty = isatty(STDERR_FILENO)};
    rc = prepare(&t);
    if (rc == 0)
        rc = run(&t);
    teardown(&t);
    ch_shutdown();
    return rc;
}
