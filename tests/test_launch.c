/* The whole process architecture on the CPU backend: slidedp-launch --device cpu --gpus 2 trains
 * the tiny copy task (loss falls, validation accuracy rises), runs its workers and optimizers as
 * separate processes with params16 mapped read-only in the workers, exports a final/ that reloads
 * and reproduces the last validation loss, and leaves nothing in /dev/shm. */
#include "tests/testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/data.h"
#include "common/err.h"
#include "common/hf.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "shm/ctl.h"
#include "shm/futex.h"
#include "worker/resident.h"

static char dir[1024];

static void write_job(const char *extra)
{
    char p[1200], text[4096];
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n"
             "[data]\ntrain = data/train.bin\nval = data/val.bin\nseq_len = 64\nval_every = 40\n"
             "[train]\nmicro_batch = 8\ngrad_accum = 2\nsteps = 120\nlr = 3e-3\nwarmup = 10\nweight_decay = 0.01\n"
             "grad_clip = 1.0\nseed = 1234\n"
             "[checkpoint]\ndir = ckpt\nexport_dtype = bf16\n"
             "[runtime]\ndevice = cpu\ngpus = 2\n"
             "[log]\ndir = log\nevery = 20\n%s",
             tu_src("examples/tiny-qwen3"), extra);
    snprintf(p, sizeof p, "%s/job.ini", dir);
    tu_write_file(p, text);
}

/* Permissions of the mapping of a shm object in a process ("r--s"), or "" when not mapped. */
static void mapping_perms(int pid, const char *object, char perms[8])
{
    char path[64], line[1024];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    perms[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    while (fgets(line, sizeof line, f))
        if (strstr(line, object)) {
            sscanf(line, "%*s %7s", perms);
            break;
        }
    fclose(f);
}

static void proc_comm(int pid, char *out, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    char *text = tu_read_file(path, NULL);
    snprintf(out, len, "%s", text ? text : "");
    free(text);
    char *nl = strchr(out, '\n');
    if (nl)
        *nl = 0;
}

/* While the job runs: every worker and optimizer is its own process with the expected program,
 * workers map the weights they stream read-only (params16, never master; or, streaming the master,
 * master and no params16 exists); optimizers map master read-write. */
static void inspect_running_job(const char *job_name, int gpus, pid_t launcher)
{
    struct job_shm shm;
    uint64_t t0 = clock_ns();
    while (job_shm_attach(&shm, job_name, JOB_MAP_CTL, true) != 0) {
        if (clock_ns() - t0 > 30ull * 1000000000ull)
            fail_msg("job %s never appeared: %s", job_name, sd_errmsg());
        usleep(10000);
    }
    struct ctl_header *h = shm.ctl;
    assert_int_equal(h->gpus, gpus);
    while (atomic_load(&h->workers_ready) < (uint32_t)gpus && clock_ns() - t0 < 30ull * 1000000000ull)
        usleep(10000);
    assert_int_equal(atomic_load(&h->launcher_pid), launcher);
    char params_obj[96], master_obj[96], perms[8], comm[64];
    snprintf(params_obj, sizeof params_obj, "/dev/shm/slidedp.%s.params16", job_name);
    snprintf(master_obj, sizeof master_obj, "/dev/shm/slidedp.%s.master", job_name);
    for (int r = 0; r < gpus; r++) {
        int pid = atomic_load(&ctl_proc(h, PROC_WORKER, r)->pid);
        assert_true(pid > 0 && pid != launcher);
        proc_comm(pid, comm, sizeof comm);
        printf("# worker %d: pid %d comm '%s'\n", r, pid, comm);
        assert_string_equal(comm, "slidedp-worker");
        /* the weights they stream: params16, or the master (then only its weights, and no params16 exists) */
        bool master = plan_streams_master(&h->plan);
        mapping_perms(pid, master ? master_obj : params_obj, perms);
        printf("# worker %d: pid %d, %s mapped %s\n", r, pid, master ? "master" : "params16", perms);
        assert_string_equal(perms, "r--s");
        if (!master) {
            mapping_perms(pid, master_obj, perms);
            assert_string_equal(perms, "");
        }
        assert_int_equal(access(params_obj, F_OK) == 0, !master);
    }
    for (int k = 0; k < h->optim_procs; k++) {
        /* the launcher records the pid at the fork; the optimizer leaves PHASE_IDLE once it has mapped the state */
        struct proc_slot *slot = ctl_proc(h, PROC_OPTIM, k);
        while (atomic_load(&slot->phase) == PHASE_IDLE && clock_ns() - t0 < 30ull * 1000000000ull)
            usleep(10000);
        assert_int_not_equal(atomic_load(&slot->phase), PHASE_IDLE);
        int pid = atomic_load(&slot->pid);
        proc_comm(pid, comm, sizeof comm);
        assert_string_equal(comm, "slidedp-optim");
        mapping_perms(pid, master_obj, perms);
        printf("# optimizer %d: pid %d, master mapped %s\n", k, pid, perms);
        assert_string_equal(perms, "rw-s");
    }
    job_shm_detach(&shm);
}

static void test_tiny_two_workers(void **state)
{
    tu_seed("tiny job", 1234);
    char cmd[4096], *out = NULL;
    assert_int_equal(tu_sh(&out, "%s copy --out %s/data --seq-len 64 --train 4000 --val 128 --seed 1",
                           tu_bin("slidedp-data"), dir),
                     0);
    free(out);
    write_job("");
    snprintf(cmd, sizeof cmd, "%s/job.ini", dir);
    struct job_config job;
    assert_int_equal(job_config_load(cmd, 0, NULL, &job), 0);
    char job_name[32];
    ctl_job_name(job.log_dir, job_name, sizeof job_name);

    int pfd[2];
    assert_int_equal(pipe(pfd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        close(pfd[0]);
        execl(tu_bin("slidedp-launch"), "slidedp-launch", "--device", "cpu", "--gpus", "2", cmd, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    inspect_running_job(job_name, 2, pid);
    char buf[65536];
    size_t len = 0;
    ssize_t n;
    while ((n = read(pfd[0], buf + len, sizeof buf - 1 - len)) > 0)
        len += (size_t)n;
    buf[len] = 0;
    close(pfd[0]);
    int st;
    waitpid(pid, &st, 0);
    printf("%s", buf);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    assert_int_equal(tu_shm_objects(job_name), 0);

    /* metrics.jsonl: one line per step with the contract fields; loss falls, accuracy rises */
    snprintf(cmd, sizeof cmd, "%s/log/metrics.jsonl", dir);
    char *metrics = tu_read_file(cmd, NULL);
    assert_non_null(metrics);
    int steps = 0;
    double first_loss = 0, last_loss = 0, last_val_loss = -1, last_val_acc = -1;
    for (char *line = strtok(metrics, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        const char *keys[] = {"step", "loss", "lr", "grad_norm", "tokens", "step_s", "tok_s"};
        for (int k = 0; k < 7; k++)
            assert_non_null(cJSON_GetObjectItem(o, keys[k]));
        steps++;
        assert_int_equal(cJSON_GetObjectItem(o, "step")->valueint, steps);
        assert_int_equal(cJSON_GetObjectItem(o, "tokens")->valueint, 2 * 2 * 8 * 64);
        double loss = cJSON_GetObjectItem(o, "loss")->valuedouble;
        if (steps == 1)
            first_loss = loss;
        last_loss = loss;
        cJSON *vl = cJSON_GetObjectItem(o, "val_loss");
        if (vl) {
            last_val_loss = vl->valuedouble;
            last_val_acc = cJSON_GetObjectItem(o, "val_acc")->valuedouble;
        }
        cJSON_Delete(o);
    }
    free(metrics);
    printf("# loss %.4f -> %.4f, final val loss %.4f, val accuracy %.4f\n", first_loss, last_loss, last_val_loss,
           last_val_acc);
    assert_int_equal(steps, 120);
    assert_true(first_loss > 3.0);     /* ln(32) = 3.47 at random init */
    assert_true(last_loss < 0.3);
    assert_true(last_val_acc > 0.9);

    /* final/ reloads, and its forward reproduces the last validation loss */
    snprintf(cmd, sizeof cmd, "%s/ckpt/final", dir);
    char cfg_path[4200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", cmd);
    struct model_config cfg;
    assert_int_equal(model_config_load(cfg_path, &cfg), 0);
    struct backend be;
    assert_int_equal(backend_cpu_init(&be), 0);
    struct resident_model rm;
    if (resident_model_load(&rm, &be, &cfg, cmd, 8, 64) != 0)
        fail_msg("%s", sd_errmsg());
    snprintf(cmd, sizeof cmd, "%s/data/val.bin", dir);
    struct data_set val;
    assert_int_equal(data_open(cmd, 64, cfg.vocab_size, false, 0, &val), 0);
    int32_t tokens[512], targets[512], seq[65], correct[512];
    uint8_t mask[512];
    float loss[512];
    double sum = 0;
    int64_t count = 0;
    for (int64_t j0 = 0; j0 < val.num_sequences; j0 += 8) {
        for (int i = 0; i < 8; i++) {
            int64_t j = j0 + i < val.num_sequences ? j0 + i : j0;
            assert_int_equal(data_sequence(&val, j, seq, mask + i * 64), 0);
            memcpy(tokens + i * 64, seq, 64 * 4);
            memcpy(targets + i * 64, seq + 1, 64 * 4);
            if (j0 + i >= val.num_sequences)
                memset(mask + i * 64, 0, 64);
        }
        model_eval(&rm.model, &rm.io, tokens, targets, loss, correct, NULL);
        for (int i = 0; i < 512; i++)
            if (mask[i]) {
                sum += loss[i];
                count++;
            }
    }
    printf("# final/ reloaded: val loss %.6f (job reported %.6f)\n", sum / (double)count, last_val_loss);
    assert_true(fabs(sum / (double)count - last_val_loss) < 1e-4 * (1 + last_val_loss));
    data_close(&val);
    resident_model_free(&rm);
    backend_cpu_free(&be);
}

/* The exported fp32 weights in final_dir, in the parameter order of lay. */
static float *final_weights(const char *final_dir, const struct layout *lay)
{
    struct hf_weights w;
    assert_int_equal(hf_weights_open(final_dir, &w), 0);
    float *params = calloc((size_t)lay->total_numel, sizeof(float));
    assert_int_equal(hf_weights_load(&w, lay, params), 0);
    hf_weights_close(&w);
    return params;
}

/* Trains a 12-layer copy of the tiny model (config.json further edited by the sed expression
 * config_edit), one layer per chunk (14 chunks), for a few steps with the given overrides; returns
 * the exported fp32 weights in parameter order. */
static float *train_deep(const char *tag, const char *config_edit, const char *overrides, struct layout *lay)
{
    char p[1300], *out = NULL;
    snprintf(p, sizeof p, "%s/deep/model", dir);
    tu_rmrf(p);
    assert_int_equal(tu_sh(&out,
                           "mkdir -p %s && sed -e 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 12/' -e '%s' "
                           "%s/config.json > %s/config.json",
                           p, config_edit, tu_src("examples/tiny-qwen3"), p),
                     0);
    free(out);
    snprintf(p, sizeof p, "%s/deep/model/config.json", dir);
    struct model_config cfg;
    assert_int_equal(model_config_load(p, &cfg), 0);
    assert_int_equal(cfg.num_layers, 12);
    assert_int_equal(layout_build(&cfg, 1, lay), 0);
    int rc = tu_sh(&out,
                   "%s --device cpu --gpus 2 %s/job.ini model.path=%s/deep/model train.steps=4 train.warmup=1 "
                   "train.grad_accum=3 train.micro_batch=2 log.dir=%s/deep/%s checkpoint.dir=%s/deep/%s/ckpt "
                   "checkpoint.export_dtype=fp32 data.val= runtime.layers_per_chunk=1 %s 2>&1",
                   tu_bin("slidedp-launch"), dir, dir, dir, tag, dir, tag, overrides);
    if (rc != 0)
        fail_msg("slidedp-launch exited %d:\n%s", rc, out);
    free(out);
    snprintf(p, sizeof p, "%s/deep/%s/ckpt/final", dir, tag);
    return final_weights(p, lay);
}

/* ||got - ref|| / ||ref|| over n weights. */
static double weights_rel_err(const float *got, const float *ref, int64_t n)
{
    double diff = 0, norm = 0;
    for (int64_t j = 0; j < n; j++) {
        diff += ((double)got[j] - ref[j]) * ((double)got[j] - ref[j]);
        norm += (double)ref[j] * ref[j];
    }
    return sqrt(diff / norm);
}

/* Micro-steps summing their gradients on the device (a buffer per chunk), with more chunks than the
 * tiny model has, against summing on the host (two alternating buffers): the same training up to
 * the order of the fp32 sums. Also untied with a vocabulary whose LM head is 10x a layer, so the
 * alternating buffers differ in size and the head, then every other layer, takes the larger. */
static void test_on_device_accumulation_many_chunks(void **state)
{
    const char *edits[] = {"", "s/\"vocab_size\": 32/\"vocab_size\": 8192/; s/\"tie_word_embeddings\": true/"
                               "\"tie_word_embeddings\": false/"};
    for (int i = 0; i < 2; i++) {
        write_job("");
        struct layout lay_host, lay_dev;
        float *host = train_deep(i ? "host-untied" : "host", edits[i], "runtime.accumulate_on_device=false", &lay_host);
        float *dev = train_deep(i ? "dev-untied" : "dev", edits[i], "runtime.accumulate_on_device=true", &lay_dev);
        assert_int_equal(lay_host.num_chunks, 14);
        int64_t head = lay_host.chunks[13].numel, layer = lay_host.chunks[1].numel;
        assert_true(i == 0 || head > 4 * layer);
        double err = weights_rel_err(dev, host, lay_host.total_numel);
        printf("# 12 layers in 14 chunks%s (head chunk %lld elements, layer %lld), gradients summed on the device "
               "vs on the host: final weights rel err %.2e\n",
               i ? ", untied" : "", (long long)head, (long long)layer, err);
        assert_true(err < 1e-5);
        free(host);
        free(dev);
        layout_free(&lay_host);
        layout_free(&lay_dev);
    }
}

/* The cross-entropy 5 rows at a time (the LM head's weight gradient summed over the chunks, the
 * last one short) against all rows at once: the same training up to the order of the fp32 sums. */
static void test_logits_in_chunks(void **state)
{
    write_job("");
    struct layout lay_all, lay_chunked;
    float *all = train_deep("logits-all", "", "", &lay_all);
    float *chunked = train_deep("logits-5", "", "runtime.logits_rows=5", &lay_chunked);
    double err = weights_rel_err(chunked, all, lay_all.total_numel);
    printf("# cross-entropy in 5-row chunks vs all rows at once: final weights rel err %.2e\n", err);
    assert_true(err > 0); /* the override took effect: the sums ran in another order */
    assert_true(err < 1e-5);
    free(all);
    free(chunked);
    layout_free(&lay_all);
    layout_free(&lay_chunked);
}

/* One worker, no clipping: the tiny job's final weights and each step's grad_norm from metrics.jsonl
 * (the metrics' precision) with the update after or during the backward, gradients crossing in
 * grad_dtype (fp32 or bf16). */
static float *train_unclipped(const char *mode, const char *grad_dtype, double *norms, int steps, struct layout *lay)
{
    char p[1300], tag[64], *out = NULL;
    snprintf(tag, sizeof tag, "%s-%s", mode, grad_dtype);
    int rc = tu_sh(&out,
                   "%s %s/job.ini runtime.gpus=1 train.grad_accum=1 train.grad_clip=0 train.steps=%d train.warmup=2 "
                   "runtime.update_mode=%s runtime.grad_dtype=%s data.val= log.every=1 log.dir=%s/unclipped/%s "
                   "checkpoint.dir=%s/unclipped/%s/ckpt checkpoint.export_dtype=fp32 2>&1",
                   tu_bin("slidedp-launch"), dir, steps, mode, grad_dtype, dir, tag, dir, tag);
    if (rc != 0)
        fail_msg("slidedp-launch exited %d:\n%s", rc, out);
    free(out);
    snprintf(p, sizeof p, "%s/unclipped/%s/metrics.jsonl", dir, tag);
    assert_int_equal(tu_metrics_values(p, "grad_norm", norms, steps), steps);
    struct model_config cfg;
    char cp[1400];
    snprintf(cp, sizeof cp, "%s/config.json", tu_src("examples/tiny-qwen3"));
    assert_int_equal(model_config_load(cp, &cfg), 0);
    assert_int_equal(layout_build(&cfg, 1, lay), 0);
    snprintf(p, sizeof p, "%s/unclipped/%s/ckpt/final", dir, tag);
    return final_weights(p, lay);
}

/* Updating during the backward with gradients straight in the accumulator, the optimizer squares
 * each block for the reported norm as it updates it: the same weights (bit for bit) and norms as
 * updating after the backward, where the reduction squares them. */
static void test_norm_squared_in_update(void **state)
{
    write_job("");
    enum { STEPS = 8 };
    double after[STEPS], during[STEPS];
    struct layout lay_a, lay_d;
    float *wa = train_unclipped("after_backward", "fp32", after, STEPS, &lay_a);
    float *wd = train_unclipped("during_backward", "fp32", during, STEPS, &lay_d);
    assert_memory_equal(wa, wd, sizeof(float) * (size_t)lay_a.total_numel);
    for (int s = 0; s < STEPS; s++) {
        printf("# step %d: grad_norm %.6f after the backward, %.6f squared in the update\n", s + 1, after[s], during[s]);
        assert_true(after[s] > 0);
        assert_true(fabs(after[s] - during[s]) <= 2e-6 * after[s] + 1e-6);
    }
    free(wa);
    free(wd);
    layout_free(&lay_a);
    layout_free(&lay_d);
}

/* Gradients crossing to the host in bf16 (runtime.grad_dtype): the optimizer widens them where the
 * reduction squares them (after the backward) and where the update does (during it), to the same
 * weights bit for bit. Against fp32 gradients, the first step's norm (same weights, each gradient
 * rounded to bf16, at most 2^-9 relative) differs by at most 2^-9 of it, and training goes on
 * close by. */
static void test_bf16_gradients(void **state)
{
    write_job("");
    enum { STEPS = 8 };
    double fp32[STEPS], after[STEPS], during[STEPS];
    struct layout lay_f, lay_a, lay_d;
    float *wf = train_unclipped("after_backward", "fp32", fp32, STEPS, &lay_f);
    float *wa = train_unclipped("after_backward", "bf16", after, STEPS, &lay_a);
    float *wd = train_unclipped("during_backward", "bf16", during, STEPS, &lay_d);
    assert_memory_equal(wa, wd, sizeof(float) * (size_t)lay_a.total_numel);
    for (int s = 0; s < STEPS; s++) {
        printf("# step %d: grad_norm fp32 %.6f, bf16 %.6f after the backward, %.6f squared in the update\n", s + 1,
               fp32[s], after[s], during[s]);
        assert_true(fabs(after[s] - during[s]) <= 2e-6 * after[s] + 1e-6);
    }
    assert_true(fabs(after[0] - fp32[0]) <= 0x1p-9 * fp32[0] + 1e-6);
    double err = weights_rel_err(wa, wf, lay_f.total_numel);
    printf("# bf16 gradients vs fp32: final weights rel err %.2e\n", err);
    assert_true(err > 0); /* bf16 took effect */
    assert_true(err < 1e-2);
    free(wf);
    free(wa);
    free(wd);
    layout_free(&lay_f);
    layout_free(&lay_a);
    layout_free(&lay_d);
}

/* A non-finite loss stops the job (exit 3) naming the step, its values and the first tensor with
 * non-finite weights; nothing is exported, the checkpoints before it stay and none of it is
 * written; metrics.jsonl stays strict JSON (null) and slidedp-stat plots it. The cause: an untied
 * model whose embedding row of token 31 is NaN, a token that first appears in step 3's batch. */
static void test_nonfinite_stops(void **state)
{
    char p[1100], cfg_src[1300], *out = NULL;
    snprintf(p, sizeof p, "%s/nan", dir);
    tu_rmrf(p);
    assert_int_equal(tu_sh(&out, "mkdir -p %s/cfg && sed 's/\"tie_word_embeddings\": true/\"tie_word_embeddings\": false/' "
                                 "%s/config.json > %s/cfg/config.json", p, tu_src("examples/tiny-qwen3"), p), 0);
    free(out);
    snprintf(cfg_src, sizeof cfg_src, "%s/cfg/config.json", p);
    struct model_config cfg;
    assert_int_equal(model_config_load(cfg_src, &cfg), 0);
    assert_false(cfg.tie_word_embeddings);
    struct layout lay;
    assert_int_equal(layout_build(&cfg, 1, &lay), 0);
    float *params = calloc((size_t)lay.total_numel, sizeof(float));
    uint64_t seed = tu_seed("nonfinite", 7);
    tu_fill_uniform(params, (size_t)lay.total_numel, &seed, -0.05f, 0.05f);
    const struct tensor_desc *embed = &lay.tensors[0];
    assert_string_equal(embed->name, "model.embed_tokens.weight");
    for (int j = 0; j < cfg.hidden_size; j++)
        params[embed->offset + 31 * cfg.hidden_size + j] = NAN;
    char model[1400], data[1400], ini[1400];
    snprintf(model, sizeof model, "%s/model", p);
    assert_int_equal(hf_export(model, cfg_src, &cfg, &lay, params, HF_EXPORT_FP32, 0), 0);
    free(params);
    layout_free(&lay);
    /* steps 1 and 2 read tokens [0, 64]; token 31 first at position 70, in step 3 */
    uint32_t tokens[400];
    for (int i = 0; i < 400; i++)
        tokens[i] = i < 70 ? (uint32_t)(i * 7 % 31) : (uint32_t)(i % 32);
    snprintf(data, sizeof data, "%s/train.bin", p);
    assert_int_equal(data_write_llmc(data, tokens, 400, false), 0);
    snprintf(ini, sizeof ini, "%s/job.ini", p);
    char text[4096];
    snprintf(text, sizeof text,
             "[model]\npath = model\n[data]\ntrain = train.bin\nseq_len = 16\n[train]\nmicro_batch = 2\nsteps = 6\n"
             "lr = 1e-3\n[checkpoint]\ndir = ckpt\nevery = 1\nkeep = 10\n[runtime]\ndevice = cpu\ngpus = 1\n"
             "[log]\ndir = log\n");
    tu_write_file(ini, text);
    int rc = tu_sh(&out, "%s %s 2>&1", tu_bin("slidedp-launch"), ini);
    printf("%s# exit %d\n", out, rc);
    assert_int_equal(rc, 3);
    assert_non_null(strstr(out, "job stopped at step 3: loss nan"));
    assert_non_null(strstr(out, "the weights of model.embed_tokens.weight are not finite"));
    assert_non_null(strstr(out, "the last good checkpoint is step-2"));
    free(out);
    snprintf(model, sizeof model, "%s/ckpt/final", p);
    assert_false(tu_exists(model));
    snprintf(model, sizeof model, "%s/ckpt/step-2/optimizer.safetensors", p);
    assert_true(tu_exists(model));
    snprintf(model, sizeof model, "%s/ckpt/step-3", p);
    assert_false(tu_exists(model));
    /* every line strict JSON; step 3's loss and norm null */
    snprintf(model, sizeof model, "%s/log/metrics.jsonl", p);
    char *metrics = tu_read_file(model, NULL);
    assert_non_null(metrics);
    int lines = 0;
    for (char *line = strtok(metrics, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *o = cJSON_Parse(line);
        if (!o)
            fail_msg("metrics.jsonl line %d is not JSON: %s", lines + 1, line);
        lines++;
        bool bad = lines == 3;
        assert_int_equal(cJSON_GetObjectItem(o, "step")->valueint, lines);
        assert_true(bad ? cJSON_IsNull(cJSON_GetObjectItem(o, "loss")) : cJSON_IsNumber(cJSON_GetObjectItem(o, "loss")));
        assert_true(bad ? cJSON_IsNull(cJSON_GetObjectItem(o, "grad_norm"))
                        : cJSON_IsNumber(cJSON_GetObjectItem(o, "grad_norm")));
        cJSON_Delete(o);
    }
    free(metrics);
    assert_int_equal(lines, 3);
    rc = tu_sh(&out, "%s %s --plot %s/plot.svg 2>&1", tu_bin("slidedp-stat"), ini, p);
    printf("# slidedp-stat --plot -> exit %d %s", rc, out);
    assert_int_equal(rc, 0);
    free(out);
    /* without periodic checkpoints, the stop writes the last good step's */
    rc = tu_sh(&out, "cd %s && %s %s checkpoint.every=0 checkpoint.dir=ckpt0 log.dir=log0 2>&1", p,
               tu_bin("slidedp-launch"), ini);
    printf("%s# exit %d\n", out, rc);
    assert_int_equal(rc, 3);
    assert_non_null(strstr(out, "the last good checkpoint is step-2"));
    free(out);
    snprintf(model, sizeof model, "%s/ckpt0/step-2/optimizer.safetensors", p);
    assert_true(tu_exists(model));
    /* updated during the backward, step 3's chunks took the NaN before its norm was known: that
     * state is not checkpointed */
    rc = tu_sh(&out, "cd %s && %s %s train.grad_clip=0 runtime.update_mode=during_backward checkpoint.dir=ckpt1 "
               "log.dir=log1 2>&1", p, tu_bin("slidedp-launch"), ini);
    printf("%s# exit %d\n", out, rc);
    assert_int_equal(rc, 3);
    assert_non_null(strstr(out, "job stopped at step 3"));
    assert_non_null(strstr(out, "the last good checkpoint is step-2"));
    free(out);
    snprintf(model, sizeof model, "%s/ckpt1/step-3", p);
    assert_false(tu_exists(model));
}

/* Export dtype, sequences above max_position_embeddings, a second run of a finished job, --clean
 * with no state, and 5000 sequences per micro-step (more than a fixed array once held). */
static void test_rerun_and_limits(void **state)
{
    write_job("");
    char p[1300], *out = NULL;
    const char *run = "%s --gpus 1 %s/job.ini train.steps=3 train.warmup=0 train.grad_accum=1 data.val= "
                      "log.dir=%s/rerun checkpoint.dir=%s/rerun/ckpt checkpoint.export_dtype=fp32 data.seq_len=128 2>&1";
    int rc = tu_sh(&out, run, tu_bin("slidedp-launch"), dir, dir, dir);
    printf("%s", out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "warning: data.seq_len 128 is above the model's max_position_embeddings 64"));
    free(out);
    snprintf(p, sizeof p, "%s/rerun/ckpt/final/config.json", dir);
    char *config = tu_read_file(p, NULL);
    assert_non_null(config);
    assert_non_null(strstr(config, "\"torch_dtype\": \"float32\""));
    assert_null(strstr(config, "bfloat16"));
    free(config);
    /* the same command again: it says the job is finished and trains nothing */
    rc = tu_sh(&out, run, tu_bin("slidedp-launch"), dir, dir, dir);
    printf("# second run -> exit %d: %s", rc, out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "already finished"));
    assert_non_null(strstr(out, "checkpoint.resume=never"));
    assert_null(strstr(out, "step "));
    free(out);
    snprintf(p, sizeof p, "%s/rerun/metrics.jsonl", dir);
    double losses[8];
    assert_int_equal(tu_metrics_values(p, "loss", losses, 8), 3);
    rc = tu_sh(&out, "%s --clean %s/job.ini log.dir=%s/rerun 2>&1", tu_bin("slidedp-launch"), dir, dir);
    printf("# --clean with no state -> exit %d: %s", rc, out);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "nothing to remove"));
    free(out);
    rc = tu_sh(&out,
               "%s --gpus 1 %s/job.ini train.steps=1 train.warmup=0 train.grad_accum=1 train.micro_batch=5000 data.seq_len=8 "
               "data.val= log.dir=%s/mb5000 checkpoint.dir=%s/mb5000/ckpt 2>&1",
               tu_bin("slidedp-launch"), dir, dir, dir);
    printf("# micro_batch 5000 -> exit %d\n", rc);
    if (rc != 0)
        fail_msg("%s", out);
    free(out);
    snprintf(p, sizeof p, "%s/mb5000/metrics.jsonl", dir);
    double tokens[2];
    assert_int_equal(tu_metrics_values(p, "tokens", tokens, 2), 1);
    assert_true(tokens[0] == 5000 * 8);
}

static void test_bad_input_creates_nothing(void **state)
{
    write_job("");
    char cmd[1200], logdir[1200], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/job.ini", dir);
    snprintf(logdir, sizeof logdir, "%s/log", dir);
    const char *bad[] = {"train.steps=0", "model.path=/nonexistent", "data.seq_len=100000"};
    const char *expect[] = {"steps", "[model] path", "seq_len"};
    for (int i = 0; i < 3; i++) {
        tu_rmrf(logdir);
        int rc = tu_sh(&out, "%s %s %s 2>&1", tu_bin("slidedp-launch"), cmd, bad[i]);
        printf("# %s -> %s", bad[i], out);
        assert_int_equal(rc, 2);
        assert_non_null(strstr(out, expect[i]));
        assert_null(strchr(out, '\n') == out + strlen(out) - 1 ? NULL : strchr(out, '\n'));
        free(out);
        assert_false(tu_exists(logdir));
    }
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "launch"));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_two_workers),
        cmocka_unit_test(test_norm_squared_in_update),
        cmocka_unit_test(test_logits_in_chunks),
        cmocka_unit_test(test_bf16_gradients),
        cmocka_unit_test(test_on_device_accumulation_many_chunks),
        cmocka_unit_test(test_bad_input_creates_nothing),
        cmocka_unit_test(test_nonfinite_stops),
        cmocka_unit_test(test_rerun_and_limits),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(dir);
    return rc;
}
