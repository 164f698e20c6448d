/* Times one Qwen3 decoder layer, forward + backward, through worker/model.c on the CUDA backend:
 * the Qwen3-1.7B shape (hidden 2048, intermediate 6144, 16 heads) or, with argument `8b`, the
 * Qwen3-8B one (hidden 4096, intermediate 12288, 32 heads); 8 kv heads, head_dim 128, qk_norm,
 * B=2, T=4096. Runs a 1-layer and a 2-layer model with a tiny vocabulary, weights resident and
 * gradients left on the device, and reports the difference as the layer's time, so embedding,
 * head and loss drop out. `micro` also times the layer recomputed in the backward, and the layer
 * in a middle micro-step adding to gradients resident on the device. `head` times instead a
 * 1-layer model with the real vocabulary (151936; tied for 1.7B, untied for 8B, as those models
 * are) against one with 256 entries: the LM head, its loss and the embedding's vocabulary-sized
 * work, LOGITS_ROWS rows of logits at a time (a plan's runtime.logits_rows; default the model's
 * own choice). Not a test; built when CUDA is.
 * usage: bench_layer [1.7b|8b] [micro | head [LOGITS_ROWS]] */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "worker/resident.h"

#define B 2
#define T 4096
#define REPS 15
#define TINY_VOCAB 256
#define QWEN3_VOCAB 151936

static void grads_stay(void *ctx, int chunk, float *grad)
{
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static bool eight_b; /* the Qwen3-8B layer shape instead of 1.7B's */
static int logits_rows; /* 0: the model chooses */

static struct model_config qwen3_shape(int layers, int vocab)
{
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.family = MODEL_QWEN3;
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    snprintf(c.architecture, sizeof c.architecture, "Qwen3ForCausalLM");
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "bfloat16");
    c.vocab_size = vocab;
    c.hidden_size = eight_b ? 4096 : 2048;
    c.intermediate_size = eight_b ? 12288 : 6144;
    c.num_layers = layers;
    c.num_heads = eight_b ? 32 : 16;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
    c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6;
    c.initializer_range = 0.02;
    c.qk_norm = true;
    c.tie_word_embeddings = !eight_b; /* as Qwen3-1.7B and Qwen3-8B are */
    return c;
}

/* How time_model runs the model beyond its shape. */
struct variant {
    bool recompute_last; /* the last layer's activations recomputed in the backward, not kept */
    bool accumulate;     /* gradients resident on the device, timed as a middle micro-step (adding to them) */
};

/* Median ms of one train step (or micro-step) of a model with `layers` layers; -1 on error. */
static double time_model(struct backend *be, int layers, int vocab, struct variant v)
{
    struct model_config cfg = qwen3_shape(layers, vocab);
    struct layout lay;
    if (layout_build(&cfg, 1, &lay) != 0)
        return -1;
    float *params = malloc(sizeof(float) * (size_t)lay.total_numel);
    uint64_t s = 42;
    for (int64_t i = 0; i < lay.total_numel; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        params[i] = ((float)((s >> 40) & 0xffffff) / (float)(1 << 24) - 0.5f) * 0.07f;
    }
    /* norm weights at 1, as trained models have them roughly */
    for (int t = 0; t < lay.num_tensors; t++) {
        const struct tensor_desc *td = &lay.tensors[t];
        if (td->kind == TENSOR_ATTN_NORM || td->kind == TENSOR_MLP_NORM || td->kind == TENSOR_Q_NORM ||
            td->kind == TENSOR_K_NORM || td->kind == TENSOR_FINAL_NORM)
            for (int64_t i = 0; i < td->numel; i++)
                params[td->offset + i] = 1.0f;
    }
    layout_free(&lay);
    struct resident_model rm;
    if (resident_model_init(&rm, be, &cfg, params, B, T) != 0) {
        free(params);
        return -1;
    }
    free(params);
    uint8_t keep[2] = {1, !v.recompute_last};
    if (logits_rows > 0 || v.recompute_last) { /* the model again, with the plan's logits chunk or recomputation */
        model_free(&rm.model);
        if (model_init(&rm.model, be, &rm.cfg, rm.lay.tensors, rm.lay.num_tensors, rm.lay.chunks, rm.lay.num_chunks,
                       B, T, keep + 2 - layers, logits_rows, false) != 0) {
            resident_model_free(&rm);
            return -1;
        }
    }
    if (v.accumulate && model_keep_grads_resident(&rm.model) != 0) {
        resident_model_free(&rm);
        return -1;
    }
    rm.io.grads_done = grads_stay;
    size_t N = (size_t)B * T;
    int32_t *tokens = malloc(N * 4), *targets = malloc(N * 4);
    float *scale = malloc(N * 4), *loss = malloc(N * 4);
    for (size_t i = 0; i < N; i++) {
        tokens[i] = (int32_t)((i * 7919) % (size_t)cfg.vocab_size);
        targets[i] = (int32_t)((i * 104729 + 3) % (size_t)cfg.vocab_size);
        scale[i] = 1.0f / (float)N;
    }
    double ms[REPS];
    for (int r = -3; r < REPS; r++) {
        be->ops->synchronize(be);
        double t0 = now_ms();
        bool first = !v.accumulate || r == -3, last = !v.accumulate; /* accumulating: middle micro-steps */
        model_train_micro(&rm.model, &rm.io, tokens, targets, scale, loss, NULL, first, last);
        be->ops->synchronize(be);
        if (r >= 0)
            ms[r] = now_ms() - t0;
    }
    double mean_loss = 0;
    for (size_t i = 0; i < N; i++)
        mean_loss += loss[i] / (double)N;
    qsort(ms, REPS, sizeof ms[0], cmp_double);
    printf("model with %d layer(s)%s%s, vocabulary %d: train %s %.3f ms (median of %d), loss %.4f\n", layers,
           v.recompute_last ? ", the last recomputed" : "", v.accumulate ? ", gradients resident" : "", vocab,
           v.accumulate ? "micro-step" : "step", ms[REPS / 2], REPS, mean_loss);
    free(tokens), free(targets), free(scale), free(loss);
    resident_model_free(&rm);
    return isfinite(mean_loss) ? ms[REPS / 2] : -1;
}

int main(int argc, char **argv)
{
    eight_b = argc > 1 && !strcmp(argv[1], "8b");
    bool head = argc > 2 && !strcmp(argv[2], "head"), micro = argc > 2 && !strcmp(argv[2], "micro");
    logits_rows = head && argc > 3 ? atoi(argv[3]) : 0;
    if (argc > 4 || (argc > 1 && !eight_b && strcmp(argv[1], "1.7b")) || (argc > 2 && !head && !micro) ||
        (argc > 3 && logits_rows <= 0)) {
        fprintf(stderr, "usage: bench_layer [1.7b|8b] [head [LOGITS_ROWS] | micro]\n");
        return 2;
    }
    struct backend be;
    if (backend_cuda_init(&be, 0, 0) != 0) {
        fprintf(stderr, "bench_layer: %s\n", sd_errmsg());
        return 1;
    }
    printf("device %s, Qwen3-%s %s, B=%d T=%d\n", be.device_name, eight_b ? "8B" : "1.7B",
           head ? "head" : "layer", B, T);
    const struct variant plain = {0}, recomputed = {.recompute_last = true}, accumulating = {.accumulate = true};
    double t1 = time_model(&be, 1, TINY_VOCAB, plain);
    double t2 = head ? time_model(&be, 1, QWEN3_VOCAB, plain) : time_model(&be, 2, TINY_VOCAB, plain);
    double r2 = micro ? time_model(&be, 2, TINY_VOCAB, recomputed) : 0;
    double a1 = micro ? time_model(&be, 1, TINY_VOCAB, accumulating) : 0;
    double a2 = micro ? time_model(&be, 2, TINY_VOCAB, accumulating) : 0;
    backend_cuda_free(&be);
    if (t1 < 0 || t2 < 0 || r2 < 0 || a1 < 0 || a2 < 0) {
        fprintf(stderr, "bench_layer: %s\n", sd_errmsg());
        return 1;
    }
    if (head) {
        double flops = 3 * 2.0 * B * T * (eight_b ? 4096 : 2048) * (double)(QWEN3_VOCAB - TINY_VOCAB);
        printf("LM head, loss and embedding, vocabulary %d over %d, %s logits rows at a time: %.3f ms, "
               "%.1f TFLOP/s (head matmuls)\n", QWEN3_VOCAB, TINY_VOCAB, argc > 3 ? argv[3] : "the model's", t2 - t1,
               flops / (t2 - t1) * 1e-9);
        printf("RESULT head_ms %.3f\n", t2 - t1);
        return 0;
    }
    struct model_config cfg = qwen3_shape(1, TINY_VOCAB);
    double layer = t2 - t1, N = (double)B * T, C = cfg.hidden_size, I = cfg.intermediate_size;
    double qd = (double)cfg.num_heads * cfg.head_dim, kvd = (double)cfg.num_kv_heads * cfg.head_dim;
    double params = C * qd + 2 * C * kvd + qd * C + 3 * C * I;
    double att = 3.5 * 4.0 * B * cfg.num_heads * (double)T * T * cfg.head_dim / 2.0;
    double flops = 6.0 * N * params + att;
    printf("decoder layer fwd+bwd: %.3f ms (2-layer minus 1-layer step), %.1f TFLOP/s (matmuls 6*N*P + attention)\n",
           layer, flops / layer * 1e-9);
    printf("RESULT layer_ms %.3f\n", layer);
    if (micro) {
        printf("recomputing the layer's activations adds %.3f ms; a middle micro-step with resident gradients: "
               "layer %.3f ms (%+.3f ms)\n", r2 - t2, a2 - a1, a2 - a1 - layer);
        printf("RESULT recompute_ms %.3f\nRESULT accumulating_layer_ms %.3f\n", r2 - t2, a2 - a1);
    }
    return 0;
}
