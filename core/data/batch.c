/* batch.c: synchronous batch assembly (see batch.h). */
#include "core/data/batch.h"

#include <string.h>

int ct_batch_init(ct_batch *b, ct_backend *be, const ct_dataset *ds, int64_t cap, int64_t classes,
                  ct_err *err) {
    memset(b, 0, sizeof *b);
    b->be = be;
    b->ds = ds;
    b->cap = cap;
    b->classes = classes;
    b->in_bytes = (size_t)ct_shape_numel(&ds->sample_shape) * ct_dtype_size(ds->sample_dtype);
    b->tgt_bytes = (size_t)ct_shape_numel(&ds->target_shape) * ct_dtype_size(ds->target_dtype);
    b->input = be->alloc(be, (size_t)cap * b->in_bytes);
    b->target = be->alloc(be, (size_t)cap * b->tgt_bytes);
    /* The CPU backend's memory is host memory: decode straight into it. */
    b->staged = strcmp(be->name, "cpu") != 0;
    if (b->staged) {
        b->host_in = be->alloc_host_pinned(be, (size_t)cap * b->in_bytes);
        b->host_tgt = be->alloc_host_pinned(be, (size_t)cap * b->tgt_bytes);
    } else {
        b->host_in = b->input;
        b->host_tgt = b->target;
    }
    if (!b->input || !b->target || !b->host_in || !b->host_tgt) {
        ct_batch_free(b);
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory allocating batches of %lld samples",
                       (long long)cap);
    }
    return CT_OK;
}

int ct_batch_load(ct_batch *b, const uint32_t *idx, int64_t n, ct_err *err) {
    const ct_dataset *ds = b->ds;
    bool class_targets = ds->target_dtype == CT_I32 && ds->target_shape.ndim == 0 && b->classes > 0;
    for (int64_t i = 0; i < n; i++) {
        uint8_t *in = (uint8_t *)b->host_in + (size_t)i * b->in_bytes;
        uint8_t *tgt = (uint8_t *)b->host_tgt + (size_t)i * b->tgt_bytes;
        int rc = ds->decode(ds, idx[i], in, tgt, err);
        if (rc) return rc;
        if (class_targets) {
            int32_t label;
            memcpy(&label, tgt, sizeof label);
            if (label < 0 || label >= b->classes)
                return ct_errf(err, CT_ERR_DATA, "%s: record %u: label %d is outside the model's %lld "
                               "classes (0..%lld)", ds->source, idx[i], label, (long long)b->classes,
                               (long long)b->classes - 1);
        }
    }
    if (b->staged) {
        b->be->copy_h2d(b->be, b->input, b->host_in, (size_t)n * b->in_bytes);
        b->be->copy_h2d(b->be, b->target, b->host_tgt, (size_t)n * b->tgt_bytes);
    }
    return CT_OK;
}

void ct_batch_free(ct_batch *b) {
    if (!b->be) return;
    if (b->staged) {
        if (b->host_in) b->be->free_host_pinned(b->be, b->host_in);
        if (b->host_tgt) b->be->free_host_pinned(b->be, b->host_tgt);
    }
    if (b->input) b->be->free(b->be, b->input);
    if (b->target) b->be->free(b->be, b->target);
    memset(b, 0, sizeof *b);
}
