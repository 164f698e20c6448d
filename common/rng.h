/* SplitMix64 (Steele, Lea, Flood 2014): the one small counter-based generator of the tree. Used by
 * random init, data shuffling, the data generator, the tests and the optimizer's stochastic
 * rounding of bf16 state, which takes any draw directly (splitmix64_at) with no state to carry. */
#ifndef SD_RNG_H
#define SD_RNG_H

#include <stdint.h>

#define SPLITMIX64_GAMMA 0x9e3779b97f4a7c15ull

/* The output function: a bijective mix of a 64-bit counter. */
static inline uint64_t splitmix64_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Draw n (from 0) of the generator seeded with seed, without drawing the ones before it. */
static inline uint64_t splitmix64_at(uint64_t seed, uint64_t n)
{
    return splitmix64_mix(seed + (n + 1) * SPLITMIX64_GAMMA);
}

/* The next draw of the generator whose state is *x. */
static inline uint64_t splitmix64(uint64_t *x)
{
    return splitmix64_mix(*x += SPLITMIX64_GAMMA);
}

#endif
