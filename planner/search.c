/* Plan search (see search.h): candidates over chunk size, buffer depth, update mode, optimizer
 * processes and gradient slots, each with as many layers keeping their activations as the memory
 * budget allows, priced by the step-time model; the fastest that fits wins. */
#include "search.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/attn_tiles.h"
#include "common/err.h"
#include "shm/ctl.h"
#include "shm/ring.h"

#define GIB (1024.0 * 1024.0 * 1024.0)

static int imin(int a, int b)
{
    return a < b ? a : b;
}

static int imax(int a, int b)
{
    return a > b ? a : b;
}

struct search {
    const struct job_config *job;
    const struct model_config *cfg;
    const struct calib *cal;
    int host_cpus;
    int64_t budget;    /* device bytes per rank; INT64_MAX: bounded by host memory only */
    int64_t host_avail;
    bool enforce_host;
    bool offload;      /* plans with their layer inputs offloaded to host memory */
    bool fit_only;     /* only whether a plan fits: no step priced, the first that fits ends it */
    /* the best feasible candidate */
    bool found;
    struct plan best;
    struct step_pred best_pred;
    struct gpu_mem_pred best_gpu;
    struct host_mem_pred best_host;
    int best_kept;
    /* the smallest device memory any candidate needs, and that candidate */
    int64_t min_need;
    struct plan min_plan;
    int evaluated;
};

/* A built layout and its owner table for one layers_per_chunk and optimizer process count. */
struct cand_layout {
    struct layout lay;
    int *owner;
};

static int cand_layout_build(const struct model_config *cfg, int lpc, struct cand_layout *cl)
{
    memset(cl, 0, sizeof *cl);
    if (layout_build(cfg, lpc, &cl->lay) != 0)
        return -1;
    cl->owner = malloc(sizeof(int) * (size_t)cl->lay.num_chunks);
    if (!cl->owner) {
        layout_free(&cl->lay);
        return sd_err("out of memory");
    }
    return 0;
}

static void cand_layout_free(struct cand_layout *cl)
{
    layout_free(&cl->lay);
    free(cl->owner);
}

/* Most layers that can keep their activations within the budget (-1: none fit even recomputing
 * every layer). The layers' order does not matter to the model: every layer costs the same. */
static int max_kept(const struct search *S, struct cost_case *mc, int forced_kept)
{
    int L = S->cfg->num_layers;
    struct gpu_mem_pred g;
    cost_gpu_memory(mc, 0, &g);
    int64_t base = g.total - g.kept_acts, per = g.acts_per_layer;
    int64_t limit = S->budget;
    if (forced_kept >= 0)
        return base + (int64_t)forced_kept * per + (forced_kept < L ? per : 0) <= limit ? forced_kept : -1;
    if (base + (int64_t)L * per <= limit)
        return L;
    if (base + per > limit)
        return -1;
    int64_t k = (limit - base - per) / per;
    return k >= L ? L - 1 : (int)k;
}

static int forced_kept(const struct job_config *job, int L)
{
    return job->act_policy == ACT_KEEP ? L : job->act_policy == ACT_AUTO ? -1 : 0;
}

struct priced {
    int kept;
    struct step_pred pred;
    struct gpu_mem_pred gpu;
    struct host_mem_pred host;
};

/* Prices plan p (its keep_acts set here) on layout cl; false when it does not fit. */
static bool price(struct search *S, struct plan *p, struct cand_layout *cl, bool offload, struct priced *out)
{
    const struct model_config *cfg = S->cfg;
    int L = cfg->num_layers;
    plan_assign_owners(&cl->lay, p->optim_procs, cl->owner);
    struct cost_case mc = {.job = S->job, .cfg = cfg, .lay = &cl->lay, .plan = p, .owner = cl->owner,
                            .cal = S->cal, .host_cpus = S->host_cpus, .offload = offload};
    int fk = forced_kept(S->job, L);
    struct gpu_mem_pred least;
    cost_gpu_memory(&mc, fk >= 0 ? fk : 0, &least);
    if (least.total < S->min_need) {
        S->min_need = least.total;
        S->min_plan = *p;
        memset(S->min_plan.keep_acts, fk > 0 ? 1 : 0, sizeof S->min_plan.keep_acts);
    }
    int kept = max_kept(S, &mc, fk);
    if (kept < 0)
        return false;
    for (int l = 0; l < L; l++)
        p->keep_acts[l] = l < kept;
    out->kept = kept;
    cost_gpu_memory(&mc, kept, &out->gpu);
    cost_host_memory(&mc, out->gpu.total, &out->host);
    if (S->enforce_host && S->host_avail > 0 && out->host.total > S->host_avail)
        return false;
    if (S->fit_only) { /* every plan that fits is as good: consider() keeps the smallest */
        memset(&out->pred, 0, sizeof out->pred);
        return true;
    }
    cost_step(&mc, &out->pred);
    S->evaluated++;
    return true;
}

/* Keeps p when it is faster than the best so far by more than noise; between plans as fast, the
 * one that streams fewer weights over the host link (it leaves host bandwidth to the rest), then
 * the smaller. */
static void consider(struct search *S, struct plan *p, struct cand_layout *cl)
{
    struct priced pr;
    if (!price(S, p, cl, S->offload, &pr))
        return;
    double t = pr.pred.step_s, tb = S->best_pred.step_s;
    double in = pr.pred.h2d_bytes, in_b = S->best_pred.h2d_bytes;
    bool tie = t <= tb * 1.002 && t >= tb * 0.998;
    bool better = !S->found || t < tb * 0.998 ||
                  (tie && (in < in_b || (in == in_b && pr.gpu.total < S->best_gpu.total)));
    if (!better)
        return;
    S->found = true;
    S->best = *p;
    S->best_pred = pr.pred;
    S->best_gpu = pr.gpu;
    S->best_host = pr.host;
    S->best_kept = pr.kept;
}

/* ---- candidate lists ---- */

#define MAX_CANDS 64
#define ATTN_TILE_MAX_GIB 8 /* the largest dP bound search_tiles tries (docs/performance.md §1.1: 8 GiB calls) */
#define OPTIM_MAX_THREADS 32 /* [runtime] optim_threads accepts 1..32 */

static int lpc_candidates(const struct job_config *job, int L, int *out)
{
    if (job->layers_per_chunk > 0) {
        out[0] = imin(job->layers_per_chunk, L);
        return 1;
    }
    int n = 0;
    for (int v = 1; v <= L && n < MAX_CANDS; v++) {
        /* every size up to 8, divisors of L (no short last chunk), and a geometric ladder */
        bool ladder = false;
        for (int g = 8; g <= v; g = g * 3 / 2)
            ladder |= g == v;
        if (v <= 8 || L % v == 0 || ladder)
            out[n++] = v;
    }
    return n;
}

static int buffer_candidates(const struct job_config *job, int nc, int *out)
{
    if (job->chunk_buffers > 0) {
        out[0] = imax(imin(job->chunk_buffers, nc), imin(3, nc));
        return 1;
    }
    static const int ladder[] = {3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768};
    int n = 0;
    for (size_t i = 0; i < sizeof ladder / sizeof ladder[0] && ladder[i] < nc; i++)
        out[n++] = ladder[i];
    out[n++] = nc; /* every chunk resident: weights cross once per step */
    return n;
}

/* A ladder 1, 2, 3, 4, 6, 9, ... up to most (included). */
static int ladder_to(int most, int *out)
{
    int n = 0;
    for (int k = 1; k <= most && n < MAX_CANDS - 1; k = k < 4 ? k + 1 : k * 3 / 2)
        out[n++] = k;
    if (out[n - 1] != most)
        out[n++] = most;
    return n;
}

/* Optimizer processes x threads per process (pairs), within the cores the workers leave. */
static int optim_candidates(const struct job_config *job, int nc, int host_cpus, int *procs, int *threads)
{
    int cores = imax(1, host_cpus - job->gpus), kp[MAX_CANDS], tp[MAX_CANDS], n = 0;
    int nk = job->optim_procs > 0 ? (kp[0] = job->optim_procs, 1) : ladder_to(imin(imin(nc, CTL_MAX_OPTIM), cores), kp);
    for (int i = 0; i < nk; i++) {
        int nt = job->optim_threads > 0 ? (tp[0] = job->optim_threads, 1)
                                        : ladder_to(imax(1, imin(OPTIM_MAX_THREADS, cores / kp[i])), tp);
        for (int j = 0; j < nt && n < MAX_CANDS * MAX_CANDS; j++) {
            procs[n] = kp[i];
            threads[n++] = tp[j];
        }
    }
    return n;
}

static int slot_candidates(const struct job_config *job, int *out)
{
    if (job->grad_slots > 0) {
        out[0] = job->grad_slots;
        return 1;
    }
    static const int slots[] = {2, 4, 8, 16};
    memcpy(out, slots, sizeof slots);
    return 4;
}

/* Micro-steps summing their gradients on the device: forced, or tried on CUDA when there are
 * several (worker/model.c supports it on either backend; the CPU backend gains little). Never with
 * GPU-side gradients: their shard accumulators sum the micro-steps instead; never on several hosts,
 * which sum every micro-step's gradient in the job's order. */
static int accumulate_candidates(const struct job_config *job, int grad_route, int hosts, int *out)
{
    if (grad_route == GRADS_GPU || hosts > 1) {
        out[0] = 0;
        return 1;
    }
    if (job->accumulate_on_device >= 0) {
        out[0] = job->accumulate_on_device;
        return 1;
    }
    out[0] = 0;
    if (job->device != DEVICE_CUDA || job->grad_accum < 2)
        return 1;
    out[1] = 1;
    return 2;
}

static int mode_candidates(const struct job_config *job, const struct plan *tmpl, int *out)
{
    if (job->update_mode != UPDATE_AUTO) {
        out[0] = job->update_mode;
        return 1;
    }
    out[0] = UPDATE_AFTER_BACKWARD;
    /* clipping needs the global norm before any update; the streamed master, updated in place, keeps
     * no previous version for a worker redoing a step (docs/design.md §6.3) */
    if (job->grad_clip > 0 || plan_streams_master(tmpl))
        return 1;
    out[1] = UPDATE_DURING_BACKWARD;
    return 2;
}

/* Chunk sizes x buffer depths x update modes x gradient accumulation with the given optimizer
 * processes, threads and slots. */
static int search_shapes(struct search *S, const struct plan *tmpl)
{
    int lpcs[MAX_CANDS], bufs[MAX_CANDS], modes[2], accs[2];
    int nl = lpc_candidates(S->job, S->cfg->num_layers, lpcs), nm = mode_candidates(S->job, tmpl, modes);
    int na = accumulate_candidates(S->job, tmpl->grad_route, tmpl->hosts, accs);
    for (int i = 0; i < nl && !(S->fit_only && S->found); i++) {
        struct cand_layout cl;
        if (cand_layout_build(S->cfg, lpcs[i], &cl) != 0)
            return -1;
        int nc = cl.lay.num_chunks, nb = buffer_candidates(S->job, nc, bufs);
        for (int b = 0; b < nb; b++)
            for (int m = 0; m < nm; m++)
                for (int acc = 0; acc < na; acc++) {
                    struct plan p = *tmpl;
                    p.layers_per_chunk = lpcs[i];
                    p.chunk_buffers = bufs[b];
                    p.update_mode = modes[m];
                    p.accumulate_on_device = accs[acc];
                    p.optim_procs = imin(p.optim_procs, nc);
                    consider(S, &p, &cl);
                }
        cand_layout_free(&cl);
    }
    return 0;
}

/* Optimizer processes and threads x gradient slots around the best shape. */
static int search_optim(struct search *S)
{
    struct plan tmpl = S->best;
    struct cand_layout cl;
    if (cand_layout_build(S->cfg, tmpl.layers_per_chunk, &cl) != 0)
        return -1;
    static int procs[MAX_CANDS * MAX_CANDS], threads[MAX_CANDS * MAX_CANDS];
    int slots[MAX_CANDS];
    int np = optim_candidates(S->job, cl.lay.num_chunks, S->host_cpus, procs, threads);
    int ns = slot_candidates(S->job, slots);
    for (int k = 0; k < np; k++)
        for (int s = 0; s < ns; s++) {
            struct plan p = tmpl;
            p.optim_procs = procs[k];
            p.optim_threads = threads[k];
            p.grad_slots = slots[s];
            consider(S, &p, &cl);
        }
    cand_layout_free(&cl);
    return 0;
}

/* Rows of the micro-batch whose logits take about `mib` MiB (between 1 and all of them), or the
 * rows job.ini sets when it sets runtime.logits_rows. */
static int logits_rows_of(const struct job_config *job, const struct model_config *cfg, int64_t mib)
{
    int64_t N = (int64_t)job->micro_batch * job->seq_len;
    if (job->logits_rows > 0)
        return (int)(job->logits_rows > N ? N : job->logits_rows);
    return plan_logits_rows_for(N, (int64_t)cfg->vocab_size * (job->device == DEVICE_CPU ? 4 : 2), mib);
}

/* Rows per cross-entropy chunk around the best shape, from about 64 MiB of logits up to the whole
 * micro-batch: each chunk reads and writes the LM head's fp32 weight gradient once, so larger
 * chunks trade GPU memory (fewer kept activations) for that traffic and for wider GEMMs. */
static int search_logits(struct search *S)
{
    if (S->job->logits_rows > 0)
        return 0;
    struct plan tmpl = S->best;
    struct cand_layout cl;
    if (cand_layout_build(S->cfg, tmpl.layers_per_chunk, &cl) != 0)
        return -1;
    int64_t N = (int64_t)S->job->micro_batch * S->job->seq_len;
    for (int64_t mib = 64;; mib *= 4) {
        struct plan p = tmpl;
        p.logits_rows = logits_rows_of(S->job, S->cfg, mib);
        consider(S, &p, &cl);
        if (p.logits_rows >= N)
            break;
    }
    cand_layout_free(&cl);
    return 0;
}

/* The deterministic attention backward's dP bound per cuDNN call: larger calls run faster where the
 * default cuts sequences (cost_det_tile_speed) but take more scratch, which may cost kept
 * activations; consider() weighs the two, and between plans as fast keeps the smaller. */
static int search_tiles(struct search *S)
{
    if (S->best.attn_tile_bytes <= 0)
        return 0;
    struct plan tmpl = S->best;
    struct cand_layout cl;
    if (cand_layout_build(S->cfg, tmpl.layers_per_chunk, &cl) != 0)
        return -1;
    for (int gib = 1; gib <= ATTN_TILE_MAX_GIB; gib *= 2) {
        struct plan p = tmpl;
        p.attn_tile_bytes = (int64_t)gib << 30;
        consider(S, &p, &cl);
    }
    cand_layout_free(&cl);
    return 0;
}

static void fmt_gib(char *buf, size_t len, int64_t bytes)
{
    snprintf(buf, len, "%.2f GiB", (double)bytes / GIB);
}

/* Names the forced job.ini choices that bound the memory, for the "nothing fits" error. */
static void forced_note(const struct job_config *job, char *buf, size_t len)
{
    const char *keys[4] = {job->layers_per_chunk > 0 ? "layers_per_chunk" : NULL,
                           job->chunk_buffers > 0 ? "chunk_buffers" : NULL,
                           job->logits_rows > 0 ? "logits_rows" : NULL,
                           job->act_policy == ACT_KEEP ? "activations = keep" : NULL};
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < 4; i++)
        if (keys[i] && n < len)
            n += (size_t)snprintf(buf + n, len - n, "%s%s", n ? ", " : "; forced in job.ini: ", keys[i]);
}

static int search_all(struct search *S, const struct plan *tmpl)
{
    if (search_shapes(S, tmpl) != 0)
        return -1;
    if (!S->found && S->enforce_host && S->job->grad_slots <= 0) {
        /* nothing fits the host's memory with the first guess's gradient slots: the fewest, which
         * search_optim would otherwise never reach from here */
        int slots[MAX_CANDS];
        slot_candidates(S->job, slots);
        struct plan lean = *tmpl;
        lean.grad_slots = slots[0];
        if (lean.grad_slots < tmpl->grad_slots && search_shapes(S, &lean) != 0)
            return -1;
    }
    if (!S->found || S->fit_only)
        return 0;
    if (search_optim(S) != 0 || search_logits(S) != 0 || search_tiles(S) != 0)
        return -1;
    struct plan again = *tmpl;
    again.attn_tile_bytes = S->best.attn_tile_bytes;
    again.optim_procs = S->best.optim_procs;
    again.optim_threads = S->best.optim_threads;
    again.grad_slots = S->best.grad_slots;
    again.logits_rows = S->best.logits_rows;
    return search_shapes(S, &again);
}

/* Whether the search's best plan fits the host's memory (unknown memory: it does). */
static bool best_fits_host(const struct search *S)
{
    return S->host_avail <= 0 || S->best_host.total <= S->host_avail;
}

/* Host memory of the job's model with L decoder layers under optimizer state st, on plan p with
 * its first `kept` layers keeping their activations; the model's parameters in *params. -1 when
 * its layout cannot be built. */
static int64_t host_bytes_with(const struct search *S, const struct plan *p, int kept, int L, enum optimizer_state st,
                               int64_t *params)
{
    struct model_config cfg = *S->cfg;
    cfg.num_layers = L;
    struct job_config job = *S->job;
    job.optimizer_state = st;
    struct plan q = *p;
    q.layers_per_chunk = imin(p->layers_per_chunk, L);
    kept = imin(kept, L);
    for (int l = 0; l < L; l++)
        q.keep_acts[l] = l < kept;
    struct cand_layout cl;
    if (cand_layout_build(&cfg, q.layers_per_chunk, &cl) != 0)
        return -1;
    plan_assign_owners(&cl.lay, q.optim_procs, cl.owner);
    struct cost_case mc = {.job = &job, .cfg = &cfg, .lay = &cl.lay, .plan = &q, .owner = cl.owner, .cal = S->cal,
                            .host_cpus = S->host_cpus};
    struct gpu_mem_pred g;
    struct host_mem_pred h;
    cost_gpu_memory(&mc, kept, &g);
    cost_host_memory(&mc, g.total, &h);
    cand_layout_free(&cl);
    *params = model_config_num_params(&cfg);
    return h.total;
}

/* The job's host memory under each optimizer state, and the most layers that fit this host's
 * available memory (host memory grows with the layers, so a bisection finds it). */
static void report_state_modes(const struct search *S, const struct plan *p, int kept, struct plan_info *info)
{
    struct plan lean = *p;
    if (S->job->weights_source != WEIGHTS_BF16_COPY && S->job->update_mode != UPDATE_DURING_BACKWARD) {
        lean.weights_source = WEIGHTS_MASTER;
        lean.update_mode = UPDATE_AFTER_BACKWARD;
    }
    for (int st = OPTIM_STATE_FP32; st < OPTIM_STATE_COUNT; st++) {
        struct plan_state_mode *m = &info->state_modes[st];
        int64_t params;
        m->host_bytes = host_bytes_with(S, p, kept, S->cfg->num_layers, st, &params);
        m->bytes_per_param = (double)m->host_bytes / (double)params;
        m->largest_layers = -1;
        if (S->host_avail <= 0)
            continue;
        int lo = 0, hi = PLAN_MAX_LAYERS + 1; /* lo layers fit (0: trivially), hi do not */
        int64_t lo_bytes = 0, lo_params = 0;
        while (hi - lo > 1) {
            int mid = lo + (hi - lo) / 2;
            int64_t mid_params, bytes = host_bytes_with(S, &lean, kept, mid, st, &mid_params);
            if (bytes >= 0 && bytes <= S->host_avail)
                lo = mid, lo_bytes = bytes, lo_params = mid_params;
            else
                hi = mid;
        }
        m->largest_layers = lo;
        m->largest_capped = lo == PLAN_MAX_LAYERS;
        m->largest_params = lo_params;
        m->largest_host_bytes = lo_bytes;
    }
}

/* Several hosts: each host state's fastest step, and the chosen plan's host memory per host under
 * each. */
static void report_host_states(const struct search *S, const struct plan *p, int kept, const double *steps,
                               struct plan_info *info)
{
    info->link_bw = cost_link_bw(S->job);
    for (int st = HOST_STATE_REPLICATED; st <= HOST_STATE_SHARDED; st++) {
        struct plan q = *p;
        q.host_state = st;
        int64_t params;
        info->host_states[st].step_s = steps[st];
        info->host_states[st].host_bytes =
            host_bytes_with(S, &q, kept, S->cfg->num_layers, S->job->optimizer_state, &params);
    }
}

/* ---- routes ---- */

/* The route combinations a job may take, and why. */
struct route_set {
    int n;
    int param_route[PLAN_MAX_ROUTES], grad_route[PLAN_MAX_ROUTES];
    char reason[200];
};

/* The error for a forced peer route on a host where GPUs a and b have no P2P. */
static int no_p2p_err(const char *key, const char *value, int a, int b)
{
    return sd_err("[runtime] %s = %s needs P2P between every pair of GPUs; GPUs %d and %d have none", key, value, a, b);
}

/* One GPU: no peers. Several hosts: replicated parameters and gradients through host memory, what
 * slidedp-launch runs across hosts whatever job.ini says. Forced routes: as job.ini says, where
 * every pair of GPUs has P2P. Auto: the peer routes are tried where every pair has P2P, except on
 * the CPU backend, whose peer copies go through shared memory rather than a PCIe link and save
 * nothing. */
static int route_candidates(const struct job_config *job, const struct topology *topo, int hosts,
                            struct route_set *rs)
{
    if (hosts > 1) {
        *rs = (struct route_set){.n = 1, .param_route = {PARAMS_REPLICATED}, .grad_route = {GRADS_CPU}};
        snprintf(rs->reason, sizeof rs->reason, "several hosts: the gradients cross through host memory");
        return 0;
    }
    memset(rs, 0, sizeof *rs);
    int a = 0, b = 0;
    bool peers = job->gpus > 1, all_p2p = topology_all_p2p(topo, &a, &b);
    if (peers && !all_p2p && job->param_route == PARAMS_SHARDED)
        return no_p2p_err("param_route", "sharded", a, b);
    if (peers && !all_p2p && job->grad_route == GRADS_GPU)
        return no_p2p_err("grad_route", "gpu", a, b);
    bool auto_params = job->param_route == ROUTE_AUTO, auto_grads = job->grad_route == GRADS_AUTO;
    bool try_peers = peers && all_p2p && job->device != DEVICE_CPU;
    int params[2] = {PARAMS_REPLICATED, PARAMS_SHARDED}, grads[2] = {GRADS_CPU, GRADS_GPU};
    int np = 1, ng = 1;
    if (!peers) {
        snprintf(rs->reason, sizeof rs->reason, "one GPU");
    } else {
        if (!auto_params)
            params[0] = job->param_route;
        else if (try_peers)
            np = 2;
        if (!auto_grads)
            grads[0] = job->grad_route;
        else if (try_peers && job->accumulate_on_device != 1)
            ng = 2;
        if (!auto_params && !auto_grads)
            snprintf(rs->reason, sizeof rs->reason, "set in job.ini");
        else if (np * ng > 1)
            snprintf(rs->reason, sizeof rs->reason, "the fastest of %d combinations%s", np * ng,
                     !auto_params ? " (params set in job.ini)" : !auto_grads ? " (grads set in job.ini)" : "");
        else if (job->device == DEVICE_CPU)
            snprintf(rs->reason, sizeof rs->reason,
                     "CPU backend: peer copies go through shared memory, not a link of their own");
        else if (!all_p2p)
            snprintf(rs->reason, sizeof rs->reason, "no P2P between GPUs %d and %d", a, b);
        else
            snprintf(rs->reason, sizeof rs->reason, "accumulate_on_device = true keeps the gradients on the CPU route");
    }
    for (int i = 0; i < np; i++)
        for (int j = 0; j < ng; j++) {
            rs->param_route[rs->n] = params[i];
            rs->grad_route[rs->n++] = grads[j];
        }
    return 0;
}

/* Searches each route combination from base; *best becomes the search of the fastest (a later
 * combination must beat it by more than noise), or, when none fits, one whose smallest plan is
 * the smallest of all. options[i] receives combination i's fastest plan. */
static int search_routes(const struct search *base, const struct plan *tmpl, const struct route_set *rs,
                         struct search *best, struct plan_route_option *options)
{
    *best = *base;
    int evaluated = 0;
    for (int i = 0; i < rs->n; i++) {
        struct search S = *base;
        struct plan t = *tmpl;
        t.param_route = rs->param_route[i];
        t.grad_route = rs->grad_route[i];
        if (search_all(&S, &t) != 0)
            return -1;
        evaluated += S.evaluated;
        options[i] = (struct plan_route_option){
            .param_route = t.param_route,
            .grad_route = t.grad_route,
            .fits = S.found,
            .step_s = S.found ? S.best_pred.step_s : 0,
            .gpu_bytes = S.found ? S.best_gpu.total : 0,
        };
        bool faster = S.found && (!best->found || S.best_pred.step_s < best->best_pred.step_s * 0.998);
        bool smaller = !best->found && !S.found && S.min_need < best->min_need;
        if (faster || smaller)
            *best = S;
    }
    best->evaluated = evaluated;
    return 0;
}

/* search_routes for each host state the job may take: with one host replicated; forced; or with
 * auto both, and replicated stays when it fits the host's memory and is not slower by more than
 * noise, else sharded. steps[state] receives each state's fastest step (0: none fits), reason why
 * the state was taken. */
static int search_host_states(const struct search *base, const struct plan *tmpl, const struct route_set *rs,
                              struct search *best, struct plan_route_option *options, double *steps, char *reason,
                              size_t reason_len)
{
    int states[2] = {HOST_STATE_REPLICATED, HOST_STATE_SHARDED}, n = 2;
    bool no_sharding = base->job->optimizer_state == OPTIM_STATE_8BIT; /* plan_choose says why */
    if (tmpl->hosts == 1 || base->job->host_state != HOST_STATE_AUTO || no_sharding) {
        states[0] = tmpl->hosts > 1 && base->job->host_state != HOST_STATE_AUTO ? (int)base->job->host_state
                                                                                 : HOST_STATE_REPLICATED;
        n = 1;
    }
    int evaluated = 0;
    for (int i = 0; i < n; i++) {
        struct search S;
        struct plan_route_option opts[PLAN_MAX_ROUTES];
        struct plan t = *tmpl;
        t.host_state = states[i];
        if (search_routes(base, &t, rs, &S, opts) != 0)
            return -1;
        evaluated += S.evaluated;
        steps[states[i]] = S.found ? S.best_pred.step_s : 0;
        bool replicated_stays = i > 0 && best->found && best_fits_host(best) &&
                                (!S.found || best->best_pred.step_s <= S.best_pred.step_s * 1.002);
        if (i > 0)
            snprintf(reason, reason_len, "auto: %s",
                     replicated_stays                      ? "replicated fits and is not slower"
                     : best->found && best_fits_host(best) ? "sharded is faster"
                                                           : "replicated does not fit the host's memory");
        if (i == 0 || (!replicated_stays && (S.found || !best->found))) {
            *best = S;
            memcpy(options, opts, sizeof opts);
        }
    }
    if (n == 1)
        snprintf(reason, reason_len, "%s",
                 tmpl->hosts == 1                                ? "one host"
                 : base->job->host_state != HOST_STATE_AUTO ? "set in job.ini"
                                                                 : "8-bit state is not sharded");
    best->evaluated = evaluated;
    return 0;
}

static void report_routes(struct plan_info *info, const struct route_set *rs, const struct plan_route_option *options,
                          bool found)
{
    info->num_routes = rs->n;
    memcpy(info->routes, options, sizeof(*options) * (size_t)rs->n);
    snprintf(info->route_reason, sizeof info->route_reason, "%s%s", rs->reason,
             found || rs->n == 1 ? "" : "; none fits");
}

/* ---- the weights source ---- */

/* The fastest plan of one weights source over the route combinations: within the host's memory,
 * or when nothing fits there, for the device alone (host_fits false). */
struct source_search {
    struct search S;
    struct plan_route_option options[PLAN_MAX_ROUTES];
    bool host_fits;
    double state_steps[3]; /* search_host_states' */
    char state_reason[128];
};

/* search_host_states for one weights source; when nothing fits the host's memory, again for the
 * device alone (host_fits then says so). */
static int search_source(const struct search *base, const struct plan *tmpl, const struct route_set *routes,
                         struct source_search *out)
{
    memset(out->state_steps, 0, sizeof out->state_steps);
    if (search_host_states(base, tmpl, routes, &out->S, out->options, out->state_steps, out->state_reason,
                           sizeof out->state_reason) != 0)
        return -1;
    out->host_fits = out->S.found;
    if (out->S.found)
        return 0;
    struct search device_only = *base;
    device_only.enforce_host = false;
    return search_host_states(&device_only, tmpl, routes, &out->S, out->options, out->state_steps, out->state_reason,
                              sizeof out->state_reason);
}

/* As job.ini sets it, else both: the bf16 copy first. Several hosts read the copy (the other hosts'
 * updated chunks arrive into it; launcher/hosts.c hosts_share_plan). */
static int source_candidates(const struct job_config *job, int hosts, int *out)
{
    if (hosts > 1) {
        out[0] = WEIGHTS_BF16_COPY;
        return 1;
    }
    if (job->weights_source != WEIGHTS_AUTO) {
        out[0] = job->weights_source;
        return 1;
    }
    if (job->update_mode == UPDATE_DURING_BACKWARD) { /* only the copy keeps the previous version */
        out[0] = WEIGHTS_BF16_COPY;
        return 1;
    }
    out[0] = WEIGHTS_BF16_COPY;
    out[1] = WEIGHTS_MASTER;
    return 2;
}

/* Which of the searched sources to take, and why. The copy costs host memory (2 bytes per parameter,
 * shared by every GPU) and the optimizers' writing it; the master doubles the bytes each GPU pulls
 * over its link. So: the copy when it fits the host's memory and is faster by more than the model's
 * error (COPY_MIN_GAIN); the master when the copy does not fit, or is not clearly faster: the host
 * memory it leaves free is certain, a gain within the model's error is not (docs/performance.md §8:
 * on Qwen3-8B the copy was predicted 0.7% faster and measured 4-10% slower). */
#define COPY_MIN_GAIN 0.03
static int choose_source(const struct source_search *per, int n, const struct job_config *job, int hosts, char *why,
                         size_t len)
{
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    if (n == 1) {
        snprintf(why, len, "%s",
                 hosts > 1                           ? "several hosts read the bf16 copy"
                 : job->weights_source != WEIGHTS_AUTO ? "set in job.ini"
                                                     : "update_mode = during_backward needs the copy's previous version");
        return 0;
    }
    const struct source_search *copy = &per[0], *master = &per[1];
    if (!master->S.found) {
        snprintf(why, len, "streaming the master fits no plan on the device");
        return 0;
    }
    if (!copy->S.found) {
        snprintf(why, len, "the bf16 copy fits no plan on the device");
        return 1;
    }
    double tc = copy->S.best_pred.step_s, tm = master->S.best_pred.step_s;
    double saved = (double)(copy->S.best_host.total - master->S.best_host.total) / GiB;
    if (!copy->host_fits && master->host_fits) {
        snprintf(why, len,
                 "the bf16 copy does not fit host memory (%.2f GiB, %.2f available); the master does (%.2f GiB)",
                 copy->S.best_host.total / GiB, copy->S.host_avail / GiB, master->S.best_host.total / GiB);
        return 1;
    }
    if (copy->host_fits && !master->host_fits) {
        snprintf(why, len, "only the bf16 copy's plan fits host memory");
        return 0;
    }
    /* both fit, or neither (then both are planned for the GPUs alone, as if the host had the memory) */
    const char *fit =
        copy->host_fits ? "both fit host memory" : "neither fits this host's memory (planned for the GPUs alone)";
    if (tc < tm * (1 - COPY_MIN_GAIN)) {
        snprintf(why, len, "%s: the bf16 copy is faster, %.4f s against %.4f s streaming the master", fit, tc, tm);
        return 0;
    }
    snprintf(why, len, "%s: the bf16 copy is not %.0f%% faster (%.4f s against %.4f s streaming the master), and the "
                       "master takes %.2f GiB less host memory",
             fit, 100 * COPY_MIN_GAIN, tc, tm, saved);
    return 1;
}

/* When nothing fits: the host memory the smallest plan would need. */
static void explain_failure(struct search *S, struct plan_info *info)
{
    memset(info, 0, sizeof *info);
    info->failed = true;
    info->min_gpu_bytes = S->min_need;
    info->gpu_budget = S->budget != INT64_MAX ? S->budget : 0;
    info->host_available = S->host_avail;
    info->gpu_auto = S->job->gpu_mem == 0;
    struct cand_layout cl;
    struct plan p = S->min_plan;
    if (cand_layout_build(S->cfg, p.layers_per_chunk, &cl) == 0) {
        plan_assign_owners(&cl.lay, p.optim_procs, cl.owner);
        struct cost_case mc = {.job = S->job, .cfg = S->cfg, .lay = &cl.lay, .plan = &p, .owner = cl.owner,
                                .cal = S->cal, .host_cpus = S->host_cpus, .offload = S->offload};
        cost_host_memory(&mc, S->min_need, &info->host);
        info->host_fits = S->host_avail <= 0 || info->host.total <= S->host_avail;
        cand_layout_free(&cl);
    }
}

int64_t plan_gpu_budget(const struct job_config *job, const struct calib *cal, const struct topology *topo)
{
    if (job->gpu_mem > 0)
        return job->gpu_mem;
    if (job->device == DEVICE_CPU)
        return INT64_MAX;
    int64_t probed = topology_min_memory(topo);
    return probed > 0 ? probed : (int64_t)cal->gpu.mem_bytes;
}

/* The search's starting state and the first candidate's template, for the job as it is. */
static void search_start(const struct job_config *job, const struct model_config *cfg, const struct calib *cal,
                         const struct topology *topo, int host_cpus, int hosts, struct search *base,
                         struct plan *tmpl)
{
    *base = (struct search){.job = job, .cfg = cfg, .cal = cal, .host_cpus = host_cpus, .min_need = INT64_MAX};
    base->host_avail = cal->mem_available;
    base->budget = plan_gpu_budget(job, cal, topo);
    base->enforce_host = true;
    *tmpl = (struct plan){
        .layers_per_chunk = 1,
        .chunk_buffers = 3,
        .grad_slots = job->grad_slots > 0 ? job->grad_slots : 4,
        .optim_procs = job->optim_procs > 0 ? job->optim_procs : imin(CTL_MAX_OPTIM, imax(1, host_cpus - job->gpus)),
        .optim_threads = job->optim_threads > 0 ? job->optim_threads : 1,
        .param_route = PARAMS_REPLICATED,
        .grad_route = GRADS_CPU,
        .hosts = hosts,
        .host_state = HOST_STATE_REPLICATED,
        .attn_tile_bytes = job->device != DEVICE_CPU && job->deterministic ? (int64_t)ATTN_TILE_WORKSPACE_DEFAULT : 0,
    };
    /* about 64 MiB of logits at a time to start with (search_logits tries more) */
    tmpl->logits_rows = logits_rows_of(job, cfg, 64);
}

int plan_choose(const struct job_config *job, const struct model_config *cfg, const struct calib *cal,
                const struct topology *topo, int host_cpus, int hosts, struct plan *plan, struct plan_info *info)
{
    memset(plan, 0, sizeof *plan);
    int L = cfg->num_layers;
    if (L > PLAN_MAX_LAYERS)
        return sd_err("model has %d layers; at most %d are supported", L, PLAN_MAX_LAYERS);
    if (job->grad_slots >= RING_CAP)
        return sd_err("[runtime] grad_slots = %d: at most %d", job->grad_slots, RING_CAP - 1);
    if (job->optim_procs > 0) {
        int lpc = job->layers_per_chunk > 0 ? imin(job->layers_per_chunk, L) : 1;
        int num_chunks = 2 + (L + lpc - 1) / lpc;
        if (job->optim_procs > num_chunks)
            return sd_err("[runtime] optim_procs = %d: the model has only %d chunks to share out", job->optim_procs,
                          num_chunks);
    }
    if (hosts > 1 && job->host_state == HOST_STATE_SHARDED && job->optimizer_state == OPTIM_STATE_8BIT)
        return sd_err("[runtime] host_state = sharded with [train] optimizer_state = 8bit: the relay between hosts "
                      "carries no block scales; use host_state = replicated (or auto)");
    if (hosts < 1 || (int64_t)hosts * job->gpus > JOB_MAX_GPUS)
        return sd_err("%d hosts x %d GPUs: a job has 1 to %d ranks in all", hosts, job->gpus, JOB_MAX_GPUS);
    SD_ASSERT(topo->gpus == job->gpus);
    struct route_set routes;
    if (route_candidates(job, topo, hosts, &routes) != 0)
        return -1;

    bool cpu = job->device == DEVICE_CPU;
    struct search base;
    struct plan tmpl;
    search_start(job, cfg, cal, topo, host_cpus, hosts, &base, &tmpl);

    /* the layer inputs on the device, then (a GPU, when no plan fits so) offloaded to host memory;
     * [runtime] activations = offload starts there. Offloaded, the smallest plan is smaller too, so
     * a failure names that one. */
    struct source_search per[2];
    int sources[2], nsrc = source_candidates(job, hosts, sources);
    bool found = false;
    for (int offload = !cpu && job->act_policy == ACT_OFFLOAD; !found && offload <= !cpu; offload++) {
        base.offload = offload;
        for (int i = 0; i < nsrc; i++) {
            tmpl.weights_source = sources[i];
            if (search_source(&base, &tmpl, &routes, &per[i]) != 0)
                return -1;
            found |= per[i].S.found;
        }
    }
    char source_reason[256];
    int pick = choose_source(per, nsrc, job, hosts, source_reason, sizeof source_reason);
    struct search S = per[pick].S;
    struct plan_route_option *options = per[pick].options;
    bool host_fits = per[pick].host_fits;
    tmpl.weights_source = sources[pick];
    if (!S.found) {
        if (info) {
            explain_failure(&S, info);
            report_routes(info, &routes, options, false);
        }
        char budget[32], need[32], forced[160];
        fmt_gib(budget, sizeof budget, S.budget);
        fmt_gib(need, sizeof need, S.min_need);
        forced_note(job, forced, sizeof forced);
        int kept = 0;
        for (int l = 0; l < L; l++)
            kept += S.min_plan.keep_acts[l];
        return sd_err("[runtime] gpu_mem = %s%s: no plan fits; the smallest needs %s per GPU (layers_per_chunk = %d, "
                      "chunk_buffers = %d, %d/%d layers keeping activations%s)",
                      budget, job->gpu_mem > 0 ? "" : " (auto)", need, S.min_plan.layers_per_chunk,
                      S.min_plan.chunk_buffers, kept, L, forced);
    }

    *plan = S.best;
    plan->offload_inputs = S.offload;
    plan->predicted_step_s = S.best_pred.step_s;
    plan->predicted_compute_s = S.best_pred.compute_s;
    plan->predicted_h2d_s = S.best_pred.h2d_s;
    plan->predicted_d2h_s = S.best_pred.d2h_s;
    plan->predicted_optim_s = S.best_pred.optim_s;
    plan->predicted_recompute_s = S.best_pred.recompute_s;
    plan->predicted_p2p_s = S.best_pred.p2p_s;
    plan->predicted_host_mem_s = S.best_pred.host_mem_s;
    plan->predicted_exposed_s = S.best_pred.exposed_s;
    plan->predicted_link_s = S.best_pred.link_s;
    plan->bottleneck = S.best_pred.bottleneck;
    plan->gpu_bytes = S.best_gpu.total;
    plan->gpu_context_bytes = S.best_gpu.context;
    plan->host_bytes = S.best_host.total;
    /* 0 on the CPU backend with gpu_mem = auto: bounded by host memory (MemAvailable varies, and a
     * relaunch must find the same plan to adopt a dead launcher's state) */
    plan->gpu_budget = S.budget != INT64_MAX ? S.budget : 0;
    if (info) {
        memset(info, 0, sizeof *info);
        info->pred = S.best_pred;
        info->gpu = S.best_gpu;
        info->host = S.best_host;
        info->kept = S.best_kept;
        info->host_available = S.host_avail;
        info->host_fits = host_fits;
        info->gpu_auto = job->gpu_mem == 0;
        /* the workers share what the state leaves of the host (nothing when the state alone does not fit) */
        int64_t left = S.host_avail - (S.best_host.total - S.best_host.workers);
        info->gpu_budget = plan->gpu_budget ? plan->gpu_budget : left > 0 ? left / job->gpus : 0;
        info->evaluated = S.evaluated;
        report_routes(info, &routes, options, true);
        report_state_modes(&S, plan, S.best_kept, info);
        info->num_sources = nsrc;
        for (int i = 0; i < nsrc; i++)
            info->sources[i] = (struct plan_source_option){
                .source = sources[i],
                .fits = per[i].S.found,
                .host_fits = per[i].host_fits,
                .step_s = per[i].S.found ? per[i].S.best_pred.step_s : 0,
                .host_bytes = per[i].S.found ? per[i].S.best_host.total : 0,
            };
        snprintf(info->source_reason, sizeof info->source_reason, "%s", source_reason);
        report_host_states(&S, plan, S.best_kept, per[pick].state_steps, info);
        snprintf(info->host_state_reason, sizeof info->host_state_reason, "%s", per[pick].state_reason);
    }
    return 0;
}

/* ---- the longest sequence ---- */

/* Whether some plan of the job with seq_len T fits the device and the host's memory, by the search
 * plan_choose runs (every weights source, route and host state it would try), stopping at the first
 * plan that fits. Otherwise which memory ran out, and the smallest device memory any plan needs. */
static int fit_at(const struct job_config *job0, int T, const struct model_config *cfg, const struct calib *cal,
                  const struct topology *topo, const struct route_set *routes, int host_cpus, int hosts,
                  int64_t *min_gpu)
{
    struct job_config job = *job0;
    job.seq_len = T;
    struct search base;
    struct plan tmpl;
    search_start(&job, cfg, cal, topo, host_cpus, hosts, &base, &tmpl);
    base.fit_only = true;
    int sources[2], nsrc = source_candidates(&job, hosts, sources);
    bool device_fits = false;
    *min_gpu = INT64_MAX;
    /* the layer inputs on the device, then (a GPU) offloaded, as plan_choose tries them */
    bool gpu = job.device != DEVICE_CPU;
    for (int offload = gpu && job.act_policy == ACT_OFFLOAD; offload <= gpu; offload++) {
        base.offload = offload;
        for (int i = 0; i < nsrc; i++) {
            struct source_search ss;
            tmpl.weights_source = sources[i];
            if (search_source(&base, &tmpl, routes, &ss) != 0)
                return -1;
            if (ss.S.found && ss.host_fits)
                return SEQ_FITS;
            device_fits |= ss.S.found;
            if (ss.S.min_need < *min_gpu)
                *min_gpu = ss.S.min_need;
        }
    }
    return device_fits ? SEQ_LIMIT_HOST : SEQ_LIMIT_GPU;
}

int plan_longest_seq_len(const struct job_config *job, const struct model_config *cfg, const struct calib *cal,
                         const struct topology *topo, int host_cpus, int hosts, struct plan_seq_limit *out)
{
    memset(out, 0, sizeof *out);
    struct route_set routes;
    if (route_candidates(job, topo, hosts, &routes) != 0)
        return -1;
    /* what job.ini accepts (common/job.c): seq_len up to 2^24, micro_batch x seq_len up to 2^28 */
    int cap = imin(1 << 24, (1 << 28) / job->micro_batch);
    int64_t need;
    int lo = 0, hi = cap + 1; /* lo fits (0: trivially), hi does not (cap + 1: not accepted) */
    int hi_kind = SEQ_LIMIT_CAP;
    int64_t hi_need = 0;
    /* from the job's own length, doubling while it fits, then halving the bracket: every memory the
     * plans need grows with seq_len, so what fits at T fits below it */
    for (int T = imin(job->seq_len, cap);; T = imin(2 * T, cap)) {
        int r = fit_at(job, T, cfg, cal, topo, &routes, host_cpus, hosts, &need);
        if (r < 0)
            return -1;
        if (r != SEQ_FITS) {
            hi = T, hi_kind = r, hi_need = need;
            break;
        }
        lo = T;
        if (T == cap)
            break;
    }
    while (hi - lo > 1) {
        int mid = lo + (hi - lo) / 2;
        int r = fit_at(job, mid, cfg, cal, topo, &routes, host_cpus, hosts, &need);
        if (r < 0)
            return -1;
        if (r == SEQ_FITS)
            lo = mid;
        else
            hi = mid, hi_kind = r, hi_need = need;
    }
    out->seq_len = lo;
    out->limit = hi_kind;
    out->next_gpu_bytes = hi_kind == SEQ_LIMIT_GPU ? hi_need : 0;
    return 0;
}

int plan_make(const struct job_config *job, const struct model_config *cfg, const struct topology *topo,
              int host_cpus, int hosts, struct plan *plan)
{
    struct calib cal;
    if (calib_load(&cal) != 0)
        return sd_err_prefix("planner calibration");
    return plan_choose(job, cfg, &cal, topo, host_cpus, hosts, plan, NULL);
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

const char *plan_weights_source_name(int source)
{
    return source == WEIGHTS_MASTER ? "master" : "bf16_copy";
}

const char *plan_bottleneck_name(int bottleneck)
{
    static const char *names[] = {"device compute", "weights host->device", "gradients device->host",
                                  "GPU peer copies", "CPU optimizer", "host memory bandwidth",
                                  "link between hosts"};
    return bottleneck >= 0 && bottleneck < (int)(sizeof names / sizeof names[0]) ? names[bottleneck] : "?";
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
    char slots[64];
    if (cost_grads_direct(plan, job))
        snprintf(slots, sizeof slots, "gradients straight into the accumulator (%s)",
                 cost_grads_bf16(plan, job) ? "bf16" : "fp32");
    else
        snprintf(slots, sizeof slots, "%d grad slots per rank", plan->grad_slots);
    fprintf(f, "plan: %d layer(s) per chunk, %d chunk buffers, %s, %d optimizer process(es) x %d thread(s)\n",
            plan->layers_per_chunk, plan->chunk_buffers, slots, plan->optim_procs, plan->optim_threads);
    fprintf(f, "plan: weights streamed from the %s\n",
            plan_streams_master(plan) ? "fp32 master (rounded to bf16 on the device)" : "bf16 copy");
    if (plan->offload_inputs)
        fprintf(f, "plan: layer inputs offloaded to host memory between each layer's forward and backward\n");
    fprintf(f, "plan: activations kept for %d/%d layers (others recomputed); update %s; params %s, grads %s%s\n",
            kept, cfg->num_layers, update_mode_name(plan->update_mode),
            plan->param_route == PARAMS_SHARDED ? "sharded" : "replicated",
            plan->grad_route == GRADS_GPU ? "reduced on GPUs" : "reduced on CPU",
            plan->accumulate_on_device ? ", micro-steps summed on the device" : "");
    /* which attention kernels the CUDA backend runs, so which rates priced them */
    static const char *const kernels[] = {
        [ATTN_KERNELS_CPU] = "",
        [ATTN_KERNELS_CUDNN] = "; backward cuDNN's (not deterministic)",
        [ATTN_KERNELS_DET_CUDNN] = "; backward deterministic (cuDNN's deterministic engine)",
        [ATTN_KERNELS_DET_BUILTIN] = "; backward deterministic (built-in kernels)",
    };
    enum attn_kernels attn = cost_attention_kernels(job);
    const char *backward = kernels[attn];
    char tiled[160];
    if (attn == ATTN_KERNELS_DET_CUDNN && plan->attn_tile_bytes > 0) {
        snprintf(tiled, sizeof tiled, "; backward deterministic (cuDNN's deterministic engine, calls of at most "
                 "%g GiB of scores)", (double)plan->attn_tile_bytes / GIB);
        backward = tiled;
    }
    if (job->attention_pairs > 0)
        fprintf(f, "plan: attention priced by the data's documents: %.1f%% of whole windows' (query, key) pairs%s\n",
                100 * job->attention_pairs, backward);
    else
        fprintf(f, "plan: attention priced for whole windows%s\n", backward);
    fprintf(f, "plan: predicted step %.4f s (compute %.4f, weights in %.4f, grads out %.4f, optimizer %.4f; bound by "
               "%s); %s memory %.2f GiB per rank, host %.2f GiB\n",
            plan->predicted_step_s, plan->predicted_compute_s, plan->predicted_h2d_s, plan->predicted_d2h_s,
            plan->predicted_optim_s, plan_bottleneck_name(plan->bottleneck), job->device == DEVICE_CPU ? "worker" : "GPU",
            (double)plan->gpu_bytes / GIB, (double)plan->host_bytes / GIB);
    if (plan->hosts > 1)
        fprintf(f, "plan: %d hosts, optimizer state %s across them, link %.1f GB/s each way%s: busy %.4f s per step\n",
                plan->hosts, plan->host_state == HOST_STATE_SHARDED ? "sharded" : "replicated",
                cost_link_bw(job) / 1e9, job->host_link_gbps > 0 ? "" : " (assumed: runtime.host_link_gbps = 0)",
                plan->predicted_link_s);
}
