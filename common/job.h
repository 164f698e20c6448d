/* job.ini: the job description (docs/design.md §2.1 contract keys plus slidedp's own), parsed with inih,
 * overridden by `section.key=value` arguments, validated before anything is created. The parsed
 * struct is plain data with fixed-size strings so that it can live by value in the ctl region. */
#ifndef SD_JOB_H
#define SD_JOB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define JOB_PATH_MAX 1024
#define JOB_MAX_GPUS 64

enum lr_schedule { SCHED_COSINE = 0, SCHED_LINEAR = 1, SCHED_CONSTANT = 2 };
enum device_kind { DEVICE_CUDA = 0, DEVICE_CPU = 1 };
enum export_dtype { EXPORT_BF16 = 0, EXPORT_FP32 = 1 };
enum param_route { ROUTE_AUTO = 0, PARAMS_REPLICATED = 1, PARAMS_SHARDED = 2 };
enum grad_route { GRADS_AUTO = 0, GRADS_CPU = 1, GRADS_GPU = 2 };
enum update_mode { UPDATE_AUTO = 0, UPDATE_AFTER_BACKWARD = 1, UPDATE_DURING_BACKWARD = 2 };
/* The dtype gradients cross to the host in when they go straight into the accumulator. */
enum grad_dtype { GRAD_FP32 = 0, GRAD_BF16 = 1 };
enum act_policy { ACT_AUTO = 0, ACT_KEEP = 1, ACT_RECOMPUTE = 2, ACT_OFFLOAD = 3 };
/* Attention inside a sequence: each document attends to itself with positions from 0 (document), or
 * the whole window is one causal sequence (window); auto: document when the data marks document
 * starts (SFT shards), else window. */
enum attention_kind { ATTENTION_AUTO = 0, ATTENTION_DOCUMENT = 1, ATTENTION_WINDOW = 2 };
/* Where the optimizer state lives when several hosts train one job (docs/design.md §11). */
enum host_state { HOST_STATE_AUTO = 0, HOST_STATE_REPLICATED = 1, HOST_STATE_SHARDED = 2 };
/* The dtype of Adam's m and v on the host (the master weights stay fp32). */
enum optimizer_state { OPTIM_STATE_FP32 = 0, OPTIM_STATE_BF16 = 1, OPTIM_STATE_8BIT = 2, OPTIM_STATE_COUNT };
/* Where workers take the weights they compute with: a bf16 copy the optimizers keep (params16), or
 * the fp32 master itself, rounded to bf16 on the device (docs/design.md §4.3). */
enum weights_source { WEIGHTS_AUTO = 0, WEIGHTS_BF16_COPY = 1, WEIGHTS_MASTER = 2 };
/* Its job.ini spelling. */
static inline const char *optimizer_state_name(enum optimizer_state s)
{
    return s == OPTIM_STATE_8BIT ? "8bit" : s == OPTIM_STATE_BF16 ? "bf16" : "fp32";
}

struct job_config {
    char ini_path[JOB_PATH_MAX]; /* absolute path of job.ini; relative paths in it are resolved against its
                                    folder, those of command-line overrides against the current directory */

    /* [model] */
    char model_path[JOB_PATH_MAX]; /* HF directory */
    bool init_random;              /* init = random | pretrained */

    /* [data] */
    char data_train[JOB_PATH_MAX]; /* file or glob */
    char data_val[JOB_PATH_MAX];   /* empty: none */
    int seq_len;
    bool shuffle;
    int val_every;                 /* steps between validation passes; 0 = only at the end */
    int val_sequences;             /* sequences of the val set per pass; 0 = all */
    enum attention_kind attention;
    double attention_pairs;        /* not a key: with document attention, the part of whole windows'
                                    * causal (query, key) pairs the training data's documents have,
                                    * measured before planning (data_attention_pairs); 0: whole windows */

    /* [train] */
    int micro_batch;
    int grad_accum;
    int steps;
    double lr;
    int warmup;
    enum lr_schedule schedule;
    double min_lr_ratio;
    double weight_decay;
    double beta1, beta2, eps;
    double grad_clip;
    uint64_t seed;
    enum optimizer_state optimizer_state; /* m and v in bf16 or 8 bits, rounded stochastically */

    /* [checkpoint] */
    char ckpt_dir[JOB_PATH_MAX];
    int ckpt_every;
    int ckpt_keep;
    enum export_dtype export_dtype;
    bool resume_auto;
    bool save_final;         /* export final/ and checkpoint the last step (false: benchmarks) */

    /* [runtime] */
    enum device_kind device;
    int gpus;
    int64_t gpu_mem;         /* bytes; 0 = auto */
    int optim_procs;         /* 0 = auto */
    int optim_threads;       /* per optimizer process; 0 = auto */
    int layers_per_chunk;    /* 0 = planner */
    int chunk_buffers;       /* GPU chunk ring depth; 0 = planner */
    int grad_slots;          /* host gradient slots per rank; 0 = planner */
    int logits_rows;         /* rows per cross-entropy chunk; 0 = planner */
    enum act_policy act_policy;
    enum param_route param_route;
    enum grad_route grad_route;
    enum update_mode update_mode;
    int accumulate_on_device;  /* -1 auto, 0 no, 1 yes */
    enum weights_source weights_source;
    enum grad_dtype grad_dtype; /* bf16: gradients sent straight into the accumulator are rounded
                                 * to bf16 on the device (half the copy and the optimizer reads less) */
    char topology[JOB_PATH_MAX]; /* GPU topology description file; empty: probe the host */
    bool deterministic;      /* the same bits on every run (CUDA: no kernel sums with atomics in a
                              * racing order); false: cuDNN's faster attention backward */
    int watchdog_s;          /* a process with no heartbeat for this long is killed and restarted; 0 = never */
    enum host_state host_state; /* several hosts: every host holds the whole state, or 1/H of it */
    double host_link_gbps;   /* GB/s of one host's inter-host link; 0 = the planner's default */

    /* [log] */
    char log_dir[JOB_PATH_MAX];
    int log_every;
};

/* Sets every key to its default. */
void job_config_defaults(struct job_config *job);

/* Parses ini_path, then applies overrides ("section.key=value"), then validates. Relative paths in
 * the file are resolved against the file's folder; relative paths in overrides against the current
 * directory (as the shell that typed them would). Errors name the file, line, key and the accepted
 * values. Nothing is created. */
int job_config_load(const char *ini_path, int num_overrides, char **overrides, struct job_config *job);

/* The name "section.key" of the i-th key of job.ini into out, or NULL past the last: lists every key. */
const char *job_config_key(int i, char *out, size_t len);
/* The value of key "section.key" as job.ini spells it (paths resolved, doubles exact), into out. */
int job_config_value(const struct job_config *job, const char *name, char *out, size_t len);

/* LR for update s (from 1), docs/design.md §9.4. */
double job_lr_at(const struct job_config *job, int step);

/* Sequences in one step's global batch: every rank's micro-batch of every micro-step. */
static inline int64_t job_sequences_per_step(const struct job_config *job)
{
    return (int64_t)job->gpus * job->grad_accum * job->micro_batch;
}

/* Token positions in one step's global batch (the loss mask not applied). */
static inline int64_t job_tokens_per_step(const struct job_config *job)
{
    return job_sequences_per_step(job) * job->seq_len;
}

/* Whether the run uses document attention, given whether its training data marks document starts. */
static inline bool job_document_attention(const struct job_config *job, bool data_marks_documents)
{
    return job->attention == ATTENTION_DOCUMENT || (job->attention == ATTENTION_AUTO && data_marks_documents);
}

struct data_set;
/* Resolves [data] attention against the opened training data (auto: document when it marks document
 * starts) and, for document attention, measures attention_pairs on it; fails (naming the key) on
 * document attention for data that marks no document start. slidedp-launch and slidedp-plan. */
int job_resolve_attention(struct job_config *job, struct data_set *train);

/* Whether the model is validated after update s: there is a validation set, and s is the last
 * step or a multiple of val_every. */
static inline bool job_is_val_step(const struct job_config *job, uint32_t s)
{
    if (!job->data_val[0])
        return false;
    return s == (uint32_t)job->steps || (job->val_every > 0 && s % (uint32_t)job->val_every == 0);
}

/* Resolves a path from job.ini relative to the ini file's folder into out (JOB_PATH_MAX). */
int job_resolve_path(const struct job_config *job, const char *path, char *out);

#endif
