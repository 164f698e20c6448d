/* The supervisor of slidedp-launch: a libuv loop that spawns the workers and optimizer processes
 * (exec'd, never forked copies; the launcher never initialises CUDA), turns committed steps into
 * metrics.jsonl lines, reacts to signals and child exits, and finishes the job by exporting
 * final/ and removing the shared state. One state variable, changed in one place. */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "common/err.h"
#include "common/fsutil.h"
#include "planner/plan.h"
#include "shm/futex.h"

#define POLL_MS 2
#define KILL_GRACE_MS 5000

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
    struct sup *sup;
    int kind;  /* enum proc_kind */
    int index;
    bool running;
};

struct sup {
    uv_loop_t *loop;
    struct job_state st;
    struct ctl_header *h;
    struct child *children;
    int num_children, running, workers_running;
    uv_timer_t poll_timer, kill_timer;
    uv_signal_t sigint, sigterm;
    enum sup_state state;
    int exit_code;
    FILE *metrics;
    uint32_t logged;
    uint64_t t_prev;   /* commit time of the previous step (or workers ready) */
    bool ready_seen;
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
    futex_wake_all(&h->chunks_reduced);
    futex_wake_all(&h->metrics_step);
    for (int c = 0; c < h->num_chunks; c++)
        futex_wake_all(&ctl_chunk_state(h, c)->version);
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

/* The one place the supervisor state changes. */
static void transition(struct sup *s, enum sup_state next)
{
    if (s->state == next || s->state == SUP_FAILED)
        return;
    s->state = next;
    switch (next) {
    case SUP_STOPPING:
        atomic_store(&s->h->stop, 1);
        wake_everyone(s->h);
        break;
    case SUP_DRAINING:
        atomic_store(&s->h->stop, 3);
        wake_everyone(s->h);
        break;
    case SUP_FAILED:
        s->exit_code = 1;
        atomic_store(&s->h->stop, 2);
        wake_everyone(s->h);
        kill_all(s, SIGTERM);
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
    js->updated_ns = clock_ns();
    js->loss_history[step % JOB_STATS_HISTORY] = loss;
    atomic_thread_fence(memory_order_release);
    atomic_store_explicit(&js->seq, seq + 2, memory_order_relaxed);
}

static int write_metrics(struct sup *s, uint32_t step, const struct step_record *rec)
{
    const struct job_config *job = &s->h->job;
    int G = s->h->gpus;
    double loss = 0;
    for (int r = 0; r < G; r++)
        loss += rec->loss_sum[r];
    loss /= (double)rec->tokens;
    double step_s = (double)(rec->t_commit_ns - s->t_prev) * 1e-9;
    s->t_prev = rec->t_commit_ns;
    int64_t tokens = (int64_t)G * job->grad_accum * job->micro_batch * job->seq_len;
    double tok_s = step_s > 0 ? (double)tokens / step_s : 0;
    char val[160] = "";
    double val_loss = -1, val_acc = 0;
    if (atomic_load(&rec->val_ranks_done) == (uint32_t)G) {
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
            snprintf(val, sizeof val, ",\"val_loss\":%.6f,\"val_acc\":%.6f", val_loss, val_acc);
        }
    }
    publish_stats(s, step, loss, rec, step_s, tok_s, tokens, val_loss, val_acc);
    fprintf(s->metrics,
            "{\"step\":%u,\"loss\":%.6f,\"lr\":%.6e,\"grad_norm\":%.6f,\"tokens\":%lld,\"targets\":%lld,"
            "\"step_s\":%.6f,\"tok_s\":%.1f,\"clip_coef\":%.6f%s}\n",
            step, loss, rec->lr, rec->grad_norm, (long long)tokens, (long long)rec->tokens, step_s, tok_s,
            rec->clip_coef, val);
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

static bool is_val_step(const struct ctl_header *h, uint32_t s)
{
    if (!h->job.data_val[0])
        return false;
    return s == (uint32_t)h->job.steps || (h->job.val_every > 0 && s % (uint32_t)h->job.val_every == 0);
}

static void poll_steps(struct sup *s)
{
    struct ctl_header *h = s->h;
    if (!s->ready_seen && atomic_load(&h->workers_ready) >= (uint32_t)h->gpus) {
        s->ready_seen = true;
        s->t_prev = clock_ns();
    }
    while (s->logged < (uint32_t)h->job.steps) {
        uint32_t next = s->logged + 1;
        struct step_record *rec = ctl_step(h, next);
        /* acquire: pairs with the release stores that set these flags after the data they cover */
        if (atomic_load_explicit(&rec->step, memory_order_acquire) != next ||
            !atomic_load_explicit(&rec->committed, memory_order_acquire) ||
            !atomic_load_explicit(&rec->norm_written, memory_order_acquire) ||
            atomic_load_explicit(&rec->ranks_done, memory_order_acquire) < (uint32_t)h->gpus)
            break;
        if (is_val_step(h, next) && atomic_load_explicit(&rec->val_ranks_done, memory_order_acquire) < (uint32_t)h->gpus)
            break;
        write_metrics(s, next, rec);
        memset((char *)rec + sizeof rec->step, 0, sizeof *rec - sizeof rec->step);
        atomic_store_explicit(&rec->step, next + CTL_STEP_RECORDS, memory_order_release);
        s->logged = next;
        atomic_store_explicit(&h->metrics_step, next, memory_order_release);
        futex_wake_all(&h->metrics_step);
    }
    if (s->logged == (uint32_t)h->job.steps && s->state == SUP_RUN)
        transition(s, SUP_FINISHING);
}

static void on_poll(uv_timer_t *t)
{
    poll_steps(t->data);
}

static void finish(struct sup *s)
{
    uv_timer_stop(&s->poll_timer);
    uv_timer_stop(&s->kill_timer);
    poll_steps(s);
    if (s->state == SUP_FINISHING) {
        char dir[JOB_PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s/final", s->st.job.ckpt_dir);
        if (state_export(&s->st, dir) != 0) {
            fprintf(stderr, "slidedp-launch: export failed: %s\n", sd_errmsg());
            s->exit_code = 1;
        } else {
            printf("exported %s\n", dir);
            s->exit_code = 0;
        }
    } else if (s->state == SUP_STOPPING || s->state == SUP_DRAINING) {
        printf("stopped after step %u\n", s->logged);
        s->exit_code = 130;
    }
    uv_close((uv_handle_t *)&s->poll_timer, NULL);
    uv_close((uv_handle_t *)&s->kill_timer, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
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
    bool clean = status == 0 && term_signal == 0;
    if (!clean && s->state != SUP_FAILED) {
        if (term_signal)
            fprintf(stderr, "slidedp-launch: %s %d died from signal %d\n", what, c->index, term_signal);
        else
            fprintf(stderr, "slidedp-launch: %s %d exited with status %lld\n", what, c->index, (long long)status);
        transition(s, SUP_FAILED);
    }
    if (clean && s->state == SUP_RUN && s->logged < (uint32_t)s->h->job.steps) {
        /* a worker leaves early only when asked to stop; optimizers only after the last step */
        poll_steps(s);
    }
    if (s->state == SUP_STOPPING && s->workers_running == 0)
        transition(s, SUP_DRAINING);
    if (s->running == 0)
        finish(s);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    struct sup *s = sig->data;
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
    char file[PATH_MAX + 32], a1[32], a2[32];
    const char *prog = c->kind == PROC_WORKER ? "slidedp-worker" : "slidedp-optim";
    snprintf(file, sizeof file, "%s/%s", s->bin_dir, prog);
    snprintf(a1, sizeof a1, "%d", c->index);
    snprintf(a2, sizeof a2, "%d", s->gpu_count > 0 ? c->index % s->gpu_count : 0);
    char *args[10];
    int n = 0;
    args[n++] = file;
    args[n++] = "--job";
    args[n++] = s->h->job_name;
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
    atomic_store(&ctl_proc(s->h, c->kind, c->index)->pid, c->proc.pid);
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

static int find_bin_dir(char *out, size_t len)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return sd_err("cannot find my own executable: %s", strerror(errno));
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(out, len, "%s", self);
    return 0;
}

static void print_header(const struct sup *s)
{
    const struct job_state *st = &s->st;
    const struct job_config *job = &st->job;
    printf("slidedp: job %s, %s %s model (%.2fM params, %d layers), %s init\n", st->job_name, st->cfg.model_type,
           st->cfg.architecture, (double)st->lay.num_params / 1e6, st->cfg.num_layers,
           job->init_random ? "random" : "pretrained");
    printf("slidedp: %d %s worker(s), %d optimizer process(es); %d step(s) of %d x %d x %d sequences of %d tokens\n",
           job->gpus, job->device == DEVICE_CPU ? "cpu" : "cuda", st->plan.optim_procs, job->steps, job->gpus,
           job->grad_accum, job->micro_batch, job->seq_len);
    plan_print(stdout, &st->plan, &st->cfg, job);
    printf("slidedp: shared state %.1f MiB in /dev/shm/slidedp.%s.*; logs in %s\n",
           (double)(st->shm.ctl->size + st->shm.ctl->params16_bytes + st->shm.ctl->master_bytes +
                    st->shm.ctl->grads_bytes) /
               (1 << 20),
           st->job_name, job->log_dir);
    fflush(stdout);
}

int launch_run(const struct launch_opts *opts)
{
    struct sup *s = calloc(1, sizeof *s);
    if (!s) {
        fprintf(stderr, "slidedp-launch: out of memory\n");
        return 1;
    }
    if (job_config_load(opts->ini_path, opts->num_overrides, opts->overrides, &s->st.job) != 0) {
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
    if (find_bin_dir(s->bin_dir, sizeof s->bin_dir) != 0 || !(s->child_env = make_child_env())) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 1;
    }
    if (state_create(&s->st) != 0) {
        fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
        return 2;
    }
    s->h = s->st.shm.ctl;
    char metrics_path[JOB_PATH_MAX + 32];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", job->log_dir);
    if (fs_mkdir_p(job->log_dir, 0755) != 0 || !(s->metrics = fopen(metrics_path, "w"))) {
        fprintf(stderr, "slidedp-launch: cannot write %s: %s\n", metrics_path, s->metrics ? "" : strerror(errno));
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

    s->num_children = job->gpus + s->st.plan.optim_procs;
    s->children = calloc((size_t)s->num_children, sizeof *s->children);
    for (int i = 0; i < s->num_children; i++) {
        struct child *c = &s->children[i];
        c->kind = i < job->gpus ? PROC_WORKER : PROC_OPTIM;
        c->index = i < job->gpus ? i : i - job->gpus;
        if (spawn_child(s, c) != 0) {
            fprintf(stderr, "slidedp-launch: %s\n", sd_errmsg());
            transition(s, SUP_FAILED);
            break;
        }
    }
    uv_timer_start(&s->poll_timer, on_poll, POLL_MS, POLL_MS);
    if (s->running == 0)
        finish(s);
    uv_run(s->loop, UV_RUN_DEFAULT);
    uv_loop_close(s->loop);
    fclose(s->metrics);
    state_destroy(&s->st);
    if (s->exit_code != 0 && s->exit_code != 130)
        fprintf(stderr, "slidedp-launch: job failed (state %s)\n", state_name(s->state));
    return s->exit_code;
}
