/* The worker's training loop: streams chunk versions from params16 into a device chunk cache,
 * runs each micro-batch through the model, hands each chunk's gradient to its optimizer through a
 * host gradient slot and a ring, reports losses and validation sums in the step records. */
#ifndef SD_PIPELINE_H
#define SD_PIPELINE_H

#include "shm/ctl.h"
#include "worker/backend.h"

struct worker_args {
    const char *job_name;
    int rank;
    int device_index; /* CUDA ordinal for this rank */
};

/* Runs until the last step or a stop request (returns 0); on an error sets sd_err and returns 2
 * when the worker could not start (bad input, not enough memory: never worth restarting) or 1. */
int worker_run(const struct worker_args *args);

#endif
