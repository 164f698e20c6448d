/* Cutting an operation's blocks into segments that threads claim one at a time (the optimizer's
 * reductions and updates, and the host calibration that times them the same way). */
#pragma once

#include <stdint.h>

/* At least this many blocks a segment (4 blocks of 8192 elements: about 0.1 ms of one thread's
 * update), so claims stay rare beside the work. */
#define SEGMENT_MIN_BLOCKS 4

/* Each segment is the blocks left divided by this many per thread: a thread at half speed all
 * along (a core shared with its hyperthread sibling or a worker's thread) finishes its first one
 * in half the time an even share of the whole would take. */
#define SEGMENT_SHARES 4

/* Cuts n blocks into segments, largest first: each is the blocks left divided by SEGMENT_SHARES
 * times the threads (at least SEGMENT_MIN_BLOCKS; the last of max_segments takes all that is left).
 * Whichever threads run slow (a shared core, a preemption), the others claim what is left and all
 * finish within one small segment of each other. Writes bounds[0..count] (bounds[count] = n) and
 * returns count. The cut depends only on n and threads, so a restarted optimizer resumes the same
 * segments. */
static inline uint32_t segments_cut(uint32_t n, int threads, uint32_t max_segments, uint32_t *bounds)
{
    uint32_t b = 0, k = 0;
    while (b < n) {
        uint32_t size = (n - b) / (SEGMENT_SHARES * (uint32_t)threads);
        if (size < SEGMENT_MIN_BLOCKS)
            size = SEGMENT_MIN_BLOCKS;
        if (size > n - b || k == max_segments - 1)
            size = n - b;
        bounds[k++] = b;
        b += size;
    }
    bounds[k] = n;
    return k;
}
