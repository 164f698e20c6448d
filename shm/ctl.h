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
#include "shm/ring.h"

#define CTL_MAGIC 0x31504445444c4953ull /* "SLIDEDP1" little-endian */
#define CTL_VERSION 1
#define CTL_MAX_OPTIM 64
#define CTL_STEP_RECORDS 64 /* workers never run more than half of this ahead of the launcher */

enum proc_kind { PROC_WORKER = 0, PROC_OPTIM = 1 };

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
    PHASE_COUNT
};

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
    /* monotonically increasing counters for monitors */
    _Atomic uint64_t bytes_in;   /* weights fetched (workers), gradient bytes reduced (optimizers) */
    _Atomic uint64_t bytes_out;  /* gradients sent (workers), bf16 bytes published (optimizers) */
    _Atomic uint64_t busy_ns;
    _Atomic uint64_t wait_ns;
    _Atomic uint64_t items;      /* micro-steps (workers), chunk updates (optimizers) */
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
    uint64_t updated_ns;      /* clock_ns() of the last update */
    double loss_history[JOB_STATS_HISTORY]; /* loss of step k at [k % JOB_STATS_HISTORY] */
};

struct chunk_state {
    alignas(64) _Atomic uint32_t version; /* updates applied to this chunk of params16 (= its step) */
    _Atomic uint32_t reduced_step;        /* last step whose gradient is fully accumulated */
    _Atomic uint32_t next_micro;          /* next micro-batch index to add for step reduced_step + 1 */
    int32_t owner;                        /* optimizer process index */
    double sumsq[2];                      /* squared L2 norm of the reduced gradient, by step parity */
};

/* Host gradient slot states (per rank, per slot). */
enum { SLOT_FREE = 0, SLOT_FULL = 1 };
struct slot_state {
    alignas(64) _Atomic uint32_t state;
};

/* A per-optimizer wake-up word: producers bump it after pushing to any of its rings. */
struct doorbell {
    alignas(64) _Atomic uint32_t seq;
};

struct step_record {
    alignas(64) _Atomic uint32_t step;         /* the step this record holds (0 = unused) */
    _Atomic uint32_t ranks_done;               /* workers that wrote their loss */
    _Atomic uint32_t val_ranks_done;           /* workers that wrote their validation sums */
    _Atomic uint32_t committed;                /* every chunk updated */
    _Atomic uint32_t norm_written;             /* grad_norm, lr and clip_coef are set */
    int64_t tokens;                            /* unmasked targets in the global batch */
    double grad_norm, lr, clip_coef;
    uint64_t t_commit_ns;
    double loss_sum[JOB_MAX_GPUS];
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
    _Atomic uint32_t generation;    /* bumped on every repair; stale writers are fenced out */
    _Atomic uint32_t stop;          /* 1: workers finish their step and exit; 3: workers are gone,
                                       optimizers finish what is complete and exit; 2: exit now */
    uint64_t created_ns;
    uint64_t start_ns;

    struct job_config job;
    struct model_config model;
    struct plan plan;

    int32_t gpus, optim_procs, grad_slots;
    int32_t num_tensors, num_chunks;
    int32_t first_step;             /* first step this run executes (1, or after a resume) */
    int64_t total_numel, max_chunk_numel, num_params;
    uint64_t params16_bytes, master_bytes, grads_bytes;

    /* offsets from the start of the region */
    uint64_t off_tensors, off_chunks, off_chunk_state, off_rings, off_slots, off_doorbells, off_procs, off_steps;
    uint64_t size;

    struct job_stats stats;

    alignas(64) _Atomic uint32_t chunks_reduced; /* chunk reductions completed, all steps */
    alignas(64) _Atomic uint32_t chunks_updated; /* chunk updates completed, all steps */
    alignas(64) _Atomic uint32_t metrics_step;   /* last step the launcher has logged */
    alignas(64) _Atomic uint32_t workers_ready;  /* workers that finished start-up */
    _Atomic uint32_t abandoned_step;             /* a step that can no longer complete (stop) */
};

/* Region sizes and offsets for a job shape; overflow-checked. */
struct ctl_sizes {
    uint64_t off_tensors, off_chunks, off_chunk_state, off_rings, off_slots, off_doorbells, off_procs, off_steps;
    uint64_t ctl_bytes, params16_bytes, master_bytes, grads_bytes;
};
int ctl_compute_sizes(int gpus, int optim_procs, int grad_slots, int num_tensors, int num_chunks, int64_t total_numel,
                      int64_t max_chunk_numel, struct ctl_sizes *out);

/* Names of the job's shm objects: "/slidedp.<job>.<what>". */
void ctl_region_name(const char *job_name, const char *what, char *out, size_t len);
/* The job name for a log directory (a stable hash, so a relaunch finds the same state). */
void ctl_job_name(const char *log_dir, char *out, size_t len);

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

/* The parts of a job's state a process maps. */
struct job_shm {
    struct ctl_header *ctl;
    uint16_t *params16;
    float *master, *exp_avg, *exp_avg_sq, *grad_acc; /* each total_numel */
    float *grads;                                    /* gpus * grad_slots * max_chunk_numel */
    void *regions[4];                                /* internal: struct shm_region per object */
};

enum { JOB_MAP_CTL = 1, JOB_MAP_PARAMS_RO = 2, JOB_MAP_PARAMS_RW = 4, JOB_MAP_MASTER = 8, JOB_MAP_GRADS = 16 };
/* Attaches a running job's objects; ctl writable unless ctl_read_only (monitors). */
int job_shm_attach(struct job_shm *s, const char *job_name, int what, bool ctl_read_only);
void job_shm_detach(struct job_shm *s);

static inline float *job_grad_slot(struct job_shm *s, int rank, int slot)
{
    struct ctl_header *h = s->ctl;
    return s->grads + ((size_t)rank * (size_t)h->grad_slots + (size_t)slot) * (size_t)h->max_chunk_numel;
}

#endif
