/* Fault injection for the crash-recovery tests: SLIDEDP_CRASH_AT="point:n[,point:n...]" makes the
 * process kill itself (SIGKILL) the n-th time it passes the named point. Only a process's first
 * incarnation obeys it (fault_init with restarts > 0 disables it), so a restarted process runs
 * on; "point:n:always" applies to every incarnation (a crash loop). */
#ifndef SD_FAULT_H
#define SD_FAULT_H

void fault_init(unsigned restarts);
void fault_point(const char *point);
/* SLIDEDP_CRASH_AT_STEP="step:rank": the worker of that rank kills itself whenever it starts that
 * step, in every incarnation (the crash-loop test). */
void fault_step(unsigned step, int rank);

#endif
