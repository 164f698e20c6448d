/* The CUDA half of `slidedp-worker --probe-topology` (worker/cuda/topology.cu): what the CUDA
 * runtime knows about the visible GPUs. worker/main.c adds sysfs and prints the result. */
#ifndef SD_WORKER_PROBE_H
#define SD_WORKER_PROBE_H

#include "common/topology.h"

#ifdef SD_HAVE_CUDA
/* The visible GPUs (CUDA_VISIBLE_DEVICES applies): count, PCI bus ids, the pairs with peer access
 * both ways, and NVLink; NUMA nodes and switches unknown (-1). */
int cuda_probe_topology(struct topology *t);
#endif

#endif
