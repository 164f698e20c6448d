/* Several hosts training one job through MPI (docs/design.md §11): finding the MPI launcher's
 * environment, agreeing the plan, and the relay thread that carries each host's gradients and
 * step marks to the other hosts. The only code that calls MPI; used by slidedp-launch. */
#ifndef SD_HOSTS_H
#define SD_HOSTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/plan.h"
#include "shm/ctl.h"

struct hosts {
    int count; /* 1 without an MPI launcher */
    int index;
};

/* This process's host from mpirun's or Slurm's environment (OMPI_COMM_WORLD_SIZE/RANK,
 * PMI_SIZE/PMI_RANK, PMIX_RANK with one of the sizes, SLURM_NTASKS/SLURM_PROCID); one host when
 * none is set. -1 with a message when the variables contradict each other. */
int hosts_detect(struct hosts *h);

/* MPI_Init_thread (only with several hosts; later MPI calls come from one thread at a time). */
int hosts_init(const struct hosts *h);
/* Sets each rank's GPU memory in t to the least any host has for that rank (-1 where any host does
 * not know it): host 0 plans for every host, so gpu_mem = auto must fit the smallest GPUs. */
int hosts_least_gpu_memory(const struct hosts *h, struct topology *t);
/* Every host takes host 0's plan (the planner's timings may differ between hosts). Planned for
 * several hosts, it already has what they need (planner/search.c): gradients through host memory,
 * one post per micro-step, parameters replicated, read from the bf16 copy. */
int hosts_share_plan(const struct hosts *h, struct plan *plan);
/* Fails on every host unless all hold the same job (job_hash: job.ini with overrides, config.json
 * and the plan's choices). */
int hosts_check_same_job(const struct hosts *h, uint64_t job_hash);
/* Fails on every host unless all found the same newest checkpoint (step, 0 for none) and the same
 * finished state in checkpoint.dir: hosts that do not share the directory would resume from
 * different steps. The message names what host 0 and the first host that differs see. */
int hosts_check_same_checkpoint(const struct hosts *h, const char *ckpt_dir, uint32_t step, bool finished);
/* Waits for every host to reach this point, without a bound (a note every minute), then
 * MPI_Finalize. */
void hosts_finalize(const struct hosts *h);

/* The relay thread of a job on several hosts. */
struct relay;
/* Starts it on the job's shared state (the ctl and grads regions). */
int relay_start(struct relay **out, struct job_shm *shm, const struct hosts *hosts);
/* Whether it stopped on an error; why in `why`. */
bool relay_failed(struct relay *r, char *why, size_t len);
/* Every step up to this one has its local ranks' marks sent: the launcher may recycle its record. */
uint32_t relay_marked_step(struct relay *r);
/* Sharded: whether host 0 holds every chunk's master, m and v of `step` (on host 0), or this host
 * has sent its chunks' (on the others); always true when replicated. */
bool relay_state_ready(struct relay *r, uint32_t step);
/* Stops the thread and frees it; with flush, after the sends in flight complete (bounded). */
void relay_stop(struct relay *r, bool flush);

#endif
