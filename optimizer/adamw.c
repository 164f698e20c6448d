/* Vectorised AdamW with fused bf16 output, gradient accumulation and sum of squares; scalar, AVX2
 * and AVX-512 paths chosen at run time. Every path performs the same fp32 operations in the same
 * order (no FMA: the build uses -ffp-contract=off here), so results are bit-identical across
 * ISAs and across how the work is split.
 *
 * bf16 state (train.optimizer_state = bf16) rounds m and v stochastically, not to nearest: with
 * beta2 = 0.999, v * beta2 moves v by less than half a bf16 ulp, so rounded to nearest v would never
 * decay; stochastic rounding stores each value exactly on average. Its bits come from a counter
 * (SplitMix64 draw of the element's index, keyed by seed, step and tensor), not from a generator's
 * state, so a crashed optimizer's successor recomputes a block with the same bits. 8-bit state
 * takes its bits from AES rounds of the same counter (q8_draw), cheaper in its vector paths. */
#include "adamw.h"

#include <immintrin.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/rng.h"

/* The AVX-512 path's instruction sets: F, BW (byte and word conversions) and DQ (vpmullq). */
#define AVX512_TARGET "avx512f,avx512bw,avx512dq"

enum adamw_isa adamw_isa_detect(void)
{
    const char *force = getenv("SLIDEDP_ISA");
    __builtin_cpu_init();
    bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq");
    bool has2 = __builtin_cpu_supports("avx2");
    if (force) {
        if (!strcmp(force, "scalar"))
            return ADAMW_SCALAR;
        if (!strcmp(force, "avx2") && has2)
            return ADAMW_AVX2;
        if (!strcmp(force, "avx512") && has512)
            return ADAMW_AVX512;
    }
    return has512 ? ADAMW_AVX512 : has2 ? ADAMW_AVX2 : ADAMW_SCALAR;
}

const char *adamw_isa_name(enum adamw_isa isa)
{
    return isa == ADAMW_AVX512 ? "avx512" : isa == ADAMW_AVX2 ? "avx2" : "scalar";
}

/* Per-update constants, rounded to fp32 once (as torch passes python floats to fp32 kernels). */
struct consts {
    float decay;      /* 1 - lr*wd */
    float w1;         /* lerp weight 1 - beta1 */
    bool lerp_low;    /* torch's lerp branch: weight < 0.5 */
    float b2, w2;     /* beta2, 1 - beta2 */
    float bc2_sqrt;   /* sqrt(1 - beta2^step) */
    float bc2_rsqrt;  /* 1 / sqrt(1 - beta2^step): the 8-bit update multiplies where torch divides */
    float neg_step;   /* -lr / (1 - beta1^step) */
    float eps, gscale;
};

static struct consts consts_of(const struct adamw_step *s)
{
    struct consts c;
    double bc1 = 1.0 - pow((double)s->beta1, s->step);
    double bc2 = 1.0 - pow((double)s->beta2, s->step);
    c.decay = (float)(1.0 - (double)s->lr * (double)s->weight_decay);
    c.w1 = (float)(1.0 - (double)s->beta1);
    c.lerp_low = c.w1 < 0.5f;
    c.b2 = s->beta2;
    c.w2 = (float)(1.0 - (double)s->beta2);
    c.bc2_sqrt = (float)sqrt(bc2);
    c.bc2_rsqrt = (float)(1.0 / sqrt(bc2));
    c.neg_step = (float)(-(double)s->lr / bc1);
    c.eps = s->eps;
    c.gscale = s->grad_scale;
    return c;
}

/* Input and output arrays (each may alias its input). With bf16 state, m and v are m16, v16 (in)
 * and mo16, vo16 (out), rounded with draws round_first + i of the stream round_key. */
struct io {
    const float *p, *m, *v, *g;
    float *po, *mo, *vo;
    uint16_t *p16;
    const uint16_t *m16, *v16;
    uint16_t *mo16, *vo16;
    uint64_t round_key, round_first;
};

static inline void adamw_one(const struct consts *c, const struct io *a, size_t i)
{
    bool half = a->m16 != NULL;
    float gi = a->g[i] * c->gscale;
    float pi = a->p[i] * c->decay;
    float mo = half ? bf16_to_f32(a->m16[i]) : a->m[i];
    float vo = half ? bf16_to_f32(a->v16[i]) : a->v[i];
    float mi = c->lerp_low ? mo + c->w1 * (gi - mo) : gi - (gi - mo) * (1.0f - c->w1);
    float vi = vo * c->b2 + (c->w2 * gi) * gi;
    float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
    pi = pi + c->neg_step * (mi / denom);
    a->po[i] = pi;
    if (half) {
        uint64_t r = splitmix64_at(a->round_key, a->round_first + i);
        a->mo16[i] = f32_to_bf16_stochastic(mi, (uint32_t)r);
        a->vo16[i] = f32_to_bf16_stochastic(vi, (uint32_t)r >> 16);
    } else {
        a->mo[i] = mi;
        a->vo[i] = vi;
    }
    a->p16[i] = f32_to_bf16(pi);
}

static void adamw_scalar(const struct consts *c, const struct io *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        adamw_one(c, a, i);
}

/* bf16 of 8 floats: the top half of each one's bits plus `add` (NaN kept quiet). */
__attribute__((target("avx2"))) static inline __m128i bf16_pack8_add_avx2(__m256 x, __m256i add)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, add), 16);
    __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    return _mm_packus_epi32(lo, hi);
}

/* Round to nearest even, as f32_to_bf16. */
__attribute__((target("avx2"))) static inline __m128i bf16_pack8_avx2(__m256 x)
{
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 16), _mm256_set1_epi32(1));
    return bf16_pack8_add_avx2(x, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
}

/* a * b mod 2^64 per 64-bit lane (AVX2 has no 64-bit multiply): from three 32x32->64 products. */
__attribute__((target("avx2"))) static inline __m256i mul64_avx2(__m256i a, uint64_t b)
{
    __m256i blo = _mm256_set1_epi64x((long long)(b & 0xffffffffu)), bhi = _mm256_set1_epi64x((long long)(b >> 32));
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), blo), _mm256_mul_epu32(a, bhi));
    return _mm256_add_epi64(_mm256_mul_epu32(a, blo), _mm256_slli_epi64(cross, 32));
}

/* splitmix64_mix per 64-bit lane. */
__attribute__((target("avx2"))) static inline __m256i mix64_avx2(__m256i z)
{
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), 0xbf58476d1ce4e5b9ull);
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), 0x94d049bb133111ebull);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

/* The low 32 bits of draws first .. first+7 of the stream key, one per 32-bit lane. */
__attribute__((target("avx2"))) static inline __m256i draws8_avx2(uint64_t key, uint64_t first)
{
    const __m256i steps = _mm256_setr_epi64x(0, (long long)SPLITMIX64_GAMMA, (long long)(2 * SPLITMIX64_GAMMA),
                                             (long long)(3 * SPLITMIX64_GAMMA));
    __m256i base = _mm256_add_epi64(_mm256_set1_epi64x((long long)(key + (first + 1) * SPLITMIX64_GAMMA)), steps);
    __m256i lo = mix64_avx2(base);
    __m256i hi = mix64_avx2(_mm256_add_epi64(base, _mm256_set1_epi64x((long long)(4 * SPLITMIX64_GAMMA))));
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    return _mm256_permute2x128_si256(_mm256_permutevar8x32_epi32(lo, even), _mm256_permutevar8x32_epi32(hi, even),
                                     0x20);
}

__attribute__((target("avx2"))) static inline __m256 widen8_avx2(const uint16_t *x)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)x)), 16));
}

/* half: m and v in bf16 (a constant in each caller, so each variant is compiled without the test). */
__attribute__((target("avx2"), always_inline)) static inline void adamw_avx2_body(const struct consts *c,
                                                                                 const struct io *a, size_t n,
                                                                                 const bool half)
{
    const __m256 gscale = _mm256_set1_ps(c->gscale), decay = _mm256_set1_ps(c->decay), w1 = _mm256_set1_ps(c->w1),
                 one_w1 = _mm256_set1_ps(1.0f - c->w1), b2 = _mm256_set1_ps(c->b2), w2 = _mm256_set1_ps(c->w2),
                 bc2s = _mm256_set1_ps(c->bc2_sqrt), neg_step = _mm256_set1_ps(c->neg_step),
                 eps = _mm256_set1_ps(c->eps);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(a->g + i), gscale);
        __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(a->p + i), decay);
        __m256 mo = half ? widen8_avx2(a->m16 + i) : _mm256_loadu_ps(a->m + i);
        __m256 vo = half ? widen8_avx2(a->v16 + i) : _mm256_loadu_ps(a->v + i);
        __m256 mi = c->lerp_low ? _mm256_add_ps(mo, _mm256_mul_ps(w1, _mm256_sub_ps(gi, mo)))
                                : _mm256_sub_ps(gi, _mm256_mul_ps(_mm256_sub_ps(gi, mo), one_w1));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(vo, b2), _mm256_mul_ps(_mm256_mul_ps(w2, gi), gi));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2s), eps);
        pi = _mm256_add_ps(pi, _mm256_mul_ps(neg_step, _mm256_div_ps(mi, denom)));
        _mm256_storeu_ps(a->po + i, pi);
        if (half) {
            __m256i r = draws8_avx2(a->round_key, a->round_first + i), low16 = _mm256_set1_epi32(0xffff);
            _mm_storeu_si128((__m128i *)(a->mo16 + i), bf16_pack8_add_avx2(mi, _mm256_and_si256(r, low16)));
            _mm_storeu_si128((__m128i *)(a->vo16 + i), bf16_pack8_add_avx2(vi, _mm256_srli_epi32(r, 16)));
        } else {
            _mm256_storeu_ps(a->mo + i, mi);
            _mm256_storeu_ps(a->vo + i, vi);
        }
        _mm_storeu_si128((__m128i *)(a->p16 + i), bf16_pack8_avx2(pi));
    }
    for (; i < n; i++)
        adamw_one(c, a, i);
}

__attribute__((target("avx2"))) static void adamw_avx2(const struct consts *c, const struct io *a, size_t n)
{
    if (a->m16)
        adamw_avx2_body(c, a, n, true);
    else
        adamw_avx2_body(c, a, n, false);
}

/* a * b mod 2^64 per 64-bit lane (vpmullq). */
__attribute__((target(AVX512_TARGET))) static inline __m512i mul64_avx512(__m512i a, uint64_t b)
{
    return _mm512_mullo_epi64(a, _mm512_set1_epi64((long long)b));
}

__attribute__((target(AVX512_TARGET))) static inline __m512i mix64_avx512(__m512i z)
{
    z = mul64_avx512(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), 0xbf58476d1ce4e5b9ull);
    z = mul64_avx512(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), 0x94d049bb133111ebull);
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

/* The low 32 bits of draws first .. first+15 of the stream key, one per 32-bit lane. */
__attribute__((target(AVX512_TARGET))) static inline __m512i draws16_avx512(uint64_t key, uint64_t first)
{
    const uint64_t g = SPLITMIX64_GAMMA;
    const __m512i steps = _mm512_setr_epi64(0, (long long)g, (long long)(2 * g), (long long)(3 * g), (long long)(4 * g),
                                            (long long)(5 * g), (long long)(6 * g), (long long)(7 * g));
    __m512i base = _mm512_add_epi64(_mm512_set1_epi64((long long)(key + (first + 1) * g)), steps);
    __m256i lo = _mm512_cvtepi64_epi32(mix64_avx512(base));
    __m256i hi = _mm512_cvtepi64_epi32(mix64_avx512(_mm512_add_epi64(base, _mm512_set1_epi64((long long)(8 * g)))));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

__attribute__((target(AVX512_TARGET))) static inline __m512 widen16_avx512(const uint16_t *x)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)x)), 16));
}

/* bf16 of 16 floats: the top half of each one's bits plus `add` (NaN kept quiet). */
__attribute__((target(AVX512_TARGET))) static inline __m256i bf16_pack16_add_avx512(__m512 x, __m512i add)
{
    __m512i u = _mm512_castps_si512(x);
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, add), 16);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i r = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r);
}

__attribute__((target(AVX512_TARGET), always_inline)) static inline void adamw_avx512_body(const struct consts *c,
                                                                                              const struct io *a,
                                                                                              size_t n, const bool half)
{
    const __m512 gscale = _mm512_set1_ps(c->gscale), decay = _mm512_set1_ps(c->decay), w1 = _mm512_set1_ps(c->w1),
                 one_w1 = _mm512_set1_ps(1.0f - c->w1), b2 = _mm512_set1_ps(c->b2), w2 = _mm512_set1_ps(c->w2),
                 bc2s = _mm512_set1_ps(c->bc2_sqrt), neg_step = _mm512_set1_ps(c->neg_step),
                 eps = _mm512_set1_ps(c->eps);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), low16 = _mm512_set1_epi32(0xffff);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(a->g + i), gscale);
        __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(a->p + i), decay);
        __m512 mo = half ? widen16_avx512(a->m16 + i) : _mm512_loadu_ps(a->m + i);
        __m512 vo = half ? widen16_avx512(a->v16 + i) : _mm512_loadu_ps(a->v + i);
        __m512 mi = c->lerp_low ? _mm512_add_ps(mo, _mm512_mul_ps(w1, _mm512_sub_ps(gi, mo)))
                                : _mm512_sub_ps(gi, _mm512_mul_ps(_mm512_sub_ps(gi, mo), one_w1));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(vo, b2), _mm512_mul_ps(_mm512_mul_ps(w2, gi), gi));
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2s), eps);
        pi = _mm512_add_ps(pi, _mm512_mul_ps(neg_step, _mm512_div_ps(mi, denom)));
        _mm512_storeu_ps(a->po + i, pi);
        if (half) {
            __m512i r = draws16_avx512(a->round_key, a->round_first + i);
            _mm256_storeu_si256((__m256i *)(a->mo16 + i), bf16_pack16_add_avx512(mi, _mm512_and_si512(r, low16)));
            _mm256_storeu_si256((__m256i *)(a->vo16 + i), bf16_pack16_add_avx512(vi, _mm512_srli_epi32(r, 16)));
        } else {
            _mm512_storeu_ps(a->mo + i, mi);
            _mm512_storeu_ps(a->vo + i, vi);
        }
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(pi), 16), one);
        _mm256_storeu_si256((__m256i *)(a->p16 + i), bf16_pack16_add_avx512(pi, _mm512_add_epi32(bias, lsb)));
    }
    for (; i < n; i++)
        adamw_one(c, a, i);
}

__attribute__((target(AVX512_TARGET))) static void adamw_avx512(const struct consts *c, const struct io *a,
                                                                     size_t n)
{
    if (a->m16)
        adamw_avx512_body(c, a, n, true);
    else
        adamw_avx512_body(c, a, n, false);
}

static void adamw_run(enum adamw_isa isa, const struct adamw_step *s, const struct io *a, size_t n)
{
    struct consts c = consts_of(s);
    switch (isa) {
    case ADAMW_AVX512:
        adamw_avx512(&c, a, n);
        break;
    case ADAMW_AVX2:
        adamw_avx2(&c, a, n);
        break;
    default:
        adamw_scalar(&c, a, n);
    }
}

void adamw_update_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, const float *m, const float *v,
                     const float *g, float *p_out, float *m_out, float *v_out, uint16_t *p16, size_t n)
{
    struct io a = {.p = p, .m = m, .v = v, .g = g, .po = p_out, .mo = m_out, .vo = v_out, .p16 = p16};
    adamw_run(isa, s, &a, n);
}

void adamw_update_bf16_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, const uint16_t *m,
                          const uint16_t *v, const float *g, float *p_out, uint16_t *m_out, uint16_t *v_out,
                          uint16_t *p16, size_t n)
{
    struct io a = {.p = p, .g = g, .po = p_out, .p16 = p16, .m16 = m, .v16 = v, .mo16 = m_out, .vo16 = v_out,
                   .round_key = s->round_key, .round_first = s->round_first};
    adamw_run(isa, s, &a, n);
}

/* Two mixes: the seed's draw, then that combined with (step, tensor); distinct pairs enter the
 * (bijective) mix as distinct values, so no two tensor updates of a run share a stream key. */
uint64_t adamw_round_key(uint64_t seed, uint32_t step, uint32_t tensor)
{
    return splitmix64_mix(splitmix64_at(seed, 0) ^ ((uint64_t)step << 32 | tensor));
}

void adamw_update(enum adamw_isa isa, const struct adamw_step *s, float *p, float *m, float *v, const float *g,
                  uint16_t *p16, size_t n)
{
    adamw_update_to(isa, s, p, m, v, g, p, m, v, p16, n);
}

/* ---- 8-bit state (adamw.h, docs/design.md §9.6) ----
 * A code's value under scale T (L = T - 14 the biased exponent of the lowest normal binade, M the
 * mantissa bits): exponent field ce = code >> M, fraction f = code & (2^M - 1); ce > 0: (1 + f/2^M)
 * * 2^(ce + L - 1 - 127); ce = 0: f/2^M * 2^(L - 127). Encoding rounds the fp32 bits of |x| to M
 * mantissa bits in integer arithmetic (the same on every path), adding the random bits below the
 * kept ones to the whole word (a carry moves into the exponent, as it should). A value under the
 * lowest normal binade, 2^(L-127), is first added to 2^(L-127) in fp32 (one IEEE addition, the
 * same on every path): the sum lies in that binade, and its code less 2^M is the subnormal code. */

enum { Q8_M_BITS = 3, Q8_V_BITS = 4 };

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline int q8_bits(enum state8_kind kind)
{
    return kind == STATE8_M ? Q8_M_BITS : Q8_V_BITS;
}

/* The scale of a block whose largest magnitude has fp32 bits max_bits: one binade above it (so no
 * rounding can overflow), at least 15 (so L >= 1), at most 255. */
static inline uint32_t q8_scale_of(uint32_t max_bits)
{
    uint32_t t = (max_bits >> 23) + 1;
    return t < 15 ? 15 : t > 255 ? 255 : t;
}

/* A stored scale as decoding reads it: fresh state is zero-filled (all codes 0, value 0). */
static inline uint32_t q8_scale_at(uint8_t scale)
{
    return scale < 15 ? 15 : scale;
}

/* The magnitude code of fp32 bits u (sign cleared) under scale t, rounded with r16. */
static inline uint32_t q8_encode(uint32_t u, uint32_t t, int mbits, uint32_t r16)
{
    uint32_t low = t - 14, drop = 23 - (uint32_t)mbits, sub = (u >> 23) < low;
    if (sub)
        u = f32_bits(f32_from_bits(u) + f32_from_bits(low << 23));
    uint32_t code = ((u + (r16 << (drop - 16))) >> drop) - ((low - 1 + sub) << mbits);
    uint32_t most = (16u << mbits) - 1; /* only inf or NaN get past it */
    return code < most ? code : most;
}

static inline float q8_decode(uint32_t code, uint32_t t, int mbits)
{
    uint32_t low = t - 14, ce = code >> mbits, frac = code & ((1u << mbits) - 1);
    float x = f32_from_bits((((ce ? ce : 1) + low - 1) << 23) | (frac << (23 - mbits)));
    return ce ? x : x - f32_from_bits(low << 23); /* exact: both in one binade */
}

uint8_t state8_quantize(enum state8_kind kind, const float *x, size_t n, const uint16_t *r16, uint8_t *codes)
{
    uint32_t most = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = f32_bits(x[i]) & 0x7fffffffu;
        most = u > most ? u : most;
    }
    uint32_t t = q8_scale_of(most);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = f32_bits(x[i]), a = u & 0x7fffffffu, c = q8_encode(a, t, q8_bits(kind), r16[i]);
        codes[i] = (uint8_t)(kind == STATE8_M ? c | (u >> 24 & 0x80) : c < (a != 0) ? 1 : c);
    }
    return (uint8_t)t;
}

float state8_value(enum state8_kind kind, uint8_t code, uint8_t scale)
{
    uint32_t t = q8_scale_at(scale);
    if (kind == STATE8_V_ROOT)
        return q8_decode(code, t, Q8_V_BITS);
    float mag = q8_decode(code & 0x7fu, t, Q8_M_BITS);
    return code & 0x80 ? -mag : mag;
}

/* The rounding bits of 8-bit state (adamw.h): element i takes 32-bit word i & 3 of Q8_AES_ROUNDS AES
 * rounds (AESENC: SubBytes, ShiftRows, MixColumns, then the round key; Q8_AES_KEY0 and Q8_AES_KEY1
 * alternating) of the 128-bit block whose low 64 bits are i >> 2 and high 64 bits the stream's key.
 * The rounds are a bijection and one VAES instruction each for 16 elements, where a 64-bit
 * SplitMix64 mix took 13 vector operations for 16 (two of them vpmullq, three micro-operations on
 * port 0 each): design §9.6. */
#define Q8_AES_ROUNDS 4
#define Q8_AES_KEY0 0x243f6a8885a308d3ull /* the digits of pi, as any constant would do */
#define Q8_AES_KEY1 0x13198a2e03707344ull

static const uint8_t aes_sbox[256] = {
    0x63, 0x7c, 0x77, 0x7b, 0xf2, 0x6b, 0x6f, 0xc5, 0x30, 0x01, 0x67, 0x2b, 0xfe, 0xd7, 0xab, 0x76,
    0xca, 0x82, 0xc9, 0x7d, 0xfa, 0x59, 0x47, 0xf0, 0xad, 0xd4, 0xa2, 0xaf, 0x9c, 0xa4, 0x72, 0xc0,
    0xb7, 0xfd, 0x93, 0x26, 0x36, 0x3f, 0xf7, 0xcc, 0x34, 0xa5, 0xe5, 0xf1, 0x71, 0xd8, 0x31, 0x15,
    0x04, 0xc7, 0x23, 0xc3, 0x18, 0x96, 0x05, 0x9a, 0x07, 0x12, 0x80, 0xe2, 0xeb, 0x27, 0xb2, 0x75,
    0x09, 0x83, 0x2c, 0x1a, 0x1b, 0x6e, 0x5a, 0xa0, 0x52, 0x3b, 0xd6, 0xb3, 0x29, 0xe3, 0x2f, 0x84,
    0x53, 0xd1, 0x00, 0xed, 0x20, 0xfc, 0xb1, 0x5b, 0x6a, 0xcb, 0xbe, 0x39, 0x4a, 0x4c, 0x58, 0xcf,
    0xd0, 0xef, 0xaa, 0xfb, 0x43, 0x4d, 0x33, 0x85, 0x45, 0xf9, 0x02, 0x7f, 0x50, 0x3c, 0x9f, 0xa8,
    0x51, 0xa3, 0x40, 0x8f, 0x92, 0x9d, 0x38, 0xf5, 0xbc, 0xb6, 0xda, 0x21, 0x10, 0xff, 0xf3, 0xd2,
    0xcd, 0x0c, 0x13, 0xec, 0x5f, 0x97, 0x44, 0x17, 0xc4, 0xa7, 0x7e, 0x3d, 0x64, 0x5d, 0x19, 0x73,
    0x60, 0x81, 0x4f, 0xdc, 0x22, 0x2a, 0x90, 0x88, 0x46, 0xee, 0xb8, 0x14, 0xde, 0x5e, 0x0b, 0xdb,
    0xe0, 0x32, 0x3a, 0x0a, 0x49, 0x06, 0x24, 0x5c, 0xc2, 0xd3, 0xac, 0x62, 0x91, 0x95, 0xe4, 0x79,
    0xe7, 0xc8, 0x37, 0x6d, 0x8d, 0xd5, 0x4e, 0xa9, 0x6c, 0x56, 0xf4, 0xea, 0x65, 0x7a, 0xae, 0x08,
    0xba, 0x78, 0x25, 0x2e, 0x1c, 0xa6, 0xb4, 0xc6, 0xe8, 0xdd, 0x74, 0x1f, 0x4b, 0xbd, 0x8b, 0x8a,
    0x70, 0x3e, 0xb5, 0x66, 0x48, 0x03, 0xf6, 0x0e, 0x61, 0x35, 0x57, 0xb9, 0x86, 0xc1, 0x1d, 0x9e,
    0xe1, 0xf8, 0x98, 0x11, 0x69, 0xd9, 0x8e, 0x94, 0x9b, 0x1e, 0x87, 0xe9, 0xce, 0x55, 0x28, 0xdf,
    0x8c, 0xa1, 0x89, 0x0d, 0xbf, 0xe6, 0x42, 0x68, 0x41, 0x99, 0x2d, 0x0f, 0xb0, 0x54, 0xbb, 0x16,
};

/* One AESENC on a block held as two little-endian 64-bit halves (byte k of the block is byte k % 8 of
 * half k / 8), with the round key (key, key) in both halves. */
static void aesenc_soft(uint64_t x[2], uint64_t key)
{
    uint8_t s[16], t[16];
    for (int k = 0; k < 16; k++)
        s[k] = (uint8_t)(x[k / 8] >> (8 * (k % 8)));
    for (int col = 0; col < 4; col++) /* SubBytes and ShiftRows: row r of column c from column c + r */
        for (int row = 0; row < 4; row++)
            t[4 * col + row] = aes_sbox[s[4 * ((col + row) & 3) + row]];
    x[0] = x[1] = 0;
    for (int col = 0; col < 4; col++) { /* MixColumns: 2a0 + 3a1 + a2 + a3, rotated, in GF(2^8) */
        const uint8_t *a = t + 4 * col;
        uint8_t all = a[0] ^ a[1] ^ a[2] ^ a[3];
        for (int row = 0; row < 4; row++) {
            uint8_t d = a[row] ^ a[(row + 1) & 3];
            uint8_t twice = (uint8_t)(d << 1 ^ (d & 0x80 ? 0x1b : 0));
            int k = 4 * col + row;
            x[k / 8] |= (uint64_t)(uint8_t)(a[row] ^ all ^ twice) << (8 * (k % 8));
        }
    }
    x[0] ^= key;
    x[1] ^= key;
}

static inline uint32_t q8_draw(uint64_t key, uint64_t i)
{
    uint64_t x[2] = {i >> 2, key};
    for (int r = 0; r < Q8_AES_ROUNDS; r++)
        aesenc_soft(x, r & 1 ? Q8_AES_KEY1 : Q8_AES_KEY0);
    return (uint32_t)(x[(i & 3) / 2] >> (i & 1 ? 32 : 0));
}

/* Arrays of an 8-bit update: in (may alias out), out, and the rounding stream. */
struct io8 {
    const float *p, *g;
    float *po;
    uint16_t *p16;
    struct state8 in, out;
    uint64_t round_key, round_first;
};

/* Elements [i0, i0 + n) of one block (n <= STATE8_BLOCK), scalar: every path's reference and every
 * path's partial last block. */
static void adamw8_block_scalar(const struct consts *c, const struct io8 *a, size_t i0, size_t n)
{
    float mnew[STATE8_BLOCK], snew[STATE8_BLOCK];
    uint16_t rm[STATE8_BLOCK], rv[STATE8_BLOCK];
    size_t b = i0 / STATE8_BLOCK;
    uint8_t ms = a->in.m_scale[b], vs = a->in.v_scale[b];
    for (size_t k = 0; k < n; k++) {
        size_t i = i0 + k;
        float gi = a->g[i] * c->gscale;
        float pi = a->p[i] * c->decay;
        float mo = state8_value(STATE8_M, a->in.m[i], ms);
        float so = state8_value(STATE8_V_ROOT, a->in.v[i], vs);
        float vo = so * so; /* exact (so has at most 5 significant bits) unless it underflows */
        float mi = c->lerp_low ? mo + c->w1 * (gi - mo) : gi - (gi - mo) * (1.0f - c->w1);
        float vi = vo * c->b2 + (c->w2 * gi) * gi;
        float si = sqrtf(vi);
        float denom = si * c->bc2_rsqrt + c->eps;
        pi = pi + c->neg_step * (mi / denom);
        a->po[i] = pi;
        if (a->p16)
            a->p16[i] = f32_to_bf16(pi);
        mnew[k] = mi;
        snew[k] = si;
        uint32_t r = q8_draw(a->round_key, a->round_first + i);
        rm[k] = (uint16_t)r;
        rv[k] = (uint16_t)(r >> 16);
    }
    a->out.m_scale[b] = state8_quantize(STATE8_M, mnew, n, rm, a->out.m + i0);
    a->out.v_scale[b] = state8_quantize(STATE8_V_ROOT, snew, n, rv, a->out.v + i0);
}

static void adamw8_scalar(const struct consts *c, const struct io8 *a, size_t n)
{
    for (size_t i = 0; i < n; i += STATE8_BLOCK)
        adamw8_block_scalar(c, a, i, n - i < STATE8_BLOCK ? n - i : STATE8_BLOCK);
}

/* q8_decode of 8 codes (32-bit lanes); low = t - 14 in every lane. A code c with ce > 0 has the
 * bits (c + ((low - 1) << mbits)) << (23 - mbits); a subnormal one is that of c + 2^mbits (in the
 * lowest binade) less 2^(low - 127). */
__attribute__((target("avx2"))) static inline __m256 q8_decode8_avx2(__m256i code, __m256i low, int mbits)
{
    const __m256i step = _mm256_set1_epi32(1 << mbits);
    __m256i sub = _mm256_cmpgt_epi32(step, code);
    __m256i offset = _mm256_slli_epi32(_mm256_sub_epi32(low, _mm256_set1_epi32(1)), mbits);
    __m256i bits = _mm256_add_epi32(_mm256_add_epi32(code, offset), _mm256_and_si256(sub, step));
    __m256 x = _mm256_castsi256_ps(_mm256_slli_epi32(bits, 23 - mbits));
    return _mm256_sub_ps(x, _mm256_castsi256_ps(_mm256_and_si256(sub, _mm256_slli_epi32(low, 23)))); /* x - 0 = x */
}

/* q8_encode of 8 magnitudes' bits u; low = t - 14 in every lane. */
__attribute__((target("avx2"))) static inline __m256i q8_encode8_avx2(__m256i u, __m256i low, int mbits, __m256i r16)
{
    const int drop = 23 - mbits;
    __m256i base = _mm256_slli_epi32(low, 23);
    __m256i sub = _mm256_cmpgt_epi32(low, _mm256_srli_epi32(u, 23)); /* all ones under the lowest binade */
    __m256i lifted = _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(u), _mm256_castsi256_ps(base)));
    u = _mm256_blendv_epi8(u, lifted, sub);
    /* (low - 1) << mbits, or low << mbits under the lowest binade (where sub is -1) */
    __m256i offset = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_sub_epi32(low, _mm256_set1_epi32(1)), sub), mbits);
    __m256i code = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_add_epi32(u, _mm256_slli_epi32(r16, drop - 16)), drop), offset);
    return _mm256_min_epu32(code, _mm256_set1_epi32((16 << mbits) - 1));
}

__attribute__((target("avx2"))) static inline uint32_t hmax8_avx2(__m256i x)
{
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
    return (uint32_t)_mm_cvtsi128_si32(m);
}

/* The low byte of each 32-bit lane, to 8 bytes at out. */
__attribute__((target("avx2"))) static inline void store_bytes8_avx2(uint8_t *out, __m256i x)
{
    __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    _mm_storel_epi64((__m128i *)out, _mm_packus_epi16(w, w));
}

__attribute__((target("avx2"))) static inline __m256i load_bytes8_avx2(const uint8_t *x)
{
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)x));
}

/* q8_draw of elements first .. first+7 (first a multiple of 4): two blocks, with AES-NI. */
__attribute__((target("avx2,aes"))) static inline __m256i q8_draws8_avx2(uint64_t key, uint64_t first)
{
    const __m128i k0 = _mm_set1_epi64x((long long)Q8_AES_KEY0), k1 = _mm_set1_epi64x((long long)Q8_AES_KEY1);
    __m128i lo = _mm_set_epi64x((long long)key, (long long)(first >> 2)), hi = _mm_add_epi64(lo, _mm_cvtsi32_si128(1));
    for (int r = 0; r < Q8_AES_ROUNDS; r++) {
        lo = _mm_aesenc_si128(lo, r & 1 ? k1 : k0);
        hi = _mm_aesenc_si128(hi, r & 1 ? k1 : k0);
    }
    return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

__attribute__((target("avx2,aes"))) static void adamw8_avx2(const struct consts *c, const struct io8 *a, size_t n)
{
    enum { V = STATE8_BLOCK / 8 };
    const __m256 gscale = _mm256_set1_ps(c->gscale), decay = _mm256_set1_ps(c->decay), w1 = _mm256_set1_ps(c->w1),
                 one_w1 = _mm256_set1_ps(1.0f - c->w1), b2 = _mm256_set1_ps(c->b2), w2 = _mm256_set1_ps(c->w2),
                 bc2r = _mm256_set1_ps(c->bc2_rsqrt), neg_step = _mm256_set1_ps(c->neg_step),
                 eps = _mm256_set1_ps(c->eps);
    const __m256i abs = _mm256_set1_epi32(0x7fffffff), low7 = _mm256_set1_epi32(0x7f), low16 = _mm256_set1_epi32(0xffff),
                  one = _mm256_set1_epi32(1), fourteen = _mm256_set1_epi32(14);
    size_t i = 0;
    for (; i + STATE8_BLOCK <= n; i += STATE8_BLOCK) {
        size_t b = i / STATE8_BLOCK;
        __m256i mlow = _mm256_set1_epi32((int)q8_scale_at(a->in.m_scale[b]) - 14);
        __m256i vlow = _mm256_set1_epi32((int)q8_scale_at(a->in.v_scale[b]) - 14);
        __m256 mnew[V], snew[V];
        __m256i mmax = _mm256_setzero_si256(), smax = _mm256_setzero_si256();
        for (int k = 0; k < V; k++) {
            size_t j = i + 8 * (size_t)k;
            __m256i mc = load_bytes8_avx2(a->in.m + j);
            __m256 mo = _mm256_castsi256_ps(
                _mm256_or_si256(_mm256_castps_si256(q8_decode8_avx2(_mm256_and_si256(mc, low7), mlow, Q8_M_BITS)),
                                _mm256_slli_epi32(_mm256_srli_epi32(mc, 7), 31)));
            __m256 so = q8_decode8_avx2(load_bytes8_avx2(a->in.v + j), vlow, Q8_V_BITS);
            __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(a->g + j), gscale);
            __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(a->p + j), decay);
            __m256 mi = c->lerp_low ? _mm256_add_ps(mo, _mm256_mul_ps(w1, _mm256_sub_ps(gi, mo)))
                                    : _mm256_sub_ps(gi, _mm256_mul_ps(_mm256_sub_ps(gi, mo), one_w1));
            __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(so, so), b2), _mm256_mul_ps(_mm256_mul_ps(w2, gi), gi));
            __m256 si = _mm256_sqrt_ps(vi);
            __m256 denom = _mm256_add_ps(_mm256_mul_ps(si, bc2r), eps);
            pi = _mm256_add_ps(pi, _mm256_mul_ps(neg_step, _mm256_div_ps(mi, denom)));
            _mm256_storeu_ps(a->po + j, pi);
            if (a->p16)
                _mm_storeu_si128((__m128i *)(a->p16 + j), bf16_pack8_avx2(pi));
            mnew[k] = mi;
            snew[k] = si;
            mmax = _mm256_max_epu32(mmax, _mm256_and_si256(_mm256_castps_si256(mi), abs));
            smax = _mm256_max_epu32(smax, _mm256_and_si256(_mm256_castps_si256(si), abs));
        }
        uint32_t mt = q8_scale_of(hmax8_avx2(mmax)), vt = q8_scale_of(hmax8_avx2(smax));
        a->out.m_scale[b] = (uint8_t)mt;
        a->out.v_scale[b] = (uint8_t)vt;
        mlow = _mm256_sub_epi32(_mm256_set1_epi32((int)mt), fourteen);
        vlow = _mm256_sub_epi32(_mm256_set1_epi32((int)vt), fourteen);
        for (int k = 0; k < V; k++) {
            size_t j = i + 8 * (size_t)k;
            __m256i r = q8_draws8_avx2(a->round_key, a->round_first + j);
            __m256i mu = _mm256_castps_si256(mnew[k]), su = _mm256_and_si256(_mm256_castps_si256(snew[k]), abs);
            __m256i mcode = q8_encode8_avx2(_mm256_and_si256(mu, abs), mlow, Q8_M_BITS, _mm256_and_si256(r, low16));
            mcode = _mm256_or_si256(mcode, _mm256_slli_epi32(_mm256_srli_epi32(mu, 31), 7));
            __m256i vcode = q8_encode8_avx2(su, vlow, Q8_V_BITS, _mm256_srli_epi32(r, 16));
            /* a non-zero sqrt(v) keeps code 1 at least */
            vcode = _mm256_max_epu32(vcode, _mm256_andnot_si256(_mm256_cmpeq_epi32(su, _mm256_setzero_si256()), one));
            store_bytes8_avx2(a->out.m + j, mcode);
            store_bytes8_avx2(a->out.v + j, vcode);
        }
    }
    if (i < n)
        adamw8_block_scalar(c, a, i, n - i);
}

/* As q8_decode8_avx2. */
__attribute__((target(AVX512_TARGET))) static inline __m512 q8_decode16_avx512(__m512i code, __m512i low, int mbits)
{
    const __m512i step = _mm512_set1_epi32(1 << mbits);
    __mmask16 sub = _mm512_cmplt_epu32_mask(code, step);
    __m512i bits = _mm512_add_epi32(code, _mm512_slli_epi32(_mm512_sub_epi32(low, _mm512_set1_epi32(1)), mbits));
    bits = _mm512_mask_add_epi32(bits, sub, bits, step);
    __m512 x = _mm512_castsi512_ps(_mm512_slli_epi32(bits, 23 - mbits));
    return _mm512_mask_sub_ps(x, sub, x, _mm512_castsi512_ps(_mm512_slli_epi32(low, 23)));
}

/* q8_encode of 16 magnitudes' bits u before its clamp to the largest code (which only inf or NaN
 * pass): base = (t - 14) << 23 in every lane (the lowest normal binade's start), off = (t - 15) <<
 * mbits and off_sub = (t - 14) << mbits (the codes' offsets above it and in it). */
__attribute__((target(AVX512_TARGET))) static inline __m512i q8_encode16_unclamped_avx512(__m512i u, __m512i base,
                                                                                       __m512i off, __m512i off_sub,
                                                                                       int mbits, __m512i rbits)
{
    const int drop = 23 - mbits;
    __mmask16 sub = _mm512_cmplt_epu32_mask(u, base); /* under the lowest binade */
    u = _mm512_castps_si512(
        _mm512_mask_add_ps(_mm512_castsi512_ps(u), sub, _mm512_castsi512_ps(u), _mm512_castsi512_ps(base)));
    return _mm512_sub_epi32(_mm512_srli_epi32(_mm512_add_epi32(u, rbits), drop),
                            _mm512_mask_blend_epi32(sub, off, off_sub));
}

/* The largest lane of x and of y (unsigned), both in one pass of shuffles. */
__attribute__((target(AVX512_TARGET))) static inline void hmax2_avx512(__m512i x, __m512i y, uint32_t *xmax,
                                                                      uint32_t *ymax)
{
    /* x's lanes 0-7 and y's 0-7 against x's 8-15 and y's 8-15, then within each 256-bit half */
    __m512i m = _mm512_max_epu32(_mm512_shuffle_i64x2(x, y, 0x44), _mm512_shuffle_i64x2(x, y, 0xee));
    m = _mm512_max_epu32(m, _mm512_shuffle_i64x2(m, m, 0xb1));
    m = _mm512_max_epu32(m, _mm512_shuffle_epi32(m, _MM_PERM_BADC));
    m = _mm512_max_epu32(m, _mm512_shuffle_epi32(m, _MM_PERM_CDAB));
    *xmax = (uint32_t)_mm_cvtsi128_si32(_mm512_castsi512_si128(m));
    *ymax = (uint32_t)_mm_cvtsi128_si32(_mm512_extracti32x4_epi32(m, 2));
}

/* q8_draw of elements first .. first+15 (first a multiple of 4): four blocks, one VAES instruction
 * a round. */
__attribute__((target(AVX512_TARGET ",vaes"))) static inline __m512i q8_draws16_avx512(uint64_t key, uint64_t first)
{
    const __m512i k0 = _mm512_set1_epi64((long long)Q8_AES_KEY0), k1 = _mm512_set1_epi64((long long)Q8_AES_KEY1);
    __m512i x = _mm512_add_epi64(_mm512_set_epi64((long long)key, 3, (long long)key, 2, (long long)key, 1, (long long)key, 0),
                                 _mm512_maskz_set1_epi64(0x55, (long long)(first >> 2)));
    for (int r = 0; r < Q8_AES_ROUNDS; r++)
        x = _mm512_aesenc_epi128(x, r & 1 ? k1 : k0);
    return x;
}

/* with_p16: write the bf16 copy (a constant in each caller, so the variant without it has no pack:
 * this update is bound by the vector ALUs, not the divider, so the pack's instructions count).
 * Blocks go G at a time: the first pass of all G, then their maxima (independent chains, which the
 * core overlaps: one block's maximum to scale to encoding is a long chain of latency), then the
 * second pass of all G. */
__attribute__((target(AVX512_TARGET ",vaes"), always_inline)) static inline void adamw8_avx512_body(const struct consts *c,
                                                                                          const struct io8 *a,
                                                                                          size_t n, bool with_p16)
{
    enum { V = STATE8_BLOCK / 16, G = 4 };
    const __m512 gscale = _mm512_set1_ps(c->gscale), decay = _mm512_set1_ps(c->decay), w1 = _mm512_set1_ps(c->w1),
                 one_w1 = _mm512_set1_ps(1.0f - c->w1), b2 = _mm512_set1_ps(c->b2), w2 = _mm512_set1_ps(c->w2),
                 bc2r = _mm512_set1_ps(c->bc2_rsqrt), neg_step = _mm512_set1_ps(c->neg_step),
                 eps = _mm512_set1_ps(c->eps);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), low7 = _mm512_set1_epi32(0x7f),
                  low16 = _mm512_set1_epi32(0xffff), one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff),
                  sign = _mm512_set1_epi32((int)0x80000000u), sign8 = _mm512_set1_epi32(0x80);
    size_t i = 0;
    for (int group = G; group > 0; group = group > 1 ? 1 : 0) /* G blocks at a time, then one */
        for (; i + (size_t)group * STATE8_BLOCK <= n; i += (size_t)group * STATE8_BLOCK) {
            __m512 mnew[G * V], snew[G * V];
            __m512i mmax[G], smax[G];
            for (int blk = 0; blk < group; blk++) {
                size_t b = i / STATE8_BLOCK + (size_t)blk;
                __m512i mlow = _mm512_set1_epi32((int)q8_scale_at(a->in.m_scale[b]) - 14);
                __m512i vlow = _mm512_set1_epi32((int)q8_scale_at(a->in.v_scale[b]) - 14);
                mmax[blk] = _mm512_setzero_si512();
                smax[blk] = _mm512_setzero_si512();
                for (int k = 0; k < V; k++) {
                    size_t j = i + (size_t)(blk * V + k) * 16;
                    __m512i mc = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(a->in.m + j)));
                    __m512 mo = _mm512_castsi512_ps(_mm512_ternarylogic_epi32( /* magnitude | (code << 24 & sign) */
                        _mm512_castps_si512(q8_decode16_avx512(_mm512_and_si512(mc, low7), mlow, Q8_M_BITS)),
                        _mm512_slli_epi32(mc, 24), sign, 0xf8));
                    __m512 so = q8_decode16_avx512(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(a->in.v + j))),
                                                   vlow, Q8_V_BITS);
                    __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(a->g + j), gscale);
                    __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(a->p + j), decay);
                    __m512 mi = c->lerp_low ? _mm512_add_ps(mo, _mm512_mul_ps(w1, _mm512_sub_ps(gi, mo)))
                                            : _mm512_sub_ps(gi, _mm512_mul_ps(_mm512_sub_ps(gi, mo), one_w1));
                    __m512 vi =
                        _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(so, so), b2), _mm512_mul_ps(_mm512_mul_ps(w2, gi), gi));
                    __m512 si = _mm512_sqrt_ps(vi);
                    __m512 denom = _mm512_add_ps(_mm512_mul_ps(si, bc2r), eps);
                    pi = _mm512_add_ps(pi, _mm512_mul_ps(neg_step, _mm512_div_ps(mi, denom)));
                    _mm512_storeu_ps(a->po + j, pi);
                    if (with_p16) {
                        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(_mm512_castps_si512(pi), 16), one);
                        _mm256_storeu_si256((__m256i *)(a->p16 + j),
                                            bf16_pack16_add_avx512(pi, _mm512_add_epi32(bias, lsb)));
                    }
                    mnew[blk * V + k] = mi;
                    snew[blk * V + k] = si;
                    mmax[blk] = _mm512_max_epu32(mmax[blk], _mm512_and_si512(_mm512_castps_si512(mi), abs));
                    smax[blk] = _mm512_max_epu32(smax[blk], _mm512_and_si512(_mm512_castps_si512(si), abs));
                }
            }
            uint32_t mt[G], vt[G];
            for (int blk = 0; blk < group; blk++) {
                hmax2_avx512(mmax[blk], smax[blk], &mt[blk], &vt[blk]);
                mt[blk] = q8_scale_of(mt[blk]);
                vt[blk] = q8_scale_of(vt[blk]);
                a->out.m_scale[i / STATE8_BLOCK + (size_t)blk] = (uint8_t)mt[blk];
                a->out.v_scale[i / STATE8_BLOCK + (size_t)blk] = (uint8_t)vt[blk];
            }
            for (int blk = 0; blk < group; blk++) {
                const __m512i mlow = _mm512_set1_epi32((int)mt[blk] - 14), vlow = _mm512_set1_epi32((int)vt[blk] - 14);
                const __m512i mbase = _mm512_slli_epi32(mlow, 23), vbase = _mm512_slli_epi32(vlow, 23);
                const __m512i moff = _mm512_slli_epi32(_mm512_sub_epi32(mlow, one), Q8_M_BITS),
                              msub = _mm512_slli_epi32(mlow, Q8_M_BITS);
                const __m512i voff = _mm512_slli_epi32(_mm512_sub_epi32(vlow, one), Q8_V_BITS),
                              vsub = _mm512_slli_epi32(vlow, Q8_V_BITS);
                for (int k = 0; k < V; k++) {
                    size_t j = i + (size_t)(blk * V + k) * 16;
                    __m512i r = q8_draws16_avx512(a->round_key, a->round_first + j);
                    __m512i mu = _mm512_castps_si512(mnew[blk * V + k]),
                            su = _mm512_and_si512(_mm512_castps_si512(snew[blk * V + k]), abs);
                    /* the random bits below the kept ones: bits 0-15 of the draw for m, 16-31 for v */
                    __m512i mcode = q8_encode16_unclamped_avx512(
                        _mm512_and_si512(mu, abs), mbase, moff, msub, Q8_M_BITS,
                        _mm512_slli_epi32(_mm512_and_si512(r, low16), 23 - Q8_M_BITS - 16));
                    mcode = _mm512_min_epu32(mcode, low7);
                    mcode = _mm512_ternarylogic_epi32(mcode, _mm512_srli_epi32(mu, 24), sign8, 0xf8); /* | (mu >> 24 & 0x80) */
                    __m512i vcode = q8_encode16_unclamped_avx512(
                        su, vbase, voff, vsub, Q8_V_BITS, _mm512_slli_epi32(_mm512_srli_epi32(r, 16), 23 - Q8_V_BITS - 16));
                    /* a non-zero sqrt(v) keeps code 1 at least; the largest code, 255, is the byte's limit, so the
                     * saturating narrowing clamps */
                    vcode = _mm512_mask_max_epu32(vcode, _mm512_test_epi32_mask(su, su), vcode, one);
                    _mm_storeu_si128((__m128i *)(a->out.m + j), _mm512_cvtepi32_epi8(mcode));
                    _mm_storeu_si128((__m128i *)(a->out.v + j), _mm512_cvtusepi32_epi8(vcode));
                }
            }
        }
    if (i < n)
        adamw8_block_scalar(c, a, i, n - i);
}

__attribute__((target(AVX512_TARGET ",vaes"))) static void adamw8_avx512(const struct consts *c, const struct io8 *a,
                                                                 size_t n)
{
    if (a->p16)
        adamw8_avx512_body(c, a, n, true);
    else
        adamw8_avx512_body(c, a, n, false);
}

enum adamw_isa adamw_isa_8bit(enum adamw_isa isa)
{
    /* the rounding bits' AES rounds: VAES for the AVX-512 path, AES-NI for the AVX2 one; without them
     * the next path down computes the same bits */
    __builtin_cpu_init();
    if (isa == ADAMW_AVX512 && !__builtin_cpu_supports("vaes"))
        isa = ADAMW_AVX2;
    if (isa == ADAMW_AVX2 && !__builtin_cpu_supports("aes"))
        isa = ADAMW_SCALAR;
    return isa;
}

void adamw_update_8bit_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, struct state8 in,
                          const float *g, float *p_out, struct state8 out, uint16_t *p16, size_t n)
{
    struct consts c = consts_of(s);
    struct io8 a = {.p = p, .g = g, .po = p_out, .p16 = p16, .in = in, .out = out, .round_key = s->round_key,
                    .round_first = s->round_first};
    switch (adamw_isa_8bit(isa)) {
    case ADAMW_AVX512:
        adamw8_avx512(&c, &a, n);
        break;
    case ADAMW_AVX2:
        adamw8_avx2(&c, &a, n);
        break;
    default:
        adamw8_scalar(&c, &a, n);
    }
}

#define SUMSQ_BLOCK 4096

/* One block's sum of squares: element i goes to double lane i % 8 (square, then add), and the 8
 * lanes are combined in lane order. The vector paths below do the same operations per lane. */
static double sumsq_lanes_done(double lane[8], const float *x, size_t i, size_t n)
{
    for (int j = 0; i < n; i++, j++)
        lane[j] += (double)x[i] * (double)x[i];
    double s = 0;
    for (int j = 0; j < 8; j++)
        s += lane[j];
    return s;
}

static double sumsq_block_scalar(const float *x, size_t n)
{
    double lane[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            lane[j] += (double)x[i + j] * (double)x[i + j];
    return sumsq_lanes_done(lane, x, i, n);
}

__attribute__((target("avx2"))) static double sumsq_block_avx2(const float *x, size_t n)
{
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        lo = _mm256_add_pd(lo, _mm256_mul_pd(a, a));
        hi = _mm256_add_pd(hi, _mm256_mul_pd(b, b));
    }
    double lane[8];
    _mm256_storeu_pd(lane, lo);
    _mm256_storeu_pd(lane + 4, hi);
    return sumsq_lanes_done(lane, x, i, n);
}

__attribute__((target(AVX512_TARGET))) static double sumsq_block_avx512(const float *x, size_t n)
{
    __m512d acc = _mm512_setzero_pd();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m512d a = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        acc = _mm512_add_pd(acc, _mm512_mul_pd(a, a));
    }
    double lane[8];
    _mm512_storeu_pd(lane, acc);
    return sumsq_lanes_done(lane, x, i, n);
}

double sumsq_f32(enum adamw_isa isa, const float *x, size_t n)
{
    double (*block)(const float *, size_t) = isa == ADAMW_AVX512 ? sumsq_block_avx512
                                             : isa == ADAMW_AVX2 ? sumsq_block_avx2
                                                                 : sumsq_block_scalar;
    double total = 0;
    for (size_t i = 0; i < n; i += SUMSQ_BLOCK)
        total += block(x + i, n - i < SUMSQ_BLOCK ? n - i : SUMSQ_BLOCK);
    return total;
}

void grad_add_to(float *dst, const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = a[i] + b[i];
}

void grad_accumulate(float *dst, const float *src, size_t n, int first)
{
    if (first) {
        memcpy(dst, src, n * sizeof(float));
        return;
    }
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* dst = src with non-temporal stores: the lines go to memory without being read first. */
static void copy_streaming(void *dst, const void *src, size_t bytes)
{
    char *d = dst;
    const char *s = src;
    size_t head = (size_t)(-(uintptr_t)d & 15);
    head = head < bytes ? head : bytes;
    memcpy(d, s, head);
    d += head, s += head, bytes -= head;
    for (; bytes >= 64; d += 64, s += 64, bytes -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)s), b = _mm_loadu_si128((const __m128i *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + 32)), e = _mm_loadu_si128((const __m128i *)(s + 48));
        _mm_stream_si128((__m128i *)d, a);
        _mm_stream_si128((__m128i *)(d + 16), b);
        _mm_stream_si128((__m128i *)(d + 32), c);
        _mm_stream_si128((__m128i *)(d + 48), e);
    }
    for (; bytes >= 16; d += 16, s += 16, bytes -= 16)
        _mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
    memcpy(d, s, bytes);
}

void adamw_store_staged(float *p, void *m, void *v, uint16_t *p16, const float *sp, const void *sm, const void *sv,
                        const uint16_t *s16, size_t n, size_t state_size)
{
    memcpy(p, sp, n * sizeof(float));
    memcpy(m, sm, n * state_size);
    memcpy(v, sv, n * state_size);
    if (!p16) /* workers stream the master: no copy to write */
        return;
    copy_streaming(p16, s16, n * sizeof(uint16_t));
    _mm_sfence(); /* the streaming stores are ordered before whatever the caller publishes next */
}
