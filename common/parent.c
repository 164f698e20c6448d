/* The child side of the launcher's liveness (see parent.h). */
#include "parent.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

static int launcher;

int parent_follow(int launcher_pid)
{
    launcher = launcher_pid;
    /* the launcher turns them into a stop that every process takes part in (a session of our own
     * keeps a terminal's Ctrl-C away from us; this, a signal to every process of a cgroup, as
     * systemd sends it) */
    signal(SIGINT, SIG_IGN);
    signal(SIGTERM, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    /* after the request: a launcher that died before it left us to another parent already */
    return getppid() == launcher ? 0 : -1;
}

bool parent_gone(void)
{
    return getppid() != launcher;
}
