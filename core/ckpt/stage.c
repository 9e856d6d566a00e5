/* stage.c: values between checkpoint files and the tensors' memory (stage.h). */
#include "core/ckpt/stage.h"

#include <stdlib.h>

static int span_fill(void *ctx, int64_t first, int64_t n, float *dst, ct_err *err) {
    const ct_ckpt_span *s = ctx;
    s->mem->to_host(s->mem->ctx, dst, s->src + first, n);
    return CT_OK;
}

void ct_ckpt_entry(ct_st_entry *e, const char *name, ct_shape shape, const ct_ckpt_mem *mem,
                   const float *src, ct_ckpt_span *span) {
    *e = (ct_st_entry){.name = name, .dtype = CT_F32, .shape = shape};
    if (!mem) {
        e->data = src;
        return;
    }
    *span = (ct_ckpt_span){.mem = mem, .src = src};
    e->fill = span_fill;
    e->fill_ctx = span;
}

bool ct_ckpt_load_into(const ct_ckpt_mem *mem, float *dst, int64_t n, ct_ckpt_read_fn read, const void *ctx) {
    if (!mem) return read(ctx, 0, n, dst);
    int64_t chunk = n < CT_CKPT_STAGE_FLOATS ? n : CT_CKPT_STAGE_FLOATS;
    float *stage = ct_xmalloc((size_t)(chunk > 0 ? chunk : 1) * sizeof *stage);
    bool ok = true;
    for (int64_t at = 0; at < n && ok; at += chunk) {
        int64_t k = n - at < chunk ? n - at : chunk;
        ok = read(ctx, at, k, stage);
        if (ok) mem->from_host(mem->ctx, dst + at, stage, k);
    }
    free(stage);
    return ok;
}
