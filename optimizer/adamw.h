/* AdamW over a contiguous range of fp32 master weights, with the bf16 compute copy written in the
 * same pass (torch.optim.AdamW semantics: decoupled decay, bias-corrected moments, eps added to
 * sqrt(v_hat)), with m and v in fp32, in bf16 or in 8 bits. Implementations for AVX-512, AVX2 and scalar are
 * chosen at run time by CPUID; all give bit-identical results (the vector paths do exactly the
 * scalar path's fp32 operations and the same integer rounding). */
#ifndef SD_ADAMW_H
#define SD_ADAMW_H

#include <stddef.h>
#include <stdint.h>

#include "common/layout.h" /* STATE8_BLOCK */

struct adamw_step {
    float lr;           /* learning rate of this update */
    float beta1, beta2, eps;
    float weight_decay; /* 0 for tensors without decay */
    float grad_scale;   /* clip coefficient (1 when not clipping) */
    int step;           /* update number, from 1, for bias correction */
    /* bf16 and 8-bit state only (adamw_update_bf16_to, adamw_update_8bit_to): the rounding stream
     * (adamw_round_key) and the index within the tensor of the call's first element */
    uint64_t round_key, round_first;
};

enum adamw_isa { ADAMW_SCALAR = 0, ADAMW_AVX2 = 1, ADAMW_AVX512 = 2 };

/* The best implementation this CPU supports (or the one forced by SLIDEDP_ISA=scalar|avx2|avx512). */
enum adamw_isa adamw_isa_detect(void);
const char *adamw_isa_name(enum adamw_isa isa);
/* The path adamw_update_8bit_to runs when asked for isa: the next one down where this CPU lacks
 * the AES instructions of its rounding bits (VAES for AVX-512, AES-NI for AVX2). */
enum adamw_isa adamw_isa_8bit(enum adamw_isa isa);

/* Updates p, m, v in place from g (read only) and writes bf16(p) to p16, for n elements. */
void adamw_update(enum adamw_isa isa, const struct adamw_step *s, float *p, float *m, float *v, const float *g,
                  uint16_t *p16, size_t n);
/* The same, reading p, m, v and writing the results elsewhere (the optimizer's staging block). */
void adamw_update_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, const float *m, const float *v,
                     const float *g, float *p_out, float *m_out, float *v_out, uint16_t *p16, size_t n);

/* The same with Adam's m and v in bf16 ([train] optimizer_state = bf16): read widened (exact), the
 * update computed in fp32 exactly as above, the new m and v stored with stochastic rounding
 * (f32_to_bf16_stochastic). Element i takes draw s->round_first + i of SplitMix64 seeded with
 * s->round_key: its bits 0-15 round m, bits 16-31 round v. So the bits depend only on the key and
 * the element, never on the ISA or on how callers split the work. */
void adamw_update_bf16_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, const uint16_t *m,
                          const uint16_t *v, const float *g, float *p_out, uint16_t *m_out, uint16_t *v_out,
                          uint16_t *p16, size_t n);
/* The rounding stream of one tensor's update at one step: a SplitMix64 seed that differs for every
 * (seed, step, tensor); the draw is the element's index within the tensor, so the stream does not
 * depend on the layout either. */
uint64_t adamw_round_key(uint64_t seed, uint32_t step, uint32_t tensor);

/* 8-bit state ([train] optimizer_state = 8bit, docs/design.md §9.6): m and sqrt(v) as one byte per
 * element and one scale byte per STATE8_BLOCK elements. A scale is a power of two (a biased fp32
 * exponent T: the block's largest magnitude is below 2^(T-127)); a code is a small float below it:
 * m as sign + 4 exponent + 3 mantissa bits, sqrt(v) as 4 exponent + 4 mantissa bits, 15 binades
 * below 2^(T-127) and a subnormal step under them. Codes are rounded stochastically with 16 random
 * bits, and a non-zero sqrt(v) never rounds to 0 (m over a zero denominator would be m/eps). */
enum state8_kind { STATE8_M = 0, STATE8_V_ROOT = 1 };

/* Codes of x[0..n) (n <= STATE8_BLOCK, one block), element i rounded with r16[i]; returns the
 * block's scale. */
uint8_t state8_quantize(enum state8_kind kind, const float *x, size_t n, const uint16_t *r16, uint8_t *codes);
/* The value a code stands for under a block's scale (exact). */
float state8_value(enum state8_kind kind, uint8_t code, uint8_t scale);

/* m and v of a range in 8-bit state: codes per element, scales per block. */
struct state8 {
    uint8_t *m, *v, *m_scale, *v_scale;
};

/* The AdamW update with 8-bit m and v: decoded (exact), the update computed in fp32 (sqrt(v) times
 * 1/sqrt(1 - beta2^step), where adamw_update_to divides), the new m and sqrt(v) quantized per block;
 * element i is rounded with 32 bits (bits 0-15 m, bits 16-31 v): with j = s->round_first + i, 32-bit
 * word j mod 4 (little-endian) of four AES rounds (AESENC, round keys 0x243f6a8885a308d3 and
 * 0x13198a2e03707344 in both halves, alternating) of the block whose low 64 bits are j / 4 and high
 * 64 bits s->round_key. s->round_first is a multiple of 4; p and the arrays start at a block's
 * first element; n need not be a multiple of STATE8_BLOCK (the last block is partial). p16 may be
 * NULL: no bf16 copy (the workers stream the master). Bit-identical on every ISA path; the AVX-512
 * one needs VAES and the AVX2 one AES-NI (without them the next path down runs: adamw_isa_8bit). */
void adamw_update_8bit_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, struct state8 in,
                          const float *g, float *p_out, struct state8 out, uint16_t *p16, size_t n);

/* Sum of squares of x[0..n) in double, in a fixed order (blocks of 8 lanes), so the result does
 * not depend on the ISA or on how callers split work between threads at multiples of 64. */
double sumsq_f32(enum adamw_isa isa, const float *x, size_t n);

/* dst = src (first contribution) or dst += src, elementwise fp32. */
void grad_accumulate(float *dst, const float *src, size_t n, int first);
/* dst = a + b, elementwise fp32. */
void grad_add_to(float *dst, const float *a, const float *b, size_t n);

/* Copies an update computed into a staging block (adamw_update_to, adamw_update_bf16_to,
 * adamw_update_8bit_to) into place; m and v have state_size bytes per element (4, 2 for bf16 state,
 * 1 for 8-bit codes, whose scales the caller copies). master, m and v take
 * ordinary stores: the update just read their lines, so they are in cache. The bf16 copy takes
 * non-temporal stores, so its lines are not read from memory first (2 of the ~32 bytes per
 * parameter the update moves); a store fence then orders them before what the caller publishes. p16
 * NULL: no copy is kept (workers stream the master), only master, m and v are stored. */
void adamw_store_staged(float *p, void *m, void *v, uint16_t *p16, const float *sp, const void *sm, const void *sv,
                        const uint16_t *s16, size_t n, size_t state_size);

#endif
