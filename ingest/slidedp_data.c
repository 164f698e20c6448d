/* slidedp-data: writes the deterministic synthetic SFT dataset (copy | reverse | sort) that the
 * embedded demo job trains a tiny model on. Each document is exactly seq_len tokens:
 * BOS, n symbols, SEP, the answer (n symbols), EOS, PAD...; the loss covers the answer and EOS.
 * `slidedp-data tokenize` (ingest/tokenize_cmd.c) tokenizes a user's own JSONL dataset. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/data.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/version.h"
#include "ingest/tokenize_cmd.h"

enum { TOK_PAD = 0, TOK_BOS = 1, TOK_SEP = 2, TOK_EOS = 3, TOK_FIRST_SYMBOL = 4 };

/* The val split must not share documents with train: its generator gets a different seed. */
#define VAL_SEED_XOR 0x5eed5eed5eed5eedull

enum task { TASK_COPY, TASK_REVERSE, TASK_SORT };
static const char *const task_names[] = {"copy", "reverse", "sort"};

static void usage(FILE *f)
{
    fprintf(f, "usage: slidedp-data copy|reverse|sort --out DIR [--seq-len 64] [--train 4096] "
               "[--val 256] [--seed 1234] [--vocab 32]\n"
               "       slidedp-data tokenize --model DIR --in FILE.jsonl --out FILE.bin [options]\n"
               "       slidedp-data --version | --help\n"
               "copy, reverse, sort: the synthetic datasets the demo job (make run) trains on, DIR/train.bin and\n"
               "DIR/val.bin; each document is BOS, symbols, SEP, the answer, EOS, padding; the loss is on the answer.\n"
               "tokenize: your own JSONL dataset, with the model's tokenizer and chat template:\n");
    tokenize_usage(f);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Fills one document of seq_len tokens and flags. */
static void make_document(enum task task, int seq_len, int vocab, uint64_t *rng, uint32_t *tok, uint8_t *flags)
{
    int n = (seq_len - 3) / 2;
    memset(flags, 0, (size_t)seq_len);
    tok[0] = TOK_BOS;
    flags[0] = DATA_FLAG_DOC_START;
    uint32_t *prompt = tok + 1, *answer = tok + 2 + n;
    for (int i = 0; i < n; i++)
        prompt[i] = TOK_FIRST_SYMBOL + (uint32_t)(splitmix64(rng) % (uint64_t)(vocab - TOK_FIRST_SYMBOL));
    tok[1 + n] = TOK_SEP;
    for (int i = 0; i < n; i++)
        answer[i] = task == TASK_REVERSE ? prompt[n - 1 - i] : prompt[i];
    if (task == TASK_SORT)
        qsort(answer, (size_t)n, sizeof *answer, cmp_u32);
    tok[2 + 2 * n] = TOK_EOS;
    for (int i = 2 + n; i <= 2 + 2 * n; i++)
        flags[i] = DATA_FLAG_LOSS;
    for (int i = 3 + 2 * n; i < seq_len; i++)
        tok[i] = TOK_PAD;
}

/* Writes num_docs documents plus one trailing PAD, so that the order contract's
 * (ntok - 1) / seq_len sequences are exactly the documents. Returns the number of loss tokens. */
static int64_t write_split(const char *path, enum task task, int seq_len, int vocab, int64_t num_docs,
                           uint64_t seed)
{
    int64_t n = num_docs * seq_len + 1;
    uint32_t *tok = malloc((size_t)n * sizeof *tok);
    uint8_t *flags = malloc((size_t)n);
    if (!tok || !flags) {
        free(tok);
        free(flags);
        sd_err("out of memory for %lld tokens", (long long)n);
        return -1;
    }
    uint64_t rng = seed;
    for (int64_t d = 0; d < num_docs; d++)
        make_document(task, seq_len, vocab, &rng, tok + d * seq_len, flags + d * seq_len);
    tok[n - 1] = TOK_PAD;
    flags[n - 1] = 0;
    int64_t loss_tokens = 0;
    for (int64_t i = 0; i < n; i++)
        loss_tokens += flags[i] & DATA_FLAG_LOSS;
    int rc = data_write_sft(path, tok, flags, n);
    free(tok);
    free(flags);
    return rc == 0 ? loss_tokens : -1;
}

static int mkdir_p(const char *dir)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", dir) >= (int)sizeof buf)
        return sd_err("%s: path too long", dir);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == 0) {
            char c = *p;
            *p = 0;
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return sd_err("cannot create %s: %s", buf, strerror(errno));
            *p = c;
            if (c == 0)
                break;
        }
    }
    return 0;
}

/* Parses a decimal integer in [lo, hi] or prints a one-line error. */
static int parse_int(const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "slidedp-data: %s needs an integer in [%lld, %lld], got '%s'\n", opt, lo, hi,
                s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 2 && !strcmp(argv[1], "--version"))
        return sd_version_print();
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "tokenize"))
        return tokenize_main(argc - 2, argv + 2);
    int task = -1;
    for (int t = 0; t < 3; t++)
        if (!strcmp(argv[1], task_names[t]))
            task = t;
    if (task < 0) {
        fprintf(stderr, "slidedp-data: unknown task '%s' (accepted: copy, reverse, sort, tokenize)\n", argv[1]);
        return 2;
    }

    const char *out = NULL;
    long long seq_len = 64, train = 4096, val = 256, seed = 1234, vocab = 32;
    for (int i = 2; i < argc; i++) {
        const char *opt = argv[i], *arg = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        if (!strcmp(opt, "--out")) {
            if (!arg || !*arg) {
                fprintf(stderr, "slidedp-data: --out needs a directory\n");
                return 2;
            }
            out = arg;
        } else if (!strcmp(opt, "--seq-len"))
            rc = parse_int(opt, arg, 5, 1 << 20, &seq_len);
        else if (!strcmp(opt, "--train"))
            rc = parse_int(opt, arg, 1, 1 << 24, &train);
        else if (!strcmp(opt, "--val"))
            rc = parse_int(opt, arg, 1, 1 << 24, &val);
        else if (!strcmp(opt, "--seed"))
            rc = parse_int(opt, arg, 0, INT64_MAX, &seed);
        else if (!strcmp(opt, "--vocab"))
            rc = parse_int(opt, arg, TOK_FIRST_SYMBOL + 1, 1 << 30, &vocab);
        else {
            fprintf(stderr, "slidedp-data: unknown option '%s' (accepted: --out, --seq-len, --train, "
                            "--val, --seed, --vocab)\n", opt);
            return 2;
        }
        if (rc != 0)
            return 2;
        i++;
    }
    if (!out) {
        fprintf(stderr, "slidedp-data: --out DIR is required\n");
        return 2;
    }
    if (train * seq_len + 1 > INT32_MAX || val * seq_len + 1 > INT32_MAX) {
        fprintf(stderr, "slidedp-data: --train/--val times --seq-len exceeds a shard's int32 token count\n");
        return 2;
    }

    char train_path[4200], val_path[4200];
    snprintf(train_path, sizeof train_path, "%s/train.bin", out);
    snprintf(val_path, sizeof val_path, "%s/val.bin", out);
    if (mkdir_p(out) != 0) {
        fprintf(stderr, "slidedp-data: %s\n", sd_errmsg());
        return 1;
    }
    int64_t train_loss = write_split(train_path, task, (int)seq_len, (int)vocab, train, (uint64_t)seed);
    int64_t val_loss = train_loss < 0 ? -1
                                      : write_split(val_path, task, (int)seq_len, (int)vocab, val,
                                                    (uint64_t)seed ^ VAL_SEED_XOR);
    if (val_loss < 0) {
        fprintf(stderr, "slidedp-data: %s\n", sd_errmsg());
        return 1;
    }
    printf("slidedp-data: %s: %s (%lld docs, %lld loss tokens) and %s (%lld docs, %lld loss tokens); "
           "seq_len %lld, %lld symbols per doc, vocab %lld, seed %lld\n",
           task_names[task], train_path, train, (long long)train_loss, val_path, val,
           (long long)val_loss, seq_len, (seq_len - 3) / 2, vocab, seed);
    return 0;
}
