/* Fault injection for the crash-recovery tests: SLIDEDP_CRASH_AT="point:n[,point:n...]" makes the
 * process kill itself (SIGKILL) the n-th time it passes the named point. Only a process's first
 * incarnation obeys it (fault_init with restarts > 0 disables it), so a restarted process runs on. */
#ifndef SD_FAULT_H
#define SD_FAULT_H

void fault_init(unsigned restarts);
void fault_point(const char *point);

#endif
