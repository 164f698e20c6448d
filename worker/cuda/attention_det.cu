/* The deterministic attention backward of whole windows (runtime.deterministic): cuDNN's
 * deterministic engine, which keeps dP in its workspace and makes dQ by a matmul instead of atomic
 * additions, over the calls of common/attn_tiles.h so that the workspace stays under the context's
 * bound. Whole sequences write dQ, dK and dV straight into the outputs; chunked sequences add each
 * tile's partial outputs into fp32 sums in the iterator's fixed order and round them once. The calls
 * of one (batch entries, KV heads) group stay in order on one stream; bench_attention can spread the
 * groups over several (attn_tile_lanes), each with its own scratch, to time the overlap. */
#include "attention_cudnn.h"
#include "cuda_common.cuh"

#include "common/attn_tiles.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

/* sum[i] += part[i], part fp32 or bf16 */
__global__ void tile_sum_kernel(float *sum, const void *part, bool part_f32, size_t n)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n)
        sum[i] += part_f32 ? ((const float *)part)[i] : __bfloat162float(((const bf16 *)part)[i]);
}

/* rows of width values from compact sum to dst, a row every stride elements, rounded to bf16 */
__global__ void tile_store_kernel(bf16 *dst, size_t stride, const float *sum, size_t rows, int width)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < rows * width)
        dst[i / width * stride + i % width] = __float2bfloat16(sum[i]);
}

static void tile_sum(cudaStream_t st, float *sum, const void *part, bool part_f32, size_t n)
{
    tile_sum_kernel<<<cuda_blocks(n, 256), 256, 0, st>>>(sum, part, part_f32, n);
    CUDA_CHECK(cudaGetLastError());
}

static void tile_store(cudaStream_t st, bf16 *dst, size_t stride, const float *sum, size_t rows, int width)
{
    tile_store_kernel<<<cuda_blocks(rows * width, 256), 256, 0, st>>>(dst, stride, sum, rows, width);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_attention_tiling(struct backend *be, int B, int T, int Hq, int Hkv, struct attn_tiling *t)
{
    const struct cuda_ctx *cx = cuda_ctx_of(be);
    if (cx->attn_tile_ng > 0 && Hkv % cx->attn_tile_ng == 0)
        attn_tiling_chunked(B, T, Hq, Hkv, cx->attn_tile_ng, cx->attn_tile_rows, t);
    else
        attn_tiling_choose(B, T, Hq, Hkv, cx->attn_tile_limit, t);
}

bool cuda_attention_bwd_tiles(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                              const void *k, const void *v, const void *out, const float *lse, int B, int T, int Hq,
                              int Hkv, int D)
{
    /* SLIDEDP_ATTENTION=det-builtin: the built-in kernels instead (cuDNN elsewhere), to compare steps */
    static const char *mode = getenv("SLIDEDP_ATTENTION");
    if (mode && !strcmp(mode, "det-builtin"))
        return false;
    struct cuda_ctx *cx = cuda_ctx_of(be);
    struct attn_tiling t;
    cuda_attention_tiling(be, B, T, Hq, Hkv, &t);
    const int G = Hq / Hkv;
    const bool chunked = t.nchunks > 1;
    auto tile_of = [&](const struct attn_tile_call &c) {
        return cudnn_tile{c.nb, c.tq, c.tk, c.ng * G, c.ng, T, Hq, Hkv, D, c.causal, chunked};
    };

    /* every call's plan first (a refusal leaves the outputs to the built-in kernels untouched), and
     * the largest workspace */
    struct attn_tile_iter it;
    struct attn_tile_call c;
    size_t workspace = 0;
    for (attn_tile_begin(&it, &t); attn_tile_next(&it, &c);) {
        struct cudnn_tile tile = tile_of(c);
        struct cudnn_sdpa *p = cudnn_sdpa_tile_plan(&tile);
        if (!p)
            return false;
        workspace = std::max(workspace, cudnn_sdpa_workspace_bytes(p));
    }
    /* The calls of a (batch entries, KV heads) group run in order on one lane; groups write disjoint
     * outputs, so lanes (bench_attention's attn_tile_lanes) change when work runs, never the bits. */
    const int groups = ((B + t.nb - 1) / t.nb) * (Hkv / t.ng);
    const int lanes = std::max(1, std::min({cx->attn_tile_lanes, CUDA_ATTN_LANES_MAX, groups}));
    struct attn_tile_scratch l;
    attn_tiling_scratch(&t, D, workspace, &l);
    const size_t lane_bytes = l.total; /* 256-byte aligned, as each piece */
    char *scratch = (char *)cuda_scratch_try(be, lane_bytes * lanes);
    if (!scratch) {
        static bool said;
        if (!said)
            fprintf(stderr, "cuda attention: the deterministic backward's %zu MiB of scratch do not fit the budget "
                            "(%s); using the built-in kernels\n",
                    (lane_bytes * lanes) >> 20, sd_errmsg());
        said = true;
        return false;
    }
    if (lanes > 1) {
        CUDA_CHECK(cudaEventRecord(cx->compute_mark, cx->compute));
        for (int i = 1; i < lanes; i++) {
            if (!cx->attn_side[i - 1]) { /* made on first use: only bench_attention asks for lanes */
                CUDA_CHECK(cudaStreamCreateWithFlags(&cx->attn_side[i - 1], cudaStreamNonBlocking));
                CUDA_CHECK(cudaEventCreateWithFlags(&cx->attn_side_done[i - 1], cudaEventDisableTiming));
            }
            CUDA_CHECK(cudaStreamWaitEvent(cx->attn_side[i - 1], cx->compute_mark, 0));
        }
    }
    bf16 *gq = (bf16 *)dq, *gk = (bf16 *)dk, *gv = (bf16 *)dv;

    int group = -1;
    bool ok = true;
    for (attn_tile_begin(&it, &t); attn_tile_next(&it, &c);) {
        group += c.group_start;
        const int lane = group % lanes;
        cudaStream_t st = lane ? cx->attn_side[lane - 1] : cx->compute;
        char *s = scratch + lane * lane_bytes;
        float *lse_c = (float *)(s + l.lse), *rowsum = (float *)(s + l.rowsum);
        float *dq_sum = (float *)(s + l.dq_sum), *dk_sum = (float *)(s + l.dk_sum), *dv_sum = (float *)(s + l.dv_sum);
        struct cudnn_tile tile = tile_of(c);
        struct cudnn_sdpa *p = cudnn_sdpa_tile_plan(&tile);
        const int h0 = c.g0 * G, hs = tile.hq;
        /* the call's first query and key elements in the (B, T, H, D) tensors */
        const size_t qo = (((size_t)c.b0 * T + c.q0) * Hq + h0) * D, ko = (((size_t)c.b0 * T + c.k0) * Hkv + c.g0) * D;
        if (c.qchunk_start) {
            /* the call's lse rows (nb x hs rows of (B, Hq, T), consecutive) made compact */
            const float *src = lse + ((size_t)c.b0 * Hq + h0) * T + c.q0;
            CUDA_CHECK(cudaMemcpy2DAsync(lse_c, (size_t)c.tq * 4, src, (size_t)T * 4, (size_t)c.tq * 4,
                                         (size_t)c.nb * hs, cudaMemcpyDeviceToDevice, st));
            if (chunked)
                CUDA_CHECK(cudaMemsetAsync(dq_sum, 0, (size_t)c.tq * hs * D * 4, st));
        }
        if (chunked && c.group_start) {
            CUDA_CHECK(cudaMemsetAsync(dk_sum, 0, (size_t)T * c.ng * D * 4, st));
            CUDA_CHECK(cudaMemsetAsync(dv_sum, 0, (size_t)T * c.ng * D * 4, st));
        }
        void *to_q = chunked ? (void *)(s + l.dq_part) : (void *)(gq + qo);
        void *to_k = chunked ? (void *)(s + l.dk_part) : (void *)(gk + ko);
        void *to_v = chunked ? (void *)(s + l.dv_part) : (void *)(gv + ko);
        if (!cudnn_sdpa_tile_bwd(p, st, s, rowsum, to_q, to_k, to_v, (const bf16 *)dout + qo, (const bf16 *)q + qo,
                                 (const bf16 *)k + ko, (const bf16 *)v + ko, (const bf16 *)out + qo, lse_c)) {
            ok = false; /* the lanes still join before the built-in kernels take over */
            break;
        }
        if (!chunked)
            continue;
        const bool f32 = cudnn_sdpa_tile_f32(p);
        const size_t krow = (size_t)c.ng * D; /* one key row of the sums */
        tile_sum(st, dq_sum, to_q, f32, (size_t)c.tq * hs * D);
        tile_sum(st, dk_sum + c.k0 * krow, to_k, f32, c.tk * krow);
        tile_sum(st, dv_sum + c.k0 * krow, to_v, f32, c.tk * krow);
        if (c.qchunk_end)
            tile_store(st, gq + qo, (size_t)Hq * D, dq_sum, c.tq, hs * D);
        if (c.group_end) {
            const size_t first = ((size_t)c.b0 * T * Hkv + c.g0) * D;
            tile_store(st, gk + first, (size_t)Hkv * D, dk_sum, T, (int)krow);
            tile_store(st, gv + first, (size_t)Hkv * D, dv_sum, T, (int)krow);
        }
    }
    for (int i = 1; i < lanes; i++) {
        CUDA_CHECK(cudaEventRecord(cx->attn_side_done[i - 1], cx->attn_side[i - 1]));
        CUDA_CHECK(cudaStreamWaitEvent(cx->compute, cx->attn_side_done[i - 1], 0));
    }
    return ok;
}
