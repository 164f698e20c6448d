/* splitmix64, the one small generator behind everything seeded outside the model math: the data
 * order's per-epoch permutations (common/data.c) and slidedp-data's synthetic tasks. */
#ifndef SD_RNG_H
#define SD_RNG_H

#include <stdint.h>

/* Advances *state and returns the next 64 random bits (Steele, Lea and Flood's SplitMix64). */
static inline uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
