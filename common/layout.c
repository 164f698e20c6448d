/* Builds the parameter layout (tensors in execution order, grouped into chunks) from a model
 * config; see layout.h. */
#include "layout.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"

static int64_t align_up(int64_t x, int64_t a)
{
    return (x + a - 1) / a * a;
}

struct builder {
    struct layout *l;
    int cap;
    int64_t cursor;
};

static void add_tensor(struct builder *b, int kind, int layer, const char *name, int64_t d0, int64_t d1)
{
    SD_ASSERT(b->l->num_tensors < b->cap);
    struct tensor_desc *t = &b->l->tensors[b->l->num_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->layer = layer;
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1 > 0 ? d1 : 0;
    t->numel = d1 > 0 ? d0 * d1 : d0;
    t->decay = t->ndim >= 2;
    b->cursor = align_up(b->cursor, LAYOUT_TENSOR_ALIGN);
    t->offset = b->cursor;
    b->cursor += t->numel;
    b->l->num_params += t->numel;
}

static void begin_chunk(struct builder *b, int kind, int first_layer, int num_layers)
{
    struct layout *l = b->l;
    b->cursor = align_up(b->cursor, LAYOUT_CHUNK_ALIGN);
    struct chunk_desc *c = &l->chunks[l->num_chunks++];
    memset(c, 0, sizeof *c);
    c->kind = kind;
    c->first_layer = first_layer;
    c->num_layers = num_layers;
    c->first_tensor = l->num_tensors;
    c->offset = b->cursor;
}

static void end_chunk(struct builder *b)
{
    struct layout *l = b->l;
    struct chunk_desc *c = &l->chunks[l->num_chunks - 1];
    c->num_tensors = l->num_tensors - c->first_tensor;
    for (int i = c->first_tensor; i < l->num_tensors; i++)
        l->tensors[i].chunk = l->num_chunks - 1;
    b->cursor = align_up(b->cursor, LAYOUT_CHUNK_ALIGN);
    c->numel = b->cursor - c->offset;
    if (c->numel > l->max_chunk_numel)
        l->max_chunk_numel = c->numel;
}

static void add_layer(struct builder *b, const struct model_config *cfg, int l)
{
    char name[LAYOUT_NAME_MAX];
    int64_t C = cfg->hidden_size, I = cfg->intermediate_size, D = cfg->head_dim;
    int64_t qdim = (int64_t)cfg->num_heads * D, kvdim = (int64_t)cfg->num_kv_heads * D;
#define NAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
    add_tensor(b, TENSOR_ATTN_NORM, l, NAME("input_layernorm.weight"), C, 0);
    add_tensor(b, TENSOR_Q, l, NAME("self_attn.q_proj.weight"), qdim, C);
    if (cfg->qkv_bias)
        add_tensor(b, TENSOR_Q_BIAS, l, NAME("self_attn.q_proj.bias"), qdim, 0);
    add_tensor(b, TENSOR_K, l, NAME("self_attn.k_proj.weight"), kvdim, C);
    if (cfg->qkv_bias)
        add_tensor(b, TENSOR_K_BIAS, l, NAME("self_attn.k_proj.bias"), kvdim, 0);
    add_tensor(b, TENSOR_V, l, NAME("self_attn.v_proj.weight"), kvdim, C);
    if (cfg->qkv_bias)
        add_tensor(b, TENSOR_V_BIAS, l, NAME("self_attn.v_proj.bias"), kvdim, 0);
    if (cfg->qk_norm) {
        add_tensor(b, TENSOR_Q_NORM, l, NAME("self_attn.q_norm.weight"), D, 0);
        add_tensor(b, TENSOR_K_NORM, l, NAME("self_attn.k_norm.weight"), D, 0);
    }
    add_tensor(b, TENSOR_O, l, NAME("self_attn.o_proj.weight"), C, qdim);
    add_tensor(b, TENSOR_MLP_NORM, l, NAME("post_attention_layernorm.weight"), C, 0);
    add_tensor(b, TENSOR_GATE, l, NAME("mlp.gate_proj.weight"), I, C);
    add_tensor(b, TENSOR_UP, l, NAME("mlp.up_proj.weight"), I, C);
    add_tensor(b, TENSOR_DOWN, l, NAME("mlp.down_proj.weight"), C, I);
#undef NAME
}

int layout_build(const struct model_config *cfg, int layers_per_chunk, struct layout *out)
{
    memset(out, 0, sizeof *out);
    if (layers_per_chunk < 1)
        layers_per_chunk = 1;
    if (layers_per_chunk > cfg->num_layers)
        layers_per_chunk = cfg->num_layers;
    int max_tensors = 3 + cfg->num_layers * 14;
    int max_chunks = 2 + (cfg->num_layers + layers_per_chunk - 1) / layers_per_chunk;
    out->tensors = calloc((size_t)max_tensors, sizeof *out->tensors);
    out->chunks = calloc((size_t)max_chunks, sizeof *out->chunks);
    if (!out->tensors || !out->chunks) {
        layout_free(out);
        return sd_err("out of memory building the parameter layout");
    }
    out->layers_per_chunk = layers_per_chunk;
    struct builder b = {out, max_tensors, 0};

    begin_chunk(&b, CHUNK_EMBED, -1, 0);
    add_tensor(&b, TENSOR_EMBED, -1, "model.embed_tokens.weight", cfg->vocab_size, cfg->hidden_size);
    end_chunk(&b);
    for (int l0 = 0; l0 < cfg->num_layers; l0 += layers_per_chunk) {
        int n = cfg->num_layers - l0 < layers_per_chunk ? cfg->num_layers - l0 : layers_per_chunk;
        begin_chunk(&b, CHUNK_LAYERS, l0, n);
        for (int l = l0; l < l0 + n; l++)
            add_layer(&b, cfg, l);
        end_chunk(&b);
    }
    begin_chunk(&b, CHUNK_HEAD, -1, 0);
    add_tensor(&b, TENSOR_FINAL_NORM, -1, "model.norm.weight", cfg->hidden_size, 0);
    if (!cfg->tie_word_embeddings)
        add_tensor(&b, TENSOR_LM_HEAD, -1, "lm_head.weight", cfg->vocab_size, cfg->hidden_size);
    end_chunk(&b);
    out->total_numel = b.cursor;
    return 0;
}

void layout_grad_buf_numel(const struct chunk_desc *chunks, int num_chunks, int64_t out[2])
{
    out[0] = out[1] = 0;
    for (int c = 1; c < num_chunks; c++) {
        if (chunks[c].numel > out[0]) {
            out[1] = out[0];
            out[0] = chunks[c].numel;
        } else if (chunks[c].numel > out[1]) {
            out[1] = chunks[c].numel;
        }
    }
}

void layout_free(struct layout *l)
{
    free(l->tensors);
    free(l->chunks);
    memset(l, 0, sizeof *l);
}

int layout_find(const struct tensor_desc *tensors, int num_tensors, int kind, int layer)
{
    for (int i = 0; i < num_tensors; i++)
        if (tensors[i].kind == kind && tensors[i].layer == layer)
            return i;
    return -1;
}

int layout_find_name(const struct tensor_desc *tensors, int num_tensors, const char *name)
{
    for (int i = 0; i < num_tensors; i++)
        if (!strcmp(tensors[i].name, name))
            return i;
    return -1;
}

int layout_chunk_of_layer(const struct chunk_desc *chunks, int num_chunks, int layer)
{
    for (int c = 0; c < num_chunks; c++)
        if (chunks[c].kind == CHUNK_LAYERS && layer >= chunks[c].first_layer &&
            layer < chunks[c].first_layer + chunks[c].num_layers)
            return c;
    return -1;
}
