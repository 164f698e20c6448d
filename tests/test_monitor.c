/* The monitors against a live job: a --device cpu --gpus 2 job on the tiny copy task is watched by
 * raw read-only attaches (many consistent snapshots: steps never go back, the stats are never torn,
 * the ctl mapping is read-only and nothing of the job is mapped writable), slidedp-stat --json,
 * slidedp-top --once loops and the Prometheus endpoint (checked against the text exposition
 * format rules here); the same job run without monitors ends with bit-identical weights. */
#include "tests/testutil.h"

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "shm/futex.h"
#include "monitor/monitor.h"
#include "monitor/monitor_view.h"

#define STEPS 100
#define TOKENS_PER_STEP (2 * 2 * 8 * 64) /* gpus x grad_accum x micro_batch x seq_len */
#define SEC 1000000000ull

static char dir[1024];
static pid_t children[8]; /* stopped at the end should a check fail while they run */
static int num_children;
static pid_t launcher;
static int launcher_rc = -1; /* set once reaped */

/* Whether the launcher has exited (reaping it and keeping its exit code). */
static bool launcher_done(void)
{
    int st;
    if (launcher_rc < 0 && waitpid(launcher, &st, WNOHANG) == launcher)
        launcher_rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return launcher_rc >= 0;
}

/* Writes <dir>/<tag>.ini: the tiny copy task, fp32 export, logs and checkpoints under <tag>-*. */
static void write_job(const char *tag, char *ini, size_t len)
{
    char text[4096];
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n"
             "[data]\ntrain = data/train.bin\nval = data/val.bin\nseq_len = 64\nval_every = 25\n"
             "[train]\nmicro_batch = 8\ngrad_accum = 2\nsteps = %d\nlr = 3e-3\nwarmup = 10\nweight_decay = 0.01\n"
             "grad_clip = 1.0\nseed = 1234\n"
             "[checkpoint]\ndir = %s-ckpt\nexport_dtype = fp32\n"
             /* two lanes an optimizer, so that their waits for each other are counted */
             "[runtime]\ndevice = cpu\ngpus = 2\noptim_threads = 2\n"
             "[log]\ndir = %s-log\nevery = 25\n",
             tu_src("examples/tiny-qwen3"), STEPS, tag, tag);
    snprintf(ini, len, "%s/%s.ini", dir, tag);
    tu_write_file(ini, text);
}

static void job_name_of(const char *ini, char *name, size_t len)
{
    struct job_config job;
    assert_int_equal(job_config_load(ini, 0, NULL, &job), 0);
    ctl_job_name(job.log_dir, name, len);
}

/* Forks argv with stdout and stderr into out_path. */
static pid_t spawn(char **argv, const char *out_path)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        FILE *f = fopen(out_path, "w");
        if (!f)
            _exit(127);
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
        execv(argv[0], argv);
        _exit(127);
    }
    children[num_children++] = pid;
    return pid;
}

static int wait_exit(pid_t pid, int timeout_s)
{
    uint64_t t0 = clock_ns();
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (clock_ns() - t0 > (uint64_t)timeout_s * SEC)
            fail_msg("process %d did not exit within %d s", (int)pid, timeout_s);
        usleep(10000);
    }
}

/* ---- read-only mappings ---- */

/* Every mapping of the job's shm objects in a process (0: this one): the ctl object must be
 * mapped "r--s" and nothing of the job writable. Returns the number of mappings of the job. */
static int check_mappings(pid_t pid, const char *job)
{
    char prefix[128], path[64];
    if (pid)
        snprintf(path, sizeof path, "/proc/%d/maps", (int)pid);
    else
        snprintf(path, sizeof path, "/proc/self/maps");
    char *maps = tu_read_file(path, NULL);
    assert_non_null(maps);
    snprintf(prefix, sizeof prefix, "/dev/shm/slidedp.%s.", job);
    int n = 0;
    bool ctl_seen = false;
    for (char *line = strtok(maps, "\n"); line; line = strtok(NULL, "\n")) {
        char *obj = strstr(line, prefix);
        if (!obj)
            continue;
        char perms[8] = "";
        sscanf(line, "%*s %7s", perms);
        n++;
        assert_int_not_equal(perms[1], 'w');
        if (!strcmp(obj + strlen(prefix), "ctl")) {
            assert_string_equal(perms, "r--s");
            ctl_seen = true;
        }
    }
    free(maps);
    assert_true(ctl_seen);
    return n;
}

/* ---- consistent snapshots ---- */

struct watch {
    struct mon m;
    struct mon_snapshot prev, cur;
    bool have_prev;
    uint64_t snapshots, torn_checks;
};

static void attach_when_ready(struct watch *w, const char *job)
{
    uint64_t t0 = clock_ns();
    while (mon_attach(&w->m, job) != 0) {
        if (clock_ns() - t0 > 30 * SEC || launcher_done())
            fail_msg("job %s never appeared: %s", job, sd_errmsg());
        usleep(10000);
    }
}

static void check_counter(uint64_t before, uint64_t after, const char *what, int i)
{
    if (after < before)
        fail_msg("%s of process %d went back: %llu -> %llu", what, i, (unsigned long long)before,
                 (unsigned long long)after);
}

static void check_procs(const struct mon_proc *a, const struct mon_proc *b, int i)
{
    check_counter(a->bytes_in, b->bytes_in, "bytes_in", i);
    check_counter(a->bytes_out, b->bytes_out, "bytes_out", i);
    check_counter(a->busy_ns, b->busy_ns, "busy_ns", i);
    check_counter(a->wait_ns, b->wait_ns, "wait_ns", i);
    check_counter(a->update_ns, b->update_ns, "update_ns", i);
    check_counter(a->lane_wait_ns, b->lane_wait_ns, "lane_wait_ns", i);
    if (b->update_ns > b->busy_ns || b->lane_wait_ns > b->busy_ns)
        fail_msg("process %d: a part of busy_ns exceeds it (update %llu, lane waits %llu, busy %llu)", i,
                 (unsigned long long)b->update_ns, (unsigned long long)b->lane_wait_ns,
                 (unsigned long long)b->busy_ns);
    check_counter(a->items, b->items, "items", i);
    check_counter(a->step, b->step, "step", i);
}

/* One snapshot: within it the stats are one launcher write (the loss is the history's entry for
 * its step, lr is the schedule's value for it, the token count matches); against the previous
 * one nothing goes back. */
static void take_snapshot(struct watch *w)
{
    if (mon_snapshot(&w->m, &w->cur) != 0)
        fail_msg("%s", sd_errmsg());
    const struct job_stats *st = &w->cur.stats;
    const struct ctl_header *h = w->m.h;
    w->snapshots++;
    if (st->step > 0) {
        if (st->loss_history[st->step % JOB_STATS_HISTORY] != st->loss || st->lr != job_lr_at(&h->job, (int)st->step) ||
            st->tokens_total != (uint64_t)st->step * TOKENS_PER_STEP || !(st->loss > 0) || !isfinite(st->loss))
            fail_msg("torn stats at step %u: loss %.9g history %.9g lr %.9g tokens %llu", st->step, st->loss,
                     st->loss_history[st->step % JOB_STATS_HISTORY], st->lr, (unsigned long long)st->tokens_total);
        w->torn_checks++;
    }
    if (w->have_prev) {
        if (st->step < w->prev.stats.step)
            fail_msg("step went back: %u -> %u", w->prev.stats.step, st->step);
        for (int r = 0; r < w->cur.gpus; r++)
            check_procs(&w->prev.workers[r], &w->cur.workers[r], r);
        for (int k = 0; k < w->cur.optim_procs; k++)
            check_procs(&w->prev.optims[k], &w->cur.optims[k], w->cur.gpus + k);
    }
    w->prev = w->cur;
    w->have_prev = true;
}

/* ---- Prometheus ---- */

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* GET path from 127.0.0.1:port with a raw socket; returns the HTTP status (0: no connection) and the
 * whole response in *resp. */
static int http_get(int port, const char *path, char **resp)
{
    *resp = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        close(fd);
        return 0;
    }
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", path);
    assert_int_equal(write(fd, req, (size_t)n), n);
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    ssize_t got;
    while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
        len += (size_t)got;
        if (len + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    close(fd);
    buf[len] = 0;
    *resp = buf;
    int status = 0;
    sscanf(buf, "HTTP/1.1 %d", &status);
    return status;
}

static bool name_char(char c, bool first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

/* Reads a metric name ([a-zA-Z_:][a-zA-Z0-9_:]*) at *p into out. */
static void parse_name(const char **p, char *out, size_t len, const char *line)
{
    size_t n = 0;
    if (!name_char(**p, true))
        fail_msg("bad metric name in '%s'", line);
    while (name_char(**p, n == 0) && n + 1 < len)
        out[n++] = *(*p)++;
    out[n] = 0;
}

struct family {
    char name[128], type[32];
    bool help, samples;
};

/* The exposition format rules: each line is a HELP, TYPE or sample line; a family's HELP and TYPE
 * come before its samples, which are contiguous; names and label names are valid, label values
 * properly quoted and escaped; values parse; counters end in _total; no series repeats. Returns
 * the value of `want` (a whole series, e.g. slidedp_step) or NaN. */
static double check_exposition(const char *body, const char *want)
{
    struct family fam[256];
    int nfam = 0, cur = -1, nseries = 0;
    static char series[4096][256];
    double found = NAN;
    char *text = strdup(body);
    assert_true(strlen(body) > 0 && body[strlen(body) - 1] == '\n');
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char name[128], kind[8], type[32];
        if (line[0] == '#') {
            const char *p = line + 7;
            if (sscanf(line, "# %7s ", kind) != 1 || strlen(line) < 8 || (strcmp(kind, "HELP") && strcmp(kind, "TYPE")))
                fail_msg("bad comment line '%s'", line);
            parse_name(&p, name, sizeof name, line);
            int f = -1;
            for (int i = 0; i < nfam; i++)
                if (!strcmp(fam[i].name, name))
                    f = i;
            if (f < 0) {
                assert_true(nfam < 256);
                f = nfam++;
                memset(&fam[f], 0, sizeof fam[f]);
                snprintf(fam[f].name, sizeof fam[f].name, "%s", name);
            }
            if (fam[f].samples)
                fail_msg("%s of %s after its samples", kind, name);
            if (!strcmp(kind, "HELP")) {
                if (fam[f].help || *p != ' ' || !p[1])
                    fail_msg("repeated or empty HELP: '%s'", line);
                fam[f].help = true;
            } else {
                if (fam[f].type[0] || sscanf(p, " %31s", type) != 1)
                    fail_msg("repeated or empty TYPE: '%s'", line);
                if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "untyped") &&
                    strcmp(type, "summary") && strcmp(type, "histogram"))
                    fail_msg("bad type in '%s'", line);
                snprintf(fam[f].type, sizeof fam[f].type, "%s", type);
            }
            cur = f;
            continue;
        }
        const char *p = line;
        parse_name(&p, name, sizeof name, line);
        if (strncmp(name, "slidedp_", 8) != 0)
            fail_msg("metric %s lacks the slidedp_ prefix", name);
        if (cur < 0 || strcmp(fam[cur].name, name) != 0 || !fam[cur].help || !fam[cur].type[0])
            fail_msg("sample '%s' without HELP and TYPE of its family just before", line);
        if (!strcmp(fam[cur].type, "counter") && (strlen(name) < 6 || strcmp(name + strlen(name) - 6, "_total")))
            fail_msg("counter %s does not end in _total", name);
        fam[cur].samples = true;
        char key[256];
        size_t klen = (size_t)snprintf(key, sizeof key, "%s", name);
        if (*p == '{') {
            p++;
            char labels[16][64];
            int nl = 0;
            while (*p != '}') {
                parse_name(&p, labels[nl], sizeof labels[nl], line);
                if (strchr(labels[nl], ':') || !strncmp(labels[nl], "__", 2))
                    fail_msg("bad label name in '%s'", line);
                for (int i = 0; i < nl; i++)
                    if (!strcmp(labels[i], labels[nl]))
                        fail_msg("repeated label in '%s'", line);
                if (*p++ != '=' || *p++ != '"')
                    fail_msg("bad label in '%s'", line);
                klen += (size_t)snprintf(key + klen, sizeof key - klen, "|%s=", labels[nl]);
                nl++;
                while (*p != '"') {
                    if (!*p || *p == '\n')
                        fail_msg("unterminated label value in '%s'", line);
                    if (*p == '\\') {
                        p++;
                        if (*p != '\\' && *p != '"' && *p != 'n')
                            fail_msg("bad escape in '%s'", line);
                    }
                    if (klen + 1 < sizeof key)
                        key[klen++] = *p;
                    p++;
                }
                key[klen] = 0;
                p++;
                if (*p == ',')
                    p++;
                else if (*p != '}')
                    fail_msg("bad label list in '%s'", line);
                assert_true(nl < 16);
            }
            p++;
        }
        if (*p++ != ' ')
            fail_msg("no space before the value in '%s'", line);
        double v;
        char *end;
        if (!strcmp(p, "NaN"))
            v = NAN;
        else if (!strcmp(p, "+Inf") || !strcmp(p, "-Inf"))
            v = p[0] == '+' ? INFINITY : -INFINITY;
        else if (v = strtod(p, &end), end == p || (*end && *end != ' '))
            fail_msg("bad value in '%s'", line);
        for (int i = 0; i < nseries; i++)
            if (!strcmp(series[i], key))
                fail_msg("duplicate series '%s'", line);
        assert_true(nseries < 4096);
        snprintf(series[nseries++], sizeof series[0], "%s", key);
        if (!strcmp(key, want))
            found = v;
    }
    free(text);
    return found;
}

/* One scrape: 200 with the 0.0.4 content type, a Content-Length that matches, a valid body. */
static double scrape(int port, const char *want, char **body_out)
{
    char *resp;
    int status = http_get(port, "/metrics", &resp);
    if (status != 200)
        fail_msg("GET /metrics: status %d: %s", status, resp ? resp : "(no connection)");
    char *body = strstr(resp, "\r\n\r\n");
    assert_non_null(body);
    body += 4;
    assert_non_null(strstr(resp, "Content-Type: text/plain; version=0.0.4"));
    char *cl = strstr(resp, "Content-Length: ");
    assert_non_null(cl);
    assert_int_equal(strtoul(cl + 16, NULL, 10), strlen(body));
    double v = check_exposition(body, want);
    if (body_out)
        *body_out = strdup(body);
    free(resp);
    return v;
}

/* A second endpoint (explicit --bind) maps the job read-only and stops on SIGTERM with status 0. */
static void check_sigterm(const char *job)
{
    int port = free_port();
    char port_s[16], path[1200], *resp;
    snprintf(port_s, sizeof port_s, "%d", port);
    char *argv[] = {(char *)tu_bin("slidedp-stat"), (char *)job, "--prometheus", port_s, "--bind", "127.0.0.1", NULL};
    snprintf(path, sizeof path, "%s/prom2.out", dir);
    pid_t pid = spawn(argv, path);
    uint64_t t0 = clock_ns();
    while (http_get(port, "/metrics", &resp) != 200 && clock_ns() - t0 < 10 * SEC) {
        free(resp);
        usleep(20000);
    }
    free(resp);
    assert_int_equal(check_mappings(pid, job), 1);
    kill(pid, SIGTERM);
    int rc = wait_exit(pid, 5);
    printf("# a second endpoint on port %d, read-only, SIGTERM -> %d\n", port, rc);
    assert_int_equal(rc, 0);
}

/* ---- the programs' outputs ---- */

/* Discovery lists the job with its launcher, log dir and steps; its job.ini resolves to it; an
 * unknown name does not. */
static void check_discovery(const char *job, const char *ini)
{
    struct mon_job_info *jobs;
    int n;
    assert_int_equal(mon_list_jobs(&jobs, &n), 0);
    int found = -1;
    for (int i = 0; i < n; i++)
        if (!strcmp(jobs[i].name, job))
            found = i;
    assert_true(found >= 0);
    char log_dir[1200];
    snprintf(log_dir, sizeof log_dir, "%s/a-log", dir);
    assert_int_equal(jobs[found].pid, launcher);
    assert_string_equal(jobs[found].log_dir, log_dir);
    assert_int_equal(jobs[found].steps, STEPS);
    printf("# discovery: %d running job(s), ours among them\n", n);
    free(jobs);
    struct mon_target t;
    struct mon_job_info *several;
    int num_several;
    assert_int_equal(mon_pick(ini, 0, NULL, &t, &several, &num_several), 0);
    assert_string_equal(t.name, job);
    assert_string_equal(t.log_dir, log_dir);
    /* job B's ini with job A's log.dir names job A */
    char b_ini[1200], a_log[1300], *overrides[] = {a_log};
    snprintf(b_ini, sizeof b_ini, "%s/b.ini", dir);
    snprintf(a_log, sizeof a_log, "log.dir=%s/a-log", dir); /* an override's path: from the current directory */
    assert_int_equal(mon_pick(b_ini, 1, overrides, &t, &several, &num_several), 0);
    assert_string_equal(t.name, job);
    assert_int_equal(mon_pick("0000deadbeef", 0, NULL, &t, &several, &num_several), MON_ERR);
    assert_null(several);
    assert_int_equal(mon_pick(job, 1, overrides, &t, &several, &num_several), MON_BAD_ARG);
    /* its log.dir names it, also through a symbolic link (compared by real path); overrides go
     * only after a job.ini. The launcher makes log.dir with the first metrics line. */
    for (uint64_t t0 = clock_ns(); !tu_exists(log_dir); usleep(10000))
        if (clock_ns() - t0 > 60ull * 1000000000ull)
            fail_msg("%s never appeared", log_dir);
    char link[1200];
    snprintf(link, sizeof link, "%s/a-log-link", dir);
    unlink(link);
    assert_int_equal(symlink(log_dir, link), 0);
    const char *dirs[] = {log_dir, link};
    for (int i = 0; i < 2; i++) {
        memset(&t, 0, sizeof t);
        assert_int_equal(mon_pick(dirs[i], 0, NULL, &t, &several, &num_several), 0);
        assert_string_equal(t.name, job);
        assert_string_equal(t.log_dir, log_dir);
    }
    assert_int_equal(mon_pick(log_dir, 1, overrides, &t, &several, &num_several), MON_BAD_ARG);
    printf("# discovery: the job.ini, its log.dir and a link to it name job %s\n", job);
}

/* Named by job B's job.ini with job A's log.dir as an override. */
static void check_stat_json(const char *job, const struct ctl_header *h)
{
    char *out;
    int rc = tu_sh(&out, "cd %s && %s b.ini log.dir=a-log --json 2>&1", dir, tu_bin("slidedp-stat"));
    assert_int_equal(rc, 0);
    cJSON *o = cJSON_Parse(out);
    if (!o)
        fail_msg("slidedp-stat --json printed no JSON: %s", out);
    cJSON *j = cJSON_GetObjectItem(o, "job"), *stats = cJSON_GetObjectItem(o, "stats");
    assert_string_equal(cJSON_GetObjectItem(j, "name")->valuestring, job);
    assert_int_equal(cJSON_GetObjectItem(j, "gpus")->valueint, 2);
    assert_string_equal(cJSON_GetObjectItem(j, "device")->valuestring, "cpu");
    assert_int_equal(cJSON_GetObjectItem(o, "steps")->valueint, STEPS);
    int step = cJSON_GetObjectItem(o, "step")->valueint;
    assert_true(step >= 1 && step <= STEPS);
    double loss = cJSON_GetObjectItem(stats, "loss")->valuedouble;
    cJSON *hist = cJSON_GetObjectItem(cJSON_GetObjectItem(stats, "loss_history"), "loss");
    assert_true(cJSON_GetArraySize(hist) >= 1);
    assert_true(cJSON_GetArrayItem(hist, cJSON_GetArraySize(hist) - 1)->valuedouble == loss);
    assert_true(cJSON_GetObjectItem(stats, "lr")->valuedouble == job_lr_at(&h->job, step));
    cJSON *workers = cJSON_GetObjectItem(o, "workers"), *optims = cJSON_GetObjectItem(o, "optimizers");
    assert_int_equal(cJSON_GetArraySize(workers), 2);
    assert_int_equal(cJSON_GetArraySize(optims), h->optim_procs);
    for (int r = 0; r < 2; r++) {
        cJSON *w = cJSON_GetArrayItem(workers, r);
        assert_int_equal(cJSON_GetObjectItem(w, "rank")->valueint, r);
        assert_true(cJSON_GetObjectItem(w, "pid")->valueint > 0);
        assert_true(cJSON_GetObjectItem(w, "h2d_bytes")->valuedouble > 0);
        assert_true(cJSON_GetObjectItem(w, "d2h_bytes")->valuedouble > 0);
        assert_true(cJSON_GetObjectItem(w, "micro_steps")->valuedouble >= 2);
    }
    cJSON *optim0 = cJSON_GetArrayItem(optims, 0);
    assert_true(cJSON_GetObjectItem(optim0, "chunk_updates")->valuedouble > 0);
    /* updating is part of the busy time: both counted from the same update's clock */
    double update_s = cJSON_GetObjectItem(optim0, "update_s")->valuedouble;
    double busy_s = cJSON_GetObjectItem(optim0, "busy_s")->valuedouble;
    assert_true(update_s > 0 && update_s <= busy_s);
    /* so are the lanes' waits for the slowest */
    assert_int_equal(h->plan.optim_threads, 2);
    double lane_wait_s = cJSON_GetObjectItem(optim0, "lane_wait_s")->valuedouble;
    assert_true(lane_wait_s >= 0 && lane_wait_s <= busy_s);
    printf("# slidedp-stat --json: step %d loss %.4f, %d optimizer(s) of %d thread(s), lane waits %.6f of busy %.6f s\n",
           step, loss, h->optim_procs, h->plan.optim_threads, lane_wait_s, busy_s);
    cJSON_Delete(o);
    free(out);
}

static void check_top_once(const char *job, const struct mon_snapshot *s)
{
#ifdef SD_HAVE_TOP
    char *out, want[128];
    int rc = tu_sh(&out, "%s %s --once 2>&1", tu_bin("slidedp-top"), job);
    printf("# slidedp-top --once:\n%s", out);
    assert_int_equal(rc, 0);
    snprintf(want, sizeof want, "job %s", job);
    const char *needles[] = {want, "RANK", "OPT", "loss ", "step time", "pipeline overlap"};
    for (int i = 0; i < 6; i++)
        if (!strstr(out, needles[i]))
            fail_msg("slidedp-top --once lacks '%s'", needles[i]);
    for (int r = 0; r < 2; r++) {
        snprintf(want, sizeof want, "\n%4d  %-8d ", r, s->workers[r].pid);
        if (!strstr(out, want))
            fail_msg("slidedp-top --once has no line for rank %d (pid %d)", r, s->workers[r].pid);
    }
    free(out);
#else
    printf("# slidedp-top is not built (no ncurses); skipped\n");
#endif
}

/* Bad arguments: one line, exit 2; a job that is not running: one line, exit 1. */
static void check_errors(const char *job)
{
    const char *args[] = {"--bogus", "--prometheus 0", "--prometheus", "--json --plot x.svg", "--bind 1.2.3.4 --json",
                          "a b --json"};
    char *out;
    for (int i = 0; i < 6; i++) {
        int rc = tu_sh(&out, "%s %s 2>&1", tu_bin("slidedp-stat"), args[i]);
        printf("# slidedp-stat %s -> %d: %s", args[i], rc, out);
        assert_int_equal(rc, 2);
        assert_true(strchr(out, '\n') == out + strlen(out) - 1);
        free(out);
    }
    int rc = tu_sh(&out, "%s %s --json 2>&1", tu_bin("slidedp-stat"), job);
    printf("# slidedp-stat %s --json after the job -> %d: %s", job, rc, out);
    assert_int_equal(rc, 1);
    assert_true(strchr(out, '\n') == out + strlen(out) - 1);
    free(out);
}

/* Tags open and close in order (a well-formedness check without an XML parser). */
static void check_svg(const char *path)
{
    char *svg = tu_read_file(path, NULL);
    assert_non_null(svg);
    assert_true(!strncmp(svg, "<?xml", 5));
    const char *needles[] = {"<svg xmlns=\"http://www.w3.org/2000/svg\"", ">Loss<", ">Learning rate<", ">Throughput<",
                             ">Step time<", ">val loss<", ">step<", "</svg>\n"};
    for (int i = 0; i < 8; i++)
        if (!strstr(svg, needles[i]))
            fail_msg("%s lacks '%s'", path, needles[i]);
    char stack[32][32];
    int depth = 0, polylines = 0;
    for (const char *p = strchr(svg + 1, '<'); p; p = strchr(p + 1, '<')) {
        char tag[32];
        bool closing = p[1] == '/';
        sscanf(p + 1 + closing, "%31[a-zA-Z]", tag);
        const char *end = strchr(p, '>');
        assert_non_null(end);
        polylines += !strcmp(tag, "polyline");
        if (closing) {
            assert_true(depth > 0);
            assert_string_equal(stack[--depth], tag);
        } else if (end[-1] != '/') {
            assert_true(depth < 32);
            snprintf(stack[depth++], sizeof stack[0], "%s", tag);
        }
    }
    assert_int_equal(depth, 0);
    assert_int_equal(polylines, 5); /* loss, val loss, lr, tokens/s, step time */
    /* the train loss has one point per step */
    const char *pts = strstr(strstr(svg, "<polyline"), "points=\"") + 8;
    int points = 1;
    for (; *pts != '"'; pts++)
        points += *pts == ' ';
    assert_int_equal(points, STEPS);
    free(svg);
}

static unsigned char *read_weights(const char *tag, size_t *len)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s-ckpt/final/model.safetensors", dir, tag);
    unsigned char *b = (unsigned char *)tu_read_file(path, len);
    if (!b)
        fail_msg("%s is missing", path);
    return b;
}

static void test_monitors_do_not_disturb(void **state)
{
    tu_seed("monitor: data", 1);
    tu_seed("monitor: job", 1234);
    char *out, ini[1200], path[1200], job[MON_NAME_MAX];
    assert_int_equal(tu_sh(&out, "%s copy --out %s/data --seq-len 64 --train 4000 --val 128 --seed 1",
                           tu_bin("slidedp-data"), dir),
                     0);
    free(out);

    /* job A, watched throughout; job B's ini is written now for the override checks */
    write_job("b", ini, sizeof ini);
    write_job("a", ini, sizeof ini);
    job_name_of(ini, job, sizeof job);
    char launch_bin[1024];
    snprintf(launch_bin, sizeof launch_bin, "%s", tu_bin("slidedp-launch")); /* tu_bin's buffers are reused */
    char *launch_argv[] = {launch_bin, "--device", "cpu", "--gpus", "2", ini, NULL};
    snprintf(path, sizeof path, "%s/a.out", dir);
    launcher = spawn(launch_argv, path);

    struct watch *w = calloc(1, sizeof *w);
    attach_when_ready(w, job);
    printf("# job %s: launcher pid %d, attached read-only\n", job, (int)launcher);
    assert_int_equal(w->m.launcher_pid, launcher);
    assert_int_equal(check_mappings(0, job), 1); /* the ctl object only */
    check_discovery(job, ini);
    do {
        take_snapshot(w);
        usleep(5000);
    } while (w->cur.stats.step < 1 && !launcher_done());
    assert_true(w->cur.stats.step >= 1);

    int port = free_port();
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    char *prom_argv[] = {(char *)tu_bin("slidedp-stat"), job, "--prometheus", port_s, NULL};
    snprintf(path, sizeof path, "%s/prom.out", dir);
    pid_t prom = spawn(prom_argv, path);
#ifdef SD_HAVE_TOP
    char loop[4096];
    snprintf(loop, sizeof loop,
             "n=0; while [ ! -e %s/stop ] && kill -0 %d 2>/dev/null; do "
             "if %s %s --once >%s/top.last 2>&1; then n=$((n+1)); fi; done; echo $n >%s/top.count",
             dir, (int)getpid(), tu_bin("slidedp-top"), job, dir, dir);
    char *loop_argv[] = {"/bin/sh", "-c", loop, NULL};
    snprintf(path, sizeof path, "%s/loop.out", dir);
    pid_t top_loop = spawn(loop_argv, path);
#endif

    /* the first scrape also checks 404 for other paths */
    char *resp;
    uint64_t t0 = clock_ns();
    int status;
    while ((status = http_get(port, "/nope", &resp)) == 0 && clock_ns() - t0 < 10 * SEC) {
        free(resp);
        usleep(20000);
    }
    printf("# GET /nope -> %d\n", status);
    assert_int_equal(status, 404);
    free(resp);
    char *body;
    double step = scrape(port, "slidedp_step", &body);
    printf("# GET /metrics (step %.0f), first lines:\n", step);
    int shown = 0;
    for (const char *p = body; *p && shown < 12; p = strchr(p, '\n') + 1, shown++)
        printf("#   %.*s\n", (int)(strchr(p, '\n') - p), p);
    assert_true(step >= 1 && step <= STEPS);
    for (int r = 0; r < 2; r++) {
        char key[64];
        snprintf(key, sizeof key, "slidedp_worker_h2d_bytes_total|rank=%d", r);
        free(body);
        assert_true(scrape(port, key, &body) > 0);
    }
    free(body);

    check_stat_json(job, w->m.h);
    check_sigterm(job);
    check_top_once(job, &w->cur);

    /* many snapshots until the job ends, re-attaching now and then, scraping all along */
    int scrapes = 3, attaches = 1;
    while (!launcher_done() && w->cur.stats.step < STEPS) {
        take_snapshot(w);
        if (w->snapshots % 25 == 0) {
            mon_detach(&w->m);
            if (mon_attach(&w->m, job) != 0)
                break; /* the job is ending */
            attaches++;
            assert_int_equal(check_mappings(0, job), 1);
        }
        if (w->snapshots % 20 == 0) {
            assert_true(scrape(port, "slidedp_step", NULL) >= w->cur.stats.step);
            scrapes++;
        }
        usleep(5000);
    }
    uint32_t last_step = w->cur.stats.step;
    mon_detach(&w->m);
    printf("# %llu snapshots (%llu torn checks), %d attaches, %d scrapes; last step seen %u\n",
           (unsigned long long)w->snapshots, (unsigned long long)w->torn_checks, attaches, scrapes, last_step);
    assert_true(w->snapshots >= 100);
    t0 = clock_ns();
    while (!launcher_done() && clock_ns() - t0 < 120 * SEC)
        usleep(10000);
    int rc = launcher_rc;
    snprintf(path, sizeof path, "%s/a.out", dir);
    out = tu_read_file(path, NULL);
    printf("%s", out);
    free(out);
    assert_int_equal(rc, 0);

    /* the endpoint stops by itself when the job ends */
    rc = wait_exit(prom, 10);
    snprintf(path, sizeof path, "%s/prom.out", dir);
    out = tu_read_file(path, NULL);
    printf("# slidedp-stat --prometheus -> %d: %s", rc, out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "has ended"));
    free(out);
#ifdef SD_HAVE_TOP
    snprintf(path, sizeof path, "%s/stop", dir);
    tu_write_file(path, "");
    assert_int_equal(wait_exit(top_loop, 10), 0);
    snprintf(path, sizeof path, "%s/top.count", dir);
    out = tu_read_file(path, NULL);
    printf("# slidedp-top --once ran %d times while the job ran\n", atoi(out));
    assert_true(atoi(out) >= 1);
    free(out);
#endif
    check_errors(job);

    /* a finished job, named by its job.ini */
    snprintf(path, sizeof path, "%s/a.svg", dir);
    rc = tu_sh(&out, "%s %s --plot %s 2>&1", tu_bin("slidedp-stat"), ini, path);
    printf("# %s", out);
    assert_int_equal(rc, 0);
    free(out);
    check_svg(path);
    /* and by its log.dir */
    snprintf(path, sizeof path, "%s/a-dir.svg", dir);
    rc = tu_sh(&out, "cd %s && %s a-log --plot %s 2>&1", dir, tu_bin("slidedp-stat"), path);
    printf("# %s", out);
    assert_int_equal(rc, 0);
    free(out);
    check_svg(path);

    /* job B: the same without monitors */
    write_job("b", ini, sizeof ini);
    launch_argv[5] = ini;
    rc = tu_run(launch_argv, &out);
    if (rc != 0)
        printf("%s", out);
    assert_int_equal(rc, 0);
    free(out);
    size_t la, lb;
    unsigned char *wa = read_weights("a", &la), *wb = read_weights("b", &lb);
    printf("# final/model.safetensors: %zu bytes (watched) vs %zu bytes (unwatched)\n", la, lb);
    assert_int_equal(la, lb);
    assert_true(la > 100000); /* fp32 weights of the tiny model */
    assert_memory_equal(wa, wb, la);
    free(wa);
    free(wb);
    free(w);
}

/* slidedp-top's loss line keeps its label whole at every width (issue 29: a fixed 40 columns were
 * left for it, and a long label, "1.234e-05..11.93 log (steps 1235-1490)", was cut; in UTF-8 the
 * blocks could also overrun the line's bytes): a synthetic job at step 1490 whose loss falls over
 * six decades, rendered at 64 to 256 columns, ASCII and UTF-8. */
static void test_loss_line_whole(void **state)
{
    struct ctl_header *h = calloc(1, sizeof *h);
    struct mon_snapshot *now = calloc(1, sizeof *now);
    struct mon_frame *f = malloc(sizeof *f);
    assert_non_null(h && now && f);
    h->job.steps = 2000;
    h->first_step = 1;
    struct mon m = {.h = h, .name = "synthetic"};
    now->stats.step = 1490;
    for (uint32_t k = 1; k <= now->stats.step; k++)
        now->stats.loss_history[k % JOB_STATS_HISTORY] = 11.93 * pow(1.2345e-5 / 11.93, (k - 1) / 1489.0);
    now->stats.loss = now->stats.loss_history[now->stats.step % JOB_STATS_HISTORY];
    const int widths[] = {64, 80, 100, 120, 160, 200, 256};
    for (int u = 0; u < 2; u++)
        for (size_t i = 0; i < sizeof widths / sizeof *widths; i++) {
            struct mon_view_opts o = {.width = widths[i], .utf8 = u == 1};
            mon_render(&m, now, now, &o, f);
            const char *line = NULL;
            for (int l = 0; l < f->n; l++)
                if (!strncmp(f->lines[l].text, "loss ", 5))
                    line = f->lines[l].text;
            assert_non_null(line);
            int cols = 0;
            for (const char *p = line; *p; p++)
                cols += ((unsigned char)*p & 0xc0) != 0x80;
            size_t len = strlen(line);
            const char *tail = " (steps 1235-1490)";
            printf("# width %3d %s: %3d columns, ends '%s'\n", widths[i], u ? "utf8 " : "ascii", cols,
                   line + (len > 40 ? len - 40 : 0));
            assert_true(cols <= widths[i]);
            assert_true(len > strlen(tail) && !strcmp(line + len - strlen(tail), tail));
            assert_non_null(strstr(line, "e-05.."));
        }
    free(h);
    free(now);
    free(f);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "monitor"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_line_whole),
        cmocka_unit_test(test_monitors_do_not_disturb),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    for (int i = 0; i < num_children; i++)
        if (waitpid(children[i], NULL, WNOHANG) == 0) {
            kill(children[i], SIGTERM);
            waitpid(children[i], NULL, 0);
        }
    if (rc != 0) {
        /* a launcher stopped during its start-up may leave its shared state behind */
        char *out;
        tu_sh(&out, "%s --clean %s/a.ini 2>&1", tu_bin("slidedp-launch"), dir);
        free(out);
    }
    tu_rmrf(dir);
    return rc;
}
