/* The ctl region: everything the processes of a job share besides the tensors themselves. A
 * header (magic, version, generation, the job, model and plan by value, offsets of the tables),
 * the tensor and chunk tables, per-chunk state (published version, reduction progress, norm
 * contributions), the (worker, optimizer) rings, the host gradient slots' states, per-process
 * slots (pid, generation, heartbeat, phase, counters for monitors) and the step records the
 * launcher turns into metrics.jsonl. Offsets, never pointers. Sized by ctl_size(). */
#ifndef SD_CTL_H
#define SD_CTL_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/job.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "common/plan.h"
#include "common/topology.h"
#include "shm/ring.h"

#define CTL_MAGIC 0x31504445444c4953ull /* "SLIDEDP1" little-endian */
#define CTL_VERSION 12 /* 8: document attention (job attention fields, step documents, stats targets/documents); 9: run_id;
                          * 10: the topology's GPU memory; 11: optimizers' lane_wait_ns; 12: progress per
                          * segment, not per thread (chunk_state, journal) */
#define CTL_MAX_OPTIM 64
#define CTL_MAX_OPTIM_THREADS 32
#define CTL_MAX_SEGMENTS 1024 /* per operation on a chunk (optimizer/segments.h) */
#define CTL_STEP_RECORDS 64 /* workers never run more than half of this ahead of the launcher */

enum proc_kind { PROC_WORKER = 0, PROC_OPTIM = 1 };

/* How the launcher asks the processes to stop (ctl_header.stop). */
enum stop_level {
    STOP_NONE = 0,
    STOP_AT_BOUNDARY = 1, /* workers finish their current step, then exit */
    STOP_NOW = 2,         /* everyone exits at once (failure, second signal) */
    STOP_DRAIN = 3,       /* workers are gone: optimizers finish every complete step, then exit */
    STOP_WORKERS_NOW = 4, /* workers exit at once; optimizers keep going until told to drain */
};

enum proc_phase {
    PHASE_IDLE = 0,
    PHASE_STARTING,
    PHASE_WAIT_WEIGHTS,
    PHASE_FORWARD,
    PHASE_BACKWARD,
    PHASE_WAIT_SLOT,
    PHASE_EVAL,
    PHASE_WAIT_GRADS,
    PHASE_REDUCE,
    PHASE_WAIT_NORM,
    PHASE_UPDATE,
    PHASE_DONE,
    PHASE_WAIT_PEERS, /* a worker waits for other workers' shards (exchange routes) */
    PHASE_COUNT
};

/* A process's heartbeat_ns older than this is a stall: half the job's watchdog bound (the launcher
 * kills it at the whole), or a minute without a watchdog. Alive processes beat at every phase,
 * every chunk and every wait slice (100 ms). */
static inline uint64_t ctl_stall_ns(const struct job_config *job)
{
    return job->watchdog_s > 0 ? (uint64_t)job->watchdog_s * 500000000ull : 60000000000ull;
}

/* One per worker and optimizer process. Written by its owner (and by the launcher when it
 * (re)starts the process); read by anyone. */
struct proc_slot {
    alignas(64) _Atomic int32_t pid;
    _Atomic uint32_t generation;
    _Atomic uint64_t heartbeat_ns;
    _Atomic uint32_t phase;   /* enum proc_phase */
    _Atomic uint32_t step;
    _Atomic int32_t chunk;
    _Atomic uint32_t restarts;
    _Atomic uint64_t start_ticks; /* the process's start time (/proc/<pid>/stat), set by the launcher
                                   * at spawn: with --job, what identifies an orphan to kill */
    /* monotonically increasing counters for monitors */
    _Atomic uint64_t bytes_in;   /* weights fetched (workers), gradient bytes reduced (optimizers) */
    _Atomic uint64_t bytes_out;  /* gradients sent (workers); optimizers: 2 per parameter updated
                                  * (the bf16 copy's bytes, counted also when there is none) */
    _Atomic uint64_t busy_ns;
    _Atomic uint64_t wait_ns;
    _Atomic uint64_t update_ns;  /* optimizers: the part of busy_ns spent updating chunks */
    _Atomic uint64_t lane_wait_ns; /* optimizers: of busy_ns, the time the lanes of a reduction or an
                                    * update idled waiting for the slowest, averaged over the lanes */
    _Atomic uint64_t items;      /* micro-steps (workers), chunk updates (optimizers) */
    _Atomic uint64_t bytes_peer; /* bytes read from other workers' device memory (exchange routes) */
    /* set once at start-up by the process */
    char device_name[64];        /* e.g. "NVIDIA H200" or "cpu" */
    double peak_flops;           /* dense bf16 (GPU) or an estimate (CPU); 0 when unknown */
};

#define JOB_STATS_HISTORY 256
/* Job-level numbers for monitors, written only by the launcher under a seqlock (seq odd while
 * writing); readers copy and retry until they see the same even seq before and after. */
struct job_stats {
    alignas(64) _Atomic uint32_t seq;
    uint32_t step;            /* last logged step */
    double loss, lr, grad_norm, step_s, tok_s, mfu, val_loss, val_acc;
    double predicted_step_s;
    uint64_t tokens_total;
    int64_t targets, documents; /* of the last logged step's global batch (step_record) */
    uint64_t updated_ns;      /* clock_ns() of the last update */
    double loss_history[JOB_STATS_HISTORY]; /* loss of step k at [k % JOB_STATS_HISTORY] */
};

struct chunk_state {
    alignas(64) _Atomic uint32_t version; /* updates applied to this chunk of params16 (= its step) */
    _Atomic uint32_t reduced_step;        /* last step whose gradient is fully accumulated */
    int32_t owner;                        /* optimizer process index */
    int32_t host;                         /* the host whose optimizers sum and update it (several
                                           * hosts, sharded); the others take its sumsq, reduced_step,
                                           * params16 and version from the relay */
    _Atomic uint64_t next_micro;          /* (step << 32) | next micro-batch of that step to add */
    double sumsq[2];                      /* squared L2 norm of the reduced gradient, by step parity */
    /* Progress inside the operation an optimizer is applying, so a restarted one resumes it
     * exactly (optimizer/optim.c): the micro-batch being added ((step << 32) | micro) and the step
     * being applied; the operation's blocks are cut into segments its threads claim one at a
     * time, and a segment's entry says up to which block (exclusive) it has been written. */
    _Atomic uint64_t red_key;
    _Atomic uint32_t upd_step;
    _Atomic uint32_t red_done[CTL_MAX_SEGMENTS];
    _Atomic uint32_t upd_done[CTL_MAX_SEGMENTS];
};

static inline uint64_t micro_key(uint32_t step, uint32_t micro)
{
    return (uint64_t)step << 32 | micro;
}

/* The micro-batch of step `step` the chunk's optimizer adds next. */
static inline uint32_t chunk_next_micro(struct chunk_state *cs, uint32_t step)
{
    uint64_t nm = atomic_load_explicit(&cs->next_micro, memory_order_acquire);
    return (uint32_t)(nm >> 32) == step ? (uint32_t)nm : 0;
}

/* Whether micro-batch `micro` of step `step` is already in the chunk's accumulator. */
static inline bool chunk_grad_consumed(struct chunk_state *cs, uint32_t step, uint32_t micro)
{
    return atomic_load_explicit(&cs->reduced_step, memory_order_acquire) >= step ||
           micro < chunk_next_micro(cs, step);
}

/* One per optimizer thread: the block being written back from its staging area (in the master
 * region). A block is computed into staging, the record is made valid, staging is copied into
 * place, the progress is advanced, and the record is cleared; a restarted optimizer re-copies a
 * valid record's block, so no block of master, m, v, params16 or the accumulator is ever left
 * half-written. */
enum { JOURNAL_EMPTY = 0, JOURNAL_REDUCE = 1, JOURNAL_UPDATE = 2 };
#define JOURNAL_BLOCK 8192 /* elements */
struct journal {
    alignas(64) _Atomic uint32_t state;
    uint32_t chunk, step, micro;
    uint32_t block;    /* the block's index within the chunk's operation */
    uint32_t segment;  /* the segment of the operation's blocks it belongs to */
    uint64_t offset;   /* elements from the start of the parameter space */
    uint64_t n;
};

/* Bytes per element of Adam's m and of v on the host ([train] optimizer_state): fp32, bf16, or an
 * 8-bit code (whose block scales ctl_state_scales counts). */
static inline size_t ctl_state_size(enum optimizer_state st)
{
    return st == OPTIM_STATE_8BIT ? 1 : st == OPTIM_STATE_BF16 ? 2 : 4;
}

/* Scale bytes of m (and as many of v) for n elements from a block's start: one per STATE8_BLOCK with
 * 8-bit state, none otherwise. */
static inline uint64_t ctl_state_scales(enum optimizer_state st, uint64_t n)
{
    return st == OPTIM_STATE_8BIT ? (n + STATE8_BLOCK - 1) / STATE8_BLOCK : 0;
}

/* One optimizer thread's staging block: a journal block of p (fp32), m and v (state_size bytes
 * each), p16, then the scales of m and of v (8-bit state). A reduction stages its fp32 block where p
 * goes. */
static inline uint64_t ctl_staging_lane_bytes(enum optimizer_state st)
{
    return (uint64_t)JOURNAL_BLOCK * (4 + 2 * ctl_state_size(st) + 2) + 2 * ctl_state_scales(st, JOURNAL_BLOCK);
}

/* Host gradient slot states (per rank, per slot): (fill sequence << 2) | state. The sequence
 * lets an optimizer free exactly the fill it consumed (compare-and-swap), never a later reuse. */
enum { SLOT_FREE = 0, SLOT_WRITING = 1, SLOT_POSTED = 2 };
#define SLOT_STATE(w) ((w) & 3u)
#define SLOT_SEQ(w) ((w) >> 2)
#define SLOT_WORD(seq, st) (((seq) << 2) | (st))
struct slot_state {
    alignas(64) _Atomic uint32_t state;
};

/* A per-optimizer wake-up word: producers bump it after pushing to any of its rings. */
struct doorbell {
    alignas(64) _Atomic uint32_t seq;
};

/* A worker's loss over its first `done` micro-steps of a step, saved as soon as the last of them
 * is known (before its backward), one entry per micro-step (ctl_loss_progress): however far the
 * main thread runs ahead of the poster, a restart finds the sum for the micro-steps whose
 * gradients were all posted (`posted`). The key (micro_key(step, done), 0 while being written)
 * tags the entry with its step, so an entry of a step 64 earlier is never taken for it. */
struct loss_progress {
    _Atomic uint64_t key;
    double sum;
};

/* The exchange between workers' device memory (sharded parameters, GPU-side gradients; docs/design.md
 * §7.3). Each worker owns a window of device memory its peers read (CUDA IPC on GPUs; the grads
 * region on the CPU backend): XCHG_SLOTS parameter-shard slots and XCHG_SLOTS gradient slots.
 * Every rank walks the same two key sequences in the same order, one key per (version, chunk) of
 * the parameters (xchg_param_key) and per (step, micro-step, chunk) of the gradients
 * (xchg_grad_key); key k uses slot k % XCHG_SLOTS of every window. Each word below holds 1 + the
 * last key its rank finished that stage of, so a rank may refill a slot once every rank has
 * finished reading what the slot held. */
#define XCHG_SLOTS 2
struct xchg_rank {
    alignas(64) _Atomic uint32_t bell;     /* bumped after any word below changes (futex) */
    _Atomic uint64_t param_staged;         /* its own shard of the key's chunk is in its window */
    _Atomic uint64_t param_gathered;       /* it copied every rank's shard of the key */
    _Atomic uint64_t grad_published;       /* its whole gradient of the key is in its window */
    _Atomic uint64_t grad_reduced;         /* it summed its shard of every rank's gradient of the key */
    _Atomic uint32_t window_generation;    /* the worker generation whose window handle is below; 0: none */
    uint8_t window_handle[64];             /* cudaIpcMemHandle_t of the window (CUDA backend) */
};

/* One step's record, recycled for step + CTL_STEP_RECORDS once the launcher has logged it. A worker
 * redoing a step after a restart may find its record already recycled, so each per-rank mark holds
 * the step it is for (not a bare flag): a late write is never read as the later step's. */
struct step_record {
    alignas(64) _Atomic uint32_t step;         /* the step this record holds */
    _Atomic uint32_t norm_written;             /* grad_norm, lr and clip_coef are set */
    int64_t tokens;                            /* unmasked targets in the global batch */
    int64_t documents;                         /* documents in it (a window's first token starts one) */
    double grad_norm, lr, clip_coef;
    _Atomic uint32_t rank_done[JOB_MAX_GPUS];  /* = step: the rank posted every gradient of the step */
    _Atomic uint32_t val_done[JOB_MAX_GPUS];   /* = step: the rank wrote its validation sums */
    _Atomic uint64_t posted[JOB_MAX_GPUS];     /* micro_key(step, micro-steps whose gradients are all posted) */
    double loss_sum[JOB_MAX_GPUS];             /* written before rank_done */
    double val_loss_sum[JOB_MAX_GPUS];
    int64_t val_count[JOB_MAX_GPUS];
    int64_t val_correct[JOB_MAX_GPUS];
};

struct ctl_header {
    uint64_t magic;
    uint32_t version;
    uint32_t header_size;
    char job_name[64];
    uint64_t job_hash;              /* identifies the job's configuration across relaunches */
    _Atomic int32_t launcher_pid;
    _Atomic uint32_t generation;    /* bumped on every repair (a restart, an adoption); each process is
                                     * fenced out by its own slot's generation */
    _Atomic uint32_t stop;          /* enum stop_level */
    _Atomic uint32_t stop_step;     /* with STOP_AT_BOUNDARY: 1 + the last step workers run (0: not decided) */
    _Atomic uint32_t initialised;   /* stored last (release) once the weights are in place: a state
                                     * without it was never trained and is recreated */
    uint64_t created_ns;
    uint64_t start_ns;

    struct job_config job;
    struct model_config model;
    struct plan plan;

    int32_t gpus, optim_procs, grad_slots; /* gpus: the job's ranks on every host (hosts x local ones) */
    int32_t hosts, host_index;      /* several hosts (docs/design.md §11): this host runs ranks
                                     * [host_index * gpus / hosts, (host_index + 1) * gpus / hosts) */
    bool hosts_sharded;             /* each host sums and updates only its chunks (chunk_state.host) */
    int32_t num_tensors, num_chunks;
    int32_t first_step;             /* first step this run executes (1, or after a resume) */
    int64_t total_numel, max_chunk_numel, num_params;
    uint64_t params16_bytes, master_bytes, grads_bytes;
    bool keep_prev;                 /* params16 holds two copies, versions alternating by parity (update
                                     * during backward: version v-1 stays readable while v is written) */
    bool exchange;                  /* workers exchange shards through each other's device memory */
    bool grads_direct;              /* the accumulator heads the grads region; no slots (plan_grads_direct) */
    bool grads_bf16;                /* that accumulator holds bf16 (plan_grads_bf16) */
    uint64_t window_shm_bytes;      /* per rank: its window in the grads region (CPU backend); 0 on GPUs */
    uint32_t ckpt_every;            /* optimizers hold step S+1's updates until checkpoint S is written */
    char run_id[24];                /* the run's id in its checkpoints: an adopting launcher keeps it */

    /* offsets from the start of the region */
    uint64_t off_tensors, off_chunks, off_chunk_state, off_rings, off_slots, off_doorbells, off_procs, off_steps,
        off_journals, off_xchg, off_losses;
    uint64_t size;

    struct job_stats stats;

    alignas(64) _Atomic uint32_t reduce_seq;     /* bumped when a chunk's reduction completes (wake-ups) */
    alignas(64) _Atomic uint32_t metrics_step;   /* last step the launcher has logged */
    alignas(64) _Atomic uint32_t ckpt_done_step; /* last step whose disk checkpoint is written */
    alignas(64) _Atomic uint32_t workers_ready;  /* workers that finished start-up */
    _Atomic uint32_t abandoned_step;             /* a step that can no longer complete (stop) */
    _Atomic uint32_t xchg_first_step;            /* exchange routes: the step workers (re)start at */
    struct topology topo;                        /* the ranks' GPUs and the links between them */
};

/* The shape of a job's shared state: everything that sizes its four objects (ctl, params16, master,
 * grads) and places the ctl region's tables. ctl_shape_of builds it from job + plan + layout, for the
 * launcher's allocation, the planner's host-memory estimate and the check of an existing header
 * (ctl_validate) alike, so they cannot disagree. */
struct ctl_shape {
    int gpus;          /* ranks: rings, gradient slots, proc slots, exchange words, loss entries */
    int grad_accum;    /* micro-steps per step: loss-progress entries per rank and step record */
    int optim_procs;   /* optimizer processes: rings per rank, doorbells, proc slots */
    int optim_threads; /* threads per optimizer process: journals and staging blocks */
    int grad_slots;    /* host gradient slots per rank (in the grads object unless grads_direct) */
    int num_tensors, num_chunks;
    int64_t total_numel;     /* the padded parameter space (layout) */
    int64_t max_chunk_numel; /* the largest chunk: one gradient slot's elements */
    int params16_copies;     /* bf16 copies in params16 (plan_params16_copies): 0 when workers stream
                              * the master, 2 with versions by parity (plan_keep_prev) */
    bool grads_direct;       /* the gradient accumulator heads the grads object in place of the slots,
                              * instead of following m and v in master (plan_grads_direct) */
    bool grads_bf16;         /* that accumulator holds bf16 (plan_grads_bf16) */
    enum optimizer_state optimizer_state; /* the dtype of Adam's m and v */
    uint64_t window_shm_bytes; /* per rank: its exchange window at the end of the grads object (CPU
                                * backend, fp32 weights); 0 for none (GPUs export device memory) */
};

void ctl_shape_of(const struct job_config *job, const struct plan *plan, const struct layout *lay,
                  struct ctl_shape *out);

/* Region sizes and offsets for a job shape; overflow-checked. */
struct ctl_sizes {
    uint64_t off_tensors, off_chunks, off_chunk_state, off_rings, off_slots, off_doorbells, off_procs, off_steps,
        off_journals, off_xchg, off_losses;
    uint64_t ctl_bytes, params16_bytes, master_bytes, grads_bytes;
};
int ctl_compute_sizes(const struct ctl_shape *shape, struct ctl_sizes *out);

/* Frees the host gradient slots of a dead worker that no descriptor refers to: slots it was
 * filling, and filled slots whose descriptor never reached a ring. Call only after the rank's
 * process has exited. */
void ctl_repair_slots(struct ctl_header *h, int rank);

/* One rank's exchange window: XCHG_SLOTS gradient slots of the largest chunk in fp32 (GPU-side
 * gradients), then XCHG_SLOTS parameter-shard slots of weight_size-byte elements (sharded
 * parameters); byte offsets. */
struct window_layout {
    uint64_t grad_slot_bytes;  /* 0 without GPU-side gradients */
    uint64_t param_base, param_slot_bytes; /* 0 without sharded parameters */
    uint64_t total;
};
void ctl_window_layout(int64_t max_chunk_numel, int gpus, int weight_size, bool grad_slots, bool param_slots,
                       struct window_layout *out);
/* Whether rank r's gradient descriptor (chunk c, step s, micro-batch m) is in its ring or consumed
 * (checked in that order, because an optimizer advances its progress before it pops). */
bool ctl_grad_out(struct ctl_header *h, int r, int c, uint32_t s, uint32_t m);
/* Puts the exchange back at the start of step committed + 1, or of the step after it when every
 * rank's gradients of that one are already out (redoing it could read chunks its completion
 * updates), with no windows published; sets xchg_first_step. Only while no worker runs. */
void ctl_xchg_reset(struct ctl_header *h, uint32_t committed);

/* Marks rank r's part of step s complete from its saved loss over all its micro-steps (the worker
 * does when its last gradient is out; the launcher for a rank that died before, once no worker
 * runs): false when that loss is not saved (or its entry already reused: the step is logged). */
bool ctl_finish_rank(struct ctl_header *h, uint32_t s, int r);

/* Clears step s's record (logged) and hands it to step s + CTL_STEP_RECORDS. */
void ctl_recycle_step(struct ctl_header *h, uint32_t s);

/* Names of the job's shm objects: "/slidedp.<job>.<what>". */
void ctl_region_name(const char *job_name, const char *what, char *out, size_t len);
/* The shm name of the job's owner lock, "/slidedp-<job>.lock" (docs/design.md §8.6): beside the
 * job's objects, not one of them. */
void ctl_lock_name(const char *job_name, char *out, size_t len);
/* The job name for a log directory (a stable hash, so a relaunch finds the same state). */
void ctl_job_name(const char *log_dir, char *out, size_t len);
/* The same for host host_index of a job on several hosts (so hosts sharing a machine never share
 * an object): "<hash>-h<index>". */
void ctl_host_job_name(const char *log_dir, int hosts, int host_index, char *out, size_t len);

static inline struct tensor_desc *ctl_tensors(struct ctl_header *h)
{
    return (struct tensor_desc *)((char *)h + h->off_tensors);
}
static inline struct chunk_desc *ctl_chunks(struct ctl_header *h)
{
    return (struct chunk_desc *)((char *)h + h->off_chunks);
}
static inline struct chunk_state *ctl_chunk_state(struct ctl_header *h, int c)
{
    return (struct chunk_state *)((char *)h + h->off_chunk_state) + c;
}
static inline struct ring *ctl_ring(struct ctl_header *h, int rank, int optim)
{
    return (struct ring *)((char *)h + h->off_rings) + (size_t)rank * (size_t)h->optim_procs + (size_t)optim;
}
static inline struct slot_state *ctl_slot(struct ctl_header *h, int rank, int slot)
{
    return (struct slot_state *)((char *)h + h->off_slots) + (size_t)rank * (size_t)h->grad_slots + (size_t)slot;
}
static inline struct doorbell *ctl_doorbell(struct ctl_header *h, int optim)
{
    return (struct doorbell *)((char *)h + h->off_doorbells) + optim;
}
/* Process slots: workers 0..G-1, then optimizers. */
static inline struct proc_slot *ctl_proc(struct ctl_header *h, int kind, int index)
{
    return (struct proc_slot *)((char *)h + h->off_procs) + (kind == PROC_WORKER ? index : h->gpus + index);
}
static inline struct step_record *ctl_step(struct ctl_header *h, uint32_t step)
{
    return (struct step_record *)((char *)h + h->off_steps) + (step % CTL_STEP_RECORDS);
}
/* Rank r's saved loss over the first `done` (>= 1) micro-steps of a step. */
static inline struct loss_progress *ctl_loss_progress(struct ctl_header *h, uint32_t step, int rank, uint32_t done)
{
    size_t per_step = (size_t)h->gpus * (size_t)h->job.grad_accum;
    return (struct loss_progress *)((char *)h + h->off_losses) + (step % CTL_STEP_RECORDS) * per_step +
           (size_t)rank * (size_t)h->job.grad_accum + (done - 1);
}
static inline struct journal *ctl_journal(struct ctl_header *h, int optim, int thread)
{
    return (struct journal *)((char *)h + h->off_journals) + (size_t)optim * (size_t)h->plan.optim_threads +
           (size_t)thread;
}
static inline struct xchg_rank *ctl_xchg(struct ctl_header *h, int rank)
{
    return (struct xchg_rank *)((char *)h + h->off_xchg) + rank;
}
/* Parameters: chunk c at version v, in the order every pass first reads them. */
static inline uint64_t xchg_param_key(const struct ctl_header *h, uint32_t version, int c)
{
    return (uint64_t)version * (uint64_t)h->num_chunks + (uint64_t)c;
}
/* Gradients: chunk c of micro-step a of step s, in the backward's order (last chunk first). */
static inline uint64_t xchg_grad_key(const struct ctl_header *h, uint32_t step, uint32_t a, int c)
{
    return ((uint64_t)step * (uint64_t)h->job.grad_accum + a) * (uint64_t)h->num_chunks +
           (uint64_t)(h->num_chunks - 1 - c);
}

/* The first of this host's ranks and their count (all of them on one host). */
static inline int ctl_local_first(const struct ctl_header *h)
{
    return h->host_index * (h->gpus / h->hosts);
}
static inline int ctl_local_ranks(const struct ctl_header *h)
{
    return h->gpus / h->hosts;
}
static inline bool ctl_rank_is_local(const struct ctl_header *h, int r)
{
    return r >= ctl_local_first(h) && r < ctl_local_first(h) + ctl_local_ranks(h);
}

/* Whether this host's optimizers sum and update chunk c (always on one host, and when replicated). */
static inline bool ctl_chunk_is_here(struct ctl_header *h, int c)
{
    return ctl_chunk_state(h, c)->host == h->host_index;
}

/* The lowest published chunk version: every step up to it is committed. */
static inline uint32_t ctl_committed_step(struct ctl_header *h)
{
    uint32_t v = UINT32_MAX;
    for (int c = 0; c < h->num_chunks; c++) {
        uint32_t x = atomic_load_explicit(&ctl_chunk_state(h, c)->version, memory_order_acquire);
        v = x < v ? x : v;
    }
    return v;
}

/* The parts of a job's state a process maps. */
struct job_shm {
    struct ctl_header *ctl;
    uint16_t *params16;                              /* both copies with keep_prev: see job_params16_of */
    float *master, *exp_avg, *exp_avg_sq, *grad_acc; /* each total_numel; grad_acc in grads if grads_direct */
    uint16_t *exp_avg16, *exp_avg_sq16;              /* in place of m and v (those NULL) with bf16 state */
    uint8_t *exp_avg8, *exp_avg_sq8;                 /* in their place with 8-bit state: m, sqrt(v) codes */
    uint8_t *exp_avg_scale, *exp_avg_sq_scale;       /* and their scales, one per STATE8_BLOCK elements */
    uint16_t *grad_acc16;                           /* in its place (grad_acc NULL) when grads_bf16 */
    void *staging;                                   /* per optimizer thread: ctl_staging_lane_bytes */
    float *grads;                                    /* the accumulator or gpus * grad_slots * max_chunk_numel */
    void *regions[4];                                /* internal: struct shm_region per object */
};

/* JOB_MAP_PARAMS_RO: the weights workers read: params16, or when they stream the master
 * (plan_streams_master) the master weights alone, read-only (s->master). JOB_MAP_PARAMS_RW: params16
 * (the optimizers; nothing when there is no copy). */
enum { JOB_MAP_CTL = 1, JOB_MAP_PARAMS_RO = 2, JOB_MAP_PARAMS_RW = 4, JOB_MAP_MASTER = 8, JOB_MAP_GRADS = 16 };
/* Whether a ctl header describes itself consistently: magic and version, then its choices
 * (the weights source, keep_prev, grads_direct, grads_bf16, windows) and every table offset and size as ctl_shape_of
 * and ctl_compute_sizes give them for the header's job, plan and layout counts, within the ctl
 * object's size (ctl_bytes); 0 or -1 with the reason. Checked before any offset is used. */
int ctl_validate(const struct ctl_header *h, uint64_t ctl_bytes, const char *name);
/* Attaches a running job's objects (each must be ours, mode 0600, and as large as the header
 * says); ctl writable unless ctl_read_only (monitors). On failure nothing stays mapped. */
int job_shm_attach(struct job_shm *s, const char *job_name, int what, bool ctl_read_only);
void job_shm_detach(struct job_shm *s);
/* Points the views into the master region at base: master, then m and v (fp32, bf16, or 8-bit codes
 * followed by their scales), then the fp32 accumulator unless grads_direct, then the optimizers'
 * staging blocks. */
void job_shm_master_views(struct job_shm *s, void *base, int64_t total_numel, bool grads_direct,
                          enum optimizer_state state);

/* Where version v of the bf16 weights is: with keep_prev the versions alternate between two copies
 * by parity, so a worker redoing step v+1 still reads version v while the optimizers write v+1 (and
 * nothing needs v-1 by then: step v is complete); otherwise the one copy is updated in place. */
static inline uint16_t *job_params16_of(const struct job_shm *s, uint32_t v)
{
    return s->params16 + (s->ctl->keep_prev && (v & 1) ? (size_t)s->ctl->total_numel : 0);
}

/* The staging block of thread t of optimizer k in the master region (ctl_staging_lane_bytes). */
static inline void *job_staging(struct job_shm *s, int optim, int thread)
{
    size_t lane = (size_t)optim * (size_t)s->ctl->plan.optim_threads + (size_t)thread;
    return (char *)s->staging + lane * ctl_staging_lane_bytes(s->ctl->job.optimizer_state);
}

/* Rank r's exchange window in the grads region (CPU backend), after the accumulator or every rank's
 * gradient slots. */
static inline void *job_shm_window(struct job_shm *s, int rank)
{
    struct ctl_header *h = s->ctl;
    size_t head = h->grads_direct ? (size_t)h->total_numel * (h->grads_bf16 ? 2 : 4)
                                  : (size_t)h->gpus * (size_t)h->grad_slots * (size_t)h->max_chunk_numel * 4;
    return (char *)s->grads + head + (size_t)rank * (size_t)h->window_shm_bytes;
}

static inline float *job_grad_slot(struct job_shm *s, int rank, int slot)
{
    struct ctl_header *h = s->ctl;
    return s->grads + ((size_t)rank * (size_t)h->grad_slots + (size_t)slot) * (size_t)h->max_chunk_numel;
}

#endif
