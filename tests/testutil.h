/* Helpers shared by the tests: temporary directories, files, running the slidedp binaries, and
 * fixed, printed seeds. Include after <cmocka.h>'s prerequisites. */
#ifndef SD_TESTUTIL_H
#define SD_TESTUTIL_H

#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <stdbool.h>
#include <cmocka.h>

/* Creates a fresh directory under $TMPDIR (or /tmp) named after tag; returns a static path that
 * stays valid until the next call with the same slot (slots 0..7). Whatever the test's outcome,
 * the directory is removed when the process exits or is stopped by SIGTERM/SIGINT. */
const char *tu_tmpdir(int slot, const char *tag);
void tu_rmrf(const char *path);
void tu_write_file(const char *path, const char *text);
/* Reads a whole file (NUL-terminated, caller frees); NULL if missing. */
char *tu_read_file(const char *path, size_t *len);
bool tu_exists(const char *path);
/* Reads <dir>/<name>/<rel> as tu_read_file does; fails the test when it cannot be read. */
char *tu_read_job_file(const char *dir, const char *name, const char *rel, size_t *len);
/* The numbers after "key": in a metrics.jsonl file, in order (at most max); how many there are.
 * Fails the test when the file cannot be read. */
int tu_metrics_values(const char *path, const char *key, double *out, int max);
/* The shared memory objects a job (by its name, shm/ctl.h ctl_job_name) has in /dev/shm. */
int tu_shm_objects(const char *job);

/* Path of a built binary (e.g. "launcher/slidedp-launch") under $SD_BUILD; static buffer slot. */
const char *tu_bin(const char *rel);
/* Path under $SD_SOURCE. */
const char *tu_src(const char *rel);

/* Runs argv (NULL-terminated) with output captured into *out (caller frees; may be NULL) and
 * returns the exit status (128+signal when killed). */
int tu_run(char **argv, char **out);
/* printf-style shell command through /bin/sh -c, output captured. */
int tu_sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct layout;
/* The weights of the HF model directory dir in lay's parameter space (fp32, caller frees); fails
 * the test when they cannot be read. */
float *tu_load_weights(const char *dir, const struct layout *lay);

/* A fixed seed, printed once per test so failures can be reproduced. */
uint64_t tu_seed(const char *test, uint64_t seed);
/* Deterministic uniform floats in [lo, hi) from a simple 64-bit generator. */
void tu_fill_uniform(float *x, size_t n, uint64_t *state, float lo, float hi);
float tu_uniform(uint64_t *state);

#endif
