/* The optimizer process's loop (see optim.h). Two update modes (DESIGN §5): after the backward,
 * once the global norm is known (needed for clipping; the update then overlaps the next step's
 * forward), or during the backward, each chunk as soon as its gradient is complete. */
#include "optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "optimizer/adamw.h"
#include "shm/ctl.h"
#include "shm/futex.h"

#define WAIT_SLICE_MS 100

struct optim {
    struct job_shm shm;
    struct ctl_header *ctl;
    struct proc_slot *slot;
    int index;
    uint32_t generation;
    int *chunks; /* owned, ascending */
    int num_chunks;
    int total_micro;
    enum adamw_isa isa;
};

static void set_phase(struct optim *o, int phase)
{
    atomic_store_explicit(&o->slot->phase, (uint32_t)phase, memory_order_relaxed);
    atomic_store_explicit(&o->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
}

static bool torn_down(struct optim *o)
{
    return atomic_load(&o->ctl->stop) == 2 || atomic_load(&o->ctl->generation) != o->generation || getppid() == 1;
}

static void update_chunk(struct optim *o, int c, uint32_t s, float clip_coef)
{
    struct ctl_header *h = o->ctl;
    const struct chunk_desc *ch = &ctl_chunks(h)[c];
    const struct tensor_desc *tensors = ctl_tensors(h);
    const struct job_config *job = &h->job;
    uint64_t t0 = clock_ns();
    set_phase(o, PHASE_UPDATE);
    struct adamw_step st = {
        .lr = (float)job_lr_at(job, (int)s),
        .beta1 = (float)job->beta1,
        .beta2 = (float)job->beta2,
        .eps = (float)job->eps,
        .grad_scale = clip_coef,
        .step = (int)s,
    };
    for (int i = ch->first_tensor; i < ch->first_tensor + ch->num_tensors; i++) {
        const struct tensor_desc *t = &tensors[i];
        st.weight_decay = t->decay ? (float)job->weight_decay : 0.0f;
        size_t off = (size_t)t->offset;
        adamw_update(o->isa, &st, o->shm.master + off, o->shm.exp_avg + off, o->shm.exp_avg_sq + off,
                     o->shm.grad_acc + off, o->shm.params16 + off, (size_t)t->numel);
    }
    struct chunk_state *cs = ctl_chunk_state(h, c);
    /* release: pairs with the workers' acquire load of version before they read params16 */
    atomic_store_explicit(&cs->version, s, memory_order_release);
    futex_wake_all(&cs->version);
    atomic_fetch_add_explicit(&o->slot->bytes_out, (uint64_t)ch->numel * 2, memory_order_relaxed);
    atomic_fetch_add_explicit(&o->slot->items, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&o->slot->busy_ns, clock_ns() - t0, memory_order_relaxed);
    uint32_t done = atomic_fetch_add_explicit(&h->chunks_updated, 1, memory_order_acq_rel) + 1;
    if (done == s * (uint32_t)h->num_chunks) {
        struct step_record *rec = ctl_step(h, s);
        rec->t_commit_ns = clock_ns();
        atomic_store_explicit(&rec->committed, 1, memory_order_release);
    }
}

/* Adds one micro-batch's gradient of a chunk; finishes the chunk when it was the last. Returns
 * true when the chunk's reduction for the step is complete. */
static bool reduce_one(struct optim *o, const struct chunk_desc_msg *d)
{
    struct ctl_header *h = o->ctl;
    const struct chunk_desc *ch = &ctl_chunks(h)[d->chunk];
    struct chunk_state *cs = ctl_chunk_state(h, (int)d->chunk);
    uint64_t t0 = clock_ns();
    set_phase(o, PHASE_REDUCE);
    const float *src = job_grad_slot(&o->shm, d->rank, d->slot);
    grad_accumulate(o->shm.grad_acc + ch->offset, src, (size_t)ch->numel, d->micro == 0);
    struct slot_state *ss = ctl_slot(h, d->rank, d->slot);
    /* release: pairs with the worker's acquire load of the slot state before it overwrites the slot */
    atomic_store_explicit(&ss->state, SLOT_FREE, memory_order_release);
    futex_wake_all(&ss->state);
    atomic_fetch_add_explicit(&o->slot->bytes_in, d->bytes, memory_order_relaxed);
    atomic_fetch_add_explicit(&o->slot->busy_ns, clock_ns() - t0, memory_order_relaxed);
    uint32_t next = atomic_load_explicit(&cs->next_micro, memory_order_relaxed) + 1;
    if (next < (uint32_t)o->total_micro) {
        atomic_store_explicit(&cs->next_micro, next, memory_order_relaxed);
        return false;
    }
    cs->sumsq[d->step & 1] = sumsq_f32(o->shm.grad_acc + ch->offset, (size_t)ch->numel);
    atomic_store_explicit(&cs->next_micro, 0, memory_order_relaxed);
    atomic_store_explicit(&cs->reduced_step, d->step, memory_order_release);
    /* acq_rel: the sumsq store above is visible to whoever sees the count reach the step's total */
    atomic_fetch_add_explicit(&h->chunks_reduced, 1, memory_order_acq_rel);
    futex_wake_all(&h->chunks_reduced);
    return true;
}

/* Drains the rings until every owned chunk's gradient of step s is complete. Returns 1 if the
 * step was abandoned (workers gone before finishing it), 0 when complete. */
static int reduce_step(struct optim *o, uint32_t s, bool update_now)
{
    struct ctl_header *h = o->ctl;
    int remaining = 0;
    for (int i = 0; i < o->num_chunks; i++)
        remaining += atomic_load(&ctl_chunk_state(h, o->chunks[i])->reduced_step) < s;
    struct doorbell *db = ctl_doorbell(h, o->index);
    while (remaining > 0) {
        /* acquire: pairs with the workers' release increment after ring_push */
        uint32_t seen = atomic_load_explicit(&db->seq, memory_order_acquire);
        bool progressed = false;
        for (int r = 0; r < h->gpus; r++) {
            struct ring *ring = ctl_ring(h, r, o->index);
            struct chunk_desc_msg d;
            while (ring_peek(ring, &d)) {
                SD_ASSERT(d.step == s && d.kind == DESC_GRAD);
                struct chunk_state *cs = ctl_chunk_state(h, (int)d.chunk);
                if (d.micro != atomic_load_explicit(&cs->next_micro, memory_order_relaxed))
                    break; /* an earlier micro-batch of this chunk is still on its way */
                bool complete = reduce_one(o, &d);
                ring_pop(ring);
                progressed = true;
                if (complete) {
                    remaining--;
                    if (update_now)
                        update_chunk(o, (int)d.chunk, s, 1.0f);
                }
            }
        }
        if (progressed)
            continue;
        set_phase(o, PHASE_WAIT_GRADS);
        uint64_t t0 = clock_ns();
        futex_wait(&db->seq, seen, WAIT_SLICE_MS);
        atomic_fetch_add_explicit(&o->slot->wait_ns, clock_ns() - t0, memory_order_relaxed);
        if (torn_down(o))
            return -1;
        if (atomic_load(&h->stop) == 3 && atomic_load_explicit(&db->seq, memory_order_acquire) == seen) {
            /* Workers have all exited and nothing more can arrive: the step cannot complete. */
            bool empty = true;
            for (int r = 0; r < h->gpus; r++)
                empty &= ring_count(ctl_ring(h, r, o->index)) == 0;
            if (empty) {
                atomic_store(&h->abandoned_step, s);
                futex_wake_all(&h->chunks_reduced);
                return 1;
            }
        }
    }
    return 0;
}

/* Waits for every chunk's reduction of step s and returns the global L2 norm (chunk order).
 * Returns -1 if the step was abandoned. */
static double global_norm(struct optim *o, uint32_t s)
{
    struct ctl_header *h = o->ctl;
    uint32_t target = s * (uint32_t)h->num_chunks;
    for (;;) {
        uint32_t n = atomic_load_explicit(&h->chunks_reduced, memory_order_acquire);
        if (n >= target)
            break;
        if (atomic_load(&h->abandoned_step) == s)
            return -1;
        set_phase(o, PHASE_WAIT_NORM);
        futex_wait(&h->chunks_reduced, n, WAIT_SLICE_MS);
        if (torn_down(o))
            return -1;
    }
    double total = 0;
    for (int c = 0; c < h->num_chunks; c++)
        total += ctl_chunk_state(h, c)->sumsq[s & 1];
    return sqrt(total);
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
    atomic_store(&o->slot->pid, (int32_t)getpid());
    set_phase(o, PHASE_STARTING);
    o->total_micro = h->gpus * h->job.grad_accum;
    o->isa = adamw_isa_detect();
    o->chunks = malloc(sizeof(int) * (size_t)h->num_chunks);
    if (!o->chunks)
        return sd_err("out of memory");
    for (int c = 0; c < h->num_chunks; c++)
        if (ctl_chunk_state(h, c)->owner == o->index)
            o->chunks[o->num_chunks++] = c;
    return 0;
}

int optim_run(const struct optim_args *args)
{
    struct optim *o = calloc(1, sizeof *o);
    if (!o)
        return sd_err("out of memory");
    if (optim_setup(o, args) != 0)
        return -1;
    struct ctl_header *h = o->ctl;
    bool during_backward = h->plan.update_mode == UPDATE_DURING_BACKWARD;
    for (uint32_t s = (uint32_t)h->first_step; s <= (uint32_t)h->job.steps; s++) {
        atomic_store(&o->slot->step, s);
        int rc = reduce_step(o, s, during_backward);
        if (rc != 0)
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
        }
        if (!during_backward)
            for (int i = 0; i < o->num_chunks; i++)
                update_chunk(o, o->chunks[i], s, coef);
    }
    set_phase(o, PHASE_DONE);
    return 0;
}
