/* cuDNN's fused flash attention for the CUDA backend, loaded at run time (dlopen of
 * libcudnn_graph.so.9): the causal SDPA forward and backward as composite operation graphs that
 * cuDNN's runtime-fusion engines compile into one kernel each. NULL plans mean cuDNN is absent,
 * turned off (SLIDEDP_ATTENTION=builtin) or has no engine for the shape: the caller then runs the
 * built-in kernels, which compute the same thing (lse in the same layout, so either backward
 * takes either forward's output).
 *
 * Document attention (backend.h's positions) runs the same graphs over ragged tensors, as
 * cudnn-frontend builds its packed (THD) SDPA: each batch entry of the plan is one document, with
 * its length (a padding mask) and the offsets of its rows in the token-major q, k, v tensors, so
 * that cuDNN skips the tiles outside documents. Its lse is token-major (tokens, Hq) in the plan's
 * scratch; the caller moves it to and from backend.h's (B, Hq, T). */
#ifndef SD_ATTENTION_CUDNN_H
#define SD_ATTENTION_CUDNN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cudnn_sdpa;

/* A document table on the device: seq (entries) each document's length (0 past the last
 * document); off_q, off_kv, off_stats (entries + 1, int64) the element offset of each document's
 * first token in the (tokens, Hq, D), (tokens, Hkv, D) and (tokens, Hq) tensors, the last one
 * each tensor's end. */
struct cudnn_docs {
    const int32_t *seq;
    const int64_t *off_q, *off_kv, *off_stats;
};

/* The forward (bwd = 0) or backward plan for a shape, built on first use; NULL as above. */
struct cudnn_sdpa *cudnn_sdpa_plan(int bwd, int B, int T, int Hq, int Hkv, int D);
/* Device scratch the plan needs per call (its workspace, and the backward's fp32 dQ
 * accumulator and row sums). */
size_t cudnn_sdpa_scratch_bytes(const struct cudnn_sdpa *p);
/* Queue on stream st; q,k,v,out,dout (B,T,H,D) bf16 and lse (B,Hq,T) fp32 as backend.h says.
 * Abort on a cuDNN error (backend ops have no error path). */
void cudnn_sdpa_fwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, void *out, float *lse, const void *q,
                    const void *k, const void *v);
void cudnn_sdpa_bwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, void *dq, void *dk, void *dv,
                    const void *dout, const void *q, const void *k, const void *v, const void *out,
                    const float *lse);

/* The plan for document tables of `entries` rows whose documents are at most `longest` tokens,
 * over tensors of `tokens` tokens; NULL as above (and before cuDNN 9.10). */
struct cudnn_sdpa *cudnn_sdpa_docs_plan(int bwd, int entries, int longest, int tokens, int Hq, int Hkv, int D);
/* Where the token-major lse lives in a document plan's scratch: the forward leaves it there, the
 * backward reads it there. */
float *cudnn_sdpa_docs_stats(const struct cudnn_sdpa *p, void *scratch);
/* false: cuDNN refused the call (said on stderr); the plan is then unusable and the caller runs the
 * built-in kernels */
bool cudnn_sdpa_docs_fwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, const struct cudnn_docs *docs,
                         void *out, const void *q, const void *k, const void *v);
bool cudnn_sdpa_docs_bwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, const struct cudnn_docs *docs,
                         void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v,
                         const void *out);

/* The deterministic backward (runtime.deterministic): one tile of attn_tiles.h's calls, as
 * cudnn-frontend builds its deterministic algorithm on Hopper (cuDNN keeps dP in its workspace and
 * makes dQ by a matmul, no atomics). nb batch entries, hq query heads over hkv KV heads, tq query
 * rows against tk key rows, read from (and, unless partial, written to) tensors of T rows per
 * sequence and Hq/Hkv heads; lse and the row sums compact (nb, hq, tq). A causal tile is a diagonal
 * one (query i sees keys up to i); the others take every pair. Partial outputs are compact
 * (nb, tq or tk, heads, D), fp32 where cuDNN builds it (cudnn_sdpa_tile_f32), else bf16. */
struct cudnn_tile {
    int nb, tq, tk, hq, hkv;
    int T, Hq, Hkv, D;
    bool causal, partial;
};
struct cudnn_sdpa *cudnn_sdpa_tile_plan(const struct cudnn_tile *t);
size_t cudnn_sdpa_workspace_bytes(const struct cudnn_sdpa *p);
bool cudnn_sdpa_tile_f32(const struct cudnn_sdpa *p);
/* false: cuDNN refused the call (said on stderr; the plan is then unusable) */
bool cudnn_sdpa_tile_bwd(struct cudnn_sdpa *p, cudaStream_t st, void *workspace, float *rowsum, void *dq, void *dk,
                         void *dv, const void *dout, const void *q, const void *k, const void *v, const void *out,
                         const float *lse);

#ifdef __cplusplus
}
#endif

#endif
