/* The job's owner lock (docs/design.md §8.6): /dev/shm/slidedp-<job>.lock, flock'ed exclusively by the
 * launcher that creates or adopts the job's shared state, for its whole life, and by --clean while it
 * removes that state. Whoever holds it owns the state; nobody else touches it. */
#include "launch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

#define LOCK_RETRY_MS 10

/* The pid the holder wrote into the lock file, for messages (0 when there is none). */
static int holder_pid(int fd)
{
    char buf[32] = {0};
    if (pread(fd, buf, sizeof buf - 1, 0) <= 0)
        return 0;
    int pid = 0;
    sscanf(buf, "%d", &pid);
    return pid;
}

int owner_lock(const char *job_name, int wait_ms, int *fd_out)
{
    char name[REGION_NAME_MAX];
    ctl_lock_name(job_name, name, sizeof name);
    for (int waited = 0;; waited += LOCK_RETRY_MS) {
        int fd = shm_open(name, O_RDWR | O_CREAT, 0600); /* close-on-exec: the children never hold it */
        if (fd < 0)
            return sd_err("cannot open the job's lock /dev/shm%s: %s", name, strerror(errno));
        struct stat st;
        if (fstat(fd, &st) != 0 || st.st_uid != geteuid()) {
            close(fd);
            return sd_err("the job's lock /dev/shm%s belongs to another user; refusing to run the job (remove it, "
                          "or use another log.dir)", name);
        }
        if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
            /* a holder removes the file before it lets go: what we locked may be unlinked already,
             * and a launcher that opens the name now gets another file; only the linked one counts */
            if (fstat(fd, &st) == 0 && st.st_nlink > 0) {
                char pid[32];
                int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
                bool written = ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)n, 0) == n;
                (void)written; /* the pid is only for messages */
                *fd_out = fd;
                return 0;
            }
            close(fd);
            continue;
        }
        int err = errno;
        if (err != EWOULDBLOCK) {
            close(fd);
            return sd_err("cannot lock /dev/shm%s: %s", name, strerror(err));
        }
        if (waited >= wait_ms) {
            int pid = holder_pid(fd);
            close(fd);
            if (pid > 0)
                return sd_err("job %s is already running: launcher pid %d holds its lock /dev/shm%s", job_name,
                              pid, name);
            return sd_err("job %s is already running: another launcher holds its lock /dev/shm%s", job_name, name);
        }
        close(fd);
        usleep(LOCK_RETRY_MS * 1000);
    }
}

void owner_unlock(const char *job_name, int fd)
{
    char name[REGION_NAME_MAX];
    ctl_lock_name(job_name, name, sizeof name);
    /* removed while still held, so nobody can lock this file and believe it owns the job */
    shm_unlink(name);
    close(fd);
}
