/* Implementation of the test helpers (see testutil.h). */
#include "testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "common/hf.h"
#include "common/layout.h"
#include "common/rng.h"

static char tmp_paths[8][1024];
static pid_t tmp_owner; /* the process that made them (not a forked child on its way to exec) */

/* Removes every scratch directory tu_tmpdir made (a forked rm: only async-signal-safe calls, so it
 * also runs from the handler of the signal meson sends a test that runs out of time). */
static void remove_tmp_paths(void)
{
    if (getpid() != tmp_owner)
        return;
    for (int i = 0; i < 8; i++) {
        if (!tmp_paths[i][0])
            continue;
        pid_t pid = fork();
        if (pid == 0) {
            setsid(); /* out of the test's process group, which a timeout kills */
            char *argv[] = {"rm", "-rf", tmp_paths[i], NULL};
            execv("/bin/rm", argv);
            _exit(127);
        }
        if (pid > 0)
            waitpid(pid, NULL, 0);
    }
}

static void remove_tmp_paths_and_die(int sig)
{
    remove_tmp_paths();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* On any exit (a failed assertion included) and on SIGTERM/SIGINT, scratch directories go. */
static void clean_up_at_exit(void)
{
    static bool registered;
    if (registered)
        return;
    registered = true;
    tmp_owner = getpid();
    atexit(remove_tmp_paths);
    signal(SIGTERM, remove_tmp_paths_and_die);
    signal(SIGINT, remove_tmp_paths_and_die);
}

void tu_rmrf(const char *path)
{
    char cmd[2200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0)
        fprintf(stderr, "warning: could not remove %s\n", path);
}

const char *tu_tmpdir(int slot, const char *tag)
{
    const char *base = getenv("TMPDIR");
    if (!base || !*base)
        base = "/tmp";
    clean_up_at_exit();
    snprintf(tmp_paths[slot], sizeof tmp_paths[slot], "%s/sdtest-%s-%d", base, tag, (int)getpid());
    tu_rmrf(tmp_paths[slot]);
    if (mkdir(tmp_paths[slot], 0700) != 0)
        fail_msg("mkdir %s: %s", tmp_paths[slot], strerror(errno));
    return tmp_paths[slot];
}

void tu_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        fail_msg("cannot write %s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

char *tu_read_file(const char *path, size_t *len)
{
    /* read in a loop rather than by size: /proc files report size 0 */
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (n + 1 >= cap)
            buf = realloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    fclose(f);
    buf[n] = 0;
    if (len)
        *len = n;
    return buf;
}

int tu_metrics_values(const char *path, const char *key, double *out, int max)
{
    char *text = tu_read_file(path, NULL);
    if (!text) {
        fprintf(stderr, "cannot read %s\n", path);
        abort();
    }
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    int n = 0;
    for (const char *q = strstr(text, quoted); q && n < max; q = strstr(q + 1, quoted))
        out[n++] = strtod(q + strlen(quoted), NULL);
    free(text);
    return n;
}

char *tu_read_job_file(const char *dir, const char *name, const char *rel, size_t *len)
{
    char p[2200];
    snprintf(p, sizeof p, "%s/%s/%s", dir, name, rel);
    char *data = tu_read_file(p, len);
    if (!data)
        fail_msg("%s: no %s", name, rel);
    return data;
}

bool tu_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static char bin_paths[8][1024];
static int bin_slot;

const char *tu_bin(const char *rel)
{
    const char *b = getenv("SD_BUILD");
    char *p = bin_paths[bin_slot++ % 8];
    snprintf(p, 1024, "%s/%s", b ? b : "build", rel);
    return p;
}

const char *tu_src(const char *rel)
{
    const char *s = getenv("SD_SOURCE");
    char *p = bin_paths[bin_slot++ % 8];
    snprintf(p, 1024, "%s/%s", s ? s : ".", rel);
    return p;
}

static int wait_status(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return 128 + WTERMSIG(st);
}

static char *drain(int fd)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1024 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    buf[len] = 0;
    return buf;
}

int tu_run(char **argv, char **out)
{
    int pfd[2];
    if (pipe(pfd) != 0)
        fail_msg("pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        close(pfd[1]);
        execv(argv[0], argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(pfd[1]);
    char *text = drain(pfd[0]);
    close(pfd[0]);
    int rc = wait_status(pid);
    if (out)
        *out = text;
    else
        free(text);
    return rc;
}

int tu_sh(char **out, const char *fmt, ...)
{
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    return tu_run(argv, out);
}

uint64_t tu_seed(const char *test, uint64_t seed)
{
    printf("# %s: seed %llu\n", test, (unsigned long long)seed);
    return seed;
}

float tu_uniform(uint64_t *state)
{
    uint64_t z = splitmix64(state);
    return (float)((z >> 40) * (1.0 / 16777216.0));
}

void tu_fill_uniform(float *x, size_t n, uint64_t *state, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * tu_uniform(state);
}

int tu_shm_objects(const char *job)
{
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "slidedp.%s.", job);
    while (d && (e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    if (d)
        closedir(d);
    return n;
}

float *tu_load_weights(const char *dir, const struct layout *lay)
{
    struct hf_weights w;
    if (hf_weights_open(dir, &w) != 0)
        fail_msg("%s", sd_errmsg());
    float *params = calloc((size_t)lay->total_numel, sizeof(float));
    if (!params || hf_weights_load(&w, lay, params) != 0)
        fail_msg("%s: %s", dir, params ? sd_errmsg() : "out of memory");
    hf_weights_close(&w);
    return params;
}
