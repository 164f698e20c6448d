/* CPU optimizer benchmark (docs/performance.md §2.5): AdamW with fused bf16 output over N parameters on T threads,
 * bare and as the optimizer process runs it (each 8192-element block computed in a staging area
 * and copied into place, for crash safety), beside a plain memcpy of the same arrays on the same
 * threads; the journaled update reading bf16 gradients (runtime.grad_dtype = bf16: each block
 * widened first), with m and v in bf16 (train.optimizer_state = bf16, stochastic rounding), and
 * in 8 bits (train.optimizer_state = 8bit: codes and block scales); reports bytes touched per second.
 * The arrays live in anonymous memory, or (memory = shm) in POSIX shared memory as the job's state
 * does, or (shm-locked) the same with its pages locked (mlock), as the workers' cudaHostRegister
 * pins the master and the gradients but not m and v. The threads claim segments of the blocks in turn,
 * as the optimizer's lanes do (optimizer/segments.h).
 * usage: bench_optim [N_millions=256] [threads=all] [memory=anon|shm|shm-locked] */
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/bf16.h"
#include "optimizer/adamw.h"
#include "optimizer/segments.h"
#include "shm/ctl.h"

struct job {
    float *p, *m, *v, *g, *dst;
    uint16_t *p16, *g16, *m16, *v16;
    uint8_t *m8, *v8, *m_scale, *v_scale;
    size_t n;
    /* the blocks of 8192 elements cut and claimed as the optimizer's lanes claim a chunk's */
    const uint32_t *segment_bounds;
    uint32_t num_segments;
    _Atomic uint32_t *next_segment;
    int what; /* 0 adamw, 1 copy, 2 adamw through a staging block, 3 the same from bf16 gradients,
               * 4 the same with bf16 m and v, 5 with 8-bit m and v */
    enum adamw_isa isa;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Elements [b, e) (b at a block's start, so at an 8-bit scale block's) of the job's operation. */
static void run_range(struct job *j, size_t b, size_t e, float *stage)
{
    struct adamw_step st = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .grad_scale = 1.0f, .step = 3};
    if (j->what == 1) {
        memcpy(j->dst + b, j->p + b, (e - b) * sizeof(float));
        return;
    }
    for (size_t i = b; i < e; i += 8192) {
        size_t n = e - i < 8192 ? e - i : 8192;
        if (!stage) {
            adamw_update(j->isa, &st, j->p + i, j->m + i, j->v + i, j->g + i, j->p16 + i, n);
            continue;
        }
        float *sp = stage, *sm = stage + 8192, *sv = stage + 2 * 8192, *g = j->g + i;
        uint16_t *s16 = (uint16_t *)(stage + 4 * 8192);
        if (j->what == 3) {
            g = stage + 3 * 8192;
            bf16_to_f32_n(g, j->g16 + i, n);
        }
        if (j->what == 5) {
            uint8_t *sm8 = (uint8_t *)sm, *sv8 = sm8 + 8192, *sms = sv8 + 8192, *svs = sms + 8192 / 64;
            st.round_key = adamw_round_key(1234, 3, 0);
            st.round_first = i;
            struct state8 in = {j->m8 + i, j->v8 + i, j->m_scale + i / 64, j->v_scale + i / 64};
            struct state8 out = {sm8, sv8, sms, svs};
            adamw_update_8bit_to(j->isa, &st, j->p + i, in, g, sp, out, s16, n);
            memcpy(in.m_scale, sms, (n + 63) / 64);
            memcpy(in.v_scale, svs, (n + 63) / 64);
            adamw_store_staged(j->p + i, j->m8 + i, j->v8 + i, j->p16 + i, sp, sm8, sv8, s16, n, 1);
            continue;
        }
        if (j->what == 4) {
            uint16_t *sm16 = (uint16_t *)sm, *sv16 = sm16 + 8192;
            st.round_key = adamw_round_key(1234, 3, 0);
            st.round_first = i;
            adamw_update_bf16_to(j->isa, &st, j->p + i, j->m16 + i, j->v16 + i, g, sp, sm16, sv16, s16, n);
            adamw_store_staged(j->p + i, j->m16 + i, j->v16 + i, j->p16 + i, sp, sm16, sv16, s16, n, 2);
            continue;
        }
        adamw_update_to(j->isa, &st, j->p + i, j->m + i, j->v + i, g, sp, sm, sv, s16, n);
        adamw_store_staged(j->p + i, j->m + i, j->v + i, j->p16 + i, sp, sm, sv, s16, n, sizeof(float));
    }
}

/* One thread: claims segments until none is left. */
static void *run(void *arg)
{
    struct job *j = arg;
    float *stage = j->what >= 2 ? malloc(8192 * 4 * sizeof(float) + 8192 * 2) : NULL;
    for (uint32_t k; (k = atomic_fetch_add_explicit(j->next_segment, 1, memory_order_relaxed)) < j->num_segments;) {
        size_t b = (size_t)j->segment_bounds[k] * 8192, e = (size_t)j->segment_bounds[k + 1] * 8192;
        run_range(j, b, e < j->n ? e : j->n, stage);
    }
    free(stage);
    return NULL;
}

static double timed(struct job *base, int threads, int what)
{
    pthread_t tid[256];
    uint32_t bounds[CTL_MAX_SEGMENTS + 1];
    _Atomic uint32_t next_segment = 0;
    struct job j = *base; /* shared by the threads: they differ only in the segments they claim */
    j.what = what;
    j.segment_bounds = bounds;
    j.num_segments = segments_cut((uint32_t)((base->n + 8191) / 8192), threads, CTL_MAX_SEGMENTS, bounds);
    j.next_segment = &next_segment;
    double t0 = now();
    for (int t = 0; t < threads; t++)
        pthread_create(&tid[t], NULL, run, &j);
    for (int t = 0; t < threads; t++)
        pthread_join(tid[t], NULL);
    return now() - t0;
}

enum memory { MEM_ANON, MEM_SHM, MEM_SHM_LOCKED };

/* `count` zeroed elements of `size` bytes in the given memory; exits on failure (a benchmark) */
static void *zeroed(size_t count, size_t size, enum memory memory)
{
    size_t bytes = count * size;
    if (memory == MEM_ANON) {
        void *p = calloc(count, size);
        if (!p)
            exit(1);
        return p;
    }
    static int objects;
    char name[64];
    snprintf(name, sizeof name, "/bench_optim.%d.%d", (int)getpid(), objects++);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) {
        perror("bench_optim: shm_open");
        exit(1);
    }
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    shm_unlink(name);
    close(fd);
    if (p == MAP_FAILED) {
        perror("bench_optim: mmap");
        exit(1);
    }
    memset(p, 0, bytes); /* fault the pages in, as the launcher's initialisation does */
    if (memory == MEM_SHM_LOCKED && mlock(p, bytes) != 0) {
        perror("bench_optim: mlock (RLIMIT_MEMLOCK?)");
        exit(1);
    }
    return p;
}

int main(int argc, char **argv)
{
    size_t n = (size_t)(argc > 1 ? atof(argv[1]) : 256) * 1000000;
    int threads = argc > 2 ? atoi(argv[2]) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    const char *mem_name = argc > 3 ? argv[3] : "anon";
    enum memory mem = !strcmp(mem_name, "shm") ? MEM_SHM : !strcmp(mem_name, "shm-locked") ? MEM_SHM_LOCKED : MEM_ANON;
    if (mem == MEM_ANON && strcmp(mem_name, "anon")) {
        fprintf(stderr, "bench_optim: memory '%s' is none of anon, shm, shm-locked\n", mem_name);
        return 2;
    }
    struct job j = {.n = n, .isa = adamw_isa_detect()};
    j.p = zeroed(n, 4, mem), j.m = zeroed(n, 4, mem), j.v = zeroed(n, 4, mem), j.g = zeroed(n, 4, mem);
    j.dst = zeroed(n, 4, mem), j.p16 = zeroed(n, 2, mem), j.g16 = zeroed(n, 2, mem), j.m16 = zeroed(n, 2, mem);
    j.v16 = zeroed(n, 2, mem), j.m8 = zeroed(n, 1, mem), j.v8 = zeroed(n, 1, mem);
    j.m_scale = zeroed(n / 64 + 1, 1, mem), j.v_scale = zeroed(n / 64 + 1, 1, mem);
    for (size_t i = 0; i < n; i++) {
        j.p[i] = (float)(i % 1000) * 1e-3f;
        j.g[i] = (float)(i % 777) * 1e-4f;
        j.dst[i] = 0;
        j.p16[i] = 0;
        j.g16[i] = f32_to_bf16(j.g[i]);
    }
    double best_adam = 1e30, best_copy = 1e30, best_staged = 1e30, best_bf16 = 1e30, best_state16 = 1e30;
    double best_state8 = 1e30;
    for (int r = 0; r < 3; r++) {
        double a = timed(&j, threads, 0), c = timed(&j, threads, 1), st = timed(&j, threads, 2);
        double sb = timed(&j, threads, 3), s16 = timed(&j, threads, 4), s8 = timed(&j, threads, 5);
        best_state16 = s16 < best_state16 ? s16 : best_state16;
        best_state8 = s8 < best_state8 ? s8 : best_state8;
        best_adam = a < best_adam ? a : best_adam;
        best_copy = c < best_copy ? c : best_copy;
        best_staged = st < best_staged ? st : best_staged;
        best_bf16 = sb < best_bf16 ? sb : best_bf16;
    }
    /* AdamW reads p, m, v, g and writes p, m, v, p16: 30 bytes per parameter; copy moves 8 */
    double adam_gbs = 30.0 * n / best_adam / 1e9, copy_gbs = 8.0 * n / best_copy / 1e9;
    printf("bench_optim: %zu M params, %d threads, isa %s (8-bit state: %s), %s memory\n", n / 1000000, threads,
           adamw_isa_name(j.isa), adamw_isa_name(adamw_isa_8bit(j.isa)), mem_name);
    printf("RESULT optim_params_per_s %.4g\n", n / best_adam);
    printf("RESULT optim_bytes_per_s %.4g\n", adam_gbs * 1e9);
    printf("RESULT copy_bytes_per_s %.4g\n", copy_gbs * 1e9);
    printf("RESULT staged_params_per_s %.4g\n", n / best_staged);
    printf("RESULT staged_bf16_params_per_s %.4g\n", n / best_bf16);
    printf("RESULT staged_bf16_state_params_per_s %.4g\n", n / best_state16);
    printf("RESULT staged_8bit_state_params_per_s %.4g\n", n / best_state8);
    printf("adamw %.2f G params/s = %.1f GB/s touched; journaled %.2f G params/s = %.1f GB/s; memcpy %.1f GB/s; "
           "ratios %.2f %.2f\n",
           n / best_adam / 1e9, adam_gbs, n / best_staged / 1e9, 30.0 * n / best_staged / 1e9, copy_gbs,
           adam_gbs / copy_gbs, 30.0 * n / best_staged / 1e9 / copy_gbs);
    printf("journaled from bf16 gradients %.2f G params/s = %.1f GB/s touched (28 bytes per parameter)\n",
           n / best_bf16 / 1e9, 28.0 * n / best_bf16 / 1e9);
    printf("journaled with bf16 m and v %.2f G params/s = %.1f GB/s touched (22 bytes per parameter)\n",
           n / best_state16 / 1e9, 22.0 * n / best_state16 / 1e9);
    /* 8-bit m and v: 1 byte each read and written, and a scale byte of each per 64 */
    printf("journaled with 8-bit m and v %.2f G params/s = %.1f GB/s touched (18.06 bytes per parameter)\n",
           n / best_state8 / 1e9, 18.0625 * n / best_state8 / 1e9);
    return 0;
}
