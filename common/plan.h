/* The execution plan of a job: how the parameter space is chunked and streamed, where
 * activations live, which routes parameters and gradients take, and how the optimizer work is
 * spread. Chosen by the planner (planner/), stored by value in the ctl region, obeyed by every
 * process. */
#ifndef SD_PLAN_H
#define SD_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "common/job.h"

#define PLAN_MAX_LAYERS 1024

/* The stream that bounds a plan's step time. */
enum plan_bottleneck {
    BOTTLENECK_COMPUTE = 0, /* device compute */
    BOTTLENECK_H2D = 1,     /* weights host -> device */
    BOTTLENECK_D2H = 2,     /* gradients device -> host */
    BOTTLENECK_P2P = 3,     /* peer copies between GPUs */
    BOTTLENECK_OPTIM = 4,   /* the CPU optimizer processes */
    BOTTLENECK_HOST_MEM = 5, /* host memory bandwidth */
    BOTTLENECK_LINK = 6      /* the link between hosts (several hosts) */
};

struct plan {
    int layers_per_chunk;
    int chunk_buffers;      /* device chunk ring depth per worker */
    int grad_slots;         /* host gradient slots per rank */
    int optim_procs;
    int optim_threads;      /* per optimizer process */
    int update_mode;        /* enum update_mode (job.h), never AUTO here */
    int param_route;        /* enum param_route, never AUTO here */
    int grad_route;         /* enum grad_route, never AUTO here */
    int logits_rows;        /* rows per cross-entropy chunk */
    int accumulate_on_device; /* micro-steps sum their gradients on the GPU; each rank sends once per step */
    int weights_source;     /* enum weights_source, never AUTO here */
    int offload_inputs;     /* layer inputs wait for the backward in host memory (docs/design.md §6.1) */
    int64_t attn_tile_bytes; /* deterministic attention backward on CUDA: the dP bound of its cuDNN calls
                              * (common/attn_tiles.h); 0 where it does not run */
    uint8_t keep_acts[PLAN_MAX_LAYERS]; /* per layer: 1 keep, 0 recompute from the layer input */
    /* predictions (seconds per step, bytes); the choices above identify a job's state
     * (launcher/state.c job_hash), these do not */
    double predicted_step_s;
    double predicted_compute_s, predicted_h2d_s, predicted_d2h_s, predicted_optim_s;
    int64_t gpu_bytes;      /* per GPU, the CUDA context included */
    int64_t gpu_context_bytes; /* of which the context's own (the worker's allocations get the rest) */
    int64_t host_bytes;     /* shared state + staging */
    double predicted_recompute_s, predicted_p2p_s, predicted_host_mem_s;
    double predicted_exposed_s; /* beyond the bottleneck stream: fill, drain, waits */
    int bottleneck;         /* enum plan_bottleneck */
    int64_t gpu_budget;     /* per GPU bytes the plan was fitted into; 0: the host's memory (CPU backend) */
    /* several hosts (docs/design.md §10.8): how many the plan was made for, where the optimizer
     * state lives (enum host_state, never AUTO here; replicated with one host) and the link's
     * busy time per step */
    int hosts;
    int host_state;
    double predicted_link_s;
};

/* Rows of N per cross-entropy chunk that hold about mib MiB of logits of row_bytes each, within
 * [1, N]: the planner's first guess and search steps, and the worker's default without a plan. */
static inline int plan_logits_rows_for(int64_t N, int64_t row_bytes, int64_t mib)
{
    int64_t rows = (mib << 20) / row_bytes;
    return (int)(rows < 1 ? 1 : rows > N ? N : rows);
}

/* Whether workers stream the fp32 master (and round it to bf16 on the device) instead of a bf16
 * copy: then there is no params16 object and the optimizers write no copy. */
static inline bool plan_streams_master(const struct plan *p)
{
    return p->weights_source == WEIGHTS_MASTER;
}

/* Whether the workers exchange shards through each other's device memory (docs/design.md §7). */
static inline bool plan_uses_exchange(const struct plan *p, int gpus)
{
    return gpus > 1 && (p->param_route == PARAMS_SHARDED || p->grad_route == GRADS_GPU);
}

/* Whether params16 keeps each chunk's previous version beside the new one (two copies, versions by
 * parity): updating during the backward, a worker redoing a step after a crash still finds the
 * version it reads (docs/design.md §6.3). */
static inline bool plan_keep_prev(const struct plan *p)
{
    return p->update_mode == UPDATE_DURING_BACKWARD;
}

/* Whether each rank posts each chunk's gradient once per step, its micro-steps summed on the device
 * (on-device accumulation, or the GPU-side route's shard accumulators), as micro-batch r; else once
 * per micro-step a, as micro-batch a*G + r (the order the optimizers sum them in). */
static inline bool plan_one_post_per_rank(const struct plan *p, int gpus)
{
    return p->accumulate_on_device || (gpus > 1 && p->grad_route == GRADS_GPU);
}

/* The bf16 copies of the weights params16 holds: none when workers stream the master (whose plans
 * never keep the previous version), two with plan_keep_prev, else one. */
static inline int plan_params16_copies(const struct plan *p)
{
    return plan_streams_master(p) ? 0 : plan_keep_prev(p) ? 2 : 1;
}

/* Whether each chunk's gradient (or each rank's shard of it) reaches the host once per step. Then
 * the workers copy it straight into the accumulator, which lives in the grads region: no slots,
 * and the optimizer only squares it for the norm instead of copying it. */
static inline bool plan_grads_direct(const struct plan *p, int gpus, int grad_accum)
{
    if (gpus > 1)
        return p->grad_route == GRADS_GPU;
    return grad_accum == 1 || p->accumulate_on_device;
}

/* Whether gradients cross to the host in bf16: asked for, and going straight into the accumulator
 * (each element then has one contribution per step; slots hold micro-steps summed in fp32). */
static inline bool plan_grads_bf16(const struct plan *p, const struct job_config *job)
{
    return job->grad_dtype == GRAD_BF16 && plan_grads_direct(p, job->gpus, job->grad_accum);
}

#endif
