/* slidedp-launch internals: the job's shared state (creation, initial weights, teardown), the
 * export of the parameter space as an HF directory, and the supervisor loop. */
#ifndef SD_LAUNCH_H
#define SD_LAUNCH_H

#include <stdbool.h>

#include "common/job.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "common/plan.h"
#include "common/topology.h"
#include "launcher/hosts.h"
#include "shm/ctl.h"
#include "shm/region.h"

struct job_state {
    struct job_config job;
    struct model_config cfg;
    struct layout lay;
    struct plan plan;
    struct topology topo; /* found before planning (topology_for_job) */
    struct hosts hosts;   /* several hosts under MPI: this one's place (count 1 without MPI) */
    char job_name[32];
    char config_json[JOB_PATH_MAX + 16];
    struct shm_region ctl_region, params16_region, master_region, grads_region;
    struct job_shm shm; /* views into the regions above */
    bool created;       /* the shm objects exist and are ours to remove */
    bool adopted;       /* the state was left by a launcher that died; we continue it */
    uint32_t resumed_step; /* the disk checkpoint the state was loaded from (0: none) */
    int resumed_train_steps; /* the train.steps that checkpoint was trained toward (0: not recorded) */
    bool finished;         /* checkpoint.dir holds the last step and final/: nothing was created */
    bool locked;           /* we hold the job's owner lock (owner.c), lock_fd */
    int lock_fd;
    uint64_t job_hash;
    char run_id[24];       /* names this run in every checkpoint (hex; a resume keeps it) */
    struct ctl_shape shape; /* the shared state's shape (ctl_shape_of) */
};

/* Validates the job (model config, data, plan on st->topo, host memory) and creates and initialises the shared
 * state: weights loaded or drawn, Adam moments zero, versions 0. On failure nothing is left. */
int state_create(struct job_state *st);
/* Several hosts, sharded: drops this host's copy of the optimizer state of the chunks others hold. */
void state_release_remote_chunks(struct job_state *st);
/* Unmaps and removes the job's shm objects. */
void state_destroy(struct job_state *st);
/* A process's start time in clock ticks since boot (/proc/<pid>/stat field 22); 0 when it is gone. */
uint64_t proc_start_ticks(int pid);
/* Stops any process of a dead launcher that still runs (the pid in its slot, with the start time
 * recorded there and our --job on its command line: never another process that reused the pid),
 * and frees what they held (adoption). */
void state_replace_orphans(struct job_state *st);

/* The job's owner lock (owner.c): taken before its shared state is created, adopted or removed, and
 * held for as long as that state is ours. Waits at most wait_ms for a holder to let go; -1 (with the
 * reason, naming the holder's pid) when it does not. */
int owner_lock(const char *job_name, int wait_ms, int *fd);
/* Removes the lock file and lets go of it. */
void owner_unlock(const char *job_name, int fd);
/* Lets go of st's owner lock, if held (at the launcher's end, or when it gave up before running). */
void state_unlock(struct job_state *st);

/* Before anything is created (preflight.c): log.dir and checkpoint.dir exist as writable
 * directories or can be created; a warning when the disk lacks space for the checkpoints and the
 * export. */
int preflight_paths(const struct job_state *st);

/* Disk checkpoints (checkpoint.c): step-S/ with the HF weights and the optimizer state. */
int checkpoint_write(const struct job_state *st, uint32_t step);
/* The bytes of the weights in export_dtype (an export, or a checkpoint's share), and of one step-S/:
 * those, the fp32 master, m and v (with 8-bit state their block scales too). */
double export_weight_bytes(const struct job_state *st);
double checkpoint_bytes(const struct job_state *st);
/* The newest complete step-S/ in checkpoint.dir (0 when none). */
int checkpoint_latest(const struct job_config *job, uint32_t *step);
/* Refuses to resume from step-S/ when it is past train.steps or does not match the model (every
 * state tensor present with its size), with a hint; reads only the file's header. */
int checkpoint_check(const struct job_state *st, uint32_t step);
/* The run identity of step-S/ (trainer_state.json: its run_id and configuration): takes its run id
 * into st->run_id, and refuses, naming every key that differs, a checkpoint of another run's
 * configuration (one written before run identities is accepted). */
int checkpoint_identity(struct job_state *st, uint32_t step);
/* checkpoint.resume = never over an older run: moves its step-* and final/ into
 * checkpoint.dir/run-<its run id>/ and says so, so they are never resumed, pruned or reported as
 * the new run's. Nothing to do when there are none. */
int checkpoint_set_aside(const struct job_config *job);
/* Removes what a launcher that died while writing a checkpoint or the export left: the
 * `<name>.tmp-<pid>` directories in checkpoint.dir. */
void checkpoint_remove_partial(const struct job_config *job);
/* Loads master, m and v of step-S/ into the state (the layout must match). */
int checkpoint_load(struct job_state *st, uint32_t step);

/* Writes <dir> as an HF model directory from the master weights (via a temp dir + rename). */
int state_export(const struct job_state *st, const char *dir);

struct launch_opts {
    const char *ini_path;
    int num_overrides;
    char **overrides;
};

/* Runs a job to completion; returns the process exit code (0 done, 1 failed, 2 bad input,
 * 130 stopped by a signal). */
int launch_run(const struct launch_opts *opts);

#endif
