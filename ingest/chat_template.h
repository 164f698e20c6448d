/* Chat templates of the Qwen2.5, Qwen3 and Llama 3.x families, rendered exactly as transformers'
 * apply_chat_template(messages, tokenize=False) renders the templates those models ship, by
 * hand-written renderers (no Jinja engine); the template text in tokenizer_config.json is
 * recognised by exact fingerprints. Each render also records the byte spans a model is trained
 * on: every assistant turn's content (with its tool calls) through its end-of-turn token. Used by
 * `slidedp-data tokenize`. */
#ifndef SD_CHAT_TEMPLATE_H
#define SD_CHAT_TEMPLATE_H

#include <stddef.h>

enum chat_family { CHAT_QWEN25, CHAT_QWEN3, CHAT_LLAMA3, CHAT_LLAMA31, CHAT_FAMILIES };

struct chat_template {
    enum chat_family family;
    int always_generation_header; /* the first Llama 3 release appends the assistant header always */
    const char *bos_token;        /* Llama: the text of the BOS token */
    char date[32];                /* Llama 3.1: "Today Date" */
    const char *origin;           /* how it was chosen, for the summary: the release it was recognised
                                     as in tokenizer_config.json, or --template */
};

/* One call of an assistant turn's tool_calls, with its JSON already written as the templates'
 * `tojson` filter writes it (Python's json.dumps, ingest/pyjson.h). */
struct chat_tool_call {
    const char *name;
    const char *arguments;        /* the arguments when they are a string (Qwen3 writes it as is), else NULL */
    const char *arguments_json;   /* `arguments | tojson`, a string's or not */
};

struct chat_message {
    const char *role;             /* system, user, assistant, tool (Qwen, Llama 3.1) or ipython (Llama 3.1) */
    const char *content;
    const char *reasoning;        /* Qwen3 reasoning_content, or NULL */
    const struct chat_tool_call *tool_calls; /* an assistant turn's calls, or NULL */
    int ntool_calls;
};

/* The conversation's tool definitions, each as the template's `tool | tojson` writes it (Llama 3.1:
 * indent=4). Given with none, Llama 3.1 still writes its tools block (its `tools is not none`). */
struct chat_tools {
    const char *const *json;
    int n;
};

struct chat_render {
    char *text;
    size_t len, cap;
    size_t (*spans)[2];           /* [start, end) byte ranges of the trained-on text */
    int nspans, spans_cap;
};

/* Names accepted by --template, in enum order, and the list for messages. */
extern const char *const chat_family_names[CHAT_FAMILIES];
#define CHAT_FAMILY_LIST "qwen2.5, qwen3, llama3, llama3.1"

/* Recognises a tokenizer_config.json chat_template; -1 (with a message listing the known
 * families) when it is none of the known templates. */
int chat_template_detect(const char *template_text, struct chat_template *out);
/* The family named on the command line (the variant of its current release), or -1. */
int chat_template_named(const char *name, struct chat_template *out);

/* The special tokens the family's renders write, which the tokenizer must have as added tokens (else
 * they would be encoded as plain text); returns how many. */
int chat_template_special_tokens(const struct chat_template *tpl, const char *const **tokens);

/* Whether the family's template renders tool definitions, tool calls and tool turns. */
int chat_template_has_tools(const struct chat_template *tpl);

/* Renders the conversation (appending to out, which starts empty) with its tool definitions (NULL:
 * no tools list). Fails on roles and tool data the family does not accept. */
int chat_render(const struct chat_template *tpl, const struct chat_message *msgs, int n,
                const struct chat_tools *tools, struct chat_render *out);
void chat_render_reset(struct chat_render *r);
void chat_render_free(struct chat_render *r);

#endif
