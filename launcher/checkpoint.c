/* Disk checkpoints <checkpoint.dir>/step-S/: the HF export of the weights, optimizer.safetensors
 * (fp32 master weights, Adam m and v under "master.", "exp_avg.", "exp_avg_sq." + HF name; m and v
 * in the job's optimizer_state dtype; with 8-bit state the codes of m and of sqrt(v) as U8, and
 * their block scales under "exp_avg_scale.", "exp_avg_sq_scale.") and trainer_state.json (step, seed, data position,
 * optimizer_state). Written to a temporary directory and renamed into place; the newest `keep` are
 * kept. Resuming loads them back bit for bit, and only under the same optimizer_state. */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/hf.h"
#include "common/safetensors.h"

#define STATE_ARRAYS 5
static const char *const state_prefix[STATE_ARRAYS] = {"master.", "exp_avg.", "exp_avg_sq.", "exp_avg_scale.",
                                                        "exp_avg_sq_scale."};

/* The number of state arrays of the job's optimizer_state: master, m, v, and with 8-bit state the
 * scales of m and of v. */
static int state_arrays(const struct job_config *job)
{
    return job->optimizer_state == OPTIM_STATE_8BIT ? 5 : 3;
}

/* The dtype of state array k under the job's optimizer_state. */
static enum st_dtype state_dtype(const struct job_config *job, int k)
{
    enum st_dtype m_v[OPTIM_STATE_COUNT] = {ST_F32, ST_BF16, ST_U8};
    return k == 0 ? ST_F32 : k > 2 ? ST_U8 : m_v[job->optimizer_state];
}

/* Elements of array k for tensor td: its scales are one per STATE8_BLOCK. */
static int64_t state_numel(int k, const struct tensor_desc *td)
{
    return k > 2 ? (td->numel + STATE8_BLOCK - 1) / STATE8_BLOCK : td->numel;
}

/* Where array k of tensor td is in the job's shared memory (tensors start at a scale block). */
static char *state_at(const struct job_state *st, int k, const struct tensor_desc *td)
{
    const struct job_shm *s = &st->shm;
    enum optimizer_state mode = st->job.optimizer_state;
    void *m_of[OPTIM_STATE_COUNT] = {s->exp_avg, s->exp_avg16, s->exp_avg8};
    void *v_of[OPTIM_STATE_COUNT] = {s->exp_avg_sq, s->exp_avg_sq16, s->exp_avg_sq8};
    void *base[STATE_ARRAYS] = {s->master, m_of[mode], v_of[mode], s->exp_avg_scale, s->exp_avg_sq_scale};
    int64_t first = k > 2 ? td->offset / STATE8_BLOCK : td->offset;
    return (char *)base[k] + (size_t)first * st_dtype_size(state_dtype(&st->job, k));
}

struct emit_raw {
    const void *data;
};

static int emit_raw(void *arg, FILE *f, size_t nbytes)
{
    const struct emit_raw *e = arg;
    return fwrite(e->data, 1, nbytes, f) == nbytes ? 0 : sd_err("write failed: %s", strerror(errno));
}

static int write_optimizer_state(const struct job_state *st, const char *path)
{
    const struct layout *lay = &st->lay;
    int n = lay->num_tensors * state_arrays(&st->job);
    struct st_out_tensor *outs = calloc((size_t)n, sizeof *outs);
    struct emit_raw *args = calloc((size_t)n, sizeof *args);
    char (*names)[ST_NAME_MAX] = calloc((size_t)n, ST_NAME_MAX);
    if (!outs || !args || !names) {
        free(outs), free(args), free(names);
        return sd_err("out of memory");
    }
    for (int k = 0; k < state_arrays(&st->job); k++)
        for (int t = 0; t < lay->num_tensors; t++) {
            int i = k * lay->num_tensors + t;
            const struct tensor_desc *td = &lay->tensors[t];
            snprintf(names[i], ST_NAME_MAX, "%s%s", state_prefix[k], td->name);
            args[i].data = state_at(st, k, td);
            bool scales = k > 2; /* one dimension: a scale per block of the flattened tensor */
            outs[i] = (struct st_out_tensor){.name = names[i], .dtype = state_dtype(&st->job, k),
                                             .ndim = scales ? 1 : td->ndim, .emit = emit_raw, .arg = &args[i]};
            outs[i].shape[0] = scales ? state_numel(k, td) : td->shape[0];
            outs[i].shape[1] = td->shape[1];
        }
    int rc = st_write(path, n, outs);
    free(outs), free(args), free(names);
    return rc;
}

/* The keys that make a run: resuming under another value of one would continue another run's
 * trajectory. train.steps is not one (raising it trains longer); of gpus and grad_accum only their
 * product counts (gpus=G with A micro-steps trains bit-identically to one rank with G*A, §9.5). */
static const char *const identity_keys[] = {
    "model.path", "model.init", "data.train", "data.seq_len", "data.shuffle", "train.micro_batch",
    "train.lr", "train.warmup", "train.schedule", "train.min_lr_ratio", "train.weight_decay", "train.beta1",
    "train.beta2", "train.eps", "train.grad_clip", "train.seed", "train.optimizer_state", "runtime.grad_dtype"};
#define MICRO_BATCHES_KEY "runtime.gpus x train.grad_accum"

/* The run's configuration as {"section.key": "value"}, job.ini's spelling; NULL when out of memory. */
static cJSON *run_identity(const struct job_config *job)
{
    cJSON *o = cJSON_CreateObject();
    char value[JOB_PATH_MAX];
    for (size_t i = 0; o && i < sizeof identity_keys / sizeof identity_keys[0]; i++) {
        SD_ASSERT(job_config_value(job, identity_keys[i], value, sizeof value) == 0);
        cJSON_AddStringToObject(o, identity_keys[i], value);
    }
    /* job->gpus counts every host's ranks (state_create) */
    snprintf(value, sizeof value, "%d", job->gpus * job->grad_accum);
    if (o)
        cJSON_AddStringToObject(o, MICRO_BATCHES_KEY, value);
    return o;
}

/* The identity as a JSON object, one key a line, indented as trainer_state.json; malloc'd. */
static char *identity_lines(const cJSON *identity)
{
    size_t cap = 16, used = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, identity)
        cap += strlen(item->string) + strlen(item->valuestring) * 6 + 16; /* \u00XX escapes at most */
    char *out = malloc(cap);
    if (!out)
        return NULL;
    used += (size_t)snprintf(out, cap, "{");
    cJSON_ArrayForEach(item, identity)
    {
        char *value = cJSON_PrintUnformatted(item); /* escaped; the keys are identity_keys' plain names */
        if (!value) {
            free(out);
            return NULL;
        }
        used += (size_t)snprintf(out + used, cap - used, "%s\n    \"%s\": %s", item == identity->child ? "" : ",",
                                 item->string, value);
        free(value);
    }
    snprintf(out + used, cap - used, "\n  }");
    return out;
}

static uint64_t identity_hash(const cJSON *identity)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a 64 over "key=value\n" lines */
    const cJSON *item;
    cJSON_ArrayForEach(item, identity)
    {
        for (const char *p = item->string; *p; p++)
            h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
        h = (h ^ '=') * 0x100000001b3ull;
        for (const char *p = cJSON_GetStringValue(item); p && *p; p++)
            h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
        h = (h ^ '\n') * 0x100000001b3ull;
    }
    return h;
}

static void step_dir(const struct job_state *st, uint32_t step, char *out, size_t len)
{
    snprintf(out, len, "%s/step-%u", st->job.ckpt_dir, step);
}

/* Removes all but the newest `keep` step-* directories. */
static void prune(const struct job_state *st)
{
    DIR *d = opendir(st->job.ckpt_dir);
    if (!d)
        return;
    uint32_t *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned s;
        char tail;
        if (sscanf(e->d_name, "step-%u%c", &s, &tail) != 1)
            continue;
        if (n == cap) {
            uint32_t *more = realloc(steps, sizeof *steps * (size_t)(cap = cap ? 2 * cap : 64));
            if (!more)
                break; /* out of memory: prune what was listed */
            steps = more;
        }
        steps[n++] = s;
    }
    closedir(d);
    for (int i = 0; i < n; i++) {
        int newer = 0;
        for (int j = 0; j < n; j++)
            newer += steps[j] > steps[i];
        if (newer >= st->job.ckpt_keep) {
            char dir[JOB_PATH_MAX + 32];
            step_dir(st, steps[i], dir, sizeof dir);
            fs_rm_rf(dir);
        }
    }
    free(steps);
}

double export_weight_bytes(const struct job_state *st)
{
    return (double)st->lay.num_params * (st->job.export_dtype == EXPORT_FP32 ? 4 : 2);
}

double checkpoint_bytes(const struct job_state *st)
{
    enum optimizer_state mode = st->job.optimizer_state;
    double scales = mode == OPTIM_STATE_8BIT ? 2.0 / STATE8_BLOCK : 0; /* a byte of m's and of v's a block */
    return export_weight_bytes(st) +
           (double)st->lay.num_params * (4 + 2 * (double)ctl_state_size(mode) + scales);
}

int checkpoint_write(const struct job_state *st, uint32_t step)
{
    char dir[JOB_PATH_MAX + 32], tmp[JOB_PATH_MAX + 64], path[JOB_PATH_MAX + 96];
    step_dir(st, step, dir, sizeof dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    if (fs_mkdir_p(st->job.ckpt_dir, 0755) != 0 || fs_rm_rf(tmp) != 0)
        return -1;
    enum hf_export_dtype dt = st->job.export_dtype == EXPORT_FP32 ? HF_EXPORT_FP32 : HF_EXPORT_BF16;
    if (hf_export(tmp, st->config_json, &st->cfg, &st->lay, st->shm.master, dt, (size_t)5 << 30) != 0 ||
        hf_copy_tokenizer_files(st->job.model_path, tmp) != 0)
        goto fail;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if (write_optimizer_state(st, path) != 0)
        goto fail;
    cJSON *identity = run_identity(&st->job);
    char *config = identity ? identity_lines(identity) : NULL;
    size_t cap = 1024 + (config ? strlen(config) : 0);
    char *json = config ? malloc(cap) : NULL;
    if (!json) {
        cJSON_Delete(identity);
        free(config);
        sd_err("out of memory");
        goto fail;
    }
    int len = snprintf(json, cap,
                       "{\n  \"format\": 1,\n  \"step\": %u,\n  \"data_position\": %u,\n  \"train_steps\": %d,\n"
                       "  \"seed\": %llu,\n"
                       "  \"num_params\": %lld,\n  \"optimizer_state\": \"%s\",\n  \"run_id\": \"%s\",\n"
                       "  \"config_hash\": \"%016llx\",\n  \"config\": %s\n}\n",
                       step, step, st->job.steps, (unsigned long long)st->job.seed, (long long)st->lay.num_params,
                       optimizer_state_name(st->job.optimizer_state), st->run_id,
                       (unsigned long long)identity_hash(identity), config);
    cJSON_Delete(identity);
    free(config);
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    int written = fs_write_atomic(path, json, (size_t)len);
    free(json);
    if (written != 0 || fs_fsync_dir(tmp) != 0)
        goto fail;
    fault_point("ckpt_tmp_written");
    if (fs_publish_dir(tmp, dir) != 0)
        goto fail;
    fault_point("ckpt_renamed");
    prune(st);
    return 0;
fail:
    fs_rm_rf(tmp);
    return sd_err_prefix("checkpoint %s", dir);
}

/* trainer_state.json of a checkpoint, parsed; NULL when it cannot be read. */
static cJSON *read_trainer_state(const char *path)
{
    enum { MAX_BYTES = 1 << 16 }; /* a few lines and the run's keys, paths included (checkpoint_write) */
    FILE *f = fopen(path, "r");
    char *text = f ? malloc(MAX_BYTES) : NULL;
    if (!text) {
        if (f)
            fclose(f);
        return NULL;
    }
    size_t len = fread(text, 1, MAX_BYTES, f);
    fclose(f);
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    return root;
}

/* The optimizer_state step-S/ was written with ("fp32" when trainer_state.json predates the key),
 * or NULL when the file cannot be read. */
static const char *checkpoint_mode(const char *path, char *out, size_t out_len)
{
    cJSON *root = read_trainer_state(path);
    if (!root)
        return NULL;
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(root, "optimizer_state");
    snprintf(out, out_len, "%s", cJSON_IsString(mode) ? mode->valuestring : "fp32");
    cJSON_Delete(root);
    return out;
}

int checkpoint_latest(const struct job_config *job, uint32_t *step)
{
    *step = 0;
    DIR *d = opendir(job->ckpt_dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned s;
        char tail, path[JOB_PATH_MAX + 300];
        if (sscanf(e->d_name, "step-%u%c", &s, &tail) != 1)
            continue;
        snprintf(path, sizeof path, "%s/%s/trainer_state.json", job->ckpt_dir, e->d_name);
        if (fs_exists(path) && s > *step)
            *step = s;
    }
    closedir(d);
    if (*step == 0)
        return 0;
    char path[JOB_PATH_MAX + 300], mode[16];
    snprintf(path, sizeof path, "%s/step-%u/trainer_state.json", job->ckpt_dir, *step);
    if (!checkpoint_mode(path, mode, sizeof mode))
        return sd_err("%s cannot be read as JSON", path);
    const char *want = optimizer_state_name(job->optimizer_state);
    if (strcmp(mode, want) != 0)
        return sd_err("%s: written with [train] optimizer_state = %s, this job has %s; resuming under another "
                      "mode is refused (set [checkpoint] resume = never to start over)",
                      path, mode, want);
    return 0;
}

/* The state tensor k ("master.", "exp_avg.", "exp_avg_sq.") of tensor td in f, or NULL with the
 * reason when it is missing or has another dtype or size. */
static const struct st_tensor *state_tensor(const struct st_file *f, const struct job_config *job, int k,
                                            const struct tensor_desc *td, const char *path)
{
    char name[ST_NAME_MAX];
    snprintf(name, sizeof name, "%s%s", state_prefix[k], td->name);
    const struct st_tensor *x = st_find(f, name);
    enum st_dtype want = state_dtype(job, k);
    if (!x || x->dtype != want || x->numel != state_numel(k, td)) {
        sd_err("%s: tensor %s %s", path, name,
               !x ? "is missing" : x->dtype != want ? "has another dtype" : "has another number of elements");
        return NULL;
    }
    return x;
}

int checkpoint_check(const struct job_state *st, uint32_t step)
{
    const struct job_config *job = &st->job;
    if (step > (uint32_t)job->steps)
        return sd_err("[checkpoint] dir %s holds step-%u, past train.steps = %d: raise train.steps to train on from "
                      "it, or start over with checkpoint.resume = never (or another checkpoint.dir)",
                      job->ckpt_dir, step, job->steps);
    char dir[JOB_PATH_MAX + 32], path[JOB_PATH_MAX + 96];
    step_dir(st, step, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    struct st_file f;
    int rc = st_open(path, &f);
    if (rc == 0) {
        for (int k = 0; k < state_arrays(job) && rc == 0; k++)
            for (int t = 0; t < st->lay.num_tensors && rc == 0; t++)
                rc = state_tensor(&f, job, k, &st->lay.tensors[t], path) ? 0 : -1;
        st_close(&f);
    }
    if (rc != 0) {
        char why[1024];
        snprintf(why, sizeof why, "%s", sd_errmsg());
        return sd_err("cannot resume from %s (%s): it is a checkpoint of another model or configuration; start over "
                      "with checkpoint.resume = never, or use another checkpoint.dir",
                      dir, why);
    }
    return 0;
}

void checkpoint_remove_partial(const struct job_config *job)
{
    DIR *d = opendir(job->ckpt_dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char path[JOB_PATH_MAX + 300];
        if (!strstr(e->d_name, ".tmp-"))
            continue;
        snprintf(path, sizeof path, "%s/%s", job->ckpt_dir, e->d_name);
        fs_rm_rf(path);
    }
    closedir(d);
}

int checkpoint_load(struct job_state *st, uint32_t step)
{
    char dir[JOB_PATH_MAX + 32], path[JOB_PATH_MAX + 96];
    step_dir(st, step, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    struct st_file f;
    if (st_open(path, &f) != 0)
        return -1;
    int rc = 0;
    for (int k = 0; k < state_arrays(&st->job) && rc == 0; k++)
        for (int t = 0; t < st->lay.num_tensors && rc == 0; t++) {
            const struct tensor_desc *td = &st->lay.tensors[t];
            const struct st_tensor *x = state_tensor(&f, &st->job, k, td, path);
            if (!x)
                rc = -1;
            else
                memcpy(state_at(st, k, td), x->data,
                       (size_t)state_numel(k, td) * st_dtype_size(state_dtype(&st->job, k)));
        }
    st_close(&f);
    return rc;
}

int checkpoint_identity(struct job_state *st, uint32_t step)
{
    char dir[JOB_PATH_MAX + 32], path[JOB_PATH_MAX + 64];
    step_dir(st, step, dir, sizeof dir);
    snprintf(path, sizeof path, "%s/trainer_state.json", dir);
    cJSON *root = read_trainer_state(path);
    if (!root)
        return sd_err("%s cannot be read as JSON", path);
    const cJSON *run_id = cJSON_GetObjectItemCaseSensitive(root, "run_id");
    if (cJSON_IsString(run_id))
        snprintf(st->run_id, sizeof st->run_id, "%s", run_id->valuestring);
    const cJSON *train_steps = cJSON_GetObjectItemCaseSensitive(root, "train_steps"); /* absent before stop 47 */
    st->resumed_train_steps = cJSON_IsNumber(train_steps) ? train_steps->valueint : 0;
    const cJSON *theirs = cJSON_GetObjectItemCaseSensitive(root, "config"); /* absent before run identities */
    cJSON *ours = run_identity(&st->job);
    char differ[2048] = "";
    size_t used = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, ours)
    {
        const char *there = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(theirs, item->string));
        if (!theirs || (there && !strcmp(there, item->valuestring)))
            continue;
        used += (size_t)snprintf(differ + used, used < sizeof differ ? sizeof differ - used : 0,
                                 "%s%s = %s there, %s here", used ? "; " : "", item->string,
                                 there ? there : "(not recorded)", item->valuestring);
    }
    cJSON_Delete(ours);
    cJSON_Delete(root);
    if (used > 0)
        return sd_err("%s belongs to another run (run %s): %s. Resume it with the values it was started with, or "
                      "start a new run with checkpoint.resume = never (the older run's checkpoints and final/ are "
                      "then moved to %s/run-%s/)",
                      dir, st->run_id[0] ? st->run_id : "unknown", differ, st->job.ckpt_dir,
                      st->run_id[0] ? st->run_id : "<date>");
    return 0;
}

int checkpoint_set_aside(const struct job_config *job)
{
    DIR *d = opendir(job->ckpt_dir);
    if (!d)
        return 0;
    char (*names)[256] = NULL;
    int n = 0, cap = 0;
    unsigned newest = 0;
    int steps = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        unsigned s;
        char tail;
        bool step = sscanf(e->d_name, "step-%u%c", &s, &tail) == 1;
        if (!step && strcmp(e->d_name, "final") != 0)
            continue;
        if (n == cap) {
            char (*more)[256] = realloc(names, sizeof *names * (size_t)(cap = cap ? 2 * cap : 16));
            if (!more) {
                closedir(d);
                free(names);
                return sd_err("out of memory");
            }
            names = more;
        }
        snprintf(names[n++], sizeof *names, "%s", e->d_name);
        newest = step && s > newest ? s : newest;
        steps += step;
    }
    closedir(d);
    if (n == 0)
        return 0;
    /* named by the older run's id where its newest checkpoint records one, else by the time */
    char id[64] = "", path[JOB_PATH_MAX + 300], aside[JOB_PATH_MAX + 96];
    snprintf(path, sizeof path, "%s/step-%u/trainer_state.json", job->ckpt_dir, newest);
    cJSON *root = newest ? read_trainer_state(path) : NULL;
    const char *recorded = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "run_id"));
    if (recorded && !strchr(recorded, '/') && strlen(recorded) < 32)
        snprintf(id, sizeof id, "%s", recorded);
    cJSON_Delete(root);
    if (!id[0]) {
        time_t now = time(NULL);
        strftime(id, sizeof id, "%Y%m%d-%H%M%S", gmtime(&now));
    }
    snprintf(aside, sizeof aside, "%s/run-%s", job->ckpt_dir, id);
    for (int k = 2; fs_exists(aside); k++)
        snprintf(aside, sizeof aside, "%s/run-%s-%d", job->ckpt_dir, id, k);
    int rc = fs_mkdir_p(aside, 0755);
    for (int i = 0; i < n && rc == 0; i++) {
        char from[JOB_PATH_MAX + 300], to[JOB_PATH_MAX + 400];
        snprintf(from, sizeof from, "%s/%s", job->ckpt_dir, names[i]);
        snprintf(to, sizeof to, "%s/%s", aside, names[i]);
        if (rename(from, to) != 0)
            rc = sd_err("cannot move %s to %s: %s", from, to, strerror(errno));
    }
    if (rc == 0) {
        fs_fsync_dir(job->ckpt_dir);
        printf("slidedp: checkpoint.resume = never: the older run's %d checkpoint(s)%s moved from %s to %s (never "
               "resumed, pruned or reported as this run's; remove it when no longer needed)\n",
               steps, n > steps ? " and final/" : "", job->ckpt_dir, aside);
    }
    free(names);
    return rc;
}
