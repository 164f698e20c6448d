/* ctl region sizing, shm object naming, and attaching to a job's objects (see ctl.h). */
#include "ctl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "shm/futex.h"
#include "shm/region.h"

static bool add_ok(uint64_t *acc, uint64_t x)
{
    return !__builtin_add_overflow(*acc, x, acc);
}

static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

static uint64_t align64(uint64_t x)
{
    return (x + 63) & ~(uint64_t)63;
}

/* Appends an array of n elements of size sz at the (64-byte aligned) cursor. */
static bool place(uint64_t *cursor, uint64_t *off, uint64_t n, uint64_t sz)
{
    uint64_t bytes;
    *cursor = align64(*cursor);
    *off = *cursor;
    return mul_ok(n, sz, &bytes) && add_ok(cursor, bytes);
}

void ctl_shape_of(const struct job_config *job, const struct plan *plan, const struct layout *lay,
                  struct ctl_shape *out)
{
    bool exchange = plan_uses_exchange(plan, job->gpus);
    struct window_layout win;
    ctl_window_layout(lay->max_chunk_numel, job->gpus, 4, plan->grad_route == GRADS_GPU,
                      plan->param_route == PARAMS_SHARDED, &win);
    *out = (struct ctl_shape){
        .gpus = job->gpus,
        .grad_accum = job->grad_accum,
        .optim_procs = plan->optim_procs,
        .optim_threads = plan->optim_threads,
        .grad_slots = plan->grad_slots,
        .num_tensors = lay->num_tensors,
        .num_chunks = lay->num_chunks,
        .total_numel = lay->total_numel,
        .max_chunk_numel = lay->max_chunk_numel,
        .params16_copies = plan_params16_copies(plan),
        .grads_direct = plan_grads_direct(plan, job->gpus, job->grad_accum),
        .grads_bf16 = plan_grads_bf16(plan, job),
        .optimizer_state = job->optimizer_state,
        /* the CPU backend's exchange windows (fp32 weights) live in the grads object */
        .window_shm_bytes = exchange && job->device == DEVICE_CPU ? win.total : 0,
    };
}

int ctl_compute_sizes(const struct ctl_shape *shape, struct ctl_sizes *out)
{
    memset(out, 0, sizeof *out);
    int gpus = shape->gpus, optim_procs = shape->optim_procs, optim_threads = shape->optim_threads,
        grad_slots = shape->grad_slots;
    uint64_t total_numel = (uint64_t)shape->total_numel;
    if (gpus < 1 || shape->grad_accum < 1 || optim_procs < 1 || optim_procs > CTL_MAX_OPTIM || optim_threads < 1 ||
        optim_threads > CTL_MAX_OPTIM_THREADS || grad_slots < 1 || grad_slots >= RING_CAP)
        return sd_err("bad job shape: gpus=%d optim_procs=%d grad_slots=%d", gpus, optim_procs, grad_slots);
    uint64_t c = sizeof(struct ctl_header);
    bool ok = place(&c, &out->off_tensors, (uint64_t)shape->num_tensors, sizeof(struct tensor_desc)) &&
              place(&c, &out->off_chunks, (uint64_t)shape->num_chunks, sizeof(struct chunk_desc)) &&
              place(&c, &out->off_chunk_state, (uint64_t)shape->num_chunks, sizeof(struct chunk_state)) &&
              place(&c, &out->off_rings, (uint64_t)gpus * (uint64_t)optim_procs, sizeof(struct ring)) &&
              place(&c, &out->off_slots, (uint64_t)gpus * (uint64_t)grad_slots, sizeof(struct slot_state)) &&
              place(&c, &out->off_doorbells, (uint64_t)optim_procs, sizeof(struct doorbell)) &&
              place(&c, &out->off_procs, (uint64_t)(gpus + optim_procs), sizeof(struct proc_slot)) &&
              place(&c, &out->off_steps, CTL_STEP_RECORDS, sizeof(struct step_record)) &&
              place(&c, &out->off_journals, (uint64_t)optim_procs * (uint64_t)optim_threads, sizeof(struct journal)) &&
              place(&c, &out->off_xchg, (uint64_t)gpus, sizeof(struct xchg_rank)) &&
              place(&c, &out->off_losses, (uint64_t)CTL_STEP_RECORDS * (uint64_t)gpus * (uint64_t)shape->grad_accum,
                    sizeof(struct loss_progress));
    out->ctl_bytes = (c + 4095) & ~(uint64_t)4095;
    uint64_t grads_elems;
    uint64_t state_size = ctl_state_size(shape->optimizer_state);
    uint64_t staging = (uint64_t)optim_procs * (uint64_t)optim_threads * ctl_staging_lane_bytes(shape->optimizer_state);
    /* master (fp32), m and v (and their scales), and the fp32 accumulator unless it heads the grads region */
    uint64_t master_per_param = 4 + 2 * state_size + (shape->grads_direct ? 0 : 4);
    uint64_t scales = 2 * ctl_state_scales(shape->optimizer_state, total_numel);
    ok = ok && mul_ok(total_numel, 2 * (uint64_t)shape->params16_copies, &out->params16_bytes) &&
         mul_ok(total_numel, master_per_param, &out->master_bytes) && add_ok(&out->master_bytes, staging) &&
         add_ok(&out->master_bytes, scales) &&
         (shape->grads_direct
              ? (grads_elems = total_numel, true)
              : mul_ok((uint64_t)gpus * (uint64_t)grad_slots, (uint64_t)shape->max_chunk_numel, &grads_elems)) &&
         mul_ok(grads_elems, shape->grads_direct && shape->grads_bf16 ? 2 : 4, &out->grads_bytes);
    uint64_t windows;
    ok = ok && mul_ok((uint64_t)gpus, shape->window_shm_bytes, &windows) && add_ok(&out->grads_bytes, windows);
    if (!ok)
        return sd_err("job state size overflows");
    return 0;
}

static uint64_t param_shard_capacity(int64_t max_chunk_numel, int gpus)
{
    int64_t most = 0;
    for (int r = 0; r < gpus; r++) {
        int64_t n = layout_shard_numel(max_chunk_numel, gpus, r);
        most = n > most ? n : most;
    }
    return ((uint64_t)most + 63) & ~(uint64_t)63;
}

void ctl_window_layout(int64_t max_chunk_numel, int gpus, int weight_size, bool grad_slots, bool param_slots,
                       struct window_layout *out)
{
    out->grad_slot_bytes = grad_slots ? (uint64_t)max_chunk_numel * 4 : 0;
    out->param_base = XCHG_SLOTS * out->grad_slot_bytes;
    out->param_slot_bytes = param_slots ? param_shard_capacity(max_chunk_numel, gpus) * (uint64_t)weight_size : 0;
    out->total = out->param_base + XCHG_SLOTS * out->param_slot_bytes;
}

bool ctl_grad_out(struct ctl_header *h, int r, int c, uint32_t s, uint32_t m)
{
    struct chunk_state *cs = ctl_chunk_state(h, c);
    struct ring *ring = ctl_ring(h, r, cs->owner);
    uint32_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
    for (uint32_t i = atomic_load_explicit(&ring->tail, memory_order_acquire); i != head; i++) {
        const struct chunk_desc_msg *d = &ring->elems[i & (RING_CAP - 1)];
        if (d->chunk == (uint32_t)c && d->step == s && d->micro == m)
            return true;
    }
    return chunk_grad_consumed(cs, s, m);
}

/* Every gradient of step s from every rank has reached the optimizers (or their rings). */
static bool step_grads_out(struct ctl_header *h, uint32_t s)
{
    bool one_post = plan_one_post_per_rank(&h->plan, h->gpus);
    int per_rank = one_post ? 1 : h->job.grad_accum;
    for (int c = 0; c < h->num_chunks; c++)
        for (int r = 0; r < h->gpus; r++)
            for (int a = 0; a < per_rank; a++)
                if (!ctl_grad_out(h, r, c, s, one_post ? (uint32_t)r : (uint32_t)(a * h->gpus + r)))
                    return false;
    return true;
}

void ctl_xchg_reset(struct ctl_header *h, uint32_t committed)
{
    uint32_t first = committed + 1;
    if (first <= (uint32_t)h->job.steps && step_grads_out(h, first))
        first++;
    atomic_store(&h->xchg_first_step, first);
    for (int r = 0; r < h->gpus; r++) {
        struct xchg_rank *x = ctl_xchg(h, r);
        uint64_t p = xchg_param_key(h, first - 1, 0), g = xchg_grad_key(h, first, 0, h->num_chunks - 1);
        atomic_store(&x->param_staged, p);
        atomic_store(&x->param_gathered, p);
        atomic_store(&x->grad_published, g);
        atomic_store(&x->grad_reduced, g);
        atomic_store(&x->window_generation, 0);
        atomic_fetch_add(&x->bell, 1);
    }
}

void ctl_repair_slots(struct ctl_header *h, int rank)
{
    for (int i = 0; i < h->grad_slots; i++) {
        struct slot_state *ss = ctl_slot(h, rank, i);
        uint32_t w = atomic_load_explicit(&ss->state, memory_order_acquire);
        if (SLOT_STATE(w) == SLOT_FREE)
            continue;
        bool referenced = false;
        for (int k = 0; k < h->optim_procs && !referenced && SLOT_STATE(w) == SLOT_POSTED; k++) {
            struct ring *r = ctl_ring(h, rank, k);
            uint32_t head = atomic_load_explicit(&r->head, memory_order_acquire);
            for (uint32_t j = atomic_load_explicit(&r->tail, memory_order_acquire); j != head && !referenced; j++) {
                const struct chunk_desc_msg *d = &r->elems[j & (RING_CAP - 1)];
                referenced = d->slot == i && d->seq == SLOT_SEQ(w);
            }
        }
        /* The optimizer frees a consumed slot before popping its descriptor, so a posted slot
         * with no descriptor was never pushed. CAS: the optimizer may free it concurrently. */
        if (!referenced && atomic_compare_exchange_strong(&ss->state, &w, SLOT_WORD(SLOT_SEQ(w), SLOT_FREE)))
            futex_wake_all(&ss->state);
    }
}

bool ctl_finish_rank(struct ctl_header *h, uint32_t s, int r)
{
    struct loss_progress *lp = ctl_loss_progress(h, s, r, (uint32_t)h->job.grad_accum);
    if (atomic_load_explicit(&lp->key, memory_order_acquire) != micro_key(s, (uint32_t)h->job.grad_accum))
        return false;
    struct step_record *rec = ctl_step(h, s);
    rec->loss_sum[r] = lp->sum;
    /* release: the loss sum above is visible to the launcher once it sees the mark */
    atomic_store_explicit(&rec->rank_done[r], s, memory_order_release);
    return true;
}

void ctl_recycle_step(struct ctl_header *h, uint32_t s)
{
    struct step_record *rec = ctl_step(h, s);
    memset((char *)rec + sizeof rec->step, 0, sizeof *rec - sizeof rec->step);
    atomic_store_explicit(&rec->step, s + CTL_STEP_RECORDS, memory_order_release);
}

/* tests/test_hosts.sh reads a stopped launcher's pid from its ctl object at this byte */
_Static_assert(offsetof(struct ctl_header, launcher_pid) == 88, "ctl_header.launcher_pid moved");

void ctl_region_name(const char *job_name, const char *what, char *out, size_t len)
{
    snprintf(out, len, "/slidedp.%s.%s", job_name, what);
}

void ctl_lock_name(const char *job_name, char *out, size_t len)
{
    snprintf(out, len, "/slidedp-%s.lock", job_name);
}

void ctl_job_name(const char *log_dir, char *out, size_t len)
{
    ctl_host_job_name(log_dir, 1, 0, out, len);
}

void ctl_host_job_name(const char *log_dir, int hosts, int host_index, char *out, size_t len)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 */
    for (const unsigned char *p = (const unsigned char *)log_dir; *p; p++)
        h = (h ^ *p) * 0x100000001b3ull;
    if (hosts > 1)
        snprintf(out, len, "%012llx-h%d", (unsigned long long)(h & 0xffffffffffffull), host_index);
    else
        snprintf(out, len, "%012llx", (unsigned long long)(h & 0xffffffffffffull));
}

int ctl_validate(const struct ctl_header *h, uint64_t ctl_bytes, const char *name)
{
    if (ctl_bytes < sizeof *h || h->magic != CTL_MAGIC || h->version != CTL_VERSION || h->header_size != sizeof *h)
        return sd_err("%s is not a slidedp ctl region of version %d", name, CTL_VERSION);
    /* the shape the header's job and plan give its layout: the launcher wrote it from that one */
    struct layout lay = {.num_tensors = h->num_tensors,
                         .num_chunks = h->num_chunks,
                         .total_numel = h->total_numel,
                         .max_chunk_numel = h->max_chunk_numel};
    struct ctl_shape shape;
    ctl_shape_of(&h->job, &h->plan, &lay, &shape);
    struct ctl_sizes sz;
    bool ok = h->gpus >= 1 && h->gpus <= JOB_MAX_GPUS && h->gpus == h->job.gpus && h->num_chunks >= 1 &&
              h->num_tensors >= h->num_chunks && h->total_numel >= h->max_chunk_numel && h->max_chunk_numel >= 1 &&
              (h->plan.weights_source == WEIGHTS_BF16_COPY ||
               (h->plan.weights_source == WEIGHTS_MASTER && h->plan.update_mode == UPDATE_AFTER_BACKWARD)) &&
              h->optim_procs == h->plan.optim_procs && h->ckpt_every == (uint32_t)h->job.ckpt_every &&
              h->grad_slots == shape.grad_slots && h->keep_prev == (shape.params16_copies == 2) &&
              h->grads_direct == shape.grads_direct && h->grads_bf16 == shape.grads_bf16 &&
              h->window_shm_bytes == shape.window_shm_bytes && ctl_compute_sizes(&shape, &sz) == 0;
    ok = ok && h->off_tensors == sz.off_tensors && h->off_chunks == sz.off_chunks &&
         h->off_chunk_state == sz.off_chunk_state && h->off_rings == sz.off_rings && h->off_slots == sz.off_slots &&
         h->off_doorbells == sz.off_doorbells && h->off_procs == sz.off_procs && h->off_steps == sz.off_steps &&
         h->off_journals == sz.off_journals && h->off_xchg == sz.off_xchg && h->off_losses == sz.off_losses &&
         h->size == sz.ctl_bytes && h->size <= ctl_bytes && h->params16_bytes == sz.params16_bytes &&
         h->master_bytes == sz.master_bytes && h->grads_bytes == sz.grads_bytes;
    if (!ok)
        return sd_err("%s has a corrupt header: its table offsets or sizes do not match its job shape or its size "
                      "of %llu bytes; refusing to use it",
                      name, (unsigned long long)ctl_bytes);
    return 0;
}

/* Attaches the job's object `what` (index i of regs), which must be `bytes` long. */
static int attach_sized(struct shm_region *regs, int i, const char *job_name, const char *what, bool writable,
                        uint64_t bytes)
{
    char name[REGION_NAME_MAX];
    ctl_region_name(job_name, what, name, sizeof name);
    if (shm_region_attach(&regs[i], name, writable) != 0)
        return -1;
    if (regs[i].size != bytes)
        return sd_err("shared memory %s is %zu bytes, its header says %llu; refusing to use it", name, regs[i].size,
                      (unsigned long long)bytes);
    return 0;
}

int job_shm_attach(struct job_shm *s, const char *job_name, int what, bool ctl_read_only)
{
    memset(s, 0, sizeof *s);
    struct shm_region *regs = calloc(4, sizeof *regs);
    if (!regs)
        return sd_err("out of memory");
    for (int i = 0; i < 4; i++)
        s->regions[i] = &regs[i];
    char name[REGION_NAME_MAX];
    ctl_region_name(job_name, "ctl", name, sizeof name);
    if (shm_region_attach(&regs[0], name, !ctl_read_only) != 0)
        goto fail;
    s->ctl = regs[0].base;
    if (ctl_validate(s->ctl, regs[0].size, name) != 0)
        goto fail;
    bool copy = !plan_streams_master(&s->ctl->plan);
    if ((what & JOB_MAP_PARAMS_RO) && !copy && !(what & JOB_MAP_MASTER)) {
        /* the weights workers read are the master at the head of its object: only those are mapped */
        ctl_region_name(job_name, "master", name, sizeof name);
        size_t weights = (size_t)s->ctl->total_numel * sizeof(float);
        if (shm_region_attach_head(&regs[2], name, s->ctl->master_bytes, weights) != 0)
            goto fail;
        s->master = regs[2].base;
    } else if (copy && (what & (JOB_MAP_PARAMS_RO | JOB_MAP_PARAMS_RW))) {
        if (attach_sized(regs, 1, job_name, "params16", (what & JOB_MAP_PARAMS_RW) != 0, s->ctl->params16_bytes) != 0)
            goto fail;
        s->params16 = regs[1].base;
    }
    if (what & JOB_MAP_MASTER) {
        if (attach_sized(regs, 2, job_name, "master", true, s->ctl->master_bytes) != 0)
            goto fail;
        job_shm_master_views(s, regs[2].base, s->ctl->total_numel, s->ctl->grads_direct, s->ctl->job.optimizer_state);
    }
    if (what & JOB_MAP_GRADS) {
        if (attach_sized(regs, 3, job_name, "grads", true, s->ctl->grads_bytes) != 0)
            goto fail;
        s->grads = regs[3].base;
        if (s->ctl->grads_bf16)
            s->grad_acc16 = (uint16_t *)s->grads;
        else if (s->ctl->grads_direct)
            s->grad_acc = s->grads;
    }
    return 0;
fail:
    job_shm_detach(s);
    return -1;
}

void job_shm_master_views(struct job_shm *s, void *base, int64_t total_numel, bool grads_direct,
                          enum optimizer_state state)
{
    size_t n = (size_t)total_numel;
    s->master = base;
    char *next = (char *)(s->master + n);
    if (state == OPTIM_STATE_8BIT) {
        s->exp_avg8 = (uint8_t *)next;
        s->exp_avg_sq8 = s->exp_avg8 + n;
        s->exp_avg_scale = s->exp_avg_sq8 + n;
        s->exp_avg_sq_scale = s->exp_avg_scale + ctl_state_scales(state, n);
        next = (char *)(s->exp_avg_sq_scale + ctl_state_scales(state, n));
    } else if (state == OPTIM_STATE_BF16) {
        s->exp_avg16 = (uint16_t *)next;
        s->exp_avg_sq16 = s->exp_avg16 + n;
        next = (char *)(s->exp_avg_sq16 + n);
    } else {
        s->exp_avg = (float *)next;
        s->exp_avg_sq = s->exp_avg + n;
        next = (char *)(s->exp_avg_sq + n);
    }
    if (!grads_direct) {
        s->grad_acc = (float *)next;
        next += n * sizeof(float);
    }
    s->staging = next;
}

void job_shm_detach(struct job_shm *s)
{
    if (s->regions[0]) {
        struct shm_region *regs = s->regions[0];
        for (int i = 0; i < 4; i++)
            shm_region_detach(&regs[i]);
        free(regs);
    }
    memset(s, 0, sizeof *s);
}
