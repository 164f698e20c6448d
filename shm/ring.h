/* Single-producer single-consumer rings of chunk descriptors in shared memory, one per
 * (producer, consumer) pair: free-running 32-bit indices masked on access, producer and consumer
 * indices on separate cache lines, elements passed by value. Rings are never reset: a restarted
 * producer pushes at head and a restarted consumer pops at tail, so what a dead peer left in
 * flight stays there (the launcher frees only the gradient slots no descriptor refers to:
 * ctl_repair_slots). */
#ifndef SD_RING_H
#define SD_RING_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define RING_CAP 256 /* power of two; must exceed the gradient slots a rank can fill */

enum desc_kind { DESC_GRAD = 1 };

/* A chunk's gradient for one micro-batch (or, with GPU-side gradients, rank r's shard of the
 * chunk's gradient summed over the step), waiting in a host gradient slot. */
#define DESC_SLOT_DIRECT 0xffffu

struct chunk_desc_msg {
    uint32_t chunk;
    uint32_t step;
    uint32_t micro;      /* global micro-batch index a*G + r within the step */
    uint16_t rank;
    uint16_t slot;       /* DESC_SLOT_DIRECT: the gradient is in the accumulator already */
    uint32_t generation; /* the producer's generation */
    uint32_t seq;        /* fill sequence of the slot (shm/ctl.h slot_state) */
    uint32_t kind;       /* enum desc_kind */
    uint64_t elem_begin; /* the elements of the chunk the slot holds: [elem_begin, elem_begin + elem_count) */
    uint64_t elem_count;
    uint64_t bytes;
};

struct ring {
    alignas(64) _Atomic uint32_t head; /* next index the producer writes; written by the producer */
    alignas(64) _Atomic uint32_t tail; /* next index the consumer reads; written by the consumer */
    /* Several hosts: the consumer sees an element only once the relay (launcher/bridge.c) has sent
     * it to the other hosts, i.e. below `relayed` instead of `head`; written by the relay. */
    alignas(64) _Atomic uint32_t relayed;
    uint32_t relay_gated;
    alignas(64) struct chunk_desc_msg elems[RING_CAP];
};

void ring_init(struct ring *r);
/* Producer side. False when full. */
bool ring_push(struct ring *r, const struct chunk_desc_msg *m);
/* Consumer side: copy of the oldest element without consuming it; false when empty (or, gated,
 * when the oldest is not relayed yet). */
bool ring_peek(struct ring *r, struct chunk_desc_msg *m);
void ring_pop(struct ring *r);
uint32_t ring_count(struct ring *r);

#endif
