/* batch.h: assemble a batch of samples from a dataset into backend memory.
 *
 * Single-threaded and synchronous: decode each sample into a host staging buffer, then one copy
 * to the device (on the CPU backend the staging buffer is the batch itself, so there is no copy).
 * The data-pipeline issue replaces this with the threaded, prefetching loader behind the same
 * three calls. */
#ifndef CT_DATA_BATCH_H
#define CT_DATA_BATCH_H

#include "core/backend.h"
#include "core/data/dataset.h"

typedef struct ct_batch {
    ct_backend *be;
    const ct_dataset *ds;
    int64_t cap;                 /* samples per batch at most */
    size_t in_bytes, tgt_bytes;  /* per sample */
    int64_t classes;             /* class-index targets must be < classes (0: not checked) */
    void *host_in, *host_tgt;    /* staging: [cap, sample] and [cap, target] */
    void *input, *target;        /* backend memory read by the graph */
    bool staged;                 /* host_* differ from input/target (a device backend) */
} ct_batch;

/* Allocate for `cap` samples. Returns CT_OK or CT_ERR_RUNTIME (out of memory). */
int ct_batch_init(ct_batch *b, ct_backend *be, const ct_dataset *ds, int64_t cap, int64_t classes,
                  ct_err *err);
/* Decode samples idx[0..n) (n <= cap) and make them visible to the backend. */
int ct_batch_load(ct_batch *b, const uint32_t *idx, int64_t n, ct_err *err);
void ct_batch_free(ct_batch *b);

#endif
