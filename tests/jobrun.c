/* Implementation of the whole-job helpers (see jobrun.h). */
#include "tests/testutil.h"
#include "tests/jobrun.h"

#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"
#include "shm/ctl.h"
#include "shm/futex.h"

char jobs_dir[1024];

void jobs_setup(const char *tag)
{
    snprintf(jobs_dir, sizeof jobs_dir, "%s", tu_tmpdir(0, tag));
    char *out = NULL;
    if (tu_sh(&out, "%s copy --out %s/data --seq-len 64 --train 2000 --val 64 --seed 3", tu_bin("slidedp-data"),
              jobs_dir) != 0)
        fail_msg("slidedp-data failed: %s", out);
    free(out);
}

/* A job in its own folder (log, checkpoints) sharing the generated data. */
void write_job_as(const struct variant *v, const char *name, int steps, const char *extra)
{
    char p[1300], text[4096];
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n"
             "[data]\ntrain = ../data/train.bin\nseq_len = 64\n%s"
             "[train]\nmicro_batch = 2\ngrad_accum = %d\nsteps = %d\nlr = 3e-3\nwarmup = 5\nweight_decay = 0.01\n"
             "grad_clip = %s\nseed = 7\n%s"
             "[checkpoint]\ndir = ckpt\nexport_dtype = fp32\n%s\n"
             "[runtime]\ndevice = cpu\ngpus = %d\noptim_threads = 3\nweights_source = %s\n%s%s"
             "[log]\ndir = log\nevery = 1000\n",
             tu_src("examples/tiny-qwen3"), v->data ? v->data : "", v->grad_accum ? v->grad_accum : 2, steps,
             v->no_clip ? "0" : "1.0", v->train ? v->train : "", extra, v->gpus ? v->gpus : 2,
             v->weights_source ? v->weights_source : "bf16_copy", PINNED_PLAN, v->runtime);
    snprintf(p, sizeof p, "%s/%s", jobs_dir, name);
    tu_rmrf(p);
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", p);
    assert_int_equal(system(cmd), 0);
    snprintf(p, sizeof p, "%s/%s/job.ini", jobs_dir, name);
    tu_write_file(p, text);
}

void job_path(const char *name, const char *rel, char *out, size_t len)
{
    snprintf(out, len, "%s/%s/%s", jobs_dir, name, rel);
}

pid_t start_launcher(const char *name, const char *crash_at)
{
    return start_launcher_as(name, crash_at, NULL, false);
}

pid_t start_launcher_as(const char *name, const char *crash_at, const char *const *wrap, bool own_session)
{
    char ini[1300];
    job_path(name, "job.ini", ini, sizeof ini);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        char logp[1300];
        job_path(name, "launcher.log", logp, sizeof logp);
        FILE *f = freopen(logp, "a", stdout);
        (void)f;
        dup2(1, 2);
        if (own_session)
            setsid();
        if (crash_at)
            setenv("SLIDEDP_CRASH_AT", crash_at, 1);
        else
            unsetenv("SLIDEDP_CRASH_AT");
        const char *argv[16];
        int n = 0;
        for (; wrap && wrap[n]; n++)
            argv[n] = wrap[n];
        argv[n++] = tu_bin("slidedp-launch");
        argv[n++] = ini;
        argv[n] = NULL;
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

int log_count(const char *name, const char *text)
{
    char p[1300];
    job_path(name, "launcher.log", p, sizeof p);
    char *log = tu_read_file(p, NULL);
    int n = 0;
    for (const char *q = log; q && (q = strstr(q, text)); q++)
        n++;
    free(log);
    return n;
}

void show_log(const char *name)
{
    char p[1300];
    job_path(name, "launcher.log", p, sizeof p);
    char *log = tu_read_file(p, NULL);
    printf("%s", log ? log : "(no log)\n");
    free(log);
}


/* Stops a hung launcher (a second SIGINT aborts the job and removes its shared state), shows where
 * each of its processes was (slidedp-stat, taken first) and its log, and fails, rather than leaving
 * the test to its timeout and the processes behind. */
void fail_hung(pid_t pid, const char *name)
{
    char job[32], *stat = NULL;
    job_name_of(name, job, sizeof job);
    tu_sh(&stat, "%s %s 2>&1", tu_bin("slidedp-stat"), job);
    printf("# %s hung; its processes then (slidedp-stat):\n%s", name, stat ? stat : "(none)\n");
    free(stat);
    kill(pid, SIGINT);
    usleep(100000);
    kill(pid, SIGINT);
    waitpid(pid, NULL, 0);
    show_log(name);
    fail_msg("%s: the launcher hung (no step logged and no exit for %d s)", name, HANG_S);
}

static int exit_status(int st)
{
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int wait_exit(pid_t pid, const char *name)
{
    for (uint64_t t0 = clock_ns();; usleep(10000)) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return exit_status(st);
        if (r < 0)
            return -1;
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(pid, name);
    }
}

int run_job(const char *name, const char *crash_at)
{
    return wait_exit(start_launcher(name, crash_at), name);
}

char *final_weights(const char *name, size_t *len)
{
    char p[1300];
    job_path(name, "ckpt/final/model.safetensors", p, sizeof p);
    char *data = tu_read_file(p, len);
    if (!data)
        fail_msg("%s has no final weights", name);
    return data;
}

void job_name_of(const char *name, char *out, size_t len)
{
    char ini[1300];
    job_path(name, "job.ini", ini, sizeof ini);
    struct job_config job;
    if (job_config_load(ini, 0, NULL, &job) != 0)
        fail_msg("%s", sd_errmsg());
    ctl_job_name(job.log_dir, out, len);
}

/* The values of `key` in a job's metrics.jsonl, in order; returns how many (at most max). */
static int metric_values(const char *name, const char *key, double *out, int max)
{
    char p[1300];
    job_path(name, "log/metrics.jsonl", p, sizeof p);
    return tu_metrics_values(p, key, out, max);
}

/* Final weights bit-identical to the reference run's, every step's reported gradient norm (it steers
 * clipping, and without clipping a crash must not lose any part of it either), loss and validation
 * loss the same, and nothing left in /dev/shm. */
void assert_same_weights(const char *name, const char *ref)
{
    size_t a_len, b_len;
    char *a = final_weights(name, &a_len), *b = final_weights(ref, &b_len);
    if (a_len != b_len || memcmp(a, b, a_len) != 0) {
        show_log(name);
        fail_msg("%s: final weights differ from the uninterrupted run %s", name, ref);
    }
    free(a);
    free(b);
    static const char *const keys[] = {"grad_norm", "loss", "val_loss"};
    for (int k = 0; k < 3; k++) {
        double na[200], nb[200];
        int n = metric_values(name, keys[k], na, 200);
        assert_int_equal(n, metric_values(ref, keys[k], nb, 200));
        for (int i = 0; i < n; i++)
            if (na[i] != nb[i])
                fail_msg("%s: %s #%d %.6f differs from %s's %.6f", name, keys[k], i + 1, na[i], ref, nb[i]);
    }
    char job[32];
    job_name_of(name, job, sizeof job);
    assert_int_equal(tu_shm_objects(job), 0);
}

/* The names of the job's step-S checkpoints, sorted, space-separated. */
static void checkpoint_names(const char *name, char *out, size_t len)
{
    char dir[1300];
    job_path(name, "ckpt", dir, sizeof dir);
    char names[64][32];
    int n = 0;
    DIR *d = opendir(dir);
    for (struct dirent *e; d && (e = readdir(d)) && n < 64;)
        if (!strncmp(e->d_name, "step-", 5) && !strchr(e->d_name, '.'))
            snprintf(names[n++], sizeof names[0], "%.31s", e->d_name);
    if (d)
        closedir(d);
    qsort(names, (size_t)n, sizeof names[0], (int (*)(const void *, const void *))strcmp);
    out[0] = 0;
    for (int i = 0; i < n; i++)
        snprintf(out + strlen(out), len - strlen(out), "%s%s", i ? " " : "", names[i]);
}

void assert_same_checkpoints(const char *name, const char *ref)
{
    char have[2048], want[2048];
    checkpoint_names(name, have, sizeof have);
    checkpoint_names(ref, want, sizeof want);
    if (!want[0] || strcmp(have, want) != 0)
        fail_msg("%s: checkpoints '%s', %s has '%s'", name, have, ref, want);
    for (char *tok = want, *next; tok && *tok; tok = next) {
        next = strchr(tok, ' ');
        if (next)
            *next++ = 0;
        static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
        for (int f = 0; f < 2; f++) {
            char rel[128];
            snprintf(rel, sizeof rel, "ckpt/%.31s/%s", tok, files[f]);
            char pa[1300], pb[1300];
            job_path(name, rel, pa, sizeof pa);
            job_path(ref, rel, pb, sizeof pb);
            size_t la, lb;
            char *a = tu_read_file(pa, &la), *b = tu_read_file(pb, &lb);
            if (!a || !b || la != lb || memcmp(a, b, la) != 0)
                fail_msg("%s: %s differs from %s's", name, rel, ref);
            free(a);
            free(b);
        }
    }
}

int batch_width(void)
{
    const char *env = getenv("SLIDEDP_TEST_JOBS");
    if (env && atoi(env) >= 1)
        return atoi(env) < BATCH_MAX ? atoi(env) : BATCH_MAX;
    cpu_set_t cpus;
    int n = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 2;
    return n < 2 ? 2 : n > 4 ? 4 : n;
}

void run_batch(struct batch_job *jobs, int n)
{
    struct {
        pid_t pid;
        int job, run;
        uint64_t t0;
    } slot[BATCH_MAX];
    int width = batch_width(), running = 0, next = 0;
    while (next < n || running > 0) {
        for (; running < width && next < n; next++, running++) {
            jobs[next].rc[1] = -1;
            slot[running].pid = start_launcher(jobs[next].name, jobs[next].spec[0] ? jobs[next].spec : NULL);
            slot[running].job = next;
            slot[running].run = 0;
            slot[running].t0 = clock_ns();
        }
        usleep(10000);
        for (int i = 0; i < running;) {
            struct batch_job *j = &jobs[slot[i].job];
            int st;
            if (waitpid(slot[i].pid, &st, WNOHANG) != slot[i].pid) {
                if (clock_ns() - slot[i].t0 > HANG_S * 1000000000ull)
                    fail_hung(slot[i].pid, j->name);
                i++;
                continue;
            }
            j->rc[slot[i].run] = exit_status(st);
            if (slot[i].run == 0 && j->relaunch && j->rc[0] == j->relaunch_after) {
                slot[i].pid = start_launcher(j->name, NULL);
                slot[i].run = 1;
                slot[i].t0 = clock_ns();
                i++;
            } else {
                slot[i] = slot[--running];
            }
        }
    }
}

void assert_crash_finishes_like(const struct variant *v, const char *name, int steps, const char *spec, const char *ref)
{
    assert_crashes_finish_like(v, &name, &spec, 1, steps, ref);
}

void assert_crashes_finish_like(const struct variant *v, const char *const *names, const char *const *specs, int n,
                                int steps, const char *ref)
{
    struct batch_job *jobs = calloc((size_t)n, sizeof *jobs);
    assert_non_null(jobs);
    for (int i = 0; i < n; i++) {
        snprintf(jobs[i].name, sizeof jobs[i].name, "%s", names[i]);
        snprintf(jobs[i].spec, sizeof jobs[i].spec, "%s", specs[i]);
        write_job_as(v, names[i], steps, "");
    }
    run_batch(jobs, n);
    for (int i = 0; i < n; i++) {
        const char *name = names[i], *spec = specs[i];
        int rc = jobs[i].rc[0];
        printf("# %s: crash at %s -> exit %d\n", name, spec, rc);
        if (rc != 0)
            show_log(name);
        assert_int_equal(rc, 0);
        char logp[1300];
        job_path(name, "launcher.log", logp, sizeof logp);
        char *log = tu_read_file(logp, NULL);
        if (!strstr(log, "died from signal 9"))
            fail_msg("%s: no process died at %s", name, spec);
        free(log);
        assert_same_weights(name, ref);
    }
    free(jobs);
}

int metrics_lines(const char *name, int *first, int *last)
{
    char p[1300];
    job_path(name, "log/metrics.jsonl", p, sizeof p);
    char *text = tu_read_file(p, NULL);
    assert_non_null(text);
    int n = 0, expect = 1;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), n++) {
        int step;
        assert_int_equal(sscanf(line, "{\"step\":%d", &step), 1);
        if (step != expect)
            fail_msg("%s: metrics line %d is step %d", name, n + 1, step);
        expect++;
        if (n == 0)
            *first = step;
        *last = step;
    }
    free(text);
    return n;
}

/* Waits until the launcher `pid` has taken the job's state over and logged step `logged` (so a
 * signal or kill that follows finds it running, however slowly it started on a busy machine). */
void wait_running(pid_t pid, const char *name, uint32_t logged)
{
    char job[32];
    job_name_of(name, job, sizeof job);
    for (uint64_t t0 = clock_ns();; usleep(5000)) {
        struct job_shm shm;
        if (job_shm_attach(&shm, job, JOB_MAP_CTL, true) == 0) {
            bool running = atomic_load(&shm.ctl->launcher_pid) == pid && atomic_load(&shm.ctl->metrics_step) >= logged;
            job_shm_detach(&shm);
            if (running)
                return;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid)
            fail_msg("%s: the launcher exited before it was running", name);
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(pid, name);
    }
}

/* Whether process pid is stopped (SIGSTOP). */
static bool is_stopped(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    char *stat = tu_read_file(path, NULL);
    const char *paren = stat ? strrchr(stat, ')') : NULL;
    bool stopped = paren && paren[1] == ' ' && paren[2] == 'T';
    free(stat);
    return stopped;
}

void wait_launcher_stopped(pid_t launcher, const char *name)
{
    for (uint64_t t0 = clock_ns(); !is_stopped(launcher); usleep(5000)) {
        if (waitpid(launcher, NULL, WNOHANG) == launcher)
            fail_msg("%s: the launcher exited before it stopped", name);
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(launcher, name);
    }
}

/* Waits until the job's process (enum proc_kind) has stopped itself at a fault point, and returns
 * its pid. */
int wait_proc_stopped(pid_t launcher, const char *name, int kind, int index)
{
    char job[32];
    job_name_of(name, job, sizeof job);
    for (uint64_t t0 = clock_ns();; usleep(5000)) {
        struct job_shm shm;
        if (job_shm_attach(&shm, job, JOB_MAP_CTL, true) == 0) {
            int pid = atomic_load(&ctl_proc(shm.ctl, kind, index)->pid);
            job_shm_detach(&shm);
            if (pid > 0 && is_stopped(pid))
                return pid;
        }
        if (waitpid(launcher, NULL, WNOHANG) == launcher)
            fail_msg("%s: the launcher exited before the process stopped", name);
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(launcher, name);
    }
}

/* Waits until the launcher has asked the job's processes to stop (ctl_header.stop). */
void wait_stop_requested(pid_t launcher, const char *name)
{
    char job[32];
    job_name_of(name, job, sizeof job);
    for (uint64_t t0 = clock_ns();; usleep(2000)) {
        struct job_shm shm;
        if (job_shm_attach(&shm, job, JOB_MAP_CTL, true) == 0) {
            bool asked = atomic_load(&shm.ctl->stop) != STOP_NONE;
            job_shm_detach(&shm);
            if (asked)
                return;
        }
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(launcher, name);
    }
}

int job_proc_pid(const char *name, int kind, int index)
{
    char job[32];
    job_name_of(name, job, sizeof job);
    struct job_shm shm;
    if (job_shm_attach(&shm, job, JOB_MAP_CTL, true) != 0)
        fail_msg("%s: no shared state", name);
    int pid = atomic_load(&ctl_proc(shm.ctl, kind, index)->pid);
    job_shm_detach(&shm);
    return pid;
}

void assert_finishes_like(pid_t pid, const char *name, const char *ref)
{
    int rc = wait_exit(pid, name);
    if (rc != 0)
        show_log(name);
    assert_int_equal(rc, 0);
    assert_same_weights(name, ref);
}
