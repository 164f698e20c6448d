/* GPU topology (see topology.h): the description format (inih, errors with file and line), the
 * CPU backend's synthetic topology, sysfs lookups of NUMA node and PCIe switch, the ranks' view
 * of the host's GPUs, and the probe child that slidedp-launch and slidedp-plan run. */
#include "topology.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "err.h"
#include "ini_lines.h"

extern char **environ;

enum topo_key { KEY_COUNT, KEY_BUS, KEY_NUMA, KEY_SWITCH, KEY_MEMORY, KEY_P2P, KEY_NVLINK, NUM_TOPO_KEYS };
static const char *const key_names[NUM_TOPO_KEYS] = {"count", "bus", "numa", "switch", "memory", "p2p", "nvlink"};

void topology_assumed(int gpus, struct topology *t)
{
    memset(t, 0, sizeof *t);
    t->gpus = gpus;
    t->source = TOPO_ASSUMED;
    for (int i = 0; i < gpus; i++)
        t->numa[i] = t->pcie_switch[i] = t->memory_mib[i] = -1;
}

int64_t topology_min_memory(const struct topology *t)
{
    int64_t least = -1;
    for (int i = 0; i < t->gpus; i++) {
        if (t->memory_mib[i] <= 0)
            return -1;
        if (least < 0 || t->memory_mib[i] < least)
            least = t->memory_mib[i];
    }
    return least < 0 ? -1 : least << 20;
}

void topology_cpu(int gpus, struct topology *t)
{
    topology_assumed(gpus, t);
    t->source = TOPO_CPU;
    for (int i = 0; i < gpus; i++)
        for (int j = 0; j < gpus; j++)
            if (j != i)
                t->p2p[i] |= (uint64_t)1 << j;
}

/* ---- the description format ---- */

struct topo_parse {
    struct ini_lines lines;
    const char *where;
    int line[NUM_TOPO_KEYS];
    char *value[NUM_TOPO_KEYS];
    bool failed;
};

static int parse_err(struct topo_parse *p, int line, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int parse_err(struct topo_parse *p, int line, const char *section, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (line > 0)
        sd_err("%s:%d: [%s] %s: %s", p->where, line, section, key, msg);
    else
        sd_err("%s: [%s] %s: %s", p->where, section, key, msg);
    p->failed = true;
    return -1;
}

static int topo_handler(void *user, const char *section, const char *name, const char *value)
{
    struct topo_parse *p = user;
    if (p->failed)
        return 0;
    int line = ini_lines_current(&p->lines);
    if (strcmp(section, "gpus")) {
        parse_err(p, line, section[0] ? section : "(none)", name, "unknown section; accepted: [gpus]");
        return 0;
    }
    for (int k = 0; k < NUM_TOPO_KEYS; k++) {
        if (strcmp(name, key_names[k]))
            continue;
        if (p->line[k]) {
            parse_err(p, line, section, name, "set twice (first at line %d)", p->line[k]);
            return 0;
        }
        p->line[k] = line;
        p->value[k] = strdup(value);
        SD_ASSERT(p->value[k]);
        return 1;
    }
    parse_err(p, line, section, name, "unknown key; accepted in [gpus]: count, bus, numa, switch, memory, p2p, nvlink");
    return 0;
}

static int key_err(struct topo_parse *p, int key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int key_err(struct topo_parse *p, int key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return parse_err(p, p->line[key], "gpus", key_names[key], "%s", msg);
}

static bool parse_int(const char *s, long lo, long hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return false;
    *out = (int)v;
    return true;
}

/* The whitespace-separated words of p's value for key, exactly n of them. */
static int split_words(struct topo_parse *p, int key, int n, char *buf, size_t len, char **words)
{
    snprintf(buf, len, "%s", p->value[key]);
    int got = 0;
    for (char *w = strtok(buf, " \t"); w; w = strtok(NULL, " \t"))
        if (got++ < n)
            words[got - 1] = w;
    if (got != n)
        return key_err(p, key, "%d value(s) for %d GPU(s)", got, n);
    return 0;
}

static int parse_int_list(struct topo_parse *p, int key, int n, int *out)
{
    char buf[4096], *words[JOB_MAX_GPUS];
    if (split_words(p, key, n, buf, sizeof buf, words) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (!parse_int(words[i], -1, INT_MAX, &out[i]))
            return key_err(p, key, "'%s' is not an integer >= -1 (-1: unknown)", words[i]);
    return 0;
}

/* all | none | pairs "i-j ..." into symmetric bit masks. */
static int parse_pairs(struct topo_parse *p, int key, int n, uint64_t *mask)
{
    memset(mask, 0, sizeof(uint64_t) * JOB_MAX_GPUS);
    const char *v = p->value[key];
    if (!strcmp(v, "none"))
        return 0;
    if (!strcmp(v, "all")) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                mask[i] |= j != i ? (uint64_t)1 << j : 0;
        return 0;
    }
    char buf[8192];
    snprintf(buf, sizeof buf, "%s", v);
    for (char *w = strtok(buf, " \t"); w; w = strtok(NULL, " \t")) {
        char *dash = strchr(w, '-');
        int a, b;
        if (dash)
            *dash = 0;
        if (!dash || !parse_int(w, 0, INT_MAX, &a) || !parse_int(dash + 1, 0, INT_MAX, &b)) {
            if (dash)
                *dash = '-';
            return key_err(p, key, "'%s' is not a pair i-j; accepted: all, none, or pairs like 0-1 2-3", w);
        }
        if (a >= n || b >= n)
            return key_err(p, key, "pair %d-%d: GPU %d is not one of 0..%d", a, b, a >= n ? a : b, n - 1);
        if (a == b)
            return key_err(p, key, "pair %d-%d pairs a GPU with itself", a, b);
        mask[a] |= (uint64_t)1 << b;
        mask[b] |= (uint64_t)1 << a;
    }
    return 0;
}

/* Bus ids: words, "-" for unknown. */
static int parse_bus_ids(struct topo_parse *p, int n, struct topology *t)
{
    char buf[4096], *words[JOB_MAX_GPUS];
    if (split_words(p, KEY_BUS, n, buf, sizeof buf, words) != 0)
        return -1;
    for (int i = 0; i < n; i++) {
        if (strlen(words[i]) >= TOPO_BUS_ID_MAX)
            return key_err(p, KEY_BUS, "'%s' is longer than a PCI bus id", words[i]);
        snprintf(t->bus_id[i], TOPO_BUS_ID_MAX, "%s", strcmp(words[i], "-") ? words[i] : "");
    }
    return 0;
}

static int parse_values(struct topo_parse *p, struct topology *t)
{
    if (!p->line[KEY_COUNT])
        return key_err(p, KEY_COUNT, "missing (the number of GPUs)");
    if (!parse_int(p->value[KEY_COUNT], 1, JOB_MAX_GPUS, &t->gpus))
        return key_err(p, KEY_COUNT, "'%s' is not an integer in [1, %d]", p->value[KEY_COUNT], JOB_MAX_GPUS);
    int n = t->gpus;
    for (int i = 0; i < n; i++)
        t->numa[i] = t->pcie_switch[i] = t->memory_mib[i] = -1;
    if (p->line[KEY_BUS] && parse_bus_ids(p, n, t) != 0)
        return -1;
    if (p->line[KEY_NUMA] && parse_int_list(p, KEY_NUMA, n, t->numa) != 0)
        return -1;
    if (p->line[KEY_SWITCH] && parse_int_list(p, KEY_SWITCH, n, t->pcie_switch) != 0)
        return -1;
    if (p->line[KEY_MEMORY] && parse_int_list(p, KEY_MEMORY, n, t->memory_mib) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        if (t->memory_mib[i] == 0)
            return key_err(p, KEY_MEMORY, "GPU %d has 0 MiB (MiB of device memory, -1 for unknown)", i);
    if (!p->line[KEY_P2P])
        return key_err(p, KEY_P2P, "missing (all, none, or pairs like 0-1 2-3)");
    if (parse_pairs(p, KEY_P2P, n, t->p2p) != 0)
        return -1;
    if (p->line[KEY_NVLINK] && parse_pairs(p, KEY_NVLINK, n, t->nvlink) != 0)
        return -1;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (topology_nvlink(t, i, j) && !topology_p2p(t, i, j))
                return key_err(p, KEY_NVLINK, "GPUs %d and %d have NVLink but no P2P (add %d-%d to p2p)", i, j, i, j);
    return 0;
}

int topology_parse(FILE *f, const char *where, enum topology_source source, struct topology *t)
{
    memset(t, 0, sizeof *t);
    t->source = source;
    struct topo_parse p = {.where = where};
    int rc = ini_lines_parse(f, &p.lines, topo_handler, &p);
    if (!p.failed && rc > 0)
        sd_err("%s:%d: malformed line (expected [gpus], key = value, or a ; comment)", where, rc);
    else if (!p.failed && rc < 0)
        sd_err("%s: cannot read the topology", where);
    bool ok = !p.failed && rc == 0 && parse_values(&p, t) == 0;
    for (int k = 0; k < NUM_TOPO_KEYS; k++)
        free(p.value[k]);
    return ok ? 0 : -1;
}

int topology_load(const char *path, struct topology *t)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return sd_err("%s: cannot open the topology file: %s", path, strerror(errno));
    int rc = topology_parse(f, path, TOPO_FILE, t);
    fclose(f);
    return rc;
}

static void write_pairs(FILE *f, const char *key, const struct topology *t, const uint64_t *mask)
{
    int n = t->gpus, have = 0, pairs = n * (n - 1) / 2;
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            have += (mask[i] >> j & 1) != 0;
    fprintf(f, "%s =", key);
    if (have == 0 || have == pairs) {
        fprintf(f, " %s\n", have == 0 ? "none" : "all");
        return;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (mask[i] >> j & 1)
                fprintf(f, " %d-%d", i, j);
    fprintf(f, "\n");
}

void topology_write(FILE *f, const struct topology *t)
{
    fprintf(f, "; slidedp GPU topology, %s\n[gpus]\ncount = %d\nbus =", topology_source_name(t->source), t->gpus);
    for (int i = 0; i < t->gpus; i++)
        fprintf(f, " %s", t->bus_id[i][0] ? t->bus_id[i] : "-");
    fprintf(f, "\nnuma =");
    for (int i = 0; i < t->gpus; i++)
        fprintf(f, " %d", t->numa[i]);
    fprintf(f, "\nswitch =");
    for (int i = 0; i < t->gpus; i++)
        fprintf(f, " %d", t->pcie_switch[i]);
    fprintf(f, "\nmemory =");
    for (int i = 0; i < t->gpus; i++)
        fprintf(f, " %d", t->memory_mib[i]);
    fprintf(f, "\n");
    write_pairs(f, "p2p", t, t->p2p);
    write_pairs(f, "nvlink", t, t->nvlink);
}

/* ---- the ranks' view, sysfs, reporting ---- */

void topology_for_ranks(const struct topology *host, int ranks, struct topology *out)
{
    struct topology t;
    memset(&t, 0, sizeof t);
    t.gpus = ranks;
    t.source = host->source;
    int n = host->gpus;
    for (int r = 0; r < ranks; r++) {
        int g = r % n;
        memcpy(t.bus_id[r], host->bus_id[g], TOPO_BUS_ID_MAX);
        t.numa[r] = host->numa[g];
        t.pcie_switch[r] = host->pcie_switch[g];
        /* ranks that share a GPU share its memory */
        int sharing = ranks / n + (g < ranks % n);
        t.memory_mib[r] = host->memory_mib[g] > 0 ? host->memory_mib[g] / sharing : -1;
        for (int s = 0; s < ranks; s++) {
            int h = s % n;
            if (s == r)
                continue;
            if (h == g || topology_p2p(host, g, h))
                t.p2p[r] |= (uint64_t)1 << s;
            if (h != g && topology_nvlink(host, g, h))
                t.nvlink[r] |= (uint64_t)1 << s;
        }
    }
    *out = t;
}

/* "dddd:bb:dd.f" (hex), the name of a PCI function in sysfs. */
static bool is_pci_function(const char *name)
{
    static const char pattern[] = "xxxx:xx:xx.x";
    if (strlen(name) != sizeof pattern - 1)
        return false;
    for (size_t i = 0; pattern[i]; i++)
        if (pattern[i] == 'x' ? !isxdigit((unsigned char)name[i]) : name[i] != pattern[i])
            return false;
    return true;
}

/* The last path component of path, NUL-terminating path before it (path keeps the parent). */
static const char *cut_last(char *path)
{
    char *slash = strrchr(path, '/');
    if (!slash)
        return path;
    *slash = 0;
    return slash + 1;
}

/* The device behind which the GPU's PCIe link is shared, as a path in `key`. */
static void switch_key(const char *device_path, char *key, size_t len)
{
    char parent[PATH_MAX], grand[PATH_MAX];
    snprintf(parent, sizeof parent, "%s", device_path);
    cut_last(parent);
    snprintf(grand, sizeof grand, "%s", parent);
    const char *parent_name = cut_last(grand);
    char grand_dir[PATH_MAX];
    snprintf(grand_dir, sizeof grand_dir, "%s", grand);
    const char *grand_name = cut_last(grand_dir);
    if (is_pci_function(grand_name)) /* a switch: parent is its downstream port, grand its upstream */
        snprintf(key, len, "%s", grand);
    else if (is_pci_function(parent_name)) /* a root port: the GPU has the link to itself */
        snprintf(key, len, "%s", parent);
    else
        snprintf(key, len, "%s", device_path);
}

void topology_read_sysfs(struct topology *t, const char *sysfs_devices)
{
    static char keys[JOB_MAX_GPUS][PATH_MAX]; /* one per switch seen, numbered in GPU order */
    int num_switches = 0;
    for (int i = 0; i < t->gpus; i++) {
        t->numa[i] = t->pcie_switch[i] = -1;
        if (!t->bus_id[i][0])
            continue;
        char link[PATH_MAX], dev[PATH_MAX], file[PATH_MAX + 16];
        snprintf(link, sizeof link, "%s/%s", sysfs_devices, t->bus_id[i]);
        if (!realpath(link, dev))
            continue;
        snprintf(file, sizeof file, "%s/numa_node", dev);
        FILE *f = fopen(file, "r");
        if (f) {
            if (fscanf(f, "%d", &t->numa[i]) != 1 || t->numa[i] < -1)
                t->numa[i] = -1;
            fclose(f);
        }
        char key[PATH_MAX];
        switch_key(dev, key, sizeof key);
        int s = 0;
        while (s < num_switches && strcmp(keys[s], key))
            s++;
        if (s == num_switches)
            snprintf(keys[num_switches++], PATH_MAX, "%s", key);
        t->pcie_switch[i] = s;
    }
}

bool topology_all_p2p(const struct topology *t, int *a, int *b)
{
    for (int i = 0; i < t->gpus; i++)
        for (int j = i + 1; j < t->gpus; j++)
            if (!topology_p2p(t, i, j)) {
                *a = i;
                *b = j;
                return false;
            }
    return true;
}

/* "1,2,3" (or "none") for the GPUs whose bit is set in mask. */
static void gpu_list(const struct topology *t, uint64_t mask, char *out, size_t len)
{
    size_t n = 0;
    out[0] = 0;
    for (int j = 0; j < t->gpus && n < len; j++)
        if (mask >> j & 1)
            n += (size_t)snprintf(out + n, len - n, "%s%d", n ? "," : "", j);
    if (!out[0])
        snprintf(out, len, "none");
}

static void int_or_unknown(int v, char *out, size_t len)
{
    if (v < 0)
        snprintf(out, len, "?");
    else
        snprintf(out, len, "%d", v);
}

void topology_describe_gpu(const struct topology *t, int gpu, char *out, size_t len)
{
    char peers[256], links[256], numa[16], sw[16];
    gpu_list(t, t->p2p[gpu], peers, sizeof peers);
    if (t->source == TOPO_CPU) {
        snprintf(out, len, "GPU %d: CPU worker, P2P with %s (shared memory)", gpu, peers);
        return;
    }
    int_or_unknown(t->numa[gpu], numa, sizeof numa);
    int_or_unknown(t->pcie_switch[gpu], sw, sizeof sw);
    int n = snprintf(out, len, "GPU %d bus %s NUMA %s switch %s P2P with %s", gpu,
                     t->bus_id[gpu][0] ? t->bus_id[gpu] : "?", numa, sw, peers);
    if (t->nvlink[gpu] && n > 0 && (size_t)n < len) {
        gpu_list(t, t->nvlink[gpu], links, sizeof links);
        snprintf(out + n, len - (size_t)n, ", NVLink with %s", links);
    }
}

const char *topology_source_name(int source)
{
    static const char *names[] = {"cpu", "file", "probed", "assumed"};
    return source >= 0 && source < (int)(sizeof names / sizeof names[0]) ? names[source] : "?";
}

/* ---- the probe child ---- */

#define PROBE_OUTPUT_MAX (1 << 16)

/* Runs bin_dir/slidedp-worker --probe-topology --gpus G and parses what it prints. Waits for that
 * child alone (the launcher's libuv loop is not running yet). */
static int topology_probe(const char *bin_dir, int gpus, struct topology *t)
{
    char exe[PATH_MAX + 32], gpus_arg[16];
    snprintf(exe, sizeof exe, "%s/slidedp-worker", bin_dir);
    snprintf(gpus_arg, sizeof gpus_arg, "%d", gpus);
    char *argv[] = {exe, "--probe-topology", "--gpus", gpus_arg, NULL};
    int pfd[2];
    if (pipe(pfd) != 0)
        return sd_err("probing the GPUs: pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 2);
    posix_spawn_file_actions_addclose(&fa, pfd[0]);
    posix_spawn_file_actions_addclose(&fa, pfd[1]);
    pid_t pid;
    /* the launcher blocks its stop signals until its loop runs; the probe must not inherit that */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    int rc = posix_spawn(&pid, exe, &fa, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (rc != 0) {
        close(pfd[0]);
        return sd_err("probing the GPUs: cannot start %s: %s", exe, strerror(rc));
    }
    char *text = malloc(PROBE_OUTPUT_MAX + 1);
    SD_ASSERT(text);
    size_t len = 0;
    for (;;) {
        ssize_t n = read(pfd[0], text + len, PROBE_OUTPUT_MAX - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        if (len == PROBE_OUTPUT_MAX) /* too much to be a topology: the parse below says so */
            break;
    }
    text[len] = 0;
    close(pfd[0]);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        while (len > 0 && text[len - 1] == '\n')
            text[--len] = 0;
        char *last = strrchr(text, '\n');
        sd_err("probing the GPUs (%s --probe-topology) failed: %s", exe,
               len ? (last ? last + 1 : text) : WIFEXITED(status) ? "no output" : "killed by a signal");
        free(text);
        return -1;
    }
    if (len == 0) {
        free(text);
        return sd_err("probing the GPUs (%s --probe-topology) printed nothing", exe);
    }
    FILE *f = fmemopen(text, len, "r");
    SD_ASSERT(f);
    rc = topology_parse(f, "slidedp-worker --probe-topology", TOPO_PROBED, t);
    fclose(f);
    free(text);
    if (rc == 0 && t->gpus != gpus)
        return sd_err("slidedp-worker --probe-topology described %d GPUs for %d ranks", t->gpus, gpus);
    return rc;
}

int topology_for_job(const struct job_config *job, const char *bin_dir, struct topology *t)
{
    if (job->topology[0]) {
        struct topology host;
        if (topology_load(job->topology, &host) != 0)
            return sd_err_prefix("[runtime] topology");
        topology_for_ranks(&host, job->gpus, t);
        return 0;
    }
    if (job->device == DEVICE_CPU) {
        topology_cpu(job->gpus, t);
        return 0;
    }
    return topology_probe(bin_dir, job->gpus, t);
}
