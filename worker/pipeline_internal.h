/* What the files of the worker's pipeline share (worker/pipeline.c, the step loop;
 * pipeline_cache.c, the chunk cache; pipeline_exchange.c, the exchange between workers;
 * pipeline_poster.c, the gradient poster): the worker's state and the functions each lends the
 * others. Not for use outside worker/pipeline*.c. */
#ifndef SD_PIPELINE_INTERNAL_H
#define SD_PIPELINE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include "common/data.h"
#include "worker/chunk_cache.h"
#include "worker/model.h"
#include "worker/pipeline.h"

#define WAIT_SLICE_MS 100

/* A gradient on its way to the host, or (chunk < 0) a progress mark, for the poster thread. */
struct post {
    int chunk;
    int slot;
    uint32_t seq, step, micro;
    int64_t elem_begin, elem_count; /* the elements of the chunk the slot holds */
    bool direct;        /* copied into the accumulator, not a slot (grads_direct) */
    uint32_t posted;    /* mark: micro-steps of `step` whose gradients are now all posted */
    bool step_done;     /* mark: the rank's part of `step` is complete */
};

/* more than the gradient slots (< RING_CAP) plus the marks between them, and fewer than the
 * copy events (BE_MAX_XFER_SLOTS) */
#define POST_QUEUE 512
_Static_assert(POST_QUEUE < BE_MAX_XFER_SLOTS, "a copy's event is not recorded again while its post is queued");

struct worker {
    struct job_shm shm;
    struct ctl_header *ctl;
    struct proc_slot *slot;
    struct backend be;
    struct model model;
    int rank, G, A, mb, T;
    uint32_t generation;

    struct chunk_cache cache; /* what each device buffer holds (worker/chunk_cache.h) */
    void **cache_dev;         /* the device buffer of each cache entry */
    uint32_t need_version; /* the params version the current pass reads */

    int next_grad_slot;
    int next_direct_event; /* grads_direct: the next copy's completion event */
    uint32_t step, micro;  /* descriptor fields of the current micro-batch */
    uint32_t micro_index;  /* a, the micro-step within the step */
    double loss_sum;       /* masked loss over this rank's micro-steps of the step so far */
    const uint8_t *row_mask_cur;
    /* After a restart, the micro-batch the previous incarnation may have partly posted: its
     * chunks that already reached the optimizer are not posted again. */
    bool recovering;
    uint32_t recover_step;

    /* The poster thread waits for each gradient copy to land, then posts its descriptor, so the
     * main thread keeps queueing compute meanwhile. FIFO: marks follow the posts they cover. */
    pthread_t poster;
    pthread_mutex_t post_mu;
    pthread_cond_t post_more, post_space, post_idle;
    struct post posts[POST_QUEUE];
    unsigned post_head, post_tail;
    bool post_busy;
    /* The device gradient buffers the model handed over (one per chunk at most), with the
     * transfer slot of their last copy. */
    struct grad_buf {
        float *buf;
        int slot;
    } *grad_bufs;
    int num_grad_bufs;

    /* The exchange between workers (shm/ctl.h struct xchg_rank). */
    bool sharded_params, gpu_grads;
    void *window[JOB_MAX_GPUS];  /* every rank's exchange window, as this process addresses it */
    uint64_t next_param_key;     /* the next parameter key this rank takes part in */
    float **grad_shard;          /* per chunk: this rank's shard of the step's gradient sum */
    struct window_layout win;

    struct data_set train, val;
    bool have_val;
    int32_t *tokens, *targets, *correct;
    int64_t *seq_index; /* the micro-batch's sequence indices (micro_batch of them) */
    float *row_scale, *loss_rows;
    uint8_t *mask;
    int32_t *seq_buf;
    int32_t *positions; /* the micro-batch's document positions (B,T) */
    bool documents;     /* document attention: the model gets the positions */
};

/* pipeline.c: the process's phase and heartbeat, and leaving when the job is torn down */
void set_phase(struct worker *w, int phase);
uint32_t begin_wait(struct worker *w, int phase);
void bail_if_stopped(struct worker *w);

/* pipeline_cache.c: the chunk cache and the model's weights callbacks */
void wait_version(struct worker *w, int c);
/* Starts copying elements [lo, lo+n) of chunk c at the pass's version into device memory dst on
 * transfer slot `slot`: from params16, or from the master rounded to bf16 on the way
 * (plan_streams_master); counts the bytes read. */
void fetch_weights(struct worker *w, int slot, void *dst, int c, int64_t lo, int64_t n);
const void *io_weights(void *ctx, int c, int next);
void io_release(void *ctx, int c);

/* pipeline_exchange.c: parameters gathered from and gradients reduced with the peer workers */
void gather_chunk(struct worker *w, void *dst, int c, uint64_t key);
void reduce_scatter_chunk(struct worker *w, int c, float *grad);
int exchange_setup(struct worker *w);

/* pipeline_poster.c: gradients and progress marks on their way to the optimizers */
void post_enqueue(struct worker *w, struct post p);
void post_drain(struct worker *w);
void post_grad(struct worker *w, int c, float *grad, int64_t begin, int64_t count);
void io_grads_reuse(void *ctx, float *grad);
void io_grads_done(void *ctx, int c, float *grad);
bool all_posted(struct worker *w);
bool sent_before_restart(struct worker *w, int c);
void *poster_main(void *arg);
void finish_rank(struct worker *w, uint32_t s);
bool step_logged(struct worker *w, uint32_t s);

#endif
