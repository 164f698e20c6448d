/* How the CUDA backend's deterministic attention backward cuts one causal attention backward into
 * cuDNN calls. cuDNN's deterministic engine (dQ by a plain matmul of the whole dS, no atomics) keeps
 * dP for every (query, key) pair of a call in its workspace, 2 bytes per pair per query head, so a
 * call's batch entries, heads and rows are bounded by a workspace limit:
 *   - whole sequences while they fit (as many batch entries, else as many KV heads as do);
 *   - else chunks of `chunk` rows, per KV head: each query chunk against each key chunk up to it
 *     (the diagonal one causal, the others every pair), dQ and dK/dV summed over the tiles in fp32
 *     in a fixed order.
 * The worker walks the calls with attn_tile_next; the planner sizes the scratch with the same
 * arithmetic; tests check that the calls cover each causal pair once. */
#ifndef SD_ATTN_TILES_H
#define SD_ATTN_TILES_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ATTN_TILE_WORKSPACE_DEFAULT ((size_t)1 << 30)
#define ATTN_TILE_ROWS 64 /* cuDNN pads dP's rows and columns to 64; chunks are multiples of it */

struct attn_tiling {
    int B, T, Hq, Hkv;
    int nb;      /* batch entries per call (1 when chunked) */
    int ng;      /* KV heads per call, with their ng * Hq / Hkv query heads */
    int chunk;   /* rows of a query or key chunk; T when each call takes whole sequences */
    int nchunks; /* chunks per sequence (1: whole sequences) */
};

/* One cuDNN call: batch entries b0..b0+nb-1, KV heads g0..g0+ng-1, query rows q0..q0+tq-1 against
 * key rows k0..k0+tk-1. */
struct attn_tile_call {
    int b0, nb, g0, ng;
    int q0, tq, k0, tk;
    bool causal;        /* a diagonal tile (k0 == q0): query q0+i sees keys up to k0+i; else every pair */
    bool group_start;   /* the first call of its (batch entry, KV heads): dK and dV sums start */
    bool group_end;     /* its last: dK and dV are complete */
    bool qchunk_start;  /* the first call of its query chunk: the dQ sum starts */
    bool qchunk_end;    /* its last: dQ of the chunk is complete */
};

struct attn_tile_iter {
    struct attn_tiling t;
    int b, g, qc, kc;
};

/* dP bytes of a call of nb batch entries, hq query heads, tq x tk rows (cuDNN's padding to 64). */
size_t attn_tile_dp_bytes(int nb, int hq, int tq, int tk);
/* The tiling for B sequences of T tokens whose calls keep dP within limit bytes (chunks never
 * shorter than ATTN_TILE_ROWS, so a limit below one such tile is exceeded by that tile). */
void attn_tiling_choose(int B, int T, int Hq, int Hkv, size_t limit, struct attn_tiling *t);
/* Calls of ng KV heads (a divisor of Hkv) in equal chunks of at most longest rows (a multiple of
 * ATTN_TILE_ROWS), one batch entry each, whatever dP they take: attn_tiling_choose's last resort at
 * one head, and bench_attention's other shapes. */
void attn_tiling_chunked(int B, int T, int Hq, int Hkv, int ng, int longest, struct attn_tiling *t);
/* The scratch of the calls, offsets in bytes: cuDNN's workspace first, then a call's lse (copied
 * compact) and row sums, and when chunked a tile's fp32 partial dQ, dK, dV and their sums (dQ over a
 * query chunk, dK and dV over the whole sequence); each piece 256-byte aligned, 0 when unused. */
struct attn_tile_scratch {
    size_t lse, rowsum, dq_part, dk_part, dv_part, dq_sum, dk_sum, dv_sum, total;
};
void attn_tiling_scratch(const struct attn_tiling *t, int D, size_t workspace, struct attn_tile_scratch *s);
/* An upper bound of attn_tiling_scratch's total for any tiling of B x T under limit, with cuDNN's
 * workspace taken as dP, its fp32 dQ accumulator (what bench_attention's plans reported: 8256 MiB
 * for 8 GiB of dP over 4 query heads of 32768 rows) and 1 MiB, that never falls as T grows (the
 * planner's longest-sequence search bisects over T). */
size_t attn_tiling_scratch_bound(int B, int T, int Hq, int Hkv, int D, size_t limit);
/* The largest dP of the tiling's calls (the workspace cuDNN will ask for, about). */
size_t attn_tiling_dp_bytes(const struct attn_tiling *t);

void attn_tile_begin(struct attn_tile_iter *it, const struct attn_tiling *t);
/* The next call into *c; false when every call has been given. */
bool attn_tile_next(struct attn_tile_iter *it, struct attn_tile_call *c);

#ifdef __cplusplus
}
#endif

#endif
