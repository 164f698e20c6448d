/* Token shards (llm.c v1/v7 and slidedp SFT): opening and validating them, the sequence order
 * contract of docs/design.md §2.3 (optionally shuffled per epoch), and the writers used by slidedp-data and
 * the tests. See data.h for the formats. */
#include <stddef.h> /* data.h uses size_t without including it */

#include "data.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"
#include "rng.h"

#define HEADER_BYTES ((int64_t)DATA_HEADER_INTS * 4)

/* ---- opening ---------------------------------------------------------------------------- */

static void shard_close(struct data_shard *s)
{
    if (s->map)
        munmap(s->map, s->map_size);
    if (s->fd >= 0)
        close(s->fd);
    s->map = NULL;
    s->fd = -1;
}

static int shard_open(const char *path, struct data_shard *s)
{
    memset(s, 0, sizeof *s);
    s->fd = -1;
    if (strlen(path) >= sizeof s->path)
        return sd_err("%s: path too long", path);
    strcpy(s->path, path);

    s->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (s->fd < 0)
        return sd_err("cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(s->fd, &st) != 0)
        return sd_err("cannot stat %s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return sd_err("%s: not a regular file", path);
    int64_t size = st.st_size;
    if (size < HEADER_BYTES)
        return sd_err("%s: %lld bytes, shorter than the %lld-byte header", path, (long long)size,
                      (long long)HEADER_BYTES);

    s->map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, s->fd, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return sd_err("cannot mmap %s: %s", path, strerror(errno));
    }
    s->map_size = (size_t)size;

    const int32_t *h = s->map;
    int expected_version;
    switch (h[0]) {
    case DATA_MAGIC_LLMC_U16: expected_version = 1; s->token_bytes = 2; break;
    case DATA_MAGIC_LLMC_U32: expected_version = 7; s->token_bytes = 4; break;
    case DATA_MAGIC_SFT: expected_version = 1; s->token_bytes = 4; break;
    default:
        return sd_err("%s: unknown magic %d (expected %d or %d for llm.c shards, %d for SFT shards)",
                      path, h[0], DATA_MAGIC_LLMC_U16, DATA_MAGIC_LLMC_U32, DATA_MAGIC_SFT);
    }
    if (h[1] != expected_version)
        return sd_err("%s: version %d for magic %d, expected %d", path, h[1], h[0], expected_version);
    if (h[2] < 0)
        return sd_err("%s: negative token count %d", path, h[2]);

    s->num_tokens = h[2];
    bool sft = h[0] == DATA_MAGIC_SFT;
    int64_t expected = HEADER_BYTES + s->num_tokens * (s->token_bytes + (sft ? 1 : 0));
    if (size != expected)
        return sd_err("%s: %s: header says %lld tokens, so %lld bytes expected, file has %lld", path,
                      size < expected ? "truncated" : "trailing bytes", (long long)s->num_tokens,
                      (long long)expected, (long long)size);

    s->tokens = (const char *)s->map + HEADER_BYTES;
    s->flags = sft ? (const uint8_t *)s->tokens + s->num_tokens * s->token_bytes : NULL;
    return 0;
}

static uint32_t shard_token(const struct data_shard *s, int64_t i)
{
    if (s->token_bytes == 2)
        return ((const uint16_t *)s->tokens)[i];
    return ((const uint32_t *)s->tokens)[i];
}

static int shard_check_vocab(const struct data_shard *s, int vocab_size)
{
    for (int64_t i = 0; i < s->num_tokens; i++) {
        uint32_t t = shard_token(s, i);
        if (t >= (uint32_t)vocab_size)
            return sd_err("%s: token at position %lld is %u, not below vocab_size %d", s->path,
                          (long long)i, t, vocab_size);
    }
    return 0;
}

static int cmp_path(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int data_open(const char *pattern, int seq_len, int vocab_size, bool shuffle, uint64_t seed, struct data_set *out)
{
    memset(out, 0, sizeof *out);
    out->perm_epoch = -1;
    if (seq_len < 1)
        return sd_err("seq_len %d: must be at least 1", seq_len);

    glob_t g;
    int rc = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (rc == GLOB_NOMATCH)
        return strpbrk(pattern, "*?[") ? sd_err("no file matches %s", pattern)
                                       : sd_err("cannot open %s: no such file", pattern);
    if (rc != 0) {
        globfree(&g);
        return sd_err("cannot expand %s (glob error %d)", pattern, rc);
    }
    /* Sorted by byte order, independent of the locale's collation. */
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_path);

    out->shards = calloc(g.gl_pathc, sizeof *out->shards);
    if (!out->shards) {
        globfree(&g);
        return sd_err("out of memory for %zu shards", (size_t)g.gl_pathc);
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct data_shard *s = &out->shards[out->num_shards++];
        if (shard_open(g.gl_pathv[i], s) != 0 ||
            (vocab_size > 0 && shard_check_vocab(s, vocab_size) != 0)) {
            globfree(&g);
            data_close(out);
            return -1;
        }
        out->num_tokens += s->num_tokens;
        if (s->flags)
            out->has_flags = true;
    }
    globfree(&g);

    if (out->num_tokens < (int64_t)seq_len + 1) {
        int64_t ntok = out->num_tokens;
        data_close(out);
        return sd_err("%s: %lld tokens in all, a sequence of seq_len %d needs %d", pattern,
                      (long long)ntok, seq_len, seq_len + 1);
    }
    out->seq_len = seq_len;
    out->num_sequences = (out->num_tokens - 1) / seq_len;
    out->shuffle = shuffle;
    out->seed = seed;
    return 0;
}

void data_close(struct data_set *d)
{
    for (int i = 0; i < d->num_shards; i++)
        shard_close(&d->shards[i]);
    free(d->shards);
    free(d->perm);
    memset(d, 0, sizeof *d);
    d->perm_epoch = -1;
}

/* ---- order ------------------------------------------------------------------------------ */

static uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** */
static uint64_t xoshiro_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, n) without modulo bias. */
static uint64_t xoshiro_below(uint64_t s[4], uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do
        r = xoshiro_next(s);
    while (r >= limit);
    return r % n;
}

/* perm_e: Fisher-Yates over 0..nseq-1 from a generator seeded by splitmix64 of (seed, epoch). */
static int build_permutation(struct data_set *d, int64_t epoch)
{
    int64_t n = d->num_sequences;
    if (!d->perm) {
        d->perm = malloc((size_t)n * sizeof *d->perm);
        if (!d->perm)
            return sd_err("out of memory for a permutation of %lld sequences", (long long)n);
    }
    uint64_t x = d->seed;
    x = splitmix64(&x) ^ (uint64_t)epoch;
    uint64_t s[4];
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&x);
    for (int64_t i = 0; i < n; i++)
        d->perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)xoshiro_below(s, (uint64_t)i + 1);
        int64_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
    d->perm_epoch = epoch;
    return 0;
}

/* The stored sequence that position k of the order reads (k >= 0): k mod nseq, permuted per epoch
 * when shuffled. */
static int stored_sequence(struct data_set *d, int64_t k, int64_t *kk)
{
    *kk = k % d->num_sequences;
    if (d->shuffle) {
        int64_t epoch = k / d->num_sequences;
        if (epoch != d->perm_epoch && build_permutation(d, epoch) != 0)
            return -1;
        *kk = d->perm[*kk];
    }
    return 0;
}

/* Tokens, target mask and document positions of stored sequence kk (either output may be NULL). */
static void read_sequence(const struct data_set *d, int64_t kk, int32_t *tokens, uint8_t *target_mask,
                          int32_t *positions)
{
    /* Global positions [pos, pos + T] across the shards concatenated in order. */
    int64_t pos = kk * d->seq_len, end = pos + d->seq_len + 1;
    int64_t base = 0, j = 0;
    for (int si = 0; si < d->num_shards && pos < end; si++) {
        const struct data_shard *s = &d->shards[si];
        for (; pos < end && pos < base + s->num_tokens; pos++, j++) {
            int64_t i = pos - base;
            tokens[j] = (int32_t)shard_token(s, i);
            uint8_t f = s->flags ? s->flags[i] : DATA_FLAG_LOSS;
            /* the window's first token starts a document whatever its flag says */
            if (positions && j < d->seq_len)
                positions[j] = j == 0 || (f & DATA_FLAG_DOC_START) ? 0 : positions[j - 1] + 1;
            /* Mask entry j-1 belongs to target j (token j of the sequence). */
            if (target_mask && j > 0)
                target_mask[j - 1] = (f & DATA_FLAG_LOSS) && !(f & DATA_FLAG_DOC_START);
        }
        base += s->num_tokens;
    }
    SD_ASSERT(j == d->seq_len + 1);
}

int data_sequence_positions(struct data_set *d, int64_t k, int32_t *tokens, uint8_t *target_mask,
                            int32_t *positions)
{
    if (k < 0)
        return sd_err("sequence index %lld is negative", (long long)k);
    int64_t kk;
    if (stored_sequence(d, k, &kk) != 0)
        return -1;
    read_sequence(d, kk, tokens, target_mask, positions);
    return 0;
}

int data_sequence(struct data_set *d, int64_t k, int32_t *tokens, uint8_t *target_mask)
{
    return data_sequence_positions(d, k, tokens, target_mask, NULL);
}

double data_attention_pairs(struct data_set *d, int64_t max_sequences)
{
    int64_t n = d->num_sequences, step = n > max_sequences ? n / max_sequences : 1, seen = 0;
    int32_t *tokens = malloc(((size_t)d->seq_len + 1) * sizeof *tokens);
    int32_t *pos = malloc((size_t)d->seq_len * sizeof *pos);
    double sum = 0, whole = (double)d->seq_len * (d->seq_len + 1.0) / 2.0;
    for (int64_t kk = 0; tokens && pos && kk < n && seen < max_sequences; kk += step, seen++) {
        read_sequence(d, kk, tokens, NULL, pos);
        double pairs = 0;
        for (int t = 0; t < d->seq_len; t++)
            pairs += pos[t] + 1.0; /* query t sees the pos[t] keys before it in its document, and itself */
        sum += pairs / whole;
    }
    free(tokens);
    free(pos);
    return seen > 0 ? sum / (double)seen : 1.0;
}

/* Steps whose batches are looked at one by one, at most (steps x batch sequences). */
#define CHECK_STEPS_MAX_SEQUENCES ((int64_t)1 << 26)

int data_check_targets(struct data_set *d, int64_t steps, int64_t batch)
{
    if (!d->has_flags)
        return 0;
    int64_t n = d->num_sequences, with = 0;
    uint8_t *has = calloc((size_t)n, 1), *mask = malloc((size_t)d->seq_len);
    int32_t *tokens = malloc(((size_t)d->seq_len + 1) * sizeof *tokens);
    int rc = has && mask && tokens ? 0 : sd_err("out of memory checking the training targets");
    for (int64_t kk = 0; kk < n && rc == 0; kk++) {
        read_sequence(d, kk, tokens, mask, NULL);
        has[kk] = memchr(mask, 1, (size_t)d->seq_len) != NULL;
        with += has[kk];
    }
    if (rc == 0 && with == 0)
        rc = sd_err("no token of the data is a training target (SFT flags bit 0, not at a document start): there is "
                    "no loss to train on");
    if (rc == 0 && with < n && steps <= CHECK_STEPS_MAX_SEQUENCES / batch)
        for (int64_t s = 1; s <= steps && rc == 0; s++) {
            bool any = false;
            for (int64_t j = 0; j < batch && !any && rc == 0; j++) {
                int64_t kk;
                rc = stored_sequence(d, (s - 1) * batch + j, &kk);
                any = rc == 0 && has[kk];
            }
            if (rc == 0 && !any)
                rc = sd_err("step %lld has no training target in any of its %lld sequences (only %lld of the %lld "
                            "sequences have one): shuffle the data, use more sequences per step, or fewer steps",
                            (long long)s, (long long)batch, (long long)with, (long long)n);
        }
    free(has);
    free(mask);
    free(tokens);
    return rc;
}

/* ---- writers ---------------------------------------------------------------------------- */

/* Writes header, then the given parts, to path.tmp and renames it into place. */
static int write_shard(const char *path, int magic, int version, int64_t n, const void *p1,
                       size_t n1, const void *p2, size_t n2)
{
    if (n < 0 || n > INT32_MAX)
        return sd_err("%s: token count %lld does not fit the int32 header", path, (long long)n);
    char tmp[1100];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return sd_err("%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return sd_err("cannot write %s: %s", tmp, strerror(errno));
    int32_t header[DATA_HEADER_INTS] = {magic, version, (int32_t)n};
    bool ok = fwrite(header, sizeof header, 1, f) == 1;
    ok = ok && (n1 == 0 || fwrite(p1, 1, n1, f) == n1);
    ok = ok && (n2 == 0 || fwrite(p2, 1, n2, f) == n2);
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        unlink(tmp);
        return sd_err("cannot write %s: %s", tmp, strerror(saved));
    }
    if (rename(tmp, path) != 0) {
        saved = errno;
        unlink(tmp);
        return sd_err("cannot rename %s to %s: %s", tmp, path, strerror(saved));
    }
    return 0;
}

int data_write_llmc(const char *path, const uint32_t *tokens, int64_t n, bool uint32_tokens)
{
    if (uint32_tokens)
        return write_shard(path, DATA_MAGIC_LLMC_U32, 7, n, tokens, (size_t)n * 4, NULL, 0);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] > UINT16_MAX)
            return sd_err("%s: token at position %lld is %u, too large for a uint16 (version 1) "
                          "shard; write uint32 tokens (version 7)",
                          path, (long long)i, tokens[i]);
    uint16_t *t16 = malloc(n > 0 ? (size_t)n * 2 : 1);
    if (!t16)
        return sd_err("%s: out of memory for %lld tokens", path, (long long)n);
    for (int64_t i = 0; i < n; i++)
        t16[i] = (uint16_t)tokens[i];
    int rc = write_shard(path, DATA_MAGIC_LLMC_U16, 1, n, t16, (size_t)n * 2, NULL, 0);
    free(t16);
    return rc;
}

int data_write_sft(const char *path, const uint32_t *tokens, const uint8_t *flags, int64_t n)
{
    if (!flags)
        return sd_err("%s: an SFT shard needs per-token flags", path);
    return write_shard(path, DATA_MAGIC_SFT, 1, n, tokens, (size_t)n * 4, flags, (size_t)n);
}
