/* The worker's chunk cache (worker/pipeline_cache.c): the model's weights callbacks over device
 * buffers holding (chunk, version) pairs. Calls the exchange and pipeline_wait.h below it. */
#ifndef SD_PIPELINE_CACHE_H
#define SD_PIPELINE_CACHE_H

#include "worker/pipeline_internal.h"

/* struct model_io's weights and release */
const void *io_weights(void *ctx, int c, int next);
void io_release(void *ctx, int c);

#endif
