/* Disk checkpoints <checkpoint.dir>/step-S/: the HF export of the weights, optimizer.safetensors
 * (fp32 master weights, Adam m and v under "master.", "exp_avg.", "exp_avg_sq." + HF name; m and v
 * in the job's optimizer_state dtype) and trainer_state.json (step, seed, data position,
 * optimizer_state). Written to a temporary directory and renamed into place; the newest `keep` are
 * kept. Resuming loads them back bit for bit, and only under the same optimizer_state. */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "common/err.h"
#include "common/fault.h"
#include "common/fsutil.h"
#include "common/hf.h"
#include "common/safetensors.h"

static const char *const state_prefix[3] = {"master.", "exp_avg.", "exp_avg_sq."};

/* The three arrays of the optimizer state in the job's shared memory, with their dtype. */
struct state_arrays {
    void *data[3];
    enum st_dtype dtype[3];
    size_t elem_size[3];
};

/* The dtype of state array k (master, m, v) under the job's optimizer_state. */
static enum st_dtype state_dtype(const struct job_config *job, int k)
{
    return k > 0 && job->optimizer_state == OPTIM_STATE_BF16 ? ST_BF16 : ST_F32;
}

static struct state_arrays state_arrays_of(const struct job_state *st)
{
    bool half = st->job.optimizer_state == OPTIM_STATE_BF16;
    struct state_arrays a = {
        .data = {st->shm.master, half ? (void *)st->shm.exp_avg16 : (void *)st->shm.exp_avg,
                 half ? (void *)st->shm.exp_avg_sq16 : (void *)st->shm.exp_avg_sq},
    };
    for (int k = 0; k < 3; k++) {
        a.dtype[k] = state_dtype(&st->job, k);
        a.elem_size[k] = st_dtype_size(a.dtype[k]);
    }
    return a;
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
    int n = lay->num_tensors * 3;
    struct st_out_tensor *outs = calloc((size_t)n, sizeof *outs);
    struct emit_raw *args = calloc((size_t)n, sizeof *args);
    char (*names)[ST_NAME_MAX] = calloc((size_t)n, ST_NAME_MAX);
    if (!outs || !args || !names) {
        free(outs), free(args), free(names);
        return sd_err("out of memory");
    }
    struct state_arrays arrays = state_arrays_of(st);
    for (int k = 0; k < 3; k++)
        for (int t = 0; t < lay->num_tensors; t++) {
            int i = k * lay->num_tensors + t;
            const struct tensor_desc *td = &lay->tensors[t];
            snprintf(names[i], ST_NAME_MAX, "%s%s", state_prefix[k], td->name);
            args[i].data = (const char *)arrays.data[k] + (size_t)td->offset * arrays.elem_size[k];
            outs[i] = (struct st_out_tensor){.name = names[i], .dtype = arrays.dtype[k], .ndim = td->ndim,
                                             .emit = emit_raw, .arg = &args[i]};
            outs[i].shape[0] = td->shape[0];
            outs[i].shape[1] = td->shape[1];
        }
    int rc = st_write(path, n, outs);
    free(outs), free(args), free(names);
    return rc;
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

int checkpoint_write(const struct job_state *st, uint32_t step)
{
    char dir[JOB_PATH_MAX + 32], tmp[JOB_PATH_MAX + 64], path[JOB_PATH_MAX + 96];
    step_dir(st, step, dir, sizeof dir);
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", dir, (int)getpid());
    if (fs_mkdir_p(st->job.ckpt_dir, 0755) != 0 || fs_rm_rf(tmp) != 0)
        return -1;
    enum hf_export_dtype dt = st->job.export_dtype == EXPORT_FP32 ? HF_EXPORT_FP32 : HF_EXPORT_BF16;
    if (hf_export(tmp, st->config_json, &st->cfg, &st->lay, st->shm.master, dt, (size_t)5 << 30) != 0)
        goto fail;
    snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp);
    if (write_optimizer_state(st, path) != 0)
        goto fail;
    char json[512];
    int len = snprintf(json, sizeof json,
                       "{\n  \"format\": 1,\n  \"step\": %u,\n  \"data_position\": %u,\n  \"seed\": %llu,\n"
                       "  \"num_params\": %lld,\n  \"optimizer_state\": \"%s\"\n}\n",
                       step, step, (unsigned long long)st->job.seed, (long long)st->lay.num_params,
                       optimizer_state_name(st->job.optimizer_state));
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    if (fs_write_atomic(path, json, (size_t)len) != 0 || fs_fsync_dir(tmp) != 0)
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

/* The optimizer_state step-S/ was written with ("fp32" when trainer_state.json predates the key),
 * or NULL when the file cannot be read. */
static const char *checkpoint_mode(const char *path, char *out, size_t out_len)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char text[4096]; /* the file is a few lines (checkpoint_write) */
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    cJSON *root = cJSON_Parse(text);
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
    if (!x || x->dtype != want || x->numel != td->numel) {
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
        for (int k = 0; k < 3 && rc == 0; k++)
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
    struct state_arrays arrays = state_arrays_of(st);
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++)
        for (int t = 0; t < st->lay.num_tensors && rc == 0; t++) {
            const struct tensor_desc *td = &st->lay.tensors[t];
            const struct st_tensor *x = state_tensor(&f, &st->job, k, td, path);
            if (!x)
                rc = -1;
            else
                memcpy((char *)arrays.data[k] + (size_t)td->offset * arrays.elem_size[k], x->data,
                       (size_t)td->numel * arrays.elem_size[k]);
        }
    st_close(&f);
    return rc;
}
