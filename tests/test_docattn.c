/* Document attention (issue 30, docs/design.md §2.3): a packed window trains what each of its
 * documents alone trains. In make test, with no transformers: on the CPU backend, each document of
 * a packed shard against the same document alone in its own window (positions from 0), its loss and
 * every parameter's gradient, for the Qwen3, Qwen2.5 and Llama 3 parity models; and end to end
 * through slidedp-launch, one packed shard gives the weights that the same documents padded one per
 * row give, with activations kept or recomputed, on one worker or two (bit-identical), while
 * whole-window attention on the packed shard does not. With the argument "fixtures" (registered
 * only where tests/fixtures/<name>_docs exist, from gen_doc_fixtures.py): against transformers, each
 * document's loss, its own gradient's norm per parameter and the packed loss's gradient, on the CPU
 * backend (and on CUDA with SLIDEDP_DOCATTN_CUDA=1 in a CUDA build). */
#include "tests/testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/data.h"
#include "common/err.h"
#include "common/layout.h"
#include "common/safetensors.h"
#include "worker/resident.h"

static const char *fixtures[] = {"qwen3_docs", "qwen2_docs", "llama3_docs"};

/* L2 error of a relative to ref, over ref's norm. */
static double rel_err(const float *a, const float *ref, size_t n)
{
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]))
            return INFINITY;
        d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static double norm2(const float *a, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * a[i];
    return sqrt(s);
}

static double json_number(const cJSON *o, const char *key)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(x))
        fail_msg("ref.json: %s is not a number", key);
    return x->valuedouble;
}

/* Tolerances of one backend: the CPU backend computes in fp32, CUDA in bf16. */
struct tolerance {
    double loss, grad, norm;
};

static void check_fixture(const char *name, struct backend *be, const struct tolerance *tol)
{
    char dir[1200], p[1800];
    snprintf(dir, sizeof dir, "%s/%s", tu_src("tests/fixtures"), name);
    snprintf(p, sizeof p, "%s/ref.json", dir);
    char *text = tu_read_file(p, NULL);
    if (!text)
        fail_msg("%s missing: run tests/fixtures/gen_doc_fixtures.py (its header says how)", p);
    cJSON *ref = cJSON_Parse(text);
    free(text);
    assert_non_null(ref);
    char model_dir[1600];
    snprintf(model_dir, sizeof model_dir, "%s/%s", dir, cJSON_GetObjectItem(ref, "model")->valuestring);
    snprintf(p, sizeof p, "%s/config.json", model_dir);
    struct model_config cfg;
    if (model_config_load(p, &cfg) != 0)
        fail_msg("%s", sd_errmsg());
    int T = (int)json_number(ref, "seq_len");
    int B = cJSON_GetArraySize(cJSON_GetObjectItem(ref, "windows"));
    struct resident_model rm;
    if (resident_model_load(&rm, be, &cfg, model_dir, B, T) != 0)
        fail_msg("%s", sd_errmsg());
    struct data_set data;
    snprintf(p, sizeof p, "%s/docs.bin", dir);
    if (data_open(p, T, cfg.vocab_size, false, 0, &data) != 0)
        fail_msg("%s", sd_errmsg());
    assert_int_equal(data.num_sequences, B);

    size_t N = (size_t)B * T;
    int32_t *tokens = malloc(N * 4), *targets = malloc(N * 4), *pos = malloc(N * 4), *seq = malloc(((size_t)T + 1) * 4);
    uint8_t *mask = malloc(N);
    float *loss = malloc(N * 4), *scale = malloc(N * 4);
    for (int i = 0; i < B; i++) {
        assert_int_equal(data_sequence_positions(&data, i, seq, mask + (size_t)i * T, pos + (size_t)i * T), 0);
        memcpy(tokens + (size_t)i * T, seq, (size_t)T * 4);
        memcpy(targets + (size_t)i * T, seq + 1, (size_t)T * 4);
    }
    int total = 0;
    for (size_t i = 0; i < N; i++)
        total += mask[i];
    assert_int_equal(total, (int)json_number(ref, "targets"));
    model_set_positions(&rm.model, pos);

    /* the packed loss: every target of both windows */
    for (size_t i = 0; i < N; i++)
        scale[i] = mask[i] ? (float)(1.0 / total) : 0.0f;
    resident_model_clear_grads(&rm);
    model_train_step(&rm.model, &rm.io, tokens, targets, scale, loss, NULL);
    struct st_file st;
    snprintf(p, sizeof p, "%s/ref.safetensors", dir);
    if (st_open(p, &st) != 0)
        fail_msg("%s", sd_errmsg());
    double worst_grad = 0;
    const char *worst_name = "";
    for (int t = 0; t < rm.lay.num_tensors; t++) {
        const struct tensor_desc *td = &rm.lay.tensors[t];
        char key[160];
        snprintf(key, sizeof key, "grad.%s", td->name);
        const struct st_tensor *rt = st_find(&st, key);
        if (!rt || rt->numel != td->numel)
            fail_msg("%s: reference has no %s of %lld elements", name, key, (long long)td->numel);
        float *want = malloc((size_t)td->numel * 4);
        assert_int_equal(st_tensor_to_f32(rt, want), 0);
        double e = rel_err(rm.grads + td->offset, want, (size_t)td->numel);
        if (e > worst_grad) {
            worst_grad = e;
            worst_name = td->name;
        }
        free(want);
    }
    st_close(&st);
    printf("# %-12s %s: packed-loss gradient worst rel err %.2e (%s)\n", name, be->device_name, worst_grad,
           worst_name);
    assert_true(worst_grad < tol->grad);

    /* each document alone: its loss from the packed run's rows, then its own gradient */
    const cJSON *doc;
    int d = 0;
    cJSON_ArrayForEach(doc, cJSON_GetObjectItem(ref, "documents"))
    {
        int w = (int)json_number(doc, "window"), start = (int)json_number(doc, "start");
        int len = (int)json_number(doc, "length"), n = (int)json_number(doc, "targets");
        /* position j's target is token j+1: the document's targets are positions start..start+len-2 */
        size_t first = (size_t)w * T + (size_t)start, end = first + (size_t)len - 1;
        double sum = 0;
        int count = 0;
        for (size_t i = 0; i < N; i++) {
            bool mine = i >= first && i < end && mask[i];
            scale[i] = mine ? (float)(1.0 / n) : 0.0f;
            sum += mine ? loss[i] : 0;
            count += mine;
        }
        assert_int_equal(count, n);
        for (int j = 0; j < len; j++)
            assert_int_equal(pos[first + (size_t)j], j); /* positions restart at the document */
        if (n == 0) {
            printf("#   document %d (window %d, %d token%s): no target\n", d++, w, len, len == 1 ? "" : "s");
            continue;
        }
        double want = json_number(doc, "loss"), got = sum / n;
        float *loss2 = malloc(N * 4);
        resident_model_clear_grads(&rm);
        model_train_step(&rm.model, &rm.io, tokens, targets, scale, loss2, NULL);
        free(loss2);
        double worst_norm = 0;
        const cJSON *norms = cJSON_GetObjectItem(doc, "grad_norms");
        for (int t = 0; t < rm.lay.num_tensors; t++) {
            const struct tensor_desc *td = &rm.lay.tensors[t];
            double r = json_number(norms, td->name), g = norm2(rm.grads + td->offset, (size_t)td->numel);
            double e = fabs(g - r) / (r > 0 ? r : 1);
            worst_norm = e > worst_norm ? e : worst_norm;
        }
        printf("#   document %d (window %d, start %d, %d tokens, %d targets): loss %.7f vs %.7f (rel %.1e), "
               "gradient norms worst rel err %.1e\n",
               d++, w, start, len, n, got, want, fabs(got - want) / want, worst_norm);
        assert_true(fabs(got - want) / want < tol->loss);
        assert_true(worst_norm < tol->norm);
    }
    free(tokens), free(targets), free(pos), free(seq), free(mask), free(loss), free(scale);
    data_close(&data);
    resident_model_free(&rm);
    cJSON_Delete(ref);
}

static void test_fixtures_cpu(void **state)
{
    struct backend be;
    assert_int_equal(backend_cpu_init(&be), 0);
    const struct tolerance tol = {1e-5, 1e-4, 1e-4};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        check_fixture(fixtures[i], &be, &tol);
    backend_cpu_free(&be);
}

/* On a GPU host (bench/gpu_docattn.sh): the same fixtures on the CUDA backend, deterministic or
 * not as SLIDEDP_DOCATTN_DETERMINISTIC says. bf16 activations: looser tolerances. */
static void test_fixtures_cuda(void **state)
{
    const char *on = getenv("SLIDEDP_DOCATTN_CUDA");
    if (!on || strcmp(on, "1") != 0)
        skip();
#ifdef SD_HAVE_CUDA
    struct backend be;
    if (backend_cuda_init(&be, 0, 0) != 0)
        fail_msg("%s", sd_errmsg());
    backend_cuda_set_docs_cudnn_min_length(&be, 0); /* cuDNN's kernels on these short documents too */
    const char *det = getenv("SLIDEDP_DOCATTN_DETERMINISTIC");
    be.deterministic = !det || strcmp(det, "0") != 0;
    printf("# CUDA, deterministic %d\n", be.deterministic);
    const struct tolerance tol = {2e-2, 5e-2, 5e-2};
    for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++)
        check_fixture(fixtures[i], &be, &tol);
    backend_cuda_free(&be);
#else
    fail_msg("SLIDEDP_DOCATTN_CUDA=1 in a build without the CUDA backend");
#endif
}

/* ---- packed against padded, end to end ---- */

#define EQ_T 32
/* Two windows of documents (lengths summing to EQ_T each), as gen_doc_fixtures.py lays them. */
static const int eq_windows[2][5] = {{7, 1, 11, 5, 8}, {3, 20, 1, 8, 0}};

static uint8_t doc_flag(int i, int len)
{
    uint8_t f = i >= (len / 3 > 1 ? len / 3 : 1) ? DATA_FLAG_LOSS : 0;
    return i == 0 ? (uint8_t)(f | DATA_FLAG_DOC_START) : f;
}

/* Writes the packed shard (the two windows and one padding token) and the padded one (each
 * document at the start of its own row, padding after it, no target in the padding). Returns the
 * number of documents. */
static int write_shards(const char *packed, const char *padded, uint64_t seed)
{
    uint32_t pt[2 * EQ_T + 1], dt[10 * EQ_T + 1] = {0};
    uint8_t pf[2 * EQ_T + 1] = {0}, df[10 * EQ_T + 1] = {0};
    int np = 0, ndocs = 0;
    for (int w = 0; w < 2; w++)
        for (int j = 0; j < 5 && eq_windows[w][j]; j++, ndocs++)
            for (int i = 0; i < eq_windows[w][j]; i++, np++) {
                pt[np] = 1 + (uint32_t)(tu_uniform(&seed) * 255) % 255;
                pf[np] = doc_flag(i, eq_windows[w][j]);
                dt[ndocs * EQ_T + i] = pt[np];
                df[ndocs * EQ_T + i] = pf[np];
            }
    pt[np] = 0;
    assert_int_equal(np, 2 * EQ_T);
    assert_int_equal(data_write_sft(packed, pt, pf, np + 1), 0);
    assert_int_equal(data_write_sft(padded, dt, df, (int64_t)ndocs * EQ_T + 1), 0);
    return ndocs;
}

/* Trains the qwen3_tied fixture's model on shard for 3 steps; returns the final weights (parameter
 * space), and from metrics.jsonl the step losses and the first step's targets and documents. */
static float *train_on(const char *dir, const char *tag, const char *shard, int micro_batch, int grad_accum,
                       const char *extra, const struct layout *lay, double *losses, double *targets_docs)
{
    char ini[1400], cmd[1400];
    snprintf(ini, sizeof ini, "%s/%s.ini", dir, tag);
    char *text;
    assert_true(asprintf(&text,
                         "[model]\npath = %s\n[data]\ntrain = %s\nseq_len = %d\n[train]\nmicro_batch = %d\n"
                         "grad_accum = %d\nsteps = 3\nlr = 1e-3\nschedule = constant\nweight_decay = 0.1\n"
                         "grad_clip = 0\nseed = 7\n[checkpoint]\ndir = %s/%s-ckpt\nexport_dtype = fp32\n"
                         "[runtime]\ndevice = cpu\ngpus = 1\n[log]\ndir = %s/%s-log\n",
                         tu_src("tests/fixtures/qwen3_tied/model"), shard, EQ_T, micro_batch, grad_accum, dir,
                         tag, dir, tag) > 0);
    tu_write_file(ini, text);
    free(text);
    char *log = NULL;
    int rc = tu_sh(&log, "%s %s %s", tu_bin("slidedp-launch"), ini, extra);
    if (rc != 0)
        fail_msg("slidedp-launch (%s) exited %d:\n%s", tag, rc, log);
    free(log);
    snprintf(cmd, sizeof cmd, "%s/%s-log/metrics.jsonl", dir, tag);
    assert_int_equal(tu_metrics_values(cmd, "loss", losses, 3), 3);
    assert_int_equal(tu_metrics_values(cmd, "targets", &targets_docs[0], 1), 1);
    assert_int_equal(tu_metrics_values(cmd, "documents", &targets_docs[1], 1), 1);
    snprintf(cmd, sizeof cmd, "%s/%s-ckpt/final", dir, tag);
    return tu_load_weights(cmd, lay);
}

/* Largest error of w against ref relative to how far ref moved from w0, over the tensors. */
static double worst_vs_update(const float *w, const float *ref, const float *w0, const struct layout *lay)
{
    double worst = 0;
    for (int t = 0; t < lay->num_tensors; t++) {
        const struct tensor_desc *td = &lay->tensors[t];
        double diff = 0, upd = 0;
        for (int64_t i = td->offset; i < td->offset + td->numel; i++) {
            diff += ((double)w[i] - ref[i]) * ((double)w[i] - ref[i]);
            upd += ((double)ref[i] - w0[i]) * ((double)ref[i] - w0[i]);
        }
        double e = sqrt(diff / upd);
        worst = e > worst ? e : worst;
    }
    return worst;
}

static void test_packed_equals_padded(void **state)
{
    uint64_t seed = tu_seed("packed_equals_padded", 30);
    const char *dir = tu_tmpdir(0, "docattn");
    char packed[1200], padded[1200], cfgp[1200];
    snprintf(packed, sizeof packed, "%s/packed.bin", dir);
    snprintf(padded, sizeof padded, "%s/padded.bin", dir);
    int ndocs = write_shards(packed, padded, seed);
    assert_int_equal(ndocs, 9);
    struct model_config cfg;
    snprintf(cfgp, sizeof cfgp, "%s/config.json", tu_src("tests/fixtures/qwen3_tied/model"));
    assert_int_equal(model_config_load(cfgp, &cfg), 0);
    struct layout lay;
    assert_int_equal(layout_build(&cfg, 1, &lay), 0);
    float *w0 = tu_load_weights(tu_src("tests/fixtures/qwen3_tied/model"), &lay);

    double l_pk[3], l_pd[3], l_rc[3], l_win[3], n_pk[2], n_pd[2], n_rc[2], n_win[2];
    /* both windows in one micro-batch; the 9 padded rows as 3 micro-steps of 3 */
    float *pk = train_on(dir, "packed", packed, 2, 1, "", &lay, l_pk, n_pk);
    float *pd = train_on(dir, "padded", padded, 3, 3, "", &lay, l_pd, n_pd);
    float *rc = train_on(dir, "recompute", packed, 1, 2, "runtime.activations=recompute", &lay, l_rc, n_rc);
    float *win = train_on(dir, "window", packed, 2, 1, "data.attention=window", &lay, l_win, n_win);
    /* data parallel: the two windows on two CPU workers train what one worker's two micro-steps do */
    double l_g2[3], n_g2[2];
    float *g2 = train_on(dir, "gpus2", packed, 1, 1, "runtime.gpus=2 runtime.activations=recompute", &lay, l_g2, n_g2);
    printf("# metrics per step: packed %.0f targets in %.0f documents, padded %.0f in %.0f\n", n_pk[0], n_pk[1],
           n_pd[0], n_pd[1]);
    assert_true(n_pk[0] == n_pd[0] && n_rc[0] == n_pd[0] && n_win[0] == n_pd[0]);
    assert_true(n_pk[1] == ndocs && n_pd[1] == ndocs && n_rc[1] == ndocs && n_win[1] == ndocs);
    double e_pd = worst_vs_update(pk, pd, w0, &lay), e_rc = worst_vs_update(rc, pd, w0, &lay);
    double e_win = worst_vs_update(win, pd, w0, &lay);
    for (int s = 0; s < 3; s++)
        printf("# step %d loss: packed %.7f, padded %.7f, packed recomputed %.7f, packed whole-window %.7f\n", s + 1,
               l_pk[s], l_pd[s], l_rc[s], l_win[s]);
    printf("# final weights against the padded run's, worst error relative to the update: packed %.2e, packed "
           "with recompute and micro_batch 1 %.2e, packed with whole-window attention %.2e\n",
           e_pd, e_rc, e_win);
    for (int s = 0; s < 3; s++) {
        assert_true(fabs(l_pk[s] - l_pd[s]) / l_pd[s] < 1e-5);
        assert_true(fabs(l_rc[s] - l_pd[s]) / l_pd[s] < 1e-5);
    }
    assert_true(e_pd < 1e-3);
    assert_true(e_rc < 1e-3);
    assert_true(e_win > 0.05); /* cross-document attention trains something else */
    printf("# --gpus 2 bit-identical to one worker's two micro-steps: %s\n",
           memcmp(g2, rc, sizeof(float) * (size_t)lay.total_numel) ? "no" : "yes");
    assert_memory_equal(g2, rc, sizeof(float) * (size_t)lay.total_numel);
    free(pk), free(pd), free(rc), free(win), free(g2), free(w0);
    layout_free(&lay);
    tu_rmrf(dir);
}

/* The packed shard's two windows against each document alone in its own window (positions from 0,
 * whole-window attention, the same targets), on the CPU backend, for the Qwen3, Qwen2.5 and Llama 3
 * parity models: each document's loss and every parameter's gradient of its mean loss. */
static void check_alone(const char *fixture, const char *packed)
{
    char model_dir[1200], p[1300];
    snprintf(model_dir, sizeof model_dir, "%s/%s/model", tu_src("tests/fixtures"), fixture);
    snprintf(p, sizeof p, "%s/config.json", model_dir);
    struct model_config cfg;
    if (model_config_load(p, &cfg) != 0)
        fail_msg("%s", sd_errmsg());
    struct backend be;
    assert_int_equal(backend_cpu_init(&be), 0);
    enum { B = 2, N = B * EQ_T };
    struct resident_model rm;
    if (resident_model_load(&rm, &be, &cfg, model_dir, B, EQ_T) != 0)
        fail_msg("%s", sd_errmsg());
    struct data_set data;
    if (data_open(packed, EQ_T, cfg.vocab_size, false, 0, &data) != 0)
        fail_msg("%s", sd_errmsg());
    int32_t tokens[N], targets[N], pos[N], seq[EQ_T + 1];
    uint8_t mask[N];
    float loss[N], scale[N];
    for (int i = 0; i < B; i++) {
        assert_int_equal(data_sequence_positions(&data, i, seq, mask + i * EQ_T, pos + i * EQ_T), 0);
        memcpy(tokens + i * EQ_T, seq, sizeof(int32_t) * EQ_T);
        memcpy(targets + i * EQ_T, seq + 1, sizeof(int32_t) * EQ_T);
    }
    model_set_positions(&rm.model, pos);
    size_t P = (size_t)rm.lay.total_numel;
    float *packed_grad = malloc(P * sizeof(float));
    double worst_loss = 0, worst_grad = 0;
    int checked = 0;
    for (int w = 0; w < B; w++)
        for (int j = 0, start = 0; j < 5 && eq_windows[w][j]; start += eq_windows[w][j++]) {
            int len = eq_windows[w][j], first = w * EQ_T + start, n = 0;
            for (int i = 0; i < N; i++)
                n += i >= first && i < first + len - 1 && mask[i];
            if (n == 0)
                continue; /* a 1-token document: nothing to predict, but its neighbours must not see it */
            for (int i = 0; i < N; i++)
                scale[i] = i >= first && i < first + len - 1 && mask[i] ? (float)(1.0 / n) : 0.0f;
            resident_model_clear_grads(&rm);
            model_train_step(&rm.model, &rm.io, tokens, targets, scale, loss, NULL);
            memcpy(packed_grad, rm.grads, P * sizeof(float));
            double packed_loss = 0;
            for (int i = 0; i < N; i++)
                packed_loss += scale[i] > 0 ? loss[i] / n : 0;

            /* alone: its len tokens as one window of len - 1 inputs */
            struct resident_model one;
            if (resident_model_load(&one, &be, &cfg, model_dir, 1, len - 1) != 0)
                fail_msg("%s", sd_errmsg());
            float *s1 = malloc(sizeof(float) * (size_t)len), *l1 = malloc(sizeof(float) * (size_t)len);
            for (int i = 0; i < len - 1; i++)
                s1[i] = scale[first + i];
            resident_model_clear_grads(&one);
            model_train_step(&one.model, &one.io, tokens + first, targets + first, s1, l1, NULL);
            double alone_loss = 0;
            for (int i = 0; i < len - 1; i++)
                alone_loss += s1[i] > 0 ? l1[i] / n : 0;
            double el = fabs(packed_loss - alone_loss) / alone_loss, eg = rel_err(packed_grad, one.grads, P);
            worst_loss = el > worst_loss ? el : worst_loss;
            worst_grad = eg > worst_grad ? eg : worst_grad;
            checked++;
            free(s1), free(l1);
            resident_model_free(&one);
        }
    printf("# %-18s %d documents packed against each alone: loss worst rel err %.1e, gradient (all parameters) "
           "worst rel err %.1e\n",
           fixture, checked, worst_loss, worst_grad);
    assert_int_equal(checked, 7);
    assert_true(worst_loss < 1e-6);
    assert_true(worst_grad < 1e-5);
    free(packed_grad);
    data_close(&data);
    resident_model_free(&rm);
    backend_cpu_free(&be);
}

static void test_packed_equals_alone(void **state)
{
    uint64_t seed = tu_seed("packed_equals_alone", 31);
    const char *dir = tu_tmpdir(2, "docattn-alone");
    char packed[1200], padded[1200];
    snprintf(packed, sizeof packed, "%s/packed.bin", dir);
    snprintf(padded, sizeof padded, "%s/padded.bin", dir);
    write_shards(packed, padded, seed);
    static const char *const models[] = {"qwen3_tied", "qwen3_untied_gqa8", "qwen2", "llama3"};
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
        check_alone(models[i], packed);
    tu_rmrf(dir);
}

/* Document attention asked for on data that marks no document start: exit 2, nothing created. */
static void test_document_needs_marks(void **state)
{
    const char *dir = tu_tmpdir(1, "docattn-llmc");
    char *log = NULL;
    int rc = tu_sh(&log, "%s %s/job.ini data.attention=document log.dir=%s/log checkpoint.dir=%s/ckpt",
                   tu_bin("slidedp-launch"), tu_src("tests/fixtures/qwen3_tied"), dir, dir);
    printf("# exit %d: %s", rc, log);
    assert_int_equal(rc, 2);
    assert_non_null(strstr(log, "attention = document"));
    char ckpt[1100];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    assert_false(tu_exists(ckpt));
    free(log);
    tu_rmrf(dir);
}

/* With the argument "fixtures" (tests/meson.build registers it only where the fixtures exist): the
 * transformers comparisons; else the equivalences that need no transformers. */
int main(int argc, char **argv)
{
    const struct CMUnitTest fixture_tests[] = {
        cmocka_unit_test(test_fixtures_cpu),
        cmocka_unit_test(test_fixtures_cuda),
    };
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed_equals_alone),
        cmocka_unit_test(test_packed_equals_padded),
        cmocka_unit_test(test_document_needs_marks),
    };
    if (argc > 1 && !strcmp(argv[1], "fixtures"))
        return cmocka_run_group_tests(fixture_tests, NULL, NULL);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
