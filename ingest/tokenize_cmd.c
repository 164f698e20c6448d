/* `slidedp-data tokenize`: turns a JSONL dataset (chat, instruction or plain text) into a
 * slidedp SFT shard with the model's own tokenizer and chat template, as transformers would
 * tokenize it; loss masks, packing, a validation split, and lines encoded by several threads
 * with the output kept in input order. */
#include "tokenize_cmd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/data.h"
#include "common/err.h"
#include "ingest/chat_template.h"
#include "ingest/pack.h"
#include "ingest/pyjson.h"
#include "ingest/tokenizer.h"

enum format { FMT_AUTO, FMT_MESSAGES, FMT_SHAREGPT, FMT_ALPACA, FMT_PROMPT_COMPLETION, FMT_TEXT, FMT_COUNT };
static const char *const format_names[FMT_COUNT] = {"auto", "messages", "sharegpt", "alpaca", "prompt-completion", "text"};
#define FORMAT_LIST "auto, messages, sharegpt, alpaca, prompt-completion, text"

enum overflow { OVERFLOW_DROP, OVERFLOW_TRUNCATE };
/* --pack-fit: greedy (in input order, a new window when a document does not fit), best (best-fit
 * decreasing: the least padding, input order lost) or best-ordered (best fit in input order). */
enum pack_fit { FIT_GREEDY, FIT_BEST, FIT_BEST_ORDERED };

#define LINES_PER_BATCH 256

struct options {
    const char *model, *in, *out, *val_out, *template_name, *date;
    enum format format;
    bool train_all;
    long long max_len, pack, val, threads;
    const char *max_len_flag;   /* the flag that set max_len: --max-len, or --pack when only it was given */
    enum overflow overflow;
    enum pack_fit pack_fit;
};

/* Everything the workers share, read-only while they run. */
struct job {
    struct options opt;
    struct tokenizer *tok;
    struct chat_template tpl;
    bool have_tpl;
    int64_t bos, eos, pad;      /* -1 when the tokenizer config has none */
    int64_t vocab_size;
    const char *text;           /* the whole input */
    size_t (*lines)[2];         /* [start, end) of each line */
    int64_t nlines;
    int64_t nbatches;
    struct batch *batches;
    atomic_int_fast64_t next_batch;
};

/* One batch of lines, encoded by one worker. */
struct batch {
    uint32_t *tokens;
    uint8_t *flags;
    size_t n, cap;
    int64_t *doc_end;           /* per line: end of its tokens in this batch (blank lines: empty) */
    bool *blank;
    bool *no_assistant;         /* per line: a conversation without an assistant turn under --train-on
                                   assistant, left out (empty) since it has nothing to train on */
    int64_t error_line;         /* the first failing line (1-based), 0 when none */
    char error[512];
    int64_t quoted_args;        /* tool calls whose string arguments the template quotes */
    int64_t quoted_args_line;   /* the first line (1-based) holding one */
};

/* ---- model directory ---------------------------------------------------------------------- */

static cJSON *read_json(const char *dir, const char *name, bool required)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (required)
            sd_err("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    bool ok = buf && fread(buf, 1, (size_t)n, f) == (size_t)n;
    fclose(f);
    cJSON *root = NULL;
    if (ok) {
        buf[n] = 0;
        root = cJSON_Parse(buf);
    }
    free(buf);
    if (!root)
        sd_err("%s: %s", path, ok ? "not valid JSON" : "cannot read");
    return root;
}

/* A special token named in tokenizer_config.json: a string or {"content": ...}; -1 if absent. */
static int special_token(const struct tokenizer *tok, const cJSON *cfg, const char *key, int64_t *id)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsObject(v))
        v = cJSON_GetObjectItemCaseSensitive(v, "content");
    *id = -1;
    if (!cJSON_IsString(v))
        return 0;
    *id = tokenizer_token_id(tok, v->valuestring);
    if (*id < 0)
        return sd_err("tokenizer_config.json: %s '%s' is not a token of tokenizer.json", key, v->valuestring);
    return 0;
}

static int load_model_dir(struct job *j)
{
    const char *dir = j->opt.model;
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (tokenizer_load(path, &j->tok) != 0)
        return -1;
    cJSON *cfg = read_json(dir, "tokenizer_config.json", false);
    cJSON *config = read_json(dir, "config.json", true);
    int rc = config ? 0 : -1;
    const cJSON *vs = cJSON_GetObjectItemCaseSensitive(config, "vocab_size");
    if (rc == 0 && (!cJSON_IsNumber(vs) || vs->valuedouble < 1))
        rc = sd_err("%s/config.json: no vocab_size", dir);
    if (rc == 0)
        j->vocab_size = (int64_t)vs->valuedouble;
    if (rc == 0)
        rc = special_token(j->tok, cfg, "eos_token", &j->eos);
    if (rc == 0)
        rc = special_token(j->tok, cfg, "bos_token", &j->bos);
    if (rc == 0)
        rc = special_token(j->tok, cfg, "pad_token", &j->pad);
    if (rc == 0 && j->pad < 0)
        j->pad = j->eos;

    bool chat = j->opt.format != FMT_TEXT && j->opt.format != FMT_PROMPT_COMPLETION;
    const cJSON *ct = cJSON_GetObjectItemCaseSensitive(cfg, "chat_template");
    if (rc == 0 && chat) {
        if (j->opt.template_name && strcmp(j->opt.template_name, "auto") != 0)
            rc = chat_template_named(j->opt.template_name, &j->tpl);
        else if (!cJSON_IsString(ct))
            rc = sd_err("%s/tokenizer_config.json has no chat_template string; name the family with --template "
                        "(%s)", dir, CHAT_FAMILY_LIST);
        else
            rc = chat_template_detect(ct->valuestring, &j->tpl);
        const char *const *specials;
        int nspecials = rc == 0 ? chat_template_special_tokens(&j->tpl, &specials) : 0;
        for (int i = 0; i < nspecials && rc == 0; i++)
            if (tokenizer_added_token_id(j->tok, specials[i]) < 0)
                rc = sd_err("the %s chat template writes %s, which %s/tokenizer.json does not have as a special "
                            "token (it would be trained on as plain text): this template is not the tokenizer's; "
                            "leave --template out or name the tokenizer's family (%s)",
                            chat_family_names[j->tpl.family], specials[i], dir, CHAT_FAMILY_LIST);
        j->have_tpl = rc == 0;
        if (rc == 0 && j->opt.date)
            snprintf(j->tpl.date, sizeof j->tpl.date, "%s", j->opt.date);
    }
    if (rc == 0 && j->opt.format != FMT_AUTO && j->opt.format != FMT_MESSAGES && j->opt.format != FMT_SHAREGPT &&
        j->opt.format != FMT_ALPACA && j->eos < 0)
        rc = sd_err("%s/tokenizer_config.json: no eos_token (the %s format ends each document with it)", dir,
                    format_names[j->opt.format]);
    cJSON_Delete(cfg);
    cJSON_Delete(config);
    return rc;
}

/* ---- one line ----------------------------------------------------------------------------- */

struct worker {
    struct job *job;
    struct tok_encoder *enc;
    struct tok_ids ids;
    struct chat_render render;
    struct chat_message *msgs;
    int msgs_cap;
    size_t *cuts, *cuts_norm;   /* the edges of the target spans */
    size_t cuts_cap;
    char *joined;               /* alpaca's instruction and input */
    char **json;                /* the line's tojson texts: its tools first, then its calls' arguments */
    int njson;
    size_t json_cap;
    struct chat_tool_call *calls; /* the line's tool calls, the messages' in order */
    size_t calls_cap;
    struct chat_tools tools;
    bool tools_given;           /* the line's tools list, for the template's test of it */
    int quoted_args;            /* the line's calls with string arguments written as a JSON string */
};

static const char *get_string(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Whether a template's `{% if x %}` would take the key's value: present and not null, false, 0, or
 * an empty string, list or object. */
static bool template_truthy(const cJSON *v)
{
    if (!v || cJSON_IsNull(v) || cJSON_IsFalse(v))
        return false;
    if (cJSON_IsNumber(v))
        return v->valuedouble != 0;
    if (cJSON_IsString(v))
        return v->valuestring[0] != 0;
    return v->child != NULL || cJSON_IsTrue(v); /* a list or object with items */
}

/* Keeps `json | tojson(indent)` of a node for the line's render, or returns NULL. */
static const char *keep_json(struct worker *w, const cJSON *node, int indent)
{
    if (tok_grow_arrays(&w->json_cap, (size_t)w->njson + 1, 1, (void **const[]){(void **)&w->json},
                        (const size_t[]){sizeof *w->json}) != 0)
        return NULL;
    char *text = pyjson_dumps_indent(node, indent);
    if (text)
        w->json[w->njson++] = text;
    return text;
}

static void forget_json(struct worker *w)
{
    for (int k = 0; k < w->njson; k++)
        free(w->json[k]);
    w->njson = 0;
}

/* An assistant turn's tool_calls into w->calls[*ncalls..]: each call an object, or one whose
 * `function` object holds its name (a string) and arguments (any JSON); Llama 3.1's template takes
 * one call a turn, in that `function` form. */
static int read_tool_calls(struct worker *w, const cJSON *list, int i, int *ncalls)
{
    bool llama = w->job->tpl.family == CHAT_LLAMA31;
    if (!cJSON_IsArray(list))
        return sd_err("messages[%d]: tool_calls: needs a list", i);
    if (llama && cJSON_GetArraySize(list) != 1)
        return sd_err("messages[%d]: tool_calls: the llama3.1 template takes one call a turn (it has %d)", i,
                      cJSON_GetArraySize(list));
    const cJSON *item;
    int k = 0;
    cJSON_ArrayForEach(item, list)
    {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(item, "function");
        if ((fn || llama) && !(cJSON_IsObject(fn) && fn->child)) /* Qwen3 tests it for truth, Qwen2.5 for presence */
            return sd_err("messages[%d]: tool_calls[%d]: function: needs an object with name and arguments", i, k);
        const cJSON *call = fn ? fn : item;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(call, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(call, "arguments");
        if (!cJSON_IsObject(call) || !cJSON_IsString(name) || !args)
            return sd_err("messages[%d]: tool_calls[%d]: needs a string name and arguments", i, k);
        if (tok_grow_arrays(&w->calls_cap, (size_t)*ncalls + 1, 1, (void **const[]){(void **)&w->calls},
                            (const size_t[]){sizeof *w->calls}) != 0)
            return -1;
        const char *json = keep_json(w, args, 0);
        if (!json)
            return sd_err_prefix("messages[%d]: tool_calls[%d]: arguments", i, k);
        w->calls[(*ncalls)++] = (struct chat_tool_call){name->valuestring, cJSON_IsString(args) ? args->valuestring : NULL,
                                                        json};
        /* OpenAI's exports give arguments as a JSON text in a string; only Qwen3 writes it as is */
        w->quoted_args += cJSON_IsString(args) && w->job->tpl.family != CHAT_QWEN3;
        k++;
    }
    return 0;
}

static int add_message(struct worker *w, int *n, const char *role, const char *content, const char *reasoning)
{
    if (*n == w->msgs_cap) {
        int cap = w->msgs_cap ? w->msgs_cap * 2 : 16;
        void *m = realloc(w->msgs, (size_t)cap * sizeof *w->msgs);
        if (!m)
            return sd_err("out of memory");
        w->msgs = m;
        w->msgs_cap = cap;
    }
    w->msgs[(*n)++] = (struct chat_message){role, content, reasoning, NULL, 0};
    return 0;
}

/* The conversation of a messages / sharegpt / alpaca line (`obj`, parsed from text[0..len)), into
 * w->msgs, and its tool definitions into w->tools. */
static int read_conversation(struct worker *w, enum format fmt, cJSON *obj, const char *text, size_t len, int *n)
{
    *n = 0;
    forget_json(w);
    w->tools = (struct chat_tools){NULL, 0};
    w->tools_given = false;
    if (fmt == FMT_ALPACA) {
        const char *instruction = get_string(obj, "instruction"), *input = get_string(obj, "input");
        const char *output = get_string(obj, "output"), *system = get_string(obj, "system");
        if (!instruction || !output)
            return sd_err("alpaca: needs string fields instruction and output");
        /* instruction and a non-empty input joined by a newline, as LLaMA-Factory does */
        free(w->joined);
        w->joined = NULL;
        if (input && *input && asprintf(&w->joined, "%s\n%s", instruction, input) < 0)
            return sd_err("out of memory");
        if ((system && *system && add_message(w, n, "system", system, NULL) != 0) ||
            add_message(w, n, "user", w->joined ? w->joined : instruction, NULL) != 0 ||
            add_message(w, n, "assistant", output, NULL) != 0)
            return -1;
        return 0;
    }
    bool sharegpt = fmt == FMT_SHAREGPT;
    const char *list_key = sharegpt ? "conversations" : "messages";
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(obj, list_key);
    if (!cJSON_IsArray(list))
        return sd_err("%s: needs a '%s' list", format_names[fmt], list_key);
    /* tool data the render would drop is refused (null or empty fields, as exports often carry,
     * render nothing in the templates and pass) */
    enum chat_family family = w->job->tpl.family;
    bool has_tools = chat_template_has_tools(&w->job->tpl), llama = family == CHAT_LLAMA31;
    const char *no_tools = has_tools ? "tool data is read from the messages format (tools, tool_calls, role tool)"
                                     : "the chat template does not render tools (supported with qwen3, qwen2.5 "
                                       "and llama3.1)";
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(obj, "tools");
    /* Qwen's templates test `if tools`, Llama 3.1's `tools is not none`: an empty list counts */
    w->tools_given = cJSON_IsArray(tools) && (llama || tools->child);
    bool json_out = w->tools_given;
    const cJSON *m;
    cJSON_ArrayForEach(m, list)
    {
        const char *role = get_string(m, "role");
        json_out |= template_truthy(cJSON_GetObjectItemCaseSensitive(m, "tool_calls")) ||
                    (llama && role && (!strcmp(role, "tool") || !strcmp(role, "ipython")));
    }
    if (json_out && has_tools && !sharegpt && pyjson_keep_number_lexemes(obj, text, len) != 0)
        return -1;
    if (template_truthy(tools)) {
        if (sharegpt || !has_tools)
            return sd_err("tools: %s", no_tools);
        if (!cJSON_IsArray(tools))
            return sd_err("tools: needs a list of tool definitions");
    }
    w->tools_given &= has_tools && !sharegpt;
    if (w->tools_given) {
        const cJSON *tool;
        int k = 0;
        cJSON_ArrayForEach(tool, tools)
        {
            if (!keep_json(w, tool, llama ? 4 : 0)) /* Llama 3.1: `tojson(indent=4)` */
                return sd_err_prefix("tools[%d]", k);
            k++;
        }
    }
    int ntools = w->njson;
    int i = 0, ncalls = 0;
    cJSON_ArrayForEach(m, list)
    {
        const char *role = get_string(m, sharegpt ? "from" : "role");
        const char *content = get_string(m, sharegpt ? "value" : "content");
        const cJSON *content_node = cJSON_GetObjectItemCaseSensitive(m, "content");
        const cJSON *calls = sharegpt ? NULL : cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
        bool with_calls = template_truthy(calls);
        bool llama_result = llama && !sharegpt && role && (!strcmp(role, "tool") || !strcmp(role, "ipython"));
        /* an assistant turn of calls alone may carry a null or no content (OpenAI's exports) */
        if (role && !strcmp(role, "assistant") && with_calls && !content &&
            (!content_node || cJSON_IsNull(content_node)))
            content = "";
        if (llama && with_calls && content && *content)
            return sd_err("messages[%d]: the llama3.1 template drops an assistant's content beside its tool call: "
                          "give the call a turn of its own", i);
        /* Llama 3.1 writes a tool result (a string, list or object) as `content | tojson` */
        if (llama_result && (cJSON_IsString(content_node) || cJSON_IsArray(content_node) || cJSON_IsObject(content_node)) &&
            !(content = keep_json(w, content_node, 0)))
            return sd_err_prefix("messages[%d]: content", i);
        if (!role || !content)
            return sd_err("%s[%d]: needs string fields %s", list_key, i, sharegpt ? "from and value" : "role and content");
        if (sharegpt) {
            static const char *const from[][2] = {{"human", "user"}, {"user", "user"}, {"gpt", "assistant"},
                                                  {"assistant", "assistant"}, {"system", "system"}};
            const char *mapped = NULL;
            for (size_t k = 0; k < sizeof from / sizeof *from; k++)
                if (!strcmp(role, from[k][0]))
                    mapped = from[k][1];
            if (!mapped)
                return sd_err("conversations[%d]: unknown role '%s' (accepted: human, gpt, system)", i, role);
            role = mapped;
        } else if (!strcmp(role, "function") || (!strcmp(role, "ipython") && !llama) ||
                   (!strcmp(role, "tool") && !has_tools)) {
            return sd_err("messages[%d]: role '%s': %s", i, role,
                          has_tools ? "give tool results as role tool" : no_tools);
        } else if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool") &&
                   !llama_result) {
            return sd_err("messages[%d]: unknown role '%s' (accepted: system, user, assistant%s)", i, role,
                          llama ? ", tool, ipython" : has_tools ? ", tool" : "");
        }
        if (!sharegpt && template_truthy(cJSON_GetObjectItemCaseSensitive(m, "function_call")))
            return sd_err("messages[%d]: function_call: %s", i,
                          has_tools ? "give calls as tool_calls (OpenAI's current form)" : no_tools);
        if (with_calls && (!has_tools || strcmp(role, "assistant")))
            return sd_err("messages[%d]: tool_calls: %s", i, has_tools ? "belong to assistant turns" : no_tools);
        int first_call = ncalls;
        if (with_calls && read_tool_calls(w, calls, i, &ncalls) != 0)
            return -1;
        if (add_message(w, n, role, content, sharegpt ? NULL : get_string(m, "reasoning_content")) != 0)
            return -1;
        w->msgs[*n - 1].ntool_calls = ncalls - first_call;
        i++;
    }
    /* the messages' calls lie in order in w->calls, which has stopped growing */
    for (int k = 0, first_call = 0; k < *n; first_call += w->msgs[k++].ntool_calls)
        w->msgs[k].tool_calls = w->msgs[k].ntool_calls ? w->calls + first_call : NULL;
    w->tools = (struct chat_tools){(const char *const *)w->json, ntools}; /* w->json has stopped growing */
    if (*n == 0)
        return sd_err("%s: the conversation is empty", list_key);
    return 0;
}

/* Encodes text into the batch: BOS/EOS as asked, every token a target when `all`, else the tokens
 * overlapping the target spans. */
static int emit(struct worker *w, struct batch *b, const char *text, size_t len, bool all, const size_t (*spans)[2],
                int nspans, bool post_tokens, bool eos)
{
    struct job *j = w->job;
    if (all)
        nspans = 0;
    if (tok_grow_arrays(&w->cuts_cap, 2 * (size_t)nspans, 2, (void **const[]){(void **)&w->cuts, (void **)&w->cuts_norm},
                        (const size_t[]){sizeof *w->cuts, sizeof *w->cuts_norm}) != 0)
        return -1;
    for (int s = 0; s < nspans; s++) {
        w->cuts[2 * s] = spans[s][0];
        w->cuts[2 * s + 1] = spans[s][1];
    }
    const size_t *cuts_norm = w->cuts_norm;
    w->ids.n = 0;
    if (tok_encode(w->enc, text, len, w->cuts, 2 * nspans, w->cuts_norm, &w->ids) != 0)
        return -1;
    const uint32_t *pre, *suf;
    int npre, nsuf;
    tokenizer_post_tokens(j->tok, &pre, &npre, &suf, &nsuf);
    if (!post_tokens)
        npre = nsuf = 0;
    size_t total = (size_t)npre + w->ids.n + (size_t)nsuf + (eos ? 1 : 0);
    if (tok_grow_arrays(&b->cap, b->n + total, 2, (void **const[]){(void **)&b->tokens, (void **)&b->flags},
                        (const size_t[]){sizeof *b->tokens, 1}) != 0)
        return -1;
    size_t start = b->n;
    for (int i = 0; i < npre; i++) {
        b->tokens[b->n] = pre[i];
        b->flags[b->n++] = all ? DATA_FLAG_LOSS : 0;
    }
    size_t prev_end = 0;
    for (size_t i = 0; i < w->ids.n; i++) {
        /* a token covers [prev_end, end) of the normalized text; it is a target when it
         * overlaps a span (transformers' char_to_token rule) */
        size_t end = w->ids.ends[i];
        bool target = all;
        for (int s = 0; !target && s < nspans; s++)
            target = prev_end < cuts_norm[2 * s + 1] && end > cuts_norm[2 * s];
        b->tokens[b->n] = w->ids.ids[i];
        b->flags[b->n++] = target ? DATA_FLAG_LOSS : 0;
        prev_end = end;
    }
    for (int i = 0; i < nsuf; i++) {
        b->tokens[b->n] = suf[i];
        b->flags[b->n++] = all ? DATA_FLAG_LOSS : 0;
    }
    if (eos) {
        b->tokens[b->n] = (uint32_t)j->eos;
        b->flags[b->n++] = DATA_FLAG_LOSS;
    }
    for (size_t i = start; i < b->n; i++)
        if (b->tokens[i] >= (uint64_t)j->vocab_size)
            return sd_err("token id %u is not below the config's vocab_size %lld", b->tokens[i],
                          (long long)j->vocab_size);
    if (b->n > start)
        b->flags[start] |= DATA_FLAG_DOC_START;
    return 0;
}

/* Encodes one line into the batch; sets *no_assistant (and encodes nothing) for a conversation
 * that has no assistant turn to train on. */
static int encode_line(struct worker *w, struct batch *b, const char *line, size_t len, bool *no_assistant)
{
    struct job *j = w->job;
    const char *end;
    w->quoted_args = 0;
    cJSON *obj = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    if (!obj || !cJSON_IsObject(obj)) {
        cJSON_Delete(obj);
        return sd_err("not a JSON object");
    }
    while (end < line + len && (*end == ' ' || *end == '\t' || *end == '\r'))
        end++;
    int rc = end == line + len ? pyjson_check_nul(line, len) : sd_err("trailing characters after the JSON object");
    enum format fmt = j->opt.format;
    if (rc == 0 && fmt == FMT_TEXT) {
        const char *text = get_string(obj, "text");
        rc = text ? emit(w, b, text, strlen(text), true, NULL, 0, true, true)
                  : sd_err("text: needs a string field text");
    } else if (rc == 0 && fmt == FMT_PROMPT_COMPLETION) {
        const char *prompt = get_string(obj, "prompt"), *completion = get_string(obj, "completion");
        if (!prompt || !completion)
            rc = sd_err("prompt-completion: needs string fields prompt and completion");
        char *joined = NULL;
        if (rc == 0 && asprintf(&joined, "%s%s", prompt, completion) < 0)
            rc = sd_err("out of memory");
        size_t span[1][2] = {{strlen(prompt ? prompt : ""), strlen(joined ? joined : "")}};
        if (rc == 0)
            rc = emit(w, b, joined, span[0][1], j->opt.train_all, span, 1, true, true);
        free(joined);
    } else if (rc == 0) {
        int n;
        rc = read_conversation(w, fmt, obj, line, (size_t)(end - line), &n);
        chat_render_reset(&w->render);
        if (rc == 0)
            rc = chat_render(&j->tpl, w->msgs, n, w->tools_given ? &w->tools : NULL, &w->render);
        *no_assistant = rc == 0 && !j->opt.train_all && w->render.nspans == 0;
        if (rc == 0 && !*no_assistant)
            rc = emit(w, b, w->render.text, w->render.len, j->opt.train_all, (const size_t(*)[2])w->render.spans,
                      w->render.nspans, false, false);
    }
    cJSON_Delete(obj);
    return rc;
}

static bool blank_line(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    struct job *j = w->job;
    for (;;) {
        int64_t bi = atomic_fetch_add(&j->next_batch, 1);
        if (bi >= j->nbatches)
            break;
        struct batch *b = &j->batches[bi];
        int64_t first = bi * LINES_PER_BATCH, last = first + LINES_PER_BATCH;
        if (last > j->nlines)
            last = j->nlines;
        b->doc_end = calloc((size_t)(last - first), sizeof *b->doc_end);
        b->blank = calloc((size_t)(last - first), sizeof *b->blank);
        b->no_assistant = calloc((size_t)(last - first), sizeof *b->no_assistant);
        if (!b->doc_end || !b->blank || !b->no_assistant) {
            b->error_line = first + 1;
            snprintf(b->error, sizeof b->error, "out of memory");
            continue;
        }
        for (int64_t l = first; l < last; l++) {
            const char *line = j->text + j->lines[l][0];
            size_t len = j->lines[l][1] - j->lines[l][0];
            b->blank[l - first] = blank_line(line, len);
            if (!b->blank[l - first] && encode_line(w, b, line, len, &b->no_assistant[l - first]) != 0) {
                b->error_line = l + 1;
                snprintf(b->error, sizeof b->error, "%s", sd_errmsg());
                break;
            }
            b->doc_end[l - first] = (int64_t)b->n;
            if (w->quoted_args && !b->quoted_args)
                b->quoted_args_line = l + 1;
            b->quoted_args += w->quoted_args;
        }
        if (b->error_line) {
            /* later batches are useless once one line fails: stop handing them out */
            atomic_store(&j->next_batch, j->nbatches);
        }
    }
    return NULL;
}

/* ---- input and output --------------------------------------------------------------------- */

static char *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        sd_err("cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t k = fread(buf + n, 1, cap - n - 1, f);
        n += k;
        if (n + 1 < cap)
            break;
        cap *= 2;
        char *nb = realloc(buf, cap);
        if (!nb)
            free(buf);
        buf = nb;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        sd_err("cannot read %s", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

static int split_lines(struct job *j, size_t len)
{
    int64_t cap = 1024;
    j->lines = malloc((size_t)cap * sizeof *j->lines);
    for (size_t p = 0; j->lines && p < len;) {
        const char *nl = memchr(j->text + p, '\n', len - p);
        size_t e = nl ? (size_t)(nl - j->text) : len;
        if (j->nlines == cap) {
            cap *= 2;
            void *l = realloc(j->lines, (size_t)cap * sizeof *j->lines);
            if (!l) {
                free(j->lines);
                j->lines = NULL;
                break;
            }
            j->lines = l;
        }
        j->lines[j->nlines][0] = p;
        j->lines[j->nlines][1] = e;
        j->nlines++;
        p = e + 1;
    }
    return j->lines ? 0 : sd_err("out of memory for the lines of %s", j->opt.in);
}

/* The format of the first non-blank line. */
static int detect_format(struct job *j)
{
    for (int64_t l = 0; l < j->nlines; l++) {
        const char *line = j->text + j->lines[l][0];
        size_t len = j->lines[l][1] - j->lines[l][0];
        if (blank_line(line, len))
            continue;
        cJSON *obj = cJSON_ParseWithLengthOpts(line, len, NULL, 0);
        if (!obj)
            return sd_err("%s:%lld: not valid JSON", j->opt.in, (long long)l + 1);
        static const struct {
            const char *key;
            enum format fmt;
        } keys[] = {{"messages", FMT_MESSAGES}, {"conversations", FMT_SHAREGPT}, {"instruction", FMT_ALPACA},
                    {"prompt", FMT_PROMPT_COMPLETION}, {"text", FMT_TEXT}};
        for (size_t k = 0; k < sizeof keys / sizeof *keys && j->opt.format == FMT_AUTO; k++)
            if (cJSON_GetObjectItemCaseSensitive(obj, keys[k].key))
                j->opt.format = keys[k].fmt;
        cJSON_Delete(obj);
        if (j->opt.format == FMT_AUTO)
            return sd_err("%s:%lld: cannot tell the format (no messages, conversations, instruction, prompt or "
                          "text field); name it with --format", j->opt.in, (long long)l + 1);
        return 0;
    }
    return sd_err("%s: no examples (the dataset is empty)", j->opt.in);
}

/* A growing token/flag list for one output file. */
struct shard {
    uint32_t *tokens;
    uint8_t *flags;
    int64_t n;
    size_t cap;
    int64_t docs, targets, padding;
    /* --pack-fit best*: the documents, laid into windows once all are known */
    const uint32_t **doc_tokens;
    const uint8_t **doc_flags;
    int64_t *doc_len;
    size_t doc_cap;
};

static int shard_append(struct shard *s, const uint32_t *tok, const uint8_t *flags, int64_t n, uint32_t fill)
{
    if (tok_grow_arrays(&s->cap, (size_t)(s->n + n), 2, (void **const[]){(void **)&s->tokens, (void **)&s->flags},
                        (const size_t[]){sizeof *s->tokens, 1}) != 0)
        return -1;
    for (int64_t i = 0; i < n; i++) {
        s->tokens[s->n + i] = tok ? tok[i] : fill;
        s->flags[s->n + i] = flags ? flags[i] : 0;
        s->targets += flags && (flags[i] & DATA_FLAG_LOSS) && !(flags[i] & DATA_FLAG_DOC_START);
    }
    s->padding += tok ? 0 : n;
    s->n += n;
    return 0;
}

/* Adds one document; with packing, starts a new window of `pack` tokens when it does not fit in
 * the current one (the rest of that window is padding, never a target). */
static int shard_add_doc(struct shard *s, const uint32_t *tok, const uint8_t *flags, int64_t n, int64_t pack,
                         uint32_t pad)
{
    if (pack > 0) {
        int64_t used = s->n % pack;
        if (used > 0 && used + n > pack && shard_append(s, NULL, NULL, pack - used, pad) != 0)
            return -1;
    }
    s->docs++;
    return shard_append(s, tok, flags, n, 0);
}

/* Keeps a document for best-fit packing (shard_lay_best_fit). */
static int shard_keep_doc(struct shard *s, const uint32_t *tok, const uint8_t *flags, int64_t n)
{
    if (tok_grow_arrays(&s->doc_cap, (size_t)s->docs + 1, 3,
                        (void **const[]){(void **)&s->doc_tokens, (void **)&s->doc_flags, (void **)&s->doc_len},
                        (const size_t[]){sizeof *s->doc_tokens, sizeof *s->doc_flags, sizeof *s->doc_len}) != 0)
        return -1;
    s->doc_tokens[s->docs] = tok;
    s->doc_flags[s->docs] = flags;
    s->doc_len[s->docs++] = n;
    return 0;
}

/* Lays the kept documents into windows of `pack` tokens by best fit (ingest/pack.h). */
static int shard_lay_best_fit(struct shard *s, int64_t pack, bool decreasing, uint32_t pad)
{
    int64_t n = s->docs, *order = malloc((size_t)(n + 1) * sizeof *order);
    int64_t *window_of = malloc((size_t)(n + 1) * sizeof *window_of);
    int rc = order && window_of ? 0 : sd_err("out of memory packing %lld documents", (long long)n);
    if (rc == 0 && pack_best_fit(s->doc_len, n, pack, decreasing, order, window_of) < 0)
        rc = -1;
    for (int64_t k = 0; rc == 0 && k < n; k++) {
        int64_t used = s->n % pack;
        if (k > 0 && window_of[k] != window_of[k - 1] && used > 0)
            rc = shard_append(s, NULL, NULL, pack - used, pad);
        int64_t d = order[k];
        if (rc == 0)
            rc = shard_append(s, s->doc_tokens[d], s->doc_flags[d], s->doc_len[d], 0);
    }
    free(order);
    free(window_of);
    return rc;
}

/* Pads a packed shard to whole windows plus the one trailing token the order contract needs, so
 * that its (ntok - 1) / pack sequences are exactly the windows. */
static int shard_finish(struct shard *s, int64_t pack, uint32_t pad)
{
    if (pack > 0 && s->n % pack && shard_append(s, NULL, NULL, pack - s->n % pack, pad) != 0)
        return -1;
    return pack > 0 ? shard_append(s, NULL, NULL, 1, pad) : 0;
}

/* ---- main --------------------------------------------------------------------------------- */

void tokenize_usage(FILE *f)
{
    fprintf(f, "usage: slidedp-data tokenize --model DIR --in FILE.jsonl --out FILE.bin [--format %s]\n"
               "         [--template auto|%s] [--date 'DD Mon YYYY'] [--train-on assistant|all]\n"
               "         [--max-len N --overflow drop|truncate] [--pack SEQ_LEN [--pack-fit greedy|best|best-ordered]]\n"
               "         [--val N --val-out FILE.bin] [--threads N]\n"
               "  --model DIR       the HF model directory: tokenizer.json, tokenizer_config.json, config.json\n"
               "  --format F        the JSONL's format (auto: from the first line)\n"
               "  --template T      the chat template (auto: recognised in tokenizer_config.json); one whose\n"
               "                    special tokens the tokenizer lacks is refused\n"
               "  --train-on W      assistant (default): targets are the assistant turns, and a conversation\n"
               "                    without one is dropped; all: every token\n"
               "  --max-len N       documents longer than N tokens follow --overflow: drop (default) or truncate\n"
               "                    (an example left without a target is dropped and named)\n"
               "  --pack SEQ_LEN    whole documents packed into windows of SEQ_LEN ([data] seq_len); --max-len\n"
               "                    defaults to it\n"
               "  --pack-fit F      greedy (default: input order, a new window when a document does not fit),\n"
               "                    best (best-fit decreasing: the least padding) or best-ordered (best fit in\n"
               "                    input order); the summary prints the padding fraction\n"
               "  --val N           the last N examples go to --val-out\n"
               "  --threads N       encoding threads (default: all cores)\n"
               "A shard without a target is never written (exit 2).\n",
            "auto|messages|sharegpt|alpaca|prompt-completion|text", "qwen2.5|qwen3|llama3|llama3.1");
}

static int parse_ll(const char *opt, const char *s, long long lo, long long hi, long long *out)
{
    char *end;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi)
        return sd_err("%s needs an integer in [%lld, %lld], got '%s'", opt, lo, hi, s ? s : "");
    *out = v;
    return 0;
}

static int parse_options(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->threads = sysconf(_SC_NPROCESSORS_ONLN);
    if (o->threads < 1)
        o->threads = 1;
    bool overflow_set = false, fit_set = false;
    for (int i = 0; i < argc; i++) {
        const char *opt = argv[i], *arg = i + 1 < argc ? argv[i + 1] : NULL;
        if (!arg)
            return sd_err("%s needs a value", opt);
        int rc = 0;
        if (!strcmp(opt, "--model"))
            o->model = arg;
        else if (!strcmp(opt, "--in"))
            o->in = arg;
        else if (!strcmp(opt, "--out"))
            o->out = arg;
        else if (!strcmp(opt, "--val-out"))
            o->val_out = arg;
        else if (!strcmp(opt, "--template"))
            o->template_name = arg;
        else if (!strcmp(opt, "--date"))
            o->date = arg;
        else if (!strcmp(opt, "--format")) {
            int f = -1;
            for (int k = 0; k < FMT_COUNT; k++)
                if (!strcmp(arg, format_names[k]))
                    f = k;
            if (f < 0)
                return sd_err("--format %s: unknown (accepted: %s)", arg, FORMAT_LIST);
            o->format = (enum format)f;
        } else if (!strcmp(opt, "--train-on")) {
            if (strcmp(arg, "assistant") && strcmp(arg, "all"))
                return sd_err("--train-on %s: unknown (accepted: assistant, all)", arg);
            o->train_all = !strcmp(arg, "all");
        } else if (!strcmp(opt, "--overflow")) {
            if (strcmp(arg, "drop") && strcmp(arg, "truncate"))
                return sd_err("--overflow %s: unknown (accepted: drop, truncate)", arg);
            o->overflow = !strcmp(arg, "drop") ? OVERFLOW_DROP : OVERFLOW_TRUNCATE;
            overflow_set = true;
        } else if (!strcmp(opt, "--max-len"))
            rc = parse_ll(opt, arg, 1, INT32_MAX, &o->max_len);
        else if (!strcmp(opt, "--pack"))
            rc = parse_ll(opt, arg, 1, INT32_MAX, &o->pack);
        else if (!strcmp(opt, "--pack-fit")) {
            static const char *const fits[] = {"greedy", "best", "best-ordered"};
            int f = -1;
            for (int k = 0; k < 3; k++)
                f = strcmp(arg, fits[k]) ? f : k;
            if (f < 0)
                return sd_err("--pack-fit %s: unknown (accepted: greedy, best, best-ordered)", arg);
            o->pack_fit = (enum pack_fit)f;
            fit_set = true;
        } else if (!strcmp(opt, "--val"))
            rc = parse_ll(opt, arg, 1, INT32_MAX, &o->val);
        else if (!strcmp(opt, "--threads"))
            rc = parse_ll(opt, arg, 1, 1024, &o->threads);
        else
            return sd_err("unknown option '%s' (accepted: --model, --in, --out, --format, --template, --date, "
                          "--train-on, --max-len, --overflow, --pack, --pack-fit, --val, --val-out, --threads)", opt);
        if (rc != 0)
            return -1;
        i++;
    }
    if (!o->model || !o->in || !o->out)
        return sd_err("--model DIR, --in FILE.jsonl and --out FILE.bin are required");
    if (!o->val != !o->val_out)
        return sd_err("--val N and --val-out FILE.bin go together");
    if (o->pack > 0 && o->max_len > o->pack)
        return sd_err("--max-len %lld exceeds --pack %lld: a document must fit one window", o->max_len, o->pack);
    o->max_len_flag = "--max-len";
    if (o->pack > 0 && o->max_len == 0) {
        o->max_len = o->pack;
        o->max_len_flag = "--pack";
    }
    if (overflow_set && !o->max_len)
        return sd_err("--overflow needs --max-len or --pack");
    if (fit_set && !o->pack)
        return sd_err("--pack-fit needs --pack");
    if (o->pack_fit != FIT_GREEDY && o->pack > PACK_BEST_FIT_MAX_WINDOW)
        return sd_err("--pack %lld: --pack-fit best packs windows of at most %d tokens", o->pack,
                      PACK_BEST_FIT_MAX_WINDOW);
    return 0;
}

/* Encodes every line on the worker threads; on failure the message names the first bad line. */
static int encode_all(struct job *j)
{
    j->nbatches = (j->nlines + LINES_PER_BATCH - 1) / LINES_PER_BATCH;
    j->batches = calloc((size_t)j->nbatches + 1, sizeof *j->batches);
    int nthreads = (int)j->opt.threads;
    struct worker *w = calloc((size_t)nthreads, sizeof *w);
    pthread_t *th = calloc((size_t)nthreads, sizeof *th);
    if (!j->batches || !w || !th) {
        free(w);
        free(th);
        return sd_err("out of memory");
    }
    int rc = 0, started = 0;
    for (int t = 0; t < nthreads && rc == 0; t++) {
        w[t].job = j;
        rc = tok_encoder_new(j->tok, &w[t].enc);
        if (rc == 0 && pthread_create(&th[t], NULL, worker_main, &w[t]) != 0)
            rc = sd_err("cannot start a thread");
        started += rc == 0;
    }
    for (int t = 0; t < started; t++)
        pthread_join(th[t], NULL);
    for (int t = 0; t < nthreads; t++) {
        tok_encoder_free(w[t].enc);
        tok_ids_free(&w[t].ids);
        chat_render_free(&w[t].render);
        free(w[t].msgs);
        free(w[t].cuts);
        free(w[t].cuts_norm);
        free(w[t].joined);
        forget_json(&w[t]);
        free(w[t].json);
        free(w[t].calls);
    }
    free(w);
    free(th);
    for (int64_t b = 0; rc == 0 && b < j->nbatches; b++)
        if (j->batches[b].error_line)
            rc = sd_err("%s:%lld: %s", j->opt.in, (long long)j->batches[b].error_line, j->batches[b].error);
    return rc;
}

/* What became of the examples. Lines are 1-based line numbers of the input. */
#define SUMMARY_LINES 8
struct summary {
    int64_t examples, truncated;
    int64_t too_long;           /* dropped by --max-len / --pack (--overflow drop) */
    int64_t no_assistant;       /* conversations without an assistant turn (--train-on assistant) */
    int64_t cut_targets;        /* truncated to no target left (--overflow truncate), dropped */
    int64_t cut_lines[SUMMARY_LINES];
};

/* Whether tokens [0, n) hold a target (a document's first token never is one). */
static bool has_target(const uint8_t *flags, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if ((flags[i] & DATA_FLAG_LOSS) && !(flags[i] & DATA_FLAG_DOC_START))
            return true;
    return false;
}

/* "in.jsonl:3, in.jsonl:7 and 2 more": the input lines of the examples that lost every target. */
static void cut_lines_str(const struct job *j, const struct summary *sum, char *out, size_t len)
{
    size_t at = 0;
    int64_t shown = sum->cut_targets < SUMMARY_LINES ? sum->cut_targets : SUMMARY_LINES;
    out[0] = 0;
    for (int64_t i = 0; i < shown && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%s:%lld", i ? ", " : "", j->opt.in, (long long)sum->cut_lines[i]);
    if (sum->cut_targets > shown && at < len)
        snprintf(out + at, len - at, " and %lld more", (long long)(sum->cut_targets - shown));
}

/* A shard without a target cannot train (the launcher refuses it): why this one has none. */
static int no_target_error(const struct job *j, const struct summary *sum, const char *which)
{
    char why[2048] = "", lines[1024];
    size_t at = 0;
    if (sum->too_long)
        at += (size_t)snprintf(why + at, sizeof why - at, "; %lld example(s) longer than %s %lld dropped",
                               (long long)sum->too_long, j->opt.max_len_flag, j->opt.max_len);
    if (sum->no_assistant && at < sizeof why)
        at += (size_t)snprintf(why + at, sizeof why - at,
                               "; %lld conversation(s) without an assistant turn dropped (--train-on assistant trains "
                               "on assistant turns only, --train-on all on every token)",
                               (long long)sum->no_assistant);
    if (sum->cut_targets && at < sizeof why) {
        cut_lines_str(j, sum, lines, sizeof lines);
        snprintf(why + at, sizeof why - at,
                 "; %lld example(s) lost all their targets to truncation by %s %lld --overflow truncate (%s): raise %s "
                 "or use --overflow drop",
                 (long long)sum->cut_targets, j->opt.max_len_flag, j->opt.max_len, lines, j->opt.max_len_flag);
    }
    return sd_err("%s would have no target, so nothing was written%s", which, why);
}

/* Lays the encoded documents, in input order, into the train shard and (the last --val ones)
 * the validation shard. */
static int assemble(struct job *j, struct shard *train, struct shard *val, struct summary *sum)
{
    int64_t ndocs = 0;
    for (int64_t l = 0; l < j->nlines; l++)
        ndocs += !j->batches[l / LINES_PER_BATCH].blank[l % LINES_PER_BATCH];
    if (ndocs == 0)
        return sd_err("%s: no examples (the dataset is empty)", j->opt.in);
    int64_t kept = 0, doc = 0;
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0 counts the documents that survive --max-len, so the val split takes the last
         * --val of those; pass 1 writes them */
        doc = 0;
        for (int64_t l = 0; l < j->nlines; l++) {
            struct batch *b = &j->batches[l / LINES_PER_BATCH];
            int64_t k = l % LINES_PER_BATCH;
            if (b->blank[k])
                continue;
            if (b->no_assistant[k]) {
                sum->no_assistant += pass;
                continue;
            }
            int64_t start = k ? b->doc_end[k - 1] : 0, n = b->doc_end[k] - start;
            if (j->opt.max_len && n > j->opt.max_len) {
                if (j->opt.overflow == OVERFLOW_DROP) {
                    sum->too_long += pass;
                    continue;
                }
                if (!has_target(b->flags + start, j->opt.max_len)) {
                    if (pass && sum->cut_targets < SUMMARY_LINES)
                        sum->cut_lines[sum->cut_targets] = l + 1;
                    sum->cut_targets += pass;
                    continue;
                }
                sum->truncated += pass;
                n = j->opt.max_len;
            }
            if (pass == 0) {
                kept++;
                continue;
            }
            struct shard *s = doc++ >= kept - j->opt.val ? val : train;
            if (j->opt.pack_fit != FIT_GREEDY ? shard_keep_doc(s, b->tokens + start, b->flags + start, n)
                                              : shard_add_doc(s, b->tokens + start, b->flags + start, n, j->opt.pack,
                                                              (uint32_t)j->pad))
                return -1;
        }
    }
    sum->examples = kept;
    if (kept == 0 && sum->too_long == ndocs)
        return sd_err("%s: every example was dropped by %s %lld", j->opt.in, j->opt.max_len_flag, j->opt.max_len);
    if (kept > 0 && j->opt.val && kept <= j->opt.val)
        return sd_err("--val %lld leaves no training examples (%lld in all)", j->opt.val, (long long)kept);
    bool decreasing = j->opt.pack_fit == FIT_BEST;
    if (j->opt.pack_fit != FIT_GREEDY &&
        (shard_lay_best_fit(train, j->opt.pack, decreasing, (uint32_t)j->pad) != 0 ||
         (j->opt.val && shard_lay_best_fit(val, j->opt.pack, decreasing, (uint32_t)j->pad) != 0)))
        return -1;
    if (train->targets == 0)
        return no_target_error(j, sum, j->opt.out);
    if (j->opt.val && val->targets == 0)
        return no_target_error(j, sum, j->opt.val_out);
    if (shard_finish(train, j->opt.pack, (uint32_t)j->pad) != 0 ||
        (j->opt.val && shard_finish(val, j->opt.pack, (uint32_t)j->pad) != 0))
        return -1;
    return 0;
}

/* ", 3 dropped [1 longer than --pack 8, 2 without an assistant turn]" for the summary line. */
static void print_dropped(const struct job *j, const struct summary *sum)
{
    int64_t dropped = sum->too_long + sum->no_assistant + sum->cut_targets;
    printf(", %lld dropped", (long long)dropped);
    if (dropped == 0)
        return;
    const char *sep = " [";
    if (sum->too_long) {
        printf("%s%lld longer than %s %lld", sep, (long long)sum->too_long, j->opt.max_len_flag, j->opt.max_len);
        sep = ", ";
    }
    if (sum->no_assistant) {
        printf("%s%lld without an assistant turn", sep, (long long)sum->no_assistant);
        sep = ", ";
    }
    if (sum->cut_targets)
        printf("%s%lld with no target left after truncation", sep, (long long)sum->cut_targets);
    printf("]");
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int tokenize_main(int argc, char **argv)
{
    if (argc >= 1 && (!strcmp(argv[0], "-h") || !strcmp(argv[0], "--help"))) {
        tokenize_usage(stdout);
        return 0;
    }
    struct job j = {0};
    struct shard train = {0}, val = {0};
    struct summary sum = {0};
    size_t len = 0;
    int rc = parse_options(argc, argv, &j.opt);
    if (rc == 0)
        rc = (j.text = read_all(j.opt.in, &len)) ? 0 : -1;
    if (rc == 0)
        rc = split_lines(&j, len);
    if (rc == 0 && j.opt.format == FMT_AUTO)
        rc = detect_format(&j);
    if (rc == 0)
        rc = load_model_dir(&j);
    double t0 = now_s();
    if (rc == 0)
        rc = encode_all(&j);
    double seconds = now_s() - t0;
    if (rc == 0)
        rc = assemble(&j, &train, &val, &sum);
    if (rc == 0)
        rc = data_write_sft(j.opt.out, train.tokens, train.flags, train.n);
    if (rc == 0 && j.opt.val && data_write_sft(j.opt.val_out, val.tokens, val.flags, val.n) != 0) {
        unlink(j.opt.out);
        rc = -1;
    }
    int exit_code = 0;
    if (rc != 0) {
        fprintf(stderr, "slidedp-data tokenize: %s\n", sd_errmsg());
        exit_code = 2;
    } else {
        int64_t tokens = 0;
        for (int64_t b = 0; b < j.nbatches; b++)
            tokens += (int64_t)j.batches[b].n;
        printf("slidedp-data tokenize: %lld examples (%s", (long long)sum.examples, format_names[j.opt.format]);
        if (j.have_tpl)
            printf(", template %s (%s)", chat_family_names[j.tpl.family], j.tpl.origin);
        print_dropped(&j, &sum);
        printf(", %lld truncated): %s %lld tokens, %lld targets", (long long)sum.truncated, j.opt.out,
               (long long)train.n, (long long)train.targets);
        if (j.opt.pack)
            printf(" (padding %.2f%%)", 100.0 * (double)train.padding / (double)train.n);
        if (j.opt.val)
            printf("; %s %lld tokens, %lld targets", j.opt.val_out, (long long)val.n, (long long)val.targets);
        printf("; %.0f tokens/s on %lld threads\n", seconds > 0 ? tokens / seconds : 0.0, j.opt.threads);
        int64_t quoted = 0, quoted_line = 0;
        for (int64_t b = 0; b < j.nbatches; b++) {
            if (!quoted_line)
                quoted_line = j.batches[b].quoted_args_line;
            quoted += j.batches[b].quoted_args;
        }
        if (quoted)
            fprintf(stderr, "slidedp-data tokenize: note: %lld tool call(s) (the first in %s:%lld) give their arguments "
                            "as a string, which the %s template writes as a JSON string, quoted, as transformers "
                            "does; give them as an object to train on them as JSON\n",
                    (long long)quoted, j.opt.in, (long long)quoted_line, chat_family_names[j.tpl.family]);
        if (sum.cut_targets) {
            char lines[1024];
            cut_lines_str(&j, &sum, lines, sizeof lines);
            fprintf(stderr, "slidedp-data tokenize: %lld example(s) lost all their targets to truncation by %s %lld "
                            "and were dropped: %s\n",
                    (long long)sum.cut_targets, j.opt.max_len_flag, j.opt.max_len, lines);
        }
    }
    for (int64_t b = 0; j.batches && b < j.nbatches; b++) {
        free(j.batches[b].tokens);
        free(j.batches[b].flags);
        free(j.batches[b].doc_end);
        free(j.batches[b].blank);
        free(j.batches[b].no_assistant);
    }
    free(j.batches);
    free(j.lines);
    free((void *)j.text);
    struct shard *shards[] = {&train, &val};
    for (int k = 0; k < 2; k++) {
        free(shards[k]->tokens);
        free(shards[k]->flags);
        free(shards[k]->doc_tokens);
        free(shards[k]->doc_flags);
        free(shards[k]->doc_len);
    }
    tokenizer_free(j.tok);
    return exit_code;
}
