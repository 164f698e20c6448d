/* The worker's gradient poster (worker/pipeline_poster.c): gradients, reduced first among the
 * workers when they are GPU-side, and progress marks on their way to the optimizers. Calls the
 * exchange and pipeline_wait.h below it. */
#ifndef SD_PIPELINE_POSTER_H
#define SD_PIPELINE_POSTER_H

#include "worker/pipeline_internal.h"

void post_enqueue(struct worker *w, struct post p);
/* Waits until the poster has published everything queued so far. */
void post_drain(struct worker *w);
/* struct model_io's grads_reuse and grads_done */
void io_grads_reuse(void *ctx, float *grad);
void io_grads_done(void *ctx, int c, float *grad);
/* Whether the previous incarnation posted every chunk of the micro-batch being redone. */
bool all_posted(struct worker *w);
/* The poster thread (pthread_create). */
void *poster_main(void *arg);
/* Marks the rank's part of step s complete. */
void finish_rank(struct worker *w, uint32_t s);
/* Whether step s is logged already (its record then belongs to a later step). */
bool step_logged(struct worker *w, uint32_t s);

#endif
