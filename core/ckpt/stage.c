/* stage.c: values between checkpoint files and the tensors' memory (stage.h). */
#include "core/ckpt/stage.h"

#include <stdlib.h>

ct_ckpt_loc ct_ckpt_view_loc(const ct_ckpt_tensors *t, const ct_param_view *v, int64_t first) {
    if (v->trainable) return (ct_ckpt_loc){t->params_mem, t->params, v->offset + first - t->lo};
    return (ct_ckpt_loc){t->buffers_mem, t->buffers, v->offset + first};
}

ct_ckpt_loc ct_ckpt_slot_loc(const ct_ckpt_tensors *t, int s, const ct_param_view *v, int64_t first) {
    return (ct_ckpt_loc){t->slot_mem[s], t->slot[s], v->offset + first - t->lo};
}

static int span_fill(void *ctx, int64_t first, int64_t n, float *dst, ct_err *err) {
    const ct_ckpt_loc *s = ctx;
    return s->mem->to_host(s->mem->ctx, s->base, s->at + first, n, dst, err);
}

void ct_ckpt_entry(ct_st_entry *e, const char *name, ct_shape shape, ct_ckpt_loc src, ct_ckpt_loc *span) {
    *e = (ct_st_entry){.name = name, .dtype = CT_F32, .shape = shape};
    if (!src.mem) {
        e->data = src.base + src.at;
        return;
    }
    *span = src;
    e->fill = span_fill;
    e->fill_ctx = span;
}

int ct_ckpt_load_into(ct_ckpt_loc dst, int64_t n, ct_ckpt_read_fn read, const void *ctx, ct_err *err) {
    if (!dst.mem) return read(ctx, 0, n, dst.base + dst.at, err);
    int64_t chunk = n < CT_CKPT_STAGE_FLOATS ? n : CT_CKPT_STAGE_FLOATS;
    float *stage = ct_xmalloc((size_t)(chunk > 0 ? chunk : 1) * sizeof *stage);
    int rc = CT_OK;
    for (int64_t at = 0; at < n && !rc; at += chunk) {
        int64_t k = n - at < chunk ? n - at : chunk;
        rc = read(ctx, at, k, stage, err);
        if (!rc) rc = dst.mem->from_host(dst.mem->ctx, dst.base, dst.at + at, k, stage, err);
    }
    free(stage);
    return rc;
}
