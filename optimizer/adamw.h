/* AdamW over a contiguous range of fp32 master weights, with the bf16 compute copy written in the
 * same pass (torch.optim.AdamW semantics: decoupled decay, bias-corrected moments, eps added to
 * sqrt(v_hat)). Implementations for AVX-512, AVX2 and scalar are chosen at run time by CPUID; all
 * give bit-identical results (the vector paths do exactly the scalar path's fp32 operations). */
#ifndef SD_ADAMW_H
#define SD_ADAMW_H

#include <stddef.h>
#include <stdint.h>

struct adamw_step {
    float lr;           /* learning rate of this update */
    float beta1, beta2, eps;
    float weight_decay; /* 0 for tensors without decay */
    float grad_scale;   /* clip coefficient (1 when not clipping) */
    int step;           /* update number, from 1, for bias correction */
};

enum adamw_isa { ADAMW_SCALAR = 0, ADAMW_AVX2 = 1, ADAMW_AVX512 = 2 };

/* The best implementation this CPU supports (or the one forced by SLIDEDP_ISA=scalar|avx2|avx512). */
enum adamw_isa adamw_isa_detect(void);
const char *adamw_isa_name(enum adamw_isa isa);

/* Updates p, m, v in place from g (read only) and writes bf16(p) to p16, for n elements. */
void adamw_update(enum adamw_isa isa, const struct adamw_step *s, float *p, float *m, float *v, const float *g,
                  uint16_t *p16, size_t n);
/* The same, reading p, m, v and writing the results elsewhere (the optimizer's staging block). */
void adamw_update_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, const float *m, const float *v,
                     const float *g, float *p_out, float *m_out, float *v_out, uint16_t *p16, size_t n);

/* Sum of squares of x[0..n) in double, in a fixed order (blocks of 8 lanes), so the result does
 * not depend on the ISA or on how callers split work between threads at multiples of 64. */
double sumsq_f32(enum adamw_isa isa, const float *x, size_t n);

/* dst = src (first contribution) or dst += src, elementwise fp32. */
void grad_accumulate(float *dst, const float *src, size_t n, int first);
/* dst = a + b, elementwise fp32. */
void grad_add_to(float *dst, const float *a, const float *b, size_t n);

/* Copies an update computed into a staging block (adamw_update_to) into place. master, m and v take
 * ordinary stores: the update just read their lines, so they are in cache. The bf16 copy takes
 * non-temporal stores, so its lines are not read from memory first (2 of the ~32 bytes per
 * parameter the update moves); a store fence then orders them before what the caller publishes. */
void adamw_store_staged(float *p, float *m, float *v, uint16_t *p16, const float *sp, const float *sm, const float *sv,
                        const uint16_t *s16, size_t n);

#endif
