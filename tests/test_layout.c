/* Parameter layout: execution order, HF names, shapes, alignment, chunk grouping, and agreement
 * with the parameter count of the model config. */
#include "tests/testutil.h"

#include <string.h>

#include "common/layout.h"
#include "common/model_config.h"

static struct model_config qwen3(bool tied, int layers)
{
    struct model_config c;
    memset(&c, 0, sizeof c);
    c.family = MODEL_QWEN3;
    snprintf(c.model_type, sizeof c.model_type, "qwen3");
    c.vocab_size = 1000;
    c.hidden_size = 64;
    c.intermediate_size = 96;
    c.num_layers = layers;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 24;
    c.qk_norm = true;
    c.tie_word_embeddings = tied;
    return c;
}

static void check_invariants(const struct layout *l)
{
    int64_t prev_end = 0;
    for (int i = 0; i < l->num_tensors; i++) {
        const struct tensor_desc *t = &l->tensors[i];
        assert_true(t->offset % LAYOUT_TENSOR_ALIGN == 0);
        assert_true(t->offset >= prev_end); /* execution order, no overlap */
        prev_end = t->offset + t->numel;
        const struct chunk_desc *c = &l->chunks[t->chunk];
        assert_true(t->offset >= c->offset && t->offset + t->numel <= c->offset + c->numel);
        assert_int_equal(t->decay, t->ndim == 2);
    }
    for (int c = 0; c < l->num_chunks; c++) {
        assert_true(l->chunks[c].offset % LAYOUT_CHUNK_ALIGN == 0);
        assert_true(l->chunks[c].numel % LAYOUT_CHUNK_ALIGN == 0);
        assert_true(l->chunks[c].numel <= l->max_chunk_numel);
        if (c > 0)
            assert_true(l->chunks[c].offset == l->chunks[c - 1].offset + l->chunks[c - 1].numel);
    }
    assert_true(l->total_numel == l->chunks[l->num_chunks - 1].offset + l->chunks[l->num_chunks - 1].numel);
}

static void test_qwen3_tied(void **state)
{
    struct model_config c = qwen3(true, 3);
    struct layout l;
    assert_int_equal(layout_build(&c, 2, &l), 0);
    check_invariants(&l);
    /* embed, layers {0,1}, layer {2}, head */
    assert_int_equal(l.num_chunks, 4);
    assert_int_equal(l.chunks[0].kind, CHUNK_EMBED);
    assert_int_equal(l.chunks[1].num_layers, 2);
    assert_int_equal(l.chunks[2].first_layer, 2);
    assert_int_equal(l.chunks[2].num_layers, 1);
    assert_int_equal(l.chunks[3].kind, CHUNK_HEAD);
    assert_int_equal(l.num_tensors, 1 + 3 * 11 + 1); /* no lm_head when tied */
    assert_string_equal(l.tensors[0].name, "model.embed_tokens.weight");
    assert_string_equal(l.tensors[1].name, "model.layers.0.input_layernorm.weight");
    assert_string_equal(l.tensors[2].name, "model.layers.0.self_attn.q_proj.weight");
    assert_true(l.tensors[2].shape[0] == 96 && l.tensors[2].shape[1] == 64);
    int k = layout_find(l.tensors, l.num_tensors, TENSOR_K, 1);
    assert_string_equal(l.tensors[k].name, "model.layers.1.self_attn.k_proj.weight");
    assert_true(l.tensors[k].shape[0] == 48);
    int o = layout_find(l.tensors, l.num_tensors, TENSOR_O, 2);
    assert_true(l.tensors[o].shape[0] == 64 && l.tensors[o].shape[1] == 96);
    int qn = layout_find_name(l.tensors, l.num_tensors, "model.layers.2.self_attn.q_norm.weight");
    assert_true(qn >= 0 && l.tensors[qn].shape[0] == 24 && !l.tensors[qn].decay);
    assert_int_equal(layout_find(l.tensors, l.num_tensors, TENSOR_LM_HEAD, -1), -1);
    assert_int_equal(layout_chunk_of_layer(l.chunks, l.num_chunks, 2), 2);
    assert_true(l.num_params == (int64_t)model_config_num_params(&c));
    layout_free(&l);
}

static void test_qwen2_untied(void **state)
{
    struct model_config c = qwen3(false, 2);
    c.family = MODEL_QWEN2;
    c.qk_norm = false;
    c.qkv_bias = true;
    c.head_dim = 16;
    struct layout l;
    assert_int_equal(layout_build(&c, 1, &l), 0);
    check_invariants(&l);
    assert_int_equal(l.num_chunks, 4);
    assert_int_equal(l.num_tensors, 1 + 2 * 12 + 2);
    int qb = layout_find(l.tensors, l.num_tensors, TENSOR_Q_BIAS, 0);
    assert_string_equal(l.tensors[qb].name, "model.layers.0.self_attn.q_proj.bias");
    assert_false(l.tensors[qb].decay);
    int lm = layout_find(l.tensors, l.num_tensors, TENSOR_LM_HEAD, -1);
    assert_string_equal(l.tensors[lm].name, "lm_head.weight");
    assert_int_equal(l.tensors[lm].chunk, 3);
    assert_true(l.num_params == (int64_t)model_config_num_params(&c));
    /* layers_per_chunk beyond the layer count folds into one chunk */
    layout_free(&l);
    assert_int_equal(layout_build(&c, 99, &l), 0);
    assert_int_equal(l.num_chunks, 3);
    layout_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_tied),
        cmocka_unit_test(test_qwen2_untied),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
