/* POSIX shared-memory regions of a job (params16, master, grads, ctl): separate objects so the
 * kernel enforces who may write what. Created 0600 with O_EXCL and fully allocated up front (so a
 * short /dev/shm fails at start, not with SIGBUS mid-run); attached read-only or read-write. */
#ifndef SD_REGION_H
#define SD_REGION_H

#include <stdbool.h>
#include <stddef.h>

#define REGION_NAME_MAX 96

struct shm_region {
    char name[REGION_NAME_MAX];
    void *base;
    size_t size;
    bool writable;
};

/* Creates and maps the object read-write; fails if it exists. On failure nothing is left. */
int shm_region_create(struct shm_region *r, const char *name, size_t size);
/* Maps an existing object (its whole size); refuses one that is not ours with mode 0600. */
int shm_region_attach(struct shm_region *r, const char *name, bool writable);
/* Maps only the first head_bytes of an existing object of object_bytes, read-only (the workers' view
 * of the master weights at the head of the master object); the same checks. */
int shm_region_attach_head(struct shm_region *r, const char *name, size_t object_bytes, size_t head_bytes);
void shm_region_detach(struct shm_region *r);
/* Removes the object's name; mappings stay valid until detached. 0 also when it did not exist. */
int shm_region_unlink(const char *name);
bool shm_region_exists(const char *name);

#endif
