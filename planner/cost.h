/* The step-time and memory model of one candidate plan: what a step costs each stream (device
 * compute, host->device weights, device->host gradients, the CPU optimizers, host memory
 * bandwidth), the step time the pipeline gives when they overlap, and the device and host memory
 * the plan needs. It mirrors worker/model.c (ops, allocations, gradient buffers), worker/pipeline*.c
 * (chunk cache, gradient slots, the poster thread, the exchange) and optimizer/optim.c (reduce,
 * norm, update).
 * Used by the plan search. */
#ifndef SD_PLANNER_COST_H
#define SD_PLANNER_COST_H

#include <stdbool.h>
#include <stdint.h>

#include "common/job.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "common/plan.h"
#include "planner/calib.h"

/* One candidate: the job, the model, the layout built for plan->layers_per_chunk, the plan and
 * the optimizer process owning each chunk (plan_assign_owners). */
struct cost_case {
    const struct job_config *job;
    const struct model_config *cfg;
    const struct layout *lay;
    const struct plan *plan;
    const int *owner;
    const struct calib *cal;
    int host_cpus;
    bool offload; /* the layer inputs wait for the backward in host memory (plan.offload_inputs) */
};

/* Predicted seconds per optimizer step, per rank. */
struct step_pred {
    double step_s;
    double compute_s;   /* device compute, recompute included */
    double recompute_s; /* the forward again for recomputed layers */
    double h2d_s;       /* weights in (and offloaded activations) at the link rate */
    double d2h_s;       /* gradients out (and offloaded activations) */
    double p2p_s;       /* peer copies of the sharded params / GPU-side gradient routes */
    double optim_s;     /* the busiest optimizer process: reduce + update */
    double host_mem_s;  /* the step's host memory traffic over the host's bandwidth */
    double link_s;      /* several hosts: the bytes this host sends to the others over its link */
    double exposed_s;   /* step_s beyond the busiest stream: fill, drain, dependency waits */
    int bottleneck;     /* enum plan_bottleneck */
    double flops;       /* device FLOPs (GEMMs and attention) per rank per step */
    double h2d_bytes, d2h_bytes, p2p_bytes; /* per rank per step */
    double optim_bytes; /* host bytes all optimizer processes touch per step */
    double link_bytes;  /* several hosts: bytes this host sends per step (it receives as many) */
};

/* Device memory per rank, bytes, as worker/pipeline*.c and worker/model.c allocate it. */
struct gpu_mem_pred {
    int64_t chunk_bufs;    /* chunk_buffers x largest chunk x weight dtype */
    int64_t grad_bufs;     /* fp32: the embedding chunk's and two for the others, plus one per
                            * chunk when the micro-steps accumulate on the device */
    int64_t layer_inputs;  /* the residual stream entering each layer (the recompute checkpoints) */
    int64_t acts_per_layer;/* one kept layer's activations */
    int64_t kept_acts;     /* kept layers x acts_per_layer, plus one scratch set when any layer recomputes */
    int64_t bwd_scratch;   /* backward scratch, final norm, residual gradients */
    int64_t logits;        /* one cross-entropy chunk (logits_rows x V) */
    int64_t misc;          /* tokens, targets, row scales, RoPE tables */
    int64_t workspace;     /* backend workspace (assumed on CUDA) */
    int64_t context;       /* the CUDA context and libraries' own memory (calibration), 0 on the CPU */
    int64_t peer_bufs;     /* the peer routes: 4 exchange slots of a weight shard (sharded params);
                            * fp32 shard accumulators of 1/G of the parameters and 4 exchange slots
                            * of the largest chunk (GPU-side gradients) */
    int64_t total;
};

/* Host memory per host, bytes: the shared state slidedp-launch creates, object by object as
 * shm/ctl.c ctl_compute_sizes sizes them (plus, on the CPU backend, the workers' "device" memory).
 * On several hosts the ctl region and the slots serve every rank of the job; with the state sharded
 * across hosts, master holds this host's share (1/H, rounded up) and params16 the whole copy. */
struct host_mem_pred {
    int64_t params16;  /* bf16 compute copy (two copies when updating during the backward) */
    int64_t master;    /* fp32 master, m and v (12 B/param, 8 with bf16 m and v), the fp32 gradient
                        * accumulator (4 B/param) unless it is in grads, the optimizers' staging */
    int64_t grads;     /* ranks x slots x largest chunk x 4 B, or the accumulator (4 B/param, 2 in
                        * bf16) when gradients go straight into it (plan_grads_direct); the CPU
                        * backend's exchange windows */
    int64_t ctl;       /* tables, rings, step records, journals */
    int64_t workers;   /* CPU backend: every worker's device memory */
    int64_t total;
};

/* Several hosts (plan->hosts > 1): the link between hosts when [runtime] host_link_gbps = 0, bytes/s
 * each way per host (one 200 Gb/s InfiniBand NDR200 port), and the delay of each message. */
#define COST_LINK_DEFAULT_BW 25e9
#define COST_LINK_LATENCY_S 5e-6

/* plan_grads_direct and plan_grads_bf16 over every host's ranks: on several hosts the other hosts'
 * gradients are summed into the accumulator too, so no gradient goes straight into it. */
bool cost_grads_direct(const struct plan *p, const struct job_config *job);
bool cost_grads_bf16(const struct plan *p, const struct job_config *job);

/* The link's bytes/s each way for the job: runtime.host_link_gbps, else the default. */
double cost_link_bw(const struct job_config *job);

/* Forward FLOPs of one decoder layer for N = B*T tokens (GEMMs and causal attention). */
double cost_layer_flops(const struct model_config *cfg, int B, int T);
/* Forward FLOPs of the LM head for N tokens. */
double cost_head_flops(const struct model_config *cfg, int64_t N);

/* Bytes of one kept layer's activations (worker/model.c acts_alloc). */
int64_t cost_layer_act_bytes(const struct model_config *cfg, int64_t N, int act_size, int align);

/* The attention kernels a job runs (worker/cuda/attention_*.cu), so the rates that price them:
 * cuDNN's fused kernels both ways; with runtime.deterministic, cuDNN's forward and its deterministic
 * backward engine in tiles (design §9.7), or for document windows the built-in deterministic
 * backward; or the CPU backend's. Document attention takes cuDNN's kernels over a table of the
 * documents on the pairs within documents. */
enum attn_kernels { ATTN_KERNELS_CPU, ATTN_KERNELS_CUDNN, ATTN_KERNELS_DET_CUDNN, ATTN_KERNELS_DET_BUILTIN };
enum attn_kernels cost_attention_kernels(const struct job_config *job);

/* The deterministic backward's speed with calls of at most `bound` bytes of dP (0: the default,
 * ATTN_TILE_WORKSPACE_DEFAULT) against the default's, at attn_bwd_det_flops: larger calls run
 * faster where the default cuts sequences into head groups or chunks (docs/performance.md §1.1,
 * one H100: 1.04-1.06x at 2 GiB, 1.07-1.12x at 4 GiB, 1.08-1.19x at 8 GiB for 32K and 128K tokens),
 * `gain` (the calibration's attn_det_tile_gain) a doubling of the calls' dP, at most 1.15; 1 where
 * the default's calls hold whole sequences (not measured there). */
double cost_det_tile_speed(int B, int T, int Hq, int Hkv, int64_t bound, double gain);

/* Device memory for the case with `kept` layers keeping their activations. */
void cost_gpu_memory(const struct cost_case *mc, int kept, struct gpu_mem_pred *out);
void cost_host_memory(const struct cost_case *mc, int64_t gpu_bytes, struct host_mem_pred *out);

/* Step time of the case (plan->keep_acts decides the recomputed layers). */
void cost_step(const struct cost_case *mc, struct step_pred *out);

#endif
