/* slidedp-stat: one look at a running job (a text view, or --json), its metrics for Prometheus
 * (--prometheus PORT: a libuv HTTP server answering GET /metrics until SIGINT/SIGTERM or the end
 * of the job), or a plot of a job's metrics.jsonl (--plot out.svg). Attaches read-only. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "common/err.h"
#include "common/version.h"
#include "monitor/metrics_plot.h"
#include "monitor/monitor.h"
#include "monitor/monitor_export.h"
#include "monitor/monitor_view.h"

#define PROG "slidedp-stat"
#define REQ_MAX 8192
#define WATCH_MS 250
#define TEXT_WIDTH 120

enum mode { MODE_TEXT, MODE_JSON, MODE_PROMETHEUS, MODE_PLOT };

static int usage(FILE *f)
{
    fprintf(f, "usage: %s [JOB] [--json | --prometheus PORT [--bind ADDR] | --plot OUT.svg]\n"
               "       %s --version | --help\n"
               "A running job's statistics, read from its shared memory (read-only), as text or JSON, or served as\n"
               "a Prometheus endpoint; --plot writes the <log.dir>/metrics.jsonl of a running or finished job\n"
               "as an SVG plot.\n"
               "  JOB: a job name (listed when several run), its log.dir, or its job.ini followed by the\n"
               "  section.key=value overrides it was launched with (from the same directory: an override's\n"
               "  relative path starts at the current directory, a path inside job.ini at job.ini's folder);\n"
               "  default: the only running job\n"
               "  --version: print the version and the backends of this build\n"
               "  --help, -h: this text\n",
            PROG, PROG);
    return f == stdout ? 0 : 2;
}

/* ---- the Prometheus endpoint ---- */

struct server {
    uv_loop_t *loop;
    uv_tcp_t tcp;
    uv_timer_t watch;
    uv_signal_t sigint, sigterm;
    const struct mon *m;
};

struct conn {
    uv_tcp_t tcp; /* first: the handle's address is the connection's */
    struct server *srv;
    uv_write_t wr;
    char req[REQ_MAX];
    size_t len;
    char *resp;
};

static void on_conn_closed(uv_handle_t *h)
{
    struct conn *c = (struct conn *)h;
    free(c->resp);
    free(c);
}

static void close_conn(struct conn *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void close_any(uv_handle_t *h, void *arg)
{
    struct server *srv = arg;
    if (uv_is_closing(h))
        return;
    bool is_conn = h->type == UV_TCP && h != (uv_handle_t *)&srv->tcp;
    uv_close(h, is_conn ? on_conn_closed : NULL);
}

static void stop_server(struct server *srv)
{
    uv_walk(srv->loop, close_any, srv);
}

static void on_written(uv_write_t *wr, int status)
{
    close_conn(wr->data);
}

static void respond(struct conn *c, const char *status, const char *type, const char *body, size_t body_len)
{
    uv_read_stop((uv_stream_t *)&c->tcp);
    char head[512];
    int n = snprintf(head, sizeof head,
                     "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: close\r\n%s\r\n", status,
                     type, body_len, !strncmp(status, "405", 3) ? "Allow: GET\r\n" : "");
    c->resp = malloc((size_t)n + body_len);
    if (!c->resp) {
        close_conn(c);
        return;
    }
    memcpy(c->resp, head, (size_t)n);
    memcpy(c->resp + n, body, body_len);
    uv_buf_t buf = uv_buf_init(c->resp, (unsigned)((size_t)n + body_len));
    c->wr.data = c;
    if (uv_write(&c->wr, (uv_stream_t *)&c->tcp, &buf, 1, on_written) != 0)
        close_conn(c);
}

static void respond_text(struct conn *c, const char *status, const char *body)
{
    respond(c, status, "text/plain; charset=utf-8", body, strlen(body));
}

static void serve_metrics(struct conn *c)
{
    struct mon_snapshot *s = malloc(sizeof *s);
    char *body = NULL;
    size_t len = 0;
    FILE *f = s ? open_memstream(&body, &len) : NULL;
    if (!f || mon_snapshot(c->srv->m, s) != 0) {
        if (f)
            fclose(f);
        free(body);
        free(s);
        respond_text(c, "503 Service Unavailable", s ? "the job's stats cannot be read\n" : "out of memory\n");
        return;
    }
    mon_prometheus(f, c->srv->m, s);
    fclose(f);
    respond(c, "200 OK", MON_PROMETHEUS_CONTENT_TYPE, body, len);
    free(body);
    free(s);
}

/* Answers once the request head is complete: GET /metrics (any query string), else 404 or 405. */
static void handle_request(struct conn *c)
{
    c->req[c->len] = 0;
    char method[16], target[1024];
    if (sscanf(c->req, "%15s %1023s HTTP/1.%*c", method, target) != 2) {
        respond_text(c, "400 Bad Request", "bad request\n");
        return;
    }
    target[strcspn(target, "?")] = 0;
    if (strcmp(method, "GET") != 0)
        respond_text(c, "405 Method Not Allowed", "only GET is served\n");
    else if (strcmp(target, "/metrics") != 0)
        respond_text(c, "404 Not Found", "not found; metrics are at /metrics\n");
    else
        serve_metrics(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = (struct conn *)h;
    *buf = uv_buf_init(c->req + c->len, (unsigned)(REQ_MAX - 1 - c->len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = (struct conn *)stream;
    if (nread < 0) {
        close_conn(c);
        return;
    }
    c->len += (size_t)nread;
    c->req[c->len] = 0;
    if (strstr(c->req, "\r\n\r\n") || strstr(c->req, "\n\n"))
        handle_request(c);
    else if (c->len == REQ_MAX - 1)
        respond_text(c, "431 Request Header Fields Too Large", "request head too large\n");
}

static void on_connection(uv_stream_t *server, int status)
{
    struct server *srv = server->data;
    if (status != 0)
        return;
    struct conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = srv;
    uv_tcp_init(srv->loop, &c->tcp);
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 ||
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        close_conn(c);
}

static void on_watch(uv_timer_t *t)
{
    struct server *srv = t->data;
    if (!mon_job_running(srv->m)) {
        fprintf(stderr, "%s: job %s has ended; stopping the server\n", PROG, srv->m->name);
        stop_server(srv);
    }
}

static void on_signal(uv_signal_t *sig, int signum)
{
    stop_server(sig->data);
}

static int serve(const struct mon *m, const char *bind_addr, int port)
{
    struct server srv = {.loop = uv_default_loop(), .m = m};
    struct sockaddr_storage addr;
    int rc = strchr(bind_addr, ':') ? uv_ip6_addr(bind_addr, port, (struct sockaddr_in6 *)&addr)
                                    : uv_ip4_addr(bind_addr, port, (struct sockaddr_in *)&addr);
    if (rc != 0) {
        fprintf(stderr, "%s: --bind needs an IPv4 or IPv6 address, got '%s'\n", PROG, bind_addr);
        return 2;
    }
    uv_tcp_init(srv.loop, &srv.tcp);
    srv.tcp.data = &srv;
    rc = uv_tcp_bind(&srv.tcp, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&srv.tcp, 64, on_connection);
    if (rc != 0) {
        fprintf(stderr, "%s: cannot listen on %s port %d: %s\n", PROG, bind_addr, port, uv_strerror(rc));
        uv_close((uv_handle_t *)&srv.tcp, NULL);
        uv_run(srv.loop, UV_RUN_DEFAULT);
        return 1;
    }
    uv_timer_init(srv.loop, &srv.watch);
    srv.watch.data = &srv;
    uv_timer_start(&srv.watch, on_watch, WATCH_MS, WATCH_MS);
    uv_signal_init(srv.loop, &srv.sigint);
    uv_signal_init(srv.loop, &srv.sigterm);
    srv.sigint.data = srv.sigterm.data = &srv;
    uv_signal_start(&srv.sigint, on_signal, SIGINT);
    uv_signal_start(&srv.sigterm, on_signal, SIGTERM);
    fprintf(stderr, "%s: serving job %s at http://%s%s%s:%d/metrics until it ends or SIGINT/SIGTERM\n", PROG, m->name,
            strchr(bind_addr, ':') ? "[" : "", bind_addr, strchr(bind_addr, ':') ? "]" : "", port);
    uv_run(srv.loop, UV_RUN_DEFAULT);
    uv_loop_close(srv.loop);
    return 0;
}

/* ---- one-shot outputs ---- */

static int print_json(const struct mon *m)
{
    struct mon_snapshot *s = malloc(sizeof *s);
    if (!s)
        return sd_err("out of memory");
    int rc = mon_snapshot(m, s);
    char *text = rc == 0 ? mon_json(m, s) : NULL;
    if (rc == 0 && !text)
        rc = sd_err("out of memory");
    if (text)
        printf("%s\n", text);
    free(text);
    free(s);
    return rc;
}

/* A path as the user would type it: relative when under the working directory. */
static const char *shown_path(const char *path, char *cwd, size_t len)
{
    size_t n = getcwd(cwd, len) ? strlen(cwd) : 0;
    return n > 1 && !strncmp(path, cwd, n) && path[n] == '/' ? path + n + 1 : path;
}

static bool parse_port(const char *s, int *port)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < 1 || v > 65535)
        return false;
    *port = (int)v;
    return true;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    enum mode mode = MODE_TEXT;
    int modes = 0, port = 0;
    const char *bind_addr = NULL, *svg = NULL;
    static struct mon_job_args job_args;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help"))
            return usage(stdout);
        if (!strcmp(a, "--version"))
            return sd_version_print();
        if (!strcmp(a, "--json")) {
            mode = MODE_JSON;
            modes++;
        } else if (!strcmp(a, "--prometheus")) {
            if (!parse_port(next, &port)) {
                fprintf(stderr, "%s: --prometheus needs a port in [1, 65535], got '%s'\n", PROG, next ? next : "");
                return 2;
            }
            mode = MODE_PROMETHEUS;
            modes++;
            i++;
        } else if (!strcmp(a, "--bind")) {
            if (!next || !*next) {
                fprintf(stderr, "%s: --bind needs an address\n", PROG);
                return 2;
            }
            bind_addr = next;
            i++;
        } else if (!strcmp(a, "--plot")) {
            if (!next || !*next) {
                fprintf(stderr, "%s: --plot needs an output file (out.svg)\n", PROG);
                return 2;
            }
            svg = next;
            mode = MODE_PLOT;
            modes++;
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "%s: unknown option '%s' (accepted: --json, --prometheus PORT, --bind ADDR, --plot OUT.svg, "
                            "--version, --help)\n",
                    PROG, a);
            return 2;
        } else if (mon_job_arg(PROG, argv[i], &job_args) != 0) {
            return 2;
        }
    }
    if (modes > 1) {
        fprintf(stderr, "%s: --json, --prometheus and --plot exclude each other\n", PROG);
        return 2;
    }
    if (bind_addr && mode != MODE_PROMETHEUS) {
        fprintf(stderr, "%s: --bind goes with --prometheus\n", PROG);
        return 2;
    }

    struct mon_target t;
    int rc = mon_pick_for_main(PROG, &job_args, &t);
    if (rc != 0)
        return rc;
    if (mode == MODE_PLOT) {
        char metrics[JOB_PATH_MAX + 32], title[JOB_PATH_MAX + MON_NAME_MAX + 32];
        snprintf(metrics, sizeof metrics, "%s/metrics.jsonl", t.log_dir);
        char cwd[JOB_PATH_MAX];
        snprintf(title, sizeof title, "slidedp job %s: %s", t.name, shown_path(t.log_dir, cwd, sizeof cwd));
        if (metrics_plot(metrics, title, svg) != 0) {
            fprintf(stderr, "%s: %s\n", PROG, sd_errmsg());
            return 1;
        }
        printf("%s: wrote %s from %s\n", PROG, svg, metrics);
        return 0;
    }
    struct mon m;
    if (mon_attach(&m, t.name) != 0) {
        fprintf(stderr, "%s: %s; its log.dir is %s\n", PROG, sd_errmsg(), t.log_dir);
        return 1;
    }
    if (mode == MODE_PROMETHEUS) {
        rc = serve(&m, bind_addr ? bind_addr : "127.0.0.1", port);
    } else {
        rc = mode == MODE_JSON ? print_json(&m) : mon_print_frame(&m, TEXT_WIDTH, false);
        if (rc != 0)
            fprintf(stderr, "%s: %s\n", PROG, sd_errmsg());
        rc = rc != 0;
    }
    mon_detach(&m);
    return rc;
}
