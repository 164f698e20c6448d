/* cuDNN fused flash attention (see attention_cudnn.h). The library is loaded with dlopen so the
 * worker builds and runs without it; the graphs are the composite causal SDPA that cuDNN's
 * runtime-fusion engines recognise (the pattern cudnn-frontend lowers its SDPA nodes to):
 *
 *   forward   S = Q K^T * scale, causal mask (row index >= column index, else -FLT_MAX),
 *             m = rowmax S, e = exp(S - m), l = rowsum e, lse = m + log l, O = (e / l) V
 *   backward  D = rowsum(dO * O), P = exp(S - lse) masked, dV = P^T dO, dS = P (dO V^T - D) scale,
 *             dK = dS^T Q, dQ = dS K (fp32 accumulator, then bf16)
 *
 * With grouped KV heads the matmuls broadcast K and V over each group, and dK, dV are the group
 * sums of full-head results. Every tensor is (B,T,H,D) row-major in memory, described as dims
 * (B,H,T,D) with strides (T*H*D, D, H*D, 1).
 *
 * Documents: B is a table of documents and T the longest one's length bucket; q, k, v, out and
 * their gradients carry ragged offsets (each entry's first element) instead of a batch stride;
 * the products are bounded by each entry's length (the matmuls' M/N/K overrides), and a padding
 * mask (row < len and column < len) comes before the causal one, as cudnn-frontend lowers its
 * padded, ragged SDPA. With grouped KV heads the backward's full-head dK and dV are real ragged
 * tensors at dK's offsets, which cuDNN scales by the group size (cudnn-frontend 1.9 on). */
#include "attention_cudnn.h"

#include <cudnn_graph.h>
#include <dlfcn.h>
#include <float.h>
#include <glob.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- the library ---- */

static struct {
    void *lib;
    cudnnHandle_t handle;
    typeof(&cudnnGetVersion) version;
    typeof(&cudnnGetErrorString) error_string;
    typeof(&cudnnGetLastErrorString) last_error;
    typeof(&cudnnCreate) create;
    typeof(&cudnnSetStream) set_stream;
    typeof(&cudnnBackendCreateDescriptor) create_desc;
    typeof(&cudnnBackendDestroyDescriptor) destroy_desc;
    typeof(&cudnnBackendSetAttribute) set_attr;
    typeof(&cudnnBackendGetAttribute) get_attr;
    typeof(&cudnnBackendFinalize) finalize;
    typeof(&cudnnBackendExecute) execute;
} dnn;

static pthread_once_t dnn_once = PTHREAD_ONCE_INIT;
static bool dnn_ready;

/* libcudnn_graph.so.9 from SLIDEDP_CUDNN_LIB (the file or its directory), the loader's path, or a
 * Python wheel (nvidia-cudnn-cu12/13, as PyTorch installs it). */
static void *open_cudnn(void)
{
    const char *name = "libcudnn_graph.so.9", *env = getenv("SLIDEDP_CUDNN_LIB");
    char path[4096];
    void *lib = NULL;
    if (env && *env) {
        snprintf(path, sizeof path, "%s%s", env, strstr(env, ".so") ? "" : "/libcudnn_graph.so.9");
        if ((lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL)))
            return lib;
    }
    if ((lib = dlopen(name, RTLD_NOW | RTLD_GLOBAL)))
        return lib;
    static const char *wheels[] = {"/usr/local/lib/python3*/dist-packages/nvidia/cudnn/lib/libcudnn_graph.so.9",
                                   "/usr/local/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9",
                                   "/usr/lib/python3*/dist-packages/nvidia/cudnn/lib/libcudnn_graph.so.9",
                                   "/opt/conda/lib/python3*/site-packages/nvidia/cudnn/lib/libcudnn_graph.so.9"};
    for (size_t i = 0; i < sizeof wheels / sizeof wheels[0] && !lib; i++) {
        glob_t g;
        if (glob(wheels[i], 0, NULL, &g) == 0 && g.gl_pathc > 0)
            lib = dlopen(g.gl_pathv[g.gl_pathc - 1], RTLD_NOW | RTLD_GLOBAL);
        globfree(&g);
    }
    return lib;
}

static void dnn_load(void)
{
    const char *mode = getenv("SLIDEDP_ATTENTION");
    if (mode && strcmp(mode, "builtin") == 0)
        return;
    if (!(dnn.lib = open_cudnn()))
        return;
#define SYM(field, name)                                                                                   \
    if (!(*(void **)&dnn.field = dlsym(dnn.lib, name)))                                                    \
        return;
    SYM(version, "cudnnGetVersion")
    SYM(error_string, "cudnnGetErrorString")
    SYM(last_error, "cudnnGetLastErrorString")
    SYM(create, "cudnnCreate")
    SYM(set_stream, "cudnnSetStream")
    SYM(create_desc, "cudnnBackendCreateDescriptor")
    SYM(destroy_desc, "cudnnBackendDestroyDescriptor")
    SYM(set_attr, "cudnnBackendSetAttribute")
    SYM(get_attr, "cudnnBackendGetAttribute")
    SYM(finalize, "cudnnBackendFinalize")
    SYM(execute, "cudnnBackendExecute")
#undef SYM
    /* the composite graphs need cuDNN 9's runtime fusion of causal SDPA */
    if (dnn.version() < 90000 || dnn.create(&dnn.handle) != CUDNN_STATUS_SUCCESS)
        return;
    dnn_ready = true;
}

/* ---- graph building: every descriptor made is kept and destroyed with the graph ---- */

#define MAX_DESCS 160
#define MAX_OPS 40

struct graph {
    cudnnBackendDescriptor_t descs[MAX_DESCS], ops[MAX_OPS];
    int ndescs, nops;
    bool failed;
    char why[256];
};

/* Records the first failure (what, and cuDNN's own message). */
static bool check(struct graph *g, cudnnStatus_t s, const char *what)
{
    if (s == CUDNN_STATUS_SUCCESS || g->failed)
        return s == CUDNN_STATUS_SUCCESS && !g->failed;
    char last[160] = "";
    dnn.last_error(last, sizeof last);
    snprintf(g->why, sizeof g->why, "%s: %s%s%s", what, dnn.error_string(s), *last ? ": " : "", last);
    g->failed = true;
    return false;
}

static cudnnBackendDescriptor_t make(struct graph *g, cudnnBackendDescriptorType_t type)
{
    cudnnBackendDescriptor_t d = NULL;
    if (g->failed || g->ndescs == MAX_DESCS || !check(g, dnn.create_desc(type, &d), "create descriptor"))
        return NULL;
    g->descs[g->ndescs++] = d;
    return d;
}

static void set(struct graph *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t name,
                cudnnBackendAttributeType_t type, int64_t n, const void *value)
{
    if (!g->failed)
        check(g, dnn.set_attr(d, name, type, n, value), "set attribute");
}

static void done(struct graph *g, cudnnBackendDescriptor_t d, const char *what)
{
    if (!g->failed)
        check(g, dnn.finalize(d), what);
}

static void graph_free(struct graph *g)
{
    while (g->ndescs > 0)
        dnn.destroy_desc(g->descs[--g->ndescs]);
}

enum { VIRTUAL = 1, BY_VALUE = 2 };

#define DIMS(a, b, c, d) ((const int64_t[4]){(a), (b), (c), (d)})
static const int64_t SCALAR[4] = {1, 1, 1, 1};

/* A tensor; ragged (may be NULL) is the (B+1) int64 tensor of each batch entry's first element
 * (documents laid one after another: the batch stride is then not used). */
static cudnnBackendDescriptor_t ragged_tensor(struct graph *g, int64_t uid, cudnnDataType_t type,
                                              const int64_t dims[4], const int64_t strides[4], int flags,
                                              cudnnBackendDescriptor_t ragged)
{
    cudnnBackendDescriptor_t t = make(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16;
    bool is_virtual = flags & VIRTUAL, by_value = flags & BY_VALUE;
    set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims);
    set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides);
    set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    if (ragged)
        set(g, t, CUDNN_ATTR_TENSOR_RAGGED_OFFSET_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &ragged);
    done(g, t, "tensor");
    return t;
}

static cudnnBackendDescriptor_t tensor(struct graph *g, int64_t uid, cudnnDataType_t type, const int64_t dims[4],
                                       const int64_t strides[4], int flags)
{
    return ragged_tensor(g, uid, type, dims, strides, flags, NULL);
}

static void add_op(struct graph *g, cudnnBackendDescriptor_t op, const char *what)
{
    done(g, op, what);
    if (!g->failed && g->nops < MAX_OPS)
        g->ops[g->nops++] = op;
    else if (!g->failed)
        check(g, CUDNN_STATUS_INTERNAL_ERROR, "too many operations");
}

/* y = mode(x [, b [, t]]) in fp32 unless prec says otherwise; axis only for GEN_INDEX. */
static void pointwise(struct graph *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis,
                      cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t,
                      cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t pw = make(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (mode == CUDNN_POINTWISE_GEN_INDEX)
        set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    done(g, pw, "pointwise");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    float one = 1.0f;
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1, CUDNN_TYPE_FLOAT, 1, &one);
    set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2, CUDNN_TYPE_FLOAT, 1, &one);
    if (b)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t)
        set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    add_op(g, op, "pointwise operation");
}

static void pw(struct graph *g, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
               cudnnBackendDescriptor_t y)
{
    pointwise(g, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, y);
}

/* c = a @ b over the last two dims; the batch dims broadcast (b's heads divide a's). With documents,
 * m, n and k (each NULL or a per-document length tensor) bound the product's extents per entry. */
static void matmul_bounded(struct graph *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
                           cudnnBackendDescriptor_t c, cudnnBackendDescriptor_t m, cudnnBackendDescriptor_t n,
                           cudnnBackendDescriptor_t k)
{
    cudnnBackendDescriptor_t mm = make(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    double pad = 0.0;
    set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    set(g, mm, CUDNN_ATTR_MATMUL_PADDING_VALUE, CUDNN_TYPE_DOUBLE, 1, &pad);
    done(g, mm, "matmul");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    if (m)
        set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_M_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &m);
    if (n)
        set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_N_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n);
    if (k)
        set(g, op, CUDNN_ATTR_OPERATION_MATMUL_GEMM_K_OVERRIDE_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &k);
    add_op(g, op, "matmul operation");
}

static void reduce(struct graph *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t rd = make(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    set(g, rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    set(g, rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
#if CUDNN_VERSION >= 91100
    if (dnn.version() >= 91100) { /* the attribute's first version; cudnn-frontend sets it so */
        bool deterministic = false;
        set(g, rd, CUDNN_ATTR_REDUCTION_IS_DETERMINISTIC, CUDNN_TYPE_BOOLEAN, 1, &deterministic);
    }
#endif
    done(g, rd, "reduction");
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd);
    add_op(g, op, "reduction operation");
}

static void reshape(struct graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y)
{
    cudnnBackendDescriptor_t op = make(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    add_op(g, op, "reshape operation");
}

/* the variant packs' tensor ids */
enum {
    U_Q = 1, U_K, U_V, U_O, U_LSE, U_DO, U_DQ, U_DK, U_DV, U_SCALE, U_ONE, U_NEG, U_ROWSUM, U_DQ_ACC,
    U_SEQ_Q, U_SEQ_KV, U_OFF_Q, U_OFF_KV, U_OFF_STATS, U_DK_FULL, U_DV_FULL
};

struct cudnn_sdpa {
    int bwd, B, T, Hq, Hkv, D;
    int tokens; /* document plans: the tokens of the (tokens, heads, dim) tensors; 0 for windows */
    bool is_tile;           /* a tile of the deterministic backward */
    struct cudnn_tile tile; /* its shape */
    bool out_f32;           /* its partial outputs are fp32 (else bf16) */
    bool usable;
    cudnnBackendDescriptor_t plan;
    int64_t workspace;
    struct graph g;
};

/* A document plan's per-entry tensors (all NULL for whole windows): each batch entry is one
 * document, seq_q = seq_kv its length, off_* the first element of its rows in the token-major
 * tensors: q, out, dout, dq (off_q), k, v, dk, dv (off_kv), lse and the row sums (off_stats). */
struct docs_io {
    cudnnBackendDescriptor_t seq_q, seq_kv, off_q, off_kv, off_stats;
};

static void docs_io_make(struct graph *g, int64_t B, struct docs_io *io)
{
    io->seq_q = tensor(g, U_SEQ_Q, CUDNN_DATA_INT32, DIMS(B, 1, 1, 1), SCALAR, 0);
    io->seq_kv = tensor(g, U_SEQ_KV, CUDNN_DATA_INT32, DIMS(B, 1, 1, 1), SCALAR, 0);
    io->off_q = tensor(g, U_OFF_Q, CUDNN_DATA_INT64, DIMS(B + 1, 1, 1, 1), SCALAR, 0);
    io->off_kv = tensor(g, U_OFF_KV, CUDNN_DATA_INT64, DIMS(B + 1, 1, 1, 1), SCALAR, 0);
    io->off_stats = tensor(g, U_OFF_STATS, CUDNN_DATA_INT64, DIMS(B + 1, 1, 1, 1), SCALAR, 0);
}

/* Scores x masked causally: x where row >= column, else neg (tensor uids uid..uid+3). */
static cudnnBackendDescriptor_t causal(struct graph *g, cudnnBackendDescriptor_t x, int64_t uid, const int64_t *sd,
                                       const int64_t *ss, cudnnBackendDescriptor_t neg)
{
    cudnnBackendDescriptor_t row = tensor(g, uid, CUDNN_DATA_INT32, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t col = tensor(g, uid + 1, CUDNN_DATA_INT32, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t keep = tensor(g, uid + 2, CUDNN_DATA_BOOLEAN, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t out = tensor(g, uid + 3, CUDNN_DATA_FLOAT, sd, ss, VIRTUAL);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 2, x, NULL, NULL, row);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 3, x, NULL, NULL, col);
    pointwise(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, x, neg, keep, out);
    return out;
}

/* Scores x masked to each document's extent: x where row < seq_q and column < seq_kv of its
 * entry, else neg (the padding mask of cudnn-frontend's SDPA; uids uid..uid+5). */
static cudnnBackendDescriptor_t padding(struct graph *g, cudnnBackendDescriptor_t x, int64_t uid, const int64_t *sd,
                                        const int64_t *ss, const struct docs_io *io, cudnnBackendDescriptor_t neg)
{
    cudnnBackendDescriptor_t row = tensor(g, uid, CUDNN_DATA_INT32, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t col = tensor(g, uid + 1, CUDNN_DATA_INT32, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t row_in = tensor(g, uid + 2, CUDNN_DATA_BOOLEAN, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t col_in = tensor(g, uid + 3, CUDNN_DATA_BOOLEAN, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t keep = tensor(g, uid + 4, CUDNN_DATA_BOOLEAN, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t out = tensor(g, uid + 5, CUDNN_DATA_FLOAT, sd, ss, VIRTUAL);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 2, x, NULL, NULL, row);
    pointwise(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_INT32, 3, x, NULL, NULL, col);
    pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, -1, row, io->seq_q, NULL, row_in);
    pointwise(g, CUDNN_POINTWISE_CMP_LT, CUDNN_DATA_BOOLEAN, -1, col, io->seq_kv, NULL, col_in);
    pointwise(g, CUDNN_POINTWISE_LOGICAL_AND, CUDNN_DATA_BOOLEAN, -1, row_in, col_in, NULL, keep);
    pointwise(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, x, neg, keep, out);
    return out;
}

/* With documents, B is the table's entries and T the longest document's length bucket. */
static void build_fwd(struct graph *g, int64_t B, int64_t T, int64_t H, int64_t HK, int64_t D, bool docs)
{
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
    const int64_t *sd = DIMS(B, H, T, T), *ss = DIMS(H * T * T, T * T, T, 1);
    const int64_t *rd = DIMS(B, H, T, 1), *rs = DIMS(H * T, T, 1, 1);
    const int64_t *st = docs ? DIMS(T * H, 1, H, 1) : rs; /* lse: token-major with documents (packed) */
    struct docs_io io = {0};
    if (docs)
        docs_io_make(g, B, &io);
    cudnnBackendDescriptor_t q = ragged_tensor(g, U_Q, BF, DIMS(B, H, T, D), DIMS(T * H * D, D, H * D, 1), 0, io.off_q);
    cudnnBackendDescriptor_t kt =
        ragged_tensor(g, U_K, BF, DIMS(B, HK, D, T), DIMS(T * HK * D, D, 1, HK * D), 0, io.off_kv);
    cudnnBackendDescriptor_t v =
        ragged_tensor(g, U_V, BF, DIMS(B, HK, T, D), DIMS(T * HK * D, D, HK * D, 1), 0, io.off_kv);
    cudnnBackendDescriptor_t o = ragged_tensor(g, U_O, BF, DIMS(B, H, T, D), DIMS(T * H * D, D, H * D, 1), 0, io.off_q);
    cudnnBackendDescriptor_t lse = ragged_tensor(g, U_LSE, F, rd, st, 0, io.off_stats);
    cudnnBackendDescriptor_t scale = tensor(g, U_SCALE, F, SCALAR, SCALAR, BY_VALUE);
    cudnnBackendDescriptor_t neg = tensor(g, U_NEG, F, SCALAR, SCALAR, BY_VALUE);

    cudnnBackendDescriptor_t s = tensor(g, 101, F, sd, ss, VIRTUAL), s_scaled = tensor(g, 102, F, sd, ss, VIRTUAL);
    matmul_bounded(g, q, kt, s, io.seq_q, io.seq_kv, NULL);
    pw(g, CUDNN_POINTWISE_MUL, s, scale, s_scaled);
    if (docs)
        s_scaled = padding(g, s_scaled, 120, sd, ss, &io, neg);
    cudnnBackendDescriptor_t s_masked = causal(g, s_scaled, 103, sd, ss, neg);
    cudnnBackendDescriptor_t mx = tensor(g, 107, F, rd, rs, VIRTUAL), sub = tensor(g, 108, F, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t e = tensor(g, 109, F, sd, ss, VIRTUAL), sum = tensor(g, 110, F, rd, rs, VIRTUAL);
    cudnnBackendDescriptor_t lg = tensor(g, 111, F, rd, rs, VIRTUAL), p = tensor(g, 112, BF, sd, ss, VIRTUAL);
    reduce(g, CUDNN_REDUCE_TENSOR_MAX, s_masked, mx);
    pw(g, CUDNN_POINTWISE_SUB, s_masked, mx, sub);
    pw(g, CUDNN_POINTWISE_EXP, sub, NULL, e);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    pw(g, CUDNN_POINTWISE_LOG, sum, NULL, lg);
    pw(g, CUDNN_POINTWISE_ADD, mx, lg, lse);
    pw(g, CUDNN_POINTWISE_DIV, e, sum, p);
    matmul_bounded(g, p, v, o, io.seq_q, NULL, io.seq_kv);
}

/* out = x^T y for scores x of dims sd (B, H, Tq, Tk) and y (B, H, Tq, D); with grouped KV heads
 * (grouped) the product, of dims fd (B, H, Tk, D), is summed over each group into out's
 * (B, HK, Tk, D). Virtual tensors take the ids uid and uid + 1. With documents the full-head
 * product is a real tensor (id full_uid, token-major, at out's offsets times the group size, as
 * cuDNN scales them). */
static void grouped_transposed_matmul(struct graph *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y,
                                      cudnnBackendDescriptor_t out, int64_t uid, bool grouped, const int64_t *sd,
                                      const int64_t *fd, const struct docs_io *io, int64_t full_uid)
{
    const int64_t H = sd[1], Tq = sd[2], Tk = sd[3], D = fd[3];
    cudnnBackendDescriptor_t xt =
        tensor(g, uid, CUDNN_DATA_BFLOAT16, DIMS(sd[0], H, Tk, Tq), DIMS(H * Tq * Tk, Tq * Tk, 1, Tk), VIRTUAL);
    reshape(g, x, xt);
    if (!grouped) {
        matmul_bounded(g, xt, y, out, io->seq_kv, NULL, io->seq_q);
        return;
    }
    cudnnBackendDescriptor_t full =
        io->off_kv ? ragged_tensor(g, full_uid, CUDNN_DATA_BFLOAT16, fd, DIMS(Tk * H * D, D, H * D, 1), 0, io->off_kv)
                   : tensor(g, uid + 1, CUDNN_DATA_BFLOAT16, fd, DIMS(H * Tk * D, Tk * D, D, 1), VIRTUAL);
    matmul_bounded(g, xt, y, full, io->seq_kv, NULL, io->seq_q);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, full, out);
}

/* rowsum = sum over the head dim of dO * O, dims rd (B, H, T, 1), strides rs (virtual ids 201, 202) */
static void dout_dot_out(struct graph *g, cudnnBackendDescriptor_t dout, cudnnBackendDescriptor_t o,
                         cudnnBackendDescriptor_t one, cudnnBackendDescriptor_t rowsum, const int64_t *rd,
                         const int64_t *rs, int64_t D)
{
    const int64_t B = rd[0], H = rd[1], T = rd[2];
    cudnnBackendDescriptor_t doo =
        tensor(g, 201, CUDNN_DATA_FLOAT, DIMS(B, H, T, D), DIMS(H * T * D, T * D, H * D, 1), VIRTUAL);
    cudnnBackendDescriptor_t dsum = tensor(g, 202, CUDNN_DATA_FLOAT, rd, rs, VIRTUAL);
    pw(g, CUDNN_POINTWISE_MUL, dout, o, doo);
    reduce(g, CUDNN_REDUCE_TENSOR_ADD, doo, dsum);
    pw(g, CUDNN_POINTWISE_MUL, dsum, one, rowsum);
}

/* dS = P * (dO V^T - rowsum) * scale, of dims sd and strides ss (virtual ids 213-216; with
 * documents the product bounded by each entry's lengths) */
static cudnnBackendDescriptor_t score_grad(struct graph *g, cudnnBackendDescriptor_t dout, cudnnBackendDescriptor_t vt,
                                           cudnnBackendDescriptor_t rowsum, cudnnBackendDescriptor_t p,
                                           cudnnBackendDescriptor_t scale, const int64_t *sd, const int64_t *ss,
                                           const struct docs_io *io)
{
    const cudnnDataType_t F = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t dp = tensor(g, 213, F, sd, ss, VIRTUAL), dp_d = tensor(g, 214, F, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t dp_p = tensor(g, 215, F, sd, ss, VIRTUAL), ds = tensor(g, 216, F, sd, ss, VIRTUAL);
    matmul_bounded(g, dout, vt, dp, io->seq_q, io->seq_kv, NULL);
    pw(g, CUDNN_POINTWISE_SUB, dp, rowsum, dp_d);
    pw(g, CUDNN_POINTWISE_MUL, dp_d, p, dp_p);
    pw(g, CUDNN_POINTWISE_MUL, dp_p, scale, ds);
    return ds;
}

static void build_bwd(struct graph *g, int64_t B, int64_t T, int64_t H, int64_t HK, int64_t D, bool docs)
{
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
    const int64_t *sd = DIMS(B, H, T, T), *ss = DIMS(H * T * T, T * T, T, 1);
    const int64_t *rd = DIMS(B, H, T, 1), *rs = DIMS(H * T, T, 1, 1);
    const int64_t *st = docs ? DIMS(T * H, 1, H, 1) : rs; /* lse and the row sums, as the forward's lse */
    const int64_t *qd = DIMS(B, H, T, D), *qs = DIMS(T * H * D, D, H * D, 1);
    const int64_t *kd = DIMS(B, HK, T, D), *ks = DIMS(T * HK * D, D, HK * D, 1);
    const int64_t *ktd = DIMS(B, HK, D, T), *kts = DIMS(T * HK * D, D, 1, HK * D);
    const int64_t *fs = docs ? qs : DIMS(H * T * D, T * D, D, 1); /* the fp32 dQ: token-major, or (B,H,T,D) */
    struct docs_io io = {0};
    if (docs)
        docs_io_make(g, B, &io);
    cudnnBackendDescriptor_t q = ragged_tensor(g, U_Q, BF, qd, qs, 0, io.off_q);
    cudnnBackendDescriptor_t kt = ragged_tensor(g, U_K, BF, ktd, kts, 0, io.off_kv);
    cudnnBackendDescriptor_t vt = ragged_tensor(g, U_V, BF, ktd, kts, 0, io.off_kv);
    cudnnBackendDescriptor_t o = ragged_tensor(g, U_O, BF, qd, qs, 0, io.off_q);
    cudnnBackendDescriptor_t dout = ragged_tensor(g, U_DO, BF, qd, qs, 0, io.off_q);
    cudnnBackendDescriptor_t lse = ragged_tensor(g, U_LSE, F, rd, st, 0, io.off_stats);
    cudnnBackendDescriptor_t dq = ragged_tensor(g, U_DQ, BF, qd, qs, 0, io.off_q);
    cudnnBackendDescriptor_t dk = ragged_tensor(g, U_DK, BF, kd, ks, 0, io.off_kv);
    cudnnBackendDescriptor_t dv = ragged_tensor(g, U_DV, BF, kd, ks, 0, io.off_kv);
    cudnnBackendDescriptor_t scale = tensor(g, U_SCALE, F, SCALAR, SCALAR, BY_VALUE);
    cudnnBackendDescriptor_t one = tensor(g, U_ONE, F, SCALAR, SCALAR, BY_VALUE);
    cudnnBackendDescriptor_t neg = tensor(g, U_NEG, F, SCALAR, SCALAR, BY_VALUE);
    cudnnBackendDescriptor_t rowsum = ragged_tensor(g, U_ROWSUM, F, rd, st, 0, io.off_stats);
    cudnnBackendDescriptor_t dq_acc = ragged_tensor(g, U_DQ_ACC, F, qd, fs, 0, io.off_q);

    /* D = rowsum(dO * O) into the row-sum scratch */
    dout_dot_out(g, dout, o, one, rowsum, rd, rs, D);

    /* P = exp(S * scale - lse), within documents, causal */
    cudnnBackendDescriptor_t s = tensor(g, 203, F, sd, ss, VIRTUAL), s_scaled = tensor(g, 204, F, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t s_shift = tensor(g, 205, F, sd, ss, VIRTUAL);
    matmul_bounded(g, q, kt, s, io.seq_q, io.seq_kv, NULL);
    pw(g, CUDNN_POINTWISE_MUL, s, scale, s_scaled);
    if (docs)
        s_scaled = padding(g, s_scaled, 230, sd, ss, &io, neg);
    pw(g, CUDNN_POINTWISE_SUB, s_scaled, lse, s_shift);
    cudnnBackendDescriptor_t s_masked = causal(g, s_shift, 206, sd, ss, neg);
    cudnnBackendDescriptor_t p = tensor(g, 210, F, sd, ss, VIRTUAL);
    pw(g, CUDNN_POINTWISE_EXP, s_masked, NULL, p);

    /* dV = P^T dO, summed over each KV head's group */
    grouped_transposed_matmul(g, p, dout, dv, 211, H != HK, sd, qd, &io, U_DV_FULL);

    /* dS = P * (dO V^T - D) * scale */
    cudnnBackendDescriptor_t ds = score_grad(g, dout, vt, rowsum, p, scale, sd, ss, &io);

    /* dK = dS^T Q, summed over the group */
    grouped_transposed_matmul(g, ds, q, dk, 217, H != HK, sd, qd, &io, U_DK_FULL);

    /* dQ = dS K through the fp32 accumulator */
    cudnnBackendDescriptor_t k = ragged_tensor(g, 219, F, kd, ks, VIRTUAL, io.off_kv);
    reshape(g, kt, k);
    matmul_bounded(g, ds, k, dq_acc, io.seq_q, NULL, io.seq_kv);
    pw(g, CUDNN_POINTWISE_IDENTITY, dq_acc, NULL, dq);
}

/* A tile of the deterministic backward (attn_tiles.h): the graph cudnn-frontend builds for its
 * deterministic algorithm on Hopper, dQ = dS K straight into dQ (cuDNN then keeps dP in its
 * workspace and sums dQ by a matmul, without atomics). q, k, v, out, dout (and dq, dk, dv unless
 * partial) are slices of the full (B, T, H, D) tensors; lse and the row sums are compact (B, H, Tq);
 * partial outputs are compact (B, Tq or Tk, H, D) of out_type. A diagonal tile is causal, the
 * others take every pair. */
static void build_bwd_tile(struct graph *g, const struct cudnn_tile *t, cudnnDataType_t out_type)
{
    const cudnnDataType_t BF = CUDNN_DATA_BFLOAT16, F = CUDNN_DATA_FLOAT;
    const int64_t B = t->nb, Tq = t->tq, Tk = t->tk, H = t->hq, HK = t->hkv, D = t->D;
    const int64_t qrow = (int64_t)t->Hq * D, krow = (int64_t)t->Hkv * D; /* the full tensors' row strides */
    const int64_t qseq = t->T * qrow, kseq = t->T * krow;
    const int64_t *sd = DIMS(B, H, Tq, Tk), *ss = DIMS(H * Tq * Tk, Tq * Tk, Tk, 1);
    const int64_t *rd = DIMS(B, H, Tq, 1), *rs = DIMS(H * Tq, Tq, 1, 1);
    const int64_t *qd = DIMS(B, H, Tq, D), *qs = DIMS(qseq, D, qrow, 1);
    const int64_t *kd = DIMS(B, HK, Tk, D), *ks = DIMS(kseq, D, krow, 1);
    const int64_t *ktd = DIMS(B, HK, D, Tk), *kts = DIMS(kseq, D, 1, krow);
    const int64_t *dqs = t->partial ? DIMS(Tq * H * D, D, H * D, 1) : qs;
    const int64_t *dks = t->partial ? DIMS(Tk * HK * D, D, HK * D, 1) : ks;
    const struct docs_io none = {0};
    cudnnBackendDescriptor_t q = tensor(g, U_Q, BF, qd, qs, 0);
    cudnnBackendDescriptor_t kt = tensor(g, U_K, BF, ktd, kts, 0);
    cudnnBackendDescriptor_t vt = tensor(g, U_V, BF, ktd, kts, 0);
    cudnnBackendDescriptor_t o = tensor(g, U_O, BF, qd, qs, 0);
    cudnnBackendDescriptor_t dout = tensor(g, U_DO, BF, qd, qs, 0);
    cudnnBackendDescriptor_t lse = tensor(g, U_LSE, F, rd, rs, 0);
    cudnnBackendDescriptor_t dq = tensor(g, U_DQ, out_type, qd, dqs, 0);
    cudnnBackendDescriptor_t dk = tensor(g, U_DK, out_type, kd, dks, 0);
    cudnnBackendDescriptor_t dv = tensor(g, U_DV, out_type, kd, dks, 0);
    cudnnBackendDescriptor_t scale = tensor(g, U_SCALE, F, SCALAR, SCALAR, BY_VALUE);
    cudnnBackendDescriptor_t one = tensor(g, U_ONE, F, SCALAR, SCALAR, BY_VALUE);
    cudnnBackendDescriptor_t rowsum = tensor(g, U_ROWSUM, F, rd, rs, 0);

    /* D = rowsum(dO * O) */
    dout_dot_out(g, dout, o, one, rowsum, rd, rs, D);

    /* P = exp(S * scale - lse), causal on the diagonal */
    cudnnBackendDescriptor_t s = tensor(g, 203, F, sd, ss, VIRTUAL), s_scaled = tensor(g, 204, F, sd, ss, VIRTUAL);
    cudnnBackendDescriptor_t s_shift = tensor(g, 205, F, sd, ss, VIRTUAL);
    matmul_bounded(g, q, kt, s, NULL, NULL, NULL);
    pw(g, CUDNN_POINTWISE_MUL, s, scale, s_scaled);
    pw(g, CUDNN_POINTWISE_SUB, s_scaled, lse, s_shift);
    if (t->causal)
        s_shift = causal(g, s_shift, 206, sd, ss, tensor(g, U_NEG, F, SCALAR, SCALAR, BY_VALUE));
    cudnnBackendDescriptor_t p = tensor(g, 210, F, sd, ss, VIRTUAL);
    pw(g, CUDNN_POINTWISE_EXP, s_shift, NULL, p);

    /* dV = P^T dO and dK = dS^T Q, summed over each KV head's group */
    const int64_t *fd = DIMS(B, H, Tk, D);
    grouped_transposed_matmul(g, p, dout, dv, 211, H != HK, sd, fd, &none, 0);
    cudnnBackendDescriptor_t ds = score_grad(g, dout, vt, rowsum, p, scale, sd, ss, &none);
    grouped_transposed_matmul(g, ds, q, dk, 217, H != HK, sd, fd, &none, 0);

    /* dQ = dS K, straight into dQ */
    cudnnBackendDescriptor_t k = tensor(g, 219, F, kd, ks, VIRTUAL);
    reshape(g, kt, k);
    matmul_bounded(g, ds, k, dq, NULL, NULL, NULL);
}

/* The operation graph, then the first engine config of the heuristics (mode A, else fallback)
 * whose execution plan finalizes. */
static void make_plan(struct cudnn_sdpa *p)
{
    struct graph *g = &p->g;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations" /* still how a graph binds to a handle */
    const cudnnBackendAttributeName_t graph_handle = CUDNN_ATTR_OPERATIONGRAPH_HANDLE;
    const cudnnBackendAttributeName_t plan_handle = CUDNN_ATTR_EXECUTION_PLAN_HANDLE;
#pragma GCC diagnostic pop
    cudnnBackendDescriptor_t opgraph = make(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    set(g, opgraph, graph_handle, CUDNN_TYPE_HANDLE, 1, &dnn.handle);
    set(g, opgraph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    done(g, opgraph, "operation graph");
    const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    for (int m = 0; m < 2 && !g->failed; m++) {
        cudnnBackendDescriptor_t heur = make(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &opgraph);
        set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        if (g->failed || dnn.finalize(heur) != CUDNN_STATUS_SUCCESS)
            continue;
        int64_t n = 0;
        if (dnn.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, NULL) !=
                CUDNN_STATUS_SUCCESS ||
            n <= 0)
            continue;
        cudnnBackendDescriptor_t cfgs[8];
        n = n < 8 ? n : 8;
        for (int64_t i = 0; i < n; i++)
            cfgs[i] = make(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (g->failed ||
            dnn.get_attr(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &n, cfgs) !=
                CUDNN_STATUS_SUCCESS)
            continue;
        for (int64_t i = 0; i < n; i++) {
            cudnnBackendDescriptor_t plan = make(g, CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
            set(g, plan, plan_handle, CUDNN_TYPE_HANDLE, 1, &dnn.handle);
            set(g, plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
            if (g->failed || dnn.finalize(plan) != CUDNN_STATUS_SUCCESS)
                continue;
            int64_t got;
            if (!check(g, dnn.get_attr(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &got,
                                       &p->workspace),
                       "workspace size"))
                return;
            p->plan = plan;
            return;
        }
    }
    if (!g->failed)
        snprintf(g->why, sizeof g->why, "no engine takes the graph");
    g->failed = true;
}

/* ---- plans per shape ---- */

#define MAX_PLANS 256
static struct cudnn_sdpa plans[MAX_PLANS];
static int nplans;
static pthread_mutex_t plans_mu = PTHREAD_MUTEX_INITIALIZER;

static void plan_settle(struct cudnn_sdpa *p);

static struct cudnn_sdpa *find_or_build(int bwd, int B, int T, int Hq, int Hkv, int D, int tokens)
{
    pthread_once(&dnn_once, dnn_load);
    /* 16-byte rows for the tensor-core loads; head_dim up to 128 for the backward engines; ragged
     * document tensors as cudnn-frontend builds them for cuDNN 9.10 and later */
    if (!dnn_ready || D % 8 != 0 || D > 128 || Hkv <= 0 || Hq % Hkv != 0 || (tokens && dnn.version() < 91000))
        return NULL;
    pthread_mutex_lock(&plans_mu);
    struct cudnn_sdpa *p = NULL;
    for (int i = 0; i < nplans && !p; i++)
        if (!plans[i].is_tile && plans[i].bwd == bwd && plans[i].B == B && plans[i].T == T && plans[i].Hq == Hq &&
            plans[i].Hkv == Hkv && plans[i].D == D && plans[i].tokens == tokens)
            p = &plans[i];
    if (!p && nplans < MAX_PLANS) {
        p = &plans[nplans++];
        *p = (struct cudnn_sdpa){.bwd = bwd, .B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .D = D, .tokens = tokens};
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (bwd)
            build_bwd(&p->g, B, T, Hq, Hkv, D, tokens > 0);
        else
            build_fwd(&p->g, B, T, Hq, Hkv, D, tokens > 0);
        make_plan(p);
        plan_settle(p);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (getenv("SLIDEDP_VERBOSE_ATTENTION"))
            fprintf(stderr, "cuda attention: cuDNN %s%s plan B=%d T=%d heads %d/%d built in %.0f ms\n",
                    tokens ? "document " : "", bwd ? "backward" : "forward", B, T, Hq, Hkv,
                    (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6);
    }
    pthread_mutex_unlock(&plans_mu);
    return p && p->usable ? p : NULL;
}

/* After make_plan: usable or not, said on stderr (the first usable one only when asked). */
static void plan_settle(struct cudnn_sdpa *p)
{
    p->usable = !p->g.failed;
    static bool said;
    if (p->usable && !said && getenv("SLIDEDP_VERBOSE_ATTENTION")) {
        fprintf(stderr, "cuda attention: cuDNN %zu fused flash attention\n", dnn.version());
        said = true;
    }
    if (p->usable && p->is_tile && getenv("SLIDEDP_VERBOSE_ATTENTION"))
        fprintf(stderr, "cuda attention: deterministic tile %dx%d rows, %d batch, heads %d/%d%s: workspace %lld MiB, %s "
                        "outputs\n",
                p->tile.tq, p->tile.tk, p->tile.nb, p->tile.hq, p->tile.hkv, p->tile.causal ? " causal" : "",
                (long long)(p->workspace >> 20), p->out_f32 ? "fp32" : "bf16");
    if (p->usable)
        return;
    if (p->is_tile)
        fprintf(stderr, "cuda attention: cuDNN %zu has no deterministic backward plan for %dx%d rows, %d batch, heads "
                        "%d/%d, dim %d (%s); using the built-in kernels\n",
                dnn.version(), p->tile.tq, p->tile.tk, p->tile.nb, p->tile.hq, p->tile.hkv, p->D, p->g.why);
    else
        fprintf(stderr, "cuda attention: cuDNN %zu has no %s%s plan for B=%d T=%d heads %d/%d dim %d (%s); using "
                        "the built-in kernel\n",
                dnn.version(), p->tokens ? "document " : "", p->bwd ? "backward" : "forward", p->B, p->T, p->Hq,
                p->Hkv, p->D, p->g.why);
    graph_free(&p->g);
}

static bool tile_equal(const struct cudnn_tile *a, const struct cudnn_tile *b)
{
    return a->nb == b->nb && a->tq == b->tq && a->tk == b->tk && a->hq == b->hq && a->hkv == b->hkv &&
           a->T == b->T && a->Hq == b->Hq && a->Hkv == b->Hkv && a->D == b->D && a->causal == b->causal &&
           a->partial == b->partial;
}

struct cudnn_sdpa *cudnn_sdpa_tile_plan(const struct cudnn_tile *t)
{
    pthread_once(&dnn_once, dnn_load);
    if (!dnn_ready || t->D % 8 != 0 || t->D > 128 || t->hkv <= 0 || t->hq % t->hkv != 0)
        return NULL;
    pthread_mutex_lock(&plans_mu);
    struct cudnn_sdpa *p = NULL;
    for (int i = 0; i < nplans && !p; i++)
        if (plans[i].is_tile && tile_equal(&plans[i].tile, t))
            p = &plans[i];
    if (!p && nplans < MAX_PLANS) {
        p = &plans[nplans++];
        *p = (struct cudnn_sdpa){.bwd = 1, .B = t->nb, .T = t->tq, .Hq = t->hq, .Hkv = t->hkv, .D = t->D,
                                 .is_tile = true, .tile = *t};
        /* partial outputs in fp32 where cuDNN takes them, else bf16 */
        for (int f32 = t->partial; f32 >= 0; f32--) {
            p->g = (struct graph){0};
            build_bwd_tile(&p->g, t, f32 ? CUDNN_DATA_FLOAT : CUDNN_DATA_BFLOAT16);
            make_plan(p);
            p->out_f32 = f32;
            if (!p->g.failed || f32 == 0)
                break;
            graph_free(&p->g);
        }
        plan_settle(p);
    }
    pthread_mutex_unlock(&plans_mu);
    return p && p->usable ? p : NULL;
}

struct cudnn_sdpa *cudnn_sdpa_plan(int bwd, int B, int T, int Hq, int Hkv, int D)
{
    return find_or_build(bwd, B, T, Hq, Hkv, D, 0);
}

struct cudnn_sdpa *cudnn_sdpa_docs_plan(int bwd, int entries, int longest, int tokens, int Hq, int Hkv, int D)
{
    return tokens > 0 ? find_or_build(bwd, entries, longest, Hq, Hkv, D, tokens) : NULL;
}

#define ALIGN_UP(x) (((x) + 255) & ~(size_t)255)

/* Scratch after the workspace. Windows: the backward's fp32 dQ accumulator (B,H,T,D), then the row
 * sums (B,H,T). Documents (N tokens): lse token-major (N,H); the backward then adds the fp32 dQ
 * (N,H,D), the row sums (N,H) and, with grouped KV heads, the full-head dK and dV (N,H,D; sized
 * in fp32 as cudnn-frontend sizes them). */
static size_t rows(const struct cudnn_sdpa *p)
{
    return p->tokens ? (size_t)p->tokens : (size_t)p->B * p->T;
}

static size_t dq_acc_bytes(const struct cudnn_sdpa *p)
{
    return rows(p) * p->Hq * p->D * sizeof(float);
}

static size_t row_sums_bytes(const struct cudnn_sdpa *p)
{
    return rows(p) * p->Hq * sizeof(float);
}

/* Offsets in the scratch; 0 for a buffer the plan does not use (none starts at 0: the workspace does). */
struct scratch_layout {
    size_t stats, dq_acc, rowsum, dk_full, dv_full, total;
};

static struct scratch_layout layout(const struct cudnn_sdpa *p)
{
    struct scratch_layout l = {0};
    size_t at = ALIGN_UP((size_t)p->workspace);
    at = at ? at : 256;
    if (p->tokens) {
        l.stats = at;
        at += ALIGN_UP(row_sums_bytes(p));
    }
    if (p->bwd) {
        l.dq_acc = at;
        at += ALIGN_UP(dq_acc_bytes(p));
        l.rowsum = at;
        at += ALIGN_UP(row_sums_bytes(p));
        if (p->tokens && p->Hq != p->Hkv) {
            l.dk_full = at;
            at += ALIGN_UP(dq_acc_bytes(p));
            l.dv_full = at;
            at += ALIGN_UP(dq_acc_bytes(p));
        }
    }
    l.total = at;
    return l;
}

size_t cudnn_sdpa_scratch_bytes(const struct cudnn_sdpa *p)
{
    return layout(p).total;
}

float *cudnn_sdpa_docs_stats(const struct cudnn_sdpa *p, void *scratch)
{
    return (float *)((char *)scratch + layout(p).stats);
}

/* Queues the plan. A window plan that cuDNN refuses here aborts (ops have no error path); a
 * document plan is marked unusable instead and false returned, so that its caller takes the
 * built-in kernels (cuDNN checks the pack before it launches anything). */
static bool execute(struct cudnn_sdpa *p, cudaStream_t st, void *workspace, int n, const int64_t *uids, void **ptrs)
{
    struct graph g = {0};
    cudnnBackendDescriptor_t pack = make(&g, CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
    set(&g, pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    set(&g, pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    set(&g, pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    done(&g, pack, "variant pack");
    check(&g, dnn.set_stream(dnn.handle, st), "set stream");
    check(&g, dnn.execute(dnn.handle, p->plan, pack), "execute");
    graph_free(&g);
    if (!g.failed)
        return true;
    bool soft = p->tokens || p->is_tile;
    fprintf(stderr, "cuda attention: cuDNN %s%s: %s%s\n",
            p->is_tile ? "deterministic " : p->tokens ? "document " : "", p->bwd ? "backward" : "forward", g.why,
            soft ? "; using the built-in kernels" : "");
    if (!soft)
        abort();
    pthread_mutex_lock(&plans_mu);
    p->usable = false;
    pthread_mutex_unlock(&plans_mu);
    return false;
}

/* The ids and pointers every call passes, then a document plan's tables. */
#define MAX_IO 24
struct io {
    int n;
    int64_t uids[MAX_IO];
    void *ptrs[MAX_IO];
};

static void io_add(struct io *io, int64_t uid, const void *ptr)
{
    io->uids[io->n] = uid;
    io->ptrs[io->n++] = (void *)ptr;
}

/* What the forward and the backward both pass: q, k, v, out, lse and the scalars (neg, the mask's
 * fill, NULL for a graph without a mask). */
static void io_add_common(struct io *io, const void *q, const void *k, const void *v, const void *out,
                          const float *lse, const float *scale, const float *neg)
{
    io_add(io, U_Q, q);
    io_add(io, U_K, k);
    io_add(io, U_V, v);
    io_add(io, U_O, out);
    io_add(io, U_LSE, lse);
    io_add(io, U_SCALE, scale);
    if (neg)
        io_add(io, U_NEG, neg);
}

/* What every backward passes beyond that: dout, the gradients, the constant one and the row sums. */
static void io_add_grads(struct io *io, const void *dout, void *dq, void *dk, void *dv, const float *one,
                         float *rowsum)
{
    io_add(io, U_DO, dout);
    io_add(io, U_DQ, dq);
    io_add(io, U_DK, dk);
    io_add(io, U_DV, dv);
    io_add(io, U_ONE, one);
    io_add(io, U_ROWSUM, rowsum);
}

static void io_add_docs(struct io *io, const struct cudnn_docs *docs)
{
    io_add(io, U_SEQ_Q, docs->seq);
    io_add(io, U_SEQ_KV, docs->seq);
    io_add(io, U_OFF_Q, docs->off_q);
    io_add(io, U_OFF_KV, docs->off_kv);
    io_add(io, U_OFF_STATS, docs->off_stats);
}

static bool fwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, const struct cudnn_docs *docs, void *out,
                float *lse, const void *q, const void *k, const void *v)
{
    /* cudnn-frontend masks with -inf from cuDNN 9.10 on; the window graphs keep -FLT_MAX */
    float scale = 1.0f / sqrtf((float)p->D), neg = docs ? -INFINITY : -FLT_MAX;
    struct io io = {0};
    io_add_common(&io, q, k, v, out, lse, &scale, &neg);
    if (docs)
        io_add_docs(&io, docs);
    return execute(p, st, scratch, io.n, io.uids, io.ptrs);
}

static bool bwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, const struct cudnn_docs *docs, void *dq,
                void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v, const void *out,
                const float *lse)
{
    struct scratch_layout l = layout(p);
    char *at = scratch;
    /* the accumulator starts from zero (the scratch is shared with other ops) */
    if (cudaMemsetAsync(at + l.dq_acc, 0, dq_acc_bytes(p), st) != cudaSuccess) {
        fprintf(stderr, "cuda attention: cudaMemsetAsync failed\n");
        abort();
    }
    float scale = 1.0f / sqrtf((float)p->D), one = 1.0f, neg = docs ? -INFINITY : -FLT_MAX;
    struct io io = {0};
    io_add_common(&io, q, k, v, out, lse, &scale, &neg);
    io_add_grads(&io, dout, dq, dk, dv, &one, (float *)(at + l.rowsum));
    io_add(&io, U_DQ_ACC, at + l.dq_acc);
    if (docs) {
        io_add_docs(&io, docs);
        if (l.dk_full) {
            io_add(&io, U_DK_FULL, at + l.dk_full);
            io_add(&io, U_DV_FULL, at + l.dv_full);
        }
    }
    return execute(p, st, scratch, io.n, io.uids, io.ptrs);
}

void cudnn_sdpa_fwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, void *out, float *lse, const void *q,
                    const void *k, const void *v)
{
    fwd(p, st, scratch, NULL, out, lse, q, k, v);
}

void cudnn_sdpa_bwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, void *dq, void *dk, void *dv,
                    const void *dout, const void *q, const void *k, const void *v, const void *out, const float *lse)
{
    bwd(p, st, scratch, NULL, dq, dk, dv, dout, q, k, v, out, lse);
}

bool cudnn_sdpa_docs_fwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, const struct cudnn_docs *docs,
                         void *out, const void *q, const void *k, const void *v)
{
    return fwd(p, st, scratch, docs, out, cudnn_sdpa_docs_stats(p, scratch), q, k, v);
}

bool cudnn_sdpa_docs_bwd(struct cudnn_sdpa *p, cudaStream_t st, void *scratch, const struct cudnn_docs *docs,
                         void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k, const void *v,
                         const void *out)
{
    return bwd(p, st, scratch, docs, dq, dk, dv, dout, q, k, v, out, cudnn_sdpa_docs_stats(p, scratch));
}

size_t cudnn_sdpa_workspace_bytes(const struct cudnn_sdpa *p)
{
    return (size_t)p->workspace;
}

bool cudnn_sdpa_tile_f32(const struct cudnn_sdpa *p)
{
    return p->out_f32;
}

bool cudnn_sdpa_tile_bwd(struct cudnn_sdpa *p, cudaStream_t st, void *workspace, float *rowsum, void *dq, void *dk,
                         void *dv, const void *dout, const void *q, const void *k, const void *v, const void *out,
                         const float *lse)
{
    float scale = 1.0f / sqrtf((float)p->D), one = 1.0f, neg = -FLT_MAX;
    struct io io = {0};
    io_add_common(&io, q, k, v, out, lse, &scale, p->tile.causal ? &neg : NULL); /* the others have no mask */
    io_add_grads(&io, dout, dq, dk, dv, &one, rowsum);
    return execute(p, st, workspace, io.n, io.uids, io.ptrs);
}
