/* Causal flash-attention backward of the CUDA backend, deterministic: a row-dot kernel
 * D_t = dO_t . O_t, then one kernel per (batch, kv head, 64-key tile) that loops over every query
 * head of the GQA group and every 64-row query tile at or after its keys, recomputing P from lse,
 * accumulating dK and dV in registers and adding dS K into an fp32 dQ accumulator in a fixed block
 * order; a last kernel scales and rounds dQ. mma.sync m16n8k16 bf16 with fp32 accumulation. */
#include "attention_common.cuh"

#define BWD_BM 64 /* query rows per tile */
#define BWD_BN 64 /* keys per tile */
#define BWD_THREADS 128
#define LOG2E 1.4426950408889634f

/* Dvec[b][h][t] = sum_d dout[b][t][h][d] * out[b][t][h][d]; D/8 threads per row. */
template <int D>
__global__ void attn_bwd_rowdot_kernel(float *Dvec, const bf16 *dout, const bf16 *out, int T, int Hq, size_t rows)
{
    constexpr int TPR = D / 8;
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x, row = idx / TPR;
    int part = (int)(idx % TPR);
    float s = 0.0f;
    if (row < rows) {
        float a[8], c[8];
        load_bf16<8>(a, dout + row * D + part * 8);
        load_bf16<8>(c, out + row * D + part * 8);
#pragma unroll
        for (int i = 0; i < 8; i++)
            s += a[i] * c[i];
    }
#pragma unroll
    for (int o = TPR / 2; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (row < rows && part == 0) {
        size_t bt = row / Hq, b = bt / T, t = bt % T;
        int h = (int)(row % Hq);
        Dvec[(b * Hq + h) * T + t] = s;
    }
}

__device__ __forceinline__ int ld_acquire(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(int *p, int v)
{
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

/* p[0] += x, p[1] += y at the L2, one request for both (sm_90) */
__device__ __forceinline__ void red_add_v2(float *p, float x, float y)
{
    asm volatile("red.relaxed.gpu.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(x), "f"(y) : "memory");
}

/* One block per (batch, kv head, 64-key tile j). For every query head of the group and every
 * 64-row query tile i >= j, from the last tile down (heads inner):
 *   S^T = K Q^T, P^T = exp(S^T*scale - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D)   (registers)
 *   dV += P^T dO, dK += dS^T Q                                                       (registers)
 *   dQ_i += dS K  into an fp32 accumulator (dS^T through shared memory)
 * The dQ_i additions of the blocks j = 0..i go in the order of j (a per-tile counter), so the
 * sums are deterministic. All blocks reach (tile i, head) at the same step (tiles are walked from
 * the last), and block j waits only for block j-1, which was dispatched before it. */
template <int D>
__global__ void __launch_bounds__(BWD_THREADS, 2)
    attn_bwd_kernel(float *dq_acc, int *order, bf16 *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v,
                    const bf16 *dout, const float *lse, const float *Dvec, int T, int Hq, int Hkv, float scale_log2,
                    float scale)
{
    constexpr int LD = att_dims<D>::LD, KT = att_dims<D>::KT, DT = att_dims<D>::DT, NT = BWD_BM / 8;
    constexpr int LDS = BWD_BM + 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(att_smem), *sV = sK + BWD_BN * LD, *sQ = sV + BWD_BN * LD,
         *sdO = sQ + 2 * BWD_BM * LD, *sdS = sdO + 2 * BWD_BM * LD;
    float *sL = reinterpret_cast<float *>(sdS + BWD_BN * LDS), *sD = sL + 2 * BWD_BM;

    int G = Hq / Hkv, b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
    int kt = blockIdx.y, k0 = kt * BWD_BN; /* key tile 0 has the most query tiles: it starts first */
    size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    int nqt = (T + BWD_BM - 1) / BWD_BM, i0 = k0 / BWD_BM, nq = nqt - i0, n_it = G * nq;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    int kr = warp * 16; /* this warp's keys within the tile, and its queries within a query tile */

    /* tile-major, heads inner: every block reaches (tile, head) at the same step */
    auto step_head = [&](int it) { return hk * G + it % G; };
    auto step_tile = [&](int it) { return nqt - 1 - it / G; };
    auto load_step = [&](int it, int buf) {
        int hh = step_head(it), qt0 = step_tile(it) * BWD_BM;
        size_t off = (size_t)b * T * qs + (size_t)hh * D;
        load_tile<BWD_BM, D, BWD_THREADS>(sQ + buf * BWD_BM * LD, q + off, qt0, T, qs);
        load_tile<BWD_BM, D, BWD_THREADS>(sdO + buf * BWD_BM * LD, dout + off, qt0, T, qs);
        for (int t = threadIdx.x; t < BWD_BM; t += BWD_THREADS) {
            int row = qt0 + t;
            size_t li = ((size_t)b * Hq + hh) * T + row;
            /* rows past T get P = 0 */
            sL[buf * BWD_BM + t] = row < T ? lse[li] * LOG2E : INFINITY;
            sD[buf * BWD_BM + t] = row < T ? Dvec[li] : 0.0f;
        }
    };

    load_tile<BWD_BN, D, BWD_THREADS>(sK, k + (size_t)b * T * ks + (size_t)hk * D, k0, T, ks);
    load_tile<BWD_BN, D, BWD_THREADS>(sV, v + (size_t)b * T * ks + (size_t)hk * D, k0, T, ks);
    load_step(0, 0);
    cp_async_commit();

    float dka[DT][4] = {}, dva[DT][4] = {};
    for (int it = 0; it < n_it; it++) {
        int buf = it & 1;
        if (it + 1 < n_it) {
            load_step(it + 1, buf ^ 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        int hh = step_head(it), qi = step_tile(it), qt0 = qi * BWD_BM;
        const bf16 *sQb = sQ + buf * BWD_BM * LD, *sdOb = sdO + buf * BWD_BM * LD;
        const float *sLb = sL + buf * BWD_BM, *sDb = sD + buf * BWD_BM;

        {
            float st[NT][4] = {}, dpt[NT][4] = {};
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                uint32_t a[4], av[4];
                load_a<LD>(a, sK, kr, kk * 16, lane);
                load_a<LD>(av, sV, kr, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t bb[4];
                    load_b<LD>(bb, sQb, np * 16, kk * 16, lane);
                    mma_bf16(st[2 * np], a, bb[0], bb[1]);
                    mma_bf16(st[2 * np + 1], a, bb[2], bb[3]);
                    load_b<LD>(bb, sdOb, np * 16, kk * 16, lane);
                    mma_bf16(dpt[2 * np], av, bb[0], bb[1]);
                    mma_bf16(dpt[2 * np + 1], av, bb[2], bb[3]);
                }
            }
            bool diag = qt0 < k0 + BWD_BN;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int qc = nt * 8 + 2 * tq + (e & 1);
                    float p = exp2_approx(st[nt][e] * scale_log2 - sLb[qc]);
                    if (diag && k0 + kr + g + (e >> 1) * 8 > qt0 + qc)
                        p = 0.0f;
                    st[nt][e] = p;
                    dpt[nt][e] = p * (dpt[nt][e] - sDb[qc]);
                }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    *reinterpret_cast<uint32_t *>(sdS + (kr + g + r * 8) * LDS + nt * 8 + 2 * tq) =
                        pack_bf16(dpt[nt][2 * r], dpt[nt][2 * r + 1]);
#pragma unroll
            for (int kk = 0; kk < BWD_BM / 16; kk++) {
                uint32_t pa[4], da[4];
                c_to_a(pa, st[2 * kk], st[2 * kk + 1]);
                c_to_a(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t bb[4];
                    load_b_trans<LD>(bb, sdOb, kk * 16, dp * 16, lane);
                    mma_bf16(dva[2 * dp], pa, bb[0], bb[1]);
                    mma_bf16(dva[2 * dp + 1], pa, bb[2], bb[3]);
                    load_b_trans<LD>(bb, sQb, kk * 16, dp * 16, lane);
                    mma_bf16(dka[2 * dp], da, bb[0], bb[1]);
                    mma_bf16(dka[2 * dp + 1], da, bb[2], bb[3]);
                }
            }
        }
        __syncthreads(); /* dS^T of every warp is in shared memory */

        /* this warp's 16 query rows of dS (64 keys) @ K */
        float dqp[DT][4] = {};
#pragma unroll
        for (int kk = 0; kk < BWD_BN / 16; kk++) {
            uint32_t a[4];
            load_a_trans<LDS>(a, sdS, kr, kk * 16, lane);
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                uint32_t bb[4];
                load_b_trans<LD>(bb, sK, kk * 16, dp * 16, lane);
                mma_bf16(dqp[2 * dp], a, bb[0], bb[1]);
                mma_bf16(dqp[2 * dp + 1], a, bb[2], bb[3]);
            }
        }
        int *turn = order + ((size_t)b * Hq + hh) * nqt + qi;
        if (threadIdx.x == 0)
            while (ld_acquire(turn) != kt) {
            }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = qt0 + kr + g + r * 8;
            if (row < T) {
                float *acc = dq_acc + ((size_t)b * T + row) * qs + (size_t)hh * D + 2 * tq;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
                    red_add_v2(acc + dt * 8, dqp[dt][2 * r], dqp[dt][2 * r + 1]);
            }
        }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0)
            st_release(turn, kt + 1);
    }

#pragma unroll
    for (int r = 0; r < 2; r++) {
        int key = k0 + kr + g + r * 8;
        if (key < T) {
            size_t off = ((size_t)b * T + key) * ks + (size_t)hk * D;
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                *reinterpret_cast<uint32_t *>(dk + off + dt * 8 + 2 * tq) =
                    pack_bf16(dka[dt][2 * r] * scale, dka[dt][2 * r + 1] * scale);
                *reinterpret_cast<uint32_t *>(dv + off + dt * 8 + 2 * tq) =
                    pack_bf16(dva[dt][2 * r], dva[dt][2 * r + 1]);
            }
        }
    }
}

/* dq = bf16(dq_acc * scale), 8 elements a thread */
__global__ void attn_bwd_dq_convert_kernel(bf16 *dq, const float *dq_acc, float scale, size_t n)
{
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (i >= n)
        return;
    float v[8];
    float4 a = *reinterpret_cast<const float4 *>(dq_acc + i), c = *reinterpret_cast<const float4 *>(dq_acc + i + 4);
    v[0] = a.x * scale, v[1] = a.y * scale, v[2] = a.z * scale, v[3] = a.w * scale;
    v[4] = c.x * scale, v[5] = c.y * scale, v[6] = c.z * scale, v[7] = c.w * scale;
    store_bf16<8>(dq + i, v);
}

template <int D>
static void bwd_launch(struct backend *be, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                       const bf16 *k, const bf16 *v, const bf16 *out, const float *lse, int B, int T, int Hq, int Hkv)
{
    cudaStream_t st = cuda_ctx_of(be)->compute;
    size_t rows = (size_t)B * T * Hq, nq_el = rows * D;
    int nqt = (T + BWD_BM - 1) / BWD_BM;
    size_t n_order = (size_t)B * Hq * nqt;
    /* scratch: D rows, the fp32 dq accumulator, the per-tile order counters */
    size_t rows16 = (rows + 3) & ~(size_t)3; /* keeps dq_acc 16-byte aligned */
    float *Dvec = (float *)cuda_scratch(be, (rows16 + nq_el) * sizeof(float) + n_order * sizeof(int));
    float *dq_acc = Dvec + rows16;
    int *order = (int *)(dq_acc + nq_el);
    CUDA_CHECK(cudaMemsetAsync(dq_acc, 0, nq_el * sizeof(float) + n_order * sizeof(int), st));
    attn_bwd_rowdot_kernel<D><<<cuda_blocks(rows * (D / 8), 256), 256, 0, st>>>(Dvec, dout, out, T, Hq, rows);
    CUDA_CHECK(cudaGetLastError());

    float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E;
    constexpr int LD = att_dims<D>::LD;
    size_t smem = (size_t)(2 * BWD_BN + 4 * BWD_BM) * LD * sizeof(bf16) + (size_t)BWD_BN * (BWD_BM + 8) * sizeof(bf16) +
                  4 * BWD_BM * sizeof(float);
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)(B * Hkv), (unsigned)((T + BWD_BN - 1) / BWD_BN));
    attn_bwd_kernel<D><<<grid, BWD_THREADS, smem, st>>>(dq_acc, order, dk, dv, q, k, v, dout, lse, Dvec, T, Hq, Hkv,
                                                         scale_log2, scale);
    CUDA_CHECK(cudaGetLastError());
    attn_bwd_dq_convert_kernel<<<cuda_blocks(nq_el / 8, 256), 256, 0, st>>>(dq, dq_acc, scale, nq_el);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_attention_bwd(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                        const void *k, const void *v, const void *out, const float *lse, int B, int T, int Hq,
                        int Hkv, int D)
{
    if (B == 0 || T == 0)
        return;
    if (!att_supported_dim(D)) {
        fprintf(stderr, "cuda attention: head_dim %d is not supported (16, 32, 64, 128)\n", D);
        abort();
    }
    SD_ASSERT(Hkv > 0 && Hq % Hkv == 0);
    SD_ASSERT(cuda_aligned16(dq) && cuda_aligned16(dk) && cuda_aligned16(dv) && cuda_aligned16(dout) &&
              cuda_aligned16(q) && cuda_aligned16(k) && cuda_aligned16(v) && cuda_aligned16(out));
    bf16 *a = (bf16 *)dq, *bk = (bf16 *)dk, *bv = (bf16 *)dv;
    const bf16 *go = (const bf16 *)dout, *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v,
               *oo = (const bf16 *)out;
    switch (D) {
    case 16: bwd_launch<16>(be, a, bk, bv, go, qq, kk, vv, oo, lse, B, T, Hq, Hkv); break;
    case 32: bwd_launch<32>(be, a, bk, bv, go, qq, kk, vv, oo, lse, B, T, Hq, Hkv); break;
    case 64: bwd_launch<64>(be, a, bk, bv, go, qq, kk, vv, oo, lse, B, T, Hq, Hkv); break;
    default: bwd_launch<128>(be, a, bk, bv, go, qq, kk, vv, oo, lse, B, T, Hq, Hkv); break;
    }
}
