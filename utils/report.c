/* What chorus-train tells while and after it trains: the progress line's
 * text (utils/progress.c fits it to the terminal), --log's line per step,
 * --elastic's changes and --bucket-mb auto's choice as they come, and at
 * the end the step's breakdown, the devices' memory peaks, the
 * micro-batches and the result (a line, or --json's object). */
#include "config.h"

#include <chorus.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "progress.h"
#include "report.h"
#include "trainer.h"

/* ---- As training goes: --elastic's changes, --bucket-mb auto's choice ----------- */

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

void tell_changes(trainer *t, const char *when)
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

void tell_bucket(trainer *t)
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

/* ---- Each step: the progress line's text (utils/progress.c draws it), --log ----- */

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

void progress(trainer *t, int64_t epoch, int64_t batch, int64_t nbatches, float loss, double rate,
              double left)
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

void log_step(const trainer *t, int64_t epoch, float loss, double rate)
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

/* ---- The devices' memory peaks over training ------------------------------------ */

void memory_devices(trainer *t)
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

ch_status memory_reset(trainer *t)
{
    ch_status st = CH_OK;
    for (int i = 0; st == CH_OK && i < t->nmem; i++)
        st = ch_device_reset_peak(t->mem_devs[i]);
    return st;
}

ch_status memory_read(trainer *t)
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

/* ---- At the end: the breakdown, the micro-batches, the result ------------------- */

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

void print_result(const trainer *t, double acc, double loss, int64_t epoch, double rate)
{
    const train_options *o = t->o;
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
            snprintf(mp, sizeof mp, " precision=%s loss_scale=%g skipped_steps=%lld", name, scale,
                     (long long)skipped);
            snprintf(mpj, sizeof mpj,
                     ",\"precision\":\"%s\",\"loss_scale\":%g,"
                     "\"skipped_steps\":%lld",
                     name, scale, (long long)skipped);
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
    } else if (o->json) {
        printf("{\"test_accuracy\":%.4f,\"test_loss\":%.4f,\"samples_per_s\":%.1f,"
               "\"epochs\":%lld,\"devices\":\"%s\",\"steps\":%lld%s%s",
               acc, loss, rate, (long long)epoch, ids, (long long)t->step, mpj, elj ? elj : "");
        breakdown_line(t, stdout, 1);
        memory_line(t, stdout, 1);
        printf("}\n");
    } else {
        printf("result test_accuracy=%.4f test_loss=%.4f samples_per_s=%.1f epochs=%lld "
               "devices=%s%s%s\n",
               acc, loss, rate, (long long)epoch, ids, el, mp);
    }
    free(elj);
}
