/* Token data for training and validation (docs/design.md §2.3: data formats and order contract).
 *
 * Formats, told apart by the first int32 of a 256-int32 header:
 *   - llm.c shards: magic 20240520 version 1 -> uint16 tokens; magic 20240801 version 7 -> uint32
 *     tokens; header[2] = token count; the tokens follow the header.
 *   - slidedp SFT shards: magic 20261202 version 1; header[2] = token count n; then uint32
 *     tokens[n]; then uint8 flags[n]: bit 0 (DATA_FLAG_LOSS) the token is a training target,
 *     bit 1 (DATA_FLAG_DOC_START) the token starts a document (a target at a document start is
 *     never trained on: it would be predicted from the previous document).
 * A glob or a single path; several shards are concatenated in sorted path order.
 *
 * Order with shuffle = false: sequence k is tokens [k'*T, k'*T + T] (T+1 tokens) with
 * k' = k mod ((ntok-1) / T). With shuffle = true, k' = perm_e(k mod nseq) where e = k / nseq
 * and perm_e is a permutation drawn from (seed, e). */
#ifndef SD_DATA_H
#define SD_DATA_H

#include <stdbool.h>
#include <stdint.h>

#define DATA_MAGIC_LLMC_U16 20240520
#define DATA_MAGIC_LLMC_U32 20240801
#define DATA_MAGIC_SFT 20261202
#define DATA_HEADER_INTS 256
#define DATA_FLAG_LOSS 1u
#define DATA_FLAG_DOC_START 2u

struct data_shard {
    char path[1024];
    int fd;
    void *map;
    size_t map_size;
    int64_t num_tokens;
    int token_bytes;          /* 2 or 4 */
    const void *tokens;
    const uint8_t *flags;     /* SFT shards only */
};

struct data_set {
    int num_shards;
    struct data_shard *shards;
    int64_t num_tokens;       /* all shards */
    int64_t num_sequences;    /* (num_tokens - 1) / seq_len */
    int seq_len;
    bool has_flags;
    bool shuffle;
    uint64_t seed;
    int64_t perm_epoch;       /* epoch of the cached permutation, -1 when none */
    int64_t *perm;
};

/* Opens every shard matching pattern. With vocab_size > 0 every token is checked to be below it.
 * Fails (naming file and position) on bad magic/version, truncated files, tokens >= vocab, or
 * fewer than seq_len + 1 tokens in all. */
int data_open(const char *pattern, int seq_len, int vocab_size, bool shuffle, uint64_t seed, struct data_set *out);
void data_close(struct data_set *d);

/* Fills tokens[T+1] for sequence k, and target_mask[T] (1 where target j = tokens[j+1] is trained
 * on: always for llm.c shards, from the flags for SFT shards). target_mask may be NULL. */
int data_sequence(struct data_set *d, int64_t k, int32_t *tokens, uint8_t *target_mask);

/* The same, plus positions[T] (may be NULL): each input token's position in its document, 0 at the
 * window's first token and at every token flagged DATA_FLAG_DOC_START, else one more than the token
 * before (j for llm.c shards, which mark no document starts). Document attention (worker/model.h
 * model_set_positions) runs on these. */
int data_sequence_positions(struct data_set *d, int64_t k, int32_t *tokens, uint8_t *target_mask,
                            int32_t *positions);

/* The mean, over up to max_sequences stored sequences spread evenly over the data, of the (query,
 * key) pairs document attention visits in a sequence over those of a whole causal window,
 * T(T+1)/2: 1 for data that marks no document start, less for windows of several documents. */
double data_attention_pairs(struct data_set *d, int64_t max_sequences);

/* Refuses data without a training target, or (order known up front; up to 2^26 sequences looked
 * at) where one of steps 1..steps, each of `batch` sequences, has none. Only SFT shards can lack
 * targets. */
int data_check_targets(struct data_set *d, int64_t steps, int64_t batch);

/* Sequence index of row i on rank r at micro-step a of step s (from 1), docs/design.md §2.3. */
static inline int64_t data_seq_index(int64_t step, int a, int r, int i, int grad_accum, int gpus, int micro_batch)
{
    return (((step - 1) * grad_accum + a) * (int64_t)gpus + r) * micro_batch + i;
}

/* Writers (used by slidedp-data and tests). flags may be NULL for llm.c shards. */
int data_write_llmc(const char *path, const uint32_t *tokens, int64_t n, bool uint32_tokens);
int data_write_sft(const char *path, const uint32_t *tokens, const uint8_t *flags, int64_t n);

#endif
