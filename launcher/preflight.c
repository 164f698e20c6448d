/* The launcher's preflight of the paths a run will write (log.dir, checkpoint.dir and the exported
 * final/ in it), before anything is created: each must be a directory or creatable under its
 * nearest existing ancestor, on a writable real filesystem; a shortage of disk space for the
 * checkpoints and the export (or, with none scheduled, for the checkpoint a stop writes) is a warning
 * with the amount missing. Nothing is created here. */
#include "launch.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/err.h"
#include "common/fsutil.h"

/* Kernel pseudo-filesystems (statfs f_type) where files cannot be written. */
static const struct {
    long magic;
    const char *name;
} pseudo_fs[] = {
    {0x9fa0, "proc"},       {0x62656572, "sysfs"},     {0x27e0eb, "cgroup"},   {0x63677270, "cgroup2"},
    {0x64626720, "debugfs"}, {0x74726163, "tracefs"},  {0x73636673, "securityfs"}, {0x1cd1, "devpts"},
};

/* Checks that dir exists as a writable directory or can be created: its nearest existing ancestor
 * (left in base) is a directory, writable, on a writable filesystem that holds files. */
static int check_dir(const char *key, const char *dir, char base[JOB_PATH_MAX])
{
    snprintf(base, JOB_PATH_MAX, "%s", dir);
    struct stat sb;
    while (stat(base, &sb) != 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            return sd_err("%s %s: cannot check %s: %s", key, dir, base, strerror(errno));
        char *slash = strrchr(base, '/');
        if (!slash)
            return sd_err("%s %s: no existing folder above it", key, dir);
        slash[slash == base] = 0; /* keep "/" itself */
    }
    if (!S_ISDIR(sb.st_mode))
        return sd_err("%s %s: %s is a %s, not a directory", key, dir, base,
                      S_ISREG(sb.st_mode) ? "regular file" : "special file");
    struct statfs fs;
    if (statfs(base, &fs) == 0)
        for (size_t i = 0; i < sizeof pseudo_fs / sizeof pseudo_fs[0]; i++)
            if ((long)fs.f_type == pseudo_fs[i].magic)
                return sd_err("%s %s: %s is on the kernel's %s filesystem, which holds no files of ours", key, dir,
                              base, pseudo_fs[i].name);
    struct statvfs vfs;
    if (statvfs(base, &vfs) == 0 && (vfs.f_flag & ST_RDONLY))
        return sd_err("%s %s: %s is on a read-only filesystem", key, dir, base);
    if (access(base, W_OK | X_OK) != 0)
        return sd_err("%s %s: %s is not writable: %s", key, dir, base, strerror(errno));
    return 0;
}

/* Bytes the checkpoints and the export of final/ take on disk at the most: each checkpoint is the
 * weights in export_dtype plus fp32 master and m and v in optimizer_state's dtype; a new one is
 * written before the oldest of the `keep` is removed. A run with none scheduled still writes one
 * when it is stopped (Ctrl-C, SIGTERM): *stop_only says that this one is all the need. */
static double disk_bytes_needed(const struct job_state *st, bool *stop_only)
{
    const struct job_config *job = &st->job;
    int periodic = job->ckpt_every > 0 ? job->steps / job->ckpt_every : 0;
    int written = periodic + (job->save_final ? 1 : 0);
    int on_disk = written < job->ckpt_keep + 1 ? written : job->ckpt_keep + 1;
    *stop_only = on_disk == 0;
    return (*stop_only ? 1 : on_disk) * checkpoint_bytes(st) + (job->save_final ? export_weight_bytes(st) : 0);
}

int preflight_paths(const struct job_state *st)
{
    const struct job_config *job = &st->job;
    char log_base[JOB_PATH_MAX], ckpt_base[JOB_PATH_MAX];
    if (check_dir("[log] dir", job->log_dir, log_base) != 0 ||
        check_dir("[checkpoint] dir", job->ckpt_dir, ckpt_base) != 0)
        return -1;
    struct statvfs vfs;
    bool stop_only;
    double need = disk_bytes_needed(st, &stop_only);
    if (statvfs(ckpt_base, &vfs) == 0) {
        double avail = (double)vfs.f_bavail * (double)vfs.f_frsize;
        char need_s[32], avail_s[32], missing_s[32];
        if (need > avail && stop_only)
            fprintf(stderr,
                    "slidedp-launch: warning: a stop (Ctrl-C, SIGTERM) writes a checkpoint of %s in %s; %s has %s "
                    "free, %s missing (free space, or set checkpoint.dir on a larger disk)\n",
                    fs_bytes_str(need, need_s), job->ckpt_dir, ckpt_base, fs_bytes_str(avail, avail_s),
                    fs_bytes_str(need - avail, missing_s));
        else if (need > avail)
            fprintf(stderr,
                    "slidedp-launch: warning: the checkpoints and the export in %s need up to %s; %s has %s free, "
                    "%s missing (lower checkpoint.keep, or free space before they are due)\n",
                    job->ckpt_dir, fs_bytes_str(need, need_s), ckpt_base, fs_bytes_str(avail, avail_s),
                    fs_bytes_str(need - avail, missing_s));
    }
    return 0;
}
