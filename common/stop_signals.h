/* SIGINT and SIGTERM held for the launcher until its event loop takes them (docs/design.md §3.1): while
 * it validates, measures the host, plans and creates the shared state, a stop must neither kill it
 * half-way (the default action, in whichever thread the kernel picks: libraries such as OpenBLAS
 * start threads before main) nor be lost; long work in between asks stop_signal_seen and gives up. */
#ifndef SD_STOP_SIGNALS_H
#define SD_STOP_SIGNALS_H

/* Blocks SIGINT and SIGTERM in the calling thread (and the threads it starts) and records one that
 * reaches any other thread. */
void stop_signals_hold(void);
/* The stop signal that came since stop_signals_hold (waiting blocked or recorded), else 0. */
int stop_signal_seen(void);
/* Unblocks them once the caller's own handlers are installed, and raises a recorded one again so that
 * those handlers see it. */
void stop_signals_release(void);

#endif
