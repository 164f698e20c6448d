/* Unit tests for common/model_config.c and common/hf.c: parsing real-shaped config.json files of
 * each family, refusing unsupported ones, loading tiny single-file and sharded checkpoints into a
 * layout, and exporting HF directories (fp32, bf16, tied, sharded). */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/bf16.h"
#include "common/err.h"
#include "common/hf.h"
#include "common/layout.h"
#include "common/model_config.h"
#include "common/safetensors.h"

/* ---- config.json ------------------------------------------------------------------------------ */

static const char QWEN3_1_7B[] = "{\n"
                                 "  \"architectures\": [\"Qwen3ForCausalLM\"],\n"
                                 "  \"attention_bias\": false,\n"
                                 "  \"attention_dropout\": 0.0,\n"
                                 "  \"bos_token_id\": 151643,\n"
                                 "  \"eos_token_id\": 151645,\n"
                                 "  \"head_dim\": 128,\n"
                                 "  \"hidden_act\": \"silu\",\n"
                                 "  \"hidden_size\": 2048,\n"
                                 "  \"initializer_range\": 0.02,\n"
                                 "  \"intermediate_size\": 6144,\n"
                                 "  \"max_position_embeddings\": 40960,\n"
                                 "  \"max_window_layers\": 28,\n"
                                 "  \"model_type\": \"qwen3\",\n"
                                 "  \"num_attention_heads\": 16,\n"
                                 "  \"num_hidden_layers\": 28,\n"
                                 "  \"num_key_value_heads\": 8,\n"
                                 "  \"rms_norm_eps\": 1e-06,\n"
                                 "  \"rope_scaling\": null,\n"
                                 "  \"rope_theta\": 1000000,\n"
                                 "  \"sliding_window\": null,\n"
                                 "  \"tie_word_embeddings\": true,\n"
                                 "  \"torch_dtype\": \"bfloat16\",\n"
                                 "  \"transformers_version\": \"4.51.0\",\n"
                                 "  \"use_cache\": true,\n"
                                 "  \"use_sliding_window\": false,\n"
                                 "  \"vocab_size\": 151936\n"
                                 "}\n";

static const char QWEN25_05B[] = "{\n"
                                 "  \"architectures\": [\"Qwen2ForCausalLM\"],\n"
                                 "  \"attention_dropout\": 0.0,\n"
                                 "  \"bos_token_id\": 151643,\n"
                                 "  \"eos_token_id\": 151643,\n"
                                 "  \"hidden_act\": \"silu\",\n"
                                 "  \"hidden_size\": 896,\n"
                                 "  \"initializer_range\": 0.02,\n"
                                 "  \"intermediate_size\": 4864,\n"
                                 "  \"max_position_embeddings\": 32768,\n"
                                 "  \"max_window_layers\": 24,\n"
                                 "  \"model_type\": \"qwen2\",\n"
                                 "  \"num_attention_heads\": 14,\n"
                                 "  \"num_hidden_layers\": 24,\n"
                                 "  \"num_key_value_heads\": 2,\n"
                                 "  \"rms_norm_eps\": 1e-06,\n"
                                 "  \"rope_theta\": 1000000.0,\n"
                                 "  \"sliding_window\": 32768,\n"
                                 "  \"tie_word_embeddings\": true,\n"
                                 "  \"torch_dtype\": \"bfloat16\",\n"
                                 "  \"transformers_version\": \"4.40.1\",\n"
                                 "  \"use_cache\": true,\n"
                                 "  \"use_sliding_window\": false,\n"
                                 "  \"vocab_size\": 151936\n"
                                 "}\n";

static const char LLAMA31_8B[] = "{\n"
                                 "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                 "  \"attention_bias\": false,\n"
                                 "  \"attention_dropout\": 0.0,\n"
                                 "  \"bos_token_id\": 128000,\n"
                                 "  \"eos_token_id\": 128001,\n"
                                 "  \"hidden_act\": \"silu\",\n"
                                 "  \"hidden_size\": 4096,\n"
                                 "  \"initializer_range\": 0.02,\n"
                                 "  \"intermediate_size\": 14336,\n"
                                 "  \"max_position_embeddings\": 131072,\n"
                                 "  \"mlp_bias\": false,\n"
                                 "  \"model_type\": \"llama\",\n"
                                 "  \"num_attention_heads\": 32,\n"
                                 "  \"num_hidden_layers\": 32,\n"
                                 "  \"num_key_value_heads\": 8,\n"
                                 "  \"pretraining_tp\": 1,\n"
                                 "  \"rms_norm_eps\": 1e-05,\n"
                                 "  \"rope_scaling\": {\n"
                                 "    \"factor\": 8.0,\n"
                                 "    \"low_freq_factor\": 1.0,\n"
                                 "    \"high_freq_factor\": 4.0,\n"
                                 "    \"original_max_position_embeddings\": 8192,\n"
                                 "    \"rope_type\": \"llama3\"\n"
                                 "  },\n"
                                 "  \"rope_theta\": 500000.0,\n"
                                 "  \"tie_word_embeddings\": false,\n"
                                 "  \"torch_dtype\": \"bfloat16\",\n"
                                 "  \"transformers_version\": \"4.43.0.dev0\",\n"
                                 "  \"use_cache\": true,\n"
                                 "  \"vocab_size\": 128256\n"
                                 "}\n";

/* Llama-3.2-1B as transformers 5 writes it: "dtype", and RoPE inside "rope_parameters". */
static const char LLAMA32_1B_TF5[] = "{\n"
                                     "  \"architectures\": [\"LlamaForCausalLM\"],\n"
                                     "  \"dtype\": \"float32\",\n"
                                     "  \"head_dim\": 64,\n"
                                     "  \"hidden_size\": 2048,\n"
                                     "  \"intermediate_size\": 8192,\n"
                                     "  \"max_position_embeddings\": 131072,\n"
                                     "  \"model_type\": \"llama\",\n"
                                     "  \"num_attention_heads\": 32,\n"
                                     "  \"num_hidden_layers\": 16,\n"
                                     "  \"num_key_value_heads\": 8,\n"
                                     "  \"rms_norm_eps\": 1e-05,\n"
                                     "  \"rope_parameters\": {\n"
                                     "    \"factor\": 32.0,\n"
                                     "    \"high_freq_factor\": 4.0,\n"
                                     "    \"low_freq_factor\": 1.0,\n"
                                     "    \"original_max_position_embeddings\": 8192,\n"
                                     "    \"rope_theta\": 500000.0,\n"
                                     "    \"rope_type\": \"llama3\"\n"
                                     "  },\n"
                                     "  \"tie_word_embeddings\": true,\n"
                                     "  \"transformers_version\": \"5.0.0\",\n"
                                     "  \"vocab_size\": 128256\n"
                                     "}\n";

/* A Qwen3 config.json exactly as transformers 5.17 save_pretrained writes it (tiny sizes). */
static const char QWEN3_TF5[] =
                                "{\n"
                                "  \"architectures\": [\n"
                                "    \"Qwen3ForCausalLM\"\n"
                                "  ],\n"
                                "  \"attention_bias\": false,\n"
                                "  \"attention_dropout\": 0.0,\n"
                                "  \"bos_token_id\": null,\n"
                                "  \"dtype\": \"bfloat16\",\n"
                                "  \"eos_token_id\": null,\n"
                                "  \"head_dim\": 16,\n"
                                "  \"hidden_act\": \"silu\",\n"
                                "  \"hidden_size\": 32,\n"
                                "  \"initializer_range\": 0.02,\n"
                                "  \"intermediate_size\": 48,\n"
                                "  \"layer_types\": [\n"
                                "    \"full_attention\",\n"
                                "    \"full_attention\"\n"
                                "  ],\n"
                                "  \"max_position_embeddings\": 32768,\n"
                                "  \"max_window_layers\": 28,\n"
                                "  \"model_type\": \"qwen3\",\n"
                                "  \"num_attention_heads\": 4,\n"
                                "  \"num_hidden_layers\": 2,\n"
                                "  \"num_key_value_heads\": 2,\n"
                                "  \"pad_token_id\": null,\n"
                                "  \"rms_norm_eps\": 1e-06,\n"
                                "  \"rope_parameters\": {\n"
                                "    \"rope_theta\": 10000.0,\n"
                                "    \"rope_type\": \"default\"\n"
                                "  },\n"
                                "  \"sliding_window\": null,\n"
                                "  \"tie_word_embeddings\": true,\n"
                                "  \"transformers_version\": \"5.17.0\",\n"
                                "  \"use_cache\": true,\n"
                                "  \"use_sliding_window\": false,\n"
                                "  \"vocab_size\": 96\n"
                                "}\n";

static void parse_ok(const char *text, struct model_config *c)
{
    if (model_config_parse(text, "config.json", c) != 0)
        fail_msg("parse failed: %s", sd_errmsg());
}

static void assert_cfg_equal(const struct model_config *a, const struct model_config *b)
{
    assert_int_equal(a->family, b->family);
    assert_string_equal(a->model_type, b->model_type);
    assert_string_equal(a->architecture, b->architecture);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->num_layers, b->num_layers);
    assert_int_equal(a->num_heads, b->num_heads);
    assert_int_equal(a->num_kv_heads, b->num_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_true(a->rope_theta == b->rope_theta);
    assert_true(a->initializer_range == b->initializer_range);
    assert_int_equal(a->rope_scaling.type, b->rope_scaling.type);
    assert_true(a->rope_scaling.factor == b->rope_scaling.factor);
    assert_true(a->rope_scaling.low_freq_factor == b->rope_scaling.low_freq_factor);
    assert_true(a->rope_scaling.high_freq_factor == b->rope_scaling.high_freq_factor);
    assert_int_equal(a->rope_scaling.original_max_position_embeddings, b->rope_scaling.original_max_position_embeddings);
    assert_int_equal(a->qk_norm, b->qk_norm);
    assert_int_equal(a->qkv_bias, b->qkv_bias);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_string_equal(a->torch_dtype, b->torch_dtype);
}

static void test_config_qwen3(void **state)
{
    struct model_config c;
    parse_ok(QWEN3_1_7B, &c);
    assert_int_equal(c.family, MODEL_QWEN3);
    assert_string_equal(c.model_type, "qwen3");
    assert_string_equal(c.architecture, "Qwen3ForCausalLM");
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.intermediate_size, 6144);
    assert_int_equal(c.num_layers, 28);
    assert_int_equal(c.num_heads, 16);
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.max_position_embeddings, 40960);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.rope_theta == 1e6);
    assert_true(c.initializer_range == 0.02);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_NONE);
    assert_true(c.qk_norm);
    assert_false(c.qkv_bias);
    assert_true(c.tie_word_embeddings);
    assert_string_equal(c.torch_dtype, "bfloat16");
    assert_int_equal(model_config_num_params(&c), 1720574976); /* Qwen3-1.7B: 1.72B */

    parse_ok(QWEN3_TF5, &c);
    assert_int_equal(c.family, MODEL_QWEN3);
    assert_int_equal(c.vocab_size, 96);
    assert_int_equal(c.hidden_size, 32);
    assert_int_equal(c.intermediate_size, 48);
    assert_int_equal(c.num_layers, 2);
    assert_int_equal(c.num_heads, 4);
    assert_int_equal(c.num_kv_heads, 2);
    assert_int_equal(c.head_dim, 16);
    assert_true(c.rope_theta == 10000.0);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_NONE);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.initializer_range == 0.02);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(c.tie_word_embeddings);
    assert_string_equal(c.torch_dtype, "bfloat16");
    assert_int_equal(model_config_num_params(&c), 24800); /* transformers' count for this model */
}

static void test_config_qwen2(void **state)
{
    struct model_config c;
    parse_ok(QWEN25_05B, &c);
    assert_int_equal(c.family, MODEL_QWEN2);
    assert_string_equal(c.model_type, "qwen2");
    assert_string_equal(c.architecture, "Qwen2ForCausalLM");
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 896);
    assert_int_equal(c.intermediate_size, 4864);
    assert_int_equal(c.num_layers, 24);
    assert_int_equal(c.num_heads, 14);
    assert_int_equal(c.num_kv_heads, 2);
    assert_int_equal(c.head_dim, 64); /* derived: 896 / 14 */
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.rope_theta == 1e6);
    assert_true(c.initializer_range == 0.02);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_NONE);
    assert_false(c.qk_norm);
    assert_true(c.qkv_bias);
    assert_true(c.tie_word_embeddings);
    assert_string_equal(c.torch_dtype, "bfloat16");
    assert_int_equal(model_config_num_params(&c), 494032768); /* Qwen2.5-0.5B */
}

static void test_config_llama(void **state)
{
    struct model_config c;
    parse_ok(LLAMA31_8B, &c);
    assert_int_equal(c.family, MODEL_LLAMA);
    assert_string_equal(c.model_type, "llama");
    assert_string_equal(c.architecture, "LlamaForCausalLM");
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.intermediate_size, 14336);
    assert_int_equal(c.num_layers, 32);
    assert_int_equal(c.num_heads, 32);
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.rope_theta == 500000.0);
    assert_true(c.initializer_range == 0.02);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_LLAMA3);
    assert_true(c.rope_scaling.factor == 8.0);
    assert_true(c.rope_scaling.low_freq_factor == 1.0);
    assert_true(c.rope_scaling.high_freq_factor == 4.0);
    assert_int_equal(c.rope_scaling.original_max_position_embeddings, 8192);
    assert_false(c.qk_norm);
    assert_false(c.qkv_bias);
    assert_false(c.tie_word_embeddings);
    assert_string_equal(c.torch_dtype, "bfloat16");
    assert_int_equal(model_config_num_params(&c), 8030261248ull); /* Llama-3.1-8B */

    parse_ok(LLAMA32_1B_TF5, &c);
    assert_int_equal(c.family, MODEL_LLAMA);
    assert_int_equal(c.hidden_size, 2048);
    assert_int_equal(c.num_layers, 16);
    assert_int_equal(c.num_heads, 32);
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_true(c.rope_theta == 500000.0);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_LLAMA3);
    assert_true(c.rope_scaling.factor == 32.0);
    assert_true(c.rope_scaling.low_freq_factor == 1.0);
    assert_true(c.rope_scaling.high_freq_factor == 4.0);
    assert_int_equal(c.rope_scaling.original_max_position_embeddings, 8192);
    assert_true(c.tie_word_embeddings);
    assert_string_equal(c.torch_dtype, "float32");
    assert_int_equal(model_config_num_params(&c), 1235814400); /* Llama-3.2-1B */
}

/* Absent optional fields take transformers' defaults for each family. */
static void test_config_defaults(void **state)
{
    struct model_config c;
    parse_ok("{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":4}",
             &c);
    assert_string_equal(c.architecture, "LlamaForCausalLM");
    assert_int_equal(c.num_kv_heads, 4);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.rope_theta == 10000.0);
    assert_true(c.initializer_range == 0.02);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_NONE);
    assert_false(c.tie_word_embeddings);
    assert_string_equal(c.torch_dtype, "bfloat16");

    /* Qwen3Config: head_dim 128 and num_key_value_heads 32 when absent */
    parse_ok("{\"model_type\":\"qwen3\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":32}",
             &c);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(c.num_kv_heads, 32);
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_true(c.qk_norm);
    /* null means "derive", as in transformers */
    parse_ok("{\"model_type\":\"qwen3\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":null,\"head_dim\":null}",
             &c);
    assert_int_equal(c.head_dim, 16);
    assert_int_equal(c.num_kv_heads, 4);
    /* Qwen2: head_dim derived, an explicit one honoured */
    parse_ok("{\"model_type\":\"qwen2\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,"
             "\"attention_bias\":false}",
             &c);
    assert_int_equal(c.head_dim, 32);
    assert_true(c.qkv_bias);
    assert_int_equal(model_config_num_params(&c),
                     100 * 64 * 2 + 2 * (2 * 64 + 128 * 64 + 2 * 64 * 64 + 64 * 128 + 3 * 128 * 64 + 128 + 2 * 64) + 64);
    /* rope_theta top-level with a default rope_scaling */
    parse_ok("{\"model_type\":\"llama\",\"vocab_size\":100,\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"rope_theta\":5e5,\"rope_scaling\":{\"type\":\"default\"},"
             "\"num_experts\":0}",
             &c);
    assert_true(c.rope_theta == 5e5);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_NONE);
}

struct refused_case {
    const char *model_type; /* base config family */
    const char *key;        /* field to set (or remove when value is NULL) */
    const char *value;      /* JSON text */
    const char *expect;     /* substring of the message */
};

static const struct refused_case refused[] = {
    {"qwen3", "model_type", "\"mistral\"", "field 'model_type' = \"mistral\" is not supported"},
    {"qwen3", "model_type", NULL, "missing required field 'model_type'"},
    {"qwen3", "architectures", "[\"Qwen2ForCausalLM\"]", "field 'architectures[0]' = \"Qwen2ForCausalLM\""},
    {"llama", "architectures", "[\"LlamaForSequenceClassification\"]", "'architectures[0]'"},
    {"qwen2", "use_sliding_window", "true", "field 'use_sliding_window' = true is not supported (sliding-window"},
    {"qwen3", "layer_types", "[\"full_attention\",\"sliding_attention\"]", "field 'layer_types[1]' = \"sliding_attention\""},
    {"qwen3", "layer_types", "[\"full_attention\"]", "'layer_types' has 1 entries but num_hidden_layers is 2"},
    {"qwen3", "num_experts", "8", "field 'num_experts' = 8 is not supported (mixture-of-experts"},
    {"llama", "num_local_experts", "8", "field 'num_local_experts' = 8"},
    {"qwen3", "num_experts_per_tok", "2", "field 'num_experts_per_tok' = 2"},
    {"qwen3", "moe_intermediate_size", "768", "field 'moe_intermediate_size' = 768"},
    {"llama", "attention_bias", "true", "field 'attention_bias' = true is not supported"},
    {"qwen3", "attention_bias", "true", "field 'attention_bias' = true is not supported"},
    {"llama", "mlp_bias", "true", "field 'mlp_bias' = true is not supported"},
    {"llama", "hidden_act", "\"gelu\"", "field 'hidden_act' = \"gelu\" is not supported"},
    {"llama", "rope_scaling", "{\"rope_type\":\"yarn\",\"factor\":4.0}", "field 'rope_scaling.rope_type' = \"yarn\""},
    {"llama", "rope_scaling", "{\"type\":\"linear\",\"factor\":2.0}", "field 'rope_scaling.type' = \"linear\""},
    {"llama", "rope_scaling", "{\"factor\":2.0}", "field 'rope_scaling' has no 'rope_type'"},
    {"llama", "rope_parameters", "{\"rope_type\":\"dynamic\",\"rope_theta\":10000}", "'rope_parameters.rope_type' = \"dynamic\""},
    {"llama", "rope_scaling", "{\"rope_type\":\"llama3\",\"low_freq_factor\":1,\"high_freq_factor\":4,"
                              "\"original_max_position_embeddings\":8192}",
     "missing required field 'rope_scaling.factor'"},
    {"llama", "rope_parameters", "{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,\"high_freq_factor\":4,"
                                 "\"original_max_position_embeddings\":8192}",
     "'rope_parameters.high_freq_factor' = 4 is not greater than low_freq_factor = 4"},
    {"llama", "rope_parameters", "{\"rope_type\":\"default\",\"rope_theta\":-1}", "'rope_parameters.rope_theta' = -1"},
    {"qwen3", "num_key_value_heads", "3", "'num_attention_heads' = 4 is not divisible by num_key_value_heads = 3"},
    {"qwen2", "num_key_value_heads", NULL, "num_key_value_heads = 32 (the default when the field is absent)"},
    {"llama", "head_dim", "15", "field 'head_dim' = 15 is odd"},
    {"llama", "hidden_size", "0", "field 'hidden_size' = 0 is not a positive integer"},
    {"qwen2", "vocab_size", "-5", "field 'vocab_size' = -5 is not a positive integer"},
    {"qwen2", "intermediate_size", NULL, "missing required field 'intermediate_size'"},
    {"qwen3", "num_hidden_layers", "\"28\"", "field 'num_hidden_layers' = \"28\" is not a positive integer"},
    {"qwen3", "num_attention_heads", "2.5", "field 'num_attention_heads' = 2.5 is not a positive integer"},
    {"qwen3", "tie_word_embeddings", "\"yes\"", "field 'tie_word_embeddings' = \"yes\" is not true or false"},
    {"qwen3", "rms_norm_eps", "0", "field 'rms_norm_eps' = 0 is not positive"},
    {"qwen3", "partial_rotary_factor", "0.5", "field 'partial_rotary_factor' = 0.5 is not supported"},
    {"llama", "torch_dtype", "7", "field 'torch_dtype' = 7 is not a dtype name"},
};

static char *tiny_config(const char *model_type, const char *key, const char *value)
{
    char base[512];
    snprintf(base, sizeof base,
             "{\"model_type\":\"%s\",\"vocab_size\":64,\"hidden_size\":32,\"intermediate_size\":48,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":8}",
             model_type);
    cJSON *root = cJSON_Parse(base);
    assert_non_null(root);
    cJSON_DeleteItemFromObjectCaseSensitive(root, key);
    if (value) {
        cJSON *v = cJSON_Parse(value);
        assert_non_null(v);
        cJSON_AddItemToObject(root, key, v);
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

static void test_config_refused(void **state)
{
    struct model_config c;
    static const char *const bases[] = {"qwen3", "qwen2", "llama"};
    for (int i = 0; i < 3; i++) { /* the base configs themselves are fine */
        char *text = tiny_config(bases[i], "unused", NULL);
        parse_ok(text, &c);
        free(text);
    }
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        const struct refused_case *r = &refused[i];
        char *text = tiny_config(r->model_type, r->key, r->value);
        int rc = model_config_parse(text, "m/config.json", &c);
        printf("# %s %s=%s -> %s\n", r->model_type, r->key, r->value ? r->value : "(absent)", rc ? sd_errmsg() : "ACCEPTED");
        assert_int_equal(rc, -1);
        assert_non_null(strstr(sd_errmsg(), "m/config.json: "));
        if (!strstr(sd_errmsg(), r->expect))
            fail_msg("case %zu: '%s' lacks '%s'", i, sd_errmsg(), r->expect);
        free(text);
    }
    assert_int_equal(model_config_parse("{\"model_type\": ", "x.json", &c), -1);
    assert_non_null(strstr(sd_errmsg(), "x.json: not valid JSON"));
    assert_int_equal(model_config_parse("{\"model_type\":\"llama\",\"model_type\":\"qwen3\"}", "x.json", &c), -1);
    assert_non_null(strstr(sd_errmsg(), "x.json: field 'model_type' appears twice"));
    assert_int_equal(model_config_parse("[1]", "x.json", &c), -1);
    assert_non_null(strstr(sd_errmsg(), "not a JSON object"));
    assert_int_equal(model_config_load("/nonexistent/config.json", &c), -1);
    assert_non_null(strstr(sd_errmsg(), "/nonexistent/config.json: cannot open"));
}

static void test_config_load_file(void **state)
{
    const char *dir = tu_tmpdir(0, "cfg-load");
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    tu_write_file(path, LLAMA31_8B);
    struct model_config c;
    assert_int_equal(model_config_load(path, &c), 0);
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.rope_scaling.type, ROPE_SCALING_LLAMA3);
    tu_write_file(path, "{\"model_type\":\"qwen3\",\"num_experts\":4}");
    assert_int_equal(model_config_load(path, &c), -1);
    assert_non_null(strstr(sd_errmsg(), path));
    assert_non_null(strstr(sd_errmsg(), "num_experts"));
    tu_rmrf(dir);
}

/* ---- tiny checkpoints ------------------------------------------------------------------------- */

static const char TINY_QWEN2[] = "{\"architectures\":[\"Qwen2ForCausalLM\"],\"model_type\":\"qwen2\",\"vocab_size\":40,"
                                 "\"hidden_size\":16,\"intermediate_size\":24,\"num_hidden_layers\":2,"
                                 "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"tie_word_embeddings\":false}";
static const char TINY_QWEN3_TIED[] = "{\"architectures\":[\"Qwen3ForCausalLM\"],\"model_type\":\"qwen3\",\"vocab_size\":40,"
                                      "\"hidden_size\":16,\"intermediate_size\":24,\"num_hidden_layers\":2,"
                                      "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":8,"
                                      "\"tie_word_embeddings\":true}";

struct tiny {
    struct model_config cfg;
    struct layout lay;
    float *params; /* random values in every tensor, zero padding */
};

static void tiny_init(struct tiny *t, const char *config, uint64_t seed)
{
    parse_ok(config, &t->cfg);
    assert_int_equal(layout_build(&t->cfg, 1, &t->lay), 0);
    assert_int_equal(t->lay.num_params, (int64_t)model_config_num_params(&t->cfg));
    t->params = calloc((size_t)t->lay.total_numel, sizeof(float));
    uint64_t s = tu_seed("tiny model", seed);
    for (int i = 0; i < t->lay.num_tensors; i++)
        tu_fill_uniform(t->params + t->lay.tensors[i].offset, (size_t)t->lay.tensors[i].numel, &s, -2, 2);
}

static void tiny_free(struct tiny *t)
{
    layout_free(&t->lay);
    free(t->params);
}

/* A tensor to put in a fixture file: data converted from fp32 on the fly. */
struct fx {
    char name[LAYOUT_NAME_MAX];
    enum st_dtype dtype;
    int ndim;
    int64_t shape[2];
    const float *src;
    int64_t numel;
};

static int emit_fx(void *arg, FILE *f, size_t nbytes)
{
    const struct fx *x = arg;
    for (int64_t i = 0; i < x->numel; i++) {
        uint16_t h;
        int32_t v;
        switch (x->dtype) {
        case ST_F32:
            fwrite(&x->src[i], 4, 1, f);
            break;
        case ST_BF16:
            h = f32_to_bf16(x->src[i]);
            fwrite(&h, 2, 1, f);
            break;
        case ST_F16:
            h = f32_to_f16(x->src[i]);
            fwrite(&h, 2, 1, f);
            break;
        default:
            v = (int32_t)x->src[i];
            fwrite(&v, 4, 1, f);
            break;
        }
    }
    return 0;
}

/* One fixture entry per layout tensor, in layout order. Returns the count; room for 4 extras. */
static int fx_from_layout(const struct tiny *t, enum st_dtype dtype, struct fx **out)
{
    struct fx *v = calloc((size_t)t->lay.num_tensors + 4, sizeof *v);
    for (int i = 0; i < t->lay.num_tensors; i++) {
        const struct tensor_desc *d = &t->lay.tensors[i];
        snprintf(v[i].name, sizeof v[i].name, "%s", d->name);
        v[i].dtype = dtype;
        v[i].ndim = d->ndim;
        v[i].shape[0] = d->shape[0];
        v[i].shape[1] = d->shape[1];
        v[i].src = t->params + d->offset;
        v[i].numel = d->numel;
    }
    *out = v;
    return t->lay.num_tensors;
}

static int fx_index(const struct fx *v, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(v[i].name, name))
            return i;
    fail_msg("no fixture tensor %s", name);
    return -1;
}

static void fx_write(const char *path, const struct fx *v, int n)
{
    struct st_out_tensor *ts = calloc((size_t)n + 1, sizeof *ts);
    for (int i = 0; i < n; i++) {
        ts[i].name = v[i].name;
        ts[i].dtype = v[i].dtype;
        ts[i].ndim = v[i].ndim;
        ts[i].shape[0] = v[i].shape[0];
        ts[i].shape[1] = v[i].shape[1];
        ts[i].emit = emit_fx;
        ts[i].arg = (void *)&v[i];
    }
    if (st_write(path, n, ts) != 0)
        fail_msg("st_write: %s", sd_errmsg());
    free(ts);
}

static void write_single(const char *dir, const struct fx *v, int n)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    fx_write(path, v, n);
}

/* Two shards split at tensor `split`, and an index mapping every tensor to its shard except that
 * tensor `misname` (when >= 0) is mapped to the other one. */
static void write_sharded(const char *dir, const struct fx *v, int n, int split, int misname)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/model-00001-of-00002.safetensors", dir);
    fx_write(path, v, split);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    fx_write(path, v + split, n - split);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"metadata\":{\"total_size\":0},\"weight_map\":{");
    for (int i = 0; i < n; i++) {
        int shard = (i < split) ^ (i == misname) ? 1 : 2;
        fprintf(f, "%s\"%s\":\"model-%05d-of-00002.safetensors\"", i ? "," : "", v[i].name, shard);
    }
    fprintf(f, "}}");
    fclose(f);
}

static float *load_dir(const char *dir, const struct tiny *t, int *rc)
{
    struct hf_weights w;
    float *p = calloc((size_t)t->lay.total_numel, sizeof(float));
    *rc = hf_weights_open(dir, &w);
    if (*rc == 0) {
        *rc = hf_weights_load(&w, &t->lay, p);
        hf_weights_close(&w);
    }
    return p;
}

static void expect_load_error(const char *dir, const struct tiny *t, const char *what1, const char *what2)
{
    int rc;
    float *p = load_dir(dir, t, &rc);
    printf("# load error: %s\n", rc ? sd_errmsg() : "none");
    assert_int_equal(rc, -1);
    if (!strstr(sd_errmsg(), what1) || (what2 && !strstr(sd_errmsg(), what2)))
        fail_msg("'%s' lacks '%s' / '%s'", sd_errmsg(), what1, what2 ? what2 : "");
    free(p);
}

static void assert_params_equal(const struct tiny *t, const float *p, bool bf16)
{
    for (int i = 0; i < t->lay.num_tensors; i++) {
        const struct tensor_desc *d = &t->lay.tensors[i];
        for (int64_t k = 0; k < d->numel; k++) {
            float want = t->params[d->offset + k];
            if (bf16)
                want = f32_round_bf16(want);
            if (memcmp(&want, &p[d->offset + k], 4))
                fail_msg("%s[%lld]: %g != %g", d->name, (long long)k, p[d->offset + k], want);
        }
    }
}

static void test_load_single(void **state)
{
    const char *dir = tu_tmpdir(0, "hf-load1");
    struct tiny t;
    tiny_init(&t, TINY_QWEN2, 7);
    struct fx *v;
    int n = fx_from_layout(&t, ST_F32, &v);
    write_single(dir, v, n);
    int rc;
    float *p = load_dir(dir, &t, &rc);
    assert_int_equal(rc, 0);
    assert_params_equal(&t, p, false);
    free(p);

    /* bf16 and f16 checkpoints convert exactly */
    for (int i = 0; i < n; i++)
        v[i].dtype = ST_BF16;
    write_single(dir, v, n);
    p = load_dir(dir, &t, &rc);
    assert_int_equal(rc, 0);
    assert_params_equal(&t, p, true);
    free(p);
    int q = fx_index(v, n, "model.layers.0.self_attn.q_proj.bias");
    v[q].dtype = ST_F16;
    write_single(dir, v, n);
    p = load_dir(dir, &t, &rc);
    assert_int_equal(rc, 0);
    for (int64_t k = 0; k < t.lay.tensors[q].numel; k++)
        assert_true(p[t.lay.tensors[q].offset + k] == f16_to_f32(f32_to_f16(t.params[t.lay.tensors[q].offset + k])));
    free(p);
    free(v);
    tiny_free(&t);
    tu_rmrf(dir);
}

static void test_load_sharded_and_tied(void **state)
{
    const char *dir = tu_tmpdir(0, "hf-load2");
    struct tiny t;
    tiny_init(&t, TINY_QWEN3_TIED, 8);
    struct fx *v;
    int n = fx_from_layout(&t, ST_F32, &v);
    /* tolerated extras: a tied model's lm_head copy and rotary buffers */
    v[n] = v[0];
    snprintf(v[n].name, sizeof v[n].name, "lm_head.weight");
    n++;
    v[n] = v[1];
    v[n].ndim = 1;
    v[n].shape[0] = 4;
    v[n].numel = 4;
    snprintf(v[n].name, sizeof v[n].name, "model.layers.0.self_attn.rotary_emb.inv_freq");
    n++;
    write_sharded(dir, v, n, 9, -1);
    int rc;
    float *p = load_dir(dir, &t, &rc);
    if (rc)
        fail_msg("%s", sd_errmsg());
    assert_params_equal(&t, p, false);
    free(p);

    struct hf_weights w;
    assert_int_equal(hf_weights_open(dir, &w), 0);
    assert_int_equal(w.num_files, 2);
    assert_non_null(hf_weights_find(&w, "model.norm.weight"));
    assert_non_null(hf_weights_find(&w, "model.embed_tokens.weight"));
    assert_null(hf_weights_find(&w, "model.layers.9.mlp.up_proj.weight"));
    hf_weights_close(&w);
    free(v);
    tiny_free(&t);
    tu_rmrf(dir);
}

static void test_load_errors(void **state)
{
    const char *dir = tu_tmpdir(0, "hf-lerr");
    struct tiny t;
    tiny_init(&t, TINY_QWEN2, 9);
    struct fx *v;
    int n = fx_from_layout(&t, ST_F32, &v);
    char path[1100];

    expect_load_error(dir, &t, "no model.safetensors or model.safetensors.index.json", dir);

    /* missing tensor */
    int up = fx_index(v, n, "model.layers.1.mlp.up_proj.weight");
    struct fx saved = v[up];
    v[up] = v[n - 1];
    write_single(dir, v, n - 1);
    expect_load_error(dir, &t, "missing tensor 'model.layers.1.mlp.up_proj.weight'", "model.safetensors");
    v[up] = saved;

    /* wrong shape, same element count */
    int k = fx_index(v, n, "model.layers.0.self_attn.k_proj.weight");
    v[k].shape[0] = 16;
    v[k].shape[1] = 8;
    write_single(dir, v, n);
    expect_load_error(dir, &t, "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [16, 8], the config needs [8, 16]",
                      NULL);
    v[k].shape[0] = 8;
    v[k].shape[1] = 16;

    /* a tensor the model does not have (lm_head of an untied model is required, not tolerated) */
    v[n] = v[0];
    snprintf(v[n].name, sizeof v[n].name, "model.layers.0.mlp.extra.weight");
    write_single(dir, v, n + 1);
    expect_load_error(dir, &t, "unexpected tensor 'model.layers.0.mlp.extra.weight'", NULL);

    /* integer dtype */
    int norm = fx_index(v, n, "model.norm.weight");
    v[norm].dtype = ST_I32;
    write_single(dir, v, n);
    expect_load_error(dir, &t, "tensor 'model.norm.weight' has dtype I32", NULL);
    v[norm].dtype = ST_F32;

    /* sharded: a shard is missing */
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    write_sharded(dir, v, n, 5, -1);
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    unlink(path);
    expect_load_error(dir, &t, "model-00002-of-00002.safetensors: cannot open", "model.safetensors.index.json");

    /* the index maps a tensor to the wrong shard */
    write_sharded(dir, v, n, 5, 7);
    expect_load_error(dir, &t, v[7].name, "model-00001-of-00002.safetensors");

    /* a shard holds a tensor the index does not list */
    write_sharded(dir, v, n, 5, -1);
    v[n] = v[0];
    snprintf(v[n].name, sizeof v[n].name, "stowaway");
    snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", dir);
    struct fx *second = calloc((size_t)(n - 5 + 1), sizeof *second);
    memcpy(second, v + 5, (size_t)(n - 5 + 1) * sizeof *second);
    fx_write(path, second, n - 5 + 1);
    expect_load_error(dir, &t, "holds tensor 'stowaway' which", "does not list");
    free(second);

    /* an index that is not JSON */
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    tu_write_file(path, "{\"weight_map\": ");
    expect_load_error(dir, &t, "model.safetensors.index.json: not valid JSON", NULL);
    tu_write_file(path, "{\"weight_map\": {\"a\": \"../x.safetensors\"}}");
    expect_load_error(dir, &t, "is not a plain file name", NULL);

    free(v);
    tiny_free(&t);
    tu_rmrf(dir);
}

/* ---- export ----------------------------------------------------------------------------------- */

static void count_files(const char *dir, int *n)
{
    char *out = NULL;
    assert_int_equal(tu_sh(&out, "ls '%s' | wc -l", dir), 0);
    *n = atoi(out);
    free(out);
}

static void test_export_fp32(void **state)
{
    const char *dir = tu_tmpdir(0, "hf-exp32");
    struct tiny t;
    tiny_init(&t, TINY_QWEN2, 10);
    char src[1100], out[1100], path[1200];
    snprintf(src, sizeof src, "%s/src-config.json", dir);
    tu_write_file(src, TINY_QWEN2);
    snprintf(out, sizeof out, "%s/final", dir);
    assert_int_equal(hf_export(out, src, &t.cfg, &t.lay, t.params, HF_EXPORT_FP32, 1ull << 30), 0);

    struct stat st;
    assert_int_equal(stat(out, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0755);
    int nfiles;
    count_files(out, &nfiles);
    assert_int_equal(nfiles, 2); /* config.json + model.safetensors */
    snprintf(path, sizeof path, "%s/config.json", out);
    /* copied as it was, but for the dtype of the weights (added: the source names none) */
    char *copied = tu_read_file(path, NULL), want[1024];
    snprintf(want, sizeof want, "{\n  \"torch_dtype\": \"float32\",%s", TINY_QWEN2 + 1);
    assert_string_equal(copied, want);
    free(copied);
    /* a source naming a dtype (both spellings, transformers 4 and 5) gets the export's in its place */
    char *named = NULL;
    assert_int_equal(tu_sh(&named, "printf '%%s' '%.*s, \"torch_dtype\" : \"bfloat16\", \"dtype\":\"bfloat16\"}' > %s",
                           (int)strlen(TINY_QWEN2) - 1, TINY_QWEN2, src), 0);
    free(named);
    snprintf(path, sizeof path, "%s/named", dir);
    assert_int_equal(hf_export(path, src, &t.cfg, &t.lay, t.params, HF_EXPORT_FP32, 1ull << 30), 0);
    snprintf(path, sizeof path, "%s/named/config.json", dir);
    copied = tu_read_file(path, NULL);
    snprintf(want, sizeof want, "%.*s, \"torch_dtype\" : \"float32\", \"dtype\":\"float32\"}", (int)strlen(TINY_QWEN2) - 1,
             TINY_QWEN2);
    assert_string_equal(copied, want);
    free(copied);

    snprintf(path, sizeof path, "%s/model.safetensors", out);
    struct st_file f;
    assert_int_equal(st_open(path, &f), 0);
    assert_string_equal(f.metadata_format, "pt");
    assert_int_equal(f.num_tensors, t.lay.num_tensors);
    for (int i = 0; i < f.num_tensors; i++) {
        const struct tensor_desc *d = &t.lay.tensors[i];
        assert_string_equal(f.tensors[i].name, d->name); /* layout order */
        assert_int_equal(f.tensors[i].dtype, ST_F32);
        assert_int_equal(f.tensors[i].ndim, d->ndim);
        for (int k = 0; k < d->ndim; k++)
            assert_int_equal(f.tensors[i].shape[k], d->shape[k]);
        assert_memory_equal(f.tensors[i].data, t.params + d->offset, (size_t)d->numel * 4);
    }
    assert_non_null(st_find(&f, "lm_head.weight"));
    assert_non_null(st_find(&f, "model.layers.1.self_attn.v_proj.bias"));
    assert_null(st_find(&f, "model.layers.1.self_attn.o_proj.bias"));
    st_close(&f);

    /* refuses an existing directory and leaves it alone */
    assert_int_equal(hf_export(out, src, &t.cfg, &t.lay, t.params, HF_EXPORT_FP32, 1ull << 30), -1);
    assert_non_null(strstr(sd_errmsg(), "already exists"));
    assert_non_null(strstr(sd_errmsg(), out));
    count_files(out, &nfiles);
    assert_int_equal(nfiles, 2);

    /* a failed export removes what it wrote */
    snprintf(path, sizeof path, "%s/final2", dir);
    assert_int_equal(hf_export(path, "/nonexistent/config.json", &t.cfg, &t.lay, t.params, HF_EXPORT_FP32, 0), -1);
    assert_non_null(strstr(sd_errmsg(), "/nonexistent/config.json"));
    assert_false(tu_exists(path));
    tiny_free(&t);
    tu_rmrf(dir);
}

static void test_export_bf16_tied(void **state)
{
    const char *dir = tu_tmpdir(0, "hf-exp16");
    struct tiny t;
    tiny_init(&t, TINY_QWEN3_TIED, 11);
    /* rounding cases at the start of the embedding: ties go to even, NaN stays NaN */
    static const float special[] = {1.00390625f, 1.01171875f, -0.0f, INFINITY, -1.00390625f, 3.4e38f, 1e-40f};
    static const uint16_t expect[] = {0x3f80, 0x3f82, 0x8000, 0x7f80, 0xbf80, 0x7f80, 0x0001};
    int ns = (int)(sizeof special / sizeof special[0]);
    memcpy(t.params, special, sizeof special);
    t.params[ns] = NAN;
    char out[1100], path[1200];
    snprintf(out, sizeof out, "%s/final", dir);
    assert_int_equal(hf_export(out, NULL, &t.cfg, &t.lay, t.params, HF_EXPORT_BF16, 0), 0);

    snprintf(path, sizeof path, "%s/model.safetensors", out);
    struct st_file f;
    assert_int_equal(st_open(path, &f), 0);
    assert_int_equal(f.num_tensors, t.lay.num_tensors);
    assert_null(st_find(&f, "lm_head.weight")); /* tied: the embedding is stored once */
    const struct st_tensor *emb = st_find(&f, "model.embed_tokens.weight");
    assert_non_null(emb);
    assert_int_equal(emb->dtype, ST_BF16);
    assert_int_equal(emb->shape[0], 40);
    assert_int_equal(emb->shape[1], 16);
    assert_non_null(st_find(&f, "model.layers.1.self_attn.k_norm.weight"));
    const uint8_t *raw = emb->data;
    for (int i = 0; i < ns; i++) {
        uint16_t h;
        memcpy(&h, raw + 2 * i, 2);
        if (h != expect[i])
            fail_msg("bf16 of %g: 0x%04x, expected 0x%04x", special[i], h, expect[i]);
    }
    uint16_t h;
    memcpy(&h, raw + 2 * ns, 2);
    assert_true((h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0);
    for (int i = 0; i < f.num_tensors; i++) {
        const struct tensor_desc *d = &t.lay.tensors[i];
        for (int64_t k = 0; k < d->numel; k++) {
            memcpy(&h, (const uint8_t *)f.tensors[i].data + 2 * k, 2);
            assert_int_equal(h, f32_to_bf16(t.params[d->offset + k]));
        }
    }
    st_close(&f);

    /* the generated config.json describes the same model */
    snprintf(path, sizeof path, "%s/config.json", out);
    struct model_config back;
    if (model_config_load(path, &back) != 0)
        fail_msg("%s", sd_errmsg());
    assert_cfg_equal(&back, &t.cfg);

    /* and the directory loads back */
    t.params[ns] = 0; /* NaN compares unequal */
    int rc;
    float *p = load_dir(out, &t, &rc);
    assert_int_equal(rc, 0);
    p[t.lay.tensors[0].offset + ns] = 0;
    assert_params_equal(&t, p, true);
    free(p);
    tiny_free(&t);
    tu_rmrf(dir);
}

static void test_export_sharded(void **state)
{
    const char *dir = tu_tmpdir(0, "hf-expsh");
    struct tiny t;
    tiny_init(&t, TINY_QWEN2, 12);
    char out[1100], path[1200];
    snprintf(out, sizeof out, "%s/final", dir);
    size_t max_shard = 3000; /* fp32: the 2560-byte embedding and lm_head each fill a shard */
    assert_int_equal(hf_export(out, NULL, &t.cfg, &t.lay, t.params, HF_EXPORT_FP32, max_shard), 0);

    snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
    char *text = tu_read_file(path, NULL);
    assert_non_null(text);
    assert_non_null(strstr(text, "{\n  \"metadata\": {\n    \"total_parameters\": ")); /* 2-space indent */
    cJSON *root = cJSON_Parse(text);
    assert_non_null(root);
    const cJSON *wm = cJSON_GetObjectItem(root, "weight_map");
    const cJSON *ts = cJSON_GetObjectItem(cJSON_GetObjectItem(root, "metadata"), "total_size");
    assert_int_equal(cJSON_GetArraySize(wm), t.lay.num_tensors);
    assert_true(ts->valuedouble == (double)t.lay.num_params * 4);
    assert_true(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "metadata"), "total_parameters")->valuedouble ==
                (double)t.lay.num_params);
    /* keys sorted, as transformers writes them */
    for (const cJSON *e = wm->child; e && e->next; e = e->next)
        assert_true(strcmp(e->string, e->next->string) < 0);

    int shards = 0;
    const char *last = cJSON_GetObjectItem(wm, "lm_head.weight")->valuestring;
    assert_int_equal(sscanf(last, "model-%*5d-of-%5d.safetensors", &shards), 1);
    assert_true(shards > 2);
    char first[64];
    snprintf(first, sizeof first, "model-00001-of-%05d.safetensors", shards);
    assert_string_equal(cJSON_GetObjectItem(wm, "model.embed_tokens.weight")->valuestring, first);
    int nfiles;
    count_files(out, &nfiles);
    assert_int_equal(nfiles, shards + 2);
    uint64_t sum = 0;
    for (int s = 1; s <= shards; s++) {
        snprintf(path, sizeof path, "%s/model-%05d-of-%05d.safetensors", out, s, shards);
        struct st_file f;
        assert_int_equal(st_open(path, &f), 0);
        uint64_t bytes = 0;
        for (int i = 0; i < f.num_tensors; i++) {
            bytes += f.tensors[i].nbytes;
            const char *file = cJSON_GetObjectItem(wm, f.tensors[i].name)->valuestring;
            assert_string_equal(file, path + strlen(out) + 1);
        }
        assert_true(bytes <= max_shard || f.num_tensors == 1);
        sum += bytes;
        st_close(&f);
    }
    assert_true((double)sum == ts->valuedouble);
    cJSON_Delete(root);
    free(text);

    int rc;
    float *p = load_dir(out, &t, &rc);
    if (rc)
        fail_msg("%s", sd_errmsg());
    assert_params_equal(&t, p, false);
    free(p);
    tiny_free(&t);
    tu_rmrf(dir);
}

/* hf_config_write produces a config that parses back to the same model_config, for every family. */
static void test_config_write_round_trip(void **state)
{
    const char *dir = tu_tmpdir(0, "hf-cfgw");
    const char *texts[] = {QWEN3_1_7B, QWEN25_05B, LLAMA31_8B, LLAMA32_1B_TF5, QWEN3_TF5};
    char path[1100];
    snprintf(path, sizeof path, "%s/config.json", dir);
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        struct model_config c, back;
        parse_ok(texts[i], &c);
        assert_int_equal(hf_config_write(path, &c), 0);
        if (model_config_load(path, &back) != 0)
            fail_msg("%s", sd_errmsg());
        assert_cfg_equal(&back, &c);
        char *text = tu_read_file(path, NULL);
        assert_non_null(strstr(text, "\n  \"hidden_act\": \"silu\",\n"));
        assert_non_null(strstr(text, "\"architectures\": [\n    \""));
        if (c.family == MODEL_LLAMA) {
            assert_non_null(strstr(text, "\"rope_theta\": 500000.0,"));
            assert_non_null(strstr(text, "\"rms_norm_eps\": 1e-05,"));
            assert_non_null(strstr(text, "\"rope_type\": \"llama3\""));
            assert_null(strstr(text, "use_sliding_window"));
        } else {
            assert_non_null(strstr(text, "\"use_sliding_window\": false,"));
            assert_non_null(strstr(text, "\"rope_scaling\": null,"));
        }
        free(text);
    }
    tu_rmrf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_qwen3),
        cmocka_unit_test(test_config_qwen2),
        cmocka_unit_test(test_config_llama),
        cmocka_unit_test(test_config_defaults),
        cmocka_unit_test(test_config_refused),
        cmocka_unit_test(test_config_load_file),
        cmocka_unit_test(test_load_single),
        cmocka_unit_test(test_load_sharded_and_tied),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_export_fp32),
        cmocka_unit_test(test_export_bf16_tied),
        cmocka_unit_test(test_export_sharded),
        cmocka_unit_test(test_config_write_round_trip),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
