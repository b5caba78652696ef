/* chorus-train: train an MLP, a CNN or a ResNet on Fashion-MNIST (or MNIST),
 * or a GPT on a text or llm.c token shards. The driver: the options
 * (utils/train-options.c) into devices, data and a data-parallel model,
 * the epochs and their steps, checkpoints, and the evaluation at the end.
 * What it tells is utils/report.c's, the progress line utils/progress.c's,
 * SIGINT and SIGTERM utils/signals.c's, --generate utils/sample.c's. */
#include "config.h"

#include <chorus.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "report.h"
#include "sample.h"
#include "signals.h"
#include "train-options.h"
#include "trainer.h"

/* Under mpirun: this process's rank and the job's size (utils/trainer.h). */
int g_rank, g_ranks = 1;

/* ---- Batches: the image loader's, or windows of tokens (gpt) -------------------- */

/* Window `first + i` for i < count into the batch buffers: the training
 * sample of (seed, epoch, index), or evaluation window index. */
static ch_status fill_windows(trainer *t, const ch_tokens *tok, int64_t epoch, int64_t first,
                              int count, int eval)
{
    int ctx = (int)t->o->gpt.context;
    int32_t *in = ch_host_buffer_data(t->tok_in), *out = ch_host_buffer_data(t->tok_out);
    for (int i = 0; i < count; i++) {
        int32_t *x = in + (size_t)i * ctx, *y = out + (size_t)i * ctx;
        ch_status st = eval ? ch_tokens_eval_window(tok, x, y, first + i, ctx)
                            : ch_tokens_window(tok, x, y, t->o->seed, epoch, first + i, ctx);
        if (st != CH_OK)
            return st;
    }
    t->lm_batch = (ch_batch){t->tok_in, t->tok_out, NULL, count, epoch, first / t->o->batch};
    return CH_OK;
}

static ch_status batches_start(trainer *t, int64_t epoch, int64_t first)
{
    if (!t->o->lm)
        return ch_loader_start(t->loader, epoch, first);
    t->lm_next = first;
    t->lm_epoch = epoch;
    return CH_OK;
}

static int64_t batches_per_epoch(const trainer *t)
{
    return t->o->lm ? t->lm_batches : ch_loader_batches(t->loader);
}

/* The next batch of the epoch; NULL at its end. */
static ch_status batches_next(trainer *t, ch_batch **b)
{
    *b = NULL;
    if (!t->o->lm)
        return ch_loader_next(t->loader, b);
    if (t->lm_next >= t->lm_batches)
        return CH_OK;
    int64_t n = t->lm_next++;
    ch_status st = fill_windows(t, t->tok_train, t->lm_epoch, n * t->o->batch,
                                t->o->batch, 0);
    if (st != CH_OK)
        return st;
    t->lm_batch.number = n;
    *b = &t->lm_batch;
    return CH_OK;
}

static void batches_release(trainer *t, ch_batch *b)
{
    if (!t->o->lm)
        ch_loader_release(t->loader, b);
}

/* Mean cross-entropy over every evaluation window of the validation
 * split, in batches; *accuracy: the share of tokens predicted right. */
static ch_status validate(trainer *t, double *loss, double *accuracy)
{
    int64_t windows = ch_tokens_windows(t->tok_val, (int)t->o->gpt.context), right = 0;
    double sum = 0;
    ch_status st = CH_OK;
    for (int64_t w = 0; st == CH_OK && w < windows; w += t->o->batch) {
        int count = (int)(windows - w < t->o->batch ? windows - w : t->o->batch);
        float l = 0;
        int64_t r = 0;
        st = fill_windows(t, t->tok_val, 0, w, count, 1);
        if (st == CH_OK)
            st = ch_dp_evaluate(t->dp, &l, &r, &t->lm_batch);
        if (t->o->elastic)
            tell_changes(t, "evaluation");
        sum += (double)l * count;
        right += r;
    }
    *loss = windows ? sum / (double)windows : 0.0;
    *accuracy = windows ? (double)right / ((double)windows * t->o->gpt.context) : 0.0;
    t->val_loss = *loss;
    return st;
}

/* ---- Training: steps, epochs, checkpoints, the evaluation ----------------------- */

/* One batch; *updated tells whether the optimizer stepped (with
 * --accumulate K, once every K batches). */
static ch_status train_step(trainer *t, const ch_batch *b, float *loss_out, int *updated)
{
    ch_status st = ch_dp_step(t->dp, loss_out, b, ch_lr_at(&t->lr, t->step));
    *updated = ch_dp_pending(t->dp) == 0;
    if (t->o->elastic)
        tell_changes(t, "training");
    int map[64], n = replicas_now(t, map);
    /* A step whose update held on the replicas left when --elastic lost a
     * device is kept, not made again: its times went with the replicas
     * made again after it (zeros), and are not counted. */
    if (st == CH_OK && ch_dp_last_breakdown(t->dp, t->bd.last, n) == CH_OK &&
        t->bd.last[0].step > 0.0) {
        for (int i = 0; i < n; i++) {
            t->bd.compute[map[i]] += t->bd.last[i].compute;
            t->bd.wait[map[i]] += t->bd.last[i].wait;
            t->bd.update[map[i]] += t->bd.last[i].update;
        }
        t->bd.step += t->bd.last[0].step;
        t->bd.exposed += t->bd.last[0].exposed;
        t->bd.calls++;
    }
    return st;
}

/* The checkpoint: the trained parameters and the job's whole optimizer
 * state, gathered into the caller's model (a collective across the
 * ranks: every rank gathers, rank 0 writes). */
static ch_status save_checkpoint(trainer *t, const ch_train_state *cs)
{
    ch_optimizer *whole = NULL;
    ch_status st = ch_dp_sync_to(t->dp, t->model);
    if (st == CH_OK)
        st = ch_optimizer_new(&whole, t->model, &t->oo);
    if (st == CH_OK)
        st = ch_dp_optimizer_get(t->dp, whole);
    if (st == CH_OK && g_rank == 0)
        st = ch_checkpoint_save_as(t->o->checkpoint, t->model, whole, cs, t->o->save_dtype);
    ch_optimizer_free(whole);
    return st;
}

/* The checkpoint of training that goes on at batch `next` of `epoch`
 * (after t->step steps). Under mpirun a collective: every process calls
 * it at the same step. */
static ch_status save_at(trainer *t, int64_t epoch, int64_t next)
{
    const train_options *o = t->o;
    ch_train_state cs = {epoch, next, t->step, o->seed, t->norm.mean, t->norm.std, 0.0f, 0};
    if (o->precision == CH_F16) {
        int clean = 0;
        (void)ch_dp_loss_scale(t->dp, &cs.loss_scale, &clean, NULL);
        cs.loss_scale_clean = clean;
    }
    return save_checkpoint(t, &cs);
}

/* One epoch from batch `first`; returns 1 in *stop when --max-steps is
 * reached or a signal stops training, and in *next the batch to go on
 * from. *busy and *samples sum the time in steps and the samples trained. */
static ch_status train_epoch(trainer *t, int64_t epoch, int64_t first, int *stop,
                             double *busy, int64_t *samples, int64_t *next)
{
    *next = first;
    ch_status st = batches_start(t, epoch, first);
    int64_t nb = batches_per_epoch(t);
    double t0 = ch_clock_seconds();
    float loss = 0.0f;
    while (st == CH_OK) {
        ch_batch *b = NULL;
        double w0 = ch_clock_seconds();
        st = batches_next(t, &b);
        t->bd.last_stall = ch_clock_seconds() - w0;
        t->bd.stall += t->bd.last_stall;
        if (st != CH_OK || !b)
            break;
        double s0 = ch_clock_seconds();
        int updated = 0;
        st = train_step(t, b, &loss, &updated);
        t->last_loss = loss;
        *busy += ch_clock_seconds() - s0;
        *samples += b->count;
        t->step += updated;
        int64_t number = b->number;
        *next = number + 1;
        batches_release(t, b);
        double rate = (double)*samples / *busy;
        if (st == CH_OK && updated && t->o->eval_every > 0 && t->step % t->o->eval_every == 0) {
            double acc;
            double v0 = ch_clock_seconds();
            st = validate(t, &t->val_loss, &acc);
            t0 += ch_clock_seconds() - v0; /* not training time */
        }
        log_step(t, epoch, loss, rate);
        tell_bucket(t);
        double left = (ch_clock_seconds() - t0) / (double)(number + 1 - first) *
                      (double)(nb - number - 1);
        progress(t, epoch, number, nb, loss, rate, left);
        if (st == CH_OK && updated && t->o->max_steps > 0 && t->step >= t->o->max_steps) {
            *stop = 1;
            break;
        }
        /* A signal stops at an update, not between accumulated batches. */
        if (st == CH_OK && ch_dp_pending(t->dp) == 0 && (t->signalled = stop_signal(g_ranks))) {
            *stop = 1;
            break;
        }
        /* --checkpoint-every: mid-epoch, training going on at the next
         * batch (the end of the run and of the epoch write their own). */
        if (st == CH_OK && updated && t->o->checkpoint_every > 0 &&
            t->step % t->o->checkpoint_every == 0 && *next < nb) {
            st = save_at(t, epoch, *next);
        }
    }
    /* The end of the epoch: what is accumulated makes one last step. */
    if (st == CH_OK && ch_dp_pending(t->dp) > 0 && !*stop) {
        st = ch_dp_flush(t->dp, ch_lr_at(&t->lr, t->step));
        t->step += st == CH_OK;
    }
    if (st == CH_OK && t->o->lm && !t->o->eval_every) {
        double acc;
        st = validate(t, &t->val_loss, &acc);
    }
    if (st == CH_OK && !t->o->quiet && !t->tty) {
        double rate = *busy > 0 ? (double)*samples / *busy : 0.0;
        if (t->o->lm)
            fprintf(stderr, "epoch %lld: loss %.4f, val_loss %.4f, %.0f tokens/s\n",
                    (long long)epoch + 1, loss, t->val_loss, rate * t->o->gpt.context);
        else
            fprintf(stderr, "epoch %lld: loss %.4f, %.0f samples/s\n", (long long)epoch + 1,
                    loss, rate);
    }
    return st;
}

/* Accuracy and mean loss over the test set, in evaluation mode, each
 * replica on its share of every batch. */
static ch_status evaluate(trainer *t, double *accuracy, double *loss)
{
    ch_loader_options lo = {t->o->batch > 256 ? t->o->batch : 256, 0, 0, 0, 2, 2, 0, 1, t->dev, 0, 0};
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
        if (t->o->elastic)
            tell_changes(t, "evaluation");
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

/* ---- The model, its replicas, the optimizer and the batches --------------------- */

/* Replicas of the (initialised or resumed) model on every device; the
 * replicas' optimizers take the checkpoint's state too. */
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
    d.bucket_bytes = t->o->bucket_mb < 0 ? CH_DP_BUCKET_AUTO : (size_t)t->o->bucket_mb << 20;
    d.accumulate = (int)t->o->accumulate;
    d.loss = CH_LOSS_CROSS_ENTROPY;
    d.optimizer = *oo;
    if (t->o->lm) {
        d.sample_ndim = 1;
        d.sample_shape[0] = t->o->gpt.context;
        d.sample_dtype = CH_I32;
        d.labels_per_sample = t->o->gpt.context;
    } else {
        d.sample_ndim = ch_dataset_sample_shape(t->train, d.sample_shape);
    }
    d.batchnorm_local = strcmp(t->o->batchnorm, "local") == 0;
    d.seed = t->o->seed;
    d.dist = ch_dist_world();
    d.precision = t->o->precision;
    d.reduce_dtype = t->o->reduce_dtype;
    d.shard_optimizer = t->o->shard_optimizer;
    d.recompute = t->o->recompute;
    d.elastic = t->o->elastic;
    d.elastic_timeout = t->o->elastic_timeout; /* 0: the library's 60 s */
    /* --device-memory: the replicas are made under their devices' limits. */
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < t->o->nlimits; i++)
        if (t->limited[i])
            st = ch_device_set_memory_limit(t->limited[i], t->o->limits[i].bytes);
    if (st == CH_OK)
        st = ch_dp_new(&t->dp, t->model, t->devs, t->ndev, &d);
    /* A reduction, --elastic or a memory limit these devices cannot serve
     * is the user's choice to change. */
    t->bad_reduce = st == CH_ERR_UNSUPPORTED;
    /* The checkpoint's optimizer state, whole, to every replica (its part
     * of it with --shard-optimizer). */
    ch_optimizer *whole = NULL;
    if (st == CH_OK && t->o->resume)
        st = ch_optimizer_new(&whole, t->model, oo);
    if (st == CH_OK && t->o->resume)
        st = ch_checkpoint_load(t->o->resume, t->model, whole, NULL);
    if (st == CH_OK && t->o->resume)
        st = ch_dp_optimizer_set(t->dp, whole);
    ch_optimizer_free(whole);
    /* fp16 goes on with the checkpoint's loss scale (a checkpoint of
     * another precision has none: the first scale then). */
    if (st == CH_OK && t->o->precision == CH_F16 && t->resumed.loss_scale > 0.0f)
        st = ch_dp_set_loss_scale(t->dp, t->resumed.loss_scale,
                                  (int)t->resumed.loss_scale_clean);
    return st;
}

/* The model, initialised from --seed or resumed: its parameters and where
 * training stopped (the replicas load the optimizer state later). */
static ch_status make_model(trainer *t)
{
    const train_options *o = t->o;
    t->resumed = (ch_train_state){0, 0, 0, o->seed, 0.0f, 0.0f, 0.0f, 0};
    ch_status st;
    if (o->lm)
        st = ch_nn_gpt(&t->model, &o->gpt);
    else if (strcmp(o->model, "resnet") == 0)
        st = ch_nn_resnet(&t->model, (int)o->depth, 16, 1, 10);
    else
        st = ch_nn_preset(&t->model, o->model);
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
    if (t->o->weight_decay >= 0.0f)
        oo.weight_decay = t->o->weight_decay;
    t->oo = oo;
    ch_status st = setup_dp(t, &oo);
    ch_loader_options lo = {t->o->batch, 1, t->o->seed, 0, 2, 4, 0, 1, t->dev,
                            t->o->aug, t->o->crop_pad};
    if (st == CH_OK && !t->o->lm)
        st = ch_loader_new(&t->loader, t->train, &lo);
    if (st == CH_OK && t->o->lm) {
        size_t bytes = (size_t)t->o->batch * (size_t)t->o->gpt.context * sizeof(int32_t);
        st = ch_host_buffer_new(&t->tok_in, t->dev, bytes);
        if (st == CH_OK)
            st = ch_host_buffer_new(&t->tok_out, t->dev, bytes);
    }
    /* The schedule depends only on the step and the planned epochs, so a
     * resumed run follows the same curve (--max-steps, a stop, leaves it). */
    int64_t k = t->o->accumulate, per_epoch = st == CH_OK ? batches_per_epoch(t) : 0;
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

/* ---- The run -------------------------------------------------------------------- */

static void teardown(trainer *t)
{
    ch_loader_free(t->loader);
    ch_host_buffer_free(t->tok_in);
    ch_host_buffer_free(t->tok_out);
    ch_tokens_free(t->tok_train);
    ch_tokens_free(t->tok_val);
    ch_dp_free(t->dp);
    ch_module_free(t->model);
    ch_dataset_free(t->train);
    ch_dataset_free(t->full);
    ch_dataset_free(t->test);
    if (t->log)
        fclose(t->log);
    free(t->el.json);
}

static int runtime_error(const char *what)
{
    if (g_ranks > 1)
        fprintf(stderr, "\nchorus-train: rank %d of %d: %s: %s\n", g_rank, g_ranks, what,
                ch_last_error());
    else
        fprintf(stderr, "\nchorus-train: %s: %s\n", what, ch_last_error());
    return EXIT_RUNTIME;
}

static int run(trainer *t)
{
    const train_options *o = t->o;
    const ch_train_state state = t->resumed;
    if (setup(t) != CH_OK) {
        if (t->bad_reduce) {
            /* The reduction, what --elastic cannot do on these devices
             * (what it can never do is refused with the options), or
             * devices the memory limits cannot serve. */
            if (o->elastic && strstr(ch_last_error(), "elastic"))
                fprintf(stderr, "chorus-train: --elastic: %s (see --help)\n", ch_last_error());
            else if (strstr(ch_last_error(), "memory limit"))
                fprintf(stderr, "chorus-train: --device-memory: %s (see --help)\n",
                        ch_last_error());
            else
                fprintf(stderr, "chorus-train: --reduce %s: %s (see --help)\n", o->reduce,
                        ch_last_error());
            return EXIT_USAGE;
        }
        return runtime_error(o->resume ? "cannot resume" : "cannot set up training");
    }
    t->step = state.step;
    t->el.base = state.step; /* the dp counts its steps from 1 */
    note_sharing(t);
    memory_devices(t);
    if (memory_reset(t) != CH_OK)
        return runtime_error("cannot reset the devices' peak memory");
    double busy = 0;
    int64_t samples = 0, epoch = state.epoch;
    int stop = 0;
    for (; epoch < o->epochs && !stop; epoch++) {
        int64_t first = epoch == state.epoch ? state.batch : 0, next = first;
        /* --elastic: at an epoch boundary, the lost devices that answer
         * again rejoin (a failure leaves the replicas as they were). */
        if (o->elastic && epoch > state.epoch && ch_dp_replica_count(t->dp) < t->ndev) {
            int back = 0;
            if (ch_dp_rejoin(t->dp, &back) != CH_OK)
                fprintf(stderr,
                        "chorus-train: before step %lld: the lost devices cannot "
                        "rejoin: %s\n",
                        (long long)t->step + 1, ch_last_error());
            tell_changes(t, "rejoin");
        }
        if (train_epoch(t, epoch, first, &stop, &busy, &samples, &next) != CH_OK)
            return runtime_error("training failed");
        if (t->tty && !o->quiet)
            fprintf(stderr, "\n");
        t->shown = 0;
        /* A checkpoint that stops mid-epoch records where to go on from. */
        if (o->checkpoint && save_at(t, stop ? epoch : epoch + 1, stop ? next : 0) != CH_OK)
            return runtime_error("cannot write the checkpoint");
    }
    if (t->signalled) {
        if (g_rank == 0)
            fprintf(stderr, "chorus-train: %s: stopped after step %lld%s%s\n",
                    t->signalled == SIGINT ? "SIGINT" : "SIGTERM", (long long)t->step,
                    o->checkpoint ? ", checkpoint written to " : "",
                    o->checkpoint ? o->checkpoint : "");
        return 128 + t->signalled;
    }
    if (memory_read(t) != CH_OK)
        return runtime_error("cannot read the devices' memory");
    double acc = 0, loss = 0;
    if ((o->lm ? validate(t, &loss, &acc) : evaluate(t, &acc, &loss)) != CH_OK)
        return runtime_error("evaluation failed");
    if (g_rank != 0)
        return 0;
    print_result(t, acc, loss, epoch, busy > 0 ? (double)samples / busy : 0.0);
    if (!o->lm)
        return 0;
    fflush(stdout); /* the result before the sample, which takes a while */
    if (o->generate > 0 &&
        sample_generate(ch_dp_replica(t->dp, 0), o, ch_tokens_bytes(t->tok_train)) != CH_OK)
        return runtime_error("generation failed");
    return 0;
}

/* ---- Devices, data, the log and the trace, from the options --------------------- */

/* Both sets normalised alike: by --normalize, else as the checkpoint
 * records, else with the training images' own statistics. 0 or the exit
 * status. */
static int open_data(trainer *t)
{
    const train_options *o = t->o;
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

/* The token data; the vocabulary is the data's unless --vocab says (it
 * may be larger). 0 or the exit status. */
static int open_tokens(trainer *t)
{
    train_options *o = (train_options *)t->o;
    if (ch_tokens_open(&t->tok_train, &t->tok_val, o->data) != CH_OK) {
        fprintf(stderr, "chorus-train: --data: %s\n", ch_last_error());
        return EXIT_USAGE;
    }
    int32_t vocab = ch_tokens_vocab(t->tok_train);
    if (o->gpt.vocab == 0)
        o->gpt.vocab = vocab;
    if (o->gpt.vocab < vocab) {
        fprintf(stderr, "chorus-train: --vocab %lld: %s has tokens up to %d (see --help)\n",
                (long long)o->gpt.vocab, o->data, vocab - 1);
        return EXIT_USAGE;
    }
    int ctx = (int)o->gpt.context;
    int64_t windows = ch_tokens_windows(t->tok_train, ctx);
    if (windows == 0 || ch_tokens_windows(t->tok_val, ctx) == 0) {
        fprintf(stderr, "chorus-train: --context %d: %s\n", ctx, ch_last_error());
        return EXIT_USAGE;
    }
    if (o->limit > 0 && o->limit < windows)
        windows = o->limit;
    t->lm_batches = windows / o->batch > 0 ? windows / o->batch : 1;
    if (windows < o->batch) {
        fprintf(stderr, "chorus-train: --batch %d: the training split holds %lld windows of "
                "%d tokens\n", o->batch, (long long)windows, ctx);
        return EXIT_USAGE;
    }
    return 0;
}

/* This process's part of --devices: the whole list, or under mpirun the
 * (local rank modulo their number)-th of lists separated by ';'. NULL when
 * it does not fit in `cap`. */
static const char *rank_devices(const char *devices, char *out, size_t cap)
{
    int lists = 1;
    for (const char *p = devices; *p; p++)
        lists += *p == ';';
    int want = ch_dist_local_rank(ch_dist_world()) % lists;
    const char *p = devices;
    for (int k = 0; k < want; k++)
        p = strchr(p, ';') + 1;
    size_t len = strcspn(p, ";");
    if (len >= cap)
        return NULL;
    memcpy(out, p, len);
    out[len] = '\0';
    return out;
}

/* --trace FILE: started before the dp is made, so that its streams time
 * their work on the devices. Under mpirun each rank writes its own file,
 * FILE with ".rankK" before its ".json" (tools/chorus-trace-merge joins
 * them). 0 or the exit status. */
static int start_trace(const train_options *o)
{
    if (!o->trace)
        return 0;
    char path[4096];
    size_t len = strlen(o->trace);
    int json = len > 5 && strcmp(o->trace + len - 5, ".json") == 0;
    if (g_ranks > 1)
        snprintf(path, sizeof path, "%.*s.rank%d%s", (int)(json ? len - 5 : len), o->trace, g_rank,
                 json ? ".json" : "");
    else
        snprintf(path, sizeof path, "%s", o->trace);
    /* Under mpirun ch_dp_new adds the rank and the host. */
    ch_trace_options to = {0, "chorus-train"};
    if (ch_trace_start(path, &to) != CH_OK) {
        fprintf(stderr, "chorus-train: --trace: %s\n", ch_last_error());
        return EXIT_USAGE;
    }
    return 0;
}

/* Whether `d` is in one of the ';'-separated lists of --devices (under
 * mpirun each process trains one of them). */
static int in_device_lists(const char *devices, const ch_device *d)
{
    char list[1024];
    ch_device *devs[64];
    for (const char *p = devices;; p += strcspn(p, ";") + 1) {
        size_t len = strcspn(p, ";");
        int n = 0;
        if (len < sizeof list) {
            memcpy(list, p, len);
            list[len] = '\0';
            if (ch_device_list_parse_replicas(devs, 64, &n, list) != CH_OK)
                n = 0;
        }
        for (int i = 0; i < n; i++)
            if (devs[i] == d)
                return 1;
        if (!p[len])
            return 0;
    }
}

/* --device-memory: each device it names is a device here and one that
 * --devices trains on; those of this process get their limit in
 * setup_dp. 0 or the exit status. */
static int resolve_limits(trainer *t)
{
    const train_options *o = t->o;
    for (int i = 0; i < o->nlimits; i++) {
        ch_device *d = NULL;
        if (ch_device_by_name(&d, o->limits[i].device) != CH_OK) {
            fprintf(stderr, "chorus-train: --device-memory: %s (see --help)\n", ch_last_error());
            return EXIT_USAGE;
        }
        if (!in_device_lists(o->devices, d)) {
            fprintf(stderr,
                    "chorus-train: --device-memory names %s, which --devices %s does "
                    "not train on (see --help)\n",
                    o->limits[i].device, o->devices);
            return EXIT_USAGE;
        }
        t->limited[i] = NULL;
        for (int j = 0; j < t->ndev && !t->limited[i]; j++)
            if (t->devs[j] == d)
                t->limited[i] = d;
    }
    return 0;
}

/* Devices, model, data and log; 0 or the exit status. */
static int prepare(trainer *t)
{
    const train_options *o = t->o;
    char mine[1024];
    const char *list = rank_devices(o->devices, mine, sizeof mine);
    if (!list) {
        fprintf(stderr, "chorus-train: --devices: a list is longer than %zu characters\n",
                sizeof mine - 1);
        return EXIT_USAGE;
    }
    if (ch_device_list_parse_replicas(t->devs, 64, &t->ndev, list) != CH_OK) {
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
    int rc = resolve_limits(t);
    if (rc)
        return rc;
    rc = o->lm ? open_tokens(t) : 0;
    if (rc)
        return rc;
    if (make_model(t) != CH_OK)
        return runtime_error(o->resume ? "cannot resume" : "cannot set up training");
    rc = o->lm ? 0 : open_data(t);
    if (rc)
        return rc;
    if (o->log && g_rank == 0 && !(t->log = fopen(o->log, "w"))) {
        fprintf(stderr, "chorus-train: --log: cannot write %s: %s\n", o->log, strerror(errno));
        return EXIT_USAGE;
    }
    return start_trace(o);
}

int main(int argc, char **argv)
{
    /* Before any thread exists (MPI's, OpenMP's, the loader's). */
    (void)catch_signals();
    /* Started by mpirun (or srun): one process of a data-parallel job. */
    if (ch_dist_launched()) {
        if (ch_dist_init(&argc, &argv) != CH_OK) {
            fprintf(stderr, "chorus-train: cannot join the MPI job: %s\n", ch_last_error());
            return EXIT_RUNTIME;
        }
        g_rank = ch_dist_rank(ch_dist_world());
        g_ranks = ch_dist_size(ch_dist_world());
    }
    train_options o;
    int rc = train_parse_options(argc, argv, &o, g_rank == 0 ? stderr : NULL);
    if (rc == TRAIN_OPTIONS_HELP) {
        train_usage(stdout);
        return 0;
    }
    if (rc == TRAIN_OPTIONS_VERSION) {
        printf("chorus-train %s\n", ch_version());
        return 0;
    }
    /* ch_dp_new's reason (include/chorus/dp.h), said before any work. */
    if (rc == 0 && o.elastic && g_ranks > 1) {
        if (g_rank == 0)
            fprintf(stderr,
                    "chorus-train: --elastic works inside one process, not across the "
                    "%d processes of this MPI job: there chorus-elastic restarts a lost "
                    "process's job from its checkpoint (see --help)\n",
                    g_ranks);
        rc = EXIT_USAGE;
    }
    if (rc == 0 && g_rank != 0) {
        o.quiet = 1;
        o.generate = 0;
    }
    if (rc == 0 && ch_init() != CH_OK) {
        fprintf(stderr, "chorus-train: %s\n", ch_last_error());
        rc = EXIT_RUNTIME;
    }
    if (rc == 0 && o.tf32 && ch_math_set(ch_math_get() | CH_MATH_TF32) != CH_OK) {
        fprintf(stderr, "chorus-train: --tf32: %s\n", ch_last_error());
        rc = EXIT_RUNTIME;
    }
    if (rc == 0) {
        trainer t = {.o = &o, .tty = isatty(STDERR_FILENO), .val_loss = NAN};
        rc = prepare(&t);
        if (rc == 0)
            rc = run(&t);
        if (ch_trace_running() && ch_trace_stop() != CH_OK) {
            fprintf(stderr, "chorus-train: --trace: %s\n", ch_last_error());
            if (rc == 0)
                rc = EXIT_RUNTIME;
        }
        teardown(&t);
        ch_shutdown();
    }
    /* After a failure another process may be stuck in a collective, and
     * MPI_Finalize would wait for it: leave, and let the launcher end the
     * job. A signal stops every process at the same step: they finalize. */
    if (rc == 0 || rc > 128 || g_ranks == 1)
        ch_dist_finalize();
    return rc;
}
