/* Unit tests for common/safetensors.c: writer/reader round trip, exact header bytes, and a table
 * of corrupt files that the reader must refuse with a message naming the problem. */
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/bf16.h"
#include "common/err.h"
#include "common/safetensors.h"

struct blob {
    const void *data;
    size_t len;
};

static int emit_blob(void *arg, FILE *f, size_t nbytes)
{
    const struct blob *b = arg;
    return b->len == 0 || fwrite(b->data, 1, b->len, f) == b->len ? 0 : -1;
}

static uint8_t *read_all(const char *path, size_t *len)
{
    uint8_t *buf = (uint8_t *)tu_read_file(path, len);
    assert_non_null(buf);
    return buf;
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    return n;
}

static void test_round_trip(void **state)
{
    const char *dir = tu_tmpdir(0, "st-rt");
    char path[1100];
    snprintf(path, sizeof path, "%s/rt.safetensors", dir);

    float f32[15];
    uint16_t bf16[7], f16[8];
    double f64[4] = {1.5, -2.25, 1e300, 0.0};
    int32_t i32[3] = {-1, 7, 2147483647};
    uint8_t u8[5] = {1, 2, 3, 4, 5}, boolean[1] = {1};
    float scalar[1] = {3.0f};
    uint64_t seed = tu_seed("round_trip", 42);
    tu_fill_uniform(f32, 15, &seed, -4, 4);
    for (int i = 0; i < 7; i++)
        bf16[i] = f32_to_bf16(0.37f * (float)(i - 3));
    for (int i = 0; i < 8; i++)
        f16[i] = f32_to_f16(0.5f * (float)i - 1.0f);
    struct blob blobs[] = {{f32, sizeof f32}, {bf16, sizeof bf16}, {u8, sizeof u8}, {f16, sizeof f16},
                           {f64, sizeof f64}, {i32, sizeof i32},   {NULL, 0},       {boolean, 1},
                           {scalar, 4}};
    /* u8 first among the unaligned: every later tensor starts at an odd offset */
    struct st_out_tensor ts[] = {
        {"w.f32", ST_F32, 2, {3, 5}, emit_blob, &blobs[0]},
        {"w.bf16", ST_BF16, 1, {7}, emit_blob, &blobs[1]},
        {"w.u8", ST_U8, 1, {5}, emit_blob, &blobs[2]},
        {"w.f16", ST_F16, 3, {2, 2, 2}, emit_blob, &blobs[3]},
        {"w.f64", ST_F64, 2, {4, 1}, emit_blob, &blobs[4]},
        {"w.i32", ST_I32, 1, {3}, emit_blob, &blobs[5]},
        {"w.empty", ST_I64, 2, {0, 3}, emit_blob, &blobs[6]},
        {"w.bool", ST_BOOL, 1, {1}, emit_blob, &blobs[7]},
        {"w.\"quoted\"\\name", ST_F32, 0, {0}, emit_blob, &blobs[8]},
    };
    int n = (int)(sizeof ts / sizeof ts[0]);
    assert_int_equal(st_write(path, n, ts), 0);

    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0644);
    size_t len;
    uint8_t *raw = read_all(path, &len);
    uint64_t hlen = le64(raw);
    assert_int_equal(hlen % 8, 0);
    assert_true(8 + hlen <= len);
    assert_int_equal(raw[8], '{');
    free(raw);

    struct st_file f;
    assert_int_equal(st_open(path, &f), 0);
    assert_string_equal(f.metadata_format, "pt");
    assert_int_equal(f.num_tensors, n);
    for (int i = 0; i < n; i++) {
        const struct st_tensor *t = &f.tensors[i];
        assert_string_equal(t->name, ts[i].name); /* header order is the given order */
        assert_int_equal(t->dtype, ts[i].dtype);
        assert_int_equal(t->ndim, ts[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            assert_int_equal(t->shape[d], ts[i].shape[d]);
        assert_int_equal(t->nbytes, blobs[i].len);
        if (blobs[i].len)
            assert_memory_equal(t->data, blobs[i].data, blobs[i].len);
        assert_ptr_equal(st_find(&f, ts[i].name), t);
    }
    assert_int_equal(f.tensors[8].numel, 1);
    assert_int_equal(f.tensors[6].numel, 0);
    assert_null(st_find(&f, "nope"));

    float out[15];
    assert_int_equal(st_tensor_to_f32(st_find(&f, "w.f32"), out), 0);
    assert_memory_equal(out, f32, sizeof f32);
    assert_int_equal(st_tensor_to_f32(st_find(&f, "w.bf16"), out), 0);
    for (int i = 0; i < 7; i++)
        assert_true(out[i] == bf16_to_f32(bf16[i]));
    assert_int_equal(st_tensor_to_f32(st_find(&f, "w.f16"), out), 0);
    for (int i = 0; i < 8; i++)
        assert_true(out[i] == 0.5f * (float)i - 1.0f);
    assert_int_equal(st_tensor_to_f32(st_find(&f, "w.f64"), out), 0);
    assert_true(out[0] == 1.5f && out[1] == -2.25f && isinf(out[2]) && out[3] == 0.0f);
    assert_int_equal(st_tensor_to_f32(st_find(&f, "w.i32"), out), -1);
    assert_non_null(strstr(sd_errmsg(), "w.i32"));
    assert_non_null(strstr(sd_errmsg(), "I32"));
    st_close(&f);
    assert_null(f.tensors);
    tu_rmrf(dir);
}

/* The header is exactly what the Rust implementation would accept: metadata, then the tensors in
 * order with contiguous offsets, padded with spaces to 8 bytes. */
static void test_header_bytes(void **state)
{
    const char *dir = tu_tmpdir(0, "st-hdr");
    char path[1100];
    snprintf(path, sizeof path, "%s/h.safetensors", dir);
    float a[2] = {1, 2};
    uint16_t b[3] = {1, 2, 3};
    struct blob ba = {a, 8}, bb = {b, 6};
    struct st_out_tensor ts[] = {{"b", ST_F32, 1, {2}, emit_blob, &ba}, {"a", ST_BF16, 2, {1, 3}, emit_blob, &bb}};
    assert_int_equal(st_write(path, 2, ts), 0);
    size_t len;
    uint8_t *raw = read_all(path, &len);
    const char *want = "{\"__metadata__\":{\"format\":\"pt\"},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"a\":{\"dtype\":\"BF16\",\"shape\":[1,3],\"data_offsets\":[8,14]}}";
    uint64_t hlen = le64(raw);
    size_t wl = strlen(want);
    assert_int_equal(hlen, (wl + 7) / 8 * 8);
    assert_memory_equal(raw + 8, want, wl);
    for (size_t i = wl; i < hlen; i++)
        assert_int_equal(raw[8 + i], ' ');
    assert_int_equal(len, 8 + hlen + 14);
    assert_memory_equal(raw + 8 + hlen, a, 8);
    assert_memory_equal(raw + 8 + hlen + 8, b, 6);
    free(raw);
    tu_rmrf(dir);
}

static int emit_short(void *arg, FILE *f, size_t nbytes)
{
    fputc(0, f);
    return 0;
}

static int emit_fail(void *arg, FILE *f, size_t nbytes)
{
    return sd_err("source unavailable");
}

static void test_write_errors(void **state)
{
    const char *dir = tu_tmpdir(0, "st-werr");
    char path[1100];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    float a[2] = {0};
    struct blob ba = {a, 8};

    struct st_out_tensor shortw[] = {{"x", ST_F32, 1, {2}, emit_short, NULL}};
    assert_int_equal(st_write(path, 1, shortw), -1);
    assert_non_null(strstr(sd_errmsg(), "'x'"));
    assert_non_null(strstr(sd_errmsg(), "emit wrote 1 bytes, expected 8"));
    assert_false(tu_exists(path)); /* nothing half-written left behind */

    struct st_out_tensor failing[] = {{"x", ST_F32, 1, {2}, emit_fail, NULL}};
    assert_int_equal(st_write(path, 1, failing), -1);
    assert_non_null(strstr(sd_errmsg(), "source unavailable"));
    assert_non_null(strstr(sd_errmsg(), path));
    assert_false(tu_exists(path));

    struct st_out_tensor dup[] = {{"x", ST_F32, 1, {2}, emit_blob, &ba}, {"x", ST_F32, 1, {2}, emit_blob, &ba}};
    assert_int_equal(st_write(path, 2, dup), -1);
    assert_non_null(strstr(sd_errmsg(), "given twice"));

    struct st_out_tensor neg[] = {{"x", ST_F32, 1, {-2}, emit_blob, &ba}};
    assert_int_equal(st_write(path, 1, neg), -1);
    assert_non_null(strstr(sd_errmsg(), "invalid shape"));

    char bad_dir[1200];
    snprintf(bad_dir, sizeof bad_dir, "%s/missing/w.safetensors", dir);
    struct st_out_tensor ok[] = {{"x", ST_F32, 1, {2}, emit_blob, &ba}};
    assert_int_equal(st_write(bad_dir, 1, ok), -1);
    assert_non_null(strstr(sd_errmsg(), "cannot create"));
    tu_rmrf(dir);
}

/* ---- corrupt files ----------------------------------------------------------------------------- */

/* 8-byte length + hl header bytes + data_len zero bytes; hlen_override replaces the length when
 * nonzero. */
static uint8_t *make_file(const char *header, size_t hl, size_t data_len, uint64_t hlen_override, size_t *len)
{
    *len = 8 + hl + data_len;
    uint8_t *b = calloc(1, *len + 1);
    uint64_t n = hlen_override ? hlen_override : hl;
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(n >> (8 * i));
    memcpy(b + 8, header, hl);
    return b;
}

struct corrupt_case {
    const char *label;
    const char *header;   /* NULL: raw bytes below */
    size_t data_len;
    uint64_t hlen;        /* 0: the header's length */
    size_t raw_len;       /* for header == NULL: total file size, bytes all zero except the length */
    const char *expect;   /* substring of the error */
};

#define T1(dt, shape, offs) "{\"t\":{\"dtype\":" dt ",\"shape\":" shape ",\"data_offsets\":" offs "}}"

static const struct corrupt_case corrupt_cases[] = {
    {"empty file", NULL, 0, 0, 0, "shorter than 8 bytes"},
    {"truncated header length", NULL, 0, 0, 5, "shorter than 8 bytes"},
    {"header length 0", NULL, 0, 0, 16, "header length is 0"},
    {"header length over 100 MB", "{}", 0, 200000000, 0, "exceeds the 100 MB limit"},
    {"header length past EOF", "{}", 4, 100, 0, "past the end of the file"},
    {"bad JSON", "{\"t\":{\"dtype\":", 0, 0, 0, "not valid JSON"},
    {"header is an array", "[1,2,3]", 0, 0, 0, "not a JSON object"},
    {"NUL inside header", "{\"t\"\0:1}", 0, 0, 0, "not a JSON object"},
    {"garbage after JSON", "{} xyz", 0, 0, 0, "garbage after the JSON object"},
    {"unknown dtype", T1("\"Q4\"", "[2]", "[0,8]"), 8, 0, 0, "tensor 't': unknown or unsupported dtype 'Q4'"},
    {"dtype not a string", T1("4", "[2]", "[0,8]"), 8, 0, 0, "tensor 't': field 'dtype' is not a string"},
    {"missing dtype", "{\"t\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, 0, 0, "tensor 't': missing field 'dtype'"},
    {"missing shape", "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, 0, 0, "tensor 't': missing field 'shape'"},
    {"missing data_offsets", "{\"t\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8, 0, 0,
     "tensor 't': missing field 'data_offsets'"},
    {"shape not an array", T1("\"F32\"", "2", "[0,8]"), 8, 0, 0, "tensor 't': field 'shape' is not an array"},
    {"negative dim", T1("\"F32\"", "[2,-1]", "[0,8]"), 8, 0, 0, "tensor 't': shape[1] is not a non-negative integer"},
    {"fractional dim", T1("\"F32\"", "[2.5]", "[0,8]"), 8, 0, 0, "shape[0] is not a non-negative integer"},
    {"too many dims", T1("\"F32\"", "[1,1,1,1,1,1,1,1,1]", "[0,4]"), 4, 0, 0, "more than 8 dimensions"},
    {"numel overflow", T1("\"F32\"", "[67108864,67108864,67108864]", "[0,8]"), 8, 0, 0, "overflows"},
    {"byte size overflow", T1("\"F64\"", "[2147483648,2147483648]", "[0,8]"), 8, 0, 0, "overflows"},
    {"size does not match shape", T1("\"F32\"", "[2]", "[0,4]"), 4, 0, 0, "span 4 bytes but F32 x shape needs 8"},
    {"begin > end", T1("\"F32\"", "[1]", "[8,4]"), 8, 0, 0, "begin 8 > end 4"},
    {"end past data", T1("\"F32\"", "[4]", "[0,16]"), 8, 0, 0, "end 16 is past the end of the data (8 bytes)"},
    {"negative offset", T1("\"F32\"", "[2]", "[-8,0]"), 8, 0, 0, "data_offsets are not non-negative integers"},
    {"offsets not a pair", T1("\"F32\"", "[2]", "[0]"), 8, 0, 0, "not an array of two integers"},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
     12, 0, 0, "tensors 'a' and 'b' overlap"},
    {"hole",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}",
     12, 0, 0, "tensor 'b': hole of 4 bytes"},
    {"hole at the start", T1("\"F32\"", "[1]", "[4,8]"), 8, 0, 0, "tensor 't': hole of 4 bytes"},
    {"trailing bytes", T1("\"F32\"", "[1]", "[0,4]"), 8, 0, 0, "4 trailing bytes"},
    {"duplicate name",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
     8, 0, 0, "tensor 'a' appears twice"},
    {"metadata value not a string", "{\"__metadata__\":{\"format\":1}}", 0, 0, 0,
     "'__metadata__' field 'format' is not a string"},
    {"metadata not an object", "{\"__metadata__\":[\"pt\"]}", 0, 0, 0, "'__metadata__' is not an object"},
    {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, 0, 0, "'__metadata__' appears twice"},
    {"entry not an object", "{\"t\":5}", 0, 0, 0, "tensor 't': entry is not a JSON object"},
    {"unknown field", "{\"t\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":1}}", 4, 0, 0,
     "tensor 't': unknown field 'x'"},
    {"empty name", "{\"\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, 0, 0, "empty name"},
};

/* The "NUL inside header" case holds a NUL, so its length cannot come from strlen. */
static size_t header_len(const struct corrupt_case *c)
{
    return !strcmp(c->label, "NUL inside header") ? 8 : strlen(c->header);
}

static uint8_t *case_bytes(const struct corrupt_case *c, size_t *len)
{
    if (!c->header) {
        *len = c->raw_len;
        return calloc(1, c->raw_len + 1); /* all zero: header length 0 when there are 8+ bytes */
    }
    return make_file(c->header, header_len(c), c->data_len, c->hlen, len);
}

static void test_corrupt_files(void **state)
{
    const char *dir = tu_tmpdir(0, "st-bad");
    int n = (int)(sizeof corrupt_cases / sizeof corrupt_cases[0]);
    assert_true(n >= 15);
    for (int i = 0; i < n; i++) {
        const struct corrupt_case *c = &corrupt_cases[i];
        size_t len;
        uint8_t *bytes = case_bytes(c, &len);
        char path[1100];
        snprintf(path, sizeof path, "%s/case%02d.safetensors", dir, i);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(bytes, 1, len, f), len);
        fclose(f);

        struct st_file sf;
        int rc = st_open(path, &sf);
        printf("# %-28s -> %s\n", c->label, rc ? sd_errmsg() : "ACCEPTED");
        assert_int_equal(rc, -1);
        assert_non_null(strstr(sd_errmsg(), path));
        if (!strstr(sd_errmsg(), c->expect))
            fail_msg("case '%s': message '%s' lacks '%s'", c->label, sd_errmsg(), c->expect);
        assert_null(sf.tensors);
        assert_null(sf.map);
        assert_null(sf.metadata_format);

        rc = st_parse(bytes, len, "buf", &sf);
        assert_int_equal(rc, -1);
        assert_non_null(strstr(sd_errmsg(), c->expect));
        assert_null(sf.tensors);
        free(bytes);
    }
    struct st_file sf;
    char missing[1100];
    snprintf(missing, sizeof missing, "%s/none.safetensors", dir);
    assert_int_equal(st_open(missing, &sf), -1);
    assert_non_null(strstr(sd_errmsg(), "cannot open"));
    tu_rmrf(dir);
}

/* Deep nesting must be refused by the parser's depth limit, not overflow the stack. */
static void test_deep_nesting(void **state)
{
    size_t depth = 100000;
    char *h = malloc(2 * depth + 16);
    size_t k = 0;
    k += (size_t)sprintf(h, "{\"t\":");
    for (size_t i = 0; i < depth; i++)
        h[k++] = '[';
    for (size_t i = 0; i < depth; i++)
        h[k++] = ']';
    h[k++] = '}';
    h[k] = 0;
    size_t len;
    uint8_t *b = make_file(h, k, 0, 0, &len);
    struct st_file sf;
    assert_int_equal(st_parse(b, len, "deep", &sf), -1);
    assert_non_null(strstr(sd_errmsg(), "not valid JSON"));
    free(b);
    free(h);
}

/* Mutations of a valid file (every single-byte change of a few kinds and every truncation) must
 * either parse to tensors that lie inside the buffer, or fail; never crash. */
static void test_mutations(void **state)
{
    const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},"
                      "\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]},"
                      "\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[16,22]}}";
    size_t len;
    uint8_t *good = make_file(hdr, strlen(hdr), 22, 0, &len);
    struct st_file sf;
    assert_int_equal(st_parse(good, len, "good", &sf), 0);
    assert_int_equal(sf.num_tensors, 2);
    st_close(&sf);
    static const uint8_t subst[] = {0, '"', '{', '}', '[', ']', ',', ':', '-', '9', '0', 'e', ' ', 0xff};
    uint8_t *m = malloc(len);
    int accepted = 0, total = 0;
    for (size_t pos = 0; pos < len; pos++)
        for (size_t s = 0; s < sizeof subst; s++) {
            memcpy(m, good, len);
            m[pos] = subst[s];
            total++;
            if (st_parse(m, len, "mut", &sf) == 0) {
                accepted++;
                for (int t = 0; t < sf.num_tensors; t++) {
                    const uint8_t *d = sf.tensors[t].data;
                    assert_true(d >= m && d + sf.tensors[t].nbytes <= m + len);
                }
                st_close(&sf);
            }
        }
    for (size_t cut = 0; cut < len; cut++) {
        total++;
        assert_int_equal(st_parse(good, cut, "cut", &sf), -1);
    }
    printf("# mutations: %d tried, %d still valid\n", total, accepted);
    free(m);
    free(good);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),   cmocka_unit_test(test_header_bytes),
        cmocka_unit_test(test_write_errors), cmocka_unit_test(test_corrupt_files),
        cmocka_unit_test(test_deep_nesting), cmocka_unit_test(test_mutations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
