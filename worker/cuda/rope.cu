/* Rotary position embedding of the CUDA backend, in place on (B,T,H,D) bf16 rows: dim j pairs with
 * j+D/2 (HF rotate_half), angles from fp32 (T,D/2) tables at each token's position in its document
 * (backend.h), rotation computed in fp32. */
#include "cuda_common.cuh"

/* One thread rotates VEC consecutive pairs; sign -1 applies the inverse rotation (backward). */
template <int VEC>
__global__ void rope_kernel(bf16 *x, const float *cos, const float *sin, const int32_t *pos, int T, int H, int half,
                            float sign, size_t total)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total)
        return;
    int per_row = half / VEC;
    size_t row = idx / per_row; /* (b, t, h) */
    int j = (int)(idx % per_row) * VEC;
    size_t bt = row / H;
    int t = pos ? pos[bt] : (int)(bt % T);
    bf16 *v = x + row * (size_t)(2 * half);
    const float *ct = cos + (size_t)t * half + j, *st = sin + (size_t)t * half + j;
    float x1[VEC], x2[VEC], y1[VEC], y2[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        x1[k] = __bfloat162float(v[j + k]);
        x2[k] = __bfloat162float(v[j + half + k]);
    }
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        float c = ct[k], s = sign * st[k];
        y1[k] = x1[k] * c - x2[k] * s;
        y2[k] = x2[k] * c + x1[k] * s;
    }
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        v[j + k] = __float2bfloat16_rn(y1[k]);
        v[j + half + k] = __float2bfloat16_rn(y2[k]);
    }
}

static void rope_launch(struct backend *be, void *x, const float *cos, const float *sin, const int32_t *pos, int B,
                        int T, int H, int D, float sign)
{
    SD_ASSERT(D % 2 == 0);
    int half = D / 2;
    size_t rows = (size_t)B * T * H;
    if (rows == 0 || half == 0)
        return;
    cudaStream_t st = cuda_ctx_of(be)->compute;
    if (half % 4 == 0) {
        size_t total = rows * (half / 4);
        rope_kernel<4><<<cuda_blocks(total, 256), 256, 0, st>>>((bf16 *)x, cos, sin, pos, T, H, half, sign, total);
    } else {
        size_t total = rows * half;
        rope_kernel<1><<<cuda_blocks(total, 256), 256, 0, st>>>((bf16 *)x, cos, sin, pos, T, H, half, sign, total);
    }
    CUDA_CHECK(cudaGetLastError());
}

void cuda_rope_fwd(struct backend *be, void *x, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                   int H, int D)
{
    rope_launch(be, x, cos, sin, pos, B, T, H, D, 1.0f);
}

void cuda_rope_bwd(struct backend *be, void *dx, const float *cos, const float *sin, const int32_t *pos, int B, int T,
                   int H, int D)
{
    rope_launch(be, dx, cos, sin, pos, B, T, H, D, -1.0f);
}
