/* The CUDA backend (worker/backend.h): device memory under a byte budget, one compute stream and
 * two copy streams ordered by events, and the op table whose kernels live in the other files of
 * worker/cuda/. Used by slidedp-worker with --device cuda, by the op-parity test and the benches. */
#include "cuda_common.cuh"

#include "common/attn_tiles.h"

#include <string.h>

#define STAGE_FLOATS ((size_t)4 << 20) /* 16 MiB of fp32 staging for conversions */
#define GRAD_STAGE_ELEMS ((size_t)8 << 20) /* 16 MiB of bf16 staging for gradients sent in bf16 */
#define LT_WORKSPACE ((size_t)32 << 20)

/* ---- memory: every byte is counted against the budget ---- */

static void *budget_alloc(struct cuda_ctx *cx, size_t bytes, const char *what)
{
    size_t want = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    if (cx->used + want > cx->budget) {
        sd_err("cuda backend: %s of %zu bytes exceeds the device memory budget (%zu of %zu bytes in use)", what,
               bytes, cx->used, cx->budget);
        return NULL;
    }
    if (cx->nallocs == cx->cap_allocs) {
        size_t cap = cx->cap_allocs ? 2 * cx->cap_allocs : 256;
        struct cuda_alloc *a = (struct cuda_alloc *)realloc(cx->allocs, cap * sizeof *a);
        if (!a) {
            sd_err("cuda backend: out of host memory");
            return NULL;
        }
        cx->allocs = a;
        cx->cap_allocs = cap;
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, want);
    if (e != cudaSuccess) {
        cudaGetLastError();
        sd_err("cuda backend: %s of %zu bytes: cudaMalloc: %s (budget %zu, %zu in use)", what, bytes,
               cudaGetErrorString(e), cx->budget, cx->used);
        return NULL;
    }
    cx->allocs[cx->nallocs++] = (struct cuda_alloc){p, want};
    cx->used += want;
    return p;
}

/* The document table (attention_fwd.cu) goes stale when the memory of its positions is freed or
 * overwritten without upload_positions. */
static void docs_forget_in(struct cuda_ctx *cx, const void *p, size_t bytes)
{
    const char *pos = (const char *)cx->docs.pos;
    if (pos >= (const char *)p && pos < (const char *)p + bytes)
        cx->docs.pos = NULL;
}

static void budget_free(struct cuda_ctx *cx, void *p)
{
    if (!p)
        return;
    for (size_t i = cx->nallocs; i-- > 0;)
        if (cx->allocs[i].p == p) {
            docs_forget_in(cx, p, cx->allocs[i].bytes);
            cx->used -= cx->allocs[i].bytes;
            cx->allocs[i] = cx->allocs[--cx->nallocs];
            CUDA_CHECK(cudaFree(p));
            return;
        }
    fprintf(stderr, "cuda backend: free of %p, which alloc did not return\n", p);
    abort();
}

void *cuda_scratch_try(struct backend *be, size_t bytes)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    if (bytes <= cx->scratch_bytes)
        return cx->scratch;
    /* cudaFree waits for the device, so queued ops that used the old scratch have finished. */
    budget_free(cx, cx->scratch);
    cx->scratch_bytes = 0;
    cx->scratch = budget_alloc(cx, bytes, "op scratch");
    if (cx->scratch)
        cx->scratch_bytes = bytes;
    return cx->scratch;
}

void *cuda_scratch(struct backend *be, size_t bytes)
{
    void *p = cuda_scratch_try(be, bytes);
    if (!p) {
        fprintf(stderr, "%s\n", sd_errmsg());
        abort();
    }
    return p;
}

/* Copies queued on st from now on start after the compute queued so far. */
static void after_compute(struct cuda_ctx *cx, cudaStream_t st)
{
    CUDA_CHECK(cudaEventRecord(cx->compute_mark, cx->compute));
    CUDA_CHECK(cudaStreamWaitEvent(st, cx->compute_mark, 0));
}

static void *cu_alloc(struct backend *be, size_t bytes)
{
    return budget_alloc(cuda_ctx_of(be), bytes, "alloc");
}

static void cu_free(struct backend *be, void *p)
{
    budget_free(cuda_ctx_of(be), p);
}

static void cu_memset0(struct backend *be, void *p, size_t bytes)
{
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cuda_ctx_of(be)->compute));
}

static void cu_synchronize(struct backend *be)
{
    CUDA_CHECK(cudaDeviceSynchronize());
}

/* Synchronous copies run after everything queued on the compute stream. */
static void cu_upload(struct backend *be, void *dst, const void *src_host, size_t bytes)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    docs_forget_in(cx, dst, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, cx->compute));
    CUDA_CHECK(cudaStreamSynchronize(cx->compute));
}

static void cu_download(struct backend *be, void *dst_host, const void *src, size_t bytes)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, cx->compute));
    CUDA_CHECK(cudaStreamSynchronize(cx->compute));
}

/* Conversions run on the device through the fp32 staging buffer, a piece at a time. */
static void cu_upload_f32(struct backend *be, void *dst, enum be_dtype dst_type, const float *src_host, size_t n)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    if (dst_type == BE_F32) {
        cu_upload(be, dst, src_host, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i += cx->stage_n) {
        size_t m = n - i < cx->stage_n ? n - i : cx->stage_n;
        CUDA_CHECK(cudaMemcpyAsync(cx->stage, src_host + i, m * sizeof(float), cudaMemcpyHostToDevice, cx->compute));
        cuda_convert_f32_to_bf16(cx->compute, (bf16 *)dst + i, cx->stage, m);
        CUDA_CHECK(cudaStreamSynchronize(cx->compute));
    }
}

static void cu_download_f32(struct backend *be, float *dst_host, const void *src, enum be_dtype src_type, size_t n)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    if (src_type == BE_F32) {
        cu_download(be, dst_host, src, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i += cx->stage_n) {
        size_t m = n - i < cx->stage_n ? n - i : cx->stage_n;
        cuda_convert_bf16_to_f32(cx->compute, cx->stage, (const bf16 *)src + i, m);
        CUDA_CHECK(cudaMemcpyAsync(dst_host + i, cx->stage, m * sizeof(float), cudaMemcpyDeviceToHost, cx->compute));
        CUDA_CHECK(cudaStreamSynchronize(cx->compute));
    }
}

/* ---- streaming (docs/design.md §6.1) ---- */

static int cu_register_host(struct backend *be, void *p, size_t bytes, bool read_only)
{
    unsigned flags = cudaHostRegisterPortable | (read_only ? cudaHostRegisterReadOnly : 0);
    cudaError_t e = cudaHostRegister(p, bytes, flags);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return sd_err("cuda backend: cudaHostRegister of %zu bytes%s: %s", bytes, read_only ? " (read-only)" : "",
                      cudaGetErrorString(e));
    }
    return 0;
}

static void cu_unregister_host(struct backend *be, void *p)
{
    CUDA_CHECK(cudaHostUnregister(p));
}

static void cu_fetch_weights_async(struct backend *be, int slot, void *dst, const uint16_t *src_host, size_t n)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    /* Compute queued so far may still read the buffer being overwritten. */
    after_compute(cx, cx->h2d);
    CUDA_CHECK(cudaMemcpyAsync(dst, src_host, n * sizeof(uint16_t), cudaMemcpyHostToDevice, cx->h2d));
    CUDA_CHECK(cudaEventRecord(cx->h2d_done[slot], cx->h2d));
}

/* Copied and rounded on the h2d stream through weight_stage in pieces: the stream's order keeps a
 * piece's copy from overwriting the stage before the previous piece's rounding has read it. */
static void cu_fetch_weights_f32_async(struct backend *be, int slot, void *dst, const float *src_host, size_t n)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    if (!cx->weight_stage) {
        cx->weight_stage = (float *)budget_alloc(cx, BE_MASTER_STAGE_FLOATS * sizeof(float), "weight staging");
        if (!cx->weight_stage) {
            fprintf(stderr, "%s\n", sd_errmsg());
            abort();
        }
    }
    after_compute(cx, cx->h2d);
    for (size_t i = 0; i < n; i += BE_MASTER_STAGE_FLOATS) {
        size_t m = n - i < BE_MASTER_STAGE_FLOATS ? n - i : BE_MASTER_STAGE_FLOATS;
        CUDA_CHECK(cudaMemcpyAsync(cx->weight_stage, src_host + i, m * sizeof(float), cudaMemcpyHostToDevice, cx->h2d));
        cuda_round_weights_bf16(cx->h2d, (bf16 *)dst + i, cx->weight_stage, m);
    }
    CUDA_CHECK(cudaEventRecord(cx->h2d_done[slot], cx->h2d));
}

static void cu_wait_weights(struct backend *be, int slot)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    CUDA_CHECK(cudaStreamWaitEvent(cx->compute, cx->h2d_done[slot], 0));
}

static void cu_send_grads_async(struct backend *be, int slot, float *dst_host, const float *src, size_t n)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    after_compute(cx, cx->d2h);
    CUDA_CHECK(cudaMemcpyAsync(dst_host, src, n * sizeof(float), cudaMemcpyDeviceToHost, cx->d2h));
    CUDA_CHECK(cudaEventRecord(cx->d2h_done[slot], cx->d2h));
}

/* Rounded on the d2h stream through grad_stage in pieces: the stream's order keeps a piece's
 * rounding from overwriting the stage before the previous piece's copy has read it. */
static void cu_send_grads_bf16_async(struct backend *be, int slot, uint16_t *dst_host, const float *src, size_t n)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    after_compute(cx, cx->d2h);
    for (size_t i = 0; i < n; i += GRAD_STAGE_ELEMS) {
        size_t m = n - i < GRAD_STAGE_ELEMS ? n - i : GRAD_STAGE_ELEMS;
        cuda_convert_f32_to_bf16(cx->d2h, cx->grad_stage, src + i, m);
        CUDA_CHECK(cudaMemcpyAsync(dst_host + i, cx->grad_stage, m * sizeof(bf16), cudaMemcpyDeviceToHost, cx->d2h));
    }
    CUDA_CHECK(cudaEventRecord(cx->d2h_done[slot], cx->d2h));
}

static void cu_wait_grads_device(struct backend *be, int slot)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    CUDA_CHECK(cudaStreamWaitEvent(cx->compute, cx->d2h_done[slot], 0));
}

/* ---- layer inputs offloaded to host memory ---- */

static void cu_copy_activations_async(struct backend *be, int slot, bool save, void *dev, void *host, size_t bytes)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_ACT_SLOTS);
    cudaStream_t st = save ? cx->d2h : cx->h2d;
    /* a save reads what compute wrote; a load overwrites what compute may still read */
    after_compute(cx, st);
    if (save)
        CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, st));
    else
        CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, st));
    CUDA_CHECK(cudaEventRecord(cx->act_done[slot], st));
}

static void cu_wait_activations(struct backend *be, int slot)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    SD_ASSERT(slot >= 0 && slot < BE_ACT_SLOTS);
    CUDA_CHECK(cudaStreamWaitEvent(cx->compute, cx->act_done[slot], 0));
}

/* ---- exchange between workers: CUDA IPC ---- */

static void *cu_alloc_exported(struct backend *be, size_t bytes, void *handle)
{
    void *p = budget_alloc(cuda_ctx_of(be), bytes, "exchange window");
    if (!p)
        return NULL;
    cudaIpcMemHandle_t h;
    cudaError_t e = cudaIpcGetMemHandle(&h, p);
    if (e != cudaSuccess) {
        cudaGetLastError();
        budget_free(cuda_ctx_of(be), p);
        sd_err("cuda backend: cudaIpcGetMemHandle: %s", cudaGetErrorString(e));
        return NULL;
    }
    static_assert(sizeof h == 64, "an IPC handle fills the 64 bytes published for it");
    memcpy(handle, &h, sizeof h);
    return p;
}

static void *cu_open_peer(struct backend *be, const void *handle)
{
    cudaIpcMemHandle_t h;
    memcpy(&h, handle, sizeof h);
    void *p = NULL;
    cudaError_t e = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
        cudaGetLastError();
        sd_err("cuda backend: cudaIpcOpenMemHandle of a peer's window: %s", cudaGetErrorString(e));
        return NULL;
    }
    return p;
}

static void cu_copy_device(struct backend *be, void *dst, const void *src, size_t bytes)
{
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_ctx_of(be)->compute));
}

/* Called from the worker's poster thread too: the current device is per thread. */
static void cu_wait_grads_host(struct backend *be, int slot)
{
    CUDA_CHECK(cudaSetDevice(cuda_ctx_of(be)->device));
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    CUDA_CHECK(cudaEventSynchronize(cuda_ctx_of(be)->d2h_done[slot]));
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cu_alloc,
    .free = cu_free,
    .memset0 = cu_memset0,
    .upload = cu_upload,
    .download = cu_download,
    .upload_f32 = cu_upload_f32,
    .download_f32 = cu_download_f32,
    .synchronize = cu_synchronize,
    .register_host = cu_register_host,
    .unregister_host = cu_unregister_host,
    .fetch_weights_async = cu_fetch_weights_async,
    .fetch_weights_f32_async = cu_fetch_weights_f32_async,
    .wait_weights = cu_wait_weights,
    .send_grads_async = cu_send_grads_async,
    .send_grads_bf16_async = cu_send_grads_bf16_async,
    .wait_grads_host = cu_wait_grads_host,
    .wait_grads_device = cu_wait_grads_device,
    .copy_activations_async = cu_copy_activations_async,
    .wait_activations = cu_wait_activations,
    .alloc_exported = cu_alloc_exported,
    .open_peer = cu_open_peer,
    .copy_device = cu_copy_device,
    .add_f32 = cuda_add_f32,
    .embedding_fwd = cuda_embedding_fwd,
    .embedding_bwd = cuda_embedding_bwd,
    .rmsnorm_fwd = cuda_rmsnorm_fwd,
    .rmsnorm_bwd = cuda_rmsnorm_bwd,
    .matmul_fwd = cuda_matmul_fwd,
    .matmul_bwd = cuda_matmul_bwd,
    .upload_positions = cuda_upload_positions,
    .rope_fwd = cuda_rope_fwd,
    .rope_bwd = cuda_rope_bwd,
    .attention_fwd = cuda_attention_fwd,
    .attention_bwd = cuda_attention_bwd,
    .swiglu_fwd = cuda_swiglu_fwd,
    .swiglu_bwd = cuda_swiglu_bwd,
    .add_inplace = cuda_add_inplace,
    .cross_entropy = cuda_cross_entropy,
    .attention_supports = cuda_attention_supports,
};

/* Dense bf16 tensor-core peak by chip: Hopper SXM 989 TFLOP/s, A100 312; otherwise an estimate from
 * the clock and the multiprocessors (1024 bf16 FMA per SM per clock on Ampere and later). */
static double peak_bf16(const cudaDeviceProp *p, int clock_khz)
{
    if (p->major == 9)
        return 989e12;
    if (p->major == 8 && p->minor == 0)
        return 312e12;
    return 2.0 * 1024.0 * p->multiProcessorCount * clock_khz * 1e3;
}

static void ctx_destroy(struct cuda_ctx *cx)
{
    while (cx->nallocs)
        budget_free(cx, cx->allocs[cx->nallocs - 1].p);
    free(cx->allocs);
    if (cx->lt)
        cublasLtDestroy(cx->lt);
    if (cx->cublas)
        cublasDestroy(cx->cublas);
    for (int i = 0; i < BE_MAX_XFER_SLOTS; i++) {
        if (cx->h2d_done[i])
            cudaEventDestroy(cx->h2d_done[i]);
        if (cx->d2h_done[i])
            cudaEventDestroy(cx->d2h_done[i]);
    }
    for (int i = 0; i < BE_ACT_SLOTS; i++)
        if (cx->act_done[i])
            cudaEventDestroy(cx->act_done[i]);
    if (cx->compute_mark)
        cudaEventDestroy(cx->compute_mark);
    for (int i = 0; i < CUDA_ATTN_LANES_MAX - 1; i++) {
        if (cx->attn_side_done[i])
            cudaEventDestroy(cx->attn_side_done[i]);
        if (cx->attn_side[i])
            cudaStreamDestroy(cx->attn_side[i]);
    }
    cudaStream_t streams[] = {cx->compute, cx->h2d, cx->d2h};
    for (int i = 0; i < 3; i++)
        if (streams[i])
            cudaStreamDestroy(streams[i]);
    free(cx);
}

#define INIT_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            cudaGetLastError();                                                                    \
            ctx_destroy(cx);                                                                       \
            return sd_err("cuda backend: %s: %s", #call, cudaGetErrorString(e_));                  \
        }                                                                                          \
    } while (0)

extern "C" int backend_cuda_init(struct backend *be, int device, size_t mem_budget)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        cudaGetLastError();
        return sd_err("cuda backend: no CUDA device (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
    }
    if (device < 0 || device >= count)
        return sd_err("cuda backend: device %d does not exist (%d found)", device, count);
    struct cuda_ctx *cx = (struct cuda_ctx *)calloc(1, sizeof *cx);
    if (!cx)
        return sd_err("cuda backend: out of host memory");
    cx->device = device;
    INIT_TRY(cudaSetDevice(device));
    cudaDeviceProp prop;
    INIT_TRY(cudaGetDeviceProperties(&prop, device));
    int clock_khz = 0;
    INIT_TRY(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device));
    if (prop.major < 8) {
        ctx_destroy(cx);
        return sd_err("cuda backend: %s is compute capability %d.%d; bf16 tensor cores need 8.0 or later", prop.name,
                      prop.major, prop.minor);
    }
    cx->num_sms = prop.multiProcessorCount;
    size_t free_b = 0, total_b = 0;
    INIT_TRY(cudaMemGetInfo(&free_b, &total_b));
    cx->budget = mem_budget ? mem_budget : free_b;
    if (cx->budget > free_b) {
        ctx_destroy(cx);
        return sd_err("cuda backend: budget of %zu bytes exceeds the %zu bytes free on %s", mem_budget, free_b,
                      prop.name);
    }
    INIT_TRY(cudaStreamCreateWithFlags(&cx->compute, cudaStreamNonBlocking));
    INIT_TRY(cudaStreamCreateWithFlags(&cx->h2d, cudaStreamNonBlocking));
    INIT_TRY(cudaStreamCreateWithFlags(&cx->d2h, cudaStreamNonBlocking));
    INIT_TRY(cudaEventCreateWithFlags(&cx->compute_mark, cudaEventDisableTiming));
    for (int i = 0; i < BE_MAX_XFER_SLOTS; i++) {
        INIT_TRY(cudaEventCreateWithFlags(&cx->h2d_done[i], cudaEventDisableTiming));
        INIT_TRY(cudaEventCreateWithFlags(&cx->d2h_done[i], cudaEventDisableTiming));
    }
    for (int i = 0; i < BE_ACT_SLOTS; i++)
        INIT_TRY(cudaEventCreateWithFlags(&cx->act_done[i], cudaEventDisableTiming));
    if (cublasLtCreate(&cx->lt) != CUBLAS_STATUS_SUCCESS || cublasCreate(&cx->cublas) != CUBLAS_STATUS_SUCCESS) {
        ctx_destroy(cx);
        return sd_err("cuda backend: cuBLAS handle creation failed");
    }
    cx->lt_ws = budget_alloc(cx, LT_WORKSPACE, "cuBLASLt workspace");
    cx->stage = (float *)budget_alloc(cx, STAGE_FLOATS * sizeof(float), "conversion staging");
    cx->grad_stage = (bf16 *)budget_alloc(cx, GRAD_STAGE_ELEMS * sizeof(bf16), "gradient staging");
    if (!cx->lt_ws || !cx->stage || !cx->grad_stage) {
        ctx_destroy(cx);
        return -1;
    }
    if (cublasSetStream(cx->cublas, cx->compute) != CUBLAS_STATUS_SUCCESS ||
        cublasSetWorkspace(cx->cublas, cx->lt_ws, LT_WORKSPACE) != CUBLAS_STATUS_SUCCESS) {
        ctx_destroy(cx);
        return sd_err("cuda backend: cuBLAS stream/workspace setup failed");
    }
    cx->lt_ws_bytes = LT_WORKSPACE;
    cx->stage_n = STAGE_FLOATS;

    be->ops = &cuda_ops;
    be->ctx = cx;
    be->act_dtype = BE_BF16;
    be->weight_dtype = BE_BF16;
    snprintf(be->device_name, sizeof be->device_name, "%.63s", prop.name);
    be->peak_flops = peak_bf16(&prop, clock_khz);
    be->deterministic = false;
    cx->attn_tile_limit = ATTN_TILE_WORKSPACE_DEFAULT;
    cx->docs_cudnn_min_length = CUDA_DOCS_CUDNN_MIN_LENGTH;
    return 0;
}

extern "C" void backend_cuda_set_attention_tile_limit(struct backend *be, size_t bytes)
{
    cuda_ctx_of(be)->attn_tile_limit = bytes;
}

extern "C" void backend_cuda_set_docs_cudnn_min_length(struct backend *be, int tokens)
{
    cuda_ctx_of(be)->docs_cudnn_min_length = tokens;
}

extern "C" void backend_cuda_free(struct backend *be)
{
    struct cuda_ctx *cx = cuda_ctx_of(be);
    if (cx) {
        cudaDeviceSynchronize();
        ctx_destroy(cx);
    }
    memset(be, 0, sizeof *be);
}
