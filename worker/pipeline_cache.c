/* The worker's chunk cache (worker/pipeline_internal.h): device buffers holding (chunk, version)
 * pairs, filled from params16 (or gathered from the peers' windows when parameters are sharded),
 * evicted least recently used, and the model's weights callbacks over it. */
#include "pipeline_internal.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "shm/futex.h"

/* Waits until version need of chunk c is readable and returns where it is (shm/ctl.h
 * job_params16_of). Updating during the backward, a worker redoing a step after a crash may find
 * the chunk one version further: the copy of the other parity still holds the one it needs. */
const uint16_t *wait_version(struct worker *w, int c)
{
    struct chunk_state *cs = ctl_chunk_state(w->ctl, c);
    const struct chunk_desc *ch = &ctl_chunks(w->ctl)[c];
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
    return job_params16_of(&w->shm, w->need_version) + ch->offset;
}

static struct cache_entry *cache_find(struct worker *w, int c)
{
    for (int i = 0; i < w->cache_size; i++)
        if (w->cache[i].chunk == c && w->cache[i].version == w->need_version)
            return &w->cache[i];
    return NULL;
}

static struct cache_entry *cache_victim(struct worker *w)
{
    struct cache_entry *best = NULL;
    for (int i = 0; i < w->cache_size; i++) {
        struct cache_entry *e = &w->cache[i];
        if (e->held)
            continue;
        if (e->chunk < 0)
            return e;
        if (!best || e->last_use < best->last_use)
            best = e;
    }
    return best;
}

static void cache_fill(struct worker *w, struct cache_entry *e, int c, const uint16_t *src)
{
    const struct chunk_desc *ch = &ctl_chunks(w->ctl)[c];
    int slot = (int)(e - w->cache);
    e->chunk = c;
    e->version = w->need_version;
    w->be.ops->fetch_weights_async(&w->be, slot, e->dev, src, (size_t)ch->numel);
    atomic_fetch_add_explicit(&w->slot->bytes_in, (uint64_t)ch->numel * 2, memory_order_relaxed);
}

/* Brings chunk c at the pass's version into cache entry e. */
static void fetch_chunk(struct worker *w, struct cache_entry *e, int c)
{
    if (w->sharded_params) {
        uint64_t key = xchg_param_key(w->ctl, w->need_version, c);
        if (key > w->next_param_key) {
            fprintf(stderr, "worker %d: chunk %d version %u read before chunks the exchange expects first\n",
                    w->rank, c, w->need_version);
            abort();
        }
        if (key == w->next_param_key) {
            gather_chunk(w, e, c, key);
            w->next_param_key++;
            return;
        }
        /* read again later in the pass (the cache could not keep it): straight from the host */
    }
    cache_fill(w, e, c, wait_version(w, c));
}

const void *io_weights(void *ctx, int c, int next)
{
    struct worker *w = ctx;
    atomic_store_explicit(&w->slot->chunk, c, memory_order_relaxed);
    atomic_store_explicit(&w->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
    struct cache_entry *e = cache_find(w, c);
    if (!e) {
        e = cache_victim(w);
        SD_ASSERT(e); /* the plan gives at least one buffer more than a pass holds at once */
        fetch_chunk(w, e, c);
    }
    e->held = true;
    e->last_use = ++w->use_clock;
    w->be.ops->wait_weights(&w->be, (int)(e - w->cache));
    /* Prefetch the next chunk when its version is already published and a buffer is free. */
    if (next >= 0 && !w->recovering && !cache_find(w, next)) {
        struct chunk_state *cs = ctl_chunk_state(w->ctl, next);
        if (atomic_load_explicit(&cs->version, memory_order_acquire) == w->need_version) {
            struct cache_entry *v = cache_victim(w);
            if (v)
                fetch_chunk(w, v, next);
        }
    }
    return e->dev;
}

void io_release(void *ctx, int c)
{
    struct worker *w = ctx;
    for (int i = 0; i < w->cache_size; i++)
        if (w->cache[i].chunk == c)
            w->cache[i].held = false;
}
