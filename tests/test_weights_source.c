/* [runtime] weights_source = master on the CPU backend, end to end (docs/design.md §4.3, §4.5):
 * workers streaming the fp32 master, rounded to bf16 on the way, train bit for bit like workers
 * reading the optimizers' bf16 copy (final weights and every step's loss and grad_norm), with fp32
 * and bf16 optimizer state, on one and two ranks and with the exchange routes; while such a job
 * runs there is no params16 object and each worker maps only the master weights, read-only; workers
 * and optimizers killed at named points of the protocol, with chunks evicted and fetched again in
 * the backward, end bit-identical to the uninterrupted run; and a checkpoint written with the copy
 * resumes streaming the master. */
#include "tests/testutil.h"
#include "tests/jobrun.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/job.h"
#include "shm/ctl.h"

#define STEPS 16

/* The runs compared: [train] lines, ranks, [runtime] lines. */
struct pair {
    const char *tag, *train;
    int gpus;
    const char *runtime;
};

static const struct pair pairs[] = {
    {"fp32-1", "", 1, ""},
    {"fp32-2", "", 2, ""},
    {"bf16-1", "optimizer_state = bf16\n", 1, ""},
    {"bf16-2", "optimizer_state = bf16\n", 2, ""},
    {"fp32-xchg", "", 2, "param_route = sharded\ngrad_route = gpu\n"},
};

/* Each pair of runs, one per source: the same bits. */
static void test_master_same_as_copy(void **state)
{
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        const struct pair *p = &pairs[i];
        char copy[64], master[64];
        snprintf(copy, sizeof copy, "copy-%s", p->tag);
        snprintf(master, sizeof master, "master-%s", p->tag);
        struct variant vc = {p->tag, p->runtime, false, p->gpus, 2, NULL, p->train, "bf16_copy"};
        struct variant vm = vc;
        vm.weights_source = "master";
        write_job_as(&vc, copy, STEPS, "");
        write_job_as(&vm, master, STEPS, "");
        assert_int_equal(run_job(copy, NULL), 0);
        int rc = run_job(master, NULL);
        if (rc != 0)
            show_log(master);
        assert_int_equal(rc, 0);
        int first, last;
        assert_int_equal(metrics_lines(master, &first, &last), STEPS);
        assert_same_weights(master, copy);
        printf("# %s: streaming the master and reading the bf16 copy give the same weights and metrics\n", p->tag);
    }
}

/* The first mapping of a shm object in /proc/pid/maps: its permissions and length (0 when none). */
static size_t mapping_of(int pid, const char *object, char perms[8])
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    perms[0] = 0;
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    size_t len = 0;
    while (fgets(line, sizeof line, f))
        if (strstr(line, object)) {
            unsigned long lo, hi;
            assert_int_equal(sscanf(line, "%lx-%lx %7s", &lo, &hi, perms), 3);
            len = hi - lo;
            break;
        }
    fclose(f);
    return len;
}

/* Worker 0 held (stopped) in step 3 of a master job: the job has no params16 object, and the
 * worker maps exactly the master weights, read-only. */
static void test_master_mapping(void **state)
{
    struct variant v = {"map", "", false, 2, 2, NULL, NULL, "master"};
    write_job_as(&v, "map", 6, "");
    pid_t pid = start_launcher("map", "worker_loss_saved:5:stop:r0");
    int worker = wait_proc_stopped(pid, "map", PROC_WORKER, 0);
    char job[32], params[96], master[96], perms[8];
    job_name_of("map", job, sizeof job);
    snprintf(params, sizeof params, "/dev/shm/slidedp.%s.params16", job);
    snprintf(master, sizeof master, "/dev/shm/slidedp.%s.master", job);
    struct job_shm shm;
    assert_int_equal(job_shm_attach(&shm, job, JOB_MAP_CTL, true), 0);
    int64_t numel = shm.ctl->total_numel;
    assert_true(plan_streams_master(&shm.ctl->plan));
    assert_int_equal(shm.ctl->params16_bytes, 0);
    job_shm_detach(&shm);
    size_t len = mapping_of(worker, master, perms);
    printf("# worker 0 (pid %d): master mapped %s, %zu bytes (%lld weights); params16 %s\n", worker, perms, len,
           (long long)numel, access(params, F_OK) == 0 ? "exists" : "does not exist");
    assert_string_equal(perms, "r--s");
    assert_int_equal(len, (size_t)numel * sizeof(float));
    assert_int_not_equal(access(params, F_OK), 0);
    kill(worker, SIGCONT);
    assert_int_equal(wait_exit(pid, "map"), 0);
}

/* Named points of the protocol in a 12-step job streaming the master with three buffers for the
 * four chunks (the backward fetches chunks again): a worker dying right after pushing a gradient
 * (the optimizers may then update the chunks it still reads from), while filling a gradient slot,
 * after a loss is saved, and optimizers dying between journaling an update block and applying it,
 * after a chunk's update and mid-reduction; then the launcher, whose relaunch adopts the state. */
static void test_crash_points_master(void **state)
{
    static const struct variant v = {"master-cb3", "chunk_buffers = 3\n", false, 2, 2, NULL, NULL, "master"};
    static const char *const points[] = {"worker_pushed:5:r0",          "worker_slot_writing:7:r1",
                                         "worker_loss_saved:4:r0",      "optim_update_journaled:9:r0",
                                         "optim_updated:3:r1",          "optim_reduce_journaled:11:r1"};
    write_job_as(&v, "ref-master", 12, "");
    assert_int_equal(run_job("ref-master", NULL), 0);
    for (size_t i = 0; i < sizeof points / sizeof points[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "point-master-%zu", i);
        assert_crash_finishes_like(&v, name, 12, points[i], "ref-master");
    }
    /* the launcher killed after logging step 5: the relaunch adopts the state (no params16 object
     * to find) and finishes like the uninterrupted run */
    write_job_as(&v, "launcher-master", 12, "");
    assert_int_equal(run_job("launcher-master", "launcher_logged:5"), 128 + SIGKILL);
    int rc = run_job("launcher-master", NULL);
    if (rc != 0)
        show_log("launcher-master");
    assert_int_equal(rc, 0);
    char *log = tu_read_job_file(jobs_dir, "launcher-master", "launcher.log", NULL);
    printf("# launcher killed after logging step 5, relaunched: %s\n",
           strstr(log, "adopt") ? "adopted the state" : "(no adoption in its log)");
    assert_non_null(strstr(log, "adopt"));
    free(log);
    assert_same_weights("launcher-master", "ref-master");
}

/* The state does not depend on the source: a job stopped (SIGTERM, checkpoint) while reading the
 * bf16 copy resumes streaming the master and ends like the uninterrupted run. */
static void test_resume_across_sources(void **state)
{
    struct variant v = {"resume", "", false, 2, 2, NULL, NULL, "bf16_copy"};
    write_job_as(&v, "resume-ref", STEPS, "");
    assert_int_equal(run_job("resume-ref", NULL), 0);
    write_job_as(&v, "resume", STEPS, "");
    pid_t pid = start_launcher("resume", "worker_loss_saved:13:stop:r0"); /* in step 7 */
    int held = wait_proc_stopped(pid, "resume", PROC_WORKER, 0);
    kill(pid, SIGTERM);
    wait_stop_requested(pid, "resume");
    kill(held, SIGCONT);
    int rc = wait_exit(pid, "resume");
    if (rc != 130)
        show_log("resume");
    assert_int_equal(rc, 130);
    char ini[1300], *text = NULL;
    job_path("resume", "job.ini", ini, sizeof ini);
    text = tu_read_file(ini, NULL);
    char *at = strstr(text, "weights_source = bf16_copy");
    assert_non_null(at);
    char changed[8192];
    snprintf(changed, sizeof changed, "%.*sweights_source = master%s", (int)(at - text), text,
             at + strlen("weights_source = bf16_copy"));
    tu_write_file(ini, changed);
    free(text);
    assert_finishes_like(start_launcher("resume", NULL), "resume", "resume-ref");
    printf("# stopped reading the bf16 copy, resumed streaming the master: the same weights and metrics\n");
}

int main(void)
{
    tu_seed("weights_source", 0); /* nothing random: the kills are at named points */
    jobs_setup("weights-source");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_master_same_as_copy),
        cmocka_unit_test(test_master_mapping),
        cmocka_unit_test(test_crash_points_master),
        cmocka_unit_test(test_resume_across_sources),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(jobs_dir); /* on failure too: the logs that matter were shown */
    return rc;
}
