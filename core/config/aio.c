/* aio.c: the top-level "aio" section, the NVMe swap engine's settings (DeepSpeed's
 * deepspeed/runtime/swap_tensor/aio_config.py; ctrain's engine: core/zero/aio.h).
 *
 * DeepSpeed reads it as a plain dict (unknown keys ignored, no type checks); ctrain checks types
 * and ranges and warns on unknown keys, as for its other plain sections. The section is only used
 * by NVMe offload of the optimizer (offload_optimizer.device "nvme"); without it a present section
 * is listed among the keys read but not used. */
#include <string.h>

#include "core/config/internal.h"

static const ct_field aio_fields[] = {
    CT_F_LONG(ct_aio_cfg, block_size, 1048576, CT_AIO_BLOCK_ALIGN, 1 << 30),
    CT_F_INT(ct_aio_cfg, queue_depth, 8, 1, 1024),
    CT_ROW("intra_op_parallelism", "thread_count", CT_K_INT, CT_S_INT, offsetof(ct_aio_cfg, intra_op_parallelism), 0, 1,
           1, 256, NULL),
    CT_F_BOOL(ct_aio_cfg, single_submit, false),
    CT_F_BOOL(ct_aio_cfg, overlap_events, true),
    CT_F_BOOL(ct_aio_cfg, use_gds, false),
};
static const ct_section aio_sec = {"aio", aio_fields, CT_ARRAY_LEN(aio_fields), NULL, 0, false, false, false, true};

int ct_rd_aio(ct_rd *r, const cJSON *root) {
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(root, "aio");
    ct_aio_cfg *a = &r->cfg->aio;
    int rc = ct_rd_section(r, sec, "aio", &aio_sec, a);
    if (rc || !ct_rd_given(sec)) return rc;
    if (a->block_size % CT_AIO_BLOCK_ALIGN)
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(sec, "block_size"), "aio.block_size",
                          "expected a multiple of %d bytes (direct I/O moves whole blocks), got %ld; e.g. %ld",
                          CT_AIO_BLOCK_ALIGN, a->block_size,
                          (a->block_size + CT_AIO_BLOCK_ALIGN / 2) / CT_AIO_BLOCK_ALIGN * CT_AIO_BLOCK_ALIGN);
    if (a->use_gds)
        return ct_rd_fail(r, cJSON_GetObjectItemCaseSensitive(sec, "use_gds"), "aio.use_gds",
                          "GPUDirect Storage is not supported by ctrain: swap files are read into host memory; "
                          "set it to false");
    /* only NVMe offload of the optimizer (core/train/nvme.h) swaps; zero_optimization was read first */
    if (r->cfg->zero.offload_optimizer.device != CT_OFFLOAD_NVME) ct_rd_add_unused(r, "aio");
    return CT_OK;
}

cJSON *ct_rd_emit_aio(const ct_aio_cfg *a, const cJSON *in) {
    return ct_rd_emit(&aio_sec, a, cJSON_IsObject(in) ? in : NULL);
}
