/* grad_buckets.h: ZeRO stages 0 and 1's gradient all-reduce, in buckets of reduce_bucket_size
 * elements of the flat gradient space.
 *
 * A bucket is the range [at, at + k) of the flat space; its last writer is the lowest-numbered
 * layer with a trainable view in it (backward runs the layers from the last to the first). With
 * overlap_comm, the backward of the step's last micro-batch (the one this rank is "armed" for)
 * starts a bucket's all-reduce in the after hook of its last writer, while backward goes on with
 * the layers below; without it, every bucket starts after the backward pass. Either way the
 * buckets go in one fixed order (by last writer, from the top layer down; then by offset), so every
 * rank starts the same collectives in the same order whichever micro-batches it ran, and each one
 * is the same non-blocking all-reduce of the same elements: the sums are the same bits with and
 * without overlap. ct_grad_buckets_finish starts what is left and waits for all: after it, every
 * rank holds the summed gradients (before the norm, the overflow check and the update). With
 * gradient accumulation only the last micro-batch's backward reduces: the earlier ones only add
 * into the gradients. */
#ifndef CT_ZERO_GRAD_BUCKETS_H
#define CT_ZERO_GRAD_BUCKETS_H

#include "core/dist/comm.h"
#include "core/graph/graph.h"
#include "core/params/layout.h"

typedef struct ct_grad_buckets ct_grad_buckets;

/* Buckets of bucket_elems (0, or more than the space: one) over the n_params fp32 gradients
 * `grads` of layout L, in the memory of the backend c was made for (host memory for MPI, device
 * memory for NCCL). overlap: start them during backward. */
ct_grad_buckets *ct_grad_buckets_create(const ct_param_layout *L, float *grads, int64_t bucket_elems, ct_comm *c,
                                        bool overlap);
void ct_grad_buckets_free(ct_grad_buckets *b);

/* The hooks that start buckets during backward and move those in flight on (after every layer);
 * only worth installing with overlap and several ranks. */
ct_exec_hooks ct_grad_buckets_hooks(ct_grad_buckets *b);

/* Whether the next backward is the step's last on this rank: the one whose layers start buckets. */
void ct_grad_buckets_arm(ct_grad_buckets *b, bool last_micro_batch);

/* Every bucket summed over ranks: those not started yet are started, in the same order, then all
 * are waited for. Collective. */
int ct_grad_buckets_finish(ct_grad_buckets *b, ct_err *err);

/* How many buckets; bucket `order` of the fixed order, as its first element and length (tests). */
int ct_grad_buckets_count(const ct_grad_buckets *b);
void ct_grad_buckets_at(const ct_grad_buckets *b, int order, int64_t *at, int64_t *len, int *last_writer);

#endif
