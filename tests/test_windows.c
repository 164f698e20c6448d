/* The crash windows between two stores that must be published together (issue 22's table), each
 * hit by construction with a named fault point (common/fault.c), not by timing: the launcher killed
 * while it initialises the weights, right after it logs a checkpoint step, after a SIGTERM drain;
 * a worker killed while its poster thread lags two micro-steps behind; a worker of the exchange
 * routes redoing a step the launcher has logged and recycled meanwhile; a validation re-run after
 * a restart. Each run must end bit-identical (weights and metrics) to an uninterrupted one. And the
 * watchdog: a worker that stops making progress (SIGSTOP) shows as stalled and is restarted. */
#include "tests/testutil.h"
#include "tests/jobrun.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "shm/ctl.h"
#include "shm/futex.h"

/* Three micro-steps (the saved losses of the first two cannot cover a lagging poster). */
static const struct variant accum3 = {"a3", "accumulate_on_device = false\n", false, 0, 3, NULL, NULL, NULL};
/* The same with validation every 16 steps. */
static const struct variant validating = {"val", "accumulate_on_device = false\n", false, 0, 3,
                                          "val = ../data/val.bin\nval_every = 16\nval_sequences = 32\n", NULL, NULL};
/* The same with a watchdog of 10 s (stalls show after 5). */
static const struct variant watched = {"wd", "accumulate_on_device = false\nwatchdog_s = 10\n", false, 0, 3, NULL, NULL, NULL};
/* Sharded parameters and GPU-side gradients through shared memory: workers restart together. */
static const struct variant exchanging = {"xchg", "param_route = sharded\ngrad_route = gpu\n", false, 0, 3, NULL, NULL, NULL};

/* Runs the job once with the fault spec (the launcher is expected to die from it when
 * launcher_dies), then again without, which must finish like the reference run. */
static void kill_then_relaunch(const struct variant *v, const char *name, const char *ref, int steps,
                               const char *extra, const char *spec, bool launcher_dies)
{
    write_job_as(v, name, steps, extra);
    int rc = run_job(name, spec);
    printf("# %s: %s -> launcher exit %d\n", name, spec, rc);
    if (rc != (launcher_dies ? 128 + SIGKILL : 0))
        show_log(name);
    assert_int_equal(rc, launcher_dies ? 128 + SIGKILL : 0);
    assert_finishes_like(start_launcher(name, NULL), name, ref);
}

static void reference(const struct variant *v, const char *name, int steps, const char *extra)
{
    write_job_as(v, name, steps, extra);
    int rc = run_job(name, NULL);
    if (rc != 0)
        show_log(name);
    assert_int_equal(rc, 0);
}

/* (1) Killed after creating the objects, before the header (the relaunch refused: "stale shared
 * memory ... launcher pid 0"). Nothing was trained: the relaunch starts afresh. */
static void test_launcher_killed_before_header(void **state)
{
    reference(&accum3, "ref-init", 12, "");
    kill_then_relaunch(&accum3, "init-created", "ref-init", 12, "", "launcher_regions_created:1", true);
}

/* (1) Killed while drawing the weights, after the header and its job hash (the relaunch adopted a
 * half-initialised model and exported it). */
static void test_launcher_killed_drawing_weights(void **state)
{
    kill_then_relaunch(&accum3, "init-drawing", "ref-init", 12, "", "launcher_init_block:3", true);
}

/* (2) Killed right after logging step 5 with checkpoint.every = 5, before writing the checkpoint
 * the optimizers wait for (the relaunch adopted and hung); and after writing it, before telling
 * them. The relaunch writes the due checkpoint and leaves no .tmp directory. */
static void test_launcher_killed_at_checkpoint(void **state)
{
    reference(&accum3, "ref-ckpt", 12, "every = 5");
    kill_then_relaunch(&accum3, "ckpt-logged", "ref-ckpt", 12, "every = 5", "launcher_logged:5", true);
    char p[1300];
    job_path("ckpt-logged", "ckpt/step-10/trainer_state.json", p, sizeof p);
    assert_true(tu_exists(p));
    kill_then_relaunch(&accum3, "ckpt-written", "ref-ckpt", 12, "every = 5", "launcher_ckpt_written:1", true);
    job_path("ckpt-written", "ckpt", p, sizeof p);
    assert_int_equal(tu_sh(NULL, "ls -A %s | grep -q tmp", p), 1); /* grep finds none */
}

/* (3) SIGTERM while worker 0 is stopped in step 4 (so the job is surely mid-run), the drain
 * abandons the step after the last one run, then the launcher is killed before its stop
 * checkpoint: the relaunch adopts a state whose abandoned step it must revive (an optimizer used
 * to exit 0 on it, and the job hung). */
static void test_launcher_killed_after_drain(void **state)
{
    reference(&accum3, "ref-drain", 12, "");
    write_job_as(&accum3, "drain", 12, "");
    pid_t pid = start_launcher("drain", "worker_loss_saved:10:stop:r0,launcher_stop_checkpoint:1");
    int worker = wait_proc_stopped(pid, "drain", PROC_WORKER, 0);
    kill(pid, SIGTERM);
    wait_stop_requested(pid, "drain");
    kill(worker, SIGCONT);
    int rc = wait_exit(pid, "drain");
    printf("# drain: SIGTERM then killed before the stop checkpoint -> exit %d\n", rc);
    if (rc != 128 + SIGKILL)
        show_log("drain");
    assert_int_equal(rc, 128 + SIGKILL);
    assert_finishes_like(start_launcher("drain", NULL), "drain", "ref-drain");
}

/* (4) Worker 1's poster thread is held at its first gradient of micro-step 1 of step 3 (after it
 * posted all of micro-step 0 and marked it), and the worker is killed once its main thread has
 * saved the loss of micro-step 2: the restart resumes at micro-step 1 and needs the loss of
 * micro-step 0 (two alternating copies had both been overwritten: a crash loop). Four chunks,
 * 3 micro-steps: 12 gradients per step. */
static void test_worker_killed_with_poster_behind(void **state)
{
    reference(&accum3, "ref-a3", 8, "");
    kill_then_relaunch(&accum3, "poster-behind", "ref-a3", 8, "",
                       "worker_slot_written:29:hold:r1,worker_loss_saved:9:r1", false);
}

/* (5) Exchange routes: worker 0 stops before sending its last gradient of step 2 and worker 1 dies
 * right after marking step 2 done, so both redo step 2; worker 1's redo stops before it marks
 * the step again, until the launcher has logged step 2 and recycled its record for step 66. Its
 * marks used to land in step 66's record: that step was then skipped by worker 1. */
static void test_redo_of_a_logged_step(void **state)
{
    reference(&exchanging, "ref-xchg", 70, "");
    write_job_as(&exchanging, "redo", 70, "");
    pid_t pid = start_launcher("redo", "worker_direct_sending:8:stop:r0,poster_rank_done:2:r1,"
                                       "poster_marked:3:stop:r1:i1");
    wait_running(pid, "redo", 2);
    int worker = wait_proc_stopped(pid, "redo", PROC_WORKER, 1);
    printf("# redo: step 2 logged while worker 1 (pid %d) is stopped in its redo; continuing it\n", worker);
    kill(worker, SIGCONT);
    assert_finishes_like(pid, "redo", "ref-xchg");
    /* the one gang restart that worker 1's death caused, no other (its late marks used to fail an
     * assertion, or make it skip step 66 and fail the exchange) */
    if (log_count("redo", "slidedp-launch: restarting") != 1)
        show_log("redo");
    assert_int_equal(log_count("redo", "slidedp-launch: restarting"), 1);
}

/* (6) Worker 1 stops right after writing its validation sums of step 16; once the launcher has
 * logged step 16 it is killed. Its restart must not validate step 16 again (its sums used to land
 * in step 80's record, and step 80's val_loss was step 16's). */
static void test_validation_after_restart(void **state)
{
    reference(&validating, "ref-val", 80, "");
    write_job_as(&validating, "val-restart", 80, "");
    pid_t pid = start_launcher("val-restart", "worker_val_done:1:stop:r1");
    wait_running(pid, "val-restart", 16);
    int worker = wait_proc_stopped(pid, "val-restart", PROC_WORKER, 1);
    printf("# val-restart: step 16 logged; killing worker 1 (pid %d), stopped after its validation\n", worker);
    kill(worker, SIGKILL);
    assert_finishes_like(pid, "val-restart", "ref-val");
}

/* Worker 1 stops itself (SIGSTOP) in step 4: slidedp-stat shows it stalled, the watchdog kills it
 * and it is restarted like a crashed one; the run ends bit-identical. */
static void test_watchdog(void **state)
{
    write_job_as(&watched, "watchdog", 8, "");
    pid_t pid = start_launcher("watchdog", "worker_loss_saved:10:stop:r1");
    wait_proc_stopped(pid, "watchdog", PROC_WORKER, 1);
    char ini[1300], *out = NULL;
    job_path("watchdog", "job.ini", ini, sizeof ini);
    for (uint64_t t0 = clock_ns();; usleep(100000)) {
        free(out);
        tu_sh(&out, "%s %s", tu_bin("slidedp-stat"), ini);
        if (strstr(out, "stalled"))
            break;
        if (waitpid(pid, NULL, WNOHANG) == pid || clock_ns() - t0 > HANG_S * 1000000000ull)
            fail_msg("slidedp-stat never showed the stopped worker stalled; last:\n%s", out);
    }
    printf("# watchdog: slidedp-stat while worker 1 is stopped:\n%s", out);
    free(out);
    assert_finishes_like(pid, "watchdog", "ref-a3");
    if (log_count("watchdog", "worker 1 stalled") != 1)
        show_log("watchdog");
    assert_int_equal(log_count("watchdog", "worker 1 stalled"), 1);
}

int main(void)
{
    tu_seed("windows", 0); /* nothing random: every kill is at a named point */
    jobs_setup("windows");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_launcher_killed_before_header),
        cmocka_unit_test(test_launcher_killed_drawing_weights),
        cmocka_unit_test(test_launcher_killed_at_checkpoint),
        cmocka_unit_test(test_launcher_killed_after_drain),
        cmocka_unit_test(test_worker_killed_with_poster_behind),
        cmocka_unit_test(test_redo_of_a_logged_step),
        cmocka_unit_test(test_validation_after_restart),
        cmocka_unit_test(test_watchdog),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(jobs_dir);
    return rc;
}
