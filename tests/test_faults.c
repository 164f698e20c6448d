/* Crash recovery on the CPU backend (docs/design.md §8): kill -9 workers and optimizer processes at random
 * moments and at every named point of the gradient and update protocol, kill the launcher and
 * relaunch, stop with SIGTERM and resume from the disk checkpoint, and drive a process into a
 * crash loop. Every run that completes must produce final weights bit-identical to an
 * uninterrupted run, and leave nothing of the job in /dev/shm. */
#include "tests/testutil.h"
#include "tests/jobrun.h"

#include <cjson/cJSON.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"
#include "shm/ctl.h"
#include "shm/futex.h"

static uint64_t rng;

static unsigned rnd(unsigned n)
{
    return (unsigned)(tu_uniform(&rng) * (float)n) % n;
}

static const struct variant plain = {"", "", false, 0, 0, NULL, NULL, NULL};
static const struct variant on_device = {"dev", "accumulate_on_device = true\n", false, 0, 0, NULL, NULL, NULL};
/* Three buffers for the four chunks of the tiny model (the planner keeps them all resident): each
 * pass evicts chunks and the backward fetches them again, with the updates after the backward, or
 * during it, where a restarted worker reads chunks already updated from params16's copy of the other
 * parity. */
static const struct variant evicting = {"cb3", "chunk_buffers = 3\n", false, 0, 0, NULL, NULL, NULL};
static const struct variant evicting_during = {"cb3-during", "chunk_buffers = 3\nupdate_mode = during_backward\n",
                                               true, 0, 0, NULL, NULL, NULL};
/* Sharded parameters and GPU-side gradients (shared memory standing in for peer copies): a dead
 * worker takes the others down with it and all restart together. */
static const struct variant exchanging = {"xchg", "param_route = sharded\ngrad_route = gpu\n", false, 0, 0, NULL, NULL, NULL};
/* One worker summing its four micro-steps on the device (the plain job's tokens per step): each
 * chunk's gradient reaches the host once per step and goes straight into the accumulator (no
 * slots), after the backward or during it. */
static const struct variant solo = {"solo", "accumulate_on_device = true\n", false, 1, 4, NULL, NULL, NULL};
static const struct variant solo_during = {"solo-during", "accumulate_on_device = true\nupdate_mode = during_backward\n",
                                           true, 1, 4, NULL, NULL, NULL};
/* The same, the gradients crossing to the host in bf16 (the optimizer widens them as it reads). */
static const struct variant solo_bf16 = {"solo-bf16",
                                         "accumulate_on_device = true\nupdate_mode = during_backward\ngrad_dtype = bf16\n",
                                         true, 1, 4, NULL, NULL, NULL};

static void write_job(const char *name, int steps, const char *extra)
{
    write_job_as(&plain, name, steps, extra);
}

/* Enough kills to prove the point; more would only make a slow machine slower (each restart waits). */
#define MAX_RANDOM_KILLS 25

/* Kills random processes of one kind of one job every few hundred ms until its launcher exits (at
 * most MAX_RANDOM_KILLS times); a process is killed again only after a step has completed since its
 * last death (otherwise this would be a crash loop, which the launcher rightly stops). */
struct killer {
    const char *name;
    pid_t launcher;
    int kind;
    struct job_shm shm;
    int kills;
    uint32_t committed_at_kill[64], logged;
    uint64_t logged_ns, next_ns; /* when a step was last logged; when to try the next kill */
    int result;                  /* (launcher's exit status << 16) | kills, or -1; once it exited */
    bool done;
};

static void killer_schedule(struct killer *k, int min_ms, int max_ms)
{
    k->next_ns = clock_ns() + (uint64_t)(min_ms + (int)rnd((unsigned)(max_ms - min_ms))) * 1000000ull;
}

static void killer_start(struct killer *k, const char *name, pid_t launcher, int kind)
{
    memset(k, 0, sizeof *k);
    k->name = name;
    k->launcher = launcher;
    k->kind = kind;
    char job[32];
    job_name_of(name, job, sizeof job);
    while (job_shm_attach(&k->shm, job, JOB_MAP_CTL, true) != 0) {
        if (waitpid(launcher, NULL, WNOHANG) == launcher)
            fail_msg("launcher exited before the job appeared");
        usleep(5000);
    }
    k->logged_ns = clock_ns();
}

/* One attempt, due now: notes the launcher's exit, or kills a victim when one may be killed. */
static void killer_tick(struct killer *k)
{
    int st;
    if (waitpid(k->launcher, &st, WNOHANG) == k->launcher) {
        job_shm_detach(&k->shm);
        k->result = WIFEXITED(st) ? (WEXITSTATUS(st) << 16) | k->kills : -1;
        k->done = true;
        return;
    }
    struct ctl_header *h = k->shm.ctl;
    if (atomic_load(&h->metrics_step) != k->logged) {
        k->logged = atomic_load(&h->metrics_step);
        k->logged_ns = clock_ns();
    } else if (clock_ns() - k->logged_ns > HANG_S * 1000000000ull) {
        job_shm_detach(&k->shm);
        fail_hung(k->launcher, k->name);
    }
    int n = k->kind == PROC_WORKER ? h->gpus : h->optim_procs;
    int victim = (int)rnd((unsigned)n);
    uint32_t committed = ctl_committed_step(h);
    if (k->kills >= MAX_RANDOM_KILLS || (k->kills > 0 && committed <= k->committed_at_kill[victim]))
        return;
    int pid = atomic_load(&ctl_proc(h, k->kind, victim)->pid);
    char comm[64] = "", path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    char *c = tu_read_file(path, NULL);
    if (c) {
        snprintf(comm, sizeof comm, "%s", c);
        free(c);
    }
    if (pid > 0 && !strncmp(comm, k->kind == PROC_WORKER ? "slidedp-worker" : "slidedp-optim", 13) &&
        kill(pid, SIGKILL) == 0) {
        k->kills++;
        k->committed_at_kill[victim] = committed;
    }
}

/* Runs the killers (every few hundred ms each, at random) until all their launchers have exited. */
static void kill_randomly(struct killer *k, int n, int min_ms, int max_ms)
{
    for (int i = 0; i < n; i++)
        killer_schedule(&k[i], min_ms, max_ms);
    for (int left = n; left > 0;) {
        uint64_t next = UINT64_MAX;
        for (int i = 0; i < n; i++)
            if (!k[i].done && k[i].next_ns < next)
                next = k[i].next_ns;
        uint64_t now = clock_ns();
        if (next > now)
            usleep((useconds_t)((next - now) / 1000));
        for (int i = 0; i < n; i++)
            if (!k[i].done && clock_ns() >= k[i].next_ns) {
                killer_tick(&k[i]);
                killer_schedule(&k[i], min_ms, max_ms);
                left -= k[i].done;
            }
    }
}

/* A job's folder name: base, then the variant's tag, then suffix. */
static void variant_name(char *out, size_t len, const char *base, const struct variant *v, const char *suffix)
{
    snprintf(out, len, "%s%s%s%s", base, v->tag[0] ? "-" : "", v->tag, suffix);
}

/* The uninterrupted runs a variant's interrupted ones must match: 120 steps, and 12 for crash points. */
static void run_references(const struct variant *v, bool with_short)
{
    struct batch_job jobs[2] = {{.rc = {0}}};
    variant_name(jobs[0].name, sizeof jobs[0].name, "ref", v, "");
    write_job_as(v, jobs[0].name, 120, "");
    variant_name(jobs[1].name, sizeof jobs[1].name, "ref", v, "-short");
    if (with_short)
        write_job_as(v, jobs[1].name, 12, "");
    run_batch(jobs, with_short ? 2 : 1);
    assert_int_equal(jobs[0].rc[0], 0);
    int first, last;
    assert_int_equal(metrics_lines(jobs[0].name, &first, &last), 120);
    if (with_short)
        assert_int_equal(jobs[1].rc[0], 0);
}

/* 120-step jobs whose processes of one kind (kinds[i]) are killed at random moments, one job per
 * kind, all at once; each must end like the uninterrupted run. */
static void random_kills_of(const struct variant *v, const int *kinds, int n)
{
    char name[2][64], ref[64];
    struct killer k[2];
    assert_true(n <= 2);
    variant_name(ref, sizeof ref, "ref", v, "");
    for (int i = 0; i < n; i++) {
        variant_name(name[i], sizeof name[i], kinds[i] == PROC_WORKER ? "kill-workers" : "kill-optims", v, "");
        write_job_as(v, name[i], 120, "");
        killer_start(&k[i], name[i], start_launcher(name[i], NULL), kinds[i]);
    }
    kill_randomly(k, n, 60, 240);
    for (int i = 0; i < n; i++) {
        int r = k[i].result;
        printf("# %s: %d %s kills, launcher exit %d\n", name[i], r & 0xffff,
               kinds[i] == PROC_WORKER ? "worker" : "optimizer", r >> 16);
        if (r >> 16 != 0)
            show_log(name[i]);
        assert_int_equal(r >> 16, 0);
        /* the kills prove something only if there were some; a slower machine only makes more */
        assert_true((r & 0xffff) >= 1);
        assert_same_weights(name[i], ref);
        int first, last;
        assert_int_equal(metrics_lines(name[i], &first, &last), 120);
    }
}

static void random_kills(const struct variant *v, int kind)
{
    random_kills_of(v, &kind, 1);
}

/* Worker kills and optimizer kills, in two jobs at once. */
static void random_kills_both(const struct variant *v)
{
    static const int kinds[] = {PROC_WORKER, PROC_OPTIM};
    random_kills_of(v, kinds, 2);
}

/* A named point of the protocol where both workers or all optimizers kill themselves, at the given
 * pass, or at a random one of `passes` when `passes` is positive. */
struct crash_point {
    const char *name;
    int passes;
};

/* Each point in its own 12-step job (several at once), which must finish like the uninterrupted one. */
#define MAX_CRASH_POINTS 16
static void crash_points(const struct variant *v, const struct crash_point *points, size_t n, uint64_t *point_rng)
{
    char ref[64], base[64], spec[MAX_CRASH_POINTS][96], name[MAX_CRASH_POINTS][80];
    const char *specs[MAX_CRASH_POINTS], *names[MAX_CRASH_POINTS];
    assert_true(n <= MAX_CRASH_POINTS);
    variant_name(ref, sizeof ref, "ref", v, "-short");
    variant_name(base, sizeof base, "point", v, "");
    for (size_t i = 0; i < n; i++) {
        int passes = points[i].passes;
        int count = passes < 0 ? -passes : 1 + (int)(tu_uniform(point_rng) * (float)passes) % passes;
        snprintf(spec[i], sizeof spec[i], "%s:%d", points[i].name, count);
        snprintf(name[i], sizeof name[i], "%s-%zu", base, i);
        specs[i] = spec[i];
        names[i] = name[i];
    }
    assert_crashes_finish_like(v, names, specs, (int)n, 12, ref);
}

static void test_reference(void **state)
{
    run_references(&plain, true);
}

static void test_random_worker_kills(void **state)
{
    random_kills(&plain, PROC_WORKER);
}

/* Micro-steps summing their gradients on the device: a worker killed mid-step redoes the step. */
static void test_worker_kills_accumulating_on_device(void **state)
{
    run_references(&on_device, false);
    random_kills(&on_device, PROC_WORKER);
}

static void test_random_optimizer_kills(void **state)
{
    random_kills(&plain, PROC_OPTIM);
}

/* The peer routes give the plain job's bits (tests/test_routes.c), with kills too. */
static void test_kills_exchanging(void **state)
{
    run_references(&exchanging, false);
    assert_same_weights("ref-xchg", "ref");
    random_kills_both(&exchanging);
}

/* Each named point of the protocol, hit at a varying count, in both workers or both optimizers. */
static void test_crash_points(void **state)
{
    const char *env = getenv("SLIDEDP_TEST_POINT_SEED");
    uint64_t point_rng = tu_seed("crash points", env ? strtoull(env, NULL, 10) : 11);
    /* how often each point is passed per process in the 12-step job: 12 steps x 2 micro-steps x 4
     * chunks of gradients per worker, 12 x 4 micro-batches x 2 chunks reduced and 12 x 2 chunk
     * updates per optimizer */
    static const struct crash_point points[] = {
        {"worker_slot_writing", 96}, {"worker_slot_written", 96}, {"worker_slot_posted", 96},
        {"worker_pushed", 96},       {"optim_reduce_journaled", 96}, {"optim_reduced", 96},
        {"optim_freed", 96},         {"optim_update_journaled", 24}, {"optim_updated", 24},
        /* the very last gradient and update: the step commits while its worker is dead */
        {"worker_pushed", -96},      {"optim_updated", -24},
    };
    crash_points(&plain, points, sizeof points / sizeof points[0], &point_rng);
}

/* Gradients straight into the accumulator: random worker and optimizer kills, and crash points. */
static void test_direct_gradients(void **state)
{
    const char *env = getenv("SLIDEDP_TEST_POINT_SEED");
    uint64_t point_rng = tu_seed("direct crash points", env ? strtoull(env, NULL, 10) : 17);
    /* per process in the 12-step job: 12 x 4 chunk gradients from the worker, 12 x 2 chunk
     * reductions and updates per optimizer */
    static const struct crash_point points[] = {
        {"worker_direct_sending", 48}, {"worker_pushed", 48}, {"optim_reduced", 24},
        {"optim_freed", 24},           {"optim_update_journaled", 24}, {"optim_updated", 24},
        {"worker_pushed", -48}, /* the step commits while the worker is dead */
    };
    const struct variant *variants[] = {&solo, &solo_during, &solo_bf16};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        run_references(variants[i], true);
        random_kills_both(variants[i]);
        crash_points(variants[i], points, sizeof points / sizeof points[0], &point_rng);
    }
}

/* Chunks evicted and fetched again within a step, with updates after and during the backward:
 * random worker and optimizer kills, and crash points. */
static void test_evicting_chunks(void **state)
{
    const char *env = getenv("SLIDEDP_TEST_POINT_SEED");
    uint64_t point_rng = tu_seed("evicting crash points", env ? strtoull(env, NULL, 10) : 13);
    static const struct crash_point points[] = {
        /* the last gradient of steps 6 and 11 (8 per step): the step commits while its workers are
         * dead, and (during the backward) the optimizers may finish it before recording its norm */
        {"worker_pushed", -48}, {"worker_pushed", -88},
        {"worker_slot_writing", 96}, {"optim_reduced", 96}, {"optim_updated", 24},
    };
    const struct variant *variants[] = {&evicting, &evicting_during};
    for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
        run_references(variants[i], true);
        random_kills_both(variants[i]);
        crash_points(variants[i], points, sizeof points / sizeof points[0], &point_rng);
    }
}

/* Writes the calibration `text` as measured on a host `factor` times slower: times multiplied,
 * rates divided. By a power of two the predictions scale exactly, so the plan's choices stay. */
static void write_calibration(const char *path, const char *text, double factor)
{
    cJSON *o = cJSON_Parse(text);
    assert_non_null(o);
    const char *curves[] = {"memcpy_bw", "adamw_rate", "adamw_bf16_rate", "sumsq_bf16_rate"}; /* [threads, rate] */
    for (size_t i = 0; i < sizeof curves / sizeof curves[0]; i++)
        for (cJSON *it = cJSON_GetObjectItem(o, curves[i])->child; it; it = it->next) {
            cJSON *v = cJSON_GetArrayItem(it, 1);
            cJSON_SetNumberValue(v, v->valuedouble / factor);
        }
    cJSON *wake = cJSON_GetObjectItem(o, "wake_s");
    cJSON_SetNumberValue(wake, wake->valuedouble * factor);
    for (cJSON *it = cJSON_GetObjectItem(o, "cpu_backend")->child; it; it = it->next) {
        bool rate = !strcmp(it->string, "gemm_flops");
        cJSON_SetNumberValue(it, rate ? it->valuedouble / factor : it->valuedouble * factor);
    }
    char *out = cJSON_Print(o);
    tu_write_file(path, out);
    free(out);
    cJSON_Delete(o);
}

/* Each relaunch also finds the host calibrated anew (slower each time): its state is adopted all
 * the same, because only the plan's choices identify it, not its predicted times. */
static void test_launcher_kills(void **state)
{
    write_job("kill-launcher", 120, "");
    char job[32], calib[1400], pinned[1100];
    job_name_of("kill-launcher", job, sizeof job);
    snprintf(pinned, sizeof pinned, "%s", getenv("SLIDEDP_HOST_CALIB"));
    snprintf(calib, sizeof calib, "%s/calib-slower.json", jobs_dir);
    char *measured = tu_read_file(pinned, NULL);
    assert_non_null(measured);
    setenv("SLIDEDP_HOST_CALIB", calib, 1);
    int rc = -1;
    for (int round = 0; round < 4; round++) {
        write_calibration(calib, measured, (double)(1 << round));
        pid_t pid = start_launcher("kill-launcher", NULL);
        if (round == 3) {
            rc = wait_exit(pid, "kill-launcher");
            break;
        }
        /* a random moment once about a quarter more of the 120 steps is logged: never so late
         * that the job could end first, however fast the machine */
        wait_running(pid, "kill-launcher", (uint32_t)(25 * (round + 1) + (int)rnd(10)));
        usleep((useconds_t)rnd(30) * 1000);
        if (kill(pid, SIGKILL) != 0 || wait_exit(pid, "kill-launcher") != 128 + SIGKILL)
            fail_msg("the job ended before the launcher could be killed (round %d)", round);
        /* the state outlives the launcher */
        assert_int_equal(tu_shm_objects(job), 4);
    }
    setenv("SLIDEDP_HOST_CALIB", pinned, 1);
    free(measured);
    if (rc != 0)
        show_log("kill-launcher");
    assert_int_equal(rc, 0);
    char logp[1300];
    job_path("kill-launcher", "launcher.log", logp, sizeof logp);
    char *log = tu_read_file(logp, NULL);
    int adopted = 0;
    for (char *p = log; (p = strstr(p, "adopting the state a dead launcher left")); p++)
        adopted++;
    assert_int_equal(adopted, 3);
    free(log);
    assert_same_weights("kill-launcher", "ref");
    int first, last;
    assert_int_equal(metrics_lines("kill-launcher", &first, &last), 120);
}

static void test_sigterm_resume(void **state)
{
    write_job("sigterm", 120, "every = 40\nkeep = 2");
    char job[32];
    job_name_of("sigterm", job, sizeof job);
    pid_t pid = start_launcher("sigterm", NULL);
    /* a random moment within the first half of the 120 steps, however fast the machine */
    wait_running(pid, "sigterm", 1 + rnd(60));
    usleep((useconds_t)rnd(30) * 1000);
    kill(pid, SIGTERM);
    int rc = wait_exit(pid, "sigterm");
    if (rc != 130)
        show_log("sigterm");
    assert_int_equal(rc, 130);
    assert_int_equal(tu_shm_objects(job), 0);
    int first, last;
    metrics_lines("sigterm", &first, &last);
    char p[1300], step_dir[64];
    snprintf(step_dir, sizeof step_dir, "ckpt/step-%d/optimizer.safetensors", last);
    job_path("sigterm", step_dir, p, sizeof p);
    printf("# stopped after step %d; checkpoint %s\n", last, p);
    assert_true(tu_exists(p));
    assert_true(last > 0 && last < 120);
    /* the stop's checkpoint is announced with its size before it is written (a large model's takes
     * minutes), unless the step's periodic one is already on disk */
    char log_path[1300], line[96];
    job_path("sigterm", "launcher.log", log_path, sizeof log_path);
    char *log = tu_read_file(log_path, NULL);
    assert_non_null(log);
    snprintf(line, sizeof line, "writing checkpoint step-%d (", last);
    assert_true((strstr(log, line) != NULL) == (last % 40 != 0));
    free(log);
    assert_int_equal(run_job("sigterm", NULL), 0);
    assert_same_weights("sigterm", "ref");
    assert_int_equal(metrics_lines("sigterm", &first, &last), 120);
    /* periodic checkpoints: keep = 2 newest (the end of the run is step-120) */
    job_path("sigterm", "ckpt/step-120/trainer_state.json", p, sizeof p);
    assert_true(tu_exists(p));
    job_path("sigterm", "ckpt/step-40", p, sizeof p);
    assert_false(tu_exists(p));
}

/* SIGTERM while a dead worker waits for its restart (which a stopping job does not do), or right
 * after it, when it dies again: the others cannot finish their step, so they leave at once and the
 * job stops at the last committed step, from where it resumes. */
/* SIGTERM at once and shortly after the start, while the launcher validates, calibrates, plans
 * and creates the shared state: it stops cleanly (exit 130, or killed before it began) and leaves
 * nothing in /dev/shm; the job then runs as if never stopped. */
/* Whether the process pid is the launcher itself (exec'd, not the test's fork) and has taken
 * SIGTERM in hand, blocked or caught: from then on a SIGTERM must be a clean stop. Read from
 * /proc/PID/status (SigBlk, SigCgt), so the test asks the program instead of guessing from time. */
static bool launcher_holds_sigterm(pid_t pid)
{
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool exec_done = fgets(comm, sizeof comm, f) && strncmp(comm, "slidedp-launch", 14) == 0;
    fclose(f);
    if (!exec_done)
        return false;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    if (!(f = fopen(path, "r")))
        return false;
    char line[256];
    unsigned long long mask = 0, bit = 1ULL << (SIGTERM - 1);
    while (fgets(line, sizeof line, f)) {
        unsigned long long m;
        if ((sscanf(line, "SigBlk: %llx", &m) == 1 || sscanf(line, "SigCgt: %llx", &m) == 1))
            mask |= m;
    }
    fclose(f);
    return (mask & bit) != 0;
}

static void test_early_sigterm(void **state)
{
    static const int delays_ms[] = {0, 1, 3, 10, 30, 60, 100, 200};
    char job[32];
    int held_count = 0;
    for (size_t i = 0; i < sizeof delays_ms / sizeof delays_ms[0]; i++) {
        write_job("early", 120, "");
        job_name_of("early", job, sizeof job);
        pid_t pid = start_launcher("early", NULL);
        usleep((useconds_t)delays_ms[i] * 1000);
        /* Before main() takes SIGTERM in hand, the default action kills the program (nothing
         * exists yet); once it has, the signal must be a clean stop, whatever the delay. */
        bool held = launcher_holds_sigterm(pid);
        held_count += held;
        kill(pid, SIGTERM);
        int rc = wait_exit(pid, "early");
        printf("# SIGTERM %d ms after the start (launcher %s SIGTERM) -> exit %d\n", delays_ms[i],
               held ? "held" : "did not yet hold", rc);
        bool clean = rc == 130 || (rc == 128 + SIGTERM && !held);
        if (!clean)
            show_log("early");
        assert_true(clean);
        assert_int_equal(tu_shm_objects(job), 0);
    }
    printf("# %d of %zu signals arrived after the launcher held SIGTERM\n", held_count,
           sizeof delays_ms / sizeof delays_ms[0]);
    /* while it calibrates the host (seconds: no pinned rates, an empty calibration cache), with
     * OpenBLAS's threads started before main as a user's launcher has them (the kernel hands a
     * signal that main holds to one of them, whose default action killed the launcher: exit 143) */
    char pinned[1100], fresh[1300];
    snprintf(pinned, sizeof pinned, "%s", getenv("SLIDEDP_HOST_CALIB"));
    snprintf(fresh, sizeof fresh, "%s/calib-early", jobs_dir);
    tu_rmrf(fresh);
    setenv("SLIDEDP_CACHE_DIR", fresh, 1);
    unsetenv("SLIDEDP_HOST_CALIB");
    unsetenv("OPENBLAS_NUM_THREADS");
    write_job("early", 120, "");
    pid_t pid = start_launcher("early", NULL);
    setenv("SLIDEDP_HOST_CALIB", pinned, 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    /* at least this one signal surely arrives after the launcher took SIGTERM in hand */
    for (int waited_ms = 0; !launcher_holds_sigterm(pid); waited_ms++) {
        if (waited_ms > 60000 || waitpid(pid, NULL, WNOHANG) == pid)
            fail_msg("the launcher never took SIGTERM in hand");
        usleep(1000);
    }
    usleep(300 * 1000);
    kill(pid, SIGTERM);
    int rc = wait_exit(pid, "early");
    printf("# SIGTERM 300 ms after the launcher held it, while calibrating -> exit %d\n", rc);
    if (rc != 130)
        show_log("early");
    assert_int_equal(rc, 130);
    assert_int_equal(tu_shm_objects(job), 0);
    assert_int_equal(run_job("early", NULL), 0);
    assert_same_weights("early", "ref");
}

static void test_sigterm_while_restarting(void **state)
{
    write_job("sigterm-restart", 120, "");
    char job[32], logp[1300];
    job_name_of("sigterm-restart", job, sizeof job);
    job_path("sigterm-restart", "launcher.log", logp, sizeof logp);
    setenv("SLIDEDP_CRASH_AT_STEP", "30:1", 1);
    pid_t pid = start_launcher("sigterm-restart", NULL);
    unsetenv("SLIDEDP_CRASH_AT_STEP");
    for (;;) {
        char *log = tu_read_file(logp, NULL);
        bool died = log && strstr(log, "restarting worker 1");
        free(log);
        if (died)
            break;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            fail_msg("the launcher exited before worker 1 died");
        usleep(2000);
    }
    kill(pid, SIGTERM);
    int rc = wait_exit(pid, "sigterm-restart");
    if (rc != 130)
        show_log("sigterm-restart");
    assert_int_equal(rc, 130);
    assert_int_equal(tu_shm_objects(job), 0);
    int first, last;
    metrics_lines("sigterm-restart", &first, &last);
    /* 29, or 28 when worker 1 died before its last gradients of step 29 were out */
    printf("# stopped after step %d\n", last);
    assert_true(last == 28 || last == 29);
    char p[1300], step_dir[64];
    snprintf(step_dir, sizeof step_dir, "ckpt/step-%d/optimizer.safetensors", last);
    job_path("sigterm-restart", step_dir, p, sizeof p);
    assert_true(tu_exists(p));
    assert_int_equal(run_job("sigterm-restart", NULL), 0);
    assert_same_weights("sigterm-restart", "ref");
    assert_int_equal(metrics_lines("sigterm-restart", &first, &last), 120);
}

static void test_crash_loop(void **state)
{
    write_job("loop", 12, "");
    char job[32];
    job_name_of("loop", job, sizeof job);
    setenv("SLIDEDP_CRASH_AT_STEP", "5:1", 1);
    int rc = run_job("loop", NULL);
    unsetenv("SLIDEDP_CRASH_AT_STEP");
    show_log("loop");
    assert_int_equal(rc, 1);
    assert_int_equal(tu_shm_objects(job), 0);
    char logp[1300];
    job_path("loop", "launcher.log", logp, sizeof logp);
    char *log = tu_read_file(logp, NULL);
    assert_non_null(strstr(log, "times without a step completing"));
    free(log);
    /* the state of the last committed step is on disk: 4, or 3 when worker 1 kept dying before its
     * poster thread had sent its last gradients of step 4 (likely on a busy machine) */
    int first, last;
    metrics_lines("loop", &first, &last);
    char p[1300], sd[64];
    snprintf(sd, sizeof sd, "ckpt/step-%d/optimizer.safetensors", last);
    job_path("loop", sd, p, sizeof p);
    assert_true(last == 3 || last == 4);
    assert_true(tu_exists(p));
}

int main(void)
{
    rng = tu_seed("faults", (uint64_t)20261202);
    snprintf(jobs_dir, sizeof jobs_dir, "%s", tu_tmpdir(0, "faults"));
    /* The launchers plan with the pinned host rates of $SLIDEDP_HOST_CALIB (tests/meson.build); a
     * test that measures or alters them uses a cache or file of its own. */
    if (!getenv("SLIDEDP_HOST_CALIB"))
        fail_msg("SLIDEDP_HOST_CALIB is not set (run through meson test)");
    char *out = NULL;
    if (tu_sh(&out, "%s copy --out %s/data --seq-len 64 --train 2000 --seed 3", tu_bin("slidedp-data"), jobs_dir) != 0)
        fail_msg("slidedp-data failed: %s", out);
    free(out);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference),
        cmocka_unit_test(test_random_worker_kills),
        cmocka_unit_test(test_worker_kills_accumulating_on_device),
        cmocka_unit_test(test_direct_gradients),
        cmocka_unit_test(test_random_optimizer_kills),
        cmocka_unit_test(test_kills_exchanging),
        cmocka_unit_test(test_crash_points),
        cmocka_unit_test(test_evicting_chunks),
        cmocka_unit_test(test_launcher_kills),
        cmocka_unit_test(test_sigterm_resume),
        cmocka_unit_test(test_sigterm_while_restarting),
        cmocka_unit_test(test_early_sigterm),
        cmocka_unit_test(test_crash_loop),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(jobs_dir); /* on failure too: the logs that matter were shown */
    return rc;
}
