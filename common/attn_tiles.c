/* The deterministic attention backward's cuDNN calls (see attn_tiles.h). */
#include "common/attn_tiles.h"

#include <limits.h>
#include <math.h>

static size_t pad_rows(int n)
{
    return ((size_t)n + ATTN_TILE_ROWS - 1) / ATTN_TILE_ROWS * ATTN_TILE_ROWS;
}

static size_t align256(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

size_t attn_tile_dp_bytes(int nb, int hq, int tq, int tk)
{
    return (size_t)nb * hq * pad_rows(tq) * pad_rows(tk) * 2;
}

/* The largest divisor of n that is at most cap, and at least 1 (equal calls: one plan). */
static int divisor_at_most(int n, size_t cap)
{
    for (int d = n; d > 1; d--)
        if (n % d == 0 && (size_t)d <= cap)
            return d;
    return 1;
}

/* The longest multiple of ATTN_TILE_ROWS, below cap, whose square tile of G query heads keeps dP
 * within limit (ATTN_TILE_ROWS if none). */
static int longest_chunk(int G, size_t limit, int cap)
{
    int longest = ATTN_TILE_ROWS;
    while (longest + ATTN_TILE_ROWS < cap &&
           attn_tile_dp_bytes(1, G, longest + ATTN_TILE_ROWS, longest + ATTN_TILE_ROWS) <= limit)
        longest += ATTN_TILE_ROWS;
    return longest;
}

void attn_tiling_choose(int B, int T, int Hq, int Hkv, size_t limit, struct attn_tiling *t)
{
    *t = (struct attn_tiling){.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .nb = 1, .ng = Hkv, .chunk = T, .nchunks = 1};
    int G = Hq / Hkv;
    size_t sequence = attn_tile_dp_bytes(1, Hq, T, T), group = attn_tile_dp_bytes(1, G, T, T);
    if (sequence <= limit) {
        t->nb = divisor_at_most(B, limit / sequence);
        return;
    }
    if (group <= limit) {
        t->ng = divisor_at_most(Hkv, limit / group);
        return;
    }
    /* one KV head a call (its sums over the sequence are then the smallest), in equal chunks no
     * longer than the longest that fits */
    attn_tiling_chunked(B, T, Hq, Hkv, 1, longest_chunk(G, limit, T), t);
}

void attn_tiling_chunked(int B, int T, int Hq, int Hkv, int ng, int longest, struct attn_tiling *t)
{
    *t = (struct attn_tiling){.B = B, .T = T, .Hq = Hq, .Hkv = Hkv, .nb = 1, .ng = ng, .chunk = T, .nchunks = 1};
    int n = (T + longest - 1) / longest;
    if (n == 1) /* a sequence shorter than one tile */
        return;
    t->chunk = (int)pad_rows((T + n - 1) / n);
    t->nchunks = (T + t->chunk - 1) / t->chunk;
}

size_t attn_tiling_dp_bytes(const struct attn_tiling *t)
{
    return attn_tile_dp_bytes(t->nb, t->ng * (t->Hq / t->Hkv), t->chunk, t->chunk);
}

/* The next piece of n bytes at *at (256-byte aligned). */
static size_t take(size_t *at, size_t n)
{
    size_t piece = *at;
    *at += align256(n);
    return piece;
}

void attn_tiling_scratch(const struct attn_tiling *t, int D, size_t workspace, struct attn_tile_scratch *s)
{
    *s = (struct attn_tile_scratch){0};
    size_t at = align256(workspace);
    at = at ? at : 256;
    int hs = t->ng * (t->Hq / t->Hkv);
    size_t rows = (size_t)t->nb * hs * t->chunk * sizeof(float);
    s->lse = take(&at, rows);
    s->rowsum = take(&at, rows);
    if (t->nchunks > 1) {
        size_t q_part = (size_t)t->chunk * hs * D * sizeof(float), k_part = (size_t)t->chunk * t->ng * D * sizeof(float);
        size_t k_sum = (size_t)t->T * t->ng * D * sizeof(float);
        s->dq_part = take(&at, q_part);
        s->dk_part = take(&at, k_part);
        s->dv_part = take(&at, k_part);
        s->dq_sum = take(&at, q_part);
        s->dk_sum = take(&at, k_sum);
        s->dv_sum = take(&at, k_sum);
    }
    s->total = at;
}

size_t attn_tiling_scratch_bound(int B, int T, int Hq, int Hkv, int D, size_t limit)
{
    size_t dp = attn_tile_dp_bytes(B, Hq, T, T), rows = align256((size_t)B * Hq * T * sizeof(float));
    /* cuDNN's workspace is dP and its fp32 dQ accumulator, D floats per (query row, query head) of
     * the call. A call of n (batch entry, query head) pairs and t rows against t keys has n t^2 pairs
     * of dP, 2 bytes each, within limit, so n t is at most sqrt(n limit / 2), and n at most B Hq */
    size_t all = (size_t)B * Hq * T, most = (size_t)sqrt((double)B * Hq * (double)limit / 2);
    size_t dq_rows = most < all ? most : all;
    size_t workspace = (dp < limit ? dp : limit) + dq_rows * (size_t)D * sizeof(float) + ((size_t)1 << 20);
    size_t total = workspace + 256 + 256 + 2 * rows;
    if (dp > limit) { /* it may be chunked: one KV head's partial outputs and dQ sum over chunks no
                       * longer than the longest that fits any sequence, and its dK, dV sums */
        int G = Hq / Hkv;
        size_t longest = (size_t)longest_chunk(G, limit, INT_MAX);
        total += 2 * align256(longest * G * D * sizeof(float)) + 2 * align256(longest * D * sizeof(float)) +
                 2 * align256((size_t)T * D * sizeof(float));
    }
    return total;
}

void attn_tile_begin(struct attn_tile_iter *it, const struct attn_tiling *t)
{
    *it = (struct attn_tile_iter){.t = *t};
}

bool attn_tile_next(struct attn_tile_iter *it, struct attn_tile_call *c)
{
    const struct attn_tiling *t = &it->t;
    if (it->b >= t->B || t->T <= 0)
        return false;
    int last = t->nchunks - 1;
    *c = (struct attn_tile_call){
        .b0 = it->b,
        .nb = t->B - it->b < t->nb ? t->B - it->b : t->nb,
        .g0 = it->g,
        .ng = t->ng,
        .q0 = it->qc * t->chunk,
        .k0 = it->kc * t->chunk,
        .causal = it->kc == it->qc,
        .group_start = it->qc == 0 && it->kc == 0,
        .group_end = it->qc == last && it->kc == it->qc,
        .qchunk_start = it->kc == 0,
        .qchunk_end = it->kc == it->qc,
    };
    c->tq = t->T - c->q0 < t->chunk ? t->T - c->q0 : t->chunk;
    c->tk = c->causal ? c->tq : t->chunk;
    if (it->kc < it->qc) {
        it->kc++;
    } else if (it->qc < last) {
        it->kc = 0;
        it->qc++;
    } else {
        it->kc = it->qc = 0;
        it->g += t->ng;
        if (it->g >= t->Hkv) {
            it->g = 0;
            it->b += t->nb;
        }
    }
    return true;
}
