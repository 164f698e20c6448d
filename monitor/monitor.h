/* The monitors' view of jobs (slidedp-top, slidedp-stat, tests): finding running jobs in
 * /dev/shm, resolving a JOB argument, attaching to a job's ctl object read-only (PROT_READ, so a
 * monitor can never disturb the job) and taking consistent snapshots of its statistics. */
#ifndef SD_MONITOR_H
#define SD_MONITOR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/job.h"
#include "shm/ctl.h"

#define MON_NAME_MAX 64

/* A running job as listed by discovery. */
struct mon_job_info {
    char name[MON_NAME_MAX];
    int32_t pid;                 /* launcher */
    char log_dir[JOB_PATH_MAX];
    uint32_t step;               /* last logged step */
    int steps;
};

/* Running jobs: /dev/shm/slidedp.<name>.ctl objects whose launcher is alive, sorted by name.
 * *jobs is malloc'd (NULL when none). */
int mon_list_jobs(struct mon_job_info **jobs, int *count);
void mon_print_jobs(FILE *f, const struct mon_job_info *jobs, int count);

/* The job a JOB argument names. */
struct mon_target {
    char name[MON_NAME_MAX];
    char log_dir[JOB_PATH_MAX]; /* from job.ini or from the running job's header */
};

enum { MON_ERR = -1, MON_BAD_ARG = -2 };
/* arg is a job name, a job's log.dir (a directory: the running job logging there, by real path),
 * or a path to a job.ini (whose log.dir, after the section.key=value overrides the job was
 * launched with, hashes to the name); with arg NULL the only running job. An ini path or a log.dir
 * is enough for a finished job; a name must be running. Returns 0; MON_BAD_ARG when arg is an
 * unusable job.ini or overrides come without one; MON_ERR when no such job runs, or (arg NULL)
 * none or several run: then *several holds them (caller frees) and *num_several their count. */
int mon_pick(const char *arg, int num_overrides, char **overrides, struct mon_target *t,
             struct mon_job_info **several, int *num_several);

/* The monitors' positional arguments: JOB (a name or a job.ini), then the section.key=value
 * overrides the job was launched with. */
#define MON_MAX_OVERRIDES 64
struct mon_job_args {
    const char *job; /* NULL: the only running job */
    char *overrides[MON_MAX_OVERRIDES];
    int num_overrides;
};
/* Takes one positional argument; when it is one too many, prints "prog: why" to stderr and
 * returns 2 (the exit code), else 0. */
int mon_job_arg(const char *prog, char *arg, struct mon_job_args *a);
/* mon_pick for a program's main: 0 with t set; on failure prints "prog: why" (and the running jobs
 * when several run) to stderr and returns the exit code, 2 for a bad argument, else 1. */
int mon_pick_for_main(const char *prog, struct mon_job_args *a, struct mon_target *t);

struct mon {
    struct job_shm shm;
    const struct ctl_header *h; /* mapped PROT_READ */
    char name[MON_NAME_MAX];
    int32_t launcher_pid;       /* at attach time */
};

/* Maps the job's ctl object read-only; fails unless its launcher is alive. */
int mon_attach(struct mon *m, const char *name);
void mon_detach(struct mon *m);
/* Whether the job still runs: its object exists and the launcher it names is alive (a launcher
 * relaunched after a crash adopts the same object, so a monitor survives that). */
bool mon_job_running(const struct mon *m);

/* One process slot, each field read atomically. */
struct mon_proc {
    int32_t pid;
    uint32_t phase, step, restarts;
    int32_t chunk;
    uint64_t heartbeat_ns, bytes_in, bytes_out, busy_ns, wait_ns, update_ns, lane_wait_ns, items;
    char device[64];
    double peak_flops;
    bool stalled; /* no heartbeat for ctl_stall_ns (half the watchdog's bound) while not done */
};

struct mon_snapshot {
    uint64_t t_ns;           /* clock_ns() when taken */
    struct job_stats stats;  /* a copy no launcher write was in progress for (seqlock) */
    int32_t launcher_pid;
    uint32_t stop;
    bool stalled; /* some process is */
    int gpus, optim_procs;
    struct mon_proc workers[JOB_MAX_GPUS];
    struct mon_proc optims[CTL_MAX_OPTIM];
};

/* Fails only when the launcher keeps the stats block mid-write (it died while publishing). */
int mon_snapshot(const struct mon *m, struct mon_snapshot *s);

/* Rates of one process between two snapshots: bytes per second in and out, items per second, and
 * shares of wall time spent working and waiting. A worker's busy time spans whole micro-steps,
 * including the waits inside them, so its work share is busy minus wait. */
struct mon_rates {
    double in_bps, out_bps, items_ps, work, wait;
};
void mon_proc_rates(const struct mon_proc *before, const struct mon_proc *after, double dt_s, bool worker,
                    struct mon_rates *r);

/* "forward", "wait-grads", ... ("?" for an unknown value). */
const char *mon_phase_name(uint32_t phase);
/* The oldest step whose loss is still in stats.loss_history (0 before the first logged step);
 * first_step is the header's, the first step this launcher ran. */
uint32_t mon_history_first(const struct job_stats *st, uint32_t first_step);

#endif
