/* HF tokenizer.json byte-level BPE for `slidedp-data tokenize` (see tokenizer.h for what is
 * accepted). The vocabulary is kept in raw bytes (the ByteLevel alphabet undone at load), so BPE
 * starts from one id per byte; merges live in a hash from (left id, right id) to (rank, merged
 * id); each encoder caches the ids of the pieces it has seen. */
#include "tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <oniguruma.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/err.h"

/* ByteLevel's built-in regex, used when its use_regex is true (GPT-2's pattern). */
static const char BYTELEVEL_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

#define MAX_POST_TOKENS 8
#define CACHE_SLOTS (1u << 16)
#define CACHE_MAX_PIECE 64

/* ---- hashing ------------------------------------------------------------------------------ */

static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull ^ n;
    for (size_t i = 0; i < n; i++)
        h = (h ^ s[i]) * 0x100000001b3ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ---- the tokenizer ------------------------------------------------------------------------ */

struct vocab_slot {
    uint32_t off, len;    /* in the byte arena; len 0 = empty slot */
    int32_t id;
};

struct merge_slot {
    uint64_t pair;        /* left << 32 | right; UINT64_MAX = empty */
    uint32_t rank, merged;
};

struct added_token {
    const char *text;
    size_t len;
    uint32_t id;
};

struct tokenizer {
    char *arena;          /* raw bytes of every vocabulary entry */
    size_t arena_len;
    struct vocab_slot *vocab;
    size_t vocab_mask;
    struct merge_slot *merges;
    size_t merges_mask;
    int32_t byte_id[256]; /* the id of each single byte, -1 when the vocabulary lacks it */
    bool ignore_merges;
    bool nfc;
    char *regex;
    struct added_token *added; /* sorted by first byte, then longest first */
    char *added_text;          /* the added tokens' texts, one after another */
    int nadded;
    int added_first[257];      /* added[added_first[b] .. added_first[b+1]) start with byte b */
    uint32_t prefix[MAX_POST_TOKENS], suffix[MAX_POST_TOKENS];
    int nprefix, nsuffix;
};

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
 * U+0100 onwards in byte order. Fills the inverse, code point -> byte (-1 elsewhere). */
static void bytelevel_inverse(int16_t inv[324])
{
    for (int c = 0; c < 324; c++)
        inv[c] = -1;
    int next = 256;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        inv[printable ? b : next++] = (int16_t)b;
    }
}

/* Undoes the ByteLevel mapping of s into out (at most strlen(s) bytes); -1 when s has a
 * character outside the ByteLevel alphabet. */
static long bytelevel_decode(const int16_t inv[324], const char *s, char *out)
{
    size_t n = strlen(s), o = 0;
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    for (size_t i = 0; i < n;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0 || cp >= 324 || inv[cp] < 0)
            return -1;
        out[o++] = (char)inv[cp];
        i += (size_t)k;
    }
    return (long)o;
}

static int64_t vocab_find(const struct tokenizer *t, const char *s, size_t n)
{
    if (n == 0)
        return -1;
    for (size_t i = hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        const struct vocab_slot *v = &t->vocab[i];
        if (v->len == 0)
            return -1;
        if (v->len == n && memcmp(t->arena + v->off, s, n) == 0)
            return v->id;
    }
}

static void vocab_put(struct tokenizer *t, uint32_t off, uint32_t len, int32_t id)
{
    size_t i = hash_bytes(t->arena + off, len) & t->vocab_mask;
    while (t->vocab[i].len != 0)
        i = (i + 1) & t->vocab_mask;
    t->vocab[i] = (struct vocab_slot){off, len, id};
}

static const struct merge_slot *merge_find(const struct tokenizer *t, uint32_t left, uint32_t right)
{
    uint64_t key = (uint64_t)left << 32 | right;
    for (size_t i = hash_u64(key) & t->merges_mask;; i = (i + 1) & t->merges_mask) {
        const struct merge_slot *m = &t->merges[i];
        if (m->pair == key)
            return m;
        if (m->pair == UINT64_MAX)
            return NULL;
    }
}

static int merge_put(struct tokenizer *t, uint32_t left, uint32_t right, uint32_t rank, uint32_t merged)
{
    uint64_t key = (uint64_t)left << 32 | right;
    size_t i = hash_u64(key) & t->merges_mask;
    for (; t->merges[i].pair != UINT64_MAX; i = (i + 1) & t->merges_mask)
        if (t->merges[i].pair == key)
            return 0; /* a repeated merge keeps its first (lowest) rank, as HF's map does */
    t->merges[i] = (struct merge_slot){key, rank, merged};
    return 0;
}

static const char *json_type(const cJSON *obj)
{
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(ty) ? ty->valuestring : "(no type)";
}

static bool json_true(const cJSON *obj, const char *key)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(obj, key));
}

/* A string option that must be absent, null or empty (continuing_subword_prefix and the like). */
static bool json_unset(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return !v || cJSON_IsNull(v) || (cJSON_IsString(v) && v->valuestring[0] == 0);
}

static int load_normalizer(struct tokenizer *t, const cJSON *n)
{
    if (!n || cJSON_IsNull(n))
        return 0;
    if (!strcmp(json_type(n), "NFC")) {
        t->nfc = true;
        return 0;
    }
    return sd_err("normalizer %s is not supported (accepted: none, NFC)", json_type(n));
}

static int set_regex(struct tokenizer *t, const char *pattern)
{
    if (t->regex)
        return sd_err("pre_tokenizer: more than one regex split is not supported");
    t->regex = strdup(pattern);
    return t->regex ? 0 : sd_err("out of memory");
}

static int load_bytelevel(struct tokenizer *t, const cJSON *p)
{
    if (json_true(p, "add_prefix_space"))
        return sd_err("pre_tokenizer ByteLevel with add_prefix_space is not supported");
    if (json_true(p, "use_regex"))
        return set_regex(t, BYTELEVEL_REGEX);
    return 0;
}

static int load_pre_tokenizer(struct tokenizer *t, const cJSON *p)
{
    if (!p || cJSON_IsNull(p))
        return sd_err("a tokenizer without a pre_tokenizer is not supported (byte-level BPE needs ByteLevel)");
    const char *type = json_type(p);
    if (!strcmp(type, "ByteLevel"))
        return load_bytelevel(t, p);
    if (strcmp(type, "Sequence") != 0)
        return sd_err("pre_tokenizer %s is not supported (accepted: Split with a regex, then ByteLevel)", type);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    int n = cJSON_GetArraySize(list);
    if (n != 2 || strcmp(json_type(cJSON_GetArrayItem(list, 0)), "Split") != 0 ||
        strcmp(json_type(cJSON_GetArrayItem(list, 1)), "ByteLevel") != 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, list) if (strcmp(json_type(item), "Split") != 0 && strcmp(json_type(item), "ByteLevel") != 0)
            return sd_err("pre_tokenizer %s is not supported (accepted: Split with a regex, then ByteLevel)", json_type(item));
        return sd_err("pre_tokenizer Sequence of %d steps is not supported (accepted: Split with a regex, then ByteLevel)", n);
    }
    const cJSON *split = cJSON_GetArrayItem(list, 0);
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(split, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(split, "behavior");
    if (!cJSON_IsString(regex))
        return sd_err("pre_tokenizer Split with a String pattern is not supported (accepted: Regex)");
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated") != 0)
        return sd_err("pre_tokenizer Split behavior %s is not supported (accepted: Isolated)",
                      cJSON_IsString(behavior) ? behavior->valuestring : "(none)");
    if (json_true(split, "invert"))
        return sd_err("pre_tokenizer Split with invert is not supported");
    if (set_regex(t, regex->valuestring) != 0)
        return -1;
    return load_bytelevel(t, cJSON_GetArrayItem(list, 1));
}

static int add_post_token(const cJSON *special, const cJSON *tokens, uint32_t *list, int *n)
{
    const cJSON *idname = cJSON_GetObjectItemCaseSensitive(special, "id");
    if (!cJSON_IsString(idname))
        return sd_err("post_processor TemplateProcessing: SpecialToken without an id");
    const cJSON *entry = cJSON_GetObjectItemCaseSensitive(tokens, idname->valuestring);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(entry, "ids");
    const cJSON *id;
    cJSON_ArrayForEach(id, ids)
    {
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || *n == MAX_POST_TOKENS)
            return sd_err("post_processor TemplateProcessing: bad ids for %s", idname->valuestring);
        list[(*n)++] = (uint32_t)id->valuedouble;
    }
    if (!cJSON_IsArray(ids))
        return sd_err("post_processor TemplateProcessing: special token %s not listed", idname->valuestring);
    return 0;
}

static int load_template_processing(struct tokenizer *t, const cJSON *p)
{
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(p, "single");
    const cJSON *tokens = cJSON_GetObjectItemCaseSensitive(p, "special_tokens");
    bool seen_sequence = false;
    const cJSON *piece;
    cJSON_ArrayForEach(piece, single)
    {
        const cJSON *special = cJSON_GetObjectItemCaseSensitive(piece, "SpecialToken");
        if (cJSON_GetObjectItemCaseSensitive(piece, "Sequence")) {
            if (seen_sequence)
                return sd_err("post_processor TemplateProcessing: two sequences in 'single'");
            seen_sequence = true;
        } else if (special) {
            int rc = seen_sequence ? add_post_token(special, tokens, t->suffix, &t->nsuffix)
                                   : add_post_token(special, tokens, t->prefix, &t->nprefix);
            if (rc != 0)
                return -1;
        } else
            return sd_err("post_processor TemplateProcessing: unknown piece in 'single'");
    }
    return seen_sequence ? 0 : sd_err("post_processor TemplateProcessing: no sequence in 'single'");
}

static int load_post_processor(struct tokenizer *t, const cJSON *p)
{
    if (!p || cJSON_IsNull(p))
        return 0;
    const char *type = json_type(p);
    if (!strcmp(type, "ByteLevel"))
        return 0; /* it only trims offsets; ids are unchanged */
    if (!strcmp(type, "TemplateProcessing"))
        return load_template_processing(t, p);
    if (!strcmp(type, "Sequence")) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(p, "processors")) if (load_post_processor(t, item) != 0)
            return -1;
        return 0;
    }
    return sd_err("post_processor %s is not supported (accepted: ByteLevel, TemplateProcessing, Sequence)", type);
}

static int load_model(struct tokenizer *t, const cJSON *m)
{
    if (strcmp(json_type(m), "BPE") != 0)
        return sd_err("model %s is not supported (accepted: BPE)", json_type(m));
    if (json_true(m, "byte_fallback"))
        return sd_err("model BPE with byte_fallback is not supported");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (dropout && !cJSON_IsNull(dropout))
        return sd_err("model BPE with dropout is not supported");
    if (!json_unset(m, "continuing_subword_prefix") || !json_unset(m, "end_of_word_suffix"))
        return sd_err("model BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
    t->ignore_merges = json_true(m, "ignore_merges");

    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
    const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
    if (!cJSON_IsObject(vocab) || !cJSON_IsArray(merges))
        return sd_err("model BPE without a vocab object and a merges list");
    int16_t inv[324];
    bytelevel_inverse(inv);

    size_t nvocab = 0, bytes = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab)
    {
        nvocab++;
        bytes += strlen(e->string);
    }
    t->arena = malloc(bytes + 1);
    t->vocab_mask = pow2_at_least(nvocab * 2) - 1;
    t->vocab = calloc(t->vocab_mask + 1, sizeof *t->vocab);
    if (!t->arena || !t->vocab)
        return sd_err("out of memory for a vocabulary of %zu entries", nvocab);
    for (int b = 0; b < 256; b++)
        t->byte_id[b] = -1;
    cJSON_ArrayForEach(e, vocab)
    {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble > INT32_MAX)
            return sd_err("model vocab: bad id for '%s'", e->string);
        long n = bytelevel_decode(inv, e->string, t->arena + t->arena_len);
        if (n <= 0)
            continue; /* not reachable from byte-level text */
        int32_t id = (int32_t)e->valuedouble;
        if (vocab_find(t, t->arena + t->arena_len, (size_t)n) >= 0)
            return sd_err("model vocab: '%s' listed twice", e->string);
        vocab_put(t, (uint32_t)t->arena_len, (uint32_t)n, id);
        if (n == 1)
            t->byte_id[(unsigned char)t->arena[t->arena_len]] = id;
        t->arena_len += (size_t)n;
    }

    size_t nmerges = (size_t)cJSON_GetArraySize(merges);
    t->merges_mask = pow2_at_least(nmerges * 2) - 1;
    t->merges = malloc((t->merges_mask + 1) * sizeof *t->merges);
    if (!t->merges)
        return sd_err("out of memory for %zu merges", nmerges);
    memset(t->merges, 0xff, (t->merges_mask + 1) * sizeof *t->merges);
    char *parts[2];
    char buf[2][1024], raw[2048];
    uint32_t rank = 0;
    cJSON_ArrayForEach(e, merges)
    {
        /* "a b" or ["a", "b"]; the ByteLevel alphabet has no space, so the split is unambiguous. */
        if (cJSON_IsString(e)) {
            const char *sp = strchr(e->valuestring, ' ');
            size_t l0 = sp ? (size_t)(sp - e->valuestring) : 0;
            if (!sp || l0 >= sizeof buf[0] || strlen(sp + 1) >= sizeof buf[1] || strchr(sp + 1, ' '))
                return sd_err("model merges: entry %u '%s' is not two tokens", rank, e->valuestring);
            memcpy(buf[0], e->valuestring, l0);
            buf[0][l0] = 0;
            strcpy(buf[1], sp + 1);
        } else if (cJSON_GetArraySize(e) == 2 && cJSON_IsString(cJSON_GetArrayItem(e, 0)) &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 1)) &&
                   strlen(cJSON_GetArrayItem(e, 0)->valuestring) < sizeof buf[0] &&
                   strlen(cJSON_GetArrayItem(e, 1)->valuestring) < sizeof buf[1]) {
            strcpy(buf[0], cJSON_GetArrayItem(e, 0)->valuestring);
            strcpy(buf[1], cJSON_GetArrayItem(e, 1)->valuestring);
        } else
            return sd_err("model merges: entry %u is neither \"a b\" nor [\"a\", \"b\"]", rank);
        parts[0] = buf[0];
        parts[1] = buf[1];
        long l0 = bytelevel_decode(inv, parts[0], raw);
        long l1 = l0 > 0 ? bytelevel_decode(inv, parts[1], raw + l0) : -1;
        int64_t a = l0 > 0 ? vocab_find(t, raw, (size_t)l0) : -1;
        int64_t b = l1 > 0 ? vocab_find(t, raw + l0, (size_t)l1) : -1;
        int64_t ab = l1 > 0 ? vocab_find(t, raw, (size_t)(l0 + l1)) : -1;
        if (a < 0 || b < 0 || ab < 0)
            return sd_err("model merges: entry %u ('%s' '%s') names a token missing from the vocab", rank,
                          parts[0], parts[1]);
        merge_put(t, (uint32_t)a, (uint32_t)b, rank++, (uint32_t)ab);
    }
    return 0;
}

static int cmp_added(const void *pa, const void *pb)
{
    const struct added_token *a = pa, *b = pb;
    unsigned char fa = (unsigned char)a->text[0], fb = (unsigned char)b->text[0];
    if (fa != fb)
        return fa - fb;
    return (a->len < b->len) - (a->len > b->len);
}

static int load_added_tokens(struct tokenizer *t, const cJSON *list)
{
    int n = cJSON_GetArraySize(list);
    t->added = calloc((size_t)n + 1, sizeof *t->added);
    if (!t->added)
        return sd_err("out of memory");
    const cJSON *a;
    cJSON_ArrayForEach(a, list)
    {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        if (!cJSON_IsString(content) || !content->valuestring[0] || !cJSON_IsNumber(id) || id->valuedouble < 0)
            return sd_err("added_tokens: an entry without content or id");
        static const char *const flags[] = {"single_word", "lstrip", "rstrip", "normalized"};
        for (int f = 0; f < 4; f++)
            if (json_true(a, flags[f]))
                return sd_err("added token %s with %s is not supported", content->valuestring, flags[f]);
        t->added[t->nadded++] = (struct added_token){content->valuestring, strlen(content->valuestring),
                                                     (uint32_t)id->valuedouble};
    }
    qsort(t->added, (size_t)t->nadded, sizeof *t->added, cmp_added);
    int i = 0;
    for (int b = 0; b <= 256; b++) {
        while (i < t->nadded && (unsigned char)t->added[i].text[0] < b)
            i++;
        t->added_first[b] = i;
    }
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        sd_err("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 + 1 > cap) {
            cap = (n + 65536 + 1) * 2;
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                fclose(f);
                sd_err("%s: out of memory", path);
                return NULL;
            }
            buf = nb;
        }
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (k == 0)
            break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        sd_err("cannot read %s", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

int tokenizer_load(const char *path, struct tokenizer **out)
{
    *out = NULL;
    size_t len;
    char *text = read_file(path, &len);
    if (!text)
        return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root)
        return sd_err("%s: not valid JSON", path);
    struct tokenizer *t = calloc(1, sizeof *t);
    int rc = t ? 0 : sd_err("out of memory");
    if (rc == 0)
        rc = load_model(t, cJSON_GetObjectItemCaseSensitive(root, "model"));
    if (rc == 0)
        rc = load_normalizer(t, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (rc == 0)
        rc = load_pre_tokenizer(t, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    if (rc == 0)
        rc = load_post_processor(t, cJSON_GetObjectItemCaseSensitive(root, "post_processor"));
    if (rc == 0 && !t->regex)
        rc = sd_err("pre_tokenizer ByteLevel without a regex split is not supported");
    if (rc == 0)
        rc = load_added_tokens(t, cJSON_GetObjectItemCaseSensitive(root, "added_tokens"));
    if (rc == 0) {
        /* Added token texts point into the JSON tree: keep copies in one block. */
        size_t total = 0;
        for (int i = 0; i < t->nadded; i++)
            total += t->added[i].len + 1;
        char *block = t->added_text = malloc(total + 1);
        if (!block)
            rc = sd_err("out of memory");
        for (int i = 0; rc == 0 && i < t->nadded; i++) {
            memcpy(block, t->added[i].text, t->added[i].len + 1);
            t->added[i].text = block;
            block += t->added[i].len + 1;
        }
    }
    if (rc == 0) {
        for (int b = 0; b < 256; b++)
            if (t->byte_id[b] < 0)
                rc = sd_err("model vocab: no token for byte 0x%02x (not a byte-level BPE vocabulary)", b);
    }
    cJSON_Delete(root);
    if (rc == 0) {
        OnigEncoding enc = ONIG_ENCODING_UTF8;
        onig_initialize(&enc, 1);
        struct tok_encoder *probe;
        rc = tok_encoder_new(t, &probe);
        if (rc == 0)
            tok_encoder_free(probe);
    }
    if (rc != 0) {
        sd_err_prefix("%s", path);
        tokenizer_free(t);
        return -1;
    }
    *out = t;
    return 0;
}

void tokenizer_free(struct tokenizer *t)
{
    if (!t)
        return;
    free(t->added_text);
    free(t->added);
    free(t->arena);
    free(t->vocab);
    free(t->merges);
    free(t->regex);
    free(t);
}

int64_t tokenizer_added_token_id(const struct tokenizer *t, const char *text)
{
    size_t n = strlen(text);
    for (int i = 0; i < t->nadded; i++)
        if (t->added[i].len == n && memcmp(t->added[i].text, text, n) == 0)
            return t->added[i].id;
    return -1;
}

int64_t tokenizer_token_id(const struct tokenizer *t, const char *text)
{
    int64_t id = tokenizer_added_token_id(t, text);
    return id >= 0 ? id : vocab_find(t, text, strlen(text));
}

void tokenizer_post_tokens(const struct tokenizer *t, const uint32_t **prefix, int *nprefix,
                           const uint32_t **suffix, int *nsuffix)
{
    *prefix = t->prefix;
    *nprefix = t->nprefix;
    *suffix = t->suffix;
    *nsuffix = t->nsuffix;
}

/* ---- encoding ----------------------------------------------------------------------------- */

struct cache_slot {
    uint64_t hash;
    uint32_t len;         /* piece bytes; 0 = empty */
    uint32_t nids;
    char piece[CACHE_MAX_PIECE];
    uint32_t ids[CACHE_MAX_PIECE];
};

struct tok_encoder {
    const struct tokenizer *t;
    regex_t *regex;
    OnigRegion *region;
    struct cache_slot *cache;  /* direct-mapped by hash: a collision replaces the older piece */
    uint32_t *sym;             /* BPE work arrays */
    int32_t *next, *prev;
    uint32_t *rank;
    size_t sym_cap;
    char *norm;                /* normalized text being tokenized */
    size_t norm_cap;
};

int tok_encoder_new(const struct tokenizer *t, struct tok_encoder **out)
{
    struct tok_encoder *e = calloc(1, sizeof *e);
    if (!e)
        return sd_err("out of memory");
    e->t = t;
    OnigErrorInfo einfo;
    const UChar *pat = (const UChar *)t->regex;
    int rc = onig_new(&e->regex, pat, pat + strlen(t->regex), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                      ONIG_SYNTAX_DEFAULT, &einfo);
    if (rc != ONIG_NORMAL) {
        UChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, rc, &einfo);
        free(e);
        return sd_err("pre_tokenizer regex does not compile: %s", (char *)msg);
    }
    e->region = onig_region_new();
    e->cache = calloc(CACHE_SLOTS, sizeof *e->cache);
    if (!e->region || !e->cache) {
        tok_encoder_free(e);
        return sd_err("out of memory");
    }
    *out = e;
    return 0;
}

void tok_encoder_free(struct tok_encoder *e)
{
    if (!e)
        return;
    if (e->regex)
        onig_free(e->regex);
    if (e->region)
        onig_region_free(e->region, 1);
    free(e->cache);
    free(e->sym);
    free(e->next);
    free(e->prev);
    free(e->rank);
    free(e->norm);
    free(e);
}

void tok_ids_free(struct tok_ids *v)
{
    free(v->ids);
    free(v->ends);
    memset(v, 0, sizeof *v);
}

int tok_grow_arrays(size_t *cap, size_t need, int n, void **const arrays[], const size_t size[])
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 256;
    while (c < need)
        c *= 2;
    for (int i = 0; i < n; i++) {
        void *q = realloc(*arrays[i], c * size[i]);
        if (!q)
            return sd_err("out of memory for %zu elements", c);
        *arrays[i] = q;
    }
    *cap = c;
    return 0;
}

int tok_append(char **text, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (tok_grow_arrays(cap, *len + n + 1, 1, (void **const[]){(void **)text}, (const size_t[]){1}) != 0)
        return -1;
    memcpy(*text + *len, s, n);
    *len += n;
    (*text)[*len] = 0;
    return 0;
}

static int ids_reserve(struct tok_ids *v, size_t more)
{
    return tok_grow_arrays(&v->cap, v->n + more, 2, (void **const[]){(void **)&v->ids, (void **)&v->ends},
                           (const size_t[]){sizeof *v->ids, sizeof *v->ends});
}

static int grow(char **p, size_t *cap, size_t need)
{
    return tok_grow_arrays(cap, need, 1, (void **const[]){(void **)p}, (const size_t[]){1});
}

/* The BPE work arrays for a piece of n bytes. */
static int work_reserve(struct tok_encoder *e, size_t n)
{
    return tok_grow_arrays(&e->sym_cap, n, 4,
                           (void **const[]){(void **)&e->sym, (void **)&e->next, (void **)&e->prev, (void **)&e->rank},
                           (const size_t[]){sizeof *e->sym, sizeof *e->next, sizeof *e->prev, sizeof *e->rank});
}

#define NO_RANK UINT32_MAX

static uint32_t pair_rank(const struct tokenizer *t, uint32_t a, uint32_t b, uint32_t *merged)
{
    const struct merge_slot *m = merge_find(t, a, b);
    if (!m)
        return NO_RANK;
    *merged = m->merged;
    return m->rank;
}

/* BPE over one piece: repeatedly merges the lowest-ranked adjacent pair, the leftmost among equal
 * ranks (the order HF's priority queue gives). Leaves the ids in e->sym, returns their count. */
static long bpe_piece(struct tok_encoder *e, const unsigned char *p, size_t n)
{
    const struct tokenizer *t = e->t;
    if (work_reserve(e, n) != 0)
        return -1;
    uint32_t *sym = e->sym, *rank = e->rank;
    int32_t *next = e->next, *prev = e->prev;
    uint32_t merged_dummy;
    for (size_t i = 0; i < n; i++) {
        sym[i] = (uint32_t)t->byte_id[p[i]];
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++)
        rank[i] = pair_rank(t, sym[i], sym[i + 1], &merged_dummy);
    if (n > 0)
        rank[n - 1] = NO_RANK;
    for (;;) {
        int32_t best = -1;
        uint32_t best_rank = NO_RANK;
        for (int32_t i = 0; i >= 0; i = next[i])
            if (rank[i] < best_rank) {
                best_rank = rank[i];
                best = i;
            }
        if (best < 0)
            break;
        int32_t right = next[best];
        uint32_t merged = 0;
        pair_rank(t, sym[best], sym[right], &merged);
        sym[best] = merged;
        next[best] = next[right];
        if (next[right] >= 0)
            prev[next[right]] = best;
        rank[best] = next[best] >= 0 ? pair_rank(t, merged, sym[next[best]], &merged_dummy) : NO_RANK;
        if (prev[best] >= 0)
            rank[prev[best]] = pair_rank(t, sym[prev[best]], merged, &merged_dummy);
    }
    long k = 0;
    for (int32_t i = 0; i >= 0; i = next[i])
        sym[k++] = sym[i];
    return k;
}

/* Appends the ids of one pre-tokenized piece, whose bytes end at `end` in the normalized text. */
static int encode_piece(struct tok_encoder *e, const unsigned char *p, size_t n, size_t end, struct tok_ids *out)
{
    const struct tokenizer *t = e->t;
    struct cache_slot *slot = NULL;
    if (n <= CACHE_MAX_PIECE) {
        uint64_t h = hash_bytes(p, n);
        slot = &e->cache[h & (CACHE_SLOTS - 1)];
        if (slot->len == n && slot->hash == h && memcmp(slot->piece, p, n) == 0) {
            if (ids_reserve(out, slot->nids) != 0)
                return -1;
            for (uint32_t i = 0; i < slot->nids; i++) {
                out->ids[out->n] = slot->ids[i];
                out->ends[out->n++] = end;
            }
            return 0;
        }
        slot->hash = h;
        slot->len = 0;
    }
    int64_t whole = t->ignore_merges ? vocab_find(t, (const char *)p, n) : -1;
    long k;
    if (whole >= 0) {
        if (work_reserve(e, 1) != 0)
            return -1;
        e->sym[0] = (uint32_t)whole;
        k = 1;
    } else if ((k = bpe_piece(e, p, n)) < 0)
        return -1;
    if (ids_reserve(out, (size_t)k) != 0)
        return -1;
    for (long i = 0; i < k; i++) {
        out->ids[out->n] = e->sym[i];
        out->ends[out->n++] = end;
    }
    if (slot) {
        memcpy(slot->piece, p, n);
        memcpy(slot->ids, e->sym, (size_t)k * sizeof *slot->ids);
        slot->nids = (uint32_t)k;
        slot->len = (uint32_t)n;
    }
    return 0;
}

/* Splits s[0..n) with the regex (Isolated: matches and the gaps between them are pieces) and
 * encodes every piece; s sits at offset base of the normalized text. */
static int encode_split(struct tok_encoder *e, const char *s, size_t n, size_t base, struct tok_ids *out)
{
    const UChar *str = (const UChar *)s, *end = str + n;
    size_t pos = 0, gap = 0;
    while (pos < n) {
        int r = onig_search(e->regex, str, end, str + pos, end, e->region, ONIG_OPTION_NONE);
        if (r == ONIG_MISMATCH)
            break;
        if (r < 0)
            return sd_err("pre_tokenizer regex failed (Oniguruma error %d)", r);
        size_t ms = (size_t)e->region->beg[0], me = (size_t)e->region->end[0];
        if (me == ms) { /* an empty match splits nothing; search again one character on */
            pos = ms + 1;
            while (pos < n && (str[pos] & 0xc0) == 0x80)
                pos++;
            continue;
        }
        if (ms > gap && encode_piece(e, str + gap, ms - gap, base + ms, out) != 0)
            return -1;
        if (encode_piece(e, str + ms, me - ms, base + me, out) != 0)
            return -1;
        gap = pos = me;
    }
    if (n > gap && encode_piece(e, str + gap, n - gap, base + n, out) != 0)
        return -1;
    return 0;
}

static bool is_ascii(const char *s, size_t n)
{
    unsigned char acc = 0;
    for (size_t i = 0; i < n; i++)
        acc |= (unsigned char)s[i];
    return acc < 0x80;
}

/* Appends the normalized form of s[0..n) to e->norm at *len. */
static int normalize_append(struct tok_encoder *e, const char *s, size_t n, size_t *len)
{
    const char *src = s;
    size_t m = n;
    utf8proc_uint8_t *mapped = NULL;
    if (e->t->nfc && !is_ascii(s, n)) {
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &mapped,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r < 0)
            return sd_err("text is not valid UTF-8 (%s)", utf8proc_errmsg(r));
        src = (const char *)mapped;
        m = (size_t)r;
    }
    int rc = grow(&e->norm, &e->norm_cap, *len + m + 1);
    if (rc == 0) {
        memcpy(e->norm + *len, src, m);
        *len += m;
    }
    free(mapped);
    return rc;
}

static bool valid_utf8(const char *s, size_t n)
{
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(n - i), &cp);
        if (k <= 0)
            return false;
        i += (size_t)k;
    }
    return true;
}

/* The longest added token at s[0..n), leftmost-longest as HF's matcher takes it, or NULL. */
static const struct added_token *added_at(const struct tokenizer *t, const char *s, size_t n)
{
    unsigned char b = (unsigned char)s[0];
    for (int i = t->added_first[b]; i < t->added_first[b + 1]; i++) {
        const struct added_token *a = &t->added[i];
        if (a->len <= n && memcmp(a->text, s, a->len) == 0)
            return a;
    }
    return NULL;
}

/* Normalizes and encodes the plain text s[from..to) (no added tokens in it), normalizing
 * separately between the cuts that fall inside it. */
static int encode_plain(struct tok_encoder *e, const char *s, size_t from, size_t to, const size_t *cuts,
                        int ncuts, size_t *cuts_norm, int *ci, size_t *norm_len, struct tok_ids *out)
{
    size_t start = *norm_len;
    size_t p = from;
    while (*ci < ncuts && cuts[*ci] <= to) {
        if (cuts[*ci] >= p) {
            if (normalize_append(e, s + p, cuts[*ci] - p, norm_len) != 0)
                return -1;
            p = cuts[*ci];
        }
        cuts_norm[(*ci)++] = *norm_len;
    }
    if (normalize_append(e, s + p, to - p, norm_len) != 0)
        return -1;
    return encode_split(e, e->norm + start, *norm_len - start, start, out);
}

int tok_encode(struct tok_encoder *e, const char *text, size_t len, const size_t *cuts, int ncuts,
               size_t *cuts_norm, struct tok_ids *out)
{
    if (!valid_utf8(text, len))
        return sd_err("text is not valid UTF-8");
    const struct tokenizer *t = e->t;
    size_t norm_len = 0, plain = 0;
    int ci = 0;
    for (size_t i = 0; i < len;) {
        const struct added_token *a = t->added_first[(unsigned char)text[i]] < t->added_first[(unsigned char)text[i] + 1]
                                          ? added_at(t, text + i, len - i)
                                          : NULL;
        if (!a) {
            i++;
            continue;
        }
        if (encode_plain(e, text, plain, i, cuts, ncuts, cuts_norm, &ci, &norm_len, out) != 0)
            return -1;
        if (grow(&e->norm, &e->norm_cap, norm_len + a->len + 1) != 0)
            return -1;
        memcpy(e->norm + norm_len, a->text, a->len);
        norm_len += a->len;
        if (ids_reserve(out, 1) != 0)
            return -1;
        out->ids[out->n] = a->id;
        out->ends[out->n++] = norm_len;
        i += a->len;
        plain = i;
    }
    return encode_plain(e, text, plain, len, cuts, ncuts, cuts_norm, &ci, &norm_len, out);
}
