/* The deterministic attention backward's cuDNN calls (common/attn_tiles.h): every causal (query,
 * key) pair of every batch entry and KV head in exactly one call and no other pair; the sums' flags
 * bracket exactly the calls that feed them; each call's dP within the bound; the scratch pieces
 * apart and large enough, and within the planner's bound, which grows with T; and the tilings the
 * bench shapes get at the default bound; the same walk over chunked calls of several KV heads
 * (attn_tiling_chunked). */
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

#include "common/attn_tiles.h"

#define D 128

/* Walks the calls of one tiling as attention_det.cu does, with counters in place of the sums; limit
 * the bound it was chosen for (0: none, a tiling given by its heads and rows). */
static void check_calls(const struct attn_tiling *tiling, size_t limit)
{
    const struct attn_tiling t = *tiling;
    const int B = t.B, T = t.T, Hq = t.Hq, Hkv = t.Hkv, G = Hq / Hkv;
    const size_t floor_dp = attn_tile_dp_bytes(1, G, ATTN_TILE_ROWS, ATTN_TILE_ROWS);
    assert_true(t.nb >= 1 && t.nb <= B && B % t.nb == 0);
    assert_true(t.ng >= 1 && t.ng <= Hkv && Hkv % t.ng == 0);
    assert_true(t.nchunks == 1 ? t.chunk == T : t.chunk % ATTN_TILE_ROWS == 0 && t.nb == 1);
    if (limit > 0 && t.nchunks > 1)
        assert_int_equal(t.ng, 1); /* chosen chunks take one KV head a call */
    assert_true((t.nchunks - 1) * t.chunk < T && t.nchunks * t.chunk >= T);

    /* pairs[((b * Hkv + g) * T + i) * T + j]: the calls that took query i and key j */
    unsigned char *pairs = calloc((size_t)B * Hkv * T * T, 1);
    /* the open sums: dq_rows[i] keys added for query row i of the open query chunk; dk_keys[j] the
     * queries added for key j of the open group */
    int *dq_rows = calloc((size_t)T, sizeof(int)), *dk_keys = calloc((size_t)T, sizeof(int));
    assert_non_null(pairs);
    assert_non_null(dq_rows);
    assert_non_null(dk_keys);
    struct attn_tile_scratch s;
    attn_tiling_scratch(&t, D, 1000, &s);
    size_t pieces[] = {s.lse, s.rowsum, s.dq_part, s.dk_part, s.dv_part, s.dq_sum, s.dk_sum, s.dv_sum};
    for (size_t i = 0; i + 1 < sizeof pieces / sizeof pieces[0]; i++)
        assert_true(pieces[i + 1] == 0 || pieces[i + 1] > pieces[i]);
    assert_true(s.lse >= 1000 && s.total > s.rowsum);

    /* cuDNN's workspace as its plans reported it: dP and the call's fp32 dQ (D floats per query row
     * and query head), and 1 MiB */
    struct attn_tile_scratch priced;
    size_t dq_acc = (size_t)t.nb * t.ng * G * t.chunk * D * sizeof(float);
    attn_tiling_scratch(&t, D, attn_tiling_dp_bytes(&t) + dq_acc + ((size_t)1 << 20), &priced);
    if (limit > 0 && limit >= floor_dp)
        assert_true(priced.total <= attn_tiling_scratch_bound(B, T, Hq, Hkv, D, limit));
    bool group_open = false, chunk_open = false;
    int chunk_q0 = -1, chunk_tq = 0, calls = 0;
    struct attn_tile_iter it;
    struct attn_tile_call c;
    for (attn_tile_begin(&it, &t); attn_tile_next(&it, &c); calls++) {
        assert_true(c.nb >= 1 && c.b0 + c.nb <= B && c.g0 + c.ng <= Hkv && c.ng == t.ng);
        assert_true(c.tq >= 1 && c.q0 + c.tq <= T && c.tk >= 1 && c.k0 + c.tk <= T);
        if (c.causal)
            assert_true(c.k0 == c.q0 && c.tk == c.tq);
        else
            assert_true(c.k0 + c.tk <= c.q0); /* every pair of the tile is causal */
        size_t dp = attn_tile_dp_bytes(c.nb, c.ng * G, c.tq, c.tk);
        assert_true(dp <= attn_tiling_dp_bytes(&t));
        if (limit > 0 && limit >= floor_dp)
            assert_true(dp <= limit);
        /* scratch: the call's lse and row sums, and in chunks its partial outputs and the sums */
        size_t rows = (size_t)c.nb * c.ng * G * c.tq * 4;
        assert_true(s.lse + rows <= s.rowsum && s.rowsum + rows <= (s.dq_part ? s.dq_part : s.total));
        if (t.nchunks > 1) {
            assert_true(s.dq_part + (size_t)c.tq * c.ng * G * D * 4 <= s.dk_part);
            assert_true(s.dk_part + (size_t)c.tk * c.ng * D * 4 <= s.dv_part);
            assert_true(s.dk_sum + (size_t)T * c.ng * D * 4 <= s.dv_sum && s.dv_sum + (size_t)T * c.ng * D * 4 <= s.total);
        }

        if (c.group_start) {
            assert_false(group_open);
            group_open = true;
            memset(dk_keys, 0, (size_t)T * sizeof(int));
        }
        assert_true(group_open);
        if (c.qchunk_start) {
            assert_false(chunk_open);
            chunk_open = true;
            chunk_q0 = c.q0;
            chunk_tq = c.tq;
            memset(dq_rows, 0, (size_t)T * sizeof(int));
        }
        assert_true(chunk_open && c.q0 == chunk_q0 && c.tq == chunk_tq);
        for (int b = c.b0; b < c.b0 + c.nb; b++)
            for (int g = c.g0; g < c.g0 + c.ng; g++)
                for (int i = c.q0; i < c.q0 + c.tq; i++) {
                    int last = c.causal ? i : c.k0 + c.tk - 1;
                    for (int j = c.k0; j <= last; j++)
                        pairs[(((size_t)b * Hkv + g) * T + i) * T + j]++;
                }
        for (int i = c.q0; i < c.q0 + c.tq; i++) {
            int last = c.causal ? i : c.k0 + c.tk - 1;
            dq_rows[i] += last - c.k0 + 1;
            for (int j = c.k0; j <= last; j++)
                dk_keys[j]++;
        }
        if (c.qchunk_end) { /* dQ stored: every row has all its keys */
            for (int i = c.q0; i < c.q0 + c.tq; i++)
                assert_int_equal(dq_rows[i], i + 1);
            chunk_open = false;
        }
        if (c.group_end) { /* dK, dV stored: every key has all its queries */
            assert_false(chunk_open);
            for (int j = 0; j < T; j++)
                assert_int_equal(dk_keys[j], T - j);
            group_open = false;
        }
    }
    assert_false(group_open);
    assert_true(calls > 0);
    for (int b = 0; b < B; b++)
        for (int g = 0; g < Hkv; g++)
            for (int i = 0; i < T; i++)
                for (int j = 0; j < T; j++)
                    assert_int_equal(pairs[(((size_t)b * Hkv + g) * T + i) * T + j], j <= i);
    free(pairs);
    free(dq_rows);
    free(dk_keys);
}

static void check_tiling(int B, int T, int Hq, int Hkv, size_t limit)
{
    struct attn_tiling t;
    attn_tiling_choose(B, T, Hq, Hkv, limit, &t);
    check_calls(&t, limit);
}

/* Calls of several KV heads in chunks (attn_tiling_chunked, as bench_attention asks for them). */
static void check_chunked(int B, int T, int Hq, int Hkv, int ng, int rows)
{
    struct attn_tiling t;
    attn_tiling_chunked(B, T, Hq, Hkv, ng, rows, &t);
    assert_int_equal(t.ng, ng);
    assert_true(t.chunk <= rows || t.nchunks == 1);
    check_calls(&t, 0);
}

/* Every branch: whole batches, some batch entries, some heads, chunks (even and uneven; one KV
 * head a call), a sequence shorter than a tile that does not fit. */
static void test_calls_cover_causal_pairs_once(void **state)
{
    const size_t KiB = 1024;
    check_tiling(2, 300, 8, 2, 64 * 1024 * KiB); /* whole */
    check_tiling(4, 300, 8, 2, 4096 * KiB);      /* two batch entries a call */
    check_tiling(1, 300, 8, 4, 900 * KiB);       /* two KV heads (4 query heads) a call */
    check_tiling(2, 300, 8, 2, 64 * KiB);        /* uneven chunks of 64 */
    check_tiling(1, 256, 4, 4, 64 * KiB);        /* even chunks */
    check_tiling(1, 1000, 6, 3, 1500 * KiB);     /* uneven chunks of 512 */
    check_tiling(2, 40, 4, 2, 1 * KiB);          /* shorter than a tile, nothing fits */
    check_tiling(1, 1, 2, 1, 1 * KiB);
    check_chunked(2, 300, 8, 4, 2, 128); /* two KV heads a call, uneven chunks */
    check_chunked(1, 1000, 16, 8, 4, 256);
    check_chunked(1, 513, 16, 8, 8, 64); /* every head */
    check_chunked(2, 100, 8, 2, 2, 128); /* one chunk */
    uint64_t rng = tu_seed("test_attn_tiles", 31);
    for (int n = 0; n < 40; n++) {
        static const int heads[][2] = {{2, 1}, {4, 2}, {8, 2}, {6, 3}, {4, 4}};
        int h = (int)(tu_uniform(&rng) * 5), B = 1 + (int)(tu_uniform(&rng) * 3), T = 1 + (int)(tu_uniform(&rng) * 400);
        size_t limit = (size_t)(tu_uniform(&rng) * 2e6);
        check_tiling(B, T, heads[h][0], heads[h][1], limit);
    }
}

/* The planner's bound of the scratch never falls as the sequence grows (the longest-sequence
 * search bisects over it), at the bench model's heads and the default limit, and at a small limit. */
static void test_scratch_bound_grows_with_t(void **state)
{
    for (size_t limit = ATTN_TILE_WORKSPACE_DEFAULT; limit >= (64 << 10); limit >>= 14) {
        size_t before = 0;
        for (int T = 1; T <= 600000; T += 1 + T / 64) {
            size_t bound = attn_tiling_scratch_bound(2, T, 16, 8, D, limit);
            assert_true(bound >= before);
            before = bound;
        }
    }
}

/* What the default bound gives the bench shapes (docs/performance.md, issue 31, 16 query heads
 * over 8): one call for 2 x 4096 (1 GiB of dP), two batch entries a call for 8 x 4096, half the
 * heads for 8192, and per KV head chunks of 16384 rows (2 query heads x 16384^2 x 2 bytes = 1 GiB)
 * at 32K, 131K and 524K. */
static void test_default_tilings(void **state)
{
    static const struct {
        int B, T, nb, ng, chunk, nchunks, calls;
    } want[] = {
        {2, 4096, 2, 8, 4096, 1, 1},
        {8, 4096, 2, 8, 4096, 1, 4},
        {1, 8192, 1, 4, 8192, 1, 2},
        {1, 32768, 1, 1, 16384, 2, 3 * 8},
        {1, 131072, 1, 1, 16384, 8, 36 * 8},
        {1, 524288, 1, 1, 16384, 32, 528 * 8},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        struct attn_tiling t;
        attn_tiling_choose(want[i].B, want[i].T, 16, 8, ATTN_TILE_WORKSPACE_DEFAULT, &t);
        assert_int_equal(t.nb, want[i].nb);
        assert_int_equal(t.ng, want[i].ng);
        assert_int_equal(t.chunk, want[i].chunk);
        assert_int_equal(t.nchunks, want[i].nchunks);
        assert_true(attn_tiling_dp_bytes(&t) <= ATTN_TILE_WORKSPACE_DEFAULT);
        struct attn_tile_iter it;
        struct attn_tile_call c;
        int calls = 0;
        for (attn_tile_begin(&it, &t); attn_tile_next(&it, &c);)
            calls++;
        assert_int_equal(calls, want[i].calls);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_calls_cover_causal_pairs_once),
        cmocka_unit_test(test_scratch_bound_grows_with_t),
        cmocka_unit_test(test_default_tilings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
