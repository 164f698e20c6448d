/* HF model directories: opening model.safetensors or a sharded index, loading the weights into the
 * fp32 parameter space of a layout, and exporting that space (plus config.json) as a directory
 * transformers loads. Used by the launcher (load, checkpoints, final export) and the tests. */
#include "hf.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bf16.h"
#include "err.h"
#include "fsutil.h"

#define HF_PATH_MAX 4096
#define HF_TEXT_MAX (64u << 20) /* config.json and index files */
#define EXPORT_BLOCK 8192       /* elements converted per fwrite */

static const char SINGLE_FILE[] = "model.safetensors";
static const char INDEX_FILE[] = "model.safetensors.index.json";

static int join(char *buf, const char *dir, const char *name)
{
    if (snprintf(buf, HF_PATH_MAX, "%s/%s", dir, name) >= HF_PATH_MAX)
        return sd_err("%s/%s: path too long", dir, name);
    return 0;
}

/* Reads a small text file, NUL-terminated (caller frees). */
static char *read_text(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        sd_err("%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = malloc(HF_TEXT_MAX + 1);
    size_t n = buf ? fread(buf, 1, HF_TEXT_MAX + 1, f) : 0;
    int bad = !buf || ferror(f) || n > HF_TEXT_MAX || (buf && memchr(buf, 0, n));
    fclose(f);
    if (bad) {
        sd_err("%s: %s", path, !buf ? "out of memory" : n > HF_TEXT_MAX ? "file too large" : "read error or NUL byte");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

/* Writes len bytes to path (created 0644, truncated) and fsyncs; removes it on failure. */
static int write_bytes(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return sd_err("%s: cannot create: %s", path, strerror(errno));
    const char *p = data;
    size_t done = 0;
    int rc = fchmod(fd, 0644);
    while (rc == 0 && done < len) {
        ssize_t w = write(fd, p + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            rc = -1;
        else
            done += (size_t)w;
    }
    if (rc == 0)
        rc = fsync(fd);
    if (rc != 0)
        sd_err("%s: write failed: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == 0)
        rc = sd_err("%s: close failed: %s", path, strerror(errno));
    if (rc != 0) {
        unlink(path);
        return -1;
    }
    return 0;
}

/* Writes the text accumulated in a memstream to path. */
static int write_memstream(const char *path, FILE *m, char **text, size_t *len)
{
    int rc = fclose(m) != 0 ? sd_err("%s: out of memory", path) : write_bytes(path, *text, *len);
    free(*text);
    *text = NULL;
    return rc;
}

/* ---- opening ---------------------------------------------------------------------------------- */

struct index_entry {
    const char *name; /* into the parsed index */
    int shard;
};

static int entry_cmp(const void *a, const void *b)
{
    return strcmp(((const struct index_entry *)a)->name, ((const struct index_entry *)b)->name);
}

/* Collects the weight_map of an index into entries (sorted by name) and the distinct shard file
 * names in order of first appearance. */
static int index_entries(const char *ipath, const cJSON *root, struct index_entry **entries, int *num_entries,
                         const char ***shards, int *num_shards)
{
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(root) || !cJSON_IsObject(wm))
        return sd_err("%s: field 'weight_map' is missing or not an object", ipath);
    int n = cJSON_GetArraySize(wm);
    *entries = calloc(n ? (size_t)n : 1, sizeof **entries);
    *shards = calloc(n ? (size_t)n : 1, sizeof **shards);
    if (!*entries || !*shards)
        return sd_err("%s: out of memory", ipath);
    int k = 0;
    for (const cJSON *e = wm->child; e; e = e->next, k++) {
        const char *file = cJSON_IsString(e) ? e->valuestring : NULL;
        if (!file || !file[0] || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
            return sd_err("%s: weight_map entry '%s' is not a plain file name", ipath, e->string);
        int s = 0;
        while (s < *num_shards && strcmp((*shards)[s], file))
            s++;
        if (s == *num_shards)
            (*shards)[(*num_shards)++] = file;
        (*entries)[k] = (struct index_entry){e->string, s};
    }
    *num_entries = n;
    qsort(*entries, (size_t)n, sizeof **entries, entry_cmp);
    for (int i = 1; i < n; i++)
        if (!strcmp((*entries)[i - 1].name, (*entries)[i].name))
            return sd_err("%s: tensor '%s' appears twice in weight_map", ipath, (*entries)[i].name);
    if (n == 0)
        return sd_err("%s: weight_map is empty", ipath);
    return 0;
}

/* Every shard must hold exactly the tensors the index maps to it. */
static int check_shards(const char *ipath, const struct hf_weights *w, const struct index_entry *entries, int n,
                        const char *const *shards)
{
    for (int i = 0; i < n; i++)
        if (!st_find(&w->files[entries[i].shard], entries[i].name))
            return sd_err("%s: maps tensor '%s' to %s, which does not hold it", ipath, entries[i].name,
                          shards[entries[i].shard]);
    for (int s = 0; s < w->num_files; s++)
        for (int t = 0; t < w->files[s].num_tensors; t++) {
            struct index_entry key = {w->files[s].tensors[t].name, 0};
            const struct index_entry *e = bsearch(&key, entries, (size_t)n, sizeof key, entry_cmp);
            if (!e)
                return sd_err("%s: holds tensor '%s' which %s does not list", w->files[s].path, key.name, ipath);
            if (e->shard != s)
                return sd_err("%s: holds tensor '%s' which %s maps to %s", w->files[s].path, key.name, ipath,
                              shards[e->shard]);
        }
    return 0;
}

static int open_index(const char *model_dir, const char *ipath, struct hf_weights *out)
{
    size_t len;
    char *text = read_text(ipath, &len);
    if (!text)
        return -1;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    struct index_entry *entries = NULL;
    const char **shards = NULL;
    int num_entries = 0, num_shards = 0, rc = 0;
    if (!root)
        rc = sd_err("%s: not valid JSON (error near byte %zu)", ipath, end ? (size_t)(end - text) : 0);
    else
        rc = index_entries(ipath, root, &entries, &num_entries, &shards, &num_shards);
    if (rc == 0) {
        out->files = calloc((size_t)num_shards, sizeof *out->files);
        if (!out->files)
            rc = sd_err("%s: out of memory", ipath);
    }
    char path[HF_PATH_MAX];
    for (int s = 0; rc == 0 && s < num_shards; s++) {
        rc = join(path, model_dir, shards[s]);
        if (rc == 0 && st_open(path, &out->files[s]) < 0)
            rc = sd_err_prefix("shard listed in %s", ipath);
        if (rc == 0)
            out->num_files++;
    }
    if (rc == 0)
        rc = check_shards(ipath, out, entries, num_entries, shards);
    free(entries);
    free(shards);
    cJSON_Delete(root);
    free(text);
    return rc;
}

int hf_weights_open(const char *model_dir, struct hf_weights *out)
{
    memset(out, 0, sizeof *out);
    char single[HF_PATH_MAX], index[HF_PATH_MAX];
    if (join(single, model_dir, SINGLE_FILE) < 0 || join(index, model_dir, INDEX_FILE) < 0)
        return -1;
    int rc;
    if (fs_is_file(single)) { /* transformers prefers the single file when both exist */
        out->files = calloc(1, sizeof *out->files);
        if (!out->files)
            return sd_err("%s: out of memory", single);
        rc = st_open(single, &out->files[0]);
        if (rc == 0)
            out->num_files = 1;
    } else if (fs_is_file(index)) {
        rc = open_index(model_dir, index, out);
    } else {
        return sd_err("%s: no %s or %s", model_dir, SINGLE_FILE, INDEX_FILE);
    }
    if (rc < 0)
        hf_weights_close(out);
    return rc;
}

void hf_weights_close(struct hf_weights *w)
{
    for (int i = 0; i < w->num_files; i++)
        st_close(&w->files[i]);
    free(w->files);
    memset(w, 0, sizeof *w);
}

/* The tensor and the index of the file holding it, or NULL. */
static const struct st_tensor *find_in(const struct hf_weights *w, const char *name, int *file)
{
    for (int i = 0; i < w->num_files; i++) {
        const struct st_tensor *t = st_find(&w->files[i], name);
        if (t) {
            *file = i;
            return t;
        }
    }
    return NULL;
}

const struct st_tensor *hf_weights_find(const struct hf_weights *w, const char *name)
{
    int file;
    return find_in(w, name, &file);
}

/* ---- loading ---------------------------------------------------------------------------------- */

static const char *shape_str(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap)
        snprintf(buf + n, cap - n, "]");
    return buf;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static const char *weights_what(const struct hf_weights *w, char *buf, size_t cap)
{
    if (w->num_files == 0)
        snprintf(buf, cap, "model weights");
    else if (w->num_files == 1)
        snprintf(buf, cap, "%s", w->files[0].path);
    else
        snprintf(buf, cap, "%s and %d other shards", w->files[0].path, w->num_files - 1);
    return buf;
}

/* Every layout tensor present with its exact shape and a float dtype; nothing unknown in the files. */
static int check_weights(const struct hf_weights *w, const struct layout *lay)
{
    char what[HF_PATH_MAX + 64];
    int missing = 0, first_missing = -1;
    for (int i = 0; i < lay->num_tensors; i++) {
        const struct tensor_desc *d = &lay->tensors[i];
        int file;
        const struct st_tensor *t = find_in(w, d->name, &file);
        if (!t) {
            if (missing++ == 0)
                first_missing = i;
            continue;
        }
        char got[160], want[160];
        bool same = t->ndim == d->ndim;
        for (int k = 0; same && k < d->ndim; k++)
            same = t->shape[k] == d->shape[k];
        if (!same)
            return sd_err("%s: tensor '%s' has shape %s, the config needs %s", w->files[file].path, d->name,
                          shape_str(got, sizeof got, t->ndim, t->shape), shape_str(want, sizeof want, d->ndim, d->shape));
        if (t->dtype != ST_F32 && t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F64)
            return sd_err("%s: tensor '%s' has dtype %s, expected a floating-point dtype", w->files[file].path,
                          d->name, st_dtype_name(t->dtype));
    }
    if (missing == 1)
        return sd_err("%s: missing tensor '%s'", weights_what(w, what, sizeof what), lay->tensors[first_missing].name);
    if (missing)
        return sd_err("%s: missing tensor '%s' and %d more", weights_what(w, what, sizeof what),
                      lay->tensors[first_missing].name, missing - 1);
    bool tied = layout_find(lay->tensors, lay->num_tensors, TENSOR_LM_HEAD, -1) < 0;
    for (int f = 0; f < w->num_files; f++)
        for (int i = 0; i < w->files[f].num_tensors; i++) {
            const char *name = w->files[f].tensors[i].name;
            if ((tied && !strcmp(name, "lm_head.weight")) || ends_with(name, "rotary_emb.inv_freq"))
                continue;
            if (layout_find_name(lay->tensors, lay->num_tensors, name) < 0)
                return sd_err("%s: unexpected tensor '%s' (not a parameter of the configured model)",
                              w->files[f].path, name);
        }
    return 0;
}

int hf_weights_load(const struct hf_weights *w, const struct layout *lay, float *params_f32)
{
    if (check_weights(w, lay) < 0)
        return -1;
    for (int i = 0; i < lay->num_tensors; i++) {
        const struct tensor_desc *d = &lay->tensors[i];
        if (st_tensor_to_f32(hf_weights_find(w, d->name), params_f32 + d->offset) < 0)
            return -1;
    }
    return 0;
}

/* ---- export ----------------------------------------------------------------------------------- */

struct emit_arg {
    const float *src;
    int64_t numel;
    enum hf_export_dtype dtype;
};

/* Converts and writes a tensor EXPORT_BLOCK elements at a time: no second copy of the model. */
static int emit_tensor(void *arg, FILE *f, size_t nbytes)
{
    const struct emit_arg *a = arg;
    union {
        uint16_t h[EXPORT_BLOCK];
        float x[EXPORT_BLOCK];
    } buf;
    size_t esize = a->dtype == HF_EXPORT_BF16 ? 2 : 4;
    if (nbytes != (size_t)a->numel * esize)
        return sd_err("emit: %zu bytes requested for %lld elements", nbytes, (long long)a->numel);
    for (int64_t i = 0; i < a->numel; i += EXPORT_BLOCK) {
        size_t n = (size_t)(a->numel - i < EXPORT_BLOCK ? a->numel - i : EXPORT_BLOCK);
        const void *out = a->src + i;
        if (a->dtype == HF_EXPORT_BF16) {
            for (size_t k = 0; k < n; k++)
                buf.h[k] = f32_to_bf16(a->src[i + (int64_t)k]);
            out = buf.h;
        }
        if (fwrite(out, esize, n, f) != n)
            return sd_err("write failed: %s", strerror(errno));
    }
    return 0;
}

static void shard_name(char *buf, size_t cap, int shard, int num_shards)
{
    if (num_shards == 1)
        snprintf(buf, cap, "%s", SINGLE_FILE);
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", shard + 1, num_shards);
}

/* Assigns tensors (in layout order) to shards as transformers does: a new shard starts when the
 * next tensor would push the current one past max_shard_bytes (0: no limit). */
static int plan_shards(const struct layout *lay, size_t esize, size_t max_shard_bytes, int *shard_of,
                       uint64_t *total)
{
    int shard = 0;
    uint64_t cur = 0;
    *total = 0;
    for (int i = 0; i < lay->num_tensors; i++) {
        uint64_t b = (uint64_t)lay->tensors[i].numel * esize;
        *total += b;
        if (max_shard_bytes && cur > 0 && cur + b > max_shard_bytes) {
            shard++;
            cur = 0;
        }
        cur += b;
        shard_of[i] = shard;
    }
    return shard + 1;
}

static int write_shard(const char *path, const struct layout *lay, const float *params, enum hf_export_dtype dtype,
                       int first, int count)
{
    struct st_out_tensor *ts = calloc(count ? (size_t)count : 1, sizeof *ts);
    struct emit_arg *args = calloc(count ? (size_t)count : 1, sizeof *args);
    int rc;
    if (!ts || !args) {
        rc = sd_err("%s: out of memory", path);
    } else {
        for (int k = 0; k < count; k++) {
            const struct tensor_desc *d = &lay->tensors[first + k];
            args[k] = (struct emit_arg){params + d->offset, d->numel, dtype};
            ts[k].name = d->name;
            ts[k].dtype = dtype == HF_EXPORT_BF16 ? ST_BF16 : ST_F32;
            ts[k].ndim = d->ndim;
            memcpy(ts[k].shape, d->shape, (size_t)d->ndim * sizeof d->shape[0]);
            ts[k].emit = emit_tensor;
            ts[k].arg = &args[k];
        }
        rc = st_write(path, count, ts);
    }
    free(ts);
    free(args);
    return rc;
}

static int desc_name_cmp(const void *a, const void *b)
{
    return strcmp((*(const struct tensor_desc *const *)a)->name, (*(const struct tensor_desc *const *)b)->name);
}

/* model.safetensors.index.json as transformers writes it: 2-space indent, keys sorted. */
static int write_index(const char *out_dir, const struct layout *lay, const int *shard_of, int num_shards,
                       uint64_t total)
{
    char path[HF_PATH_MAX], file[64];
    if (join(path, out_dir, INDEX_FILE) < 0)
        return -1;
    const struct tensor_desc **sorted = malloc((size_t)lay->num_tensors * sizeof *sorted);
    if (!sorted)
        return sd_err("%s: out of memory", path);
    for (int i = 0; i < lay->num_tensors; i++)
        sorted[i] = &lay->tensors[i];
    qsort(sorted, (size_t)lay->num_tensors, sizeof *sorted, desc_name_cmp);
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m) {
        free(sorted);
        return sd_err("%s: out of memory", path);
    }
    fprintf(m, "{\n  \"metadata\": {\n    \"total_parameters\": %lld,\n    \"total_size\": %llu\n  },\n"
               "  \"weight_map\": {\n",
            (long long)lay->num_params, (unsigned long long)total);
    for (int i = 0; i < lay->num_tensors; i++) {
        shard_name(file, sizeof file, shard_of[sorted[i] - lay->tensors], num_shards);
        fputs("    ", m);
        st_json_string(m, sorted[i]->name);
        fprintf(m, ": \"%s\"%s\n", file, i + 1 < lay->num_tensors ? "," : "");
    }
    fputs("  }\n}\n", m);
    free(sorted);
    return write_memstream(path, m, &text, &len);
}

static int fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return sd_err("%s: cannot fsync the directory: %s", dir, strerror(e));
    }
    close(fd);
    return 0;
}

/* Removes what hf_export may have written into out_dir, then out_dir itself. */
static void remove_export(const char *out_dir, int num_shards)
{
    char path[HF_PATH_MAX], file[64];
    for (int s = 0; s < num_shards; s++) {
        shard_name(file, sizeof file, s, num_shards);
        if (join(path, out_dir, file) == 0)
            unlink(path);
    }
    if (join(path, out_dir, INDEX_FILE) == 0)
        unlink(path);
    if (join(path, out_dir, "config.json") == 0)
        unlink(path);
    rmdir(out_dir);
}

/* Writes the source config.json with every "torch_dtype" and "dtype" value set to the dtype of the
 * exported weights (added at the top when there is none), the rest of the text unchanged. */
static int write_config_with_dtype(const char *path, const char *text, size_t len, const char *dtype)
{
    char *out = NULL;
    size_t out_len = 0;
    FILE *m = open_memstream(&out, &out_len);
    if (!m)
        return sd_err("%s: out of memory", path);
    bool found = false;
    size_t i = 0;
    while (i < len) {
        size_t key_len = !strncmp(text + i, "\"torch_dtype\"", 13) ? 13 : !strncmp(text + i, "\"dtype\"", 7) ? 7 : 0;
        size_t j = i + key_len;
        while (key_len && j < len && strchr(" \t\r\n:", text[j]))
            j++;
        if (!key_len || j >= len || text[j] != '"' || !memchr(text + i + key_len, ':', j - i - key_len)) {
            fputc(text[i++], m);
            continue;
        }
        fwrite(text + i, 1, j - i, m); /* the key, the colon and the spaces around it */
        for (j++; j < len && text[j] != '"'; j++)
            j += text[j] == '\\';
        fprintf(m, "\"%s\"", dtype);
        i = j + 1;
        found = true;
    }
    if (fclose(m) != 0)
        return sd_err("%s: out of memory", path);
    const char *brace = found ? NULL : memchr(out, '{', out_len);
    int rc;
    if (brace) {
        size_t head = (size_t)(brace - out) + 1;
        char *with = NULL;
        size_t with_len = 0;
        FILE *w = open_memstream(&with, &with_len);
        if (!w) {
            free(out);
            return sd_err("%s: out of memory", path);
        }
        fwrite(out, 1, head, w);
        fprintf(w, "\n  \"torch_dtype\": \"%s\",", dtype);
        fwrite(out + head, 1, out_len - head, w);
        rc = write_memstream(path, w, &with, &with_len);
    } else {
        rc = write_bytes(path, out, out_len);
    }
    free(out);
    return rc;
}

static int export_files(const char *out_dir, const char *config_json_src, const struct model_config *cfg,
                        const struct layout *lay, const float *params, enum hf_export_dtype dtype,
                        const int *shard_of, int num_shards, uint64_t total)
{
    char path[HF_PATH_MAX], file[64];
    const char *dtype_name = dtype == HF_EXPORT_BF16 ? "bfloat16" : "float32";
    if (join(path, out_dir, "config.json") < 0)
        return -1;
    if (config_json_src) {
        size_t len;
        char *text = read_text(config_json_src, &len);
        int rc = text ? write_config_with_dtype(path, text, len, dtype_name) : -1;
        free(text);
        if (rc < 0)
            return -1;
    } else {
        struct model_config with_dtype = *cfg;
        snprintf(with_dtype.torch_dtype, sizeof with_dtype.torch_dtype, "%s", dtype_name);
        if (hf_config_write(path, &with_dtype) < 0)
            return -1;
    }
    for (int s = 0, first = 0; s < num_shards; s++) {
        int count = 0;
        while (first + count < lay->num_tensors && shard_of[first + count] == s)
            count++;
        shard_name(file, sizeof file, s, num_shards);
        if (join(path, out_dir, file) < 0 || write_shard(path, lay, params, dtype, first, count) < 0)
            return -1;
        first += count;
    }
    if (num_shards > 1 && write_index(out_dir, lay, shard_of, num_shards, total) < 0)
        return -1;
    return fsync_dir(out_dir);
}

int hf_export(const char *out_dir, const char *config_json_src, const struct model_config *cfg,
              const struct layout *lay, const float *params_f32, enum hf_export_dtype dtype,
              size_t max_shard_bytes)
{
    if (!config_json_src && !cfg)
        return sd_err("%s: export needs a source config.json or a model config", out_dir);
    if (strlen(out_dir) + 64 >= HF_PATH_MAX)
        return sd_err("%s: path too long", out_dir);
    int *shard_of = malloc((lay->num_tensors ? (size_t)lay->num_tensors : 1) * sizeof *shard_of);
    if (!shard_of)
        return sd_err("%s: out of memory", out_dir);
    uint64_t total;
    int num_shards = plan_shards(lay, dtype == HF_EXPORT_BF16 ? 2 : 4, max_shard_bytes, shard_of, &total);
    int rc;
    if (mkdir(out_dir, 0755) != 0) {
        rc = sd_err("%s: cannot create the export directory: %s", out_dir,
                    errno == EEXIST ? "it already exists" : strerror(errno));
    } else if (chmod(out_dir, 0755) != 0) {
        rc = sd_err("%s: chmod: %s", out_dir, strerror(errno));
        rmdir(out_dir);
    } else {
        rc = export_files(out_dir, config_json_src, cfg, lay, params_f32, dtype, shard_of, num_shards, total);
        if (rc < 0)
            remove_export(out_dir, num_shards);
    }
    free(shard_of);
    return rc;
}

/* Every file transformers' AutoTokenizer and GenerationConfig read from a model directory. */
static const char *const TOKENIZER_FILES[] = {
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "vocab.json",
    "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json", "generation_config.json",
};

int hf_copy_tokenizer_files(const char *model_dir, const char *out_dir)
{
    char src[HF_PATH_MAX], dst[HF_PATH_MAX];
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof *TOKENIZER_FILES; i++) {
        if (join(src, model_dir, TOKENIZER_FILES[i]) != 0 || join(dst, out_dir, TOKENIZER_FILES[i]) != 0)
            return -1;
        if (fs_is_file(src) && fs_copy_file(src, dst) != 0)
            return -1;
    }
    return 0;
}

/* ---- config.json ------------------------------------------------------------------------------ */

/* A float as Python's json writes it: shortest round-trip digits, always with a '.' or exponent. */
static void json_double(FILE *f, double x)
{
    char buf[40];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, x);
        if (strtod(buf, NULL) == x)
            break;
    }
    if (!strpbrk(buf, ".e"))
        strcat(buf, ".0");
    fputs(buf, f);
}

int hf_config_write(const char *path, const struct model_config *cfg)
{
    const struct rope_scaling *rs = &cfg->rope_scaling;
    if (!isfinite(cfg->rms_norm_eps) || !isfinite(cfg->rope_theta) || !isfinite(cfg->initializer_range) ||
        !isfinite(rs->factor) || !isfinite(rs->low_freq_factor) || !isfinite(rs->high_freq_factor))
        return sd_err("%s: model config has a non-finite number", path);
    bool qwen = cfg->family == MODEL_QWEN3 || cfg->family == MODEL_QWEN2;
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (!m)
        return sd_err("%s: out of memory", path);
    /* Keys sorted, as transformers' to_json_string writes them. */
    fputs("{\n  \"architectures\": [\n    ", m);
    st_json_string(m, cfg->architecture);
    fputs("\n  ],\n", m);
    if (cfg->family != MODEL_QWEN2) /* Qwen2 always has q/k/v biases: the field does not apply */
        fputs("  \"attention_bias\": false,\n", m);
    fputs("  \"attention_dropout\": 0.0,\n", m);
    fprintf(m, "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n", cfg->head_dim,
            cfg->hidden_size);
    fputs("  \"initializer_range\": ", m);
    json_double(m, cfg->initializer_range);
    fprintf(m, ",\n  \"intermediate_size\": %d,\n  \"max_position_embeddings\": %d,\n", cfg->intermediate_size,
            cfg->max_position_embeddings);
    if (cfg->family == MODEL_LLAMA)
        fputs("  \"mlp_bias\": false,\n", m);
    fputs("  \"model_type\": ", m);
    st_json_string(m, cfg->model_type);
    fprintf(m, ",\n  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n  \"num_key_value_heads\": %d,\n",
            cfg->num_heads, cfg->num_layers, cfg->num_kv_heads);
    fputs("  \"rms_norm_eps\": ", m);
    json_double(m, cfg->rms_norm_eps);
    fputs(",\n  \"rope_scaling\": ", m);
    if (rs->type == ROPE_SCALING_LLAMA3) {
        fputs("{\n    \"factor\": ", m);
        json_double(m, rs->factor);
        fputs(",\n    \"high_freq_factor\": ", m);
        json_double(m, rs->high_freq_factor);
        fputs(",\n    \"low_freq_factor\": ", m);
        json_double(m, rs->low_freq_factor);
        fprintf(m, ",\n    \"original_max_position_embeddings\": %d,\n    \"rope_type\": \"llama3\"\n  }",
                rs->original_max_position_embeddings);
    } else {
        fputs("null", m);
    }
    fputs(",\n  \"rope_theta\": ", m);
    json_double(m, cfg->rope_theta);
    fprintf(m, ",\n  \"tie_word_embeddings\": %s,\n  \"torch_dtype\": ", cfg->tie_word_embeddings ? "true" : "false");
    st_json_string(m, cfg->torch_dtype[0] ? cfg->torch_dtype : "bfloat16");
    fputs(",\n  \"use_cache\": true,\n", m);
    if (qwen)
        fputs("  \"use_sliding_window\": false,\n", m);
    fprintf(m, "  \"vocab_size\": %d\n}\n", cfg->vocab_size);
    return write_memstream(path, m, &text, &len);
}
