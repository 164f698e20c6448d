/* Plan selection (see plan.h). */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "shm/ring.h"

static int imin(int a, int b)
{
    return a < b ? a : b;
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

int plan_make(const struct job_config *job, const struct model_config *cfg, int host_cpus, struct plan *plan)
{
    memset(plan, 0, sizeof *plan);
    int L = cfg->num_layers;
    if (L > PLAN_MAX_LAYERS)
        return sd_err("model has %d layers; at most %d are supported", L, PLAN_MAX_LAYERS);
    plan->layers_per_chunk = job->layers_per_chunk > 0 ? imin(job->layers_per_chunk, L) : 1;
    int num_chunks = 2 + (L + plan->layers_per_chunk - 1) / plan->layers_per_chunk;

    /* A pass holds at most two chunks at once (the tied embedding and the current one); one more
     * buffer lets the next chunk stream in while the current one computes. */
    if (job->chunk_buffers > 0 && job->chunk_buffers < 3)
        return sd_err("[runtime] chunk_buffers = %d: at least 3 are needed", job->chunk_buffers);
    plan->chunk_buffers = job->chunk_buffers > 0 ? imin(job->chunk_buffers, num_chunks)
                          : job->device == DEVICE_CPU ? num_chunks
                                                      : imin(num_chunks, 4);
    plan->chunk_buffers = imax(plan->chunk_buffers, imin(3, num_chunks));

    if (job->grad_slots >= RING_CAP)
        return sd_err("[runtime] grad_slots = %d: at most %d", job->grad_slots, RING_CAP - 1);
    plan->grad_slots = job->grad_slots > 0 ? job->grad_slots : 4;

    if (job->optim_procs > num_chunks)
        return sd_err("[runtime] optim_procs = %d: the model has only %d chunks to share out", job->optim_procs,
                      num_chunks);
    plan->optim_procs = job->optim_procs > 0 ? job->optim_procs : imin(num_chunks, imax(2, host_cpus / 4));
    plan->optim_threads = job->optim_threads > 0 ? job->optim_threads : 1;

    if (job->update_mode == UPDATE_DURING_BACKWARD && job->grad_clip > 0)
        return sd_err("[runtime] update_mode = during_backward needs train.grad_clip = 0 (clipping needs the global "
                      "norm before any update)");
    plan->update_mode = job->update_mode != UPDATE_AUTO ? job->update_mode
                        : job->grad_clip > 0        ? UPDATE_AFTER_BACKWARD
                                                    : UPDATE_DURING_BACKWARD;
    if (job->param_route == PARAMS_SHARDED)
        return sd_err("[runtime] param_route = sharded is not available yet; use replicated");
    if (job->grad_route == GRADS_GPU)
        return sd_err("[runtime] grad_route = gpu is not available yet; use cpu");
    /* Micro-steps sum their gradients on the GPU (4 bytes per parameter there) when that fits well
     * within the budget: each rank then sends and the optimizers add one gradient per step. */
    int64_t budget = job->gpu_mem > 0 ? job->gpu_mem : (int64_t)80 << 30;
    bool fits = (int64_t)model_config_num_params(cfg) * 4 <= budget / 3;
    plan->accumulate_on_device = job->accumulate_on_device >= 0 ? job->accumulate_on_device
                                 : job->device == DEVICE_CUDA && job->grad_accum > 1 && fits;
    plan->param_route = PARAMS_REPLICATED;
    plan->grad_route = GRADS_CPU;
    for (int l = 0; l < L; l++)
        plan->keep_acts[l] = job->act_policy == ACT_RECOMPUTE || job->act_policy == ACT_OFFLOAD ? 0 : 1;
    return 0;
}

void plan_assign_owners(const struct layout *lay, int optim_procs, int *owner)
{
    int n = lay->num_chunks;
    int *order = malloc(sizeof(int) * (size_t)n);
    int64_t *load = calloc((size_t)optim_procs, sizeof(int64_t));
    SD_ASSERT(order && load);
    for (int i = 0; i < n; i++)
        order[i] = i;
    /* insertion sort by size, descending; ties by index */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0; j--) {
            int a = order[j - 1], b = order[j];
            if (lay->chunks[b].numel > lay->chunks[a].numel) {
                order[j - 1] = b;
                order[j] = a;
            }
        }
    for (int i = 0; i < n; i++) {
        int best = 0;
        for (int k = 1; k < optim_procs; k++)
            if (load[k] < load[best])
                best = k;
        /* every process gets a chunk before any gets two */
        if (i < optim_procs)
            best = i;
        owner[order[i]] = best;
        load[best] += lay->chunks[order[i]].numel;
    }
    free(order);
    free(load);
}

static const char *update_mode_name(int m)
{
    return m == UPDATE_DURING_BACKWARD ? "during backward (no clipping)" : "after backward (overlaps next forward)";
}

void plan_print(FILE *f, const struct plan *plan, const struct model_config *cfg, const struct job_config *job)
{
    int kept = 0;
    for (int l = 0; l < cfg->num_layers; l++)
        kept += plan->keep_acts[l];
    fprintf(f, "plan: %d layer(s) per chunk, %d chunk buffers, %d grad slots per rank, %d optimizer process(es) x %d "
               "thread(s)\n",
            plan->layers_per_chunk, plan->chunk_buffers, plan->grad_slots, plan->optim_procs, plan->optim_threads);
    fprintf(f, "plan: activations kept for %d/%d layers (others recomputed); update %s; params %s, grads %s\n", kept,
            cfg->num_layers, update_mode_name(plan->update_mode),
            plan->param_route == PARAMS_SHARDED ? "sharded" : "replicated",
            plan->grad_route == GRADS_GPU ? "reduced on GPUs" : "reduced on CPU");
    (void)job;
}
