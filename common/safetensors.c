/* safetensors reader (strict validation over a read-only mmap or a buffer) and streaming writer;
 * used by the HF loader/exporter and the safetensors fuzz target. */
#include "safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bf16.h"
#include "err.h"

#define ST_HEADER_MAX (100u * 1000u * 1000u)
/* Largest integer a JSON number (parsed as a double) carries exactly. */
#define ST_JSON_INT_MAX 9007199254740992.0

static const char *const dtype_names[ST_DTYPE_COUNT] = {
    [ST_F32] = "F32", [ST_F16] = "F16", [ST_BF16] = "BF16", [ST_F64] = "F64", [ST_I64] = "I64",
    [ST_I32] = "I32", [ST_I16] = "I16", [ST_I8] = "I8",     [ST_U8] = "U8",   [ST_BOOL] = "BOOL",
};
static const size_t dtype_sizes[ST_DTYPE_COUNT] = {
    [ST_F32] = 4, [ST_F16] = 2, [ST_BF16] = 2, [ST_F64] = 8, [ST_I64] = 8,
    [ST_I32] = 4, [ST_I16] = 2, [ST_I8] = 1,   [ST_U8] = 1,  [ST_BOOL] = 1,
};

const char *st_dtype_name(enum st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtype_names[t] : "?";
}

size_t st_dtype_size(enum st_dtype t)
{
    return (unsigned)t < ST_DTYPE_COUNT ? dtype_sizes[t] : 0;
}

int st_dtype_parse(const char *s)
{
    for (int i = 0; i < ST_DTYPE_COUNT; i++)
        if (!strcmp(s, dtype_names[i]))
            return i;
    return -1;
}

/* Copies a name from untrusted input into a printable, bounded form for error messages. */
static const char *printable(const char *s, char *buf, size_t cap)
{
    size_t n = 0;
    for (; *s && n + 4 < cap; s++)
        buf[n++] = ((unsigned char)*s < 0x20 || *s == 0x7f) ? '?' : *s;
    if (*s)
        buf[n++] = '.', buf[n++] = '.', buf[n++] = '.';
    buf[n] = 0;
    return buf;
}

/* A JSON number that is an integer in [0, 2^53]; -1 otherwise. */
static int64_t json_uint(const cJSON *v)
{
    if (!cJSON_IsNumber(v))
        return -1;
    double d = v->valuedouble;
    if (!(d >= 0 && d <= ST_JSON_INT_MAX) || d != (double)(int64_t)d)
        return -1;
    return (int64_t)d;
}

static int by_name(const void *a, const void *b)
{
    return strcmp((*(const struct st_tensor *const *)a)->name, (*(const struct st_tensor *const *)b)->name);
}

static int by_offset(const void *a, const void *b)
{
    const struct st_tensor *x = *(const struct st_tensor *const *)a, *y = *(const struct st_tensor *const *)b;
    uintptr_t xb = (uintptr_t)x->data, yb = (uintptr_t)y->data;
    if (xb != yb)
        return xb < yb ? -1 : 1;
    return x->nbytes < y->nbytes ? -1 : x->nbytes > y->nbytes;
}

/* Parses one tensor entry of the header into t; data offsets are checked against data_size. */
static int parse_entry(const char *what, const cJSON *e, const uint8_t *data, size_t data_size,
                       struct st_tensor *t)
{
    char nm[96];
    const char *name = printable(e->string, nm, sizeof nm);
    if (!e->string[0])
        return sd_err("%s: a tensor has an empty name", what);
    if (strlen(e->string) >= ST_NAME_MAX)
        return sd_err("%s: tensor '%s': name longer than %d bytes", what, name, ST_NAME_MAX - 1);
    if (!cJSON_IsObject(e))
        return sd_err("%s: tensor '%s': entry is not a JSON object", what, name);
    snprintf(t->name, sizeof t->name, "%s", e->string);

    const cJSON *dtype = NULL, *shape = NULL, *offs = NULL;
    for (const cJSON *f = e->child; f; f = f->next) {
        const cJSON **slot = !strcmp(f->string, "dtype")          ? &dtype
                             : !strcmp(f->string, "shape")        ? &shape
                             : !strcmp(f->string, "data_offsets") ? &offs
                                                                  : NULL;
        char fn[64];
        if (!slot)
            return sd_err("%s: tensor '%s': unknown field '%s'", what, name, printable(f->string, fn, sizeof fn));
        if (*slot)
            return sd_err("%s: tensor '%s': field '%s' appears twice", what, name, f->string);
        *slot = f;
    }

    if (!dtype)
        return sd_err("%s: tensor '%s': missing field 'dtype'", what, name);
    if (!cJSON_IsString(dtype))
        return sd_err("%s: tensor '%s': field 'dtype' is not a string", what, name);
    int dt = st_dtype_parse(dtype->valuestring);
    char dn[32];
    if (dt < 0)
        return sd_err("%s: tensor '%s': unknown or unsupported dtype '%s'", what, name,
                      printable(dtype->valuestring, dn, sizeof dn));
    t->dtype = (enum st_dtype)dt;

    if (!shape)
        return sd_err("%s: tensor '%s': missing field 'shape'", what, name);
    if (!cJSON_IsArray(shape))
        return sd_err("%s: tensor '%s': field 'shape' is not an array", what, name);
    uint64_t numel = 1;
    bool overflow = false;
    t->ndim = 0;
    for (const cJSON *d = shape->child; d; d = d->next) {
        if (t->ndim == ST_MAX_DIMS)
            return sd_err("%s: tensor '%s': shape has more than %d dimensions", what, name, ST_MAX_DIMS);
        int64_t v = json_uint(d);
        if (v < 0)
            return sd_err("%s: tensor '%s': shape[%d] is not a non-negative integer", what, name, t->ndim);
        t->shape[t->ndim++] = v;
        overflow |= __builtin_mul_overflow(numel, (uint64_t)v, &numel);
    }
    uint64_t nbytes;
    if (overflow || numel > INT64_MAX || __builtin_mul_overflow(numel, st_dtype_size(t->dtype), &nbytes) ||
        nbytes > SIZE_MAX)
        return sd_err("%s: tensor '%s': element count or byte size of the shape overflows", what, name);
    t->numel = (int64_t)numel;
    t->nbytes = (size_t)nbytes;

    if (!offs)
        return sd_err("%s: tensor '%s': missing field 'data_offsets'", what, name);
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
        return sd_err("%s: tensor '%s': field 'data_offsets' is not an array of two integers", what, name);
    int64_t begin = json_uint(offs->child), end = json_uint(offs->child->next);
    if (begin < 0 || end < 0)
        return sd_err("%s: tensor '%s': data_offsets are not non-negative integers", what, name);
    if (begin > end)
        return sd_err("%s: tensor '%s': data_offsets begin %lld > end %lld", what, name, (long long)begin,
                      (long long)end);
    if ((uint64_t)end > data_size)
        return sd_err("%s: tensor '%s': data_offsets end %lld is past the end of the data (%zu bytes)", what,
                      name, (long long)end, data_size);
    if ((uint64_t)(end - begin) != nbytes)
        return sd_err("%s: tensor '%s': data_offsets span %lld bytes but %s x shape needs %llu", what, name,
                      (long long)(end - begin), st_dtype_name(t->dtype), (unsigned long long)nbytes);
    t->data = data + begin;
    return 0;
}

static int parse_metadata(const char *what, const cJSON *m, struct st_file *out)
{
    if (!cJSON_IsObject(m))
        return sd_err("%s: '__metadata__' is not an object", what);
    for (const cJSON *f = m->child; f; f = f->next) {
        char fn[64];
        if (!cJSON_IsString(f))
            return sd_err("%s: '__metadata__' field '%s' is not a string", what, printable(f->string, fn, sizeof fn));
        if (!strcmp(f->string, "format")) {
            if (out->metadata_format)
                return sd_err("%s: '__metadata__' field 'format' appears twice", what);
            out->metadata_format = strdup(f->valuestring);
            if (!out->metadata_format)
                return sd_err("%s: out of memory", what);
        }
    }
    return 0;
}

/* Tensors sorted by offset must tile [0, data_size) exactly: no overlap, no hole, no tail. */
static int check_coverage(const char *what, struct st_tensor **idx, int n, const uint8_t *data, size_t data_size)
{
    qsort(idx, (size_t)n, sizeof *idx, by_offset);
    size_t cursor = 0;
    char a[96], b[96];
    for (int i = 0; i < n; i++) {
        size_t begin = (size_t)((const uint8_t *)idx[i]->data - data);
        if (begin < cursor)
            return sd_err("%s: tensors '%s' and '%s' overlap in the data section", what,
                          printable(idx[i - 1]->name, a, sizeof a), printable(idx[i]->name, b, sizeof b));
        if (begin > cursor)
            return sd_err("%s: tensor '%s': hole of %zu bytes before its data (offsets must be contiguous)", what,
                          printable(idx[i]->name, a, sizeof a), begin - cursor);
        cursor = begin + idx[i]->nbytes;
    }
    if (cursor != data_size)
        return sd_err("%s: %zu trailing bytes after the last tensor's data", what, data_size - cursor);
    return 0;
}

static int parse_header(const char *what, const cJSON *root, const uint8_t *data, size_t data_size,
                        struct st_file *out)
{
    if (!cJSON_IsObject(root))
        return sd_err("%s: header is not a JSON object", what);
    int count = 0;
    bool have_meta = false;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (have_meta)
                return sd_err("%s: '__metadata__' appears twice", what);
            have_meta = true;
            if (parse_metadata(what, e, out) < 0)
                return -1;
        } else {
            count++;
        }
    }
    out->tensors = calloc(count ? (size_t)count : 1, sizeof *out->tensors);
    struct st_tensor **idx = malloc((count ? (size_t)count : 1) * sizeof *idx);
    if (!out->tensors || !idx) {
        free(idx);
        return sd_err("%s: out of memory for %d tensors", what, count);
    }
    int rc = 0;
    for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
        if (!strcmp(e->string, "__metadata__"))
            continue;
        struct st_tensor *t = &out->tensors[out->num_tensors];
        rc = parse_entry(what, e, data, data_size, t);
        if (rc == 0)
            idx[out->num_tensors++] = t;
    }
    if (rc == 0) {
        qsort(idx, (size_t)count, sizeof *idx, by_name);
        for (int i = 1; i < count && rc == 0; i++)
            if (!strcmp(idx[i - 1]->name, idx[i]->name)) {
                char nm[96];
                rc = sd_err("%s: tensor '%s' appears twice in the header", what, printable(idx[i]->name, nm, sizeof nm));
            }
    }
    if (rc == 0)
        rc = check_coverage(what, idx, count, data, data_size);
    free(idx);
    return rc;
}

static void release(struct st_file *f)
{
    free(f->tensors);
    free(f->metadata_format);
    f->tensors = NULL;
    f->metadata_format = NULL;
    f->num_tensors = 0;
}

int st_parse(const void *buf, size_t size, const char *what, struct st_file *out)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    snprintf(out->path, sizeof out->path, "%s", what);
    const uint8_t *p = buf;
    if (size < 8)
        return sd_err("%s: file is shorter than 8 bytes (%zu bytes): not a safetensors file", what, size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | p[i];
    if (n == 0)
        return sd_err("%s: header length is 0", what);
    if (n > ST_HEADER_MAX)
        return sd_err("%s: header length %llu exceeds the 100 MB limit", what, (unsigned long long)n);
    if (n > size - 8)
        return sd_err("%s: header length %llu is past the end of the file (%zu bytes)", what,
                      (unsigned long long)n, size);
    /* A NUL-terminated copy: cJSON must never read past the header, whatever its bytes. */
    char *text = malloc(n + 1);
    if (!text)
        return sd_err("%s: out of memory for a %llu-byte header", what, (unsigned long long)n);
    memcpy(text, p + 8, n);
    text[n] = 0;
    if (text[0] != '{' || memchr(text, 0, n)) {
        free(text);
        return sd_err("%s: header is not a JSON object", what);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 0);
    if (!root) {
        size_t at = end ? (size_t)(end - text) : 0;
        free(text);
        return sd_err("%s: header is not valid JSON (error near byte %zu)", what, at);
    }
    /* The writer may pad the JSON with spaces up to an 8-byte boundary; nothing else may follow. */
    for (; *end; end++)
        if (*end != ' ' && *end != '\t' && *end != '\n' && *end != '\r') {
            size_t at = (size_t)(end - text);
            cJSON_Delete(root);
            free(text);
            return sd_err("%s: header has garbage after the JSON object (byte %zu)", what, at);
        }
    int rc = parse_header(what, root, p + 8 + n, size - 8 - n, out);
    cJSON_Delete(root);
    free(text);
    if (rc < 0) {
        release(out);
        return -1;
    }
    return 0;
}

int st_open(const char *path, struct st_file *out)
{
    memset(out, 0, sizeof *out);
    out->fd = -1;
    if (strlen(path) >= sizeof out->path)
        return sd_err("%s: path too long", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sd_err("%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sd_err("%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return sd_err("%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    if (size < 8) {
        close(fd);
        return sd_err("%s: file is shorter than 8 bytes (%zu bytes): not a safetensors file", path, size);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        int e = errno;
        close(fd);
        return sd_err("%s: cannot mmap %zu bytes: %s", path, size, strerror(e));
    }
    if (st_parse(map, size, path, out) < 0) {
        munmap(map, size);
        close(fd);
        return -1;
    }
    out->fd = fd;
    out->map = map;
    out->size = size;
    return 0;
}

void st_close(struct st_file *f)
{
    release(f);
    if (f->map)
        munmap(f->map, f->size);
    if (f->fd >= 0)
        close(f->fd);
    f->map = NULL;
    f->fd = -1;
    f->size = 0;
}

const struct st_tensor *st_find(const struct st_file *f, const char *name)
{
    for (int i = 0; i < f->num_tensors; i++)
        if (!strcmp(f->tensors[i].name, name))
            return &f->tensors[i];
    return NULL;
}

int st_tensor_to_f32(const struct st_tensor *t, float *dst)
{
    const uint8_t *s = t->data; /* may be unaligned: every load goes through memcpy */
    size_t n = (size_t)t->numel;
    switch (t->dtype) {
    case ST_F32:
        memcpy(dst, s, n * 4);
        return 0;
    case ST_BF16:
    case ST_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, s + 2 * i, 2);
            dst[i] = t->dtype == ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        return 0;
    case ST_F64:
        for (size_t i = 0; i < n; i++) {
            double d;
            memcpy(&d, s + 8 * i, 8);
            dst[i] = (float)d;
        }
        return 0;
    default:
        return sd_err("tensor '%s': dtype %s is not a floating-point type", t->name, st_dtype_name(t->dtype));
    }
}

void st_json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

static int by_out_name(const void *a, const void *b)
{
    return strcmp((*(const struct st_out_tensor *const *)a)->name, (*(const struct st_out_tensor *const *)b)->name);
}

/* Checks the descriptors and computes each tensor's byte size into nbytes[]. */
static int check_out_tensors(const char *path, int n, const struct st_out_tensor *ts, uint64_t *nbytes)
{
    for (int i = 0; i < n; i++) {
        const struct st_out_tensor *t = &ts[i];
        if (!t->name || !t->name[0] || strlen(t->name) >= ST_NAME_MAX || !strcmp(t->name, "__metadata__"))
            return sd_err("%s: tensor %d has an invalid name", path, i);
        if ((unsigned)t->dtype >= ST_DTYPE_COUNT || t->ndim < 0 || t->ndim > ST_MAX_DIMS || !t->emit)
            return sd_err("%s: tensor '%s': invalid dtype, rank or emit callback", path, t->name);
        uint64_t numel = 1;
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape[d], &numel))
                return sd_err("%s: tensor '%s': invalid shape", path, t->name);
        if (numel > INT64_MAX || __builtin_mul_overflow(numel, st_dtype_size(t->dtype), &nbytes[i]))
            return sd_err("%s: tensor '%s': size overflows", path, t->name);
    }
    const struct st_out_tensor **sorted = malloc((n ? (size_t)n : 1) * sizeof *sorted);
    if (!sorted)
        return sd_err("%s: out of memory", path);
    for (int i = 0; i < n; i++)
        sorted[i] = &ts[i];
    qsort(sorted, (size_t)n, sizeof *sorted, by_out_name);
    int rc = 0;
    for (int i = 1; i < n && rc == 0; i++)
        if (!strcmp(sorted[i - 1]->name, sorted[i]->name))
            rc = sd_err("%s: tensor '%s' given twice", path, sorted[i]->name);
    free(sorted);
    return rc;
}

/* Builds the header JSON, padded with spaces to a multiple of 8 bytes. */
static int build_header(const char *path, int n, const struct st_out_tensor *ts, const uint64_t *nbytes,
                        char **text, size_t *len)
{
    FILE *m = open_memstream(text, len);
    if (!m)
        return sd_err("%s: out of memory for the header", path);
    fputs("{\"__metadata__\":{\"format\":\"pt\"}", m);
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const struct st_out_tensor *t = &ts[i];
        fputc(',', m);
        st_json_string(m, t->name);
        fprintf(m, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            fprintf(m, "%s%lld", d ? "," : "", (long long)t->shape[d]);
        fprintf(m, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                (unsigned long long)(off + nbytes[i]));
        off += nbytes[i];
    }
    fputc('}', m);
    long pos = ftell(m);
    while (pos >= 0 && pos % 8) {
        fputc(' ', m);
        pos++;
    }
    if (fclose(m) != 0 || pos < 0) {
        free(*text);
        *text = NULL;
        return sd_err("%s: out of memory for the header", path);
    }
    return 0;
}

static int write_body(const char *path, FILE *f, const char *header, size_t hlen, int n,
                      const struct st_out_tensor *ts, const uint64_t *nbytes)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
    if (fwrite(le, 1, 8, f) != 8 || fwrite(header, 1, hlen, f) != hlen)
        return sd_err("%s: write failed: %s", path, strerror(errno));
    for (int i = 0; i < n; i++) {
        off_t before = ftello(f);
        if (ts[i].emit(ts[i].arg, f, (size_t)nbytes[i]) != 0)
            return sd_err_prefix("%s: tensor '%s'", path, ts[i].name);
        off_t after = ftello(f);
        if (ferror(f))
            return sd_err("%s: tensor '%s': write failed: %s", path, ts[i].name, strerror(errno));
        if (before < 0 || after < 0 || (uint64_t)(after - before) != nbytes[i])
            return sd_err("%s: tensor '%s': emit wrote %lld bytes, expected %llu", path, ts[i].name,
                          (long long)(after - before), (unsigned long long)nbytes[i]);
    }
    if (fflush(f) != 0 || fsync(fileno(f)) != 0)
        return sd_err("%s: flush failed: %s", path, strerror(errno));
    return 0;
}

int st_write(const char *path, int num_tensors, const struct st_out_tensor *tensors)
{
    if (num_tensors < 0)
        return sd_err("%s: negative tensor count", path);
    uint64_t *nbytes = calloc(num_tensors ? (size_t)num_tensors : 1, sizeof *nbytes);
    if (!nbytes)
        return sd_err("%s: out of memory", path);
    char *header = NULL;
    size_t hlen = 0;
    if (check_out_tensors(path, num_tensors, tensors, nbytes) < 0 ||
        build_header(path, num_tensors, tensors, nbytes, &header, &hlen) < 0) {
        free(nbytes);
        return -1;
    }
    int rc = -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    FILE *f = NULL;
    if (fd < 0) {
        sd_err("%s: cannot create: %s", path, strerror(errno));
    } else if (fchmod(fd, 0644) != 0 || !(f = fdopen(fd, "wb"))) {
        sd_err("%s: cannot open for writing: %s", path, strerror(errno));
        close(fd);
    } else {
        rc = write_body(path, f, header, hlen, num_tensors, tensors, nbytes);
        if (fclose(f) != 0 && rc == 0)
            rc = sd_err("%s: close failed: %s", path, strerror(errno));
    }
    if (rc < 0 && fd >= 0)
        unlink(path);
    free(header);
    free(nbytes);
    return rc;
}
