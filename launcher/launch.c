/* The supervisor of slidedp-launch: a libuv loop that spawns the workers and optimizer processes
 * (exec'd, never forked copies; the launcher never initialises CUDA), turns committed steps into
 * metrics.jsonl lines and disk checkpoints, restarts a process that dies (its generation bumped,
 * what it held repaired; a crash loop stops the job with a checkpoint), stops cleanly on
 * SIGINT/SIGTERM with a checkpoint, and finishes by exporting final/ and removing the shared
 * state. One state variable, changed in one place. */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/stop_signals.h"
#include "planner/search.h"
#include "shm/futex.h"

#define POLL_MS 2
#define KILL_GRACE_MS 5000
#define MAX_FAILURES_WITHOUT_PROGRESS 3 /* a process dying this often with no step committed: crash loop */
#define RESTART_BACKOFF_MS 100          /* doubled for each failure without progress */
#define EXIT_NONFINITE 3                /* a step's loss or gradient norm was not finite (README) */

extern char **environ;

enum sup_state {
    SUP_RUN,       /* training */
    SUP_FINISHING, /* every step logged; waiting for the children to exit */
    SUP_STOPPING,  /* a signal asked to stop: workers finish their step */
    SUP_DRAINING,  /* workers gone: optimizers finish what is complete */
    SUP_FAILED,    /* a child failed: everyone is being stopped */
};

struct child {
    uv_process_t proc;
    uv_timer_t restart_timer;
    struct sup *sup;
    int kind;  /* enum proc_kind */
    int index;
    bool running, restart_pending;
    bool gang;                   /* killed because another worker died (exchange routes) */
    int failures;                /* deaths since a step last committed */
    uint32_t committed_at_death; /* committed step when it last died */
};

struct sup {
    uv_loop_t *loop;
    struct job_state st;
    struct ctl_header *h;
    struct child *children;
    int num_children, running, workers_running;
    uv_timer_t poll_timer, kill_timer;
    uint64_t watched_ns; /* when the watchdog last looked */
    uv_signal_t sigint, sigterm;
    enum sup_state state;
    int exit_code;
    FILE *metrics;
    uint32_t logged;
    uint32_t commits_seen;                /* highest committed step noticed so far */
    uint64_t commit_ns[CTL_STEP_RECORDS]; /* when each step was noticed committed, by step */
    uint64_t t_prev;   /* commit time of the previous logged step (or workers ready) */
    bool ready_seen;
    bool crash_loop;   /* stopping because a process kept dying */
    bool fatal_at_start; /* a process could not start: bad input, exit 2 */
    uint32_t nonfinite_step; /* the step whose loss or gradient norm was not finite (0: none) */
    char nonfinite_what[768];     /* its values and the first tensor concerned */
    char last_good[JOB_PATH_MAX + 96]; /* the newest checkpoint on disk after such a stop */
    char metrics_dir[JOB_PATH_MAX + 16], metrics_path[JOB_PATH_MAX + 32];
    struct relay *relay; /* several hosts: carries gradients and step marks to the other hosts */
    int pending_restarts;
    int gang_dying;    /* workers killed for a gang restart that have not exited yet */
    uint64_t link_bytes_seen[JOB_MAX_GPUS][3]; /* per rank: host->device, device->host, peer bytes logged so far */
    char bin_dir[PATH_MAX];
    char **child_env;
    int gpu_count;
};

static const char *state_name(enum sup_state s)
{
    static const char *names[] = {"run", "finishing", "stopping", "draining", "failed"};
    return names[s];
}

static void wake_everyone(struct ctl_header *h)
{
    for (int k = 0; k < h->optim_procs; k++)
        futex_wake_all(&ctl_doorbell(h, k)->seq);
    futex_wake_all(&h->reduce_seq);
    futex_wake_all(&h->metrics_step);
    futex_wake_all(&h->ckpt_done_step);
    for (int c = 0; c < h->num_chunks; c++)
        futex_wake_all(&ctl_chunk_state(h, c)->version);
    for (int r = 0; r < h->gpus; r++)
        futex_wake_all(&ctl_xchg(h, r)->bell);
}

static void kill_all(struct sup *s, int sig)
{
    for (int i = 0; i < s->num_children; i++)
        if (s->children[i].running)
            uv_process_kill(&s->children[i].proc, sig);
}

static void on_kill_timer(uv_timer_t *t)
{
    struct sup *s = t->data;
    fprintf(stderr, "slidedp-launch: children did not exit within %d ms; killing them\n", KILL_GRACE_MS);
    kill_all(s, SIGKILL);
}

static bool optimizers_all_running(const struct sup *s)
{
    for (int i = 0; i < s->num_children; i++)
        if (s->children[i].kind == PROC_OPTIM && !s->children[i].running)
            return false;
    return true;
}

/* A process is dead and a stopping job does not restart it, so the ranks cannot finish their
 * step: the workers leave at once and the step is abandoned. */
static void stop_workers_now(struct sup *s)
{
    atomic_store(&s->h->stop, STOP_WORKERS_NOW);
    wake_everyone(s->h);
}

/* The one place the supervisor state changes. */
static void transition(struct sup *s, enum sup_state next)
{
    if (s->state == next || s->state == SUP_FAILED)
        return;
    s->state = next;
    switch (next) {
    case SUP_STOPPING:
        if (s->crash_loop || s->pending_restarts > 0) {
            stop_workers_now(s);
        } else {
            /* seq_cst store, then read the steps workers announced (worker/pipeline.c
             * may_start_step): every rank runs up to the highest one, then stops */
            atomic_store(&s->h->stop, STOP_AT_BOUNDARY);
            uint32_t last = ctl_committed_step(s->h);
            for (int r = 0; r < s->h->gpus; r++) {
                uint32_t announced = atomic_load(&ctl_proc(s->h, PROC_WORKER, r)->step);
                last = announced > last ? announced : last;
            }
            atomic_store(&s->h->stop_step, last + 1);
            futex_wake_all(&s->h->stop_step);
            wake_everyone(s->h);
        }
        break;
    case SUP_DRAINING:
        /* with an optimizer gone, nobody can finish its chunks: leave at the next safe point */
        atomic_store(&s->h->stop, optimizers_all_running(s) ? STOP_DRAIN : STOP_NOW);
        wake_everyone(s->h);
        break;
    case SUP_FAILED:
        /* processes leave at their next safe point; what still runs after the grace is killed */
        s->exit_code = 1;
        atomic_store(&s->h->stop, STOP_NOW);
        wake_everyone(s->h);
        uv_timer_start(&s->kill_timer, on_kill_timer, KILL_GRACE_MS, 0);
        break;
    default:
        break;
    }
}

/* Model FLOPs per token as the PyTorch peer counts them: 6N plus the attention term. */
static double flops_per_token(const struct ctl_header *h)
{
    const struct model_config *c = &h->model;
    return 6.0 * (double)h->num_params + 6.0 * c->num_layers * c->num_heads * c->head_dim * (double)h->job.seq_len;
}

static void publish_stats(struct sup *s, uint32_t step, double loss, const struct step_record *rec, double step_s,
                          double tok_s, int64_t tokens, double val_loss, double val_acc)
{
    struct ctl_header *h = s->h;
    struct job_stats *js = &h->stats;
    double peak = 0;
    for (int r = 0; r < h->gpus; r++)
        peak += ctl_proc(h, PROC_WORKER, r)->peak_flops;
    /* seqlock write: odd while writing; release fences order the data between the two bumps */
    uint32_t seq = atomic_load_explicit(&js->seq, memory_order_relaxed);
    atomic_store_explicit(&js->seq, seq + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    js->step = step;
    js->loss = loss;
    js->lr = rec->lr;
    js->grad_norm = rec->grad_norm;
    js->step_s = step_s;
    js->tok_s = tok_s;
    js->mfu = peak > 0 ? tok_s * flops_per_token(h) / peak : 0;
    if (val_loss >= 0) {
        js->val_loss = val_loss;
        js->val_acc = val_acc;
    }
    js->predicted_step_s = h->plan.predicted_step_s;
    js->tokens_total += (uint64_t)tokens;
    js->targets = rec->tokens;
    js->documents = rec->documents;
    js->updated_ns = clock_ns();
    js->loss_history[step % JOB_STATS_HISTORY] = loss;
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&js->seq, seq + 2, memory_order_relaxed);
}

/* Opens metrics.jsonl (creating log.dir) when its first line is due, so a job that fails to start
 * leaves nothing behind: for appending after the steps already logged (a resumed or adopted job
 * keeps its earlier lines and drops any beyond them), or fresh. */
static int open_metrics(struct sup *s)
{
    const char *path = s->metrics_path;
    if (fs_mkdir_p(s->metrics_dir, 0755) != 0)
        return -1;
    FILE *old = s->logged > 0 ? fopen(path, "r") : NULL;
    if (old) {
        char tmp[JOB_PATH_MAX + 40], line[4096];
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *out = fopen(tmp, "w");
        if (!out) {
            fclose(old);
            return sd_err("cannot write %s: %s", tmp, strerror(errno));
        }
        while (fgets(line, sizeof line, old)) {
            unsigned step;
            if (sscanf(line, "{\"step\":%u", &step) == 1 && step <= s->logged && strchr(line, '\n'))
                fputs(line, out);
        }
        fclose(old);
        if (fclose(out) != 0 || rename(tmp, path) != 0)
            return sd_err("cannot write %s: %s", path, strerror(errno));
    }
    s->metrics = fopen(path, s->logged > 0 ? "a" : "w");
    return s->metrics ? 0 : sd_err("cannot write %s: %s", path, strerror(errno));
}

/* Whether every rank's mark (struct step_record) says `step`. */
static bool all_marked(const _Atomic uint32_t *marks, int n, uint32_t step)
{
    for (int r = 0; r < n; r++)
        if (atomic_load_explicit(&marks[r], memory_order_acquire) != step)
            return false;
    return true;
}

/* The step's batch loss (docs/design.md §9.3), NaN while a rank's part is not in. */
static double step_loss(const struct ctl_header *h, const struct step_record *rec, uint32_t step)
{
    double sum = 0;
    for (int r = 0; r < h->gpus; r++)
        sum += rec->loss_sum[r];
    return all_marked(rec->rank_done, h->gpus, step) ? sum / (double)rec->tokens : NAN;
}

/* x as a JSON number with printf format fmt, or null when it is not finite (JSON has no NaN). */
static const char *json_num(char *buf, size_t len, const char *fmt, double x)
{
    if (!isfinite(x))
        snprintf(buf, len, "null");
    else
        snprintf(buf, len, fmt, x);
    return buf;
}

static int write_metrics(struct sup *s, uint32_t step, const struct step_record *rec)
{
    if (!s->metrics && open_metrics(s) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return -1;
    }
    const struct job_config *job = &s->h->job;
    int G = s->h->gpus;
    double loss = step_loss(s->h, rec, step);
    uint64_t t_commit = s->commit_ns[step % CTL_STEP_RECORDS];
    double step_s = (double)(t_commit - s->t_prev) * 1e-9;
    s->t_prev = t_commit;
    int64_t tokens = job_tokens_per_step(job);
    double tok_s = step_s > 0 ? (double)tokens / step_s : 0;
    char val[160] = "";
    double val_loss = -1, val_acc = 0;
    bool val_done = job_is_val_step(&s->h->job, step) && all_marked(rec->val_done, G, step);
    if (val_done) {
        double vl = 0;
        int64_t vc = 0, vok = 0;
        for (int r = 0; r < G; r++) {
            vl += rec->val_loss_sum[r];
            vc += rec->val_count[r];
            vok += rec->val_correct[r];
        }
        if (vc > 0) {
            val_loss = vl / (double)vc;
            val_acc = (double)vok / (double)vc;
            char vl_text[32], va_text[32];
            snprintf(val, sizeof val, ",\"val_loss\":%s,\"val_acc\":%s",
                     json_num(vl_text, sizeof vl_text, "%.6f", val_loss), json_num(va_text, sizeof va_text, "%.6f", val_acc));
        }
    }
    publish_stats(s, step, loss, rec, step_s, tok_s, tokens, val_loss, val_acc);
    /* PCIe and peer traffic per rank's link since the previous line (the workers run ahead of the
     * commits, so a line may hold some of the next step's bytes; the sum over lines is exact) */
    char links[3][16 * JOB_MAX_GPUS + 8];
    for (int k = 0; k < 3; k++) {
        size_t n = (size_t)snprintf(links[k], sizeof links[k], "[");
        for (int r = 0; r < G; r++) {
            struct proc_slot *ps = ctl_proc(s->h, PROC_WORKER, r);
            uint64_t now = atomic_load(k == 0 ? &ps->bytes_in : k == 1 ? &ps->bytes_out : &ps->bytes_peer);
            n += (size_t)snprintf(links[k] + n, sizeof links[k] - n, "%s%llu", r ? "," : "",
                                  (unsigned long long)(now - s->link_bytes_seen[r][k]));
            s->link_bytes_seen[r][k] = now;
        }
        snprintf(links[k] + n, sizeof links[k] - n, "]");
    }
    char num[7][32];
    fprintf(s->metrics,
            "{\"step\":%u,\"loss\":%s,\"lr\":%s,\"grad_norm\":%s,\"tokens\":%lld,\"targets\":%lld,\"documents\":%lld,"
            "\"step_s\":%s,\"predicted_step_s\":%s,\"tok_s\":%s,\"clip_coef\":%s,\"h2d_bytes\":%s,"
            "\"d2h_bytes\":%s,\"peer_bytes\":%s%s}\n",
            step, json_num(num[0], 32, "%.6f", loss), json_num(num[1], 32, "%.6e", rec->lr),
            json_num(num[2], 32, "%.6f", rec->grad_norm), (long long)tokens, (long long)rec->tokens,
            (long long)rec->documents,
            json_num(num[3], 32, "%.6f", step_s), json_num(num[4], 32, "%.6f", s->h->plan.predicted_step_s),
            json_num(num[5], 32, "%.1f", tok_s), json_num(num[6], 32, "%.6f", rec->clip_coef), links[0], links[1],
            links[2], val);
    fflush(s->metrics);
    if (step % (uint32_t)job->log_every == 0 || step == (uint32_t)job->steps || val[0]) {
        printf("step %5u/%d  loss %.4f  lr %.2e  grad_norm %.3f  %.3fs  %.0f tok/s", step, job->steps, loss, rec->lr,
               rec->grad_norm, step_s, tok_s);
        if (val[0])
            printf("  | val loss %.4f  val acc %.2f%%", val_loss, 100.0 * val_acc);
        printf("\n");
        fflush(stdout);
    }
    return 0;
}

/* Step s's gradient norm is known and not finite, or every rank's loss is in and their sum is not. */
static bool step_is_nonfinite(const struct ctl_header *h, uint32_t s, const struct step_record *rec)
{
    /* acquire: pairs with the release stores of these flags after the values they cover */
    if (atomic_load_explicit(&rec->step, memory_order_acquire) != s)
        return false;
    if (atomic_load_explicit(&rec->norm_written, memory_order_acquire) && !isfinite(rec->grad_norm))
        return true;
    return all_marked(rec->rank_done, h->gpus, s) && !isfinite(step_loss(h, rec, s));
}

/* Stops the job on step s's non-finite loss or gradient norm: its metrics line (with nulls) is
 * written and every process leaves; finish() exports nothing and keeps the last good checkpoint. */
static void stop_nonfinite(struct sup *s, uint32_t step, const struct step_record *rec)
{
    s->nonfinite_step = step;
    s->commit_ns[step % CTL_STEP_RECORDS] = clock_ns();
    write_metrics(s, step, rec);
    transition(s, SUP_FAILED);
    s->exit_code = EXIT_NONFINITE;
}

/* The periodic checkpoint of logged step `step` when one is due and not written yet (a relaunch
 * calls it for the last logged step: its dead predecessor may have logged it and died before the
 * checkpoint the optimizers wait for). */
/* The host that writes checkpoints and the export (every host holds the whole state). */
static bool writes_state(const struct sup *s)
{
    return s->st.hosts.index == 0;
}

#define HOST_STATE_WAIT_S 300

/* Several hosts, sharded: waits until host 0 holds every chunk's state of `step` (on host 0), or
 * the relay has sent this host's (on the others); false with a message when it does not come. */
static bool wait_host_state(struct sup *s, uint32_t step)
{
    char why[300];
    for (uint64_t t0 = clock_ns(); s->relay && !relay_state_ready(s->relay, step);) {
        if (relay_failed(s->relay, why, sizeof why) || clock_ns() - t0 > HOST_STATE_WAIT_S * 1000000000ull) {
            fprintf(stderr, "slidedp-launch: host %d: the optimizer state of step %u did not %s\n",
                    s->st.hosts.index, step, s->st.hosts.index == 0 ? "arrive from the other hosts" : "go out");
            return false;
        }
        usleep(1000);
    }
    return true;
}

static void write_due_checkpoint(struct sup *s, uint32_t step)
{
    struct ctl_header *h = s->h;
    if (h->ckpt_every == 0 || step == 0 || step % h->ckpt_every != 0 || step >= (uint32_t)h->job.steps ||
        atomic_load(&h->ckpt_done_step) >= step)
        return;
    if (!wait_host_state(s, step)) {
        transition(s, SUP_FAILED);
    } else if (writes_state(s)) { /* elsewhere the optimizers wait for this launcher like everywhere else */
        fault_point("launcher_ckpt_writing");
        if (checkpoint_write(&s->st, step) != 0)
            fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        else
            printf("checkpoint step-%u written\n", step);
    }
    state_release_remote_chunks(&s->st); /* what host 0 gathered for it */
    fault_point("launcher_ckpt_written");
    /* release the optimizers even when writing failed: training goes on, the error is reported */
    atomic_store_explicit(&h->ckpt_done_step, step, memory_order_release);
    futex_wake_all(&h->ckpt_done_step);
}

/* Logs every step that is complete, in order, and writes the checkpoints that are due. */
static void poll_steps(struct sup *s)
{
    struct ctl_header *h = s->h;
    if (!s->ready_seen && atomic_load(&h->workers_ready) >= (uint32_t)ctl_local_ranks(h)) {
        s->ready_seen = true;
        s->t_prev = clock_ns();
    }
    uint32_t committed = ctl_committed_step(h);
    for (uint64_t now = clock_ns(); s->commits_seen < committed; s->commits_seen++)
        s->commit_ns[(s->commits_seen + 1) % CTL_STEP_RECORDS] = now;
    while (s->logged < (uint32_t)h->job.steps && !s->nonfinite_step) {
        uint32_t next = s->logged + 1;
        struct step_record *rec = ctl_step(h, next);
        if (step_is_nonfinite(h, next, rec)) {
            stop_nonfinite(s, next, rec);
            break;
        }
        /* acquire: pairs with the release stores that set these flags after the data they cover */
        if (atomic_load_explicit(&rec->step, memory_order_acquire) != next || committed < next ||
            !atomic_load_explicit(&rec->norm_written, memory_order_acquire) ||
            !all_marked(rec->rank_done, h->gpus, next))
            break;
        if (job_is_val_step(&h->job, next) && !all_marked(rec->val_done, h->gpus, next))
            break;
        if (s->relay && relay_marked_step(s->relay) < next)
            break; /* its record is recycled once logged: our ranks' marks must have gone out */
        if (write_metrics(s, next, rec) != 0) {
            transition(s, SUP_FAILED);
            break;
        }
        /* logged, then recycled: a relaunch recycles what a dead launcher logged (state_replace_orphans) */
        s->logged = next;
        atomic_store_explicit(&h->metrics_step, next, memory_order_release);
        futex_wake_all(&h->metrics_step);
        fault_point("launcher_logged");
        ctl_recycle_step(h, next);
        write_due_checkpoint(s, next);
    }
    if (s->logged == (uint32_t)h->job.steps && s->state == SUP_RUN)
        transition(s, SUP_FINISHING);
}

/* Kills a running process whose heartbeat is older than runtime.watchdog_s (a hung device call,
 * a protocol bug): its exit is then handled like any crash, so it is restarted. */
static void watchdog(struct sup *s)
{
    uint64_t now = clock_ns();
    if (s->st.job.watchdog_s == 0 || now - s->watched_ns < 1000000000ull)
        return;
    s->watched_ns = now;
    uint64_t bound = (uint64_t)s->st.job.watchdog_s * 1000000000ull;
    for (int i = 0; i < s->num_children; i++) {
        struct child *c = &s->children[i];
        uint64_t beat = atomic_load(&ctl_proc(s->h, c->kind, c->index)->heartbeat_ns);
        if (!c->running || c->gang || now < beat || now - beat <= bound)
            continue;
        fprintf(stderr, "slidedp-launch: %s %d stalled (no progress for %d s); killing it\n",
                c->kind == PROC_WORKER ? "worker" : "optimizer", c->index, s->st.job.watchdog_s);
        uv_process_kill(&c->proc, SIGKILL);
    }
}

static void maybe_finish(struct sup *s);

static void on_poll(uv_timer_t *t)
{
    struct sup *s = t->data;
    char why[300];
    if (s->relay && s->state != SUP_FAILED && relay_failed(s->relay, why, sizeof why)) {
        fprintf(stderr, "slidedp-launch: %s; stopping this host\n", why);
        transition(s, SUP_FAILED);
    }
    poll_steps(s);
    watchdog(s);
    if (s->relay && s->running == 0)
        maybe_finish(s);
}

/* Whether master, m and v hold exactly the state after `step`: every chunk at that version and no
 * update or journaled block of a later one in flight. */
static bool state_consistent(struct ctl_header *h, uint32_t step)
{
    for (int c = 0; c < h->num_chunks; c++) {
        struct chunk_state *cs = ctl_chunk_state(h, c);
        if (atomic_load(&cs->version) != step || atomic_load(&cs->upd_step) > step)
            return false;
    }
    for (int k = 0; k < h->optim_procs; k++)
        for (int t = 0; t < h->plan.optim_threads; t++)
            if (atomic_load(&ctl_journal(h, k, t)->state) == JOURNAL_UPDATE)
                return false;
    return true;
}

/* A checkpoint of the last committed step, unless it is already on disk or the state is torn. */
static void checkpoint_on_stop(struct sup *s)
{
    struct ctl_header *h = s->h;
    uint32_t committed = ctl_committed_step(h);
    if (committed == 0 || committed <= atomic_load(&h->ckpt_done_step) || !writes_state(s))
        return;
    if (s->relay && !relay_state_ready(s->relay, committed))
        return; /* sharded, and another host's chunks of that step never came */
    if (s->nonfinite_step && committed >= s->nonfinite_step)
        return; /* updated during the backward with the non-finite gradients: not worth keeping */
    if (committed > s->logged) {
        /* a lost host never sent its marks of that step: a resume from it would miss its metrics */
        fprintf(stderr, "slidedp-launch: step %u was never logged (%s); the newest checkpoint is step-%u on disk\n",
                committed, s->relay ? "a host's results are missing" : "a worker's results are missing",
                atomic_load(&h->ckpt_done_step));
        return;
    }
    fault_point("launcher_stop_checkpoint");
    if (!state_consistent(h, committed)) {
        fprintf(stderr, "slidedp-launch: step %u was partly applied when the job stopped; the newest consistent "
                        "checkpoint is step-%u on disk\n",
                committed + 1, atomic_load(&h->ckpt_done_step));
        return;
    }
    /* a large model's takes minutes, during which the launcher answers no signal: say so first */
    char size[32];
    printf("writing checkpoint step-%u (%s)\n", committed, fs_bytes_str(checkpoint_bytes(&s->st), size));
    fflush(stdout);
    if (checkpoint_write(&s->st, committed) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        s->exit_code = 1;
        return;
    }
    atomic_store(&h->ckpt_done_step, committed);
    printf("checkpoint step-%u written\n", committed);
}

static bool any_nonfinite_f32(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return true;
    return false;
}

static bool any_nonfinite_bf16(const uint16_t *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if ((x[i] & 0x7f80) == 0x7f80)
            return true;
    return false;
}

/* After a non-finite stop, with every process gone: the step's values, the first tensor whose
 * weights are not finite, else how many gradients are not and the first the backward reached
 * (the last in model order); and the newest checkpoint left on disk. */
static void describe_nonfinite(struct sup *s)
{
    const struct job_state *st = &s->st;
    const struct step_record *rec = ctl_step(s->h, s->nonfinite_step);
    char loss[32], norm[32];
    snprintf(loss, sizeof loss, "%g", step_loss(s->h, rec, s->nonfinite_step));
    if (atomic_load(&rec->norm_written))
        snprintf(norm, sizeof norm, "%g", rec->grad_norm);
    else
        snprintf(norm, sizeof norm, "not computed");
    int first_weights = -1, last_grads = -1, bad_grads = 0;
    for (int t = 0; t < st->lay.num_tensors; t++) {
        const struct tensor_desc *td = &st->lay.tensors[t];
        if (first_weights < 0 && any_nonfinite_f32(st->shm.master + td->offset, td->numel))
            first_weights = t;
        bool bad = st->shm.grad_acc16 ? any_nonfinite_bf16(st->shm.grad_acc16 + td->offset, td->numel)
                                      : any_nonfinite_f32(st->shm.grad_acc + td->offset, td->numel);
        if (bad) {
            bad_grads++;
            last_grads = t;
        }
    }
    size_t n = (size_t)snprintf(s->nonfinite_what, sizeof s->nonfinite_what, "loss %s, grad_norm %s", loss, norm);
    if (first_weights >= 0)
        snprintf(s->nonfinite_what + n, sizeof s->nonfinite_what - n, "; the weights of %s are not finite",
                 st->lay.tensors[first_weights].name);
    else if (bad_grads > 0)
        snprintf(s->nonfinite_what + n, sizeof s->nonfinite_what - n,
                 "; the gradients of %d of %d tensors are not finite, the first the backward reached: %s", bad_grads,
                 st->lay.num_tensors, st->lay.tensors[last_grads].name);
    uint32_t good = 0;
    checkpoint_latest(&st->job, &good);
    if (good > 0)
        snprintf(s->last_good, sizeof s->last_good, "step-%u in %s", good, st->job.ckpt_dir);
    else
        snprintf(s->last_good, sizeof s->last_good, "none (no checkpoint was written; checkpoint.every sets them)");
}

/* With no worker left: a committed step a dead worker did not mark done (it died after its last
 * gradient went out, and a stopping job did not restart it) is marked from its saved loss, so it
 * is logged like the checkpoint that will hold it. */
static void mark_dead_ranks(struct sup *s)
{
    struct ctl_header *h = s->h;
    uint32_t committed = ctl_committed_step(h);
    for (uint32_t step = s->logged + 1; step <= committed; step++) {
        struct step_record *rec = ctl_step(h, step);
        for (int r = ctl_local_first(h); r < ctl_local_first(h) + ctl_local_ranks(h); r++)
            if (atomic_load(&rec->step) == step && atomic_load(&rec->rank_done[r]) != step)
                ctl_finish_rank(h, step, r);
    }
}

static void finish(struct sup *s)
{
    uv_timer_stop(&s->poll_timer);
    uv_timer_stop(&s->kill_timer);
    mark_dead_ranks(s);
    poll_steps(s);
    if (s->state == SUP_FINISHING && !s->st.job.save_final) {
        printf("done (checkpoint.save_final = false: nothing exported)\n");
        s->exit_code = 0;
    } else if (s->state == SUP_FINISHING && !writes_state(s)) {
        s->exit_code = 0; /* host 0 exports (and speaks: this host's stdout is quiet) */
    } else if (s->state == SUP_FINISHING && !wait_host_state(s, ctl_committed_step(s->h))) {
        s->exit_code = 1;
    } else if (s->state == SUP_FINISHING) {
        char dir[JOB_PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s/final", s->st.job.ckpt_dir);
        if (state_export(&s->st, dir) != 0) {
            /* the trained state stays: a rerun adopts it and only exports (its logged steps are all done) */
            fprintf(stderr,
                    "slidedp-launch: export failed: %s; the trained state stays in /dev/shm/slidedp.%s.*: fix the "
                    "cause and run the same command again to export it (or remove it with --clean)\n",
                    sd_errmsg(), s->st.job_name);
            s->st.created = false;
            s->exit_code = 1;
        } else {
            char shown[JOB_PATH_MAX + 16];
            printf("exported %s\n", fs_display_path(dir, shown, sizeof shown));
            s->exit_code = 0;
            checkpoint_on_stop(s);
        }
    } else {
        printf("stopped after step %u\n", ctl_committed_step(s->h));
        if (s->state != SUP_FAILED)
            s->exit_code = s->crash_loop ? 1 : 130;
        checkpoint_on_stop(s);
        if (s->nonfinite_step)
            describe_nonfinite(s);
    }
    uv_close((uv_handle_t *)&s->poll_timer, NULL);
    uv_close((uv_handle_t *)&s->kill_timer, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    for (int i = 0; i < s->num_children; i++)
        uv_close((uv_handle_t *)&s->children[i].restart_timer, NULL);
}

static int spawn_child(struct sup *s, struct child *c);

static void maybe_finish(struct sup *s)
{
    /* several hosts: our children may be done before the other hosts' last marks arrive */
    bool awaiting_hosts = s->relay && s->state == SUP_RUN && s->logged < (uint32_t)s->st.job.steps;
    if (s->running == 0 && s->pending_restarts == 0 && !awaiting_hosts)
        finish(s);
}

#define GANG_WAIT_MS 20

static void on_restart_timer(uv_timer_t *t)
{
    struct child *c = t->data;
    struct sup *s = c->sup;
    if (c->kind == PROC_WORKER && s->gang_dying > 0 && s->state == SUP_RUN) {
        uv_timer_start(&c->restart_timer, on_restart_timer, GANG_WAIT_MS, 0); /* the gang is still going down */
        return;
    }
    c->restart_pending = false;
    s->pending_restarts--;
    if (s->state == SUP_RUN && spawn_child(s, c) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        transition(s, SUP_FAILED);
    }
    maybe_finish(s);
}

/* Repairs what a dead process held, fences it out, and starts it again after delay_ms. */
static void schedule_restart(struct sup *s, struct child *c, int delay_ms)
{
    struct proc_slot *slot = ctl_proc(s->h, c->kind, c->index);
    if (c->kind == PROC_WORKER)
        ctl_repair_slots(s->h, c->index);
    atomic_fetch_add(&slot->generation, 1);
    atomic_fetch_add(&s->h->generation, 1); /* the job's repairs, for monitors */
    atomic_fetch_add(&slot->restarts, 1);
    c->restart_pending = true;
    s->pending_restarts++;
    uv_timer_start(&c->restart_timer, on_restart_timer, (uint64_t)delay_ms, 0);
}

/* Workers that exchange shards through each other's device memory cannot go on without a peer:
 * when one dies, all are killed and started again together once every one has exited, and the
 * exchange restarts at the first uncommitted step (each redoes that step; what already reached
 * the optimizers is not sent again). Called after the dead worker's restart is scheduled. */
static void restart_gang(struct sup *s, const struct child *dead)
{
    for (int i = 0; i < s->num_children; i++) {
        struct child *c = &s->children[i];
        if (c->kind != PROC_WORKER || c == dead || c->restart_pending)
            continue;
        if (c->running) {
            if (!c->gang) {
                c->gang = true;
                s->gang_dying++;
                uv_process_kill(&c->proc, SIGKILL);
            }
        } else {
            schedule_restart(s, c, RESTART_BACKOFF_MS); /* it had finished; its peers need it again */
        }
    }
    if (s->gang_dying == 0)
        ctl_xchg_reset(s->h, ctl_committed_step(s->h));
}

/* A process died while training: repair what it held, fence it out, and start it again after a
 * backoff; or, when it keeps dying without the job making progress, stop the job. */
static void handle_crash(struct sup *s, struct child *c)
{
    struct ctl_header *h = s->h;
    struct proc_slot *slot = ctl_proc(h, c->kind, c->index);
    const char *what = c->kind == PROC_WORKER ? "worker" : "optimizer";
    uint32_t committed = ctl_committed_step(h);
    c->failures = c->failures == 0 || committed > c->committed_at_death ? 1 : c->failures + 1;
    c->committed_at_death = committed;
    if (c->failures > MAX_FAILURES_WITHOUT_PROGRESS) {
        fprintf(stderr, "slidedp-launch: %s %d died %d times without a step completing; stopping the job\n", what,
                c->index, c->failures);
        s->crash_loop = true;
        transition(s, SUP_STOPPING);
        return;
    }
    int delay = RESTART_BACKOFF_MS << (c->failures - 1);
    fprintf(stderr, "slidedp-launch: restarting %s %d in %d ms (restart %u)%s\n", what, c->index, delay,
            atomic_load(&slot->restarts) + 1, c->kind == PROC_WORKER && h->exchange ? " with every worker" : "");
    schedule_restart(s, c, delay);
    if (c->kind == PROC_WORKER && h->exchange)
        restart_gang(s, c);
}

static void on_child_exit(uv_process_t *proc, int64_t status, int term_signal)
{
    struct child *c = proc->data;
    struct sup *s = c->sup;
    c->running = false;
    s->running--;
    if (c->kind == PROC_WORKER)
        s->workers_running--;
    uv_close((uv_handle_t *)proc, NULL);
    const char *what = c->kind == PROC_WORKER ? "worker" : "optimizer";
    /* a clean exit before the process's work is done (it saw the job torn down or a step abandoned
     * that a relaunch has since revived) leaves its part undone: a crash like any other */
    bool clean = status == 0 && term_signal == 0 &&
                 (s->state != SUP_RUN || atomic_load(&ctl_proc(s->h, c->kind, c->index)->phase) == PHASE_DONE);
    if (c->gang) {
        c->gang = false;
        if (--s->gang_dying == 0)
            ctl_xchg_reset(s->h, ctl_committed_step(s->h)); /* every worker is down: none reads the words */
        if (s->state == SUP_RUN) {
            schedule_restart(s, c, RESTART_BACKOFF_MS);
            maybe_finish(s);
            return;
        }
        clean = true; /* killed by us; nothing to report */
    }
    if (!clean && s->state != SUP_FAILED) {
        if (term_signal)
            fprintf(stderr, "slidedp-launch: %s %d died from signal %d\n", what, c->index, term_signal);
        else if (status != 2)
            fprintf(stderr, "slidedp-launch: %s %d exited with status %lld\n", what, c->index, (long long)status);
        if (status == 2) {
            /* fatal by the exit-code protocol (it printed why): never restarted; before the first
             * step nothing was written, so this is bad input like any other */
            if (ctl_committed_step(s->h) == s->st.resumed_step && !s->st.adopted)
                s->fatal_at_start = true;
            transition(s, SUP_FAILED);
        }
        else if (s->state == SUP_RUN)
            handle_crash(s, c);
        else if (c->kind == PROC_WORKER && s->state == SUP_STOPPING)
            stop_workers_now(s);
        else if (c->kind == PROC_OPTIM && s->state != SUP_FINISHING)
            transition(s, SUP_FAILED); /* nobody is left to finish its chunks */
    }
    poll_steps(s);
    if (s->state == SUP_STOPPING && s->workers_running == 0)
        transition(s, SUP_DRAINING);
    maybe_finish(s);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    struct sup *s = sig->data;
    if (s->st.hosts.count > 1) {
        /* the hosts cannot agree a last step without each other: mpirun sends this when another
         * host is lost, and checkpoint.resume = auto continues from the newest checkpoint */
        fprintf(stderr, "slidedp-launch: host %d: %s received; stopping this host now (the job resumes from its "
                        "newest checkpoint)\n", s->st.hosts.index, signum == SIGINT ? "SIGINT" : "SIGTERM");
        transition(s, SUP_FAILED);
        s->exit_code = 130;
        return;
    }
    if (s->state == SUP_STOPPING || s->state == SUP_DRAINING) {
        fprintf(stderr, "slidedp-launch: second signal; stopping now\n");
        transition(s, SUP_FAILED);
        s->exit_code = 130;
        return;
    }
    fprintf(stderr, "slidedp-launch: %s received; finishing the current step (again to abort)\n",
            signum == SIGINT ? "SIGINT" : "SIGTERM");
    if (s->state == SUP_RUN)
        transition(s, SUP_STOPPING);
}

static int spawn_child(struct sup *s, struct child *c)
{
    char file[PATH_MAX + 32], a1[32], a2[32], launcher[32];
    const char *prog = c->kind == PROC_WORKER ? "slidedp-worker" : "slidedp-optim";
    snprintf(file, sizeof file, "%s/%s", s->bin_dir, prog);
    snprintf(a1, sizeof a1, "%d", c->index);
    int local_index = c->kind == PROC_WORKER ? c->index - ctl_local_first(s->h) : c->index;
    snprintf(a2, sizeof a2, "%d", s->gpu_count > 0 ? local_index % s->gpu_count : 0);
    snprintf(launcher, sizeof launcher, "%d", (int)getpid());
    char *args[12];
    int n = 0;
    args[n++] = file;
    args[n++] = "--job";
    args[n++] = s->h->job_name;
    args[n++] = "--launcher";
    args[n++] = launcher;
    args[n++] = c->kind == PROC_WORKER ? "--rank" : "--index";
    args[n++] = a1;
    if (c->kind == PROC_WORKER) {
        args[n++] = "--device-index";
        args[n++] = a2;
    }
    args[n] = NULL;
    uv_stdio_container_t stdio[3] = {{.flags = UV_IGNORE}, {.flags = UV_INHERIT_FD, .data.fd = 1},
                                     {.flags = UV_INHERIT_FD, .data.fd = 2}};
    uv_process_options_t opts = {
        /* a session of its own (setsid): what is sent to the launcher's process group, a terminal's
         * Ctrl-C above all, reaches the launcher alone, which turns it into a clean stop */
        .flags = UV_PROCESS_DETACHED,
        .exit_cb = on_child_exit,
        .file = file,
        .args = args,
        .env = s->child_env,
        .stdio_count = 3,
        .stdio = stdio,
    };
    c->sup = s;
    c->proc.data = c;
    int rc = uv_spawn(s->loop, &c->proc, &opts);
    if (rc != 0)
        return sd_err("cannot start %s: %s", file, uv_strerror(rc));
    c->running = true;
    s->running++;
    if (c->kind == PROC_WORKER)
        s->workers_running++;
    struct proc_slot *slot = ctl_proc(s->h, c->kind, c->index);
    atomic_store(&slot->pid, c->proc.pid);
    atomic_store(&slot->start_ticks, proc_start_ticks(c->proc.pid));
    atomic_store(&slot->heartbeat_ns, clock_ns()); /* the watchdog gives it its whole bound to start */
    return 0;
}

/* The children's environment: ours, with OpenBLAS single-threaded, because its results depend on
 * its thread count and data-parallel runs must match single-worker runs bit for bit. */
static char **make_child_env(void)
{
    int n = 0;
    while (environ[n])
        n++;
    char **env = calloc((size_t)n + 2, sizeof *env);
    if (!env)
        return NULL;
    for (int i = 0; i < n; i++)
        env[i] = environ[i];
    for (int i = 0; i < n; i++)
        if (!strncmp(env[i], "OPENBLAS_NUM_THREADS=", 21))
            env[i] = env[--n];
    env[n++] = "OPENBLAS_NUM_THREADS=1";
    env[n] = NULL;
    return env;
}

/* GPUs the workers can use: CUDA_VISIBLE_DEVICES when set, else the driver's list. The launcher
 * never initialises CUDA, so it counts without it. */
static int count_gpus(void)
{
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis) {
        int n = *vis ? 1 : 0;
        for (const char *p = vis; *p; p++)
            n += *p == ',';
        return n;
    }
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* A resume under another train.steps (how a job trains on, README) stretches or shrinks the lr
 * schedule over the new span: says so when that moves the lr of the steps already trained. */
static void say_schedule_change(const struct job_state *st)
{
    int before = st->resumed_train_steps, step = (int)st->resumed_step;
    if (before <= 0 || before == st->job.steps)
        return;
    struct job_config old = st->job;
    old.steps = before;
    double was = job_lr_at(&old, step), now = job_lr_at(&st->job, step);
    if (was == now)
        return;
    char schedule[16];
    job_config_value(&st->job, "train.schedule", schedule, sizeof schedule);
    printf("slidedp: train.steps is %d, step-%u was trained toward %d: the %s schedule now spans %d steps, so the lr "
           "goes from %.3e (step %d, the last trained) to %.3e (step %d)\n",
           st->job.steps, st->resumed_step, before, schedule, st->job.steps, was, step,
           job_lr_at(&st->job, step + 1), step + 1);
}

static void print_header(const struct sup *s)
{
    const struct job_state *st = &s->st;
    const struct job_config *job = &st->job;
    /* where the weights come from: a resumed or adopted job's are not its init's */
    char weights[64];
    if (st->adopted)
        snprintf(weights, sizeof weights, "weights adopted at step %u", ctl_committed_step(st->shm.ctl));
    else if (st->resumed_step > 0)
        snprintf(weights, sizeof weights, "weights from checkpoint step-%u", st->resumed_step);
    else
        snprintf(weights, sizeof weights, "%s init", job->init_random ? "random" : "pretrained");
    printf("slidedp: job %s, %s %s model (%.2fM params, %d layers), %s\n", st->job_name, st->cfg.model_type,
           st->cfg.architecture, (double)st->lay.num_params / 1e6, st->cfg.num_layers, weights);
    printf("slidedp: %d %s worker(s), %d optimizer process(es); %d step(s) of %d x %d x %d sequences of %d tokens\n",
           job->gpus, job->device == DEVICE_CPU ? "cpu" : "cuda", st->plan.optim_procs, job->steps, job->gpus,
           job->grad_accum, job->micro_batch, job->seq_len);
    if (st->topo.source == TOPO_FILE)
        printf("slidedp: GPU topology described in %s\n", job->topology);
    for (int r = 0; r < st->topo.gpus; r++) {
        char line[512];
        topology_describe_gpu(&st->topo, r, line, sizeof line);
        printf("slidedp: %s\n", line);
    }
    plan_print(stdout, &st->plan, &st->cfg, job);
    uint64_t state_bytes = st->shm.ctl->size + st->shm.ctl->params16_bytes + st->shm.ctl->master_bytes +
                           st->shm.ctl->grads_bytes;
    char logs[JOB_PATH_MAX];
    printf("slidedp: shared state %.1f MiB (%.2f bytes per parameter, %s optimizer state) in /dev/shm/slidedp.%s.*; "
           "logs in %s\n",
           (double)state_bytes / (1 << 20), (double)state_bytes / (double)st->lay.num_params,
           optimizer_state_name(job->optimizer_state), st->job_name, fs_display_path(job->log_dir, logs, sizeof logs));
    fflush(stdout);
}

int launch_run(const struct launch_opts *opts)
{
    /* SIGINT/SIGTERM wait until the loop handles them (a stop while the state is being created
     * would otherwise kill us with the shm objects made) */
    stop_signals_hold();
    struct sup *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "slidedp-launch: out of memory\n");
        return 1;
    }
    if (hosts_detect(&s->st.hosts) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 2;
    }
    fault_init("launcher", 0, s->st.hosts.index); /* SLIDEDP_CRASH_AT's rN: the launcher of host N */
    /* under mpirun host 0 speaks for the job: the other hosts' header and step lines would repeat
     * its own, interleaved; their problems still go to stderr */
    if (s->st.hosts.index > 0 && !freopen("/dev/null", "w", stdout))
        fprintf(stderr, "slidedp-launch: host %d: cannot quiet stdout: %s\n", s->st.hosts.index, strerror(errno));
    if (job_config_load(opts->ini_path, opts->num_overrides, opts->overrides, &s->st.job) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 2;
    }
    if (hosts_init(&s->st.hosts) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 2;
    }
    const struct job_config *job = &s->st.job;
    if (job->device == DEVICE_CUDA) {
#ifndef SD_HAVE_CUDA
        fprintf(stderr, "slidedp-launch: this build has no CUDA backend (nvcc was not found); use --device cpu\n");
        return 2;
#endif
        s->gpu_count = count_gpus();
        if (s->gpu_count == 0) {
            fprintf(stderr, "slidedp-launch: no NVIDIA GPU is visible; use --device cpu\n");
            return 2;
        }
    }
    if (fs_self_dir(s->bin_dir, sizeof s->bin_dir) != 0 || !(s->child_env = make_child_env())) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 1;
    }
    if (topology_for_job(job, s->bin_dir, &s->st.topo) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 2;
    }
    if (state_create(&s->st) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        /* a stop while the host was being measured: nothing was created, and the same command starts anew */
        return stop_signal_seen() ? 130 : 2;
    }
    if (s->st.finished) {
        printf("slidedp-launch: this job is already finished: %s holds step-%d (train.steps) and final/; nothing "
               "to train. To train again from the start: checkpoint.resume=never (replaces final/ and "
               "metrics.jsonl) or remove %s; to train longer: raise train.steps\n",
               job->ckpt_dir, job->steps, job->ckpt_dir);
        state_unlock(&s->st);
        hosts_finalize(&s->st.hosts); /* every host found it finished (hosts_check_same_checkpoint) */
        return 0;
    }
    char warning[512];
    if (model_config_seq_len_warning(&s->st.cfg, job->seq_len, warning, sizeof warning))
        fprintf(stderr, "slidedp-launch: %s\n", warning);
    s->h = s->st.shm.ctl;
    checkpoint_remove_partial(job);
    if (s->st.adopted) {
        state_replace_orphans(&s->st);
        printf("slidedp: adopting the state a dead launcher left: step %u committed, %u logged\n",
               ctl_committed_step(s->h), atomic_load(&s->h->metrics_step));
    } else if (s->st.resumed_step > 0) {
        printf("slidedp: resuming from checkpoint step-%u\n", s->st.resumed_step);
        say_schedule_change(&s->st);
    }
    s->logged = s->commits_seen = atomic_load(&s->h->metrics_step);
    if (s->st.adopted)
        write_due_checkpoint(s, s->logged);
    /* several hosts: host 0 writes log.dir/metrics.jsonl, host i log.dir/host-i/ */
    if (s->st.hosts.index > 0)
        snprintf(s->metrics_dir, sizeof s->metrics_dir, "%s/host-%d", job->log_dir, s->st.hosts.index);
    else
        snprintf(s->metrics_dir, sizeof s->metrics_dir, "%s", job->log_dir);
    snprintf(s->metrics_path, sizeof s->metrics_path, "%s/metrics.jsonl", s->metrics_dir);
    if (s->logged > 0 && open_metrics(s) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        state_destroy(&s->st);
        return 2;
    }
    print_header(s);

    s->loop = uv_default_loop();
    uv_timer_init(s->loop, &s->poll_timer);
    uv_timer_init(s->loop, &s->kill_timer);
    s->poll_timer.data = s->kill_timer.data = s;
    uv_signal_init(s->loop, &s->sigint);
    uv_signal_init(s->loop, &s->sigterm);
    s->sigint.data = s->sigterm.data = s;
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    stop_signals_release(); /* one that came meanwhile is handled now */

    if (s->st.hosts.count > 1 && relay_start(&s->relay, &s->st.shm, &s->st.hosts) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        state_destroy(&s->st);
        return 1;
    }
    int local = ctl_local_ranks(s->h); /* this host's workers are ranks first .. first + local - 1 */
    s->num_children = local + s->st.plan.optim_procs;
    s->children = calloc((size_t)s->num_children, sizeof *s->children);
    for (int i = 0; i < s->num_children; i++) {
        struct child *c = &s->children[i];
        c->kind = i < local ? PROC_WORKER : PROC_OPTIM;
        c->index = i < local ? ctl_local_first(s->h) + i : i - local;
        c->sup = s;
        uv_timer_init(s->loop, &c->restart_timer);
        c->restart_timer.data = c;
    }
    if (s->logged >= (uint32_t)job->steps)
        transition(s, SUP_FINISHING); /* resumed from the last step: only the export is left */
    for (int i = 0; i < s->num_children && s->state == SUP_RUN; i++) {
        struct child *c = &s->children[i];
        if (spawn_child(s, c) != 0) {
            fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
            transition(s, SUP_FAILED);
            break;
        }
    }
    uv_timer_start(&s->poll_timer, on_poll, POLL_MS, POLL_MS);
    maybe_finish(s);
    uv_run(s->loop, UV_RUN_DEFAULT);
    uv_loop_close(s->loop);
    if (s->metrics)
        fclose(s->metrics);
    if (s->relay)
        relay_stop(s->relay, s->exit_code == 0);
    state_destroy(&s->st);
    if (s->exit_code == 0)
        hosts_finalize(&s->st.hosts);
    if (s->fatal_at_start)
        s->exit_code = 2;
    else if (s->crash_loop)
        fprintf(stderr, "slidedp-launch: job stopped: a process kept dying\n");
    else if (s->nonfinite_step)
        fprintf(stderr, "slidedp-launch: job stopped at step %u: %s; nothing exported; the last good checkpoint is %s\n",
                s->nonfinite_step, s->nonfinite_what, s->last_good);
    else if (s->exit_code != 0 && s->exit_code != 130)
        fprintf(stderr, "slidedp-launch: job failed (state %s)\n", state_name(s->state));
    return s->exit_code;
}
