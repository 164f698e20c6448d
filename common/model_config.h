/* The decoder architecture of one HF checkpoint (Qwen3, Qwen2/2.5, Llama 3): parsed from
 * config.json by the launcher and tests, stored by value in the ctl region for every process. */
#ifndef SD_MODEL_CONFIG_H
#define SD_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

enum model_family {
    MODEL_QWEN3 = 1, /* q_norm/k_norm per head, no biases */
    MODEL_QWEN2 = 2, /* q/k/v biases */
    MODEL_LLAMA = 3, /* Llama 3 / 3.1 / 3.2, optional llama3 rope scaling */
};

enum rope_scaling_type {
    ROPE_SCALING_NONE = 0,
    ROPE_SCALING_LLAMA3 = 1,
};

struct rope_scaling {
    enum rope_scaling_type type;
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    int original_max_position_embeddings;
};

struct model_config {
    enum model_family family;
    char model_type[32];   /* as in config.json: qwen3 | qwen2 | llama */
    char architecture[64]; /* architectures[0], e.g. Qwen3ForCausalLM */
    int vocab_size;
    int hidden_size;
    int intermediate_size;
    int num_layers;
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int max_position_embeddings;
    double rms_norm_eps;
    double rope_theta;
    double initializer_range;
    struct rope_scaling rope_scaling;
    bool qk_norm;             /* Qwen3 */
    bool qkv_bias;            /* Qwen2 */
    bool tie_word_embeddings;
    char torch_dtype[16];     /* dtype recorded in config.json ("bfloat16" when absent) */
};

/* Parses an HF config.json. Unsupported architectures and fields (other model_type, sliding-window
 * layers, MoE, biases we do not model) fail with a message naming the field. */
int model_config_load(const char *config_json_path, struct model_config *out);
int model_config_parse(const char *json_text, const char *what, struct model_config *out);

/* Writes a one-line warning into out and returns true when seq_len is above the positions the
 * model was trained for. Not a refusal: longer sequences are how a context is extended (RoPE takes
 * any position), and the benchmarks train 32K-262K sequences of a 40K model. */
bool model_config_seq_len_warning(const struct model_config *cfg, int seq_len, char *out, size_t len);

/* Total number of trainable parameters (tied embeddings counted once). */
size_t model_config_num_params(const struct model_config *cfg);

#endif
