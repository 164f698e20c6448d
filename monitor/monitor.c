/* Job discovery, read-only attach and consistent snapshots for the monitors (see monitor.h). */
#include "monitor.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "common/err.h"
#include "shm/futex.h"
#include "shm/region.h"

#define SHM_DIR "/dev/shm"
#define SNAPSHOT_TRIES 20000 /* about a second of retries before a stuck writer is reported */

static const char *const phase_names[] = {
    [PHASE_IDLE] = "idle",
    [PHASE_STARTING] = "starting",
    [PHASE_WAIT_WEIGHTS] = "wait-weights",
    [PHASE_FORWARD] = "forward",
    [PHASE_BACKWARD] = "backward",
    [PHASE_WAIT_SLOT] = "wait-slot",
    [PHASE_EVAL] = "eval",
    [PHASE_WAIT_GRADS] = "wait-grads",
    [PHASE_REDUCE] = "reduce",
    [PHASE_WAIT_NORM] = "wait-norm",
    [PHASE_UPDATE] = "update",
    [PHASE_DONE] = "done",
    [PHASE_WAIT_PEERS] = "wait-peers",
};
_Static_assert(sizeof phase_names / sizeof phase_names[0] == PHASE_COUNT, "a phase has no name");

const char *mon_phase_name(uint32_t phase)
{
    return phase < PHASE_COUNT ? phase_names[phase] : "?";
}

/* Whether a launcher holds the job's owner lock (docs/design.md §8.6): a stored pid may have been
 * reused. Read from /proc/locks, so that looking never takes the lock a starting launcher needs. */
static bool launcher_alive(const char *name)
{
    char lock[REGION_NAME_MAX], path[REGION_NAME_MAX + 16], line[256], kind[16];
    ctl_lock_name(name, lock, sizeof lock);
    snprintf(path, sizeof path, "%s%s", SHM_DIR, lock);
    struct stat st;
    FILE *f = stat(path, &st) == 0 ? fopen("/proc/locks", "r") : NULL;
    bool held = false;
    unsigned major_dev, minor_dev;
    unsigned long inode;
    /* "1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF" */
    while (f && !held && fgets(line, sizeof line, f))
        held = sscanf(line, "%*d: %15s %*s %*s %*d %x:%x:%lu", kind, &major_dev, &minor_dev, &inode) == 4 &&
               !strcmp(kind, "FLOCK") && inode == st.st_ino && makedev(major_dev, minor_dev) == st.st_dev;
    if (f)
        fclose(f);
    return held;
}

int mon_attach(struct mon *m, const char *name)
{
    memset(m, 0, sizeof *m);
    char obj[REGION_NAME_MAX];
    if (strlen(name) >= MON_NAME_MAX || strchr(name, '/'))
        return sd_err("no job named '%s' is running", name);
    ctl_region_name(name, "ctl", obj, sizeof obj);
    if (!shm_region_exists(obj))
        return sd_err("no job named %s is running (no %s%s)", name, SHM_DIR, obj);
    if (job_shm_attach(&m->shm, name, JOB_MAP_CTL, true) != 0)
        return -1;
    const struct ctl_header *h = m->h = m->shm.ctl;
    if (h->header_size != sizeof *h) {
        /* the layout changed without a new CTL_VERSION: nothing past the first fields can be read */
        uint32_t size = h->header_size;
        mon_detach(m);
        return sd_err("job %s was started by another build of slidedp (its ctl header has %u bytes, this one %zu)",
                      name, size, sizeof(struct ctl_header));
    }
    snprintf(m->name, sizeof m->name, "%s", name);
    /* the launcher stores its pid after the rest of the header (this load pairs with that store) */
    int32_t pid = m->launcher_pid = atomic_load(&h->launcher_pid);
    if (pid <= 0) {
        mon_detach(m);
        return sd_err("job %s is still starting; try again", name);
    }
    if (!launcher_alive(name)) {
        mon_detach(m);
        return sd_err("job %s is not running: its launcher (pid %d) is gone and left its state in %s/slidedp.%s.*",
                      name, pid, SHM_DIR, name);
    }
    uint64_t procs_end = h->off_procs + (uint64_t)(h->gpus + h->optim_procs) * sizeof(struct proc_slot);
    if (h->gpus < 1 || h->gpus > JOB_MAX_GPUS || h->optim_procs < 1 || h->optim_procs > CTL_MAX_OPTIM ||
        procs_end > h->size) {
        int gpus = h->gpus, optim = h->optim_procs;
        mon_detach(m);
        return sd_err("%s%s has an inconsistent header (gpus %d, optimizers %d)", SHM_DIR, obj, gpus, optim);
    }
    return 0;
}

void mon_detach(struct mon *m)
{
    job_shm_detach(&m->shm);
    m->h = NULL;
}

bool mon_job_running(const struct mon *m)
{
    char obj[REGION_NAME_MAX];
    ctl_region_name(m->name, "ctl", obj, sizeof obj);
    return launcher_alive(m->name) && shm_region_exists(obj);
}

static int cmp_jobs(const void *a, const void *b)
{
    return strcmp(((const struct mon_job_info *)a)->name, ((const struct mon_job_info *)b)->name);
}

int mon_list_jobs(struct mon_job_info **jobs, int *count)
{
    *jobs = NULL;
    *count = 0;
    DIR *d = opendir(SHM_DIR);
    if (!d)
        return sd_err("cannot list %s: %s", SHM_DIR, strerror(errno));
    int cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (strncmp(e->d_name, "slidedp.", 8) != 0 || len < 13 || strcmp(e->d_name + len - 4, ".ctl") != 0 ||
            len - 12 >= MON_NAME_MAX)
            continue;
        char name[MON_NAME_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(len - 12), e->d_name + 8);
        struct mon m;
        if (mon_attach(&m, name) != 0)
            continue; /* a dead job's leftovers, one still being created, or another build's */
        if (*count == cap) {
            cap = cap ? 2 * cap : 4;
            struct mon_job_info *grown = realloc(*jobs, (size_t)cap * sizeof **jobs);
            if (!grown) {
                mon_detach(&m);
                closedir(d);
                free(*jobs);
                *jobs = NULL;
                *count = 0;
                return sd_err("out of memory");
            }
            *jobs = grown;
        }
        struct mon_job_info *j = &(*jobs)[(*count)++];
        snprintf(j->name, sizeof j->name, "%s", name);
        j->pid = m.launcher_pid;
        snprintf(j->log_dir, sizeof j->log_dir, "%s", m.h->job.log_dir);
        j->step = atomic_load(&m.h->metrics_step);
        j->steps = m.h->job.steps;
        mon_detach(&m);
    }
    closedir(d);
    if (*count > 1)
        qsort(*jobs, (size_t)*count, sizeof **jobs, cmp_jobs);
    return 0;
}

void mon_print_jobs(FILE *f, const struct mon_job_info *jobs, int count)
{
    fprintf(f, "  %-14s %-8s %-13s %s\n", "JOB", "PID", "STEP", "LOG DIR");
    for (int i = 0; i < count; i++) {
        char step[32];
        snprintf(step, sizeof step, "%u/%d", jobs[i].step, jobs[i].steps);
        fprintf(f, "  %-14s %-8d %-13s %s\n", jobs[i].name, jobs[i].pid, step, jobs[i].log_dir);
    }
}

/* A path (has a slash, ends in .ini, or names a file) rather than a job name. */
static bool is_ini_arg(const char *arg)
{
    size_t n = strlen(arg);
    struct stat st;
    return strchr(arg, '/') || (n > 4 && !strcmp(arg + n - 4, ".ini")) || (stat(arg, &st) == 0 && S_ISREG(st.st_mode));
}

static bool is_dir_arg(const char *arg)
{
    struct stat st;
    return stat(arg, &st) == 0 && S_ISDIR(st.st_mode);
}

/* A job's log.dir (the path the launcher prints): the running job that logs there, compared by real
 * path, else the job that would (a finished one, for --plot). */
static int pick_log_dir(const char *arg, struct mon_target *t)
{
    char real[PATH_MAX], theirs[PATH_MAX];
    if (!realpath(arg, real))
        return sd_err("%s: %s", arg, strerror(errno));
    if (strlen(real) >= sizeof t->log_dir)
        return sd_err("%s: the path is too long", arg);
    struct mon_job_info *jobs;
    int n;
    if (mon_list_jobs(&jobs, &n) != 0)
        return MON_ERR;
    for (int i = 0; i < n; i++)
        if (realpath(jobs[i].log_dir, theirs) && !strcmp(theirs, real)) {
            snprintf(t->name, sizeof t->name, "%s", jobs[i].name);
            snprintf(t->log_dir, sizeof t->log_dir, "%s", jobs[i].log_dir);
            free(jobs);
            return 0;
        }
    free(jobs);
    ctl_job_name(real, t->name, sizeof t->name);
    snprintf(t->log_dir, sizeof t->log_dir, "%s", real);
    return 0;
}

int mon_pick(const char *arg, int num_overrides, char **overrides, struct mon_target *t,
             struct mon_job_info **several, int *num_several)
{
    memset(t, 0, sizeof *t);
    *several = NULL;
    *num_several = 0;
    if (arg && is_dir_arg(arg)) {
        if (num_overrides > 0) {
            sd_err("overrides (%s) go after a job.ini, not a log.dir", overrides[0]);
            return MON_BAD_ARG;
        }
        return pick_log_dir(arg, t) == 0 ? 0 : MON_ERR;
    }
    if (num_overrides > 0 && (!arg || !is_ini_arg(arg))) {
        sd_err("overrides (%s) go after a job.ini", overrides[0]);
        return MON_BAD_ARG;
    }
    if (!arg) {
        struct mon_job_info *jobs;
        int n;
        if (mon_list_jobs(&jobs, &n) != 0)
            return MON_ERR;
        if (n == 0)
            return sd_err("no slidedp job is running (no live %s/slidedp.*.ctl)", SHM_DIR);
        if (n > 1) {
            *several = jobs;
            *num_several = n;
            return sd_err("%d slidedp jobs are running; name one (its name or its job.ini)", n);
        }
        snprintf(t->name, sizeof t->name, "%s", jobs[0].name);
        snprintf(t->log_dir, sizeof t->log_dir, "%s", jobs[0].log_dir);
        free(jobs);
        return 0;
    }
    if (is_ini_arg(arg)) {
        struct job_config *job = malloc(sizeof *job);
        if (!job)
            return sd_err("out of memory");
        int rc = job_config_load(arg, num_overrides, overrides, job);
        if (rc == 0) {
            ctl_job_name(job->log_dir, t->name, sizeof t->name);
            snprintf(t->log_dir, sizeof t->log_dir, "%s", job->log_dir);
        }
        free(job);
        return rc == 0 ? 0 : MON_BAD_ARG;
    }
    struct mon m;
    if (mon_attach(&m, arg) != 0)
        return MON_ERR;
    snprintf(t->name, sizeof t->name, "%s", arg);
    snprintf(t->log_dir, sizeof t->log_dir, "%s", m.h->job.log_dir);
    mon_detach(&m);
    return 0;
}

int mon_job_arg(const char *prog, char *arg, struct mon_job_args *a)
{
    if (a->job && strchr(arg, '=')) {
        if (a->num_overrides == MON_MAX_OVERRIDES) {
            fprintf(stderr, "%s: more than %d overrides\n", prog, MON_MAX_OVERRIDES);
            return 2;
        }
        a->overrides[a->num_overrides++] = arg;
    } else if (a->job) {
        fprintf(stderr, "%s: more than one JOB given ('%s' and '%s')\n", prog, a->job, arg);
        return 2;
    } else {
        a->job = arg;
    }
    return 0;
}

int mon_pick_for_main(const char *prog, struct mon_job_args *a, struct mon_target *t)
{
    struct mon_job_info *several;
    int num_several;
    int rc = mon_pick(a->job, a->num_overrides, a->overrides, t, &several, &num_several);
    if (rc == 0)
        return 0;
    fprintf(stderr, "%s: %s\n", prog, sd_errmsg());
    if (several)
        mon_print_jobs(stderr, several, num_several);
    free(several);
    return rc == MON_BAD_ARG ? 2 : 1;
}

static void read_proc(const struct proc_slot *p, struct mon_proc *out)
{
    out->pid = atomic_load_explicit(&p->pid, memory_order_relaxed);
    out->phase = atomic_load_explicit(&p->phase, memory_order_relaxed);
    out->step = atomic_load_explicit(&p->step, memory_order_relaxed);
    out->restarts = atomic_load_explicit(&p->restarts, memory_order_relaxed);
    out->chunk = atomic_load_explicit(&p->chunk, memory_order_relaxed);
    out->heartbeat_ns = atomic_load_explicit(&p->heartbeat_ns, memory_order_relaxed);
    out->bytes_in = atomic_load_explicit(&p->bytes_in, memory_order_relaxed);
    out->bytes_out = atomic_load_explicit(&p->bytes_out, memory_order_relaxed);
    /* the parts of busy_ns before it (optimizer/optim.c add_busy) */
    out->update_ns = atomic_load_explicit(&p->update_ns, memory_order_acquire);
    out->lane_wait_ns = atomic_load_explicit(&p->lane_wait_ns, memory_order_acquire);
    out->busy_ns = atomic_load_explicit(&p->busy_ns, memory_order_relaxed);
    out->wait_ns = atomic_load_explicit(&p->wait_ns, memory_order_relaxed);
    out->items = atomic_load_explicit(&p->items, memory_order_relaxed);
    /* Written once at start-up; a copy taken during that moment may be cut short, never unterminated. */
    memcpy(out->device, p->device_name, sizeof out->device);
    out->device[sizeof out->device - 1] = 0;
    for (char *c = out->device; *c; c++)
        if (*c < ' ' || *c > '~')
            *c = '?';
    out->peak_flops = p->peak_flops;
}

int mon_snapshot(const struct mon *m, struct mon_snapshot *s)
{
    const struct ctl_header *h = m->h;
    const struct job_stats *js = &h->stats;
    for (int tries = 0;; tries++) {
        /* acquire: pairs with the launcher's release fence before it stores the even seq that ends
         * a write, so an even seq0 makes that write's data visible to the copy */
        uint32_t seq0 = atomic_load_explicit(&js->seq, memory_order_acquire);
        if (!(seq0 & 1)) {
            memcpy(&s->stats, js, sizeof s->stats);
            /* acquire fence: the copy's loads complete before seq is read again; pairs with the
             * release fence after the launcher's odd store, so a copy that saw any byte of a newer
             * write sees that write's seq here */
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&js->seq, memory_order_relaxed) == seq0)
                break;
        }
        if (tries == SNAPSHOT_TRIES)
            return sd_err("the stats of job %s stay mid-update (did its launcher die while writing them?)", m->name);
        if (tries > 100)
            usleep(50);
        else
            sched_yield();
    }
    s->t_ns = clock_ns();
    s->launcher_pid = atomic_load_explicit(&h->launcher_pid, memory_order_relaxed);
    s->stop = atomic_load_explicit(&h->stop, memory_order_relaxed);
    s->gpus = h->gpus;
    s->optim_procs = h->optim_procs;
    const struct proc_slot *slots = (const struct proc_slot *)((const char *)h + h->off_procs); /* see ctl_proc */
    for (int r = 0; r < h->gpus; r++)
        read_proc(&slots[r], &s->workers[r]);
    for (int k = 0; k < h->optim_procs; k++)
        read_proc(&slots[h->gpus + k], &s->optims[k]);
    s->stalled = false;
    for (int i = 0; i < h->gpus + h->optim_procs; i++) {
        struct mon_proc *p = i < h->gpus ? &s->workers[i] : &s->optims[i - h->gpus];
        p->stalled = p->pid > 0 && p->phase != PHASE_DONE && s->t_ns > p->heartbeat_ns &&
                     s->t_ns - p->heartbeat_ns > ctl_stall_ns(&h->job);
        s->stalled |= p->stalled;
    }
    return 0;
}

static double share(double x, double dt_s)
{
    double v = x * 1e-9 / dt_s;
    return v < 0 ? 0 : v > 1 ? 1 : v;
}

/* A counter read lower than before (its slot re-initialised) counts as no progress. */
static double grown(uint64_t before, uint64_t after)
{
    return after > before ? (double)(after - before) : 0;
}

void mon_proc_rates(const struct mon_proc *before, const struct mon_proc *after, double dt_s, bool worker,
                    struct mon_rates *r)
{
    memset(r, 0, sizeof *r);
    if (dt_s <= 0)
        return;
    double busy = grown(before->busy_ns, after->busy_ns), wait = grown(before->wait_ns, after->wait_ns);
    r->in_bps = grown(before->bytes_in, after->bytes_in) / dt_s;
    r->out_bps = grown(before->bytes_out, after->bytes_out) / dt_s;
    r->items_ps = grown(before->items, after->items) / dt_s;
    r->wait = share(wait, dt_s);
    r->work = share(worker ? busy - wait : busy, dt_s);
    /* busy time is credited when a micro-step ends, so a short window can over-count it */
    r->work = r->work < 1 - r->wait ? r->work : 1 - r->wait;
}

uint32_t mon_history_first(const struct job_stats *st, uint32_t first_step)
{
    if (st->step == 0)
        return 0;
    uint32_t k0 = st->step >= JOB_STATS_HISTORY ? st->step - JOB_STATS_HISTORY + 1 : 1;
    k0 = k0 > first_step ? k0 : first_step;
    return k0 < st->step ? k0 : st->step;
}
