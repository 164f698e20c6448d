/* HF parity (docs/design.md §9): for each fixture made with transformers (tests/fixtures/<name>, built by
 * gen_fixtures.py), the CPU backend's logits, loss and every parameter's gradient match the
 * reference, and a 4-step AdamW run through slidedp-launch (warmup + cosine, clipping, grad
 * accumulation) matches the reference losses and final weights, with --gpus 1 and with --gpus 2
 * at half the grad_accum (which must also be bit-identical to each other). */
#include "tests/testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/data.h"
#include "common/err.h"
#include "common/job.h"
#include "common/layout.h"
#include "common/plan.h"
#include "common/safetensors.h"
#include "worker/resident.h"

static const char *fixtures[] = {"qwen3_tied", "qwen3_untied_gqa8", "qwen2", "llama3"};

struct errstat {
    double rel, cos;
};

static struct errstat compare(const float *a, const float *ref, size_t n)
{
    double d = 0, r = 0, aa = 0, dot = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return (struct errstat){INFINITY, 0};
        double diff = (double)a[i] - ref[i];
        d += diff * diff;
        r += (double)ref[i] * ref[i];
        aa += (double)a[i] * a[i];
        dot += (double)a[i] * ref[i];
    }
    struct errstat e = {r > 0 ? sqrt(d / r) : sqrt(d), (aa > 0 && r > 0) ? dot / sqrt(aa * r) : (d == 0 ? 1 : 0)};
    return e;
}

static float *ref_tensor(const struct st_file *ref, const char *name, size_t expect_numel)
{
    const struct st_tensor *t = st_find(ref, name);
    if (!t)
        fail_msg("reference has no tensor %s", name);
    if ((size_t)t->numel != expect_numel)
        fail_msg("reference %s has %lld elements, expected %zu", name, (long long)t->numel, expect_numel);
    float *x = malloc(sizeof(float) * expect_numel);
    assert_int_equal(st_tensor_to_f32(t, x), 0);
    return x;
}

struct fixture {
    char dir[1024];
    struct job_config job;
    struct model_config cfg;
    struct st_file ref;
    cJSON *json;
};

static void fixture_open(struct fixture *f, const char *name)
{
    snprintf(f->dir, sizeof f->dir, "%s", tu_src("tests/fixtures"));
    strncat(f->dir, "/", sizeof f->dir - strlen(f->dir) - 1);
    strncat(f->dir, name, sizeof f->dir - strlen(f->dir) - 1);
    char p[1200];
    snprintf(p, sizeof p, "%s/job.ini", f->dir);
    if (job_config_load(p, 0, NULL, &f->job) != 0)
        fail_msg("%s", sd_errmsg());
    snprintf(p, sizeof p, "%s/config.json", f->job.model_path);
    if (model_config_load(p, &f->cfg) != 0)
        fail_msg("%s", sd_errmsg());
    snprintf(p, sizeof p, "%s/ref.safetensors", f->dir);
    if (st_open(p, &f->ref) != 0)
        fail_msg("%s", sd_errmsg());
    snprintf(p, sizeof p, "%s/ref.json", f->dir);
    char *text = tu_read_file(p, NULL);
    assert_non_null(text);
    f->json = cJSON_Parse(text);
    free(text);
    assert_non_null(f->json);
}

static void fixture_close(struct fixture *f)
{
    st_close(&f->ref);
    cJSON_Delete(f->json);
}

static double json_num(cJSON *arr, int i)
{
    cJSON *x = cJSON_GetArrayItem(arr, i);
    assert_non_null(x);
    return x->valuedouble;
}

/* The B sequences of micro-step a of step 1 (of A, one rank) in the job's data order: tokens and
 * targets (B*T each); seq holds T + 1 tokens. */
static void load_micro_step(struct data_set *data, int a, int A, int B, int T, int32_t *tokens, int32_t *targets,
                            int32_t *seq)
{
    for (int i = 0; i < B; i++) {
        assert_int_equal(data_sequence(data, data_seq_index(1, a, 0, i, A, 1, B), seq, NULL), 0);
        memcpy(tokens + (size_t)i * T, seq, (size_t)T * 4);
        memcpy(targets + (size_t)i * T, seq + 1, (size_t)T * 4);
    }
}

/* Forward logits and loss of step 1 micro-step 0, and the gradient of the whole step-1 batch. */
static void check_forward_and_grads(const char *name)
{
    struct fixture f;
    fixture_open(&f, name);
    const struct job_config *job = &f.job;
    int B = job->micro_batch, T = job->seq_len, A = job->grad_accum, V = f.cfg.vocab_size;
    struct backend be;
    assert_int_equal(backend_cpu_init(&be), 0);
    struct resident_model rm;
    if (resident_model_load(&rm, &be, &f.cfg, job->model_path, B, T) != 0)
        fail_msg("%s", sd_errmsg());
    struct data_set data;
    if (data_open(job->data_train, T, V, false, 0, &data) != 0)
        fail_msg("%s", sd_errmsg());
    size_t N = (size_t)B * T;
    int32_t *tokens = malloc(N * 4), *targets = malloc(N * 4), *seq = malloc(((size_t)T + 1) * 4);
    float *loss = malloc(N * 4), *scale = malloc(N * 4), *logits = malloc(N * (size_t)V * 4);

    for (int a = 0; a < A; a++) {
        load_micro_step(&data, a, A, B, T, tokens, targets, seq);
        if (a == 0) {
            model_eval(&rm.model, &rm.io, tokens, targets, loss, NULL, logits);
            float *ref = ref_tensor(&f.ref, "logits", N * (size_t)V);
            struct errstat e = compare(logits, ref, N * (size_t)V);
            double mean = 0;
            for (size_t i = 0; i < N; i++)
                mean += loss[i];
            mean /= (double)N;
            double ref_loss = cJSON_GetObjectItem(f.json, "loss_microstep0")->valuedouble;
            printf("# %-18s logits rel err %.2e  loss %.7f vs %.7f (rel %.1e)\n", name, e.rel, mean, ref_loss,
                   fabs(mean - ref_loss) / ref_loss);
            assert_true(e.rel < 1e-5);
            assert_true(fabs(mean - ref_loss) / ref_loss < 1e-6);
            free(ref);
        }
        for (size_t i = 0; i < N; i++)
            scale[i] = (float)(1.0 / ((double)A * (double)N));
        model_train_step(&rm.model, &rm.io, tokens, targets, scale, loss, NULL);
    }
    double worst_rel = 0, worst_cos = 1;
    const char *worst_name = "";
    for (int t = 0; t < rm.lay.num_tensors; t++) {
        const struct tensor_desc *td = &rm.lay.tensors[t];
        char key[160];
        snprintf(key, sizeof key, "grad.%s", td->name);
        float *ref = ref_tensor(&f.ref, key, (size_t)td->numel);
        struct errstat e = compare(rm.grads + td->offset, ref, (size_t)td->numel);
        printf("#   %-52s rel %.2e cos %.9f\n", td->name, e.rel, e.cos);
        if (e.rel > worst_rel) {
            worst_rel = e.rel;
            worst_name = td->name;
        }
        worst_cos = e.cos < worst_cos ? e.cos : worst_cos;
        free(ref);
    }
    printf("# %-18s worst gradient: %s rel err %.2e, lowest cosine %.9f\n", name, worst_name, worst_rel, worst_cos);
    assert_true(worst_rel < 1e-4);
    assert_true(worst_cos > 0.9999999);
    free(tokens), free(targets), free(seq), free(loss), free(scale), free(logits);
    data_close(&data);
    resident_model_free(&rm);
    backend_cpu_free(&be);
    fixture_close(&f);
}

static void test_forward_and_grads(void **state)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        check_forward_and_grads(fixtures[i]);
}

/* Two micro-steps of the fixture's model made 5 layers deep (random weights, seed printed) on the
 * CPU backend, keeping every layer's activations; then again recomputing every layer from inputs
 * offloaded to host memory (model_init's offload_inputs; the CPU backend's copies are memcpy), and
 * with the odd layers kept: the same losses and gradients, bit for bit. An evaluation between the
 * micro-steps must not disturb the ring, and with 5 layers the backward loads inputs back from
 * host memory (the ring holds only the last two). */
static void check_recompute_offload(const char *name)
{
    struct fixture f;
    fixture_open(&f, name);
    struct model_config cfg = f.cfg;
    cfg.num_layers = 5;
    int B = f.job.micro_batch, T = f.job.seq_len, V = cfg.vocab_size;
    struct layout lay;
    assert_int_equal(layout_build(&cfg, 1, &lay), 0);
    size_t N = (size_t)B * T, P = (size_t)lay.total_numel;
    layout_free(&lay);
    uint64_t rng = tu_seed("recompute offload", 47);
    float *params = malloc(P * 4);
    tu_fill_uniform(params, P, &rng, -0.1f, 0.1f);
    struct backend be;
    assert_int_equal(backend_cpu_init(&be), 0);
    struct resident_model rm;
    if (resident_model_init(&rm, &be, &cfg, params, B, T) != 0)
        fail_msg("%s", sd_errmsg());
    struct data_set data;
    if (data_open(f.job.data_train, T, V, false, 0, &data) != 0)
        fail_msg("%s", sd_errmsg());
    int32_t *tokens = malloc(2 * N * 4), *targets = malloc(2 * N * 4), *seq = malloc(((size_t)T + 1) * 4);
    float *loss[3], *grads[3], *scale = malloc(N * 4), *eval_loss = malloc(N * 4);
    for (int a = 0; a < 2; a++)
        load_micro_step(&data, a, 2, B, T, tokens + a * N, targets + a * N, seq);
    for (size_t i = 0; i < N; i++)
        scale[i] = (float)(1.0 / (2.0 * (double)N));
    static const uint8_t keeps[3][5] = {{1, 1, 1, 1, 1}, {0, 0, 0, 0, 0}, {0, 1, 0, 1, 0}};
    for (int run = 0; run < 3; run++) {
        if (run > 0) {
            model_free(&rm.model);
            assert_int_equal(model_init(&rm.model, &be, &rm.cfg, rm.lay.tensors, rm.lay.num_tensors, rm.lay.chunks,
                                        rm.lay.num_chunks, B, T, keeps[run], 0, true),
                             0);
            resident_model_clear_grads(&rm);
        }
        loss[run] = malloc(2 * N * 4);
        for (int a = 0; a < 2; a++) {
            model_train_step(&rm.model, &rm.io, tokens + a * N, targets + a * N, scale, loss[run] + a * N, NULL);
            if (a == 0)
                model_eval(&rm.model, &rm.io, tokens + N, targets + N, eval_loss, NULL, NULL);
        }
        grads[run] = malloc(P * 4);
        memcpy(grads[run], rm.grads, P * 4);
    }
    for (int run = 1; run < 3; run++) {
        size_t loss_differ = 0, grad_differ = 0, grad_zero = 0;
        for (size_t i = 0; i < 2 * N; i++)
            loss_differ += memcmp(&loss[0][i], &loss[run][i], 4) != 0;
        for (size_t i = 0; i < P; i++) {
            grad_differ += memcmp(&grads[0][i], &grads[run][i], 4) != 0;
            grad_zero += grads[run][i] == 0.0f;
        }
        printf("# %-18s 5 layers, kept %s, inputs offloaded: %zu of %zu losses and %zu of %zu gradients differ from "
               "keeping every activation on the device (%zu gradients zero)\n",
               name, run == 1 ? "none" : "1 and 3", loss_differ, 2 * N, grad_differ, P, grad_zero);
        assert_int_equal(loss_differ, 0);
        assert_int_equal(grad_differ, 0);
        assert_true(grad_zero < P / 2);
        free(loss[run]), free(grads[run]);
    }
    free(loss[0]), free(grads[0]);
    free(tokens), free(targets), free(seq), free(scale), free(eval_loss), free(params);
    data_close(&data);
    resident_model_free(&rm);
    backend_cpu_free(&be);
    fixture_close(&f);
}

static void test_recompute_offload(void **state)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        check_recompute_offload(fixtures[i]);
}

/* Runs the fixture's job through slidedp-launch; returns the final weights (parameter space). */
static float *run_training(struct fixture *f, const char *tag, int gpus, int grad_accum, const char *extra,
                           double *losses, int nsteps, struct layout *lay)
{
    const char *out = tu_tmpdir(gpus, tag);
    char cmd[4096], *log = NULL;
    int rc = tu_sh(&log,
                   "%s --device cpu --gpus %d %s/job.ini train.grad_accum=%d log.dir=%s/log checkpoint.dir=%s/ckpt %s",
                   tu_bin("slidedp-launch"), gpus, f->dir, grad_accum, out, out, extra);
    if (rc != 0)
        fail_msg("slidedp-launch exited %d:\n%s", rc, log);
    free(log);
    snprintf(cmd, sizeof cmd, "%s/log/metrics.jsonl", out);
    char *metrics = tu_read_file(cmd, NULL);
    assert_non_null(metrics);
    int n = 0;
    for (char *line = strtok(metrics, "\n"); line && n < nsteps; line = strtok(NULL, "\n"), n++) {
        cJSON *o = cJSON_Parse(line);
        assert_non_null(o);
        assert_int_equal(cJSON_GetObjectItem(o, "step")->valueint, n + 1);
        losses[n] = cJSON_GetObjectItem(o, "loss")->valuedouble;
        cJSON_Delete(o);
    }
    free(metrics);
    assert_int_equal(n, nsteps);
    snprintf(cmd, sizeof cmd, "%s/ckpt/final", out);
    float *params = tu_load_weights(cmd, lay);
    tu_rmrf(out);
    return params;
}

static void check_training(const char *name)
{
    struct fixture f;
    fixture_open(&f, name);
    struct layout lay;
    assert_int_equal(layout_build(&f.cfg, 1, &lay), 0);
    int steps = f.job.steps, A = f.job.grad_accum;
    double losses1[16], losses2[16];
    assert_true(steps <= 16 && A % 2 == 0);
    float *w1 = run_training(&f, "parity-g1", 1, A, "", losses1, steps, &lay);
    float *w2 = run_training(&f, "parity-g2", 2, A / 2, "", losses2, steps, &lay);
    /* micro-steps summed on the device (the GPU path's default with grad_accum > 1): the same
     * training within rounding, though not bit for bit (the sum runs in another order) */
    double losses3[16];
    float *w3 = run_training(&f, "parity-dev", 1, A, "runtime.accumulate_on_device=true", losses3, steps, &lay);
    cJSON *ref_losses = cJSON_GetObjectItem(f.json, "losses");
    for (int s = 0; s < steps; s++) {
        double ref = json_num(ref_losses, s);
        printf("# %-18s step %d loss %.7f ref %.7f (rel %.1e)\n", name, s + 1, losses1[s], ref,
               fabs(losses1[s] - ref) / ref);
        assert_true(fabs(losses1[s] - ref) / ref < 1e-5);
        assert_true(losses1[s] == losses2[s]);
        assert_true(fabs(losses3[s] - ref) / ref < 1e-5);
    }
    assert_memory_equal(w1, w2, sizeof(float) * (size_t)lay.total_numel);
    /* Weights are compared relative to themselves and relative to how far training moved them:
     * Adam divides by sqrt(v), so elements with near-zero gradients amplify rounding noise. */
    float *w0 = tu_load_weights(f.job.model_path, &lay);
    double worst = 0, worst_upd = 0;
    const char *worst_name = "", *worst_upd_name = "";
    for (int t = 0; t < lay.num_tensors; t++) {
        const struct tensor_desc *td = &lay.tensors[t];
        char key[160];
        snprintf(key, sizeof key, "final.%s", td->name);
        float *ref = ref_tensor(&f.ref, key, (size_t)td->numel);
        struct errstat e = compare(w1 + td->offset, ref, (size_t)td->numel);
        double diff = 0, upd = 0;
        for (int64_t i = 0; i < td->numel; i++) {
            double a = w1[td->offset + i], r = ref[i], z = w0[td->offset + i];
            diff += (a - r) * (a - r);
            upd += (r - z) * (r - z);
        }
        double rel_upd = sqrt(diff / upd);
        if (e.rel > worst) {
            worst = e.rel;
            worst_name = td->name;
        }
        if (rel_upd > worst_upd) {
            worst_upd = rel_upd;
            worst_upd_name = td->name;
        }
        free(ref);
    }
    printf("# %-18s final weights after %d steps: worst %s rel err %.2e; worst error relative to the update %s "
           "%.2e; --gpus 2 bit-identical to --gpus 1\n",
           name, steps, worst_name, worst, worst_upd_name, worst_upd);
    assert_true(worst < 1e-4);
    assert_true(worst_upd < 1e-2);
    struct errstat e3 = compare(w3, w1, (size_t)lay.total_numel);
    printf("# %-18s gradients summed over micro-steps on the device: final weights rel err %.2e vs --gpus 1\n", name,
           e3.rel);
    assert_true(e3.rel < 1e-5);
    free(w3);
    free(w0);
    free(w1);
    free(w2);
    layout_free(&lay);
    fixture_close(&f);
}

static void test_training(void **state)
{
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        check_training(fixtures[i]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_and_grads),
        cmocka_unit_test(test_recompute_offload),
        cmocka_unit_test(test_training),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
