/* chorus-train: train an MLP, a CNN or a ResNet on Fashion-MNIST (or MNIST),
 * or a GPT on a text or llm.c token shards. */
#include "config.h"

#include <chorus.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "progress.h"
#include "train-options.h"

/* Under mpirun: this process's rank and the job's size (0 and 1 alone).
 * Rank 0 alone reports usage errors, progress and results, and writes the
 * log and the checkpoints. */
static int g_rank, g_ranks = 1;

/* ---- Training -------------------------------------------------------------------- */

typedef struct trainer {
    const train_options *o;
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
    ch_tokens *tok_train, *tok_val; /* gpt */
    ch_host_buffer *tok_in, *tok_out; /* a batch of windows and their targets */
    ch_batch lm_batch;
    /* Batches per epoch; the next one to assemble and its epoch (kept
     * here: validation fills lm_batch with epoch 0's windows). */
    int64_t lm_batches, lm_next, lm_epoch;
    double val_loss;         /* the last validation loss, NAN before */
    float last_loss;         /* the last training batch's */
    FILE *log;
    int tty;
    int shown;               /* columns of the progress line on the screen */
    int signalled;           /* SIGINT or SIGTERM stopped training (0: none) */
    int bad_reduce;          /* ch_dp_new refused --reduce for these devices */
    /* --device-memory's devices this process trains on (NULL: another
     * process's), in the order of its entries. */
    ch_device *limited[TRAIN_MAX_LIMITS];
    /* Each device once, in --devices' order, and its memory over training
     * (the peaks since training started). */
    ch_device *mem_devs[64];
    ch_memory_stats mem[64];
    int nmem;
    int64_t step;
    ch_lr_schedule lr;       /* by optimizer step, over all the epochs */
    ch_optimizer_options oo; /* the replicas' optimizer */
    /* --elastic: the changes ch_dp_changes has that were told, the
     * devices each left (gone[i]: t->devs[i] is lost), where the dp's
     * steps start (a resumed run's dp counts from 1 again), and the
     * changes' JSON records for --json's result. */
    struct {
        int told;
        unsigned char gone[64];
        int64_t base;
        char *json;
        size_t len, cap;
    } el;
    struct {                 /* where the steps' time went, summed (ch_dp_last_breakdown) */
        ch_dp_breakdown last[64]; /* by replica now (replicas_now) */
        double compute[64], wait[64], update[64];
        double step, exposed, stall, last_stall;
        int64_t calls;
        int said_bucket; /* --bucket-mb auto's choice was told */
    } bd;
} trainer;

/* The replicas now: their count (below t->ndev once --elastic lost a
 * device) and in map[i] the index in t->devs (and t->label, t->sharing)
 * of replica i, the index the per-replica ch_dp_* queries use. The dp
 * keeps --devices' order without the lost devices. */
static int replicas_now(const trainer *t, int *map)
{
    int n = ch_dp_replica_count(t->dp);
    if (n > t->ndev)
        n = t->ndev;
    for (int i = 0, j = 0; i < n; i++, j++) {
        const ch_device *d = ch_dp_device(t->dp, i);
        int k = j;
        while (k < t->ndev && t->devs[k] != d)
            k++;
        j = k < t->ndev ? k : i; /* not found: cannot be, keep the order */
        map[i] = j;
    }
    return n;
}

/* s as a JSON string (quoted, escaped) to f. */
static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* --elastic: what the dp lost or took back since the last call, told on
 * stderr, as an event line in --log and kept for --json's result.
 * `when`: "training" (in the step after t->step), "evaluation" (after
 * t->step) or "rejoin" (before the step after t->step). */
static void tell_changes(trainer *t, const char *when)
{
    int total = ch_dp_changes(t->dp, NULL, 0);
    if (total <= t->el.told)
        return;
    ch_dp_change *all = malloc((size_t)total * sizeof *all);
    if (!all)
        return;
    total = ch_dp_changes(t->dp, all, total);
    for (; t->el.told < total; t->el.told++) {
        const ch_dp_change *e = &all[t->el.told];
        for (int i = 0; i < t->ndev; i++)
            if (strcmp(ch_device_id(t->devs[i]), e->device) == 0)
                t->el.gone[i] = !e->rejoined;
        /* The replicas after it: --devices without the devices gone. */
        char left[1024] = "", devices[2048] = "";
        for (int i = 0, any = 0; i < t->ndev; i++) {
            if (t->el.gone[i])
                continue;
            size_t len = strlen(left), dlen = strlen(devices);
            snprintf(left + len, sizeof left - len, "%s%s", any ? ", " : "", t->label[i]);
            snprintf(devices + dlen, sizeof devices - dlen, "%s\"%s\"", any ? "," : "",
                     t->label[i]);
            any = 1;
        }
        /* The step it happened in (a rejoin: the step it comes before); an
         * evaluation's: the step it came after. */
        int eval = strcmp(when, "evaluation") == 0;
        int64_t step = eval ? t->step : t->el.base + e->step;
        char at[64];
        if (e->rejoined)
            snprintf(at, sizeof at, "before step %lld", (long long)step);
        else if (eval)
            snprintf(at, sizeof at, "evaluation after step %lld", (long long)step);
        else
            snprintf(at, sizeof at, "step %lld", (long long)step);
        if (t->shown)
            fprintf(stderr, "\n");
        t->shown = 0;
        if (e->rejoined)
            fprintf(stderr,
                    "chorus-train: %s: %s rejoined; training on %d replica%s: %s (%.2f s)\n", at,
                    e->device, e->replicas, e->replicas == 1 ? "" : "s", left, e->seconds);
        else
            fprintf(stderr, "chorus-train: %s: %s lost (%s); %s%d replica%s%s: %s (%.2f s)\n", at,
                    e->device, e->cause, eval ? "" : "training on ", e->replicas,
                    e->replicas == 1 ? "" : "s", eval ? " left" : "", left, e->seconds);
        /* The record: an event line of --log now, in --json's result at
         * the end. */
        char *rec = NULL;
        size_t rlen = 0;
        FILE *rf = open_memstream(&rec, &rlen);
        if (!rf)
            continue;
        fprintf(rf, "{\"event\":\"%s\",\"step\":%lld,\"when\":\"%s\",\"device\":",
                e->rejoined ? "device_rejoined" : "device_lost", (long long)step, when);
        json_string(rf, e->device);
        if (!e->rejoined) {
            fprintf(rf, ",\"cause\":");
            json_string(rf, e->cause);
        }
        fprintf(rf, ",\"replicas\":%d,\"devices\":[%s],\"seconds\":%.6f}", e->replicas, devices,
                e->seconds);
        if (fclose(rf) != 0 || !rec) {
            free(rec);
            continue;
        }
        if (t->log) {
            fprintf(t->log, "%s\n", rec);
            fflush(t->log);
        }
        size_t need = t->el.len + rlen + 2;
        if (need > t->el.cap) {
            size_t cap = need > 2 * t->el.cap ? need : 2 * t->el.cap;
            char *g = realloc(t->el.json, cap);
            if (g) {
                t->el.json = g;
                t->el.cap = cap;
            }
        }
        if (need <= t->el.cap) {
            snprintf(t->el.json + t->el.len, t->el.cap - t->el.len, "%s%s", t->el.len ? "," : "",
                     rec);
            t->el.len += strlen(t->el.json + t->el.len);
        }
        free(rec);
    }
    free(all);
}

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

/* --bucket-mb auto: once it has chosen, say which. */
static void tell_bucket(trainer *t)
{
    int tuning = 0;
    size_t bytes = ch_dp_bucket_bytes(t->dp, &tuning);
    if (t->o->bucket_mb >= 0 || tuning || t->bd.said_bucket)
        return;
    t->bd.said_bucket = 1;
    if (!t->o->quiet)
        fprintf(stderr, "%schorus-train: --bucket-mb auto chose %zu MiB\n", t->shown ? "\n" : "",
                bytes >> 20);
    t->shown = 0;
}

/* The run's breakdown, on one line: the replica slowest most often, how
 * much of the step was reduction not hidden by backward, and loader
 * stalls. `json` as an object instead. */
static void breakdown_line(const trainer *t, FILE *f, int json)
{
    /* Counted by the replicas now (since the last one --elastic lost),
     * kept by --devices' index; a lost device keeps its times. */
    int64_t now[64] = {0}, slow[64] = {0}, calls = 0;
    int map[64], n = replicas_now(t, map), here[64] = {0};
    (void)ch_dp_slowest_counts(t->dp, now, n, &calls);
    for (int i = 0; i < n; i++) {
        slow[map[i]] = now[i];
        here[map[i]] = 1;
    }
    int worst = n > 0 ? map[0] : 0;
    for (int i = 0; i < t->ndev; i++)
        if (here[i] && slow[i] > slow[worst])
            worst = i;
    double steps = t->bd.step > 0.0 ? t->bd.step : 1.0;
    double all = t->bd.step + t->bd.stall > 0.0 ? t->bd.step + t->bd.stall : 1.0;
    if (!json) {
        /* Its parts, the most telling first, on one line (a terminal
         * wraps it: it is printed once, not redrawn). */
        static char part[3 + 64][160];
        int np = 0;
        if (n > 1 || g_ranks > 1)
            snprintf(part[np++], sizeof part[0], "%s slowest in %.0f%% of steps", t->label[worst],
                     calls ? 100.0 * (double)slow[worst] / (double)calls : 0.0);
        snprintf(part[np++], sizeof part[0],
                 "%.0f%% of the step is reduction not hidden by backward",
                 100.0 * t->bd.exposed / steps);
        snprintf(part[np++], sizeof part[0], "loader stalls %.0f%% of the time",
                 100.0 * t->bd.stall / all);
        for (int i = 0; i < t->ndev && np < 3 + 64; i++)
            snprintf(part[np++], sizeof part[0], "%s compute %.0f%% wait %.0f%%%s", t->label[i],
                     100.0 * t->bd.compute[i] / steps, 100.0 * t->bd.wait[i] / steps,
                     here[i] ? "" : " (lost)");
        fprintf(f, "breakdown: ");
        for (int k = 0; k < np; k++)
            fprintf(f, "%s%s", k ? "; " : "", part[k]);
        fprintf(f, "\n");
        return;
    }
    fprintf(f,
            ",\"breakdown\":{\"calls\":%lld,\"step_s\":%.6f,\"exposed_reduction_s\":%.6f,"
            "\"loader_stall_s\":%.6f,\"bucket_mb\":%zu,\"devices\":[",
            (long long)calls, t->bd.step, t->bd.exposed, t->bd.stall,
            ch_dp_bucket_bytes(t->dp, NULL) >> 20);
    for (int i = 0; i < t->ndev; i++)
        fprintf(f,
                "%s{\"id\":\"%s\",\"compute_s\":%.6f,\"wait_s\":%.6f,\"update_s\":%.6f,"
                "\"slowest_calls\":%lld%s}",
                i ? "," : "", t->label[i], t->bd.compute[i], t->bd.wait[i], t->bd.update[i],
                (long long)slow[i], here[i] ? "" : ",\"lost\":true");
    fprintf(f, "]}");
}

/* ---- Memory ------------------------------------------------------------------------- */

/* The devices trained on, each once, into t->mem_devs. */
static void memory_devices(trainer *t)
{
    t->nmem = 0;
    for (int i = 0; i < t->ndev; i++) {
        int seen = 0;
        for (int j = 0; j < t->nmem && !seen; j++)
            seen = t->mem_devs[j] == t->devs[i];
        if (!seen)
            t->mem_devs[t->nmem++] = t->devs[i];
    }
}

/* Training's peaks start here. */
static ch_status memory_reset(trainer *t)
{
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < t->nmem; i++)
        st = ch_device_reset_peak(t->mem_devs[i]);
    return st;
}

static ch_status memory_read(trainer *t)
{
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < t->nmem; i++)
        st = ch_device_memory_stats(t->mem_devs[i], &t->mem[i]);
    return st;
}

/* Each device's peak over training (and its limit), on one line in MiB,
 * or as the JSON object "memory" in bytes. */
static void memory_line(const trainer *t, FILE *f, int json)
{
    if (json) {
        fprintf(f, ",\"memory\":{");
        for (int i = 0; i < t->nmem; i++)
            fprintf(f,
                    "%s\"%s\":{\"peak_bytes\":%llu,\"peak_reserved_bytes\":%llu,"
                    "\"limit_bytes\":%llu}",
                    i ? "," : "", ch_device_id(t->mem_devs[i]),
                    (unsigned long long)t->mem[i].peak_bytes,
                    (unsigned long long)t->mem[i].peak_reserved_bytes,
                    (unsigned long long)t->mem[i].limit_bytes);
        fprintf(f, "}");
        return;
    }
    const double mib = 1024.0 * 1024.0;
    fprintf(f, "memory:");
    for (int i = 0; i < t->nmem; i++) {
        fprintf(f, "%s %s peak %.1f MiB", i ? ";" : "", ch_device_id(t->mem_devs[i]),
                (double)t->mem[i].peak_bytes / mib);
        if (t->mem[i].limit_bytes)
            fprintf(f, " of its %.1f MiB limit", (double)t->mem[i].limit_bytes / mib);
    }
    fprintf(f, "\n");
}

/* Under memory limits: each limited replica's micro-batches (their size,
 * and how many the last step took), and a replica left out. */
static void micro_line(const trainer *t, FILE *f)
{
    int size[64] = {0}, count[64] = {0}, out[64] = {0}, any = 0;
    int map[64], n = replicas_now(t, map);
    if (ch_dp_micro_batches(t->dp, size, count, out, n) != CH_OK)
        return;
    for (int i = 0; i < n; i++) {
        if (out[i]) {
            fprintf(f, "%s%s left out", any++ ? "; " : "micro-batches: ", t->label[map[i]]);
        } else if (size[i] > 0) {
            fprintf(f, "%s%s %d of up to %d sample%s",
                    any++ ? "; " : "micro-batches: ", t->label[map[i]], count[i], size[i],
                    size[i] == 1 ? "" : "s");
        }
    }
    if (any)
        fprintf(f, "\n");
    /* After --elastic's changes the note is the last of them, told as it
     * came (tell_changes). */
    if (ch_dp_note(t->dp)[0] && t->el.told == 0)
        fprintf(f, "chorus-train: %s\n", ch_dp_note(t->dp));
}

/* ---- The progress line's text (utils/progress.c draws it) --------------------------- */

static void device_parts(const trainer *t, char *out, size_t cap)
{
    int counts[64], map[64], n = replicas_now(t, map);
    double times[64];
    size_t len = 0;
    out[0] = '\0';
    /* --elastic lost a device: how many replicas train now. */
    if (n < t->ndev) {
        snprintf(out, cap, " | %d/%d replicas", n, t->ndev);
        len = strlen(out);
    }
    if (n < 2 || ch_dp_last_step(t->dp, counts, times, n) != CH_OK)
        return;
    for (int i = 0; i < n && len < cap; i++) {
        snprintf(out + len, cap - len, " | %s %d %.0fms", t->label[map[i]], counts[i],
                 1e3 * times[i]);
        len += strlen(out + len);
    }
}

/* The progress line's parts (utils/progress.h), redrawn in place. */
static void progress(trainer *t, int64_t epoch, int64_t batch, int64_t nbatches, float loss,
                     double rate, double left)
{
    if (t->o->quiet || !t->tty)
        return;
    line_parts p;
    p.done = (double)(batch + 1) / (double)nbatches;
    snprintf(p.text[PART_EPOCH], PART_MAX, "epoch %lld/%lld", (long long)epoch + 1,
             (long long)t->o->epochs);
    snprintf(p.text[PART_STEP], PART_MAX, "step %lld", (long long)t->step);
    if (t->o->lm && !isnan(t->val_loss))
        snprintf(p.text[PART_LOSS], PART_MAX, "loss %.4f val_loss %.4f", loss, t->val_loss);
    else
        snprintf(p.text[PART_LOSS], PART_MAX, "loss %.4f", loss);
    if (t->o->lm)
        snprintf(p.text[PART_RATE], PART_MAX, "%6.0f tokens/s", rate * t->o->gpt.context);
    else
        snprintf(p.text[PART_RATE], PART_MAX, "%6.0f samples/s", rate);
    snprintf(p.text[PART_LEFT], PART_MAX, "%4.0fs left", left);
    device_parts(t, p.text[PART_DEVICES], PART_MAX);
    progress_draw(&p, &t->shown);
}

static void log_step(const trainer *t, int64_t epoch, float loss, double rate)
{
    if (!t->log)
        return;
    int counts[64] = {0}, mb_size[64] = {0}, mb_count[64] = {0}, out[64] = {0};
    double times[64] = {0};
    /* The replicas now: fewer than --devices once --elastic lost one. */
    int map[64], n = replicas_now(t, map);
    (void)ch_dp_last_step(t->dp, counts, times, n); /* fails only for another n */
    (void)ch_dp_micro_batches(t->dp, mb_size, mb_count, out, n);
    int total = 0;
    for (int i = 0; i < n; i++)
        total += counts[i];
    /* JSON has no NaN or infinity: a diverged loss is null. */
    char lossv[32] = "null";
    if (isfinite(loss))
        snprintf(lossv, sizeof lossv, "%.6f", loss);
    fprintf(t->log, "{\"step\":%lld,\"epoch\":%lld,\"loss\":%s,\"samples_per_s\":%.1f,",
            (long long)t->step, (long long)epoch, lossv, rate);
    if (t->o->lm) {
        fprintf(t->log, "\"tokens_per_s\":%.1f,", rate * t->o->gpt.context);
        if (isfinite(t->val_loss))
            fprintf(t->log, "\"val_loss\":%.6f,", t->val_loss);
    }
    fprintf(t->log, "\"step_s\":%.6f,\"loader_stall_s\":%.6f,\"exposed_reduction_s\":%.6f,",
            t->bd.last[0].step, t->bd.last_stall, t->bd.last[0].exposed);
    if (t->o->elastic)
        fprintf(t->log, "\"replicas\":%d,", n);
    fprintf(t->log, "\"devices\":[");
    for (int i = 0; i < n; i++) {
        const ch_dp_breakdown *b = &t->bd.last[i];
        int d = map[i];
        fprintf(t->log, "%s{\"id\":\"%s\",\"samples\":%d,\"share\":%.4f,\"time_s\":%.6f",
                i ? "," : "", ch_device_id(t->devs[d]), counts[i],
                total ? (double)counts[i] / total : 0.0, times[i]);
        fprintf(t->log, ",\"compute_s\":%.6f,\"wait_s\":%.6f,\"update_s\":%.6f,\"slowest\":%s",
                b->compute, b->wait, b->update, b->slowest ? "true" : "false");
        if (t->sharing[d] > 1)
            fprintf(t->log, ",\"replicas_on_device\":%d", t->sharing[d]);
        /* Under a memory limit: its micro-batches' size and count. */
        if (mb_size[i] > 0)
            fprintf(t->log, ",\"micro_batch\":%d,\"micro_batches\":%d", mb_size[i], mb_count[i]);
        if (out[i])
            fprintf(t->log, ",\"left_out\":true");
        fprintf(t->log, "}");
    }
    fprintf(t->log, "]}\n");
}

/* ---- Batches of token windows (gpt) --------------------------------------------- */

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

/* One epoch from batch `first`; returns 1 in *stop when --max-steps is
 * reached, and in *next the batch to go on from. */
/* SIGINT and SIGTERM: the first asks training to stop after the current
 * step (with a checkpoint when --checkpoint is given) and exit 128 + the
 * signal; a second one ends the process at once. Both are blocked in
 * every thread from the start of main (the threads the library, OpenMP,
 * oneDNN and the drivers make inherit that) and taken by one thread of
 * our own with sigwait: a signal never lands on a compute thread. (One
 * landing asynchronously on a thread inside oneDNN's GEMM corrupted the
 * heap in about one run in five.) */
static volatile sig_atomic_t g_signal;
static sigset_t g_stop_set;

static void *signal_thread(void *arg)
{
    (void)arg;
    for (;;) {
        int signo = 0;
        if (sigwait(&g_stop_set, &signo) != 0)
            continue;
        if (g_signal)
            _exit(128 + signo);
        g_signal = signo;
    }
    return NULL;
}

/* Blocks SIGINT and SIGTERM in this thread (and so in every thread made
 * after) and starts the thread that waits for them; 0, or -1 when it
 * cannot (the signals then keep their default actions). */
static int catch_signals(void)
{
    sigemptyset(&g_stop_set);
    sigaddset(&g_stop_set, SIGINT);
    sigaddset(&g_stop_set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &g_stop_set, NULL) != 0)
        return -1;
    pthread_t t;
    pthread_attr_t attr;
    if (pthread_attr_init(&attr) != 0)
        goto unblock;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, signal_thread, NULL);
    pthread_attr_destroy(&attr);
    if (rc == 0)
        return 0;
unblock:
    pthread_sigmask(SIG_UNBLOCK, &g_stop_set, NULL);
    return -1;
}

/* The signal that stops training after this step, 0 for none; under
 * mpirun every process learns whether any got one, so that all stop at
 * the same step (SIGINT wins a tie: it is what a terminal sends). */
static int stop_signal(void)
{
    int mine = g_signal;
    if (g_ranks <= 1)
        return mine;
    double v[2] = {mine == SIGINT, mine == SIGTERM};
    if (ch_dist_sum(ch_dist_world(), v, 2) != CH_OK)
        return mine;
    return v[0] > 0 ? SIGINT : v[1] > 0 ? SIGTERM : 0;
}

static ch_status save_checkpoint(trainer *t, const ch_train_state *cs);

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
        if (st == CH_OK && ch_dp_pending(t->dp) == 0 && (t->signalled = stop_signal())) {
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

/* ---- Sampling from the trained model (gpt) ------------------------------------- */

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

/* One forward of replica 0 on the last `context` tokens of text[0, n):
 * the logits of the next token into *logits. */
static ch_status next_logits(trainer *t, const int32_t *text, int64_t n, float *logits)
{
    ch_module *m = ch_dp_replica(t->dp, 0);
    int64_t ctx = t->o->gpt.context, len = n < ctx ? n : ctx;
    int64_t shape[2] = {1, len}, vocab = t->o->gpt.vocab;
    ch_tensor *x = NULL, *row = NULL, *y = NULL;
    ch_status st = ch_tensor_new(&x, ch_module_device(m), CH_I32, 2, shape);
    if (st == CH_OK)
        st = ch_tensor_upload(x, text + n - len, (size_t)len * sizeof(int32_t));
    if (st == CH_OK)
        st = ch_module_forward(m, &y, x);
    if (st == CH_OK)
        st = ch_tensor_view(&row, y, len - 1, 1);
    if (st == CH_OK)
        st = ch_tensor_download(row, logits, (size_t)vocab * sizeof(float));
    ch_tensor_free(row);
    ch_tensor_free(x);
    return st;
}

/* --generate N: N tokens continuing --prompt, printed as they come (bytes
 * as text, shard tokens as numbers). */
static ch_status generate(trainer *t)
{
    const train_options *o = t->o;
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
    int bytes = ch_tokens_bytes(t->tok_train);
    ch_module *m = ch_dp_replica(t->dp, 0);
    ch_module_train(m, 0);
    printf("sample:\n%s", bytes ? o->prompt : "");
    for (int64_t i = 0; st == CH_OK && i < o->generate; i++) {
        st = next_logits(t, text, n, logits);
        uint32_t ctr[4] = {(uint32_t)i, (uint32_t)((uint64_t)i >> 32), 0x67656e, 0};
        ch_philox4x32(ctr, o->seed);
        double u = (ctr[0] >> 8) * (1.0 / 16777216.0);
        if (st == CH_OK) {
            int32_t tok = sample_token(logits, logits + o->gpt.vocab, o->gpt.vocab,
                                       o->temperature, o->top_k, u);
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
    /* A reduction these devices cannot do is the user's choice to change. */
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
            /* The reduction, or devices the memory limits cannot serve
             * (what --elastic cannot work with is refused before). */
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
    double rate = busy > 0 ? (double)samples / busy : 0.0;
    char ids[1024] = "";
    for (int i = 0; i < t->ndev; i++) {
        size_t len = strlen(ids);
        snprintf(ids + len, sizeof ids - len, "%s%s", i ? "," : "", ch_device_id(t->devs[i]));
    }
    if (g_ranks > 1) {
        /* Rank 0's devices, and how many processes trained. */
        size_t len = strlen(ids);
        snprintf(ids + len, sizeof ids - len, " ranks=%d", g_ranks);
    }
    /* --elastic: the replicas at the end when devices were lost (the
     * result line), and every change (--json). */
    char el[64] = "", *elj = NULL;
    size_t eljn = 0;
    if (o->elastic) {
        int n = ch_dp_replica_count(t->dp);
        if (t->el.told > 0)
            snprintf(el, sizeof el, " replicas=%d", n);
        FILE *jf = open_memstream(&elj, &eljn);
        if (jf) {
            fprintf(jf, ",\"replicas\":%d,\"changes\":[%s]", n, t->el.json ? t->el.json : "");
            if (fclose(jf) != 0) {
                free(elj);
                elj = NULL;
            }
        }
    }
    /* Mixed precision's words, after the others: the format and, for
     * fp16, the loss scale reached and the steps it skipped. */
    char mp[160] = "", mpj[160] = "";
    if (o->precision != CH_F32) {
        float scale = 1.0f;
        int64_t skipped = 0;
        (void)ch_dp_loss_scale(t->dp, &scale, NULL, &skipped);
        const char *name = o->precision == CH_BF16 ? "bf16" : "fp16";
        if (o->precision == CH_F16) {
            snprintf(mp, sizeof mp, " precision=%s loss_scale=%g skipped_steps=%lld", name,
                     scale, (long long)skipped);
            snprintf(mpj, sizeof mpj, ",\"precision\":\"%s\",\"loss_scale\":%g,"
                     "\"skipped_steps\":%lld", name, scale, (long long)skipped);
        } else {
            snprintf(mp, sizeof mp, " precision=%s", name);
            snprintf(mpj, sizeof mpj, ",\"precision\":\"%s\"", name);
        }
    }
    if (!o->quiet && t->bd.calls > 0)
        breakdown_line(t, stderr, 0);
    if (!o->quiet) {
        memory_line(t, stderr, 0);
        micro_line(t, stderr);
    }
    if (o->lm) {
        double tps = rate * o->gpt.context;
        if (o->json) {
            printf("{\"val_loss\":%.4f,\"val_accuracy\":%.4f,\"train_loss\":%.4f,"
                   "\"tokens_per_s\":%.1f,\"epochs\":%lld,\"devices\":\"%s\","
                   "\"steps\":%lld%s%s",
                   loss, acc, t->last_loss, tps, (long long)epoch, ids, (long long)t->step, mpj,
                   elj ? elj : "");
            breakdown_line(t, stdout, 1);
            memory_line(t, stdout, 1);
            printf("}\n");
        } else
            printf("result val_loss=%.4f val_accuracy=%.4f train_loss=%.4f tokens_per_s=%.1f "
                   "steps=%lld devices=%s%s%s\n",
                   loss, acc, t->last_loss, tps, (long long)t->step, ids, el, mp);
        fflush(stdout);
        free(elj);
        if (o->generate > 0 && generate(t) != CH_OK)
            return runtime_error("generation failed");
        return 0;
    }
    if (o->json) {
        printf("{\"test_accuracy\":%.4f,\"test_loss\":%.4f,\"samples_per_s\":%.1f,"
               "\"epochs\":%lld,\"devices\":\"%s\",\"steps\":%lld%s%s",
               acc, loss, rate, (long long)epoch, ids, (long long)t->step, mpj, elj ? elj : "");
        breakdown_line(t, stdout, 1);
        memory_line(t, stdout, 1);
        printf("}\n");
    } else
        printf("result test_accuracy=%.4f test_loss=%.4f samples_per_s=%.1f epochs=%lld "
               "devices=%s%s%s\n",
               acc, loss, rate, (long long)epoch, ids, el, mp);
    free(elj);
    return 0;
}

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
