/* Every protocol publish point (common/fault.c fault_points) in every process that passes it:
 * the launcher, both workers (main and poster threads) and both optimizers, in a job with three
 * micro-steps, validation and checkpoints every 4 steps, once with the gradients reduced on the CPU
 * (host slots) and once with the exchange routes (sharded parameters, gradients reduced between
 * the workers). A clean run counts each process's passes of each point (SLIDEDP_FAULT_COUNT); each
 * (point, process) is then killed at its middle pass, in a job of its own (batch_width() jobs at
 * once), and must end with weights and metrics bit-identical to the clean run (a killed launcher:
 * after a relaunch; its points, which do not depend on the routes, in the first job only). Then
 * SIGTERM-then-kill sequences: while the job stops, a worker, an optimizer or the launcher dies; the
 * relaunch resumes and ends bit-identical. And the exchanging job's last validation cut short on one
 * worker only (held at a point, its peer's validation done, then killed), and each worker and
 * optimizer held at each of its points while its launcher is killed (the relaunch adopts the state
 * and kills the held process; batch_width() jobs at once too). Prints the table of points
 * x processes.
 * SLIDEDP_KILLPOINTS_LONG=1 kills each at its first, middle and last pass (three times as long). */
#include "tests/testutil.h"
#include "tests/jobrun.h"

#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/fault.h"
#include "shm/ctl.h"
#include "shm/futex.h"

#define STEPS 10
#define EXTRA "every = 4"
#define VAL "val = ../data/val.bin\nval_every = 4\nval_sequences = 16\n"

static const struct variant host_slots = {"cpu", "accumulate_on_device = false\n", false, 0, 3, VAL, NULL, NULL};
static const struct variant exchanging = {"xchg", "param_route = sharded\ngrad_route = gpu\n", false, 0, 3, VAL, NULL, NULL};

/* The processes: the launcher, workers 0 and 1, optimizers 0 and 1. */
#define PROCS 5
static const char *const proc_role[PROCS] = {"launcher", "worker", "worker", "optim", "optim"};
static const int proc_index[PROCS] = {0, 0, 1, 0, 1};
static const char *const proc_label[PROCS] = {"launcher", "worker0", "worker1", "optim0", "optim1"};

#define MAX_POINTS 64
struct table {
    long hits[MAX_POINTS][PROCS]; /* passes in the clean run */
    char mark[MAX_POINTS][PROCS]; /* '=' bit-identical after the kill, '-' not passed */
};

static int num_points(void)
{
    int n = 0;
    while (fault_points[n])
        n++;
    assert_true(n <= MAX_POINTS);
    return n;
}

/* Reads the clean run's pass counts (one file per process: <role><index>.<pid>). */
static void read_counts(const char *count_dir, struct table *t)
{
    memset(t->hits, 0, sizeof t->hits);
    DIR *d = opendir(count_dir);
    assert_non_null(d);
    struct dirent *e;
    int files = 0;
    while ((e = readdir(d))) {
        int p = -1;
        for (int i = 0; i < PROCS; i++) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "%s%d.", proc_role[i], proc_index[i]);
            if (!strncmp(e->d_name, prefix, strlen(prefix)))
                p = i;
        }
        if (p < 0)
            continue;
        files++;
        char path[1700], point[64];
        snprintf(path, sizeof path, "%s/%s", count_dir, e->d_name);
        FILE *f = fopen(path, "r");
        assert_non_null(f);
        long n;
        while (fscanf(f, "%63s %ld", point, &n) == 2)
            for (int i = 0; fault_points[i]; i++)
                if (!strcmp(fault_points[i], point))
                    t->hits[i][p] = n;
        fclose(f);
    }
    closedir(d);
    assert_int_equal(files, PROCS);
}

/* The job that kills process p at the k-th pass of point i, its `which` pass (middle, first or last:
 * the same k for a point passed once or twice, each a job of its own), written, not run yet. */
static void kill_job(const struct variant *v, int i, int p, long k, const char *which, struct batch_job *job)
{
    snprintf(job->spec, sizeof job->spec, "%s:%ld:r%d", fault_points[i], k, proc_index[p]);
    snprintf(job->name, sizeof job->name, "%s-%s-%s-%ld-%s", v->tag, fault_points[i], proc_label[p], k, which);
    job->relaunch = p == 0;
    job->relaunch_after = 128 + SIGKILL;
    write_job_as(v, job->name, STEPS, EXTRA);
}

/* The outcome of kill_job's job once run: a killed launcher's job ends after a relaunch, another
 * process is restarted; the weights and metrics are the clean run's. */
static void check_kill(const char *ref, int p, const struct batch_job *job)
{
    const char *name = job->name, *spec = job->spec;
    bool launcher = p == 0;
    int rc = job->rc[0];
    if (rc != (launcher ? 128 + SIGKILL : 0)) {
        show_log(name);
        fail_msg("%s: SLIDEDP_CRASH_AT=%s -> exit %d", name, spec, rc);
    }
    if (launcher) {
        rc = job->rc[1];
        if (rc != 0) {
            show_log(name);
            fail_msg("%s: the relaunch after SLIDEDP_CRASH_AT=%s -> exit %d", name, spec, rc);
        }
    } else {
        char logp[1300], died[64];
        job_path(name, "launcher.log", logp, sizeof logp);
        snprintf(died, sizeof died, "%s %d died from signal 9", p <= 2 ? "worker" : "optimizer", proc_index[p]);
        char *log = tu_read_file(logp, NULL);
        bool ok = log && strstr(log, died);
        free(log);
        if (!ok) {
            show_log(name);
            fail_msg("%s: no '%s' at %s", name, died, spec);
        }
    }
    assert_same_weights(name, ref);
    char p_dir[1300];
    job_path(name, "", p_dir, sizeof p_dir);
    tu_rmrf(p_dir); /* a few MiB each; keep the scratch dir small */
}

static void print_table(const char *title, const struct table *t)
{
    printf("# %s: point x process ('=' killed at its middle pass and bit-identical, '-' not passed)\n", title);
    printf("# %-24s", "point");
    for (int p = 0; p < PROCS; p++)
        printf(" %-8s", proc_label[p]);
    printf("\n");
    for (int i = 0; fault_points[i]; i++) {
        printf("# %-24s", fault_points[i]);
        for (int p = 0; p < PROCS; p++)
            printf(" %-8c", t->mark[i][p]);
        printf("\n");
    }
}

/* The launcher's points do not depend on the routes: with_launcher false leaves them to the other
 * run (marked '-' in this table). */
static void enumerate(const struct variant *v, bool with_launcher)
{
    uint64_t t0 = clock_ns();
    char ref[64], count_dir[1300];
    snprintf(ref, sizeof ref, "ref-%s", v->tag);
    write_job_as(v, ref, STEPS, EXTRA);
    job_path(ref, "counts", count_dir, sizeof count_dir);
    assert_int_equal(tu_sh(NULL, "mkdir -p %s", count_dir), 0);
    setenv("SLIDEDP_FAULT_COUNT", count_dir, 1);
    int rc = run_job(ref, NULL);
    unsetenv("SLIDEDP_FAULT_COUNT");
    assert_int_equal(rc, 0);
    static struct table t;
    read_counts(count_dir, &t);
    bool all = getenv("SLIDEDP_KILLPOINTS_LONG") != NULL;
    static struct batch_job jobs[MAX_POINTS * PROCS * 3];
    static int job_proc[MAX_POINTS * PROCS * 3];
    int kills = 0;
    for (int i = 0; i < num_points(); i++)
        for (int p = 0; p < PROCS; p++) {
            long n = t.hits[i][p];
            t.mark[i][p] = '-';
            if (n == 0 || (p == 0 && !with_launcher))
                continue;
            long at[3] = {n / 2 + 1, 1, n};
            static const char *const which[3] = {"middle", "first", "last"};
            for (int j = 0; j < (all ? 3 : 1); j++, kills++) {
                kill_job(v, i, p, at[j], which[j], &jobs[kills]);
                job_proc[kills] = p;
            }
            t.mark[i][p] = '=';
        }
    run_batch(jobs, kills);
    for (int k = 0; k < kills; k++)
        check_kill(ref, job_proc[k], &jobs[k]);
    print_table(v->tag, &t);
    printf("# %s: %d kills, all bit-identical, in %.1f s\n", v->tag, kills, (double)(clock_ns() - t0) * 1e-9);
}

static void test_every_point_host_slots(void **state)
{
    enumerate(&host_slots, true);
}

static void test_every_point_exchanging(void **state)
{
    enumerate(&exchanging, false);
}

/* Waits until worker `rank` of the job has written its validation sums of step s. */
static void wait_val_done(pid_t launcher, const char *name, uint32_t s, int rank)
{
    char job[32];
    job_name_of(name, job, sizeof job);
    for (uint64_t t0 = clock_ns();; usleep(5000)) {
        struct job_shm shm;
        if (job_shm_attach(&shm, job, JOB_MAP_CTL, true) == 0) {
            bool done = atomic_load(&ctl_step(shm.ctl, s)->val_done[rank]) == s;
            job_shm_detach(&shm);
            if (done)
                return;
        }
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(launcher, name);
    }
}

/* The exchanging job's validation after its last step, cut short on one rank only: worker 0 held at
 * its last pass of worker_param_staged (that validation staging its last shard), worker 1 finishing
 * the validation meanwhile (it has every shard), then worker 0 killed. Both restart (§8.4) with only
 * worker 0 owing the validation; its gathers need worker 1, which has no step left to run. */
static void test_last_validation_cut_short(void **state)
{
    static struct table t;
    char count_dir[1300];
    job_path("ref-xchg", "counts", count_dir, sizeof count_dir); /* test_every_point_exchanging's clean run */
    read_counts(count_dir, &t);
    int staged = 0;
    while (strcmp(fault_points[staged], "worker_param_staged"))
        staged++;
    char spec[96];
    snprintf(spec, sizeof spec, "worker_param_staged:%ld:stop:r0", t.hits[staged][1]);
    const char *name = "xchg-last-val-cut-short";
    write_job_as(&exchanging, name, STEPS, EXTRA);
    pid_t pid = start_launcher(name, spec);
    int held = wait_proc_stopped(pid, name, PROC_WORKER, 0);
    wait_val_done(pid, name, STEPS, 1);
    printf("# %s: worker 0 held at %s, worker 1's validation of step %d done, worker 0 killed\n", name, spec,
           STEPS);
    kill(held, SIGKILL);
    assert_finishes_like(pid, name, "ref-xchg");
}

/* SIGTERM while worker 0 is held mid-run (stopped in step 5), then, once the stop is under way, a
 * victim is killed (worker 1, optimizer 0, or the launcher) and worker 0 continued. The documented
 * outcome: the job stops (130: a worker died while stopping; 1: an optimizer died, nobody can
 * finish its chunks; killed: the launcher) with the newest consistent checkpoint on disk or its
 * state in /dev/shm, and the relaunch ends bit-identical. */
static void sigterm_then_kill(const struct variant *v, const char *victim)
{
    char name[96], ref[64];
    snprintf(name, sizeof name, "term-%s-%s", v->tag, victim);
    snprintf(ref, sizeof ref, "ref-%s", v->tag);
    write_job_as(v, name, STEPS, EXTRA);
    pid_t pid = start_launcher(name, "worker_loss_saved:13:stop:r0");
    int held = wait_proc_stopped(pid, name, PROC_WORKER, 0);
    kill(pid, SIGTERM);
    wait_stop_requested(pid, name);
    int expect;
    if (!strcmp(victim, "launcher")) {
        kill(pid, SIGKILL);
        expect = 128 + SIGKILL;
    } else {
        bool worker = !strcmp(victim, "worker1");
        kill(job_proc_pid(name, worker ? PROC_WORKER : PROC_OPTIM, worker ? 1 : 0), SIGKILL);
        expect = worker ? 130 : 1;
    }
    kill(held, SIGCONT);
    int rc = wait_exit(pid, name);
    printf("# %s: SIGTERM, then %s killed while stopping -> exit %d\n", name, victim, rc);
    if (rc != expect)
        show_log(name);
    assert_int_equal(rc, expect);
    assert_finishes_like(start_launcher(name, NULL), name, ref);
}

/* Worker 0 dead between posting the last gradient of step 5 and marking the step done, and its
 * launcher dead too: the relaunch adopts the state and starts a new worker 0, which finds every
 * gradient of step 5 posted. It must still mark the step done (its loss is saved): left unmarked,
 * the step is never logged, and the workers, which run at most half the step records (32) ahead of
 * the logging, stall at step 37 with the job alive (test_faults' launcher kills hung so once, at
 * step 27 + 32). Held by SIGSTOP at its 15th progress mark (3 micro-steps a step: the last of step
 * 5), the worker is then killed by the relaunch as an orphan. Both routes: host slots and the
 * exchange (whose relaunched workers redo their first step together). */
#define ADOPT_STEPS 48

/* The job `name` (written) held at SLIDEDP_CRASH_AT=spec in process (kind, index), its launcher
 * killed, then relaunched: it must end like ref, every checkpoint on the way too. */
static void hold_kill_launcher_adopt(const char *name, const char *spec, int kind, int index, const char *ref)
{
    pid_t pid = start_launcher(name, spec);
    wait_proc_stopped(pid, name, kind, index);
    kill(pid, SIGKILL);
    assert_int_equal(wait_exit(pid, name), 128 + SIGKILL);
    assert_finishes_like(start_launcher(name, NULL), name, ref);
    assert_same_checkpoints(name, ref);
}

static void test_adopted_unmarked_step(void **state)
{
    const struct variant *variants[] = {&host_slots, &exchanging};
    for (int v = 0; v < 2; v++) {
        char name[64], ref[64];
        snprintf(name, sizeof name, "adopt-unmarked-%s", variants[v]->tag);
        snprintf(ref, sizeof ref, "ref-adopt-%s", variants[v]->tag);
        write_job_as(variants[v], ref, ADOPT_STEPS, EXTRA);
        assert_int_equal(run_job(ref, NULL), 0);
        write_job_as(variants[v], name, ADOPT_STEPS, EXTRA);
        printf("# %s: worker 0 held after posting step 5, its launcher killed; relaunched\n", name);
        hold_kill_launcher_adopt(name, "poster_marked:15:stop:r0", PROC_WORKER, 0, ref);
    }
}

/* The same at every point a worker or an optimizer passes, at pass n/2 of the n in the clean run of
 * test_every_point_host_slots or _exchanging (for worker 0's progress marks, 3 a step, the last of
 * step 5: the case above): the process held there (SIGSTOP), its launcher killed, the relaunch
 * adopts the state and kills the held process as an orphan; bit-identical to that clean run. The
 * (point, process) pairs go batch_width() at a time, as the enumeration's kills do: each job has its
 * own folder and shm names, and each step waits for all of the batch's jobs. */
struct adopt_case {
    char name[96], spec[96];
    int kind, index;
    pid_t pid;
};

static void adopt_batch(struct adopt_case *c, int n, const char *ref)
{
    for (int i = 0; i < n; i++)
        c[i].pid = start_launcher(c[i].name, c[i].spec);
    for (int i = 0; i < n; i++) {
        wait_proc_stopped(c[i].pid, c[i].name, c[i].kind, c[i].index);
        kill(c[i].pid, SIGKILL);
        assert_int_equal(wait_exit(c[i].pid, c[i].name), 128 + SIGKILL);
    }
    for (int i = 0; i < n; i++)
        c[i].pid = start_launcher(c[i].name, NULL);
    for (int i = 0; i < n; i++) {
        assert_finishes_like(c[i].pid, c[i].name, ref);
        assert_same_checkpoints(c[i].name, ref);
        char dir[1300];
        job_path(c[i].name, "", dir, sizeof dir);
        tu_rmrf(dir);
    }
}

static void every_point_adopted(const struct variant *v)
{
    uint64_t t0 = clock_ns();
    static struct table t;
    char ref[64], count_dir[1300];
    snprintf(ref, sizeof ref, "ref-%s", v->tag);
    job_path(ref, "counts", count_dir, sizeof count_dir);
    read_counts(count_dir, &t);
    struct adopt_case batch[BATCH_MAX];
    int width = batch_width(), pending = 0, held = 0;
    for (int p = 1; p < PROCS; p++)
        for (int i = 0; i < num_points(); i++) {
            long n = t.hits[i][p];
            if (n == 0)
                continue;
            long k = n > 1 ? n / 2 : 1;
            struct adopt_case *c = &batch[pending++];
            snprintf(c->name, sizeof c->name, "adopt-%s-%s-%s-%ld", v->tag, proc_label[p], fault_points[i], k);
            snprintf(c->spec, sizeof c->spec, "%s:%ld:stop:r%d", fault_points[i], k, proc_index[p]);
            c->kind = p <= 2 ? PROC_WORKER : PROC_OPTIM;
            c->index = proc_index[p];
            write_job_as(v, c->name, STEPS, EXTRA);
            held++;
            if (pending == width) {
                adopt_batch(batch, pending, ref);
                pending = 0;
            }
        }
    adopt_batch(batch, pending, ref);
    printf("# %s: a process held at each of %d (point, process) pairs, %d at a time, its launcher killed, "
           "relaunched: all bit-identical, in %.1f s\n",
           v->tag, held, width, (double)(clock_ns() - t0) * 1e-9);
}

static void test_every_point_adopted(void **state)
{
    every_point_adopted(&host_slots);
    every_point_adopted(&exchanging);
}

static void test_sigterm_then_kill(void **state)
{
    static const char *const victims[] = {"worker1", "optim0", "launcher"};
    const struct variant *variants[] = {&host_slots, &exchanging};
    for (int v = 0; v < 2; v++)
        for (int k = 0; k < 3; k++)
            sigterm_then_kill(variants[v], victims[k]);
}

int main(void)
{
    tu_seed("killpoints", 0); /* nothing random: every kill is at a named point */
    jobs_setup("killpoints");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_point_host_slots),
        cmocka_unit_test(test_every_point_exchanging),
        cmocka_unit_test(test_last_validation_cut_short),
        cmocka_unit_test(test_adopted_unmarked_step),
        cmocka_unit_test(test_every_point_adopted),
        cmocka_unit_test(test_sigterm_then_kill),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(jobs_dir);
    return rc;
}
