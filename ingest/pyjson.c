/* Python's json.dumps over cJSON trees (see pyjson.h): number lexemes recovered from the source
 * text, and floats written as CPython's repr (the shortest digits that read back, David Gay's
 * mode 0), found here with printf and strtod. */
#include "pyjson.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "ingest/tokenizer.h"

/* ---- number lexemes ----------------------------------------------------------------------- */

struct scan {
    const char *text;
    size_t len, pos;
};

static bool number_char(char c)
{
    return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

/* The next number of the text at or after s->pos, outside strings: 1 with its start and length,
 * 0 at the end of the text, -1 (sd_err) for a string holding \u0000. */
static int next_number(struct scan *s, size_t *start, size_t *n)
{
    while (s->pos < s->len) {
        char c = s->text[s->pos];
        if (c == '"') {
            for (s->pos++; s->pos < s->len && s->text[s->pos] != '"'; s->pos++)
                if (s->text[s->pos] == '\\') {
                    if (s->len - s->pos >= 6 && !memcmp(s->text + s->pos + 1, "u0000", 5))
                        return sd_err("a JSON string holds \\u0000 (NUL), which would cut the string there: remove it");
                    s->pos++;
                }
            s->pos++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            *start = s->pos;
            while (s->pos < s->len && number_char(s->text[s->pos]))
                s->pos++;
            *n = s->pos - *start;
            return 1;
        } else {
            s->pos++;
        }
    }
    return 0;
}

static int keep_lexemes(cJSON *item, struct scan *s)
{
    for (; item; item = item->next) {
        if (cJSON_IsNumber(item)) {
            size_t start, n;
            int r = next_number(s, &start, &n);
            if (r < 0)
                return -1;
            if (!r)
                return sd_err("the JSON text has fewer numbers than its tree");
            char *lex = strndup(s->text + start, n), *end;
            if (!lex)
                return sd_err("out of memory keeping JSON numbers");
            double v = strtod(lex, &end);
            if (*end || !(v == item->valuedouble)) {
                sd_err("the JSON text's number %s is not its tree's %.17g", lex, item->valuedouble);
                free(lex);
                return -1;
            }
            free(item->valuestring);
            item->valuestring = lex;
        }
        if (keep_lexemes(item->child, s) < 0)
            return -1;
    }
    return 0;
}

int pyjson_keep_number_lexemes(cJSON *root, const char *text, size_t len)
{
    struct scan s = {text, len, 0};
    size_t start, n;
    if (keep_lexemes(root, &s) < 0)
        return -1;
    int r = next_number(&s, &start, &n);
    return r < 0 ? -1 : r ? sd_err("the JSON text has more numbers than its tree") : 0;
}

int pyjson_check_nul(const char *text, size_t len)
{
    static const char nul[] = "\\u0000";
    if (!memmem(text, len, nul, sizeof nul - 1)) /* the common case: no scan */
        return 0;
    struct scan s = {text, len, 0};
    size_t start, n;
    int r;
    while ((r = next_number(&s, &start, &n)) > 0)
        ;
    return r;
}

/* ---- output ------------------------------------------------------------------------------- */

struct buf {
    char *s;
    size_t len, cap;
};

static int put_n(struct buf *b, const char *s, size_t n)
{
    return tok_append(&b->s, &b->len, &b->cap, s, n);
}

static int put(struct buf *b, const char *s)
{
    return put_n(b, s, strlen(s));
}

/* The length of the UTF-8 sequence of one scalar value at s (not overlong, not a surrogate, at
 * most U+10FFFF), else 0. */
static size_t utf8_len(const unsigned char *s)
{
    if (s[0] < 0x80)
        return 1;
    size_t n = s[0] >= 0xf0 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 ? 2 : 0;
    if (!n || s[0] > 0xf4)
        return 0;
    uint32_t cp = s[0] & (0x7fu >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return n;
}

/* A string as json.dumps(ensure_ascii=False) writes it: only '"', '\\' and control characters
 * escaped. */
static int put_string(struct buf *b, const char *str)
{
    const unsigned char *p = (const unsigned char *)str, *run = p;
    if (put(b, "\"") < 0)
        return -1;
    while (*p) {
        char u[8];
        const char *esc = *p == '"' ? "\\\"" : *p == '\\' ? "\\\\" : *p == '\n' ? "\\n" : *p == '\r' ? "\\r"
                        : *p == '\t' ? "\\t" : *p == '\b' ? "\\b" : *p == '\f' ? "\\f" : NULL;
        if (!esc && *p < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", *p);
            esc = u;
        }
        size_t n = esc ? 1 : utf8_len(p);
        if (!n)
            return sd_err("a JSON string is not valid UTF-8");
        if (esc && (put_n(b, (const char *)run, (size_t)(p - run)) < 0 || put(b, esc) < 0))
            return -1;
        p += n;
        if (esc)
            run = p;
    }
    return put_n(b, (const char *)run, (size_t)(p - run)) < 0 ? -1 : put(b, "\"");
}

/* Python's int(lexeme): the digits without leading zeros, and no sign on zero. */
static int put_int(struct buf *b, const char *lex)
{
    bool neg = *lex == '-';
    lex += neg;
    while (lex[0] == '0' && lex[1])
        lex++;
    return (neg && strcmp(lex, "0") && put(b, "-") < 0) ? -1 : put(b, lex);
}

/* Whether 0.DIGITS x 10^decpt reads back as x. */
static bool reads_back(const char *digits, int decpt, double x)
{
    char s[48];
    snprintf(s, sizeof s, "0.%se%d", digits, decpt);
    return strtod(s, NULL) == x;
}

/* Moves the n digits (of value 0.DIGITS x 10^decpt) one unit in the last place up or down to the
 * neighbouring number of n significant digits: 999 up is 100 one place higher, 100 down is 999
 * one place lower. */
static void step_digits(char *d, int n, int *decpt, bool up)
{
    int i = n - 1;
    if (up) {
        while (i >= 0 && d[i] == '9')
            d[i--] = '0';
        if (i < 0) {
            d[0] = '1';
            (*decpt)++;
        } else {
            d[i]++;
        }
    } else {
        while (d[i] == '0')
            d[i--] = '9';
        d[i]--;
        if (d[0] == '0') {
            memmove(d, d + 1, (size_t)n - 1);
            d[n - 1] = '9';
            (*decpt)--;
        }
    }
}

/* The shortest digits (no trailing zeros) that read back as x > 0, finite, and of those the
 * nearest to x (ties to even, as printf rounds), with x = 0.DIGITS x 10^decpt. Of each length
 * only the two neighbours of x can read back; printf gives the nearer, and the farther one counts
 * where x's rounding interval is wider on its side (x a power of two). */
static void shortest_digits(double x, char digits[20], int *decpt)
{
    for (int p = 0;; p++) {
        char s[40];
        snprintf(s, sizeof s, "%.*e", p, x); /* d.ddde+XX */
        digits[0] = s[0];
        memcpy(digits + 1, s + 2, (size_t)p);
        digits[p + 1] = 0;
        *decpt = atoi(strchr(s, 'e') + 1) + 1;
        if (p == 16 || reads_back(digits, *decpt, x)) /* 17 digits always read back */
            return;
        char other[20];
        int other_decpt = *decpt;
        memcpy(other, digits, (size_t)p + 2);
        step_digits(other, p + 1, &other_decpt, strtod(s, NULL) < x);
        if (reads_back(other, other_decpt, x)) {
            memcpy(digits, other, (size_t)p + 2);
            *decpt = other_decpt;
            return;
        }
    }
}

/* repr(float(lexeme)) as CPython writes it (and json.dumps's Infinity for an overflow). */
static int put_float(struct buf *b, const char *lex)
{
    double x = strtod(lex, NULL);
    if (isinf(x))
        return put(b, x < 0 ? "-Infinity" : "Infinity");
    if (x == 0)
        return put(b, signbit(x) ? "-0.0" : "0.0");
    char digits[20], out[40], *o = out;
    int decpt, n;
    shortest_digits(fabs(x), digits, &decpt);
    n = (int)strlen(digits);
    if (x < 0)
        *o++ = '-';
    if (decpt <= -4 || decpt > 16)
        snprintf(o, sizeof out - 1, "%c%s%se%+03d", digits[0], n > 1 ? "." : "", digits + 1, decpt - 1);
    else if (decpt <= 0)
        snprintf(o, sizeof out - 1, "0.%.*s%s", -decpt, "000", digits);
    else if (decpt < n)
        snprintf(o, sizeof out - 1, "%.*s.%s", decpt, digits, digits + decpt);
    else
        snprintf(o, sizeof out - 1, "%s%.*s.0", digits, decpt - n, "0000000000000000");
    return put(b, out);
}

static int put_value(struct buf *b, const cJSON *item, int indent, int depth);

/* Between a container's items: ", " on one line, or with an indent ",", a newline and the items'
 * indentation (`first`: the opening's newline, no comma; `close`: the closing's, one level out). */
static int put_break(struct buf *b, int indent, int depth, bool first, bool close)
{
    if (!indent)
        return first || close ? 0 : put(b, ", ");
    if (!first && !close && put(b, ",") < 0)
        return -1;
    if (put(b, "\n") < 0)
        return -1;
    for (int k = 0; k < indent * (close ? depth : depth + 1); k++)
        if (put(b, " ") < 0)
            return -1;
    return 0;
}

struct key_slot {
    const char *key;
    size_t index;
};

static int key_order(const void *a, const void *b)
{
    const struct key_slot *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* A dict from the object's pairs: each key at its first place, with the value of its last. */
static int put_object(struct buf *b, const cJSON *obj, int indent, int depth)
{
    size_t n = 0;
    for (const cJSON *c = obj->child; c; c = c->next)
        n++;
    if (!n)
        return put(b, "{}");
    struct key_slot *slots = malloc(n * sizeof *slots);
    const cJSON **children = malloc(n * sizeof *children), **value_at = calloc(n, sizeof *value_at);
    int rc = -1;
    if (!slots || !children || !value_at) {
        sd_err("out of memory writing JSON");
        goto out;
    }
    size_t i = 0;
    for (const cJSON *c = obj->child; c; c = c->next, i++) {
        slots[i] = (struct key_slot){c->string, i};
        children[i] = c;
    }
    qsort(slots, n, sizeof *slots, key_order);
    for (size_t g = 0, e; g < n; g = e) {
        for (e = g + 1; e < n && !strcmp(slots[e].key, slots[g].key);)
            e++;
        value_at[slots[g].index] = children[slots[e - 1].index];
    }
    if (put(b, "{") < 0)
        goto out;
    bool first = true;
    for (i = 0; i < n; i++) {
        if (!value_at[i])
            continue;
        if (put_break(b, indent, depth, first, false) < 0 || put_string(b, children[i]->string) < 0 ||
            put(b, ": ") < 0 || put_value(b, value_at[i], indent, depth + 1) < 0)
            goto out;
        first = false;
    }
    rc = put_break(b, indent, depth, false, true) < 0 ? -1 : put(b, "}");
out:
    free(slots);
    free(children);
    free(value_at);
    return rc;
}

static int put_value(struct buf *b, const cJSON *item, int indent, int depth)
{
    switch (item->type & 0xff) {
    case cJSON_False:
        return put(b, "false");
    case cJSON_True:
        return put(b, "true");
    case cJSON_NULL:
        return put(b, "null");
    case cJSON_Number:
        if (!item->valuestring)
            return sd_err("a JSON number without its source text (pyjson_keep_number_lexemes)");
        return strpbrk(item->valuestring, ".eE") ? put_float(b, item->valuestring) : put_int(b, item->valuestring);
    case cJSON_String:
        return put_string(b, item->valuestring);
    case cJSON_Array:
        if (!item->child)
            return put(b, "[]");
        if (put(b, "[") < 0)
            return -1;
        for (const cJSON *c = item->child; c; c = c->next)
            if (put_break(b, indent, depth, c == item->child, false) < 0 || put_value(b, c, indent, depth + 1) < 0)
                return -1;
        return put_break(b, indent, depth, false, true) < 0 ? -1 : put(b, "]");
    case cJSON_Object:
        return put_object(b, item, indent, depth);
    default:
        return sd_err("a cJSON node of type %d has no JSON form", item->type & 0xff);
    }
}

char *pyjson_dumps(const cJSON *item)
{
    return pyjson_dumps_indent(item, 0);
}

char *pyjson_dumps_indent(const cJSON *item, int indent)
{
    struct buf b = {0};
    if (put_value(&b, item, indent, 0) < 0) {
        free(b.s);
        return NULL;
    }
    return b.s;
}
