/* Parameter layout: every trainable tensor in execution order, with its offset (in elements) in
 * the flat parameter space shared by params16, master, m, v and the gradient accumulator, and the
 * chunks (units of streaming, gradient posting and optimizer ownership) that group whole tensors.
 * Offsets, never pointers: the table is copied into the ctl region and read by every process. */
#ifndef SD_LAYOUT_H
#define SD_LAYOUT_H

#include <stdbool.h>
#include <stdint.h>

#include "model_config.h"

enum tensor_kind {
    TENSOR_EMBED = 0,     /* model.embed_tokens.weight [V, C] */
    TENSOR_ATTN_NORM,     /* input_layernorm.weight [C] */
    TENSOR_Q,             /* q_proj.weight [Hq*D, C] */
    TENSOR_Q_BIAS,        /* [Hq*D] */
    TENSOR_K,             /* [Hkv*D, C] */
    TENSOR_K_BIAS,
    TENSOR_V,
    TENSOR_V_BIAS,
    TENSOR_Q_NORM,        /* [D] */
    TENSOR_K_NORM,        /* [D] */
    TENSOR_O,             /* o_proj.weight [C, Hq*D] */
    TENSOR_MLP_NORM,      /* post_attention_layernorm.weight [C] */
    TENSOR_GATE,          /* [I, C] */
    TENSOR_UP,            /* [I, C] */
    TENSOR_DOWN,          /* [C, I] */
    TENSOR_FINAL_NORM,    /* model.norm.weight [C] */
    TENSOR_LM_HEAD,       /* lm_head.weight [V, C], absent when tied */
    TENSOR_KIND_COUNT
};

#define LAYOUT_NAME_MAX 96
/* Tensor offsets are aligned to this many elements (256 bytes of fp32) for SIMD and DMA. */
#define LAYOUT_TENSOR_ALIGN 64
/* 8-bit optimizer state: elements sharing one scale byte ([train] optimizer_state = 8bit); the
 * tensor alignment, so no block straddles two tensors and block b's scale is at offset / 64. */
#define STATE8_BLOCK LAYOUT_TENSOR_ALIGN
/* Chunk offsets are aligned to this many elements (one 4 KiB page of bf16, two of fp32). */
#define LAYOUT_CHUNK_ALIGN 2048

struct tensor_desc {
    char name[LAYOUT_NAME_MAX]; /* HF name, e.g. model.layers.3.self_attn.q_proj.weight */
    int kind;                   /* enum tensor_kind */
    int layer;                  /* -1 for embed, final norm and lm_head */
    int ndim;                   /* 1 or 2 */
    int64_t shape[2];
    int64_t offset;             /* elements from the start of the parameter space */
    int64_t numel;
    int chunk;
    bool decay;                 /* weight decay applies (2+ dims) */
};

enum chunk_kind {
    CHUNK_EMBED = 0,  /* the embedding (also the LM head when tied) */
    CHUNK_LAYERS = 1, /* a run of whole decoder layers */
    CHUNK_HEAD = 2,   /* final norm and, when untied, lm_head */
};

struct chunk_desc {
    int kind;         /* enum chunk_kind */
    int first_layer;  /* CHUNK_LAYERS: [first_layer, first_layer + num_layers) */
    int num_layers;
    int first_tensor; /* tensors [first_tensor, first_tensor + num_tensors) */
    int num_tensors;
    int64_t offset;   /* elements, aligned to LAYOUT_CHUNK_ALIGN */
    int64_t numel;    /* elements including the padding up to the next chunk */
};

struct layout {
    int num_tensors;
    int num_chunks;
    int64_t total_numel;      /* padded size of the parameter space */
    int64_t num_params;       /* trainable parameters, without padding */
    int64_t max_chunk_numel;
    int layers_per_chunk;
    struct tensor_desc *tensors;
    struct chunk_desc *chunks;
};

/* Builds the layout for a model with decoder layers grouped layers_per_chunk at a time. */
int layout_build(const struct model_config *cfg, int layers_per_chunk, struct layout *out);
void layout_free(struct layout *l);

/* Index of the tensor of the given kind in a layer (layer -1 for global tensors), or -1. */
int layout_find(const struct tensor_desc *tensors, int num_tensors, int kind, int layer);
int layout_find_name(const struct tensor_desc *tensors, int num_tensors, const char *name);
/* Where rank r's shard of a chunk of n elements begins when G ranks split it (sharded parameters,
 * GPU-side gradients; docs/design.md §7.1): n*r/G rounded down to 64 elements; shard r is
 * [layout_shard_begin(n, G, r), layout_shard_begin(n, G, r + 1)). */
static inline int64_t layout_shard_begin(int64_t n, int G, int r)
{
    return r >= G ? n : (n * r / G) & ~(int64_t)63;
}

static inline int64_t layout_shard_numel(int64_t n, int G, int r)
{
    return layout_shard_begin(n, G, r + 1) - layout_shard_begin(n, G, r);
}

/* The sizes of the worker's two alternating gradient buffers (worker/model.c), which hold every
 * chunk's gradient but the embedding's: the largest such chunk's (an untied head can be larger than
 * a layer), and the largest of the rest's. */
void layout_grad_buf_numel(const struct chunk_desc *chunks, int num_chunks, int64_t out[2]);

/* Chunk that holds decoder layer l. */
int layout_chunk_of_layer(const struct chunk_desc *chunks, int num_chunks, int layer);

#endif
