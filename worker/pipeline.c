/* The worker process's step loop and its streaming model_io (see pipeline.h). One chunk cache of
 * device buffers holds (chunk, version) pairs, so when the plan gives enough buffers the weights
 * stay resident across micro-steps and each step streams every chunk once. With G > 1 the routes
 * of docs/design.md §7 apply: parameters replicated (every rank copies each chunk from the host) or
 * sharded (each rank copies its 1/G into its exchange window and gathers the rest from its peers'
 * windows), gradients reduced on the CPU (every rank sends each chunk) or on the GPUs (each rank
 * sums its 1/G of every rank's gradient, in rank order, over the step, and sends that). This file
 * holds the step loop, the top of the pipeline's files: it calls the chunk cache (pipeline_cache.c)
 * and the gradient poster (pipeline_poster.c), which both call the exchange (pipeline_exchange.c),
 * and all of them wait through pipeline_wait.c; none calls a file above it (docs/design.md §1.1).
 * Their shared state: pipeline_internal.h. */
#include "worker/pipeline_cache.h"
#include "worker/pipeline_exchange.h"
#include "worker/pipeline_poster.h"
#include "worker/pipeline_wait.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fault.h"
#include "shm/futex.h"

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
    /* the model calls this between the passes: every micro-step's backward shows as such in the
     * monitors, not only the last one's, whose gradients the poster sends */
    set_phase(w, PHASE_BACKWARD);
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

/* Loads micro-batch rows: sequence indices from the order contract; with document attention, their
 * document positions too, handed to the model. */
static int load_rows(struct worker *w, struct data_set *d, const int64_t *seq_index, int rows)
{
    int T = w->T;
    for (int i = 0; i < rows; i++) {
        if (data_sequence_positions(d, seq_index[i], w->seq_buf, w->mask + (size_t)i * T, w->positions + (size_t)i * T) !=
            0)
            return -1;
        memcpy(w->tokens + (size_t)i * T, w->seq_buf, sizeof(int32_t) * (size_t)T);
        memcpy(w->targets + (size_t)i * T, w->seq_buf + 1, sizeof(int32_t) * (size_t)T);
    }
    model_set_positions(&w->model, w->documents ? w->positions : NULL);
    return 0;
}

/* Unmasked targets and documents over the whole global batch of a step (every rank computes the
 * same). */
static int count_step_batch(struct worker *w, int64_t step, int64_t *count, int64_t *documents)
{
    if (!w->train.has_flags) {
        *count = job_tokens_per_step(&w->ctl->job);
        *documents = job_sequences_per_step(&w->ctl->job);
        return 0;
    }
    int64_t n = 0, docs = 0;
    for (int a = 0; a < w->A; a++)
        for (int r = 0; r < w->G; r++)
            for (int i = 0; i < w->mb; i++) {
                int64_t k = data_seq_index(step, a, r, i, w->A, w->G, w->mb);
                if (data_sequence_positions(&w->train, k, w->seq_buf, w->mask, w->positions) != 0)
                    return -1;
                for (int t = 0; t < w->T; t++) {
                    n += w->mask[t];
                    docs += w->positions[t] == 0;
                }
            }
    *count = n;
    *documents = docs;
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
    int64_t ntargets, ndocs;
    if (count_step_batch(w, s, &ntargets, &ndocs) != 0)
        return -1;
    if (ntargets == 0)
        return sd_err("step %u has no unmasked targets in its global batch", s);
    struct step_record *rec = ctl_step(h, s);
    SD_ASSERT(atomic_load(&rec->step) == s || step_logged(w, s));
    if (w->rank == ctl_local_first(h)) {
        rec->tokens = ntargets; /* a late write to a recycled record: this rank sets it again for that step */
        rec->documents = ndocs;
    }
    struct model_io io = worker_io;
    io.ctx = w;
    w->need_version = s - 1;
    w->step = s;
    uint64_t posted_key = atomic_load_explicit(&rec->posted[w->rank], memory_order_acquire);
    uint32_t posted = posted_key >> 32 == s ? (uint32_t)posted_key : 0, first = posted;
    /* Micro-steps summing on the device post once, at the last one, as micro-batch r (GPU-side
     * gradients too, each rank its shard); a restart then has nothing posted to build on and redoes
     * the step from its first micro-step. */
    bool one_post = plan_one_post_per_rank(&h->plan, w->G);
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

/* Whether step s needs no validation from this rank (any more): not a validation step, or its sums
 * are written, or the step is logged. */
static bool val_done(struct worker *w, uint32_t s)
{
    return !job_is_val_step(&w->ctl->job, s) ||
           atomic_load_explicit(&ctl_step(w->ctl, s)->val_done[w->rank], memory_order_acquire) == s ||
           step_logged(w, s);
}

/* Whether some rank still owes step s's validation. */
static bool val_pending(struct worker *w, uint32_t s)
{
    if (!job_is_val_step(&w->ctl->job, s) || step_logged(w, s))
        return false;
    for (int r = 0; r < w->G; r++)
        if (atomic_load_explicit(&ctl_step(w->ctl, s)->val_done[r], memory_order_acquire) != s)
            return true;
    return false;
}

/* Takes version v's parameter keys of the exchange (every chunk, in the forward's order) without
 * evaluating: a restarted peer redoing the validation at v gathers them, and after the last step no
 * training step of ours would. */
static void gather_version(struct worker *w, uint32_t v)
{
    w->need_version = v;
    for (int c = 0; c < w->ctl->num_chunks; c++) {
        io_weights(w, c, -1);
        io_release(w, c);
    }
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
#ifdef SD_HAVE_CUDA
    if (h->job.device == DEVICE_CUDA && h->plan.attn_tile_bytes > 0) /* the plan's bound: a restart tiles alike */
        backend_cuda_set_attention_tile_limit(&w->be, (size_t)h->plan.attn_tile_bytes);
#endif
    snprintf(w->slot->device_name, sizeof w->slot->device_name, "%s", w->be.device_name);
    w->slot->peak_flops = w->be.peak_flops;
    /* the weights the workers stream (mapped read-only): params16, or the master alone */
    bool master = plan_streams_master(&h->plan);
    if (w->be.ops->register_host(&w->be, master ? (void *)w->shm.master : (void *)w->shm.params16,
                                 master ? (size_t)h->total_numel * sizeof(float) : (size_t)h->params16_bytes,
                                 true) != 0 ||
        w->be.ops->register_host(&w->be, w->shm.grads, (size_t)h->grads_bytes, false) != 0)
        return -1;

    if (data_open(h->job.data_train, w->T, 0, h->job.shuffle, h->job.seed, &w->train) != 0)
        return -1;
    w->have_val = h->job.data_val[0] != 0;
    if (w->have_val && data_open(h->job.data_val, w->T, 0, false, h->job.seed, &w->val) != 0)
        return -1;

    w->num_grad_bufs = h->num_chunks + 2; /* resident per-chunk buffers, or two alternating ones */
    w->grad_bufs = calloc((size_t)w->num_grad_bufs, sizeof *w->grad_bufs);
    w->cache.size = h->plan.chunk_buffers;
    w->cache.entries = calloc((size_t)w->cache.size, sizeof *w->cache.entries);
    w->cache_dev = calloc((size_t)w->cache.size, sizeof *w->cache_dev);
    if (!w->cache.entries || !w->cache_dev || !w->grad_bufs)
        return sd_err("out of memory");
    chunk_cache_clear(&w->cache);
    size_t wbytes = (size_t)h->max_chunk_numel * be_dtype_size(w->be.weight_dtype);
    for (int i = 0; i < w->cache.size; i++) {
        w->cache_dev[i] = w->be.ops->alloc(&w->be, wbytes);
        if (!w->cache_dev[i])
            return sd_err_prefix("chunk buffer %d of %zu bytes", i, wbytes);
    }
    if (model_init(&w->model, &w->be, &h->model, ctl_tensors(h), h->num_tensors, ctl_chunks(h), h->num_chunks, w->mb,
                   w->T, h->plan.keep_acts, h->plan.logits_rows, h->plan.offload_inputs) != 0)
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
    w->documents = h->job.attention == ATTENTION_DOCUMENT; /* resolved by the launcher */
    w->positions = malloc(n * sizeof(int32_t));
    pthread_mutex_init(&w->post_mu, NULL);
    pthread_cond_init(&w->post_more, NULL);
    pthread_cond_init(&w->post_space, NULL);
    pthread_cond_init(&w->post_idle, NULL);
    if (pthread_create(&w->poster, NULL, poster_main, w) != 0)
        return sd_err("cannot start the poster thread");
    if (!w->tokens || !w->targets || !w->correct || !w->row_scale || !w->loss_rows || !w->mask || !w->seq_buf ||
        !w->seq_index || !w->positions)
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
    if (evaluated >= 1 && !val_done(w, evaluated)) {
        if (eval_step(w, evaluated) != 0)
            return 1;
    } else if (evaluated >= 1 && w->sharded_params && val_pending(w, evaluated)) {
        /* The exchange restarts at version `evaluated` for every rank (ctl_xchg_reset): a peer whose
         * validation was cut short gathers its chunks, and cannot finish it before we staged our
         * first shard, so all ranks agree here on whether it is pending. */
        gather_version(w, evaluated);
    }
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
