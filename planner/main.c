/* slidedp-plan: prints the plan slidedp-launch would use for a job, the GPU topology and the routes
 * it allows, each term of the predicted step time, the bottleneck, the memory it needs, and which
 * calibration numbers were measured on this host and which are assumed; with --hosts H, the job on
 * H hosts of this kind (the host state, the link, the bytes crossing it); --json for machines.
 * Needs no GPU: without one to probe and no [runtime] topology file, it assumes no P2P. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/data.h"
#include "common/err.h"
#include "common/fsutil.h"
#include "common/job.h"
#include "common/model_config.h"
#include "common/version.h"
#include "planner/search.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

/* Bytes in the unit that shows them best (a few rotating buffers, for use in one printf). */
static const char *sz(double bytes)
{
    static char bufs[12][32];
    static int next;
    return fs_bytes_str(bytes, bufs[next++ % 12]);
}

static const char *source_name(int src)
{
    return src == CALIB_MEASURED ? "measured now"
           : src == CALIB_CACHED ? "measured earlier (cache)"
           : src == CALIB_FILE   ? "a described host (--host-calib)"
           : src == CALIB_PINNED ? "pinned ($SLIDEDP_HOST_CALIB)"
                                 : "assumed";
}

struct report {
    const struct job_config *job;
    const struct model_config *cfg;
    const struct plan *plan;
    const struct plan_info *info;
    const struct calib *cal;
    const struct topology *topo;
    const char *topo_note; /* why the topology is assumed; "" otherwise */
    double num_params;
    double tokens; /* per step, all ranks of every host */
    int hosts;
    const struct plan_seq_limit *longest;
};

/* The longest sequence that fits, and what one token more runs out of, in one line. */
static void longest_line(const struct plan_seq_limit *l, const struct job_config *job)
{
    if (l->seq_len == 0)
        printf("longest sequence that fits: none, not even 1 token per sequence at micro_batch %d", job->micro_batch);
    else
        printf("longest sequence that fits: %d tokens (data.seq_len) at micro_batch %d", l->seq_len, job->micro_batch);
    if (l->limit == SEQ_LIMIT_GPU)
        printf("; %d needs %s per %s (bound: %s memory)\n", l->seq_len + 1, sz((double)l->next_gpu_bytes),
               job->device == DEVICE_CPU ? "worker" : "GPU", job->device == DEVICE_CPU ? "worker" : "GPU");
    else if (l->limit == SEQ_LIMIT_HOST)
        printf("; %d does not fit the host's memory (bound: host memory)\n", l->seq_len + 1);
    else
        printf(", the longest job.ini accepts\n");
}

static cJSON *longest_json(const struct plan_seq_limit *l)
{
    static const char *const limits[] = {"", "gpu_memory", "host_memory", "job_ini"};
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "seq_len", l->seq_len);
    cJSON_AddStringToObject(o, "limit", limits[l->limit]);
    cJSON_AddNumberToObject(o, "next_gpu_bytes", (double)l->next_gpu_bytes);
    return o;
}

static const char *param_route_name(int route)
{
    return route == PARAMS_SHARDED ? "sharded" : "replicated";
}

static const char *grad_route_name(int route)
{
    return route == GRADS_GPU ? "gpu" : "cpu";
}

static void print_topology(const struct report *r)
{
    const struct topology *t = r->topo;
    if (t->source == TOPO_FILE)
        printf("topology: described in %s\n", r->job->topology);
    else if (t->source == TOPO_ASSUMED)
        printf("topology: assumed, no P2P (%s; describe the host with [runtime] topology)\n", r->topo_note);
    else
        printf("topology: %s\n", t->source == TOPO_CPU ? "CPU backend" : "probed on this host");
    for (int i = 0; i < t->gpus; i++) {
        char line[512];
        topology_describe_gpu(t, i, line, sizeof line);
        printf("  %s\n", line);
    }
    const struct plan_info *in = r->info;
    printf("routes: params %s, grads %s: %s\n", param_route_name(r->plan->param_route),
           grad_route_name(r->plan->grad_route), in->route_reason);
    if (in->num_routes < 2)
        return;
    for (int i = 0; i < in->num_routes; i++) {
        const struct plan_route_option *o = &in->routes[i];
        bool chosen = o->param_route == r->plan->param_route && o->grad_route == r->plan->grad_route;
        if (o->fits)
            printf("  params %-10s grads %-3s  step %.4f s, %s per GPU%s\n", param_route_name(o->param_route),
                   grad_route_name(o->grad_route), o->step_s, sz((double)o->gpu_bytes), chosen ? "  (chosen)" : "");
        else
            printf("  params %-10s grads %-3s  does not fit\n", param_route_name(o->param_route),
                   grad_route_name(o->grad_route));
    }
}

static void print_text_job(const struct report *r)
{
    const struct job_config *job = r->job;
    bool cpu = job->device == DEVICE_CPU;
    bool billions = r->num_params >= 1e9;
    char hosts[32] = "";
    if (r->hosts > 1)
        snprintf(hosts, sizeof hosts, "%d hosts x ", r->hosts);
    printf("job: %s %s, %.2f%s params, %d layers; %s%d x %s, %d x %d tokens per micro-step, grad_accum %d: %.0f "
           "tokens per step\n",
           r->cfg->model_type, r->cfg->architecture, r->num_params / (billions ? 1e9 : 1e6), billions ? "B" : "M",
           r->cfg->num_layers, hosts, job->gpus, cpu ? "cpu worker" : "cuda GPU", job->micro_batch, job->seq_len,
           job->grad_accum, r->tokens);
    print_topology(r);
    plan_print(stdout, r->plan, r->cfg, job);
}

static void print_text_prediction(const struct report *r)
{
    const struct job_config *job = r->job;
    const struct plan_info *in = r->info;
    const struct step_pred *p = &in->pred;
    bool cpu = job->device == DEVICE_CPU;
    bool tera = p->flops / p->step_s >= 1e12;
    printf("\npredicted step time %.4f s: %.0f tokens/s, %.1f %sFLOP/s per rank (%d plans priced)\n", p->step_s,
           r->tokens / p->step_s, p->flops / p->step_s / (tera ? 1e12 : 1e9), tera ? "T" : "G", in->evaluated);
    printf("  compute          %10.4f s  (%.2f %sFLOP per rank; recompute %.4f s)\n", p->compute_s,
           p->flops / (tera ? 1e12 : 1e9), tera ? "T" : "G", p->recompute_s);
    bool master = plan_streams_master(r->plan);
    const char *how = cpu ? (master ? ", fp32 master -> bf16 -> fp32 on the worker" : ", bf16 -> fp32 on the worker")
                          : (master ? ", fp32 master rounded to bf16 on the device" : "");
    printf("  weights in       %10.4f s  (%s per rank%s)\n", p->h2d_s, sz(p->h2d_bytes), how);
    printf("  grads out        %10.4f s  (%s per rank)\n", p->d2h_s, sz(p->d2h_bytes));
    if (!cpu && job->gpus > 1)
        printf("  peer copies      %10.4f s  (%s)\n", p->p2p_s, sz(p->p2p_bytes));
    printf("  optimizer        %10.4f s  (busiest of %d process(es); %s of host memory touched)\n", p->optim_s,
           r->plan->optim_procs, sz(p->optim_bytes));
    printf("  host memory bw   %10.4f s  (%s)\n", p->host_mem_s,
           r->hosts > 1 ? "all ranks' transfers, the optimizers and the link" : "all ranks' transfers and the optimizers");
    if (r->hosts > 1)
        printf("  link             %10.4f s  (%s sent per host, as many received)\n", p->link_s, sz(p->link_bytes));
    printf("  exposed          %10.4f s  (fill, drain and waits beyond the bottleneck)\n", p->exposed_s);
    printf("  bottleneck: %s\n", plan_bottleneck_name(p->bottleneck));
}

static void print_text_gpu_memory(const struct report *r)
{
    const struct plan_info *in = r->info;
    bool cpu = r->job->device == DEVICE_CPU;
    const struct gpu_mem_pred *g = &in->gpu;
    int L = r->cfg->num_layers;
    if (cpu && in->gpu_auto && in->gpu_budget == 0)
        printf("\nworker memory per rank: %s (auto: the host has nothing left beyond the shared state)\n", sz(g->total));
    else
        printf("\n%s memory per rank: %s of %s%s\n", cpu ? "worker" : "GPU", sz(g->total), sz(in->gpu_budget),
               !in->gpu_auto                     ? ""
               : cpu                             ? " (auto: what the host has left)"
               : topology_min_memory(r->topo) > 0 ? " (auto: the smallest GPU's memory)"
                                                  : " (auto: calibrated device memory)");
    printf("  chunk buffers    %10s  (%d x largest chunk)\n", sz(g->chunk_bufs), r->plan->chunk_buffers);
    printf("  gradient buffers %10s\n", sz(g->grad_bufs));
    int inputs = r->plan->offload_inputs ? 3 : L + 1;
    printf("  layer inputs     %10s  (%d x %s%s)\n", sz(g->layer_inputs), inputs, sz(g->layer_inputs / inputs),
           r->plan->offload_inputs ? ": two in the ring and the final stream; the rest in host memory" : "");
    printf("  activations      %10s  (%d/%d layers kept, %s each%s)\n", sz(g->kept_acts), in->kept, L,
           sz(g->acts_per_layer), in->kept < L ? ", plus one recompute set" : "");
    printf("  backward scratch %10s\n", sz(g->bwd_scratch));
    printf("  logits chunk     %10s  (%d rows)\n", sz(g->logits), r->plan->logits_rows);
    printf("  tokens, tables   %10s\n", sz(g->misc));
    printf("  workspace        %10s%s\n", sz(g->workspace), cpu ? "" : "  (assumed)");
    if (g->context)
        printf("  CUDA context     %10s  (calibration)\n", sz(g->context));
    if (g->peer_bufs)
        printf("  peer routes      %10s  (exchange slots%s)\n", sz(g->peer_bufs),
               r->plan->grad_route == GRADS_GPU ? " and gradient shard accumulators" : "");
    longest_line(r->longest, r->job);
}

/* Where the workers take their weights from, why, and what each source the search tried gives. */
static void print_text_weights_source(const struct report *r)
{
    const struct plan_info *in = r->info;
    printf("weights source: %s: %s\n", plan_weights_source_name(r->plan->weights_source), in->source_reason);
    for (int i = 0; i < in->num_sources && in->num_sources > 1; i++) {
        const struct plan_source_option *o = &in->sources[i];
        if (o->fits)
            printf("  %-9s  step %.4f s, host %s (%.2f bytes per parameter)%s\n", plan_weights_source_name(o->source),
                   o->step_s, sz(o->host_bytes), o->host_bytes / r->num_params,
                   o->host_fits ? "" : ", does not fit this host");
        else
            printf("  %-9s  no plan fits the device\n", plan_weights_source_name(o->source));
    }
}

static void print_text_host_memory(const struct report *r)
{
    const struct plan_info *in = r->info;
    bool cpu = r->job->device == DEVICE_CPU;
    const struct host_mem_pred *h = &in->host;
    printf("\nhost memory: %s = params16 %s + master %s + grads %s + ctl %s (the shared objects)\n",
           sz(h->total), sz(h->params16), sz(h->master), sz(h->grads), sz(h->ctl));
    print_text_weights_source(r);
    if (cpu)
        printf("  + the workers' memory %s (the CPU backend's device memory is host memory)\n", sz(h->workers));
    else if (h->workers)
        printf("  + the workers' offloaded layer inputs %s\n", sz(h->workers));
    if (in->host_available > 0)
        printf("  this host has %s available: %s\n", sz(in->host_available),
               in->host_fits ? "fits"
                             : cpu ? "the job does not fit; it cannot run on this host (planned for the workers alone)"
                                   : "the job does not fit; it cannot run on this host (planned for the GPUs alone)");
    printf("  %.2f bytes per parameter with [train] optimizer_state = %s", h->total / r->num_params,
           optimizer_state_name(r->job->optimizer_state));
    for (int st = OPTIM_STATE_FP32; st < OPTIM_STATE_COUNT; st++)
        if (st != (int)r->job->optimizer_state)
            printf("; %.2f with %s", in->state_modes[st].bytes_per_param, optimizer_state_name(st));
    printf("\n");
    if (in->host_available > 0) {
        printf("  largest model of this shape on this host (the job's layers, more or fewer; %d now):\n",
               r->cfg->num_layers);
        for (int st = OPTIM_STATE_FP32; st < OPTIM_STATE_COUNT; st++) {
            const struct plan_state_mode *m = &in->state_modes[st];
            bool large_b = m->largest_params >= 1e9;
            if (m->largest_layers == 0 && !m->largest_capped) {
                printf("    %s state: no layer count fits (not even 1 layer with the job's embedding and head)\n",
                       optimizer_state_name(st));
                continue;
            }
            printf("    %s state: %s%d layer%s, %.2f%s params, %s (%.2f bytes per parameter)\n", optimizer_state_name(st),
                   m->largest_capped ? "at least " : "", m->largest_layers, m->largest_layers == 1 ? "" : "s",
                   (double)m->largest_params / (large_b ? 1e9 : 1e6), large_b ? "B" : "M",
                   sz((double)m->largest_host_bytes),
                   m->largest_params > 0 ? (double)m->largest_host_bytes / (double)m->largest_params : 0.0);
        }
    }
}

static const char *host_state_name(int st)
{
    return st == HOST_STATE_SHARDED ? "sharded" : "replicated";
}

static void print_text_hosts(const struct report *r)
{
    const struct plan_info *in = r->info;
    if (r->hosts == 1)
        return;
    printf("\n%d hosts x %d ranks: optimizer state %s (%s)\n", r->hosts, r->job->gpus,
           host_state_name(r->plan->host_state), in->host_state_reason);
    printf("  link between hosts: %.1f GB/s each way per host (%s), %.1f us per message\n", in->link_bw / 1e9,
           r->job->host_link_gbps > 0 ? "runtime.host_link_gbps" : "assumed: one 200 Gb/s port; set runtime.host_link_gbps",
           COST_LINK_LATENCY_S * 1e6);
    printf("  cross-host bytes per step: %s sent per host (%s received)\n", sz(in->pred.link_bytes),
           sz(in->pred.link_bytes));
    for (int st = HOST_STATE_REPLICATED; st <= HOST_STATE_SHARDED; st++) {
        const struct plan_host_state *h = &in->host_states[st];
        printf("  %-10s host memory per host %10s", host_state_name(st), sz((double)h->host_bytes));
        if (h->step_s > 0)
            printf(", fastest step %.4f s", h->step_s);
        printf("%s\n", st == r->plan->host_state ? "  (chosen)" : "");
    }
}

static void print_text_calibration(const struct report *r)
{
    const struct calib *cal = r->cal;
    bool cpu = r->job->device == DEVICE_CPU;
    printf("\ncalibration, host %s (%d cpus): %s%s%s\n", cal->hostname, cal->host.ncpu,
           source_name(cal->host_source), cal->host_file[0] ? ", " : "", cal->host_file);
    printf("  memcpy   ");
    for (int i = 0; i < cal->host.memcpy_bw.n; i++)
        printf(" %d thr %.1f GB/s;", cal->host.memcpy_bw.threads[i], cal->host.memcpy_bw.value[i] / 1e9);
    struct calib_curve fp32_update = calib_fp32_update_curve(&cal->host);
    printf("\n  AdamW, fp32 state%s", cal->host.adamw_fp32_rate.n ? "" : " (from fp32 gradients with the bf16 copy, by bytes)");
    for (int i = 0; i < fp32_update.n; i++)
        printf(" %d thr %.2f G params/s;", fp32_update.threads[i], fp32_update.value[i] / 1e9);
    printf("\n  AdamW, bf16 state");
    for (int i = 0; i < cal->host.adamw_bf16_rate.n; i++)
        printf(" %d thr %.2f G params/s;", cal->host.adamw_bf16_rate.threads[i],
               cal->host.adamw_bf16_rate.value[i] / 1e9);
    printf("\n  AdamW, 8-bit state");
    for (int i = 0; i < cal->host.adamw_8bit_rate.n; i++)
        printf(" %d thr %.2f G params/s;", cal->host.adamw_8bit_rate.threads[i],
               cal->host.adamw_8bit_rate.value[i] / 1e9);
    printf("\n  norm of bf16 gradients");
    for (int i = 0; i < cal->host.sumsq_bf16_rate.n; i++)
        printf(" %d thr %.2f G params/s;", cal->host.sumsq_bf16_rate.threads[i],
               cal->host.sumsq_bf16_rate.value[i] / 1e9);
    if (cal->host.sumsq_bf16_rate.n == 0)
        printf(" not measured (priced by its bytes)");
    printf("\n  process wake-up %.1f us\n", cal->host.wake_s * 1e6);
    const struct calib_cpu *c = &cal->host.cpu;
    printf("  CPU backend: sgemm %.1f GFLOP/s + %.2f ns per element packed; attention fwd %.2f ns x D + %.2f ns, bwd "
           "%.2f ns x D + %.2f ns per pair\n",
           c->gemm_flops / 1e9, c->gemm_elem_s * 1e9, c->attn_fwd_pair_dim_s * 1e9, c->attn_fwd_pair_s * 1e9,
           c->attn_bwd_pair_dim_s * 1e9, c->attn_bwd_pair_s * 1e9);
    if (cpu)
        return; /* the CPU backend uses no GPU rates */
    printf("calibration, GPU: %s\n", cal->gpu_file[0] ? cal->gpu_file
                                                     : "no calibration file: one H200's numbers (docs/design.md §10.7, "
                                                       "docs/performance.md §1), assumed");
    int w = 0; /* the longest name */
    for (int i = 0; i < calib_gpu_num_fields; i++)
        w = (int)strlen(calib_gpu_fields[i].name) > w ? (int)strlen(calib_gpu_fields[i].name) : w;
    for (int i = 0; i < calib_gpu_num_fields; i++) {
        const struct calib_gpu_field *f = &calib_gpu_fields[i];
        double v = calib_gpu_get(&cal->gpu, i);
        bool from_file = cal->gpu_from_file >> i & 1;
        if (!strcmp(f->unit, "B"))
            printf("  %-*s %14s %s\n", w, f->name, sz(v), from_file ? "measured (file)" : "assumed");
        else if (!strcmp(f->unit, "s"))
            printf("  %-*s %10.2f us      %s\n", w, f->name, v * 1e6, from_file ? "measured (file)" : "assumed");
        else if (!strcmp(f->unit, "x"))
            printf("  %-*s %10.3f         %s\n", w, f->name, v, from_file ? "measured (file)" : "assumed");
        else
            printf("  %-*s %10.1f %s%s %s\n", w, f->name, v / (f->unit[0] == 'F' ? 1e12 : 1e9),
                   f->unit[0] == 'F' ? "T" : "G", f->unit, from_file ? "measured (file)" : "assumed");
    }
}

static void print_text(const struct report *r)
{
    print_text_job(r);
    print_text_prediction(r);
    print_text_gpu_memory(r);
    print_text_host_memory(r);
    print_text_hosts(r);
    print_text_calibration(r);
}

static cJSON *curve_json(const struct calib_curve *cv)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < cv->n; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "threads", cv->threads[i]);
        cJSON_AddNumberToObject(o, "value", cv->value[i]);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

static cJSON *gpu_list_json(const struct topology *t, uint64_t mask)
{
    cJSON *a = cJSON_CreateArray();
    for (int j = 0; j < t->gpus; j++)
        if (mask >> j & 1)
            cJSON_AddItemToArray(a, cJSON_CreateNumber(j));
    return a;
}

static cJSON *topology_json(const struct report *r)
{
    const struct topology *t = r->topo;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "source", topology_source_name(t->source));
    if (t->source == TOPO_FILE)
        cJSON_AddStringToObject(o, "file", r->job->topology);
    if (t->source == TOPO_ASSUMED)
        cJSON_AddStringToObject(o, "note", r->topo_note);
    cJSON *gpus = cJSON_AddArrayToObject(o, "gpus");
    for (int i = 0; i < t->gpus; i++) {
        cJSON *g = cJSON_CreateObject();
        cJSON_AddStringToObject(g, "bus_id", t->bus_id[i]);
        cJSON_AddNumberToObject(g, "numa", t->numa[i]);
        cJSON_AddNumberToObject(g, "switch", t->pcie_switch[i]);
        cJSON_AddItemToObject(g, "p2p", gpu_list_json(t, t->p2p[i]));
        cJSON_AddItemToObject(g, "nvlink", gpu_list_json(t, t->nvlink[i]));
        cJSON_AddItemToArray(gpus, g);
    }
    return o;
}

static cJSON *job_json(const struct report *r)
{
    cJSON *job = cJSON_CreateObject();
    cJSON_AddStringToObject(job, "model_type", r->cfg->model_type);
    cJSON_AddNumberToObject(job, "params", r->num_params);
    cJSON_AddNumberToObject(job, "layers", r->cfg->num_layers);
    cJSON_AddStringToObject(job, "device", r->job->device == DEVICE_CPU ? "cpu" : "cuda");
    cJSON_AddNumberToObject(job, "gpus", r->job->gpus);
    cJSON_AddNumberToObject(job, "tokens_per_step", r->tokens);
    /* auto: the training data could not be read, and attention is priced for whole windows */
    static const char *const attention[] = {"auto", "document", "window"};
    cJSON_AddStringToObject(job, "attention", attention[r->job->attention]);
    cJSON_AddNumberToObject(job, "attention_pairs", r->job->attention_pairs > 0 ? r->job->attention_pairs : 1);
    /* a CUDA job's attention backward is priced at attn_bwd_det_flops when true (document
     * windows: attn_bwd_builtin_flops) */
    cJSON_AddBoolToObject(job, "deterministic", r->job->deterministic);
    return job;
}

static cJSON *plan_json(const struct report *r)
{
    const struct plan *pl = r->plan;
    cJSON *pj = cJSON_CreateObject();
    cJSON_AddNumberToObject(pj, "layers_per_chunk", pl->layers_per_chunk);
    cJSON_AddNumberToObject(pj, "chunk_buffers", pl->chunk_buffers);
    cJSON_AddNumberToObject(pj, "grad_slots", pl->grad_slots);
    cJSON_AddNumberToObject(pj, "optim_procs", pl->optim_procs);
    cJSON_AddNumberToObject(pj, "optim_threads", pl->optim_threads);
    cJSON_AddStringToObject(pj, "update_mode", pl->update_mode == UPDATE_DURING_BACKWARD ? "during_backward"
                                                                                         : "after_backward");
    cJSON_AddStringToObject(pj, "param_route", param_route_name(pl->param_route));
    cJSON_AddStringToObject(pj, "grad_route", grad_route_name(pl->grad_route));
    cJSON_AddNumberToObject(pj, "logits_rows", pl->logits_rows);
    cJSON_AddBoolToObject(pj, "accumulate_on_device", pl->accumulate_on_device);
    cJSON_AddBoolToObject(pj, "grads_direct", cost_grads_direct(pl, r->job));
    cJSON_AddBoolToObject(pj, "grads_bf16", cost_grads_bf16(pl, r->job));
    cJSON_AddStringToObject(pj, "weights_source", plan_weights_source_name(pl->weights_source));
    cJSON_AddBoolToObject(pj, "offload_inputs", pl->offload_inputs);
    cJSON_AddNumberToObject(pj, "attn_tile_bytes", (double)pl->attn_tile_bytes);
    cJSON *keep = cJSON_AddArrayToObject(pj, "keep_acts");
    for (int l = 0; l < r->cfg->num_layers; l++)
        cJSON_AddItemToArray(keep, cJSON_CreateNumber(pl->keep_acts[l]));
    return pj;
}

static cJSON *prediction_json(const struct report *r)
{
    const struct step_pred *p = &r->info->pred;
    cJSON *pr = cJSON_CreateObject();
    cJSON_AddNumberToObject(pr, "step_s", p->step_s);
    cJSON_AddNumberToObject(pr, "tokens_per_s", r->tokens / p->step_s);
    cJSON_AddNumberToObject(pr, "compute_s", p->compute_s);
    cJSON_AddNumberToObject(pr, "recompute_s", p->recompute_s);
    cJSON_AddNumberToObject(pr, "h2d_s", p->h2d_s);
    cJSON_AddNumberToObject(pr, "d2h_s", p->d2h_s);
    cJSON_AddNumberToObject(pr, "p2p_s", p->p2p_s);
    cJSON_AddNumberToObject(pr, "optim_s", p->optim_s);
    cJSON_AddNumberToObject(pr, "host_mem_s", p->host_mem_s);
    cJSON_AddNumberToObject(pr, "exposed_s", p->exposed_s);
    cJSON_AddStringToObject(pr, "bottleneck", plan_bottleneck_name(p->bottleneck));
    cJSON_AddNumberToObject(pr, "flops_per_rank", p->flops);
    cJSON_AddNumberToObject(pr, "h2d_bytes_per_rank", p->h2d_bytes);
    cJSON_AddNumberToObject(pr, "d2h_bytes_per_rank", p->d2h_bytes);
    cJSON_AddNumberToObject(pr, "p2p_bytes_per_rank", p->p2p_bytes);
    cJSON_AddNumberToObject(pr, "optim_bytes", p->optim_bytes);
    return pr;
}

static cJSON *gpu_memory_json(const struct report *r)
{
    const struct plan_info *in = r->info;
    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "budget", (double)in->gpu_budget);
    cJSON_AddBoolToObject(g, "auto", in->gpu_auto);
    cJSON_AddNumberToObject(g, "total", (double)in->gpu.total);
    cJSON_AddNumberToObject(g, "chunk_buffers", (double)in->gpu.chunk_bufs);
    cJSON_AddNumberToObject(g, "grad_buffers", (double)in->gpu.grad_bufs);
    cJSON_AddNumberToObject(g, "layer_inputs", (double)in->gpu.layer_inputs);
    cJSON_AddNumberToObject(g, "activations", (double)in->gpu.kept_acts);
    cJSON_AddNumberToObject(g, "activations_per_layer", (double)in->gpu.acts_per_layer);
    cJSON_AddNumberToObject(g, "kept_layers", in->kept);
    cJSON_AddNumberToObject(g, "backward_scratch", (double)in->gpu.bwd_scratch);
    cJSON_AddNumberToObject(g, "logits", (double)in->gpu.logits);
    cJSON_AddNumberToObject(g, "misc", (double)in->gpu.misc);
    cJSON_AddNumberToObject(g, "workspace", (double)in->gpu.workspace);
    cJSON_AddNumberToObject(g, "context", (double)in->gpu.context);
    cJSON_AddNumberToObject(g, "peer_buffers", (double)in->gpu.peer_bufs);
    return g;
}

static cJSON *routes_json(const struct report *r)
{
    const struct plan_info *in = r->info;
    cJSON *rj = cJSON_CreateObject();
    cJSON_AddStringToObject(rj, "param_route", param_route_name(r->plan->param_route));
    cJSON_AddStringToObject(rj, "grad_route", grad_route_name(r->plan->grad_route));
    cJSON_AddStringToObject(rj, "reason", in->route_reason);
    cJSON *opts = cJSON_AddArrayToObject(rj, "options");
    for (int i = 0; i < in->num_routes; i++) {
        const struct plan_route_option *ro = &in->routes[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "param_route", param_route_name(ro->param_route));
        cJSON_AddStringToObject(e, "grad_route", grad_route_name(ro->grad_route));
        cJSON_AddBoolToObject(e, "fits", ro->fits);
        cJSON_AddNumberToObject(e, "step_s", ro->step_s);
        cJSON_AddNumberToObject(e, "gpu_bytes", (double)ro->gpu_bytes);
        cJSON_AddItemToArray(opts, e);
    }
    return rj;
}

static cJSON *host_memory_json(const struct report *r)
{
    const struct plan_info *in = r->info;
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "total", (double)in->host.total);
    cJSON_AddNumberToObject(h, "params16", (double)in->host.params16);
    cJSON_AddNumberToObject(h, "master", (double)in->host.master);
    cJSON_AddNumberToObject(h, "grad_slots", (double)in->host.grads);
    cJSON_AddNumberToObject(h, "ctl", (double)in->host.ctl);
    cJSON_AddNumberToObject(h, "workers", (double)in->host.workers);
    cJSON_AddNumberToObject(h, "available", (double)in->host_available);
    cJSON_AddBoolToObject(h, "fits", in->host_fits);
    cJSON_AddStringToObject(h, "optimizer_state", optimizer_state_name(r->job->optimizer_state));
    cJSON_AddNumberToObject(h, "bytes_per_param", (double)in->host.total / r->num_params);
    cJSON *src = cJSON_AddObjectToObject(h, "weights_source");
    cJSON_AddStringToObject(src, "chosen", plan_weights_source_name(r->plan->weights_source));
    cJSON_AddStringToObject(src, "reason", in->source_reason);
    cJSON *opts = cJSON_AddArrayToObject(src, "options");
    for (int i = 0; i < in->num_sources; i++) {
        const struct plan_source_option *o = &in->sources[i];
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "source", plan_weights_source_name(o->source));
        cJSON_AddBoolToObject(e, "fits", o->fits);
        cJSON_AddBoolToObject(e, "host_fits", o->host_fits);
        cJSON_AddNumberToObject(e, "step_s", o->step_s);
        cJSON_AddNumberToObject(e, "host_bytes", (double)o->host_bytes);
        cJSON_AddNumberToObject(e, "bytes_per_param", o->host_bytes / r->num_params);
        cJSON_AddItemToArray(opts, e);
    }
    cJSON *modes = cJSON_AddObjectToObject(h, "modes");
    for (int st = OPTIM_STATE_FP32; st < OPTIM_STATE_COUNT; st++) {
        const struct plan_state_mode *m = &in->state_modes[st];
        cJSON *mj = cJSON_AddObjectToObject(modes, optimizer_state_name(st));
        cJSON_AddNumberToObject(mj, "total", (double)m->host_bytes);
        cJSON_AddNumberToObject(mj, "bytes_per_param", m->bytes_per_param);
        cJSON *lj = cJSON_AddObjectToObject(mj, "largest_model");
        cJSON_AddNumberToObject(lj, "layers", m->largest_layers);
        cJSON_AddBoolToObject(lj, "capped", m->largest_capped);
        cJSON_AddNumberToObject(lj, "params", (double)m->largest_params);
        cJSON_AddNumberToObject(lj, "host_bytes", (double)m->largest_host_bytes);
    }
    return h;
}

static cJSON *hosts_json(const struct report *r)
{
    const struct plan_info *in = r->info;
    cJSON *h = cJSON_CreateObject();
    cJSON_AddNumberToObject(h, "count", r->hosts);
    cJSON_AddNumberToObject(h, "ranks_per_host", r->job->gpus);
    cJSON_AddStringToObject(h, "host_state", host_state_name(r->plan->host_state));
    cJSON_AddStringToObject(h, "reason", in->host_state_reason);
    cJSON_AddNumberToObject(h, "link_bytes_per_s", in->link_bw);
    cJSON_AddBoolToObject(h, "link_assumed", r->job->host_link_gbps <= 0);
    cJSON_AddNumberToObject(h, "link_latency_s", COST_LINK_LATENCY_S);
    cJSON_AddNumberToObject(h, "link_s", in->pred.link_s);
    cJSON_AddNumberToObject(h, "link_bytes_per_host", in->pred.link_bytes);
    cJSON_AddNumberToObject(h, "host_memory_per_host", (double)in->host.total);
    cJSON_AddNumberToObject(h, "step_s", in->pred.step_s);
    cJSON *states = cJSON_AddObjectToObject(h, "states");
    for (int st = HOST_STATE_REPLICATED; st <= HOST_STATE_SHARDED; st++) {
        cJSON *sj = cJSON_AddObjectToObject(states, host_state_name(st));
        cJSON_AddNumberToObject(sj, "host_memory_per_host", (double)in->host_states[st].host_bytes);
        cJSON_AddNumberToObject(sj, "step_s", in->host_states[st].step_s);
    }
    return h;
}

static cJSON *calibration_json(const struct calib *cal)
{
    cJSON *c = cJSON_CreateObject();
    cJSON *ch = cJSON_AddObjectToObject(c, "host");
    cJSON_AddStringToObject(ch, "hostname", cal->hostname);
    cJSON_AddStringToObject(ch, "source", cal->host_source == CALIB_MEASURED ? "measured"
                                          : cal->host_source == CALIB_FILE   ? "described"
                                          : cal->host_source == CALIB_PINNED ? "pinned"
                                                                             : "cached");
    cJSON_AddStringToObject(ch, "file", cal->host_file);
    cJSON_AddNumberToObject(ch, "ncpu", cal->host.ncpu);
    cJSON_AddItemToObject(ch, "memcpy_bw", curve_json(&cal->host.memcpy_bw));
    struct calib_curve fp32_update = calib_fp32_update_curve(&cal->host);
    cJSON_AddItemToObject(ch, "adamw_fp32_rate", curve_json(&fp32_update)); /* as priced */
    cJSON_AddItemToObject(ch, "adamw_bf16_rate", curve_json(&cal->host.adamw_bf16_rate));
    cJSON_AddItemToObject(ch, "adamw_8bit_rate", curve_json(&cal->host.adamw_8bit_rate));
    cJSON_AddItemToObject(ch, "sumsq_bf16_rate", curve_json(&cal->host.sumsq_bf16_rate));
    cJSON_AddNumberToObject(ch, "wake_s", cal->host.wake_s);
    cJSON_AddNumberToObject(ch, "cpu_gemm_flops", cal->host.cpu.gemm_flops);
    cJSON *cg = cJSON_AddObjectToObject(c, "gpu");
    cJSON_AddStringToObject(cg, "file", cal->gpu_file);
    for (int i = 0; i < calib_gpu_num_fields; i++) {
        cJSON *f = cJSON_AddObjectToObject(cg, calib_gpu_fields[i].name);
        cJSON_AddNumberToObject(f, "value", calib_gpu_get(&cal->gpu, i));
        cJSON_AddStringToObject(f, "source", cal->gpu_from_file >> i & 1 ? "measured" : "assumed");
    }
    return c;
}

static void print_cjson(cJSON *o)
{
    char *text = cJSON_Print(o);
    printf("%s\n", text);
    free(text);
    cJSON_Delete(o);
}

static void print_json(const struct report *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, "job", job_json(r));
    cJSON_AddItemToObject(o, "plan", plan_json(r));
    cJSON_AddItemToObject(o, "predicted", prediction_json(r));
    cJSON_AddItemToObject(o, "gpu_memory", gpu_memory_json(r));
    cJSON_AddItemToObject(o, "longest_seq", longest_json(r->longest));
    cJSON_AddItemToObject(o, "topology", topology_json(r));
    cJSON_AddItemToObject(o, "routes", routes_json(r));
    cJSON_AddItemToObject(o, "host_memory", host_memory_json(r));
    cJSON_AddItemToObject(o, "hosts", hosts_json(r));
    cJSON_AddItemToObject(o, "calibration", calibration_json(r->cal));
    print_cjson(o);
}

/* Nothing fits the GPUs: what the job would need, on stdout (the error itself goes to stderr). */
static void print_failure(const struct job_config *job, const struct plan_info *in,
                          const struct plan_seq_limit *longest, const char *error, bool json)
{
    const struct host_mem_pred *h = &in->host;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "error", error);
        cJSON_AddNumberToObject(o, "min_gpu_bytes", (double)in->min_gpu_bytes);
        cJSON_AddNumberToObject(o, "gpu_budget", (double)in->gpu_budget);
        cJSON *hj = cJSON_AddObjectToObject(o, "host_memory");
        cJSON_AddNumberToObject(hj, "total", (double)h->total);
        cJSON_AddNumberToObject(hj, "available", (double)in->host_available);
        cJSON_AddBoolToObject(hj, "fits", in->host_fits);
        cJSON_AddItemToObject(o, "longest_seq", longest_json(longest));
        print_cjson(o);
        return;
    }
    printf("no plan fits %s per GPU; the smallest needs %s\n", sz((double)in->gpu_budget),
           sz((double)in->min_gpu_bytes));
    printf("host memory: %s = params16 %s + master %s + grads %s + ctl %s (the shared objects)",
           sz(h->total), sz(h->params16), sz(h->master), sz(h->grads), sz(h->ctl));
    if (in->host_available > 0)
        printf("; this host has %s available: %s", sz(in->host_available), in->host_fits ? "fits" : "does not fit");
    printf("\n");
    longest_line(longest, job);
}

static int help(void)
{
    printf("usage: slidedp-plan job.ini [section.key=value ...] [--hosts H] [--host-calib FILE] [--json] [--recalibrate]\n"
           "       slidedp-plan --version | --help\n"
           "Prints the plan slidedp-launch would use for the job: chunks, buffers, activations, routes, optimizer\n"
           "processes and threads, each term of the predicted step time, the bottleneck, GPU and host memory, and\n"
           "the longest data.seq_len that fits.\n"
           "  --hosts H          the job on H hosts of this kind (mpirun -np H), each with runtime.gpus ranks\n"
           "  --host-calib FILE  plan for the host FILE describes (its rates, cores and memory), not this one\n"
           "  --json             the same for machines\n"
           "  --recalibrate      measure this host's rates again\n"
           "  --version          print the version and the backends of this build\n"
           "  --help, -h         this text\n" SD_OVERRIDE_PATHS_HELP
           "Exit codes: 0 the job fits; 2 bad input, or the job does not fit (no plan fits the GPU memory, or\n"
           "the state does not fit the host's memory: the plan for the GPUs alone is printed all the same).\n");
    return 0;
}

int main(int argc, char **argv)
{
    const char *ini = NULL, *host_calib = NULL;
    bool json = false;
    int hosts = 1;
    char **overrides = calloc((size_t)argc, sizeof *overrides);
    int num_overrides = 0;
    if (!overrides)
        return 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = true;
        else if (!strcmp(argv[i], "--recalibrate"))
            calib_force_measure();
        else if (!strcmp(argv[i], "--hosts")) {
            char *end = NULL;
            long h = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (!end || end == argv[i + 1] || *end || h < 1 || h > JOB_MAX_GPUS) {
                fprintf(stderr, "slidedp-plan: --hosts needs a host count from 1 to %d\n", JOB_MAX_GPUS);
                return 2;
            }
            hosts = (int)h;
            i++;
        } else if (!strcmp(argv[i], "--host-calib")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "slidedp-plan: --host-calib needs a calibration file\n");
                return 2;
            }
            host_calib = argv[++i];
        }
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return help();
        else if (!strcmp(argv[i], "--version"))
            return sd_version_print();
        else if (argv[i][0] == '-') {
            fprintf(stderr, "slidedp-plan: unknown option %s (accepted: --hosts H, --host-calib FILE, --json, "
                            "--recalibrate, --version, --help)\n", argv[i]);
            return 2;
        } else if (!ini)
            ini = argv[i];
        else if (strchr(argv[i], '='))
            overrides[num_overrides++] = argv[i];
        else {
            fprintf(stderr, "slidedp-plan: unexpected argument '%s' (overrides look like section.key=value)\n",
                    argv[i]);
            return 2;
        }
    }
    if (!ini) {
        fprintf(stderr, "slidedp-plan: no job file given: slidedp-plan job.ini [section.key=value ...] (slidedp-plan "
                        "--help lists the options)\n");
        return 2;
    }
    struct job_config job;
    if (job_config_load(ini, num_overrides, overrides, &job) != 0) {
        fprintf(stderr, "slidedp-plan: %s\n", sd_errmsg());
        return 2;
    }
    char cfg_path[JOB_PATH_MAX + 16];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", job.model_path);
    struct model_config cfg;
    if (model_config_load(cfg_path, &cfg) != 0) {
        fprintf(stderr, "slidedp-plan: %s\n", sd_errmsg());
        return 2;
    }
    /* attention priced by the training data's documents where it can be read (else whole windows) */
    struct data_set train;
    if (data_open(job.data_train, job.seq_len, 0, false, job.seed, &train) == 0) {
        int resolved = job_resolve_attention(&job, &train);
        data_close(&train);
        if (resolved != 0) {
            fprintf(stderr, "slidedp-plan: %s\n", sd_errmsg());
            return 2;
        }
    }
    char warning[512];
    if (model_config_seq_len_warning(&cfg, job.seq_len, warning, sizeof warning))
        fprintf(stderr, "slidedp-plan: %s\n", warning);
    struct calib cal;
    if ((host_calib ? calib_load_described(host_calib, &cal) : calib_load(&cal)) != 0) {
        fprintf(stderr, "slidedp-plan: calibration: %s\n", sd_errmsg());
        return 2;
    }
    /* a described host plans with its own cores */
    int host_cpus = host_calib ? cal.host.ncpu : (int)sysconf(_SC_NPROCESSORS_ONLN);
    /* the launcher's topology; where there is no GPU to probe, assume no P2P rather than fail */
    struct topology topo;
    char bin_dir[PATH_MAX], topo_note[1024] = "";
    if (fs_self_dir(bin_dir, sizeof bin_dir) != 0 || topology_for_job(&job, bin_dir, &topo) != 0) {
        if (job.topology[0] || job.device == DEVICE_CPU) {
            fprintf(stderr, "slidedp-plan: %s\n", sd_errmsg());
            return 2;
        }
        snprintf(topo_note, sizeof topo_note, "%s", sd_errmsg());
        topology_assumed(job.gpus, &topo);
    }
    struct plan plan;
    struct plan_info info = {0};
    bool chosen = plan_choose(&job, &cfg, &cal, &topo, host_cpus, hosts, &plan, &info) == 0;
    char error[1024] = ""; /* kept: the longest-sequence search below sets sd_errmsg again */
    if (!chosen) {
        snprintf(error, sizeof error, "%s", sd_errmsg());
        fprintf(stderr, "slidedp-plan: %s%s\n", info.failed ? "the job does not fit the GPU memory: " : "", error);
        if (!info.failed)
            return 2;
    }
    /* a job that does not fit still learns the longest sequence that would */
    struct plan_seq_limit longest;
    if (plan_longest_seq_len(&job, &cfg, &cal, &topo, host_cpus, hosts, &longest) != 0) {
        fprintf(stderr, "slidedp-plan: %s\n", sd_errmsg());
        return 2;
    }
    if (!chosen) {
        print_failure(&job, &info, &longest, error, json);
        return 2;
    }
    struct report r = {
        .job = &job,
        .cfg = &cfg,
        .plan = &plan,
        .info = &info,
        .cal = &cal,
        .topo = &topo,
        .topo_note = topo_note,
        .num_params = (double)model_config_num_params(&cfg),
        .tokens = (double)hosts * job_tokens_per_step(&job),
        .hosts = hosts,
        .longest = &longest,
    };
    if (json)
        print_json(&r);
    else
        print_text(&r);
    free(overrides);
    if (info.host_available > 0 && !info.host_fits) {
        /* the launcher refuses this job (exit 2): so does its plan */
        fprintf(stderr, "slidedp-plan: the job does not fit this host: it needs %s of host memory, %s available\n",
                sz((double)info.host.total), sz((double)info.host_available));
        return 2;
    }
    return 0;
}
