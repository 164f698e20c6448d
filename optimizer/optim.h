/* The optimizer process: owns a disjoint set of chunks; for each step it sums their gradients
 * over all micro-batches in a fixed order (micro-batch a*G + r), contributes their squared norms
 * to the global grad norm, and applies AdamW (clipped when asked) to master, m and v, writing the
 * new bf16 copy to params16 and publishing each chunk's new version. */
#ifndef SD_OPTIM_H
#define SD_OPTIM_H

struct optim_args {
    const char *job_name;
    int index;
};

/* Returns 0 after the last step or a clean stop; on an error sets sd_err and returns 2 when the
 * process could not start (never worth restarting) or 1. */
int optim_run(const struct optim_args *args);

#endif
