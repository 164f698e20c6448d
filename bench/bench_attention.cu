/* Times the CUDA backend's causal attention (forward, backward, forward+backward) with CUDA events
 * on the backend's compute stream: warm-up, then the median of repeats, at the shapes of docs/performance.md §1
 * (D=128, 16 query heads, 8 kv heads; B=2 T=4096 and B=1 T=32768). TFLOP/s use the standard causal
 * count: forward 4*B*Hq*T*T*D/2, backward 2.5x forward. Then document attention (issue 30) against
 * dense causal attention at B=2 T=4096 for several document-length mixes. `bench_attention
 * backward`: the backward's deterministic, built-in and fused kernels at 4K, 32K and 128K (`backward
 * tilings`: then the deterministic one cut into other calls, and its calls spread over streams). Not a
 * test; built when CUDA is. */
#include "common/attn_tiles.h"
#include "worker/cuda/cuda_common.cuh"

#include <algorithm>
#include <cstring>
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

/* The tensors of one attention call and its backward, q, k, v and dout random. */
struct bufs {
    size_t nq;
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv;
    float *lse;
};

static void bufs_free(struct backend *be, struct bufs *b)
{
    void *all[] = {b->q, b->k, b->v, b->out, b->dout, b->dq, b->dk, b->dv, b->lse};
    for (void *p : all)
        be->ops->free(be, p);
}

static int bufs_alloc(struct backend *be, shape s, struct bufs *b)
{
    const struct backend_ops *o = be->ops;
    size_t nq = (size_t)s.B * s.T * s.Hq * s.D, nk = (size_t)s.B * s.T * s.Hkv * s.D, nl = (size_t)s.B * s.Hq * s.T;
    b->nq = nq;
    b->q = o->alloc(be, nq * 2);
    b->k = o->alloc(be, nk * 2);
    b->v = o->alloc(be, nk * 2);
    b->out = o->alloc(be, nq * 2);
    b->dout = o->alloc(be, nq * 2);
    b->dq = o->alloc(be, nq * 2);
    b->dk = o->alloc(be, nk * 2);
    b->dv = o->alloc(be, nk * 2);
    b->lse = (float *)o->alloc(be, nl * 4);
    if (!b->q || !b->k || !b->v || !b->out || !b->dout || !b->dq || !b->dk || !b->dv || !b->lse) {
        fprintf(stderr, "bench_attention: %s\n", sd_errmsg());
        return 1;
    }
    fill_random(be, b->q, nq, 1);
    fill_random(be, b->k, nk, 2);
    fill_random(be, b->v, nk, 3);
    fill_random(be, b->dout, nq, 4);
    return 0;
}

/* The attention backward as the engine calls it (deterministic or not as be says), into bb's dq, dk, dv. */
static void bwd_call(struct backend *be, const struct bufs &bb, shape s)
{
    be->ops->attention_bwd(be, bb.dq, bb.dk, bb.dv, bb.dout, bb.q, bb.k, bb.v, bb.out, bb.lse, NULL, s.B, s.T, s.Hq,
                           s.Hkv, s.D);
}

/* dq, dk and dv (bf16) copied to h once the queued work is done, to compare runs bit for bit. */
static void grads_snapshot(struct backend *be, const struct bufs &bb, shape s, std::vector<uint16_t> &h)
{
    size_t nk = (size_t)s.B * s.T * s.Hkv * s.D, sizes[3] = {bb.nq, nk, nk};
    void *grads[3] = {bb.dq, bb.dk, bb.dv};
    CUDA_CHECK(cudaStreamSynchronize(cuda_ctx_of(be)->compute));
    h.resize(sizes[0] + sizes[1] + sizes[2]);
    for (size_t i = 0, at = 0; i < 3; at += sizes[i], i++)
        CUDA_CHECK(cudaMemcpy(h.data() + at, grads[i], sizes[i] * 2, cudaMemcpyDeviceToHost));
}

static int run(struct backend *be, shape s)
{
    const struct backend_ops *o = be->ops;
    struct bufs bb;
    if (bufs_alloc(be, s, &bb) != 0)
        return 1;
    cudaStream_t st = cuda_ctx_of(be)->compute;
    int reps = s.T >= 16384 ? 5 : 20;
    auto fwd = [&] { o->attention_fwd(be, bb.out, bb.lse, bb.q, bb.k, bb.v, NULL, s.B, s.T, s.Hq, s.Hkv, s.D); };
    auto bwd = [&] { bwd_call(be, bb, s); };
    float t_f = time_ms(st, 3, reps, fwd);
    float t_b = time_ms(st, 3, reps, bwd);
    float t_fb = time_ms(st, 3, reps, [&] {
        fwd();
        bwd();
    });
    double flops_f = 4.0 * s.B * s.Hq * (double)s.T * s.T * s.D / 2.0, flops_b = 2.5 * flops_f;
    /* the outputs must be finite: a broken kernel can be fast */
    std::vector<float> h(bb.nq);
    o->download_f32(be, h.data(), bb.dq, BE_BF16, bb.nq);
    size_t bad = 0;
    for (float x : h)
        bad += !std::isfinite(x);
    printf("attention B=%d T=%d Hq=%d Hkv=%d D=%d causal: fwd %.3f ms %.1f TFLOP/s | bwd %.3f ms %.1f TFLOP/s | "
           "fwd+bwd %.3f ms %.1f TFLOP/s%s\n",
           s.B, s.T, s.Hq, s.Hkv, s.D, t_f, flops_f / t_f * 1e-9, t_b, flops_b / t_b * 1e-9, t_fb,
           (flops_f + flops_b) / t_fb * 1e-9, bad ? "  NON-FINITE dq" : "");
    printf("RESULT attention_fwd_B%d_T%d %.1f\nRESULT attention_fwdbwd_B%d_T%d %.1f\n", s.B, s.T, flops_f / t_f * 1e-9,
           s.B, s.T, (flops_f + flops_b) / t_fb * 1e-9);
    bufs_free(be, &bb);
    return bad != 0;
}

/* The attention backward three ways at one shape (issue 31): deterministic as the engine runs it
 * (cuDNN's deterministic engine over attn_tiles.h's calls, where cuDNN loads), the built-in
 * deterministic kernels alone, and cuDNN's fused non-deterministic backward; milliseconds and
 * TFLOP/s (2.5 forwards), and whether two deterministic runs give the same bits. */
static int run_backward(struct backend *be, shape s, int reps)
{
    const struct backend_ops *o = be->ops;
    struct bufs bb;
    if (bufs_alloc(be, s, &bb) != 0)
        return 1;
    cudaStream_t st = cuda_ctx_of(be)->compute;
    o->attention_fwd(be, bb.out, bb.lse, bb.q, bb.k, bb.v, NULL, s.B, s.T, s.Hq, s.Hkv, s.D);
    auto engine = [&] { bwd_call(be, bb, s); };
    bool was = be->deterministic;
    be->deterministic = true;
    float t_det = time_ms(st, 1, reps, engine);
    std::vector<uint16_t> first, again;
    grads_snapshot(be, bb, s, first);
    engine();
    grads_snapshot(be, bb, s, again);
    bool same = first == again;
    float t_builtin = time_ms(st, 1, reps, [&] {
        cuda_attention_bwd_builtin(be, bb.dq, bb.dk, bb.dv, bb.dout, bb.q, bb.k, bb.v, bb.out, bb.lse, NULL, s.B, s.T,
                                   s.Hq, s.Hkv, s.D);
    });
    be->deterministic = false;
    float t_fused = time_ms(st, 1, reps, engine);
    be->deterministic = was;
    double flops = 2.5 * 4.0 * s.B * s.Hq * (double)s.T * s.T * s.D / 2.0;
    auto tf = [&](float ms) { return flops / ms * 1e-9; };
    printf("attention backward B=%d T=%d Hq=%d Hkv=%d D=%d: deterministic %.3f ms %.1f TFLOP/s (%.2fx cuDNN's "
           "fused), built-in kernels %.3f ms %.1f TFLOP/s, cuDNN fused (not deterministic) %.3f ms %.1f TFLOP/s; "
           "deterministic repeat %s\n",
           s.B, s.T, s.Hq, s.Hkv, s.D, t_det, tf(t_det), t_fused / t_det, t_builtin, tf(t_builtin), t_fused,
           tf(t_fused), same ? "bit-identical" : "DIFFERS");
    printf("RESULT attn_bwd_det_T%d %.1f\nRESULT attn_bwd_builtin_T%d %.1f\nRESULT attn_bwd_fused_T%d %.1f\n", s.T,
           tf(t_det), s.T, tf(t_builtin), s.T, tf(t_fused));
    bufs_free(be, &bb);
    return !same;
}

/* The deterministic backward alone at one shape in other calls than the default bound's (issue 31:
 * whether more heads per call, longer chunks or both buy speed): ng KV heads a call in chunks of at
 * most rows rows, ng = 0 the default; milliseconds, TFLOP/s and each call's dP. Then the bounds
 * the planner chooses from, 1 to 8 GiB, each with its repeat and its difference from 1 GiB's. */
static int run_det_tilings(struct backend *be, shape s, int reps)
{
    struct bufs bb;
    if (bufs_alloc(be, s, &bb) != 0)
        return 1;
    const struct backend_ops *o = be->ops;
    struct cuda_ctx *cx = cuda_ctx_of(be);
    o->attention_fwd(be, bb.out, bb.lse, bb.q, bb.k, bb.v, NULL, s.B, s.T, s.Hq, s.Hkv, s.D);
    bool was = be->deterministic;
    be->deterministic = true;
    double flops = 2.5 * 4.0 * s.B * s.Hq * (double)s.T * s.T * s.D / 2.0;
    static const int shapes[][2] = {{0, 0}, {2, 16384}, {4, 8192}, {8, 4096}, {1, 32768}, {4, 16384}, {8, 8192},
                                    {2, 32768}, {8, 16384}};
    auto engine = [&] { bwd_call(be, bb, s); };
    for (const auto &sh : shapes) {
        cx->attn_tile_ng = sh[0];
        cx->attn_tile_rows = sh[1];
        struct attn_tiling t;
        cuda_attention_tiling(be, s.B, s.T, s.Hq, s.Hkv, &t);
        float ms = time_ms(cx->compute, 1, reps, engine);
        printf("attention backward B=%d T=%d deterministic, calls of %d KV heads x %d rows (%d chunks, %zu MiB of "
               "dP)%s: %.3f ms %.1f TFLOP/s\n",
               s.B, s.T, t.ng, t.chunk, t.nchunks, attn_tiling_dp_bytes(&t) >> 20, sh[0] ? "" : " (default)", ms,
               flops / ms * 1e-9);
    }
    cx->attn_tile_ng = cx->attn_tile_rows = 0;
    /* the bounds the planner may choose (search_tiles): each repeat bit-identical, and against the
     * default bound's gradients (another order of fp32 sums, so close, not equal) */
    auto value = [](uint16_t b) {
        uint32_t u = (uint32_t)b << 16;
        float f;
        memcpy(&f, &u, 4);
        return (double)f;
    };
    std::vector<uint16_t> base, first, again;
    int rc = 0;
    for (size_t gib = 1; gib <= 8; gib *= 2) {
        cx->attn_tile_limit = gib << 30;
        struct attn_tiling t;
        cuda_attention_tiling(be, s.B, s.T, s.Hq, s.Hkv, &t);
        float ms = time_ms(cx->compute, 1, reps, engine);
        grads_snapshot(be, bb, s, first);
        engine();
        grads_snapshot(be, bb, s, again);
        if (gib == 1)
            base = first;
        double worst = 0, scale = 0;
        for (size_t i = 0; i < base.size(); i++) {
            worst = fmax(worst, fabs(value(first[i]) - value(base[i])));
            scale = fmax(scale, fabs(value(base[i])));
        }
        bool same = first == again;
        rc |= !same;
        printf("attention backward B=%d T=%d deterministic, bound %zu GiB: calls of %d KV heads x %d rows (%zu MiB of "
               "dP): %.3f ms %.1f TFLOP/s, repeat %s, largest difference from the 1 GiB bound's %.3g (of %.3g)\n",
               s.B, s.T, gib, t.ng, t.chunk, attn_tiling_dp_bytes(&t) >> 20, ms, flops / ms * 1e-9,
               same ? "bit-identical" : "DIFFERS", worst, scale);
    }
    cx->attn_tile_limit = ATTN_TILE_WORKSPACE_DEFAULT;
    /* lanes: the calls' (batch, KV heads) groups alternating over 1, 2 or 4 streams, each lane its
     * own workspace (whether one call's dQ matmul, bound by reading dP, overlaps another's kernel);
     * every lane count must give the one-lane bits */
    static const int lane_shapes[][2] = {{0, 0}, {1, 32768}, {2, 32768}};
    for (const auto &sh : lane_shapes) {
        cx->attn_tile_ng = sh[0];
        cx->attn_tile_rows = sh[1];
        struct attn_tiling t;
        cuda_attention_tiling(be, s.B, s.T, s.Hq, s.Hkv, &t);
        std::vector<uint16_t> one;
        for (int lanes : {1, 2, 4}) {
            cx->attn_tile_lanes = lanes;
            /* the lanes' scratch must fit, else the engine would fall back to the built-in kernels */
            if (!cuda_attention_bwd_tiles(be, bb.dq, bb.dk, bb.dv, bb.dout, bb.q, bb.k, bb.v, bb.out, bb.lse, s.B,
                                          s.T, s.Hq, s.Hkv, s.D)) {
                printf("attention backward B=%d T=%d deterministic, calls of %d KV heads x %d rows on %d lane(s): "
                       "not run (cuDNN refused or the scratch does not fit)\n",
                       s.B, s.T, t.ng, t.chunk, lanes);
                if (lanes == 1) { /* nothing to compare the others with */
                    rc = 1;
                    break;
                }
                continue;
            }
            float ms = time_ms(cx->compute, 1, reps, engine);
            grads_snapshot(be, bb, s, first);
            if (lanes == 1)
                one = first;
            bool same = first == one;
            rc |= !same;
            printf("attention backward B=%d T=%d deterministic, calls of %d KV heads x %d rows (%d chunks, %zu MiB of "
                   "dP)%s on %d lane(s): %.3f ms %.1f TFLOP/s, %s\n",
                   s.B, s.T, t.ng, t.chunk, t.nchunks, attn_tiling_dp_bytes(&t) >> 20, sh[0] ? "" : " (default)",
                   lanes, ms, flops / ms * 1e-9, same ? "bits of one lane" : "DIFFERS from one lane");
        }
    }
    cx->attn_tile_ng = cx->attn_tile_rows = cx->attn_tile_lanes = 0;
    be->deterministic = was;
    bufs_free(be, &bb);
    return rc;
}

/* Document positions (B,T) of documents drawn from mix, laid greedily into rows (a document that
 * does not fit the rest of a row starts the next; the rest is padding that continues the row's last
 * document). Returns the (query, key) pairs document attention visits, per head. */
static double pack_positions(std::vector<int32_t> &pos, int B, int T, const char *mix, uint64_t seed)
{
    pos.assign((size_t)B * T, 0);
    uint64_t s = seed;
    auto uniform = [&] {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        return ((double)(s >> 11) + 0.5) / 9007199254740992.0;
    };
    double pairs = 0;
    for (int b = 0; b < B; b++) {
        int32_t *row = pos.data() + (size_t)b * T;
        for (int t = 0; t < T;) {
            int len;
            if (!strcmp(mix, "lognormal600")) { /* exp(N(6.0, 0.9)): mean 605, median 403, tail clipped at T */
                double z = sqrt(-2.0 * log(uniform())) * cos(2.0 * M_PI * uniform());
                len = (int)std::min((double)T, std::ceil(exp(6.0 + 0.9 * z)));
            } else {
                len = atoi(mix); /* a fixed length */
            }
            if (t > 0 && t + len > T) { /* the next row takes a document that does not fit: padding */
                for (; t < T; t++)
                    row[t] = row[t - 1] + 1;
                break;
            }
            for (int i = 0; i < len && t < T; i++, t++)
                row[t] = i;
        }
        for (int t2 = 0; t2 < T; t2++)
            pairs += pos[(size_t)b * T + t2] + 1;
    }
    return pairs;
}

/* Document attention against dense causal attention at one length mix: fwd+bwd milliseconds of
 * both, on the same tensors, in each mode of runtime.deterministic (deterministic, the default: the
 * dense backward runs the built-in kernels; not: cuDNN's where it loads). Document attention runs
 * as the engine runs it (positions through upload_positions: cuDNN over the document table where it
 * loads) and on the built-in kernels alone (the same positions uploaded plainly, with no table). A
 * mix whose rows are each one document runs dense in the engine (model_set_positions), so its line
 * says so. */
static int run_documents(struct backend *be, shape s, const char *mix)
{
    const struct backend_ops *o = be->ops;
    struct bufs bb;
    int32_t *pos = (int32_t *)o->alloc(be, (size_t)s.B * s.T * 4);
    int32_t *pos_plain = (int32_t *)o->alloc(be, (size_t)s.B * s.T * 4);
    if (!pos || !pos_plain || bufs_alloc(be, s, &bb) != 0)
        return 1;
    void *q = bb.q, *k = bb.k, *v = bb.v, *out = bb.out, *dout = bb.dout, *dq = bb.dq, *dk = bb.dk, *dv = bb.dv;
    float *lse = bb.lse;
    std::vector<int32_t> hpos;
    double pairs = pack_positions(hpos, s.B, s.T, mix, 5), dense = (double)s.B * s.T * (s.T + 1) / 2;
    o->upload_positions(be, pos, hpos.data(), s.B, s.T);
    o->upload(be, pos_plain, hpos.data(), hpos.size() * 4);
    cudaStream_t st = cuda_ctx_of(be)->compute;
    auto fb = [&](const int32_t *p) {
        return time_ms(st, 3, 20, [&] {
            o->attention_fwd(be, out, lse, q, k, v, p, s.B, s.T, s.Hq, s.Hkv, s.D);
            o->attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, p, s.B, s.T, s.Hq, s.Hkv, s.D);
        });
    };
    int docs = 0;
    bool one_per_row = true;
    for (size_t i = 0; i < hpos.size(); i++) {
        docs += hpos[i] == 0;
        one_per_row &= hpos[i] == (int32_t)(i % s.T);
    }
    for (bool det : {true, false}) {
        bool was = be->deterministic;
        be->deterministic = det;
        float t_doc = fb(pos), t_builtin = fb(pos_plain), t_dense = fb(NULL);
        be->deterministic = was;
        const char *mode = det ? "det" : "nondet";
        printf("attention B=%d T=%d documents %s, %s: %d documents, %.1f%% of the causal pairs; fwd+bwd document %.3f ms "
               "(built-in kernels alone %.3f), dense causal %.3f ms (%.2fx)%s\n",
               s.B, s.T, mix, det ? "deterministic" : "not deterministic", docs, 100.0 * pairs / dense, t_doc,
               t_builtin, t_dense, t_dense / t_doc,
               one_per_row ? "; one document per row: the engine runs it dense" : "");
        printf("RESULT docattn_fwdbwd_ms_%s_%s %.3f\nRESULT docattn_builtin_fwdbwd_ms_%s_%s %.3f\n"
               "RESULT dense_fwdbwd_ms_%s_%s %.3f\n",
               mix, mode, t_doc, mix, mode, t_builtin, mix, mode, t_dense);
    }
    bufs_free(be, &bb);
    o->free(be, pos);
    o->free(be, pos_plain);
    return 0;
}

int main(int argc, char **argv)
{
    struct backend be;
    if (backend_cuda_init(&be, 0, 0) != 0) {
        fprintf(stderr, "bench_attention: %s\n", sd_errmsg());
        return 1;
    }
    printf("device %s\n", be.device_name);
    if (argc > 1 && !strcmp(argv[1], "backward")) { /* issue 31's table: 4K, 32K, 128K */
        int rc = run_backward(&be, {2, 4096, 16, 8, 128}, 10) | run_backward(&be, {1, 32768, 16, 8, 128}, 3) |
                 run_backward(&be, {1, 131072, 16, 8, 128}, 1);
        if (argc > 2 && !strcmp(argv[2], "tilings")) /* `backward tilings`: the deterministic one in other calls */
            rc |= run_det_tilings(&be, {1, 32768, 16, 8, 128}, 3) | run_det_tilings(&be, {1, 131072, 16, 8, 128}, 1);
        backend_cuda_free(&be);
        return rc;
    }
    int rc = run(&be, {2, 4096, 16, 8, 128}) | run(&be, {1, 32768, 16, 8, 128});
    /* document attention at Qwen3-1.7B's shape: real-length documents (lognormal600), short ones,
     * half windows and one document per window (the dense case: no slower) */
    for (const char *mix : {"lognormal600", "64", "256", "2048", "4096"})
        rc |= run_documents(&be, {2, 4096, 16, 8, 128}, mix);
    backend_cuda_free(&be);
    return rc;
}
