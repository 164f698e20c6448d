/* Times one Qwen3 decoder layer, forward + backward, through worker/model.c on the CUDA backend:
 * the Qwen3-1.7B shape (hidden 2048, intermediate 6144, 16 heads) or, with argument `8b`, the
 * Qwen3-8B one (hidden 4096, intermediate 12288, 32 heads); 8 kv heads, head_dim 128, qk_norm,
 * B=2, T=4096. Runs a 1-layer and a 2-layer model with a tiny vocabulary, weights resident and
 * gradients left on the device, and reports the difference as the layer's time, so embedding,
 * head and loss drop out. Not a test; built when CUDA is. usage: bench_layer [1.7b|8b] */
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

static struct model_config qwen3_shape(int layers)
{
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.family = MODEL_QWEN3;
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    snprintf(c.architecture, sizeof c.architecture, "Qwen3ForCausalLM");
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "bfloat16");
    c.vocab_size = 256;
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
    c.tie_word_embeddings = true;
    return c;
}

/* Median ms of one train step of a model with `layers` layers; -1 on error. */
static double time_model(struct backend *be, int layers)
{
    struct model_config cfg = qwen3_shape(layers);
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
        model_train_step(&rm.model, &rm.io, tokens, targets, scale, loss, NULL);
        be->ops->synchronize(be);
        if (r >= 0)
            ms[r] = now_ms() - t0;
    }
    double mean_loss = 0;
    for (size_t i = 0; i < N; i++)
        mean_loss += loss[i] / (double)N;
    qsort(ms, REPS, sizeof ms[0], cmp_double);
    printf("model with %d layer(s): train step %.3f ms (median of %d), loss %.4f\n", layers, ms[REPS / 2], REPS,
           mean_loss);
    free(tokens), free(targets), free(scale), free(loss);
    resident_model_free(&rm);
    return isfinite(mean_loss) ? ms[REPS / 2] : -1;
}

int main(int argc, char **argv)
{
    eight_b = argc > 1 && !strcmp(argv[1], "8b");
    if (argc > 1 && !eight_b && strcmp(argv[1], "1.7b")) {
        fprintf(stderr, "usage: bench_layer [1.7b|8b]\n");
        return 2;
    }
    struct backend be;
    if (backend_cuda_init(&be, 0, 0) != 0) {
        fprintf(stderr, "bench_layer: %s\n", sd_errmsg());
        return 1;
    }
    printf("device %s, Qwen3-%s layer, B=%d T=%d\n", be.device_name, eight_b ? "8B" : "1.7B", B, T);
    double t1 = time_model(&be, 1), t2 = time_model(&be, 2);
    backend_cuda_free(&be);
    if (t1 < 0 || t2 < 0) {
        fprintf(stderr, "bench_layer: %s\n", sd_errmsg());
        return 1;
    }
    struct model_config cfg = qwen3_shape(1);
    double layer = t2 - t1, N = (double)B * T, C = cfg.hidden_size, I = cfg.intermediate_size;
    double qd = (double)cfg.num_heads * cfg.head_dim, kvd = (double)cfg.num_kv_heads * cfg.head_dim;
    double params = C * qd + 2 * C * kvd + qd * C + 3 * C * I;
    double att = 3.5 * 4.0 * B * cfg.num_heads * (double)T * T * cfg.head_dim / 2.0;
    double flops = 6.0 * N * params + att;
    printf("decoder layer fwd+bwd: %.3f ms (2-layer minus 1-layer step), %.1f TFLOP/s (matmuls 6*N*P + attention)\n",
           layer, flops / layer * 1e-9);
    printf("RESULT layer_ms %.3f\n", layer);
    return 0;
}
