/* The optimizer's update loop per thread, as a job streaming the master with bf16 gradients runs it
 * (optimizer/optim.c update_lane): each 8192-element block's bf16 gradient widened, AdamW into the
 * staging block without a bf16 copy, the stage copied into place; fp32 m and v against 8-bit codes
 * and scales (docs/performance.md §12.3). Each thread owns its arrays: in cache (8 blocks updated 60
 * times) and out of cache (8M elements, twice); 1, 8 and T threads (those up to T). Prints ns per element per
 * thread (the slowest thread's) and elements per second in all, the best of 3 rounds.
 * usage: bench_update_loop [T=ncpu-1] [label] */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/bf16.h"
#include "optimizer/adamw.h"

enum { BLOCK = 8192, MAX_THREADS = 256 };

struct lane {
    size_t n;
    int passes;
    bool eightbit;
    float *p, *m, *v;
    uint16_t *g16;
    uint8_t *m8, *v8, *m_scale, *v_scale;
    double seconds;
};

static enum adamw_isa isa;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *zeroed(size_t bytes)
{
    void *p = aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (!p) {
        perror("bench_update_loop");
        exit(1);
    }
    return memset(p, 0, bytes);
}

static void *run_lane(void *arg)
{
    struct lane *l = arg;
    float *g32 = zeroed(BLOCK * 4), *sp = zeroed(BLOCK * 4), *sm = zeroed(BLOCK * 4), *sv = zeroed(BLOCK * 4);
    uint16_t *s16 = zeroed(BLOCK * 2);
    uint8_t *sm8 = zeroed(BLOCK), *sv8 = zeroed(BLOCK), *sms = zeroed(BLOCK / 64), *svs = zeroed(BLOCK / 64);
    struct adamw_step st = {.lr = 1e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                            .grad_scale = 1.0f, .step = 3, .round_key = adamw_round_key(1234, 3, 0)};
    double t0 = now();
    for (int pass = 0; pass < l->passes; pass++)
        for (size_t i = 0; i < l->n; i += BLOCK) {
            size_t n = l->n - i < BLOCK ? l->n - i : BLOCK;
            bf16_to_f32_n(g32, l->g16 + i, n);
            if (l->eightbit) {
                st.round_first = i;
                struct state8 in = {l->m8 + i, l->v8 + i, l->m_scale + i / 64, l->v_scale + i / 64};
                struct state8 out = {sm8, sv8, sms, svs};
                adamw_update_8bit_to(isa, &st, l->p + i, in, g32, sp, out, NULL, n);
                memcpy(in.m_scale, sms, (n + 63) / 64);
                memcpy(in.v_scale, svs, (n + 63) / 64);
                adamw_store_staged(l->p + i, l->m8 + i, l->v8 + i, NULL, sp, sm8, sv8, NULL, n, 1);
            } else { /* the fp32 update computes the copy into the stage; nothing writes it out */
                adamw_update_to(isa, &st, l->p + i, l->m + i, l->v + i, g32, sp, sm, sv, s16, n);
                adamw_store_staged(l->p + i, l->m + i, l->v + i, NULL, sp, sm, sv, NULL, n, sizeof(float));
            }
        }
    l->seconds = now() - t0;
    free(g32), free(sp), free(sm), free(sv), free(s16), free(sm8), free(sv8), free(sms), free(svs);
    return NULL;
}

static void lane_alloc(struct lane *l, size_t n, int passes, bool eightbit)
{
    *l = (struct lane){.n = n, .passes = passes, .eightbit = eightbit, .p = zeroed(n * 4), .g16 = zeroed(n * 2)};
    for (size_t i = 0; i < n; i++) {
        l->p[i] = (float)(i % 1000) * 1e-3f;
        l->g16[i] = f32_to_bf16((float)(i % 777) * 1e-4f);
    }
    if (eightbit) {
        l->m8 = zeroed(n), l->v8 = zeroed(n), l->m_scale = zeroed(n / 64 + 1), l->v_scale = zeroed(n / 64 + 1);
    } else {
        l->m = zeroed(n * 4), l->v = zeroed(n * 4);
    }
}

static void lane_free(struct lane *l)
{
    free(l->p), free(l->g16), free(l->m), free(l->v), free(l->m8), free(l->v8), free(l->m_scale), free(l->v_scale);
}

int main(int argc, char **argv)
{
    int top = argc > 1 ? atoi(argv[1]) : (int)sysconf(_SC_NPROCESSORS_ONLN) - 1;
    const char *label = argc > 2 ? argv[2] : "";
    if (top < 1 || top > MAX_THREADS) {
        fprintf(stderr, "bench_update_loop: threads %d is not within 1..%d\n", top, MAX_THREADS);
        return 2;
    }
    isa = adamw_isa_detect();
    printf("bench_update_loop: isa %s; ns per element per thread (slowest thread), best of 3 rounds\n",
           adamw_isa_name(isa));
    int counts[3], num_counts = 0; /* 1, 8 and top threads, those up to top */
    counts[num_counts++] = 1;
    if (top > 8)
        counts[num_counts++] = 8;
    if (top > 1)
        counts[num_counts++] = top;
    static struct lane lanes[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    for (int cached = 1; cached >= 0; cached--)
        for (int c = 0; c < num_counts; c++) {
            int threads = counts[c];
            for (int eightbit = 0; eightbit < 2; eightbit++) {
                size_t n = cached ? (size_t)8 * BLOCK : (size_t)8 << 20;
                int passes = cached ? 60 : 2;
                for (int t = 0; t < threads; t++)
                    lane_alloc(&lanes[t], n, passes, eightbit);
                double best = 1e30;
                for (int round = 0; round < 3; round++) {
                    for (int t = 0; t < threads; t++)
                        pthread_create(&tid[t], NULL, run_lane, &lanes[t]);
                    double slowest = 0;
                    for (int t = 0; t < threads; t++) {
                        pthread_join(tid[t], NULL);
                        slowest = lanes[t].seconds > slowest ? lanes[t].seconds : slowest;
                    }
                    best = slowest < best ? slowest : best;
                }
                double elements = (double)n * passes;
                printf("%s %-12s %2d threads  %s state  %.3f ns/element/thread  %.2f G elements/s\n", label,
                       cached ? "in cache" : "out of cache", threads, eightbit ? "8-bit" : "fp32 ",
                       best / elements * 1e9, elements * threads / best / 1e9);
                fflush(stdout);
                for (int t = 0; t < threads; t++)
                    lane_free(&lanes[t]);
            }
        }
    return 0;
}
