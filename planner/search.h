/* The planner: chooses a job's execution plan (common/plan.h) from job.ini, the model, the host's
 * GPU topology (common/topology.h) with the step-time model (planner/cost.h) and the host's
 * calibration (planner/calib.h), and assigns chunks to optimizer processes. */
#ifndef SD_PLANNER_SEARCH_H
#define SD_PLANNER_SEARCH_H

#include <stdbool.h>
#include <stdio.h>

#include "common/job.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "common/plan.h"
#include "common/topology.h"
#include "planner/calib.h"
#include "planner/cost.h"

/* A combination of parameter and gradient routes, and the fastest plan found with it. */
struct plan_route_option {
    int param_route;  /* enum param_route */
    int grad_route;   /* enum grad_route */
    bool fits;
    double step_s;
    int64_t gpu_bytes;
};

#define PLAN_MAX_ROUTES 4

/* A weights source (enum weights_source) and the fastest plan found with it. */
struct plan_source_option {
    int source;
    bool fits;          /* a plan fits the device */
    bool host_fits;     /* and the host's memory */
    double step_s;
    int64_t host_bytes;
};

/* Several hosts: one host state searched (enum host_state). */
struct plan_host_state {
    double step_s;      /* its fastest plan; 0: not searched, or nothing fits */
    int64_t host_bytes; /* per host: the chosen plan's choices with this state */
};

/* Host memory of the job under one [train] optimizer_state, on the chosen plan's choices; and the
 * largest model of the job's shape that fits this host: the job's model with as many decoder
 * layers as fit (hidden size, heads, MLP and vocabulary unchanged), each layer priced with the
 * chosen plan's choices (chunking, gradient route and dtype, slots, optimizer processes) but
 * streaming the master (updating after the backward) unless job.ini sets the bf16 copy or updates
 * during the backward: the planner takes the master whenever the copy does not fit. Layers are the one dimension a family's larger configs do not also change in shape,
 * and the unit the workers stream, so the GPU budget does not bound the count. */
struct plan_state_mode {
    int64_t host_bytes;       /* this job */
    double bytes_per_param;   /* host_bytes over the model's parameters */
    int largest_layers;       /* 0: not even one layer fits; -1: the host's memory is unknown */
    bool largest_capped;      /* PLAN_MAX_LAYERS layers fit: the largest may be larger */
    int64_t largest_params;
    int64_t largest_host_bytes;
};

/* What slidedp-plan reports beside the plan. */
struct plan_info {
    struct step_pred pred;
    struct gpu_mem_pred gpu;
    struct host_mem_pred host;
    int kept;               /* layers keeping their activations */
    int64_t host_available; /* MemAvailable, -1 unknown */
    bool host_fits;         /* false: no plan fits the host's memory; the plan ignores it */
    bool gpu_auto;          /* runtime.gpu_mem = auto */
    int64_t gpu_budget;     /* per rank; on the CPU backend with auto, what the host has left now */
    int evaluated;          /* candidate plans priced */
    bool failed;            /* no plan fits: only min_gpu_bytes and host are set */
    int64_t min_gpu_bytes;  /* the smallest device memory any plan needs */
    int num_routes;         /* route combinations searched, in the order tried */
    struct plan_route_option routes[PLAN_MAX_ROUTES];
    char route_reason[256]; /* why these routes: forced, one GPU, no P2P, fastest, ... */
    struct plan_state_mode state_modes[OPTIM_STATE_COUNT]; /* by enum optimizer_state */
    int num_sources;        /* weights sources searched (one when job.ini sets it) */
    struct plan_source_option sources[2];
    char source_reason[256]; /* why the chosen one */
    double link_bw;                        /* several hosts: bytes/s each way per host */
    struct plan_host_state host_states[3]; /* by enum host_state ([HOST_STATE_AUTO] unused) */
    char host_state_reason[128];           /* why the plan's host state: one host, job.ini, auto's rule */
};

/* Fills plan with the fastest plan for `hosts` hosts of job->gpus ranks each (docs/design.md §10.8)
 * that fits runtime.gpu_mem (auto: plan_gpu_budget) and host memory (per host), honouring every
 * choice job.ini makes; the routes are those topo (job->gpus ranks) allows: peer routes only where every pair of GPUs
 * has P2P, and never chosen automatically on the CPU backend. Fails with a message naming the
 * job.ini key when a forced choice is impossible, and with the smallest budget that would do when
 * nothing fits. Measures or reads the host's calibration. The job is as job_config_load validated
 * it (the checks of the job alone, e.g. chunk_buffers >= 3, are there). */
int plan_make(const struct job_config *job, const struct model_config *cfg, const struct topology *topo,
              int host_cpus, int hosts, struct plan *plan);

/* The device memory per rank the plans must fit: runtime.gpu_mem when set; with auto, on CUDA the
 * smallest of topo's GPUs as the CUDA runtime gives their memory, else (not probed, not described)
 * the calibrated device memory; on the CPU backend INT64_MAX (host memory bounds it). */
int64_t plan_gpu_budget(const struct job_config *job, const struct calib *cal, const struct topology *topo);

/* plan_make with a given calibration; info (may be NULL) receives the details, also when nothing
 * fits. */
int plan_choose(const struct job_config *job, const struct model_config *cfg, const struct calib *cal,
                const struct topology *topo, int host_cpus, int hosts, struct plan *plan, struct plan_info *info);

/* The longest data.seq_len of the job (its model, micro_batch, GPUs, runtime.gpu_mem and host
 * memory, every other choice as job.ini makes it) that has a plan that fits, and what one token
 * more runs out of. */
enum seq_fit { SEQ_FITS = 0, SEQ_LIMIT_GPU, SEQ_LIMIT_HOST, SEQ_LIMIT_CAP };
struct plan_seq_limit {
    int seq_len;            /* 0: not even one token fits */
    int limit;              /* enum seq_fit: GPU memory, host memory, or the longest job.ini accepts */
    int64_t next_gpu_bytes; /* SEQ_LIMIT_GPU: the smallest device memory a plan of seq_len + 1 needs */
};
int plan_longest_seq_len(const struct job_config *job, const struct model_config *cfg, const struct calib *cal,
                         const struct topology *topo, int host_cpus, int hosts, struct plan_seq_limit *out);

/* Optimizer process of each chunk: largest chunks first onto the least loaded process, so each
 * process gets about the same number of parameters (deterministic). */
void plan_assign_owners(const struct layout *lay, int optim_procs, int *owner);

const char *plan_bottleneck_name(int bottleneck);
/* The job.ini spelling of an enum weights_source other than auto. */
const char *plan_weights_source_name(int source);

/* The plan and its prediction in three lines (slidedp-launch's header). */
void plan_print(FILE *f, const struct plan *plan, const struct model_config *cfg, const struct job_config *job);

#endif
