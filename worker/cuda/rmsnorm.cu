/* RMSNorm of the CUDA backend. Forward: one warp per row, sum of squares in fp32, the normalised
 * value rounded to bf16 before the weight multiply (as HF). Backward: dinp one warp per row; dw
 * deterministically, as fixed row slices summed per column into partials and then added in slice
 * order (no atomics, so every run gives the same bits). */
#include "cuda_common.cuh"

#define NORM_WARPS 8
#define DW_COLS 64   /* columns of one dw partial block: 32 lanes x 2 */
#define DW_LANES 8   /* row lanes of one dw partial block */

template <int VEC>
__global__ void rmsnorm_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, int N, int C, float eps)
{
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const bf16 *x = inp + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float v[VEC];
        load_bf16<VEC>(v, x + c);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            ss += v[k] * v[k];
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (lane == 0)
        rstd[row] = r;
    bf16 *y = out + (size_t)row * C;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float v[VEC], wv[VEC];
        load_bf16<VEC>(v, x + c);
        load_bf16<VEC>(wv, w + c);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            v[k] = __bfloat162float(__float2bfloat16_rn(v[k] * r)) * wv[k];
        store_bf16<VEC>(y + c, v);
    }
}

/* dx_k = r*w_k*dy_k - x_k * r^3/C * sum_j dy_j*w_j*x_j  (= or += per accumulate) */
template <int VEC>
__global__ void rmsnorm_bwd_dx_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w, const float *rstd,
                                      int N, int C, bool accumulate)
{
    int row = blockIdx.x * NORM_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= N)
        return;
    const bf16 *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    bf16 *dx = dinp + (size_t)row * C;
    float r = rstd[row], dot = 0.0f;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC], gv[VEC], wv[VEC];
        load_bf16<VEC>(xv, x + c);
        load_bf16<VEC>(gv, dy + c);
        load_bf16<VEC>(wv, w + c);
#pragma unroll
        for (int k = 0; k < VEC; k++)
            dot += gv[k] * wv[k] * xv[k];
    }
    dot = warp_sum(dot);
    float coef = dot * r * r * r / (float)C;
    for (int c = lane * VEC; c < C; c += 32 * VEC) {
        float xv[VEC], gv[VEC], wv[VEC], o[VEC];
        load_bf16<VEC>(xv, x + c);
        load_bf16<VEC>(gv, dy + c);
        load_bf16<VEC>(wv, w + c);
        if (accumulate)
            load_bf16<VEC>(o, dx + c);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float g = r * wv[k] * gv[k] - xv[k] * coef;
            o[k] = accumulate ? o[k] + g : g;
        }
        store_bf16<VEC>(dx + c, o);
    }
}

/* partial[s][c] = sum over rows of slice s of dy[i][c] * bf16(x[i][c] * rstd[i]); grid (column
 * tiles, slices), each thread two columns and every DW_LANES-th row of the slice; lanes are summed
 * in a fixed order. */
__global__ void rmsnorm_bwd_dw_partial_kernel(float *partial, const bf16 *dout, const bf16 *inp, const float *rstd,
                                              int N, int C, int rows_per_slice)
{
    __shared__ float acc[DW_LANES][DW_COLS];
    int lane = threadIdx.x % 32, ly = threadIdx.x / 32;
    int c0 = blockIdx.x * DW_COLS + 2 * lane;
    int r_begin = blockIdx.y * rows_per_slice, r_end = min(N, r_begin + rows_per_slice);
    float a0 = 0.0f, a1 = 0.0f;
    for (int i = r_begin + ly; i < r_end; i += DW_LANES) {
        float r = rstd[i];
        const bf16 *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        if (c0 < C)
            a0 += __bfloat162float(dy[c0]) * __bfloat162float(__float2bfloat16_rn(__bfloat162float(x[c0]) * r));
        if (c0 + 1 < C)
            a1 += __bfloat162float(dy[c0 + 1]) *
                  __bfloat162float(__float2bfloat16_rn(__bfloat162float(x[c0 + 1]) * r));
    }
    acc[ly][2 * lane] = a0;
    acc[ly][2 * lane + 1] = a1;
    __syncthreads();
    if (ly == 0) {
#pragma unroll
        for (int k = 0; k < 2; k++) {
            float s = 0.0f;
            for (int l = 0; l < DW_LANES; l++)
                s += acc[l][2 * lane + k];
            if (c0 + k < C)
                partial[(size_t)blockIdx.y * C + c0 + k] = s;
        }
    }
}

__global__ void rmsnorm_bwd_dw_reduce_kernel(float *dw, const float *partial, int C, int slices)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float s = 0.0f;
    for (int k = 0; k < slices; k++)
        s += partial[(size_t)k * C + c];
    dw[c] += s;
}

static bool norm_vec8(int C, const void *a, const void *b, const void *c, const void *d = nullptr)
{
    return C % 8 == 0 && cuda_aligned16(a) && cuda_aligned16(b) && cuda_aligned16(c) && (!d || cuda_aligned16(d));
}

void cuda_rmsnorm_fwd(struct backend *be, void *out, float *rstd, const void *inp, const void *w, int N, int C,
                      float eps)
{
    if (N == 0 || C == 0)
        return;
    cudaStream_t st = cuda_ctx_of(be)->compute;
    unsigned blocks = (unsigned)((N + NORM_WARPS - 1) / NORM_WARPS);
    bf16 *o = (bf16 *)out;
    const bf16 *x = (const bf16 *)inp, *wt = (const bf16 *)w;
    if (norm_vec8(C, out, inp, w))
        rmsnorm_fwd_kernel<8><<<blocks, 32 * NORM_WARPS, 0, st>>>(o, rstd, x, wt, N, C, eps);
    else
        rmsnorm_fwd_kernel<1><<<blocks, 32 * NORM_WARPS, 0, st>>>(o, rstd, x, wt, N, C, eps);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_rmsnorm_bwd(struct backend *be, void *dinp, float *dw, const void *dout, const void *inp, const void *w,
                      const float *rstd, int N, int C, bool accumulate)
{
    if (N == 0 || C == 0)
        return;
    struct cuda_ctx *cx = cuda_ctx_of(be);
    cudaStream_t st = cx->compute;
    const bf16 *dy = (const bf16 *)dout, *x = (const bf16 *)inp, *wt = (const bf16 *)w;

    /* dw first: slices chosen from the shape and the SM count only, so the sum order is fixed. */
    int col_tiles = (C + DW_COLS - 1) / DW_COLS;
    int slices = (2 * cx->num_sms + col_tiles - 1) / col_tiles;
    int max_slices = (N + DW_LANES - 1) / DW_LANES;
    slices = slices < 1 ? 1 : slices > max_slices ? max_slices : slices;
    int rows_per_slice = (N + slices - 1) / slices;
    slices = (N + rows_per_slice - 1) / rows_per_slice;
    float *partial = (float *)cuda_scratch(be, (size_t)slices * C * sizeof(float));
    rmsnorm_bwd_dw_partial_kernel<<<dim3(col_tiles, slices), 32 * DW_LANES, 0, st>>>(partial, dy, x, rstd, N, C,
                                                                                   rows_per_slice);
    CUDA_CHECK(cudaGetLastError());
    rmsnorm_bwd_dw_reduce_kernel<<<cuda_blocks(C, 256), 256, 0, st>>>(dw, partial, C, slices);
    CUDA_CHECK(cudaGetLastError());

    unsigned blocks = (unsigned)((N + NORM_WARPS - 1) / NORM_WARPS);
    if (norm_vec8(C, dinp, dout, inp, w))
        rmsnorm_bwd_dx_kernel<8><<<blocks, 32 * NORM_WARPS, 0, st>>>((bf16 *)dinp, dy, x, wt, rstd, N, C, accumulate);
    else
        rmsnorm_bwd_dx_kernel<1><<<blocks, 32 * NORM_WARPS, 0, st>>>((bf16 *)dinp, dy, x, wt, rstd, N, C, accumulate);
    CUDA_CHECK(cudaGetLastError());
}
