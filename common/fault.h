/* Fault injection for the crash-recovery tests: SLIDEDP_CRASH_AT="point:n[:option...][,...]" makes
 * a process act the n-th time it passes the named point (fault_points in fault.c lists every one).
 * The action is SIGKILL; with the option "stop" SIGSTOP (the test then kills or continues the
 * stopped process itself); with "hold" the thread that passed the point waits forever while the
 * process's other threads run on (a poster thread lagging behind by construction). By default only a process's first incarnation obeys (restarts = 0);
 * options narrow or widen that: "always" (every incarnation: a crash loop), "i<K>" (only the
 * incarnation after K restarts), "r<R>" (only the process of rank or index R; a launcher: its host's index).
 * Slowness as well as death: SLIDEDP_DELAY_AT="point:n:ms[:option...][,...]" makes the thread that
 * passes the point for the n-th time (n = "all": every time) sleep ms milliseconds and go on, with
 * the same options; "stop" of SLIDEDP_CRASH_AT stops the whole process instead. Both variables may
 * be set together (at most 8 rules in all). */
#ifndef SD_FAULT_H
#define SD_FAULT_H

/* Reads the spec for this process: its role ("launcher", "worker", "optim"), restarts so far and
 * its rank (workers), index (optimizers) or 0 (launcher). With SLIDEDP_FAULT_COUNT=dir, the process
 * counts its passes of every point and writes them at exit to dir/<role><index>.<pid> ("point n"
 * lines), so a test can aim at the middle of a run. */
void fault_init(const char *role, unsigned restarts, int index);
/* A protocol publish point; the name must be one of FAULT_POINTS (checked, so a test cannot aim at
 * a point that does not exist). Thread-safe. */
void fault_point(const char *point);
/* The list of every point, NULL-terminated, for tests that enumerate them. */
extern const char *const fault_points[];
/* SLIDEDP_CRASH_AT_STEP="step:rank": the worker of that rank kills itself whenever it starts that
 * step, in every incarnation (the crash-loop test). */
void fault_step(unsigned step, int rank);

#endif
