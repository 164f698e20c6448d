/* HF model directories: load weights (model.safetensors or a sharded index) into the fp32
 * parameter space of a layout, and export the parameter space as an HF directory that
 * transformers loads (config.json copied, HF tensor names, tied weights stored once). */
#ifndef SD_HF_H
#define SD_HF_H

#include <stddef.h>
#include <stdint.h>

#include "layout.h"
#include "model_config.h"
#include "safetensors.h"

/* All safetensors files of an HF directory: model.safetensors, or the shards named in
 * model.safetensors.index.json (every shard must exist and hold exactly the tensors the index
 * maps to it). */
struct hf_weights {
    int num_files;
    struct st_file *files;
};

int hf_weights_open(const char *model_dir, struct hf_weights *out);
void hf_weights_close(struct hf_weights *w);
const struct st_tensor *hf_weights_find(const struct hf_weights *w, const char *name);

/* Checks every tensor of the layout is present with the right shape and a float dtype, and that
 * the files hold nothing else (tolerated: lm_head.weight of a tied model, rotary inv_freq
 * buffers). Then converts each into params_f32 + tensor.offset. */
int hf_weights_load(const struct hf_weights *w, const struct layout *lay, float *params_f32);

enum hf_export_dtype { HF_EXPORT_BF16 = 0, HF_EXPORT_FP32 = 1 };

/* Writes an HF directory at out_dir (which must not exist; the caller renames a temp dir into
 * place): config.json copied from config_json_src (or, if NULL, generated from cfg), weights from
 * params_f32 (the layout's parameter space) as model.safetensors, or as shards of at most
 * max_shard_bytes with model.safetensors.index.json when larger. */
int hf_export(const char *out_dir, const char *config_json_src, const struct model_config *cfg,
              const struct layout *lay, const float *params_f32, enum hf_export_dtype dtype,
              size_t max_shard_bytes);

/* Copies the tokenizer and generation files that exist in model_dir (tokenizer.json,
 * tokenizer_config.json, generation_config.json, special_tokens_map.json, the vocab/merges/
 * sentencepiece files, chat templates) into out_dir byte for byte, so that an export or a
 * checkpoint is a model directory transformers loads with its tokenizer. */
int hf_copy_tokenizer_files(const char *model_dir, const char *out_dir);

/* Writes a config.json describing cfg (used for random-init jobs without a source config). */
int hf_config_write(const char *path, const struct model_config *cfg);

#endif
