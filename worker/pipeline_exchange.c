/* The exchange between workers (see pipeline_exchange.h, shm/ctl.h struct xchg_rank): each rank's
 * window, sharded parameters gathered from the windows, GPU-side gradients reduced in them. What
 * goes into the windows from the host and what leaves for the optimizers is the callers' part. */
#include "worker/pipeline_exchange.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "common/fault.h"
#include "shm/futex.h"
#include "worker/pipeline_wait.h"

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

static uint64_t param_offset(const struct worker *w, uint64_t key)
{
    return w->win.param_base + (key % XCHG_SLOTS) * w->win.param_slot_bytes;
}

void *xchg_param_slot(struct worker *w, uint64_t key)
{
    if (key >= XCHG_SLOTS) /* our slot's previous shard has been read by everyone */
        xchg_wait_all(w, offsetof(struct xchg_rank, param_gathered), key - XCHG_SLOTS + 1);
    return window_of(w, w->rank) + param_offset(w, key);
}

void xchg_param_gather(struct worker *w, void *dst, int c, uint64_t key)
{
    const struct chunk_desc *ch = &ctl_chunks(w->ctl)[c];
    size_t ws = weight_size(w);
    uint64_t off = param_offset(w, key);
    xchg_publish(w, &xchg_of(w, w->rank)->param_staged, key + 1);
    fault_point("worker_param_staged");

    xchg_wait_all(w, offsetof(struct xchg_rank, param_staged), key + 1);
    for (int r = 0; r < w->G; r++) {
        size_t lo = (size_t)layout_shard_begin(ch->numel, w->G, r), n = (size_t)layout_shard_numel(ch->numel, w->G, r);
        w->be.ops->copy_device(&w->be, (char *)dst + lo * ws, window_of(w, r) + off, n * ws);
        if (r != w->rank)
            atomic_fetch_add_explicit(&w->slot->bytes_peer, (uint64_t)(n * ws), memory_order_relaxed);
    }
    w->be.ops->synchronize(&w->be);
    xchg_publish(w, &xchg_of(w, w->rank)->param_gathered, key + 1);
}

static uint64_t grad_offset(const struct worker *w, uint64_t key)
{
    return (key % XCHG_SLOTS) * w->win.grad_slot_bytes;
}

uint64_t xchg_grad_publish(struct worker *w, int c, float *grad)
{
    const struct chunk_desc *ch = &ctl_chunks(w->ctl)[c];
    uint64_t key = xchg_grad_key(w->ctl, w->step, w->micro_index, c);
    if (key >= XCHG_SLOTS) /* our slot's previous gradient has been read by everyone */
        xchg_wait_all(w, offsetof(struct xchg_rank, grad_reduced), key - XCHG_SLOTS + 1);
    w->be.ops->copy_device(&w->be, window_of(w, w->rank) + grad_offset(w, key), grad,
                           (size_t)ch->numel * sizeof(float));
    w->be.ops->synchronize(&w->be);
    xchg_publish(w, &xchg_of(w, w->rank)->grad_published, key + 1);
    fault_point("worker_grad_published");
    return key;
}

/* The sum runs in the order of the global micro-batches (a*G + r), as the CPU route's does. */
void xchg_grad_reduce(struct worker *w, int c, uint64_t key, float *sum)
{
    const struct chunk_desc *ch = &ctl_chunks(w->ctl)[c];
    uint64_t off = grad_offset(w, key);
    int64_t lo = layout_shard_begin(ch->numel, w->G, w->rank), n = layout_shard_numel(ch->numel, w->G, w->rank);
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
}

/* The window is a slice of the grads region on the CPU backend, else device memory published to the
 * peers through the ctl region. */
int exchange_setup(struct worker *w)
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
