/* ingest/pyjson.h against Python: tables of inputs with the json.dumps(json.loads(x),
 * ensure_ascii=False) Python gives, without and with indent=4; the repr of random and edge doubles against python3 itself;
 * invalid strings, numbers without their text and texts that do not match their tree refused. */
#include "tests/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "ingest/pyjson.h"

/* Parses text with cJSON, keeps its number lexemes and returns pyjson_dumps (caller frees). */
static char *roundtrip(const char *text)
{
    cJSON *j = cJSON_ParseWithLength(text, strlen(text));
    assert_non_null(j);
    assert_int_equal(pyjson_keep_number_lexemes(j, text, strlen(text)), 0);
    char *s = pyjson_dumps(j);
    cJSON_Delete(j);
    return s;
}

/* Outputs pasted from python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1]),
 * ensure_ascii=False))' on each input. */
static const char *const python_table[][2] = {
    {" { \"a\" :[1,2.0 ,{ \"b\":null}] ,\n\t\"c\":{ },\"d\":[ ] , \"e\":true,\"f\" :false }\r\n",
     "{\"a\": [1, 2.0, {\"b\": null}], \"c\": {}, \"d\": [], \"e\": true, \"f\": false}"},
    {"[[[]],{\"x\":{\"y\":{\"z\":[]}}},[{}]]",
     "[[[]], {\"x\": {\"y\": {\"z\": []}}}, [{}]]"},
    {"\"q\\\" b\\\\ s\\/ n\\n r\\r t\\t b\\b f\\f\"",
     "\"q\\\" b\\\\ s/ n\\n r\\r t\\t b\\b f\\f\""},
    {"\"\\u0001\\u001f\\u001F\\u007f\\u0080 a\177b\"",
     "\"\\u0001\\u001f\\u001f\177\302\200 a\177b\""},
    {"{\"clé\": \"héllo ✓ 😀\", \"\\u00e9\\ud83d\\ude00\": \"\\u2028\\u2029\"}",
     "{\"clé\": \"héllo ✓ 😀\", \"é😀\": \"\u2028\u2029\"}"},
    {"{\"a\":1,\"b\":2,\"a\":3}",
     "{\"a\": 3, \"b\": 2}"},
    {"{\"x\":[1],\"y\":0,\"x\":{\"x\":1,\"x\":2},\"y\":null,\"x\":\"last\"}",
     "{\"x\": \"last\", \"y\": null}"},
    {"{\"k\\n\\\"\\u0002\": 1}",
     "{\"k\\n\\\"\\u0002\": 1}"},
    {"\"\"",
     "\"\""},
    {"\"s\"",
     "\"s\""},
    {"true",
     "true"},
    {"null",
     "null"},
    {"[]",
     "[]"},
    {"{}",
     "{}"},
    {"[0, -0, 7, -12, 123456789012345678, 123456789012345678901234567890123456789, -98765432109876543210]",
     "[0, 0, 7, -12, 123456789012345678, 123456789012345678901234567890123456789, -98765432109876543210]"},
    {"[1.0, 1e16, 1e15, 0.0001, 0.00001, 1e-5, -0.0, 1E5, 2.5e-7, 0.1, 1.7976931348623157e308, 5e-324, 1e400, -1e400]",
     "[1.0, 1e+16, 1000000000000000.0, 0.0001, 1e-05, 1e-05, -0.0, 100000.0, 2.5e-07, 0.1, 1.7976931348623157e+308, 5e-324, Infinity, -Infinity]"},
    {"[1.5e300, 1e-400, -1e-400, 0.30000000000000004, 100.0, 1e22, 1e21, 1e17, 12345678901234567.0, 9007199254740993.0]",
     "[1.5e+300, 0.0, -0.0, 0.30000000000000004, 100.0, 1e+22, 1e+21, 1e+17, 1.2345678901234568e+16, 9007199254740992.0]"},
    {"[2.2250738585072014e-308, 4.9406564584124654e-324, 1125899906842624.25, 1125899906842624.75, 562949953421312.125]",
     "[2.2250738585072014e-308, 5e-324, 1125899906842624.2, 1125899906842624.8, 562949953421312.1]"},
    {"[123.456e2, 0.001234, 1.0E+2, -1.5e-10, 1e-4, 9999999999999998.0, 1.2345e16, 1e-3, 123456.789e-9, 8.98846567431158e307]",
     "[12345.6, 0.001234, 100.0, -1.5e-10, 0.0001, 9999999999999998.0, 1.2345e+16, 0.001, 0.000123456789, 8.98846567431158e+307]"},
    {"{\"1\": \"2 3\", \"k\": [4, \"5\\\"6\\\\\", 7e0, {\"8\": -9.5}]}",
     "{\"1\": \"2 3\", \"k\": [4, \"5\\\"6\\\\\", 7.0, {\"8\": -9.5}]}"},
    /* lexemes cJSON accepts and json.loads refuses, as int() and float() read them */
    {"[007, -00, 1., 01.5, -0.0e0, 2.E1]",
     "[7, 0, 1.0, 1.5, -0.0, 20.0]"},
};

static void test_python_table(void **state)
{
    for (size_t i = 0; i < sizeof python_table / sizeof *python_table; i++) {
        char *s = roundtrip(python_table[i][0]);
        if (!s)
            fail_msg("row %zu: %s", i, sd_errmsg());
        assert_string_equal(s, python_table[i][1]);
        free(s);
    }
}

/* json.dumps(json.loads(x), ensure_ascii=False, indent=4), pasted from python3 (Llama 3.1's tools). */
static const char *const indent_table[][2] = {
    {"{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"a\": [1, 2.0, {}], \"b\": [], \"c\": {\"d\": null}}}}",
     "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n        \"parameters\": {\n            \"a\": [\n                1,\n                2.0,\n                {}\n            ],\n            \"b\": [],\n            \"c\": {\n                \"d\": null\n            }\n        }\n    }\n}"},
    {"[]", "[]"},
    {"{}", "{}"},
    {"\"x\"", "\"x\""},
    {"[[], [[]], {\"k\": [true, false]}]",
     "[\n    [],\n    [\n        []\n    ],\n    {\n        \"k\": [\n            true,\n            false\n        ]\n    }\n]"},
    {"{\"a\": 1, \"a\": {\"b\": 2}}", "{\n    \"a\": {\n        \"b\": 2\n    }\n}"},
};

static void test_indent(void **state)
{
    for (size_t i = 0; i < sizeof indent_table / sizeof *indent_table; i++) {
        const char *text = indent_table[i][0];
        cJSON *j = cJSON_ParseWithLength(text, strlen(text));
        assert_non_null(j);
        assert_int_equal(pyjson_keep_number_lexemes(j, text, strlen(text)), 0);
        char *s = pyjson_dumps_indent(j, 4);
        cJSON_Delete(j);
        if (!s)
            fail_msg("row %zu: %s", i, sd_errmsg());
        assert_string_equal(s, indent_table[i][1]);
        free(s);
    }
}

static void test_refused(void **state)
{
    /* strings and keys that are not UTF-8: an invalid byte, overlong forms, a surrogate, past
     * U+10FFFF, a sequence cut short */
    static const char *const bad[] = {"\"\377\"", "\"\300\200\"", "\"\340\200\257\"", "\"\355\240\200\"",
                                      "\"\364\220\200\200\"", "\"a\342\202\"", "{\"k\377\": 1}"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *j = cJSON_ParseWithLength(bad[i], strlen(bad[i]));
        assert_non_null(j);
        assert_null(pyjson_dumps(j));
        assert_non_null(strstr(sd_errmsg(), "UTF-8"));
        cJSON_Delete(j);
    }
    char *s = roundtrip("\"\364\217\277\277\"");
    assert_string_equal(s, "\"\U0010ffff\"");
    free(s);
    /* a number whose lexeme was not kept */
    cJSON *j = cJSON_Parse("[1]");
    assert_null(pyjson_dumps(j));
    assert_non_null(strstr(sd_errmsg(), "source text"));
    cJSON_Delete(j);
}

static void test_mismatched_text(void **state)
{
    static const struct {
        const char *parsed, *text, *error;
    } cases[] = {
        {"[1, 2]", "[1]", "fewer"},
        {"[1, 2]", "[1, 2, 3]", "more"},
        {"[1, 2]", "[1, 3]", "is not"},
        {"[1, 2]", "[1, \"2\"]", "fewer"},
        {"1e5e", "1e5e", "is not"},  /* cJSON leaves trailing text unread */
        {"\"a\\u0000b\"", "\"a\\u0000b\"", "\\u0000"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *j = cJSON_Parse(cases[i].parsed);
        assert_non_null(j);
        assert_int_equal(pyjson_keep_number_lexemes(j, cases[i].text, strlen(cases[i].text)), -1);
        if (!strstr(sd_errmsg(), cases[i].error))
            fail_msg("case %zu: %s", i, sd_errmsg());
        cJSON_Delete(j);
    }
    /* numbers inside strings and keys are not counted; an escaped backslash ends no string */
    char *s = roundtrip("{\"1\": [\"2\\\\\", \"3\\\"4\"], \"\\\\\": 5}");
    assert_string_equal(s, "{\"1\": [\"2\\\\\", \"3\\\"4\"], \"\\\\\": 5}");
    free(s);
}

/* The repr of doubles against python3: random finite bit patterns, every power of two and its two
 * neighbours (where the rounding interval is lopsided), and short decimals k x 10^e (short
 * shortest forms). Each goes in as a %.17e lexeme through cJSON. */
static void test_random_floats(void **state)
{
    uint64_t seed = tu_seed("pyjson_floats", 41);
    enum { RANDOM = 20000, POWERS = 2098, SHORT = 6000, N = RANDOM + 3 * POWERS + SHORT };
    double *x = malloc(N * sizeof *x);
    int n = 0;
    while (n < RANDOM) {
        uint64_t bits = splitmix64(&seed);
        if (((bits >> 52) & 0x7ff) != 0x7ff)
            memcpy(&x[n++], &bits, sizeof bits);
    }
    for (int k = -1074; k <= 1023; k++) {
        double p = ldexp(1, k);
        x[n++] = p;
        x[n++] = nextafter(p, 0);
        x[n++] = nextafter(p, INFINITY);
    }
    for (int i = 0; i < SHORT; i++) {
        char lex[40];
        uint64_t r = splitmix64(&seed);
        snprintf(lex, sizeof lex, "%s%llue%d", r & 1 ? "-" : "", (unsigned long long)(1 + (r >> 1) % 999999),
                 (int)((r >> 40) % 633) - 330); /* below 1e309 */
        x[n++] = strtod(lex, NULL);
    }
    assert_int_equal(n, N);

    const char *dir = tu_tmpdir(0, "pyjson");
    char path[4096];
    snprintf(path, sizeof path, "%s/floats.hex", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    size_t cap = (size_t)N * 32, len = 0;
    char *text = malloc(cap);
    len += (size_t)snprintf(text + len, cap - len, "[");
    for (int i = 0; i < N; i++) {
        fprintf(f, "%a\n", x[i]);
        len += (size_t)snprintf(text + len, cap - len, "%s%.17e", i ? "," : "", x[i]);
    }
    len += (size_t)snprintf(text + len, cap - len, "]");
    fclose(f);
    cJSON *arr = cJSON_ParseWithLength(text, len);
    assert_non_null(arr);
    assert_int_equal(pyjson_keep_number_lexemes(arr, text, len), 0);

    char cmd[8192];
    snprintf(cmd, sizeof cmd, "python3 -c 'import json,sys\nfor l in open(sys.argv[1]): print(json.dumps(float.fromhex(l)))' %s",
             path);
    FILE *py = popen(cmd, "r");
    assert_non_null(py);
    char *line = NULL;
    size_t line_cap = 0;
    int i = 0, bad = 0;
    for (const cJSON *c = arr->child; c; c = c->next, i++) {
        ssize_t got = getline(&line, &line_cap, py);
        if (got <= 0)
            fail_msg("python3 gave %d lines of %d", i, N);
        line[strcspn(line, "\n")] = 0;
        char *s = pyjson_dumps(c);
        assert_non_null(s);
        if (strcmp(s, line) && bad++ < 10)
            printf("# %a: python %s, pyjson %s\n", x[i], line, s);
        free(s);
    }
    assert_int_equal(pclose(py), 0);
    printf("# %d doubles, %d unlike python3's repr\n", i, bad);
    assert_int_equal(i, N);
    assert_int_equal(bad, 0);
    free(line);
    cJSON_Delete(arr);
    free(text);
    free(x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_python_table),
        cmocka_unit_test(test_indent),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_mismatched_text),
        cmocka_unit_test(test_random_floats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
