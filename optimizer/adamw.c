/* Vectorised AdamW with fused bf16 output, gradient accumulation and sum of squares; scalar, AVX2
 * and AVX-512 paths chosen at run time. Every path performs the same fp32 operations in the same
 * order (no FMA: the build uses -ffp-contract=off here), so results are bit-identical across
 * ISAs and across how the work is split. */
#include "adamw.h"

#include <immintrin.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"

enum adamw_isa adamw_isa_detect(void)
{
    const char *force = getenv("SLIDEDP_ISA");
    __builtin_cpu_init();
    bool has512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
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
    c.neg_step = (float)(-(double)s->lr / bc1);
    c.eps = s->eps;
    c.gscale = s->grad_scale;
    return c;
}

/* Input and output arrays (each may alias its input). */
struct io {
    const float *p, *m, *v, *g;
    float *po, *mo, *vo;
    uint16_t *p16;
};

static inline void adamw_one(const struct consts *c, const struct io *a, size_t i)
{
    float gi = a->g[i] * c->gscale;
    float pi = a->p[i] * c->decay;
    float mo = a->m[i];
    float mi = c->lerp_low ? mo + c->w1 * (gi - mo) : gi - (gi - mo) * (1.0f - c->w1);
    float vi = a->v[i] * c->b2 + (c->w2 * gi) * gi;
    float denom = sqrtf(vi) / c->bc2_sqrt + c->eps;
    pi = pi + c->neg_step * (mi / denom);
    a->po[i] = pi;
    a->mo[i] = mi;
    a->vo[i] = vi;
    a->p16[i] = f32_to_bf16(pi);
}

static void adamw_scalar(const struct consts *c, const struct io *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        adamw_one(c, a, i);
}

__attribute__((target("avx2"))) static inline __m128i bf16_pack8_avx2(__m256 x)
{
    __m256i u = _mm256_castps_si256(x);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
    __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));
    __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
    return _mm_packus_epi32(lo, hi);
}

__attribute__((target("avx2"))) static void adamw_avx2(const struct consts *c, const struct io *a, size_t n)
{
    const __m256 gscale = _mm256_set1_ps(c->gscale), decay = _mm256_set1_ps(c->decay), w1 = _mm256_set1_ps(c->w1),
                 one_w1 = _mm256_set1_ps(1.0f - c->w1), b2 = _mm256_set1_ps(c->b2), w2 = _mm256_set1_ps(c->w2),
                 bc2s = _mm256_set1_ps(c->bc2_sqrt), neg_step = _mm256_set1_ps(c->neg_step),
                 eps = _mm256_set1_ps(c->eps);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(a->g + i), gscale);
        __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(a->p + i), decay);
        __m256 mo = _mm256_loadu_ps(a->m + i);
        __m256 mi = c->lerp_low ? _mm256_add_ps(mo, _mm256_mul_ps(w1, _mm256_sub_ps(gi, mo)))
                                : _mm256_sub_ps(gi, _mm256_mul_ps(_mm256_sub_ps(gi, mo), one_w1));
        __m256 vi =
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(a->v + i), b2), _mm256_mul_ps(_mm256_mul_ps(w2, gi), gi));
        __m256 denom = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2s), eps);
        pi = _mm256_add_ps(pi, _mm256_mul_ps(neg_step, _mm256_div_ps(mi, denom)));
        _mm256_storeu_ps(a->po + i, pi);
        _mm256_storeu_ps(a->mo + i, mi);
        _mm256_storeu_ps(a->vo + i, vi);
        _mm_storeu_si128((__m128i *)(a->p16 + i), bf16_pack8_avx2(pi));
    }
    for (; i < n; i++)
        adamw_one(c, a, i);
}

__attribute__((target("avx512f,avx512bw"))) static void adamw_avx512(const struct consts *c, const struct io *a,
                                                                     size_t n)
{
    const __m512 gscale = _mm512_set1_ps(c->gscale), decay = _mm512_set1_ps(c->decay), w1 = _mm512_set1_ps(c->w1),
                 one_w1 = _mm512_set1_ps(1.0f - c->w1), b2 = _mm512_set1_ps(c->b2), w2 = _mm512_set1_ps(c->w2),
                 bc2s = _mm512_set1_ps(c->bc2_sqrt), neg_step = _mm512_set1_ps(c->neg_step),
                 eps = _mm512_set1_ps(c->eps);
    const __m512i one = _mm512_set1_epi32(1), bias = _mm512_set1_epi32(0x7fff), absmask = _mm512_set1_epi32(0x7fffffff),
                  inf = _mm512_set1_epi32(0x7f800000), qbit = _mm512_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(a->g + i), gscale);
        __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(a->p + i), decay);
        __m512 mo = _mm512_loadu_ps(a->m + i);
        __m512 mi = c->lerp_low ? _mm512_add_ps(mo, _mm512_mul_ps(w1, _mm512_sub_ps(gi, mo)))
                                : _mm512_sub_ps(gi, _mm512_mul_ps(_mm512_sub_ps(gi, mo), one_w1));
        __m512 vi =
            _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(a->v + i), b2), _mm512_mul_ps(_mm512_mul_ps(w2, gi), gi));
        __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2s), eps);
        pi = _mm512_add_ps(pi, _mm512_mul_ps(neg_step, _mm512_div_ps(mi, denom)));
        _mm512_storeu_ps(a->po + i, pi);
        _mm512_storeu_ps(a->mo + i, mi);
        _mm512_storeu_ps(a->vo + i, vi);
        __m512i u = _mm512_castps_si512(pi);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), one);
        __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(bias, lsb)), 16);
        __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, absmask), inf);
        __m512i r = _mm512_mask_or_epi32(rounded, nan, _mm512_srli_epi32(u, 16), qbit);
        _mm256_storeu_si256((__m256i *)(a->p16 + i), _mm512_cvtepi32_epi16(r));
    }
    for (; i < n; i++)
        adamw_one(c, a, i);
}

void adamw_update_to(enum adamw_isa isa, const struct adamw_step *s, const float *p, const float *m, const float *v,
                     const float *g, float *p_out, float *m_out, float *v_out, uint16_t *p16, size_t n)
{
    struct consts c = consts_of(s);
    struct io a = {p, m, v, g, p_out, m_out, v_out, p16};
    switch (isa) {
    case ADAMW_AVX512:
        adamw_avx512(&c, &a, n);
        break;
    case ADAMW_AVX2:
        adamw_avx2(&c, &a, n);
        break;
    default:
        adamw_scalar(&c, &a, n);
    }
}

void adamw_update(enum adamw_isa isa, const struct adamw_step *s, float *p, float *m, float *v, const float *g,
                  uint16_t *p16, size_t n)
{
    adamw_update_to(isa, s, p, m, v, g, p, m, v, p16, n);
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

__attribute__((target("avx512f"))) static double sumsq_block_avx512(const float *x, size_t n)
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

void adamw_store_staged(float *p, float *m, float *v, uint16_t *p16, const float *sp, const float *sm, const float *sv,
                        const uint16_t *s16, size_t n)
{
    memcpy(p, sp, n * sizeof(float));
    memcpy(m, sm, n * sizeof(float));
    memcpy(v, sv, n * sizeof(float));
    copy_streaming(p16, s16, n * sizeof(uint16_t));
    _mm_sfence(); /* the streaming stores are ordered before whatever the caller publishes next */
}
