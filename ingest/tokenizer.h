/* HF tokenizer.json byte-level BPE (as Qwen2.5, Qwen3 and Llama 3.x ship it), encoding exactly as
 * the tokenizers library does: added tokens cut out first, then the normalizer (none or NFC), the
 * Split pre-tokenizer regex (Oniguruma, as HF runs it), the ByteLevel mapping, BPE over ranked
 * merges (ignore_merges honoured), and the post-processor's special tokens. Anything else in a
 * tokenizer.json is refused by name. Used by `slidedp-data tokenize`. */
#ifndef SD_TOKENIZER_H
#define SD_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct tokenizer;          /* read-only once loaded; shared by all threads */
struct tok_encoder;        /* per-thread state: the compiled regex and the piece cache */

/* A growing list of token ids with, for each, the end of its bytes in the normalized text. */
struct tok_ids {
    uint32_t *ids;
    size_t *ends;
    size_t n, cap;
};

int tokenizer_load(const char *tokenizer_json_path, struct tokenizer **out);
void tokenizer_free(struct tokenizer *t);
/* The id of an added token (cut out of the text before encoding) given as text, or -1. */
int64_t tokenizer_added_token_id(const struct tokenizer *t, const char *text);
/* The id of an added token or vocabulary entry given as text (UTF-8), or -1. */
int64_t tokenizer_token_id(const struct tokenizer *t, const char *text);
/* The special tokens the post-processor puts before and after a single sequence. */
void tokenizer_post_tokens(const struct tokenizer *t, const uint32_t **prefix, int *nprefix,
                           const uint32_t **suffix, int *nsuffix);

int tok_encoder_new(const struct tokenizer *t, struct tok_encoder **out);
void tok_encoder_free(struct tok_encoder *e);

/* Appends the ids of text[0..len) (no post-processor tokens) to out. cuts[0..ncuts) are
 * ascending byte positions in text where the normalizer must not join its two sides (the edges
 * of loss spans; they must follow a character that composes with nothing, as a newline); on
 * return cuts_norm[i] is cuts[i]'s position in the normalized text, the coordinates of
 * out->ends. Fails on invalid UTF-8. */
int tok_encode(struct tok_encoder *e, const char *text, size_t len, const size_t *cuts, int ncuts,
               size_t *cuts_norm, struct tok_ids *out);

void tok_ids_free(struct tok_ids *v);

/* Grows n parallel arrays (*arrays[i] of elements of size[i] bytes), which share the capacity
 * *cap, to hold at least need elements (doubling). */
int tok_grow_arrays(size_t *cap, size_t need, int n, void **const arrays[], const size_t size[]);
/* Appends s[0..n) to the string *text of *len bytes (capacity *cap), growing it; keeps it
 * NUL-terminated. */
int tok_append(char **text, size_t *len, size_t *cap, const char *s, size_t n);

#endif
