/* How a worker or optimizer follows the launcher that started it (docs/design.md §3.1). The launcher
 * passes its pid (--launcher); the child dies with it (PR_SET_PDEATHSIG) and, at every wait, leaves
 * when its parent is no longer that pid. Never `getppid() == 1`: a launcher may itself be PID 1 (a
 * container without an init), and an orphan's new parent may be a subreaper. Stop signals are the
 * launcher's to act on. */
#ifndef SD_PARENT_H
#define SD_PARENT_H

#include <stdbool.h>

/* Records the launcher's pid, asks for SIGKILL when the parent dies and ignores SIGINT and SIGTERM;
 * -1 when the parent is already another process (the launcher died before the request). */
int parent_follow(int launcher_pid);
/* Whether the launcher recorded by parent_follow is no longer our parent. */
bool parent_gone(void);

#endif
