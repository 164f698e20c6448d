/* job.ini parsing (inih), overrides, validation and path resolution; used by slidedp-launch,
 * slidedp-plan and the tests. Every error names the file, line, key and what is accepted. */
#include "job.h"

#include <errno.h>
#include <glob.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data.h"
#include "err.h"
#include "fsutil.h"
#include "ini_lines.h"
#include "topology.h"

enum key_type { K_PATH, K_INT, K_DOUBLE, K_BOOL, K_ENUM, K_BYTES_AUTO, K_U64 };

struct key_spec {
    const char *section;
    const char *key;
    enum key_type type;
    size_t offset;
    double min, max;       /* K_INT, K_DOUBLE */
    const char *choices;   /* K_ENUM: "a|b|c", value = index (+ enum_base) */
    int enum_base;
};

#define OFF(field) offsetof(struct job_config, field)

static const struct key_spec key_specs[] = {
    {"model", "path", K_PATH, OFF(model_path), 0, 0, NULL, 0},
    {"model", "init", K_ENUM, OFF(init_random), 0, 0, "pretrained|random", 0},
    {"data", "train", K_PATH, OFF(data_train), 0, 0, NULL, 0},
    {"data", "val", K_PATH, OFF(data_val), 0, 0, NULL, 0},
    {"data", "seq_len", K_INT, OFF(seq_len), 1, 1 << 24, NULL, 0},
    {"data", "shuffle", K_BOOL, OFF(shuffle), 0, 0, NULL, 0},
    {"data", "val_every", K_INT, OFF(val_every), 0, INT_MAX, NULL, 0},
    {"data", "val_sequences", K_INT, OFF(val_sequences), 0, INT_MAX, NULL, 0},
    {"data", "attention", K_ENUM, OFF(attention), 0, 0, "auto|document|window", 0},
    {"train", "micro_batch", K_INT, OFF(micro_batch), 1, 1 << 20, NULL, 0},
    {"train", "grad_accum", K_INT, OFF(grad_accum), 1, 1 << 20, NULL, 0},
    {"train", "steps", K_INT, OFF(steps), 1, INT_MAX, NULL, 0},
    {"train", "lr", K_DOUBLE, OFF(lr), 0, 1e3, NULL, 0},
    {"train", "warmup", K_INT, OFF(warmup), 0, INT_MAX, NULL, 0},
    {"train", "schedule", K_ENUM, OFF(schedule), 0, 0, "cosine|linear|constant", 0},
    {"train", "min_lr_ratio", K_DOUBLE, OFF(min_lr_ratio), 0, 1, NULL, 0},
    {"train", "weight_decay", K_DOUBLE, OFF(weight_decay), 0, 1e3, NULL, 0},
    {"train", "beta1", K_DOUBLE, OFF(beta1), 0, 0.999999999, NULL, 0},
    {"train", "beta2", K_DOUBLE, OFF(beta2), 0, 0.999999999, NULL, 0},
    {"train", "eps", K_DOUBLE, OFF(eps), 1e-30, 1, NULL, 0},
    {"train", "grad_clip", K_DOUBLE, OFF(grad_clip), 0, 1e30, NULL, 0},
    {"train", "seed", K_U64, OFF(seed), 0, 0, NULL, 0},
    {"train", "optimizer_state", K_ENUM, OFF(optimizer_state), 0, 0, "fp32|bf16|8bit", 0},
    {"checkpoint", "dir", K_PATH, OFF(ckpt_dir), 0, 0, NULL, 0},
    {"checkpoint", "every", K_INT, OFF(ckpt_every), 0, INT_MAX, NULL, 0},
    {"checkpoint", "keep", K_INT, OFF(ckpt_keep), 1, 1000000, NULL, 0},
    {"checkpoint", "export_dtype", K_ENUM, OFF(export_dtype), 0, 0, "bf16|fp32", 0},
    {"checkpoint", "resume", K_ENUM, OFF(resume_auto), 0, 0, "never|auto", 0},
    {"checkpoint", "save_final", K_BOOL, OFF(save_final), 0, 0, NULL, 0},
    {"runtime", "device", K_ENUM, OFF(device), 0, 0, "cuda|cpu", 0},
    {"runtime", "gpus", K_INT, OFF(gpus), 1, JOB_MAX_GPUS, NULL, 0},
    {"runtime", "gpu_mem", K_BYTES_AUTO, OFF(gpu_mem), 0, 0, NULL, 0},
    {"runtime", "optim_procs", K_INT, OFF(optim_procs), 0, 256, NULL, 0},
    {"runtime", "optim_threads", K_INT, OFF(optim_threads), 0, 32, NULL, 0},
    {"runtime", "layers_per_chunk", K_INT, OFF(layers_per_chunk), 0, 1 << 16, NULL, 0},
    {"runtime", "chunk_buffers", K_INT, OFF(chunk_buffers), 0, 1 << 16, NULL, 0},
    {"runtime", "grad_slots", K_INT, OFF(grad_slots), 0, 1 << 16, NULL, 0},
    {"runtime", "logits_rows", K_INT, OFF(logits_rows), 0, 1 << 24, NULL, 0},
    {"runtime", "activations", K_ENUM, OFF(act_policy), 0, 0, "auto|keep|recompute|offload", 0},
    {"runtime", "param_route", K_ENUM, OFF(param_route), 0, 0, "auto|replicated|sharded", 0},
    {"runtime", "grad_route", K_ENUM, OFF(grad_route), 0, 0, "auto|cpu|gpu", 0},
    {"runtime", "update_mode", K_ENUM, OFF(update_mode), 0, 0, "auto|after_backward|during_backward", 0},
    {"runtime", "accumulate_on_device", K_ENUM, OFF(accumulate_on_device), 0, 0, "auto|false|true", -1},
    {"runtime", "weights_source", K_ENUM, OFF(weights_source), 0, 0, "auto|bf16_copy|master", 0},
    {"runtime", "grad_dtype", K_ENUM, OFF(grad_dtype), 0, 0, "fp32|bf16", 0},
    {"runtime", "topology", K_PATH, OFF(topology), 0, 0, NULL, 0},
    {"runtime", "deterministic", K_BOOL, OFF(deterministic), 0, 0, NULL, 0},
    {"runtime", "watchdog_s", K_INT, OFF(watchdog_s), 0, 86400 * 365, NULL, 0},
    {"runtime", "host_state", K_ENUM, OFF(host_state), 0, 0, "auto|replicated|sharded", 0},
    {"runtime", "host_link_gbps", K_DOUBLE, OFF(host_link_gbps), 0, 1e6, NULL, 0},
    {"log", "dir", K_PATH, OFF(log_dir), 0, 0, NULL, 0},
    {"log", "every", K_INT, OFF(log_every), 1, INT_MAX, NULL, 0},
};
#define NUM_KEYS (int)(sizeof key_specs / sizeof key_specs[0])

void job_config_defaults(struct job_config *job)
{
    memset(job, 0, sizeof *job);
    job->init_random = false;
    job->seq_len = 4096;
    job->micro_batch = 1;
    job->grad_accum = 1;
    job->steps = 1000;
    job->lr = 1e-5;
    job->schedule = SCHED_COSINE;
    job->min_lr_ratio = 0.1;
    job->beta1 = 0.9;
    job->beta2 = 0.95;
    job->eps = 1e-8;
    job->grad_clip = 1.0;
    job->seed = 1234;
    snprintf(job->ckpt_dir, sizeof job->ckpt_dir, "runs/demo/ckpt");
    job->ckpt_keep = 2;
    job->resume_auto = true;
    job->save_final = true;
    job->device = DEVICE_CUDA;
    job->gpus = 1;
    job->accumulate_on_device = -1;
    job->deterministic = true;
    job->watchdog_s = 600;
    snprintf(job->log_dir, sizeof job->log_dir, "runs/demo");
    job->log_every = 1;
}

/* Parse state shared by the file pass and the override pass. */
struct parse_ctx {
    struct job_config *job;
    const char *where;    /* file path, or "override" */
    bool command_line;    /* applying the overrides: their relative paths start at the current directory */
    int line;             /* current line (file pass) */
    struct ini_lines lines;
    int key_line[NUM_KEYS]; /* line each key was set at in the file (0 = not set) */
    bool failed;
};

static const struct key_spec *find_key(const char *section, const char *key)
{
    for (int i = 0; i < NUM_KEYS; i++)
        if (!strcmp(key_specs[i].section, section) && !strcmp(key_specs[i].key, key))
            return &key_specs[i];
    return NULL;
}

static bool known_section(const char *section)
{
    for (int i = 0; i < NUM_KEYS; i++)
        if (!strcmp(key_specs[i].section, section))
            return true;
    return false;
}

static void list_keys(const char *section, char *out, size_t len)
{
    out[0] = 0;
    for (int i = 0; i < NUM_KEYS; i++) {
        if (strcmp(key_specs[i].section, section))
            continue;
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s%s", used ? ", " : "", key_specs[i].key);
    }
}

static void list_sections(char *out, size_t len)
{
    out[0] = 0;
    for (int i = 0; i < NUM_KEYS; i++) {
        if (i > 0 && !strcmp(key_specs[i - 1].section, key_specs[i].section))
            continue;
        size_t used = strlen(out);
        snprintf(out + used, len - used, "%s[%s]", used ? ", " : "", key_specs[i].section);
    }
}

static int ctx_err(struct parse_ctx *c, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int ctx_err(struct parse_ctx *c, const char *section, const char *key, const char *fmt, ...)
{
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (c->line > 0)
        sd_err("%s:%d: [%s] %s: %s", c->where, c->line, section, key, msg);
    else
        sd_err("%s: %s.%s: %s", c->where, section, key, msg);
    c->failed = true;
    return 0;
}

static bool parse_bytes(const char *v, int64_t *out)
{
    if (!strcmp(v, "auto")) {
        *out = 0;
        return true;
    }
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || errno || !(x > 0))
        return false;
    double mult = 1;
    if (*end) {
        switch (*end) {
        case 'K': case 'k': mult = 1024.0; break;
        case 'M': case 'm': mult = 1024.0 * 1024; break;
        case 'G': case 'g': mult = 1024.0 * 1024 * 1024; break;
        case 'T': case 't': mult = 1024.0 * 1024 * 1024 * 1024; break;
        default: return false;
        }
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'B' || *end == 'b')
            end++;
        if (*end)
            return false;
    }
    x *= mult;
    if (x >= 9.2e18 || x < 1)
        return false;
    *out = (int64_t)x;
    return true;
}

static int set_value(struct parse_ctx *c, const struct key_spec *k, const char *value)
{
    char *base = (char *)c->job;
    char *end;
    switch (k->type) {
    case K_PATH: {
        /* a path typed on the command line is the shell's, from the current directory; one in the
         * file is relative to the file's folder (job_resolve_path, in validate) */
        char cwd[PATH_MAX] = "";
        if (c->command_line && value[0] && value[0] != '/' && !getcwd(cwd, sizeof cwd))
            return ctx_err(c, k->section, k->key, "cannot resolve '%s': the current directory: %s", value,
                           strerror(errno));
        if ((size_t)snprintf(base + k->offset, JOB_PATH_MAX, "%s%s%s", cwd, cwd[0] ? "/" : "", value) >= JOB_PATH_MAX)
            return ctx_err(c, k->section, k->key, "path longer than %d bytes", JOB_PATH_MAX - 1);
        return 1;
    }
    case K_INT: {
        errno = 0;
        long long x = strtoll(value, &end, 10);
        if (!*value || *end || errno || x < (long long)k->min || x > (long long)k->max)
            return ctx_err(c, k->section, k->key, "'%s' is not an integer in [%.0f, %.0f]", value, k->min, k->max);
        *(int *)(base + k->offset) = (int)x;
        return 1;
    }
    case K_U64: {
        errno = 0;
        unsigned long long x = strtoull(value, &end, 10);
        if (!*value || *end || errno || value[0] == '-')
            return ctx_err(c, k->section, k->key, "'%s' is not a non-negative integer", value);
        *(uint64_t *)(base + k->offset) = x;
        return 1;
    }
    case K_DOUBLE: {
        errno = 0;
        double x = strtod(value, &end);
        if (!*value || *end || errno || !isfinite(x) || x < k->min || x > k->max)
            return ctx_err(c, k->section, k->key, "'%s' is not a number in [%g, %g]", value, k->min, k->max);
        *(double *)(base + k->offset) = x;
        return 1;
    }
    case K_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "1") || !strcmp(value, "yes"))
            *(bool *)(base + k->offset) = true;
        else if (!strcmp(value, "false") || !strcmp(value, "0") || !strcmp(value, "no"))
            *(bool *)(base + k->offset) = false;
        else
            return ctx_err(c, k->section, k->key, "'%s' is not one of true|false", value);
        return 1;
    case K_ENUM: {
        const char *p = k->choices;
        size_t vlen = strlen(value);
        for (int idx = 0; *p; idx++) {
            const char *bar = strchr(p, '|');
            size_t len = bar ? (size_t)(bar - p) : strlen(p);
            if (len == vlen && !strncmp(p, value, len)) {
                if (k->offset == OFF(init_random) || k->offset == OFF(resume_auto))
                    *(bool *)(base + k->offset) = idx == 1;
                else
                    *(int *)(base + k->offset) = idx + k->enum_base;
                return 1;
            }
            p = bar ? bar + 1 : p + len;
        }
        return ctx_err(c, k->section, k->key, "'%s' is not one of %s", value, k->choices);
    }
    case K_BYTES_AUTO: {
        int64_t bytes;
        if (!parse_bytes(value, &bytes))
            return ctx_err(c, k->section, k->key, "'%s' is not 'auto' or a size like 24G, 512M", value);
        *(int64_t *)(base + k->offset) = bytes;
        return 1;
    }
    }
    return 0;
}

static int apply(struct parse_ctx *c, const char *section, const char *key, const char *value)
{
    if (!known_section(section)) {
        char sections[256];
        list_sections(sections, sizeof sections);
        return ctx_err(c, section, key, "unknown section [%s]; accepted: %s", section, sections);
    }
    const struct key_spec *k = find_key(section, key);
    if (!k) {
        char keys[512];
        list_keys(section, keys, sizeof keys);
        return ctx_err(c, section, key, "unknown key; accepted in [%s]: %s", section, keys);
    }
    int idx = (int)(k - key_specs);
    if (c->line > 0) {
        if (c->key_line[idx])
            return ctx_err(c, section, key, "set twice (first at line %d)", c->key_line[idx]);
        c->key_line[idx] = c->line;
    }
    return set_value(c, k, value);
}

static int ini_handler_cb(void *user, const char *section, const char *name, const char *value)
{
    struct parse_ctx *c = user;
    if (c->failed)
        return 0;
    c->line = ini_lines_current(&c->lines);
    if (!section[0])
        return ctx_err(c, "(none)", name, "key outside any [section]");
    return apply(c, section, name, value);
}

static bool is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Removes "." segments and folds "dir/.." pairs of an absolute path, in place. */
static void normalize_path(char *path)
{
    char *segs[JOB_PATH_MAX / 2];
    int n = 0;
    char buf[JOB_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *tok = strtok(buf, "/"); tok; tok = strtok(NULL, "/")) {
        if (!strcmp(tok, "."))
            continue;
        if (!strcmp(tok, "..")) {
            if (n > 0)
                n--;
            continue;
        }
        segs[n++] = tok;
    }
    size_t len = 0;
    path[0] = 0;
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(path + len, JOB_PATH_MAX - len, "/%s", segs[i]);
    if (n == 0)
        snprintf(path, JOB_PATH_MAX, "/");
}

int job_resolve_path(const struct job_config *job, const char *path, char *out)
{
    if (!path[0]) {
        out[0] = 0;
        return 0;
    }
    if (path[0] == '/') {
        snprintf(out, JOB_PATH_MAX, "%s", path);
        normalize_path(out);
        return 0;
    }
    const char *slash = strrchr(job->ini_path, '/');
    size_t dir_len = slash ? (size_t)(slash - job->ini_path) : 0;
    size_t path_len = strlen(path);
    if (dir_len + 1 + path_len >= JOB_PATH_MAX)
        return sd_err("path '%s' is too long once resolved against %s", path, job->ini_path);
    memcpy(out, job->ini_path, dir_len);
    out[dir_len] = '/';
    memcpy(out + dir_len + 1, path, path_len + 1);
    normalize_path(out);
    return 0;
}

/* Error for a key whose value fails a cross-key or file check: names the line if it came from the file. */
static int key_err(const struct parse_ctx *c, const char *section, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int key_err(const struct parse_ctx *c, const char *section, const char *key, const char *fmt, ...)
{
    char msg[2600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const struct key_spec *k = find_key(section, key);
    int line = k ? c->key_line[k - key_specs] : 0;
    if (line)
        return sd_err("%s:%d: [%s] %s: %s", c->job->ini_path, line, section, key, msg);
    return sd_err("%s: [%s] %s: %s", c->job->ini_path, section, key, msg);
}

static int validate(struct parse_ctx *c)
{
    struct job_config *job = c->job;
    char resolved[JOB_PATH_MAX];

    if (!job->model_path[0])
        return key_err(c, "model", "path", "missing (an HF directory with config.json)");
    if (job_resolve_path(job, job->model_path, resolved) != 0)
        return key_err(c, "model", "path", "%s", sd_errmsg());
    snprintf(job->model_path, sizeof job->model_path, "%s", resolved);
    if (!is_dir(job->model_path))
        return key_err(c, "model", "path", "'%s' is not a directory", job->model_path);
    char cfg[JOB_PATH_MAX + 16];
    snprintf(cfg, sizeof cfg, "%s/config.json", job->model_path);
    if (!fs_is_file(cfg))
        return key_err(c, "model", "path", "'%s' has no config.json", job->model_path);

    if (!job->data_train[0])
        return key_err(c, "data", "train", "missing (a token shard file or glob)");
    const char *data_keys[2] = {"train", "val"};
    char *data_paths[2] = {job->data_train, job->data_val};
    for (int i = 0; i < 2; i++) {
        if (!data_paths[i][0])
            continue;
        if (job_resolve_path(job, data_paths[i], resolved) != 0)
            return key_err(c, "data", data_keys[i], "%s", sd_errmsg());
        snprintf(data_paths[i], JOB_PATH_MAX, "%s", resolved);
        glob_t g;
        int rc = glob(data_paths[i], 0, NULL, &g);
        size_t n = rc == 0 ? g.gl_pathc : 0;
        if (rc == 0)
            globfree(&g);
        if (n == 0)
            return key_err(c, "data", data_keys[i], "no file matches '%s'", data_paths[i]);
    }

    if (job_resolve_path(job, job->ckpt_dir, resolved) != 0)
        return key_err(c, "checkpoint", "dir", "%s", sd_errmsg());
    snprintf(job->ckpt_dir, sizeof job->ckpt_dir, "%s", resolved);
    if (job_resolve_path(job, job->log_dir, resolved) != 0)
        return key_err(c, "log", "dir", "%s", sd_errmsg());
    snprintf(job->log_dir, sizeof job->log_dir, "%s", resolved);
    if (!job->ckpt_dir[0])
        return key_err(c, "checkpoint", "dir", "must not be empty");
    if (!job->log_dir[0])
        return key_err(c, "log", "dir", "must not be empty");

    if (job->topology[0]) {
        if (job_resolve_path(job, job->topology, resolved) != 0)
            return key_err(c, "runtime", "topology", "%s", sd_errmsg());
        snprintf(job->topology, sizeof job->topology, "%s", resolved);
        if (!fs_is_file(job->topology))
            return key_err(c, "runtime", "topology", "'%s' is not a file", job->topology);
        struct topology topo;
        if (topology_load(job->topology, &topo) != 0)
            return key_err(c, "runtime", "topology", "%s", sd_errmsg());
    }

    if (job->warmup > job->steps)
        return key_err(c, "train", "warmup", "%d is more than train.steps = %d", job->warmup, job->steps);
    if (!(job->lr > 0))
        return key_err(c, "train", "lr", "must be > 0");
    if ((int64_t)job->micro_batch * job->seq_len > (int64_t)1 << 28)
        return key_err(c, "train", "micro_batch", "micro_batch x seq_len = %lld tokens is too many",
                       (long long)job->micro_batch * job->seq_len);
    /* A pass holds at most two chunks at once (the tied embedding and the current one); one more
     * buffer lets the next chunk stream in while the current one computes. */
    if (job->chunk_buffers > 0 && job->chunk_buffers < 3)
        return key_err(c, "runtime", "chunk_buffers", "%d is too few: at least 3 are needed", job->chunk_buffers);
    if (job->update_mode == UPDATE_DURING_BACKWARD && job->grad_clip > 0)
        return key_err(c, "runtime", "update_mode",
                       "during_backward needs train.grad_clip = 0 (clipping needs the global norm before any update)");
    if (job->update_mode == UPDATE_DURING_BACKWARD && job->weights_source == WEIGHTS_MASTER)
        return key_err(c, "runtime", "weights_source",
                       "master needs update_mode = after_backward (the master is updated in place, so no previous "
                       "version is left for a worker redoing a step after a crash)");
    if (job->grad_route == GRADS_GPU && job->accumulate_on_device == 1)
        return key_err(c, "runtime", "accumulate_on_device",
                       "true cannot go with grad_route = gpu (its shard accumulators sum the micro-steps on the GPUs)");
    if (job->act_policy == ACT_OFFLOAD && job->device == DEVICE_CPU)
        job->act_policy = ACT_RECOMPUTE; /* on the CPU backend host memory is device memory */
    return 0;
}

int job_config_load(const char *ini_path, int num_overrides, char **overrides, struct job_config *job)
{
    job_config_defaults(job);
    char abs_path[PATH_MAX];
    if (!realpath(ini_path, abs_path))
        return sd_err("%s: cannot open job file: %s", ini_path, strerror(errno));
    if (strlen(abs_path) >= JOB_PATH_MAX)
        return sd_err("%s: path too long", ini_path);
    if (is_dir(abs_path))
        return sd_err("%s: is a directory; give the job file itself (an .ini file, e.g. examples/tiny.ini)", ini_path);
    snprintf(job->ini_path, sizeof job->ini_path, "%s", abs_path);

    struct parse_ctx c;
    memset(&c, 0, sizeof c);
    c.job = job;
    c.where = job->ini_path;
    FILE *f = fopen(abs_path, "r");
    if (!f)
        return sd_err("%s: cannot open job file: %s", ini_path, strerror(errno));
    int rc = ini_lines_parse(f, &c.lines, ini_handler_cb, &c);
    fclose(f);
    if (c.failed)
        return -1;
    if (rc > 0)
        return sd_err("%s:%d: malformed line (expected [section], key = value, or a ; comment)", job->ini_path, rc);
    if (rc < 0)
        return sd_err("%s: cannot read job file", job->ini_path);

    c.line = 0;
    c.command_line = true;
    for (int i = 0; i < num_overrides; i++) {
        char buf[JOB_PATH_MAX + 128];
        snprintf(buf, sizeof buf, "%s", overrides[i]);
        char *eq = strchr(buf, '=');
        char *dot = strchr(buf, '.');
        if (!eq || !dot || dot > eq)
            return sd_err("override '%s': expected section.key=value", overrides[i]);
        *eq = 0;
        *dot = 0;
        c.where = "override";
        if (!apply(&c, buf, dot + 1, eq + 1))
            return -1;
    }
    return validate(&c);
}

double job_lr_at(const struct job_config *job, int step)
{
    if (step <= job->warmup && job->warmup > 0)
        return job->lr * step / job->warmup;
    if (job->steps == job->warmup)
        return job->lr;
    double p = (double)(step - job->warmup) / (double)(job->steps - job->warmup);
    double lo = job->lr * job->min_lr_ratio;
    switch (job->schedule) {
    case SCHED_CONSTANT:
        return job->lr;
    case SCHED_LINEAR:
        return job->lr - (job->lr - lo) * p;
    case SCHED_COSINE:
    default:
        return lo + 0.5 * (job->lr - lo) * (1.0 + cos(M_PI * p));
    }
}

int job_resolve_attention(struct job_config *job, struct data_set *train)
{
    if (job->attention == ATTENTION_DOCUMENT && !train->has_flags)
        return sd_err("[data] attention = document: %s marks no document starts (llm.c shards); use attention = "
                      "window, or SFT shards (slidedp-data)",
                      job->data_train);
    job->attention = job_document_attention(job, train->has_flags) ? ATTENTION_DOCUMENT : ATTENTION_WINDOW;
    /* a sample of the data prices attention as well as all of it would */
    job->attention_pairs = job->attention == ATTENTION_DOCUMENT ? data_attention_pairs(train, 4096) : 0;
    return 0;
}

/* The inverse of set_value: the value as job.ini would spell it (a double in as few digits as read back exactly). */
static void format_value(const struct job_config *job, const struct key_spec *k, char *out, size_t len)
{
    const char *base = (const char *)job;
    switch (k->type) {
    case K_PATH:
        snprintf(out, len, "%s", base + k->offset);
        return;
    case K_INT:
        snprintf(out, len, "%d", *(const int *)(base + k->offset));
        return;
    case K_U64:
        snprintf(out, len, "%llu", (unsigned long long)*(const uint64_t *)(base + k->offset));
        return;
    case K_DOUBLE: {
        double x = *(const double *)(base + k->offset);
        for (int digits = 6; digits <= 17; digits++) /* the shortest that reads back exactly */
            if (snprintf(out, len, "%.*g", digits, x) > 0 && strtod(out, NULL) == x)
                return;
        return;
    }
    case K_BOOL:
        snprintf(out, len, "%s", *(const bool *)(base + k->offset) ? "true" : "false");
        return;
    case K_BYTES_AUTO:
        snprintf(out, len, "%lld", (long long)*(const int64_t *)(base + k->offset));
        return;
    case K_ENUM: {
        int idx = k->offset == OFF(init_random) || k->offset == OFF(resume_auto)
                      ? *(const bool *)(base + k->offset)
                      : *(const int *)(base + k->offset) - k->enum_base;
        const char *p = k->choices;
        for (int i = 0; i < idx && strchr(p, '|'); i++)
            p = strchr(p, '|') + 1;
        const char *bar = strchr(p, '|');
        snprintf(out, len, "%.*s", bar ? (int)(bar - p) : (int)strlen(p), p);
        return;
    }
    }
}

const char *job_config_key(int i, char *out, size_t len)
{
    if (i < 0 || i >= NUM_KEYS)
        return NULL;
    snprintf(out, len, "%s.%s", key_specs[i].section, key_specs[i].key);
    return out;
}

int job_config_value(const struct job_config *job, const char *name, char *out, size_t len)
{
    const char *dot = strchr(name, '.');
    for (int i = 0; dot && i < NUM_KEYS; i++)
        if (strlen(key_specs[i].section) == (size_t)(dot - name) &&
            !strncmp(key_specs[i].section, name, (size_t)(dot - name)) && !strcmp(key_specs[i].key, dot + 1)) {
            format_value(job, &key_specs[i], out, len);
            return 0;
        }
    return sd_err("job_config_value: no key %s", name);
}
