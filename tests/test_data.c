/* Unit tests of common/data.c: the sequence order contract (docs/design.md §2.3) over llm.c v1/v7 and SFT
 * shards, data-parallel equivalence of the index formula, per-epoch shuffling, SFT target masks,
 * the writers, rejection of bad files, and the slidedp-data generator's output. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/data.h"
#include "common/err.h"

enum { MAX_T = 64 }; /* longest seq_len used here; buffers are sized for it */

static char path_buf[8][1200];
static int path_slot;

/* dir/name in a rotating static buffer. */
static const char *pjoin(const char *dir, const char *name)
{
    char *p = path_buf[path_slot++ % 8];
    snprintf(p, 1200, "%s/%s", dir, name);
    return p;
}

/* Tokens equal to base + their global position, positions [from, from + n). */
static uint32_t *position_tokens(int64_t from, int64_t n, uint32_t base)
{
    uint32_t *t = malloc((size_t)n * sizeof *t);
    for (int64_t i = 0; i < n; i++)
        t[i] = base + (uint32_t)(from + i);
    return t;
}

static void write_llmc(const char *path, int64_t from, int64_t n, uint32_t base, bool u32)
{
    uint32_t *t = position_tokens(from, n, base);
    if (data_write_llmc(path, t, n, u32) != 0)
        fail_msg("%s", sd_errmsg());
    free(t);
}

/* Raw file writer for malformed shards: header ints h[0..2], then `payload` bytes of zeros. */
static void write_raw(const char *path, int32_t magic, int32_t version, int32_t count, size_t header_bytes,
                      size_t payload)
{
    int32_t h[DATA_HEADER_INTS] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(h, 1, header_bytes, f), header_bytes);
    for (size_t i = 0; i < payload; i++)
        fputc(0, f);
    fclose(f);
}

/* Checks sequence k of d starts at global position kk*T and tokens are base + position. */
static void check_sequence(struct data_set *d, int64_t k, int64_t kk, uint32_t base)
{
    int T = d->seq_len;
    int32_t tok[MAX_T + 1];
    uint8_t mask[MAX_T];
    assert_true(T <= MAX_T);
    memset(mask, 7, sizeof mask);
    assert_int_equal(data_sequence(d, k, tok, mask), 0);
    for (int j = 0; j <= T; j++)
        assert_int_equal((uint32_t)tok[j], base + (uint32_t)(kk * T + j));
    for (int j = 0; j < T; j++)
        assert_int_equal(mask[j], 1);
}

/* Two shards named so that byte order differs from numeric and creation order: tok_10.bin
 * (positions 0..99) sorts before tok_9.bin (positions 100..196). */
static void order_two_shards(bool u32_first, bool u32_second, uint32_t base)
{
    enum { T = 16 };
    const char *dir = tu_tmpdir(0, "data-order");
    write_llmc(pjoin(dir, "tok_9.bin"), 100, 97, base, u32_second);
    write_llmc(pjoin(dir, "tok_10.bin"), 0, 100, base, u32_first);

    struct data_set d;
    assert_int_equal(data_open(pjoin(dir, "tok_*.bin"), T, 0, false, 0, &d), 0);
    assert_int_equal(d.num_shards, 2);
    assert_string_equal(d.shards[0].path, pjoin(dir, "tok_10.bin"));
    assert_int_equal(d.num_tokens, 197);
    assert_int_equal(d.num_sequences, (197 - 1) / T); /* 12 */
    assert_false(d.has_flags);
    assert_int_equal(d.shards[0].token_bytes, u32_first ? 4 : 2);
    assert_int_equal(d.shards[1].token_bytes, u32_second ? 4 : 2);

    /* k -> k mod 12; sequence 6 covers positions 96..112, across the shard boundary at 100. */
    static const int64_t ks[][2] = {{0, 0}, {1, 1}, {6, 6}, {11, 11}, {12, 0}, {13, 1}, {30, 6}, {143, 11}};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        check_sequence(&d, ks[i][0], ks[i][1], base);

    int32_t tok[T + 1];
    assert_int_equal(data_sequence(&d, 5, tok, NULL), 0); /* mask optional */
    assert_int_equal((uint32_t)tok[0], base + 80);
    assert_int_equal(data_sequence(&d, -1, tok, NULL), -1);
    data_close(&d);

    /* A single path (no glob) reads just that shard: 97 tokens -> 6 sequences of 16. */
    assert_int_equal(data_open(pjoin(dir, "tok_9.bin"), T, 0, false, 0, &d), 0);
    assert_int_equal(d.num_sequences, 6);
    int32_t t2[T + 1];
    assert_int_equal(data_sequence(&d, 7, t2, NULL), 0);
    assert_int_equal((uint32_t)t2[0], base + 100 + 16);
    data_close(&d);
    tu_rmrf(dir);
}

static void test_order_llmc_v1(void **state)
{
    order_two_shards(false, false, 0);
}

static void test_order_llmc_v7(void **state)
{
    order_two_shards(true, true, 1u << 20); /* values that need uint32 */
}

static void test_order_mixed_versions(void **state)
{
    order_two_shards(false, true, 7);
}

static void test_seq_index_formula(void **state)
{
    /* data_seq_index(step, a, r, i, grad_accum, gpus, micro_batch)
     * = (((step-1)*grad_accum + a)*gpus + r)*micro_batch + i, worked out by hand. */
    assert_int_equal(data_seq_index(1, 0, 0, 0, 1, 1, 1), 0);
    assert_int_equal(data_seq_index(2, 0, 0, 0, 1, 1, 1), 1);
    assert_int_equal(data_seq_index(1, 0, 0, 1, 1, 1, 2), 1);
    assert_int_equal(data_seq_index(2, 0, 0, 1, 1, 1, 2), 3);   /* (1*1+0)*1*2+1 */
    assert_int_equal(data_seq_index(1, 1, 0, 0, 2, 1, 2), 2);   /* ((0+1)*1+0)*2+0 */
    assert_int_equal(data_seq_index(1, 0, 1, 0, 1, 2, 1), 1);   /* ((0+0)*2+1)*1+0 */
    assert_int_equal(data_seq_index(3, 1, 2, 1, 4, 3, 2), 59);  /* ((2*4+1)*3+2)*2+1 = 29*2+1 */
    assert_int_equal(data_seq_index(4, 1, 0, 1, 2, 1, 2), 15);  /* ((3*2+1)*1+0)*2+1 */
    assert_int_equal(data_seq_index(5, 3, 7, 3, 4, 8, 4), 639); /* ((4*4+3)*8+7)*4+3 = 159*4+3 */
    /* Large steps: ((999999*8+7)*8+7)*16+15, and a product beyond 32 bits. */
    assert_int_equal(data_seq_index(1000000, 7, 7, 15, 8, 8, 16), 1023999999LL);
    assert_int_equal(data_seq_index(100000000, 0, 0, 0, 64, 64, 64), 99999999LL * 64 * 64 * 64);
}

/* The sequences used at one step by gpus=G, grad_accum=A equal those of gpus=1,
 * grad_accum=G*A, in the micro-batch order a*G + r. */
static void test_dp_equivalence(void **state)
{
    static const int cases[][3] = {{1, 1, 1}, {2, 1, 1}, {4, 3, 2}, {3, 2, 5}, {8, 4, 1}, {2, 8, 3}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int G = cases[c][0], A = cases[c][1], mb = cases[c][2];
        int per_step = G * A * mb;
        int seen[64];
        assert_true(per_step <= 64);
        for (int64_t s = 1; s <= 6; s++) {
            memset(seen, 0, sizeof seen);
            for (int a = 0; a < A; a++)
                for (int r = 0; r < G; r++)
                    for (int i = 0; i < mb; i++) {
                        int64_t k = data_seq_index(s, a, r, i, A, G, mb);
                        int64_t k1 = data_seq_index(s, a * G + r, 0, i, G * A, 1, mb);
                        assert_int_equal(k, k1);
                        /* As a set: exactly the step's block [(s-1)*per_step, s*per_step). */
                        assert_true(k >= (s - 1) * per_step && k < s * per_step);
                        seen[k - (s - 1) * per_step]++;
                    }
            for (int j = 0; j < per_step; j++)
                assert_int_equal(seen[j], 1);
        }
    }
}

static void test_shuffle(void **state)
{
    uint64_t seed = tu_seed("shuffle", 20260101);
    enum { T = 8, nseq = 50 };
    const char *dir = tu_tmpdir(0, "data-shuffle");
    write_llmc(pjoin(dir, "s.bin"), 0, nseq * T + 3, 0, false);
    const char *path = pjoin(dir, "s.bin");

    struct data_set d, d2, d3;
    assert_int_equal(data_open(path, T, 0, true, seed, &d), 0);
    assert_int_equal(d.num_sequences, nseq);
    int64_t order[3][nseq];
    int32_t tok[T + 1];
    for (int e = 0; e < 3; e++) {
        int count[nseq];
        memset(count, 0, sizeof count);
        for (int64_t j = 0; j < nseq; j++) {
            assert_int_equal(data_sequence(&d, e * nseq + j, tok, NULL), 0);
            assert_int_equal(tok[0] % T, 0);
            for (int t = 0; t <= T; t++)
                assert_int_equal(tok[t], tok[0] + t);
            order[e][j] = tok[0] / T;
            count[order[e][j]]++;
        }
        for (int64_t j = 0; j < nseq; j++)
            assert_int_equal(count[j], 1); /* every index once per epoch */
    }
    assert_memory_not_equal(order[0], order[1], sizeof order[0]);
    assert_memory_not_equal(order[1], order[2], sizeof order[0]);
    int64_t identity[nseq];
    for (int64_t j = 0; j < nseq; j++)
        identity[j] = j;
    assert_memory_not_equal(order[0], identity, sizeof identity);

    /* Going back to an earlier epoch regenerates the same permutation. */
    for (int64_t j = 0; j < nseq; j++) {
        assert_int_equal(data_sequence(&d, j, tok, NULL), 0);
        assert_int_equal(tok[0] / T, order[0][j]);
    }

    /* Same seed: same order; another seed: another order. */
    assert_int_equal(data_open(path, T, 0, true, seed, &d2), 0);
    assert_int_equal(data_open(path, T, 0, true, seed + 1, &d3), 0);
    int64_t other[nseq];
    for (int64_t j = 0; j < nseq; j++) {
        assert_int_equal(data_sequence(&d2, nseq + j, tok, NULL), 0);
        assert_int_equal(tok[0] / T, order[1][j]);
        assert_int_equal(data_sequence(&d3, j, tok, NULL), 0);
        other[j] = tok[0] / T;
    }
    assert_memory_not_equal(order[0], other, sizeof other);
    data_close(&d);
    data_close(&d2);
    data_close(&d3);
    tu_rmrf(dir);
}

/* SFT shards: target j is trained on iff token j+1 has LOSS and not DOC_START. */
static void test_sft_masks(void **state)
{
    enum { T = 8 };
    const char *dir = tu_tmpdir(0, "data-sft");
    enum { L = DATA_FLAG_LOSS, D = DATA_FLAG_DOC_START };
    /* Two 10-token documents and a third starting at 20; a LOSS|DOC_START token at 10 and a DOC_START
     * at 20; shard a.bin holds positions 0..12, b.bin 13..24. */
    static const uint8_t flags[25] = {D, 0, 0, L, L, L, 0, 0, 0, L, L | D, 0, L, L, L, 0, L, L, L, 0, D, L, L, 0, 0};
    uint32_t *t = position_tokens(0, 25, 0);
    assert_int_equal(data_write_sft(pjoin(dir, "a.bin"), t, flags, 13), 0);
    assert_int_equal(data_write_sft(pjoin(dir, "b.bin"), t + 13, flags + 13, 12), 0);
    free(t);

    struct data_set d;
    assert_int_equal(data_open(pjoin(dir, "*.bin"), T, 25, false, 0, &d), 0);
    assert_true(d.has_flags);
    assert_int_equal(d.num_sequences, 3);
    int32_t tok[T + 1];
    uint8_t mask[T];
    /* Sequence 0: positions 0..8, targets are positions 1..8. */
    static const uint8_t want0[T] = {0, 0, 1, 1, 1, 0, 0, 0};
    assert_int_equal(data_sequence(&d, 0, tok, mask), 0);
    assert_memory_equal(mask, want0, T);
    /* Sequence 1: positions 8..16, targets 9..16 (10 has LOSS|DOC_START: not trained; crosses at 13). */
    static const uint8_t want1[T] = {1, 0, 0, 1, 1, 1, 0, 1};
    assert_int_equal(data_sequence(&d, 1, tok, mask), 0);
    assert_memory_equal(mask, want1, T);
    for (int j = 0; j <= T; j++)
        assert_int_equal(tok[j], 8 + j);
    /* Sequence 2 (and 5 = 2 mod 3): targets 17..24. */
    static const uint8_t want2[T] = {1, 1, 0, 0, 1, 1, 0, 0};
    assert_int_equal(data_sequence(&d, 5, tok, mask), 0);
    assert_memory_equal(mask, want2, T);
    assert_int_equal(tok[0], 16);
    data_close(&d);
    tu_rmrf(dir);
}

/* The writers' files: header fields and payload, written via a temporary that does not remain. */
static void test_writers(void **state)
{
    const char *dir = tu_tmpdir(0, "data-write");
    uint32_t t[5] = {0, 1, 65535, 7, 300};
    uint8_t f[5] = {2, 0, 1, 1, 0};
    assert_int_equal(data_write_llmc(pjoin(dir, "v1.bin"), t, 5, false), 0);
    assert_int_equal(data_write_llmc(pjoin(dir, "v7.bin"), t, 5, true), 0);
    assert_int_equal(data_write_sft(pjoin(dir, "sft.bin"), t, f, 5), 0);
    assert_false(tu_exists(pjoin(dir, "v1.bin.tmp")));
    assert_false(tu_exists(pjoin(dir, "sft.bin.tmp")));

    size_t len;
    char *b = tu_read_file(pjoin(dir, "v1.bin"), &len);
    int32_t h[3];
    memcpy(h, b, sizeof h);
    assert_int_equal(len, 1024 + 10);
    assert_int_equal(h[0], 20240520);
    assert_int_equal(h[1], 1);
    assert_int_equal(h[2], 5);
    uint16_t t16[5];
    memcpy(t16, b + 1024, sizeof t16);
    assert_int_equal(t16[2], 65535);
    assert_int_equal(t16[4], 300);
    free(b);

    b = tu_read_file(pjoin(dir, "v7.bin"), &len);
    memcpy(h, b, sizeof h);
    assert_int_equal(len, 1024 + 20);
    assert_int_equal(h[0], 20240801);
    assert_int_equal(h[1], 7);
    assert_int_equal(h[2], 5);
    free(b);

    b = tu_read_file(pjoin(dir, "sft.bin"), &len);
    memcpy(h, b, sizeof h);
    assert_int_equal(len, 1024 + 25);
    assert_int_equal(h[0], 20261202);
    assert_int_equal(h[1], 1);
    assert_memory_equal(b + 1024 + 20, f, 5);
    free(b);
    tu_rmrf(dir);
}

/* ---- bad files ---------------------------------------------------------------------------- */

struct bad_case {
    const char *name;
    void (*setup)(const char *dir);
    const char *pattern; /* relative to dir */
    int seq_len, vocab;
    const char *want[3]; /* substrings of the error message; "@" is replaced by dir */
};

static void bad_short(const char *dir) { write_raw(pjoin(dir, "f.bin"), DATA_MAGIC_LLMC_U16, 1, 0, 1000, 0); }
static void bad_magic(const char *dir) { write_raw(pjoin(dir, "f.bin"), 12345, 1, 100, 1024, 200); }
static void bad_version(const char *dir) { write_raw(pjoin(dir, "f.bin"), DATA_MAGIC_LLMC_U16, 7, 100, 1024, 200); }
static void bad_version_u32(const char *dir) { write_raw(pjoin(dir, "f.bin"), DATA_MAGIC_LLMC_U32, 1, 100, 1024, 400); }
static void bad_negative(const char *dir) { write_raw(pjoin(dir, "f.bin"), DATA_MAGIC_LLMC_U32, 7, -5, 1024, 0); }
static void bad_truncated(const char *dir) { write_raw(pjoin(dir, "f.bin"), DATA_MAGIC_LLMC_U16, 1, 100, 1024, 150); }
static void bad_trailing(const char *dir) { write_raw(pjoin(dir, "f.bin"), DATA_MAGIC_LLMC_U32, 7, 100, 1024, 401); }
static void bad_sft_no_flags(const char *dir) { write_raw(pjoin(dir, "f.bin"), DATA_MAGIC_SFT, 1, 100, 1024, 400); }

static void bad_vocab(const char *dir)
{
    uint32_t t[64];
    for (int i = 0; i < 64; i++)
        t[i] = (uint32_t)i % 50;
    t[37] = 1000;
    assert_int_equal(data_write_llmc(pjoin(dir, "f.bin"), t, 64, true), 0);
}

static void bad_few_tokens(const char *dir)
{
    write_llmc(pjoin(dir, "a.bin"), 0, 20, 0, false);
    write_llmc(pjoin(dir, "b.bin"), 20, 12, 0, false);
}

static void bad_second_shard(const char *dir)
{
    write_llmc(pjoin(dir, "a.bin"), 0, 100, 0, false);
    write_raw(pjoin(dir, "b.bin"), DATA_MAGIC_LLMC_U16, 1, 100, 1024, 20);
}

static void bad_nothing(const char *dir) {}

static const struct bad_case bad_cases[] = {
    {"shorter than header", bad_short, "f.bin", 4, 0, {"@/f.bin", "1000 bytes", "1024-byte header"}},
    {"unknown magic", bad_magic, "f.bin", 4, 0, {"@/f.bin", "unknown magic 12345"}},
    {"v1 magic, version 7", bad_version, "f.bin", 4, 0, {"@/f.bin", "version 7", "expected 1"}},
    {"v7 magic, version 1", bad_version_u32, "f.bin", 4, 0, {"@/f.bin", "version 1", "expected 7"}},
    {"negative count", bad_negative, "f.bin", 4, 0, {"@/f.bin", "negative token count -5"}},
    {"truncated uint16", bad_truncated, "f.bin", 4, 0, {"@/f.bin: truncated", "1224 bytes expected", "has 1174"}},
    {"trailing bytes", bad_trailing, "f.bin", 4, 0, {"@/f.bin", "1424 bytes expected", "has 1425"}},
    {"SFT without flags", bad_sft_no_flags, "f.bin", 4, 0, {"@/f.bin: truncated", "1524 bytes expected", "has 1424"}},
    {"token >= vocab", bad_vocab, "f.bin", 4, 50, {"@/f.bin", "position 37 is 1000", "vocab_size 50"}},
    {"too few tokens", bad_few_tokens, "*.bin", 32, 0, {"32 tokens in all", "seq_len 32 needs 33"}},
    {"second shard truncated", bad_second_shard, "*.bin", 4, 0, {"@/b.bin: truncated"}},
    {"glob without match", bad_nothing, "nope_*.bin", 4, 0, {"no file matches @/nope_*.bin"}},
    {"missing file", bad_nothing, "missing.bin", 4, 0, {"cannot open @/missing.bin"}},
};

static void test_bad_files(void **state)
{
    for (size_t c = 0; c < sizeof bad_cases / sizeof bad_cases[0]; c++) {
        const struct bad_case *bc = &bad_cases[c];
        const char *dir = tu_tmpdir(1, "data-bad");
        bc->setup(dir);
        struct data_set d;
        int rc = data_open(pjoin(dir, bc->pattern), bc->seq_len, bc->vocab, false, 0, &d);
        if (rc != -1)
            fail_msg("case '%s': data_open returned %d", bc->name, rc);
        assert_int_equal(d.num_shards, 0);
        assert_null(d.shards);
        const char *msg = sd_errmsg();
        printf("# %-24s -> %s\n", bc->name, msg);
        for (int w = 0; w < 3 && bc->want[w]; w++) {
            char want[1400];
            const char *at = strchr(bc->want[w], '@');
            if (at)
                snprintf(want, sizeof want, "%.*s%s%s", (int)(at - bc->want[w]), bc->want[w], dir, at + 1);
            else
                snprintf(want, sizeof want, "%s", bc->want[w]);
            if (!strstr(msg, want))
                fail_msg("case '%s': message '%s' lacks '%s'", bc->name, msg, want);
        }
        tu_rmrf(dir);
    }
}

static void test_writer_refusals(void **state)
{
    const char *dir = tu_tmpdir(0, "data-refuse");
    uint32_t t[4] = {1, 2, 65536, 3};
    assert_int_equal(data_write_llmc(pjoin(dir, "big.bin"), t, 4, false), -1);
    assert_non_null(strstr(sd_errmsg(), "position 2 is 65536"));
    assert_false(tu_exists(pjoin(dir, "big.bin")));
    assert_false(tu_exists(pjoin(dir, "big.bin.tmp")));
    assert_int_equal(data_write_sft(pjoin(dir, "s.bin"), t, NULL, 4), -1);
    assert_int_equal(data_write_llmc(pjoin(dir, "no/such/dir.bin"), t, 4, true), -1);
    assert_non_null(strstr(sd_errmsg(), "no/such/dir.bin.tmp"));
    tu_rmrf(dir);
}

/* slidedp-data writes SFT shards whose documents follow the documented layout (the program lands
 * in the build root; meson builds it before this test). */
static void test_generator(void **state)
{
    const char *bin = tu_bin("slidedp-data");
    assert_true(tu_exists(bin));
    const char *dir = tu_tmpdir(0, "data-gen");
    enum { T = 16, n = (16 - 3) / 2 };
    static const char *const tasks[] = {"copy", "reverse", "sort"};
    for (int task = 0; task < 3; task++) {
        char *out = NULL;
        int rc = tu_sh(&out, "'%s' %s --out '%s/%s' --seq-len %d --train 20 --val 5 --vocab 12 --seed 9", bin,
                       tasks[task], dir, tasks[task], T);
        if (rc != 0)
            fail_msg("slidedp-data %s: rc %d: %s", tasks[task], rc, out);
        free(out);
        char pattern[1200];
        snprintf(pattern, sizeof pattern, "%s/%s/train.bin", dir, tasks[task]);
        struct data_set d;
        assert_int_equal(data_open(pattern, T, 12, false, 0, &d), 0);
        assert_int_equal(d.num_sequences, 20);
        for (int64_t k = 0; k < 20; k++) {
            int32_t tok[T + 1];
            uint8_t mask[T];
            assert_int_equal(data_sequence(&d, k, tok, mask), 0);
            assert_int_equal(tok[0], 1);         /* BOS */
            assert_int_equal(tok[1 + n], 2);     /* SEP */
            assert_int_equal(tok[2 + 2 * n], 3); /* EOS */
            for (int j = 2 + 2 * n + 1; j < T; j++)
                assert_int_equal(tok[j], 0);     /* PAD */
            for (int i = 0; i < n; i++) {
                int32_t p = tok[1 + i], a = tok[2 + n + i];
                assert_true(p >= 4 && p < 12);
                if (task == 0)
                    assert_int_equal(a, p);
                else if (task == 1)
                    assert_int_equal(a, tok[1 + n - 1 - i]);
                else if (i > 0)
                    assert_true(a >= tok[2 + n + i - 1]);
            }
            /* Targets j = 1+n .. 1+2n (answer and EOS) are trained, nothing else. */
            for (int j = 0; j < T; j++)
                assert_int_equal(mask[j], j >= 1 + n && j <= 1 + 2 * n);
        }
        data_close(&d);
        snprintf(pattern, sizeof pattern, "%s/%s/val.bin", dir, tasks[task]);
        assert_int_equal(data_open(pattern, T, 12, false, 0, &d), 0);
        assert_int_equal(d.num_sequences, 5);
        data_close(&d);
    }
    char *out = NULL;
    assert_int_equal(tu_sh(&out, "'%s' shuffle --out '%s/x'", bin, dir), 2);
    free(out);
    assert_int_equal(tu_sh(&out, "'%s' copy --out '%s/x' --seq-len abc", bin, dir), 2);
    free(out);
    tu_rmrf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_llmc_v1),
        cmocka_unit_test(test_order_llmc_v7),
        cmocka_unit_test(test_order_mixed_versions),
        cmocka_unit_test(test_seq_index_formula),
        cmocka_unit_test(test_dp_equivalence),
        cmocka_unit_test(test_shuffle),
        cmocka_unit_test(test_sft_masks),
        cmocka_unit_test(test_writers),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_writer_refusals),
        cmocka_unit_test(test_generator),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
