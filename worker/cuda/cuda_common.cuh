/* Shared by the CUDA backend's files (worker/cuda/): the backend context, check macros, bf16
 * load/store helpers for elementwise kernels, and the launchers each op file provides. */
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "common/err.h"
#include "worker/backend.h"
}

typedef __nv_bfloat16 bf16;

/* Errors inside ops cannot be returned (the interface has none): print the statement and stop. */
#define CUDA_CHECK(call)                                                                           \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "CUDA error: %s: %s at %s:%d\n", #call, cudaGetErrorString(e_), __FILE__, \
                    __LINE__);                                                                     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "cuBLAS error: %s: status %d at %s:%d\n", #call, (int)s_, __FILE__,      \
                    __LINE__);                                                                     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

struct cuda_alloc {
    void *p;
    size_t bytes;
};

/* The length of the document an average token is in (sum of squared lengths over tokens; a row's
 * padding counts as part of its last document) from which document windows take cuDNN's kernels:
 * at Qwen3-1.7B's heads, B=2 T=4096 on an H100 (docs/performance.md §11), forward + backward not
 * deterministic, documents of 64 tokens ran 0.509 ms on cuDNN's and 0.269 on the built-in kernels,
 * of 256 0.399 and 0.357, a lognormal mix (10 documents, mean 819) 0.718 and 1.173. Weighted by
 * tokens because a few long documents hold most of the pairs. */
#define CUDA_DOCS_CUDNN_MIN_LENGTH 512

/* The documents of the positions last uploaded with upload_positions, for cuDNN's document
 * attention (attention_cudnn.h): `table` on the device holds seq (entries int32, padded to 8
 * bytes), then four int64 arrays of entries + 1: each document's first token, and the element
 * offsets off_q, off_kv, off_stats that cuda_docs_offsets scales from it for a head layout. */
struct cuda_docs {
    const int32_t *pos;  /* the device positions described; NULL: none */
    int B, T;
    int entries;         /* table rows: a power of two >= the documents, the rest of length 0 */
    int longest;         /* a power of two >= the longest document (and >= 64) */
    void *table;
    size_t table_bytes;
    int scaled_hq, scaled_hkv, scaled_d; /* the layout off_* hold; 0: not scaled yet */
};

#define CUDA_ATTN_LANES_MAX 4

struct cuda_ctx {
    int device;
    int num_sms;
    cudaStream_t compute, h2d, d2h;
    cudaEvent_t compute_mark; /* compute's position, for a copy stream to wait on */
    cudaEvent_t h2d_done[BE_MAX_XFER_SLOTS], d2h_done[BE_MAX_XFER_SLOTS];
    cudaEvent_t act_done[BE_ACT_SLOTS]; /* each activation buffer's last copy, either direction */
    cublasLtHandle_t lt;
    cublasHandle_t cublas;        /* fallback for shapes cuBLASLt has no kernel for */
    void *lt_ws;
    size_t lt_ws_bytes;
    size_t budget, used;          /* bytes: what alloc may take, what it has taken */
    struct cuda_alloc *allocs;    /* live allocations, for the budget */
    size_t nallocs, cap_allocs;
    float *stage;                 /* fp32 staging for upload_f32/download_f32 */
    size_t stage_n;
    bf16 *grad_stage;             /* bf16 staging for send_grads_bf16_async, used on the d2h stream */
    float *weight_stage;          /* fp32 staging for fetch_weights_f32_async on the h2d stream (on first use) */
    void *scratch;                /* per-op device scratch (partials, attention row terms) */
    size_t scratch_bytes;
    size_t attn_tile_limit;       /* the deterministic attention backward's dP bound (attn_tiles.h) */
    int attn_tile_ng, attn_tile_rows; /* bench_attention: calls of these KV heads and rows instead (0: the bound's) */
    int attn_tile_lanes;          /* bench_attention: streams the calls' (batch, KV heads) groups alternate over,
                                   * each with its own scratch (0 or 1: the compute stream alone) */
    cudaStream_t attn_side[CUDA_ATTN_LANES_MAX - 1]; /* the other lanes' streams (made on first use), and their ends */
    cudaEvent_t attn_side_done[CUDA_ATTN_LANES_MAX - 1];
    int docs_cudnn_min_length;    /* document windows take cuDNN's kernels from this token-weighted mean
                                   * document length (CUDA_DOCS_CUDNN_MIN_LENGTH), else the built-in ones */
    struct cuda_docs docs;
};

static inline struct cuda_ctx *cuda_ctx_of(struct backend *be)
{
    return (struct cuda_ctx *)be->ctx;
}

/* Device scratch of at least `bytes` for the op being queued (grown on demand, counted against the
 * budget; aborts when it cannot grow, since ops have no error path). */
void *cuda_scratch(struct backend *be, size_t bytes);
/* The same, NULL when the budget has no room (the previous scratch is then gone). */
void *cuda_scratch_try(struct backend *be, size_t bytes);

static inline bool cuda_aligned16(const void *p)
{
    return ((uintptr_t)p & 15) == 0;
}

static inline unsigned cuda_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > (1u << 30) ? (1u << 30) : b);
}

/* VEC consecutive bf16 <-> fp32 through one 16-byte access (VEC 8) or scalar accesses (VEC 1). */
template <int VEC>
__device__ __forceinline__ void load_bf16(float *dst, const bf16 *src)
{
    if constexpr (VEC == 8) {
        uint4 u = *reinterpret_cast<const uint4 *>(src);
        const __nv_bfloat162 *h = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float2 f = __bfloat1622float2(h[i]);
            dst[2 * i] = f.x;
            dst[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++)
            dst[i] = __bfloat162float(src[i]);
    }
}

template <int VEC>
__device__ __forceinline__ void store_bf16(bf16 *dst, const float *src)
{
    if constexpr (VEC == 8) {
        uint4 u;
        __nv_bfloat162 *h = reinterpret_cast<__nv_bfloat162 *>(&u);
#pragma unroll
        for (int i = 0; i < 4; i++)
            h[i] = __floats2bfloat162_rn(src[2 * i], src[2 * i + 1]);
        *reinterpret_cast<uint4 *>(dst) = u;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; i++)
            dst[i] = __float2bfloat16_rn(src[i]);
    }
}

__device__ __forceinline__ float warp_sum(float x)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* ---- launchers, one family per file; each queues work on the backend's compute stream ---- */

/* elementwise.cu */
void cuda_convert_f32_to_bf16(cudaStream_t st, bf16 *dst, const float *src, size_t n);
void cuda_convert_bf16_to_f32(cudaStream_t st, float *dst, const bf16 *src, size_t n);
/* dst(n) = common/bf16.h f32_to_bf16(src(n)), exactly the optimizers' rounding (fetch_weights_f32_async). */
void cuda_round_weights_bf16(cudaStream_t st, bf16 *dst, const float *src, size_t n);
void cuda_swiglu_fwd(struct backend *be, void *out, const void *gate, const void *up, size_t n);
void cuda_swiglu_bwd(struct backend *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                     size_t n);
void cuda_add_inplace(struct backend *be, void *a, const void *b, size_t n);
void cuda_add_f32(struct backend *be, float *acc, const float *src, size_t n);
/* embedding.cu */
void cuda_embedding_fwd(struct backend *be, void *out, const int32_t *tokens, const void *wte, int N, int C);
void cuda_embedding_bwd(struct backend *be, float *dwte, const void *dout, const int32_t *tokens, int N, int C);
/* rmsnorm.cu */
void cuda_rmsnorm_fwd(struct backend *be, void *out, float *rstd, const void *inp, const void *w, int N, int C,
                      float eps);
void cuda_rmsnorm_bwd(struct backend *be, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                      const float *rstd, int N, int C, bool accumulate);
/* matmul.cu */
void cuda_matmul_fwd(struct backend *be, void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                     int OC);
void cuda_matmul_bwd(struct backend *be, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                     const void *w, int N, int IC, int OC, bool accumulate);
/* rope.cu */
void cuda_rope_fwd(struct backend *be, void *x, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                   int H, int D);
void cuda_rope_bwd(struct backend *be, void *dx, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                   int H, int D);
/* cross_entropy.cu */
void cuda_cross_entropy(struct backend *be, void *logits, float *loss_rows, int32_t *correct, const int32_t *targets,
                        const float *row_scale, int n, int V);
/* attention_fwd.cu, attention_bwd.cu */
bool cuda_attention_supports(struct backend *be, int D);
void cuda_upload_positions(struct backend *be, int32_t *dst, const int32_t *pos, int B, int T);
void cuda_attention_fwd(struct backend *be, void *out, float *lse, const void *q, const void *k, const void *v,
                        const int32_t *pos, int B, int T, int Hq, int Hkv, int D);
void cuda_attention_bwd(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                        const void *k, const void *v, const void *out, const float *lse, const int32_t *pos, int B,
                        int T, int Hq, int Hkv, int D);
/* The built-in backward kernels alone (deterministic; what cuda_attention_bwd falls back to). */
void cuda_attention_bwd_builtin(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                                const void *k, const void *v, const void *out, const float *lse, const int32_t *pos,
                                int B, int T, int Hq, int Hkv, int D);
/* attention_det.cu: how the deterministic backward cuts B x T into cuDNN calls (attn_tiles.h: the
 * bound's tiling, or the heads and rows bench_attention set); then that backward of whole windows
 * by cuDNN's deterministic engine, cut
 * into calls by attn_tiles.h; false (nothing to undo: the caller's kernels write every output) where
 * cuDNN has no plan for a call or the scratch does not fit. */
struct attn_tiling;
void cuda_attention_tiling(struct backend *be, int B, int T, int Hq, int Hkv, struct attn_tiling *t);
bool cuda_attention_bwd_tiles(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                              const void *k, const void *v, const void *out, const float *lse, int B, int T, int Hq,
                              int Hkv, int D);
