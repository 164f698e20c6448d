/* Who may act on a running job (docs/design.md §3.4, §8.6; README "What you may do to a running
 * job"): a terminal's Ctrl-C (SIGINT to the whole process group) stops it cleanly with its checkpoint
 * and the same command resumes bit-identically; a second launcher of a live job, even one still
 * creating its state, exits 2 and touches nothing; of two relaunchers of an orphaned state only one
 * adopts it; a launcher that is PID 1 (a container without an init) runs the job, and after a kill in
 * a fresh PID namespace the relaunch, which gets the same pid, adopts the state; a state naming a
 * live process of another start time as its launcher (a reused pid) is adopted and removed by
 * --clean. Every held moment is a named fault point (SIGSTOP), never a sleep. */
#include "tests/testutil.h"
#include "tests/jobrun.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/ctl.h"
#include "shm/futex.h"

#define STEPS 12
#define EXTRA "every = 4\n"
/* worker 0 stops itself saving the loss of step 5's second micro-step: step 4 is the last logged */
#define HOLD_IN_STEP_5 "worker_loss_saved:10:stop:r0"

static const struct variant plain = {"plain", "", false, 0, 0, NULL, NULL, NULL};
static const char *const pid_namespace[] = {"unshare", "--pid", "--fork", "--mount-proc", NULL};

static void test_reference(void **state)
{
    write_job_as(&plain, "ref", STEPS, EXTRA);
    int rc = run_job("ref", NULL);
    if (rc != 0)
        show_log("ref");
    assert_int_equal(rc, 0);
}

/* SIGINT to the launcher's process group while worker 0 is held in step 5: exit 130, the checkpoint
 * of the last step the workers agreed on disk, and the same command then ends like the
 * uninterrupted run. */
static void test_ctrl_c(void **state)
{
    write_job_as(&plain, "ctrl-c", STEPS, EXTRA);
    pid_t pid = start_launcher_as("ctrl-c", HOLD_IN_STEP_5, NULL, true);
    int worker = wait_proc_stopped(pid, "ctrl-c", PROC_WORKER, 0);
    assert_int_equal(kill(-pid, SIGINT), 0); /* as a terminal sends it: its pid is its group */
    wait_stop_requested(pid, "ctrl-c");
    kill(worker, SIGCONT);
    int rc = wait_exit(pid, "ctrl-c");
    printf("# ctrl-c: SIGINT to process group %d -> exit %d\n", (int)pid, rc);
    if (rc != 130)
        show_log("ctrl-c");
    assert_int_equal(rc, 130);
    int first, last;
    metrics_lines("ctrl-c", &first, &last);
    char p[1300], step_dir[64];
    /* the workers agree the last step: 5, where worker 0 was held, or 6 if worker 1 had announced it */
    snprintf(step_dir, sizeof step_dir, "ckpt/step-%d/optimizer.safetensors", last);
    job_path("ctrl-c", step_dir, p, sizeof p);
    printf("# stopped after step %d; %s %s\n", last, p, tu_exists(p) ? "exists" : "missing");
    assert_true(last == 5 || last == 6);
    assert_true(tu_exists(p));
    assert_int_equal(log_count("ctrl-c", "died from signal"), 0);
    /* one host: nothing to say about a lost host, and no step left unlogged */
    assert_int_equal(log_count("ctrl-c", "host's") + log_count("ctrl-c", "this host") + log_count("ctrl-c", "never logged"), 0);
    char job[32];
    job_name_of("ctrl-c", job, sizeof job);
    assert_int_equal(tu_shm_objects(job), 0);
    assert_int_equal(run_job("ctrl-c", NULL), 0);
    assert_same_weights("ctrl-c", "ref");
    assert_int_equal(metrics_lines("ctrl-c", &first, &last), STEPS);
}

/* The job's lock file is gone once its launcher has ended. */
static void assert_no_lock(const char *name)
{
    char job[32], p[96];
    job_name_of(name, job, sizeof job);
    snprintf(p, sizeof p, "/dev/shm/slidedp-%s.lock", job);
    assert_false(tu_exists(p));
}

/* Starts a second launcher while the first one is stopped at a fault point; it must exit 2 and leave
 * the objects as they were (their count, ctl's header untouched, no log.dir). Then the first goes on
 * and ends like the uninterrupted run. */
static void second_launcher_refused(const char *name, pid_t first)
{
    char job[32], ctl[96];
    job_name_of(name, job, sizeof job);
    int objects = tu_shm_objects(job);
    snprintf(ctl, sizeof ctl, "/dev/shm/slidedp.%s.ctl", job);
    size_t ctl_len;
    char *before = tu_read_file(ctl, &ctl_len);
    assert_non_null(before);
    int rc = run_job(name, NULL);
    printf("# %s: second launcher -> exit %d (the first, pid %d, is held)\n", name, rc, (int)first);
    if (rc != 2) {
        kill(first, SIGKILL);
        waitpid(first, NULL, 0);
        show_log(name);
        free(before);
        fail_msg("%s: the second launcher of a live job exited %d, not 2", name, rc);
    }
    size_t after_len;
    char *after = tu_read_file(ctl, &after_len);
    assert_int_equal(tu_shm_objects(job), objects);
    assert_true(after && after_len == ctl_len && !memcmp(before, after, ctl_len));
    free(before);
    free(after);
    assert_int_equal(log_count(name, "is already running"), 1);
    kill(first, SIGCONT);
    assert_finishes_like(first, name, "ref");
    assert_no_lock(name);
}

/* (item 3) The first launcher holds after creating the objects, before their header: the second
 * took that for a dead launcher's leftover and removed it. */
static void test_second_launcher_while_creating(void **state)
{
    write_job_as(&plain, "creating", STEPS, EXTRA);
    pid_t first = start_launcher("creating", "launcher_regions_created:1:stop");
    wait_launcher_stopped(first, "creating");
    second_launcher_refused("creating", first);
}

/* Whether pid runs (a zombie is gone). */
static bool runs(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    char *stat = tu_read_file(path, NULL);
    const char *paren = stat ? strrchr(stat, ')') : NULL;
    bool running = paren && paren[1] == ' ' && paren[2] != 'Z';
    free(stat);
    return running;
}

/* A state whose launcher was killed after logging step 4; returns once its children, which die with
 * it, are gone (so nothing writes the state any more). */
static void orphan(const char *name)
{
    write_job_as(&plain, name, STEPS, EXTRA);
    assert_int_equal(run_job(name, "launcher_logged:4"), 128 + SIGKILL);
    char job[32];
    job_name_of(name, job, sizeof job);
    assert_int_equal(tu_shm_objects(job), 4);
    for (int i = 0; i < 4; i++) {
        int kind = i < 2 ? PROC_WORKER : PROC_OPTIM, pid = job_proc_pid(name, kind, i % 2);
        for (uint64_t t0 = clock_ns(); pid > 0 && runs(pid); usleep(5000))
            if (clock_ns() - t0 > HANG_S * 1000000000ull)
                fail_msg("%s: %s %d (pid %d) outlived its launcher", name, i < 2 ? "worker" : "optimizer", i % 2, pid);
    }
}

/* (item 3) An orphaned state (its launcher killed after logging step 4) and two relaunchers: the
 * first holds after judging the state adoptable, before adopting it; the second must not adopt it
 * too (it did, and killed the other's children). */
static void test_two_relaunchers(void **state)
{
    orphan("orphan");
    pid_t first = start_launcher("orphan", "launcher_state_checked:1:stop");
    wait_launcher_stopped(first, "orphan");
    second_launcher_refused("orphan", first);
    assert_int_equal(log_count("orphan", "adopting the state a dead launcher left"), 1);
}

/* The launcher's pid in our namespace: the only child of `unshare --fork` (pid wrapper). */
static pid_t namespace_init(pid_t wrapper, const char *name)
{
    char p[96];
    snprintf(p, sizeof p, "/proc/%d/task/%d/children", (int)wrapper, (int)wrapper);
    for (uint64_t t0 = clock_ns();; usleep(5000)) {
        char *text = tu_read_file(p, NULL);
        int pid = text ? atoi(text) : 0;
        free(text);
        if (pid > 0)
            return pid;
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(wrapper, name);
    }
}

/* Waits until the job's launcher is PID 1 of its namespace and has logged step `logged`. */
static void wait_logged_as_pid1(pid_t wrapper, const char *name, uint32_t logged)
{
    char job[32];
    job_name_of(name, job, sizeof job);
    for (uint64_t t0 = clock_ns();; usleep(5000)) {
        struct job_shm shm;
        if (job_shm_attach(&shm, job, JOB_MAP_CTL, true) == 0) {
            bool there = atomic_load(&shm.ctl->launcher_pid) == 1 && atomic_load(&shm.ctl->metrics_step) >= logged;
            job_shm_detach(&shm);
            if (there)
                return;
        }
        if (waitpid(wrapper, NULL, WNOHANG) == wrapper)
            fail_msg("%s: the launcher exited before it logged step %u", name, logged);
        if (clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_hung(wrapper, name);
    }
}

/* Runs the job as PID 1 of a new PID namespace with worker 0 held in step 5, and kills that
 * launcher (so the whole namespace) once step 4 is logged: the state it leaves records pid 1. */
static void kill_pid1_launcher(const char *name)
{
    pid_t wrapper = start_launcher_as(name, HOLD_IN_STEP_5, pid_namespace, false);
    pid_t init = namespace_init(wrapper, name);
    wait_logged_as_pid1(wrapper, name, 4);
    assert_int_equal(kill(init, SIGKILL), 0);
    int rc = wait_exit(wrapper, name); /* unshare returns once its child, and so the namespace, is gone */
    printf("# %s: launcher (pid 1 in its namespace, %d here) killed; unshare exit %d\n", name, (int)init, rc);
    char job[32];
    job_name_of(name, job, sizeof job);
    assert_int_equal(tu_shm_objects(job), 4);
}

static bool skip_without_pid_namespaces(void)
{
    char *out = NULL;
    int rc = tu_sh(&out, "unshare --pid --fork --mount-proc true 2>&1");
    free(out);
    if (rc != 0)
        printf("# unshare --pid is not permitted here: skipped\n");
    return rc != 0;
}

/* (item 4) A launcher that is PID 1 (a container without an init) runs the job: every child took
 * getppid() == 1 for its launcher's death. */
static void test_pid1_runs(void **state)
{
    if (skip_without_pid_namespaces())
        skip();
    write_job_as(&plain, "pid1", STEPS, EXTRA);
    int rc = wait_exit(start_launcher_as("pid1", NULL, pid_namespace, false), "pid1");
    printf("# pid1: the launcher as PID 1 -> exit %d\n", rc);
    if (rc != 0)
        show_log("pid1");
    assert_int_equal(rc, 0);
    assert_same_weights("pid1", "ref");
    assert_no_lock("pid1");
}

/* (item 4) Killed as PID 1, relaunched in a fresh namespace, where it is PID 1 again: it adopts the
 * state (it was refused: "already running under launcher pid 1"). */
static void test_pid1_killed_relaunched(void **state)
{
    if (skip_without_pid_namespaces())
        skip();
    write_job_as(&plain, "pid1-kill", STEPS, EXTRA);
    kill_pid1_launcher("pid1-kill");
    int rc = wait_exit(start_launcher_as("pid1-kill", NULL, pid_namespace, false), "pid1-kill");
    printf("# pid1-kill: the relaunch, PID 1 again -> exit %d\n", rc);
    if (rc != 0)
        show_log("pid1-kill");
    assert_int_equal(rc, 0);
    assert_int_equal(log_count("pid1-kill", "adopting the state a dead launcher left"), 1);
    assert_same_weights("pid1-kill", "ref");
    assert_no_lock("pid1-kill");
}

/* An orphaned state whose record names a live process of another start time as its launcher: pid 1
 * here, as after a container's restart. */
static void orphan_with_reused_pid(const char *name)
{
    orphan(name);
    char job[32];
    job_name_of(name, job, sizeof job);
    struct job_shm shm;
    if (job_shm_attach(&shm, job, JOB_MAP_CTL, false) != 0)
        fail_msg("%s: no shared state", name);
    atomic_store(&shm.ctl->launcher_pid, 1);
    job_shm_detach(&shm);
}

/* (item 4) The relaunch over such a state was refused ("already running under launcher pid 1"): it
 * adopts it and ends like the uninterrupted run. */
static void test_reused_pid_relaunch(void **state)
{
    orphan_with_reused_pid("reused");
    int rc = run_job("reused", NULL);
    printf("# reused: relaunch over a state naming pid 1 -> exit %d\n", rc);
    if (rc != 0)
        show_log("reused");
    assert_int_equal(rc, 0);
    assert_int_equal(log_count("reused", "adopting the state a dead launcher left"), 1);
    assert_same_weights("reused", "ref");
}

/* (item 4) Such a state was shown as a running job by the monitors and --clean refused it ("running
 * under pid 1"): slidedp-stat says it is not running (exit 1), and --clean removes it. */
static void test_reused_pid_clean(void **state)
{
    orphan_with_reused_pid("reused-clean");
    char ini[1300], *out = NULL, job[32];
    job_name_of("reused-clean", job, sizeof job);
    int rc = tu_sh(&out, "%s %s 2>&1", tu_bin("slidedp-stat"), job);
    printf("# reused-clean: slidedp-stat -> exit %d: %s", rc, out);
    assert_int_equal(rc, 1);
    assert_non_null(strstr(out, "is not running"));
    free(out);
    job_path("reused-clean", "job.ini", ini, sizeof ini);
    rc = tu_sh(&out, "%s --clean %s 2>&1", tu_bin("slidedp-launch"), ini);
    printf("# reused-clean: --clean -> exit %d: %s", rc, out);
    free(out);
    assert_int_equal(rc, 0);
    assert_int_equal(tu_shm_objects(job), 0);
    assert_no_lock("reused-clean");
}

int main(void)
{
    jobs_setup("owner");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_ctrl_c),
        cmocka_unit_test(test_second_launcher_while_creating),
        cmocka_unit_test(test_two_relaunchers),
        cmocka_unit_test(test_pid1_runs),
        cmocka_unit_test(test_pid1_killed_relaunched),
        cmocka_unit_test(test_reused_pid_relaunch),
        cmocka_unit_test(test_reused_pid_clean),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(jobs_dir);
    return rc;
}
