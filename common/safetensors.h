/* safetensors files: a validating reader over a read-only mmap, and a streaming writer.
 * Format: u64 little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets:
 * [begin, end)}, "__metadata__": {str: str}}, then the data. The reader refuses anything that is
 * not exactly well-formed (bad lengths, offsets out of range or overlapping, holes, size that
 * does not match dtype x shape) with a message naming the file and tensor. */
#ifndef SD_SAFETENSORS_H
#define SD_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum st_dtype { ST_F32 = 0, ST_F16, ST_BF16, ST_F64, ST_I64, ST_I32, ST_I16, ST_I8, ST_U8, ST_BOOL, ST_DTYPE_COUNT };

#define ST_MAX_DIMS 8
#define ST_NAME_MAX 256

struct st_tensor {
    char name[ST_NAME_MAX];
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    size_t nbytes;
    const void *data; /* into the file's mapping */
};

struct st_file {
    char path[1024];
    int fd;
    void *map;
    size_t size;
    int num_tensors;
    struct st_tensor *tensors;
    char *metadata_format; /* __metadata__.format or NULL */
};

const char *st_dtype_name(enum st_dtype t);
size_t st_dtype_size(enum st_dtype t);
/* Parses "F32", "BF16", ... ; returns -1 if unknown. */
int st_dtype_parse(const char *s);

int st_open(const char *path, struct st_file *out);
/* Same validation on a buffer in memory (used by the fuzz target); the buffer must outlive out. */
int st_parse(const void *buf, size_t size, const char *what, struct st_file *out);
void st_close(struct st_file *f);
const struct st_tensor *st_find(const struct st_file *f, const char *name);

/* Converts a floating-point tensor (F32, F16, BF16, F64) to fp32. */
int st_tensor_to_f32(const struct st_tensor *t, float *dst);

/* Writer: the header is built from the descriptors, then each tensor's bytes come from its emit
 * callback (which writes exactly nbytes to the stream), so large exports never hold a second
 * copy of the model in memory. */
struct st_out_tensor {
    const char *name;
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int (*emit)(void *arg, FILE *f, size_t nbytes); /* 0 on success */
    void *arg;
};

/* Writes s as a JSON string literal (quoted, escaped): the safetensors header here, the HF index and
 * config.json in common/hf.c. */
void st_json_string(FILE *f, const char *s);

/* Writes path (created 0644, truncated) with metadata {"format": "pt"}. Tensors appear in the order
 * given; fsyncs before returning. */
int st_write(const char *path, int num_tensors, const struct st_out_tensor *tensors);

#endif
