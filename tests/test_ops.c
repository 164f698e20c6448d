/* Unit tests of the CPU backend's ops (worker/cpu/backend_cpu.c): every forward against a plain
 * double-precision reference written here, every backward against central finite differences
 * of its forward, on small shapes with odd sizes and every GQA ratio the models use. */
#include "tests/testutil.h"

#include "common/bf16.h"
#include "common/err.h"
#include "worker/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Finite differences: L = sum(out * R) with a fixed random R, so dL/dout = R is the dout fed to
 * the backward. A sampled element passes when |analytic - fd| <= FD_RTOL*|fd| + FD_AFLOOR*F +
 * FD_ATOL, F the largest |fd| among the tensor's samples (fp32 forwards make small gradients
 * noisy; the floor is relative so that a wrong op cannot hide under it). */
#define FD_SAMPLES 20
#define FD_STEP 1e-2
#define FD_RTOL 5e-3
#define FD_AFLOOR 5e-4
#define FD_ATOL 1e-5

static struct backend be;
static uint64_t rng;

static int setup(void **state)
{
    rng = tu_seed("test_ops", 20240917);
    if (backend_cpu_init(&be) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    backend_cpu_free(&be);
    return 0;
}

/* ---- buffers (the CPU backend's device memory is host memory) ---- */

static float *tnew(size_t n)
{
    float *p = be.ops->alloc(&be, n * sizeof(float));
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    return p;
}

static float *trand(size_t n, float lo, float hi)
{
    float *p = tnew(n);
    tu_fill_uniform(p, n, &rng, lo, hi);
    return p;
}

static float *tcopy(const float *src, size_t n)
{
    float *p = tnew(n);
    memcpy(p, src, n * sizeof(float));
    return p;
}

static float *tnan(size_t n)
{
    float *p = tnew(n);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

static void tfree(void *p)
{
    be.ops->free(&be, p);
}

static int32_t *tokens_rand(int n, int V)
{
    int32_t *t = be.ops->alloc(&be, (size_t)n * sizeof(int32_t));
    assert_non_null(t);
    for (int i = 0; i < n; i++)
        t[i] = (int32_t)(tu_uniform(&rng) * V) % V;
    return t;
}

static double sum_prod(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

/* d[i] = a[i] - b[i]: the increment a "+=" output received. */
static float *tdiff(const float *a, const float *b, size_t n)
{
    float *d = tnew(n);
    for (size_t i = 0; i < n; i++)
        d[i] = a[i] - b[i];
    return d;
}

/* ---- checks ---- */

/* Element-wise |got - ref| <= rtol*|ref| + atol, with the worst case printed. */
static void check_close(const char *what, const float *got, const double *ref, size_t n, double rtol, double atol)
{
    double worst = 0.0, worst_ratio = 0.0;
    size_t bad = n;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - ref[i]), tol = rtol * fabs(ref[i]) + atol;
        if (!(err <= tol) && bad == n)
            bad = i;
        if (err > worst)
            worst = err;
        if (tol > 0 && err / tol > worst_ratio)
            worst_ratio = err / tol;
    }
    printf("#   fwd %-28s n=%-5zu worst abs err %.2e (%.2f of tol)\n", what, n, worst, worst_ratio);
    if (bad < n)
        fail_msg("%s: element %zu = %.9g, reference %.9g", what, bad, got[bad], ref[bad]);
}

static void check_close_f(const char *what, const float *got, const float *ref, size_t n, double rtol, double atol)
{
    double *r = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        r[i] = ref[i];
    check_close(what, got, r, n, rtol, atol);
    free(r);
}

/* Recomputes the objective L = sum(out * R) from the op's current inputs. */
typedef double (*objective_fn)(void *ctx);

/* Compares grad (the analytic dL/dx) with central differences of f on a sample of x's elements. */
static void fd_check(const char *what, float *x, size_t n, const float *grad, objective_fn f, void *ctx)
{
    size_t m = n < FD_SAMPLES ? n : FD_SAMPLES;
    size_t idx[FD_SAMPLES];
    double fd[FD_SAMPLES], fmax_ = 0.0;
    for (size_t s = 0; s < m; s++) {
        size_t i = n <= FD_SAMPLES ? s : (size_t)(tu_uniform(&rng) * (float)n) % n;
        float x0 = x[i];
        double h = FD_STEP * fmax(fabs(x0), 1.0);
        float xp = (float)(x0 + h), xm = (float)(x0 - h);
        x[i] = xp;
        double lp = f(ctx);
        x[i] = xm;
        double lm = f(ctx);
        x[i] = x0;
        idx[s] = i;
        fd[s] = (lp - lm) / ((double)xp - (double)xm);
        fmax_ = fmax(fmax_, fabs(fd[s]));
    }
    double worst_abs = 0.0, worst_rel = 0.0, worst_ratio = 0.0;
    for (size_t s = 0; s < m; s++) {
        double an = grad[idx[s]], err = fabs(an - fd[s]);
        double tol = FD_RTOL * fabs(fd[s]) + FD_AFLOOR * fmax_ + FD_ATOL;
        worst_abs = fmax(worst_abs, err);
        if (fabs(fd[s]) > 0.1 * fmax_)
            worst_rel = fmax(worst_rel, err / fabs(fd[s]));
        worst_ratio = fmax(worst_ratio, err / tol);
        if (!(err <= tol))
            fail_msg("%s: element %zu analytic %.7g, finite difference %.7g", what, idx[s], an, fd[s]);
    }
    printf("#   bwd %-28s %2zu samples, max|fd| %.3f, worst abs err %.2e, rel %.2e (%.2f of tol)\n", what, m,
           fmax_, worst_abs, worst_rel, worst_ratio);
}

/* ---- memory and transfers ---- */

static void test_memory(void **state)
{
    assert_int_equal(be.act_dtype, BE_F32);
    assert_int_equal(be.weight_dtype, BE_F32);
    assert_string_equal(be.ops->name, "cpu");

    enum { n = 37 };
    float src[n], back[n];
    uint16_t w16[n];
    for (int i = 0; i < n; i++) {
        src[i] = (tu_uniform(&rng) - 0.5f) * 100.0f;
        w16[i] = f32_to_bf16(src[i]);
    }
    void *p = be.ops->alloc(&be, n * sizeof(float));
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 64, 0);
    assert_int_equal(be.ops->register_host(&be, w16, sizeof w16, true), 0);

    be.ops->fetch_weights_async(&be, 3, p, w16, n);
    be.ops->wait_weights(&be, 3);
    for (int i = 0; i < n; i++)
        assert_true(((float *)p)[i] == bf16_to_f32(w16[i]));

    float grads[n];
    be.ops->send_grads_async(&be, 5, grads, p, n);
    be.ops->wait_grads_host(&be, 5);
    assert_memory_equal(grads, p, sizeof grads);
    be.ops->unregister_host(&be, w16);

    be.ops->upload_f32(&be, p, BE_F32, src, n);
    be.ops->download_f32(&be, back, p, BE_F32, n);
    assert_memory_equal(back, src, sizeof src);
    be.ops->upload_f32(&be, p, BE_BF16, src, n);
    assert_memory_equal(p, w16, sizeof w16);
    be.ops->download_f32(&be, back, p, BE_BF16, n);
    for (int i = 0; i < n; i++)
        assert_true(back[i] == f32_round_bf16(src[i]));

    be.ops->upload(&be, p, src, sizeof src);
    be.ops->download(&be, back, p, sizeof back);
    assert_memory_equal(back, src, sizeof src);
    be.ops->memset0(&be, p, sizeof src);
    be.ops->synchronize(&be);
    for (int i = 0; i < n; i++)
        assert_true(((float *)p)[i] == 0.0f);
    be.ops->free(&be, p);

    p = be.ops->alloc(&be, 0);
    assert_non_null(p);
    be.ops->free(&be, p);
#ifndef __SANITIZE_ADDRESS__ /* ASan aborts on impossible sizes instead of returning NULL */
    assert_null(be.ops->alloc(&be, SIZE_MAX / 2));
    assert_non_null(strstr(sd_errmsg(), "cannot allocate"));
#endif
}

/* ---- embedding ---- */

struct emb_case {
    float *out, *wte, *R;
    int32_t *tok;
    int N, C;
};

static double emb_obj(void *p)
{
    struct emb_case *e = p;
    be.ops->embedding_fwd(&be, e->out, e->tok, e->wte, e->N, e->C);
    return sum_prod(e->out, e->R, (size_t)e->N * e->C);
}

static void test_embedding(void **state)
{
    int N = 7, C = 5, V = 4;
    struct emb_case e = {tnan((size_t)N * C), trand((size_t)V * C, -1, 1), trand((size_t)N * C, -1, 1),
                         tokens_rand(N, V), N, C};
    e.tok[3] = e.tok[0]; /* a repeated token: its gradient rows must add up */
    e.tok[5] = V - 1;
    emb_obj(&e);
    for (int i = 0; i < N; i++)
        assert_memory_equal(e.out + (size_t)i * C, e.wte + (size_t)e.tok[i] * C, (size_t)C * sizeof(float));
    printf("#   fwd embedding: exact\n");

    size_t nw = (size_t)V * C;
    float *dw0 = trand(nw, -1, 1), *dwte = tcopy(dw0, nw);
    be.ops->embedding_bwd(&be, dwte, e.R, e.tok, N, C);
    float *g = tdiff(dwte, dw0, nw);
    fd_check("embedding dwte", e.wte, nw, g, emb_obj, &e);
    tfree(g), tfree(dwte), tfree(dw0), tfree(e.out), tfree(e.wte), tfree(e.R), tfree(e.tok);
}

/* ---- RMSNorm ---- */

struct rms_case {
    float *out, *rstd, *x, *w, *R;
    int N, C;
    float eps;
};

static double rms_obj(void *p)
{
    struct rms_case *r = p;
    be.ops->rmsnorm_fwd(&be, r->out, r->rstd, r->x, r->w, r->N, r->C, r->eps);
    return sum_prod(r->out, r->R, (size_t)r->N * r->C);
}

static void rmsnorm_case(int N, int C)
{
    size_t n = (size_t)N * C;
    struct rms_case r = {tnan(n), tnan((size_t)N), trand(n, -2, 2), trand((size_t)C, 0.5f, 1.5f), trand(n, -1, 1),
                         N, C, 1e-5f};
    printf("# rmsnorm N=%d C=%d\n", N, C);
    rms_obj(&r);
    double *ref = malloc(n * sizeof(double)), *rref = malloc((size_t)N * sizeof(double));
    for (int i = 0; i < N; i++) {
        double ss = 0.0;
        for (int c = 0; c < C; c++)
            ss += (double)r.x[i * C + c] * r.x[i * C + c];
        rref[i] = 1.0 / sqrt(ss / C + r.eps);
        for (int c = 0; c < C; c++)
            ref[i * C + c] = r.x[i * C + c] * rref[i] * r.w[c];
    }
    check_close("rmsnorm out", r.out, ref, n, 1e-6, 1e-7);
    check_close("rmsnorm rstd", r.rstd, rref, (size_t)N, 1e-6, 0);

    /* accumulate = true: both outputs are increments over random initial values */
    float *dx0 = trand(n, -1, 1), *dw0 = trand((size_t)C, -1, 1);
    float *dx = tcopy(dx0, n), *dw = tcopy(dw0, (size_t)C);
    be.ops->rmsnorm_bwd(&be, dx, dw, r.R, r.x, r.w, r.rstd, N, C, true);
    float *gx = tdiff(dx, dx0, n), *gw = tdiff(dw, dw0, (size_t)C);
    fd_check("rmsnorm dinp", r.x, n, gx, rms_obj, &r);
    fd_check("rmsnorm dw", r.w, (size_t)C, gw, rms_obj, &r);

    /* accumulate = false overwrites dinp (NaN before) and still accumulates dw */
    float *dx2 = tnan(n);
    rms_obj(&r);
    be.ops->rmsnorm_bwd(&be, dx2, dw, r.R, r.x, r.w, r.rstd, N, C, false);
    check_close_f("rmsnorm dinp (overwrite)", dx2, gx, n, 1e-5, 1e-6);
    float *gw2 = tdiff(dw, dw0, (size_t)C);
    for (int c = 0; c < C; c++)
        gw[c] *= 2.0f;
    check_close_f("rmsnorm dw (second +=)", gw2, gw, (size_t)C, 1e-5, 1e-6);

    free(ref), free(rref);
    tfree(gw2), tfree(dx2), tfree(gx), tfree(gw), tfree(dx), tfree(dw), tfree(dx0), tfree(dw0);
    tfree(r.out), tfree(r.rstd), tfree(r.x), tfree(r.w), tfree(r.R);
}

static void test_rmsnorm(void **state)
{
    rmsnorm_case(3, 5);
    rmsnorm_case(2, 64);
}

/* ---- matmul ---- */

struct mm_case {
    float *out, *x, *w, *bias, *R;
    int N, IC, OC;
};

static double mm_obj(void *p)
{
    struct mm_case *m = p;
    be.ops->matmul_fwd(&be, m->out, m->x, m->w, m->bias, m->N, m->IC, m->OC);
    return sum_prod(m->out, m->R, (size_t)m->N * m->OC);
}

static void matmul_case(int N, int IC, int OC, bool bias)
{
    size_t nx = (size_t)N * IC, nw = (size_t)OC * IC, no = (size_t)N * OC;
    struct mm_case m = {tnan(no), trand(nx, -1, 1), trand(nw, -1, 1), bias ? trand((size_t)OC, -1, 1) : NULL,
                        trand(no, -1, 1), N, IC, OC};
    printf("# matmul N=%d IC=%d OC=%d bias=%d\n", N, IC, OC, bias);
    mm_obj(&m);
    double *ref = malloc(no * sizeof(double));
    for (int i = 0; i < N; i++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? m.bias[o] : 0.0;
            for (int c = 0; c < IC; c++)
                s += (double)m.x[i * IC + c] * m.w[o * IC + c];
            ref[i * OC + o] = s;
        }
    check_close("matmul out", m.out, ref, no, 1e-5, 1e-6);

    float *dx0 = trand(nx, -1, 1), *dw0 = trand(nw, -1, 1), *db0 = trand((size_t)OC, -1, 1);
    float *dx = tcopy(dx0, nx), *dw = tcopy(dw0, nw), *db = bias ? tcopy(db0, (size_t)OC) : NULL;
    be.ops->matmul_bwd(&be, dx, dw, db, m.R, m.x, m.w, N, IC, OC, true);
    float *gx = tdiff(dx, dx0, nx), *gw = tdiff(dw, dw0, nw);
    fd_check("matmul dinp", m.x, nx, gx, mm_obj, &m);
    fd_check("matmul dw", m.w, nw, gw, mm_obj, &m);
    if (bias) {
        float *gb = tdiff(db, db0, (size_t)OC);
        fd_check("matmul dbias", m.bias, (size_t)OC, gb, mm_obj, &m);
        tfree(gb);
    }

    /* overwrite mode replaces dinp; a NULL dinp skips it; dw keeps accumulating */
    float *dx2 = tnan(nx);
    be.ops->matmul_bwd(&be, dx2, dw, NULL, m.R, m.x, m.w, N, IC, OC, false);
    check_close_f("matmul dinp (overwrite)", dx2, gx, nx, 1e-5, 1e-6);
    be.ops->matmul_bwd(&be, NULL, dw, NULL, m.R, m.x, m.w, N, IC, OC, false);
    float *gw3 = tdiff(dw, dw0, nw);
    for (size_t i = 0; i < nw; i++)
        gw[i] *= 3.0f;
    check_close_f("matmul dw (third +=)", gw3, gw, nw, 1e-5, 1e-5);

    free(ref);
    tfree(gw3), tfree(dx2), tfree(gx), tfree(gw), tfree(dx), tfree(dw), tfree(db), tfree(dx0), tfree(dw0);
    tfree(db0), tfree(m.out), tfree(m.x), tfree(m.w), tfree(m.bias), tfree(m.R);
}

static void test_matmul(void **state)
{
    matmul_case(3, 5, 7, false);
    matmul_case(3, 5, 7, true);
    matmul_case(4, 16, 9, true);
}

/* ---- RoPE ---- */

/* HF tables: inv_freq_j = theta^(-2j/D), angle = t * inv_freq_j, shape (T, D/2). */
static void rope_tables(float *cos_t, float *sin_t, int T, int D)
{
    for (int t = 0; t < T; t++)
        for (int j = 0; j < D / 2; j++) {
            double a = t * pow(10000.0, -2.0 * j / D);
            cos_t[t * (D / 2) + j] = (float)cos(a);
            sin_t[t * (D / 2) + j] = (float)sin(a);
        }
}

struct rope_case {
    float *x, *work, *R, *cos_t, *sin_t;
    const int32_t *pos; /* document positions (B,T), NULL: t */
    int B, T, H, D;
};

static double rope_obj(void *p)
{
    struct rope_case *r = p;
    size_t n = (size_t)r->B * r->T * r->H * r->D;
    memcpy(r->work, r->x, n * sizeof(float));
    be.ops->rope_fwd(&be, r->work, r->cos_t, r->sin_t, r->pos, r->B, r->T, r->H, r->D);
    return sum_prod(r->work, r->R, n);
}

static void rope_case(int B, int T, int H, int D, const int32_t *pos)
{
    size_t n = (size_t)B * T * H * D, nt = (size_t)T * (D / 2);
    struct rope_case r = {trand(n, -1, 1), tnew(n), trand(n, -1, 1), tnew(nt), tnew(nt), pos, B, T, H, D};
    printf("# rope B=%d T=%d H=%d D=%d%s\n", B, T, H, D, pos ? " documents" : "");
    rope_tables(r.cos_t, r.sin_t, T, D);
    rope_obj(&r);
    double *ref = malloc(n * sizeof(double));
    int half = D / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                size_t o = (((size_t)b * T + t) * H + h) * D;
                int p = pos ? pos[(size_t)b * T + t] : t;
                for (int j = 0; j < half; j++) {
                    double c = r.cos_t[p * half + j], s = r.sin_t[p * half + j];
                    double x1 = r.x[o + j], x2 = r.x[o + j + half];
                    ref[o + j] = x1 * c - x2 * s;
                    ref[o + j + half] = x2 * c + x1 * s;
                }
            }
    check_close("rope out", r.work, ref, n, 1e-6, 1e-7);

    /* the backward is the inverse rotation */
    be.ops->rope_bwd(&be, r.work, r.cos_t, r.sin_t, pos, B, T, H, D);
    check_close_f("rope_bwd(rope_fwd(x)) = x", r.work, r.x, n, 0, 1e-6);

    float *g = tcopy(r.R, n);
    be.ops->rope_bwd(&be, g, r.cos_t, r.sin_t, pos, B, T, H, D);
    fd_check("rope dx", r.x, n, g, rope_obj, &r);
    free(ref);
    tfree(g), tfree(r.x), tfree(r.work), tfree(r.R), tfree(r.cos_t), tfree(r.sin_t);
}

static void test_rope(void **state)
{
    rope_case(2, 7, 3, 8, NULL);
    rope_case(1, 5, 2, 6, NULL);
    static const int32_t docs[2 * 7] = {0, 1, 2, 0, 0, 1, 2, 0, 1, 2, 3, 4, 5, 0}; /* documents restart at 0 */
    rope_case(2, 7, 3, 8, docs);
}

/* ---- attention ---- */

struct attn_case {
    float *out, *lse, *q, *k, *v, *R;
    const int32_t *pos; /* document positions (B,T), NULL: each row one document */
    int B, T, Hq, Hkv, D;
};

static double attn_obj(void *p)
{
    struct attn_case *a = p;
    be.ops->attention_fwd(&be, a->out, a->lse, a->q, a->k, a->v, a->pos, a->B, a->T, a->Hq, a->Hkv, a->D);
    return sum_prod(a->out, a->R, (size_t)a->B * a->T * a->Hq * a->D);
}

static void attention_case(int B, int T, int Hq, int Hkv, int D, const int32_t *pos)
{
    size_t nq = (size_t)B * T * Hq * D, nk = (size_t)B * T * Hkv * D, nl = (size_t)B * Hq * T;
    struct attn_case a = {tnan(nq), tnan(nl), trand(nq, -1.5f, 1.5f), trand(nk, -1.5f, 1.5f), trand(nk, -1, 1),
                          trand(nq, -1, 1), pos, B, T, Hq, Hkv, D};
    printf("# attention B=%d T=%d Hq=%d Hkv=%d D=%d%s\n", B, T, Hq, Hkv, D, pos ? " documents" : "");
    attn_obj(&a);

    double *ref = calloc(nq, sizeof(double)), *lref = malloc(nl * sizeof(double)), *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int hk = h / (Hq / Hkv);
            for (int t = 0; t < T; t++) {
                const float *qt = a.q + (((size_t)b * T + t) * Hq + h) * D;
                int first = pos ? t - pos[(size_t)b * T + t] : 0; /* the query's document starts there */
                double sum = 0.0;
                for (int s = first; s <= t; s++) {
                    const float *ks = a.k + (((size_t)b * T + s) * Hkv + hk) * D;
                    p[s] = exp(sum_prod(qt, ks, (size_t)D) / sqrt((double)D));
                    sum += p[s];
                }
                double *o = ref + (((size_t)b * T + t) * Hq + h) * D;
                for (int s = first; s <= t; s++)
                    for (int d = 0; d < D; d++)
                        o[d] += p[s] / sum * a.v[(((size_t)b * T + s) * Hkv + hk) * D + d];
                lref[((size_t)b * Hq + h) * T + t] = log(sum);
            }
        }
    check_close("attention out", a.out, ref, nq, 1e-5, 1e-6);
    check_close("attention lse", a.lse, lref, nl, 1e-6, 1e-6);

    float *dq = tnan(nq), *dk = tnan(nk), *dv = tnan(nk), *out2 = tcopy(a.out, nq);
    be.ops->attention_bwd(&be, dq, dk, dv, a.R, a.q, a.k, a.v, a.out, a.lse, pos, B, T, Hq, Hkv, D);
    fd_check("attention dq", a.q, nq, dq, attn_obj, &a);
    fd_check("attention dk", a.k, nk, dk, attn_obj, &a);
    fd_check("attention dv", a.v, nk, dv, attn_obj, &a);

    /* same inputs, bit-identical outputs (the finite differences left perturbed outputs behind) */
    float *dq2 = tnan(nq), *dk2 = tnan(nk), *dv2 = tnan(nk);
    attn_obj(&a);
    be.ops->attention_bwd(&be, dq2, dk2, dv2, a.R, a.q, a.k, a.v, a.out, a.lse, pos, B, T, Hq, Hkv, D);
    assert_memory_equal(out2, a.out, nq * sizeof(float));
    assert_memory_equal(dq2, dq, nq * sizeof(float));
    assert_memory_equal(dk2, dk, nk * sizeof(float));
    assert_memory_equal(dv2, dv, nk * sizeof(float));

    free(ref), free(lref), free(p);
    tfree(out2), tfree(dq2), tfree(dk2), tfree(dv2), tfree(dq), tfree(dk), tfree(dv);
    tfree(a.out), tfree(a.lse), tfree(a.q), tfree(a.k), tfree(a.v), tfree(a.R);
}

static void test_attention(void **state)
{
    attention_case(2, 7, 4, 4, 8, NULL); /* MHA */
    attention_case(2, 7, 4, 2, 8, NULL); /* GQA 2 */
    attention_case(2, 7, 4, 1, 8, NULL); /* GQA 4 */
    attention_case(2, 7, 8, 1, 6, NULL); /* GQA 8, odd half-dim */
    attention_case(1, 1, 2, 1, 4, NULL); /* a single token attends to itself only */
    /* documents of 3, 1 and 5 tokens; of 1, 1 and 7 (each attends only to itself) */
    static const int32_t docs[2 * 9] = {0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 0, 0, 1, 2, 3, 4, 5, 6};
    attention_case(2, 9, 4, 2, 8, docs);
    attention_case(2, 9, 4, 1, 6, docs);
}

/* ---- SwiGLU ---- */

struct swiglu_case {
    float *out, *gate, *up, *R;
    size_t n;
};

static double swiglu_obj(void *p)
{
    struct swiglu_case *s = p;
    be.ops->swiglu_fwd(&be, s->out, s->gate, s->up, s->n);
    return sum_prod(s->out, s->R, s->n);
}

static void test_swiglu(void **state)
{
    size_t n = 37;
    struct swiglu_case s = {tnan(n), trand(n, -4, 4), trand(n, -2, 2), trand(n, -1, 1), n};
    s.gate[0] = -30.0f; /* silu saturates: exp(30) must not turn into inf/inf */
    s.gate[1] = 30.0f;
    swiglu_obj(&s);
    double *ref = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        ref[i] = s.gate[i] / (1.0 + exp(-(double)s.gate[i])) * s.up[i];
    check_close("swiglu out", s.out, ref, n, 1e-6, 1e-7);

    float *dg = tnan(n), *du = tnan(n);
    be.ops->swiglu_bwd(&be, dg, du, s.R, s.gate, s.up, n);
    fd_check("swiglu dgate", s.gate, n, dg, swiglu_obj, &s);
    fd_check("swiglu dup", s.up, n, du, swiglu_obj, &s);
    free(ref);
    tfree(dg), tfree(du), tfree(s.out), tfree(s.gate), tfree(s.up), tfree(s.R);
}

/* ---- add_inplace ---- */

struct add_case {
    float *a, *b, *work, *R;
    size_t n;
};

static double add_obj(void *p)
{
    struct add_case *c = p;
    memcpy(c->work, c->a, c->n * sizeof(float));
    be.ops->add_inplace(&be, c->work, c->b, c->n);
    return sum_prod(c->work, c->R, c->n);
}

static void test_add_inplace(void **state)
{
    size_t n = 11;
    struct add_case c = {trand(n, -1, 1), trand(n, -1, 1), tnew(n), trand(n, -1, 1), n};
    add_obj(&c);
    double *ref = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        ref[i] = (double)c.a[i] + c.b[i];
    check_close("add_inplace a", c.work, ref, n, 1e-7, 0);
    /* the model's backward of a residual add passes dout to both branches */
    fd_check("add_inplace da", c.a, n, c.R, add_obj, &c);
    fd_check("add_inplace db", c.b, n, c.R, add_obj, &c);
    free(ref);
    tfree(c.a), tfree(c.b), tfree(c.work), tfree(c.R);
}

/* ---- cross-entropy ---- */

struct ce_case {
    float *logits, *loss, *scale;
    int32_t *tgt;
    int n, V;
};

/* L = sum_i loss_i * scale_i; row_scale NULL leaves the logits untouched. */
static double ce_obj(void *p)
{
    struct ce_case *c = p;
    be.ops->cross_entropy(&be, c->logits, c->loss, NULL, c->tgt, NULL, c->n, c->V);
    return sum_prod(c->loss, c->scale, (size_t)c->n);
}

static void test_cross_entropy(void **state)
{
    int n = 6, V = 13;
    size_t nl = (size_t)n * V;
    struct ce_case c = {trand(nl, -3, 3), tnan((size_t)n), tnew((size_t)n), tokens_rand(n, V), n, V};
    const float scales[6] = {0.5f, 0.0f, 0.25f, 1.0f, 0.0f, 0.125f};
    memcpy(c.scale, scales, sizeof scales);
    c.logits[2 * V + 4] = 9.0f; /* row 2: argmax 4 is the target */
    c.tgt[2] = 4;
    c.logits[3 * V + 0] = 9.0f; /* row 3: argmax 0, target elsewhere */
    c.tgt[3] = 7;

    float *orig = tcopy(c.logits, nl);
    int32_t *correct = be.ops->alloc(&be, (size_t)n * sizeof(int32_t));
    memset(correct, 0x55, (size_t)n * sizeof(int32_t));
    be.ops->cross_entropy(&be, c.logits, c.loss, correct, c.tgt, NULL, n, V);
    assert_memory_equal(c.logits, orig, nl * sizeof(float));
    double *ref = malloc(nl * sizeof(double)), lref[6];
    for (int i = 0; i < n; i++) {
        const float *x = orig + (size_t)i * V;
        double sum = 0.0;
        int amax = 0;
        for (int j = 0; j < V; j++) {
            sum += exp((double)x[j]);
            if (x[j] > x[amax])
                amax = j;
        }
        lref[i] = log(sum) - x[c.tgt[i]];
        assert_int_equal(correct[i], amax == c.tgt[i]);
        for (int j = 0; j < V; j++)
            ref[i * V + j] = (exp((double)x[j]) / sum - (j == c.tgt[i])) * scales[i];
    }
    assert_int_equal(correct[2], 1);
    assert_int_equal(correct[3], 0);
    check_close("cross_entropy loss", c.loss, lref, (size_t)n, 1e-6, 1e-7);

    float *dl = tcopy(orig, nl), *loss2 = tnan((size_t)n);
    be.ops->cross_entropy(&be, dl, loss2, NULL, c.tgt, c.scale, n, V);
    assert_memory_equal(loss2, c.loss, (size_t)n * sizeof(float));
    check_close("cross_entropy dlogits", dl, ref, nl, 1e-6, 1e-8);
    for (int j = 0; j < V; j++) /* scale 0: the row's gradient is exactly zero */
        assert_true(dl[1 * V + j] == 0.0f && dl[4 * V + j] == 0.0f);
    fd_check("cross_entropy dlogits", c.logits, nl, dl, ce_obj, &c);

    /* ties: the first maximum wins */
    float tie[2 * 5] = {1, 3, 3, 0, 2, 1, 3, 3, 0, 2};
    int32_t tt[2] = {1, 2}, tc[2] = {-1, -1};
    float tl[2];
    be.ops->cross_entropy(&be, tie, tl, tc, tt, NULL, 2, 5);
    assert_int_equal(tc[0], 1);
    assert_int_equal(tc[1], 0);
    assert_true(tl[0] == tl[1]);

    free(ref);
    tfree(correct), tfree(orig), tfree(dl), tfree(loss2), tfree(c.logits), tfree(c.loss), tfree(c.scale);
    tfree(c.tgt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_memory),    cmocka_unit_test(test_embedding), cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_matmul),    cmocka_unit_test(test_rope),      cmocka_unit_test(test_attention),
        cmocka_unit_test(test_swiglu),    cmocka_unit_test(test_add_inplace),
        cmocka_unit_test(test_cross_entropy),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
