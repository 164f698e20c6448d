/* The worker's gradient poster (see pipeline_poster.h): gradient copies into host slots or the
 * accumulator (GPU-side gradients: after the exchange has reduced them), and the thread that posts
 * their descriptors to the optimizers' rings once the copies have landed, with the progress marks
 * between them. */
#include "worker/pipeline_poster.h"

#include <stdlib.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fault.h"
#include "shm/futex.h"
#include "worker/pipeline_exchange.h"
#include "worker/pipeline_wait.h"

void post_enqueue(struct worker *w, struct post p)
{
    pthread_mutex_lock(&w->post_mu);
    while (w->post_head - w->post_tail >= POST_QUEUE)
        pthread_cond_wait(&w->post_space, &w->post_mu);
    w->posts[w->post_head++ % POST_QUEUE] = p;
    pthread_cond_signal(&w->post_more);
    pthread_mutex_unlock(&w->post_mu);
}

void post_drain(struct worker *w)
{
    pthread_mutex_lock(&w->post_mu);
    while (w->post_head != w->post_tail)
        pthread_cond_wait(&w->post_idle, &w->post_mu);
    pthread_mutex_unlock(&w->post_mu);
}

static void remember_grad_buf(struct worker *w, float *buf, int slot)
{
    int free_i = -1;
    for (int i = 0; i < w->num_grad_bufs; i++) {
        if (w->grad_bufs[i].buf == buf) {
            w->grad_bufs[i].slot = slot;
            return;
        }
        if (!w->grad_bufs[i].buf && free_i < 0)
            free_i = i;
    }
    SD_ASSERT(free_i >= 0);
    w->grad_bufs[free_i].buf = buf;
    w->grad_bufs[free_i].slot = slot;
}

/* The model reuses a gradient buffer: later compute waits until its last copy has read it. */
void io_grads_reuse(void *ctx, float *grad)
{
    struct worker *w = ctx;
    for (int i = 0; i < w->num_grad_bufs; i++)
        if (w->grad_bufs[i].buf == grad)
            w->be.ops->wait_grads_device(&w->be, w->grad_bufs[i].slot);
}

/* Whether the previous incarnation already posted chunk c of the micro-batch being redone: its
 * descriptor is in our ring, or the optimizer has consumed it. */
static bool already_posted(struct worker *w, int c)
{
    return ctl_grad_out(w->ctl, w->rank, c, w->step, w->micro);
}

bool all_posted(struct worker *w)
{
    for (int c = 0; c < w->ctl->num_chunks; c++)
        if (!already_posted(w, c))
            return false;
    return true;
}

/* Whether the previous incarnation already sent this micro-batch's gradient of chunk c. */
static bool sent_before_restart(struct worker *w, int c)
{
    return w->recovering && w->step == w->recover_step && already_posted(w, c);
}

/* Waits until host slot si is free and marks it being written with a new fill sequence (*seq);
 * returns the slot's memory. */
static float *claim_slot(struct worker *w, int si, uint32_t *seq)
{
    struct slot_state *ss = ctl_slot(w->ctl, w->rank, si);
    uint64_t t0 = clock_ns();
    uint32_t word;
    for (;;) {
        /* acquire: pairs with the optimizer's release when it frees the slot after reading it */
        word = atomic_load_explicit(&ss->state, memory_order_acquire);
        if (SLOT_STATE(word) == SLOT_FREE)
            break;
        set_phase(w, PHASE_WAIT_SLOT);
        futex_wait(&ss->state, word, WAIT_SLICE_MS);
        bail_if_stopped(w);
    }
    atomic_fetch_add_explicit(&w->slot->wait_ns, clock_ns() - t0, memory_order_relaxed);
    set_phase(w, PHASE_BACKWARD); /* gradients are only posted during the backward */

    *seq = (SLOT_SEQ(word) + 1) & 0x3fffffffu;
    atomic_store_explicit(&ss->state, SLOT_WORD(*seq, SLOT_WRITING), memory_order_relaxed);
    fault_point("worker_slot_writing");
    return job_grad_slot(&w->shm, w->rank, si);
}

/* Copies elements [begin, begin+count) of chunk c's gradient (device memory at grad) into the
 * next free host slot, or straight into the accumulator (grads_direct), and queues its descriptor
 * for the poster thread. */
static void post_grad(struct worker *w, int c, float *grad, int64_t begin, int64_t count)
{
    struct ctl_header *h = w->ctl;
    /* Straight into the accumulator, the index only names the copy's completion event. The main
     * thread queues a whole backward's copies before the first lands, so the events cycle through
     * more than the post queue can hold: none is recorded again before the poster has waited on
     * it (with the few slots' events, it would wait for a later copy and post in bursts). */
    int si = h->grads_direct ? w->next_direct_event : w->next_grad_slot;
    if (h->grads_direct)
        w->next_direct_event = (w->next_direct_event + 1) % BE_MAX_XFER_SLOTS;
    else
        w->next_grad_slot = (w->next_grad_slot + 1) % h->grad_slots;
    struct post post = {.chunk = c,
                        .slot = si,
                        .step = w->step,
                        .micro = w->micro,
                        .elem_begin = begin,
                        .elem_count = count};
    if (h->grads_direct) {
        /* Nobody reads this part of the accumulator until the descriptor is out, and its previous
         * step's update finished before this step could read the chunk. The slot index only names
         * the copy's completion event. */
        size_t at = (size_t)ctl_chunks(h)[c].offset + (size_t)begin;
        post.direct = true;
        set_phase(w, PHASE_BACKWARD);
        fault_point("worker_direct_sending");
        if (h->grads_bf16)
            w->be.ops->send_grads_bf16_async(&w->be, si, w->shm.grad_acc16 + at, grad, (size_t)count);
        else
            w->be.ops->send_grads_async(&w->be, si, w->shm.grad_acc + at, grad, (size_t)count);
    } else {
        w->be.ops->send_grads_async(&w->be, si, claim_slot(w, si, &post.seq), grad, (size_t)count);
    }
    remember_grad_buf(w, grad, si);
    post_enqueue(w, post);
}

/* GPU-side gradients: chunk c's gradient through the exchange onto this rank's shard of the step's
 * sum, which leaves after the last micro-step. */
static void reduce_and_post(struct worker *w, int c, float *grad)
{
    const struct chunk_desc *ch = &ctl_chunks(w->ctl)[c];
    float *sum = w->grad_shard[c];
    uint64_t key = xchg_grad_publish(w, c, grad);
    if (w->micro_index == 0)
        io_grads_reuse(w, sum); /* last step's send of the sum has read it */
    xchg_grad_reduce(w, c, key, sum);
    if ((int)w->micro_index == w->A - 1 && !sent_before_restart(w, c))
        post_grad(w, c, sum, layout_shard_begin(ch->numel, w->G, w->rank),
                  layout_shard_numel(ch->numel, w->G, w->rank));
}

void io_grads_done(void *ctx, int c, float *grad)
{
    struct worker *w = ctx;
    if (w->gpu_grads) {
        reduce_and_post(w, c, grad);
        return;
    }
    if (!sent_before_restart(w, c))
        post_grad(w, c, grad, 0, ctl_chunks(w->ctl)[c].numel);
}

/* Poster thread: publishes one gradient once its copy has landed, or applies a progress mark. */
static void post_one(struct worker *w, const struct post *p)
{
    struct ctl_header *h = w->ctl;
    if (p->chunk < 0) {
        struct step_record *rec = ctl_step(h, p->step);
        atomic_store_explicit(&rec->posted[w->rank], micro_key(p->step, p->posted), memory_order_release);
        fault_point("poster_marked");
        if (p->step_done)
            finish_rank(w, p->step);
        return;
    }
    int owner = ctl_chunk_state(h, p->chunk)->owner;
    w->be.ops->wait_grads_host(&w->be, p->slot);
    if (!p->direct) {
        fault_point("worker_slot_written");
        struct slot_state *ss = ctl_slot(h, w->rank, p->slot);
        atomic_store_explicit(&ss->state, SLOT_WORD(p->seq, SLOT_POSTED), memory_order_release);
        fault_point("worker_slot_posted");
    }
    struct chunk_desc_msg msg = {
        .chunk = (uint32_t)p->chunk,
        .step = p->step,
        .micro = p->micro,
        .rank = (uint16_t)w->rank,
        .slot = p->direct ? DESC_SLOT_DIRECT : (uint16_t)p->slot,
        .generation = w->generation,
        .seq = p->seq,
        .kind = DESC_GRAD,
        .elem_begin = (uint64_t)p->elem_begin,
        .elem_count = (uint64_t)p->elem_count,
        .bytes = (uint64_t)p->elem_count * (w->ctl->grads_bf16 && p->direct ? 2 : 4),
    };
    /* The ring has more entries than this rank has slots, so it cannot be full; without slots it
     * holds at most a step's chunks (the next step's need this one's updates), so it fills only
     * on models of more chunks than RING_CAP: then wait for the optimizer to pop. */
    while (!ring_push(ctl_ring(h, w->rank, owner), &msg)) {
        SD_ASSERT(p->direct);
        set_phase(w, PHASE_WAIT_SLOT);
        usleep(200);
        bail_if_stopped(w);
    }
    fault_point("worker_pushed");
    struct doorbell *db = ctl_doorbell(h, owner);
    atomic_fetch_add_explicit(&db->seq, 1, memory_order_release);
    futex_wake_all(&db->seq);
    atomic_fetch_add_explicit(&w->slot->bytes_out, msg.bytes, memory_order_relaxed);
}

void *poster_main(void *arg)
{
    struct worker *w = arg;
    pthread_mutex_lock(&w->post_mu);
    for (;;) {
        while (w->post_head == w->post_tail)
            pthread_cond_wait(&w->post_more, &w->post_mu);
        struct post p = w->posts[w->post_tail % POST_QUEUE];
        w->post_busy = true;
        pthread_mutex_unlock(&w->post_mu);
        post_one(w, &p);
        pthread_mutex_lock(&w->post_mu);
        w->post_tail++;
        w->post_busy = false;
        pthread_cond_signal(&w->post_space);
        if (w->post_head == w->post_tail)
            pthread_cond_broadcast(&w->post_idle);
    }
    return NULL;
}

bool step_logged(struct worker *w, uint32_t s)
{
    return atomic_load_explicit(&w->ctl->metrics_step, memory_order_acquire) >= s;
}

/* Marks the rank's part of step s complete: its loss, then the mark the launcher waits for. A
 * step the launcher has logged already (a restart redoing it) is left alone. */
void finish_rank(struct worker *w, uint32_t s)
{
    if (!ctl_finish_rank(w->ctl, s, w->rank)) {
        SD_ASSERT(step_logged(w, s));
        return;
    }
    fault_point("poster_rank_done");
}
