/* cuDNN's fused flash attention for the CUDA backend, loaded at run time (dlopen of
 * libcudnn_graph.so.9): the causal SDPA forward and backward as composite operation graphs that
 * cuDNN's runtime-fusion engines compile into one kernel each. NULL plans mean cuDNN is absent,
 * turned off (SLIDEDP_ATTENTION=builtin) or has no engine for the shape: the caller then runs the
 * built-in kernels, which compute the same thing (lse in the same layout, so either backward
 * takes either forward's output). */
#ifndef SD_ATTENTION_CUDNN_H
#define SD_ATTENTION_CUDNN_H

#include <stddef.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cudnn_sdpa;

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

#ifdef __cplusplus
}
#endif

#endif
