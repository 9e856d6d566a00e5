/* store.c: the flat parameter buffers of a run (store.h). */
#include "core/params/store.h"

#include <stdlib.h>

static size_t fp32_bytes(int64_t n) { return (size_t)(n > 0 ? n : 1) * sizeof(float); }

/* A compute copy of its own: 16-bit, or the whole space while the master holds a part. */
static bool copy_needed(const ct_param_layout *L, ct_dtype compute, int64_t lo, int64_t hi, unsigned parts) {
    return compute != CT_F32 || (!(parts & CT_STORE_PART_PARAMS) && (lo != 0 || hi != L->n_params));
}

void ct_param_store_plan(const ct_param_layout *L, ct_dtype compute, int64_t lo, int64_t hi, unsigned parts,
                         size_t bytes[CT_MEM_CAT_COUNT]) {
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) bytes[c] = 0;
    int64_t grads = parts & CT_STORE_PART_GRADS ? hi - lo : L->n_params;
    int64_t params = parts & CT_STORE_PART_PARAMS ? hi - lo : L->n_params;
    bytes[CT_MEM_MASTER] = fp32_bytes(hi - lo) + fp32_bytes(L->n_buffers);
    bytes[CT_MEM_GRADS] = parts & CT_STORE_NO_GRADS ? 0 : fp32_bytes(grads);
    if (copy_needed(L, compute, lo, hi, parts)) bytes[CT_MEM_PARAMS] = ct_nbytes(params > 0 ? params : 1, compute);
}

int ct_param_store_create(const ct_param_layout *L, ct_backend *be, ct_dtype compute, int64_t lo,
                          int64_t hi, unsigned parts, ct_param_store **out, ct_err *err) {
    ct_param_store *s = ct_xcalloc(1, sizeof *s);
    *s = (ct_param_store){.layout = L, .be = be, .compute = compute, .lo = lo, .hi = hi,
                          .part_grads = parts & CT_STORE_PART_GRADS, .part_params = parts & CT_STORE_PART_PARAMS};
    size_t b[CT_MEM_CAT_COUNT];
    ct_param_store_plan(L, compute, lo, hi, parts, b);
    size_t master = fp32_bytes(hi - lo), buffers = fp32_bytes(L->n_buffers);
    s->master = be->mem.alloc(be, master, CT_MEM_MASTER);
    s->buffers = be->mem.alloc(be, buffers, CT_MEM_MASTER);
    s->grads = b[CT_MEM_GRADS] ? be->mem.alloc(be, b[CT_MEM_GRADS], CT_MEM_GRADS) : NULL;
    s->params = b[CT_MEM_PARAMS] ? be->mem.alloc(be, b[CT_MEM_PARAMS], CT_MEM_PARAMS) : s->master;
    if (!s->master || !s->buffers || (!s->grads && b[CT_MEM_GRADS]) || !s->params) {
        size_t total = 0;
        for (int c = 0; c < CT_MEM_CAT_COUNT; c++) total += b[c];
        ct_param_store_free(s);
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating %.1f MiB of parameters and "
                       "gradients on %s", (double)total / 1048576.0, be->name);
    }
    be->mem.memset0(be, s->master, master);
    be->mem.memset0(be, s->buffers, buffers);
    if (s->grads) be->mem.memset0(be, s->grads, b[CT_MEM_GRADS]);
    if (b[CT_MEM_PARAMS]) be->mem.memset0(be, s->params, b[CT_MEM_PARAMS]);
    *out = s;
    return CT_OK;
}

void ct_param_store_free(ct_param_store *s) {
    if (!s) return;
    ct_backend *be = s->be;
    if (s->params && s->params != s->master) be->mem.free(be, s->params);
    if (s->master) be->mem.free(be, s->master);
    if (s->buffers) be->mem.free(be, s->buffers);
    if (s->grads) be->mem.free(be, s->grads);
    free(s);
}

bool ct_param_store_has_copy(const ct_param_store *s) { return s->params != (void *)s->master; }

void *ct_param_store_part_params(const ct_param_store *s) {
    return ct_elem(s->params, s->part_params ? 0 : s->lo, s->compute);
}

float *ct_param_store_part_grads(const ct_param_store *s) {
    return s->grads ? s->grads + (s->part_grads ? 0 : s->lo) : NULL;
}

void ct_param_store_refresh(ct_param_store *s) {
    if (!ct_param_store_has_copy(s)) return;
    s->be->elt.cast(s->be, ct_param_store_part_params(s), s->compute, s->master, CT_F32, s->hi - s->lo);
}

void ct_param_store_zero_grads(ct_param_store *s) {
    if (!s->grads) return; /* an evaluating store has none */
    s->be->mem.memset0(s->be, s->grads, fp32_bytes(s->part_grads ? s->hi - s->lo : s->layout->n_params));
}
