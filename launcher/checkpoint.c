/* Disk checkpoints <checkpoint.dir>/step-S/: the HF export of the weights, optimizer.safetensors
 * (fp32 master weights, Adam m and v under "master.", "exp_avg.", "exp_avg_sq." + HF name) and
 * trainer_state.json (step, seed, data position). Written to a temporary directory and renamed into
 * place; the newest `keep` are kept. Resuming loads them back bit for bit. */
#include "launch.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fsutil.h"
#include "common/hf.h"
#include "common/safetensors.h"

static const char *const state_prefix[3] = {"master.", "exp_avg.", "exp_avg_sq."};

struct emit_f32 {
    const float *data;
};

static int emit_f32(void *arg, FILE *f, size_t nbytes)
{
    const struct emit_f32 *e = arg;
    return fwrite(e->data, 1, nbytes, f) == nbytes ? 0 : sd_err("write failed: %s", strerror(errno));
}

static int write_optimizer_state(const struct job_state *st, const char *path)
{
    const struct layout *lay = &st->lay;
    int n = lay->num_tensors * 3;
    struct st_out_tensor *outs = calloc((size_t)n, sizeof *outs);
    struct emit_f32 *args = calloc((size_t)n, sizeof *args);
    char (*names)[ST_NAME_MAX] = calloc((size_t)n, ST_NAME_MAX);
    if (!outs || !args || !names) {
        free(outs), free(args), free(names);
        return sd_err("out of memory");
    }
    const float *arrays[3] = {st->shm.master, st->shm.exp_avg, st->shm.exp_avg_sq};
    for (int k = 0; k < 3; k++)
        for (int t = 0; t < lay->num_tensors; t++) {
            int i = k * lay->num_tensors + t;
            const struct tensor_desc *td = &lay->tensors[t];
            snprintf(names[i], ST_NAME_MAX, "%s%s", state_prefix[k], td->name);
            args[i].data = arrays[k] + td->offset;
            outs[i] = (struct st_out_tensor){.name = names[i], .dtype = ST_F32, .ndim = td->ndim, .emit = emit_f32,
                                             .arg = &args[i]};
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
    uint32_t steps[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        unsigned s;
        char tail;
        if (sscanf(e->d_name, "step-%u%c", &s, &tail) == 1)
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
                       "  \"num_params\": %lld\n}\n",
                       step, step, (unsigned long long)st->job.seed, (long long)st->lay.num_params);
    snprintf(path, sizeof path, "%s/trainer_state.json", tmp);
    if (fs_write_atomic(path, json, (size_t)len) != 0 || fs_fsync_dir(tmp) != 0)
        goto fail;
    if (fs_publish_dir(tmp, dir) != 0)
        goto fail;
    prune(st);
    return 0;
fail:
    fs_rm_rf(tmp);
    return sd_err_prefix("checkpoint %s", dir);
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
    float *arrays[3] = {st->shm.master, st->shm.exp_avg, st->shm.exp_avg_sq};
    int rc = 0;
    for (int k = 0; k < 3 && rc == 0; k++)
        for (int t = 0; t < st->lay.num_tensors && rc == 0; t++) {
            const struct tensor_desc *td = &st->lay.tensors[t];
            char name[ST_NAME_MAX];
            snprintf(name, sizeof name, "%s%s", state_prefix[k], td->name);
            const struct st_tensor *x = st_find(&f, name);
            if (!x || x->dtype != ST_F32 || x->numel != td->numel)
                rc = sd_err("%s: tensor %s is missing or has the wrong dtype or size", path, name);
            else
                memcpy(arrays[k] + td->offset, x->data, (size_t)td->numel * sizeof(float));
        }
    st_close(&f);
    return rc;
}
