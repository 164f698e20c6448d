/* Tensor-core building blocks of the flash-attention kernels (attention_fwd.cu, attention_bwd.cu):
 * cp.async tile copies into padded shared memory, ldmatrix fragment loads and the
 * mma.sync m16n8k16 bf16 -> fp32 instruction.
 *
 * Fragment layouts of mma.m16n8k16 (g = lane/4, t = lane%4):
 *   A (16x16, row-major) a0:(g, 2t..2t+1) a1:(g+8, 2t..) a2:(g, 2t+8..) a3:(g+8, 2t+8..)
 *   B (16x8, k x n)      b0:(k 2t..2t+1, n g) b1:(k 2t+8.., n g)
 *   C (16x8, fp32)       c0,c1:(g, 2t..2t+1) c2,c3:(g+8, 2t..2t+1)
 * so the C fragments of two adjacent n-tiles, rounded to bf16, are the A fragment of a 16-wide
 * k-step: P and dS never leave registers. */
#pragma once

#include "cuda_common.cuh"
#ifdef SD_HAVE_CUDNN
#include "attention_cudnn.h"

/* attention_fwd.cu: the document table that upload_positions made for pos (false when it made
 * none for this pos and shape), with its offsets for this head layout; and lse moved between
 * backend.h's (B, H, T) and cuDNN's token-major (B*T, H). */
bool cuda_docs_for(struct backend *be, const int32_t *pos, int B, int T, int Hq, int Hkv, int D,
                   struct cudnn_docs *table, int *entries, int *longest);
void cuda_lse_layout(cudaStream_t st, float *dst, const float *src, int B, int T, int H, bool to_token_major);
#endif

/* Shared-memory rows are padded by 16 bytes so that the 8 rows one ldmatrix reads fall in
 * different banks. */
template <int D>
struct att_dims {
    static constexpr int LD = D + 8; /* elements per shared-memory row */
    static constexpr int KT = D / 16; /* k-steps over the head dimension */
    static constexpr int DT = D / 8;  /* n-tiles over the head dimension */
};

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared; zero-fills when !valid (rows past T). */
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

/* Rows [row0, row0+ROWS) of a (T, stride)-strided bf16 matrix of D columns into sm (LD-padded),
 * by all THREADS threads of the block. */
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(bf16 *sm, const bf16 *g, int row0, int T, size_t stride)
{
    constexpr int CPR = D / 8; /* 16-byte chunks per row */
#pragma unroll
    for (int i = threadIdx.x; i < ROWS * CPR; i += THREADS) {
        int r = i / CPR, c = (i % CPR) * 8;
        int row = row0 + r;
        bool valid = row < T;
        cp_async16(sm + r * att_dims<D>::LD + c, g + (size_t)(valid ? row : 0) * stride + c, valid);
    }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* c += a @ b */
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&h);
}

/* The first key of row t's document (backend.h), for rows past T that of row T-1 (they are never
 * written, and a later start would only skip more). pb: the batch row's positions. */
__device__ __forceinline__ int doc_start(const int32_t *pb, int t, int T)
{
    t = min(t, T - 1);
    return t - pb[t];
}

/* The end (exclusive) of the document holding token t: the next document's first token, or T. All
 * threads of the block call it and get the same answer; s_end is one int of shared memory. */
template <int THREADS>
__device__ int doc_end_block(const int32_t *pb, int t, int T, int *s_end)
{
    if (threadIdx.x == 0)
        *s_end = T;
    __syncthreads();
    for (int base = t + 1; base < T; base += THREADS) {
        int u = base + threadIdx.x;
        if (u < T && pb[u] == 0)
            atomicMin(s_end, u);
        __syncthreads();
        int e = *s_end;
        __syncthreads(); /* every thread has read it before anyone may lower it again */
        if (e < T)
            return e;
    }
    return T;
}

__device__ __forceinline__ float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* A fragment of rows [r0, r0+16) x columns [c0, c0+16) of an LD-padded tile. */
template <int LD>
__device__ __forceinline__ void load_a(uint32_t a[4], const bf16 *sm, int r0, int c0, int lane)
{
    ldmatrix_x4(a, sm + (r0 + (lane & 15)) * LD + c0 + (lane >> 4) * 8);
}

/* B fragments of two n-tiles where B[k][n] = sm[n][k] (rows n0..n0+15 of the tile, columns
 * k0..k0+15): b[0],b[1] for n-tile n0, b[2],b[3] for n0+8. */
template <int LD>
__device__ __forceinline__ void load_b(uint32_t b[4], const bf16 *sm, int n0, int k0, int lane)
{
    ldmatrix_x4(b, sm + (n0 + (lane & 7) + ((lane >> 4) << 3)) * LD + k0 + ((lane >> 3) & 1) * 8);
}

/* B fragments of two n-tiles where B[k][n] = sm[k][n] (rows k0..k0+15, columns n0..n0+15). */
template <int LD>
__device__ __forceinline__ void load_b_trans(uint32_t b[4], const bf16 *sm, int k0, int n0, int lane)
{
    ldmatrix_x4_trans(b, sm + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD + n0 + (lane >> 4) * 8);
}

/* The A fragment of k-step kk from the fp32 C fragments of n-tiles 2kk and 2kk+1. */
__device__ __forceinline__ void c_to_a(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = pack_bf16(c0[0], c0[1]);
    a[1] = pack_bf16(c0[2], c0[3]);
    a[2] = pack_bf16(c1[0], c1[1]);
    a[3] = pack_bf16(c1[2], c1[3]);
}

bool att_supported_dim(int D);
