/* Shared-memory region create/attach/unlink (see region.h). */
#include "region.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"

int shm_region_create(struct shm_region *r, const char *name, size_t size)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return sd_err("cannot create shared memory %s: %s", name, strerror(errno));
    fchmod(fd, 0600); /* whatever the umask: attaching checks for exactly this mode */
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc != 0) {
        close(fd);
        shm_unlink(name);
        return sd_err("cannot allocate %.2f GiB of shared memory for %s: %s (is /dev/shm large enough?)",
                      (double)size / (1 << 30), name, strerror(rc));
    }
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        shm_unlink(name);
        return sd_err("cannot map shared memory %s: %s", name, strerror(errno));
    }
    r->base = p;
    r->size = size;
    r->writable = true;
    return 0;
}

/* Opens and checks the object, then maps its first `head` bytes (0: all of it); with `expect` > 0 the
 * object must be exactly that large. */
static int attach(struct shm_region *r, const char *name, bool writable, size_t expect, size_t head)
{
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    int fd = shm_open(name, writable ? O_RDWR : O_RDONLY, 0);
    if (fd < 0)
        return sd_err("cannot open shared memory %s: %s", name, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sd_err("cannot stat shared memory %s: %s", name, strerror(e));
    }
    /* only what we created (0600, ours): another local user must not be able to plant a state */
    if (st.st_uid != geteuid()) {
        close(fd);
        return sd_err("shared memory /dev/shm%s belongs to uid %u, not to us (uid %u): another user holds this job's "
                      "name; refusing to map it (remove it, or use another log.dir)",
                      name, (unsigned)st.st_uid, (unsigned)geteuid());
    }
    if ((st.st_mode & 07777) != 0600) {
        close(fd);
        return sd_err("shared memory /dev/shm%s has mode %04o, not the 0600 slidedp creates; refusing to map it "
                      "(remove it)",
                      name, (unsigned)(st.st_mode & 07777));
    }
    if (st.st_size <= 0) {
        close(fd);
        return sd_err("shared memory %s is empty", name);
    }
    if ((expect && (size_t)st.st_size != expect) || head > (size_t)st.st_size) {
        close(fd);
        return sd_err("shared memory %s is %lld bytes, its header says %zu; refusing to use it", name,
                      (long long)st.st_size, expect ? expect : head);
    }
    size_t bytes = head ? head : (size_t)st.st_size;
    void *p = mmap(NULL, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return sd_err("cannot map shared memory %s: %s", name, strerror(errno));
    r->base = p;
    r->size = bytes;
    r->writable = writable;
    return 0;
}

int shm_region_attach(struct shm_region *r, const char *name, bool writable)
{
    return attach(r, name, writable, 0, 0);
}

int shm_region_attach_head(struct shm_region *r, const char *name, size_t object_bytes, size_t head_bytes)
{
    return attach(r, name, false, object_bytes, head_bytes);
}

void shm_region_detach(struct shm_region *r)
{
    if (r->base)
        munmap(r->base, r->size);
    r->base = NULL;
    r->size = 0;
}

int shm_region_unlink(const char *name)
{
    if (shm_unlink(name) != 0 && errno != ENOENT)
        return sd_err("cannot remove shared memory %s: %s", name, strerror(errno));
    return 0;
}

bool shm_region_exists(const char *name)
{
    int fd = shm_open(name, O_RDONLY, 0);
    if (fd < 0)
        return errno != ENOENT;
    close(fd);
    return true;
}
