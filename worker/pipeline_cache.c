/* The worker's chunk cache (see pipeline_cache.h): device buffers holding (chunk, version) pairs,
 * filled from params16 or the streamed master (or gathered through the exchange when parameters are
 * sharded: this rank's shard from the host, the rest from the peers' windows), evicted as
 * worker/chunk_cache.h says, and the model's weights callbacks over it. */
#include "worker/pipeline_cache.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "shm/futex.h"
#include "worker/pipeline_exchange.h"
#include "worker/pipeline_wait.h"

/* Waits until version need of chunk c is readable. Updating during the backward, a worker redoing a
 * step after a crash may find the chunk one version further: the bf16 copy of the other parity
 * still holds the one it needs (shm/ctl.h job_params16_of). Streaming the master there is no such
 * case: the master is updated in place, so its plans update after the backward (docs/design.md
 * §4.5). */
static void wait_version(struct worker *w, int c)
{
    struct chunk_state *cs = ctl_chunk_state(w->ctl, c);
    uint64_t t0 = clock_ns();
    uint32_t prev_phase = UINT32_MAX;
    for (;;) {
        /* acquire: pairs with the optimizer's release store of version */
        uint32_t v = atomic_load_explicit(&cs->version, memory_order_acquire);
        if (v == w->need_version || (v == w->need_version + 1 && w->ctl->keep_prev))
            break;
        if (v > w->need_version) {
            fprintf(stderr, "worker %d: chunk %d is at version %u, past the %u this step needs\n", w->rank, c, v,
                    w->need_version);
            abort();
        }
        if (prev_phase == UINT32_MAX)
            prev_phase = begin_wait(w, PHASE_WAIT_WEIGHTS);
        futex_wait(&cs->version, v, WAIT_SLICE_MS);
        bail_if_stopped(w);
    }
    if (prev_phase != UINT32_MAX)
        set_phase(w, (int)prev_phase);
    atomic_fetch_add_explicit(&w->slot->wait_ns, clock_ns() - t0, memory_order_relaxed);
}

/* Starts copying elements [lo, lo+n) of chunk c at the pass's version into device memory dst on
 * transfer slot `slot`: from params16, or from the master rounded to bf16 on the way
 * (plan_streams_master); counts the bytes read. */
static void fetch_weights(struct worker *w, int slot, void *dst, int c, int64_t lo, int64_t n)
{
    size_t at = (size_t)(ctl_chunks(w->ctl)[c].offset + lo);
    if (plan_streams_master(&w->ctl->plan)) {
        w->be.ops->fetch_weights_f32_async(&w->be, slot, dst, w->shm.master + at, (size_t)n);
        atomic_fetch_add_explicit(&w->slot->bytes_in, (uint64_t)n * 4, memory_order_relaxed);
    } else {
        w->be.ops->fetch_weights_async(&w->be, slot, dst, job_params16_of(&w->shm, w->need_version) + at, (size_t)n);
        atomic_fetch_add_explicit(&w->slot->bytes_in, (uint64_t)n * 2, memory_order_relaxed);
    }
}

/* Copies version need_version of chunk c from the host into cache entry i's buffer. */
static void cache_fill(struct worker *w, int i, int c)
{
    wait_version(w, c);
    fetch_weights(w, i, w->cache_dev[i], c, 0, ctl_chunks(w->ctl)[c].numel);
}

/* Chunk c's parameter shard [lo, lo+n) at the version this pass needs, into device memory dst;
 * waits for the copy. */
static void stage_weights(struct worker *w, void *dst, int c, int64_t lo, int64_t n)
{
    wait_version(w, c);
    fetch_weights(w, w->cache.size, dst, c, lo, n);
    w->be.ops->synchronize(&w->be);
}

/* Sharded parameters: this rank's shard from the host into its window, then every rank's from the
 * windows into device memory dst (a cache entry's buffer). */
static void gather_chunk(struct worker *w, void *dst, int c, uint64_t key)
{
    const struct chunk_desc *ch = &ctl_chunks(w->ctl)[c];
    void *shard = xchg_param_slot(w, key);
    stage_weights(w, shard, c, layout_shard_begin(ch->numel, w->G, w->rank),
                  layout_shard_numel(ch->numel, w->G, w->rank));
    xchg_param_gather(w, dst, c, key);
}

/* Brings chunk c at the pass's version into cache entry i. */
static void fetch_chunk(struct worker *w, int i, int c)
{
    bool gathered = false;
    if (w->sharded_params) {
        uint64_t key = xchg_param_key(w->ctl, w->need_version, c);
        if (key > w->next_param_key) {
            fprintf(stderr, "worker %d: chunk %d version %u read before chunks the exchange expects first\n",
                    w->rank, c, w->need_version);
            abort();
        }
        if (key == w->next_param_key) {
            gather_chunk(w, w->cache_dev[i], c, key);
            w->next_param_key++;
            gathered = true;
        }
        /* else read again later in the pass (the cache could not keep it): straight from the host */
    }
    if (!gathered)
        cache_fill(w, i, c);
    chunk_cache_fill(&w->cache, i, c, w->need_version);
}

const void *io_weights(void *ctx, int c, int next)
{
    struct worker *w = ctx;
    atomic_store_explicit(&w->slot->chunk, c, memory_order_relaxed);
    atomic_store_explicit(&w->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
    int i = chunk_cache_find(&w->cache, c, w->need_version);
    if (i < 0) {
        i = chunk_cache_victim(&w->cache);
        SD_ASSERT(i >= 0); /* the plan gives at least one buffer more than a pass holds at once */
        fetch_chunk(w, i, c);
    }
    chunk_cache_hold(&w->cache, i);
    w->be.ops->wait_weights(&w->be, i);
    /* Prefetch the next chunk when its version is already published and a buffer is free. */
    if (next >= 0 && !w->recovering && chunk_cache_find(&w->cache, next, w->need_version) < 0) {
        struct chunk_state *cs = ctl_chunk_state(w->ctl, next);
        if (atomic_load_explicit(&cs->version, memory_order_acquire) == w->need_version) {
            int v = chunk_cache_victim(&w->cache);
            if (v >= 0)
                fetch_chunk(w, v, next);
        }
    }
    return w->cache_dev[i];
}

void io_release(void *ctx, int c)
{
    struct worker *w = ctx;
    chunk_cache_release(&w->cache, c);
}
