/* Holding the stop signals until the launcher's loop handles them (see stop_signals.h). */
#include "common/stop_signals.h"

#include <signal.h>
#include <stddef.h>

static volatile sig_atomic_t recorded;

static void record(int signum)
{
    recorded = signum;
}

static void stop_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGINT);
    sigaddset(set, SIGTERM);
}

void stop_signals_hold(void)
{
    sigset_t set;
    stop_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    struct sigaction sa = {.sa_handler = record};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int stop_signal_seen(void)
{
    sigset_t pending;
    if (recorded)
        return recorded;
    if (sigpending(&pending) != 0)
        return 0;
    return sigismember(&pending, SIGINT) == 1 ? SIGINT : sigismember(&pending, SIGTERM) == 1 ? SIGTERM : 0;
}

void stop_signals_release(void)
{
    sigset_t set;
    stop_set(&set);
    pthread_sigmask(SIG_UNBLOCK, &set, NULL);
    if (recorded)
        raise(recorded);
}
