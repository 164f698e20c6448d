/* The routes of several GPUs (docs/design.md §7) on the CPU backend, where shared memory stands in for
 * peer copies: for G = 2 and 3, replicated or sharded parameters with gradients reduced on the
 * CPU or on the "GPUs" give final weights and losses bit-identical to G = 1 with grad_accum x G;
 * the metrics show each route's traffic per link; and workers killed inside the exchange are
 * restarted together without changing a bit of the result. */
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/job.h"
#include "shm/ctl.h"

static char dir[1024];

static const char *route_names[2][2] = {{"replicated", "sharded"}, {"cpu", "gpu"}};

/* Writes <dir>/<tag>/job.ini: the tiny model, 6 steps of 2 x 64 tokens per micro-step, grad_accum
 * a, validation after steps 3 and 6, fp32 export. */
static void write_job(const char *tag, int gpus, int a, const char *extra)
{
    char p[1300], text[4096];
    snprintf(text, sizeof text,
             "[model]\npath = %s\ninit = random\n"
             "[data]\ntrain = ../data/train.bin\nval = ../data/val.bin\nseq_len = 64\nval_every = 3\n"
             "[train]\nmicro_batch = 2\ngrad_accum = %d\nsteps = 6\nlr = 3e-3\nwarmup = 1\nweight_decay = 0.01\n"
             "grad_clip = 1.0\nseed = 5\n"
             "[checkpoint]\ndir = ckpt\nexport_dtype = fp32\n"
             "[runtime]\ndevice = cpu\ngpus = %d\naccumulate_on_device = false\n%s\n"
             "[log]\ndir = log\n",
             tu_src("examples/tiny-qwen3"), a, gpus, extra);
    snprintf(p, sizeof p, "%s/%s", dir, tag);
    tu_rmrf(p);
    char *out = NULL;
    assert_int_equal(tu_sh(&out, "mkdir -p %s", p), 0);
    free(out);
    snprintf(p, sizeof p, "%s/%s/job.ini", dir, tag);
    tu_write_file(p, text);
}

static int run_job(const char *tag, const char *crash_at, char **log)
{
    return tu_sh(log, "cd %s/%s && %s%s%s %s job.ini 2>&1", dir, tag, crash_at ? "SLIDEDP_CRASH_AT=" : "",
                 crash_at ? crash_at : "", crash_at ? " " : "", tu_bin("slidedp-launch"));
}

/* The losses of every metrics line, and the total bytes per link kind (h2d, d2h, peer) summed over
 * ranks and steps. */
static int read_metrics(const char *tag, char losses[][32], uint64_t bytes[3])
{
    char *text = tu_read_job_file(dir, tag, "log/metrics.jsonl", NULL);
    static const char *keys[3] = {"\"h2d_bytes\":[", "\"d2h_bytes\":[", "\"peer_bytes\":["};
    int n = 0;
    bytes[0] = bytes[1] = bytes[2] = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"), n++) {
        char *l = strstr(line, "\"loss\":");
        assert_non_null(l);
        snprintf(losses[n], 32, "%.*s", (int)strcspn(l, ","), l);
        for (int k = 0; k < 3; k++) {
            char *p = strstr(line, keys[k]);
            assert_non_null(p);
            p += strlen(keys[k]);
            while (*p && *p != ']') {
                bytes[k] += strtoull(p, &p, 10);
                if (*p == ',')
                    p++;
            }
        }
    }
    free(text);
    return n;
}

static void assert_same_result(const char *tag, const char *ref)
{
    size_t a_len, b_len;
    char *a = tu_read_job_file(dir, tag, "ckpt/final/model.safetensors", &a_len);
    char *b = tu_read_job_file(dir, ref, "ckpt/final/model.safetensors", &b_len);
    if (a_len != b_len || memcmp(a, b, a_len) != 0)
        fail_msg("%s: final weights differ from %s", tag, ref);
    free(a);
    free(b);
    char la[8][32], lb[8][32];
    uint64_t bytes[3];
    assert_int_equal(read_metrics(tag, la, bytes), 6);
    assert_int_equal(read_metrics(ref, lb, bytes), 6);
    for (int i = 0; i < 6; i++)
        if (strcmp(la[i], lb[i]) != 0)
            fail_msg("%s: step %d %s, %s has %s", tag, i + 1, la[i], ref, lb[i]);
}

static void test_every_route_matches_one_gpu(void **state)
{
    write_job("g1", 1, 6, "");
    char *log = NULL;
    assert_int_equal(run_job("g1", NULL, &log), 0);
    free(log);
    for (int G = 2; G <= 3; G++) {
        uint64_t h2d_replicated = 0;
        for (int pr = 0; pr < 2; pr++)
            for (int gr = 0; gr < 2; gr++) {
                char tag[64], extra[160];
                snprintf(tag, sizeof tag, "g%d-%s-%s", G, route_names[0][pr], route_names[1][gr]);
                snprintf(extra, sizeof extra, "param_route = %s\ngrad_route = %s", route_names[0][pr],
                         route_names[1][gr]);
                write_job(tag, G, 6 / G, extra);
                int rc = run_job(tag, NULL, &log);
                if (rc != 0)
                    fail_msg("%s exited %d:\n%s", tag, rc, log);
                if (!strstr(log, pr ? "params sharded" : "params replicated") ||
                    !strstr(log, gr ? "grads reduced on GPUs" : "grads reduced on CPU"))
                    fail_msg("%s: the plan does not show the forced routes:\n%s", tag, log);
                free(log);
                assert_same_result(tag, "g1");
                char losses[8][32];
                uint64_t b[3];
                read_metrics(tag, losses, b);
                printf("# G=%d params %-10s grads %-3s: bit-identical to G=1; bytes per run: host->device %llu, "
                       "device->host %llu, peer %llu\n",
                       G, route_names[0][pr], route_names[1][gr], (unsigned long long)b[0],
                       (unsigned long long)b[1], (unsigned long long)b[2]);
                assert_true((b[2] > 0) == (pr || gr)); /* peer traffic exactly when shards are exchanged */
                if (!pr && !gr)
                    h2d_replicated = b[0];
                if (pr)
                    assert_true(b[0] < h2d_replicated / (uint64_t)G + h2d_replicated / 8);
            }
    }
}

/* Too few chunk buffers to keep the model resident: later reads of a chunk in a pass come from the
 * host while the first read of every chunk still goes through the exchange. */
static void test_routes_with_chunks_streamed(void **state)
{
    write_job("g2-streamed", 2, 3, "param_route = sharded\ngrad_route = gpu\nchunk_buffers = 3");
    char *log = NULL;
    int rc = run_job("g2-streamed", NULL, &log);
    if (rc != 0)
        fail_msg("exited %d:\n%s", rc, log);
    free(log);
    assert_same_result("g2-streamed", "g1");
}

/* Shared memory objects left by the job in <dir>/<tag>. */
static int shm_objects_of(const char *tag)
{
    char ini[1300], job[32];
    snprintf(ini, sizeof ini, "%s/%s/job.ini", dir, tag);
    struct job_config cfg;
    if (job_config_load(ini, 0, NULL, &cfg) != 0)
        fail_msg("%s", sd_errmsg());
    ctl_job_name(cfg.log_dir, job, sizeof job);
    return tu_shm_objects(job);
}

/* A worker killed inside the exchange (every worker passes each point, so both die at about the
 * same moment, or one dies while the other waits for it): all are restarted together and redo the
 * step; the result does not change by a bit. */
static void test_crashes_in_the_exchange(void **state)
{
    uint64_t rng = tu_seed("exchange crash points", 23);
    /* passes per worker in the 6-step jobs: first reads of 4 chunks at 8 versions (G=2: 6 steps x
     * 3 micro-steps x 4 chunks of gradients; sums sent 6 x 4) */
    static const struct {
        int gpus;
        const char *routes, *point;
        int passes;
    } cases[] = {
        {2, "param_route = sharded\ngrad_route = gpu", "worker_param_staged", 28},
        {2, "param_route = sharded\ngrad_route = gpu", "worker_grad_published", 72},
        {2, "param_route = sharded\ngrad_route = gpu", "worker_pushed", 24},
        {3, "param_route = sharded\ngrad_route = cpu", "worker_param_staged", 28},
        {3, "param_route = sharded\ngrad_route = cpu", "worker_slot_posted", 48},
        {3, "param_route = replicated\ngrad_route = gpu", "worker_grad_published", 48},
        {2, "param_route = sharded\ngrad_route = gpu", "worker_pushed", -24}, /* the last gradient of the job */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char tag[32], spec[96], *log = NULL;
        int n = cases[i].passes;
        int count = n < 0 ? -n : 1 + (int)(tu_uniform(&rng) * (float)n) % n;
        snprintf(tag, sizeof tag, "crash-%zu", i);
        snprintf(spec, sizeof spec, "%s:%d", cases[i].point, count);
        write_job(tag, cases[i].gpus, 6 / cases[i].gpus, cases[i].routes);
        int rc = run_job(tag, spec, &log);
        char routes[96];
        snprintf(routes, sizeof routes, "%s", cases[i].routes);
        routes[strcspn(routes, "\n")] = ',';
        printf("# G=%d %s, crash at %s -> exit %d\n", cases[i].gpus, routes, spec, rc);
        if (rc != 0 || !strstr(log, "died from signal 9") || !strstr(log, "with every worker"))
            fail_msg("%s: no gang restart after a crash at %s, or it failed (exit %d):\n%s", tag, spec, rc, log);
        free(log);
        assert_same_result(tag, "g1");
        assert_int_equal(shm_objects_of(tag), 0);
    }
}

int main(void)
{
    snprintf(dir, sizeof dir, "%s", tu_tmpdir(0, "routes"));
    char *out = NULL;
    if (tu_sh(&out, "%s copy --out %s/data --seq-len 64 --train 2000 --val 64 --seed 3", tu_bin("slidedp-data"),
              dir) != 0) {
        fprintf(stderr, "%s", out);
        return 1;
    }
    free(out);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_route_matches_one_gpu),
        cmocka_unit_test(test_routes_with_chunks_streamed),
        cmocka_unit_test(test_crashes_in_the_exchange),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmrf(dir);
    return rc;
}
