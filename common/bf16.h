/* bf16 and fp16 <-> fp32 conversions (round to nearest even, NaN kept quiet), used by the loader,
 * the exporter, the CPU and CUDA backends and the optimizer's scalar path. */
#ifndef SD_BF16_H
#define SD_BF16_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* f32_to_bf16 (and f32_bits under it) is also the CUDA backend's rounding of streamed master weights
 * (worker/cuda), so the device gets the bits the optimizers' bf16 copy would hold: one definition
 * for both. */
#ifdef __CUDACC__
#define BF16_HOST_DEVICE __host__ __device__
#else
#define BF16_HOST_DEVICE
#endif

/* An fp32 value's bits, and the value of fp32 bits. */
static inline BF16_HOST_DEVICE uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float bf16_to_f32(uint16_t h)
{
    return f32_of_bits((uint32_t)h << 16);
}

static inline BF16_HOST_DEVICE uint16_t f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep sign and payload top, force quiet */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Stochastic rounding: x rounds away from zero (in magnitude) with probability equal to the
 * fraction of a bf16 ulp it lies beyond the value truncation gives, so the stored value is x on
 * average; r holds 16 uniformly random bits. NaN is kept quiet as in f32_to_bf16. */
static inline uint16_t f32_to_bf16_stochastic(float f, uint32_t r)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + (r & 0xffffu)) >> 16);
}

/* n elements: widened (exact) and rounded. */
static inline void bf16_to_f32_n(float *dst, const uint16_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = bf16_to_f32(src[i]);
}

static inline void f32_to_bf16_n(uint16_t *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = f32_to_bf16(src[i]);
}

/* Rounds an fp32 value to the nearest bf16-representable fp32 value. */
static inline float f32_round_bf16(float f)
{
    return bf16_to_f32(f32_to_bf16(f));
}

/* IEEE half precision, by bit manipulation (portable: no compiler _Float16 support needed). */
static inline float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0)
        u = sign | f32_bits((float)mant * (1.0f / 16777216.0f)); /* subnormal: mant * 2^-24, exact */
    else if (exp == 31)
        u = sign | 0x7f800000u | (mant << 13);
    else
        u = sign | ((exp + 112u) << 23) | (mant << 13);
    return f32_of_bits(u);
}

/* Round to nearest even; NaN stays NaN, overflow becomes infinity. */
static inline uint16_t f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t a = x & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u) /* 65520 and above round to infinity */
        return sign | 0x7c00u;
    if (a < 0x38800000u) /* below 2^-14: subnormal; v * 2^24 is exact, rintf rounds to even */
        return sign | (uint16_t)rintf(f32_of_bits(a) * 16777216.0f);
    uint32_t r = a - 0x38000000u; /* rebias the exponent from 127 to 15 */
    r += 0xfffu + ((r >> 13) & 1u);
    return sign | (uint16_t)(r >> 13);
}

#endif
