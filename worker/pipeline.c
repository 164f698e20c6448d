/* The worker process's step loop and its streaming model_io (see pipeline.h). One chunk cache of
 * device buffers holds (chunk, version) pairs, so when the plan gives enough buffers the weights
 * stay resident across micro-steps and each step streams every chunk once. With G > 1 the routes
 * of docs/design.md §7 apply: parameters replicated (every rank copies each chunk from the host) or
 * sharded (each rank copies its 1/G into its exchange window and gathers the rest from its peers'
 * windows), gradients reduced on the CPU (every rank sends each chunk) or on the GPUs (each rank
 * sums its 1/G of every rank's gradient, in rank order, over the step, and sends that). */
#include "pipeline.h"

#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/data.h"
#include "common/err.h"
#include "common/fault.h"
#include "shm/futex.h"
#include "worker/model.h"

#define WAIT_SLICE_MS 100

struct cache_entry {
    void *dev;
    int chunk;         /* -1 when empty */
    uint32_t version;
    bool held;
    uint64_t last_use;
};

/* A gradient on its way to the host, or (chunk < 0) a progress mark, for the poster thread. */
struct post {
    int chunk;
    int slot;
    uint32_t seq, step, micro;
    int64_t elem_begin, elem_count; /* the elements of the chunk the slot holds */
    bool direct;        /* copied into the accumulator, not a slot (grads_direct) */
    uint32_t posted;    /* mark: micro-steps of `step` whose gradients are now all posted */
    bool step_done;     /* mark: the rank's part of `step` is complete */
};

/* more than the gradient slots (< RING_CAP) plus the marks between them, and fewer than the
 * copy events (BE_MAX_XFER_SLOTS) */
#define POST_QUEUE 512
_Static_assert(POST_QUEUE < BE_MAX_XFER_SLOTS, "a copy's event is not recorded again while its post is queued");

struct worker {
    struct job_shm shm;
    struct ctl_header *ctl;
    struct proc_slot *slot;
    struct backend be;
    struct model model;
    int rank, G, A, mb, T;
    uint32_t generation;

    struct cache_entry *cache;
    int cache_size;
    uint64_t use_clock;
    uint32_t need_version; /* the params version the current pass reads */

    int next_grad_slot;
    int next_direct_event; /* grads_direct: the next copy's completion event */
    uint32_t step, micro;  /* descriptor fields of the current micro-batch */
    uint32_t micro_index;  /* a, the micro-step within the step */
    double loss_sum;       /* masked loss over this rank's micro-steps of the step so far */
    const uint8_t *row_mask_cur;
    /* After a restart, the micro-batch the previous incarnation may have partly posted: its
     * chunks that already reached the optimizer are not posted again. */
    bool recovering;
    uint32_t recover_step;

    /* The poster thread waits for each gradient copy to land, then posts its descriptor, so the
     * main thread keeps queueing compute meanwhile. FIFO: marks follow the posts they cover. */
    pthread_t poster;
    pthread_mutex_t post_mu;
    pthread_cond_t post_more, post_space, post_idle;
    struct post posts[POST_QUEUE];
    unsigned post_head, post_tail;
    bool post_busy;
    /* The device gradient buffers the model handed over (one per chunk at most), with the
     * transfer slot of their last copy. */
    struct grad_buf {
        float *buf;
        int slot;
    } *grad_bufs;
    int num_grad_bufs;

    /* The exchange between workers (shm/ctl.h struct xchg_rank). */
    bool sharded_params, gpu_grads;
    void *window[JOB_MAX_GPUS];  /* every rank's exchange window, as this process addresses it */
    uint64_t next_param_key;     /* the next parameter key this rank takes part in */
    float **grad_shard;          /* per chunk: this rank's shard of the step's gradient sum */
    struct window_layout win;

    struct data_set train, val;
    bool have_val;
    int32_t *tokens, *targets, *correct;
    int64_t *seq_index; /* the micro-batch's sequence indices (micro_batch of them) */
    float *row_scale, *loss_rows;
    uint8_t *mask;
    int32_t *seq_buf;
};

static bool stop_now(struct worker *w)
{
    uint32_t stop = atomic_load(&w->ctl->stop);
    return stop == STOP_NOW || stop == STOP_WORKERS_NOW || atomic_load(&w->slot->generation) != w->generation ||
           getppid() == 1;
}

static void set_phase(struct worker *w, int phase)
{
    atomic_store_explicit(&w->slot->phase, (uint32_t)phase, memory_order_relaxed);
    atomic_store_explicit(&w->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
}

/* Shows a waiting phase while blocked, then the phase we were in before. */
static uint32_t begin_wait(struct worker *w, int phase)
{
    uint32_t prev = atomic_load_explicit(&w->slot->phase, memory_order_relaxed);
    set_phase(w, phase);
    return prev;
}

/* Called after every wait slice: beats the heartbeat the launcher's watchdog checks (a wait is
 * progress of its own), and exits the process when the job is being torn down while we wait;
 * nothing we hold needs saving: the launcher repairs rings and slots of dead or departed workers. */
static void bail_if_stopped(struct worker *w)
{
    atomic_store_explicit(&w->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
    if (stop_now(w)) {
        fprintf(stderr, "worker %d: stopping (job stopped or generation changed)\n", w->rank);
        _exit(0);
    }
}

/* Waits until version need of chunk c is readable and returns where it is (shm/ctl.h
 * job_params16_of). Updating during the backward, a worker redoing a step after a crash may find
 * the chunk one version further: the copy of the other parity still holds the one it needs. */
static const uint16_t *wait_version(struct worker *w, int c)
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

/* ---- the exchange ---- */

static struct xchg_rank *xchg_of(struct worker *w, int r)
{
    return ctl_xchg(w->ctl, r);
}

/* Wakes whoever waits on one of this rank's exchange words. */
static void xchg_ring(struct worker *w)
{
    struct xchg_rank *x = xchg_of(w, w->rank);
    atomic_fetch_add_explicit(&x->bell, 1, memory_order_release);
    futex_wake_all(&x->bell);
}

/* Sets one of this rank's exchange words (1 + the key just finished) and wakes its waiters. */
static void xchg_publish(struct worker *w, _Atomic uint64_t *word, uint64_t done)
{
    /* release: the window contents / the reads of the peers' windows happen before */
    atomic_store_explicit(word, done, memory_order_release);
    xchg_ring(w);
}

/* Waits until every rank's word (at byte offset `field` in its struct xchg_rank) reaches `done`. */
static void xchg_wait_all(struct worker *w, size_t field, uint64_t done)
{
    uint32_t prev_phase = UINT32_MAX;
    uint64_t t0 = clock_ns();
    for (int r = 0; r < w->G; r++) {
        struct xchg_rank *x = xchg_of(w, r);
        _Atomic uint64_t *word = (_Atomic uint64_t *)((char *)x + field);
        for (;;) {
            uint32_t bell = atomic_load_explicit(&x->bell, memory_order_acquire);
            /* acquire: pairs with xchg_publish; the peer's window is ready to read (or reuse) */
            if (atomic_load_explicit(word, memory_order_acquire) >= done)
                break;
            if (prev_phase == UINT32_MAX)
                prev_phase = begin_wait(w, PHASE_WAIT_PEERS);
            futex_wait(&x->bell, bell, WAIT_SLICE_MS);
            bail_if_stopped(w);
        }
    }
    if (prev_phase != UINT32_MAX) {
        set_phase(w, (int)prev_phase);
        atomic_fetch_add_explicit(&w->slot->wait_ns, clock_ns() - t0, memory_order_relaxed);
    }
}

/* Rank r's window: ours, a slice of the grads region (CPU backend), or a peer's exported device
 * memory, opened the first time it is needed (after the peer published it). */
static char *window_of(struct worker *w, int r)
{
    if (w->window[r])
        return w->window[r];
    struct xchg_rank *x = xchg_of(w, r);
    while (atomic_load_explicit(&x->window_generation, memory_order_acquire) == 0) {
        uint32_t bell = atomic_load_explicit(&x->bell, memory_order_acquire);
        if (atomic_load_explicit(&x->window_generation, memory_order_acquire) != 0)
            break;
        futex_wait(&x->bell, bell, WAIT_SLICE_MS);
        bail_if_stopped(w);
    }
    w->window[r] = w->be.ops->open_peer(&w->be, x->window_handle);
    if (!w->window[r]) {
        fprintf(stderr, "worker %d: %s\n", w->rank, sd_errmsg());
        exit(1);
    }
    return w->window[r];
}

static size_t weight_size(const struct worker *w)
{
    return be_dtype_size(w->be.weight_dtype);
}

/* Chunk c's parameter shard [lo, lo+n) at the version this pass needs, into device memory dst;
 * waits for the copy. */
static void stage_weights(struct worker *w, void *dst, int c, int64_t lo, int64_t n)
{
    const uint16_t *src = wait_version(w, c);
    w->be.ops->fetch_weights_async(&w->be, w->cache_size, dst, src + lo, (size_t)n);
    w->be.ops->synchronize(&w->be);
    atomic_fetch_add_explicit(&w->slot->bytes_in, (uint64_t)n * 2, memory_order_relaxed);
}

/* Sharded parameters: the first read of a (chunk, version), which every rank makes in the same
 * order, copies this rank's shard from the host into its window and every rank's shard from the
 * windows into the cache entry. */
static void gather_chunk(struct worker *w, struct cache_entry *e, int c, uint64_t key)
{
    struct ctl_header *h = w->ctl;
    const struct chunk_desc *ch = &ctl_chunks(h)[c];
    int slot = (int)(key % XCHG_SLOTS);
    size_t ws = weight_size(w);
    uint64_t off = w->win.param_base + (uint64_t)slot * w->win.param_slot_bytes;
    if (key >= XCHG_SLOTS) /* our slot's previous shard has been read by everyone */
        xchg_wait_all(w, offsetof(struct xchg_rank, param_gathered), key - XCHG_SLOTS + 1);
    stage_weights(w, window_of(w, w->rank) + off, c, layout_shard_begin(ch->numel, w->G, w->rank),
                  layout_shard_numel(ch->numel, w->G, w->rank));
    xchg_publish(w, &xchg_of(w, w->rank)->param_staged, key + 1);
    fault_point("worker_param_staged");

    xchg_wait_all(w, offsetof(struct xchg_rank, param_staged), key + 1);
    for (int r = 0; r < w->G; r++) {
        size_t lo = (size_t)layout_shard_begin(ch->numel, w->G, r), n = (size_t)layout_shard_numel(ch->numel, w->G, r);
        w->be.ops->copy_device(&w->be, (char *)e->dev + lo * ws, window_of(w, r) + off, n * ws);
        if (r != w->rank)
            atomic_fetch_add_explicit(&w->slot->bytes_peer, (uint64_t)(n * ws), memory_order_relaxed);
    }
    w->be.ops->synchronize(&w->be);
    xchg_publish(w, &xchg_of(w, w->rank)->param_gathered, key + 1);
    e->chunk = c;
    e->version = w->need_version;
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

static const void *io_weights(void *ctx, int c, int next)
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

static void io_release(void *ctx, int c)
{
    struct worker *w = ctx;
    for (int i = 0; i < w->cache_size; i++)
        if (w->cache[i].chunk == c)
            w->cache[i].held = false;
}

static void post_enqueue(struct worker *w, struct post p)
{
    pthread_mutex_lock(&w->post_mu);
    while (w->post_head - w->post_tail >= POST_QUEUE)
        pthread_cond_wait(&w->post_space, &w->post_mu);
    w->posts[w->post_head++ % POST_QUEUE] = p;
    pthread_cond_signal(&w->post_more);
    pthread_mutex_unlock(&w->post_mu);
}

/* Waits until the poster has published everything queued so far. */
static void post_drain(struct worker *w)
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
static void io_grads_reuse(void *ctx, float *grad)
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

/* Whether the previous incarnation posted every chunk of the micro-batch being redone. */
static bool all_posted(struct worker *w)
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

/* GPU-side gradients: puts this micro-step's gradient of chunk c in our window, adds our shard of
 * every rank's (rank order) onto the step's sum, and after the last micro-step sends that shard.
 * The sum runs in the order of the global micro-batches (a*G + r), as the CPU route's does. */
static void reduce_scatter_chunk(struct worker *w, int c, float *grad)
{
    struct ctl_header *h = w->ctl;
    const struct chunk_desc *ch = &ctl_chunks(h)[c];
    uint64_t key = xchg_grad_key(h, w->step, w->micro_index, c);
    uint64_t off = (key % XCHG_SLOTS) * w->win.grad_slot_bytes;
    if (key >= XCHG_SLOTS) /* our slot's previous gradient has been read by everyone */
        xchg_wait_all(w, offsetof(struct xchg_rank, grad_reduced), key - XCHG_SLOTS + 1);
    w->be.ops->copy_device(&w->be, window_of(w, w->rank) + off, grad, (size_t)ch->numel * sizeof(float));
    w->be.ops->synchronize(&w->be);
    xchg_publish(w, &xchg_of(w, w->rank)->grad_published, key + 1);
    fault_point("worker_grad_published");

    int64_t lo = layout_shard_begin(ch->numel, w->G, w->rank), n = layout_shard_numel(ch->numel, w->G, w->rank);
    float *sum = w->grad_shard[c];
    if (w->micro_index == 0)
        io_grads_reuse(w, sum); /* last step's send of the sum has read it */
    xchg_wait_all(w, offsetof(struct xchg_rank, grad_published), key + 1);
    for (int r = 0; r < w->G; r++) {
        const float *src = (const float *)(window_of(w, r) + off) + lo;
        if (w->micro_index == 0 && r == 0)
            w->be.ops->copy_device(&w->be, sum, src, (size_t)n * sizeof(float));
        else
            w->be.ops->add_f32(&w->be, sum, src, (size_t)n);
        if (r != w->rank)
            atomic_fetch_add_explicit(&w->slot->bytes_peer, (uint64_t)n * sizeof(float), memory_order_relaxed);
    }
    w->be.ops->synchronize(&w->be);
    xchg_publish(w, &xchg_of(w, w->rank)->grad_reduced, key + 1);
    if ((int)w->micro_index == w->A - 1 && !sent_before_restart(w, c))
        post_grad(w, c, sum, lo, n);
}

static void io_grads_done(void *ctx, int c, float *grad)
{
    struct worker *w = ctx;
    if (w->gpu_grads) {
        reduce_scatter_chunk(w, c, grad);
        return;
    }
    if (!sent_before_restart(w, c))
        post_grad(w, c, grad, 0, ctl_chunks(w->ctl)[c].numel);
}

static void finish_rank(struct worker *w, uint32_t s);

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

static void *poster_main(void *arg)
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

static void save_loss_progress(struct worker *w, uint32_t s, uint32_t done, double sum);

/* The micro-step's loss is saved before its gradients go out: once they all have, the step may
 * commit, and its loss must survive a crash. */
static void io_loss_done(void *ctx, const float *loss_rows, int n)
{
    struct worker *w = ctx;
    double micro = 0;
    for (int i = 0; i < n; i++)
        if (w->row_mask_cur[i])
            micro += (double)loss_rows[i];
    w->loss_sum += micro;
    save_loss_progress(w, w->step, w->micro_index + 1, w->loss_sum);
}

/* Saves the loss over micro-steps [0, done) of step s (crash-safe: see struct loss_progress). */
static void save_loss_progress(struct worker *w, uint32_t s, uint32_t done, double sum)
{
    struct loss_progress *lp = ctl_loss_progress(w->ctl, s, w->rank, done);
    atomic_store_explicit(&lp->key, 0, memory_order_relaxed);
    /* Only a restart reads the entry, after this process died: what matters is the order in which
     * the stores are executed, and a kill cannot undo one that was. The signal fence keeps the
     * compiler from moving the plain store of sum out from between the clear and the tag. */
    atomic_signal_fence(memory_order_seq_cst);
    lp->sum = sum;
    atomic_store_explicit(&lp->key, micro_key(s, done), memory_order_release);
    fault_point("worker_loss_saved");
}

/* The saved loss over the first `done` micro-steps of step s (0 when done is 0); false when it is
 * not there, which happens only when the step is logged already and its entries reused. */
static bool loss_through(struct worker *w, uint32_t s, uint32_t done, double *sum)
{
    *sum = 0;
    if (done == 0)
        return true;
    struct loss_progress *lp = ctl_loss_progress(w->ctl, s, w->rank, done);
    if (atomic_load_explicit(&lp->key, memory_order_acquire) != micro_key(s, done)) {
        SD_ASSERT(atomic_load_explicit(&w->ctl->metrics_step, memory_order_acquire) >= s);
        return false;
    }
    *sum = lp->sum;
    return true;
}

/* Whether step s is logged already (its record then belongs to a later step). */
static bool step_logged(struct worker *w, uint32_t s)
{
    return atomic_load_explicit(&w->ctl->metrics_step, memory_order_acquire) >= s;
}

/* Marks the rank's part of step s complete: its loss, then the mark the launcher waits for. A
 * step the launcher has logged already (a restart redoing it) is left alone. */
static void finish_rank(struct worker *w, uint32_t s)
{
    if (!ctl_finish_rank(w->ctl, s, w->rank)) {
        SD_ASSERT(step_logged(w, s));
        return;
    }
    fault_point("poster_rank_done");
}



/* Loads micro-batch rows: sequence indices from the order contract. */
static int load_rows(struct worker *w, struct data_set *d, const int64_t *seq_index, int rows)
{
    int T = w->T;
    for (int i = 0; i < rows; i++) {
        if (data_sequence(d, seq_index[i], w->seq_buf, w->mask + (size_t)i * T) != 0)
            return -1;
        memcpy(w->tokens + (size_t)i * T, w->seq_buf, sizeof(int32_t) * (size_t)T);
        memcpy(w->targets + (size_t)i * T, w->seq_buf + 1, sizeof(int32_t) * (size_t)T);
    }
    return 0;
}

/* Unmasked targets over the whole global batch of a step (every rank computes the same). */
static int count_step_targets(struct worker *w, int64_t step, int64_t *count)
{
    if (!w->train.has_flags) {
        *count = (int64_t)w->G * w->A * w->mb * w->T;
        return 0;
    }
    int64_t n = 0;
    for (int a = 0; a < w->A; a++)
        for (int r = 0; r < w->G; r++)
            for (int i = 0; i < w->mb; i++) {
                int64_t k = data_seq_index(step, a, r, i, w->A, w->G, w->mb);
                if (data_sequence(&w->train, k, w->seq_buf, w->mask) != 0)
                    return -1;
                for (int t = 0; t < w->T; t++)
                    n += w->mask[t];
            }
    *count = n;
    return 0;
}

static const struct model_io worker_io = {
    .weights = io_weights,
    .release = io_release,
    .grads_done = io_grads_done,
    .loss_done = io_loss_done,
    .grads_reuse = io_grads_reuse,
};

static int train_step(struct worker *w, uint32_t s)
{
    struct ctl_header *h = w->ctl;
    int64_t ntargets;
    if (count_step_targets(w, s, &ntargets) != 0)
        return -1;
    if (ntargets == 0)
        return sd_err("step %u has no unmasked targets in its global batch", s);
    struct step_record *rec = ctl_step(h, s);
    SD_ASSERT(atomic_load(&rec->step) == s || step_logged(w, s));
    if (w->rank == ctl_local_first(h))
        rec->tokens = ntargets; /* a late write to a recycled record: this rank sets it again for that step */
    struct model_io io = worker_io;
    io.ctx = w;
    w->need_version = s - 1;
    w->step = s;
    uint64_t posted_key = atomic_load_explicit(&rec->posted[w->rank], memory_order_acquire);
    uint32_t posted = posted_key >> 32 == s ? (uint32_t)posted_key : 0, first = posted;
    /* Micro-steps summing on the device post once, at the last one, as micro-batch r (GPU-side
     * gradients too, each rank its shard); a restart then has nothing posted to build on and redoes
     * the step from its first micro-step. */
    bool one_post = h->plan.accumulate_on_device || w->gpu_grads;
    bool redo_step = one_post || h->exchange;
    if (one_post && first < (uint32_t)w->A)
        first = 0;
    if (w->recovering)
        w->recover_step = s;
    if (h->exchange) {
        /* Every rank walks the same exchange sequence, so after a restart all of them redo the step
         * together (the launcher skips a step all of whose gradients were out: ctl_xchg_reset);
         * what already reached the optimizers is recognised and not sent again. */
        first = 0;
    } else if (w->recovering) {
        uint32_t recover_micro = one_post ? (uint32_t)w->rank : first * (uint32_t)w->G + (uint32_t)w->rank;
        /* With all its gradients out, the micro-batch is not computed again: its loss is saved, and
         * the step may complete and its chunks be updated while we would read them. */
        w->micro = recover_micro;
        if (first < (uint32_t)w->A && all_posted(w)) {
            first = one_post ? (uint32_t)w->A : first + 1;
            w->recovering = false;
        }
        /* the previous incarnation may also have died before marking what it posted */
        bool done = first == (uint32_t)w->A;
        if (first > posted || done)
            post_enqueue(w, (struct post){.chunk = -1, .step = s, .posted = first, .step_done = done});
    }
    if (!loss_through(w, s, first, &w->loss_sum))
        return 0; /* logged meanwhile: nothing of it is left to do */
    for (int a = (int)first; a < w->A; a++) {
        uint64_t t0 = clock_ns(), wait0 = atomic_load_explicit(&w->slot->wait_ns, memory_order_relaxed);
        for (int i = 0; i < w->mb; i++)
            w->seq_index[i] = data_seq_index(s, a, w->rank, i, w->A, w->G, w->mb);
        if (load_rows(w, &w->train, w->seq_index, w->mb) != 0)
            return -1;
        int n = w->mb * w->T;
        for (int i = 0; i < n; i++)
            w->row_scale[i] = w->mask[i] ? (float)(1.0 / (double)ntargets) : 0.0f;
        w->micro = one_post ? (uint32_t)w->rank : (uint32_t)(a * w->G + w->rank);
        w->micro_index = (uint32_t)a;
        w->row_mask_cur = w->mask;
        set_phase(w, PHASE_FORWARD);
        model_train_micro(&w->model, &io, w->tokens, w->targets, w->row_scale, w->loss_rows, NULL, a == (int)first,
                          a == w->A - 1);
        post_enqueue(w, (struct post){.chunk = -1, .step = s, .posted = (uint32_t)a + 1, .step_done = a == w->A - 1});
        if (!redo_step)
            w->recovering = false;
        atomic_fetch_add_explicit(&w->slot->items, 1, memory_order_relaxed);
        uint64_t waited = atomic_load_explicit(&w->slot->wait_ns, memory_order_relaxed) - wait0;
        atomic_fetch_add_explicit(&w->slot->busy_ns, clock_ns() - t0 - waited, memory_order_relaxed);
    }
    w->recovering = false;
    return 0;
}

/* Validation after update s: sequences j = rank, rank+G, ... of the val set, read at version s. */
static int eval_step(struct worker *w, uint32_t s)
{
    struct ctl_header *h = w->ctl;
    struct model_io io = worker_io;
    io.ctx = w;
    io.loss_done = NULL;
    w->need_version = s;
    post_drain(w); /* the step's marks go out before its validation's (the launcher needs both) */
    set_phase(w, PHASE_EVAL);
    int64_t nval = h->job.val_sequences > 0 && h->job.val_sequences < w->val.num_sequences ? h->job.val_sequences
                                                                                            : w->val.num_sequences;
    double loss = 0;
    int64_t count = 0, correct = 0;
    for (int64_t j0 = w->rank; j0 < nval; j0 += (int64_t)w->G * w->mb) {
        int rows = 0;
        for (int i = 0; i < w->mb; i++) {
            int64_t j = j0 + (int64_t)i * w->G;
            w->seq_index[i] = j < nval ? j : j0; /* pad a short last batch; padded rows are not counted */
            rows += j < nval;
        }
        if (load_rows(w, &w->val, w->seq_index, w->mb) != 0)
            return -1;
        model_eval(&w->model, &io, w->tokens, w->targets, w->loss_rows, w->correct, NULL);
        for (int i = 0; i < rows * w->T; i++)
            if (w->mask[i]) {
                loss += w->loss_rows[i];
                correct += w->correct[i];
                count++;
            }
    }
    struct step_record *rec = ctl_step(h, s);
    rec->val_loss_sum[w->rank] = loss;
    rec->val_count[w->rank] = count;
    rec->val_correct[w->rank] = correct;
    atomic_store_explicit(&rec->val_done[w->rank], s, memory_order_release);
    fault_point("worker_val_done");
    return 0;
}

/* Announces step s, then honours a stop request: the launcher, after raising the flag, takes the
 * highest step any worker announced as the last one, so either it saw our announcement (and
 * we run s) or we see the flag and wait for its decision. Every rank runs the same steps. */
static bool may_start_step(struct worker *w, uint32_t s)
{
    struct ctl_header *h = w->ctl;
    atomic_store(&w->slot->step, s);     /* seq_cst: ordered before the load of stop below */
    if (atomic_load(&h->stop) == STOP_NONE)
        return true;
    for (;;) {
        uint32_t last = atomic_load(&h->stop_step);
        if (last != 0)
            return s + 1 <= last;
        futex_wait(&h->stop_step, 0, WAIT_SLICE_MS);
        bail_if_stopped(w);
    }
}

static bool is_val_step(const struct ctl_header *h, bool have_val, uint32_t s)
{
    if (!have_val)
        return false;
    return s == (uint32_t)h->job.steps || (h->job.val_every > 0 && s % (uint32_t)h->job.val_every == 0);
}

/* Whether step s needs no validation from this rank (any more): not a validation step, or its sums
 * are written, or the step is logged. */
static bool val_done(struct worker *w, uint32_t s)
{
    return !is_val_step(w->ctl, w->have_val, s) ||
           atomic_load_explicit(&ctl_step(w->ctl, s)->val_done[w->rank], memory_order_acquire) == s ||
           step_logged(w, s);
}

/* This rank's exchange window (a slice of the grads region on the CPU backend, else device memory
 * published to the peers through the ctl region) and the sums of its gradient shards. */
static int exchange_setup(struct worker *w)
{
    struct ctl_header *h = w->ctl;
    struct xchg_rank *x = xchg_of(w, w->rank);
    w->sharded_params = h->plan.param_route == PARAMS_SHARDED;
    w->gpu_grads = h->plan.grad_route == GRADS_GPU;
    /* where every rank's first parameter read of its first step falls (the launcher set it) */
    w->next_param_key = atomic_load(&x->param_gathered);
    ctl_window_layout(h->max_chunk_numel, w->G, (int)weight_size(w), w->gpu_grads, w->sharded_params, &w->win);
    if (h->window_shm_bytes) {
        if (weight_size(w) != 4)
            return sd_err("the exchange windows in shared memory hold fp32 weights; this backend's are not");
        for (int r = 0; r < w->G; r++)
            w->window[r] = job_shm_window(&w->shm, r);
    } else {
        if (!w->be.ops->alloc_exported)
            return sd_err("the %s backend cannot share device memory with other workers", w->be.ops->name);
        size_t bytes = w->win.total;
        w->window[w->rank] = w->be.ops->alloc_exported(&w->be, bytes, x->window_handle);
        if (!w->window[w->rank])
            return sd_err_prefix("exchange window of %zu bytes", bytes);
        atomic_store_explicit(&x->window_generation, w->generation, memory_order_release);
        xchg_ring(w);
    }
    if (w->gpu_grads) {
        w->grad_shard = calloc((size_t)h->num_chunks, sizeof *w->grad_shard);
        if (!w->grad_shard)
            return sd_err("out of memory");
        for (int c = 0; c < h->num_chunks; c++) {
            int64_t n = layout_shard_numel(ctl_chunks(h)[c].numel, w->G, w->rank);
            w->grad_shard[c] = w->be.ops->alloc(&w->be, (size_t)(n > 0 ? n : 1) * sizeof(float));
            if (!w->grad_shard[c])
                return sd_err_prefix("gradient shard sums");
        }
    }
    return 0;
}

static int worker_setup(struct worker *w, const struct worker_args *args)
{
    if (job_shm_attach(&w->shm, args->job_name, JOB_MAP_CTL | JOB_MAP_PARAMS_RO | JOB_MAP_GRADS, false) != 0)
        return -1;
    struct ctl_header *h = w->ctl = w->shm.ctl;
    if (args->rank < 0 || args->rank >= h->gpus)
        return sd_err("rank %d out of range (job has %d)", args->rank, h->gpus);
    w->rank = args->rank;
    w->G = h->gpus;
    w->A = h->job.grad_accum;
    w->mb = h->job.micro_batch;
    w->T = h->job.seq_len;
    w->slot = ctl_proc(h, PROC_WORKER, w->rank);
    w->generation = atomic_load(&w->slot->generation);
    fault_init("worker", atomic_load(&w->slot->restarts), args->rank);
    atomic_store(&w->slot->pid, (int32_t)getpid());
    set_phase(w, PHASE_STARTING);

    int rc;
#ifdef SD_HAVE_CUDA
    if (h->job.device == DEVICE_CUDA)
        /* gpu_mem bounds the process: the context takes its part before our allocations */
        rc = backend_cuda_init(&w->be, args->device_index,
                               h->job.gpu_mem > 0 ? (size_t)(h->job.gpu_mem - h->plan.gpu_context_bytes) : 0);
    else
#endif
        rc = h->job.device == DEVICE_CPU ? backend_cpu_init(&w->be) : sd_err("this build has no CUDA backend");
    if (rc != 0)
        return -1;
    w->be.deterministic = h->job.deterministic;
    snprintf(w->slot->device_name, sizeof w->slot->device_name, "%s", w->be.device_name);
    w->slot->peak_flops = w->be.peak_flops;
    if (w->be.ops->register_host(&w->be, w->shm.params16, (size_t)h->params16_bytes, true) != 0 ||
        w->be.ops->register_host(&w->be, w->shm.grads, (size_t)h->grads_bytes, false) != 0)
        return -1;

    if (data_open(h->job.data_train, w->T, 0, h->job.shuffle, h->job.seed, &w->train) != 0)
        return -1;
    w->have_val = h->job.data_val[0] != 0;
    if (w->have_val && data_open(h->job.data_val, w->T, 0, false, h->job.seed, &w->val) != 0)
        return -1;

    w->num_grad_bufs = h->num_chunks + 2; /* resident per-chunk buffers, or two alternating ones */
    w->grad_bufs = calloc((size_t)w->num_grad_bufs, sizeof *w->grad_bufs);
    w->cache_size = h->plan.chunk_buffers;
    w->cache = calloc((size_t)w->cache_size, sizeof *w->cache);
    if (!w->cache || !w->grad_bufs)
        return sd_err("out of memory");
    size_t wbytes = (size_t)h->max_chunk_numel * be_dtype_size(w->be.weight_dtype);
    for (int i = 0; i < w->cache_size; i++) {
        w->cache[i].chunk = -1;
        w->cache[i].dev = w->be.ops->alloc(&w->be, wbytes);
        if (!w->cache[i].dev)
            return sd_err_prefix("chunk buffer %d of %zu bytes", i, wbytes);
    }
    if (model_init(&w->model, &w->be, &h->model, ctl_tensors(h), h->num_tensors, ctl_chunks(h), h->num_chunks, w->mb,
                   w->T, h->plan.keep_acts, h->plan.logits_rows) != 0)
        return -1;
    if (h->plan.accumulate_on_device && model_keep_grads_resident(&w->model) != 0)
        return -1;
    if (h->exchange && exchange_setup(w) != 0)
        return -1;
    size_t n = (size_t)w->mb * w->T;
    w->tokens = malloc(n * sizeof(int32_t));
    w->targets = malloc(n * sizeof(int32_t));
    w->correct = malloc(n * sizeof(int32_t));
    w->row_scale = malloc(n * sizeof(float));
    w->loss_rows = malloc(n * sizeof(float));
    w->mask = malloc(n);
    w->seq_buf = malloc(((size_t)w->T + 1) * sizeof(int32_t));
    w->seq_index = malloc((size_t)w->mb * sizeof(int64_t));
    pthread_mutex_init(&w->post_mu, NULL);
    pthread_cond_init(&w->post_more, NULL);
    pthread_cond_init(&w->post_space, NULL);
    pthread_cond_init(&w->post_idle, NULL);
    if (pthread_create(&w->poster, NULL, poster_main, w) != 0)
        return sd_err("cannot start the poster thread");
    if (!w->tokens || !w->targets || !w->correct || !w->row_scale || !w->loss_rows || !w->mask || !w->seq_buf ||
        !w->seq_index)
        return sd_err("out of memory");
    return 0;
}

int worker_run(const struct worker_args *args)
{
    struct worker *w = calloc(1, sizeof *w);
    if (!w) {
        sd_err("out of memory");
        return 2;
    }
    if (worker_setup(w, args) != 0)
        return 2;
    struct ctl_header *h = w->ctl;
    /* A restarted worker resumes at the first uncommitted step; what it already posted there is
     * recognised and not posted twice. */
    uint32_t committed = ctl_committed_step(h);
    w->recovering = atomic_load(&w->slot->restarts) > 0;
    /* The last committed step has all our gradients, but we may have died before marking it done
     * (its loss is saved: it was saved before the last gradient went out). */
    struct step_record *last = ctl_step(h, committed);
    if (committed >= 1 && atomic_load(&last->rank_done[w->rank]) != committed)
        finish_rank(w, committed);
    /* Exchanging workers start where the launcher put the exchange: past a step whose gradients
     * are all out (its loss is saved too), which then only needs marking done. */
    uint32_t start = committed + 1;
    if (h->exchange && atomic_load(&h->xchg_first_step) > start) {
        start = atomic_load(&h->xchg_first_step);
        if (atomic_load(&ctl_step(h, start - 1)->rank_done[w->rank]) != start - 1)
            finish_rank(w, start - 1);
    }
    atomic_fetch_add(&h->workers_ready, 1);
    uint32_t evaluated = start - 1;
    if (evaluated >= 1 && !val_done(w, evaluated) && eval_step(w, evaluated) != 0)
        return 1;
    for (uint32_t s = start; s <= (uint32_t)h->job.steps; s++) {
        if (!may_start_step(w, s))
            break;
        /* Never run more than half the step records ahead of the launcher's logging. */
        for (;;) {
            uint32_t logged = atomic_load_explicit(&h->metrics_step, memory_order_acquire);
            if (s <= logged + CTL_STEP_RECORDS / 2)
                break;
            futex_wait(&h->metrics_step, logged, WAIT_SLICE_MS);
            bail_if_stopped(w);
        }
        fault_step(s, w->rank);
        /* done already: marked, or logged (its record then recycled); exchanging ranks redo their
         * first step together all the same (their peers need them in the exchange) */
        bool done = atomic_load_explicit(&ctl_step(h, s)->rank_done[w->rank], memory_order_acquire) == s ||
                    step_logged(w, s);
        if ((!done || (h->exchange && w->recovering)) && train_step(w, s) != 0)
            return 1;
        w->recovering = false;
        if (!val_done(w, s) && eval_step(w, s) != 0)
            return 1;
    }
    post_drain(w);
    set_phase(w, PHASE_DONE);
    return 0;
}
