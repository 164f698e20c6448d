/* The GPUs of a job's ranks and the links between them: PCI bus id, NUMA node, PCIe switch and
 * memory of each, which pairs can copy peer to peer and which over NVLink. Read from a description
 * file ([runtime] topology), probed by `slidedp-worker --probe-topology` (the launcher never touches
 * CUDA), or synthetic on the CPU backend. The planner chooses routes from it; the launcher prints
 * it and stores it by value in the ctl region. */
#ifndef SD_TOPOLOGY_H
#define SD_TOPOLOGY_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "common/job.h"

#define TOPO_BUS_ID_MAX 20

enum topology_source {
    TOPO_CPU = 0,    /* CPU backend: peers emulated in shared memory */
    TOPO_FILE = 1,   /* a description file */
    TOPO_PROBED = 2, /* slidedp-worker --probe-topology on this host */
    TOPO_ASSUMED = 3 /* slidedp-plan with nothing to probe: no P2P assumed */
};

struct topology {
    int gpus;
    int source;                                /* enum topology_source */
    char bus_id[JOB_MAX_GPUS][TOPO_BUS_ID_MAX]; /* "0000:19:00.0"; "" unknown */
    int numa[JOB_MAX_GPUS];                    /* -1 unknown */
    int pcie_switch[JOB_MAX_GPUS];             /* GPUs under one switch share it; -1 unknown */
    int memory_mib[JOB_MAX_GPUS];              /* device memory in MiB (the CUDA runtime's total); -1 unknown */
    uint64_t p2p[JOB_MAX_GPUS];                /* bit j of p2p[i]: GPUs i and j can copy peer to peer */
    uint64_t nvlink[JOB_MAX_GPUS];             /* bit j of nvlink[i]: i and j are joined by NVLink */
};

static inline bool topology_p2p(const struct topology *t, int i, int j)
{
    return (t->p2p[i] >> j & 1) != 0;
}

static inline bool topology_nvlink(const struct topology *t, int i, int j)
{
    return (t->nvlink[i] >> j & 1) != 0;
}

/* The smallest of the GPUs' memories in bytes; -1 when any is unknown. */
int64_t topology_min_memory(const struct topology *t);

/* G "GPUs" of the CPU backend, every pair with P2P. */
void topology_cpu(int gpus, struct topology *t);
/* G GPUs of which nothing is known, no pair with P2P (slidedp-plan where nothing can be probed). */
void topology_assumed(int gpus, struct topology *t);

/* Parses the description format (README.md, "GPU topology"); errors name `where`, the line and the key. */
int topology_parse(FILE *f, const char *where, enum topology_source source, struct topology *t);
int topology_load(const char *path, struct topology *t);
/* Writes t in the description format (what --probe-topology prints). */
void topology_write(FILE *f, const struct topology *t);

/* The topology of `ranks` ranks on the host's GPUs: rank r runs on GPU r % host->gpus (as
 * slidedp-launch assigns devices); ranks sharing a GPU have P2P and share its memory. */
void topology_for_ranks(const struct topology *host, int ranks, struct topology *out);

/* Fills numa and pcie_switch from the bus ids under sysfs_devices (normally /sys/bus/pci/devices):
 * the device's numa_node, and the PCIe switch from the device's path: its upstream port (two levels
 * up), or its root port when it hangs off the root complex. */
void topology_read_sysfs(struct topology *t, const char *sysfs_devices);

/* false with the first pair (a < b) lacking P2P. */
bool topology_all_p2p(const struct topology *t, int *a, int *b);

/* "GPU 0 bus 0000:19:00.0 NUMA 0 switch 1 P2P with 1,2,3" (and "NVLink with ..." when any). */
void topology_describe_gpu(const struct topology *t, int gpu, char *out, size_t len);
const char *topology_source_name(int source);

/* The topology a job runs on: the job's [runtime] topology file, else the CPU backend's, else probed
 * by running bin_dir/slidedp-worker --probe-topology; for job->gpus ranks. */
int topology_for_job(const struct job_config *job, const char *bin_dir, struct topology *t);

#endif
