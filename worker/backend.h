/* The compute backend interface of a worker: memory, transfers and the model's ops, each op a
 * forward/backward pair. The model code (worker/model.c) is written once against this table; the
 * CPU backend (worker/cpu/) computes in fp32 from bf16 weights with OpenBLAS, the CUDA backend
 * (worker/cuda/) in bf16 with fp32 accumulation. Tests compare every op of every backend against
 * the CPU backend (tests/test_backend_ops.c).
 *
 * Element types. A backend stores weights as `weight_dtype` and activations as `act_dtype`
 * (BE_F32 on the CPU backend, BE_BF16 on CUDA). Buffers typed `void *` below hold activations
 * (or weights where named w/wte); buffers typed `float *` are always fp32 (gradients of weights,
 * rstd, lse, per-row losses). Integer buffers are int32. All buffers are device memory from
 * be->ops->alloc unless they are named *_host.
 *
 * Shapes are row-major, given in comments as (rows, cols); N = B*T token rows.
 * Weight gradient outputs (dw, dbias, dwte) always accumulate (+=); activation gradient outputs
 * overwrite unless the op takes an `accumulate` flag. All ops run in order on the backend's
 * compute stream; transfers named *_async run on copy streams and are ordered with events. */
#ifndef SD_BACKEND_H
#define SD_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum be_dtype { BE_F32 = 0, BE_BF16 = 1 };

static inline size_t be_dtype_size(enum be_dtype t)
{
    return t == BE_F32 ? 4 : 2;
}

struct backend;

/* Transfer slots: a small set of independent async copies (e.g. one per chunk ring buffer). */
#define BE_MAX_XFER_SLOTS 1024
#define BE_ACT_SLOTS 2 /* device buffers of offloaded layer inputs */
/* A streamed master's fp32 weights cross in pieces of this many through one device staging buffer
 * (32 MiB), each rounded to bf16 behind its copy (fetch_weights_f32_async; priced by the planner). */
#define BE_MASTER_STAGE_FLOATS ((size_t)8 << 20)

struct backend_ops {
    const char *name;

    /* ---- memory ---- */
    void *(*alloc)(struct backend *be, size_t bytes); /* NULL + sd_err on failure */
    void (*free)(struct backend *be, void *p);
    void (*memset0)(struct backend *be, void *p, size_t bytes);
    /* Host <-> device copies, synchronous, for setup and tests. */
    void (*upload)(struct backend *be, void *dst, const void *src_host, size_t bytes);
    void (*download)(struct backend *be, void *dst_host, const void *src, size_t bytes);
    /* Synchronous conversions between fp32 host arrays and activation/weight-typed device arrays. */
    void (*upload_f32)(struct backend *be, void *dst, enum be_dtype dst_type, const float *src_host, size_t n);
    void (*download_f32)(struct backend *be, float *dst_host, const void *src, enum be_dtype src_type, size_t n);
    /* Waits until all queued work (compute and copies) has finished. */
    void (*synchronize)(struct backend *be);

    /* ---- streaming (docs/design.md §6.1) ---- */
    /* Makes the host memory [p, p+bytes) usable for async DMA (cudaHostRegister). read_only for
     * the weights workers stream (params16 or the master), which they map PROT_READ. No-op on the
     * CPU backend. */
    int (*register_host)(struct backend *be, void *p, size_t bytes, bool read_only);
    void (*unregister_host)(struct backend *be, void *p);
    /* Starts copying n bf16 weights from registered host memory into the device weight buffer dst
     * (converted to weight_dtype), after which compute work queued by wait_weights(slot) may run. */
    void (*fetch_weights_async)(struct backend *be, int slot, void *dst, const uint16_t *src_host, size_t n);
    /* The same from n fp32 weights (the master, when workers stream it: docs/design.md §4.3), each
     * rounded to bf16 by common/bf16.h f32_to_bf16 on the device, so dst holds what fetching the
     * optimizers' bf16 copy would give, bit for bit. */
    void (*fetch_weights_f32_async)(struct backend *be, int slot, void *dst, const float *src_host, size_t n);
    /* Makes the compute stream wait for the slot's last fetch. */
    void (*wait_weights)(struct backend *be, int slot);
    /* Starts copying n fp32 gradients from device dst to registered host memory, after the
     * compute work queued so far. */
    void (*send_grads_async)(struct backend *be, int slot, float *dst_host, const float *src, size_t n);
    /* The same, rounding each gradient to bf16 (nearest even) on the device on the way. */
    void (*send_grads_bf16_async)(struct backend *be, int slot, uint16_t *dst_host, const float *src, size_t n);
    /* Blocks the calling thread until the slot's last send has landed in host memory. */
    void (*wait_grads_host)(struct backend *be, int slot);
    /* Makes compute queued from now on wait until the slot's last send has read its device
     * source, so that buffer may be overwritten. */
    void (*wait_grads_device)(struct backend *be, int slot);

    /* ---- layer inputs offloaded to host memory (docs/design.md §6.1) ---- */
    /* Starts copying bytes between device memory and registered host memory: from dev to host
     * (save) or from host to dev, after the compute queued so far, on the copy engine of that
     * direction. slot (< BE_ACT_SLOTS) names the device buffer, for wait_activations. */
    void (*copy_activations_async)(struct backend *be, int slot, bool save, void *dev, void *host, size_t bytes);
    /* Makes compute queued from now on wait for the slot's last copy (a save has read the buffer,
     * a load has filled it). */
    void (*wait_activations)(struct backend *be, int slot);

    /* ---- exchange between workers (docs/design.md §7.3) ---- */
    /* Device memory other processes can map, named by the 64 bytes written to *handle (CUDA IPC).
     * NULL on a backend whose exchange windows live in shared host memory (CPU). */
    void *(*alloc_exported)(struct backend *be, size_t bytes, void *handle);
    /* Maps memory another process exported (alloc_exported); NULL + sd_err on failure. */
    void *(*open_peer)(struct backend *be, const void *handle);
    /* dst = src (bytes), device to device, src possibly a peer's memory; on the compute stream. */
    void (*copy_device)(struct backend *be, void *dst, const void *src, size_t bytes);
    /* acc(n) += src(n) in fp32, each element one IEEE add (the optimizer's sum, bit for bit). */
    void (*add_f32)(struct backend *be, float *acc, const float *src, size_t n);

    /* ---- ops ---- */
    /* out(N,C) = wte[tokens[i]] */
    void (*embedding_fwd)(struct backend *be, void *out, const int32_t *tokens, const void *wte, int N, int C);
    /* dwte(V,C) += scatter-add of dout(N,C) rows to rows tokens[i] */
    void (*embedding_bwd)(struct backend *be, float *dwte, const void *dout, const int32_t *tokens, int N, int C);

    /* out(N,C) = inp / sqrt(mean(inp^2) + eps) * w ; rstd(N) = 1/sqrt(mean(inp^2)+eps).
     * The normalised value is rounded to act_dtype before the multiply by w (as HF does). */
    void (*rmsnorm_fwd)(struct backend *be, void *out, float *rstd, const void *inp, const void *w, int N, int C,
                        float eps);
    /* dinp(N,C) (= or += per accumulate), dw(C) += */
    void (*rmsnorm_bwd)(struct backend *be, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                        const float *rstd, int N, int C, bool accumulate);

    /* out(N,OC) = inp(N,IC) @ w(OC,IC)^T + bias(OC) (bias may be NULL; w is weight-typed, bias
     * weight-typed) */
    void (*matmul_fwd)(struct backend *be, void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                       int OC);
    /* dinp(N,IC) = dout @ w (or += with accumulate; skipped when dinp is NULL);
     * dw(OC,IC) += dout^T @ inp ; dbias(OC) += column sums of dout (skipped when NULL) */
    void (*matmul_bwd)(struct backend *be, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                       const void *w, int N, int IC, int OC, bool accumulate);

    /* Document positions. pos (may be NULL) is a device int32 array (B,T): each token's position in
     * its document, 0 at a document's first token and counting up by one to the document's end (so
     * a row is a run of documents; token t's document starts at t - pos[t]). NULL: the row is one
     * document, pos[t] = t. The first token of every row has position 0. */
    /* Uploads positions pos (B,T) from the host into dst, as upload does, and lets the backend
     * derive what its attention needs from the host copy (the CUDA backend: a table of the
     * documents for cuDNN). Attention on dst is valid until the next upload into it. */
    void (*upload_positions)(struct backend *be, int32_t *dst, const int32_t *pos, int B, int T);

    /* In place on x(B,T,H,D): non-interleaved rotation, dim j pairs with j+D/2 (HF rotate_half):
     *   x1' = x1*cos - x2*sin ; x2' = x2*cos + x1*sin   for j < D/2, at position pos[t] (t when
     *   pos is NULL). cos, sin: fp32 tables (T, D/2) uploaded by the model code. */
    void (*rope_fwd)(struct backend *be, void *x, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                     int H, int D);
    /* In place on dx: the transpose (inverse) rotation. */
    void (*rope_bwd)(struct backend *be, void *dx, const float *cos, const float *sin, const int32_t *pos, int B,
                     int T, int H, int D);

    /* Causal attention within documents, with grouped KV heads: q(B,T,Hq,D), k,v(B,T,Hkv,D), query
     * t attends keys t - pos[t] .. t of its row (0 .. t when pos is NULL); query head h uses kv head
     * h / (Hq/Hkv); scale 1/sqrt(D); softmax in fp32. out(B,T,Hq,D), lse(B,Hq,T) the natural
     * log-sum-exp of each query row's scaled scores (kept for the backward). Work on key blocks
     * wholly before a query block's documents is skipped, not masked. No (T,T) matrix may be stored
     * in device memory by a backend meant for long sequences. */
    void (*attention_fwd)(struct backend *be, void *out, float *lse, const void *q, const void *k, const void *v,
                          const int32_t *pos, int B, int T, int Hq, int Hkv, int D);
    /* dq(B,T,Hq,D), dk, dv(B,T,Hkv,D), overwritten. */
    void (*attention_bwd)(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                          const void *k, const void *v, const void *out, const float *lse, const int32_t *pos, int B,
                          int T, int Hq, int Hkv, int D);

    /* out(n) = silu(gate) * up, silu(x) = x / (1 + exp(-x)) */
    void (*swiglu_fwd)(struct backend *be, void *out, const void *gate, const void *up, size_t n);
    /* dgate, dup (n) overwritten; each element is read before it is written, so dgate may be gate
     * and dup may be up */
    void (*swiglu_bwd)(struct backend *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                       size_t n);

    /* a(n) += b(n) */
    void (*add_inplace)(struct backend *be, void *a, const void *b, size_t n);

    /* Cross-entropy over rows of logits(n,V) with integer targets(n). For each row i:
     *   loss_rows[i] = logsumexp(logits_i) - logits_i[targets_i]          (fp32, device)
     *   correct[i]   = argmax(logits_i) == targets_i (first max wins)      (int32, device; may be NULL)
     * and, when row_scale is not NULL, the logits row is overwritten with its gradient
     *   dlogits_i = (softmax(logits_i) - onehot(targets_i)) * row_scale[i]
     * (row_scale = loss mask / number of unmasked targets in the global batch; 0 skips the row's
     * gradient). Targets are always valid token ids. */
    void (*cross_entropy)(struct backend *be, void *logits, float *loss_rows, int32_t *correct, const int32_t *targets,
                          const float *row_scale, int n, int V);

    /* ---- capabilities ---- */
    /* Optional (NULL: every head_dim): whether attention_fwd/bwd accept this head_dim. A backend
     * with fixed kernel shapes says so here instead of failing inside the op. */
    bool (*attention_supports)(struct backend *be, int head_dim);
};

struct backend {
    const struct backend_ops *ops;
    void *ctx;
    enum be_dtype act_dtype;
    enum be_dtype weight_dtype;
    char device_name[64];  /* e.g. "NVIDIA H200", "cpu" */
    double peak_flops;     /* dense bf16 peak of the device, 0 when unknown (monitors' MFU) */
    bool deterministic;    /* every op gives the same bits on every run (init: false; the CUDA backend's
                            * attention backward and embedding backward then avoid racing atomics) */
};

/* Backends compiled into this build. */
int backend_cpu_init(struct backend *be);
void backend_cpu_free(struct backend *be);
#ifdef SD_HAVE_CUDA
/* device: CUDA ordinal; mem_budget: bytes the arena may take (0 = all free memory). */
int backend_cuda_init(struct backend *be, int device, size_t mem_budget);
void backend_cuda_free(struct backend *be);
/* The bound on the dP workspace of the deterministic attention backward's cuDNN calls (default
 * ATTN_TILE_WORKSPACE_DEFAULT, common/attn_tiles.h): the worker sets the plan's; tests set it small
 * to cut calls into tiles. */
void backend_cuda_set_attention_tile_limit(struct backend *be, size_t bytes);
/* Document windows whose documents are shorter than this (the token-weighted mean length) run the
 * built-in attention kernels, the others cuDNN's over a table of the documents (default
 * CUDA_DOCS_CUDNN_MIN_LENGTH, worker/cuda/cuda_common.cuh); tests set 0 to take cuDNN's on any. */
void backend_cuda_set_docs_cudnn_min_length(struct backend *be, int tokens);
#endif

#endif
