/* sd-logits: runs slidedp's CPU forward on an HF model directory and writes the logits, so tests
 * and the GPU host can compare them with transformers (tests/hf_check.py).
 * usage: sd-logits MODEL_DIR TOKENS.bin SEQ_LEN BATCH OUT.safetensors
 * TOKENS.bin is a token shard (any data format); rows are sequences 0..BATCH-1 of the order
 * contract. OUT holds "tokens" int32 [B,T] and "logits" fp32 [B,T,V]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/data.h"
#include "common/err.h"
#include "common/hf.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "common/safetensors.h"
#include "worker/backend.h"
#include "worker/model.h"
#include "worker/resident.h"

struct emit_buf {
    const void *data;
};

static int emit_bytes(void *arg, FILE *f, size_t n)
{
    const struct emit_buf *b = arg;
    return fwrite(b->data, 1, n, f) == n ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 6) {
        fprintf(stderr, "usage: sd-logits MODEL_DIR TOKENS.bin SEQ_LEN BATCH OUT.safetensors\n");
        return 2;
    }
    const char *dir = argv[1], *tokens_path = argv[2], *out = argv[5];
    int T = atoi(argv[3]), B = atoi(argv[4]);
    char cfg_path[4096];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    struct model_config cfg;
    struct backend be;
    struct resident_model rm;
    struct data_set data;
    if (model_config_load(cfg_path, &cfg) != 0 || backend_cpu_init(&be) != 0 ||
        resident_model_load(&rm, &be, &cfg, dir, B, T) != 0 ||
        data_open(tokens_path, T, cfg.vocab_size, false, 0, &data) != 0) {
        fprintf(stderr, "sd-logits: %s\n", sd_errmsg());
        return 2;
    }
    size_t N = (size_t)B * T, V = (size_t)cfg.vocab_size;
    int32_t *tokens = malloc(N * sizeof(int32_t)), *targets = malloc(N * sizeof(int32_t));
    int32_t *seq = malloc(((size_t)T + 1) * sizeof(int32_t));
    float *loss = malloc(N * sizeof(float)), *logits = malloc(N * V * sizeof(float));
    for (int b = 0; b < B; b++) {
        data_sequence(&data, b, seq, NULL);
        memcpy(tokens + (size_t)b * T, seq, sizeof(int32_t) * (size_t)T);
        memcpy(targets + (size_t)b * T, seq + 1, sizeof(int32_t) * (size_t)T);
    }
    model_eval(&rm.model, &rm.io, tokens, targets, loss, NULL, logits);
    double mean = 0;
    for (size_t i = 0; i < N; i++)
        mean += loss[i];
    printf("mean loss %.6f over %zu targets\n", mean / (double)N, N);
    struct emit_buf tb = {tokens}, lb = {logits};
    struct st_out_tensor outs[2] = {
        {.name = "tokens", .dtype = ST_I32, .ndim = 2, .shape = {B, T}, .emit = emit_bytes, .arg = &tb},
        {.name = "logits", .dtype = ST_F32, .ndim = 3, .shape = {B, T, (int64_t)V}, .emit = emit_bytes, .arg = &lb},
    };
    if (st_write(out, 2, outs) != 0) {
        fprintf(stderr, "sd-logits: %s\n", sd_errmsg());
        return 1;
    }
    return 0;
}
