/* Token embedding of the CUDA backend: the lookup (one block per token row) and its backward, a
 * scatter-add into the fp32 gradient with atomics (rows of repeated tokens collide). */
#include "cuda_common.cuh"

template <int VEC>
__global__ void embedding_fwd_kernel(bf16 *out, const int32_t *tokens, const bf16 *wte, int C)
{
    const bf16 *src = wte + (size_t)tokens[blockIdx.x] * C;
    bf16 *dst = out + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x * VEC; c < C; c += blockDim.x * VEC) {
        if constexpr (VEC == 8)
            *reinterpret_cast<uint4 *>(dst + c) = *reinterpret_cast<const uint4 *>(src + c);
        else
            dst[c] = src[c];
    }
}

__global__ void embedding_bwd_kernel(float *dwte, const bf16 *dout, const int32_t *tokens, int C)
{
    float *dst = dwte + (size_t)tokens[blockIdx.x] * C;
    const bf16 *src = dout + (size_t)blockIdx.x * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        atomicAdd(dst + c, __bfloat162float(src[c]));
}

void cuda_embedding_fwd(struct backend *be, void *out, const int32_t *tokens, const void *wte, int N, int C)
{
    if (N == 0 || C == 0)
        return;
    cudaStream_t st = cuda_ctx_of(be)->compute;
    if (C % 8 == 0 && cuda_aligned16(out) && cuda_aligned16(wte))
        embedding_fwd_kernel<8><<<N, 128, 0, st>>>((bf16 *)out, tokens, (const bf16 *)wte, C);
    else
        embedding_fwd_kernel<1><<<N, 128, 0, st>>>((bf16 *)out, tokens, (const bf16 *)wte, C);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_embedding_bwd(struct backend *be, float *dwte, const void *dout, const int32_t *tokens, int N, int C)
{
    if (N == 0 || C == 0)
        return;
    embedding_bwd_kernel<<<N, 256, 0, cuda_ctx_of(be)->compute>>>(dwte, (const bf16 *)dout, tokens, C);
    CUDA_CHECK(cudaGetLastError());
}
