/* Hand-written renderers of the known chat templates (see chat_template.h). Each follows its
 * Jinja source statement by statement, the Qwen and Llama 3.1 ones with their tool definitions,
 * calls and tool turns (the first Llama 3 templates have none); Jinja's `trim` and Python's
 * str.strip family are reproduced with Python's notion of whitespace. */
#include "chat_template.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/err.h"
#include "ingest/tokenizer.h"

const char *const chat_family_names[CHAT_FAMILIES] = {"qwen2.5", "qwen3", "llama3", "llama3.1"};

static const char QWEN25_DEFAULT_SYSTEM[] = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
static const char LLAMA_BOS[] = "<|begin_of_text|>";
/* The date the Llama 3.1 template uses when the caller gives none and has no strftime_now. */
static const char LLAMA31_DEFAULT_DATE[] = "26 Jul 2024";

/* FNV-1a 64 of the exact template text, as released in each tokenizer_config.json. */
struct fingerprint {
    uint64_t hash;
    size_t len;
    enum chat_family family;
    int always_generation_header;
    int uses_strftime;  /* the template dates itself with strftime_now (transformers passes today) */
    const char *release;
};

static const struct fingerprint known[] = {
    {0xc2b27ee60f1b8775ull, 2507, CHAT_QWEN25, 0, 0, "Qwen2.5 Instruct"},
    {0x2bfdb7aa9754484eull, 4116, CHAT_QWEN3, 0, 0, "Qwen3"},
    {0x74891e390e614ae2ull, 348, CHAT_LLAMA3, 1, 0, "Llama 3 (first release)"},
    {0x0e60067a5537498eull, 389, CHAT_LLAMA3, 0, 0, "Llama 3 Instruct"},
    {0x0ac29b9538e2befaull, 3827, CHAT_LLAMA31, 0, 1, "Llama 3.1/3.2 Instruct (strftime_now date)"},
};

static uint64_t fnv1a64(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static void set_date(struct chat_template *t, bool today)
{
    if (!today) {
        snprintf(t->date, sizeof t->date, "%s", LLAMA31_DEFAULT_DATE);
        return;
    }
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(t->date, sizeof t->date, "%d %b %Y", &tm);
}

int chat_template_detect(const char *text, struct chat_template *out)
{
    size_t n = strlen(text);
    uint64_t h = fnv1a64(text, n);
    for (size_t i = 0; i < sizeof known / sizeof *known; i++)
        if (known[i].hash == h && known[i].len == n) {
            memset(out, 0, sizeof *out);
            out->family = known[i].family;
            out->always_generation_header = known[i].always_generation_header;
            out->bos_token = LLAMA_BOS;
            set_date(out, known[i].uses_strftime);
            out->origin = known[i].release;
            return 0;
        }
    return sd_err("chat_template is not one of the known templates (%s); name the family with --template",
                  CHAT_FAMILY_LIST);
}

int chat_template_named(const char *name, struct chat_template *out)
{
    for (int f = 0; f < CHAT_FAMILIES; f++)
        if (!strcmp(name, chat_family_names[f])) {
            memset(out, 0, sizeof *out);
            out->family = (enum chat_family)f;
            out->bos_token = LLAMA_BOS;
            set_date(out, false); /* Llama 3.1's own template: its fixed default date */
            out->origin = "--template";
            return 0;
        }
    return sd_err("--template %s: unknown (accepted: auto, %s)", name, CHAT_FAMILY_LIST);
}

int chat_template_special_tokens(const struct chat_template *t, const char *const **tokens)
{
    static const char *const qwen[] = {"<|im_start|>", "<|im_end|>", "<think>", "</think>"};
    static const char *const llama[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
    bool is_qwen = t->family == CHAT_QWEN25 || t->family == CHAT_QWEN3;
    *tokens = is_qwen ? qwen : llama;
    return t->family == CHAT_QWEN25 ? 2 : 4; /* Qwen2.5 writes no think blocks */
}

/* ---- output buffer ------------------------------------------------------------------------ */

static int put_n(struct chat_render *r, const char *s, size_t n)
{
    return tok_append(&r->text, &r->len, &r->cap, s, n);
}

static int put(struct chat_render *r, const char *s)
{
    return put_n(r, s, strlen(s));
}

static int span(struct chat_render *r, size_t start)
{
    if (r->nspans == r->spans_cap) {
        int cap = r->spans_cap ? r->spans_cap * 2 : 16;
        void *s = realloc(r->spans, (size_t)cap * sizeof *r->spans);
        if (!s)
            return sd_err("out of memory rendering a conversation");
        r->spans = s;
        r->spans_cap = cap;
    }
    r->spans[r->nspans][0] = start;
    r->spans[r->nspans][1] = r->len;
    r->nspans++;
    return 0;
}

void chat_render_reset(struct chat_render *r)
{
    r->len = 0;
    r->nspans = 0;
    if (r->text)
        r->text[0] = 0;
}

void chat_render_free(struct chat_render *r)
{
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}

/* ---- Python string helpers ---------------------------------------------------------------- */

/* The length of the UTF-8 whitespace character (Python's str.isspace) at s[0..n), or 0. */
static size_t space_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (n >= 1 && ((u[0] >= 0x09 && u[0] <= 0x0d) || (u[0] >= 0x1c && u[0] <= 0x20)))
        return 1;
    if (n >= 2 && u[0] == 0xc2 && (u[1] == 0x85 || u[1] == 0xa0))
        return 2;
    if (n >= 3 && u[0] == 0xe1 && u[1] == 0x9a && u[2] == 0x80) /* U+1680 */
        return 3;
    if (n >= 3 && u[0] == 0xe2 && u[1] == 0x80 &&
        (u[2] <= 0x8a || u[2] == 0xa8 || u[2] == 0xa9 || u[2] == 0xaf)) /* U+2000-200A, 2028, 2029, 202F */
        return 3;
    if (n >= 3 && u[0] == 0xe2 && u[1] == 0x81 && u[2] == 0x9f) /* U+205F */
        return 3;
    if (n >= 3 && u[0] == 0xe3 && u[1] == 0x80 && u[2] == 0x80) /* U+3000 */
        return 3;
    return 0;
}

/* Jinja's trim (Python str.strip()): the [*start, *end) of s without surrounding whitespace. */
static void py_strip(const char *s, size_t *start, size_t *end)
{
    size_t a = 0, b = strlen(s), k;
    while (a < b && (k = space_at(s + a, b - a)) > 0)
        a += k;
    /* from the end: step back over UTF-8 continuation bytes to each character's start */
    while (b > a) {
        size_t c = b - 1;
        while (c > a && ((unsigned char)s[c] & 0xc0) == 0x80)
            c--;
        if (space_at(s + c, b - c) != b - c)
            break;
        b = c;
    }
    *start = a;
    *end = b;
}

static int put_trimmed(struct chat_render *r, const char *s)
{
    size_t a, b;
    py_strip(s, &a, &b);
    return put_n(r, s + a, b - a);
}

/* [a, b) of s[a0..b0) without leading / trailing '\n' (Python .lstrip('\n') / .rstrip('\n')). */
static void strip_newlines(const char *s, size_t *a, size_t *b, bool left, bool right)
{
    while (left && *a < *b && s[*a] == '\n')
        (*a)++;
    while (right && *b > *a && s[*b - 1] == '\n')
        (*b)--;
}

static const char *find_last(const char *s, const char *needle)
{
    const char *last = NULL;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        last = p;
    return last;
}

static bool has_prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

static bool has_suffix(const char *s, const char *p)
{
    size_t n = strlen(s), m = strlen(p);
    return n >= m && memcmp(s + n - m, p, m) == 0;
}

int chat_template_has_tools(const struct chat_template *t)
{
    return t->family == CHAT_QWEN25 || t->family == CHAT_QWEN3 || t->family == CHAT_LLAMA31;
}

static int check_roles(const struct chat_template *t, const struct chat_message *msgs, int n,
                       const struct chat_tools *tools)
{
    bool with_tools = chat_template_has_tools(t);
    if (!with_tools && tools && tools->n > 0)
        return sd_err("tools: the %s template does not render tool definitions (tools are supported with "
                      "the qwen3, qwen2.5 and llama3.1 templates)", chat_family_names[t->family]);
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        bool tool_role = with_tools && (!strcmp(role, "tool") || (t->family == CHAT_LLAMA31 && !strcmp(role, "ipython")));
        if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && !tool_role)
            return sd_err("message %d: role '%s' is not supported (accepted: system, user, assistant%s)", i, role,
                          t->family == CHAT_LLAMA31 ? ", tool, ipython" : with_tools ? ", tool" : "");
        if (msgs[i].ntool_calls > 0 && (!with_tools || strcmp(role, "assistant")))
            return sd_err("message %d: tool_calls %s", i,
                          with_tools ? "belong to assistant turns"
                                     : "are not rendered by this template (supported with qwen3, qwen2.5 and llama3.1)");
    }
    return 0;
}

/* ---- Qwen --------------------------------------------------------------------------------- */

static const char QWEN_TOOLS_HEAD[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char QWEN_TOOLS_TAIL[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

/* The tool definitions' block of the system turn: each tool's JSON on a line of its own. */
static int qwen_tools_block(struct chat_render *r, const struct chat_tools *tools)
{
    int rc = put(r, QWEN_TOOLS_HEAD);
    for (int k = 0; k < tools->n; k++)
        rc |= put(r, "\n") | put(r, tools->json[k]);
    return rc | put(r, QWEN_TOOLS_TAIL);
}

/* One call: <tool_call>, the name and the arguments (Qwen3 writes string arguments as they are,
 * Qwen2.5 always as JSON), </tool_call>. */
static int qwen_tool_call(struct chat_render *r, const struct chat_tool_call *c, bool raw_string_arguments)
{
    const char *args = raw_string_arguments && c->arguments ? c->arguments : c->arguments_json;
    return put(r, "<tool_call>\n{\"name\": \"") | put(r, c->name) | put(r, "\", \"arguments\": ") | put(r, args) |
           put(r, "}\n</tool_call>");
}

/* A tool turn: consecutive ones share one user turn of <tool_response> blocks. */
static int qwen_tool_turn(struct chat_render *r, const struct chat_message *m, int n, int i)
{
    int rc = 0;
    if (i == 0 || strcmp(m[i - 1].role, "tool"))
        rc |= put(r, "<|im_start|>user");
    rc |= put(r, "\n<tool_response>\n") | put(r, m[i].content) | put(r, "\n</tool_response>");
    if (i == n - 1 || strcmp(m[i + 1].role, "tool"))
        rc |= put(r, "<|im_end|>\n");
    return rc;
}

static int render_qwen25(const struct chat_message *m, int n, const struct chat_tools *tools, struct chat_render *r)
{
    int rc = put(r, "<|im_start|>system\n");
    rc |= put(r, n > 0 && !strcmp(m[0].role, "system") ? m[0].content : QWEN25_DEFAULT_SYSTEM);
    rc |= tools ? put(r, "\n\n") | qwen_tools_block(r, tools) : put(r, "<|im_end|>\n");
    for (int i = 0; i < n && rc == 0; i++) {
        if (!strcmp(m[i].role, "system") && i == 0)
            continue;
        if (!strcmp(m[i].role, "tool")) {
            rc |= qwen_tool_turn(r, m, n, i);
            continue;
        }
        rc |= put(r, "<|im_start|>") | put(r, m[i].role) | put(r, "\n");
        size_t start = r->len;
        rc |= put(r, m[i].content);
        for (int k = 0; k < m[i].ntool_calls; k++)
            rc |= (k > 0 || m[i].content[0] ? put(r, "\n") : 0) | qwen_tool_call(r, &m[i].tool_calls[k], false);
        rc |= put(r, "<|im_end|>");
        if (!strcmp(m[i].role, "assistant"))
            rc |= span(r, start);
        rc |= put(r, "\n");
    }
    return rc ? -1 : 0;
}

/* Qwen3: reasoning kept only on assistant turns after the last real user query; the last turn
 * always gets a think block. */
static int render_qwen3(const struct chat_message *m, int n, const struct chat_tools *tools, struct chat_render *r)
{
    int rc = 0;
    bool system = n > 0 && !strcmp(m[0].role, "system");
    if (tools)
        rc |= put(r, "<|im_start|>system\n") | (system ? put(r, m[0].content) | put(r, "\n\n") : 0) |
              qwen_tools_block(r, tools);
    else if (system)
        rc |= put(r, "<|im_start|>system\n") | put(r, m[0].content) | put(r, "<|im_end|>\n");
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(m[i].role, "user") &&
            !(has_prefix(m[i].content, "<tool_response>") && has_suffix(m[i].content, "</tool_response>"))) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n && rc == 0; i++) {
        const char *c = m[i].content;
        if (!strcmp(m[i].role, "user") || (!strcmp(m[i].role, "system") && i > 0)) {
            rc |= put(r, "<|im_start|>") | put(r, m[i].role) | put(r, "\n") | put(r, c) | put(r, "<|im_end|>\n");
            continue;
        }
        if (!strcmp(m[i].role, "tool")) {
            rc |= qwen_tool_turn(r, m, n, i);
            continue;
        }
        if (strcmp(m[i].role, "assistant") != 0)
            continue;
        /* content and reasoning as [start, end) ranges of their source strings */
        const char *content = c, *reasoning = "";
        size_t ca = 0, cb = strlen(c), ra = 0, rb = 0;
        if (m[i].reasoning) {
            reasoning = m[i].reasoning;
            rb = strlen(reasoning);
        } else if (strstr(c, "</think>")) {
            ca = (size_t)(find_last(c, "</think>") - c) + strlen("</think>");
            strip_newlines(c, &ca, &cb, true, false);
            reasoning = c;
            rb = (size_t)(strstr(c, "</think>") - c);
            strip_newlines(c, &ra, &rb, false, true);
            const char *open = NULL;
            for (const char *p = strstr(c, "<think>"); p && (size_t)(p - c) < rb; p = strstr(p + 1, "<think>"))
                if ((size_t)(p - c) + strlen("<think>") <= rb)
                    open = p;
            if (open)
                ra = (size_t)(open - c) + strlen("<think>");
            strip_newlines(c, &ra, &rb, true, false);
        }
        bool has_content = cb > ca; /* the template's `content`, before the think block's lstrip */
        rc |= put(r, "<|im_start|>assistant\n");
        size_t start = r->len;
        if (i > last_query && (i == n - 1 || rb > ra)) {
            strip_newlines(reasoning, &ra, &rb, true, true);
            strip_newlines(content, &ca, &cb, true, false);
            rc |= put(r, "<think>\n") | put_n(r, reasoning + ra, rb - ra) | put(r, "\n</think>\n\n");
        }
        rc |= put_n(r, content + ca, cb - ca);
        for (int k = 0; k < m[i].ntool_calls; k++)
            rc |= (k > 0 || has_content ? put(r, "\n") : 0) | qwen_tool_call(r, &m[i].tool_calls[k], true);
        rc |= put(r, "<|im_end|>") | span(r, start) | put(r, "\n");
    }
    return rc ? -1 : 0;
}

/* ---- Llama -------------------------------------------------------------------------------- */

static int llama_turn(struct chat_render *r, const struct chat_message *m)
{
    int rc = put(r, "<|start_header_id|>") | put(r, m->role) | put(r, "<|end_header_id|>\n\n");
    size_t start = r->len;
    rc |= put_trimmed(r, m->content) | put(r, "<|eot_id|>");
    if (!strcmp(m->role, "assistant"))
        rc |= span(r, start);
    return rc ? -1 : 0;
}

static int render_llama3(const struct chat_template *t, const struct chat_message *m, int n, struct chat_render *r)
{
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++)
        rc |= (i == 0 ? put(r, t->bos_token) : 0) | llama_turn(r, &m[i]);
    if (t->always_generation_header)
        rc |= put(r, "<|start_header_id|>assistant<|end_header_id|>\n\n");
    return rc ? -1 : 0;
}

static const char LLAMA31_TOOLS_HEAD[] =
    "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON for a "
    "function call with its proper arguments that best answers the given prompt.\n\nRespond in the format "
    "{\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n";

/* Llama 3.1/3.2 with transformers' defaults: the tool definitions (if a tools list is given) in the
 * first user turn; a tool call as a turn of JSON alone; tool results as ipython turns. */
static int render_llama31(const struct chat_template *t, const struct chat_message *m, int n,
                          const struct chat_tools *tools, struct chat_render *r)
{
    int rc = put(r, t->bos_token) | put(r, "<|start_header_id|>system<|end_header_id|>\n\n") |
             (tools ? put(r, "Environment: ipython\n") : 0) | put(r, "Cutting Knowledge Date: December 2023\n") |
             put(r, "Today Date: ") | put(r, t->date) | put(r, "\n\n");
    int first = 0;
    if (n > 0 && !strcmp(m[0].role, "system")) {
        rc |= put_trimmed(r, m[0].content);
        first = 1;
    }
    rc |= put(r, "<|eot_id|>");
    if (tools) {
        /* the template takes the first message after the system one as the user's, whatever it is */
        if (first == n || strcmp(m[first].role, "user"))
            return sd_err("message %d: with tools the llama3.1 template writes them into the first user turn, "
                          "so the conversation must begin (after the system message) with a user turn", first);
        rc |= put(r, LLAMA31_TOOLS_HEAD);
        for (int k = 0; k < tools->n; k++)
            rc |= put(r, tools->json[k]) | put(r, "\n\n");
        rc |= put_trimmed(r, m[first].content) | put(r, "<|eot_id|>");
        first++;
    }
    for (int i = first; i < n && rc == 0; i++) {
        if (!strcmp(m[i].role, "tool") || !strcmp(m[i].role, "ipython")) {
            rc |= put(r, "<|start_header_id|>ipython<|end_header_id|>\n\n") | put(r, m[i].content) |
                  put(r, "<|eot_id|>");
        } else if (m[i].ntool_calls > 0) {
            const struct chat_tool_call *c = &m[i].tool_calls[0];
            rc |= put(r, "<|start_header_id|>assistant<|end_header_id|>\n\n");
            size_t start = r->len;
            rc |= put(r, "{\"name\": \"") | put(r, c->name) | put(r, "\", \"parameters\": ") | put(r, c->arguments_json) |
                  put(r, "}<|eot_id|>") | span(r, start);
        } else {
            rc |= llama_turn(r, &m[i]);
        }
    }
    return rc ? -1 : 0;
}

int chat_render(const struct chat_template *t, const struct chat_message *msgs, int n, const struct chat_tools *tools,
                struct chat_render *out)
{
    if (check_roles(t, msgs, n, tools) != 0)
        return -1;
    /* Qwen's `{% if tools %}`: an empty list is none; Llama 3.1's `tools is not none` takes it */
    const struct chat_tools *qwen_tools = tools && tools->n > 0 ? tools : NULL;
    switch (t->family) {
    case CHAT_QWEN25: return render_qwen25(msgs, n, qwen_tools, out);
    case CHAT_QWEN3: return render_qwen3(msgs, n, qwen_tools, out);
    case CHAT_LLAMA3: return render_llama3(t, msgs, n, out);
    case CHAT_LLAMA31: return render_llama31(t, msgs, n, tools, out);
    default: return sd_err("unknown chat family %d", (int)t->family);
    }
}
