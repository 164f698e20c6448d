/* Small filesystem helpers for outputs that must never be left half-written: mkdir -p, recursive
 * removal, file copy, atomic file and directory publication (temp + fsync + rename); where the
 * running program lives, and byte counts for messages. */
#ifndef SD_FSUTIL_H
#define SD_FSUTIL_H

#include <stddef.h>

int fs_mkdir_p(const char *path, int mode);
int fs_rm_rf(const char *path);
int fs_copy_file(const char *src, const char *dst);
int fs_fsync_dir(const char *dir);
/* Writes text to path via path.tmp + fsync + rename. */
int fs_write_atomic(const char *path, const void *data, size_t len);
/* Renames a fully written temp directory into place (replacing an existing dst) and fsyncs the
 * parent, so dst is either the old or the new directory, never a mixture. */
int fs_publish_dir(const char *tmp_dir, const char *dst);
int fs_exists(const char *path);
/* Whether path is a regular file (following links). */
int fs_is_file(const char *path);
/* The folder of the running executable (where its sibling programs are). */
int fs_self_dir(char *out, size_t len);
/* path as a user reads it: relative to the current directory when it lies under it ("runs/x"),
 * else unchanged; returns out. */
const char *fs_display_path(const char *path, char *out, size_t len);
/* A byte count in the unit that reads best ("1.50 GiB", "3.20 MiB", "12.0 KiB"); returns out. */
const char *fs_bytes_str(double bytes, char out[32]);

#endif
