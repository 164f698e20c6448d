/* metrics.jsonl to SVG (see metrics_plot.h): four panels in a 2 x 2 grid, each with a frame, grid
 * lines at "nice" ticks, tick labels, axis names and its series as polylines. */
#include "metrics_plot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"

#define FIG_W 960
#define FIG_H 700
#define PANEL_W 480
#define PANEL_H 320
#define TOP 50          /* figure title band */
#define MARGIN_L 72     /* room for y tick labels */
#define MARGIN_R 20
#define MARGIN_T 34     /* panel title */
#define MARGIN_B 46     /* x tick labels and axis name */
#define MAX_POINTS 1000 /* per series; longer runs are averaged into this many points */

enum series { S_LOSS, S_VAL_LOSS, S_LR, S_TOK_S, S_STEP_S, S_COUNT };

struct xy {
    double *x, *y;
    int n, cap;
};

static const char *const series_key[S_COUNT] = {"loss", "val_loss", "lr", "tok_s", "step_s"};

static int push(struct xy *s, double x, double y)
{
    if (s->n == s->cap) {
        int cap = s->cap ? 2 * s->cap : 256;
        double *nx = realloc(s->x, (size_t)cap * sizeof *nx);
        if (!nx)
            return sd_err("out of memory");
        s->x = nx;
        double *ny = realloc(s->y, (size_t)cap * sizeof *ny);
        if (!ny)
            return sd_err("out of memory");
        s->y = ny;
        s->cap = cap;
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
    return 0;
}

/* One metrics line: step and the required series; val_loss only on validation steps. */
static int parse_line(const char *path, int lineno, const char *line, struct xy *s)
{
    cJSON *o = cJSON_Parse(line);
    if (!o)
        return sd_err("%s:%d: not a JSON object", path, lineno);
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(o, "step");
    int rc = cJSON_IsNumber(step) ? 0 : sd_err("%s:%d: no numeric \"step\"", path, lineno);
    for (int k = 0; k < S_COUNT && rc == 0; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, series_key[k]);
        if (cJSON_IsNumber(v))
            rc = push(&s[k], step->valuedouble, v->valuedouble);
        else if (k != S_VAL_LOSS && !cJSON_IsNull(v)) /* null: not finite (a job stopped on it); no point */
            rc = sd_err("%s:%d: no numeric \"%s\"", path, lineno, series_key[k]);
    }
    cJSON_Delete(o);
    return rc;
}

static int read_metrics(const char *path, struct xy *s)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return sd_err("cannot read %s: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) > 0) {
        lineno++;
        if (line[len - 1] != '\n')
            break; /* the launcher is writing this line */
        if (len > 1)
            rc = parse_line(path, lineno, line, s);
    }
    free(line);
    fclose(f);
    if (rc == 0 && s[S_LOSS].n == 0)
        return sd_err("%s has no completed step yet", path);
    return rc;
}

/* A tick spacing of 1, 2 or 5 times a power of ten giving about `target` intervals. */
static double nice_step(double range, int target)
{
    double raw = range / target, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

static void tick_label(char *buf, size_t len, double v)
{
    double a = fabs(v);
    if (a >= 1e6)
        snprintf(buf, len, "%gM", v / 1e6);
    else if (a >= 1e4)
        snprintf(buf, len, "%gk", v / 1e3);
    else
        snprintf(buf, len, "%.4g", v);
}

static void xml_text(FILE *f, const char *s)
{
    for (; *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

struct axis {
    double lo, hi, step; /* in log10 units when log */
    bool log;
};

/* From zero (every plotted metric is non-negative) to a tick at or above the largest value. */
static struct axis linear_axis(double max)
{
    struct axis a = {0, max > 0 ? max : 1, 0, false};
    a.step = nice_step(a.hi, 5);
    a.hi = ceil(a.hi / a.step - 1e-9) * a.step;
    return a;
}

/* Whole decades around [min, max] (both positive). */
static struct axis log_axis(double min, double max)
{
    struct axis a = {floor(log10(min)), ceil(log10(max)), 1, true};
    if (a.hi == a.lo)
        a.hi += 1;
    return a;
}

static double axis_pos(const struct axis *a, double v)
{
    return ((a->log ? log10(v) : v) - a->lo) / (a->hi - a->lo);
}

static double tick_value(const struct axis *a, int i)
{
    double t = a->lo + i * a->step;
    return a->log ? pow(10, t) : t;
}

struct panel {
    double x0, y0, w, h; /* plot area in figure coordinates */
    struct axis ax, ay;
};

static double px(const struct panel *p, double x)
{
    return p->x0 + axis_pos(&p->ax, x) * p->w;
}

static double py(const struct panel *p, double y)
{
    return p->y0 + p->h - axis_pos(&p->ay, y) * p->h;
}

static void draw_frame(FILE *f, const struct panel *p, const char *title, const char *ylabel)
{
    char buf[64];
    fprintf(f, "<g class=\"axes\">\n");
    for (int i = 0; i * p->ay.step <= p->ay.hi - p->ay.lo + 1e-12; i++) {
        double v = tick_value(&p->ay, i), y = py(p, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", p->x0, y,
                p->x0 + p->w, y);
        tick_label(buf, sizeof buf, v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", p->x0 - 6, y + 4, buf);
    }
    for (int i = 0; i * p->ax.step <= p->ax.hi - p->ax.lo + 1e-12; i++) {
        double v = tick_value(&p->ax, i), x = px(p, v);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e4e4e4\"/>\n", x, p->y0, x,
                p->y0 + p->h);
        tick_label(buf, sizeof buf, v);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", x, p->y0 + p->h + 16, buf);
    }
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", p->x0,
            p->y0, p->w, p->h);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", p->x0 + p->w / 2,
            p->y0 + p->h + 36);
    fprintf(f, "<text transform=\"translate(%.1f %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            p->x0 - 56, p->y0 + p->h / 2, ylabel);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">%s</text>\n",
            p->x0 + p->w / 2, p->y0 - 12, title);
    fprintf(f, "</g>\n");
}

/* The series as a polyline, averaged into at most MAX_POINTS points; dots mark sparse series. */
static void draw_series(FILE *f, const struct panel *p, const struct xy *s, const char *color, bool dots)
{
    int points = s->n < MAX_POINTS ? s->n : MAX_POINTS;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\" stroke-linejoin=\"round\" points=\"",
            color);
    for (int c = 0; c < points; c++) {
        int a = (int)((int64_t)c * s->n / points), b = (int)((int64_t)(c + 1) * s->n / points);
        double x = 0, y = 0;
        for (int i = a; i < b; i++) {
            x += s->x[i];
            y += s->y[i];
        }
        fprintf(f, "%s%.1f,%.1f", c ? " " : "", px(p, x / (b - a)), py(p, y / (b - a)));
    }
    fprintf(f, "\"/>\n");
    for (int i = 0; dots && i < s->n; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", px(p, s->x[i]), py(p, s->y[i]), color);
}

static void legend(FILE *f, const struct panel *p, int row, const char *color, const char *label)
{
    double x = p->x0 + p->w - 120, y = p->y0 + 16 + 18 * row;
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"/>\n", x,
            y - 4, x + 22, y - 4, color);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\">%s</text>\n", x + 28, y, label);
}

static double series_max(const struct xy *s)
{
    double m = 0;
    for (int i = 0; i < s->n; i++)
        m = s->y[i] > m ? s->y[i] : m;
    return m;
}

/* Whether every value is positive; *min gets the smallest (+inf for no values). */
static bool series_positive(const struct xy *s, double *min)
{
    *min = INFINITY;
    for (int i = 0; i < s->n; i++) {
        if (!(s->y[i] > 0))
            return false;
        *min = s->y[i] < *min ? s->y[i] : *min;
    }
    return true;
}

static struct panel make_panel(int col, int row, double last_step, struct axis ay)
{
    struct panel p = {
        .x0 = col * PANEL_W + MARGIN_L,
        .y0 = TOP + row * PANEL_H + MARGIN_T,
        .w = PANEL_W - MARGIN_L - MARGIN_R,
        .h = PANEL_H - MARGIN_T - MARGIN_B,
        .ax = linear_axis(last_step),
        .ay = ay,
    };
    return p;
}

static void write_svg(FILE *f, const char *title, const struct xy *s)
{
    double last = s[S_LOSS].x[s[S_LOSS].n - 1];
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
               "font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\" fill=\"#222\">\n",
            FIG_W, FIG_H, FIG_W, FIG_H);
    fprintf(f, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"%d\" y=\"26\" text-anchor=\"middle\" font-size=\"17\" font-weight=\"bold\">", FIG_W / 2);
    xml_text(f, title);
    fprintf(f, "</text>\n");

    const struct xy *loss = &s[S_LOSS], *val = &s[S_VAL_LOSS];
    fprintf(f, "<text x=\"%d\" y=\"48\" text-anchor=\"middle\" fill=\"#555\">%d steps, last loss %.4g", FIG_W / 2,
            loss->n, loss->y[loss->n - 1]);
    if (val->n > 0)
        fprintf(f, ", last val loss %.4g", val->y[val->n - 1]);
    fprintf(f, "</text>\n");

    double loss_max = fmax(series_max(loss), series_max(val)), loss_min, val_min = INFINITY;
    bool positive = series_positive(loss, &loss_min) && series_positive(val, &val_min);
    loss_min = fmin(loss_min, val_min);
    /* a log scale once the loss spans more than two decades, which a linear one flattens */
    struct axis ay = positive && loss_max / loss_min > 100 ? log_axis(loss_min, loss_max) : linear_axis(loss_max);
    struct panel p = make_panel(0, 0, last, ay);
    draw_frame(f, &p, "Loss", ay.log ? "cross-entropy (log scale)" : "cross-entropy");
    draw_series(f, &p, loss, "#1f77b4", false);
    legend(f, &p, 0, "#1f77b4", "train loss");
    if (val->n > 0) {
        draw_series(f, &p, val, "#ff7f0e", true);
        legend(f, &p, 1, "#ff7f0e", "val loss");
    }
    p = make_panel(1, 0, last, linear_axis(series_max(&s[S_LR])));
    draw_frame(f, &p, "Learning rate", "lr");
    draw_series(f, &p, &s[S_LR], "#2ca02c", false);
    p = make_panel(0, 1, last, linear_axis(series_max(&s[S_TOK_S])));
    draw_frame(f, &p, "Throughput", "tokens/s");
    draw_series(f, &p, &s[S_TOK_S], "#9467bd", false);
    p = make_panel(1, 1, last, linear_axis(series_max(&s[S_STEP_S])));
    draw_frame(f, &p, "Step time", "seconds");
    draw_series(f, &p, &s[S_STEP_S], "#d62728", false);
    fprintf(f, "</svg>\n");
}

int metrics_plot(const char *metrics_path, const char *title, const char *svg_path)
{
    struct xy s[S_COUNT] = {0};
    int rc = read_metrics(metrics_path, s);
    if (rc == 0) {
        char tmp[4200];
        snprintf(tmp, sizeof tmp, "%s.tmp", svg_path);
        FILE *f = fopen(tmp, "w");
        if (!f) {
            rc = sd_err("cannot write %s: %s", tmp, strerror(errno));
        } else {
            write_svg(f, title, s);
            bool ok = !ferror(f);
            ok = fclose(f) == 0 && ok;
            if (!ok || rename(tmp, svg_path) != 0) {
                rc = sd_err("cannot write %s: %s", svg_path, strerror(errno));
                remove(tmp);
            }
        }
    }
    for (int k = 0; k < S_COUNT; k++) {
        free(s[k].x);
        free(s[k].y);
    }
    return rc;
}
