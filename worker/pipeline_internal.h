/* The worker's state, which every file of its pipeline reads (docs/design.md §1.1: pipeline.c, the
 * step loop, over pipeline_cache.c and pipeline_poster.c, over pipeline_exchange.c, over
 * pipeline_wait.c). Declares no function: each file's header declares what it lends the files above
 * it. Not for use outside worker/pipeline*.c. */
#ifndef SD_PIPELINE_INTERNAL_H
#define SD_PIPELINE_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include "common/data.h"
#include "worker/chunk_cache.h"
#include "worker/model.h"
#include "worker/pipeline.h"

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

#endif
