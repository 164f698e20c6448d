/* Several hosts through MPI (docs/design.md §11): the host from the MPI launcher's environment, the
 * plan every host takes from host 0, and the relay thread. The relay makes this host's ctl region
 * look like one host running every rank of the job: it sends each gradient this host's workers
 * post (before the local optimizer may take it, ring.relayed) and each step mark of its ranks to
 * the other hosts, and posts what arrives from them into the gradient slots and rings of the
 * remote ranks, so the optimizers add every micro-batch in the global order, unchanged. */
#include "hosts.h"

#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "common/fault.h"
#include "shm/futex.h"

#define RELAY_TAG 21
#define RELAY_FLUSH_TIMEOUT_S 60

/* One environment's pair of variables naming the world size and this process's place in it. */
struct mpi_env {
    const char *size, *rank;
};

static int env_int(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return -1;
    char *end;
    long x = strtol(v, &end, 10);
    return *end || x < 0 || x > 1 << 20 ? -2 : (int)x;
}

int hosts_detect(struct hosts *h)
{
    static const struct mpi_env envs[] = {
        {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
        {"PMI_SIZE", "PMI_RANK"},
        {"PMIX_SIZE", "PMIX_RANK"},
        {"SLURM_NTASKS", "SLURM_PROCID"},
    };
    h->count = 1;
    h->index = 0;
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        int size = env_int(envs[i].size), rank = env_int(envs[i].rank);
        if (size == -1 && rank == -1)
            continue;
        if (size < 1 || rank < 0 || rank >= size)
            return sd_err("%s and %s do not name a host (%s, %s)", envs[i].size, envs[i].rank,
                          getenv(envs[i].size) ? getenv(envs[i].size) : "unset",
                          getenv(envs[i].rank) ? getenv(envs[i].rank) : "unset");
        h->count = size;
        h->index = rank;
        return 0;
    }
    return 0;
}

int hosts_init(const struct hosts *h)
{
    if (h->count == 1)
        return 0;
    int provided = 0;
    if (MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        return sd_err("MPI_Init_thread failed");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int size = 0, rank = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (provided < MPI_THREAD_SERIALIZED)
        return sd_err("this MPI library gives thread level %d; the relay needs MPI_THREAD_SERIALIZED", provided);
    if (size != h->count || rank != h->index)
        return sd_err("MPI says host %d of %d, the environment host %d of %d", rank, size, h->index, h->count);
    return 0;
}

int hosts_least_gpu_memory(const struct hosts *h, struct topology *t)
{
    if (h->count == 1)
        return 0;
    int least[JOB_MAX_GPUS];
    if (MPI_Allreduce(t->memory_mib, least, t->gpus, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        return sd_err("host %d: cannot compare the GPUs' memory with the other hosts", h->index);
    memcpy(t->memory_mib, least, sizeof(int) * (size_t)t->gpus);
    return 0;
}

int hosts_share_plan(const struct hosts *h, struct plan *plan)
{
    if (h->count == 1)
        return 0;
    if (MPI_Bcast(plan, (int)sizeof *plan, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        return sd_err("host %d: cannot receive host 0's plan", h->index);
    return 0;
}

int hosts_check_same_job(const struct hosts *h, uint64_t job_hash)
{
    if (h->count == 1)
        return 0;
    unsigned long long mine = job_hash, lo = 0, hi = 0;
    if (MPI_Allreduce(&mine, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS ||
        MPI_Allreduce(&mine, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return sd_err("host %d: cannot compare the job with the other hosts", h->index);
    if (lo != hi)
        return sd_err("host %d: the hosts do not run the same job (job.ini, overrides, config.json or plan differ)",
                      h->index);
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void nap(long ns)
{
    struct timespec ts = {0, ns};
    nanosleep(&ts, NULL);
}

int hosts_check_same_checkpoint(const struct hosts *h, const char *ckpt_dir, uint32_t step, bool finished)
{
    if (h->count == 1)
        return 0;
    unsigned long long mine = (unsigned long long)step << 1 | finished, all[JOB_MAX_GPUS];
    SD_ASSERT(h->count <= JOB_MAX_GPUS);
    if (MPI_Allgather(&mine, 1, MPI_UNSIGNED_LONG_LONG, all, 1, MPI_UNSIGNED_LONG_LONG, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        return sd_err("host %d: cannot compare checkpoint.dir with the other hosts", h->index);
    int other = -1;
    for (int i = 0; i < h->count && other < 0; i++)
        other = all[i] != all[0] ? i : -1;
    if (other < 0)
        return 0;
    char seen[2][48];
    int hosts[2] = {0, other};
    for (int k = 0; k < 2; k++) {
        unsigned long long v = all[hosts[k]];
        if (v >> 1)
            snprintf(seen[k], sizeof seen[k], "step-%llu%s", v >> 1, v & 1 ? " and final/" : "");
        else
            snprintf(seen[k], sizeof seen[k], "no checkpoint");
    }
    return sd_err("the hosts see different checkpoints in checkpoint.dir %s (host 0: %s, host %d: %s): every host "
                  "must see the same directory (a shared file system); nothing was started",
                  ckpt_dir, seen[0], other, seen[1]);
}

#define FINALIZE_NOTE_S 60

/* Waits for every host without a bound: host 0 may write the export and the last checkpoint for a
 * long time, and a host that leaves without MPI_Finalize makes mpirun kill the others (host 0 in
 * the middle of its writes). A lost host is mpirun's to detect: it ends every host then. */
void hosts_finalize(const struct hosts *h)
{
    if (h->count == 1)
        return;
    MPI_Request req;
    int done = 0;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &req) != MPI_SUCCESS) {
        fprintf(stderr, "slidedp-launch: host %d: cannot wait for the other hosts; leaving without MPI_Finalize\n",
                h->index);
        return;
    }
    for (uint64_t t0 = now_ns(), noted = 0; !done; nap(1000000)) {
        MPI_Test(&req, &done, MPI_STATUS_IGNORE);
        uint64_t waited_s = (now_ns() - t0) / 1000000000ull;
        if (!done && waited_s >= noted + FINALIZE_NOTE_S) {
            noted = waited_s;
            /* stderr: the stdout of hosts other than 0 is quiet */
            fprintf(stderr, "slidedp-launch: host %d: done; waiting for the other hosts to finish (host 0 writes "
                            "final/ and the last checkpoint), %llu s so far\n", h->index, (unsigned long long)waited_s);
        }
    }
    MPI_Finalize();
}

/* ---- the relay ---- */

enum relay_kind {
    MSG_GRAD = 1,   /* one micro-batch's gradient of a chunk; its elements follow the header */
    MSG_DONE = 2,   /* a rank posted every gradient of a step: its loss sum */
    MSG_VAL = 3,    /* a rank's validation sums of a step */
    MSG_NORM = 4,   /* sharded: a chunk's gradient of a step is summed; its squared norm */
    MSG_PARAMS = 5, /* sharded: a chunk's bf16 parameters at a version follow */
    MSG_STATE = 6,  /* sharded, to host 0: a chunk's master, m and v at a checkpoint's step follow */
};

struct relay_msg {
    uint32_t kind, rank, step, chunk, micro, pad;
    uint64_t elem_begin, elem_count;
    double sum;             /* MSG_DONE: the loss sum; MSG_VAL: the validation loss sum; MSG_NORM: sumsq */
    int64_t count, correct; /* MSG_VAL */
};

/* A message received, waiting for a free slot of its rank or for its step's record. */
struct inbound {
    struct inbound *next;
    struct relay_msg *msg;
};

/* A message sent to every other host, kept until the sends complete. */
struct outbound {
    struct outbound *next;
    struct relay_msg *msg;
    int num_reqs;
    MPI_Request reqs[];
};

struct relay {
    pthread_t thread;
    _Atomic bool stop, failed;
    _Atomic uint32_t marked_step;     /* every local rank's marks up to this step are sent */
    char why[256];
    struct ctl_header *h;
    struct job_shm *shm;
    struct hosts hosts;
    uint32_t next_mark[JOB_MAX_GPUS]; /* per local rank: the step whose marks go out next */
    bool done_sent[JOB_MAX_GPUS];     /* ... and whether its MSG_DONE already went */
    struct inbound *in_head[JOB_MAX_GPUS], *in_tail[JOB_MAX_GPUS]; /* per remote rank, in arrival order */
    struct inbound *states; /* host 0: MSG_STATE of a later step than the one it gathers now */
    struct outbound *out;
    /* sharded, per chunk: what went out of ours (the reduced step, the version, the state's step) */
    uint32_t *sent_reduced, *sent_version;
    _Atomic uint32_t *state_step; /* ours: sent to host 0; on host 0 the others': received */
};

static bool relay_fail(struct relay *r, const char *what, int rc)
{
    char err[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, err, &len);
    snprintf(r->why, sizeof r->why, "host %d: %s failed: %s", r->hosts.index, what, err);
    atomic_store(&r->failed, true);
    return false;
}

/* Sends m to host `to`, or to every other host when `to` is -1; frees it once sent. */
static bool send_to(struct relay *r, struct relay_msg *m, size_t bytes, int to)
{
    struct outbound *o = malloc(sizeof *o + sizeof(MPI_Request) * (size_t)r->hosts.count);
    SD_ASSERT(o);
    o->msg = m;
    o->num_reqs = 0;
    fault_point("relay_sending");
    for (int host = 0; host < r->hosts.count; host++) {
        if (host == r->hosts.index || (to >= 0 && host != to))
            continue;
        int rc = MPI_Isend(m, (int)bytes, MPI_BYTE, host, RELAY_TAG, MPI_COMM_WORLD, &o->reqs[o->num_reqs]);
        if (rc != MPI_SUCCESS)
            return relay_fail(r, "MPI_Isend", rc);
        o->num_reqs++;
    }
    o->next = r->out;
    r->out = o;
    return true;
}

static void ring_doorbell(struct ctl_header *h, int optim)
{
    struct doorbell *db = ctl_doorbell(h, optim);
    atomic_fetch_add_explicit(&db->seq, 1, memory_order_release);
    futex_wake_all(&db->seq);
}

/* Sends every gradient this host's ranks pushed since the last call, then lets the local
 * optimizers take them. */
static bool send_grads(struct relay *r, bool *progressed)
{
    struct ctl_header *h = r->h;
    for (int rank = ctl_local_first(h); rank < ctl_local_first(h) + ctl_local_ranks(h); rank++) {
        for (int k = 0; k < h->optim_procs; k++) {
            struct ring *ring = ctl_ring(h, rank, k);
            uint32_t relayed = atomic_load_explicit(&ring->relayed, memory_order_relaxed); /* only we write it */
            /* acquire: pairs with the worker's release of head in ring_push */
            uint32_t head = atomic_load_explicit(&ring->head, memory_order_acquire);
            if (relayed == head)
                continue;
            for (; relayed != head; relayed++) {
                const struct chunk_desc_msg *d = &ring->elems[relayed & (RING_CAP - 1)];
                SD_ASSERT(d->slot != DESC_SLOT_DIRECT && d->chunk < (uint32_t)h->num_chunks);
                /* sharded: only the host that sums the chunk needs it (the local optimizers drop it) */
                int to = h->hosts_sharded ? ctl_chunk_state(h, (int)d->chunk)->host : -1;
                if (to == r->hosts.index)
                    continue;
                size_t bytes = sizeof(struct relay_msg) + d->elem_count * sizeof(float);
                struct relay_msg *m = malloc(bytes);
                SD_ASSERT(m);
                *m = (struct relay_msg){.kind = MSG_GRAD, .rank = d->rank, .step = d->step, .chunk = d->chunk,
                                        .micro = d->micro, .elem_begin = d->elem_begin, .elem_count = d->elem_count};
                memcpy(m + 1, job_grad_slot(r->shm, rank, d->slot), d->elem_count * sizeof(float));
                if (!send_to(r, m, bytes, to))
                    return false;
            }
            /* release: the element and its slot were read before the optimizer may free them */
            atomic_store_explicit(&ring->relayed, head, memory_order_release);
            ring_doorbell(h, k);
            *progressed = true;
        }
    }
    return true;
}

static bool is_val_step(const struct ctl_header *h, uint32_t s)
{
    if (!h->job.data_val[0])
        return false;
    return s == (uint32_t)h->job.steps || (h->job.val_every > 0 && s % (uint32_t)h->job.val_every == 0);
}

/* Sends the step marks of this host's ranks, in step order. */
static bool send_marks(struct relay *r, bool *progressed)
{
    struct ctl_header *h = r->h;
    for (int i = 0; i < ctl_local_ranks(h); i++) {
        int rank = ctl_local_first(h) + i;
        for (;;) {
            uint32_t s = r->next_mark[i];
            if (s > (uint32_t)h->job.steps)
                break;
            struct step_record *rec = ctl_step(h, s);
            if (atomic_load_explicit(&rec->step, memory_order_acquire) != s)
                break;
            if (!r->done_sent[i]) {
                /* acquire: pairs with the worker's release of rank_done after its loss sum */
                if (atomic_load_explicit(&rec->rank_done[rank], memory_order_acquire) != s)
                    break;
                struct relay_msg *m = malloc(sizeof *m);
                SD_ASSERT(m);
                *m = (struct relay_msg){.kind = MSG_DONE, .rank = (uint32_t)rank, .step = s, .sum = rec->loss_sum[rank]};
                if (!send_to(r, m, sizeof *m, -1))
                    return false;
                r->done_sent[i] = true;
                *progressed = true;
            }
            if (is_val_step(h, s)) {
                if (atomic_load_explicit(&rec->val_done[rank], memory_order_acquire) != s)
                    break;
                struct relay_msg *m = malloc(sizeof *m);
                SD_ASSERT(m);
                *m = (struct relay_msg){.kind = MSG_VAL, .rank = (uint32_t)rank, .step = s,
                                        .sum = rec->val_loss_sum[rank], .count = rec->val_count[rank],
                                        .correct = rec->val_correct[rank]};
                if (!send_to(r, m, sizeof *m, -1))
                    return false;
            }
            r->next_mark[i] = s + 1;
            r->done_sent[i] = false;
            *progressed = true;
        }
    }
    uint32_t marked = UINT32_MAX;
    for (int i = 0; i < ctl_local_ranks(h); i++)
        marked = r->next_mark[i] - 1 < marked ? r->next_mark[i] - 1 : marked;
    atomic_store(&r->marked_step, marked);
    return true;
}

/* Whether host 0 writes a checkpoint or the export at step s: the state must be whole there. */
static bool is_state_step(const struct ctl_header *h, uint32_t s)
{
    if (s == (uint32_t)h->job.steps)
        return h->job.save_final;
    return h->ckpt_every > 0 && s % h->ckpt_every == 0;
}

/* Bytes per element of master, m and v together. */
static size_t state_elem_bytes(const struct ctl_header *h)
{
    return 4 + 2 * ctl_state_size(h->job.optimizer_state);
}

/* Copies chunk c's master, m and v to (to_msg) or from a MSG_STATE payload. */
static void copy_state(struct relay *r, int c, char *payload, bool to_msg)
{
    struct ctl_header *h = r->h;
    const struct chunk_desc *ch = &ctl_chunks(h)[c];
    size_t ss = ctl_state_size(h->job.optimizer_state);
    char *arrays[3] = {(char *)r->shm->master,
                       r->shm->exp_avg ? (char *)r->shm->exp_avg : (char *)r->shm->exp_avg16,
                       r->shm->exp_avg_sq ? (char *)r->shm->exp_avg_sq : (char *)r->shm->exp_avg_sq16};
    size_t elem[3] = {4, ss, ss};
    for (int a = 0; a < 3; a++) {
        char *at = arrays[a] + (size_t)ch->offset * elem[a];
        size_t n = (size_t)ch->numel * elem[a];
        if (to_msg)
            memcpy(payload, at, n);
        else
            memcpy(at, payload, n);
        payload += n;
    }
}

/* Sharded: for each chunk this host sums, its squared norm once reduced, its parameters at each
 * new version, and at a checkpoint's step its state to host 0. */
static bool send_chunks(struct relay *r, bool *progressed)
{
    struct ctl_header *h = r->h;
    if (!h->hosts_sharded)
        return true;
    for (int c = 0; c < h->num_chunks; c++) {
        if (!ctl_chunk_is_here(h, c))
            continue;
        struct chunk_state *cs = ctl_chunk_state(h, c);
        const struct chunk_desc *ch = &ctl_chunks(h)[c];
        /* acquire: pairs with the optimizer's release of reduced_step after sumsq */
        uint32_t reduced = atomic_load_explicit(&cs->reduced_step, memory_order_acquire);
        if (reduced > r->sent_reduced[c]) {
            struct relay_msg *m = malloc(sizeof *m);
            SD_ASSERT(m);
            *m = (struct relay_msg){.kind = MSG_NORM, .chunk = (uint32_t)c, .step = reduced,
                                    .sum = cs->sumsq[reduced & 1]};
            if (!send_to(r, m, sizeof *m, -1))
                return false;
            r->sent_reduced[c] = reduced;
            *progressed = true;
        }
        /* acquire: pairs with the optimizer's release of version after the chunk's update */
        uint32_t v = atomic_load_explicit(&cs->version, memory_order_acquire);
        if (v <= r->sent_version[c])
            continue;
        size_t bytes = sizeof(struct relay_msg) + (size_t)ch->numel * 2;
        struct relay_msg *m = malloc(bytes);
        SD_ASSERT(m);
        *m = (struct relay_msg){.kind = MSG_PARAMS, .chunk = (uint32_t)c, .step = v};
        memcpy(m + 1, job_params16_of(r->shm, v) + ch->offset, (size_t)ch->numel * 2);
        if (!send_to(r, m, bytes, -1))
            return false;
        r->sent_version[c] = v;
        /* the optimizers hold the next update until the launcher has seen this state sent */
        if (r->hosts.index != 0 && is_state_step(h, v)) {
            bytes = sizeof(struct relay_msg) + (size_t)ch->numel * state_elem_bytes(h);
            m = malloc(bytes);
            SD_ASSERT(m);
            *m = (struct relay_msg){.kind = MSG_STATE, .chunk = (uint32_t)c, .step = v};
            copy_state(r, c, (char *)(m + 1), true);
            if (!send_to(r, m, bytes, 0))
                return false;
        }
        atomic_store(&r->state_step[c], v);
        *progressed = true;
    }
    return true;
}

/* Sharded: applies a chunk's norm or parameters from the host that sums it. */
static void apply_chunk_msg(struct relay *r, const struct relay_msg *m)
{
    struct ctl_header *h = r->h;
    SD_ASSERT(m->chunk < (uint32_t)h->num_chunks && !ctl_chunk_is_here(h, (int)m->chunk));
    struct chunk_state *cs = ctl_chunk_state(h, (int)m->chunk);
    const struct chunk_desc *ch = &ctl_chunks(h)[m->chunk];
    if (m->kind == MSG_NORM) {
        cs->sumsq[m->step & 1] = m->sum;
        /* release: the sumsq is visible to whoever sees reduced_step reach the step (global_norm) */
        atomic_store_explicit(&cs->reduced_step, m->step, memory_order_release);
        atomic_fetch_add_explicit(&h->reduce_seq, 1, memory_order_release);
        futex_wake_all(&h->reduce_seq);
    } else {
        memcpy(job_params16_of(r->shm, m->step) + ch->offset, m + 1, (size_t)ch->numel * 2);
        /* release: the parameters are in place before a worker sees the version */
        atomic_store_explicit(&cs->version, m->step, memory_order_release);
        futex_wake_all(&cs->version);
    }
}

/* Host 0: the step whose whole state it gathers now, the first checkpoint or export step after
 * the last one written. */
static uint32_t gathered_step(const struct ctl_header *h)
{
    /* acquire: pairs with the launcher's release of ckpt_done_step after it wrote that checkpoint
     * and gave the other hosts' pages back (state_release_remote_chunks) */
    uint32_t done = atomic_load_explicit(&h->ckpt_done_step, memory_order_acquire);
    uint32_t steps = (uint32_t)h->job.steps, every = h->ckpt_every;
    uint32_t next = every ? (done / every + 1) * every : steps;
    return next < steps ? next : steps;
}

/* Host 0: copies in the other hosts' state of the step it gathers now, and only that step's. A host
 * released from a checkpoint once it sent its state may send the next one's while host 0 still
 * writes the checkpoint: copied in then, it would tear that checkpoint, and the pages given back
 * after it would lose it (zeros in the next). So a later step's state waits here. */
static void apply_states(struct relay *r, bool *progressed)
{
    uint32_t want = gathered_step(r->h);
    for (struct inbound **p = &r->states; *p;) {
        struct inbound *in = *p;
        if (in->msg->step > want) {
            p = &in->next;
            continue;
        }
        if (in->msg->step == want) { /* an earlier step's is stale: that checkpoint is written */
            copy_state(r, (int)in->msg->chunk, (char *)(in->msg + 1), false);
            atomic_store(&r->state_step[in->msg->chunk], want);
            fault_point("relay_state_applied");
        }
        *p = in->next;
        free(in->msg);
        free(in);
        *progressed = true;
    }
}

/* Posts a remote rank's gradient like its worker would: a free slot of the rank, the elements,
 * the slot marked posted, the descriptor pushed to the chunk's owner. False while no slot is free,
 * or while step m->step - 1 is not committed here: a worker posts step s only after reading
 * every chunk at version s - 1, and the optimizers rely on it (a host ahead of this one may send
 * its next step's gradients earlier). */
static bool post_remote_grad(struct relay *r, const struct relay_msg *m)
{
    struct ctl_header *h = r->h;
    if (ctl_committed_step(h) + 1 < m->step)
        return false;
    for (int si = 0; si < h->grad_slots; si++) {
        struct slot_state *ss = ctl_slot(h, (int)m->rank, si);
        /* acquire: pairs with the optimizer's release when it frees the slot after reading it */
        uint32_t word = atomic_load_explicit(&ss->state, memory_order_acquire);
        if (SLOT_STATE(word) != SLOT_FREE)
            continue;
        uint32_t seq = (SLOT_SEQ(word) + 1) & 0x3fffffffu;
        atomic_store_explicit(&ss->state, SLOT_WORD(seq, SLOT_WRITING), memory_order_relaxed);
        memcpy(job_grad_slot(r->shm, (int)m->rank, si), m + 1, m->elem_count * sizeof(float));
        /* release: the elements are in the slot before it reads as posted */
        atomic_store_explicit(&ss->state, SLOT_WORD(seq, SLOT_POSTED), memory_order_release);
        int owner = ctl_chunk_state(h, (int)m->chunk)->owner;
        struct chunk_desc_msg d = {
            .chunk = m->chunk, .step = m->step, .micro = m->micro, .rank = (uint16_t)m->rank, .slot = (uint16_t)si,
            .generation = atomic_load(&ctl_proc(h, PROC_WORKER, (int)m->rank)->generation), .seq = seq,
            .kind = DESC_GRAD, .elem_begin = m->elem_begin, .elem_count = m->elem_count,
            .bytes = m->elem_count * sizeof(float)};
        /* the ring holds more entries than the rank has slots */
        SD_ASSERT(ring_push(ctl_ring(h, (int)m->rank, owner), &d));
        ring_doorbell(h, owner);
        fault_point("relay_grad_posted");
        return true;
    }
    return false;
}

/* Writes a remote rank's step mark into the step's record; false while the record still holds an
 * earlier step. */
static bool post_remote_mark(struct relay *r, const struct relay_msg *m)
{
    struct step_record *rec = ctl_step(r->h, m->step);
    if (atomic_load_explicit(&rec->step, memory_order_acquire) != m->step)
        return false;
    if (m->kind == MSG_DONE) {
        rec->loss_sum[m->rank] = m->sum;
        /* release: the sum is visible to the launcher once it sees the mark */
        atomic_store_explicit(&rec->rank_done[m->rank], m->step, memory_order_release);
    } else {
        rec->val_loss_sum[m->rank] = m->sum;
        rec->val_count[m->rank] = m->count;
        rec->val_correct[m->rank] = m->correct;
        atomic_store_explicit(&rec->val_done[m->rank], m->step, memory_order_release);
    }
    return true;
}

static bool receive(struct relay *r, bool *progressed)
{
    for (;;) {
        int flag = 0, bytes = 0;
        MPI_Status st;
        int rc = MPI_Iprobe(MPI_ANY_SOURCE, RELAY_TAG, MPI_COMM_WORLD, &flag, &st);
        if (rc != MPI_SUCCESS)
            return relay_fail(r, "MPI_Iprobe", rc);
        if (!flag)
            return true;
        MPI_Get_count(&st, MPI_BYTE, &bytes);
        struct relay_msg *m = malloc((size_t)bytes);
        SD_ASSERT(m && (size_t)bytes >= sizeof *m);
        rc = MPI_Recv(m, bytes, MPI_BYTE, st.MPI_SOURCE, RELAY_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS)
            return relay_fail(r, "MPI_Recv", rc);
        fault_point("relay_received");
        *progressed = true;
        if (m->kind == MSG_NORM || m->kind == MSG_PARAMS) {
            apply_chunk_msg(r, m);
            free(m);
            continue;
        }
        struct inbound *in = malloc(sizeof *in);
        SD_ASSERT(in);
        *in = (struct inbound){.msg = m};
        if (m->kind == MSG_STATE) {
            SD_ASSERT(r->hosts.index == 0 && m->chunk < (uint32_t)r->h->num_chunks &&
                      !ctl_chunk_is_here(r->h, (int)m->chunk));
            in->next = r->states;
            r->states = in;
            continue;
        }
        SD_ASSERT(m->rank < (uint32_t)r->h->gpus && !ctl_rank_is_local(r->h, (int)m->rank));
        if (r->in_tail[m->rank])
            r->in_tail[m->rank]->next = in;
        else
            r->in_head[m->rank] = in;
        r->in_tail[m->rank] = in;
    }
}

/* Posts what arrived, per remote rank in arrival order, and the state host 0 gathers now. */
static void deliver(struct relay *r, bool *progressed)
{
    apply_states(r, progressed);
    for (int rank = 0; rank < r->h->gpus; rank++) {
        struct inbound *in;
        while ((in = r->in_head[rank])) {
            bool posted = in->msg->kind == MSG_GRAD ? post_remote_grad(r, in->msg) : post_remote_mark(r, in->msg);
            if (!posted)
                break;
            r->in_head[rank] = in->next;
            if (!in->next)
                r->in_tail[rank] = NULL;
            free(in->msg);
            free(in);
            *progressed = true;
        }
    }
}

/* Frees the messages whose sends completed; false on an MPI error. */
static bool reap_sends(struct relay *r)
{
    for (struct outbound **p = &r->out; *p;) {
        struct outbound *o = *p;
        int done = 0;
        int rc = MPI_Testall(o->num_reqs, o->reqs, &done, MPI_STATUSES_IGNORE);
        if (rc != MPI_SUCCESS)
            return relay_fail(r, "MPI_Testall", rc);
        if (!done) {
            p = &o->next;
            continue;
        }
        *p = o->next;
        free(o->msg);
        free(o);
    }
    return true;
}

static void *relay_main(void *arg)
{
    struct relay *r = arg;
    long idle_ns = 20000;
    uint64_t stop_ns = 0;
    while (!atomic_load(&r->failed)) {
        bool progressed = false;
        bool stopping = atomic_load(&r->stop);
        if (stopping && !stop_ns)
            stop_ns = now_ns();
        if (stopping && now_ns() - stop_ns > RELAY_FLUSH_TIMEOUT_S * 1000000000ull)
            break; /* a host that no longer receives */
        if (!send_grads(r, &progressed) || !send_marks(r, &progressed) || !send_chunks(r, &progressed) ||
            !receive(r, &progressed) || !reap_sends(r))
            break;
        deliver(r, &progressed);
        if (stopping && !r->out)
            break;
        if (progressed) {
            idle_ns = 20000;
        } else {
            nap(idle_ns);
            idle_ns = idle_ns < 1000000 ? idle_ns * 2 : idle_ns;
        }
    }
    return NULL;
}

int relay_start(struct relay **out, struct job_shm *shm, const struct hosts *hosts)
{
    struct relay *r = calloc(1, sizeof *r);
    if (!r)
        return sd_err("out of memory");
    r->h = shm->ctl;
    r->shm = shm;
    r->hosts = *hosts;
    for (int i = 0; i < JOB_MAX_GPUS; i++)
        r->next_mark[i] = (uint32_t)r->h->first_step;
    int chunks = r->h->num_chunks;
    r->sent_reduced = malloc(sizeof(uint32_t) * (size_t)chunks);
    r->sent_version = malloc(sizeof(uint32_t) * (size_t)chunks);
    r->state_step = malloc(sizeof(_Atomic uint32_t) * (size_t)chunks);
    if (!r->sent_reduced || !r->sent_version || !r->state_step) {
        free(r->sent_reduced);
        free(r->sent_version);
        free(r->state_step);
        free(r);
        return sd_err("out of memory");
    }
    for (int c = 0; c < chunks; c++) {
        /* the whole state of the first step is on every host (drawn, loaded or resumed alike) */
        r->sent_reduced[c] = atomic_load(&ctl_chunk_state(r->h, c)->reduced_step);
        r->sent_version[c] = atomic_load(&ctl_chunk_state(r->h, c)->version);
        atomic_store(&r->state_step[c], (uint32_t)r->h->first_step - 1);
    }
    atomic_store(&r->marked_step, (uint32_t)r->h->first_step - 1);
    int rc = pthread_create(&r->thread, NULL, relay_main, r);
    if (rc != 0) {
        free(r);
        return sd_err("cannot start the relay thread: %s", strerror(rc));
    }
    *out = r;
    return 0;
}

bool relay_failed(struct relay *r, char *why, size_t len)
{
    if (!atomic_load(&r->failed))
        return false;
    snprintf(why, len, "%s", r->why);
    return true;
}

uint32_t relay_marked_step(struct relay *r)
{
    return atomic_load(&r->marked_step);
}

bool relay_state_ready(struct relay *r, uint32_t step)
{
    struct ctl_header *h = r->h;
    if (!h->hosts_sharded)
        return true;
    for (int c = 0; c < h->num_chunks; c++) {
        /* host 0 needs the others' chunks, the others must have sent theirs */
        bool concerned = r->hosts.index == 0 ? !ctl_chunk_is_here(h, c) : ctl_chunk_is_here(h, c);
        if (concerned && atomic_load(&r->state_step[c]) < step)
            return false;
    }
    return true;
}

void relay_stop(struct relay *r, bool flush)
{
    if (!flush)
        atomic_store(&r->failed, true); /* leaves at once: a lost host never completes its receives */
    atomic_store(&r->stop, true);
    pthread_join(r->thread, NULL);
    for (int rank = 0; rank < JOB_MAX_GPUS; rank++)
        for (struct inbound *in = r->in_head[rank], *next; in; in = next) {
            next = in->next;
            free(in->msg);
            free(in);
        }
    for (struct inbound *in = r->states, *next; in; in = next) {
        next = in->next;
        free(in->msg);
        free(in);
    }
    for (struct outbound *o = r->out, *next; o; o = next) {
        next = o->next;
        free(o->msg);
        free(o);
    }
    free(r->sent_reduced);
    free(r->sent_version);
    free(r->state_step);
    free(r);
}
