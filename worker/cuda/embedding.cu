/* Token embedding of the CUDA backend: the lookup (one block per token row) and its backward, a
 * scatter-add into the fp32 gradient: with atomics (rows of repeated tokens collide, summed in the
 * order the blocks run), or, deterministic, by sorting the token positions (a stable radix sort)
 * and letting one block add each token's rows in position order, as the CPU backend does. */
#include <cub/device/device_radix_sort.cuh>

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

__global__ void iota_kernel(int32_t *x, int N)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < N)
        x[i] = i;
}

/* Block p starts a run of equal tokens in sorted (token, position) order, or returns: it adds the
 * run's rows into the token's gradient row in position order. */
__global__ void embedding_bwd_sorted_kernel(float *dwte, const bf16 *dout, const int32_t *sorted_tokens,
                                            const int32_t *positions, int N, int C)
{
    int p = blockIdx.x;
    int32_t token = sorted_tokens[p];
    if (p > 0 && sorted_tokens[p - 1] == token)
        return;
    float *dst = dwte + (size_t)token * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = dst[c];
        for (int j = p; j < N && sorted_tokens[j] == token; j++)
            acc += __bfloat162float(dout[(size_t)positions[j] * C + c]);
        dst[c] = acc;
    }
}

static size_t align256(size_t x)
{
    return (x + 255) & ~(size_t)255;
}

static void embedding_bwd_deterministic(struct backend *be, float *dwte, const bf16 *dout, const int32_t *tokens,
                                        int N, int C)
{
    cudaStream_t st = cuda_ctx_of(be)->compute;
    size_t temp_bytes = 0, ints = align256((size_t)N * sizeof(int32_t));
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, (const int32_t *)nullptr, (int32_t *)nullptr,
                                               (const int32_t *)nullptr, (int32_t *)nullptr, N, 0, 32, st));
    char *scratch = (char *)cuda_scratch(be, 3 * ints + temp_bytes);
    int32_t *sorted = (int32_t *)scratch, *order = (int32_t *)(scratch + ints), *positions = (int32_t *)(scratch + 2 * ints);
    iota_kernel<<<cuda_blocks((size_t)N, 256), 256, 0, st>>>(order, N);
    CUDA_CHECK(cudaGetLastError());
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(scratch + 3 * ints, temp_bytes, tokens, sorted, order, positions, N, 0,
                                               32, st));
    embedding_bwd_sorted_kernel<<<N, 256, 0, st>>>(dwte, dout, sorted, positions, N, C);
    CUDA_CHECK(cudaGetLastError());
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
    if (be->deterministic) {
        embedding_bwd_deterministic(be, dwte, (const bf16 *)dout, tokens, N, C);
        return;
    }
    embedding_bwd_kernel<<<N, 256, 0, cuda_ctx_of(be)->compute>>>(dwte, (const bf16 *)dout, tokens, C);
    CUDA_CHECK(cudaGetLastError());
}
