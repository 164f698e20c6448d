/* Cross-entropy of the CUDA backend over bf16 logit rows (V up to ~152k): one block per row, an
 * online max / sum of exponentials in fp32 with the first-max argmax, the row loss in fp32, and
 * optionally the gradient (softmax - onehot) * row_scale written over the logits in bf16. fp32
 * logits are never materialised. Accurate expf/logf: no fast-math here. */
#include "cuda_common.cuh"

#include <float.h>
#include <limits.h>

#define CE_THREADS 512

/* Running state of a thread: max m, sum of exp(x - m), index of the first max. */
struct ce_state {
    float m, s;
    int idx;
};

__device__ __forceinline__ void ce_visit(ce_state &st, float v, int j)
{
    if (v > st.m) {
        st.s = st.s * expf(st.m - v) + 1.0f;
        st.m = v;
        st.idx = j;
    } else {
        st.s += expf(v - st.m);
    }
}

__device__ __forceinline__ ce_state ce_merge(ce_state a, ce_state b)
{
    ce_state r;
    r.m = fmaxf(a.m, b.m);
    if (r.m == -INFINITY) {
        r.s = 0.0f;
    } else {
        r.s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - r.m)) + (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - r.m));
    }
    r.idx = a.m > b.m ? a.idx : b.m > a.m ? b.idx : min(a.idx, b.idx);
    return r;
}

/* Calls f(value, column) for every element of the row x[0..V): a scalar head up to 16-byte
 * alignment, 8-element vectors, a scalar tail; each thread sees its columns in increasing order. */
template <typename F>
__device__ __forceinline__ void ce_for_row(const bf16 *x, int V, F f)
{
    int head = (int)(((16 - ((uintptr_t)x & 15)) & 15) / 2);
    head = head > V ? V : head;
    for (int j = threadIdx.x; j < head; j += blockDim.x)
        f(__bfloat162float(x[j]), j);
    int nvec = (V - head) / 8;
    for (int b = threadIdx.x; b < nvec; b += blockDim.x) {
        float v[8];
        int j = head + 8 * b;
        load_bf16<8>(v, x + j);
#pragma unroll
        for (int k = 0; k < 8; k++)
            f(v[k], j + k);
    }
    for (int j = head + 8 * nvec + threadIdx.x; j < V; j += blockDim.x)
        f(__bfloat162float(x[j]), j);
}

__global__ void __launch_bounds__(CE_THREADS) cross_entropy_kernel(bf16 *logits, float *loss_rows, int32_t *correct,
                                                                   const int32_t *targets, const float *row_scale,
                                                                   int V)
{
    __shared__ ce_state warp_st[CE_THREADS / 32];
    __shared__ float row_lse;
    bf16 *x = logits + (size_t)blockIdx.x * V;
    int tgt = targets[blockIdx.x];
    float x_tgt = __bfloat162float(x[tgt]);

    ce_state st = {-INFINITY, 0.0f, INT_MAX};
    ce_for_row(x, V, [&](float v, int j) { ce_visit(st, v, j); });
    for (int o = 16; o > 0; o >>= 1) {
        ce_state other = {__shfl_xor_sync(0xffffffffu, st.m, o), __shfl_xor_sync(0xffffffffu, st.s, o),
                          __shfl_xor_sync(0xffffffffu, st.idx, o)};
        st = ce_merge(st, other);
    }
    int warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0)
        warp_st[warp] = st;
    __syncthreads();
    if (threadIdx.x == 0) {
        ce_state r = warp_st[0];
        for (int w = 1; w < CE_THREADS / 32; w++)
            r = ce_merge(r, warp_st[w]);
        float lse = r.m + logf(r.s);
        row_lse = lse;
        loss_rows[blockIdx.x] = lse - x_tgt;
        if (correct)
            correct[blockIdx.x] = r.idx == tgt;
    }
    __syncthreads();
    if (!row_scale)
        return;
    float lse = row_lse, scale = row_scale[blockIdx.x];
    int head = (int)(((16 - ((uintptr_t)x & 15)) & 15) / 2);
    head = head > V ? V : head;
    for (int j = threadIdx.x; j < head; j += blockDim.x)
        x[j] = __float2bfloat16_rn((expf(__bfloat162float(x[j]) - lse) - (float)(j == tgt)) * scale);
    int nvec = (V - head) / 8;
    for (int b = threadIdx.x; b < nvec; b += blockDim.x) {
        float v[8];
        int j = head + 8 * b;
        load_bf16<8>(v, x + j);
#pragma unroll
        for (int k = 0; k < 8; k++)
            v[k] = (expf(v[k] - lse) - (float)(j + k == tgt)) * scale;
        store_bf16<8>(x + j, v);
    }
    for (int j = head + 8 * nvec + threadIdx.x; j < V; j += blockDim.x)
        x[j] = __float2bfloat16_rn((expf(__bfloat162float(x[j]) - lse) - (float)(j == tgt)) * scale);
}

void cuda_cross_entropy(struct backend *be, void *logits, float *loss_rows, int32_t *correct, const int32_t *targets,
                        const float *row_scale, int n, int V)
{
    if (n == 0)
        return;
    SD_ASSERT(V > 0);
    cross_entropy_kernel<<<n, CE_THREADS, 0, cuda_ctx_of(be)->compute>>>((bf16 *)logits, loss_rows, correct, targets,
                                                                        row_scale, V);
    CUDA_CHECK(cudaGetLastError());
}
