/* The CUDA runtime's view of the visible GPUs for `slidedp-worker --probe-topology` (see
 * worker/probe.h): bus ids, memory, peer access. NVML is not linked, so NVLink is read from the peer
 * attributes: native atomics between two GPUs are offered over NVLink and not over PCIe. */
#include <ctype.h>
#include <cuda_runtime.h>
#include <string.h>

extern "C" {
#include "common/err.h"
#include "worker/probe.h"
}

/* "00000000:19:00.0" or "0000:19:00.0" as sysfs names it: a 4-digit domain, lower case. */
static void sysfs_bus_id(const char *cuda_id, char *out, size_t len)
{
    const char *colon = strchr(cuda_id, ':');
    const char *start = colon && colon - cuda_id > 4 ? colon - 4 : cuda_id;
    size_t i = 0;
    for (; start[i] && i + 1 < len; i++)
        out[i] = (char)tolower((unsigned char)start[i]);
    out[i] = 0;
}

extern "C" int cuda_probe_topology(struct topology *t)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess)
        return sd_err("cudaGetDeviceCount: %s", cudaGetErrorString(e));
    if (n == 0)
        return sd_err("no CUDA device is visible");
    if (n > JOB_MAX_GPUS)
        n = JOB_MAX_GPUS;
    topology_assumed(n, t);
    t->source = TOPO_PROBED;
    for (int i = 0; i < n; i++) {
        char id[64];
        if ((e = cudaDeviceGetPCIBusId(id, sizeof id, i)) != cudaSuccess)
            return sd_err("cudaDeviceGetPCIBusId(%d): %s", i, cudaGetErrorString(e));
        sysfs_bus_id(id, t->bus_id[i], TOPO_BUS_ID_MAX);
        cudaDeviceProp prop;
        if ((e = cudaGetDeviceProperties(&prop, i)) != cudaSuccess)
            return sd_err("cudaGetDeviceProperties(%d): %s", i, cudaGetErrorString(e));
        t->memory_mib[i] = (int)(prop.totalGlobalMem >> 20);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            int ij = 0, ji = 0, atomics = 0;
            if (i == j)
                continue;
            if ((e = cudaDeviceCanAccessPeer(&ij, i, j)) != cudaSuccess ||
                (e = cudaDeviceCanAccessPeer(&ji, j, i)) != cudaSuccess)
                return sd_err("cudaDeviceCanAccessPeer(%d, %d): %s", i, j, cudaGetErrorString(e));
            if (!ij || !ji)
                continue;
            t->p2p[i] |= (uint64_t)1 << j;
            if (cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, i, j) == cudaSuccess &&
                atomics)
                t->nvlink[i] |= (uint64_t)1 << j;
        }
    return 0;
}
