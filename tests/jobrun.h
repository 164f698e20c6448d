/* Whole jobs for the multi-process crash tests (test_faults, test_windows): tiny-model jobs on the
 * CPU backend in folders under jobs_dir sharing its generated data, launched with fault points,
 * waited for (a hang fails the test instead of its timeout), and compared with a reference run. */
#ifndef SD_JOBRUN_H
#define SD_JOBRUN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

extern char jobs_dir[1024]; /* the test's scratch directory; data/ holds the generated data */

/* The plan choices every job pins (so each fault point is passed the counted number of times,
 * however this host calibrates): one layer per chunk (four chunks) and two optimizer processes. */
#define PINNED_PLAN "layers_per_chunk = 1\noptim_procs = 2\n"

/* How a job differs from the default one: extra [runtime] lines, and no clipping (which updates
 * during the backward need). */
struct variant {
    const char *tag;
    const char *runtime;
    bool no_clip;
    int gpus;       /* 0: two */
    int grad_accum; /* 0: two */
    const char *data; /* extra [data] lines (validation) */
    const char *train; /* extra [train] lines */
    const char *weights_source; /* NULL: bf16_copy, so that what a test checks does not follow the
                                 * planner's choice of source */
};

/* Makes jobs_dir (a scratch dir named after tag) and its data (copy task: 2000 training and 64
 * validation sequences of 64 tokens). The launchers plan with the pinned host rates of
 * $SLIDEDP_HOST_CALIB (tests/meson.build), so nothing measured here changes the plans compared. */
void jobs_setup(const char *tag);
/* A job in its own folder (log, checkpoints): steps, the variant, extra [checkpoint] lines. */
void write_job_as(const struct variant *v, const char *name, int steps, const char *extra);
void job_path(const char *name, const char *rel, char *out, size_t len);
/* Starts slidedp-launch on the job with SLIDEDP_CRASH_AT=crash_at (NULL: none), output appended to
 * its launcher.log. */
pid_t start_launcher(const char *name, const char *crash_at);
/* start_launcher through `wrap`, an argv prefix (NULL-terminated, e.g. unshare and its options; NULL:
 * none), and with own_session in a session of its own (setsid: its pid is its process group, like
 * a job a shell starts). */
pid_t start_launcher_as(const char *name, const char *crash_at, const char *const *wrap, bool own_session);
void show_log(const char *name);
/* How often text occurs in the job's launcher.log. */
int log_count(const char *name, const char *text);
#define HANG_S 120 /* a launcher that neither exits nor logs a step for this long is hung */
/* Stops a hung launcher (two SIGINTs), shows its log and fails the test. */
void fail_hung(pid_t pid, const char *name);
/* The launcher's exit status (128 + signal when killed); fails the test when it hangs. */
int wait_exit(pid_t pid, const char *name);
int run_job(const char *name, const char *crash_at);
/* The shm job name of the job (shm/ctl.h ctl_job_name). */
void job_name_of(const char *name, char *out, size_t len);
/* Fails unless final weights and metrics are bit-identical to ref's and /dev/shm holds nothing of it. */
void assert_same_weights(const char *name, const char *ref);
/* The job has ref's step-S checkpoints (at least one), each with ref's weights and optimizer state,
 * byte for byte. */
void assert_same_checkpoints(const char *name, const char *ref);
/* Waits for launcher pid to exit 0 (showing its log otherwise), then assert_same_weights. */
void assert_finishes_like(pid_t pid, const char *name, const char *ref);
/* A job of the variant killed at SLIDEDP_CRASH_AT=spec must exit 0 after its process died from
 * signal 9 and been restarted, and end like ref (assert_same_weights). */
void assert_crash_finishes_like(const struct variant *v, const char *name, int steps, const char *spec,
                                const char *ref);
/* The same for n jobs, names[i] killed at specs[i], run batch_width() at a time. */
void assert_crashes_finish_like(const struct variant *v, const char *const *names, const char *const *specs, int n,
                                int steps, const char *ref);

/* One job of a batch, written already: run with SLIDEDP_CRASH_AT=spec (none when empty); when
 * `relaunch` is set and that run exits with `relaunch_after`, once more without it. */
struct batch_job {
    char name[96];
    char spec[128];
    bool relaunch;
    int relaunch_after;
    int rc[2]; /* the runs' exit statuses (as wait_exit's); rc[1] is -1 when not relaunched */
};
/* How many jobs a batch runs at once: SLIDEDP_TEST_JOBS, else the CPUs this process may use (at
 * least 2, at most 4). The jobs are independent (own folders, own shm names), and what the tests
 * assert of them does not depend on how fast they run. */
#define BATCH_MAX 8 /* launchers a batch may run at once: batch_width() is at most this */
int batch_width(void);
/* Runs the jobs, batch_width() launchers at a time, and fills their rc; a hung one fails the test. */
void run_batch(struct batch_job *jobs, int n);
/* metrics.jsonl's lines (each step once, in order from 1); first and last step. */
int metrics_lines(const char *name, int *first, int *last);
/* Waits until launcher `pid` runs the job and has logged step `logged`. */
void wait_running(pid_t pid, const char *name, uint32_t logged);
/* Waits until the job's process (enum proc_kind) has stopped itself at a fault point (SIGSTOP);
 * returns its pid. */
int wait_proc_stopped(pid_t launcher, const char *name, int kind, int index);
/* Waits until the launcher has stopped itself at a fault point (SIGSTOP). */
void wait_launcher_stopped(pid_t launcher, const char *name);
/* Waits until the launcher has asked the job's processes to stop (ctl_header.stop). */
void wait_stop_requested(pid_t launcher, const char *name);
/* The pid the job's process (enum proc_kind) has now. */
int job_proc_pid(const char *name, int kind, int index);

#endif
