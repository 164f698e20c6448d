/* The text view of a running job shared by slidedp-top (live, with ncurses, or --once) and
 * slidedp-stat's default output: a header with the job's numbers, a loss sparkline, one line per
 * worker rank and per optimizer process, and the pipeline overlap estimate. */
#ifndef SD_MONITOR_VIEW_H
#define SD_MONITOR_VIEW_H

#include <stdbool.h>

#include "monitor/monitor.h"

#define MON_FRAME_LINES (JOB_MAX_GPUS + CTL_MAX_OPTIM + 16)
#define MON_LINE_MAX 512

enum mon_line_kind {
    MON_LINE_TEXT,
    MON_LINE_TITLE,  /* the first line */
    MON_LINE_HEAD,   /* column headings */
    MON_LINE_NOTE,   /* the job ended, or other notices */
};

struct mon_frame {
    int n;
    struct {
        enum mon_line_kind kind;
        char text[MON_LINE_MAX]; /* at most `width` columns */
    } lines[MON_FRAME_LINES];
};

struct mon_view_opts {
    int width;       /* columns (at least 40 are used) */
    bool utf8;       /* block characters for the sparkline; ASCII otherwise */
    bool ended;      /* the job is gone: the frame shows its last state */
};

/* Renders the latest snapshot; rates come from the interval since `before` (a snapshot taken
 * earlier; the same one gives no rates). */
void mon_render(const struct mon *m, const struct mon_snapshot *before, const struct mon_snapshot *now,
                const struct mon_view_opts *opts, struct mon_frame *f);

/* One frame on stdout, its rates over the half second between two snapshots (slidedp-stat's text,
 * slidedp-top --once): `width` columns, utf8 as mon_view_opts says. 0, or -1 with sd_err. */
int mon_print_frame(const struct mon *m, int width, bool utf8);

#endif
