/* The optimizer process's loop (see optim.h). Two update modes (docs/design.md §6.3): after the backward,
 * once the global norm is known (needed for clipping; the update then overlaps the next step's
 * forward), or during the backward, each chunk once its gradient is complete, lowest-numbered first.
 *
 * The blocks of a chunk's reduction or update are cut into segments the process's threads claim in
 * turn (optimizer/segments.h).
 *
 * Crash safety: every write to master, m, v, params16 and the gradient accumulator goes through a
 * journaled staging block per thread (shm/ctl.h struct journal), and the progress of the current
 * reduction or update is kept per chunk and segment, so a restarted optimizer finishes exactly what
 * its predecessor began:
 * no block is half-written, no micro-batch is added twice, no update is applied twice. Descriptors
 * are consumed in the order add -> progress -> free the slot (compare-and-swap on its fill
 * sequence) -> pop, so whichever step a crash interrupts, the restart can tell what is done. */
#include "optim.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/bf16.h"
#include "common/err.h"
#include "common/parent.h"
#include "common/fault.h"
#include "optimizer/adamw.h"
#include "optimizer/segments.h"
#include "shm/ctl.h"
#include "shm/futex.h"

#define WAIT_SLICE_MS 100

/* One optimizer thread's journal and staging block. */
struct lane {
    struct journal *journal;
    float *stage_p;
    void *stage_m, *stage_v; /* fp32, bf16 or 8-bit codes, as the job's optimizer_state */
    uint16_t *stage_p16;
    uint8_t *stage_m_scale, *stage_v_scale; /* 8-bit state: the block's scales */
    float *grad32; /* grads_bf16: a block of the accumulator widened to fp32 (private memory) */
};

/* A block of an update: a piece of one tensor (so it has one weight decay). */
struct update_item {
    uint64_t offset;      /* elements from the start of the parameter space */
    uint64_t tensor_elem; /* the same element's index within its tensor */
    uint32_t n;
    uint32_t tensor;
    bool decay;
};

struct optim;
typedef void (*lane_fn)(struct optim *o, int t);

struct optim {
    struct job_shm shm;
    struct ctl_header *ctl;
    struct proc_slot *slot;
    int index;
    uint32_t generation;
    int *chunks; /* owned, ascending */
    int num_chunks;
    int *chunk_pos;       /* per chunk of the job: its index in chunks, or -1 */
    bool *update_pending; /* per owned chunk: complete, its update not taken yet */
    uint32_t total_micro;
    bool shard_grads; /* GPU-side gradients: each rank sends the step's sum of its shard, once */
    enum adamw_isa isa;
    enum optimizer_state state; /* the dtype of m and v ([train] optimizer_state) */
    size_t state_size;          /* bytes per element of m and of v */
    char *m_bytes, *v_bytes; /* m and v, whichever their dtype */

    /* threads: lane 0 is the main thread; the others run `job` between two barriers */
    int threads;
    struct lane lanes[CTL_MAX_OPTIM_THREADS];
    pthread_t tids[CTL_MAX_OPTIM_THREADS];
    pthread_barrier_t start, done;
    lane_fn job;
    uint64_t lane_end_ns[CTL_MAX_OPTIM_THREADS]; /* when each lane finished the last job */
    uint64_t lane_wait_ns;                       /* run_lanes' since the last add_busy */
    /* the operation's blocks cut into segments (cut_segments), and the next one a lane claims */
    uint32_t num_segments;
    uint32_t segment_bounds[CTL_MAX_SEGMENTS + 1];
    _Atomic uint32_t next_segment;

    /* the operation the lanes share */
    int op_chunk;
    const struct chunk_desc_msg *op_desc;
    struct adamw_step op_step;
    struct update_item **items; /* per chunk: its update blocks, in order */
    uint32_t *num_items;
    double *block_sumsq;        /* per reduction block of the chunk */
    /* The last micro-batch of a whole-chunk reduction squares each block as it is written (one
     * pass less over the accumulator); segment k's were from block fused_from[k] on (earlier ones
     * were written by a predecessor that crashed, and are squared from the accumulator). */
    bool fuse_sumsq;
    uint32_t fused_from[CTL_MAX_SEGMENTS];
    /* Gradients straight in the accumulator, updated during the backward, no clipping: the norm
     * (only reported) is squared by the update as it reads each block, per update item, and
     * recorded with the chunk's new version; the reduction does nothing. */
    bool norm_in_update;
    double *item_sumsq; /* per update item of the chunk */
};

/* The phase and the chunk it works on (-1 while waiting), for monitors. */
static void set_phase_chunk(struct optim *o, int phase, int chunk)
{
    atomic_store_explicit(&o->slot->chunk, chunk, memory_order_relaxed);
    atomic_store_explicit(&o->slot->phase, (uint32_t)phase, memory_order_relaxed);
    atomic_store_explicit(&o->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
}

static void set_phase(struct optim *o, int phase)
{
    set_phase_chunk(o, phase, -1);
}

static bool torn_down(struct optim *o)
{
    return atomic_load(&o->ctl->stop) == STOP_NOW || atomic_load(&o->slot->generation) != o->generation ||
           parent_gone();
}

static void *lane_main(void *arg)
{
    struct optim *o = ((void **)arg)[0];
    int t = (int)(intptr_t)((void **)arg)[1];
    free(arg);
    for (;;) {
        pthread_barrier_wait(&o->start);
        o->job(o, t);
        o->lane_end_ns[t] = clock_ns();
        pthread_barrier_wait(&o->done);
    }
    return NULL;
}

/* Runs fn on every lane (this thread is lane 0) and returns when all are done; the lanes claim the
 * segments of o's cut (claim_segment). Counts the time the lanes idled waiting for the slowest one,
 * averaged over the lanes (lane_wait_ns, published with the busy time it is part of by add_busy). */
static void run_lanes(struct optim *o, lane_fn fn)
{
    atomic_store_explicit(&o->next_segment, 0, memory_order_relaxed); /* the start barrier orders it */
    if (o->threads == 1) {
        fn(o, 0);
        return;
    }
    o->job = fn;
    pthread_barrier_wait(&o->start);
    fn(o, 0);
    o->lane_end_ns[0] = clock_ns();
    pthread_barrier_wait(&o->done); /* orders the lanes' lane_end_ns before the reads below */
    uint64_t last = 0, idle = 0;
    for (int t = 0; t < o->threads; t++)
        last = o->lane_end_ns[t] > last ? o->lane_end_ns[t] : last;
    for (int t = 0; t < o->threads; t++)
        idle += last - o->lane_end_ns[t];
    o->lane_wait_ns += idle / (uint64_t)o->threads;
}

/* Busy time for monitors, with its updating part and the lanes' waits in it: busy first, and the
 * parts released after it, so that a monitor that reads them (acquire) and then busy_ns never sees
 * more of a part than busy time (monitor/monitor.c read_proc). */
static void add_busy(struct optim *o, uint64_t spent, bool updating)
{
    atomic_fetch_add_explicit(&o->slot->busy_ns, spent, memory_order_relaxed);
    if (updating)
        atomic_fetch_add_explicit(&o->slot->update_ns, spent, memory_order_release);
    atomic_fetch_add_explicit(&o->slot->lane_wait_ns, o->lane_wait_ns, memory_order_release);
    o->lane_wait_ns = 0;
}

/* Cuts the operation's n blocks into segments the lanes claim (optimizer/segments.h). */
static void cut_segments(struct optim *o, uint32_t n)
{
    o->num_segments = segments_cut(n, o->threads, CTL_MAX_SEGMENTS, o->segment_bounds);
}

/* The next segment of the operation for a lane, or num_segments (or more) when none is left. */
static uint32_t claim_segment(struct optim *o)
{
    return atomic_fetch_add_explicit(&o->next_segment, 1, memory_order_relaxed);
}

/* Journal blocks of n elements (a chunk, or the rank's shard a descriptor's slot holds). */
static uint32_t blocks_of(uint64_t n)
{
    return (uint32_t)((n + JOURNAL_BLOCK - 1) / JOURNAL_BLOCK);
}

/* Copies a lane's journaled staging block into place (idempotent: a restart repeats it). */
static void journal_apply(struct optim *o, struct lane *l)
{
    struct journal *j = l->journal;
    size_t off = j->offset, n = j->n;
    if (atomic_load_explicit(&j->state, memory_order_acquire) == JOURNAL_REDUCE) {
        memcpy(o->shm.grad_acc + off, l->stage_p, n * sizeof(float));
        return;
    }
    size_t scales = ctl_state_scales(o->state, n); /* an update block starts at a scale block's start */
    if (scales) {
        memcpy(o->shm.exp_avg_scale + off / STATE8_BLOCK, l->stage_m_scale, scales);
        memcpy(o->shm.exp_avg_sq_scale + off / STATE8_BLOCK, l->stage_v_scale, scales);
    }
    /* no bf16 copy to write when workers stream the master */
    adamw_store_staged(o->shm.master + off, o->m_bytes + off * o->state_size, o->v_bytes + off * o->state_size,
                       o->shm.params16 ? job_params16_of(&o->shm, j->step) + off : NULL, l->stage_p, l->stage_m,
                       l->stage_v, l->stage_p16, n, o->state_size);
}

static void journal_commit(struct optim *o, struct lane *l, int kind, uint32_t chunk, uint32_t step, uint32_t micro,
                           uint32_t segment, uint32_t block, size_t off, size_t n)
{
    struct journal *j = l->journal;
    j->chunk = chunk;
    j->step = step;
    j->micro = micro;
    j->segment = segment;
    j->block = block;
    j->offset = off;
    j->n = n;
    /* release: the staging block and the fields above are complete before the record is valid; the
     * signal fence also keeps the compiler from sinking those plain stores past it (a crash right
     * after the store must find them in memory) */
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(&j->state, (uint32_t)kind, memory_order_release);
    fault_point(kind == JOURNAL_REDUCE ? "optim_reduce_journaled" : "optim_update_journaled");
    journal_apply(o, l);
}

/* After the block is in place and the lane's progress is past it. */
static void journal_clear(struct lane *l)
{
    /* the plain stores of journal_apply (the block in place) stay before the clear: a record
     * cleared while its block is still only in registers would lose it in a crash */
    atomic_signal_fence(memory_order_seq_cst);
    atomic_store_explicit(&l->journal->state, JOURNAL_EMPTY, memory_order_release);
}

/* ---- reduction ---- */

/* Frees the slot of a consumed descriptor if it still holds that fill, then pops it. */
static void release_desc(struct optim *o, struct ring *ring, const struct chunk_desc_msg *d)
{
    if (d->slot == DESC_SLOT_DIRECT) {
        fault_point("optim_freed");
        ring_pop(ring);
        return;
    }
    struct slot_state *ss = ctl_slot(o->ctl, d->rank, d->slot);
    uint32_t posted = SLOT_WORD(d->seq, SLOT_POSTED);
    /* release on success: pairs with the worker's acquire load before it refills the slot */
    if (atomic_compare_exchange_strong_explicit(&ss->state, &posted, SLOT_WORD(d->seq, SLOT_FREE),
                                                memory_order_release, memory_order_relaxed))
        futex_wake_all(&ss->state);
    fault_point("optim_freed");
    ring_pop(ring);
}

/* Several hosts, sharded: whether d is a gradient another host sums (the relay has sent it there). */
static bool summed_elsewhere(struct optim *o, const struct chunk_desc_msg *d)
{
    return d->chunk < (uint32_t)o->ctl->num_chunks && !ctl_chunk_is_here(o->ctl, (int)d->chunk);
}

/* Pops what heads our rings and is summed elsewhere: while we wait for the other hosts, the
 * workers must not run out of slots to the next step's gradients of their chunks. */
static void drop_summed_elsewhere(struct optim *o)
{
    struct chunk_desc_msg d;
    for (int r = 0; r < o->ctl->gpus; r++) {
        struct ring *ring = ctl_ring(o->ctl, r, o->index);
        while (ring_peek(ring, &d) && summed_elsewhere(o, &d))
            release_desc(o, ring, &d);
    }
}

/* Lane t adds the blocks of the descriptor's gradient it claims to the accumulator. */
static void reduce_lane(struct optim *o, int t)
{
    const struct chunk_desc_msg *d = o->op_desc;
    const struct chunk_desc *ch = &ctl_chunks(o->ctl)[d->chunk];
    struct chunk_state *cs = ctl_chunk_state(o->ctl, (int)d->chunk);
    struct lane *l = &o->lanes[t];
    const float *src = job_grad_slot(&o->shm, d->rank, d->slot);
    /* a shard of a GPU-side sum is the only contribution to its elements */
    bool first = d->micro == 0 || o->shard_grads;
    size_t base = (size_t)ch->offset + (size_t)d->elem_begin, count = (size_t)d->elem_count;
    for (uint32_t k; (k = claim_segment(o)) < o->num_segments;) {
        uint32_t b = atomic_load_explicit(&cs->red_done[k], memory_order_acquire);
        o->fused_from[k] = b;
        for (; b < o->segment_bounds[k + 1]; b++) {
            size_t i = (size_t)b * JOURNAL_BLOCK, n = count - i < JOURNAL_BLOCK ? count - i : JOURNAL_BLOCK;
            if (first)
                memcpy(l->stage_p, src + i, n * sizeof(float));
            else
                grad_add_to(l->stage_p, o->shm.grad_acc + base + i, src + i, n);
            if (o->fuse_sumsq)
                o->block_sumsq[b] = sumsq_f32(o->isa, l->stage_p, n);
            journal_commit(o, l, JOURNAL_REDUCE, d->chunk, d->step, d->micro, k, b, base + i, n);
            atomic_store_explicit(&cs->red_done[k], b + 1, memory_order_release);
            journal_clear(l);
        }
    }
}

/* n gradients of the accumulator from element off, as fp32: in place, or widened from bf16 into the
 * lane's buffer (exact). */
static const float *grad_block(struct optim *o, struct lane *l, size_t off, size_t n)
{
    if (!o->shm.grad_acc16)
        return o->shm.grad_acc + off;
    SD_ASSERT(n <= JOURNAL_BLOCK);
    bf16_to_f32_n(l->grad32, o->shm.grad_acc16 + off, n);
    return l->grad32;
}

/* The squared norms of the blocks of the segments lane t claims, kept per block so the sum's order
 * does not depend on lanes (with fuse_sumsq only those the reduction did not square: it ran on the
 * same cut, the whole chunk's). */
static void sumsq_lane(struct optim *o, int t)
{
    const struct chunk_desc *ch = &ctl_chunks(o->ctl)[o->op_chunk];
    for (uint32_t k; (k = claim_segment(o)) < o->num_segments;) {
        uint32_t end = o->fuse_sumsq ? o->fused_from[k] : o->segment_bounds[k + 1];
        for (uint32_t b = o->segment_bounds[k]; b < end; b++) {
            size_t i = (size_t)b * JOURNAL_BLOCK;
            size_t n = (size_t)ch->numel - i < JOURNAL_BLOCK ? (size_t)ch->numel - i : JOURNAL_BLOCK;
            o->block_sumsq[b] = sumsq_f32(o->isa, grad_block(o, &o->lanes[t], (size_t)ch->offset + i, n), n);
        }
    }
}

/* Adds one micro-batch's gradient of a chunk (resuming where each lane stopped); finishes the
 * chunk when it was the last micro-batch. Returns true in that case. */
static bool reduce_one(struct optim *o, const struct chunk_desc_msg *d)
{
    struct ctl_header *h = o->ctl;
    const struct chunk_desc *ch = &ctl_chunks(h)[d->chunk];
    struct chunk_state *cs = ctl_chunk_state(h, (int)d->chunk);
    uint64_t t0 = clock_ns();
    set_phase_chunk(o, PHASE_REDUCE, (int)d->chunk);
    uint64_t key = micro_key(d->step, d->micro);
    cut_segments(o, blocks_of(d->elem_count));
    if (atomic_load_explicit(&cs->red_key, memory_order_acquire) != key) {
        /* progress first: a crash between these stores leaves a stale key and fresh progress */
        for (uint32_t k = 0; k < o->num_segments; k++)
            atomic_store_explicit(&cs->red_done[k], o->segment_bounds[k], memory_order_release);
        atomic_store_explicit(&cs->red_key, key, memory_order_release);
    }
    bool last = d->micro + 1 == o->total_micro;
    o->op_desc = d;
    /* a shard's blocks do not line up with the chunk's, whose order the norm's sum follows */
    o->fuse_sumsq = last && !o->shard_grads && d->slot != DESC_SLOT_DIRECT;
    if (d->slot != DESC_SLOT_DIRECT) /* else the worker wrote it into the accumulator */
        run_lanes(o, reduce_lane);
    atomic_fetch_add_explicit(&o->slot->bytes_in, d->bytes, memory_order_relaxed);
    fault_point("optim_reduced");
    if (last && !o->norm_in_update) {
        o->op_chunk = (int)d->chunk;
        cut_segments(o, blocks_of((uint64_t)ch->numel)); /* the reduction's cut when fused */
        run_lanes(o, sumsq_lane);
        double total = 0;
        for (uint32_t b = 0; b < blocks_of((uint64_t)ch->numel); b++)
            total += o->block_sumsq[b];
        cs->sumsq[d->step & 1] = total;
    }
    if (last) {
        /* release: the sumsq above is visible to whoever sees reduced_step reach the step */
        atomic_store_explicit(&cs->reduced_step, d->step, memory_order_release);
    } else {
        atomic_store_explicit(&cs->next_micro, micro_key(d->step, d->micro + 1), memory_order_release);
    }
    add_busy(o, clock_ns() - t0, false);
    if (last) {
        atomic_fetch_add_explicit(&h->reduce_seq, 1, memory_order_release);
        futex_wake_all(&h->reduce_seq);
    }
    return last;
}

/* ---- update ---- */

/* AdamW on update item b (of segment k) of the operation's chunk: staged, journaled, put in place. */
static void update_one(struct optim *o, struct lane *l, uint32_t k, uint32_t b)
{
    int c = o->op_chunk;
    const struct update_item *it = &o->items[c][b];
    size_t off = it->offset, n = it->n;
    struct adamw_step st = o->op_step;
    st.weight_decay = it->decay ? st.weight_decay : 0.0f;
    const float *g = grad_block(o, l, off, n);
    if (o->norm_in_update) /* the block is in cache for the update that follows */
        o->item_sumsq[b] = sumsq_f32(o->isa, g, n);
    st.round_key = adamw_round_key(o->ctl->job.seed, (uint32_t)st.step, it->tensor);
    st.round_first = it->tensor_elem;
    if (o->state == OPTIM_STATE_8BIT) {
        size_t sb = off / STATE8_BLOCK;
        struct state8 in = {o->shm.exp_avg8 + off, o->shm.exp_avg_sq8 + off, o->shm.exp_avg_scale + sb,
                            o->shm.exp_avg_sq_scale + sb};
        struct state8 out = {l->stage_m, l->stage_v, l->stage_m_scale, l->stage_v_scale};
        /* no bf16 copy to compute when the workers stream the master (journal_apply writes none) */
        adamw_update_8bit_to(o->isa, &st, o->shm.master + off, in, g, l->stage_p, out,
                             o->shm.params16 ? l->stage_p16 : NULL, n);
    } else if (o->state == OPTIM_STATE_BF16) {
        adamw_update_bf16_to(o->isa, &st, o->shm.master + off, o->shm.exp_avg16 + off, o->shm.exp_avg_sq16 + off, g,
                             l->stage_p, l->stage_m, l->stage_v, l->stage_p16, n);
    } else {
        adamw_update_to(o->isa, &st, o->shm.master + off, o->shm.exp_avg + off, o->shm.exp_avg_sq + off, g,
                        l->stage_p, l->stage_m, l->stage_v, l->stage_p16, n);
    }
    journal_commit(o, l, JOURNAL_UPDATE, (uint32_t)c, (uint32_t)st.step, 0, k, b, off, n);
    atomic_store_explicit(&ctl_chunk_state(o->ctl, c)->upd_done[k], b + 1, memory_order_release);
    journal_clear(l);
}

/* Lane t applies AdamW to the segments of the chunk's update items it claims. */
static void update_lane(struct optim *o, int t)
{
    struct chunk_state *cs = ctl_chunk_state(o->ctl, o->op_chunk);
    struct lane *l = &o->lanes[t];
    for (uint32_t k; (k = claim_segment(o)) < o->num_segments;) {
        uint32_t b = atomic_load_explicit(&cs->upd_done[k], memory_order_acquire);
        /* items a crashed predecessor updated: their gradient is still in the accumulator */
        for (uint32_t i = o->segment_bounds[k]; o->norm_in_update && i < b; i++) {
            const struct update_item *it = &o->items[o->op_chunk][i];
            o->item_sumsq[i] = sumsq_f32(o->isa, grad_block(o, l, it->offset, it->n), it->n);
        }
        for (; b < o->segment_bounds[k + 1]; b++)
            update_one(o, l, k, b);
    }
}

/* AdamW on one chunk for step s, resuming where each lane stopped, then publishes version s. */
static void update_chunk(struct optim *o, int c, uint32_t s, float clip_coef)
{
    struct ctl_header *h = o->ctl;
    const struct chunk_desc *ch = &ctl_chunks(h)[c];
    struct chunk_state *cs = ctl_chunk_state(h, c);
    const struct job_config *job = &h->job;
    if (atomic_load_explicit(&cs->version, memory_order_acquire) >= s)
        return;
    uint64_t t0 = clock_ns();
    set_phase_chunk(o, PHASE_UPDATE, c);
    cut_segments(o, o->num_items[c]);
    if (atomic_load_explicit(&cs->upd_step, memory_order_acquire) != s) {
        for (uint32_t k = 0; k < o->num_segments; k++)
            atomic_store_explicit(&cs->upd_done[k], o->segment_bounds[k], memory_order_release);
        atomic_store_explicit(&cs->upd_step, s, memory_order_release);
    }
    o->op_chunk = c;
    o->op_step = (struct adamw_step){
        .lr = (float)job_lr_at(job, (int)s),
        .beta1 = (float)job->beta1,
        .beta2 = (float)job->beta2,
        .eps = (float)job->eps,
        .weight_decay = (float)job->weight_decay,
        .grad_scale = clip_coef,
        .step = (int)s,
    };
    run_lanes(o, update_lane);
    if (o->norm_in_update) {
        double total = 0;
        for (uint32_t i = 0; i < o->num_items[c]; i++)
            total += o->item_sumsq[i];
        cs->sumsq[s & 1] = total;
    }
    fault_point("optim_updated");
    /* release: pairs with the workers' acquire load of version before they read params16 (or the
     * master, docs/design.md §4.5), and
     * (norm_in_update) with global_norm's before it reads the sumsq */
    atomic_store_explicit(&cs->version, s, memory_order_release);
    futex_wake_all(&cs->version);
    if (o->norm_in_update) {
        atomic_fetch_add_explicit(&h->reduce_seq, 1, memory_order_release);
        futex_wake_all(&h->reduce_seq);
    }
    atomic_fetch_add_explicit(&o->slot->bytes_out, (uint64_t)ch->numel * 2, memory_order_relaxed);
    atomic_fetch_add_explicit(&o->slot->items, 1, memory_order_relaxed);
    add_busy(o, clock_ns() - t0, true);
}

/* The lowest-numbered owned chunk whose update is pending, or -1. */
static int first_pending(struct optim *o)
{
    for (int i = 0; i < o->num_chunks; i++)
        if (o->update_pending[i])
            return i;
    return -1;
}

/* A descriptor from rank r's ring must be one a worker of that rank could have pushed: its
 * generation one the launcher has handed out (a later one would be a writer that was never
 * started), a chunk of ours, a step not ahead of s, a slot and elements within bounds. */
static void check_desc(struct optim *o, const struct chunk_desc_msg *d, int r, uint32_t s)
{
    struct ctl_header *h = o->ctl;
    uint32_t gen = atomic_load(&ctl_proc(h, PROC_WORKER, r)->generation);
    bool ok = d->kind == DESC_GRAD && d->rank == (uint32_t)r && d->generation >= 1 && d->generation <= gen &&
              d->chunk < (uint32_t)h->num_chunks && o->chunk_pos[d->chunk] >= 0 && d->step <= s &&
              (d->slot == DESC_SLOT_DIRECT || d->slot < (uint32_t)h->grad_slots) &&
              d->elem_begin + d->elem_count <= (uint64_t)ctl_chunks(h)[d->chunk].numel;
    if (!ok) {
        fprintf(stderr, "optimizer %d: a corrupt gradient descriptor from rank %d (generation %u of %u, chunk %u, step %u "
                        "at step %u)\n",
                o->index, r, d->generation, gen, d->chunk, d->step, s);
        abort();
    }
}

/* Drains the rings until every owned chunk's gradient of step s is complete (and, with update_now,
 * updated). Returns 1 if the step was abandoned (workers gone before finishing it), -1 if torn
 * down, 0 when complete.
 *
 * Updating during the backward, gradients arrive from the last chunk to the first, but the next
 * forward reads the first chunk first. So the rings are drained before each update (a reduction
 * frees a gradient slot a worker may be waiting for), and the update then taken is the
 * lowest-numbered complete chunk: the next forward starts as soon as its first chunks are updated
 * and overlaps the rest of the update, instead of waiting for the whole of it. */
static int reduce_step(struct optim *o, uint32_t s, bool update_now)
{
    struct ctl_header *h = o->ctl;
    int remaining = 0;
    for (int i = 0; i < o->num_chunks; i++) {
        struct chunk_state *cs = ctl_chunk_state(h, o->chunks[i]);
        /* reduced before a crash, maybe not updated: update_chunk skips it if it was */
        o->update_pending[i] = update_now && atomic_load(&cs->reduced_step) >= s;
        if (atomic_load(&cs->reduced_step) < s)
            remaining++;
    }
    struct doorbell *db = ctl_doorbell(h, o->index);
    for (;;) {
        /* acquire: pairs with the workers' release increment after ring_push */
        uint32_t seen = atomic_load_explicit(&db->seq, memory_order_acquire);
        /* set only after every worker exited: then this pass sees all that will ever come */
        bool draining = atomic_load(&h->stop) == STOP_DRAIN;
        bool progressed = false;
        for (int r = 0; r < h->gpus; r++) {
            struct ring *ring = ctl_ring(h, r, o->index);
            struct chunk_desc_msg d;
            /* once our chunks are complete, the workers may post the next step's gradients: they
             * wait for the next call */
            while (ring_peek(ring, &d)) {
                if (summed_elsewhere(o, &d)) {
                    release_desc(o, ring, &d);
                    progressed = true;
                    continue;
                }
                if (remaining == 0)
                    break;
                check_desc(o, &d, r, s);
                struct chunk_state *cs = ctl_chunk_state(h, (int)d.chunk);
                if (chunk_grad_consumed(cs, d.step, d.micro)) { /* added before a crash; only the release was missing */
                    release_desc(o, ring, &d);
                    progressed = true;
                    continue;
                }
                if (d.micro != chunk_next_micro(cs, d.step))
                    break; /* an earlier micro-batch of this chunk is still on its way */
                bool complete = reduce_one(o, &d);
                release_desc(o, ring, &d);
                progressed = true;
                if (complete) {
                    remaining--;
                    if (update_now)
                        o->update_pending[o->chunk_pos[d.chunk]] = true;
                }
            }
        }
        if (progressed)
            continue;
        int next = first_pending(o);
        if (next >= 0) {
            update_chunk(o, o->chunks[next], s, 1.0f);
            o->update_pending[next] = false;
            continue;
        }
        if (remaining == 0)
            return 0;
        if (draining) {
            /* nothing in the rings can be added and nothing more will come: the step cannot complete */
            atomic_store(&h->abandoned_step, s);
            futex_wake_all(&h->reduce_seq);
            return 1;
        }
        set_phase(o, PHASE_WAIT_GRADS);
        uint64_t t0 = clock_ns();
        futex_wait(&db->seq, seen, WAIT_SLICE_MS);
        atomic_fetch_add_explicit(&o->slot->wait_ns, clock_ns() - t0, memory_order_relaxed);
        if (torn_down(o))
            return -1;
    }
}

/* Waits for every chunk's reduction of step s and returns the global L2 norm (chunk order), or -1
 * if the step was abandoned or the job torn down. */
static double global_norm(struct optim *o, uint32_t s)
{
    struct ctl_header *h = o->ctl;
    for (;;) {
        uint32_t seen = atomic_load_explicit(&h->reduce_seq, memory_order_acquire);
        bool all = true;
        for (int c = 0; c < h->num_chunks && all; c++) {
            struct chunk_state *cs = ctl_chunk_state(h, c);
            all = o->norm_in_update ? atomic_load_explicit(&cs->version, memory_order_acquire) >= s
                                    : atomic_load_explicit(&cs->reduced_step, memory_order_acquire) >= s;
        }
        if (all)
            break;
        if (atomic_load(&h->abandoned_step) == s)
            return -1;
        set_phase(o, PHASE_WAIT_NORM);
        if (h->hosts_sharded) {
            drop_summed_elsewhere(o);
            futex_wait(&h->reduce_seq, seen, 1);
        } else {
            futex_wait(&h->reduce_seq, seen, WAIT_SLICE_MS);
        }
        if (torn_down(o))
            return -1;
    }
    double total = 0;
    for (int c = 0; c < h->num_chunks; c++)
        total += ctl_chunk_state(h, c)->sumsq[s & 1];
    return sqrt(total);
}

/* Step s's updates wait until the disk checkpoint of step s-1 (when one is due) is written. */
static int wait_checkpoint(struct optim *o, uint32_t s)
{
    struct ctl_header *h = o->ctl;
    uint32_t due = s - 1;
    if (h->ckpt_every == 0 || due == 0 || due % h->ckpt_every != 0)
        return 0;
    for (;;) {
        uint32_t done = atomic_load_explicit(&h->ckpt_done_step, memory_order_acquire);
        if (done >= due)
            return 0;
        set_phase(o, PHASE_WAIT_NORM);
        drop_summed_elsewhere(o);
        futex_wait(&h->ckpt_done_step, done, WAIT_SLICE_MS);
        if (torn_down(o))
            return -1;
    }
}

/* Finishes the journaled blocks the lanes of our predecessor were writing when it died. */
static void recover_journals(struct optim *o)
{
    for (int t = 0; t < o->threads; t++) {
        struct lane *l = &o->lanes[t];
        struct journal *j = l->journal;
        uint32_t kind = atomic_load_explicit(&j->state, memory_order_acquire);
        if (kind == JOURNAL_EMPTY)
            continue;
        journal_apply(o, l);
        struct chunk_state *cs = ctl_chunk_state(o->ctl, (int)j->chunk);
        if (kind == JOURNAL_REDUCE && atomic_load(&cs->red_key) == micro_key(j->step, j->micro))
            atomic_store(&cs->red_done[j->segment], j->block + 1);
        else if (kind == JOURNAL_UPDATE && atomic_load(&cs->upd_step) == j->step)
            atomic_store(&cs->upd_done[j->segment], j->block + 1);
        journal_clear(l);
    }
}

/* The update blocks of each owned chunk: its tensors cut into JOURNAL_BLOCK pieces. */
static int build_items(struct optim *o)
{
    struct ctl_header *h = o->ctl;
    const struct tensor_desc *tensors = ctl_tensors(h);
    o->items = calloc((size_t)h->num_chunks, sizeof *o->items);
    o->num_items = calloc((size_t)h->num_chunks, sizeof *o->num_items);
    o->block_sumsq = malloc(sizeof(double) * (size_t)((h->max_chunk_numel + JOURNAL_BLOCK - 1) / JOURNAL_BLOCK));
    if (!o->items || !o->num_items || !o->block_sumsq)
        return sd_err("out of memory");
    for (int i = 0; i < o->num_chunks; i++) {
        int c = o->chunks[i];
        const struct chunk_desc *ch = &ctl_chunks(h)[c];
        uint32_t n = 0;
        for (int ti = ch->first_tensor; ti < ch->first_tensor + ch->num_tensors; ti++)
            n += (uint32_t)((tensors[ti].numel + JOURNAL_BLOCK - 1) / JOURNAL_BLOCK);
        o->items[c] = malloc(sizeof(struct update_item) * (n ? n : 1));
        if (!o->items[c])
            return sd_err("out of memory");
        for (int ti = ch->first_tensor; ti < ch->first_tensor + ch->num_tensors; ti++) {
            const struct tensor_desc *td = &tensors[ti];
            for (int64_t e = 0; e < td->numel; e += JOURNAL_BLOCK)
                o->items[c][o->num_items[c]++] = (struct update_item){
                    .offset = (uint64_t)(td->offset + e),
                    .tensor_elem = (uint64_t)e,
                    .n = (uint32_t)(td->numel - e < JOURNAL_BLOCK ? td->numel - e : JOURNAL_BLOCK),
                    .tensor = (uint32_t)ti,
                    .decay = td->decay,
                };
        }
    }
    return 0;
}

static int start_lanes(struct optim *o)
{
    if (o->threads == 1)
        return 0;
    pthread_barrier_init(&o->start, NULL, (unsigned)o->threads);
    pthread_barrier_init(&o->done, NULL, (unsigned)o->threads);
    for (int t = 1; t < o->threads; t++) {
        void **arg = malloc(2 * sizeof(void *));
        if (!arg)
            return sd_err("out of memory");
        arg[0] = o;
        arg[1] = (void *)(intptr_t)t;
        if (pthread_create(&o->tids[t], NULL, lane_main, arg) != 0)
            return sd_err("cannot start optimizer thread %d", t);
    }
    return 0;
}

static int optim_setup(struct optim *o, const struct optim_args *args)
{
    if (job_shm_attach(&o->shm, args->job_name, JOB_MAP_CTL | JOB_MAP_PARAMS_RW | JOB_MAP_MASTER | JOB_MAP_GRADS,
                       false) != 0)
        return -1;
    struct ctl_header *h = o->ctl = o->shm.ctl;
    if (args->index < 0 || args->index >= h->optim_procs)
        return sd_err("optimizer index %d out of range (job has %d)", args->index, h->optim_procs);
    o->index = args->index;
    o->slot = ctl_proc(h, PROC_OPTIM, o->index);
    o->generation = atomic_load(&o->slot->generation);
    fault_init("optim", atomic_load(&o->slot->restarts), args->index);
    atomic_store(&o->slot->pid, (int32_t)getpid());
    set_phase(o, PHASE_STARTING);
    o->threads = h->plan.optim_threads;
    o->state = h->job.optimizer_state;
    o->state_size = ctl_state_size(o->state);
    char *m_of[OPTIM_STATE_COUNT] = {(char *)o->shm.exp_avg, (char *)o->shm.exp_avg16, (char *)o->shm.exp_avg8};
    char *v_of[OPTIM_STATE_COUNT] = {(char *)o->shm.exp_avg_sq, (char *)o->shm.exp_avg_sq16, (char *)o->shm.exp_avg_sq8};
    o->m_bytes = m_of[o->state];
    o->v_bytes = v_of[o->state];
    for (int t = 0; t < o->threads; t++) {
        struct lane *l = &o->lanes[t];
        l->journal = ctl_journal(h, o->index, t);
        l->stage_p = job_staging(&o->shm, o->index, t);
        l->stage_m = l->stage_p + JOURNAL_BLOCK;
        l->stage_v = (char *)l->stage_m + JOURNAL_BLOCK * o->state_size;
        l->stage_p16 = (uint16_t *)((char *)l->stage_v + JOURNAL_BLOCK * o->state_size);
        l->stage_m_scale = (uint8_t *)(l->stage_p16 + JOURNAL_BLOCK);
        l->stage_v_scale = l->stage_m_scale + ctl_state_scales(o->state, JOURNAL_BLOCK);
        if (o->shm.grad_acc16 && !(l->grad32 = aligned_alloc(64, JOURNAL_BLOCK * sizeof(float))))
            return sd_err("optimizer: out of memory");
    }
    o->shard_grads = h->plan.grad_route == GRADS_GPU && h->gpus > 1;
    o->total_micro = (uint32_t)(h->gpus * (plan_one_post_per_rank(&h->plan, h->gpus) ? 1 : h->job.grad_accum));
    o->norm_in_update = h->grads_direct && h->plan.update_mode == UPDATE_DURING_BACKWARD && !(h->job.grad_clip > 0);
    o->isa = adamw_isa_detect();
    snprintf(o->slot->device_name, sizeof o->slot->device_name, "cpu %s x%d", adamw_isa_name(o->isa), o->threads);
    o->chunks = malloc(sizeof(int) * (size_t)h->num_chunks);
    o->chunk_pos = malloc(sizeof(int) * (size_t)h->num_chunks);
    o->update_pending = calloc((size_t)h->num_chunks, sizeof(bool));
    if (!o->chunks || !o->chunk_pos || !o->update_pending)
        return sd_err("out of memory");
    for (int c = 0; c < h->num_chunks; c++) {
        o->chunk_pos[c] = -1;
        if (ctl_chunk_state(h, c)->owner == o->index && ctl_chunk_is_here(h, c)) {
            o->chunk_pos[c] = o->num_chunks;
            o->chunks[o->num_chunks++] = c;
        }
    }
    if (build_items(o) != 0)
        return -1;
    uint32_t most = 1;
    for (int i = 0; i < o->num_chunks; i++)
        most = o->num_items[o->chunks[i]] > most ? o->num_items[o->chunks[i]] : most;
    o->item_sumsq = malloc(sizeof(double) * most);
    if (!o->item_sumsq)
        return sd_err("out of memory");
    recover_journals(o);
    return start_lanes(o);
}

int optim_run(const struct optim_args *args)
{
    struct optim *o = calloc(1, sizeof *o);
    if (!o) {
        sd_err("out of memory");
        return 2;
    }
    if (optim_setup(o, args) != 0)
        return 2;
    struct ctl_header *h = o->ctl;
    bool during_backward = h->plan.update_mode == UPDATE_DURING_BACKWARD;
    /* Resume at the first step one of our chunks has not been updated for; optimizer 0 at the last
     * one when its norm is not recorded yet (updated during the backward, the chunks can all be
     * done before it is written). */
    uint32_t last = UINT32_MAX;
    for (int i = 0; i < o->num_chunks; i++) {
        uint32_t v = atomic_load(&ctl_chunk_state(h, o->chunks[i])->version);
        last = v < last ? v : last;
    }
    if (o->num_chunks == 0) /* several hosts, sharded: all of ours are summed elsewhere */
        last = ctl_committed_step(h);
    uint32_t first = last + 1;
    if (o->index == 0 && last > 0 && atomic_load(&ctl_step(h, last)->step) == last &&
        !atomic_load(&ctl_step(h, last)->norm_written))
        first = last;
    for (uint32_t s = first; s <= (uint32_t)h->job.steps; s++) {
        atomic_store(&o->slot->step, s);
        if (during_backward && wait_checkpoint(o, s) != 0)
            return 0;
        if (reduce_step(o, s, during_backward) != 0)
            return 0; /* torn down or the step was abandoned: nothing half-done remains */
        double norm = global_norm(o, s);
        if (norm < 0)
            return 0;
        double clip = h->job.grad_clip;
        float coef = clip > 0 && norm > clip ? (float)(clip / (norm + 1e-6)) : 1.0f;
        if (o->index == 0) {
            struct step_record *rec = ctl_step(h, s);
            rec->grad_norm = norm;
            rec->lr = job_lr_at(&h->job, (int)s);
            rec->clip_coef = coef;
            atomic_store_explicit(&rec->norm_written, 1, memory_order_release);
            fault_point("optim_norm_written");
        }
        /* A non-finite norm: the weights stay those of step s-1 (unless this step's updates ran
         * during the backward); the launcher sees the norm and stops the job. */
        if (!isfinite(norm))
            break;
        if (!during_backward) {
            if (wait_checkpoint(o, s) != 0)
                return 0;
            for (int i = 0; i < o->num_chunks; i++)
                update_chunk(o, o->chunks[i], s, coef);
        }
    }
    set_phase(o, PHASE_DONE);
    return 0;
}
