/* slidedp-worker's CUDA backend, loaded from libslidedp-cuda.so beside the program the first time a
 * job needs a GPU (or the topology probe does). Linked into the program, cuBLAS made every worker,
 * a CPU worker too, spend about half a CPU-second in cuBLASLt's initialisers on each start and
 * restart. Tests and benchmarks link the backend itself (worker_dep) and do not use this. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "worker/backend.h"
#include "worker/probe.h"

#define CUDA_MODULE "libslidedp-cuda.so"

/* The module's function `name`, the module loaded on first use; NULL with sd_err set. */
static void *cuda_entry(const char *name)
{
    static void *module;
    if (!module) {
        char path[PATH_MAX];
        ssize_t n = readlink("/proc/self/exe", path, sizeof path);
        char *slash = n > 0 && n < (ssize_t)sizeof path ? memrchr(path, '/', (size_t)n) : NULL;
        if (!slash || (size_t)(slash + 1 - path) + sizeof CUDA_MODULE > sizeof path) {
            sd_err("cannot find the folder of this program (%s)", n < 0 ? strerror(errno) : "path too long");
            return NULL;
        }
        memcpy(slash + 1, CUDA_MODULE, sizeof CUDA_MODULE);
        module = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!module) {
            sd_err("cannot load the CUDA backend: %s", dlerror());
            return NULL;
        }
    }
    void *f = dlsym(module, name);
    if (!f)
        sd_err("the CUDA backend %s has no %s", CUDA_MODULE, name);
    return f;
}

int backend_cuda_init(struct backend *be, int device, size_t mem_budget)
{
    int (*init)(struct backend *, int, size_t);
    *(void **)&init = cuda_entry("backend_cuda_init");
    return init ? init(be, device, mem_budget) : -1;
}

void backend_cuda_set_attention_tile_limit(struct backend *be, size_t bytes)
{
    void (*set)(struct backend *, size_t);
    *(void **)&set = cuda_entry("backend_cuda_set_attention_tile_limit");
    if (set) /* the module loaded for backend_cuda_init already */
        set(be, bytes);
}

int cuda_probe_topology(struct topology *t)
{
    int (*probe)(struct topology *);
    *(void **)&probe = cuda_entry("cuda_probe_topology");
    return probe ? probe(t) : -1;
}
