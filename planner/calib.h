/* Calibration: the rates the step-time model (planner/cost.h) turns FLOPs and bytes into seconds.
 * Host rates are measured at plan time and cached per host (calib-<host>.json); GPU rates come
 * from calib-gpu-<host>.json when a GPU host wrote one, else from one H200's numbers (docs/design.md §10.7,
 * docs/performance.md §1). Files live in $SLIDEDP_CACHE_DIR, else ~/.cache/slidedp. Used by the
 * planner and slidedp-plan. */
#ifndef SD_CALIB_H
#define SD_CALIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CALIB_VERSION 3
/* The 8-bit update's rate over the bf16-state update's, both compute-bound (stochastic rounding):
 * the median of 8 bench_optim runs on this tree's (loaded, 2-core) development host, 0.67 to 1.22;
 * the estimate for files without the 8-bit curve (docs/design.md §10.1). */
#define CALIB_8BIT_PER_BF16 0.95
/* Host memory bytes a parameter of adamw_fp32_rate's update touches (a bf16 gradient read; master,
 * m and v read and written) and of the older adamw_rate's (a fp32 gradient, and the bf16 copy
 * written). Priced from the older flavour by its bytes, fp32-state jobs streaming the master with
 * bf16 gradients were predicted 20-24% slow on an H100 host: the update is not bound by its bytes
 * alone (docs/performance.md §12.2). */
#define CALIB_UPDATE_BYTES 26.0
#define CALIB_UPDATE_BYTES_OLD 30.0
#define CALIB_MAX_POINTS 16
#define CALIB_PATH_MAX 1100

/* A rate measured at a few thread counts (calib_thread_points); read between them linearly. */
struct calib_curve {
    int n;
    int threads[CALIB_MAX_POINTS];
    double value[CALIB_MAX_POINTS];
};

/* Elementwise ops of the CPU backend (worker/cpu/backend_cpu.c), costed per element. */
enum cpu_elem {
    ELEM_RMSNORM_FWD = 0, /* per element of (N, C) */
    ELEM_RMSNORM_BWD,
    ELEM_ROPE,            /* per element rotated, forward or backward */
    ELEM_SWIGLU_FWD,
    ELEM_SWIGLU_BWD,
    ELEM_ADD,
    ELEM_XENT,            /* per logit, with the gradient written in place */
    ELEM_EMBED_FWD,
    ELEM_EMBED_BWD,
    ELEM_CONVERT,         /* bf16 -> fp32 weight fetch, per weight */
    ELEM_COPY,            /* fp32 copy (gradients to the host slot, bias rows), per element */
    ELEM_ZERO,            /* fp32 memset, per element */
    ELEM_COUNT
};

/* The CPU backend on one thread (workers run OPENBLAS_NUM_THREADS=1). */
struct calib_cpu {
    /* sgemm(m, n, k) takes 2mnk / gemm_flops + gemm_elem_s * (mk + kn + mn) seconds: the FLOPs
     * at the kernel's peak plus packing the inputs and passing over the output. */
    double gemm_flops;
    double gemm_elem_s;
    /* attention over P = T(T+1)/2 (query, key) pairs per head: B * Hq * P * (pair_dim_s * D + pair_s) */
    double attn_fwd_pair_dim_s, attn_fwd_pair_s;
    double attn_bwd_pair_dim_s, attn_bwd_pair_s;
    double elem_s[ELEM_COUNT];
};

struct calib_host {
    int ncpu;
    struct calib_curve memcpy_bw;  /* bytes/s copied by t threads together (large buffers) */
    struct calib_curve adamw_rate; /* parameters/s updated by t threads together, fp32 m and v, through a
                                    * staging block as optimizer/optim.c does (optimizer/adamw.h), from
                                    * fp32 gradients with the bf16 copy written: CALIB_UPDATE_BYTES_OLD
                                    * a parameter. Only in a file calibrated before adamw_fp32_rate
                                    * (n = 0 otherwise); read through calib_fp32_update_curve and
                                    * calib_fp32_update_bw */
    struct calib_curve adamw_fp32_rate; /* the same from bf16 gradients widened block by block and
                                         * with no bf16 copy written, CALIB_UPDATE_BYTES a parameter:
                                         * the flavour of the two below and of a job streaming the
                                         * master with bf16 gradients */
    struct calib_curve adamw_bf16_rate; /* the same with m and v in bf16 ([train] optimizer_state =
                                         * bf16): bf16 gradients widened, stochastic rounding, no
                                         * bf16 copy written */
    struct calib_curve adamw_8bit_rate; /* the same with 8-bit m and v (optimizer_state = 8bit); a
                                         * file without it (calibrated before the mode existed)
                                         * gets the bf16 curve times CALIB_8BIT_PER_BF16 */
    struct calib_curve sumsq_bf16_rate; /* parameters/s whose bf16 gradient t threads square for the
                                         * norm (widened block by block, summed in double, as
                                         * optimizer/optim.c sumsq_lane); n = 0 in a file without
                                         * it: the squaring is priced by its bytes alone */
    double wake_s;                 /* a futex wake across processes until the sleeper runs */
    struct calib_cpu cpu;
};

/* GPU rates, per GPU. The launcher never initialises CUDA, so these are read from a file that a
 * GPU host writes (a JSON object with any of the field names below and optional "host" and
 * "device" strings; other keys are an error), or assumed. */
struct calib_gpu {
    double h2d_bw;            /* bytes/s host -> device, registered memory, one direction busy */
    double d2h_bw;            /* bytes/s device -> host */
    double bidir_bw;          /* bytes/s each way when both directions run */
    double p2p_bw;            /* bytes/s of a peer copy between two GPUs */
    double gemm_flops;        /* bf16 GEMM FLOP/s on large shapes (smallest dimension >= 1024) */
    double gemm_small_flops;  /* the same at smallest dimension 128 (read linearly in log between) */
    double attn_fwd_flops;    /* causal attention forward FLOP/s (4*B*H*D*T(T+1)/2 FLOPs) */
    double attn_fwdbwd_flops; /* forward + backward FLOP/s (3.5 forwards' FLOPs) */
    double attn_bwd_det_flops; /* the backward alone with runtime.deterministic (2.5 forwards' FLOPs):
                                * cuDNN's deterministic engine in tiles, not the fused kernel */
    double attn_bwd_builtin_flops; /* the same on the built-in kernels (document windows) */
    double attn_det_tile_gain; /* the deterministic backward's speed-up per doubling of its calls' dP
                                * beyond the default bound, where that cuts sequences (cost.h) */
    double mem_bw;            /* device memory bytes/s of elementwise kernels */
    double launch_s;          /* per kernel launch */
    double mem_bytes;         /* device memory used when runtime.gpu_mem = auto */
    double context_bytes;     /* device memory the CUDA context, cuBLAS and kernels take before any
                               * allocation of ours (nvidia-smi: 645-659 MiB on an H200, CUDA 12) */
};

/* Fields of struct calib_gpu by name (the JSON keys), for reading, defaults and reporting. */
struct calib_gpu_field {
    const char *name;
    size_t offset;
    double assumed; /* one H200's value (docs/design.md §10.7) */
    const char *unit;
};
extern const struct calib_gpu_field calib_gpu_fields[];
extern const int calib_gpu_num_fields;

enum calib_source {
    CALIB_ASSUMED = 0,  /* built-in default */
    CALIB_MEASURED = 1, /* measured by this process */
    CALIB_CACHED = 2,   /* measured earlier on this host, read from the cache file */
    CALIB_FILE = 3,     /* read from a GPU calibration file */
    CALIB_PINNED = 4,   /* this host's rates replaced by $SLIDEDP_HOST_CALIB's file */
};

struct calib {
    char hostname[64];
    struct calib_host host;
    int host_source;                 /* CALIB_MEASURED, CALIB_CACHED, CALIB_PINNED or CALIB_FILE (a
                                      * described host; CALIB_ASSUMED in tests) */
    char host_file[CALIB_PATH_MAX];  /* the cache file, "" if none could be written */
    struct calib_gpu gpu;
    uint32_t gpu_from_file;          /* bit i: calib_gpu_fields[i] came from gpu_file */
    char gpu_file[CALIB_PATH_MAX];
    int64_t mem_available;           /* host MemAvailable now, bytes (-1 unknown) */
};

/* The next calib_load measures the host again and rewrites the cache (--recalibrate). */
void calib_force_measure(void);

/* Fills c for this host: the host rates of $SLIDEDP_HOST_CALIB's file when set, else the cached ones
 * (measuring and caching them when missing, stale or forced), the GPU file or defaults, MemAvailable. */
int calib_load(struct calib *c);

/* Fills c for a host described by a calibration file instead of this one (slidedp-plan
 * --host-calib): the host rates and CPU count of a calib-<host>.json written on that host, its
 * memory from an optional "mem_available" (bytes; else unknown), the GPU defaults. */
int calib_load_described(const char *path, struct calib *c);

/* Measures the host rates now (about a second). */
int calib_measure_host(struct calib_host *h);

/* GPU fields all assumed (docs/design.md §10.7). */
void calib_gpu_defaults(struct calib_gpu *g);

/* A curve read at t threads: scaled by t / threads[0] below the fewest threads measured (at that
 * per-thread rate; a described host may give only its core count), clamped above the most; read on
 * its running maximum over thread counts, so more threads never price slower than fewer. */
double calib_curve_at(const struct calib_curve *cv, double t);
/* adamw_fp32_rate, or for a file calibrated before it adamw_rate priced by bytes in its flavour; and
 * the host memory bytes/s the calibrated update moved at t threads (CALIB_UPDATE_BYTES a parameter of
 * adamw_fp32_rate, CALIB_UPDATE_BYTES_OLD of adamw_rate). */
struct calib_curve calib_fp32_update_curve(const struct calib_host *h);
double calib_fp32_update_bw(const struct calib_host *h, double t);
/* The thread counts a host of ncpu CPUs is measured at: 1, 2, 4, ... and ncpu - 2, ncpu - 1, ncpu. */
void calib_thread_points(int ncpu, struct calib_curve *cv);

static inline double calib_gpu_get(const struct calib_gpu *g, int field)
{
    return *(const double *)((const char *)g + calib_gpu_fields[field].offset);
}

#endif
