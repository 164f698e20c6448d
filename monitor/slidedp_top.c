/* slidedp-top: a live view of a running job in the terminal (ncurses, about four frames a second;
 * q quits), or with --once one frame as plain text on stdout. It maps the job's ctl object
 * read-only, so attaching and detaching never disturb the job. */
#include <curses.h>
#include <langinfo.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/version.h"
#include "monitor/monitor.h"
#include "monitor/monitor_view.h"

#define PROG "slidedp-top"
#define FRAME_MS 250
#define RATE_FRAMES 8 /* rates span the last two seconds */
#define ONCE_WIDTH 120

static int usage(FILE *f)
{
    fprintf(f, "usage: %s [JOB] [--once]\n"
               "       %s --version | --help\n"
               "A live view of a running job, attached read-only to its shared memory.\n"
               "  JOB: a job name (listed when several run), its log.dir, or its job.ini followed by the\n"
               "  section.key=value overrides it was launched with (from the same directory: an override's\n"
               "  relative path starts at the current directory, a path inside job.ini at job.ini's folder);\n"
               "  default: the only running job\n"
               "  --once: print one frame as plain text and exit\n"
               "  --version: print the version and the backends of this build\n"
               "  --help, -h: this text\n",
            PROG, PROG);
    return f == stdout ? 0 : 2;
}

static int terminal_width(void)
{
    struct winsize ws;
    return isatty(1) && ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 ? ws.ws_col : ONCE_WIDTH;
}

static void draw(const struct mon_frame *f)
{
    erase();
    int rows = LINES - 1;
    for (int i = 0; i < f->n && i < rows; i++) {
        int attr = f->lines[i].kind == MON_LINE_TITLE  ? A_BOLD
                   : f->lines[i].kind == MON_LINE_HEAD ? A_REVERSE
                   : f->lines[i].kind == MON_LINE_NOTE ? A_BOLD
                                                       : A_NORMAL;
        attron(attr);
        mvaddstr(i, 0, f->lines[i].text);
        attroff(attr);
    }
    attron(A_DIM);
    mvaddstr(LINES - 1, 0, "q quit");
    attroff(A_DIM);
    refresh();
}

/* The live view. Once the job has ended, its last state stays on screen until q. */
static int run_live(const struct mon *m, bool utf8)
{
    struct mon_snapshot *ring = calloc(RATE_FRAMES, sizeof *ring);
    struct mon_frame *f = malloc(sizeof *f);
    if (!ring || !f) {
        free(ring);
        free(f);
        return sd_err("out of memory");
    }
    initscr();
    cbreak();
    noecho();
    curs_set(0);
    keypad(stdscr, TRUE);
    timeout(FRAME_MS);
    int rc = 0, taken = 0;
    bool ended = false;
    const struct mon_snapshot *now = NULL, *before = NULL;
    for (;;) {
        if (!ended) {
            ended = !mon_job_running(m);
            struct mon_snapshot *s = &ring[taken % RATE_FRAMES];
            if (mon_snapshot(m, s) != 0) {
                rc = -1;
                break;
            }
            taken++;
            now = s;
            /* rates over the oldest snapshot kept */
            before = &ring[taken < RATE_FRAMES ? 0 : taken % RATE_FRAMES];
        }
        struct mon_view_opts o = {.width = COLS, .utf8 = utf8, .ended = ended};
        mon_render(m, before, now, &o, f);
        draw(f);
        int ch = getch();
        if (ch == 'q' || ch == 'Q')
            break;
    }
    endwin();
    free(ring);
    free(f);
    return rc;
}

int main(int argc, char **argv)
{
    setlocale(LC_ALL, "");
    bool utf8 = !strcmp(nl_langinfo(CODESET), "UTF-8");
    bool once = false;
    static struct mon_job_args job_args;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help"))
            return usage(stdout);
        if (!strcmp(argv[i], "--version"))
            return sd_version_print();
        if (!strcmp(argv[i], "--once")) {
            once = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "%s: unknown option '%s' (accepted: --once, --version, --help)\n", PROG, argv[i]);
            return 2;
        } else if (mon_job_arg(PROG, argv[i], &job_args) != 0) {
            return 2;
        }
    }
    if (!once && !isatty(1)) {
        fprintf(stderr, "%s: stdout is not a terminal; use --once for a plain-text frame\n", PROG);
        return 2;
    }
    struct mon_target t;
    int rc = mon_pick_for_main(PROG, &job_args, &t);
    if (rc != 0)
        return rc;
    struct mon m;
    if (mon_attach(&m, t.name) != 0) {
        fprintf(stderr, "%s: %s; its log.dir is %s\n", PROG, sd_errmsg(), t.log_dir);
        return 1;
    }
    rc = once ? mon_print_frame(&m, terminal_width(), utf8) : run_live(&m, utf8);
    mon_detach(&m);
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", PROG, sd_errmsg());
        return 1;
    }
    return 0;
}
