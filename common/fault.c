/* Fault injection points (see fault.h): the named points, and the kill, stop, hold and delay rules
 * SLIDEDP_CRASH_AT and SLIDEDP_DELAY_AT set on them. */
#include "fault.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Every protocol publish point, by process. A point sits right after a store other processes (or
 * a relaunch) act on, or right before one that must follow the state it leaves. */
const char *const fault_points[] = {
    /* launcher */
    "launcher_state_checked",   /* owner lock held, a leftover state judged; nothing created or adopted */
    "launcher_regions_created", /* objects exist, header not written */
    "launcher_init_block",      /* header published, weights partly drawn or loaded */
    "launcher_logged",          /* metrics_step stored, the due checkpoint not yet written */
    "launcher_ckpt_written",    /* checkpoint on disk, ckpt_done_step not yet stored */
    "launcher_stop_checkpoint", /* stopped: before the checkpoint of the last committed step */
    "launcher_ckpt_writing",    /* the state of a due checkpoint is whole here: before writing it */
    "ckpt_tmp_written",         /* step-S.tmp-P or final.tmp-P complete, not yet renamed into place */
    "ckpt_renamed",             /* step-S/ or final/ in place, older checkpoints not yet pruned */
    /* launcher, the relay thread (several hosts) */
    "relay_sending",            /* a message is about to be handed to MPI_Isend */
    "relay_received",           /* a message was received, not yet applied or queued */
    "relay_grad_posted",        /* a remote rank's gradient is in its slot and ring */
    "relay_state_applied",      /* host 0: another host's optimizer state of a step copied in */
    /* worker main thread */
    "worker_slot_writing", "worker_direct_sending", "worker_param_staged", "worker_grad_published",
    "worker_loss_saved", "worker_val_done",
    /* worker poster thread */
    "worker_slot_written", "worker_slot_posted", "worker_pushed", "poster_marked", "poster_rank_done",
    /* optimizer */
    "optim_reduce_journaled", "optim_reduced", "optim_freed", "optim_update_journaled", "optim_updated",
    "optim_norm_written", NULL};

#define MAX_RULES 8
#define NUM_POINTS (sizeof fault_points / sizeof fault_points[0] - 1)

/* SLIDEDP_FAULT_COUNT=dir: every point's passes, written at exit to dir/<role><index>.<pid> */
static _Atomic long counts[NUM_POINTS];
static char count_path[512];

static struct {
    int point; /* index in fault_points */
    long target;      /* the pass that acts; 0: every pass (delays only) */
    bool stop, hold;
    long delay_ms;    /* > 0: SLIDEDP_DELAY_AT, sleep this long instead of dying */
    _Atomic long hits;
} rules[MAX_RULES];
static int num_rules;

static int point_index(const char *name)
{
    for (int i = 0; fault_points[i]; i++)
        if (!strcmp(fault_points[i], name))
            return i;
    return -1;
}

static void write_counts(void)
{
    FILE *f = fopen(count_path, "w");
    if (!f)
        return;
    for (size_t i = 0; i < NUM_POINTS; i++)
        if (atomic_load(&counts[i]))
            fprintf(f, "%s %ld\n", fault_points[i], atomic_load(&counts[i]));
    fclose(f);
}

/* Adds the rules of one variable's spec (see fault.h); `delay` reads the delay field after n. */
static void parse_rules(const char *var, bool delay, unsigned restarts, int index)
{
    const char *spec = getenv(var);
    if (!spec)
        return;
    char buf[512];
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && num_rules < MAX_RULES; tok = strtok_r(NULL, ",", &save)) {
        char *fields[8];
        int nf = 0;
        char *save2 = NULL;
        for (char *f = strtok_r(tok, ":", &save2); f && nf < 8; f = strtok_r(NULL, ":", &save2))
            fields[nf++] = f;
        int first_option = delay ? 3 : 2;
        int point = nf >= first_option ? point_index(fields[0]) : -1;
        bool every = point >= 0 && delay && !strcmp(fields[1], "all");
        long target = every ? 0 : point >= 0 ? strtol(fields[1], NULL, 10) : -1;
        long ms = delay && point >= 0 ? strtol(fields[2], NULL, 10) : 0;
        if (point < 0 || (target < 1 && !every) || (delay && ms <= 0)) {
            fprintf(stderr, "%s=%s: a rule is not %s with a known point\n", var, spec,
                    delay ? "point:n:ms[:option...] (n a pass from 1 or all, ms > 0)"
                          : "point:n[:option...] (n a pass from 1)");
            abort();
        }
        bool applies = restarts == 0, stop = false, hold = false;
        for (int i = first_option; i < nf; i++) {
            if (!strcmp(fields[i], "always"))
                applies = true;
            else if (!strcmp(fields[i], "stop"))
                stop = true;
            else if (!strcmp(fields[i], "hold"))
                hold = true;
            else if (fields[i][0] == 'i')
                applies = restarts == strtoul(fields[i] + 1, NULL, 10);
        }
        for (int i = first_option; i < nf; i++)
            if (fields[i][0] == 'r' && strtol(fields[i] + 1, NULL, 10) != index)
                applies = false;
        if (!applies)
            continue;
        rules[num_rules].point = point;
        rules[num_rules].target = target;
        rules[num_rules].stop = stop;
        rules[num_rules].hold = hold;
        rules[num_rules].delay_ms = ms;
        atomic_store(&rules[num_rules].hits, 0);
        num_rules++;
    }
}

void fault_init(const char *role, unsigned restarts, int index)
{
    num_rules = 0;
    const char *count_dir = getenv("SLIDEDP_FAULT_COUNT");
    if (count_dir && !count_path[0]) {
        snprintf(count_path, sizeof count_path, "%s/%s%d.%d", count_dir, role, index, (int)getpid());
        atexit(write_counts);
    }
    parse_rules("SLIDEDP_CRASH_AT", false, restarts, index);
    parse_rules("SLIDEDP_DELAY_AT", true, restarts, index);
}

void fault_point(const char *point)
{
    if (num_rules == 0 && !count_path[0])
        return;
    int p = point_index(point);
    if (p < 0) {
        fprintf(stderr, "fault_point: %s is not in the list of fault points\n", point);
        abort();
    }
    atomic_fetch_add(&counts[p], 1);
    for (int i = 0; i < num_rules; i++) {
        if (rules[i].point != p)
            continue;
        long pass = atomic_fetch_add(&rules[i].hits, 1) + 1;
        if (rules[i].target != 0 && pass != rules[i].target)
            continue;
        if (rules[i].delay_ms > 0) {
            struct timespec ts = {rules[i].delay_ms / 1000, rules[i].delay_ms % 1000 * 1000000};
            while (nanosleep(&ts, &ts) != 0)
                ; /* a signal's handler ran: sleep the rest */
            continue;
        }
        while (rules[i].hold)
            pause(); /* this thread only; the process's other threads run on */
        raise(rules[i].stop ? SIGSTOP : SIGKILL);
    }
}

void fault_step(unsigned step, int rank)
{
    const char *spec = getenv("SLIDEDP_CRASH_AT_STEP");
    unsigned at;
    int at_rank;
    if (spec && sscanf(spec, "%u:%d", &at, &at_rank) == 2 && at == step && at_rank == rank)
        raise(SIGKILL);
}
