/* What chorus-train tells while and after it trains (utils/report.c):
 * on stderr, in --log and on stdout, from the trainer's state
 * (utils/trainer.h). */
#ifndef CHORUS_TRAIN_REPORT_H
#define CHORUS_TRAIN_REPORT_H

#include <chorus.h>
#include <stdint.h>

#include "trainer.h"

/* --elastic: what the dp lost or took back since the last call, told on
 * stderr, as an event line in --log and kept for --json's result.
 * `when`: "training" (in the step after t->step), "evaluation" (after
 * t->step) or "rejoin" (before the step after t->step). */
void tell_changes(trainer *t, const char *when);

/* --bucket-mb auto: once it has chosen, say which. */
void tell_bucket(trainer *t);

/* The progress line's parts (utils/progress.h), redrawn in place: batch
 * `batch` of `nbatches` in `epoch` done, at `rate` samples a second, with
 * `left` seconds of the epoch to go. Only on a terminal, and not --quiet. */
void progress(trainer *t, int64_t epoch, int64_t batch, int64_t nbatches, float loss, double rate,
              double left);

/* --log: the step's line, a JSON object (its loss, rates, where its time
 * went, and each replica's share of the batch). */
void log_step(const trainer *t, int64_t epoch, float loss, double rate);

/* The devices trained on, each once, into t->mem_devs. */
void memory_devices(trainer *t);

/* Training's peaks start here. */
ch_status memory_reset(trainer *t);

/* Each device's memory, its peaks since memory_reset, into t->mem. */
ch_status memory_read(trainer *t);

/* The end of a run, on rank 0: unless --quiet, the step's breakdown, the
 * memory peaks (memory_read first) and the micro-batches on stderr; then
 * the result on stdout, a line or --json's object. `acc` and `loss` are
 * the evaluation's, `rate` the training samples a second over `epoch`
 * epochs. */
void print_result(const trainer *t, double acc, double loss, int64_t epoch, double rate);

#endif
