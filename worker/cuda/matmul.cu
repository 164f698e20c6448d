/* Matmuls of the CUDA backend through cuBLASLt: bf16 operands, fp32 accumulation (CUBLAS_COMPUTE_32F),
 * bf16 activations out, fp32 weight gradients accumulated in place (beta = 1), the forward bias as
 * a cuBLASLt epilogue, and dbias as a deterministic column-sum kernel.
 *
 * Row-major X(r,c) is column-major X^T with leading dimension c, so with column-major cuBLAS:
 *   out(N,OC) = inp(N,IC) @ w(OC,IC)^T   ->  out^T(OC,N)  = op_T(w^T(IC,OC)) @ inp^T(IC,N)
 *   dinp(N,IC) = dout(N,OC) @ w(OC,IC)    ->  dinp^T(IC,N) = w^T(IC,OC) @ dout^T(OC,N)
 *   dw(OC,IC) += dout^T @ inp             ->  dw^T(IC,OC) += inp^T(IC,N) @ op_T(dout^T(OC,N)) */
#include "cuda_common.cuh"

#define DBIAS_COLS 32
#define DBIAS_LANES 16

/* Largest power of two (up to 256) that divides the address: cuBLASLt picks kernels by alignment. */
static uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a % al) != 0)
        al >>= 1;
    return al;
}

/* D(m,n) column-major = bias[row] */
__global__ void bias_fill_kernel(bf16 *D, const bf16 *bias, int m, int n, int ldd)
{
    size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < (size_t)m * n)
        D[(idx / m) * ldd + idx % m] = bias[idx % m];
}

/* D(m,n) = A(op) @ B(op) (+ bias per row of D) + beta*D, column-major. */
static void lt_matmul(struct cuda_ctx *cx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const void *A, int lda, const void *B, int ldb, void *D, cudaDataType_t dtype, int ldd,
                      float beta, const void *bias)
{
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        cudaDataType_t bt = CUDA_R_16BF;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt));
    }
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m,
                                            lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k,
                                            ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&ld, dtype, m, n, ldd));

    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &cx->lt_ws_bytes,
                                                      sizeof cx->lt_ws_bytes));
    uint32_t al[4] = {align_of(A), align_of(B), align_of(D), align_of(D)};
    cublasLtMatmulPreferenceAttributes_t al_attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 4; i++)
        CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, al_attr[i], &al[i], sizeof al[i]));
    cublasLtMatmulHeuristicResult_t heur;
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(cx->lt, op, la, lb, ld, ld, pref, 1, &heur, &found) != CUBLAS_STATUS_SUCCESS)
        found = 0;
    float alpha = 1.0f;
    if (found > 0) {
        CUBLAS_CHECK(cublasLtMatmul(cx->lt, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heur.algo, cx->lt_ws,
                                    cx->lt_ws_bytes, cx->compute));
    } else {
        /* Odd shapes cuBLASLt has no kernel for (seen only in tests): plain cuBLAS, the bias
         * broadcast into D first and added with beta = 1. */
        if (bias) {
            SD_ASSERT(dtype == CUDA_R_16BF && beta == 0.0f);
            bias_fill_kernel<<<cuda_blocks((size_t)m * n, 256), 256, 0, cx->compute>>>((bf16 *)D, (const bf16 *)bias,
                                                                                      m, n, ldd);
            CUDA_CHECK(cudaGetLastError());
            beta = 1.0f;
        }
        CUBLAS_CHECK(cublasGemmEx(cx->cublas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta,
                                  D, dtype, ldd, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(la);
    cublasLtMatrixLayoutDestroy(lb);
    cublasLtMatrixLayoutDestroy(ld);
    cublasLtMatmulDescDestroy(op);
}

/* dbias[c] += sum_i dout[i][c]: one block per DBIAS_COLS columns, DBIAS_LANES row lanes summed in a
 * fixed order. */
__global__ void dbias_kernel(float *dbias, const bf16 *dout, int N, int OC)
{
    __shared__ float acc[DBIAS_LANES][DBIAS_COLS];
    int lane = threadIdx.x % DBIAS_COLS, ly = threadIdx.x / DBIAS_COLS;
    int c = blockIdx.x * DBIAS_COLS + lane;
    float s = 0.0f;
    if (c < OC)
        for (int i = ly; i < N; i += DBIAS_LANES)
            s += __bfloat162float(dout[(size_t)i * OC + c]);
    acc[ly][lane] = s;
    __syncthreads();
    if (ly == 0 && c < OC) {
        float t = 0.0f;
        for (int l = 0; l < DBIAS_LANES; l++)
            t += acc[l][lane];
        dbias[c] += t;
    }
}

void cuda_matmul_fwd(struct backend *be, void *out, const void *inp, const void *w, const void *bias, int N, int IC,
                     int OC)
{
    if (N == 0 || OC == 0)
        return;
    SD_ASSERT(IC > 0);
    lt_matmul(cuda_ctx_of(be), CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, w, IC, inp, IC, out, CUDA_R_16BF, OC, 0.0f, bias);
}

void cuda_matmul_bwd(struct backend *be, void *dinp, float *dw, float *dbias, const void *dout, const void *inp,
                     const void *w, int N, int IC, int OC, bool accumulate)
{
    if (N == 0 || OC == 0 || IC == 0)
        return;
    struct cuda_ctx *cx = cuda_ctx_of(be);
    if (dinp)
        lt_matmul(cx, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, w, IC, dout, OC, dinp, CUDA_R_16BF, IC,
                  accumulate ? 1.0f : 0.0f, nullptr);
    lt_matmul(cx, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, inp, IC, dout, OC, dw, CUDA_R_32F, IC, 1.0f, nullptr);
    if (dbias) {
        unsigned blocks = (unsigned)((OC + DBIAS_COLS - 1) / DBIAS_COLS);
        dbias_kernel<<<blocks, DBIAS_COLS * DBIAS_LANES, 0, cx->compute>>>(dbias, (const bf16 *)dout, N, OC);
        CUDA_CHECK(cudaGetLastError());
    }
}
