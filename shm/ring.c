/* SPSC ring implementation (see ring.h for the protocol). */
#include "ring.h"

#include <string.h>

void ring_init(struct ring *r)
{
    memset(r, 0, sizeof *r);
}

bool ring_push(struct ring *r, const struct chunk_desc_msg *m)
{
    uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed); /* only we write head */
    /* acquire: pairs with the consumer's release of tail in ring_pop, so the slot we are about to
     * overwrite has been fully read */
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
    if (head - tail >= RING_CAP)
        return false;
    r->elems[head & (RING_CAP - 1)] = *m;
    /* release: pairs with the consumer's acquire of head in ring_peek, publishing the element */
    atomic_store_explicit(&r->head, head + 1, memory_order_release);
    return true;
}

bool ring_peek(struct ring *r, struct chunk_desc_msg *m)
{
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed); /* only we write tail */
    /* acquire: pairs with the producer's release of head in ring_push (or the relay's release of
     * relayed, which it stores after reading the element and its gradient) */
    uint32_t head = atomic_load_explicit(r->relay_gated ? &r->relayed : &r->head, memory_order_acquire);
    if (head == tail)
        return false;
    *m = r->elems[tail & (RING_CAP - 1)];
    return true;
}

void ring_pop(struct ring *r)
{
    uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
    /* release: pairs with the producer's acquire of tail in ring_push; the element's copy in
     * ring_peek happens before this */
    atomic_store_explicit(&r->tail, tail + 1, memory_order_release);
}

uint32_t ring_count(struct ring *r)
{
    return atomic_load_explicit(&r->head, memory_order_acquire) - atomic_load_explicit(&r->tail, memory_order_acquire);
}
