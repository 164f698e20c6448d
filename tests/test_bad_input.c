/* Bad input to slidedp-launch (docs/design.md §2.4): a table of malformed job files, configs, checkpoints and
 * token shards, host memory that is too small, and shared memory of another job. Each case must
 * exit 2 with one line naming the problem, and create or modify nothing: no log or checkpoint
 * directory, no shared memory object, input files untouched. */
#include "tests/testutil.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/data.h"
#include "common/err.h"
#include "common/fsutil.h"
#include "common/hf.h"
#include "common/job.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "shm/ctl.h"

static char dir[1024];

static void path(char *out, size_t len, const char *rel)
{
    snprintf(out, len, "%s/%s", dir, rel);
}

static void sh(const char *fmt, const char *a)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, fmt, a, a, a, a);
    if (system(cmd) != 0)
        fail_msg("command failed: %s", cmd);
}

/* A valid HF directory (fp32, single file) for the tiny config, and a sharded copy. */
static void make_model(void)
{
    char p[1200], cfg_src[1200];
    snprintf(cfg_src, sizeof cfg_src, "%s/config.json", tu_src("examples/tiny-qwen3"));
    struct model_config cfg;
    assert_int_equal(model_config_load(cfg_src, &cfg), 0);
    struct layout lay;
    assert_int_equal(layout_build(&cfg, 1, &lay), 0);
    float *params = calloc((size_t)lay.total_numel, sizeof(float));
    uint64_t s = 5;
    tu_fill_uniform(params, (size_t)lay.total_numel, &s, -0.05f, 0.05f);
    path(p, sizeof p, "model");
    assert_int_equal(hf_export(p, cfg_src, &cfg, &lay, params, HF_EXPORT_FP32, 0), 0);
    path(p, sizeof p, "sharded");
    assert_int_equal(hf_export(p, cfg_src, &cfg, &lay, params, HF_EXPORT_FP32, 20000), 0);
    free(params);
    layout_free(&lay);
}

/* train.bin; two SFT shards of the same tokens: notargets.bin with no target, sparse.bin with
 * targets in the first step's two sequences of 32 tokens only (micro_batch 2, one rank). */
static void make_data(void)
{
    uint32_t tokens[4096];
    uint8_t flags[4096] = {0};
    for (int i = 0; i < 4096; i++)
        tokens[i] = (uint32_t)(i * 7 % 32);
    char p[1200];
    path(p, sizeof p, "train.bin");
    assert_int_equal(data_write_llmc(p, tokens, 4096, false), 0);
    path(p, sizeof p, "notargets.bin");
    assert_int_equal(data_write_sft(p, tokens, flags, 4096), 0);
    for (int i = 1; i <= 64; i++)
        flags[i] = DATA_FLAG_LOSS;
    path(p, sizeof p, "sparse.bin");
    assert_int_equal(data_write_sft(p, tokens, flags, 4096), 0);
}

struct bad_case {
    const char *name;
    const char *setup;     /* shell, %s = the case directory; runs in a fresh copy of the inputs */
    const char *ini_extra; /* appended to a valid job.ini */
    const char *override;  /* one section.key=value, or NULL */
    const char *expect;    /* substring of the error line */
};

static const struct bad_case cases[] = {
    {"malformed ini line", NULL, "this is not a key\n", NULL, ":17: malformed line"},
    {"unknown key", NULL, "[train]\nlearning_rate = 1\n", NULL, "unknown key"},
    {"unknown section", NULL, "[optimizer]\nlr = 1\n", NULL, "unknown section [optimizer]"},
    {"bad number", NULL, NULL, "train.lr=fast", "'fast' is not a number"},
    {"bad enum", NULL, NULL, "train.schedule=exp", "cosine|linear|constant"},
    {"key set twice", NULL, "[data]\nseq_len = 8\n", NULL, "set twice"},
    {"gpus out of range", NULL, NULL, "runtime.gpus=0", "gpus"},
    {"logits_rows out of range", NULL, NULL, "runtime.logits_rows=-3", "logits_rows"},
    {"grad_dtype unknown", NULL, NULL, "runtime.grad_dtype=fp16", "fp32|bf16"},
    {"optimizer_state unknown", NULL, NULL, "train.optimizer_state=fp16", "optimizer_state: 'fp16' is not one of fp32|bf16|8bit"},
    {"resume under another optimizer_state",
     "mkdir -p %s/ckpt/step-2 && printf '{\"step\": 2, \"optimizer_state\": \"bf16\"}' > %s/ckpt/step-2/trainer_state.json",
     NULL, NULL, "optimizer_state = bf16, this job has fp32"},
    {"clipping with update during backward", NULL, NULL, "runtime.update_mode=during_backward", "grad_clip = 0"},
    {"update during backward set in the file", NULL, "[runtime]\nupdate_mode = during_backward\n", NULL,
     "job.ini:18: [runtime] update_mode: during_backward needs train.grad_clip = 0"},
    {"too few chunk buffers", NULL, "[runtime]\nchunk_buffers = 2\n", NULL,
     "job.ini:18: [runtime] chunk_buffers: 2 is too few: at least 3 are needed"},
    {"on-device accumulation with GPU-side gradients", NULL, "[runtime]\naccumulate_on_device = true\ngrad_route = gpu\n",
     NULL, "job.ini:18: [runtime] accumulate_on_device: true cannot go with grad_route = gpu"},
    {"streamed master with update during backward", NULL,
     "[train]\ngrad_clip = 0\n[runtime]\nupdate_mode = during_backward\n", "runtime.weights_source=master",
     "[runtime] weights_source: master needs update_mode = after_backward"},
    {"weights_source unknown", NULL, NULL, "runtime.weights_source=fp32", "auto|bf16_copy|master"},
    {"model dir missing", NULL, NULL, "model.path=nowhere", "not a directory"},
    {"no config.json", "rm %s/model/config.json", NULL, NULL, "has no config.json"},
    {"config.json not JSON", "echo '{\"model_type\": ' > %s/model/config.json", NULL, NULL, "config.json"},
    {"unsupported model_type", "sed -i 's/\"qwen3\"/\"gpt2\"/' %s/model/config.json", NULL, NULL, "model_type"},
    {"sliding window", "sed -i 's/\"use_sliding_window\": false/\"use_sliding_window\": true/' %s/model/config.json",
     NULL, NULL, "use_sliding_window"},
    {"mixture of experts", "sed -i 's/\"vocab_size\"/\"num_experts\": 8, \"vocab_size\"/' %s/model/config.json", NULL,
     NULL, "num_experts"},
    {"missing hidden_size", "sed -i '/\"hidden_size\"/d' %s/model/config.json", NULL, NULL, "hidden_size"},
    {"safetensors header past EOF", "truncate -s 12 %s/model/model.safetensors", NULL, NULL, "past the end"},
    {"safetensors truncated data", "truncate -s -100 %s/model/model.safetensors", NULL, NULL, "model.safetensors"},
    {"safetensors header not JSON", "printf '\\020\\000\\000\\000\\000\\000\\000\\000{not json......}' > %s/model/model.safetensors",
     NULL, NULL, "not valid JSON"},
    {"overlapping tensors",
     "printf '\\160\\000\\000\\000\\000\\000\\000\\000{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}    ............' > "
     "%s/model/model.safetensors",
     NULL, NULL, "overlap"},
    {"wrong dtype", "sed -i 's/\"F32\",\"shape\":\\[64\\],\"data_offsets\"/\"I32\",\"shape\":[64],\"data_offsets\"/' "
                    "%s/model/model.safetensors",
     NULL, NULL, "dtype"},
    {"wrong shape", "sed -i 's/\"shape\":\\[32,64\\]/\"shape\":[64,32]/' %s/model/model.safetensors", NULL, NULL, "shape"},
    {"missing tensor", "sed -i 's/model.norm.weight/model.norm.weigh_/' %s/model/model.safetensors", NULL, NULL,
     "model.norm.weigh"},
    {"truncated shard", "rm -r %s/model && mv %s/sharded %s/model && truncate -s -64 %s/model/model-00002-of-*.safetensors",
     NULL, NULL, "model-00002-of"},
    {"missing shard", "rm -r %s/model && mv %s/sharded %s/model && rm %s/model/model-00001-of-*.safetensors", NULL, NULL,
     "model-00001-of"},
    {"token id >= vocab", "sed -i 's/vocab_size\": 32/vocab_size\": 20/' %s/model/config.json", "[model]\ninit = random\n", NULL,
     "not below vocab_size 20"},
    {"truncated token shard", "truncate -s -10 %s/train.bin", NULL, NULL, "train.bin"},
    {"bad token shard magic", "printf 'XXXX' | dd of=%s/train.bin conv=notrunc status=none", NULL, NULL, "magic"},
    {"seq_len longer than the data", NULL, NULL, "data.seq_len=5000", "seq_len 5000"},
    {"no data file matches", NULL, NULL, "data.train=shard-*.bin", "no file matches"},
    {"not enough host memory",
     "sed -i 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 400/; s/\"hidden_size\": 64/\"hidden_size\": 16384/; "
     "s/\"intermediate_size\": 192/\"intermediate_size\": 65536/' %s/model/config.json",
     "[model]\ninit = random\n", NULL, "not enough"},
    {"topology file missing", NULL, NULL, "runtime.topology=host.ini", "host.ini' is not a file"},
    {"bad topology file", "printf '[gpus]\\ncount = 2\\np2p = 0-5\\n' > %s/host.ini", NULL, "runtime.topology=host.ini",
     "host.ini:3: [gpus] p2p: pair 0-5: GPU 5 is not one of 0..1"},
    {"sharded params without P2P", "printf '[gpus]\\ncount = 2\\np2p = none\\n' > %s/host.ini",
     "[runtime]\ntopology = host.ini\nparam_route = sharded\n", "runtime.gpus=2",
     "param_route = sharded needs P2P between every pair of GPUs; GPUs 0 and 1 have none"},
    {"checkpoint.dir under a regular file", "touch %s/afile", NULL, "checkpoint.dir=afile/ckpt",
     "afile is a regular file, not a directory"},
    {"log.dir is a regular file", "touch %s/logfile", NULL, "log.dir=logfile", "logfile is a regular file"},
    {"checkpoint.dir in /proc", NULL, NULL, "checkpoint.dir=/proc/sdtest-ckpt", "/proc is on the kernel's proc filesystem"},
    {"vocab_size out of range", "sed -i 's/vocab_size\": 32/vocab_size\": 1e12/' %s/model/config.json", NULL, NULL,
     "'vocab_size' = 1000000000000 is out of range"},
    {"resume from a step past train.steps", "mkdir -p %s/ckpt/step-3 && echo {} > %s/ckpt/step-3/trainer_state.json",
     NULL, "train.steps=2", "holds step-3, past train.steps = 2"},
    {"resume from another model's checkpoint",
     "mkdir -p %s/ckpt/step-1 && echo {} > %s/ckpt/step-1/trainer_state.json && cp %s/model/model.safetensors "
     "%s/ckpt/step-1/optimizer.safetensors",
     NULL, NULL, "checkpoint of another model or configuration; start over with checkpoint.resume = never"},
    {"SFT data without a target", NULL, NULL, "data.train=notargets.bin", "no token of the data is a training target"},
    {"a step without a target", NULL, NULL, "data.train=sparse.bin", "step 2 has no training target"},
#ifndef SD_HAVE_CUDA
    {"cuda device in a CPU-only build", NULL, NULL, "runtime.device=cuda", "no CUDA backend"},
#endif
};

/* Cases whose launcher runs in its own mount namespace with a tmpfs mounted on <case dir>/DIR with
 * OPTIONS (mount = "OPTIONS DIR"; needs root). */
static const struct {
    struct bad_case c;
    const char *mount;
} mount_cases[] = {
    {{"checkpoint.dir on a read-only filesystem", "mkdir %s/rofs", NULL, "checkpoint.dir=rofs/ckpt",
      "rofs is on a read-only filesystem"},
     "ro,size=1m rofs"},
    {{"log.dir on a read-only filesystem", "mkdir %s/rofs", NULL, "log.dir=rofs/log", "rofs is on a read-only filesystem"},
     "ro,size=1m rofs"},
};

static const char *base_ini = "[model]\npath = model\n[data]\ntrain = train.bin\nseq_len = 32\n[train]\n"
                              "micro_batch = 2\nsteps = 3\nlr = 1e-3\n[checkpoint]\ndir = ckpt\n[runtime]\ndevice = cpu\n"
                              "gpus = 1\n[log]\ndir = log\n";

/* Whether this process may make mount namespaces (root, not confined): the read-only and disk-full
 * cases need them. */
static bool mount_namespaces(void)
{
    return system("unshare -m true > /dev/null 2>&1") == 0;
}

/* The shell command that runs cmd in a new mount namespace with a tmpfs on cdir/DIR ("OPTIONS DIR"). */
static void in_mount_ns(char *out, size_t len, const char *cdir, const char *mount, const char *cmd)
{
    char options[128], mdir[128];
    if (sscanf(mount, "%127s %127s", options, mdir) != 2)
        fail_msg("bad mount spec '%s'", mount);
    if (snprintf(out, len, "unshare -m sh -c 'mount -t tmpfs -o %s none %s/%s && %s'", options, cdir, mdir, cmd) >= (int)len)
        fail_msg("command too long for its buffer");
}

/* Shared memory objects of the job whose log.dir is <case dir>/log (other jobs may run meanwhile). */
static int count_shm(const char *cdir)
{
    char log_dir[1400], job[32];
    snprintf(log_dir, sizeof log_dir, "%s/log", cdir);
    ctl_job_name(log_dir, job, sizeof job);
    return tu_shm_objects(job);
}

/* Recursive listing with sizes and mtimes: "nothing modified" means this does not change. */
static char *snapshot(const char *d)
{
    char *out = NULL;
    int rc = tu_sh(&out, "cd %s && find . -printf '%%p %%s %%T@\\n' | sort", d);
    assert_int_equal(rc, 0);
    return out;
}

static void run_case(const struct bad_case *c, int i, const char *mount)
{
    char cdir[1300], ini[1400], text[4096];
    snprintf(cdir, sizeof cdir, "%s/case%02d", dir, i);
    tu_rmrf(cdir);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp -r %s/model %s/sharded %s/train.bin %s/notargets.bin %s/sparse.bin %s/",
             cdir, dir, dir, dir, dir, dir, cdir);
    assert_int_equal(system(cmd), 0);
    if (c->setup)
        sh(c->setup, cdir);
    snprintf(text, sizeof text, "%s%s", base_ini, c->ini_extra ? c->ini_extra : "");
    snprintf(ini, sizeof ini, "%s/job.ini", cdir);
    tu_write_file(ini, text);
    if (mount && !mount_namespaces()) {
        printf("# %-36s -> SKIPPED: this process may not make mount namespaces (unshare -m; needs root)\n", c->name);
        tu_rmrf(cdir);
        return;
    }
    char *before = snapshot(cdir);
    int shm_before = count_shm(cdir);
    char *out = NULL, launch[4096], wrapped[4600];
    /* from the case's folder: an override's relative path starts at the current directory */
    snprintf(launch, sizeof launch, "cd %s && %s %s %s 2>&1", cdir, tu_bin("slidedp-launch"), ini,
             c->override ? c->override : "");
    if (mount)
        in_mount_ns(wrapped, sizeof wrapped, cdir, mount, launch);
    int rc = tu_sh(&out, "%s", mount ? wrapped : launch);
    printf("# %-36s -> %s", c->name, out);
    if (rc != 2 || !strstr(out, c->expect))
        fail_msg("case '%s': exit %d, message lacks '%s'", c->name, rc, c->expect);
    size_t len = strlen(out);
    if (len == 0 || strchr(out, '\n') != out + len - 1)
        fail_msg("case '%s': not exactly one line", c->name);
    char *after = snapshot(cdir);
    if (strcmp(before, after) != 0)
        fail_msg("case '%s': files changed:\n%s---\n%s", c->name, before, after);
    assert_int_equal(count_shm(cdir), shm_before);
    free(out), free(before), free(after);
    tu_rmrf(cdir);
}

static void test_table(void **state)
{
    int n = (int)(sizeof cases / sizeof cases[0]);
    printf("# %d cases\n", n);
    assert_true(n >= 25);
    for (int i = 0; i < n; i++)
        run_case(&cases[i], i, NULL);
    for (int i = 0; i < (int)(sizeof mount_cases / sizeof mount_cases[0]); i++)
        run_case(&mount_cases[i].c, n + i, mount_cases[i].mount);
}

/* Shared memory of a live job with the same log.dir, then of a dead one with another config. */
static void test_existing_state(void **state)
{
    char ini[1200], *out = NULL;
    path(ini, sizeof ini, "live.ini");
    tu_write_file(ini, "[model]\npath = model\ninit = random\n[data]\ntrain = train.bin\nseq_len = 32\n[train]\n"
                       "micro_batch = 2\nsteps = 100000\n[checkpoint]\ndir = live-ckpt\n[runtime]\ndevice = cpu\n"
                       "[log]\ndir = live-log\nevery = 100000\n");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        execl(tu_bin("slidedp-launch"), "slidedp-launch", ini, (char *)NULL);
        _exit(127);
    }
    struct job_config job;
    assert_int_equal(job_config_load(ini, 0, NULL, &job), 0);
    char name[32];
    ctl_job_name(job.log_dir, name, sizeof name);
    struct job_shm shm;
    for (int i = 0; i < 500 && job_shm_attach(&shm, name, JOB_MAP_CTL, true) != 0; i++)
        usleep(10000);
    job_shm_detach(&shm);
    int rc = tu_sh(&out, "%s %s 2>&1", tu_bin("slidedp-launch"), ini);
    printf("# second launch of a live job -> %s", out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "already running"));
    free(out);
    /* the live job is unharmed: it still runs; now kill its launcher to leave a stale state */
    assert_int_equal(waitpid(pid, NULL, WNOHANG), 0);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    rc = tu_sh(&out, "%s %s train.lr=5e-4 2>&1", tu_bin("slidedp-launch"), ini);
    printf("# relaunch with another config over a dead job's state -> %s", out);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "different configuration"));
    free(out);
    rc = tu_sh(&out, "%s --clean %s 2>&1", tu_bin("slidedp-launch"), ini);
    assert_int_equal(rc, 0);
    free(out);
    char obj[96];
    snprintf(obj, sizeof obj, "/dev/shm/slidedp.%s.ctl", name);
    assert_false(tu_exists(obj));
}

/* slidedp-plan on the CPU backend for a model whose state does not fit the host: exit 2 as the
 * launcher would, saying "does not fit" (issue 29: it exited 0), and that no layer count fits; no
 * negative budget, and no GPU calibration block (the CPU backend uses none). */
static void test_plan_little_host_memory(void **state)
{
    char *out = NULL;
    int rc = tu_sh(&out,
                   "cd %s && rm -rf big && mkdir big && sed 's/\"num_hidden_layers\": 2/\"num_hidden_layers\": 400/; "
                   "s/\"hidden_size\": 64/\"hidden_size\": 16384/; s/\"intermediate_size\": 192/\"intermediate_size\": "
                   "65536/; s/\"vocab_size\": 32/\"vocab_size\": 4000000/' model/config.json > big/config.json && "
                   "printf '%s' > plan.ini && %s plan.ini model.path=big 2>&1",
                   dir, base_ini, tu_bin("slidedp-plan"));
    printf("%s# exit %d\n", out, rc);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(out, "slidedp-plan: the job does not fit this host: it needs "));
    /* the embedding alone (4M x 16384) outgrows any host: no layer count fits, said so (it printed
     * "0 layers, 0.00M params, 0.0 KiB") */
    assert_non_null(strstr(out, "fp32 state: no layer count fits"));
    assert_non_null(strstr(out, "bf16 state: no layer count fits"));
    assert_null(strstr(out, "state: 0 layers"));
    assert_non_null(strstr(out, "worker memory per rank"));
    assert_null(strstr(out, "of -"));
    assert_null(strstr(out, "calibration, GPU"));
    free(out);
}

/* A checkpoint disk too small for the export: the launcher warns up front with the amounts (also for
 * the checkpoint a stop writes, where none is scheduled), trains,
 * fails the export but keeps the trained state in shared memory; the same command on a disk with
 * room then only exports, and the weights are bit-identical to a run that never lacked space. */
static void test_disk_full(void **state)
{
    if (!mount_namespaces()) {
        printf("# SKIPPED: this process may not make mount namespaces (unshare -m; needs root)\n");
        skip();
    }
    char cdir[1300], ini[1400], cmd[8192], launch[4096], *out = NULL;
    snprintf(cdir, sizeof cdir, "%s/diskfull", dir);
    tu_rmrf(cdir);
    snprintf(cmd, sizeof cmd, "mkdir -p %s/small && cp -r %s/model %s/train.bin %s/", cdir, dir, dir, cdir);
    assert_int_equal(system(cmd), 0);
    snprintf(ini, sizeof ini, "%s/job.ini", cdir);
    tu_write_file(ini, base_ini);
    /* the reference: the same job with the checkpoints on the ordinary disk */
    int rc = tu_sh(&out, "cd %s && %s %s checkpoint.dir=ref-ckpt log.dir=ref-log 2>&1", cdir, tu_bin("slidedp-launch"),
                   ini);
    assert_int_equal(rc, 0);
    free(out);
    char cfg_path[1400], need[32], line[256];
    snprintf(cfg_path, sizeof cfg_path, "%s/model/config.json", dir);
    struct model_config cfg;
    struct layout lay;
    assert_int_equal(model_config_load(cfg_path, &cfg), 0);
    assert_int_equal(layout_build(&cfg, 1, &lay), 0);
    double params = (double)lay.num_params;
    layout_free(&lay);
    /* no checkpoint scheduled: the one a stop would write (bf16 weights, fp32 master, m, v: 14 bytes
     * per parameter) is warned of; the run, never stopped, writes nothing and succeeds */
    snprintf(launch, sizeof launch, "cd %s && %s %s checkpoint.dir=small/ckpt checkpoint.save_final=false 2>&1", cdir,
             tu_bin("slidedp-launch"), ini);
    in_mount_ns(cmd, sizeof cmd, cdir, "size=16k small", launch);
    rc = tu_sh(&out, "%s", cmd);
    printf("%s# no checkpoint scheduled: exit %d\n", out, rc);
    assert_int_equal(rc, 0);
    snprintf(line, sizeof line, "warning: a stop (Ctrl-C, SIGTERM) writes a checkpoint of %s in ",
             fs_bytes_str(14.0 * params, need));
    assert_non_null(strstr(out, line));
    assert_non_null(strstr(out, "/small/ckpt; "));
    assert_non_null(strstr(out, "has 16.0 KiB free"));
    assert_null(strstr(out, "the checkpoints and the export in"));
    free(out);
    /* with 8-bit state: bf16 weights, fp32 master, a byte of m and of v, and a scale byte of each a
     * block of STATE8_BLOCK (without the scales the size would read 3.1 KiB less) */
    snprintf(launch, sizeof launch,
             "cd %s && %s %s checkpoint.dir=small/ckpt checkpoint.save_final=false train.optimizer_state=8bit "
             "log.dir=log-8bit 2>&1",
             cdir, tu_bin("slidedp-launch"), ini);
    in_mount_ns(cmd, sizeof cmd, cdir, "size=16k small", launch);
    rc = tu_sh(&out, "%s", cmd);
    printf("%s# 8-bit state, no checkpoint scheduled: exit %d\n", out, rc);
    assert_int_equal(rc, 0);
    snprintf(line, sizeof line, "warning: a stop (Ctrl-C, SIGTERM) writes a checkpoint of %s in ",
             fs_bytes_str((8.0 + 2.0 / STATE8_BLOCK) * params, need));
    assert_non_null(strstr(out, line));
    free(out);
    /* 16 KiB: too small for the tiny model's ~0.2 MiB export */
    snprintf(launch, sizeof launch, "cd %s && %s %s checkpoint.dir=small/ckpt 2>&1", cdir, tu_bin("slidedp-launch"), ini);
    in_mount_ns(cmd, sizeof cmd, cdir, "size=16k small", launch);
    rc = tu_sh(&out, "%s", cmd);
    printf("%s# exit %d\n", out, rc);
    assert_int_equal(rc, 1);
    /* steps = 3, no periodic checkpoints: the final checkpoint (bf16 weights, fp32 master, m, v)
     * and the export (bf16 weights): 16 bytes per parameter */
    snprintf(line, sizeof line, "need up to %s; ", fs_bytes_str(16.0 * params, need));
    assert_non_null(strstr(out, "warning: the checkpoints and the export in"));
    assert_non_null(strstr(out, line));
    assert_non_null(strstr(out, "has 16.0 KiB free"));
    assert_non_null(strstr(out, "No space left on device"));
    assert_non_null(strstr(out, "the trained state stays in /dev/shm/slidedp."));
    free(out);
    assert_true(count_shm(cdir) > 0);
    in_mount_ns(cmd, sizeof cmd, cdir, "size=16m small", launch);
    /* the mount is gone with its namespace: copy the export out before it goes */
    char keep[9000];
    snprintf(keep, sizeof keep, "%s && cp %s/small/ckpt/final/model.safetensors %s/exported.safetensors", launch, cdir,
             cdir);
    in_mount_ns(cmd, sizeof cmd, cdir, "size=16m small", keep);
    rc = tu_sh(&out, "%s", cmd);
    printf("%s# rerun on a disk with room: exit %d\n", out, rc);
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "adopting the state"));
    assert_null(strstr(out, "step     1/"));
    free(out);
    assert_int_equal(count_shm(cdir), 0);
    rc = tu_sh(&out, "cmp %s/exported.safetensors %s/ref-ckpt/final/model.safetensors 2>&1", cdir, cdir);
    printf("# exported weights against the reference run: %s", rc == 0 ? "identical\n" : out);
    assert_int_equal(rc, 0);
    free(out);
    tu_rmrf(cdir);
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "badinput"));
    make_model();
    make_data();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_existing_state),
        cmocka_unit_test(test_plan_little_host_memory),
        cmocka_unit_test(test_disk_full),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0)
        tu_rmrf(dir);
    return rc;
}
