/* A model whose weights all stay on the device and whose gradients add up in a host array: the
 * model_io for tests and tools (sd-logits, parity checks) that run the model without a job. */
#ifndef SD_RESIDENT_H
#define SD_RESIDENT_H

#include "common/layout.h"
#include "common/model_config.h"
#include "worker/backend.h"
#include "worker/model.h"

struct resident_model {
    struct backend *be;
    struct model_config cfg;
    struct layout lay;
    struct model model;
    struct model_io io;
    float *params;   /* host fp32 parameter space (the layout's offsets) */
    float *grads;    /* host fp32 gradient space, summed over train steps until cleared */
    void **chunk_dev;
};

/* Weights from params (fp32, copied; the device gets their bf16 rounding, as params16 would). */
int resident_model_init(struct resident_model *rm, struct backend *be, const struct model_config *cfg,
                        const float *params, int B, int T);
/* Weights from an HF directory. */
int resident_model_load(struct resident_model *rm, struct backend *be, const struct model_config *cfg,
                        const char *model_dir, int B, int T);
void resident_model_clear_grads(struct resident_model *rm);
void resident_model_free(struct resident_model *rm);

#endif
