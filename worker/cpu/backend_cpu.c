/* The CPU backend (worker/backend.h): fp32 compute from bf16 weights, matmuls through OpenBLAS,
 * every other op in plain C. It runs CI, `--device cpu` jobs, and is the reference every other
 * backend is compared with (tests/test_backend_ops.c), so clarity and determinism come first. */
#include "worker/backend.h"

#include "common/bf16.h"
#include "common/err.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "Device" memory is host memory; transfers are synchronous copies and ops run on the calling
 * thread, in a fixed order, so every call with the same inputs gives bit-identical outputs. */
struct cpu_ctx {
    double *scratch; /* per-op double accumulators (attention rows, column sums), grown on demand */
    size_t scratch_n;
};

#define CPU_ALIGN 64

static double *cpu_scratch(struct backend *be, size_t n)
{
    struct cpu_ctx *cx = be->ctx;
    if (n > cx->scratch_n) {
        free(cx->scratch);
        cx->scratch = malloc(n * sizeof(double));
        cx->scratch_n = cx->scratch ? n : 0;
        /* Ops cannot report errors, and a worker short of a few MiB of host memory cannot go on. */
        SD_ASSERT(cx->scratch != NULL);
    }
    return cx->scratch;
}

/* ---- memory ---- */

static void *cpu_alloc(struct backend *be, size_t bytes)
{
    void *p = NULL;
    int rc = posix_memalign(&p, CPU_ALIGN, bytes ? bytes : CPU_ALIGN);
    if (rc != 0) {
        sd_err("cpu backend: cannot allocate %zu bytes: %s", bytes, strerror(rc));
        return NULL;
    }
    return p;
}

static void cpu_free(struct backend *be, void *p)
{
    free(p);
}

static void cpu_memset0(struct backend *be, void *p, size_t bytes)
{
    memset(p, 0, bytes);
}

static void cpu_upload(struct backend *be, void *dst, const void *src_host, size_t bytes)
{
    memcpy(dst, src_host, bytes);
}

/* The CPU attention reads the positions themselves: nothing to derive. */
static void cpu_upload_positions(struct backend *be, int32_t *dst, const int32_t *pos, int B, int T)
{
    memcpy(dst, pos, sizeof(int32_t) * (size_t)B * T);
}

static void cpu_download(struct backend *be, void *dst_host, const void *src, size_t bytes)
{
    memcpy(dst_host, src, bytes);
}

static void cpu_upload_f32(struct backend *be, void *dst, enum be_dtype dst_type, const float *src_host, size_t n)
{
    if (dst_type == BE_F32) {
        memcpy(dst, src_host, n * sizeof(float));
        return;
    }
    f32_to_bf16_n(dst, src_host, n);
}

static void cpu_download_f32(struct backend *be, float *dst_host, const void *src, enum be_dtype src_type, size_t n)
{
    if (src_type == BE_F32) {
        memcpy(dst_host, src, n * sizeof(float));
        return;
    }
    bf16_to_f32_n(dst_host, src, n);
}

static void cpu_synchronize(struct backend *be)
{
}

/* ---- streaming: everything is synchronous, so waits have nothing to wait for ---- */

static int cpu_register_host(struct backend *be, void *p, size_t bytes, bool read_only)
{
    return 0;
}

static void cpu_unregister_host(struct backend *be, void *p)
{
}

static void cpu_fetch_weights_async(struct backend *be, int slot, void *dst, const uint16_t *src_host, size_t n)
{
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    bf16_to_f32_n(dst, src_host, n);
}

static void cpu_fetch_weights_f32_async(struct backend *be, int slot, void *dst, const float *src_host, size_t n)
{
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    float *out = dst;
    for (size_t i = 0; i < n; i++)
        out[i] = f32_round_bf16(src_host[i]);
}

static void cpu_wait_weights(struct backend *be, int slot)
{
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
}

static void cpu_send_grads_async(struct backend *be, int slot, float *dst_host, const float *src, size_t n)
{
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    memcpy(dst_host, src, n * sizeof(float));
}

static void cpu_send_grads_bf16_async(struct backend *be, int slot, uint16_t *dst_host, const float *src, size_t n)
{
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
    f32_to_bf16_n(dst_host, src, n);
}

static void cpu_wait_grads_device(struct backend *be, int slot)
{
}

/* The CPU backend's "device" memory is host memory: the copy is done when the call returns. */
static void cpu_copy_activations_async(struct backend *be, int slot, bool save, void *dev, void *host, size_t bytes)
{
    SD_ASSERT(slot >= 0 && slot < BE_ACT_SLOTS);
    if (save)
        memcpy(host, dev, bytes);
    else
        memcpy(dev, host, bytes);
}

static void cpu_wait_activations(struct backend *be, int slot)
{
}

static void cpu_wait_grads_host(struct backend *be, int slot)
{
    SD_ASSERT(slot >= 0 && slot < BE_MAX_XFER_SLOTS);
}

/* ---- exchange: windows are in shared host memory, so these are plain copies ---- */

static void cpu_copy_device(struct backend *be, void *dst, const void *src, size_t bytes)
{
    memcpy(dst, src, bytes);
}

static void cpu_add_f32(struct backend *be, float *acc, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        acc[i] += src[i];
}

/* ---- embedding ---- */

static void cpu_embedding_fwd(struct backend *be, void *out_, const int32_t *tokens, const void *wte_, int N, int C)
{
    float *out = out_;
    const float *wte = wte_;
    for (int i = 0; i < N; i++)
        memcpy(out + (size_t)i * C, wte + (size_t)tokens[i] * C, (size_t)C * sizeof(float));
}

static void cpu_embedding_bwd(struct backend *be, float *dwte, const void *dout_, const int32_t *tokens, int N, int C)
{
    const float *dout = dout_;
    for (int i = 0; i < N; i++) {
        float *d = dwte + (size_t)tokens[i] * C;
        const float *g = dout + (size_t)i * C;
        for (int c = 0; c < C; c++)
            d[c] += g[c];
    }
}

/* ---- RMSNorm ---- */

static void cpu_rmsnorm_fwd(struct backend *be, void *out_, float *rstd, const void *inp_, const void *w_, int N,
                            int C, float eps)
{
    float *out = out_;
    const float *inp = inp_, *w = w_;
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float *y = out + (size_t)i * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        rstd[i] = r;
        for (int c = 0; c < C; c++)
            y[c] = (x[c] * r) * w[c];
    }
}

/* y = x*r*w with r = (mean(x^2)+eps)^-1/2 gives
 *   dx_k = r*w_k*dy_k - x_k * r^3/C * sum_j dy_j*w_j*x_j ,  dw_j += dy_j*x_j*r. */
static void cpu_rmsnorm_bwd(struct backend *be, void *dinp_, float *dw, const void *dout_, const void *inp_,
                            const void *w_, const float *rstd, int N, int C, bool accumulate)
{
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *w = w_;
    double *dw_acc = cpu_scratch(be, (size_t)C);
    memset(dw_acc, 0, (size_t)C * sizeof(double));
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float r = rstd[i];
        double dot = 0.0;
        for (int c = 0; c < C; c++)
            dot += (double)dy[c] * w[c] * x[c];
        float coef = (float)(dot * r * r * r / C);
        for (int c = 0; c < C; c++) {
            float g = r * w[c] * dy[c] - x[c] * coef;
            dw_acc[c] += (double)dy[c] * (x[c] * r);
            dx[c] = accumulate ? dx[c] + g : g;
        }
    }
    for (int c = 0; c < C; c++)
        dw[c] += (float)dw_acc[c];
}

/* ---- matmul ---- */

static void cpu_matmul_fwd(struct backend *be, void *out_, const void *inp, const void *w, const void *bias_, int N,
                           int IC, int OC)
{
    float *out = out_;
    const float *bias = bias_;
    if (N == 0 || OC == 0)
        return;
    if (bias)
        for (int i = 0; i < N; i++)
            memcpy(out + (size_t)i * OC, bias, (size_t)OC * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, inp, IC, w, IC, bias ? 1.0f : 0.0f, out,
                OC);
}

static void cpu_matmul_bwd(struct backend *be, void *dinp, float *dw, float *dbias, const void *dout_,
                           const void *inp, const void *w, int N, int IC, int OC, bool accumulate)
{
    const float *dout = dout_;
    if (N == 0 || OC == 0 || IC == 0)
        return;
    if (dinp) /* dinp(N,IC) = dout(N,OC) @ w(OC,IC) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC,
                    accumulate ? 1.0f : 0.0f, dinp, IC);
    /* dw(OC,IC) += dout^T(OC,N) @ inp(N,IC) */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, inp, IC, 1.0f, dw, IC);
    if (dbias) {
        double *sum = cpu_scratch(be, (size_t)OC);
        memset(sum, 0, (size_t)OC * sizeof(double));
        for (int i = 0; i < N; i++)
            for (int o = 0; o < OC; o++)
                sum[o] += dout[(size_t)i * OC + o];
        for (int o = 0; o < OC; o++)
            dbias[o] += (float)sum[o];
    }
}

/* ---- RoPE ---- */

/* Token t of row b's position in its document (backend.h: pos NULL means the row is one document). */
static inline int doc_pos(const int32_t *pos, int b, int T, int t)
{
    return pos ? pos[(size_t)b * T + t] : t;
}

/* Rotates every (j, j+D/2) pair of x(B,T,H,D) by the angle of its position in its document; sign
 * = -1 applies the transpose (inverse) rotation. */
static void rope_rotate(float *x, const float *cos, const float *sin, const int32_t *pos, int B, int T, int H, int D,
                        float sign)
{
    SD_ASSERT(D % 2 == 0);
    int half = D / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            size_t p = (size_t)doc_pos(pos, b, T, t);
            const float *ct = cos + p * half, *st = sin + p * half;
            for (int h = 0; h < H; h++) {
                float *v = x + (((size_t)b * T + t) * H + h) * D;
                for (int j = 0; j < half; j++) {
                    float x1 = v[j], x2 = v[j + half];
                    float c = ct[j], s = sign * st[j];
                    v[j] = x1 * c - x2 * s;
                    v[j + half] = x2 * c + x1 * s;
                }
            }
        }
}

static void cpu_rope_fwd(struct backend *be, void *x, const float *cos, const float *sin, const int32_t *pos, int B,
                         int T, int H, int D)
{
    rope_rotate(x, cos, sin, pos, B, T, H, D, 1.0f);
}

static void cpu_rope_bwd(struct backend *be, void *dx, const float *cos, const float *sin, const int32_t *pos, int B,
                         int T, int H, int D)
{
    rope_rotate(dx, cos, sin, pos, B, T, H, D, -1.0f);
}

/* ---- attention ---- */


static double dot_f32(const float *a, const float *b, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* One query row at a time: its scaled scores against the keys of its document up to t (keys before
 * the document are never visited) live in a (T+D)-double scratch. */
static void cpu_attention_fwd(struct backend *be, void *out_, float *lse, const void *q_, const void *k_,
                              const void *v_, const int32_t *pos, int B, int T, int Hq, int Hkv, int D)
{
    SD_ASSERT(Hkv > 0 && Hq % Hkv == 0);
    float *out = out_;
    const float *q = q_, *k = k_, *v = v_;
    int group = Hq / Hkv;
    double scale = 1.0 / sqrt((double)D);
    double *score = cpu_scratch(be, (size_t)T + (size_t)D), *acc = score + T;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int hk = h / group;
            for (int t = 0; t < T; t++) {
                const float *qt = q + (((size_t)b * T + t) * Hq + h) * D;
                int first = t - doc_pos(pos, b, T, t);
                double mx = -INFINITY;
                for (int s = first; s <= t; s++) {
                    score[s] = scale * dot_f32(qt, k + (((size_t)b * T + s) * Hkv + hk) * D, D);
                    if (score[s] > mx)
                        mx = score[s];
                }
                double sum = 0.0;
                memset(acc, 0, (size_t)D * sizeof(double));
                for (int s = first; s <= t; s++) {
                    double p = exp(score[s] - mx);
                    const float *vs = v + (((size_t)b * T + s) * Hkv + hk) * D;
                    sum += p;
                    for (int d = 0; d < D; d++)
                        acc[d] += p * vs[d];
                }
                float *ot = out + (((size_t)b * T + t) * Hq + h) * D;
                for (int d = 0; d < D; d++)
                    ot[d] = (float)(acc[d] / sum);
                lse[((size_t)b * Hq + h) * T + t] = (float)(mx + log(sum));
            }
        }
}

/* P_ts = exp(scale*q_t.k_s - lse_t), Dt = dout_t.out_t, dS_ts = P_ts*(dout_t.v_s - Dt);
 * dq_t = scale*sum_s dS_ts k_s, dk_s += scale*dS_ts q_t, dv_s += P_ts dout_t. One kv head at a time:
 * its dk and dv (sums over the query heads that share it and over all t) build up in double. */
static void cpu_attention_bwd(struct backend *be, void *dq_, void *dk_, void *dv_, const void *dout_, const void *q_,
                              const void *k_, const void *v_, const void *out_, const float *lse, const int32_t *pos,
                              int B, int T, int Hq, int Hkv, int D)
{
    SD_ASSERT(Hkv > 0 && Hq % Hkv == 0);
    float *dq = dq_, *dk = dk_, *dv = dv_;
    const float *dout = dout_, *q = q_, *k = k_, *v = v_, *out = out_;
    int group = Hq / Hkv;
    double scale = 1.0 / sqrt((double)D);
    size_t td = (size_t)T * D;
    double *acc = cpu_scratch(be, (size_t)D + 2 * td), *dk_acc = acc + D, *dv_acc = dk_acc + td;
    for (int b = 0; b < B; b++)
        for (int hk = 0; hk < Hkv; hk++) {
            memset(dk_acc, 0, 2 * td * sizeof(double));
            for (int h = hk * group; h < (hk + 1) * group; h++)
                for (int t = 0; t < T; t++) {
                    size_t qi = (((size_t)b * T + t) * Hq + h) * D;
                    const float *qt = q + qi, *go = dout + qi;
                    double Dt = dot_f32(go, out + qi, D);
                    double l = lse[((size_t)b * Hq + h) * T + t];
                    memset(acc, 0, (size_t)D * sizeof(double));
                    for (int s = t - doc_pos(pos, b, T, t); s <= t; s++) {
                        size_t ki = (((size_t)b * T + s) * Hkv + hk) * D;
                        const float *ks = k + ki, *vs = v + ki;
                        double p = exp(scale * dot_f32(qt, ks, D) - l);
                        double ds = p * (dot_f32(go, vs, D) - Dt);
                        double *dks = dk_acc + (size_t)s * D, *dvs = dv_acc + (size_t)s * D;
                        for (int d = 0; d < D; d++) {
                            acc[d] += ds * ks[d];
                            dks[d] += ds * qt[d];
                            dvs[d] += p * go[d];
                        }
                    }
                    for (int d = 0; d < D; d++)
                        dq[qi + d] = (float)(scale * acc[d]);
                }
            for (int s = 0; s < T; s++) {
                size_t ki = (((size_t)b * T + s) * Hkv + hk) * D;
                for (int d = 0; d < D; d++) {
                    dk[ki + d] = (float)(scale * dk_acc[(size_t)s * D + d]);
                    dv[ki + d] = (float)dv_acc[(size_t)s * D + d];
                }
            }
        }
}

/* ---- SwiGLU ---- */

static void cpu_swiglu_fwd(struct backend *be, void *out_, const void *gate_, const void *up_, size_t n)
{
    float *out = out_;
    const float *gate = gate_, *up = up_;
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

/* silu'(g) = sig(g) * (1 + g*(1 - sig(g))). Reads each element before writing it, so dgate/dup may
 * alias gate/up. */
static void cpu_swiglu_bwd(struct backend *be, void *dgate_, void *dup_, const void *dout_, const void *gate_,
                           const void *up_, size_t n)
{
    float *dgate = dgate_, *dup = dup_;
    const float *dout = dout_, *gate = gate_, *up = up_;
    for (size_t i = 0; i < n; i++) {
        float g = gate[i], u = up[i], d = dout[i];
        float sig = 1.0f / (1.0f + expf(-g));
        dgate[i] = d * u * sig * (1.0f + g * (1.0f - sig));
        dup[i] = d * g * sig;
    }
}

static void cpu_add_inplace(struct backend *be, void *a_, const void *b_, size_t n)
{
    float *a = a_;
    const float *b = b_;
    for (size_t i = 0; i < n; i++)
        a[i] += b[i];
}

/* ---- cross-entropy ---- */

static void cpu_cross_entropy(struct backend *be, void *logits_, float *loss_rows, int32_t *correct,
                              const int32_t *targets, const float *row_scale, int n, int V)
{
    float *logits = logits_;
    for (int i = 0; i < n; i++) {
        float *x = logits + (size_t)i * V;
        int tgt = targets[i];
        SD_ASSERT(tgt >= 0 && tgt < V);
        float mx = x[0];
        int amax = 0;
        for (int j = 1; j < V; j++)
            if (x[j] > mx) {
                mx = x[j];
                amax = j;
            }
        double sum = 0.0;
        for (int j = 0; j < V; j++)
            sum += exp((double)x[j] - mx);
        double lse = mx + log(sum);
        loss_rows[i] = (float)(lse - x[tgt]);
        if (correct)
            correct[i] = amax == tgt;
        if (row_scale) {
            double scale = row_scale[i];
            for (int j = 0; j < V; j++)
                x[j] = (float)((exp((double)x[j] - lse) - (j == tgt)) * scale);
        }
    }
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memset0 = cpu_memset0,
    .upload = cpu_upload,
    .upload_positions = cpu_upload_positions,
    .download = cpu_download,
    .upload_f32 = cpu_upload_f32,
    .download_f32 = cpu_download_f32,
    .synchronize = cpu_synchronize,
    .register_host = cpu_register_host,
    .unregister_host = cpu_unregister_host,
    .fetch_weights_async = cpu_fetch_weights_async,
    .fetch_weights_f32_async = cpu_fetch_weights_f32_async,
    .wait_weights = cpu_wait_weights,
    .send_grads_async = cpu_send_grads_async,
    .send_grads_bf16_async = cpu_send_grads_bf16_async,
    .wait_grads_host = cpu_wait_grads_host,
    .wait_grads_device = cpu_wait_grads_device,
    .copy_activations_async = cpu_copy_activations_async,
    .wait_activations = cpu_wait_activations,
    .copy_device = cpu_copy_device,
    .add_f32 = cpu_add_f32,
    .embedding_fwd = cpu_embedding_fwd,
    .embedding_bwd = cpu_embedding_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .add_inplace = cpu_add_inplace,
    .cross_entropy = cpu_cross_entropy,
};

int backend_cpu_init(struct backend *be)
{
    struct cpu_ctx *cx = calloc(1, sizeof *cx);
    if (!cx)
        return sd_err("cpu backend: out of memory");
    be->ops = &cpu_ops;
    be->ctx = cx;
    be->act_dtype = BE_F32;
    be->weight_dtype = BE_F32;
    snprintf(be->device_name, sizeof be->device_name, "cpu");
    be->peak_flops = 0;
    be->deterministic = true; /* every op sums in a fixed order */
    return 0;
}

void backend_cpu_free(struct backend *be)
{
    struct cpu_ctx *cx = be->ctx;
    if (cx)
        free(cx->scratch);
    free(cx);
    memset(be, 0, sizeof *be);
}
