/* job.ini parsing: defaults, every contract key, overrides, path resolution, the LR schedule,
 * and a table of malformed files whose one-line errors must name the file, line and key. */
#include "tests/testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/job.h"

static char dir[1024];

/* A model directory and a data file so that path checks pass. */
static void make_inputs(void)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "job"));
    char p[1200];
    snprintf(p, sizeof p, "%s/model", dir);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/model/config.json", dir);
    tu_write_file(p, "{}");
    snprintf(p, sizeof p, "%s/train.bin", dir);
    tu_write_file(p, "x");
}

static int load_text(const char *text, int n, char **ovr, struct job_config *job)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/job.ini", dir);
    tu_write_file(p, text);
    return job_config_load(p, n, ovr, job);
}

static const char *full_ini = "; every contract key\n"
                              "[model]\n"
                              "path = model\n"
                              "init = random   ; inline comment\n"
                              "[data]\n"
                              "train = train.bin\n"
                              "val =\n"
                              "seq_len = 128\n"
                              "shuffle = true\n"
                              "[train]\n"
                              "micro_batch = 3\n"
                              "grad_accum = 5\n"
                              "steps = 100\n"
                              "lr = 2e-4\n"
                              "warmup = 10\n"
                              "schedule = linear\n"
                              "min_lr_ratio = 0.2\n"
                              "weight_decay = 0.1\n"
                              "beta1 = 0.8\n"
                              "beta2 = 0.99\n"
                              "eps = 1e-6\n"
                              "grad_clip = 0\n"
                              "seed = 18446744073709551615\n"
                              "optimizer_state = bf16\n"
                              "[checkpoint]\n"
                              "dir = out/ckpt\n"
                              "every = 25\n"
                              "keep = 3\n"
                              "export_dtype = fp32\n"
                              "resume = never\n"
                              "[runtime]\n"
                              "device = cpu\n"
                              "gpus = 4\n"
                              "gpu_mem = 24G\n"
                              "host_state = sharded\n"
                              "host_link_gbps = 12.5\n"
                              "[log]\n"
                              "dir = out\n"
                              "every = 7\n";

static void test_all_keys(void **state)
{
    struct job_config job;
    assert_int_equal(load_text(full_ini, 0, NULL, &job), 0);
    char want[1200];
    snprintf(want, sizeof want, "%s/model", dir);
    assert_string_equal(job.model_path, want);
    assert_true(job.init_random);
    snprintf(want, sizeof want, "%s/train.bin", dir);
    assert_string_equal(job.data_train, want);
    assert_string_equal(job.data_val, "");
    assert_int_equal(job.seq_len, 128);
    assert_true(job.shuffle);
    assert_int_equal(job.micro_batch, 3);
    assert_int_equal(job.grad_accum, 5);
    assert_int_equal(job.steps, 100);
    assert_float_equal(job.lr, 2e-4, 1e-12);
    assert_int_equal(job.warmup, 10);
    assert_int_equal(job.schedule, SCHED_LINEAR);
    assert_float_equal(job.min_lr_ratio, 0.2, 1e-12);
    assert_float_equal(job.weight_decay, 0.1, 1e-12);
    assert_float_equal(job.beta1, 0.8, 1e-12);
    assert_float_equal(job.beta2, 0.99, 1e-12);
    assert_float_equal(job.eps, 1e-6, 1e-15);
    assert_float_equal(job.grad_clip, 0, 0);
    assert_true(job.seed == 18446744073709551615ull);
    assert_int_equal(job.optimizer_state, OPTIM_STATE_BF16);
    snprintf(want, sizeof want, "%s/out/ckpt", dir);
    assert_string_equal(job.ckpt_dir, want);
    assert_int_equal(job.ckpt_every, 25);
    assert_int_equal(job.ckpt_keep, 3);
    assert_int_equal(job.export_dtype, EXPORT_FP32);
    assert_false(job.resume_auto);
    assert_int_equal(job.device, DEVICE_CPU);
    assert_int_equal(job.gpus, 4);
    assert_true(job.gpu_mem == 24ll << 30);
    assert_int_equal(job.host_state, HOST_STATE_SHARDED);
    assert_float_equal(job.host_link_gbps, 12.5, 0);
    snprintf(want, sizeof want, "%s/out", dir);
    assert_string_equal(job.log_dir, want);
    assert_int_equal(job.log_every, 7);
}

static void test_defaults_and_overrides(void **state)
{
    struct job_config job;
    const char *ini = "[model]\npath = model\n[data]\ntrain = train.bin\n";
    assert_int_equal(load_text(ini, 0, NULL, &job), 0);
    assert_int_equal(job.seq_len, 4096);
    assert_int_equal(job.micro_batch, 1);
    assert_int_equal(job.grad_accum, 1);
    assert_int_equal(job.steps, 1000);
    assert_float_equal(job.lr, 1e-5, 1e-15);
    assert_int_equal(job.schedule, SCHED_COSINE);
    assert_float_equal(job.beta2, 0.95, 1e-12);
    assert_float_equal(job.grad_clip, 1.0, 0);
    assert_true(job.seed == 1234);
    assert_int_equal(job.optimizer_state, OPTIM_STATE_FP32);
    assert_int_equal(job.ckpt_keep, 2);
    assert_true(job.resume_auto);
    assert_int_equal(job.device, DEVICE_CUDA);
    assert_int_equal(job.gpus, 1);
    assert_true(job.gpu_mem == 0);
    assert_false(job.init_random);
    assert_int_equal(job.host_state, HOST_STATE_AUTO);
    assert_float_equal(job.host_link_gbps, 0, 0);

    char *ovr[] = {"train.steps=7", "runtime.gpus=2", "data.seq_len=16", "runtime.gpu_mem=512M", "log.dir=/tmp/x/../y"};
    assert_int_equal(load_text(ini, 5, ovr, &job), 0);
    assert_int_equal(job.steps, 7);
    assert_int_equal(job.gpus, 2);
    assert_int_equal(job.seq_len, 16);
    assert_true(job.gpu_mem == 512ll << 20);
    assert_string_equal(job.log_dir, "/tmp/y");
    char *eight[] = {"train.optimizer_state=8bit"};
    assert_int_equal(load_text(ini, 1, eight, &job), 0);
    assert_int_equal(job.optimizer_state, OPTIM_STATE_8BIT);
    assert_string_equal(optimizer_state_name(job.optimizer_state), "8bit");
}

/* Relative paths: in the file, against the file's folder; in a command-line override, against the
 * current directory, as the shell that typed them means (issue 29: overrides resolved against the
 * ini's folder). The job file lives in dir/sub/ and the current directory is dir. */
static void test_override_paths_from_cwd(void **state)
{
    char sub[1200], ini[1300], want[1300], old_cwd[1024];
    snprintf(sub, sizeof sub, "%s/sub", dir);
    mkdir(sub, 0755);
    snprintf(ini, sizeof ini, "%s/job.ini", sub);
    tu_write_file(ini, "[model]\npath = ../model\n[data]\ntrain = ../train.bin\n[log]\ndir = logs\n");
    assert_non_null(getcwd(old_cwd, sizeof old_cwd));
    assert_int_equal(chdir(dir), 0);
    struct job_config job;
    char *ovr[] = {"checkpoint.dir=ckpt", "data.train=train.bin", "model.path=./model/../model", "data.val="};
    int rc = job_config_load(ini, 4, ovr, &job);
    assert_int_equal(chdir(old_cwd), 0);
    assert_int_equal(rc, 0);
    snprintf(want, sizeof want, "%s/ckpt", dir);
    assert_string_equal(job.ckpt_dir, want);       /* override: from the current directory */
    snprintf(want, sizeof want, "%s/train.bin", dir);
    assert_string_equal(job.data_train, want);
    snprintf(want, sizeof want, "%s/model", dir);
    assert_string_equal(job.model_path, want);
    assert_string_equal(job.data_val, "");         /* an emptied path stays empty */
    snprintf(want, sizeof want, "%s/logs", sub);
    assert_string_equal(job.log_dir, want);        /* the file's own value: from its folder */
    /* an override naming a path that exists only beside the ini is not found from elsewhere (a
     * folder of the test's own, so that nothing outside it can match) */
    char *beside[] = {"data.train=../train.bin"}, elsewhere[1300];
    snprintf(elsewhere, sizeof elsewhere, "%s/a", dir);
    mkdir(elsewhere, 0755);
    snprintf(elsewhere, sizeof elsewhere, "%s/a/b", dir);
    mkdir(elsewhere, 0755);
    assert_int_equal(chdir(elsewhere), 0);
    rc = job_config_load(ini, 1, beside, &job);
    assert_int_equal(chdir(old_cwd), 0);
    assert_int_equal(rc, -1);
    assert_non_null(strstr(sd_errmsg(), "no file matches"));
}

struct bad_case {
    const char *ini;
    const char *override;
    const char *expect[3]; /* substrings the message must contain */
};

static const char *base = "[model]\npath = model\n[data]\ntrain = train.bin\n";

static void test_bad_inputs(void **state)
{
    static const struct bad_case cases[] = {
        {"[model]\npath = model\n[data]\ntrain = train.bin\nfoo = 1\n", NULL, {":5:", "[data] foo", "unknown key"}},
        {"[modle]\npath = model\n", NULL, {":2:", "unknown section [modle]", "[model]"}},
        {"[model]\npath = model\npath = model\n[data]\ntrain = train.bin\n", NULL, {":3:", "set twice", "line 2"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[train]\nlr = fast\n", NULL, {":6:", "[train] lr", "'fast'"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[train]\nschedule = step\n", NULL,
         {":6:", "schedule", "cosine|linear|constant"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[train]\nsteps = 0\n", NULL, {":6:", "steps", "[1,"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[train]\nmicro_batch = -2\n", NULL, {":6:", "micro_batch", ""}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[runtime]\ngpu_mem = lots\n", NULL, {":6:", "gpu_mem", "24G"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[runtime]\ndevice = tpu\n", NULL, {":6:", "device", "cuda|cpu"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[data]\nshuffle = maybe\n", NULL, {":6:", "shuffle", "true|false"}},
        {"[model]\npath = nowhere\n[data]\ntrain = train.bin\n", NULL, {":2:", "[model] path", "not a directory"}},
        {"[model]\npath = model\n[data]\ntrain = missing-*.bin\n", NULL, {":4:", "[data] train", "no file matches"}},
        {"[model]\npath = model\n", NULL, {"[data] train", "missing", ""}},
        {"[data]\ntrain = train.bin\n", NULL, {"[model] path", "missing", ""}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[train]\nwarmup = 5000\n", NULL, {":6:", "warmup", "steps"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\nthis line is junk\n", NULL, {":5:", "malformed", ""}},
        {"path = model\n", NULL, {":1:", "outside any [section]", ""}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[train]\nbeta2 = 1.5\n", NULL, {":6:", "beta2", ""}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[runtime]\nchunk_buffers = 2\n", NULL,
         {":6:", "[runtime] chunk_buffers: 2 is too few", "at least 3"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[train]\ngrad_clip = 0.5\n[runtime]\n"
         "update_mode = during_backward\n", NULL,
         {":8:", "[runtime] update_mode: during_backward", "needs train.grad_clip = 0"}},
        {"[model]\npath = model\n[data]\ntrain = train.bin\n[runtime]\naccumulate_on_device = true\n"
         "grad_route = gpu\n", NULL,
         {":6:", "[runtime] accumulate_on_device: true", "cannot go with grad_route = gpu"}},
        {NULL, "runtime.update_mode=during_backward", {"job.ini: [runtime] update_mode", "train.grad_clip = 0", ""}},
        {NULL, "train.lr=abc", {"override", "train.lr", "'abc'"}},
        {NULL, "train.nothing=1", {"override", "unknown key", ""}},
        {NULL, "steps=5", {"override 'steps=5'", "section.key=value", ""}},
        {NULL, "runtime.gpus=100", {"override", "gpus", "[1, 64]"}},
        {NULL, "runtime.host_state=mirrored", {"override", "host_state", "auto|replicated|sharded"}},
        {NULL, "runtime.host_link_gbps=-3", {"override", "host_link_gbps", "'-3'"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct job_config job;
        char *ovr[1] = {(char *)cases[i].override};
        int rc = load_text(cases[i].ini ? cases[i].ini : base, cases[i].override ? 1 : 0, ovr, &job);
        const char *msg = sd_errmsg();
        printf("# case %zu: %s\n", i, msg);
        assert_int_equal(rc, -1);
        assert_null(strchr(msg, '\n'));
        if (cases[i].ini)
            assert_non_null(strstr(msg, "job.ini"));
        for (int k = 0; k < 3; k++)
            if (cases[i].expect[k][0] && !strstr(msg, cases[i].expect[k]))
                fail_msg("case %zu: message '%s' lacks '%s'", i, msg, cases[i].expect[k]);
    }
}

/* The job file argument is a directory (e.g. the examples folder): said so, not "[model] path: missing". */
static void test_ini_is_directory(void **state)
{
    struct job_config job;
    assert_int_equal(job_config_load(dir, 0, NULL, &job), -1);
    printf("# %s\n", sd_errmsg());
    assert_non_null(strstr(sd_errmsg(), "is a directory"));
    assert_null(strstr(sd_errmsg(), "[model]"));
}

static void test_lr_schedule(void **state)
{
    struct job_config job;
    job_config_defaults(&job);
    job.lr = 1e-3;
    job.warmup = 10;
    job.steps = 110;
    job.min_lr_ratio = 0.1;
    job.schedule = SCHED_COSINE;
    assert_float_equal(job_lr_at(&job, 1), 1e-4, 1e-15);
    assert_float_equal(job_lr_at(&job, 10), 1e-3, 1e-15);
    /* p = 0.5: lo + 0.5*(lr-lo)*(1+cos(pi/2)) = 1e-4 + 4.5e-4 */
    assert_float_equal(job_lr_at(&job, 60), 5.5e-4, 1e-15);
    assert_float_equal(job_lr_at(&job, 110), 1e-4, 1e-15);
    job.schedule = SCHED_LINEAR;
    assert_float_equal(job_lr_at(&job, 35), 1e-3 - 9e-4 * 0.25, 1e-15);
    job.schedule = SCHED_CONSTANT;
    assert_float_equal(job_lr_at(&job, 99), 1e-3, 0);
    job.warmup = 0;
    job.schedule = SCHED_COSINE;
    assert_float_equal(job_lr_at(&job, 110), 1e-4, 1e-15);
}

int main(void)
{
    make_inputs();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_all_keys),
        cmocka_unit_test(test_defaults_and_overrides),
        cmocka_unit_test(test_override_paths_from_cwd),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_lr_schedule),
        cmocka_unit_test(test_ini_is_directory),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(dir);
    return rc;
}
