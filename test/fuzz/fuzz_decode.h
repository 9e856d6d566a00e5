/* fuzz_decode.h: what the data-format fuzz targets do with a data set that opened. */
#ifndef CT_FUZZ_DECODE_H
#define CT_FUZZ_DECODE_H

#include <stdint.h>
#include <stdlib.h>

#include "core/data/dataset.h"

/* Decode the first max_samples samples of ds as the loader does (floats, and the raw bytes of
 * data.transform.on_device where the format has them) into buffers sized by its shapes; a sample
 * or target of more than max_numel values is left alone (an allocation, not a finding). Any code
 * but CT_OK and CT_ERR_DATA (a corrupt record, said) is a bug: abort. The target buffer holds
 * 8 bytes a value, enough for every target type (int32 class indices, float targets). */
static inline void fuzz_decode_samples(ct_dataset *ds, int64_t max_numel, int64_t max_samples) {
    int64_t numel = ct_shape_numel(&ds->sample_shape), tn = ct_shape_numel(&ds->target_shape);
    if (tn < 1) tn = 1;
    if (numel > max_numel || tn > max_numel) return;
    float *x = malloc((size_t)numel * sizeof *x);
    uint8_t *px = malloc((size_t)numel);
    void *t = malloc((size_t)tn * 8);
    ct_err err = {0};
    for (int64_t i = 0; i < ds->count && i < max_samples; i++) {
        int rc = ds->decode(ds, i, x, t, &err);
        if (rc != CT_OK && rc != CT_ERR_DATA) abort();
        if (!ds->decode_u8) continue;
        rc = ds->decode_u8(ds, i, px, t, &err);
        if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    }
    free(x);
    free(px);
    free(t);
}

#endif
