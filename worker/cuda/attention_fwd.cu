/* Causal flash-attention forward of the CUDA backend (FlashAttention-2 scheme) with grouped KV
 * heads: one block of 4 warps per (batch, query head, 128-row query tile), each warp owning 32
 * query rows; 64-key tiles stream through double-buffered shared memory (cp.async), S = QK^T and
 * O += PV on mma.sync m16n8k16 bf16 tensor cores with an online softmax in fp32 (log2 domain).
 * Writes out (bf16) and lse (fp32, natural log); nothing of size (T,T) is stored. With document
 * positions (backend.h) a block starts at the key tile of its first row's document and a warp skips
 * tiles wholly before its rows' documents; keys before a row's document are masked like future ones. */
#include "attention_common.cuh"

#define FWD_BM 128 /* query rows per block */
#define FWD_BN 64  /* keys per tile */
#define FWD_THREADS 128
#define FWD_MT 2   /* 16-row m-tiles per warp */
#define LN2 0.69314718055994531f
#define LOG2E 1.4426950408889634f

template <int D>
__global__ void __launch_bounds__(FWD_THREADS, 2)
    attn_fwd_kernel(bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v, const int32_t *pos, int T,
                    int Hq, int Hkv, float scale_log2)
{
    constexpr int LD = att_dims<D>::LD, KT = att_dims<D>::KT, DT = att_dims<D>::DT, NT = FWD_BN / 8;
    extern __shared__ __align__(16) unsigned char att_smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(att_smem), *sK = sQ + FWD_BM * LD, *sV = sK + 2 * FWD_BN * LD;

    int b = blockIdx.x / Hq, h = blockIdx.x % Hq, hk = h / (Hq / Hkv);
    int q0 = (gridDim.y - 1 - blockIdx.y) * FWD_BM; /* the longest rows start first */
    size_t qs = (size_t)Hq * D, ks = (size_t)Hkv * D;
    const bf16 *qb = q + (size_t)b * T * qs + (size_t)h * D;
    const bf16 *kb = k + (size_t)b * T * ks + (size_t)hk * D, *vb = v + (size_t)b * T * ks + (size_t)hk * D;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, tq = lane & 3;
    int wr = warp * 16 * FWD_MT, wrow0 = q0 + wr; /* this warp's rows */
    int nkt = (min(T, q0 + FWD_BM) + FWD_BN - 1) / FWD_BN;
    /* Document starts: of each of this thread's rows, and the first and last of this warp's rows. */
    const int32_t *pb = pos ? pos + (size_t)b * T : nullptr;
    int j0 = pb ? doc_start(pb, q0, T) / FWD_BN : 0;
    int wstart = pb ? doc_start(pb, wrow0, T) : 0, wlast = pb ? doc_start(pb, wrow0 + 16 * FWD_MT - 1, T) : 0;
    int dstart[FWD_MT][2];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++)
            dstart[mt][r] = pb ? doc_start(pb, wrow0 + mt * 16 + g + r * 8, T) : 0;

    load_tile<FWD_BM, D, FWD_THREADS>(sQ, qb, q0, T, qs);
    load_tile<FWD_BN, D, FWD_THREADS>(sK, kb, j0 * FWD_BN, T, ks);
    load_tile<FWD_BN, D, FWD_THREADS>(sV, vb, j0 * FWD_BN, T, ks);
    cp_async_commit();

    float o[FWD_MT][DT][4] = {};
    float m[FWD_MT][2], l[FWD_MT][2];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            m[mt][r] = -INFINITY;
            l[mt][r] = 0.0f;
        }

    for (int j = j0; j < nkt; j++) {
        int buf = (j - j0) & 1;
        if (j + 1 < nkt) {
            load_tile<FWD_BN, D, FWD_THREADS>(sK + (buf ^ 1) * FWD_BN * LD, kb, (j + 1) * FWD_BN, T, ks);
            load_tile<FWD_BN, D, FWD_THREADS>(sV + (buf ^ 1) * FWD_BN * LD, vb, (j + 1) * FWD_BN, T, ks);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const bf16 *sKb = sK + buf * FWD_BN * LD, *sVb = sV + buf * FWD_BN * LD;
        int k0 = j * FWD_BN;
        if (k0 <= wrow0 + 16 * FWD_MT - 1 && k0 + FWD_BN - 1 >= wstart) {
            float s[FWD_MT][NT][4] = {};
#pragma unroll
            for (int kk = 0; kk < KT; kk++) {
                uint32_t a[FWD_MT][4];
#pragma unroll
                for (int mt = 0; mt < FWD_MT; mt++)
                    load_a<LD>(a[mt], sQ, wr + mt * 16, kk * 16, lane);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    uint32_t bb[4];
                    load_b<LD>(bb, sKb, np * 16, kk * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < FWD_MT; mt++) {
                        mma_bf16(s[mt][2 * np], a[mt], bb[0], bb[1]);
                        mma_bf16(s[mt][2 * np + 1], a[mt], bb[2], bb[3]);
                    }
                }
            }
            bool need_mask = k0 + FWD_BN - 1 > wrow0 || k0 < wlast;
#pragma unroll
            for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = s[mt][nt][e] * scale_log2;
                        int key = k0 + nt * 8 + 2 * tq + (e & 1);
                        if (need_mask && (key > wrow0 + mt * 16 + g + (e >> 1) * 8 || key < dstart[mt][e >> 1]))
                            x = -INFINITY;
                        s[mt][nt][e] = x;
                    }
#pragma unroll
            for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
                        mx = fmaxf(mx, fmaxf(s[mt][nt][2 * r], s[mt][nt][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    float mnew = fmaxf(m[mt][r], mx);
                    /* a row that has seen no key of its document yet (its max still -inf) stays at 0 */
                    float mbase = mnew == -INFINITY ? 0.0f : mnew;
                    float alpha = exp2_approx(m[mt][r] - mbase);
                    m[mt][r] = mnew;
                    float rs = 0.0f;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 2 * r; e < 2 * r + 2; e++) {
                            float p = exp2_approx(s[mt][nt][e] - mbase);
                            s[mt][nt][e] = p;
                            rs += p;
                        }
                    l[mt][r] = l[mt][r] * alpha + rs; /* a thread's partial sum; the quad adds up at the end */
#pragma unroll
                    for (int dt = 0; dt < DT; dt++) {
                        o[mt][dt][2 * r] *= alpha;
                        o[mt][dt][2 * r + 1] *= alpha;
                    }
                }
#pragma unroll
            for (int kk = 0; kk < FWD_BN / 16; kk++) {
                uint32_t pa[FWD_MT][4];
#pragma unroll
                for (int mt = 0; mt < FWD_MT; mt++)
                    c_to_a(pa[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
                for (int dp = 0; dp < DT / 2; dp++) {
                    uint32_t bb[4];
                    load_b_trans<LD>(bb, sVb, kk * 16, dp * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < FWD_MT; mt++) {
                        mma_bf16(o[mt][2 * dp], pa[mt], bb[0], bb[1]);
                        mma_bf16(o[mt][2 * dp + 1], pa[mt], bb[2], bb[3]);
                    }
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float lt = l[mt][r];
            lt += __shfl_xor_sync(0xffffffffu, lt, 1);
            lt += __shfl_xor_sync(0xffffffffu, lt, 2);
            int row = wrow0 + mt * 16 + g + r * 8;
            if (row < T) {
                float inv = 1.0f / lt;
                bf16 *orow = out + ((size_t)b * T + row) * qs + (size_t)h * D;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
                    *reinterpret_cast<uint32_t *>(orow + dt * 8 + 2 * tq) =
                        pack_bf16(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
                if (tq == 0)
                    lse[((size_t)b * Hq + h) * T + row] = (m[mt][r] + log2f(lt)) * LN2;
            }
        }
}

template <int D>
static void fwd_launch(cudaStream_t st, bf16 *out, float *lse, const bf16 *q, const bf16 *k, const bf16 *v,
                       const int32_t *pos, int B, int T, int Hq, int Hkv)
{
    size_t smem = (size_t)(FWD_BM + 4 * FWD_BN) * att_dims<D>::LD * sizeof(bf16);
    CUDA_CHECK(cudaFuncSetAttribute(attn_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((unsigned)(B * Hq), (unsigned)((T + FWD_BM - 1) / FWD_BM));
    float scale_log2 = LOG2E / sqrtf((float)D);
    attn_fwd_kernel<D><<<grid, FWD_THREADS, smem, st>>>(out, lse, q, k, v, pos, T, Hq, Hkv, scale_log2);
    CUDA_CHECK(cudaGetLastError());
}

#ifdef SD_HAVE_CUDNN
/* ---- document tables for cuDNN (attention_cudnn.h) ---- */

static int pow2_at_least(int n)
{
    int p = 1;
    while (p < n)
        p *= 2;
    return p;
}

static size_t seq_bytes(int entries)
{
    return ((size_t)entries * sizeof(int32_t) + 7) & ~(size_t)7;
}

/* off_q, off_kv, off_stats (entries + 1 each) from the first tokens, for a head layout */
__global__ void docs_offsets_kernel(int64_t *off, const int64_t *tok, int n, int64_t per_q, int64_t per_kv,
                                    int64_t per_stats)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        off[i] = tok[i] * per_q;
        off[n + i] = tok[i] * per_kv;
        off[2 * n + i] = tok[i] * per_stats;
    }
}

__global__ void lse_layout_kernel(float *dst, const float *src, int B, int T, int H, bool to_token_major)
{
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; /* (b, h, t) index */
    if (i >= (size_t)B * H * T)
        return;
    size_t t = i % T, h = (i / T) % H, b = i / ((size_t)T * H);
    size_t j = (b * T + t) * H + h;
    if (to_token_major)
        dst[j] = src[i];
    else
        dst[i] = src[j];
}

void cuda_lse_layout(cudaStream_t st, float *dst, const float *src, int B, int T, int H, bool to_token_major)
{
    size_t n = (size_t)B * H * T;
    lse_layout_kernel<<<cuda_blocks(n, 256), 256, 0, st>>>(dst, src, B, T, H, to_token_major);
    CUDA_CHECK(cudaGetLastError());
}

bool cuda_docs_for(struct backend *be, const int32_t *pos, int B, int T, int Hq, int Hkv, int D,
                   struct cudnn_docs *table, int *entries, int *longest)
{
    struct cuda_docs *d = &cuda_ctx_of(be)->docs;
    if (!pos || d->pos != pos || d->B != B || d->T != T)
        return false;
    char *base = (char *)d->table;
    int n = d->entries + 1;
    int64_t *tok = (int64_t *)(base + seq_bytes(d->entries)), *off = tok + n;
    if (d->scaled_hq != Hq || d->scaled_hkv != Hkv || d->scaled_d != D) {
        docs_offsets_kernel<<<cuda_blocks((size_t)n, 256), 256, 0, cuda_ctx_of(be)->compute>>>(
            off, tok, n, (int64_t)Hq * D, (int64_t)Hkv * D, Hq);
        CUDA_CHECK(cudaGetLastError());
        d->scaled_hq = Hq;
        d->scaled_hkv = Hkv;
        d->scaled_d = D;
    }
    *table = (struct cudnn_docs){(const int32_t *)base, off, off + n, off + 2 * n};
    *entries = d->entries;
    *longest = d->longest;
    return true;
}

/* The table of pos's documents: their lengths and first tokens, padded to a power of two of
 * entries (so that a few plans serve every batch); none when it cannot be allocated. One table per
 * backend: the positions of the last upload_positions. */
static void docs_prepare(struct backend *be, int32_t *dst, const int32_t *pos, int B, int T)
{
    struct cuda_docs *d = &cuda_ctx_of(be)->docs;
    d->pos = NULL;
    size_t N = (size_t)B * T;
    int n = 0, longest = 1;
    double squares = 0; /* the sum of the documents' squared lengths */
    for (size_t i = 0; i < N; i++) {
        n += pos[i] == 0;
        longest = pos[i] + 1 > longest ? pos[i] + 1 : longest;
        if (i + 1 == N || pos[i + 1] == 0)
            squares += ((double)pos[i] + 1) * ((double)pos[i] + 1);
    }
    /* short documents: cuDNN's tiles are mostly padding, the built-in kernels' 32-key tiles are not */
    if (n == 0 || squares / (double)N < cuda_ctx_of(be)->docs_cudnn_min_length)
        return;
    int entries = pow2_at_least(n);
    size_t bytes = seq_bytes(entries) + 4 * (size_t)(entries + 1) * sizeof(int64_t);
    if (bytes > d->table_bytes) {
        if (d->table)
            be->ops->free(be, d->table);
        d->table_bytes = 0;
        if (!(d->table = be->ops->alloc(be, bytes)))
            return;
        d->table_bytes = bytes;
    }
    char *host = (char *)calloc(1, bytes);
    if (!host || pos[0] != 0) { /* backend.h: every row starts a document */
        free(host);
        return;
    }
    int32_t *seq = (int32_t *)host;
    int64_t *tok = (int64_t *)(host + seq_bytes(entries));
    int j = -1;
    for (size_t i = 0; i < N; i++) {
        if (pos[i] == 0)
            tok[++j] = (int64_t)i;
        seq[j]++;
    }
    for (j = n; j <= entries; j++)
        tok[j] = (int64_t)N;
    be->ops->upload(be, d->table, host, seq_bytes(entries) + (size_t)(entries + 1) * sizeof(int64_t));
    free(host);
    *d = (struct cuda_docs){dst, B, T, entries, pow2_at_least(longest > 64 ? longest : 64), d->table,
                            d->table_bytes, 0, 0, 0};
}
#endif

void cuda_upload_positions(struct backend *be, int32_t *dst, const int32_t *pos, int B, int T)
{
    be->ops->upload(be, dst, pos, sizeof(int32_t) * (size_t)B * T);
#ifdef SD_HAVE_CUDNN
    docs_prepare(be, dst, pos, B, T);
#endif
}

bool att_supported_dim(int D)
{
    return D == 16 || D == 32 || D == 64 || D == 128;
}

bool cuda_attention_supports(struct backend *be, int D)
{
    return att_supported_dim(D);
}

void cuda_attention_fwd(struct backend *be, void *out, float *lse, const void *q, const void *k, const void *v,
                        const int32_t *pos, int B, int T, int Hq, int Hkv, int D)
{
    if (B == 0 || T == 0)
        return;
    if (!att_supported_dim(D)) {
        fprintf(stderr, "cuda attention: head_dim %d is not supported (16, 32, 64, 128)\n", D);
        abort();
    }
    SD_ASSERT(Hkv > 0 && Hq % Hkv == 0);
    SD_ASSERT(cuda_aligned16(q) && cuda_aligned16(k) && cuda_aligned16(v) && cuda_aligned16(out));
    cudaStream_t st = cuda_ctx_of(be)->compute;
#ifdef SD_HAVE_CUDNN
    /* documents: cuDNN over the table upload_positions made, which skips the tiles outside
     * documents; without one, the built-in kernels, which skip them too */
    struct cudnn_docs docs;
    int entries, longest;
    if (!pos) {
        if (struct cudnn_sdpa *p = cudnn_sdpa_plan(0, B, T, Hq, Hkv, D)) {
            cudnn_sdpa_fwd(p, st, cuda_scratch(be, cudnn_sdpa_scratch_bytes(p)), out, lse, q, k, v);
            return;
        }
    } else if (cuda_docs_for(be, pos, B, T, Hq, Hkv, D, &docs, &entries, &longest)) {
        if (struct cudnn_sdpa *p = cudnn_sdpa_docs_plan(0, entries, longest, B * T, Hq, Hkv, D)) {
            void *scratch = cuda_scratch(be, cudnn_sdpa_scratch_bytes(p));
            if (cudnn_sdpa_docs_fwd(p, st, scratch, &docs, out, q, k, v)) {
                cuda_lse_layout(st, lse, cudnn_sdpa_docs_stats(p, scratch), B, T, Hq, false);
                return;
            }
        }
    }
#endif
    bf16 *o = (bf16 *)out;
    const bf16 *qq = (const bf16 *)q, *kk = (const bf16 *)k, *vv = (const bf16 *)v;
    switch (D) {
    case 16: fwd_launch<16>(st, o, lse, qq, kk, vv, pos, B, T, Hq, Hkv); break;
    case 32: fwd_launch<32>(st, o, lse, qq, kk, vv, pos, B, T, Hq, Hkv); break;
    case 64: fwd_launch<64>(st, o, lse, qq, kk, vv, pos, B, T, Hq, Hkv); break;
    default: fwd_launch<128>(st, o, lse, qq, kk, vv, pos, B, T, Hq, Hkv); break;
    }
}
