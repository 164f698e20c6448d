/* The planner: chooses a job's execution plan (common/plan.h) from job.ini, the model and the
 * host, and assigns chunks to optimizer processes. */
#ifndef SD_PLANNER_H
#define SD_PLANNER_H

#include <stdio.h>

#include "common/job.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "common/plan.h"

/* Fills plan from the job's explicit choices and the defaults for the rest. Fails with a message
 * naming the job.ini key when a forced choice is impossible. */
int plan_make(const struct job_config *job, const struct model_config *cfg, int host_cpus, struct plan *plan);

/* Optimizer process of each chunk: largest chunks first onto the least loaded process, so each
 * process gets about the same number of parameters (deterministic). */
void plan_assign_owners(const struct layout *lay, int optim_procs, int *owner);

void plan_print(FILE *f, const struct plan *plan, const struct model_config *cfg, const struct job_config *job);

#endif
