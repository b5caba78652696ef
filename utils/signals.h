/* chorus-train's SIGINT and SIGTERM (utils/signals.c): the first asks
 * training to stop after the current step (with a checkpoint when
 * --checkpoint is given) and exit 128 + the signal; a second one ends the
 * process at once. */
#ifndef CHORUS_TRAIN_SIGNALS_H
#define CHORUS_TRAIN_SIGNALS_H

/* Blocks SIGINT and SIGTERM in this thread (and so in every thread made
 * after) and starts the thread that waits for them; 0, or -1 when it
 * cannot (the signals then keep their default actions). Called first in
 * main, before any other thread exists. */
int catch_signals(void);

/* The signal that stops training after this step, 0 for none. In a job of
 * `ranks` processes (under mpirun) a collective: every process learns
 * whether any got one, so that all stop at the same step (SIGINT wins a
 * tie: it is what a terminal sends). */
int stop_signal(int ranks);

#endif
