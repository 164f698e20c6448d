/* Fuzz target: job.ini (through inih and our validation), config.json and GPU topology file
 * parsing must refuse any malformed input with an error, never crash. The first byte picks the
 * parser. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/job.h"
#include "common/model_config.h"
#include "common/topology.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if ((data[0] & 3) == 2) {
        FILE *f = fmemopen((void *)(data + 1), size - 1 ? size - 1 : 1, "r");
        if (!f)
            return 0;
        struct topology t;
        topology_parse(f, "fuzz", TOPO_FILE, &t);
        fclose(f);
        return 0;
    }
    if (data[0] & 1) {
        char *text = malloc(size);
        memcpy(text, data + 1, size - 1);
        text[size - 1] = 0;
        struct model_config cfg;
        model_config_parse(text, "fuzz", &cfg);
        free(text);
        return 0;
    }
    static char path[64];
    if (!path[0])
        snprintf(path, sizeof path, "/dev/shm/sd-fuzz-ini-%d.ini", (int)getpid());
    FILE *f = fopen(path, "wb");
    if (!f)
        return 0;
    fwrite(data + 1, 1, size - 1, f);
    fclose(f);
    struct job_config job;
    job_config_load(path, 0, NULL, &job);
    unlink(path); /* nothing left in /dev/shm after a run */
    return 0;
}
