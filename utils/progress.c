/* chorus-train's progress line (utils/progress.h): the parts fitted to
 * the terminal's width, redrawn in place. */
#include "config.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "progress.h"
#include "train-options.h"

/* What a terminal too narrow for the line gives up, in turn: -1 narrows the
 * bar, a part number drops that part. */
static const int fit_moves[] = {PART_DEVICES, -1,        PART_RATE, PART_STEP,
                                PART_BAR,     PART_LEFT, PART_LOSS};

#define BAR_WIDTH 30
#define BAR_MIN 10

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
    if (env && train_parse_int(env, 1, &v) && v <= 100000)
        return (int)v;
    return 80;
}

void progress_draw(const line_parts *p, int *shown)
{
    char line[sizeof p->text];
    /* The last column stays empty: a line that fills it wraps at once on
     * some terminals. */
    int width = terminal_columns() - 1;
    int len = fit(line, sizeof line, p, width);
    int pad = *shown < width ? *shown - len : width - len;
    fprintf(stderr, "\r%s%*s", line, pad > 0 ? pad : 0, "");
    fflush(stderr);
    *shown = len;
}
