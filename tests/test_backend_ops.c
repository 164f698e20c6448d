/* Op parity across backends, in the manner of ggml's test-backend-ops: every op of
 * worker/backend.h, forward and backward, over a table of shapes, runs on a candidate backend and
 * on the CPU backend from the same random inputs; outputs are compared by normalised error
 * ||a-b||/||b|| with NaN/inf checks, every buffer carries guard sentinels on both sides, and
 * inputs must come back unchanged. The candidate is the CUDA backend when it is built and a GPU
 * is present (it must also repeat itself bit for bit, except the atomics of embedding_bwd, and
 * cases it declares unsupported are skipped by name); a second CPU backend instance always runs
 * too and must match exactly. A new op comes with its cases in this table. */
#include "tests/testutil.h"

#include "common/bf16.h"
#include "common/err.h"
#include "worker/backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GUARD 128 /* elements on each side of every buffer; keeps the interior 256-byte aligned */
#define GUARD_BYTE 0xA5
#define OUT_FILL_I32 0x7fc07fc0 /* int outputs start as this, float outputs as NaN */
#define CUDA_TOL 2e-2           /* normalised error allowed for bf16 compute */
#define MAX_TENSORS 10

enum bo_op {
    OP_EMBEDDING_FWD,
    OP_EMBEDDING_BWD,
    OP_RMSNORM_FWD,
    OP_RMSNORM_BWD,
    OP_MATMUL_FWD,
    OP_MATMUL_BWD,
    OP_ROPE_FWD,
    OP_ROPE_BWD,
    OP_ATTENTION_FWD,
    OP_ATTENTION_BWD,
    OP_SWIGLU_FWD,
    OP_SWIGLU_BWD,
    OP_ADD_INPLACE,
    OP_CROSS_ENTROPY,
    OP_COUNT
};

static const char *const op_names[OP_COUNT] = {
    "embedding_fwd", "embedding_bwd", "rmsnorm_fwd",   "rmsnorm_bwd", "matmul_fwd",  "matmul_bwd",  "rope_fwd",
    "rope_bwd",      "attention_fwd", "attention_bwd", "swiglu_fwd",  "swiglu_bwd", "add_inplace", "cross_entropy",
};

/* One row of the table; fields an op does not use stay 0. */
struct bo_case {
    enum bo_op op;
    int N, C, V;            /* rows, channels, vocab (embedding, rmsnorm, cross-entropy); N = n elsewhere */
    int IC, OC;             /* matmul */
    int B, T, H, Hkv, D;    /* rope (H heads), attention (H query heads) */
    bool bias;              /* matmul: with bias / dbias */
    bool accumulate;        /* rmsnorm_bwd, matmul_bwd */
    bool no_dinp;           /* matmul_bwd with dinp = NULL */
    bool row_scale;         /* cross_entropy computes the gradient in place */
    int max_doc;            /* rope, attention: rows are runs of documents of 1..max_doc tokens (0: one) */
};

static const struct bo_case cases[] = {
    {OP_EMBEDDING_FWD, .N = 7, .C = 33, .V = 50},
    {OP_EMBEDDING_FWD, .N = 64, .C = 256, .V = 1000},
    {OP_EMBEDDING_BWD, .N = 7, .C = 33, .V = 5}, /* few rows: repeated tokens collide */
    {OP_EMBEDDING_BWD, .N = 300, .C = 128, .V = 17},
    {OP_EMBEDDING_BWD, .N = 64, .C = 2048, .V = 40},

    {OP_RMSNORM_FWD, .N = 3, .C = 5},
    {OP_RMSNORM_FWD, .N = 17, .C = 96},
    {OP_RMSNORM_FWD, .N = 64, .C = 1024},
    {OP_RMSNORM_FWD, .N = 4096, .C = 128}, /* per-head q/k norm rows */
    {OP_RMSNORM_BWD, .N = 3, .C = 5},
    {OP_RMSNORM_BWD, .N = 17, .C = 96, .accumulate = true},
    {OP_RMSNORM_BWD, .N = 64, .C = 1024},
    {OP_RMSNORM_BWD, .N = 64, .C = 1024, .accumulate = true},
    {OP_RMSNORM_BWD, .N = 4096, .C = 128},
    {OP_RMSNORM_BWD, .N = 33, .C = 2050, .accumulate = true},

    {OP_MATMUL_FWD, .N = 3, .IC = 5, .OC = 7},
    {OP_MATMUL_FWD, .N = 17, .IC = 64, .OC = 33, .bias = true},
    {OP_MATMUL_FWD, .N = 128, .IC = 256, .OC = 96},
    {OP_MATMUL_FWD, .N = 300, .IC = 128, .OC = 384, .bias = true},
    {OP_MATMUL_FWD, .N = 1000, .IC = 512, .OC = 1536},
    {OP_MATMUL_BWD, .N = 3, .IC = 5, .OC = 7},
    {OP_MATMUL_BWD, .N = 17, .IC = 64, .OC = 33, .bias = true, .accumulate = true},
    {OP_MATMUL_BWD, .N = 128, .IC = 256, .OC = 96, .no_dinp = true},
    {OP_MATMUL_BWD, .N = 300, .IC = 128, .OC = 384, .bias = true},
    {OP_MATMUL_BWD, .N = 257, .IC = 96, .OC = 160, .bias = true, .accumulate = true},
    {OP_MATMUL_BWD, .N = 1000, .IC = 512, .OC = 1536},

    {OP_ROPE_FWD, .B = 2, .T = 7, .H = 3, .D = 8},
    {OP_ROPE_FWD, .B = 1, .T = 300, .H = 4, .D = 64},
    {OP_ROPE_FWD, .B = 2, .T = 33, .H = 2, .D = 128},
    {OP_ROPE_FWD, .B = 1, .T = 5, .H = 3, .D = 12},
    {OP_ROPE_BWD, .B = 2, .T = 7, .H = 3, .D = 8},
    {OP_ROPE_BWD, .B = 1, .T = 300, .H = 4, .D = 64},
    {OP_ROPE_BWD, .B = 2, .T = 33, .H = 2, .D = 128},
    {OP_ROPE_BWD, .B = 1, .T = 5, .H = 3, .D = 12},
    {OP_ROPE_FWD, .B = 2, .T = 300, .H = 4, .D = 64, .max_doc = 50},
    {OP_ROPE_BWD, .B = 2, .T = 300, .H = 4, .D = 64, .max_doc = 50},

    {OP_ATTENTION_FWD, .B = 2, .T = 7, .H = 4, .Hkv = 4, .D = 8},
    {OP_ATTENTION_FWD, .B = 2, .T = 7, .H = 4, .Hkv = 2, .D = 8},
    {OP_ATTENTION_FWD, .B = 2, .T = 7, .H = 4, .Hkv = 1, .D = 8},
    {OP_ATTENTION_FWD, .B = 1, .T = 19, .H = 8, .Hkv = 1, .D = 16},
    {OP_ATTENTION_FWD, .B = 1, .T = 300, .H = 8, .Hkv = 2, .D = 64},
    {OP_ATTENTION_FWD, .B = 2, .T = 65, .H = 4, .Hkv = 1, .D = 128},
    {OP_ATTENTION_FWD, .B = 2, .T = 100, .H = 6, .Hkv = 3, .D = 32},
    {OP_ATTENTION_FWD, .B = 1, .T = 130, .H = 4, .Hkv = 4, .D = 128},
    {OP_ATTENTION_FWD, .B = 1, .T = 200, .H = 8, .Hkv = 8, .D = 64},
    {OP_ATTENTION_FWD, .B = 1, .T = 2048, .H = 2, .Hkv = 1, .D = 128},
    {OP_ATTENTION_FWD, .B = 1, .T = 19, .H = 8, .Hkv = 1, .D = 16, .max_doc = 5},
    {OP_ATTENTION_FWD, .B = 2, .T = 300, .H = 8, .Hkv = 2, .D = 64, .max_doc = 40},
    {OP_ATTENTION_FWD, .B = 1, .T = 130, .H = 4, .Hkv = 4, .D = 128, .max_doc = 1},
    {OP_ATTENTION_FWD, .B = 2, .T = 1000, .H = 6, .Hkv = 3, .D = 32, .max_doc = 150},
    {OP_ATTENTION_FWD, .B = 1, .T = 2048, .H = 2, .Hkv = 1, .D = 128, .max_doc = 700},
    {OP_ATTENTION_BWD, .B = 2, .T = 7, .H = 4, .Hkv = 4, .D = 8},
    {OP_ATTENTION_BWD, .B = 2, .T = 7, .H = 4, .Hkv = 2, .D = 8},
    {OP_ATTENTION_BWD, .B = 2, .T = 7, .H = 4, .Hkv = 1, .D = 8},
    {OP_ATTENTION_BWD, .B = 1, .T = 19, .H = 8, .Hkv = 1, .D = 16},
    {OP_ATTENTION_BWD, .B = 1, .T = 300, .H = 8, .Hkv = 2, .D = 64},
    {OP_ATTENTION_BWD, .B = 2, .T = 65, .H = 4, .Hkv = 1, .D = 128},
    {OP_ATTENTION_BWD, .B = 2, .T = 100, .H = 6, .Hkv = 3, .D = 32},
    {OP_ATTENTION_BWD, .B = 1, .T = 130, .H = 4, .Hkv = 4, .D = 128},
    {OP_ATTENTION_BWD, .B = 1, .T = 200, .H = 8, .Hkv = 8, .D = 64},
    {OP_ATTENTION_BWD, .B = 1, .T = 2048, .H = 2, .Hkv = 1, .D = 128},
    {OP_ATTENTION_BWD, .B = 1, .T = 19, .H = 8, .Hkv = 1, .D = 16, .max_doc = 5},
    {OP_ATTENTION_BWD, .B = 2, .T = 300, .H = 8, .Hkv = 2, .D = 64, .max_doc = 40},
    {OP_ATTENTION_BWD, .B = 1, .T = 130, .H = 4, .Hkv = 4, .D = 128, .max_doc = 1},
    {OP_ATTENTION_BWD, .B = 2, .T = 1000, .H = 6, .Hkv = 3, .D = 32, .max_doc = 150},
    {OP_ATTENTION_BWD, .B = 1, .T = 2048, .H = 2, .Hkv = 1, .D = 128, .max_doc = 700},

    {OP_SWIGLU_FWD, .N = 1},
    {OP_SWIGLU_FWD, .N = 7},
    {OP_SWIGLU_FWD, .N = 4099},
    {OP_SWIGLU_FWD, .N = 65536},
    {OP_SWIGLU_BWD, .N = 1},
    {OP_SWIGLU_BWD, .N = 7},
    {OP_SWIGLU_BWD, .N = 4099},
    {OP_SWIGLU_BWD, .N = 65536},

    {OP_ADD_INPLACE, .N = 5},
    {OP_ADD_INPLACE, .N = 4097},
    {OP_ADD_INPLACE, .N = 65536},

    {OP_CROSS_ENTROPY, .N = 3, .V = 11},
    {OP_CROSS_ENTROPY, .N = 7, .V = 1000, .row_scale = true},
    {OP_CROSS_ENTROPY, .N = 4, .V = 32003, .row_scale = true},
    {OP_CROSS_ENTROPY, .N = 3, .V = 151936, .row_scale = true},
};

#define NCASES (int)(sizeof cases / sizeof cases[0])

/* ---- tensors of a case ---- */

enum bo_kind { K_ACT, K_WEIGHT, K_F32, K_I32 };
enum bo_role {
    R_IN,    /* read only: must come back unchanged */
    R_OUT,   /* overwritten: starts as NaN (or OUT_FILL_I32) so unwritten elements show */
    R_ACC,   /* accumulated into: starts from random values */
    R_INOUT, /* updated in place */
};

struct bo_tensor {
    const char *name;
    enum bo_kind kind;
    enum bo_role role;
    size_t n;       /* 0: the op gets NULL */
    float *val;     /* initial values (float kinds) */
    int32_t *ival;  /* initial values (K_I32) */
};

/* The tensors of a case, in the order case_run passes them to the op. */
struct bo_setup {
    struct bo_tensor t[MAX_TENSORS];
    int nt;
    uint64_t rng;
};

/* Adds a tensor filled with uniform values in [lo, hi). Activations and weights are rounded to
 * bf16 so that a bf16 backend receives exactly what the CPU backend does. */
static float *add_tensor(struct bo_setup *s, const char *name, enum bo_kind kind, enum bo_role role, size_t n,
                         float lo, float hi)
{
    SD_ASSERT(s->nt < MAX_TENSORS);
    struct bo_tensor *t = &s->t[s->nt++];
    *t = (struct bo_tensor){name, kind, role, n, NULL, NULL};
    if (n == 0 || role == R_OUT)
        return NULL;
    t->val = malloc(n * sizeof(float));
    tu_fill_uniform(t->val, n, &s->rng, lo, hi);
    if (kind == K_ACT || kind == K_WEIGHT)
        for (size_t i = 0; i < n; i++)
            t->val[i] = f32_round_bf16(t->val[i]);
    return t->val;
}

static int32_t *add_ints(struct bo_setup *s, const char *name, enum bo_role role, size_t n, int V)
{
    SD_ASSERT(s->nt < MAX_TENSORS);
    struct bo_tensor *t = &s->t[s->nt++];
    *t = (struct bo_tensor){name, K_I32, role, n, NULL, NULL};
    if (role == R_OUT)
        return NULL;
    t->ival = malloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++)
        t->ival[i] = (int32_t)(tu_uniform(&s->rng) * V) % V;
    return t->ival;
}

/* Adds the document positions (backend.h) of a case with documents, else a NULL tensor: each row
 * a run of documents of 1..max_doc tokens, its second document a single token. */
static int32_t *add_positions(struct bo_setup *s, const struct bo_case *c)
{
    if (!c->max_doc) {
        add_ints(s, "pos", R_IN, 0, 1);
        return NULL;
    }
    int32_t *pos = add_ints(s, "pos", R_IN, (size_t)c->B * c->T, 1);
    for (int b = 0; b < c->B; b++)
        for (int t = 0, doc = 0, left = 0; t < c->T; t++, left--) {
            int32_t *p = pos + (size_t)b * c->T + t;
            if (left == 0) {
                left = doc++ == 1 ? 1 : 1 + (int)(tu_uniform(&s->rng) * (float)c->max_doc) % c->max_doc;
                *p = 0;
            } else {
                *p = p[-1] + 1;
            }
        }
    return pos;
}

static void setup_free(struct bo_setup *s)
{
    for (int i = 0; i < s->nt; i++) {
        free(s->t[i].val);
        free(s->t[i].ival);
    }
}

/* out and lse of attention on the reference backend, for the backward's inputs. */
static void ref_attention_fwd(struct backend *ref, const struct bo_case *c, const float *q, const float *k,
                              const float *v, const int32_t *pos, float *out, float *lse)
{
    size_t nq = (size_t)c->B * c->T * c->H * c->D, nk = (size_t)c->B * c->T * c->Hkv * c->D;
    size_t nl = (size_t)c->B * c->H * c->T, es = be_dtype_size(ref->act_dtype);
    void *dq = ref->ops->alloc(ref, nq * es), *dk = ref->ops->alloc(ref, nk * es), *dv = ref->ops->alloc(ref, nk * es);
    void *dout = ref->ops->alloc(ref, nq * es);
    float *dlse = ref->ops->alloc(ref, nl * sizeof(float));
    assert_true(dq && dk && dv && dout && dlse);
    ref->ops->upload_f32(ref, dq, ref->act_dtype, q, nq);
    ref->ops->upload_f32(ref, dk, ref->act_dtype, k, nk);
    ref->ops->upload_f32(ref, dv, ref->act_dtype, v, nk);
    int32_t *dpos = pos ? ref->ops->alloc(ref, (size_t)c->B * c->T * sizeof(int32_t)) : NULL;
    if (pos)
        ref->ops->upload_positions(ref, dpos, pos, c->B, c->T);
    ref->ops->attention_fwd(ref, dout, dlse, dq, dk, dv, dpos, c->B, c->T, c->H, c->Hkv, c->D);
    ref->ops->download_f32(ref, out, dout, ref->act_dtype, nq);
    ref->ops->download_f32(ref, lse, dlse, BE_F32, nl);
    ref->ops->free(ref, dq), ref->ops->free(ref, dk), ref->ops->free(ref, dv), ref->ops->free(ref, dout);
    ref->ops->free(ref, dlse);
    if (dpos)
        ref->ops->free(ref, dpos);
}

/* Builds the tensors of case c from a seed; ref computes inputs that must be consistent with others
 * (attention's out and lse). */
static void case_setup(struct bo_setup *s, const struct bo_case *c, uint64_t seed, struct backend *ref)
{
    memset(s, 0, sizeof *s);
    s->rng = seed;
    size_t N = (size_t)c->N;
    switch (c->op) {
    case OP_EMBEDDING_FWD:
        add_tensor(s, "out", K_ACT, R_OUT, N * c->C, 0, 0);
        add_ints(s, "tokens", R_IN, N, c->V);
        add_tensor(s, "wte", K_WEIGHT, R_IN, (size_t)c->V * c->C, -1, 1);
        break;
    case OP_EMBEDDING_BWD:
        add_tensor(s, "dwte", K_F32, R_ACC, (size_t)c->V * c->C, -1, 1);
        add_tensor(s, "dout", K_ACT, R_IN, N * c->C, -1, 1);
        add_ints(s, "tokens", R_IN, N, c->V);
        break;
    case OP_RMSNORM_FWD:
        add_tensor(s, "out", K_ACT, R_OUT, N * c->C, 0, 0);
        add_tensor(s, "rstd", K_F32, R_OUT, N, 0, 0);
        add_tensor(s, "inp", K_ACT, R_IN, N * c->C, -2, 2);
        add_tensor(s, "w", K_WEIGHT, R_IN, (size_t)c->C, 0.5f, 1.5f);
        break;
    case OP_RMSNORM_BWD: {
        add_tensor(s, "dinp", K_ACT, c->accumulate ? R_ACC : R_OUT, N * c->C, -1, 1);
        add_tensor(s, "dw", K_F32, R_ACC, (size_t)c->C, -1, 1);
        add_tensor(s, "dout", K_ACT, R_IN, N * c->C, -1, 1);
        const float *x = add_tensor(s, "inp", K_ACT, R_IN, N * c->C, -2, 2);
        add_tensor(s, "w", K_WEIGHT, R_IN, (size_t)c->C, 0.5f, 1.5f);
        float *rstd = add_tensor(s, "rstd", K_F32, R_IN, N, 0, 0);
        for (size_t i = 0; i < N; i++) {
            double ss = 0.0;
            for (int j = 0; j < c->C; j++)
                ss += (double)x[i * c->C + j] * x[i * c->C + j];
            rstd[i] = (float)(1.0 / sqrt(ss / c->C + 1e-6));
        }
        break;
    }
    case OP_MATMUL_FWD:
        add_tensor(s, "out", K_ACT, R_OUT, N * c->OC, 0, 0);
        add_tensor(s, "inp", K_ACT, R_IN, N * c->IC, -1, 1);
        add_tensor(s, "w", K_WEIGHT, R_IN, (size_t)c->OC * c->IC, -1, 1);
        add_tensor(s, "bias", K_WEIGHT, R_IN, c->bias ? (size_t)c->OC : 0, -1, 1);
        break;
    case OP_MATMUL_BWD:
        add_tensor(s, "dinp", K_ACT, c->accumulate ? R_ACC : R_OUT, c->no_dinp ? 0 : N * c->IC, -1, 1);
        add_tensor(s, "dw", K_F32, R_ACC, (size_t)c->OC * c->IC, -1, 1);
        add_tensor(s, "dbias", K_F32, R_ACC, c->bias ? (size_t)c->OC : 0, -1, 1);
        add_tensor(s, "dout", K_ACT, R_IN, N * c->OC, -1, 1);
        add_tensor(s, "inp", K_ACT, R_IN, N * c->IC, -1, 1);
        add_tensor(s, "w", K_WEIGHT, R_IN, (size_t)c->OC * c->IC, -1, 1);
        break;
    case OP_ROPE_FWD:
    case OP_ROPE_BWD: {
        int half = c->D / 2;
        add_tensor(s, "x", K_ACT, R_INOUT, (size_t)c->B * c->T * c->H * c->D, -1, 1);
        float *cs = add_tensor(s, "cos", K_F32, R_IN, (size_t)c->T * half, 0, 0);
        float *sn = add_tensor(s, "sin", K_F32, R_IN, (size_t)c->T * half, 0, 0);
        for (int t = 0; t < c->T; t++)
            for (int j = 0; j < half; j++) {
                double a = t * pow(1e6, -2.0 * j / c->D);
                cs[t * half + j] = (float)cos(a);
                sn[t * half + j] = (float)sin(a);
            }
        add_positions(s, c);
        break;
    }
    case OP_ATTENTION_FWD: {
        size_t nq = (size_t)c->B * c->T * c->H * c->D, nk = (size_t)c->B * c->T * c->Hkv * c->D;
        add_tensor(s, "out", K_ACT, R_OUT, nq, 0, 0);
        add_tensor(s, "lse", K_F32, R_OUT, (size_t)c->B * c->H * c->T, 0, 0);
        add_tensor(s, "q", K_ACT, R_IN, nq, -2, 2);
        add_tensor(s, "k", K_ACT, R_IN, nk, -2, 2);
        add_tensor(s, "v", K_ACT, R_IN, nk, -1, 1);
        add_positions(s, c);
        break;
    }
    case OP_ATTENTION_BWD: {
        size_t nq = (size_t)c->B * c->T * c->H * c->D, nk = (size_t)c->B * c->T * c->Hkv * c->D;
        add_tensor(s, "dq", K_ACT, R_OUT, nq, 0, 0);
        add_tensor(s, "dk", K_ACT, R_OUT, nk, 0, 0);
        add_tensor(s, "dv", K_ACT, R_OUT, nk, 0, 0);
        add_tensor(s, "dout", K_ACT, R_IN, nq, -1, 1);
        const float *q = add_tensor(s, "q", K_ACT, R_IN, nq, -2, 2);
        const float *k = add_tensor(s, "k", K_ACT, R_IN, nk, -2, 2);
        const float *v = add_tensor(s, "v", K_ACT, R_IN, nk, -1, 1);
        float *out = add_tensor(s, "out", K_ACT, R_IN, nq, 0, 0);
        float *lse = add_tensor(s, "lse", K_F32, R_IN, (size_t)c->B * c->H * c->T, 0, 0);
        ref_attention_fwd(ref, c, q, k, v, add_positions(s, c), out, lse);
        for (size_t i = 0; i < nq; i++)
            out[i] = f32_round_bf16(out[i]);
        break;
    }
    case OP_SWIGLU_FWD:
        add_tensor(s, "out", K_ACT, R_OUT, N, 0, 0);
        add_tensor(s, "gate", K_ACT, R_IN, N, -6, 6);
        add_tensor(s, "up", K_ACT, R_IN, N, -2, 2);
        break;
    case OP_SWIGLU_BWD:
        add_tensor(s, "dgate", K_ACT, R_OUT, N, 0, 0);
        add_tensor(s, "dup", K_ACT, R_OUT, N, 0, 0);
        add_tensor(s, "dout", K_ACT, R_IN, N, -1, 1);
        add_tensor(s, "gate", K_ACT, R_IN, N, -6, 6);
        add_tensor(s, "up", K_ACT, R_IN, N, -2, 2);
        break;
    case OP_ADD_INPLACE:
        add_tensor(s, "a", K_ACT, R_INOUT, N, -1, 1);
        add_tensor(s, "b", K_ACT, R_IN, N, -1, 1);
        break;
    case OP_CROSS_ENTROPY: {
        add_tensor(s, "logits", K_ACT, R_INOUT, N * c->V, -4, 4);
        add_tensor(s, "loss_rows", K_F32, R_OUT, N, 0, 0);
        add_ints(s, "correct", R_OUT, N, 0);
        int32_t *tgt = add_ints(s, "targets", R_IN, N, c->V);
        float *scale = add_tensor(s, "row_scale", K_F32, R_IN, c->row_scale ? N : 0, 0, 1);
        if (scale) /* a loss mask: every third row masked out */
            for (size_t i = 0; i < N; i++)
                scale[i] = i % 3 == 1 ? 0.0f : 1.0f / (float)N;
        /* Row 0's target is its first maximum (correct = 1); row 1's is its last maximum, which
         * with bf16 logits and a large vocab is usually a tie that the first maximum wins. */
        const float *lg = s->t[0].val;
        int first = 0, last = 0;
        for (int j = 1; j < c->V; j++)
            first = lg[j] > lg[first] ? j : first;
        tgt[0] = first;
        for (int j = 1; j < c->V; j++)
            last = lg[c->V + j] >= lg[c->V + last] ? j : last;
        tgt[1] = last;
        break;
    }
    case OP_COUNT:
        SD_ASSERT(0);
    }
}

/* Runs the op of case c with the device pointers p, in the order case_setup added the tensors. */
static void case_run(struct backend *be, const struct bo_case *c, void **p)
{
    const struct backend_ops *o = be->ops;
    switch (c->op) {
    case OP_EMBEDDING_FWD:
        o->embedding_fwd(be, p[0], p[1], p[2], c->N, c->C);
        break;
    case OP_EMBEDDING_BWD:
        o->embedding_bwd(be, p[0], p[1], p[2], c->N, c->C);
        break;
    case OP_RMSNORM_FWD:
        o->rmsnorm_fwd(be, p[0], p[1], p[2], p[3], c->N, c->C, 1e-6f);
        break;
    case OP_RMSNORM_BWD:
        o->rmsnorm_bwd(be, p[0], p[1], p[2], p[3], p[4], p[5], c->N, c->C, c->accumulate);
        break;
    case OP_MATMUL_FWD:
        o->matmul_fwd(be, p[0], p[1], p[2], p[3], c->N, c->IC, c->OC);
        break;
    case OP_MATMUL_BWD:
        o->matmul_bwd(be, p[0], p[1], p[2], p[3], p[4], p[5], c->N, c->IC, c->OC, c->accumulate);
        break;
    case OP_ROPE_FWD:
        o->rope_fwd(be, p[0], p[1], p[2], p[3], c->B, c->T, c->H, c->D);
        break;
    case OP_ROPE_BWD:
        o->rope_bwd(be, p[0], p[1], p[2], p[3], c->B, c->T, c->H, c->D);
        break;
    case OP_ATTENTION_FWD:
        o->attention_fwd(be, p[0], p[1], p[2], p[3], p[4], p[5], c->B, c->T, c->H, c->Hkv, c->D);
        break;
    case OP_ATTENTION_BWD:
        o->attention_bwd(be, p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], c->B, c->T, c->H, c->Hkv,
                         c->D);
        break;
    case OP_SWIGLU_FWD:
        o->swiglu_fwd(be, p[0], p[1], p[2], (size_t)c->N);
        break;
    case OP_SWIGLU_BWD:
        o->swiglu_bwd(be, p[0], p[1], p[2], p[3], p[4], (size_t)c->N);
        break;
    case OP_ADD_INPLACE:
        o->add_inplace(be, p[0], p[1], (size_t)c->N);
        break;
    case OP_CROSS_ENTROPY:
        o->cross_entropy(be, p[0], p[1], p[2], p[3], p[4], c->N, c->V);
        break;
    case OP_COUNT:
        SD_ASSERT(0);
    }
}

static void case_name(const struct bo_case *c, char *buf, size_t len)
{
    const char *f = op_names[c->op];
    switch (c->op) {
    case OP_MATMUL_FWD:
    case OP_MATMUL_BWD:
        snprintf(buf, len, "%s N=%d IC=%d OC=%d%s%s%s", f, c->N, c->IC, c->OC, c->bias ? " bias" : "",
                 c->accumulate ? " acc" : "", c->no_dinp ? " no-dinp" : "");
        break;
    case OP_ROPE_FWD:
    case OP_ROPE_BWD:
        snprintf(buf, len, "%s B=%d T=%d H=%d D=%d", f, c->B, c->T, c->H, c->D);
        break;
    case OP_ATTENTION_FWD:
    case OP_ATTENTION_BWD:
        snprintf(buf, len, "%s B=%d T=%d Hq=%d Hkv=%d D=%d", f, c->B, c->T, c->H, c->Hkv, c->D);
        break;
    case OP_SWIGLU_FWD:
    case OP_SWIGLU_BWD:
    case OP_ADD_INPLACE:
        snprintf(buf, len, "%s n=%d", f, c->N);
        break;
    case OP_EMBEDDING_FWD:
    case OP_EMBEDDING_BWD:
        snprintf(buf, len, "%s N=%d C=%d V=%d", f, c->N, c->C, c->V);
        break;
    case OP_RMSNORM_FWD:
    case OP_RMSNORM_BWD:
        snprintf(buf, len, "%s N=%d C=%d%s", f, c->N, c->C, c->accumulate ? " acc" : "");
        break;
    case OP_CROSS_ENTROPY:
        snprintf(buf, len, "%s N=%d V=%d%s", f, c->N, c->V, c->row_scale ? " row_scale" : "");
        break;
    case OP_COUNT:
        SD_ASSERT(0);
    }
}

/* ---- running a case on one backend ---- */

static enum be_dtype kind_dtype(const struct backend *be, enum bo_kind k)
{
    return k == K_ACT ? be->act_dtype : k == K_WEIGHT ? be->weight_dtype : BE_F32;
}

static size_t kind_size(const struct backend *be, enum bo_kind k)
{
    return k == K_I32 ? sizeof(int32_t) : be_dtype_size(kind_dtype(be, k));
}

/* Document positions go through upload_positions, as the model uploads them (the CUDA backend
 * then runs cuDNN's document attention where it can). */
static void upload_values(struct backend *be, const struct bo_case *c, const struct bo_tensor *t, void *p,
                          const float *val, const int32_t *ival)
{
    if (t->kind == K_I32 && t->role == R_IN && strcmp(t->name, "pos") == 0)
        be->ops->upload_positions(be, p, ival, c->B, c->T);
    else if (t->kind == K_I32)
        be->ops->upload(be, p, ival, t->n * sizeof(int32_t));
    else
        be->ops->upload_f32(be, p, kind_dtype(be, t->kind), val, t->n);
}

/* Values of a tensor as fp32 (ints converted). */
static float *download_values(struct backend *be, const struct bo_tensor *t, const void *p)
{
    float *v = malloc(t->n * sizeof(float));
    if (t->kind != K_I32) {
        be->ops->download_f32(be, v, p, kind_dtype(be, t->kind), t->n);
        return v;
    }
    int32_t *iv = malloc(t->n * sizeof(int32_t));
    be->ops->download(be, iv, p, t->n * sizeof(int32_t));
    for (size_t i = 0; i < t->n; i++)
        v[i] = (float)iv[i];
    free(iv);
    return v;
}

/* Number of bytes in [p, p+len) of device memory that differ from GUARD_BYTE. */
static size_t guard_damage(struct backend *be, const uint8_t *p, size_t len)
{
    uint8_t *h = malloc(len);
    be->ops->download(be, h, p, len);
    size_t bad = 0;
    for (size_t i = 0; i < len; i++)
        bad += h[i] != GUARD_BYTE;
    free(h);
    return bad;
}

/* Runs case c on be from the tensors of s and returns each output's values in out[i] (NULL for
 * inputs and absent tensors). Returns the number of problems found on the way: damaged guards,
 * modified inputs (each printed). */
static int case_execute(struct backend *be, const struct bo_case *c, const struct bo_setup *s, float **out,
                        const char *label)
{
    uint8_t *base[MAX_TENSORS] = {0};
    void *ptr[MAX_TENSORS] = {0};
    int problems = 0;
    for (int i = 0; i < s->nt; i++) {
        const struct bo_tensor *t = &s->t[i];
        out[i] = NULL;
        if (t->n == 0)
            continue;
        size_t es = kind_size(be, t->kind), bytes = (t->n + 2 * GUARD) * es;
        base[i] = be->ops->alloc(be, bytes);
        if (!base[i])
            fail_msg("%s: alloc %zu bytes: %s", be->ops->name, bytes, sd_errmsg());
        uint8_t *pattern = malloc(bytes);
        memset(pattern, GUARD_BYTE, bytes);
        be->ops->upload(be, base[i], pattern, bytes);
        free(pattern);
        ptr[i] = base[i] + GUARD * es;
        if (t->role != R_OUT) {
            upload_values(be, c, t, ptr[i], t->val, t->ival);
        } else if (t->kind == K_I32) {
            int32_t *fill = malloc(t->n * sizeof(int32_t));
            for (size_t j = 0; j < t->n; j++)
                fill[j] = OUT_FILL_I32;
            upload_values(be, c, t, ptr[i], NULL, fill);
            free(fill);
        } else {
            float *fill = malloc(t->n * sizeof(float));
            for (size_t j = 0; j < t->n; j++)
                fill[j] = NAN;
            upload_values(be, c, t, ptr[i], fill, NULL);
            free(fill);
        }
    }

    case_run(be, c, ptr);
    be->ops->synchronize(be);

    for (int i = 0; i < s->nt; i++) {
        const struct bo_tensor *t = &s->t[i];
        if (t->n == 0)
            continue;
        size_t es = kind_size(be, t->kind);
        size_t bad = guard_damage(be, base[i], GUARD * es) + guard_damage(be, base[i] + (GUARD + t->n) * es,
                                                                            GUARD * es);
        if (bad) {
            printf("#   %s on %s: %zu guard bytes around %s overwritten\n", label, be->ops->name, bad, t->name);
            problems++;
        }
        float *v = download_values(be, t, ptr[i]);
        if (t->role != R_IN) {
            out[i] = v;
            continue;
        }
        size_t changed = 0;
        for (size_t j = 0; j < t->n; j++)
            changed += t->kind == K_I32 ? v[j] != (float)t->ival[j] : memcmp(&v[j], &t->val[j], sizeof(float)) != 0;
        if (changed) {
            printf("#   %s on %s: input %s modified (%zu elements)\n", label, be->ops->name, t->name, changed);
            problems++;
        }
        free(v);
    }
    for (int i = 0; i < s->nt; i++)
        if (base[i])
            be->ops->free(be, base[i]);
    return problems;
}

/* ||a-b|| / ||b|| (||a-b|| when b is all zeros); INFINITY when either holds a NaN or inf. */
static double norm_err(const float *a, const float *b, size_t n)
{
    double d2 = 0.0, b2 = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i]))
            return INFINITY;
        double d = (double)a[i] - b[i];
        d2 += d * d;
        b2 += (double)b[i] * b[i];
    }
    return b2 > 0.0 ? sqrt(d2 / b2) : sqrt(d2);
}

/* Runs case number idx on cand and on ref and compares every output; tol is the normalised error
 * allowed for float outputs (int outputs must match exactly). With repeat, cand runs the case a
 * second time and must give the same bits (embedding_bwd excepted: it adds with atomics).
 * worst[op] collects the largest error seen. Returns the number of failures. */
static int case_compare(struct backend *cand, struct backend *ref, const struct bo_case *c, uint64_t seed, double tol,
                        bool repeat, double *worst)
{
    char name[128];
    case_name(c, name, sizeof name);
    struct bo_setup s;
    case_setup(&s, c, seed, ref);
    float *co[MAX_TENSORS], *ro[MAX_TENSORS], *again[MAX_TENSORS] = {0};
    int fails = case_execute(cand, c, &s, co, name) + case_execute(ref, c, &s, ro, name);
    if (repeat)
        fails += case_execute(cand, c, &s, again, name);
    for (int i = 0; i < s.nt; i++) {
        if (!co[i])
            continue;
        double err = norm_err(co[i], ro[i], s.t[i].n);
        bool ok = err <= (s.t[i].kind == K_I32 ? 0.0 : tol);
        /* cuDNN's attention backward sums dQ with atomics: bit-identical only when deterministic */
        bool exempt = c->op == OP_EMBEDDING_BWD || (c->op == OP_ATTENTION_BWD && !cand->deterministic);
        bool same = !again[i] || exempt || memcmp(co[i], again[i], s.t[i].n * sizeof(float)) == 0;
        printf("#   %-46s %-9s err %.3e%s%s\n", name, s.t[i].name, err, ok ? "" : "  FAILED",
               same ? "" : "  NOT BIT-IDENTICAL ON REPEAT");
        fails += !ok + !same;
        if (worst && err > worst[c->op])
            worst[c->op] = err;
        free(co[i]);
        free(ro[i]);
        free(again[i]);
    }
    setup_free(&s);
    return fails;
}

/* Whether cand declares case c unsupported through its capability query. */
static bool case_unsupported(struct backend *cand, const struct bo_case *c)
{
    return (c->op == OP_ATTENTION_FWD || c->op == OP_ATTENTION_BWD) && cand->ops->attention_supports &&
           !cand->ops->attention_supports(cand, c->D);
}

static uint64_t base_seed;

static uint64_t case_seed(int idx)
{
    return base_seed + 0x9e3779b97f4a7c15ull * (uint64_t)(idx + 1);
}

/* Runs the whole table; returns the number of failures. */
static int run_table(struct backend *cand, struct backend *ref, double tol, bool repeat)
{
    double worst[OP_COUNT] = {0};
    int fails = 0, skipped = 0;
    printf("# candidate %s vs reference %s, tolerance %.1e%s\n", cand->ops->name, ref->ops->name, tol,
           repeat ? ", repeat bit-identical" : "");
    for (int i = 0; i < NCASES; i++) {
        if (case_unsupported(cand, &cases[i])) {
            char name[128];
            case_name(&cases[i], name, sizeof name);
            printf("#   %-46s skipped: %s does not support head_dim %d\n", name, cand->ops->name, cases[i].D);
            skipped++;
            continue;
        }
        fails += case_compare(cand, ref, &cases[i], case_seed(i), tol, repeat, worst);
    }
    for (int op = 0; op < OP_COUNT; op++)
        printf("# worst normalised error %-14s %.3e\n", op_names[op], worst[op]);
    printf("# %d failures over %d cases (%d skipped as unsupported by %s)\n", fails, NCASES - skipped, skipped,
           cand->ops->name);
    return fails;
}

static int setup(void **state)
{
    base_seed = tu_seed("test_backend_ops", 777);
    return 0;
}

static void test_cpu_vs_cpu(void **state)
{
    struct backend a, b;
    assert_int_equal(backend_cpu_init(&a), 0);
    assert_int_equal(backend_cpu_init(&b), 0);
    assert_int_equal(run_table(&a, &b, 0.0, false), 0);
    backend_cpu_free(&a);
    backend_cpu_free(&b);
}

static void test_cuda_vs_cpu(void **state)
{
#ifdef SD_HAVE_CUDA
    struct backend cuda, cpu;
    if (backend_cuda_init(&cuda, 0, (size_t)1 << 30) != 0) {
        printf("# cuda backend not available: skipped (%s)\n", sd_errmsg());
        skip();
    }
    assert_int_equal(backend_cpu_init(&cpu), 0);
    printf("# cuda device: %s\n", cuda.device_name);
    backend_cuda_set_docs_cudnn_min_length(&cuda, 0); /* the document cases' short documents take cuDNN's too */
    assert_int_equal(run_table(&cuda, &cpu, CUDA_TOL, true), 0);
    /* deterministic: the attention backward of windows takes cuDNN's deterministic engine (else the
     * built-in kernels), documents the built-in kernels */
    printf("# cuda, deterministic\n");
    cuda.deterministic = true;
    assert_int_equal(run_table(&cuda, &cpu, CUDA_TOL, true), 0);
    /* the same with its calls cut small (common/attn_tiles.h): at most 1 MiB of dP a call takes
     * some batch entries or heads, 64 KiB chunks of 64 rows whose partial outputs are summed */
    for (size_t limit = (size_t)1 << 20; limit >= (64 << 10); limit >>= 4) {
        printf("# cuda, deterministic, attention backward calls of at most %zu KiB of dP\n", limit >> 10);
        backend_cuda_set_attention_tile_limit(&cuda, limit);
        assert_int_equal(run_table(&cuda, &cpu, CUDA_TOL, true), 0);
    }
    backend_cpu_free(&cpu);
    backend_cuda_free(&cuda);
#else
    printf("# cuda backend not available: skipped (not built)\n");
    skip();
#endif
}

/* ---- streamed master weights: the device gets exactly the optimizers' bf16 rounding ---- */

/* fetch_weights_f32_async of n fp32 weights (more than one staging piece on CUDA) round-trips to
 * f32_to_bf16's bits, element by element: random values, halfway cases both ways, subnormals,
 * infinities and NaN. */
static void check_fetch_f32(struct backend *be)
{
    size_t n = ((size_t)9 << 20) + 37;
    float *src = malloc(n * sizeof *src), *back = malloc(n * sizeof *back);
    assert_non_null(src);
    assert_non_null(back);
    uint64_t rng = base_seed ^ 0x5eedull;
    for (size_t i = 0; i < n; i++)
        src[i] = (tu_uniform(&rng) - 0.5f) * 8.0f;
    const uint32_t special[] = {0x3f808000u /* 1 + 2^-8: a tie, rounds down to even */,
                                0x3f818000u /* 1 + 3*2^-8: a tie, rounds up to even */,
                                0x00008000u /* subnormal tie */, 0x807fffffu /* largest negative subnormal */,
                                0x7f7fffffu /* FLT_MAX rounds to inf */, 0x7f800000u, 0xff800000u,
                                0x7fc00001u /* quiet NaN with payload */, 0xff812345u /* signalling NaN */};
    for (size_t k = 0; k < sizeof special / sizeof special[0]; k++)
        memcpy(&src[k * 1000003 % n], &special[k], 4);
    void *dev = be->ops->alloc(be, n * be_dtype_size(be->weight_dtype));
    assert_non_null(dev);
    assert_int_equal(be->ops->register_host(be, src, n * sizeof *src, true), 0);
    be->ops->fetch_weights_f32_async(be, 1, dev, src, n);
    be->ops->wait_weights(be, 1);
    be->ops->download_f32(be, back, dev, be->weight_dtype, n);
    be->ops->unregister_host(be, src);
    size_t wrong = 0;
    for (size_t i = 0; i < n; i++) {
        float want = bf16_to_f32(f32_to_bf16(src[i]));
        wrong += memcmp(&want, &back[i], 4) != 0;
    }
    printf("# %s: %zu of %zu streamed weights differ from f32_to_bf16\n", be->ops->name, wrong, n);
    assert_int_equal(wrong, 0);
    be->ops->free(be, dev);
    free(src);
    free(back);
}

/* swiglu_bwd with dgate = gate and dup = up (as layer_backward calls it) gives the bits it gives
 * into separate buffers; n odd, so the vector kernels' tail runs too. */
static void check_swiglu_bwd_in_place(struct backend *be)
{
    enum { n = 4099 };
    uint64_t rng = tu_seed("swiglu in place", 41);
    float *gate = malloc(n * sizeof(float)), *up = malloc(n * sizeof(float)), *dout = malloc(n * sizeof(float));
    for (int i = 0; i < n; i++) {
        gate[i] = 4.0f * tu_uniform(&rng) - 2.0f;
        up[i] = 4.0f * tu_uniform(&rng) - 2.0f;
        dout[i] = 2.0f * tu_uniform(&rng) - 1.0f;
    }
    size_t bytes = n * be_dtype_size(be->act_dtype);
    void *dg = be->ops->alloc(be, bytes), *du = be->ops->alloc(be, bytes), *g = be->ops->alloc(be, bytes),
         *u = be->ops->alloc(be, bytes), *d = be->ops->alloc(be, bytes);
    assert_true(dg && du && g && u && d);
    be->ops->upload_f32(be, g, be->act_dtype, gate, n);
    be->ops->upload_f32(be, u, be->act_dtype, up, n);
    be->ops->upload_f32(be, d, be->act_dtype, dout, n);
    be->ops->swiglu_bwd(be, dg, du, d, g, u, n);
    be->ops->swiglu_bwd(be, g, u, d, g, u, n);
    float *a = malloc(2 * n * sizeof(float)), *b = malloc(2 * n * sizeof(float));
    be->ops->download_f32(be, a, dg, be->act_dtype, n);
    be->ops->download_f32(be, a + n, du, be->act_dtype, n);
    be->ops->download_f32(be, b, g, be->act_dtype, n);
    be->ops->download_f32(be, b + n, u, be->act_dtype, n);
    size_t differ = 0;
    for (int i = 0; i < 2 * n; i++)
        differ += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    printf("# %s: swiglu_bwd in place: %zu of %d gradients differ from the separate buffers'\n", be->ops->name,
           differ, 2 * n);
    assert_int_equal(differ, 0);
    void *bufs[] = {dg, du, g, u, d};
    for (int i = 0; i < 5; i++)
        be->ops->free(be, bufs[i]);
    free(gate);
    free(up);
    free(dout);
    free(a);
    free(b);
}

static void test_swiglu_bwd_in_place_cpu(void **state)
{
    struct backend cpu;
    assert_int_equal(backend_cpu_init(&cpu), 0);
    check_swiglu_bwd_in_place(&cpu);
    backend_cpu_free(&cpu);
}

static void test_swiglu_bwd_in_place_cuda(void **state)
{
#ifdef SD_HAVE_CUDA
    struct backend cuda;
    if (backend_cuda_init(&cuda, 0, (size_t)1 << 30) != 0) {
        printf("# cuda backend not available: skipped (%s)\n", sd_errmsg());
        skip();
    }
    check_swiglu_bwd_in_place(&cuda);
    backend_cuda_free(&cuda);
#else
    printf("# cuda backend not available: skipped (not built)\n");
    skip();
#endif
}

static void test_fetch_f32_cpu(void **state)
{
    struct backend cpu;
    assert_int_equal(backend_cpu_init(&cpu), 0);
    check_fetch_f32(&cpu);
    backend_cpu_free(&cpu);
}

static void test_fetch_f32_cuda(void **state)
{
#ifdef SD_HAVE_CUDA
    struct backend cuda;
    if (backend_cuda_init(&cuda, 0, (size_t)1 << 30) != 0) {
        printf("# cuda backend not available: skipped (%s)\n", sd_errmsg());
        skip();
    }
    check_fetch_f32(&cuda);
    backend_cuda_free(&cuda);
#else
    printf("# cuda backend not available: skipped (not built)\n");
    skip();
#endif
}

/* ---- the harness must fail on broken ops: a CPU backend with deliberately wrong members ---- */

static const struct backend_ops *real;

static void broken_add_writes_past_end(struct backend *be, void *a, const void *b, size_t n)
{
    real->add_inplace(be, a, b, n);
    ((float *)a)[n] = 0.0f;
}

static void broken_swiglu_misses_last(struct backend *be, void *out, const void *gate, const void *up, size_t n)
{
    real->swiglu_fwd(be, out, gate, up, n - 1);
}

static void broken_matmul_one_off(struct backend *be, void *out, const void *inp, const void *w, const void *bias,
                                  int N, int IC, int OC)
{
    real->matmul_fwd(be, out, inp, w, bias, N, IC, OC);
    ((float *)out)[N * OC / 2] *= 1.0f + 1e-6f;
}

static void broken_matmul_one_wrong(struct backend *be, void *out, const void *inp, const void *w, const void *bias,
                                    int N, int IC, int OC)
{
    real->matmul_fwd(be, out, inp, w, bias, N, IC, OC);
    ((float *)out)[N * OC / 2] += 100.0f;
}

static void broken_attention_bwd_clobbers_q(struct backend *be, void *dq, void *dk, void *dv, const void *dout,
                                            const void *q, const void *k, const void *v, const void *out,
                                            const float *lse, const int32_t *pos, int B, int T, int Hq, int Hkv,
                                            int D)
{
    real->attention_bwd(be, dq, dk, dv, dout, q, k, v, out, lse, pos, B, T, Hq, Hkv, D);
    ((float *)q)[1] = 0.5f;
}

static void broken_ce_first_max_loses(struct backend *be, void *logits, float *loss_rows, int32_t *correct,
                                      const int32_t *targets, const float *row_scale, int n, int V)
{
    real->cross_entropy(be, logits, loss_rows, correct, targets, row_scale, n, V);
    correct[0] = !correct[0];
}

static void break_add(struct backend_ops *o)
{
    o->add_inplace = broken_add_writes_past_end;
}

static void break_swiglu(struct backend_ops *o)
{
    o->swiglu_fwd = broken_swiglu_misses_last;
}

static void break_matmul_slightly(struct backend_ops *o)
{
    o->matmul_fwd = broken_matmul_one_off;
}

static void break_matmul(struct backend_ops *o)
{
    o->matmul_fwd = broken_matmul_one_wrong;
}

static void break_attention_bwd(struct backend_ops *o)
{
    o->attention_bwd = broken_attention_bwd_clobbers_q;
}

static void break_cross_entropy(struct backend_ops *o)
{
    o->cross_entropy = broken_ce_first_max_loses;
}

static int first_case(enum bo_op op)
{
    for (int i = 0; i < NCASES; i++)
        if (cases[i].op == op)
            return i;
    fail_msg("no case for %s", op_names[op]);
    return -1;
}

static void test_harness_detects_damage(void **state)
{
    static const struct {
        enum bo_op op;
        double tol;
        void (*install)(struct backend_ops *o);
        const char *what;
    } checks[] = {
        {OP_ADD_INPLACE, CUDA_TOL, break_add, "writes one element past the end"},
        {OP_SWIGLU_FWD, CUDA_TOL, break_swiglu, "leaves the last element unwritten"},
        {OP_MATMUL_FWD, 0.0, break_matmul_slightly, "one element off by 1e-6 relative"},
        {OP_MATMUL_FWD, CUDA_TOL, break_matmul, "one element off by 100"},
        {OP_ATTENTION_BWD, CUDA_TOL, break_attention_bwd, "writes into its input q"},
        {OP_CROSS_ENTROPY, CUDA_TOL, break_cross_entropy, "one wrong argmax flag"},
    };
    struct backend ref, cand;
    assert_int_equal(backend_cpu_init(&ref), 0);
    assert_int_equal(backend_cpu_init(&cand), 0);
    real = cand.ops;
    struct backend_ops broken;
    cand.ops = &broken;
    for (size_t k = 0; k < sizeof checks / sizeof checks[0]; k++) {
        int idx = first_case(checks[k].op);
        broken = *real;
        /* intact, the same case passes even at tolerance 0 */
        assert_int_equal(case_compare(&cand, &ref, &cases[idx], case_seed(idx), 0.0, false, NULL), 0);
        checks[k].install(&broken);
        printf("# %s broken (%s), tolerance %.1e: must fail\n", op_names[checks[k].op], checks[k].what,
               checks[k].tol);
        assert_true(case_compare(&cand, &ref, &cases[idx], case_seed(idx), checks[k].tol, false, NULL) > 0);
    }
    cand.ops = real;
    backend_cpu_free(&cand);
    backend_cpu_free(&ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_harness_detects_damage),
        cmocka_unit_test(test_cpu_vs_cpu),
        cmocka_unit_test(test_cuda_vs_cpu),
        cmocka_unit_test(test_fetch_f32_cpu),
        cmocka_unit_test(test_fetch_f32_cuda),
        cmocka_unit_test(test_swiglu_bwd_in_place_cpu),
        cmocka_unit_test(test_swiglu_bwd_in_place_cuda),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
