/* The chunk cache's bookkeeping and eviction rule, one for the worker's device buffers
 * (worker/pipeline_cache.c) and the planner's simulation of them (planner/cost.c), so the plan
 * prices the hits and misses the worker has. Each entry holds one (chunk, version); the pass holds
 * the entries it computes on; a miss fills an empty entry, else the least recently used one that
 * is not held. What an entry's contents are (device memory, when its fill lands) the caller keeps,
 * in an array of the same indices. */
#ifndef SD_CHUNK_CACHE_H
#define SD_CHUNK_CACHE_H

#include <stdbool.h>
#include <stdint.h>

struct chunk_cache_entry {
    int chunk;         /* -1 when empty */
    uint32_t version;  /* the parameters' version it holds */
    bool held;         /* in use by the pass: not evicted */
    uint64_t last_use; /* the cache's clock at its last use */
};

struct chunk_cache {
    struct chunk_cache_entry *entries; /* size of them, chunk -1 at first (chunk_cache_clear) */
    int size;
    uint64_t clock;
};

static inline void chunk_cache_clear(struct chunk_cache *cc)
{
    for (int i = 0; i < cc->size; i++)
        cc->entries[i] = (struct chunk_cache_entry){.chunk = -1};
    cc->clock = 0;
}

/* The entry that holds version v of chunk c, or -1. */
static inline int chunk_cache_find(const struct chunk_cache *cc, int c, uint32_t v)
{
    for (int i = 0; i < cc->size; i++)
        if (cc->entries[i].chunk == c && cc->entries[i].version == v)
            return i;
    return -1;
}

/* The entry a miss fills: an empty one, else the least recently used one not held; -1 when every
 * entry is held. */
static inline int chunk_cache_victim(const struct chunk_cache *cc)
{
    int best = -1;
    for (int i = 0; i < cc->size; i++) {
        const struct chunk_cache_entry *e = &cc->entries[i];
        if (e->held)
            continue;
        if (e->chunk < 0)
            return i;
        if (best < 0 || e->last_use < cc->entries[best].last_use)
            best = i;
    }
    return best;
}

/* Entry i now holds version v of chunk c. */
static inline void chunk_cache_fill(struct chunk_cache *cc, int i, int c, uint32_t v)
{
    cc->entries[i].chunk = c;
    cc->entries[i].version = v;
}

/* The pass uses entry i: held until its chunk is released, and the most recently used. */
static inline void chunk_cache_hold(struct chunk_cache *cc, int i)
{
    cc->entries[i].held = true;
    cc->entries[i].last_use = ++cc->clock;
}

/* The pass is done with chunk c (every version of it). */
static inline void chunk_cache_release(struct chunk_cache *cc, int c)
{
    for (int i = 0; i < cc->size; i++)
        if (cc->entries[i].chunk == c)
            cc->entries[i].held = false;
}

#endif
