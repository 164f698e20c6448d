/* [train] optimizer_state = bf16 and 8bit on the CPU backend, end to end: over 300 steps of the copy
 * task the loss stays within 1% of the fp32 state's at every logged step; workers and optimizers
 * killed at named points of the protocol, an optimizer thread stalled mid-update, and a resume from
 * a disk checkpoint, give final weights, m and v bit-identical to an uninterrupted run; a checkpoint
 * of one mode is not resumed under another. */
#include "tests/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/job.h"
#include "shm/ctl.h"

static char dir[1024];

/* A job in folder `name` on the shared data: two CPU workers, two micro-steps of 8 sequences for the
 * loss curves, of 2 for the short jobs of the crash and resume checks (what they check is the
 * protocol's state, not the curve). */
static void write_job(const char *name, int steps)
{
    char p[1300], text[4096];
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n"
             "[data]\ntrain = ../data/train.bin\nseq_len = 64\n"
             "[train]\nmicro_batch = %d\ngrad_accum = 2\nsteps = %d\nlr = 5e-4\nwarmup = %d\nweight_decay = 0.01\n"
             "seed = 1234\n"
             "[checkpoint]\ndir = ckpt\nexport_dtype = fp32\n"
             "[runtime]\ndevice = cpu\ngpus = 2\noptim_threads = 3\n"
             "[log]\ndir = log\nevery = 10\n",
             tu_src("examples/tiny-qwen3"), steps < 100 ? 2 : 8, steps, steps < 100 ? 2 : 20);
    snprintf(p, sizeof p, "%s/%s", dir, name);
    tu_rmrf(p);
    assert_int_equal(tu_sh(NULL, "mkdir -p %s", p), 0);
    snprintf(p, sizeof p, "%s/%s/job.ini", dir, name);
    tu_write_file(p, text);
}

/* Runs the job with the overrides and the fault rules (SLIDEDP_CRASH_AT when crash_at is set,
 * SLIDEDP_DELAY_AT when delay_at is); its output goes to <name>/launcher.log. Returns the exit
 * status. */
static int run_job_faults(const char *name, const char *overrides, const char *crash_at, const char *delay_at)
{
    return tu_sh(NULL,
                 "cd %s/%s && mkdir -p counts && SLIDEDP_FAULT_COUNT=counts SLIDEDP_CRASH_AT='%s' SLIDEDP_DELAY_AT='%s' "
                 "%s job.ini %s > launcher.log 2>&1",
                 dir, name, crash_at ? crash_at : "", delay_at ? delay_at : "", tu_bin("slidedp-launch"), overrides);
}

/* How many of the job's optimizer processes passed `point` at least n times (SLIDEDP_FAULT_COUNT). */
static int optimizers_passing(const char *name, const char *point, int n)
{
    char *out = NULL;
    assert_int_equal(tu_sh(&out, "cat %s/%s/counts/optim* | awk '$1 == \"%s\" && $2 >= %d' | wc -l", dir, name, point, n),
                     0);
    int count = atoi(out);
    free(out);
    return count;
}

static int run_job(const char *name, const char *overrides, const char *crash_at)
{
    return run_job_faults(name, overrides, crash_at, NULL);
}

static void show_log(const char *name)
{
    char *log = tu_read_job_file(dir, name, "launcher.log", NULL);
    printf("%s", log);
    free(log);
}

static int metrics(const char *name, const char *key, double *out, int max)
{
    char p[1400];
    snprintf(p, sizeof p, "%s/%s/log/metrics.jsonl", dir, name);
    return tu_metrics_values(p, key, out, max);
}

/* The shared state's size the launcher printed ("shared state 3.4 MiB"). */
static double state_mib(const char *name)
{
    char *log = tu_read_job_file(dir, name, "launcher.log", NULL);
    const char *at = strstr(log, "shared state ");
    double mib = 0;
    if (!at || sscanf(at, "shared state %lf MiB", &mib) != 1)
        fail_msg("%s: no shared state size in its log", name);
    free(log);
    return mib;
}

static int group_setup(void **state)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "optim-state"));
    return tu_sh(NULL, "%s copy --out %s/data --seq-len 64 --train 8000 --val 256 --seed 1", tu_bin("slidedp-data"), dir);
}

static int group_teardown(void **state)
{
    tu_rmrf(dir);
    return 0;
}

#define CURVE_STEPS 300

static void test_loss_curve(void **state)
{
    tu_seed("optim_state loss curve", 1234);
    const char *modes[3] = {"fp32", "bf16", "8bit"};
    double loss[3][CURVE_STEPS];
    for (int k = 0; k < 3; k++) {
        char name[32], over[128];
        snprintf(name, sizeof name, "curve-%s", modes[k]);
        write_job(name, CURVE_STEPS);
        snprintf(over, sizeof over, "train.optimizer_state=%s checkpoint.save_final=false", modes[k]);
        int rc = run_job(name, over, NULL);
        if (rc != 0)
            show_log(name);
        assert_int_equal(rc, 0);
        assert_int_equal(metrics(name, "loss", loss[k], CURVE_STEPS), CURVE_STEPS);
    }
    double fp32_mib = state_mib("curve-fp32"), bf16_mib = state_mib("curve-bf16"), q8_mib = state_mib("curve-8bit");
    printf("# shared state: fp32 %.2f MiB, bf16 %.2f MiB, 8bit %.2f MiB\n", fp32_mib, bf16_mib, q8_mib);
    assert_true(q8_mib < bf16_mib && bf16_mib < fp32_mib);
    for (int k = 1; k < 3; k++) {
        double worst = 0, worst_any = 0;
        int worst_step = 0, differ = 0;
        for (int s = 0; s < CURVE_STEPS; s++) {
            double rel = fabs(loss[k][s] - loss[0][s]) / loss[0][s];
            differ += loss[k][s] != loss[0][s];
            worst_any = fmax(worst_any, rel);
            if ((s + 1) % 10 == 0) { /* the logged steps (log.every = 10) */
                if (rel > worst)
                    worst = rel, worst_step = s + 1;
                if (rel > 0.01)
                    fail_msg("step %d: %s-state loss %.6f is %.2f%% from the fp32 state's %.6f", s + 1, modes[k],
                             loss[k][s], 100 * rel, loss[0][s]);
            }
        }
        printf("# %s state: largest difference at a logged step %.3f%% (step %d); at any step %.3f%%; %d steps "
               "differ\n",
               modes[k], 100 * worst, worst_step, 100 * worst_any, differ);
        assert_true(differ > CURVE_STEPS / 2); /* the modes are not one */
    }
    printf("# final loss: fp32 state %.6f, bf16 state %.6f, 8bit state %.6f (first %.6f)\n", loss[0][CURVE_STEPS - 1],
           loss[1][CURVE_STEPS - 1], loss[2][CURVE_STEPS - 1], loss[0][0]);
    assert_true(loss[0][CURVE_STEPS - 1] < 0.25 * loss[0][0]); /* it learned */
}

/* The final weights and the optimizer state of the last step equal the reference run's bit for bit,
 * as does every step's gradient norm; nothing is left in /dev/shm. */
static void assert_same_state(const char *name, const char *ref, int steps)
{
    char step_state[64];
    snprintf(step_state, sizeof step_state, "ckpt/step-%d/optimizer.safetensors", steps);
    const char *files[2] = {"ckpt/final/model.safetensors", step_state};
    for (int i = 0; i < 2; i++) {
        size_t a_len, b_len;
        char *a = tu_read_job_file(dir, name, files[i], &a_len), *b = tu_read_job_file(dir, ref, files[i], &b_len);
        if (a_len != b_len || memcmp(a, b, a_len) != 0) {
            show_log(name);
            fail_msg("%s: %s differs from the uninterrupted run's", name, files[i]);
        }
        free(a), free(b);
    }
    double na[64], nb[64];
    int n = metrics(name, "grad_norm", na, 64);
    assert_int_equal(n, steps);
    assert_int_equal(metrics(ref, "grad_norm", nb, 64), steps);
    for (int s = 0; s < n; s++)
        if (na[s] != nb[s])
            fail_msg("%s: step %d's grad_norm %.6f differs from %.6f", name, s + 1, na[s], nb[s]);
    char log_dir[1400], job[32];
    snprintf(log_dir, sizeof log_dir, "%s/%s/log", dir, name);
    ctl_job_name(log_dir, job, sizeof job);
    assert_int_equal(tu_shm_objects(job), 0);
}

#define CRASH_STEPS 12

/* An uninterrupted run `ref`, then one run per SLIDEDP_CRASH_AT spec, each naming a worker point and
 * an optimizer point so that both kinds die in one run. */
static void crash_runs(const char *ref, const char *overrides, const char *const *specs, int n)
{
    write_job(ref, CRASH_STEPS);
    assert_int_equal(run_job(ref, overrides, NULL), 0);
    for (int i = 0; i < n; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s-crash%d", ref, i);
        write_job(name, CRASH_STEPS);
        int rc = run_job(name, overrides, specs[i]);
        char *log = tu_read_job_file(dir, name, "launcher.log", NULL);
        int deaths[2] = {0, 0}; /* workers, optimizers */
        for (const char *p = log; (p = strstr(p, "died from signal 9")); p++) {
            const char *line = p;
            while (line > log && line[-1] != '\n')
                line--;
            deaths[strstr(line, "slidedp-launch: optimizer") == line]++;
        }
        printf("# %s: %s -> exit %d, %d worker and %d optimizer deaths\n", name, specs[i], rc, deaths[0], deaths[1]);
        if (rc != 0 || !deaths[0] || !deaths[1])
            printf("%s", log);
        free(log);
        assert_int_equal(rc, 0);
        assert_true(deaths[0] > 0 && deaths[1] > 0);
        assert_same_state(name, ref, CRASH_STEPS);
    }
}

/* Updates after the backward (clipping): kills while copying a gradient, between journaling and
 * applying an update block, after the update, while reducing; in each reduced-precision mode. */
static void test_crash_after_backward(void **state)
{
    static const char *const specs[] = {
        "worker_slot_writing:29,optim_update_journaled:40",
        "worker_pushed:37,optim_updated:9",
        "worker_slot_posted:21,optim_reduce_journaled:45",
    };
    crash_runs("after", "train.optimizer_state=bf16", specs, 3);
    crash_runs("after-8bit", "train.optimizer_state=8bit", specs, 3);
}

/* Updates during the backward (no clipping; params16 keeps both parities). */
static void test_crash_during_backward(void **state)
{
    static const char *const specs[] = {
        "worker_pushed:29,optim_update_journaled:40",
        "worker_slot_written:45,optim_freed:30",
    };
    crash_runs("during", "train.optimizer_state=bf16 train.grad_clip=0 runtime.update_mode=during_backward", specs, 2);
    crash_runs("during-8bit", "train.optimizer_state=8bit train.grad_clip=0 runtime.update_mode=during_backward", specs,
               2);
}

/* Slowness, not death: one optimizer thread stalls for 300 ms in the middle of an update block and
 * of a reduction block (both optimizers, during and after the backward). The process's other
 * threads claim the segments it has not started (optimizer/segments.h), so the blocks run on other
 * threads than in the reference run; the final weights, m and v and every norm are bit-identical. */
static void test_stalled_thread(void **state)
{
    static const char *const modes[][2] = {
        {"stall-after", "train.optimizer_state=8bit"},
        {"stall-during", "train.optimizer_state=8bit train.grad_clip=0 runtime.update_mode=during_backward"},
    };
    for (int i = 0; i < 2; i++) {
        char ref[32], name[40];
        snprintf(ref, sizeof ref, "%s-ref", modes[i][0]);
        snprintf(name, sizeof name, "%s", modes[i][0]);
        write_job(ref, CRASH_STEPS);
        assert_int_equal(run_job(ref, modes[i][1], NULL), 0);
        write_job(name, CRASH_STEPS);
        const char *delay = "optim_update_journaled:40:300,optim_reduce_journaled:45:300";
        int rc = run_job_faults(name, modes[i][1], NULL, delay);
        printf("# %s: SLIDEDP_DELAY_AT=%s -> exit %d\n", name, delay, rc);
        if (rc != 0)
            show_log(name);
        assert_int_equal(rc, 0);
        /* the stalls happened: an optimizer passed both points that often */
        assert_true(optimizers_passing(name, "optim_update_journaled", 40) > 0);
        assert_true(optimizers_passing(name, "optim_reduce_journaled", 45) > 0);
        assert_same_state(name, ref, CRASH_STEPS);
    }
}

/* A resume from step-6/ (m and v in `mode`) ends where the uninterrupted run does; the same
 * checkpoint under the `other` mode is refused with one line and exit 2. */
static void resume_in(const char *mode, const char *other)
{
    char ref[32], name[32], over[160], wrong[160], said[96];
    snprintf(ref, sizeof ref, "resume-ref-%s", mode);
    snprintf(name, sizeof name, "resume-%s", mode);
    snprintf(over, sizeof over, "train.optimizer_state=%s checkpoint.every=6 checkpoint.keep=5", mode);
    snprintf(wrong, sizeof wrong, "train.optimizer_state=%s checkpoint.every=6 checkpoint.keep=5", other);
    write_job(ref, CRASH_STEPS);
    assert_int_equal(run_job(ref, over, NULL), 0);
    write_job(name, CRASH_STEPS);
    assert_int_equal(tu_sh(NULL, "mkdir -p %s/%s/ckpt && cp -r %s/%s/ckpt/step-6 %s/%s/ckpt/", dir, name, dir, ref, dir,
                           name),
                     0);
    char *out = NULL;
    int rc = tu_sh(&out, "cd %s/%s && %s job.ini %s 2>&1", dir, name, tu_bin("slidedp-launch"), wrong);
    printf("# %s state over a %s checkpoint -> exit %d: %s", other, mode, rc, out);
    assert_int_equal(rc, 2);
    snprintf(said, sizeof said, "optimizer_state = %s, this job has %s", mode, other);
    assert_non_null(strstr(out, said));
    assert_true(strchr(out, '\n') == out + strlen(out) - 1);
    free(out);
    rc = run_job(name, over, NULL);
    char *log = tu_read_job_file(dir, name, "launcher.log", NULL);
    if (rc != 0 || !strstr(log, "resuming from checkpoint step-6"))
        printf("%s", log);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(log, "resuming from checkpoint step-6"));
    free(log);
    size_t a_len, b_len;
    const char *files[2] = {"ckpt/final/model.safetensors", "ckpt/step-12/optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *a = tu_read_job_file(dir, name, files[i], &a_len), *b = tu_read_job_file(dir, ref, files[i], &b_len);
        if (a_len != b_len || memcmp(a, b, a_len) != 0)
            fail_msg("resumed run: %s differs from the uninterrupted run's", files[i]);
        free(a), free(b);
    }
}

static void test_resume(void **state)
{
    resume_in("bf16", "fp32");
    resume_in("8bit", "bf16");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loss_curve),
        cmocka_unit_test(test_crash_after_backward),
        cmocka_unit_test(test_crash_during_backward),
        cmocka_unit_test(test_stalled_thread),
        cmocka_unit_test(test_resume),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
