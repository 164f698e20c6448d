/* Renders the text view of a job (see monitor_view.h). */
#include "monitor_view.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"

#define BAR_CELLS 20
#define SPARK_MAX JOB_STATS_HISTORY

/* Appends a line, cut to `width` columns (UTF-8 continuation bytes take no column). */
__attribute__((format(printf, 4, 5))) static void add(struct mon_frame *f, int width, enum mon_line_kind kind,
                                                      const char *fmt, ...)
{
    if (f->n == MON_FRAME_LINES)
        return;
    char *t = f->lines[f->n].text;
    f->lines[f->n++].kind = kind;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t, MON_LINE_MAX, fmt, ap);
    va_end(ap);
    int cols = 0;
    for (char *p = t; *p; p++) {
        if (((unsigned char)*p & 0xc0) == 0x80)
            continue;
        if (cols++ == width) {
            *p = 0;
            break;
        }
    }
}

/* 1234 -> "1.23 k", with the unit after the prefix ("1.23 kB/s"). */
static const char *si(char *buf, size_t len, double x, const char *unit)
{
    const char *prefix[] = {"", "k", "M", "G", "T", "P"};
    int i = 0;
    while (x >= 999.5 && i < 5) {
        x /= 1000;
        i++;
    }
    int n = snprintf(buf, len, x >= 99.95 || i == 0 ? "%.0f %s%s" : "%.2f %s%s", x, prefix[i], unit);
    if (n > 0 && (size_t)n < len && buf[n - 1] == ' ')
        buf[n - 1] = 0;
    return buf;
}

static void duration(char *buf, size_t len, double s)
{
    long t = (long)s;
    snprintf(buf, len, "%02ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

/* `[####....    ]`: work share as '#', wait share as '.', the rest blank. */
static void share_bar(char *buf, double work, double wait)
{
    int w = (int)(work * BAR_CELLS + 0.5), q = (int)((work + wait) * BAR_CELLS + 0.5);
    q = q > BAR_CELLS ? BAR_CELLS : q;
    buf[0] = '[';
    for (int i = 0; i < BAR_CELLS; i++)
        buf[1 + i] = i < w ? '#' : i < q ? '.' : ' ';
    buf[BAR_CELLS + 1] = ']';
    buf[BAR_CELLS + 2] = 0;
}

/* The loss of the last steps still in the history, averaged into at most `cols` columns; on a log
 * scale (*log_scale) when it spans more than two decades, which a linear one flattens. Returns the
 * columns drawn. */
static int sparkline(char *out, size_t len, const struct mon_snapshot *s, uint32_t first_step, int cols, bool utf8,
                      double *lo, double *hi, uint32_t *from, bool *log_scale)
{
    static const char *const blocks[] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                         "\u2585", "\u2586", "\u2587", "\u2588"};
    static const char ascii[] = "_.-:=+*#";
    const struct job_stats *st = &s->stats;
    uint32_t k0 = mon_history_first(st, first_step);
    *from = k0;
    int points = (int)(st->step - k0 + 1);
    cols = cols < points ? cols : points;
    cols = cols < SPARK_MAX ? cols : SPARK_MAX;
    double v[SPARK_MAX];
    *lo = 1e300;
    *hi = -1e300;
    for (int c = 0; c < cols; c++) {
        /* column c averages steps [a, b) of the window */
        int a = (int)((int64_t)c * points / cols), b = (int)((int64_t)(c + 1) * points / cols);
        double sum = 0;
        for (int i = a; i < b; i++)
            sum += st->loss_history[(k0 + (uint32_t)i) % JOB_STATS_HISTORY];
        v[c] = sum / (b - a);
        *lo = v[c] < *lo ? v[c] : *lo;
        *hi = v[c] > *hi ? v[c] : *hi;
    }
    *log_scale = *lo > 0 && *hi > 100 * *lo;
    double a = *log_scale ? log10(*lo) : *lo, b = *log_scale ? log10(*hi) : *hi;
    size_t n = 0;
    out[0] = 0;
    int drawn = 0;
    for (int c = 0; c < cols; c++) {
        double x = *log_scale ? log10(v[c]) : v[c];
        int level = b > a ? (int)((x - a) / (b - a) * 7 + 0.5) : 3;
        const char *sym = utf8 ? blocks[level] : (char[2]){ascii[level], 0};
        size_t sl = strlen(sym);
        if (n + sl + 1 > len)
            break;
        memcpy(out + n, sym, sl + 1);
        n += sl;
        drawn++;
    }
    return drawn;
}

static void render_header(const struct mon *m, const struct mon_snapshot *now, const struct mon_view_opts *o,
                          struct mon_frame *f)
{
    const struct ctl_header *h = m->h;
    const struct job_stats *st = &now->stats;
    char a[32], b[32], c[64], up[32];
    const char *status = o->ended ? "ended" : now->stop ? "stopping" : now->stalled ? "stalled" : "running";
    duration(up, sizeof up, (double)(now->t_ns - h->created_ns) / 1e9);
    add(f, o->width, MON_LINE_TITLE, "slidedp  job %s  pid %d  %s  %s %s params  %s x%d, %d optimizer%s  up %s",
        m->name, now->launcher_pid, status, h->model.architecture, si(a, sizeof a, (double)h->num_params, ""),
        h->job.device == DEVICE_CPU ? "cpu" : "cuda", h->gpus, h->optim_procs, h->optim_procs == 1 ? "" : "s", up);
    if (st->step == 0) {
        add(f, o->width, MON_LINE_TEXT, "step 0/%d  waiting for the first step  (workers ready %u/%d)", h->job.steps,
            atomic_load(&h->workers_ready), h->gpus);
    } else {
        char mfu[32] = "-";
        if (st->mfu > 0)
            snprintf(mfu, sizeof mfu, "%.2f%%", 100 * st->mfu);
        add(f, o->width, MON_LINE_TEXT,
            "step %u/%d (%.0f%%)  loss %.4f  lr %.2e  grad norm %.3f  tok/s %s  tokens %s  MFU %s", st->step,
            h->job.steps, 100.0 * st->step / h->job.steps, st->loss, st->lr, st->grad_norm,
            si(b, sizeof b, st->tok_s, ""), si(a, sizeof a, (double)st->tokens_total, ""), mfu);
    }
    char val[96] = "val -";
    if (st->val_loss > 0)
        snprintf(val, sizeof val, "val loss %.4f  val acc %.2f%%", st->val_loss, 100 * st->val_acc);
    if (st->predicted_step_s > 0)
        snprintf(c, sizeof c, "%.3f s predicted (measured %.2fx)", st->predicted_step_s,
                 st->step_s / st->predicted_step_s);
    else
        snprintf(c, sizeof c, "no prediction");
    add(f, o->width, MON_LINE_TEXT, "step time %.3f s measured, %s  %s", st->step_s, c, val);
    if (st->step > 0) {
        char spark[SPARK_MAX * 4], label[96];
        double lo, hi;
        uint32_t from;
        bool log_scale;
        /* the sparkline takes what the label leaves of the line (the label's numbers depend on the
         * columns averaged, so narrow until both fit) */
        int cols = o->width - 40;
        for (int tries = 0; tries < 4; tries++) {
            cols = cols > 8 ? cols : 8;
            /* bytes too: a UTF-8 column takes 3 of the line's MON_LINE_MAX */
            int drawn = sparkline(spark, MON_LINE_MAX - sizeof label - 8, now, (uint32_t)h->first_step, cols, o->utf8,
                                  &lo, &hi, &from, &log_scale);
            snprintf(label, sizeof label, "%.4g..%.4g%s (steps %u-%u)", lo, hi, log_scale ? " log" : "", from,
                     st->step);
            int over = (int)strlen("loss ") + drawn + 2 + (int)strlen(label) - o->width;
            if (over <= 0 || cols == 8)
                break;
            cols = drawn - over;
        }
        add(f, o->width, MON_LINE_TEXT, "loss %s  %s", spark, label);
    }
}

static void render_workers(const struct mon *m, const struct mon_snapshot *before, const struct mon_snapshot *now,
                           double dt, const struct mon_view_opts *o, struct mon_frame *f, double *wait_sum)
{
    char a[32], b[32], bar[BAR_CELLS + 3], chunk[24];
    add(f, o->width, MON_LINE_HEAD, "%4s  %-8s %-12s %-13s %6s %7s  %-12s %-12s %5s %5s  %s", "RANK", "PID", "DEVICE",
        "PHASE", "STEP", "CHUNK", "H2D", "D2H", "WORK", "WAIT", "#work .wait");
    for (int r = 0; r < now->gpus; r++) {
        const struct mon_proc *p = &now->workers[r];
        struct mon_rates rt;
        mon_proc_rates(&before->workers[r], p, dt, true, &rt);
        *wait_sum += rt.wait;
        share_bar(bar, rt.work, rt.wait);
        if (p->chunk >= 0 && p->chunk < m->h->num_chunks)
            snprintf(chunk, sizeof chunk, "%d/%d", p->chunk + 1, m->h->num_chunks);
        else
            snprintf(chunk, sizeof chunk, "-");
        add(f, o->width, MON_LINE_TEXT, "%4d  %-8d %-12.12s %-13s %6u %7s  %-12s %-12s %4.0f%% %4.0f%%  %s", r, p->pid,
            p->device, p->stalled ? "stalled" : mon_phase_name(p->phase), p->step, chunk, si(a, sizeof a, rt.in_bps, "B/s"),
            si(b, sizeof b, rt.out_bps, "B/s"), 100 * rt.work, 100 * rt.wait, bar);
    }
}

static void render_optims(const struct mon_snapshot *before, const struct mon_snapshot *now, double dt,
                          const struct mon_view_opts *o, struct mon_frame *f, double *busy_sum)
{
    char a[32], b[32], bar[BAR_CELLS + 3];
    add(f, o->width, MON_LINE_HEAD, "%4s  %-8s %-12s %-13s %6s  %-12s %-16s %5s %5s  %s", "OPT", "PID", "DEVICE",
        "PHASE", "STEP", "REDUCE", "UPDATE", "BUSY", "WAIT", "#busy .wait");
    for (int k = 0; k < now->optim_procs; k++) {
        const struct mon_proc *p = &now->optims[k];
        struct mon_rates rt;
        mon_proc_rates(&before->optims[k], p, dt, false, &rt);
        *busy_sum += rt.work;
        share_bar(bar, rt.work, rt.wait);
        /* bytes_out counts the bf16 copies published: two bytes per parameter updated */
        add(f, o->width, MON_LINE_TEXT, "%4d  %-8d %-12.12s %-13s %6u  %-12s %-16s %4.0f%% %4.0f%%  %s", k, p->pid,
            p->device, p->stalled ? "stalled" : mon_phase_name(p->phase), p->step, si(a, sizeof a, rt.in_bps, "B/s"),
            si(b, sizeof b, rt.out_bps / 2, "param/s"), 100 * rt.work, 100 * rt.wait, bar);
    }
}

void mon_render(const struct mon *m, const struct mon_snapshot *before, const struct mon_snapshot *now,
                const struct mon_view_opts *opts, struct mon_frame *f)
{
    struct mon_view_opts o = *opts;
    o.width = o.width < 40 ? 40 : o.width > MON_LINE_MAX / 2 ? MON_LINE_MAX / 2 : o.width;
    f->n = 0;
    double dt = (double)(now->t_ns - before->t_ns) / 1e9;
    render_header(m, now, &o, f);
    add(f, o.width, MON_LINE_TEXT, "%s", "");
    double wait_sum = 0, busy_sum = 0;
    render_workers(m, before, now, dt, &o, f, &wait_sum);
    add(f, o.width, MON_LINE_TEXT, "%s", "");
    render_optims(before, now, dt, &o, f, &busy_sum);
    add(f, o.width, MON_LINE_TEXT, "%s", "");
    if (dt > 0) {
        double wait = wait_sum / now->gpus;
        add(f, o.width, MON_LINE_TEXT,
            "pipeline overlap %.0f%%: workers waited %.0f%% of the last %.1f s for weights or gradient slots; "
            "optimizers busy %.0f%%",
            100 * (1 - wait), 100 * wait, dt, 100 * busy_sum / now->optim_procs);
    } else {
        add(f, o.width, MON_LINE_TEXT, "pipeline overlap: needs two snapshots");
    }
    if (o.ended)
        add(f, o.width, MON_LINE_NOTE, "the job has ended; this is its last state");
}

int mon_print_frame(const struct mon *m, int width, bool utf8)
{
    struct mon_snapshot *a = malloc(sizeof *a), *b = malloc(sizeof *b);
    struct mon_frame *f = malloc(sizeof *f);
    int rc = a && b && f ? mon_snapshot(m, a) : sd_err("out of memory");
    if (rc == 0) {
        /* rates need an interval */
        nanosleep(&(struct timespec){0, 500000000L}, NULL);
        rc = mon_snapshot(m, b);
    }
    if (rc == 0) {
        struct mon_view_opts o = {.width = width, .utf8 = utf8, .ended = !mon_job_running(m)};
        mon_render(m, a, b, &o, f);
        for (int i = 0; i < f->n; i++)
            printf("%s\n", f->lines[i].text);
    }
    free(a);
    free(b);
    free(f);
    return rc;
}
