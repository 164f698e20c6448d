/* Elementwise ops of the CUDA backend: SwiGLU forward/backward, in-place add, the fp32<->bf16
 * conversions behind upload_f32/download_f32 and the streamed master weights' rounding. 16-byte accesses when sizes and pointers allow. */
#include "cuda_common.cuh"

#include "common/bf16.h"

#define EW_THREADS 256

template <int VEC>
__global__ void convert_f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n)
{
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += (size_t)gridDim.x * blockDim.x * VEC) {
        float v[VEC];
#pragma unroll
        for (int k = 0; k < VEC; k++)
            v[k] = src[i + k];
        store_bf16<VEC>(dst + i, v);
    }
}

/* common/bf16.h's rounding, element by element: the optimizers' bf16 copy bit for bit (NaN too). */
__global__ void round_weights_bf16_kernel(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = f32_to_bf16(src[i]);
}

template <int VEC>
__global__ void convert_bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n)
{
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += (size_t)gridDim.x * blockDim.x * VEC) {
        float v[VEC];
        load_bf16<VEC>(v, src + i);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            dst[i + k] = v[k];
    }
}

template <int VEC>
__global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gate, const bf16 *up, size_t n)
{
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += (size_t)gridDim.x * blockDim.x * VEC) {
        float g[VEC], u[VEC], o[VEC];
        load_bf16<VEC>(g, gate + i);
        load_bf16<VEC>(u, up + i);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            o[k] = g[k] / (1.0f + expf(-g[k])) * u[k];
        store_bf16<VEC>(out + i, o);
    }
}

/* silu'(g) = sig(g) * (1 + g*(1 - sig(g))). Each element is read before it is written, so dgate and
 * dup may alias gate and up. */
template <int VEC>
__global__ void swiglu_bwd_kernel(bf16 *dgate, bf16 *dup, const bf16 *dout, const bf16 *gate, const bf16 *up, size_t n)
{
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += (size_t)gridDim.x * blockDim.x * VEC) {
        float g[VEC], u[VEC], d[VEC], dg[VEC], du[VEC];
        load_bf16<VEC>(g, gate + i);
        load_bf16<VEC>(u, up + i);
        load_bf16<VEC>(d, dout + i);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float sig = 1.0f / (1.0f + expf(-g[k]));
            dg[k] = d[k] * u[k] * sig * (1.0f + g[k] * (1.0f - sig));
            du[k] = d[k] * g[k] * sig;
        }
        store_bf16<VEC>(dgate + i, dg);
        store_bf16<VEC>(dup + i, du);
    }
}

template <int VEC>
__global__ void add_inplace_kernel(bf16 *a, const bf16 *b, size_t n)
{
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC; i < n; i += (size_t)gridDim.x * blockDim.x * VEC) {
        float x[VEC], y[VEC];
        load_bf16<VEC>(x, a + i);
        load_bf16<VEC>(y, b + i);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            x[k] += y[k];
        store_bf16<VEC>(a + i, x);
    }
}

__global__ void add_f32_kernel(float *acc, const float *src, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        acc[i] = __fadd_rn(acc[i], src[i]);
}

/* Whether n elements at every pointer can go 8 at a time through 16-byte accesses. */
static bool vec8_ok(size_t n, const void *a, const void *b, const void *c = nullptr, const void *d = nullptr,
                    const void *e = nullptr)
{
    return n % 8 == 0 && cuda_aligned16(a) && cuda_aligned16(b) && (!c || cuda_aligned16(c)) &&
           (!d || cuda_aligned16(d)) && (!e || cuda_aligned16(e));
}

void cuda_convert_f32_to_bf16(cudaStream_t st, bf16 *dst, const float *src, size_t n)
{
    if (n == 0)
        return;
    if (vec8_ok(n, dst, src))
        convert_f32_to_bf16_kernel<8><<<cuda_blocks(n / 8, EW_THREADS), EW_THREADS, 0, st>>>(dst, src, n);
    else
        convert_f32_to_bf16_kernel<1><<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(dst, src, n);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_round_weights_bf16(cudaStream_t st, bf16 *dst, const float *src, size_t n)
{
    if (n == 0)
        return;
    round_weights_bf16_kernel<<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(reinterpret_cast<uint16_t *>(dst),
                                                                                  src, n);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_convert_bf16_to_f32(cudaStream_t st, float *dst, const bf16 *src, size_t n)
{
    if (n == 0)
        return;
    if (vec8_ok(n, dst, src))
        convert_bf16_to_f32_kernel<8><<<cuda_blocks(n / 8, EW_THREADS), EW_THREADS, 0, st>>>(dst, src, n);
    else
        convert_bf16_to_f32_kernel<1><<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(dst, src, n);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_swiglu_fwd(struct backend *be, void *out, const void *gate, const void *up, size_t n)
{
    cudaStream_t st = cuda_ctx_of(be)->compute;
    if (n == 0)
        return;
    bf16 *o = (bf16 *)out;
    const bf16 *g = (const bf16 *)gate, *u = (const bf16 *)up;
    if (vec8_ok(n, out, gate, up))
        swiglu_fwd_kernel<8><<<cuda_blocks(n / 8, EW_THREADS), EW_THREADS, 0, st>>>(o, g, u, n);
    else
        swiglu_fwd_kernel<1><<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(o, g, u, n);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_swiglu_bwd(struct backend *be, void *dgate, void *dup, const void *dout, const void *gate, const void *up,
                     size_t n)
{
    cudaStream_t st = cuda_ctx_of(be)->compute;
    if (n == 0)
        return;
    bf16 *dg = (bf16 *)dgate, *du = (bf16 *)dup;
    const bf16 *d = (const bf16 *)dout, *g = (const bf16 *)gate, *u = (const bf16 *)up;
    if (vec8_ok(n, dgate, dup, dout, gate, up))
        swiglu_bwd_kernel<8><<<cuda_blocks(n / 8, EW_THREADS), EW_THREADS, 0, st>>>(dg, du, d, g, u, n);
    else
        swiglu_bwd_kernel<1><<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>(dg, du, d, g, u, n);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_add_inplace(struct backend *be, void *a, const void *b, size_t n)
{
    cudaStream_t st = cuda_ctx_of(be)->compute;
    if (n == 0)
        return;
    if (vec8_ok(n, a, b))
        add_inplace_kernel<8><<<cuda_blocks(n / 8, EW_THREADS), EW_THREADS, 0, st>>>((bf16 *)a, (const bf16 *)b, n);
    else
        add_inplace_kernel<1><<<cuda_blocks(n, EW_THREADS), EW_THREADS, 0, st>>>((bf16 *)a, (const bf16 *)b, n);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_add_f32(struct backend *be, float *acc, const float *src, size_t n)
{
    if (n == 0)
        return;
    add_f32_kernel<<<cuda_blocks(n, 256), 256, 0, cuda_ctx_of(be)->compute>>>(acc, src, n);
    CUDA_CHECK(cudaGetLastError());
}
