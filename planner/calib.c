/* Host calibration: measurement, the per-host cache file, the GPU calibration file and its
 * defaults (see calib.h). */
#include "calib.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/bf16.h"
#include "common/err.h"
#include "common/fsutil.h"
#include "common/stop_signals.h"
#include "optimizer/adamw.h"
#include "optimizer/segments.h"
#include "shm/ctl.h"
#include "shm/futex.h"
#include "worker/backend.h"

/* One H200: PCIe and GEMM from docs/design.md §10.7; attention is cuDNN's fused kernels through this
 * backend as docs/performance.md §1 gives them at B=2 T=4096 (FLOPs counted causal, backward
 * 2.5x forward; the built-in kernels, used where cuDNN does not load, reach 290 / 230); the
 * deterministic backward runs cuDNN's deterministic engine in tiles: 362, 383 and 417 TFLOP/s at
 * 4K, 32K and 128K on an H100 (§1), and for document windows the built-in kernels: §1's built-in
 * forward + backward less its forward, 213 at T=4096 and 217 at 32768 (design §10.7); calls of more
 * dP than the default bound gained 3-6% a doubling at 32K and 128K on an H100 (§1.1); the rest are
 * estimates. */
#define GPU_FIELD(name, assumed, unit) {#name, offsetof(struct calib_gpu, name), assumed, unit}
const struct calib_gpu_field calib_gpu_fields[] = {
    GPU_FIELD(h2d_bw, 54e9, "B/s"),
    GPU_FIELD(d2h_bw, 54e9, "B/s"),
    GPU_FIELD(bidir_bw, 42e9, "B/s"),
    GPU_FIELD(p2p_bw, 42e9, "B/s"),
    GPU_FIELD(gemm_flops, 750e12, "FLOP/s"),
    GPU_FIELD(gemm_small_flops, 200e12, "FLOP/s"),
    GPU_FIELD(attn_fwd_flops, 510e12, "FLOP/s"),
    GPU_FIELD(attn_fwdbwd_flops, 440e12, "FLOP/s"),
    GPU_FIELD(attn_bwd_det_flops, 380e12, "FLOP/s"),
    GPU_FIELD(attn_bwd_builtin_flops, 215e12, "FLOP/s"),
    GPU_FIELD(attn_det_tile_gain, 0.045, "x"),
    GPU_FIELD(mem_bw, 3.0e12, "B/s"),
    GPU_FIELD(launch_s, 5e-6, "s"),
    GPU_FIELD(mem_bytes, 80.0 * (1ull << 30), "B"),
    GPU_FIELD(context_bytes, 768.0 * (1ull << 20), "B"),
};
const int calib_gpu_num_fields = (int)(sizeof calib_gpu_fields / sizeof calib_gpu_fields[0]);

static const char *elem_names[ELEM_COUNT] = {
    "rmsnorm_fwd", "rmsnorm_bwd", "rope", "swiglu_fwd", "swiglu_bwd", "add", "xent",
    "embed_fwd",   "embed_bwd",   "convert", "copy",    "zero",
};

static bool force_measure;

void calib_force_measure(void)
{
    force_measure = true;
}

void calib_gpu_defaults(struct calib_gpu *g)
{
    for (int i = 0; i < calib_gpu_num_fields; i++)
        *(double *)((char *)g + calib_gpu_fields[i].offset) = calib_gpu_fields[i].assumed;
}

double calib_curve_at(const struct calib_curve *cv, double t)
{
    SD_ASSERT(cv->n > 0);
    /* below the fewest threads measured, the per-thread rate seen there: one thread is never as
     * fast as the 16 of a described host that gives only its core count */
    if (t <= cv->threads[0])
        return cv->value[0] * t / cv->threads[0];
    /* read on the curve's running maximum: a dip between neighbours at the top (one host measured
     * the 8-bit update at 14, 15 and 16 threads as 4.56, 4.21 and 4.53 G/s) is noise of a shared
     * memory bus, yet priced it made 13 threads look faster than 15, which ran 13% slower
     * (docs/performance.md §12.2); a streaming pass loses nothing from threads it could leave idle, and
     * interference on a shared host only ever slows a pass, so the higher neighbour is the better estimate */
    double below = cv->value[0];
    for (int i = 1; i < cv->n; i++) {
        double at = fmax(below, cv->value[i]);
        if (t <= cv->threads[i]) {
            double f = (t - cv->threads[i - 1]) / (double)(cv->threads[i] - cv->threads[i - 1]);
            return below + f * (at - below);
        }
        below = at;
    }
    return below;
}

struct calib_curve calib_fp32_update_curve(const struct calib_host *h)
{
    if (h->adamw_fp32_rate.n > 0)
        return h->adamw_fp32_rate;
    struct calib_curve cv = h->adamw_rate;
    for (int i = 0; i < cv.n; i++)
        cv.value[i] *= CALIB_UPDATE_BYTES_OLD / CALIB_UPDATE_BYTES;
    return cv;
}

double calib_fp32_update_bw(const struct calib_host *h, double t)
{
    if (h->adamw_fp32_rate.n > 0)
        return CALIB_UPDATE_BYTES * calib_curve_at(&h->adamw_fp32_rate, t);
    return CALIB_UPDATE_BYTES_OLD * calib_curve_at(&h->adamw_rate, t);
}

/* ---- measurement ---- */

static double now_s(void)
{
    return (double)clock_ns() * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

#define MAX_THREADS 1024

/* Median of a few timings. */
static double median(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}

/* Mean of the middle 60% of the timings. On a shared or virtual machine the same call can take
 * one of two speeds for a second or so; a median then jumps between them, while the trimmed mean
 * follows the mix, as a run's steps see it. */
static double trimmed_mean(double *t, int n)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    int drop = n / 5;
    double sum = 0;
    for (int i = drop; i < n - drop; i++)
        sum += t[i];
    return sum / (n - 2 * drop);
}

/* Work over threads that start together and claim segments of it as the optimizer's lanes do
 * (optimizer/segments.h): each copies or updates its blocks, with fp32 m and
 * v (and the bf16 copy written), or with bf16 or 8-bit m and v as their optimizer runs them (bf16
 * gradients widened, stochastic rounding, no copy: the weights streamed from the master), or squares
 * its blocks of a bf16 gradient for the norm. */
enum { PAR_MEMCPY, PAR_ADAMW, PAR_ADAMW_BF16, PAR_ADAMW_8BIT, PAR_SUMSQ_BF16 };
struct par_job {
    int kind;
    int threads;
    size_t n;
    float *a, *b, *c, *d;
    uint16_t *p16;
    enum adamw_isa isa;
    pthread_barrier_t barrier;
    /* the pass's blocks of STAGE_BLOCK elements cut as the optimizer cuts a chunk's, claimed in turn */
    uint32_t num_segments;
    uint32_t *segment_bounds;
    _Atomic uint32_t next_segment;
    double start[MAX_THREADS], end[MAX_THREADS];
    double sink[MAX_THREADS]; /* the sums of squares, kept so that they are computed */
};

struct par_arg {
    struct par_job *job;
    int index;
};

/* As optimizer/optim.c updates: block by block into a staging area, then copied into place. */
#define STAGE_BLOCK 8192

static double par_segment(struct par_job *j, size_t off, size_t n, float *stage);

/* One thread of a pass: claims segments until none is left, as the optimizer's lanes do. */
static void *par_thread(void *arg)
{
    struct par_arg *pa = arg;
    struct par_job *j = pa->job;
    float *stage = malloc(STAGE_BLOCK * 4 * sizeof(float) + STAGE_BLOCK * sizeof(uint16_t));
    SD_ASSERT(stage);
    double sink = 0;
    pthread_barrier_wait(&j->barrier);
    j->start[pa->index] = now_s();
    for (uint32_t k; (k = atomic_fetch_add_explicit(&j->next_segment, 1, memory_order_relaxed)) < j->num_segments;) {
        size_t off = (size_t)j->segment_bounds[k] * STAGE_BLOCK;
        size_t end = (size_t)j->segment_bounds[k + 1] * STAGE_BLOCK;
        sink += par_segment(j, off, (end < j->n ? end : j->n) - off, stage);
    }
    j->end[pa->index] = now_s();
    j->sink[pa->index] = sink;
    free(stage);
    return NULL;
}

/* The elements [off, off + n) of a pass (off at a block's start, so at a scale block's); returns
 * the sum of squares of a squaring pass. */
static double par_segment(struct par_job *j, size_t off, size_t n, float *stage)
{
    double total = 0;
    uint16_t *stage16 = (uint16_t *)(stage + 4 * STAGE_BLOCK);
    struct adamw_step st = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.01f,
                            .grad_scale = 1.0f, .step = 3};
    if (j->kind == PAR_MEMCPY) {
        memcpy(j->b + off, j->a + off, n * sizeof(float));
    } else if (j->kind == PAR_SUMSQ_BF16) { /* as optimizer/optim.c sumsq_lane: widened block by block */
        const uint16_t *g16 = (const uint16_t *)j->c;
        for (size_t i = off; i < off + n; i += STAGE_BLOCK) {
            size_t k = off + n - i < STAGE_BLOCK ? off + n - i : STAGE_BLOCK;
            bf16_to_f32_n(stage, g16 + i, k);
            total += sumsq_f32(j->isa, stage, k);
        }
    } else if (j->kind == PAR_ADAMW) { /* bf16 gradients in the d area; the copy computed, not written */
        const uint16_t *g16 = (const uint16_t *)j->d;
        float *g32 = stage + 3 * STAGE_BLOCK;
        for (size_t i = off; i < off + n; i += STAGE_BLOCK) {
            size_t k = off + n - i < STAGE_BLOCK ? off + n - i : STAGE_BLOCK;
            bf16_to_f32_n(g32, g16 + i, k);
            adamw_update_to(j->isa, &st, j->a + i, j->b + i, j->c + i, g32, stage, stage + STAGE_BLOCK,
                            stage + 2 * STAGE_BLOCK, stage16, k);
            adamw_store_staged(j->a + i, j->b + i, j->c + i, NULL, stage, stage + STAGE_BLOCK,
                               stage + 2 * STAGE_BLOCK, stage16, k, sizeof(float));
        }
    } else if (j->kind == PAR_ADAMW_8BIT) { /* codes and scales in the b area, bf16 gradients in the c area */
        uint8_t *m8 = (uint8_t *)j->b, *v8 = m8 + j->n, *ms = v8 + j->n, *vs = ms + j->n / STATE8_BLOCK;
        uint16_t *g16 = (uint16_t *)j->c;
        uint8_t *sm = (uint8_t *)(stage + STAGE_BLOCK), *sv = sm + STAGE_BLOCK, *sms = sv + STAGE_BLOCK;
        uint8_t *svs = sms + STAGE_BLOCK / STATE8_BLOCK;
        float *g32 = stage + 2 * STAGE_BLOCK;
        st.round_key = adamw_round_key(1, (uint32_t)st.step, 0);
        for (size_t i = off; i < off + n; i += STAGE_BLOCK) {
            size_t k = off + n - i < STAGE_BLOCK ? off + n - i : STAGE_BLOCK, b = i / STATE8_BLOCK;
            bf16_to_f32_n(g32, g16 + i, k);
            st.round_first = i;
            struct state8 in = {m8 + i, v8 + i, ms + b, vs + b}, out = {sm, sv, sms, svs};
            /* no bf16 copy, as the optimizer runs it when the workers stream the master */
            adamw_update_8bit_to(j->isa, &st, j->a + i, in, g32, stage, out, NULL, k);
            memcpy(ms + b, sms, (k + STATE8_BLOCK - 1) / STATE8_BLOCK);
            memcpy(vs + b, svs, (k + STATE8_BLOCK - 1) / STATE8_BLOCK);
            adamw_store_staged(j->a + i, m8 + i, v8 + i, NULL, stage, sm, sv, NULL, k, 1);
        }
    } else { /* m and v in the b area, the gradients in the c area, all bf16 */
        uint16_t *m16 = (uint16_t *)j->b, *v16 = m16 + j->n, *g16 = (uint16_t *)j->c;
        uint16_t *sm = (uint16_t *)(stage + STAGE_BLOCK), *sv = sm + STAGE_BLOCK;
        float *g32 = stage + 2 * STAGE_BLOCK;
        st.round_key = adamw_round_key(1, (uint32_t)st.step, 0);
        for (size_t i = off; i < off + n; i += STAGE_BLOCK) {
            size_t k = off + n - i < STAGE_BLOCK ? off + n - i : STAGE_BLOCK;
            bf16_to_f32_n(g32, g16 + i, k);
            st.round_first = i;
            adamw_update_bf16_to(j->isa, &st, j->a + i, m16 + i, v16 + i, g32, stage, sm, sv, stage16, k);
            adamw_store_staged(j->a + i, m16 + i, v16 + i, NULL, stage, sm, sv, stage16, k, sizeof(uint16_t));
        }
    }
    return total;
}

/* Seconds for the whole parallel pass (first start to last end). */
static double par_run(struct par_job *j)
{
    pthread_t *tid = malloc(sizeof *tid * (size_t)j->threads);
    struct par_arg *args = malloc(sizeof *args * (size_t)j->threads);
    SD_ASSERT(tid && args);
    uint32_t bounds[CTL_MAX_SEGMENTS + 1];
    j->num_segments = segments_cut((uint32_t)((j->n + STAGE_BLOCK - 1) / STAGE_BLOCK), j->threads, CTL_MAX_SEGMENTS,
                                   bounds);
    j->segment_bounds = bounds;
    atomic_store_explicit(&j->next_segment, 0, memory_order_relaxed); /* the threads start after it */
    pthread_barrier_init(&j->barrier, NULL, (unsigned)j->threads);
    for (int i = 0; i < j->threads; i++) {
        args[i] = (struct par_arg){j, i};
        if (pthread_create(&tid[i], NULL, par_thread, &args[i]) != 0)
            SD_ASSERT(!"pthread_create");
    }
    for (int i = 0; i < j->threads; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&j->barrier);
    free(tid);
    free(args);
    double t0 = j->start[0], t1 = j->end[0];
    for (int i = 1; i < j->threads; i++) {
        t0 = fmin(t0, j->start[i]);
        t1 = fmax(t1, j->end[i]);
    }
    return t1 - t0;
}

/* Seconds a pass takes, averaged over as many passes as fill CALIB_PASS_MIN_S (a pass of the
 * faster kernels at 16 threads is 10-30 ms, short enough that one preemption moved a point of a
 * GPU host's curve by 10-30% against its neighbours). */
#define CALIB_PASS_MIN_S 0.1
static double par_pass_s(struct par_job *j)
{
    double total = 0;
    int passes = 0;
    do {
        total += par_run(j);
        passes++;
    } while (total < CALIB_PASS_MIN_S && passes < 64);
    return total / passes;
}

/* A stop signal held by the launcher while it plans (common/stop_signals.h) ends the measurement at
 * its next point rather than seconds later. */
static int stopped(void)
{
    return sd_err("stopped by SIGINT or SIGTERM while this host was measured; nothing was created");
}

/* 1, 2, 4, ... threads, then the counts an optimizer runs with beside one GPU's worker (ncpu - 2
 * while its poster spins, ncpu - 1) and ncpu: memory saturates between the powers of two, and read
 * linearly from 8 to 16 threads the curve put 14 and 15 below what they may measure. */
void calib_thread_points(int ncpu, struct calib_curve *cv)
{
    cv->n = 0;
    for (int t = 1; t < ncpu && cv->n < CALIB_MAX_POINTS - 3; t *= 2)
        cv->threads[cv->n++] = t;
    for (int t = ncpu - 2; t <= ncpu; t++)
        if (t >= 1 && (cv->n == 0 || t > cv->threads[cv->n - 1]))
            cv->threads[cv->n++] = t;
}

static int64_t mem_available(void);

/* memcpy bandwidth and the optimizer's journaled AdamW throughput at 1, 2, 4, ... ncpu threads.
 * The arrays must be far larger than the last-level cache (server CPUs have hundreds of MB of
 * it, and 288 MB of state measured twice the rate a training step sees on an H200 host): 128M
 * parameters (2.3 GB) where memory allows, else 16M. */
static int measure_memory(struct calib_host *h)
{
    size_t n = mem_available() > ((int64_t)16 << 30) ? (size_t)128 << 20 : (size_t)16 << 20;
    float *buf = malloc(n * 4 * sizeof(float));
    uint16_t *p16 = malloc(n * sizeof(uint16_t));
    if (!buf || !p16) {
        free(buf);
        free(p16);
        return sd_err("calibration: out of memory for the %zu MiB test buffers", (n * 18) >> 20);
    }
    /* zeros: AdamW's time does not depend on the values, and this faults the pages in (a GB at a
     * time takes seconds: a stop is seen between pieces) */
    int rc = 0;
    for (size_t off = 0; off < n && !(rc = stop_signal_seen() ? stopped() : 0); off += (size_t)1 << 24) {
        size_t k = n - off < (size_t)1 << 24 ? n - off : (size_t)1 << 24;
        for (int a = 0; a < 4; a++)
            memset(buf + (size_t)a * n + off, 0, k * sizeof(float));
        memset(p16 + off, 0, k * sizeof(uint16_t));
    }
    struct par_job *j = calloc(1, sizeof *j);
    SD_ASSERT(j);
    j->a = buf;
    j->b = buf + n;
    j->c = buf + 2 * n;
    j->d = buf + 3 * n;
    j->p16 = p16;
    j->isa = adamw_isa_detect();
    j->n = n; /* 64 MiB copied, 16M parameters updated */
    struct {
        int kind;
        struct calib_curve *curve;
        double units; /* bytes copied or parameters updated or squared per pass */
    } runs[] = {{PAR_MEMCPY, &h->memcpy_bw, (double)n * sizeof(float)},
                {PAR_ADAMW, &h->adamw_fp32_rate, (double)n},
                {PAR_ADAMW_BF16, &h->adamw_bf16_rate, (double)n},
                {PAR_ADAMW_8BIT, &h->adamw_8bit_rate, (double)n},
                {PAR_SUMSQ_BF16, &h->sumsq_bf16_rate, (double)n}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++)
        calib_thread_points(h->ncpu, runs[k].curve);
    for (int i = 0; i < h->memcpy_bw.n && !rc; i++)
        for (size_t k = 0; k < sizeof runs / sizeof runs[0] && !rc; k++) {
            double t[3];
            j->threads = h->memcpy_bw.threads[i];
            j->kind = runs[k].kind;
            for (int r = 0; r < 3 && !(rc = stop_signal_seen() ? stopped() : 0); r++)
                t[r] = par_pass_s(j);
            runs[k].curve->value[i] = rc ? 0 : runs[k].units / median(t, 3);
        }
    free(j);
    free(buf);
    free(p16);
    return rc;
}

/* Half a futex ping-pong round trip between two processes. */
static int measure_wake(struct calib_host *h)
{
    _Atomic uint32_t *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED)
        return sd_err("calibration: mmap: %s", strerror(errno));
    _Atomic uint32_t *ping = w, *pong = w + 16;
    atomic_store(ping, 0);
    atomic_store(pong, 0);
    enum { ROUNDS = 300 };
    pid_t parent = getpid(), pid = fork();
    if (pid < 0) {
        munmap((void *)w, 4096);
        return sd_err("calibration: fork: %s", strerror(errno));
    }
    if (pid == 0) {
        for (uint32_t i = 1; i <= ROUNDS; i++) {
            while (atomic_load(ping) < i)
                if (futex_wait(ping, i - 1, 1000) == 1 && getppid() != parent)
                    _exit(1);
            atomic_store(pong, i);
            futex_wake_all(pong);
        }
        _exit(0);
    }
    double t0 = now_s();
    for (uint32_t i = 1; i <= ROUNDS; i++) {
        atomic_store(ping, i);
        futex_wake_all(ping);
        while (atomic_load(pong) < i)
            futex_wait(pong, i - 1, 1000);
    }
    h->wake_s = (now_s() - t0) / (2.0 * ROUNDS);
    waitpid(pid, NULL, 0);
    munmap((void *)w, 4096);
    return 0;
}

/* Buffers for timing the CPU backend's ops. */
struct op_bench {
    struct backend be;
    float *x[6];
    uint16_t *x16;
    int32_t *tokens;
    size_t cap;
};

#define CPU_REPS 25

/* One timed backend call: a matmul (forward or backward) of a shape, causal attention (B = 1, 4
 * query and 2 KV heads) at a sequence length and head dimension, or an elementwise op. */
enum { ITEM_MATMUL, ITEM_ATTENTION, ITEM_ELEM };
struct bench_item {
    int kind;
    int N, IC, OC; /* matmul */
    int T, D;      /* attention */
    bool backward;
    int elem;      /* enum cpu_elem */
    double t[CPU_REPS];
};

enum { EL_N = 1024, EL_C = 256, EL_V = 1024, ATT_H = 4, ATT_KV = 2 };

/* Attention at head dimension D keeps its output and lse in its own region, so that the
 * backward reads the forward of the same shape (exp() stays finite). */
static void attention_bufs(struct op_bench *b, int D, float **out, float **lse)
{
    size_t region = D / 16 * (b->cap / 16); /* D = 16, 32, 64 */
    *out = b->x[3] + region;
    *lse = b->x[5] + region;
}

static void run_item(struct op_bench *b, const struct bench_item *it)
{
    const struct backend_ops *o = b->be.ops;
    struct backend *be = &b->be;
    size_t n = (size_t)EL_N * EL_C, half = b->cap / 2;
    float *x0 = b->x[0], *x1 = b->x[1], *x2 = b->x[2], *x3 = b->x[3], *w = b->x[4], *r = b->x[5];
    if (it->kind == ITEM_MATMUL) {
        if (it->backward)
            o->matmul_bwd(be, x0, x3, NULL, x1, x2, w, it->N, it->IC, it->OC, false);
        else
            o->matmul_fwd(be, x0, x1, w, NULL, it->N, it->IC, it->OC);
        return;
    }
    if (it->kind == ITEM_ATTENTION) {
        float *out, *lse, *q = x1, *k = x2, *v = x2 + half, *dout = x3 + half;
        attention_bufs(b, it->D, &out, &lse);
        if (it->backward)
            o->attention_bwd(be, x0, w, w + half, dout, q, k, v, out, lse, NULL, 1, it->T, ATT_H, ATT_KV, it->D);
        else
            o->attention_fwd(be, out, lse, q, k, v, NULL, 1, it->T, ATT_H, ATT_KV, it->D);
        return;
    }
    switch (it->elem) {
    case ELEM_RMSNORM_FWD: /* rstd kept for the backward */
        o->rmsnorm_fwd(be, x0, r + b->cap / 8 * 3, x1, w, EL_N, EL_C, 1e-6f);
        break;
    case ELEM_RMSNORM_BWD:
        o->rmsnorm_bwd(be, x0, x3, x2, x1, w, r + b->cap / 8 * 3, EL_N, EL_C, true);
        break;
    case ELEM_ROPE: /* cos/sin tables (T, D/2) */
        o->rope_fwd(be, x0, x2 + half, x2 + half + EL_N * 64, NULL, 1, EL_N, EL_C / 128, 128);
        break;
    case ELEM_SWIGLU_FWD:
        o->swiglu_fwd(be, x0, x1, x2, n);
        break;
    case ELEM_SWIGLU_BWD:
        o->swiglu_bwd(be, x0, x3 + half, x2, x1, x2, n);
        break;
    case ELEM_ADD:
        o->add_inplace(be, x0, x1, n);
        break;
    case ELEM_XENT: /* n / V rows of V logits, overwritten with their gradient (finite again) */
        o->cross_entropy(be, x0, r + half, NULL, b->tokens, x2, (int)(n / EL_V), EL_V);
        break;
    case ELEM_EMBED_FWD:
        o->embedding_fwd(be, x0, b->tokens, x1, EL_N, EL_C);
        break;
    case ELEM_EMBED_BWD:
        o->embedding_bwd(be, x3 + half, x1, b->tokens, EL_N, EL_C);
        break;
    case ELEM_CONVERT:
        o->fetch_weights_async(be, 0, x0, b->x16, n);
        break;
    case ELEM_COPY:
        o->send_grads_async(be, 0, x0, x1, n);
        break;
    case ELEM_ZERO:
        o->memset0(be, x0, n * sizeof(float));
        break;
    }
}

/* sgemm elements touched and FLOPs of one backend matmul call (the gemms the CPU backend runs). */
static void matmul_cost_terms(const struct bench_item *it, double *flops, double *elems)
{
    double N = it->N, IC = it->IC, OC = it->OC;
    if (!it->backward) {
        *flops = 2 * N * IC * OC;
        *elems = N * IC + IC * OC + N * OC;
    } else { /* dinp (N,IC) = dout (N,OC) @ w ; dw (OC,IC) += dout^T @ inp */
        *flops = 4 * N * IC * OC;
        *elems = (N * OC + OC * IC + N * IC) + (OC * N + N * IC + OC * IC);
    }
}

/* Least-squares fit of t = flops * x + elems * y over the matmul items, in relative error. */
static void fit_gemm(const struct bench_item *items, const double *cost, int n, struct calib_cpu *cpu)
{
    double s11 = 0, s12 = 0, s22 = 0, r1 = 0, r2 = 0;
    for (int i = 0; i < n; i++) {
        if (items[i].kind != ITEM_MATMUL)
            continue;
        double f, e;
        matmul_cost_terms(&items[i], &f, &e);
        f /= cost[i];
        e /= cost[i];
        s11 += f * f;
        s12 += f * e;
        s22 += e * e;
        r1 += f;
        r2 += e;
    }
    double det = s11 * s22 - s12 * s12, x = (r1 * s22 - r2 * s12) / det, y = (s11 * r2 - s12 * r1) / det;
    if (!(y > 0)) { /* no measurable packing cost: FLOPs alone */
        y = 0;
        x = r1 / s11;
    }
    cpu->gemm_flops = 1.0 / x;
    cpu->gemm_elem_s = y;
}

/* Per (query, key) pair and head: t = a*D + b, least squares over the head dimensions. */
static void fit_attention(const struct bench_item *items, const double *cost, int n, bool backward, double *a,
                          double *b)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0, m = 0;
    for (int i = 0; i < n; i++) {
        if (items[i].kind != ITEM_ATTENTION || items[i].backward != backward)
            continue;
        double pairs = (double)ATT_H * items[i].T * (items[i].T + 1) / 2.0, x = items[i].D, y = cost[i] / pairs;
        sx += x;
        sy += y;
        sxx += x * x;
        sxy += x * y;
        m++;
    }
    *a = (m * sxy - sx * sy) / (m * sxx - sx * sx);
    *b = (sy - *a * sx) / m;
    if (!(*a > 0) || *b < 0) { /* proportional to D alone */
        *a = sxy / sxx;
        *b = 0;
    }
}

/* Times every item CPU_REPS times, interleaved over about a second, so that a burst of other
 * load, or a slow spell of the machine, hits every op alike instead of skewing one. */
static int measure_cpu_backend(struct calib_cpu *cpu)
{
    struct bench_item items[] = {
        {.kind = ITEM_MATMUL, .N = 2048, .IC = 64, .OC = 64},
        {.kind = ITEM_MATMUL, .N = 2048, .IC = 64, .OC = 64, .backward = true},
        {.kind = ITEM_MATMUL, .N = 2048, .IC = 64, .OC = 256},
        {.kind = ITEM_MATMUL, .N = 2048, .IC = 256, .OC = 64, .backward = true},
        {.kind = ITEM_MATMUL, .N = 1024, .IC = 256, .OC = 256},
        {.kind = ITEM_MATMUL, .N = 1024, .IC = 256, .OC = 256, .backward = true},
        {.kind = ITEM_MATMUL, .N = 512, .IC = 512, .OC = 1024},
        {.kind = ITEM_MATMUL, .N = 512, .IC = 1024, .OC = 512, .backward = true},
        {.kind = ITEM_ATTENTION, .T = 128, .D = 16},
        {.kind = ITEM_ATTENTION, .T = 128, .D = 32},
        {.kind = ITEM_ATTENTION, .T = 128, .D = 64},
        {.kind = ITEM_ATTENTION, .T = 128, .D = 16, .backward = true},
        {.kind = ITEM_ATTENTION, .T = 128, .D = 32, .backward = true},
        {.kind = ITEM_ATTENTION, .T = 128, .D = 64, .backward = true},
    };
    enum { NUM_FIXED = sizeof items / sizeof items[0] };
    struct bench_item all[NUM_FIXED + ELEM_COUNT];
    memcpy(all, items, sizeof items);
    for (int op = 0; op < ELEM_COUNT; op++)
        all[NUM_FIXED + op] = (struct bench_item){.kind = ITEM_ELEM, .elem = op};
    int n = NUM_FIXED + ELEM_COUNT;

    struct op_bench *b = calloc(1, sizeof *b);
    if (!b || backend_cpu_init(&b->be) != 0) {
        free(b);
        return sd_err("calibration: cannot start the CPU backend");
    }
    b->cap = (size_t)1 << 20; /* floats per buffer: covers every shape above */
    int fail = 0;
    for (int i = 0; i < 6; i++)
        fail |= !(b->x[i] = b->be.ops->alloc(&b->be, b->cap * sizeof(float)));
    b->x16 = malloc(b->cap * sizeof(uint16_t));
    b->tokens = malloc(b->cap * sizeof(int32_t));
    fail |= !b->x16 || !b->tokens;
    if (!fail) {
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (int i = 0; i < 6; i++)
            for (size_t k = 0; k < b->cap; k++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                b->x[i][k] = (float)((s >> 40) & 0xffff) / 65536.0f * 0.2f - 0.1f;
            }
        for (size_t k = 0; k < b->cap; k++) {
            b->x16[k] = (uint16_t)(0x3c00 + (k & 0xff));
            b->tokens[k] = (int32_t)(k * 7 % EL_V);
        }
        openblas_set_num_threads(1);
        for (int i = 0; i < n; i++) /* warm caches and scratch; forwards before their backwards */
            run_item(b, &all[i]);
        for (int r = 0; r < CPU_REPS && !fail; r++)
            for (int i = 0; i < n && !(fail = stop_signal_seen() ? 2 : 0); i++) {
                double t0 = now_s();
                run_item(b, &all[i]);
                all[i].t[r] = now_s() - t0;
            }
    }
    if (!fail) {
        double cost[NUM_FIXED + ELEM_COUNT];
        for (int i = 0; i < n; i++)
            cost[i] = trimmed_mean(all[i].t, CPU_REPS);
        fit_gemm(all, cost, n, cpu);
        fit_attention(all, cost, n, false, &cpu->attn_fwd_pair_dim_s, &cpu->attn_fwd_pair_s);
        fit_attention(all, cost, n, true, &cpu->attn_bwd_pair_dim_s, &cpu->attn_bwd_pair_s);
        for (int op = 0; op < ELEM_COUNT; op++)
            cpu->elem_s[op] = cost[NUM_FIXED + op] / ((double)EL_N * EL_C);
    }
    for (int i = 0; i < 6; i++)
        if (b->x[i])
            b->be.ops->free(&b->be, b->x[i]);
    free(b->x16);
    free(b->tokens);
    backend_cpu_free(&b->be);
    free(b);
    return fail == 2 ? stopped() : fail ? sd_err("calibration: out of memory") : 0;
}

int calib_measure_host(struct calib_host *h)
{
    memset(h, 0, sizeof *h);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    h->ncpu = ncpu < 1 ? 1 : ncpu > MAX_THREADS ? MAX_THREADS : (int)ncpu;
    if (measure_memory(h) != 0 || measure_wake(h) != 0 || measure_cpu_backend(&h->cpu) != 0)
        return -1;
    return 0;
}

/* ---- files ---- */

static void cache_dir(char *out, size_t len)
{
    const char *d = getenv("SLIDEDP_CACHE_DIR");
    if (d && d[0]) {
        snprintf(out, len, "%s", d);
        return;
    }
    const char *home = getenv("HOME");
    snprintf(out, len, "%s/.cache/slidedp", home && home[0] ? home : "/tmp");
}

static cJSON *curve_json(const struct calib_curve *cv)
{
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < cv->n; i++) {
        cJSON *p = cJSON_CreateArray();
        cJSON_AddItemToArray(p, cJSON_CreateNumber(cv->threads[i]));
        cJSON_AddItemToArray(p, cJSON_CreateNumber(cv->value[i]));
        cJSON_AddItemToArray(a, p);
    }
    return a;
}

static bool curve_parse(const cJSON *a, struct calib_curve *cv)
{
    int n = cJSON_GetArraySize(a);
    if (!cJSON_IsArray(a) || n < 1 || n > CALIB_MAX_POINTS)
        return false;
    cv->n = n;
    for (int i = 0; i < n; i++) {
        const cJSON *p = cJSON_GetArrayItem(a, i);
        const cJSON *t = cJSON_GetArrayItem(p, 0), *v = cJSON_GetArrayItem(p, 1);
        if (!cJSON_IsNumber(t) || !cJSON_IsNumber(v) || !(v->valuedouble > 0) ||
            (i > 0 && t->valueint <= cv->threads[i - 1]))
            return false;
        cv->threads[i] = t->valueint;
        cv->value[i] = v->valuedouble;
    }
    return true;
}

/* The fp32 update's curve in either flavour: a file from before adamw_fp32_rate has adamw_rate. */
static bool fp32_update_parse(const cJSON *o, struct calib_host *h)
{
    if (curve_parse(cJSON_GetObjectItemCaseSensitive(o, "adamw_fp32_rate"), &h->adamw_fp32_rate))
        return true;
    h->adamw_fp32_rate.n = 0;
    return curve_parse(cJSON_GetObjectItemCaseSensitive(o, "adamw_rate"), &h->adamw_rate);
}

static bool num_field(const cJSON *o, const char *key, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || !isfinite(v->valuedouble))
        return false;
    *out = v->valuedouble;
    return true;
}

static int write_text(const char *path, const char *text)
{
    char tmp[CALIB_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp-%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f)
        return sd_err("%s: %s", tmp, strerror(errno));
    bool ok = fputs(text, f) >= 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return sd_err("%s: cannot write", path);
    }
    return 0;
}

static int save_host(const char *path, const char *hostname, const struct calib_host *h)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "version", CALIB_VERSION);
    cJSON_AddStringToObject(o, "host", hostname);
    cJSON_AddNumberToObject(o, "ncpu", h->ncpu);
    cJSON_AddNumberToObject(o, "measured_unix", (double)time(NULL));
    cJSON_AddItemToObject(o, "memcpy_bw", curve_json(&h->memcpy_bw));
    if (h->adamw_rate.n > 0) /* a host file written before adamw_fp32_rate, saved again */
        cJSON_AddItemToObject(o, "adamw_rate", curve_json(&h->adamw_rate));
    if (h->adamw_fp32_rate.n > 0)
        cJSON_AddItemToObject(o, "adamw_fp32_rate", curve_json(&h->adamw_fp32_rate));
    cJSON_AddItemToObject(o, "adamw_bf16_rate", curve_json(&h->adamw_bf16_rate));
    cJSON_AddItemToObject(o, "adamw_8bit_rate", curve_json(&h->adamw_8bit_rate));
    cJSON_AddItemToObject(o, "sumsq_bf16_rate", curve_json(&h->sumsq_bf16_rate));
    cJSON_AddNumberToObject(o, "wake_s", h->wake_s);
    cJSON *c = cJSON_AddObjectToObject(o, "cpu_backend");
    cJSON_AddNumberToObject(c, "gemm_flops", h->cpu.gemm_flops);
    cJSON_AddNumberToObject(c, "gemm_elem_s", h->cpu.gemm_elem_s);
    cJSON_AddNumberToObject(c, "attn_fwd_pair_dim_s", h->cpu.attn_fwd_pair_dim_s);
    cJSON_AddNumberToObject(c, "attn_fwd_pair_s", h->cpu.attn_fwd_pair_s);
    cJSON_AddNumberToObject(c, "attn_bwd_pair_dim_s", h->cpu.attn_bwd_pair_dim_s);
    cJSON_AddNumberToObject(c, "attn_bwd_pair_s", h->cpu.attn_bwd_pair_s);
    for (int i = 0; i < ELEM_COUNT; i++) {
        char key[48];
        snprintf(key, sizeof key, "%s_s", elem_names[i]);
        cJSON_AddNumberToObject(c, key, h->cpu.elem_s[i]);
    }
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    SD_ASSERT(text);
    int rc = write_text(path, text);
    free(text);
    return rc;
}

/* Reads a cache file written by save_host for this host and CPU count (0: the file's); false if
 * absent or stale. o_out (may be NULL) receives the parsed file, for the caller to free. */
static bool load_host(const char *path, int ncpu, struct calib_host *h, cJSON **o_out)
{
    char *text = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    if (len > 0 && len < (1 << 20) && (text = malloc((size_t)len + 1)) && fread(text, 1, (size_t)len, f) == (size_t)len)
        text[len] = 0;
    else {
        free(text);
        text = NULL;
    }
    fclose(f);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!o)
        return false;
    memset(h, 0, sizeof *h);
    double version = 0, n = 0;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "cpu_backend");
    struct calib_cpu *cpu = &h->cpu;
    bool ok = num_field(o, "version", &version) && version == CALIB_VERSION && num_field(o, "ncpu", &n) && n >= 1 &&
              n <= MAX_THREADS && (ncpu == 0 || (int)n == ncpu) && curve_parse(cJSON_GetObjectItemCaseSensitive(o, "memcpy_bw"), &h->memcpy_bw) &&
              fp32_update_parse(o, h) &&
              curve_parse(cJSON_GetObjectItemCaseSensitive(o, "adamw_bf16_rate"), &h->adamw_bf16_rate) &&
              num_field(o, "wake_s", &h->wake_s) && cJSON_IsObject(c) && num_field(c, "gemm_flops", &cpu->gemm_flops) &&
              cpu->gemm_flops > 0 && num_field(c, "gemm_elem_s", &cpu->gemm_elem_s) &&
              num_field(c, "attn_fwd_pair_dim_s", &cpu->attn_fwd_pair_dim_s) &&
              num_field(c, "attn_fwd_pair_s", &cpu->attn_fwd_pair_s) &&
              num_field(c, "attn_bwd_pair_dim_s", &cpu->attn_bwd_pair_dim_s) &&
              num_field(c, "attn_bwd_pair_s", &cpu->attn_bwd_pair_s);
    for (int i = 0; ok && i < ELEM_COUNT; i++) {
        char key[48];
        snprintf(key, sizeof key, "%s_s", elem_names[i]);
        ok = num_field(c, key, &cpu->elem_s[i]);
    }
    if (ok && !curve_parse(cJSON_GetObjectItemCaseSensitive(o, "adamw_8bit_rate"), &h->adamw_8bit_rate)) {
        h->adamw_8bit_rate = h->adamw_bf16_rate; /* calibrated before 8-bit state existed */
        for (int i = 0; i < h->adamw_8bit_rate.n; i++)
            h->adamw_8bit_rate.value[i] *= CALIB_8BIT_PER_BF16;
    }
    if (ok && !curve_parse(cJSON_GetObjectItemCaseSensitive(o, "sumsq_bf16_rate"), &h->sumsq_bf16_rate))
        h->sumsq_bf16_rate.n = 0; /* calibrated before it was measured: the squaring priced by its bytes */
    h->ncpu = (int)n;
    if (o_out)
        *o_out = o;
    else
        cJSON_Delete(o);
    return ok;
}

/* GPU fields present in the file replace the defaults; anything else in it is an error. */
static int load_gpu(const char *path, struct calib *c)
{
    calib_gpu_defaults(&c->gpu);
    c->gpu_from_file = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    char text[8192];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = 0;
    cJSON *o = cJSON_Parse(text);
    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        return sd_err("%s: not a JSON object of GPU rates", path);
    }
    for (const cJSON *it = o->child; it; it = it->next) {
        int i = 0;
        while (i < calib_gpu_num_fields && strcmp(it->string, calib_gpu_fields[i].name) != 0)
            i++;
        if (!strcmp(it->string, "host") || !strcmp(it->string, "device"))
            continue;
        if (i == calib_gpu_num_fields || !cJSON_IsNumber(it) || !(it->valuedouble > 0)) {
            sd_err("%s: '%s' is not a known GPU rate with a positive value", path, it->string);
            cJSON_Delete(o);
            return -1;
        }
        *(double *)((char *)&c->gpu + calib_gpu_fields[i].offset) = it->valuedouble;
        c->gpu_from_file |= 1u << i;
    }
    cJSON_Delete(o);
    snprintf(c->gpu_file, sizeof c->gpu_file, "%s", path);
    return 0;
}

static int64_t mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -1;
    char line[256];
    int64_t kb = -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "MemAvailable:", 13)) {
            kb = strtoll(line + 13, NULL, 10);
            break;
        }
    fclose(f);
    return kb < 0 ? -1 : kb * 1024;
}

int calib_load(struct calib *c)
{
    memset(c, 0, sizeof *c);
    if (gethostname(c->hostname, sizeof c->hostname - 1) != 0 || !c->hostname[0])
        snprintf(c->hostname, sizeof c->hostname, "localhost");
    for (char *p = c->hostname; *p; p++)
        if (*p == '/')
            *p = '_';
    c->mem_available = mem_available();
    char dir[CALIB_PATH_MAX - 128], path[CALIB_PATH_MAX];
    cache_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/calib-gpu-%s.json", dir, c->hostname);
    if (load_gpu(path, c) != 0)
        return -1;
    /* Rates pinned by a host calibration file: plans that do not depend on how fast or how busy this
     * machine is (the test suite's, or a fleet planned as one reference host); --recalibrate still
     * measures. The cores planned for and the memory checked stay this host's. */
    const char *pinned = getenv("SLIDEDP_HOST_CALIB");
    if (pinned && pinned[0] && !force_measure) {
        if (!load_host(pinned, 0, &c->host, NULL))
            return sd_err("%s ($SLIDEDP_HOST_CALIB): not a host calibration file of version %d (a calib-<host>.json "
                          "the planner writes)",
                          pinned, CALIB_VERSION);
        c->host_source = CALIB_PINNED;
        snprintf(c->host_file, sizeof c->host_file, "%s", pinned);
        return 0;
    }
    snprintf(path, sizeof path, "%s/calib-%s.json", dir, c->hostname);
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    if (!force_measure && load_host(path, ncpu < 1 ? 1 : ncpu > MAX_THREADS ? MAX_THREADS : (int)ncpu, &c->host, NULL)) {
        c->host_source = CALIB_CACHED;
        snprintf(c->host_file, sizeof c->host_file, "%s", path);
        return 0;
    }
    force_measure = false;
    if (calib_measure_host(&c->host) != 0)
        return -1;
    c->host_source = CALIB_MEASURED;
    /* A host we cannot cache on is measured again next time; that costs a second, not the job. */
    if (fs_mkdir_p(dir, 0755) == 0 && save_host(path, c->hostname, &c->host) == 0)
        snprintf(c->host_file, sizeof c->host_file, "%s", path);
    return 0;
}

int calib_load_described(const char *path, struct calib *c)
{
    memset(c, 0, sizeof *c);
    calib_gpu_defaults(&c->gpu);
    cJSON *o = NULL;
    bool ok = load_host(path, 0, &c->host, &o);
    double mem = -1;
    const cJSON *host = o ? cJSON_GetObjectItemCaseSensitive(o, "host") : NULL;
    if (ok && cJSON_GetObjectItemCaseSensitive(o, "mem_available"))
        ok = num_field(o, "mem_available", &mem) && mem > 0;
    snprintf(c->hostname, sizeof c->hostname, "%s", cJSON_IsString(host) ? host->valuestring : "described");
    cJSON_Delete(o);
    if (!ok)
        return sd_err("%s: not a host calibration file of version %d (a calib-<host>.json the planner writes, with "
                      "an optional positive mem_available)",
                      path, CALIB_VERSION);
    c->host_source = CALIB_FILE;
    snprintf(c->host_file, sizeof c->host_file, "%s", path);
    c->mem_available = (int64_t)mem;
    return 0;
}
