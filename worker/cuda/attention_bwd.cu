/* Causal flash-attention backward of the CUDA backend, deterministic (no atomics): a row-dot
 * kernel D_t = dO_t . O_t, then
 *   dK/dV: one block per (batch, kv head, 64-key tile), looping over every query head of the GQA
 *          group and every 64-row query tile at or after the keys: S^T = K Q^T, P^T, dP^T = V dO^T,
 *          dS^T = P^T (dP^T - D), dV += P^T dO, dK += dS^T Q, accumulated in registers;
 *   dQ:    one block per (batch, query head, 128-row query tile), each warp 32 rows, looping over
 *          32-key tiles up to the diagonal: S, P, dP = dO V^T, dS, dQ += dS K.
 * P is recomputed from lse; mma.sync m16n8k16 bf16 with fp32 accumulation throughout. With document
 * positions (backend.h) a key tile loops only over the query tiles up to its last key's document
 * end, a dQ block starts at the key tile of its first row's document and a warp skips tiles wholly
 * before its rows' documents; keys before a row's document are masked like future ones. */
#include "attention_common.cuh"

#define BWD_BM 64 /* dK/dV kernel: query rows per step */
#define BWD_BN 64 /* and keys per block */
#define BWD_THREADS 128
#define DQ_MT 2                /* dQ kernel: 16-row m-tiles per warp, */
#define DQ_BM (64 * DQ_MT)     /* query rows per block */
#define DQ_BN 32               /* and keys per tile */
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

template <int D>
__global__ void __launch_bounds__(BWD_THREADS, 2)
    attn_bwd_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout,
                         const float *lse, const float *Dvec, const int32_t *pos, int T, int Hq, int Hkv,
                         float scale_log2, float scale)
{
    constexpr int LD = att_dims<D>::LD, KT = att_dims<D>::KT, DT = att_dims<D>::DT, NT = BWD_BM / 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    __shared__ int s_end;
    bf16 *sK = reinterpret_cast<bf16 *>(att_smem), *sV = sK + BWD_BN * LD, *sQ = sV + BWD_BN * LD,
         *sdO = sQ + 2 * BWD_BM * LD;
    float *sL = reinterpret_cast<float *>(sdO + 2 * BWD_BM * LD), *sD = sL + 2 * BWD_BM;
    int *sS = reinterpret_cast<int *>(sD + 2 * BWD_BM); /* each query row's document start */

    int G = Hq / Hkv, b = blockIdx.x / Hkv, hk = blockIdx.x % Hkv;
    int k0 = blockIdx.y * BWD_BN; /* key tile 0 has the most query tiles: it starts first */
    size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const int32_t *pb = pos ? pos + (size_t)b * T : nullptr;
    /* the queries that see these keys end where the last key's document does */
    int qend = pb ? doc_end_block<BWD_THREADS>(pb, min(k0 + BWD_BN, T) - 1, T, &s_end) : T;
    int nqt = (qend + BWD_BM - 1) / BWD_BM, i0 = k0 / BWD_BM, nq = nqt - i0, n_it = G * nq;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    int kr = warp * 16; /* this warp's keys within the tile */

    auto load_step = [&](int it, int buf) {
        int hh = hk * G + it / nq, qt0 = (i0 + it % nq) * BWD_BM;
        size_t off = (size_t)b * T * qs + (size_t)hh * D;
        load_tile<BWD_BM, D, BWD_THREADS>(sQ + buf * BWD_BM * LD, q + off, qt0, T, qs);
        load_tile<BWD_BM, D, BWD_THREADS>(sdO + buf * BWD_BM * LD, dout + off, qt0, T, qs);
        for (int t = threadIdx.x; t < BWD_BM; t += BWD_THREADS) {
            int row = qt0 + t;
            size_t li = ((size_t)b * Hq + hh) * T + row;
            /* rows past T get P = 0 */
            sL[buf * BWD_BM + t] = row < T ? lse[li] * LOG2E : INFINITY;
            sD[buf * BWD_BM + t] = row < T ? Dvec[li] : 0.0f;
            sS[buf * BWD_BM + t] = pb ? doc_start(pb, row, T) : 0;
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
        int qt0 = (i0 + it % nq) * BWD_BM;
        const bf16 *sQb = sQ + buf * BWD_BM * LD, *sdOb = sdO + buf * BWD_BM * LD;
        const float *sLb = sL + buf * BWD_BM, *sDb = sD + buf * BWD_BM;
        const int *sSb = sS + buf * BWD_BM;

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
                int key = k0 + kr + g + (e >> 1) * 8;
                if ((diag && key > qt0 + qc) || key < sSb[qc])
                    p = 0.0f;
                st[nt][e] = p;
                dpt[nt][e] = p * (dpt[nt][e] - sDb[qc]);
            }
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
        __syncthreads();
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

template <int D>
__global__ void __launch_bounds__(BWD_THREADS, 2)
    attn_bwd_dq_kernel(bf16 *dq, const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *dout, const float *lse,
                       const float *Dvec, const int32_t *pos, int T, int Hq, int Hkv, float scale_log2, float scale)
{
    constexpr int LD = att_dims<D>::LD, KT = att_dims<D>::KT, DT = att_dims<D>::DT, NT = DQ_BN / 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(att_smem), *sdO = sQ + DQ_BM * LD, *sK = sdO + DQ_BM * LD,
         *sV = sK + 2 * DQ_BN * LD;
    float *sL = reinterpret_cast<float *>(sV + 2 * DQ_BN * LD), *sD = sL + DQ_BM; /* row terms, off registers */
    int *sS = reinterpret_cast<int *>(sD + DQ_BM);                                 /* and document starts */

    int b = blockIdx.x / Hq, h = blockIdx.x % Hq, hk = h / (Hq / Hkv);
    int q0 = (gridDim.y - 1 - blockIdx.y) * DQ_BM; /* the longest rows start first */
    size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    size_t qoff = (size_t)b * T * qs + (size_t)h * D, koff = (size_t)b * T * ks + (size_t)hk * D;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    int wr = warp * 16 * DQ_MT, wrow0 = q0 + wr; /* this warp's rows */
    int nkt = (min(T, q0 + DQ_BM) + DQ_BN - 1) / DQ_BN;
    const int32_t *pb = pos ? pos + (size_t)b * T : nullptr;
    int j0 = pb ? doc_start(pb, q0, T) / DQ_BN : 0;
    int wstart = pb ? doc_start(pb, wrow0, T) : 0, wlast = pb ? doc_start(pb, wrow0 + 16 * DQ_MT - 1, T) : 0;

    load_tile<DQ_BM, D, BWD_THREADS>(sQ, q + qoff, q0, T, qs);
    load_tile<DQ_BM, D, BWD_THREADS>(sdO, dout + qoff, q0, T, qs);
    load_tile<DQ_BN, D, BWD_THREADS>(sK, k + koff, j0 * DQ_BN, T, ks);
    load_tile<DQ_BN, D, BWD_THREADS>(sV, v + koff, j0 * DQ_BN, T, ks);
    cp_async_commit();

    for (int t = threadIdx.x; t < DQ_BM; t += BWD_THREADS) {
        int row = q0 + t;
        size_t li = ((size_t)b * Hq + h) * T + row;
        /* rows past T get P = 0 */
        sL[t] = row < T ? lse[li] * LOG2E : INFINITY;
        sD[t] = row < T ? Dvec[li] : 0.0f;
        sS[t] = pb ? doc_start(pb, row, T) : 0;
    }

    float dqa[DQ_MT][DT][4] = {};
    for (int j = j0; j < nkt; j++) {
        int buf = (j - j0) & 1;
        if (j + 1 < nkt) {
            load_tile<DQ_BN, D, BWD_THREADS>(sK + (buf ^ 1) * DQ_BN * LD, k + koff, (j + 1) * DQ_BN, T, ks);
            load_tile<DQ_BN, D, BWD_THREADS>(sV + (buf ^ 1) * DQ_BN * LD, v + koff, (j + 1) * DQ_BN, T, ks);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *sKb = sK + buf * DQ_BN * LD, *sVb = sV + buf * DQ_BN * LD;
        int k0 = j * DQ_BN;
        /* else every key of the tile is after this warp's rows, or before their documents */
        if (k0 <= wrow0 + 16 * DQ_MT - 1 && k0 + DQ_BN - 1 >= wstart) {
            float s[DQ_MT][NT][4] = {}, dp[DQ_MT][NT][4] = {};
            /* S = Q K^T, then dP = dO V^T: one product at a time keeps fewer fragments live */
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                uint32_t a[DQ_MT][4];
#pragma unroll
                for (int mt = 0; mt < DQ_MT; mt++)
                    load_a<LD>(a[mt], sQ, wr + mt * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t bb[4];
                    load_b<LD>(bb, sKb, np * 16, kk * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < DQ_MT; mt++) {
                        mma_bf16(s[mt][2 * np], a[mt], bb[0], bb[1]);
                        mma_bf16(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
                    }
                }
            }
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                uint32_t a[DQ_MT][4];
#pragma unroll
                for (int mt = 0; mt < DQ_MT; mt++)
                    load_a<LD>(a[mt], sdO, wr + mt * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t bb[4];
                    load_b<LD>(bb, sVb, np * 16, kk * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < DQ_MT; mt++) {
                        mma_bf16(dp[mt][2 * np], a[mt], bb[0], bb[1]);
                        mma_bf16(dp[mt][2 * np + 1], a[mt], bb[2], bb[3]);
                    }
                }
            }
            bool need_mask = k0 + DQ_BN - 1 > wrow0 || k0 < wlast;
#pragma unroll
            for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int rr = wr + mt * 16 + g + (e >> 1) * 8;
                        float p = exp2_approx(s[mt][nt][e] * scale_log2 - sL[rr]);
                        int key = k0 + nt * 8 + 2 * tq + (e & 1);
                        if (need_mask && (key > q0 + rr || key < sS[rr]))
                            p = 0.0f;
                        dp[mt][nt][e] = p * (dp[mt][nt][e] - sD[rr]);
                    }
#pragma unroll
            for (int kk = 0; kk < DQ_BN / 16; kk++) {
                uint32_t da[DQ_MT][4];
#pragma unroll
                for (int mt = 0; mt < DQ_MT; mt++)
                    c_to_a(da[mt], dp[mt][2 * kk], dp[mt][2 * kk + 1]);
#pragma unroll
                for (int dt = 0; dt < DT / 2; dt++) {
                    uint32_t bb[4];
                    load_b_trans<LD>(bb, sKb, kk * 16, dt * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < DQ_MT; mt++) {
                        mma_bf16(dqa[mt][2 * dt], da[mt], bb[0], bb[1]);
                        mma_bf16(dqa[mt][2 * dt + 1], da[mt], bb[2], bb[3]);
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int mt = 0; mt < DQ_MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            int row = wrow0 + mt * 16 + g + r * 8;
            if (row < T) {
                bf16 *drow_p = dq + ((size_t)b * T + row) * qs + (size_t)h * D;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
                    *reinterpret_cast<uint32_t *>(drow_p + dt * 8 + 2 * tq) =
                        pack_bf16(dqa[mt][dt][2 * r] * scale, dqa[mt][dt][2 * r + 1] * scale);
            }
        }
}

template <int D>
static void bwd_launch(struct backend *be, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                       const bf16 *k, const bf16 *v, const bf16 *out, const float *lse, const int32_t *pos, int B,
                       int T, int Hq, int Hkv)
{
    cudaStream_t st = cuda_ctx_of(be)->compute;
    size_t rows = (size_t)B * T * Hq;
    float *Dvec = (float *)cuda_scratch(be, rows * sizeof(float));
    size_t threads = rows * (D / 8);
    attn_bwd_rowdot_kernel<D><<<cuda_blocks(threads, 256), 256, 0, st>>>(Dvec, dout, out, T, Hq, rows);
    CUDA_CHECK(cudaGetLastError());

    float scale = 1.0f / sqrtf((float)D), scale_log2 = scale * LOG2E;
    constexpr int LD = att_dims<D>::LD;
    size_t smem_kv = (size_t)(2 * BWD_BN + 4 * BWD_BM) * LD * sizeof(bf16) + 4 * BWD_BM * sizeof(float) +
                     2 * BWD_BM * sizeof(int);
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dkdv_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
    dim3 grid_kv((unsigned)(B * Hkv), (unsigned)((T + BWD_BN - 1) / BWD_BN));
    attn_bwd_dkdv_kernel<D><<<grid_kv, BWD_THREADS, smem_kv, st>>>(dk, dv, q, k, v, dout, lse, Dvec, pos, T, Hq,
                                                                   Hkv, scale_log2, scale);
    CUDA_CHECK(cudaGetLastError());

    size_t smem_q = (size_t)(2 * DQ_BM + 4 * DQ_BN) * LD * sizeof(bf16) + 2 * DQ_BM * sizeof(float) +
                    DQ_BM * sizeof(int);
    CUDA_CHECK(cudaFuncSetAttribute(attn_bwd_dq_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    dim3 grid_q((unsigned)(B * Hq), (unsigned)((T + DQ_BM - 1) / DQ_BM));
    attn_bwd_dq_kernel<D><<<grid_q, BWD_THREADS, smem_q, st>>>(dq, q, k, v, dout, lse, Dvec, pos, T, Hq, Hkv,
                                                               scale_log2, scale);
    CUDA_CHECK(cudaGetLastError());
}

void cuda_attention_bwd(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                        const void *k, const void *v, const void *out, const float *lse, const int32_t *pos, int B,
                        int T, int Hq, int Hkv, int D)
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
#ifdef SD_HAVE_CUDNN
    /* cuDNN's fused backward sums dQ with atomics in whatever order its CTAs finish: not
     * deterministic. Deterministic, whole windows take cuDNN's deterministic engine over tiles
     * (attention_det.cu) and documents the built-in kernels, whose dQ sums run in a fixed order.
     * Documents otherwise: cuDNN over upload_positions' table, else the built-in kernels (both skip
     * the tiles outside documents). */
    cudaStream_t st = cuda_ctx_of(be)->compute;
    struct cudnn_docs docs;
    int entries, longest;
    if (be->deterministic) {
        if (!pos && cuda_attention_bwd_tiles(be, dq, dk, dv, dout, q, k, v, out, lse, B, T, Hq, Hkv, D))
            return;
    } else if (!pos) {
        if (struct cudnn_sdpa *p = cudnn_sdpa_plan(1, B, T, Hq, Hkv, D)) {
            cudnn_sdpa_bwd(p, st, cuda_scratch(be, cudnn_sdpa_scratch_bytes(p)), dq, dk, dv, dout, q, k, v, out, lse);
            return;
        }
    } else if (cuda_docs_for(be, pos, B, T, Hq, Hkv, D, &docs, &entries, &longest)) {
        if (struct cudnn_sdpa *p = cudnn_sdpa_docs_plan(1, entries, longest, B * T, Hq, Hkv, D)) {
            void *scratch = cuda_scratch(be, cudnn_sdpa_scratch_bytes(p));
            cuda_lse_layout(st, cudnn_sdpa_docs_stats(p, scratch), lse, B, T, Hq, true);
            if (cudnn_sdpa_docs_bwd(p, st, scratch, &docs, dq, dk, dv, dout, q, k, v, out))
                return;
        }
    }
#endif
    cuda_attention_bwd_builtin(be, dq, dk, dv, dout, q, k, v, out, lse, pos, B, T, Hq, Hkv, D);
}

void cuda_attention_bwd_builtin(struct backend *be, void *dq, void *dk, void *dv, const void *dout, const void *q,
                                const void *k, const void *v, const void *out, const float *lse, const int32_t *pos,
                                int B, int T, int Hq, int Hkv, int D)
{
    bf16 *a = (bf16 *)dq, *bk = (bf16 *)dk, *bv = (bf16 *)dv;
    const bf16 *go = (const bf16 *)dout, *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v,
               *oo = (const bf16 *)out;
    switch (D) {
    case 16: bwd_launch<16>(be, a, bk, bv, go, qq, kk, vv, oo, lse, pos, B, T, Hq, Hkv); break;
    case 32: bwd_launch<32>(be, a, bk, bv, go, qq, kk, vv, oo, lse, pos, B, T, Hq, Hkv); break;
    case 64: bwd_launch<64>(be, a, bk, bv, go, qq, kk, vv, oo, lse, pos, B, T, Hq, Hkv); break;
    default: bwd_launch<128>(be, a, bk, bv, go, qq, kk, vv, oo, lse, pos, B, T, Hq, Hkv); break;
    }
}
