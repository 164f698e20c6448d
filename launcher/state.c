/* Creation, initialisation, export and removal of a job's shared state (see launch.h). */
#include "launch.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/bf16.h"
#include "common/data.h"
#include "common/err.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/hf.h"
#include "common/rng.h"
#include "planner/search.h"
#include "shm/futex.h"

#define STOPPING_WAIT_MS 30000 /* several hosts: how long a relaunch waits for the run before to stop */
#define INIT_BLOCK ((int64_t)1 << 20) /* elements per independently seeded block of random init */

static uint64_t hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Work items for the parallel initialisation: (tensor, block) pairs. */
struct init_ctx {
    const struct job_state *st;
    float *master;
    uint16_t *params16;     /* NULL when workers stream the master */
    uint16_t *params16_odd; /* the odd versions' copy (keep_prev), or NULL */
    bool random;
    int64_t num_items;
    int64_t *item_tensor, *item_block;
    _Atomic int64_t next;
};

static void init_block(struct init_ctx *ctx, int t, int64_t block)
{
    const struct tensor_desc *td = &ctx->st->lay.tensors[t];
    int64_t begin = block * INIT_BLOCK, end = begin + INIT_BLOCK < td->numel ? begin + INIT_BLOCK : td->numel;
    float *p = ctx->master + td->offset;
    if (ctx->random) {
        if (td->ndim >= 2) {
            /* HF _init_weights: normal(0, initializer_range) for linear weights and embeddings */
            uint64_t s = ctx->st->job.seed ^ hash_str(td->name) ^ (uint64_t)block * 0x632be59bd9b4e019ull;
            double stddev = ctx->st->cfg.initializer_range;
            for (int64_t i = begin; i < end; i += 2) {
                double u1 = ((double)(splitmix64(&s) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
                double u2 = (double)(splitmix64(&s) >> 11) * (1.0 / 9007199254740992.0);
                double r = sqrt(-2.0 * log(u1)) * stddev;
                p[i] = (float)(r * cos(2.0 * M_PI * u2));
                if (i + 1 < end)
                    p[i + 1] = (float)(r * sin(2.0 * M_PI * u2));
            }
        } else {
            float v = td->kind == TENSOR_Q_BIAS || td->kind == TENSOR_K_BIAS || td->kind == TENSOR_V_BIAS ? 0.0f : 1.0f;
            for (int64_t i = begin; i < end; i++)
                p[i] = v;
        }
    }
    if (!ctx->params16) /* workers stream the master: there is no copy */
        return;
    uint16_t *q = ctx->params16 + td->offset;
    f32_to_bf16_n(q + begin, p + begin, (size_t)(end - begin));
    if (ctx->params16_odd) /* whichever parity the first version has, both copies start equal */
        memcpy(ctx->params16_odd + td->offset + begin, q + begin, (size_t)(end - begin) * sizeof *q);
}

static void *init_thread(void *arg)
{
    struct init_ctx *ctx = arg;
    for (;;) {
        int64_t i = atomic_fetch_add(&ctx->next, 1);
        if (i >= ctx->num_items)
            return NULL;
        fault_point("launcher_init_block");
        init_block(ctx, (int)ctx->item_tensor[i], ctx->item_block[i]);
    }
}

/* Draws (random init) or converts (loaded) the master weights and writes the bf16 copy (if any). */
static int init_weights(struct job_state *st, bool random)
{
    struct init_ctx ctx = {.st = st, .master = st->shm.master, .params16 = st->shm.params16, .random = random};
    if (st->shape.params16_copies == 2)
        ctx.params16_odd = st->shm.params16 + st->lay.total_numel;
    int64_t n = 0;
    for (int t = 0; t < st->lay.num_tensors; t++)
        n += (st->lay.tensors[t].numel + INIT_BLOCK - 1) / INIT_BLOCK;
    ctx.item_tensor = malloc(sizeof(int64_t) * (size_t)n);
    ctx.item_block = malloc(sizeof(int64_t) * (size_t)n);
    if (!ctx.item_tensor || !ctx.item_block) {
        free(ctx.item_tensor);
        free(ctx.item_block);
        return sd_err("out of memory");
    }
    for (int t = 0; t < st->lay.num_tensors; t++)
        for (int64_t b = 0; b * INIT_BLOCK < st->lay.tensors[t].numel; b++) {
            ctx.item_tensor[ctx.num_items] = t;
            ctx.item_block[ctx.num_items++] = b;
        }
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int nthreads = ncpu < 1 ? 1 : ncpu > 64 ? 64 : (int)ncpu;
    pthread_t threads[64];
    for (int i = 0; i < nthreads; i++)
        pthread_create(&threads[i], NULL, init_thread, &ctx);
    for (int i = 0; i < nthreads; i++)
        pthread_join(threads[i], NULL);
    free(ctx.item_tensor);
    free(ctx.item_block);
    return 0;
}

static int64_t meminfo_bytes(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    char line[256];
    int64_t kb = -1;
    size_t klen = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            kb = strtoll(line + klen + 1, NULL, 10);
            break;
        }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

static int check_host_memory(uint64_t need)
{
    struct statvfs vfs;
    double gib = 1024.0 * 1024 * 1024;
    if (statvfs("/dev/shm", &vfs) == 0) {
        uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
        if (need > avail)
            return sd_err("not enough shared memory: the job needs %.2f GiB in /dev/shm, %.2f GiB is free (enlarge "
                          "it: mount -o remount,size=... /dev/shm)",
                          need / gib, avail / gib);
    }
    int64_t mem = meminfo_bytes("MemAvailable");
    if (mem > 0 && need > (uint64_t)mem)
        return sd_err("not enough host memory: the job needs %.2f GiB, %.2f GiB is available", need / gib, mem / gib);
    return 0;
}

/* Removes the job's objects other than ctl (ctl is created first and removed first). */
static void unlink_data_regions(const char *job_name)
{
    const char *rest[3] = {"params16", "master", "grads"};
    for (int i = 0; i < 3; i++) {
        char other[REGION_NAME_MAX];
        ctl_region_name(job_name, rest[i], other, sizeof other);
        shm_region_unlink(other);
    }
}

/* What differs between the live state's configuration (h) and this job: the job.ini keys, else
 * config.json or the plan; then what `--clean` would discard. */
static void describe_change(const struct job_state *st, struct ctl_header *h, char *out, size_t len)
{
    size_t used = 0;
    char key[96], there[JOB_PATH_MAX], here[JOB_PATH_MAX];
    for (int i = 0; job_config_key(i, key, sizeof key); i++) {
        job_config_value(&h->job, key, there, sizeof there);
        job_config_value(&st->job, key, here, sizeof here);
        if (strcmp(there, here) && used < len)
            used += (size_t)snprintf(out + used, len - used, "%s%s = %s there, %s here", used ? ", " : "", key,
                                     there, here);
    }
    if (used == 0 && used < len)
        used += (size_t)snprintf(out + used, len - used, "%s",
                                 memcmp(&h->model, &st->cfg, sizeof st->cfg) ? "the model's config.json differs"
                                                                             : "the plan's choices differ (runtime.*)");
    uint32_t committed = ctl_committed_step(h), on_disk = atomic_load(&h->ckpt_done_step);
    char newest[32] = "none";
    if (on_disk > 0)
        snprintf(newest, sizeof newest, "step-%u", on_disk);
    if (used < len && committed > on_disk)
        snprintf(out + used, len - used, "; it holds %u trained step(s) not on disk (the newest checkpoint: %s), "
                 "which --clean discards", committed - on_disk, newest);
}

/* Looks for the objects of the same job, under its owner lock (so no live launcher has them): 0 when
 * there are none (or only a state whose launcher died before its weights were in place: nothing was
 * trained, so it is removed), 1 when a dead launcher left an initialised state of this very
 * configuration behind (to be adopted), -1 (with the reason) when they belong to another
 * configuration or are not ours. */
static int check_existing_state(const struct job_state *st)
{
    char name[REGION_NAME_MAX];
    ctl_region_name(st->job_name, "ctl", name, sizeof name);
    if (!shm_region_exists(name)) {
        /* without ctl, any other object of this job is a leftover of a launcher that died while
         * creating or removing the state */
        unlink_data_regions(st->job_name);
        return 0;
    }
    struct shm_region r;
    int pid = 0;
    bool same = false, unfinished = false;
    char changed[2048] = "";
    if (shm_region_attach(&r, name, false) != 0)
        return -1;
    struct ctl_header *h = r.base;
    if (r.size >= sizeof *h && h->magic == CTL_MAGIC && h->version == CTL_VERSION) {
        pid = atomic_load(&h->launcher_pid);
        same = h->job_hash == st->job_hash;
        unfinished = !atomic_load_explicit(&h->initialised, memory_order_acquire);
        if (!same && !unfinished)
            describe_change(st, h, changed, sizeof changed);
    } else if (r.size >= sizeof *h && h->magic == 0) {
        unfinished = true; /* created, the header never written */
    }
    shm_region_detach(&r);
    if (!unfinished && st->hosts.count > 1) {
        /* the other hosts went on without it: training continues from the newest checkpoint */
        printf("slidedp: host %d: removing the shared state a dead launcher left (several hosts resume from "
               "the checkpoint on disk)\n", st->hosts.index);
        shm_region_unlink(name);
        unlink_data_regions(st->job_name);
        return 0;
    }
    if (unfinished) {
        printf("slidedp: removing the shared state of a launcher that died while creating it (nothing was "
               "trained)\n");
        shm_region_unlink(name);
        unlink_data_regions(st->job_name);
        return 0;
    }
    if (same)
        return 1;
    return sd_err("the shared state a dead launcher (pid %d) left in /dev/shm/slidedp.%s.* (log.dir %s) is of a "
                  "different configuration: %s. Relaunch with its values to continue it, or remove it with "
                  "slidedp-launch --clean %s",
                  pid, st->job_name, st->job.log_dir, changed, st->job.ini_path);
}

static int attach_regions(struct job_state *st)
{
    char name[REGION_NAME_MAX];
    const char *what[4] = {"ctl", "params16", "master", "grads"};
    struct shm_region *regs[4] = {&st->ctl_region, &st->params16_region, &st->master_region, &st->grads_region};
    for (int i = 0; i < 4; i++) {
        if (i == 1 && !st->shape.params16_copies) /* no bf16 copy: workers stream the master */
            continue;
        ctl_region_name(st->job_name, what[i], name, sizeof name);
        if (shm_region_attach(regs[i], name, true) != 0) {
            for (int j = 0; j < i; j++)
                shm_region_detach(regs[j]);
            return -1;
        }
    }
    st->created = true;
    return 0;
}

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* Identifies the configuration whose state may be adopted after a launcher crash. Of the plan,
 * only its choices (the layout of the state and how the processes use it): its predictions follow
 * the host's calibration, which may have been measured again before the relaunch. */
static uint64_t job_hash(const struct job_state *st)
{
    struct job_config job = st->job;
    memset(job.ini_path, 0, sizeof job.ini_path);
    uint64_t h = fnv1a(0xcbf29ce484222325ull, &job, sizeof job);
    h = fnv1a(h, &st->cfg, sizeof st->cfg);
    const struct plan *p = &st->plan;
    int choices[] = {p->layers_per_chunk, p->chunk_buffers, p->grad_slots, p->optim_procs, p->optim_threads,
                     p->update_mode, p->param_route, p->grad_route, p->logits_rows, p->accumulate_on_device,
                     p->weights_source, p->offload_inputs, (int)(p->attn_tile_bytes >> 20)};
    h = fnv1a(h, choices, sizeof choices);
    return fnv1a(h, p->keep_acts, (size_t)st->cfg.num_layers);
}

static int create_regions(struct job_state *st, const struct ctl_sizes *sz)
{
    char name[REGION_NAME_MAX];
    struct {
        const char *what;
        struct shm_region *r;
        uint64_t size;
    } objs[4] = {
        {"ctl", &st->ctl_region, sz->ctl_bytes},
        {"params16", &st->params16_region, sz->params16_bytes},
        {"master", &st->master_region, sz->master_bytes},
        {"grads", &st->grads_region, sz->grads_bytes},
    };
    for (int i = 0; i < 4; i++) {
        if (!objs[i].size) /* params16 when workers stream the master */
            continue;
        ctl_region_name(st->job_name, objs[i].what, name, sizeof name);
        if (shm_region_create(objs[i].r, name, objs[i].size) != 0) {
            for (int j = 0; j < i; j++) {
                shm_region_detach(objs[j].r);
                if (objs[j].size)
                    shm_region_unlink(objs[j].r->name);
            }
            return -1;
        }
    }
    st->created = true;
    return 0;
}

static void fill_ctl(struct job_state *st, const struct ctl_sizes *sz)
{
    struct ctl_header *h = st->ctl_region.base;
    memset(h, 0, sizeof *h);
    h->magic = CTL_MAGIC;
    h->version = CTL_VERSION;
    h->header_size = sizeof *h;
    snprintf(h->job_name, sizeof h->job_name, "%s", st->job_name);
    h->job = st->job;
    h->model = st->cfg;
    h->plan = st->plan;
    h->topo = st->topo;
    h->gpus = st->shape.gpus;
    h->hosts = st->hosts.count;
    h->host_index = st->hosts.index;
    h->optim_procs = st->shape.optim_procs;
    h->grad_slots = st->shape.grad_slots;
    h->num_tensors = st->shape.num_tensors;
    h->num_chunks = st->shape.num_chunks;
    h->first_step = (int32_t)st->resumed_step + 1;
    h->job_hash = st->job_hash;
    h->keep_prev = st->shape.params16_copies == 2;
    h->exchange = plan_uses_exchange(&st->plan, st->job.gpus);
    h->grads_direct = st->shape.grads_direct;
    h->grads_bf16 = st->shape.grads_bf16;
    h->window_shm_bytes = st->shape.window_shm_bytes;
    h->ckpt_every = (uint32_t)st->job.ckpt_every;
    snprintf(h->run_id, sizeof h->run_id, "%s", st->run_id);
    h->total_numel = st->shape.total_numel;
    h->max_chunk_numel = st->shape.max_chunk_numel;
    h->num_params = st->lay.num_params;
    h->params16_bytes = sz->params16_bytes;
    h->master_bytes = sz->master_bytes;
    h->grads_bytes = sz->grads_bytes;
    h->off_tensors = sz->off_tensors;
    h->off_chunks = sz->off_chunks;
    h->off_chunk_state = sz->off_chunk_state;
    h->off_rings = sz->off_rings;
    h->off_slots = sz->off_slots;
    h->off_doorbells = sz->off_doorbells;
    h->off_procs = sz->off_procs;
    h->off_steps = sz->off_steps;
    h->off_journals = sz->off_journals;
    h->off_xchg = sz->off_xchg;
    h->off_losses = sz->off_losses;
    h->size = sz->ctl_bytes;
    h->created_ns = clock_ns();
    atomic_store(&h->launcher_pid, (int32_t)getpid());
    atomic_store(&h->generation, 1);
    memcpy(ctl_tensors(h), st->lay.tensors, sizeof(struct tensor_desc) * (size_t)st->lay.num_tensors);
    memcpy(ctl_chunks(h), st->lay.chunks, sizeof(struct chunk_desc) * (size_t)st->lay.num_chunks);
    int *owner = malloc(sizeof(int) * (size_t)st->lay.num_chunks);
    SD_ASSERT(owner);
    plan_assign_owners(&st->lay, st->plan.optim_procs, owner);
    for (int c = 0; c < st->lay.num_chunks; c++)
        ctl_chunk_state(h, c)->owner = owner[c];
    /* sharded: the chunks are spread over the hosts by the rule that spreads them over optimizers */
    h->hosts_sharded = st->hosts.count > 1 && st->plan.host_state == HOST_STATE_SHARDED; /* job.ini's, or auto's choice */
    if (h->hosts_sharded)
        plan_assign_owners(&st->lay, st->hosts.count, owner);
    for (int c = 0; c < st->lay.num_chunks; c++)
        ctl_chunk_state(h, c)->host = h->hosts_sharded ? owner[c] : st->hosts.index;
    free(owner);
    for (int r = 0; r < h->gpus; r++)
        for (int k = 0; k < h->optim_procs; k++) {
            ring_init(ctl_ring(h, r, k));
            /* the local optimizers take this host's gradients once the relay has sent them */
            ctl_ring(h, r, k)->relay_gated = h->hosts > 1 && ctl_rank_is_local(h, r);
        }
    for (int i = 0; i < h->gpus + h->optim_procs; i++)
        atomic_store(&((struct proc_slot *)((char *)h + h->off_procs))[i].generation, 1);
    uint32_t first = st->resumed_step + 1;
    for (uint32_t s = first; s < first + CTL_STEP_RECORDS; s++)
        atomic_store(&ctl_step(h, s)->step, s);
    for (int c = 0; c < st->lay.num_chunks; c++) {
        atomic_store(&ctl_chunk_state(h, c)->version, st->resumed_step);
        atomic_store(&ctl_chunk_state(h, c)->reduced_step, st->resumed_step);
    }
    atomic_store(&h->metrics_step, st->resumed_step);
    atomic_store(&h->ckpt_done_step, st->resumed_step);
    ctl_xchg_reset(h, st->resumed_step);
}

static void map_views(struct job_state *st)
{
    st->shm.ctl = st->ctl_region.base;
    st->shm.params16 = st->params16_region.base;
    st->shm.grads = st->grads_region.base;
    /* as job_shm_attach maps them: the accumulator heads the grads region when gradients go
     * straight into it (in bf16 when they cross in bf16), else follows v in the master region */
    bool direct = plan_grads_direct(&st->plan, st->job.gpus, st->job.grad_accum);
    bool bf16 = plan_grads_bf16(&st->plan, &st->job);
    job_shm_master_views(&st->shm, st->master_region.base, st->lay.total_numel, direct, st->job.optimizer_state);
    st->shm.grad_acc16 = bf16 ? (uint16_t *)st->shm.grads : NULL;
    if (direct)
        st->shm.grad_acc = bf16 ? NULL : st->shm.grads;
}

uint64_t proc_start_ticks(int pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    /* after "pid (comm) ": the comm may hold spaces and parentheses, so count from the last ')' */
    char *p = strrchr(buf, ')');
    unsigned long long ticks = 0;
    for (int field = 2; p && field < 22; field++)
        p = strchr(p + 1, ' ');
    if (!p || sscanf(p + 1, "%llu", &ticks) != 1)
        return 0;
    return ticks;
}

/* Whether pid is still the process the slot describes: the start time the launcher recorded, and
 * "--job <our job>" on its command line. */
static bool is_our_orphan(int pid, const struct proc_slot *slot, const char *job_name)
{
    uint64_t start = atomic_load(&slot->start_ticks);
    if (pid <= 0 || start == 0 || proc_start_ticks(pid) != start)
        return false;
    char path[64], args[4096];
    snprintf(path, sizeof path, "/proc/%d/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(args, 1, sizeof args - 1, f);
    fclose(f);
    args[n] = 0;
    for (size_t i = 0; i < n; i += strlen(args + i) + 1)
        if (!strcmp(args + i, "--job") && i + 6 < n && !strcmp(args + i + 6, job_name))
            return true;
    return false;
}

void state_replace_orphans(struct job_state *st)
{
    struct ctl_header *h = st->shm.ctl;
    int n = h->gpus + h->optim_procs;
    struct proc_slot *slots = (struct proc_slot *)((char *)h + h->off_procs);
    for (int i = 0; i < n; i++) {
        int pid = atomic_load(&slots[i].pid);
        /* a new generation fences anything a survivor might still do */
        atomic_fetch_add(&slots[i].generation, 1);
        /* and the process we start in its place is a restart: it may find a step half done by the
         * one before (a worker, every gradient of a step posted but the step not marked done), which
         * only a restart's recovery looks for (worker/pipeline.c train_step) */
        if (pid > 0)
            atomic_fetch_add(&slots[i].restarts, 1);
        if (is_our_orphan(pid, &slots[i], st->job_name))
            kill(pid, SIGKILL);
    }
    for (int tries = 0; tries < 200; tries++) {
        bool alive = false;
        for (int i = 0; i < n; i++)
            alive |= is_our_orphan(atomic_load(&slots[i].pid), &slots[i], st->job_name);
        if (!alive)
            break;
        usleep(10000);
    }
    for (int r = 0; r < h->gpus; r++)
        ctl_repair_slots(h, r);
    ctl_xchg_reset(h, ctl_committed_step(h)); /* every worker starts again at the first uncommitted step */
    /* the dead launcher may have logged a step without recycling its record */
    uint32_t logged = atomic_load(&h->metrics_step);
    for (uint32_t s = logged + 1; s <= logged + CTL_STEP_RECORDS; s++) {
        struct step_record *rec = ctl_step(h, s);
        if (atomic_load(&rec->step) != s)
            ctl_recycle_step(h, s - CTL_STEP_RECORDS);
    }
    atomic_fetch_add(&h->generation, 1);
    atomic_store(&h->launcher_pid, (int32_t)getpid());
    atomic_store(&h->stop, STOP_NONE);
    atomic_store(&h->stop_step, 0);
    atomic_store(&h->abandoned_step, 0); /* a drain's verdict on a step that will now be completed */
    atomic_store(&h->workers_ready, 0);
}

/* A new run's id: 16 random hex digits. */
static int new_run_id(char *out, size_t len)
{
    uint64_t x;
    if (getrandom(&x, sizeof x, 0) != (ssize_t)sizeof x)
        return sd_err("getrandom: %s", strerror(errno));
    snprintf(out, len, "%016llx", (unsigned long long)x);
    return 0;
}

/* The newest checkpoint is of the last step and final/ is exported: a relaunch
 * would train nothing. */
static bool job_is_finished(const struct job_state *st)
{
    char final[JOB_PATH_MAX + 16];
    snprintf(final, sizeof final, "%s/final", st->job.ckpt_dir);
    return st->resumed_step == (uint32_t)st->job.steps && fs_exists(final);
}

static int create_or_adopt(struct job_state *st)
{
    struct job_config *job = &st->job;
    snprintf(st->config_json, sizeof st->config_json, "%s/config.json", job->model_path);
    if (model_config_load(st->config_json, &st->cfg) != 0)
        return -1;
    struct data_set data;
    if (data_open(job->data_train, job->seq_len, st->cfg.vocab_size, job->shuffle, job->seed, &data) != 0)
        return sd_err_prefix("[data] train");
    /* job->gpus counts this host's ranks until the hosts' ranks are added below */
    if (data_check_targets(&data, job->steps, st->hosts.count * job_sequences_per_step(job)) != 0) {
        data_close(&data);
        return sd_err_prefix("[data] train %s", job->data_train);
    }
    /* workers and monitors read the resolved choice; the planner prices attention by the data's documents */
    int resolved = job_resolve_attention(job, &data);
    data_close(&data);
    if (resolved != 0)
        return -1;
    if (job->data_val[0]) {
        if (data_open(job->data_val, job->seq_len, st->cfg.vocab_size, false, job->seed, &data) != 0)
            return sd_err_prefix("[data] val");
        data_close(&data);
    }
    /* several hosts: gpu_mem = auto plans for the smallest GPUs of any host */
    struct topology plan_topo = st->topo;
    if (hosts_least_gpu_memory(&st->hosts, &plan_topo) != 0 ||
        plan_make(job, &st->cfg, &plan_topo, (int)sysconf(_SC_NPROCESSORS_ONLN), st->hosts.count, &st->plan) != 0)
        return -1;
    /* several hosts: host 0's plan for one host on every host, and the state shaped for every
     * rank of the job (the relay posts the other hosts' gradients as theirs) */
    if (st->hosts.count > 1 && job->weights_source == WEIGHTS_MASTER)
        return sd_err("[runtime] weights_source = master is for one host: several hosts read the bf16 copy (the "
                      "other hosts' updated chunks arrive into it)");
    if (hosts_share_plan(&st->hosts, &st->plan) != 0)
        return -1;
    if (st->hosts.count * job->gpus > JOB_MAX_GPUS)
        return sd_err("%d hosts x %d GPUs exceed %d ranks", st->hosts.count, job->gpus, JOB_MAX_GPUS);
    job->gpus *= st->hosts.count;
    if (layout_build(&st->cfg, st->plan.layers_per_chunk, &st->lay) != 0)
        return -1;
    struct hf_weights weights = {0};
    if (!job->init_random && hf_weights_open(job->model_path, &weights) != 0)
        return -1;
    ctl_shape_of(job, &st->plan, &st->lay, &st->shape);
    struct ctl_sizes sz;
    int rc = ctl_compute_sizes(&st->shape, &sz);
    ctl_host_job_name(job->log_dir, st->hosts.count, st->hosts.index, st->job_name, sizeof st->job_name);
    st->job_hash = job_hash(st);
    if (rc == 0 && hosts_check_same_job(&st->hosts, st->job_hash) != 0) {
        hf_weights_close(&weights);
        return -1;
    }
    /* several hosts: a launcher of the run before (another host was lost) may still be stopping */
    int existing = -1;
    if (rc == 0 && owner_lock(st->job_name, st->hosts.count > 1 ? STOPPING_WAIT_MS : 0, &st->lock_fd) == 0) {
        st->locked = true;
        existing = check_existing_state(st);
        fault_point("launcher_state_checked");
    }
    if (existing == 1) {
        hf_weights_close(&weights);
        if (attach_regions(st) != 0)
            return -1;
        map_views(st);
        if (ctl_validate(st->shm.ctl, st->ctl_region.size, st->ctl_region.name) != 0) {
            st->created = false; /* not ours to remove */
            state_destroy(st);
            return -1;
        }
        if (st->shm.ctl->size != sz.ctl_bytes || st->params16_region.size != sz.params16_bytes ||
            st->master_region.size != sz.master_bytes || st->grads_region.size != sz.grads_bytes) {
            st->created = false; /* not ours to remove */
            state_destroy(st);
            return sd_err("the shared state of job %s does not match its configuration; remove it with: "
                          "slidedp-launch --clean %s",
                          st->job_name, job->ini_path);
        }
        snprintf(st->run_id, sizeof st->run_id, "%s", st->shm.ctl->run_id);
        st->adopted = true;
        return 0;
    }
    if (existing < 0)
        rc = -1;
    if (rc == 0 && job->resume_auto)
        rc = checkpoint_latest(job, &st->resumed_step);
    if (rc == 0 && st->resumed_step > 0)
        rc = checkpoint_identity(st, st->resumed_step);
    bool finished = rc == 0 && st->resumed_step > 0 && job_is_finished(st);
    if (rc == 0)
        rc = hosts_check_same_checkpoint(&st->hosts, job->ckpt_dir, st->resumed_step, finished);
    if (rc == 0 && finished) {
        hf_weights_close(&weights);
        st->finished = true;
        return 0;
    }
    if (rc == 0 && st->resumed_step > 0)
        rc = checkpoint_check(st, st->resumed_step);
    if (rc == 0)
        rc = check_host_memory(sz.ctl_bytes + sz.params16_bytes + sz.master_bytes + sz.grads_bytes);
    if (rc == 0)
        rc = preflight_paths(st);
    if (rc == 0 && !job->resume_auto && st->hosts.index == 0) /* host 0 alone: the directory is shared */
        rc = checkpoint_set_aside(job);
    if (rc == 0 && !st->run_id[0])
        rc = new_run_id(st->run_id, sizeof st->run_id);
    if (rc == 0)
        rc = create_regions(st, &sz);
    if (rc != 0) {
        hf_weights_close(&weights);
        return -1;
    }
    fault_point("launcher_regions_created");
    map_views(st);
    fill_ctl(st, &sz);
    if (st->resumed_step > 0)
        rc = checkpoint_load(st, st->resumed_step) != 0 ? -1 : init_weights(st, false);
    else if (!job->init_random && hf_weights_load(&weights, &st->lay, st->shm.master) != 0)
        rc = -1;
    else
        rc = init_weights(st, job->init_random);
    hf_weights_close(&weights);
    if (rc != 0) {
        state_destroy(st);
        return -1;
    }
    state_release_remote_chunks(st);
    /* release: the weights and the header are complete before a relaunch may adopt them */
    atomic_store_explicit(&st->shm.ctl->initialised, 1, memory_order_release);
    return 0;
}

int state_create(struct job_state *st)
{
    if (create_or_adopt(st) == 0)
        return 0;
    state_unlock(st);
    return -1;
}

void state_unlock(struct job_state *st)
{
    if (st->locked)
        owner_unlock(st->job_name, st->lock_fd);
    st->locked = false;
}

/* Gives the pages of master, m, v and the accumulator of every chunk another host holds back to
 * the system (several hosts, sharded): this host never reads them, so its shm holds about 1/H of
 * the optimizer state. After the initial weights, a resume, and each checkpoint host 0 gathers. */
void state_release_remote_chunks(struct job_state *st)
{
    struct ctl_header *h = st->shm.ctl;
    if (!h->hosts_sharded)
        return;
    size_t state_size = ctl_state_size(st->job.optimizer_state);
    struct {
        void *base;
        size_t elem;
    } arrays[4] = {{st->shm.master, 4},
                   {st->shm.exp_avg ? (void *)st->shm.exp_avg : (void *)st->shm.exp_avg16, state_size},
                   {st->shm.exp_avg_sq ? (void *)st->shm.exp_avg_sq : (void *)st->shm.exp_avg_sq16, state_size},
                   {st->shm.grad_acc, 4}};
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int c = 0; c < h->num_chunks; c++) {
        if (ctl_chunk_is_here(h, c))
            continue;
        const struct chunk_desc *ch = &ctl_chunks(h)[c];
        for (int a = 0; a < 4; a++) {
            if (!arrays[a].base)
                continue;
            uintptr_t begin = (uintptr_t)arrays[a].base + (uintptr_t)ch->offset * arrays[a].elem;
            uintptr_t end = begin + (uintptr_t)ch->numel * arrays[a].elem;
            begin = (begin + page - 1) & ~(page - 1);
            end &= ~(page - 1);
            if (end > begin)
                madvise((void *)begin, end - begin, MADV_REMOVE);
        }
    }
}

void state_destroy(struct job_state *st)
{
    struct shm_region *regs[4] = {&st->ctl_region, &st->params16_region, &st->master_region, &st->grads_region};
    for (int i = 0; i < 4; i++) {
        shm_region_detach(regs[i]);
        if (st->created && regs[i]->name[0])
            shm_region_unlink(regs[i]->name);
    }
    st->created = false;
    layout_free(&st->lay);
    state_unlock(st);
}

int state_export(const struct job_state *st, const char *dir)
{
    char tmp[JOB_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    if (fs_rm_rf(tmp) != 0)
        return -1;
    char parent[JOB_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", dir);
    char *slash = strrchr(parent, '/');
    if (slash) {
        *slash = 0;
        if (fs_mkdir_p(parent, 0755) != 0)
            return -1;
    }
    enum hf_export_dtype dt = st->job.export_dtype == EXPORT_FP32 ? HF_EXPORT_FP32 : HF_EXPORT_BF16;
    if (hf_export(tmp, st->config_json, &st->cfg, &st->lay, st->shm.master, dt, (size_t)5 << 30) != 0 ||
        hf_copy_tokenizer_files(st->job.model_path, tmp) != 0) {
        fs_rm_rf(tmp);
        return -1;
    }
    fault_point("ckpt_tmp_written");
    if (fs_publish_dir(tmp, dir) != 0) {
        fs_rm_rf(tmp);
        return -1;
    }
    fault_point("ckpt_renamed");
    return 0;
}
