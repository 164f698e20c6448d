/* The decoder model's forward and backward for one micro-batch, written once against the backend
 * interface (worker/backend.h). Weights arrive chunk by chunk through a model_io supplied by the
 * caller (the streaming pipeline in a worker, or a resident copy in tests and tools), and each
 * chunk's gradient is handed back as soon as it is complete. */
#ifndef SD_MODEL_H
#define SD_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/layout.h"
#include "common/model_config.h"
#include "worker/backend.h"

/* How the model gets weights and gives back gradients. All pointers are device memory. */
struct model_io {
    void *ctx;
    /* Device buffer holding chunk c's weights (backend weight dtype, chunk-relative offsets),
     * ready for compute queued after this call. next_chunk (-1 if none) is the chunk the model
     * will ask for after c, for prefetching. */
    const void *(*weights)(void *ctx, int chunk, int next_chunk);
    /* The pass no longer needs chunk c's weights. */
    void (*release)(void *ctx, int chunk);
    /* Chunk c's gradient of this micro-batch is complete in grad (fp32, the chunk's numel). The
     * model zeroes the buffer before its next use, after this call returns. */
    void (*grads_done)(void *ctx, int chunk, float *grad);
    /* The loss rows of this micro-batch are known (called before the backward starts). */
    void (*loss_done)(void *ctx, const float *loss_rows_host, int n);
    /* Optional: the model is about to overwrite a gradient buffer it handed to grads_done earlier
     * (the callee orders that after any copy still reading it). */
    void (*grads_reuse)(void *ctx, float *grad);
};

struct layer_acts;

struct model {
    struct backend *be;
    struct model_config cfg;
    const struct tensor_desc *tensors;
    int num_tensors;
    const struct chunk_desc *chunks;
    int num_chunks;
    int B, T, N;          /* micro-batch, sequence length, B*T */
    int qdim, kvdim;
    int logits_rows;      /* rows of logits computed at a time (chunked cross-entropy) */
    uint8_t *keep_acts;   /* per layer: 1 keep all activations, 0 recompute from the layer input */

    /* device buffers */
    int32_t *d_tokens, *d_targets;
    int32_t *d_correct;
    int32_t *d_pos;       /* (B,T) document positions (backend.h), used when `documents` */
    bool documents;       /* the current micro-batch's rows are runs of documents (model_set_positions) */
    float *d_row_scale, *d_loss_rows;
    float *d_cos, *d_sin;
    void **layer_inp;     /* per layer + 1: the residual stream entering layer l; [L] = final. With
                           * offloaded inputs only [L] is allocated (the ring holds the others) */
    /* Offloaded layer inputs (docs/design.md §6.1): layer l's input is on the device in ring[l % 2]
     * while layer l runs, and in host memory (host_inp + l * N * C activations, registered) from its
     * forward to its backward, which loads it back (the next one's load overlapping it). NULL
     * host_inp: every input stays on the device. */
    void *host_inp;
    void *ring[BE_ACT_SLOTS];
    int ring_layer[BE_ACT_SLOTS]; /* whose input each ring buffer holds, -1: nobody's */
    struct layer_acts *acts;   /* per layer (kept) and one scratch set for recompute */
    struct layer_acts *scratch;
    void *d_final;        /* final norm output (N,C) */
    float *d_final_rstd;
    void *d_logits;       /* (logits_rows, V) */
    void *d_dres;         /* residual-stream gradient (N,C) */
    void *d_dfinal;       /* (N,C) */
    void *bw_ni;          /* (N,I) backward scratch: the gradient of the SwiGLU output */
    void *bw_nc;          /* (N,C) */
    void *bw_q, *bw_k, *bw_v, *bw_q2, *bw_k2; /* backward scratch for attention */
    float *grad_embed;    /* embedding chunk's gradient (accumulates head and lookup when tied) */
    /* Untied: the embedding's gradient is written last in the backward, so it lives in the memory
     * of the two alternating buffers (allocated as one) instead of beside them. */
    bool embed_grad_in_pair;
    float *grad_bufs[2];  /* alternating gradient buffers for the other chunks */
    int64_t grad_buf_numel[2]; /* the largest such chunk's, and the largest of the rest's */
    int next_grad_buf;
    float **chunk_grads;  /* per chunk, when gradients accumulate on the device over micro-steps */

    /* host scratch */
    float *h_loss_rows;
};

/* Sets up buffers for micro-batches of B sequences of T tokens. keep_acts: per-layer activation
 * policy (NULL = keep everything). logits_rows: rows per cross-entropy chunk (0 = choose).
 * offload_inputs: the layer inputs wait for the backward in host memory (plan.offload_inputs). */
int model_init(struct model *m, struct backend *be, const struct model_config *cfg, const struct tensor_desc *tensors,
               int num_tensors, const struct chunk_desc *chunks, int num_chunks, int B, int T,
               const uint8_t *keep_acts, int logits_rows, bool offload_inputs);
void model_free(struct model *m);

/* Document attention for the micro-batches that follow: positions (host, B*T) gives each token's
 * position in its document, 0 at a document's first token (data_sequence_positions); each document
 * then attends only to itself and its RoPE positions start at 0. NULL: each row is one window
 * (whole-window causal attention, positions 0..T-1), the state after model_init. */
void model_set_positions(struct model *m, const int32_t *positions);

/* Forward, loss and backward of one micro-batch (host arrays of B*T entries). row_scale[i] is
 * the loss weight of target i (mask / count of unmasked targets in the global batch). loss_rows
 * receives each row's cross-entropy; correct (may be NULL) whether its argmax hit the target. */
int model_train_step(struct model *m, const struct model_io *io, const int32_t *tokens, const int32_t *targets,
                     const float *row_scale, float *loss_rows, int32_t *correct);

/* Keeps a gradient buffer per chunk on the device so that the micro-steps of a step accumulate
 * there and each chunk's sum goes out once (model_train_micro). */
int model_keep_grads_resident(struct model *m);

/* One micro-step of a step: with resident gradients, `first` zeroes them and only `last` hands
 * each chunk's sum to grads_done; otherwise every call hands out its own gradients. */
int model_train_micro(struct model *m, const struct model_io *io, const int32_t *tokens, const int32_t *targets,
                      const float *row_scale, float *loss_rows, int32_t *correct, bool first, bool last);

/* Forward only. logits (may be NULL): host (B*T, V) fp32 copy of the logits. */
int model_eval(struct model *m, const struct model_io *io, const int32_t *tokens, const int32_t *targets,
               float *loss_rows, int32_t *correct, float *logits);

/* RoPE tables (T, D/2) for the config, in fp32 as transformers computes them (inv_freq in fp32,
 * llama3 scaling applied, angle = position * inv_freq rounded to fp32). */
void model_rope_tables(const struct model_config *cfg, int T, float *cos_out, float *sin_out, float *inv_freq_out);

#endif
