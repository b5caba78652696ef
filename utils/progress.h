/* chorus-train's progress line: its parts, fitted to the terminal and
 * redrawn in place on stderr (utils/progress.c). utils/report.c writes
 * the parts' text; this file decides what a narrow terminal shows. */
#ifndef CHORUS_TRAIN_PROGRESS_H
#define CHORUS_TRAIN_PROGRESS_H

/* The parts, from the one a narrow terminal keeps longest to the one it
 * drops first. */
enum {
    PART_EPOCH,
    PART_LOSS,
    PART_LEFT,
    PART_BAR,
    PART_STEP,
    PART_RATE,
    PART_DEVICES,
    NPARTS
};

#define PART_MAX 5120 /* 64 devices' " | opencl:12#2 123456 1234ms" */

typedef struct line_parts {
    char text[NPARTS][PART_MAX]; /* each part but the bar; "" leaves it out */
    double done;                 /* the share of the epoch behind us, for the bar */
} line_parts;

/* Redraws the line: a carriage return, the parts fitted to the terminal
 * on stderr, and spaces over what the previous line left. *shown holds
 * the columns the previous line took (0: none on this line) and gets this
 * one's. */
void progress_draw(const line_parts *p, int *shown);

#endif
