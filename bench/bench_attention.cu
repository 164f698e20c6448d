/* Times the CUDA backend's causal attention (forward, backward, forward+backward) with CUDA events
 * on the backend's compute stream: warm-up, then the median of repeats, at the shapes of docs/performance.md §1
 * (D=128, 16 query heads, 8 kv heads; B=2 T=4096 and B=1 T=32768). TFLOP/s use the standard causal
 * count: forward 4*B*Hq*T*T*D/2, backward 2.5x forward. Not a test; built when CUDA is. */
#include "worker/cuda/cuda_common.cuh"

#include <algorithm>
#include <cmath>
#include <vector>

struct shape {
    int B, T, Hq, Hkv, D;
};

static void fill_random(struct backend *be, void *dst, size_t n, uint64_t seed)
{
    std::vector<float> h(n);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (float)((s >> 40) & 0xffffff) / (float)(1 << 24) * 2.0f - 1.0f;
    }
    be->ops->upload_f32(be, dst, BE_BF16, h.data(), n);
}

/* Median milliseconds of fn over reps runs after warm runs, timed with events on stream st. */
template <typename F>
static float time_ms(cudaStream_t st, int warm, int reps, F fn)
{
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    for (int i = 0; i < warm; i++)
        fn();
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        CUDA_CHECK(cudaEventRecord(a, st));
        fn();
        CUDA_CHECK(cudaEventRecord(b, st));
        CUDA_CHECK(cudaEventSynchronize(b));
        CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
    }
    CUDA_CHECK(cudaEventDestroy(a));
    CUDA_CHECK(cudaEventDestroy(b));
    std::sort(ms.begin(), ms.end());
    return ms[reps / 2];
}

static int run(struct backend *be, shape s)
{
    const struct backend_ops *o = be->ops;
    size_t nq = (size_t)s.B * s.T * s.Hq * s.D, nk = (size_t)s.B * s.T * s.Hkv * s.D, nl = (size_t)s.B * s.Hq * s.T;
    void *q = o->alloc(be, nq * 2), *k = o->alloc(be, nk * 2), *v = o->alloc(be, nk * 2), *out = o->alloc(be, nq * 2);
    void *dout = o->alloc(be, nq * 2), *dq = o->alloc(be, nq * 2), *dk = o->alloc(be, nk * 2), *dv = o->alloc(be, nk * 2);
    float *lse = (float *)o->alloc(be, nl * 4);
    if (!q || !k || !v || !out || !dout || !dq || !dk || !dv || !lse) {
        fprintf(stderr, "bench_attention: %s\n", sd_errmsg());
        return 1;
    }
    fill_random(be, q, nq, 1);
    fill_random(be, k, nk, 2);
    fill_random(be, v, nk, 3);
    fill_random(be, dout, nq, 4);
    cudaStream_t st = cuda_ctx_of(be)->compute;
    int reps = s.T >= 16384 ? 5 : 20;
    auto fwd = [&] { o->attention_fwd(be, out, lse, q, k, v, NULL, s.B, s.T, s.Hq, s.Hkv, s.D); };
    auto bwd = [&] { o->attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, NULL, s.B, s.T, s.Hq, s.Hkv, s.D); };
    float t_f = time_ms(st, 3, reps, fwd);
    float t_b = time_ms(st, 3, reps, bwd);
    float t_fb = time_ms(st, 3, reps, [&] {
        fwd();
        bwd();
    });
    double flops_f = 4.0 * s.B * s.Hq * (double)s.T * s.T * s.D / 2.0, flops_b = 2.5 * flops_f;
    /* the outputs must be finite: a broken kernel can be fast */
    std::vector<float> h(nq);
    o->download_f32(be, h.data(), dq, BE_BF16, nq);
    size_t bad = 0;
    for (float x : h)
        bad += !std::isfinite(x);
    printf("attention B=%d T=%d Hq=%d Hkv=%d D=%d causal: fwd %.3f ms %.1f TFLOP/s | bwd %.3f ms %.1f TFLOP/s | "
           "fwd+bwd %.3f ms %.1f TFLOP/s%s\n",
           s.B, s.T, s.Hq, s.Hkv, s.D, t_f, flops_f / t_f * 1e-9, t_b, flops_b / t_b * 1e-9, t_fb,
           (flops_f + flops_b) / t_fb * 1e-9, bad ? "  NON-FINITE dq" : "");
    printf("RESULT attention_fwd_B%d_T%d %.1f\nRESULT attention_fwdbwd_B%d_T%d %.1f\n", s.B, s.T, flops_f / t_f * 1e-9,
           s.B, s.T, (flops_f + flops_b) / t_fb * 1e-9);
    void *bufs[] = {q, k, v, out, dout, dq, dk, dv, lse};
    for (void *p : bufs)
        o->free(be, p);
    return bad != 0;
}

int main(void)
{
    struct backend be;
    if (backend_cuda_init(&be, 0, 0) != 0) {
        fprintf(stderr, "bench_attention: %s\n", sd_errmsg());
        return 1;
    }
    printf("device %s\n", be.device_name);
    int rc = run(&be, {2, 4096, 16, 8, 128}) | run(&be, {1, 32768, 16, 8, 128});
    backend_cuda_free(&be);
    return rc;
}
