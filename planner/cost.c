/* Step-time and memory model of a candidate plan (see cost.h): per-op costs from the calibration,
 * then a walk through a few steps of the pipeline, event by event, in the order the worker, its
 * chunk cache and the optimizer processes do the work. */
#include "cost.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/attn_tiles.h"
#include "common/err.h"
#include "shm/ctl.h"
#include "worker/backend.h"
#include "worker/chunk_cache.h"

/* ---- per-op costs ---- */

struct dev {
    bool cpu;
    enum attn_kernels attn;
    const struct calib_cpu *c;
    const struct calib_gpu *g;
    double det_tile_speed; /* ATTN_KERNELS_DET_CUDNN: the plan's calls against the default bound's */
};

/* Device memory bytes an elementwise kernel moves per element (bf16 activations, fp32 where the
 * op keeps fp32). */
static const double gpu_elem_bytes[ELEM_COUNT] = {
    [ELEM_RMSNORM_FWD] = 4, [ELEM_RMSNORM_BWD] = 8, [ELEM_ROPE] = 4,      [ELEM_SWIGLU_FWD] = 6,
    [ELEM_SWIGLU_BWD] = 10, [ELEM_ADD] = 6,         [ELEM_XENT] = 8,      [ELEM_EMBED_FWD] = 4,
    [ELEM_EMBED_BWD] = 10,  [ELEM_CONVERT] = 6,     [ELEM_COPY] = 8,      [ELEM_ZERO] = 4,
};

static double gemm_s(const struct dev *d, double m, double n, double k)
{
    if (m <= 0 || n <= 0 || k <= 0)
        return 0;
    double flops = 2 * m * n * k;
    if (d->cpu)
        return flops / d->c->gemm_flops + d->c->gemm_elem_s * (m * k + k * n + m * n);
    double dim = fmin(m, fmin(n, k)), small = d->g->gemm_small_flops, large = d->g->gemm_flops;
    double rate = dim >= 1024 ? large : dim >= 128 ? small + (large - small) * log2(dim / 128) / 3 : small * dim / 128;
    return flops / rate + d->g->launch_s;
}

static double elem_s(const struct dev *d, int op, double n)
{
    if (n <= 0)
        return 0;
    if (d->cpu)
        return n * d->c->elem_s[op];
    return n * gpu_elem_bytes[op] / d->g->mem_bw + d->g->launch_s;
}

/* (query, key) pairs of causal attention over all heads; frac: the part of them document attention
 * visits (job.h attention_pairs; 1 for whole windows) */
static double attn_pairs(int B, int T, int Hq, double frac)
{
    return (double)B * Hq * T * (T + 1.0) / 2.0 * frac;
}

enum attn_kernels cost_attention_kernels(const struct job_config *job)
{
    if (job->device == DEVICE_CPU)
        return ATTN_KERNELS_CPU;
    if (!job->deterministic)
        return ATTN_KERNELS_CUDNN;
    /* windows of several documents; one document per window runs dense */
    bool documents = job->attention_pairs > 0 && job->attention_pairs < 1;
    return documents ? ATTN_KERNELS_DET_BUILTIN : ATTN_KERNELS_DET_CUDNN;
}

static double attn_fwd_s(const struct dev *d, int B, int T, int Hq, int D, double frac)
{
    double P = attn_pairs(B, T, Hq, frac);
    if (d->cpu)
        return P * (d->c->attn_fwd_pair_dim_s * D + d->c->attn_fwd_pair_s);
    return 4 * P * D / d->g->attn_fwd_flops + d->g->launch_s;
}

/* The backward is what forward + backward costs beyond the forward (FlashAttention counts it as
 * 2.5 forwards). Deterministic, the CUDA backend runs cuDNN's deterministic engine in tiles
 * (worker/cuda/attention_det.cu), or for document windows its built-in kernels
 * (worker/cuda/attention_bwd.cu), each at a rate of its own; the CPU backend's ops are the same
 * either way. Document attention runs its kernels over fewer pairs. */
static double attn_bwd_s(const struct dev *d, int B, int T, int Hq, int D, double frac)
{
    double P = attn_pairs(B, T, Hq, frac);
    if (d->cpu)
        return P * (d->c->attn_bwd_pair_dim_s * D + d->c->attn_bwd_pair_s);
    double F = 4 * P * D;
    if (d->attn == ATTN_KERNELS_DET_CUDNN)
        return 2.5 * F / (d->g->attn_bwd_det_flops * d->det_tile_speed) + d->g->launch_s;
    if (d->attn == ATTN_KERNELS_DET_BUILTIN)
        return 2.5 * F / d->g->attn_bwd_builtin_flops + d->g->launch_s;
    return fmax(3.5 * F / d->g->attn_fwdbwd_flops - F / d->g->attn_fwd_flops, 2.5 * F / d->g->attn_fwd_flops) +
           d->g->launch_s;
}

/* A plan's attn_tile_bytes as the worker applies it: 0 (not set) is the backend's default. */
static size_t tile_bound(int64_t plan_bytes)
{
    return plan_bytes > 0 ? (size_t)plan_bytes : ATTN_TILE_WORKSPACE_DEFAULT;
}

double cost_det_tile_speed(int B, int T, int Hq, int Hkv, int64_t bound, double gain)
{
    struct attn_tiling def, t;
    attn_tiling_choose(B, T, Hq, Hkv, ATTN_TILE_WORKSPACE_DEFAULT, &def);
    attn_tiling_choose(B, T, Hq, Hkv, tile_bound(bound), &t);
    double ratio = (double)attn_tiling_dp_bytes(&t) / (double)attn_tiling_dp_bytes(&def);
    if ((def.nchunks == 1 && def.ng == Hkv) || ratio <= 1) /* whole sequences already, or no larger */
        return 1;
    return fmin(1 + gain * log2(ratio), 1.15);
}

/* ---- the model's ops, mirroring worker/model.c ---- */

struct shape {
    int B, T;
    double N;
    int C, I, D, Hq, Hkv, V;
    double qdim, kvdim;
    bool qk, bias;
    double pair_frac; /* attention's (query, key) pairs against whole windows' */
};

static struct shape shape_of(const struct cost_case *mc)
{
    const struct model_config *cfg = mc->cfg;
    struct shape s = {
        .B = mc->job->micro_batch,
        .T = mc->job->seq_len,
        .N = (double)mc->job->micro_batch * mc->job->seq_len,
        .C = cfg->hidden_size,
        .I = cfg->intermediate_size,
        .D = cfg->head_dim,
        .Hq = cfg->num_heads,
        .Hkv = cfg->num_kv_heads,
        .V = cfg->vocab_size,
        .qdim = (double)cfg->num_heads * cfg->head_dim,
        .kvdim = (double)cfg->num_kv_heads * cfg->head_dim,
        .qk = cfg->qk_norm,
        .bias = cfg->qkv_bias,
        .pair_frac = mc->job->attention_pairs > 0 ? mc->job->attention_pairs : 1,
    };
    return s;
}

/* out(N,OC) = inp(N,IC) @ w^T (+ bias rows) */
static double mm_fwd_s(const struct dev *d, double N, double IC, double OC, bool bias)
{
    return gemm_s(d, N, OC, IC) + (bias ? elem_s(d, ELEM_COPY, N * OC) : 0);
}

/* dinp = dout @ w ; dw += dout^T @ inp ; dbias += column sums. On a GPU the accumulation reads
 * and writes the fp32 dw once per call, which a short N (a cross-entropy chunk) does not hide. */
static double mm_bwd_s(const struct dev *d, double N, double IC, double OC, bool bias)
{
    double dw_traffic = d->cpu ? 0 : OC * IC * 8 / d->g->mem_bw;
    return gemm_s(d, N, IC, OC) + gemm_s(d, OC, IC, N) + dw_traffic + (bias ? elem_s(d, ELEM_ADD, N * OC) : 0);
}

/* to_output: through the down projection and the residual add. A layer recomputed for its backward
 * stops at the SwiGLU (worker/model.c): its output is the next layer's input, already kept. */
static double layer_fwd_s(const struct dev *d, const struct shape *s, bool to_output)
{
    double N = s->N, C = s->C, I = s->I, t = 0;
    t += elem_s(d, ELEM_RMSNORM_FWD, N * C);
    t += mm_fwd_s(d, N, C, s->qdim, s->bias) + 2 * mm_fwd_s(d, N, C, s->kvdim, s->bias);
    if (s->qk)
        t += elem_s(d, ELEM_RMSNORM_FWD, N * s->qdim) + elem_s(d, ELEM_RMSNORM_FWD, N * s->kvdim);
    t += elem_s(d, ELEM_ROPE, N * s->qdim) + elem_s(d, ELEM_ROPE, N * s->kvdim);
    t += attn_fwd_s(d, s->B, s->T, s->Hq, s->D, s->pair_frac);
    t += mm_fwd_s(d, N, s->qdim, C, false) + elem_s(d, ELEM_ADD, N * C);
    t += elem_s(d, ELEM_RMSNORM_FWD, N * C);
    t += 2 * mm_fwd_s(d, N, C, I, false) + elem_s(d, ELEM_SWIGLU_FWD, N * I);
    if (to_output)
        t += mm_fwd_s(d, N, I, C, false) + elem_s(d, ELEM_ADD, N * C);
    return t;
}

static double layer_bwd_s(const struct dev *d, const struct shape *s)
{
    double N = s->N, C = s->C, I = s->I, t = 0;
    t += mm_bwd_s(d, N, I, C, false) + elem_s(d, ELEM_SWIGLU_BWD, N * I);
    t += 2 * mm_bwd_s(d, N, C, I, false) + elem_s(d, ELEM_RMSNORM_BWD, N * C);
    t += mm_bwd_s(d, N, s->qdim, C, false);
    t += attn_bwd_s(d, s->B, s->T, s->Hq, s->D, s->pair_frac);
    t += elem_s(d, ELEM_ROPE, N * s->qdim) + elem_s(d, ELEM_ROPE, N * s->kvdim);
    if (s->qk)
        t += elem_s(d, ELEM_RMSNORM_BWD, N * s->qdim) + elem_s(d, ELEM_RMSNORM_BWD, N * s->kvdim);
    t += mm_bwd_s(d, N, C, s->qdim, s->bias) + 2 * mm_bwd_s(d, N, C, s->kvdim, s->bias);
    t += elem_s(d, ELEM_RMSNORM_BWD, N * C);
    return t;
}

/* Final norm, LM head in logits_rows chunks with the loss and its gradient, norm backward. */
static double head_s(const struct dev *d, const struct shape *s, int logits_rows)
{
    double t = elem_s(d, ELEM_RMSNORM_FWD, s->N * s->C) + elem_s(d, ELEM_RMSNORM_BWD, s->N * s->C);
    for (double r0 = 0; r0 < s->N; r0 += logits_rows) {
        double n = fmin(logits_rows, s->N - r0);
        t += mm_fwd_s(d, n, s->C, s->V, false) + elem_s(d, ELEM_XENT, n * s->V) + mm_bwd_s(d, n, s->C, s->V, false);
    }
    return t;
}

double cost_layer_flops(const struct model_config *cfg, int B, int T)
{
    double N = (double)B * T, C = cfg->hidden_size, I = cfg->intermediate_size;
    double q = (double)cfg->num_heads * cfg->head_dim, kv = (double)cfg->num_kv_heads * cfg->head_dim;
    return 2 * N * (C * q + 2 * C * kv + q * C + 3 * C * I) + 4 * attn_pairs(B, T, cfg->num_heads, 1) * cfg->head_dim;
}

double cost_head_flops(const struct model_config *cfg, int64_t N)
{
    return 2.0 * (double)N * cfg->hidden_size * cfg->vocab_size;
}

/* ---- memory ---- */

static int64_t al(int64_t bytes, int align)
{
    return (bytes + align - 1) / align * align;
}

/* The CUDA backend's allocations are rounded to 256 bytes; the CPU backend's are exact. */
static int alloc_align(const struct job_config *job)
{
    return job->device == DEVICE_CPU ? 1 : 256;
}

int64_t cost_layer_act_bytes(const struct model_config *cfg, int64_t N, int act, int align)
{
    int64_t C = cfg->hidden_size, I = cfg->intermediate_size;
    int64_t q = (int64_t)cfg->num_heads * cfg->head_dim, kv = (int64_t)cfg->num_kv_heads * cfg->head_dim;
    int64_t t = al(N * C * act, align) + al(N * 4, align); /* ln1, rstd1 */
    if (cfg->qk_norm)                                       /* q_raw, k_raw, q_rstd, k_rstd */
        t += al(N * q * act, align) + al(N * kv * act, align) + al(N * cfg->num_heads * 4, align) +
             al(N * cfg->num_kv_heads * 4, align);
    t += 2 * al(N * q * act, align) + 2 * al(N * kv * act, align); /* q, att, k, v */
    t += al(N * cfg->num_heads * 4, align);                        /* lse */
    t += 2 * al(N * C * act, align) + al(N * 4, align);            /* h, ln2, rstd2 */
    t += 3 * al(N * I * act, align);                               /* gate, up, sw */
    return t;
}

void cost_gpu_memory(const struct cost_case *mc, int kept, struct gpu_mem_pred *out)
{
    const struct model_config *cfg = mc->cfg;
    const struct job_config *job = mc->job;
    bool cpu = job->device == DEVICE_CPU;
    int act = cpu ? 4 : 2, wsize = cpu ? 4 : 2, a = alloc_align(job);
    int L = cfg->num_layers;
    int64_t N = (int64_t)job->micro_batch * job->seq_len, T = job->seq_len, C = cfg->hidden_size;
    int64_t I = cfg->intermediate_size, V = cfg->vocab_size, D = cfg->head_dim;
    int64_t q = (int64_t)cfg->num_heads * D, kv = (int64_t)cfg->num_kv_heads * D;
    memset(out, 0, sizeof *out);
    out->chunk_bufs = mc->plan->chunk_buffers * al(mc->lay->max_chunk_numel * wsize, a);
    /* untied: the embedding's gradient lives in the two alternating buffers' memory (worker/model.c) */
    int64_t pair[2], embed = mc->lay->chunks[0].numel;
    layout_grad_buf_numel(mc->lay->chunks, mc->lay->num_chunks, pair);
    if (!cfg->tie_word_embeddings && embed <= pair[0] + pair[1])
        out->grad_bufs = al((pair[0] + pair[1]) * 4, a);
    else
        out->grad_bufs = al(embed * 4, a) + al(pair[0] * 4, a) + al((pair[1] > 0 ? pair[1] : 1) * 4, a);
    if (mc->plan->accumulate_on_device) /* one more buffer per chunk (the embedding's is reused) */
        for (int c = 1; c < mc->lay->num_chunks; c++)
            out->grad_bufs += al(mc->lay->chunks[c].numel * 4, a);
    /* every layer's input stays on the device; offloaded (worker/model.c), the two ring buffers
     * (BE_ACT_SLOTS) and the final stream do */
    int inputs = mc->offload ? 3 : L + 1;
    out->layer_inputs = inputs * al(N * C * act, a);
    out->acts_per_layer = cost_layer_act_bytes(cfg, N, act, a);
    out->kept_acts = (int64_t)kept * out->acts_per_layer + (kept < L ? out->acts_per_layer : 0);
    out->bwd_scratch = 3 * al(N * C * act, a) + al(N * 4, a) /* d_final, d_dres, d_dfinal, d_final_rstd */
                       + al(N * I * act, a) + al(N * C * act, a) /* bw_ni, bw_nc */
                       + 2 * al(N * q * act, a) + 3 * al(N * kv * act, a); /* bw_q, bw_q2, bw_k, bw_v, bw_k2 */
    out->logits = al((int64_t)mc->plan->logits_rows * V * act, a);
    /* tokens, targets, correct, document positions, row_scale, loss; the RoPE tables */
    out->misc = 6 * al(N * 4, a) + 2 * al(T * (D / 2) * 4, a);
    /* CPU: the attention backward's double scratch. CUDA: the cuBLASLt workspace (32 MiB), the
     * conversion staging (16 MiB), the bf16 gradient staging (16 MiB) and the op scratch, the
     * larger of the attention backward's (cuDNN's: its workspace, about the size of its fp32 dQ
     * accumulator, the accumulator and the row sums) and the rmsnorm weight-gradient partials (at
     * most 2 x 132 SMs slices of C) */
    int64_t attn_scratch = 2 * N * q * 4 + N * cfg->num_heads * 4 + ((int64_t)1 << 20);
    /* cuDNN's document backward (attention_cudnn.c) adds the token-major lse, and with grouped KV
     * heads the full-head dK and dV (sized in fp32) */
    if (!cpu && job->attention == ATTENTION_DOCUMENT && !job->deterministic)
        attn_scratch += 2 * N * cfg->num_heads * 4 + (cfg->num_kv_heads != cfg->num_heads ? 2 * N * q * 4 : 0);
    /* deterministic, windows take cuDNN's deterministic engine in calls of at most the plan's
     * attn_tile_bytes of dP, with the calls' lse, row sums and, in chunks, the fp32 sums
     * (common/attn_tiles.h; a bound that grows with T, for the longest-sequence search) */
    if (!cpu && job->deterministic) {
        int64_t tiles = (int64_t)attn_tiling_scratch_bound(job->micro_batch, job->seq_len, cfg->num_heads,
                                                           cfg->num_kv_heads, (int)D,
                                                           tile_bound(mc->plan->attn_tile_bytes));
        attn_scratch = tiles > attn_scratch ? tiles : attn_scratch;
    }
    int64_t op_scratch = attn_scratch > 264 * C * 4 ? attn_scratch : 264 * C * 4;
    out->workspace = cpu ? (D + 2 * T * D) * 8 : ((int64_t)64 << 20) + al(op_scratch, a);
    if (!cpu && plan_streams_master(mc->plan)) /* the streamed master's fp32 staging */
        out->workspace += (int64_t)(BE_MASTER_STAGE_FLOATS * sizeof(float));
    int G = job->gpus;
    /* the exchange window (worker/pipeline_exchange.c) and, for GPU-side gradients, the shard sums */
    if (plan_uses_exchange(mc->plan, G)) {
        bool gpu_grads = mc->plan->grad_route == GRADS_GPU;
        struct window_layout win;
        ctl_window_layout(mc->lay->max_chunk_numel, G, wsize, gpu_grads, mc->plan->param_route == PARAMS_SHARDED,
                          &win);
        out->peer_bufs = al((int64_t)win.total, a);
        for (int c = 0; c < mc->lay->num_chunks && gpu_grads; c++) /* a shard is at most n/G + 64 */
            out->peer_bufs += al(((mc->lay->chunks[c].numel + G - 1) / G + 64) * 4, a);
    }
    /* runtime.gpu_mem bounds the whole process, so the context counts against it */
    out->context = cpu ? 0 : (int64_t)mc->cal->gpu.context_bytes;
    out->total = out->chunk_bufs + out->grad_bufs + out->layer_inputs + out->kept_acts + out->bwd_scratch +
                 out->logits + out->misc + out->workspace + out->peer_bufs + out->context;
}

double cost_link_bw(const struct job_config *job)
{
    return job->host_link_gbps > 0 ? job->host_link_gbps * 1e9 : COST_LINK_DEFAULT_BW;
}

/* The hosts a plan is for (0 in a plan built by hand means one). */
static int hosts_of(const struct plan *p)
{
    return p->hosts > 1 ? p->hosts : 1;
}

bool cost_grads_direct(const struct plan *p, const struct job_config *job)
{
    return plan_grads_direct(p, hosts_of(p) * job->gpus, job->grad_accum);
}

bool cost_grads_bf16(const struct plan *p, const struct job_config *job)
{
    return plan_grads_bf16(p, job) && cost_grads_direct(p, job);
}

/* The hosts the optimizer state is split across: H when sharded over several hosts, else 1. */
static int state_hosts(const struct plan *p)
{
    return p->host_state == HOST_STATE_SHARDED ? hosts_of(p) : 1;
}

void cost_host_memory(const struct cost_case *mc, int64_t gpu_bytes, struct host_mem_pred *out)
{
    memset(out, 0, sizeof *out);
    /* the four shared objects, sized by the very function slidedp-launch allocates them with; on
     * several hosts the ctl region and the gradient slots serve every rank of the job (the relay
     * posts the other hosts' gradients as theirs) */
    struct job_config job = *mc->job;
    job.gpus *= hosts_of(mc->plan);
    struct ctl_shape shape;
    struct ctl_sizes sz, own_sz;
    ctl_shape_of(&job, mc->plan, mc->lay, &shape);
    /* the state sharded across hosts: master, m, v and the accumulator of this host's share */
    struct ctl_shape own = shape;
    int SH = state_hosts(mc->plan);
    own.total_numel = (shape.total_numel + SH - 1) / SH;
    if (ctl_compute_sizes(&shape, &sz) != 0 || ctl_compute_sizes(&own, &own_sz) != 0) {
        out->total = INT64_MAX; /* a shape the launcher refuses: no host holds it */
        return;
    }
    out->params16 = (int64_t)sz.params16_bytes;
    out->master = (int64_t)own_sz.master_bytes;
    out->grads = (int64_t)(shape.grads_direct ? own_sz.grads_bytes : sz.grads_bytes);
    out->ctl = (int64_t)sz.ctl_bytes;
    out->workers = mc->job->device == DEVICE_CPU ? mc->job->gpus * gpu_bytes : 0;
    if (mc->offload) /* each worker's layer inputs in (registered) host memory */
        out->workers += (int64_t)mc->job->gpus * mc->cfg->num_layers *
                        ((int64_t)mc->job->micro_batch * mc->job->seq_len * mc->cfg->hidden_size *
                         (mc->job->device == DEVICE_CPU ? 4 : 2));
    out->total = out->params16 + out->master + out->grads + out->ctl + out->workers;
}

/* ---- the pipeline, event by event ---- */

/* Simulated micro-steps per step; more are extrapolated from the last simulated one. */
#define SIM_MICRO 4
#define SIM_STEPS 3

struct sim {
    const struct cost_case *mc;
    bool cpu, tied, during, on_device;
    bool direct;    /* gradients land in the accumulator: no slots to wait for (plan_grads_direct) */
    bool shard_acc; /* GPU-side gradients: micro-steps reduce-scatter into shard accumulators */
    bool sharded;   /* sharded parameters: each fill is a host-synchronised exchange */
    int sends;      /* gradient posts per chunk and rank per step (1 when the micro-steps sum on the device) */
    bool bf16_grads; /* gradients cross in bf16 (plan_grads_bf16) */
    double sumsq_bytes, update_bytes; /* optimizer bytes per parameter, less with bf16 gradients or state */
    int nc, hc, G, A, K, S;
    double wake;
    /* several hosts: H hosts mirroring this one (every host runs the same schedule), each sending
     * its gradients to the hosts that sum them; sharded state: each host owns 1/H of every chunk,
     * sums only that, updates it and sends it back to the others */
    int H;
    bool host_sharded;
    double link_lat;
    /* per chunk, seconds */
    double *fwd, *bwd;             /* compute; the head chunk's forward holds the whole head pass */
    double *fetch_fwd, *fetch_bwd; /* weights in during the forward / the backward */
    double *bytes_fwd, *bytes_bwd; /* bytes those fills bring over the host link */
    double *send;                  /* gradient out to the host */
    double *exchange;              /* GPU-side gradients: the reduce-scatter over the peers */
    double *offload_out;           /* offloaded layer inputs out, during the forward */
    double *reduce, *update;       /* optimizer: one rank's gradient; the AdamW update */
    double *update_bwd;            /* the update taken while the gradient copies are in flight */
    double *update_taken;          /* the last step's update as taken, in the backward or after it */
    double *remote_reduce;         /* optimizer: one rank's gradient received from another host */
    double *link_grads;            /* this host's gradients of one post out over the link */
    double *link_params;           /* sharded state: the updated owned part out to the others */
    /* state */
    struct chunk_cache cache; /* the worker's, version = step (worker/chunk_cache.h) */
    double *ready;            /* per cache entry: its fill lands */
    int step;
    bool backward;
    double host, comp, h2d, d2h, link;
    double poster;        /* the worker's poster thread has posted everything landed before this */
    double *opt_free, *slot_free;
    int next_slot;
    /* when each device gradient buffer's last copy out has read it: the two alternating ones, or
     * with on-device accumulation one per chunk (index c + 2) */
    double *buf_free;
    int next_buf;
    double *version_at, *next_version, *reduced_at;
    bool *update_pending; /* updating during the backward: complete, not yet updated */
    double h2d_busy, h2d_bytes;
};

/* The worker sleeps on a futex until t. */
static void wait_until(struct sim *s, double t)
{
    if (t > s->host)
        s->host = t + s->wake;
}

static void fill(struct sim *s, int i, int c)
{
    double dur = s->backward ? s->fetch_bwd[c] : s->fetch_fwd[c];
    s->h2d_bytes += s->backward ? s->bytes_bwd[c] : s->bytes_fwd[c];
    chunk_cache_fill(&s->cache, i, c, (uint32_t)s->step);
    if (s->cpu) /* a synchronous conversion on the worker's thread */
        s->host = s->comp = s->ready[i] = fmax(s->host, s->comp) + dur;
    else if (s->sharded) /* staged and gathered from the host thread, which waits for everything */
        s->host = s->comp = s->h2d = s->ready[i] = fmax(fmax(s->host, s->h2d), s->comp) + dur;
    else /* the copy engine, after all compute queued so far (it may read the buffer) */
        s->h2d = s->ready[i] = fmax(fmax(s->host, s->h2d), s->comp) + dur;
    s->h2d_busy += dur;
}

/* worker/pipeline_cache.c io_weights: hit, or wait for the version and fill a victim; then
 * prefetch next when its version is out and a buffer is free. Returns when chunk c's weights are
 * on the device. */
static double weights(struct sim *s, int c, int next)
{
    uint32_t v = (uint32_t)s->step;
    int i = chunk_cache_find(&s->cache, c, v);
    if (i < 0) {
        wait_until(s, s->version_at[c]);
        i = chunk_cache_victim(&s->cache);
        SD_ASSERT(i >= 0);
        fill(s, i, c);
    }
    chunk_cache_hold(&s->cache, i);
    if (next >= 0 && chunk_cache_find(&s->cache, next, v) < 0 && s->version_at[next] <= s->host) {
        int victim = chunk_cache_victim(&s->cache);
        if (victim >= 0)
            fill(s, victim, next);
    }
    return s->ready[i];
}

/* Compute once the weights are there (`ready`, 0 for none), queued after `after` (a gradient
 * buffer's last copy). */
static void compute(struct sim *s, double ready, double after, double dur)
{
    double t = fmax(fmax(fmax(s->comp, s->host), after), ready);
    s->comp = t + dur;
    if (s->cpu)
        s->host = s->comp;
}

/* The gradient buffer chunk c's backward writes into (worker/model.c chunk_grad): the next of
 * the two alternating ones (0, 1), or the chunk's own with on-device accumulation (c + 2; the
 * embedding's is always 2); -1 when it keeps accumulating (no zeroing, no wait). Zeroing a buffer
 * waits for its last copy out. */
static int take_buf(struct sim *s, int c, bool first_micro)
{
    if (s->on_device)
        return first_micro ? c + 2 : -1;
    int b = s->next_buf;
    s->next_buf ^= 1;
    return b;
}

static double buf_ready(const struct sim *s, int b)
{
    return b >= 0 ? s->buf_free[b] : 0;
}

/* Chunk c's update done at t: when this host's workers can read the new version. With the state
 * sharded across hosts, once the owned part has gone out and the others' parts have come in (the
 * hosts mirror each other, so they come in as this host's part goes out). */
static double published(struct sim *s, int c, double t)
{
    if (s->link_params[c] <= 0)
        return t;
    s->link = fmax(s->link, t) + s->link_params[c];
    return s->link + s->link_lat;
}

/* optimizer/optim.c reduce_step: optimizer k takes its pending updates, lowest-numbered chunk
 * first, until one runs past `until` (when the next gradient arrives; an update is not
 * interrupted). `cost`: the updates' durations, in the backward (update_bwd) or after it. */
static void take_updates(struct sim *s, int k, double until, const double *cost)
{
    for (int c = 0; c < s->nc && s->opt_free[k] < until; c++)
        if (s->update_pending[c] && s->mc->owner[c] == k) {
            s->opt_free[k] += cost[c];
            s->update_taken[c] = cost[c];
            s->next_version[c] = published(s, c, s->opt_free[k]);
            s->update_pending[c] = false;
        }
}

/* worker/pipeline_poster.c io_grads_done and its poster thread: the worker waits for a free slot and
 * queues the copy behind the compute; the poster posts the descriptor once the copy has landed;
 * the owner adds the G ranks' gradients in rank order and frees the slots (we follow the last
 * rank, whose slot frees last). With on-device accumulation only the last micro-step sends; with
 * GPU-side gradients every micro-step reduce-scatters over the peers and only the last one sends
 * the rank's shard to the host. */
static void grads_done(struct sim *s, int c, int buf, bool last_micro)
{
    if (s->on_device && !last_micro)
        return;
    bool to_host = last_micro || !s->shard_acc;
    double dur = to_host ? s->send[c] : 0;
    if (s->cpu) {
        dur += s->exchange[c];
    } else if (s->exchange[c] > 0) {
        /* the exchange is synchronised from the host (worker/pipeline_exchange.c): compute waits for it */
        s->host = s->comp = fmax(s->host, s->comp) + s->exchange[c];
    }
    int si = s->next_slot;
    if (to_host && !s->direct) {
        s->next_slot = (si + 1) % s->S;
        wait_until(s, s->slot_free[si]);
    }
    double landed;
    if (s->cpu) { /* a synchronous copy on the worker's thread */
        landed = s->host = s->comp = fmax(s->host, s->comp) + dur;
    } else {
        landed = s->d2h = fmax(fmax(s->host, s->comp), s->d2h) + dur;
    }
    s->buf_free[s->on_device ? c + 2 : buf] = landed;
    if (!to_host)
        return;
    s->poster = fmax(s->poster, landed + s->wake);
    int k = s->mc->owner[c];
    take_updates(s, k, s->poster, s->update_bwd);
    for (int r = 0; r < s->G; r++) {
        double start = s->opt_free[k] >= s->poster ? s->opt_free[k] : s->poster + s->wake;
        s->opt_free[k] = start + s->reduce[c];
    }
    double slot_read = s->opt_free[k];
    if (s->H > 1) {
        /* the post goes out over the link from host memory; the other hosts' posts of the chunk,
         * sent at the same time, come in as it goes out and are summed after this host's */
        s->link = fmax(s->link, s->poster) + s->link_grads[c];
        slot_read = fmax(slot_read, s->link);
        double arrived = s->link + s->link_lat;
        double start = s->opt_free[k] >= arrived ? s->opt_free[k] : arrived + s->wake;
        s->opt_free[k] = start + (s->H - 1) * s->G * s->remote_reduce[c];
    }
    if (!s->direct)
        s->slot_free[si] = slot_read;
    if (!last_micro)
        return;
    s->reduced_at[c] = s->opt_free[k];
    s->update_pending[c] = s->during;
}

/* One micro-step in worker/model.c model_train_micro's order of weights/release/grads_done. */
static void micro_step(struct sim *s, bool first_micro, bool last_micro)
{
    int hc = s->hc;
    s->backward = false;
    double w = weights(s, 0, 1 < hc ? 1 : hc);
    /* the embedding's gradient buffer (index 2) is zeroed after its last copy out */
    compute(s, w, first_micro || !s->on_device ? s->buf_free[2] : 0, s->fwd[0]);
    if (!s->tied)
        chunk_cache_release(&s->cache, 0);
    for (int c = 1; c < hc; c++) {
        w = weights(s, c, c + 1);
        compute(s, w, 0, s->fwd[c]);
        if (s->offload_out[c] > 0) /* the inputs go out on the D2H engine behind the compute */
            s->d2h = fmax(s->d2h, s->comp) + s->offload_out[c];
        chunk_cache_release(&s->cache, c);
    }
    w = weights(s, hc, hc - 1);
    if (s->tied) /* the LM head reads the embedding's weights too */
        w = fmax(w, weights(s, 0, -1));
    int b = take_buf(s, hc, first_micro);
    compute(s, w, buf_ready(s, b), s->fwd[hc]);
    if (s->tied)
        chunk_cache_release(&s->cache, 0);
    s->host = fmax(s->host, s->comp); /* the loss rows come back synchronously */
    s->backward = true;
    grads_done(s, hc, b, last_micro);
    chunk_cache_release(&s->cache, hc);
    for (int c = hc - 1; c >= 1; c--) {
        w = weights(s, c, c > 1 ? c - 1 : -1);
        b = take_buf(s, c, first_micro);
        compute(s, w, buf_ready(s, b), s->bwd[c]);
        chunk_cache_release(&s->cache, c);
        grads_done(s, c, b, last_micro);
    }
    compute(s, 0, 0, s->bwd[0]);
    grads_done(s, 0, 2, last_micro);
}

/* After the backward: updating during it, each optimizer takes the updates still pending;
 * otherwise the global norm once every chunk is reduced, then each optimizer updates its chunks
 * in ascending order. Returns the commit time (every chunk at the new version). */
static double finish_step(struct sim *s)
{
    for (int k = 0; k < s->K; k++)
        take_updates(s, k, INFINITY, s->update);
    if (!s->during) {
        double norm = 0;
        for (int c = 0; c < s->nc; c++)
            norm = fmax(norm, s->reduced_at[c]);
        norm += s->wake;
        if (s->host_sharded) /* each host's sum of squares to the others: a tree there and back */
            norm += 2 * ceil(log2(s->H)) * s->link_lat;
        for (int k = 0; k < s->K; k++) {
            double t = fmax(s->opt_free[k], norm);
            for (int c = 0; c < s->nc; c++)
                if (s->mc->owner[c] == k) {
                    s->update_taken[c] = s->update[c];
                    t += s->update[c];
                    s->next_version[c] = published(s, c, t);
                }
            s->opt_free[k] = t;
        }
    }
    double commit = 0;
    for (int c = 0; c < s->nc; c++) {
        commit = fmax(commit, s->next_version[c]);
        s->version_at[c] = s->next_version[c];
    }
    return commit;
}

/* Bytes of host memory an optimizer touches: adding one rank's fp32 gradient into the
 * accumulator (read both, write one), and AdamW (read master, m, v, grad; write them and bf16). */
#define REDUCE_BYTES 12.0
#define SUMSQ_BYTES 4.0 /* the direct route's reduction only squares the accumulator */
#define UPDATE_BYTES CALIB_UPDATE_BYTES_OLD /* the older calibration curve's flavour (planner/calib.h) */
#define BF16_GRAD_SAVING 2.0 /* bytes per parameter less to read with a bf16 accumulator */
#define BF16_STATE_SAVING 8.0 /* with bf16 m and v: 2 bytes less of each to read and to write */
/* with 8-bit m and v: 3 bytes less of each to read and to write, and a scale byte of each per block
 * read and written */
#define STATE8_SAVING (12.0 - 4.0 / STATE8_BLOCK)
#define BF16_COPY_SAVING 2.0  /* workers streaming the master: no bf16 copy to write */
/* adamw_fp32_rate's flavour is the master-streaming job's with bf16 gradients */
_Static_assert((int)CALIB_UPDATE_BYTES == (int)(UPDATE_BYTES - BF16_GRAD_SAVING - BF16_COPY_SAVING),
               "CALIB_UPDATE_BYTES is the bytes of the lean update");

/* An optimizer process's update rates on the cores it has. */
struct update_rates {
    double update_bw; /* bytes/s of host memory the fp32-state AdamW moves (the calibrated flavour's,
                       * calib_fp32_update_bw; the job's own is priced by its bytes) */
    double adamw16;   /* params/s with bf16 state (its stochastic rounding can make it compute-bound) */
    double adamw8;    /* the same with 8-bit state */
};

/* Per-rank link rates (the host's memory bandwidth is shared by the G ranks' DMA) and the
 * optimizers' rates. */
struct rates {
    double host_bw; /* host memory traffic, bytes/s (a copy moves each byte twice) */
    double h2d_fwd, h2d_bwd, d2h;
    double reduce_bw; /* per optimizer process, bytes of traffic/s (reductions run as gradients land) */
    double sumsq16;   /* per optimizer process, params/s squaring a bf16 gradient (widening it, summing in
                       * double); 0 when calibration did not measure it */
    /* per optimizer process: beside the workers' threads (`update`), and while the gradient copies
     * are in flight, when each CUDA worker's poster thread holds a core too (`update_bwd`) */
    struct update_rates update, update_bwd;
};

/* The optimizer processes' threads, on at most `cores` cores: threads beyond them share cores, and
 * the lanes of a chunk finish together (optimizer/optim.c run_lanes), so they go at the cores' rate. */
static int optim_threads_on(const struct plan *p, int cores)
{
    cores = cores > 1 ? cores : 1;
    return p->optim_procs * p->optim_threads < cores ? p->optim_procs * p->optim_threads : cores;
}

static struct update_rates update_rates_on(const struct calib *cal, const struct plan *p, int cores)
{
    int threads = optim_threads_on(p, cores);
    return (struct update_rates){
        .update_bw = calib_fp32_update_bw(&cal->host, threads) / p->optim_procs,
        .adamw16 = calib_curve_at(&cal->host.adamw_bf16_rate, threads) / p->optim_procs,
        .adamw8 = calib_curve_at(&cal->host.adamw_8bit_rate, threads) / p->optim_procs,
    };
}

static struct rates rates_of(const struct cost_case *mc)
{
    const struct calib *cal = mc->cal;
    const struct plan *p = mc->plan;
    int G = mc->job->gpus;
    struct rates r;
    /* the most host memory traffic calibration saw: a copy's (each byte read and written) or the
     * optimizer's, whichever moved more */
    r.host_bw = fmax(2 * calib_curve_at(&cal->host.memcpy_bw, cal->host.ncpu),
                     calib_fp32_update_bw(&cal->host, cal->host.ncpu));
    bool bwd_fetch = p->chunk_buffers < mc->lay->num_chunks;
    r.h2d_fwd = fmin(cal->gpu.h2d_bw, r.host_bw / G);
    r.h2d_bwd = fmin(cal->gpu.bidir_bw, r.host_bw / (2 * G));
    r.d2h = bwd_fetch ? r.h2d_bwd : fmin(cal->gpu.d2h_bw, r.host_bw / G);
    /* Each worker's thread holds a core; the optimizer processes share the rest. A CUDA worker's
     * poster thread waits for each gradient copy in cudaEventSynchronize, which spins under CUDA's
     * default schedule (one context, fewer than the host's cores): while copies are in flight it
     * holds a core too. A CPU worker copies on its own thread. */
    int busy_bwd = mc->job->device == DEVICE_CPU ? G : 2 * G;
    r.update = update_rates_on(cal, p, mc->host_cpus - G);
    r.update_bwd = update_rates_on(cal, p, mc->host_cpus - busy_bwd);
    int reduce_threads = optim_threads_on(p, mc->host_cpus - busy_bwd);
    r.reduce_bw = 2 * calib_curve_at(&cal->host.memcpy_bw, reduce_threads) / p->optim_procs;
    r.sumsq16 = cal->host.sumsq_bf16_rate.n > 0
                    ? calib_curve_at(&cal->host.sumsq_bf16_rate, reduce_threads) / p->optim_procs
                    : 0;
    return r;
}


/* The simulation of mc: its chunk arrays allocated, nothing simulated yet. */
static void sim_init(struct sim *s, const struct cost_case *mc, bool cpu)
{
    const struct job_config *job = mc->job;
    const struct plan *p = mc->plan;
    int nc = mc->lay->num_chunks, G = job->gpus, A = job->grad_accum;
    bool gpu_grads = p->grad_route == GRADS_GPU && G > 1;
    /* gradients in bf16: half the copy, and the optimizer reads 2 bytes less of each */
    bool bf16_grads = cost_grads_bf16(p, job);
    /* gradients in the accumulator, updated during the backward without clipping: the update squares
     * each block for the reported norm as it reads it (optimizer/optim.c norm_in_update), so the
     * reduction reads nothing */
    bool norm_in_update = cost_grads_direct(p, job) && p->update_mode == UPDATE_DURING_BACKWARD && !(job->grad_clip > 0);
    *s = (struct sim){
        .mc = mc,
        .cpu = cpu,
        .tied = mc->cfg->tie_word_embeddings,
        .during = p->update_mode == UPDATE_DURING_BACKWARD,
        .on_device = p->accumulate_on_device,
        .direct = cost_grads_direct(p, job),
        .shard_acc = gpu_grads,
        .sharded = p->param_route == PARAMS_SHARDED && G > 1,
        /* gradients sent to the host per step: every micro-step's, or one */
        .sends = plan_one_post_per_rank(p, G) ? 1 : A,
        .bf16_grads = bf16_grads,
        .sumsq_bytes = norm_in_update ? 0 : bf16_grads ? SUMSQ_BYTES - BF16_GRAD_SAVING : SUMSQ_BYTES,
        /* m and v in bf16: 8 bytes less; in 8 bits: 12 less, their scales added (update_s) */
        .update_bytes = UPDATE_BYTES - (bf16_grads ? BF16_GRAD_SAVING : 0) -
                        (job->optimizer_state == OPTIM_STATE_BF16   ? BF16_STATE_SAVING
                         : job->optimizer_state == OPTIM_STATE_8BIT ? STATE8_SAVING
                                                                    : 0) -
                        (plan_streams_master(p) ? BF16_COPY_SAVING : 0),
        .nc = nc,
        .hc = nc - 1,
        .G = G,
        .A = A < SIM_MICRO ? A : SIM_MICRO,
        .K = p->optim_procs,
        .S = p->grad_slots,
        .wake = mc->cal->host.wake_s,
        .cache = {.size = p->chunk_buffers},
        .H = hosts_of(p),
        .host_sharded = state_hosts(p) > 1,
        .link_lat = COST_LINK_LATENCY_S,
    };
    enum { PER_CHUNK = 19 };
    double *arrays = calloc((size_t)nc * PER_CHUNK + (size_t)s->K + (size_t)s->S + (size_t)nc + 2, sizeof(double));
    s->cache.entries = calloc((size_t)s->cache.size, sizeof *s->cache.entries);
    s->ready = calloc((size_t)s->cache.size, sizeof *s->ready);
    s->update_pending = calloc((size_t)nc, sizeof(bool));
    SD_ASSERT(arrays && s->cache.entries && s->ready && s->update_pending);
    double **per_chunk[PER_CHUNK] = {&s->fwd,        &s->bwd,         &s->fetch_fwd,    &s->fetch_bwd, &s->bytes_fwd,
                                     &s->bytes_bwd,  &s->send,        &s->exchange,     &s->offload_out, &s->reduce,
                                     &s->update,     &s->version_at,  &s->next_version, &s->reduced_at,
                                     &s->remote_reduce, &s->link_grads, &s->link_params, &s->update_bwd,
                                     &s->update_taken};
    for (int i = 0; i < PER_CHUNK; i++)
        *per_chunk[i] = arrays + (size_t)i * nc;
    s->opt_free = arrays + (size_t)nc * PER_CHUNK;
    s->slot_free = s->opt_free + s->K;
    s->buf_free = s->slot_free + s->S;
    chunk_cache_clear(&s->cache);
}

static void sim_free(struct sim *s)
{
    free(s->fwd); /* the head of every chunk array */
    free(s->cache.entries);
    free(s->ready);
    free(s->update_pending);
}

/* Pieces n weights of a streamed master are copied and rounded in (worker/backend.h). */
static double master_pieces(double n)
{
    return ceil(n / (double)BE_MASTER_STAGE_FLOATS);
}

/* AdamW over `owned` parameters of a chunk whose next fill brings `fill_bytes` over each rank's host
 * link. The update is bound by host memory (at the calibrated fp32 rate's bytes per second), and the
 * G ranks' copies of the fill, which wait for this update and run during the next ones (the forward
 * trails the optimizer), take that bandwidth from it; with bf16 or 8-bit state the calibrated rate
 * of that update is a floor (its rounding, and the codes, are compute; calibrated with bf16
 * gradients to widen, the most work per parameter), for 8-bit state with the fill and any copy
 * written beside it at the memory rate. */
static double update_s(const struct sim *s, const struct update_rates *rt, double owned, double fill_bytes)
{
    double memory = (owned * s->update_bytes + s->G * fill_bytes) / rt->update_bw;
    switch (s->mc->job->optimizer_state) {
    case OPTIM_STATE_BF16: /* its measurements disagree between sessions: the calibrated rate alone */
        return fmax(memory, owned / rt->adamw16);
    case OPTIM_STATE_8BIT: {
        /* The 8-bit rate was calibrated with no fill beside it and no copy written: those bytes take
         * their time from the update at the memory rate (in the job the 8-bit update ran at 88-92%
         * of its calibrated rate, as the fp32 one did of its own; docs/performance.md §12.4). */
        double copy = plan_streams_master(s->mc->plan) ? 0 : BF16_COPY_SAVING * owned;
        return fmax(memory, owned / rt->adamw8 + (s->G * fill_bytes + copy) / rt->update_bw);
    }
    default:
        return memory;
    }
}

/* Each chunk's compute, transfers, reduction and update, and the step's totals of the compute and
 * device->host streams. */
static void chunk_costs(struct sim *s, const struct dev *d, const struct rates *rt, struct step_pred *out)
{
    const struct cost_case *mc = s->mc;
    const struct layout *lay = mc->lay;
    const struct plan *p = mc->plan;
    const struct calib *cal = mc->cal;
    struct shape sh = shape_of(mc);
    int G = s->G, A = mc->job->grad_accum, sends = s->sends, H = s->H, SH = state_hosts(p);
    bool sharded = s->sharded, gpu_grads = s->shard_acc;
    double link_bw = cost_link_bw(mc->job);
    double lf = layer_fwd_s(d, &sh, true), lr = layer_fwd_s(d, &sh, false), lb = layer_bwd_s(d, &sh);
    double act_bytes = sh.N * sh.C * 2;
    /* what document attention skips is no FLOP of the step */
    double attn_flops = 4 * attn_pairs(sh.B, sh.T, sh.Hq, sh.pair_frac) * sh.D;
    double flops_layer = cost_layer_flops(mc->cfg, sh.B, sh.T) - 4 * attn_pairs(sh.B, sh.T, sh.Hq, 1) * sh.D + attn_flops;
    for (int c = 0; c < s->nc; c++) {
        const struct chunk_desc *ch = &lay->chunks[c];
        /* the bf16 weights, and what crosses the host link for them: the copy, or the fp32 master
         * (rounded on the device) */
        double wbytes = (double)ch->numel * 2, gbytes = (double)ch->numel * (s->bf16_grads ? 2 : 4);
        double hbytes = plan_streams_master(p) ? 2 * wbytes : wbytes;
        if (d->cpu) { /* the worker converts the weights and copies its gradient into the slot itself */
            s->fetch_fwd[c] = s->fetch_bwd[c] = elem_s(d, ELEM_CONVERT, (double)ch->numel);
            s->bytes_fwd[c] = s->bytes_bwd[c] = hbytes;
            s->send[c] = elem_s(d, ELEM_COPY, (double)ch->numel);
            out->d2h_bytes += sends * gbytes;
        } else {
            /* sharded: 1/G from the host while the rest comes from the peers */
            double host_part = sharded ? hbytes / G : hbytes;
            double peer = sharded ? wbytes * (G - 1) / G / cal->gpu.p2p_bw : 0;
            /* the master rounded on the copy stream, piece by piece behind each piece's copy */
            double from_host = (double)ch->numel / (sharded ? G : 1);
            double rounding = plan_streams_master(p) ? elem_s(d, ELEM_CONVERT, from_host) +
                                                       (master_pieces(from_host) - 1) * cal->gpu.launch_s
                                                     : 0;
            s->fetch_fwd[c] = fmax(host_part / rt->h2d_fwd + rounding, peer);
            s->fetch_bwd[c] = fmax(host_part / rt->h2d_bwd + rounding, peer);
            s->bytes_fwd[c] = s->bytes_bwd[c] = host_part;
            /* GPU-side reduction: a reduce-scatter over the peers each micro-step, then 1/G to the host */
            s->exchange[c] = gpu_grads ? gbytes * (G - 1) / G / cal->gpu.p2p_bw : 0;
            s->send[c] = (gpu_grads ? gbytes / G : gbytes) / rt->d2h;
            out->d2h_bytes += sends * (gpu_grads ? gbytes / G : gbytes);
            out->p2p_bytes += gpu_grads ? A * gbytes * (G - 1) / G : 0;
        }
        /* with GPU-side reduction each rank's descriptor carries the rank-summed 1/G of the chunk;
         * with the state sharded across hosts this host sums and updates its 1/H of the chunk */
        double owned = (double)ch->numel / SH;
        s->reduce[c] = owned * (s->direct ? s->sumsq_bytes : REDUCE_BYTES) / rt->reduce_bw / (gpu_grads ? G : 1);
        /* squaring the bf16 accumulator widens it and sums in double: compute, which calibration
         * measured (sumsq_bf16_rate), not only its bytes */
        if (s->direct && s->bf16_grads && s->sumsq_bytes > 0 && rt->sumsq16 > 0)
            s->reduce[c] = fmax(s->reduce[c], owned / rt->sumsq16 / (gpu_grads ? G : 1));
        s->update[c] = update_s(s, &rt->update, owned, s->bytes_fwd[c]);
        s->update_bwd[c] = update_s(s, &rt->update_bwd, owned, s->bytes_fwd[c]);
        if (H > 1) {
            double posted = gpu_grads ? gbytes / G : gbytes; /* one rank's post of the chunk */
            /* replicated: every post to every other host; sharded: to each other host its part */
            double fanout = s->host_sharded ? (H - 1.0) / H : H - 1.0;
            double params_out = s->host_sharded ? 2.0 * ch->numel * (H - 1.0) / H : 0;
            s->remote_reduce[c] = owned * REDUCE_BYTES / rt->reduce_bw / (gpu_grads ? G : 1);
            s->link_grads[c] = G * posted * fanout / link_bw;
            s->link_params[c] = params_out / link_bw;
            out->link_bytes += sends * G * posted * fanout + params_out;
        }
        if (ch->kind == CHUNK_EMBED) {
            s->fwd[c] = elem_s(d, ELEM_ZERO, (double)ch->numel) + elem_s(d, ELEM_EMBED_FWD, sh.N * sh.C);
            s->bwd[c] = elem_s(d, ELEM_EMBED_BWD, sh.N * sh.C);
        } else if (ch->kind == CHUNK_HEAD) {
            s->fwd[c] = elem_s(d, ELEM_ZERO, (double)ch->numel) + head_s(d, &sh, p->logits_rows);
        } else {
            int recompute = 0;
            for (int l = ch->first_layer; l < ch->first_layer + ch->num_layers; l++)
                recompute += !p->keep_acts[l];
            s->fwd[c] = ch->num_layers * lf;
            s->bwd[c] = elem_s(d, ELEM_ZERO, (double)ch->numel) + ch->num_layers * lb + recompute * lr;
            out->recompute_s += A * recompute * lr;
            out->flops += A * (ch->num_layers * (3 * flops_layer + 1.5 * attn_flops) +
                               recompute * (flops_layer - 2 * sh.N * sh.I * sh.C));
            if (mc->offload) { /* every input out in the forward; back in the backward but the last two (the ring) */
                int back = 0;
                for (int l = ch->first_layer; l < ch->first_layer + ch->num_layers; l++)
                    back += l < mc->cfg->num_layers - 2;
                s->offload_out[c] = ch->num_layers * act_bytes / rt->d2h;
                s->fetch_bwd[c] += back * act_bytes / rt->h2d_bwd;
                s->bytes_bwd[c] += back * act_bytes;
                out->d2h_bytes += A * ch->num_layers * act_bytes;
                out->d2h_s += A * s->offload_out[c];
            }
        }
        out->compute_s += A * (s->fwd[c] + s->bwd[c]);
        out->d2h_s += sends * s->send[c];
    }
    out->flops += A * 3 * cost_head_flops(mc->cfg, (int64_t)sh.N);
}

/* A few steps of the pipeline; the last one is the steady state. Returns its period (the micro-steps
 * beyond the simulated ones extrapolated) and sets the host->device and peer terms. */
static double simulate(struct sim *s, struct step_pred *out)
{
    const struct cost_case *mc = s->mc;
    int G = s->G, A = mc->job->grad_accum;
    double commit[SIM_STEPS], micro_end[SIM_MICRO], h2d_s[SIM_MICRO], h2d_b[SIM_MICRO];
    for (int step = 0; step < SIM_STEPS; step++) {
        s->step = step + 1;
        for (int a = 0; a < s->A; a++) {
            double busy0 = s->h2d_busy, bytes0 = s->h2d_bytes;
            micro_step(s, a == 0, a == s->A - 1);
            micro_end[a] = s->host;
            h2d_s[a] = s->h2d_busy - busy0;
            h2d_b[a] = s->h2d_bytes - bytes0;
        }
        commit[step] = finish_step(s);
    }
    double period = commit[SIM_STEPS - 1] - commit[SIM_STEPS - 2];
    for (int a = 0; a < s->A; a++) {
        out->h2d_s += h2d_s[a];
        out->h2d_bytes += h2d_b[a];
    }
    if (A > s->A) { /* the micro-steps beyond the simulated ones cost what the last one did */
        double marginal = s->A >= 2 ? micro_end[s->A - 1] - micro_end[s->A - 2] : micro_end[0] - commit[SIM_STEPS - 2];
        period += (A - s->A) * marginal;
        out->h2d_s += (A - s->A) * h2d_s[s->A - 1];
        out->h2d_bytes += (A - s->A) * h2d_b[s->A - 1];
    }
    if (s->sharded) /* the peers exchange bf16 shards, also when the host sends the fp32 master */
        out->p2p_bytes += out->h2d_bytes * (G - 1) / (plan_streams_master(mc->plan) ? 2 : 1);
    out->p2p_s = out->p2p_bytes / mc->cal->gpu.p2p_bw;
    return period;
}

/* The optimizer and host-memory terms, the bottleneck, and the step: the simulated period, never
 * shorter than the busiest stream. */
static void stream_terms(const struct sim *s, const struct rates *rt, double period, struct step_pred *out)
{
    const struct cost_case *mc = s->mc;
    int G = s->G, sends = s->sends;
    bool gpu_grads = s->shard_acc;
    /* optimizer: the busiest process's work per step */
    double *load = calloc((size_t)s->K, sizeof(double));
    SD_ASSERT(load);
    for (int c = 0; c < s->nc; c++)
        load[mc->owner[c]] += G * sends * (s->reduce[c] + (s->H - 1) * s->remote_reduce[c]) + s->update_taken[c];
    for (int k = 0; k < s->K; k++)
        out->optim_s = fmax(out->optim_s, load[k]);
    free(load);
    double owned = (double)mc->lay->total_numel / state_hosts(mc->plan);
    out->optim_bytes = G * sends * owned * (s->direct ? s->sumsq_bytes : REDUCE_BYTES) / (gpu_grads ? G : 1) +
                       (s->H - 1) * G * sends * owned * REDUCE_BYTES / (gpu_grads ? G : 1) + owned * s->update_bytes;
    /* the link reads what it sends from host memory and writes what it receives there */
    out->host_mem_s = (G * (out->h2d_bytes + out->d2h_bytes) + out->optim_bytes + 2 * out->link_bytes) / rt->host_bw;
    out->link_s = out->link_bytes / cost_link_bw(mc->job);

    double terms[] = {[BOTTLENECK_COMPUTE] = out->compute_s, [BOTTLENECK_H2D] = out->h2d_s,
                      [BOTTLENECK_D2H] = out->d2h_s,         [BOTTLENECK_P2P] = out->p2p_s,
                      [BOTTLENECK_OPTIM] = out->optim_s,     [BOTTLENECK_HOST_MEM] = out->host_mem_s,
                      [BOTTLENECK_LINK] = out->link_s};
    out->bottleneck = BOTTLENECK_COMPUTE;
    for (int i = 1; i < (int)(sizeof terms / sizeof terms[0]); i++)
        if (terms[i] > terms[out->bottleneck])
            out->bottleneck = i;
    /* no stream can be busy longer than the step (the simulated pipeline may still be filling) */
    out->step_s = fmax(period, terms[out->bottleneck]);
    out->exposed_s = fmax(0, out->step_s - terms[out->bottleneck]);
}

void cost_step(const struct cost_case *mc, struct step_pred *out)
{
    const struct calib *cal = mc->cal;
    memset(out, 0, sizeof *out);
    struct dev d = {mc->job->device == DEVICE_CPU, cost_attention_kernels(mc->job), &cal->host.cpu, &cal->gpu, 1};
    if (d.attn == ATTN_KERNELS_DET_CUDNN) /* the only kernels the plan's tile bound changes */
        d.det_tile_speed = cost_det_tile_speed(mc->job->micro_batch, mc->job->seq_len, mc->cfg->num_heads,
                                               mc->cfg->num_kv_heads, mc->plan->attn_tile_bytes,
                                               cal->gpu.attn_det_tile_gain);
    struct rates rt = rates_of(mc);
    struct sim s;
    sim_init(&s, mc, d.cpu);
    chunk_costs(&s, &d, &rt, out);
    double period = simulate(&s, out);
    stream_terms(&s, &rt, period, out);
    sim_free(&s);
}
