/* The worker's phase, heartbeat and leaving when the job is torn down (worker/pipeline_wait.c): the
 * bottom of the pipeline's files; every other one waits through it, and it calls none of them. */
#ifndef SD_PIPELINE_WAIT_H
#define SD_PIPELINE_WAIT_H

#include <stdint.h>

#include "worker/pipeline_internal.h"

/* The longest a wait sleeps before it beats the heartbeat and looks at the stop flag again. */
#define WAIT_SLICE_MS 100

void set_phase(struct worker *w, int phase);
/* Shows a waiting phase while blocked; returns the phase we were in before, to set again after. */
uint32_t begin_wait(struct worker *w, int phase);
/* Called after every wait slice: beats the heartbeat, exits when the job is torn down. */
void bail_if_stopped(struct worker *w);

#endif
