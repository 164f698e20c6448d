/* Resident model_io for tests and tools (see resident.h). */
#include "resident.h"

#include <stdlib.h>
#include <string.h>

#include "common/bf16.h"
#include "common/err.h"
#include "common/hf.h"

static const void *res_weights(void *ctx, int chunk, int next_chunk)
{
    struct resident_model *rm = ctx;
    return rm->chunk_dev[chunk];
}

static void res_release(void *ctx, int chunk)
{
}

static void res_grads_done(void *ctx, int chunk, float *grad)
{
    struct resident_model *rm = ctx;
    const struct chunk_desc *c = &rm->lay.chunks[chunk];
    float *tmp = malloc(sizeof(float) * (size_t)c->numel);
    SD_ASSERT(tmp);
    rm->be->ops->download(rm->be, tmp, grad, sizeof(float) * (size_t)c->numel);
    float *dst = rm->grads + c->offset;
    for (int64_t i = 0; i < c->numel; i++)
        dst[i] += tmp[i];
    free(tmp);
}

static int upload_all(struct resident_model *rm)
{
    struct backend *be = rm->be;
    size_t wsize = be_dtype_size(be->weight_dtype);
    uint16_t *tmp = malloc(sizeof(uint16_t) * (size_t)rm->lay.max_chunk_numel);
    if (!tmp)
        return sd_err("out of memory");
    rm->chunk_dev = calloc((size_t)rm->lay.num_chunks, sizeof *rm->chunk_dev);
    for (int c = 0; c < rm->lay.num_chunks; c++) {
        const struct chunk_desc *ch = &rm->lay.chunks[c];
        rm->chunk_dev[c] = be->ops->alloc(be, (size_t)ch->numel * wsize);
        if (!rm->chunk_dev[c]) {
            free(tmp);
            return -1;
        }
        f32_to_bf16_n(tmp, rm->params + ch->offset, (size_t)ch->numel);
        be->ops->fetch_weights_async(be, 0, rm->chunk_dev[c], tmp, (size_t)ch->numel);
        be->ops->wait_weights(be, 0);
        be->ops->synchronize(be);
    }
    free(tmp);
    return 0;
}

static int finish_init(struct resident_model *rm, int B, int T)
{
    rm->grads = calloc((size_t)rm->lay.total_numel, sizeof(float));
    if (!rm->grads)
        return sd_err("out of memory");
    if (upload_all(rm) != 0)
        return -1;
    rm->io = (struct model_io){.ctx = rm, .weights = res_weights, .release = res_release, .grads_done = res_grads_done};
    return model_init(&rm->model, rm->be, &rm->cfg, rm->lay.tensors, rm->lay.num_tensors, rm->lay.chunks,
                      rm->lay.num_chunks, B, T, NULL, 0, false);
}

static int begin(struct resident_model *rm, struct backend *be, const struct model_config *cfg)
{
    memset(rm, 0, sizeof *rm);
    rm->be = be;
    rm->cfg = *cfg;
    if (layout_build(cfg, 1, &rm->lay) != 0)
        return -1;
    rm->params = calloc((size_t)rm->lay.total_numel, sizeof(float));
    return rm->params ? 0 : sd_err("out of memory");
}

int resident_model_init(struct resident_model *rm, struct backend *be, const struct model_config *cfg,
                        const float *params, int B, int T)
{
    if (begin(rm, be, cfg) != 0)
        return -1;
    memcpy(rm->params, params, sizeof(float) * (size_t)rm->lay.total_numel);
    return finish_init(rm, B, T);
}

int resident_model_load(struct resident_model *rm, struct backend *be, const struct model_config *cfg,
                        const char *model_dir, int B, int T)
{
    if (begin(rm, be, cfg) != 0)
        return -1;
    struct hf_weights w;
    if (hf_weights_open(model_dir, &w) != 0)
        return -1;
    int rc = hf_weights_load(&w, &rm->lay, rm->params);
    hf_weights_close(&w);
    return rc != 0 ? -1 : finish_init(rm, B, T);
}

void resident_model_clear_grads(struct resident_model *rm)
{
    memset(rm->grads, 0, sizeof(float) * (size_t)rm->lay.total_numel);
}

void resident_model_free(struct resident_model *rm)
{
    if (rm->model.be)
        model_free(&rm->model);
    if (rm->chunk_dev)
        for (int c = 0; c < rm->lay.num_chunks; c++)
            if (rm->chunk_dev[c])
                rm->be->ops->free(rm->be, rm->chunk_dev[c]);
    free(rm->chunk_dev);
    free(rm->params);
    free(rm->grads);
    layout_free(&rm->lay);
    memset(rm, 0, sizeof *rm);
}
