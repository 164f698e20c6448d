/* JSON written as Python writes it: json.dumps(json.loads(text), ensure_ascii=False), which is what
 * transformers' `tojson` filter gives the chat templates (ingest/chat_template.h) for tool
 * definitions and tool-call arguments. Works on cJSON trees whose numbers keep their source text. */
#ifndef SD_PYJSON_H
#define SD_PYJSON_H

#include <stddef.h>

#include <cjson/cJSON.h>

/* Stores in each number node of `root` its source lexeme (as in the text: "1.0", "-0", "1E5") in
 * node->valuestring, malloc'd (cJSON_Delete frees it; an earlier one is replaced). root must be
 * what cJSON parsed from exactly `text` (`len` bytes, no trailing text): numbers are found by
 * scanning the text outside strings in document order, which is cJSON's child order, and each
 * must read back as its node's value. -1 with sd_err when the numbers of the text and the tree
 * disagree in count or value, or when a string holds \u0000 (cJSON's strings end at their first
 * NUL, so such a string cannot be written back). */
int pyjson_keep_number_lexemes(cJSON *root, const char *text, size_t len);

/* 0, or -1 with sd_err when a string of the JSON text holds \u0000: cJSON's strings end at their
 * first NUL, so the rest of such a string would be lost without a word. */
int pyjson_check_nul(const char *text, size_t len);

/* json.dumps(json.loads(source of item), ensure_ascii=False): separators ", " and ": ", keys in
 * input order, a repeated key at its first place with its last value, integers with their exact
 * digits, floats as Python's repr, non-ASCII written as is. Returns a NUL-terminated malloc'd
 * string, or NULL with sd_err: a number without its lexeme (pyjson_keep_number_lexemes), a string
 * or key that is not valid UTF-8 (overlong, a surrogate, past U+10FFFF), out of memory. */
char *pyjson_dumps(const cJSON *item);
/* The same with json.dumps's indent (> 0): each item on a line of its own, indented by `indent`
 * spaces a level, "," at the ends of lines (Llama 3.1's `tojson(indent=4)`); 0 is pyjson_dumps. */
char *pyjson_dumps_indent(const cJSON *item, int indent);

#endif
