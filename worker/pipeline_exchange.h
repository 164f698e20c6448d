/* The exchange between workers (worker/pipeline_exchange.c, shm/ctl.h struct xchg_rank): each
 * rank's window, the steps of gathering a sharded chunk and of reducing a chunk's gradient in the
 * windows. It sees only pipeline_wait.h below it; the chunk cache and the poster call it. */
#ifndef SD_PIPELINE_EXCHANGE_H
#define SD_PIPELINE_EXCHANGE_H

#include <stdint.h>

#include "worker/pipeline_internal.h"

/* This rank's exchange window and the sums of its gradient shards. */
int exchange_setup(struct worker *w);

/* Sharded parameters, the first read of a (chunk, version) with exchange key `key`, which every rank
 * makes in the same order: xchg_param_slot waits until every rank has read the window slot's
 * previous shard and returns where this rank's shard goes; the caller copies it there from the
 * host; xchg_param_gather then publishes it, waits for every rank's and copies chunk c from the
 * windows into device memory dst. */
void *xchg_param_slot(struct worker *w, uint64_t key);
void xchg_param_gather(struct worker *w, void *dst, int c, uint64_t key);

/* GPU-side gradients: xchg_grad_publish puts this micro-step's gradient of chunk c in our window
 * for the peers and returns its key; xchg_grad_reduce adds our shard of every rank's (rank order)
 * onto sum, this rank's shard of the step's gradient sum (the first micro-step's first rank copies
 * instead). */
uint64_t xchg_grad_publish(struct worker *w, int c, float *grad);
void xchg_grad_reduce(struct worker *w, int c, uint64_t key, float *sum);

#endif
