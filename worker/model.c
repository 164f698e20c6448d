/* Forward and backward of the decoder (Qwen3 / Qwen2 / Llama 3) for one micro-batch, as a flat
 * list of backend op calls; the backward mirrors the forward. Used by the worker pipeline, tests
 * and tools; see model.h. */
#include "model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/plan.h"

struct layer_acts {
    void *ln1;
    float *rstd1;
    void *q_raw, *k_raw; /* q/k before the per-head norm (qk_norm models) */
    float *q_rstd, *k_rstd;
    void *q, *k, *v;     /* after norm and RoPE */
    void *att;
    float *lse;
    void *h;             /* residual stream after attention */
    void *ln2;
    float *rstd2;
    void *gate, *up, *sw;
};

#define ACT_AT(m, p, elems) ((void *)((char *)(p) + (size_t)(elems) * be_dtype_size((m)->be->act_dtype)))

static void *act_alloc(struct model *m, size_t elems, int *fail)
{
    void *p = m->be->ops->alloc(m->be, elems * be_dtype_size(m->be->act_dtype));
    if (!p)
        *fail = 1;
    return p;
}

static float *f32_alloc(struct model *m, size_t elems, int *fail)
{
    float *p = m->be->ops->alloc(m->be, elems * sizeof(float));
    if (!p)
        *fail = 1;
    return p;
}

static void acts_alloc(struct model *m, struct layer_acts *a, int *fail)
{
    size_t N = (size_t)m->N, C = (size_t)m->cfg.hidden_size, I = (size_t)m->cfg.intermediate_size;
    a->ln1 = act_alloc(m, N * C, fail);
    a->rstd1 = f32_alloc(m, N, fail);
    if (m->cfg.qk_norm) {
        a->q_raw = act_alloc(m, N * (size_t)m->qdim, fail);
        a->k_raw = act_alloc(m, N * (size_t)m->kvdim, fail);
        a->q_rstd = f32_alloc(m, N * (size_t)m->cfg.num_heads, fail);
        a->k_rstd = f32_alloc(m, N * (size_t)m->cfg.num_kv_heads, fail);
    }
    a->q = act_alloc(m, N * (size_t)m->qdim, fail);
    a->k = act_alloc(m, N * (size_t)m->kvdim, fail);
    a->v = act_alloc(m, N * (size_t)m->kvdim, fail);
    a->att = act_alloc(m, N * (size_t)m->qdim, fail);
    a->lse = f32_alloc(m, N * (size_t)m->cfg.num_heads, fail);
    a->h = act_alloc(m, N * C, fail);
    a->ln2 = act_alloc(m, N * C, fail);
    a->rstd2 = f32_alloc(m, N, fail);
    a->gate = act_alloc(m, N * I, fail);
    a->up = act_alloc(m, N * I, fail);
    a->sw = act_alloc(m, N * I, fail);
}

static void acts_free(struct model *m, struct layer_acts *a)
{
    void *ptrs[] = {a->ln1, a->rstd1, a->q_raw, a->k_raw, a->q_rstd, a->k_rstd, a->q,    a->k,
                    a->v,   a->att,   a->lse,   a->h,     a->ln2,    a->rstd2,  a->gate, a->up, a->sw};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i])
            m->be->ops->free(m->be, ptrs[i]);
    memset(a, 0, sizeof *a);
}

void model_rope_tables(const struct model_config *cfg, int T, float *cos_out, float *sin_out, float *inv_freq_out)
{
    int D = cfg->head_dim, half = D / 2;
    float *inv = malloc(sizeof(float) * (size_t)half);
    SD_ASSERT(inv);
    float base = (float)cfg->rope_theta;
    for (int j = 0; j < half; j++) {
        float expo = (float)(2 * j) / (float)D;
        inv[j] = 1.0f / powf(base, expo);
    }
    if (cfg->rope_scaling.type == ROPE_SCALING_LLAMA3) {
        const struct rope_scaling *rs = &cfg->rope_scaling;
        float factor = (float)rs->factor, lo = (float)rs->low_freq_factor, hi = (float)rs->high_freq_factor;
        float old_ctx = (float)rs->original_max_position_embeddings;
        float low_wavelen = old_ctx / lo, high_wavelen = old_ctx / hi;
        for (int j = 0; j < half; j++) {
            float wavelen = (float)(2.0 * M_PI) / inv[j];
            float f = wavelen > low_wavelen ? inv[j] / factor : inv[j];
            float smooth = (old_ctx / wavelen - lo) / (hi - lo);
            float smoothed = (1.0f - smooth) * f / factor + smooth * f;
            bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            inv[j] = medium ? smoothed : f;
        }
    }
    for (int t = 0; t < T; t++)
        for (int j = 0; j < half; j++) {
            float angle = (float)t * inv[j];
            cos_out[(size_t)t * half + j] = (float)cos((double)angle);
            sin_out[(size_t)t * half + j] = (float)sin((double)angle);
        }
    if (inv_freq_out)
        memcpy(inv_freq_out, inv, sizeof(float) * (size_t)half);
    free(inv);
}

/* Bytes of one layer input, (N, C) activations. */
static size_t input_bytes(const struct model *m)
{
    return (size_t)m->N * (size_t)m->cfg.hidden_size * be_dtype_size(m->be->act_dtype);
}

int model_init(struct model *m, struct backend *be, const struct model_config *cfg, const struct tensor_desc *tensors,
               int num_tensors, const struct chunk_desc *chunks, int num_chunks, int B, int T,
               const uint8_t *keep_acts, int logits_rows, bool offload_inputs)
{
    memset(m, 0, sizeof *m);
    m->be = be;
    m->cfg = *cfg;
    m->tensors = tensors;
    m->num_tensors = num_tensors;
    m->chunks = chunks;
    m->num_chunks = num_chunks;
    m->B = B;
    m->T = T;
    m->N = B * T;
    m->qdim = cfg->num_heads * cfg->head_dim;
    m->kvdim = cfg->num_kv_heads * cfg->head_dim;
    int L = cfg->num_layers;
    size_t N = (size_t)m->N, C = (size_t)cfg->hidden_size, I = (size_t)cfg->intermediate_size;
    size_t V = (size_t)cfg->vocab_size;
    if (logits_rows <= 0) /* no plan: about 64 MiB of logits at a time */
        logits_rows = plan_logits_rows_for((int64_t)N, (int64_t)(V * be_dtype_size(be->act_dtype)), 64);
    m->logits_rows = logits_rows > (int)N ? (int)N : logits_rows;

    m->keep_acts = malloc((size_t)L);
    m->acts = calloc((size_t)L, sizeof *m->acts);
    m->scratch = calloc(1, sizeof *m->scratch);
    m->layer_inp = calloc((size_t)L + 1, sizeof *m->layer_inp);
    m->h_loss_rows = malloc(sizeof(float) * N);
    if (!m->keep_acts || !m->acts || !m->scratch || !m->layer_inp || !m->h_loss_rows) {
        model_free(m);
        return sd_err("out of host memory for the model's bookkeeping");
    }
    bool any_recompute = false;
    for (int l = 0; l < L; l++) {
        m->keep_acts[l] = keep_acts ? keep_acts[l] : 1;
        any_recompute |= !m->keep_acts[l];
    }

    int fail = 0;
    m->d_tokens = be->ops->alloc(be, N * sizeof(int32_t));
    m->d_targets = be->ops->alloc(be, N * sizeof(int32_t));
    m->d_correct = be->ops->alloc(be, N * sizeof(int32_t));
    m->d_pos = be->ops->alloc(be, N * sizeof(int32_t));
    fail |= !m->d_tokens || !m->d_targets || !m->d_correct || !m->d_pos;
    m->d_row_scale = f32_alloc(m, N, &fail);
    m->d_loss_rows = f32_alloc(m, N, &fail);
    size_t half = (size_t)cfg->head_dim / 2;
    m->d_cos = f32_alloc(m, (size_t)T * half, &fail);
    m->d_sin = f32_alloc(m, (size_t)T * half, &fail);
    if (offload_inputs) {
        size_t per_layer = input_bytes(m), bytes = per_layer * (size_t)L;
        if (posix_memalign(&m->host_inp, 4096, bytes) != 0) {
            m->host_inp = NULL;
            model_free(m);
            return sd_err("out of host memory for %d offloaded layer inputs of %zu bytes", L, per_layer);
        }
        if (be->ops->register_host(be, m->host_inp, bytes, false) != 0) {
            free(m->host_inp);
            m->host_inp = NULL;
            model_free(m);
            return sd_err_prefix("registering the offloaded layer inputs");
        }
        for (int r = 0; r < BE_ACT_SLOTS; r++) {
            m->ring[r] = act_alloc(m, N * C, &fail);
            m->ring_layer[r] = -1;
        }
        m->layer_inp[L] = act_alloc(m, N * C, &fail);
    } else {
        for (int l = 0; l <= L; l++)
            m->layer_inp[l] = act_alloc(m, N * C, &fail);
    }
    for (int l = 0; l < L; l++)
        if (m->keep_acts[l])
            acts_alloc(m, &m->acts[l], &fail);
    if (any_recompute)
        acts_alloc(m, m->scratch, &fail);
    m->d_final = act_alloc(m, N * C, &fail);
    m->d_final_rstd = f32_alloc(m, N, &fail);
    m->d_logits = act_alloc(m, (size_t)m->logits_rows * V, &fail);
    m->d_dres = act_alloc(m, N * C, &fail);
    m->d_dfinal = act_alloc(m, N * C, &fail);
    m->bw_ni = act_alloc(m, N * I, &fail);
    m->bw_nc = act_alloc(m, N * C, &fail);
    m->bw_q = act_alloc(m, N * (size_t)m->qdim, &fail);
    m->bw_k = act_alloc(m, N * (size_t)m->kvdim, &fail);
    m->bw_v = act_alloc(m, N * (size_t)m->kvdim, &fail);
    m->bw_q2 = act_alloc(m, N * (size_t)m->qdim, &fail);
    m->bw_k2 = act_alloc(m, N * (size_t)m->kvdim, &fail);
    /* two buffers for the other chunks' gradients, used in turn */
    int64_t *gb = m->grad_buf_numel;
    layout_grad_buf_numel(chunks, num_chunks, gb);
    m->embed_grad_in_pair = !cfg->tie_word_embeddings && chunks[0].numel <= gb[0] + gb[1];
    if (m->embed_grad_in_pair) {
        m->grad_bufs[0] = m->grad_embed = f32_alloc(m, (size_t)(gb[0] + gb[1]), &fail);
        m->grad_bufs[1] = m->grad_bufs[0] ? m->grad_bufs[0] + gb[0] : NULL;
    } else {
        m->grad_embed = f32_alloc(m, (size_t)chunks[0].numel, &fail);
        m->grad_bufs[0] = f32_alloc(m, (size_t)gb[0], &fail);
        m->grad_bufs[1] = f32_alloc(m, (size_t)(gb[1] > 0 ? gb[1] : 1), &fail);
    }
    if (fail) {
        model_free(m);
        return sd_err_prefix("device memory for B=%d T=%d activations", B, T);
    }

    float *hcos = malloc(sizeof(float) * (size_t)T * half), *hsin = malloc(sizeof(float) * (size_t)T * half);
    SD_ASSERT(hcos && hsin);
    model_rope_tables(cfg, T, hcos, hsin, NULL);
    be->ops->upload(be, m->d_cos, hcos, sizeof(float) * (size_t)T * half);
    be->ops->upload(be, m->d_sin, hsin, sizeof(float) * (size_t)T * half);
    free(hcos);
    free(hsin);
    return 0;
}

void model_free(struct model *m)
{
    struct backend *be = m->be;
    if (!be)
        return;
    if (m->acts)
        for (int l = 0; l < m->cfg.num_layers; l++)
            acts_free(m, &m->acts[l]);
    if (m->scratch)
        acts_free(m, m->scratch);
    if (m->layer_inp)
        for (int l = 0; l <= m->cfg.num_layers; l++)
            if (m->layer_inp[l])
                be->ops->free(be, m->layer_inp[l]);
    for (int r = 0; r < BE_ACT_SLOTS; r++)
        if (m->ring[r])
            be->ops->free(be, m->ring[r]);
    if (m->host_inp) {
        be->ops->unregister_host(be, m->host_inp);
        free(m->host_inp);
    }
    void *ptrs[] = {m->d_tokens, m->d_targets,  m->d_correct, m->d_pos, m->d_row_scale, m->d_loss_rows, m->d_cos,
                    m->d_sin,    m->d_final,    m->d_final_rstd, m->d_logits, m->d_dres,      m->d_dfinal,
                    m->bw_ni,    m->bw_nc,      m->bw_q,      m->bw_k,
                    m->bw_v,     m->bw_q2,      m->bw_k2,     m->grad_bufs[0],
                    m->embed_grad_in_pair ? NULL : m->grad_embed, m->embed_grad_in_pair ? NULL : m->grad_bufs[1]};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i])
            be->ops->free(be, ptrs[i]);
    if (m->chunk_grads)
        for (int c = 1; c < m->num_chunks; c++)
            if (m->chunk_grads[c])
                be->ops->free(be, m->chunk_grads[c]);
    free(m->chunk_grads);
    free(m->keep_acts);
    free(m->acts);
    free(m->scratch);
    free(m->layer_inp);
    free(m->h_loss_rows);
    memset(m, 0, sizeof *m);
}

/* Weights and gradients of the tensors of one layer or of the global tensors. */
struct tensor_ptrs {
    const void *w[TENSOR_KIND_COUNT];
    float *g[TENSOR_KIND_COUNT];
};

static void tensor_ptrs(const struct model *m, int chunk, const void *wbuf, float *gbuf, int layer,
                        struct tensor_ptrs *out)
{
    memset(out, 0, sizeof *out);
    const struct chunk_desc *c = &m->chunks[chunk];
    size_t wsize = be_dtype_size(m->be->weight_dtype);
    for (int i = c->first_tensor; i < c->first_tensor + c->num_tensors; i++) {
        const struct tensor_desc *t = &m->tensors[i];
        if (t->layer != layer)
            continue;
        int64_t rel = t->offset - c->offset;
        out->w[t->kind] = (const char *)wbuf + (size_t)rel * wsize;
        out->g[t->kind] = gbuf ? gbuf + rel : NULL;
    }
}

/* This micro-batch's document positions for the backend ops, NULL when each row is one window. */
static const int32_t *model_positions(const struct model *m)
{
    return m->documents ? m->d_pos : NULL;
}

void model_set_positions(struct model *m, const int32_t *positions)
{
    /* rows that are each one document run as whole windows: the same math, and the backend may
     * then take its dense kernels (cuDNN's on CUDA) */
    bool one_each = true;
    for (int i = 0; positions && one_each && i < m->N; i++)
        one_each = positions[i] == i % m->T;
    m->documents = !one_each;
    if (m->documents)
        m->be->ops->upload_positions(m->be, m->d_pos, positions, m->B, m->T);
}

/* out NULL: a recompute for the backward, which needs the activations but not the output (the
 * next layer's input, kept), so the down projection is skipped. */
static void layer_forward(struct model *m, const struct tensor_ptrs *p, const void *inp, void *out,
                          struct layer_acts *a)
{
    struct backend *be = m->be;
    const struct backend_ops *o = be->ops;
    const struct model_config *cfg = &m->cfg;
    int N = m->N, C = cfg->hidden_size, I = cfg->intermediate_size, D = cfg->head_dim;
    int Hq = cfg->num_heads, Hkv = cfg->num_kv_heads;
    float eps = (float)cfg->rms_norm_eps;

    o->rmsnorm_fwd(be, a->ln1, a->rstd1, inp, p->w[TENSOR_ATTN_NORM], N, C, eps);
    void *q_out = cfg->qk_norm ? a->q_raw : a->q;
    void *k_out = cfg->qk_norm ? a->k_raw : a->k;
    o->matmul_fwd(be, q_out, a->ln1, p->w[TENSOR_Q], p->w[TENSOR_Q_BIAS], N, C, m->qdim);
    o->matmul_fwd(be, k_out, a->ln1, p->w[TENSOR_K], p->w[TENSOR_K_BIAS], N, C, m->kvdim);
    o->matmul_fwd(be, a->v, a->ln1, p->w[TENSOR_V], p->w[TENSOR_V_BIAS], N, C, m->kvdim);
    if (cfg->qk_norm) {
        o->rmsnorm_fwd(be, a->q, a->q_rstd, a->q_raw, p->w[TENSOR_Q_NORM], N * Hq, D, eps);
        o->rmsnorm_fwd(be, a->k, a->k_rstd, a->k_raw, p->w[TENSOR_K_NORM], N * Hkv, D, eps);
    }
    const int32_t *pos = model_positions(m);
    o->rope_fwd(be, a->q, m->d_cos, m->d_sin, pos, m->B, m->T, Hq, D);
    o->rope_fwd(be, a->k, m->d_cos, m->d_sin, pos, m->B, m->T, Hkv, D);
    o->attention_fwd(be, a->att, a->lse, a->q, a->k, a->v, pos, m->B, m->T, Hq, Hkv, D);
    o->matmul_fwd(be, a->h, a->att, p->w[TENSOR_O], NULL, N, m->qdim, C);
    o->add_inplace(be, a->h, inp, (size_t)N * C);
    o->rmsnorm_fwd(be, a->ln2, a->rstd2, a->h, p->w[TENSOR_MLP_NORM], N, C, eps);
    o->matmul_fwd(be, a->gate, a->ln2, p->w[TENSOR_GATE], NULL, N, C, I);
    o->matmul_fwd(be, a->up, a->ln2, p->w[TENSOR_UP], NULL, N, C, I);
    o->swiglu_fwd(be, a->sw, a->gate, a->up, (size_t)N * I);
    if (!out)
        return;
    o->matmul_fwd(be, out, a->sw, p->w[TENSOR_DOWN], NULL, N, I, C);
    o->add_inplace(be, out, a->h, (size_t)N * C);
}

/* dres (N,C) holds the gradient of the layer's output on entry and of its input on return. */
static void layer_backward(struct model *m, const struct tensor_ptrs *p, const void *inp, struct layer_acts *a,
                           void *dres)
{
    struct backend *be = m->be;
    const struct backend_ops *o = be->ops;
    const struct model_config *cfg = &m->cfg;
    int N = m->N, C = cfg->hidden_size, I = cfg->intermediate_size, D = cfg->head_dim;
    int Hq = cfg->num_heads, Hkv = cfg->num_kv_heads;

    /* MLP: out = h + down(silu(gate(ln2)) * up(ln2)); gate and up are read for the last time by
     * swiglu_bwd, which writes their gradients over them (two (N,I) buffers fewer: long context) */
    void *d_sw = m->bw_ni, *d_gate = a->gate, *d_up = a->up, *d_ln = m->bw_nc;
    o->matmul_bwd(be, d_sw, p->g[TENSOR_DOWN], NULL, dres, a->sw, p->w[TENSOR_DOWN], N, I, C, false);
    o->swiglu_bwd(be, d_gate, d_up, d_sw, a->gate, a->up, (size_t)N * I);
    o->matmul_bwd(be, d_ln, p->g[TENSOR_GATE], NULL, d_gate, a->ln2, p->w[TENSOR_GATE], N, C, I, false);
    o->matmul_bwd(be, d_ln, p->g[TENSOR_UP], NULL, d_up, a->ln2, p->w[TENSOR_UP], N, C, I, true);
    o->rmsnorm_bwd(be, dres, p->g[TENSOR_MLP_NORM], d_ln, a->h, p->w[TENSOR_MLP_NORM], a->rstd2, N, C, true);

    /* attention: h = inp + o_proj(attn(rope(norm(q)), rope(norm(k)), v)) */
    void *d_att = m->bw_q, *dq = m->bw_q2, *dk = m->bw_k2, *dv = m->bw_v;
    o->matmul_bwd(be, d_att, p->g[TENSOR_O], NULL, dres, a->att, p->w[TENSOR_O], N, m->qdim, C, false);
    const int32_t *pos = model_positions(m);
    o->attention_bwd(be, dq, dk, dv, d_att, a->q, a->k, a->v, a->att, a->lse, pos, m->B, m->T, Hq, Hkv, D);
    o->rope_bwd(be, dq, m->d_cos, m->d_sin, pos, m->B, m->T, Hq, D);
    o->rope_bwd(be, dk, m->d_cos, m->d_sin, pos, m->B, m->T, Hkv, D);
    if (cfg->qk_norm) {
        void *dq_raw = m->bw_q, *dk_raw = m->bw_k;
        o->rmsnorm_bwd(be, dq_raw, p->g[TENSOR_Q_NORM], dq, a->q_raw, p->w[TENSOR_Q_NORM], a->q_rstd, N * Hq, D,
                       false);
        o->rmsnorm_bwd(be, dk_raw, p->g[TENSOR_K_NORM], dk, a->k_raw, p->w[TENSOR_K_NORM], a->k_rstd, N * Hkv, D,
                       false);
        dq = dq_raw;
        dk = dk_raw;
    }
    o->matmul_bwd(be, d_ln, p->g[TENSOR_Q], p->g[TENSOR_Q_BIAS], dq, a->ln1, p->w[TENSOR_Q], N, C, m->qdim, false);
    o->matmul_bwd(be, d_ln, p->g[TENSOR_K], p->g[TENSOR_K_BIAS], dk, a->ln1, p->w[TENSOR_K], N, C, m->kvdim, true);
    o->matmul_bwd(be, d_ln, p->g[TENSOR_V], p->g[TENSOR_V_BIAS], dv, a->ln1, p->w[TENSOR_V], N, C, m->kvdim, true);
    o->rmsnorm_bwd(be, dres, p->g[TENSOR_ATTN_NORM], d_ln, inp, p->w[TENSOR_ATTN_NORM], a->rstd1, N, C, true);
}

static int head_chunk(const struct model *m)
{
    return m->num_chunks - 1;
}

static void upload_batch(struct model *m, const int32_t *tokens, const int32_t *targets, const float *row_scale)
{
    struct backend *be = m->be;
    size_t N = (size_t)m->N;
    be->ops->upload(be, m->d_tokens, tokens, N * sizeof(int32_t));
    be->ops->upload(be, m->d_targets, targets, N * sizeof(int32_t));
    if (row_scale)
        be->ops->upload(be, m->d_row_scale, row_scale, N * sizeof(float));
}

/* ---- layer inputs (offloaded ones in the ring, docs/design.md §6.1) ---- */

static void *host_input(const struct model *m, int l)
{
    return (char *)m->host_inp + (size_t)l * input_bytes(m);
}

/* Where the forward writes layer l's input (l < L, or L: the final stream). Offloaded: its ring
 * buffer, once the save of the input it held has read it. */
static void *input_to_write(struct model *m, int l)
{
    if (!m->host_inp || l == m->cfg.num_layers)
        return m->layer_inp[l];
    int r = l % BE_ACT_SLOTS;
    m->be->ops->wait_activations(m->be, r);
    m->ring_layer[r] = l;
    return m->ring[r];
}

/* Layer l's input has been queued for writing (input_to_write): in training it goes to host memory
 * for the backward. */
static void input_written(struct model *m, int l, bool save)
{
    if (m->host_inp && save && l < m->cfg.num_layers)
        m->be->ops->copy_activations_async(m->be, l % BE_ACT_SLOTS, true, m->ring[l % BE_ACT_SLOTS],
                                           host_input(m, l), input_bytes(m));
}

/* Layer l's input for its forward (written just before) or its backward. Offloaded, in the
 * backward: loaded back unless its ring buffer still holds it, and the input of layer l - 1 starts
 * loading into the other buffer (after the compute queued so far, which has finished with it). */
static const void *input_to_read(struct model *m, int l, bool backward)
{
    if (!m->host_inp)
        return m->layer_inp[l];
    int r = l % BE_ACT_SLOTS, other = (l + BE_ACT_SLOTS - 1) % BE_ACT_SLOTS; /* layer l - 1's */
    if (backward) {
        if (m->ring_layer[r] != l) {
            m->be->ops->copy_activations_async(m->be, r, false, m->ring[r], host_input(m, l), input_bytes(m));
            m->ring_layer[r] = l;
        }
        m->be->ops->wait_activations(m->be, r);
        if (l > 0 && m->ring_layer[other] != l - 1) {
            m->be->ops->copy_activations_async(m->be, other, false, m->ring[other], host_input(m, l - 1),
                                               input_bytes(m));
            m->ring_layer[other] = l - 1;
        }
    }
    return m->ring[r];
}

/* Embedding and every decoder layer; leaves the final residual stream in layer_inp[L]. The
 * embedding chunk stays acquired when tied (the LM head needs it). training: offloaded inputs are
 * saved to host memory for the backward. */
static void forward_trunk(struct model *m, const struct model_io *io, bool training)
{
    struct backend *be = m->be;
    const struct model_config *cfg = &m->cfg;
    int first_layer_chunk = 1, hc = head_chunk(m);
    const void *wemb = io->weights(io->ctx, 0, first_layer_chunk < hc ? first_layer_chunk : hc);
    struct tensor_ptrs p;
    tensor_ptrs(m, 0, wemb, NULL, -1, &p);
    be->ops->embedding_fwd(be, input_to_write(m, 0), m->d_tokens, p.w[TENSOR_EMBED], m->N, cfg->hidden_size);
    input_written(m, 0, training);
    if (!cfg->tie_word_embeddings)
        io->release(io->ctx, 0);
    for (int c = first_layer_chunk; c < hc; c++) {
        const void *w = io->weights(io->ctx, c, c + 1);
        const struct chunk_desc *ch = &m->chunks[c];
        for (int l = ch->first_layer; l < ch->first_layer + ch->num_layers; l++) {
            tensor_ptrs(m, c, w, NULL, l, &p);
            struct layer_acts *a = m->keep_acts[l] ? &m->acts[l] : m->scratch;
            const void *inp = input_to_read(m, l, false);
            layer_forward(m, &p, inp, input_to_write(m, l + 1), a);
            input_written(m, l + 1, training);
        }
        io->release(io->ctx, c);
    }
}

/* Final norm and the LM head in row chunks: loss rows, correct flags, and (training) the gradient
 * of the final residual stream in d_dres plus the head weights' gradients. */
static void head_pass(struct model *m, const struct model_io *io, bool training, float *head_grad, float *logits_host)
{
    struct backend *be = m->be;
    const struct backend_ops *o = be->ops;
    const struct model_config *cfg = &m->cfg;
    int N = m->N, C = cfg->hidden_size, V = cfg->vocab_size, L = cfg->num_layers;
    int hc = head_chunk(m);
    const void *wh = io->weights(io->ctx, hc, training ? hc - 1 : -1);
    struct tensor_ptrs ph, pe;
    tensor_ptrs(m, hc, wh, head_grad, -1, &ph);
    const void *w_lm = ph.w[TENSOR_LM_HEAD];
    float *g_lm = ph.g[TENSOR_LM_HEAD];
    if (cfg->tie_word_embeddings) {
        tensor_ptrs(m, 0, io->weights(io->ctx, 0, -1), training ? m->grad_embed : NULL, -1, &pe);
        w_lm = pe.w[TENSOR_EMBED];
        g_lm = pe.g[TENSOR_EMBED];
    }
    o->rmsnorm_fwd(be, m->d_final, m->d_final_rstd, m->layer_inp[L], ph.w[TENSOR_FINAL_NORM], N, C,
                   (float)cfg->rms_norm_eps);
    for (int r0 = 0; r0 < N; r0 += m->logits_rows) {
        int n = N - r0 < m->logits_rows ? N - r0 : m->logits_rows;
        const void *x = ACT_AT(m, m->d_final, (size_t)r0 * C);
        o->matmul_fwd(be, m->d_logits, x, w_lm, NULL, n, C, V);
        if (logits_host)
            o->download_f32(be, logits_host + (size_t)r0 * V, m->d_logits, be->act_dtype, (size_t)n * V);
        o->cross_entropy(be, m->d_logits, m->d_loss_rows + r0, m->d_correct + r0, m->d_targets + r0,
                         training ? m->d_row_scale + r0 : NULL, n, V);
        if (training)
            o->matmul_bwd(be, ACT_AT(m, m->d_dfinal, (size_t)r0 * C), g_lm, NULL, m->d_logits, x, w_lm, n, C, V,
                          false);
    }
    if (cfg->tie_word_embeddings)
        io->release(io->ctx, 0);
    if (training)
        o->rmsnorm_bwd(be, m->d_dres, ph.g[TENSOR_FINAL_NORM], m->d_dfinal, m->layer_inp[L], ph.w[TENSOR_FINAL_NORM],
                       m->d_final_rstd, N, C, false);
}

static void zero_grads(struct model *m, const struct model_io *io, float *g, size_t numel)
{
    if (io->grads_reuse)
        io->grads_reuse(io->ctx, g);
    m->be->ops->memset0(m->be, g, sizeof(float) * numel);
}

/* The next of the two alternating buffers for a gradient of numel elements, or the larger one when
 * it does not fit the next (the backward starts with buffer 0, so the head takes it). */
static float *take_grad_buf(struct model *m, const struct model_io *io, int64_t numel)
{
    int i = numel <= m->grad_buf_numel[m->next_grad_buf] ? m->next_grad_buf : 0;
    m->next_grad_buf = i ^ 1;
    float *g = m->grad_bufs[i];
    if (m->embed_grad_in_pair && io->grads_reuse) /* the embedding's last gradient may span both */
        io->grads_reuse(io->ctx, m->grad_embed);
    zero_grads(m, io, g, (size_t)numel);
    return g;
}

static void fetch_loss(struct model *m, float *loss_rows, int32_t *correct)
{
    struct backend *be = m->be;
    be->ops->download(be, loss_rows, m->d_loss_rows, sizeof(float) * (size_t)m->N);
    if (correct)
        be->ops->download(be, correct, m->d_correct, sizeof(int32_t) * (size_t)m->N);
}

int model_keep_grads_resident(struct model *m)
{
    m->chunk_grads = calloc((size_t)m->num_chunks, sizeof *m->chunk_grads);
    if (!m->chunk_grads)
        return sd_err("out of host memory");
    int fail = 0;
    m->chunk_grads[0] = m->grad_embed;
    for (int c = 1; c < m->num_chunks; c++)
        m->chunk_grads[c] = f32_alloc(m, (size_t)m->chunks[c].numel, &fail);
    return fail ? sd_err_prefix("device memory for gradients accumulated over micro-steps") : 0;
}

/* The buffer chunk c's gradient goes into: its own (zeroed on the first micro-step) when
 * gradients stay resident, else the next of the two alternating ones. */
static float *chunk_grad(struct model *m, const struct model_io *io, int c, bool first)
{
    if (!m->chunk_grads)
        return take_grad_buf(m, io, m->chunks[c].numel);
    if (first)
        zero_grads(m, io, m->chunk_grads[c], (size_t)m->chunks[c].numel);
    return m->chunk_grads[c];
}

int model_train_step(struct model *m, const struct model_io *io, const int32_t *tokens, const int32_t *targets,
                     const float *row_scale, float *loss_rows, int32_t *correct)
{
    return model_train_micro(m, io, tokens, targets, row_scale, loss_rows, correct, true, true);
}

int model_train_micro(struct model *m, const struct model_io *io, const int32_t *tokens, const int32_t *targets,
                      const float *row_scale, float *loss_rows, int32_t *correct, bool first, bool last)
{
    struct backend *be = m->be;
    const struct model_config *cfg = &m->cfg;
    int hc = head_chunk(m);
    bool hand_out = last || !m->chunk_grads;
    /* the embedding's gradient shares the alternating buffers: zeroed once the last of them is read */
    bool embed_late = m->embed_grad_in_pair && !m->chunk_grads;
    upload_batch(m, tokens, targets, row_scale);
    if (!embed_late && (first || !m->chunk_grads))
        zero_grads(m, io, m->grad_embed, (size_t)m->chunks[0].numel);

    forward_trunk(m, io, true);
    m->next_grad_buf = 0;
    float *head_grad = chunk_grad(m, io, hc, first);
    head_pass(m, io, true, head_grad, NULL);
    fetch_loss(m, loss_rows, correct);
    if (io->loss_done)
        io->loss_done(io->ctx, loss_rows, m->N);
    if (hand_out)
        io->grads_done(io->ctx, hc, head_grad);
    io->release(io->ctx, hc);

    for (int c = hc - 1; c >= 1; c--) {
        const void *w = io->weights(io->ctx, c, c > 1 ? c - 1 : -1);
        float *g = chunk_grad(m, io, c, first);
        const struct chunk_desc *ch = &m->chunks[c];
        for (int l = ch->first_layer + ch->num_layers - 1; l >= ch->first_layer; l--) {
            struct tensor_ptrs p;
            tensor_ptrs(m, c, w, g, l, &p);
            struct layer_acts *a = &m->acts[l];
            const void *inp = input_to_read(m, l, true);
            if (!m->keep_acts[l]) {
                a = m->scratch;
                layer_forward(m, &p, inp, NULL, a);
            }
            layer_backward(m, &p, inp, a, m->d_dres);
        }
        io->release(io->ctx, c);
        if (hand_out)
            io->grads_done(io->ctx, c, g);
    }
    if (embed_late) {
        if (io->grads_reuse)
            io->grads_reuse(io->ctx, m->grad_bufs[1]);
        zero_grads(m, io, m->grad_embed, (size_t)m->chunks[0].numel);
    }
    struct tensor_ptrs pe;
    tensor_ptrs(m, 0, NULL, m->grad_embed, -1, &pe);
    be->ops->embedding_bwd(be, pe.g[TENSOR_EMBED], m->d_dres, m->d_tokens, m->N, cfg->hidden_size);
    if (hand_out)
        io->grads_done(io->ctx, 0, m->grad_embed);
    return 0;
}

int model_eval(struct model *m, const struct model_io *io, const int32_t *tokens, const int32_t *targets,
               float *loss_rows, int32_t *correct, float *logits)
{
    upload_batch(m, tokens, targets, NULL);
    forward_trunk(m, io, false);
    head_pass(m, io, false, NULL, logits);
    io->release(io->ctx, head_chunk(m));
    fetch_loss(m, loss_rows, correct);
    return 0;
}
