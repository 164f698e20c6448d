/* The worker's phase and heartbeat, which the launcher's watchdog and the monitors read, and the
 * check after every wait slice that leaves when the job is torn down (see pipeline_wait.h). */
#include "worker/pipeline_wait.h"

#include <stdio.h>
#include <unistd.h>

#include "common/parent.h"
#include "shm/futex.h"

static bool stop_now(struct worker *w)
{
    uint32_t stop = atomic_load(&w->ctl->stop);
    return stop == STOP_NOW || stop == STOP_WORKERS_NOW || atomic_load(&w->slot->generation) != w->generation ||
           parent_gone();
}

void set_phase(struct worker *w, int phase)
{
    atomic_store_explicit(&w->slot->phase, (uint32_t)phase, memory_order_relaxed);
    atomic_store_explicit(&w->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
}

uint32_t begin_wait(struct worker *w, int phase)
{
    uint32_t prev = atomic_load_explicit(&w->slot->phase, memory_order_relaxed);
    set_phase(w, phase);
    return prev;
}

/* A wait is progress of its own, so it beats the heartbeat. Nothing we hold needs saving when we
 * leave: the launcher repairs rings and slots of dead or departed workers. */
void bail_if_stopped(struct worker *w)
{
    atomic_store_explicit(&w->slot->heartbeat_ns, clock_ns(), memory_order_relaxed);
    if (stop_now(w)) {
        fprintf(stderr, "worker %d: stopping (job stopped or generation changed)\n", w->rank);
        _exit(0);
    }
}
