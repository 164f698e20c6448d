/* Filesystem helpers for atomic outputs (see fsutil.h). */
#define _XOPEN_SOURCE 700
#include "fsutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"

int fs_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

int fs_is_file(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

const char *fs_display_path(const char *path, char *out, size_t len)
{
    char cwd[4096];
    size_t n = getcwd(cwd, sizeof cwd) ? strlen(cwd) : 0;
    bool under = n > 1 && strncmp(path, cwd, n) == 0 && path[n] == '/';
    snprintf(out, len, "%s", under ? path + n + 1 : path);
    return out;
}

int fs_self_dir(char *out, size_t len)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0)
        return sd_err("cannot find my own executable: %s", strerror(errno));
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(out, len, "%s", self);
    return 0;
}

int fs_mkdir_p(const char *path, int mode)
{
    char buf[4096];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return sd_err("%s: path too long", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST)
            return sd_err("cannot create directory %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST)
        return sd_err("cannot create directory %s: %s", buf, strerror(errno));
    struct stat st;
    if (stat(buf, &st) != 0 || !S_ISDIR(st.st_mode))
        return sd_err("%s exists and is not a directory", buf);
    return 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

int fs_rm_rf(const char *path)
{
    if (!fs_exists(path))
        return 0;
    if (nftw(path, rm_one, 32, FTW_DEPTH | FTW_PHYS) != 0)
        return sd_err("cannot remove %s: %s", path, strerror(errno));
    return 0;
}

int fs_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0)
        return sd_err("cannot open directory %s: %s", dir, strerror(errno));
    fsync(fd);
    close(fd);
    return 0;
}

int fs_copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb");
    if (!in)
        return sd_err("cannot read %s: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) {
        fclose(in);
        return sd_err("cannot write %s: %s", dst, strerror(errno));
    }
    char buf[1 << 16];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) {
            rc = sd_err("cannot write %s: %s", dst, strerror(errno));
            break;
        }
    if (ferror(in))
        rc = sd_err("cannot read %s", src);
    fclose(in);
    if (fflush(out) != 0 || fsync(fileno(out)) != 0)
        rc = sd_err("cannot write %s: %s", dst, strerror(errno));
    fclose(out);
    return rc;
}

int fs_write_atomic(const char *path, const void *data, size_t len)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return sd_err("cannot write %s: %s", tmp, strerror(errno));
    const char *p = data;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            close(fd);
            unlink(tmp);
            return sd_err("cannot write %s: %s", tmp, strerror(errno));
        }
        p += n;
        len -= (size_t)n;
    }
    fsync(fd);
    close(fd);
    if (rename(tmp, path) != 0) {
        unlink(tmp);
        return sd_err("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    }
    return 0;
}

int fs_publish_dir(const char *tmp_dir, const char *dst)
{
    char old[4200];
    snprintf(old, sizeof old, "%s.old", dst);
    if (fs_rm_rf(old) != 0)
        return -1;
    bool had_old = fs_exists(dst);
    if (had_old && rename(dst, old) != 0)
        return sd_err("cannot move %s aside: %s", dst, strerror(errno));
    if (rename(tmp_dir, dst) != 0) {
        int e = errno;
        if (had_old)
            rename(old, dst);
        return sd_err("cannot rename %s to %s: %s", tmp_dir, dst, strerror(e));
    }
    char parent[4200];
    snprintf(parent, sizeof parent, "%s", dst);
    fs_fsync_dir(dirname(parent));
    return had_old ? fs_rm_rf(old) : 0;
}

const char *fs_bytes_str(double bytes, char out[32])
{
    double a = fabs(bytes), gib = 1024.0 * 1024 * 1024, mib = 1024.0 * 1024;
    if (a >= gib)
        snprintf(out, 32, "%.2f GiB", bytes / gib);
    else if (a >= mib)
        snprintf(out, 32, "%.2f MiB", bytes / mib);
    else
        snprintf(out, 32, "%.1f KiB", bytes / 1024.0);
    return out;
}
